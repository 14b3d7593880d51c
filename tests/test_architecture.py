"""The package's layering, read from the source (every import statement, at module level or inside a
function, as the AST has it): no import cycle anywhere; typer only in ``attnviz.cli``; TensorFlow and
Keras only in ``attnviz.variants``, ``attnviz.device``, Keras capture (``attnviz.capturing.keras``) and the
training monitor's callback and TensorBoard writer (``attnviz.monitoring``); no
library module imports the command line; compute never imports ``attnviz.render``; no module takes another
module's private names (a name another module needs is public where it lives). See ARCHITECTURE.md."""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "attnviz"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


@cache
def parsed(path: Path) -> ast.Module:
    """The syntax tree of a source file, parsed once per session."""
    return ast.parse(path.read_text(), str(path))


def imports_of(name: str, path: Path) -> list[tuple[str, int]]:
    """Every module ``name`` imports (absolute names, relative imports resolved), with the line. ``from
    pkg import sub`` imports the submodule ``pkg.sub``; the package itself only for a name it defines."""
    tree = parsed(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    typing_only = {id(n) for block in ast.walk(tree) if isinstance(block, ast.If) and _type_checking(block.test)
                   for stmt in block.body for n in ast.walk(stmt)}
    found = []
    for node in ast.walk(tree):
        if id(node) in typing_only:  # ``if TYPE_CHECKING:`` imports for annotations never run
            continue
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([node.module] if node.module else []))
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                found.append((sub if sub in MODULES else base, node.lineno))
    return found


@cache
def imports() -> dict[str, list[tuple[str, int]]]:
    """Every module's imports (each module parsed once, when a test first asks: not while every worker collects)."""
    return {name: imports_of(name, path) for name, path in MODULES.items()}


@cache
def graph() -> dict[str, set[str]]:
    return {name: {m for m, _ in found if m in MODULES and m != name} for name, found in imports().items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_the_graph_sees_function_level_and_relative_imports(tmp_path):
    assert "attnviz.cli.app" in graph()["attnviz.cli.console"]  # imported inside click_command
    assert "attnviz.errors" in graph()["attnviz.masks"]
    source = tmp_path / "probe.py"
    source.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import attnviz.pipeline\n"
                      "def f():\n    from . import errors\n    from .render import table\n")
    found = {m for m, _ in imports_of("attnviz.probe", source)}
    assert found == {"typing", "attnviz.errors", "attnviz.render.table"}


def test_no_import_cycles():
    assert cycles(graph()) == []


ARCHITECTURE = PACKAGE.parent / "ARCHITECTURE.md"


def unit_of(module: str) -> str:
    """The unit of the layers a module belongs to: its package under ``attnviz/``, or the top-level module itself
    (``attnviz`` for the package's ``__init__.py``)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def allowed_imports(text: str) -> list[tuple[str, set[str]]]:
    """ARCHITECTURE.md's "Allowed imports" block: ``UNIT: UNIT UNIT ...`` a line, lowest first; ``#`` comments."""
    section = text.split("### Allowed imports", 1)[1]
    block = section.split("```text\n", 1)[1].split("```", 1)[0]
    rows = []
    for line in block.splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            unit, _, allowed = line.partition(":")
            rows.append((unit.strip(), set(allowed.split())))
    return rows


def layer_violations(rows: list[tuple[str, set[str]]], edges: dict[str, dict[str, str]], units: set[str]) -> list[str]:
    """What breaks the block: a unit named twice or missing, an arrow to a unit not listed above its own line, an
    import no arrow allows (``edges``: unit -> {imported unit: where}), an arrow no import uses."""
    listed = [unit for unit, _ in rows]
    found = [f"{unit}: listed {listed.count(unit)} times" for unit in sorted(set(listed)) if listed.count(unit) > 1]
    above: set[str] = set()
    for unit, allowed in rows:
        for target in sorted(allowed - above):
            found.append(f"{unit}: allows {target}, which is not on a line above it" if target in listed else
                         f"{unit}: allows {target}, which is not a unit")
        for target, where in sorted(edges.get(unit, {}).items()):
            if target not in allowed:
                found.append(f"{where}: {unit} -> {target} is not an allowed import (ARCHITECTURE.md)")
        for target in sorted(allowed - set(edges.get(unit, {}))):
            found.append(f"{unit}: allows {target}, and no module of {unit} imports it (take it off its line)")
        above.add(unit)
    found += [f"{unit}: a unit missing from ARCHITECTURE.md's allowed imports" for unit in sorted(units - set(listed))]
    found += [f"{unit}: listed in ARCHITECTURE.md's allowed imports, not a unit"
              for unit in sorted(set(listed) - units)]
    return found


def unit_edges() -> dict[str, dict[str, str]]:
    """Every import between two units, each with the first place it is made."""
    edges: dict[str, dict[str, str]] = {}
    for name, found in sorted(imports().items()):
        for module, line in found:
            if module in MODULES and unit_of(module) != unit_of(name):
                edges.setdefault(unit_of(name), {}).setdefault(unit_of(module), f"{name} (line {line})")
    return edges


def test_every_import_is_an_arrow_architecture_allows():
    """The layers are data: ARCHITECTURE.md's allowed imports, enforced."""
    rows = allowed_imports(ARCHITECTURE.read_text())
    assert layer_violations(rows, unit_edges(), {unit_of(name) for name in MODULES}) == []


def test_the_layer_check_finds_each_kind_of_break():
    rows = allowed_imports("### Allowed imports\n\n```text\n# low\nerrors:\nio: errors  # files\n"
                           "pipeline: io errors render\nrender: io\nio: errors\nghost:\n```\n")
    assert rows[1] == ("io", {"errors"})
    edges = {"io": {"errors": "attnviz.io (line 3)"}, "pipeline": {"io": "attnviz.pipeline (line 9)",
                                                                 "stats": "attnviz.pipeline (line 12)"},
             "render": {"io": "attnviz.render.x (line 1)"}}
    assert layer_violations(rows, edges, {"errors", "io", "pipeline", "render", "stats"}) == [
        "io: listed 2 times",
        "pipeline: allows render, which is not on a line above it",
        "attnviz.pipeline (line 12): pipeline -> stats is not an allowed import (ARCHITECTURE.md)",
        "pipeline: allows errors, and no module of pipeline imports it (take it off its line)",
        "pipeline: allows render, and no module of pipeline imports it (take it off its line)",
        "stats: a unit missing from ARCHITECTURE.md's allowed imports",
        "ghost: listed in ARCHITECTURE.md's allowed imports, not a unit"]


def _offenders(rule: str) -> list[str]:
    bad = []
    for name, found in imports().items():
        in_cli = name.startswith("attnviz.cli")
        for module, line in found:
            top = module.split(".")[0]
            where = f"{name} (line {line}) imports {module}"
            if rule == "typer" and top == "typer" and not in_cli:
                bad.append(where)
            if rule == "tensorflow" and top in ("tensorflow", "keras") and not (
                    name.startswith("attnviz.variants") or name in ("attnviz.device", "attnviz.capturing.keras",
                                                             "attnviz.capturing.kerashub", "attnviz.capturing.preset",
                                                             "attnviz.monitoring.callback",
                                                             "attnviz.monitoring.tensorboard")):
                bad.append(where)
            if rule == "cli" and module.startswith("attnviz.cli") and not in_cli and name != "attnviz.__main__":
                bad.append(where)
            if rule == "render" and module.startswith("attnviz.render") and not (
                    in_cli or name.startswith(("attnviz.render", "attnviz.api", "attnviz.viewer",
                                                 "attnviz.monitoring"))):  # the faces draw
                bad.append(where)
    return bad


@pytest.mark.parametrize("rule", ["typer", "tensorflow", "cli", "render"])
def test_layering(rule):
    assert _offenders(rule) == []


def test_every_module_says_what_it_is_for():
    missing = [name for name, path in MODULES.items() if not ast.get_docstring(parsed(path))]
    assert missing == []


def test_architecture_names_every_package():
    text = (PACKAGE.parent / "ARCHITECTURE.md").read_text()
    packages = sorted({name.split(".")[1] for name in MODULES if name.count(".") >= 1
                       and (PACKAGE / name.split(".")[1]).is_dir()})
    assert packages and [p for p in packages if f"`{p}/`" not in text] == []


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def private_uses(name: str, path: Path) -> list[str]:
    """Every private name (``_x``, not a dunder) of another attnviz module that ``name`` takes, as the
    AST has it, at module level or inside a function: ``from attnviz.x import _y`` (relative imports
    resolved), and ``m._y`` or ``attnviz.x._y`` where ``m`` is bound to a module by an import. A
    private module itself (``pkg/_x.py``) is a module, not a name: ``private_modules_used_outside`` counts those."""
    tree = parsed(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    bound: dict[str, str] = {}  # a name an import binds to an attnviz module: the module's name
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "attnviz":
                    bound[alias.asname or "attnviz"] = alias.name if alias.asname else "attnviz"
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([node.module] if node.module else []))
            if base.split(".")[0] != "attnviz":
                continue
            for alias in node.names:
                if f"{base}.{alias.name}" in MODULES:
                    bound[alias.asname or alias.name] = f"{base}.{alias.name}"
                elif _private(alias.name) and base != name:
                    found.append(f"{name} (line {node.lineno}) imports {base}.{alias.name}")

    def module_of(node: ast.expr) -> str | None:
        if isinstance(node, ast.Name):
            return bound.get(node.id)
        if isinstance(node, ast.Attribute):
            outer = module_of(node.value)
            if outer and f"{outer}.{node.attr}" in MODULES:
                return f"{outer}.{node.attr}"
        return None

    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _private(node.attr):
            module = module_of(node.value)
            if module and module != name and f"{module}.{node.attr}" not in MODULES:
                found.append(f"{name} (line {node.lineno}) uses {module}.{node.attr}")
    return found


def test_the_private_name_finder_sees_every_form(tmp_path):
    source = tmp_path / "probe.py"
    source.write_text("import attnviz.render.scale\nimport attnviz.render.heatmap as hm\nfrom attnviz import text\n"
                      "from . import _base_name\nfrom .render.mosaic import grid_getter, _hidden\n"
                      "def f():\n    from attnviz.inspection.heads import _rows\n"
                      "    return attnviz.render.scale._cmap, hm._figure, text._escape, hm.wrap_text\n"
                      "from attnviz.variants import base\nfrom attnviz import __version__\n"
                      "from attnviz.probe import _own\nbase._read\n")
    found = sorted(private_uses("attnviz.probe", source))
    assert found == sorted([
        "attnviz.probe (line 4) imports attnviz._base_name",
        "attnviz.probe (line 5) imports attnviz.render.mosaic._hidden",
        "attnviz.probe (line 7) imports attnviz.inspection.heads._rows",
        "attnviz.probe (line 8) uses attnviz.render.scale._cmap",
        "attnviz.probe (line 8) uses attnviz.render.heatmap._figure",
        "attnviz.probe (line 8) uses attnviz.text._escape",
        "attnviz.probe (line 12) uses attnviz.variants.base._read"])


def test_no_module_takes_another_modules_private_names():
    """A name another module needs is not private: it is public where it lives, or it moves."""
    assert [where for name, path in MODULES.items() for where in private_uses(name, path)] == []


def private_modules_used_outside(graph: dict[str, set[str]]) -> list[str]:
    """Imports of a private module (``pkg._x``) from outside its package ``pkg``: what other packages use is public."""
    return sorted(f"{name} imports {module}" for name, targets in graph.items() for module in targets
                  if _private(module.rpartition(".")[2])
                  and not (name + ".").startswith(module.rpartition(".")[0] + "."))


def test_a_private_module_is_imported_only_inside_its_package():
    assert private_modules_used_outside({"attnviz.a.b": {"attnviz.a._c"}, "attnviz.d": {"attnviz.a._c", "attnviz.a"},
                                         "attnviz.a": {"attnviz.a._c"}}) == ["attnviz.d imports attnviz.a._c"]
    assert private_modules_used_outside(graph()) == []

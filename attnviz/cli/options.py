"""Options, declared once: every option is a field of a typed dataclass (the library's
``RunOptions``, ``ParamOptions``, ``CaptureOptions``, ``FigureOptions``, a variant's ``Params``, the
inspection runs' options; the command line's own output options below), with its help, flag, panel
and bounds in the field's metadata (``attnviz.fields.option``). ``parameters`` turns such a dataclass
into the command's Typer parameters (numbers and choices parsed and checked by ``attnviz.cli.parsers``
as the command line is read), and ``build`` turns the values a command received back into the
dataclass.

Also here: the output options of the compute commands (``OutputOptions``) and of inspect, compare
and rollout (``TableOptions``), and the checks of output file names (exit 2 before anything runs).
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Collection, Mapping, Sequence
from functools import cache
from pathlib import Path
from typing import Any

from attnviz.cli.parsers import COMPLETIONS, PARSERS, OneOf, typed
from attnviz.errors import UsageError
from attnviz.fields import CAPTURED, CHECKS, FIGURE, LABELS, MASKS, OUTPUT, PARAMS, ROLLOUT, RUN, SELECT, build, option
from attnviz.fields import flat_fields as _flat_fields

__all__ = ["CAPTURED", "CHECKS", "FIGURE", "LABELS", "MASKS", "OUTPUT", "PARAMS", "ROLLOUT", "RUN", "SELECT",
           "OutputOptions", "TableOptions", "build", "parameters", "write_through"]

_KW = inspect.Parameter.KEYWORD_ONLY


def parameters(*classes: type, panel: str | None = None, exclude: Collection[str] = (),
               overrides: Mapping[str, Mapping[str, Any]] | None = None,
               order: Sequence[str] | None = None) -> list[inspect.Parameter]:
    """The Typer parameters (keyword-only, Annotated) of the fields of ``classes`` (nested dataclasses
    flattened), in field order or the ``order`` given; ``panel`` for fields that name none;
    ``overrides`` changes a field's metadata for one command (``{"vmax": {"help": ...}}``). Without
    overrides the result is made once per arguments (the 14 compute commands share most options)."""
    if overrides is None:
        return list(_shared_parameters(classes, panel, frozenset(exclude), None if order is None else tuple(order)))
    return _parameters(classes, panel, exclude, overrides, order)


@cache
def _shared_parameters(classes: tuple[type, ...], panel: str | None, exclude: frozenset[str],
                       order: tuple[str, ...] | None) -> tuple[inspect.Parameter, ...]:
    return tuple(_parameters(classes, panel, exclude, None, order))


def _parameters(classes: Sequence[type], panel: str | None, exclude: Collection[str],
                overrides: Mapping[str, Mapping[str, Any]] | None,
                order: Sequence[str] | None) -> list[inspect.Parameter]:
    found: dict[str, inspect.Parameter] = {}
    for cls in classes:
        for f, hint in _flat_fields(cls):
            if f.name in exclude:
                continue
            meta = {**f.metadata, **((overrides or {}).get(f.name, {}))}
            decls = [meta.get("flag", "--" + f.name.replace("_", "-")), *([meta["short"]] if "short" in meta else [])]
            parse = meta.get("parse")
            kwargs = {k: meta[k] for k in ("min", "max", "above", "metavar", "hidden") if k in meta}
            if "choices" in meta:
                kwargs["parser"] = OneOf(tuple(meta["choices"]))
            if parse is not None:
                kwargs["parser"] = PARSERS[parse]
                if parse in COMPLETIONS:
                    kwargs["autocompletion"] = COMPLETIONS[parse]
            default = f.default if f.default is not dataclasses.MISSING else None
            annotation = typed(hint, *decls, help=meta.get("help", ""), rich_help_panel=meta.get("panel", panel),
                               **kwargs)
            found[f.name] = inspect.Parameter(f.name, _KW, default=default, annotation=annotation)
    if order is None:
        return list(found.values())
    missing = set(found) - set(order)
    assert not missing, f"options left out of the order: {sorted(missing)}"
    return [found[name] for name in order]


# ----------------------------------------------------------------------------------------------
# What a command prints and saves


def write_through(name: str, path: str, run: Callable[[Any], Any], protected: Sequence[Path] = ()) -> Any:
    """What ``run(where)`` returns, having written the file ``path`` of option ``name`` (``-o``), which may not
    replace one of ``protected`` (``io.check_outputs``): ``where`` is ``path`` itself when it is local, else (a
    URL) its staged file, uploaded whole once ``run`` is done (its bucket checked before ``run`` starts); the
    result's ``path`` then names the URL."""
    from attnviz.io import check_outputs
    from attnviz.staging import staged_outputs

    targets = check_outputs({name: path}, list(protected))
    if isinstance(targets[name], Path):
        return run(path)
    with staged_outputs(targets) as staged:
        done = run(staged[name])
        staged.commit()
    done.path = targets[name]
    return done


def check_png_path(value: str | None, option: str = "--png") -> None:
    if value is not None and not value.lower().endswith((".png", ".svg", ".pdf")):
        raise UsageError(f"{option} {value}: the file must end in .png, .svg or .pdf.")


def check_html_path(value: str | None, option: str = "--html") -> None:
    if value is not None and not value.lower().endswith((".html", ".htm")):
        raise UsageError(f"{option} {value}: the file must end in .html or .htm.")


def check_array_path(value: str | None, option: str) -> None:
    if value is not None and not value.lower().endswith((".npy", ".npz", ".safetensors")):
        raise UsageError(f"{option} {value}: the file must end in .npy, .npz or .safetensors.")


def check_save_params(value: str | None) -> None:
    if value is not None and not value.lower().endswith(".npz"):
        raise UsageError(f"--save-params {value}: the file must end in .npz.")


@dataclasses.dataclass
class TableOptions:
    """What inspect, compare and rollout print: tables (how many digits, rows and key columns), or the
    JSON document."""

    precision: int = option(3, "digits after the point in tables", panel=OUTPUT, min=0, max=12)
    max_rows: int = option(40, "show at most this many query rows, eliding the middle (0: all)", panel=OUTPUT, min=0)
    max_cols: int | None = option(None, "show at most this many key columns (default: what fits the terminal; "
                                  "0: all)", panel=OUTPUT, min=0)
    json: bool = option(False, "print the JSON document on stdout instead of tables", panel=OUTPUT)
    json_file: str | None = option(None, "write the JSON document to this file", panel=OUTPUT, metavar="FILE.json")
    no_table: bool = option(False, "print no tables", panel=OUTPUT)
    quiet: bool = option(False, "print no tables and no informational lines", panel=OUTPUT, short="-q")

    @property
    def tables(self) -> bool:
        """Whether tables are printed."""
        return not (self.json or self.no_table or self.quiet)

    @property
    def document(self) -> bool:
        """Whether the JSON document is made (on stdout or in a file)."""
        return self.json or self.json_file is not None


@dataclasses.dataclass
class OutputOptions:
    """What a compute command prints and saves."""

    index: str | None = option(None, "which batch/head slice the tables show, e.g. 0,2 (default: the first)",
                               panel=OUTPUT, metavar="I,J", parse="positions")
    precision: int = option(3, "digits after the point in tables", panel=OUTPUT, min=0, max=12)
    max_rows: int = option(40, "show at most this many query rows, eliding the middle (0: all)", panel=OUTPUT, min=0)
    max_cols: int | None = option(None, "show at most this many key columns (default: what fits the terminal; "
                                  "0: all)", panel=OUTPUT, min=0)
    png: str | None = option(None, "save a heatmap (.png, .svg or .pdf); a grid of panels when there are batch/head "
                             "dimensions", panel=OUTPUT, metavar="FILE")
    html: str | None = option(None, "write an interactive report: one offline HTML file (thumbnails, hover, head "
                              "view, statistics)", panel=OUTPUT, metavar="FILE.html")
    json: bool = option(False, "print the JSON document on stdout instead of tables", panel=OUTPUT)
    json_file: str | None = option(None, "write the JSON document to this file", panel=OUTPUT, metavar="FILE.json")
    save_weights: str | None = option(None, "save the weights [..., Lq, Lk]", panel=OUTPUT, metavar="FILE.npy")
    save_output: str | None = option(None, "save the output [..., Lq, d_v]", panel=OUTPUT, metavar="FILE.npy")
    no_table: bool = option(False, "print no tables", panel=OUTPUT)
    quiet: bool = option(False, "print no tables and no progress or device lines; warnings and errors still go to "
                         "stderr", panel=OUTPUT, short="-q")

    def check(self) -> None:
        """Option values that are wrong whatever the data (exit 2)."""
        check_png_path(self.png)
        check_html_path(self.html)
        for option_name, value in (("--save-weights", self.save_weights), ("--save-output", self.save_output)):
            if value is not None and not value.lower().endswith(".npy"):
                raise UsageError(f"{option_name} {value}: the file must end in .npy.")


def parse_index(text: str | None, lead: tuple[int, ...]) -> tuple[int, ...]:
    """``--index 0,2`` as a tuple over the leading dimensions; missing trailing ones are 0."""
    if text is None:
        return (0,) * len(lead)
    try:
        parts = [int(p) for p in text.replace(" ", "").split(",") if p != ""]
    except ValueError:
        raise UsageError(f"--index {text!r}: expected whole numbers separated by commas, e.g. 0,2.") from None
    if not lead:
        raise UsageError(f"--index {text}: these weights have no batch/head dimensions to pick from.")
    if len(parts) > len(lead):
        raise UsageError(f"--index {text}: {len(parts)} numbers for {len(lead)} leading dimension(s) {list(lead)}.")
    index = []
    for n, (i, size) in enumerate(zip(parts, lead)):
        if not -size <= i < size:
            raise UsageError(f"--index {text}: position {n} is {i}, but that dimension has size {size}.")
        index.append(i % size)
    return tuple(index) + (0,) * (len(lead) - len(parts))


def _shared() -> tuple[list[inspect.Parameter], ...]:
    from attnviz.render.options import FigureOptions
    from attnviz.run_options import CaptureOptions, ParamOptions, RunOptions

    return (parameters(RunOptions), parameters(ParamOptions), parameters(CaptureOptions), parameters(OutputOptions),
            parameters(FigureOptions))


def __getattr__(name: str) -> Any:
    """``RUN_OPTIONS``, ``PARAM_OPTIONS``, ``CAPTURE_OPTIONS``, ``OUTPUT_OPTIONS``, ``FIGURE_OPTIONS``: the
    parameters every compute command shares (made on first use: they import the pipeline's module)."""
    names = ("RUN_OPTIONS", "PARAM_OPTIONS", "CAPTURE_OPTIONS", "OUTPUT_OPTIONS", "FIGURE_OPTIONS")
    if name in names:
        return dict(zip(names, _shared()))[name]
    raise AttributeError(name)



"""Shell completion: ``attnviz --install-completion [SHELL]`` and ``--show-completion [SHELL]``.

Completion is Typer's (its scripts for zsh, fish and PowerShell, its completion classes), with four
changes:

* **Files.** Arguments that name files (every ``str`` argument: ``Q``, ``WEIGHTS``, ``JOBS`` ...) and
  options whose metavar names one (``FILE``, ``FILE.npz``, ``TOKENS``, ``MODEL.keras``: ``FILE_METAVAR``)
  complete to the paths that start with what was typed, directories ending in ``/`` (hidden files only
  when a ``.`` was typed). Typer would answer such a parameter with the typed text itself. In zsh
  they answer ``_files`` (zsh's own file completion). Bash gets its own script (``BASH_SCRIPT``): like
  Typer's, plus ``compopt -o filenames`` when the answers are paths, so that bash quotes them and adds
  no space after a directory.
* **Choices** (``--mask-convention keep|block``, ``--device``, ``--rope-style`` ...: ``Literal`` options)
  complete to their values, command names (the variants, ``inspect`` ...) and option names as Typer
  completes them.
* **Both spellings** of the request: Typer's scripts set ``_ATTNVIZ_COMPLETE=complete_bash`` (and
  ``source_bash``), Click's ``bash_complete`` (``bash_source``); both are understood.
* **In this process.** A completion request never goes to a warm worker (``attnviz.worker.client``), and
  imports neither TensorFlow nor matplotlib (the command line builds without them).

``--show-completion`` and ``--install-completion`` take the shell's name, or find it out (shellingham,
then ``$SHELL``) when none is given (``attnviz.cli.app.AttnvizGroup`` lets the value be left out).
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import MutableMapping
from typing import Any

SHELLS = ("bash", "zsh", "fish", "powershell", "pwsh")
SHELL_CHOICES = ("auto", *SHELLS)  # the values of --show-completion and --install-completion
#: an option's metavar that names a file (or a list that may be one, ``TOKENS``)
FILE_METAVAR = re.compile(r"^(FILE|TOKENS|MODEL|WEIGHTS|JOBS)\b|\.[A-Za-z0-9]+$")

BASH_SCRIPT = """
%(complete_func)s() {
    local IFS=$'\\n'
    COMPREPLY=( $( env COMP_WORDS="${COMP_WORDS[*]}" \\
                   COMP_CWORD=$COMP_CWORD \\
                   %(autocomplete_var)s=complete_bash $1 ) )
    if [[ ${#COMPREPLY[@]} -gt 0 && -e "${COMPREPLY[0]%%/}" ]]; then
        compopt -o filenames 2>/dev/null  # paths: quoted, and no space after a directory
    fi
    return 0
}

complete -o default -F %(complete_func)s %(prog_name)s
"""


def complete_var(prog_name: str) -> str:
    return "_{}_COMPLETE".format(re.sub(r"\W", "_", prog_name).upper())


def is_file_param(param: Any) -> bool:
    """Whether completing a value of ``param`` means completing a path."""
    kind = getattr(param, "param_type_name", None)
    if kind == "argument":
        desc = getattr(param, "type_descriptor", None)
        annotation = getattr(desc, "annotation", None)
        return annotation is str or annotation == list[str]
    if kind == "option" and not getattr(param, "is_flag", False):
        return bool(FILE_METAVAR.search(str(param.metavar or "")))
    return False


def paths(incomplete: str) -> list[str]:
    """The paths that start with ``incomplete``, as typed (``~`` kept), directories ending in ``/``;
    hidden entries only when their ``.`` was typed. At most 500, sorted."""
    head, tail = os.path.split(incomplete)
    folder = os.path.expanduser(head) if head else "."
    found: list[str] = []
    try:
        with os.scandir(folder) as entries:
            for entry in entries:
                if not entry.name.startswith(tail) or (entry.name.startswith(".") and not tail.startswith(".")):
                    continue
                try:
                    is_dir = entry.is_dir()
                except OSError:
                    is_dir = False
                found.append(os.path.join(head, entry.name) + ("/" if is_dir else ""))
                if len(found) >= 500:
                    break
    except OSError:
        return []
    return sorted(found)


def _classes() -> dict[str, type]:
    """Typer's completion classes, taught files (see the module)."""
    from typer._click.shell_completion import CompletionItem, _resolve_context, _resolve_incomplete
    from typer._completion_classes import BashComplete, FishComplete, PowerShellComplete, ZshComplete

    class Files:
        def get_completions(self, args: list[str], incomplete: str) -> list[Any]:
            ctx = _resolve_context(self.cli, self.ctx_args, self.prog_name, args)  # type: ignore[attr-defined]
            obj, incomplete = _resolve_incomplete(ctx, args, incomplete)
            if is_file_param(obj):
                return [CompletionItem(p, type="file") for p in paths(incomplete)]
            return list(obj.shell_complete(ctx, incomplete))

    class Bash(Files, BashComplete):
        source_template = BASH_SCRIPT

    class Zsh(Files, ZshComplete):
        def complete(self) -> str:
            args, incomplete = self.get_completion_args()
            items = self.get_completions(args, incomplete)
            if not items or any(item.type == "file" for item in items):
                return "_files"  # zsh's own file completion
            return super().complete()

    class Fish(Files, FishComplete):
        pass

    class PowerShell(Files, PowerShellComplete):
        pass

    return {"bash": Bash, "zsh": Zsh, "fish": Fish, "powershell": PowerShell, "pwsh": PowerShell}


def handle_request(cli: Any, ctx_args: MutableMapping[str, Any], prog_name: str, var: str | None = None) -> None:
    """Answer a completion request (the shell script sets ``_ATTNVIZ_COMPLETE``) and exit; return at once
    when there is none."""
    var = var or complete_var(prog_name)
    instruction = os.environ.get(var)
    if not instruction:
        return
    first, _, second = instruction.partition("_")
    shell, action = (first, second) if first in SHELLS else (second, first)  # bash_complete or complete_bash
    cls = _classes().get(shell)
    if cls is None or action not in ("complete", "source"):
        sys.stderr.write(f"attnviz: error: {var}={instruction[:40]!r}: expected complete_SHELL or source_SHELL, "
                         f"SHELL one of {', '.join(SHELLS)}.\n")
        sys.exit(1)
    comp = cls(cli, ctx_args, prog_name, var)
    out = comp.source() if action == "source" else comp.complete()
    sys.stdout.write(out + ("\n" if out and not out.endswith("\n") else ""))
    sys.stdout.flush()
    sys.exit(0)


def detect_shell() -> str | None:
    """The shell this runs under: shellingham's answer, else ``$SHELL``'s name."""
    try:
        from typer._completion_shared import _get_shell_name

        name = _get_shell_name()
    except Exception:  # shellingham could not tell (no /proc, an unknown parent)
        name = None
    if name not in SHELLS:
        name = os.path.basename(os.environ.get("SHELL", "")) or None
    return name if name in SHELLS else None


def _shell(value: str, option: str) -> str:
    from attnviz.errors import UsageError

    shell = detect_shell() if value == "auto" else value
    if shell is None:
        raise UsageError(f"{option}: cannot tell which shell this is; name it: {option} {'|'.join(SHELLS[:4])}.")
    return shell


def script(shell: str, prog_name: str = "attnviz") -> str:
    """The completion script for ``shell``."""
    from typer._completion_shared import get_completion_script

    var = complete_var(prog_name)
    if shell == "bash":
        func = "_{}_completion".format(re.sub(r"\W", "", prog_name.replace("-", "_")))
        return (BASH_SCRIPT % {"complete_func": func, "prog_name": prog_name, "autocomplete_var": var}).strip()
    return str(get_completion_script(prog_name=prog_name, complete_var=var, shell=shell))


def install(shell: str, prog_name: str = "attnviz") -> str:
    """Install the completion script where ``shell`` reads it; returns where. Bash: the script in
    ``~/.bash_completions/attnviz.sh``, sourced from ``~/.bashrc``; other shells as Typer installs them."""
    from pathlib import Path

    if shell != "bash":
        from typer import _completion_shared as shared

        installers = {"zsh": shared.install_zsh, "fish": shared.install_fish, "powershell": shared.install_powershell,
                      "pwsh": shared.install_powershell}
        return str(installers[shell](prog_name=prog_name, complete_var=complete_var(prog_name), shell=shell))
    path = Path.home() / ".bash_completions" / f"{prog_name}.sh"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(script("bash", prog_name) + "\n")
    rc = Path.home() / ".bashrc"
    line = f"source '{path}'"
    text = rc.read_text() if rc.is_file() else ""
    if line not in text:
        with rc.open("a") as f:
            f.write(("" if not text or text.endswith("\n") else "\n") + line + "\n")
    return str(path)


def completing() -> bool:
    """Whether this is a completion request parsing the command line (Click's resilient parsing): an
    eager option's callback must then do nothing (TAB after ``--install-completion`` installs nothing)."""
    from typer._click.globals import get_current_context

    ctx = get_current_context(silent=True)
    return bool(ctx is not None and ctx.resilient_parsing)


def show_callback(value: str | None) -> None:
    """``--show-completion [SHELL]``: print the script and exit."""
    if value is None or completing():
        return
    import typer

    from attnviz.cli.errors import user_errors

    with user_errors():
        text = script(_shell(value, "--show-completion"))
    sys.stdout.write(text + "\n")
    raise typer.Exit(0)


def install_callback(value: str | None) -> None:
    """``--install-completion [SHELL]``: install the script, say where, and exit."""
    if value is None or completing():
        return
    import typer

    from attnviz.cli.errors import user_errors

    with user_errors():
        shell = _shell(value, "--install-completion")
        where = install(shell)
    sys.stderr.write(f"{shell} completion installed in {where}; it takes effect in a new shell.\n")
    raise typer.Exit(0)

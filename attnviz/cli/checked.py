"""Running the commands over saved weights (inspect, compare, rollout): their checks reported on
stderr and exit 3 when one fails; several files inspected in turn, their output names expanded from
templates (``attnviz.batch.filemaps``), the exit code the worst of them.

Exit codes: 0, 1 (bad data), 2 (bad usage) as everywhere, and 3 when a check asked for fails
(--check-rows, --check-mask, --check-causal, --check-finite, compare's --atol/--rtol).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from functools import partial
from typing import TYPE_CHECKING

import typer
from rich.console import Console

from attnviz.cli.errors import user_errors
from attnviz.streams import out_console

if TYPE_CHECKING:  # NumPy: loaded when a command runs, not for --help
    from attnviz.inspection.checks import CheckResult

CHECK_FAILED = 3
#: how bad an exit code is, for a run over several files: usage error, bad data, a check failed, success
SEVERITY = {0: 0, CHECK_FAILED: 1, 1: 2, 2: 3}


def report_checks(results: list[CheckResult], err: Console, source: str | None = None) -> bool:
    """Each check's line on stderr (with several files, each line names its file); whether one failed."""
    failed = False
    for r in results:
        err.print(f"{source}: {r.line()}" if source else r.line(), markup=False,
                  style="green" if r.passed else "bold red")
        failed = failed or not r.passed
    return failed


def run_checked(run: Callable[[], bool]) -> None:
    """Run a command body with the usual error handling; exit 3 when one of its checks failed."""
    with user_errors():
        failed = run()
    if failed:
        raise typer.Exit(CHECK_FAILED)


def run_each(files: list[str], outputs: Mapping[str, str | None],
             run: Callable[[str, dict[str, str | None], str | None], bool], what: str, tables: bool) -> None:
    """``run(path, outputs, source)`` for each file in turn, with ``run_checked``; ``outputs`` (option ->
    name) are templates with several files, expanded per file (``source`` then names the file in check
    lines). A file that fails does not stop the others; the exit code is the worst: 2 (usage) before 1
    (bad data) before 3 (a check failed) before 0."""
    if len(files) == 1:
        run_checked(lambda: run(files[0], dict(outputs), None))
        return
    from attnviz.batch.filemaps import per_file_outputs
    from attnviz.errors import UsageError

    with user_errors():
        if "-" in files:
            raise UsageError(f"{what}: '-' (standard input) cannot be one of several files; give file names.")
        plans = per_file_outputs(outputs, files)
    worst = 0
    for path, plan in zip(files, plans):
        if tables:
            out_console().print(f"== {path}", style="bold")
        try:
            run_checked(partial(run, path, dict(plan), path))
            code = 0
        except typer.Exit as exc:
            code = exc.exit_code
            if code not in SEVERITY:  # interrupted: stop here
                raise
        if SEVERITY[code] > SEVERITY[worst]:
            worst = code
    if worst:
        raise typer.Exit(worst)

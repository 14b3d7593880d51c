"""The command line (the only package that imports typer).

``attnviz.cli.app`` (the Typer application) is imported on first use of ``attnviz.cli.app``, not with
this package: the console script, ``main``, starts in ``attnviz.worker.client``, which imports the
standard library only and hands the command to a warm worker (``attnviz serve``) when one listens;
otherwise the command runs in this process (``attnviz.cli.console.run``).
"""

from __future__ import annotations

import sys
import types

TYPE_CHECKING = False  # typing is not imported at run time: the console script's first steps stay quick
if TYPE_CHECKING:
    from typing import Any, NoReturn

__all__ = ["app", "main"]


def main(argv: list[str] | None = None) -> NoReturn:
    """The ``attnviz`` console script (and ``python -m attnviz``): through a warm worker when one
    answers, else in this process."""
    from attnviz.worker.client import run_on_worker

    args = list(sys.argv[1:] if argv is None else argv)
    code = run_on_worker(args)
    if code is not None:
        raise SystemExit(code)
    from attnviz.cli.console import run

    run(args)


class _Package(types.ModuleType):
    """``attnviz.cli.app`` is the Typer application, also once the module of the same name is imported
    (the import system binds a submodule to its package's attribute: here it does not, and the attribute is
    the app, made on first use)."""

    def __getattr__(self, name: str) -> Any:
        if name == "app":
            from attnviz.cli.app import app

            return app
        raise AttributeError(f"module {self.__name__!r} has no attribute {name!r}")

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "app" and isinstance(value, types.ModuleType):
            return  # the module, bound by its import: leave ``app`` to __getattr__ (the app, made on first use)
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package

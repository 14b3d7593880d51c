"""``attnviz serve``: the command (its options, help and ``Duration``, the parser of --idle-timeout);
the worker itself is ``attnviz.worker``, handed the runner that runs this command
(``attnviz.cli.runner.Runner.of``): its ``execute`` and ``preload``."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Annotated, Any

import typer

from attnviz.cli.errors import user_errors
from attnviz.cli.parsers import Number, OptionValueError
from attnviz.errors import UsageError
from attnviz.worker.control import DEFAULT_IDLE, MAX_IDLE


@dataclass(frozen=True)
class Duration(Number):
    """A number of seconds, also with a unit (``90s``, ``15m``, ``1.5h``), checked as every number option is
    (finite, within bounds); 0 is never."""

    kind: type = float
    min: float | None = 0.0
    max: float | None = MAX_IDLE

    UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0}

    def __call__(self, value: Any) -> Any:
        match = re.fullmatch(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*([smhSMH])\s*", str(value))
        if match is not None and not isinstance(value, (int, float)):
            seconds = float(match[1]) * self.UNITS[match[2].lower()]
            if seconds > MAX_IDLE:
                raise OptionValueError(value, "must be at most 30 days")
            return seconds
        try:
            return super().__call__(value)
        except OptionValueError as exc:
            if exc.problem == "expected a number":
                raise OptionValueError(value, "expected seconds, or a number with s, m or h (90s, 15m, 2h)") from None
            raise


def serve_command(
    ctx: typer.Context,
    detach: Annotated[bool, typer.Option("--detach", help="start the worker in the background and return once it "
                                                          "listens")] = False,
    idle_timeout: Annotated[float, typer.Option("--idle-timeout", parser=Duration(), metavar="DURATION",
                                                show_default=False,
                                                help="stop after this long without a request (default 15m; 90s, "
                                                     "2h; 0: never)")] = DEFAULT_IDLE,
    status: Annotated[bool, typer.Option("--status", help="say whether a worker listens, and what it runs")] = False,
    stop: Annotated[bool, typer.Option("--stop", help="stop the worker")] = False,
) -> None:
    """Keep TensorFlow loaded: a warm worker runs the commands of this user's attnviz invocations.

    Commands go to it whenever it listens (same output, a fraction of the time); ATTNVIZ_NO_SERVER=1 or
    attnviz --no-server runs a command in its own process.
    """
    from attnviz.cli.runner import Runner
    from attnviz.streams import stdout
    from attnviz.worker import control
    from attnviz.worker.server import Worker

    with user_errors():
        chosen = [name for name, on in (("--detach", detach), ("--status", status), ("--stop", stop)) if on]
        if len(chosen) > 1:
            raise UsageError(f"{' and '.join(chosen)}: choose one.")
        if status:
            stdout().write(control.show_status())
            return
        if stop:
            control.stop(_say)
            return
        if detach:
            control.start_detached(idle_timeout, _say)
            return
        runner = Runner.of(ctx)
        worker = Worker(idle_timeout, execute=runner.execute, preload=runner.preload)
        if control.replace_or_report(worker.path, detach=False, say=_say):
            return
        worker.run()


def _say(text: str) -> None:
    """What ``attnviz serve`` did, on stderr."""
    from attnviz.streams import err_console

    err_console().print(f"attnviz serve: {text}", markup=False)

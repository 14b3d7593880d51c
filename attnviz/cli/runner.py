"""The one runner: ``Runner.execute(argv)`` runs ``attnviz ARGV`` in this process, with the streams of
``attnviz.streams`` (a batch job's buffers, a worker's client), and returns its exit status. The
console script (``attnviz.cli.console.run``), ``attnviz batch`` and the warm worker (``attnviz serve``)
all execute a command through it: a run passes its runner to the commands as the Click context's
``obj`` (``Runner.of(ctx)``), so ``batch`` and ``serve`` are handed the runner and never import the
app, and ``attnviz.batch`` and ``attnviz.worker`` are handed its methods.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


class Runner:
    """Runs attnviz commands in this process; ``get_command(name)`` is the Click command that runs
    ``attnviz NAME ...`` (the whole group, or one holding that command only)."""

    def __init__(self, get_command: Callable[[str | None], Any]) -> None:
        self.get_command = get_command

    @classmethod
    def of(cls, ctx: Any) -> Runner:
        """The runner that runs this command (``ctx``'s root object), or one over the command group
        ``ctx`` belongs to (a run that did not go through a runner, e.g. Typer's test runner)."""
        root = ctx.find_root()
        if isinstance(root.obj, Runner):
            return root.obj
        return cls(lambda name: root.command)

    def execute(self, argv: list[str]) -> int:
        """Run ``attnviz ARGV`` and return its exit status (usage errors, errors meant for users and
        interruptions are worded by the commands themselves; see ``attnviz.cli.errors``)."""
        name = argv[0] if argv and not argv[0].startswith("-") else None
        try:
            self.get_command(name).main(args=list(argv), prog_name="attnviz", obj=self)
        except SystemExit as exc:
            return exit_status(exc.code)
        return 0

    def commands(self) -> set[str]:
        """The commands a batch job may run (every command but batch, variants and serve)."""
        return {name for name in self.get_command(None).commands if name not in ("batch", "variants", "serve")}

    def takes_quiet(self, command: str) -> bool:
        """Whether a command has --quiet, which batch adds to its jobs (repeat-test has none: it prints
        nothing but its result)."""
        found = self.get_command(None).commands.get(command)
        return found is None or any("--quiet" in getattr(p, "opts", ()) for p in found.params)

    def preload(self) -> None:
        """Import what a command needs before the first one runs (a warm worker's start)."""
        import attnviz.inspection.inspecting  # noqa: F401
        import attnviz.pipeline  # noqa: F401
        import attnviz.render.report  # noqa: F401
        import attnviz.render.table  # noqa: F401
        from attnviz.device import tensorflow

        self.get_command(None)
        tensorflow()


def exit_status(code: Any) -> int:
    """The exit status of a process ending with ``SystemExit(code)``."""
    import sys

    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    sys.stderr.write(f"{code}\n")
    return 1


def flush_quietly() -> None:
    """Flush stdout and stderr now; a reader that went away (`| head`) silences its stream instead of
    Python's "Exception ignored ... BrokenPipeError" at exit (see ``attnviz.streams``)."""
    import sys

    from attnviz.streams import silence

    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None:
                stream.flush()
        except BrokenPipeError:
            silence(stream)
        except (OSError, ValueError):
            pass

"""Where the command line writes: stdout for results, stderr for everything else.

Commands write through ``stdout()`` and ``stderr()`` rather than ``sys.stdout``/``sys.stderr``, so
that ``attnviz batch`` can give each job its own buffers (``redirected``), also when jobs run in
threads: the streams are context variables, and each thread runs in its own context.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import IO

from rich.console import Console

from attnviz.render.text import visible

_OUT: ContextVar[IO[str] | None] = ContextVar("attnviz_stdout", default=None)
_ERR: ContextVar[IO[str] | None] = ContextVar("attnviz_stderr", default=None)


def stdout() -> IO[str]:
    return _OUT.get() or sys.stdout


def stderr() -> IO[str]:
    return _ERR.get() or sys.stderr


class MessageConsole(Console):
    """A console whose plain-string messages are inert: control characters in file names and labels
    are shown escaped (``\x1b``), never sent, and rich markup and emoji codes are never read."""

    def print(self, *objects: object, **kwargs: object) -> None:  # type: ignore[override]
        kwargs.setdefault("markup", False)
        kwargs.setdefault("emoji", False)
        super().print(*(visible(o) if isinstance(o, str) else o for o in objects),
                      **kwargs)  # type: ignore[arg-type]


def out_console() -> Console:
    """A console for results (tables) on stdout."""
    stream = stdout()
    # markup and emoji codes off: token labels such as "[CLS]", "[bold]" or ":smile:" and file names are text
    if stream is not sys.stdout:
        return MessageConsole(file=stream, highlight=False, markup=False, emoji=False)
    return MessageConsole(highlight=False, markup=False, emoji=False)


def err_console() -> Console:
    """A console for messages on stderr."""
    return MessageConsole(file=stderr(), highlight=False, soft_wrap=True, markup=False, emoji=False)


@contextmanager
def redirected(out: IO[str], err: IO[str]) -> Iterator[None]:
    out_token, err_token = _OUT.set(out), _ERR.set(err)
    try:
        yield
    finally:
        _OUT.reset(out_token)
        _ERR.reset(err_token)

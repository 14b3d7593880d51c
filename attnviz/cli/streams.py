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

_OUT: ContextVar[IO[str] | None] = ContextVar("attnviz_stdout", default=None)
_ERR: ContextVar[IO[str] | None] = ContextVar("attnviz_stderr", default=None)


def stdout() -> IO[str]:
    return _OUT.get() or sys.stdout


def stderr() -> IO[str]:
    return _ERR.get() or sys.stderr


def out_console() -> Console:
    """A console for results (tables) on stdout."""
    stream = stdout()
    # markup off: token labels such as "[CLS]" or "[bold]" and file names are text, never styles
    if stream is not sys.stdout:
        return Console(file=stream, highlight=False, markup=False)
    return Console(highlight=False, markup=False)


def err_console() -> Console:
    """A console for messages on stderr."""
    return Console(file=stderr(), highlight=False, soft_wrap=True)


@contextmanager
def redirected(out: IO[str], err: IO[str]) -> Iterator[None]:
    out_token, err_token = _OUT.set(out), _ERR.set(err)
    try:
        yield
    finally:
        _OUT.reset(out_token)
        _ERR.reset(err_token)

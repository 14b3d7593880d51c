"""Where the command line writes: stdout for results, stderr for everything else.

Commands write through ``stdout()`` and ``stderr()`` rather than ``sys.stdout``/``sys.stderr``, so
that ``attnviz batch`` can give each job its own buffers (``redirected``), also when jobs run in
threads: the streams are context variables, and each thread runs in its own context.
"""

from __future__ import annotations

import os
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


DEFAULT_WIDTH = 80


def output_width(stream: IO[str] | None = None) -> int:
    """The width tables are laid out for: ``COLUMNS`` when it is a positive number; else the width of the
    terminal standard output is (in a warm worker, the client's: ``attnviz.cli.serve`` answers
    ``os.get_terminal_size`` for it); else 80, for a pipe or a file. (rich alone would take the width of
    whichever of stdin, stdout and stderr is a terminal: ``attnviz ... | less`` would get the terminal's.)"""
    columns = os.environ.get("COLUMNS", "").strip()
    if columns.isdigit() and int(columns) > 0:
        return int(columns)
    stream = stdout() if stream is None else stream
    try:
        tty = stream.isatty()
    except (OSError, ValueError):
        tty = False
    if tty:
        try:
            fd = stream.fileno()
        except (OSError, ValueError, AttributeError):  # a worker's stream stands for the client's stdout
            fd = 1
        try:
            return os.get_terminal_size(fd).columns or DEFAULT_WIDTH
        except (OSError, ValueError):
            pass
    return DEFAULT_WIDTH


def out_console() -> Console:
    """A console for results (tables) on stdout, ``output_width()`` wide (the tables of
    ``attnviz.render.table`` lay themselves out for it)."""
    stream = stdout()
    # markup and emoji codes off: token labels such as "[CLS]", "[bold]" or ":smile:" and file names are text
    if stream is not sys.stdout:
        return MessageConsole(file=stream, highlight=False, markup=False, emoji=False, width=output_width(stream))
    return MessageConsole(highlight=False, markup=False, emoji=False, width=output_width(stream))


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

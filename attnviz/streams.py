"""Where the command line writes: stdout for results, stderr for everything else.

Commands write through ``stdout()`` and ``stderr()`` rather than ``sys.stdout``/``sys.stderr``, so
that ``attnviz batch`` can give each job its own buffers (``redirected``), also when jobs run in
threads: the streams are context variables, and each thread runs in its own context.

**A reader that goes away** (``attnviz ... | head``) is not an error. Python ignores SIGPIPE, so a
write to a closed pipe raises ``BrokenPipeError``; here that ends the output, not the run: the
stream's descriptor is pointed at ``/dev/null`` (``silence``), so whatever the command still writes,
and Python's own flush at exit, go nowhere without a traceback or an "Exception ignored" line, and
consoles printing to it stop rendering. The command finishes (its files are written) and exits with
its own status: 0 when it succeeded. ``stdout()`` and ``stderr()`` hand out the process's streams
so guarded, consoles (``MessageConsole.on_broken_pipe``) likewise; ``attnviz.cli.runner`` catches what
else reaches the top (help, ``--version``) and ``attnviz.worker.client`` does the same for the output
of a warm worker.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import IO, Any, cast

from rich.console import Console
from rich.text import Text

from attnviz.text import fit_paths, visible

_OUT: ContextVar[IO[str] | None] = ContextVar("attnviz_stdout", default=None)
_ERR: ContextVar[IO[str] | None] = ContextVar("attnviz_stderr", default=None)


_SILENCED: set[int] = set()  # descriptors whose reader went away, now pointing at /dev/null


def silence(stream: Any) -> None:
    """The reader of ``stream`` (the process's stdout or stderr) went away: point its descriptor at
    ``/dev/null``, so that what is still written, and Python's flush at exit, go nowhere quietly."""
    try:
        fd = stream.fileno()
    except (OSError, ValueError, AttributeError):
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, fd)
    finally:
        os.close(devnull)
    _SILENCED.add(fd)


def silenced(stream: Any) -> bool:
    """Whether ``stream``'s reader went away (see ``silence``)."""
    try:
        return stream.fileno() in _SILENCED
    except (OSError, ValueError, AttributeError):
        return False


class _Guarded:
    """The process's stdout or stderr as commands write to them: a closed pipe silences it."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        try:
            return int(self._stream.write(text))
        except BrokenPipeError:
            silence(self._stream)
            return len(text)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BrokenPipeError:
            silence(self._stream)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def stdout() -> IO[str]:
    return _OUT.get() or cast(IO[str], _Guarded(sys.stdout))


def stderr() -> IO[str]:
    return _ERR.get() or cast(IO[str], _Guarded(sys.stderr))


class MessageConsole(Console):
    """A console whose plain-string messages are inert: control characters in file names and labels
    are shown escaped (``\x1b``), never sent, and rich markup and emoji codes are never read. A
    closed pipe silences its stream and the console (rich's own answer is to exit with status 1).

    A table printed uncropped (``print(table, crop=False)``, as the commands print theirs) goes out in
    whole lines of about ``PIECE`` characters as it is rendered, rather than rendered whole and then
    written: the same bytes, but a reader that goes away (``attnviz scaled ... --max-cols 0 | head``)
    stops the rendering of the rest (a 300 x 300 map took seconds to render for nobody)."""

    PIECE = 8192

    def __init__(self, *args: Any, fit: int | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        #: the terminal's width, when known: a message longer has its paths shortened in the middle
        #: (``attnviz.text.fit_paths``) and wraps
        self.fit = fit
        #: the width is the reader's (a terminal's, or ``COLUMNS``), not a default for a pipe or a file
        self.width_known = True

    def print(self, *objects: object, **kwargs: object) -> None:  # type: ignore[override]
        if self.quiet:  # its reader went away: nothing to render
            return
        kwargs.setdefault("markup", False)
        kwargs.setdefault("emoji", False)
        objects = tuple(visible(o) if isinstance(o, str) else o for o in objects)
        if self.fit:
            objects = tuple(fit_paths(o, self.fit) if isinstance(o, str) else o for o in objects)
        if self._in_pieces(objects, kwargs):
            self._print_in_pieces(objects[0], kwargs)
            return
        super().print(*objects, **kwargs)  # type: ignore[arg-type]

    def _in_pieces(self, objects: tuple[object, ...], kwargs: dict[str, object]) -> bool:
        """Whether ``print(*objects, **kwargs)`` renders exactly the segments of the one renderable, as
        they come: a renderable that is not text (text gets print's ``end``), uncropped, nothing else
        asked for, no style or render hook of the console's own."""
        one = objects[0] if len(objects) == 1 else None
        return (hasattr(one, "__rich_console__") and not isinstance(one, Text) and not hasattr(one, "__rich__")
                and kwargs.get("crop") is False and set(kwargs) <= {"crop", "markup", "emoji"}
                and not self.soft_wrap and self.style is None and not self._render_hooks)

    def _print_in_pieces(self, renderable: object, kwargs: dict[str, object]) -> None:
        from rich.segment import Segment, Segments

        # the options Console.print renders with for these arguments
        options = self.options.update(justify=None, overflow=None, height=None, no_wrap=None,
                                      markup=kwargs["markup"], highlight=None)  # type: ignore[arg-type]
        piece: list[Segment] = []
        size = 0
        for segment in self.render(renderable, options):  # type: ignore[arg-type]
            piece.append(segment)
            size += len(segment.text)
            if size >= self.PIECE and segment.text.endswith("\n"):
                super().print(Segments(piece), **kwargs)  # type: ignore[arg-type]
                if self.quiet:  # the reader went away: the rest is not rendered
                    return
                piece, size = [], 0
        if piece:
            super().print(Segments(piece), **kwargs)  # type: ignore[arg-type]

    def on_broken_pipe(self) -> None:
        self.quiet = True
        silence(self.file)


DEFAULT_WIDTH = 80


def output_width(stream: IO[str] | None = None) -> int:
    """The width tables are laid out for: ``COLUMNS`` when it is a positive number; else the width of the
    terminal standard output is (in a warm worker, the client's: ``attnviz.worker.server`` answers
    ``os.get_terminal_size`` for it); else 80, for a pipe or a file. (rich alone would take the width of
    whichever of stdin, stdout and stderr is a terminal: ``attnviz ... | less`` would get the terminal's.)"""
    return terminal_width(stdout() if stream is None else stream) or DEFAULT_WIDTH


def terminal_width(stream: Any, fd: int = 1) -> int | None:
    """``COLUMNS`` when it is a positive number; else the width of the terminal ``stream`` is (``fd``: the
    descriptor a worker's stream stands for); else None (a pipe or a file, whose lines may be long)."""
    columns = os.environ.get("COLUMNS", "").strip()
    if columns.isdigit() and int(columns) > 0:
        return int(columns)
    try:
        tty = stream.isatty()
    except (OSError, ValueError, AttributeError):
        tty = False
    if tty:
        try:
            fd = stream.fileno()
        except (OSError, ValueError, AttributeError):  # a worker's stream stands for the client's
            pass
        try:
            return os.get_terminal_size(fd).columns or None
        except (OSError, ValueError):
            pass
    return None


def out_console() -> Console:
    """A console for results (tables) on stdout, ``output_width()`` wide (the tables of
    ``attnviz.render.table`` lay themselves out for it). On a terminal a line of text (a file's heading)
    fits it: its paths shortened in the middle."""
    stream = _OUT.get()
    # markup and emoji codes off: token labels such as "[CLS]", "[bold]" or ":smile:" and file names are text
    if stream is not None:
        console = MessageConsole(file=stream, highlight=False, markup=False, emoji=False, width=output_width(stream))
    else:
        console = MessageConsole(highlight=False, markup=False, emoji=False, width=output_width(sys.stdout),
                                 quiet=silenced(sys.stdout))
    console.fit = console.width if console.is_terminal else None
    console.width_known = terminal_width(sys.stdout if stream is None else stream) is not None
    return console


def err_console() -> Console:
    """A console for messages on stderr. On a terminal (as rich tells one: ``isatty``, ``TTY_COMPATIBLE``,
    ``FORCE_COLOR``) a message fits its width (``COLUMNS``, else the terminal's): its paths shortened in
    the middle, then wrapped. To a pipe or a file each message is one line, whole."""
    stream = _ERR.get()
    console = MessageConsole(file=stream, stderr=stream is None, highlight=False, soft_wrap=True, markup=False,
                             emoji=False, quiet=stream is None and silenced(sys.stderr))
    if console.is_terminal:
        width = terminal_width(sys.stderr if stream is None else stream, fd=2) or console.width
        console.soft_wrap, console.width, console.fit = False, width, width
    return console


@contextmanager
def redirected(out: IO[str], err: IO[str]) -> Iterator[None]:
    out_token, err_token = _OUT.set(out), _ERR.set(err)
    try:
        yield
    finally:
        _OUT.reset(out_token)
        _ERR.reset(err_token)

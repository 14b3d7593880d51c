"""``--show``: a command's picture drawn in the terminal, after its tables (``ShowOptions``).

``draw`` chooses how (``attnviz.render.graphics.choose``: a graphics protocol, coloured half-blocks, plain
characters, or nothing) and writes to the command's stdout: a protocol's escape sequence carrying the PNG
``--png`` would save (the figure from ``figure()``), or the ``attnviz.render.terminal`` picture from
``picture(plain, height)`` printed by a rich console (colours as the terminal can show them: rich sends
24-bit colours, or the nearest of 256 or 16). Nothing but plain characters goes to a pipe or a file
unless ``--graphics`` names a way to draw.

Also here the terminal itself, which the library never touches: its height, its cell's width in pixels,
and ``ask_sixel``, the short query of its device attributes.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any

from attnviz.errors import UsageError
from attnviz.render.options import ShowOptions
from attnviz.streams import MessageConsole, output_width, stdout

QUERY_TIMEOUT = 0.1  # seconds to wait for the terminal's answer


def check(show: ShowOptions, json: bool) -> ShowOptions:
    """The ``--show`` to draw with, or a usage error (exit 2) for values that contradict each other: with
    ``--json`` on a terminal, where the picture and the document would share the screen (in a pipe the
    document owns stdout: ``--show`` is quietly nothing there, as a picture would corrupt it); a bad
    ``ATTNVIZ_GRAPHICS``."""
    if show.show and json:
        if _is_tty(stdout()):
            raise UsageError("--show draws on stdout, which --json gives to the JSON document; write the document "
                             "with --json-file instead.")
        from dataclasses import replace

        return replace(show, show=False)
    if show.show:
        show.mode()
    return show


def _is_tty(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (OSError, ValueError, AttributeError):
        return False


def _own_terminal(stream: Any) -> bool:
    """Whether ``stream`` is this process's standard output on a terminal (not a worker's, not a batch job's)."""
    try:
        return stream.fileno() == 1 and os.isatty(1)
    except (OSError, ValueError, AttributeError):
        return False


def terminal_height(stream: Any) -> int | None:
    """Text rows of the terminal (``LINES`` first; in a warm worker, the client's), or None when unknown."""
    lines = os.environ.get("LINES", "").strip()
    if lines.isdigit() and int(lines) > 0:
        return int(lines)
    if not _is_tty(stream):
        return None
    try:
        fd = stream.fileno()
    except (OSError, ValueError, AttributeError):
        fd = 1
    try:
        return os.get_terminal_size(fd).lines or None
    except (OSError, ValueError):
        return None


def cell_width(fd: int = 1) -> int | None:
    """The width of a cell in pixels, as the terminal tells the kernel (``TIOCGWINSZ``), or None."""
    import struct

    try:
        import fcntl
        import termios

        rows, cols, xpixels, _ = struct.unpack("HHHH", fcntl.ioctl(fd, termios.TIOCGWINSZ, b"\0" * 8))
        return xpixels // cols if cols and xpixels else None
    except (OSError, ImportError, ValueError, struct.error):
        return None


def ask_sixel(timeout: float = QUERY_TIMEOUT) -> bool:
    """Whether the terminal on standard input and output draws sixel: its primary device attributes
    (``ESC [ c``) include 4. Asked only when both are the same terminal, without echo, for at most
    ``timeout`` seconds (a terminal that does not answer costs that, once)."""
    import select

    try:
        if not (os.isatty(0) and os.isatty(1)) or os.ttyname(0) != os.ttyname(1):
            return False
        import termios
        import tty
    except (OSError, ImportError):
        return False
    answer = b""
    try:
        saved = termios.tcgetattr(0)
    except termios.error:
        return False
    try:
        tty.setcbreak(0, termios.TCSANOW)
        quiet = termios.tcgetattr(0)
        quiet[3] &= ~termios.ECHO
        termios.tcsetattr(0, termios.TCSANOW, quiet)
        sys.stdout.flush()
        os.write(1, b"\x1b[c")
        wait = timeout
        while not answer.endswith(b"c"):
            ready, _, _ = select.select([0], [], [], wait)
            if not ready:
                break
            answer += os.read(0, 64)
            wait = timeout / 2
    except (OSError, termios.error):
        return False
    finally:
        termios.tcsetattr(0, termios.TCSAFLUSH, saved)
    return sixel_in_attributes(answer.decode("ascii", "replace"))


def sixel_in_attributes(answer: str) -> bool:
    """Whether a terminal's answer to ``ESC [ c`` (``ESC [ ? 63 ; 1 ; 4 c``) lists sixel (4)."""
    if "\x1b[?" not in answer or not answer.endswith("c"):
        return False
    return "4" in answer.split("\x1b[?", 1)[1][:-1].split(";")


def draw(show: ShowOptions, figure: Callable[[], Any], picture: Callable[[bool, int | None], Any]) -> str | None:
    """Draw the picture asked for on the command's stdout (see the module); returns how it was drawn
    (``kitty``, ``iterm``, ``sixel``, ``blocks``, ``plain``), or None."""
    if not show.show:
        return None
    from attnviz.render import graphics

    out = stdout()
    tty = _is_tty(out)
    mode = graphics.choose(show.mode(), tty=tty, ask=ask_sixel if _own_terminal(out) else None)
    if mode == "none":
        return None
    width = output_width(out)
    if mode in ("blocks", "plain"):
        console = MessageConsole(file=out, highlight=False, markup=False, emoji=False, width=width,
                                 force_terminal=mode == "blocks" or None, no_color=mode == "plain" or None)
        console.print(picture(mode == "plain", terminal_height(out)), crop=False)
        return mode
    png = graphics.figure_png(figure())
    sequence = graphics.encode(mode, png, width, cell_width() if _own_terminal(out) else None)
    if graphics.multiplexer(os.environ) == "tmux":
        sequence = graphics.tmux_wrap(sequence)
    out.write(sequence + "\n")
    out.flush()
    return mode

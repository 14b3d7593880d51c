"""Images in the terminal: which way to draw (``--graphics``), and the escape sequences of the three
graphics protocols, for the PNG that ``--png`` saves.

``choose`` turns ``--graphics auto|kitty|iterm|sixel|blocks|none`` into what is drawn: a protocol, ``blocks``
(``attnviz.render.terminal`` in colour), ``plain`` (the same in plain characters) or ``none``. ``auto``
draws nothing but plain characters where the output is not a terminal (a pipe, a file) or ``NO_COLOR``
is set or ``TERM=dumb``; in a terminal it takes the protocol the environment names (``detect``:
``KITTY_WINDOW_ID``, ``TERM``, ``TERM_PROGRAM``, ``LC_TERMINAL``, ``WT_SESSION`` ...), else asks the
terminal whether it draws sixel (the ``ask`` it is handed: the command line's
``attnviz.cli.show.ask_sixel``), else half-blocks. Inside tmux (and
screen) ``auto`` uses half-blocks, which need no passthrough; a protocol named explicitly is wrapped
for tmux's passthrough (``tmux_wrap``; tmux needs ``set -g allow-passthrough on``).

The encoders take PNG bytes (``figure_png``: the figure drawn exactly as ``save_figure`` writes it):

* kitty's graphics protocol (kitty, Ghostty, WezTerm, Konsole): ``ESC _G a=T,f=100,c=COLS ; base64
  ESC \\``, the PNG itself in chunks of 4096 base64 characters, scaled by the terminal to ``COLS``
  cells;
* iTerm2's inline images (iTerm2, WezTerm, VS Code, mintty): ``ESC ]1337;File=inline=1;...:base64 BEL``;
* sixel (xterm -ti vt340, foot, Windows Terminal, mlterm, Konsole): the image resized to the terminal's
  width in pixels and encoded by textual-image's sixel encoder (a palette of up to 256 colours, bands of
  six rows, run lengths).
"""

from __future__ import annotations

import base64
import io
import os
from collections.abc import Callable, Mapping
from typing import Any

PROTOCOLS = ("kitty", "iterm", "sixel")
CHUNK = 4096  # base64 characters per kitty graphics message
CELL_PIXELS = (10, 20)  # a cell's width and height in pixels when the terminal does not say (VT340's)


def detect(environ: Mapping[str, str]) -> str | None:
    """The graphics protocol the environment says the terminal has, or None (unknown: ask it, or
    half-blocks)."""
    term = environ.get("TERM", "").lower()
    program = environ.get("TERM_PROGRAM", "").lower()
    lc_terminal = environ.get("LC_TERMINAL", "").lower()
    if environ.get("KITTY_WINDOW_ID") or "kitty" in term or program == "ghostty" or "ghostty" in term:
        return "kitty"
    if program == "iterm.app" or lc_terminal == "iterm2":
        return "iterm"
    if program == "wezterm" or environ.get("WEZTERM_EXECUTABLE"):
        return "iterm"  # WezTerm draws kitty's protocol in part, iTerm2's fully
    if program in ("vscode", "mintty") or term == "mintty":
        return "iterm"  # VS Code: with terminal.integrated.enableImages
    if environ.get("WT_SESSION") or term.startswith(("foot", "mlterm", "contour")) or environ.get("KONSOLE_VERSION"):
        return "sixel"
    return None


def multiplexer(environ: Mapping[str, str]) -> str | None:
    """``tmux`` or ``screen`` when the output goes through one."""
    if environ.get("TMUX") or environ.get("TERM_PROGRAM", "").lower() == "tmux":
        return "tmux"
    if environ.get("STY") or environ.get("TERM", "").startswith("screen"):
        return "screen"
    return None


def choose(asked: str, *, tty: bool, environ: Mapping[str, str] | None = None,
           ask: Callable[[], bool] | None = None) -> str:
    """What ``--show`` draws for ``--graphics asked``: ``kitty``, ``iterm``, ``sixel``, ``blocks``, ``plain`` or
    ``none`` (see the module). ``tty``: whether stdout is a terminal; ``ask()`` asks the terminal whether it
    draws sixel (None: never ask)."""
    environ = os.environ if environ is None else environ
    no_colour = bool(environ.get("NO_COLOR")) or environ.get("TERM", "") == "dumb"
    if asked in PROTOCOLS or asked == "none":
        return asked
    if asked == "blocks":
        return "plain" if no_colour else "blocks"
    if not tty or no_colour:
        return "plain"
    if multiplexer(environ):
        return "blocks"
    found = detect(environ)
    if found:
        return found
    if ask is not None and ask():
        return "sixel"
    return "blocks"


# ----------------------------------------------------------------------------------------------
# The escape sequences


def figure_png(fig: Any) -> bytes:
    """The PNG file of a figure, byte for byte as ``save_figure`` writes it."""
    import numpy as np
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    from attnviz.render.heatmap import DPI, png_bytes, quiet_matplotlib

    quiet_matplotlib()
    canvas = fig.canvas if isinstance(fig.canvas, FigureCanvasAgg) else FigureCanvasAgg(fig)
    fig.set_dpi(DPI)
    canvas.draw()
    return png_bytes(np.asarray(canvas.buffer_rgba()))


def kitty(png: bytes, columns: int) -> str:
    """kitty's graphics protocol: transmit and show the PNG (``f=100``) at once (``a=T``), ``columns``
    cells wide (rows by its aspect), no answer wanted (``q=2``); the base64 data in chunks (``m=1``: more
    follow)."""
    data = base64.standard_b64encode(png).decode("ascii")
    chunks = [data[i:i + CHUNK] for i in range(0, len(data), CHUNK)] or [""]
    out = []
    for n, chunk in enumerate(chunks):
        more = 1 if n < len(chunks) - 1 else 0
        keys = f"a=T,f=100,q=2,c={columns},m={more}" if n == 0 else f"m={more}"
        out.append(f"\x1b_G{keys};{chunk}\x1b\\")
    return "".join(out)


def iterm(png: bytes, columns: int) -> str:
    """iTerm2's inline image: the PNG in base64, ``columns`` cells wide, its aspect kept."""
    data = base64.standard_b64encode(png).decode("ascii")
    name = base64.standard_b64encode(b"attnviz.png").decode("ascii")
    return (f"\x1b]1337;File=name={name};inline=1;size={len(png)};width={columns};preserveAspectRatio=1:"
            f"{data}\x07")


def sixel(png: bytes, width_px: int | None = None) -> str:
    """The PNG as sixel, resized (never enlarged) to ``width_px`` pixels wide, its aspect kept; encoded by
    textual-image's sixel encoder (up to 256 colours)."""
    from PIL import Image
    from textual_image._sixel import image_to_sixels

    image = Image.open(io.BytesIO(png)).convert("RGB")
    if width_px is not None and image.width > width_px:
        height = max(1, round(image.height * width_px / image.width))
        image = image.resize((width_px, height), Image.Resampling.LANCZOS)
    return str(image_to_sixels(image))


def tmux_wrap(sequence: str) -> str:
    """An escape sequence passed through tmux to the terminal outside: ``ESC Ptmux;`` + the sequence
    with each ESC doubled + ``ESC \\`` (tmux needs ``allow-passthrough on``)."""
    return "\x1bPtmux;" + sequence.replace("\x1b", "\x1b\x1b") + "\x1b\\"


def encode(protocol: str, png: bytes, columns: int, cell_width: int | None = None) -> str:
    """The sequence that draws ``png`` ``columns`` cells wide with ``protocol``."""
    if protocol == "kitty":
        return kitty(png, columns)
    if protocol == "iterm":
        return iterm(png, columns)
    return sixel(png, columns * (cell_width or CELL_PIXELS[0]))

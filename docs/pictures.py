"""The documentation's pictures, each made by the command line shown beside it.

Every ``![...](....png)`` of the README and of ``docs/`` follows a command line (the last ``attnviz ...``
line of a code block before it on its page). This script runs that command against the sample files and
writes the picture it makes: the file a ``--png`` or ``--overlay-png`` names; what ``--show`` draws in a
terminal of the size ``SIZES`` gives (run in a pseudo-terminal, its output drawn a character cell at a
time); or for ``attnviz view`` the viewer's screen, run headless at that size. ``tests/test_doc_pictures.py``
makes each picture again and compares it with the one in ``docs/images/``.

    python docs/pictures.py            # every picture
    python docs/pictures.py grid.png   # one
"""

from __future__ import annotations

import io
import os
import re
import shlex
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
IMAGES = ROOT / "docs" / "images"
IMAGE = re.compile(r"!\[[^\]]*\]\((?:docs/)?images/([\w.-]+\.png)\)")
#: the terminal each terminal picture is drawn in (columns, lines)
SIZES = {"terminal-blocks.png": (100, 32), "terminal-view.png": (80, 24)}
#: the options naming the picture a command writes
OUTPUTS = ("--png", "--overlay-png", "--map-png", "--stats-png", "--received-png", "--heads-map")
CELL = (9, 18)  # a character cell in pixels
BACKGROUND, FOREGROUND = (24, 24, 27), (221, 221, 221)


@dataclass
class Picture:
    """A picture of the documentation, the command beside it, and the pages that show it."""

    name: str
    command: str
    pages: list[str] = field(default_factory=list)

    @property
    def path(self) -> Path:
        return IMAGES / self.name


def pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def pictures() -> dict[str, Picture]:
    """Every picture the pages show, with the command line before it (the same on every page that shows it:
    a ``ValueError`` otherwise, or where no command comes before a picture)."""
    found: dict[str, Picture] = {}
    for page in pages():
        last: str | None = None
        for line in page.read_text().splitlines():
            stripped = line.strip()
            if stripped.startswith("attnviz ") and (line.startswith("    ") or not line.startswith(" ")):
                last = stripped
            for name in IMAGE.findall(line):
                where = str(page.relative_to(ROOT))
                if last is None:
                    raise ValueError(f"{where}: no command line comes before {name}")
                picture = found.setdefault(name, Picture(name, last))
                if picture.command != last:
                    raise ValueError(f"{where}: {name} follows {last!r}, elsewhere {picture.command!r}")
                picture.pages.append(where)
    return found


def _argv(command: str, out: Path) -> tuple[list[str], Path | None]:
    """The command's arguments (run in the repository's folder: the sample files as the pages name them), the
    picture it writes put in ``out``."""
    argv = shlex.split(command)[1:]
    written = None
    for n, arg in enumerate(argv):
        if n and argv[n - 1] in OUTPUTS:
            written = out / Path(arg).name
            argv[n] = str(written)
    return argv, written


@contextmanager
def _in(folder: Path) -> Iterator[None]:
    before = os.getcwd()
    os.chdir(folder)
    try:
        yield
    finally:
        os.chdir(before)


def make(picture: Picture) -> bytes:
    """The PNG the picture's command makes, now (run in the repository's folder, as the pages' paths say)."""
    with tempfile.TemporaryDirectory() as folder, _in(ROOT):
        argv, written = _argv(picture.command, Path(folder))
        if argv[0] == "view":
            return terminal_png(viewer_lines(argv, *SIZES.get(picture.name, (80, 24))))
        if "--show" in argv:
            columns, lines = SIZES.get(picture.name, (100, 32))
            return terminal_png(ansi_lines(run_in_terminal(argv, columns, lines), columns))
        if written is None:
            raise ValueError(f"{picture.name}: {picture.command!r} writes no picture ({', '.join(OUTPUTS)}) and "
                             "draws none (--show, view)")
        from typer.testing import CliRunner

        from attnviz.cli import app

        result = CliRunner().invoke(app, argv, env={"COLUMNS": "100"})
        if result.exit_code != 0:
            raise RuntimeError(f"{picture.command}: exit {result.exit_code}: {result.stderr}")
        return written.read_bytes()


def run_in_terminal(argv: list[str], columns: int, lines: int) -> str:
    """What ``attnviz ARGV`` writes in a pseudo-terminal of ``columns`` x ``lines`` (24-bit colour)."""
    import fcntl
    import pty
    import struct
    import termios

    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", lines, columns, 0, 0))
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES", "NO_COLOR") and
           not k.startswith("ATTNVIZ_")}
    env.update(PYTHONPATH=str(ROOT), ATTNVIZ_NO_SERVER="1", TERM="xterm-256color", COLORTERM="truecolor")
    proc = subprocess.Popen([sys.executable, "-m", "attnviz", *argv], stdin=subprocess.DEVNULL, stdout=slave,
                            stderr=slave, env=env, cwd=ROOT)
    os.close(slave)
    chunks = []
    while True:
        try:
            data = os.read(master, 65536)
        except OSError:
            break
        if not data:
            break
        chunks.append(data)
    os.close(master)
    if proc.wait(timeout=120) != 0:
        raise RuntimeError(f"attnviz {' '.join(argv)}: {b''.join(chunks).decode('utf-8', 'replace')[-2000:]}")
    return b"".join(chunks).decode("utf-8", "replace")


def ansi_lines(text: str, columns: int) -> list[list[Any]]:
    """Lines of rich segments from a terminal's output (its colour escapes)."""
    from rich.console import Console
    from rich.text import Text

    console = Console(width=columns, file=io.StringIO(), force_terminal=True, color_system="truecolor")
    out = []
    for line in text.replace("\r\n", "\n").split("\n"):
        out.append(list(Text.from_ansi(line, no_wrap=True).render(console)))
    while out and not any(s.text.strip() for s in out[-1]):
        out.pop()
    return out


def viewer_lines(argv: list[str], columns: int, lines: int) -> list[list[Any]]:
    """The screen of ``attnviz view ARGV`` (run headless) in ``columns`` x ``lines``, as lines of segments."""
    import asyncio

    import typer
    from rich.console import Console
    from rich.segment import Segment

    from attnviz.cli import app as cli_app
    from attnviz.cli.commands.view import view
    from attnviz.cli.options import build
    from attnviz.inspection.options import InspectOptions
    from attnviz.render.options import FigureOptions

    command = typer.main.get_command(cli_app).commands["view"]  # type: ignore[attr-defined]
    values = command.make_context("view", argv[1:]).params
    app = view(build(InspectOptions, values, weights=values["weights"]), build(FigureOptions, values), run=False)
    got: list[list[Any]] = []

    async def shoot() -> None:
        async with app.run_test(size=(columns, lines)) as pilot:
            await pilot.pause()
            console = Console(width=columns, height=lines, file=io.StringIO(), force_terminal=True,
                              color_system="truecolor", record=True, legacy_windows=False, safe_box=False)
            console.print(app.screen._compositor.render_update(full=True))
            segments = [s for s in console._record_buffer if not s.control]  # cursor moves: the lines already
            got.extend(Segment.split_and_crop_lines(segments, columns, include_new_lines=False))
            await pilot.press("q")

    asyncio.run(shoot())
    return got


def _rgb(color: Any, default: tuple[int, int, int]) -> tuple[int, int, int]:
    if color is None or color.is_default:
        return default
    triplet = color.get_truecolor()
    return int(triplet.red), int(triplet.green), int(triplet.blue)


def terminal_png(lines: list[list[Any]]) -> bytes:
    """Lines of rich segments drawn a character cell at a time (DejaVu Sans Mono, matplotlib's), half-blocks as
    two exact rectangles."""
    import matplotlib
    from PIL import Image, ImageDraw, ImageFont

    fonts = Path(matplotlib.get_data_path()) / "fonts" / "ttf"
    regular = ImageFont.truetype(str(fonts / "DejaVuSansMono.ttf"), 14)
    bold = ImageFont.truetype(str(fonts / "DejaVuSansMono-Bold.ttf"), 14)
    columns = max((sum(len(s.text) for s in line) for line in lines), default=1)
    w, h = CELL
    image = Image.new("RGB", (columns * w + 8, len(lines) * h + 8), BACKGROUND)
    draw = ImageDraw.Draw(image)
    for row, line in enumerate(lines):
        col = 0
        for segment in line:
            style = segment.style
            fg = _rgb(style.color if style else None, FOREGROUND)
            bg = _rgb(style.bgcolor if style else None, BACKGROUND)
            if style is not None and style.reverse:
                fg, bg = bg, fg
            if style is not None and style.dim:
                fg = tuple((a + b) // 2 for a, b in zip(fg, bg))  # type: ignore[assignment]
            for ch in segment.text:
                x, y = 4 + col * w, 4 + row * h
                draw.rectangle([x, y, x + w - 1, y + h - 1], fill=bg)
                if ch == "▀":
                    draw.rectangle([x, y, x + w - 1, y + h // 2 - 1], fill=fg)
                elif ch == "▄":
                    draw.rectangle([x, y + h // 2, x + w - 1, y + h - 1], fill=fg)
                elif ch == "█":
                    draw.rectangle([x, y, x + w - 1, y + h - 1], fill=fg)
                elif ch != " ":
                    font = bold if style is not None and style.bold else regular
                    draw.text((x, y + 1), ch, fill=fg, font=font)
                col += 1
    out = io.BytesIO()
    image.save(out, format="PNG")
    return out.getvalue()


def main(names: list[str]) -> None:
    found = pictures()
    for name in names or sorted(found):
        picture = found[name]
        picture.path.write_bytes(make(picture))
        print(f"{picture.path.relative_to(ROOT)}: {picture.command}")


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    main(sys.argv[1:])

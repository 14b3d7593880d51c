"""Pictures in the terminal (issue 23): ``--show`` and ``--graphics``, and ``attnviz view``.

The half-blocks are read back from the ANSI codes rich writes and compared cell by cell with the map
reduced in blocks by NumPy here (a reshape of the NaN-padded map) and coloured by matplotlib's colour map
on ``Normalize(0, max)``; kitty's and iTerm2's payloads are decoded and compared byte for byte with the PNG
``--png`` writes for the same run; sixel is decoded (palette, bands, repeats) by a decoder written here and
compared with that PNG. A real terminal: tmux (``capture-pane -e``) and xterm with sixel (``xterm -ti
vt340`` under Xvfb, a screenshot read back). The viewer is driven headless by Textual's pilot.
"""

from __future__ import annotations

import asyncio
import base64
import io
import json
import math
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from rich.console import Console
from typer.testing import CliRunner

from attnviz.cli import app
from attnviz.render import graphics
from attnviz.render.scale import ColourScale
from attnviz.render.terminal import BAD, single_picture
from tests.conftest import ROOT

runner = CliRunner()
BAD_RGB = (217, 217, 217)


def softmax_dump(shape, seed=0, scale=3.0):
    rng = np.random.default_rng(seed)
    s = rng.normal(size=shape) * scale
    w = np.exp(s - s.max(-1, keepdims=True))
    return (w / w.sum(-1, keepdims=True)).astype(np.float32)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("show")
    np.save(d / "dump.npy", softmax_dump((3, 1, 4, 12, 12)))
    np.save(d / "dumpb.npy", softmax_dump((3, 1, 4, 12, 12), seed=1))
    (d / "tok.txt").write_text("\n".join(f"w{i}" for i in range(12)) + "\n")
    np.save(d / "q.npy", np.random.default_rng(0).normal(size=(6, 4)).astype(np.float32))
    return d


def invoke(*args, env=None, code=0):
    result = runner.invoke(app, [str(a) for a in args], env={"COLUMNS": "80", **(env or {})})
    assert result.exit_code == code, (result.stdout, result.stderr)
    return result


# ----------------------------------------------------------------------------------------------
# ANSI read back


SGR = re.compile(r"\x1b\[([0-9;]*)m")


def cells_of(text: str) -> list[list[tuple[str, tuple | None, tuple | None]]]:
    """Each line as (character, foreground, background): 24-bit colours as RGB, 256 as ('256', n)."""
    lines, fg, bg = [], None, None
    for raw in text.split("\n"):
        line, pos = [], 0
        for m in list(SGR.finditer(raw)) + [None]:
            end = m.start() if m else len(raw)
            line += [(ch, fg, bg) for ch in raw[pos:end]]
            if m is None:
                break
            codes = [int(c) if c else 0 for c in m.group(1).split(";")]
            i = 0
            while i < len(codes):
                c = codes[i]
                if c == 0:
                    fg = bg = None
                elif c in (38, 48) and codes[i + 1] == 2:
                    value = tuple(codes[i + 2:i + 5])
                    fg, bg = (value, bg) if c == 38 else (fg, value)
                    i += 4
                elif c in (38, 48) and codes[i + 1] == 5:
                    value = ("256", codes[i + 2])
                    fg, bg = (value, bg) if c == 38 else (fg, value)
                    i += 2
                elif 30 <= c <= 37 or 90 <= c <= 97:
                    fg = ("16", c)
                elif 40 <= c <= 47 or 100 <= c <= 107:
                    bg = ("16", c)
                i += 1
            pos = m.end()
        lines.append(line)
    return lines


def render(picture, width, system="truecolor"):
    out = io.StringIO()
    Console(file=out, width=width, color_system=system, force_terminal=True, legacy_windows=False).print(
        picture, crop=False)
    return out.getvalue()


def reference_blocks(data, keep, f):
    """Blocks of f x f by a reshape of the NaN-padded map: mean of the kept cells, NaN when none."""
    v = np.where(keep, data.astype(np.float64), np.nan)
    rows, cols = math.ceil(v.shape[0] / f) * f, math.ceil(v.shape[1] / f) * f
    padded = np.full((rows, cols), np.nan)
    padded[:v.shape[0], :v.shape[1]] = v
    blocks = padded.reshape(rows // f, f, cols // f, f).transpose(0, 2, 1, 3).reshape(rows // f, cols // f, -1)
    with np.errstate(invalid="ignore"), __import__("warnings").catch_warnings():
        __import__("warnings").simplefilter("ignore")
        return np.nanmean(blocks, axis=-1)


def expected_rgb(cells, top):
    from matplotlib import colormaps

    rgb = colormaps["viridis"](np.nan_to_num(cells) / top, bytes=True)[..., :3].astype(int)
    rgb[np.isnan(cells)] = BAD_RGB
    return rgb


@pytest.mark.parametrize("width", [80, 120])
def test_half_blocks_cell_by_cell(width):
    """A 50 x 200 map with masked keys and a padded row, at 80 and 120 columns: two map rows per text row
    (``▀``: the upper in the foreground, the lower in the background), reduced in the fewest square blocks
    that fit the width, every cell the colour of its block's mean on the scale; masked blocks grey."""
    data = softmax_dump((50, 200), seed=3)[:, :]
    keep = np.ones(data.shape, bool)
    keep[:, 150:170] = False
    keep[7] = False
    picture = single_picture(data, keep, title="t", height=40)
    lines = cells_of(render(picture, width))
    rows = [line for line in lines if any(ch == "▀" for ch, _, _ in line)]
    first = [i for i, (ch, _, _) in enumerate(rows[0]) if ch == "▀"]
    left, ncols = first[0], len(first)
    f = math.ceil(200 / ncols)
    assert ncols == math.ceil(200 / f) and left + ncols <= width
    assert math.ceil(200 / (f - 1)) > width - left if f > 1 else True  # the fewest blocks that fit
    want = expected_rgb(reference_blocks(data, keep, f), np.nanmax(reference_blocks(data, keep, f)))
    assert len(rows) == math.ceil(want.shape[0] / 2)
    for t, line in enumerate(rows):
        drawn = [c for c in line[left:left + ncols]]
        for j, (ch, fg, bg) in enumerate(drawn):
            assert ch == "▀"
            assert fg == tuple(want[2 * t, j]), (t, j)
            if 2 * t + 1 < want.shape[0]:
                assert bg == tuple(want[2 * t + 1, j]), (t, j)
            else:
                assert bg is None
    assert tuple(BAD) == BAD_RGB and any(fg == BAD_RGB for line in rows for _, fg, _ in line)


def test_colour_bar_ends_and_fallback_colours():
    """The one-line colour bar runs from the bottom of the scale (0) to its top (the largest value), each
    end the colour map's end; 256 and 16 colours are rich's downgrades of the same colours."""
    from matplotlib import colormaps
    from rich.color import Color

    data = softmax_dump((6, 6), seed=5)
    picture = single_picture(data, None, title="t", scale=ColourScale())
    text = render(picture, 80)
    bar = cells_of(text)[-2]
    plain = "".join(ch for ch, _, _ in bar)
    assert plain.startswith("0 ") and f" {float(data.max()):.3g}  weight" in plain
    swatches = [bg for ch, _, bg in bar if ch == " " and bg is not None]
    viridis = colormaps["viridis"]
    assert swatches[0] == tuple(int(v) for v in viridis(0.0, bytes=True)[:3])
    assert swatches[-1] == tuple(int(v) for v in viridis(1.0, bytes=True)[:3])
    in256 = cells_of(render(picture, 80, "256"))
    assert "38;2;" not in render(picture, 80, "256")
    truecolor = cells_of(text)
    for line, down in zip(truecolor, in256):
        for (ch, fg, _), (_, fg2, _) in zip(line, down):
            if ch == "▀" and fg is not None:
                assert fg2 == ("256", Color.from_rgb(*fg).downgrade(2).number)  # ColorSystem.EIGHT_BIT
    sixteen = render(picture, 80, "standard")
    assert "38;5;" not in sixteen and "38;2;" not in sixteen and "▀" in sixteen


def test_labels_on_the_margins_when_they_fit():
    data = softmax_dump((6, 6), seed=2)
    labels = ["the", "cat", "sat", "on", "a", "mat"]
    lines = render(single_picture(data, None, title="t", q_labels=labels, k_labels=labels, height=40), 80).split("\n")
    plain = [SGR.sub("", line) for line in lines]
    maps = [i for i, line in enumerate(plain) if "▀" in line]
    s = sum(1 for ch in plain[maps[0]] if ch == "▀") // 6  # pixels per cell
    for i, word in enumerate(labels):
        assert plain[maps[0] + math.ceil(i * s / 2)].split()[0] == word
    under = " ".join(plain[maps[-1] + 1:maps[-1] + 4])
    assert all(word in under for word in labels)  # across (each fits its cell) or downwards


# ----------------------------------------------------------------------------------------------
# The protocols, decoded back and compared with --png


def decode_sixel(text: str) -> np.ndarray:
    """A sixel image (DCS ... q, raster attributes, palette #n;2;r;g;b in percent, bands of six rows
    with $ and -, repeats !n) as RGB, white where nothing was drawn."""
    body = text[text.index("q", text.index("\x1bP")) + 1:text.rindex("\x1b\\")]
    m = re.match(r'"1;1;(\d+);(\d+)', body)
    width, height = int(m.group(1)), int(m.group(2))
    image = np.full((height, width, 3), 255, np.uint8)
    palette, colour, x, band = {}, 0, 0, 0
    for token in re.finditer(r'"[\d;]*|#(\d+)(;2;(\d+);(\d+);(\d+))?|!(\d+)(.)|\$|-|([?-~])', body[m.end():]):
        t = token.group(0)
        if t.startswith("#"):
            colour = int(token.group(1))
            if token.group(2):
                palette[colour] = [round(int(token.group(k)) * 255 / 100) for k in (3, 4, 5)]
        elif t == "$":
            x = 0
        elif t == "-":
            x, band = 0, band + 1
        elif t.startswith("!") or token.group(8):
            count, ch = (int(token.group(6)), token.group(7)) if t.startswith("!") else (1, t)
            bits = ord(ch) - 63
            for k in range(6):
                y = band * 6 + k
                if bits >> k & 1 and y < height:
                    image[y, x:x + count] = palette[colour]
            x += count
    return image


@pytest.fixture(scope="module")
def protocol_runs(files):
    png = files / "grid.png"
    invoke("inspect", files / "dump.npy", "--png", png, "--quiet")
    out = {p: invoke("inspect", files / "dump.npy", "--show", "--graphics", p, "--no-table", "--quiet").stdout
           for p in ("kitty", "iterm", "sixel")}
    return png.read_bytes(), out


def test_kitty_payload_is_the_png(protocol_runs):
    png, out = protocol_runs
    messages = re.findall(r"\x1b_G([^;]*);([^\x1b]*)\x1b\\", out["kitty"])
    assert messages[0][0].startswith("a=T,f=100,q=2,c=80,m=1") and messages[-1][0] == "m=0"
    assert all(len(payload) <= 4096 for _, payload in messages)
    assert base64.b64decode("".join(payload for _, payload in messages)) == png


def test_iterm_payload_is_the_png(protocol_runs):
    from PIL import Image

    png, out = protocol_runs
    m = re.fullmatch(r"\x1b\]1337;File=([^:]*):([A-Za-z0-9+/=]+)\x07\n", out["iterm"])
    keys = dict(part.split("=", 1) for part in m.group(1).split(";"))
    data = base64.b64decode(m.group(2))
    assert data == png and int(keys["size"]) == len(png) and keys["inline"] == "1" and keys["width"] == "80"
    assert Image.open(io.BytesIO(data)).size[0] > 0


def test_sixel_decodes_to_the_png(protocol_runs):
    """Sixel: the PNG resized to 80 cells of 10 pixels, at most 256 colours: decoded, it is the PNG
    resized, within the quantisation (mean difference under 4 of 255, and the palette's colours)."""
    from PIL import Image

    png, out = protocol_runs
    decoded = decode_sixel(out["sixel"])
    reference = Image.open(io.BytesIO(png)).convert("RGB")
    if reference.width > 800:
        reference = reference.resize((800, round(reference.height * 800 / reference.width)),
                                     Image.Resampling.LANCZOS)
    ref = np.asarray(reference).astype(int)
    assert decoded.shape == ref.shape
    assert np.abs(decoded.astype(int) - ref).mean() < 4
    palette = re.findall(r"#\d+;2;(\d+);(\d+);(\d+)", out["sixel"])
    assert 2 <= len(palette) <= 256


def test_tmux_passthrough_wraps_and_unwraps():
    sequence = graphics.kitty(b"\x89PNG fake", 40)
    wrapped = graphics.tmux_wrap(sequence)
    assert wrapped.startswith("\x1bPtmux;") and wrapped.endswith("\x1b\\")
    assert wrapped[len("\x1bPtmux;"):-2].replace("\x1b\x1b", "\x1b") == sequence


# ----------------------------------------------------------------------------------------------
# Never an escape code where it does not belong; detection


def test_no_escape_code_in_a_pipe(files):
    """auto in a pipe: plain characters only; NO_COLOR with blocks too; blocks named: colours."""
    for env, graphics_args in (({}, []), ({"NO_COLOR": "1"}, ["--graphics", "blocks"]),
                               ({"ATTNVIZ_GRAPHICS": "auto", "TERM": "xterm-kitty"}, [])):
        out = invoke("inspect", files / "dump.npy", "--show", *graphics_args, env=env).stdout
        words = " ".join(out.split())
        assert "\x1b" not in out and "layers x heads, maps [12, 12]" in words and "head statistics" in out
        assert words.index("head statistics") < words.index("layers x heads")  # after the tables
    out = invoke("inspect", files / "dump.npy", "--show", "--graphics", "blocks", "--no-table").stdout
    assert "\x1b[" in out and "▀" in out and "head statistics" not in out
    assert invoke("inspect", files / "dump.npy", "--show", "--graphics", "none", "--no-table").stdout == ""


@pytest.mark.parametrize("scale, end", [(["--vmax", "1e-30"], "@"), (["--vmin", "1e29"], " ")])
def test_plain_characters_past_the_scale_take_its_ends(files, scale, end):
    """A weight beyond --vmax (--vmin) is drawn as the ramp's last (first) character, as a colour takes the colour
    map's end; a scale's end beyond what float32 draws is a usage error (``--vmax 1e-78`` once reached the ramp with
    an index past any integer: found by test_fuzz_option_values)."""
    from attnviz.render.terminal import RAMP

    out = invoke("inspect", files / "dump.npy", "--show", "--no-table", *scale).stdout
    rows = [line for line in out.splitlines() if not any(ch.isalpha() for ch in line)]  # the maps' lines
    drawn = {ch for row in rows for ch in row if not ch.isdigit()} - {" "}
    assert RAMP[-1 if end == "@" else 0] == end and drawn == ({"@"} if end == "@" else set()), out
    assert len(rows) >= 3 * 3, out  # three layers of maps (blocks of 2 x 2 where the screen is small)
    far = {"--vmax": "1e-78", "--vmin": "1e300"}[scale[0]]
    r = invoke("inspect", files / "dump.npy", "--show", scale[0], far, code=2)
    assert r.stdout == "" and len(r.stderr.strip().splitlines()) == 1 and f"{scale[0]} {float(far):g}" in r.stderr


@pytest.mark.parametrize("command", ["inspect", "compare", "rollout", "scaled"])
def test_show_with_json_in_a_pipe_prints_the_document(files, command):
    """Issue 34: ``attnviz inspect w.npy --show --json | jq .``: stdout is not a terminal, so --show is quietly
    nothing (a picture would corrupt the document) and the document is printed, whatever --graphics says."""
    inputs = {"inspect": ["dump.npy"], "compare": ["dump.npy", "dumpb.npy"], "rollout": ["dump.npy"],
              "scaled": ["q.npy", "q.npy", "q.npy"]}[command]
    for drawn in ([], ["--graphics", "blocks"]):
        r = invoke(command, *[files / f for f in inputs], "--show", "--json", *drawn)
        assert json.loads(r.stdout)["attnviz"] and r.stdout.count("\n") == 1, r.stdout[:300]


def test_show_with_json_on_a_terminal_is_a_usage_error(files):
    """On a terminal the picture and the document would share the screen: one line, exit 2."""
    from tests.terminals import run_in_terminal

    code, text = run_in_terminal(["inspect", files / "dump.npy", "--show", "--json"])
    assert code == 2, text
    lines = [line for line in text.splitlines() if line.strip()]
    assert len(lines) == 1 and "--show" in lines[0] and "--json-file" in lines[0], text


def test_bad_uses_are_one_line(files):
    r = invoke("inspect", files / "dump.npy", "--show", env={"ATTNVIZ_GRAPHICS": "sixels"}, code=2)
    assert "ATTNVIZ_GRAPHICS" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    r = invoke("inspect", files / "dump.npy", "--show", "--graphics", "png", code=2)
    assert "--graphics" in r.stderr


@pytest.mark.parametrize("env, expected", [
    ({"KITTY_WINDOW_ID": "1", "TERM": "xterm-kitty"}, "kitty"),
    ({"TERM": "xterm-ghostty", "TERM_PROGRAM": "ghostty"}, "kitty"),
    ({"TERM_PROGRAM": "iTerm.app"}, "iterm"), ({"LC_TERMINAL": "iTerm2"}, "iterm"),
    ({"TERM_PROGRAM": "WezTerm"}, "iterm"), ({"TERM_PROGRAM": "vscode"}, "iterm"), ({"TERM": "mintty"}, "iterm"),
    ({"WT_SESSION": "abc"}, "sixel"), ({"TERM": "foot"}, "sixel"), ({"KONSOLE_VERSION": "230804"}, "sixel"),
    ({"TERM": "xterm-256color"}, "blocks"), ({"TERM_PROGRAM": "Apple_Terminal"}, "blocks"),
    ({"TERM": "xterm-kitty", "TMUX": "/tmp/tmux-0/default,1,0"}, "blocks"), ({"TERM": "screen"}, "blocks"),
    ({"TERM": "dumb"}, "plain"), ({"NO_COLOR": "1", "KITTY_WINDOW_ID": "1"}, "plain"),
])
def test_detection_from_the_environment(env, expected):
    assert graphics.choose("auto", tty=True, environ=env) == expected
    assert graphics.choose("auto", tty=False, environ=env) == "plain"  # a pipe or a file
    assert graphics.choose("sixel", tty=False, environ=env) == "sixel"  # named: drawn
    assert graphics.choose("none", tty=True, environ=env) == "none"


def test_asking_the_terminal():
    from attnviz.cli.show import sixel_in_attributes

    assert graphics.choose("auto", tty=True, environ={"TERM": "xterm"}, ask=lambda: True) == "sixel"
    assert graphics.choose("auto", tty=True, environ={"TERM": "xterm"}, ask=lambda: False) == "blocks"
    assert graphics.choose("auto", tty=True, environ={"TERM_PROGRAM": "iTerm.app"}, ask=lambda: 1 / 0) == "iterm"
    assert sixel_in_attributes("\x1b[?63;1;2;4;6;9;15;16;22;28c")
    assert not sixel_in_attributes("\x1b[?62;1;2;6;9;15;22c") and not sixel_in_attributes("")


def test_compare_and_rollout_show(files):
    out = invoke("compare", files / "dump.npy", files / "dumpb.npy", "--show", "--graphics", "blocks",
                 "--no-table", "--max-panels", "4").stdout
    assert "largest max |A - B| first" in SGR.sub("", out) and "▀" in out
    plain = SGR.sub("", out)
    assert "A - B" in plain.splitlines()[-1]
    out = invoke("rollout", files / "dump.npy", "--labels", files / "tok.txt", "--show", "--no-table").stdout
    assert "attention rollout" in out and "rollout" in out.splitlines()[-1] and "\x1b" not in out


def test_a_compute_command_shows(samples):
    out = invoke("scaled", samples / "sentence.npz", "--show", "--graphics", "blocks", "--no-table",
                 "--quiet").stdout
    assert "scaled attention weights [2, 7, 7]" in SGR.sub("", out) and "▀" in out


# ----------------------------------------------------------------------------------------------
# The viewer, headless


def test_the_viewer_walks_heads_layers_search_sort_rollout_and_resize(files):
    from attnviz.cli.commands.view import view
    from attnviz.inspection.options import InspectOptions, LabelOptions
    from attnviz.render.options import FigureOptions

    w = np.load(files / "dump.npy")
    options = InspectOptions(weights=str(files / "dump.npy"), labels=LabelOptions(labels=str(files / "tok.txt")))
    viewer = view(options, FigureOptions(), run=False)
    model = viewer.model

    async def drive():
        async with viewer.run_test(size=(80, 24)) as pilot:
            await pilot.press("l", "l", "right", "j")
            assert (model.layer, model.head) == (1, 3)
            await pilot.press("h", "k", "k")
            assert (model.layer, model.head) == (2, 2)  # layers wrap round
            await pilot.press("s")  # by entropy, largest first
            entropy = model.result.stats["entropy"][2]
            assert model.order() == sorted(range(4), key=lambda h: (-entropy[h], h))
            await pilot.press("L", "L", "J")
            assert model.cursor == (1, 2)
            status = str(viewer.query_one("#status").render())
            assert f"{w[2, 0, 2, 1, 2]:.4f}" in status and "'w1'" in status and "'w2'" in status
            await pilot.press("slash", *"w9", "enter")
            assert model.cursor == (9, 9)
            await pilot.press("escape", "r")
            assert model.rollout
            thumbs = viewer.query_one("#thumbs").render()
            assert thumbs is not None
            await pilot.resize_terminal(140, 45)
            await pilot.pause()
            big = viewer.query_one("#map").size
            assert big.width > 60 and big.height > 30
            await pilot.press("q")

    asyncio.run(drive())


# ----------------------------------------------------------------------------------------------
# A real terminal: tmux, and xterm with sixel under Xvfb


REQUIRED = os.environ.get("ATTNVIZ_REQUIRE_TERMINAL", "") not in ("", "0")


def need(*tools):
    missing = [t for t in tools if shutil.which(t) is None]
    if missing:
        if REQUIRED:
            pytest.fail(f"ATTNVIZ_REQUIRE_TERMINAL is set but {', '.join(missing)} is missing")
        pytest.skip(f"{', '.join(missing)} not installed")


def command_line(*args):
    env = f"PYTHONPATH={ROOT} ATTNVIZ_NO_SERVER=1 COLUMNS= LINES="
    return f"cd {ROOT} && env {env} {sys.executable} -m attnviz " + " ".join(str(a) for a in args)


def wait_for(check, timeout=30.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        value = check()
        if value:
            return value
        time.sleep(0.2)
    return check()


@pytest.fixture(scope="module")
def tmux(tmp_path_factory):
    need("tmux")
    sock = str(tmp_path_factory.mktemp("tmux") / "s")
    base = ["tmux", "-S", sock]
    subprocess.run([*base, "-f", "/dev/null", "new-session", "-d", "-x", "100", "-y", "45", "-s", "t",
                    "env", "TERM=tmux-256color", "COLORTERM=truecolor", "bash", "--norc", "--noprofile"], check=True)

    def run(*args):
        return subprocess.run([*base, *args], capture_output=True, text=True, check=True).stdout

    yield run
    subprocess.run([*base, "kill-server"], capture_output=True)


def test_tmux_shows_half_blocks_and_runs_the_viewer(tmux, files):
    tmux("send-keys", "-t", "t", "clear; " + command_line("inspect", files / "dump.npy", "--show", "--no-table",
                                                          "--quiet") + "; echo DO''NE", "Enter")
    screen = wait_for(lambda: (s := tmux("capture-pane", "-p", "-e", "-t", "t")) and "\nDONE" in s and s)
    plain = SGR.sub("", screen)
    assert "layers x heads, maps [12, 12]" in " ".join(plain.split()) and "▀" in plain and "\x1bPtmux" not in screen
    coloured = [c for line in cells_of(screen) for c in line if c[0] == "▀" and c[1] is not None]
    assert len(coloured) > 100  # inside tmux, auto draws half-blocks in colour
    tmux("send-keys", "-t", "t", "clear; " + command_line("view", files / "dump.npy", "--labels",
                                                          files / "tok.txt"), "Enter")
    assert wait_for(lambda: "layer 0  head 0" in tmux("capture-pane", "-p", "-t", "t"))
    tmux("send-keys", "-t", "t", "l", "j")
    assert wait_for(lambda: "layer 1  head 1" in tmux("capture-pane", "-p", "-t", "t"))
    tmux("resize-window", "-t", "t", "-x", "80", "-y", "24")
    assert wait_for(lambda: "layer 1  head 1" in tmux("capture-pane", "-p", "-t", "t"))
    tmux("send-keys", "-t", "t", "q")
    assert wait_for(lambda: "layer 1  head 1" not in tmux("capture-pane", "-p", "-t", "t"))


def test_xterm_draws_sixel(files, tmp_path):
    """xterm -ti vt340 answers the device-attributes query with sixel (4): auto draws sixel, and the
    screenshot holds the grid's colours (viridis's purple and yellow)."""
    need("xterm", "Xvfb", "import")
    display = f":{90 + os.getpid() % 100}"
    xvfb = subprocess.Popen(["Xvfb", display, "-screen", "0", "1000x800x24", "-nolisten", "tcp"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    shot = tmp_path / "xterm.png"
    try:
        env = {**os.environ, "DISPLAY": display}
        for k in ("TMUX", "TERM_PROGRAM", "KITTY_WINDOW_ID", "WT_SESSION", "LC_TERMINAL", "COLUMNS", "LINES"):
            env.pop(k, None)
        done = tmp_path / "done"
        script = (command_line("inspect", files / "dump.npy", "--show", "--no-table", "--quiet")
                  + f"; touch {done}; sleep 30")
        wait_for(lambda: subprocess.run(["xdpyinfo"], env=env, capture_output=True).returncode == 0
                 if shutil.which("xdpyinfo") else True, 10)
        xterm = subprocess.Popen(["xterm", "-ti", "vt340", "-geometry", "100x50+0+0", "-fa", "Monospace", "-fs", "8",
                                  "-e", "bash", "-c", script], env=env, stdout=subprocess.DEVNULL,
                                 stderr=subprocess.DEVNULL)
        try:
            assert wait_for(done.exists, 60), "the command did not finish in xterm"
            time.sleep(0.5)
            subprocess.run(["import", "-window", "root", str(shot)], env=env, check=True, capture_output=True)
        finally:
            xterm.kill()
            xterm.wait()
    finally:
        xvfb.kill()
        xvfb.wait()
    from PIL import Image

    pixels = np.asarray(Image.open(shot).convert("RGB")).astype(int)
    # sixel draws the PNG's own colours: viridis's bottom (68, 1, 84) and many shades between
    bottom = np.abs(pixels - np.array([68, 1, 84])).sum(-1) < 30
    assert bottom.sum() > 500, "no sixel image in the screenshot"
    keep = os.environ.get("ATTNVIZ_KEEP_SCREENSHOTS")
    if keep:
        shutil.copy(shot, Path(keep) / "xterm-sixel.png")


def _screen_text(app, size):
    """The characters on the viewer's screen, a line each."""
    from rich.console import Console
    from rich.segment import Segment

    console = Console(width=size[0], height=size[1], file=io.StringIO(), force_terminal=True, record=True,
                      legacy_windows=False, safe_box=False)
    console.print(app.screen._compositor.render_update(full=True))
    segments = [s for s in console._record_buffer if not s.control]
    return ["".join(s.text for s in line) for line in Segment.split_and_crop_lines(segments, size[0],
                                                                                  include_new_lines=False)]


async def _first_paint(pilot, app, size, seconds: float = 60.0) -> list[str]:
    """The screen's lines once the footer holds its keys. Textual's Footer composes its keys only after the screen
    first announces its bindings (a recompose after the next refresh), and ``pilot.pause()`` waits for "idle" by
    comparing this process's CPU time with the wall clock, which a loaded machine (other processes on the cores)
    satisfies before that recompose: the footer's line was then still blank. Wait for it to be drawn (its content
    is what the caller checks)."""
    deadline = time.monotonic() + seconds
    while True:
        await pilot.pause()
        screen = _screen_text(app, size)
        if screen[-1].strip() or time.monotonic() > deadline:
            return screen
        await asyncio.sleep(0.02)


@pytest.mark.parametrize("layers", [2, 12])
def test_the_viewer_fits_80_by_24_with_the_batch_entry_and_its_keys(tmp_path, layers):
    """Issue 33, item 8: at 80 x 24 the last layer's thumbnails were clipped, the footer lost "q quit", the colour
    bar went; no key or indicator for the batch entry; the statistics stayed on a head while the rollout was shown;
    ^p palette appeared while ? did nothing."""
    from attnviz.cli.commands.view import view
    from attnviz.inspection.options import InspectOptions, LabelOptions, MaskOptions
    from attnviz.render.options import FigureOptions
    from attnviz.viewer.app import KEYS

    rng = np.random.default_rng(4)
    w = rng.dirichlet(np.ones(9), size=(layers, 2, 4, 9)).astype(np.float32)
    w[:, 1, :, :, 6:] = 0  # entry 1 is padded: three keys
    w[:, 1] /= w[:, 1].sum(-1, keepdims=True)
    np.save(tmp_path / "w.npy", w)
    np.save(tmp_path / "am.npy", np.array([[1] * 9, [1] * 6 + [0] * 3]))
    rows = [[f"a{i}" for i in range(9)], [f"b{i}" for i in range(6)] + ["[PAD]"] * 3]
    (tmp_path / "rows.json").write_text(json.dumps(rows))
    options = InspectOptions(weights=str(tmp_path / "w.npy"), labels=LabelOptions(labels=str(tmp_path / "rows.json")),
                             masks=MaskOptions(mask=str(tmp_path / "am.npy")))
    viewer = view(options, FigureOptions(), run=False)
    model = viewer.model
    size = (80, 24)
    assert not viewer.ENABLE_COMMAND_PALETTE

    async def drive():
        async with viewer.run_test(size=size) as pilot:
            screen = await _first_paint(pilot, viewer, size)
            footer = screen[-1]
            assert "q quit" in footer and "? keys" in footer and "palette" not in footer, footer
            thumbs, stats, the_map = (viewer.query_one(f"#{n}") for n in ("thumbs", "stats", "map"))
            picture = model.thumbnails(thumbs.size.width, thumbs.size.height)
            assert len(picture.lines(thumbs.size.width)) <= thumbs.size.height  # nothing clipped
            assert ("layers 0-" in picture.title) == (layers == 12)  # the layers that fit, said
            shown = model.picture(the_map.size.width, the_map.size.height).lines(the_map.size.width)
            assert len(shown) <= the_map.size.height and "weight" in "".join(s.text for s in shown[-1])
            assert "entry 0 of 2" in " ".join(screen)
            await pilot.press("b")
            assert model.batch == 1 and model.q_labels == rows[1]
            await pilot.press("L", "J")
            assert "'b1'" in model.cursor_line() and "entry 1 of 2" in model.cursor_line()
            assert "entry 1 of 2" in " ".join(_screen_text(viewer, size))
            await pilot.press("r")
            assert model.stats_lines()[0].startswith("rollout, entry 1 of 2")
            assert model.thumbnails(thumbs.size.width, thumbs.size.height).marked is None
            assert "rollout" in str(stats.render())
            await pilot.press("r", "B")
            assert model.batch == 0 and str(stats.render()).startswith("layer")
            await pilot.press("question_mark")
            keys = viewer.query_one("#keys")
            assert keys.has_class("open") and all(k in str(keys.render()) for k, _ in KEYS)
            await pilot.press("escape")
            assert not keys.has_class("open")
            await pilot.press("q")

    asyncio.run(drive())


def test_the_viewer_numbers_its_axes_in_token_positions(tmp_path):
    """A map of 3,000 tokens, drawn in blocks: the axes count token positions (up to about 3,000, not the
    blocks' count), and the title and the status line name one block size, that of the cells drawn; the status
    line's value is that cell's."""
    import re

    from attnviz.cli.commands.view import view
    from attnviz.inspection.options import InspectOptions
    from attnviz.render.options import FigureOptions
    from attnviz.render.terminal import segments_text

    n = 3000
    rng = np.random.default_rng(0)
    w = rng.random((1, 1, 1, n, n), dtype=np.float32)
    w /= w.sum(-1, keepdims=True)
    np.save(tmp_path / "long.npy", w)
    model = view(InspectOptions(weights=str(tmp_path / "long.npy")), FigureOptions(), run=False).model
    model.cursor = (2999, 1234)
    picture = model.picture(80, 20)
    text = segments_text(picture.lines(80))
    lines = text.splitlines()
    block = int(re.search(r"blocks of (\d+)x\1", text).group(1))
    axis = next(line for line in reversed(lines) if re.fullmatch(r"[\d ]+", line.strip() or "x"))
    ticks = [int(t) for t in axis.split()]
    assert ticks[0] == 0 and 2000 <= ticks[-1] < n, axis
    left = [int(m.group(1)) for line in lines if (m := re.match(r"\s*(\d+) ", line))]
    assert left and max(left) >= 2000, text
    status = model.cursor_line()
    assert f"mean of a {block}x{block} block" in status, (status, block)
    g = block
    expected = w[0, 0, 0, (2999 // g) * g:(2999 // g + 1) * g, (1234 // g) * g:(1234 // g + 1) * g].mean()
    assert f"{expected:.4f}" in status, (status, expected)

"""Pictures drawn with characters in the terminal (``--show`` where no graphics protocol draws, and the
viewer): the same maps as the PNG, as coloured half-blocks.

A ``TermPicture`` holds what a command's ``--png`` draws (``attnviz.render.figures``): one map, or a
grid of panels (a layer x head grid, compare's ranked differences, the slices of a compute run), their
labels, the colour map, the block reduction (``--reduce``) and the colour scale (``ColourScale``:
``--vmin``, ``--vmax``, ``--norm``, ``--scale-per-panel``). It is a rich renderable that lays itself
out for the width it is given:

* each map is reduced in blocks of ``f x f`` positions (``attnviz.blocks.reduce_blocks``: mean or max,
  masked cells left out, a block with nothing left grey) to fit its panel, or a short map's cell is
  drawn as ``s x s`` pixels; a pixel is half a character cell, so ``▀`` with a foreground colour (the
  upper pixel) and a background colour (the lower one) draws two map rows per text row, each pixel
  about square;
* colours are the colour map's at the scale's positions, as the PNG's (masked cells the colour maps'
  "bad" grey), given to rich as 24-bit colours: rich sends them as they are, or the nearest of 256 or
  16 colours, as the terminal can show;
* token labels on the margins when each gets a text row (or a column: written downwards), positions
  otherwise; a one-line colour bar with its two ends; the title and what was reduced above.

``plain=True`` draws the same layout with a ramp of plain characters (``RAMP``, no colour: ``NO_COLOR``,
a pipe), one character per two pixels (their mean on the scale). The ``*_picture`` functions build the
picture of each command from its result, as ``attnviz.render.figures`` builds the figure.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
from rich.cells import cell_len, set_cell_size
from rich.color import Color
from rich.console import Console, ConsoleOptions, RenderResult
from rich.segment import Segment
from rich.style import Style

from attnviz import text as inert
from attnviz.blocks import reduce_blocks
from attnviz.render.scale import ColourScale, ValueRange, make_scaling, number, own_scale

if TYPE_CHECKING:
    from attnviz.inspection.compare import CompareResult
    from attnviz.inspection.inspecting import InspectResult
    from attnviz.inspection.rollout import RolloutRun
    from attnviz.pipeline import Outcome
    from attnviz.render.options import FigureOptions

UPPER, LOWER = "▀", "▄"
RAMP = " .:-=+*#%@"  # plain characters from the bottom of the scale to its top
MASKED_CHAR = "x"  # a masked cell in plain characters
BAD = (217, 217, 217)  # the colour maps' "bad" colour (#d9d9d9): masked and padded cells
CURSOR = (255, 0, 255)  # the viewer's cursor cell
MAX_SCALE = 8  # a short map's cell is drawn as at most this many pixels a side
LABEL_CELLS = 12  # a row label (token, layer) takes at most this many cells
DEFAULT_HEIGHT = 40  # text rows a picture may take when the terminal's height is unknown
VERTICAL_LABEL = 6  # key labels written downwards take at most this many rows

MapGetter = Callable[[], "tuple[np.ndarray, np.ndarray | None]"]


@dataclass
class TermPanel:
    """One map of a picture: ``get()`` returns it (perhaps memory-mapped) and its keep mask (None:
    nothing masked); ``shape`` is its shape as handed over; ``caption`` is written under it."""

    get: MapGetter
    shape: tuple[int, int]
    caption: str = ""
    #: the map in blocks of ``f x f`` of its cells (mean or max, as the picture's ``reduce``), where the panel
    #: knows better than ``reduce_blocks`` (a summary's pooled cells: their means weighed by their sizes)
    reducer: Callable[[int, str], np.ndarray] | None = None


@dataclass
class TermPicture:
    """A command's picture for the terminal (see the module): ``panels`` row-major in ``rows x cols``
    (None: an empty slot)."""

    title: str
    panels: list[TermPanel | None]
    rows: int = 1
    cols: int = 1
    row_labels: Sequence[str] = ()
    col_labels: Sequence[str] = ()
    row_name: str = ""
    col_name: str = ""
    q_labels: Sequence[str] | None = None  # the axes of a single map
    k_labels: Sequence[str] | None = None
    ylabel: str = "query"
    xlabel: str = "key"
    cmap: str | None = None
    reduce: str = "mean"
    diverging: bool = False
    scale: ColourScale = field(default_factory=ColourScale)
    colorbar_label: str = "weight"
    plain: bool = False  # RAMP characters instead of colours
    height: int | None = None  # text rows the picture may take (None: DEFAULT_HEIGHT)
    #: the maps handed over are already in blocks of this many positions a side (the viewer's), or of (queries,
    #: keys) positions (a summary's pooled cells)
    blocks: int | tuple[int, int] = 1
    marked: int | None = None  # a panel whose row and column labels are shown reversed (the viewer's choice)
    fit: bool = False  # a grid fits ``height`` too (the viewer's), its panels smaller: else it may scroll
    cursor: tuple[int, int] | None = None  # a single map's cell (of its cells as drawn) drawn in CURSOR
    placed: list[Placed | None] = field(default_factory=list, repr=False)  # as last laid out
    origin: tuple[int, int] = (0, 0)  # where the first panel's top-left pixel was drawn: (text row, cell)

    @property
    def single(self) -> bool:
        return self.rows * self.cols == 1

    @property
    def block_sides(self) -> tuple[int, int]:
        """The positions a cell handed over holds: (queries, keys)."""
        return (self.blocks, self.blocks) if isinstance(self.blocks, int) else self.blocks

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        for line in self.lines(options.max_width):
            yield from line
            yield Segment.line()

    def lines(self, width: int) -> list[list[Segment]]:
        """The picture laid out for ``width`` cells: one list of segments per line."""
        return _Drawing(self, max(width, 12)).lines()


# ----------------------------------------------------------------------------------------------
# Layout


@dataclass
class Placed:
    """A panel laid out: its cells (the map reduced in blocks of ``f x f``, NaN masked), each drawn as
    ``s x s`` pixels."""

    panel: TermPanel
    cells: np.ndarray
    f: int
    s: int
    positions: np.ndarray | None = None  # 0..1 on the colour map (NaN masked), once scaled
    top: float = 0.0  # its own maximum (--scale-per-panel)

    @property
    def pixels(self) -> tuple[int, int]:
        return self.cells.shape[0] * self.s, self.cells.shape[1] * self.s


def fit(shape: tuple[int, int], width: int, height: int) -> tuple[int, int]:
    """The block size ``f`` (square blocks: the map keeps its shape) that brings a ``shape`` map within
    ``width x height`` pixels, and the pixels ``s`` a side each cell is drawn with (1 unless the map is
    short: then as large as fits, up to ``MAX_SCALE``)."""
    rows, cols = shape
    f = max(1, math.ceil(cols / max(width, 1)), math.ceil(rows / max(height, 1)))
    if f > 1:
        return f, 1
    return 1, max(1, min(width // max(cols, 1), height // max(rows, 1), MAX_SCALE))


def colour_positions(cells: list[np.ndarray], scale: ColourScale, diverging: bool,
                     blocks: list[int] | None = None) -> tuple[list[np.ndarray], Any, list[float]]:
    """Each panel's cells as positions 0..1 of the colour map (NaN where masked): on one scale made for
    every cell shown (``make_scaling``, as the PNG's), or with ``scale.per_panel`` each on its own (and
    its maximum). Returns the positions, the shared ``Scaling`` (None per panel) and the maxima."""
    blocks = blocks or [1] * len(cells)  # the keys in a column of each panel's cells
    if scale.per_panel:
        own = [own_scale(c, scale, diverging, b) for c, b in zip(cells, blocks)]
        return [p for p, _ in own], None, [t for _, t in own]
    values = ValueRange(histogram=scale.norm == "auto")
    for c, b in zip(cells, blocks):
        values.add(c, diverging, scale.skipped_columns(b))
    scaling = make_scaling(scale, values, diverging)
    out = []
    for c in cells:
        clipped = scaling.clip(c)
        out.append(np.asarray(np.ma.filled(scaling.norm(np.ma.masked_invalid(clipped)), np.nan), dtype=np.float64))
    return out, scaling, [0.0] * len(cells)


def rgb_of(positions: np.ndarray, cmap: Any) -> np.ndarray:
    """``positions`` (0..1, NaN masked) as ``uint8`` RGB of the colour map (``BAD`` where masked)."""
    rgba = np.asarray(cmap(np.clip(np.nan_to_num(positions, nan=0.0), 0.0, 1.0), bytes=True))
    rgb = rgba[..., :3].copy()
    rgb[np.isnan(positions)] = BAD
    return rgb


def _fit_cells(text: str, width: int, right: bool = False) -> str:
    """``text`` in exactly ``width`` cells (cut with an ellipsis, padded on the right or the left)."""
    if width <= 0:
        return ""
    if cell_len(text) > width:
        return set_cell_size(text, width - 1) + "…" if width > 1 else set_cell_size(text, width)
    pad = " " * (width - cell_len(text))
    return pad + text if right else text + pad


def _narrow(text: str) -> str:
    """A label's characters that take one cell each (written downwards, a wide one would break the column)."""
    return "".join(c if cell_len(c) == 1 else "?" for c in text)


class _Drawing:
    """A ``TermPicture`` laid out for one width."""

    def __init__(self, picture: TermPicture, width: int) -> None:
        self.p = picture
        self.width = width
        self.height = picture.height or DEFAULT_HEIGHT
        from attnviz.render.scale import colour_map

        self.cmap = colour_map(picture.cmap or ("RdBu_r" if picture.diverging else "viridis"))

    # -- sizes ---------------------------------------------------------------------------------
    def margin(self) -> int:
        p = self.p
        if not p.single or p.row_labels:
            widest = max([cell_len(inert.label(t, LABEL_CELLS)) for t in p.row_labels] + [cell_len(p.row_name)])
            return min(LABEL_CELLS, widest) + 1
        lq = next(x for x in p.panels if x is not None).shape[0]
        widest = len(str(max(lq * p.block_sides[0] - 1, 0)))  # positions, not the cells handed over
        if p.q_labels is not None:
            widest = max(widest, min(LABEL_CELLS, max((cell_len(inert.label(t, LABEL_CELLS)) for t in p.q_labels),
                                                      default=0)))
        return widest + 1

    def lines(self) -> list[list[Segment]]:
        p = self.p
        margin = self.margin()
        cols = p.cols
        gap = 1 if cols > 1 else 0
        room = self.width - margin
        shown_cols = cols
        while shown_cols > 1 and (room - gap * (shown_cols - 1)) // shown_cols < 1:
            shown_cols -= 1
        pw = max(1, (room - gap * (shown_cols - 1)) // shown_cols)
        captions = any(x is not None and x.caption for x in p.panels)
        caption_fits = captions and all(x is None or cell_len(x.caption) <= pw for x in p.panels)
        overhead = 4 + (0 if p.single else 1) + (1 if p.single else 0)
        band_rows = max(1, (self.height - overhead) // p.rows - (1 if p.rows > 1 else 0)
                        - (1 if caption_fits else 0))
        ph = max(2 * band_rows, min(pw, 8) if not p.single else 2)
        out = self.laid_out(margin, pw, gap, shown_cols, ph, captions, caption_fits)
        # a single map (or a picture that must fit, the viewer's) fits the height: its colour bar is never cut
        while (p.single or p.fit) and len(out) > self.height and ph > 2:
            ph = max(2, ph - 2 * (len(out) - self.height))
            out = self.laid_out(margin, pw, gap, shown_cols, ph, captions, caption_fits)
        return out

    def laid_out(self, margin: int, pw: int, gap: int, shown_cols: int, ph: int, captions: bool,
                 caption_fits: bool) -> list[list[Segment]]:
        """The picture's lines with panels at most ``pw`` cells wide and ``ph`` pixels tall."""
        p = self.p
        cols = p.cols
        placed: list[Placed | None] = []
        for n, panel in enumerate(p.panels):
            if panel is None or n % cols >= shown_cols:
                placed.append(None)
                continue
            f, s = fit(panel.shape, pw, ph)
            if panel.reducer is not None:
                cells = panel.reducer(f, p.reduce)
            else:
                data, keep = panel.get()
                cells = reduce_blocks(data, keep, f, f, p.reduce)
            placed.append(Placed(panel, cells, f, s))
        live = [x for x in placed if x is not None]
        positions, scaling, tops = colour_positions([x.cells for x in live], p.scale, p.diverging,
                                                    [x.f * p.block_sides[1] for x in live])
        for x, pos, top in zip(live, positions, tops):
            x.positions, x.top = pos, top
        out: list[list[Segment]] = []
        out += self.title_lines(live, shown_cols)
        if not p.single:
            out.append(self.header(margin, pw, gap, shown_cols))
        p.placed, p.origin = placed, (len(out), margin)
        legend: list[str] = []
        for r in range(p.rows):
            row = placed[r * cols:r * cols + shown_cols]
            out += self.band(r, row, margin, pw, gap)
            if captions and caption_fits:
                out.append(self.caption_line(row, margin, pw, gap))
            elif captions:
                legend += [f"#{r * cols + c + 1} {x.panel.caption}" for c, x in enumerate(row) if x is not None]
            if p.rows > 1 and r < p.rows - 1 and not caption_fits:
                out.append([])
        if p.single and live:
            out += self.key_axis(live[0], margin)
        if legend:
            out += self.wrapped("; ".join(legend))
        out.append(self.colour_bar(scaling, any(bool(np.isnan(x.cells).any()) for x in live)))
        return out

    # -- text ----------------------------------------------------------------------------------
    def wrapped(self, text: str, style: Style | None = None) -> list[list[Segment]]:
        from rich.text import Text

        console = Console(width=self.width, color_system=None, legacy_windows=False)
        lines = Text(text, no_wrap=False).wrap(console, self.width)
        return [[Segment(str(line), style)] for line in lines]

    def title_lines(self, live: list[Placed], shown_cols: int) -> list[list[Segment]]:
        p = self.p
        notes = []
        bq, bk = p.block_sides
        factors = sorted({(x.f * bq, x.f * bk) for x in live})
        if factors and factors != [(1, 1)]:
            notes.append(f"blocks of {'/'.join(f'{fq}x{fk}' for fq, fk in factors)}, {p.reduce}")
        if shown_cols < p.cols:
            notes.append(f"the first {shown_cols} of {p.cols} columns: the terminal is too narrow for more")
        if p.scale.per_panel:
            notes.append("each panel on its own scale")
        note = f" ({'; '.join(notes)})" if notes else ""
        return self.wrapped(inert.title(p.title, 600) + note, None if p.plain else Style(bold=True))

    def header(self, margin: int, pw: int, gap: int, shown: int) -> list[Segment]:
        """The column labels above a grid (every one that fits), the axes' names at the ends."""
        p = self.p
        line = [" "] * self.width
        for n, ch in enumerate(_fit_cells(_narrow(inert.label(p.row_name, LABEL_CELLS)), margin - 1)):
            line[n] = ch
        labels = [_narrow(inert.label(t, LABEL_CELLS)) for t in list(p.col_labels)[:shown]]
        widest = max((len(t) for t in labels), default=0)
        step = 1
        while step < shown and widest + 1 > step * (pw + 1) - 1:
            step += 1
        end = margin
        for c in range(0, shown, step):
            x = margin + c * (pw + gap)
            text = labels[c] if c < len(labels) else ""
            if len(text) <= pw:
                x += (pw - len(text)) // 2
            if text and x >= end and x + len(text) <= self.width:
                line[x:x + len(text)] = list(text)
                end = x + len(text) + 1
        name = _narrow(inert.label(p.col_name, LABEL_CELLS))
        if name and end + len(name) + 1 <= self.width and self.width - len(name) >= end + 1:
            line[self.width - len(name):] = list(name)
        text = "".join(line).rstrip()
        if p.marked is not None and p.marked % p.cols < shown:
            c = p.marked % p.cols
            x0 = margin + c * (pw + gap)
            return [Segment(text[:x0]), Segment(text[x0:x0 + pw].ljust(pw), Style(reverse=True)),
                    Segment(text[x0 + pw:])]
        return [Segment(text)]

    # -- the maps ------------------------------------------------------------------------------
    def band(self, r: int, row: list[Placed | None], margin: int, pw: int, gap: int) -> list[list[Segment]]:
        """The text rows of one row of panels, the row's label (or a single map's query labels) on the left."""
        p = self.p
        tall = max((x.pixels[0] for x in row if x is not None), default=0)
        nrows = math.ceil(tall / 2)
        left = self.left_labels(row[0], nrows, margin) if p.single and row and row[0] is not None else \
            self.row_label(r, nrows, margin)
        out = []
        for t in range(nrows):
            line: list[Segment] = [Segment(left[t], Style(reverse=True) if self.marked_row(r) and
                                           left[t].strip() else None)]
            for c, x in enumerate(row):
                if c:
                    line.append(Segment(" " * gap))
                line += self.panel_row(x, t, pw)
            out.append(_trim(line))
        return out

    def marked_row(self, r: int) -> bool:
        return self.p.marked is not None and not self.p.single and self.p.marked // self.p.cols == r

    def row_label(self, r: int, nrows: int, margin: int) -> list[str]:
        labels = list(self.p.row_labels)
        text = inert.label(labels[r], LABEL_CELLS) if r < len(labels) else ""
        out = [" " * margin] * nrows
        if nrows:
            out[(nrows - 1) // 2] = _fit_cells(text, margin - 1, right=True) + " "
        return out

    def left_labels(self, x: Placed, nrows: int, margin: int) -> list[str]:
        """A single map's query axis: each query's label on the first text row it has to itself, when
        every query gets one (a cell of two pixels or more); else positions every fourth row."""
        out = [" " * margin] * nrows
        labels = self.p.q_labels
        if labels is not None and x.f == 1 and x.s >= 2:
            for i, text in enumerate(labels[:x.cells.shape[0]]):
                t = math.ceil(i * x.s / 2)
                if t < nrows:
                    out[t] = _fit_cells(inert.label(text, LABEL_CELLS), margin - 1, right=True) + " "
            return out
        g = x.f * self.p.block_sides[0]  # positions a cell holds: the axis counts positions, not cells
        for position in ticks(x.cells.shape[0] * g, g, x.s, 2, 3):
            t = math.ceil((position // g) * x.s / 2)
            if t < nrows:
                out[t] = _fit_cells(str(position), margin - 1, right=True) + " "
        return out

    def panel_row(self, x: Placed | None, t: int, pw: int) -> list[Segment]:
        """Text row ``t`` of a panel, ``pw`` cells wide: two pixel rows as ``▀`` in two colours."""
        if x is None or x.positions is None:
            return [Segment(" " * pw)]
        rows, cols = x.pixels
        top, bottom = 2 * t, 2 * t + 1
        segments: list[Segment] = []
        cursor = self.p.cursor if self.p.single else None
        if top < rows:
            upper = x.positions[top // x.s]
            lower = x.positions[bottom // x.s] if bottom < rows else None
            for j in range(cols):
                segment = self.cell(upper[j // x.s], None if lower is None else lower[j // x.s])
                if cursor is not None and cursor[1] == j // x.s and cursor[0] in (top // x.s, bottom // x.s):
                    segment = self.with_cursor(segment, cursor[0] == top // x.s, bottom < rows and
                                               cursor[0] == bottom // x.s)
                segments.append(segment)
        used = cols if top < rows else 0
        segments.append(Segment(" " * (pw - used)))
        return segments

    def cell(self, upper: float, lower: float | None) -> Segment:
        """One character: the upper pixel in the foreground of ``▀``, the lower in its background; with
        ``plain``, the ramp's character of their mean."""
        if self.p.plain:
            both = [v for v in (upper, lower) if v is not None and not math.isnan(v)]
            if not both:
                return Segment(MASKED_CHAR)
            # a position outside [0, 1] (a value beyond --vmin or --vmax) takes the ramp's end, as a colour does
            level = min(len(RAMP) - 1, int(min(max(sum(both) / len(both), 0.0), 1.0) * len(RAMP)))
            return Segment(RAMP[level])
        fg = self.colour(upper)
        if lower is None:
            return Segment(UPPER, Style(color=fg))
        return Segment(UPPER, Style(color=fg, bgcolor=self.colour(lower)))

    def with_cursor(self, segment: Segment, upper: bool, lower: bool) -> Segment:
        """A character with its upper or lower pixel (or both) in the cursor's colour."""
        mark = Color.from_rgb(*CURSOR)
        if self.p.plain:
            return Segment("#", Style(reverse=True))
        style = segment.style or Style()
        return Segment(segment.text, Style(color=mark if upper else style.color,
                                           bgcolor=mark if lower else style.bgcolor))

    def colour(self, position: float) -> Color:
        r, g, b = (BAD if math.isnan(position) else
                   tuple(int(v) for v in self.cmap(min(max(position, 0.0), 1.0), bytes=True)[:3]))
        return Color.from_rgb(r, g, b)

    def caption_line(self, row: list[Placed | None], margin: int, pw: int, gap: int) -> list[Segment]:
        parts = [" " * margin]
        for c, x in enumerate(row):
            if c:
                parts.append(" " * gap)
            text = x.panel.caption if x is not None else ""
            pad = max(0, pw - cell_len(text))
            parts.append(" " * (pad // 2) + text + " " * (pad - pad // 2))
        return [Segment("".join(parts).rstrip())]

    def key_axis(self, x: Placed, margin: int) -> list[list[Segment]]:
        """A single map's key axis under it: the labels across when each fits its cell, downwards when
        every key has a column, else positions."""
        labels = self.p.k_labels
        cols = x.cells.shape[1]
        if labels is not None and x.f == 1:
            texts = [_narrow(inert.label(t, LABEL_CELLS)) for t in labels[:cols]]
            if x.s >= 2 and all(len(t) <= x.s - 1 for t in texts):
                return [[Segment(" " * margin + "".join(t.ljust(x.s) for t in texts).rstrip())]]
            depth = min(VERTICAL_LABEL, max((len(t) for t in texts), default=0))
            out = []
            for k in range(depth):
                line = [" "] * (cols * x.s)
                for j, t in enumerate(texts):
                    if k < len(t):
                        line[j * x.s + (x.s - 1) // 2] = t[k] if not (k == depth - 1 and len(t) > depth) else "…"
                out.append([Segment(" " * margin + "".join(line).rstrip())])
            return out
        line = [" "] * (cols * x.s)
        g = x.f * self.p.block_sides[1]  # positions a cell holds: the axis counts positions, not cells
        for position in ticks(cols * g, g, x.s, 1, len(str(cols * g)) + 2):
            at = (position // g) * x.s
            text = str(position)
            if at + len(text) <= len(line):
                line[at:at + len(text)] = list(text)
        return [[Segment(" " * margin + "".join(line).rstrip())]]

    def colour_bar(self, scaling: Any, masked: bool) -> list[Segment]:
        """One line: the bottom of the scale, the colour map across, its top, what the values are."""
        p = self.p
        from attnviz.render.scale import scale_label

        if p.scale.per_panel:
            low, high = ("-max", "+max") if p.diverging else ("panel min" if p.scale.norm == "log" else "0",
                                                               "panel max")
        else:
            low, high = number(scaling.low), number(scaling.high)
            if scaling.extend in ("min", "both"):
                low = "≤" + low
            if scaling.extend in ("max", "both"):
                high = "≥" + high
        label = scale_label(p.colorbar_label, p.scale if scaling is None or scaling.scale is None else scaling.scale,
                            p.diverging)
        tail = f"  {inert.label(label, 40)}" + ("  x masked" if masked and p.plain else "")
        grey = "  ■ masked" if masked and not p.plain else ""
        room = self.width - len(low) - len(high) - 2
        n = max(8, min(40, room - cell_len(tail) - cell_len(grey)))
        if n > room:
            n = max(2, room)
        if self.p.plain:
            bar = [Segment("".join(RAMP[min(len(RAMP) - 1, int(i / max(n - 1, 1) * len(RAMP)))] for i in range(n)))]
        else:
            bar = [Segment(" ", Style(bgcolor=self.colour(i / max(n - 1, 1)))) for i in range(n)]
        line = [Segment(low + " "), *bar, Segment(" " + high)]
        used = len(low) + len(high) + 2 + n
        if used + cell_len(tail) <= self.width:
            line.append(Segment(tail))
            used += cell_len(tail)
        if grey and used + cell_len(grey) <= self.width:
            line += [Segment("  "), Segment("■", Style(color=Color.from_rgb(*BAD))), Segment(" masked")]
        return line


def ticks(n: int, f: int, s: int, per: int, room: int) -> list[int]:
    """Round positions of an axis of ``n`` positions drawn in cells of ``f`` positions, ``s`` pixels each,
    ``per`` pixels to a character: every ``step``-th (1, 2, 5, 10, 20, 50 ...), at least ``room``
    characters apart."""
    step = 1
    while True:
        for m in (1, 2, 5):
            k = m * step
            if k >= f and (k // f) * s / per >= room:
                return list(range(0, n, k))
        step *= 10


def _trim(line: list[Segment]) -> list[Segment]:
    """A line without its trailing unstyled blanks."""
    while line and line[-1].style is None and not line[-1].text.strip():
        line = line[:-1]
    if line and line[-1].style is None:
        line = [*line[:-1], Segment(line[-1].text.rstrip())]
    return line


# ----------------------------------------------------------------------------------------------
# Each command's picture (as attnviz.render.figures draws its figure)


def _look(fig: FigureOptions, plain: bool, height: int | None) -> dict[str, Any]:
    return {"cmap": fig.cmap, "reduce": fig.reduce, "scale": fig.scale(), "plain": plain, "height": height}


def _fixed(data: np.ndarray, keep: np.ndarray | None = None) -> TermPanel:
    return TermPanel(lambda: (data, keep), (int(data.shape[-2]), int(data.shape[-1])))


def single_picture(data: np.ndarray, keep: np.ndarray | None, *, title: str, q_labels: Sequence[str] | None = None,
                   k_labels: Sequence[str] | None = None, **look: Any) -> TermPicture:
    """One map with its labels."""
    return TermPicture(title, [_fixed(data, keep)], q_labels=q_labels, k_labels=k_labels, **look)


def grid_picture(get: Callable[[int, int], TermPanel | None], rows: int, cols: int, *, title: str,
                 row_labels: Sequence[str], col_labels: Sequence[str], row_name: str, col_name: str,
                 **look: Any) -> TermPicture:
    """``rows x cols`` panels (``get(r, c)``; None for an empty slot)."""
    panels = [get(r, c) for r in range(rows) for c in range(cols)]
    return TermPicture(title, panels, rows, cols, row_labels, col_labels, row_name, col_name, **look)


def slices_picture(maps: np.ndarray | None, *, title: str, names: Sequence[str] = (), keep: np.ndarray | None = None,
                   grids: Sequence[np.ndarray] | None = None, lead: tuple[int, ...] | None = None,
                   ids: Sequence[Sequence[Any]] | None = None, **look: Any) -> TermPicture:
    """The slices of ``maps [..., Lq, Lk]`` laid out as ``attnviz.render.mosaic.slices_mosaic`` lays them:
    the last leading axis across, the others down; one axis of more than 16 wraps into rows. Or a
    blockwise run's aggregated ``grids`` of the slices of ``lead``."""
    from attnviz.render.mosaic import slices_layout

    if maps is not None:
        lead = tuple(maps.shape[:-2])
        full_keep = None if keep is None else np.broadcast_to(keep, maps.shape)
    assert lead is not None
    count = int(np.prod(lead))
    rows, cols, row_labels, col_labels, row_name, col_name = slices_layout(lead, names, "+ offset", ids)

    def get(r: int, c: int) -> TermPanel | None:
        n = r * cols + c
        if n >= count:
            return None
        if maps is None:
            assert grids is not None
            return _fixed(np.asarray(grids[n]))
        index = tuple(int(i) for i in np.unravel_index(n, lead))
        return _fixed(maps[index], None if full_keep is None else full_keep[index])

    return grid_picture(get, rows, cols, title=title, row_labels=row_labels, col_labels=col_labels,
                        row_name=row_name, col_name=col_name, **look)


def compute_picture(outcome: Outcome, fig: FigureOptions, plain: bool = False,
                    height: int | None = None) -> TermPicture:
    """A compute run's picture (``figures.compute_figure``): the slices as a grid when there are
    ``MOSAIC_PANELS`` or more, else each slice (and each further map a variant draws) as a panel."""
    from attnviz.render.heatmap import slice_panels
    from attnviz.render.mosaic import MOSAIC_PANELS

    result, streamed, prep = outcome.result, outcome.streamed, outcome.prepared
    look = _look(fig, plain, height)
    drawn = [v for v in result.views if v.png and streamed is None]
    title = fig.title or f"{prep.variant.name} attention weights {list(prep.weights_shape)}"
    lead = tuple(prep.weights_shape[:-2])
    count = int(np.prod(lead)) if lead else 1
    axes = {"ylabel": prep.variant.axis_names[0], "xlabel": prep.variant.axis_names[1]}
    if streamed is not None:
        lead = tuple(streamed.weights_shape[:-2])
        return slices_picture(None, title=title, names=prep.lead_names, grids=streamed.grids, lead=lead or (1,),
                              **look)
    if count >= MOSAIC_PANELS and not drawn:
        return slices_picture(result.weights, title=title, names=prep.lead_names, keep=prep.mask.keep, **look)
    panels = slice_panels(result.weights, prep.mask.keep, prep.variant.weights_title if drawn else "",
                          prep.lead_names)
    for view in drawn:
        data = result.maps[view.name]
        if view.axis != "both":
            data = data[..., :, None] if view.axis == "q" else data[..., None, :]
        panels += slice_panels(data, prep.mask.keep if view.axis == "both" else None, view.title, prep.lead_names)
    if len(panels) == 1 and not drawn:
        return single_picture(panels[0].data, panels[0].keep, title=title, q_labels=prep.q_labels,
                              k_labels=prep.k_labels, **axes, **look)
    cols = math.ceil(math.sqrt(len(panels)))
    rows = math.ceil(len(panels) / cols)
    terms: list[TermPanel | None] = [_fixed(np.asarray(p.data), p.keep) for p in panels]
    for term, p in zip(terms, panels):
        assert term is not None
        term.caption = p.title
    return TermPicture(title, [*terms, *[None] * (rows * cols - len(terms))], rows, cols, [""] * rows, [""] * cols,
                       ylabel=axes["ylabel"], xlabel=axes["xlabel"], **look)


def inspect_picture(result: InspectResult, fig: FigureOptions, plain: bool = False,
                    height: int | None = None) -> TermPicture:
    """inspect's picture (``figures.inspect_grid_figure``): the layer x head grid of the batch entry
    (masked cells and padded rows grey), one panel per layer with ``--reduce-heads``, or the one map."""
    from attnviz.inspection.masks import grid_masks
    from attnviz.render.figures import inspect_name
    from attnviz.render.mosaic import grid_getter, reduced_layer

    opened = result.opened
    w, (_, bi, _), grid = opened.weights, opened.index, opened.grid
    name = inspect_name(result, fig)
    keep, real = grid_masks(opened.masks, w.shape, bi)
    get_map = grid_getter(w.data[:, bi], keep, real)
    look = {**_look(fig, plain, height), "colorbar_label": w.unit}
    shape = (int(w.shape[-2]), int(w.shape[-1]))
    if grid.reduce_heads:
        how = grid.reduce_heads

        def reduced(_: int, c: int) -> TermPanel:
            layer = grid.layers[c]
            return TermPanel(lambda: (reduced_layer(get_map, layer, grid.heads, shape, how, False), None), shape)

        return grid_picture(reduced, 1, len(grid.layers), title=f"{name}, batch {bi}: the {how} of the heads in each "
                            f"layer, maps {list(shape)}", row_labels=[how], col_labels=[str(x) for x in grid.layers],
                            row_name="heads", col_name="layer", **look)
    if len(grid.layers) * len(grid.heads) > 1:
        def one(r: int, c: int) -> TermPanel:
            layer, head = grid.layers[r], grid.heads[c]
            return TermPanel(lambda: get_map(layer, head), shape)

        return grid_picture(one, len(grid.layers), len(grid.heads), title=f"{name}, batch {bi}: layers x heads, maps "
                            f"{list(shape)}", row_labels=[str(x) for x in grid.layers],
                            col_labels=[str(h) for h in grid.heads], row_name="layer", col_name="head", **look)
    data, drawn_keep = get_map(grid.layers[0], grid.heads[0])
    where = f", layer {grid.layers[0]}, batch {bi}, head {grid.heads[0]}" if w.shape[0] * w.shape[2] > 1 else ""
    return single_picture(data, drawn_keep, title=name + where, q_labels=opened.q_labels, k_labels=opened.k_labels,
                          **look)


def compare_picture(result: CompareResult, fig: FigureOptions, max_panels: int, plain: bool = False,
                    height: int | None = None) -> TermPicture:
    """compare's picture (``figures.compare_figure``): A - B on a scale symmetric around 0, the maps with
    the largest ``max |A - B|`` first (at most ``max_panels``), each captioned; one map alone with its axes."""
    from attnviz.inspection.masks import grid_masks
    from attnviz.render.mosaic import grid_getter, rank_panels, reduced_layer

    run = result.run
    _, bi, _ = run.index
    name = fig.title or f"A - B: {run.a.source} - {run.b.source}, batch {bi}"
    diff = result.comparison.diff[:, bi]
    look = {**_look(fig, plain, height), "diverging": True, "colorbar_label": "A - B"}
    keep, real = grid_masks(run.masks, run.a.shape, bi)
    layers, heads, how = run.grid.layers, run.grid.heads, run.grid.reduce_heads
    get_map = grid_getter(diff, keep, real)
    chosen: list[tuple[int, int | None]] = [(x, None) for x in layers] if how else [(x, h) for x in layers
                                                                                    for h in heads]
    if len(chosen) == 1 and not how:
        data, one = get_map(layers[0], heads[0])
        where = f", layer {layers[0]}, head {heads[0]}" if diff.shape[0] * diff.shape[1] > 1 else ""
        return single_picture(data, one, title=name + where, **look)
    ranked = rank_panels(diff, chosen, keep=keep, real_rows=real, heads=heads, reduce_heads=how)[:max_panels or None]
    shape = (int(diff.shape[-2]), int(diff.shape[-1]))
    count = len(ranked)
    cols = count if count <= 4 else math.ceil(math.sqrt(count))
    rows = math.ceil(count / cols)

    def get(r: int, c: int) -> TermPanel | None:
        n = r * cols + c
        if n >= count:
            return None
        (layer, head), score = ranked[n]
        caption = (f"{layer}:{head}" if head is not None else f"{layer}:{how}") + f" {number(score)}"
        if head is not None:
            return TermPanel(lambda: get_map(layer, head), shape, caption)
        return TermPanel(lambda: (reduced_layer(get_map, layer, heads, shape, how or "mean", True), None), shape,
                         caption)

    shown = f"the {count} of {len(chosen)}" if count < len(chosen) else f"all {count}"
    row_labels = [f"#{r * cols + 1}" for r in range(rows)]
    return grid_picture(get, rows, cols, title=f"{name}: {shown} maps, largest max |A - B| first, maps "
                        f"{list(shape)}", row_labels=row_labels, col_labels=[""] * cols, row_name="rank",
                        col_name="", **look)


def rollout_picture(run: RolloutRun, fig: FigureOptions, plain: bool = False, height: int | None = None) -> TermPicture:
    """rollout's picture (``figures.rollout_figure``): the result of the shown batch entry, or with
    ``--all-layers`` the cumulative map after each layer of every entry."""
    from attnviz.inspection.rollout import cumulative

    name = fig.title or f"{run.title} of {run.weights.source}"
    look = {**_look(fig, plain, height), "colorbar_label": run.method.label}
    if run.options.all_layers:
        maps = np.stack([cumulative(run.results[b]) for b in run.entries])
        return slices_picture(maps, title=f"{name} ({run.how}), cumulative after each layer",
                              names=["batch", "after layer"], ids=[run.entries, run.results[run.shown].layers],
                              **look)
    return single_picture(run.results[run.shown].result, None, title=f"{name}, batch {run.shown} ({run.how})",
                          q_labels=run.tokens, k_labels=run.tokens, ylabel="token (output)", xlabel="input token",
                          **look)


def segments_text(lines: Iterator[list[Segment]] | list[list[Segment]]) -> str:
    """The characters of the lines, without colour (for tests and plain output)."""
    return "\n".join("".join(s.text for s in line) for line in lines)

"""Heatmaps of attention maps with matplotlib's object API and the Agg canvas (no pyplot state).

``heatmap_figure`` draws one panel per 2-D map (a grid when there are leading batch/head
dimensions, up to ``max_panels`` with a note beyond), with labelled axes, one shared colour bar,
masked cells in grey, and the values written in the cells when a map is small. Long maps are
aggregated in blocks (mean, or max) down to at most ``MAX_SIDE`` cells a side; the axes keep the
original positions and the panel title says so.

``mosaic_figure`` draws many maps of one shape (a model's layer x head grid, compare's differences,
the batch x head slices of a compute command) as ONE picture: each map aggregated in blocks to at
most a panel's side in pixels, placed into one array with white separators, coloured with one shared
scale (never each panel's own maximum) and drawn with a single ``imshow`` on one axes, with the rows
and columns named by tick labels and one colour bar. The picture is built a row of panels at a
time from the (perhaps memory-mapped) input, so its memory is one row's maps plus the picture, and
it is laid out pixel for pixel (one cell of the picture is one pixel of the saved PNG at ``DPI``,
no resampling), with margins measured from the text so that nothing is clipped.
``model_grid_figure`` is that mosaic for ``[layers, heads, Lq, Lk]``; ``stat_figure`` a layers x
heads heatmap of one statistic. ``save_figure`` writes PNG, SVG or PDF by the file's extension,
atomically.

Text from users' files (labels, titles with file names) is drawn as written: shortened and with
control characters made visible first (``attnviz.render.text``), never through mathtext or TeX
(``$x^2$`` shows as typed). matplotlib's own warnings (a glyph missing from the font, a layout it
could not fit) are not for users: they never reach stderr.
"""

from __future__ import annotations

import logging
import math
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from attnviz.io import shape_str, write_atomic
from attnviz.render import text as inert
from attnviz.render.table import slice_label

FORMATS = (".png", ".svg", ".pdf")
MAX_TICKS = 40  # label at most this many positions per axis; thin the rest
ANNOTATE_MAX = 16  # write values in cells when both sides are at most this
MAX_SIDE = 512  # aggregate longer maps in blocks to at most this many cells a side
DPI = 120  # pixels per inch of saved figures: a mosaic's cell is one pixel at this resolution
MOSAIC_SIDE = 1600  # a mosaic picture is at most about this many pixels a side ...
PANEL_MAX = 160  # ... each panel at most this many a side (small maps: cells of several pixels)
PANEL_MIN = 12  # ... and at least this many (the picture grows beyond MOSAIC_SIDE instead)
MOSAIC_PANELS = 5  # compute commands draw this many slices or more as one mosaic
CHUNK = 2**22  # values aggregated at a time
#: text properties of every string drawn: literal, never mathtext ($...$) or TeX
PLAIN = {"parse_math": False, "usetex": False}
TICK_WIDTH = inert.LABEL_WIDTH  # characters of a tick label
PANEL_TITLE_WIDTH = 80


@dataclass
class Panel:
    """One 2-D map to draw: ``data [Lq, Lk]`` and its keep mask (None: nothing masked)."""

    title: str
    data: np.ndarray
    keep: np.ndarray | None = None
    q_labels: Sequence[str] | None = None  # this panel's own axes, when not the figure's
    k_labels: Sequence[str] | None = None
    ylabel: str | None = None
    xlabel: str | None = None
    #: when ``data`` is already aggregated: the map's own shape and the block sizes used
    full_shape: tuple[int, int] | None = None
    blocks: tuple[int, int] | None = None


def slice_panels(maps: np.ndarray, keep: np.ndarray | None = None, name: str = "",
                 names: Sequence[str] = ()) -> list[Panel]:
    """One panel per 2-D slice of ``maps [..., Lq, Lk]``; ``keep`` broadcasts to it."""
    maps = np.asarray(maps)
    lead = maps.shape[:-2]
    full_keep = np.broadcast_to(keep, maps.shape) if keep is not None else None
    panels = []
    for s in (np.ndindex(*lead) if lead else [()]):
        title = " ".join(p for p in (name, slice_label(s, names) if lead else "") if p)
        panels.append(Panel(title, maps[s], full_keep[s] if full_keep is not None else None))
    return panels


def block_factors(rows: int, cols: int, max_side: int = MAX_SIDE) -> tuple[int, int]:
    """Block sizes that bring a ``rows x cols`` map to at most ``max_side`` cells a side."""
    return max(1, math.ceil(rows / max_side)), max(1, math.ceil(cols / max_side))


def block_reduce(data: np.ndarray, keep: np.ndarray | None, max_side: int,
                 reduce: str = "mean") -> tuple[np.ndarray, tuple[int, int]]:
    """``data`` aggregated in blocks so that neither side exceeds ``max_side``; masked cells (and
    padding) are NaN and left out of each block's mean or max; an all-masked block stays NaN."""
    fr, fc = block_factors(data.shape[0], data.shape[1], max_side)
    return reduce_blocks(data, keep, fr, fc, reduce), (fr, fc)


def reduce_blocks(data: np.ndarray, keep: np.ndarray | None, fr: int, fc: int, reduce: str = "mean") -> np.ndarray:
    """``data`` in blocks of ``fr x fc`` (the last ones may be partial), mean or max of each."""
    rows, cols = data.shape
    step = fr * max(1, CHUNK // max(1, fr * cols))  # whole blocks of rows, about CHUNK values at a time
    if rows > step:  # a long (perhaps memory-mapped) map: never one float64 copy of all of it
        from attnviz.io import release_pages

        parts = []
        for s in range(0, rows, step):
            parts.append(reduce_blocks(data[s:s + step], None if keep is None else keep[s:s + step], fr, fc, reduce))
            release_pages(data)
        return np.concatenate(parts)
    values = np.asarray(data, dtype=np.float64)
    if keep is not None:
        values = np.where(keep, values, np.nan)
    if fr == 1 and fc == 1:
        return values
    padded = np.full((math.ceil(rows / fr) * fr, math.ceil(cols / fc) * fc), np.nan)
    padded[:rows, :cols] = values
    blocks = padded.reshape(padded.shape[0] // fr, fr, padded.shape[1] // fc, fc)
    finite = ~np.isnan(blocks)
    count = finite.sum(axis=(1, 3))
    if reduce == "max":
        out = np.where(finite, blocks, -np.inf).max(axis=(1, 3))
    else:
        out = np.where(finite, blocks, 0.0).sum(axis=(1, 3)) / np.maximum(count, 1)
    return np.where(count > 0, out, np.nan)


def _ticks(ax: Any, n: int, labels: Sequence[str] | None, axis: str) -> None:
    if labels is None and n > MAX_TICKS:  # plain positions: a few round numbers, never overprinted
        from matplotlib.ticker import MaxNLocator

        (ax.xaxis if axis == "x" else ax.yaxis).set_major_locator(MaxNLocator(nbins=8, integer=True))
        return
    step = max(1, math.ceil(n / MAX_TICKS))
    positions = list(range(0, n, step))
    names = [inert.label(labels[i], TICK_WIDTH) if labels is not None else str(i) for i in positions]
    if axis == "x":
        ax.set_xticks(positions)
        ax.set_xticklabels(names, rotation=90 if labels is not None else 0, fontsize=8, **PLAIN)
    else:
        ax.set_yticks(positions)
        ax.set_yticklabels(names, fontsize=8, **PLAIN)


def _colormap(name: str) -> Any:
    from matplotlib import colormaps

    from attnviz.errors import UsageError

    if name not in colormaps:
        raise UsageError(f"--cmap {name!r}: not a matplotlib colour map (e.g. viridis, magma, Blues, RdBu_r).")
    return colormaps[name].with_extremes(bad="#d9d9d9")  # masked cells: light grey


def check_cmap(name: str | None) -> None:
    """Fail early (exit 2) on an unknown colour map; imports matplotlib's colour maps only."""
    if name is not None:
        _colormap(name)


def quiet_matplotlib() -> None:
    """Keep matplotlib's warnings off stderr: a glyph missing from the font (labels in any script),
    a layout it could not fit, font look-ups. Filters, not ``catch_warnings`` (which is not safe
    with the threads of ``attnviz batch``); idempotent, as ``filterwarnings`` replaces an equal
    filter."""
    warnings.filterwarnings("ignore", message=r"Glyph \d+ .*missing from (current )?font")
    warnings.filterwarnings("ignore", message=r"Matplotlib currently does not support")
    warnings.filterwarnings("ignore", module=r"matplotlib(\.|$)")
    warnings.filterwarnings("ignore", module=r"attnviz\.render\.heatmap$")  # matplotlib's warn_external lands here
    logging.getLogger("matplotlib").setLevel(logging.ERROR)


def _new_figure(width: float, height: float) -> Any:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    quiet_matplotlib()
    fig = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def heatmap_figure(
    maps: np.ndarray | list[Panel],
    *,
    title: str,
    q_labels: Sequence[str] | None = None,
    k_labels: Sequence[str] | None = None,
    keep: np.ndarray | None = None,
    max_panels: int = 16,
    cmap: str | None = None,
    xlabel: str = "key",
    ylabel: str = "query",
    reduce: str = "mean",
    diverging: bool = False,
    colorbar_label: str = "weight",
    max_side: int = MAX_SIDE,
) -> Any:
    """A ``matplotlib.figure.Figure`` of ``maps [..., Lq, Lk]`` (``keep`` broadcasts to it), or of a
    list of panels. All panels share one colour scale (symmetric around 0 with ``diverging``)."""
    if isinstance(maps, list):
        shape_note, panels = "", maps
    else:
        shape_note, panels = " " + shape_str(np.shape(maps)), slice_panels(np.asarray(maps), keep)
    total = len(panels)
    panels = panels[:max_panels]
    reduced = [(np.asarray(p.data, dtype=np.float64), p.blocks) if p.blocks is not None
               else block_reduce(p.data, p.keep, max_side, reduce) for p in panels]
    shown = np.concatenate([r.ravel() for r, _ in reduced])
    shown = shown[np.isfinite(shown)]
    vmax = float(shown.max()) if shown.size else 1.0
    vmin = min(0.0, float(shown.min())) if shown.size else 0.0
    if diverging:
        vmax = max(abs(vmin), abs(vmax)) or 1.0
        vmin = -vmax
    colormap = _colormap(cmap or ("RdBu_r" if diverging else "viridis"))

    lq = max(min((p.full_shape or p.data.shape)[0], max_side) for p in panels)
    lk = max(min((p.full_shape or p.data.shape)[1], max_side) for p in panels)
    ncols = math.ceil(math.sqrt(len(panels)))
    nrows = math.ceil(len(panels) / ncols)
    panel_w = min(10.0, max(3.2, 0.38 * lk + 1.6))
    panel_h = min(10.0, max(2.6, 0.38 * lq + 1.2))
    fig = _new_figure(panel_w * ncols + 1.2, panel_h * nrows + 0.9)
    image = None
    axes = []
    notes = []
    any_masked = False
    for n, (panel, (data, (fr, fc))) in enumerate(zip(panels, reduced)):
        ax = fig.add_subplot(nrows, ncols, n + 1)
        axes.append(ax)
        rows, cols = panel.full_shape or panel.data.shape
        masked = np.isnan(data)
        any_masked = any_masked or bool(masked.any())
        image = ax.imshow(np.ma.masked_array(np.nan_to_num(data), masked), cmap=colormap, vmin=vmin, vmax=vmax,
                          aspect="auto", interpolation="nearest", extent=(-0.5, cols - 0.5, rows - 0.5, -0.5))
        _ticks(ax, cols, panel.k_labels if panel.k_labels is not None else k_labels, "x")
        _ticks(ax, rows, panel.q_labels if panel.q_labels is not None else q_labels, "y")
        ax.set_xlabel(inert.label(panel.xlabel if panel.xlabel is not None else xlabel, PANEL_TITLE_WIDTH), **PLAIN)
        ax.set_ylabel(inert.label(panel.ylabel if panel.ylabel is not None else ylabel, PANEL_TITLE_WIDTH), **PLAIN)
        blocks = f"blocks of {fr}x{fc}, {reduce}" if (fr, fc) != (1, 1) else ""
        if blocks and blocks not in notes:
            notes.append(blocks)
        if panel.title:  # the block size is in the figure's title
            ax.set_title(inert.title(panel.title, PANEL_TITLE_WIDTH), fontsize=9, **PLAIN)
        if (fr, fc) == (1, 1) and rows <= ANNOTATE_MAX and cols <= ANNOTATE_MAX:
            for i in range(rows):
                for j in range(cols):
                    if masked[i, j]:
                        continue
                    value = data[i, j]
                    light = (value - vmin) / (vmax - vmin) > 0.6 if vmax > vmin else False
                    if diverging:
                        light = abs(value) < 0.6 * vmax
                    ax.text(j, i, f"{value:.2f}", ha="center", va="center", fontsize=7,
                            color="black" if light else "white", **PLAIN)
    if image is not None:
        fig.colorbar(image, ax=axes, shrink=0.9).set_label(inert.label(colorbar_label, PANEL_TITLE_WIDTH), **PLAIN)
    if total > len(panels):
        notes.append(f"showing {len(panels)} of {total} panels")
    if any_masked:
        notes.append("grey: masked")
    note = f" ({'; '.join(notes)})" if notes else ""
    fig.suptitle(f"{inert.title(title)}{shape_note}{note}", fontsize=11, **PLAIN)
    return fig


@dataclass(frozen=True)
class MosaicLayout:
    """Where the panels of a ``rows x cols`` mosaic go, in pixels of the picture: each map aggregated
    in ``blocks`` to ``cells``, each cell drawn as ``scale`` pixels, ``gap`` pixels between panels."""

    rows: int
    cols: int
    cells: tuple[int, int]
    blocks: tuple[int, int]
    scale: tuple[int, int]
    gap: int

    @property
    def panel(self) -> tuple[int, int]:
        """A panel's height and width in pixels."""
        return self.cells[0] * self.scale[0], self.cells[1] * self.scale[1]

    @property
    def size(self) -> tuple[int, int]:
        """The picture's height and width in pixels."""
        ph, pw = self.panel
        return self.rows * ph + (self.rows - 1) * self.gap, self.cols * pw + (self.cols - 1) * self.gap

    def origin(self, r: int, c: int) -> tuple[int, int]:
        """The top-left pixel (row, column) of panel ``(r, c)``."""
        ph, pw = self.panel
        return r * (ph + self.gap), c * (pw + self.gap)


def mosaic_layout(rows: int, cols: int, shape: tuple[int, int], side: int = MOSAIC_SIDE) -> MosaicLayout:
    """The layout of ``rows x cols`` maps of ``shape`` in a picture of about ``side`` pixels a side:
    panels of at most ``PANEL_MAX`` (at least ``PANEL_MIN``) pixels, long maps aggregated in blocks,
    short ones drawn with cells of several pixels."""
    def target(gap: int) -> int:
        fit = min((side - (cols - 1) * gap) // cols, (side - (rows - 1) * gap) // rows)
        return max(PANEL_MIN, min(PANEL_MAX, fit))

    gap = 2 if target(2) >= 32 else 1
    side_px = target(gap)
    fr, fc = block_factors(shape[0], shape[1], side_px)
    cells = (math.ceil(shape[0] / fr), math.ceil(shape[1] / fc))
    scale = (max(1, side_px // cells[0]), max(1, side_px // cells[1]))
    return MosaicLayout(rows, cols, cells, (fr, fc), scale, gap)


def _strided_reduce(values: np.ndarray, fr: int, fc: int, reduce: str) -> np.ndarray:
    """``values [rows, cols]`` in blocks of ``fr x fc`` (the last ones may be partial), mean or max of
    each, in float32: one strided pass per offset within a block, each over the whole map at once
    (much faster than reducing the short axes of a reshaped array, and no float64 copy)."""
    op = np.maximum if reduce == "max" else np.add
    rows, cols = values.shape
    out_r, out_c = math.ceil(rows / fr), math.ceil(cols / fc)
    acc = np.array(values[:, 0::fc], dtype=np.float32)
    for j in range(1, fc):
        part = values[:, j::fc]
        op(acc[:, :part.shape[1]], part, out=acc[:, :part.shape[1]])
    out = np.array(acc[0::fr], dtype=np.float32)
    for i in range(1, fr):
        part = acc[i::fr]
        op(out[:part.shape[0]], part, out=out[:part.shape[0]])
    if reduce != "max" and fr * fc > 1:
        count_r = np.full(out_r, fr, np.float32)
        count_r[-1] = rows - fr * (out_r - 1)
        count_c = np.full(out_c, fc, np.float32)
        count_c[-1] = cols - fc * (out_c - 1)
        out /= count_r[:, None]
        out /= count_c[None, :]
    return out


def reduce_panel(data: np.ndarray, keep: np.ndarray | None, fr: int, fc: int, reduce: str = "mean") -> np.ndarray:
    """One map ``data [Lq, Lk]`` (perhaps memory-mapped) in blocks of ``fr x fc`` as float32, NaN where
    every cell of a block is masked (``reduce_blocks`` then; nothing masked: the fast strided path)."""
    if keep is None and data.dtype.kind == "f":
        return _strided_reduce(np.asarray(data), fr, fc, reduce)
    return reduce_blocks(data, keep, fr, fc, reduce).astype(np.float32)


def lead_axis_names(n: int, names: Sequence[str] = ()) -> list[str]:
    """Names of ``n`` leading axes, as ``slice_label`` names them: the last from ``names``, the
    first ``batch`` (one left over) or ``dim i``."""
    if len(names) >= n:
        return list(names)[len(names) - n:]
    extra = n - len(names)
    return (["batch"] if extra == 1 and names else [f"dim {i}" for i in range(extra)]) + list(names)


MapGetter = Callable[[int, int], "tuple[np.ndarray, np.ndarray | None] | None"]


def mosaic_figure(
    get: MapGetter,
    rows: int,
    cols: int,
    shape: tuple[int, int],
    *,
    title: str,
    row_labels: Sequence[str],
    col_labels: Sequence[str],
    row_name: str,
    col_name: str,
    cmap: str | None = None,
    reduce: str = "mean",
    diverging: bool = False,
    colorbar_label: str = "weight",
    full_shape: tuple[int, int] | None = None,
    blocks: tuple[int, int] = (1, 1),
    after_row: Callable[[int], None] | None = None,
    side: int = MOSAIC_SIDE,
) -> Any:
    """``rows x cols`` maps of ``shape`` as one picture on one axes (see the module's docstring).

    ``get(r, c)`` returns the map of panel ``(r, c)`` and its keep mask (None: nothing masked), or
    None for an empty slot; it is called row by row, and ``after_row(r)`` after each row (to let
    go of a memory-mapped input's pages). Maps that were aggregated before (a blockwise run's) come
    with ``blocks`` and the maps' ``full_shape``. One colour scale for every panel, from the values
    shown: ``[min(0, low), high]``, or symmetric around 0 with ``diverging``."""
    layout = mosaic_layout(rows, cols, shape, side)
    height, width = layout.size
    ph, pw = layout.panel
    sq, sk = layout.scale
    picture = np.full((height, width), np.inf, np.float32)  # separators and empty slots, for now
    masked = False
    high, low = -np.inf, 0.0
    for r in range(rows):
        for c in range(cols):
            got = get(r, c)
            if got is None:
                continue
            data, keep = got
            cells = reduce_panel(data, keep, *layout.blocks, reduce)
            masked = masked or bool(np.isnan(cells).any())
            top, bottom = np.nanmax(cells, initial=-np.inf), np.nanmin(cells, initial=np.inf)
            high, low = max(high, float(top)), min(low, float(bottom))
            if sq > 1 or sk > 1:
                cells = np.repeat(np.repeat(cells, sq, axis=0), sk, axis=1)
            y, x = layout.origin(r, c)
            picture[y:y + ph, x:x + pw] = cells
        if after_row is not None:
            after_row(r)
    if not np.isfinite(high):  # nothing shown but masked cells
        high, low = 1.0, 0.0
    if diverging:
        high = max(abs(low), abs(high)) or 1.0
        low = -high
    elif high <= low:
        high = low + 1.0
    # separators and empty slots get a value above the scale (which ends at the largest value shown):
    # the colour map's "over" colour; masked cells are NaN: its "bad" grey. (Not infinity: matplotlib
    # counts that as bad, too.)
    np.copyto(picture, np.float32(high + (high - low) + 1.0), where=np.isinf(picture))
    from matplotlib.cm import ScalarMappable
    from matplotlib.colors import Normalize

    norm = Normalize(vmin=low, vmax=high)
    # white between panels; dark grey where white is a colour of the scale (diverging maps' zero)
    colormap = _colormap(cmap or ("RdBu_r" if diverging else "viridis")).with_extremes(
        over="#595959" if diverging else "white")

    total = (blocks[0] * layout.blocks[0], blocks[1] * layout.blocks[1])
    notes = [f"blocks of {total[0]}x{total[1]}, {reduce}"] if total != (1, 1) else []
    if masked:
        notes.append("grey: masked")
    note = f" ({'; '.join(notes)})" if notes else ""
    heading = f"{inert.title(title)}{note}"
    return _mosaic_canvas(picture, layout, heading, ScalarMappable(norm=norm, cmap=colormap), colorbar_label,
                          row_labels, col_labels, row_name, col_name)


TICK_FONT, AXIS_FONT, TITLE_FONT = 9, 10, 12  # points
PAD = 12  # pixels around the figure's content


def _thin(n: int, pitch: int, needed: float) -> int:
    """Label every ``step``-th of ``n`` positions ``pitch`` pixels apart, so that labels ``needed``
    pixels wide (or tall) never touch."""
    return max(1, math.ceil(needed / max(pitch, 1))) if n > 1 else 1


def _mosaic_canvas(picture: np.ndarray, layout: MosaicLayout, heading: str, mappable: Any, colorbar_label: str,
                   row_labels: Sequence[str], col_labels: Sequence[str], row_name: str, col_name: str) -> Any:
    """The figure around a mosaic picture: one axes exactly the picture's size in pixels (at ``DPI``),
    row labels on the left, column labels on top, a colour bar on the right, the heading above,
    wrapped to the figure's width; margins measured from the text, so nothing is clipped."""
    import textwrap

    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    quiet_matplotlib()
    height, width = picture.shape
    ph, pw = layout.panel
    bar_h = max(160, min(height, 900))
    bar_gap, bar_w = 16, 18
    spare = 100  # a provisional canvas: text sizes and extents (measured beyond its edges too) do not depend on it
    fig: Any = Figure(figsize=((width + 2 * spare) / DPI, (height + 2 * spare) / DPI), dpi=DPI)
    FigureCanvasAgg(fig)
    ax = fig.add_axes((0, 0, 1, 1))
    # one image, exactly its size in pixels: "nearest" at the same size copies each cell to one pixel
    ax.imshow(picture, cmap=mappable.cmap, norm=mappable.norm, interpolation="nearest", interpolation_stage="data",
              aspect="auto")
    ax.set_xlim(-0.5, width - 0.5)
    ax.set_ylim(height - 0.5, -0.5)
    ax.spines[:].set_visible(False)  # a frame would be drawn over the outermost cells
    row_text = [inert.label(t, PANEL_TITLE_WIDTH) for t in row_labels]
    col_text = [inert.label(t, PANEL_TITLE_WIDTH) for t in col_labels]
    line = TICK_FONT * DPI / 72  # pixels of a line of tick labels
    row_step = _thin(layout.rows, ph + layout.gap, 1.3 * line)
    widest = max((len(t) for t in col_text), default=1)
    col_step = _thin(layout.cols, pw + layout.gap, 0.65 * line * widest + 0.8 * line)
    rows_shown = range(0, layout.rows, row_step)
    cols_shown = range(0, layout.cols, col_step)
    ax.set_yticks([layout.origin(r, 0)[0] + (ph - 1) / 2 for r in rows_shown])
    ax.set_yticklabels([row_text[r] for r in rows_shown], fontsize=TICK_FONT, **PLAIN)
    ax.xaxis.tick_top()
    ax.xaxis.set_label_position("top")
    ax.set_xticks([layout.origin(0, c)[1] + (pw - 1) / 2 for c in cols_shown])
    ax.set_xticklabels([col_text[c] for c in cols_shown], fontsize=TICK_FONT, **PLAIN)
    ax.tick_params(length=0, pad=3)  # labels alone: a tick mark would spill into the outermost cells
    thinned = " (every %d)"
    ax.set_ylabel(inert.label(row_name, PANEL_TITLE_WIDTH) + (thinned % row_step if row_step > 1 else ""),
                  fontsize=AXIS_FONT, **PLAIN)
    ax.set_xlabel(inert.label(col_name, PANEL_TITLE_WIDTH) + (thinned % col_step if col_step > 1 else ""),
                  fontsize=AXIS_FONT, **PLAIN)
    cax = fig.add_axes((0, 0, 0.1, 0.1))
    bar = fig.colorbar(mappable, cax=cax)
    bar.set_label(inert.label(colorbar_label, PANEL_TITLE_WIDTH), fontsize=AXIS_FONT, **PLAIN)
    cax.tick_params(labelsize=TICK_FONT)

    fig_w, fig_h = width + 2 * spare, height + 2 * spare

    def place(axes: Any, x: float, y: float, w: float, h: float) -> None:  # pixels, from the bottom left
        axes.set_position((x / fig_w, y / fig_h, w / fig_w, h / fig_h))

    bar_y = (height - bar_h) / 2
    place(ax, spare, spare, width, height)
    place(cax, spare + width + bar_gap, spare + bar_y, bar_w, bar_h)
    renderer = fig.canvas.get_renderer()
    boxes = [a.get_tightbbox(renderer) for a in (ax, cax)]
    left = spare - min(b.x0 for b in boxes)
    right = max(b.x1 for b in boxes) - spare - width
    below = spare - min(b.y0 for b in boxes)
    above = max(b.y1 for b in boxes) - spare - height
    content_w = math.ceil(left + width + right)
    content_h = math.ceil(below + height + above)

    text = fig.text(0.5, 0.5, heading, fontsize=TITLE_FONT, ha="center", va="top", **PLAIN)
    one_line = text.get_window_extent(renderer).width
    fig_w = max(content_w, min(math.ceil(one_line), max(content_w, 900))) + 2 * PAD
    if one_line > fig_w - 2 * PAD:  # wrap the heading to the figure's width (a long path breaks too)
        chars = max(10, int(len(heading) * (fig_w - 2 * PAD) / one_line))
        while True:
            text.set_text(textwrap.fill(heading, chars, break_long_words=True, break_on_hyphens=False))
            if text.get_window_extent(renderer).width <= fig_w - 2 * PAD or chars <= 10:
                break
            chars = max(10, int(chars * 0.9))
    title_h = math.ceil(text.get_window_extent(renderer).height)
    fig_h = PAD + title_h + 10 + content_h + PAD
    x0 = round((fig_w - content_w) / 2 + left)  # the picture starts on a whole pixel: no resampling
    y0 = round(PAD + below)
    # a hair more than whole pixels: the canvas is int(inches * dpi) pixels, never one short
    fig_w_in, fig_h_in = (fig_w + 0.25) / DPI, (fig_h + 0.25) / DPI
    fig.set_size_inches(fig_w_in, fig_h_in)
    fig_w, fig_h = fig_w_in * DPI, fig_h_in * DPI
    place(ax, x0, y0, width, height)
    place(cax, x0 + width + bar_gap, y0 + bar_y, bar_w, bar_h)
    text.set_position((0.5, 1 - PAD / fig_h))
    return fig


def model_grid_figure(w: np.ndarray, *, title: str, cmap: str | None = None, reduce: str = "mean",
                      layer_ids: Sequence[int] | None = None, head_ids: Sequence[int] | None = None,
                      keep: np.ndarray | None = None, real_rows: np.ndarray | None = None,
                      diverging: bool = False, colorbar_label: str = "weight") -> Any:
    """The layer x head grid of ``w [layers, heads, Lq, Lk]`` (perhaps memory-mapped) as one mosaic
    (like bertviz's model view, as a file), read a layer at a time. ``keep`` broadcasts to ``w``;
    ``real_rows`` (``[layers, heads, Lq]``, broadcasting) greys padded query rows too."""
    from attnviz.io import release_pages

    layers, heads = w.shape[:2]
    layer_ids = list(layer_ids) if layer_ids is not None else list(range(layers))
    head_ids = list(head_ids) if head_ids is not None else list(range(heads))
    full_keep = None if keep is None else np.broadcast_to(keep, w.shape)
    rows_real = None if real_rows is None else np.broadcast_to(real_rows, w.shape[:-1])

    def get(li: int, hi: int) -> tuple[np.ndarray, np.ndarray | None]:
        one = None if full_keep is None else full_keep[li, hi]
        if rows_real is not None and not rows_real[li, hi].all():
            one = (np.ones(w.shape[-2:], bool) if one is None else one.copy())
            one[~rows_real[li, hi]] = False
        return w[li, hi], one

    heading = f"{inert.title(title)}: layers x heads, maps [{w.shape[-2]}, {w.shape[-1]}]"
    return mosaic_figure(get, layers, heads, (w.shape[-2], w.shape[-1]), title=heading,
                         row_labels=[str(i) for i in layer_ids], col_labels=[str(i) for i in head_ids],
                         row_name="layer", col_name="head", cmap=cmap, reduce=reduce, diverging=diverging,
                         colorbar_label=colorbar_label, after_row=lambda _: release_pages(w))


def slices_mosaic(maps: np.ndarray | None, *, title: str, names: Sequence[str] = (), keep: np.ndarray | None = None,
                  grids: Sequence[np.ndarray] | None = None, lead: tuple[int, ...] | None = None,
                  full_shape: tuple[int, int] | None = None, blocks: tuple[int, int] = (1, 1),
                  cmap: str | None = None, reduce: str = "mean", colorbar_label: str = "weight") -> Any:
    """The slices of ``maps [..., Lq, Lk]`` (``keep`` broadcasts to it) as one mosaic titled ``title``: the last
    leading axis across, the others down (``batch 0``, or ``0, 1`` for several); one leading axis of
    more than 16 wraps into rows. Or already aggregated ``grids`` of the slices of ``lead`` in
    C order (a blockwise run's), with ``full_shape`` and ``blocks``."""
    if maps is not None:
        lead = tuple(maps.shape[:-2])
        shape = (maps.shape[-2], maps.shape[-1])
        full_keep = None if keep is None else np.broadcast_to(keep, maps.shape)
    else:
        assert grids is not None and lead is not None
        shape = (grids[0].shape[0], grids[0].shape[1])
        full_keep = None
    axis = lead_axis_names(len(lead), names)
    count = int(np.prod(lead))
    if len(lead) == 1:
        cols = lead[0] if lead[0] <= 16 else math.ceil(math.sqrt(lead[0]))
        rows = math.ceil(lead[0] / cols)
        col_labels = [str(c) if rows == 1 else f"+{c}" for c in range(cols)]
        row_labels = [""] if rows == 1 else [f"{r * cols}-{min(count, (r + 1) * cols) - 1}" for r in range(rows)]
        row_name, col_name = ("", axis[0]) if rows == 1 else (f"{axis[0]}s", "+ offset in the row")
    else:
        cols, rows = lead[-1], count // lead[-1]
        col_labels = [str(c) for c in range(cols)]
        row_labels = [", ".join(str(i) for i in index) for index in np.ndindex(*lead[:-1])]
        row_name, col_name = ", ".join(axis[:-1]), axis[-1]

    def get(r: int, c: int) -> tuple[np.ndarray, np.ndarray | None] | None:
        n = r * cols + c
        if n >= count:
            return None
        if maps is None:
            assert grids is not None
            return grids[n], None
        index = tuple(int(i) for i in np.unravel_index(n, lead))
        return maps[index], None if full_keep is None else full_keep[index]

    return mosaic_figure(get, rows, cols, shape, title=title, row_labels=row_labels, col_labels=col_labels,
                         row_name=row_name, col_name=col_name, cmap=cmap, reduce=reduce,
                         colorbar_label=colorbar_label, full_shape=full_shape, blocks=blocks)


def stat_figure(values: np.ndarray, *, title: str, stat: str, cmap: str | None = None,
                layer_ids: Sequence[int] | None = None, head_ids: Sequence[int] | None = None) -> Any:
    """A layers x heads heatmap of one head statistic, values written in the cells when few."""
    layers, heads = values.shape
    fig = _new_figure(min(16.0, 1.0 + 0.6 * heads + 1.5), min(16.0, 1.0 + 0.45 * layers + 0.8))
    ax = fig.add_subplot(1, 1, 1)
    image = ax.imshow(values, cmap=_colormap(cmap or "magma"), aspect="auto", interpolation="nearest")
    _ticks(ax, heads, [str(h) for h in head_ids] if head_ids is not None else None, "x")
    _ticks(ax, layers, [str(x) for x in layer_ids] if layer_ids is not None else None, "y")
    ax.set_xlabel("head", **PLAIN)
    ax.set_ylabel("layer", **PLAIN)
    if layers * heads <= 400:
        top = float(np.nanmax(values)) if values.size else 1.0
        for i in range(layers):
            for j in range(heads):
                ax.text(j, i, f"{values[i, j]:.2f}", ha="center", va="center", fontsize=7,
                        color="black" if top and values[i, j] > 0.6 * top else "white", **PLAIN)
    fig.colorbar(image, ax=ax).set_label(inert.label(stat, PANEL_TITLE_WIDTH), **PLAIN)
    fig.suptitle(f"{inert.title(title)}: {inert.label(stat, PANEL_TITLE_WIDTH)} per head", fontsize=11, **PLAIN)
    return fig


PNG_LEVEL = 1  # zlib level of PNG files


def png_bytes(rgba: np.ndarray, dpi: float = DPI, level: int = PNG_LEVEL) -> bytes:
    """A PNG file of an RGBA ``uint8`` image (RGB when it is opaque), rows unfiltered. Heatmaps are
    runs of flat colour: unfiltered rows at zlib level 1 come out smaller than matplotlib's
    (Pillow's adaptive filters, level 6) and about ten times faster (the BERT-base grid: 1.4 MB in
    0.05 s against 1.6 MB in 0.5 s)."""
    import struct
    import zlib

    height, width = rgba.shape[:2]
    opaque = bool((rgba[..., 3] == 255).all())
    pixels = rgba[..., :3] if opaque else rgba
    raw = np.zeros((height, 1 + width * pixels.shape[2]), np.uint8)  # a leading 0 per row: no filter
    raw[:, 1:] = pixels.reshape(height, -1)

    def chunk(tag: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data))

    per_metre = round(dpi / 0.0254)
    return b"".join((b"\x89PNG\r\n\x1a\n",
                     chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2 if opaque else 6, 0, 0, 0)),
                     chunk(b"pHYs", struct.pack(">IIB", per_metre, per_metre, 1)),
                     chunk(b"IDAT", zlib.compress(raw.tobytes(), level)),
                     chunk(b"IEND", b"")))


def save_figure(fig: Any, path: Path) -> None:
    """Write a figure as PNG/SVG/PDF by extension, through a temporary file and a rename. PNG: drawn
    on the Agg canvas at ``DPI`` and encoded by ``png_bytes``."""
    fmt = path.suffix.lower().lstrip(".")
    quiet_matplotlib()
    if fmt != "png":
        write_atomic(path, lambda fh: fig.savefig(fh, format=fmt, dpi=DPI))
        return
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = fig.canvas if isinstance(fig.canvas, FigureCanvasAgg) else FigureCanvasAgg(fig)
    fig.set_dpi(DPI)
    canvas.draw()
    data = png_bytes(np.asarray(canvas.buffer_rgba()))

    def write(fh: Any) -> None:
        fh.write(data)

    write_atomic(path, write)

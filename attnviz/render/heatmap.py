"""Single heatmaps of attention maps, and saving figures: matplotlib's object API and the Agg canvas
(no pyplot state).

``heatmap_figure`` draws one panel per 2-D map (a grid when there are leading batch/head
dimensions, up to ``max_panels`` with a note beyond), with labelled axes, one shared colour bar,
masked cells in grey, and the values written in the cells when a map is small. Long maps are
aggregated in blocks (mean, or max; ``attnviz.blocks``) down to at most ``MAX_SIDE`` cells a side;
the axes keep the original positions and the panel title says so. ``stat_figure`` is a layers x
heads heatmap of one head statistic. Their colour scales come from ``attnviz.render.scale``; many
maps as one picture are ``attnviz.render.mosaic``'s.

``save_figure`` writes PNG, SVG or PDF by the file's extension, atomically (PNG through
``png_bytes``); ``DPI`` is the resolution of every saved figure.

Text from users' files (labels, titles with file names) is drawn as written: shortened and with
control characters made visible first (``attnviz.text``), never through mathtext or TeX
(``$x^2$`` shows as typed: ``PLAIN``). matplotlib's own warnings (a glyph missing from the font, a
layout it could not fit) are not for users: ``quiet_matplotlib`` keeps them off stderr.
"""

from __future__ import annotations

import functools
import logging
import math
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from attnviz import text as inert
from attnviz.blocks import MAX_SIDE, block_reduce
from attnviz.io import shape_str, write_atomic
from attnviz.render.scale import (
    ColourScale,
    Scaling,
    ValueRange,
    colour_map,
    make_scaling,
    number,
    own_scale,
    per_panel_ticks,
    plain_bar_ticks,
    scale_label,
    unit_norm,
)
from attnviz.render.table import slice_label

FORMATS = (".png", ".svg", ".pdf")
MAX_TICKS = 40  # label at most this many positions per axis; thin the rest
ANNOTATE_MAX = 16  # write values in cells when both sides are at most this
DPI = 120  # pixels per inch of saved figures: a mosaic's cell is one pixel at this resolution
FIG_MAX = 20.0  # inches: a figure of panels is at most this wide and tall; its panels shrink instead
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


def _ticks(ax: Any, n: int, labels: Sequence[str] | None, axis: str, max_ticks: int = MAX_TICKS,
           ids: bool = False) -> None:
    """Tick labels of ``n`` positions: every one when they fit (``max_ticks``), else every
    ``step``-th, each then prefixed with its position (``17:the``) unless the labels are numbers
    already (``ids``); labels longer than ``TICK_WIDTH`` end in an ellipsis."""
    if labels is None and n > max_ticks:  # plain positions: a few round numbers, never overprinted
        from matplotlib.ticker import MaxNLocator

        (ax.xaxis if axis == "x" else ax.yaxis).set_major_locator(MaxNLocator(nbins=min(8, max_ticks), integer=True))
        return
    step = max(1, math.ceil(n / max_ticks))
    positions = list(range(0, n, step))
    if labels is None:
        names = [str(i) for i in positions]
    elif step > 1 and not ids:
        names = [f"{i}:{inert.label(labels[i], TICK_WIDTH)}" for i in positions]
    else:
        names = [inert.label(labels[i], TICK_WIDTH) for i in positions]
    if axis == "x":
        ax.set_xticks(positions)
        ax.set_xticklabels(names, rotation=90 if labels is not None and not ids else 0, fontsize=8, **PLAIN)
    else:
        ax.set_yticks(positions)
        ax.set_yticklabels(names, fontsize=8, **PLAIN)


def quiet_matplotlib() -> None:
    """Keep matplotlib's warnings off stderr: a glyph missing from the font (labels in any script),
    a layout it could not fit, font look-ups. Filters, not ``catch_warnings`` (which is not safe
    with the threads of ``attnviz batch``); idempotent, as ``filterwarnings`` replaces an equal
    filter."""
    warnings.filterwarnings("ignore", message=r"Glyph \d+ .*missing from (current )?font")
    warnings.filterwarnings("ignore", message=r"Matplotlib currently does not support")
    warnings.filterwarnings("ignore", module=r"matplotlib(\.|$)")
    # matplotlib's warn_external lands in the module that called it
    warnings.filterwarnings("ignore", module=r"attnviz\.render\.(heatmap|mosaic|scale|canvas|figures)$")
    logging.getLogger("matplotlib").setLevel(logging.ERROR)


def wrap_text(text: Any, width: float, renderer: Any, fewest: int = 8) -> None:
    """Wrap a matplotlib text artist to at most ``width`` pixels (a long path breaks too), its lines never
    narrower than ``fewest`` characters."""
    import textwrap

    content = text.get_text()
    wide = text.get_window_extent(renderer).width
    if wide <= width or not content:
        return
    chars = max(fewest, int(len(content) * width / wide))
    while True:
        text.set_text(textwrap.fill(content, chars, break_long_words=True, break_on_hyphens=False))
        if text.get_window_extent(renderer).width <= width or chars <= fewest:
            return
        chars = max(fewest, int(chars * 0.9))


def new_figure(width: float, height: float) -> Any:
    """A constrained-layout figure of ``width`` x ``height`` inches (each at most ``FIG_MAX``) at ``DPI``, on an
    Agg canvas (``agg_canvas``), matplotlib's warnings quiet."""
    from matplotlib.figure import Figure

    quiet_matplotlib()
    fig = Figure(figsize=(min(width, FIG_MAX), min(height, FIG_MAX)), dpi=DPI, layout="constrained")
    agg_canvas(fig)
    return fig


def agg_canvas(fig: Any) -> Any:
    """An Agg canvas for ``fig`` whose renderers share one cache of text sizes (``_agg_canvas_class``)."""
    return _agg_canvas_class()(fig)


#: text sizes kept (``_agg_canvas_class``); the cache starts again when it is full
TEXT_SIZES_KEPT = 4096


@functools.cache
def _agg_canvas_class() -> Any:
    """matplotlib's Agg canvas, but text sizes (width, height and descent of a string in a font at a
    resolution) are measured once per process rather than once per renderer: a figure measures its
    texts on a first renderer to lay itself out, then draws them on a second one of its final size, and
    a warm worker draws the same labels (layer and head numbers, tick values) for every request.
    FreeType's answer depends only on what the key holds (the string, the font properties, the
    resolution and the hinting settings), so the sizes are the ones matplotlib measures, to the bit."""
    import matplotlib as mpl
    from matplotlib.backends.backend_agg import FigureCanvasAgg, RendererAgg, get_hinting_flag

    sizes: dict[Any, Any] = {}

    class TextSizeRenderer(RendererAgg):
        def get_text_width_height_descent(self, s: Any, prop: Any, ismath: Any) -> Any:
            if ismath:  # mathtext and TeX: as matplotlib does
                return super().get_text_width_height_descent(s, prop, ismath)
            key = (s, prop.copy(), self.dpi, get_hinting_flag(), mpl.rcParams["text.hinting_factor"])
            size = sizes.get(key)
            if size is None:
                size = super().get_text_width_height_descent(s, prop, ismath)
                if len(sizes) >= TEXT_SIZES_KEPT:
                    sizes.clear()
                sizes[key] = size
            return size

    class TextSizeCanvas(FigureCanvasAgg):
        def get_renderer(self) -> Any:
            w, h = self.get_width_height(physical=True)
            key = w, h, self.figure.dpi
            if self._lastKey != key:
                self.renderer = TextSizeRenderer(w, h, self.figure.dpi)
                self._lastKey = key  # type: ignore[assignment]
            return self.renderer

    return TextSizeCanvas


@dataclass
class _PanelLook:
    """What every panel of a ``heatmap_figure`` shares: the colour scale (``shared``, or each panel's
    own with ``scale.per_panel``), the colour map, the figure's axes labels, and a panel's size in
    inches."""

    scale: ColourScale
    shared: Scaling
    colormap: Any
    diverging: bool
    q_labels: Sequence[str] | None
    k_labels: Sequence[str] | None
    xlabel: str
    ylabel: str
    size: tuple[float, float] = (0.0, 0.0)


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
    scale: ColourScale | None = None,
) -> Any:
    """A ``matplotlib.figure.Figure`` of ``maps [..., Lq, Lk]`` (``keep`` broadcasts to it), or of a
    list of panels. All panels share one colour scale and one colour bar (symmetric around 0 with
    ``diverging``), unless ``scale.per_panel``: then each panel's title says its maximum. The figure
    is at most ``FIG_MAX`` inches a side: many panels are drawn smaller, and their titles wrap."""
    scale = scale or ColourScale()
    if isinstance(maps, list):
        shape_note, panels = "", maps
    else:
        shape_note, panels = " " + shape_str(np.shape(maps)), slice_panels(np.asarray(maps), keep)
    total = len(panels)
    panels = panels[:max_panels]
    reduced = [(np.asarray(p.data, dtype=np.float64), p.blocks) if p.blocks is not None
               else block_reduce(p.data, p.keep, max_side, reduce) for p in panels]
    values = ValueRange(histogram=scale.norm == "auto")
    for data, (_, fc) in reduced:
        values.add(data, diverging, scale.skipped_columns(fc))
    colormap = colour_map(cmap or ("RdBu_r" if diverging else "viridis"))
    look = _PanelLook(scale, make_scaling(scale, values, diverging), colormap, diverging, q_labels, k_labels,
                      xlabel, ylabel)
    fig, (nrows, ncols), look.size = _panels_figure(panels, max_side)
    renderer = fig.canvas.get_renderer()
    image = None
    axes = []
    notes = []
    for n, (panel, (data, (fr, fc))) in enumerate(zip(panels, reduced)):
        ax = fig.add_subplot(nrows, ncols, n + 1)
        axes.append(ax)
        image = _draw_panel(ax, panel, data, (fr, fc), look, renderer)
        blocks = f"blocks of {fr}x{fc}, {reduce}" if (fr, fc) != (1, 1) else ""
        if blocks and blocks not in notes:  # the block size is in the figure's title
            notes.append(blocks)
    if image is not None:
        _panels_colour_bar(fig, image, axes, look, colorbar_label)
    if total > len(panels):
        notes.append(f"showing {len(panels)} of {total} panels")
    if look.shared.note and not scale.per_panel:
        notes.append(look.shared.note)
    if any(bool(np.isnan(data).any()) for data, _ in reduced):
        notes.append("grey: masked")
    note = f" ({'; '.join(notes)})" if notes else ""
    heading = fig.suptitle(f"{inert.title(title)}{shape_note}{note}", fontsize=11, **PLAIN)
    wrap_text(heading, fig.get_figwidth() * DPI - 24, renderer)
    return fig


def _panels_figure(panels: Sequence[Panel], max_side: int) -> tuple[Any, tuple[int, int], tuple[float, float]]:
    """The figure of ``heatmap_figure``, its grid of panels (rows, columns: about as many of each) and a
    panel's size in inches (width, height): large enough for the longest map's cells (up to
    ``max_side``), shrunk so that the figure stays within ``FIG_MAX`` inches (a 16-head run drew 41)."""
    lq = max(min((p.full_shape or p.data.shape)[0], max_side) for p in panels)
    lk = max(min((p.full_shape or p.data.shape)[1], max_side) for p in panels)
    ncols = math.ceil(math.sqrt(len(panels)))
    nrows = math.ceil(len(panels) / ncols)
    panel_w = min(10.0, max(3.2, 0.38 * lk + 1.6), (FIG_MAX - 1.4) / ncols)
    panel_h = min(10.0, max(2.6, 0.38 * lq + 1.2), (FIG_MAX - 1.2) / nrows)
    fig = new_figure(panel_w * ncols + 1.4, panel_h * nrows + 1.2)
    return fig, (nrows, ncols), (panel_w, panel_h)


def _draw_panel(ax: Any, panel: Panel, data: np.ndarray, blocks: tuple[int, int], look: _PanelLook,
                renderer: Any) -> Any:
    """One panel of ``heatmap_figure`` on ``ax``: ``data`` (``panel``'s map, aggregated in ``blocks``)
    on the shared scale or its own, its ticks, axes labels and title, and the values in the cells
    when the map is small. Returns the image."""
    panel_w, panel_h = look.size
    rows, cols = panel.full_shape or panel.data.shape
    if look.scale.per_panel:
        drawn, top = own_scale(data, look.scale, look.diverging, blocks[1])
        norm: Any = unit_norm()
    else:
        drawn, top, norm = look.shared.clip(data), 0.0, look.shared.norm
    image = ax.imshow(np.ma.masked_invalid(drawn), cmap=look.colormap, norm=norm, aspect="auto",
                      interpolation="nearest", extent=(-0.5, cols - 0.5, rows - 0.5, -0.5))
    # at most one tick label per 14 pixels of the panel (8-point labels never overprint)
    _ticks(ax, cols, panel.k_labels if panel.k_labels is not None else look.k_labels, "x",
           max(2, min(MAX_TICKS, int(panel_w * DPI * 0.7) // 14)))
    _ticks(ax, rows, panel.q_labels if panel.q_labels is not None else look.q_labels, "y",
           max(2, min(MAX_TICKS, int(panel_h * DPI * 0.6) // 14)))
    ax.set_xlabel(inert.label(panel.xlabel if panel.xlabel is not None else look.xlabel, PANEL_TITLE_WIDTH), **PLAIN)
    ax.set_ylabel(inert.label(panel.ylabel if panel.ylabel is not None else look.ylabel, PANEL_TITLE_WIDTH), **PLAIN)
    own = f"max {number(top)}" if look.scale.per_panel else ""
    heading = " ".join(t for t in (inert.title(panel.title, PANEL_TITLE_WIDTH) if panel.title else "",
                                   f"({own})" if own and panel.title else own) if t)
    if heading:
        wrap_text(ax.set_title(heading, fontsize=9, **PLAIN), panel_w * DPI * 0.8, renderer)
    if blocks == (1, 1) and rows <= ANNOTATE_MAX and cols <= ANNOTATE_MAX:
        positions = np.ma.filled(norm(np.ma.masked_invalid(drawn)), np.nan)
        _write_values(ax, data, positions, (rows, cols), look.diverging)
    return image


def _write_values(ax: Any, data: np.ndarray, positions: np.ndarray, shape: tuple[int, int], diverging: bool) -> None:
    """The value of each unmasked cell of a small map written in it: black on the light colours of the
    scale (``positions`` 0..1 on it), white on the dark ones."""
    masked = np.isnan(data)
    digits = cell_digits(data)
    for i in range(shape[0]):
        for j in range(shape[1]):
            if masked[i, j]:
                continue
            position = float(positions[i, j])
            light = abs(position - 0.5) < 0.3 if diverging else position > 0.6
            ax.text(j, i, cell_text(float(data[i, j]), digits), ha="center", va="center", fontsize=7,
                    color="black" if light else "white", **PLAIN)


def cell_digits(data: np.ndarray) -> int:
    """Digits after the point for the values written in a map's cells: 2, or as many as show the largest
    |value| to two significant digits (at most 4): differences of 0.003 read 0.0030, not 0.00."""
    finite = np.abs(data[np.isfinite(data)])
    top = float(finite.max()) if finite.size else 0.0
    if top == 0.0 or top >= 0.1:
        return 2
    return int(min(4, 1 - math.floor(math.log10(top))))


def cell_text(value: float, digits: int) -> str:
    """A cell's value with ``digits`` after the point; one that rounds to 0 is written 0 (never -0.00)."""
    text = f"{value:.{digits}f}"
    return "0" if float(text) == 0.0 else text


def _panels_colour_bar(fig: Any, image: Any, axes: Sequence[Any], look: _PanelLook, label: str) -> None:
    """The one colour bar of ``heatmap_figure``'s panels, labelled with what the values are and the
    scale; with ``scale.per_panel`` its ends are each panel's own."""
    scale = look.scale
    bar = fig.colorbar(image, ax=axes, shrink=0.9, extend="neither" if scale.per_panel else look.shared.extend)
    named = scale if scale.per_panel else look.shared.scale or scale  # --norm auto: the scale chosen
    bar.set_label(inert.label(scale_label(label, named, look.diverging), PANEL_TITLE_WIDTH), **PLAIN)
    if scale.per_panel:
        per_panel_ticks(bar, scale, look.diverging)
    else:
        plain_bar_ticks(bar)


def stat_figure(values: np.ndarray, *, title: str, stat: str, cmap: str | None = None,
                layer_ids: Sequence[int] | None = None, head_ids: Sequence[int] | None = None,
                unit: str = "head") -> Any:
    """A layers x heads heatmap of one head statistic (one panel, its own colour bar from the lowest
    to the highest value), values written in the cells when few; ``layer_ids``/``head_ids`` are the
    real numbers of the rows and columns given."""
    from matplotlib.colors import Normalize

    layers, heads = values.shape
    fig = new_figure(min(16.0, 1.0 + 0.6 * heads + 1.5), min(16.0, 1.0 + 0.45 * layers + 1.2))
    ax = fig.add_subplot(1, 1, 1)
    shown = values[np.isfinite(values)]
    low, high = (float(shown.min()), float(shown.max())) if shown.size else (0.0, 1.0)
    # from 0, as the maps are drawn (a statistic that varies by 0.004 around 1.56 is not stretched from black to
    # white); the range is said in the heading, and the cells carry the digits that tell the values apart
    bottom = min(0.0, low)
    norm = Normalize(bottom, high if high > bottom else bottom + 1.0)
    spread = high - low
    digits = 2 if spread == 0 or spread >= 0.1 else int(min(5, 1 - math.floor(math.log10(spread))))
    image = ax.imshow(values, cmap=colour_map(cmap or "magma"), norm=norm, aspect="auto", interpolation="nearest")
    width_px, height_px = fig.get_figwidth() * DPI * 0.7, fig.get_figheight() * DPI * 0.6
    _ticks(ax, heads, [str(h) for h in head_ids] if head_ids is not None else None, "x",
           max(2, min(MAX_TICKS, int(width_px) // 24)), ids=True)
    _ticks(ax, layers, [str(x) for x in layer_ids] if layer_ids is not None else None, "y",
           max(2, min(MAX_TICKS, int(height_px) // 14)), ids=True)
    ax.set_xlabel(unit, **PLAIN)
    ax.set_ylabel("layer", **PLAIN)
    if layers * heads <= 400:
        for i in range(layers):
            for j in range(heads):
                value = float(values[i, j])
                ax.text(j, i, "\u2013" if value != value else f"{value:.{digits}f}", ha="center", va="center",
                        fontsize=7, color="black" if value == value and float(norm(value)) > 0.6 else "white",
                        **PLAIN)
    bar = fig.colorbar(image, ax=ax)
    bar.set_label(inert.label(stat, PANEL_TITLE_WIDTH), **PLAIN)
    plain_bar_ticks(bar)
    floor = "0" if bottom == 0 else f"{bottom:.{digits}f}"
    ranged = f" (from {low:.{digits}f} to {high:.{digits}f}; colours from {floor})" if shown.size else ""
    heading = fig.suptitle(f"{inert.title(title)}: {inert.label(stat, PANEL_TITLE_WIDTH)} per {unit}{ranged}",
                           fontsize=11, **PLAIN)
    wrap_text(heading, fig.get_figwidth() * DPI - 24, fig.canvas.get_renderer())
    return fig


PNG_LEVEL = 1  # zlib level of PNG files


def png_bytes(rgba: np.ndarray, dpi: float = DPI, level: int = PNG_LEVEL) -> bytes:
    """A PNG file of an RGBA ``uint8`` image (RGB when it is opaque), rows unfiltered. Heatmaps are
    runs of flat colour: unfiltered rows at zlib level 1 come out smaller than matplotlib's
    (Pillow's adaptive filters, level 6) and many times faster (the BERT-base grid: 1.4 MB in 0.02 s
    against 1.6 MB in 0.5 s; ``deflate``)."""
    import struct
    import zlib

    height, width = rgba.shape[:2]
    opaque = _opaque(rgba)
    channels = 3 if opaque else 4
    raw = np.empty((height, 1 + width * channels), np.uint8)
    raw[:, 0] = 0  # a leading 0 per row: no filter
    for c in range(channels):  # a channel at a time: NumPy copies 3-byte pixels one by one, and slowly
        raw[:, 1 + c::channels] = rgba[..., c]

    def chunk(tag: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data))

    per_metre = round(dpi / 0.0254)
    return b"".join((b"\x89PNG\r\n\x1a\n",
                     chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2 if opaque else 6, 0, 0, 0)),
                     chunk(b"pHYs", struct.pack(">IIB", per_metre, per_metre, 1)),
                     chunk(b"IDAT", deflate(raw, level)),
                     chunk(b"IEND", b"")))


def _opaque(rgba: np.ndarray) -> bool:
    """Whether every pixel's alpha is 255: read as one 32-bit word per pixel where the bytes allow it (the
    alpha bytes alone are a strided read, several times slower)."""
    import sys

    if sys.byteorder == "little" and rgba.flags.c_contiguous and rgba.shape[-1] == 4:
        return bool((rgba.view(np.uint32) >= np.uint32(0xFF000000)).all())
    return bool((rgba[..., 3] == 255).all())


PIECE = 2**21  # bytes of a picture compressed on their own (by a thread each), where ISA-L is missing


def deflate(raw: np.ndarray, level: int = PNG_LEVEL) -> bytes:
    """The zlib stream of ``raw``'s bytes. By ISA-L (the ``isal`` package, a dependency: the BERT-base
    grid's 9 MB in 13 ms, against zlib's 55 ms at its fastest level, and a little smaller); where it
    cannot be imported, by zlib in pieces at once on the cores this process may use (zlib lets go of the
    GIL), the way pigz does: each piece a raw deflate stream ended on a byte boundary (a full flush), the
    last one finished, all behind one zlib header and the Adler-32 of the whole."""
    import zlib

    data = np.ascontiguousarray(raw).data.cast("B")
    try:
        from isal import isal_zlib
    except ImportError:
        pass
    else:
        return bytes(isal_zlib.compress(data, min(level, isal_zlib.ISAL_BEST_COMPRESSION)))
    from attnviz.threads import THREADS, in_threads

    if THREADS == 1 or len(data) < 2 * PIECE:
        return zlib.compress(data, level)
    pieces = [data[start:start + PIECE] for start in range(0, len(data), PIECE)]

    def one(n: int) -> bytes:
        squeeze = zlib.compressobj(level, zlib.DEFLATED, -15)
        return squeeze.compress(pieces[n]) + squeeze.flush(zlib.Z_FINISH if n == len(pieces) - 1 else zlib.Z_FULL_FLUSH)

    header = bytes((0x78, 0x01))  # deflate, a 32 KiB window, the fastest level (zlib's header for level 1)
    body = b"".join(in_threads(one, range(len(pieces))))
    return header + body + zlib.adler32(data).to_bytes(4, "big")


def save_figure(fig: Any, path: Path) -> None:
    """Write a figure as PNG/SVG/PDF by extension, through a temporary file and a rename. PNG: drawn
    on the Agg canvas at ``DPI`` and encoded by ``png_bytes``."""
    figure_file(fig, path.suffix)(path)


def figure_file(fig: Any, suffix: str) -> Callable[[Path], None]:
    """``save_figure`` in two steps: what can be made now, and a function that writes it to a path (ending
    in ``suffix``) later. A PNG is drawn and encoded now (its bytes are in hand); SVG and PDF are drawn
    as they are written."""
    fmt = suffix.lower().lstrip(".")
    quiet_matplotlib()
    if fmt != "png":
        return lambda path: write_atomic(path, lambda fh: fig.savefig(fh, format=fmt, dpi=DPI))
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = fig.canvas if isinstance(fig.canvas, FigureCanvasAgg) else FigureCanvasAgg(fig)
    fig.set_dpi(DPI)
    canvas.draw()
    data = png_bytes(np.asarray(canvas.buffer_rgba()))

    def write(fh: Any) -> None:
        fh.write(data)

    return lambda path: write_atomic(path, write)

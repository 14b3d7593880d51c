"""Heatmaps of attention maps with matplotlib's object API and the Agg canvas (no pyplot state).

``heatmap_figure`` draws one panel per 2-D map (a grid when there are leading batch/head
dimensions, up to ``max_panels`` with a note beyond), with labelled axes, one shared colour bar,
masked cells in grey, and the values written in the cells when a map is small. Long maps are
aggregated in blocks (mean, or max) down to at most ``MAX_SIDE`` cells a side; the axes keep the
original positions and the panel title says so. ``model_grid_figure`` draws a layer x head grid of
thumbnails, ``stat_figure`` a layers x heads heatmap of one statistic. ``save_figure`` writes PNG,
SVG or PDF by the file's extension, atomically.

Text from users' files (labels, titles with file names) is drawn as written: shortened and with
control characters made visible first (``attnviz.render.text``), never through mathtext or TeX
(``$x^2$`` shows as typed). matplotlib's own warnings (a glyph missing from the font, a layout it
could not fit) are not for users: they never reach stderr.
"""

from __future__ import annotations

import logging
import math
import warnings
from collections.abc import Sequence
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
THUMB_SIDE = 96  # ... and thumbnails in the model grid to this
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


def model_grid_figure(w: np.ndarray, *, title: str, cmap: str | None = None, reduce: str = "mean",
                      layer_ids: Sequence[int] | None = None, head_ids: Sequence[int] | None = None) -> Any:
    """A layer x head grid of thumbnails of ``w [layers, heads, Lq, Lk]`` (like bertviz's model view,
    as a file). Each thumbnail has its own colour scale from 0 to its maximum."""
    layers, heads = w.shape[:2]
    layer_ids = list(layer_ids) if layer_ids is not None else list(range(layers))
    head_ids = list(head_ids) if head_ids is not None else list(range(heads))
    side = min(1.6, max(0.9, 14.0 / max(heads, 1)))
    fig = _new_figure(side * heads + 0.8, side * layers + 0.9)
    colormap = _colormap(cmap or "viridis")
    blocks = (1, 1)
    for li in range(layers):
        for hi in range(heads):
            ax = fig.add_subplot(layers, heads, li * heads + hi + 1)
            data, blocks = block_reduce(w[li, hi], None, THUMB_SIDE, reduce)
            top = np.nanmax(data) if np.isfinite(data).any() else 1.0
            ax.imshow(np.ma.masked_invalid(data), cmap=colormap, vmin=0, vmax=top or 1.0, aspect="auto",
                      interpolation="nearest")
            ax.set_xticks([])
            ax.set_yticks([])
            if li == 0:
                ax.set_title(f"head {head_ids[hi]}", fontsize=8, **PLAIN)
            if hi == 0:
                ax.set_ylabel(f"layer {layer_ids[li]}", fontsize=8, **PLAIN)
    note = f" (blocks of {blocks[0]}x{blocks[1]}, {reduce})" if blocks != (1, 1) else ""
    fig.suptitle(f"{inert.title(title)}: layers x heads, maps [{w.shape[-2]}, {w.shape[-1]}]{note}", fontsize=11,
                 **PLAIN)
    return fig


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


def save_figure(fig: Any, path: Path) -> None:
    """Write a figure as PNG/SVG/PDF by extension, through a temporary file and a rename."""
    fmt = path.suffix.lower().lstrip(".")
    quiet_matplotlib()
    write_atomic(path, lambda fh: fig.savefig(fh, format=fmt, dpi=120))

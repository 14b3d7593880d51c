"""Heatmaps of attention maps with matplotlib's object API and the Agg canvas (no pyplot state).

``heatmap_figure`` draws one panel per 2-D slice of ``maps [..., Lq, Lk]`` (a grid when there are
leading batch/head dimensions, up to ``max_panels`` with a note beyond), with labelled axes, one
shared colour bar, masked cells in grey, and the values written in the cells when a map is small.
``save_figure`` writes PNG, SVG or PDF by the file's extension, atomically.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from attnviz.io import shape_str, write_atomic
from attnviz.render.table import slice_label

FORMATS = (".png", ".svg", ".pdf")
MAX_TICKS = 40  # label at most this many positions per axis; thin the rest
ANNOTATE_MAX = 16  # write values in cells when both sides are at most this


def _ticks(ax: Any, n: int, labels: Sequence[str] | None, axis: str) -> None:
    step = max(1, math.ceil(n / MAX_TICKS))
    positions = list(range(0, n, step))
    names = [labels[i] if labels is not None else str(i) for i in positions]
    if axis == "x":
        ax.set_xticks(positions)
        ax.set_xticklabels(names, rotation=90 if labels is not None else 0, fontsize=8)
    else:
        ax.set_yticks(positions)
        ax.set_yticklabels(names, fontsize=8)


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


def slice_panels(maps: np.ndarray, keep: np.ndarray | None = None, name: str = "",
                 names: Sequence[str] = ()) -> list[Panel]:
    """One panel per 2-D slice of ``maps [..., Lq, Lk]``; ``keep`` broadcasts to it."""
    maps = np.asarray(maps, dtype=np.float64)
    lead = maps.shape[:-2]
    full_keep = np.broadcast_to(keep, maps.shape) if keep is not None else None
    panels = []
    for s in (np.ndindex(*lead) if lead else [()]):
        title = " ".join(p for p in (name, slice_label(s, names) if lead else "") if p)
        panels.append(Panel(title, maps[s], full_keep[s] if full_keep is not None else None))
    return panels


def heatmap_figure(
    maps: np.ndarray | list[Panel],
    *,
    title: str,
    q_labels: Sequence[str] | None = None,
    k_labels: Sequence[str] | None = None,
    keep: np.ndarray | None = None,
    max_panels: int = 16,
    cmap: str = "viridis",
    xlabel: str = "key",
    ylabel: str = "query",
) -> Any:
    """A ``matplotlib.figure.Figure`` of ``maps [..., Lq, Lk]`` (``keep`` broadcasts to it), or of a
    list of panels. All panels share one colour scale."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    if isinstance(maps, np.ndarray) or not isinstance(maps, list):
        shape_note = " " + shape_str(np.shape(maps))
        panels = slice_panels(np.asarray(maps), keep)
    else:
        shape_note = ""
        panels = maps
    total = len(panels)
    panels = panels[:max_panels]
    shown = np.concatenate([p.data.ravel() for p in panels])
    vmax = float(shown.max()) if shown.size else 1.0
    vmin = min(0.0, float(shown.min()))

    lq = max(p.data.shape[0] for p in panels)
    lk = max(p.data.shape[1] for p in panels)
    ncols = math.ceil(math.sqrt(len(panels)))
    nrows = math.ceil(len(panels) / ncols)
    panel_w = min(10.0, max(3.2, 0.38 * lk + 1.6))
    panel_h = min(10.0, max(2.6, 0.38 * lq + 1.2))
    fig = Figure(figsize=(panel_w * ncols + 1.2, panel_h * nrows + 0.9), layout="constrained")
    FigureCanvasAgg(fig)
    colormap = _colormap(cmap)
    image = None
    axes = []
    any_masked = False
    for n, panel in enumerate(panels):
        ax = fig.add_subplot(nrows, ncols, n + 1)
        axes.append(ax)
        data = panel.data
        rows, cols = data.shape
        masked = ~panel.keep if panel.keep is not None else np.zeros(data.shape, bool)
        any_masked = any_masked or bool(masked.any())
        image = ax.imshow(np.ma.masked_array(data, masked), cmap=colormap, vmin=vmin, vmax=vmax,
                          aspect="auto", interpolation="nearest")
        _ticks(ax, cols, panel.k_labels if panel.k_labels is not None else k_labels, "x")
        _ticks(ax, rows, panel.q_labels if panel.q_labels is not None else q_labels, "y")
        ax.set_xlabel(panel.xlabel if panel.xlabel is not None else xlabel)
        ax.set_ylabel(panel.ylabel if panel.ylabel is not None else ylabel)
        if panel.title:
            ax.set_title(panel.title, fontsize=9)
        if rows <= ANNOTATE_MAX and cols <= ANNOTATE_MAX:
            for i in range(rows):
                for j in range(cols):
                    if masked[i, j]:
                        continue
                    value = data[i, j]
                    bright = (value - vmin) / (vmax - vmin) > 0.6 if vmax > vmin else False
                    ax.text(j, i, f"{value:.2f}", ha="center", va="center", fontsize=7,
                            color="black" if bright else "white")
    if image is not None:
        fig.colorbar(image, ax=axes, shrink=0.9, label="weight")
    notes = []
    if total > len(panels):
        notes.append(f"showing {len(panels)} of {total} panels")
    if any_masked:
        notes.append("grey: masked")
    note = f" ({'; '.join(notes)})" if notes else ""
    fig.suptitle(f"{title}{shape_note}{note}", fontsize=11)
    return fig


def _colormap(name: str) -> Any:
    from matplotlib import colormaps

    return colormaps[name].with_extremes(bad="#d9d9d9")  # masked cells: light grey


def save_figure(fig: Any, path: Path) -> None:
    """Write a figure as PNG/SVG/PDF by extension, through a temporary file and a rename."""
    fmt = path.suffix.lower().lstrip(".")
    write_atomic(path, lambda fh: fig.savefig(fh, format=fmt, dpi=120))

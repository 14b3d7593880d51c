"""Rich tables of attention weights and per-query statistics. Builds renderables; never prints.

Long maps are elided: the first and last rows (and columns) are shown around a ``⋮`` row (``…``
column), and the caption says what was left out and how to see more.

Labels and titles come from users' files: they reach rich as ``Text`` (never parsed for markup or
emoji codes), shortened and with control characters made visible (``attnviz.render.text``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from rich.style import Style
from rich.table import Table
from rich.text import Text

from attnviz.io import array_max
from attnviz.render import text as inert
from attnviz.stats import RowStats

# viridis, sampled at 9 points: dark blue (low) to yellow (high); readable on dark and light terminals
_RAMP = ["#440154", "#472d7b", "#3b528b", "#2c728e", "#21918c", "#28ae80", "#5ec962", "#addc30", "#fde725"]
MASKED = "·"
PAD = "pad"  # marks a query row at a padded position (left out of statistics and checks)


def shade(value: float, vmax: float) -> Style:
    """Background colour for a weight, from the ramp; black text on the light end."""
    frac = 0.0 if vmax <= 0 else float(np.clip(value / vmax, 0.0, 1.0))
    i = int(round(frac * (len(_RAMP) - 1)))
    return Style(color="black" if i >= 5 else "white", bgcolor=_RAMP[i])


def pick(n: int, limit: int | None) -> list[int | None]:
    """Indices to show of ``n``: all, or the head and tail around a ``None`` gap."""
    if limit is None or n <= limit:
        return list(range(n))
    limit = max(limit, 2)
    head = (limit + 1) // 2
    tail = limit - head
    return [*range(head), None, *range(n - tail, n)]


def _elided(indices: list[int | None], n: int, what: str) -> str | None:
    if None not in indices:
        return None
    gap = indices.index(None)
    first_hidden = indices[gap - 1] + 1  # type: ignore[operator]
    last_hidden = indices[gap + 1] - 1  # type: ignore[operator]
    return f"{what} {first_hidden}-{last_hidden} of {n}"


def slice_label(index: Sequence[int], names: Sequence[str] = ()) -> str:
    """``slice [0, 2]``, or with names for the last leading axes ``batch 0, head 2``."""
    if not names:
        return f"slice {list(index)}"
    named = list(names)[-len(index):] if len(names) >= len(index) else (
        ["batch" if len(index) - len(names) == 1 else f"dim {i}" for i in range(len(index) - len(names))]
        + list(names))
    return ", ".join(f"{n} {int(i)}" for n, i in zip(named, index))


def axis_name(i: int, labels: Sequence[str] | None, width: int = 12) -> str:
    """``3 cat``: a position and its label, shortened to ``width`` and made visible."""
    if labels is None:
        return str(i)
    return f"{i} {inert.label(labels[i], width)}"


def _caption(value: str | None) -> Text | None:
    """Plain text for rich: a ``Text`` is never read as markup or emoji codes."""
    return None if value is None else Text(value, style="table.caption")


def _title(value: str | None) -> Text | None:
    return None if value is None else Text(inert.title(value), style="table.title")


def _header(labels: Sequence[str] | None, j: int | None) -> Text:
    if j is None:
        return Text("…")
    return Text(inert.label(labels[j]) if labels is not None else str(j))


def weights_table(
    weights: np.ndarray,
    *,
    q_labels: Sequence[str] | None = None,
    k_labels: Sequence[str] | None = None,
    keep: np.ndarray | None = None,
    precision: int = 3,
    max_rows: int | None = None,
    max_cols: int | None = None,
    title: str | None = None,
    axis_names: tuple[str, str] = ("query", "key"),
    row_ids: Sequence[int] | None = None,
    total_rows: int | None = None,
    padded: np.ndarray | None = None,
) -> Table:
    """A table of one 2-D map ``[Lq, Lk]``, each cell shaded by its value. Masked cells show ``·``.

    ``row_ids``: ``weights`` holds only these rows of a map of ``total_rows`` (a long map computed in
    blocks keeps its first and last rows); the gap between them is elided like any other.
    ``padded`` (bool ``[Lq]``): query rows at padded positions, labelled ``pad`` and shown dim, unshaded."""
    grid: Any = weights if row_ids is None else _RowsView(weights, row_ids)
    lq, lk = grid.shape
    if row_ids is not None:
        lq = total_rows or lq
        chosen = [row_ids[p] for p in pick(len(row_ids), max_rows) if p is not None]
        rows: list[int | None] = []
        for rid in chosen:
            previous = rows[-1] if rows else None
            if previous is not None and rid != previous + 1:
                rows.append(None)
            rows.append(rid)
    else:
        rows = pick(lq, max_rows)
    cols = pick(lk, max_cols)
    vmax = array_max(weights) if lk else 1.0
    caption_parts = [p for p in (_elided(rows, lq, "rows"), _elided(cols, lk, "columns")) if p]
    caption = None
    if caption_parts:
        caption = "not shown: " + ", ".join(caption_parts) + " (--max-rows / --max-cols show more)"
    if keep is not None and not keep.all():
        caption = (caption + "; " if caption else "") + f"{MASKED} = masked"
    if padded is not None and padded.any():
        caption = (caption + "; " if caption else "") + f"{PAD} = a padded query row"
    table = Table(title=_title(title), caption=_caption(caption), caption_justify="left")
    label = max((len(axis_name(i, q_labels)) + (len(PAD) + 1 if padded is not None and padded[i] else 0)
                 for i in rows if i is not None), default=1)
    corner = Text(f"{inert.label(axis_names[0])} \\ {inert.label(axis_names[1])}")
    table.add_column(corner, style="bold", overflow="fold", min_width=min(label, 16))
    for j in cols:
        table.add_column(_header(k_labels, j), justify="right", overflow="fold", min_width=precision + 3)
    for i in rows:
        if i is None:
            table.add_row("⋮", *["⋮" for _ in cols])
            continue
        cells: list[Text | str] = []
        pad = padded is not None and bool(padded[i])
        for j in cols:
            if j is None:
                cells.append("…")
            elif keep is not None and not keep[i, j]:
                cells.append(Text(MASKED, style="dim", justify="center"))
            else:
                value = float(grid[i, j])
                cells.append(Text(f"{value:.{precision}f}", style="dim" if pad else shade(value, vmax)))
        table.add_row(Text(axis_name(i, q_labels) + (f" {PAD}" if pad else "")), *cells)
    return table


class _RowsView:
    """Some rows of a map, indexed by their row numbers in the whole map."""

    def __init__(self, data: np.ndarray, row_ids: Sequence[int]) -> None:
        self.data = data
        self.where = {int(i): n for n, i in enumerate(row_ids)}
        self.shape = (max(self.where) + 1 if self.where else 0, data.shape[-1])

    def __getitem__(self, index: tuple[int, int]) -> float:
        return float(self.data[self.where[index[0]], index[1]])


def stats_table(
    stats: RowStats,
    *,
    q_labels: Sequence[str] | None = None,
    k_labels: Sequence[str] | None = None,
    precision: int = 3,
    max_rows: int | None = None,
    title: str | None = None,
    row_name: str = "query",
    padded: np.ndarray | None = None,
) -> Table:
    """Per-query statistics of one 2-D map: entropy, normalised entropy, max, argmax, top-k, row sum.
    ``padded`` (bool ``[Lq]``): rows at padded positions, shown as ``pad`` (left out)."""
    lq = stats.entropy.shape[0]
    rows = pick(lq, max_rows)
    elided = _elided(rows, lq, "rows")
    k = stats.top_index.shape[-1]
    table = Table(
        title=_title(title),
        caption="H: entropy in nats; H/log n: normalised by the unmasked key count"
        + (f"; {PAD}: a padded query row, left out" if padded is not None and padded.any() else "")
        + (f"; not shown: {elided} (--max-rows shows more)" if elided else ""),
        caption_justify="left",
    )
    p = precision
    number = p + 3  # "0.123" or "-0.12": numbers are never cut short
    label = max((len(axis_name(i, q_labels)) for i in rows if i is not None), default=1)
    key = max((len(axis_name(int(j), k_labels)) for j in np.unique(stats.top_index)), default=1)
    # overflow "fold": a cell too narrow wraps its text, it never hides digits behind an ellipsis
    table.add_column(Text(inert.label(row_name)), overflow="fold", min_width=min(label, 16))
    table.add_column("H", justify="right", overflow="fold", min_width=number)
    table.add_column("H/log n", justify="right", overflow="fold", min_width=number)
    table.add_column("max", justify="right", overflow="fold", min_width=number)
    table.add_column("argmax", overflow="fold", min_width=min(key, 16))
    table.add_column(f"top-{k} (key: weight)", overflow="fold", min_width=min(key, 16) + number + 2)
    table.add_column("sum", justify="right", overflow="fold", min_width=number)
    counted = ~stats.masked if padded is None else ~stats.masked & ~padded
    sparse = bool(((stats.support < stats.n_keys) & counted).any())
    if sparse:  # exact zeros among the keys a row may attend to: say how many keys each row uses
        table.add_column("support", justify="right", overflow="fold")
    for i in rows:
        support = [f"{int(stats.support[i])}/{int(stats.n_keys[i])}"] if sparse and i is not None else []
        if i is None:
            table.add_row("⋮", *["⋮"] * (7 if sparse else 6))
            continue
        if padded is not None and padded[i]:
            table.add_row(Text(axis_name(i, q_labels)), *[Text(PAD, style="dim")] * (7 if sparse else 6))
            continue
        if stats.masked[i]:
            table.add_row(Text(axis_name(i, q_labels)), *[Text("masked", style="dim")] * 5, f"{stats.row_sum[i]:.{p}f}",
                          *support)
            continue
        top = "  ".join(
            f"{axis_name(int(j), k_labels)}: {w:.{p}f}"
            for j, w in zip(stats.top_index[i], stats.top_weight[i])
        )
        table.add_row(
            Text(axis_name(i, q_labels)),
            f"{stats.entropy[i]:.{p}f}",
            f"{stats.entropy_norm[i]:.{p}f}",
            f"{stats.max[i]:.{p}f}",
            Text(axis_name(int(stats.argmax[i]), k_labels)),
            Text(top),
            f"{stats.row_sum[i]:.{p}f}",
            *support,
        )
    return table


def vector_table(
    values: np.ndarray,
    *,
    labels: Sequence[str] | None = None,
    precision: int = 3,
    max_cols: int | None = None,
    title: str | None = None,
) -> Table:
    """One row of values over an axis (a pooling distribution, the attention a token receives)."""
    cols = pick(values.shape[0], max_cols)
    vmax = float(np.max(values)) if values.size else 1.0
    elided = _elided(cols, values.shape[0], "columns")
    table = Table(title=_title(title), caption=f"not shown: {elided} (--max-cols shows more)" if elided else None,
                  caption_justify="left")
    cells: list[Text | str] = []
    for j in cols:
        table.add_column(_header(labels, j), justify="right", overflow="fold", min_width=precision + 3)
        cells.append("…" if j is None else Text(f"{float(values[j]):.{precision}f}",
                                                style=shade(float(values[j]), vmax)))
    table.add_row(*cells)
    return table


def slice_summary_table(stats: RowStats, *, precision: int = 3, max_rows: int | None = None,
                        names: Sequence[str] = ()) -> Table:
    """One row per batch/head slice: means over its unmasked query rows."""
    lead = stats.entropy.shape[:-1]
    slices = list(np.ndindex(*lead))
    rows = pick(len(slices), max_rows)
    elided = _elided(rows, len(slices), "slices")
    table = Table(title="per-slice summary (means over query rows)",
                  caption=f"not shown: {elided} (--max-rows shows more)" if elided else None, caption_justify="left")
    for name in ("slice", "H", "H/log n", "max", "fully masked rows"):
        table.add_column(name, justify="left" if name == "slice" else "right", overflow="fold")
    p = precision
    for r in rows:
        if r is None:
            table.add_row(*["⋮"] * 5)
            continue
        one = stats.select(slices[r])
        live = ~one.masked
        if not live.any():
            table.add_row(Text(inert.label(slice_label(slices[r], names), 80)), *[Text("masked", style="dim")] * 3,
                          str(int(one.masked.sum())))
            continue
        table.add_row(
            Text(inert.label(slice_label(slices[r], names), 80)),
            f"{one.entropy[live].mean():.{p}f}",
            f"{one.entropy_norm[live].mean():.{p}f}",
            f"{one.max[live].mean():.{p}f}",
            str(int(one.masked.sum())),
        )
    return table

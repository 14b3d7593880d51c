"""What the viewer shows of a summary capture (``attnviz capture --summary``, or a ``--no-weights`` capture
summarised from its q and k), without Textual. ``SummaryViewerModel`` is the ``ViewerModel`` over a summary's
pooled maps instead of weights: the selected head's pooled map (block means; block maxima with ``m`` or
``--reduce max``) with its axes and cursor in token positions, every head's pooled map as a thumbnail, the
summary's per-head table (``attnviz.inspection.summary.head_table``) in the side panel and for ``s``, the batch
entries (``b``) and token search (``/``: the cursor goes to the token, the cell drawn is its block). A summary
keeps no full weights: the rollout (``r``) is refused in one line.

A pooled map is brought to fewer cells (to fit the panel, the thumbnails) by
``attnviz.inspection.summary.PooledMap.coarser``: the block means weighed by the rows and keys each holds, so
that a cell drawn is the mean of its positions whatever its size.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from attnviz.blocks import block_factors
from attnviz.inspection.summary import PooledMap, SummaryRead, pooled_map
from attnviz.render.terminal import TermPanel
from attnviz.viewer.model import THUMB, ViewerModel

#: the head table's columns in the side panel and for 's', in the order of inspect's table of a summary
#: (``total``, 1 but for gpt-oss's sinks, is left out)
SUMMARY_STATS = ("entropy", "entropy_norm", "max", "sink_mass", "local_mass", "distance", "diagonal", "previous",
                 "first", "last")
ROLLOUT_REFUSED = "a summary keeps no full weights; rollout needs them"
#: inspect's options a summary has no use for: its masks, tokens and layout are the capture's own
NOT_FOR_SUMMARIES = (("--layout", lambda o: o.layout is not None), ("--generation", lambda o: o.generation),
                     ("--weigh-by", lambda o: o.weigh_by != "weights"),
                     ("--merge-subwords", lambda o: o.labels.merge_subwords),
                     ("--mask", lambda o: o.masks.mask is not None),
                     ("--key-padding-mask", lambda o: o.masks.key_padding_mask is not None),
                     ("--reduce-heads", lambda o: o.grid.reduce_heads is not None))


@dataclass
class SummarySource:
    """A summary as the viewer reads it: its arrays, the head table (each column ``[layers, heads]``, and
    ``tag``), the labels (``TokenLabels``), the layers and heads walked, the first (layer, entry, head), and
    whether the table averages every batch entry (no ``--batch``)."""

    read: SummaryRead
    table: dict[str, np.ndarray]
    labels: Any
    layers: list[int]
    heads: list[int]
    index: tuple[int, int, int]
    averaged: bool

    def heading(self) -> str:
        """The viewer's title line: the file and what it holds."""
        s = self.read
        layers, b, h, lq, lk = s.shape
        bq, bk = s.q_edges[1] - s.q_edges[0], s.k_edges[1] - s.k_edges[0]
        kind = "" if s.kind == "layers" else f"{s.kind} "
        tokens = f"{lq} tokens" if lq == lk else f"{lq} queries x {lk} keys"
        made = " (summarised from its q and k)" if s.settings.get("computed_from") else ""
        return (f"attnviz view: {s.source}: a summary{made}, {layers} {kind}sites x {h} heads, {tokens}, "
                f"pooled in {bq}x{bk}-token blocks")


def summary_source(found: tuple[Any, Any, str], options: Any) -> SummarySource:
    """``found`` (``attnviz.inspection.kinds.Found.summary``: ``(raw, capture, kind)``) read for the viewer with
    ``options`` (``InspectOptions``): ``--layer``, ``--head``, ``--batch``, ``--layers``, ``--heads`` and the
    labels (``--labels``, else the capture's tokens); options that have no meaning for a summary are usage
    errors naming them."""
    from attnviz.errors import UsageError
    from attnviz.inspection.selection import TokenLabels, grid_choice, read_labels
    from attnviz.inspection.summary import head_table, one_entry, read_summary, sink_rate, summary_tags

    raw, capture, kind = found
    for flag, given in NOT_FOR_SUMMARIES:
        if given(options):
            raise UsageError(f"{flag}: {capture.source} is a summary capture (pooled maps and statistics, its masks "
                             f"and tokens its own); view it without {flag}.")
    read = read_summary(raw, capture, kind)
    layers, b, h, lq, lk = read.shape
    index = options.selection.index((layers, b, h))
    grid = grid_choice(options.grid.layers, options.grid.heads, (layers, b, h))
    labels = read_labels(options.labels, lq, lk, [], None, b)
    if labels.q is None and labels.k is None:  # the tokens the capture recorded, where they fit
        labels = TokenLabels(_fitting(read.tokens, lq, b), _fitting(read.key_tokens, lk, b), given=False,
                             style=read.token_style)
    chosen = options.selection.batch
    shown = read if chosen is None else one_entry(read, index[1])
    table = head_table(shown)
    table["tag"] = summary_tags(shown, table, sink_rate(shown))
    return SummarySource(read, table, labels, list(grid.layers), list(grid.heads), index, chosen is None and b > 1)


def _fitting(rows: list[list[str]] | None, n: int, batches: int) -> list[list[str]] | None:
    if not rows or len(rows) not in (1, batches) or any(len(r) != n for r in rows):
        return None
    return [list(r) for r in rows]


@dataclass
class SummaryViewerModel(ViewerModel):
    """The viewer's state over ``result``, a ``SummarySource``: the same walking, cursor, search, sorting and
    batch entries as over weights; the map is the head's pooled map of the batch entry shown."""

    sorts: ClassVar[tuple[str, ...]] = ("head", *SUMMARY_STATS)
    panel_stats: ClassVar[tuple[str, ...]] = SUMMARY_STATS

    #: pooled maps and thumbnails made, by (layer, head, mean or max), of the batch entry shown
    _pooled: dict[tuple[int, int, str], PooledMap] = field(default_factory=dict)
    _small: dict[tuple[int, int, str], PooledMap] = field(default_factory=dict)
    _scales: dict[tuple[int, str], Any] = field(default_factory=dict)  # by (entry, mean or max)

    def __post_init__(self) -> None:
        source: SummarySource = self.result
        layers, b, h, lq, lk = source.read.shape
        self.layers, self.heads = list(source.layers), list(source.heads)
        self.shape = (lq, lk)
        self.batches = b
        li, bi, hi = source.index
        self.layer = li if li in self.layers else self.layers[0]
        self.head = hi if hi in self.heads else self.heads[0]
        self.set_batch(bi)

    def set_batch(self, entry: int) -> None:
        self.batch = entry % self.batches
        self.q_labels, self.k_labels = self.result.labels.of(self.batch)
        self._pooled, self._small, self._drawn = {}, {}, {}

    @property
    def stats(self) -> dict[str, Any]:
        return dict(self.result.table)

    @property
    def averaged(self) -> bool:
        return bool(self.result.averaged)

    def column(self, name: str) -> str:
        from attnviz.render.summary import COLUMNS

        return COLUMNS.get(name, name)

    # -- the pooled maps -------------------------------------------------------------------------
    def pooled(self, layer: int, head: int) -> PooledMap:
        """A head's pooled map of the batch entry shown (block means or maxima, as ``reduce``)."""
        key = (layer, head, self.reduce)
        if key not in self._pooled:
            self._pooled[key] = pooled_map(self.result.read, layer, self.batch, head, self.reduce)
        return self._pooled[key]

    def map(self) -> tuple[np.ndarray, int]:
        """The selected head's pooled cells (``cell_positions`` says how many positions each holds)."""
        return self.pooled(self.layer, self.head).cells, 1

    def cell_positions(self) -> tuple[int, int]:
        s = self.result.read
        return int(s.q_edges[1] - s.q_edges[0]), int(s.k_edges[1] - s.k_edges[0])

    def reducer(self) -> Callable[[int, str], np.ndarray] | None:
        pooled = self.pooled(self.layer, self.head)
        return lambda f, _reduce: pooled.coarser(f, f).cells

    def colour_scale(self) -> Any:
        """As the summary's pictures of inspect (``attnviz.render.summary``): ``--norm auto`` (the default) is
        a log scale when the entry's pooled values above 0 span a decade above their median (block means are
        about 1/L beside sinks of nearly 1), one scale for every head of the entry."""
        key = (self.batch, self.reduce)
        if key not in self._scales:
            from dataclasses import replace

            from attnviz.render.scale import ValueRange

            scale = self.fig.scale()
            if scale.norm == "auto" and scale.vmin is None and scale.vmax is None:
                s = self.result.read
                values = (s.pooled_max if self.reduce == "max" else s.pooled_mean)[:, self.batch]
                found = ValueRange(histogram=True)
                found.add(np.asarray(values[np.isfinite(values)], dtype=np.float64)[None])
                if found.decades() >= 1.0:
                    scale = replace(scale, norm="log", auto=True)
            self._scales[key] = scale
        return self._scales[key]

    def rollout_refused(self) -> str | None:
        return ROLLOUT_REFUSED

    def title(self) -> str:
        return f"layer {self.layer}, head {self.head}, pooled" + (f", {self.entry}" if self.entry else "")

    def unit(self) -> str:
        return f"{self.reduce} weight"

    def _thumb_factor(self) -> int:
        pq, pk = self.pooled(self.layer, self.head).cells.shape
        return max(block_factors(pq, pk, THUMB))

    def thumb_positions(self) -> tuple[int, int]:
        t = self._thumb_factor()
        fq, fk = self.cell_positions()
        return t * fq, t * fk

    def thumb(self, layer: int, head: int) -> TermPanel:
        key = (layer, head, self.reduce)
        if key not in self._small:
            t = self._thumb_factor()
            self._small[key] = pooled_map(self.result.read, layer, self.batch, head, self.reduce).coarser(t, t)
        small = self._small[key]
        return TermPanel(lambda: (small.cells, None), (int(small.cells.shape[0]), int(small.cells.shape[1])),
                         reducer=lambda f, _reduce: small.coarser(f, f).cells)

    # -- the status line -------------------------------------------------------------------------
    def cursor_line(self) -> str:
        """The query and key under the cursor (their tokens, the positions of the cell drawn) and the cell's
        block mean (or max)."""
        q, k = self.cursor
        value = self.value()
        (gq, gk), _ = self._drawn.get(self._map_key(), (self.cell_positions(), None))

        def where(pos: int, g: int, n: int, labels: Any) -> str:
            token = f" {labels[pos]!r}" if labels is not None and pos < len(labels) else ""
            start = pos // g * g
            return f"{pos}{token}" + (f" (block {start}-{min(start + g, n) - 1})" if g > 1 else "")

        weight = "masked" if np.isnan(value) else f"{value:.4g}"
        entry = f"[{self.entry}]  " if self.entry else ""
        return (f"{entry}query {where(q, gq, self.shape[0], self.q_labels)}  key "
                f"{where(k, gk, self.shape[1], self.k_labels)}  block {self.reduce} {weight}")

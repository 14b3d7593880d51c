"""What the viewer shows, without Textual: an ``inspect`` run's weights of one batch entry, their head
statistics and tags, the selected layer and head, the cursor, token search, the order heads are walked in
(``sort``) and the rollout; pictures as ``attnviz.render.terminal.TermPicture``.

Maps are reduced before they are drawn: every head's thumbnail once (``THUMB`` cells a side at most),
and the selected map once to at most ``MAX_SIDE`` cells a side (blocks of ``prefactor``), so that a key
press redraws small arrays only.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar

import numpy as np

from attnviz.blocks import MAX_SIDE, block_factors, reduce_blocks
from attnviz.inspection.heads import HEAD_STATS
from attnviz.render.terminal import TermPanel, TermPicture

THUMB = 16  # a thumbnail is at most this many cells a side
#: bytes the rollout of a long map may take whole (its heads and four [L, L] maps in float64) when drawn with
#: --reduce max; with mean (the default) a long map's rollout is computed in blocks (``pooled_rollout``)
WHOLE_ROLLOUT = 2**29
SORTS = ("head", *HEAD_STATS)  # what 's' cycles through: natural order, then each statistic (largest first)


@dataclass
class ViewerModel:
    """The state of the viewer over ``result`` (an ``InspectResult`` of ``inspecting.analyse``)."""

    #: what 's' cycles through (natural order, then each statistic, largest first)
    sorts: ClassVar[tuple[str, ...]] = SORTS
    #: the statistics the side panel lists, two a line
    panel_stats: ClassVar[tuple[str, ...]] = HEAD_STATS

    result: Any
    fig: Any  # FigureOptions
    layer: int = 0
    head: int = 0
    sort: str = "head"
    rollout: bool = False
    cursor: tuple[int, int] = (0, 0)  # (query, key) position in the map
    _maps: dict[tuple[int, int], tuple[np.ndarray, int]] = field(default_factory=dict)
    _thumbs: dict[tuple[int, int], np.ndarray] = field(default_factory=dict)
    _rollout: np.ndarray | None = None
    _fitting: dict[tuple[int, int, bool], int] = field(default_factory=dict)  # layers that fit, by size
    #: the map last drawn: the positions (queries, keys) a cell holds as drawn and its cells (``cursor_cell``),
    #: by (layer, head, entry)
    _drawn: dict[tuple[int, int, int], tuple[tuple[int, int], np.ndarray]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        opened = self.result.opened
        w = opened.weights
        self.layers, self.heads = list(opened.grid.layers), list(opened.grid.heads)
        self.shape = (int(w.shape[-2]), int(w.shape[-1]))
        self.batches = int(w.shape[1])
        li, bi, hi = opened.index
        self.layer = li if li in self.layers else self.layers[0]
        self.head = hi if hi in self.heads else self.heads[0]
        self.set_batch(bi)

    def set_batch(self, entry: int) -> None:
        """Show batch entry ``entry``: its maps, masks and labels (what was reduced for another is dropped)."""
        from attnviz.inspection.masks import grid_masks
        from attnviz.render.mosaic import grid_getter

        opened = self.result.opened
        w = opened.weights
        self.batch = entry % self.batches
        self.keep, self.real = grid_masks(opened.masks, w.shape, self.batch)
        self.get = grid_getter(w.data[:, self.batch], self.keep, self.real)
        self.q_labels, self.k_labels = opened.labels_of(self.batch)
        self._maps, self._thumbs, self._rollout = {}, {}, None

    def move_batch(self, step: int) -> bool:
        """The next (or previous) batch entry; False when there is one entry only."""
        if self.batches < 2:
            return False
        self.set_batch(self.batch + step)
        return True

    @property
    def entry(self) -> str:
        """The batch entry shown, for titles: "entry 1 of 2" (empty for a single entry)."""
        return f"entry {self.batch} of {self.batches}" if self.batches > 1 else ""

    @property
    def stats(self) -> dict[str, Any]:
        """The head statistics, each ``[layers, heads]`` (and ``tag``)."""
        return dict(self.result.stats)

    @property
    def averaged(self) -> bool:
        """Whether the head statistics are means over every batch entry (no ``--batch``)."""
        return self.result.opened.options.selection.batch is None and self.batches > 1

    @property
    def reduce(self) -> str:
        """How cells of several positions are drawn: ``mean`` or ``max`` of the block (``--reduce``; ``m``)."""
        return str(self.fig.reduce)

    # -- walking ---------------------------------------------------------------------------------
    def order(self) -> list[int]:
        """The heads of the layer in the order ``sort`` says (a statistic: largest first, undefined last)."""
        if self.sort == "head":
            return list(self.heads)
        values = np.asarray(self.stats[self.sort], dtype=np.float64)[self.layer]
        return sorted(self.heads, key=lambda h: (bool(np.isnan(values[h])), -float(values[h]), h))

    def move_head(self, step: int) -> None:
        order = self.order()
        self.head = order[(order.index(self.head) + step) % len(order)]

    def move_layer(self, step: int) -> None:
        self.layer = self.layers[(self.layers.index(self.layer) + step) % len(self.layers)]

    def next_sort(self) -> str:
        self.sort = self.sorts[(self.sorts.index(self.sort) + 1) % len(self.sorts)]
        return self.sort

    def next_reduce(self) -> str | None:
        """Draw blocks by the other of mean and max (the maps and thumbnails reduced again); a line saying why
        not (the rollout of a long map is drawn as block means only), else None."""
        before = self.fig
        self.fig = replace(self.fig, reduce="max" if self.reduce == "mean" else "mean")
        refused = self.rollout_refused() if self.rollout else None
        if refused:
            self.fig = before
            return refused
        self._maps, self._thumbs, self._drawn = {}, {}, {}
        return None

    def move_cursor(self, dq: int, dk: int, step: tuple[int, int] = (1, 1)) -> None:
        lq, lk = self.shape
        q, k = self.cursor
        self.cursor = (min(max(q + dq * step[0], 0), lq - 1), min(max(k + dk * step[1], 0), lk - 1))

    def find(self, text: str) -> bool:
        """Move the cursor's query (and key, when the keys carry the same labels) to the next token whose
        label contains ``text`` (case ignored), after the cursor's; whether one was found."""
        labels = self.q_labels
        if not text or labels is None:
            return False
        needle = text.lower()
        n = len(labels)
        start = self.cursor[0]
        for i in range(1, n + 1):
            q = (start + i) % n
            if needle in str(labels[q]).lower():
                k = q if self.k_labels == labels else self.cursor[1]
                self.cursor = (q, min(k, self.shape[1] - 1))
                return True
        return False

    # -- what is drawn ---------------------------------------------------------------------------
    def map(self) -> tuple[np.ndarray, int]:
        """The map shown (the head's, or the rollout), reduced once to at most ``MAX_SIDE`` cells a side:
        (cells, block size)."""
        key = (-1, -1) if self.rollout else (self.layer, self.head)
        if key not in self._maps:
            f = max(block_factors(*self.shape, MAX_SIDE))
            if self.rollout and f > 1 and self.reduce == "mean":  # in blocks, never the [L, L] result
                self._maps[key] = (self.pooled_rollout(f), f)
                return self._maps[key]
            if self.rollout:
                data, keep = self.rollout_map(), None
            else:
                data, keep = self.get(self.layer, self.head)
            self._maps[key] = (reduce_blocks(data, keep, f, f, self.reduce), f)
        return self._maps[key]

    def cell_positions(self) -> tuple[int, int]:
        """The positions (queries, keys) a cell of ``map()`` holds."""
        f = self.map()[1]
        return f, f

    def rollout_refused(self) -> str | None:
        """Why the rollout cannot be shown, in one line; None when it can. A long map's rollout is computed
        in blocks and drawn as their means; the max of each block would need the whole ``[L, L]`` result."""
        lq, lk = self.shape
        if lq != lk:
            return "rollout needs square maps (self-attention)"
        heads = int(self.result.opened.weights.shape[2])
        if self.reduce == "max" and max(block_factors(lq, lk, MAX_SIDE)) > 1 and \
                (heads + 4) * lq * lk * 8 > WHOLE_ROLLOUT:
            return (f"rollout of [{lq}, {lk}] maps is computed in blocks and drawn as block means; --reduce max "
                    "would need the whole map in memory: view with --reduce mean")
        return None

    def _real_tokens(self) -> np.ndarray | None:
        """The real tokens of the batch entry (``[L]``), None when none is padded."""
        w = self.result.opened.weights
        real = None if self.real is None else np.broadcast_to(self.real, (*w.shape[:1], *w.shape[2:-1]))
        return None if real is None else np.asarray(np.asarray(real).all(axis=(0, 1)))

    def pooled_rollout(self, f: int) -> np.ndarray:
        """The rollout of the batch entry in blocks of ``f x f`` (their means; padded tokens left out)."""
        from attnviz.inspection.rollout import pooled_rollout

        return pooled_rollout(self.result.opened.weights.data[:, self.batch], f, real=self._real_tokens())

    def rollout_map(self) -> np.ndarray:
        """The rollout of the batch entry (heads mean, residual 0.5, every layer), padded tokens NaN."""
        if self._rollout is None:
            from attnviz.inspection.rollout import rollout

            w = self.result.opened.weights
            refused = self.rollout_refused()
            if refused:
                raise ValueError(refused)
            self._rollout = rollout(w.data[:, self.batch], real=self._real_tokens(), weighed=w.renormalised).result
        return self._rollout

    def value(self) -> float:
        """The weight under the cursor (the block's, when the map is drawn in blocks: the cell drawn, once the
        picture was laid out), NaN when masked."""
        cells, _ = self.map()
        (gq, gk), drawn = self._drawn.get(self._map_key(), (self.cell_positions(), cells))
        q, k = self.cursor
        return float(drawn[q // gq, k // gk])

    def _map_key(self) -> tuple[int, int, int]:
        return (-1, -1, self.batch) if self.rollout else (self.layer, self.head, self.batch)

    def picture(self, width: int, height: int, plain: bool = False) -> TermPicture:
        """The selected map (or the rollout) with its labels and the cursor, for ``width x height``."""
        from attnviz.render.terminal import single_picture

        cells, _ = self.map()
        fq, fk = self.cell_positions()
        # already in blocks: the labels of each block's first position
        q_labels = self.q_labels if self.q_labels is None or fq == 1 else list(self.q_labels[::fq])
        k_labels = self.k_labels if self.k_labels is None or fk == 1 else list(self.k_labels[::fk])
        picture = single_picture(cells, None, title=self.title(), q_labels=q_labels, k_labels=k_labels,
                                 cmap=self.fig.cmap, reduce=self.reduce, scale=self.colour_scale(), plain=plain,
                                 height=height, colorbar_label=self.unit())
        picture.panels[0].reducer = self.reducer()  # type: ignore[union-attr]
        picture.blocks = (fq, fk)
        picture.cursor = self.cursor_cell(picture, width)
        return picture

    def title(self) -> str:
        """The title of the map shown."""
        title = "rollout (heads mean, residual 0.5)" if self.rollout else f"layer {self.layer}, head {self.head}"
        return title + (f", {self.entry}" if self.entry else "")

    def unit(self) -> str:
        """What the values of the map shown are (the colour bar's label)."""
        return "rollout" if self.rollout else str(self.result.opened.weights.unit)

    def reducer(self) -> Callable[[int, str], np.ndarray] | None:
        """How the picture brings the map shown to fewer cells (None: ``reduce_blocks`` of its cells)."""
        return None

    def colour_scale(self) -> Any:
        """The colour scale of the pictures (``--vmin``, ``--vmax``, ``--norm``: a ``ColourScale``)."""
        return self.fig.scale()

    def cursor_cell(self, picture: TermPicture, width: int) -> tuple[int, int]:
        """The cursor in the cells ``picture`` draws at ``width`` (laid out once to know its blocks)."""
        picture.lines(width)
        placed = picture.placed[0]
        cells, _ = self.map()
        f = placed.f if placed is not None else 1
        fq, fk = self.cell_positions()
        g = (f * fq, f * fk)
        # the cells as drawn: the status line's block and value are theirs (one block size, as the title's)
        self._drawn = {self._map_key(): (g, placed.cells if placed is not None else cells)}
        return self.cursor[0] // g[0], self.cursor[1] // g[1]

    def drawn_blocks(self, picture: TermPicture) -> tuple[int, int]:
        """The positions (queries, keys) a cell of ``picture`` holds as drawn."""
        placed = picture.placed[0] if picture.placed else None
        f = placed.f if placed is not None else 1
        fq, fk = self.cell_positions()
        return f * fq, f * fk

    def thumbnails(self, width: int, height: int, plain: bool = False) -> TermPicture:
        """The layer x head grid, each head's map reduced once to ``THUMB`` cells a side; the selected head
        marked (none while the rollout is shown). As many layers as fit ``height``, around the selected one
        (the title says which)."""
        n, at = len(self.layers), self.layers.index(self.layer)

        def window(count: int) -> TermPicture:
            start = min(max(0, at - count // 2), n - count)
            return self._thumbnail_grid(self.layers[start:start + count], plain, height)

        def fits(count: int) -> bool:
            return len(window(count).lines(width)) <= height

        key = (width, height, plain)
        count = self._fitting.get(key)
        if count is None:  # the most layers that fit: found once per size (a key press lays out once)
            low, high = 1, n
            while low < high:
                middle = (low + high + 1) // 2
                low, high = (middle, high) if fits(middle) else (low, middle - 1)
            count = self._fitting[key] = low
        return window(count)

    def thumb_positions(self) -> tuple[int, int]:
        """The positions (queries, keys) a cell of a thumbnail holds."""
        f = max(block_factors(self.shape[0], self.shape[1], THUMB))
        return f, f

    def thumb(self, layer: int, head: int) -> TermPanel:
        """A head's thumbnail: its map reduced once to ``THUMB`` cells a side at most."""
        if (layer, head) not in self._thumbs:
            f = self.thumb_positions()[0]
            data, keep = self.get(layer, head)
            self._thumbs[(layer, head)] = reduce_blocks(data, keep, f, f, self.reduce)
        cells = self._thumbs[(layer, head)]
        return TermPanel(lambda: (cells, None), (int(cells.shape[0]), int(cells.shape[1])))

    def _thumbnail_grid(self, layers: list[int], plain: bool, height: int) -> TermPicture:
        from attnviz.render.terminal import grid_picture

        def panel(r: int, c: int) -> TermPanel:
            return self.thumb(layers[r], self.heads[c])

        n = len(self.layers)
        which = "layers" if len(layers) == n else f"layers {layers[0]}-{layers[-1]} of {n}"
        picture = grid_picture(panel, len(layers), len(self.heads), title=f"{which} x heads",
                               row_labels=[str(x) for x in layers], col_labels=[str(h) for h in self.heads],
                               row_name="L", col_name="H", cmap=self.fig.cmap, reduce=self.reduce,
                               scale=self.colour_scale(), plain=plain, height=height)
        picture.fit = True
        picture.blocks = self.thumb_positions()
        if not self.rollout and self.layer in layers:
            picture.marked = layers.index(self.layer) * len(self.heads) + self.heads.index(self.head)
        return picture

    def stats_lines(self) -> list[str]:
        """What the side panel says of the map shown: the selected head's statistics (two a line) and tag, then
        the heads of the layer in the walking order; or, while the rollout is shown, what it is."""
        if self.rollout:
            return [f"rollout{', ' + self.entry if self.entry else ''}", "heads mean, residual 0.5",
                    f"layers {self.layers[0]}-{self.layers[-1]}" if len(self.layers) > 1 else f"layer {self.layers[0]}",
                    "each row: its share of each input token", "(r: back to the head)"]
        stats = self.stats
        li, hi = self.layer, self.head
        tag = str(stats["tag"][li, hi]) if "tag" in stats else ""
        lines = [f"layer {li}  head {hi}" + ("  (all entries)" if self.averaged else ""),
                 *([f"[{tag}]"] if tag else [])]
        pairs = [f"{self.column(name):<6}{_stat(stats[name][li, hi]):>6}" for name in self.panel_stats]
        lines += ["  ".join(pairs[i:i + 2]) for i in range(0, len(pairs), 2)]
        key = self.sort
        # (the column's short name: the line fits the side panel at 80 columns)
        lines.append("order: head" if key == "head" else f"order: {self.column(key)}, largest first")
        order = self.order()
        shown = []
        for h in order:
            mark = ">" if h == hi else " "
            value = "" if key == "head" else f" {_stat(stats[key][li, h])}"
            shown.append(f"{mark}H{h}{value}")
        lines.append(" ".join(shown))
        return lines

    def column(self, name: str) -> str:
        """A statistic's short name in the side panel (the head table's column)."""
        from attnviz.render.summaries import COLUMNS

        return COLUMNS.get(name, name)

    def cursor_line(self) -> str:
        """The query token, key token and weight under the cursor."""
        q, k = self.cursor
        qname = f"{q}" + (f" {self.q_labels[q]!r}" if self.q_labels is not None else "")
        kname = f"{k}" + (f" {self.k_labels[k]!r}" if self.k_labels is not None else "")
        value = self.value()
        fq, fk = self._drawn.get(self._map_key(), (self.cell_positions(), None))[0]
        weight = "masked" if np.isnan(value) else f"{value:.4f}"
        what = self.unit()
        block = f" ({self.reduce} of a {fq}x{fk} block)" if fq * fk > 1 else ""
        entry = f"[{self.entry}]  " if self.entry else ""
        return f"{entry}query {qname}  key {kname}  {what} {weight}{block}"


def _stat(value: Any) -> str:
    """A head statistic as the panel writes it: three decimals, a dash where it is undefined (as the tables)."""
    number = float(value)
    return "–" if math.isnan(number) else f"{number:.3f}"

"""What the viewer shows, without Textual: an ``inspect`` run's weights of one batch entry, their head
statistics and tags, the selected layer and head, the cursor, token search, the order heads are walked in
(``sort``) and the rollout; pictures as ``attnviz.render.terminal.TermPicture``.

Maps are reduced before they are drawn: every head's thumbnail once (``THUMB`` cells a side at most),
and the selected map once to at most ``MAX_SIDE`` cells a side (blocks of ``prefactor``), so that a key
press redraws small arrays only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from attnviz.blocks import MAX_SIDE, block_factors, reduce_blocks
from attnviz.inspection.heads import HEAD_STATS
from attnviz.render.terminal import TermPanel, TermPicture

THUMB = 16  # a thumbnail is at most this many cells a side
SORTS = ("head", *HEAD_STATS)  # what 's' cycles through: natural order, then each statistic (largest first)


@dataclass
class ViewerModel:
    """The state of the viewer over ``result`` (an ``InspectResult`` of ``inspecting.analyse``)."""

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
    #: the map last drawn: its block size as drawn and its cells (``cursor_cell``), by (layer, head, entry)
    _drawn: dict[tuple[int, int, int], tuple[int, np.ndarray]] = field(default_factory=dict)

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

    # -- walking ---------------------------------------------------------------------------------
    def order(self) -> list[int]:
        """The heads of the layer in the order ``sort`` says (a statistic: largest first)."""
        if self.sort == "head":
            return list(self.heads)
        values = np.asarray(self.result.stats[self.sort])[self.layer]
        return sorted(self.heads, key=lambda h: (-float(values[h]), h))

    def move_head(self, step: int) -> None:
        order = self.order()
        self.head = order[(order.index(self.head) + step) % len(order)]

    def move_layer(self, step: int) -> None:
        self.layer = self.layers[(self.layers.index(self.layer) + step) % len(self.layers)]

    def next_sort(self) -> str:
        self.sort = SORTS[(SORTS.index(self.sort) + 1) % len(SORTS)]
        return self.sort

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
            if self.rollout:
                data, keep = self.rollout_map(), None
            else:
                data, keep = self.get(self.layer, self.head)
            f = max(block_factors(int(data.shape[0]), int(data.shape[1]), MAX_SIDE))
            self._maps[key] = (reduce_blocks(data, keep, f, f, self.fig.reduce), f)
        return self._maps[key]

    def rollout_map(self) -> np.ndarray:
        """The rollout of the batch entry (heads mean, residual 0.5, every layer), padded tokens NaN."""
        if self._rollout is None:
            from attnviz.inspection.rollout import rollout

            w = self.result.opened.weights
            if self.shape[0] != self.shape[1]:
                raise ValueError("rollout needs square maps (self-attention)")
            real = None if self.real is None else np.broadcast_to(self.real, (*w.shape[:1], *w.shape[2:-1]))
            tokens = None if real is None else np.asarray(np.asarray(real).all(axis=(0, 1)))
            self._rollout = rollout(w.data[:, self.batch], real=tokens, weighed=w.renormalised).result
        return self._rollout

    def value(self) -> float:
        """The weight under the cursor (the block's, when the map is drawn in blocks: the cell drawn, once the
        picture was laid out), NaN when masked."""
        cells, f = self.map()
        g, drawn = self._drawn.get(self._map_key(), (f, cells))
        q, k = self.cursor
        return float(drawn[q // g, k // g])

    def _map_key(self) -> tuple[int, int, int]:
        return (-1, -1, self.batch) if self.rollout else (self.layer, self.head, self.batch)

    def picture(self, width: int, height: int, plain: bool = False) -> TermPicture:
        """The selected map (or the rollout) with its labels and the cursor, for ``width x height``."""
        from attnviz.render.terminal import single_picture

        cells, f = self.map()
        q_labels, k_labels = self.q_labels, self.k_labels
        if f > 1:  # already in blocks: the labels of each block's first position
            q_labels = None if q_labels is None else list(q_labels[::f])
            k_labels = None if k_labels is None else list(k_labels[::f])
        title = "rollout (heads mean, residual 0.5)" if self.rollout else f"layer {self.layer}, head {self.head}"
        title += f", {self.entry}" if self.entry else ""
        unit = "rollout" if self.rollout else self.result.opened.weights.unit
        picture = single_picture(cells, None, title=title, q_labels=q_labels, k_labels=k_labels,
                                 cmap=self.fig.cmap, reduce=self.fig.reduce, scale=self.fig.scale(), plain=plain,
                                 height=height, colorbar_label=unit)
        picture.blocks = f
        picture.cursor = self.cursor_cell(picture, width)
        return picture

    def cursor_cell(self, picture: TermPicture, width: int) -> tuple[int, int]:
        """The cursor in the cells ``picture`` draws at ``width`` (laid out once to know its blocks)."""
        picture.lines(width)
        placed = picture.placed[0]
        cells, f = self.map()
        g = (placed.f if placed is not None else 1) * f
        # the cells as drawn: the status line's block and value are theirs (one block size, as the title's)
        self._drawn = {self._map_key(): (g, placed.cells if placed is not None else cells)}
        return self.cursor[0] // g, self.cursor[1] // g

    def drawn_blocks(self, picture: TermPicture) -> int:
        placed = picture.placed[0] if picture.placed else None
        return (placed.f if placed is not None else 1) * self.map()[1]

    def thumbnails(self, width: int, height: int, plain: bool = False) -> TermPicture:
        """The layer x head grid, each head's map reduced once to ``THUMB`` cells a side; the selected head
        marked (none while the rollout is shown). As many layers as fit ``height``, around the selected one
        (the title says which)."""
        f = max(block_factors(self.shape[0], self.shape[1], THUMB))
        for li in self.layers:
            for hi in self.heads:
                if (li, hi) not in self._thumbs:
                    data, keep = self.get(li, hi)
                    self._thumbs[(li, hi)] = reduce_blocks(data, keep, f, f, self.fig.reduce)
        n, at = len(self.layers), self.layers.index(self.layer)

        def window(count: int) -> TermPicture:
            start = min(max(0, at - count // 2), n - count)
            return self._thumbnail_grid(self.layers[start:start + count], plain, height, f)

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

    def _thumbnail_grid(self, layers: list[int], plain: bool, height: int, f: int) -> TermPicture:
        from attnviz.render.terminal import grid_picture

        def panel(r: int, c: int) -> TermPanel:
            cells = self._thumbs[(layers[r], self.heads[c])]
            return TermPanel(lambda: (cells, None), (int(cells.shape[0]), int(cells.shape[1])))

        n = len(self.layers)
        which = "layers" if len(layers) == n else f"layers {layers[0]}-{layers[-1]} of {n}"
        picture = grid_picture(panel, len(layers), len(self.heads), title=f"{which} x heads",
                               row_labels=[str(x) for x in layers], col_labels=[str(h) for h in self.heads],
                               row_name="L", col_name="H", cmap=self.fig.cmap, reduce=self.fig.reduce,
                               scale=self.fig.scale(), plain=plain, height=height)
        picture.fit = True
        picture.blocks = f
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
        from attnviz.render.summaries import COLUMNS

        stats = self.result.stats
        li, hi = self.layer, self.head
        tag = str(stats["tag"][li, hi]) if "tag" in stats else ""
        averaged = self.result.opened.options.selection.batch is None and self.batches > 1
        lines = [f"layer {li}  head {hi}" + ("  (all entries)" if averaged else ""), *([f"[{tag}]"] if tag else [])]
        pairs = [f"{COLUMNS.get(name, name):<6}{_stat(stats[name][li, hi]):>6}" for name in HEAD_STATS]
        lines += ["  ".join(pairs[i:i + 2]) for i in range(0, len(pairs), 2)]
        key = self.sort
        lines.append(f"order: {key}" + (" (largest first)" if key != "head" else ""))
        order = self.order()
        shown = []
        for h in order:
            mark = ">" if h == hi else " "
            value = "" if key == "head" else f" {float(stats[key][li, h]):.3f}"
            shown.append(f"{mark}H{h}{value}")
        lines.append(" ".join(shown))
        return lines

    def cursor_line(self) -> str:
        """The query token, key token and weight under the cursor."""
        q, k = self.cursor
        _, f = self.map()
        qname = f"{q}" + (f" {self.q_labels[q]!r}" if self.q_labels is not None else "")
        kname = f"{k}" + (f" {self.k_labels[k]!r}" if self.k_labels is not None else "")
        value = self.value()
        f = self._drawn.get(self._map_key(), (f, None))[0]
        weight = "masked" if np.isnan(value) else f"{value:.4f}"
        what = "rollout" if self.rollout else self.result.opened.weights.unit
        block = f" ({self.fig.reduce} of a {f}x{f} block)" if f > 1 else ""
        entry = f"[{self.entry}]  " if self.entry else ""
        return f"{entry}query {qname}  key {kname}  {what} {weight}{block}"


def _stat(value: Any) -> str:
    """A head statistic as the panel writes it: three decimals, a dash where it is undefined (as the tables)."""
    number = float(value)
    return "–" if math.isnan(number) else f"{number:.3f}"

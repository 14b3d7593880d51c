"""Long sequences in bounded memory: compute a variant in blocks of query rows.

A row of attention weights depends only on its own query row and on all the keys, for the variants
that say so (``Variant.blockwise``). When the dense weights would not fit in ``--max-memory``, the
pipeline runs the variant on blocks of query rows and keeps, instead of the whole map:

* the per-query statistics (accumulated block by block: they are one number a row);
* the output ``[..., Lq, d_v]`` (small next to the weights);
* the first and last ``PREVIEW_ROWS`` rows of every map, for the tables;
* block-aggregated heatmaps (mean or max) of the first ``MAX_PANELS`` maps, in the blocks the
  heatmaps use (``attnviz.blocks``);
* with ``--save-weights``, the weights themselves, streamed into a memory-mapped ``.npy``.

NumPy here; the variant's own ``compute`` runs TensorFlow on each block.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from attnviz.blocks import block_factors, reduce_blocks
from attnviz.errors import OutputError
from attnviz.masks import Mask
from attnviz.staging import forget, hidden_file
from attnviz.stats import RowStats, fused_row_stats
from attnviz.variants.base import Context, NumericError, Result, Variant

PREVIEW_ROWS = 32
MAX_PANELS = 16
#: bytes a weight costs while a block is computed and summarised: float32 scores, softmax
#: temporaries and NumPy copies, float64 statistics (measured, with some room)
BYTES_PER_WEIGHT = 40
DEFAULT_MAX_MEMORY = 512 * 2**20


def parse_size(text: str | None) -> int:
    """``512M``, ``2G``, ``1.5GiB``, ``300000000`` as bytes; None for the default."""
    from attnviz.errors import UsageError
    from attnviz.sizes import SIZE_UNITS

    if text is None:
        return default_max_memory()
    t = text.strip().lower()
    number = t.rstrip("abcdefghijklmnopqrstuvwxyz")
    unit = t[len(number):]
    try:
        value = float(number) * SIZE_UNITS[unit]
    except (ValueError, KeyError):
        raise UsageError(f"--max-memory {text!r}: expected a size such as 512M, 2G or 300000000.") from None
    if not math.isfinite(value):
        raise UsageError(f"--max-memory {text!r}: expected a finite size such as 512M, 2G or 300000000.")
    if value < 2**20:
        raise UsageError(f"--max-memory {text}: at least 1M.")
    return int(value)


def default_max_memory() -> int:
    """512 MiB, or an eighth of the machine's memory when that is less."""
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return DEFAULT_MAX_MEMORY
    return min(DEFAULT_MAX_MEMORY, total // 8)


def rows_per_block(weights_shape: tuple[int, ...], budget: int, align: int = 1) -> int:
    """Query rows a block may hold within ``budget``, a multiple of ``align`` when it can be."""
    lead = math.prod(weights_shape[:-2])
    rows = max(1, budget // max(1, lead * weights_shape[-1] * BYTES_PER_WEIGHT))
    if rows >= align:
        rows -= rows % align
    return min(rows, weights_shape[-2])


def needs_blocks(weights_shape: tuple[int, ...], budget: int) -> bool:
    return math.prod(weights_shape) * BYTES_PER_WEIGHT > budget


@dataclass
class Streamed:
    """What a blockwise run keeps in place of the dense weights."""

    weights_shape: tuple[int, ...]
    rows_per_block: int
    blocks: int
    preview_ids: list[int]  # the query rows kept for tables
    preview: np.ndarray  # [..., len(preview_ids), Lk]
    grids: list[np.ndarray] = field(default_factory=list)  # aggregated maps of the first slices
    grid_blocks: tuple[int, int] = (1, 1)
    saved: Path | None = None


def run(variant: Variant, ctx: Context, arrays: Mapping[str, np.ndarray], mask: Mask, params: Any,
        learned: Mapping[str, np.ndarray], weights_shape: tuple[int, ...], budget: int, reduce: str = "mean",
        save_weights: Path | None = None) -> tuple[Result, RowStats, Streamed]:
    lead, (lq, lk) = weights_shape[:-2], weights_shape[-2:]
    fr, fc = block_factors(lq, lk)
    step = rows_per_block(weights_shape, budget, fr)
    query = variant.query_input
    full = dict(arrays)
    for name in variant.query_defaults:  # e.g. multi-head self-attention: the values are the whole query
        full.setdefault(name, arrays[query])
    head = list(range(min(PREVIEW_ROWS, lq)))
    tail = [i for i in range(max(lq - PREVIEW_ROWS, 0), lq) if i >= len(head)]
    preview_ids = head + tail
    slices = list(np.ndindex(*lead))[:MAX_PANELS] if lead else [()]

    memmap, tmp = None, None
    if save_weights is not None:
        fd, tmp = hidden_file(save_weights.parent, f".{save_weights.name}.", ".part")
        os.close(fd)
        try:
            memmap = np.lib.format.open_memmap(tmp, mode="w+", dtype=np.float32, shape=weights_shape)
        except OSError as exc:
            os.unlink(tmp)
            forget(tmp)
            raise OutputError(f"--save-weights {save_weights}: cannot write ({exc.strerror or exc}).") from None
    ctx.hold(*(arr for name, arr in full.items() if name != query))  # keys, values: one tensor each for all blocks
    try:
        stats_parts: list[RowStats] = []
        outputs: list[np.ndarray] = []
        row_maps: dict[str, list[np.ndarray]] = {name: [] for name in variant.row_maps}
        previews: list[np.ndarray] = []
        grids: list[list[np.ndarray]] = [[] for _ in slices]
        cells = BlockGrids(len(slices), lk, fr, fc, reduce) if fr * fc > 1 else None  # for the heatmap
        # blocks of whole cells of fr rows write straight into the whole grids
        whole = None
        if cells is not None and step % fr == 0:
            whole = [np.empty((math.ceil(lq / fr), math.ceil(lk / fc))) for _ in slices]
        result = None
        blocks = 0
        for start in range(0, lq, step):
            stop = min(start + step, lq)
            block_arrays = dict(full)
            block_arrays[query] = arrays[query][..., start:stop, :]
            block_mask = mask.rows(start, stop, lq)
            result = variant.compute(ctx, block_arrays, block_mask, params, learned)
            w = np.broadcast_to(result.weights, (*lead, stop - start, lk))
            keep = result.keep if result.keep is not None else block_mask.keep
            if cells is not None:
                cells.start(stop - start, keep is not None, np.float64 if w.dtype == np.float64 else np.float32)
            with np.errstate(all="ignore"):
                stats_parts.append(fused_row_stats(w, keep, visit=None if cells is None else cells.visit, align=fr))
            if not np.isfinite(stats_parts[-1].row_sum).all():  # a NaN or infinity spoils its row's sum
                raise NumericError("the weights are not finite.", "the weights")
            if result.output is not None:
                outputs.append(result.output)
            for name in variant.row_maps:
                if name in result.maps:
                    row_maps[name].append(result.maps[name])
            wanted = [i - start for i in preview_ids if start <= i < stop]
            if wanted:
                previews.append(w[..., wanted, :])
            full_keep = None if keep is None else np.broadcast_to(keep, w.shape)
            for n, s in enumerate(slices):
                if cells is None:
                    grids[n].append(reduce_blocks(w[s], None if full_keep is None else full_keep[s], fr, fc, reduce))
                elif whole is not None:
                    cells.result(n, whole[n][start // fr:start // fr + math.ceil((stop - start) / fr)])
                else:
                    grids[n].append(cells.result(n))
            if memmap is not None:
                memmap[..., start:stop, :] = w
            blocks += 1
        assert result is not None
        stats = RowStats(**{name: np.concatenate([getattr(p, name) for p in stats_parts],
                                                 axis=-2 if name.startswith("top_") else -1)
                            for name in RowStats.__dataclass_fields__})
        maps = {name: np.concatenate(parts, axis=variant.row_maps[name]) for name, parts in row_maps.items() if parts}
        output = np.concatenate(outputs, axis=-2) if outputs else None
        if memmap is not None and tmp is not None:
            memmap.flush()
            del memmap
            os.chmod(tmp, 0o644)
            os.replace(tmp, save_weights)  # type: ignore[arg-type]
            forget(tmp)
            tmp = None
    finally:
        if tmp is not None:
            if os.path.exists(tmp):
                os.unlink(tmp)
            forget(tmp)
    placeholder = np.zeros((0,), np.float32)
    merged = Result(placeholder, output, params=result.params, maps=maps,
                    views=[v for v in result.views if v.name in maps], warnings=result.warnings)
    streamed = Streamed(weights_shape, step, blocks, preview_ids, np.concatenate(previews, axis=-2),
                        whole or [np.concatenate(g, axis=0) for g in grids], (fr, fc), save_weights)
    return merged, stats, streamed


class BlockGrids:
    """``attnviz.blocks.reduce_blocks`` of the first maps of a block of rows (the mean or max of
    each ``fr x fc`` cell, masked cells left out, NaN where a cell has none), gathered tile by tile
    during the statistics' pass (``visit``), so the weights are read once: rows are folded into
    ``[cells, Lk]`` float32 accumulators as tiles go by, columns at the end (``fr`` times less data).
    Maxima are exact; means of float32 maps agree within float32 rounding (a relative 1e-6), far
    below what a colour map shows. A masked cell: the weight times the keep flag (and minus the largest
    finite value for a max), no ``np.where``."""

    def __init__(self, maps: int, cols: int, fr: int, fc: int, reduce: str = "mean") -> None:
        self.maps, self.cols, self.fr, self.fc, self.reduce = maps, cols, fr, fc, reduce
        self.rows = 0
        self.acc: list[np.ndarray] = []
        self.count: list[np.ndarray] | None = None  # kept cells, when there is a mask

    def start(self, rows: int, masked: bool, dtype: Any = np.float32) -> None:
        """Empty accumulators for a block of ``rows`` rows of ``dtype`` (float32, or float64), with
        counts of kept cells when ``masked`` (made here, not on a first visit: visits come from several
        threads); those of the block before are reused when they fit."""
        self.rows = rows
        shape = (math.ceil(rows / self.fr), self.cols)
        if self.acc and self.acc[0].shape == shape and self.acc[0].dtype == dtype:
            for acc in self.acc:
                acc.fill(-np.inf if self.reduce == "max" else 0.0)
        elif self.reduce == "max":
            self.acc = [np.full(shape, -np.inf, dtype=dtype) for _ in range(self.maps)]
        else:  # zeros: pages the kernel zeroes as they are first touched
            self.acc = [np.zeros(shape, dtype=dtype) for _ in range(self.maps)]
        if not masked:
            self.count = None
        elif self.count is not None and self.count[0].shape == shape:
            for count in self.count:
                count.fill(0)
        else:
            self.count = [np.zeros(shape, dtype=np.int32) for _ in range(self.maps)]

    def visit(self, index: int, start: int, tile: np.ndarray, keep: np.ndarray | None) -> None:
        if index >= len(self.acc):
            return
        acc = self.acc[index]
        pair = np.maximum if self.reduce == "max" else np.add
        values = np.asarray(tile, dtype=acc.dtype)
        if keep is not None:
            flag = np.asarray(keep, dtype=bool).view(np.int8)
            values = values * flag  # exact: w * 1, or 0
            if self.reduce == "max":  # a masked cell never wins: -(the largest finite value)
                values += (flag - 1) * acc.dtype.type(np.finfo(acc.dtype).max)
            if self.count is not None:
                self._fold(self.count[index], start, flag, np.add)
        self._fold(acc, start, values, pair)

    def _fold(self, acc: np.ndarray, start: int, values: np.ndarray, pair: Any) -> None:
        """Rows ``start:start + len(values)`` folded into their cells: whole cells of ``fr`` rows
        (the tile starts where a cell does), or part of one cell. Sums of floats by ``einsum`` (one
        vectorised pass, whatever ``fr``); counts in int32."""
        fr = self.fr
        r = len(values)
        cell = start // fr
        counts = acc.dtype == np.int32
        whole = r - r % fr if start % fr == 0 else 0
        if whole:
            n = whole // fr
            blocks = values[:whole].reshape(n, fr, -1)
            if pair is np.add and not counts:
                part = np.einsum("ijk->ik", blocks)
            else:
                part = pair.reduce(blocks, axis=1, dtype=np.int32 if counts else None)
            pair(acc[cell:cell + n], part, out=acc[cell:cell + n])
            cell += n
        if whole != r:
            rest = values[whole:]
            if pair is np.add and not counts:
                part = np.einsum("ij->j", rest)
            else:
                part = pair.reduce(rest, axis=0, dtype=np.int32 if counts else None)
            pair(acc[cell], part, out=acc[cell])

    def result(self, index: int, out: np.ndarray | None = None) -> np.ndarray:
        """The aggregated map ``[ceil(rows / fr), ceil(cols / fc)]`` (float64, NaN where nothing is
        kept), written to ``out`` when given."""
        fr, fc = self.fr, self.fc
        pair = np.maximum if self.reduce == "max" else np.add
        dense = _fold_columns(self.acc[index], fc, pair)
        if out is None:
            out = np.empty(dense.shape)
        if self.reduce == "max":
            out[...] = dense
        elif self.count is not None:
            kept = _fold_columns(self.count[index], fc, np.add)
            np.divide(dense, np.maximum(kept, 1), out=out)
        else:  # every cell holds fr x fc positions, fewer in the last row and column of cells
            np.divide(dense, fr * fc, out=out)
            if self.rows % fr:
                out[-1] *= fr / (self.rows % fr)
            if self.cols % fc:
                out[:, -1] *= fc / (self.cols % fc)
        if self.count is not None:
            out[_fold_columns(self.count[index], fc, np.add) == 0] = np.nan
        return out


def _sizes(n: int, f: int) -> np.ndarray:
    """How many of ``n`` positions each block of ``f`` holds (the last one may be partial)."""
    sizes = np.full(math.ceil(n / f), f, dtype=np.int64)
    sizes[-1] = n - f * (len(sizes) - 1)
    return sizes


def _fold_columns(values: np.ndarray, fc: int, pair: Any) -> np.ndarray:
    """``pair`` (``np.add`` or ``np.maximum``) folded over blocks of ``fc`` columns, the last one partial."""
    rows, cols = values.shape
    whole = cols - cols % fc
    parts = []
    if whole and fc <= 16:  # a few strided element-wise passes beat a reduction over a short axis
        acc = np.array(values[:, 0:whole:fc])
        for j in range(1, fc):
            pair(acc, values[:, j:whole:fc], out=acc)
        parts.append(acc)
    elif whole and pair is np.add and values.dtype.kind == "f":
        parts.append(np.einsum("ijk->ij", values[:, :whole].reshape(rows, whole // fc, fc)))
    elif whole:
        parts.append(pair.reduce(values[:, :whole].reshape(rows, whole // fc, fc), axis=2))
    if whole != cols:
        parts.append(pair.reduce(values[:, whole:], axis=1, keepdims=True))
    return parts[0] if len(parts) == 1 else np.concatenate(parts, axis=1)

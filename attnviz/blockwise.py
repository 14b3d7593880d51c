"""Long sequences in bounded memory: compute a variant in blocks of query rows.

A row of attention weights depends only on its own query row and on all the keys, for the variants
that say so (``Variant.blockwise``). When the dense weights would not fit in ``--max-memory``, the
pipeline runs the variant on blocks of query rows and keeps, instead of the whole map:

* the per-query statistics (accumulated block by block: they are one number a row);
* the output ``[..., Lq, d_v]`` (small next to the weights);
* the first and last ``PREVIEW_ROWS`` rows of every map, for the tables;
* block-aggregated heatmaps (mean or max) of the first ``MAX_PANELS`` maps;
* with ``--save-weights``, the weights themselves, streamed into a memory-mapped ``.npy``.

NumPy here; the variant's own ``compute`` runs TensorFlow on each block.
"""

from __future__ import annotations

import math
import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from attnviz.errors import OutputError
from attnviz.masks import Mask
from attnviz.stats import RowStats, row_stats
from attnviz.variants._base import Context, Result, Variant

PREVIEW_ROWS = 32
MAX_PANELS = 16
#: bytes a weight costs while a block is computed and summarised: float32 scores, softmax
#: temporaries and NumPy copies, float64 statistics (measured, with some room)
BYTES_PER_WEIGHT = 40
DEFAULT_MAX_MEMORY = 512 * 2**20
UNITS = {"": 1, "b": 1, "k": 2**10, "kb": 2**10, "kib": 2**10, "m": 2**20, "mb": 2**20, "mib": 2**20,
         "g": 2**30, "gb": 2**30, "gib": 2**30}


def parse_size(text: str | None) -> int:
    """``512M``, ``2G``, ``1.5GiB``, ``300000000`` as bytes; None for the default."""
    from attnviz.errors import UsageError

    if text is None:
        return default_max_memory()
    t = text.strip().lower()
    number = t.rstrip("abcdefghijklmnopqrstuvwxyz")
    unit = t[len(number):]
    try:
        value = float(number) * UNITS[unit]
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
    from attnviz.render.heatmap import block_factors, reduce_blocks

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
        fd, tmp = tempfile.mkstemp(dir=save_weights.parent, prefix=f".{save_weights.name}.", suffix=".part")
        os.close(fd)
        try:
            memmap = np.lib.format.open_memmap(tmp, mode="w+", dtype=np.float32, shape=weights_shape)
        except OSError as exc:
            os.unlink(tmp)
            raise OutputError(f"--save-weights {save_weights}: cannot write ({exc.strerror or exc}).") from None
    try:
        stats_parts: list[RowStats] = []
        outputs: list[np.ndarray] = []
        row_maps: dict[str, list[np.ndarray]] = {name: [] for name in variant.row_maps}
        previews: list[np.ndarray] = []
        grids: list[list[np.ndarray]] = [[] for _ in slices]
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
            stats_parts.append(row_stats(w, keep))
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
                grids[n].append(reduce_blocks(w[s], None if full_keep is None else full_keep[s], fr, fc, reduce))
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
            tmp = None
    finally:
        if tmp is not None and os.path.exists(tmp):
            os.unlink(tmp)
    placeholder = np.zeros((0,), np.float32)
    merged = Result(placeholder, output, params=result.params, maps=maps,
                    views=[v for v in result.views if v.name in maps], warnings=result.warnings)
    streamed = Streamed(weights_shape, step, blocks, preview_ids, np.concatenate(previews, axis=-2),
                        [np.concatenate(g, axis=0) for g in grids], (fr, fc), save_weights)
    return merged, stats, streamed

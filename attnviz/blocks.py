"""Block reduction: a long attention map aggregated in blocks of positions (mean or max of each).

A map longer than a picture has pixels (or than a report should hold numbers) is drawn in blocks of
``fr x fc`` positions: each block becomes one cell, the mean or the max of its cells; masked cells
(and the padding of a last, partial block) are left out, and a block with nothing left stays NaN.

Both sides use it: compute (``attnviz.blockwise`` gathers the grids of a run in blocks of query
rows with the same block sizes) and render (the heatmaps, the mosaics and the HTML report in
``attnviz.render``). NumPy only: no matplotlib, no TensorFlow.

* ``block_factors``: the block sizes that bring a map to at most ``MAX_SIDE`` (or a given side)
  cells a side;
* ``block_reduce`` / ``reduce_blocks``: a map (perhaps memory-mapped, read ``CHUNK`` values at a
  time) in blocks, as float64, masked cells left out;
* ``reduce_panel``: the same as float32, through the fast strided path (``_strided_reduce``)
  when nothing is masked.
"""

from __future__ import annotations

import math

import numpy as np

MAX_SIDE = 512  # aggregate longer maps in blocks to at most this many cells a side
CHUNK = 2**22  # values aggregated at a time


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


def _strided_reduce(values: np.ndarray, fr: int, fc: int, reduce: str) -> np.ndarray:
    """``values [rows, cols]`` in blocks of ``fr x fc`` (the last ones may be partial), mean or max of
    each, in float32: one pass per offset within a block, each over the whole map at once (much faster
    than reducing the short axes of a reshaped array, and no float64 copy). Rows first: each of those
    passes reads whole rows, one ``fr``-th of the map, so that the map is read once; the columns are
    then reduced in the ``fr`` times smaller result."""
    op = np.maximum if reduce == "max" else np.add
    rows, cols = values.shape
    out_r, out_c = math.ceil(rows / fr), math.ceil(cols / fc)
    acc = np.array(values[0::fr], dtype=np.float32)
    for i in range(1, fr):
        part = values[i::fr]
        op(acc[:part.shape[0]], part, out=acc[:part.shape[0]])
    out = np.array(acc[:, 0::fc], dtype=np.float32)
    for j in range(1, fc):
        part = acc[:, j::fc]
        op(out[:, :part.shape[1]], part, out=out[:, :part.shape[1]])
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
        rows, cols = data.shape
        step = fr * max(1, CHUNK // max(1, fr * cols))  # whole blocks of rows, about CHUNK values at a time
        if rows <= step:
            return _strided_reduce(np.asarray(data), fr, fc, reduce)
        from attnviz.io import release_pages

        parts = []
        for s in range(0, rows, step):  # a long (perhaps memory-mapped) map: its pages let go of as it is read
            parts.append(_strided_reduce(np.asarray(data[s:s + step]), fr, fc, reduce))
            release_pages(data)
        return np.concatenate(parts)
    return reduce_blocks(data, keep, fr, fc, reduce).astype(np.float32)

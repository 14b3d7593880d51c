"""Per-query statistics of attention weights (NumPy only).

For each query row of ``weights [..., Lq, Lk]``:

* ``entropy``: ``-sum_j w_j log w_j`` in nats (``0 log 0 = 0``);
* ``entropy_norm``: entropy divided by ``log n``, n the number of keys the row may attend to
  (1 for a uniform row, 0 for a one-hot row; 0 when n = 1);
* ``max`` and ``argmax`` (ties go to the lower key index);
* ``top_index`` / ``top_weight``: the k largest weights, in descending order, ties to the lower index;
* ``row_sum``: the sum of the row (1 for a softmax row, 0 for a fully masked one);
* ``support``: how many keys have a weight other than exactly 0 (sparse variants);
* ``masked``: True where the row is fully masked. Its entropy, max and argmax are undefined and
  reported as NaN / -1 (``null`` in JSON, "masked" in tables).

Two implementations of the same statistics:

* ``row_stats``, the reference (and the test oracle): float64 NumPy over every weight, sums in
  float64 whatever the weights' dtype;
* ``fused_row_stats``, what the compute commands use: one pass that reads each weight once, in
  tiles that stay in a core's cache while every statistic is taken from them, on every core, in
  float32 (float64 for float64 weights). Exactly the reference's ``max``, ``argmax``, ``top_*``,
  ``support``, ``n_keys`` and ``masked``; ``entropy``, ``entropy_norm`` and ``row_sum`` within a
  relative ``FUSED_RTOL`` (1e-6). Maps under ``FUSED_MIN`` weights go to the reference itself.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from attnviz.rowmath import entropy, normalised_entropy


@dataclass
class RowStats:
    entropy: np.ndarray  # [..., Lq] float64
    entropy_norm: np.ndarray
    max: np.ndarray
    argmax: np.ndarray  # int64, -1 for masked rows
    top_index: np.ndarray  # [..., Lq, k] int64
    top_weight: np.ndarray  # [..., Lq, k] float64
    row_sum: np.ndarray
    n_keys: np.ndarray  # int64: keys each row may attend to
    masked: np.ndarray  # bool
    support: np.ndarray  # int64: keys with a weight other than exactly 0

    def as_dict(self) -> dict[str, np.ndarray]:
        return {
            "entropy": self.entropy,
            "entropy_norm": self.entropy_norm,
            "max": self.max,
            "argmax": self.argmax,
            "top_index": self.top_index,
            "top_weight": self.top_weight,
            "row_sum": self.row_sum,
            "n_keys": self.n_keys,
            "masked": self.masked,
            "support": self.support,
        }

    def select(self, index: tuple[int, ...]) -> RowStats:
        """The statistics of one slice of the leading dimensions."""
        return RowStats(**{name: value[index] for name, value in self.as_dict().items()})


def top_k_indices(w: np.ndarray, k: int) -> np.ndarray:
    """Indices of the k largest entries of each row, largest first, ties to the lower index (as a
    stable sort of -w would give), in O(Lk) per row rather than a full sort."""
    lk = w.shape[-1]
    if k >= lk or lk <= 64:
        return np.argsort(-w, axis=-1, kind="stable")[..., :k]
    if k <= 8:  # k passes of argmax (the first of equal maxima), each winner then set aside
        work = np.array(w, dtype=np.float64)
        picks = []
        for _ in range(k):
            index = np.argmax(work, axis=-1)[..., None]
            picks.append(index)
            np.put_along_axis(work, index, -np.inf, axis=-1)
        return np.concatenate(picks, axis=-1)
    kth = np.partition(w, lk - k, axis=-1)[..., lk - k, None]  # the k-th largest value
    greater = w > kth
    equal = w == kth
    need = k - greater.sum(axis=-1, keepdims=True)
    chosen = greater | (equal & (np.cumsum(equal, axis=-1) <= need))  # exactly k, lower indices among ties
    candidates = np.argsort(~chosen, axis=-1, kind="stable")[..., :k]  # their indices, ascending
    values = np.take_along_axis(w, candidates, axis=-1)
    return np.take_along_axis(candidates, np.argsort(-values, axis=-1, kind="stable"), axis=-1)


CHUNK = 2**22  # values summarised at a time (32 MiB in float64)


def row_stats(weights: np.ndarray, keep: np.ndarray | None = None, k: int = 3, chunk: int = CHUNK) -> RowStats:
    """Statistics of every query row of ``weights [..., Lq, Lk]``; ``keep`` broadcasts to it.
    Large inputs (a memory-mapped map, say) are summarised a block of rows at a time."""
    if weights.size > chunk and weights.ndim >= 2:
        lq = weights.shape[-2]
        rows = max(1, chunk // max(1, weights.size // lq))
        if rows < lq:
            full_keep = None if keep is None else np.broadcast_to(keep, weights.shape)
            from attnviz.io import release_pages

            parts = []
            for s in range(0, lq, rows):
                parts.append(row_stats(weights[..., s:s + rows, :],
                                       None if full_keep is None else full_keep[..., s:s + rows, :], k,
                                       chunk=weights.size))
                release_pages(weights)
            return RowStats(**{name: np.concatenate([getattr(p, name) for p in parts],
                                                    axis=-2 if name.startswith("top_") else -1)
                               for name in RowStats.__dataclass_fields__})
    w = np.asarray(weights, dtype=np.float64)
    lk = w.shape[-1]
    if keep is None:
        n_keys = np.full(w.shape[:-1], lk, dtype=np.int64)
    else:
        n_keys = np.broadcast_to(keep, w.shape).sum(axis=-1).astype(np.int64)
    masked = n_keys == 0
    h = entropy(w)
    h_norm = normalised_entropy(h, n_keys)
    k = max(1, min(k, lk))
    order = top_k_indices(w, k)
    top_weight = np.take_along_axis(w, order, axis=-1)
    argmax = order[..., 0].astype(np.int64)
    return RowStats(
        entropy=np.where(masked, np.nan, h),
        entropy_norm=np.where(masked, np.nan, h_norm),
        max=np.where(masked, np.nan, top_weight[..., 0]),
        argmax=np.where(masked, -1, argmax),
        top_index=order.astype(np.int64),
        top_weight=top_weight,
        row_sum=w.sum(axis=-1),
        n_keys=n_keys,
        masked=masked,
        support=(w != 0).sum(axis=-1).astype(np.int64),
    )


# ----------------------------------------------------------------------------------------------
# The fused pass: the same statistics, each weight read from memory once

#: below this many weights ``fused_row_stats`` hands the work to ``row_stats`` (exact, and quick there)
FUSED_MIN = 2**16
#: values a tile holds (1 MiB of float32): a tile and its scratch buffer stay in a core's cache (its
#: L2 and a share of L3) while every statistic is taken from them; smaller tiles pay more per-call
#: overhead, larger ones spill to memory (measured on a 2-core EPYC: 2**18 fastest)
TILE = 2**18
#: float32 partial sums run over this many values at most before they are combined in float64
GROUP = 64
#: top-k by passes of argmax up to this k; past it, ``top_k_indices`` on each tile
ARGMAX_K = 8
#: threads a pass uses at most (the calling thread and a pool's)
MAX_THREADS = 16
#: relative tolerance of ``row_sum``, ``entropy`` and ``entropy_norm`` against ``row_stats``
#: (float32 weights; float64 weights agree to 1e-12): float32 logarithms and float32 partial sums
#: of ``GROUP`` values, a few float32 units of rounding whatever the row's length
FUSED_RTOL = 1e-6

#: called with (map index, first row, tile [rows, Lk], its rows of keep or None) for every tile of a
#: fused pass (``fused_row_stats(visit=...)``), from the pass's worker threads
Visit = Callable[[int, int, np.ndarray, "np.ndarray | None"], None]


def workers() -> int:
    """The cores this process may run on."""
    import os

    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


_POOL: tuple[int, int, Any] | None = None


def _pool(n: int) -> Any:
    """A thread pool of ``n`` workers, kept for the process, made again in a forked child (threads do
    not survive a fork)."""
    import os
    from concurrent.futures import ThreadPoolExecutor

    global _POOL
    if _POOL is None or _POOL[0] != os.getpid() or _POOL[1] < n:
        if _POOL is not None and _POOL[0] == os.getpid():
            _POOL[2].shutdown(wait=False)
        _POOL = (os.getpid(), n, ThreadPoolExecutor(max_workers=n, thread_name_prefix="attnviz-stats"))
    return _POOL[2]


def _compute_dtype(dtype: np.dtype) -> type | None:
    """float64 weights are summarised in float64; float32, float16 and bfloat16 in float32 (exact
    widening); anything else by the reference."""
    if dtype == np.float64:
        return np.float64
    if dtype in (np.float32, np.float16) or dtype.name == "bfloat16":
        return np.float32
    return None


def _row_sums(x: np.ndarray, y: np.ndarray | None = None) -> np.ndarray:
    """Sums of the rows of a C-contiguous ``x [r, n]`` (of ``x * y`` when ``y`` is given) as float64:
    in float32, pieces of ``GROUP`` values (one vectorised ``einsum``; not a BLAS matrix-vector
    product, which would start threads of its own beside the pass's), whose partial sums are added
    in float64, so the rounding error stays a few float32 units however long the row; float64 input
    is summed in float64 throughout. A NaN or an infinity in a row makes its sum NaN or infinite."""
    r, n = x.shape
    if x.dtype == np.float64 or n < 2 * GROUP:
        return (x if y is None else x * y).sum(axis=-1, dtype=np.float64)
    whole = n - n % GROUP
    pieces = [(v if whole == n else v[:, :whole]).reshape(r, whole // GROUP, GROUP) for v in (x, y) if v is not None]
    parts = np.einsum("ijk,ijk->ij" if y is not None else "ijk->ij", *pieces)
    total = parts.astype(np.float64).sum(axis=-1)
    if whole != n:
        total += (x[:, whole:] if y is None else x[:, whole:] * y[:, whole:]).sum(axis=-1, dtype=np.float64)
    return total


def _argmax_passes(values: np.ndarray, k: int) -> np.ndarray:
    """The k largest of each row of ``values`` (a scratch array: it is overwritten), largest first,
    ties to the lower index: argmax gives the first of equal maxima, and each winner is set aside."""
    ids = np.arange(len(values))
    order = np.empty((len(values), k), dtype=np.int64)
    for j in range(k):
        order[:, j] = values.argmax(axis=-1)
        if j + 1 < k:
            values[ids, order[:, j]] = -np.inf
    return order


@dataclass
class _Out:
    """Flat per-row results a fused pass writes, tile by tile."""

    entropy: np.ndarray
    row_sum: np.ndarray
    support: np.ndarray
    top_index: np.ndarray
    top_weight: np.ndarray


def _summarise_tile(t: np.ndarray, out: _Out, at: int, k: int, scratch: np.ndarray, zeros: bool = False) -> bool:
    """Every statistic of the rows of one tile ``t [r, Lk]`` (C-contiguous, float32 or float64),
    written to ``out`` from flat row ``at`` on; ``scratch`` holds at least ``t.size`` values.

    ``zeros``: rows with exact zeros are expected (most rows of the tile before had some: a mask, a
    sparse variant), so 0 log 0 = 0 is arranged from the start. Returns whether most rows of this
    tile had a zero (or a negative weight)."""
    r, lk = t.shape
    rows = slice(at, at + r)
    tiny = np.finfo(t.dtype).smallest_subnormal
    a = scratch[:t.size].reshape(r, lk)
    if zeros:  # a zero becomes the smallest positive value: 0 * log(tiny) = 0; every row counted
        np.maximum(t, tiny, out=a)
        np.log(a, out=a)
        h = 0.0 - _row_sums(a, t)  # 0 - x, not -x: no "-0.000" for a one-hot row
        support = np.count_nonzero(t, axis=-1).astype(np.int64)
        redo = np.flatnonzero(support < lk)
    else:  # -sum w log w: a zero (0 * -inf) or a negative weight (log: NaN) makes its row's sum NaN,
        # and only those rows are done again, with 0 log 0 = 0
        np.log(t, out=a)
        h = 0.0 - _row_sums(a, t)
        support = np.full(r, lk, dtype=np.int64)  # a row without a zero: every key
        redo = np.flatnonzero(np.isnan(h))
        if redo.size:
            sub = t[redo]
            support[redo] = np.count_nonzero(sub, axis=-1)
            b = np.maximum(sub, tiny)
            np.log(b, out=b)
            h[redo] = 0.0 - _row_sums(b, sub)
    out.row_sum[rows] = _row_sums(t)
    out.support[rows] = support
    if k <= ARGMAX_K:  # the entropy is done with the scratch buffer: a copy to set the winners aside in
        work = scratch[:t.size].reshape(r, lk)
        np.copyto(work, t)
        order = _argmax_passes(work, k)
    else:
        order = top_k_indices(t, k).astype(np.int64)
    top = t[np.arange(r)[:, None], order]
    out.top_index[rows] = order
    out.top_weight[rows] = top
    # weights outside [0, 1] (not a distribution): terms of both signs, so the reference's float64
    # entropy, and with a negative weight (a sum that may cancel) the float64 row sum too. A negative
    # weight made its row's sum NaN, unless it was clamped (``zeros``): then every row is looked at
    odd = np.flatnonzero(top[:, 0] > 1)
    suspects = np.arange(r) if zeros else redo
    if suspects.size:
        negative = suspects[t[suspects].min(axis=-1) < 0]
        if negative.size:
            out.row_sum[at + negative] = t[negative].sum(axis=-1, dtype=np.float64)
            odd = np.union1d(odd, negative)
    if odd.size:
        h[odd] = entropy(t[odd])
    out.entropy[rows] = h
    return 2 * redo.size > r


def _work_units(maps: int, lq: int, lk: int, align: int) -> tuple[int, list[list[tuple[int, int, int]]]]:
    """The tile height and the units of work of ``fused_row_stats``: a unit is a tile ``(map, start, stop)``,
    or the tiles of one run of ``align`` rows when tiles are shorter than that (one thread sees a run)."""
    step = max(1, TILE // lk)
    align = max(1, align)
    if step >= align:  # whole runs of ``align`` rows a tile
        step -= step % align
    else:  # or tiles that divide a run exactly
        step = max(d for d in range(1, step + 1) if align % d == 0)
    per_unit = max(1, align // step)
    units = [[(i, s, min(s + step, lq)) for s in range(u, min(u + per_unit * step, lq), step)]
             for i in range(maps) for u in range(0, lq, per_unit * step)]
    return step, units


def _assembled(out: _Out, shape: tuple[int, ...], compact: tuple[int, ...], keep: np.ndarray | None,
               lk: int) -> RowStats:
    """The ``RowStats`` of the rows ``fused_row_stats`` summarised (``compact``: the rows actually read,
    broadcast back to ``shape``), with the key counts and masked rows of ``keep``."""

    def full(flat: np.ndarray) -> np.ndarray:
        part = flat.reshape(compact + flat.shape[1:])
        if part.shape[:len(shape)] == shape:
            return part
        return np.array(np.broadcast_to(part, shape + flat.shape[1:]))

    h = full(out.entropy)
    if keep is None:
        n_keys = np.full(shape, lk, dtype=np.int64)
    else:
        kp = np.asarray(keep, dtype=bool)
        counted = np.broadcast_to(kp, kp.shape[:-1] + (lk,)).sum(axis=-1)  # on the mask's own shape
        n_keys = np.array(np.broadcast_to(counted, shape), dtype=np.int64)
    masked = n_keys == 0
    h_norm = normalised_entropy(h, n_keys)
    top_index, top_weight = full(out.top_index), full(out.top_weight)
    return RowStats(
        entropy=np.where(masked, np.nan, h),
        entropy_norm=np.where(masked, np.nan, h_norm),
        max=np.where(masked, np.nan, top_weight[..., 0]),
        argmax=np.where(masked, -1, top_index[..., 0]),
        top_index=top_index,
        top_weight=top_weight,
        row_sum=full(out.row_sum),
        n_keys=n_keys,
        masked=masked,
        support=full(out.support),
    )


def fused_row_stats(weights: np.ndarray, keep: np.ndarray | None = None, k: int = 3, *,
                    threads: int | None = None, min_size: int = FUSED_MIN, visit: Visit | None = None,
                    align: int = 1) -> RowStats:
    """``row_stats`` in one pass that reads each weight from memory once: the rows are cut into tiles
    that stay in a core's cache while every statistic is taken from them, in float32 (float64 for
    float64 weights), on every core.

    Equal to ``row_stats`` exactly in ``max``, ``argmax``, ``top_index``, ``top_weight``,
    ``support``, ``n_keys`` and ``masked`` (comparisons and copies of the same values); ``row_sum``,
    ``entropy`` and ``entropy_norm`` within ``FUSED_RTOL`` relative (float32 logarithms, float32
    partial sums of at most ``GROUP`` values added in float64; every term of an entropy has the same
    sign, so near-one-hot rows keep that relative accuracy). Rows with weights outside [0, 1] take
    the reference's float64 entropy. Inputs under ``min_size`` weights, and dtypes other than
    float16, bfloat16, float32 and float64, go to ``row_stats`` itself.

    ``visit(map, row, tile, keep)`` is called for each tile of each 2-D map (the leading index in
    C order), from the worker threads, with the tile's rows of ``keep`` (or None); each run of
    ``align`` rows of a map (the last may be shorter) is seen by one thread, in whole tiles or in
    tiles that lie within it, so a visitor may gather those rows without a lock. Inputs that go to
    ``row_stats`` are visited a map at a time."""
    w = np.asarray(weights)
    cd = _compute_dtype(w.dtype)
    if w.ndim < 2 or w.size < max(min_size, 1) or cd is None or w.shape[-1] == 0:
        if visit is not None and w.ndim >= 2:
            full_keep = None if keep is None else np.broadcast_to(keep, w.shape)
            for i, index in enumerate(np.ndindex(*w.shape[:-2])):
                visit(i, 0, w[index], None if full_keep is None else full_keep[index])
        return row_stats(w, keep, k)
    lk = w.shape[-1]
    k = max(1, min(k, lk))
    # a weights array broadcast along some axes (a view with stride 0) is summarised once per distinct
    # row, unless every map is to be visited
    compact = w if visit is not None else w[tuple(
        slice(0, 1) if (w.strides[a] == 0 and w.shape[a] > 1) else slice(None) for a in range(w.ndim - 1))]
    lq = compact.shape[-2]
    full_keep = None if keep is None or visit is None else np.broadcast_to(keep, w.shape)
    indices = list(np.ndindex(*compact.shape[:-2]))
    n_rows = lq * len(indices)
    out = _Out(np.empty(n_rows), np.empty(n_rows), np.empty(n_rows, dtype=np.int64),
               np.empty((n_rows, k), dtype=np.int64), np.empty((n_rows, k)))
    step, units = _work_units(len(indices), lq, lk, align)

    def run(queue: Iterator[list[tuple[int, int, int]]]) -> None:
        scratch = np.empty(min(lq, step) * lk, dtype=cd)
        zeros = False  # whether most rows of the last tile had an exact zero
        with np.errstate(all="ignore"):  # per thread: log(0) and 0 * -inf are expected here
            for unit in queue:
                for i, start, stop in unit:
                    tile = compact[indices[i]][start:stop]
                    if tile.dtype != cd or not tile.flags.c_contiguous:
                        tile = np.ascontiguousarray(tile, dtype=cd)
                    zeros = _summarise_tile(tile, out, i * lq + start, k, scratch, zeros)
                    if visit is not None:
                        visit(i, start, tile, None if full_keep is None else full_keep[indices[i]][start:stop])

    # every thread takes the next unit when it is done with one (a core busy with something else holds
    # up nobody); this thread works too. Taking from one list iterator is atomic in CPython.
    queue = iter(units)
    n = max(1, min(threads or workers(), MAX_THREADS, len(units)))
    futures = [_pool(n - 1).submit(run, queue) for _ in range(n - 1)] if n > 1 else []
    try:
        run(queue)
    finally:
        for f in futures:  # one not started yet (its threads busy with another caller's work) is not needed
            if not f.cancel():
                f.result()

    return _assembled(out, w.shape[:-1], compact.shape[:-1], keep, lk)

"""What each head does: per-head statistics over the query rows (entropy, distance, diagonal,
previous, first, last, max), the pattern tags they earn, whether the rows are distributions, and
the per-query statistics of one map. Read a block of rows at a time (memory-mapped files)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from attnviz.inspection.weights import ROUNDOFF
from attnviz.io import release_pages
from attnviz.rowmath import normalised_entropy, real_ends, row_rule
from attnviz.statistics import BY_NAME, SINK_EPSILON, WEIGHTS, names
from attnviz.threads import in_threads

# What the heads do

def _first_last(real: np.ndarray | None, lead: tuple[int, ...], n: int) -> tuple[np.ndarray, np.ndarray]:
    """The first and last real position of each (layer, batch, head), ``[L, B, H]`` (0 and n - 1 when
    nothing is known, or nothing is real)."""
    if real is None:
        return np.zeros(lead, dtype=np.int64), np.full(lead, n - 1, dtype=np.int64)
    return real_ends(np.broadcast_to(real, (*lead, n)))


#: the head statistics of exact weights, as the table of ``attnviz.statistics`` defines them (``weights``), less
#: the token scores ``attnviz.inspection.tokens`` computes when the tokens are known
HEAD_STATS = tuple(n for n in names(WEIGHTS) if BY_NAME[n].rows != "repeated")
#: how far from 1 (or 0, a fully masked row) a row of attention weights may sum (float16 files: 1e-2)
ROW_SUM_TOL = 1e-3


CHUNK = 2**22  # values handled at a time on large inputs (16 MiB in float32)
GRIDS_HELD = 2**26  # bytes of position grids a pass keeps (``_Grids``)


def row_blocks(w: np.ndarray, chunk: int = CHUNK,
               dtype: Any = np.float64) -> Iterator[tuple[tuple[int, ...], int, int, np.ndarray]]:
    """((layer, batch, head), first row, end row, block in ``dtype``; None: as stored) over
    ``w [L, B, H, Lq, Lk]`` in pieces of about ``chunk`` values: a memory-mapped file is read a block at
    a time."""
    lq, lk = w.shape[-2:]
    rows = max(1, chunk // max(lk, 1))
    for idx in np.ndindex(*w.shape[:-2]):
        for start in range(0, lq, rows):
            stop = min(start + rows, lq)
            yield idx, start, stop, np.asarray(w[idx][start:stop], dtype=dtype)
            release_pages(w)


def is_causal(w: np.ndarray, chunk: int = CHUNK) -> bool:
    """Nothing above the diagonal (top-left aligned), anywhere."""
    lk = w.shape[-1]
    for _, start, stop, block in row_blocks(w, chunk):
        above = np.arange(lk)[None, :] > np.arange(start, stop)[:, None]
        if np.any(block[above]):
            return False
    return True


def row_sum_tolerance(stored: str | np.dtype[Any]) -> float:
    """How far a row of weights stored as ``stored`` may sum from 1 and still be a distribution:
    1e-3 for float32/64, about 2.5 times the worst rounding for half precision (float16 and bfloat16:
    1e-2; 8-bit floats 0.15)."""
    name = np.dtype(stored).name if isinstance(stored, np.dtype) else str(stored)
    if name in ("float16", "bfloat16"):
        return 1e-2
    return max(ROW_SUM_TOL, 2.5 * ROUNDOFF.get(name, 0.0))


def default_atol(stored: str) -> float:
    """``--check-rows``' default tolerance: 1e-5 for float32 and float64 files; for weights stored in
    half precision, the rounding of the storage itself (2 ulps at 1: float16 2e-3, bfloat16 1.6e-2)."""
    return max(1e-5, 2.0 * 2.0 * ROUNDOFF.get(stored, 0.0))


#: the sums ``_head_sums`` returns per (layer, head)
_SUMS = ("rows", "later", "entropy", "distance", "max", "last", "diagonal", "previous", "first", "first_all",
         "norm_full", "count_full", "norm_causal", "count_causal", "off_rows", "negative", "held")


def work_dtype(dtype: np.dtype[Any]) -> type:
    """What the head statistics compute in: float32 for weights of 32 bits or fewer (each row's sums in
    float32, summed over rows in float64: float32 tolerance, as the weights themselves), float64 for
    float64 weights."""
    return np.float64 if np.dtype(dtype).itemsize > 4 else np.float32


class _Grids:
    """``|i - j|`` and ``j > i`` for a block of rows (``start``, ``rows``, ``Lk``, dtype), made once per
    pass and shared by its blocks (and threads: a grid made twice is the same grid). At most ``held``
    bytes of them are kept (the oldest let go first): a long map has a grid per block of rows, which
    together would be as large as a map."""

    def __init__(self, held: int | None = None) -> None:
        self._made: dict[tuple[int, int, int, Any], tuple[np.ndarray, np.ndarray]] = {}
        self._held = GRIDS_HELD if held is None else held

    def __call__(self, start: int, rows: int, lk: int, dtype: Any) -> tuple[np.ndarray, np.ndarray]:
        key = (start, rows, lk, dtype)
        made = self._made.get(key)
        if made is None:
            offset = np.arange(lk)[None, :] - np.arange(start, start + rows)[:, None]
            made = (np.abs(offset).astype(dtype), (offset > 0).astype(dtype))
            size = 2 * made[0].nbytes
            while self._made and size * (len(self._made) + 1) > self._held:
                try:
                    self._made.pop(next(iter(self._made)), None)
                except (StopIteration, RuntimeError):  # another thread changed it meanwhile
                    break
            self._made[key] = made
        return made


_TINY: dict[Any, Any] = {np.float32: np.float32(np.finfo(np.float32).tiny), np.float64: np.finfo(np.float64).tiny}


class _Sums(NamedTuple):
    """What ``_head_sums`` finds in a block ``[l, b, h, r, Lk]``."""

    sums: dict[str, np.ndarray]  # ``_SUMS``, each ``[l, h]``
    extremes: dict[str, np.ndarray]  # the least and largest row sums and values, ``[l, h]``
    above: bool  # a weight lies above the diagonal
    columns: np.ndarray  # ``[l, b, h, Lk]``: the block's weights summed over its rows (masked ones 0)
    finite: bool  # the sums of the real rows are finite


def _head_sums(block: np.ndarray, start: int, keep: np.ndarray | None, real: np.ndarray | None,
               first_key: np.ndarray, last_key: np.ndarray, first_row: np.ndarray,
               tol: float, grids: _Grids | None = None, above_known: bool = False,
               renormalise: bool = False) -> _Sums:
    """Sums over batch entries and query rows of one block ``[l, b, h, r, Lk]`` (rows ``start`` on):
    ``[l, h]`` arrays, the least and largest row sums and values ``[l, h]``, and whether a weight
    lies above the diagonal; also the weights summed over the rows (per key: received attention) and
    whether the real rows' sums are finite (a row holding NaN or infinity is not). ``keep`` (bool, the
    block's shape), ``real`` (bool, ``[l, b, h, r]``) and the ``[l, b, h]`` positions are the block's
    share of the masks. Masked keys
    and padded rows count as weight 0; only rows that are real and may attend somewhere are counted.

    Each row's sums are taken in the block's dtype (``work_dtype``) and added over rows in float64.
    Non-negative weights (distributions) take the quick way: a logarithm clamped at the smallest normal
    number (a zero weight adds 0 to the entropy), and the weight above the diagonal as one weighted
    sum (a sum of non-negative numbers is 0 only if each is); ``above_known`` (a weight above the
    diagonal was found in another block) skips that sum.

    ``renormalise``: the statistics are those of each counted row divided by its sum (maps whose rows are not
    distributions by design: value norms); the column sums and the weight held stay as the rows are."""
    grids = grids or _Grids()
    lk, nrows = block.shape[-1], block.shape[-2]
    i = np.arange(start, start + nrows)
    j = np.arange(lk)
    plain = keep is None and real is None
    live = np.ones(block.shape[:-1], dtype=bool) if real is None else np.broadcast_to(real, block.shape[:-1])
    if keep is not None:
        live = live & keep.any(axis=-1)
    # are these distributions? Judged on the rows as the file holds them (masked keys included)
    row_sum = block.sum(axis=-1).astype(np.float64)
    row_min = block.min(axis=-1)
    near = (np.abs(row_sum - 1.0) <= tol) | (np.abs(row_sum) <= tol)
    if bool(np.any(live & (row_min < 0))):
        negative = np.where(live, (block < 0).sum(axis=-1), 0)
    else:
        negative = np.zeros(live.shape, dtype=np.int64)
    extremes = {"sum_min": np.where(live, row_sum, np.inf).min(axis=(1, 3)),
                "sum_max": np.where(live, row_sum, -np.inf).max(axis=(1, 3)),
                "value_min": np.where(live, row_min.astype(np.float64), np.inf).min(axis=(1, 3))}
    if plain:
        x = block
        non_negative = not bool(np.any(row_min < 0))
    else:
        x = np.where(live[..., None] if keep is None else keep & live[..., None], block, block.dtype.type(0))
        non_negative = bool(x.min(initial=0) >= 0)
    columns = x.sum(axis=-2, dtype=np.float64 if x.dtype.itemsize > 4 else None)
    if renormalise:
        mass = x.sum(axis=-1, keepdims=True)
        x = np.divide(x, mass, out=np.zeros_like(x), where=mass > 0)
        near = np.ones_like(near)  # distributions now, each of them
    distance_grid, above_grid = grids(start, nrows, lk, x.dtype.type)
    if above_known:
        above = True
    elif non_negative:  # a sum of non-negative numbers is 0 only when each of them is
        above = bool(np.any(np.einsum("...k,...k->...", x, above_grid) > 0))
    else:
        above = bool(np.any((x != 0) & (j[None, :] > i[:, None])))
    if plain and bool(np.all(row_min > 0)):  # no weight is 0 (a softmax over every key): the logarithm as it is
        logs = np.log(x)
    elif non_negative:
        logs = np.maximum(x, _TINY[x.dtype.type])
        np.log(logs, out=logs)
    else:
        logs = np.log(x, out=np.zeros_like(x), where=x > 0)
    h = 0.0 - np.einsum("...k,...k->...", x, logs).astype(np.float64)
    n_full = np.broadcast_to(lk if keep is None else keep.sum(axis=-1), live.shape)
    n_causal = np.broadcast_to(np.minimum(i + 1, lk) if keep is None else
                               (keep & (j[None, :] <= i[:, None])).sum(axis=-1), live.shape)
    top = x.max(axis=-1) if keep is None else np.where(keep, x, -np.inf).max(axis=-1)
    later = row_rule("later", live, i, first_row[..., None], None)
    first = np.take_along_axis(x, np.broadcast_to(first_key[..., None, None], (*x.shape[:-1], 1)), axis=-1)[..., 0]
    last = np.take_along_axis(x, np.broadcast_to(last_key[..., None, None], (*x.shape[:-1], 1)), axis=-1)[..., 0]
    diagonal = np.zeros(live.shape)
    on = i < lk
    diagonal[..., on] = x[..., np.flatnonzero(on), i[on]]
    previous = np.zeros(live.shape)
    after = (i >= 1) & (i - 1 < lk)
    previous[..., after] = x[..., np.flatnonzero(after), i[after] - 1]

    def total(values: np.ndarray, where: np.ndarray | None = live) -> np.ndarray:
        values = values.astype(np.float64, copy=False)
        return (values if where is None or plain and where is live else np.where(where, values, 0.0)).sum(axis=(1, 3))

    normed = {name: normalised_entropy(h, n) for name, n in (("full", n_full), ("causal", n_causal))}
    sums = {
        "rows": live.sum(axis=(1, 3)).astype(np.float64),
        "later": later.sum(axis=(1, 3)).astype(np.float64),
        "entropy": total(h),
        "distance": total(np.einsum("...k,...k->...", x, distance_grid)),
        "max": total(top),
        "last": total(last),
        "diagonal": total(diagonal),
        "previous": total(previous, later),
        "first": total(first, later),
        "first_all": total(first),
        "norm_full": total(normed["full"]),
        "count_full": (live & (n_full > 1)).sum(axis=(1, 3)).astype(np.float64),
        "norm_causal": total(normed["causal"]),
        "count_causal": (live & (n_causal > 1)).sum(axis=(1, 3)).astype(np.float64),
        "off_rows": (live & ~near).sum(axis=(1, 3)).astype(np.float64),
        "negative": negative.sum(axis=(1, 3)).astype(np.float64),
        # the weight of the rows counted, as the file holds them (masked keys included): what the masks hide
        # of it is this less the columns' sums (``HeadPass.hidden``)
        "held": total(row_sum),
    }
    finite = bool(np.isfinite(row_sum if real is None else row_sum[np.broadcast_to(real, row_sum.shape)]).all())
    return _Sums(sums, extremes, above, columns, finite)


def _slabs(w: np.ndarray, chunk: int) -> Iterator[tuple[tuple[slice, slice, slice], int, np.ndarray]]:
    """((layer, batch, head) slices, first row, block ``[1, 1, h, r, Lk]`` in ``work_dtype``) over ``w``
    in pieces of about ``chunk`` values: several heads at a time when their maps are small, else a
    block of rows of one head."""
    layers, batches, heads, lq, lk = w.shape
    dtype = work_dtype(w.dtype)
    per_map = max(1, lq * lk)
    if per_map <= chunk:
        group = max(1, chunk // per_map)
        for li, bi in np.ndindex(layers, batches):
            for h0 in range(0, heads, group):
                h1 = min(h0 + group, heads)
                yield ((slice(li, li + 1), slice(bi, bi + 1), slice(h0, h1)), 0,
                       np.asarray(w[li:li + 1, bi:bi + 1, h0:h1], dtype=dtype))
                release_pages(w)
        return
    for (li, bi, hi), start, _, block in row_blocks(w, chunk, dtype):
        yield (slice(li, li + 1), slice(bi, bi + 1), slice(hi, hi + 1)), start, block[None, None, None]


def head_statistics(w: np.ndarray, keep: np.ndarray | None = None, chunk: int = CHUNK, *,
                    real_rows: np.ndarray | None = None, real_keys: np.ndarray | None = None,
                    stored: str | None = None) -> dict[str, np.ndarray]:
    """Per (layer, head) means over batch entries and query rows of ``w [L, B, H, Lq, Lk]``:

    * ``entropy`` (nats) and ``entropy_norm`` (divided by log n, n the keys a row may attend to:
      those ``keep`` keeps, and only j <= i when the weights are causal, i.e. hold nothing above the
      diagonal in the rows counted; rows with a single key to attend are left out of this mean);
    * ``distance``: mean attention distance, sum_j w_ij |i - j|;
    * ``diagonal``, ``previous`` (j = i - 1), ``first`` (the first real key, j = 0 without padding;
      the attention sink), ``last`` (the last real key, j = Lk - 1 without padding): mean weight on
      those keys, ``previous`` and ``first`` over the rows after the first real one;
      ``max``: mean of each row's largest weight.

    Masks, all broadcasting in the standard layout: ``keep`` ``[L, B, H, Lq, Lk]`` (masked keys count
    as weight 0), ``real_rows`` ``[L, B, H, Lq]`` (padded query rows are left out) and ``real_keys``
    ``[L, B, H, Lk]`` (where the first and last real keys are). Rows that are padding or fully masked
    are left out of every mean, so a padded batch entry has the statistics of its unpadded slice.

    Also per (layer, head): ``rows`` (rows counted), ``off_rows`` (of those, rows summing neither to 1
    nor to 0 within ``row_sum_tolerance(stored)``, ``stored`` the file's dtype), ``negative``
    (negative values in them), ``sum_min``,
    ``sum_max`` and ``value_min``; ``distributions(stats)`` sums them up. Returns arrays ``[L, H]``
    plus ``tag`` (an object array of short descriptions; all empty when the rows are not
    distributions). Inputs larger than ``chunk`` values are summarised a block at a time
    (``head_statistics_blocked``), with the same result.
    """
    return head_pass(w, keep, chunk, real_rows=real_rows, real_keys=real_keys, stored=stored).stats


def head_statistics_blocked(w: np.ndarray, keep: np.ndarray | None, chunk: int = CHUNK, *,
                            real_rows: np.ndarray | None = None, real_keys: np.ndarray | None = None,
                            stored: str | None = None) -> dict[str, np.ndarray]:
    """``head_statistics`` a block at a time: the same sums, in bounded memory."""
    return _head_pass(w, keep, real_rows, real_keys, _slabs(w, chunk), stored or w.dtype.name).stats


@dataclass
class HeadPass:
    """One pass over the weights (``head_pass``): the head statistics, and what the same reading gives
    for free."""

    stats: dict[str, np.ndarray]
    #: ``[L, B, H, Lk]``: each key's weights summed over the query rows counted (masked keys and padded
    #: rows as 0): the numerators of received attention (``attnviz.inspection.received``)
    columns: np.ndarray
    #: the real rows' sums are all finite; False when a row holds NaN or infinity (or its sum overflows:
    #: ``checks.all_finite`` tells which)
    finite: bool
    #: the weight of the rows counted (real rows that may attend somewhere), as the file holds them, and the
    #: part of it on keys the masks hide: weight a mask drops (``masks.hidden_weight_warning``)
    held: float = 0.0
    hidden: float = 0.0


def head_pass(w: np.ndarray, keep: np.ndarray | None = None, chunk: int = CHUNK, *,
              real_rows: np.ndarray | None = None, real_keys: np.ndarray | None = None,
              stored: str | None = None, threads: int | None = None, renormalise: bool = False) -> HeadPass:
    """``head_statistics`` (the same arguments), with the column sums and the finiteness of the rows
    found in the same reading of ``w``; its blocks ``threads`` at a time (default ``attnviz.threads``').
    ``renormalise``: the statistics (and tags) of each row divided by its sum (value-norm maps)."""
    if w.size > chunk:
        return _head_pass(w, keep, real_rows, real_keys, _slabs(w, chunk), stored or w.dtype.name, threads,
                          renormalise)
    return _head_pass(w, keep, real_rows, real_keys, [((slice(None),) * 3, 0, np.asarray(w, work_dtype(w.dtype)))],
                      stored or w.dtype.name, threads, renormalise)


def _head_pass(w: np.ndarray, keep: np.ndarray | None, real_rows: np.ndarray | None, real_keys: np.ndarray | None,
               blocks: Any, stored: str, threads: int | None = None, renormalise: bool = False) -> HeadPass:
    layers, batches, heads, lq, lk = w.shape
    lead = (layers, batches, heads)
    first_key, last_key = _first_last(real_keys, lead, lk)
    first_row, _ = _first_last(real_rows, lead, lq)
    full_keep = None if keep is None else np.broadcast_to(keep, w.shape)
    full_real = None if real_rows is None else np.broadcast_to(real_rows, w.shape[:-1])
    tol = row_sum_tolerance(stored)
    sums = {n: np.zeros((layers, heads)) for n in _SUMS}
    extremes = {"sum_min": np.full((layers, heads), np.inf), "sum_max": np.full((layers, heads), -np.inf),
                "value_min": np.full((layers, heads), np.inf)}
    columns = np.zeros((layers, batches, heads, lk))
    finite = True
    above = False
    grids = _Grids()
    found_above: list[bool] = []  # once a weight above the diagonal is found, no block need look for one

    def sums_of(item: tuple[Any, int, np.ndarray]) -> tuple[Any, _Sums]:
        sl, start, block = item
        span = slice(start, start + block.shape[-2])
        with np.errstate(all="ignore"):  # NaN or infinity in the weights: ``finite`` says so, the caller decides
            got = _head_sums(block, start, None if full_keep is None else full_keep[sl + (span,)],
                             None if full_real is None else full_real[sl + (span,)],
                             first_key[sl], last_key[sl], first_row[sl], tol, grids, bool(found_above),
                             renormalise)
        if got.above:
            found_above.append(True)
        return sl, got

    with np.errstate(all="ignore"):  # (each thread has its own error state)
        for sl, got in in_threads(sums_of, blocks, threads):
            where = (sl[0], sl[2])
            for name in _SUMS:
                sums[name][where] += got.sums[name]
            ext = got.extremes
            extremes["sum_min"][where] = np.minimum(extremes["sum_min"][where], ext["sum_min"])
            extremes["sum_max"][where] = np.maximum(extremes["sum_max"][where], ext["sum_max"])
            extremes["value_min"][where] = np.minimum(extremes["value_min"][where], ext["value_min"])
            columns[sl] += got.columns
            above = above or got.above
            finite = finite and got.finite
    rows = sums["rows"]
    with np.errstate(divide="ignore", invalid="ignore"):
        # each a mean over the rows of its rule; where no row is later (one-token inputs): first over every row
        # counted, previous 0
        counts = {"counted": rows, "later": sums["later"]}
        absent = {"previous": np.where(rows > 0, 0.0, np.nan),
                  "first": np.where(rows > 0, sums["first_all"] / rows, np.nan)}
        stats: dict[str, np.ndarray] = {}
        for name in ("entropy", "distance", "max", "last", "diagonal", "previous", "first"):
            n = counts[BY_NAME[name].rows]
            stats[name] = np.where(n > 0, sums[name] / n, absent.get(name, np.nan))
        kind = "full" if above else "causal"
        norm, count = sums[f"norm_{kind}"], sums[f"count_{kind}"]
        stats["entropy_norm"] = np.where(count > 0, norm / np.maximum(count, 1), np.where(rows > 0, 0.0, np.nan))
    stats["rows"] = rows
    stats["off_rows"] = sums["off_rows"]
    stats["negative"] = sums["negative"]
    stats.update(extremes)
    stats["causal"] = np.array(not above)  # nothing above the diagonal in the rows counted
    # Gu et al.'s sink per batch entry, from the first real key's column: what the sink tag reads
    stats["sink_rate"] = sink_share(columns, w.shape, first_key, keep, real_rows, lq == lk and not above)
    stats["tag"] = head_tags(stats)
    if not distributions(stats, tol).ok:
        stats["tag"][...] = ""
    held = float(np.sum(sums["held"]))
    hidden = max(0.0, held - float(columns.sum())) if keep is not None else 0.0
    return HeadPass(stats, columns, finite, held, hidden)


@dataclass
class Distributions:
    """Whether the rows examined are distributions (non-negative, each summing to 1, or 0 when fully
    masked), for the warning that the input may be raw scores or activations."""

    rows: int
    off_rows: int  # rows summing neither to 1 nor to 0 within tol
    negative: int  # negative values
    sum_min: float
    sum_max: float
    value_min: float
    tol: float

    @property
    def ok(self) -> bool:
        return self.off_rows == 0 and self.negative == 0

    def warning(self, source: str, tags: bool = True) -> str | None:
        """One line for stderr and the JSON document's ``warnings``, or None when all is well."""
        if self.ok:
            return None
        found = []
        if self.off_rows:
            found.append(f"{self.off_rows} of {self.rows} rows sum neither to 1 nor to 0 (within {self.tol:g})")
        if self.negative:
            found.append(f"{self.negative} value(s) are negative (the least {self.value_min:.4g})")
        return (f"{source} does not hold attention weights as distributions: {' and '.join(found)}; row sums "
                f"range from {self.sum_min:.4g} to {self.sum_max:.4g}. Raw scores or activations rather than "
                "attention weights?" + (" Pattern tags are left out." if tags else ""))


def distributions(stats: dict[str, np.ndarray], tol: float = ROW_SUM_TOL) -> Distributions:
    """The summary of ``head_statistics``' row checks over every head."""
    rows = int(np.sum(stats["rows"]))
    return Distributions(rows, int(np.sum(stats["off_rows"])), int(np.sum(stats["negative"])),
                         float(np.min(stats["sum_min"])) if rows else 0.0,
                         float(np.max(stats["sum_max"])) if rows else 0.0,
                         float(np.min(stats["value_min"])) if rows else 0.0, tol)


def row_distributions(w: np.ndarray, live: np.ndarray | None = None, tol: float = ROW_SUM_TOL) -> Distributions:
    """The same summary for an array held whole (``compare``), over the rows ``live`` marks."""
    sums = w.sum(axis=-1)
    live = np.ones(sums.shape, bool) if live is None else np.broadcast_to(live, sums.shape)
    near = (np.abs(sums - 1.0) <= tol) | (np.abs(sums) <= tol)
    counted = sums[live]
    return Distributions(int(live.sum()), int((live & ~near).sum()), int(((w < 0) & live[..., None]).sum()),
                         float(counted.min(initial=np.inf)) if counted.size else 0.0,
                         float(counted.max(initial=-np.inf)) if counted.size else 0.0,
                         float(np.where(live[..., None], w, np.inf).min(initial=np.inf)), tol)


def head_tags(stats: dict[str, np.ndarray]) -> np.ndarray:
    """The tags of exact weights' heads (the rules of ``attnviz.statistics.TAGS`` for ``weights``: sink,
    previous-token, diagonal, last-token, broad; the token tags follow where the tokens are known,
    ``attnviz.inspection.tokens``); ``[L, H]`` object array, empty where none."""
    from attnviz.inspection.tags import tag_heads

    return tag_heads(stats, WEIGHTS)


def sink_share(columns: np.ndarray, shape: tuple[int, ...], first_key: np.ndarray, keep: np.ndarray | None,
               real_rows: np.ndarray | None, causal: bool, epsilon: float = SINK_EPSILON) -> np.ndarray:
    """``[L, H]``: the share of batch entries in which each head is a sink (Gu et al. 2024: alpha, its mean weight on
    the first real key over every counted row that may see it, that key's own row included, above ``epsilon``;
    ``attnviz.inspection.summary.SinkRate`` of a summary), from the column sums of one pass (``columns [L, B, H,
    Lk]``) and the rows each key's column is over; NaN where no row sees the first key."""
    from attnviz.inspection.received import allowed_counts

    count = np.broadcast_to(allowed_counts(shape, keep, real_rows, causal), columns.shape)
    at = first_key[..., None]
    seen = np.take_along_axis(count, at, -1)[..., 0].astype(np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        alpha = np.where(seen > 0, np.take_along_axis(columns, at, -1)[..., 0] / np.maximum(seen, 1), np.nan)
    counted = np.isfinite(alpha)
    sinks = counted & (np.nan_to_num(alpha, nan=-1.0) > epsilon)
    n = counted.sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(n > 0, sinks.sum(axis=1) / np.maximum(n, 1), np.nan)


def map_row_stats(one: np.ndarray, keep: np.ndarray | None, chunk: int = CHUNK, renormalise: bool = False) -> Any:
    """Per-query statistics (``attnviz.stats.RowStats``) of one map ``[Lq, Lk]``, masked keys counted
    as weight 0, a block of rows at a time; with ``renormalise`` (value-norm maps) the entropies are those of
    each row divided by its sum, the rest (max, top-k, row sums) the map's own values."""
    from dataclasses import replace

    from attnviz.stats import RowStats, row_stats

    if renormalise:
        kept = np.asarray(one, dtype=np.float64) if keep is None else np.where(keep, np.asarray(one, np.float64), 0.0)
        total = kept.sum(axis=-1, keepdims=True)
        shares = map_row_stats(np.divide(kept, total, out=np.zeros_like(kept), where=total > 0), keep, chunk)
        own = map_row_stats(one, keep, chunk)
        return replace(own, entropy=shares.entropy, entropy_norm=shares.entropy_norm)

    if keep is None:
        return row_stats(one)
    lq, lk = one.shape
    step = max(1, chunk // max(lk, 1))
    full_keep = np.broadcast_to(keep, one.shape)
    parts = []
    for start in range(0, lq, step):
        rows = full_keep[start:start + step]
        block = np.where(rows, np.asarray(one[start:start + step], dtype=np.float64), 0.0)
        parts.append(row_stats(block, rows, chunk=max(block.size, 1)))
        release_pages(one)
    if len(parts) == 1:
        return parts[0]
    return RowStats(**{name: np.concatenate([getattr(p, name) for p in parts], axis=0)
                       for name in RowStats.__dataclass_fields__})



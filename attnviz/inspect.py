"""Inspecting attention weights a model saved: reading them into one layout, what each head does,
checks for CI, and comparing two sets of weights. NumPy only (no TensorFlow on this path).

Weights are held as ``[layers, batch, heads, Lq, Lk]``. By rank a file is read as ``[Lq, Lk]``,
``[heads, Lq, Lk]``, ``[batch, heads, Lq, Lk]`` or ``[layers, batch, heads, Lq, Lk]``; ``--layout``
names the axes otherwise (e.g. ``batch,q,k``). An ``.npz`` with one array per layer (as
``numpy.savez(f, *attentions)`` writes a Hugging Face ``output_attentions`` tuple: ``arr_0``,
``arr_1``, ...; or named keys, ordered naturally so that ``layer10`` follows ``layer9``) is stacked
along the layer axis.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from attnviz.errors import InputError, ShapeError, UsageError, shape_str
from attnviz.formats import listing
from attnviz.formats import natural_key as natural_key  # moved to attnviz.formats; importable from here
from attnviz.formats._base import memory_limit, size_str
from attnviz.io import StdinReader, open_spec, release_pages, validate_array

AXES = ("layer", "batch", "head", "q", "k")
ALIASES = {"l": "layer", "layers": "layer", "b": "batch", "h": "head", "heads": "head", "lq": "q", "query": "q",
           "t": "q", "lk": "k", "key": "k", "s": "k"}
DEFAULT_LAYOUTS = {2: ("q", "k"), 3: ("head", "q", "k"), 4: ("batch", "head", "q", "k"),
                   5: ("layer", "batch", "head", "q", "k")}


@dataclass
class Weights:
    """Attention weights in the layout ``[layers, batch, heads, Lq, Lk]``."""

    data: np.ndarray
    source: str
    layout: tuple[str, ...]  # the axes the file had, in its order
    file_shape: tuple[int, ...]
    paths: list[Path] = field(default_factory=list)
    keys: list[str] = field(default_factory=list)  # the .npz keys stacked as layers, if any
    #: the dtype the file stored the weights in (bfloat16 and float16 files are read as float32):
    #: how closely rows can sum to 1 depends on it
    stored_dtype: str = "float32"

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.data.shape)


def parse_layout(text: str | None, rank: int, source: str) -> tuple[str, ...]:
    if text is None:
        if rank not in DEFAULT_LAYOUTS:
            raise ShapeError(f"{source}: {rank} dimensions; attention weights have 2 to 5 ([layers, batch, heads, "
                             "Lq, Lk]); name them with --layout.")
        return DEFAULT_LAYOUTS[rank]
    names = tuple(ALIASES.get(t.strip().lower(), t.strip().lower()) for t in text.split(",") if t.strip())
    unknown = [n for n in names if n not in AXES]
    if unknown or len(set(names)) != len(names) or names[-2:] != ("q", "k"):
        raise UsageError(f"--layout {text!r}: name each axis once from layer, batch, head, q, k, ending with q,k.")
    if len(names) != rank:
        raise UsageError(f"--layout {text!r} names {len(names)} axes, but {source} has {rank}.")
    return names


def to_standard(arr: np.ndarray, layout: tuple[str, ...]) -> np.ndarray:
    """Reorder and pad ``arr`` (axes named by ``layout``) to ``[layer, batch, head, q, k]``."""
    order = [layout.index(a) for a in AXES if a in layout]
    arr = np.transpose(arr, order)
    present = [a for a in AXES if a in layout]
    shape = [arr.shape[present.index(a)] if a in present else 1 for a in AXES]
    return arr.reshape(shape)


def load_weights(spec: str, layout: str | None = None, stdin: StdinReader | None = None) -> Weights:
    """Read attention weights from a file (any rank), a file of one array per layer (.npz, .safetensors,
    HDF5, torch.save; named keys in natural order), or the matches of a key glob (``FILE:blocks.*.attn``),
    stacked as layers."""
    opened = open_spec(spec, stdin)
    keys = opened.layer_keys()
    source = opened.source
    if keys:
        if opened.key is not None:
            source = f"{opened.source}:{opened.key}"
        arrays = [opened.raw.get(k) for k in keys]
        shapes = {tuple(a.shape) for a in arrays}
        if len(shapes) != 1:
            listed = listing([f"{k} {shape_str(a.shape)}" for k, a in zip(keys, arrays)])
            raise ShapeError(f"{source}: the layers have different shapes ({listed}); inspect one with "
                             f"{opened.source}:KEY.")
        for k, a in zip(keys, arrays):
            validate_array(a, f"{opened.source}:{k}", allow_nonfinite=True)
        stacked = sum(a.size for a in arrays) * np.result_type(*arrays).itemsize
        if stacked > memory_limit():  # the layers are stacked in memory, even when each is memory-mapped
            raise InputError(f"{source}: the {len(keys)} layers stacked would take {size_str(stacked)} in memory, "
                             f"more than the {size_str(memory_limit())} attnviz allows (half the memory "
                             f"available); inspect fewer with {opened.source}:KEY or a narrower pattern, or save "
                             "them as one [layers, ...] .npy, which stays on disk.")
        arr = np.stack(arrays)
        stored = coarsest([opened.raw.stored.get(k, a.dtype.name) for k, a in zip(keys, arrays)])
        per_layer = parse_layout(layout, arr.ndim - 1, source)
        names: tuple[str, ...] = ("layer", *per_layer)
        if "layer" in per_layer:
            raise UsageError(f"--layout: the layers of {source} are its arrays; name the axes of one array.")
    else:
        loaded = opened.array(allow_nonfinite=True)
        arr = loaded.data
        stored = loaded.stored_dtype or arr.dtype.name
        names = parse_layout(layout, arr.ndim, source)
    if arr.shape[-1] == 0 or arr.shape[-2] == 0:
        raise InputError(f"{source}: empty attention maps (shape {shape_str(arr.shape)}).")
    data = to_standard(arr.astype(np.float32, copy=False) if arr.dtype.kind != "f" else arr, names)
    return Weights(data, source, names, tuple(arr.shape), [opened.path] if opened.path else [], keys, stored)


def standard_mask(w: Weights, keep: np.ndarray, source: str) -> np.ndarray:
    """A keep mask given in the file's layout (broadcasting against one map, one layer's arrays, or
    the whole file) in the standard layout ``[layers, batch, heads, Lq, Lk]``, kept as small as it
    came (its size-1 axes stay size 1; ``numpy.broadcast_to`` widens it where needed)."""
    from attnviz.masks import check_broadcast

    shape = w.file_shape[1:] if w.keys else w.file_shape
    layout = w.layout[1:] if w.keys else w.layout
    check_broadcast(keep, shape, source)
    return to_standard(keep.reshape((1,) * (len(shape) - keep.ndim) + keep.shape), layout)


# ---------------------------------------------------------------------------------------------------
# Masks and padding (inspect's --mask, --key-padding-mask, --check-mask; compare's masks)

#: with ``--mask-kind additive``, a bias at or below this masks its key: -inf, the -10000 of older
#: Hugging Face models and the dtype minimum of newer ones (exp underflows to exactly 0 long before)
ADDITIVE_MASKED = -1e4


@dataclass
class InspectMask:
    """What the masks of an ``inspect`` or ``compare`` run say, in the standard layout:

    * ``keep``: bool, broadcasts to ``[layers, batch, heads, Lq, Lk]``; None when every key may be attended;
    * ``real_keys``: bool, broadcasts to ``[layers, batch, heads, Lk]``: the keys some query row may
      attend. A key no query may attend is padding (the zeros of a ``[B, S]`` attention_mask or a
      key-padding mask; the padded columns of a causal ``[B, 1, T, S]`` mask). None: none is padding;
    * ``real_rows``: the same positions as query rows, ``[layers, batch, heads, Lq]``, when
      ``Lq == Lk`` (self-attention): a query at a padded position is padding too.

    ``finish`` works out the last two from ``keep`` once every mask is in.
    """

    keep: np.ndarray | None = None
    real_keys: np.ndarray | None = None
    real_rows: np.ndarray | None = None
    described: list[str] = field(default_factory=list)

    def __and__(self, other: InspectMask) -> InspectMask:
        keep = other.keep if self.keep is None else self.keep if other.keep is None else \
            np.logical_and(self.keep, other.keep)
        return InspectMask(keep, described=self.described + other.described)

    def finish(self, shape: tuple[int, ...]) -> InspectMask:
        """Padding from ``keep``, for weights of ``shape [L, B, H, Lq, Lk]``."""
        if self.keep is None:
            return self
        real = np.any(self.keep, axis=-2)
        if real.all():
            return InspectMask(self.keep, described=self.described)
        return InspectMask(self.keep, real, real if shape[-2] == shape[-1] else None, self.described)

    def batch(self, bi: int) -> InspectMask:
        """The mask of batch entry ``bi`` alone (the batch axis kept, of size 1)."""
        def entry(a: np.ndarray | None) -> np.ndarray | None:
            return None if a is None or a.shape[1] == 1 else a[:, bi:bi + 1]

        return InspectMask(entry(self.keep), entry(self.real_keys), entry(self.real_rows), self.described)

    def padded_rows(self, shape: tuple[int, ...]) -> int:
        """How many query rows of weights ``shape [L, B, H, Lq, Lk]`` are padding."""
        if self.real_rows is None:
            return 0
        return int(np.prod(shape[:-1])) - int(np.broadcast_to(self.real_rows, shape[:-1]).sum())


def additive_keep(loaded: Any) -> np.ndarray:
    """An additive mask (a float bias added to the scores) as a keep array: 0 and other biases keep,
    ``-inf`` and anything at or below ``ADDITIVE_MASKED`` masks."""
    bias = np.asarray(loaded.data, dtype=np.float64)
    if np.isnan(bias).any() or np.isposinf(bias).any():
        raise InputError(f"{loaded.source}: an additive mask may hold finite values and -inf only.")
    return bias > ADDITIVE_MASKED


def read_mask(w: Weights, loaded: Any, *, convention: str = "keep", kind: str = "bool", key_padding: bool = False,
              option: str = "--mask") -> InspectMask:
    """A mask file for the weights ``w``, in the standard layout. Its shapes:

    * ``[S]`` or ``[B, S]`` with ``key_padding`` (``--key-padding-mask``), or a 2-D ``[B, S]`` mask when
      the weights have ``B > 1`` batch entries and ``Lq != B``: a Hugging Face ``attention_mask``;
    * 4-D: Hugging Face's ``[batch, heads or 1, Lq or 1, Lk]``, whatever the file's layout;
    * anything else broadcasts against the file's maps as the file holds them (``standard_mask``).

    Call ``finish`` on the result (after combining it with other masks) for the padding it marks.
    """
    from attnviz.masks import boolean_keep

    keep = additive_keep(loaded) if kind == "additive" else boolean_keep(loaded, convention)
    layers, batches, heads, lq, lk = w.shape
    source = loaded.source
    attention_mask = keep.ndim == 2 and keep.shape == (batches, lk) and batches > 1
    if attention_mask and lq == batches and not key_padding:
        raise UsageError(f"{option} {source}: a [{batches}, {lk}] mask may be a Hugging Face attention_mask "
                         f"[batch, S] or a [Lq, Lk] mask here (batch = Lq = {lq}); give an attention_mask "
                         f"with --key-padding-mask, or a [Lq, Lk] mask as [1, {lq}, {lk}].")
    if key_padding or attention_mask:
        if keep.ndim not in (1, 2) or keep.shape[-1] != lk or (keep.ndim == 2 and keep.shape[0] not in (1, batches)):
            raise ShapeError(f"{option} {source}: a padding mask is [batch, Lk] = [{batches}, {lk}] or [{lk}] here; "
                             f"received {shape_str(keep.shape)} for weights {shape_str(w.shape)} "
                             "[layers, batch, heads, Lq, Lk].")
        std = keep.reshape(1, keep.shape[0] if keep.ndim == 2 else 1, 1, 1, lk)
        what = f"key padding {source}"
    elif keep.ndim == 4:
        try:
            fits = np.broadcast_shapes(keep.shape, (batches, heads, lq, lk)) == (batches, heads, lq, lk)
        except ValueError:
            fits = False
        if not fits:
            raise ShapeError(f"{option} {source}: a 4-D mask is read as [batch, heads or 1, Lq or 1, Lk] (Hugging "
                             f"Face); received {shape_str(keep.shape)}, expected one that broadcasts to "
                             f"{shape_str((batches, heads, lq, lk))}.")
        std = keep[None]
        what = f"mask {source}"
    else:
        std = standard_mask(w, keep, source)
        what = f"mask {source}"
    if kind == "additive":
        what += f" (additive: <= {ADDITIVE_MASKED:g} masks)"
    else:
        what += f" ({convention}: 1 = {'may attend' if convention == 'keep' else 'masked'})"
    if std.shape[-2] > 1 and np.array_equal(std, np.broadcast_to(std[..., :1, :], std.shape)):
        std = std[..., :1, :]  # the same for every query row (an expanded attention_mask): keep one
    return InspectMask(keep=std, described=[what])


def _first_last(real: np.ndarray | None, lead: tuple[int, ...], n: int) -> tuple[np.ndarray, np.ndarray]:
    """The first and last real position of each (layer, batch, head), ``[L, B, H]`` (0 and n - 1 when
    nothing is known, or nothing is real)."""
    if real is None:
        return np.zeros(lead, dtype=np.int64), np.full(lead, n - 1, dtype=np.int64)
    full = np.broadcast_to(real, (*lead, n))
    anything = full.any(axis=-1)
    first = np.where(anything, np.argmax(full, axis=-1), 0)
    last = np.where(anything, n - 1 - np.argmax(full[..., ::-1], axis=-1), n - 1)
    return first.astype(np.int64), last.astype(np.int64)


# ---------------------------------------------------------------------------------------------------
# What the heads do

HEAD_STATS = ("entropy", "entropy_norm", "distance", "diagonal", "previous", "first", "last", "max")
TAG_THRESHOLD = 0.5  # a pattern "dominates" when it takes at least half the mass on average
BROAD_THRESHOLD = 0.9  # normalised entropy at or above this: the head spreads its attention
#: how far from 1 (or 0, a fully masked row) a row of attention weights may sum (float16 files: 1e-2)
ROW_SUM_TOL = 1e-3


CHUNK = 2**22  # values handled at a time on large inputs (32 MiB in float64)


def row_blocks(w: np.ndarray, chunk: int = CHUNK) -> Iterator[tuple[tuple[int, ...], int, int, np.ndarray]]:
    """((layer, batch, head), first row, end row, float64 block) over ``w [L, B, H, Lq, Lk]`` in pieces
    of about ``chunk`` values: a memory-mapped file is read a block at a time."""
    lq, lk = w.shape[-2:]
    rows = max(1, chunk // max(lk, 1))
    for idx in np.ndindex(*w.shape[:-2]):
        for start in range(0, lq, rows):
            stop = min(start + rows, lq)
            yield idx, start, stop, np.asarray(w[idx][start:stop], dtype=np.float64)
            release_pages(w)


def _real_rows(rows: np.ndarray | None, shape: tuple[int, ...]) -> np.ndarray | None:
    return None if rows is None else np.broadcast_to(rows, shape[:-1])


def is_causal(w: np.ndarray, chunk: int = CHUNK) -> bool:
    """Nothing above the diagonal (top-left aligned), anywhere."""
    lk = w.shape[-1]
    for _, start, stop, block in row_blocks(w, chunk):
        above = np.arange(lk)[None, :] > np.arange(start, stop)[:, None]
        if np.any(block[above]):
            return False
    return True


#: the unit roundoff of each storage dtype (half an ulp at 1): rows of n weights rounded to it sum to 1
#: within this (times the sum, which is 1) however long they are
ROUNDOFF = {"float64": 2.0**-53, "float32": 2.0**-24, "float16": 2.0**-11, "bfloat16": 2.0**-8,
            "float8_e4m3fn": 2.0**-4, "float8_e5m2": 2.0**-3}


def coarsest(dtypes: list[str]) -> str:
    """The storage dtype with the largest roundoff among ``dtypes`` (integers count as float32)."""
    return max(dtypes, key=lambda d: ROUNDOFF.get(d, ROUNDOFF["float32"]), default="float32")


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
         "norm_full", "count_full", "norm_causal", "count_causal", "off_rows", "negative")


def _head_sums(block: np.ndarray, start: int, keep: np.ndarray | None, real: np.ndarray | None,
               first_key: np.ndarray, last_key: np.ndarray, first_row: np.ndarray,
               tol: float) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], bool]:
    """Sums over batch entries and query rows of one block ``[l, b, h, r, Lk]`` (rows ``start`` on):
    ``[l, h]`` arrays, the least and largest row sums and values ``[l, h]``, and whether a weight
    lies above the diagonal. ``keep`` (bool, the block's shape), ``real`` (bool,
    ``[l, b, h, r]``) and the ``[l, b, h]`` positions are the block's share of the masks. Masked keys
    and padded rows count as weight 0; only rows that are real and may attend somewhere are counted."""
    lk = block.shape[-1]
    i = np.arange(start, start + block.shape[-2])
    j = np.arange(lk)
    live = np.ones(block.shape[:-1], dtype=bool) if real is None else np.broadcast_to(real, block.shape[:-1])
    if keep is not None:
        live = live & keep.any(axis=-1)
    # are these distributions? Judged on the rows as the file holds them (masked keys included)
    row_sum = block.sum(axis=-1)
    near = (np.abs(row_sum - 1.0) <= tol) | (np.abs(row_sum) <= tol)
    negative = np.where(live, (block < 0).sum(axis=-1), 0)
    extremes = {"sum_min": np.where(live, row_sum, np.inf).min(axis=(1, 3)),
                "sum_max": np.where(live, row_sum, -np.inf).max(axis=(1, 3)),
                "value_min": np.where(live, block.min(axis=-1), np.inf).min(axis=(1, 3))}
    if keep is not None or real is not None:
        x = np.where(live[..., None] if keep is None else keep & live[..., None], block, 0.0)
    else:
        x = block
    above = bool(np.any((x != 0) & (j[None, :] > i[:, None])))
    logs = np.log(x, out=np.zeros_like(x), where=x > 0)
    h = 0.0 - np.einsum("...k,...k->...", x, logs)
    n_full = np.broadcast_to(lk if keep is None else keep.sum(axis=-1), live.shape)
    n_causal = np.broadcast_to(np.minimum(i + 1, lk) if keep is None else
                               (keep & (j[None, :] <= i[:, None])).sum(axis=-1), live.shape)
    top = x.max(axis=-1) if keep is None else np.where(keep, x, -np.inf).max(axis=-1)
    later = live & (i > first_row[..., None])
    first = np.take_along_axis(x, np.broadcast_to(first_key[..., None, None], (*x.shape[:-1], 1)), axis=-1)[..., 0]
    last = np.take_along_axis(x, np.broadcast_to(last_key[..., None, None], (*x.shape[:-1], 1)), axis=-1)[..., 0]
    diagonal = np.zeros(live.shape)
    on = i < lk
    diagonal[..., on] = x[..., np.flatnonzero(on), i[on]]
    previous = np.zeros(live.shape)
    after = (i >= 1) & (i - 1 < lk)
    previous[..., after] = x[..., np.flatnonzero(after), i[after] - 1]

    def total(values: np.ndarray, where: np.ndarray = live) -> np.ndarray:
        return np.where(where, values, 0.0).sum(axis=(1, 3))

    with np.errstate(divide="ignore", invalid="ignore"):
        normed = {name: np.where(n > 1, h / np.log(np.maximum(n, 2)), 0.0)
                  for name, n in (("full", n_full), ("causal", n_causal))}
    sums = {
        "rows": live.sum(axis=(1, 3)).astype(np.float64),
        "later": later.sum(axis=(1, 3)).astype(np.float64),
        "entropy": total(h),
        "distance": total(np.einsum("...k,...k->...", x, np.abs(i[:, None] - j[None, :]).astype(np.float64))),
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
    }
    return sums, extremes, above


def _slabs(w: np.ndarray, chunk: int) -> Iterator[tuple[tuple[slice, slice, slice], int, np.ndarray]]:
    """((layer, batch, head) slices, first row, float64 block ``[1, 1, h, r, Lk]``) over ``w`` in
    pieces of about ``chunk`` values: several heads at a time when their maps are small, else a
    block of rows of one head."""
    layers, batches, heads, lq, lk = w.shape
    per_map = max(1, lq * lk)
    if per_map <= chunk:
        group = max(1, chunk // per_map)
        for li, bi in np.ndindex(layers, batches):
            for h0 in range(0, heads, group):
                h1 = min(h0 + group, heads)
                yield ((slice(li, li + 1), slice(bi, bi + 1), slice(h0, h1)), 0,
                       np.asarray(w[li:li + 1, bi:bi + 1, h0:h1], dtype=np.float64))
                release_pages(w)
        return
    for (li, bi, hi), start, _, block in row_blocks(w, chunk):
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
    if w.size > chunk:
        return head_statistics_blocked(w, keep, chunk, real_rows=real_rows, real_keys=real_keys, stored=stored)
    return _head_statistics(w, keep, real_rows, real_keys, [((slice(None),) * 3, 0, np.asarray(w, np.float64))],
                            stored or w.dtype.name)


def head_statistics_blocked(w: np.ndarray, keep: np.ndarray | None, chunk: int = CHUNK, *,
                            real_rows: np.ndarray | None = None, real_keys: np.ndarray | None = None,
                            stored: str | None = None) -> dict[str, np.ndarray]:
    """``head_statistics`` a block at a time: the same sums, in bounded memory."""
    return _head_statistics(w, keep, real_rows, real_keys, _slabs(w, chunk), stored or w.dtype.name)


def _head_statistics(w: np.ndarray, keep: np.ndarray | None, real_rows: np.ndarray | None,
                     real_keys: np.ndarray | None,
                     blocks: Any, stored: str) -> dict[str, np.ndarray]:
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
    above = False
    for sl, start, block in blocks:
        span = slice(start, start + block.shape[-2])
        got, ext, up = _head_sums(block, start, None if full_keep is None else full_keep[sl + (span,)],
                                  None if full_real is None else full_real[sl + (span,)],
                                  first_key[sl], last_key[sl], first_row[sl], tol)
        where = (sl[0], sl[2])
        for name in _SUMS:
            sums[name][where] += got[name]
        extremes["sum_min"][where] = np.minimum(extremes["sum_min"][where], ext["sum_min"])
        extremes["sum_max"][where] = np.maximum(extremes["sum_max"][where], ext["sum_max"])
        extremes["value_min"][where] = np.minimum(extremes["value_min"][where], ext["value_min"])
        above = above or up
    rows = sums["rows"]
    with np.errstate(divide="ignore", invalid="ignore"):
        stats = {name: np.where(rows > 0, sums[name] / rows, np.nan)
                 for name in ("entropy", "distance", "max", "last", "diagonal")}
        later = sums["later"]
        stats["previous"] = np.where(later > 0, sums["previous"] / later, np.where(rows > 0, 0.0, np.nan))
        first_all = np.where(rows > 0, sums["first_all"] / rows, np.nan)
        stats["first"] = np.where(later > 0, sums["first"] / later, first_all)
        kind = "full" if above else "causal"
        norm, count = sums[f"norm_{kind}"], sums[f"count_{kind}"]
        stats["entropy_norm"] = np.where(count > 0, norm / np.maximum(count, 1), np.where(rows > 0, 0.0, np.nan))
    stats["rows"] = rows
    stats["off_rows"] = sums["off_rows"]
    stats["negative"] = sums["negative"]
    stats.update(extremes)
    stats["causal"] = np.array(not above)  # nothing above the diagonal in the rows counted
    stats["tag"] = head_tags(stats)
    if not distributions(stats, tol).ok:
        stats["tag"][...] = ""
    return stats


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
    """A short description where one pattern dominates: previous-token, first-token sink, diagonal,
    last-token; broad for near-uniform heads; empty otherwise."""
    names = {"previous": "previous-token", "first": "first-token sink", "diagonal": "diagonal",
             "last": "last-token"}
    shape = stats["entropy"].shape
    tags = np.empty(shape, dtype=object)
    for idx in np.ndindex(*shape):
        best = max(names, key=lambda k: stats[k][idx])
        if stats[best][idx] >= TAG_THRESHOLD:
            tags[idx] = names[best]
        elif stats["entropy_norm"][idx] >= BROAD_THRESHOLD:
            tags[idx] = "broad"
        else:
            tags[idx] = ""
    return tags


def map_row_stats(one: np.ndarray, keep: np.ndarray | None, chunk: int = CHUNK) -> Any:
    """Per-query statistics (``attnviz.stats.RowStats``) of one map ``[Lq, Lk]``, masked keys counted
    as weight 0, a block of rows at a time."""
    from attnviz.stats import RowStats, row_stats

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


# ---------------------------------------------------------------------------------------------------
# Checks (exit 3 when one fails); ``rows`` (bool, broadcasting to [L, B, H, Lq]) marks the real query
# rows: padded rows are skipped


@dataclass
class CheckResult:
    name: str
    passed: bool
    failures: int = 0  # rows or entries that fail
    worst: str = ""  # where and how much, for a person
    detail: dict[str, object] = field(default_factory=dict)  # the same for JSON

    def line(self) -> str:
        if self.passed:
            return f"{self.name}: passed"
        return f"{self.name}: FAILED, {self.failures} {self.detail.get('unit', 'entries')}; worst: {self.worst}"


def locate(index: Sequence[Any], names: Sequence[str] = ("layer", "batch", "head", "row", "column")) -> str:
    return ", ".join(f"{n} {int(i)}" for n, i in zip(names, index))


def check_finite(w: np.ndarray, chunk: int = CHUNK, rows: np.ndarray | None = None) -> CheckResult:
    count, first = 0, None
    real = _real_rows(rows, w.shape)
    for idx, start, stop, block in row_blocks(w, chunk):
        bad = ~np.isfinite(block)
        if real is not None:
            bad &= real[idx][start:stop, None]
        if bad.any():
            count += int(bad.sum())
            if first is None:
                r, c = np.unravel_index(int(np.argmax(bad)), bad.shape)
                first = (*idx, start + int(r), int(c))
    if first is None:
        return CheckResult("check-finite", True)
    return CheckResult("check-finite", False, count, f"{locate(first)} is {w[first]}",
                       {"unit": "entries", "index": list(first)})


def all_finite(w: np.ndarray, chunk: int = CHUNK, rows: np.ndarray | None = None) -> bool:
    if rows is None:
        return all(np.isfinite(block).all() for _, _, _, block in row_blocks(w, chunk))
    return check_finite(w, chunk, rows).passed


def check_rows(w: np.ndarray, atol: float, keep: np.ndarray | None = None,
               rows: np.ndarray | None = None) -> CheckResult:
    """Every real row that may attend somewhere sums to 1 within ``atol``."""
    sums = np.zeros(w.shape[:-1])
    for idx, start, stop, block in row_blocks(w):
        sums[idx][start:stop] = block.sum(axis=-1)
    live = np.ones(sums.shape, bool) if keep is None else np.broadcast_to(np.any(keep, axis=-1), sums.shape)
    if rows is not None:
        live = live & np.broadcast_to(rows, sums.shape)
    off = np.where(live, np.abs(sums - 1.0), 0.0)
    off = np.where(np.isnan(off), np.inf, off)
    bad = off > atol
    if not bad.any():
        return CheckResult("check-rows", True, detail={"atol": atol})
    worst = np.unravel_index(int(np.argmax(off)), off.shape)
    return CheckResult("check-rows", False, int(bad.sum()),
                       f"{locate(worst)} sums to {sums[worst]:.6g} (atol {atol:g})",
                       {"unit": "rows", "index": [int(i) for i in worst], "sum": float(sums[worst]), "atol": atol})


def check_masked(w: np.ndarray, keep: np.ndarray, atol: float, name: str, chunk: int = CHUNK,
                 rows: np.ndarray | None = None) -> CheckResult:
    """No weight above ``atol`` where ``keep`` is False (in the real rows)."""
    full_keep = np.broadcast_to(keep, w.shape)
    real = _real_rows(rows, w.shape)
    count, worst, worst_value = 0, None, -1.0
    for idx, start, stop, block in row_blocks(w, chunk):
        forbidden = ~full_keep[idx][start:stop]
        if real is not None:
            forbidden &= real[idx][start:stop, None]
        leak = np.where(forbidden, np.abs(np.nan_to_num(block, nan=np.inf)), 0.0)
        bad = leak > atol
        if bad.any():
            count += int(bad.sum())
            r, c = np.unravel_index(int(np.argmax(leak)), leak.shape)
            if leak[r, c] > worst_value:
                worst, worst_value = (*idx, start + int(r), int(c)), float(leak[r, c])
    if worst is None:
        return CheckResult(name, True, detail={"atol": atol})
    return CheckResult(name, False, count, f"{locate(worst)} has weight {w[worst]:.6g} on a masked position",
                       {"unit": "entries", "index": [int(i) for i in worst], "weight": float(w[worst]), "atol": atol})


# ---------------------------------------------------------------------------------------------------
# Comparing two sets of weights


def js_divergence(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """Jensen-Shannon divergence of each row in nats (0 to log 2), rows taken as given."""
    p = np.asarray(p, dtype=np.float64)
    q = np.asarray(q, dtype=np.float64)
    m = (p + q) / 2

    def kl(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(a > 0, a * np.log(np.where(a > 0, a, 1.0) / np.where(b > 0, b, 1.0)), 0.0).sum(axis=-1)

    return np.clip((kl(p, m) + kl(q, m)) / 2, 0.0, None)


@dataclass
class Comparison:
    diff: np.ndarray  # a - b (0 in padded rows)
    max_abs: float
    mean_abs: float
    js: np.ndarray  # per row [L, B, H, Lq]; NaN in padded rows
    argmax_agree: float  # fraction of rows whose argmax is the same
    worst_rows: list[dict[str, object]]
    js_mean: float = 0.0
    js_max: float = 0.0
    rows: int = 0  # the rows compared (padded rows are left out)
    padded_rows: int = 0
    distributions: tuple[Distributions, Distributions] | None = None  # of A and of B


def compare(a: np.ndarray, b: np.ndarray, worst: int = 5, rows: np.ndarray | None = None,
            keep: np.ndarray | None = None, stored: tuple[str, str] | None = None) -> Comparison:
    """Differences of ``a`` and ``b`` over the real query rows (``rows``, bool broadcasting to
    ``[L, B, H, Lq]``; every row when None). ``keep`` only tells which rows are fully masked (they
    are not asked to be distributions)."""
    a64 = np.asarray(a, dtype=np.float64)
    b64 = np.asarray(b, dtype=np.float64)
    real = np.ones(a64.shape[:-1], bool) if rows is None else np.broadcast_to(rows, a64.shape[:-1])
    diff = a64 - b64 if rows is None else np.where(real[..., None], a64 - b64, 0.0)
    absd = np.abs(diff)
    n = int(real.sum())
    js = np.where(real, js_divergence(a64, b64), np.nan)
    agree = (np.argmax(a64, axis=-1) == np.argmax(b64, axis=-1)) & real
    row_max = absd.max(axis=-1)
    order = np.argsort(np.where(real, -js, np.inf), axis=None, kind="stable")[:min(worst, n)]
    worst_rows = []
    for flat in order:
        idx = np.unravel_index(int(flat), js.shape)
        worst_rows.append({"index": [int(i) for i in idx], "where": locate(idx), "js": float(js[idx]),
                           "max_abs": float(row_max[idx]), "argmax_a": int(np.argmax(a64[idx])),
                           "argmax_b": int(np.argmax(b64[idx]))})
    live = real if keep is None else real & np.broadcast_to(np.any(keep, axis=-1), real.shape)
    tol = (row_sum_tolerance(stored[0] if stored else np.asarray(a).dtype),
           row_sum_tolerance(stored[1] if stored else np.asarray(b).dtype))
    return Comparison(diff, float(absd.max()) if n else 0.0,
                      float(absd.sum() / (n * a64.shape[-1])) if n else 0.0, js,
                      float(agree.sum() / n) if n else 1.0, worst_rows,
                      float(np.nanmean(js)) if n else 0.0, float(np.nanmax(js)) if n else 0.0, n,
                      real.size - n, (row_distributions(a64, live, tol[0]), row_distributions(b64, live, tol[1])))


def tolerance_check(a: np.ndarray, b: np.ndarray, atol: float, rtol: float,
                    rows: np.ndarray | None = None) -> CheckResult:
    """``|a - b| <= atol + rtol |b|`` everywhere (numpy.allclose's rule), padded rows aside."""
    a64 = np.asarray(a, dtype=np.float64)
    b64 = np.asarray(b, dtype=np.float64)
    excess = np.abs(a64 - b64) - (atol + rtol * np.abs(b64))
    if rows is not None:
        excess = np.where(np.broadcast_to(rows, a64.shape[:-1])[..., None], excess, -np.inf)
    bad = excess > 0
    if not bad.any():
        return CheckResult("tolerance", True, detail={"atol": atol, "rtol": rtol})
    worst = np.unravel_index(int(np.argmax(excess)), excess.shape)
    return CheckResult("tolerance", False, int(bad.sum()),
                       f"{locate(worst)}: {a64[worst]:.6g} vs {b64[worst]:.6g} (atol {atol:g}, rtol {rtol:g})",
                       {"unit": "entries", "index": [int(i) for i in worst], "a": float(a64[worst]),
                        "b": float(b64[worst]), "atol": atol, "rtol": rtol})

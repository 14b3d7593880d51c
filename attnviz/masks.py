"""Masks: one internal form, a boolean *keep* array (True = may attend) that broadcasts to the
weights' shape ``[..., Lq, Lk]``, plus an optional additive float bias.

What users bring, and how it becomes that form:

* ``--mask FILE`` with ``--mask-convention keep`` (default; 1 = may attend, as Keras
  ``attention_mask`` and PyTorch SDPA boolean masks) or ``block`` (1 = masked, as the TensorFlow
  tutorial's ``mask * -1e9``). It broadcasts against ``[..., Lq, Lk]`` the NumPy way (aligned on
  the right), so a 1-D ``[Lk]`` mask masks keys for every query.
* ``--mask FILE --mask-kind additive``: a float bias added to the scores (0 keeps, ``-inf`` masks;
  PyTorch float ``attn_mask``, ALiBi). ``-inf`` entries become part of the keep mask.
* ``--key-padding-mask FILE``: ``[..., Lk]`` whose leading dimensions are the *batch* dimensions
  (aligned on the left, as Hugging Face ``attention_mask [B, S]``), applied to every head and query.
* ``--causal``: ``keep[i, j] = j <= i`` (top-left aligned when Lq != Lk, as Keras and PyTorch), or
  with ``--causal-align bottom-right`` ``j <= i + (Lk - Lq)`` (GPT-2 / KV-cache).

NumPy only: masks are checked and combined before TensorFlow is imported.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from attnviz.errors import InputError, ShapeError
from attnviz.io import Loaded, shape_str


@dataclass
class Mask:
    """The combined mask of a run, compute or inspection: one form for the whole package.

    * ``keep`` (bool) and ``bias`` (float, finite: its -inf entries have moved into ``keep``) broadcast
      to the weights' shape; None when nothing is masked or biased;
    * ``causal``: a causal mask not built yet, ``(Lq, Lk, align)``: for long inputs, where [Lq, Lk]
      booleans would take gigabytes, it is made a block of query rows at a time (``rows``), or whole
      (``materialized``);
    * for weights a model saved (``attnviz.inspection``, standard layout ``[layers, batch, heads, Lq, Lk]``):
      ``real_keys`` (bool, broadcasts to ``[layers, batch, heads, Lk]``), the keys some query row may
      attend; a key no query may attend is padding (the zeros of a ``[B, S]`` attention_mask or a
      key-padding mask; the padded columns of a causal ``[B, 1, T, S]`` mask); and ``real_rows``, the
      same positions as query rows ``[layers, batch, heads, Lq]`` when ``Lq == Lk`` (self-attention): a
      query at a padded position is padding too. ``with_padding`` works them out from ``keep`` once
      every mask is in. None: nothing is padding.
    """

    keep: np.ndarray | None = None
    bias: np.ndarray | None = None
    described: list[str] = field(default_factory=list)  # what went into it, for reports
    causal: tuple[int, int, str] | None = None
    real_keys: np.ndarray | None = None
    real_rows: np.ndarray | None = None
    #: windows, chunks and position biases of a model (``Positional``), built a block of rows at a time
    positional: Positional | None = None

    def is_empty(self) -> bool:
        return self.keep is None and self.bias is None and self.causal is None and self.positional is None

    def full_keep(self, shape: tuple[int, ...]) -> np.ndarray | None:
        """``keep`` broadcast to ``shape`` (a read-only view), or None when nothing is masked."""
        return None if self.keep is None else np.broadcast_to(self.keep, shape)

    def materialized(self) -> Mask:
        """The same mask with a deferred causal mask built into ``keep``."""
        if self.causal is None and self.positional is None:
            return self
        keep, bias = self.keep, self.bias
        if self.causal is not None:
            lq, lk, align = self.causal
            causal = causal_keep(lq, lk, align)
            keep = causal if keep is None else np.logical_and(keep, causal)
        if self.positional is not None:
            keep, bias = self.positional.add_to(keep, bias, 0, self.positional.lq)
        return Mask(keep, bias, self.described)

    def rows(self, start: int, stop: int, lq: int) -> Mask:
        """The mask of query rows ``start:stop`` (of ``lq``), deferred causal and positional masks included."""
        keep, bias = _row_slice(self.keep, lq, start, stop), _row_slice(self.bias, lq, start, stop)
        if self.causal is not None:
            causal = causal_keep(lq, self.causal[1], self.causal[2], start, stop)
            keep = causal if keep is None else np.logical_and(keep, causal)
        if self.positional is not None:
            keep, bias = self.positional.add_to(keep, bias, start, stop)
        return Mask(keep, bias, self.described)

    def __and__(self, other: Mask) -> Mask:
        """Both masks: a position is kept when both keep it; biases add."""
        keep = other.keep if self.keep is None else self.keep if other.keep is None else \
            np.logical_and(self.keep, other.keep)
        bias = other.bias if self.bias is None else self.bias if other.bias is None else self.bias + other.bias
        assert self.positional is None or other.positional is None, "one positional mask per run"
        return Mask(keep, bias, self.described + other.described,
                    positional=self.positional if self.positional is not None else other.positional)

    def with_padding(self, shape: tuple[int, ...]) -> Mask:
        """Padding from ``keep`` (``real_keys``, ``real_rows``), for weights of ``shape [L, B, H, Lq, Lk]``."""
        if self.keep is None:
            return self
        real = np.any(self.keep, axis=-2)
        if real.all():
            return Mask(self.keep, self.bias, self.described, self.causal)
        return Mask(self.keep, self.bias, self.described, self.causal, real_keys=real,
                    real_rows=real if shape[-2] == shape[-1] else None)

    def batch(self, bi: int) -> Mask:
        """The mask of batch entry ``bi`` alone of weights ``[L, B, H, Lq, Lk]`` (the batch axis kept, size 1)."""
        def entry(a: np.ndarray | None) -> np.ndarray | None:
            return None if a is None or a.shape[1] == 1 else a[:, bi:bi + 1]

        return Mask(entry(self.keep), entry(self.bias), self.described, self.causal, real_keys=entry(self.real_keys),
                    real_rows=entry(self.real_rows))

    def padded_rows(self, shape: tuple[int, ...]) -> int:
        """How many query rows of weights ``shape [L, B, H, Lq, Lk]`` are padding."""
        if self.real_rows is None:
            return 0
        return int(np.prod(shape[:-1])) - int(np.broadcast_to(self.real_rows, shape[:-1]).sum())


@dataclass(frozen=True)
class Positional:
    """What a model adds to its scores by position alone, for weights ``[..., H, Lq, Lk]`` whose query row
    ``i`` sits at key position ``i + offset`` (``Lk - Lq``: a block of queries at the end of its keys):

    * ``band (left, right)``: key ``j`` visible from query position ``p`` when ``-right <= p - j <= left``
      (transformers' causal sliding window ``W`` is ``(W - 1, 0)``; ModernBERT's local window ``(w, w)``);
    * ``chunk``: ``p // C == j // C``, positions counted from the first real key of each sequence
      (``left_padding``, ``[..., 1, 1]`` aligned with the batch axes) as transformers does;
    * ``alibi``: slopes ``[H]``, bias ``slope (j - p)``; with ``alibi_keys`` (Falcon) ``bf16(slope (j - left
      padding)) * alibi_scale``, slopes and products rounded to bfloat16 and scaled with the scores, as Falcon;
    * ``relative``: T5's ``(table [buckets, H], buckets, max_distance, bidirectional)``, bias
      ``table[bucket(j - p), h]``.

    Built for a block of query rows at a time (``add_to``), so long inputs never hold ``[H, Lq, Lk]`` whole.
    """

    lq: int
    lk: int
    offset: int = 0
    band: tuple[int, int] | None = None
    chunk: int | None = None
    left_padding: np.ndarray | None = None
    alibi: np.ndarray | None = None
    alibi_keys: bool = False
    alibi_scale: float = 1.0
    relative: tuple[np.ndarray, int, int, bool] | None = None

    @property
    def has_bias(self) -> bool:
        return self.alibi is not None or self.relative is not None

    def add_to(self, keep: np.ndarray | None, bias: np.ndarray | None, start: int,
               stop: int) -> tuple[np.ndarray | None, np.ndarray | None]:
        """``keep`` and ``bias`` of query rows ``start:stop`` with this mask's rows put in."""
        from attnviz.positional import t5_buckets

        p = np.arange(start, stop)[:, None] + self.offset
        j = np.arange(self.lk)[None, :]
        keeps = [] if keep is None else [keep]
        if self.band is not None:
            left, right = self.band
            keeps.append((p - j <= left) & (j - p <= right))
        shift = 0 if self.left_padding is None else self.left_padding
        if self.chunk is not None:
            keeps.append((p - shift) // self.chunk == (j - shift) // self.chunk)
        if len(keeps) > 1:
            keep = keeps[0]
            for other in keeps[1:]:
                keep = np.logical_and(keep, other)
        elif keeps:
            keep = keeps[0]
        extra = None
        if self.alibi is not None and self.alibi_keys:
            from attnviz.positional import bfloat16_round

            slopes = bfloat16_round(self.alibi.astype(np.float32))[:, None, None]  # Falcon: slopes.bfloat16()
            keys = np.maximum(np.asarray(j - shift), 0).astype(np.float32)  # [..., 1, Lk]
            extra = bfloat16_round(slopes * keys)  # [..., H, 1, Lk]
            extra = (extra * np.float32(self.alibi_scale)).astype(np.float32)
        elif self.alibi is not None:
            extra = self.alibi.astype(np.float64)[:, None, None] * (j - p)[None].astype(np.float64)
        if self.relative is not None:
            table, buckets, distance, bidirectional = self.relative
            rel = np.moveaxis(table[t5_buckets(j - p, bidirectional, buckets, distance)], -1, 0)
            extra = rel if extra is None else extra + rel
        if extra is not None:
            bias = extra if bias is None else bias + extra
        return keep, bias


def _row_slice(arr: np.ndarray | None, lq: int, start: int, stop: int) -> np.ndarray | None:
    """Rows ``start:stop`` of a mask or bias that broadcasts to ``[..., Lq, Lk]``."""
    if arr is None or arr.ndim < 2 or arr.shape[-2] != lq:
        return arr
    return arr[..., start:stop, :]


def boolean_keep(loaded: Loaded, convention: str) -> np.ndarray:
    """A 0/1 or boolean mask file as a keep array."""
    arr = loaded.data
    if arr.dtype != np.bool_:
        values = np.unique(arr)
        odd = values[(values != 0) & (values != 1)]
        if odd.size:
            raise InputError(
                f"{loaded.source}: a boolean mask holds only 0 and 1, but this one holds "
                f"{odd[0]!r}; for a float bias added to the scores use --mask-kind additive."
            )
        arr = arr != 0
    return ~arr if convention == "block" else arr


def causal_keep(lq: int, lk: int, align: str = "top-left", start: int = 0, stop: int | None = None) -> np.ndarray:
    """``[Lq, Lk]`` keep mask (rows ``start:stop``): ``j <= i`` (top-left) or ``j <= i + Lk - Lq``
    (bottom-right)."""
    offset = 0 if align == "top-left" else lk - lq
    rows = np.arange(start, lq if stop is None else stop)
    return np.arange(lk)[None, :] <= (rows[:, None] + offset)


#: past this many [Lq, Lk] cells a causal mask is built a block of rows at a time (16M = 16 MiB of bools)
DEFER_CAUSAL = 2**24


def key_padding_keep(loaded: Loaded, convention: str, weights_shape: tuple[int, ...],
                     full_shape: tuple[int, ...] | None = None) -> np.ndarray:
    """``[*batch, Lk]`` key-padding mask, aligned with the weights' leading dimensions from the left
    (``full_shape``: the weights' real shape, for the message, when ``weights_shape`` has no head axis)."""
    keep = boolean_keep(loaded, convention)
    lead = weights_shape[:-2]
    lk = weights_shape[-1]
    if keep.shape[-1] != lk or keep.ndim - 1 > len(lead):
        raise ShapeError(
            f"{loaded.source}: a key-padding mask has shape [*batch, Lk] = [..., {lk}] with at most "
            f"{len(lead)} batch dimension(s) here; received {shape_str(keep.shape)} for weights "
            f"{shape_str(full_shape or weights_shape)}."
        )
    fill = len(lead) - (keep.ndim - 1)
    return keep.reshape(keep.shape[:-1] + (1,) * fill + (1, lk))


def check_broadcast(arr: np.ndarray, weights_shape: tuple[int, ...], source: str,
                    full_shape: tuple[int, ...] | None = None, forms: str = "") -> None:
    """A mask may repeat over the weights' dimensions but never enlarge them.

    ``full_shape``: the weights' real shape when masks are checked against a shape without a head
    axis (multi-head); the message then states both and ``forms``, the shapes this command takes."""
    try:
        ok = np.broadcast_shapes(arr.shape, weights_shape) == tuple(weights_shape)
    except ValueError:
        ok = False
    if not ok:
        if full_shape is not None and forms:
            raise ShapeError(
                f"{source}: mask of shape {shape_str(arr.shape)} does not fit the weights {shape_str(full_shape)}; "
                f"{forms}"
            )
        raise ShapeError(
            f"{source}: mask of shape {shape_str(arr.shape)} does not broadcast to the weights' shape "
            f"{shape_str(weights_shape)} ([..., Lq, Lk]); a 1-D [Lk] mask applies to every query."
        )


def build_mask(
    weights_shape: tuple[int, ...],
    *,
    mask: Loaded | None = None,
    convention: str = "keep",
    kind: str = "bool",
    key_padding: Loaded | None = None,
    causal: bool = False,
    causal_align: str = "top-left",
    mask_shape: tuple[int, ...] | None = None,
) -> Mask:
    """Combine every mask a user gave into one ``Mask`` (an empty one when none was given).

    ``mask_shape``: when the weights have an axis at -3 that masks need not have (multi-head weights
    ``[B, N, T, S]``), a mask of lower rank than the weights is read against ``mask_shape``
    (``[B, T, S]``, as Keras ``attention_mask``) and the axis is inserted at -3 afterwards; a mask of
    the weights' full rank is read against the weights themselves (Hugging Face's 4-D
    ``[B, 1, 1, S]``, ``[B, 1, T, S]``, ``[B, N, T, S]``). A key-padding mask ``[B, S]`` aligns with
    the batch dimensions.
    """
    result = Mask()
    keeps: list[np.ndarray] = []
    full = tuple(weights_shape)
    forms = ""
    if mask_shape is not None:
        b = "B, " * (len(mask_shape) - 2)
        keras = f"[{b}T, S] (Keras attention_mask), " if b else ""
        forms = (f"a mask takes the form {keras}[S] or [T, S] for every head, or one with the weights' head axis "
                 f"[{b}1, 1, S], [{b}1, T, S], [{b}N, T, S] (Hugging Face 4-D); 1 broadcasts.")

    def against(arr: np.ndarray) -> tuple[tuple[int, ...], bool]:
        """The shape a mask array is checked against, and whether the -3 axis is to be inserted."""
        if mask_shape is not None and arr.ndim < len(full):
            return tuple(mask_shape), arr.ndim >= 3
        return full, False

    if mask is not None:
        if kind == "additive":
            bias = mask.data.astype(np.float64) if mask.data.dtype.kind != "f" else mask.data
            shape, insert = against(bias)
            check_broadcast(bias, shape, mask.source, full, forms)
            if np.isnan(bias).any() or np.isposinf(bias).any():
                raise InputError(f"{mask.source}: an additive mask may hold finite values and -inf only.")
            neg_inf = np.isneginf(bias)
            if insert:
                bias, neg_inf = np.expand_dims(bias, -3), np.expand_dims(neg_inf, -3)
            if neg_inf.any():
                keeps.append(~neg_inf)
                bias = np.where(neg_inf, 0.0, bias)
            result.bias = bias
            result.described.append(f"additive bias {mask.source}")
        else:
            keep = boolean_keep(mask, convention)
            shape, insert = against(keep)
            check_broadcast(keep, shape, mask.source, full, forms)
            keeps.append(np.expand_dims(keep, -3) if insert else keep)
            result.described.append(f"mask {mask.source} ({convention}: 1 = "
                                    f"{'may attend' if convention == 'keep' else 'masked'})")
    if key_padding is not None:
        shape = tuple(mask_shape) if mask_shape is not None else full
        keep = key_padding_keep(key_padding, convention, shape, full)
        check_broadcast(keep, shape, key_padding.source, full, forms)
        keeps.append(np.expand_dims(keep, -3) if mask_shape is not None and keep.ndim >= 3 else keep)
        result.described.append(f"key padding {key_padding.source}")
    if causal:
        lq, lk = weights_shape[-2], weights_shape[-1]
        if lq * lk > DEFER_CAUSAL:
            result.causal = (lq, lk, causal_align)  # [Lq, Lk]: broadcasts over every leading axis
        else:
            keeps.append(causal_keep(lq, lk, causal_align))
        result.described.append(f"causal ({causal_align})")
    if keeps:
        combined = keeps[0]
        for k in keeps[1:]:
            combined = np.logical_and(combined, k)
        result.keep = combined
    return result


def fully_masked_rows(mask: Mask | np.ndarray | None, weights_shape: tuple[int, ...]) -> np.ndarray:
    """Index tuples ``[n, rank-1]`` of the query rows in which no key may be attended (a deferred
    causal mask is built a block of rows at a time)."""
    if isinstance(mask, Mask):
        if mask.causal is None:
            return fully_masked_rows(mask.keep, weights_shape)
        lq, lk = weights_shape[-2:]
        step = max(1, DEFER_CAUSAL // max(1, lk * max(1, int(np.prod(weights_shape[:-2])))))
        found = []
        for start in range(0, lq, step):
            stop = min(start + step, lq)
            block = mask.rows(start, stop, lq).keep
            assert block is not None  # it holds the causal rows at least
            dead = ~np.broadcast_to(block, (*weights_shape[:-2], stop - start, lk)).any(axis=-1)
            where = np.argwhere(dead)
            where[:, -1] += start
            found.append(where)
        rows = np.concatenate(found) if found else np.zeros((0, len(weights_shape) - 1), dtype=np.int64)
        return rows[np.lexsort(rows.T[::-1])] if len(rows) else rows  # the order np.argwhere gives
    if mask is None:
        return np.zeros((0, len(weights_shape) - 1), dtype=np.int64)
    return np.argwhere(~np.broadcast_to(mask, weights_shape).any(axis=-1))


def describe_rows(rows: np.ndarray, limit: int = 8) -> str:
    """``rows 1, 3`` or ``rows (0, 1), (1, 2)`` for leading dimensions; long lists are cut."""
    if rows.shape[1] == 1:
        items = [str(int(r[0])) for r in rows[:limit]]
    else:
        items = ["(" + ", ".join(str(int(i)) for i in r) + ")" for r in rows[:limit]]
    more = f" and {len(rows) - limit} more" if len(rows) > limit else ""
    return ", ".join(items) + more

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
    """The combined mask of a run. ``keep`` and ``bias`` broadcast to the weights' shape."""

    keep: np.ndarray | None = None  # bool
    bias: np.ndarray | None = None  # float, finite (its -inf entries have moved into keep)
    described: list[str] = field(default_factory=list)  # what went into it, for reports

    def is_empty(self) -> bool:
        return self.keep is None and self.bias is None

    def full_keep(self, shape: tuple[int, ...]) -> np.ndarray | None:
        """``keep`` broadcast to ``shape`` (a read-only view), or None when nothing is masked."""
        return None if self.keep is None else np.broadcast_to(self.keep, shape)


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


def causal_keep(lq: int, lk: int, align: str = "top-left") -> np.ndarray:
    """``[Lq, Lk]`` keep mask: ``j <= i`` (top-left) or ``j <= i + Lk - Lq`` (bottom-right)."""
    offset = 0 if align == "top-left" else lk - lq
    return np.arange(lk)[None, :] <= (np.arange(lq)[:, None] + offset)


def key_padding_keep(loaded: Loaded, convention: str, weights_shape: tuple[int, ...]) -> np.ndarray:
    """``[*batch, Lk]`` key-padding mask, aligned with the weights' leading dimensions from the left."""
    keep = boolean_keep(loaded, convention)
    lead = weights_shape[:-2]
    lk = weights_shape[-1]
    if keep.shape[-1] != lk or keep.ndim - 1 > len(lead):
        raise ShapeError(
            f"{loaded.source}: a key-padding mask has shape [*batch, Lk] = [..., {lk}] with at most "
            f"{len(lead)} batch dimension(s) here; received {shape_str(keep.shape)} for weights "
            f"{shape_str(weights_shape)}."
        )
    fill = len(lead) - (keep.ndim - 1)
    return keep.reshape(keep.shape[:-1] + (1,) * fill + (1, lk))


def check_broadcast(arr: np.ndarray, weights_shape: tuple[int, ...], source: str) -> None:
    """A mask may repeat over the weights' dimensions but never enlarge them."""
    try:
        ok = np.broadcast_shapes(arr.shape, weights_shape) == tuple(weights_shape)
    except ValueError:
        ok = False
    if not ok:
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

    ``mask_shape``: when the weights have a head axis that masks do not (multi-head weights
    ``[B, N, T, S]`` take masks ``[B, T, S]``, as Keras ``attention_mask``), masks are checked
    against ``mask_shape`` and the head axis is inserted at -3 afterwards.
    """
    if mask_shape is not None:
        inner = build_mask(mask_shape, mask=mask, convention=convention, kind=kind, key_padding=key_padding,
                           causal=causal, causal_align=causal_align)
        inner.keep = _insert_head_axis(inner.keep)
        inner.bias = _insert_head_axis(inner.bias)
        return inner
    result = Mask()
    keeps: list[np.ndarray] = []
    if mask is not None:
        if kind == "additive":
            bias = mask.data.astype(np.float64) if mask.data.dtype.kind != "f" else mask.data
            check_broadcast(bias, weights_shape, mask.source)
            if np.isnan(bias).any() or np.isposinf(bias).any():
                raise InputError(f"{mask.source}: an additive mask may hold finite values and -inf only.")
            neg_inf = np.isneginf(bias)
            if neg_inf.any():
                keeps.append(~neg_inf)
                bias = np.where(neg_inf, 0.0, bias)
            result.bias = bias
            result.described.append(f"additive bias {mask.source}")
        else:
            keep = boolean_keep(mask, convention)
            check_broadcast(keep, weights_shape, mask.source)
            keeps.append(keep)
            result.described.append(f"mask {mask.source} ({convention}: 1 = "
                                    f"{'may attend' if convention == 'keep' else 'masked'})")
    if key_padding is not None:
        keep = key_padding_keep(key_padding, convention, weights_shape)
        check_broadcast(keep, weights_shape, key_padding.source)
        keeps.append(keep)
        result.described.append(f"key padding {key_padding.source}")
    if causal:
        keeps.append(causal_keep(weights_shape[-2], weights_shape[-1], causal_align))
        result.described.append(f"causal ({causal_align})")
    if keeps:
        combined = keeps[0]
        for k in keeps[1:]:
            combined = np.logical_and(combined, k)
        result.keep = combined
    return result


def _insert_head_axis(arr: np.ndarray | None) -> np.ndarray | None:
    if arr is None or arr.ndim < 3:
        return arr  # [T, S] or [S] broadcasts over batch and heads as it is
    return np.expand_dims(arr, -3)


def fully_masked_rows(keep: np.ndarray | None, weights_shape: tuple[int, ...]) -> np.ndarray:
    """Index tuples ``[n, rank-1]`` of the query rows in which no key may be attended."""
    if keep is None:
        return np.zeros((0, len(weights_shape) - 1), dtype=np.int64)
    rows = ~np.broadcast_to(keep, weights_shape).any(axis=-1)
    return np.argwhere(rows)


def describe_rows(rows: np.ndarray, limit: int = 8) -> str:
    """``rows 1, 3`` or ``rows (0, 1), (1, 2)`` for leading dimensions; long lists are cut."""
    if rows.shape[1] == 1:
        items = [str(int(r[0])) for r in rows[:limit]]
    else:
        items = ["(" + ", ".join(str(int(i)) for i in r) + ")" for r in rows[:limit]]
    more = f" and {len(rows) - limit} more" if len(rows) > limit else ""
    return ", ".join(items) + more

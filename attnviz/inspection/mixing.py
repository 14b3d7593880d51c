"""Each layer's token-mixing map, the step that rollout and attention flow are built from: a layer's
heads combined into one map (``combine_heads``), its lowest entries dropped (``discard_lowest``,
vit-explain), the residual connection added as ``A' = (1 - r) A + r I`` with the rows renormalised
(``with_residual``); only the real tokens when some are padded (``real_heads``). Also ``Rollout``,
the result of every method of ``attnviz rollout`` for one batch entry. NumPy only.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from attnviz.choices import HEAD_COMBINE
from attnviz.io import release_pages


def combine_heads(maps: np.ndarray, how: str = "mean") -> np.ndarray:
    """``maps [heads, Lq, Lk]`` combined into one ``[Lq, Lk]`` map in float64."""
    values = np.asarray(maps, dtype=np.float64)
    if how == "max":
        return values.max(axis=0)
    if how == "min":
        return values.min(axis=0)
    if how != "mean":
        raise ValueError(f"heads must be one of {HEAD_COMBINE}, not {how!r}")
    return values.mean(axis=0)


def discard_lowest(a: np.ndarray, ratio: float) -> np.ndarray:
    """vit-explain's discard (``vit_rollout.py``): of the ``L x L`` entries of the combined map ``a``, the
    ``int(L * L * ratio)`` lowest (``topk(largest=False)`` of the flattened map; ties: the lower index
    first) are set to 0, except the flat index 0, the first token's attention to itself (CLS to CLS),
    which is never dropped. Returns a new array."""
    out = np.array(a, dtype=np.float64)
    count = int(out.size * ratio)
    if count <= 0:
        return out
    flat = out.reshape(-1)
    lowest = np.argsort(flat, kind="stable")[:count]
    flat[lowest[lowest != 0]] = 0.0
    return out


def with_residual(a: np.ndarray, residual: float) -> np.ndarray:
    """``(1 - r) A + r I`` with each row renormalised to sum to 1 (a row of zeros becomes the identity
    row when r > 0, and stays zeros when r = 0)."""
    out = (1.0 - residual) * a
    out[np.diag_indices_from(out)] += residual
    sums = out.sum(axis=-1, keepdims=True)
    return np.divide(out, sums, out=np.zeros_like(out), where=sums != 0)


def real_heads(one: np.ndarray, keep: np.ndarray, renormalise: bool = True) -> np.ndarray:
    """``one [heads, L, L]`` over the real tokens ``keep`` (indices) alone, in float64; with
    ``renormalise`` each head's rows are renormalised among them (a row of zeros stays zeros)."""
    out = np.asarray(one, dtype=np.float64)[:, keep][:, :, keep]
    if not renormalise:
        return out
    sums = out.sum(axis=-1, keepdims=True)
    return np.divide(out, sums, out=np.zeros_like(out), where=sums != 0)


def real_indices(real: np.ndarray | None, size: int) -> np.ndarray:
    """The indices of the real tokens (every one when ``real`` is None)."""
    return np.arange(size) if real is None else np.flatnonzero(real)


def check_square(w: np.ndarray, start_layer: int) -> None:
    """``w [layers, heads, L, L]`` holds self-attention maps and ``start_layer`` is one of its layers."""
    layers, _, lq, lk = w.shape
    if lq != lk:
        raise ValueError(f"rollout needs square maps (self-attention), not [{lq}, {lk}]")
    if not 0 <= start_layer < layers:
        raise ValueError(f"start layer {start_layer} is not one of the {layers} layers")


def mixing_maps(w: np.ndarray, *, heads: str = "mean", residual: float = 0.5, start_layer: int = 0,
                real: np.ndarray | None = None, discard_ratio: float = 0.0,
                weighed: bool = False) -> Iterator[np.ndarray]:
    """Each layer's ``A'`` (``[n, n]`` over the ``n`` real tokens, float64) from ``start_layer`` up, for
    ``w [layers, heads, L, L]`` (one batch entry): each head's rows renormalised among the real tokens
    when ``real [L]`` marks some as padded, the heads combined, the lowest dropped (``discard_ratio``),
    the residual added and the rows renormalised. ``weighed``: maps whose rows are not distributions by
    design (value norms, ``alpha * ||v W_O||``): the heads are combined as they are, never renormalised one by
    one, so that a head that adds little to the output weighs little; the residual is then added to the
    combined map and its rows renormalised. The pages of a mapped file are released as it goes."""
    check_square(w, start_layer)
    keep = real_indices(real, w.shape[-1])
    for li in range(start_layer, w.shape[0]):
        one = w[li] if real is None else real_heads(w[li], keep, renormalise=not weighed)
        combined = combine_heads(one, heads)
        if discard_ratio > 0:
            combined = discard_lowest(combined, discard_ratio)
        yield with_residual(combined, residual)
        release_pages(w)


@dataclass
class Rollout:
    """What a method of ``attnviz rollout`` gives for one batch entry: ``result [L, L]`` after the last
    layer, the layers it spans, and (when asked) the map after each of them, ``cumulative [n, L, L]``.
    Padded positions are NaN in both."""

    result: np.ndarray
    layers: list[int]
    cumulative: np.ndarray | None


def scatter(values: np.ndarray, keep: np.ndarray, size: int) -> np.ndarray:
    """``values [n, n]`` over the real tokens ``keep`` as an ``[size, size]`` map, NaN elsewhere."""
    if len(keep) == size:
        return values.copy()
    out = np.full((size, size), np.nan)
    out[np.ix_(keep, keep)] = values
    return out

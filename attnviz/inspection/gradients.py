"""Gradient-weighted rollout (Chefer, Gur and Wolf, "Generic Attention-model Explainability for
Interpreting Bi-Modal and Encoder-Decoder Transformers", ICCV 2021), as Transformer-MM-Explainability
computes it.

Besides each layer's attention weights ``A [heads, L, L]`` it needs ``grad``, the gradient of the
explained score (a target logit) with respect to those weights, of the same shape. Each layer gives
``cam = mean_h(clamp(grad * A, min=0))``: the heads' attention where raising it raises the score.
Relevance starts as the identity and takes in the layers from the first (or ``start_layer``) up:
``R = I``, then ``R = R + cam @ R`` for each layer. Nothing is normalised. Row ``i`` of ``R`` says how
relevant each input token is to position ``i`` after the last layer, for that score.

The reference notebooks assume one batch entry (they reshape batch and heads together before taking
the mean); here each batch entry has its own ``R``. ``heads`` may also take the max or min of the
heads (the paper: mean). Padded tokens are left out (their rows and columns NaN); the weights are not
renormalised among the real tokens, as the rule uses them as the model had them. This is not the
CVPR 2021 method of the same authors, which multiplies the gradient by an LRP relevance map and
needs their instrumented layers. NumPy only.
"""

from __future__ import annotations

import numpy as np

from attnviz.inspection.mixing import Rollout, check_square, combine_heads, real_heads, real_indices, scatter
from attnviz.io import release_pages


def relevance_steps(w: np.ndarray, grads: np.ndarray, *, heads: str = "mean", start_layer: int = 0,
                    real: np.ndarray | None = None) -> list[np.ndarray]:
    """``R`` after each layer from ``start_layer`` (``[n, n]`` over the ``n`` real tokens, float64) for
    ``w`` and ``grads [layers, heads, L, L]`` (one batch entry)."""
    if grads.shape != w.shape:
        raise ValueError(f"the gradients {list(grads.shape)} and the weights {list(w.shape)} differ in shape")
    check_square(w, start_layer)
    keep = real_indices(real, w.shape[-1])
    relevance = np.eye(len(keep))
    steps = []
    for li in range(start_layer, w.shape[0]):
        a = real_heads(w[li], keep, renormalise=False)
        g = real_heads(grads[li], keep, renormalise=False)
        cam = combine_heads(np.clip(g * a, 0.0, None), heads)
        relevance = relevance + cam @ relevance
        steps.append(relevance)
        release_pages(w)
        release_pages(grads)
    return steps


def gradient_entry(w: np.ndarray, *, grads: np.ndarray, heads: str = "mean", start_layer: int = 0,
                   real: np.ndarray | None = None, all_layers: bool = False) -> Rollout:
    """The gradient rollout of one batch entry, ``w`` and ``grads [layers, heads, L, L]``, as ``rollout``
    gives its result: ``R`` after the last layer (padded rows and columns NaN when ``real [L]`` marks
    some), and with ``all_layers`` after each layer."""
    size = w.shape[-1]
    keep = real_indices(real, size)
    steps = relevance_steps(w, grads, heads=heads, start_layer=start_layer, real=real)
    cumulative = np.stack([scatter(s, keep, size) for s in steps]) if all_layers else None
    return Rollout(scatter(steps[-1], keep, size), list(range(start_layer, w.shape[0])), cumulative)


def gradient_rollout(weights: np.ndarray, grads: np.ndarray, *, heads: str = "mean", start_layer: int = 0,
                     real: np.ndarray | None = None) -> np.ndarray:
    """Chefer's relevance map of every batch entry: ``weights`` and ``grads [layers, batch, heads, L, L]``
    give ``[batch, L, L]``, each entry on its own (``real [batch, L]``, when given, marks each entry's
    real tokens; padded rows and columns are NaN)."""
    weights, grads = np.asarray(weights), np.asarray(grads)
    if weights.ndim != 5 or grads.shape != weights.shape:
        raise ValueError(f"weights and gradients [layers, batch, heads, L, L] of one shape are needed, not "
                         f"{list(weights.shape)} and {list(grads.shape)}")
    return np.stack([gradient_entry(weights[:, b], grads=grads[:, b], heads=heads, start_layer=start_layer,
                                    real=None if real is None else real[b]).result
                     for b in range(weights.shape[1])])

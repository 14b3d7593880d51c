"""Obviously-correct NumPy references, in float64, written from the formulas in the reference spec
(not from attnviz's code): the tests compare attnviz's TensorFlow results with these."""

from __future__ import annotations

import numpy as np


def masked_softmax(scores: np.ndarray, keep: np.ndarray | None = None) -> np.ndarray:
    """Row softmax over the keys a row may attend to; a row with none gets all zeros."""
    s = np.asarray(scores, dtype=np.float64)
    keep = np.ones(s.shape, bool) if keep is None else np.broadcast_to(keep, s.shape)
    out = np.zeros(s.shape)
    for idx in np.ndindex(*s.shape[:-1]):
        row, k = s[idx], keep[idx]
        if not k.any():
            continue
        z = row[k] - row[k].max()
        e = np.exp(z)
        out[idx][k] = e / e.sum()
    return out


def sdpa(q, k, v, scale=None, keep=None, bias=None):
    """softmax(scale * Q K^T + bias, masked) V, leading dimensions broadcast."""
    q, k, v = (np.asarray(a, dtype=np.float64) for a in (q, k, v))
    if scale is None:
        scale = 1.0 / np.sqrt(q.shape[-1])
    lead = np.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    q = np.broadcast_to(q, lead + q.shape[-2:])
    k = np.broadcast_to(k, lead + k.shape[-2:])
    v = np.broadcast_to(v, lead + v.shape[-2:])
    scores = scale * np.einsum("...id,...jd->...ij", q, k)
    if bias is not None:
        scores = scores + bias
    w = masked_softmax(scores, keep)
    return w, np.einsum("...ij,...jd->...id", w, v)

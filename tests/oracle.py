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


def general(q, k, v, w_a, keep=None):
    """Luong general: softmax(q W_a k^T) V."""
    scores = np.einsum("...id,de,...je->...ij", np.asarray(q, float), np.asarray(w_a, float), np.asarray(k, float))
    w = masked_softmax(scores, keep)
    return w, w @ np.asarray(v, float)


def bahdanau(q, k, v, W1, W2, vec, b=None, keep=None):
    """v^T tanh(q W1 + k W2 + b), one (query, key) pair at a time."""
    q, k, v = (np.asarray(a, float) for a in (q, k, v))
    b = np.zeros(len(vec)) if b is None else b
    scores = np.empty(q.shape[:-1] + (k.shape[-2],))
    for idx in np.ndindex(*q.shape[:-1]):
        for j in range(k.shape[-2]):
            kk = k[idx[:-1] + (j,)] if k.ndim == q.ndim else k[j]
            scores[idx + (j,)] = vec @ np.tanh(q[idx] @ W1 + kk @ W2 + b)
    w = masked_softmax(scores, keep)
    return w, w @ v


def local_p(q, k, v, w_p, v_p, window, renormalize=False, score="dot"):
    """Luong local-p, one query at a time, 1-based positions (reference section 3.1)."""
    q, k, v = (np.asarray(a, float) for a in (q, k, v))
    S = k.shape[0]
    out_w = np.zeros((q.shape[0], S))
    for t, h in enumerate(q):
        p_t = S / (1 + np.exp(-(np.tanh(h @ w_p) @ v_p)))
        s = np.arange(1, S + 1)
        inside = np.abs(s - p_t) <= window
        scores = k @ h if score == "dot" else k @ h / np.sqrt(len(h))
        align = np.zeros(S)
        if inside.any():
            e = np.exp(scores[inside] - scores[inside].max())
            align[inside] = e / e.sum()
        a = align * np.exp(-((s - p_t) ** 2) / (2 * (window / 2) ** 2)) * inside
        if renormalize and a.sum() > 0:
            a = a / a.sum()
        out_w[t] = a
    return out_w, out_w @ v

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

Sums are taken in float64 whatever the weights' dtype.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


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


def entropy(weights: np.ndarray) -> np.ndarray:
    """Shannon entropy of each row in nats, with ``0 log 0 = 0`` (float64)."""
    w = np.asarray(weights, dtype=np.float64)
    logs = np.log(w, out=np.zeros_like(w), where=w > 0)
    return 0.0 - np.einsum("...i,...i->...", w, logs)  # 0 - x, not -x: no "-0.000" for a one-hot row


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
    with np.errstate(divide="ignore", invalid="ignore"):
        h_norm = np.where(n_keys > 1, h / np.log(np.maximum(n_keys, 2)), 0.0)
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

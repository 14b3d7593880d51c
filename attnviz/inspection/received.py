"""Received attention: per key token ``j``, the mean over the query rows that may attend to ``j``
of ``w[i, j]`` (a column mean, counting only the queries allowed to see ``j``: the mask's, the real
rows, and ``i >= j`` for causal weights), so that the last token of a causal model, seen by one
query only, is not penalised for it. A sink gets about 1 from every query. NumPy only."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from attnviz.io import release_pages

CHUNK = 2**22  # values handled at a time on long inputs


def received(w: np.ndarray, keep: np.ndarray | None = None, real_rows: np.ndarray | None = None,
             causal: bool = False) -> np.ndarray:
    """``[L, B, H, Lk]``: per key token, the mean weight it gets from the query rows allowed to see
    it (module docstring). ``keep`` broadcasts to ``w``; ``real_rows`` to ``[L, B, H, Lq]``; with
    ``causal``, query ``i`` sees keys ``j <= i``. NaN for a token no query may attend."""
    layers, batches, heads, lq, lk = w.shape
    full_keep = None if keep is None else np.broadcast_to(keep, w.shape)
    rows = None if real_rows is None else np.broadcast_to(real_rows, w.shape[:-1])
    step = max(1, CHUNK // max(lk, 1))  # query rows at a time: a long map is never held whole
    out = np.empty((layers, batches, heads, lk))
    for li, bi, hi in np.ndindex(layers, batches, heads):
        total = np.zeros(lk)
        count = np.zeros(lk, dtype=np.int64)
        for start in range(0, lq, step):
            stop = min(start + step, lq)
            block = np.asarray(w[li, bi, hi, start:stop], dtype=np.float64)  # [rows, Lk]
            allowed = np.ones(block.shape, bool)
            if full_keep is not None:
                allowed &= full_keep[li, bi, hi, start:stop]
            if rows is not None:
                allowed &= rows[li, bi, hi, start:stop, None]
            if causal:
                allowed &= np.arange(lk)[None, :] <= np.arange(start, stop)[:, None]
            count += allowed.sum(axis=0)
            total += np.where(allowed, block, 0.0).sum(axis=0)
        with np.errstate(invalid="ignore", divide="ignore"):
            out[li, bi, hi] = np.where(count > 0, total / np.maximum(count, 1), np.nan)
        release_pages(w)
    return out




def allowed_counts(shape: tuple[int, ...], keep: np.ndarray | None = None, real_rows: np.ndarray | None = None,
                   causal: bool = False) -> np.ndarray:
    """``[L, B, H, Lk]`` (or a shape that broadcasts to it): per key, the query rows of ``shape [L, B, H, Lq, Lk]``
    allowed to see it (``received``'s denominators), worked out from the masks alone."""
    lq, lk = shape[-2:]
    allowed: np.ndarray = np.ones((lq, lk), bool)
    if causal:
        allowed = np.arange(lk)[None, :] <= np.arange(lq)[:, None]
    if keep is not None:
        allowed = allowed & keep
    if real_rows is not None:
        allowed = allowed & np.asarray(real_rows)[..., None]
    return np.asarray(allowed.sum(axis=-2))


def received_from_columns(columns: np.ndarray, shape: tuple[int, ...], keep: np.ndarray | None = None,
                          real_rows: np.ndarray | None = None, causal: bool = False) -> np.ndarray:
    """``received`` from the weights already summed over the query rows (``heads.head_pass``'s columns:
    masked keys and padded rows as 0). With ``causal`` the weights must hold nothing above the diagonal in
    the rows counted (as ``head_statistics`` found), so that those sums are the sums over the rows allowed."""
    count = np.broadcast_to(allowed_counts(shape, keep, real_rows, causal), columns.shape)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(count > 0, columns / np.maximum(count, 1), np.nan)


TOP_RECEIVERS = 8  # tokens listed in the received-attention table and JSON


def received_summary(data: np.ndarray, keep: Any, real_rows: Any, tokens: Sequence[str] | None, causal: bool,
                     layer_ids: list[int], columns: np.ndarray | None = None) -> dict[str, Any]:
    """The attention each key token receives (``received``) of ``data [L, B, H, Lq, Lk]``, averaged over
    batch entries: ``per_head [L, H, Lk]``, ``per_layer [L, Lk]`` (mean over heads), ``mean [Lk]`` (over
    layers and heads), and the ``top`` receivers by ``mean``. ``columns``: the weights already summed over
    the rows (``received_from_columns``), so that ``data`` is not read again."""
    import warnings

    values = (received(data, keep, real_rows, causal) if columns is None
              else received_from_columns(columns, data.shape, keep, real_rows, causal))
    with warnings.catch_warnings():  # a token no query may see is NaN everywhere: the mean stays NaN
        warnings.simplefilter("ignore", RuntimeWarning)
        per_head = np.nanmean(values, axis=1)
        per_layer = np.nanmean(per_head, axis=1)
        mean = np.nanmean(per_layer, axis=0)
    order = [int(j) for j in np.argsort(-np.nan_to_num(mean, nan=-np.inf), kind="stable")[:TOP_RECEIVERS]
             if not np.isnan(mean[j])]
    top = []
    for j in order:
        column = np.nan_to_num(per_head[:, :, j], nan=-np.inf)
        li, hi = np.unravel_index(int(np.argmax(column)), column.shape)
        top.append({"position": j, "token": tokens[j] if tokens is not None else None, "mean": float(mean[j]),
                    "max": float(per_head[li, hi, j]), "layer": int(li), "head": int(hi)})
    return {"causal": causal, "layers": layer_ids, "mean": mean, "per_layer": per_layer, "per_head": per_head,
            "top": top}

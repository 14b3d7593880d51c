"""``attnviz capture --check``: every site's weights recomputed by attnviz from what the file holds (q, k,
the mask, the scale, softcap, sinks and T5's position bias), in float64 with NumPy, independently of the
model's code, and the largest difference from the model's own weights on the rows that attend to
something."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from attnviz.capturefile import open_capture, site_keep
from attnviz.rowmath import softmax_of_scores

#: the default tolerance of --check by the dtype the model computed in (its weights carry that rounding)
TOLERANCE = {"float32": 1e-5, "float64": 1e-5, "float16": 1e-3, "bfloat16": 8e-3}


def _rounded(x: np.ndarray, dtype: str | None) -> np.ndarray:
    """``x`` rounded to the model's half dtype (as its matmul's output is), kept in float64."""
    if dtype not in ("float16", "bfloat16"):
        return x
    import ml_dtypes

    half = np.float16 if dtype == "float16" else ml_dtypes.bfloat16
    return x.astype(np.float32).astype(half).astype(np.float64)


def recompute(q: np.ndarray, k: np.ndarray, keep: np.ndarray, scale: float, softcap: float | None = None,
              sinks: np.ndarray | None = None, bias: np.ndarray | None = None,
              dtype: str | None = None) -> np.ndarray:
    """Softmax weights [B, H, Lq, Lk] of q [B, Lq, H, d] against k [B, Lk, Hkv, d] (grouped heads repeated
    as transformers' ``repeat_kv``), with the mask ``keep`` [B, 1 or H, Lq, Lk]; rows with no key kept are 0.
    ``dtype`` float16 or bfloat16: the scores rounded to it after the product and after the scale, as a
    model running in it computes them (the softmax itself in float32 precision or better)."""
    q64, k64 = q.astype(np.float64), k.astype(np.float64)
    groups = q.shape[2] // k.shape[2]
    k64 = np.repeat(k64, groups, axis=2)
    scores = _rounded(_rounded(np.einsum("bqhd,bkhd->bhqk", q64, k64), dtype) * scale, dtype)
    return softmax_of_scores(scores, keep, softcap=softcap, bias=bias, sinks=sinks)


def check_capture(path: str | Path) -> dict[str, float]:
    """Each site's largest |attnviz - model| over the rows that attend to some key."""
    out: dict[str, float] = {}
    with open_capture(path) as (raw, capture):
        sites_meta = capture.metadata.get("sites", {})
        dtype = capture.metadata.get("dtype") if capture.metadata.get("framework") == "transformers" else None
        for kind in capture.kinds:
            for site in capture.sites(kind):
                if not all(capture.has(site, n) for n in ("weights", "q", "k")):
                    continue
                keep = site_keep(raw, capture, site)
                if keep is None:
                    continue
                meta = sites_meta.get(site, {})
                q, k = raw.get(f"{site}.q"), raw.get(f"{site}.k")
                scale = meta.get("scale") or q.shape[-1] ** -0.5
                sinks = raw.get(f"{site}.sinks") if capture.has(site, "sinks") else None
                bias = raw.get(f"{site}.position_bias") if capture.has(site, "position_bias") else None
                ours = recompute(q, k, keep, float(scale), meta.get("softcap"), sinks, bias, dtype)
                theirs = raw.get(f"{site}.weights").astype(np.float64)
                real = np.broadcast_to(keep.any(axis=-1, keepdims=True), ours.shape)
                diff = np.where(real, np.abs(ours - theirs), 0.0)
                out[site] = float(diff.max()) if diff.size else 0.0
    return out

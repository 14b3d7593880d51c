"""Sparse attention: normalisers that give exact zeros, and the Sparse Transformer's fixed patterns.

    sparsemax (Martins & Astudillo 2016):  A = argmin_{p in simplex} |p - z|^2      (exact, by sorting)
    entmax (Peters, Niculae & Martins 2019): A = alpha-entmax(z), --alpha (1.5 exact by sorting, other
                                             values by bisection, 50 steps, renormalised; 2 = sparsemax)
    topk:    softmax over the k largest scores of each row (--k; ties to the lower key index)
    strided / fixed (Child et al. 2019):   softmax masked to a causal pattern with stride l (--stride):
             strided: {j : i - l <= j <= i}  U  {j <= i : (i - j) mod l = 0}
             fixed:   {j <= i : floor(j/l) = floor(i/l)}  U  {j <= i : j mod l >= l - c}   (--c)
             --combine split shows the two sub-patterns as two slices instead of their union
    z = score(Q, K): --score scaled (default), dot or general;  O = A V

Masked keys take no part: they get weight 0 and never enter a sort. Zeros are exact zeros, rows sum
to 1, and the statistics report each row's support (keys with a weight other than 0).

Shapes: Q ``[..., Lq, d_q]``, K ``[..., Lk, d_k]``, V ``[..., Lk, d_v]`` give weights ``[..., Lq, Lk]``
(``[..., 2, Lq, Lk]`` with --combine split). Parameter: ``W_a`` with --score general.

Reference examples (spec section 5): sparsemax [1, .8, .1] = [.6, .4, 0]; 1.5-entmax [2, 1, 0] =
[0.830719, 0.169281, 0]; 1.25-entmax [1, .8, .1] = [0.484180, 0.378119, 0.137701]; top-2 of
[1, .8, .1, .9] = [0.524979, 0, 0, 0.475021].
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from attnviz.errors import UsageError
from attnviz.variants.base import (
    Context,
    Problem,
    Result,
    base_scores,
    check_qkv,
    check_scale,
    qkv_variant,
    scale_field,
    score_field_help,
    score_specs,
    softmax_and_output,
)

if TYPE_CHECKING:
    import numpy as np

    from attnviz.io import Loaded
    from attnviz.masks import Mask

PATTERNS = ("strided", "fixed")


@dataclass
class Params:
    method: Literal["sparsemax", "entmax", "topk", "strided", "fixed"] = field(
        default="sparsemax", metadata={"help": "sparsemax, entmax (--alpha), topk (--k), or a Sparse Transformer "
                                               "pattern: strided, fixed (--stride, --c)"})
    alpha: float = field(default=1.5, metadata={"help": "entmax: alpha > 1 (1.5: exact; 2: sparsemax)",
                                                "above": 1, "max": 100})
    n_iter: int = field(default=50, metadata={"help": "entmax: bisection steps for alpha other than 1.5 and 2",
                                              "min": 1, "max": 10_000})
    top_k: int | None = field(default=None, metadata={"help": "topk: keys kept per row", "flag": "--k",
                                                      "min": 1})
    stride: int | None = field(default=None, metadata={"help": "strided/fixed: stride l (default ceil(sqrt(Lk)))",
                                                       "min": 1})
    c: int = field(default=1, metadata={"help": "fixed: summary positions at the end of each block",
                                        "min": 1})
    combine: Literal["union", "split"] = field(
        default="union", metadata={"help": "strided/fixed: the union of the two sub-patterns, or each as a slice"})
    score: Literal["scaled", "dot", "general"] = field(default="scaled", metadata={"help": score_field_help()})
    scale: float | None = scale_field("the --score's (1/sqrt(d) for scaled, 1 otherwise)")


def pattern_keep(lq: int, lk: int, method: str, stride: int, c: int) -> np.ndarray:
    """The two causal sub-patterns ``[2, Lq, Lk]`` of the Sparse Transformer (0-based)."""
    import numpy as np

    i = np.arange(lq)[:, None]
    j = np.arange(lk)[None, :]
    causal = j <= i
    if method == "strided":
        first = causal & (j >= i - stride)
        second = causal & ((i - j) % stride == 0)
    else:
        first = causal & (j // stride == i // stride)
        second = causal & (j % stride >= stride - c)
    return np.stack([first, second])


def check(inputs: Mapping[str, Loaded], params: Params, given: Mapping[str, np.ndarray] | None) -> Problem:
    check_scale(params.scale)
    shape = check_qkv(inputs, same_dim=params.score != "general")
    lq, lk = shape[-2], shape[-1]
    specs = score_specs(params.score, inputs["q"].data.shape[-1], inputs["k"].data.shape[-1])
    if params.method == "entmax":
        if not params.alpha > 1 or not math.isfinite(params.alpha):
            raise UsageError(f"--alpha {params.alpha}: entmax needs alpha > 1 (alpha = 1 is softmax: use `attnviz "
                             f"{params.score}`).")
        if params.n_iter < 1:
            raise UsageError(f"--n-iter {params.n_iter}: must be at least 1.")
    if params.method == "topk":
        if params.top_k is None or not 1 <= params.top_k <= lk:
            raise UsageError(f"--k {params.top_k}: topk keeps k keys per row, 1 <= k <= Lk = {lk}.")
    elif params.top_k is not None:
        raise UsageError("--k goes with --method topk.")
    if params.method not in PATTERNS:
        if params.stride is not None or params.combine != "union":
            raise UsageError("--stride, --c and --combine go with --method strided or fixed.")
        return Problem(shape, specs)
    stride = params.stride if params.stride is not None else max(1, math.ceil(math.sqrt(lk)))
    if not 1 <= stride <= lk:
        raise UsageError(f"--stride {stride}: must be between 1 and Lk = {lk}.")
    if params.method == "fixed" and not 1 <= params.c <= stride:
        raise UsageError(f"--c {params.c}: must be between 1 and the stride {stride}.")
    params.stride = stride
    patterns = pattern_keep(lq, lk, params.method, stride, params.c)
    what = f"{params.method} pattern, stride {stride}" + (f", c {params.c}" if params.method == "fixed" else "")
    if params.combine == "split":
        return Problem((*shape[:-2], 2, lq, lk), specs, mask_shape=shape, keep=patterns, keep_described=what)
    return Problem(shape, specs, keep=patterns[0] | patterns[1], keep_described=what)


def sparsemax(z: np.ndarray, keep: np.ndarray) -> np.ndarray:
    """Exact sparsemax of each row over the kept entries (masked ones: 0)."""
    import numpy as np

    zs = np.where(keep, z, -np.inf)
    n_keep = keep.sum(axis=-1, keepdims=True)
    top = np.max(np.where(keep, z, -np.inf), axis=-1, keepdims=True)
    zs = zs - np.where(np.isfinite(top), top, 0.0)
    srt = -np.sort(-zs, axis=-1)
    finite = np.where(np.isfinite(srt), srt, 0.0)
    cum = np.cumsum(finite, axis=-1)
    k = np.arange(1, z.shape[-1] + 1)
    cond = (1 + k * finite > cum) & (k <= n_keep)
    support = np.maximum(cond.sum(axis=-1, keepdims=True), 1)
    tau = (np.take_along_axis(cum, support - 1, axis=-1) - 1) / support
    return np.where(keep & (n_keep > 0), np.maximum(np.where(keep, zs, 0.0) - tau, 0.0), 0.0)


def entmax15(z: np.ndarray, keep: np.ndarray) -> np.ndarray:
    """Exact 1.5-entmax by sorting (entmax's ``_tsallis_threshold_and_support``)."""
    import numpy as np

    n_keep = keep.sum(axis=-1, keepdims=True)
    top = np.max(np.where(keep, z, -np.inf), axis=-1, keepdims=True)
    x = np.where(keep, (z - np.where(np.isfinite(top), top, 0.0)) / 2, -np.inf)
    srt = -np.sort(-x, axis=-1)
    finite = np.where(np.isfinite(srt), srt, 0.0)
    rho = np.arange(1, z.shape[-1] + 1)
    mean = np.cumsum(finite, axis=-1) / rho
    mean_sq = np.cumsum(finite**2, axis=-1) / rho
    ss = rho * (mean_sq - mean**2)
    delta = (1 - ss) / rho
    tau = mean - np.sqrt(np.clip(delta, 0, None))
    support = ((tau <= srt) & (rho <= n_keep)).sum(axis=-1, keepdims=True)
    tau_star = np.take_along_axis(tau, np.maximum(support, 1) - 1, axis=-1)
    return np.where(keep & (n_keep > 0), np.clip(np.where(keep, x, 0.0) - tau_star, 0, None) ** 2, 0.0)


def entmax_bisect(z: np.ndarray, keep: np.ndarray, alpha: float, n_iter: int = 50) -> np.ndarray:
    """alpha-entmax by bisection on the threshold, renormalised (entmax's ``EntmaxBisectFunction``)."""
    import numpy as np

    n_keep = keep.sum(axis=-1, keepdims=True)
    x = np.where(keep, (alpha - 1) * z, -np.inf)
    top = np.max(x, axis=-1, keepdims=True)
    top = np.where(np.isfinite(top), top, 0.0)
    power = 1.0 / (alpha - 1)

    def p_of(tau: np.ndarray) -> np.ndarray:
        return np.where(keep, np.clip(np.where(keep, x, 0.0) - tau, 0, None) ** power, 0.0)

    lo = top - 1.0
    hi = top - (1.0 / np.maximum(n_keep, 1)) ** (alpha - 1)
    f_lo = p_of(lo).sum(axis=-1, keepdims=True) - 1
    mid = lo
    for _ in range(n_iter):
        mid = (lo + hi) / 2
        f_mid = p_of(mid).sum(axis=-1, keepdims=True) - 1
        lo = np.where(f_mid * f_lo >= 0, mid, lo)
        hi = np.where(f_mid * f_lo >= 0, hi, mid)
    p = p_of(mid)
    total = p.sum(axis=-1, keepdims=True)
    return np.divide(p, total, out=np.zeros_like(p), where=total > 0)


def top_k_keep(z: np.ndarray, keep: np.ndarray, k: int) -> np.ndarray:
    """The k largest kept scores of each row (ties to the lower index, as ``tf.math.top_k``)."""
    import numpy as np

    order = np.argsort(-np.where(keep, z, -np.inf), axis=-1, kind="stable")
    rank = np.empty_like(order)
    np.put_along_axis(rank, order, np.arange(z.shape[-1]), axis=-1)
    return keep & (rank < k)


def compute(ctx: Context, arrays: Mapping[str, np.ndarray], mask: Mask, params: Params,
            learned: Mapping[str, np.ndarray]) -> Result:
    import numpy as np

    from attnviz.masks import Mask

    tf = ctx.tf
    used: dict[str, object] = {"method": params.method, "score": params.score}
    with tf.device(ctx.device.tf_name):
        q, k, v = (ctx.tensor(arrays[n]) for n in ("q", "k", "v"))
        scores = base_scores(ctx, q, k, params.score, learned, params.scale)
        if params.method in PATTERNS:
            if params.combine == "split":
                scores, v = scores[..., None, :, :], v[..., None, :, :]
            used.update(stride=params.stride, c=params.c if params.method == "fixed" else None, combine=params.combine)
            weights, output = softmax_and_output(ctx, scores, v, mask)
            return Result(weights, output, params=used)
        z = ctx.numpy(scores).astype(np.float64)
        if mask.bias is not None:
            z = z + mask.bias
        lead = np.broadcast_shapes(z.shape[:-2], tuple(v.shape[:-2]))
        z = np.broadcast_to(z, (*lead, *z.shape[-2:]))
        keep = np.ones(z.shape, bool) if mask.keep is None else np.broadcast_to(mask.keep, z.shape)
        if params.method == "topk":
            used["k"] = params.top_k
            weights, output = softmax_and_output(ctx, tf.convert_to_tensor(z), v,
                                                 Mask(top_k_keep(z, keep, params.top_k or 1)))
            return Result(weights, output, params=used)
        if params.method == "sparsemax" or (params.method == "entmax" and params.alpha == 2.0):
            w = sparsemax(z, keep)
        elif params.alpha == 1.5:
            w = entmax15(z, keep)
        else:
            w = entmax_bisect(z, keep, params.alpha, params.n_iter)
        if params.method == "entmax":
            used.update(alpha=params.alpha, algorithm="exact" if params.alpha in (1.5, 2.0) else
                        f"bisection, {params.n_iter} steps")
        dtype = np.float64 if ctx.dtype == "float64" else np.float32
        output = ctx.numpy(tf.matmul(ctx.tensor(w), v))
    return Result(w.astype(dtype), output, params=used)


VARIANT = qkv_variant(
    __name__,
    name="sparse",
    summary="sparse attention: sparsemax, entmax, top-k, Sparse Transformer strided/fixed patterns",
    formula="A = sparsemax(Q K^T / sqrt(d)) (or entmax, top-k, a pattern mask), O = A V",
    learned=True,
    lead_names=(),
    blockwise=True,
)

"""Hard attention (Xu et al. 2015, "Show, Attend and Tell", section 4.1): each query selects one key.

    p = softmax_k(score, masked)                  score: --score scaled (default), dot or general
    argmax:  A = onehot(argmax p)                 ties go to the lower key index
    sample:  A = onehot(s),  s ~ Multinoulli(p)   inverse-CDF: s = searchsorted(cumsum p, u, "right")
             --samples N: A = how often each key was picked in N draws / N
    gumbel:  A = softmax((log p + g) / tau),  g = -log(-log u)     --hard: onehot(argmax) of that
    O = A V                                       (one value row per query, for one-hot rows)

``u`` comes from ``numpy.random.default_rng(--seed)`` (default 0), so a run repeats exactly. The soft
distribution ``p`` it was drawn from is map ``soft``, with its own per-query statistics. A fully
masked row selects nothing: zero weights and output. Deterministic argmax is the usual inference
shortcut, not what Xu et al. train; sample is their stochastic hard attention.

Shapes: Q ``[..., Lq, d_q]``, K ``[..., Lk, d_k]``, V ``[..., Lk, d_v]``. Parameter: ``W_a`` with
--score general.

Reference example (spec section 4): scores [1, 2, 3] give p = [0.090031, 0.244728, 0.665241]; argmax
selects key 2; u = 0.2 samples key 1; gumbel with u = [0.5, 0.9, 0.1] and tau = 1 gives
[0.047377, 0.847242, 0.105381].
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from attnviz.errors import UsageError, shape_str
from attnviz.variants.base import (
    Context,
    Problem,
    Result,
    View,
    base_scores,
    check_qkv,
    check_scale,
    masked_softmax,
    qkv_variant,
    scale_field,
    score_field_help,
    score_specs,
)

if TYPE_CHECKING:
    import numpy as np

    from attnviz.io import Loaded
    from attnviz.masks import Mask


#: --samples draws at most this many one-hot weights in all (the draws are held at once)
MAX_DRAWN = 2**23


@dataclass
class Params:
    mode: Literal["argmax", "sample", "gumbel"] = field(
        default="argmax", metadata={"help": "argmax: the most likely key; sample: draw from p (--seed); gumbel: "
                                            "Gumbel-softmax relaxation (--tau, --hard)"})
    samples: int | None = field(default=None, metadata={"help": "sample: draw N times and show how often each key "
                                                                  "was picked", "min": 1,
                                                        "max": 1_000_000})
    tau: float = field(default=1.0, metadata={"help": "gumbel: temperature", "min": 1e-6, "max": 1e6})
    hard: bool = field(default=False, metadata={"help": "gumbel: one-hot of the relaxed sample (straight-through "
                                                        "forward value)"})
    score: Literal["scaled", "dot", "general"] = field(default="scaled", metadata={"help": score_field_help()})
    scale: float | None = scale_field("the --score's (1/sqrt(d) for scaled, 1 otherwise)")


def check(inputs: Mapping[str, Loaded], params: Params, given: Mapping[str, np.ndarray] | None) -> Problem:
    check_scale(params.scale)
    shape = check_qkv(inputs, same_dim=params.score != "general")
    if params.samples is not None and (params.mode != "sample" or params.samples < 1):
        raise UsageError("--samples N (N >= 1) goes with --mode sample.")
    if params.mode != "gumbel" and (params.hard or params.tau != 1.0):
        raise UsageError("--tau and --hard go with --mode gumbel.")
    if not params.tau > 0:
        raise UsageError(f"--tau {params.tau}: must be positive.")
    drawn = (params.samples or 1) * math.prod(shape)
    if params.mode == "sample" and drawn > MAX_DRAWN:
        raise UsageError(f"--samples {params.samples}: that many draws of the {shape_str(shape)} weights hold "
                         f"{drawn:,} values, more than {MAX_DRAWN:,}; use fewer samples.")
    return Problem(shape, score_specs(params.score, inputs["q"].data.shape[-1], inputs["k"].data.shape[-1]))


def one_hot(index: np.ndarray, n: int, live: np.ndarray) -> np.ndarray:
    import numpy as np

    out = (np.arange(n) == index[..., None]).astype(np.float64)
    return np.where(live[..., None], out, 0.0)


def sample_indices(p: np.ndarray, u: np.ndarray) -> np.ndarray:
    """Inverse-CDF draws: the first key whose cumulative probability exceeds ``u`` (never a key of
    probability 0, even when float rounding leaves the cumulative sum just under 1)."""
    import numpy as np

    cdf = np.cumsum(p, axis=-1)
    index = (cdf <= u[..., None]).sum(axis=-1)
    last = p.shape[-1] - 1 - np.argmax((p > 0)[..., ::-1], axis=-1)  # the last key with p > 0
    return np.minimum(index, last)


def gumbel_softmax(p: np.ndarray, u: np.ndarray, tau: float) -> np.ndarray:
    """``softmax((log p + g) / tau)`` with ``g = -log(-log u)``, over the keys with p > 0."""
    import numpy as np

    g = -np.log(-np.log(np.clip(u, 1e-300, 1.0 - 1e-16)))
    with np.errstate(divide="ignore"):
        z = np.where(p > 0, (np.log(np.where(p > 0, p, 1.0)) + g) / tau, -np.inf)
    top = np.max(z, axis=-1, keepdims=True)
    top = np.where(np.isfinite(top), top, 0.0)
    e = np.where(p > 0, np.exp(z - top), 0.0)
    total = e.sum(axis=-1, keepdims=True)
    return np.divide(e, total, out=np.zeros_like(e), where=total > 0)


def compute(ctx: Context, arrays: Mapping[str, np.ndarray], mask: Mask, params: Params,
            learned: Mapping[str, np.ndarray]) -> Result:
    import numpy as np

    from attnviz.variants.base import check_finite_result

    tf = ctx.tf
    rng = np.random.default_rng(ctx.seed)
    with tf.device(ctx.device.tf_name):
        q, k, v = (ctx.tensor(arrays[n]) for n in ("q", "k", "v"))
        soft = masked_softmax(ctx, base_scores(ctx, q, k, params.score, learned, params.scale), mask)
        lead = np.broadcast_shapes(tuple(soft.shape[:-2]), tuple(v.shape[:-2]))
        p = np.broadcast_to(ctx.numpy(soft).astype(np.float64), (*lead, *soft.shape[-2:]))
        check_finite_result(p, ctx.dtype)
        live = p.sum(axis=-1) > 0  # fully masked rows select nothing
        n = p.shape[-1]
        used: dict[str, object] = {"mode": params.mode, "score": params.score}
        if params.mode == "argmax":
            weights = one_hot(np.argmax(p, axis=-1), n, live)
        elif params.mode == "sample":
            draws = params.samples or 1
            u = rng.random((draws, *p.shape[:-1]))
            picks = sample_indices(np.broadcast_to(p, (draws, *p.shape)), u)
            weights = one_hot(picks, n, np.broadcast_to(live, picks.shape)).mean(axis=0)
            used.update(seed=ctx.seed, samples=draws)
        else:
            y = gumbel_softmax(p, rng.random(p.shape), params.tau)
            weights = one_hot(np.argmax(y, axis=-1), n, live) if params.hard else y
            used.update(seed=ctx.seed, tau=params.tau, hard=params.hard)
        output = ctx.numpy(tf.matmul(ctx.tensor(weights), v))
    return Result(weights.astype(np.float32 if ctx.dtype != "float64" else np.float64), output, params=used,
                  maps={"soft": p}, views=[View("soft", "soft distribution p the selection was drawn from",
                                                stats=True)])


VARIANT = qkv_variant(
    __name__,
    name="hard",
    summary="hard attention: one key per query, by argmax, sampling or Gumbel-softmax (Xu et al. 2015)",
    formula="p = softmax(score); A = onehot(argmax p | sample ~ p), O = A V",
    learned=True,
    seeds_samples=True,
)

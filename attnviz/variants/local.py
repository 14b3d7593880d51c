"""Local attention: each query looks at a window of keys (Luong, Pham & Manning 2015, section 3.2;
sliding-window attention as in Longformer and keras-self-attention).

    --mode window (default):  keep[i, j] = |i - j| <= D           (0-based; --window D, the half-width)
    --mode local-m:           the same window around p_t = t (Luong's monotonic alignment)
    --mode local-p:           p_t = S * sigmoid(v_p^T tanh(q_t W_p))    (predicted, real-valued, 1-based)
                              window {s in 1..S : |s - p_t| <= D}
                              a_t(s) = align_t(s) * exp(-(s - p_t)^2 / (2 sigma^2)),  sigma = D / 2
    A = softmax_k(score, masked to the window),  O = A V

The score inside the window is ``--score scaled`` (default), ``dot`` or ``general`` (``W_a``). local-p
does not renormalise after the Gaussian (rows sum to less than 1, as in the paper) unless
``--renormalize``; ``--align-over all`` takes the softmax over every key instead of the window. The
predicted positions are shown (map ``positions``).

Window styles for ``--mode window`` (``--window-style``): ``symmetric`` |i - j| <= D (Longformer's
attention_window w is 2D; ``--dilation d`` keeps |i - j| <= d D with (i - j) mod d = 0); ``cyberzhg``
(keras-self-attention ``attention_width = D``: i - D//2 <= j < i - D//2 + D); ``cyberzhg-history``
(i - D + 1 <= j <= i); ``band`` (--left a --right b: -a <= j - i <= b, -1 unlimited). ``--global-tokens
0,5`` lets those positions attend to and be attended by every position.

Shapes: Q ``[..., Lq, d_q]``, K ``[..., Lk, d_k]``, V ``[..., Lk, d_v]``. Parameters: ``W_p [d_q, d_p]``,
``v_p [d_p]`` (local-p; --units d_p), ``W_a`` (--score general).

Reference example (spec section 3.1): S = 5, keys [[1,0],[0,1],[1,1],[2,0],[0,2]], h_t = [1, 1], dot
score, D = 1: local-m at t = 3 gives [0, 0.155362, 0.422319, 0.422319, 0]; local-p with W_p = [[.5],
[.5]], v_p = [1] gives p_t = 3.408499 and [0, 0, 0.358119, 0.248355, 0].
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from attnviz.errors import UsageError
from attnviz.params import ParamSpec
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
    read_units,
    scale_field,
    score_field_help,
    score_specs,
    softmax_and_output,
    units_field,
)

if TYPE_CHECKING:
    import numpy as np

    from attnviz.io import Loaded
    from attnviz.masks import Mask


@dataclass
class Params:
    mode: Literal["window", "local-m", "local-p"] = field(
        default="window", metadata={"help": "window: a fixed band; local-m: Luong's monotonic window; local-p: "
                                            "Luong's predicted window with a Gaussian"})
    window: int | None = field(default=None, metadata={"help": "D: the half-width of the window (the width for "
                                                                "the cyberzhg styles)", "min": 0})
    window_style: Literal["symmetric", "cyberzhg", "cyberzhg-history", "band"] = field(
        default="symmetric", metadata={"help": "how --mode window reads --window (see the command's docs)"})
    left: int | None = field(default=None, metadata={"help": "band style: keys this far left (-1: all)",
                                                     "min": -1})
    right: int | None = field(default=None, metadata={"help": "band style: keys this far right (-1: all)",
                                                      "min": -1})
    dilation: int = field(default=1, metadata={"help": "symmetric style: keep every d-th key of a d-times wider "
                                                       "window", "min": 1})
    global_tokens: str | None = field(default=None, metadata={"help": "positions that attend and are attended "
                                                                        "everywhere, e.g. 0,5", "metavar": "I,J"})
    score: Literal["scaled", "dot", "general"] = field(default="scaled", metadata={"help": score_field_help()})
    scale: float | None = scale_field("the --score's (1/sqrt(d) for scaled, 1 otherwise)")
    units: int | None = units_field("local-p: d_p of W_p")
    renormalize: bool = field(default=False, metadata={"help": "local-p: rescale each row to sum to 1"})
    align_over: Literal["window", "all"] = field(
        default="window", metadata={"help": "local-p: the softmax before the Gaussian runs over the window or all "
                                            "keys"})


def window_keep(lq: int, lk: int, params: Params) -> np.ndarray:
    """The fixed window of --mode window / local-m as a keep mask ``[Lq, Lk]`` (0-based)."""
    import numpy as np

    i = np.arange(lq)[:, None]
    j = np.arange(lk)[None, :]
    d = params.window or 0
    style = "symmetric" if params.mode == "local-m" else params.window_style
    if style == "symmetric":
        delta = params.dilation
        keep = (np.abs(i - j) <= delta * d) & ((i - j) % delta == 0)
    elif style == "cyberzhg":
        lower = i - d // 2
        keep = (lower <= j) & (j < lower + d)
    elif style == "cyberzhg-history":
        keep = (i - d + 1 <= j) & (j <= i)
    else:
        left = np.inf if params.left in (None, -1) else float(params.left)
        right = np.inf if params.right in (None, -1) else float(params.right)
        keep = (-left <= j - i) & (j - i <= right)
    if params.global_tokens:
        for g in _global_tokens(params.global_tokens, lq, lk):
            keep[g, :] = True
            keep[:, g] = True
    return keep


def _global_tokens(text: str, lq: int, lk: int) -> list[int]:
    try:
        tokens = [int(t) for t in text.replace(" ", "").split(",") if t]
    except ValueError:
        raise UsageError(f"--global-tokens {text!r}: expected positions separated by commas, e.g. 0,5.") from None
    for g in tokens:
        if not 0 <= g < min(lq, lk):
            raise UsageError(f"--global-tokens: position {g} is outside 0..{min(lq, lk) - 1}.")
    return tokens


def check(inputs: Mapping[str, Loaded], params: Params, given: Mapping[str, np.ndarray] | None) -> Problem:
    check_scale(params.scale)
    shape = check_qkv(inputs, same_dim=params.score != "general")
    lq, lk = shape[-2], shape[-1]
    d_q, d_k = inputs["q"].data.shape[-1], inputs["k"].data.shape[-1]
    band = params.mode == "window" and params.window_style == "band"
    if band:
        if params.left is None or params.right is None or params.window is not None:
            raise UsageError("--window-style band takes --left A and --right B (keys to each side; -1: all), "
                             "not --window.")
        for option, value in (("--left", params.left), ("--right", params.right)):
            if value < -1:
                raise UsageError(f"{option} {value}: must be -1 (all) or at least 0.")
    else:
        if params.window is None:
            raise UsageError("give --window D: the half-width of the window.")
        if params.left is not None or params.right is not None:
            raise UsageError("--left and --right go with --window-style band.")
        minimum = 1 if params.mode == "local-p" or params.window_style.startswith("cyberzhg") else 0
        if params.window < minimum:
            raise UsageError(f"--window {params.window}: must be at least {minimum} here.")
        if params.window >= lk:
            raise UsageError(f"--window {params.window} is larger than the sequence (Lk = {lk}): every key is "
                             f"in every window; use a smaller window, or `attnviz {params.score}` for full attention.")
    if params.dilation < 1:
        raise UsageError(f"--dilation {params.dilation}: must be at least 1.")
    if params.mode != "local-p" and (params.units is not None or params.renormalize or params.align_over != "window"):
        raise UsageError("--units, --renormalize and --align-over belong to --mode local-p.")
    specs = score_specs(params.score, d_q, d_k)
    if params.mode == "local-p":
        params.units = read_units(given, "W_p", params.units, also={"v_p": 0})
        specs.update({"W_p": ParamSpec((d_q, params.units)), "v_p": ParamSpec((params.units,))})
        return Problem(shape, specs)
    keep = window_keep(lq, lk, params)
    what = "band" if band else f"{params.mode} window D={params.window}"
    return Problem(shape, specs, keep=keep, keep_described=what)


def compute(ctx: Context, arrays: Mapping[str, np.ndarray], mask: Mask, params: Params,
            learned: Mapping[str, np.ndarray]) -> Result:
    import numpy as np

    from attnviz.masks import Mask

    tf = ctx.tf
    used: dict[str, object] = {"mode": params.mode, "score": params.score}
    with tf.device(ctx.device.tf_name):
        q, k, v = (ctx.tensor(arrays[n]) for n in ("q", "k", "v"))
        scores = base_scores(ctx, q, k, params.score, learned, params.scale)
        if params.mode != "local-p":
            used.update(window=params.window, window_style=params.window_style if params.mode == "window" else None)
            weights, output = softmax_and_output(ctx, scores, v, mask)
            return Result(weights, output, params=used)
        lk = int(k.shape[-2])
        hidden = tf.tanh(tf.tensordot(q, ctx.tensor(learned["W_p"]), axes=1))
        positions = lk * tf.sigmoid(tf.tensordot(hidden, ctx.tensor(learned["v_p"]), axes=1))  # [..., Lq], 1-based
        s = tf.cast(tf.range(1, lk + 1), positions.dtype)
        distance = s - positions[..., None]  # [..., Lq, Lk]
        window = np.abs(ctx.numpy(distance)) <= params.window
        shape = np.broadcast_shapes(window.shape, scores.shape)
        window = np.broadcast_to(window, shape)
        user = None if mask.keep is None else np.broadcast_to(mask.keep, shape)
        in_window = window if user is None else window & user
        align_keep = in_window if params.align_over == "window" else user
        align = masked_softmax(ctx, scores, Mask(align_keep, mask.bias))
        sigma = (params.window or 1) / 2.0
        gauss = tf.exp(-tf.square(tf.cast(distance, align.dtype)) / (2.0 * sigma * sigma))
        weights = tf.where(tf.convert_to_tensor(in_window), align * gauss, tf.zeros_like(align))
        if params.renormalize:
            weights = tf.math.divide_no_nan(weights, tf.reduce_sum(weights, axis=-1, keepdims=True))
        output = tf.matmul(tf.cast(weights, v.dtype), v)
        w, o = ctx.numpy(weights), ctx.numpy(output)
    used.update(window=params.window, sigma=sigma, units=params.units, renormalize=params.renormalize,
                align_over=params.align_over)
    return Result(w, o, params=used, maps={"positions": ctx.numpy(positions)},
                  views=[View("positions", "predicted positions p_t (1-based)", axis="q")], keep=in_window)


VARIANT = qkv_variant(
    __name__,
    name="local",
    summary="local attention: a window of keys per query (sliding window; Luong local-m and local-p)",
    formula="A = softmax over |i - j| <= D of score(q_i, k_j), O = A V",
    learned=True,
    blockwise=True,
    row_maps={"positions": -1},
)

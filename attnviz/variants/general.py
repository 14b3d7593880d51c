"""General (multiplicative) attention, Luong, Pham & Manning 2015 ("Effective Approaches to
Attention-based Neural Machine Translation", section 3.1), and its location-based score.

    general:   score(q, k) = q W_a k^T          W_a [d_q, d_k]
    location:  a = softmax(q W_a)               W_a [d_q, Lk]  (ignores the keys' contents)
    A = softmax_k(score, masked),  O = A V

Shapes: Q ``[..., Lq, d_q]``, K ``[..., Lk, d_k]``, V ``[..., Lk, d_v]`` give weights ``[..., Lq, Lk]``
and output ``[..., Lq, d_v]``. No scaling. ``W_a`` is stored ``[in, out]`` and applied as ``q @ W_a``
(a paper matrix written ``h_t^T W_a h_s`` is the same matrix). Parameter file key: ``W_a``.

Reference example (spec section 2.1): q = [1, 2], keys = values = [[1, 0], [0, 1], [1, 1]],
W_a = [[1, 0], [0, -1]]: scores [1, -2, -1], A = [0.843795, 0.042010, 0.114195].
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from attnviz.params import ParamSpec
from attnviz.variants.base import (
    Context,
    Problem,
    Result,
    check_qkv,
    check_scale,
    qkv_variant,
    scale_field,
    softmax_and_output,
)

if TYPE_CHECKING:
    import numpy as np

    from attnviz.io import Loaded
    from attnviz.masks import Mask


@dataclass
class Params:
    score: Literal["general", "location"] = field(
        default="general",
        metadata={"help": "general: q W_a k^T; location: softmax(q W_a) with W_a [d_q, Lk], independent of K"},
    )
    scale: float | None = scale_field("1")


def check(inputs: Mapping[str, Loaded], params: Params, given: Mapping[str, np.ndarray] | None) -> Problem:
    check_scale(params.scale)
    shape = check_qkv(inputs, same_dim=False)
    d_q, d_k, lk = inputs["q"].data.shape[-1], inputs["k"].data.shape[-1], inputs["k"].data.shape[-2]
    out = d_k if params.score == "general" else lk
    return Problem(shape, {"W_a": ParamSpec((d_q, out))})


def compute(ctx: Context, arrays: Mapping[str, np.ndarray], mask: Mask, params: Params,
            learned: Mapping[str, np.ndarray]) -> Result:
    tf = ctx.tf
    with tf.device(ctx.device.tf_name):
        q, k, v, w_a = (ctx.tensor(a) for a in (arrays["q"], arrays["k"], arrays["v"], learned["W_a"]))
        projected = tf.tensordot(q, w_a, axes=1)  # [..., Lq, d_k] or [..., Lq, Lk]
        if params.score == "general":
            scores = tf.matmul(projected, k, transpose_b=True)
        else:
            import numpy as np

            lead = np.broadcast_shapes(arrays["q"].shape[:-2], arrays["k"].shape[:-2])
            scores = tf.broadcast_to(projected, (*lead, *projected.shape[-2:]))  # K only sets Lk
        if params.scale is not None:
            scores = scores * ctx.scalar(params.scale, scores.dtype)
        weights, output = softmax_and_output(ctx, scores, v, mask)
    return Result(weights, output, params={"score": params.score, "scale": 1.0 if params.scale is None
                                           else params.scale})


VARIANT = qkv_variant(
    __name__,
    name="general",
    summary="general (multiplicative) attention, Luong et al. 2015; --score location",
    formula="A = softmax(Q W_a K^T), O = A V",
    learned=True,
    blockwise=True,
)

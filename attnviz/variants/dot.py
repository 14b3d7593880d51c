"""Dot-product attention, Luong et al. 2015 "dot" score (global attention, no scaling).

    A = softmax_k(Q K^T + bias, masked)
    O = A V

Shapes as ``scaled``: Q ``[..., Lq, d]``, K ``[..., Lk, d]``, V ``[..., Lk, d_v]`` give weights
``[..., Lq, Lk]`` and output ``[..., Lq, d_v]``. No learned parameters.

The same numbers as ``keras.layers.Attention(score_mode="dot", use_scale=False)`` called as
``layer([query, value, key], return_attention_scores=True)``; unlike that layer, a fully masked row
gets zero weights (Keras's ``-1e9`` bias makes it uniform).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from attnviz.variants.base import Context, Problem, Result, attend, check_qkv, check_scale, qkv_variant, scale_field

if TYPE_CHECKING:
    import numpy as np

    from attnviz.io import Loaded
    from attnviz.masks import Mask


@dataclass
class Params:
    scale: float | None = scale_field("1 (unscaled)")


def check(inputs: Mapping[str, Loaded], params: Params, given: Mapping[str, np.ndarray] | None) -> Problem:
    check_scale(params.scale)
    return Problem(check_qkv(inputs))


def compute(ctx: Context, arrays: Mapping[str, np.ndarray], mask: Mask, params: Params,
            learned: Mapping[str, np.ndarray]) -> Result:
    scale = 1.0 if params.scale is None else params.scale
    weights, output = attend(ctx, arrays["q"], arrays["k"], arrays["v"], mask, scale)
    return Result(weights, output, params={"scale": scale})


VARIANT = qkv_variant(
    __name__,
    name="dot",
    summary="dot-product attention, Luong 'dot' score, unscaled (= keras.layers.Attention)",
    formula="A = softmax(Q K^T), O = A V",
    blockwise=True,
)

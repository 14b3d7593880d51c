"""Scaled dot-product attention (Vaswani et al., 2017, "Attention Is All You Need", section 3.2.1).

    A = softmax_k(scale * Q K^T + bias, masked)      scale = 1/sqrt(d_k) unless --scale is given
    O = A V

Shapes: Q ``[..., Lq, d_k]``, K ``[..., Lk, d_k]``, V ``[..., Lk, d_v]`` (leading batch/head
dimensions broadcast) give weights ``[..., Lq, Lk]`` and output ``[..., Lq, d_v]``. No learned
parameters. ``d_k`` is the last dimension of Q.

Masked positions get exactly zero weight; a fully masked query row gets all-zero weights and a zero
output. The same numbers as ``torch.nn.functional.scaled_dot_product_attention`` with a boolean
``attn_mask`` (True = take part) and ``is_causal``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from attnviz.variants.base import Context, Problem, Result, attend, check_qkv, check_scale, qkv_variant

if TYPE_CHECKING:
    import numpy as np

    from attnviz.io import Loaded
    from attnviz.masks import Mask


@dataclass
class Params:
    scale: float | None = field(
        default=None,
        metadata={"help": "multiply Q K^T by this instead of 1/sqrt(d_k); a temperature t is --scale 1/t",
                  "above": 0},
    )


def check(inputs: Mapping[str, Loaded], params: Params, given: Mapping[str, np.ndarray] | None) -> Problem:
    check_scale(params.scale)
    return Problem(check_qkv(inputs))


def compute(ctx: Context, arrays: Mapping[str, np.ndarray], mask: Mask, params: Params,
            learned: Mapping[str, np.ndarray]) -> Result:
    d_k = arrays["q"].shape[-1]
    scale = params.scale if params.scale is not None else 1.0 / math.sqrt(d_k)
    weights, output = attend(ctx, arrays["q"], arrays["k"], arrays["v"], mask, scale)
    return Result(weights, output, params={"scale": scale, "d_k": d_k})


VARIANT = qkv_variant(
    __name__,
    name="scaled",
    summary="scaled dot-product attention (Vaswani et al. 2017)",
    formula="A = softmax(Q K^T / sqrt(d_k)), O = A V",
    blockwise=True,
)

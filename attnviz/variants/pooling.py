"""Feed-forward attention pooling (Raffel & Ellis 2015, "Feed-Forward Networks with Attention Can
Solve Some Long-Term Memory Problems"): one learned query summarises a sequence.

    e_t = v^T tanh(h_t W + b)        W [d, d_a], b [d_a], v [d_a]
    --no-tanh:  e_t = h_t W + b      W [d, 1], b [1]   (keras-self-attention's SeqWeightedAttention)
    a = softmax_t(e, masked),  c = sum_t a_t h_t

Input H ``[..., L, d]`` (e.g. RNN states over time) gives weights ``[..., 1, L]`` (one row: the
distribution over time) and the context ``c`` as output ``[..., 1, d]``. This is the last layer of
the taxonomy seed note (``att_weight``, ``att_bias``, ``att_var`` there are ``W``, ``b``, ``v``).
With tanh every score lies in ``[-sum|v|, sum|v|]``, so no weight can exceed another by more than
``exp(2 sum|v|)`` (e^2 = 7.39 for the paper's scalar case); ``params.max_weight_ratio`` reports it.
Masks are key masks over time: ``--mask [L]`` or ``--key-padding-mask [batch..., L]``.

Reference example (spec section 11): H = [[1, 0], [0, 1], [1, 1]], W = I, b = 0, v = [1, 2]:
a = [0.129391, 0.277115, 0.593494], c = [0.722885, 0.870609].
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from attnviz.errors import UsageError
from attnviz.params import ParamSpec, bias
from attnviz.variants.base import (
    Context,
    InputSpec,
    Problem,
    Result,
    read_units,
    require_rank,
    softmax_and_output,
    units_field,
    variant,
)

if TYPE_CHECKING:
    import numpy as np

    from attnviz.io import Loaded
    from attnviz.masks import Mask


@dataclass
class Params:
    units: int | None = units_field("d_a, the width of the tanh layer")
    no_tanh: bool = field(default=False, metadata={"help": "linear scores h W + b, W [d, 1] "
                                                             "(SeqWeightedAttention)"})


def check(inputs: Mapping[str, Loaded], params: Params, given: Mapping[str, np.ndarray] | None) -> Problem:
    h = inputs["h"]
    require_rank(h, "H", 2, "[..., L, d]")
    lead, (length, d) = h.data.shape[:-2], h.data.shape[-2:]
    shape = (*lead, 1, length)
    if params.no_tanh:
        if params.units is not None:
            raise UsageError("--units belongs to the tanh form, not --no-tanh.")
        return Problem(shape, {"W": ParamSpec((d, 1)), "b": bias(1)})
    params.units = read_units(given, "W", params.units, also={"b": 0, "v": 0})
    return Problem(shape, {"W": ParamSpec((d, params.units)), "b": bias(params.units),
                           "v": ParamSpec((params.units,))})


def compute(ctx: Context, arrays: Mapping[str, np.ndarray], mask: Mask, params: Params,
            learned: Mapping[str, np.ndarray]) -> Result:
    import numpy as np

    tf = ctx.tf
    p = {name: ctx.tensor(value) for name, value in learned.items()}
    with tf.device(ctx.device.tf_name):
        h = ctx.tensor(arrays["h"])
        hidden = tf.tensordot(h, p["W"], axes=1) + p["b"]  # [..., L, d_a]
        if params.no_tanh:
            scores = hidden[..., 0]
            used: dict[str, object] = {"tanh": False}
        else:
            scores = tf.tensordot(tf.tanh(hidden), p["v"], axes=1)
            bound = 2.0 * float(np.abs(learned["v"]).sum())
            used = {"tanh": True, "units": params.units,
                    "max_weight_ratio": math.exp(bound) if bound < 700 else math.inf}
        weights, output = softmax_and_output(ctx, scores[..., None, :], h, mask)
    return Result(weights, output, params=used)


VARIANT = variant(
    __name__,
    name="pooling",
    summary="feed-forward attention pooling over time, Raffel & Ellis 2015",
    formula="a = softmax_t(v^T tanh(h_t W + b)), c = sum_t a_t h_t",
    inputs=(InputSpec("h", "the sequence to pool [..., L, d]"),),
    query_input="",
    key_input="h",
    learned=True,
    axis_names=("pool", "time"),
)

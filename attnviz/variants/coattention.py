"""Co-attention (mutual attention) between two sequences A and B: one affinity matrix, normalised
both ways (the "mutual attention" of the dot-product seed note; Xiong et al. 2017, Dynamic
Coattention Networks, for --dcn).

    L   = scale * A B^T                      [..., La, Lb], scale = 1/sqrt(d) unless --scale
    A_r = softmax over B of L (rows)          A attends to B: each row sums to 1     (the weights)
    A_c = softmax over A of L (columns)       B attends to A: each column sums to 1  (map b_to_a)
    O   = A_r V_B                             [..., La, d_vb]   (V_B defaults to B; the output)
    O_B = A_c^T V_A                           [..., Lb, d_va]   (V_A defaults to A; map output_b)
    --dcn:  C = A_r (A_c^T V_A)               [..., La, d_va]   (map dcn)

The seed note reads sentence-to-sentence attention off the sums: ``received_by_b`` (column sums of
A_r: how much attention each B token receives from A) and ``received_by_a`` (row sums of A_c). Both
maps and both sums are shown in tables, the PNG and the JSON ``maps`` (with ``affinity``). A mask
``[..., La, Lb]`` applies to both softmaxes (a key-padding mask masks B tokens; a mask with rows of
zeros masks A tokens). No learned parameters.

Reference example (spec section 12, d = 4, scale 1/2): A = [[1,0,1,0],[0,2,0,0]], B = [[1,0,1,0],
[0,1,0,1],[1,1,1,1]]: A_r = [[0.422319, 0.155362, 0.422319], [0.155362, 0.422319, 0.422319]],
A_c = [[0.731059, 0.268941, 0.5], [0.268941, 0.731059, 0.5]].
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from attnviz.errors import ShapeError, shape_str
from attnviz.variants.base import (
    Context,
    InputSpec,
    Problem,
    Result,
    View,
    broadcast_leading,
    check_scale,
    masked_softmax,
    require_rank,
    variant,
)

if TYPE_CHECKING:
    import numpy as np

    from attnviz.io import Loaded
    from attnviz.masks import Mask


@dataclass
class Params:
    scale: float | None = field(default=None, metadata={"help": "multiply A B^T by this instead of 1/sqrt(d)",
                                                        "above": 0})
    dcn: bool = field(default=False, metadata={"help": "also compute the DCN summary C = A_r (A_c^T V_A)"})


INPUTS = (
    InputSpec("a", "sequence A [..., La, d], or one file holding a and b"),
    InputSpec("b", "sequence B [..., Lb, d]"),
    InputSpec("vb", "values of B [..., Lb, d_vb], averaged by A's attention (default: B)", optional=True),
    InputSpec("va", "values of A [..., La, d_va], averaged by B's attention (default: A)", optional=True),
)


def check(inputs: Mapping[str, Loaded], params: Params, given: Mapping[str, np.ndarray] | None) -> Problem:
    check_scale(params.scale)
    a, b = inputs["a"], inputs["b"]
    for name in ("a", "b", "vb", "va"):
        if name in inputs:
            require_rank(inputs[name], name.upper(), 2, "[..., length, features]")
    if a.data.shape[-1] != b.data.shape[-1]:
        raise ShapeError(f"A ({a.source}) has shape {shape_str(a.data.shape)} and B ({b.source}) "
                         f"{shape_str(b.data.shape)}; their last dimensions must be equal.")
    for name, length, of in (("vb", b.data.shape[-2], "B"), ("va", a.data.shape[-2], "A")):
        if name in inputs and inputs[name].data.shape[-2] != length:
            raise ShapeError(f"{name.upper()} ({inputs[name].source}) has shape "
                             f"{shape_str(inputs[name].data.shape)}; it needs one row per token of {of} ({length}).")
    lead = broadcast_leading(inputs, tuple(n for n in ("a", "b", "vb", "va") if n in inputs))
    return Problem((*lead, a.data.shape[-2], b.data.shape[-2]))


def compute(ctx: Context, arrays: Mapping[str, np.ndarray], mask: Mask, params: Params,
            learned: Mapping[str, np.ndarray]) -> Result:
    import numpy as np

    from attnviz.masks import Mask
    from attnviz.variants.base import check_finite_result

    tf = ctx.tf
    d = arrays["a"].shape[-1]
    scale = params.scale if params.scale is not None else 1.0 / math.sqrt(d)
    lead = np.broadcast_shapes(*(arrays[n].shape[:-2] for n in arrays))
    shape = (*lead, arrays["a"].shape[-2], arrays["b"].shape[-2])
    full_keep = None if mask.keep is None else np.broadcast_to(mask.keep, shape)
    full_bias = None if mask.bias is None else np.broadcast_to(mask.bias, shape)
    columns = Mask(None if full_keep is None else np.swapaxes(full_keep, -1, -2),
                   None if full_bias is None else np.swapaxes(full_bias, -1, -2))
    with tf.device(ctx.device.tf_name):
        a, b = ctx.tensor(arrays["a"]), ctx.tensor(arrays["b"])
        vb = ctx.tensor(arrays["vb"]) if "vb" in arrays else b
        va = ctx.tensor(arrays["va"]) if "va" in arrays else a
        affinity = tf.broadcast_to(tf.matmul(a * ctx.scalar(scale, a.dtype), b, transpose_b=True), shape)
        rows = masked_softmax(ctx, affinity, mask)  # A_r [..., La, Lb]
        cols_t = masked_softmax(ctx, tf.linalg.matrix_transpose(affinity), columns)  # A_c^T [..., Lb, La]
        out = tf.matmul(tf.cast(rows, vb.dtype), vb)
        out_b = tf.matmul(tf.cast(cols_t, va.dtype), va)
        maps = {
            "b_to_a": ctx.numpy(tf.linalg.matrix_transpose(cols_t)),
            "received_by_b": ctx.numpy(tf.reduce_sum(rows, axis=-2)),
            "received_by_a": ctx.numpy(tf.reduce_sum(cols_t, axis=-2)),
            "output_b": ctx.numpy(out_b),
            "affinity": ctx.numpy(affinity),
        }
        if params.dcn:
            maps["dcn"] = ctx.numpy(tf.matmul(tf.cast(rows, out_b.dtype), out_b))
        weights, output = ctx.numpy(rows), ctx.numpy(out)
    check_finite_result(weights, ctx.dtype)
    check_finite_result(maps["b_to_a"], ctx.dtype)
    views = [
        View("b_to_a", "B attends to A (column softmax: each column sums to 1)"),
        View("received_by_b", "attention each B token receives from A (column sums of A attends to B)", axis="k"),
        View("received_by_a", "attention each A token receives from B (row sums of B attends to A)", axis="q"),
    ]
    return Result(weights, output, params={"scale": scale, "dcn": params.dcn}, maps=maps, views=views)


VARIANT = variant(
    __name__,
    name="coattention",
    summary="co-attention between two sequences: row and column softmax of one affinity matrix",
    formula="L = A B^T / sqrt(d); A_r = softmax_rows(L), A_c = softmax_cols(L); O = A_r B",
    inputs=INPUTS,
    query_input="a",
    key_input="b",
    axis_names=("A", "B"),
    weights_title="A attends to B (row softmax: each row sums to 1)",
)

"""Bidirectional attention flow (Seo et al. 2017, "Bidirectional Attention Flow for Machine
Comprehension", section 2.4): attention from the context to the query and from the query to the context.

    S_tj = w_h . h_t + w_u . u_j + w_hu . (h_t * u_j)          similarity [..., T, J], w = [w_h; w_u; w_hu]
    C2Q:  a_t = softmax_j(S_t:),       u~_t = sum_j a_tj u_j       (the weights [..., T, J])
    Q2C:  b = softmax_t(max_j S_tj),   h~ = sum_t b_t h_t           (map q2c [..., T]; tiled over t)
    G_t = [h_t ; u~_t ; h_t * u~_t ; h_t * h~]                      (the output [..., T, 4e])

Inputs CONTEXT ``H [..., T, e]`` and QUERY ``U [..., J, e]``; parameter ``w [3e]``. A mask
``[..., T, J]`` (or ``--key-padding-mask`` over the query words) applies to the C2Q softmax; context
rows with no query word left are padding and are left out of the Q2C softmax (the max over j skips
masked words). Maps: ``q2c``, ``similarity`` (the raw S) and ``context_summary`` (h~).

Reference example (spec section 8): H = [[1,0],[0,1],[1,1]], U = [[1,0],[0,1]], w = [1,0, 0,1, 1,1]:
S = [[2,2],[0,2],[2,3]], C2Q rows [[0.5,0.5],[0.119203,0.880797],[0.268941,0.731059]], Q2C
[0.211942, 0.211942, 0.576117].
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from attnviz.errors import ShapeError, shape_str
from attnviz.params import ParamSpec
from attnviz.variants.base import (
    Context,
    InputSpec,
    Problem,
    Result,
    View,
    broadcast_leading,
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
    pass


def check(inputs: Mapping[str, Loaded], params: Params, given: Mapping[str, np.ndarray] | None) -> Problem:
    h, u = inputs["context"], inputs["query"]
    require_rank(h, "CONTEXT", 2, "[..., T, e]")
    require_rank(u, "QUERY", 2, "[..., J, e]")
    if h.data.shape[-1] != u.data.shape[-1]:
        raise ShapeError(f"CONTEXT ({h.source}) has shape {shape_str(h.data.shape)} and QUERY ({u.source}) "
                         f"{shape_str(u.data.shape)}; their last dimensions (e) must be equal.")
    lead = broadcast_leading(inputs, ("context", "query"))
    e = h.data.shape[-1]
    return Problem((*lead, h.data.shape[-2], u.data.shape[-2]), {"w": ParamSpec((3 * e,))})


def compute(ctx: Context, arrays: Mapping[str, np.ndarray], mask: Mask, params: Params,
            learned: Mapping[str, np.ndarray]) -> Result:
    import numpy as np

    from attnviz.masks import Mask
    from attnviz.variants.base import check_finite_result

    tf = ctx.tf
    e = arrays["context"].shape[-1]
    lead = np.broadcast_shapes(arrays["context"].shape[:-2], arrays["query"].shape[:-2])
    shape = (*lead, arrays["context"].shape[-2], arrays["query"].shape[-2])
    keep = None if mask.keep is None else np.broadcast_to(mask.keep, shape)
    context_keep = None if keep is None else np.asarray(keep.any(axis=-1))
    with tf.device(ctx.device.tf_name):
        h, u = ctx.tensor(arrays["context"]), ctx.tensor(arrays["query"])
        w = ctx.tensor(learned["w"])
        w_h, w_u, w_hu = w[:e], w[e:2 * e], w[2 * e:]
        similarity = (tf.tensordot(h, w_h, axes=1)[..., :, None] + tf.tensordot(u, w_u, axes=1)[..., None, :]
                      + tf.matmul(h * w_hu, u, transpose_b=True))
        similarity = tf.broadcast_to(similarity, shape)
        c2q = masked_softmax(ctx, similarity, mask)  # [..., T, J]
        attended = tf.matmul(tf.cast(c2q, u.dtype), u)  # u~ [..., T, e]
        s = tf.cast(similarity, c2q.dtype)
        if keep is not None:
            s = tf.where(tf.convert_to_tensor(keep), s, tf.constant(-np.inf, s.dtype))
        q2c = masked_softmax(ctx, tf.reduce_max(s, axis=-1), Mask(context_keep))  # [..., T]
        summary = tf.einsum("...t,...te->...e", tf.cast(q2c, h.dtype), h)  # h~ [..., e]
        h_full = tf.broadcast_to(h, (*lead, *h.shape[-2:]))
        g = tf.concat([h_full, attended, h_full * attended, h_full * summary[..., None, :]], axis=-1)
        weights, output = ctx.numpy(c2q), ctx.numpy(g)
        maps = {"q2c": ctx.numpy(q2c), "similarity": ctx.numpy(similarity), "context_summary": ctx.numpy(summary)}
    check_finite_result(weights, ctx.dtype)
    views = [View("q2c", "query-to-context weights (over the context)", axis="q", png=True),
             View("similarity", "similarity S (before either softmax)", png=False)]
    return Result(weights, output, params={"e": e}, maps=maps, views=views)


VARIANT = variant(
    __name__,
    name="bidirectional",
    summary="bidirectional attention flow (BiDAF, Seo et al. 2017): context-to-query and query-to-context",
    formula="S = w^T[h; u; h*u]; C2Q = softmax_j(S); Q2C = softmax_t(max_j S); G = [h; u~; h*u~; h*h~]",
    inputs=(InputSpec("context", "the context H [..., T, e], or one file holding context and query"),
            InputSpec("query", "the query U [..., J, e]")),
    query_input="context",
    key_input="query",
    learned=True,
    axis_names=("context", "query"),
    weights_title="context-to-query weights",
)

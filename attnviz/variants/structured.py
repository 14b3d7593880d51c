"""Structured attention: attention restricted to a graph, and CRF segmentation attention.

    --method graph:  A = softmax_j(score_ij) over the edges of --adjacency FILE  (keep[i, j] = 1: i may
                     attend to j; self-loops added unless --no-self-loops), O = A V
                     --score scaled / dot: Q K^T (/ sqrt(d));  --score gat (Velickovic et al. 2018):
                     Z = X W, e_ij = LeakyReLU(Z_i a_src + Z_j a_dst) (slope --negative-slope), O = A Z
    --method crf (Kim, Denton, Hoang & Rush 2017, "Structured Attention Networks", segmentation):
                     each key j has a latent z_j in {0, 1} in a linear-chain CRF with unaries
                     theta_j(1) = k_j W q (bilinear, W [d_k, d_q]; or --unary FILE), theta_j(0) = 0, and
                     transitions T [2, 2];  A_ij = p(z_j = 1 | q_i), by forward-backward in log space
                     O = A V;  --normalize L: A = L A / sum(A) (harvardnlp's NMT code)

Graph: Q ``[..., n, d]`` (K and V default to Q) with an adjacency ``[..., n, n]`` (0/1, broadcasting);
isolated nodes without self-loops are fully masked rows (zero weights). Parameters: gat ``W [d, d']``,
``a_src [d']``, ``a_dst [d']`` (--units d').

CRF: Q ``[..., Lq, d_q]``, K ``[..., Lk, d_k]``, V ``[..., Lk, d_v]`` give marginals ``[..., Lq, Lk]``,
which do not sum to 1 (several keys can be selected at once). Masked keys leave the chain. Start and
end potentials are zero (harvardnlp averages the transition rows there). T = 0 gives independent
``sigmoid(theta)``, the paper's "sigmoid attention". Parameters ``W``, ``T`` (drawn zero).

Reference examples (spec section 6): unaries [1, -1, 2], T = [[0, 0], [0, 1]] give marginals
[0.832278, 0.675973, 0.929316]; GAT on the path 0-1-2 with X = [[1,0],[0,1],[1,1]], W = I,
a_src = [1, 0], a_dst = [0, -1] gives A = [[0.731059, 0.268941, 0], [0.379152, 0.310424, 0.310424],
[0, 0.5, 0.5]].
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from attnviz.choices import MAX_WIDTH
from attnviz.errors import ShapeError, UsageError, shape_str
from attnviz.params import ParamSpec
from attnviz.variants.base import (
    Context,
    InputSpec,
    NumericError,
    Problem,
    Result,
    base_scores,
    broadcast_leading,
    check_scale,
    read_units,
    require_rank,
    scale_field,
    softmax_and_output,
    variant,
)

if TYPE_CHECKING:
    import numpy as np

    from attnviz.io import Loaded
    from attnviz.masks import Mask


@dataclass
class Params:
    method: Literal["graph", "crf"] = field(default="graph", metadata={"help": "graph: attention along the edges "
                                                                                "of --adjacency; crf: segmentation "
                                                                                "marginals of a linear-chain CRF"})
    adjacency: str | None = field(default=None, metadata={"help": "graph: 0/1 adjacency [..., n, n] (1: i may "
                                                                    "attend to j)", "metavar": "FILE"})
    no_self_loops: bool = field(default=False, metadata={"help": "graph: do not add self-loops"})
    score: Literal["scaled", "dot", "gat"] = field(default="scaled", metadata={"help": "graph: scaled or dot "
                                                                                     "product of Q and K, or GAT"})
    scale: float | None = scale_field("the --score's (graph: 1/sqrt(d) for scaled, 1 for dot)")
    units: int | None = field(default=None, metadata={"help": "gat: d', the width of W (default: from --params, "
                                                              "else d)", "min": 1,
                                                      "max": MAX_WIDTH})
    negative_slope: float = field(default=0.2, metadata={"help": "gat: LeakyReLU slope", "min": 0, "max": 1})
    unary: str | None = field(default=None, metadata={"help": "crf: unary scores theta(1) [..., Lq, Lk] instead of "
                                                              "the bilinear k W q", "metavar": "FILE"})
    normalize: float | None = field(default=None, metadata={"help": "crf: rescale each row to sum to this "
                                                                      "(harvardnlp NMT uses 1)",
                                                            "above": 0, "max": 1e6})
    unary_values: Any = field(default=None, metadata={"cli": False})  # --unary, read in check


INPUTS = (
    InputSpec("q", "queries [..., Lq, d] (graph: the node features X)"),
    InputSpec("k", "keys [..., Lk, d] (default: Q)", optional=True),
    InputSpec("v", "values [..., Lk, d_v] (default: K)", optional=True),
)


def _check_graph(inputs: Mapping[str, Loaded], params: Params, shape: tuple[int, ...],
                 given: Mapping[str, np.ndarray] | None) -> Problem:
    import numpy as np

    from attnviz.io import load_array
    from attnviz.masks import boolean_keep, check_broadcast

    lq, lk = shape[-2], shape[-1]
    if params.adjacency is None:
        raise UsageError("--method graph needs --adjacency FILE (0/1, [..., n, n]).")
    if lq != lk:
        raise ShapeError(f"graph attention is among the nodes of one graph: Q has {lq} rows and K {lk}.")
    loaded = load_array(params.adjacency)
    keep = boolean_keep(loaded, "keep")
    if keep.ndim < 2 or keep.shape[-2:] != (lq, lk):
        raise ShapeError(f"{loaded.source}: the adjacency has shape {shape_str(keep.shape)}; expected [..., {lq}, "
                         f"{lk}] for {lq} nodes.")
    check_broadcast(keep, shape, loaded.source)
    if not params.no_self_loops:
        keep = keep | np.eye(lq, dtype=bool)
    files = [loaded.path] if loaded.path is not None else []
    specs: dict[str, ParamSpec] = {}
    if params.score == "gat":
        d = inputs["q"].data.shape[-1]
        params.units = read_units(given, "W", params.units, d, also={"a_src": 0, "a_dst": 0})
        specs = {"W": ParamSpec((d, params.units)), "a_src": ParamSpec((params.units,)),
                 "a_dst": ParamSpec((params.units,))}
    loops = "" if params.no_self_loops else " + self-loops"
    return Problem(shape, specs, keep=keep, keep_described=f"adjacency {loaded.source}{loops}", files=files)


def check(inputs: Mapping[str, Loaded], params: Params, given: Mapping[str, np.ndarray] | None) -> Problem:
    q = inputs["q"]
    k = inputs.get("k", q)
    v = inputs.get("v", k)
    named = {"q": q, "k": k, "v": v}
    for name, loaded in named.items():
        require_rank(loaded, name.upper(), 2, "[..., length, features]")
    if k.data.shape[-2] != v.data.shape[-2]:
        raise ShapeError(f"Lk differs: K has shape {shape_str(k.data.shape)} and V {shape_str(v.data.shape)}.")
    shape = (*broadcast_leading(named, ("q", "k", "v")), q.data.shape[-2], k.data.shape[-2])
    check_scale(params.scale)
    if params.scale is not None and (params.method != "graph" or params.score == "gat"):
        raise UsageError("--scale goes with --method graph and --score scaled or dot.")
    graph_only = params.adjacency is not None or params.no_self_loops or params.score != "scaled" or params.units
    crf_only = params.unary is not None or params.normalize is not None
    if params.method == "graph":
        if crf_only:
            raise UsageError("--unary and --normalize go with --method crf.")
        if params.score != "gat" and q.data.shape[-1] != k.data.shape[-1]:
            raise ShapeError(f"d differs: Q {shape_str(q.data.shape)} and K {shape_str(k.data.shape)}.")
        return _check_graph(named, params, shape, given)
    if graph_only:
        raise UsageError("--adjacency, --no-self-loops, --score and --units go with --method graph.")
    if params.unary is not None:
        from attnviz.io import load_array
        from attnviz.masks import check_broadcast

        loaded = load_array(params.unary)
        check_broadcast(loaded.data, shape, loaded.source)
        params.unary_values = loaded.data
        return Problem(shape, {"T": ParamSpec((2, 2), init="zeros")},
                       files=[loaded.path] if loaded.path is not None else [])
    d_q, d_k = q.data.shape[-1], k.data.shape[-1]
    return Problem(shape, {"W": ParamSpec((d_k, d_q)), "T": ParamSpec((2, 2), init="zeros")})


def _logsumexp(x: np.ndarray, axis: int) -> np.ndarray:
    import numpy as np

    top = np.max(x, axis=axis, keepdims=True)
    return np.squeeze(top, axis=axis) + np.log(np.sum(np.exp(x - top), axis=axis))


def crf_marginals(unary: np.ndarray, transitions: np.ndarray, keep: np.ndarray) -> np.ndarray:
    """``p(z_j = 1)`` for every row of ``unary [..., n]`` (theta_j(1); theta_j(0) = 0) in a binary
    linear chain with ``transitions [2, 2]`` over the kept positions, by forward-backward in log space."""
    import numpy as np

    unary = np.asarray(unary, dtype=np.float64)
    keep = np.broadcast_to(keep, unary.shape)
    t = np.asarray(transitions, dtype=np.float64)
    n = unary.shape[-1]
    theta = np.stack([np.zeros_like(unary), np.where(keep, unary, 0.0)], axis=-1)  # [..., n, 2]
    alphas = np.zeros(theta.shape)
    alpha = np.zeros(theta.shape[:-2] + (2,))
    started = np.zeros(theta.shape[:-2], bool)
    for j in range(n):
        moved = theta[..., j, :] + _logsumexp(alpha[..., :, None] + t, axis=-2)
        new = np.where(started[..., None], moved, theta[..., j, :])
        alpha = np.where(keep[..., j, None], new, alpha)
        started |= keep[..., j]
        alphas[..., j, :] = alpha
    betas = np.zeros(theta.shape)
    following = np.zeros(alpha.shape)  # theta + beta of the next kept position
    has_next = np.zeros(started.shape, bool)
    for j in reversed(range(n)):
        beta = np.where(has_next[..., None], _logsumexp(t + following[..., None, :], axis=-1), 0.0)
        betas[..., j, :] = beta
        following = np.where(keep[..., j, None], theta[..., j, :] + beta, following)
        has_next |= keep[..., j]
    log_z = _logsumexp(alpha, axis=-1)[..., None]
    marginals = np.exp(alphas[..., 1] + betas[..., 1] - log_z)
    return np.where(keep, marginals, 0.0)


def compute(ctx: Context, arrays: Mapping[str, np.ndarray], mask: Mask, params: Params,
            learned: Mapping[str, np.ndarray]) -> Result:
    import numpy as np

    tf = ctx.tf
    with tf.device(ctx.device.tf_name):
        q = ctx.tensor(arrays["q"])
        k = ctx.tensor(arrays["k"]) if "k" in arrays else q
        v = ctx.tensor(arrays["v"]) if "v" in arrays else k
        if params.method == "graph":
            used: dict[str, object] = {"method": "graph", "score": params.score, "self_loops": not params.no_self_loops}
            if params.score == "gat":
                z = tf.tensordot(q, ctx.tensor(learned["W"]), axes=1)  # [..., n, d']
                src = tf.tensordot(z, ctx.tensor(learned["a_src"]), axes=1)[..., :, None]
                dst = tf.tensordot(z, ctx.tensor(learned["a_dst"]), axes=1)[..., None, :]
                scores = tf.nn.leaky_relu(src + dst, alpha=params.negative_slope)
                used.update(units=params.units, negative_slope=params.negative_slope)
                weights, output = softmax_and_output(ctx, scores, z, mask)
            else:
                scores = base_scores(ctx, q, k, params.score, learned, params.scale)
                weights, output = softmax_and_output(ctx, scores, v, mask)
            return Result(weights, output, params=used)
        if params.unary_values is not None:
            unary = np.asarray(params.unary_values, dtype=np.float64)
        else:  # theta_j(1) = k_j W q_i
            unary = ctx.numpy(tf.matmul(q, tf.tensordot(k, ctx.tensor(learned["W"]), axes=1),
                                        transpose_b=True)).astype(np.float64)
        lead = np.broadcast_shapes(tuple(q.shape[:-2]), tuple(k.shape[:-2]), tuple(v.shape[:-2]))
        unary = np.broadcast_to(unary, (*lead, int(q.shape[-2]), int(k.shape[-2])))
        if mask.bias is not None:
            unary = unary + mask.bias
        keep = np.ones(unary.shape, bool) if mask.keep is None else np.broadcast_to(mask.keep, unary.shape)
        marginals = crf_marginals(unary, learned["T"], keep)
        used = {"method": "crf", "unary": "file" if params.unary_values is not None else "bilinear"}
        if params.normalize is not None:
            total = marginals.sum(axis=-1, keepdims=True)
            marginals = np.divide(params.normalize * marginals, total, out=np.zeros_like(marginals),
                                  where=total > 0)
            used["normalize"] = params.normalize
        dtype = np.float64 if ctx.dtype == "float64" else np.float32
        output = ctx.numpy(tf.matmul(ctx.tensor(marginals), v))
    if not math.isfinite(float(np.sum(marginals))):
        raise NumericError("the CRF marginals came out non-finite; the unary or pairwise scores overflowed "
                           f"{ctx.dtype}: use --dtype float64 or rescale them.", "the CRF marginals")
    return Result(marginals.astype(dtype), output, params=used)


VARIANT = variant(
    __name__,
    name="structured",
    summary="structured attention: along the edges of a graph (dot product or GAT), or CRF segmentation marginals",
    formula="graph: A = softmax over edges; crf: A_ij = p(z_j = 1 | q_i) in a linear-chain CRF",
    inputs=INPUTS,
    learned=True,
)


"""Self-attention: queries, keys and values are all projected from one sequence X.

    --score scaled (default):  Q = X W_Q + b_Q,  K = X W_K + b_K,  V = X W_V + b_V
                               A = softmax(Q K^T / sqrt(d_k), masked),  O = A V
    --score additive:          e[t, t'] = tanh(x_t Wt + x_t' Wx + bh) Wa + ba
    --score multiplicative:    e[t, t'] = x_t Wa x_t'^T + ba
                               A = softmax(e, masked),  O = A X  (values are X itself)

The additive and multiplicative scores are those of keras-self-attention's ``SeqSelfAttention``
(CyberZHG, 0.51), with ``--units`` (its ``units``, default 32), ``--width`` (``attention_width``: key
t' is kept when ``t - width//2 <= t' < t - width//2 + width``) and ``--history-only`` (the window ends
at t; without --width this is causal). Two of that layer's quirks are not reproduced, and attnviz
says so when they matter: its mask lets a real query attend to padded keys (attnviz masks padded
keys for every query), and its ``attention_activation`` is not offered (without one, ``ba`` shifts
every score equally and changes nothing).

Shapes: X ``[..., L, d]`` gives weights ``[..., L, L]`` and output ``[..., L, d_v]`` (``d`` for the
SeqSelfAttention scores). Parameter keys: scaled ``W_Q [d, d_k]``, ``W_K [d, d_k]``, ``W_V [d, d_v]``
and optional ``b_Q``, ``b_K``, ``b_V``, or the seed note's packed ``kernel [3, d, d_out]`` (W_Q, W_K,
W_V stacked; scaled here by 1/sqrt(d_out), where the note divides by the batch size by mistake);
additive ``Wt``, ``Wx [d, units]``, ``Wa [units, 1]``, optional ``bh [units]``, ``ba [1]``;
multiplicative ``Wa [d, d]``, optional ``ba [1]``.

Reference example (spec section 10.1): X = [[1, 0], [0, 1], [1, 1]], W_Q = I, W_K = [[1, 1], [0, 1]],
W_V = [[1, 0], [0, 2]]: A = [[0.401112, 0.197776, 0.401112], [0.248255, 0.248255, 0.503490],
[0.283995, 0.140029, 0.575975]].
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from attnviz.choices import MAX_WIDTH
from attnviz.errors import ParamsError, UsageError, shape_str
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
    score: Literal["scaled", "additive", "multiplicative"] = field(
        default="scaled",
        metadata={"help": "scaled: projections W_Q, W_K, W_V and scaled dot product; additive / multiplicative: "
                          "keras-self-attention's SeqSelfAttention"})
    key_dim: int | None = field(default=None, metadata={"help": "d_k when the parameters are drawn (default d)",
                                                        "min": 1, "max": MAX_WIDTH})
    value_dim: int | None = field(default=None, metadata={"help": "d_v when the parameters are drawn (default d)",
                                                          "min": 1, "max": MAX_WIDTH})
    units: int | None = units_field("additive: units of the tanh layer")
    width: int | None = field(default=None, metadata={"help": "attend only within a window of this many keys "
                                                                 "(SeqSelfAttention attention_width)",
                                                      "min": 1})
    history_only: bool = field(default=False, metadata={"help": "the window ends at the query (causal)"})


def window_keep(length: int, width: int | None, history_only: bool) -> np.ndarray | None:
    """SeqSelfAttention's window: key t' kept when ``lower <= t' < lower + width`` with
    ``lower = t - width // 2``, or ``t - (width - 1)`` with history_only."""
    import numpy as np

    if width is None and not history_only:
        return None
    t = np.arange(length)[:, None]
    j = np.arange(length)[None, :]
    if width is None:
        return j <= t
    lower = t - (width - 1) if history_only else t - width // 2
    return (lower <= j) & (j < lower + width)


def _width(given: Mapping[str, np.ndarray] | None, key: str, also: Mapping[str, int], option: str,
           requested: int | None, d: int) -> int:
    """d_k (or d_v): the last axis of ``given[key]`` [d, d_k] when the file has it, checked against the
    arrays in ``also`` and against the option; else the option, else d."""
    if given is not None and key in given and given[key].ndim != 2:
        raise ParamsError(f"parameters: key {key!r} has shape {shape_str(given[key].shape)}; expected [d, width].")
    name = "d_k" if option == "--key-dim" else "d_v"
    return read_units(given, key, requested, d, also, option=option, name=name)


def check(inputs: Mapping[str, Loaded], params: Params, given: Mapping[str, np.ndarray] | None) -> Problem:
    x = inputs["x"]
    require_rank(x, "X", 2, "[..., L, d]")
    lead, (length, d) = x.data.shape[:-2], x.data.shape[-2:]
    if params.width is not None and params.width < 1:
        raise UsageError(f"--width {params.width}: must be at least 1.")
    if params.score != "additive" and params.units is not None:
        raise UsageError("--units belongs to --score additive.")
    if params.score != "scaled" and (params.key_dim or params.value_dim):
        raise UsageError("--key-dim and --value-dim belong to --score scaled.")
    shape = (*lead, length, length)
    keep = window_keep(length, params.width, params.history_only)
    described = f"window (width {params.width}{', history only' if params.history_only else ''})"

    if params.score == "scaled":
        if given is not None and "kernel" in given:
            kernel = given["kernel"]
            if kernel.ndim != 3 or kernel.shape[0] != 3:
                raise ParamsError(f"parameters: the packed 'kernel' is [3, d, d_out] (W_Q, W_K, W_V); received "
                                  f"{shape_str(kernel.shape)}.")
            for option, requested in (("--key-dim", params.key_dim), ("--value-dim", params.value_dim)):
                if requested is not None and requested != kernel.shape[2]:
                    raise ParamsError(f"parameters: the packed 'kernel' {shape_str(kernel.shape)} has d_out = "
                                      f"{kernel.shape[2]}, but {option} {requested} was given.")
            specs = {"kernel": ParamSpec((3, d, kernel.shape[2]), fans=(d, kernel.shape[2]))}
        else:
            d_k = _width(given, "W_Q", {"W_K": 1, "b_Q": 0, "b_K": 0}, "--key-dim", params.key_dim, d)
            d_v = _width(given, "W_V", {"b_V": 0}, "--value-dim", params.value_dim, d)
            specs = {"W_Q": ParamSpec((d, d_k)), "W_K": ParamSpec((d, d_k)), "W_V": ParamSpec((d, d_v)),
                     "b_Q": bias(d_k), "b_K": bias(d_k), "b_V": bias(d_v)}
    elif params.score == "additive":
        units = params.units = read_units(given, "Wt", params.units, also={"Wx": 1, "bh": 0, "Wa": 0})
        specs = {"Wt": ParamSpec((d, units)), "Wx": ParamSpec((d, units)), "bh": bias(units),
                 "Wa": ParamSpec((units, 1)), "ba": bias(1)}
    else:
        specs = {"Wa": ParamSpec((d, d)), "ba": bias(1)}
    return Problem(shape, specs, keep=keep, keep_described=described)


def compute(ctx: Context, arrays: Mapping[str, np.ndarray], mask: Mask, params: Params,
            learned: Mapping[str, np.ndarray]) -> Result:
    tf = ctx.tf
    p = {name: ctx.tensor(value) for name, value in learned.items()}
    warnings = []
    if params.score != "scaled" and any(not d.startswith("window") for d in mask.described):
        warnings.append("SeqSelfAttention itself lets real queries attend to padded keys; attnviz masks them "
                        "for every query (reference section 10.2).")
    with tf.device(ctx.device.tf_name):
        x = ctx.tensor(arrays["x"])
        if params.score == "scaled":
            if "kernel" in p:
                w_q, w_k, w_v = p["kernel"][0], p["kernel"][1], p["kernel"][2]
                b_q = b_k = b_v = 0.0
            else:
                w_q, w_k, w_v, b_q, b_k, b_v = (p[n] for n in ("W_Q", "W_K", "W_V", "b_Q", "b_K", "b_V"))
            q = tf.tensordot(x, w_q, axes=1) + b_q
            k = tf.tensordot(x, w_k, axes=1) + b_k
            v = tf.tensordot(x, w_v, axes=1) + b_v
            scale = 1.0 / math.sqrt(int(q.shape[-1]))
            scores = tf.matmul(q * ctx.scalar(scale, q.dtype), k, transpose_b=True)
            used = {"score": "scaled", "scale": scale, "d_k": int(q.shape[-1]), "d_v": int(v.shape[-1])}
        else:
            v = x
            if params.score == "additive":
                hq = tf.tensordot(x, p["Wt"], axes=1)[..., :, None, :]  # [..., L, 1, units]
                hk = tf.tensordot(x, p["Wx"], axes=1)[..., None, :, :]  # [..., 1, L, units]
                scores = tf.tensordot(tf.tanh(hq + hk + p["bh"]), p["Wa"][:, 0], axes=1) + p["ba"][0]
            else:
                scores = tf.matmul(tf.tensordot(x, p["Wa"], axes=1), x, transpose_b=True) + p["ba"][0]
            used = {"score": params.score, "units": params.units}
        if params.width or params.history_only:
            used.update(width=params.width, history_only=params.history_only)
        weights, output = softmax_and_output(ctx, scores, v, mask)
    return Result(weights, output, params=used, warnings=warnings)


VARIANT = variant(
    __name__,
    name="self",
    summary="self-attention from one sequence: W_Q, W_K, W_V projections, or SeqSelfAttention scores",
    formula="A = softmax((X W_Q)(X W_K)^T / sqrt(d_k)), O = A X W_V",
    inputs=(InputSpec("x", "the sequence [..., L, d]"),),
    query_input="x",
    key_input="x",
    learned=True,
)

"""Additive attention: Bahdanau, Cho & Bengio 2015 ("Neural Machine Translation by Jointly Learning
to Align and Translate"), and the two Keras layers that add queries and keys.

    bahdanau:      score(q, k) = v^T tanh(q W1 + k W2 + b)     W1 [d_q, d_a], W2 [d_k, d_a], v [d_a], b [d_a]
    --normalize:   v is replaced by g v / |v| (TF seq2seq's normalized Bahdanau; g [] starts at sqrt(1/d_a))
    keras:         score = sum_d scale_d tanh(q_d + k_d)      = keras.layers.AdditiveAttention (scale [d])
    keras-concat:  score = c sum_d tanh(s (q_d + k_d))         = keras.layers.Attention(score_mode="concat")
                                                                  (s = scale [], c = concat_score_weight [])
    A = softmax_k(score, masked),  O = A V

Shapes: Q ``[..., Lq, d_q]``, K ``[..., Lk, d_k]``, V ``[..., Lk, d_v]`` give weights ``[..., Lq, Lk]``
and output ``[..., Lq, d_v]``; the Keras styles need ``d_q = d_k``. The score is evaluated on a
``[..., Lq, Lk, d_a]`` tensor. Luong's "concat" score ``tanh([q; k] W_a) v_a`` is the bahdanau style
with ``W_a = vstack([W1, W2])``.

Parameter file keys: bahdanau ``W1``, ``W2``, ``v``, optional ``b`` (and ``g`` with --normalize);
keras ``scale`` (left out: the layer's ``use_scale=False``); keras-concat ``concat_score_weight``
and optional ``scale``. These are the Keras weight names, so
``{w.path.split("/", 1)[1]: w.numpy() for w in layer.weights}`` saved with numpy.savez loads as is.
Keras masks with a -1e9 bias, which makes a fully masked row uniform; attnviz gives it zeros.

Reference example (spec section 2.2): q = [1, 2], keys = values = [[1, 0], [0, 1], [1, 1]],
W1 = I, W2 = [[1, 0], [0, -1]], v = [1, 1], b = 0: A = [0.402608, 0.268566, 0.328826].
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from attnviz.errors import UsageError
from attnviz.params import ParamSpec, bias
from attnviz.variants.base import (
    Context,
    Problem,
    Result,
    check_qkv,
    qkv_variant,
    read_units,
    softmax_and_output,
    units_field,
)

if TYPE_CHECKING:
    import numpy as np

    from attnviz.io import Loaded
    from attnviz.masks import Mask


@dataclass
class Params:
    style: Literal["bahdanau", "keras", "keras-concat"] = field(
        default="bahdanau",
        metadata={"help": "bahdanau: v^T tanh(q W1 + k W2 + b); keras: keras.layers.AdditiveAttention; "
                          "keras-concat: keras.layers.Attention(score_mode='concat')"},
    )
    units: int | None = units_field("d_a, the width of the tanh layer", when="bahdanau")
    normalize: bool = field(default=False, metadata={"help": "bahdanau: use g v/|v| for v (weight normalisation)"})


def check(inputs: Mapping[str, Loaded], params: Params, given: Mapping[str, np.ndarray] | None) -> Problem:
    if params.style != "bahdanau" and (params.units is not None or params.normalize):
        raise UsageError(f"--units and --normalize belong to --style bahdanau, not {params.style}.")
    shape = check_qkv(inputs, same_dim=params.style != "bahdanau")  # the Keras styles add q and k
    d_q, d_k = inputs["q"].data.shape[-1], inputs["k"].data.shape[-1]
    if params.style == "keras":
        return Problem(shape, {"scale": ParamSpec((d_q,), init="glorot", optional=True)})
    if params.style == "keras-concat":
        return Problem(shape, {"scale": ParamSpec((), init="ones", optional=True),
                               "concat_score_weight": ParamSpec((), init="ones")})
    units = read_units(given, "W1", params.units, also={"W2": 1, "v": 0, "b": 0})
    specs = {"W1": ParamSpec((d_q, units)), "W2": ParamSpec((d_k, units)), "v": ParamSpec((units,)),
             "b": bias(units)}
    if params.normalize:
        specs["g"] = ParamSpec((), init=math.sqrt(1.0 / units))
    params.units = units
    return Problem(shape, specs)


def compute(ctx: Context, arrays: Mapping[str, np.ndarray], mask: Mask, params: Params,
            learned: Mapping[str, np.ndarray]) -> Result:
    tf = ctx.tf
    p = {name: ctx.tensor(value) for name, value in learned.items()}
    with tf.device(ctx.device.tf_name):
        q, k, v = (ctx.tensor(arrays[n]) for n in ("q", "k", "v"))
        if params.style == "bahdanau":
            qw = tf.tensordot(q, p["W1"], axes=1)[..., :, None, :]  # [..., Lq, 1, d_a]
            kw = tf.tensordot(k, p["W2"], axes=1)[..., None, :, :]  # [..., 1, Lk, d_a]
            vec = p["v"]
            if params.normalize:
                vec = p["g"] * vec / tf.norm(vec)
            scores = tf.tensordot(tf.tanh(qw + kw + p["b"]), vec, axes=1)
            used = {"style": "bahdanau", "units": params.units, "normalize": params.normalize}
        else:
            total = q[..., :, None, :] + k[..., None, :, :]  # [..., Lq, Lk, d]
            if params.style == "keras":
                scores = tf.reduce_sum(p["scale"] * tf.tanh(total), axis=-1)
            else:
                scores = p["concat_score_weight"] * tf.reduce_sum(tf.tanh(p["scale"] * total), axis=-1)
            used = {"style": params.style}
        weights, output = softmax_and_output(ctx, scores, v, mask)
    return Result(weights, output, params=used)


VARIANT = qkv_variant(
    __name__,
    name="additive",
    summary="additive attention, Bahdanau et al. 2015; Keras AdditiveAttention and Attention(concat)",
    formula="A = softmax(v^T tanh(Q W1 + K W2 + b)), O = A V",
    learned=True,
    blockwise=True,
)

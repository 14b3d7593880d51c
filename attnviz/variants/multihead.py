"""Multi-head attention exactly as ``keras.layers.MultiHeadAttention`` computes it (Vaswani et al.
2017, section 3.2.2), and grouped-query / multi-query attention as
``keras.layers.GroupQueryAttention`` (Ainslie et al. 2023) with ``--kv-heads G``.

    q_n = X_q W_q[:, n, :] + b_q[n]       [..., T, key_dim]     for each head n = 0 .. N-1
    k_g = X_k W_k[:, g, :] + b_k[g]       [..., S, key_dim]     g = 0 .. G-1 (G = N unless --kv-heads)
    v_g = X_v W_v[:, g, :] + b_v[g]       [..., S, value_dim]
    A_n = softmax(q_n k_g(n)^T / sqrt(key_dim), masked)        g(n) = n // (N / G)
    O   = sum_n (A_n v_g(n)) W_o[n] + b_o                    [..., T, out]

Inputs: QUERY ``[..., T, d_q]``, VALUE ``[..., S, d_v]`` (default: the query, i.e. self-attention) and
KEY ``[..., S, d_k]`` (default: the value), in Keras's call order. Weights are ``[..., N, T, S]``,
one map per head; the output is the layer's output ``[..., T, out]`` (out = d_q unless
--output-dim). Masks are given as Keras's ``attention_mask`` ``[..., T, S]`` (1 = may attend) and
apply to every head; ``--causal`` is Keras's ``use_causal_mask``.

Parameter file keys are the Keras weight paths without the layer name: ``query/kernel [d_q, N,
key_dim]``, ``query/bias [N, key_dim]``, ``key/kernel [d_k, G, key_dim]``, ``key/bias``,
``value/kernel [d_v, G, value_dim]``, ``value/bias``, ``attention_output/kernel [N, value_dim, out]``,
``attention_output/bias [out]`` (no biases with --no-bias), so that
``{w.path.split("/", 1)[1]: w.numpy() for w in layer.weights}`` saved with numpy.savez loads as is;
heads, dims and bias are read off the shapes. ``--from-keras MODEL.keras --layer NAME`` reads them
from a saved Keras model, loaded in Keras's safe mode (no code from the file is run). A textbook
``W^O [N*value_dim, out]`` is ``attention_output/kernel.reshape(N*value_dim, out)``; PyTorch's
``in_proj_weight [3E, E]`` gives ``query/kernel = in_proj_weight[:E].T.reshape(E, N, E // N)``.

Reference example (spec section 9.1): X_q = [[1, 0], [0, 1]], X_kv = [[1, 1], [2, 0], [0, 2]], N = 2,
key_dim = 1, head h reading and writing feature h: head 0 row 0 = [0.244728, 0.665241, 0.090031],
output [[1.575210, 1.0], [1.0, 1.575210]].
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from attnviz.choices import MAX_HEADS, MAX_WIDTH
from attnviz.errors import ParamsError, ShapeError, UsageError, shape_str
from attnviz.params import ParamSpec
from attnviz.storage import Place
from attnviz.variants.base import (
    Context,
    InputSpec,
    Problem,
    Result,
    broadcast_leading,
    require_rank,
    softmax_and_output,
    variant,
)

if TYPE_CHECKING:
    import numpy as np

    from attnviz.io import Loaded
    from attnviz.masks import Mask

KERNELS = ("query/kernel", "key/kernel", "value/kernel", "attention_output/kernel")
BIASES = ("query/bias", "key/bias", "value/bias", "attention_output/bias")


@dataclass
class Params:
    heads: int | None = field(default=None, metadata={"help": "number of (query) heads N; read off --params",
                                                      "min": 1, "max": MAX_HEADS})
    key_dim: int | None = field(default=None, metadata={"help": "size of each query/key head (default d_q // N)",
                                                        "min": 1, "max": MAX_WIDTH})
    value_dim: int | None = field(default=None, metadata={"help": "size of each value head (default key_dim)",
                                                          "min": 1, "max": MAX_WIDTH})
    output_dim: int | None = field(default=None, metadata={"help": "size of the output (default d_q)",
                                                           "min": 1, "max": MAX_WIDTH})
    no_bias: bool = field(default=False, metadata={"help": "no biases (Keras use_bias=False)"})
    kv_heads: int | None = field(
        default=None, metadata={"help": "key/value heads G for grouped-query attention (1: multi-query); "
                                        "N must be a multiple of G", "min": 1, "max": MAX_HEADS})
    from_keras: str | None = field(
        default=None, metadata={"help": "read the parameters from this saved Keras model (.keras), safe mode",
                                "metavar": "MODEL.keras"})
    layer: str | None = field(default=None, metadata={"help": "with --from-keras: the layer's name"})


INPUTS = (
    InputSpec("query", "the query sequence [..., T, d_q], or one file holding query (value, key)"),
    InputSpec("value", "the value sequence [..., S, d_v] (default: QUERY, self-attention)", optional=True),
    InputSpec("key", "the key sequence [..., S, d_k] (default: VALUE)", optional=True),
)


def _read_off(given: Mapping[str, np.ndarray], name: str, rank: int) -> tuple[int, ...]:
    if name not in given:
        raise ParamsError(f"parameters: missing key {name!r} (Keras MultiHeadAttention weight paths: "
                          f"{', '.join(KERNELS)} and their biases).")
    shape = tuple(given[name].shape)
    if len(shape) != rank:
        raise ParamsError(f"parameters: key {name!r} has shape {shape_str(shape)}; expected {rank} dimensions.")
    return shape


def _agree(option: str, value: int | None, found: int, key: str, shape: tuple[int, ...], what: str) -> int:
    """``found`` (read off ``key``), which an option the user gave must equal; ``what`` words it,
    e.g. ``"{} heads"``."""
    if value is not None and value != found:
        raise ParamsError(f"parameters: {key} {shape_str(shape)} has {what.format(found)}, but {option} {value} "
                          "was given.")
    return found


#: the sizes a parameter file must agree on, each as the (key, axis) pairs that hold it
AGREE = (
    ("query heads N", (("query/kernel", 1), ("query/bias", 0), ("attention_output/kernel", 0))),
    ("key_dim", (("query/kernel", 2), ("key/kernel", 2), ("query/bias", 1), ("key/bias", 1))),
    ("key/value heads G", (("key/kernel", 1), ("value/kernel", 1), ("key/bias", 0), ("value/bias", 0))),
    ("value_dim", (("value/kernel", 2), ("value/bias", 1), ("attention_output/kernel", 1))),
    ("output size", (("attention_output/kernel", 2), ("attention_output/bias", 0))),
)
RANKS = {"query/kernel": 3, "key/kernel": 3, "value/kernel": 3, "attention_output/kernel": 3, "query/bias": 2,
         "key/bias": 2, "value/bias": 2, "attention_output/bias": 1}

#: at most this many parameters are drawn (256 MB of float32)
MAX_DRAWN = 2**26


def check_given(given: Mapping[str, np.ndarray], inputs: Mapping[str, Loaded]) -> None:
    """A parameter file's arrays agree with each other and with the inputs, or the error names the
    arrays (and shapes) that disagree: never an option the user did not give."""
    for name, rank in RANKS.items():
        if name in given and given[name].ndim != rank:
            raise ParamsError(f"parameters: key {name!r} has shape {shape_str(given[name].shape)}; expected {rank} "
                              "dimensions.")
    for what, entries in AGREE:
        found = [(k, axis, int(given[k].shape[axis])) for k, axis in entries if k in given]
        if len({n for _, _, n in found}) > 1:
            listed = ", ".join(f"{k} {shape_str(given[k].shape)} has {n}" for k, _, n in found)
            raise ParamsError(f"parameters: the arrays disagree on the {what}: {listed}.")
    for name, input_name in (("query/kernel", "query"), ("key/kernel", "key"), ("value/kernel", "value")):
        loaded = inputs[input_name]
        features = loaded.data.shape[-1]
        if given[name].shape[0] != features:
            raise ParamsError(f"parameters: {name} {shape_str(given[name].shape)} takes {given[name].shape[0]} "
                              f"features, but {input_name.upper()} ({loaded.source}) has {features} "
                              f"(shape {shape_str(loaded.data.shape)}).")
    heads, kv_heads = given["query/kernel"].shape[1], given["key/kernel"].shape[1]
    if heads % kv_heads:
        raise ParamsError(f"parameters: query/kernel {shape_str(given['query/kernel'].shape)} has {heads} query heads "
                          f"and key/kernel {shape_str(given['key/kernel'].shape)} {kv_heads} key/value heads; the "
                          "query heads must be a multiple of the key/value heads.")


def check(inputs: Mapping[str, Loaded], params: Params, given: Mapping[str, np.ndarray] | None) -> Problem:
    query = inputs["query"]
    value = inputs.get("value", query)
    key = inputs.get("key", value)
    named = {"query": query, "value": value, "key": key}
    for name, loaded in named.items():
        require_rank(loaded, name, 2, "[..., length, features]")
    if key.data.shape[-2] != value.data.shape[-2]:
        raise ShapeError(f"KEY ({key.source}) has shape {shape_str(key.data.shape)} and VALUE ({value.source}) "
                         f"{shape_str(value.data.shape)}: they need the same length S.")
    lead = broadcast_leading(named, ("query", "value", "key"))
    d_q, d_v, d_k = query.data.shape[-1], value.data.shape[-1], key.data.shape[-1]
    t, s = query.data.shape[-2], value.data.shape[-2]

    if given is not None:
        nq = _read_off(given, "query/kernel", 3)
        nk = _read_off(given, "key/kernel", 3)
        nv = _read_off(given, "value/kernel", 3)
        no = _read_off(given, "attention_output/kernel", 3)
        check_given(given, named)
        heads = _agree("--heads", params.heads, nq[1], "query/kernel", nq, "{} heads")
        key_dim = _agree("--key-dim", params.key_dim, nq[2], "query/kernel", nq, "key_dim {}")
        value_dim = _agree("--value-dim", params.value_dim, nv[2], "value/kernel", nv, "value_dim {}")
        kv_heads = _agree("--kv-heads", params.kv_heads, nk[1], "key/kernel", nk, "{} key/value heads")
        output_dim = _agree("--output-dim", params.output_dim, no[2], "attention_output/kernel", no, "output size {}")
        use_bias = any(b in given for b in BIASES)
        if params.no_bias and use_bias:
            raise ParamsError(f"parameters: the file holds biases ({', '.join(b for b in BIASES if b in given)}), "
                              "but --no-bias was given.")
    else:
        if params.heads is None:
            raise UsageError("give --heads (and --key-dim) to draw the parameters, or read them with --params "
                             "or --from-keras.")
        heads = params.heads
        if params.key_dim is None and d_q < heads:
            raise UsageError(f"--heads {heads} is more than QUERY's {d_q} features: the default key_dim d_q // heads "
                             "would be 0; give --key-dim.")
        key_dim = params.key_dim or d_q // heads
        value_dim = params.value_dim or key_dim
        kv_heads = params.kv_heads or heads
        output_dim = params.output_dim or d_q
        use_bias = not params.no_bias
        if heads % kv_heads:
            raise UsageError(f"--heads {heads} is not a multiple of --kv-heads {kv_heads}.")
    for option, number in (("--heads", heads), ("--key-dim", key_dim), ("--value-dim", value_dim),
                           ("--kv-heads", kv_heads), ("--output-dim", output_dim)):
        if number < 1:  # only from a caller that skipped the command line's checks
            raise UsageError(f"{option} {number}: must be at least 1.")
    params.heads, params.key_dim, params.value_dim = heads, key_dim, value_dim
    params.kv_heads, params.output_dim, params.no_bias = kv_heads, output_dim, not use_bias

    specs = {
        "query/kernel": ParamSpec((d_q, heads, key_dim), fans=(d_q, heads * key_dim)),
        "key/kernel": ParamSpec((d_k, kv_heads, key_dim), fans=(d_k, kv_heads * key_dim)),
        "value/kernel": ParamSpec((d_v, kv_heads, value_dim), fans=(d_v, kv_heads * value_dim)),
        "attention_output/kernel": ParamSpec((heads, value_dim, output_dim), fans=(heads * value_dim, output_dim)),
    }
    if use_bias:
        specs.update({
            "query/bias": ParamSpec((heads, key_dim), init="zeros"),
            "key/bias": ParamSpec((kv_heads, key_dim), init="zeros"),
            "value/bias": ParamSpec((kv_heads, value_dim), init="zeros"),
            "attention_output/bias": ParamSpec((output_dim,), init="zeros"),
        })
    if given is None:
        drawn = sum(math.prod(spec.shape) for spec in specs.values())
        if drawn > MAX_DRAWN:
            raise UsageError(f"--heads {heads}, key_dim {key_dim}, value_dim {value_dim}, output {output_dim}: "
                             f"{drawn:,} parameters to draw, more than {MAX_DRAWN:,}; use fewer heads or smaller "
                             "dimensions.")
    return Problem((*lead, heads, t, s), specs, mask_shape=(*lead, t, s))


def compute(ctx: Context, arrays: Mapping[str, np.ndarray], mask: Mask, params: Params,
            learned: Mapping[str, np.ndarray]) -> Result:
    tf = ctx.tf
    heads, kv_heads = params.heads or 1, params.kv_heads or 1
    p = {name: ctx.tensor(value) for name, value in learned.items()}

    def project(x: Any, name: str, axis_name: str) -> Any:
        out = tf.einsum(f"...{axis_name}d,dnh->...n{axis_name}h", x, p[f"{name}/kernel"])
        if f"{name}/bias" in p:
            out = out + p[f"{name}/bias"][:, None, :]
        return out

    with tf.device(ctx.device.tf_name):
        query = ctx.tensor(arrays["query"])
        value = ctx.tensor(arrays["value"]) if "value" in arrays else query
        key = ctx.tensor(arrays["key"]) if "key" in arrays else value
        q = project(query, "query", "t")  # [..., N, T, key_dim]
        k = project(key, "key", "s")  # [..., G, S, key_dim]
        v = project(value, "value", "s")  # [..., G, S, value_dim]
        if kv_heads != heads:  # query head n uses key/value head n // (N / G), as Keras repeats them
            k = tf.repeat(k, heads // kv_heads, axis=-3)
            v = tf.repeat(v, heads // kv_heads, axis=-3)
        q = q * ctx.scalar(1.0 / math.sqrt(params.key_dim or 1), q.dtype)
        scores = tf.matmul(q, k, transpose_b=True)  # [..., N, T, S]
        weights, per_head = softmax_and_output(ctx, scores, v, mask)  # per_head [..., N, T, value_dim]
        out = tf.einsum("...nth,nho->...to", ctx.tensor(per_head), p["attention_output/kernel"])
        if "attention_output/bias" in p:
            out = out + p["attention_output/bias"]
        output = ctx.numpy(out)
    used = {"heads": heads, "key_dim": params.key_dim, "value_dim": params.value_dim, "output_dim": params.output_dim,
            "kv_heads": kv_heads, "use_bias": not params.no_bias, "scale": 1.0 / math.sqrt(params.key_dim or 1)}
    return Result(weights, output, params=used, maps={"head_outputs": per_head})


def from_keras(params: Params) -> tuple[dict[str, np.ndarray], Place, str] | None:
    """The weights of a MultiHeadAttention / GroupQueryAttention layer of a saved ``.keras`` model (a local
    file, or a URL's object copied to the temporary folder for Keras)."""
    from attnviz import storage

    if params.from_keras is None:
        if params.layer is not None:
            raise UsageError("--layer goes with --from-keras MODEL.keras.")
        return None
    path = storage.place(params.from_keras)
    if path.suffix != ".keras":
        raise UsageError(f"--from-keras {path}: expected a Keras v3 model file ending in .keras.")
    if isinstance(path, Path) and not path.is_file():
        raise UsageError(f"--from-keras {path}: no such file.")
    with storage.local_copy(str(path), f"--from-keras {path}") as copy:
        return _keras_weights(params, path, copy)


def _keras_weights(params: Params, path: Place, copy: Path) -> tuple[dict[str, np.ndarray], Place, str]:
    import numpy as np

    from attnviz.device import tensorflow

    tensorflow()  # quiet start-up, memory growth
    import keras

    try:
        model = keras.saving.load_model(copy, compile=False, safe_mode=True)
    except Exception as exc:  # a corrupt zip, unknown custom layers, unsafe lambdas: all unreadable here
        raise ParamsError(f"--from-keras {path}: Keras cannot load it in safe mode ({type(exc).__name__}: "
                          f"{str(exc).splitlines()[0] if str(exc) else ''}).") from None
    kinds = (keras.layers.MultiHeadAttention, keras.layers.GroupQueryAttention)
    found = [layer for layer in _walk(model) if isinstance(layer, kinds)]
    names = ", ".join(layer.name for layer in found) or "none"
    if params.layer is None:
        if len(found) != 1:
            raise UsageError(f"--from-keras {path}: name the layer with --layer (attention layers: {names}).")
        layer = found[0]
    else:
        matches = [layer for layer in found if layer.name == params.layer]
        if not matches:
            raise ParamsError(f"--from-keras {path}: no attention layer named {params.layer!r} (attention layers: "
                              f"{names}).")
        layer = matches[0]
    prefix = layer.path + "/"
    weights = {w.path[len(prefix):] if w.path.startswith(prefix) else w.path.split("/", 1)[1]: np.asarray(w.numpy())
               for w in layer.weights}
    return weights, path, "--from-keras"


def _walk(layer: object) -> list:
    out = [layer]
    for sub in getattr(layer, "layers", []) or []:
        out.extend(_walk(sub))
    return out


VARIANT = variant(
    __name__,
    name="multihead",
    summary="multi-head attention = keras.layers.MultiHeadAttention; --kv-heads for grouped/multi-query",
    formula="A_n = softmax((X_q W_q,n)(X_k W_k,n)^T / sqrt(key_dim)), O = sum_n A_n X_v W_v,n W_o,n",
    inputs=INPUTS,
    query_input="query",
    key_input="value",
    learned=True,
    external_params=from_keras,
    lead_names=("head",),
    blockwise=True,
    row_maps={"head_outputs": -2},
    query_defaults=("value",),
)

"""KerasHub's own attention layers (``keras-hub``: Llama, Gemma, Mistral, Qwen, Phi-3, GPT-NeoX, DeBERTa v3,
BLOOM, Falcon ...): which layer class is which family, and where its probabilities are formed.

Most of KerasHub's language models compute attention in a ``keras.layers.Layer`` of their own, not in
``keras.layers.MultiHeadAttention`` (which ``attnviz.capturing.keras`` captures). The seam they share is a
``keras.layers.Softmax`` sublayer: its input already holds the scale, the softcap, ALiBi or the relative
bias, its mask argument is the final mask (padding, causal, sliding window), and its output is exactly the
layer's probabilities, on the explicit (non-fused) path. While a capture is open the softmax's ``call`` is
wrapped on the instance and its output recorded as it is; where the family hands q, k and v to a method of
its own (``_compute_attention``), that method is wrapped too, so that the file holds what the softmax's
scores were computed from (``attnviz capture --check`` recomputes them). Nothing the layer computes changes.

Three families have no such sublayer: gpt-oss (an inline softmax over the keys and its sinks) and T5 (an
inline softmax over q.k plus the position bias its call returns) are recomputed in NumPy from what their
layer is handed or returns, exactly as the layer computes them; PaliGemma's and Gemma 3's vision encoders
return their probabilities from ``call``.

``FAMILIES`` is the table: class name -> :class:`Family`. A layer class that attnviz cannot see
(``REFUSED``, or any other ``...Attention`` layer it does not know) is refused by name: a capture holds
every attention site of the model or none.

On the JAX and torch backends KerasHub takes a fused ``dot_product_attention`` (no weights formed) when its
``fused_attention_op_available()`` says so; the capture replaces that function in the family's module by one
that says no while the block runs (the explicit path, the same numbers up to rounding), and restores it.
On the TensorFlow backend every layer takes the explicit path anyway.

Keras is imported only inside functions, when a model is captured.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any


def _attr(name: str) -> Callable[[Any], float | None]:
    def get(layer: Any) -> float | None:
        value = getattr(layer, name, None)
        return None if value is None else float(value)

    return get


def _gemma_scale(layer: Any) -> float:
    """Gemma's query normalisation, as ``CachedGemmaAttention._compute_attention`` computes it."""
    if getattr(layer, "query_head_dim_normalize", True):
        return 1.0 / math.sqrt(layer.head_dim)
    return 1.0 / math.sqrt(layer.hidden_dim // layer.num_query_heads)


@dataclass(frozen=True)
class Family:
    """How one KerasHub attention layer class forms its probabilities."""

    #: the attribute holding the ``keras.layers.Softmax`` whose output is the weights (None: ``recompute``)
    softmax: str | None
    #: the method handed ``(query, key, value, ...)`` positionally, after projections, norms and RoPE
    #: (None: the layer computes them inline; the file then has the weights and masks only)
    qkv: str | None = None
    #: the keys and values reach that method repeated to the query heads (``ops.repeat`` on axis 2)
    repeated: bool = False
    #: the scale applied to q.k, read from the layer (recorded with q and k, for ``--check``)
    scale: Callable[[Any], float | None] = _attr("_inv_norm_factor")
    softcap: str | None = None  #: the attribute holding a logit softcap (Gemma 2)
    #: the attribute holding the output projection (kernel [heads, head_dim, d_model])
    output: str | None = "_output_dense"
    #: the output projection is a 2-D kernel over the heads merged head-major (reshaped for the file)
    merged_output: bool = False
    #: a layer whose softmax is inline: ``(layer, q, k, the method's other arguments, its keywords, to_numpy)``
    #: -> the weights [B, H, Lq, Lk] and the mask, computed in NumPy as the layer computes them
    recompute: Callable[..., tuple[Any, Any]] | None = None
    sinks: str | None = None  #: the attribute holding per-head sink logits (gpt-oss)
    #: the mask is added to the scores (0 kept, a large negative hidden) and reaches the ``qkv`` method as its
    #: fourth argument, not the softmax (T5Gemma)
    additive_mask: bool = False
    #: sublayers whose outputs are q, k and v (``[B, L, heads * head_dim]``), for ``from_call``
    projections: tuple[str, ...] = ()
    #: a layer whose softmax is inline, computed from the projections and what ``call`` returns:
    #: ``(layer, (q, k, v), call's output, call's arguments, its keywords, to_numpy)`` -> the weights, the mask,
    #: q, k and v by head, more arrays
    from_call: Callable[..., tuple[Any, Any, tuple[Any, ...], dict[str, Any]]] | None = None


def _gpt_oss_weights(layer: Any, q: Any, k: Any, args: tuple[Any, ...], kwargs: dict[str, Any],
                     to_numpy: Callable[[Any], Any]) -> tuple[Any, Any]:
    """``GptOssAttention._compute_attention(query, key, value, attention_mask, start_index)`` in NumPy: scores
    scaled, keys before ``start + i - sliding_window`` masked, the attention mask, one sink logit per head
    joined to the keys for the softmax and dropped after; masked scores are -1e9 as the layer sets them."""
    import numpy as np

    mask = args[0] if args else kwargs.get("attention_mask")
    start = args[1] if len(args) > 1 else kwargs.get("start_index", 0)
    start = int(np.asarray(to_numpy(start))) if start is not None else 0
    scores = np.einsum("bqhd,bkhd->bhqk", q.astype(np.float64), k.astype(np.float64)) * float(layer._inv_norm_factor)
    b, _, lq, lk = scores.shape
    keep = np.ones((b, 1, lq, lk), bool)
    window = layer.sliding_window
    if window is not None and window > 0:
        keep &= np.arange(lk)[None, :] >= (np.arange(lq) + start)[:, None] - window
    if mask is not None:
        keep &= np.asarray(to_numpy(mask)).astype(bool)[:, None]
    scores = np.where(keep, scores, -1e9)
    sinks = np.asarray(to_numpy(layer.sinks), np.float64)
    logits = np.concatenate([scores, np.broadcast_to(sinks[None, :, None, None], (b, len(sinks), lq, 1))], -1)
    logits = logits - logits.max(-1, keepdims=True)
    e = np.exp(logits)
    return (e / e.sum(-1, keepdims=True))[..., :-1].astype(np.float32), keep


def _t5_weights(layer: Any, qkv: tuple[Any, ...], out: Any, args: tuple[Any, ...], kwargs: dict[str, Any],
                to_numpy: Callable[[Any], Any]) -> tuple[Any, Any, tuple[Any, ...], dict[str, Any]]:
    """``T5MultiHeadAttention.call`` in NumPy: q.k unscaled plus the position bias the call returns (the
    relative bias, with -1e9 where the mask hides a key), summed in float32 as the layer sums them, then the
    softmax. The bias is kept (0 where masked) as the site's ``position_bias``."""
    import numpy as np

    heads, size = int(layer.num_heads), int(layer.key_value_dim)
    q, k, v = (t.reshape(t.shape[0], t.shape[1], heads, size) for t in qkv)
    bias = np.asarray(to_numpy(out[1]), np.float32)
    scores = np.einsum("bqhd,bkhd->bhqk", q, k).astype(np.float32) + bias
    scores = scores.astype(np.float64)
    e = np.exp(scores - scores.max(-1, keepdims=True))
    weights = (e / e.sum(-1, keepdims=True)).astype(np.float32)
    keep = np.broadcast_to(bias > -1e8, weights.shape)
    return weights, keep, (q, k, v), {"position_bias": np.where(bias > -1e8, bias, 0.0).astype(np.float32)}


def _returned_weights(layer: Any, qkv: tuple[Any, ...], out: Any, args: tuple[Any, ...], kwargs: dict[str, Any],
                      to_numpy: Callable[[Any], Any]) -> tuple[Any, Any, tuple[Any, ...], dict[str, Any]]:
    """A vision encoder's attention whose call returns ``(output, probabilities)`` (PaliGemma's, Gemma 3's):
    the probabilities as returned; the mask, where one is given, is additive (large negative = hidden)."""
    import numpy as np

    weights = np.asarray(to_numpy(out[1]), np.float32)
    heads = weights.shape[1]
    q, k, v = (t.reshape(t.shape[0], t.shape[1], heads, -1) for t in qkv)
    mask = args[1] if len(args) > 1 else kwargs.get("attention_mask")
    keep = np.ones((weights.shape[0], 1, *weights.shape[-2:]), bool)
    if mask is not None:
        keep = keep & (np.asarray(to_numpy(mask)) > -1e8)
    return weights, keep, (q, k, v), {}


_LLAMA_LIKE = Family("_softmax", "_compute_attention", repeated=True)

#: class name -> family; a subclass not listed is found through its bases
FAMILIES: dict[str, Family] = {
    "LlamaAttention": _LLAMA_LIKE,  # Llama, Llama 3
    "CachedMistralAttention": _LLAMA_LIKE,
    "CachedMixtralAttention": Family("softmax", "_compute_attention", repeated=True, output="output_dense"),
    "Phi3Attention": Family("softmax", "_compute_attention", repeated=True, output="output_dense"),
    "QwenAttention": _LLAMA_LIKE,  # Qwen, Qwen 2
    "QwenMoeAttention": _LLAMA_LIKE,
    "Qwen3Attention": _LLAMA_LIKE,  # q and k normalised before RoPE, in call
    "Qwen3MoeAttention": _LLAMA_LIKE,
    "SmolLM3Attention": Family("_softmax", "_compute_attention", repeated=True, output="o_proj"),
    "CachedGemmaAttention": Family("softmax", "_compute_attention", scale=_gemma_scale, softcap="logit_soft_cap",
                                   output="output_dense"),  # Gemma, Gemma 2 (softcap and window inside)
    "CachedGemma3Attention": Family("softmax", "_compute_attention", scale=_gemma_scale, softcap="logit_soft_cap",
                                    output="output_dense"),
    # the attention output is gated (sigmoid) before the projection: no wo (value norms would leave the gate out)
    "Qwen3_5Attention": Family("_softmax", "_compute_attention", repeated=True, output=None),
    "Gemma4TextAttention": Family("softmax", "_compute_attention", scale=lambda layer: 1.0, softcap="logit_soft_cap",
                                  output="output_dense"),  # scale 1: the q and k norms replace it
    # an inline softmax over the keys and one sink logit per head: recomputed from the q and k it is handed
    "GptOssAttention": Family(None, "_compute_attention", repeated=True, recompute=_gpt_oss_weights, sinks="sinks"),
    # T5: an inline softmax over q.k (unscaled) plus the position bias its call returns
    "T5MultiHeadAttention": Family(None, scale=lambda layer: 1.0, output="output_projector", merged_output=True,
                                   projections=("query_projector", "key_projector", "value_projector"),
                                   from_call=_t5_weights),
    # an encoder-decoder of Gemma layers: the mask added to the scores; keys and values repeated (repeat_kv)
    "T5GemmaAttention": Family("softmax", "_compute_attention", repeated=True, scale=_attr("scaling"),
                               softcap="logit_soft_cap", output="output_dense", additive_mask=True),
    "PaliGemmaVitAttention": Family(None, scale=lambda layer: layer.head_dim ** -0.5, output="out_proj",
                                    merged_output=True, projections=("query_proj", "key_proj", "value_proj"),
                                    from_call=_returned_weights),
    "Gemma3VisionAttention": Family(None, scale=lambda layer: layer.head_dim ** -0.5, output="out_proj",
                                    merged_output=True, projections=("query_proj", "key_proj", "value_proj"),
                                    from_call=_returned_weights),
    "GPTNeoXAttention": Family("_softmax", "_compute_attention", merged_output=True),
    # the scores hold a relative-position term (DeBERTa) or ALiBi (BLOOM, Falcon): the weights as formed,
    # no q and k (they alone do not give the weights)
    "DisentangledSelfAttention": Family("_softmax"),
    "BloomAttention": Family("_softmax"),
    "FalconAttention": Family("softmax", output="output_dense"),
}

#: layers attnviz cannot see, by class name: why, in the words of the refusal
REFUSED: dict[str, str] = {
    "Gemma3nTextAttention": "its softmax is inline and its weights are not returned",
    "T5Gemma2Attention": "an encoder-decoder's self and cross attention are not told apart yet",
    "T5Gemma2MergedAttention": "an encoder-decoder's self and cross attention are not told apart yet",
    "MultiHeadAttentionWithRelativePE": "its softmax is inline and its weights are not returned",
    "TwoWayMultiHeadAttention": "its softmax is inline and its weights are not returned",
    "TwoStreamRelativeAttention": "its two-stream attention does not go through _compute_attention",
}


def class_names(layer: Any) -> list[str]:
    return [c.__name__ for c in type(layer).__mro__]


def family_of(layer: Any) -> Family | None:
    """The family of a KerasHub attention layer (by its class or a base's name), or None."""
    for name in class_names(layer):
        if name in REFUSED:
            return None
        if name in FAMILIES:
            return FAMILIES[name]
    return None


def refusal(layer: Any) -> str | None:
    """Why attnviz cannot capture ``layer`` (one line naming its class), or None when it can or when the layer
    is no attention layer. Any layer class named ``...Attention`` that attnviz does not know is refused."""
    import keras

    if isinstance(layer, keras.layers.MultiHeadAttention) and not any(n in REFUSED for n in class_names(layer)):
        return None
    name = type(layer).__name__
    for base in class_names(layer):
        if base in REFUSED:
            return (f"{name} ({layer.name}): attnviz cannot capture this KerasHub attention layer: "
                    f"{REFUSED[base]}.")
    if family_of(layer) is None and name.lower().endswith("attention"):
        return (f"{name} ({layer.name}): an attention layer attnviz does not know; it captures "
                "keras.layers.MultiHeadAttention and the KerasHub layers of docs/model-families.md.")
    return None


@contextmanager
def explicit_path(layers: list[Any]) -> Iterator[None]:
    """While the block runs, the modules of these layers' classes see ``fused_attention_op_available()`` as
    False (KerasHub imports it by name into each module): the explicit path, where the softmax runs."""
    patched: list[tuple[Any, Any]] = []
    try:
        for module in {sys.modules.get(c.__module__) for layer in layers for c in type(layer).__mro__}:
            original = getattr(module, "fused_attention_op_available", None)
            if module is None or original is None:
                continue
            patched.append((module, original))
            setattr(module, "fused_attention_op_available", _never)  # noqa: B010 - a module's global
        yield
    finally:
        for module, original in patched:
            setattr(module, "fused_attention_op_available", original)  # noqa: B010


def _never() -> bool:
    return False


def settings(layer: Any, family: Family, heads: int) -> dict[str, Any]:
    """The site's metadata: the scale and softcap where q and k are recorded (what --check needs); the
    key-value heads are those of the recorded k (the query heads' where there is none)."""
    scale = family.scale(layer) if family.qkv or family.from_call else None
    softcap = getattr(layer, family.softcap, None) if family.softcap else None
    return {"scale": scale, "window": None, "softcap": None if softcap is None else float(softcap),
            "sinks": family.sinks is not None, "heads": int(heads), "kv_heads": int(heads)}

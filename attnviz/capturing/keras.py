"""Capture from a Keras model: every ``keras.layers.MultiHeadAttention`` it runs, named ``layers.N`` in the
order they run.

Keras computes no scores unless asked (its fused ``dot_product_attention`` path), so while a capture is
open each layer's ``_compute_attention`` is wrapped on the instance: the layer computes exactly as
before, and attnviz computes the weights from the q and k the layer received (after the projections,
``[B, T, N, key_dim]``), its scale ``1 / sqrt(key_dim)`` and its mask (the attention mask, or the causal
mask of ``use_causal_mask``), as ``return_attention_scores=True`` would give them. The output projection's
kernel is already ``[N, value_dim, d_model]``. On exit the layers are as they were.

Keras (and the TensorFlow behind it) is imported here only, when a Keras model is captured.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

from attnviz.capturing.recorder import Recorder
from attnviz.errors import AttnvizError, InputError


def attention_layers(model: Any) -> list[Any]:
    """Every ``keras.layers.MultiHeadAttention`` in ``model`` (nested models and layers included), once."""
    import keras

    found: dict[int, Any] = {}
    pending = [model]
    while pending:
        layer = pending.pop(0)
        if isinstance(layer, keras.layers.MultiHeadAttention):
            found.setdefault(id(layer), layer)
            continue
        children = getattr(layer, "_layers", None) or getattr(layer, "layers", None) or []
        pending.extend(c for c in children if c is not layer)
    return list(found.values())


class KerasCapture:
    """A capture of one Keras model's ``MultiHeadAttention`` layers, recorded by ``recorder``."""

    def __init__(self, model: Any, recorder: Recorder, weights_dtype: str = "float32", weights: bool = True) -> None:
        self.model = model
        self.rec = recorder
        self.dtype = np.dtype(weights_dtype) if weights_dtype != "bfloat16" else _bfloat16()
        self.weights = weights
        self.forwards = 0
        self.note: str | None = None
        self.logits = None

    def describe(self) -> dict[str, Any]:
        import keras

        return {"model_type": "keras", "architecture": type(self.model).__name__, "keras": keras.__version__,
                "framework": "keras", "implementation": "keras"}

    @contextmanager
    def opened(self) -> Iterator[None]:
        layers = attention_layers(self.model)
        if not layers:
            raise InputError(f"{type(self.model).__name__}: no keras.layers.MultiHeadAttention in the model; attnviz "
                             "captures Keras attention through that layer.")
        wrapped = []
        try:
            for layer in layers:
                had = "_compute_attention" in layer.__dict__
                before = layer.__dict__.get("_compute_attention")
                object.__setattr__(layer, "_compute_attention", self._wrapper(layer, layer._compute_attention))
                wrapped.append((layer, had, before))
            yield
        finally:
            for layer, had, before in wrapped:
                if had:
                    object.__setattr__(layer, "_compute_attention", before)
                else:
                    object.__delattr__(layer, "_compute_attention")

    def _wrapper(self, layer: Any, original: Any) -> Any:
        def compute_attention(query: Any, key: Any, value: Any, attention_mask: Any = None, training: Any = None,
                              return_attention_scores: bool = False, use_causal_mask: bool = False) -> Any:
            out = original(query, key, value, attention_mask=attention_mask, training=training,
                           return_attention_scores=return_attention_scores, use_causal_mask=use_causal_mask)
            self.forwards += 1
            self._record(layer, query, key, value, attention_mask, use_causal_mask)
            return out

        return compute_attention

    def _record(self, layer: Any, query: Any, key: Any, value: Any, attention_mask: Any, causal: bool) -> None:
        import keras

        from attnviz.capturing.check import recompute

        if keras.backend.backend() == "tensorflow":
            import tensorflow as tf

            if not tf.executing_eagerly():
                raise AttnvizError(f"{layer.name}: the model runs as a graph (predict() or a tf.function), whose "
                                   "tensors attnviz cannot read; inside attnviz.capture call the model directly: "
                                   "model(x).")
        if len(query.shape) != 4:
            raise InputError(f"{layer.name}: attention over several axes ({len(query.shape)}-D queries); attnviz "
                             "captures MultiHeadAttention over one sequence axis.")
        q, k, v = (np.asarray(_numpy(t), dtype=np.float32) for t in (query, key, value))
        b, lq, heads, _ = q.shape
        lk = k.shape[1]
        keep = np.ones((b, lq, lk), bool)
        if attention_mask is not None:
            keep &= np.broadcast_to(np.asarray(_numpy(attention_mask)).astype(bool), (b, lq, lk))
        if causal:  # Keras' causal mask is lower-triangular from the top left (query i sees keys 0..i)
            keep &= np.tril(np.ones((lq, lk), bool))
        scale = float(layer._inverse_sqrt_key_dim)
        site = self.rec.site(id(layer), "layers", layer.name,
                             {"scale": scale, "window": None, "softcap": None, "sinks": False, "heads": int(heads),
                              "kv_heads": int(heads)})
        if site is None:
            return
        arrays: dict[str, Any] = {"q": q, "k": k, "v": v, "mask": keep[:, None]}
        if self.weights:
            arrays["weights"] = recompute(q, k, keep[:, None], scale).astype(self.dtype)
        self.rec.record(site, lq, lk, arrays)
        dense = getattr(layer, "_output_dense", None)
        kernel = getattr(dense, "kernel", None)
        if kernel is not None and len(kernel.shape) == 3:
            statics: dict[str, Any] = {"wo": np.asarray(_numpy(kernel), dtype=np.float32)}
            bias = getattr(dense, "bias", None)
            if bias is not None:
                statics["bo"] = np.asarray(_numpy(bias), dtype=np.float32)
            self.rec.record_static(site, statics)


def _numpy(value: Any) -> np.ndarray:
    """A backend tensor or a Keras variable as NumPy, whatever the backend (``keras.ops.convert_to_numpy``)."""
    import keras

    return np.asarray(keras.ops.convert_to_numpy(value))


def _bfloat16() -> np.dtype:
    import ml_dtypes

    return np.dtype(ml_dtypes.bfloat16)

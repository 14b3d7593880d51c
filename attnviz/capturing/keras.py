"""Capture from a Keras model: every attention layer it runs (``keras.layers.MultiHeadAttention``, and
KerasHub's own layers of ``attnviz.capturing.kerashub``), named ``layers.N`` in the order they run (an
encoder-decoder's ``encoder.layers.N``, ``decoder.layers.N``, ``cross.layers.N``); each call of a layer
within one call of the model is a site of its own (ALBERT calls one shared layer once per layer).

Keras computes no scores unless asked (its fused ``dot_product_attention`` path), so while a capture is
open each ``MultiHeadAttention``'s ``_compute_attention`` is wrapped on the instance: the layer computes
exactly as before, and attnviz computes the weights from the q and k the layer received (after the
projections, ``[B, T, N, key_dim]``), its scale ``1 / sqrt(key_dim)`` and its mask (the attention mask, or
the causal mask of ``use_causal_mask``), as ``return_attention_scores=True`` would give them. The output
projection's kernel is already ``[N, value_dim, d_model]``. KerasHub's own layers are recorded where their
family forms the weights (their softmax sublayer's output, or what their call returns), as the table of
``attnviz.capturing.kerashub`` says. On exit the layers and models are as they were.

A refusal raised inside a layer's call comes out as attnviz's own line (Keras rewrites what a call
raises). Keras (and the TensorFlow behind it) is imported here only, when a Keras model is captured.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

from attnviz.capturing.blame import model_call, raised_by_attnviz
from attnviz.capturing.recorder import Recorder
from attnviz.errors import AttnvizError, InputError


def attention_layers(model: Any) -> tuple[list[Any], list[tuple[Any, Any]]]:
    """Every attention layer of ``model`` (nested models and layers included), once each: the
    ``keras.layers.MultiHeadAttention`` layers, and the KerasHub layers of a family of
    ``attnviz.capturing.kerashub`` with their family. A layer attnviz cannot see is refused by name."""
    mha, hub, _ = _walk(model)
    return mha, hub


def _walk(model: Any) -> tuple[list[Any], list[tuple[Any, Any]], dict[int, str]]:
    """The attention layers (as ``attention_layers``) and the kind of site each is: ``layers``, or in an
    encoder-decoder (a layer whose name, or the attribute of its parent that holds it, says cross attention)
    ``cross`` for those, ``decoder`` for the others inside a layer whose class is a decoder, ``encoder`` for
    the rest."""
    import keras

    from attnviz.capturing.kerashub import family_of, refusal

    seen: set[int] = set()
    mha: list[Any] = []
    hub: list[tuple[Any, Any]] = []
    decoder: dict[int, bool] = {}  # per attention layer: whether a decoder holds it
    named: dict[int, str] = {}  # per layer: the attributes of its parent that hold it, and its path
    pending: list[tuple[Any, bool]] = [(model, False)]
    while pending:
        layer, in_decoder = pending.pop(0)
        if id(layer) in seen:
            continue
        seen.add(id(layer))
        why = refusal(layer)
        if why is not None:
            raise InputError(why)
        family = None if isinstance(layer, keras.layers.MultiHeadAttention) else family_of(layer)
        if isinstance(layer, keras.layers.MultiHeadAttention) or family is not None:
            if family is None:
                mha.append(layer)
            else:
                hub.append((layer, family))
            decoder[id(layer)] = in_decoder
            continue
        inner = in_decoder or (layer is not model and "decoder" in f"{type(layer).__name__} {layer.name}".lower())
        children = getattr(layer, "_layers", None) or getattr(layer, "layers", None) or []
        pending.extend((c, inner) for c in children if c is not layer)
        held = {id(v): k for k, v in vars(layer).items() if not k.startswith("__")}
        for c in children:
            named[id(c)] = f"{held.get(id(c), '')} {_path(c).rpartition('/')[2]}".lower()
    layers = [*mha, *(layer for layer, _ in hub)]
    cross = {id(layer) for layer in layers if "cross" in named.get(id(layer), "")}
    kinds = {id(layer): "layers" if not cross else "cross" if id(layer) in cross else
             "decoder" if decoder[id(layer)] else "encoder" for layer in layers}
    return mha, hub, kinds


def site_counts(model: Any) -> dict[str, int]:
    """How many sites of each kind the model has (what negative ``layers`` count from): one per attention
    layer, and ALBERT's shared layers once per call (``num_layers``)."""
    try:
        _, _, kinds = _walk(model)
    except InputError:
        return {}
    counts: dict[str, int] = {}
    for kind in kinds.values():
        counts[kind] = counts.get(kind, 0) + 1
    backbone = getattr(model, "backbone", model)
    if getattr(backbone, "num_groups", None) and getattr(backbone, "num_layers", None):
        counts = {"layers": int(backbone.num_layers)}
    return counts


class KerasCapture:
    """A capture of one Keras model's attention layers (``MultiHeadAttention`` and KerasHub's own), recorded
    by ``recorder``. Each call of a layer within one call of the model is a site of its own (ALBERT calls
    one shared layer once per layer of its group)."""

    def __init__(self, model: Any, recorder: Recorder, weights_dtype: str = "float32", weights: bool = True) -> None:
        self.model = model
        self.rec = recorder
        self.dtype = np.dtype(weights_dtype) if weights_dtype != "bfloat16" else _bfloat16()
        self.weights = weights
        self.forwards = 0
        self.note: str | None = None
        self.logits = None
        self.calls: dict[int, int] = {}  # per layer: its calls in the model's current call
        self.depth = 0  # models' calls in progress (nested: a task model's backbone)
        self.pending: dict[int, tuple[Any, ...]] = {}  # per KerasHub layer: the q, k, v (and mask) of its call
        self.softmaxed: dict[int, int] = {}  # per KerasHub layer: its softmax's calls
        self.error: Exception | None = None  # the first exception of attnviz's own code inside a layer's call
        self.kinds: dict[int, str] = {}  # per attention layer: its kind of site
        self.projected: dict[int, dict[int, Any]] = {}  # per KerasHub layer: its q, k, v projections' outputs

    def describe(self) -> dict[str, Any]:
        import keras

        meta = {"model_type": "keras", "architecture": type(self.model).__name__, "keras": keras.__version__,
                "framework": "keras", "implementation": "keras", "backend": keras.backend.backend()}
        try:
            import keras_hub

            if any(c.__module__.startswith("keras_hub") for c in type(self.model).__mro__):
                meta["keras_hub"] = keras_hub.__version__
        except ImportError:
            pass
        return meta

    @contextmanager
    def opened(self) -> Iterator[None]:
        from attnviz.capturing.kerashub import explicit_path

        mha, hub, self.kinds = _walk(self.model)
        if not mha and not hub:
            raise InputError(f"{type(self.model).__name__}: no attention layer in the model; attnviz captures "
                             "keras.layers.MultiHeadAttention and KerasHub's attention layers.")
        patches: list[tuple[Any, str, bool, Any]] = []

        def patch(obj: Any, name: str, value: Any) -> None:
            patches.append((obj, name, name in obj.__dict__, obj.__dict__.get(name)))
            object.__setattr__(obj, name, value)

        try:
            for layer in mha:
                patch(layer, "_compute_attention", self._guard(self._wrapper(layer, layer._compute_attention)))
            for layer, family in hub:
                if family.softmax is not None:
                    softmax = getattr(layer, family.softmax, None)
                    if softmax is None:
                        raise InputError(f"{type(layer).__name__} ({layer.name}): no softmax sublayer "
                                         f"{family.softmax!r}; attnviz cannot see its weights.")
                    patch(softmax, "call", self._guard(self._softmax_wrapper(layer, family, softmax.call)))
                if family.qkv:
                    patch(layer, family.qkv, self._guard(self._qkv_wrapper(layer, family,
                                                                           getattr(layer, family.qkv))))
                for i, name in enumerate(family.projections):
                    projector = getattr(layer, name)
                    patch(projector, "call", self._projection_wrapper(layer, i, projector.call))
                patch(layer, "call", self._guard(self._layer_wrapper(layer, family, layer.call)))
            for model in self._models():
                patch(model, "call", self._guard(self._model_wrapper(model.call)))
                if callable(getattr(model, "generate", None)):
                    patch(model, "generate", self._guard(_no_generate(model)))
            with explicit_path([layer for layer, _ in hub]):
                yield
        except Exception as exc:  # Keras rewrites what a layer's call raises: attnviz's own line, as it was
            if self.error is not None and exc is not self.error:
                raise self.error from None
            raise
        finally:
            for obj, name, had, before in reversed(patches):
                if had:
                    object.__setattr__(obj, name, before)
                else:
                    object.__delattr__(obj, name)

    def _models(self) -> list[Any]:
        """The model and the models inside it (a task's backbone): where one call of the model begins."""
        import keras

        out, pending, seen = [], [self.model], set()
        while pending:
            layer = pending.pop(0)
            if id(layer) in seen:
                continue
            seen.add(id(layer))
            if isinstance(layer, keras.Model) or layer is self.model:
                out.append(layer)
                pending.extend(getattr(layer, "_layers", None) or [])
        return out

    def _model_wrapper(self, original: Any) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            if self.depth == 0:
                self.calls = {}
                self._inputs(args[0] if args else kwargs.get("inputs"))
            self.depth += 1
            try:
                return model_call(original, *args, **kwargs)
            finally:
                self.depth -= 1

        return call

    def _inputs(self, inputs: Any) -> None:
        """KerasHub's inputs (``token_ids``, ``padding_mask``) as the file's ``input_ids`` and
        ``attention_mask``."""
        if not isinstance(inputs, dict) or "images" in inputs:  # a VLM's text positions follow its image tokens
            return
        names = {"token_ids": "input_ids", "padding_mask": "attention_mask", "encoder_token_ids": "input_ids",
                 "encoder_padding_mask": "attention_mask", "decoder_token_ids": "decoder_input_ids",
                 "decoder_padding_mask": "decoder_attention_mask"}
        try:
            arrays = {names[k]: np.asarray(_numpy(v)).astype(np.int64) for k, v in inputs.items()
                      if k in names and v is not None}
        except Exception:  # noqa: BLE001 - symbolic inputs (a traced call): the layers say so
            return
        if arrays:
            self.rec.record_inputs(arrays, continuing=False)

    def _guard(self, function: Any) -> Any:
        """``function`` (a wrapper run inside a layer's call), what attnviz's own code raises in it (its refusals,
        and its bugs: not what the model's own call raises) kept to be raised as it was: Keras rewrites what a
        layer's call raises into a message of several lines that names the layer."""

        def guarded(*args: Any, **kwargs: Any) -> Any:
            try:
                return function(*args, **kwargs)
            except Exception as exc:
                if self.error is None and (isinstance(exc, AttnvizError) or raised_by_attnviz(exc)):
                    self.error = exc
                raise

        return guarded

    def _key(self, layer: Any) -> tuple[int, int]:
        """The site of this call of ``layer``: its n-th call within the model's current call."""
        n = self.calls.get(id(layer), 0)
        self.calls[id(layer)] = n + 1
        return id(layer), n

    def _wrapper(self, layer: Any, original: Any) -> Any:
        def compute_attention(query: Any, key: Any, value: Any, attention_mask: Any = None, training: Any = None,
                              return_attention_scores: bool = False, use_causal_mask: bool = False) -> Any:
            out = model_call(original, query, key, value, attention_mask=attention_mask, training=training,
                             return_attention_scores=return_attention_scores, use_causal_mask=use_causal_mask)
            self.forwards += 1
            self._record(layer, query, key, value, attention_mask, use_causal_mask)
            return out

        return compute_attention

    def _record(self, layer: Any, query: Any, key: Any, value: Any, attention_mask: Any, causal: bool) -> None:
        from attnviz.capturing.check import recompute

        _eager(layer)
        if len(query.shape) != 4:
            raise InputError(f"{layer.name}: attention over several axes ({len(query.shape)}-D queries); attnviz "
                             "captures MultiHeadAttention over one sequence axis.")
        q, k, v = (np.asarray(_numpy(t), dtype=np.float32) for t in (query, key, value))
        b, lq, heads, _ = q.shape
        lk = k.shape[1]
        keep = np.ones((b, 1, lq, lk), bool)
        if attention_mask is not None:  # [B, Lq, Lk], or [B, 1 or H, Lq, Lk] (Moonshine), as MHA expands it
            m = np.asarray(_numpy(attention_mask)).astype(bool)
            keep = keep & (m if m.ndim == 4 else m[:, None] if m.ndim == 3 else m.reshape(-1, 1, 1, lk))
            keep = _one_mask(layer, keep)
        if causal:  # Keras' causal mask is lower-triangular from the top left (query i sees keys 0..i)
            keep = keep & np.tril(np.ones((lq, lk), bool))
        scale = float(layer._inverse_sqrt_key_dim)
        site = self.rec.site(self._key(layer), self.kinds.get(id(layer), "layers"), _path(layer),
                             {"scale": scale, "window": None, "softcap": None, "sinks": False, "heads": int(heads),
                              "kv_heads": int(heads)})
        if site is None:
            return
        arrays: dict[str, Any] = {"q": q, "k": k, "v": v, "mask": keep}
        if self.weights:
            arrays["weights"] = recompute(q, k, keep, scale).astype(self.dtype)
        self.rec.record(site, lq, lk, arrays)
        self._output(site, getattr(layer, "_output_dense", None))

    def _output(self, site: Any, dense: Any, heads: tuple[int, int] | None = None) -> None:
        """The output projection's kernel as ``[heads, head_dim, d_model]`` (``heads``: the heads and head size
        of a 2-D kernel whose input is the heads merged head-major), and its bias."""
        kernel = getattr(dense, "kernel", None)
        if kernel is not None and heads is not None and len(kernel.shape) == 2:
            kernel = np.asarray(_numpy(kernel)).reshape(*heads, -1)
        if kernel is not None and len(kernel.shape) == 3:
            statics: dict[str, Any] = {"wo": np.asarray(_numpy(kernel), dtype=np.float32)}
            bias = getattr(dense, "bias", None)
            if bias is not None:
                statics["bo"] = np.asarray(_numpy(bias), dtype=np.float32)
            self.rec.record_static(site, statics)

    # -- KerasHub's own layers: the softmax sublayer's output, and the q, k, v it was computed from

    def _layer_wrapper(self, layer: Any, family: Any, original: Any) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            before = self.softmaxed.get(id(layer), 0)
            self.pending.pop(id(layer), None)
            self.projected[id(layer)] = {}
            out = model_call(original, *args, **kwargs)
            if family.from_call is not None:  # an inline softmax: recomputed from the projections and the output
                _eager(layer)
                found = self.projected.pop(id(layer), {})
                if len(found) == 3:
                    projected = tuple(np.asarray(_numpy(found[i]), dtype=np.float32) for i in range(3))
                    weights, keep, qkv, extra = family.from_call(layer, projected, out, args, kwargs, _numpy)
                    self.softmaxed[id(layer)] = before + 1
                    self.forwards += 1
                    self._record_hub(layer, family, weights, keep, qkv, extra)
            if self.softmaxed.get(id(layer), 0) == before:
                raise InputError(f"{type(layer).__name__} ({layer.name}): the layer formed no weights (a fused "
                                 "attention op); attnviz cannot see them on this backend.")
            return out

        return call

    def _projection_wrapper(self, layer: Any, index: int, original: Any) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            out = model_call(original, *args, **kwargs)
            self.projected.setdefault(id(layer), {})[index] = out
            return out

        return call

    def _qkv_wrapper(self, layer: Any, family: Any, original: Any) -> Any:
        def compute(*args: Any, **kwargs: Any) -> Any:  # (query, key, value, ...), by position or by name
            given = list(args[:3])
            for names in (("query", "q"), ("key", "k"), ("value", "v"))[len(given):]:
                given.append(next((kwargs[n] for n in names if n in kwargs), None))
            if family.additive_mask:
                given.append(args[3] if len(args) > 3 else kwargs.get("attention_mask"))
            self.pending[id(layer)] = tuple(given)
            try:
                out = model_call(original, *args, **kwargs)
            finally:
                self.pending.pop(id(layer), None)
            if family.recompute is not None:  # an inline softmax: the weights as the layer forms them, in NumPy
                _eager(layer)
                q, k = (np.asarray(_numpy(t), dtype=np.float32) for t in given[:2])
                weights, keep = family.recompute(layer, q, k, args[3:], kwargs, _numpy)
                self.softmaxed[id(layer)] = self.softmaxed.get(id(layer), 0) + 1
                self.forwards += 1
                self._record_hub(layer, family, weights, keep, tuple(given))
            return out

        return compute

    def _softmax_wrapper(self, layer: Any, family: Any, original: Any) -> Any:
        def call(inputs: Any, mask: Any = None) -> Any:
            out = model_call(original, inputs, mask=mask)
            self.softmaxed[id(layer)] = self.softmaxed.get(id(layer), 0) + 1
            self.forwards += 1
            self._record_softmax(layer, family, out, mask, self.pending.get(id(layer)))
            return out

        return call

    def _record_softmax(self, layer: Any, family: Any, probs: Any, mask: Any, qkv: Any) -> None:
        _eager(layer)
        p = np.asarray(_numpy(probs), dtype=np.float32)
        b, lq, lk = p.shape[0], p.shape[-2], p.shape[-1]
        weights = p.reshape(b, -1, lq, lk)  # Gemma's [B, kv heads, groups, Lq, Lk]: the query heads in order
        keep = np.ones(p.shape, bool)
        if mask is not None:
            m = np.asarray(_numpy(mask))
            keep = np.broadcast_to(m if m.dtype == bool else m > 0.5, p.shape)  # as keras.layers.Softmax keeps
        elif family.additive_mask and qkv is not None and len(qkv) > 3 and qkv[3] is not None:
            keep = np.broadcast_to(np.asarray(_numpy(qkv[3])) > -1e8, p.shape)  # added: a large negative hides
        self._record_hub(layer, family, weights, keep.reshape(b, -1, lq, lk), qkv)

    def _record_hub(self, layer: Any, family: Any, weights: np.ndarray, keep: np.ndarray, qkv: Any,
                    extra: dict[str, np.ndarray] | None = None) -> None:
        """One call of a KerasHub layer: its weights [B, H, Lq, Lk], its mask, the q, k, v behind them and
        ``extra`` arrays of the call (T5's position bias)."""
        from attnviz.capturing.kerashub import settings

        b, heads, lq, lk = weights.shape
        keep = _one_mask(layer, keep)
        site = self.rec.site(self._key(layer), self.kinds.get(id(layer), "layers"), _path(layer),
                             settings(layer, family, heads))
        if site is None:
            return
        arrays: dict[str, Any] = {"mask": keep}
        if qkv is not None:
            q, k, v = (np.asarray(_numpy(t), dtype=np.float32) for t in qkv[:3])
            if family.repeated:  # repeated to the query heads by ops.repeat: kv head j is at j * groups
                groups = getattr(layer, "num_key_value_groups", None) or layer._num_key_value_groups
                k, v = k[:, :, :: int(groups)], v[:, :, :: int(groups)]
            site.info["kv_heads"] = int(k.shape[2])
            arrays.update({"q": q, "k": k, "v": v})
        if self.weights:
            arrays["weights"] = weights.astype(self.dtype)
        arrays.update(extra or {})
        self.rec.record(site, lq, lk, arrays)
        if family.sinks:
            self.rec.record_static(site, {"sinks": np.asarray(_numpy(getattr(layer, family.sinks)), np.float32)})
        merged = (heads, int(qkv[2].shape[-1])) if family.merged_output and qkv is not None else None
        self._output(site, getattr(layer, family.output, None) if family.output else None, merged)


def _no_generate(model: Any) -> Any:
    def generate(*args: Any, **kwargs: Any) -> Any:
        raise AttnvizError(f"{type(model).__name__}.generate(): KerasHub runs its loop as a compiled graph over a "
                           "cache of the whole length, which attnviz does not stitch; capture one forward pass over "
                           "the sequence it generated instead: model(x) inside attnviz.capture.")

    return generate


def _one_mask(layer: Any, keep: np.ndarray) -> np.ndarray:
    """The mask as the file keeps it, ``[B, 1, Lq, Lk]``: one for every head."""
    if keep.shape[1] > 1:
        if not (keep == keep[:, :1]).all():
            raise InputError(f"{layer.name}: a mask that differs between heads; the capture file keeps one mask "
                             "per batch row.")
        keep = keep[:, :1]
    return np.ascontiguousarray(keep)


def _eager(layer: Any) -> None:
    import keras

    if keras.backend.backend() == "tensorflow":
        import tensorflow as tf

        if not tf.executing_eagerly():
            raise AttnvizError(f"{layer.name}: the model runs as a graph (predict(), generate() or a "
                               "tf.function), whose tensors attnviz cannot read; inside attnviz.capture call "
                               "the model directly: model(x).")


def _path(layer: Any) -> str:
    return str(getattr(layer, "path", None) or layer.name)


def _numpy(value: Any) -> np.ndarray:
    """A backend tensor or a Keras variable as NumPy, whatever the backend (``keras.ops.convert_to_numpy``)."""
    import keras

    return np.asarray(keras.ops.convert_to_numpy(value))


def _bfloat16() -> np.dtype:
    import ml_dtypes

    return np.dtype(ml_dtypes.bfloat16)

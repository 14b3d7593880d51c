"""attnviz.capture(model) on KerasHub backbones (TensorFlow backend): tiny backbones built from constructor
arguments, padded batches. Each site equals the layer's own probabilities, read by the test itself in a
separate run of the model: ``return_attention_scores=True`` forced on every ``MultiHeadAttention`` call, and
the output of every other ``keras.layers.Softmax`` (the KerasHub layers' explicit path), patched on the class,
not on the instance as the capture does. The model's output inside the block equals its output outside."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import attnviz
from attnviz.capturing.check import check_capture
from attnviz.capturing.keras import attention_layers
from attnviz.errors import AttnvizError, InputError
from tests.conftest import LazyModule

# imported when the module's first test runs, in the worker that runs the module (KerasHub imports TensorFlow
# with Keras, ~5 s): not while every worker collects
keras_hub = LazyModule("keras_hub")
keras = LazyModule("keras")


@pytest.fixture(scope="module", autouse=True)
def _tensorflow_backend():
    if keras.backend.backend() != "tensorflow":
        pytest.skip("the TensorFlow backend's tests")

V = 16
B, L = 2, 6
PAD_LEFT = {"token_ids": np.array([[5, 2, 3, 4, 7, 1], [0, 0, 3, 4, 5, 6]]),
            "padding_mask": np.array([[1, 1, 1, 1, 1, 1], [0, 0, 1, 1, 1, 1]])}
PAD_RIGHT = {"token_ids": np.array([[5, 2, 3, 4, 7, 1], [3, 4, 5, 6, 0, 0]]),
             "padding_mask": np.array([[1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0]])}
SEGMENTS = {**PAD_RIGHT, "segment_ids": np.zeros((B, L), "int32")}
#: family -> (backbone class, constructor arguments, inputs, whether q and k are recorded, whether wo is)
FAMILIES = {
    "bert": ("BertBackbone", dict(num_layers=2, num_heads=2, hidden_dim=8, intermediate_dim=8,
                                  max_sequence_length=L), SEGMENTS, True, True),
    "distil_bert": ("DistilBertBackbone", dict(num_layers=2, num_heads=2, hidden_dim=8, intermediate_dim=8,
                                               max_sequence_length=L), PAD_RIGHT, True, True),
    "roberta": ("RobertaBackbone", dict(num_layers=2, num_heads=2, hidden_dim=8, intermediate_dim=8,
                                        max_sequence_length=L), PAD_RIGHT, True, True),
    "electra": ("ElectraBackbone", dict(num_layers=2, num_heads=2, hidden_dim=8, embedding_dim=8,
                                        intermediate_dim=8, max_sequence_length=L), SEGMENTS, True, True),
    "gpt2": ("GPT2Backbone", dict(num_layers=2, num_heads=2, hidden_dim=8, intermediate_dim=8,
                                  max_sequence_length=L), PAD_RIGHT, True, True),
    "opt": ("OPTBackbone", dict(num_layers=2, num_heads=2, hidden_dim=8, intermediate_dim=8,
                                max_sequence_length=L), PAD_RIGHT, True, True),
    "llama": ("LlamaBackbone", dict(num_layers=2, num_query_heads=4, num_key_value_heads=2, hidden_dim=8,
                                    intermediate_dim=8), PAD_LEFT, True, True),
    "llama3": ("Llama3Backbone", dict(num_layers=2, num_query_heads=4, num_key_value_heads=2, hidden_dim=8,
                                      intermediate_dim=8, rope_frequency_adjustment_factor=8.0,
                                      rope_low_freq_factor=1.0, rope_high_freq_factor=4.0,
                                      rope_pretraining_sequence_length=4), PAD_LEFT, True, True),
    "mistral": ("MistralBackbone", dict(num_layers=2, num_query_heads=4, num_key_value_heads=2, hidden_dim=8,
                                        intermediate_dim=8, sliding_window=2), PAD_LEFT, True, True),
    "mixtral": ("MixtralBackbone", dict(num_layers=2, num_query_heads=4, num_key_value_heads=2, hidden_dim=8,
                                        intermediate_dim=8, num_experts=2, sliding_window=2), PAD_LEFT, True, True),
    "phi3": ("Phi3Backbone", dict(num_layers=2, num_query_heads=4, num_key_value_heads=2, hidden_dim=8,
                                  intermediate_dim=8), PAD_LEFT, True, True),
    "qwen": ("QwenBackbone", dict(num_layers=2, num_query_heads=4, num_key_value_heads=2, hidden_dim=8,
                                  intermediate_dim=8, use_sliding_window_attention=True, sliding_window_size=3),
             PAD_LEFT, True, True),
    "qwen3": ("Qwen3Backbone", dict(num_layers=2, num_query_heads=4, num_key_value_heads=2, head_dim=4,
                                    hidden_dim=8, intermediate_dim=8, sliding_window_size=3), PAD_LEFT, True, True),
    "gemma": ("GemmaBackbone", dict(num_layers=2, num_query_heads=4, num_key_value_heads=1, hidden_dim=16,
                                    intermediate_dim=8, head_dim=4), PAD_LEFT, True, True),
    "gemma2": ("GemmaBackbone", dict(num_layers=2, num_query_heads=4, num_key_value_heads=2, hidden_dim=16,
                                     intermediate_dim=8, head_dim=2, query_head_dim_normalize=False,
                                     use_post_ffw_norm=True, use_post_attention_norm=True,
                                     attention_logit_soft_cap=0.5, final_logit_soft_cap=30.0,
                                     use_sliding_window_attention=True, sliding_window_size=3), PAD_LEFT, True, True),
    "gemma3": ("Gemma3Backbone", dict(image_size=16, num_layers=2, num_query_heads=4, num_key_value_heads=2,
                                      hidden_dim=16, intermediate_dim=8, head_dim=4, use_sliding_window_attention=True,
                                      sliding_window_size=3, vision_encoder=None), PAD_LEFT, True, True),
    "smollm3": ("SmolLM3Backbone", dict(hidden_dim=8, intermediate_dim=8, num_layers=2, num_attention_heads=4,
                                        num_key_value_heads=2, attention_bias=False, attention_dropout=0.0,
                                        rope_layer_enabled_list=[True, False], layer_types=["attention"] * 2,
                                        mlp_bias=False, layer_norm_epsilon=1e-6, max_position_embeddings=32,
                                        rope_theta=10000.0, partial_rotary_factor=1.0), PAD_LEFT, True, True),
    # a linear-attention layer (no weights to show) and a full attention layer: one site
    "qwen3_5": ("Qwen3_5Backbone", dict(num_layers=2, num_query_heads=4, num_key_value_heads=2, head_dim=8,
                                        hidden_dim=8, intermediate_dim=8,
                                        layer_types=["linear_attention", "full_attention"], linear_num_key_heads=2,
                                        linear_num_value_heads=2, linear_key_head_dim=4, linear_value_head_dim=4),
                PAD_LEFT, True, False),
    "gemma4": ("Gemma4Backbone", dict(image_size=16, num_layers=2, num_query_heads=4, num_key_value_heads=2,
                                      hidden_dim=16, intermediate_dim=8, head_dim=4, sliding_window_size=3,
                                      sliding_window_pattern=2, attention_logit_soft_cap=0.5),
               {**PAD_LEFT, "position_ids": np.array([[0, 1, 2, 3, 4, 5], [0, 0, 0, 1, 2, 3]])}, True, True),
    "gpt_neo_x": ("GPTNeoXBackbone", dict(num_layers=2, num_heads=2, hidden_dim=16, intermediate_dim=8,
                                          max_sequence_length=L), PAD_RIGHT, True, True),
    "deberta_v3": ("DebertaV3Backbone", dict(num_layers=2, num_heads=2, hidden_dim=8, intermediate_dim=8,
                                             max_sequence_length=L, bucket_size=2), PAD_RIGHT, False, False),
    "bloom": ("BloomBackbone", dict(num_layers=2, num_heads=2, hidden_dim=8, intermediate_dim=8), PAD_RIGHT,
              False, False),
    "falcon": ("FalconBackbone", dict(num_layers=2, num_attention_heads=2, hidden_dim=8, intermediate_dim=8),
               PAD_RIGHT, False, False),
}


def _build(name: str, kwargs: dict, seed: int = 0):
    keras.utils.set_random_seed(seed)
    key = "vocab_size" if name == "ElectraBackbone" else "vocabulary_size"
    return getattr(keras_hub.models, name)(**{key: V}, **kwargs)


@pytest.fixture(scope="module")
def backbones():
    """Each family's tiny backbone, built once for the module (lazily: a -k run builds only its own)."""
    cache: dict = {}

    def get(family: str):
        if family not in cache:
            cls, kwargs, *_ = FAMILIES[family]
            cache[family] = _build(cls, kwargs)
        return cache[family]

    return get


def reference(model, inputs):
    """The model's output and every attention layer's own probabilities, in the order they ran: each
    ``MultiHeadAttention``'s ``_compute_attention`` run with ``return_attention_scores=True`` (its explicit
    path, its own scores), and the output of every other ``keras.layers.Softmax`` (patched on the class)."""
    mha, _ = attention_layers(model)
    skip = {id(layer._softmax) for layer in mha}
    seen: list[np.ndarray] = []
    softmax_call = keras.layers.Softmax.call

    def softmax(self, x, mask=None):
        out = softmax_call(self, x, mask=mask)
        if id(self) not in skip:
            seen.append(np.asarray(out))
        return out

    def scored(compute):  # MultiHeadAttention._compute_attention(query, key, value, mask, training, scores, ...)
        def wrapped(*args, **kwargs):
            if len(args) > 5:
                args = (*args[:5], True, *args[6:])
            else:
                kwargs["return_attention_scores"] = True
            out = compute(*args, **kwargs)
            seen.append(np.asarray(out[1]))
            return out

        return wrapped

    keras.layers.Softmax.call = softmax
    for layer in mha:
        object.__setattr__(layer, "_compute_attention", scored(layer._compute_attention))
    try:
        out = model(inputs)
    finally:
        keras.layers.Softmax.call = softmax_call
        for layer in mha:
            object.__delattr__(layer, "_compute_attention")
    return out, seen


def _output(out) -> np.ndarray:
    return np.asarray(keras.tree.flatten(out)[0])


def _read(path: Path) -> tuple[dict, dict]:
    from safetensors import safe_open

    with safe_open(str(path), "np") as f:
        return {k: f.get_tensor(k) for k in f.keys()}, json.loads(f.metadata()["attnviz.capture"])


@pytest.mark.parametrize("family", list(FAMILIES))
def test_every_site_equals_the_layers_own_probabilities(family, backbones, tmp_path):
    """Every attention call of the backbone is a site, in the order they ran, equal (1e-5) to the layer's own
    probabilities; the output inside the block equals the output outside; q and k (where recorded) give the
    weights again in NumPy (--check); the layers are as before afterwards."""
    _, _, inputs, has_qk, has_wo = FAMILIES[family]
    model = backbones(family)
    before, ref = reference(model, inputs)
    path = tmp_path / f"{family}.safetensors"
    with attnviz.capture(model, path=path) as rec:
        inside = model(inputs)
    np.testing.assert_array_equal(_output(inside), _output(before))
    assert rec.sites == [f"layers.{i}" for i in range(len(ref))] and len(ref) == (1 if family == "qwen3_5" else 2)
    arrays, meta = _read(path)
    for site, theirs in zip(rec.sites, ref):
        ours = arrays[f"{site}.weights"]
        assert ours.shape[0] == B and ours.shape[-2:] == (L, L)
        np.testing.assert_allclose(ours, theirs.reshape(ours.shape), atol=1e-5, rtol=0)
        keep = arrays[f"{site}.mask"]
        assert keep.shape == (B, 1, L, L) and keep.dtype == bool
        assert not keep[1, 0][:, (inputs["padding_mask"][1] == 0)].any()  # the padded keys are masked
        assert (f"{site}.q" in arrays) == has_qk and (f"{site}.wo" in arrays) == has_wo
        if has_wo:
            assert arrays[f"{site}.wo"].shape[:2] == (ours.shape[1], arrays[f"{site}.v"].shape[-1])
        assert meta["sites"][site]["heads"] == ours.shape[1]
    np.testing.assert_array_equal(arrays["input_ids"], inputs["token_ids"])
    if has_qk:
        assert max(check_capture(path).values()) < 1e-5
    mha, hub = attention_layers(model)
    for layer in [*mha, *(layer for layer, _ in hub)]:
        assert not {"call", "_compute_attention"} & set(layer.__dict__)
    assert attnviz.inspect(rec).weights.shape[:3] == (len(ref), B, ref[0].reshape(B, -1, L, L).shape[1])


def test_grouped_heads_keep_the_key_value_heads(backbones, tmp_path):
    """Llama's keys reach the softmax repeated to the query heads; the file keeps them before the repeat, and
    the weights of every query head of a group come from that group's key head (the check recomputes them)."""
    with attnviz.capture(backbones("llama"), path=tmp_path / "l.safetensors"):
        backbones("llama")(PAD_LEFT)
    arrays, meta = _read(tmp_path / "l.safetensors")
    assert arrays["layers.0.q"].shape == (B, L, 4, 2) and arrays["layers.0.k"].shape == (B, L, 2, 2)
    assert meta["sites"]["layers.0"]["kv_heads"] == 2 and meta["sites"]["layers.0"]["scale"] == pytest.approx(2 ** -0.5)
    with attnviz.capture(backbones("gemma2"), path=tmp_path / "g.safetensors"):
        backbones("gemma2")(PAD_LEFT)
    arrays, meta = _read(tmp_path / "g.safetensors")
    assert meta["sites"]["layers.1"]["softcap"] == 0.5
    assert meta["sites"]["layers.1"]["scale"] == pytest.approx(2 ** -0.5)
    # (GemmaDecoderBlock builds its attention with query_head_dim_normalize=True whatever the backbone says)
    keep = arrays["layers.0.mask"][0, 0]  # the sliding window (3) is in the mask
    assert keep[5].tolist() == [False, False, False, True, True, True]


def test_albert_shared_layer_is_one_site_per_call(tmp_path):
    """ALBERT calls one shared encoder once per layer of its group: each call is a site of its own, equal to
    that call's probabilities; a second run of the model replaces the first (the file keeps the last run)."""
    model = _build("AlbertBackbone", dict(num_layers=3, num_heads=2, embedding_dim=8, hidden_dim=8,
                                          intermediate_dim=8, num_groups=1, num_inner_repetitions=1,
                                          max_sequence_length=L))
    mha, _ = attention_layers(model)
    assert len(mha) == 1
    _, ref = reference(model, SEGMENTS)
    with attnviz.capture(model, path=tmp_path / "a.safetensors", layers=-1) as last:
        model(SEGMENTS)
    assert last.sites == ["layers.2"]
    with pytest.warns(UserWarning, match="the model ran 2 times"):
        with attnviz.capture(model, path=tmp_path / "a.safetensors") as rec:
            model(SEGMENTS)
            model(SEGMENTS)
    assert rec.sites == ["layers.0", "layers.1", "layers.2"]
    arrays, _ = _read(tmp_path / "a.safetensors")
    for site, theirs in zip(rec.sites, ref):
        np.testing.assert_allclose(arrays[f"{site}.weights"], theirs, atol=1e-5, rtol=0)
    assert not np.allclose(arrays["layers.0.weights"], arrays["layers.1.weights"])


def test_clip_text_encoder_causal_only_call(tmp_path):
    """CLIP's text encoder gives MultiHeadAttention a causal mask only, which Keras hands down as
    ``use_causal_mask=True`` with no attention mask: the weights are causal and equal the layer's own."""
    model = _build("CLIPTextEncoder", dict(embedding_dim=8, hidden_dim=8, num_layers=2, num_heads=2,
                                           intermediate_dim=8, max_sequence_length=L))
    inputs = {"token_ids": PAD_RIGHT["token_ids"]}  # the text encoder takes no padding mask
    before, ref = reference(model, inputs)
    with attnviz.capture(model, path=tmp_path / "c.safetensors") as rec:
        inside = model(inputs)
    np.testing.assert_array_equal(_output(inside), _output(before))
    arrays, _ = _read(tmp_path / "c.safetensors")
    assert rec.sites == ["layers.0", "layers.1"]
    for site, theirs in zip(rec.sites, ref):
        np.testing.assert_allclose(arrays[f"{site}.weights"], theirs, atol=1e-5, rtol=0)
        assert not np.triu(arrays[f"{site}.mask"][0, 0], 1).any()


IMAGES = np.random.default_rng(0).normal(size=(B, 8, 8, 3)).astype("float32")
AUDIO_PAD = np.ones((B, 1600), bool)
AUDIO_PAD[1, 1200:] = False
#: MultiHeadAttention over patches or audio frames: backbone, arguments, inputs, sites
OTHER_INPUTS = {
    "vit": ("ViTBackbone", dict(image_shape=(8, 8, 3), patch_size=4, num_layers=2, num_heads=2, hidden_dim=8,
                                mlp_dim=8), IMAGES, ["layers.0", "layers.1"]),
    "clip_vision": ("CLIPVisionEncoder", dict(patch_size=4, hidden_dim=8, num_layers=2, num_heads=2,
                                              intermediate_dim=8, image_shape=(8, 8, 3)), {"images": IMAGES},
                    ["layers.0", "layers.1"]),
    "siglip_text": ("SigLIPTextEncoder", dict(embedding_dim=8, hidden_dim=8, num_layers=2, num_heads=2,
                                              intermediate_dim=8, max_sequence_length=L),
                    {"token_ids": PAD_RIGHT["token_ids"]}, ["layers.0", "layers.1"]),
    # the attention pooling head's probe query is a site too ([B, H, 1, patches])
    "siglip_vision": ("SigLIPVisionEncoder", dict(patch_size=4, hidden_dim=8, num_layers=2, num_heads=2,
                                                  intermediate_dim=8, image_shape=(8, 8, 3)), IMAGES,
                      ["layers.0", "layers.1", "layers.2"]),
    # RoPE applied in call, then _compute_attention with a 4-D mask; its cross attention unnamed but held as
    # the decoder's cross_attention
    "moonshine": ("MoonshineBackbone", dict(filter_dim=8, encoder_num_layers=1, decoder_num_layers=1, hidden_dim=8,
                                            intermediate_dim=8, encoder_num_heads=2, decoder_num_heads=2,
                                            partial_rotary_factor=0.5),
                  {"encoder_input_values": np.random.default_rng(1).normal(size=(B, 1600, 1)).astype("float32"),
                   "encoder_padding_mask": AUDIO_PAD, "decoder_token_ids": np.array([[1, 2, 3, 4], [1, 2, 3, 0]]),
                   "decoder_padding_mask": np.array([[1, 1, 1, 1], [1, 1, 1, 0]], bool)},
                  ["encoder.layers.0", "decoder.layers.0", "cross.layers.0"]),
}


@pytest.mark.parametrize("family", list(OTHER_INPUTS))
def test_patches_and_audio_frames(family, tmp_path):
    cls, kwargs, inputs, sites = OTHER_INPUTS[family]
    model = _build(cls, kwargs)
    before, ref = reference(model, inputs)
    with attnviz.capture(model, path=tmp_path / "o.safetensors") as rec:
        inside = model(inputs)
    np.testing.assert_array_equal(_output(inside), _output(before))
    assert rec.sites == sites and len(ref) == len(sites)
    arrays, _ = _read(tmp_path / "o.safetensors")
    for site, theirs in zip(rec.sites, ref):
        np.testing.assert_allclose(arrays[f"{site}.weights"], theirs, atol=1e-5, rtol=0)
    assert max(check_capture(tmp_path / "o.safetensors").values()) < 1e-5


@pytest.mark.parametrize("family", ["bart", "whisper"])
def test_encoder_decoder_sites_by_kind(family, tmp_path):
    """BART and Whisper: the encoder's self-attention, the decoder's self-attention and its cross-attention
    are sites of their kinds (``encoder.layers.N``, ``decoder.layers.N``, ``cross.layers.N``) as in a
    transformers capture, each equal to the layer's own scores (cross: decoder queries over encoder keys);
    ``inspect FILE:cross`` reads them."""
    decoder = {"decoder_token_ids": PAD_RIGHT["token_ids"][:, :4], "decoder_padding_mask": np.ones((B, 4), "int32")}
    if family == "bart":
        model = _build("BartBackbone", dict(num_layers=1, num_heads=2, hidden_dim=8, intermediate_dim=8,
                                            max_sequence_length=L))
        inputs = {"encoder_token_ids": PAD_RIGHT["token_ids"], "encoder_padding_mask": PAD_RIGHT["padding_mask"],
                  **decoder}
        encoded = L
    else:
        model = _build("WhisperBackbone", dict(num_layers=1, num_heads=2, hidden_dim=8, intermediate_dim=8,
                                               num_mels=4, max_encoder_sequence_length=8,
                                               max_decoder_sequence_length=L))
        features = np.random.default_rng(0).normal(size=(B, 8, 4)).astype("float32")
        inputs = {"encoder_features": features, **decoder}
        encoded = 4  # the convolutional stem halves the frames
    before, ref = reference(model, inputs)
    out = tmp_path / f"{family}.safetensors"
    with attnviz.capture(model, path=out) as rec:
        inside = model(inputs)
    np.testing.assert_array_equal(_output(inside), _output(before))
    assert rec.sites == ["encoder.layers.0", "decoder.layers.0", "cross.layers.0"]
    arrays, meta = _read(out)
    assert [arrays[f"{s}.weights"].shape[-2:] for s in rec.sites] == [(encoded, encoded), (4, 4), (4, encoded)]
    for site, theirs in zip(rec.sites, ref):
        np.testing.assert_allclose(arrays[f"{site}.weights"], theirs, atol=1e-5, rtol=0)
    assert meta["kinds"] == ["cross", "decoder", "encoder"]
    np.testing.assert_array_equal(arrays["decoder_input_ids"], decoder["decoder_token_ids"])
    shown = _invoke("inspect", f"{out}:cross", "--json")
    assert shown.exit_code == 0, shown.stderr
    assert json.loads(shown.stdout)["weights_shape"] == [1, B, 2, 4, encoded]


def test_fused_path_is_made_explicit_inside_the_block(backbones, monkeypatch, tmp_path):
    """Where KerasHub would take a fused dot_product_attention (the JAX and torch backends: its
    ``fused_attention_op_available()`` says yes), the capture makes the layers take the explicit path inside
    the block (their softmax runs, the weights are recorded) and restores the function after. A layer that
    still forms no weights is refused by its class."""
    from keras_hub.src.models.llama import llama_attention

    model = backbones("llama")
    _, ref = reference(model, PAD_LEFT)
    monkeypatch.setattr(llama_attention, "fused_attention_op_available", lambda: True)
    outside = _output(model(PAD_LEFT))
    with attnviz.capture(model, path=tmp_path / "f.safetensors") as rec:
        inside = _output(model(PAD_LEFT))
        assert llama_attention.fused_attention_op_available() is False
    assert llama_attention.fused_attention_op_available() is True
    real = PAD_LEFT["padding_mask"].astype(bool)  # a padded query's row attends to nothing: the paths differ there
    np.testing.assert_allclose(inside[real], outside[real], atol=1e-5)
    arrays, _ = _read(tmp_path / "f.safetensors")
    np.testing.assert_allclose(arrays["layers.1.weights"], ref[1], atol=1e-5, rtol=0)
    assert rec.sites == ["layers.0", "layers.1"]
    # a layer that takes a fused op the capture cannot turn off (here, its instance's own) is refused by class
    layer = model.transformer_layers[1]._self_attention_layer

    def fused(query, key, value, attention_mask=None):
        mask = keras.ops.cast(keras.ops.expand_dims(attention_mask, 1), "bool")
        return keras.ops.dot_product_attention(query, key, value, mask=mask, scale=layer._inv_norm_factor)

    monkeypatch.setattr(layer, "_compute_attention", fused, raising=False)
    with pytest.raises(InputError, match=r"^LlamaAttention \(self_attention.*\): the layer formed no weights"):
        with attnviz.capture(model, path=tmp_path / "g.safetensors"):
            model(PAD_LEFT)
    assert not (tmp_path / "g.safetensors").exists()


def test_layers_attnviz_cannot_see_are_refused_by_class(tmp_path):
    """A layer of a class refused by name (SAM's TwoWayMultiHeadAttention: an inline softmax whose weights are
    never returned) is refused naming it; so is an unknown layer named ...Attention; nothing is written."""

    class TwoWayMultiHeadAttention(keras.layers.Layer):
        def call(self, x):
            return x

    class WindowedAttention(keras.layers.Layer):
        def call(self, x):
            return x

    inp = keras.Input((4, 8))
    for layer, said in ((TwoWayMultiHeadAttention(name="sam"), r"^TwoWayMultiHeadAttention \(sam\): attnviz cannot "
                         "capture this KerasHub attention layer: its softmax is inline"),
                        (WindowedAttention(), r"^WindowedAttention \(.*\): an attention layer attnviz does not know")):
        model = keras.Model(inp, layer(keras.layers.MultiHeadAttention(2, 4)(inp, inp)))
        with pytest.raises(InputError, match=said):
            with attnviz.capture(model, path=tmp_path / "w.safetensors"):
                pass
        assert list(tmp_path.iterdir()) == []


def test_traced_predict_is_refused_in_one_line(backbones, tmp_path):
    model = backbones("llama")
    with pytest.raises(AttnvizError, match=r"^self_attention: the model runs as a graph .*call the model directly"):
        with attnviz.capture(model, path=tmp_path / "p.safetensors"):
            model.predict(PAD_LEFT, verbose=0)
    assert not (tmp_path / "p.safetensors").exists()
    with attnviz.capture(model, path=tmp_path / "p.safetensors") as rec:  # the model is as before
        model(PAD_LEFT)
    assert rec.sites == ["layers.0", "layers.1"]


def test_generate_is_refused_in_one_line(backbones, tmp_path):
    """KerasHub's generate() (a compiled loop over a cache of the whole length) is refused before it runs;
    the task model is as before afterwards."""
    lm = keras_hub.models.LlamaCausalLM(backbone=backbones("llama"), preprocessor=None)
    with pytest.raises(AttnvizError, match=r"^LlamaCausalLM.generate\(\): KerasHub runs its loop"):
        with attnviz.capture(lm, path=tmp_path / "g.safetensors"):
            lm.generate(PAD_RIGHT, max_length=L, stop_token_ids=None)
    assert not (tmp_path / "g.safetensors").exists() and "generate" not in lm.__dict__
    with attnviz.capture(lm, path=tmp_path / "g.safetensors") as rec:
        logits = lm(PAD_RIGHT)
    assert rec.sites == ["layers.0", "layers.1"] and tuple(logits.shape) == (B, L, V)


def test_tokens_from_a_kerashub_tokenizer(backbones, tmp_path):
    """A KerasHub tokenizer (or a preprocessor holding one) gives the file its tokens."""
    pytest.importorskip("tensorflow_text")
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "cat", "sat", "on", "mat"] + \
        [f"w{i}" for i in range(V - 10)]
    tokenizer = keras_hub.tokenizers.BertTokenizer(vocabulary=vocab)
    ids = np.asarray(tokenizer(["the cat sat on the mat"]))
    inputs = {"token_ids": ids, "padding_mask": np.ones_like(ids), "segment_ids": np.zeros_like(ids)}
    model = _build("BertBackbone", dict(num_layers=1, num_heads=2, hidden_dim=8, intermediate_dim=8,
                                        max_sequence_length=L))
    with attnviz.capture(model, tokenizer, path=tmp_path / "t.safetensors") as rec:
        model(inputs)
    assert rec.metadata["tokens"] == [["the", "cat", "sat", "on", "the", "mat"]]


TORCH_BACKEND = r"""
import json, os, sys
os.environ["KERAS_BACKEND"] = "torch"
import numpy as np, keras, keras_hub, attnviz
from keras_hub.src.models.llama import llama_attention
from safetensors.numpy import load_file
assert llama_attention.fused_attention_op_available()  # the torch backend: KerasHub takes the fused op
keras.utils.set_random_seed(0)
model = keras_hub.models.LlamaBackbone(vocabulary_size=16, num_layers=2, num_query_heads=4, num_key_value_heads=2,
                                       hidden_dim=8, intermediate_dim=8)
x = {"token_ids": np.array([[5, 2, 3, 4, 7, 1], [0, 0, 3, 4, 5, 6]]),
     "padding_mask": np.array([[1, 1, 1, 1, 1, 1], [0, 0, 1, 1, 1, 1]])}
fused = keras.ops.convert_to_numpy(model(x))
# the layer's own probabilities: its explicit path, its softmax's output read here
seen, call, available = [], keras.layers.Softmax.call, llama_attention.fused_attention_op_available
keras.layers.Softmax.call = lambda self, s, mask=None: seen.append(call(self, s, mask=mask)) or seen[-1]
llama_attention.fused_attention_op_available = lambda: False
model(x)
keras.layers.Softmax.call, llama_attention.fused_attention_op_available = call, available
with attnviz.capture(model, path=sys.argv[1]) as rec:
    inside = keras.ops.convert_to_numpy(model(x))
real = x["padding_mask"].astype(bool)
arrays = load_file(sys.argv[1])
print(json.dumps({"sites": rec.sites, "output": float(np.abs(inside[real] - fused[real]).max()),
                  "weights": [float(np.abs(arrays[f"layers.{i}.weights"] - keras.ops.convert_to_numpy(s)).max())
                              for i, s in enumerate(seen)],
                  "restored": llama_attention.fused_attention_op_available()}), flush=True)
import gc
gc.freeze()  # the result printed: the shutdown leaves Keras, torch and TensorFlow to the system (~3 s less)
"""


def test_torch_backend_fused_path_made_explicit(tmp_path):
    """On the torch backend KerasHub's Llama takes the fused op (no weights formed); inside the capture it takes
    the explicit path (its output equal to the fused one's on the real rows) and each site equals its softmax."""
    import os
    import subprocess
    import sys

    pytest.importorskip("torch")
    env = {**os.environ, "KERAS_BACKEND": "torch"}
    done = subprocess.run([sys.executable, "-c", TORCH_BACKEND, str(tmp_path / "t.safetensors")], env=env,
                          capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["sites"] == ["layers.0", "layers.1"] and result["restored"] is True
    assert result["output"] < 1e-5 and len(result["weights"]) == 2 and max(result["weights"]) < 1e-5


VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "cat", "sat", "on", "mat"] + \
    [f"w{i}" for i in range(V - 10)]


@pytest.fixture(scope="module")
def bert_preset(tmp_path_factory) -> Path:
    """A tiny BERT backbone and its WordPiece tokenizer, saved by save_to_preset into one folder."""
    pytest.importorskip("tensorflow_text")
    folder = tmp_path_factory.mktemp("preset") / "bert"
    _build("BertBackbone", dict(num_layers=2, num_heads=2, hidden_dim=8, intermediate_dim=8,
                                max_sequence_length=8)).save_to_preset(str(folder))
    keras_hub.tokenizers.BertTokenizer(vocabulary=VOCAB).save_to_preset(str(folder))
    return folder


def _invoke(*args: str):
    from typer.testing import CliRunner

    from attnviz.cli import app

    return CliRunner().invoke(app, list(args))


def test_cli_capture_of_a_preset_folder(bert_preset, tmp_path):
    """``attnviz capture PRESET_DIR --text ...``: the folder's backbone and tokenizer, a right-padded batch, each
    site equal to the layer's own scores on that batch, --check passing, the tokens as inspect's labels."""
    out = tmp_path / "run.safetensors"
    done = _invoke("capture", str(bert_preset), "--text", "the cat sat on the mat", "--text", "the cat", "-o",
                   str(out), "--check", "--json")
    assert done.exit_code == 0, done.stderr
    doc = json.loads(done.stdout)
    assert doc["sites"] == ["layers.0", "layers.1"] and doc["shape"] == [2, 2, 6, 6] and doc["check"]["passed"]
    backbone = keras_hub.models.Backbone.from_preset(str(bert_preset))
    ids = np.array([[5, 6, 7, 8, 5, 9], [5, 6, 0, 0, 0, 0]])
    batch = {"token_ids": ids, "padding_mask": (np.arange(6) < np.array([[6], [2]])).astype("int32"),
             "segment_ids": np.zeros_like(ids)}
    _, ref = reference(backbone, batch)
    arrays, meta = _read(out)
    np.testing.assert_array_equal(arrays["input_ids"], ids)
    for i, theirs in enumerate(ref):
        np.testing.assert_allclose(arrays[f"layers.{i}.weights"], theirs, atol=1e-5, rtol=0)
    assert meta["tokens"][1][:3] == ["the", "cat", "[PAD]"] and meta["architecture"] == "BertBackbone"
    shown = _invoke("inspect", str(out), "--batch", "0", "--json")
    assert shown.exit_code == 0, shown.stderr
    assert json.loads(shown.stdout)["labels"]["q"] == ["the", "cat", "sat", "on", "the", "mat"]


def test_cli_preset_tells_attnviz_faults_from_the_models(bert_preset, tmp_path, monkeypatch):
    """What attnviz's own code raises inside the backbone's call (the recorder here) is an internal error, its own
    message as it was raised (not Keras' rewriting of it); the model's own failures, inside the attention layer's
    computation that attnviz's wrapper calls or before any of attnviz's code, say the model failed."""
    from attnviz.capturing.recorder import Recorder

    out = tmp_path / "run.safetensors"

    def broken(*args, **kwargs):
        raise RuntimeError("it broke")

    for where, name in ((Recorder, "record"), (keras.layers.MultiHeadAttention, "_compute_attention"),
                        (keras.layers.Embedding, "call")):
        with monkeypatch.context() as patch:
            patch.setattr(where, name, broken)
            done = _invoke("capture", str(bert_preset), "--text", "the cat", "-o", str(out))
        assert done.exit_code == 1, (name, done.stderr)
        if where is Recorder:
            assert done.stderr == ("attnviz: internal error: RuntimeError: it broke\nThis is a bug; rerun with "
                                   "ATTNVIZ_DEBUG=1 for the traceback and please report it.\n")
        else:
            assert done.stderr.startswith(f"attnviz: error: {bert_preset}: the model failed on the texts ("), \
                (name, done.stderr)
            assert done.stderr.count("\n") == 1, done.stderr
        assert not out.exists()


@pytest.mark.parametrize("missing, said", [("model.weights.h5", "no weights"), ("tokenizer.json", "no tokenizer")])
def test_cli_preset_folder_without_weights_or_tokenizer(bert_preset, tmp_path, missing, said):
    import shutil

    folder = tmp_path / "preset"
    shutil.copytree(bert_preset, folder)
    (folder / missing).unlink()
    out = tmp_path / "run.safetensors"
    done = _invoke("capture", str(folder), "--text", "the cat", "-o", str(out))
    assert done.exit_code == 1 and said in done.stderr and len(done.stderr.strip().splitlines()) == 1
    assert not out.exists()


def test_cli_preset_capture_keeps_tensorflows_start_up_log_quiet(bert_preset, tmp_path):
    """A fresh process (TensorFlow's C++ log is written when it loads and when its devices start): stderr holds
    attnviz's own lines only, not the absl lines TensorFlow writes twice while it loads ("I0000 ... oneDNN custom
    operations", "Could not find cuda drivers") nor "E0000 ... failed call to cuInit" on a machine without a GPU;
    the user's own TF_CPP_MIN_LOG_LEVEL (0 to 2) asks for them and gets them."""
    import os
    import subprocess
    import sys

    from tests.conftest import ROOT

    env = {k: v for k, v in os.environ.items() if k not in ("TF_CPP_MIN_LOG_LEVEL", "ATTNVIZ_DEBUG")}
    out = tmp_path / "run.safetensors"
    argv = [sys.executable, "-m", "attnviz", "--no-server", "capture", str(bert_preset), "--text", "the cat", "-o",
            str(out)]
    done = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
    assert done.returncode == 0, done.stderr
    assert [line for line in done.stderr.splitlines() if line.strip()] == [f"saved capture to {out}"], done.stderr
    asked = subprocess.run(argv, capture_output=True, text=True, env={**env, "TF_CPP_MIN_LOG_LEVEL": "0"}, cwd=ROOT,
                           timeout=300)
    assert asked.returncode == 0, asked.stderr
    assert "I0000" in asked.stderr or "absl" in asked.stderr, asked.stderr


@pytest.mark.parametrize("family", ["bert", "llama", "gemma", "gpt_neo_x", "smollm3"])
def test_output_projection_gives_the_layers_output(family, backbones, tmp_path):
    """What value-norm maps rest on: the recorded weights, v (repeated to the query heads) and wo (and bo)
    give the attention layer's own output, read from its output projection here."""
    model = backbones(family)
    inputs = FAMILIES[family][2]
    mha, hub = attention_layers(model)
    first = mha[0] if mha else hub[0][0]
    dense = next(getattr(first, n) for n in ("_output_dense", "output_dense", "o_proj") if hasattr(first, n))
    outputs = []
    call = type(dense).call

    def record(self, *args, **kwargs):
        out = call(self, *args, **kwargs)
        if self is dense:
            outputs.append(np.asarray(out))
        return out

    type(dense).call = record
    try:
        model(inputs)
    finally:
        type(dense).call = call
    with attnviz.capture(model, path=tmp_path / "w.safetensors"):
        model(inputs)
    arrays, _ = _read(tmp_path / "w.safetensors")
    w, v, wo = arrays["layers.0.weights"], arrays["layers.0.v"], arrays["layers.0.wo"]
    v = np.repeat(v, w.shape[1] // v.shape[2], axis=2)
    ours = np.einsum("bhqk,bkhd,hdm->bqm", w.astype(np.float64), v, wo) + arrays.get("layers.0.bo", 0.0)
    np.testing.assert_allclose(ours, outputs[0], atol=1e-5, rtol=0)


def test_gpt_oss_sinks_recomputed_as_its_inline_softmax(tmp_path, monkeypatch):
    """gpt-oss forms its weights with an inline ops.softmax over the keys and one sink logit per head (and a
    sliding window): attnviz recomputes them from the q and k handed to _compute_attention; each site equals the
    layer's own softmax output (read here, the sink column dropped), the sinks are in the file, --check agrees."""
    from keras_hub.src.models.gpt_oss import gpt_oss_attention

    model = _build("GptOssBackbone", dict(num_layers=2, num_query_heads=4, num_key_value_heads=2, hidden_dim=8,
                                          intermediate_dim=8, num_experts=2, top_k=1, sliding_window=2, head_dim=2))
    for block in model.transformer_layers:  # sinks of their own (they start at zero)
        layer = next(c for c in block._layers if type(c).__name__ == "GptOssAttention")
        layer.sinks.assign(np.linspace(-1.0, 1.0, 4).astype("float32"))
    seen = []
    softmax = gpt_oss_attention.ops.softmax

    def recording(x, axis=-1):
        out = softmax(x, axis=axis)
        if out.shape[-1] == L + 1:
            seen.append(np.asarray(out)[..., :-1])
        return out

    monkeypatch.setattr(gpt_oss_attention.ops, "softmax", recording)
    before = _output(model(PAD_LEFT))
    monkeypatch.setattr(gpt_oss_attention.ops, "softmax", softmax)
    with attnviz.capture(model, path=tmp_path / "o.safetensors") as rec:
        inside = _output(model(PAD_LEFT))
    np.testing.assert_array_equal(inside, before)
    arrays, meta = _read(tmp_path / "o.safetensors")
    assert rec.sites == ["layers.0", "layers.1"] and len(seen) == 2
    for site, theirs in zip(rec.sites, seen):
        np.testing.assert_allclose(arrays[f"{site}.weights"], theirs, atol=1e-5, rtol=0)
        assert meta["sites"][site]["sinks"] is True and arrays[f"{site}.sinks"].shape == (4,)
    assert arrays["layers.0.weights"][0, 0, 5].sum() < 0.999  # the sink takes its share
    # the window (2) on the odd layers: keys 3..5 seen from query 5
    assert arrays["layers.0.mask"][0, 0, 5].all() and not arrays["layers.1.mask"][0, 0, 5, :3].any()
    assert max(check_capture(tmp_path / "o.safetensors").values()) < 1e-5


def test_t5_recomputed_from_its_projections_and_position_bias(tmp_path, monkeypatch):
    """T5's inline ops.nn.softmax over q.k plus the position bias its call returns: each site (encoder, decoder,
    cross) equals the layer's own softmax output (read here), the bias is in the file (0 where masked), --check
    agrees, and weights, v and wo give the layer's output."""
    model = _build("T5Backbone", dict(num_layers=2, num_heads=2, hidden_dim=8, intermediate_dim=8))
    inputs = {"encoder_token_ids": PAD_RIGHT["token_ids"], "encoder_padding_mask": PAD_RIGHT["padding_mask"],
              "decoder_token_ids": PAD_RIGHT["token_ids"][:, :4],
              "decoder_padding_mask": np.array([[1, 1, 1, 1], [1, 1, 1, 0]])}
    seen, outputs = [], []
    softmax = keras.ops.nn.softmax

    def recording(x, axis=-1):
        out = softmax(x, axis=axis)
        seen.append(np.asarray(out))
        return out

    monkeypatch.setattr(keras.ops.nn, "softmax", recording)
    first = model.get_layer("transformer_encoder_layer_0").self_attention.output_projector
    dense_call = type(first).call

    def projected(self, *args, **kwargs):
        out = dense_call(self, *args, **kwargs)
        if self is first:
            outputs.append(np.asarray(out))
        return out

    monkeypatch.setattr(type(first), "call", projected)
    before = _output(model(inputs))
    monkeypatch.undo()
    out = tmp_path / "t5.safetensors"
    with attnviz.capture(model, path=out) as rec:
        inside = _output(model(inputs))
    np.testing.assert_array_equal(inside, before)
    assert rec.sites == ["encoder.layers.0", "encoder.layers.1", "decoder.layers.0", "decoder.layers.1",
                         "cross.layers.0", "cross.layers.1"]
    arrays, _ = _read(out)
    ran = ["encoder.layers.0", "encoder.layers.1", "decoder.layers.0", "cross.layers.0", "decoder.layers.1",
           "cross.layers.1"]
    assert len(seen) == len(ran)
    for site, theirs in zip(ran, seen):
        np.testing.assert_allclose(arrays[f"{site}.weights"], theirs, atol=1e-5, rtol=0)
    assert arrays["cross.layers.0.weights"].shape == (B, 2, 4, L)
    assert not arrays["encoder.layers.0.mask"][1, 0][:, 4:].any()
    assert np.abs(arrays["encoder.layers.0.position_bias"]).max() < 1e3
    assert max(check_capture(out).values()) < 1e-5
    w, v, wo = arrays["encoder.layers.0.weights"], arrays["encoder.layers.0.v"], arrays["encoder.layers.0.wo"]
    np.testing.assert_allclose(np.einsum("bhqk,bkhd,hdm->bqm", w, v, wo), outputs[0], atol=1e-5, rtol=0)


def test_weights_dtype_and_no_weights(backbones, tmp_path):
    """--weights-dtype and --no-weights on a KerasHub layer: the weights stored as float16 (equal to the
    layer's to float16's rounding), or not at all (q, k, v and the mask kept); ``layers`` keeps some sites."""
    model = backbones("qwen3")
    _, ref = reference(model, PAD_LEFT)
    with attnviz.capture(model, path=tmp_path / "h.safetensors", weights_dtype="float16", layers=[-1]) as rec:
        model(PAD_LEFT)
    arrays, _ = _read(tmp_path / "h.safetensors")
    assert rec.sites == ["layers.1"] and arrays["layers.1.weights"].dtype == np.float16
    np.testing.assert_allclose(arrays["layers.1.weights"].astype(np.float32), ref[1], atol=1e-3, rtol=0)
    with attnviz.capture(model, path=tmp_path / "n.safetensors", weights=False):
        model(PAD_LEFT)
    arrays, _ = _read(tmp_path / "n.safetensors")
    assert "layers.0.weights" not in arrays and {"layers.0.q", "layers.0.k", "layers.0.mask"} <= set(arrays)


@pytest.mark.parametrize("family", ["pali_gemma", "gemma3_vision"])
def test_vision_encoders_that_return_their_probabilities(family, tmp_path, monkeypatch):
    """PaliGemma's and Gemma 3's vision encoders return (output, probabilities) from their attention's call:
    each site equals the layer's own inline softmax (read here); PaliGemma's Gemma decoder follows (its
    softmax sublayer) over the image tokens and the text; --check agrees."""
    images = np.random.default_rng(0).normal(size=(B, 16, 16, 3)).astype("float32")
    if family == "pali_gemma":
        model = _build("PaliGemmaBackbone", dict(image_size=16, num_layers=2, num_query_heads=2, num_key_value_heads=1,
                                                 hidden_dim=8, intermediate_dim=8, head_dim=4, vit_patch_size=8,
                                                 vit_num_heads=2, vit_hidden_dim=8, vit_num_layers=2,
                                                 vit_intermediate_dim=8))
        inputs = {"images": images, "token_ids": PAD_RIGHT["token_ids"], "padding_mask": PAD_RIGHT["padding_mask"],
                  "response_mask": np.zeros((B, L), "int32")}
        shapes = [(4, 4), (4, 4), (4 + L, 4 + L), (4 + L, 4 + L)]
    else:
        from keras_hub.src.models.gemma3.gemma3_vision_encoder import Gemma3VisionEncoder

        keras.utils.set_random_seed(0)
        model = Gemma3VisionEncoder(image_size=16, patch_size=8, num_heads=2, hidden_dim=8, num_layers=2,
                                    intermediate_dim=8, output_dim=8, pool_size=1)
        inputs, shapes = images[:, None], [(4, 4), (4, 4)]
    vision = []
    softmax = keras.ops.softmax

    def recording(x, axis=-1):
        out = softmax(x, axis=axis)
        vision.append(np.asarray(out))
        return out

    monkeypatch.setattr(keras.ops, "softmax", recording)
    before, text = reference(model, inputs)
    monkeypatch.undo()
    out = tmp_path / "v.safetensors"
    with attnviz.capture(model, path=out) as rec:
        inside = model(inputs)
    np.testing.assert_array_equal(_output(inside), _output(before))
    arrays, _ = _read(out)
    assert [arrays[f"{s}.weights"].shape[-2:] for s in rec.sites] == shapes
    for site, theirs in zip(rec.sites, vision + text):  # Gemma's are [B, kv heads, groups, Lq, Lk]
        ours = arrays[f"{site}.weights"]
        np.testing.assert_allclose(ours, theirs.reshape(ours.shape), atol=1e-5, rtol=0)
    assert max(check_capture(out).values()) < 1e-5 and "input_ids" not in arrays


def test_t5gemma_encoder_decoder_with_an_added_mask(tmp_path):
    """T5Gemma: Gemma layers in an encoder-decoder whose mask is added to the scores (not handed to the
    softmax): the sites by kind, each equal to the layer's own softmax output; the mask recorded from the
    added one (padded keys hidden), and --check agrees."""
    model = _build("T5GemmaBackbone", dict(
        encoder_hidden_dim=8, encoder_intermediate_dim=8, encoder_num_layers=2, encoder_num_attention_heads=4,
        encoder_num_key_value_heads=2, encoder_head_dim=4, encoder_layer_types=["sliding_attention", "full_attention"],
        decoder_hidden_dim=8, decoder_intermediate_dim=8, decoder_num_layers=2, decoder_num_attention_heads=4,
        decoder_num_key_value_heads=2, decoder_head_dim=4, decoder_layer_types=["sliding_attention", "full_attention"],
        sliding_window=3, attn_logit_softcapping=50.0, query_pre_attn_scalar=4.0))
    inputs = {"encoder_token_ids": PAD_RIGHT["token_ids"], "encoder_padding_mask": PAD_RIGHT["padding_mask"],
              "decoder_token_ids": PAD_RIGHT["token_ids"][:, :4],
              "decoder_padding_mask": np.array([[1, 1, 1, 1], [1, 1, 1, 0]])}
    before, ref = reference(model, inputs)
    out = tmp_path / "t5g.safetensors"
    with attnviz.capture(model, path=out) as rec:
        inside = model(inputs)
    np.testing.assert_array_equal(_output(inside), _output(before))
    ran = ["encoder.layers.0", "encoder.layers.1", "decoder.layers.0", "cross.layers.0", "decoder.layers.1",
           "cross.layers.1"]
    assert sorted(rec.sites) == sorted(ran) and len(ref) == len(ran)
    arrays, meta = _read(out)
    for site, theirs in zip(ran, ref):
        np.testing.assert_allclose(arrays[f"{site}.weights"], theirs, atol=1e-5, rtol=0)
    assert not arrays["encoder.layers.0.mask"][1, 0][:, 4:].any()
    assert not arrays["cross.layers.0.mask"][1, 0][:, 4:].any()
    assert meta["sites"]["encoder.layers.0"]["scale"] == pytest.approx(0.5)
    assert meta["sites"]["cross.layers.0"]["softcap"] == 50.0
    assert max(check_capture(out).values()) < 1e-5

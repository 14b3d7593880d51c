"""`multihead`: keras.layers.MultiHeadAttention and GroupQueryAttention parity with the same weights
(masks, value_dim != key_dim, output_shape, no bias, grouped and multi-query), the reference spec's
examples, and a saved Keras model read with --from-keras."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from attnviz.cli import app
from attnviz.errors import ParamsError, UsageError
from tests.conftest import compute

runner = CliRunner()
XQ = np.array([[1.0, 0], [0, 1]])
XKV = np.array([[1.0, 1], [2, 0], [0, 2]])


def head_reads_feature(d, n, dim=1):
    k = np.zeros((d, n, dim))
    for h in range(n):
        k[h, h, 0] = 1.0
    return k


def test_reference_example_and_mask():
    learned = {
        "query/kernel": head_reads_feature(2, 2), "key/kernel": head_reads_feature(2, 2),
        "value/kernel": head_reads_feature(2, 2),
        "attention_output/kernel": np.transpose(head_reads_feature(2, 2), (1, 2, 0)),  # head h writes feature h
    }
    r = compute("multihead", inputs={"query": XQ, "value": XKV}, learned=learned)
    third = 1 / 3
    np.testing.assert_allclose(r.weights, [[[0.244728, 0.665241, 0.090031], [third] * 3],
                                           [[third] * 3, [0.244728, 0.090031, 0.665241]]], atol=1e-6)
    np.testing.assert_allclose(r.output, [[1.575210, 1.0], [1.0, 1.575210]], atol=1e-6)
    assert r.params["heads"] == 2 and r.params["use_bias"] is False
    keep = np.array([[1, 1, 0], [0, 0, 0]], bool)[None]  # attention_mask [T, S], head axis inserted
    r = compute("multihead", inputs={"query": XQ, "value": XKV}, learned=learned, keep=keep)
    np.testing.assert_allclose(r.weights[0, 0], [0.268941, 0.731059, 0], atol=1e-6)
    np.testing.assert_allclose(r.weights[1, 0], [0.5, 0.5, 0], atol=1e-6)
    assert (r.weights[:, 1] == 0).all()
    np.testing.assert_allclose(r.output, [[1.731058, 0.5], [0, 0]], atol=1e-6)


def test_reference_gqa_example():
    learned = {
        "query/kernel": head_reads_feature(2, 2),
        "key/kernel": np.array([[[1.0]], [[0.0]]]),  # reads feature 0
        "value/kernel": np.array([[[0.0]], [[1.0]]]),  # reads feature 1
        "attention_output/kernel": np.transpose(head_reads_feature(2, 2), (1, 2, 0)),
    }
    r = compute("multihead", inputs={"query": XQ, "value": XKV}, learned=learned)
    assert r.params["kv_heads"] == 1
    third = 1 / 3
    np.testing.assert_allclose(r.weights, [[[0.244728, 0.665241, 0.090031], [third] * 3],
                                           [[third] * 3, [0.244728, 0.665241, 0.090031]]], atol=1e-6)
    np.testing.assert_allclose(r.output, [[0.424790, 1.0], [1.0, 0.424790]], atol=1e-6)


def keras_weights(layer):
    return {w.path.split("/", 1)[1]: np.asarray(w.numpy()) for w in layer.weights}


def randomise(layer, rng):
    for w in layer.weights:  # biases too, so that each one is checked
        w.assign(rng.normal(scale=0.5, size=w.shape).astype(np.float32))


CASES = {
    "self": dict(num_heads=2, key_dim=3),
    "cross-value-dim-output": dict(num_heads=3, key_dim=4, value_dim=5, output_shape=7),
    "no-bias": dict(num_heads=2, key_dim=2, use_bias=False),
}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("masking", ["none", "attention_mask", "causal"])
def test_parity_with_keras_multi_head_attention(case, masking):
    import keras

    rng = np.random.default_rng(0)
    q = rng.normal(size=(2, 5, 6)).astype(np.float32)
    v = q if case == "self" else rng.normal(size=(2, 4, 8)).astype(np.float32)
    k = None if case == "self" else rng.normal(size=(2, 4, 3)).astype(np.float32)
    layer = keras.layers.MultiHeadAttention(**CASES[case])
    layer(q, v, k)
    randomise(layer, rng)
    mask = None
    if masking == "attention_mask":
        mask = rng.random((2, 5, v.shape[1])) > 0.3
        mask[1, 2] = False  # a fully masked query row: zeros in Keras 3 and in attnviz
    out, scores = layer(q, v, k, attention_mask=mask, return_attention_scores=True,
                        use_causal_mask=masking == "causal")
    inputs = {"query": q} if case == "self" else {"query": q, "value": v, "key": k}
    r = compute("multihead", inputs=inputs, learned=keras_weights(layer),
                keep=None if mask is None else mask[:, None], causal=masking == "causal")
    assert r.weights.shape == tuple(scores.shape)
    np.testing.assert_allclose(r.weights, np.asarray(scores), atol=1e-5)
    np.testing.assert_allclose(r.output, np.asarray(out), atol=1e-5)


@pytest.mark.parametrize("kv_heads", [1, 2])
def test_parity_with_keras_group_query_attention(kv_heads):
    import keras

    rng = np.random.default_rng(1)
    q = rng.normal(size=(2, 5, 6)).astype(np.float32)
    v = rng.normal(size=(2, 4, 6)).astype(np.float32)
    layer = keras.layers.GroupQueryAttention(head_dim=2, num_query_heads=4, num_key_value_heads=kv_heads)
    layer(q, v)
    randomise(layer, rng)
    mask = rng.random((2, 5, 4)) > 0.3
    out, scores = layer(q, v, attention_mask=mask, return_attention_scores=True)
    r = compute("multihead", inputs={"query": q, "value": v}, learned=keras_weights(layer), keep=mask[:, None])
    assert r.params["kv_heads"] == kv_heads and r.params["heads"] == 4
    np.testing.assert_allclose(r.weights, np.asarray(scores), atol=1e-5)
    np.testing.assert_allclose(r.output, np.asarray(out), atol=1e-5)


def test_hyper_parameters_read_off_or_refused():
    x = np.ones((3, 4))
    with pytest.raises(UsageError, match="give --heads"):
        compute("multihead", inputs={"query": x})
    with pytest.raises(UsageError, match="not a multiple"):
        compute("multihead", inputs={"query": x}, heads=3, kv_heads=2)
    drawn = compute("multihead", inputs={"query": x}, heads=2, seed=1)
    assert drawn.weights.shape == (2, 3, 3) and drawn.output.shape == (3, 4)
    with pytest.raises(ParamsError, match=r"query/kernel \[4, 2, 2\] has 2 heads, but --heads 4 was given"):
        compute("multihead", inputs={"query": x}, heads=4,
                learned={"query/kernel": np.ones((4, 2, 2)), "key/kernel": np.ones((4, 2, 2)),
                         "value/kernel": np.ones((4, 2, 2)), "attention_output/kernel": np.ones((2, 2, 4))})


def test_cli_seed_save_params_round_trip_and_from_keras(tmp_path):
    import keras

    rng = np.random.default_rng(2)
    x = rng.normal(size=(1, 6, 4)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    saved = tmp_path / "p.npz"
    a = runner.invoke(app, ["multihead", str(tmp_path / "x.npy"), "--heads", "2", "--seed", "7",
                            "--save-params", str(saved), "--json"])
    assert a.exit_code == 0, a.stderr
    b = runner.invoke(app, ["multihead", str(tmp_path / "x.npy"), "--params", str(saved), "--json"])
    assert b.exit_code == 0, b.stderr
    da, db = json.loads(a.stdout), json.loads(b.stdout)
    assert da["weights"] == db["weights"] and da["output"] == db["output"]  # identical, not just close
    assert da["weights_shape"] == [1, 2, 6, 6]

    inp = keras.Input((6, 4))
    mha = keras.layers.MultiHeadAttention(num_heads=2, key_dim=3, name="attn")
    model = keras.Model(inp, mha(inp, inp))
    randomise(mha, rng)
    model.save(tmp_path / "m.keras")
    out, scores = mha(x, x, return_attention_scores=True)
    c = runner.invoke(app, ["multihead", str(tmp_path / "x.npy"), "--from-keras", str(tmp_path / "m.keras"),
                            "--layer", "attn", "--json"])
    assert c.exit_code == 0, c.stderr
    dc = json.loads(c.stdout)
    np.testing.assert_allclose(dc["weights"], np.asarray(scores), atol=1e-5)
    np.testing.assert_allclose(dc["output"], np.asarray(out), atol=1e-5)
    bad = runner.invoke(app, ["multihead", str(tmp_path / "x.npy"), "--from-keras", str(tmp_path / "m.keras"),
                              "--layer", "nope"])
    assert bad.exit_code == 1 and "no attention layer named 'nope'" in bad.stderr and "attn" in bad.stderr


@pytest.mark.parametrize("content, message", [
    ("missing", "missing key 'attention_output/kernel'"),
    ("shape", "p.npz: the arrays disagree on the key_dim: query/kernel [4, 2, 2] has 2, key/kernel [4, 2, 3] has 3"),
    ("pickle", "never unpickles"),
    ("rank", "expected 3 dimensions"),
])
def test_bad_parameter_files_exit_1(tmp_path, content, message):
    x = tmp_path / "x.npy"
    np.save(x, np.ones((3, 4), np.float32))
    good = {"query/kernel": np.ones((4, 2, 2)), "key/kernel": np.ones((4, 2, 2)),
            "value/kernel": np.ones((4, 2, 2)), "attention_output/kernel": np.ones((2, 2, 4))}
    if content == "missing":
        del good["attention_output/kernel"]
    elif content == "shape":
        good["key/kernel"] = np.ones((4, 2, 3))
    elif content == "pickle":
        good["query/kernel"] = np.array([{"x": 1}], dtype=object)
    elif content == "rank":
        good["query/kernel"] = np.ones((4, 4))
    np.savez(tmp_path / "p.npz", **good)
    r = runner.invoke(app, ["multihead", str(x), "--params", str(tmp_path / "p.npz")])
    assert r.exit_code == 1, (r.stdout, r.stderr)
    assert message in r.stderr and "Traceback" not in r.stderr


MASK_FORMS = {  # attention masks as users hold them, [B, T, S] (Keras) and the Hugging Face 4-D forms
    "keras [B, T, S]": (2, 5, 4),
    "hf [B, 1, 1, S]": (2, 1, 1, 4),
    "hf [B, 1, T, S]": (2, 1, 5, 4),
    "hf [B, N, T, S]": (2, 3, 5, 4),
}


@pytest.mark.parametrize("form", list(MASK_FORMS))
def test_command_line_masks_of_every_form_equal_keras(form, tmp_path):
    """`multihead --mask` takes Keras's [B, T, S] and the 4-D forms Keras MultiHeadAttention itself
    accepts; the numbers are Keras's given the same mask."""
    import keras

    rng = np.random.default_rng(4)
    q = rng.normal(size=(2, 5, 6)).astype(np.float32)
    v = rng.normal(size=(2, 4, 8)).astype(np.float32)
    layer = keras.layers.MultiHeadAttention(num_heads=3, key_dim=4)
    layer(q, v)
    randomise(layer, rng)
    mask = rng.random(MASK_FORMS[form]) > 0.3
    mask[..., 0] = True  # no fully masked rows: Keras makes them uniform, attnviz zero (documented)
    out, scores = layer(q, v, attention_mask=mask, return_attention_scores=True)
    np.save(tmp_path / "q.npy", q)
    np.save(tmp_path / "v.npy", v)
    np.save(tmp_path / "mask.npy", mask.astype(np.int64))
    np.savez(tmp_path / "mha.npz", **keras_weights(layer))
    r = runner.invoke(app, ["multihead", str(tmp_path / "q.npy"), str(tmp_path / "v.npy"), "--params",
                            str(tmp_path / "mha.npz"), "--mask", str(tmp_path / "mask.npy"), "--json"])
    assert r.exit_code == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["weights_shape"] == [2, 3, 5, 4]
    np.testing.assert_allclose(doc["weights"], np.asarray(scores), atol=1e-5)
    np.testing.assert_allclose(doc["output"], np.asarray(out), atol=1e-5)


@pytest.mark.parametrize("shape", [(2, 2, 5, 4), (3, 1, 1, 4), (2, 5, 5)])
def test_mask_errors_state_the_real_weights_shape(shape, tmp_path):
    rng = np.random.default_rng(5)
    np.save(tmp_path / "q.npy", rng.normal(size=(2, 5, 6)).astype(np.float32))
    np.save(tmp_path / "v.npy", rng.normal(size=(2, 4, 6)).astype(np.float32))
    np.save(tmp_path / "mask.npy", np.ones(shape, np.int8))
    r = runner.invoke(app, ["multihead", str(tmp_path / "q.npy"), str(tmp_path / "v.npy"), "--heads", "3",
                            "--mask", str(tmp_path / "mask.npy")])
    assert r.exit_code == 1
    assert "[2, 3, 5, 4]" in r.stderr and "[B, 1, 1, S]" in r.stderr and "Traceback" not in r.stderr


def test_hf_padding_mask_as_key_padding_and_as_4d_agree(tmp_path):
    """A Hugging Face attention_mask [B, S] given as --key-padding-mask and the same mask as [B, 1, 1, S]
    give the same weights: padded keys get zero on every head."""
    rng = np.random.default_rng(6)
    x = rng.normal(size=(2, 5, 6)).astype(np.float32)
    pad = np.array([[1, 1, 1, 1, 1], [0, 0, 1, 1, 1]], np.int8)
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "pad.npy", pad)
    np.save(tmp_path / "pad4.npy", pad[:, None, None, :])
    docs = []
    for option, name in (("--key-padding-mask", "pad.npy"), ("--mask", "pad4.npy")):
        r = runner.invoke(app, ["multihead", str(tmp_path / "x.npy"), "--heads", "2", option, str(tmp_path / name),
                                "--json"])
        assert r.exit_code == 0, r.stderr
        docs.append(np.array(json.loads(r.stdout)["weights"]))
    np.testing.assert_array_equal(docs[0], docs[1])
    assert np.all(docs[0][1, :, :, :2] == 0) and np.allclose(docs[0].sum(-1), 1, atol=1e-6)

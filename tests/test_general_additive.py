"""`general` and `additive`: the reference spec's worked examples, NumPy oracles, and parity with
keras.layers.AdditiveAttention and keras.layers.Attention(score_mode="concat") with the same weights."""

from __future__ import annotations

import numpy as np
import pytest

from attnviz.errors import ParamsError
from tests.conftest import compute
from tests.oracle import bahdanau, general

Q1 = np.array([[1.0, 2.0]])
KEYS = np.array([[1.0, 0], [0, 1], [1, 1]])


def test_general_reference_example():
    r = compute("general", Q1, KEYS, KEYS, learned={"W_a": np.array([[1.0, 0], [0, -1]])})
    np.testing.assert_allclose(r.weights, [[0.843795, 0.042010, 0.114195]], atol=1e-6)
    np.testing.assert_allclose(r.output, [[0.957990, 0.156205]], atol=1e-6)


def test_general_with_identity_is_dot():
    rng = np.random.default_rng(0)
    q, k, v = rng.normal(size=(2, 4, 3)), rng.normal(size=(2, 5, 3)), rng.normal(size=(2, 5, 2))
    a = compute("general", q, k, v, learned={"W_a": np.eye(3)})
    b = compute("dot", q, k, v)
    np.testing.assert_allclose(a.weights, b.weights, atol=1e-6)


def test_general_oracle_with_different_widths_and_mask():
    rng = np.random.default_rng(1)
    q, k, v = rng.normal(size=(3, 4, 5)), rng.normal(size=(3, 6, 2)), rng.normal(size=(3, 6, 4))
    w_a = rng.normal(size=(5, 2))
    keep = rng.random((3, 4, 6)) > 0.3
    r = compute("general", q, k, v, learned={"W_a": w_a}, keep=keep)
    w, o = general(q, k, v, w_a, keep)
    np.testing.assert_allclose(r.weights, w, atol=1e-5)
    np.testing.assert_allclose(r.output, o, atol=1e-5)


def test_general_location_ignores_key_contents():
    rng = np.random.default_rng(2)
    q, k, v = rng.normal(size=(4, 3)), rng.normal(size=(5, 3)), rng.normal(size=(5, 2))
    w_a = rng.normal(size=(3, 5))
    a = compute("general", q, k, v, learned={"W_a": w_a}, score="location")
    b = compute("general", q, k * 7 + 1, v, learned={"W_a": w_a}, score="location")
    np.testing.assert_allclose(a.weights, b.weights)
    np.testing.assert_allclose(a.weights, np.exp(q @ w_a) / np.exp(q @ w_a).sum(-1, keepdims=True), atol=1e-6)


def test_bahdanau_reference_example():
    learned = {"W1": np.eye(2), "W2": np.array([[1.0, 0], [0, -1]]), "v": np.array([1.0, 1])}
    r = compute("additive", Q1, KEYS, KEYS, learned=learned)  # b is optional: zeros
    np.testing.assert_allclose(r.weights, [[0.402608, 0.268566, 0.328826]], atol=1e-6)
    np.testing.assert_allclose(r.output, [[0.731434, 0.597392]], atol=1e-6)
    assert r.params["units"] == 2  # read off W1


def test_bahdanau_oracle_batch_and_mask():
    rng = np.random.default_rng(3)
    q, k, v = rng.normal(size=(2, 3, 4)), rng.normal(size=(2, 5, 6)), rng.normal(size=(2, 5, 2))
    p = {"W1": rng.normal(size=(4, 7)), "W2": rng.normal(size=(6, 7)), "v": rng.normal(size=7),
         "b": rng.normal(size=7)}
    keep = np.array([True, True, False, True, True])
    r = compute("additive", q, k, v, learned=p, keep=keep)
    w, o = bahdanau(q, k, v, p["W1"], p["W2"], p["v"], p["b"], keep)
    np.testing.assert_allclose(r.weights, w, atol=1e-5)
    np.testing.assert_allclose(r.output, o, atol=1e-5)


def test_bahdanau_normalize():
    rng = np.random.default_rng(4)
    q, k, v = rng.normal(size=(3, 4)), rng.normal(size=(5, 4)), rng.normal(size=(5, 2))
    p = {"W1": rng.normal(size=(4, 3)), "W2": rng.normal(size=(4, 3)), "v": rng.normal(size=3), "g": np.array(2.0)}
    r = compute("additive", q, k, v, learned=p, normalize=True)
    w, _ = bahdanau(q, k, v, p["W1"], p["W2"], 2.0 * p["v"] / np.linalg.norm(p["v"]))
    np.testing.assert_allclose(r.weights, w, atol=1e-5)
    seeded = compute("additive", q, k, v, normalize=True, units=3)
    assert seeded.params["normalize"]


def test_luong_concat_is_bahdanau_with_stacked_matrix():
    # reference: concat tanh([q; k] W_a) v_a equals bahdanau with W_a = vstack([W1, W2])
    rng = np.random.default_rng(5)
    q, k, v = rng.normal(size=(2, 3)), rng.normal(size=(4, 3)), rng.normal(size=(4, 2))
    w_a, v_a = rng.normal(size=(6, 5)), rng.normal(size=5)
    concat = np.array([[np.tanh(np.concatenate([qi, kj]) @ w_a) @ v_a for kj in k] for qi in q])
    expected = np.exp(concat) / np.exp(concat).sum(-1, keepdims=True)
    r = compute("additive", q, k, v, learned={"W1": w_a[:3], "W2": w_a[3:], "v": v_a})
    np.testing.assert_allclose(r.weights, expected, atol=1e-6)


# ---- the Keras layers, with the reference's examples and with the layers themselves ----

CQ = np.array([[1.0, 0], [0, 1]])
CK = np.array([[0.5, 0.5], [1, -1], [0, 0]])
CV = np.array([[1.0, 0], [0, 1], [1, 1]])


def test_keras_concat_reference_examples():
    r = compute("additive", CQ, CK, CV, style="keras-concat", learned={"concat_score_weight": np.array(1.0)})
    np.testing.assert_allclose(r.weights, [[0.538305, 0.167938, 0.293757], [0.478145, 0.260927, 0.260927]],
                               atol=1e-6)
    np.testing.assert_allclose(r.output, [[0.832062, 0.461695], [0.739072, 0.521855]], atol=1e-6)
    r = compute("additive", CQ, CK, CV, style="keras-concat",
                learned={"scale": np.array(2.0), "concat_score_weight": np.array(0.5)})
    np.testing.assert_allclose(r.weights, [[0.477173, 0.201786, 0.321041], [0.426331, 0.286835, 0.286835]],
                               atol=1e-6)


def test_keras_additive_reference_example():
    r = compute("additive", CQ, CK, CV, style="keras", learned={"scale": np.array([1.0, -1.0])})
    np.testing.assert_allclose(r.weights, [[0.167193, 0.602892, 0.229915], [0.197523, 0.658840, 0.143637]],
                               atol=1e-6)
    np.testing.assert_allclose(r.output, [[0.397108, 0.832807], [0.341160, 0.802477]], atol=1e-6)


def _keras_weights(layer):
    return {w.path.split("/", 1)[1]: np.asarray(w.numpy()) for w in layer.weights}


@pytest.mark.parametrize("layer_kind", ["AdditiveAttention", "Attention-concat", "Attention-concat-scale"])
def test_parity_with_keras_layers(layer_kind):
    import keras

    rng = np.random.default_rng(6)
    q = rng.normal(size=(2, 4, 3)).astype(np.float32)
    k = rng.normal(size=(2, 5, 3)).astype(np.float32)
    v = rng.normal(size=(2, 5, 2)).astype(np.float32)
    value_mask = np.ones((2, 5), bool)
    value_mask[1, 3:] = False
    if layer_kind == "AdditiveAttention":
        layer, style = keras.layers.AdditiveAttention(use_scale=True), "keras"
    else:
        layer = keras.layers.Attention(score_mode="concat", use_scale=layer_kind.endswith("scale"))
        style = "keras-concat"
    layer([q, v, k])  # build
    for w in layer.weights:  # move away from the initial values, so that a mix-up would show
        w.assign(rng.normal(size=w.shape).astype(np.float32))
    out, scores = layer([q, v, k], mask=[None, value_mask], return_attention_scores=True)
    learned = _keras_weights(layer)
    r = compute("additive", q, k, v, style=style, learned=learned, keep=value_mask[:, None, :])
    np.testing.assert_allclose(r.weights, np.asarray(scores), atol=1e-5)
    np.testing.assert_allclose(r.output, np.asarray(out), atol=1e-5)


def test_bad_parameters_are_named():
    good = {"W1": np.eye(2), "W2": np.eye(2), "v": np.ones(2)}
    with pytest.raises(ParamsError, match="missing key 'v', expected shape \\[2\\]"):
        compute("additive", Q1, KEYS, KEYS, learned={"W1": np.eye(2), "W2": np.eye(2)})
    with pytest.raises(ParamsError, match="unexpected key\\(s\\) extra"):
        compute("additive", Q1, KEYS, KEYS, learned={**good, "extra": np.ones(1)})
    with pytest.raises(ParamsError, match="key 'W2' has shape \\[3, 2\\], expected \\[2, 2\\]"):
        compute("additive", Q1, KEYS, KEYS, learned={**good, "W2": np.ones((3, 2))})
    with pytest.raises(ParamsError, match=r"W1 \[2, 2\] has units = 2, but --units 5 was given"):
        compute("additive", Q1, KEYS, KEYS, learned=good, units=5)
    with pytest.raises(ParamsError, match="key 'W_a' has shape"):
        compute("general", Q1, KEYS, KEYS, learned={"W_a": np.eye(3)})

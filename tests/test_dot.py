"""`dot`: Luong's dot score without scaling, the same numbers as keras.layers.Attention(score_mode="dot").

The Keras layer is the reference here because it is what users of `dot` attention in Keras have; it
is called as layer([query, value, key]) (its input order), with no scale weight (use_scale=False).
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.conftest import compute
from tests.oracle import sdpa
from tests.test_scaled import REF_K, REF_Q, REF_V


def keras_dot(q, k, v, value_mask=None, causal=False):
    import keras

    layer = keras.layers.Attention(score_mode="dot", use_scale=False)
    mask = None if value_mask is None else [None, value_mask]
    out, scores = layer([q, v, k], mask=mask, return_attention_scores=True, use_causal_mask=causal)
    return np.asarray(scores), np.asarray(out)


def test_reference_dot_example():
    # reference section 2.3: the section 1 data with no scaling, verified there against Keras 3.15.1
    r = compute("dot", REF_Q, REF_K, REF_V)
    np.testing.assert_allclose(r.weights, [[0.468311, 0.063379, 0.468311], [0.063379, 0.468311, 0.468311]],
                               atol=1e-6)
    np.testing.assert_allclose(r.output, [[0.936621, 0.531689], [0.531689, 0.936621]], atol=1e-6)
    assert r.params["scale"] == 1.0


def test_reference_luong_dot_example():
    # reference section 2.2: q = [1, 2], keys = values = [[1, 0], [0, 1], [1, 1]]
    keys = np.array([[1.0, 0], [0, 1], [1, 1]])
    r = compute("dot", np.array([[1.0, 2.0]]), keys, keys)
    np.testing.assert_allclose(r.weights, [[0.090031, 0.244728, 0.665241]], atol=1e-6)
    np.testing.assert_allclose(r.output, [[0.755272, 0.909969]], atol=1e-6)


def test_dot_equals_scaled_with_scale_one():
    rng = np.random.default_rng(5)
    q, k, v = rng.normal(size=(2, 4, 3)), rng.normal(size=(2, 5, 3)), rng.normal(size=(2, 5, 2))
    np.testing.assert_allclose(compute("dot", q, k, v).weights, compute("scaled", q, k, v, scale=1.0).weights,
                               atol=1e-7)


@pytest.mark.parametrize("case", ["plain", "value-mask", "causal"])
def test_parity_with_keras_attention_dot(case):
    rng = np.random.default_rng(11)
    q = rng.normal(size=(3, 5, 4)).astype(np.float32)
    k = rng.normal(size=(3, 6, 4)).astype(np.float32)
    v = rng.normal(size=(3, 6, 2)).astype(np.float32)
    value_mask = None
    keep = None
    if case == "value-mask":
        value_mask = np.ones((3, 6), bool)
        value_mask[0, 4:] = False
        value_mask[2, 0] = False
        keep = value_mask[:, None, :]
    kw, ko = keras_dot(q, k, v, value_mask=value_mask, causal=case == "causal")
    r = compute("dot", q, k, v, keep=keep, causal=case == "causal")
    np.testing.assert_allclose(r.weights, kw, atol=1e-5)
    np.testing.assert_allclose(r.output, ko, atol=1e-5)
    w, o = sdpa(q, k, v, scale=1.0, keep=keep if case != "causal" else np.tril(np.ones((5, 6), bool)))
    np.testing.assert_allclose(r.weights, w, atol=1e-5)


def test_fully_masked_row_differs_from_keras_on_purpose():
    # Keras's -1e9 bias makes a fully masked row uniform; attnviz gives zeros (reference section 0.3)
    q, k, v = REF_Q[None], REF_K[None], REF_V[None]
    mask = np.zeros((1, 3), bool)
    kw, _ = keras_dot(q, k, v, value_mask=mask)
    np.testing.assert_allclose(kw[0], np.full((2, 3), 1 / 3), atol=1e-6)
    r = compute("dot", q, k, v, keep=mask[:, None, :])
    assert (r.weights == 0).all() and (r.output == 0).all()

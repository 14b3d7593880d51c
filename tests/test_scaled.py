"""`scaled`: the seed note's worked example, the reference spec's section 1 examples, a NumPy oracle
over random shapes and dtypes, and properties that hold for every input."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from attnviz.masks import causal_keep
from tests.conftest import compute
from tests.oracle import sdpa

# The seed note 002 (TensorFlow Transformer tutorial): temp_k, temp_v and the three-row temp_q.
SEED_K = np.array([[10, 0, 0], [0, 10, 0], [0, 0, 10], [0, 0, 10]], dtype=np.float32)
SEED_V = np.array([[1, 0], [10, 0], [100, 5], [1000, 6]], dtype=np.float32)
SEED_Q = np.array([[0, 0, 10], [0, 10, 0], [10, 10, 0]], dtype=np.float32)

# Reference section 1 (d_k = 4, scale 1/2).
REF_Q = np.array([[1, 0, 1, 0], [0, 2, 0, 0]], dtype=np.float32)
REF_K = np.array([[1, 0, 1, 0], [0, 1, 0, 1], [1, 1, 1, 1]], dtype=np.float32)
REF_V = np.array([[1, 0], [0, 1], [1, 1]], dtype=np.float32)


def test_seed_note_worked_example():
    r = compute("scaled", SEED_Q, SEED_K, SEED_V)
    np.testing.assert_allclose(r.weights, [[0, 0, 0.5, 0.5], [0, 1, 0, 0], [0.5, 0.5, 0, 0]], atol=1e-6)
    np.testing.assert_allclose(r.output, [[550, 5.5], [10, 0], [5.5, 0]], rtol=1e-6, atol=1e-4)
    assert r.params["scale"] == pytest.approx(1 / np.sqrt(3))


@pytest.mark.parametrize("row, weights, output", [
    (0, [0, 0, 0.5, 0.5], [550, 5.5]),
    (1, [0, 1, 0, 0], [10, 0]),
    (2, [0.5, 0.5, 0, 0], [5.5, 0]),
])
def test_seed_note_single_queries(row, weights, output):
    r = compute("scaled", SEED_Q[row:row + 1], SEED_K, SEED_V)
    np.testing.assert_allclose(r.weights[0], weights, atol=1e-6)
    np.testing.assert_allclose(r.output[0], output, rtol=1e-6, atol=1e-4)


def test_reference_plain():
    r = compute("scaled", REF_Q, REF_K, REF_V)
    np.testing.assert_allclose(r.weights, [[0.422319, 0.155362, 0.422319], [0.155362, 0.422319, 0.422319]],
                               atol=1e-6)
    np.testing.assert_allclose(r.output, [[0.844638, 0.577681], [0.577681, 0.844638]], atol=1e-6)


def test_reference_padding():
    r = compute("scaled", REF_Q, REF_K, REF_V, keep=np.array([True, True, False]))
    np.testing.assert_allclose(r.weights, [[0.731059, 0.268941, 0], [0.268941, 0.731059, 0]], atol=1e-6)
    np.testing.assert_allclose(r.output, [[0.731059, 0.268941], [0.268941, 0.731059]], atol=1e-6)
    assert r.weights[0, 2] == 0.0 and r.weights[1, 2] == 0.0  # exactly zero, not tiny


def test_reference_causal_self_attention():
    r = compute("scaled", REF_K, REF_K, REF_V, causal=True)
    np.testing.assert_allclose(
        r.weights, [[1, 0, 0], [0.268941, 0.731059, 0], [0.211942, 0.211942, 0.576117]], atol=1e-6)
    np.testing.assert_allclose(r.output, [[1, 0], [0.268941, 0.731059], [0.788058, 0.788058]], atol=1e-6)


def test_reference_fully_masked_row_is_zero_not_nan_or_uniform():
    keep = np.array([[True, True, True], [False, False, False]])
    r = compute("scaled", REF_Q, REF_K, REF_V, keep=keep)
    np.testing.assert_array_equal(r.weights[1], [0, 0, 0])
    np.testing.assert_array_equal(r.output[1], [0, 0])
    np.testing.assert_allclose(r.weights[0], [0.422319, 0.155362, 0.422319], atol=1e-6)


def test_reference_additive_bias():
    # reference section 0.2: scores [1, 0, 1] plus bias [0, -1, -inf] give [0.880797, 0.119203, 0]
    q = np.array([[1.0]])
    k = np.array([[1.0], [0.0], [1.0]])
    bias = np.array([0.0, -1.0, 0.0])
    r = compute("scaled", q, k, np.eye(3), scale=1.0, keep=np.array([True, True, False]), bias=bias)
    np.testing.assert_allclose(r.weights, [[0.880797, 0.119203, 0]], atol=1e-6)


@pytest.mark.parametrize("align, expected", [
    ("top-left", [[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [1, 1, 1, 0, 0]]),
    ("bottom-right", [[1, 1, 1, 0, 0], [1, 1, 1, 1, 0], [1, 1, 1, 1, 1]]),
])
def test_causal_alignment_reference_example(align, expected):
    np.testing.assert_array_equal(causal_keep(3, 5, align), np.array(expected, bool))
    rng = np.random.default_rng(0)
    r = compute("scaled", rng.normal(size=(3, 4)), rng.normal(size=(5, 4)), rng.normal(size=(5, 2)),
                causal=True, causal_align=align)
    assert ((r.weights > 0) == np.array(expected, bool)).all()


def test_scale_override_is_a_temperature():
    rng = np.random.default_rng(1)
    q, k, v = rng.normal(size=(4, 8)), rng.normal(size=(6, 8)), rng.normal(size=(6, 3))
    r = compute("scaled", q, k, v, scale=0.25)
    w, o = sdpa(q, k, v, scale=0.25)
    np.testing.assert_allclose(r.weights, w, atol=1e-5)
    np.testing.assert_allclose(r.output, o, atol=1e-5)


SHAPES = [
    # (q shape, k shape, v shape): batch and head dimensions, broadcasting among them
    ((5, 4), (7, 4), (7, 3)),
    ((2, 5, 4), (2, 7, 4), (2, 7, 3)),
    ((2, 3, 5, 8), (2, 3, 6, 8), (2, 3, 6, 2)),
    ((2, 3, 5, 8), (1, 3, 6, 8), (2, 1, 6, 2)),  # broadcast over batch and heads
    ((3, 1, 4), (2, 4), (2, 5)),  # K and V shared by every batch entry
]
TOLERANCE = {"float64": 1e-10, "float32": 2e-6, "float16": 3e-3, "bfloat16": 2e-2}


@pytest.mark.parametrize("dtype", list(TOLERANCE))
@pytest.mark.parametrize("shapes", SHAPES, ids=lambda s: "x".join(map(str, s[0])))
def test_matches_numpy_oracle(shapes, dtype):
    rng = np.random.default_rng(42)
    q, k, v = (rng.normal(size=s) for s in shapes)
    r = compute("scaled", q, k, v, dtype=dtype)
    w, o = sdpa(q, k, v)
    tol = TOLERANCE[dtype]
    np.testing.assert_allclose(r.weights, w, atol=tol, rtol=tol)
    np.testing.assert_allclose(r.output, o, atol=4 * tol, rtol=4 * tol)
    assert r.weights.dtype == (np.float64 if dtype == "float64" else np.float32)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_oracle_with_mask_and_batch(dtype):
    rng = np.random.default_rng(3)
    q, k, v = rng.normal(size=(2, 2, 5, 4)), rng.normal(size=(2, 2, 6, 4)), rng.normal(size=(2, 2, 6, 3))
    keep = rng.random((2, 1, 5, 6)) > 0.4
    keep[0, 0, 2] = False  # one fully masked row
    r = compute("scaled", q, k, v, keep=keep, dtype=dtype)
    w, o = sdpa(q, k, v, keep=keep)
    tol = TOLERANCE[dtype]
    np.testing.assert_allclose(r.weights, w, atol=tol)
    np.testing.assert_allclose(r.output, o, atol=5 * tol)
    assert (r.weights[np.broadcast_to(~keep, r.weights.shape)] == 0).all()


def test_float16_large_scores_upcast_not_nan():
    # scores up to 65504 / sqrt(d) would overflow exp in float16; the softmax runs in float32
    q = np.full((2, 4), 100.0)
    k = np.array([[1.0, 1, 1, 1], [2, 2, 2, 2], [0, 0, 0, 0]]) * 3
    r = compute("scaled", q, k, np.eye(3), dtype="float16")
    assert np.isfinite(r.weights).all()
    np.testing.assert_allclose(r.weights.sum(-1), 1.0, atol=1e-3)


# ---- properties -----------------------------------------------------------------------------------

dims = st.integers(1, 6)
finite = st.floats(-3, 3, allow_nan=False, width=32)


@st.composite
def qkv_and_mask(draw):
    lq, lk, d, dv = draw(dims), draw(dims), draw(dims), draw(dims)
    q = draw(hnp.arrays(np.float32, (lq, d), elements=finite))
    k = draw(hnp.arrays(np.float32, (lk, d), elements=finite))
    v = draw(hnp.arrays(np.float32, (lk, dv), elements=finite))
    keep = draw(hnp.arrays(np.bool_, (lq, lk)))
    return q, k, v, keep


@settings(max_examples=40, deadline=None)
@given(qkv_and_mask())
def test_rows_are_distributions_and_masked_positions_exactly_zero(case):
    q, k, v, keep = case
    r = compute("scaled", q, k, v, keep=keep)
    assert np.isfinite(r.weights).all() and (r.weights >= 0).all()
    assert (r.weights[~keep] == 0).all()
    sums = r.weights.sum(-1)
    has_key = keep.any(-1)
    np.testing.assert_allclose(sums[has_key], 1.0, atol=1e-5)
    assert (sums[~has_key] == 0).all() and (r.output[~has_key] == 0).all()
    w, o = sdpa(q, k, v, keep=keep)
    np.testing.assert_allclose(r.weights, w, atol=1e-5)


@settings(max_examples=25, deadline=None)
@given(qkv_and_mask(), st.randoms(use_true_random=False))
def test_permuting_keys_permutes_weights(case, rnd):
    q, k, v, keep = case
    perm = list(range(k.shape[0]))
    rnd.shuffle(perm)
    a = compute("scaled", q, k, v, keep=keep)
    b = compute("scaled", q, k[perm], v[perm], keep=keep[:, perm])
    np.testing.assert_allclose(b.weights, a.weights[:, perm], atol=1e-6)
    np.testing.assert_allclose(b.output, a.output, atol=1e-5)


def test_each_variant_is_made_of_its_own_module():
    """``variant(__name__, ...)`` reads the docstring, ``Params``, ``check`` and ``compute`` off the module
    that calls it; ``qkv_variant``'s variants, and only they, take the inputs q, k, v as hooks capture them."""
    import importlib

    from attnviz.variants import REGISTRY
    from attnviz.variants.base import QKV

    for v in REGISTRY.values():
        module = importlib.import_module(v.compute.__module__)
        assert module.VARIANT is v
        assert (v.doc, v.params, v.check) == (module.__doc__, module.Params, module.check)
        assert v.captured_qkv == (v.inputs == QKV)
    assert sum(v.inputs == QKV for v in REGISTRY.values()) == 7

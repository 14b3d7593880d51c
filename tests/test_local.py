"""`local`: the reference's local-m / local-p example, every window style's mask from the reference,
zero weight outside the window, and bad windows refused."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from attnviz.errors import UsageError
from tests.conftest import compute
from tests.oracle import local_p, sdpa

HBAR = np.array([[1.0, 0], [0, 1], [1, 1], [2, 0], [0, 2]])
H_T = np.array([[1.0, 1]])


def test_reference_local_m():
    # t = 3 (1-based) is query row 2: three identical queries so that row 2 exists
    q = np.repeat(H_T, 3, axis=0)
    r = compute("local", q, HBAR, HBAR, mode="local-m", window=1, score="dot")
    np.testing.assert_allclose(r.weights[2], [0, 0.155362, 0.422319, 0.422319, 0], atol=1e-6)
    np.testing.assert_allclose(r.output[2], [1.266956, 0.577681], atol=1e-6)


def test_reference_local_p():
    learned = {"W_p": np.array([[0.5], [0.5]]), "v_p": np.array([1.0])}
    r = compute("local", H_T, HBAR, HBAR, mode="local-p", window=1, score="dot", learned=learned)
    np.testing.assert_allclose(r.maps["positions"], [3.408499], atol=1e-6)
    np.testing.assert_allclose(r.weights, [[0, 0, 0.358119, 0.248355, 0]], atol=1e-6)
    np.testing.assert_allclose(r.output, [[0.854830, 0.358119]], atol=1e-6)
    assert r.keep.tolist() == [[False, False, True, True, False]]
    n = compute("local", H_T, HBAR, HBAR, mode="local-p", window=1, score="dot", learned=learned, renormalize=True)
    np.testing.assert_allclose(n.weights, [[0, 0, 0.590493, 0.409507, 0]], atol=1e-6)


def test_local_p_oracle():
    rng = np.random.default_rng(0)
    q, k, v = rng.normal(size=(6, 4)), rng.normal(size=(9, 4)), rng.normal(size=(9, 3))
    p = {"W_p": rng.normal(size=(4, 5)), "v_p": rng.normal(size=5)}
    r = compute("local", q, k, v, mode="local-p", window=2, learned=p)
    w, o = local_p(q, k, v, p["W_p"], p["v_p"], 2, score="scaled")
    np.testing.assert_allclose(r.weights, w, atol=1e-6)
    np.testing.assert_allclose(r.output, o, atol=1e-5)


N6 = {
    ("cyberzhg", 2): [[1, 0, 0, 0, 0, 0], [1, 1, 0, 0, 0, 0], [0, 1, 1, 0, 0, 0], [0, 0, 1, 1, 0, 0],
                      [0, 0, 0, 1, 1, 0], [0, 0, 0, 0, 1, 1]],
    ("cyberzhg", 4): [[1, 1, 0, 0, 0, 0], [1, 1, 1, 0, 0, 0], [1, 1, 1, 1, 0, 0], [0, 1, 1, 1, 1, 0],
                      [0, 0, 1, 1, 1, 1], [0, 0, 0, 1, 1, 1]],
    ("cyberzhg-history", 3): [[1, 0, 0, 0, 0, 0], [1, 1, 0, 0, 0, 0], [1, 1, 1, 0, 0, 0], [0, 1, 1, 1, 0, 0],
                              [0, 0, 1, 1, 1, 0], [0, 0, 0, 1, 1, 1]],
    ("symmetric", 1): [[1, 1, 0, 0, 0, 0], [1, 1, 1, 0, 0, 0], [0, 1, 1, 1, 0, 0], [0, 0, 1, 1, 1, 0],
                       [0, 0, 0, 1, 1, 1], [0, 0, 0, 0, 1, 1]],  # = Longformer attention_window 2
}


@pytest.mark.parametrize("style, width", list(N6))
def test_reference_window_masks_with_equal_scores(style, width):
    x = np.ones((6, 2))
    r = compute("local", x, x, np.eye(6), window=width, window_style=style)
    expected = np.array(N6[(style, width)], bool)
    assert ((r.weights > 0) == expected).all()
    np.testing.assert_allclose(r.weights[expected], (1 / expected.sum(1, keepdims=True) * expected)[expected])


def test_band_dilation_and_global_tokens():
    x = np.ones((6, 2))
    band = compute("local", x, x, np.eye(6), window_style="band", left=2, right=0)
    assert ((band.weights > 0) == np.tril(np.triu(np.ones((6, 6)), -2))).all()
    dil = compute("local", x, x, np.eye(6), window=1, dilation=2)
    assert (dil.weights[3] > 0).tolist() == [False, True, False, True, False, True]
    glob = compute("local", x, x, np.eye(6), window=1, global_tokens="0")
    assert (glob.weights[:, 0] > 0).all() and (glob.weights[0] > 0).all()
    assert (glob.weights[5] > 0).tolist() == [True, False, False, False, True, True]


@settings(max_examples=20, deadline=None)
@given(st.integers(2, 8), st.integers(2, 8), st.integers(0, 1), st.integers(0, 10**6))
def test_window_weights_are_zero_outside_and_match_banded_sdpa(lq, lk, d, seed):
    rng = np.random.default_rng(seed)
    q, k, v = rng.normal(size=(lq, 3)), rng.normal(size=(lk, 3)), rng.normal(size=(lk, 2))
    r = compute("local", q, k, v, window=d)
    band = np.abs(np.arange(lq)[:, None] - np.arange(lk)[None, :]) <= d
    assert (r.weights[~band] == 0).all()
    w, o = sdpa(q, k, v, keep=band)
    np.testing.assert_allclose(r.weights, w, atol=1e-6)
    np.testing.assert_allclose(r.output, o, atol=1e-5)


@pytest.mark.parametrize("kwargs, match", [
    ({"window": 5}, "larger than the sequence"),
    ({}, "give --window"),
    ({"window": -1}, "must be at least 0"),
    ({"window_style": "band", "left": 1}, "--left A and --right B"),
    ({"window": 1, "global_tokens": "9"}, "outside"),
    ({"window": 1, "renormalize": True}, "belong to --mode local-p"),
    ({"mode": "local-p", "window": 0}, "at least 1"),
])
def test_bad_windows(kwargs, match):
    x = np.ones((5, 2))
    with pytest.raises(UsageError, match=match):
        compute("local", x, x, x, **kwargs)

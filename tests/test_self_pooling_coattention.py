"""`self`, `pooling` and `coattention`: the reference spec's worked examples (the SeqSelfAttention and
SeqWeightedAttention ones were verified there against keras-self-attention 0.51), NumPy oracles,
and the CLI showing every map."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from attnviz.cli import app
from attnviz.errors import ParamsError
from tests.conftest import compute
from tests.oracle import masked_softmax, sdpa

runner = CliRunner()
X = np.array([[1.0, 0], [0, 1], [1, 1]])


def self_run(**kw):
    return compute("self", inputs={"x": kw.pop("x", X)}, **kw)


# ---- self ----

SELF_PARAMS = {"W_Q": np.eye(2), "W_K": np.array([[1.0, 1], [0, 1]]), "W_V": np.array([[1.0, 0], [0, 2]])}


def test_self_reference_example_and_causal():
    r = self_run(learned=SELF_PARAMS)
    np.testing.assert_allclose(r.weights, [[0.401112, 0.197776, 0.401112], [0.248255, 0.248255, 0.503490],
                                           [0.283995, 0.140029, 0.575975]], atol=1e-6)
    np.testing.assert_allclose(r.output, [[0.802224, 1.197776], [0.751745, 1.503490], [0.859971, 1.432009]],
                               atol=1e-6)
    c = self_run(learned=SELF_PARAMS, causal=True)
    np.testing.assert_allclose(c.weights, [[1, 0, 0], [0.5, 0.5, 0], [0.283995, 0.140029, 0.575975]], atol=1e-6)


def test_self_packed_kernel_and_biases_match_projections():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(2, 5, 4))
    kernel = rng.normal(size=(3, 4, 3))
    r = self_run(x=x, learned={"kernel": kernel})
    w, o = sdpa(x @ kernel[0], x @ kernel[1], x @ kernel[2])
    np.testing.assert_allclose(r.weights, w, atol=1e-5)
    np.testing.assert_allclose(r.output, o, atol=1e-5)
    p = {"W_Q": kernel[0], "W_K": kernel[1], "W_V": kernel[2], "b_Q": np.ones(3), "b_V": -np.ones(3)}
    r = self_run(x=x, learned=p)
    w, o = sdpa(x @ kernel[0] + 1, x @ kernel[1], x @ kernel[2] - 1)
    np.testing.assert_allclose(r.weights, w, atol=1e-5)
    np.testing.assert_allclose(r.output, o, atol=1e-5)
    with pytest.raises(ParamsError, match="packed 'kernel' is \\[3, d, d_out\\]"):
        self_run(x=x, learned={"kernel": kernel[:2]})


def test_seq_self_attention_additive_reference():
    p = {"Wt": np.eye(2), "Wx": np.array([[1.0, 1], [0, -1]]), "bh": np.array([0, 0.5]),
         "Wa": np.array([[1.0], [2.0]]), "ba": np.array([0.1])}
    r = self_run(learned=p, score="additive")
    np.testing.assert_allclose(r.weights, [[0.682453, 0.036188, 0.281359], [0.496720, 0.081242, 0.422038],
                                           [0.468221, 0.133956, 0.397823]], atol=1e-6)
    np.testing.assert_allclose(r.output, [[0.963812, 0.317547], [0.918758, 0.503280], [0.866044, 0.531779]],
                               atol=1e-6)
    assert r.params["units"] == 2


def test_seq_self_attention_multiplicative_reference():
    r = self_run(learned={"Wa": np.array([[1.0, 2], [0, 1]]), "ba": np.array([0.3])}, score="multiplicative")
    np.testing.assert_allclose(r.weights, [[0.090031, 0.244728, 0.665241], [0.155362, 0.422319, 0.422319],
                                           [0.035119, 0.259496, 0.705385]], atol=1e-6)


@pytest.mark.parametrize("width, history, expected", [
    (3, False, [[1, 1, 0, 0, 0], [1, 1, 1, 0, 0], [0, 1, 1, 1, 0], [0, 0, 1, 1, 1], [0, 0, 0, 1, 1]]),
    (2, True, [[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [0, 1, 1, 0, 0], [0, 0, 1, 1, 0], [0, 0, 0, 1, 1]]),
    (None, True, np.tril(np.ones((5, 5))).tolist()),
])
def test_seq_self_attention_window(width, history, expected):
    rng = np.random.default_rng(1)
    r = self_run(x=rng.normal(size=(5, 3)), score="multiplicative", width=width, history_only=history)
    assert ((r.weights > 0) == np.array(expected, bool)).all()
    np.testing.assert_allclose(r.weights.sum(-1), 1, atol=1e-6)


# ---- pooling ----

def test_pooling_reference_examples():
    r = compute("pooling", inputs={"h": X}, learned={"W": np.array([[1.0], [2.0]]), "v": np.array([1.0])})
    np.testing.assert_allclose(r.weights, [[0.286751, 0.351092, 0.362156]], atol=1e-6)
    np.testing.assert_allclose(r.output, [[0.648908, 0.713249]], atol=1e-6)
    assert r.params["max_weight_ratio"] == pytest.approx(np.e ** 2)
    r = compute("pooling", inputs={"h": X}, learned={"W": np.eye(2), "v": np.array([1.0, 2.0])})
    np.testing.assert_allclose(r.weights, [[0.129391, 0.277115, 0.593494]], atol=1e-6)
    np.testing.assert_allclose(r.output, [[0.722885, 0.870609]], atol=1e-6)
    r = compute("pooling", inputs={"h": X}, learned={"W": np.array([[1.0], [2.0]])}, no_tanh=True)
    np.testing.assert_allclose(r.weights, [[0.090031, 0.244728, 0.665241]], atol=1e-6)
    np.testing.assert_allclose(r.output, [[0.755271, 0.909969]], atol=1e-6)


def test_pooling_oracle_with_padding():
    rng = np.random.default_rng(2)
    h = rng.normal(size=(3, 6, 4))
    p = {"W": rng.normal(size=(4, 5)), "b": rng.normal(size=5), "v": rng.normal(size=5)}
    keep = np.ones((3, 1, 6), bool)
    keep[1, 0, 4:] = False
    r = compute("pooling", inputs={"h": h}, learned=p, keep=keep)
    e = np.tanh(h @ p["W"] + p["b"]) @ p["v"]
    w = masked_softmax(e[:, None, :], keep)
    np.testing.assert_allclose(r.weights, w, atol=1e-6)
    np.testing.assert_allclose(r.output, w @ h, atol=1e-6)
    assert r.weights.shape == (3, 1, 6) and r.output.shape == (3, 1, 4)


# ---- coattention ----

A = np.array([[1.0, 0, 1, 0], [0, 2, 0, 0]])
B = np.array([[1.0, 0, 1, 0], [0, 1, 0, 1], [1, 1, 1, 1]])


def test_coattention_reference_example():
    r = compute("coattention", inputs={"a": A, "b": B, "va": np.eye(2)})
    np.testing.assert_allclose(r.weights, [[0.422319, 0.155362, 0.422319], [0.155362, 0.422319, 0.422319]],
                               atol=1e-6)
    np.testing.assert_allclose(r.maps["b_to_a"], [[0.731059, 0.268941, 0.5], [0.268941, 0.731059, 0.5]], atol=1e-6)
    np.testing.assert_allclose(r.maps["received_by_b"], [0.577681, 0.577681, 0.844638], atol=1e-6)
    np.testing.assert_allclose(r.maps["received_by_a"], [1.5, 1.5], atol=1e-6)
    np.testing.assert_allclose(r.maps["output_b"], [[0.731059, 0.268941], [0.268941, 0.731059], [0.5, 0.5]],
                               atol=1e-6)
    np.testing.assert_allclose(r.maps["affinity"], [[1, 0, 1], [0, 1, 1]], atol=1e-6)


def test_coattention_oracle_with_mask_and_dcn():
    rng = np.random.default_rng(3)
    a, b = rng.normal(size=(2, 4, 3)), rng.normal(size=(2, 5, 3))
    keep = np.ones((2, 4, 5), bool)
    keep[0, :, 3:] = False  # B tokens 3, 4 of batch 0 are padding
    keep[1, 2, :] = False  # A token 2 of batch 1 is padding
    r = compute("coattention", inputs={"a": a, "b": b}, keep=keep, dcn=True)
    affinity = a @ np.swapaxes(b, -1, -2) / np.sqrt(3)
    rows = masked_softmax(affinity, keep)
    cols = np.swapaxes(masked_softmax(np.swapaxes(affinity, -1, -2), np.swapaxes(keep, -1, -2)), -1, -2)
    np.testing.assert_allclose(r.weights, rows, atol=1e-6)
    np.testing.assert_allclose(r.maps["b_to_a"], cols, atol=1e-6)
    np.testing.assert_allclose(r.output, rows @ b, atol=1e-5)
    np.testing.assert_allclose(r.maps["dcn"], rows @ (np.swapaxes(cols, -1, -2) @ a), atol=1e-5)
    assert (r.maps["b_to_a"][0, :, 3:] == 0).all() and (r.weights[1, 2] == 0).all()


def test_coattention_cli_shows_both_maps_and_sums(tmp_path):
    np.save(tmp_path / "a.npy", A)
    np.save(tmp_path / "b.npy", B)
    png = tmp_path / "co.png"
    r = runner.invoke(app, ["coattention", str(tmp_path / "a.npy"), str(tmp_path / "b.npy"), "--png", str(png)])
    assert r.exit_code == 0, r.stderr
    text = " ".join(r.stdout.split())  # titles wrap over the width of narrow tables
    assert "B attends to A" in text and "receives from A" in text and "receives from B" in text
    assert "A \\ B" in text and png.stat().st_size > 5000
    doc = json.loads(runner.invoke(app, ["coattention", str(tmp_path / "a.npy"), str(tmp_path / "b.npy"),
                                         "--json"]).stdout)
    assert set(doc["maps"]) == {"b_to_a", "received_by_b", "received_by_a", "output_b", "affinity"}
    assert doc["maps"]["b_to_a"]["shape"] == [2, 3]

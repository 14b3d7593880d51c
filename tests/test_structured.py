"""`structured`: graph attention (the reference's path-graph SDPA and GAT examples, zero weight off
the adjacency) and CRF segmentation marginals (checked by enumerating every configuration)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from typer.testing import CliRunner

from attnviz.cli import app
from attnviz.errors import ShapeError, UsageError
from attnviz.variants.structured import crf_marginals
from tests.conftest import compute
from tests.oracle import masked_softmax

runner = CliRunner()
K1 = np.array([[1.0, 0, 1, 0], [0, 1, 0, 1], [1, 1, 1, 1]])
V1 = np.array([[1.0, 0], [0, 1], [1, 1]])
PATH = np.array([[1, 1, 0], [1, 1, 1], [0, 1, 1]])


@pytest.fixture
def adjacency(tmp_path):
    np.save(tmp_path / "adj.npy", PATH)
    return str(tmp_path / "adj.npy")


def test_graph_sdpa_reference(adjacency):
    r = compute("structured", inputs={"q": K1, "v": V1}, adjacency=adjacency)
    np.testing.assert_allclose(r.weights, [[0.731059, 0.268941, 0], [0.155362, 0.422319, 0.422319],
                                           [0, 0.268941, 0.731059]], atol=1e-6)
    np.testing.assert_allclose(r.output, [[0.731059, 0.268941], [0.577681, 0.844638], [0.731059, 1]], atol=1e-6)


def test_graph_gat_reference(adjacency):
    x = np.array([[1.0, 0], [0, 1], [1, 1]])
    learned = {"W": np.eye(2), "a_src": np.array([1.0, 0]), "a_dst": np.array([0, -1.0])}
    r = compute("structured", inputs={"q": x}, adjacency=adjacency, score="gat", learned=learned)
    np.testing.assert_allclose(r.weights, [[0.731059, 0.268941, 0], [0.379152, 0.310424, 0.310424],
                                           [0, 0.5, 0.5]], atol=1e-6)
    np.testing.assert_allclose(r.output, [[0.731059, 0.268941], [0.689576, 0.620848], [0.5, 1]], atol=1e-6)


def test_graph_weights_zero_off_the_adjacency_and_isolated_nodes(tmp_path):
    rng = np.random.default_rng(0)
    adj = rng.random((6, 6)) > 0.6
    adj[4] = False
    np.save(tmp_path / "a.npy", adj)
    x = rng.normal(size=(6, 3))
    r = compute("structured", inputs={"q": x}, adjacency=str(tmp_path / "a.npy"), no_self_loops=True)
    assert (r.weights[~adj] == 0).all() and (r.weights[4] == 0).all()
    np.testing.assert_allclose(r.weights, masked_softmax(x @ x.T / np.sqrt(3), adj), atol=1e-6)


def brute_force(unary, t):
    n = len(unary)
    marg, z = np.zeros(n), 0.0
    for config in itertools.product([0, 1], repeat=n):
        score = sum(unary[i] for i in range(n) if config[i]) + sum(t[config[i], config[i + 1]] for i in range(n - 1))
        z += np.exp(score)
        marg += np.exp(score) * np.array(config)
    return marg / z


def test_crf_reference_example():
    t = np.array([[0.0, 0], [0, 1]])
    np.testing.assert_allclose(crf_marginals(np.array([1.0, -1, 2]), t, np.ones(3, bool)),
                               [0.832278, 0.675973, 0.929316], atol=1e-6)
    np.testing.assert_allclose(crf_marginals(np.array([1.0, -1, 2]), np.zeros((2, 2)), np.ones(3, bool)),
                               [0.731059, 0.268941, 0.880797], atol=1e-6)  # T = 0: sigmoid attention


def test_crf_against_enumeration_with_masked_keys():
    rng = np.random.default_rng(1)
    for _ in range(5):
        unary, t = rng.normal(size=6) * 2, rng.normal(size=(2, 2))
        keep = rng.random(6) > 0.3
        got = crf_marginals(unary, t, keep)
        np.testing.assert_allclose(got[keep], brute_force(unary[keep], t), atol=1e-9)
        assert (got[~keep] == 0).all()


def test_crf_unary_file_output_and_normalize(tmp_path):
    np.save(tmp_path / "u.npy", np.array([[1.0, -1, 2]]))
    learned = {"T": np.array([[0.0, 0], [0, 1]])}
    r = compute("structured", np.ones((1, 2)), np.ones((3, 2)), V1, method="crf",
                unary=str(tmp_path / "u.npy"), learned=learned)
    np.testing.assert_allclose(r.weights, [[0.832278, 0.675973, 0.929316]], atol=1e-6)
    np.testing.assert_allclose(r.output, [[1.761594, 1.605289]], atol=1e-6)
    n = compute("structured", np.ones((1, 2)), np.ones((3, 2)), V1, method="crf",
                unary=str(tmp_path / "u.npy"), learned=learned, normalize=1.0)
    np.testing.assert_allclose(n.weights, [[0.341438, 0.277315, 0.381248]], atol=1e-6)
    np.testing.assert_allclose(n.output, [[0.722685, 0.658562]], atol=1e-6)


def test_crf_bilinear_unary():
    rng = np.random.default_rng(2)
    q, k, v = rng.normal(size=(3, 4)), rng.normal(size=(5, 2)), rng.normal(size=(5, 2))
    w, t = rng.normal(size=(2, 4)), rng.normal(size=(2, 2))
    r = compute("structured", q, k, v, method="crf", learned={"W": w, "T": t})
    for i in range(3):
        np.testing.assert_allclose(r.weights[i], brute_force(k @ w @ q[i], t), atol=1e-5)


def test_bad_inputs(tmp_path, adjacency):
    x = np.ones((3, 2))
    np.save(tmp_path / "bad.npy", np.ones((4, 4)))
    with pytest.raises(ShapeError, match=r"adjacency has shape \[4, 4\]; expected \[..., 3, 3\]"):
        compute("structured", inputs={"q": x}, adjacency=str(tmp_path / "bad.npy"))
    with pytest.raises(UsageError, match="needs --adjacency"):
        compute("structured", inputs={"q": x})
    with pytest.raises(UsageError, match="go with --method crf"):
        compute("structured", inputs={"q": x}, adjacency=adjacency, normalize=1.0)
    r = runner.invoke(app, ["structured", str(tmp_path / "bad.npy"), "--adjacency", str(tmp_path / "bad.npy"),
                            "--save-weights", str(tmp_path / "bad.npy")])
    assert r.exit_code == 2 and "refusing to overwrite" in r.stderr

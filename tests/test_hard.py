"""`hard`: the reference's argmax / sample / gumbel example, one-hot rows, reproducible draws, and
sampling frequencies that approach p."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from attnviz.cli import app
from attnviz.variants.hard import gumbel_softmax, sample_indices
from tests.conftest import compute

runner = CliRunner()
V = np.array([[1.0, 0], [0, 1], [1, 1]])
P = np.array([0.090031, 0.244728, 0.665241])
# dot scores [1, 2, 3]: q = [1], keys [1], [2], [3]
Q, K = np.array([[1.0]]), np.array([[1.0], [2.0], [3.0]])


def test_reference_argmax():
    r = compute("hard", Q, K, V, score="dot")
    np.testing.assert_allclose(r.maps["soft"], [P], atol=1e-6)
    assert r.weights.tolist() == [[0, 0, 1]]
    np.testing.assert_allclose(r.output, [[1, 1]])


@pytest.mark.parametrize("u, index", [(0.05, 0), (0.2, 1), (0.5, 2), (0.999999999, 2)])
def test_reference_inverse_cdf(u, index):
    assert sample_indices(P, np.array(u)) == index


def test_sampling_never_picks_a_zero_probability_key():
    p = np.array([0.5, 0.5, 0.0])
    assert sample_indices(p, np.array(0.9999999999999999)) == 1


def test_reference_gumbel():
    u = np.array([0.5, 0.9, 0.1])
    np.testing.assert_allclose(gumbel_softmax(P, u, 1.0), [0.047377, 0.847242, 0.105381], atol=1e-5)
    np.testing.assert_allclose(gumbel_softmax(P, u, 0.5), [0.003070, 0.981742, 0.015188], atol=1e-5)


def test_sample_rows_are_one_hot_reproducible_and_frequencies_approach_p():
    rng = np.random.default_rng(0)
    q, k, v = rng.normal(size=(2, 4, 3)), rng.normal(size=(2, 6, 3)), rng.normal(size=(2, 6, 2))
    a = compute("hard", q, k, v, mode="sample", seed=5)
    b = compute("hard", q, k, v, mode="sample", seed=5)
    np.testing.assert_array_equal(a.weights, b.weights)
    assert set(np.unique(a.weights)) <= {0.0, 1.0} and (a.weights.sum(-1) == 1).all()
    chosen = a.weights.argmax(-1)
    np.testing.assert_allclose(a.output, np.take_along_axis(v, chosen[..., None], axis=-2), atol=1e-6)
    many = compute("hard", q, k, v, mode="sample", samples=20000, seed=1)
    np.testing.assert_allclose(many.weights, many.maps["soft"], atol=0.02)


def test_masked_keys_are_never_selected_and_masked_rows_select_nothing():
    rng = np.random.default_rng(1)
    q, k, v = rng.normal(size=(4, 3)), rng.normal(size=(5, 3)), rng.normal(size=(5, 2))
    keep = np.ones((4, 5), bool)
    keep[:, 0] = False
    keep[3] = False
    for mode in ("argmax", "sample", "gumbel"):
        r = compute("hard", q, k, v, keep=keep, mode=mode, seed=2)
        assert (r.weights[:, 0] == 0).all() and (r.weights[3] == 0).all() and (r.output[3] == 0).all()


def test_gumbel_hard_is_one_hot():
    rng = np.random.default_rng(2)
    q, k, v = rng.normal(size=(4, 3)), rng.normal(size=(5, 3)), rng.normal(size=(5, 2))
    r = compute("hard", q, k, v, mode="gumbel", hard=True, tau=0.5)
    assert set(np.unique(r.weights)) <= {0.0, 1.0}


def test_cli_shows_soft_distribution_and_seed(tmp_path):
    np.save(tmp_path / "q.npy", Q)
    np.save(tmp_path / "k.npy", K)
    np.save(tmp_path / "v.npy", V)
    args = ["hard", *(str(tmp_path / f"{n}.npy") for n in "qkv"), "--score", "dot", "--mode", "sample"]
    doc = json.loads(runner.invoke(app, [*args, "--seed", "3", "--json"]).stdout)
    assert doc["params"]["seed"] == 3 and doc["maps"]["soft"]["shape"] == [1, 3]
    np.testing.assert_allclose(doc["map_stats"]["soft"]["entropy"], [-(P * np.log(P)).sum()], atol=1e-5)
    out = runner.invoke(app, args)
    assert "soft distribution" in " ".join(out.stdout.split())
    bad = runner.invoke(app, [*args, "--tau", "2"])
    assert bad.exit_code == 2 and "--mode gumbel" in bad.stderr


def test_different_seeds_draw_differently():
    rng = np.random.default_rng(4)
    q, k, v = rng.normal(size=(8, 3)), rng.normal(size=(6, 3)) * 0.1, rng.normal(size=(6, 2))
    a = compute("hard", q, k, v, mode="sample", seed=1)
    b = compute("hard", q, k, v, mode="sample", seed=2)
    assert not np.array_equal(a.weights, b.weights)

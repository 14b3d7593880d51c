"""Learned parameters across every variant that has them: --seed -> --save-params -> --params
repeats a run exactly; bad parameter files exit 1 naming the key and shapes."""

from __future__ import annotations

import json
import pickle

import numpy as np
import pytest
from typer.testing import CliRunner

from attnviz.cli import app
from attnviz.params import ParamSpec, draw, fans
from attnviz.variants import REGISTRY

runner = CliRunner()
LEARNED = [name for name, v in REGISTRY.items() if v.learned]
EXTRA = {"multihead": ["--heads", "2"], "additive": ["--units", "5"], "pooling": ["--units", "3"],
         "local": ["--window", "1", "--score", "general"], "hard": ["--score", "general", "--mode", "gumbel"],
         "sparse": ["--score", "general"], "structured": ["--method", "crf"]}


@pytest.fixture
def arrays(tmp_path):
    rng = np.random.default_rng(0)
    np.save(tmp_path / "x.npy", rng.normal(size=(2, 5, 4)).astype(np.float32))
    return tmp_path


def args_for(name, folder):
    x = str(folder / "x.npy")
    inputs = [x] * len([i for i in REGISTRY[name].inputs if not i.optional])
    return [name, *inputs, *EXTRA.get(name, [])]


def test_every_learned_variant_is_covered():
    assert set(LEARNED) >= {"general", "additive", "multihead", "self", "pooling"}


@pytest.mark.parametrize("name", LEARNED)
def test_seed_save_params_round_trip_is_exact(arrays, name):
    saved = arrays / "p.npz"
    a = runner.invoke(app, [*args_for(name, arrays), "--seed", "11", "--save-params", str(saved), "--json"])
    assert a.exit_code == 0, a.stderr
    sampling_seed = ["--seed", "11"] if REGISTRY[name].seeds_samples else []
    b = runner.invoke(app, [*args_for(name, arrays), "--params", str(saved), *sampling_seed, "--json"])
    assert b.exit_code == 0, b.stderr
    da, db = json.loads(a.stdout), json.loads(b.stdout)
    assert da["weights"] == db["weights"] and da["output"] == db["output"]
    assert da["params"] == db["params"]
    other = runner.invoke(app, [*args_for(name, arrays), "--seed", "12", "--json"])
    assert json.loads(other.stdout)["weights"] != da["weights"]  # the seed matters
    assert "parameters from seed 11" in a.stderr and f"parameters from {saved}" in b.stderr


@pytest.mark.parametrize("name", LEARNED)
def test_bad_parameter_files(arrays, name):
    saved = arrays / "p.npz"
    assert runner.invoke(app, [*args_for(name, arrays), "--save-params", str(saved), "--quiet"]).exit_code == 0
    good = dict(np.load(saved))
    key = next(iter(good))

    def attempt(params, match):
        np.savez(arrays / "bad.npz", **params)
        r = runner.invoke(app, [*args_for(name, arrays), "--params", str(arrays / "bad.npz")])
        assert r.exit_code == 1, (name, r.stdout, r.stderr)
        assert match in r.stderr and "Traceback" not in r.stderr, r.stderr
        assert r.stdout == ""

    attempt({**good, "surplus": np.ones(2)}, "unexpected key(s) surplus")
    attempt({**good, key: np.ones(good[key].shape + (2,))}, f"{key!r} has shape")
    attempt({**good, key: np.ones((1,) * (good[key].ndim + 1))}, key)
    attempt({k: v for k, v in good.items() if k != key}, f"missing key {key!r}")
    attempt({**good, key: np.array([{"x": 1}], dtype=object)}, "never unpickles")
    attempt({**good, key: np.full(good[key].shape, np.nan)}, "non-finite")


def test_parameter_file_usage_errors(arrays):
    (arrays / "p.pkl").write_bytes(pickle.dumps({"W_a": np.eye(4)}))
    base = ["general", str(arrays / "x.npy"), str(arrays / "x.npy"), str(arrays / "x.npy")]
    r = runner.invoke(app, [*base, "--params", str(arrays / "p.pkl")])
    assert r.exit_code == 2 and "a parameter file is a .npz archive" in r.stderr
    r = runner.invoke(app, [*base, "--params", str(arrays / "none.npz")])
    assert r.exit_code == 2 and "no such file" in r.stderr
    np.savez(arrays / "p.npz", W_a=np.eye(4))
    r = runner.invoke(app, [*base, "--params", str(arrays / "p.npz"), "--seed", "1"])
    assert r.exit_code == 2 and "give one" in r.stderr
    r = runner.invoke(app, [*base, "--save-params", str(arrays / "out.npy")])
    assert r.exit_code == 2 and "must end in .npz" in r.stderr
    r = runner.invoke(app, [*base, "--save-params", str(arrays / "p.npz"), "--params", str(arrays / "p.npz")])
    assert r.exit_code == 2 and "refusing to overwrite" in r.stderr


def test_glorot_draws_follow_keras_fans():
    assert fans(ParamSpec((6, 3, 4), fans=(6, 12))) == (6, 12)
    assert fans(ParamSpec((5,))) == (5, 5) and fans(ParamSpec((3, 7))) == (3, 7)
    drawn = draw({"w": ParamSpec((300, 200)), "b": ParamSpec((200,), init="zeros")}, seed=0)
    limit = np.sqrt(6 / 500)
    assert np.abs(drawn["w"]).max() <= limit and np.abs(drawn["w"]).max() > 0.95 * limit
    assert abs(drawn["w"].std() - limit / np.sqrt(3)) < 0.01 * limit
    assert (drawn["b"] == 0).all()
    again = draw({"w": ParamSpec((300, 200)), "b": ParamSpec((200,), init="zeros")}, seed=0)
    np.testing.assert_array_equal(drawn["w"], again["w"])

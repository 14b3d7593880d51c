"""`attnviz rollout` and `attnviz repeat-test` on files, as a user runs them: the JSON numbers against
the rollout written out here from the definition, padding, the picture, and usage errors."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from attnviz.cli import app

runner = CliRunner()


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args])


def softmax_causal(scores: np.ndarray) -> np.ndarray:
    length = scores.shape[-1]
    s = np.where(np.tril(np.ones((length, length), bool)), scores, -np.inf)
    e = np.exp(s - s.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def oracle(w: np.ndarray, r: float = 0.5, heads: str = "mean", start: int = 0) -> np.ndarray:
    """w [layers, heads, L, L]: R = A'_last ... A'_start, A' = rows of (1 - r) A + r I normalised."""
    result = np.eye(w.shape[-1])
    for layer in w[start:]:
        a = getattr(layer, heads)(axis=0)
        a = (1 - r) * a + r * np.eye(len(a))
        a = a / a.sum(axis=1, keepdims=True)
        result = a @ result
    return result


@pytest.fixture
def dump(tmp_path):
    rng = np.random.default_rng(5)
    w = softmax_causal(rng.normal(size=(3, 2, 4, 7, 7)) * 2)  # [layers, batch, heads, L, L]
    np.savez(tmp_path / "attn.npz", *[w[i] for i in range(3)])  # one array per layer, as HF's tuple
    return tmp_path, w


def test_json_equals_the_definition(dump):
    tmp, w = dump
    result = invoke("rollout", tmp / "attn.npz", "--json")
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)["rollout"]
    assert doc["shape"] == [2, 7, 7] and doc["layers"] == [0, 1, 2] and doc["batch"] == [0, 1]
    for b in range(2):
        np.testing.assert_allclose(doc["data"][b], oracle(w[:, b]), atol=1e-6)


@pytest.mark.parametrize("options, r, heads, start", [
    (["--residual", "0"], 0.0, "mean", 0),
    (["--heads", "max"], 0.5, "max", 0),
    (["--heads", "min", "--residual", "0.25"], 0.25, "min", 0),
    (["--start-layer", "1"], 0.5, "mean", 1),
])
def test_options_follow_the_definition(dump, options, r, heads, start):
    tmp, w = dump
    result = invoke("rollout", tmp / "attn.npz", "--batch", "1", "--json", *options)
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)["rollout"]
    assert doc["batch"] == [1] and doc["heads"] == heads and doc["start_layer"] == start
    np.testing.assert_allclose(doc["data"][0], oracle(w[:, 1], r, heads, start), atol=1e-6)


def test_all_layers_gives_every_cumulative_map(dump):
    tmp, w = dump
    doc = json.loads(invoke("rollout", tmp / "attn.npz", "--batch", "0", "--all-layers", "--json").stdout)
    cumulative = doc["rollout"]["cumulative"]
    assert cumulative["shape"] == [1, 3, 7, 7]
    for n in range(3):
        np.testing.assert_allclose(cumulative["data"][0][n], oracle(w[:n + 1, 0]), atol=1e-6)


def test_padding_is_left_out(tmp_path):
    rng = np.random.default_rng(2)
    w = softmax_causal(rng.normal(size=(2, 1, 2, 6, 6)))
    w[..., :, :2] = 0.0  # left padding: keys 0 and 1 never attended ...
    w[..., :2, :] = 1 / 6  # ... padded rows hold anything (here uniform, as Hugging Face's eager)
    real = w[..., 2:, 2:]
    w[..., 2:, 2:] = real / real.sum(axis=-1, keepdims=True)
    np.save(tmp_path / "attn.npy", w)
    np.save(tmp_path / "pad.npy", np.array([[0, 0, 1, 1, 1, 1]]))
    doc = json.loads(invoke("rollout", tmp_path / "attn.npy", "--mask", tmp_path / "pad.npy", "--json").stdout)
    got = np.array(doc["rollout"]["data"][0], dtype=object)
    assert all(v is None for v in got[:2].ravel()) and all(v is None for v in got[:, :2].ravel())
    np.testing.assert_allclose(got[2:, 2:].astype(float), oracle(w[:, 0, :, 2:, 2:]), atol=1e-6)


def test_png_and_table(dump, tmp_path):
    tmp, _ = dump
    (tmp / "tokens.txt").write_text("\n".join("a b c d e f g".split()) + "\n")
    result = invoke("rollout", tmp / "attn.npz", "--labels", tmp / "tokens.txt", "--png", tmp / "r.png")
    assert result.exit_code == 0, result.stderr
    assert "attention rollout" in result.stdout and "g" in result.stdout
    assert (tmp / "r.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    result = invoke("rollout", tmp / "attn.npz", "--all-layers", "--png", tmp / "all.png", "-q",
                    "--html", tmp / "all.html")
    assert result.exit_code == 0, result.stderr
    assert (tmp / "all.png").stat().st_size > 1000
    page = (tmp / "all.html").read_text()
    assert page.startswith("<!DOCTYPE html>") and "attention rollout" in page and "http://" not in page
    refused = invoke("rollout", tmp / "attn.npz", "--html", tmp / "r.txt")
    assert refused.exit_code == 2 and not (tmp / "r.txt").exists()


def test_errors(dump, tmp_path):
    tmp, _ = dump
    result = invoke("rollout", tmp / "attn.npz", "--start-layer", "3")
    assert result.exit_code == 2 and "--start-layer 3" in result.stderr and "3 layer" in result.stderr
    result = invoke("rollout", tmp / "attn.npz", "--residual", "1.5")
    assert result.exit_code == 2 and "--residual" in result.stderr
    np.save(tmp_path / "rect.npy", np.full((2, 1, 1, 3, 4), 0.25))
    result = invoke("rollout", tmp_path / "rect.npy")
    assert result.exit_code == 1 and "[3, 4]" in result.stderr and "Traceback" not in result.stderr


def test_repeat_test_writes_the_probe(tmp_path):
    result = invoke("repeat-test", "6", "--vocab-size", "50", "--seed", "4", "--save-ids", tmp_path / "ids.npy",
                    "--save-labels", tmp_path / "probe.txt", "--json")
    assert result.exit_code == 0, result.stderr
    ids = np.load(tmp_path / "ids.npy")
    assert ids.shape == (1, 12) and ids.dtype == np.int64
    assert (ids[0, :6] == ids[0, 6:]).all() and len(set(ids[0, :6])) == 6 and ids.max() < 50
    assert (tmp_path / "probe.txt").read_text().split() == [str(i) for i in ids[0]]
    assert json.loads(result.stdout)["ids"] == ids[0].tolist()
    again = invoke("repeat-test", "6", "--vocab-size", "50", "--seed", "4")
    assert again.stdout.split() == [str(i) for i in ids[0]]
    bad = invoke("repeat-test", "60", "--vocab-size", "50")
    assert bad.exit_code == 2 and "--vocab-size 50" in bad.stderr

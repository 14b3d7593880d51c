"""`attnviz rollout` and `attnviz repeat-test` on files, as a user runs them: the JSON numbers against
the rollout written out here from the definition, padding, the picture, and usage errors; `--method flow`
and `--method grad` (`--grads`) against the oracles of tests/test_contributions.py, and from Python."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from attnviz.cli import app
from tests.test_contributions import attentions, chefer_reference, mixed, reference_flows

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


def flow_oracle(w: np.ndarray) -> np.ndarray:
    """w [layers, heads, L, L]: the reference's flows, each row divided by its sum."""
    flows = reference_flows(mixed(w))
    return flows / flows.sum(axis=1, keepdims=True)


def test_flow_json_png_html_and_table(dump):
    tmp, w = dump
    result = invoke("rollout", tmp / "attn.npz", "--method", "flow", "--json")
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)["rollout"]
    assert doc["method"] == "flow" and doc["shape"] == [2, 7, 7] and doc["residual"] == 0.5
    for b in range(2):
        np.testing.assert_allclose(doc["data"][b], flow_oracle(w[:, b]), atol=1e-6)
    result = invoke("rollout", tmp / "attn.npz", "--method", "flow", "--batch", "1", "--all-layers",
                    "--png", tmp / "f.png", "--html", tmp / "f.html")
    assert result.exit_code == 0, result.stderr
    assert "attention flow, batch 1 [7, 7]" in result.stdout
    assert "attention flow" in result.stderr and "saved png" in result.stderr
    assert (tmp / "f.png").stat().st_size > 1000 and "attention flow" in (tmp / "f.html").read_text()


def test_flow_with_padding_and_over_an_image(tmp_path):
    rng = np.random.default_rng(12)
    w = attentions(rng, (3, 1, 2, 5, 5))
    w[..., :, 4] = 0.0  # the last token is padding: never attended ...
    w[..., :4, :4] /= w[..., :4, :4].sum(axis=-1, keepdims=True)
    np.save(tmp_path / "attn.npy", w)
    np.save(tmp_path / "pad.npy", np.array([[1, 1, 1, 1, 0]]))
    result = invoke("rollout", tmp_path / "attn.npy", "--method", "flow", "--mask", tmp_path / "pad.npy", "--json")
    assert result.exit_code == 0, result.stderr
    got = np.array(json.loads(result.stdout)["rollout"]["data"][0], dtype=object)
    assert all(v is None for v in got[4]) and all(v is None for v in got[:, 4])
    np.testing.assert_allclose(got[:4, :4].astype(float), flow_oracle(w[:, 0, :, :4, :4]), atol=1e-6)
    result = invoke("rollout", tmp_path / "attn.npy", "--method", "flow", "--patch-grid", "2x2", "--json")
    assert result.exit_code == 0, result.stderr  # CLS then 2 x 2 patches: the CLS row over them, / its max
    doc = json.loads(result.stdout)
    row = np.array(doc["rollout"]["data"][0][0][1:])
    np.testing.assert_allclose(np.array(doc["overlay"]["rollout"]).ravel(), row / row.max(), atol=1e-9)


@pytest.fixture
def grads(dump):
    tmp, w = dump
    g = np.random.default_rng(13).normal(size=w.shape)
    np.savez(tmp / "grads.npz", *[g[i] for i in range(3)])
    return tmp, w, g


def test_grad_json_equals_the_reference_per_batch_entry(grads):
    tmp, w, g = grads
    result = invoke("rollout", tmp / "attn.npz", "--method", "grad", "--grads", tmp / "grads.npz", "--json")
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)["rollout"]
    assert doc["method"] == "grad" and doc["residual"] is None and doc["discard_ratio"] is None
    assert doc["grads"]["source"].endswith("grads.npz")
    for b in range(2):
        want = chefer_reference([w[li, b:b + 1] for li in range(3)], [g[li, b:b + 1] for li in range(3)])
        np.testing.assert_allclose(doc["data"][b], want, atol=1e-6)
    result = invoke("rollout", tmp / "attn.npz", "--method", "grad", "--grads", tmp / "grads.npz", "--start-layer",
                    "1", "--png", tmp / "g.png")
    assert result.exit_code == 0, result.stderr
    assert "gradient rollout, batch 0 [7, 7] (heads mean, layers 1-2)" in result.stdout
    assert (tmp / "g.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_method_errors(grads, tmp_path):
    tmp, w, g = grads
    result = invoke("rollout", tmp / "attn.npz", "--method", "grad")  # no gradients: one line, exit 1
    assert result.exit_code == 1 and result.stderr.count("\n") == 1, result.stderr
    assert "--grads" in result.stderr and "attnviz capture --target" in result.stderr
    result = invoke("rollout", tmp / "attn.npz", "--method", "grad", "--grads", tmp / "grads.npz", "--residual", "0.2")
    assert result.exit_code == 2 and "--residual 0.2" in result.stderr and "--method grad" in result.stderr
    result = invoke("rollout", tmp / "attn.npz", "--grads", tmp / "grads.npz")
    assert result.exit_code == 2 and "--grads" in result.stderr and "--method grad" in result.stderr
    result = invoke("rollout", tmp / "attn.npz", "--method", "gradient")
    assert result.exit_code == 2 and "rollout, flow, grad" in result.stderr
    np.save(tmp_path / "short.npy", g[:2])
    result = invoke("rollout", tmp / "attn.npz", "--method", "grad", "--grads", tmp_path / "short.npy")
    assert result.exit_code == 1 and "[2, 2, 4, 7, 7]" in result.stderr and "[3, 2, 4, 7, 7]" in result.stderr
    g[1, 0, 0, 0, 0] = np.nan
    np.save(tmp_path / "nan.npy", g)
    result = invoke("rollout", tmp / "attn.npz", "--method", "grad", "--grads", tmp_path / "nan.npy")
    assert result.exit_code == 1 and "non-finite" in result.stderr and "nan.npy" in result.stderr
    result = invoke("rollout", tmp / "attn.npz", "--method", "grad", "--grads", tmp / "grads.npz", "--merge-subwords")
    assert result.exit_code == 2 and "--merge-subwords" in result.stderr
    np.save(tmp_path / "negative.npy", -np.abs(w))
    result = invoke("rollout", tmp_path / "negative.npy", "--method", "flow")
    assert result.exit_code == 1 and "non-negative" in result.stderr and "Traceback" not in result.stderr
    result = invoke("rollout", tmp / "attn.npz", "--method", "grad", "--grads", tmp / "grads.npz", "--json-file",
                    tmp / "grads.npz")
    assert result.exit_code == 2 and "input" in result.stderr  # the gradients are an input: never overwritten


def test_methods_from_python(grads):
    import attnviz

    _, w, g = grads
    flow = attnviz.rollout(w, method="flow", batch=1)
    np.testing.assert_allclose(flow.map, flow_oracle(w[:, 1]), atol=1e-6)
    assert flow.document()["rollout"]["method"] == "flow" and "attention flow" in repr(flow)
    layers = tuple(w[i] for i in range(3))  # as a model's out.attentions, and their .grad
    relevance = attnviz.rollout(layers, method="grad", grads=tuple(g[i] for i in range(3)))
    want = chefer_reference([w[li, 1:2] for li in range(3)], [g[li, 1:2] for li in range(3)])
    np.testing.assert_allclose(relevance.maps[1], want, atol=1e-6)
    with pytest.raises(attnviz.errors.InputError, match=r'attnviz\.capture\(model, target="next"\)'):
        attnviz.rollout(w, method="grad")  # in Python's words, not the command line's


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


def test_all_layers_picture_names_the_entry_layers_and_colours():
    """Issue 33, item 5: rollout --batch 1 --all-layers --png labelled its row "batch 0" and its colour bar
    "weight"; the picture names the entry shown, the layers after which each map is, and what the colours are."""
    import attnviz
    from attnviz.render.options import FigureOptions
    from attnviz.render.terminal import rollout_picture, segments_text

    rng = np.random.default_rng(2)
    w = rng.dirichlet(np.ones(5), size=(3, 2, 2, 5))
    for method in ("rollout", "flow"):
        run = attnviz.rollout(w, batch=1, all_layers=True, start_layer=1, method=method)
        fig = run.figure()
        assert [t.get_text() for t in fig.mosaic_labels.rows] == ["1"]
        assert [t.get_text() for t in fig.mosaic_labels.cols] == ["1", "2"]  # after layers 1 and 2
        bar = {ax.get_ylabel() for ax in fig.axes}
        assert f"{method}: share of each input token" in bar and "weight" not in bar
        heading = " ".join(t.get_text() for t in fig.findobj(lambda o: hasattr(o, "get_text")))
        assert "batch 1" in heading
        text = segments_text(rollout_picture(run.run, FigureOptions(), plain=True, height=40).lines(100))
        assert "share of each input token" in text


def test_rollout_help_says_what_rollout_does():
    """--batch speaks of what rollout does (the entry printed and drawn, every entry in the JSON), not head
    statistics; --method grad takes the gradients of --grads or of a capture taken with --target."""
    r = CliRunner().invoke(app, ["rollout", "--help"], env={"COLUMNS": "200"})
    assert r.exit_code == 0
    text = " ".join(r.stdout.replace("│", " ").split())
    batch = text[text.index("--batch"):text.index("--batch") + 220]
    assert "head statistics" not in batch and "rolled out" in batch, batch
    summary = text[text.index("--method grad"):text.index("--method grad") + 300]
    assert "--target" in summary and "needs --grads," not in summary, summary
    option = text.index("--method [rollout")
    assert "--target" in text[option:text.index("--grads FILE")], text[option:option + 600]
    grads = text[text.index("--grads"):text.index("--grads") + 300]
    assert "--target" in grads, grads

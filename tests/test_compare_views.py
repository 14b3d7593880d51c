"""compare as a new user meets it (issue 33, item 4): labels as inspect takes them (one list per batch entry
too), the report opened on the largest difference with its table sorted so, a picture of the maps that
differ and nothing else, and generate()'s dump against a forward pass (one side stitched alone)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

import attnviz
from attnviz.cli import app

runner = CliRunner()
SENTENCES = [["[CLS]", "the", "cat", "sat", "[SEP]"], ["[CLS]", "a", "dog", "[SEP]", "[PAD]"]]


def invoke(*args):
    result = runner.invoke(app, [str(a) for a in args])
    assert "Traceback" not in result.stderr, result.stderr
    return result


def pair():
    """A [2 layers, 2 entries, 2 heads, 5, 5] and B: the same but for layer 1, head 1 of entry 1."""
    rng = np.random.default_rng(5)
    a = rng.dirichlet(np.ones(5), size=(2, 2, 2, 5))
    b = a.copy()
    b[1, 1, 1] = np.roll(b[1, 1, 1], 1, axis=-1)
    return a, b


@pytest.fixture
def files(tmp_path):
    a, b = pair()
    np.save(tmp_path / "a.npy", a)
    np.save(tmp_path / "b.npy", b)
    (tmp_path / "rows.json").write_text(json.dumps(SENTENCES))
    return tmp_path


def test_labels_name_the_rows_tables_pictures_and_reports(files):
    r = invoke("compare", files / "a.npy", files / "b.npy", "--labels", files / "rows.json", "--batch", "1")
    assert r.exit_code == 0, r.stderr
    assert "(dog)" in r.stdout and "2 dog" in r.stdout  # the row's token, the argmax's
    assert "cat" not in r.stdout  # entry 1 holds no cat
    doc = json.loads(invoke("compare", files / "a.npy", files / "b.npy", "--labels", files / "rows.json", "--batch",
                            "1", "--json").stdout)
    assert doc["labels"]["q"] == SENTENCES[1] and doc["labels"]["per_entry"]["q"] == SENTENCES
    a, b = pair()
    result = attnviz.compare(a, b, labels=SENTENCES, batch=1)
    figure = result.figure()  # one map differs: drawn alone, with its labels
    ticks = {t.get_text() for ax in figure.axes for t in ax.get_yticklabels() + ax.get_xticklabels()}
    assert "dog" in ticks
    assert '"qLabels":["[CLS]","a","dog"' in result.html()


def test_the_report_opens_on_the_largest_difference(files):
    r = invoke("compare", files / "a.npy", files / "b.npy", "--batch", "1", "--html", files / "c.html", "--no-table")
    assert r.exit_code == 0, r.stderr
    page = (files / "c.html").read_text()
    assert '"selected":3' in page  # layer 1, head 1: the fourth map of the grid
    assert '"sort":2' in page  # the statistics table by max |A-B|, largest first
    r = invoke("compare", files / "a.npy", files / "b.npy", "--batch", "1", "--layer", "0", "--html", files / "d.html",
               "--no-table")
    assert '"selected":0' in (files / "d.html").read_text()  # --layer chooses


def test_the_picture_draws_only_maps_that_differ(tmp_path):
    a, b = pair()
    b[0, 1, 0] = np.roll(b[0, 1, 0], 2, axis=-1)  # two maps differ of four
    figure = attnviz.compare(a, b, batch=1).figure()
    heading = " ".join(t.get_text() for t in figure.findobj(lambda o: hasattr(o, "get_text")))
    assert "the 2 of 4" in heading and "the other 2 are identical" in heading, heading
    assert attnviz.compare(a, b, batch=1, atol=0.5).figure() is not None


def _generation(forward, prompt):
    """generate()'s out.attentions of a causal forward pass over ``forward [layers, 1, heads, T, T]``: step 0 the
    prompt's rows, then a row a step, each over the keys so far (the last token never fed back)."""
    torch = pytest.importorskip("torch")
    steps = []
    total = forward.shape[-1] - 1
    for s in range(total - prompt + 1):
        rows = slice(0, prompt) if s == 0 else slice(prompt + s - 1, prompt + s)
        keys = prompt + s
        steps.append(tuple(torch.tensor(forward[li][:, :, rows, :keys]) for li in range(forward.shape[0])))
    return tuple(steps)


def test_a_generation_against_a_forward_pass(tmp_path):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(1)
    scores = np.where(np.tril(np.ones((6, 6))) == 1, rng.normal(size=(2, 1, 2, 6, 6)), -np.inf)
    forward = np.exp(scores - scores.max(-1, keepdims=True))
    forward = (forward / forward.sum(-1, keepdims=True)).astype(np.float32)
    torch.save(_generation(forward, 3), tmp_path / "gen.pt")
    np.savez(tmp_path / "fwd.npz", *forward)
    r = invoke("compare", tmp_path / "gen.pt", tmp_path / "fwd.npz", "--generation-a", "--atol", "1e-6", "--json")
    assert r.exit_code == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["weights_shape"] == [2, 1, 2, 5, 5] and doc["max_abs_diff"] < 1e-6
    assert "last position" in doc["notes"][0] and "left out" in r.stderr
    r = invoke("compare", tmp_path / "fwd.npz", tmp_path / "gen.pt", "--generation-b", "--no-table")
    assert r.exit_code == 0, r.stderr
    r = invoke("compare", tmp_path / "gen.pt", tmp_path / "fwd.npz", "--generation", "--no-table")
    assert r.exit_code == 1 and "--generation-a" in r.stderr
    r = invoke("compare", tmp_path / "gen.pt", tmp_path / "fwd.npz", "--no-table")
    assert r.exit_code == 1 and "--generation-a (--generation: both)" in r.stderr
    r = invoke("compare", tmp_path / "gen.pt", tmp_path / "fwd.npz", "--generation", "--generation-a")
    assert r.exit_code == 2
    with pytest.raises(attnviz.InputError, match="generation_a=True"):
        attnviz.compare(_generation(forward, 3), list(forward), generation=True)
    assert attnviz.compare(_generation(forward, 3), list(forward), generation_a=True).passed


def test_compare_ranks_the_heads_that_changed_most(tmp_path):
    """Two steps of a training (or any two files of one shape): compare's table and JSON rank the heads by the mean
    Jensen-Shannon divergence of their rows (every batch entry), largest first, each with its mean and largest
    |A - B|, as a NumPy transcription of the definition gives them."""
    rng = np.random.default_rng(5)

    def softmax(x):
        e = np.exp(x - x.max(-1, keepdims=True))
        return e / e.sum(-1, keepdims=True)

    scores = rng.normal(size=(3, 2, 4, 6, 6))
    changed = scores.copy()
    changed[2, :, 1] += 6 * np.eye(6, k=-1)  # a previous-token head forms
    changed[0, :, 3] += 2 * rng.normal(size=(2, 6, 6))  # another moves less
    changed[1, :, 0] += 1e-3 * rng.normal(size=(2, 6, 6))
    a, b = softmax(scores), softmax(changed)
    np.save(tmp_path / "a.npy", a.astype(np.float32))
    np.save(tmp_path / "b.npy", b.astype(np.float32))
    a64, b64 = a.astype(np.float32).astype(np.float64), b.astype(np.float32).astype(np.float64)
    m = (a64 + b64) / 2
    js = 0.5 * ((a64 * np.log(a64 / m)).sum(-1) + (b64 * np.log(b64 / m)).sum(-1))  # [L, B, H, Lq]
    mean_js = js.mean(axis=(1, 3))
    order = sorted(((li, hi) for li in range(3) for hi in range(4)), key=lambda h: -mean_js[h])
    doc = json.loads(CliRunner().invoke(app, ["compare", str(tmp_path / "a.npy"), str(tmp_path / "b.npy"),
                                              "--json"]).stdout)
    ranked = doc["heads_changed"]
    assert [(h["layer"], h["head"]) for h in ranked] == order
    assert ranked[0]["layer"] == 2 and ranked[0]["head"] == 1 and ranked[1]["layer"] == 0
    for h in ranked:
        li, hi = h["layer"], h["head"]
        np.testing.assert_allclose(h["mean_js"], mean_js[li, hi], rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(h["max_js"], js[li, :, hi].max(), rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(h["mean_abs"], np.abs(a64 - b64)[li, :, hi].mean(), rtol=1e-9)
        np.testing.assert_allclose(h["max_abs"], np.abs(a64 - b64)[li, :, hi].max(), rtol=1e-9)
    text = CliRunner().invoke(app, ["compare", str(tmp_path / "a.npy"), str(tmp_path / "b.npy")],
                              env={"COLUMNS": "120"}).stdout
    assert "the 5 heads that changed most" in text
    lines = [line for line in text.splitlines() if "layer 2, head 1" in line]
    assert lines and text.index("layer 2, head 1") < text.index("layer 0, head 3", text.index("heads that changed"))

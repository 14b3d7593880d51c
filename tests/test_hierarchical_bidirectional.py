"""`hierarchical` (HAN) and `bidirectional` (BiDAF): the reference's worked examples, NumPy oracles with
padding, and the CLI showing both levels / both directions."""

from __future__ import annotations

import json

import numpy as np
from typer.testing import CliRunner

from attnviz.cli import app
from tests.conftest import compute
from tests.oracle import masked_softmax

runner = CliRunner()
DOC = np.array([[[1.0, 0], [0, 1], [2, 0]], [[0.0, 0], [1, 1], [0, 2]]])
HAN = {"W_w": np.eye(2), "u_w": np.array([1.0, 0]), "W_s": np.eye(2), "u_s": np.array([0, 1.0])}


def test_han_reference_example():
    r = compute("hierarchical", inputs={"doc": DOC}, learned=HAN)
    np.testing.assert_allclose(r.weights, [[0.371568, 0.173493, 0.454939], [0.241447, 0.517105, 0.241447]],
                               atol=1e-6)
    np.testing.assert_allclose(r.output, [[1.281447, 0.173493], [0.517105, 1.0]], atol=1e-6)
    np.testing.assert_allclose(r.maps["sentence_weights"], [0.356676, 0.643324], atol=1e-6)
    np.testing.assert_allclose(r.maps["document"], [0.789727, 0.705205], atol=1e-6)


def han_oracle(doc, p, keep):
    words = masked_softmax(np.tanh(doc @ p["W_w"] + p["b_w"]) @ p["u_w"], keep)
    sentences = np.einsum("...sw,...swd->...sd", words, doc)
    sent = masked_softmax(np.tanh(sentences @ p["W_s"] + p["b_s"]) @ p["u_s"], keep.any(-1))
    return words, sentences, sent, np.einsum("...s,...sd->...d", sent, sentences)


def test_han_oracle_with_padded_words_and_sentences():
    rng = np.random.default_rng(0)
    doc = rng.normal(size=(2, 4, 5, 3))
    p = {"W_w": rng.normal(size=(3, 6)), "b_w": rng.normal(size=6), "u_w": rng.normal(size=6),
         "W_s": rng.normal(size=(3, 4)), "b_s": rng.normal(size=4), "u_s": rng.normal(size=4)}
    keep = np.ones((2, 4, 5), bool)
    keep[0, 1, 3:] = False  # a short sentence
    keep[1, 3] = False  # a padding sentence
    r = compute("hierarchical", inputs={"doc": doc}, learned=p, keep=keep)
    words, sentences, sent, document = han_oracle(doc, p, keep)
    np.testing.assert_allclose(r.weights, words, atol=1e-6)
    np.testing.assert_allclose(r.output, sentences, atol=1e-5)
    np.testing.assert_allclose(r.maps["sentence_weights"], sent, atol=1e-6)
    np.testing.assert_allclose(r.maps["document"], document, atol=1e-5)
    assert r.maps["sentence_weights"][1, 3] == 0 and (r.weights[1, 3] == 0).all()


H = np.array([[1.0, 0], [0, 1], [1, 1]])
U = np.array([[1.0, 0], [0, 1]])
W = np.array([1.0, 0, 0, 1, 1, 1])


def test_bidaf_reference_example():
    r = compute("bidirectional", inputs={"context": H, "query": U}, learned={"w": W})
    np.testing.assert_allclose(r.maps["similarity"], [[2, 2], [0, 2], [2, 3]], atol=1e-6)
    np.testing.assert_allclose(r.weights, [[0.5, 0.5], [0.119203, 0.880797], [0.268941, 0.731059]], atol=1e-6)
    np.testing.assert_allclose(r.maps["q2c"], [0.211942, 0.211942, 0.576117], atol=1e-6)
    np.testing.assert_allclose(r.maps["context_summary"], [0.788058, 0.788058], atol=1e-6)
    np.testing.assert_allclose(r.output, [
        [1, 0, 0.5, 0.5, 0.5, 0, 0.788058, 0],
        [0, 1, 0.119203, 0.880797, 0, 0.880797, 0, 0.788058],
        [1, 1, 0.268941, 0.731059, 0.268941, 0.731059, 0.788058, 0.788058]], atol=1e-6)


def test_bidaf_oracle_with_padding():
    rng = np.random.default_rng(1)
    h, u, w = rng.normal(size=(2, 5, 3)), rng.normal(size=(2, 4, 3)), rng.normal(size=9)
    keep = np.ones((2, 5, 4), bool)
    keep[0, :, 3] = False  # a padded query word
    keep[1, 4, :] = False  # a padded context word
    r = compute("bidirectional", inputs={"context": h, "query": u}, learned={"w": w}, keep=keep)
    s = (h @ w[:3])[..., :, None] + (u @ w[3:6])[..., None, :] + (h * w[6:]) @ np.swapaxes(u, -1, -2)
    a = masked_softmax(s, keep)
    b = masked_softmax(np.where(keep, s, -np.inf).max(-1), keep.any(-1))
    summary = np.einsum("...t,...te->...e", b, h)
    ut = a @ u
    g = np.concatenate([h, ut, h * ut, h * summary[..., None, :]], axis=-1)
    np.testing.assert_allclose(r.weights, a, atol=1e-6)
    np.testing.assert_allclose(r.maps["q2c"], b, atol=1e-6)
    np.testing.assert_allclose(r.output, g, atol=1e-5)
    assert r.maps["q2c"][1, 4] == 0 and (r.weights[0, :, 3] == 0).all()


def test_cli_shows_both_levels(tmp_path):
    np.save(tmp_path / "doc.npy", DOC)
    np.savez(tmp_path / "han.npz", **HAN)
    png = tmp_path / "han.png"
    r = runner.invoke(app, ["hierarchical", str(tmp_path / "doc.npy"), "--params", str(tmp_path / "han.npz"),
                            "--png", str(png)])
    assert r.exit_code == 0, r.stderr
    text = " ".join(r.stdout.split())
    assert "word weights" in text and "sentence weights" in text and "0.643" in text
    assert png.stat().st_size > 5000
    np.save(tmp_path / "h.npy", H)
    np.save(tmp_path / "u.npy", U)
    doc = json.loads(runner.invoke(app, ["bidirectional", str(tmp_path / "h.npy"), str(tmp_path / "u.npy"),
                                         "--json"]).stdout)
    assert doc["weights_shape"] == [3, 2] and doc["output_shape"] == [3, 8] and "q2c" in doc["maps"]


def test_han_reads_tokenised_sentences_from_json(tmp_path):
    rng = np.random.default_rng(5)
    words = [["the", "cat", "sat"], ["it", "slept"]]
    vectors = [rng.normal(size=(len(s), 3)) for s in words]
    doc = {"sentences": [{"tokens": t, "vectors": v.tolist()} for t, v in zip(words, vectors)]}
    (tmp_path / "doc.json").write_text(json.dumps(doc))
    padded = np.zeros((2, 3, 3))
    padded[0], padded[1, :2] = vectors[0], vectors[1]
    np.save(tmp_path / "doc.npy", padded)
    np.save(tmp_path / "words.npy", np.array([[1, 1, 1], [1, 1, 0]]))
    a = json.loads(runner.invoke(app, ["hierarchical", str(tmp_path / "doc.json"), "--seed", "3", "--json"]).stdout)
    b = json.loads(runner.invoke(app, ["hierarchical", str(tmp_path / "doc.npy"), "--mask", str(tmp_path / "words.npy"),
                                       "--seed", "3", "--json"]).stdout)
    assert a["weights"] == b["weights"] and a["maps"] == b["maps"]
    assert a["weights"][1][2] == 0 and a["labels"]["q"] == ["the cat sat", "it slept"]
    (tmp_path / "bad.json").write_text(json.dumps({"sentences": [{"tokens": ["a", "b"], "vectors": [[1.0, 2.0]]}]}))
    r = runner.invoke(app, ["hierarchical", str(tmp_path / "bad.json")])
    assert r.exit_code == 1 and "sentence 0 has 2 tokens" in r.stderr

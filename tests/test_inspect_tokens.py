"""inspect's token-aware head detectors and received attention, through the command line: constructed
heads on a repeated random sequence (the standard induction probe) get exactly the scores and tags
expected; nothing token-aware without labels; a sink head's received attention is all on token 0."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from attnviz.cli import app
from attnviz.inspection.tokens import repeated_sequence

runner = CliRunner()
N = 10  # distinct tokens, then the same 10 again


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args])


@pytest.fixture
def probe(tmp_path):
    """Layer 0: induction, duplicate-token, previous-token and sink heads; layer 1: uniform causal
    heads. In the first half (nothing repeated yet) the first two attend to the previous token, less than
    half of their rows: they stay induction and duplicate-token heads."""
    length = 2 * N
    ids = repeated_sequence(N, 500, seed=11)
    (tmp_path / "tokens.txt").write_text("".join(f"tok{i}\n" for i in ids))
    heads = np.zeros((4, length, length))
    for i in range(length):
        heads[0, i, i - N + 1 if i >= N else max(i - 1, 0)] = 1.0
        heads[1, i, i - N if i >= N else max(i - 1, 0)] = 1.0
        heads[2, i, max(i - 1, 0)] = 1.0
        heads[3, i, 0] = 1.0
    uniform = np.tril(np.ones((length, length)))
    uniform /= uniform.sum(-1, keepdims=True)
    layers = [heads[None], np.broadcast_to(uniform, (1, 4, length, length)).copy()]
    np.savez(tmp_path / "attn.npz", *layers)
    return tmp_path


def head_rows(doc):
    return {(h["layer"], h["head"]): h for h in doc["head_stats"]}


def test_constructed_heads_get_their_scores_and_tags(probe):
    result = invoke("inspect", probe / "attn.npz", "--labels", probe / "tokens.txt", "--json")
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    rows = head_rows(doc)
    assert rows[0, 0]["induction"] == 1.0 and rows[0, 0]["duplicate"] == 0.0
    assert rows[0, 0]["tag"] == "induction"
    assert rows[0, 1]["duplicate"] == 1.0 and rows[0, 1]["induction"] == 0.0
    assert rows[0, 1]["tag"] == "duplicate-token"
    assert rows[0, 2]["tag"] == "previous-token" and rows[0, 2]["induction"] == 0.0
    assert rows[0, 3]["tag"] == "sink"
    assert rows[0, 3]["duplicate"] == pytest.approx(1 / N)  # the first repeat's earlier occurrence is token 0
    # uniform causal: query N + t sees N + t + 1 keys, one earlier occurrence and one token after it
    expected = np.mean([1 / (N + t + 1) for t in range(N)])
    assert rows[1, 0]["induction"] == pytest.approx(expected) and rows[1, 0]["duplicate"] == pytest.approx(expected)
    assert rows[1, 0]["tag"] in (None, "broad")
    assert doc["notes"] == []


def test_sorting_by_induction_and_the_table(probe):
    result = invoke("inspect", probe / "attn.npz", "--labels", probe / "tokens.txt", "--sort", "induction",
                    "--top", "2", "--max-rows", "2")
    assert result.exit_code == 0, result.stderr
    lines = [line.split() for line in result.stdout.splitlines()]
    header = next(i for i, parts in enumerate(lines) if parts[:2] == ["layer", "head"])
    assert "ind" in lines[header] and "dup" in lines[header]
    first = lines[header + 2]
    assert first[:2] == ["0", "0"] and "induction" in first
    doc = json.loads(invoke("inspect", probe / "attn.npz", "--labels", probe / "tokens.txt", "--sort", "duplicate",
                            "--json").stdout)
    assert doc["head_stats"][1]["tag"] == "duplicate-token"  # JSON keeps layer order; the table sorts


def test_without_labels_nothing_token_aware(probe):
    result = invoke("inspect", probe / "attn.npz", "--json")
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    assert all("induction" not in h for h in doc["head_stats"])
    assert not any(h["tag"] in ("induction", "duplicate-token") for h in doc["head_stats"])
    assert "--labels" in doc["notes"][0]
    table = invoke("inspect", probe / "attn.npz")
    assert table.exit_code == 0 and " ind " not in table.stdout and "scores need the tokens (--labels)" in " ".join(
        table.stdout.split())
    refused = invoke("inspect", probe / "attn.npz", "--sort", "induction")
    assert refused.exit_code == 2 and "--sort induction" in refused.stderr and "--labels" in refused.stderr
    refused = invoke("inspect", probe / "attn.npz", "--stats-png", probe / "s.png", "--stat", "duplicate")
    assert refused.exit_code == 2 and not (probe / "s.png").exists()


def test_stats_png_of_induction(probe):
    result = invoke("inspect", probe / "attn.npz", "--labels", probe / "tokens.txt", "--stats-png",
                    probe / "ind.png", "--stat", "induction", "-q")
    assert result.exit_code == 0, result.stderr
    assert (probe / "ind.png").read_bytes()[:4] == b"\x89PNG"


def test_received_attention(probe):
    doc = json.loads(invoke("inspect", probe / "attn.npz", "--labels", probe / "tokens.txt", "--json").stdout)
    received = doc["received"]
    per_head = np.array(received["per_head"])  # [layers, heads, Lk]
    assert received["causal"] is True
    assert per_head[0, 3, 0] == 1.0 and (per_head[0, 3, 1:] == 0.0).all()  # the sink
    # uniform causal: key j is seen by queries j..L-1, each giving 1/(i+1)
    length = 2 * N
    expected = [np.mean([1 / (i + 1) for i in range(j, length)]) for j in range(length)]
    np.testing.assert_allclose(per_head[1, 0], expected)
    np.testing.assert_allclose(received["mean"], per_head.mean(axis=(0, 1)))
    top = received["top"][0]
    assert top["position"] == 0 and top["token"] == (probe / "tokens.txt").read_text().split()[0]
    assert (top["layer"], top["head"], top["max"]) == (0, 3, 1.0)
    result = invoke("inspect", probe / "attn.npz", "--labels", probe / "tokens.txt", "--received-png",
                    probe / "rec.png", "--max-rows", "2")
    assert result.exit_code == 0, result.stderr
    assert "receive the most attention" in result.stdout
    assert (probe / "rec.png").read_bytes()[:4] == b"\x89PNG"


def test_received_leaves_padding_out(probe, tmp_path):
    rng = np.random.default_rng(1)
    length = 6
    scores = np.where(np.tril(np.ones((length, length), bool)), rng.normal(size=(1, 2, length, length)), -np.inf)
    scores[..., :, :2] = -np.inf  # keys 0, 1 are padding
    scores[..., :2, :] = 0.0  # padded rows: anything
    w = np.exp(scores - scores.max(-1, keepdims=True))
    w /= w.sum(-1, keepdims=True)
    np.save(tmp_path / "w.npy", w)
    np.save(tmp_path / "pad.npy", np.array([[0, 0, 1, 1, 1, 1]]))
    doc = json.loads(invoke("inspect", tmp_path / "w.npy", "--mask", tmp_path / "pad.npy", "--json").stdout)
    per_head = np.array(doc["received"]["per_head"], dtype=object)
    assert per_head[0, 0, 0] is None and per_head[0, 0, 1] is None
    for h in range(2):
        expected = [np.mean([w[0, h, i, j] for i in range(max(j, 2), length)]) for j in range(2, length)]
        np.testing.assert_allclose(per_head[0, h, 2:].astype(float), expected)


def test_a_tag_needs_enough_rows(tmp_path):
    """One repeated token in the batch: the head that puts all of that row on the induction target scores 1.0 but
    is not tagged from one row; the JSON and the table say how many rows the detectors counted."""
    from attnviz.inspection.tokens import TOKEN_TAG_MIN_ROWS

    tokens = ["[CLS]", "the", "cat", "sat", "on", "the", "mat", "[SEP]"]  # "the" repeats once, at 5
    length = len(tokens)
    (tmp_path / "tokens.txt").write_text("".join(f"{t}\n" for t in tokens))
    w = np.zeros((1, 1, 2, length, length))
    for i in range(length):
        w[0, 0, 0, i, 2 if i == 5 else i] = 1.0  # row 5: the token after the earlier "the"
        w[0, 0, 1, i, max(i - 1, 0)] = 1.0
    np.save(tmp_path / "w.npy", w)
    result = invoke("inspect", tmp_path / "w.npy", "--labels", tmp_path / "tokens.txt", "--json")
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    rows = head_rows(doc)
    assert rows[0, 0]["induction"] == 1.0 and rows[0, 0]["token_rows"] == 1
    assert rows[0, 0]["tag"] == "diagonal" and rows[0, 1]["tag"] == "previous-token"  # not "diagonal, induction"
    assert any(f"at least {TOKEN_TAG_MIN_ROWS}" in note for note in doc["notes"])
    table = invoke("inspect", tmp_path / "w.npy", "--labels", tmp_path / "tokens.txt", "--max-cols", "10")
    caption = " ".join(table.stdout.split())
    assert "over 1 query row" in caption and f"a tag needs at least {TOKEN_TAG_MIN_ROWS}" in caption


def test_the_probe_counts_its_rows(probe):
    doc = json.loads(invoke("inspect", probe / "attn.npz", "--labels", probe / "tokens.txt", "--json").stdout)
    assert {h["token_rows"] for h in doc["head_stats"]} == {N}

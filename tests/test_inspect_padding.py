"""`inspect` and `compare` with padding masks, and the warning for input that is not attention weights.

The oracle for padding is the unpadded slice: a left-padded batch entry must have exactly the head
statistics of its real tokens alone, whatever junk its padded rows hold."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from attnviz.cli import app
from attnviz.inspection.heads import HEAD_STATS, head_statistics
from attnviz.inspection.masks import read_mask
from attnviz.inspection.weights import load_weights
from attnviz.io import load_array

runner = CliRunner()
S, PAD, LAYERS, HEADS = 9, 3, 2, 3


def invoke(*args):
    result = runner.invoke(app, [str(a) for a in args])
    assert "Traceback" not in result.stderr and "internal error" not in result.stderr, result.stderr
    return result


def causal(rng, n, kind):
    """One causal head of ``n`` tokens: random, previous-token-ish or sink-ish, rows summing to 1."""
    w = rng.random((n, n)) * np.tril(np.ones((n, n)))
    if kind == 1:
        w[np.arange(1, n), np.arange(n - 1)] += 20
    elif kind == 2:
        w[:, 0] += 20
    return w / w.sum(-1, keepdims=True)


def padded_batch(seed=0):
    """[layers, batch 2, heads, S, S]: entry 0 has S real tokens; entry 1 is left-padded by PAD, its
    padded rows junk (attending anywhere, also above the diagonal) that still sums to 1."""
    rng = np.random.default_rng(seed)
    w = np.zeros((LAYERS, 2, HEADS, S, S))
    for li in range(LAYERS):
        for hi in range(HEADS):
            w[li, 0, hi] = causal(rng, S, hi)
            w[li, 1, hi, PAD:, PAD:] = causal(rng, S - PAD, hi)
            junk = rng.random((PAD, S))
            w[li, 1, hi, :PAD] = junk / junk.sum(-1, keepdims=True)
    attention_mask = np.ones((2, S), np.int64)
    attention_mask[1, :PAD] = 0
    return w, attention_mask


def head_stats(doc):
    return {(h["layer"], h["head"]): h for h in doc["head_stats"]}


def assert_same_stats(got, expected):
    assert got.keys() == expected.keys()
    for key in expected:
        for name in HEAD_STATS:
            assert got[key][name] == pytest.approx(expected[key][name], abs=1e-12), (key, name)
        assert got[key]["tag"] == expected[key]["tag"]


@pytest.fixture
def files(tmp_path):
    w, am = padded_batch()
    np.save(tmp_path / "w.npy", w)
    np.save(tmp_path / "am.npy", am)
    np.save(tmp_path / "slice.npy", w[:, 1, :, PAD:, PAD:][:, None])  # entry 1 without its padding
    np.save(tmp_path / "first.npy", w[:, :1])  # entry 0 alone
    return tmp_path


def test_padded_entry_has_the_statistics_of_its_unpadded_slice(files):
    sliced = invoke("inspect", files / "slice.npy", "--json")
    assert sliced.exit_code == 0, sliced.stderr
    r = invoke("inspect", files / "w.npy", "--mask", files / "am.npy", "--batch", "1", "--json")
    assert r.exit_code == 0, r.stderr
    doc = json.loads(r.stdout)
    assert_same_stats(head_stats(doc), head_stats(json.loads(sliced.stdout)))
    assert {h["tag"] for h in doc["head_stats"]} >= {"previous-token", "sink"}
    assert doc["warnings"] == [] and doc["padded_rows"] == LAYERS * HEADS * PAD
    assert doc["stats"]["padded"] == [True] * PAD + [False] * (S - PAD)
    assert doc["stats"]["entropy"][:PAD] == [None] * PAD and None not in doc["stats"]["entropy"][PAD:]
    # without the mask the junk rows count: the statistics are not those of the real tokens
    unmasked = json.loads(invoke("inspect", files / "w.npy", "--batch", "1", "--json").stdout)
    assert head_stats(unmasked)[0, 0]["entropy"] != pytest.approx(head_stats(doc)[0, 0]["entropy"])


def test_the_whole_batch_is_the_mean_over_real_rows(files):
    whole = head_stats(json.loads(invoke("inspect", files / "w.npy", "--mask", files / "am.npy", "--json").stdout))
    one = head_stats(json.loads(invoke("inspect", files / "first.npy", "--json").stdout))
    two = head_stats(json.loads(invoke("inspect", files / "slice.npy", "--json").stdout))
    n1, n2 = S, S - PAD  # real rows of each entry; previous and first count the rows after the first
    for key in whole:
        for name in ("entropy", "distance", "diagonal", "last", "max"):
            expected = (n1 * one[key][name] + n2 * two[key][name]) / (n1 + n2)
            assert whole[key][name] == pytest.approx(expected, abs=1e-12), (key, name)
        for name in ("previous", "first", "entropy_norm"):  # entropy_norm: rows with more than one key
            expected = ((n1 - 1) * one[key][name] + (n2 - 1) * two[key][name]) / (n1 + n2 - 2)
            assert whole[key][name] == pytest.approx(expected, abs=1e-12), (key, name)
        assert whole[key]["rows"] == n1 + n2


def test_blocked_statistics_agree_with_padding(files):
    w = load_weights(str(files / "w.npy"))
    m = read_mask(w, load_array(str(files / "am.npy"))).with_padding(w.shape)
    whole = head_statistics(w.data, m.keep, chunk=10**9, real_rows=m.real_rows, real_keys=m.real_keys)
    for chunk in (S * S * 2, S * 2):  # two heads at a time; two rows at a time
        blocked = head_statistics(w.data, m.keep, chunk=chunk, real_rows=m.real_rows, real_keys=m.real_keys)
        for name, value in whole.items():
            if name == "tag":
                assert (blocked[name] == value).all()
            else:
                np.testing.assert_allclose(blocked[name], value, atol=1e-12, err_msg=f"{name}, chunk {chunk}")


def _forms(am):
    """The same padding in each shape a user may bring: (file contents, extra options)."""
    b = am.shape[0]
    key = am[:, None, None, :]
    causal = np.tril(np.ones((S, S), np.int64))
    return {
        "B,S": (am, []),
        "B,1,1,S": (key, []),
        "B,1,T,S expanded": (np.broadcast_to(key, (b, 1, S, S)).copy(), []),
        "B,N,T,S causal": (np.broadcast_to(key * causal, (b, HEADS, S, S)).copy(), []),
        "B,1,T,S causal": (key * causal, []),
        "block convention": (1 - am, ["--mask-convention", "block"]),
        "additive -inf": (np.where(key == 1, 0.0, -np.inf), ["--mask-kind", "additive"]),
        "additive HF minimum": (np.where(key * causal == 1, 0.0, np.finfo(np.float32).min).astype(np.float32),
                                ["--mask-kind", "additive"]),
        "additive -10000": (np.where(key == 1, 0.0, -10000.0), ["--mask-kind", "additive"]),
    }


@pytest.mark.parametrize("form", list(_forms(padded_batch()[1])))
def test_every_mask_shape_gives_the_unpadded_statistics(files, form):
    data, extra = _forms(np.load(files / "am.npy"))[form]
    np.save(files / "mask.npy", data)
    expected = head_stats(json.loads(invoke("inspect", files / "slice.npy", "--json").stdout))
    r = invoke("inspect", files / "w.npy", "--mask", files / "mask.npy", "--batch", "1", "--json", *extra)
    assert r.exit_code == 0, r.stderr
    assert_same_stats(head_stats(json.loads(r.stdout)), expected)
    r = invoke("inspect", files / "w.npy", "--mask", files / "mask.npy", "--check-causal", "--check-rows",
               "--no-table", *extra)
    assert r.exit_code == 0 and r.stderr.count("passed") == 2, r.stderr


def test_key_padding_mask_option_and_a_1d_mask(files):
    expected = head_stats(json.loads(invoke("inspect", files / "slice.npy", "--json").stdout))
    r = invoke("inspect", files / "w.npy", "--key-padding-mask", files / "am.npy", "--batch", "1", "--json")
    assert r.exit_code == 0, r.stderr
    assert_same_stats(head_stats(json.loads(r.stdout)), expected)
    w, am = padded_batch()
    np.save(files / "one.npy", w[:, 1])  # [layers, heads, S, S] read as [batch, heads, S, S]: no layer axis
    np.save(files / "one_w.npy", w[0, 1])  # [heads, S, S]
    np.save(files / "row.npy", am[1])  # [S]
    r = invoke("inspect", files / "one_w.npy", "--key-padding-mask", files / "row.npy", "--json")
    assert r.exit_code == 0, r.stderr
    got = head_stats(json.loads(r.stdout))
    assert_same_stats(got, {(0, h): expected[0, h] for h in range(HEADS)})
    r = invoke("inspect", files / "one_w.npy", "--mask", files / "row.npy", "--json")  # [Lk] as --mask: the same
    assert_same_stats(head_stats(json.loads(r.stdout)), got)


def test_check_causal_on_a_left_padded_batch(files):
    r = invoke("inspect", files / "w.npy", "--check-causal", "--no-table")
    assert r.exit_code == 3 and "check-causal: FAILED" in r.stderr and "batch 1" in r.stderr
    r = invoke("inspect", files / "w.npy", "--mask", files / "am.npy", "--check-causal", "--check-rows",
               "--check-finite", "--no-table")
    assert r.exit_code == 0, r.stderr
    assert r.stderr.count("passed") == 3 and "FAILED" not in r.stderr
    assert r.stdout == ""
    # a leak in a real row is still found
    w, _ = padded_batch()
    w[1, 1, 2, PAD + 1, S - 1] = 0.25
    np.save(files / "leak.npy", w)
    r = invoke("inspect", files / "leak.npy", "--mask", files / "am.npy", "--check-causal", "--no-table")
    assert r.exit_code == 3 and f"layer 1, batch 1, head 2, row {PAD + 1}, column {S - 1}" in r.stderr


def test_padded_rows_need_not_sum_to_one_or_be_finite(files):
    w, _ = padded_batch()
    w[:, 1, :, :PAD] = 0.0  # padded rows of zeros ...
    w[0, 1, 0, 0] = np.nan  # ... and one of NaN, as some implementations leave them
    np.save(files / "zeros.npy", w)
    r = invoke("inspect", files / "zeros.npy", "--check-rows", "--check-finite", "--no-table")
    assert r.exit_code == 3 and "check-finite: FAILED" in r.stderr  # (the other checks need finite weights)
    r = invoke("inspect", files / "zeros.npy", "--mask", files / "am.npy", "--check-rows", "--no-table")
    assert r.exit_code == 0, r.stderr
    np.save(files / "zeros_only.npy", np.nan_to_num(w))
    r = invoke("inspect", files / "zeros_only.npy", "--check-rows", "--no-table")
    assert r.exit_code == 3 and f"check-rows: FAILED, {LAYERS * HEADS * PAD} rows" in r.stderr
    r = invoke("inspect", files / "zeros.npy", "--mask", files / "am.npy", "--check-rows", "--check-finite",
               "--json")
    assert r.exit_code == 0, r.stderr
    doc = json.loads(r.stdout)
    assert [c["passed"] for c in doc["checks"]] == [True, True] and doc["warnings"] == []
    expected = head_stats(json.loads(invoke("inspect", files / "slice.npy", "--json").stdout))
    r = invoke("inspect", files / "zeros.npy", "--mask", files / "am.npy", "--batch", "1", "--json")
    assert_same_stats(head_stats(json.loads(r.stdout)), expected)


def test_check_mask_accepts_an_attention_mask(files):
    r = invoke("inspect", files / "w.npy", "--check-mask", files / "am.npy", "--no-table")
    assert r.exit_code == 0 and "check-mask: passed" in r.stderr, r.stderr
    w, _ = padded_batch()
    w[0, 1, 1, S - 1, 0] = 0.2  # a real row attending a padded key
    np.save(files / "leak.npy", w)
    r = invoke("inspect", files / "leak.npy", "--check-mask", files / "am.npy", "--json")
    assert r.exit_code == 3
    check = json.loads(r.stdout)["checks"][0]
    assert check["name"] == "check-mask" and check["index"] == [0, 1, 1, S - 1, 0] and check["failures"] == 1


def test_tables_mark_padded_rows_and_masked_cells(files):
    r = invoke("inspect", files / "w.npy", "--mask", files / "am.npy", "--batch", "1", "--max-cols", "0")
    assert r.exit_code == 0, r.stderr
    text = r.stdout
    assert "0 pad" in text and "2 pad" in text and "3 pad" not in text and "·" in text
    assert "pad = a padded query row" in " ".join(text.split())
    assert f"{PAD} padded position(s) of the batch ({LAYERS * HEADS * PAD} padded query rows over layers and heads)" \
        in r.stderr
    stats_part = text[text.index("per-query statistics"):]
    assert stats_part.count("pad") >= PAD * 5


def test_mask_shape_errors(files):
    np.save(files / "bad.npy", np.ones((2, S + 1)))
    r = invoke("inspect", files / "w.npy", "--mask", files / "bad.npy")
    assert r.exit_code == 1 and "bad.npy" in r.stderr and f"[2, {S + 1}]" in r.stderr
    r = invoke("inspect", files / "w.npy", "--key-padding-mask", files / "bad.npy")
    assert r.exit_code == 1 and "padding mask" in r.stderr
    np.save(files / "bad4.npy", np.ones((3, 1, 1, S)))
    r = invoke("inspect", files / "w.npy", "--mask", files / "bad4.npy")
    assert r.exit_code == 1 and "[batch, heads or 1, Lq or 1, Lk]" in r.stderr
    np.save(files / "half.npy", np.full((2, S), 0.5))
    r = invoke("inspect", files / "w.npy", "--mask", files / "half.npy")
    assert r.exit_code == 1 and "--mask-kind additive" in r.stderr
    np.save(files / "sq.npy", np.ones((S, S, S)) / S)  # batch S = Lq: a [S, S] mask is ambiguous
    np.save(files / "sqmask.npy", np.ones((S, S)))
    r = invoke("inspect", files / "sq.npy", "--layout", "batch,q,k", "--mask", files / "sqmask.npy")
    assert r.exit_code == 2 and "--key-padding-mask" in r.stderr
    r = invoke("inspect", files / "sq.npy", "--layout", "batch,q,k", "--key-padding-mask", files / "sqmask.npy",
               "--no-table")
    assert r.exit_code == 0, r.stderr


def test_raw_scores_are_not_attention_weights(tmp_path):
    rng = np.random.default_rng(1)
    np.save(tmp_path / "scores.npy", rng.normal(size=(2, 4, 6, 6)))  # raw scores: negatives
    r = invoke("inspect", tmp_path / "scores.npy", "--json")
    assert r.exit_code == 0
    lines = [line for line in r.stderr.splitlines() if line.startswith("warning:")]
    assert len(lines) == 1 and "Raw scores or activations rather than attention weights?" in lines[0]
    assert "negative" in lines[0] and "of 48 rows" in lines[0]
    doc = json.loads(r.stdout)
    assert len(doc["warnings"]) == 1 and "negative" in doc["warnings"][0]
    assert all(h["tag"] is None for h in doc["head_stats"])
    r = invoke("inspect", tmp_path / "scores.npy")  # tables: the warning too, exit 0
    assert r.exit_code == 0 and "warning:" in r.stderr and "head statistics" in r.stdout


def test_rows_summing_to_two_and_tags_left_out(tmp_path):
    w = np.zeros((1, 2, 5, 5))
    w[0, 0, np.arange(1, 5), np.arange(4)] = 1  # previous-token
    w[0, 0, 0, 0] = 1
    w[0, 1, :, 0] = 1  # sink
    good = json.loads(invoke("inspect", _save(tmp_path / "good.npy", w), "--json").stdout)
    assert [h["tag"] for h in good["head_stats"]] == ["previous-token", "sink"]
    assert good["warnings"] == []
    r = invoke("inspect", _save(tmp_path / "twice.npy", 2 * w), "--json", "--check-rows")
    assert r.exit_code == 3  # the check fails as before; the warning comes with it
    doc = json.loads(r.stdout)
    assert "10 of 10 rows sum neither to 1 nor to 0" in doc["warnings"][0] and "from 2 to 2" in doc["warnings"][0]
    assert [h["tag"] for h in doc["head_stats"]] == [None, None]
    assert "warning:" in r.stderr and r.stderr.count("warning:") == 1


def test_good_weights_and_fully_masked_rows_get_no_warning(tmp_path):
    w = np.zeros((4, 4))
    w[1:, 0] = 1  # row 0 fully masked: all zeros, as Keras and PyTorch SDPA leave it
    mask = np.ones((4, 4), np.int8)
    mask[0] = 0
    r = invoke("inspect", _save(tmp_path / "w.npy", w), "--mask", _save(tmp_path / "m.npy", mask), "--json")
    assert r.exit_code == 0 and "warning" not in r.stderr
    doc = json.loads(r.stdout)
    assert doc["warnings"] == [] and doc["head_stats"][0]["rows"] == 3 and doc["stats"]["fully_masked"][0]
    r = invoke("inspect", tmp_path / "w.npy")  # the zero row sums to 0: allowed
    assert r.exit_code == 0 and "warning" not in r.stderr


def test_compare_with_padding_and_raw_scores(files):
    w, am = padded_batch()
    other = w.copy()
    other[:, 1, :, :PAD] = np.roll(other[:, 1, :, :PAD], 1, axis=-1)  # the padded rows differ, the real ones not
    np.save(files / "other.npy", other)
    r = invoke("compare", files / "w.npy", files / "other.npy", "--atol", "1e-9", "--no-table")
    assert r.exit_code == 3
    r = invoke("compare", files / "w.npy", files / "other.npy", "--mask", files / "am.npy", "--atol", "1e-9",
               "--json")
    assert r.exit_code == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["max_abs_diff"] == 0 and doc["js_divergence"]["max"] == 0 and doc["argmax_agreement"] == 1
    assert doc["padded_rows"] == LAYERS * HEADS * PAD and doc["rows_compared"] == LAYERS * HEADS * (2 * S - PAD)
    assert doc["js_divergence"]["per_row"][0][1][0][:PAD] == [None] * PAD
    assert doc["warnings"] == [] and "warning" not in r.stderr
    other[:, 1, :, :PAD] = np.nan  # padded rows need not be finite either
    np.save(files / "nan.npy", other)
    r = invoke("compare", files / "w.npy", files / "nan.npy", "--no-table")
    assert r.exit_code == 1 and "NaN" in r.stderr
    r = invoke("compare", files / "w.npy", files / "nan.npy", "--key-padding-mask", files / "am.npy", "--atol", "0")
    assert r.exit_code == 0 and "tolerance: passed" in r.stderr and "rows with the same argmax" in r.stdout

    rng = np.random.default_rng(2)
    np.save(files / "scores.npy", rng.normal(size=w.shape))
    r = invoke("compare", files / "w.npy", files / "scores.npy", "--json")
    assert r.exit_code == 0
    doc = json.loads(r.stdout)
    assert len(doc["warnings"]) == 1 and doc["warnings"][0].startswith("B (")
    assert r.stderr.count("warning:") == 1 and "rather than attention weights?" in r.stderr


def _save(path, arr):
    np.save(path, arr)
    return path


# A mask that hides weight the model put there (issue 33, item 1): an inverted attention_mask, or a keep
# mask read with --mask-convention block, drops the real tokens' weight and keeps the padding's zeros


def _hidden_lines(stderr):
    return [line for line in stderr.splitlines() if "lies on keys they hide" in line]


@pytest.mark.parametrize("how", ["inverted", "block convention", "inverted, key padding"])
def test_a_mask_that_hides_weight_is_said(files, how):
    w, am = padded_batch()
    np.save(files / "inverted.npy", 1 - am)
    args = {"inverted": ["--mask", files / "inverted.npy"],
            "block convention": ["--mask", files / "am.npy", "--mask-convention", "block"],
            "inverted, key padding": ["--key-padding-mask", files / "inverted.npy"]}[how]
    r = invoke("inspect", files / "w.npy", *args, "--check-rows", "--batch", "1", "--no-table")
    assert r.exit_code == 0 and "check-rows: passed" in r.stderr, r.stderr
    (line,) = _hidden_lines(r.stderr)
    import re

    share = re.search(r"w\.npy: ([\d.]+)% of the attention weight of the query rows the masks keep", line)
    assert share and 50 < float(share.group(1)) < 100 and "--check-mask with that mask" in line, line
    assert ("--mask-convention block reads 1 as masked" in line) == (how == "block convention")
    assert ("1 - attention_mask" in line) == (how != "block convention")
    doc = json.loads(invoke("inspect", files / "w.npy", *args, "--json").stdout)
    assert [text for text in doc["warnings"] if "lies on keys they hide" in text]
    for command in (["rollout", files / "w.npy"], ["compare", files / "w.npy", files / "w.npy"]):
        r = invoke(*command, *args, "--no-table")
        assert r.exit_code == 0 and len(_hidden_lines(r.stderr)) == 1, r.stderr
        assert "inspect's --check-mask" in r.stderr


def test_a_mask_that_hides_only_zeros_says_nothing(files):
    for form, (data, extra) in _forms(np.load(files / "am.npy")).items():
        np.save(files / "mask.npy", data)
        for command in (["inspect"], ["rollout"]):
            r = invoke(*command, files / "w.npy", "--mask", files / "mask.npy", "--no-table", *extra)
            assert r.exit_code == 0 and "warning" not in r.stderr, (form, r.stderr)


def test_a_small_share_is_said_with_its_size(files):
    w, am = padded_batch()
    w[:, 1, :, PAD:, 0] += 0.01  # real rows of entry 1 put a little weight on a padded key
    w[:, 1, :, PAD:] /= w[:, 1, :, PAD:].sum(-1, keepdims=True)
    np.save(files / "leaky.npy", w)
    r = invoke("inspect", files / "leaky.npy", "--mask", files / "am.npy", "--no-table")
    (line,) = _hidden_lines(r.stderr)
    share = LAYERS * HEADS * (S - PAD) * 0.01 / 1.01 / (LAYERS * HEADS * (2 * S - PAD))
    assert f"{share:.1%} of the attention weight" in line


def test_a_mask_that_leaves_no_row_is_said(files):
    w, _ = padded_batch()
    np.save(files / "first.npy", w[:, :1])
    np.save(files / "nothing.npy", np.zeros((1, S), np.int64))  # an attention_mask of ones, inverted
    r = invoke("inspect", files / "first.npy", "--mask", files / "nothing.npy", "--no-table")
    assert r.exit_code == 0 and "the masks leave out every query row" in r.stderr, r.stderr


def test_the_api_warns_of_a_mask_that_hides_weight():
    import attnviz

    w, am = padded_batch()
    with pytest.warns(UserWarning, match="lies on keys they hide"):
        attnviz.inspect(w, mask=1 - am)
    with pytest.warns(UserWarning, match="lies on keys they hide"):
        attnviz.rollout(w, mask=1 - am)

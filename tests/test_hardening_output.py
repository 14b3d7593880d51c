"""Hardening (issue 10, items 4 and 5): numerical failures name their cause, any number of leading
axes works, and text from users' files reaches the terminal and the figures inert.

* Overflow: huge values, float16 products past 65504, integers near their limits and dot products
  of values fine alone end in one line naming the input(s) and suggesting ``--dtype float64`` or
  rescaling (exit 1), in every position and every variant: never NaN weights, never "internal error".
* Leading axes: 6-D and 7-D inputs give the 4-D computation of the same slices (TensorFlow's
  softmax stops at 5-D; the pipeline folds the leading axes), also with masks and in blocks.
* Text: labels and file names with ESC sequences, CR, BEL, C1 controls, bidi overrides, rich markup,
  emoji codes, ``$...$`` and a 1 MB label print literally (escaped, shortened), in tables, JSON,
  error messages and PNGs, and matplotlib's warnings stay off stderr.
"""

from __future__ import annotations

import json
import os
import time

import numpy as np
import pytest
from typer.testing import CliRunner

from attnviz import text as inert
from attnviz.cli import app
from attnviz.variants import REGISTRY

runner = CliRunner()
RNG = np.random.default_rng(10)
BIDI = {chr(c) for c in (0x061C, 0x200E, 0x200F, *range(0x202A, 0x202F), *range(0x2066, 0x206A))}


def raw_controls(text: str) -> list[str]:
    """Characters a terminal would act on: C0 but the line feed, DEL, C1, bidi controls."""
    return sorted({repr(c) for c in text if (ord(c) < 0x20 and c != "\n") or 0x7F <= ord(c) <= 0x9F or c in BIDI})


def run(*args):
    return runner.invoke(app, [str(a) for a in args])


def save(folder, name, arr):
    path = folder / name
    np.save(path, arr)
    return path


def normal(*shape, scale=1.0, dtype=np.float32):
    return (RNG.normal(size=shape) * scale).astype(dtype)


def qkv(folder, q=("q.npy", None), k=("k.npy", None), v=("v.npy", None)):
    """Three input files; a None array is a small normal one (Lq 4, Lk 5, d 3, d_v 2)."""
    shapes = {"q": (4, 3), "k": (5, 3), "v": (5, 2)}
    return [save(folder, name, normal(*shapes[n]) if arr is None else arr)
            for n, (name, arr) in zip("qkv", (q, k, v))]


def fails_with_overflow(result, named, not_named=(), dtype="float32"):
    out, err = result.stdout, result.stderr
    assert result.exit_code == 1, (result.exit_code, out, err)
    assert out == ""
    assert "Traceback" not in err and "internal error" not in err
    assert len(err.strip().splitlines()) == 1, err
    assert f"overflowed {dtype}" in err, err
    assert "--dtype float64" in err or "--dtype float32 (or float64)" in err, err
    assert "rescale" in err
    for name in named:
        assert name in err, (name, err)
    for name in not_named:
        assert name not in err, (name, err)
    assert "nan" not in err.lower().replace("finite", "")
    return err


# ----------------------------------------------------------------------------------------------
# 4. Overflow: named, with a way out


def test_huge_q_alone_is_named(tmp_path):
    q = normal(4, 3)
    q[0] = 3e38  # fits float32; its products with K do not
    files = qkv(tmp_path, q=("big_q.npy", q))
    err = fails_with_overflow(run("dot", *files), ["big_q.npy"], ["k.npy", "v.npy"])
    assert "the scores" in err


def test_huge_k_alone_is_named(tmp_path):
    k = normal(5, 3)
    k[2] = -3e38
    files = qkv(tmp_path, k=("big_k.npy", k))
    fails_with_overflow(run("dot", *files), ["big_k.npy"], ["q.npy", "v.npy"])


def test_value_overflowing_the_output_is_named(tmp_path):
    """V is fine alone, but the value and output projections of multi-head attention take it past
    float32: the message names the value input (and not the query)."""
    d = 8
    params = {"query/kernel": np.full((d, 1, d), 0.01, np.float32), "key/kernel": np.full((d, 1, d), 0.01, np.float32),
              "value/kernel": np.ones((d, 1, d), np.float32), "attention_output/kernel": np.ones((1, d, d), np.float32)}
    np.savez(tmp_path / "p.npz", **params)
    query = save(tmp_path, "query.npy", normal(4, d))
    value = save(tmp_path, "huge_value.npy", np.full((5, d), 1e37, np.float32))
    err = fails_with_overflow(run("multihead", query, value, "--params", tmp_path / "p.npz"), ["huge_value.npy"],
                              ["query.npy"])
    assert "the output" in err


def test_float16_products_past_65504(tmp_path):
    files = [save(tmp_path, "q16.npy", normal(4, 3, scale=300, dtype=np.float16)),
             save(tmp_path, "k16.npy", normal(5, 3, scale=300, dtype=np.float16)),
             save(tmp_path, "v16.npy", normal(5, 2, dtype=np.float16))]
    err = fails_with_overflow(run("dot", *files, "--dtype", "float16"), ["q16.npy", "k16.npy"], ["v16.npy"],
                              dtype="float16")
    assert "--dtype float32" in err
    # the same arrays computed in float32 are fine
    assert run("dot", *files, "--no-table").exit_code == 0


def test_int64_near_its_limits(tmp_path):
    """2**62 fits float32, but 32 products of it do not; the integers are also rounded (a warning)."""
    files = [save(tmp_path, "qi.npy", np.full((4, 32), 2**62, np.int64)),
             save(tmp_path, "ki.npy", np.full((5, 32), 2**62, np.int64)),
             save(tmp_path, "vi.npy", np.ones((5, 2), np.int64))]
    fails_with_overflow(run("dot", *files), ["qi.npy", "ki.npy"], ["vi.npy"])
    r = run("dot", *files, "--dtype", "float64", "--no-table")  # float64 holds them
    assert r.exit_code == 0, r.stderr
    assert "rounded in float64" in r.stderr  # 2**62 is past 2**53: said, not hidden


def test_int64_minimum_does_not_slip_past_the_range_check(tmp_path):
    """abs(int64 min) overflows in NumPy; the range check must still see 9.2e18 > 65504."""
    q = np.full((4, 3), np.iinfo(np.int64).min, np.int64)
    files = qkv(tmp_path, q=("qmin.npy", q))
    r = run("scaled", *files, "--dtype", "float16")
    assert r.exit_code == 1, r.stderr
    assert "qmin.npy" in r.stderr and "float16 range" in r.stderr and "--dtype float64" in r.stderr


def test_integers_past_float32_precision_warn_and_compute(tmp_path):
    files = [save(tmp_path, "qi.npy", np.arange(12, dtype=np.int64).reshape(4, 3) + 2**25),
             save(tmp_path, "k.npy", normal(5, 3)), save(tmp_path, "v.npy", normal(5, 2))]
    r = run("scaled", *files, "--json")
    assert r.exit_code == 0, r.stderr
    assert "qi.npy: integers up to" in r.stderr and "rounded in float32" in r.stderr
    assert "qi.npy" in " ".join(json.loads(r.stdout)["warnings"])


def test_dot_products_of_values_fine_alone(tmp_path):
    files = [save(tmp_path, "q20.npy", np.full((4, 3), 1e20, np.float32)),
             save(tmp_path, "k20.npy", np.full((5, 3), 1e20, np.float32)), save(tmp_path, "v.npy", normal(5, 2))]
    for variant in ("scaled", "dot", "general", "local", "hard", "sparse"):
        extra = ["--window", "1"] if variant == "local" else []
        fails_with_overflow(run(variant, *files, *extra), ["q20.npy", "k20.npy"], ["v.npy"])


def test_scores_all_minus_infinity_are_not_a_silent_zero_row(tmp_path):
    """-1e20 . 1e20 overflows to -inf in every score: before, each row came out all zero, as if
    masked, with exit 0."""
    files = [save(tmp_path, "qneg.npy", np.full((4, 3), -1e20, np.float32)),
             save(tmp_path, "k20.npy", np.full((5, 3), 1e20, np.float32)), save(tmp_path, "v.npy", normal(5, 2))]
    for variant in ("scaled", "sparse", "structured"):
        extra = ["--method", "crf"] if variant == "structured" else []
        fails_with_overflow(run(variant, *files, *extra), ["qneg.npy", "k20.npy"])


def test_a_large_scale_is_named_when_no_input_is_large(tmp_path):
    files = qkv(tmp_path)
    err = fails_with_overflow(run("scaled", *files, "--dtype", "float16", "--scale", "100000"), ["--scale 100000"],
                              dtype="float16")
    assert "q.npy" in err  # which inputs the scores came from


# every compute command: (argv after the command, given the folder of inputs)
def _argv(variant, f):
    three = [f["q"], f["k"], f["v"]]
    return {
        "scaled": three, "dot": three, "general": three, "additive": three, "local": [*three, "--window", "1"],
        "hard": three, "sparse": three, "structured": [*three, "--method", "crf"],
        "multihead": [f["q"], f["k"], "--heads", "1"], "self": [f["x"]], "pooling": [f["x"]],
        "coattention": [f["q"], f["k"]], "hierarchical": [f["doc"]], "bidirectional": [f["q"], f["k"]],
    }[variant]


def _hostile(tmp_path, scale, dtype):
    f = {"q": save(tmp_path, "q.npy", normal(4, 3, scale=scale, dtype=dtype)),
         "k": save(tmp_path, "k.npy", normal(5, 3, scale=scale, dtype=dtype)),
         "v": save(tmp_path, "v.npy", normal(5, 2, dtype=dtype)),
         "x": save(tmp_path, "x.npy", normal(5, 3, scale=scale, dtype=dtype)),
         "doc": save(tmp_path, "doc.npy", normal(2, 3, 3, scale=scale, dtype=dtype))}
    return f


def test_every_variant_is_listed_here():
    assert set(REGISTRY) == {"scaled", "dot", "general", "additive", "local", "hard", "sparse", "structured",
                             "multihead", "self", "pooling", "coattention", "hierarchical", "bidirectional"}


@pytest.mark.parametrize("variant", sorted(REGISTRY))
@pytest.mark.parametrize("scale, dtype, option", [(1e20, np.float32, "float32"), (300, np.float16, "float16"),
                                                  (3e37, np.float32, "float32")])
def test_every_variant_on_overflowing_inputs(tmp_path, variant, scale, dtype, option):
    """Either finite results (tanh saturates: additive, pooling, hierarchical) or the overflow
    message naming an input: never NaN in the JSON, never an internal error."""
    f = _hostile(tmp_path, scale, dtype)
    r = run(variant, *_argv(variant, f), "--dtype", option, "--json")
    assert r.exit_code in (0, 1), (r.exit_code, r.stderr)
    assert "internal error" not in r.stderr and "Traceback" not in r.stderr
    if r.exit_code == 1:
        err = fails_with_overflow(r, [], dtype=option)
        assert any(name in err for name in ("q.npy", "k.npy", "x.npy", "doc.npy")), err
    else:
        doc = json.loads(r.stdout)
        weights = np.asarray(doc["weights"], dtype=float)  # a null (NaN) would make this fail or give nan
        assert np.isfinite(weights).all()
        if doc["output"] is not None:
            assert np.isfinite(np.asarray(doc["output"], dtype=float)).all()


# ----------------------------------------------------------------------------------------------
# 4. Any number of leading axes: the same as the 4-D computation of the same slices

CORES = {  # each input's own trailing shape
    "q": (4, 3), "k": (5, 3), "v": (5, 2), "x": (5, 3), "doc": (2, 3, 3),
}
FOLD_CASES = {
    "scaled": (["q", "k", "v"], []),
    "dot": (["q", "k", "v"], []),
    "general": (["q", "k", "v"], []),
    "additive": (["q", "k", "v"], []),
    "multihead": (["q", "k", "k"], ["--heads", "2"]),
    "local": (["q", "k", "v"], ["--window", "1"]),
    "sparse": (["q", "k", "v"], []),
    "hard": (["q", "k", "v"], []),
    "self": (["x"], ["--causal"]),
    "pooling": (["x"], []),
    "coattention": (["q", "k"], []),
    "bidirectional": (["q", "k"], []),
    "structured": (["q", "k", "v"], ["--method", "crf"]),
    "hierarchical": (["doc"], []),
}


def _leads(n_inputs, rank_lead):
    """Leading shapes that broadcast against each other: the first input varies along some axes,
    the others along the rest."""
    if rank_lead == 4:
        patterns = [(2, 1, 3, 1), (1, 2, 1, 2), (2, 2, 3, 2)]
    else:
        patterns = [(1, 2, 1, 3, 2), (2, 1, 2, 1, 2), (2, 2, 2, 3, 1)]
    return [patterns[i % len(patterns)] for i in range(n_inputs)]


def _saved(tmp_path, tag, variant, arrays, extra):
    w, o = tmp_path / f"{tag}_w.npy", tmp_path / f"{tag}_o.npy"
    files = [save(tmp_path, f"{tag}_{n}_{i}.npy", a) for i, (n, a) in enumerate(arrays)]
    r = run(variant, *files, *extra, "--save-weights", w, "--save-output", o, "--quiet")
    assert r.exit_code == 0, r.stderr
    return np.load(w), np.load(o)


@pytest.mark.parametrize("rank_lead", [4, 5], ids=["6-D", "7-D"])
@pytest.mark.parametrize("variant", sorted(FOLD_CASES))
def test_high_rank_equals_the_4d_result(tmp_path, variant, rank_lead):
    names, extra = FOLD_CASES[variant]
    leads = _leads(len(names), rank_lead)
    arrays = [(n, normal(*lead, *CORES[n])) for n, lead in zip(names, leads)]
    lead = np.broadcast_shapes(*leads)
    w_high, o_high = _saved(tmp_path, "high", variant, arrays, extra)
    assert w_high.shape[:len(lead)] == lead and o_high.shape[:len(lead)] == lead
    # the reference: every input broadcast to the whole lead, then two leading axes
    two = (int(np.prod(lead[:2])), int(np.prod(lead[2:])))
    flat = [(n, np.broadcast_to(a, (*lead, *CORES[n])).reshape(*two, *CORES[n])) for n, a in arrays]
    w4, o4 = _saved(tmp_path, "four", variant, flat, extra)
    np.testing.assert_allclose(w_high.reshape(*two, *w_high.shape[len(lead):]), w4, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(o_high.reshape(*two, *o_high.shape[len(lead):]), o4, rtol=1e-5, atol=1e-5)


def test_high_rank_with_masks(tmp_path):
    lead = (2, 1, 3, 2)
    q, k, v = normal(*lead, 4, 3), normal(1, 2, 1, 2, 5, 3), normal(1, 2, 1, 2, 5, 2)
    mask = RNG.random((2, 2, 1, 2, 4, 5)) > 0.3
    mask[..., 0] = True  # no fully masked rows
    full = (2, 2, 3, 2)
    args = ["--causal", "--causal-align", "bottom-right"]
    w6, o6 = _saved(tmp_path, "six", "scaled", [("q", q), ("k", k), ("v", v)],
                    ["--mask", save(tmp_path, "m6.npy", mask), *args])

    def four(a, core):
        return np.broadcast_to(a, (*full, *core)).reshape(4, 6, *core)

    flat = [("q", four(q, (4, 3))), ("k", four(k, (5, 3))), ("v", four(v, (5, 2)))]
    w4, o4 = _saved(tmp_path, "four", "scaled", flat, ["--mask", save(tmp_path, "m4.npy", four(mask, (4, 5))), *args])
    np.testing.assert_allclose(w6.reshape(4, 6, 4, 5), w4, atol=1e-6)
    np.testing.assert_allclose(o6.reshape(4, 6, 4, 2), o4, atol=1e-5)


def test_high_rank_multihead_mask_without_the_head_axis(tmp_path):
    lead = (2, 1, 2, 1)
    query, value = normal(*lead, 4, 6), normal(1, 2, 1, 2, 5, 6)
    mask = RNG.random((2, 2, 2, 2, 4, 5)) > 0.3
    mask[..., 1] = True
    w6, o6 = _saved(tmp_path, "six", "multihead", [("q", query), ("v", value)],
                    ["--heads", "2", "--mask", save(tmp_path, "m.npy", mask)])
    full = (2, 2, 2, 2)

    def four(a, core):
        return np.broadcast_to(a, (*full, *core)).reshape(4, 4, *core)

    w4, o4 = _saved(tmp_path, "four", "multihead", [("q", four(query, (4, 6))), ("v", four(value, (5, 6)))],
                    ["--heads", "2", "--mask", save(tmp_path, "m4.npy", four(mask, (4, 5)))])
    np.testing.assert_allclose(w6.reshape(4, 4, 2, 4, 5), w4, atol=1e-6)
    np.testing.assert_allclose(o6.reshape(4, 4, 4, 6), o4, atol=1e-5)


def test_high_rank_in_blocks_of_rows(tmp_path):
    """A 7-D run too large for --max-memory runs in row blocks; each block is folded too."""
    q, k, v = normal(1, 2, 1, 2, 2, 160, 8), normal(2, 1, 2, 1, 1, 200, 8), normal(2, 1, 2, 1, 1, 200, 4)
    files = [save(tmp_path, n, a) for n, a in (("q.npy", q), ("k.npy", k), ("v.npy", v))]
    blocked, dense = tmp_path / "blocked.npy", tmp_path / "dense.npy"
    r = run("scaled", *files, "--max-memory", "1M", "--save-weights", blocked, "--no-table")
    assert r.exit_code == 0, r.stderr
    assert "blocks of" in r.stderr
    r = run("scaled", *files, "--save-weights", dense, "--quiet")
    assert r.exit_code == 0, r.stderr
    assert np.load(blocked).shape == (2, 2, 2, 2, 2, 160, 200)
    np.testing.assert_allclose(np.load(blocked), np.load(dense), atol=1e-6)


# ----------------------------------------------------------------------------------------------
# 5. Text is inert: the helper


@pytest.mark.parametrize("raw, shown", [
    ("a\x1b[31mred", "a\\x1b[31mred"),
    ("cr\rhere", "cr\\rhere"),
    ("bell\x07", "bell\\x07"),
    ("back\x08space", "back\\x08space"),
    ("tab\tnew\nline", "tab\\tnew\\nline"),
    ("del\x7f c1\x9b", "del\\x7f c1\\x9b"),
    ("\u202eevil", "\\u202eevil"),
    ("iso\u2066late", "iso\\u2066late"),
    ("file\udcff", "file\\udcff"),  # an undecodable byte of a file name
    ("[bold]x :smile: $x^2$", "[bold]x :smile: $x^2$"),  # not changed here: rich and matplotlib are told
    ("ünïcödé 你好 😀", "ünïcödé 你好 😀"),
])
def test_visible(raw, shown):
    assert inert.visible(raw) == shown
    assert not raw_controls(inert.visible(raw))


def test_messages_keep_their_line_breaks_and_their_end():
    assert inert.message("one\ntwo\x1b") == "one\ntwo\\x1b"
    long = "start " + "x" * 100_000 + " use --dtype float64."
    shown = inert.message(long)
    assert len(shown) <= inert.MESSAGE_WIDTH + 1 and shown.startswith("start") and shown.endswith("float64.")


def test_a_megabyte_label_is_shortened_without_reading_it():
    label = "\x1b" + "a" * 2**20
    start = time.perf_counter()
    shown = inert.label(label)
    assert time.perf_counter() - start < 0.05  # a prefix only
    assert len(shown) == inert.LABEL_WIDTH and shown.startswith("\\x1b") and shown.endswith(inert.ELLIPSIS)
    assert inert.label("short") == "short"


# ----------------------------------------------------------------------------------------------
# 5. Tables, JSON and messages

HOSTILE_LABELS = ["a\x1b[31mred\x1b[0m", "b:smile:", "[bold red]c", "cr\rx", "bell\x07", "$\\frac{1}{2}$",
                  "\u202eevil", "c1\x9b2J", "back\x08"]


@pytest.fixture
def labelled(tmp_path):
    n = len(HOSTILE_LABELS)
    files = [save(tmp_path, "q.npy", normal(n, 3)), save(tmp_path, "k.npy", normal(n, 3)),
             save(tmp_path, "v.npy", normal(n, 2))]
    labels = tmp_path / "labels.json"
    labels.write_text(json.dumps(HOSTILE_LABELS))
    return files, labels


def test_labels_print_literally_in_tables(labelled):
    files, labels = labelled
    r = run("scaled", *files, "--labels", labels, "--max-cols", "20")
    assert r.exit_code == 0, r.stderr
    out = r.stdout
    assert not raw_controls(out) and not raw_controls(r.stderr)
    assert ":smile:" in out and "😄" not in out  # emoji codes stay codes
    assert "[bold red]c" in out  # markup stays text
    for shown in ("a\\x1b[31mre", "cr\\rx", "bell\\x07", "c1\\x9b2J", "back\\x08", "\\u202eevil", "$\\frac{1}{2"):
        assert shown in out, shown  # row labels: made visible, shortened to 12 characters


def test_labels_in_json_are_the_labels_themselves(labelled):
    files, labels = labelled
    r = run("scaled", *files, "--labels", labels, "--json")
    assert r.exit_code == 0, r.stderr
    assert not raw_controls(r.stdout)  # JSON escapes them
    assert json.loads(r.stdout)["labels"]["q"] == HOSTILE_LABELS


def test_a_megabyte_label_in_a_table(tmp_path):
    files = [save(tmp_path, "q.npy", normal(3, 3)), save(tmp_path, "k.npy", normal(3, 3)),
             save(tmp_path, "v.npy", normal(3, 2))]
    big = "\x1b" + "x" * 2**20
    (tmp_path / "labels.txt").write_text(f"{big}\nb\nc\n")
    r = run("scaled", *files, "--labels", tmp_path / "labels.txt")
    assert r.exit_code == 0, r.stderr
    assert len(r.stdout) < 20_000 and not raw_controls(r.stdout)
    assert "\\x1bxxx" in r.stdout and inert.ELLIPSIS in r.stdout


def test_bundle_labels_are_inert(tmp_path):
    n = len(HOSTILE_LABELS)
    np.savez(tmp_path / "b.npz", q=normal(n, 3), k=normal(n, 3), v=normal(n, 2),
             q_labels=np.array(HOSTILE_LABELS), k_labels=np.array(HOSTILE_LABELS))
    r = run("scaled", tmp_path / "b.npz", "--max-cols", "20")
    assert r.exit_code == 0, r.stderr
    assert not raw_controls(r.stdout) and ":smile:" in r.stdout and "[bold red]c" in r.stdout


@pytest.mark.parametrize("name", ["\x1b[31mq.npy", "[bold]q.npy", "cr\rq.npy", "bell\x07q.npy", "\u202eq.npy",
                                  "c1\x9bq.npy", "x :smile: q.npy"])
def test_file_names_in_error_messages_are_inert(tmp_path, name):
    path = save(tmp_path, name, normal(4, 7))  # d = 7 does not match K
    files = [path, save(tmp_path, "k.npy", normal(5, 3)), save(tmp_path, "v.npy", normal(5, 2))]
    r = run("scaled", *files)
    assert r.exit_code == 1, r.stderr
    assert not raw_controls(r.stderr), r.stderr
    assert "Traceback" not in r.stderr and "internal error" not in r.stderr
    assert inert.visible(name) in r.stderr, r.stderr  # the name, as written: markup and emoji codes too


def test_file_names_in_overflow_messages_are_inert(tmp_path):
    name = "\x1b]0;pwned\x07[bold]q.npy"
    files = [save(tmp_path, name, np.full((4, 3), 1e20, np.float32)),
             save(tmp_path, "k.npy", np.full((5, 3), 1e20, np.float32)), save(tmp_path, "v.npy", normal(5, 2))]
    r = run("dot", *files)
    assert r.exit_code == 1
    assert not raw_controls(r.stderr) and "\\x1b]0;pwned\\x07[bold]q.npy" in r.stderr


def test_table_titles_are_inert():
    from rich.console import Console

    from attnviz.render.table import stats_table, weights_table
    from attnviz.stats import row_stats

    w = np.full((2, 2), 0.5)
    console = Console(width=100, record=True, file=open(os.devnull, "w"))  # noqa: SIM115
    console.print(weights_table(w, q_labels=["[red]x", ":smile:"], k_labels=["\x1b[1m", "$y$"],
                                title="weights of \x1b[2J[bold]evil.npy :smile:"))
    console.print(stats_table(row_stats(w, None), q_labels=["[red]x", ":smile:"], k_labels=["\x1b[1m", "$y$"],
                              title="\u202estats"))
    text = console.export_text()
    assert not raw_controls(text)
    flat = " ".join(text.split())  # the title wraps
    assert "\\x1b[2J[bold]evil.npy :smile:" in flat and "[red]x" in text and ":smile:" in text
    assert "\\u202estats" in text


# ----------------------------------------------------------------------------------------------
# 5. Figures


def test_figure_text_never_goes_through_mathtext(tmp_path):
    from attnviz.render.heatmap import heatmap_figure, save_figure

    labels = ["$\\frac{1}{$", "$x^2$", "a" * 2**20, "\x1b[31mred"]
    w = np.full((4, 4), 0.25)
    fig = heatmap_figure(w, title="$\\unbalanced{ \x1b title", q_labels=labels, k_labels=labels)
    save_figure(fig, tmp_path / "f.png")  # invalid mathtext would raise while drawing
    ax = fig.axes[0]
    ticks = [t.get_text() for t in ax.get_yticklabels()]
    assert ticks[:2] == ["$\\frac{1}{$", "$x^2$"] and len(ticks[2]) == inert.LABEL_WIDTH and ticks[3] == "\\x1b[31mred"
    assert all(not t.get_parse_math() for t in ax.get_yticklabels() + ax.get_xticklabels())
    assert not fig._suptitle.get_parse_math() and "\\x1b" in fig._suptitle.get_text()


# A real process drawing hostile labels from a labels file (exotic scripts, mathtext, ESC, a 1 MB label):
# tests/test_hostile_corpus.py, case labels-file-glyphs-mathtext-1MB.

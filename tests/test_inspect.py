"""`inspect` and `compare`: constructed heads with known statistics and tags, every layout, checks that
pass on good weights and exit 3 on bad ones, comparisons with known figures, and no TensorFlow."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
from typer.testing import CliRunner

from attnviz.cli import app
from attnviz.inspection.compare import js_divergence
from attnviz.inspection.heads import head_statistics
from attnviz.inspection.weights import load_weights
from tests.conftest import ROOT

runner = CliRunner()
L = 6


def previous_head(n=L):
    w = np.zeros((n, n))
    w[0, 0] = 1
    w[np.arange(1, n), np.arange(n - 1)] = 1
    return w


def sink_head(n=L):
    w = np.zeros((n, n))
    w[:, 0] = 1
    return w


def uniform_causal(n=L):
    w = np.tril(np.ones((n, n)))
    return w / w.sum(-1, keepdims=True)


def model(tmp_path):
    layer0 = np.stack([previous_head(), sink_head(), uniform_causal()])[None]  # [batch 1, heads 3, L, L]
    layer1 = np.stack([np.eye(L), uniform_causal(), previous_head()])[None]
    np.savez(tmp_path / "attn.npz", layer0, layer1)  # as numpy.savez(f, *output_attentions)
    (tmp_path / "tokens.txt").write_text("\n".join(["<s>", "the", "cat", "sat", "down", "."]) + "\n")
    return tmp_path / "attn.npz"


def invoke(*args, input=None):
    return runner.invoke(app, [str(a) for a in args], input=input)


def test_constructed_heads_get_their_tags_and_values(tmp_path):
    doc = json.loads(invoke("inspect", model(tmp_path), "--json").stdout)
    heads = {(h["layer"], h["head"]): h for h in doc["head_stats"]}
    assert doc["weights_shape"] == [2, 1, 3, L, L] and doc["layers_from_keys"] == ["arr_0", "arr_1"]
    prev, sink, uni, diag = heads[0, 0], heads[0, 1], heads[0, 2], heads[1, 0]
    assert prev["tag"] == "previous-token" and prev["previous"] == 1.0 and prev["entropy"] == 0.0
    assert prev["distance"] == pytest.approx(5 / 6)  # rows 1..5 at distance 1, row 0 at 0
    assert sink["tag"] == "sink" and sink["first"] == 1.0
    assert sink["distance"] == pytest.approx(np.arange(L).mean())
    assert uni["tag"] == "broad" and uni["entropy_norm"] == pytest.approx(1.0)
    assert uni["entropy"] == pytest.approx(np.mean([np.log(i + 1) for i in range(L)]))
    assert diag["tag"] == "diagonal" and diag["diagonal"] == 1.0 and diag["distance"] == 0.0
    assert uni["max"] == pytest.approx(np.mean([1 / (i + 1) for i in range(L)]))


@pytest.mark.parametrize("shape, layout, expected", [
    ((L, L), None, (1, 1, 1, L, L)),
    ((4, L, L), None, (1, 1, 4, L, L)),
    ((2, 4, L, L), None, (1, 2, 4, L, L)),
    ((3, 2, 4, L, L), None, (3, 2, 4, L, L)),
    ((2, L, L), "batch,q,k", (1, 2, 1, L, L)),
    ((4, 2, L, L), "head,batch,q,k", (1, 2, 4, L, L)),
])
def test_layouts(tmp_path, shape, layout, expected):
    w = np.random.default_rng(0).dirichlet(np.ones(L), size=shape[:-1])
    np.save(tmp_path / "w.npy", w)
    got = load_weights(str(tmp_path / "w.npy"), layout)
    assert got.shape == expected
    if layout == "head,batch,q,k":
        np.testing.assert_array_equal(got.data[0, 1, 3], w[3, 1])


def test_named_keys_are_ordered_naturally(tmp_path):
    maps = {f"layer{i}": np.full((1, 1, 2, 2), i / 10 + 0.25) for i in (10, 2, 1)}
    np.savez(tmp_path / "w.npz", **maps)
    got = load_weights(str(tmp_path / "w.npz"))
    assert got.keys == ["layer1", "layer2", "layer10"] and got.data[2, 0, 0, 0, 0] == pytest.approx(1.25)


def test_bad_layouts_and_shapes(tmp_path):
    np.save(tmp_path / "w6.npy", np.ones((1, 1, 1, 1, 2, 2)))
    np.savez(tmp_path / "ragged.npz", a=np.ones((2, 2)), b=np.ones((3, 3)))
    r = invoke("inspect", tmp_path / "w6.npy")
    assert r.exit_code == 1 and "6 dimensions" in r.stderr
    r = invoke("inspect", tmp_path / "ragged.npz")
    assert r.exit_code == 1 and "different shapes" in r.stderr
    np.save(tmp_path / "w.npy", np.ones((2, 2, 2)) / 2)
    r = invoke("inspect", tmp_path / "w.npy", "--layout", "q,k,batch")
    assert r.exit_code == 2 and "ending with q,k" in r.stderr
    r = invoke("inspect", tmp_path / "w.npy", "--head", "5")
    assert r.exit_code == 2 and "--head 5" in r.stderr


def test_tables_labels_and_pngs(tmp_path):
    attn = model(tmp_path)
    r = invoke("inspect", attn, "--labels", tmp_path / "tokens.txt", "--layer", "1", "--head", "2",
               "--png", tmp_path / "grid.png", "--map-png", tmp_path / "map.png", "--stats-png", tmp_path / "st.png",
               "--sort", "previous", "--top", "2")
    assert r.exit_code == 0, r.stderr
    text = " ".join(r.stdout.split())
    lines = r.stdout.splitlines()
    at = next(i for i, line in enumerate(lines) if line.split()[:2] == ["layer", "head"])
    shown = [line.split() for line in lines[at + 2:at + 4]]
    assert [row[-1] for row in shown] == ["previous-token", "previous-token"]  # --top 2 by previous
    assert not lines[at + 4].strip()
    assert "weights of layer 1, batch 0, head 2" in text and "down" in text
    for name in ("grid.png", "map.png", "st.png"):
        assert (tmp_path / name).stat().st_size > 5000


def test_save_maps_writes_the_maps_inspected(tmp_path):
    """--save-maps: the weights as read, [layers, batch, heads, Lq, Lk], in each format, read back by inspect;
    a failed run leaves none; a name of another format is a usage error."""
    attn = model(tmp_path)
    stacked = np.stack([np.load(attn)[k] for k in ("arr_0", "arr_1")])  # [2 layers, 1, 3, L, L]
    for name in ("maps.npy", "maps.npz", "maps.safetensors"):
        r = invoke("inspect", attn, "--save-maps", tmp_path / name, "--json")
        assert r.exit_code == 0, r.stderr
        assert json.loads(r.stdout)["files"]["maps"] == str(tmp_path / name)
        assert f"saved maps to {tmp_path / name}" in r.stderr
        saved = load_weights(str(tmp_path / name))
        assert saved.file_shape == (2, 1, 3, L, L)
        np.testing.assert_array_equal(saved.data, stacked)
    np.save(tmp_path / "heads.npy", stacked[0, 0])  # [heads, L, L]: saved as [1, 1, heads, L, L]
    assert invoke("inspect", tmp_path / "heads.npy", "--save-maps", tmp_path / "h.npy", "-q").exit_code == 0
    assert np.load(tmp_path / "h.npy").shape == (1, 1, 3, L, L)
    r = invoke("inspect", attn, "--save-maps", tmp_path / "maps.pt")
    assert r.exit_code == 2 and ".npy, .npz or .safetensors" in r.stderr and not (tmp_path / "maps.pt").exists()
    r = invoke("inspect", attn, "--save-maps", tmp_path / "new.npy", "--layer", "7")
    assert r.exit_code == 2 and not (tmp_path / "new.npy").exists()
    r = invoke("inspect", attn, "--save-maps", attn)
    assert r.exit_code == 2 and "input" in r.stderr


def test_checks_pass_and_fail_with_exit_3(tmp_path):
    good = uniform_causal()
    np.save(tmp_path / "good.npy", good)
    mask = np.tril(np.ones((L, L), np.int8))
    np.save(tmp_path / "mask.npy", mask)
    r = invoke("inspect", tmp_path / "good.npy", "--check-rows", "--check-causal", "--check-finite",
               "--check-mask", tmp_path / "mask.npy", "--no-table")
    assert r.exit_code == 0, r.stderr
    assert r.stderr.count("passed") == 4

    off = good.copy()
    off[3] *= 0.9
    np.save(tmp_path / "rows.npy", off)
    r = invoke("inspect", tmp_path / "rows.npy", "--check-rows", "--no-table")
    assert r.exit_code == 3 and "check-rows: FAILED, 1 rows" in r.stderr and "row 3 sums to 0.9" in r.stderr

    leak = good.copy()
    leak[1, 4] = 0.25
    np.save(tmp_path / "leak.npy", leak)
    r = invoke("inspect", tmp_path / "leak.npy", "--check-causal", "--no-table")
    assert r.exit_code == 3 and "row 1, column 4 has weight 0.25" in r.stderr
    r = invoke("inspect", tmp_path / "leak.npy", "--check-mask", tmp_path / "mask.npy", "--no-table", "--json")
    assert r.exit_code == 3
    assert json.loads(r.stdout)["checks"][0]["index"] == [0, 0, 0, 1, 4]
    r = invoke("inspect", tmp_path / "leak.npy", "--check-mask", tmp_path / "mask.npy", "--mask-convention", "block",
               "--no-table")
    assert r.exit_code == 3  # block: the lower triangle is forbidden now

    nan = good.copy()
    nan[2, 0] = np.nan
    np.save(tmp_path / "nan.npy", nan)
    r = invoke("inspect", tmp_path / "nan.npy", "--check-finite", "--no-table")
    assert r.exit_code == 3 and "row 2, column 0 is nan" in r.stderr
    r = invoke("inspect", tmp_path / "nan.npy")
    assert r.exit_code == 1 and "--check-finite" in r.stderr


def test_compare_identical_and_known_differences(tmp_path):
    a = np.stack([uniform_causal(), previous_head()])
    np.save(tmp_path / "a.npy", a)
    doc = json.loads(invoke("compare", tmp_path / "a.npy", tmp_path / "a.npy", "--json").stdout)
    assert doc["max_abs_diff"] == 0 and doc["mean_abs_diff"] == 0 and doc["argmax_agreement"] == 1
    assert doc["js_divergence"]["max"] == 0

    b = a.copy()
    b[1, 4] = 0
    b[1, 4, 4] = 1  # head 1, row 4 now attends to itself instead of the previous token
    np.save(tmp_path / "b.npy", b)
    r = invoke("compare", tmp_path / "a.npy", tmp_path / "b.npy", "--json", "--png", tmp_path / "diff.png")
    doc = json.loads(r.stdout)
    assert doc["max_abs_diff"] == 1.0
    assert doc["mean_abs_diff"] == pytest.approx(2 / a.size)
    assert doc["argmax_agreement"] == pytest.approx(1 - 1 / (2 * L))
    assert doc["worst_rows"][0]["index"] == [0, 0, 1, 4] and doc["worst_rows"][0]["js"] == pytest.approx(np.log(2))
    assert (tmp_path / "diff.png").stat().st_size > 5000
    r = invoke("compare", tmp_path / "a.npy", tmp_path / "b.npy", "--atol", "0.5", "--no-table")
    assert r.exit_code == 3 and "tolerance: FAILED, 2 entries" in r.stderr
    r = invoke("compare", tmp_path / "a.npy", tmp_path / "b.npy", "--atol", "1.0")
    assert r.exit_code == 0 and "rows with the same argmax" in r.stdout
    np.save(tmp_path / "c.npy", a[:1])
    r = invoke("compare", tmp_path / "a.npy", tmp_path / "c.npy")
    assert r.exit_code == 1 and "same shape" in r.stderr


def test_js_divergence_values():
    assert js_divergence(np.array([1.0, 0]), np.array([0, 1.0])) == pytest.approx(np.log(2))
    p, q = np.array([0.5, 0.5]), np.array([0.9, 0.1])
    m = (p + q) / 2
    expected = 0.5 * (p * np.log(p / m)).sum() + 0.5 * (q * np.log(q / m)).sum()
    assert js_divergence(p, q) == pytest.approx(expected)


def test_head_statistics_of_a_non_causal_uniform_head():
    w = np.full((1, 1, 1, 4, 4), 0.25)
    stats = head_statistics(w)
    assert stats["entropy_norm"][0, 0] == pytest.approx(1.0) and stats["tag"][0, 0] == "broad"
    assert stats["distance"][0, 0] == pytest.approx(np.abs(np.arange(4)[:, None] - np.arange(4)).mean())


def test_inspect_imports_no_tensorflow(tmp_path):
    attn = model(tmp_path)
    code = ("import sys; from attnviz.cli import app\n"
            f"try:\n    app(['inspect', {str(attn)!r}, '--json', '--png', {str(tmp_path / 'g.png')!r}])\n"
            "except SystemExit:\n    pass\n"
            "print('TF', 'tensorflow' in sys.modules, file=sys.stderr)")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert "TF False" in out.stderr, out.stderr


def test_blocked_head_statistics_and_checks_equal_the_whole_array_ones():
    from attnviz.inspection.checks import check_finite, check_masked, check_rows
    from attnviz.inspection.heads import head_statistics_blocked, is_causal
    from attnviz.stats import row_stats

    rng = np.random.default_rng(3)
    w = rng.dirichlet(np.ones(9), size=(2, 2, 3, 7)) * np.tril(np.ones((7, 9)), 2)
    w = w / w.sum(-1, keepdims=True)
    whole = head_statistics(w, chunk=10**9)
    blocked = head_statistics_blocked(w, None, chunk=20)  # 2 rows a block
    for name in whole:
        if name == "tag":
            assert (whole[name] == blocked[name]).all()
        else:
            np.testing.assert_allclose(blocked[name], whole[name], atol=1e-12, err_msg=name)
    keep = rng.random((7, 9)) > 0.2
    np.testing.assert_allclose(head_statistics_blocked(w, keep, chunk=20)["entropy_norm"],
                               head_statistics(w, keep, chunk=10**9)["entropy_norm"], atol=1e-12)
    assert is_causal(np.tril(np.ones((1, 1, 1, 5, 5))), chunk=5) and not is_causal(w, chunk=20)
    bad = w.copy()
    bad[1, 0, 2, 5, 1] = np.nan
    assert check_finite(bad, chunk=20).detail["index"] == [1, 0, 2, 5, 1]
    leak = check_masked(w, np.tril(np.ones((7, 9), bool)), 1e-6, "check-causal", chunk=20)
    ref = check_masked(w, np.tril(np.ones((7, 9), bool)), 1e-6, "check-causal", chunk=10**9)
    assert leak.failures == ref.failures and leak.detail == ref.detail
    assert check_rows(w, 1e-6).passed
    a, b = row_stats(w, chunk=40), row_stats(w, chunk=10**9)
    for name in ("entropy", "max", "argmax", "top_index", "row_sum"):
        np.testing.assert_allclose(getattr(a, name), getattr(b, name), atol=1e-12)


@pytest.mark.parametrize("count", [1, 2, 3])
def test_head_statistics_in_threads_are_the_same_to_the_last_bit(monkeypatch, count):
    """Blocks worked on in threads are added up in the same order as one at a time: identical sums."""
    from attnviz import threads
    from attnviz.inspection import heads

    rng = np.random.default_rng(5)
    w = rng.dirichlet(np.ones(11), size=(3, 1, 4, 10))
    keep = rng.random((10, 11)) > 0.2
    monkeypatch.setattr(threads, "THREADS", 1)
    alone = [heads.head_statistics_blocked(w, k, chunk=c) for k in (None, keep) for c in (20, 200)]
    monkeypatch.setattr(threads, "THREADS", count)
    together = [heads.head_statistics_blocked(w, k, chunk=c) for k in (None, keep) for c in (20, 200)]
    for a, b in zip(alone, together):
        assert a.keys() == b.keys()
        for name in a:
            np.testing.assert_array_equal(a[name], b[name], err_msg=name)


def test_inspect_reads_npy_memory_mapped(tmp_path):
    w = uniform_causal(64)[None]
    np.save(tmp_path / "w.npy", w)
    loaded = load_weights(str(tmp_path / "w.npy"))
    assert isinstance(loaded.data.base, np.memmap) or isinstance(loaded.data, np.memmap)


def head_stats_oracle(w: np.ndarray) -> dict[str, np.ndarray]:
    """The head statistics of unmasked weights ``[L, B, H, Lq, Lk]``, row by row in float64 with plain Python
    loops (the definitions in ``head_statistics``' docstring)."""
    layers, batches, heads, lq, lk = w.shape
    w = w.astype(np.float64)
    causal = all(w[idx][i, j] == 0 for idx in np.ndindex(layers, batches, heads) for i in range(lq)
                 for j in range(i + 1, lk))
    out = {name: np.zeros((layers, heads)) for name in
           ("entropy", "entropy_norm", "distance", "diagonal", "previous", "first", "last", "max")}
    for li, hi in np.ndindex(layers, heads):
        rows = [(bi, i) for bi in range(batches) for i in range(lq)]
        acc = {name: [] for name in out}
        for bi, i in rows:
            row = w[li, bi, hi, i]
            h = -sum(p * np.log(p) for p in row if p > 0)
            n = min(i + 1, lk) if causal else lk
            acc["entropy"].append(h)
            if n > 1:
                acc["entropy_norm"].append(h / np.log(n))
            acc["distance"].append(sum(p * abs(i - j) for j, p in enumerate(row)))
            acc["diagonal"].append(row[i] if i < lk else 0.0)
            acc["last"].append(row[lk - 1])
            acc["max"].append(row.max())
            if i >= 1:
                acc["previous"].append(row[i - 1])
                acc["first"].append(row[0])
        for name in out:
            out[name][li, hi] = np.mean(acc[name])
    return out


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("chunk", [50, 2**22])  # blocks of rows of one head (in threads), or all at once
def test_head_statistics_of_float32_weights_agree_with_a_float64_oracle(causal, chunk):
    """float32 weights are summarised in float32 a row at a time and added up in float64: the statistics agree
    with the float64 oracle to float32 tolerance, exact zeros included (a causal map's upper triangle, a
    head that never looks at some keys)."""
    rng = np.random.default_rng(11)
    n = 24
    scores = rng.normal(size=(2, 2, 3, n, n)) * 3
    scores[0, :, 1, :, 5:9] = -np.inf  # keys this head never looks at: exact zeros
    if causal:
        scores = np.where(np.tril(np.ones((n, n), bool)), scores, -np.inf)
    w = np.exp(scores - scores.max(-1, keepdims=True))
    w = (w / w.sum(-1, keepdims=True)).astype(np.float32)
    got = head_statistics(w, chunk=chunk)
    expected = head_stats_oracle(w)
    assert bool(got["causal"]) == causal
    for name, value in expected.items():
        np.testing.assert_allclose(got[name], value, rtol=2e-6, atol=1e-6, err_msg=name)


def test_the_picture_drawn_while_the_statistics_are_summed_never_hides_a_bad_input(tmp_path):
    """--png is drawn while the head statistics are summed: weights with NaN or infinity still end in the one
    clear line (exit 1) or the failed check (--check-finite, exit 3), and no picture is left."""
    w = np.full((2, 1, 2, 6, 6), 1 / 6, np.float32)
    w[1, 0, 1, 2, 3] = np.nan
    w[0, 0, 0, 4, 4] = np.inf
    np.save(tmp_path / "bad.npy", w)
    r = invoke("inspect", tmp_path / "bad.npy", "--png", tmp_path / "g.png")
    assert r.exit_code == 1 and r.stderr.count("\n") == 1 and "non-finite value(s)" in r.stderr, r.stderr
    r = invoke("inspect", tmp_path / "bad.npy", "--png", tmp_path / "g.png", "--check-finite")
    assert r.exit_code == 3 and "Traceback" not in r.stderr, r.stderr
    assert not list(tmp_path.glob("*.png")) and not list(tmp_path.glob(".*"))


def test_what_is_drawn_meanwhile_fails_only_on_finite_weights(tmp_path):
    """``analyse``'s ``meanwhile`` runs beside the head pass: its result is handed over; its error is raised
    once the weights are known to be finite, and NaN in the weights is reported instead of it."""
    from attnviz.errors import InputError
    from attnviz.inspection import inspecting
    from attnviz.inspection.options import InspectOptions

    good = np.full((1, 1, 2, 4, 4), 0.25, np.float32)
    np.save(tmp_path / "good.npy", good)
    bad = good.copy()
    bad[0, 0, 1, 1, 1] = np.nan
    np.save(tmp_path / "bad.npy", bad)

    def opened(name):
        return inspecting.prepare(InspectOptions(weights=str(tmp_path / name)))

    result = inspecting.analyse(opened("good.npy"), lambda: "drawn")
    assert result.meanwhile == "drawn" and result.stats["entropy"][0, 0] == pytest.approx(np.log(4))

    def broken():
        raise ValueError("a picture of NaN")

    with pytest.raises(ValueError, match="a picture of NaN"):
        inspecting.analyse(opened("good.npy"), broken)
    with pytest.raises(InputError, match="non-finite"):
        inspecting.analyse(opened("bad.npy"), broken)


def test_quick_switching_is_put_back_once_the_last_user_ends():
    """The shorter switch interval while the head pass runs beside a figure (``threads.quick_switching``) is in
    force for as long as one user holds it, nested or from several threads, and Python's own comes back after."""
    import threading

    from attnviz.threads import QUICK_SWITCH, quick_switching

    before = sys.getswitchinterval()
    assert before > QUICK_SWITCH
    started, release = threading.Barrier(3), threading.Event()

    def hold():
        with quick_switching():
            started.wait()
            release.wait()

    threads = [threading.Thread(target=hold) for _ in range(2)]
    for t in threads:
        t.start()
    started.wait()
    with quick_switching():
        with quick_switching():
            assert sys.getswitchinterval() == pytest.approx(QUICK_SWITCH)
        release.set()
        for t in threads:
            t.join()
        assert sys.getswitchinterval() == pytest.approx(QUICK_SWITCH)  # this one still holds it
    assert sys.getswitchinterval() == before

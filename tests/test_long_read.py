"""Large exact captures read in bounded memory: a capture's sites as one memory-mapped array, and every pass
over it (head statistics, token scores, the grid's blocks, the viewer's rollout) giving the same numbers read
a block at a time as read whole. Small inputs, with small blocks forced."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import numpy as np
import pytest

from attnviz.capturefile import write_safetensors


def _weights(rng: np.random.Generator, layers: int, batches: int, heads: int, n: int, real: np.ndarray) -> np.ndarray:
    """Causal distributions over the real keys of each entry ([L, B, H, n, n] float32), padded rows zero."""
    scores = rng.normal(size=(layers, batches, heads, n, n)) * 2
    keep = np.tril(np.ones((n, n), bool))[None, None, None] & real[None, :, None, None, :] & \
        real[None, :, None, :, None]
    e = np.where(keep, np.exp(scores), 0.0)
    sums = e.sum(-1, keepdims=True)
    return np.divide(e, sums, out=np.zeros_like(e), where=sums > 0).astype(np.float32)


def _capture(path: Path, w: np.ndarray, real: np.ndarray, tokens: list[list[str]], extra_on: int | None = None) -> None:
    """A capture file of weights ``w [L, B, H, n, n]`` with its masks, written as a capture streams them (a site's
    arrays one after the other); ``extra_on``: that site holds one more array (the sites are not evenly spaced)."""
    n = w.shape[-1]
    mask = (np.tril(np.ones((n, n), bool))[None, None] & real[:, None, None, :])
    arrays = []
    for li in range(w.shape[0]):
        arrays.append((f"layers.{li}.weights", np.dtype(np.float32), w[li].shape, lambda a=w[li]: a))
        arrays.append((f"layers.{li}.mask", np.dtype(bool), mask.shape, lambda a=mask: a))
        if li == extra_on:
            arrays.append((f"layers.{li}.sinks", np.dtype(np.float32), (w.shape[2],),
                           lambda h=w.shape[2]: np.zeros(h, np.float32)))
    meta = {"format": 1, "tokens": tokens, "model_type": "llama", "kinds": ["layers"],
            "sites": {f"layers.{li}": {"kind": "layers", "layer": li} for li in range(w.shape[0])}}
    write_safetensors(path, arrays, meta)


@pytest.fixture
def capture(tmp_path: Path) -> tuple[Path, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    n = 24
    real = np.ones((2, n), bool)
    real[1, :5] = False  # entry 1 is padded on the left
    w = _weights(rng, 3, 2, 2, n, real)
    words = [str(t) for t in rng.integers(0, 4, n)]  # few words: most tokens repeat (token scores' dense path)
    tokens = [words, ["<pad>"] * 5 + words[5:]]
    path = tmp_path / "run.safetensors"
    _capture(path, w, real, tokens)
    return path, w, real


def _mapped(a: np.ndarray) -> bool:
    import mmap

    base = a
    while base is not None and not isinstance(base, mmap.mmap):
        base = getattr(base, "base", None)
    return base is not None


def test_a_captures_sites_are_read_as_one_mapped_array(capture: tuple[Path, np.ndarray, np.ndarray],
                                                       tmp_path: Path) -> None:
    from attnviz.inspection.weights import capture_mask, load_weights

    path, w, real = capture
    got = load_weights(str(path))
    assert got.shape == w.shape and _mapped(got.data) and not got.data.flags.owndata
    np.testing.assert_array_equal(got.data, w)
    keep = capture_mask(got)
    assert keep is not None and keep.shape == (1, 2, 1, 24, 24) and _mapped(keep)  # the same for every site: one
    # sites at uneven distances: stacked in memory, as before, with the same values
    uneven = tmp_path / "uneven.safetensors"
    _capture(uneven, w, real, [["a"] * 24] * 2, extra_on=0)
    stacked = load_weights(str(uneven))
    assert stacked.data.flags.owndata
    np.testing.assert_array_equal(stacked.data, w)


def test_stacked_view_refuses_what_it_cannot_view(tmp_path: Path) -> None:
    from attnviz.inspection.weights import stacked_view

    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    assert stacked_view([a, a], np.float32) is None  # in memory, not a mapped file
    np.save(tmp_path / "x.npy", a)
    mapped = np.load(tmp_path / "x.npy", mmap_mode="r")
    assert stacked_view([mapped, mapped.T.copy()], np.float32) is None
    assert stacked_view([mapped[:, :2], mapped[:, 2:]], np.float32) is None  # not C-ordered
    one = stacked_view([mapped], np.float32)
    assert one is not None and one.shape == (1, 3, 4) and _mapped(one)
    np.testing.assert_array_equal(one[0], a)
    rows = stacked_view([mapped[0], mapped[1], mapped[2]], np.float32)  # evenly spaced rows of one file
    assert rows is not None and _mapped(rows)
    np.testing.assert_array_equal(rows, a)
    assert stacked_view([mapped[0], mapped[2], mapped[1]], np.float32) is None  # not in order


def test_head_pass_the_same_in_blocks_with_few_grids_kept(capture: tuple[Path, np.ndarray, np.ndarray],
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    from attnviz.inspection import heads
    from attnviz.inspection.masks import read_masks
    from attnviz.inspection.options import MaskOptions
    from attnviz.inspection.weights import load_weights

    path, w, _ = capture
    got = load_weights(str(path))
    masks, _ = read_masks(MaskOptions(), got, [])
    kw = dict(real_rows=masks.real_rows, real_keys=masks.real_keys, stored="float32")
    whole = heads.head_pass(np.array(w), masks.keep, chunk=10**9, **kw)
    monkeypatch.setattr(heads, "GRIDS_HELD", 1)  # every block makes its grids again
    blocked = heads.head_pass(got.data, masks.keep, chunk=50, **kw)  # 2 rows a block, from the mapped file
    for name in heads.HEAD_STATS + ("rows", "off_rows"):
        np.testing.assert_allclose(blocked.stats[name], whole.stats[name], rtol=1e-12, atol=1e-12, err_msg=name)
    np.testing.assert_allclose(blocked.columns, whole.columns, rtol=1e-6)  # float32 sums of a block's rows
    # and against a NumPy oracle: the mean entropy of the real rows of layer 1, head 0, both entries
    rows = [w[1, b, 0, i] for b in range(2) for i in range(24) if w[1, b, 0, i].sum() > 0]
    entropy = np.mean([-(r[r > 0] * np.log(r[r > 0])).sum() for r in rows])
    assert blocked.stats["entropy"][1, 0] == pytest.approx(entropy, rel=1e-5)


def test_token_scores_read_row_by_row_equal_the_gathered_pairs(capture: tuple[Path, np.ndarray, np.ndarray],
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    from attnviz.inspection import tokens
    from attnviz.inspection.weights import load_weights

    path, w, real = capture
    data = load_weights(str(path)).data
    rows = real[None, :, None, :]
    names = [["a", "b", "a", "c", "b", "a"] * 4, ["x", "a"] * 12]
    calls = []
    dense = tokens._dense_mass
    monkeypatch.setattr(tokens, "_dense_mass", lambda *a, **k: (calls.append(1), dense(*a, **k)))
    monkeypatch.setattr(tokens, "DENSE_SHARE", 1)  # never more pairs than cells: gathered
    gathered = tokens.token_scores(data, names, rows)
    assert not calls
    monkeypatch.setattr(tokens, "DENSE_SHARE", 10**9)  # any pair: read row by row
    monkeypatch.setattr(tokens, "CHUNK", 100)
    row_by_row = tokens.token_scores(data, names, rows)
    assert calls
    for name in ("induction", "duplicate"):
        np.testing.assert_allclose(row_by_row[name], gathered[name], rtol=1e-12, atol=1e-12)
    # an oracle: the duplicate-token score of layer 0, head 1, entry 0 alone, from the [L, L] pattern
    duplicate, _ = tokens.token_patterns(names[0])
    one = tokens.token_scores(data[:, :1], names[0], rows[:, :1])
    live = duplicate.any(axis=1)
    expected = np.mean((w[0, 0, 1] * duplicate).sum(axis=1)[live])
    assert one["duplicate"][0, 1] == pytest.approx(expected, rel=1e-6)


def test_reduce_panel_the_same_a_block_of_rows_at_a_time(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from attnviz import blocks

    rng = np.random.default_rng(2)
    np.save(tmp_path / "m.npy", rng.random((101, 37)).astype(np.float32))
    data = np.load(tmp_path / "m.npy", mmap_mode="r")
    for reduce in ("mean", "max"):
        whole = blocks.reduce_panel(np.array(data), None, 4, 3, reduce)
        with monkeypatch.context() as m:
            m.setattr(blocks, "CHUNK", 200)  # 4 rows at a time
            np.testing.assert_array_equal(blocks.reduce_panel(data, None, 4, 3, reduce), whole)
        expected = getattr(np, reduce)(np.array(data)[96:100, 33:36])
        assert whole[24, 11] == pytest.approx(expected, rel=1e-6)


def test_pooled_rollout_equals_the_block_means_of_the_whole_rollout() -> None:
    from attnviz.blocks import reduce_blocks
    from attnviz.inspection.rollout import pooled_rollout, rollout

    rng = np.random.default_rng(3)
    n = 37
    w = np.tril(rng.random((3, 2, n, n)))
    w /= w.sum(-1, keepdims=True)
    for real in (None, np.arange(n) >= 5, rng.random(n) > 0.3):
        for f in (1, 4, 5):
            for heads in ("mean", "max"):
                whole = rollout(w, real=real, heads=heads, residual=0.3, start_layer=1).result
                expected = reduce_blocks(whole, None, f, f, "mean")
                got = pooled_rollout(w, f, real=real, heads=heads, residual=0.3, start_layer=1, chunk=50)
                np.testing.assert_array_equal(np.isnan(got), np.isnan(expected))
                np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-14)


def test_the_viewer_rolls_a_long_map_out_in_blocks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from attnviz.blocks import reduce_blocks
    from attnviz.cli.commands.view import view
    from attnviz.inspection import rollout as rollouts
    from attnviz.inspection.options import InspectOptions
    from attnviz.inspection.rollout import rollout
    from attnviz.render.options import FigureOptions
    from attnviz.viewer import model as viewer_model

    rng = np.random.default_rng(5)
    n = 600  # above the 512 cells a side the viewer draws: blocks of 2
    real = np.ones((1, n), bool)
    real[0, :7] = False
    w = _weights(rng, 2, 1, 2, n, real)
    path = tmp_path / "long.safetensors"
    _capture(path, w, real, [["w"] * n])
    monkeypatch.setattr(rollouts, "CHUNK", 5000)  # a few rows of a layer at a time
    viewer = view(InspectOptions(weights=str(path)), FigureOptions(), run=False)
    model = viewer.model

    async def drive() -> None:
        async with viewer.run_test(size=(100, 30)) as pilot:
            await pilot.press("r")
            await pilot.pause()
            assert model.rollout
            cells, f = model.map()
            assert f == 2 and cells.shape == (300, 300)
            whole = rollout(w[:, 0].astype(np.float64), real=real[0]).result
            expected = reduce_blocks(whole, None, 2, 2, "mean")
            np.testing.assert_array_equal(np.isnan(cells), np.isnan(expected))
            np.testing.assert_allclose(cells, expected, rtol=1e-10, atol=1e-13)
            await pilot.press("r", "q")

    asyncio.run(drive())
    assert model._rollout is None  # the whole [L, L] rollout was never made

    # --reduce max needs each cell: refused in one line where the whole map would not fit
    monkeypatch.setattr(viewer_model, "WHOLE_ROLLOUT", 1)
    viewer = view(InspectOptions(weights=str(path)), FigureOptions(reduce="max"), run=False)

    async def refused() -> None:
        async with viewer.run_test(size=(100, 30)) as pilot:
            await pilot.press("r")
            await pilot.pause()
            assert not viewer.model.rollout
            status = str(viewer.query_one("#status").render())
            assert "block means" in status and "--reduce mean" in status
            await pilot.press("q")

    asyncio.run(refused())


def test_inspect_of_a_capture_reads_the_same_numbers_as_a_dump(capture: tuple[Path, np.ndarray, np.ndarray],
                                                               tmp_path: Path) -> None:
    """The whole command on the mapped capture and on the same weights saved as one array with its mask."""
    from typer.testing import CliRunner

    from attnviz.cli import app

    path, w, real = capture
    np.save(tmp_path / "w.npy", w)
    np.save(tmp_path / "am.npy", real.astype(np.int64))
    a = CliRunner().invoke(app, ["inspect", str(path), "--json", "--png", str(tmp_path / "a.png")])
    b = CliRunner().invoke(app, ["inspect", str(tmp_path / "w.npy"), "--key-padding-mask", str(tmp_path / "am.npy"),
                                 "--json"])
    assert a.exit_code == 0 and b.exit_code == 0, a.stderr + b.stderr
    da, db = json.loads(a.stdout), json.loads(b.stdout)
    assert len(da["head_stats"]) == len(db["head_stats"]) == 6
    for one, other in zip(da["head_stats"], db["head_stats"]):
        for name in ("entropy", "max", "first", "distance", "rows"):
            assert one[name] == pytest.approx(other[name], rel=1e-9), name
    np.testing.assert_allclose(da["received"]["per_layer"], db["received"]["per_layer"], rtol=1e-9)
    assert (tmp_path / "a.png").stat().st_size > 1000


def test_rollout_of_maps_that_would_not_fit_is_refused_in_one_line(capture: tuple[Path, np.ndarray, np.ndarray],
                                                                   tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    from typer.testing import CliRunner

    from attnviz import sizes
    from attnviz.cli import app

    path, _, _ = capture
    out = tmp_path / "r.png"
    assert CliRunner().invoke(app, ["rollout", str(path), "--png", str(out), "--quiet"]).exit_code == 0
    out.unlink()
    monkeypatch.setattr(sizes, "memory_limit", lambda: 24 * 24 * 8 * 5)  # less than (2 heads + 4) maps
    r = CliRunner().invoke(app, ["rollout", str(path), "--png", str(out), "--quiet"])
    assert r.exit_code == 1 and not out.exists()
    assert len(r.stderr.strip().splitlines()) == 1 and "attnviz view" in r.stderr and "[24, 24]" in r.stderr


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_precision_captures_are_widened_into_a_mapped_file(dtype: str, tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """--weights-dtype float16 or bfloat16: a large capture's sites are widened a block at a time into a temporary
    file and mapped (here forced on a small one), the same numbers as widened in memory."""
    from attnviz.inspection import inspecting
    from attnviz.inspection import weights as weights_module
    from attnviz.inspection.options import InspectOptions
    from attnviz.inspection.weights import load_weights

    half = np.dtype(getattr(pytest.importorskip("ml_dtypes"), dtype)) if dtype == "bfloat16" else np.dtype(np.float16)
    rng = np.random.default_rng(7)
    real = np.ones((1, 20), bool)
    w = _weights(rng, 3, 1, 2, 20, real).astype(half)
    path = tmp_path / "half.safetensors"
    mask = np.tril(np.ones((20, 20), bool))[None, None]
    arrays = [(f"layers.{li}.{name}", a.dtype, a.shape, lambda a=a: a)
              for li in range(3) for name, a in (("weights", w[li]), ("mask", mask))]
    write_safetensors(path, arrays, {"format": 1, "tokens": [["t"] * 20], "kinds": ["layers"]})

    in_memory = load_weights(str(path))
    assert in_memory.data.flags.owndata and in_memory.stored_dtype == dtype
    monkeypatch.setattr(weights_module, "WIDEN_TO_DISK", 0)
    monkeypatch.setattr(weights_module, "CHUNK", 64)  # a few values at a time
    on_disk = load_weights(str(path))
    assert _mapped(on_disk.data) and not on_disk.data.flags.writeable and on_disk.stored_dtype == dtype
    np.testing.assert_array_equal(on_disk.data, w.astype(np.float32))
    a = inspecting.analyse(inspecting.prepare(InspectOptions(weights=str(path))))
    monkeypatch.setattr(weights_module, "WIDEN_TO_DISK", 2**40)
    b = inspecting.analyse(inspecting.prepare(InspectOptions(weights=str(path))))
    for name in ("entropy", "max", "distance", "first"):
        np.testing.assert_array_equal(a.stats[name], b.stats[name])
    assert a.atol == b.atol > 1e-5  # the tolerance of the dtype stored

"""``attnviz view`` of a summary capture (issue 39, part 3): the pooled maps, their thumbnails, the summary's
head table, sorting, batch entries, token search; the rollout refused in the viewer; bad files in one line.

The summary file is written here as a capture writes one (``fileformat.write_safetensors``), from random q and k
through ``attnviz.summarystats.summarise``; the values the viewer shows are checked against exact weights
computed in this file (a softmax over the causal, padded mask), not against the reader's own path.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import numpy as np
import pytest

from attnviz.capturefile import write_safetensors
from attnviz.summarystats import MaskParts, SummarySettings, summarise

LAYERS, BATCH, HEADS, N, D = 2, 2, 3, 40, 8
POOL = 8  # blocks of 5 positions
SINKS = 2
PAD = 6  # entry 1 is padded on the left


def _inputs() -> tuple[np.ndarray, np.ndarray, np.ndarray, list[list[str]]]:
    rng = np.random.default_rng(7)
    q = rng.normal(size=(LAYERS, BATCH, HEADS, N, D)).astype(np.float32) * 1.5
    k = rng.normal(size=(LAYERS, BATCH, HEADS, N, D)).astype(np.float32)
    real = np.ones((BATCH, N), bool)
    real[1, :PAD] = False
    words = [f"w{i}" for i in range(N)]
    words[23] = "needle"
    tokens = [words, ["<pad>"] * PAD + words[PAD:]]
    return q, k, real, tokens


def _meta(tokens: list[list[str]], parts: MaskParts, **extra: object) -> dict:
    return {"format": 1, "tokens": tokens, "model_type": "llama", "kinds": ["layers"],
            "sites": {f"layers.{li}": {"kind": "layers", "layer": li, "mask": parts.as_metadata()}
                      for li in range(LAYERS)}, **extra}


def write_summary(path: Path, damage: str | None = None, every_site: bool = False) -> None:
    """A summary capture of ``_inputs()`` (``damage``: that array of the last site, or of every site, cut short)."""
    q, k, real, tokens = _inputs()
    settings = SummarySettings(sinks=SINKS, local=3, pool=POOL, rows="0,-1")
    parts = MaskParts(causal=True, padding=real)
    arrays = []
    for li in range(LAYERS):
        got = summarise(q[li], k[li], scale=D ** -0.5, settings=settings, parts=parts)
        for name, value in got.items():
            value = np.asarray(value)
            if value.dtype.kind == "f":
                value = value.astype(np.float32)
            if damage == name and (every_site or li == LAYERS - 1):
                value = value[..., :-1]
            arrays.append((f"layers.{li}.{name}", value.dtype, value.shape, lambda a=value: a))
    write_safetensors(path, arrays, _meta(tokens, parts, summary=settings.as_metadata()))


def write_no_weights(path: Path) -> None:
    """The same run captured with --no-weights: q and k ([B, L, H, d]) and the mask's parts."""
    q, k, real, tokens = _inputs()
    parts = MaskParts(causal=True, padding=real)
    arrays = []
    for li in range(LAYERS):
        for name, value in (("q", q[li].transpose(0, 2, 1, 3)), ("k", k[li].transpose(0, 2, 1, 3)),
                            ("real_keys", real)):
            value = np.ascontiguousarray(value)
            arrays.append((f"layers.{li}.{name}", value.dtype, value.shape, lambda a=value: a))
    write_safetensors(path, arrays, _meta(tokens, parts))


# -- the oracle: exact weights of the same q and k, and their block means by the definition


def exact_weights() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``A [layers, B, H, N, N]`` (masked weights 0), the live real rows ``[B, N]`` and the mask ``[B, N, N]``."""
    q, k, real, _ = _inputs()
    keep = np.tril(np.ones((N, N), bool))[None] & real[:, None, :]  # [B, N, N]
    s = np.einsum("lbhid,lbhjd->lbhij", q.astype(np.float64), k.astype(np.float64)) * D ** -0.5
    s = np.where(keep[None, :, None], s, -np.inf)
    top = np.max(s, axis=-1, keepdims=True)
    e = np.exp(s - np.where(np.isfinite(top), top, 0.0))
    total = e.sum(-1, keepdims=True)
    a = np.divide(e, total, out=np.zeros_like(e), where=total > 0)
    live = real & keep.any(-1)
    return a, live, keep


def block_mean(a: np.ndarray, live: np.ndarray, keep: np.ndarray, rows: range, keys: range) -> float:
    """The mean weight of the block ``rows x keys`` over its live real rows (masked weights count 0); NaN where
    it has no such row or none of its keys is seen by them."""
    chosen = [i for i in rows if live[i]]
    if not chosen or not keep[np.ix_(chosen, list(keys))].any():
        return float("nan")
    return float(a[np.ix_(chosen, list(keys))].sum() / (len(chosen) * len(keys)))


@pytest.fixture(scope="module")
def summary(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("summary") / "long.safetensors"
    write_summary(path)
    return path


def open_view(path: Path, **selection: object):
    from attnviz.cli.commands.view import view
    from attnviz.inspection.options import InspectOptions, Selection
    from attnviz.render.options import FigureOptions

    options = InspectOptions(weights=str(path), selection=Selection(**selection))
    return view(options, FigureOptions(), run=False)


def test_the_pooled_map_shown_is_the_block_means_of_the_weights(summary: Path) -> None:
    from safetensors.numpy import load_file

    from attnviz.viewer.summary import SummaryViewerModel

    app = open_view(summary, layer=1, head=2, batch=1)
    model = app.model
    assert isinstance(model, SummaryViewerModel) and (model.layer, model.head, model.batch) == (1, 2, 1)
    cells, _ = model.map()
    assert cells.shape == (POOL, POOL) and model.cell_positions() == (N // POOL, N // POOL)
    stored = load_file(str(summary))["layers.1.pooled_mean"][1, 2]
    np.testing.assert_array_equal(cells, stored.astype(np.float64))
    a, live, keep = exact_weights()
    g = N // POOL
    want = np.array([[block_mean(a[1, 1, 2], live[1], keep[1], range(i * g, i * g + g), range(j * g, j * g + g))
                      for j in range(POOL)] for i in range(POOL)])
    np.testing.assert_allclose(cells, want, rtol=1e-5, atol=1e-7, equal_nan=True)
    assert np.isnan(cells[0, 0]) and np.isnan(cells[2, 5])  # padding's rows; keys above the diagonal

    # drawn in blocks of 2 x 2 cells (a narrow panel): each cell is the mean of its 10 x 10 positions, exactly
    coarse = model.reducer()(2, "mean")
    want2 = np.array([[block_mean(a[1, 1, 2], live[1], keep[1], range(i * 2 * g, (i + 1) * 2 * g),
                                  range(j * 2 * g, (j + 1) * 2 * g)) for j in range(POOL // 2)]
                      for i in range(POOL // 2)])
    np.testing.assert_allclose(coarse, want2, rtol=1e-5, atol=1e-7, equal_nan=True)
    picture = model.picture(16, 12)
    assert model.drawn_blocks(picture) == (2 * g, 2 * g)
    model.cursor = (25, 12)
    assert model.value() == pytest.approx(want2[2, 1], rel=1e-5)
    line = model.cursor_line()
    assert "query 25 'w25' (block 20-29)" in line and "key 12 'w12' (block 10-19)" in line, line
    assert f"{want2[2, 1]:.4g}" in line and "entry 1 of 2" in line


def test_the_head_table_thumbnails_and_maxima(summary: Path) -> None:
    from safetensors.numpy import load_file

    from attnviz.render.terminal import segments_text

    model = open_view(summary).model
    assert model.averaged and model.batch == 0
    stored = load_file(str(summary))
    # sink mass by the definition: the weight on the first SINKS real keys, mean over live real rows of both entries
    a, live, _ = exact_weights()
    _, _, real, _ = _inputs()
    first = np.cumsum(real, -1) <= SINKS
    sink = (a * (first & real)[None, :, None, None, :]).sum(-1)  # [layers, B, H, N]
    want = (sink * live[None, :, None]).sum((1, 3)) / live.sum()
    np.testing.assert_allclose(model.stats["sink_mass"], want, rtol=1e-5)
    while model.sort != "sink_mass":
        model.next_sort()
    for layer in range(LAYERS):
        model.layer = layer
        assert model.order() == sorted(range(HEADS), key=lambda h: -want[layer, h])
    lines = model.stats_lines()
    assert lines[0] == f"layer {LAYERS - 1}  head 0  (all entries)" and any("sink" in x for x in lines)
    assert lines[-2] == "order: sink, largest first"

    thumbs = model.thumbnails(40, 16)
    assert thumbs.rows == LAYERS and thumbs.cols == HEADS and thumbs.block_sides == (N // POOL, N // POOL)
    panel = model.thumb(0, 1)
    np.testing.assert_array_equal(panel.get()[0], stored["layers.0.pooled_mean"][0, 1].astype(np.float64))
    text = segments_text(model.picture(60, 20, plain=True).lines(60))
    assert "blocks of 5x5, mean" in text and "mean weight" in text

    assert model.next_reduce() is None and model.reduce == "max"
    np.testing.assert_array_equal(model.map()[0], stored[f"layers.{LAYERS - 1}.pooled_max"][0, 0].astype(np.float64))
    np.testing.assert_array_equal(model.thumb(0, 1).get()[0], stored["layers.0.pooled_max"][0, 1].astype(np.float64))
    assert "block max" in model.cursor_line()


def test_the_viewer_app_walks_a_summary(summary: Path) -> None:
    """Driven by Textual's pilot as the viewer of weights is: heads and layers, 's', 'b', '/', 'm'; 'r' says why
    not in the status line."""
    from safetensors.numpy import load_file

    app = open_view(summary)
    model = app.model
    stored = load_file(str(summary))
    shot: dict[str, str] = {}

    async def drive() -> None:
        async with app.run_test(size=(100, 30)) as pilot:
            await pilot.pause()
            assert "a summary" in str(app.query_one("#title").render())
            await pilot.press("l", "l", "j")
            assert (model.layer, model.head) == (1, 2)
            np.testing.assert_array_equal(model.map()[0], stored["layers.1.pooled_mean"][0, 2].astype(np.float64))
            await pilot.press("s", "s", "s", "s")
            assert model.sort == "sink_mass"
            assert "walked by sink_mass" in str(app.query_one("#status").render())
            await pilot.press("r")
            assert not model.rollout
            assert str(app.query_one("#status").render()) == "a summary keeps no full weights; rollout needs them"
            await pilot.press("b")
            assert model.batch == 1 and model.q_labels[0] == "<pad>"
            np.testing.assert_array_equal(model.map()[0], stored["layers.1.pooled_mean"][1, 2].astype(np.float64))
            await pilot.press("slash", *"needle", "enter", "escape")
            assert model.cursor == (23, 23)
            status = str(app.query_one("#status").render())
            assert "query 23 'needle' (block 20-24)" in status and "entry 1 of 2" in status, status
            cells = model.map()[0]
            assert f"{cells[4, 4]:.4g}" in status
            await pilot.press("m")
            assert model.reduce == "max" and "maxima" in str(app.query_one("#status").render())
            await pilot.press("m", "L")
            assert model.reduce == "mean" and model.cursor[1] > 23
            shot["svg"] = app.export_screenshot()
            await pilot.press("q")

    asyncio.run(drive())
    svg = shot["svg"]  # Textual's screenshot: the title of the map and the side panel's columns drawn
    assert "pooled" in svg and "sink" in svg


def test_a_no_weights_capture_is_viewed_as_its_summary(tmp_path: Path) -> None:
    """Summarised from its q and k with the default settings (blocks of 256: here one position each), the
    pooled map is the weights themselves, NaN where masked."""
    path = tmp_path / "qk.safetensors"
    write_no_weights(path)
    app = open_view(path, layer=0, head=1)
    assert "summarised from its q and k" in app.heading and app.model.cell_positions() == (1, 1)
    a, live, keep = exact_weights()
    want = np.where(keep[0] & live[0][:, None], a[0, 0, 1], np.nan)
    np.testing.assert_allclose(app.model.map()[0], want, rtol=1e-5, atol=1e-7, equal_nan=True)


def invoke(*args: object, monkeypatch: pytest.MonkeyPatch) -> object:
    from typer.testing import CliRunner

    from attnviz.cli import app
    from attnviz.cli.commands import view

    monkeypatch.setattr(view, "need_terminal", lambda: None)  # CliRunner's streams are no terminal
    result = CliRunner().invoke(app, [str(a) for a in args])
    assert "Traceback" not in result.stderr, result.stderr
    return result


def test_bad_summaries_and_options_in_one_line(summary: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    damaged = tmp_path / "damaged.safetensors"
    write_summary(damaged, damage="pooled_mean")
    edges = tmp_path / "edges.safetensors"
    write_summary(edges, damage="pool_k_edges", every_site=True)
    garbage = tmp_path / "garbage.safetensors"
    garbage.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json at all")
    for path, code, words in ((damaged, 1, "pooled_mean"), (edges, 1, "pool_k_edges"),
                              (garbage, 1, "garbage.safetensors")):
        done = invoke("view", path, monkeypatch=monkeypatch)
        lines = done.stderr.strip().splitlines()
        assert done.exit_code == code and len(lines) == 1 and str(path.name) in lines[0] and words in lines[0], \
            done.stderr
    mask = tmp_path / "mask.npy"
    np.save(mask, np.ones((BATCH, N)))
    for args, code, words in ((["--mask", mask], 2, "--mask: "), (["--layer", "5"], 2, "--layer 5"),
                              (["--heads", "7"], 2, "--heads"), (["--labels", "a,b"], 1, "2 labels for 40")):
        done = invoke("view", summary, *args, monkeypatch=monkeypatch)
        lines = done.stderr.strip().splitlines()
        assert done.exit_code == code and len(lines) <= 2 and words in done.stderr, (args, done.stderr)


def test_inspect_and_view_read_the_same_head_table(summary: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The side panel's numbers are inspect's table of the same file (--json)."""
    done = invoke("inspect", summary, "--json", monkeypatch=monkeypatch)
    rows = json.loads(done.stdout)["head_stats"]
    model = open_view(summary).model
    for row in rows:
        for name in ("entropy", "max", "sink_mass", "local_mass", "first"):
            assert model.stats[name][row["layer"], row["head"]] == pytest.approx(row[name], rel=1e-6), name


def test_m_draws_the_blocks_of_weights_as_their_maxima_too(tmp_path: Path) -> None:
    """The key is the viewer's, not the summary's alone: a map of 600 tokens drawn in blocks of 2 x 2 (at most
    512 cells a side) shows each block's mean, then its max; the rollout follows."""
    rng = np.random.default_rng(1)
    w = rng.random((1, 1, 1, 600, 600)).astype(np.float32)
    w /= w.sum(-1, keepdims=True)
    np.save(tmp_path / "w.npy", w)
    model = open_view(tmp_path / "w.npy").model
    blocks = w[0, 0, 0].astype(np.float64).reshape(300, 2, 300, 2)
    np.testing.assert_allclose(model.map()[0], blocks.mean(axis=(1, 3)), rtol=1e-6)
    assert model.next_reduce() is None and model.reduce == "max"
    np.testing.assert_array_equal(model.map()[0], blocks.max(axis=(1, 3)))
    assert "(max of a 2x2 block)" in model.cursor_line()
    model.rollout = True
    assert model.next_reduce() is None and model.reduce == "mean" and model.map()[0].shape == (300, 300)

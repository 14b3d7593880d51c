"""Model grids as one mosaic picture (issue 11, item 2; issue 12's shared scale and layout rules).

The PNGs are read back with matplotlib.image.imread and checked pixel by pixel: a mosaic cell is one
pixel of the saved file (no resampling), so a hot cell must be exactly where the layout puts it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from typer.testing import CliRunner

from attnviz.blocks import _strided_reduce, reduce_blocks
from attnviz.cli import app
from attnviz.render.canvas import mosaic_layout
from attnviz.render.heatmap import DPI, save_figure
from attnviz.render.mosaic import model_grid_figure, slices_mosaic
from tests.conftest import ROOT

runner = CliRunner()
GREY = (0xD9,) * 3  # masked cells


def rgb(name, value):
    """The colour ``name`` gives ``value`` in [0, 1], as the PNG stores it (8 bits a channel)."""
    from matplotlib import colormaps

    return tuple(int(c) for c in colormaps[name](value, bytes=True)[:3])


def read(path):
    """The PNG's RGB pixels as 0..255, read back with matplotlib."""
    from matplotlib.image import imread

    return np.round(imread(path)[..., :3] * 255).astype(np.uint8)


def saved(fig, path):
    """Save ``fig``; the image read back and the top-left pixel of the mosaic picture in it."""
    save_figure(fig, path)
    img = read(path)
    x0, _, x1, y1 = fig.axes[0].bbox.extents  # display pixels at DPI, from the bottom
    return img, (img.shape[0] - round(y1), round(x0)), round(x1 - x0)


def pixel(img, origin, y, x):
    return tuple(int(c) for c in img[origin[0] + y, origin[1] + x])


def one_hot_model(layers=2, heads=3, n=8, hot=(1, 2)):
    """Uniform heads, and one head attending from query i to key (i + 3) % n only."""
    w = np.full((layers, heads, n, n), 1 / n, np.float32)
    w[hot] = 0
    w[hot][np.arange(n), (np.arange(n) + 3) % n] = 1
    return w


def test_one_hot_head_shows_its_hot_cells_where_expected(tmp_path):
    w = one_hot_model()
    fig = model_grid_figure(w, title="one-hot")
    layout = mosaic_layout(2, 3, (8, 8))
    img, origin, width = saved(fig, tmp_path / "g.png")
    assert width == layout.size[1] and fig.axes[0].bbox.height == pytest.approx(layout.size[0])
    assert img.shape[1] == round(fig.get_figwidth() * DPI)
    sq, sk = layout.scale
    y0, x0 = layout.origin(1, 2)
    hot, cold = rgb("viridis", 1.0), rgb("viridis", 0.0)
    for i in range(8):
        for j in range(8):
            expected = hot if j == (i + 3) % 8 else cold
            for dy, dx in ((0, 0), (sq - 1, sk - 1), (sq // 2, sk // 2)):  # every corner of the cell's pixels
                assert pixel(img, origin, y0 + i * sq + dy, x0 + j * sk + dx) == expected, \
                    (i, j, dy, dx)


def test_one_shared_scale_uniform_heads_are_dark_and_alike(tmp_path):
    w = one_hot_model()
    fig = model_grid_figure(w, title="shared")
    layout = mosaic_layout(2, 3, (8, 8))
    img, origin, _ = saved(fig, tmp_path / "g.png")
    ph, pw = layout.panel
    uniform = rgb("viridis", 1 / 8)  # 0.125 on the scale [0, 1] every panel shares, not its own maximum
    colours = set()
    for r in range(2):
        for c in range(3):
            if (r, c) == (1, 2):
                continue
            y, x = layout.origin(r, c)
            block = img[origin[0] + y:origin[0] + y + ph, origin[1] + x:origin[1] + x + pw].reshape(-1, 3)
            colours |= {tuple(p) for p in np.unique(block, axis=0)}
    assert len(colours) == 1 and colours.pop() == uniform
    bar = fig.axes[1]  # the one colour bar
    assert len(fig.axes) == 2 and bar.get_ylabel() == "weight" and bar.get_ylim() == pytest.approx((0, 1))
    x0, y0, x1, y1 = bar.bbox.extents
    column = img[img.shape[0] - round(y1) + 2:img.shape[0] - round(y0) - 2, round((x0 + x1) / 2)]
    assert np.abs(column[0] - rgb("viridis", 1.0)).max() < 6  # yellow at the top
    assert np.abs(column[-1] - rgb("viridis", 0.0)).max() < 6  # purple at the bottom
    assert len(np.unique(column, axis=0)) > 50  # a gradient


def test_separators_masked_cells_and_labels(tmp_path):
    w = one_hot_model(layers=3, heads=4, n=6, hot=(0, 0))
    keep = np.ones((6, 6), bool)
    keep[:, 4:] = False  # padded keys
    fig = model_grid_figure(w, title="masked", keep=keep, layer_ids=[10, 11, 12])
    layout = mosaic_layout(3, 4, (6, 6))
    img, origin, _ = saved(fig, tmp_path / "g.png")
    ph, pw = layout.panel
    height, width = layout.size
    assert layout.gap >= 1
    for c in range(1, 4):  # a white column between every two panels, from top to bottom
        x = layout.origin(0, c)[1] - 1
        assert np.all(img[origin[0]:origin[0] + height, origin[1] + x] == 255)
    for r in range(1, 3):
        y = layout.origin(r, 0)[0] - 1
        assert np.all(img[origin[0] + y, origin[1]:origin[1] + width] == 255)
    y, x = layout.origin(2, 3)
    assert pixel(img, origin, y + ph // 2, x + pw - 1) == GREY  # a masked key
    assert pixel(img, origin, y + ph // 2, x) == rgb("viridis", 1 / 6)
    labels = fig.mosaic_labels
    assert [t.get_text() for t in labels.rows] == ["10", "11", "12"]
    assert [t.get_text() for t in labels.cols] == ["0", "1", "2", "3"]
    assert labels.row_name.get_text() == "layer" and labels.col_name.get_text() == "head"
    assert "grey: masked" in fig.texts[0].get_text()


@pytest.mark.parametrize("layers, heads, title", [
    (1, 1, "t"), (1, 12, "t"), (12, 12, "t"), (24, 16, "t"),
    (1, 2, "attention weights of " + "/very/long/folder" * 12 + "/dump.npz, batch 0"),
])
def test_nothing_is_clipped_and_labels_never_overlap(layers, heads, title):
    fig = model_grid_figure(np.full((layers, heads, 4, 4), 0.25, np.float32), title=title)
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    page = fig.bbox
    labels = fig.mosaic_labels
    texts = [fig.texts[0], *labels.rows, *labels.cols, labels.row_name, labels.col_name,
             *[t for t in (fig.axes[1].yaxis.label, *fig.axes[1].get_yticklabels()) if t.get_text()]]
    for text in texts:
        box = text.get_window_extent(renderer)
        assert page.x0 <= box.x0 and box.x1 <= page.x1 and page.y0 <= box.y0 and box.y1 <= page.y1, text.get_text()
    for ax in fig.axes:
        box = ax.get_tightbbox(renderer)
        assert page.x0 <= box.x0 and box.x1 <= page.x1 and page.y0 <= box.y0 and box.y1 <= page.y1
    ax = fig.axes[0]
    for drawn in (labels.cols, labels.rows):
        boxes = [t.get_window_extent(renderer) for t in drawn]
        assert all(not a.overlaps(b) for a, b in zip(boxes, boxes[1:]))
    # the axes' names clear their labels
    assert labels.row_name.get_window_extent(renderer).x1 <= min(t.get_window_extent(renderer).x0 for t in labels.rows)
    assert labels.col_name.get_window_extent(renderer).y0 >= max(t.get_window_extent(renderer).y1 for t in labels.cols)
    heading = fig.texts[0].get_window_extent(renderer)
    assert heading.y0 > ax.get_tightbbox(renderer).y1  # above the column labels, not over them


def test_long_maps_are_aggregated_in_blocks_and_said_so():
    w = np.random.default_rng(0).random((2, 2, 1000, 600), dtype=np.float32)
    fig = model_grid_figure(w, title="long", reduce="max")
    layout = mosaic_layout(2, 2, (1000, 600))
    assert layout.blocks == (7, 4) and layout.cells == (143, 150)
    assert "maps [1000, 600] (blocks of 7x4, max)" in fig.texts[0].get_text()
    image = fig.axes[0].get_images()[0].get_array()
    assert image.shape == layout.size
    np.testing.assert_allclose(image[:143, :150], reduce_blocks(w[0, 0], None, 7, 4, "max"), rtol=1e-6)


@pytest.mark.parametrize("shape, fr, fc", [((512, 512), 4, 4), ((7, 9), 2, 4), ((100, 37), 7, 6), ((5, 5), 1, 1)])
@pytest.mark.parametrize("reduce", ["mean", "max"])
def test_strided_blocks_equal_the_reference(shape, fr, fc, reduce):
    data = np.random.default_rng(1).random(shape, dtype=np.float32)
    np.testing.assert_allclose(_strided_reduce(data, fr, fc, reduce), reduce_blocks(data, None, fr, fc, reduce),
                               rtol=1e-5, atol=1e-7)


def test_compute_command_grids_use_the_mosaic(tmp_path):
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "qkv.npz", **{n: rng.normal(size=(2, 4, 6, 3)).astype(np.float32) for n in "qkv"})
    out = tmp_path / "s.png"
    r = runner.invoke(app, ["scaled", str(tmp_path / "qkv.npz"), "--causal", "--png", str(out), "--quiet"])
    assert r.exit_code == 0, r.stderr
    fig = slices_mosaic(np.zeros((2, 4, 6, 6), np.float32), title="x")
    labels = fig.mosaic_labels
    assert [t.get_text() for t in labels.rows] == ["0", "1"] and labels.row_name.get_text() == "dim 0"
    img = read(out)
    grey = np.all(img == GREY, axis=-1)
    assert grey.sum() > 8 * 15 * 100  # every panel's masked upper triangle (15 cells of many pixels each)
    multi = slices_mosaic(np.zeros((20, 3, 3), np.float32), title="heads", names=("head",))
    labels = [t.get_text() for t in multi.mosaic_labels.rows]
    assert labels == ["0-4", "5-9", "10-14", "15-19"]


def test_compare_grid_shows_every_head_on_a_symmetric_scale(tmp_path):
    from attnviz.render.mosaic import rank_panels, ranked_grid_figure

    a = np.full((3, 1, 6, 5, 5), 0.2, np.float32)  # 18 heads: more than the 16 panels compare drew before
    b = a.copy()
    b[2, 0, 5, 0] = [0.7, 0.05, 0.05, 0.1, 0.1]  # the last head differs most: A - B is -0.5 .. +0.15
    b[0, 0, 1, 1] = [0.3, 0.1, 0.2, 0.2, 0.2]  # head 1 of layer 0 a little (its row 1)
    np.save(tmp_path / "a.npy", a)
    np.save(tmp_path / "b.npy", b)
    out = tmp_path / "d.png"
    r = runner.invoke(app, ["compare", str(tmp_path / "a.npy"), str(tmp_path / "b.npy"), "--png", str(out),
                            "--title", "d", "--quiet", "--max-panels", "0"])
    assert r.exit_code == 0, r.stderr
    diff = a.astype(np.float64) - b
    ranked = rank_panels(diff[:, 0], [(layer, h) for layer in range(3) for h in range(6)])
    assert ranked[0] == ((2, 5), pytest.approx(0.5)) and len(ranked) == 18  # the differing head first
    # the picture holds the maps that differ (issue 33): none of the 16 identical ones pads it out
    fig = ranked_grid_figure(diff[:, 0], ranked[:2], title="d", total=18, note="; the other 16 are identical")
    img, origin, _ = saved(fig, tmp_path / "api.png")
    np.testing.assert_array_equal(read(out), img)  # the command draws exactly this figure
    low, high = fig.axes[1].get_ylim()
    assert low == -high == pytest.approx(-0.5)  # symmetric, from the largest difference
    layout = fig.mosaic_layout
    sq, _ = layout.scale
    assert pixel(img, origin, 0, 0) == rgb("RdBu_r", 0.0)  # -0.5: layer 2, head 5, ranked first
    assert pixel(img, origin, sq, 0) == rgb("RdBu_r", 0.5)  # no difference
    assert "2:5" in [t.get_text().split(" 0.5")[0] for t in fig.mosaic_labels.captions]


def test_inspect_png_is_the_mosaic_of_every_layer_and_head(tmp_path):
    w = one_hot_model(layers=4, heads=5, n=8, hot=(3, 4))
    np.save(tmp_path / "w.npy", w[:, None])
    out = tmp_path / "g.png"
    r = runner.invoke(app, ["inspect", str(tmp_path / "w.npy"), "--png", str(out), "--title", "g", "--quiet"])
    assert r.exit_code == 0, r.stderr
    fig = model_grid_figure(w, title="g, batch 0")
    img, origin, width = saved(fig, tmp_path / "api.png")
    np.testing.assert_array_equal(read(out), img)
    layout = mosaic_layout(4, 5, (8, 8))
    picture = img[origin[0]:origin[0] + layout.size[0], origin[1]:origin[1] + width]
    hot = np.all(picture == rgb("viridis", 1.0), axis=-1)
    assert hot.sum() == 8 * layout.scale[0] * layout.scale[1]  # the 8 hot cells of the last head alone
    y, x = layout.origin(3, 4)
    assert hot[y:y + layout.panel[0], x:x + layout.panel[1]].sum() == hot.sum()


MEMORY_CHILD = textwrap.dedent("""
    import resource, sys
    from pathlib import Path
    import matplotlib.figure, matplotlib.backends.backend_agg  # imported before the baseline
    from attnviz.inspection.weights import load_weights
    from attnviz.render.heatmap import save_figure
    from attnviz.render.mosaic import model_grid_figure
    w = load_weights(sys.argv[1])  # memory-mapped, [24, 1, 16, 1024, 1024] float32
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    fig = model_grid_figure(w.data[:, 0], title="big")
    save_figure(fig, Path(sys.argv[2]))
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    x0, _, _, y1 = fig.axes[0].bbox.extents
    print(before * 1024, after * 1024, round(fig.bbox.height - y1), round(x0))
""")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="ru_maxrss in KiB, and sparse files")
def test_a_24_by_16_grid_of_1024_maps_in_the_memory_of_one_layer(tmp_path):
    """1.5 GiB of float32 weights (3 GiB as float64) drawn within one layer's maps (64 MiB) plus the
    picture: the mosaic is built a layer at a time from the memory-mapped file, whose pages are let go
    after each layer."""
    layers, heads, n = 24, 16, 1024
    path = tmp_path / "big.npy"
    w = np.lib.format.open_memmap(path, mode="w+", dtype=np.float32, shape=(layers, 1, heads, n, n))  # sparse
    w[7, 0, 9] = np.eye(n, dtype=np.float32)
    w.flush()
    del w
    out = tmp_path / "big.png"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    r = subprocess.run([sys.executable, "-c", MEMORY_CHILD, str(path), str(out)], capture_output=True, text=True,
                       timeout=300, env=env, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    before, after, top, left = map(int, r.stdout.split())
    one_layer = heads * n * n * 4
    layout = mosaic_layout(layers, heads, (n, n))
    height, width = layout.size
    assert after - before < one_layer + 4 * height * width * 4 + 16 * 2**20, (after - before) / 2**20
    picture = read(out)[top:top + height, left:left + width]
    assert layout.blocks == (16, 16) and layout.scale == (1, 1)
    diagonal = np.all(picture == rgb("viridis", 1.0), axis=-1)  # blocks of 16 x 16 on the diagonal: 1/16, the top
    y, x = layout.origin(7, 9)
    assert diagonal.sum() == layout.cells[0] and np.all(np.diag(diagonal[y:y + 64, x:x + 64]))


def test_a_blockwise_run_draws_the_same_mosaic_as_a_dense_one(tmp_path):
    rng = np.random.default_rng(2)
    for name in "qkv":
        np.save(tmp_path / f"{name}.npy", rng.normal(size=(6, 300, 8)).astype(np.float32))  # 6 heads
    files = [str(tmp_path / f"{name}.npy") for name in "qkv"]
    dense, blocked = tmp_path / "dense.png", tmp_path / "blocked.png"
    r = runner.invoke(app, ["scaled", *files, "--png", str(dense), "--quiet"])
    assert r.exit_code == 0, r.stderr
    r = runner.invoke(app, ["scaled", *files, "--max-memory", "1M", "--png", str(blocked)])
    assert r.exit_code == 0 and "blocks of" in r.stderr, r.stderr
    a, b = read(dense), read(blocked)
    assert a.shape == b.shape and np.abs(a.astype(int) - b).max() <= 1  # float32 sums in another order


def test_png_bytes_round_trip(tmp_path):
    from attnviz.render.heatmap import png_bytes

    rng = np.random.default_rng(0)
    for channels in (3, 4):
        rgba = rng.integers(0, 256, size=(7, 5, 4), dtype=np.uint8)
        if channels == 3:
            rgba[..., 3] = 255  # opaque: written as RGB
        (tmp_path / "x.png").write_bytes(png_bytes(rgba))
        from matplotlib.image import imread

        back = np.round(imread(tmp_path / "x.png") * 255).astype(np.uint8)
        assert back.shape == (7, 5, channels)
        np.testing.assert_array_equal(back, rgba[..., :channels])


def test_png_opacity_is_read_right_whatever_the_array():
    """The quick opacity test (a word per pixel) agrees with reading the alpha bytes, on every layout of array
    (contiguous, a view that skips columns, Fortran order) and with a single pixel translucent anywhere."""
    from attnviz.render.heatmap import _opaque

    rng = np.random.default_rng(1)
    rgba = rng.integers(0, 256, size=(9, 13, 4), dtype=np.uint8)
    rgba[..., 3] = 255
    for where in [None, (0, 0), (8, 12), (4, 7)]:
        one = rgba.copy()
        if where is not None:
            one[where + (3,)] = 254
        for array in (one, one[:, ::2], np.asfortranarray(one), one[::-1]):
            assert _opaque(array) == bool((array[..., 3] == 255).all())


@pytest.mark.filterwarnings("ignore:Glyph")
def test_text_sizes_measured_once_draw_what_matplotlib_draws(tmp_path):
    """The Agg canvas that measures each text once per process (``agg_canvas``) gives the sizes matplotlib's
    own renderer gives, for every string, font size, weight and resolution; a figure of rotated, wrapped and
    non-Latin texts drawn on it, a first time and again, is matplotlib's figure pixel for pixel."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg, RendererAgg
    from matplotlib.figure import Figure
    from matplotlib.font_manager import FontProperties

    from attnviz.render.heatmap import agg_canvas

    def figure(canvas):
        fig = Figure(figsize=(4, 3), dpi=100)
        canvas(fig)
        ax = fig.add_subplot()
        ax.imshow(np.arange(12.0).reshape(3, 4))
        ax.set_title("layer 3 · head 7 — 注意力", fontsize=11)
        ax.set_ylabel("query position", rotation=90)
        fig.text(0.5, 0.02, "a long caption\nwrapped on two lines", ha="center", fontsize=7, weight="bold")
        fig.canvas.draw()
        return np.asarray(fig.canvas.buffer_rgba()).copy()

    plain = figure(FigureCanvasAgg)
    assert np.array_equal(figure(agg_canvas), plain)
    assert np.array_equal(figure(agg_canvas), plain)  # the sizes now from the cache
    ours = agg_canvas(Figure(dpi=100)).get_renderer()
    for dpi in (72, 100, 200):
        ours.dpi = dpi
        theirs = RendererAgg(10, 10, dpi)
        for text in ("0", "11", "layer", "head (every 2)", "Ärger ñ 注意", ""):
            for size, weight in ((7, "normal"), (9, "bold"), (12, "normal")):
                prop = FontProperties(size=size, weight=weight)
                assert ours.get_text_width_height_descent(text, prop, False) == \
                    theirs.get_text_width_height_descent(text, prop, False)


def test_a_grid_too_small_for_its_tokens_says_so(tmp_path):
    """6 layers x 12 heads of 11 tokens (a MiniLM batch): the grid has no room for the tokens, and inspect says so
    in one line naming the options that draw them; a few heads, drawn larger, get them and no such line."""
    from matplotlib.text import Text

    rng = np.random.default_rng(0)
    w = rng.dirichlet(np.ones(11), size=(6, 1, 12, 11)).astype(np.float32)
    np.save(tmp_path / "w.npy", w)
    tokens = ["[CLS]", "the", "cat", "sat", "on", "the", "mat", ".", "[SEP]", "zebra", "yak"]
    (tmp_path / "tok.txt").write_text("\n".join(tokens) + "\n")
    args = ["inspect", str(tmp_path / "w.npy"), "--labels", str(tmp_path / "tok.txt"), "--no-table"]
    full = runner.invoke(app, [*args, "--png", str(tmp_path / "grid.png")])
    assert full.exit_code == 0, full.stderr
    notes = [line for line in full.stderr.splitlines() if "tokens" in line and "left out" in line]
    assert len(notes) == 1 and "--map-png" in notes[0] and "--heads" in notes[0], full.stderr
    figure = model_grid_figure(w[:, 0], title="t", tokens=(tokens, tokens))
    assert not any(t.get_text() == "zebra" for t in figure.findobj(Text))  # indeed none drawn
    few = runner.invoke(app, [*args, "--png", str(tmp_path / "few.png"), "--layers", "0", "--heads", "0-1"])
    assert few.exit_code == 0, few.stderr
    assert "left out" not in few.stderr, few.stderr
    figure = model_grid_figure(w[:1, 0, :2], title="t", tokens=(tokens, tokens))
    assert any(t.get_text() == "zebra" for t in figure.findobj(Text))

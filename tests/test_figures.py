"""Figures that tell the truth at a glance (issue 12, items 1-3): one shared colour scale with a colour
bar (or each panel's own, saying its maximum), --vmin/--vmax/--norm, chosen layers and heads,
compare's worst-first order, head reduction, and layouts whose text stays inside the figure.

Pixels are read back from the saved PNGs (helpers of test_mosaic: a mosaic cell is one pixel of the
file) and compared with colours worked out from the values by hand or with NumPy.
"""

from __future__ import annotations

import numpy as np
import pytest
from typer.testing import CliRunner

from attnviz.cli import app
from attnviz.render import heatmap as hm
from attnviz.render.heatmap import DPI, heatmap_figure, save_figure, stat_figure
from attnviz.render.mosaic import model_grid_figure, rank_panels, ranked_grid_figure, slices_mosaic
from attnviz.render.scale import ColourScale, ValueRange, make_scaling
from tests.test_mosaic import one_hot_model, pixel, read, rgb, saved

runner = CliRunner()


def run(*args):
    return runner.invoke(app, [str(a) for a in args])


def panel_pixel(img, fig, r, c, y=0, x=0):
    """The colour of cell (y, x) of panel (r, c) of a mosaic figure's saved image."""
    layout = fig.mosaic_layout
    top = img.shape[0] - round(fig.axes[0].bbox.extents[3])
    left = round(fig.axes[0].bbox.extents[0])
    py, px = layout.origin(r, c)
    sq, sk = layout.scale
    return pixel(img, (top, left), py + y * sq + sq // 2, px + x * sk + sk // 2)


def axes_centre(img, fig, ax):
    """The colour at the centre of an axes (a panel of heatmap_figure) in the saved image."""
    x0, y0, x1, y1 = ax.bbox.extents
    return tuple(int(v) for v in img[img.shape[0] - round((y0 + y1) / 2), round((x0 + x1) / 2)])


def close(colour, expected, tol=3):
    return max(abs(int(a) - int(b)) for a, b in zip(colour, expected)) <= tol


# ------------------------------------------------------------------------------------------------
# 1. Honest colour


def test_shared_scale_uniform_head_is_dark_next_to_a_one_hot_head(tmp_path):
    w = one_hot_model(layers=1, heads=2, n=8, hot=(0, 1))  # head 0 uniform (1/8), head 1 one-hot
    np.save(tmp_path / "w.npy", w[:, None])
    out = tmp_path / "g.png"
    r = run("inspect", tmp_path / "w.npy", "--png", out, "--title", "g", "--quiet")
    assert r.exit_code == 0, r.stderr
    fig = model_grid_figure(w, title="g, batch 0")
    img, _, _ = saved(fig, tmp_path / "api.png")
    np.testing.assert_array_equal(read(out), img)
    assert panel_pixel(img, fig, 0, 0) == rgb("viridis", 1 / 8)  # dark: 0.125 of the shared [0, 1]
    assert panel_pixel(img, fig, 0, 1, 0, 3) == rgb("viridis", 1.0)  # the hot cell of the one-hot head
    assert len(fig.axes) == 2 and fig.axes[1].get_ylabel() == "weight"  # one colour bar


def test_shared_scale_in_the_panels_of_heatmap_figure_and_stat_figure(tmp_path):
    uniform = np.full((8, 8), 1 / 8)
    hot = np.eye(8)
    fig = heatmap_figure(np.stack([uniform, hot]), title="two")
    save_figure(fig, tmp_path / "h.png")
    img = read(tmp_path / "h.png")
    panels = [ax for ax in fig.axes if ax.get_label() != "<colorbar>"]
    bars = [ax for ax in fig.axes if ax.get_label() == "<colorbar>"]
    assert len(panels) == 2 and len(bars) == 1
    # the centre of the uniform panel is the colour of 0.125 on [0, 1], not its own maximum's
    assert close(axes_centre(img, fig, panels[0]), rgb("viridis", 1 / 8))
    assert panels[0].get_images()[0].norm.vmax == panels[1].get_images()[0].norm.vmax == 1.0
    stats = stat_figure(np.arange(6.0).reshape(2, 3), title="s", stat="entropy")
    assert len(stats.axes) == 2 and stats.axes[1].get_ylabel() == "entropy"


def test_scale_per_panel_makes_the_uniform_head_bright_and_says_each_maximum(tmp_path):
    w = one_hot_model(layers=1, heads=2, n=8, hot=(0, 1))
    np.save(tmp_path / "w.npy", w[:, None])
    out = tmp_path / "g.png"
    r = run("inspect", tmp_path / "w.npy", "--png", out, "--scale-per-panel", "--title", "g", "--quiet")
    assert r.exit_code == 0, r.stderr
    fig = model_grid_figure(w, title="g, batch 0", scale=ColourScale(per_panel=True, norm="auto"))  # the default
    img, _, _ = saved(fig, tmp_path / "api.png")
    np.testing.assert_array_equal(read(out), img)
    assert panel_pixel(img, fig, 0, 0) == rgb("viridis", 1.0)  # its own maximum: the top colour
    captions = [t.get_text() for t in fig.mosaic_labels.captions]
    assert captions == ["max 0.125", "max 1"]
    assert "per panel" in fig.axes[1].get_ylabel()
    # heatmap_figure: each panel's title says its maximum, the colour bar says per panel
    few = heatmap_figure(w[0], title="t", scale=ColourScale(per_panel=True))
    titles = [ax.get_title() for ax in few.axes if ax.get_label() != "<colorbar>"]
    assert titles == ["slice [0] (max 0.125)", "slice [1] (max 1)"]
    assert "per panel" in few.axes[-1].get_ylabel()


def test_vmax_clips_and_vmin_sets_the_bottom(tmp_path):
    data = np.array([[0.0, 0.25, 0.5, 1.0]] * 4, np.float32)
    maps = np.stack([data, data[:, ::-1], data, data, data])  # 5 slices: the mosaic path
    fig = slices_mosaic(maps, title="v", scale=ColourScale(vmax=0.5))
    img, _, _ = saved(fig, tmp_path / "v.png")
    assert panel_pixel(img, fig, 0, 0, 0, 1) == rgb("viridis", 0.5)  # 0.25 of [0, 0.5]
    assert panel_pixel(img, fig, 0, 0, 0, 2) == rgb("viridis", 1.0)
    assert panel_pixel(img, fig, 0, 0, 0, 3) == rgb("viridis", 1.0)  # 1.0 clipped to the top colour
    assert fig.axes[1].get_ylim() == pytest.approx((0, 0.5))
    low = slices_mosaic(maps, title="v", scale=ColourScale(vmin=0.25, vmax=0.5))
    img, _, _ = saved(low, tmp_path / "w.png")
    assert panel_pixel(img, low, 0, 0, 0, 0) == rgb("viridis", 0.0) == panel_pixel(img, low, 0, 0, 0, 1)
    # the command line: --vmax on a compute command reaches the figure
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "qkv.npz", **{n: rng.normal(size=(6, 5, 3)).astype(np.float32) for n in "qkv"})
    r = run("scaled", tmp_path / "qkv.npz", "--png", tmp_path / "c.png", "--vmax", "0.5", "--quiet")
    assert r.exit_code == 0, r.stderr


@pytest.mark.parametrize("vmax", [0.0, -1.0])
def test_a_vmax_at_or_below_the_default_bottom_is_kept(tmp_path, vmax):
    # weights are >= 0, so the default bottom is 0: --vmax 0 or -1 must stay the top of the scale (every
    # weight beyond it, in the top colour, the bar's arrow says so), not be replaced by 1 without a word
    data = np.array([[0.0, 0.25, 0.5, 1.0]] * 4, np.float32)
    fig = slices_mosaic(np.stack([data] * 5), title="v", scale=ColourScale(vmax=vmax))
    img, _, _ = saved(fig, tmp_path / "v.png")
    assert fig.axes[1].get_ylim()[1] == pytest.approx(vmax)
    for x in (1, 2, 3):
        assert panel_pixel(img, fig, 0, 0, 0, x) == rgb("viridis", 1.0)
    few = heatmap_figure(data[None], title="t", scale=ColourScale(vmax=vmax))
    assert few.axes[0].get_images()[0].norm.vmax == pytest.approx(vmax)


def test_log_norm_makes_small_weights_visible_and_zeros_are_not_grey(tmp_path):
    data = np.array([[1.0, 1e-2, 1e-3, 0.0]] * 4)
    maps = np.stack([data] * 5)
    linear = slices_mosaic(maps, title="lin")
    img, _, _ = saved(linear, tmp_path / "lin.png")
    assert close(panel_pixel(img, linear, 0, 0, 0, 1), rgb("viridis", 0.0), tol=4)  # 0.01 looks like 0
    log = slices_mosaic(maps, title="log", scale=ColourScale(norm="log"))
    img, _, _ = saved(log, tmp_path / "log.png")
    # from the smallest positive value shown (1e-3) to 1: 1e-2 is a third of the way up
    assert close(panel_pixel(img, log, 0, 0, 0, 1), rgb("viridis", 1 / 3))
    assert panel_pixel(img, log, 0, 0, 0, 0) == rgb("viridis", 1.0)
    assert panel_pixel(img, log, 0, 0, 0, 3) == rgb("viridis", 0.0)  # zero: the bottom colour, not grey
    assert "log scale from 0.001" in log.texts[0].get_text()
    # the default start is at most 4 decades below the top
    tiny = np.stack([np.array([[1.0, 1e-9]])] * 5)
    assert "log scale from 0.0001" in slices_mosaic(tiny, title="t", scale=ColourScale(norm="log")).texts[0].get_text()
    # heatmap_figure: zeros are clipped to the bottom, not masked
    one = heatmap_figure(data, title="one", scale=ColourScale(norm="log"))
    image = one.axes[0].get_images()[0]
    assert not np.ma.getmaskarray(image.get_array()).any() and image.norm.vmin == pytest.approx(1e-3)


def test_power_and_symmetric_norms():
    scaled = make_scaling(ColourScale(norm="power", gamma=0.5), hm_range([0.0, 0.25, 1.0]))
    assert float(scaled.norm(0.25)) == pytest.approx(0.5)  # sqrt(0.25)
    diverging = make_scaling(ColourScale(norm="power", gamma=0.5), hm_range([-1.0, 0.25]), diverging=True)
    assert float(diverging.norm(0.25)) == pytest.approx(0.75) and float(diverging.norm(-0.25)) == pytest.approx(0.25)
    symlog = make_scaling(ColourScale(norm="log"), hm_range([-1.0, 0.5, 1e-3]), diverging=True)
    assert float(symlog.norm(0.0)) == pytest.approx(0.5) and float(symlog.norm(-1.0)) == 0.0
    assert float(symlog.norm(0.1)) - 0.5 > 5 * (0.1 / 2)  # small differences take far more of the scale


def hm_range(values):
    found = ValueRange()
    found.add(np.asarray(values, dtype=np.float64))
    return found


def test_long_maps_say_they_were_aggregated_on_every_path():
    big = np.random.default_rng(0).random((3, 1100, 1100)).astype(np.float32)
    assert "blocks of 3x3, mean" in heatmap_figure(big[0], title="one")._suptitle.get_text()
    assert "blocks of" in heatmap_figure(big, title="few")._suptitle.get_text()
    assert "blocks of" in slices_mosaic(np.stack([big[0]] * 5), title="m").texts[0].get_text()
    assert "blocks of" in model_grid_figure(big[None], title="g", reduce_heads="max").texts[0].get_text()


# ------------------------------------------------------------------------------------------------
# 2. Choosing panels


def constant_heads(layers=4, heads=5, n=4):
    """Every map constant, with its own value: (layer * heads + head + 1) / 100."""
    values = (np.arange(layers * heads, dtype=np.float32).reshape(layers, heads) + 1) / 100
    return np.broadcast_to(values[:, :, None, None], (layers, heads, n, n)).copy(), values


def test_layers_and_heads_choose_the_panels_and_label_them(tmp_path):
    w, values = constant_heads()
    np.save(tmp_path / "w.npy", w[:, None])
    out = tmp_path / "g.png"
    r = run("inspect", tmp_path / "w.npy", "--png", out, "--layers", "3,0", "--heads", "1-2,4", "--quiet")
    assert r.exit_code == 0, r.stderr
    fig = model_grid_figure(w, title=f"attention weights of {tmp_path / 'w.npy'}, batch 0", layers=[3, 0],
                            heads=[1, 2, 4])
    img, _, _ = saved(fig, tmp_path / "api.png")
    np.testing.assert_array_equal(read(out), img)
    top = values[np.ix_([3, 0], [1, 2, 4])].max()
    for r_, layer in enumerate([3, 0]):
        for c, head in enumerate([1, 2, 4]):
            assert close(panel_pixel(img, fig, r_, c), rgb("viridis", values[layer, head] / top), tol=1), (layer, head)
    assert [t.get_text() for t in fig.mosaic_labels.rows] == ["3", "0"]
    assert [t.get_text() for t in fig.mosaic_labels.cols] == ["1", "2", "4"]
    assert "(layers 3,0 of 4, heads 1-2,4 of 5)" in fig.texts[0].get_text().replace("\n", " ")
    # --stats-png draws the same choice, labelled with the real numbers
    stats = tmp_path / "s.png"
    r = run("inspect", tmp_path / "w.npy", "--stats-png", stats, "--layers", "3", "--heads", "2,4", "--quiet")
    assert r.exit_code == 0, r.stderr


def test_one_chosen_map_is_drawn_with_its_axes(tmp_path):
    w, values = constant_heads()
    np.save(tmp_path / "w.npy", w[:, None])
    fig = capture_figure(["inspect", str(tmp_path / "w.npy"), "--png", str(tmp_path / "one.png"), "--layers", "2",
                          "--heads", "3", "--quiet"])
    assert "layer 2, batch 0, head 3" in fig._suptitle.get_text().replace("\n", " ")
    image = fig.axes[0].get_images()[0].get_array()
    np.testing.assert_allclose(image, values[2, 3], rtol=1e-5)


def capture_figure(args):
    captured = []
    original = hm.figure_file  # what save_figure calls too

    def keep(fig, suffix):
        captured.append(fig)
        return original(fig, suffix)

    hm.figure_file = keep
    try:
        r = runner.invoke(app, args)
    finally:
        hm.figure_file = original
    assert r.exit_code == 0, r.stderr
    return captured[0]


def test_compare_draws_the_largest_differences_first(tmp_path):
    a = np.full((3, 1, 4, 5, 5), 0.2, np.float32)
    b = a.copy()
    b[1, 0, 3, 2, 1] += 0.3  # the largest difference: layer 1, head 3
    b[0, 0, 2, 4, 0] -= 0.2  # then layer 0, head 2 (A - B = +0.2)
    b[2, 0, 0, 0, 4] += 0.1  # then layer 2, head 0
    np.save(tmp_path / "a.npy", a)
    np.save(tmp_path / "b.npy", b)
    fig = capture_figure(["compare", str(tmp_path / "a.npy"), str(tmp_path / "b.npy"), "--png",
                          str(tmp_path / "d.png"), "--max-panels", "3", "--quiet"])
    heading = fig.texts[0].get_text().replace("\n", " ")
    assert "the 3 of 12 (layer, head) maps, ordered by largest difference" in heading
    assert [t.get_text() for t in fig.mosaic_labels.captions] == ["1:3 0.3", "0:2 0.2", "2:0 0.1"]
    img = read(tmp_path / "d.png")
    lim = 0.3
    assert close(panel_pixel(img, fig, 0, 0, 2, 1), rgb("RdBu_r", 0.0))  # A - B = -0.3, first
    assert close(panel_pixel(img, fig, 0, 1, 4, 0), rgb("RdBu_r", 0.5 + 0.2 / (2 * lim)))  # +0.2, second
    assert close(panel_pixel(img, fig, 0, 2, 0, 4), rgb("RdBu_r", 0.5 - 0.1 / (2 * lim)))  # -0.1, third
    ranked = rank_panels((a - b)[:, 0].astype(np.float64), [(layer, h) for layer in range(3) for h in range(4)])
    assert [p for p, _ in ranked[:3]] == [(1, 3), (0, 2), (2, 0)]
    assert [s for _, s in ranked[3:]] == [0.0] * 9


def test_compare_norm_and_vmax_are_symmetric(tmp_path):
    a = np.full((2, 1, 2, 4, 4), 0.25, np.float32)
    b = a.copy()
    b[0, 0, 1, 0, 0] = 0.05  # +0.2
    b[1, 0, 0, 0, 0] = 0.26  # -0.01
    np.save(tmp_path / "a.npy", a)
    np.save(tmp_path / "b.npy", b)
    fig = capture_figure(["compare", str(tmp_path / "a.npy"), str(tmp_path / "b.npy"), "--png",
                          str(tmp_path / "d.png"), "--vmax", "0.1", "--norm", "log", "--quiet"])
    low, high = fig.axes[1].get_ylim()
    assert low == pytest.approx(-0.1) and high == pytest.approx(0.1)
    img = read(tmp_path / "d.png")
    assert panel_pixel(img, fig, 0, 0) == rgb("RdBu_r", 1.0)  # +0.2 beyond --vmax: the end colour
    small = panel_pixel(img, fig, 0, 1)  # -0.01 on a symmetric log scale: clearly blue, not white
    assert small[2] - small[0] > 40


def test_reduce_heads_draws_the_mean_of_each_layer(tmp_path):
    rng = np.random.default_rng(3)
    w = rng.dirichlet(np.ones(6), size=(3, 4, 6)).astype(np.float32)  # [3 layers, 4 heads, 6, 6]
    np.save(tmp_path / "w.npy", w[:, None])
    for how, oracle in (("mean", w.astype(np.float64).mean(axis=1)), ("max", w.max(axis=1))):
        fig = capture_figure(["inspect", str(tmp_path / "w.npy"), "--png", str(tmp_path / f"{how}.png"),
                              "--reduce-heads", how, "--quiet"])
        img = read(tmp_path / f"{how}.png")
        assert fig.mosaic_layout.rows == 1 and fig.mosaic_layout.cols == 3  # one column per layer
        assert [t.get_text() for t in fig.mosaic_labels.cols] == ["0", "1", "2"]
        top = oracle.max()
        for layer in range(3):
            for i in range(6):
                for j in range(6):
                    assert close(panel_pixel(img, fig, 0, layer, i, j), rgb("viridis", oracle[layer, i, j] / top)), \
                        (how, layer, i, j)
    assert np.abs(w.mean(axis=1) - w.max(axis=1)).max() > 0.1  # the two oracles differ: the test tells them apart
    # compare --reduce-heads: layers ranked by their largest |mean of A - B|
    b = w.copy()
    b[2] = np.roll(b[2], 1, axis=-1)
    np.save(tmp_path / "b.npy", b[:, None])
    fig = capture_figure(["compare", str(tmp_path / "w.npy"), str(tmp_path / "b.npy"), "--png",
                          str(tmp_path / "c.png"), "--reduce-heads", "mean", "--quiet"])
    first = fig.mosaic_labels.captions[0].get_text()
    assert first.startswith("2:mean ") and float(first.split()[-1]) == pytest.approx(
        np.abs((w - b)[2].astype(np.float64).mean(axis=0)).max(), rel=1e-2)


# ------------------------------------------------------------------------------------------------
# 3. Layout


def drawn_tick_labels(axis):
    """The tick labels an axis draws: those of ticks within its view (matplotlib keeps others); none when
    its axes draws no axis (a mosaic's picture: its labels are texts)."""
    if not axis.axes.axison:
        return []
    low, high = sorted(axis.get_view_interval())
    span = (high - low) * 1e-6
    return [t for t, loc in zip(axis.get_ticklabels(), axis.get_majorticklocs()) if low - span <= loc <= high + span]


def texts_of(fig):
    found = [t for t in fig.texts]
    if fig._suptitle is not None:
        found.append(fig._suptitle)
    for ax in fig.axes:
        found += [ax.title, *([ax.xaxis.label, ax.yaxis.label] if ax.axison else []), *drawn_tick_labels(ax.xaxis),
                  *drawn_tick_labels(ax.yaxis), *ax.texts]
    return [t for t in found if t.get_visible() and t.get_text()]


def assert_nothing_clipped_or_overlapping(fig):
    fig.draw_without_rendering()  # the layout of a draw (constrained layout, ticks, texts), no pixels
    renderer = fig.canvas.get_renderer()
    page = fig.bbox
    for text in texts_of(fig):
        box = text.get_window_extent(renderer)
        assert page.x0 - 1 <= box.x0 and box.x1 <= page.x1 + 1 and page.y0 - 1 <= box.y0 and box.y1 <= page.y1 + 1, \
            text.get_text()
    outer = fig.get_tightbbox(renderer)  # inches
    assert outer.x0 >= -0.01 and outer.y0 >= -0.01
    assert outer.x1 <= fig.get_figwidth() + 0.01 and outer.y1 <= fig.get_figheight() + 0.01
    heading = fig._suptitle if fig._suptitle is not None else fig.texts[0]
    titles = [heading] + [ax.title for ax in fig.axes if ax.title.get_text()]
    boxes = [t.get_window_extent(renderer) for t in titles]
    for n, a in enumerate(boxes):
        for b in boxes[n + 1:]:
            assert not a.overlaps(b), "titles overlap"
    for ax in fig.axes:
        assert not boxes[0].overlaps(ax.get_tightbbox(renderer)), "the heading overlaps a panel"
        others = [ax.get_window_extent(renderer)] + [
            t.get_window_extent(renderer) for t in (ax.xaxis.label, ax.yaxis.label, *drawn_tick_labels(ax.xaxis),
                                                    *drawn_tick_labels(ax.yaxis)) if t.get_text()]
        for title, box in zip(titles[1:], boxes[1:]):
            if title.axes is not ax:  # a panel's title overlaps no other panel, its labels or ticks
                assert not any(box.overlaps(o) for o in others), title.get_text()


LONG = "attention weights of " + "/a/rather/long/folder/name" * 6 + "/dump.npz, batch 0"


@pytest.mark.parametrize("count", [1, 2, 12, 16])
def test_panel_figures_keep_their_text_inside(count):
    rng = np.random.default_rng(0)
    n = 10 if count <= 2 else 20  # values written in the cells of small maps; larger ones draw faster
    maps = rng.dirichlet(np.ones(n), size=(count, n))
    labels = [f"token_{i}_with_a_long_name" for i in range(n)]
    panels = hm.slice_panels(maps, None, "a rather long panel title for a narrow panel")
    fig = heatmap_figure(panels, title=LONG, q_labels=labels, k_labels=labels)
    assert fig.get_figwidth() <= 20 and fig.get_figheight() <= 20  # inches (FIG_MAX)
    assert_nothing_clipped_or_overlapping(fig)


@pytest.mark.parametrize("layers, heads", [(1, 1), (1, 12), (12, 12)])
@pytest.mark.parametrize("scale", [ColourScale(), ColourScale(per_panel=True), ColourScale(norm="log")])
def test_grids_keep_their_text_inside(layers, heads, scale):
    w = np.random.default_rng(1).dirichlet(np.ones(6), size=(layers, heads, 6)).astype(np.float32)
    fig = model_grid_figure(w, title=LONG, scale=scale)
    assert_nothing_clipped_or_overlapping(fig)
    if scale.per_panel:  # every caption fits its panel
        renderer = fig.canvas.get_renderer()
        pw = fig.mosaic_layout.panel[1]
        assert all(t.get_window_extent(renderer).width <= pw + 1 for t in fig.mosaic_labels.captions)


def test_ranked_compare_grid_keeps_its_text_inside():
    diff = np.random.default_rng(2).normal(size=(12, 12, 6, 6)) * 0.01
    ranked = rank_panels(diff, [(layer, h) for layer in range(12) for h in range(12)])
    fig = ranked_grid_figure(diff, ranked, title=LONG, total=144)
    assert_nothing_clipped_or_overlapping(fig)
    pw = fig.mosaic_layout.panel[1]
    assert all(t.get_window_extent(fig.canvas.get_renderer()).width <= pw + 1 for t in fig.mosaic_labels.captions)


def test_coattention_two_panels_and_a_16_head_run_fit(tmp_path):
    rng = np.random.default_rng(0)
    np.save(tmp_path / "a.npy", rng.normal(size=(7, 4)).astype(np.float32))
    np.save(tmp_path / "b.npy", rng.normal(size=(9, 4)).astype(np.float32))
    fig = capture_figure(["coattention", str(tmp_path / "a.npy"), str(tmp_path / "b.npy"), "--png",
                          str(tmp_path / "co.png"), "--title", LONG, "--quiet"])
    assert len([ax for ax in fig.axes if ax.get_label() != "<colorbar>"]) >= 2
    assert_nothing_clipped_or_overlapping(fig)
    # 16 heads of 200 tokens: one picture within the mosaic's cap (it used to be 41 inches wide)
    np.savez(tmp_path / "qkv.npz", **{n: rng.normal(size=(16, 200, 8)).astype(np.float32) for n in "qkv"})
    fig = capture_figure(["scaled", str(tmp_path / "qkv.npz"), "--png", str(tmp_path / "s.png"), "--quiet"])
    assert read(tmp_path / "s.png").shape[1] <= 20 * DPI
    assert_nothing_clipped_or_overlapping(fig)
    # the panel path too: 16 coattention batches of long maps stay within FIG_MAX inches
    np.save(tmp_path / "a16.npy", rng.normal(size=(16, 300, 4)).astype(np.float32))
    np.save(tmp_path / "b16.npy", rng.normal(size=(16, 300, 4)).astype(np.float32))
    fig = capture_figure(["coattention", str(tmp_path / "a16.npy"), str(tmp_path / "b16.npy"), "--png",
                          str(tmp_path / "co16.png"), "--quiet"])
    assert fig.get_figwidth() <= 20 and fig.get_figheight() <= 20  # inches (FIG_MAX)
    assert_nothing_clipped_or_overlapping(fig)


def test_thinned_tick_labels_show_their_position_and_long_ones_are_shortened():
    n = 120
    labels = [f"w{i}" if i != 17 else "a" * 60 for i in range(n)]
    fig = heatmap_figure(np.full((n, n), 1 / n), title="t", q_labels=labels, k_labels=labels)
    ax = fig.axes[0]
    names = [t.get_text() for t in ax.get_xticklabels()]
    positions = [int(p) for p in ax.get_xticks()]
    assert len(names) < n and positions[1] > 1  # thinned
    for position, name in zip(positions, names):
        assert name.startswith(f"{position}:")
        rest = name.split(":", 1)[1]
        assert rest == labels[position] or (rest.endswith("…") and labels[position].startswith(rest[:-1]))
    few = heatmap_figure(np.full((3, 3), 1 / 3), title="t", q_labels=["x", "y", "b" * 60], k_labels=["p", "q", "r"])
    assert [t.get_text() for t in few.axes[0].get_xticklabels()] == ["p", "q", "r"]  # all shown: no positions
    assert few.axes[0].get_yticklabels()[2].get_text().endswith("…")


# ------------------------------------------------------------------------------------------------
# Bad values: exit 2, one line, no file


@pytest.mark.parametrize("command, args, words", [
    ("inspect", ["--vmin", "0.5", "--vmax", "0.1"], "--vmin must be below --vmax"),
    ("inspect", ["--norm", "power:0"], "power:G must be a positive number"),
    ("inspect", ["--norm", "power:x"], "power:G must be a positive number"),
    ("inspect", ["--norm", "power:-1"], "power:G must be a positive number"),
    ("inspect", ["--norm", "cubic"], "expected linear, log, power:G"),
    ("inspect", ["--norm", "log", "--vmax", "-1"], "log scale needs --vmax above 0"),
    ("inspect", ["--norm", "log", "--vmax", "0"], "log scale needs --vmax above 0"),
    ("inspect", ["--norm", "log", "--vmin", "0"], "log scale needs --vmin above 0"),
    ("inspect", ["--vmax", "1", "--scale-per-panel"], "give one of them"),
    ("inspect", ["--layers", "0,4"], "layer 4 is out of range; the weights have 4 layers (0-3)"),
    ("inspect", ["--heads", "-1"], "head -1 is out of range; the weights have 5 heads (0-4)"),
    ("inspect", ["--heads", "3-1"], "goes down"),
    ("inspect", ["--layers", "x"], "expected numbers and ranges"),
    ("inspect", ["--reduce-heads", "median"], "expected one of mean, max"),
    ("inspect", ["--vmax", "nan"], "finite"),
    ("compare", ["--vmax", "-0.1"], "must be positive"),
    ("compare", ["--norm", "power:0"], "power:G must be a positive number"),
    ("compare", ["--layers", "9"], "the weights have 4 layers"),
    ("compare", ["--max-panels", "-1"], "at least 0"),
    ("scaled", ["--vmin", "2", "--vmax", "1"], "--vmin must be below --vmax"),
    ("scaled", ["--norm", "power:0"], "power:G must be a positive number"),
    ("scaled", ["--norm", "log", "--vmin", "-1"], "log scale needs --vmin above 0"),
])
def test_bad_figure_options_are_usage_errors(tmp_path, command, args, words):
    w, _ = constant_heads()
    np.save(tmp_path / "w.npy", w[:, None])
    np.savez(tmp_path / "qkv.npz", **{n: np.ones((3, 2), np.float32) for n in "qkv"})
    inputs = {"inspect": [tmp_path / "w.npy"], "compare": [tmp_path / "w.npy", tmp_path / "w.npy"],
              "scaled": [tmp_path / "qkv.npz"]}[command]
    out = tmp_path / "out.png"
    r = run(command, *inputs, "--png", out, *args, "--quiet")
    assert r.exit_code == 2, (r.stdout, r.stderr)
    assert words in r.stderr and len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr
    assert not out.exists()


# Issue 33, item 9: the grid's token labels where they fit, --stats-png from 0 with its range said, one convention
# for undefined numbers, and the size stitched then merged


def _texts(fig):
    return [t.get_text() for t in fig.findobj(lambda o: hasattr(o, "get_text") and hasattr(o, "get_rotation"))]


def test_the_grid_writes_token_labels_where_they_fit():
    import attnviz

    rng = np.random.default_rng(3)
    tokens = ["[CLS]", "the", "cat", "sat", "on", "the", "mat", "[SEP]"]
    small = rng.dirichlet(np.ones(8), size=(2, 1, 4, 8)).astype(np.float32)
    texts = _texts(attnviz.inspect(small, labels=tokens).figure())
    assert texts.count("cat") == 2 + 4  # the queries of each row of panels, the keys under each of the last row's
    long = rng.dirichlet(np.ones(300), size=(2, 1, 4, 300)).astype(np.float32)
    texts = _texts(attnviz.inspect(long, labels=[f"t{i}" for i in range(300)]).figure())
    assert "t5" not in texts  # in blocks: no token has a cell of its own


def test_stats_png_starts_at_zero_and_says_its_range(tmp_path):
    w = np.full((2, 1, 3, 5, 5), 0.2)
    w[..., 0] += np.array([0.0, 0.002, 0.004]).reshape(1, 1, 3, 1)
    w /= w.sum(-1, keepdims=True)
    np.save(tmp_path / "flat.npy", w)
    import attnviz

    fig = attnviz.inspect(str(tmp_path / "flat.npy")).figure("stats")
    image = fig.axes[0].get_images()[0]
    assert image.norm.vmin == 0.0
    texts = _texts(fig)
    heading = next(" ".join(t.split()) for t in texts if "entropy per" in t)
    assert "from 1.6094" in heading and "colours from 0" in heading, heading
    cells = {t for t in texts if t.startswith("1.609")}
    assert len(cells) == 3  # the three heads told apart (2 decimals wrote 1.61 in every cell)


def test_tables_write_undefined_numbers_as_the_report_does(tmp_path):
    w = np.random.default_rng(1).dirichlet(np.ones(4), size=(1, 1, 2, 4))
    np.save(tmp_path / "w.npy", w)
    r = runner.invoke(app, ["inspect", str(tmp_path / "w.npy"), "--labels", "a,b,c,d"])
    assert r.exit_code == 0, r.stderr
    heads = r.stdout[r.stdout.index("head statistics"):]
    assert "nan" not in heads and "–" in heads  # no token repeats: induction and duplicate undefined


def test_merged_sizes_say_stitched_then_merged(tmp_path):
    rng = np.random.default_rng(2)

    def rows(q, k):
        x = rng.random((1, 2, q, k))
        return (x / x.sum(-1, keepdims=True)).astype(np.float32)

    steps = {f"{s}.{li}": rows(4 if s == 0 else 1, 4 + s) for s in range(5) for li in range(2)}
    np.savez(tmp_path / "gen.npz", **steps)  # a prompt of 4, 8 positions stitched
    (tmp_path / "tok.txt").write_text("\n".join(["▁the", "▁ca", "t", "▁sat", "▁on", "▁a", "▁ma", "t", "▁."]) + "\n")
    r = runner.invoke(app, ["inspect", str(tmp_path / "gen.npz"), "--generation", "--labels", str(tmp_path / "tok.txt"),
                            "--merge-subwords", "--no-table"])
    assert r.exit_code == 0, r.stderr
    line = " ".join(r.stderr.split())
    assert "= [2, 1, 2, 8, 8], then merged into words: [2, 1, 2, 6, 6]" in line, line

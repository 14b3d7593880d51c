"""Pictures at long context: ``--norm auto`` (log where the values span decades, as a long map's block means
do beside a sink column; named in the colour bar and the heading) and ``--scale-skip-keys`` (a sink's column
left out of the scale). Pixels are read back from the saved PNGs (helpers of test_mosaic and test_figures)."""

from __future__ import annotations

import numpy as np
import pytest
from typer.testing import CliRunner

from attnviz.cli import app
from attnviz.render.heatmap import heatmap_figure, save_figure
from attnviz.render.mosaic import model_grid_figure
from attnviz.render.scale import ColourScale, ValueRange, choose_norm, make_scaling
from tests.test_figures import panel_pixel
from tests.test_mosaic import read, rgb, saved


def sink_model(n: int, sink: float = 0.6) -> np.ndarray:
    """[1, 1, n, n] causal rows: ``sink`` on key 0, the rest spread evenly over keys 1..i (row 0: all on key 0)."""
    w = np.zeros((n, n))
    w[:, 0] = sink
    for i in range(1, n):
        w[i, 1:i + 1] = (1 - sink) / i
    w[0, 0] = 1.0
    return w[None, None]


def test_auto_chooses_log_for_a_long_map_and_says_so(tmp_path):
    w = sink_model(1024)
    fig = model_grid_figure(w, title="long", scale=ColourScale(norm="auto"))
    img, _, _ = saved(fig, tmp_path / "long.png")
    label = fig.axes[1].get_ylabel()
    assert label == "weight (log, auto)"
    assert "--norm auto: log" in fig.texts[0].get_text()
    # the picture's blocks (means, worked out here with NumPy), drawn on a log scale from the values shown
    f = fig.mosaic_layout.blocks[0]
    m = -(-1024 // f)
    padded = np.full((m * f, m * f), np.nan)
    padded[:1024, :1024] = w[0, 0]
    blocks = np.nanmean(padded.reshape(m, f, m, f), axis=(1, 3))
    values = ValueRange(histogram=True)
    values.add(blocks)
    scaling = make_scaling(ColourScale(norm="auto"), values)
    assert scaling.log and scaling.scale is not None and scaling.scale.norm == "log"
    y, x = blocks.shape[0] - 3, blocks.shape[1] // 3
    expected = (np.log10(blocks[y, x]) - np.log10(scaling.low)) / (np.log10(scaling.high) - np.log10(scaling.low))
    assert max(abs(a - b) for a, b in zip(panel_pixel(img, fig, 0, 0, y, x), rgb("viridis", expected))) <= 3
    # a short map whose values do not span decades stays linear, and the label says nothing more
    short = np.full((1, 1, 8, 8), 1 / 8)
    short[0, 0, :, 0] = 0.3
    fig = model_grid_figure(short, title="short", scale=ColourScale(norm="auto"))
    assert fig.axes[1].get_ylabel() == "weight"
    values = ValueRange(histogram=True)
    values.add(short[0, 0])
    chosen, why = choose_norm(ColourScale(norm="auto"), values)
    assert chosen.norm == "linear" and not why


def test_auto_and_log_with_zeros_and_masked_cells_draw_no_nan(tmp_path):
    """Zeros (above the diagonal) take the bottom colour and masked rows the grey, never NaN's white."""
    w = sink_model(300)
    keep = np.ones((300, 300), bool)
    keep[-20:] = False  # padded rows
    for norm in ("auto", "log"):
        fig = heatmap_figure(w[0, 0], keep=keep, title="z", scale=ColourScale(norm=norm))
        path = tmp_path / f"{norm}.png"
        save_figure(fig, path)
        image = fig.axes[0].get_images()[0].get_array()
        drawn = np.ma.filled(image, -1.0)
        assert np.isfinite(drawn).all()
        assert image.mask[-1].all() and not image.mask[:280].any()  # masked: the "bad" grey, nothing else
        assert "log" in fig.axes[1].get_ylabel()
        low = fig.axes[0].get_images()[0].norm.vmin
        assert image[5, 200] == pytest.approx(low, rel=1e-4)  # a zero above the diagonal: the bottom of the scale
        assert read(path).size


def test_scale_skip_keys_leaves_a_sink_column_out_of_the_scale(tmp_path):
    w = np.concatenate([sink_model(64), sink_model(64, sink=0.5)], axis=1)  # two heads: a mosaic
    out = tmp_path / "skip.png"
    np.save(tmp_path / "w.npy", w[:, None])
    r = CliRunner().invoke(app, ["inspect", str(tmp_path / "w.npy"), "--png", str(out), "--norm", "linear",
                                 "--scale-skip-keys", "1", "--title", "skip", "--quiet", "--no-table"])
    assert r.exit_code == 0, r.stderr
    fig = model_grid_figure(w, title="skip, batch 0", scale=ColourScale(skip_keys=1))
    img, _, _ = saved(fig, tmp_path / "api.png")
    top = w[0, :, :, 1:].max()  # the scale's top: the largest weight off the sink columns (row 1, key 1)
    assert fig.axes[0].get_images()[0].norm.vmax == pytest.approx(top)
    assert panel_pixel(img, fig, 0, 0, 40, 0) == rgb("viridis", 1.0)  # the sink (0.6) takes the top colour
    expected = w[0, 0, 40, 5] / top
    assert max(abs(a - b) for a, b in zip(panel_pixel(img, fig, 0, 0, 40, 5), rgb("viridis", expected))) <= 3
    assert "the first key left out of the scale" in fig.texts[0].get_text()
    np.testing.assert_array_equal(read(out), img)  # the command draws the same picture

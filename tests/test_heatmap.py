"""Heatmaps: the files open as images of the expected kind, are not blank, and show what they claim."""

from __future__ import annotations

import numpy as np
import pytest
from typer.testing import CliRunner

from attnviz.cli import app
from attnviz.render.heatmap import heatmap_figure, save_figure
from tests.conftest import SAMPLES

runner = CliRunner()


def read_png(path):
    from matplotlib.image import imread

    return imread(path)


def test_single_map_png_is_not_blank(tmp_path):
    out = tmp_path / "a.png"
    r = runner.invoke(app, ["scaled", str(SAMPLES / "seed_example.npz"), "--png", str(out), "--quiet"])
    assert r.exit_code == 0, r.stderr
    img = read_png(out)
    h, w = img.shape[:2]
    assert 250 < h < 2000 and 300 < w < 2000
    rgb = img[..., :3]
    assert rgb.std() > 0.1  # not a blank canvas
    assert len(np.unique(rgb.reshape(-1, 3), axis=0)) > 50  # a colour map, text and axes


def test_grid_for_heads_and_masked_cells(tmp_path):
    out = tmp_path / "grid.png"
    r = runner.invoke(app, ["scaled", str(SAMPLES / "sentence.npz"), "--causal", "--png", str(out), "--quiet"])
    assert r.exit_code == 0, r.stderr
    img = read_png(out)
    assert img.shape[1] > img.shape[0]  # two panels side by side
    grey = np.all(np.abs(img[..., :3] - 0xD9 / 255) < 0.01, axis=-1)
    assert grey.sum() > 1000  # the masked upper triangle is drawn in grey


def test_many_slices_are_capped_with_a_note():
    maps = np.random.default_rng(0).dirichlet(np.ones(5), size=(5, 4, 5))  # 20 slices
    fig = heatmap_figure(maps, title="t", max_panels=16)
    assert len([ax for ax in fig.axes if ax.get_label() != "<colorbar>"]) == 16
    assert "showing 16 of 20 panels" in fig._suptitle.get_text()


def test_long_label_lists_are_thinned():
    n = 200
    maps = np.random.default_rng(0).dirichlet(np.ones(n), size=n)
    labels = [f"tok{i}" for i in range(n)]
    fig = heatmap_figure(maps, title="t", q_labels=labels, k_labels=labels)
    ax = fig.axes[0]
    assert len(ax.get_xticks()) <= 40 and ax.get_xticklabels()[1].get_text() == "5:tok5"  # thinned: position shown


@pytest.mark.parametrize("suffix, magic", [(".svg", b"<?xml"), (".pdf", b"%PDF")])
def test_vector_formats_by_extension(tmp_path, suffix, magic):
    out = tmp_path / f"a{suffix}"
    save_figure(heatmap_figure(np.eye(3), title="t"), out)
    assert out.read_bytes()[:5].startswith(magic)


def test_long_maps_are_block_aggregated_with_honest_axes():
    from attnviz.blocks import block_reduce

    data = np.arange(12.0).reshape(3, 4)
    mean, blocks = block_reduce(data, None, 2, "mean")
    assert blocks == (2, 2)
    np.testing.assert_allclose(mean, [[(0 + 1 + 4 + 5) / 4, (2 + 3 + 6 + 7) / 4], [8.5, 10.5]])
    top, _ = block_reduce(data, None, 2, "max")
    np.testing.assert_allclose(top, [[5, 7], [9, 11]])
    keep = np.ones((3, 4), bool)
    keep[:2, :2] = False
    masked, _ = block_reduce(data, keep, 2, "mean")
    assert np.isnan(masked[0, 0]) and masked[0, 1] == 4.5
    big = np.random.default_rng(0).dirichlet(np.ones(1500), size=1500)
    fig = heatmap_figure(big, title="long", reduce="max")
    ax = fig.axes[0]
    assert ax.get_images()[0].get_array().shape == (500, 500)  # 1500 in blocks of 3
    assert ax.get_xlim() == (-0.5, 1499.5) and "blocks of 3x3, max" in fig._suptitle.get_text()


@pytest.mark.parametrize("count", [None, 1, 2, 3])
def test_a_deflated_picture_is_the_same_picture(monkeypatch, count):
    """A PNG's pixels are deflated by ISA-L (None), or where it is missing by zlib in pieces at once
    (``deflate``): a valid zlib stream whose bytes are the picture's, whatever the threads."""
    import sys
    import zlib

    from attnviz import threads
    from attnviz.render import heatmap

    if count is not None:
        monkeypatch.setitem(sys.modules, "isal", None)  # import isal fails
        monkeypatch.setattr(threads, "THREADS", count)
    monkeypatch.setattr(heatmap, "PIECE", 1000)
    rng = np.random.default_rng(0)
    raw = np.repeat(rng.integers(0, 256, size=(40, 301), dtype=np.uint8), 3, axis=1)  # runs and noise
    packed = heatmap.deflate(raw)
    assert zlib.decompress(packed) == raw.tobytes()
    rgba = np.dstack([raw[:, :300].reshape(40, 100, 3).repeat(1, axis=0), np.full((40, 100, 1), 255, np.uint8)])
    import io

    from PIL import Image

    picture = Image.open(io.BytesIO(heatmap.png_bytes(rgba)))
    assert np.array_equal(np.asarray(picture.convert("RGBA")), rgba)

"""Pictures of summaries and corpus files, checked from the rendered figure (tick labels, titles, scales, sizes):
``--stats-png`` of every kind of file, the axes of a summary's ``--map-png``, and layouts (the pooled grid, the
received profile's spans, the heads map's labels and title). Values drawn are compared with what ``inspect
--json`` reports for the same file, a face computed apart from the picture."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from itertools import combinations
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from typer.testing import CliRunner

from attnviz.cli import app
from attnviz.render.options import FigureOptions
from tests.test_corpus import TEXT, bert_folder  # noqa: F401 - a fixture
from tests.test_summary import _text, llama_folder  # noqa: F401 - a fixture

ROOT = Path(__file__).resolve().parents[1]
SUMMARY = ROOT / "sample_inputs" / "minilm_summary.safetensors"
CORPUS = ROOT / "sample_inputs" / "river_town.minilm.safetensors"
NEEDLE = "The secret code is magic blue."


def invoke(*args: object) -> object:
    result = CliRunner().invoke(app, [str(a) for a in args])
    assert "Traceback" not in result.stderr, result.stderr
    return result


def summary_result(**asked: object) -> object:
    from attnviz.inspection.summary import analyse_summary, open_summary, read_summary

    found = open_summary(str(SUMMARY))
    assert found is not None
    return analyse_summary(read_summary(*found), **asked)  # type: ignore[arg-type]


def drawn(figure: object) -> np.ndarray:
    """The values of a one-panel heatmap's image, as drawn (NaN where masked)."""
    image = figure.axes[0].get_images()[0].get_array()  # type: ignore[attr-defined]
    return np.ma.filled(np.ma.asarray(image, dtype=np.float64), np.nan)


def rendered(figure: object) -> object:
    """The figure drawn on an Agg canvas (as save_figure draws it), its renderer in hand."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    if not isinstance(figure.canvas, FigureCanvasAgg):  # type: ignore[attr-defined]
        FigureCanvasAgg(figure)
    figure.canvas.draw()  # type: ignore[attr-defined]
    return figure.canvas.get_renderer()  # type: ignore[attr-defined]


def texts(figure: object) -> list[str]:
    from matplotlib.text import Text

    rendered(figure)
    return [t.get_text() for t in figure.findobj(Text) if t.get_visible() and t.get_text()]  # type: ignore[attr-defined]


# ---------------------------------------------------------------------------------------------------
# --stats-png of a summary, a corpus file and exact weights


def test_stats_png_of_a_summary_draws_its_columns(tmp_path: Path) -> None:
    from attnviz.render.summary import stat_grid

    doc = json.loads(invoke("inspect", SUMMARY, "--span-text", f"needle={NEEDLE}", "--json").stdout)
    layers, heads = doc["shape"]["sites"], doc["shape"]["heads"]
    table = {name: np.array([[next(r[name] for r in doc["head_stats"] if (r["layer"], r["head"]) == (li, hi))
                              for hi in range(heads)] for li in range(layers)], dtype=np.float64)
             for name in ("sink_mass", "entropy", "first")}
    want = {**table, "on:needle": np.array(doc["spans"]["needle"]["received"], dtype=np.float64),
            "sink_rate": np.array(doc["sink_rate"]["per_head"], dtype=np.float64)}
    result = summary_result(span_texts=[f"needle={NEEDLE}"])
    for stat, values in want.items():
        figure = stat_grid(result, FigureOptions(), stat)
        np.testing.assert_allclose(drawn(figure), values, rtol=1e-6, err_msg=stat)
        words = texts(figure)
        assert f"{stat} per head" in " ".join(words) and stat in figure.axes[1].get_ylabel()
        png = tmp_path / f"{stat.replace(':', '-')}.png"
        done = invoke("inspect", SUMMARY, "--span-text", f"needle={NEEDLE}", "--stats-png", png, "--stat", stat, "-q")
        assert done.exit_code == 0, done.stderr
        assert png.read_bytes()[:4] == b"\x89PNG"


def test_stats_png_of_a_corpus_file_draws_its_columns(tmp_path: Path) -> None:
    from attnviz.corpusfile import read_corpus
    from attnviz.render.corpus import stat_grid

    doc = json.loads(invoke("inspect", CORPUS, "--json").stdout)
    sums = read_corpus(str(CORPUS))
    layers, heads = len(sums.sites), max(sums.heads)
    for stat, key in (("sink_rate", "sink_rate"), ("punctuation", "punctuation"), ("class:articles", "articles"),
                      ("entropy_uniform", "entropy_uniform")):
        values = np.full((layers, heads), np.nan)
        for r in doc["head_stats"]:
            got = r[key] if key in r else r["classes"][key]
            values[r["layer"], r["head"]] = np.nan if got is None else got
        figure = stat_grid(sums, FigureOptions(), stat, str(CORPUS))
        np.testing.assert_allclose(drawn(figure), values, rtol=1e-6, err_msg=stat)
        assert [t.get_text() for t in figure.axes[0].get_yticklabels()] == [str(v) for v in sums.layers]
        png = tmp_path / "s.png"
        done = invoke("inspect", CORPUS, "--stats-png", png, "--stat", stat, "-q")
        assert done.exit_code == 0, done.stderr
        assert png.read_bytes()[:4] == b"\x89PNG"


def test_stats_png_of_retrieval_scores(llama_folder: Path, tmp_path: Path) -> None:  # noqa: F811
    """--stat retrieval draws where --needle scored the heads: the scores of the JSON."""
    needle = "the secret code is magic blue"
    path = tmp_path / "g.safetensors"
    done = invoke("capture", llama_folder, "--text", _text(200, needle), "-o", path, "--summary", "--generate", "3")
    assert done.exit_code == 0, done.stderr
    png = tmp_path / "r.png"
    out = invoke("inspect", path, "--needle", needle, "--stats-png", png, "--stat", "retrieval", "--json")
    assert out.exit_code == 0, out.stderr
    scores = np.array(json.loads(out.stdout)["retrieval"]["scores"], dtype=np.float64)
    from attnviz.inspection.summary import analyse_summary, open_summary, read_summary
    from attnviz.render.summary import stat_grid

    found = open_summary(str(path))
    assert found is not None
    figure = stat_grid(analyse_summary(read_summary(*found), needle=needle), FigureOptions(), "retrieval")
    np.testing.assert_allclose(drawn(figure), scores)
    assert png.read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize(("source", "args", "words"), [
    (SUMMARY, ["--stat", "retrieval"], ["--needle", "sink_mass, local_mass"]),
    (SUMMARY, ["--stat", "punctuation"], ["head table has entropy", "sink_rate"]),
    (SUMMARY, ["--stat", "on:needle"], ["head table has entropy"]),  # no such span asked for
    (CORPUS, ["--stat", "sink_mass"], ["head table has entropy", "sink_rate", "class:articles"]),
    (ROOT / "sample_inputs" / "batch_attn.npz", ["--stat", "sink_rate"], ["summary", "entropy_norm"]),
])
def test_stats_png_refuses_a_column_the_file_lacks(source: Path, args: list[str], words: list[str],
                                                   tmp_path: Path) -> None:
    png = tmp_path / "s.png"
    done = invoke("inspect", source, "--stats-png", png, *args)
    assert done.exit_code == 2, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and f"--stat {args[1]}" in done.stderr
    for word in words:
        assert word in done.stderr
    assert not png.exists()


# ---------------------------------------------------------------------------------------------------
# --map-png of a summary: the chosen rows


@pytest.mark.parametrize("rows", [1, 3])
def test_chosen_rows_have_a_head_tick_per_cell_centre_and_both_axes_labelled(rows: int) -> None:
    from attnviz.render.summary import rows_figure

    result = summary_result()
    s = result.read
    four = replace(s, chosen=s.chosen[:, :, :4, :rows], chosen_positions=s.chosen_positions[:rows])
    figure = rows_figure(replace(result, read=four), FigureOptions(), 5)
    renderer = rendered(figure)
    panels = [ax for ax in figure.axes if ax.get_images()]
    assert len(panels) == rows
    width, height = figure.canvas.get_width_height()
    for ax in panels:
        assert list(ax.get_yticks()) == [0, 1, 2, 3]
        assert [t.get_text() for t in ax.get_yticklabels()] == ["0", "1", "2", "3"]
        left, right, bottom, top = ax.get_images()[0].get_extent()
        assert (top, bottom) == (-0.5, 3.5)  # head k's cell runs from k - 0.5 to k + 0.5: its tick at the centre
        assert ax.get_ylabel().endswith("head")
    label = panels[-1].xaxis.label
    assert label.get_text() == "key position"
    box = label.get_window_extent(renderer)
    assert box.y0 >= 0 and box.x0 >= 0 and box.x1 <= width and box.y1 <= height  # drawn, not cut off


def test_summary_pictures_are_log_scaled_unless_norm_says_otherwise() -> None:
    """docs/long-context.md: summary pictures use a log scale unless --norm says otherwise, even when the values
    span less than a decade; a linear scale's colour bar says each tick's whole value (no 1e-5 over it)."""
    from matplotlib.colors import LogNorm, Normalize

    from attnviz.render.summary import pooled_grid_figure, rows_figure

    result = summary_result()
    s = result.read
    rng = np.random.default_rng(0)
    lk = s.chosen.shape[-1]
    flat = np.full(s.chosen.shape, 1.0 / 19559) * rng.uniform(0.5, 2.0, s.chosen.shape)  # a 19k row's weights
    near = replace(result, read=replace(s, chosen=flat[..., :lk].astype(np.float32)))
    figure = rows_figure(near, FigureOptions(), 0)
    bar = figure.axes[-1]
    image = figure.axes[0].get_images()[0]
    assert isinstance(image.norm, LogNorm) and "(log, auto)" in bar.get_ylabel()
    figure = rows_figure(near, FigureOptions(norm="linear"), 0)
    rendered(figure)
    bar = figure.axes[-1]
    assert type(figure.axes[0].get_images()[0].norm) is Normalize
    assert bar.yaxis.get_offset_text().get_text() == ""
    ticks = [float(t.get_text()) for t in bar.get_yticklabels() if t.get_text()]
    assert len(ticks) > 2 and 5e-5 <= max(ticks) <= 2e-4  # whole values, as the weights are
    grid = pooled_grid_figure(near, FigureOptions())
    assert "(log, auto)" in grid.axes[-1].get_ylabel()


# ---------------------------------------------------------------------------------------------------
# Layouts


def test_pooled_grid_is_tight_and_numbers_its_rows_as_the_exact_grid() -> None:
    from attnviz.render.summary import pooled_grid_figure

    figure = pooled_grid_figure(summary_result(), FigureOptions())
    words = texts(figure)
    assert not any("layers." in w for w in words)
    assert {"0", "1", "2", "3", "4", "5", "11", "layer", "head"} <= set(words)
    width, height = figure.canvas.get_width_height()
    maps = sum(ax.get_window_extent().width * ax.get_window_extent().height for ax in figure.axes if ax.get_images())
    assert maps / (width * height) > 0.6  # the maps fill the picture (they held 16% of 2448 x 1272 pixels)
    assert "blocks of 16x16" in words[-1] or any("blocks of 16x16" in w for w in words)


def _long_profile(lk: int, spans: dict[str, tuple[int, int]]) -> object:
    rng = np.random.default_rng(1)
    read = SimpleNamespace(shape=(3, 1, 2, lk, lk), kind="layers", source="long.safetensors",
                           sites=["layers.0", "layers.1", "layers.2"])
    return SimpleNamespace(read=read, received={"mean": rng.uniform(1e-5, 1e-3, (3, 1, 2, lk))}, batch=0,
                           spans={name: {"start": a, "end": b} for name, (a, b) in spans.items()})


def test_received_profile_shades_a_short_span_visibly_and_names_it_clear_of_the_ticks() -> None:
    from attnviz.render.summary import received_profile_figure

    figure = received_profile_figure(_long_profile(19559, {"needle": (9000, 9007), "start": (0, 5)}), FigureOptions())
    renderer = rendered(figure)
    ax = figure.axes[0]
    shaded = [p for p in ax.patches if p.get_width() > 0]
    assert len(shaded) == 2
    for patch in shaded:
        assert patch.get_window_extent(renderer).width >= 3.5  # pixels: a 7-token span in 19k keys is 0.3
    frame = ax.get_window_extent(renderer)
    ticks = [t.get_window_extent(renderer) for t in (*ax.get_yticklabels(), *ax.get_xticklabels()) if t.get_text()]
    names = [t for t in ax.texts if t.get_text() in ("needle", "start")]
    assert len(names) == 2
    for text in names:
        box = text.get_window_extent(renderer)
        assert frame.x0 <= box.x0 and box.x1 <= frame.x1 and frame.y0 <= box.y0 and box.y1 <= frame.y1
        assert not any(box.overlaps(t) for t in ticks)
        assert not box.overlaps(ax.title.get_window_extent(renderer))
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert labels == ["layer 0", "layer 1", "layer 2"]


def test_heads_map_labels_do_not_overlap_and_write_heads_as_layer_colon_head() -> None:
    from attnviz.corpusfile import read_corpus
    from attnviz.inspection.corpus import closest_pairs
    from attnviz.render.corpus import closest_pairs_table, heads_map_figure

    sums = read_corpus(str(CORPUS))
    figure = heads_map_figure(sums, FigureOptions())
    renderer = rendered(figure)
    ax = figure.axes[0]
    labels = [t for t in ax.texts if t.get_text()]
    boxes = [t.get_window_extent(renderer) for t in labels]
    assert not [(labels[i].get_text(), labels[j].get_text()) for i, j in combinations(range(len(boxes)), 2)
                if boxes[i].overlaps(boxes[j])]
    written = {t.get_text() for t in labels}
    assert all(":" in w and "-" not in w for w in written) and len(written) >= len(sums.head_order) // 2
    pairs = closest_pairs(sums)
    assert {f"{h[0]}:{h[1]}" for a, b, _ in pairs for h in (a, b)} <= written
    a, b, _ = pairs[0]
    assert f"{a[0]}:{a[1]} & {b[0]}:{b[1]}" in ax.get_xlabel()
    from rich.console import Console

    console = Console(record=True, width=100)
    console.print(closest_pairs_table(pairs))
    assert f"{a[0]}:{a[1]}" in console.export_text() and f"{a[0]}-{a[1]}" not in console.export_text()


def test_corpus_pictures_are_titled_by_the_model_s_name(bert_folder: Path, tmp_path: Path) -> None:  # noqa: F811
    """The model's name (its folder's, as titles name a model: capturing.folder.model_name), not its type."""
    from attnviz.corpusfile import read_corpus
    from attnviz.render.corpus import heads_map_figure, layer_strips_figure

    folder = tmp_path / "tiny-encoder"
    shutil.copytree(bert_folder, folder)
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(TEXT)
    out = tmp_path / "c.safetensors"
    done = invoke("capture", folder, "--text-file", corpus, "--corpus", "-o", out)
    assert done.exit_code == 0, done.stderr
    sums = read_corpus(str(out))
    assert sums.meta["model_name"] == "tiny-encoder"
    for make in (heads_map_figure, layer_strips_figure):
        title = make(sums, FigureOptions())._suptitle.get_text()
        assert title.startswith("tiny-encoder: ") and "bert" not in title

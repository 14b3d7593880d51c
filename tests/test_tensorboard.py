"""``attnviz inspect FILE --tensorboard DIR`` for the three kinds of file (exact weights, a summary capture, a corpus
file): the event files, read back with TensorBoard's own reader, hold every head's statistics and tags as
``inspect --json`` reports them for the same file; the write is all or nothing (an unwritable folder, a full disk);
and TensorBoard itself, served on the loopback, lists attnviz's tags in its data API and shows them on its Scalars
and Images pages in headless Chromium (a screenshot of each is kept beside the test's files), and its attnviz
dashboard (``attnviz.monitoring.plugin``) shows the offline report's head view of a run's step."""

from __future__ import annotations

import errno
import json
import os
import shutil
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from attnviz.cli import app
from tests.conftest import ROOT

pytest.importorskip("tensorboard")
runner = CliRunner()
SAMPLES = ROOT / "sample_inputs"


def _events(folder: Path) -> dict[str, list[tuple[int, np.ndarray]]]:
    """Every summary of ``folder``'s event files, read by TensorBoard's own reader: tag -> [(step, value)]."""
    import tensorflow as tf
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(folder), size_guidance={"tensors": 0})
    acc.Reload()
    return {tag: [(e.step, tf.make_ndarray(e.tensor_proto)) for e in acc.Tensors(tag)]
            for tag in acc.Tags()["tensors"]}


@pytest.fixture(scope="module")
def weights_file(tmp_path_factory) -> Path:
    """Softmax weights [2 layers, 2 batch, 3 heads, 6, 6], one head a previous-token head."""
    rng = np.random.default_rng(3)
    scores = rng.normal(size=(2, 2, 3, 6, 6))
    scores[1, :, 2] += 12 * np.eye(6, k=-1)
    w = np.exp(scores - scores.max(-1, keepdims=True))
    path = tmp_path_factory.mktemp("weights") / "w.npy"
    np.save(path, (w / w.sum(-1, keepdims=True)).astype(np.float32))
    return path


def _inspect(*args: str) -> dict:
    done = runner.invoke(app, ["inspect", *args])
    assert done.exit_code == 0, done.stderr
    return done


KINDS = {"weights": None, "summary": "minilm_summary.safetensors", "corpus": "river_town.minilm.safetensors"}


@pytest.mark.parametrize("kind", list(KINDS))
def test_inspect_tensorboard_writes_what_inspect_reports(kind, weights_file, tmp_path):
    """Every numeric column of inspect --json's head_stats is a scalar attnviz/layer_L/head_H/STAT at the step
    asked for, equal to it (float32); each tag of a head's tag text is 1 at .../tag/TAG; the table is the text."""
    from attnviz.inspection.tags import split_tags
    from attnviz.monitoring.tensorboard import TAGS

    path = str(weights_file if KINDS[kind] is None else SAMPLES / KINDS[kind])
    document = json.loads(_inspect(path, "--json").stdout)
    board = tmp_path / "runs" / kind
    done = _inspect(path, "--tensorboard", str(board), "--tensorboard-step", "7", "--no-table")
    assert "saved TensorBoard summaries (step 7)" in done.stderr
    events = _events(board)
    compared = 0
    for head in document["head_stats"]:
        layer, h = head["layer"], head["head"]
        for stat, value in head.items():
            tag = TAGS["statistic"].format(layer=layer, head=h, stat=stat)
            if stat in ("layer", "head", "rows", "texts") or not isinstance(value, float) or tag not in events:
                continue
            ((step, got),) = events[tag]
            assert step == 7
            np.testing.assert_allclose(float(got), value, rtol=1e-6, atol=1e-7, err_msg=tag)
            compared += 1
        for word in split_tags(head["tag"]):
            ((_, got),) = events[TAGS["head tag"].format(layer=layer, head=h, tag=word)]
            assert float(got) == 1.0
    heads = len(document["head_stats"])
    assert compared >= 6 * heads  # every statistic of the face's table
    ((_, text),) = events[TAGS["table"]]
    assert "head statistics" in text.item().decode() or "head" in text.item().decode()
    images = [t for t in events if t in ("attnviz/grid", "attnviz/strips")]
    assert len(images) == 1
    if kind == "weights":  # each layer's picture is its row of the grid, as the grid drew it
        grid = _png(events["attnviz/grid"][0][1])
        tops = [_found_in(_png(events[f"attnviz/layer_{layer}"][0][1]), grid) for layer in (0, 1)]
        assert None not in tops and tops[0] < tops[1]
        ((_, got),) = events[TAGS["statistic"].format(layer=1, head=2, stat="previous")]
        assert float(got) > 0.9  # the head made to attend the previous token


def _png(value: np.ndarray) -> np.ndarray:
    """The pixels of an image summary's PNG (its value: width, height, PNG bytes)."""
    import io

    from PIL import Image

    return np.asarray(Image.open(io.BytesIO(value[2])).convert("RGB"))


def _found_in(part: np.ndarray, whole: np.ndarray) -> int | None:
    """The row at which ``part`` lies in ``whole`` (pixel for pixel, at some column), or None."""
    h, w = part.shape[:2]
    first = part[0].tobytes()
    for y in range(whole.shape[0] - h + 1):
        at = whole[y].tobytes().find(first)
        while at >= 0:
            if at % 3 == 0 and np.array_equal(whole[y:y + h, at // 3:at // 3 + w], part):
                return y
            at = whole[y].tobytes().find(first, at + 1)
    return None


def test_inspect_tensorboard_is_all_or_nothing(weights_file, tmp_path, monkeypatch):
    """A file where the folder would be, and a full disk while the event file is copied in: one line, exit 1, and
    nothing in the log folder (no part file, no event file)."""
    from attnviz.monitoring import tensorboard

    blocker = tmp_path / "file"
    blocker.write_text("")
    done = runner.invoke(app, ["inspect", str(weights_file), "--tensorboard", str(blocker), "--no-table"])
    assert done.exit_code == 1 and len(done.stderr.strip().splitlines()) == 1 and "must be a folder" in done.stderr

    def full(src, dst, *args):
        dst.write(b"\0" * 64)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(tensorboard.shutil, "copyfileobj", full)
    board = tmp_path / "board"
    board.mkdir()
    done = runner.invoke(app, ["inspect", str(weights_file), "--tensorboard", str(board), "--quiet"])
    assert done.exit_code == 1 and "No space left on device" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and os.listdir(board) == []
    monkeypatch.setattr(tensorboard.shutil, "copyfileobj", shutil.copyfileobj)
    done = runner.invoke(app, ["inspect", str(weights_file), "-", "--tensorboard", str(board)])
    assert done.exit_code == 2


def test_several_files_need_a_placeholder(weights_file, tmp_path):
    done = runner.invoke(app, ["inspect", str(weights_file), str(weights_file), "--tensorboard", str(tmp_path / "b")])
    assert done.exit_code == 2 and "{" in done.stderr
    copy = tmp_path / "v.npy"
    shutil.copy(weights_file, copy)
    _inspect(str(weights_file), str(copy), "--tensorboard", str(tmp_path / "runs" / "{stem}"), "--no-table")
    assert sorted(os.listdir(tmp_path / "runs")) == ["v", "w"]


# -- TensorBoard itself


def _get(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=30) as answer:
        return json.load(answer)


@pytest.fixture(scope="module")
def served(weights_file, tmp_path_factory):
    """TensorBoard on the loopback over a log folder with two runs (weights at steps 0 and 1, a corpus file)."""
    from tensorboard import default, program

    from attnviz.monitoring.plugin import AttnvizPluginLoader

    logs = tmp_path_factory.mktemp("logs")
    for step in (0, 1):
        _inspect(str(weights_file), "--tensorboard", str(logs / "weights"), "--tensorboard-step", str(step),
                 "--no-table")
    _inspect(str(SAMPLES / KINDS["corpus"]), "--tensorboard", str(logs / "corpus"), "--no-table")
    plugins = default.get_plugins()  # an installed attnviz brings its dashboard by its tensorboard_plugins entry point
    if not any(p is AttnvizPluginLoader or isinstance(p, AttnvizPluginLoader) for p in plugins):
        plugins = [*plugins, AttnvizPluginLoader()]  # a checkout installed before the entry point: as it loads it
    board = program.TensorBoard(plugins=plugins)
    board.configure(argv=[None, "--logdir", str(logs), "--host", "127.0.0.1", "--port", "0", "--reload_interval",
                          "1", "--load_fast", "false"])
    url = board.launch()  # a server thread of this process: it ends with it
    deadline = time.monotonic() + 60
    while not _get(url + "data/plugin/scalars/tags") and time.monotonic() < deadline:
        time.sleep(0.2)
    return url, logs


def test_tensorboard_s_data_api_lists_attnviz_s_tags(served):
    url, _ = served
    plugins = _get(url + "data/plugins_listing")
    assert {"scalars", "images", "text"} <= set(plugins)
    scalars = _get(url + "data/plugin/scalars/tags")
    assert {"weights", "corpus"} <= set(scalars)
    assert "attnviz/layer_1/head_2/previous" in scalars["weights"]
    assert "attnviz/tags/previous-token" in scalars["weights"]
    assert "attnviz/layer_5/head_11/sink_rate" in scalars["corpus"]
    images = _get(url + "data/plugin/images/tags")
    assert {"attnviz/grid", "attnviz/layer_0", "attnviz/layer_1"} <= set(images["weights"])
    points = _get(url + "data/plugin/scalars/scalars?run=weights&tag=attnviz/layer_1/head_2/previous")
    assert [p[1] for p in points] == [0, 1] and points[0][2] > 0.9


DEEP_TEXT = """
function walk(node, out) {
  if (node.shadowRoot) walk(node.shadowRoot, out);
  for (const child of node.childNodes) {
    if (child.nodeType === 3) out.push(child.textContent); else if (child.nodeName !== 'SCRIPT' &&
        child.nodeName !== 'STYLE') walk(child, out);
  }
  return out;
}
return walk(document, []).join(' ');
"""


@pytest.fixture(scope="module")
def chromium(tmp_path_factory):
    """Headless Chromium (skipped without it, as tests/test_browser), every address but the loopback's sent to a
    proxy that does not exist: TensorBoard's pages are served whole by TensorBoard."""
    from tests.test_browser import start_chromium

    driver = start_chromium(tmp_path_factory, "--window-size=1400,1000", "--proxy-server=127.0.0.1:9")
    yield driver
    driver.quit()


@pytest.mark.parametrize("page, wanted", [("scalars", "attnviz/layer_0/head_0/diagonal"),
                                          ("images", "attnviz/grid")])
def test_tensorboard_s_pages_show_attnviz_s_tags_in_chromium(page, wanted, served, chromium):
    """The Scalars and Images dashboards, loaded in Chromium, show attnviz's tags (read through the pages' shadow
    DOM); a screenshot of each is kept next to the log folder (tensorboard-scalars.png, tensorboard-images.png)."""
    url, logs = served
    chromium.get(f"{url}#{page}")
    deadline = time.monotonic() + 60
    text = ""
    while wanted not in text and time.monotonic() < deadline:
        time.sleep(0.3)
        text = chromium.execute_script(DEEP_TEXT)
    assert wanted in text and "weights" in text
    if page == "images":  # the pictures drawn: an <img> per card, loaded
        deadline = time.monotonic() + 30
        loaded = 0
        while loaded < 1 and time.monotonic() < deadline:
            time.sleep(0.3)
            loaded = chromium.execute_script("""
                function imgs(node, out) { if (node.shadowRoot) imgs(node.shadowRoot, out);
                  for (const c of node.children || []) { if (c.tagName === 'IMG') out.push(c); imgs(c, out); }
                  return out; }
                return imgs(document, []).filter(i => i.complete && i.naturalWidth > 100).length;""")
        assert loaded >= 1
    time.sleep(1)  # the charts drawn
    assert chromium.save_screenshot(str(logs.parent / f"tensorboard-{page}.png"))


def test_the_attnviz_dashboard_shows_the_head_view_of_a_step(served, chromium, weights_file):
    """The plugin is listed and active; its runs route names the steps whose event files name a capture file of
    exact weights (the weights run, not the corpus file); its report is inspect --html's page of that file, whose
    scripts TensorBoard's Content-Security-Policy lets run (the page draws itself); the dashboard's tab shows it."""
    url, logs = served
    listing = _get(url + "data/plugins_listing")["attnviz"]
    assert listing["enabled"] and listing["loading_mechanism"]["module_path"] == "/data/plugin/attnviz/index.js"
    assert _get(url + "data/plugin/attnviz/runs") == {"weights": [0, 1]}
    with urllib.request.urlopen(url + "data/plugin/attnviz/report?run=weights&step=1", timeout=60) as answer:
        policy = answer.headers["Content-Security-Policy"]
        page = answer.read().decode()
    assert "weights, step 1" in page and "sha256-" in policy
    try:
        urllib.request.urlopen(url + "data/plugin/attnviz/report?run=corpus&step=0", timeout=30)
        raise AssertionError("a corpus file has no head view")
    except urllib.error.HTTPError as exc:
        assert exc.code == 404
    chromium.get(url + "data/plugin/attnviz/report?run=weights&step=1")
    deadline = time.monotonic() + 30
    while chromium.execute_script("return document.body && document.body.dataset.ready") != "true":
        assert time.monotonic() < deadline, "the report did not draw itself under TensorBoard's policy"
        time.sleep(0.2)
    chromium.get(url + "#attnviz")
    deadline = time.monotonic() + 60
    text = ""
    while "weights, step 1" not in text and time.monotonic() < deadline:  # the dashboard's frame, then the report's
        time.sleep(0.5)
        text = chromium.execute_script(FRAMES_TEXT)
    assert "weights, step 1" in text and "layer 0, head 0" in text
    assert chromium.save_screenshot(str(logs.parent / "tensorboard-attnviz.png"))


FRAMES_TEXT = """
function walk(node, out) {
  if (node.shadowRoot) walk(node.shadowRoot, out);
  for (const child of node.childNodes) {
    if (child.nodeName === 'IFRAME') { try { walk(child.contentDocument, out); } catch (e) {} }
    else if (child.nodeType === 3) out.push(child.textContent);
    else if (child.nodeName !== 'SCRIPT' && child.nodeName !== 'STYLE') walk(child, out);
  }
  return out;
}
return walk(document, []).join(' ');
"""

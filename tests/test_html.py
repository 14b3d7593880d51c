"""The offline HTML report (``--html``), without a browser: the document is self-contained, hostile
labels stay inert text, the numbers embedded are the arrays' (read back from the page's JSON and
compared with NumPy), long maps are aggregated as a NumPy block mean says, the file is written
all or nothing, and a wrong extension is a usage error. tests/test_browser.py drives the page."""

from __future__ import annotations

import base64
import json
import math
import re
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from attnviz.cli import app
from attnviz.errors import OutputError
from attnviz.render import html as report
from tests.conftest import SAMPLES

runner = CliRunner()

HOSTILE = ["</script><img src=x onerror=alert(1)>", "<b>bold</b>", "&amp; &lt;", '"quoted" \'x\'', "<!--", "]]>",
           "</style><script>alert(2)</script>", "\u202eevil", "tab\there", "ok"]

#: the elements a report is made of, and no others
ELEMENTS = {"html": 1, "head": 1, "meta": 4, "link": 1, "title": 1, "style": 1, "body": 1, "noscript": 1, "p": 1,
            "main": 1, "script": 2}


class Parsed(HTMLParser):
    """Every start tag with its attributes, and the text of each <script> and <style>."""

    def __init__(self, text: str) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.raw: dict[str, list[str]] = {"script": [], "style": []}
        self._open: str | None = None
        self.feed(text)
        self.close()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))
        if tag in self.raw:
            self._open = tag
            self.raw[tag].append("")

    def handle_endtag(self, tag: str) -> None:
        if tag == self._open:
            self._open = None

    def handle_data(self, data: str) -> None:
        if self._open:
            self.raw[self._open][-1] += data


def page_data(text: str) -> dict:
    """The JSON a report embeds, parsed back."""
    parsed = Parsed(text)
    scripts = [tag for tag in parsed.tags if tag[0] == "script"]
    assert scripts[0][1] == {"type": "application/json", "id": "attnviz-data"}
    return json.loads(parsed.raw["script"][0])


def map_values(doc: dict, n: int) -> np.ndarray:
    """Map ``n`` of a report as the page decodes it: little-endian float32, ``cells`` rows."""
    raw = base64.b64decode(doc["maps"][n]["data"])
    return np.frombuffer(raw, "<f4").reshape(doc["cells"])


def softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def model(shape=(2, 1, 3, 6, 5), seed=0) -> np.ndarray:
    return softmax(np.random.default_rng(seed).normal(size=shape) * 2).astype(np.float32)


def write_model(tmp_path: Path, w: np.ndarray, name: str = "w.npy") -> Path:
    path = tmp_path / name
    np.save(path, w)
    return path


def invoke(*args: str):
    return runner.invoke(app, [str(a) for a in args])


# ----------------------------------------------------------------------------------------------
# the document


def test_the_report_is_self_contained(tmp_path):
    w = model()
    out = tmp_path / "r.html"
    r = invoke("inspect", write_model(tmp_path, w), "--html", out, "--quiet")
    assert r.exit_code == 0, r.output
    text = out.read_text(encoding="utf-8")
    assert text.startswith("<!DOCTYPE html>") and text.rstrip().endswith("</html>")
    parsed = Parsed(text)
    # no address of anything: no http(s), no protocol-relative //, every src/href a data: URL
    assert "http:" not in text and "https:" not in text
    for tag, attrs in parsed.tags:
        for name, value in attrs.items():
            if name in ("src", "href", "action", "srcset", "poster", "data"):
                assert value is not None and value.startswith("data:"), (tag, name, value)
            assert "//" not in (value or ""), (tag, name, value)
    scripts = [attrs for tag, attrs in parsed.tags if tag == "script"]
    assert scripts == [{"type": "application/json", "id": "attnviz-data"}, {}]  # no src=, the script inline
    assert [a.get("rel") for t, a in parsed.tags if t == "link"] == ["icon"]  # the data: icon: no favicon request
    csp = [a["content"] for t, a in parsed.tags if t == "meta" and a.get("http-equiv") == "Content-Security-Policy"]
    assert csp and "default-src 'none'" in csp[0] and "connect-src" not in csp[0]  # nothing to fetch from
    script, = parsed.raw["script"][1:]
    style, = parsed.raw["style"]
    for word in ("fetch(", "XMLHttpRequest", "WebSocket", "EventSource", "import(", "sendBeacon", "innerHTML",
                 "outerHTML", "insertAdjacentHTML", "document.write", "eval(", "new Function"):
        assert word not in script, word
    assert "url(" not in style and "@import" not in style and "@font-face" not in style
    doc = page_data(text)
    assert all(thumb_indices(doc, n).shape == tuple(doc["thumbCells"]) for n in range(len(doc["maps"])))
    assert text.count(report._asset("report.js")) == 1 and text.count(report._asset("report.css")) == 1


def test_hostile_labels_are_inert(tmp_path):
    w = model((1, 1, 2, len(HOSTILE), len(HOSTILE)))
    labels = tmp_path / "labels.json"
    labels.write_text(json.dumps(HOSTILE))
    out = tmp_path / "r.html"
    r = invoke("inspect", write_model(tmp_path, w), "--labels", labels, "--html", out, "--title",
               "</title><script>alert(3)</script>", "--quiet")
    assert r.exit_code == 0, r.output
    text = out.read_text(encoding="utf-8")
    counts: dict[str, int] = {}
    for tag, _ in Parsed(text).tags:
        counts[tag] = counts.get(tag, 0) + 1
    assert counts == ELEMENTS  # no <img>, no third <script>, nothing a label or the title could add
    data_text = Parsed(text).raw["script"][0]
    assert "<" not in data_text and ">" not in data_text and "&" not in data_text
    doc = page_data(text)
    # the labels arrive as written (control characters made visible, as everywhere in attnviz)
    expected = [s.replace("\u202e", "\\u202e").replace("\t", "\\t") for s in HOSTILE]
    assert doc["qLabels"] == expected and doc["kLabels"] == expected
    assert doc["title"].startswith("</title><script>")
    assert "<title>&lt;/title&gt;&lt;script&gt;" in text


def test_embed_json_escapes_what_could_end_the_script():
    text = report.embed_json({"a": "</script><!-- & -->", "b": "</SCRIPT >"})
    assert "<" not in text and ">" not in text and "&" not in text
    assert json.loads(text) == {"a": "</script><!-- & -->", "b": "</SCRIPT >"}


# ----------------------------------------------------------------------------------------------
# the numbers


def test_inspect_report_holds_every_map_of_the_batch_entry(tmp_path):
    w = model((2, 2, 3, 6, 5), seed=3)
    q, k = [f"q{i}" for i in range(6)], [f"k{j}" for j in range(5)]
    (tmp_path / "q.txt").write_text("\n".join(q))
    (tmp_path / "k.txt").write_text("\n".join(k))
    out = tmp_path / "r.html"
    r = invoke("inspect", write_model(tmp_path, w), "--q-labels", tmp_path / "q.txt", "--k-labels",
               tmp_path / "k.txt", "--batch", "1", "--layer", "1", "--head", "2", "--html", out, "--quiet")
    assert r.exit_code == 0, r.output
    doc = page_data(out.read_text(encoding="utf-8"))
    assert (doc["rows"], doc["cols"], doc["shape"], doc["cells"], doc["blocks"]) == (2, 3, [6, 5], [6, 5], [1, 1])
    assert doc["qLabels"] == q and doc["kLabels"] == k
    assert [(m["row"], m["col"], m["name"]) for m in doc["maps"]] == [
        (li, hi, f"layer {li}, head {hi}") for li in range(2) for hi in range(3)]
    for n, m in enumerate(doc["maps"]):
        np.testing.assert_array_equal(map_values(doc, n), w[m["row"], 1, m["col"]])
    assert doc["maps"][doc["selected"]]["name"] == "layer 1, head 2"
    # one scale for all: from 0 to the largest weight of the batch entry
    assert doc["scale"]["vmin"] == 0.0 and doc["scale"]["vmax"] == pytest.approx(float(w[:, 1].max()), rel=1e-6)
    assert doc["headView"]["enabled"] is True
    # the statistics: inspect's head statistics of batch entry 1, one row per layer and head
    stats = doc["stats"]
    names = [c["name"] for c in stats["columns"]]
    assert names[:3] == ["layer", "head", "H"]
    assert len(stats["rows"]) == 6 and stats["maps"] == list(range(6))
    one = w[1, 1, 2].astype(np.float64)
    entropy = float(np.mean(-(one * np.log(one)).sum(axis=-1)))  # NumPy's mean row entropy of that head
    row = stats["rows"][1 * 3 + 2]
    assert row[:2] == [1, 2] and row[2] == pytest.approx(entropy, rel=1e-6)
    assert row[names.index("max")] == pytest.approx(float(one.max(axis=-1).mean()), rel=1e-6)


def test_compute_report_holds_the_weights_numpy_computes(tmp_path):
    bundle = np.load(SAMPLES / "sentence.npz")
    q, k = bundle["q"].astype(np.float64), bundle["k"].astype(np.float64)
    expected = softmax(q @ np.swapaxes(k, -1, -2) / math.sqrt(q.shape[-1]))  # scaled dot-product, by hand
    out = tmp_path / "r.html"
    r = invoke("scaled", SAMPLES / "sentence.npz", "--html", out, "--index", "1", "--quiet")
    assert r.exit_code == 0, r.output
    doc = page_data(out.read_text(encoding="utf-8"))
    assert len(doc["maps"]) == expected.shape[0] and doc["selected"] == 1
    for n in range(expected.shape[0]):
        np.testing.assert_allclose(map_values(doc, n), expected[n], rtol=1e-5, atol=1e-6)
    assert doc["qLabels"] == [str(t) for t in bundle["q_labels"]]
    stats = doc["stats"]
    assert [c["name"] for c in stats["columns"]][:2] == ["slice", "H"]
    entropy = -(expected * np.log(expected)).sum(axis=-1).mean(axis=-1)
    assert [row[1] for row in stats["rows"]] == pytest.approx(list(entropy), rel=1e-5)


def test_compare_report_holds_a_minus_b(tmp_path):
    a, b = model((2, 1, 2, 4, 4), seed=1), model((2, 1, 2, 4, 4), seed=2)
    out = tmp_path / "r.html"
    r = invoke("compare", write_model(tmp_path, a, "a.npy"), write_model(tmp_path, b, "b.npy"), "--html", out,
               "--quiet")
    assert r.exit_code == 0, r.output
    doc = page_data(out.read_text(encoding="utf-8"))
    diff = a.astype(np.float64) - b.astype(np.float64)
    for n, m in enumerate(doc["maps"]):
        np.testing.assert_allclose(map_values(doc, n), diff[m["row"], 0, m["col"]], rtol=1e-6, atol=1e-7)
    top = float(np.abs(diff).max())
    assert doc["scale"]["diverging"] and doc["scale"]["vmax"] == pytest.approx(top, rel=1e-6)
    assert doc["scale"]["vmin"] == -doc["scale"]["vmax"]
    row = doc["stats"]["rows"][3]  # layer 1, head 1
    assert row[:2] == [1, 1] and row[2] == pytest.approx(float(np.abs(diff[1, 0, 1]).max()), rel=1e-6)
    assert row[3] == pytest.approx(float(np.abs(diff[1, 0, 1]).mean()), rel=1e-6)


def test_layers_heads_and_vmax_choose_what_the_page_shows(tmp_path):
    w = model((4, 1, 5, 6, 6), seed=4)
    out = tmp_path / "r.html"
    r = invoke("inspect", write_model(tmp_path, w), "--layers", "1,3", "--heads", "0,2-3", "--layer", "3",
               "--head", "2", "--vmax", "0.5", "--html", out, "--quiet")
    assert r.exit_code == 0, r.output
    doc = page_data(out.read_text(encoding="utf-8"))
    assert (doc["rowLabels"], doc["colLabels"]) == (["1", "3"], ["0", "2", "3"])
    names = [m["name"] for m in doc["maps"]]
    assert names == [f"layer {li}, head {hi}" for li in (1, 3) for hi in (0, 2, 3)]
    for n, (li, hi) in enumerate((li, hi) for li in (1, 3) for hi in (0, 2, 3)):
        np.testing.assert_array_equal(map_values(doc, n), w[li, 0, hi])
    assert names[doc["selected"]] == "layer 3, head 2"
    assert [row[:2] for row in doc["stats"]["rows"]] == [[li, hi] for li in (1, 3) for hi in (0, 2, 3)]
    assert doc["stats"]["maps"] == list(range(6))
    assert doc["scale"]["vmax"] == 0.5 and any("--vmax 0.5" in note for note in doc["notes"])


def test_masked_cells_are_nan_in_the_page(tmp_path):
    w = model((1, 1, 1, 4, 4))
    keep = np.tril(np.ones((4, 4), bool))
    w = np.where(keep, w, 0).astype(np.float32)
    np.save(tmp_path / "keep.npy", keep)
    out = tmp_path / "r.html"
    r = invoke("inspect", write_model(tmp_path, w), "--mask", tmp_path / "keep.npy", "--html", out, "--quiet")
    assert r.exit_code == 0, r.output
    doc = page_data(out.read_text(encoding="utf-8"))
    values = map_values(doc, 0)
    assert np.array_equal(np.isnan(values), ~keep) and doc["scale"]["masked"] is True
    np.testing.assert_array_equal(values[keep], w[0, 0, 0][keep])


def block_mean(a: np.ndarray, fr: int, fc: int) -> np.ndarray:
    """Means of fr x fc blocks, the last ones partial: a plain loop, the reference."""
    rows, cols = math.ceil(a.shape[0] / fr), math.ceil(a.shape[1] / fc)
    return np.array([[a[i * fr:(i + 1) * fr, j * fc:(j + 1) * fc].mean() for j in range(cols)] for i in range(rows)])


def test_long_maps_are_aggregated_as_the_pngs_and_the_page_says_so(tmp_path):
    w = model((1, 1, 1, 1030, 600), seed=5)
    out = tmp_path / "r.html"
    r = invoke("inspect", write_model(tmp_path, w), "--html", out, "--quiet")
    assert r.exit_code == 0, r.output
    doc = page_data(out.read_text(encoding="utf-8"))
    # --map-png's aggregation: at most 512 cells a side, blocks of ceil(1030 / 512) = 3 and ceil(600 / 512) = 2
    assert doc["blocks"] == [3, 2] and doc["cells"] == [344, 300] and doc["shape"] == [1030, 600]
    np.testing.assert_allclose(map_values(doc, 0), block_mean(w[0, 0, 0].astype(np.float64), 3, 2), rtol=2e-6)
    assert any("blocks of 3x2" in note for note in doc["notes"])
    assert doc["headView"]["enabled"] is False


def test_the_size_bound():
    # the opened maps of any report hold at most MAX_VALUES numbers; BERT-base: blocks of 4 (128 cells a side)
    assert report.detail_blocks(144, (512, 512)) == (4, 4)
    for count, shape in ((144, (512, 512)), (1024, (128, 128)), (1, (32768, 32768)), (384, (1024, 1024)),
                         (2, (7, 9)), (10_000, (64, 64))):
        fr, fc = report.detail_blocks(count, shape)
        assert count * math.ceil(shape[0] / fr) * math.ceil(shape[1] / fc) <= report.MAX_VALUES
        assert math.ceil(shape[0] / fr) <= 512 and math.ceil(shape[1] / fc) <= 512
    assert report.detail_blocks(2, (7, 9)) == (1, 1) and report.detail_blocks(1, (32768, 32768)) == (64, 64)
    # a report's size follows: 4 bytes a value in base64, and thumbnails of one byte a pixel at most
    w = model((3, 1, 4, 64, 64))

    def get(li: int, hi: int):
        return w[li, 0, hi], None

    text = report.grid_report(get, 3, 4, (64, 64), title="t", row_labels=list("012"), col_labels=list("0123"),
                              row_name="layer", col_name="head", budget=12 * 32 * 32)
    doc = page_data(text)
    assert doc["blocks"] == [2, 2] and doc["cells"] == [32, 32]
    assert [len(m["data"]) for m in doc["maps"]] == [math.ceil(32 * 32 * 4 / 3) * 4] * 12  # float32, base64
    np.testing.assert_allclose(map_values(doc, 5), block_mean(w[1, 0, 1].astype(np.float64), 2, 2), rtol=2e-6)


# ----------------------------------------------------------------------------------------------
# colours


def thumb_indices(doc: dict, n: int) -> np.ndarray:
    """The colour indices of thumbnail ``n``, as the page reads them."""
    return np.frombuffer(base64.b64decode(doc["maps"][n]["thumb"]), np.uint8).reshape(doc["thumbCells"])


def test_thumbnails_share_one_scale_uniform_dark_one_hot_bright_masked_grey():
    uniform = np.full((5, 5), 0.2, np.float32)
    one_hot = np.zeros((5, 5), np.float32)
    one_hot[:, 3] = 1.0
    keep = np.ones((5, 5), bool)
    keep[0, 0] = False

    def get(r: int, c: int):
        return (uniform, keep) if c == 0 else (one_hot, None)

    doc = page_data(report.grid_report(get, 1, 2, (5, 5), title="t", row_labels=[""], col_labels=["0", "1"],
                                       row_name="", col_name="head"))
    assert (doc["scale"]["vmin"], doc["scale"]["vmax"]) == (0.0, 1.0)
    flat, hot = thumb_indices(doc, 0), thumb_indices(doc, 1)
    assert flat[0, 0] == report.LEVELS  # masked
    assert set(flat.ravel()[1:]) == {round(0.2 * (report.LEVELS - 1))}  # dark: a fifth of the way up
    assert set(hot[:, 3]) == {report.LEVELS - 1} and not hot[:, [0, 1, 2, 4]].any()
    lut = np.frombuffer(base64.b64decode(doc["scale"]["lut"]), np.uint8).reshape(-1, 3)
    assert tuple(lut[-1]) == (0xFD, 0xE7, 0x25) and tuple(lut[0]) == (0x44, 0x01, 0x54)  # viridis' ends


def test_colour_tables_follow_matplotlib():
    from matplotlib import colormaps

    for name, diverging in (("viridis", False), ("RdBu_r", True)):
        ours = report.colour_table(None, diverging).astype(int)
        theirs = (colormaps[name](np.linspace(0, 1, report.LEVELS))[:, :3] * 255).round().astype(int)
        assert np.abs(ours - theirs).max() <= 4, name  # of 255: not to be seen
    magma = report.colour_table("magma").astype(int)  # any other name: matplotlib's own
    assert np.array_equal(magma, (colormaps["magma"](np.linspace(0, 1, report.LEVELS))[:, :3] * 255).round())


def test_colour_index_ends_and_nan():
    index = report.colour_index(np.array([-1.0, 0.0, 0.5, 1.0, 2.0, np.nan]), 0.0, 1.0)
    assert list(index) == [0, 0, 127, 254, 254, 255]


# ----------------------------------------------------------------------------------------------
# the command line


@pytest.mark.parametrize("command", ["scaled", "inspect", "compare"])
def test_html_must_end_in_html(tmp_path, command):
    w = write_model(tmp_path, model())
    args = {"scaled": ["scaled", SAMPLES / "sentence.npz"], "inspect": ["inspect", w],
            "compare": ["compare", w, w]}[command]
    r = invoke(*args, "--html", tmp_path / "report.txt")
    assert r.exit_code == 2
    assert "--html" in r.stderr and ".html or .htm" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "report.txt").exists()
    r = invoke(*args, "--html", tmp_path / "REPORT.HTM", "--quiet")
    assert r.exit_code == 0, r.output
    assert (tmp_path / "REPORT.HTM").read_text(encoding="utf-8").startswith("<!DOCTYPE html>")


def test_help_lists_html():
    for command in ("scaled", "inspect", "compare"):
        r = invoke(command, "--help")
        assert r.exit_code == 0 and "--html" in r.stdout


def test_the_report_is_written_all_or_nothing(tmp_path, monkeypatch):
    out = tmp_path / "r.html"
    out.write_text("the old report")
    w = write_model(tmp_path, model())
    import attnviz.io

    real = attnviz.io.save_text

    def half_then_fail(path, text):
        path.write_text(text[: len(text) // 2])
        raise OutputError(f"{path}: cannot write (No space left on device).")

    monkeypatch.setattr(attnviz.io, "save_text", half_then_fail)
    before = sorted(p.name for p in tmp_path.iterdir())
    r = invoke("inspect", w, "--html", out, "--png", tmp_path / "grid.png", "--quiet")
    assert r.exit_code == 1
    assert "r.html" in r.stderr and "staged" not in r.stderr  # the message names the user's file
    assert out.read_text() == "the old report"  # untouched
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # no half file, no staged file, no PNG
    monkeypatch.setattr(attnviz.io, "save_text", real)
    r = invoke("inspect", w, "--html", out, "--quiet")
    assert r.exit_code == 0 and out.read_text(encoding="utf-8").startswith("<!DOCTYPE html>")


def test_assets_are_package_data():
    from importlib import resources

    root = resources.files("attnviz.render").joinpath("assets")
    assert root.joinpath("report.js").read_text(encoding="utf-8").lstrip().startswith("/*")
    assert root.joinpath("report.css").read_text(encoding="utf-8").lstrip().startswith("/*")
    pyproject = (Path(__file__).resolve().parent.parent / "pyproject.toml").read_text()
    assert re.search(r'"attnviz\.render" = \["assets/\*\.js", "assets/\*\.css"\]', pyproject)

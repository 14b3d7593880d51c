"""One label list per batch entry (issue 33, item 2): a padded batch of two different sentences, labelled
entry by entry everywhere (tables, JSON, the PNG's axes, the HTML report, rollout, view, token scores), in
each form docs/labels.md gives (a JSON list of lists, a text file with a blank line between entries, a
list of lists from Python); and a single list on entries whose padding differs is said."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from attnviz.cli import app

runner = CliRunner()
S = 6
SENTENCES = [["[CLS]", "the", "cat", "sat", "down", "[SEP]"], ["[CLS]", "a", "dog", "[SEP]", "[PAD]", "[PAD]"]]


def invoke(*args):
    result = runner.invoke(app, [str(a) for a in args])
    assert "Traceback" not in result.stderr, result.stderr
    return result


def padded_batch():
    """[layers 2, batch 2, heads 2, S, S] as a BERT model weighs a padded batch: entry 1 has 4 real tokens,
    its padded keys get 0 and its padded rows attend the real keys."""
    rng = np.random.default_rng(3)
    am = np.array([[1] * S, [1, 1, 1, 1, 0, 0]])
    scores = rng.normal(size=(2, 2, 2, S, S))
    scores = np.where(am[None, :, None, None, :] == 1, scores, -np.inf)
    w = np.exp(scores - scores.max(-1, keepdims=True))
    return w / w.sum(-1, keepdims=True), am


@pytest.fixture
def files(tmp_path):
    w, am = padded_batch()
    np.save(tmp_path / "w.npy", w)
    np.save(tmp_path / "am.npy", am)
    (tmp_path / "rows.json").write_text(json.dumps(SENTENCES))
    (tmp_path / "rows.txt").write_text("\n\n".join("\n".join(s) for s in SENTENCES) + "\n")
    (tmp_path / "first.txt").write_text("\n".join(SENTENCES[0]) + "\n")
    (tmp_path / "second.txt").write_text("\n".join(SENTENCES[1]) + "\n")
    return tmp_path


@pytest.mark.parametrize("form", ["rows.json", "rows.txt"])
def test_each_entry_gets_its_own_labels_in_tables_and_json(files, form):
    r = invoke("inspect", files / "w.npy", "--labels", files / form, "--mask", files / "am.npy", "--batch", "1",
               "--max-cols", "0")
    assert r.exit_code == 0, r.stderr
    header = next(line for line in r.stdout.splitlines() if "query \\ key" in line)
    assert "dog" in header and "cat" not in header
    assert "warning" not in r.stderr
    doc = json.loads(invoke("inspect", files / "w.npy", "--labels", files / form, "--mask", files / "am.npy",
                            "--batch", "1", "--json").stdout)
    assert doc["labels"]["q"] == SENTENCES[1] and doc["labels"]["per_entry"]["q"] == SENTENCES
    doc = json.loads(invoke("inspect", files / "w.npy", "--labels", files / form, "--json").stdout)
    assert doc["labels"]["q"] == SENTENCES[0]  # entry 0 shown by default


def test_a_text_file_of_one_list_with_an_empty_label_is_one_list(files):
    (files / "gap.txt").write_text("[CLS]\nthe\n\nsat\ndown\n[SEP]\n")  # six labels, one of them empty
    r = invoke("inspect", files / "w.npy", "--labels", files / "gap.txt", "--json")
    assert r.exit_code == 0, r.stderr
    assert json.loads(r.stdout)["labels"]["q"] == ["[CLS]", "the", "", "sat", "down", "[SEP]"]


def test_lists_that_do_not_fit_name_the_entry(files):
    (files / "three.json").write_text(json.dumps([*SENTENCES, SENTENCES[0]]))
    r = invoke("inspect", files / "w.npy", "--labels", files / "three.json")
    assert r.exit_code == 1 and "3 lists of labels (one per batch entry) for 2 batch entries" in r.stderr
    (files / "short.json").write_text(json.dumps([SENTENCES[0], SENTENCES[1][:4]]))
    r = invoke("inspect", files / "w.npy", "--labels", files / "short.json")
    assert r.exit_code == 1 and "batch entry 1): 4 labels for 6 queries" in r.stderr
    (files / "short.txt").write_text("a\nb\nc\n")
    r = invoke("inspect", files / "w.npy", "--labels", files / "short.txt")
    assert r.exit_code == 1 and "give one list per entry" in r.stderr
    r = invoke("scaled", files / "w.npy", files / "w.npy", files / "w.npy", "--labels", files / "rows.json")
    assert r.exit_code == 1 and "one list per batch entry is read by inspect" in r.stderr, r.stderr


def test_one_list_on_different_entries_is_said(files):
    for extra in ([], ["--batch", "1"]):
        r = invoke("inspect", files / "w.npy", "--labels", files / "first.txt", "--mask", files / "am.npy",
                   "--no-table", *extra)
        assert r.exit_code == 0
        (line,) = [x for x in r.stderr.splitlines() if "one list of labels" in x]
        assert "(6, 4 real tokens)" in line and "a JSON list of lists" in line
        r = invoke("rollout", files / "w.npy", "--labels", files / "first.txt", "--mask", files / "am.npy",
                   "--no-table", *extra)
        assert "one list of labels for a padded batch" in r.stderr
    # the list of the entry shown (its pad tokens where it is padded), no mask, or the same padding: nothing
    r = invoke("inspect", files / "w.npy", "--labels", files / "second.txt", "--mask", files / "am.npy", "--batch",
               "1", "--no-table")
    assert "one list of labels" not in r.stderr
    r = invoke("inspect", files / "w.npy", "--labels", files / "first.txt", "--no-table")
    assert "one list of labels" not in r.stderr
    r = invoke("inspect", files / "w.npy", "--labels", files / "rows.json", "--mask", files / "am.npy", "--no-table")
    assert "one list of labels" not in r.stderr


def test_pictures_and_reports_carry_the_entry_s_labels(files):
    import attnviz

    w, am = padded_batch()
    report = attnviz.inspect(w, labels=SENTENCES, mask=am, batch=1)
    assert report.labels == (SENTENCES[1], SENTENCES[1])
    figure = report.figure("map")
    ticks = {t.get_text() for ax in figure.axes for t in ax.get_yticklabels() + ax.get_xticklabels()}
    assert "dog" in ticks and "cat" not in ticks
    r = invoke("inspect", files / "w.npy", "--labels", files / "rows.json", "--batch", "1", "--html",
               files / "r.html", "--no-table")
    assert r.exit_code == 0
    page = (files / "r.html").read_text()
    assert '"qLabels":["[CLS]","a","dog"' in page
    r = invoke("rollout", files / "w.npy", "--labels", files / "rows.json", "--mask", files / "am.npy", "--html",
               files / "ro.html", "--json")
    doc = json.loads(r.stdout)
    assert doc["labels"] == SENTENCES[0] and doc["labels_per_entry"] == SENTENCES
    assert '"qLabelRows":[["[CLS]","the","cat"' in (files / "ro.html").read_text()
    r = invoke("rollout", files / "w.npy", "--labels", files / "rows.json", "--mask", files / "am.npy", "--batch",
               "1", "--max-cols", "0")
    assert "dog" in r.stdout and "cat" not in r.stdout
    rolled = attnviz.rollout(w, labels=SENTENCES, mask=am, batch=1)
    assert rolled.labels == (SENTENCES[1], SENTENCES[1])


def test_the_viewer_names_the_entry_s_tokens(files):
    from attnviz.inspection import inspecting
    from attnviz.inspection.options import InspectOptions, LabelOptions, MaskOptions, Selection
    from attnviz.render.options import FigureOptions
    from attnviz.viewer.model import ViewerModel

    options = InspectOptions(weights=str(files / "w.npy"), labels=LabelOptions(labels=str(files / "rows.json")),
                             masks=MaskOptions(mask=str(files / "am.npy")), selection=Selection(batch=1))
    model = ViewerModel(inspecting.analyse(inspecting.prepare(options)), FigureOptions())
    model.cursor = (2, 2)
    assert "'dog'" in model.cursor_line()


def test_token_scores_read_each_entry_s_tokens():
    from attnviz.inspection.tokens import token_scores

    w = np.zeros((1, 2, 1, 4, 4))
    w[0, :, 0, :, 0] = 1.0  # every query on key 0
    a, b = ["x", "y", "x", "z"], ["x", "x", "y", "z"]
    both = token_scores(w, [a, b])
    # entry 0: query 2 (x) repeats key 0: duplicate 1; entry 1: query 1 (x) repeats key 0: duplicate 1
    assert both["duplicate"][0, 0] == pytest.approx(1.0) and list(both["repeated"]) == [1, 1]
    assert token_scores(w[:, 1:], [b])["induction"][0, 0] == pytest.approx(0.0)


def test_merging_sub_words_of_different_entries_needs_batch(files):
    rows = [["[CLS]", "the", "ca", "##t", "sat", "[SEP]"], ["[CLS]", "a", "do", "##g", "[SEP]", "[PAD]"]]
    (files / "pieces.json").write_text(json.dumps(rows))
    r = invoke("inspect", files / "w.npy", "--labels", files / "pieces.json", "--merge-subwords", "--no-table")
    assert r.exit_code == 2 and "--batch" in r.stderr
    r = invoke("inspect", files / "w.npy", "--labels", files / "pieces.json", "--merge-subwords", "--batch", "1",
               "--json")
    assert r.exit_code == 0, r.stderr
    assert json.loads(r.stdout)["labels"]["q"] == ["[CLS]", "a", "dog", "[SEP]", "[PAD]"]

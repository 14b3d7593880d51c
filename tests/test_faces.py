"""Errors that point the right way, in the words of the face used (issue 33, items 3 and 7): a dump of
a model that returned no weights (SDPA), generate()'s dump read without --generation, and the Python
API's messages in keyword terms (``layer=5``, ``weights[KEY]``, ``generation=True``), its keywords with a
did-you-mean and the command line's output options pointed to where they go."""

from __future__ import annotations

import io
import re

import numpy as np
import pytest
from typer.testing import CliRunner

import attnviz
from attnviz.cli import app
from tests.conftest import LazyModule

torch = LazyModule("torch")  # imported when a test first uses it: not while every worker collects

runner = CliRunner()


def invoke(*args):
    result = runner.invoke(app, [str(a) for a in args])
    assert "Traceback" not in result.stderr, result.stderr
    return result


def _no_weights_said(text):
    return ('attn_implementation="eager"' in text and "output_attentions=True" in text and "SDPA" in text
            and "KEY" not in text)


def generation_dump():
    """generate()'s out.attentions: a tuple of steps, each a tuple of layers [batch, heads, q, keys]."""
    rng = np.random.default_rng(0)

    def rows(q, k):
        w = rng.random((1, 2, q, k))
        return torch.tensor(w / w.sum(-1, keepdims=True), dtype=torch.float32)

    return tuple(tuple(rows(3 if s == 0 else 1, 3 + s) for _ in range(2)) for s in range(3))


def test_dumps_of_a_model_that_returned_no_weights(tmp_path):
    np.savez(tmp_path / "sdpa.npz", *())  # numpy.savez(f, *out.attentions) of an SDPA model
    torch.save((), tmp_path / "sdpa.pt")
    torch.save((None, None), tmp_path / "nones.pt")
    for name in ("sdpa.npz", "sdpa.pt", "nones.pt"):
        for command in ("inspect", "rollout"):
            r = invoke(command, tmp_path / name)
            assert r.exit_code == 1 and _no_weights_said(r.stderr), r.stderr
            assert "attnviz capture (attnviz.capture(model) in Python)" in r.stderr
        with pytest.raises(attnviz.InputError) as info:
            attnviz.inspect(str(tmp_path / name))
        assert _no_weights_said(str(info.value)) and "record it with attnviz.capture(model)." in str(info.value)
    r = invoke("inspect", tmp_path / "sdpa.npz", "--generation")
    assert r.exit_code == 1 and _no_weights_said(r.stderr)
    for value in (None, (), (None, None), [None, np.ones((1, 1, 2, 2))]):
        with pytest.raises(attnviz.InputError) as info:
            attnviz.inspect(value)
        assert _no_weights_said(str(info.value)) and "--" not in str(info.value)


def test_a_generation_dump_points_to_generation(tmp_path):
    torch.save(generation_dump(), tmp_path / "gen.pt")
    r = invoke("inspect", tmp_path / "gen.pt")
    assert r.exit_code == 1 and "read them with --generation" in r.stderr and "gen.pt:KEY" not in r.stderr
    assert invoke("inspect", tmp_path / "gen.pt", "--generation", "--no-table").exit_code == 0
    with pytest.raises(attnviz.ShapeError, match="read them with generation=True"):
        attnviz.inspect(generation_dump())
    assert attnviz.inspect(generation_dump(), generation=True).weights.shape == (2, 1, 2, 5, 5)


def test_python_messages_speak_keywords():
    w = np.full((2, 3, 3), 1 / 3)
    checks = [
        (lambda: attnviz.inspect(w, layer=5), r"^layer=5: the weights have 1"),
        (lambda: attnviz.inspect([np.ones((1, 2, 3, 3)), np.ones((1, 2, 4, 4))]), r"inspect one with weights\[KEY\]"),
        (lambda: attnviz.inspect(np.ones(3)), r"name them with layout="),
        (lambda: attnviz.inspect(np.full((2, 3, 3), np.nan)), r"run with check_finite=True to locate them"),
        (lambda: attnviz.inspect(w, mask_convention="blok"), r"^mask_convention='blok': expected one of"),
        (lambda: attnviz.rollout(np.full((2, 1, 1, 3, 3), np.nan)), r"attnviz\.inspect\(\.\.\., check_finite=True\)"),
        (lambda: attnviz.inspect(object()), r"received an object"),
        (lambda: attnviz.inspect({"attentions": (w,), "logits": w}), r"hand over its attentions: out\.attentions"),
    ]
    for call, pattern in checks:
        with pytest.raises(attnviz.AttnvizError) as info:
            call()
        message = str(info.value)
        assert re.search(pattern, message), message
        assert not re.search(r"(?<![\w-])--[a-z]", message), message  # no command-line option is named


def test_arrays_in_memory_are_named_by_what_they_are():
    w = np.full((2, 1, 2, 3, 3), 1 / 3)
    report = attnviz.inspect(tuple(w))
    assert report.document()["source"] == "the tuple of 2 arrays given"
    assert "attention weights of weights" not in report.html()
    assert attnviz.inspect(w).document()["source"] == "the array [2, 1, 2, 3, 3] given"
    assert attnviz.compare(w, w).document()["a"] == "the array [2, 1, 2, 3, 3] given as a"


def _padded():
    rng = np.random.default_rng(7)
    return rng.dirichlet(np.ones(6), size=(2, 2, 3, 6)).astype(np.float32)


def test_the_command_s_output_options_go_where_they_belong(tmp_path):
    w = _padded()
    report = attnviz.inspect(w, sort="entropy", top=2, png=tmp_path / "g.png", html=str(tmp_path / "r.html"),
                             cmap="magma", map_png=tmp_path / "m.svg", stats_png=tmp_path / "s.png", stat="distance",
                             json_file=tmp_path / "d.json")
    for name in ("g.png", "r.html", "m.svg", "s.png", "d.json"):
        assert (tmp_path / name).stat().st_size > 0, name
    assert report.figure_defaults == {"cmap": "magma"}
    images = [a for ax in report.figure().axes for a in ax.get_images()]
    assert images and all(image.get_cmap().name == "magma" for image in images)
    from rich.console import Console

    console = Console(width=120, record=True, file=io.StringIO())
    console.print(report.table())
    text = console.export_text()
    heads = text[text.index("head statistics"):text.index("tokens that receive")]
    rows = [line.split() for line in heads.splitlines() if line.strip()[:1].isdigit()]
    assert len(rows) == 2  # top=2
    entropies = [float(r[2]) for r in rows]
    assert entropies == sorted(entropies, reverse=True)  # sort="entropy": largest first
    assert attnviz.rollout(w, png=tmp_path / "ro.png", max_rows=3).table_defaults == {"max_rows": 3}
    assert (tmp_path / "ro.png").exists()
    attnviz.compare(w, w * 1.0, png=tmp_path / "c.png", precision=5)
    q = np.ones((3, 4), np.float32)
    attnviz.scaled(q, q, q, png=tmp_path / "s2.png", save_weights=tmp_path / "sw.npy")
    assert np.load(tmp_path / "sw.npy").shape == (3, 3)


def test_keywords_misspelt_or_of_no_use_say_what_to_do():
    w = _padded()
    cases = [(dict(cmpa="x"), "did you mean cmap=?"), (dict(lables=["a"]), "did you mean labels=?"),
             (dict(sotr="entropy"), "did you mean sort=?"), (dict(show=True), "show= goes to the result's .figure()"),
             (dict(json=True), "json= goes to the result's .to_json()")]
    for given, said in cases:
        with pytest.raises(attnviz.UsageError) as info:
            attnviz.inspect(w, **given)
        assert said in str(info.value), str(info.value)
    with pytest.raises(attnviz.UsageError, match="did you mean cmap="):
        attnviz.inspect(w).figure(cmpa="x")


def test_every_result_has_the_same_names_and_the_docs_list_them():
    w = _padded()
    q = np.ones((3, 4), np.float32)
    results = [attnviz.scaled(q, q, q), attnviz.inspect(w), attnviz.compare(w, w), attnviz.rollout(w)]
    common = ("weights", "q_labels", "k_labels", "labels", "warnings", "document", "to_json", "table", "figure",
              "html", "save")
    for result in results:
        for name in common:
            assert hasattr(result, name), (type(result).__name__, name)
        assert isinstance(result.weights, np.ndarray) and isinstance(result.warnings, list)
    assert attnviz.rollout(w).weights is not None and np.array_equal(results[3].weights, results[3].map)
    from tests.conftest import ROOT

    page = (ROOT / "docs" / "python.md").read_text()
    table = page[page.index("## Results"):page.index("## Reference")]
    for name in (*common, "head_stats", "checks", "passed", "comparison", "map", "maps", "output", "params"):
        assert f"`{name}" in table, name

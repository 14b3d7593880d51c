"""Errors that point the right way, in the words of the face used (issue 33, items 3 and 7): a dump of
a model that returned no weights (SDPA), generate()'s dump read without --generation, and the Python
API's messages in keyword terms (``layer=5``, ``weights[KEY]``, ``generation=True``), its keywords with a
did-you-mean and the command line's output options pointed to where they go."""

from __future__ import annotations

import re

import numpy as np
import pytest
from typer.testing import CliRunner

import attnviz
from attnviz.cli import app

runner = CliRunner()
torch = pytest.importorskip("torch")


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

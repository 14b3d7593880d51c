"""Start-up stays light: help, version and input errors never import TensorFlow or matplotlib
(checked in fresh interpreters, since the test process itself has imported both)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import ROOT, SAMPLES

HEAVY = ("tensorflow", "matplotlib", "keras")

PROBE = """
import contextlib, io, sys
from attnviz.cli import app
with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
    try:
        app({args!r})
    except SystemExit as exc:
        code = exc.code
print(code, " ".join(m for m in {heavy!r} if m in sys.modules))
"""


def probe(args, heavy=HEAVY):
    out = subprocess.run([sys.executable, "-c", PROBE.format(args=args, heavy=heavy)], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    code, _, loaded = out.stdout.strip().partition(" ")
    return int(code), loaded.split()


@pytest.mark.parametrize("args", [["--help"], ["--version"], ["scaled", "--help"], ["variants"]])
def test_help_imports_no_numpy_tensorflow_or_matplotlib(args):
    code, loaded = probe(args, heavy=(*HEAVY, "numpy"))
    assert code == 0 and loaded == []


@pytest.mark.parametrize("args, expected", [
    (["scaled", "missing.npy", "k.npy", "v.npy"], 2),
    (["scaled", str(SAMPLES / "q.npy"), str(SAMPLES / "q.npy"), str(SAMPLES / "v.npy")], 1),  # Lk differs
    (["scaled", str(SAMPLES / "seed_example.npz"), "--mask", str(SAMPLES / "tokens.txt")], 2),
])
def test_input_errors_fail_before_tensorflow(args, expected):
    code, loaded = probe(args)
    assert code == expected and loaded == []

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


def _run_scaled(env_extra):
    import os

    env = {k: v for k, v in os.environ.items() if k not in ("TF_CPP_MIN_LOG_LEVEL", "ATTNVIZ_DEBUG")}
    env.update(env_extra)
    args = ["scaled", *(str(SAMPLES / f"{n}.npy") for n in "qkv"), "--quiet"]
    return subprocess.run([sys.executable, "-m", "attnviz", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=180, env=env)


TF_CHATTER = ("absl::InitializeLog", "oneDNN", "cuda drivers", "cudart_stub")


@pytest.mark.parametrize("env", [{}, {"TF_CPP_MIN_LOG_LEVEL": "3"}])
def test_tensorflow_start_up_lines_never_reach_the_user(env):
    """People export TF_CPP_MIN_LOG_LEVEL=3 to silence TensorFlow; some start-up lines are written
    before TensorFlow reads it, so attnviz silences them itself unless they are asked for."""
    out = _run_scaled(env)
    assert out.returncode == 0, out.stderr
    assert not any(s in out.stderr for s in TF_CHATTER), out.stderr


def test_tensorflow_start_up_lines_on_request():
    """ATTNVIZ_DEBUG=1 (or a TF_CPP_MIN_LOG_LEVEL of 0 to 2) lets TensorFlow speak: nothing is hidden then."""
    from attnviz.device import tensorflow_chatter_wanted

    out = _run_scaled({"ATTNVIZ_DEBUG": "1"})
    assert out.returncode == 0, out.stderr
    import os

    saved = {k: os.environ.pop(k, None) for k in ("TF_CPP_MIN_LOG_LEVEL", "ATTNVIZ_DEBUG")}
    try:
        assert not tensorflow_chatter_wanted()
        for level, wanted in (("0", True), ("2", True), ("3", False)):
            os.environ["TF_CPP_MIN_LOG_LEVEL"] = level
            assert tensorflow_chatter_wanted() is wanted
        os.environ.pop("TF_CPP_MIN_LOG_LEVEL")
        os.environ["ATTNVIZ_DEBUG"] = "1"
        assert tensorflow_chatter_wanted()
    finally:
        for k, v in saved.items():
            os.environ.pop(k, None)
            if v is not None:
                os.environ[k] = v

"""Start-up stays light: help, version and input errors never import TensorFlow or matplotlib
(checked in fresh interpreters, since the test process itself has imported both), and a cold run of
the console script (``attnviz.cli.console``) never imports pydantic: its coercion of option values is
Typer's, without the TypeAdapters, and gives the same values and messages."""

from __future__ import annotations

import subprocess
import sys

import pytest

from attnviz.cli import app
from tests.conftest import ROOT, SAMPLES

HEAVY = ("tensorflow", "matplotlib", "keras", "textual")

PROBE = """
import contextlib, io, sys
from {entry} import {name}
with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
    try:
        {name}({args!r})
    except SystemExit as exc:
        code = exc.code
print(code, " ".join(m for m in {heavy!r} if m in sys.modules))
"""


def probe(args, heavy=HEAVY, entry="attnviz.cli.app"):
    """``entry(args)`` in a fresh interpreter, its output swallowed: (exit code, the modules of ``heavy`` it
    imported). ``entry`` is the Typer application, or ``attnviz.cli.console.run`` (the console script's runner)."""
    module, name = entry.rsplit(".", 1)
    code = PROBE.format(entry=module, name=name, args=args, heavy=heavy)
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    code, _, loaded = out.stdout.strip().partition(" ")
    return int(code), loaded.split()


@pytest.mark.parametrize("args", [["--help"], ["--version"], ["scaled", "--help"], ["variants"], ["view", "--help"]])
def test_help_imports_no_numpy_tensorflow_or_matplotlib(args):
    code, loaded = probe(args, heavy=(*HEAVY, "numpy"))
    assert code == 0 and loaded == []


@pytest.mark.parametrize("args, expected", [
    (["scaled", "missing.npy", "k.npy", "v.npy"], 2),
    (["scaled", str(SAMPLES / "q.npy"), str(SAMPLES / "q.npy"), str(SAMPLES / "v.npy")], 1),  # Lk differs
    (["scaled", str(SAMPLES / "seed_example.npz"), "--mask", str(SAMPLES / "tokens.txt")], 2),
    (["inspect", str(SAMPLES / "vit_attn.npz"), "--image", str(SAMPLES / "cat.png"), "--patch-grid", "14x15",
      "--overlay-png", "out.png"], 1),  # a grid that does not fit: no Pillow needed to say so, no matplotlib
])
def test_input_errors_fail_before_tensorflow(args, expected):
    code, loaded = probe(args)
    assert code == expected and loaded == []


@pytest.mark.parametrize("args, expected", [
    (["--help"], 0), (["scaled", "--help"], 0), (["serve", "--help"], 0),
    (["scaled", "missing.npy", "k.npy", "v.npy"], 2),
    (["scaled", str(SAMPLES / "q.npy"), str(SAMPLES / "k.npy"), str(SAMPLES / "v.npy"), "--precision", "x"], 2),
    (["inspect", str(SAMPLES / "q.npy"), "--top", "0"], 2),
])
def test_a_cold_run_imports_no_pydantic(args, expected):
    """Nor any other command's module: a cold run registers the command it runs only (--help lists them all)."""
    own = "compute" if args[0] == "scaled" else args[0]
    others = [f"attnviz.cli.commands.{m}" for m in ("compute", "inspect", "compare", "batch", "serve", "rollout",
                                                     "repeat_test", "view", "variants")
              if m != own and not args[0].startswith("-")]
    code, loaded = probe(args, heavy=(*HEAVY, "pydantic", *others), entry="attnviz.cli.console.run")
    assert code == expected and loaded == []


COERCION_CASES = [
    ["variants"],
    ["scaled", str(SAMPLES / "seed_example.npz"), "--causal", "--json", "--precision", "4", "--seed", "7"],
    ["scaled", "q.npy", "--precision", "x"], ["scaled", "q.npy", "--precision", "13"],
    ["scaled", "q.npy", "--device", "tpu"], ["scaled", "q.npy", "--dtype", "float8"],
    ["scaled", "q.npy", "--max-memory", "12zz"], ["scaled", "q.npy", "--seed", "-1"],
    ["scaled", "q.npy", "--index", "a,b"], ["scaled", "q.npy", "--mask"], ["scaled", "q.npy", "--causal-align", "x"],
    ["scaled", "q.npy", "--mask-convention", "KEEP"], ["local", "q.npy", "--window", "1.5"],
    ["inspect", "w.npy", "--top", "0"], ["inspect", "w.npy", "--atol", "nan"], ["inspect", "w.npy", "--sort", "x"],
    ["batch", "jobs.jsonl", "--jobs", "0"], ["serve", "--idle-timeout", "soon"], ["scaled"], ["scaled", "--bogus"],
    ["--no-server", "variants", "--json"], ["scaled", "--help"], ["serve", "--status", "--stop"],
]


@pytest.mark.parametrize("args", COERCION_CASES, ids=" ".join)
def test_direct_coercion_is_typers(args):
    """Values and messages through attnviz.cli.console's command (also as built for one command) are those
    of Typer's own command."""
    import contextlib
    import io

    import typer.main

    from attnviz.cli.console import click_command

    def invoke(command):
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                command.main(args=list(args), prog_name="attnviz")
                code = 0
            except SystemExit as exc:
                code = exc.code
        return code, out.getvalue(), err.getvalue()

    expected = invoke(typer.main.get_command(app))
    assert invoke(click_command()) == expected
    if not args[0].startswith("-"):  # a cold run builds the command it runs only
        assert invoke(click_command(args[0])) == expected


#: ``python -m attnviz ARGV``, which then writes the heavy modules it loaded to the file named by ``$LOADED``
LOADED_AT_EXIT = """
import atexit, os, runpy, sys
atexit.register(lambda: open(os.environ["LOADED"], "w").write(" ".join(m for m in {heavy!r} if m in sys.modules)))
sys.argv = ["attnviz", *{args!r}]
runpy.run_module("attnviz", run_name="__main__", alter_sys=True)
"""


def _run_scaled(env_extra, tmp_path):
    import os

    env = {k: v for k, v in os.environ.items() if k not in ("TF_CPP_MIN_LOG_LEVEL", "ATTNVIZ_DEBUG")}
    env["ATTNVIZ_NO_SERVER"] = "1"  # a cold run, whatever worker the user runs
    env["LOADED"] = str(tmp_path / "loaded")
    env.update(env_extra)
    args = ["scaled", *(str(SAMPLES / f"{n}.npy") for n in "qkv"), "--quiet"]
    out = subprocess.run([sys.executable, "-c", LOADED_AT_EXIT.format(heavy=HEAVY, args=args)], cwd=ROOT,
                         capture_output=True, text=True, timeout=180, env=env)
    return out, (tmp_path / "loaded").read_text().split() if out.returncode == 0 else None


TF_CHATTER = ("absl::InitializeLog", "oneDNN", "cuda drivers", "cudart_stub")


@pytest.mark.parametrize("env", [{}, {"TF_CPP_MIN_LOG_LEVEL": "3"}])
def test_tensorflow_start_up_lines_never_reach_the_user(env, tmp_path):
    """People export TF_CPP_MIN_LOG_LEVEL=3 to silence TensorFlow; some start-up lines are written
    before TensorFlow reads it, so attnviz silences them itself unless they are asked for.

    And TensorFlow comes without Keras and matplotlib: TensorFlow imports Keras 3 eagerly, and Keras
    imports matplotlib's pyplot and its application models, a fifth of TensorFlow's start-up for an API
    attnviz never calls (a PNG loads matplotlib itself; Keras loads when asked afterwards:
    test_keras_loads_after_tensorflow_when_asked)."""
    out, loaded = _run_scaled(env, tmp_path)
    assert out.returncode == 0, out.stderr
    assert not any(s in out.stderr for s in TF_CHATTER), out.stderr
    assert loaded == ["tensorflow"]


def test_tensorflow_start_up_lines_on_request(tmp_path):
    """ATTNVIZ_DEBUG=1 (or a TF_CPP_MIN_LOG_LEVEL of 0 to 2) lets TensorFlow speak: nothing is hidden then."""
    from attnviz.device import tensorflow_chatter_wanted

    out, _ = _run_scaled({"ATTNVIZ_DEBUG": "1"}, tmp_path)
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


def test_keras_loads_after_tensorflow_when_asked():
    from attnviz.device import tensorflow

    tf = tensorflow()
    import keras

    layer = keras.layers.AdditiveAttention()
    q = tf.ones((1, 2, 3))
    assert tuple(layer([q, q]).shape) == (1, 2, 3)
    assert tf.keras.layers.Dense is keras.layers.Dense


def test_threads_asking_for_tensorflow_at_once_import_it_once_and_keep_stderr(monkeypatch):
    """`batch --jobs N` asks for TensorFlow from N threads at once. Each import points file descriptor 2 at
    /dev/null for its duration; two at once put back what the other had left, and stderr stayed silenced for the
    rest of the run (the batch's progress and summary lines were lost). One thread imports; the others wait."""
    import os
    import threading
    import time

    from attnviz import device

    real = device._silenced_fd2
    entered = []

    def slow(silence):  # the import of a cold process takes seconds: let the threads meet inside it
        entered.append(threading.get_ident())
        with real(silence):
            time.sleep(0.2)
            yield

    monkeypatch.setattr(device, "_silenced_fd2", device.contextmanager(slow))
    monkeypatch.setattr(device, "_imported", None)
    monkeypatch.delenv("ATTNVIZ_DEBUG", raising=False)
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "3")
    before = os.fstat(2)
    barrier = threading.Barrier(4)
    got = []

    def ask():
        barrier.wait()
        got.append(device.tensorflow())

    threads = [threading.Thread(target=ask) for _ in range(4)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    after = os.fstat(2)
    assert (after.st_dev, after.st_ino) == (before.st_dev, before.st_ino)
    assert len(entered) == 1 and len(got) == 4 and len({id(m) for m in got}) == 1

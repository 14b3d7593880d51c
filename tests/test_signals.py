"""Ctrl-C (SIGINT), SIGTERM and SIGHUP in the middle of a run (issue 24, "Signals"): real processes, signalled
while they work. A cold run removes what it staged and exits 130, 143 or 129 with one line (none where its
terminal hung up); a batch ends after the job it cut short, its results manifest holds a whole line for every
job that finished and none for that one, and ``--resume`` then completes it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from attnviz.cli import app
from tests.conftest import ROOT

ENV = {**{k: v for k, v in os.environ.items() if not k.startswith("ATTNVIZ_")}, "ATTNVIZ_NO_SERVER": "1",
       "PYTHONPATH": str(ROOT)}
CODES = {signal.SIGINT: (130, "attnviz: interrupted"), signal.SIGTERM: (143, "attnviz: terminated"),
         signal.SIGHUP: (129, "attnviz: hung up")}


def weights(path: Path, shape: tuple[int, ...]) -> None:
    w = np.random.default_rng(0).random(shape, dtype=np.float32)
    np.save(path, w / w.sum(-1, keepdims=True))


def _default_sigint() -> None:  # in the child: as a terminal starts a command (a test runner may ignore SIGINT,
    signal.signal(signal.SIGINT, signal.SIG_DFL)  # and an ignored SIGINT stays ignored, in Python as in attnviz)


def start(args: list[str], cwd: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "attnviz", *args], cwd=cwd, env=ENV, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, preexec_fn=_default_sigint)


def signal_when(proc: subprocess.Popen, ready, sig: int, timeout: float = 60) -> None:
    """Send ``sig`` as soon as ``ready()`` holds (polled every 5 ms); fail if the process ends first."""
    deadline = time.monotonic() + timeout
    while not ready():
        assert proc.poll() is None, f"ended before the signal: {proc.communicate()}"
        assert time.monotonic() < deadline
        time.sleep(0.005)
    proc.send_signal(sig)


def staged(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if ".staged" in p.name)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_a_cold_run_signalled_while_it_draws_leaves_nothing(tmp_path, sig):
    weights(tmp_path / "w.npy", (12, 12, 64, 64))
    before = sorted(p.name for p in tmp_path.iterdir())
    proc = start(["inspect", "w.npy", "--png", "grid.png", "--json-file", "d.json", "--quiet"], tmp_path)
    signal_when(proc, lambda: staged(tmp_path), sig)  # its outputs are reserved: it is drawing
    out, err = proc.communicate(timeout=60)
    code, line = CODES[sig]
    assert (proc.returncode, err.decode(), out) == (code, line + "\n", b"")
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # no output, nothing staged left


def test_a_run_whose_terminal_hangs_up_leaves_nothing(tmp_path):
    """The terminal of a run goes away (an ssh connection that drops): the kernel sends SIGHUP to the run, which
    leads the terminal's session, and every later write to the terminal fails (EIO). What it staged is removed
    all the same, and it exits 129 (it used to end on the spot, its staged file left behind)."""
    import fcntl
    import pty
    import termios

    weights(tmp_path / "w.npy", (12, 12, 64, 64))
    before = sorted(p.name for p in tmp_path.iterdir())
    main, terminal = pty.openpty()

    def login() -> None:  # in the child: a session of its own, the terminal its controlling one (as sshd starts it)
        os.setsid()
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)
        _default_sigint()

    proc = subprocess.Popen([sys.executable, "-m", "attnviz", "inspect", "w.npy", "--png", "grid.png", "--json-file",
                             "d.json", "--quiet"], cwd=tmp_path, env=ENV, stdin=terminal, stdout=terminal,
                            stderr=terminal, preexec_fn=login)
    os.close(terminal)
    try:
        deadline = time.monotonic() + 60
        while not staged(tmp_path):  # its outputs are reserved: it is drawing
            assert proc.poll() is None, "ended before the terminal went away"
            assert time.monotonic() < deadline
            time.sleep(0.005)
    finally:
        os.close(main)  # the terminal hangs up
    assert proc.wait(timeout=60) == 129
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # no output, nothing staged left


def records(path: Path) -> list[dict]:
    text = path.read_text() if path.exists() else ""
    assert text == "" or text.endswith("\n")
    return [json.loads(line) for line in text.splitlines()]  # every line whole


@pytest.mark.parametrize("sig, jobs", [(signal.SIGTERM, 1), (signal.SIGINT, 3), (signal.SIGHUP, 2)])
def test_a_batch_signalled_between_jobs_keeps_whole_lines_and_resumes(tmp_path, monkeypatch, sig, jobs):
    weights(tmp_path / "w.npy", (2, 4, 48, 48))
    n = 16
    job = {"command": "inspect", "args": ["w.npy"]}
    (tmp_path / "jobs.jsonl").write_text("".join(
        json.dumps({**job, "options": {"png": f"o{i}.png", "json-file": f"d{i}.json"}}) + "\n" for i in range(n)))
    results = tmp_path / "results.jsonl"
    proc = start(["batch", "jobs.jsonl", "--results", "results.jsonl", "--jobs", str(jobs), "--quiet"], tmp_path)
    signal_when(proc, lambda: results.exists() and results.read_text().count("\n") >= 2, sig)
    out, err = proc.communicate(timeout=60)
    code, line = CODES[sig]
    assert proc.returncode == code and err.decode().endswith(line + "\n"), err
    finished = records(results)
    assert 2 <= len(finished) < n and all(r["exit_code"] == 0 for r in finished)
    outputs = sorted(p.name for p in tmp_path.glob("[od]*.*"))
    assert outputs == sorted(f"{p}{r['index']}.{ext}" for r in finished for p, ext in (("o", "png"), ("d", "json")))
    assert staged(tmp_path) == []
    monkeypatch.chdir(tmp_path)  # --resume in this process: what is left to do is plain work
    resumed = CliRunner().invoke(app, ["batch", "jobs.jsonl", "--results", "results.jsonl", "--resume", "--quiet"])
    assert resumed.exit_code == 0, resumed.output
    assert sorted(r["index"] for r in records(results)) == list(range(n))
    assert len(list(tmp_path.glob("o*.png"))) == n and staged(tmp_path) == []


class WritingRunner:
    """A batch's runner whose every job writes its one output after a moment (in the job's thread)."""

    def execute(self, argv: list[str], /) -> int:
        time.sleep(0.05)
        Path(argv[1]).write_text("done")
        return 0

    def commands(self) -> set[str]:
        return {"write"}

    def takes_quiet(self, command: str, /) -> bool:
        return False


@pytest.mark.parametrize("workers", [1, 3])
def test_a_signal_while_a_result_is_recorded_keeps_it(tmp_path, workers):
    """A signal that reaches the main thread while it hands a finished job's result over and records it (not
    while it waits for the jobs) is raised once the record is written: every job whose output is written
    has its line in the results manifest (a signal raised there once left finished jobs unrecorded)."""
    from attnviz import interrupts
    from attnviz.batch.jobs import Job
    from attnviz.batch.running import BatchPlan, run_batch

    jobs = [Job(i + 1, "write", ["write", str(tmp_path / f"o{i}.txt")], index=i,
                outputs=[("--out", str(tmp_path / f"o{i}.txt"))]) for i in range(12)]
    results = tmp_path / "results.jsonl"
    plan = BatchPlan(jobs, jobs, list(jobs), [], (0, 1), str(results))
    calls = []

    def progress() -> None:  # in the main thread, as each finished job's result is handed over
        calls.append(1)
        if len(calls) == 2:
            signal.raise_signal(signal.SIGINT)  # its handler runs now, in the middle of the hand-over

    try:
        with pytest.raises(KeyboardInterrupt), interrupts.handled():
            run_batch(plan, runner=WritingRunner(), workers=workers, progress=progress)
    finally:
        interrupts.reset()  # forgotten, as the warm worker forgets it between commands: later tests run batches
    recorded = sorted(r["index"] for r in records(results))
    written = sorted(int(p.stem[1:]) for p in tmp_path.glob("o*.txt"))
    assert len(recorded) >= 2 and recorded == written and len(written) < len(jobs), (recorded, written)


def test_a_signal_that_lands_in_an_import_waits_for_it_to_end(tmp_path):
    """Ctrl-C in the middle of an import (matplotlib's, on a first --png) is raised once the import is over:
    a module cut short is left half made (Python 3.11 reported one as "Error calling __set_name__", and an
    extension as "initialization failed")."""
    (tmp_path / "slow_module.py").write_text("import time\ntime.sleep(0.8)\nDONE = True\n")
    code = ("import sys, time\n"
            f"sys.path.insert(0, {str(tmp_path)!r})\n"
            "from attnviz import interrupts\n"
            "try:\n"
            "    with interrupts.handled():\n"
            "        print('importing', flush=True)\n"
            "        import slow_module\n"
            "        time.sleep(10)\n"
            "except KeyboardInterrupt:\n"
            "    print('interrupted; the module is whole:', getattr(sys.modules.get('slow_module'), 'DONE', False))\n")
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=tmp_path, env=ENV, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, preexec_fn=_default_sigint)
    assert proc.stdout is not None and proc.stdout.readline() == "importing\n"
    time.sleep(0.3)  # in the module's body
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=30)
    assert (proc.returncode, out, err) == (0, "interrupted; the module is whole: True\n", "")


def test_a_signal_turned_into_another_error_still_ends_the_run_as_interrupted(tmp_path, monkeypatch):
    """A compiled library may take the KeyboardInterrupt of a Ctrl-C for a failed conversion of its arguments
    (pybind11's "incompatible function arguments": a TypeError, the signal lost on the way), and Python wraps
    one raised while a class is made: the run still ends as interrupted (130, one line), not as a bug."""
    from attnviz import interrupts
    from attnviz.inspection import inspecting

    weights(tmp_path / "w.npy", (1, 2, 4, 4))

    def wrapped(*args, **kwargs):
        interrupts._received = signal.SIGINT  # what deliver() records as it raises
        raise TypeError("affine_transform(): incompatible function arguments")

    def from_class(*args, **kwargs):
        raise RuntimeError("Error calling __set_name__") from interrupts.Terminated()

    runner = CliRunner()
    try:
        for broken, code, line in ((wrapped, 130, "attnviz: interrupted"), (from_class, 143, "attnviz: terminated")):
            monkeypatch.setattr(inspecting, "analyse", broken)
            r = runner.invoke(app, ["inspect", str(tmp_path / "w.npy")])
            assert (r.exit_code, r.stderr) == (code, line + "\n")
            interrupts.reset()
    finally:
        interrupts.reset()


def test_a_signal_raised_in_a_finaliser_is_raised_again_in_the_run(tmp_path):
    """A signal whose exception Python cannot raise where it lands (in a finaliser: ``__del__``, a weak
    reference's callback) is neither printed as "Exception ignored" nor lost: it ends the run a moment later."""
    code = ("import gc, signal, sys, time\n"
            "from attnviz import interrupts\n"
            "class Finalised:\n"
            "    def __del__(self):\n"
            "        interrupts.deliver(signal.SIGTERM)  # what the handler does when the signal lands here\n"
            "try:\n"
            "    with interrupts.handled():\n"
            "        x = Finalised()\n"
            "        del x\n"
            "        print('finalised', flush=True)\n"
            "        time.sleep(10)\n"
            "except interrupts.Terminated:\n"
            "    print('terminated in the run')\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=ENV, capture_output=True, text=True,
                         timeout=60, preexec_fn=_default_sigint)
    assert (out.returncode, out.stdout, out.stderr) == (0, "finalised\nterminated in the run\n", "")


#: ``attnviz ARGV`` in a fresh process (the tests' cache of built commands left out: each job builds its command, as
#: a batch does) with Typer's PYDANTIC_DISABLE_PLUGINS step made slow: two threads meet between its read and write
SLOW_TYPER = """
import os, sys, threading
from contextlib import contextmanager
import typer._adapters

both = threading.Barrier(2, timeout=1.0)


@contextmanager
def slow():  # typer._adapters.disabled_pydantic_plugins, the threads meeting between its read and its write
    previous = os.environ.get("PYDANTIC_DISABLE_PLUGINS")
    try:
        both.wait()
    except threading.BrokenBarrierError:
        pass
    os.environ["PYDANTIC_DISABLE_PLUGINS"] = "1"
    try:
        yield
    finally:
        if previous is None:
            del os.environ["PYDANTIC_DISABLE_PLUGINS"]
        else:
            os.environ["PYDANTIC_DISABLE_PLUGINS"] = previous


typer._adapters.disabled_pydantic_plugins = slow
from attnviz.cli.console import run
run(sys.argv[1:])
"""


def test_jobs_in_threads_parse_their_options_at_once(tmp_path):
    """Typer sets PYDANTIC_DISABLE_PLUGINS around building a parameter's adapter and deletes it afterwards when it
    was unset: two jobs' threads that both found it unset both deleted it, and one job of ``batch --jobs 2``
    failed with an internal error (KeyError: 'PYDANTIC_DISABLE_PLUGINS'). With Typer's step made slow, so that the
    threads overlap there every time, every job of a batch in threads succeeds."""
    import os
    import subprocess
    import sys

    weights(tmp_path / "w.npy", (1, 2, 8, 8))
    (tmp_path / "jobs.jsonl").write_text("".join(json.dumps({"command": "inspect", "args": ["w.npy"],
                                                             "options": {"top": 3}}) + "\n" for _ in range(4)))
    env = {k: v for k, v in os.environ.items() if k != "PYDANTIC_DISABLE_PLUGINS"}
    done = subprocess.run([sys.executable, "-c", SLOW_TYPER, "batch", "jobs.jsonl", "--jobs", "2", "--quiet",
                           "--json"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert all(job["exit_code"] == 0 for job in json.loads(done.stdout)["jobs"]), done.stdout


#: a batch of 3 jobs in threads in a fresh process, with SIGINT raised in the main thread while concurrent.futures'
#: wait() holds some but not all of the pending futures' locks (where a real signal lands now and then under load)
SIGNAL_IN_WAIT = """
import json, signal, sys
from concurrent.futures import _base

from attnviz import interrupts
from attnviz.batch.jobs import Job
from attnviz.batch.running import BatchPlan, run_batch

state = {"raised": False}
enter = _base._AcquireFutures.__enter__


def acquire(self):
    for n, future in enumerate(self.futures):
        future._condition.acquire()
        if n == 0 and len(self.futures) > 1 and not state["raised"]:
            state["raised"] = True
            signal.raise_signal(signal.SIGINT)  # its handler runs here, one lock taken


_base._AcquireFutures.__enter__ = acquire


class Runner:
    def execute(self, argv, /):
        import time
        time.sleep(0.2)
        return 0

    def commands(self):
        return {"sleep"}

    def takes_quiet(self, command, /):
        return False


jobs = [Job(i + 1, "sleep", ["sleep"], index=i, outputs=[]) for i in range(6)]
plan = BatchPlan(jobs, jobs, list(jobs), [], (0, 1), None)
try:
    with interrupts.handled():
        run_batch(plan, runner=Runner(), workers=3)
except KeyboardInterrupt:
    print("interrupted")
"""


def test_a_signal_inside_a_wait_for_jobs_does_not_hang_the_batch():
    """A signal whose exception was raised inside concurrent.futures.wait() (it takes the pending futures' locks
    one by one) left a lock held: the job finishing that future blocked for ever, and the batch hung at its end
    instead of exiting 130 (test_signals' SIGINT batch case timed out so under load). The signal is now raised
    between two waits: the batch ends, interrupted."""
    import subprocess

    done = subprocess.run([sys.executable, "-c", SIGNAL_IN_WAIT], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == "interrupted", done.stdout + done.stderr


def test_a_summary_interrupted_drops_the_blocks_not_started():
    """Ctrl-C or SIGTERM while a long site's blocks of rows run in threads (``summarytorch.run_blocks``): the blocks
    not started are dropped, so the command ends after the blocks in hand, not after every block of the site
    (a 34k-token text ran on for minutes after SIGTERM)."""
    pytest.importorskip("torch")
    import threading

    from attnviz.interrupts import Terminated
    from attnviz.summarytorch import run_blocks

    ran: list[int] = []
    lock = threading.Lock()

    def block(r0: int) -> None:
        time.sleep(0.02)
        with lock:
            ran.append(r0)
        if r0 == 2:
            raise Terminated(15)

    with pytest.raises(Terminated):
        run_blocks(block, list(range(200)), threads=2)
    assert len(ran) < 20, len(ran)

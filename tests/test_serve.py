"""The warm worker (``attnviz serve``) and the console script's client (``attnviz.worker.client``).

Every worker here runs in a subprocess with ``ATTNVIZ_RUNTIME_DIR`` in pytest's temporary folder (never
the user's own), from a snapshot of the package taken once per session (so files edited while the suite
runs do not make the worker "another attnviz"), and is stopped by its fixture, with timeouts throughout.
Commands run as a user runs them, ``python -m attnviz ...`` in a folder of inputs, and are compared byte
for byte with the same command run cold (``ATTNVIZ_NO_SERVER=1``); the worker's request counter tells
whether a command went through it. No test asserts a time.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import textwrap
import time
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest

from attnviz.worker import client, protocol
from attnviz.worker.ledger import ledger_path
from tests.conftest import ROOT, SAMPLES

TIMEOUT = 180  # seconds for any one command (a cold run imports TensorFlow)
START = 300  # seconds for a worker to listen


@pytest.fixture(scope="session")
def snapshot(tmp_path_factory):
    """A copy of the package: what the workers and clients of this module import."""
    import compileall

    src = tmp_path_factory.mktemp("src")
    shutil.copytree(ROOT / "attnviz", src / "attnviz", ignore=shutil.ignore_patterns("__pycache__"))
    compileall.compile_dir(src / "attnviz", quiet=1)  # its bytecode, once (see pytest_sessionstart in conftest)
    return src


@pytest.fixture(scope="session")
def folder(tmp_path_factory):
    d = tmp_path_factory.mktemp("inputs")
    for name in ("q.npy", "k.npy", "v.npy", "q.json", "seed_example.npz"):
        shutil.copy(SAMPLES / name, d / name)
    bad = np.full((2, 4), 0.3, dtype=np.float32)  # rows summing to 1.2: --check-rows fails (exit 3)
    np.save(d / "bad_rows.npy", bad)
    scores = np.random.default_rng(0).normal(size=(2, 5, 40))  # 40 keys: tables of each width differ
    w = np.exp(scores) / np.exp(scores).sum(-1, keepdims=True)
    np.save(d / "w.npy", w.astype(np.float32))  # weights for inspect, whose cold run imports no TensorFlow
    return d


def base_env(snapshot: Path, runtime: Path | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("ATTNVIZ_") and k not in ("TF_CPP_MIN_LOG_LEVEL", "PYTHONPATH")}
    env.update(PYTHONPATH=str(snapshot), COLUMNS="100")
    if runtime is not None:
        env["ATTNVIZ_RUNTIME_DIR"] = str(runtime)
    return env


class Worker:
    """A worker in a subprocess, in its own runtime folder."""

    def __init__(self, snapshot: Path, runtime: Path, *args: str, prelude: str = "", wait: bool = True) -> None:
        self.snapshot, self.runtime = snapshot, runtime
        self.env = base_env(snapshot, runtime)
        self.log = runtime.parent / f"{runtime.name}.log"
        code = f"{prelude}\nfrom attnviz.cli import main\nmain(['serve', *{list(args)!r}])"
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen([sys.executable, "-c", code], env=self.env, stdout=log, stderr=log,
                                         stdin=subprocess.DEVNULL, cwd=runtime.parent)
        self.path = str(runtime / f"worker-{zlib.crc32(str(snapshot / 'attnviz').encode()):08x}.sock")
        deadline = time.monotonic() + START
        while wait and self.status() is None:
            assert self.proc.poll() is None, f"the worker exited: {self.log.read_text()}"
            assert time.monotonic() < deadline, f"the worker did not listen: {self.log.read_text()}"
            time.sleep(0.1)

    def status(self):
        found = protocol.ask("status", self.path)
        return None if found is None else found[1]

    def served(self) -> int:
        return self.status()["served"]

    def stop(self) -> None:
        if self.proc.poll() is None:
            protocol.ask("stop", self.path)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=30)


#: the prelude of a worker that runs no command, or only commands that need no TensorFlow (status and stop, the
#: idle timeout, a worker of another attnviz, the faults below): it listens without importing what commands need
#: or running its warm-up (TensorFlow, ~6 s of CPU), which plays no part in what those tests check; the worker
#: that serves the commands compared with cold runs preloads as the product does
NO_PRELOAD = "from attnviz.worker.server import Worker as _Worker\n_Worker.preload = lambda self: None"


@pytest.fixture(scope="module")
def worker(snapshot, tmp_path_factory):
    w = Worker(snapshot, tmp_path_factory.mktemp("rt") / "run", "--idle-timeout", "10m")
    yield w
    w.stop()


def attnviz(args, env, cwd, stdin=None, **kwargs):
    return subprocess.run([sys.executable, "-m", "attnviz", *args], env=env, cwd=cwd, input=stdin,
                          capture_output=True, timeout=TIMEOUT, **kwargs)


COLD_RUNS: dict[tuple, subprocess.CompletedProcess] = {}


def cold(args, worker, cwd, stdin=None):
    """The command run cold (ATTNVIZ_NO_SERVER=1) in the environment of ``worker`` (a Worker, or its
    environment): what a run through a worker must equal. A cold run never looks at the runtime folder,
    so the same command in the same folder, with the same standard input and the same environment but for
    ATTNVIZ_RUNTIME_DIR (and pytest's PYTEST_CURRENT_TEST), is run once (each imports TensorFlow) and its
    result given to every test asking."""
    env = {**getattr(worker, "env", worker), "ATTNVIZ_NO_SERVER": "1"}
    same = tuple(sorted((k, v) for k, v in env.items() if k not in ("ATTNVIZ_RUNTIME_DIR", "PYTEST_CURRENT_TEST")))
    key = (tuple(args), str(cwd), stdin, same)
    if key not in COLD_RUNS:
        COLD_RUNS[key] = attnviz(args, env, cwd, stdin)
    return COLD_RUNS[key]


def assert_same(warm, cold_run):
    assert warm.stdout == cold_run.stdout
    assert warm.stderr == cold_run.stderr
    assert warm.returncode == cold_run.returncode


CASES = {
    "success": (["scaled", "q.npy", "k.npy", "v.npy"], 0),
    "json": (["scaled", "seed_example.npz", "--causal", "--json"], 0),
    "data error": (["scaled", "q.npy", "q.npy", "v.npy"], 1),  # Lk differs between k and v
    "usage error": (["scaled", "q.npy", "k.npy", "v.npy", "--bogus"], 2),
    "missing file": (["scaled", "missing.npy", "k.npy", "v.npy"], 2),
    "bad option value": (["scaled", "q.npy", "k.npy", "v.npy", "--precision", "many"], 2),
    "failed check": (["inspect", "bad_rows.npy", "--check-rows"], 3),
    "unknown command": (["scaledd", "q.npy"], 2),
}


@pytest.mark.parametrize("case", CASES)
def test_same_output_as_a_cold_run(case, worker, folder):
    args, code = CASES[case]
    before = worker.served()
    warm = attnviz(args, worker.env, folder)
    assert worker.served() == before + 1, warm.stderr
    assert warm.returncode == code, warm.stderr
    assert_same(warm, cold(args, worker, folder))
    assert b"Traceback" not in warm.stderr


def test_files_are_written_relative_to_the_clients_folder(worker, folder, tmp_path):
    for name in ("q.npy", "k.npy", "v.npy"):
        shutil.copy(folder / name, tmp_path / name)
    before = worker.served()
    warm = attnviz(["scaled", "q.npy", "k.npy", "v.npy", "--png", "out/w.png", "--save-weights", "w.npy",
                    "--quiet"], worker.env, tmp_path)
    assert warm.returncode == 1 and b"--png out/w.png: the folder out does not exist" in warm.stderr  # as typed
    (tmp_path / "out").mkdir()
    old = os.umask(0o027)
    try:
        warm = attnviz(["scaled", "q.npy", "k.npy", "v.npy", "--png", "out/w.png", "--save-weights", "w.npy",
                        "--quiet"], worker.env, tmp_path)
    finally:
        os.umask(old)
    assert warm.returncode == 0, warm.stderr
    assert worker.served() == before + 2
    assert (tmp_path / "out" / "w.png").stat().st_size > 1000
    assert np.load(tmp_path / "w.npy").shape == (3, 4)
    assert stat.S_IMODE((tmp_path / "w.npy").stat().st_mode) == 0o640  # the client's umask, not the worker's


def test_terminal_width_and_colour_follow_the_client(worker, folder):
    args = ["inspect", "w.npy"]  # shaded tables laid out for the width (a cold inspect imports no TensorFlow)
    for extra in ({"COLUMNS": "60"}, {"COLUMNS": "140", "FORCE_COLOR": "1"}, {"NO_COLOR": "1", "FORCE_COLOR": "1"}):
        before = worker.served()
        warm = attnviz(args, {**worker.env, **extra}, folder)
        assert worker.served() == before + 1
        assert_same(warm, attnviz(args, {**worker.env, **extra, "ATTNVIZ_NO_SERVER": "1"}, folder))
    assert b"\x1b[" in warm.stdout or b"\x1b[" in warm.stderr  # FORCE_COLOR: styles, NO_COLOR: no colours


def test_stdin_passes_through(worker, folder):
    data = (folder / "q.json").read_bytes()
    for args in (["scaled", "-", "k.npy", "v.npy", "--json"], ["inspect", "-"]):
        stdin = data if args[0] == "scaled" else json.dumps([[0.25, 0.75], [1.0, 0.0]]).encode()
        before = worker.served()
        warm = attnviz(args, worker.env, folder, stdin)
        assert worker.served() == before + 1
        assert warm.returncode == 0, warm.stderr
        assert_same(warm, cold(args, worker, folder, stdin))
    jobs = json.dumps({"command": "scaled", "args": [str(folder / n) for n in ("q.npy", "k.npy", "v.npy")],
                       "options": {"json": True}}) + "\n"
    warm = attnviz(["batch", "-", "--json"], worker.env, folder, jobs.encode())
    assert warm.returncode == 0, warm.stderr
    assert json.loads(warm.stdout)["jobs"][0]["status"] == "ok"
    # a command that does not read stdin never reads it: an endless stream is left alone
    with open("/dev/zero", "rb") as zero:
        warm = subprocess.run([sys.executable, "-m", "attnviz", "scaled", "q.npy", "k.npy", "v.npy", "--quiet"],
                              env=worker.env, cwd=folder, stdin=zero, capture_output=True, timeout=TIMEOUT)
    assert warm.returncode == 0


def test_two_clients_at_once(worker, folder):
    # a table from files and JSON from stdin: commands whose cold runs are made by the tests above
    runs = [["scaled", "q.npy", "k.npy", "v.npy"], ["scaled", "-", "k.npy", "v.npy", "--json"]]
    before = worker.served()
    with open(folder / "q.json", "rb") as q_json:
        procs = [subprocess.Popen([sys.executable, "-m", "attnviz", *args], env=worker.env, cwd=folder, stdin=stdin,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE)
                 for args, stdin in zip(runs, (subprocess.DEVNULL, q_json))]
        try:
            outs = [p.communicate(timeout=TIMEOUT) for p in procs]
        finally:
            for p in procs:
                p.kill()
    assert worker.served() == before + 2
    data = (folder / "q.json").read_bytes()
    for p, (out, err), args in zip(procs, outs, runs):
        expected = cold(args, worker, folder, data if "-" in args else None)
        assert_same(subprocess.CompletedProcess(args, p.returncode, out, err), expected)


def test_a_closed_pipe_through_a_warm_worker(worker, folder, tmp_path):
    """``attnviz ... | head`` through the worker: the client's stdout is a pipe closed early (after its
    first line, or before anything is written); the command exits 0 with nothing but its usual line on
    stderr, and a failed check still fails (tests/test_terminal.py runs the same commands cold)."""
    from tests.test_terminal import CLOSED_PIPE_CASES, through_pipe

    rng = np.random.default_rng(0)
    # a 120 x 120 map: 170 kB of table, 360 kB of JSON, more than a pipe holds (the worker renders it whole)
    np.save(tmp_path / "x.npy", rng.normal(size=(120, 8)).astype(np.float32))
    scores = rng.normal(size=(12, 1, 24, 64, 64)).astype(np.float32) * 3  # 288 heads of 64 tokens
    w = np.exp(scores - scores.max(-1, keepdims=True))
    np.save(tmp_path / "w24.npy", (w / w.sum(-1, keepdims=True)).astype(np.float32))
    before = worker.served()
    for args, read_first in CLOSED_PIPE_CASES[:3]:
        args = [a.format(x=tmp_path / "x.npy", w=tmp_path / "w24.npy") for a in args]
        code, err, _ = through_pipe(args, worker.env, folder, read_first)
        assert code == 0, err
        assert all(line.startswith(("scaled:", "inspect:")) for line in err.splitlines()), err
    assert worker.served() == before + 3  # they went through the worker
    code, err, _ = through_pipe(["inspect", "bad_rows.npy", "--check-rows"], worker.env, folder, False)
    assert code == 3 and "check-rows" in err  # a closed pipe hides no failure
    assert worker.served() == before + 4


def test_a_client_that_goes_away_does_not_hold_the_worker(worker, folder):
    """Ctrl-C on a client whose command waits for its stdin: the worker drops it and serves the next."""
    # the client takes SIGINT as a terminal's foreground job does, whatever the suite inherited: a job a
    # shell script starts in the background (`pytest &`) ignores SIGINT, and so would its children
    proc = subprocess.Popen([sys.executable, "-m", "attnviz", "inspect", "-"], env=worker.env, cwd=folder,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline = time.monotonic() + 60
        while worker.status()["client"] != proc.pid:  # its command waits for standard input
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 130 and err == b"attnviz: interrupted\n", err
    before = worker.served()
    warm = attnviz(["scaled", "q.npy", "k.npy", "v.npy", "--quiet"], worker.env, folder)
    assert warm.returncode == 0 and worker.served() == before + 1


def test_bypassed_for_help_version_and_when_asked(worker, folder):
    before = worker.served()
    for args, env in ((["--no-server", "inspect", "w.npy", "--quiet"], {}),  # commands the worker would serve
                      (["inspect", "w.npy", "--quiet"], {"ATTNVIZ_NO_SERVER": "1"}),
                      (["scaled", "--help"], {}), (["--version"], {}), (["serve", "--help"], {})):
        r = attnviz(args, {**worker.env, **env}, folder)
        assert r.returncode == 0, r.stderr
    assert worker.served() == before


def test_the_socket_is_private(worker, folder):
    runtime = Path(worker.path).parent
    assert stat.S_IMODE(runtime.stat().st_mode) == 0o700
    st = os.lstat(worker.path)
    assert stat.S_ISSOCK(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o600 and st.st_uid == os.getuid()
    assert stat.S_IMODE(os.stat(protocol.side_path(worker.path, ".lock")).st_mode) == 0o600
    # a folder others may enter is not trusted: the client runs the command itself
    before = worker.served()
    runtime.chmod(0o755)
    try:
        r = attnviz(["inspect", "w.npy", "--quiet"], worker.env, folder)
        assert r.returncode == 0, r.stderr
        assert protocol.private_dir_problem(str(runtime)).startswith("is open to other users")
    finally:
        runtime.chmod(0o700)
    assert worker.served() == before


def test_a_worker_refuses_a_folder_others_can_enter(snapshot, tmp_path):
    runtime = tmp_path / "open"
    runtime.mkdir(mode=0o755)
    runtime.chmod(0o755)
    r = attnviz(["serve"], base_env(snapshot, runtime), tmp_path)
    assert r.returncode == 1 and b"open to other users" in r.stderr and b"Traceback" not in r.stderr
    assert list(runtime.iterdir()) == []


def test_the_client_imports_only_the_standard_library(worker, folder):
    probe = textwrap.dedent("""
        import sys
        from attnviz.cli import main
        try:
            main(["scaled", "q.npy", "k.npy", "v.npy", "--quiet"])
        except SystemExit as exc:
            code = exc.code
        heavy = [m for m in ("numpy", "tensorflow", "typer", "rich", "matplotlib", "pydantic", "click")
                 if m in sys.modules]
        print(code, *heavy)
        """)
    before = worker.served()
    r = subprocess.run([sys.executable, "-c", probe], env=worker.env, cwd=folder, capture_output=True, text=True,
                       timeout=TIMEOUT)
    assert r.stdout.split() == ["0"], r.stderr
    assert worker.served() == before + 1


def test_status_and_stop(snapshot, tmp_path, socket_dir):
    w = Worker(snapshot, socket_dir / "run", "--idle-timeout", "5m", prelude=NO_PRELOAD)
    try:
        status = attnviz(["serve", "--status"], w.env, tmp_path)
        assert status.returncode == 0
        assert f"a worker is listening on {w.path}".encode() in status.stdout
        assert f"pid {w.proc.pid}".encode() in status.stdout and b"idle timeout 5 min" in status.stdout
        again = attnviz(["serve", "--detach"], w.env, tmp_path)  # one is enough
        assert again.returncode == 0 and b"already listening" in again.stderr
        stop = attnviz(["serve", "--stop"], w.env, tmp_path)
        assert stop.returncode == 0 and f"stopped the worker (pid {w.proc.pid})".encode() in stop.stderr
        assert w.proc.wait(timeout=30) == 0
        assert not os.path.exists(w.path)
        status = attnviz(["serve", "--status"], w.env, tmp_path)
        assert status.returncode == 1 and status.stdout == b""
        assert status.stderr == f"attnviz: error: no worker is listening on {w.path}; attnviz serve --detach starts " \
                                "one.\n".encode()
        stop = attnviz(["serve", "--stop"], w.env, tmp_path)
        assert stop.returncode == 0 and b"no worker is listening" in stop.stderr
    finally:
        w.stop()


def test_idle_timeout(snapshot, socket_dir):
    w = Worker(snapshot, socket_dir / "run", "--idle-timeout", "1s", prelude=NO_PRELOAD, wait=False)
    try:
        assert w.proc.wait(timeout=START) == 0
        log = w.log.read_text()
        assert "listening on" in log and "no request for 1 s: stopping" in log
        assert not os.path.exists(w.path)
    finally:
        w.stop()


def test_a_stale_socket_falls_back_and_is_removed(snapshot, folder, socket_dir):
    runtime = socket_dir / "run"
    runtime.mkdir(mode=0o700)
    path = runtime / f"worker-{zlib.crc32(str(snapshot / 'attnviz').encode()):08x}.sock"
    dead = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    dead.bind(str(path))  # bound, never listening: what a killed worker leaves
    dead.close()
    env = base_env(snapshot, runtime)
    args = ["inspect", "w.npy"]  # run here as the worker would have run it (without importing TensorFlow)
    r = attnviz(args, env, folder)
    assert_same(r, cold(args, env, folder))
    assert r.returncode == 0
    assert not path.exists()


def test_another_version_is_not_used_and_is_replaced(snapshot, folder, tmp_path, socket_dir):
    w = Worker(snapshot, socket_dir / "run", "--idle-timeout", "5m",
               prelude=f"import attnviz; attnviz.__version__ = '0.0.0+another'\n{NO_PRELOAD}")
    try:
        args = ["inspect", "w.npy"]  # run here as the worker would have run it (without importing TensorFlow)
        r = attnviz(args, w.env, folder)
        assert_same(r, cold(args, w, folder))
        assert w.served() == 0
        status = attnviz(["serve", "--status"], w.env, tmp_path)
        assert b"attnviz 0.0.0+another" in status.stdout and b"it runs another attnviz" in status.stdout
        # --detach replaces it with a worker of this attnviz
        started = attnviz(["serve", "--detach", "--idle-timeout", "2m"], w.env, tmp_path)
        assert started.returncode == 0, started.stderr
        assert b"stopping the worker of another attnviz" in started.stderr and b"listening on" in started.stderr
        assert w.proc.wait(timeout=30) == 0
        new = w.status()
        assert new["version"] != "0.0.0+another" and new["pid"] != w.proc.pid
        r = attnviz(args, w.env, folder)
        assert r.returncode == 0 and w.served() == 1
    finally:
        w.stop()
        protocol.ask("stop", w.path)
        deadline = time.monotonic() + 30
        while not protocol.lock_is_free(w.path) and time.monotonic() < deadline:
            time.sleep(0.1)


def test_a_worker_that_dies_mid_request(snapshot, folder, socket_dir):
    """The worker is killed while the command reads stdin: the client runs it itself, replaying the
    standard input the worker had already read."""
    w = Worker(snapshot, socket_dir / "run", "--idle-timeout", "5m", prelude=NO_PRELOAD)  # inspect: no TensorFlow
    try:
        # weights as JSON (8 kB) for inspect, which the client then runs without importing TensorFlow
        data = json.dumps(np.load(folder / "w.npy").tolist()).encode()
        args = ["inspect", "-", "--json"]
        proc = subprocess.Popen([sys.executable, "-m", "attnviz", *args], env=w.env, cwd=folder,
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            proc.stdin.write(data[:10])
            proc.stdin.flush()
            deadline = time.monotonic() + 60
            while w.status()["client"] != proc.pid:
                assert time.monotonic() < deadline and proc.poll() is None
                time.sleep(0.05)
            time.sleep(0.3)  # the worker has asked for (and been sent) the first bytes
            w.proc.kill()
            w.proc.wait(timeout=30)
            out, err = proc.communicate(data[10:], timeout=TIMEOUT)
        finally:
            proc.kill()
        assert_same(subprocess.CompletedProcess(args, proc.returncode, out, err), cold(args, w, folder, data))
        assert proc.returncode == 0
    finally:
        w.stop()


def test_bypass_reasons():
    env: dict[str, str] = {}
    assert client.bypass_reason(["scaled", "q.npy"], env) is None
    assert client.bypass_reason([], env) and client.bypass_reason(["--version"], env)
    assert client.bypass_reason(["--no-server", "scaled", "q.npy"], env)
    assert client.bypass_reason(["serve", "--status"], env)
    assert client.bypass_reason(["scaled", "--help"], env)
    assert client.bypass_reason(["scaled", "q.npy"], {"ATTNVIZ_NO_SERVER": "1"})
    assert client.bypass_reason(["scaled", "q.npy"], {"ATTNVIZ_NO_SERVER": "0"}) is None
    assert client.bypass_reason(["scaled", "q.npy"], {"ATTNVIZ_DEBUG": "1"})
    assert client.bypass_reason(["scaled", "q.npy"], {"TF_CPP_MIN_LOG_LEVEL": "1"})
    assert client.bypass_reason(["scaled", "q.npy"], {"TF_CPP_MIN_LOG_LEVEL": "3"}) is None


def test_stdin_typed_at_a_terminal_is_read_here(monkeypatch):
    """A command reading a terminal waits for a person: through the worker it would hold every client."""
    monkeypatch.setattr(client, "_isatty", lambda fd: fd == 0)
    assert client.bypass_reason(["inspect", "-"], {}) == "standard input from a terminal"
    assert client.bypass_reason(["inspect", "w.npy"], {}) is None
    monkeypatch.setattr(client, "_isatty", lambda fd: False)
    assert client.bypass_reason(["inspect", "-"], {}) is None


def test_runtime_dir_choice(tmp_path):
    uid = os.getuid()
    assert protocol.runtime_dir({"ATTNVIZ_RUNTIME_DIR": str(tmp_path)}) == str(tmp_path)
    xdg = tmp_path / "xdg"
    xdg.mkdir(mode=0o700)
    xdg.chmod(0o700)
    assert protocol.runtime_dir({"XDG_RUNTIME_DIR": str(xdg)}) == str(xdg / "attnviz")
    xdg.chmod(0o755)  # not private: not the user's runtime directory
    chosen = protocol.runtime_dir({"XDG_RUNTIME_DIR": str(xdg), "TMPDIR": str(tmp_path)})
    assert chosen == str(tmp_path / f"attnviz-{uid}")
    assert protocol.runtime_dir({}) == f"/tmp/attnviz-{uid}"
    link = tmp_path / "link"
    link.symlink_to(xdg)
    assert protocol.private_dir_problem(str(link)) == "is a symbolic link"


def test_idle_timeout_values():
    from attnviz.cli.commands.serve import Duration
    from attnviz.cli.parsers import OptionValueError
    from attnviz.worker.control import duration_text

    d = Duration()
    assert [d(v) for v in ("90", "90s", "15m", "1.5h", "0", 30, 900.0)] == [90, 90, 900, 5400, 0, 30, 900]
    for bad, problem in (("abc", "expected seconds, or a number with s, m or h"), ("-1", "must be at least 0"),
                         ("5d", "expected seconds"), ("inf", "must be a finite number"), ("nan", "finite"),
                         ("1e9", "must be at most"), ("800h", "must be at most 30 days")):
        with pytest.raises(OptionValueError, match=problem):
            d(bad)
    assert [duration_text(s) for s in (900, 7200, 90, 0, 1)] == ["15 min", "2 h", "90 s", "never", "1 s"]


# ----------------------------------------------------------------------------------------------
# Load and faults: many clients at once, a worker killed or stopped mid-request, signals to a client, the
# runtime folder removed or read-only under a running worker

#: a worker whose commands, asked by a client with ATTNVIZ_TEST_SLOW_COMMIT=SECONDS (forwarded, as every
#: ATTNVIZ_ variable is), wait that long before putting their staged outputs in place: the window in which
#: these tests kill, stop or signal. Each says in the worker's log when it gets there (COMMITTING). It preloads
#: nothing (its commands are inspect and batch of inspect)
SLOW_COMMIT = NO_PRELOAD + """
import os as _os, time as _time
import attnviz.staging as _staging
_commit = _staging.StagedOutputs.commit
def _slow_commit(self):
    _os.write(2, b"test: committing\\n")
    _time.sleep(float(_os.environ.get("ATTNVIZ_TEST_SLOW_COMMIT", "0")))
    _commit(self)
_staging.StagedOutputs.commit = _slow_commit
"""
COMMITTING = "test: committing\n"
#: SLOW_COMMIT whose command, at its commit, first runs a finaliser (``__del__``, in the main thread) that waits as
#: long again, and says so in the worker's log (IN_A_FINALISER): a signal then lands in the finaliser
SLOW_FINALISER = SLOW_COMMIT.replace("def _slow_commit(self):\n", """class _Finalised:
    def __del__(self):
        _os.write(2, b"test: in a finaliser\\n")
        _time.sleep(float(_os.environ.get("ATTNVIZ_TEST_SLOW_COMMIT", "0")))
def _slow_commit(self):
    _Finalised()
""")
IN_A_FINALISER = "test: in a finaliser\n"
OUTPUTS = ["--png", "a.png", "--json-file", "d.json", "--html", "r.html"]


def softmax_rows(scores: np.ndarray) -> np.ndarray:
    e = np.exp(scores - scores.max(-1, keepdims=True))
    return (e / e.sum(-1, keepdims=True)).astype(np.float32)


def hidden(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith("."))


def wait_for(predicate, what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"waited {timeout} s for {what}"
        time.sleep(0.02)


def inputs_folder(folder: Path, seed: int = 0, n: int = 24) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    np.save(folder / "w.npy", softmax_rows(np.random.default_rng(seed).normal(size=(2, n, n)) * 3))
    return folder


def staged_in(folder: Path, n: int = len(OUTPUTS) // 2) -> bool:
    """Whether ``n`` staged files are in ``folder`` (all three of OUTPUTS by default: the staging is done)."""
    return sum(".staged" in name for name in hidden(folder)) >= n


def staging_client(w: Worker, folder: Path, args: list[str], reached: str = COMMITTING,
                   **popen) -> subprocess.Popen:
    """A client whose command, on ``w``, waits 60 s before putting its staged outputs in place: returned once
    the worker runs it, all three outputs are staged and the command is waiting (the worker's log says it has
    ``reached`` its commit). Not as soon as the outputs are staged: they are reserved before anything is
    computed, and the worker's first command then imports matplotlib, during which a signal is held back
    (``Worker.interrupt``) for as long as the imports take (tens of seconds on a loaded machine)."""
    popen = {"stdin": subprocess.DEVNULL, "stdout": subprocess.PIPE, "stderr": subprocess.PIPE, **popen}
    seen = w.log.read_text().count(reached)
    proc = subprocess.Popen([sys.executable, "-m", "attnviz", *args], env={**w.env, "ATTNVIZ_TEST_SLOW_COMMIT": "60"},
                            cwd=folder, **popen)
    try:
        wait_for(lambda: w.status()["client"] == proc.pid and staged_in(folder)
                 and w.log.read_text().count(reached) > seen, "the command to stage", timeout=TIMEOUT)
    except BaseException:
        proc.kill()
        raise
    return proc


#: the command the fault tests cut short on a worker (its three outputs staged)
STAGING = ["inspect", "w.npy", *OUTPUTS]


@contextmanager
def mid_request(snapshot: Path, socket_dir: Path, folder: Path, prelude: str = SLOW_COMMIT,
                reached: str = COMMITTING) -> Iterator[tuple[Worker, subprocess.Popen]]:
    """A worker (``prelude``: SLOW_COMMIT's) in ``socket_dir``, and a client running STAGING on it in ``folder``,
    its command staged and waiting (``staging_client``): (worker, client). Both are ended afterwards."""
    w = Worker(snapshot, socket_dir / "run", "--idle-timeout", "5m", prelude=prelude)
    try:
        proc = staging_client(w, folder, STAGING, reached=reached)
        try:
            yield w, proc
        finally:
            proc.kill()
            proc.wait()
    finally:
        w.stop()


def cold_twin(w: Worker, tmp_path: Path) -> subprocess.CompletedProcess:
    """STAGING run cold (ATTNVIZ_NO_SERVER=1, ``w``'s environment) on the same inputs in a folder of its own: what
    the client of a command cut short on ``w`` gives once it has run the command itself."""
    return attnviz(STAGING, {**w.env, "ATTNVIZ_NO_SERVER": "1"}, inputs_folder(tmp_path / "cold"))


def a_new_worker_serves(snapshot: Path, socket_dir: Path, folder: Path) -> None:
    """A new worker in ``socket_dir`` (where one was killed, stopped or lost its folder) starts and serves the
    next call made in ``folder``."""
    again = Worker(snapshot, socket_dir / "run", "--idle-timeout", "5m", prelude=NO_PRELOAD)
    try:
        r = attnviz(["inspect", "w.npy", "--quiet"], again.env, folder)
        assert r.returncode == 0 and again.served() == 1
    finally:
        again.stop()


@pytest.fixture(scope="module")
def slow_worker(snapshot, tmp_path_factory):
    w = Worker(snapshot, tmp_path_factory.mktemp("slow") / "run", "--idle-timeout", "10m", prelude=SLOW_COMMIT)
    yield w
    w.stop()


def test_sixteen_clients_at_once(worker, tmp_path):
    """16 clients at once, each in its own folder with its own weights, terminal width, umask and standard
    input (four read their weights from it): each gets its own complete answer, and its own files."""
    rng = np.random.default_rng(16)
    umasks = (0o022, 0o077, 0o027, 0o002)
    clients = []
    for i in range(16):
        folder = tmp_path / f"client{i}"
        folder.mkdir()
        w = softmax_rows(rng.normal(size=(2, 6 + i, 7 + i)) * 2)  # each its own shape
        np.save(folder / "w.npy", w)
        stdin = json.dumps(w.tolist()).encode() if i % 4 == 3 else None
        args = ["inspect", "-" if stdin else "w.npy", "--json", "--png", "a.png"]
        env = {**worker.env, "COLUMNS": str(60 + 7 * i)}
        clients.append((folder, w, stdin, args, env, umasks[i % 4]))
    before = worker.served()
    procs = [subprocess.Popen([sys.executable, "-m", "attnviz", *args], env=env, cwd=folder, umask=umask,
                              stdin=subprocess.PIPE if stdin else subprocess.DEVNULL, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE)
             for folder, _, stdin, args, env, umask in clients]
    try:  # all at once: the worker serves them in turn, and one waiting for its stdin holds the others
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(16) as pool:
            outs = list(pool.map(lambda pc: pc[0].communicate(pc[1][2], timeout=TIMEOUT), zip(procs, clients)))
    finally:
        for p in procs:
            p.kill()
    assert worker.served() == before + 16  # all through the worker
    for p, (out, err), (folder, w, stdin, _, _, umask) in zip(procs, outs, clients):
        assert p.returncode == 0, err
        doc = json.loads(out)
        assert doc["file_shape"] == list(w.shape) and doc["source"] == ("<stdin>" if stdin else "w.npy")
        p_log_p = np.where(w > 0, w * np.log(np.where(w > 0, w, 1.0)), 0.0)
        entropy = -p_log_p.sum(-1).mean(-1)  # per head: the mean over its queries
        np.testing.assert_allclose([h["entropy"] for h in doc["head_stats"]], entropy, rtol=1e-5)
        assert err.decode().startswith("inspect: ") and b"a.png" in err
        png = folder / "a.png"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and hidden(folder) == []
        assert stat.S_IMODE(png.stat().st_mode) == 0o666 & ~umask
    # two of them, byte for byte, against the same command run cold in a folder of its own
    for i in (0, 3):
        folder, w, stdin, args, env, umask = clients[i]
        twin = tmp_path / f"cold{i}"
        twin.mkdir()
        shutil.copy(folder / "w.npy", twin / "w.npy")
        expected = attnviz(args, {**env, "ATTNVIZ_NO_SERVER": "1"}, twin, stdin)
        assert (outs[i][0], outs[i][1]) == (expected.stdout, expected.stderr)
        assert (twin / "a.png").read_bytes() == (folder / "a.png").read_bytes()


@pytest.mark.parametrize("sig, code, word", [(signal.SIGINT, 130, "interrupted"), (signal.SIGTERM, 143, "terminated"),
                                            (signal.SIGHUP, 129, "hung up")])
def test_a_signal_to_a_client_ends_its_command_on_the_worker(slow_worker, tmp_path, sig, code, word):
    """Ctrl-C, SIGTERM or SIGHUP to a client whose command runs on the worker: by the time the client exits (130,
    143 or 129, one line, as a cold run), the worker has ended the command and removed what it staged; no output is
    left, and the worker serves the next client."""
    folder = inputs_folder(tmp_path / "in")
    before = slow_worker.served()
    proc = staging_client(slow_worker, folder, STAGING,
                          preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert (proc.returncode, out, err) == (code, b"", f"attnviz: {word}\n".encode())
    assert sorted(p.name for p in folder.iterdir()) == ["w.npy"]  # nothing staged, nothing written
    assert slow_worker.served() == before
    r = attnviz(["inspect", "w.npy", "--quiet"], slow_worker.env, folder)
    assert r.returncode == 0 and slow_worker.served() == before + 1


def test_a_batch_on_the_worker_terminated_keeps_whole_lines_and_resumes(slow_worker, tmp_path):
    """SIGTERM to the client of a batch the worker runs: the manifest holds a whole line for each job that
    finished and none for the one cut short, whose outputs are not left; exit 143; --resume completes it."""
    folder = tmp_path / "batch"
    for i in range(4):
        inputs_folder(folder / "acts", seed=i).joinpath("w.npy").rename(folder / "acts" / f"w{i}.npy")
    (folder / "out").mkdir()
    args = ["batch", "--results", "results.jsonl", "--each", "acts/*.npy", "--", "inspect", "{}", "--png",
            "out/{stem}.png", "--json-file", "out/{stem}.json"]
    env = {**slow_worker.env, "ATTNVIZ_TEST_SLOW_COMMIT": "1"}
    before = slow_worker.served()
    proc = subprocess.Popen([sys.executable, "-m", "attnviz", *args], env=env, cwd=folder, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    manifest = folder / "results.jsonl"
    try:
        wait_for(lambda: manifest.exists() and manifest.read_bytes().count(b"\n") >= 2
                 and staged_in(folder / "out", 2), "two jobs done and the third staging")
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 143 and err.endswith(b"attnviz: terminated\n"), err
    lines = manifest.read_bytes().split(b"\n")
    assert lines[-1] == b""  # every line whole
    done = [json.loads(line) for line in lines[:-1]]
    assert 2 <= len(done) <= 3 and all(d["exit_code"] == 0 for d in done), json.dumps(done[-1])
    assert hidden(folder / "out") == [] and len(list((folder / "out").glob("*.png"))) == len(done)
    assert slow_worker.served() == before
    r = attnviz([*args[:1], "--resume", *args[1:]], slow_worker.env, folder)
    assert r.returncode == 0, r.stderr
    assert len(manifest.read_bytes().splitlines()) == 4 and len(list((folder / "out").glob("*.json"))) == 4


def test_a_worker_killed_mid_request_leaves_nothing_and_the_next_call_starts_cleanly(snapshot, socket_dir, tmp_path):
    """SIGKILL to the worker while the command has its outputs staged: the client removes what the worker had
    staged (recorded in its ledger), runs the command itself, and gives what a cold run gives; the dead
    worker's socket is cleared by the next call, and a new worker starts and serves in the same folder."""
    folder = inputs_folder(tmp_path / "in")
    with mid_request(snapshot, socket_dir, folder) as (w, proc):
        staged_by_worker = hidden(folder)
        w.proc.kill()
        w.proc.wait(timeout=30)
        out, err = proc.communicate(timeout=TIMEOUT)
        expected = cold_twin(w, tmp_path)
        assert (proc.returncode, out, err) == (expected.returncode, expected.stdout, expected.stderr)
        assert proc.returncode == 0 and len(staged_by_worker) == 3
        assert hidden(folder) == []  # the worker's staged files are gone; the outputs are the client's own
        assert sorted(p.name for p in folder.iterdir()) == ["a.png", "d.json", "r.html", "w.npy"]
        assert not os.path.exists(ledger_path(w.path))
        assert os.path.exists(w.path)  # the dead worker's socket: the next call clears it, and runs here
        r = attnviz(["inspect", "w.npy", "--quiet"], w.env, folder)
        assert r.returncode == 0 and not os.path.exists(w.path)
        a_new_worker_serves(snapshot, socket_dir, folder)


def test_a_worker_killed_with_its_client_is_cleaned_up_by_the_next_worker(snapshot, socket_dir, tmp_path):
    """Worker and client both killed (nobody left to clean up): the next worker removes the staged files the
    dead one had recorded, and says so in its log."""
    folder = inputs_folder(tmp_path / "in")
    w = Worker(snapshot, socket_dir / "run", "--idle-timeout", "5m", prelude=SLOW_COMMIT)
    try:
        proc = staging_client(w, folder, STAGING, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
        try:
            proc.send_signal(signal.SIGSTOP)  # the client can do nothing now (and the worker sees it still there)
            w.proc.kill()
            w.proc.wait(timeout=30)
            proc.kill()
        finally:
            proc.kill()
            proc.wait()
        assert len(hidden(folder)) == 3 and os.path.exists(ledger_path(w.path))
    finally:
        w.stop()
    # (a client finding the dead worker's socket would remove them too: here the socket is gone as well)
    os.unlink(w.path)
    again = Worker(snapshot, socket_dir / "run", "--idle-timeout", "5m", prelude=NO_PRELOAD)
    try:
        assert hidden(folder) == [] and sorted(p.name for p in folder.iterdir()) == ["w.npy"]
        assert "removed 3 staged file(s) a killed worker had left" in again.log.read_text()
    finally:
        again.stop()


@pytest.mark.parametrize("sig, where", [(signal.SIGTERM, COMMITTING), (signal.SIGHUP, COMMITTING),
                                        (signal.SIGTERM, IN_A_FINALISER)], ids=["15", "1", "15-in-a-finaliser"])
def test_a_worker_stopped_mid_request_hands_the_command_back(snapshot, socket_dir, tmp_path, sig, where):
    """SIGTERM to the worker while it runs a command, or SIGHUP (the terminal of a worker in the foreground went
    away): the command ends as a cold run would (its staged files removed), the worker exits 0, and the client
    runs the command itself: complete output, exit 0. Also where the signal lands in a finaliser (``__del__``, a
    weak reference's callback), whose exception Python cannot raise: the command is still ended, a moment
    later (it used to run on to its end, here a minute later)."""
    folder = inputs_folder(tmp_path / "in")
    prelude = SLOW_FINALISER if where == IN_A_FINALISER else SLOW_COMMIT
    with mid_request(snapshot, socket_dir, folder, prelude, reached=where) as (w, proc):
        w.proc.send_signal(sig)
        assert w.proc.wait(timeout=60) == 0
        out, err = proc.communicate(timeout=TIMEOUT)
        expected = cold_twin(w, tmp_path)
        assert (proc.returncode, out, err) == (0, expected.stdout, expected.stderr)
        assert hidden(folder) == [] and not os.path.exists(w.path) and not os.path.exists(ledger_path(w.path))
        assert f"stopping ({sig.name})" in w.log.read_text()


def test_a_worker_stopped_mid_batch_hands_back_what_a_terminated_batch_gives(snapshot, socket_dir, tmp_path):
    """SIGTERM to the worker in the middle of a batch: the batch is not run again from its start (its finished
    jobs have their lines and files); the client gets what a batch terminated in its own process gives (143,
    a whole line per finished job, none for the one cut short), and --resume completes it."""
    folder = tmp_path / "batch"
    (folder / "acts").mkdir(parents=True)
    for i, stem in enumerate(["w0", "w1", "w2slow", "w3"]):
        np.save(folder / "acts" / f"{stem}.npy", softmax_rows(np.random.default_rng(i).normal(size=(2, 16, 16))))
    (folder / "out").mkdir()
    args = ["batch", "--results", "results.jsonl", "--each", "acts/*.npy", "--", "inspect", "{}", "--png",
            "out/{stem}.png", "--json-file", "out/{stem}.json"]
    manifest = folder / "results.jsonl"
    w = Worker(snapshot, socket_dir / "run", "--idle-timeout", "5m", prelude=SLOW_COMMIT.replace(
        '_time.sleep(float(_os.environ.get("ATTNVIZ_TEST_SLOW_COMMIT", "0")))',
        'any("slow" in str(t) for t in self.targets.values()) and _time.sleep(60)'))
    try:
        proc = subprocess.Popen([sys.executable, "-m", "attnviz", *args], env=w.env, cwd=folder,
                                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            wait_for(lambda: manifest.exists() and manifest.read_bytes().count(b"\n") == 2
                     and staged_in(folder / "out", 2), "two jobs done and the third staging")
            w.proc.send_signal(signal.SIGTERM)
            assert w.proc.wait(timeout=60) == 0
            _, err = proc.communicate(timeout=TIMEOUT)
        finally:
            proc.kill()
        assert proc.returncode == 143 and err.endswith(b"attnviz: terminated\n"), err
        done = [json.loads(line) for line in manifest.read_bytes().splitlines()]
        assert [d["path"] for d in done] == ["acts/w0.npy", "acts/w1.npy"] and all(d["exit_code"] == 0 for d in done)
        assert hidden(folder / "out") == [] and sorted(p.name for p in (folder / "out").glob("*.png")) == \
            ["w0.png", "w1.png"]
        r = attnviz([*args[:1], "--resume", *args[1:]], w.env, folder)  # no worker now: in its own process
        assert r.returncode == 0, r.stderr
        assert sorted(json.loads(line)["path"] for line in manifest.read_bytes().splitlines()) == \
            [f"acts/{s}.npy" for s in ("w0", "w1", "w2slow", "w3")]
    finally:
        w.stop()


def test_the_runtime_folder_removed_under_a_running_worker(snapshot, socket_dir, tmp_path):
    """rm -rf of the runtime folder: clients run their commands themselves at once, the worker (unreachable
    now) stops within about a second, and a new one starts there."""
    w = Worker(snapshot, socket_dir / "run", "--idle-timeout", "10m", prelude=NO_PRELOAD)
    folder = inputs_folder(tmp_path / "in")
    try:
        shutil.rmtree(w.runtime)
        r = attnviz(["inspect", "w.npy", "--quiet"], w.env, folder)
        assert r.returncode == 0 and r.stderr == b""
        assert w.proc.wait(timeout=60) == 0
        assert "was removed or replaced: stopping" in w.log.read_text()
    finally:
        w.stop()
    a_new_worker_serves(snapshot, socket_dir, folder)


def test_the_runtime_folder_made_unwritable_under_a_running_worker(snapshot, socket_dir, tmp_path):
    """The runtime folder stops taking new entries (``chattr +i``: root ignores permission bits): the worker
    goes on serving (its ledger is best effort), `serve --stop` still stops it, the socket it could not remove
    is passed over (the command runs here), and a new `attnviz serve` there fails with one line."""
    w = Worker(snapshot, socket_dir / "run", "--idle-timeout", "5m", prelude=NO_PRELOAD)
    runtime = w.runtime
    try:
        if subprocess.run(["chattr", "+i", str(runtime)], capture_output=True).returncode != 0:
            pytest.skip("chattr +i is not available here (it needs root and a file system that has it)")
        try:
            folder = inputs_folder(tmp_path / "in")
            args = ["inspect", "w.npy", "--png", "a.png"]
            r = attnviz(args, w.env, folder)
            assert r.returncode == 0 and w.served() == 1 and hidden(folder) == []
            stop = attnviz(["serve", "--stop"], w.env, tmp_path)
            assert stop.returncode == 0 and w.proc.wait(timeout=30) == 0
            assert os.path.exists(w.path)  # it could not remove its socket: nobody listens there now
            again = attnviz(args, w.env, folder)
            assert (again.returncode, again.stdout, again.stderr) == (0, r.stdout, r.stderr)
            serve = attnviz(["serve"], w.env, tmp_path)
            assert serve.stderr == f"attnviz: error: {runtime}: cannot create the worker's socket (Operation not " \
                                   "permitted); set ATTNVIZ_RUNTIME_DIR to a folder you can write.\n".encode()
            assert serve.returncode == 1
        finally:
            subprocess.run(["chattr", "-i", str(runtime)], capture_output=True)
    finally:
        w.stop()


def test_a_worker_of_another_python_or_installation_serves_no_one(monkeypatch, tmp_path):
    """The worker's identity names the Python that runs it: another version, executable or environment
    (a second virtual environment of the same sources) is another attnviz to a client. Another installation
    of attnviz has a socket of its own, and its identity differs too."""
    mine, my_socket = protocol.identity(), protocol.socket_path(str(tmp_path))
    other = tmp_path / "site-packages" / "attnviz"
    shutil.copytree(ROOT / "attnviz" / "worker", other / "worker")
    with monkeypatch.context() as m:
        m.setattr(protocol, "package_dir", lambda: str(other))
        assert protocol.socket_path(str(tmp_path)) != my_socket and protocol.identity() != mine
    for name, value in (("version", sys.version + " (another)"), ("executable", "/another/bin/python"),
                        ("prefix", "/another/venv")):
        with monkeypatch.context() as m:
            m.setattr(sys, name, value)
            assert protocol.identity() != mine and value in protocol.identity()
    # the same interpreter by another name (a virtual environment's python3, the console script's): the same
    alias = tmp_path / "python3"
    alias.symlink_to(sys.executable)
    with monkeypatch.context() as m:
        m.setattr(sys, "executable", str(alias))
        assert protocol.identity() == mine
    assert protocol.identity() == mine


def test_a_command_is_never_interrupted_in_the_middle_of_an_import(tmp_path, monkeypatch):
    """A client going away while the worker's command imports a module (matplotlib on a first --png): the
    interruption waits for the import to end, since a module cut short stays half made for every later
    request (it was seen as "module 'matplotlib' has no attribute 'get_data_path'")."""
    from attnviz import interrupts
    from attnviz.worker import server

    (tmp_path / "probe_importing.py").write_text(
        "from attnviz import interrupts\nSEEN = interrupts.importing()\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import probe_importing

    assert probe_importing.SEEN is True and interrupts.importing() is False
    # and while one is, the worker postpones the interruption and sends it again
    w = server.Worker(0, str(tmp_path / "w.sock"), execute=lambda argv: 0, preload=lambda: None)
    r = server._Request(7, None, None, running=True)  # type: ignore[arg-type]
    sent = []
    monkeypatch.setattr(interrupts, "importing", lambda: True)
    monkeypatch.setattr(w, "send_cancel", lambda req: sent.append(req.number))
    w.interrupt(r, signal.SIGTERM)  # no exception now
    deadline = time.monotonic() + 5
    while not sent and time.monotonic() < deadline:
        time.sleep(0.01)
    assert sent == [7] and w.postponed == {7: signal.SIGTERM}
    monkeypatch.setattr(interrupts, "importing", lambda: False)
    try:
        with pytest.raises(interrupts.Terminated):
            w.interrupt(r, w.postponed.pop(7))
    finally:
        interrupts.reset()  # what it received is this test's, not the next in-process batch's


def test_the_encoding_a_worker_and_its_client_compare_is_pythons_own():
    """Client and worker compare their text encodings without importing ``locale`` (a client's start): what they
    compare is what ``locale.getpreferredencoding(False)`` says, in this process and in UTF-8 mode."""
    import locale

    assert protocol.encodings()["locale"] == locale.getpreferredencoding(False)
    code = "import locale; from attnviz.worker import protocol; " \
           "print(protocol.encodings()['locale'] == locale.getpreferredencoding(False))"
    for flags in ([], ["-X", "utf8"]):
        out = subprocess.run([sys.executable, *flags, "-c", code], capture_output=True, text=True, cwd=ROOT,
                             env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=60)
        assert out.stdout.strip() == "True", out.stderr


def test_the_worker_collects_garbage_less_often_but_still_collects_it():
    """A warm worker's collector waits for ``GC_THRESHOLD`` new objects (a request's figure and tables make
    fewer: no collection in the middle of one), and cyclic garbage beyond that is still collected (a batch of
    many jobs in one request does not grow without bound)."""
    import gc
    import weakref

    from attnviz.worker.server import GC_THRESHOLD, collect_less_often

    saved = gc.get_threshold()
    collections = []

    def seen(phase, info):
        if phase == "stop":
            collections.append(info["generation"])

    class Cycle:
        def __init__(self):
            self.me = self

    try:
        collect_less_often()
        assert gc.get_threshold() == (GC_THRESHOLD, *saved[1:])
        gc.collect()
        gc.callbacks.append(seen)
        few = [Cycle() for _ in range(GC_THRESHOLD // 4)]  # alive: no reason to collect
        assert collections == []
        probe = weakref.ref(few[0])
        del few  # now garbage, in cycles: found once enough new objects come
        more = [Cycle() for _ in range(2 * GC_THRESHOLD)]
        assert collections and probe() is None
        del more
    finally:
        if seen in gc.callbacks:
            gc.callbacks.remove(seen)
        gc.set_threshold(*saved)

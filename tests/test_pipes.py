"""Text inputs from a pipe (issue 34, item 6): labels, jobs files, configs and JSON arrays are read from a
named pipe, as process substitution hands them over (``--labels <(printf 'a\\nb\\n')`` is ``/dev/fd/N``,
a pipe), once, with the same size limit as a file and one clear line past it; a run that reads the same
pipe again (several files, a batch) gets the same text. Arrays in the formats attnviz memory-maps are
still refused from a pipe, with one line saying that ``-`` reads an array (as JSON) from standard input.
Pipes here are the test process's own (``os.pipe``, named ``/dev/fd/N`` as the shell names them), or a
FIFO made with ``mkfifo``; a thread writes into each."""

from __future__ import annotations

import json
import os
import threading

import numpy as np
import pytest
from typer.testing import CliRunner

from attnviz.cli import app
from attnviz.storage.textfiles import MAX_TEXT_BYTES
from attnviz.worker import client

runner = CliRunner()
L = 6


class Piped:
    """``data`` written by a thread into a pipe named ``/dev/fd/N`` (as ``<(...)``), or into the FIFO ``fifo``."""

    def __init__(self, data: bytes, fifo=None) -> None:
        self.data, self.fifo = data, fifo
        if fifo is None:
            self.read_end, write_end = os.pipe()
            self.path = f"/dev/fd/{self.read_end}"
            self.thread = threading.Thread(target=self._write, args=(write_end,), daemon=True)
        else:
            os.mkfifo(fifo)
            self.read_end, self.path = None, str(fifo)
            self.thread = threading.Thread(target=lambda: self._write(os.open(fifo, os.O_WRONLY)), daemon=True)
        self.thread.start()

    def _write(self, fd: int) -> None:
        view = memoryview(self.data)
        try:
            while view:
                view = view[os.write(fd, view[: 1 << 16]):]
        except OSError:  # the reader stopped (past the limit)
            pass
        finally:
            os.close(fd)

    def close(self) -> None:
        if self.read_end is not None:
            os.close(self.read_end)
        self.thread.join(timeout=10)


@pytest.fixture
def piped():
    made = []

    def make(text, fifo=None):
        p = Piped(text.encode() if isinstance(text, str) else text, fifo)
        made.append(p)
        return p.path

    yield make
    for p in made:
        p.close()


@pytest.fixture
def files(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    w = np.random.default_rng(0).dirichlet(np.ones(L), size=(1, 1, 2, L)).astype(np.float32)
    np.save("w.npy", w)
    np.save("q.npy", np.random.default_rng(1).normal(size=(2, L, 8)).astype(np.float32))
    return tmp_path


LABELS = "".join(f"tok{i}\n" for i in range(L))


def invoke(argv, code=0):
    r = runner.invoke(app, [str(a) for a in argv])
    assert r.exit_code == code, (r.stdout, r.stderr)
    return r


def test_labels_from_process_substitution(files, piped):
    doc = json.loads(invoke(["inspect", "w.npy", "--labels", piped(LABELS), "--json"]).stdout)
    assert doc["labels"]["q"] == [f"tok{i}" for i in range(L)]


def test_labels_from_a_fifo(files, piped):
    doc = json.loads(invoke(["inspect", "w.npy", "--labels", piped(LABELS, files / "tokens"), "--json"]).stdout)
    assert doc["labels"]["k"] == [f"tok{i}" for i in range(L)]


def test_one_pipe_read_once_for_several_files(files, piped):
    """inspect reads its labels for each file: the second gets what the first read (a pipe cannot be read twice)."""
    r = invoke(["inspect", "w.npy", "w.npy", "--labels", piped(LABELS), "--json"])
    docs = [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]
    assert len(docs) == 2 and all(d["labels"]["q"][-1] == f"tok{L - 1}" for d in docs)


def test_q_and_k_labels_of_a_computing_command(files, piped):
    doc = json.loads(invoke(["scaled", "q.npy", "q.npy", "q.npy", "--q-labels", piped(LABELS), "--k-labels",
                             piped(LABELS.upper()), "--json"]).stdout)
    assert doc["labels"] == {"q": [f"tok{i}" for i in range(L)], "k": [f"TOK{i}" for i in range(L)]}


def test_a_jobs_file_from_a_pipe_resolves_paths_in_the_current_folder(files, piped):
    jobs = json.dumps({"command": "inspect", "args": ["w.npy"], "options": {"png": "from_the_pipe.png"}}) + "\n"
    summary = json.loads(invoke(["batch", piped(jobs), "--json", "--quiet"]).stdout)
    assert summary["failed"] == 0 and (files / "from_the_pipe.png").stat().st_size > 1000


def test_configs_from_a_pipe(files, piped):
    config = {"model_type": "llama", "hidden_size": 16, "num_attention_heads": 2, "num_hidden_layers": 1,
              "rope_theta": 500.0}
    (files / "config.json").write_text(json.dumps(config))
    common = ["scaled", "q.npy", "q.npy", "q.npy", "--save-weights", "w1.npy", "--quiet"]
    invoke([*common, "--hf-config", "config.json"])
    from_file = np.load("w1.npy")
    invoke([*common, "--hf-config", piped(json.dumps(config))])
    np.testing.assert_array_equal(np.load("w1.npy"), from_file)
    rope = {"rope_type": "linear", "factor": 2.0}
    invoke([*common, "--rope", "--rope-scaling", json.dumps(rope)])
    inline = np.load("w1.npy")
    invoke([*common, "--rope", "--rope-scaling", piped(json.dumps(rope))])
    np.testing.assert_array_equal(np.load("w1.npy"), inline)


def test_a_json_array_from_a_pipe(files, piped):
    w = np.load("w.npy")[0, 0, 0]
    doc = json.loads(invoke(["inspect", piped(json.dumps(w.tolist())), "--json"]).stdout)
    assert doc["weights_shape"][-2:] == [L, L]


def test_past_the_limit_one_clear_line(files, piped):
    r = invoke(["inspect", "w.npy", "--labels", piped(b"a\n" * (MAX_TEXT_BYTES // 2 + 1))], code=1)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "/dev/fd/" in lines[0] and "more than 64.0 MiB of labels" in lines[0], r.stderr


def test_an_array_file_through_a_pipe_says_that_dash_reads_standard_input(files, piped):
    """<(cat w.npy): an .npy file is memory-mapped, which a pipe cannot be."""
    r = invoke(["inspect", piped((files / "w.npy").read_bytes())], code=2)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "named pipe" in lines[0] and "memory-mapped" in lines[0] and "'-'" in lines[0], lines


def test_a_worker_leaves_pipes_to_the_process_that_holds_them(files, piped):
    """/dev/fd/N is open in the client's process only: such a command runs there, not on a warm worker."""
    env = {}
    assert client.bypass_reason(["inspect", "w.npy"], env) is None
    assert client.bypass_reason(["inspect", "w.npy", "--labels", "/dev/fd/63"], env)
    assert client.bypass_reason(["inspect", "w.npy", "--labels=/dev/fd/63"], env)
    assert client.bypass_reason(["batch", piped("")], env)
    os.mkfifo(files / "named")
    assert client.bypass_reason(["inspect", "w.npy", "--labels", str(files / "named")], env)


def test_process_substitution_in_a_shell(files):
    """The issue's line, in bash: ``attnviz inspect w.npy --labels <(printf ...)``."""
    import shutil
    import subprocess
    import sys

    from tests.conftest import ROOT

    bash = shutil.which("bash")
    if bash is None:
        pytest.skip("no bash")
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("ATTNVIZ_")}, "PYTHONPATH": str(ROOT)}
    numbers = " ".join(map(str, range(L)))
    line = f"{sys.executable} -m attnviz inspect w.npy --labels <(printf 'tok%s\\n' {numbers}) --json"
    r = subprocess.run([bash, "-c", line], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["labels"]["q"] == [f"tok{i}" for i in range(L)]

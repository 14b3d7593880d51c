"""Scale-out (issue 13): file maps (`batch --each`, placeholders, paths on stdin, `inspect` over several
files), `--shard auto` from each scheduler's variables, results manifests that merge, `--resume` after a
SIGKILL, and the examples/ (Slurm array script, Kubernetes Indexed Job, xargs, GNU parallel) run as
local processes with the variables their scheduler sets.

Jobs are `inspect` runs on small generated weights (no TensorFlow): their JSON documents are checked
against the arrays written, so a job that ran on the wrong file, or twice, or not at all, is seen."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from attnviz.batch.filemaps import check_template, expand, per_file_outputs, sorted_paths, stdin_paths
from attnviz.batch.results import TIMING_FIELDS, ResultsFile, read_results
from attnviz.batch.shards import parse_shard, shard_positions
from attnviz.cli import app
from attnviz.errors import InputError, UsageError
from tests.conftest import ROOT

runner = CliRunner()
EXAMPLES = ROOT / "examples"
BIN = Path(sys.executable).parent
SCHEDULER_VARIABLES = ("SLURM_", "JOB_COMPLETION_INDEX", "ATTNVIZ_SHARD_COUNT")


def weights(seed: int, shape=(2, 3, 5, 5)) -> np.ndarray:
    """Attention weights [batch, heads, Lq, Lk] (.npz: one [heads, Lq, Lk] per layer): rows are distributions."""
    x = np.random.default_rng(seed).normal(size=shape)
    e = np.exp(x - x.max(-1, keepdims=True))
    return (e / e.sum(-1, keepdims=True)).astype(np.float32)


def make_files(folder: Path, names, suffix=".npy", shape=(2, 3, 5, 5)) -> dict[str, np.ndarray]:
    folder.mkdir(parents=True, exist_ok=True)
    arrays = {}
    for i, name in enumerate(names):
        arrays[name] = weights(i, shape)
        if suffix == ".npz":
            np.savez(folder / f"{name}.npz", *arrays[name])  # one array per layer, stacked by inspect
        else:
            np.save(folder / f"{name}{suffix}", arrays[name])
    return arrays


def env(**extra: str) -> dict[str, str]:
    """The environment of a local shard: no warm worker, attnviz on PATH, no scheduler variables but ours."""
    base = {k: v for k, v in os.environ.items() if not k.startswith(SCHEDULER_VARIABLES)}
    base["PATH"] = f"{BIN}{os.pathsep}{base.get('PATH', '')}"
    base["ATTNVIZ_NO_SERVER"] = "1"
    base.update(extra)
    return base


def records(path: Path) -> list[dict]:
    """The lines of a results file (each must be a complete JSON line)."""
    data = path.read_bytes()
    assert not data or data.endswith(b"\n"), f"{path}: a torn last line"
    return [json.loads(line) for line in data.splitlines() if line.strip()]


def comparable(recs: list[dict]) -> list[dict]:
    """Results lines without their timing fields, in job order."""
    return sorted(({k: v for k, v in r.items() if k not in TIMING_FIELDS} for r in recs), key=lambda r: r["index"])


def valid_png(path: Path) -> bool:
    data = path.read_bytes()
    return data.startswith(b"\x89PNG\r\n\x1a\n") and data.endswith(b"IEND\xaeB`\x82")


def check_documents(out: Path, arrays: dict[str, np.ndarray], folder: str = "acts") -> None:
    """Each out/NAME.json is inspect's document of acts/NAME: the selected map (layer 0, head 0) is that
    file's, its per-query entropy is the NumPy entropy of it."""
    for name, w in arrays.items():
        doc = json.loads((out / f"{name}.json").read_text())
        assert doc["source"].startswith(f"{folder}/{name}.")
        mine = w[0, 0] if w.ndim == 4 else w[0]
        entropy = -(mine * np.log(mine)).sum(-1)
        np.testing.assert_allclose(doc["stats"]["entropy"], entropy, rtol=1e-5)
        assert doc["weights_shape"][-2:] == list(mine.shape)


# ---------------------------------------------------------------- placeholders and file lists


def test_placeholders_fill_in_every_field_and_escape_braces():
    assert expand("out/{stem}.png", "acts/run_2.npz", 4) == "out/run_2.png"
    assert expand("{dir}/{name}:{index}:{}", "acts/run_2.npz", 4) == "acts/run_2.npz:4:acts/run_2.npz"
    assert expand("{dir}|{stem}|{name}", "w.npy", 0) == ".|w|w.npy"
    assert expand("{stem}", "a.tar.gz", 0) == "a.tar"  # the last suffix only
    assert expand("{stem}", ".hidden", 0) == ".hidden"
    assert expand("{{}}{{stem}}-{stem}}}", "x/a.npy", 0) == "{}{stem}-a}"
    assert expand("plain", "x/a.npy", 3) == "plain"
    assert check_template("out/{stem}.png", "--png") and not check_template("{{literal}}", "--png")
    for bad, word in (("{stm}.png", "unknown placeholder {stm}"), ("a{b", "a lone '{'"), ("a}b", "a lone '}'"),
                      ("{0}", "unknown placeholder {0}")):
        with pytest.raises(UsageError, match=re.escape(word)):
            check_template(bad, "--png")


def test_stdin_path_lists_and_natural_order():
    data = b"acts/w10.npy\n\n  \nacts/w2.npy\r\nacts/w1.npy\nacts/w2.npy\nwith space.npy\n"
    assert stdin_paths(data) == ["acts/w1.npy", "acts/w2.npy", "acts/w10.npy", "with space.npy"]
    with pytest.raises(UsageError, match="no paths on standard input"):
        stdin_paths(b"\n \n")
    with pytest.raises(InputError, match="NUL byte"):
        stdin_paths(b"a.npy\0b.npy\0")
    assert sorted_paths(["b10", "b9", "a", "b9"]) == ["a", "b9", "b10"]


def test_each_glob_runs_one_job_per_file(tmp_path, monkeypatch):
    names = ["w1", "w2", "w10", "w3"]
    arrays = make_files(tmp_path / "acts", names)
    (tmp_path / "acts" / "sub.npy").mkdir()  # a folder the glob matches: not a job
    (tmp_path / "out").mkdir()
    monkeypatch.chdir(tmp_path)
    r = runner.invoke(app, ["batch", "--results", "r.jsonl", "--json", "--each", "acts/*.npy", "--", "inspect", "{}",
                            "--json-file", "out/{stem}.json", "--png", "out/{index}-{name}.png"])
    assert r.exit_code == 0, r.stdout + r.stderr
    check_documents(tmp_path / "out", arrays)
    order = ["w1", "w2", "w3", "w10"]  # natural order: {index} follows it
    for index, name in enumerate(order):
        assert valid_png(tmp_path / "out" / f"{index}-{name}.npy.png")
    summary = json.loads(r.stdout)
    assert [j["path"] for j in summary["jobs"]] == [f"acts/{n}.npy" for n in order]
    recs = records(tmp_path / "r.jsonl")
    assert [(rec["index"], rec["path"]) for rec in sorted(recs, key=lambda x: x["index"])] == \
        [(i, f"acts/{n}.npy") for i, n in enumerate(order)]
    first = next(rec for rec in recs if rec["index"] == 0)
    assert first["command"] == "inspect" and first["args"] == [
        "acts/w1.npy", "--json-file", "out/w1.json", "--png", "out/0-w1.npy.png", "--quiet"]
    assert first["exit_code"] == 0 and first["error"] is None
    assert first["outputs"] == [
        {"option": "--json-file", "path": "out/w1.json", "bytes": (tmp_path / "out/w1.json").stat().st_size},
        {"option": "--png", "path": "out/0-w1.npy.png", "bytes": (tmp_path / "out/0-w1.npy.png").stat().st_size}]
    assert first["summary"] == {"command": "inspect", "source": "acts/w1.npy", "stored_dtype": "float32",
                                "weights_shape": [1, 2, 3, 5, 5], "padded_rows": 0, "checks": [], "warnings": 0}
    assert first["seconds"] >= 0 and re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", first["finished"])


def test_each_reads_paths_from_stdin(tmp_path, monkeypatch):
    arrays = make_files(tmp_path / "acts", ["a", "b", "c"])
    (tmp_path / "out").mkdir()
    monkeypatch.chdir(tmp_path)
    listing = "acts/c.npy\n\nacts/a.npy\n"  # as `find` prints them: any order; b.npy left out
    r = runner.invoke(app, ["batch", "--each", "-", "--json", "-q", "--", "inspect", "{}", "--json-file",
                            "out/{stem}.json"], input=listing)
    assert r.exit_code == 0, r.stdout + r.stderr
    assert [j["path"] for j in json.loads(r.stdout)["jobs"]] == ["acts/a.npy", "acts/c.npy"]
    check_documents(tmp_path / "out", {n: arrays[n] for n in "ac"})
    assert not (tmp_path / "out" / "b.json").exists()


@pytest.mark.parametrize("argv, message", [
    (["--each", "nothing/*.npy", "--", "inspect", "{}"], "--each 'nothing/*.npy': no file matches."),
    (["--each", "acts/*.npy", "--", "inspect", "{}", "--json-file", "out/{stm}.json"], "unknown placeholder {stm}"),
    (["--each", "acts/*.npy", "--", "inspect", "{}", "--title", "a{b"], "a lone '{'"),
    (["--each", "acts/*.npy", "--", "inspect", "acts/a.npy"], "uses no placeholder"),
    (["--each", "acts/*.npy", "--", "inspect", "{}", "--png", "out/x.png"], "--png out/x.png is written by the jobs"),
    (["--each", "acts/*.npy", "--", "inspect", "{}", "--results", "r.jsonl"], "--results is an option of batch"),
    (["--each", "acts/*.npy", "--", "nope", "{}"], "unknown command 'nope' after --"),
    (["--each", "acts/*.npy"], "give the command to run after --"),
    (["--each", "acts/*.npy", "--resume", "--", "inspect", "{}"], "--resume: needs --results"),
    (["a.jsonl", "b.jsonl"], "one jobs file, not 2 arguments"),
    ([], "missing argument JOBS"),
])
def test_each_usage_errors(tmp_path, monkeypatch, argv, message):
    make_files(tmp_path / "acts", ["a", "b"])
    (tmp_path / "out").mkdir()
    monkeypatch.chdir(tmp_path)
    r = runner.invoke(app, ["batch", *argv])
    assert r.exit_code == 2, r.stdout + r.stderr
    assert message in r.stderr and len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr
    assert not any((tmp_path / "out").iterdir())


def test_inspect_several_files(tmp_path, monkeypatch):
    arrays = make_files(tmp_path / "acts", ["a", "b"])
    np.save(tmp_path / "acts" / "raw.npy", arrays["a"] * 2)  # rows sum to 2: check-rows fails
    (tmp_path / "acts" / "bad.npy").write_bytes(b"not an array")
    (tmp_path / "out").mkdir()
    monkeypatch.chdir(tmp_path)
    r = runner.invoke(app, ["inspect", "acts/a.npy", "acts/b.npy", "--check-rows", "-q", "--json-file",
                            "out/{stem}.json"])
    assert r.exit_code == 0, r.stderr
    assert r.stderr.splitlines() == ["acts/a.npy: check-rows: passed", "acts/b.npy: check-rows: passed"]
    check_documents(tmp_path / "out", arrays)
    # a failing check: exit 3, each line names its file; the other files still run
    r = runner.invoke(app, ["inspect", "acts/raw.npy", "acts/a.npy", "--check-rows", "-q"])
    assert r.exit_code == 3
    lines = [ln for ln in r.stderr.splitlines() if "check-rows" in ln]
    assert lines[0].startswith("acts/raw.npy: check-rows: FAILED") and lines[1] == "acts/a.npy: check-rows: passed"
    # bad data outranks a failed check (1 > 3 > 0), a usage error (a missing file) outranks both
    r = runner.invoke(app, ["inspect", "acts/raw.npy", "acts/bad.npy", "acts/a.npy", "--check-rows", "-q"])
    assert r.exit_code == 1 and "acts/bad.npy" in r.stderr and "acts/a.npy: check-rows: passed" in r.stderr
    r = runner.invoke(app, ["inspect", "acts/missing.npy", "acts/bad.npy", "acts/a.npy", "-q"])
    assert r.exit_code == 2 and "acts/missing.npy: no such file" in r.stderr
    # --json: one document a line, in the order given
    r = runner.invoke(app, ["inspect", "acts/b.npy", "acts/a.npy", "--json"])
    assert r.exit_code == 0
    docs = [json.loads(line) for line in r.stdout.splitlines()]
    assert [d["source"] for d in docs] == ["acts/b.npy", "acts/a.npy"]
    # outputs need a placeholder, and must differ per file: refused before anything is written
    for argv, message in ((["--png", "out/x.png"], "2 files would all write it"),
                          (["--json-file", "out/{index}.json", "--png", "out/{dir}.png"], "both give out/acts.png")):
        r = runner.invoke(app, ["inspect", "acts/a.npy", "acts/b.npy", *argv])
        assert r.exit_code == 2 and message in r.stderr, r.stderr
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["a.json", "b.json"]
    r = runner.invoke(app, ["inspect", "acts/a.npy", "-"], input="[[1.0]]")
    assert r.exit_code == 2 and "cannot be one of several files" in r.stderr
    # one file: names are taken as written, as before
    r = runner.invoke(app, ["inspect", "acts/a.npy", "-q", "--json-file", "out/{stem}.json"])
    assert r.exit_code == 0 and (tmp_path / "out" / "{stem}.json").is_file()


# ---------------------------------------------------------------- shards


SLURM_CASES = [
    # sbatch --array=0-3: tasks 0..3
    ({"SLURM_ARRAY_TASK_ID": "2", "SLURM_ARRAY_TASK_MIN": "0", "SLURM_ARRAY_TASK_MAX": "3",
      "SLURM_ARRAY_TASK_STEP": "1", "SLURM_ARRAY_TASK_COUNT": "4"}, (2, 4)),
    # sbatch --array=1-5: ids from 1
    ({"SLURM_ARRAY_TASK_ID": "1", "SLURM_ARRAY_TASK_MIN": "1", "SLURM_ARRAY_TASK_MAX": "5",
      "SLURM_ARRAY_TASK_STEP": "1", "SLURM_ARRAY_TASK_COUNT": "5"}, (0, 5)),
    # sbatch --array=10-22:4: tasks 10, 14, 18, 22
    ({"SLURM_ARRAY_TASK_ID": "18", "SLURM_ARRAY_TASK_MIN": "10", "SLURM_ARRAY_TASK_MAX": "22",
      "SLURM_ARRAY_TASK_STEP": "4", "SLURM_ARRAY_TASK_COUNT": "4"}, (2, 4)),
    # no STEP (older Slurm): 1
    ({"SLURM_ARRAY_TASK_ID": "7", "SLURM_ARRAY_TASK_MIN": "5", "SLURM_ARRAY_TASK_MAX": "8"}, (2, 4)),
    # only the count: ids from 0
    ({"SLURM_ARRAY_TASK_ID": "3", "SLURM_ARRAY_TASK_COUNT": "6"}, (3, 6)),
]


@pytest.mark.parametrize("variables, expected", SLURM_CASES)
def test_shard_auto_from_slurm(variables, expected):
    assert parse_shard("auto", variables) == expected
    assert parse_shard(f"auto/{expected[1]}", variables) == expected


def test_shard_auto_from_kubernetes():
    assert parse_shard("auto/3", {"JOB_COMPLETION_INDEX": "2"}) == (2, 3)
    assert parse_shard("auto", {"JOB_COMPLETION_INDEX": "0", "ATTNVIZ_SHARD_COUNT": "8"}) == (0, 8)
    assert parse_shard("auto/8", {"JOB_COMPLETION_INDEX": "7", "ATTNVIZ_SHARD_COUNT": "8"}) == (7, 8)
    assert parse_shard("1/4", {"JOB_COMPLETION_INDEX": "0"}) == (1, 4)  # an explicit shard wins


@pytest.mark.parametrize("text, variables, message", [
    ("auto", {}, "no scheduler variables"),
    ("auto/4", {"ATTNVIZ_SHARD_COUNT": "4"}, "no scheduler variables"),
    ("auto", {"JOB_COMPLETION_INDEX": "1"}, "not the number of shards"),
    ("auto/3", {"JOB_COMPLETION_INDEX": "3"}, "not in 0..2"),
    ("auto/3", {"JOB_COMPLETION_INDEX": "1", "ATTNVIZ_SHARD_COUNT": "4"}, "says otherwise"),
    ("auto", {"JOB_COMPLETION_INDEX": "x", "ATTNVIZ_SHARD_COUNT": "4"}, "JOB_COMPLETION_INDEX='x' is not an integer"),
    ("auto", {"SLURM_ARRAY_TASK_ID": "1", "JOB_COMPLETION_INDEX": "1"}, "both"),
    ("auto", {"SLURM_ARRAY_TASK_ID": "4", "SLURM_ARRAY_TASK_MIN": "0", "SLURM_ARRAY_TASK_MAX": "3"}, "not one of 0..3"),
    ("auto", {"SLURM_ARRAY_TASK_ID": "3", "SLURM_ARRAY_TASK_MIN": "1", "SLURM_ARRAY_TASK_MAX": "7",
              "SLURM_ARRAY_TASK_STEP": "3"}, "not one of 1..7 step 3"),
    # --array=1,3,9: a list, not a range; Slurm's count disagrees with min..max
    ("auto", {"SLURM_ARRAY_TASK_ID": "3", "SLURM_ARRAY_TASK_MIN": "1", "SLURM_ARRAY_TASK_MAX": "9",
              "SLURM_ARRAY_TASK_STEP": "1", "SLURM_ARRAY_TASK_COUNT": "3"}, "SLURM_ARRAY_TASK_COUNT says 3"),
    ("auto/5", {"SLURM_ARRAY_TASK_ID": "0", "SLURM_ARRAY_TASK_MIN": "0", "SLURM_ARRAY_TASK_MAX": "3"}, "says 5"),
    ("auto", {"SLURM_ARRAY_TASK_ID": "2"}, "no number of tasks"),
    ("auto/x", {}, "expected auto or auto/COUNT"),
    ("2/2", {}, "INDEX runs from 0"),
])
def test_shard_auto_errors(text, variables, message):
    with pytest.raises(UsageError, match=re.escape(message)):
        parse_shard(text, variables)


def test_shard_auto_on_the_command_line(tmp_path, monkeypatch):
    make_files(tmp_path / "acts", ["a", "b", "c", "d", "e"])
    monkeypatch.chdir(tmp_path)
    for name in [k for k in os.environ if k.startswith(SCHEDULER_VARIABLES)]:
        monkeypatch.delenv(name)
    r = runner.invoke(app, ["batch", "--shard", "auto", "--each", "acts/*.npy", "--", "inspect", "{}"])
    assert r.exit_code == 2 and "--shard auto: no scheduler variables" in r.stderr
    seen = []
    for task in (1, 3, 5):  # sbatch --array=1-5:2
        monkeypatch.setenv("SLURM_ARRAY_TASK_ID", str(task))
        for name, value in (("MIN", "1"), ("MAX", "5"), ("STEP", "2"), ("COUNT", "3")):
            monkeypatch.setenv(f"SLURM_ARRAY_TASK_{name}", value)
        r = runner.invoke(app, ["batch", "--shard", "auto", "--json", "-q", "--each", "acts/*.npy", "--", "inspect",
                                "{}"])
        assert r.exit_code == 0, r.stderr
        doc = json.loads(r.stdout)
        assert doc["shard"] == {"index": (task - 1) // 2, "count": 3}
        seen += [j["path"] for j in doc["jobs"]]
    assert sorted(seen) == [f"acts/{n}.npy" for n in "abcde"]


def test_shards_partition_whatever_the_listing_order():
    keys = [f"inspect acts/w{i}.npy" for i in range(23)]
    shuffled = list(np.random.default_rng(0).permutation(keys))
    for count in (1, 3, 7, 30):
        parts = [[keys[n] for n in shard_positions(keys, i, count)] for i in range(count)]
        parts_shuffled = [[shuffled[n] for n in shard_positions(shuffled, i, count)] for i in range(count)]
        assert [sorted(p) for p in parts] == [sorted(p) for p in parts_shuffled]  # the same jobs per shard
        flat = [k for p in parts for k in p]
        assert sorted(flat) == sorted(keys) and len(flat) == len(set(flat))  # all, once
        assert max(map(len, parts)) - min(map(len, parts)) <= 1  # balanced
    # positions come back in list order, so a shard runs its jobs as listed
    assert shard_positions(keys, 0, 3) == sorted(shard_positions(keys, 0, 3))


def test_jobs_file_shards_do_not_depend_on_line_order(tmp_path, monkeypatch):
    make_files(tmp_path, [f"w{i}" for i in range(7)])
    lines = [json.dumps({"command": "inspect", "args": [f"w{i}.npy"], "options": {"json": True}}) for i in range(7)]
    seen = {}
    for name, order in (("forward", lines), ("backward", lines[::-1])):
        (tmp_path / f"{name}.jsonl").write_text("\n".join(order) + "\n")
        for index in range(3):
            r = runner.invoke(app, ["batch", str(tmp_path / f"{name}.jsonl"), "--shard", f"{index}/3", "--json", "-q"])
            assert r.exit_code == 0, r.stderr
            seen[name, index] = sorted(j["document"]["source"].rsplit("/", 1)[1] for j in json.loads(r.stdout)["jobs"])
    for index in range(3):
        assert seen["forward", index] == seen["backward", index]
    assert sorted(sum((seen["forward", i] for i in range(3)), [])) == [f"w{i}.npy" for i in range(7)]


# ---------------------------------------------------------------- results manifests


def run_each(folder: Path, *extra: str, check_rows: bool = True):
    argv = ["batch", *extra, "--quiet", "--each", "acts/*.npy", "--", "inspect", "{}", "--json-file",
            "out/{stem}.json", *(["--check-rows"] if check_rows else [])]
    cwd = os.getcwd()
    os.chdir(folder)
    try:
        return runner.invoke(app, argv)
    finally:
        os.chdir(cwd)


def test_results_of_three_shards_merge_to_one_run(tmp_path):
    names = [f"w{i}" for i in range(8)]
    for where in ("one", "sharded"):
        arrays = make_files(tmp_path / where / "acts", names)
        np.save(tmp_path / where / "acts" / "w3.npy", arrays["w3"] * 2)  # a failing check: exit 3, recorded
        (tmp_path / where / "out").mkdir()
    r = run_each(tmp_path / "one", "--results", "all.jsonl")
    assert r.exit_code == 1  # one job's check failed
    for index in range(3):
        r = run_each(tmp_path / "sharded", "--shard", f"{index}/3", "--results", f"shard-{index}.jsonl")
        assert r.exit_code in (0, 1), r.stderr
    one = records(tmp_path / "one" / "all.jsonl")
    parts = [records(tmp_path / "sharded" / f"shard-{i}.jsonl") for i in range(3)]
    assert sorted(map(len, parts)) == [2, 3, 3]
    merged = b"".join((tmp_path / "sharded" / f"shard-{i}.jsonl").read_bytes() for i in range(3))  # cat
    (tmp_path / "merged.jsonl").write_bytes(merged)
    assert comparable(records(tmp_path / "merged.jsonl")) == comparable(one)
    assert len(one) == 8 and {r["index"] for r in one} == set(range(8))
    failed = [r for r in one if r["exit_code"]]
    assert [(r["path"], r["exit_code"], r["summary"]["checks"][0]["passed"]) for r in failed] == [
        ("acts/w3.npy", 3, False)]
    assert failed[0]["summary"]["checks"][0]["failures"] == 2 * 3 * 5  # every row of every map sums to 2


def test_results_lines_never_interleave(tmp_path):
    """Threads of several processes append to one results file at once: every line whole."""
    path = tmp_path / "shared.jsonl"
    script = (
        "import sys, threading\n"
        "from attnviz.batch.results import ResultsFile\n"
        "f = ResultsFile(sys.argv[1])\n"
        "def go(t):\n"
        "    for i in range(100):\n"
        "        f.append({'who': sys.argv[2], 't': t, 'i': i, 'pad': 'x' * (5000 + 97 * i)})\n"
        "ts = [threading.Thread(target=go, args=(t,)) for t in range(4)]\n"
        "[t.start() for t in ts]; [t.join() for t in ts]\n")
    procs = [subprocess.Popen([sys.executable, "-c", script, str(path), str(p)], cwd=ROOT) for p in range(3)]
    assert [p.wait(timeout=120) for p in procs] == [0, 0, 0]
    recs = records(path)
    assert len(recs) == 3 * 4 * 100
    assert {(r["who"], r["t"], r["i"]) for r in recs} == {(str(p), t, i) for p in range(3) for t in range(4)
                                                          for i in range(100)}
    assert all(len(r["pad"]) == 5000 + 97 * r["i"] for r in recs)


def test_a_torn_last_line_is_cut_and_its_job_redone(tmp_path):
    make_files(tmp_path / "acts", [f"w{i}" for i in range(4)])
    (tmp_path / "out").mkdir()
    assert run_each(tmp_path, "--results", "r.jsonl").exit_code == 0
    path = tmp_path / "r.jsonl"
    data = path.read_bytes()
    last_start = data.rstrip(b"\n").rfind(b"\n") + 1
    torn_job = json.loads(data[last_start:])["path"]
    path.write_bytes(data[:last_start] + data[last_start:last_start + 40])  # killed while writing it
    recorded, unreadable, torn = read_results(str(path))
    assert len(recorded) == 3 and unreadable == 0 and torn  # the torn line apart from lines that are no record
    r = run_each(tmp_path, "--results", "r.jsonl", "--resume", "--json")
    assert r.exit_code == 0, r.stderr
    summary = json.loads(r.stdout)
    assert summary["run"] == 1 and summary["resumed"] == 3
    recs = records(path)  # whole lines only: the torn one is gone
    assert len(recs) == 4 and recs[-1]["path"] == torn_job
    assert sorted(r["index"] for r in recs) == [0, 1, 2, 3]


def test_results_file_repair_keeps_whole_lines(tmp_path):
    path = tmp_path / "r.jsonl"
    path.write_bytes(b'{"a": 1}\n{"b": 2}\n{"c": ')
    with ResultsFile(str(path)) as f:
        f.append({"d": 4})
        assert f.repaired == 1
    assert path.read_bytes() == b'{"a": 1}\n{"b": 2}\n{"d": 4}\n'
    path.write_bytes(b'{"torn')
    with ResultsFile(str(path)) as f:
        f.append({"e": 5})
    assert path.read_bytes() == b'{"e": 5}\n'


def test_resume_skips_complete_jobs_and_redoes_the_rest(tmp_path):
    arrays = make_files(tmp_path / "acts", [f"w{i}" for i in range(5)])
    np.save(tmp_path / "acts" / "w1.npy", arrays["w1"] * 2)  # exit 3: complete, not redone
    (tmp_path / "out").mkdir()
    r = run_each(tmp_path, "--results", "r.jsonl", "--resume")  # no results file yet: runs everything
    assert r.exit_code == 1
    assert len(records(tmp_path / "r.jsonl")) == 5
    (tmp_path / "out" / "w2.json").unlink()  # an output gone
    with open(tmp_path / "out" / "w4.json", "a") as fh:  # an output changed since
        fh.write(" ")
    (tmp_path / "acts" / "w0.npy").rename(tmp_path / "w0.npy")  # w0 gone from the glob: not a job any more
    (tmp_path / "acts" / "bad.npy").write_bytes(b"junk")  # a new file that fails (exit 1) ...
    r = run_each(tmp_path, "--results", "r.jsonl", "--resume", "--json")
    doc = json.loads(r.stdout)
    assert doc["run"] == 3 and doc["resumed"] == 2 and r.exit_code == 1
    assert {j["path"] for j in doc["jobs"] if not j.get("resumed")} == {"acts/w2.npy", "acts/w4.npy", "acts/bad.npy"}
    assert {j["path"] for j in doc["jobs"] if j.get("resumed")} == {"acts/w1.npy", "acts/w3.npy"}
    # ... is tried again on the next resume (exit 1 is not complete); the rest are not
    r = run_each(tmp_path, "--results", "r.jsonl", "--resume", "--json")
    doc = json.loads(r.stdout)
    assert doc["run"] == 1 and [j["path"] for j in doc["jobs"] if not j.get("resumed")] == ["acts/bad.npy"]
    # w1's failed check is still the batch's failure, and still in the summary
    w1 = next(j for j in doc["jobs"] if j["path"] == "acts/w1.npy")
    assert w1["exit_code"] == 3 and w1["resumed"]


def test_resume_removes_what_a_killed_run_left_staged(tmp_path):
    """Staged files (``.NAME.*.staged.EXT``, their ``.part``) a SIGKILL left beside a job's outputs go on
    --resume, whether the job is done or redone; other hidden files stay."""
    make_files(tmp_path / "acts", ["w1", "w2"])
    (tmp_path / "out").mkdir()
    assert run_each(tmp_path, "--results", "r.jsonl").exit_code == 0
    lines = (tmp_path / "r.jsonl").read_bytes().splitlines(keepends=True)
    (tmp_path / "r.jsonl").write_bytes(b"".join(ln for ln in lines if b"w2.npy" not in ln))  # w2 not done
    out = tmp_path / "out"
    left = [".w1.json.k3j_x9.staged.json", ".w2.json.a8b1q2.staged.json", "..w2.json.a8b1q2.staged.json.zz1.part"]
    for name in left:
        (out / name).write_bytes(b"{half")
    (out / ".keep").write_text("not ours")
    r = run_each(tmp_path, "--results", "r.jsonl", "--resume", "--json")
    assert r.exit_code == 0 and json.loads(r.stdout)["run"] == 1
    assert sorted(p.name for p in out.iterdir()) == [".keep", "w1.json", "w2.json"]


def test_resume_after_sigkill(tmp_path):
    """A batch killed with SIGKILL mid-run, restarted with --resume: the rest is done, nothing done twice,
    outputs of finished jobs untouched, no corrupt or half-written output anywhere."""
    n = 24  # killed after 6 (the poll below sees each line within ~20 ms; a job takes ~0.1 s): 18 left to resume
    arrays = make_files(tmp_path / "acts", [f"w{i}" for i in range(n)], shape=(2, 4, 24, 24))
    (tmp_path / "out").mkdir()
    argv = [str(BIN / "attnviz"), "batch", "--quiet", "--results", "r.jsonl", "--each", "acts/*.npy", "--",
            "inspect", "{}", "--png", "out/{stem}.png", "--json-file", "out/{stem}.json"]
    results = tmp_path / "r.jsonl"
    proc = subprocess.Popen(argv, cwd=tmp_path, env=env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        if results.exists() and results.read_bytes().count(b"\n") >= 6:
            break
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL, proc.stderr.read() if proc.stderr else ""
    data = results.read_bytes()
    whole = data[:data.rfind(b"\n") + 1]
    first = [json.loads(line) for line in whole.splitlines()]
    assert 6 <= len(first) < n, "the batch ended before it was killed: give it more work"
    # what the kill left: every output in place is whole; nothing but hidden staged files besides
    for path in (tmp_path / "out").iterdir():
        if path.name.startswith("."):
            continue
        assert valid_png(path) if path.suffix == ".png" else json.loads(path.read_text())
    done = {rec["path"]: {o["path"]: (tmp_path / o["path"]).stat() for o in rec["outputs"]} for rec in first}
    assert all(len(files) == 2 for files in done.values())

    r = subprocess.run([*argv[:2], "--resume", *argv[2:]], cwd=tmp_path, env=env(), capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    second = records(results)[len(first):]
    assert len(first) + len(second) == n
    assert {rec["path"] for rec in first}.isdisjoint(rec["path"] for rec in second)  # nothing redone
    assert sorted(rec["index"] for rec in first + second) == list(range(n))
    for files in done.values():  # the outputs of finished jobs are the very files written before the kill
        for path, before in files.items():
            after = (tmp_path / path).stat()
            assert (after.st_ino, after.st_mtime_ns, after.st_size) == (before.st_ino, before.st_mtime_ns,
                                                                        before.st_size)
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == sorted(
        f"w{i}{s}" for i in range(n) for s in (".json", ".png"))  # every output, no leftovers
    assert all(valid_png(tmp_path / "out" / f"w{i}.png") for i in range(n))
    check_documents(tmp_path / "out", arrays)


# ---------------------------------------------------------------- examples/, run as their schedulers run them


def example_folder(tmp_path: Path, name: str, n: int = 7) -> tuple[Path, dict[str, np.ndarray]]:
    folder = tmp_path / name
    arrays = make_files(folder / "acts", [f"run_{i}" for i in range(n)], suffix=".npz")
    return folder, arrays


def unsharded(tmp_path: Path, argv_tail: list[str], n: int = 7) -> list[dict]:
    """One unsharded run of the same batch, in its own folder: the reference for the shards' union."""
    folder, _ = example_folder(tmp_path, "unsharded", n)
    (folder / "out").mkdir()
    r = subprocess.run([str(BIN / "attnviz"), "batch", "--quiet", "--results", "all.jsonl", *argv_tail], cwd=folder,
                       env=env(), capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return records(folder / "all.jsonl")


EXAMPLE_JOB = ["--each", "acts/*.npz", "--", "inspect", "{}", "--png", "out/{stem}.png", "--json-file",
               "out/{stem}.json"]


@pytest.fixture(scope="module")
def unsharded_example(tmp_path_factory) -> list[dict]:
    """The unsharded run of EXAMPLE_JOB on example_folder's files, which every example's shards must add up
    to: the same run for each, so made once."""
    return unsharded(tmp_path_factory.mktemp("reference"), EXAMPLE_JOB)


def merged(folder: Path) -> list[dict]:
    """cat results/shard-*.jsonl"""
    return [rec for path in sorted((folder / "results").glob("shard-*.jsonl")) for rec in records(path)]


def to_bucket(folder: Path, server, name: str) -> str:
    """The example's acts/ put in a new bucket of the S3 server on the loopback (tests/s3server.py): its URL."""
    bucket = server.bucket(name)
    for path in sorted((folder / "acts").iterdir()):
        server.put(bucket, f"data/acts/{path.name}", path.read_bytes())
    return f"s3://{bucket}/data"


def from_bucket(server, data: str, folder: Path) -> list[dict]:
    """The example's results/ and out/ fetched from the bucket into ``folder``; the shards' merged records, read as
    the unsharded local run's (the bucket's URL taken off, the size of each document, which names its files, left
    out)."""
    bucket = data.split("/")[2]
    for key in server.keys(bucket):
        if key.startswith(("data/results/", "data/out/")):
            target = folder / key.removeprefix("data/")
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(server.get(bucket, key))
    found = []
    for rec in merged(folder):
        rec = json.loads(json.dumps(rec).replace(data + "/", ""))
        for out in rec["outputs"]:
            out.pop("bytes")
        found.append(rec)
    return found


def without_sizes(recs: list[dict]) -> list[dict]:
    recs = json.loads(json.dumps(recs))
    for rec in recs:
        for out in rec["outputs"]:
            out.pop("bytes")
    return recs


def test_slurm_array_example(tmp_path, unsharded_example):
    from tests import s3server

    server = s3server.start()
    script = EXAMPLES / "slurm_array.sh"
    text = script.read_text()
    assert re.search(r"^#SBATCH --array=0-15$", text, re.M)
    assert "attnviz batch --shard auto" in text and "--results" in text and "--resume" in text
    folder, arrays = example_folder(tmp_path, "slurm")
    data = to_bucket(folder, server, "slurm")
    # as `sbatch --array=1-5:2 examples/slurm_array.sh` runs it: tasks 1, 3 and 5 (the #SBATCH lines are comments),
    # the nodes reading from and writing to a bucket
    for task in (1, 3, 5):
        variables = {"SLURM_JOB_ID": str(1000 + task), "SLURM_ARRAY_JOB_ID": "1000",
                     "SLURM_ARRAY_TASK_ID": str(task), "SLURM_ARRAY_TASK_MIN": "1", "SLURM_ARRAY_TASK_MAX": "5",
                     "SLURM_ARRAY_TASK_STEP": "2", "SLURM_ARRAY_TASK_COUNT": "3", "SLURM_CPUS_PER_TASK": "2",
                     "ATTNVIZ_DATA": data, **server.env()}
        r = subprocess.run(["bash", str(script)], cwd=folder, env=env(**variables), capture_output=True, text=True,
                           timeout=300)
        assert r.returncode == 0, r.stderr
    assert not (folder / "out").exists() and not (folder / "results").exists()  # all of it in the bucket
    found = from_bucket(server, data, folder)
    shards = {p.name: records(p) for p in (folder / "results").glob("*.jsonl")}
    assert sorted(shards) == ["shard-1.jsonl", "shard-3.jsonl", "shard-5.jsonl"]
    assert sorted(len(v) for v in shards.values()) == [2, 2, 3]
    assert comparable(found) == comparable(without_sizes(unsharded_example))
    check_documents(folder / "out", arrays, f"{data}/acts")


def test_slurm_array_example_on_a_shared_folder(tmp_path, unsharded_example):
    """ATTNVIZ_DATA names a folder the nodes share instead: the same run, on local files."""
    folder, arrays = example_folder(tmp_path, "slurm")
    variables = {"SLURM_ARRAY_TASK_ID": "0", "SLURM_ARRAY_TASK_COUNT": "1", "ATTNVIZ_DATA": "."}
    r = subprocess.run(["bash", str(EXAMPLES / "slurm_array.sh")], cwd=folder, env=env(**variables),
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    found = [json.loads(json.dumps(rec).replace('"./', '"')) for rec in merged(folder)]
    assert comparable(without_sizes(found)) == comparable(without_sizes(unsharded_example))
    check_documents(folder / "out", arrays, "./acts")


def test_kubernetes_indexed_job_example(tmp_path, unsharded_example):
    from tests import s3server

    yaml = pytest.importorskip("yaml")
    server = s3server.start()
    manifest = yaml.safe_load((EXAMPLES / "k8s_indexed_job.yaml").read_text())
    spec = manifest["spec"]
    assert manifest["kind"] == "Job" and spec["completionMode"] == "Indexed"
    pod = spec["template"]["spec"]
    container = pod["containers"][0]
    variables = {e["name"]: e["value"] for e in container.get("env", []) if "value" in e}
    secrets = [e["name"] for e in container.get("env", []) if "valueFrom" in e]
    assert variables["ATTNVIZ_SHARD_COUNT"] == str(spec["completions"])  # the manifest agrees with itself
    assert variables["ATTNVIZ_DATA"].startswith("s3://") and pod["restartPolicy"] == "Never"
    assert sorted(secrets) == ["AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"] and "volumes" not in pod
    folder, arrays = example_folder(tmp_path, "k8s")
    data = to_bucket(folder, server, "k8s")
    # every pod, as the Job controller starts them: JOB_COMPLETION_INDEX = 0 .. completions - 1, the
    # container's env (its bucket here the test's; the secret's keys and the endpoint the test server's), its
    # command in a folder of its own
    for index in range(spec["completions"]):
        pod_env = {**variables, **server.env(), "ATTNVIZ_DATA": data, "JOB_COMPLETION_INDEX": str(index)}
        r = subprocess.run(container["command"], cwd=folder, env=env(**pod_env), capture_output=True, text=True,
                           timeout=300)
        assert r.returncode == 0, r.stderr
    found = from_bucket(server, data, folder)
    assert len(list((folder / "results").glob("shard-*.jsonl"))) == spec["completions"]
    assert comparable(found) == comparable(without_sizes(unsharded_example))
    check_documents(folder / "out", arrays, f"{data}/acts")


def readme_block(heading: str) -> list[str]:
    """The lines of the first ```sh block under a heading of examples/README.md."""
    text = (EXAMPLES / "README.md").read_text()
    section = text[text.index(f"## {heading}\n"):]
    block = section[section.index("```sh\n") + 6:]
    return block[:block.index("```")].strip().splitlines()


@pytest.mark.parametrize("tool", ["xargs", "GNU parallel"])
def test_one_machine_examples(tmp_path, tool, unsharded_example):
    lines = readme_block(tool)
    program = "xargs" if tool == "xargs" else "parallel"
    if shutil.which(program) is None:
        pytest.skip(f"{program} is not installed")
    if program == "parallel":
        version = subprocess.run(["parallel", "--version"], capture_output=True, text=True)
        if "GNU parallel" not in version.stdout:
            pytest.skip("parallel is not GNU parallel (moreutils has one of the same name)")
    assert any(line.startswith(("seq 0 3 | xargs", "parallel ")) for line in lines)
    folder, arrays = example_folder(tmp_path, program)
    r = subprocess.run(["bash", "-euo", "pipefail", "-c", "\n".join(lines)], cwd=folder, env=env(),
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert len(list((folder / "results").glob("shard-*.jsonl"))) == 4
    assert comparable(records(folder / "results.jsonl")) == comparable(unsharded_example)
    check_documents(folder / "out", arrays)


def test_threads_and_a_shared_results_file(tmp_path):
    """--jobs 3 with two shards writing one results file at once: one whole line per job."""
    make_files(tmp_path / "acts", [f"w{i}" for i in range(10)])
    (tmp_path / "out").mkdir()
    codes = {}

    def shard(i: int) -> None:
        r = subprocess.run([str(BIN / "attnviz"), "batch", "--shard", f"{i}/2", "--jobs", "3", "--quiet",
                            "--results", "shared.jsonl", *EXAMPLE_JOB[:1], "acts/*.npy", *EXAMPLE_JOB[2:]],
                           cwd=tmp_path, env=env(), capture_output=True, text=True, timeout=300)
        codes[i] = (r.returncode, r.stderr)

    threads = [threading.Thread(target=shard, args=(i,)) for i in range(2)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    assert codes[0][0] == codes[1][0] == 0, codes
    recs = records(tmp_path / "shared.jsonl")
    assert sorted(r["index"] for r in recs) == list(range(10))


def test_per_file_outputs_plan():
    plans = per_file_outputs({"--png": "out/{stem}.png", "--json-file": None}, ["a/x.npy", "b/y.npy"])
    assert plans == [{"--png": "out/x.png", "--json-file": None}, {"--png": "out/y.png", "--json-file": None}]
    with pytest.raises(UsageError, match="a/x.npy and b/x.npy both give out/x.png"):
        per_file_outputs({"--png": "out/{stem}.png"}, ["a/x.npy", "b/x.npy"])


def test_readme_file_maps_run(tmp_path):
    """The file-map lines of the batch page (docs/commands/batch.md), run as written in a folder holding what they name
    (the find pipeline through a real shell)."""
    import shlex

    from tests.docs_text import page

    section = page("commands/batch.md")
    lines = [ln.strip() for ln in section.splitlines() if "--each" in ln and ln.strip().startswith(("attnviz", "find"))]
    assert len(lines) == 3, lines
    acts = make_files(tmp_path / "acts", ["run_1", "run_2"], suffix=".npz")
    run1 = make_files(tmp_path / "run1", ["a", "b"])
    make_files(tmp_path / "run2", ["a", "b"])
    make_files(tmp_path / "runs" / "deep", ["x"])
    for folder in ("out", "diffs"):
        (tmp_path / folder).mkdir()
    for line in lines:
        if line.startswith("find"):
            r = subprocess.run(["bash", "-o", "pipefail", "-c", line], cwd=tmp_path, env=env(), capture_output=True,
                               text=True, timeout=300)
            assert r.returncode == 0, r.stderr
            assert "1 of 1 jobs succeeded" in r.stdout and "runs/deep/x.npy" in r.stdout  # the summary table
            continue
        r = subprocess.run([str(BIN / "attnviz"), *shlex.split(line)[1:]], cwd=tmp_path, env=env(), capture_output=True,
                           text=True, timeout=300)
        assert r.returncode == 0, line + "\n" + r.stderr
    check_documents(tmp_path / "out", acts)
    assert all(valid_png(tmp_path / "out" / f"{n}.png") for n in acts)
    for name in run1:  # run2 holds the same arrays (the same seeds): compare finds no difference
        doc = json.loads((tmp_path / "diffs" / f"{name}.json").read_text())
        assert (doc["a"], doc["b"]) == (f"run1/{name}.npy", f"run2/{name}.npy") and doc["max_abs_diff"] == 0.0


def test_every_output_option_is_an_output_to_batch():
    """Each option by which a command writes a file (--png, --*-png, --html, --json-file, --save-*) is
    one batch knows: it checks the jobs' names for collisions, records the file in --results and makes
    --resume look for it (--received-png once was none of these)."""
    import typer.main

    from attnviz.batch.jobs import OUTPUT_FLAGS

    writers = set()
    for command in typer.main.get_command(app).commands.values():
        for param in command.params:
            for opt in getattr(param, "opts", []):
                if opt.endswith("-png") or opt.startswith("--save-") or opt in ("--png", "--html", "--json-file"):
                    writers.add(opt)
    assert {"--received-png", "--save-ids", "--save-labels"} <= writers
    assert writers <= OUTPUT_FLAGS, sorted(writers - OUTPUT_FLAGS)


def test_received_png_is_recorded_checked_and_resumed(tmp_path, monkeypatch):
    """--each ... -- inspect {} --received-png out/{stem}.png: the PNG is listed in the results line, a
    deleted one is redone by --resume, and one name for every job is refused before anything runs."""
    make_files(tmp_path / "acts", ["a", "b"])
    (tmp_path / "out").mkdir()
    monkeypatch.chdir(tmp_path)
    argv = ["batch", "--quiet", "--results", "r.jsonl", "--each", "acts/*.npy", "--", "inspect", "{}",
            "--received-png", "out/{stem}.png"]
    assert runner.invoke(app, argv).exit_code == 0
    recs = records(tmp_path / "r.jsonl")
    assert [[o["path"] for o in r["outputs"]] for r in recs] == [["out/a.png"], ["out/b.png"]]
    (tmp_path / "out" / "a.png").unlink()
    r = runner.invoke(app, [*argv[:1], "--resume", "--json", *argv[1:]])
    assert r.exit_code == 0, r.stdout + r.stderr
    assert [j["path"] for j in json.loads(r.stdout)["jobs"] if not j.get("resumed")] == ["acts/a.npy"]
    assert valid_png(tmp_path / "out" / "a.png")
    r = runner.invoke(app, [*argv[:-1], "out/one.png"])
    assert r.exit_code == 2 and "--received-png out/one.png is written by the jobs" in r.stderr
    assert not (tmp_path / "out" / "one.png").exists()

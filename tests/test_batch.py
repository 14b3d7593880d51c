"""`batch`: good and bad jobs mixed (results, errors, summary, exit code), the same job through batch and
the command line gives identical JSON, shards partition the jobs exactly, --fail-fast, --jobs."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from attnviz.cli import app
from attnviz.cli.batch import job_from_line
from tests.conftest import SAMPLES

runner = CliRunner()


@pytest.fixture
def folder(tmp_path):
    for name in ("q", "k", "v"):
        np.save(tmp_path / f"{name}.npy", np.load(SAMPLES / f"{name}.npy"))
    return tmp_path


def write_jobs(folder, jobs):
    lines = [j if isinstance(j, str) else json.dumps(j) for j in jobs]
    (folder / "jobs.jsonl").write_text("\n".join(lines) + "\n")
    return str(folder / "jobs.jsonl")


QKV = ["q.npy", "k.npy", "v.npy"]


def test_mixed_good_and_bad_jobs(folder):
    jobs = write_jobs(folder, [
        {"command": "scaled", "args": QKV, "options": {"causal": True, "png": "a.png", "json": "a.json"}},
        "# comments and blank lines are skipped",
        "",
        {"command": "scaled", "args": ["missing.npy", "k.npy", "v.npy"]},
        "{broken",
        {"command": "dot", "args": QKV, "options": {"json": True}},
        {"command": "nope", "args": QKV},
        {"command": "sparse", "args": QKV, "options": {"method": "topk", "k": 99}},
    ])
    r = runner.invoke(app, ["batch", jobs, "--json"])
    assert r.exit_code == 1
    doc = json.loads(r.stdout)
    status = {j["line"]: (j["status"], j["exit_code"]) for j in doc["jobs"]}
    assert status == {1: ("ok", 0), 4: ("failed", 2), 5: ("failed", 2), 6: ("ok", 0), 7: ("failed", 2),
                      8: ("failed", 2)}
    errors = {j["line"]: j["error"] for j in doc["jobs"]}
    assert "missing.npy: no such file" in errors[4] and "not valid JSON" in errors[5]
    assert "unknown command 'nope'" in errors[7] and "--k 99" in errors[8]
    assert doc["total"] == 6 and doc["failed"] == 4 and doc["run"] == 6
    dot = next(j for j in doc["jobs"] if j["line"] == 6)["document"]
    assert dot["variant"] == "dot" and dot["params"]["scale"] == 1.0
    assert (folder / "a.png").stat().st_size > 5000
    saved = json.loads((folder / "a.json").read_text())
    assert np.triu(np.array(saved["weights"]), 1).max() == 0  # causal


def test_same_job_same_json_as_the_command_line(folder):
    out_cli, out_batch = folder / "cli.json", folder / "batch.json"
    options = {"causal": True, "scale": 0.5, "mask_convention": "block", "key_padding_mask": "pad.npy"}
    np.save(folder / "pad.npy", np.array([0, 0, 0, 1]))
    cli = runner.invoke(app, ["scaled", *(str(folder / a) for a in QKV), "--causal", "--scale", "0.5",
                              "--mask-convention", "block", "--key-padding-mask", str(folder / "pad.npy"),
                              "--json-file", str(out_cli), "--quiet"])
    assert cli.exit_code == 0, cli.stderr
    jobs = write_jobs(folder, [{"command": "scaled", "args": QKV, "options": {**options, "json": "batch.json"}}])
    r = runner.invoke(app, ["batch", jobs, "--quiet"])
    assert r.exit_code == 0, r.stderr
    a, b = json.loads(out_cli.read_text()), json.loads(out_batch.read_text())
    a.pop("files"), b.pop("files")
    assert a == b


def test_shards_partition_the_jobs(folder):
    jobs = write_jobs(folder, [{"command": "dot", "args": QKV} for _ in range(7)])
    seen = []
    for index in range(3):
        doc = json.loads(runner.invoke(app, ["batch", jobs, "--shard", f"{index}/3", "--json", "-q"]).stdout)
        seen += [j["line"] for j in doc["jobs"]]
        assert doc["shard"] == {"index": index, "count": 3}
    assert sorted(seen) == list(range(1, 8))
    r = runner.invoke(app, ["batch", jobs, "--shard", "3/3"])
    assert r.exit_code == 2 and "INDEX runs from 0" in r.stderr


def test_fail_fast_and_parallel_jobs(folder):
    jobs = write_jobs(folder, [{"command": "dot", "args": QKV}, {"command": "dot", "args": ["x.npy", "k.npy"]},
                               *[{"command": "dot", "args": QKV}] * 3])
    doc = json.loads(runner.invoke(app, ["batch", jobs, "--fail-fast", "--json", "-q"]).stdout)
    assert doc["run"] == 2 and doc["skipped"] == 3
    doc = json.loads(runner.invoke(app, ["batch", jobs, "--jobs", "3", "--json", "-q"]).stdout)
    assert doc["run"] == 5 and doc["failed"] == 1


def test_job_lines_become_command_lines(tmp_path):
    job = job_from_line(1, json.dumps({"command": "local", "args": ["a.npz:q", "/abs/k.npy"],
                                        "options": {"window": 2, "causal": True, "renormalize": False,
                                                    "labels": "a,b", "png": "out/x.png"}}),
                        tmp_path, {"local"})
    assert job.argv == ["local", f"{tmp_path}/a.npz:q", "/abs/k.npy", "--window", "2", "--causal",
                        "--labels", "a,b", "--png", f"{tmp_path}/out/x.png", "--quiet"]
    assert job_from_line(2, '{"command": "dot", "args": ["-"]}', tmp_path, {"dot"}).error

"""`batch`: good and bad jobs mixed (results, errors, summary, exit code), the same job through batch and
the command line gives identical JSON, shards partition the jobs exactly, --fail-fast, --jobs."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from attnviz.batch.jobs import job_from_line
from attnviz.cli import app
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


def test_relative_container_paths_resolve_against_the_jobs_folder(tmp_path, monkeypatch):
    """`a.npz`, `a.npz:q` and a bundle `acts.npz` in a jobs file mean files in the jobs file's folder,
    wherever batch is started from (they once became the folder itself: "is a directory")."""
    jobs_dir = tmp_path / "jobs"
    jobs_dir.mkdir()
    arrays = {n: np.load(SAMPLES / f"{n}.npy") for n in "qkv"}
    np.savez(jobs_dir / "acts.npz", **arrays)
    np.savez(jobs_dir / "q_only.npz", arrays["q"])
    (jobs_dir / "sub").mkdir()
    np.save(jobs_dir / "sub" / "k.npy", arrays["k"])
    np.save(jobs_dir / "sub" / "v.npy", arrays["v"])
    jobs = [{"command": "scaled", "args": ["acts.npz"], "options": {"json": "bundle.json"}},
            {"command": "scaled", "args": ["acts.npz:q", "acts.npz:k", "acts.npz:v"], "options": {"json": "keys.json"}},
            {"command": "scaled", "args": ["q_only.npz", "sub/k.npy", "sub/v.npy"], "options": {"json": "one.json"}}]
    path = write_jobs(jobs_dir, jobs)
    monkeypatch.chdir(tmp_path)  # somewhere else
    r = runner.invoke(app, ["batch", path, "--quiet"])
    assert r.exit_code == 0, r.stdout + r.stderr
    expected = np.array([[0, 0, .5, .5], [0, 1, 0, 0], [.5, .5, 0, 0]])
    for name in ("bundle", "keys", "one"):
        doc = json.loads((jobs_dir / f"{name}.json").read_text())
        np.testing.assert_allclose(doc["weights"], expected, atol=1e-6)


def test_the_readme_batch_example_runs(tmp_path, monkeypatch):
    """The jobs file and the command of the batch page (docs/commands/batch.md), run as written."""
    from tests.conftest import ROOT

    section = (ROOT / "docs" / "commands" / "batch.md").read_text()
    job_lines = [ln.strip() for ln in section.splitlines() if ln.strip().startswith('{"command"')]
    command = next(ln.strip() for ln in section.splitlines() if ln.strip().startswith("attnviz batch "))
    assert len(job_lines) >= 2
    for name in "qkv":
        np.save(tmp_path / f"{name}.npy", np.load(SAMPLES / f"{name}.npy"))
    weights = np.array([[0, 0, .5, .5], [0, 1, 0, 0], [.5, .5, 0, 0]], np.float32)
    np.savez(tmp_path / "attn.npz", weights[None, None], weights[None, None])  # two layers
    (tmp_path / "jobs.jsonl").write_text("\n".join(job_lines) + "\n")
    monkeypatch.chdir(tmp_path)
    argv = command.split(">")[0].split()[1:]
    r = runner.invoke(app, argv)
    assert r.exit_code == 0, r.stdout + r.stderr
    summary = json.loads(r.stdout)
    assert summary["failed"] == 0 and summary["run"] == len(job_lines)
    for produced in ("a.png", "a.json"):
        assert (tmp_path / produced).stat().st_size > 0


def test_results_lines_of_a_jobs_file(folder):
    """--results with a jobs file: the line number, paths as they ran (resolved against the jobs file's
    folder), the files written, and the summary of a computed variant's document; --resume skips it."""
    jobs = write_jobs(folder, [
        {"command": "dot", "args": QKV, "options": {"json": "d.json", "save_weights": "w.npy"}},
        "# a comment",
        {"command": "dot", "args": ["missing.npy", "k.npy", "v.npy"]},
    ])
    results = folder / "r.jsonl"
    r = runner.invoke(app, ["batch", jobs, "--results", str(results), "--quiet"])
    assert r.exit_code == 1
    ok, bad = (json.loads(line) for line in results.read_text().splitlines())
    assert (ok["index"], ok["line"], ok["command"], ok["exit_code"]) == (0, 1, "dot", 0)
    assert ok["args"] == [str(folder / a) for a in QKV] + ["--json-file", str(folder / "d.json"), "--save-weights",
                                                           str(folder / "w.npy"), "--quiet"]
    assert ok["outputs"] == [{"option": "--json-file", "path": str(folder / "d.json"),
                              "bytes": (folder / "d.json").stat().st_size},
                             {"option": "--save-weights", "path": str(folder / "w.npy"),
                              "bytes": (folder / "w.npy").stat().st_size}]
    doc = json.loads((folder / "d.json").read_text())
    assert ok["summary"] == {"variant": "dot", "device": doc["device"], "dtype": "float32", "weights_shape": [3, 4],
                             "output_shape": [3, 2], "warnings": 0}
    assert (bad["index"], bad["line"], bad["exit_code"], bad["outputs"], bad["summary"]) == (1, 3, 2, [], None)
    assert "missing.npy: no such file" in bad["error"]
    r = runner.invoke(app, ["batch", jobs, "--results", str(results), "--resume", "--json", "-q"])
    summary = json.loads(r.stdout)
    assert (summary["run"], summary["resumed"], summary["failed"]) == (1, 1, 1)  # the failed job runs again


def test_received_png_and_repeat_test_files_resolve_against_the_jobs_folder(tmp_path, monkeypatch):
    """Every file a job writes is named relative to the jobs file's folder: --received-png and
    repeat-test's --save-ids/--save-labels too (they once went to the current folder)."""
    jobs_dir = tmp_path / "jobs"
    (jobs_dir / "out").mkdir(parents=True)
    w = np.full((1, 1, 2, 3, 3), 1 / 3)
    np.save(jobs_dir / "w.npy", w)
    path = write_jobs(jobs_dir, [
        {"command": "inspect", "args": ["w.npy"], "options": {"received_png": "out/r.png"}},
        {"command": "repeat-test", "args": ["4"], "options": {"vocab_size": 10, "seed": 1,
                                                              "save_ids": "out/ids.npy", "save_labels": "out/p.txt"}}])
    monkeypatch.chdir(tmp_path)  # somewhere else, with no out/ folder
    r = runner.invoke(app, ["batch", path, "--quiet"])
    assert r.exit_code == 0, r.stdout + r.stderr
    assert (jobs_dir / "out" / "r.png").read_bytes().startswith(b"\x89PNG")
    ids = np.load(jobs_dir / "out" / "ids.npy")
    assert ids.shape == (1, 8) and (ids[0, :4] == ids[0, 4:]).all()
    assert (jobs_dir / "out" / "p.txt").read_text().split() == [str(i) for i in ids[0]]

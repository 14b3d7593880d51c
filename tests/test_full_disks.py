"""Outputs on a full file system and on a read-only one (issue 24, "Full disks"): a small tmpfs, filled to the
last byte, holds the outputs. Every output kind fails with one line naming the file, exit 1; no output of that
run is left anywhere (also those bound for another file system); the inputs are untouched; in a batch only
the job fails. Needs root to mount (skipped otherwise)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from attnviz.cli import app


def _mount(target: Path, options: str) -> bool:
    if os.geteuid() != 0:
        return False
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(target)], capture_output=True)
    return r.returncode == 0


@pytest.fixture
def disks(tmp_path):
    """(the working folder on the normal disk, a full tmpfs, a read-only tmpfs)"""
    full, readonly = tmp_path / "full", tmp_path / "readonly"
    full.mkdir()
    readonly.mkdir()
    if not _mount(full, "size=64k"):
        pytest.skip("cannot mount a tmpfs here (needs root)")
    try:
        fd = os.open(full / ".filler", os.O_WRONLY | os.O_CREAT)  # fill it: every write from now on fails (ENOSPC)
        try:
            while os.write(fd, b"\0" * 4096):
                pass
        except OSError:
            pass
        finally:
            os.close(fd)
        assert _mount(readonly, "size=64k,ro")
        w = np.random.default_rng(0).random((2, 4, 24, 24)).astype(np.float32)
        np.save(tmp_path / "w.npy", w / w.sum(-1, keepdims=True))
        yield tmp_path, full, readonly
    finally:
        for m in (full, readonly):
            subprocess.run(["umount", str(m)], capture_output=True)


def listing(*folders: Path) -> dict[str, tuple]:
    files = [p for f in folders for p in sorted(f.rglob("*")) if p.is_file()]
    return {str(p): (p.stat().st_size, p.stat().st_mtime_ns) for p in files}


@pytest.mark.parametrize("option, name", [("--png", "a.png"), ("--json-file", "d.json"), ("--html", "r.html"),
                                          ("--map-png", "m.png"), ("--stats-png", "s.png")])
@pytest.mark.parametrize("where", ["full", "readonly"])
def test_an_output_that_cannot_be_written_is_one_line_and_leaves_nothing(disks, monkeypatch, option, name, where):
    work, full, readonly = disks
    folder = {"full": full, "readonly": readonly}[where]
    monkeypatch.chdir(work)
    before = listing(work)
    # another output of the same run, on the normal disk, must not be left behind either
    other = ("--json-file", "ok.json") if option != "--json-file" else ("--png", "ok.png")
    result = CliRunner().invoke(app, ["inspect", "w.npy", option, str(folder / name), *other, "--quiet"])
    assert result.exit_code == 1, result.output
    lines = result.stderr.strip("\n").split("\n")
    reason = "No space left on device" if where == "full" else "Read-only file system"
    assert len(lines) == 1 and lines[0].startswith("attnviz: error: ") and str(folder / name) in lines[0], lines
    assert reason in lines[0], lines
    assert listing(work) == before  # nothing new on either disk (the filler is all the full one holds)


def test_in_a_batch_only_the_job_whose_output_cannot_be_written_fails(disks, monkeypatch):
    work, full, _ = disks
    monkeypatch.chdir(work)
    jobs = [{"command": "inspect", "args": ["w.npy"], "options": {"json-file": f"ok{i}.json"}} for i in range(2)]
    jobs.insert(1, {"command": "inspect", "args": ["w.npy"], "options": {"json-file": str(full / "no.json")}})
    Path("jobs.jsonl").write_text("".join(json.dumps(j) + "\n" for j in jobs))
    result = CliRunner().invoke(app, ["batch", "jobs.jsonl", "--results", "results.jsonl", "--quiet"])
    assert result.exit_code == 1, result.output
    records = [json.loads(line) for line in Path("results.jsonl").read_text().splitlines()]
    assert [r["exit_code"] for r in records] == [0, 1, 0]
    assert "No space left on device" in records[1]["error"] and str(full / "no.json") in records[1]["error"]
    assert sorted(p.name for p in work.glob("ok*.json")) == ["ok0.json", "ok1.json"]
    assert sorted(p.name for p in full.iterdir()) == [".filler"]


def test_a_results_manifest_on_a_full_disk_is_one_line(disks, monkeypatch):
    work, full, _ = disks
    monkeypatch.chdir(work)
    Path("jobs.jsonl").write_text(json.dumps({"command": "inspect", "args": ["w.npy"]}) + "\n")
    result = CliRunner().invoke(app, ["batch", "jobs.jsonl", "--results", str(full / "results.jsonl"), "--quiet"])
    assert result.exit_code == 1, result.output
    lines = result.stderr.strip("\n").split("\n")
    assert len(lines) == 1 and "results.jsonl" in lines[0] and "No space left on device" in lines[0], lines

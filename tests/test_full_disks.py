"""Outputs on a full file system and on a read-only one (issue 24, "Full disks"): a small tmpfs, filled to the
last byte, holds the outputs. Every output kind fails with one line naming the file, exit 1; no output of that
run is left anywhere (also those bound for another file system); the inputs are untouched; in a batch only
the job fails. Needs root to mount (skipped otherwise)."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
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


def _fill(folder: Path, leave: int = 0) -> None:
    """Fill the file system of ``folder`` to the last byte, then free ``leave`` bytes (whole pages)."""
    fd = os.open(folder / ".filler", os.O_WRONLY | os.O_CREAT)
    try:
        while os.write(fd, b"\0" * 4096):
            pass
    except OSError:
        pass
    finally:
        os.close(fd)
    if leave:
        os.truncate(folder / ".filler", os.path.getsize(folder / ".filler") - leave)


@pytest.fixture
def disks(tmp_path):
    """(the working folder on the normal disk, a full tmpfs, a read-only tmpfs)"""
    full, readonly = tmp_path / "full", tmp_path / "readonly"
    full.mkdir()
    readonly.mkdir()
    if not _mount(full, "size=64k"):
        pytest.skip("cannot mount a tmpfs here (needs root)")
    try:
        _fill(full)  # every write from now on fails (ENOSPC)
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
                                          ("--map-png", "m.png"), ("--stats-png", "s.png"),
                                          ("--save-maps", "maps.npy")])
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


def _manifest_lines(path: Path) -> list[dict]:
    data = path.read_bytes()
    assert not data or data.endswith(b"\n"), f"a torn last record: {data[-80:]!r}"
    return [json.loads(line) for line in data.splitlines()]


SIXTEEN_JOBS = "".join(json.dumps({"command": "inspect", "args": ["w.npy"], "options": {"heads": str(i % 4),
                                                                                          "top": i + 1}}) + "\n"
                       for i in range(16))


def test_a_manifest_that_fills_its_disk_mid_batch_holds_whole_records(tmp_path, monkeypatch):
    """Issue 34: the manifest on a tmpfs with 4 KiB free, 16 jobs: the batch fails with one line naming it, and
    the manifest holds whole records only (it held 8, then a torn one); --resume then runs the rest."""
    disk = tmp_path / "disk"
    disk.mkdir()
    if not _mount(disk, "size=64k"):
        pytest.skip("cannot mount a tmpfs here (needs root)")
    try:
        _fill(disk, leave=4096)
        w = np.random.default_rng(0).random((2, 4, 24, 24)).astype(np.float32)
        np.save(tmp_path / "w.npy", w / w.sum(-1, keepdims=True))
        (tmp_path / "jobs.jsonl").write_text(SIXTEEN_JOBS)
        monkeypatch.chdir(tmp_path)
        manifest = disk / "results.jsonl"
        result = CliRunner().invoke(app, ["batch", "jobs.jsonl", "--results", str(manifest), "--quiet"])
        one_line_naming(result, manifest, "No space left on device")
        done = _manifest_lines(manifest)
        assert 0 < len(done) < 16 and all(r["exit_code"] == 0 for r in done)
        os.unlink(disk / ".filler")  # room again: --resume runs the jobs not recorded
        result = CliRunner().invoke(app, ["batch", "jobs.jsonl", "--results", str(manifest), "--resume", "--json",
                                          "--quiet"])
        assert result.exit_code == 0, result.output
        summary = json.loads(result.stdout)
        assert (summary["resumed"], summary["run"]) == (len(done), 16 - len(done)), summary
        assert len(_manifest_lines(manifest)) == 16
    finally:
        subprocess.run(["umount", str(disk)], capture_output=True)


def test_a_short_write_of_a_record_is_cut_back(tmp_path, monkeypatch):
    """The same without a tmpfs: the record's write falls short and the rest fails with ENOSPC; the manifest
    is cut back to its last line feed and the batch fails with one line."""
    import errno as errnos

    import attnviz.batch.results as results

    w = np.random.default_rng(0).random((2, 4, 8, 8)).astype(np.float32)
    np.save(tmp_path / "w.npy", w / w.sum(-1, keepdims=True))
    (tmp_path / "jobs.jsonl").write_text(SIXTEEN_JOBS)
    monkeypatch.chdir(tmp_path)
    room = {"left": 1500}

    class FillingOs:
        def __getattr__(self, name):
            return getattr(os, name)

        def write(self, fd, data):
            if room["left"] <= 0:
                raise OSError(errnos.ENOSPC, os.strerror(errnos.ENOSPC))
            n = os.write(fd, bytes(data[: room["left"]]))
            room["left"] -= n
            return n

    monkeypatch.setattr(results, "os", FillingOs())
    result = CliRunner().invoke(app, ["batch", "jobs.jsonl", "--results", "results.jsonl", "--quiet"])
    one_line_naming(result, Path("results.jsonl"), "No space left on device")
    done = _manifest_lines(tmp_path / "results.jsonl")
    assert 0 < len(done) < 16


def test_resume_drops_a_torn_last_line_and_says_so(tmp_path, monkeypatch):
    """A manifest that ends in a partial line (a run killed, or a disk filled, while writing it): --resume
    drops that line with a warning (also with --quiet) and runs its job again, the other records kept."""
    w = np.random.default_rng(0).random((2, 4, 8, 8)).astype(np.float32)
    np.save(tmp_path / "w.npy", w / w.sum(-1, keepdims=True))
    (tmp_path / "jobs.jsonl").write_text(SIXTEEN_JOBS[: SIXTEEN_JOBS.index("\n", 200) + 1])  # 3 jobs
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, ["batch", "jobs.jsonl", "--results", "results.jsonl", "--quiet"])
    assert result.exit_code == 0, result.output
    whole = Path("results.jsonl").read_bytes()
    Path("results.jsonl").write_bytes(whole[: whole.rindex(b"\n", 0, len(whole) - 1) + 1] + whole.splitlines()[-1][:37])
    for quiet in (["--quiet"], []):
        result = CliRunner().invoke(app, ["batch", "jobs.jsonl", "--results", "results.jsonl", "--resume", "--json",
                                          *quiet])
        assert result.exit_code == 0, result.output
        warning = [line for line in result.stderr.splitlines() if "cut short" in line]
        if quiet:
            assert len(warning) == 1 and "results.jsonl" in warning[0] and "dropped" in warning[0], result.stderr
            summary = json.loads(result.stdout)
            assert (summary["resumed"], summary["run"]) == (2, 1), summary
        else:
            assert not warning and json.loads(result.stdout)["resumed"] == 3  # whole again
        assert len(_manifest_lines(tmp_path / "results.jsonl")) == 3


# ----------------------------------------------------------------------------------------------
# Every output of the computing commands, compare and rollout; EFBIG (RLIMIT_FSIZE) in a real process; EDQUOT;
# outputs through a symbolic link to a folder and on another file system than the working folder

COMPUTE_OUTPUTS = [("--png", "a.png"), ("--png", "a.svg"), ("--png", "a.pdf"), ("--json-file", "d.json"),
                   ("--html", "r.html"), ("--save-weights", "w.npy"), ("--save-output", "o.npy"),
                   ("--save-params", "p.npz")]


def one_line_naming(result, path: Path, reason: str) -> None:
    assert result.exit_code == 1, result.output
    lines = result.stderr.strip("\n").split("\n")
    assert len(lines) == 1 and lines[0].startswith("attnviz: error: ") and str(path) in lines[0], lines
    assert reason in lines[0], lines


@pytest.fixture
def qkv(disks):
    work = disks[0]
    rng = np.random.default_rng(1)
    for name, shape in (("q", (2, 5, 4)), ("k", (2, 6, 4)), ("v", (2, 6, 3))):
        np.save(work / f"{name}.npy", rng.normal(size=shape).astype(np.float32))
    return disks


@pytest.mark.parametrize("where", ["full", "readonly"])
def test_every_output_of_a_computing_command(qkv, monkeypatch, where):
    """`general` (it has every output a computing command has, --save-params too): each output on the full or
    read-only disk, beside another output on the normal disk, in turn; then all of them at once."""
    work, full, readonly = qkv
    folder = {"full": full, "readonly": readonly}[where]
    reason = "No space left on device" if where == "full" else "Read-only file system"
    monkeypatch.chdir(work)
    (work / "old.json").write_text("{}\n")  # a target that exists: left as it was
    before = listing(work, full, readonly)
    runner = CliRunner()
    for option, name in COMPUTE_OUTPUTS:
        other = ("--json-file", "old.json") if option != "--json-file" else ("--save-weights", "ok.npy")
        result = runner.invoke(app, ["general", "q.npy", "k.npy", "v.npy", option, str(folder / name), *other,
                                     "--seed", "0", "--quiet"])
        one_line_naming(result, folder / name, reason)
        assert listing(work, full, readonly) == before, option
    rest = [a for option, name in COMPUTE_OUTPUTS if option != "--png" for a in (option, name)]
    result = runner.invoke(app, ["general", "q.npy", "k.npy", "v.npy", "--png", str(folder / "b.png"), *rest,
                                 "--seed", "0", "--quiet"])  # the picture alone cannot be written: nothing is
    one_line_naming(result, folder / "b.png", reason)
    assert listing(work, full, readonly) == before
    result = runner.invoke(app, ["general", "q.npy", "k.npy", "v.npy", "--png", "a.png", *rest, "--seed", "0",
                                 "--quiet"])
    assert result.exit_code == 0, result.output  # the same outputs on the normal disk: all written
    assert {p.name for p in work.iterdir()} >= {"a.png", *rest[1::2]}


@pytest.mark.parametrize("where", ["full", "readonly"])
def test_every_output_of_compare_and_rollout(disks, monkeypatch, where):
    work, full, readonly = disks
    folder = {"full": full, "readonly": readonly}[where]
    reason = "No space left on device" if where == "full" else "Read-only file system"
    monkeypatch.chdir(work)
    w = np.load(work / "w.npy")
    np.save(work / "w2.npy", np.flip(w, axis=-1).copy())
    np.save(work / "layers.npy", np.stack([w[:1], w[1:]]))  # [layers, batch, heads, L, L]
    before = listing(work, full, readonly)
    runner = CliRunner()
    for command in (["compare", "w.npy", "w2.npy"], ["rollout", "layers.npy"]):
        for option, name in (("--png", "a.png"), ("--json-file", "d.json"), ("--html", "r.html")):
            other = ("--json-file", "ok.json") if option != "--json-file" else ("--png", "ok.png")
            result = runner.invoke(app, [*command, option, str(folder / name), *other, "--quiet"])
            one_line_naming(result, folder / name, reason)
            assert listing(work, full, readonly) == before, (command, option)


def test_a_file_too_large_for_rlimit_fsize_in_a_real_process(tmp_path):
    """RLIMIT_FSIZE (a scheduler's file-size limit): writing past it fails with EFBIG (Python ignores
    SIGXFSZ), in a real process: one line naming the file, exit 1, neither output left."""
    w = np.random.default_rng(0).random((2, 4, 64, 64)).astype(np.float32)
    np.save(tmp_path / "w.npy", w / w.sum(-1, keepdims=True))
    limit = 8192  # the input is read, not written: only outputs meet the limit
    before = listing(tmp_path)

    def limited() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    r = subprocess.run([sys.executable, "-m", "attnviz", "inspect", "w.npy", "--json-file", "d.json", "--png",
                        "a.png", "--quiet"], cwd=tmp_path, capture_output=True, timeout=300, preexec_fn=limited,
                       env={**os.environ, "ATTNVIZ_NO_SERVER": "1"})
    lines = r.stderr.decode().strip("\n").split("\n")
    assert r.returncode == 1 and len(lines) == 1, r.stderr
    assert lines[0].startswith("attnviz: error: ") and "a.png" in lines[0] and "File too large" in lines[0], lines
    assert listing(tmp_path) == before


def test_a_quota_exceeded_is_one_line(tmp_path, monkeypatch):
    """EDQUOT (no quota-enabled file system here: this kernel's tmpfs has no quotas, and root may exceed
    ext4's): the JSON file's write fails as a quota would make it fail, at the file's write."""
    import errno as errnos

    import attnviz.io as aio

    w = np.random.default_rng(0).random((2, 4, 8, 8)).astype(np.float32)
    np.save(tmp_path / "w.npy", w / w.sum(-1, keepdims=True))
    monkeypatch.chdir(tmp_path)

    class Quota:
        def __init__(self, fh):
            self.fh = fh

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.fh.close()

        def write(self, data):
            raise OSError(errnos.EDQUOT, os.strerror(errnos.EDQUOT))

    class QuotaOs:
        def __getattr__(self, name):
            return getattr(os, name)

        def fdopen(self, fd, *args, **kwargs):
            return Quota(os.fdopen(fd, *args, **kwargs))

    monkeypatch.setattr(aio, "os", QuotaOs())
    before = listing(tmp_path)
    result = CliRunner().invoke(app, ["inspect", "w.npy", "--json-file", "d.json", "--quiet"])
    one_line_naming(result, Path("d.json"), "Disk quota exceeded")
    assert listing(tmp_path) == before


def test_outputs_through_a_symlinked_folder_and_on_another_file_system(qkv, monkeypatch):
    """A folder reached through a symbolic link, and a tmpfs that is not the working folder's file system
    (staged files live beside their targets, so the final renames never cross file systems): written."""
    work, _, _ = qkv
    other = work / "other"
    other.mkdir()
    if not _mount(other, "size=4m"):
        pytest.skip("cannot mount a tmpfs here")
    try:
        (work / "real").mkdir()
        (work / "linked").symlink_to(work / "real")
        monkeypatch.chdir(work)
        result = CliRunner().invoke(app, ["inspect", "w.npy", "--png", "linked/a.png", "--json-file",
                                          str(other / "d.json"), "--html", "linked/r.html", "--quiet"])
        assert result.exit_code == 0, result.output
        assert sorted(p.name for p in (work / "real").iterdir()) == ["a.png", "r.html"]
        assert json.loads((other / "d.json").read_text())["command"] == "inspect"
        assert (work / "linked").is_symlink() and sorted(p.name for p in other.iterdir()) == ["d.json"]
        result = CliRunner().invoke(app, ["scaled", "q.npy", "k.npy", "v.npy", "--save-weights",
                                          str(other / "w.npy"), "--png", "linked/s.png", "--quiet"])
        assert result.exit_code == 0, result.output
        assert np.load(other / "w.npy").shape == (2, 5, 6) and (work / "real" / "s.png").stat().st_size > 0
    finally:
        subprocess.run(["umount", str(other)], capture_output=True)

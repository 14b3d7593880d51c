"""Hostile and broken inputs to the loaders (issue 10, items 1, 7 and the loader half of 9).

Sizes are judged from headers before anything is allocated (an .npy header claiming 10^12 elements in
a 200-byte file, an .npz member whose header lies, a zip bomb, a safetensors header claiming a huge
tensor, an HDF5 dataset claiming petabytes: run under ``RLIMIT_AS`` = 2 GB); only regular files are
opened (/dev/zero, a FIFO, a socket, a directory, a symbolic link to /dev/zero: subprocesses with a
timeout, so a hang fails the test); JSON is bounded in size and depth, on stdin too, and binary stdin
names ``-``; a jobs file with bad lines of every kind fails those jobs alone. Every failure: the exit
code, one line naming the file, no traceback, inputs byte-identical, no new files. Then a hypothesis
fuzz over every format, through ``open_spec`` and the command line.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import io
import json
import os
import re
import socket
import struct
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from attnviz import sizes
from attnviz.cli import app
from attnviz.errors import AttnvizError, InputError, UsageError
from attnviz.io import StdinReader, load_labels, open_spec
from tests.conftest import ROOT, LazyModule
from tests.hostile_files import lying_npy, npy_bytes

h5py = pytest.importorskip("h5py")
safetensors_numpy = pytest.importorskip("safetensors.numpy")

runner = CliRunner()
A = np.random.default_rng(3).random((2, 3, 4)).astype(np.float32)
QKV = {"q": A[0], "k": A[1], "v": A[1] * 2}
GB = 2**30
TORCH = importlib.util.find_spec("torch") is not None  # torch is a test dependency
torch = LazyModule("torch")  # imported by the tests that use it, not while every worker collects


def _limit_memory() -> None:  # in the child: at most 2 GB of address space
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (2 * GB, 2 * GB))


def run(argv, cwd, *, stdin=None, limit_memory=True, timeout=60):
    """``attnviz ARGV`` in a fresh interpreter (a hang is a failure, not a stuck suite)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"}
    env.pop("ATTNVIZ_DEBUG", None)
    return subprocess.run([sys.executable, "-m", "attnviz", *map(str, argv)], cwd=cwd, input=stdin,
                          capture_output=True, timeout=timeout, env=env,
                          preexec_fn=_limit_memory if limit_memory else None)


def snapshot(folder: Path) -> dict[str, str]:
    """Every entry of a folder: a hash for regular files, the kind for the rest."""
    out = {}
    for p in sorted(folder.iterdir()):
        if p.is_symlink() or not p.is_file():
            out[p.name] = "special"
        else:
            out[p.name] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def one_clear_line(stderr: str, code: int, expected_code: int, words) -> None:
    assert code == expected_code, (code, stderr)
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, stderr
    assert lines[0].startswith("attnviz: error: "), stderr
    assert "Traceback" not in stderr and "internal error" not in stderr
    for word in words:
        assert word in stderr, (word, stderr)


# ---------------------------------------------------------------------------------------------------
# Builders


def lying_npz(path: Path, compression: int) -> None:
    """An .npz whose member header claims [9999999, 3] over the 24 bytes of a [2, 3] array."""
    with zipfile.ZipFile(path, "w", compression) as z:
        z.writestr("attn.npy", lying_npy("(9999999, 3)", np.zeros(6, np.float32).tobytes()))


def bomb_npz(path: Path) -> None:
    """A deflated member whose zip directory claims 4 GiB from ~70 bytes of compressed data."""
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("attn.npy", npy_bytes(A))
    data = bytearray(path.read_bytes())
    struct.pack_into("<I", data, data.rfind(b"PK\x01\x02") + 24, 0xFFFFFFF0)
    struct.pack_into("<I", data, data.find(b"PK\x03\x04") + 22, 0xFFFFFFF0)
    path.write_bytes(bytes(data))


def safetensors_bytes(header: dict, data: bytes = b"\0" * 16) -> bytes:
    text = json.dumps(header).encode()
    return struct.pack("<Q", len(text)) + text + data


def huge_h5(path: Path) -> None:
    """Datasets claiming petabytes in a file of a few kilobytes: nothing written, chunked or contiguous."""
    with h5py.File(path, "w") as f:
        f.create_dataset("attn", shape=(2**20, 2**20, 1024), dtype="f4", chunks=(1, 16, 1024))
        f.create_dataset("flat", shape=(2**30, 2**20), dtype="f4")


# ---------------------------------------------------------------------------------------------------
# Special files and hostile headers, each in a fresh interpreter with a timeout and 2 GB of address space


#: name, how to make it, argv (FILE is the path), exit code, words in the message, and whether it runs in a
#: fresh interpreter (under 2 GB of address space, with a timeout: what could hang or allocate) or in process
SPECIAL = [
    ("big.npy", lambda p: p.write_bytes(lying_npy("(1000000, 1000000)")), ["inspect", "FILE"], 1,
     ["big.npy", "claims a float32 array of shape [1000000, 1000000]", "holds only 72 B"], True),
    ("big.npy", lambda p: p.write_bytes(lying_npy("(1000000, 1000000)")), ["scaled", "FILE", "FILE", "FILE"], 1,
     ["big.npy", "cut short"], False),
    ("lie.npz", lambda p: lying_npz(p, zipfile.ZIP_STORED), ["inspect", "FILE"], 1,
     ["lie.npz:attn", "[9999999, 3]", "archive entry holds only 24 B"], False),
    ("lie.npz", lambda p: lying_npz(p, zipfile.ZIP_DEFLATED), ["inspect", "FILE"], 1,
     ["lie.npz:attn", "[9999999, 3]"], True),
    ("bomb.npz", bomb_npz, ["inspect", "FILE"], 1, ["bomb.npz", "zip bomb"], True),
    ("huge.safetensors",
     lambda p: p.write_bytes(safetensors_bytes({"attn": {"dtype": "F32", "shape": [10**6, 10**6],
                                                         "data_offsets": [0, 4 * 10**12]}})),
     ["inspect", "FILE"], 1, ["huge.safetensors", "not a readable .safetensors file", "data offsets"], True),
    ("header.safetensors", lambda p: p.write_bytes(struct.pack("<Q", 2**62) + b"{}"), ["inspect", "FILE"], 1,
     ["header.safetensors", "the header claims 4611686018427387904 bytes"], False),
    ("huge.h5", huge_h5, ["inspect", "FILE:attn"], 1, ["huge.h5:attn", "4.0 PiB", "more than the"], True),
    ("huge.h5", huge_h5, ["inspect", "FILE:flat"], 1, ["huge.h5:flat", "4.0 PiB"], False),
    ("fifo.npy", lambda p: os.mkfifo(p), ["inspect", "FILE"], 2, ["fifo.npy", "named pipe (FIFO)", "'-'"], True),
    ("fifo.safetensors", lambda p: os.mkfifo(p), ["scaled", "FILE", "FILE", "FILE"], 2,
     ["fifo.safetensors", "named pipe", "memory-mapped", "standard input"], True),  # text from a pipe: test_pipes.py
    ("zero.npy", lambda p: p.symlink_to("/dev/zero"), ["inspect", "FILE"], 2,
     ["zero.npy", "symbolic link to /dev/zero", "character device"], True),
    ("zero.json", lambda p: p.symlink_to("/dev/zero"), ["inspect", "FILE"], 2, ["zero.json", "/dev/zero"], True),
    ("dir.npy", lambda p: p.mkdir(), ["inspect", "FILE"], 2, ["dir.npy", "is a directory"], False),
    ("dirlink.npz", lambda p: p.symlink_to(p.parent / "sub", target_is_directory=True) or (p.parent / "sub").mkdir(),
     ["inspect", "FILE"], 2, ["dirlink.npz", "is a directory"], False),
    ("sock.npy", lambda p: socket.socket(socket.AF_UNIX).bind(str(p)), ["inspect", "FILE"], 2,
     ["sock.npy", "socket"], True),
    ("dangling.npy", lambda p: p.symlink_to(p.parent / "nowhere.npy"), ["inspect", "FILE"], 2,
     ["dangling.npy", "does not exist"], False),
]


@pytest.mark.parametrize("name, build, argv, code, words, fresh", SPECIAL,
                         ids=[f"{s[0]}-{s[2][0]}-{i}" for i, s in enumerate(SPECIAL)])
def test_hostile_files_fail_from_the_header_or_the_kind_of_file(tmp_path, name, build, argv, code, words, fresh):
    path = tmp_path / name
    build(path)
    before = snapshot(tmp_path)
    if fresh:
        r = run([a.replace("FILE", name) for a in argv], tmp_path)
        one_clear_line(r.stderr.decode(), r.returncode, code, words)
    else:
        r = runner.invoke(app, [a.replace("FILE", str(path)) for a in argv])
        one_clear_line(r.stderr, r.exit_code, code, words)
    assert snapshot(tmp_path) == before


def test_devices_named_directly_and_as_params_and_masks(tmp_path):
    for name, arr in QKV.items():
        np.save(tmp_path / f"{name}.npy", arr)
    os.mkfifo(tmp_path / "p.npz")
    before = snapshot(tmp_path)
    r = run(["inspect", "/dev/zero"], tmp_path)
    one_clear_line(r.stderr.decode(), r.returncode, 2, ["/dev/zero", "character device"])
    r = run(["scaled", "q.npy", "k.npy", "v.npy", "--mask", "/dev/zero"], tmp_path)
    one_clear_line(r.stderr.decode(), r.returncode, 2, ["/dev/zero", "character device"])
    r = run(["multihead", "q.npy", "k.npy", "v.npy", "--heads", "1", "--key-dim", "2", "--params", "p.npz"],
            tmp_path)
    one_clear_line(r.stderr.decode(), r.returncode, 2, ["--params p.npz", "named pipe"])
    assert snapshot(tmp_path) == before


# ---------------------------------------------------------------------------------------------------
# Standard input: bounded, UTF-8, JSON of bounded depth


def test_stdin_binary_huge_and_deep(tmp_path):
    cases = [
        (bytes(range(256)) * 4, ["'-' (<stdin>)", "binary data"]),
        (b"\xff\xfe[[1, 2]]", ["'-' (<stdin>)", "not UTF-8"]),
        (b"[" * 100000 + b"]" * 100000, ["<stdin>", "nested 100000 levels deep", "at most 64"]),
        (b"[" + b"1.5, " * (17 * 2**20) + b"1]", ["'-' (<stdin>)", "more than 64.0 MiB"]),  # 85 MiB
    ]
    for data, words in cases:
        r = run(["inspect", "-"], tmp_path, stdin=data)
        one_clear_line(r.stderr.decode(), r.returncode, 1, words)
    r = run(["batch", "-"], tmp_path, stdin=b"\0\1\2" * 100)
    one_clear_line(r.stderr.decode(), r.returncode, 1, ["'-' (<stdin>)", "binary data"])
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with open("/dev/zero", "rb") as zero:  # an endless stream: refused at its first NUL, not read for ever
        r = subprocess.run([sys.executable, "-m", "attnviz", "inspect", "-"], cwd=tmp_path, stdin=zero,
                           capture_output=True, timeout=60, env=env, preexec_fn=_limit_memory)
    one_clear_line(r.stderr.decode(), r.returncode, 1, ["'-' (<stdin>)", "binary data"])
    assert list(tmp_path.iterdir()) == []


def test_stdin_in_process():
    for data, words in [(b"\x80\x81", "not UTF-8"), (b"\0[1]", "binary data"), (b"[" * 5000, "nested 5000")]:
        with pytest.raises(InputError, match=words) as exc:
            open_spec("-", StdinReader(io.TextIOWrapper(io.BytesIO(data))))
        assert "<stdin>" in exc.value.message
    r = runner.invoke(app, ["inspect", "-"], input=b"\x00\x01binary")
    assert r.exit_code == 1 and "'-' (<stdin>)" in r.stderr and "Traceback" not in r.stderr


# ---------------------------------------------------------------------------------------------------
# JSON files, label files, keys, in process


@pytest.mark.parametrize("text, words", [
    ("[" * 100000 + "]" * 100000, "nested 100000 levels deep"),
    ('{"data": ' + "[" * 70 + "1" + "]" * 70 + "}", "nested 71 levels deep"),
    ("[" + "9" * 5000 + "]", "not valid JSON"),
    ('["\\"]]]]]]", ' + "[" * 80 + "]" * 80 + "]", "nested 81 levels deep"),  # brackets in strings do not count
])
def test_json_files_bounded_in_depth(tmp_path, text, words):
    path = tmp_path / "deep.json"
    path.write_text(text)
    with pytest.raises(InputError, match=words) as exc:
        open_spec(str(path)).array()
    assert str(path) in exc.value.message
    r = runner.invoke(app, ["inspect", str(path)])
    one_clear_line(r.stderr, r.exit_code, 1, [str(path)])


def test_json_files_bounded_in_size_and_decoding(tmp_path):
    big = tmp_path / "big.json"
    with open(big, "wb") as fh:
        fh.truncate(100 * 2**20)  # sparse: refused from its size, never read
    with pytest.raises(InputError, match=r"100.0 MiB of JSON, more than the 64.0 MiB"):
        open_spec(str(big))
    (tmp_path / "latin.json").write_bytes(b'{"data": [[1]], "labels": ["caf\xe9"]}')
    with pytest.raises(InputError, match=r"latin.json: not UTF-8 text \(byte 0xe9 at offset 31\)"):
        open_spec(str(tmp_path / "latin.json"))
    (tmp_path / "bin.json").write_bytes(npy_bytes(A))
    with pytest.raises(InputError, match="bin.json: holds binary data"):
        open_spec(str(tmp_path / "bin.json"))
    (tmp_path / "bom.json").write_bytes(b"\xef\xbb\xbf[[1, 2]]")
    assert open_spec(str(tmp_path / "bom.json")).array().data.tolist() == [[1, 2]]
    (tmp_path / "labels.txt").write_bytes(b"a\nb\xff\n")
    with pytest.raises(InputError, match="labels.txt: not UTF-8"):
        load_labels(str(tmp_path / "labels.txt"))
    assert load_labels("[" * 3000)[0] == ["[" * 3000]  # not JSON: a comma-separated list of one label
    with pytest.raises(UsageError, match="/dev/zero: is a character device"):
        load_labels("/dev/zero")


def test_thousands_of_keys_are_listed_capped(tmp_path):
    keys = {f"entry{i}": [[1.0]] for i in range(5000)}
    (tmp_path / "many.json").write_text(json.dumps(keys))
    with pytest.raises(InputError) as exc:
        open_spec(str(tmp_path / "many.json")).array()
    assert "entry19" in exc.value.message and "entry20," not in exc.value.message
    assert "and 4980 more" in exc.value.message and len(exc.value.message) < 600
    np.savez(tmp_path / "many.npz", **{f"k{i}" + "x" * 300: np.ones(1) for i in range(3000)})
    for spec in (f"{tmp_path / 'many.npz'}", f"{tmp_path / 'many.npz'}:nope", f"{tmp_path / 'many.npz'}:zz*"):
        with pytest.raises(InputError) as exc:
            open_spec(spec).array()
        assert "and 2980 more" in exc.value.message and len(exc.value.message) < 2500, exc.value.message


def test_nul_bytes_and_odd_paths_are_usage_errors(tmp_path):
    with pytest.raises(UsageError, match="NUL byte"):
        open_spec(f"{tmp_path}/a\0.npy")
    with pytest.raises(UsageError, match="no such file"):
        open_spec(str(tmp_path / "missing.npz"))


# ---------------------------------------------------------------------------------------------------
# Formats: sizes from headers, memory-mapping, the memory limit


def test_npz_members_stored_uncompressed_are_memory_mapped(tmp_path):
    big = np.arange(600_000, dtype=np.float32).reshape(600, 1000)
    np.savez(tmp_path / "s.npz", attn=big, small=A)
    np.savez_compressed(tmp_path / "c.npz", attn=big)
    stored = open_spec(f"{tmp_path / 's.npz'}:attn").array().data
    assert isinstance(stored, np.memmap) and np.array_equal(stored, big)
    assert np.array_equal(open_spec(f"{tmp_path / 's.npz'}:small").array().data, A)
    compressed = open_spec(str(tmp_path / "c.npz")).array().data
    assert not isinstance(compressed, np.memmap) and np.array_equal(compressed, big)
    np.savez(tmp_path / "f.npz", attn=np.asfortranarray(big))
    assert np.array_equal(open_spec(str(tmp_path / "f.npz")).array().data, big)


def test_memory_limit_refuses_what_must_be_held_in_memory(tmp_path, monkeypatch):
    big = np.zeros((1024, 1024), np.float32)  # 4 MiB
    np.savez_compressed(tmp_path / "c.npz", attn=big)
    np.savez(tmp_path / "s.npz", attn=big)
    with h5py.File(tmp_path / "c.h5", "w") as f:
        f.create_dataset("attn", data=big, chunks=(64, 64), compression="gzip")
    safetensors_numpy.save_file({"attn": big.astype(np.float16)}, str(tmp_path / "h.safetensors"))
    assert sizes.memory_limit() >= sizes.MIN_MEMORY_LIMIT
    monkeypatch.setattr(sizes, "memory_limit", lambda: 2**20)
    for spec, words in [(tmp_path / "c.npz", "c.npz:attn: the array of shape [1024, 1024] would take 4.0 MiB"),
                        (f"{tmp_path / 'c.h5'}:attn", "c.h5:attn: the array of shape [1024, 1024] would take"),
                        (tmp_path / "h.safetensors", "as float32 (float16 widened)")]:
        with pytest.raises(InputError, match=re.escape(words)):
            open_spec(str(spec)).array()
    assert isinstance(open_spec(str(tmp_path / "s.npz")).array().data, np.memmap)  # stays on disk: allowed


def test_safetensors_headers_checked_before_the_library(tmp_path):
    good = {"attn": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]}}
    cases = {
        "shape.safetensors": ({"attn": {**good["attn"], "shape": [2, 3]}}, "offsets hold 16 bytes"),
        "negative.safetensors": ({"attn": {**good["attn"], "shape": [-2, -2]}}, "not a list of sizes"),
        "offsets.safetensors": ({"attn": {**good["attn"], "data_offsets": [8, 4]}}, "data offsets"),
    }
    for name, (header, words) in cases.items():
        (tmp_path / name).write_bytes(safetensors_bytes(header))
        with pytest.raises(InputError, match=words) as exc:
            open_spec(str(tmp_path / name))
        assert name in exc.value.message and "not a readable .safetensors file" in exc.value.message
    text = b'{"attn": ' + b"[" * 100000 + b"]" * 100000 + b"}"
    (tmp_path / "nested.safetensors").write_bytes(struct.pack("<Q", len(text)) + text)
    with pytest.raises(InputError, match="nested 100001 levels deep"):
        open_spec(str(tmp_path / "nested.safetensors"))


def test_hdf5_data_outside_the_file_is_refused(tmp_path):
    raw = tmp_path / "raw.bin"
    raw.write_bytes(np.ones(4, np.float32).tobytes())
    with h5py.File(tmp_path / "ext.h5", "w") as f:
        f.create_dataset("attn", shape=(2, 2), dtype="f4", external=[(str(raw), 0, 16)])
    before = snapshot(tmp_path)
    with pytest.raises(InputError, match="ext.h5:attn: the dataset's data is kept in other files"):
        open_spec(f"{tmp_path / 'ext.h5'}:attn").array()
    assert snapshot(tmp_path) == before


@pytest.mark.skipif(not TORCH, reason="torch is not installed")
def test_torch_expanded_views_nesting_and_cycles(tmp_path, monkeypatch):
    torch.save({"attn": torch.ones(1).expand(4096, 4096)}, tmp_path / "view.pt")  # 64 MiB from 4 bytes
    monkeypatch.setattr(sizes, "memory_limit", lambda: 2**20)
    with pytest.raises(InputError, match=r"view.pt:attn: the array of shape \[4096, 4096\] would take 64.0 MiB"):
        open_spec(str(tmp_path / "view.pt")).array()
    nested: dict = {"attn": torch.ones(2, 2)}
    for _ in range(100):
        nested = {"n": nested}
    torch.save(nested, tmp_path / "deep.pt")
    with pytest.raises(InputError, match="nested more than 64 deep"):
        open_spec(str(tmp_path / "deep.pt"))
    with zipfile.ZipFile(tmp_path / "view.pt") as src, zipfile.ZipFile(tmp_path / "packed.pt", "w") as out:
        for info in src.infolist():  # data.pkl compressed, its directory entry claiming 4 GiB
            out.writestr(info.filename, src.read(info), zipfile.ZIP_DEFLATED if info.filename.endswith(".pkl")
                         else zipfile.ZIP_STORED)
    data = bytearray((tmp_path / "packed.pt").read_bytes())
    start = 0
    while (at := data.find(b"PK\x01\x02", start)) >= 0:
        if data[at + 46:at + 46 + struct.unpack_from("<H", data, at + 28)[0]].endswith(b"data.pkl"):
            struct.pack_into("<I", data, at + 24, 0xFFFFFFF0)
        start = at + 4
    (tmp_path / "packed.pt").write_bytes(bytes(data))
    with pytest.raises(InputError, match="packed.pt: not a readable torch.save file .*zip bomb"):
        open_spec(str(tmp_path / "packed.pt"))


# ---------------------------------------------------------------------------------------------------
# Jobs files: a bad line fails that job alone


def test_bad_jobs_lines_fail_alone(tmp_path):
    np.save(tmp_path / "attn.npy", np.full((2, 3, 3), 1 / 3, np.float32))
    good = json.dumps({"command": "inspect", "args": ["attn.npy"], "options": {"no_table": True}}).encode()
    bad = {
        b"{broken": "not valid JSON",
        b'{"command": "inspect", "args": ' + b"[" * 5000 + b"]" * 5000 + b"}": "nested 5001 levels deep",
        b'{"command": "inspect", "args": [' + b"9" * 5000 + b"]}": "not valid JSON",
        b"[1, 2]": "a job is an object",
        b'{"command": 5}': "a job is an object",
        b'{"command": "inspect", "args": "attn.npy"}': '"args" is a list',
        b'{"command": "inspect", "args": [1, 2]}': '"args" is a list',
        b'{"command": "inspect", "args": ["attn\\u0000.npy"]}': '"args" is a list',
        b'{"command": "inspect", "args": ["attn.npy"], "options": [1]}': '"options" is an object',
        b'{"command": "inspect", "args": ["attn.npy"], "options": {"top": {"a": 1}}}': "a JSON object",
        b'{"command": "inspect", "args": ["attn.npy"], "options": {"top": [[1]]}}': "a JSON list",
        b'{"command": "inspect", "args": ["attn.npy"], "options": {"atol": 1e400}}': "not a finite number",
        b'{"command": "inspect", "args": ["attn.npy"], "options": {"atol": NaN}}': "not a finite number",
        b'{"command": "inspect", "args": ["attn.npy"], "options": {"top": 1' + b"0" * 200 + b"}}": "too large",
        b'{"command": "inspect", "args": ["attn.npy"], "options": {"png x": true}}': "is not an option",
        b'{"command": "inspect", "args": ["attn.npy"], "options": {"top": "x\\u0000"}}': "NUL byte",
        b'{"command": "inspect", "args": ["attn.npy"], "extra": 1}': "unknown entries",
        b'{"command": "\\u001b[31mnope\\u0007"}': "unknown command",
        b'{"command": "inspect", "args": ["-"]}': "cannot read standard input",
        b'{"command": "inspect", "args": ["caf\xe9.npy"]}': "not UTF-8 text (byte 0xe9",
        b'{"command": "inspect", "args": ["attn.npy"], "options": {"top": 0}}': "--top",
    }
    lines = [good]
    for line in bad:
        lines += [line, good]
    (tmp_path / "jobs.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    before = snapshot(tmp_path)
    r = runner.invoke(app, ["batch", str(tmp_path / "jobs.jsonl"), "--json"])
    assert r.exit_code == 1, r.stderr
    assert "Traceback" not in r.stderr and "internal error" not in r.stdout + r.stderr
    doc = json.loads(r.stdout)
    by_line = {j["line"]: j for j in doc["jobs"]}
    assert len(by_line) == len(lines) == doc["total"] == doc["run"]
    for number in range(1, len(lines) + 1, 2):
        assert by_line[number]["status"] == "ok", by_line[number]
    for number, words in zip(range(2, len(lines) + 1, 2), bad.values()):
        job = by_line[number]
        assert job["status"] == "failed" and words in job["error"], (number, job)
        if words != "--top":  # the line itself is refused; --top 0 is refused by the command
            assert job["error"].startswith(f"line {number}:") and job["exit_code"] == 2, job
        assert "\x1b" not in job["error"] and len(job["error"]) < 400
    assert doc["failed"] == len(bad)
    assert snapshot(tmp_path) == before
    table = runner.invoke(app, ["batch", str(tmp_path / "jobs.jsonl")])  # the summary table shows ESC inert
    assert table.exit_code == 1 and "\x1b" not in table.stdout and "\x07" not in table.stdout


def test_jobs_files_that_are_not_text_or_not_files(tmp_path):
    (tmp_path / "jobs.bin").write_bytes(npy_bytes(A))
    r = runner.invoke(app, ["batch", str(tmp_path / "jobs.bin")])
    one_clear_line(r.stderr, r.exit_code, 1, ["jobs.bin", "binary data"])
    r = runner.invoke(app, ["batch", str(tmp_path)])
    one_clear_line(r.stderr, r.exit_code, 2, [str(tmp_path), "is a directory"])
    r = runner.invoke(app, ["batch", str(tmp_path / "missing.jsonl")])
    one_clear_line(r.stderr, r.exit_code, 2, ["missing.jsonl: no such jobs file"])
    r = runner.invoke(app, ["batch", "-", "--json"], input=b"\xff\xfe\n")
    assert r.exit_code == 1 and json.loads(r.stdout)["jobs"][0]["error"].startswith("line 1: not UTF-8")


# ---------------------------------------------------------------------------------------------------
# Fuzz: random bytes, truncated and mutated valid files of every format


SEED_NAMES = [".npy", ".json", ".npz", "c.npz", ".safetensors", ".h5", *([".pt"] if TORCH else [])]


@functools.cache
def seeds() -> dict[str, bytes]:
    """A valid file of each format (made when a fuzz test first asks, not while every worker collects: the .pt
    one imports torch)."""
    out: dict[str, bytes] = {".npy": npy_bytes(A), ".json": json.dumps({"data": A[0].tolist(),
                                                                         "labels": ["a", "b", "c"]}).encode()}
    buf = io.BytesIO()
    np.savez(buf, **QKV)
    out[".npz"] = buf.getvalue()
    buf = io.BytesIO()
    np.savez_compressed(buf, attn=A)
    out["c.npz"] = buf.getvalue()
    out[".safetensors"] = safetensors_numpy.save({"attn": A, "half": A.astype(np.float16)})
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "a.h5"
        with h5py.File(path, "w") as f:
            f["attn"] = A
            f.create_dataset("packed/attn", data=A, chunks=(1, 3, 4), compression="gzip")
        out[".h5"] = path.read_bytes()
        if TORCH:
            torch.save({"attn": torch.from_numpy(A), "layers": [torch.ones(2, 2)]}, Path(tmp) / "a.pt")
            out[".pt"] = (Path(tmp) / "a.pt").read_bytes()
    assert sorted(out) == sorted(SEED_NAMES)
    return out


@st.composite
def damaged(draw, seed: bytes) -> bytes:
    kind = draw(st.sampled_from(["random", "truncate", "mutate", "mutate-header", "splice"]))
    if kind == "random":
        return draw(st.binary(max_size=1024))
    if kind == "truncate":
        return seed[:draw(st.integers(0, len(seed) - 1))]
    if kind == "splice":
        at = draw(st.integers(0, len(seed)))
        return seed[:at] + draw(st.binary(min_size=1, max_size=64)) + seed[at + draw(st.integers(0, 64)):]
    span = len(seed) if kind == "mutate" else min(len(seed), 400)
    data = bytearray(seed)
    for at, value in draw(st.lists(st.tuples(st.integers(0, span - 1), st.integers(0, 255)), min_size=1,
                                   max_size=8)):
        data[at] = value
    return bytes(data)


def _suffix(name: str) -> str:
    return name if name.startswith(".") else name[1:]


def _every_array(spec: str) -> None:
    opened = open_spec(spec)
    raw = opened.raw
    keys = getattr(raw, "keys", None)
    if isinstance(keys, list):
        for key in keys[:8]:
            raw.get(key)
    opened.array(allow_nonfinite=True)


@pytest.fixture
def small_memory(monkeypatch):
    """A 64 MiB memory limit: a mutated header that claims a little less than the machine's limit is not
    allocated in the test either."""
    monkeypatch.setattr(sizes, "memory_limit", lambda: 64 * 2**20)


FUZZ = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                        HealthCheck.too_slow])


@pytest.mark.parametrize("name", sorted(SEED_NAMES))
def test_fuzz_loaders(name, small_memory):
    seed = seeds()[name]

    @FUZZ
    @given(data=damaged(seed))
    def check(data):
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / f"x{_suffix(name)}"
            path.write_bytes(data)
            try:
                _every_array(str(path))
            except AttnvizError:
                pass
            assert path.read_bytes() == data
            assert os.listdir(tmp) == [path.name]

    check()


@pytest.mark.parametrize("name", sorted(SEED_NAMES))
def test_fuzz_command_line(name, small_memory):
    seed = seeds()[name]

    @settings(FUZZ, max_examples=30)
    @given(data=damaged(seed), command=st.sampled_from(["scaled", "inspect"]))
    def check(data, command):
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / f"x{_suffix(name)}"
            path.write_bytes(data)
            r = runner.invoke(app, [command, str(path), "--quiet"] if command == "scaled" else
                              [command, str(path), "--no-table"])
            assert r.exit_code in (0, 1, 2, 3), (r.exit_code, r.stderr, r.exception)
            text = r.stdout + r.stderr
            assert "Traceback" not in text and "internal error" not in text, text
            assert r.exit_code == 0 or r.stderr.startswith("attnviz: error: "), r.stderr
            assert path.read_bytes() == data
            assert os.listdir(tmp) == [path.name]

    check()

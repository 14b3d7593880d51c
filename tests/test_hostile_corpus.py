"""A corpus of hostile and broken inputs, each run as a real ``attnviz`` process (issue 10, "Tests").

Every case is a row of ``CASES``: a builder that writes files into a fresh folder, the argv, the
standard input, the exit code and the words the message must hold (the file, key or option to blame).
The cases cover the classes of the issue:

1. sizes from headers, non-regular files, JSON depth and size, files of thousands of keys;
2. option values; 3. usage errors of every kind; 4. numerical overflow naming the input, 6-D and 7-D
   inputs that must succeed; 5. control characters, rich markup, emoji codes, mathtext and 1 MB labels in
   labels and file names (exit 0, nothing raw on the terminal); 6. parameter files that disagree, naming
   the keys; 7. binary standard input, jobs lines that fail alone; 8. all-or-nothing outputs.

Each case runs ``python -m attnviz ARGV`` in its own folder, with its own standard input, a timeout and
at most ~3 GB of address space (a multi-gigabyte allocation fails instead of eating the machine), and
checks: the exit code; for a failure, stderr is one or two lines ``attnviz: error: ...`` holding the
expected words, stdout is empty; never "Traceback" or "internal error"; no control character (C0 but the
line feed, DEL, C1) on stdout or stderr, which must be UTF-8; every file of the folder byte-identical
afterwards, and no new file on failure (on success, exactly the outputs the case names).

The processes run four at a time from one module-scoped fixture, forked from one process that has
imported the command line (``tests/forked_runs.py``); each case is then one test asserting on its stored
result. A case that shows a bug in attnviz stays as it is, marked ``xfail(strict=True)``
with the bug as reason.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import stat
import struct
import subprocess
import sys
import time
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import ROOT, LazyModule
from tests.hostile_files import lying_npy, npy_bytes

# imported when the corpus builds its files, in the worker that runs it (not while every worker collects)
h5py = LazyModule("h5py")
safetensors_numpy = LazyModule("safetensors.numpy")
torch = LazyModule("torch")

GB = 2**30
ADDRESS_SPACE = 3 * GB  # RLIMIT_AS of every case
TIMEOUT = 90  # seconds, per case
WORKERS = 4
TF_WORKERS = 2  # the cases that compute, forked from a process that has imported TensorFlow
ERROR = "attnviz: error: "

Builder = Callable[[Path], object]


# ----------------------------------------------------------------------------------------------
# A case and how it runs


@dataclass(frozen=True)
class Case:
    name: str  # the test id
    cls: int  # the class of the issue (1-8)
    build: Builder | None  # writes the inputs into the case's fresh folder
    argv: list[str | bytes]
    code: int  # the exit code expected
    words: tuple[str, ...] = ()  # in the message (stderr) of a failure; on stdout or stderr for a success
    stdin: bytes = b""
    outputs: tuple[str, ...] = ()  # on success: exactly these new files appear
    one_line: bool = True  # a failure is one or two lines "attnviz: error: ..." (not a batch's summary)
    check: Callable[[Result, Path], None] | None = None  # more to check, given the result and the folder
    fsize: int | None = None  # RLIMIT_FSIZE in bytes: writing past it fails (EFBIG)
    tf: bool = False  # computes (imports TensorFlow: ~5 s); everything else ends before
    bug: str | None = None  # a bug this case shows: xfail(strict=True)


@dataclass
class Result:
    code: int | None
    stdout: bytes
    stderr: bytes
    before: dict[str, tuple]
    after: dict[str, tuple]
    seconds: float
    timed_out: bool = False
    cpu: float = 0.0  # seconds of CPU the process took

    @property
    def out(self) -> str:
        return self.stdout.decode("utf-8", "backslashreplace")

    @property
    def err(self) -> str:
        return self.stderr.decode("utf-8", "backslashreplace")

    def show(self) -> str:
        return (f"exit {self.code} after {self.seconds:.1f} s\n--- stdout\n{self.out[-3000:]}\n"
                f"--- stderr\n{self.err[-3000:]}")


def _digest(path: str, size: int) -> str:
    """sha256 of a file; of its first and last MiB for a file past 64 MiB (sparse files of gigabytes)."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        if size <= 64 * 2**20:
            for chunk in iter(lambda: fh.read(2**20), b""):
                h.update(chunk)
        else:
            h.update(fh.read(2**20))
            fh.seek(size - 2**20)
            h.update(fh.read(2**20))
    return h.hexdigest()


def snapshot(folder: Path) -> dict[str, tuple]:
    """Every entry below ``folder``, hidden ones too, without following links or opening special files:
    regular files by size, mtime and hash, links by target, the rest by kind."""
    out: dict[str, tuple] = {}

    def walk(path: str, rel: str) -> None:
        for entry in sorted(os.scandir(path), key=lambda e: e.name):
            name = f"{rel}{entry.name}"
            st = entry.stat(follow_symlinks=False)
            if stat.S_ISLNK(st.st_mode):
                out[name] = ("link", os.readlink(entry.path))
            elif stat.S_ISDIR(st.st_mode):
                out[name] = ("dir",)
                walk(entry.path, name + "/")
            elif stat.S_ISREG(st.st_mode):
                out[name] = ("file", st.st_size, st.st_mtime_ns, _digest(entry.path, st.st_size))
            else:
                out[name] = ("special", stat.S_IFMT(st.st_mode))

    walk(str(folder), "")
    return out


# this process computes (never a warm worker, which the limits of forked_runs.py would not bind); warnings show
ENV = {**{k: v for k, v in os.environ.items() if k != "ATTNVIZ_DEBUG"}, "PYTHONPATH": str(ROOT), "COLUMNS": "160",
       "PYTHONWARNINGS": "default", "ATTNVIZ_NO_SERVER": "1"}


def preload_for(case: Case) -> str | None:
    """What the process a case is forked from imports beyond the command line: TensorFlow for the cases that
    compute, torch for those reading .pt files."""
    if case.tf:
        return "tensorflow"
    return "torch" if any(str(a).endswith(".pt") for a in case.argv) else None


def run_cases(cases: list[Case], folders: dict[str, Path], io_folder: Path) -> dict[str, Result]:
    """Run the cases, each ``python -m attnviz ARGV`` in its folder with its standard input, as processes forked
    from one that has imported the command line once (``tests/forked_runs.py``: the same process but for the
    ~0.4 s of CPU of starting Python and importing the command line, 134 times). The cases that compute are
    forked from a second such process, which has also imported TensorFlow as a run does (~4 s each), and those
    reading .pt files from a third, which has imported torch (~2.5 s each); the three run at once, WORKERS,
    TF_WORKERS and one case at a time."""
    before = {case.name: snapshot(folders[case.name]) for case in cases}
    procs = []
    for preload, workers in (("tensorflow", TF_WORKERS), ("torch", 1), (None, WORKERS)):
        part = [case for case in cases if preload_for(case) == preload]
        if not part:
            continue
        plan = {"workers": workers, "timeout": TIMEOUT, "address_space": ADDRESS_SPACE,
                "preload": [preload] if preload else [], "jobs": []}
        for case in part:
            stdin = io_folder / f"{case.name}.in"
            stdin.write_bytes(case.stdin)
            plan["jobs"].append({"argv": [os.fsdecode(a) for a in case.argv], "cwd": str(folders[case.name]),
                                 "stdin": str(stdin), "stdout": str(io_folder / f"{case.name}.out"),
                                 "stderr": str(io_folder / f"{case.name}.err"), "fsize": case.fsize})
        plan_file = io_folder / f"plan-{preload or 'plain'}.json"
        plan_file.write_text(json.dumps(plan))
        proc = subprocess.Popen([sys.executable, str(ROOT / "tests" / "forked_runs.py"), str(plan_file)],
                                cwd=io_folder, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, env=ENV)
        procs.append((part, proc))
    results = {}
    try:
        for part, proc in procs:
            out, err = proc.communicate(timeout=TIMEOUT * len(cases))
            assert proc.returncode == 0 and err == b"", err.decode(errors="replace")[-3000:]
            for case, run in zip(part, json.loads(out), strict=True):
                stdout, stderr = (io_folder / f"{case.name}.{ext}" for ext in ("out", "err"))
                results[case.name] = Result(run["code"], stdout.read_bytes(), stderr.read_bytes(), before[case.name],
                                            snapshot(folders[case.name]), run.get("seconds", TIMEOUT),
                                            run["timed_out"], run.get("cpu", 0.0))
    finally:
        for _, proc in procs:
            proc.kill()
            proc.wait()
    return results


# ----------------------------------------------------------------------------------------------
# Builders: small inputs


def normal(*shape: int, seed: int = 0, scale: float = 1.0, dtype=np.float32) -> np.ndarray:
    return (np.random.default_rng(seed).normal(size=shape) * scale).astype(dtype)


def attention(*shape: int, seed: int = 0) -> np.ndarray:
    """Rows that sum to 1, [..., Lq, Lk]."""
    w = np.random.default_rng(seed).random(shape).astype(np.float32) + 0.1
    return w / w.sum(-1, keepdims=True)


def npy(name: str, arr: np.ndarray) -> Builder:
    return lambda f: np.save(f / name, arr)


def text(name: str, data: str | bytes) -> Builder:
    return lambda f: (f / name).write_bytes(data if isinstance(data, bytes) else data.encode())


def npz(name: str, **arrays: np.ndarray) -> Builder:
    """``a__b`` in a key becomes ``a/b`` (Keras weight paths)."""
    return lambda f: np.savez(f / name, **{k.replace("__", "/"): v for k, v in arrays.items()})


def all_of(*builders: Builder) -> Builder:
    def build(f: Path) -> None:
        for b in builders:
            b(f)

    return build


def qkv(lq: int = 3, lk: int = 4, d: int = 3, dv: int = 2) -> Builder:
    return all_of(npy("q.npy", normal(lq, d, seed=1)), npy("k.npy", normal(lk, d, seed=2)),
                  npy("v.npy", normal(lk, dv, seed=3)))


QKV = ["q.npy", "k.npy", "v.npy"]
WEIGHTS = npy("w.npy", attention(2, 3, 4))
TWO_WEIGHTS = all_of(WEIGHTS, npy("w2.npy", attention(2, 3, 4, seed=1)))
X = npy("x.npy", normal(4, 3, seed=4))
DOC = npy("doc.npy", normal(2, 3, 3, seed=5))
JOBS = text("jobs.jsonl", json.dumps({"command": "inspect", "args": ["w.npy"]}) + "\n")
LONG_NAME = "a" * 300 + ".png"  # longer than a file name may be (255 bytes)


# ----------------------------------------------------------------------------------------------
# Builders: hostile files


def lying_npz(name: str, compression: int) -> Builder:
    """An .npz whose member header claims [9999999, 3] over the 24 bytes of a [2, 3] array."""
    def build(f: Path) -> None:
        with zipfile.ZipFile(f / name, "w", compression) as z:
            z.writestr("attn.npy", lying_npy("(9999999, 3)", np.zeros(6, np.float32).tobytes()))

    return build


def bomb_npz(name: str) -> Builder:
    """A deflated member whose zip directory claims 4 GiB from ~70 bytes of compressed data."""
    def build(f: Path) -> None:
        path = f / name
        with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
            z.writestr("attn.npy", npy_bytes(attention(3, 3)))
        data = bytearray(path.read_bytes())
        struct.pack_into("<I", data, data.rfind(b"PK\x01\x02") + 24, 0xFFFFFFF0)
        struct.pack_into("<I", data, data.find(b"PK\x03\x04") + 22, 0xFFFFFFF0)
        path.write_bytes(bytes(data))

    return build


def sparse_npy(name: str, n: int) -> Builder:
    """A real, sparse .npy of [n, n] float32 zeros: gigabytes that take no disk."""
    def build(f: Path) -> None:
        header = npy_bytes(np.zeros((0,), np.float32))[:128].replace(b"(0,)", f"({n}, {n})".encode())
        length = struct.unpack("<H", header[8:10])[0]
        head = header[:10 + length].replace(b"\n", b" ")
        head = head[:-1] + b"\n"
        with open(f / name, "wb") as fh:
            fh.write(head)
            fh.truncate(len(head) + 4 * n * n)

    return build


def safetensors_raw(name: str, header: dict | bytes, data: bytes = b"\0" * 16) -> Builder:
    content = header if isinstance(header, bytes) else json.dumps(header).encode()
    return text(name, struct.pack("<Q", len(content)) + content + data)


def h5(name: str, **datasets: np.ndarray) -> Builder:
    def build(f: Path) -> None:
        with h5py.File(f / name, "w") as h:
            for key, arr in datasets.items():
                h[key.replace("__", "/")] = arr

    return build


def huge_h5(name: str) -> Builder:
    """Datasets claiming petabytes in a file of a few kilobytes: chunked and contiguous."""
    def build(f: Path) -> None:
        with h5py.File(f / name, "w") as h:
            h.create_dataset("attn", shape=(2**20, 2**20, 1024), dtype="f4", chunks=(1, 16, 1024))
            h.create_dataset("flat", shape=(2**30, 2**20), dtype="f4")

    return build


def external_h5(name: str) -> Builder:
    def build(f: Path) -> None:
        (f / "raw.bin").write_bytes(np.ones(4, np.float32).tobytes())
        with h5py.File(f / name, "w") as h:
            h.create_dataset("attn", shape=(2, 2), dtype="f4", external=[("raw.bin", 0, 16)])

    return build


def safetensors(name: str, **arrays: np.ndarray) -> Builder:
    return lambda f: safetensors_numpy.save_file({k.replace("__", "/"): v for k, v in arrays.items()}, str(f / name))


def pt(name: str, obj_factory: Callable[[], object]) -> Builder:
    return lambda f: torch.save(obj_factory(), f / name)


class Payload:
    """Unpickled, it would create the file ``pwned`` in the current folder."""

    def __reduce__(self):
        return (open, ("pwned", "w"))


def evil_npy(name: str) -> Builder:
    return lambda f: np.save(f / name, np.array([Payload(), 1], dtype=object), allow_pickle=True)


def fifo(name: str) -> Builder:
    return lambda f: os.mkfifo(f / name)


def unix_socket(name: str) -> Builder:
    def build(f: Path) -> None:
        s = socket.socket(socket.AF_UNIX)
        s.bind(str(f / name))
        s.close()

    return build


def symlink(name: str, target: str) -> Builder:
    return lambda f: (f / name).symlink_to(target)


def folder_named(name: str) -> Builder:
    return lambda f: (f / name).mkdir()


def sparse_file(name: str, size: int) -> Builder:
    def build(f: Path) -> None:
        with open(f / name, "wb") as fh:
            fh.truncate(size)

    return build


# ----------------------------------------------------------------------------------------------
# Checks beyond the table's columns


def stdout_json(check: Callable[[dict, Path], None]) -> Callable[[Result, Path], None]:
    def run(result: Result, folder: Path) -> None:
        check(json.loads(result.stdout), folder)

    return run


def saved_shape(name: str, shape: tuple[int, ...]) -> Callable[[Result, Path], None]:
    def run(result: Result, folder: Path) -> None:
        arr = np.load(folder / name)
        assert arr.shape == shape, arr.shape
        assert np.isfinite(arr).all()

    return run


def jobs_report(statuses: dict[int, str], errors: dict[int, str]) -> Callable[[Result, Path], None]:
    """A batch's --json summary: each line's status, and words in the errors of failed lines."""
    def check(doc: dict, folder: Path) -> None:
        by_line = {job["line"]: job for job in doc["jobs"]}
        assert {n: j["status"] for n, j in by_line.items()} == statuses, doc
        for number, words in errors.items():
            assert words in by_line[number]["error"], (number, by_line[number])
        assert doc["failed"] == sum(s == "failed" for s in statuses.values())

    return stdout_json(check)


# ----------------------------------------------------------------------------------------------
# Class 1: sizes before allocation, regular files only, bounded JSON, capped listings

HUGE_NPY = text("big.npy", lying_npy("(1000000, 1000000)"))

CLASS_1 = [
    Case("npy-header-claims-4TB", 1, HUGE_NPY, ["inspect", "big.npy"], 1,
         ("big.npy", "[1000000, 1000000]")),
    Case("npy-header-as-query", 1, all_of(qkv(), HUGE_NPY), ["scaled", "big.npy", "k.npy", "v.npy"], 1,
         ("big.npy",)),
    Case("npy-header-as-mask", 1, all_of(qkv(), HUGE_NPY), ["dot", *QKV, "--mask", "big.npy"], 1,
         ("big.npy",)),
    Case("npy-truncated", 1, text("cut.npy", npy_bytes(attention(8, 8))[:200]), ["inspect", "cut.npy"], 1,
         ("cut.npy",)),
    Case("npy-empty-file", 1, text("empty.npy", b""), ["compare", "empty.npy", "w.npy"], 1, ("empty.npy",)),
    Case("npy-sparse-16GiB", 1, sparse_npy("huge.npy", 65536), ["inspect", "huge.npy", "--no-table"], 1,
         ("huge.npy", "16.0 GiB")),
    Case("npz-stored-member-lies", 1, lying_npz("lie.npz", zipfile.ZIP_STORED), ["inspect", "lie.npz"], 1,
         ("lie.npz:attn", "[9999999, 3]")),
    Case("npz-deflated-member-lies", 1, all_of(WEIGHTS, lying_npz("lie.npz", zipfile.ZIP_DEFLATED)),
         ["compare", "w.npy", "lie.npz"], 1, ("lie.npz", "[9999999, 3]")),
    Case("npz-zip-bomb-params", 1, all_of(X, bomb_npz("bomb.npz")),
         ["pooling", "x.npy", "--params", "bomb.npz"], 1, ("bomb.npz", "zip bomb")),
    Case("npz-3000-long-keys", 1,
         npz("many.npz", **{f"k{i}" + "x" * 300: np.ones(1, np.float32) for i in range(3000)}),
         ["inspect", "many.npz:nope"], 1, ("many.npz", "and 2980 more")),
    Case("safetensors-offsets-4TB", 1,
         safetensors_raw("huge.safetensors", {"attn": {"dtype": "F32", "shape": [10**6, 10**6],
                                                       "data_offsets": [0, 4 * 10**12]}}),
         ["inspect", "huge.safetensors"], 1, ("huge.safetensors", "data offsets")),
    Case("safetensors-header-length", 1,
         all_of(WEIGHTS, text("hdr.safetensors", struct.pack("<Q", 2**62) + b"{}")),
         ["compare", "w.npy", "hdr.safetensors"], 1, ("hdr.safetensors", "4611686018427387904")),
    Case("safetensors-header-nested", 1,
         safetensors_raw("deep.safetensors", b'{"attn": ' + b"[" * 100000 + b"]" * 100000 + b"}"),
         ["inspect", "deep.safetensors"], 1, ("deep.safetensors", "nested")),
    Case("h5-chunked-petabytes", 1, huge_h5("huge.h5"), ["inspect", "huge.h5:attn"], 1, ("huge.h5:attn", "PiB")),
    Case("h5-contiguous-as-query", 1, all_of(qkv(), huge_h5("huge.h5")),
         ["scaled", "huge.h5:flat", "k.npy", "v.npy"], 1, ("huge.h5:flat", "PiB")),
    Case("h5-external-storage", 1, external_h5("ext.h5"), ["inspect", "ext.h5:attn"], 1,
         ("ext.h5:attn", "other files")),
    Case("h5-garbage", 1, text("bad.h5", b"\x89HDF\r\n\x1a\n" + bytes(range(256)) * 8), ["inspect", "bad.h5"], 1,
         ("bad.h5",)),
    Case("pt-expanded-view-16GiB", 1, pt("view.pt", lambda: {"attn": torch.ones(1).expand(65536, 65536)}),
         ["inspect", "view.pt"], 1, ("view.pt", "would take")),
    Case("pt-pickled-payload", 1, pt("evil.pt", lambda: {"attn": torch.ones(2, 2), "x": Payload()}),
         ["inspect", "evil.pt"], 1, ("evil.pt",)),
    Case("npy-pickled-payload", 1, evil_npy("evil.npy"), ["inspect", "evil.npy"], 1, ("evil.npy",)),
    Case("fifo-as-mask", 1, all_of(qkv(), fifo("m.npy")), ["scaled", *QKV, "--mask", "m.npy"], 2,
         ("m.npy", "named pipe")),
    Case("link-to-dev-zero", 1, symlink("zero.json", "/dev/zero"), ["inspect", "zero.json"], 2,
         ("zero.json", "/dev/zero")),
    Case("folder-named-npz", 1, all_of(WEIGHTS, folder_named("dir.npz")), ["compare", "w.npy", "dir.npz"], 2,
         ("dir.npz", "directory")),
    Case("socket-as-input", 1, unix_socket("sock.npy"), ["inspect", "sock.npy"], 2, ("sock.npy", "socket")),
    Case("labels-from-dev-zero", 1, npy("w.npy", attention(3, 3)), ["inspect", "w.npy", "--labels", "/dev/zero"], 2,
         ("/dev/zero", "character device")),
    Case("json-nested-100000", 1, text("deep.json", "[" * 100000 + "]" * 100000), ["inspect", "deep.json"], 1,
         ("deep.json", "nested")),
    Case("json-100MiB-sparse", 1, all_of(qkv(), sparse_file("big.json", 100 * 2**20)),
         ["scaled", "big.json", "k.npy", "v.npy"], 1, ("big.json", "MiB")),
    Case("json-5000-keys", 1, text("many.json", json.dumps({f"entry{i}": [[1.0]] for i in range(5000)})),
         ["inspect", "many.json"], 1, ("many.json", "and 4980 more")),
    Case("params-drawn-would-take-GB", 1, X, ["multihead", "x.npy", "--heads", "1024", "--key-dim", "8192"], 2,
         ("parameters",)),
]


# ----------------------------------------------------------------------------------------------
# Class 2: option values, checked as the command line is read

CLASS_2 = [
    Case("heads-0", 2, X, ["multihead", "x.npy", "--heads", "0"], 2, ("--heads 0", "at least 1")),
    Case("key-dim-0", 2, X, ["multihead", "x.npy", "--heads", "1", "--key-dim", "0"], 2, ("--key-dim 0",)),
    Case("units-0", 2, X, ["pooling", "x.npy", "--units", "0"], 2, ("--units 0",)),
    Case("hier-units-0", 2, DOC, ["hierarchical", "doc.npy", "--units", "0"], 2, ("--units 0",)),
    Case("window-negative", 2, qkv(), ["local", *QKV, "--window", "-1"], 2, ("--window -1",)),
    Case("topk-k-0", 2, qkv(), ["sparse", *QKV, "--method", "topk", "--k", "0"], 2, ("--k 0",)),
    Case("jobs-0", 2, all_of(WEIGHTS, JOBS), ["batch", "jobs.jsonl", "--jobs", "0"], 2, ("--jobs 0",)),
    Case("seed-negative", 2, X, ["self", "x.npy", "--seed", "-1"], 2, ("--seed -1",)),
    Case("max-memory-inf", 2, qkv(), ["dot", *QKV, "--max-memory", "inf"], 2, ("--max-memory inf",)),
    Case("max-memory-nan", 2, qkv(), ["scaled", *QKV, "--max-memory", "nan"], 2, ("--max-memory nan",)),
    Case("max-memory-negative", 2, qkv(), ["scaled", *QKV, "--max-memory", "-2G"], 2, ("--max-memory '-2G'",)),
    Case("max-memory-unknown-unit", 2, qkv(), ["scaled", *QKV, "--max-memory", "3 furlongs"], 2,
         ("--max-memory '3 furlongs'",)),
    Case("scale-nan", 2, qkv(), ["scaled", *QKV, "--scale", "nan"], 2, ("--scale nan", "finite")),
    Case("coattention-scale-inf", 2, qkv(), ["coattention", "q.npy", "k.npy", "--scale", "inf"], 2,
         ("--scale inf", "finite")),
    Case("entmax-alpha-nan", 2, qkv(), ["sparse", *QKV, "--method", "entmax", "--alpha", "nan"], 2,
         ("--alpha nan",)),
    Case("gumbel-tau-minus-inf", 2, qkv(), ["hard", *QKV, "--mode", "gumbel", "--tau", "-inf"], 2, ("--tau -inf",)),
    Case("gat-slope-nan", 2, all_of(X, npy("adj.npy", np.ones((4, 4), np.int8))),
         ["structured", "x.npy", "--adjacency", "adj.npy", "--score", "gat", "--negative-slope", "nan"], 2,
         ("--negative-slope nan",)),
    Case("atol-inf", 2, WEIGHTS, ["inspect", "w.npy", "--atol", "inf"], 2, ("--atol inf",)),
    Case("rtol-nan", 2, TWO_WEIGHTS, ["compare", "w.npy", "w2.npy", "--rtol", "nan"], 2, ("--rtol nan",)),
    Case("bidirectional-seed-huge", 2, qkv(),
         ["bidirectional", "q.npy", "k.npy", "--seed", "99999999999999999999999999"], 2, ("--seed",)),
]


# ----------------------------------------------------------------------------------------------
# Class 3: usage errors of every kind, in one format

CLASS_3 = [
    Case("device-tpu", 3, qkv(), ["scaled", *QKV, "--device", "tpu"], 2,
         ("--device 'tpu'", "expected one of auto, cpu, gpu")),
    Case("dtype-int8", 3, qkv(), ["dot", *QKV, "--dtype", "int8"], 2, ("--dtype 'int8'", "float32")),
    Case("unknown-option", 3, DOC, ["hierarchical", "doc.npy", "--bogus"], 2, ("--bogus", "no such option")),
    Case("option-typo", 3, qkv(), ["scaled", *QKV, "--scal", "1"], 2, ("--scal", "did you mean", "--scale")),
    Case("missing-argument", 3, qkv(), ["bidirectional"], 2, ("missing argument",)),
    Case("missing-second-argument", 3, WEIGHTS, ["compare", "w.npy"], 2, ("missing argument B",)),
    Case("missing-jobs", 3, JOBS, ["batch"], 2, ("missing argument JOBS",)),
    Case("not-a-number", 3, X, ["multihead", "x.npy", "--heads", "two"], 2, ("--heads 'two'", "whole number")),
    Case("bad-choice-mode", 3, qkv(), ["hard", *QKV, "--mode", "argmin"], 2, ("--mode 'argmin'", "argmax")),
    Case("bad-choice-method", 3, qkv(), ["sparse", *QKV, "--method", "sparsemin"], 2,
         ("--method 'sparsemin'", "sparsemax")),
    Case("option-needs-value", 3, qkv(), ["local", *QKV, "--window"], 2, ("--window", "needs a value")),
    Case("flag-given-value", 3, qkv(), ["scaled", *QKV, "--causal=yes"], 2, ("--causal", "takes no value")),
    Case("extra-argument", 3, qkv(), ["coattention", "q.npy", "k.npy", "v.npy", "q.npy", "k.npy"], 2,
         ("extra argument",)),
    Case("unknown-command", 3, qkv(), ["scaledd", *QKV], 2, ("'scaledd'", "no such command", "'scaled'")),
    Case("missing-file", 3, qkv(), ["scaled", "nowhere.npy", "k.npy", "v.npy"], 2, ("nowhere.npy",)),
    Case("unknown-file-type", 3, text("w.txt", "0.5 0.5\n"), ["inspect", "w.txt"], 2, ("w.txt",)),
    Case("stdin-for-two-arguments", 3, qkv(), ["scaled", "-", "-", "v.npy"], 2, ("-",), stdin=b"[[1, 2, 3]]"),
    Case("missing-file-with-newline", 3, None, ["inspect", "nope\nattnviz: error: forged.npy"], 2,
         ("nope\\nattnviz: error: forged.npy", "no such file")),
    Case("no-command-at-all", 3, None, [], 2, ("missing command", "attnviz --help")),
    Case("option-with-escape-sequence", 3, qkv(), ["scaled", *QKV, "--\x1b]0;pwned\x07"], 2,
         ("\\x1b]0;pwned\\x07", "no such option")),
    Case("choice-with-escape-sequence", 3, qkv(), ["scaled", *QKV, "--device", "\x1b[2J\x9bgpu"], 2,
         ("--device", "\\x1b[2J\\x9bgpu")),
]


# ----------------------------------------------------------------------------------------------
# Class 4: numbers that overflow name the input; 6-D and 7-D inputs work

CLASS_4 = [
    Case("value-past-float32", 4, all_of(qkv(), npy("huge.npy", np.full((3, 3), 1e39))),
         ["scaled", "huge.npy", "k.npy", "v.npy"], 1, ("huge.npy", "float32")),
    Case("int64-min-in-float16", 4, all_of(qkv(), npy("qmin.npy", np.full((3, 3), np.iinfo(np.int64).min))),
         ["scaled", "qmin.npy", "k.npy", "v.npy", "--dtype", "float16"], 1, ("qmin.npy", "float16", "--dtype")),
    Case("nan-in-key", 4, all_of(qkv(), npy("knan.npy", np.array([[0, 1, np.nan]] * 4, np.float32))),
         ["dot", "q.npy", "knan.npy", "v.npy"], 1, ("knan.npy",)),
    Case("dot-products-overflow", 4,  # with outputs named: none written, the old w.npy kept
         all_of(npy("q20.npy", np.full((3, 3), -1e20, np.float32)), npy("k20.npy", np.full((4, 3), 1e20, np.float32)),
                npy("v.npy", normal(4, 2)), text("w.npy", b"old contents")),
         ["dot", "q20.npy", "k20.npy", "v.npy", "--save-weights", "w.npy", "--save-output", "o.npy", "--png", "a.png",
          "--json-file", "d.json"], 1, ("q20.npy", "k20.npy", "overflowed float32", "--dtype"), tf=True),
    Case("int64-products-overflow-bundle", 4,
         npz("acts.npz", q=np.full((3, 32), 2**62, np.int64), k=np.full((4, 32), 2**62, np.int64),
             v=np.ones((4, 2), np.int64)),
         ["dot", "acts.npz"], 1, ("acts.npz", "overflowed float32", "--dtype float64"), tf=True),
    Case("6d-scaled", 4,
         all_of(npy("q6.npy", normal(2, 1, 2, 1, 3, 3)), npy("k6.npy", normal(1, 2, 1, 2, 4, 3, seed=1)),
                npy("v6.npy", normal(1, 2, 1, 2, 4, 2, seed=2))),
         ["scaled", "q6.npy", "k6.npy", "v6.npy", "--causal", "--save-weights", "w.npy", "--quiet"], 0,
         outputs=("w.npy",), check=saved_shape("w.npy", (2, 2, 2, 2, 3, 4)), tf=True),
    Case("7d-multihead-safetensors", 4, safetensors("acts.safetensors", x=normal(1, 2, 1, 2, 1, 3, 4)),
         ["multihead", "acts.safetensors:x", "--heads", "2", "--save-weights", "w.npy", "--save-output", "o.npy",
          "--quiet"], 0, outputs=("w.npy", "o.npy"), check=saved_shape("w.npy", (1, 2, 1, 2, 1, 2, 3, 3)), tf=True),
    Case("value-past-float16-h5-bundle", 4,
         h5("acts.h5", q=np.full((3, 3), 1e5, np.float32), k=normal(4, 3), v=normal(4, 2)),
         ["scaled", "acts.h5", "--dtype", "float16"], 1, ("acts.h5", "float16", "--dtype")),
]


# ----------------------------------------------------------------------------------------------
# Class 5: text reaching the terminal or a figure is inert (these succeed)

HOSTILE_LABELS = ["a\x1b[31mred\x1b[0m", "b:smile:", "[bold red]c", "cr\rx", "bell\x07", "$\\frac{1}{$",
                  "\u202eevil", "c1\x9b2J"]
N = len(HOSTILE_LABELS)
NO_RAW = ("\\x1b[31m", ":smile:", "[bold red]c")  # escaped, and emoji codes and markup as written
MEGA = "\x1b]0;title\x07" + "m" * 2**20
GLYPH_LABELS = ["$\\frac{1}{2}$", "你好", "😀 grin", "\x1b[31mred", "\u202eevil", "x" * 2**20, "ok"]


def quiet_picture(result: Result, folder: Path) -> None:
    """A computing run's two usual lines on stderr and nothing else (no matplotlib warning), and a picture."""
    lines = result.err.strip().splitlines()
    assert len(lines) == 2 and lines[0].startswith("scaled: ") and lines[1].startswith("saved png to"), result.err
    assert "Warning" not in result.err and "Glyph" not in result.err
    from matplotlib.image import imread

    img = imread(folder / "a.png")
    assert img.shape[0] > 200 and img[..., :3].std() > 0.1


FORGED = "w\nattnviz: error: forged"  # a file name that would forge a line of its own
FORGED_SHOWN = "w\\nattnviz: error: forged"


def _no_smiley(result: Result, folder: Path) -> None:
    assert "😄" not in result.out and "😄" not in result.err


def _no_forged_lines(result: Result, folder: Path) -> None:
    assert not [line for line in result.err.splitlines() if line.startswith("attnviz: error")], result.err


CLASS_5 = [
    Case("labels-controls-markup-emoji", 5,  # a CR ends a line of a text file: it is in the JSON labels below
         all_of(npy("w.npy", attention(2, N - 1, N - 1)),
                text("labels.txt", "\n".join(label for label in HOSTILE_LABELS if "\r" not in label) + "\n")),
         ["inspect", "w.npy", "--labels", "labels.txt", "--max-cols", "20"], 0,
         (*NO_RAW, "bell\\x07", "\\u202eevil", "c1\\x9b2J"), check=_no_smiley),
    Case("labels-in-json-file", 5,
         all_of(npy("w.npy", attention(N, N)), text("labels.json", json.dumps({"labels": HOSTILE_LABELS}))),
         ["inspect", "w.npy", "--labels", "labels.json", "--max-cols", "20"], 0, (*NO_RAW, "cr\\rx"),
         check=_no_smiley),
    Case("labels-literal-json-list", 5, npy("w.npy", attention(3, 3)),
         ["inspect", "w.npy", "--labels", json.dumps(["\x1b[5mblink", "new\nline", ":fire: [link=x]y"])], 0,
         ("\\x1b[5mblink", "new\\nline", ":fire: [link=x]y")),
    Case("label-1MB-in-map-png", 5, all_of(npy("w.npy", attention(3, 3)), text("big.txt", f"{MEGA}\nb\n$x^$\n")),
         ["inspect", "w.npy", "--labels", "big.txt", "--map-png", "m.png", "--title", "$\\unbalanced{ :smile:"], 0,
         ("\\x1b]0;title\\x07mm",), outputs=("m.png",)),
    Case("file-name-escape-sequences", 5, npy("\x1b[31m\x07w.npy", attention(3, 3)),
         ["inspect", "\x1b[31m\x07w.npy"], 0, ("\\x1b[31m\\x07w.npy",)),
    Case("file-names-markup-emoji", 5,
         all_of(npy("[bold]a.npy", attention(3, 3)), npy(":smile:b.npy", attention(3, 3, seed=1))),
         ["compare", "[bold]a.npy", ":smile:b.npy"], 0, ("[bold]a.npy", ":smile:b.npy"), check=_no_smiley),
    Case("file-name-mathtext-in-figures", 5, npy("$\\frac{1}{$ :smile: [b].npy", attention(2, 3, 3)),
         ["inspect", "$\\frac{1}{$ :smile: [b].npy", "--png", "a.png", "--map-png", "m.png", "--stats-png", "s.png"],
         0, ("$\\frac{1}{$ :smile: [b].npy",), outputs=("a.png", "m.png", "s.png"), check=_no_smiley),
    Case("file-name-not-utf8", 5, lambda f: np.save(f / os.fsdecode(b"w\xff\x9b.npy"), attention(3, 3)),
         ["inspect", b"w\xff\x9b.npy"], 0, ("w\\udcff\\udc9b.npy",)),
    Case("safetensors-keys-hostile", 5,
         safetensors("k.safetensors", **{"layer\x1b[2J": attention(3, 3), "layer:smile:[b]": attention(3, 3)}),
         ["inspect", "k.safetensors"], 0, ()),
    Case("h5-keys-hostile", 5, h5("k.h5", **{"a\rb\x07": attention(3, 3), "c\x9b[1m": attention(3, 3)}),
         ["inspect", "k.h5", "--json"], 0, ("a\\rb\\u0007",)),
    Case("file-name-newline-in-error", 5, all_of(qkv(), npy(FORGED + ".npy", normal(3, 7))),
         ["scaled", FORGED + ".npy", "k.npy", "v.npy"], 1, (FORGED_SHOWN + ".npy",)),
    Case("file-name-newline-in-info-lines", 5, npy(FORGED + ".npy", attention(3, 3)),
         ["inspect", FORGED + ".npy", "--no-table", "--png", FORGED + ".png"], 0, (FORGED_SHOWN + ".npy",),
         outputs=(FORGED + ".png",), check=_no_forged_lines),
    Case("file-name-in-error", 5, all_of(qkv(), npy("\x1b]0;pwned\x07[bold]q.npy", normal(3, 7))),
         ["scaled", "\x1b]0;pwned\x07[bold]q.npy", "k.npy", "v.npy"], 1, ("\\x1b]0;pwned\\x07[bold]q.npy",)),
    Case("keys-listed-in-error", 5, safetensors("k.safetensors", **{"l\x1b[2J": attention(3, 3),
                                                                   "l\x9b": attention(3, 3)}),
         ["inspect", "k.safetensors:nope"], 1, ("k.safetensors", "l\\x1b[2J")),
    Case("bundle-labels-heatmap", 5,
         npz("b.npz", q=normal(N, 3), k=normal(N, 3, seed=1), v=normal(N, 2, seed=2),
             q_labels=np.array([*HOSTILE_LABELS[:-1], MEGA]), k_labels=np.array(HOSTILE_LABELS)),
         ["scaled", "b.npz", "--png", "a.png", "--max-cols", "20", "--title", "$x$ :smile: [bold]\x1b[2J"], 0,
         NO_RAW, outputs=("a.png",), tf=True),
    # exotic scripts with no glyph in the font, mathtext, ESC and a 1 MB label in a labels file: no matplotlib
    # warning reaches stderr, and the label is shortened before matplotlib sees it
    Case("labels-file-glyphs-mathtext-1MB", 5,
         all_of(npy("q.npy", normal(len(GLYPH_LABELS), 3)), npy("k.npy", normal(len(GLYPH_LABELS), 3, seed=1)),
                npy("v.npy", normal(len(GLYPH_LABELS), 2, seed=2)), text("labels.txt", "\n".join(GLYPH_LABELS) + "\n")),
         ["scaled", *QKV, "--labels", "labels.txt", "--png", "a.png", "--title", "$x$ :smile: [bold]\x1b[2J"], 0,
         outputs=("a.png",), check=lambda r, f: quiet_picture(r, f), tf=True),
]


# ----------------------------------------------------------------------------------------------
# Class 6: parameter files that disagree name the file and the keys

ONES = np.ones
MH = {"query__kernel": ONES((3, 2, 3)), "key__kernel": ONES((3, 2, 3)), "value__kernel": ONES((3, 2, 3)),
      "attention_output__kernel": ONES((2, 3, 3))}
Q3 = npy("q.npy", normal(3, 3))

CLASS_6 = [
    Case("mh-heads-disagree", 6, all_of(Q3, npz("p.npz", **{**MH, "key__kernel": ONES((3, 3, 3)),
                                                              "value__kernel": ONES((3, 3, 3))})),
         ["multihead", "q.npy", "--params", "p.npz"], 1, ("p.npz", "query/kernel [3, 2, 3]", "key/kernel [3, 3, 3]")),
    Case("mh-key-dim-safetensors", 6,
         all_of(Q3, safetensors("p.safetensors", **{**MH, "key__kernel": ONES((3, 2, 4))})),
         ["multihead", "q.npy", "--params", "p.safetensors"], 1, ("p.safetensors", "key/kernel [3, 2, 4]")),
    Case("mh-output-heads-h5", 6,
         all_of(Q3, h5("p.h5", **{**MH, "attention_output__kernel": ONES((3, 3, 3))})),
         ["multihead", "q.npy", "--params", "p.h5"], 1, ("p.h5", "attention_output/kernel [3, 3, 3]")),
    Case("mh-params-vs-heads-option", 6, all_of(Q3, npz("p.npz", **MH)),
         ["multihead", "q.npy", "--params", "p.npz", "--heads", "3"], 1, ("p.npz", "--heads 3")),
    Case("additive-units-disagree", 6, all_of(qkv(), npz("p.npz", W1=ONES((3, 4)), W2=ONES((3, 5)), v=ONES(4))),
         ["additive", *QKV, "--params", "p.npz"], 1, ("p.npz", "W1 [3, 4]", "W2 [3, 5]")),
    Case("pooling-pt", 6, all_of(X, pt("p.pt", lambda: {"W": torch.ones(3, 4), "v": torch.ones(5)})),
         ["pooling", "x.npy", "--params", "p.pt"], 1, ("p.pt", "W [3, 4]", "v [5]")),
    Case("self-projections-disagree", 6, all_of(X, npz("p.npz", W_Q=ONES((3, 2)), W_K=ONES((3, 3)), W_V=ONES((3, 3)))),
         ["self", "x.npy", "--params", "p.npz"], 1, ("p.npz", "W_Q [3, 2]", "W_K [3, 3]")),
    Case("han-word-level-disagree", 6,
         all_of(DOC, npz("p.npz", W_w=ONES((3, 4)), u_w=ONES(5), W_s=ONES((3, 4)), u_s=ONES(4))),
         ["hierarchical", "doc.npy", "--params", "p.npz"], 1, ("p.npz", "W_w [3, 4]", "u_w [5]")),
    Case("gat-attention-vectors", 6,
         all_of(X, npy("adj.npy", np.ones((4, 4), np.int8)),
                npz("p.npz", W=ONES((3, 4)), a_src=ONES(5), a_dst=ONES(4))),
         ["structured", "x.npy", "--adjacency", "adj.npy", "--score", "gat", "--params", "p.npz"], 1,
         ("p.npz", "a_src")),
    Case("bidaf-w-size", 6, all_of(qkv(), npz("p.npz", w=ONES(10))),
         ["bidirectional", "q.npy", "k.npy", "--params", "p.npz"], 1, ("p.npz", "'w'")),
    Case("local-p-disagree", 6, all_of(qkv(), npz("p.npz", W_p=ONES((3, 4)), v_p=ONES(5))),
         ["local", *QKV, "--mode", "local-p", "--window", "1", "--params", "p.npz"], 1, ("p.npz", "W_p", "v_p")),
    Case("general-unexpected-key", 6, all_of(qkv(), npz("p.npz", W_a=ONES((3, 3)), W_b=ONES((3, 3)))),
         ["general", *QKV, "--params", "p.npz"], 1, ("p.npz", "W_b")),
    Case("crf-missing-key", 6, all_of(qkv(), npz("p.npz", W=ONES((3, 3)))),
         ["structured", *QKV, "--method", "crf", "--params", "p.npz"], 1, ("p.npz", "'T'")),
    Case("params-5000-unexpected-keys", 6,
         all_of(qkv(), npz("p.npz", W_a=ONES((3, 3)), **{f"extra{i}": ONES(1) for i in range(5000)})),
         ["general", *QKV, "--params", "p.npz"], 1, ("p.npz", "unexpected key", "and 4980 more")),
    Case("params-nan-value", 6, all_of(qkv(), npz("p.npz", W_a=np.full((3, 3), np.nan))),
         ["general", *QKV, "--params", "p.npz"], 1, ("p.npz", "W_a")),
]


# ----------------------------------------------------------------------------------------------
# Class 7: standard input and jobs files

GOOD_JOB = {"command": "inspect", "args": ["w.npy"], "options": {"no_table": True}}


def jobs_file(name: str, lines: list[bytes]) -> Builder:
    return text(name, b"\n".join(lines) + b"\n")


BAD_LINES = [
    json.dumps({**GOOD_JOB, "options": {"json": "one.json"}}).encode(),  # 1 ok
    b"{broken",  # 2
    b'{"command": "inspect", "args": ' + b"[" * 5000 + b"]" * 5000 + b"}",  # 3
    b'{"command": "inspect", "args": "w.npy"}',  # 4
    b'{"command": "inspect", "args": ["w.npy"], "options": {"top": NaN}}',  # 5
    b'{"command": "\\u001b[31mnope\\u0007"}',  # 6
    b'{"command": "inspect", "args": ["caf\xe9.npy"]}',  # 7
    json.dumps({"command": "inspect", "args": ["missing.npy"]}).encode(),  # 8
    json.dumps({**GOOD_JOB, "options": {"json": "nodir/x.json"}}).encode(),  # 9
    json.dumps({**GOOD_JOB, "options": {"json": "two.json"}}).encode(),  # 10 ok
]

CLASS_7 = [
    Case("stdin-binary", 7, None, ["inspect", "-"], 1, ("'-' (<stdin>)", "binary"), stdin=bytes(range(256)) * 4),
    Case("stdin-not-utf8", 7, qkv(), ["scaled", "-", "k.npy", "v.npy"], 1, ("<stdin>", "not UTF-8"),
         stdin=b"\xff\xfe[[1, 2, 3]]"),
    Case("stdin-nested-deep", 7, WEIGHTS, ["compare", "w.npy", "-"], 1, ("<stdin>", "nested"),
         stdin=b"[" * 100000 + b"]" * 100000),
    Case("stdin-empty", 7, None, ["inspect", "-"], 1, ("<stdin>",)),
    Case("stdin-jobs-binary", 7, None, ["batch", "-"], 1, ("'-' (<stdin>)", "binary"), stdin=b"\0\1\2" * 100),
    Case("jobs-bad-lines-fail-alone", 7, all_of(WEIGHTS, jobs_file("jobs.jsonl", BAD_LINES)),
         ["batch", "jobs.jsonl", "--json"], 1, outputs=("one.json", "two.json"), one_line=False,
         check=jobs_report({n: "ok" if n in (1, 10) else "failed" for n in range(1, 11)},
                           {2: "not valid JSON", 3: "nested", 4: '"args"', 5: "finite", 6: "unknown command",
                            7: "not UTF-8", 8: "missing.npy", 9: "nodir"})),
    Case("jobs-output-is-the-jobs-file", 7,
         all_of(WEIGHTS, jobs_file("jobs.jsonl", [json.dumps({**GOOD_JOB, "options": {"json": "jobs.jsonl"}}).encode(),
                                                  json.dumps(GOOD_JOB).encode()])),
         ["batch", "jobs.jsonl", "--json"], 1, one_line=False,
         check=jobs_report({1: "failed", 2: "ok"}, {1: "jobs.jsonl"})),
    Case("jobs-bad-lines-table", 7, all_of(WEIGHTS, jobs_file("jobs.jsonl", BAD_LINES[1:8])), ["batch", "jobs.jsonl"],
         1, one_line=False),
    Case("jobs-stdin-bad-line", 7, WEIGHTS, ["batch", "-", "--json"], 1, one_line=False,
         stdin=json.dumps(GOOD_JOB).encode() + b"\n[1, 2]\n" + json.dumps(GOOD_JOB).encode() + b"\n",
         check=jobs_report({1: "ok", 2: "failed", 3: "ok"}, {2: "a job is an object"})),
    Case("jobs-output-name-too-long", 7,
         all_of(WEIGHTS, jobs_file("jobs.jsonl", [json.dumps({**GOOD_JOB, "options": {"png": LONG_NAME}}).encode(),
                                                  json.dumps(GOOD_JOB).encode()])),
         ["batch", "jobs.jsonl", "--json"], 1, one_line=False,
         check=jobs_report({1: "failed", 2: "ok"}, {1: "--png"})),
]


# ----------------------------------------------------------------------------------------------
# Class 8: outputs all or nothing; inputs never touched


CLASS_8 = [
    Case("png-into-missing-folder", 8, qkv(), ["scaled", *QKV, "--png", "nodir/a.png"], 1,
         ("--png nodir/a.png", "does not exist")),
    Case("json-file-into-missing-folder", 8, WEIGHTS, ["inspect", "w.npy", "--png", "a.png", "--json-file",
                                                       "nodir/deeper/d.json"], 1, ("--json-file nodir/deeper/d.json",)),
    Case("save-weights-is-input", 8, qkv(), ["dot", *QKV, "--save-weights", "k.npy"], 2, ("--save-weights k.npy",)),
    Case("save-weights-is-input-spelled-otherwise", 8, qkv(), ["dot", *QKV, "--save-weights", "./sub/../q.npy"], 2,
         ("--save-weights ./sub/../q.npy",), bug=None),
    Case("save-weights-symlink-to-input", 8, all_of(qkv(), symlink("sl.npy", "q.npy")),
         ["scaled", *QKV, "--save-weights", "sl.npy"], 2, ("--save-weights sl.npy",)),
    Case("json-file-is-input", 8, WEIGHTS, ["inspect", "w.npy", "--json-file", "w.npy"], 2, ("--json-file w.npy",)),
    Case("compare-json-file-is-input", 8, TWO_WEIGHTS, ["compare", "w.npy", "w2.npy", "--json-file", "w2.npy"], 2,
         ("--json-file w2.npy", "input")),
    Case("save-params-is-params", 8, all_of(qkv(), npz("p.npz", W_a=ONES((3, 3)))),
         ["general", *QKV, "--params", "p.npz", "--save-params", "p.npz"], 2, ("--save-params p.npz",)),
    Case("labels-file-as-output", 8, all_of(npy("w.npy", attention(3, 3)), text("t.txt", "a\nb\nc\n")),
         ["inspect", "w.npy", "--labels", "t.txt", "--json-file", "t.txt"], 2, ("--json-file t.txt",)),
    Case("png-is-a-folder", 8, all_of(WEIGHTS, folder_named("a.png")), ["inspect", "w.npy", "--png", "a.png"], 2,
         ("--png a.png", "directory")),
    Case("same-output-twice", 8, WEIGHTS, ["inspect", "w.npy", "--png", "a.png", "--map-png", "a.png"], 2,
         ("--map-png a.png", "--png")),
    Case("output-is-dev-null-fifo", 8, all_of(WEIGHTS, fifo("out.json")),
         ["inspect", "w.npy", "--png", "a.png", "--json-file", "out.json"], 1, ("--json-file out.json",)),
    Case("output-name-too-long", 8, WEIGHTS, ["inspect", "w.npy", "--json-file", "d.json", "--png", LONG_NAME], 1,
         ("--png", "too long")),
    Case("inspect-write-fails-after-a-png", 8, npy("w.npy", attention(2, 40, 40)),  # a.png ~33 kB, m.png ~67 kB
         ["inspect", "w.npy", "--png", "a.png", "--map-png", "m.png", "--json-file", "d.json", "--quiet"], 1,
         ("m.png", "cannot write"), fsize=48 * 1024),
    Case("compute-write-fails-after-arrays", 8, qkv(),  # the arrays and parameters come before the figure
         ["general", *QKV, "--save-weights", "w.npy", "--save-params", "p.npz", "--png", "a.png", "--json-file",
          "d.json", "--quiet"], 1, ("a.png", "cannot write"), fsize=12 * 1024, tf=True),
    Case("compare-write-fails-midway", 8,
         all_of(npy("a.npy", attention(40, 40)), npy("b.npy", attention(40, 40, seed=1))),
         ["compare", "a.npy", "b.npy", "--json-file", "d.json", "--png", "diff.png", "--quiet"], 1,
         ("diff.png",), fsize=16 * 1024),
]

CASES = [*CLASS_1, *CLASS_2, *CLASS_3, *CLASS_4, *CLASS_5, *CLASS_6, *CLASS_7, *CLASS_8]
BY_NAME = {case.name: case for case in CASES}


# ----------------------------------------------------------------------------------------------
# Running: every selected case, four at a time, once per module


@pytest.fixture(scope="module")
def results(request, tmp_path_factory) -> dict[str, tuple[Result, Path]]:
    wanted = {item.callspec.params["name"] for item in request.session.items
              if item.module is request.module and hasattr(item, "callspec") and "name" in item.callspec.params}
    base = tmp_path_factory.mktemp("hostile")
    folders = {}
    for case in CASES:
        if case.name in wanted:
            folders[case.name] = base / case.name
            folders[case.name].mkdir()
            if case.build is not None:
                case.build(folders[case.name])
    io_folder = tmp_path_factory.mktemp("hostile-io")
    start = time.perf_counter()
    # the few slow cases (TensorFlow, torch) first, so that the quick ones fill the gaps
    order = sorted(folders, key=lambda name: (not BY_NAME[name].tf, ".pt" not in str(BY_NAME[name].argv)))
    results = run_cases([BY_NAME[name] for name in order], folders, io_folder)
    out = {name: (results[name], folders[name]) for name in folders}
    wall = time.perf_counter() - start
    slowest = sorted(out.items(), key=lambda kv: -kv[1][0].cpu)[:int(os.environ.get("HOSTILE_SLOWEST", 5))]
    print(f"\nhostile corpus: {len(out)} cases in {wall:.1f} s wall, {sum(r.cpu for r, _ in out.values()):.1f} s CPU; "
          "most CPU: " + ", ".join(f"{name} {r.cpu:.1f} s" for name, (r, _) in slowest))
    return out


def _raw_controls(data: bytes) -> list[str]:
    """C0 controls but the line feed, DEL and C1 controls (decoded: UTF-8 continuation bytes are fine)."""
    found = {f"0x{b:02x}" for b in data if b < 0x20 and b != 0x0A}
    found |= {f"U+{ord(c):04X}" for c in data.decode("utf-8", "replace") if 0x7F <= ord(c) <= 0x9F}
    return sorted(found)


def check_case(case: Case, result: Result, folder: Path) -> None:
    shown = result.show()
    assert not result.timed_out, f"no answer within {TIMEOUT} s\n{shown}"
    assert result.code == case.code, shown
    for name, data in (("stdout", result.stdout), ("stderr", result.stderr)):
        data.decode("utf-8")  # strict: bytes of file names that are not UTF-8 are escaped, never passed through
        assert not _raw_controls(data), (name, _raw_controls(data), shown)
        assert b"Traceback" not in data and b"internal error" not in data, shown
    before, after = result.before, result.after
    changed = {name for name, sig in before.items() if after.get(name) != sig}
    assert not changed, (f"inputs changed or removed: {sorted(changed)}", shown)
    new = set(after) - set(before)
    if case.code in (0, 3):
        assert new == set(case.outputs), (f"new files {sorted(new)}, expected {sorted(case.outputs)}", shown)
        for word in case.words:  # the results (stdout) or the informational lines (stderr)
            assert word in result.out or word in result.err, (word, shown)
    else:
        assert new == set(case.outputs), (f"left behind: {sorted(new - set(case.outputs))}", shown)
        if case.one_line:
            lines = result.err.strip("\n").split("\n")
            assert 1 <= len(lines) <= 2 and lines[0].startswith(ERROR), shown
            assert result.stdout == b"", shown
            for word in case.words:
                assert word in result.err, (word, shown)
    if case.check is not None:
        case.check(result, folder)


def _param(case: Case):
    marks = [pytest.mark.xfail(strict=True, reason=f"bug: {case.bug}")] if case.bug else []
    return pytest.param(case.name, id=case.name, marks=marks)


@pytest.mark.parametrize("name", [_param(c) for c in CASES])
def test_hostile_case(name, results):
    result, folder = results[name]
    check_case(BY_NAME[name], result, folder)


def test_the_corpus_covers_the_issue():
    assert len(CASES) >= 70 and len(BY_NAME) == len(CASES)
    per_class = {n: sum(c.cls == n for c in CASES) for n in range(1, 9)}
    assert all(count >= 5 for count in per_class.values()), per_class
    assert sum(c.tf for c in CASES) < 12  # cases that import TensorFlow (~5 s each)
    words = " ".join(os.fsdecode(a) if isinstance(a, bytes) else a for c in CASES for a in c.argv)
    for ext in (".npy", ".npz", ".json", ".safetensors", ".h5", ".pt"):
        assert ext in words, ext
    commands = {c.argv[0] for c in CASES if c.argv}
    assert commands >= {"scaled", "dot", "multihead", "self", "local", "sparse", "hard", "structured", "pooling",
                        "coattention", "hierarchical", "bidirectional", "inspect", "compare", "batch"}


def test_a_forked_run_is_what_a_fresh_process_gives(tmp_path, request):
    """The harness (tests/forked_runs.py) against ``subprocess.run([python, "-m", "attnviz", ...])``: the same exit
    code, stdout and stderr, for a success, bad data, bad usage, a case reading standard input, and a case that
    computes (forked from the process that has imported TensorFlow). The forked runs are the corpus's own (the
    module fixture's, where those cases were collected); the harness runs the others here."""
    picks = [next(c for c in CASES if not c.tf and c.code == code and ".pt" not in str(c.argv) and c.build)
             for code in (0, 1, 2)]
    picks.append(next(c for c in CASES if not c.tf and c.stdin and c.code != 0))
    picks.append(min((c for c in CASES if c.tf and c.code == 0), key=lambda c: len(c.outputs)))  # forked after TF
    corpus = request.getfixturevalue("results")
    forked = {case.name: corpus[case.name][0] for case in picks if case.name in corpus}
    folders = {}
    for case in picks:
        for how in ("forked", "fresh"):
            if how == "forked" and case.name in forked:
                continue
            (tmp_path / how / case.name).mkdir(parents=True)
            if case.build is not None:
                case.build(tmp_path / how / case.name)
        folders[case.name] = tmp_path / "forked" / case.name
    if len(forked) < len(picks):
        (tmp_path / "io").mkdir()
        forked.update(run_cases([c for c in picks if c.name not in forked], folders, tmp_path / "io"))
    for case in picks:
        fresh = subprocess.run([sys.executable, "-m", "attnviz", *case.argv], cwd=tmp_path / "fresh" / case.name,
                               input=case.stdin, capture_output=True, timeout=TIMEOUT, env=ENV)
        got = forked[case.name]
        assert (got.code, got.stdout, got.stderr) == (fresh.returncode, fresh.stdout, fresh.stderr), case.name
        assert got.code == case.code

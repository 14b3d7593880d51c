"""The layer x head grid of a BERT-base-sized dump: `attnviz inspect dump.npz --png grid.png` (a whole
process, tables and all) beside `benchmarks/grid_yardstick.py`, a hand-written NumPy + matplotlib
script drawing the same grid (one axes per head), measured in the same run. The two alternate,
``--repeat`` times each; the fastest of each is compared (the machine is shared and noisy).

    python benchmarks/grid.py [--layers 12] [--heads 12] [--length 512] [--repeat 3] [--keep DIR]
    python benchmarks/grid.py --memory    # also: a 24 x 16 grid of 1024 x 1024 maps, peak memory

The dump is one .npz holding ``[layers, 1, heads, L, L]`` float32 weights with the patterns of
BERT's heads (previous/next token, self, [CLS] and [SEP] sinks, punctuation stripes, local, broad).
With ``--memory``, `attnviz inspect --png` on a memory-mapped [24, 1, 16, 1024, 1024] .npy (1.5 GiB;
a sparse file) is compared in peak resident memory with the same command without --png.

Then the same command through a warm worker (``attnviz serve --detach`` in a private runtime folder, the
console script's start and the round trip included; the worker's count of requests checked).

Target: attnviz <= 0.4x the yardstick's time cold, <= 0.25 s through the worker; the 24 x 16 grid within
one layer (64 MiB) plus the picture over the run without --png.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent

WRITE_DUMP = """
import sys
import numpy as np

layers, heads, n, path = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
rng = np.random.default_rng(0)
i = np.arange(n)
marks = np.sort(rng.choice(np.arange(1, n - 1), size=max(1, n // 24), replace=False))  # punctuation-like keys
kinds = ["broad", "previous", "next", "self", "cls", "sep", "marks", "local"]
w = np.empty((layers, 1, heads, n, n), np.float32)
for li in range(layers):
    for hi in range(heads):
        kind = kinds[rng.integers(len(kinds))]
        s = rng.standard_normal((n, n), dtype=np.float32) * np.float32(0.8 + 0.1 * li)
        strength = np.float32(rng.uniform(3, 9))
        if kind == "previous":
            s[i[1:], i[1:] - 1] += strength
        elif kind == "next":
            s[i[:-1], i[:-1] + 1] += strength
        elif kind == "self":
            s[i, i] += strength
        elif kind == "cls":
            s[:, 0] += strength
        elif kind == "sep":
            s[:, n - 1] += strength
        elif kind == "marks":
            s[:, marks] += strength * np.float32(0.6)
        elif kind == "local":
            s -= np.float32(0.05) * np.abs(i[:, None] - i[None, :]).astype(np.float32)
        s -= s.max(axis=1, keepdims=True)
        np.exp(s, out=s)
        s /= s.sum(axis=1, keepdims=True)
        w[li, 0, hi] = s
np.savez(path, attentions=w)
"""

WRITE_BIG = """
import sys
import numpy as np

path = sys.argv[1]
w = np.lib.format.open_memmap(path, mode="w+", dtype=np.float32, shape=(24, 1, 16, 1024, 1024))  # sparse
eye = np.eye(1024, dtype=np.float32)
for li in range(0, 24, 4):  # a few real heads; the rest of the file is holes (zeros)
    w[li, 0, li % 16] = eye
w.flush()
"""


#: every run with its modules' bytecode written and reused, as an installed package has it (pip compiles it):
#: an environment that forbids writing it (PYTHONDONTWRITEBYTECODE) would have each process compile them again
BASE = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
#: cold runs: each its own process, whatever worker the user has running
COLD = {**BASE, "ATTNVIZ_NO_SERVER": "1"}


def run(cmd: list[str], env: dict[str, str] = COLD) -> tuple[float, float]:
    """(seconds, peak resident MiB) of a child process, from wait4's rusage; stdout discarded."""
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    assert proc.stderr is not None
    err = proc.stderr.read()
    _, status, usage = os.wait4(proc.pid, 0)
    seconds = time.perf_counter() - start
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{err.decode(errors='replace')}")
    return seconds, usage.ru_maxrss / 1024


def served(env: dict[str, str]) -> int:
    status = subprocess.run([sys.executable, "-m", "attnviz", "serve", "--status"], env=env, capture_output=True,
                            text=True, check=True).stdout
    return int(re.search(r"(\d+) requests served", status).group(1))  # type: ignore[union-attr]


def warm(folder: Path, ours: list[str], repeat: int) -> list[float]:
    """The same command through a warm worker (``attnviz serve --detach`` in a private runtime folder), as a
    user runs it: the console script's process start and the round trip included; the worker's warm-up and a
    first request are not timed."""
    runtime = folder / "runtime"
    runtime.mkdir(mode=0o700)
    env = {k: v for k, v in BASE.items() if k != "ATTNVIZ_NO_SERVER"}
    env["ATTNVIZ_RUNTIME_DIR"] = str(runtime)
    subprocess.run([sys.executable, "-m", "attnviz", "serve", "--detach", "--idle-timeout", "10m"], env=env,
                   check=True, capture_output=True)
    try:
        run(ours, env)
        before = served(env)
        times = [run(ours, env)[0] for _ in range(repeat)]
        assert served(env) == before + repeat, "the runs did not go through the worker"
        return times
    finally:
        subprocess.run([sys.executable, "-m", "attnviz", "serve", "--stop"], env=env, capture_output=True)


def memory(folder: Path) -> None:
    big = folder / "big.npy"
    subprocess.run([sys.executable, "-c", WRITE_BIG, str(big)], check=True)
    inspect = [sys.executable, "-m", "attnviz", "inspect", str(big), "--quiet", "--no-table"]
    _, without = run(inspect)
    seconds, with_png = run([*inspect, "--png", str(folder / "big.png")])
    layer = 16 * 1024 * 1024 * 4 / 2**20
    print("24 x 16 grid of 1024 x 1024 maps (1536 MiB float32, memory-mapped):")
    print(f"  inspect without --png    peak {without:7.0f} MiB")
    print(f"  inspect --png            peak {with_png:7.0f} MiB ({seconds:.1f} s): "
          f"{with_png - without:+.0f} MiB; one layer is {layer:.0f} MiB")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--length", type=int, default=512)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--keep", type=Path, default=None, help="copy the two PNGs into this folder")
    parser.add_argument("--memory", action="store_true", help="also measure the 24 x 16 grid's peak memory")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        dump = folder / "dump.npz"
        subprocess.run([sys.executable, "-c", WRITE_DUMP, str(args.layers), str(args.heads), str(args.length),
                        str(dump)], check=True)
        ours = [sys.executable, "-m", "attnviz", "inspect", str(dump), "--png", str(folder / "attnviz.png")]
        theirs = [sys.executable, str(HERE / "grid_yardstick.py"), str(dump), str(folder / "yardstick.png")]
        run(ours)  # warm: the page cache holds the dump, bytecode is compiled
        run(theirs)
        times: dict[str, list[float]] = {"attnviz": [], "yardstick": []}
        peaks: dict[str, float] = {}
        for _ in range(args.repeat):
            for name, cmd in (("attnviz", ours), ("yardstick", theirs)):
                seconds, peak = run(cmd)
                times[name].append(seconds)
                peaks[name] = max(peaks.get(name, 0.0), peak)
        if args.keep is not None:
            args.keep.mkdir(parents=True, exist_ok=True)
            for name in ("attnviz.png", "yardstick.png"):
                shutil.copy(folder / name, args.keep / name)
        shape = f"[{args.layers}, 1, {args.heads}, {args.length}, {args.length}]"
        print(f"inspect --png of a {shape} float32 .npz, whole processes, fastest of {args.repeat} "
              "(all runs in seconds):")
        for name in times:
            runs = ", ".join(f"{t:.2f}" for t in times[name])
            print(f"  {name:10} {min(times[name]):6.2f} s  peak {peaks[name]:5.0f} MiB  ({runs})")
        fastest = min(times["attnviz"]) / min(times["yardstick"])
        median = sorted(times["attnviz"])[len(times["attnviz"]) // 2] / \
            sorted(times["yardstick"])[len(times["yardstick"]) // 2]
        print(f"  attnviz / yardstick: {fastest:.2f}x (fastest), {median:.2f}x (medians); target <= 0.4x")
        through = warm(folder, ours, max(args.repeat, 5))
        runs = ", ".join(f"{t:.3f}" for t in through)
        met = "met" if min(through) <= 0.25 else "not met"
        print(f"  through a warm worker (attnviz serve): {min(through):.3f} s fastest, "
              f"{sorted(through)[len(through) // 2]:.3f} s median ({runs}); target <= 0.25 s: {met}")
        if args.memory:
            memory(folder)


if __name__ == "__main__":
    main()

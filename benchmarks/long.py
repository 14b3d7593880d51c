"""A long sequence in bounded memory: `attnviz scaled` with Lq = Lk = 32768, d = 64, statistics, a
PNG and the JSON document, as a whole process, against the yardstick `long_yardstick.py` (the same
maths in a short TensorFlow script: the weights and output a block of rows at a time, each block's
weights brought back with .numpy() and their entropy taken), measured in the same run: the two
alternate --repeat times and the fastest of each counts. Prints both times, their ratio, the peak
resident memory of each and of `python -c "import tensorflow"` alone; the dense float32 weights
would be Lq * Lk * 4 bytes (4 GiB). Then `attnviz inspect` with checks and a PNG on a saved
32768 x 32768 map (a 4 GiB .npy), beside reading that file once with NumPy.

    python benchmarks/long.py [--length 32768] [--max-memory 512M] [--repeat 2] [--skip-inspect]

Targets: attnviz within 1.3x the yardstick's time; peak resident memory under 1.5 GiB where the
dense weights alone are 4 GiB.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
WRITE_MAP = """
import sys, numpy as np
path, n = sys.argv[1], int(sys.argv[2])
rng = np.random.default_rng(0)
w = np.lib.format.open_memmap(path, mode="w+", dtype=np.float32, shape=(n, n))
for start in range(0, n, 1024):
    block = rng.random((min(1024, n - start), n), dtype=np.float32)
    w[start:start + 1024] = block / block.sum(axis=1, keepdims=True)
w.flush()
"""


def peak_of(cmd: list[str]) -> tuple[float, float]:
    """(seconds, peak resident MiB) of a child process, measured with wait4's rusage."""
    start = time.perf_counter()
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": os.environ.get("TF_CPP_MIN_LOG_LEVEL", "3")}  # no chatter
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, env=env)
    _, status, usage = os.wait4(proc.pid, 0)
    seconds = time.perf_counter() - start
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{' '.join(cmd)} failed")
    return seconds, usage.ru_maxrss / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--length", type=int, default=32768)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--max-memory", default=None)
    parser.add_argument("--repeat", type=int, default=1,
                        help="runs of attnviz and of the yardstick, in turn; the fastest of each counts")
    parser.add_argument("--skip-inspect", action="store_true")
    args = parser.parse_args()
    n, d = args.length, args.dim
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        rng = np.random.default_rng(0)
        for name in "qkv":
            np.save(folder / f"{name}.npy", rng.normal(size=(n, d)).astype(np.float32))
        _, tf_peak = peak_of([sys.executable, "-c", "import tensorflow"])
        qkv = [str(folder / f"{x}.npy") for x in "qkv"]
        cmd = [sys.executable, "-m", "attnviz", "scaled", *qkv,
               "--png", str(folder / "long.png"), "--json-file", str(folder / "long.json"), "--quiet"]
        if args.max_memory:
            cmd += ["--max-memory", args.max_memory]
        yardstick = [sys.executable, str(HERE / "long_yardstick.py"), *qkv]
        runs: dict[str, list[tuple[float, float]]] = {"yardstick": [], "attnviz": []}
        for _ in range(max(1, args.repeat)):
            runs["yardstick"].append(peak_of(yardstick))
            runs["attnviz"].append(peak_of(cmd))
        seconds, peak = min(s for s, _ in runs["attnviz"]), max(p for _, p in runs["attnviz"])
        yard_s, yard_peak = min(s for s, _ in runs["yardstick"]), max(p for _, p in runs["yardstick"])
        if not args.skip_inspect:
            path = folder / "w.npy"
            # written by a child process: a parent that touched 4 GiB would pass its high-water mark
            # of resident memory on to every child started after it (Linux copies it at fork)
            subprocess.run([sys.executable, "-c", WRITE_MAP, str(path), str(n)], check=True)
            read_s, read_peak = peak_of([sys.executable, "-c", f"import numpy; numpy.load({str(path)!r}).max()"])
            insp_s, insp_peak = peak_of([sys.executable, "-m", "attnviz", "inspect", str(path), "--check-rows",
                                         "--check-finite", "--png", str(folder / "w.png"), "--no-table", "--quiet"])
    dense = n * n * 4 / 2**30
    print(f"Lq = Lk = {n}, d = {d}: dense float32 weights would be {dense:.2f} GiB")
    print(f"python -c 'import tensorflow': peak {tf_peak:7.0f} MiB")
    print(f"yardstick (TensorFlow script, weights back block by block, entropy): {yard_s:.1f} s, "
          f"peak {yard_peak:7.0f} MiB")
    print(f"attnviz scaled + stats + PNG + JSON: {seconds:.1f} s = {seconds / yard_s:.2f}x the yardstick "
          f"(target <= 1.3x), peak {peak:7.0f} MiB ({peak / 1024:.2f} GiB; target < 1.5 GiB); "
          f"{peak - tf_peak:.0f} MiB above the TensorFlow import")
    if args.repeat > 1:
        print("  each run, seconds: yardstick " + ", ".join(f"{s:.1f}" for s, _ in runs["yardstick"])
              + "; attnviz " + ", ".join(f"{s:.1f}" for s, _ in runs["attnviz"]))
    if not args.skip_inspect:
        print(f"numpy.load + max of the saved {n}x{n} map: {read_s:6.1f} s, peak {read_peak:7.0f} MiB")
        print(f"attnviz inspect --check-rows --check-finite --png: {insp_s:6.1f} s, peak {insp_peak:7.0f} MiB")


if __name__ == "__main__":
    main()

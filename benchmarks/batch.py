"""Many small jobs: 200 `scaled` jobs through `attnviz batch` vs the same through 200 separate
`attnviz` calls (target: batch at least 20x faster), and vs one TensorFlow import plus the same
computations done directly (target: batch within 1.5x), measured in the same run.

    python benchmarks/batch.py [--jobs 200] [--separate 20]

The separate calls are timed on a sample (--separate) and scaled to the job count, since each costs
a TensorFlow import. Batch and direct runs alternate, --repeat times, and the fastest of each counts.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

DIRECT = """
import sys, numpy as np
import tensorflow as tf
n = int(sys.argv[1]); folder = sys.argv[2]
for i in range(n):
    q, k, v = (tf.constant(np.load(f"{folder}/{x}{i}.npy")) for x in "qkv")
    w = tf.nn.softmax(tf.matmul(q / np.sqrt(q.shape[-1]), k, transpose_b=True), axis=-1)
    o = tf.matmul(w, v)
    w.numpy(); o.numpy()
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=200)
    parser.add_argument("--separate", type=int, default=20, help="separate calls actually timed")
    parser.add_argument("--repeat", type=int, default=3, help="batch and direct runs; the fastest counts")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        lines = []
        for i in range(args.jobs):
            for name, shape in (("q", (2, 16, 32)), ("k", (2, 24, 32)), ("v", (2, 24, 16))):
                np.save(folder / f"{name}{i}.npy", rng.normal(size=shape).astype(np.float32))
            lines.append(json.dumps({"command": "scaled", "args": [f"q{i}.npy", f"k{i}.npy", f"v{i}.npy"],
                                     "options": {"json": f"out{i}.json"}}))
        (folder / "jobs.jsonl").write_text("\n".join(lines) + "\n")

        batch = direct = float("inf")
        for _ in range(args.repeat):  # interleaved, fastest of each: the machine is shared and noisy
            start = time.perf_counter()
            subprocess.run([sys.executable, "-m", "attnviz", "batch", str(folder / "jobs.jsonl"), "--quiet"],
                           check=True)
            batch = min(batch, time.perf_counter() - start)
            start = time.perf_counter()
            subprocess.run([sys.executable, "-c", DIRECT, str(args.jobs), str(folder)], check=True,
                           capture_output=True, text=True)
            direct = min(direct, time.perf_counter() - start)

        start = time.perf_counter()
        for i in range(args.separate):
            subprocess.run([sys.executable, "-m", "attnviz", "scaled", *(str(folder / f"{x}{i}.npy") for x in "qkv"),
                            "--json-file", str(folder / f"sep{i}.json"), "--quiet"], check=True)
        separate = (time.perf_counter() - start) / args.separate * args.jobs

    print(f"{args.jobs} jobs through attnviz batch:                 {batch:7.1f} s")
    print(f"{args.jobs} separate attnviz calls ({args.separate} timed, scaled): {separate:7.1f} s "
          f"-> batch is {separate / batch:.1f}x faster (target >= 20x)")
    print(f"one TensorFlow import + the same maths directly:  {direct:7.1f} s "
          f"-> batch takes {batch / direct:.2f}x that (target <= 1.5x)")


if __name__ == "__main__":
    main()

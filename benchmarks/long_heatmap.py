"""Rendering a long attention map: a 4096 x 4096 map through `attnviz inspect --png` (block-aggregated),
beside the time to only load the same array with NumPy, measured in the same run.

    python benchmarks/long_heatmap.py [--size 4096]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=4096)
    args = parser.parse_args()
    n = args.size
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "w.npy"
        rng = np.random.default_rng(0)
        w = rng.random((n, n), dtype=np.float32)
        w /= w.sum(axis=1, keepdims=True)
        np.save(path, w)
        start = time.perf_counter()
        subprocess.run([sys.executable, "-c", f"import numpy; numpy.load({str(path)!r}).sum()"], check=True)
        baseline = time.perf_counter() - start
        start = time.perf_counter()
        subprocess.run([sys.executable, "-m", "attnviz", "inspect", str(path), "--png", str(Path(tmp) / "w.png"),
                        "--no-table", "--quiet"], check=True)
        render = time.perf_counter() - start
    print(f"load {n}x{n} with numpy (new process):   {baseline:6.2f} s")
    print(f"attnviz inspect --png (new process):     {render:6.2f} s = {render / baseline:.1f}x the load alone")


if __name__ == "__main__":
    main()

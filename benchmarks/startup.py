"""Start-up cost: `attnviz --help` beside `python -c pass`, and a small `attnviz scaled` run beside
`python -c "import tensorflow"` (the floor no TensorFlow tool can beat), measured in the same run.

    python benchmarks/startup.py [--repeat N]

Prints the median wall time of each command over N runs and the ratios. The targets: --help well
under half a second; a small compute run close to the TensorFlow import alone.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = ROOT / "sample_inputs"


def timed(cmd: list[str], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    py = sys.executable
    attnviz = [py, "-m", "attnviz"]
    cases = {
        "python -c pass": [py, "-c", "pass"],
        "attnviz --help": [*attnviz, "--help"],
        'python -c "import tensorflow"': [py, "-c", "import tensorflow"],
        "attnviz scaled (seed example)": [*attnviz, "scaled", str(SAMPLES / "seed_example.npz"), "--quiet"],
        "attnviz scaled (bad file, exit 2)": [*attnviz, "scaled", "missing.npy", "k.npy", "v.npy"],
    }
    results = {}
    for name, cmd in cases.items():
        try:
            results[name] = timed(cmd, args.repeat)
        except subprocess.CalledProcessError as exc:
            if exc.returncode != 2:
                raise
            start = time.perf_counter()
            for _ in range(args.repeat):
                subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT)
            results[name] = (time.perf_counter() - start) / args.repeat
        print(f"{name:36s} {results[name]:7.3f} s", flush=True)
    base, tf = results["python -c pass"], results['python -c "import tensorflow"']
    print()
    print(f"--help:            {results['attnviz --help']:.3f} s = {results['attnviz --help'] / base:.1f}x "
          f"python -c pass (target: well under 0.5 s)")
    print(f"bad input:         {results['attnviz scaled (bad file, exit 2)']:.3f} s "
          f"= {results['attnviz scaled (bad file, exit 2)'] / base:.1f}x python -c pass")
    run = results["attnviz scaled (seed example)"]
    print(f"small scaled run:  {run:.3f} s = {run / tf:.2f}x import tensorflow alone")


if __name__ == "__main__":
    main()

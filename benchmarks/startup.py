"""Start-up cost, measured in one run beside its baselines:

* `attnviz --help` beside `python -c pass`;
* input errors (a missing file, a bad option value) through the console script, beside the same
  errors through Typer's own command (``app()``, whose parameter coercion imports pydantic: the entry
  point before the warm worker work);
* a small `attnviz scaled` run cold (``ATTNVIZ_NO_SERVER=1``) beside `python -c "import tensorflow"`
  (the floor of a cold process), and the same run through a warm worker (`attnviz serve --detach`,
  in a temporary runtime folder), whose stdout must be the cold run's, byte for byte.

    python benchmarks/startup.py [--repeat N] [--no-bytecode-cache]

Every attnviz command runs from a snapshot of the package in a temporary folder (so files edited
while it runs change nothing), in a folder of sample inputs. By default the snapshot gets its bytecode
cache first (one untimed run of each command), as an installed package has; ``--no-bytecode-cache``
keeps ``PYTHONDONTWRITEBYTECODE=1`` and no cache, so every attnviz module is compiled on every run.
Cases run round-robin, N times each; the median and fastest wall time and the median CPU time of the
process (user + system; for a warm run, the client's only) are printed. Targets: warm run <= 0.5 s and >= 8x faster
than cold; input error <= 0.3 s; --help <= 0.25 s.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = ROOT / "sample_inputs"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--no-bytecode-cache", action="store_true",
                        help="run as with PYTHONDONTWRITEBYTECODE=1 and no cache of attnviz's modules")
    args = parser.parse_args()
    py = sys.executable
    with tempfile.TemporaryDirectory(prefix="attnviz-startup-") as tmp:
        tmp_path = Path(tmp)
        src, work, runtime = tmp_path / "src", tmp_path / "work", tmp_path / "run"
        shutil.copytree(ROOT / "attnviz", src / "attnviz", ignore=shutil.ignore_patterns("__pycache__"))
        work.mkdir()
        for name in ("q.npy", "k.npy", "v.npy"):
            shutil.copy(SAMPLES / name, work / name)
        env = {k: v for k, v in os.environ.items()
               if not k.startswith("ATTNVIZ_") and k not in ("PYTHONPATH", "TF_CPP_MIN_LOG_LEVEL", "ATTNVIZ_DEBUG",
                                                             "PYTHONDONTWRITEBYTECODE")}
        env.update(PYTHONPATH=str(src), ATTNVIZ_RUNTIME_DIR=str(runtime))
        if args.no_bytecode_cache:
            env["PYTHONDONTWRITEBYTECODE"] = "1"
        cold_env = {**env, "ATTNVIZ_NO_SERVER": "1"}
        attnviz = [py, "-m", "attnviz"]
        typer_app = [py, "-c", "import sys; from attnviz.cli import app; app(sys.argv[1:], prog_name='attnviz')"]
        small = ["scaled", "q.npy", "k.npy", "v.npy"]
        missing = ["scaled", "missing.npy", "k.npy", "v.npy"]
        bad_value = ["scaled", "q.npy", "k.npy", "v.npy", "--precision", "many"]
        cases = {
            "python -c pass": ([py, "-c", "pass"], env),
            "attnviz --help": ([*attnviz, "--help"], env),
            'python -c "import tensorflow"': ([py, "-c", "import tensorflow"], env),
            "input error: missing file, cold (exit 2)": ([*attnviz, *missing], cold_env),
            "  the same through Typer's app()": ([*typer_app, *missing], cold_env),
            "input error: bad option value, cold (exit 2)": ([*attnviz, *bad_value], cold_env),
            "  the same through Typer's app() ": ([*typer_app, *bad_value], cold_env),
            "input error: missing file, warm worker": ([*attnviz, *missing], env),
            "small scaled run, cold": ([*attnviz, *small], cold_env),
            "small scaled run, warm worker": ([*attnviz, *small], env),
        }

        start = subprocess.run([*attnviz, "serve", "--detach", "--idle-timeout", "30m"], env=env, cwd=work,
                               capture_output=True, text=True, timeout=600)
        if start.returncode:
            sys.exit(f"could not start a worker: {start.stderr}")
        try:
            outputs = {}
            for name, (cmd, case_env) in cases.items():  # untimed: bytecode caches, and the outputs compared
                outputs[name] = subprocess.run(cmd, env=case_env, cwd=work, capture_output=True, timeout=600)
            warm, cold = outputs["small scaled run, warm worker"], outputs["small scaled run, cold"]
            if (warm.stdout, warm.returncode) != (cold.stdout, cold.returncode):
                sys.exit("the warm worker's stdout differs from the cold run's")
            served_before = _served(attnviz, env, work)
            times: dict[str, list[float]] = {name: [] for name in cases}
            cpu: dict[str, list[float]] = {name: [] for name in cases}
            for _ in range(args.repeat):
                for name, (cmd, case_env) in cases.items():
                    before = resource.getrusage(resource.RUSAGE_CHILDREN)
                    t0 = time.perf_counter()
                    subprocess.run(cmd, env=case_env, cwd=work, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                   timeout=600)
                    times[name].append(time.perf_counter() - t0)
                    after = resource.getrusage(resource.RUSAGE_CHILDREN)
                    cpu[name].append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
            served = _served(attnviz, env, work) - served_before
        finally:
            subprocess.run([*attnviz, "serve", "--stop"], env=env, cwd=work, capture_output=True, timeout=120)

    med = {name: statistics.median(t) for name, t in times.items()}
    print(f"{'':48s} {'wall, median':>13s} {'min':>7s} {'CPU':>7s}")
    for name, t in med.items():
        print(f"{name:48s} {t:11.3f} s {min(times[name]):7.3f} {statistics.median(cpu[name]):7.3f}", flush=True)
    base, tf = med["python -c pass"], med['python -c "import tensorflow"']
    cold_t, warm_t = med["small scaled run, cold"], med["small scaled run, warm worker"]
    miss, miss_typer = med["input error: missing file, cold (exit 2)"], med["  the same through Typer's app()"]
    bad, bad_typer = med["input error: bad option value, cold (exit 2)"], med["  the same through Typer's app() "]
    print()
    print(f"bytecode cache:    {'none (PYTHONDONTWRITEBYTECODE=1)' if args.no_bytecode_cache else 'yes'}")
    print(f"warm worker:       {warm_t:.3f} s = {cold_t / warm_t:.1f}x faster than cold ({cold_t:.3f} s; "
          f"{cold_t / tf:.2f}x import tensorflow); stdout identical; {served} of {2 * args.repeat} warm runs served "
          "by the worker (targets: <= 0.5 s, >= 8x)")
    print(f"input error:       missing file {miss:.3f} s ({miss_typer / miss:.2f}x faster than Typer's app(), "
          f"{miss_typer:.3f} s); bad option value {bad:.3f} s ({bad_typer / bad:.2f}x, {bad_typer:.3f} s) "
          f"(target: <= 0.3 s); through the worker {med['input error: missing file, warm worker']:.3f} s")
    print(f"--help:            {med['attnviz --help']:.3f} s = {med['attnviz --help'] / base:.1f}x python -c pass "
          f"(target: <= 0.25 s)")


def _served(attnviz: list[str], env: dict[str, str], cwd: Path) -> int:
    out = subprocess.run([*attnviz, "serve", "--status"], env=env, cwd=cwd, capture_output=True, text=True,
                         timeout=120).stdout
    for part in out.replace(",", "\n").splitlines():
        if part.strip().endswith("requests served"):
            return int(part.split()[0])
    return 0


if __name__ == "__main__":
    main()

"""Run many ``attnviz`` command lines, each a process of its own, forked from this one after it has imported
what every run of ``python -m attnviz`` imports before it reads its arguments (the command line's app, Typer,
rich, the command modules and the variants; and NumPy). What a run needs beyond that (TensorFlow, matplotlib,
h5py, torch) it imports itself, as a fresh process would.

    python tests/forked_runs.py PLAN.json

PLAN: ``{"workers": 4, "timeout": 90, "address_space": BYTES, "preload": ["tensorflow"],
"jobs": [{"argv": [...], "cwd": FOLDER,
"stdin": FILE, "stdout": FILE, "stderr": FILE, "fsize": BYTES or null}, ...]}``. The results go to stdout as
JSON, one per job in order: ``{"code", "timed_out", "seconds", "cpu"}`` (``code`` as ``subprocess`` gives it:
negative for a signal).

Each job is what ``subprocess.run([python, "-m", "attnviz", *argv], cwd=..., input=..., capture_output=True)``
gives, with the limits the hostile corpus sets before exec: standard input, output and error are pipes of its
own; it runs in its folder with the folder first on ``sys.path`` (``-m`` puts it there); its address space and
file sizes are limited; ``attnviz/__main__.py`` runs as ``__main__`` with ``sys.argv`` as Python decodes it;
and it ends as a process ends (``SystemExit`` through the interpreter's own shutdown: exit handlers, flushing
the streams). It saves each case the ~0.4 s of CPU of starting Python and importing the command line; the
objects of this process are frozen out of the jobs' garbage collection (see ``main``).

With ``"preload": ["tensorflow"]`` (the plan of the cases that compute), this process also imports TensorFlow,
as a run does (``attnviz.device.tensorflow``: its start-up messages silenced, Keras left out) before it forks:
that saves each of those cases ~4 s of CPU; ``["torch"]`` likewise for the cases reading .pt files (~2.5 s).
Forking after TensorFlow's import and before its first operation is safe (its thread pools start with the
first operation, in the child); the test of this harness runs a computing case both ways.
"""

from __future__ import annotations

import gc
import importlib
import json
import os
import resource
import runpy
import sys
import threading
import time

# what every run imports before its command runs (attnviz.cli.console builds the command from the app)
import numpy  # noqa: F401

import attnviz.cli.console  # noqa: F401
import attnviz.variants  # noqa: F401
from attnviz.cli.app import COMMANDS

# and every command's module and the variants, as ``attnviz --help`` imports them (no TensorFlow or matplotlib:
# tests/test_startup.py); a run imports its own command's before it reads its arguments
for _module in {"variants", "compute", *(module for module, _ in COMMANDS.values())}:
    importlib.import_module(f"attnviz.cli.commands.{_module}")


def child(job: dict, address_space: int, stdin: int, stdout: int, stderr: int) -> None:
    """In the forked process: become ``python -m attnviz ARGV`` and never return to the loop below."""
    os.dup2(stdin, 0)
    os.dup2(stdout, 1)
    os.dup2(stderr, 2)
    os.closerange(3, 1 << 16)  # the other jobs' pipes, as close_fds=True
    os.chdir(job["cwd"])
    resource.setrlimit(resource.RLIMIT_AS, (address_space, address_space))
    if job["fsize"] is not None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (job["fsize"], job["fsize"]))
    sys.path[0] = os.getcwd()
    sys.argv = ["attnviz", *job["argv"]]
    runpy.run_module("attnviz", run_name="__main__", alter_sys=True)
    raise SystemExit(0)


def pump_in(fd: int, data: bytes) -> None:
    try:
        _write_all(fd, data)
    except BrokenPipeError:  # the job did not read all of it, as subprocess.run allows
        pass
    finally:
        os.close(fd)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def pump_out(fd: int, path: str) -> None:
    with open(path, "wb") as f:
        while chunk := os.read(fd, 1 << 16):
            f.write(chunk)
    os.close(fd)


def main(plan_path: str) -> None:
    with open(plan_path) as f:
        plan = json.load(f)
    jobs, workers, timeout, address_space = plan["jobs"], plan["workers"], plan["timeout"], plan["address_space"]
    for name in plan.get("preload", []):
        if name == "tensorflow":
            from attnviz.device import tensorflow

            tensorflow()
        elif name == "torch":
            import torch  # noqa: F401
        else:
            raise SystemExit(f"forked_runs.py: cannot preload {name!r}")
    # what this process has made stays out of the garbage collector's passes in the jobs (gc.freeze: the
    # permanent generation), as Python's documentation advises before forking: a pass over TensorFlow's or the
    # command line's objects in a job wrote to every page holding one (reference counts, the collector's own
    # fields), copying it from this process: ~60% of the CPU of a job forked after TensorFlow, ~35% of one that
    # fails early. The jobs' own objects are collected as in a fresh process.
    gc.freeze()
    results: list[dict | None] = [None] * len(jobs)
    running: dict[int, tuple[int, float, list[threading.Thread]]] = {}  # pid -> (job, start, pumps)
    waiting = list(range(len(jobs)))
    while waiting or running:
        while waiting and len(running) < workers:
            i = waiting.pop(0)
            job = jobs[i]
            with open(job["stdin"], "rb") as f:
                data = f.read()
            (in_r, in_w), (out_r, out_w), (err_r, err_w) = os.pipe(), os.pipe(), os.pipe()
            pid = os.fork()
            if pid == 0:
                child(job, address_space, in_r, out_w, err_w)  # ends the process
            for fd in (in_r, out_w, err_w):
                os.close(fd)
            pumps = [threading.Thread(target=pump_in, args=(in_w, data)),
                     threading.Thread(target=pump_out, args=(out_r, job["stdout"])),
                     threading.Thread(target=pump_out, args=(err_r, job["stderr"]))]
            for t in pumps:
                t.start()
            running[pid] = (i, time.perf_counter(), pumps)
        time.sleep(0.005)
        for pid, (i, start, pumps) in list(running.items()):
            done, status, usage = os.wait4(pid, os.WNOHANG)
            seconds = time.perf_counter() - start
            if done == 0:
                if seconds > timeout and results[i] is None:
                    os.kill(pid, 9)
                    results[i] = {"timed_out": True}
                continue
            for t in pumps:
                t.join()
            del running[pid]
            timed_out = bool(results[i] and results[i]["timed_out"])
            results[i] = {"code": None if timed_out else os.waitstatus_to_exitcode(status), "timed_out": timed_out,
                          "seconds": seconds, "cpu": usage.ru_utime + usage.ru_stime}
    json.dump(results, sys.stdout)


if __name__ == "__main__":
    main(sys.argv[1])

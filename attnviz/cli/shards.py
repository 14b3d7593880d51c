"""Spreading a batch over a scheduler's tasks: which shard this is, which jobs it runs, and the results
manifest that records, resumes and merges them.

**Shards.** ``--shard INDEX/COUNT`` names the shard; ``--shard auto`` reads it from the scheduler:

* Slurm job arrays: ``SLURM_ARRAY_TASK_ID`` with ``SLURM_ARRAY_TASK_MIN``, ``SLURM_ARRAY_TASK_MAX`` and
  ``SLURM_ARRAY_TASK_STEP`` (``--array=1-7:2`` runs tasks 1, 3, 5, 7: shards 0..3 of 4), checked against
  ``SLURM_ARRAY_TASK_COUNT``; with only ``SLURM_ARRAY_TASK_COUNT``, task ids run from 0.
* Kubernetes Indexed Jobs: ``JOB_COMPLETION_INDEX`` (0 .. completions - 1), the count from ``--shard
  auto/N`` or ``ATTNVIZ_SHARD_COUNT`` (the Job's ``completions``).

``--shard auto/N`` also checks N against what Slurm says. Anything missing or inconsistent is a usage
error (exit 2) that names the variables.

**Partition.** Every shard lists the same jobs; each job has a key, its command line as it runs. The
jobs are sorted by key (ties keep their order), and the job at position p of that order belongs to
shard p mod COUNT. So the shards are disjoint, together they are every job, their sizes differ by at
most one, and the order a glob, ``find`` or a jobs file lists the jobs in does not matter.

**Results manifest** (``--results FILE.jsonl``): one JSON line per finished job, written with one
``write()`` on a file opened with ``O_APPEND`` while holding an exclusive ``flock``, so threads and
processes sharing the file never interleave lines. A line without its line feed at the end of the
file (a process killed while writing it) is cut off, under the same lock, before the next line is
written, and ignored when the file is read.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from attnviz.errors import OutputError, UsageError

SLURM_VARIABLES = ("SLURM_ARRAY_TASK_ID", "SLURM_ARRAY_TASK_COUNT", "SLURM_ARRAY_TASK_MIN", "SLURM_ARRAY_TASK_MAX",
                   "SLURM_ARRAY_TASK_STEP")
#: exit codes of a finished job that --resume keeps: success, and checks that ran and failed
COMPLETE_CODES = (0, 3)
#: fields of a results line that differ from run to run of the same job
TIMING_FIELDS = ("seconds", "finished")


def _int(env: Mapping[str, str], name: str) -> int | None:
    value = env.get(name)
    if value is None or value.strip() == "":
        return None
    try:
        return int(value.strip())
    except ValueError:
        raise UsageError(f"--shard auto: {name}={value!r} is not an integer.") from None


def parse_shard(text: str | None, env: Mapping[str, str] | None = None) -> tuple[int, int]:
    """(index, count) of ``--shard INDEX/COUNT``, ``--shard auto`` or ``--shard auto/N``; (0, 1) without."""
    if text is None:
        return 0, 1
    if text == "auto" or text.startswith("auto/"):
        given = None
        if text != "auto":
            try:
                given = int(text[5:])
            except ValueError:
                raise UsageError(f"--shard {text!r}: expected auto or auto/COUNT, e.g. auto/8.") from None
            if given < 1:
                raise UsageError(f"--shard {text}: COUNT is at least 1.")
        return auto_shard(os.environ if env is None else env, given)
    try:
        index, count = (int(p) for p in text.split("/"))
    except ValueError:
        raise UsageError(f"--shard {text!r}: expected INDEX/COUNT (e.g. 0/4), auto or auto/COUNT.") from None
    if count < 1 or not 0 <= index < count:
        raise UsageError(f"--shard {text}: INDEX runs from 0 to COUNT - 1.")
    return index, count


def auto_shard(env: Mapping[str, str], given: int | None = None) -> tuple[int, int]:
    """The shard a scheduler's variables name (see the module)."""
    task = _int(env, "SLURM_ARRAY_TASK_ID")
    k8s = _int(env, "JOB_COMPLETION_INDEX")
    if task is not None and k8s is not None:
        raise UsageError("--shard auto: both SLURM_ARRAY_TASK_ID and JOB_COMPLETION_INDEX are set; give --shard "
                         "INDEX/COUNT.")
    if task is not None:
        return _slurm(env, task, given)
    if k8s is not None:
        env_count = _int(env, "ATTNVIZ_SHARD_COUNT")
        if given is not None and env_count is not None and env_count != given:
            raise UsageError(f"--shard auto/{given}: ATTNVIZ_SHARD_COUNT={env_count} says otherwise.")
        found = given if given is not None else env_count
        if found is None:
            raise UsageError("--shard auto: JOB_COMPLETION_INDEX is set but not the number of shards; give --shard "
                             "auto/N or ATTNVIZ_SHARD_COUNT=N (N = the Job's completions).")
        count = found
        if count < 1:
            raise UsageError(f"--shard auto: ATTNVIZ_SHARD_COUNT={count}; it is at least 1.")
        index = k8s
        if not 0 <= index < count:
            raise UsageError(f"--shard auto: JOB_COMPLETION_INDEX={index} is not in 0..{count - 1} "
                             f"({count} shards).")
        return index, count
    raise UsageError("--shard auto: no scheduler variables (SLURM_ARRAY_TASK_ID of a Slurm job array, or "
                     "JOB_COMPLETION_INDEX of a Kubernetes Indexed Job); give --shard INDEX/COUNT.")


def _slurm(env: Mapping[str, str], task: int, given: int | None) -> tuple[int, int]:
    lo, hi = _int(env, "SLURM_ARRAY_TASK_MIN"), _int(env, "SLURM_ARRAY_TASK_MAX")
    step = _int(env, "SLURM_ARRAY_TASK_STEP")
    total = _int(env, "SLURM_ARRAY_TASK_COUNT")
    state = " ".join(f"{name}={env[name]}" for name in SLURM_VARIABLES if env.get(name))
    if step is not None and step < 1:
        raise UsageError(f"--shard auto: SLURM_ARRAY_TASK_STEP={step}; it is at least 1.")
    step = step or 1
    if lo is None and hi is None:
        count = total if total is not None else given
        if count is None:
            raise UsageError(f"--shard auto: {state} gives no number of tasks (SLURM_ARRAY_TASK_COUNT or "
                             "SLURM_ARRAY_TASK_MIN/MAX); give --shard auto/N.")
        lo, hi, step = 0, count - 1, 1
    elif lo is None or hi is None:
        raise UsageError(f"--shard auto: {state}: SLURM_ARRAY_TASK_MIN and SLURM_ARRAY_TASK_MAX go together.")
    if hi < lo or not lo <= task <= hi or (task - lo) % step:
        raise UsageError(f"--shard auto: {state}: the task id is not one of {lo}..{hi} step {step}.")
    count = (hi - lo) // step + 1
    for name, value in (("SLURM_ARRAY_TASK_COUNT", total), (f"--shard auto/{given}", given)):
        if value is not None and value != count:
            raise UsageError(f"--shard auto: {state}: {name} says {value} tasks, min..max step {count}; for an array "
                             "that is not a range (--array=1,4,9) give --shard INDEX/COUNT.")
    return (task - lo) // step, count


def shard_positions(keys: Sequence[str], index: int, count: int) -> list[int]:
    """The positions (into ``keys``) of the jobs shard ``index`` of ``count`` runs, in list order."""
    order = sorted(range(len(keys)), key=lambda n: keys[n])  # stable: equal keys keep their order
    return sorted(n for p, n in enumerate(order) if p % count == index)


# ---------------------------------------------------------------- the results manifest


def record_key(command: str, args: Sequence[str]) -> str:
    """The identity of a job in a results file: its command line as it ran."""
    return json.dumps([command, *args], ensure_ascii=False)


class ResultsFile:
    """A JSON Lines file that jobs' results are appended to, a line at a time (see the module)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.repaired = 0  # torn lines cut off
        self._lock = threading.Lock()
        try:
            self._fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o666)
        except OSError as exc:
            raise OutputError(f"--results {path}: cannot open it ({exc.strerror or exc}).") from None
        if not os.path.isfile(path):
            os.close(self._fd)
            raise UsageError(f"--results {path}: not a regular file.")

    def close(self) -> None:
        os.close(self._fd)

    def __enter__(self) -> ResultsFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _flock(self, exclusive: bool) -> None:
        try:
            import fcntl
        except ImportError:  # not POSIX: threads are still kept apart by self._lock
            return
        fcntl.flock(self._fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_UN)

    def _repair(self) -> None:
        """Cut off a last line that has no line feed (its writer died while writing it)."""
        size = os.fstat(self._fd).st_size
        if size == 0 or os.pread(self._fd, 1, size - 1) == b"\n":
            return
        end = size
        while end > 0:
            start = max(0, end - 65536)
            chunk = os.pread(self._fd, end - start, start)
            cut = chunk.rfind(b"\n")
            if cut >= 0:
                os.ftruncate(self._fd, start + cut + 1)
                break
            end = start
        else:
            os.ftruncate(self._fd, 0)
        self.repaired += 1

    def _locked(self, action: Any) -> Any:
        with self._lock:
            self._flock(True)
            try:
                return action()
            finally:
                self._flock(False)

    def repair(self) -> None:
        try:
            self._locked(self._repair)
        except OSError as exc:
            raise OutputError(f"--results {self.path}: cannot write ({exc.strerror or exc}).") from None

    def append(self, record: Mapping[str, Any]) -> None:
        data = (json.dumps(record, ensure_ascii=False, allow_nan=False) + "\n").encode("utf-8")

        def write() -> None:
            self._repair()
            view = memoryview(data)
            while view:  # one write() in practice; the rest of a short write still under the lock
                view = view[os.write(self._fd, view):]

        try:
            self._locked(write)
        except OSError as exc:
            raise OutputError(f"--results {self.path}: cannot write ({exc.strerror or exc}).") from None


def read_results(path: str) -> tuple[dict[str, dict[str, Any]], int]:
    """The last complete record of every job in a results file (by ``record_key``), and how many lines
    were unreadable (a torn last line, or not a record). No file: nothing recorded."""
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        return {}, 0
    except OSError as exc:
        raise OutputError(f"--results {path}: cannot read it ({exc.strerror or exc}).") from None
    records: dict[str, dict[str, Any]] = {}
    bad = 0
    lines = data.split(b"\n")
    if lines[-1]:
        bad += 1  # a last line without its line feed: torn
    for raw in lines[:-1]:
        if not raw.strip():
            continue
        try:
            rec = json.loads(raw)
            key = record_key(rec["command"], rec["args"])
        except (ValueError, KeyError, TypeError):
            bad += 1
            continue
        if isinstance(rec, dict):
            records[key] = rec
    return records, bad


def is_complete(record: Mapping[str, Any] | None, outputs: Sequence[str]) -> bool:
    """Whether a job recorded in a results file is done: it finished with exit code 0 or 3, every file
    it recorded exists with the size recorded, and (after exit 0) every output it names is among them."""
    if not record or record.get("exit_code") not in COMPLETE_CODES:
        return False
    recorded = record.get("outputs") or []
    try:
        for out in recorded:
            if os.stat(out["path"]).st_size != out["bytes"]:
                return False
    except (OSError, KeyError, TypeError):
        return False
    if record.get("exit_code") == 0:
        paths = {out["path"] for out in recorded}
        return all(p in paths for p in outputs)
    return True


def remove_leftovers(path: str) -> int:
    """Remove the hidden staged and partial files a killed run left beside output ``path`` (see
    ``attnviz.cli.options.StagedOutputs`` and ``attnviz.io.write_atomic``). Only for a job about to be
    run again; names longer than the staging prefix are left alone."""
    import glob as globbing

    folder, name = os.path.split(path)
    if not name or len(name) > 60:
        return 0
    suffix = os.path.splitext(name)[1]
    base = globbing.escape(os.path.join(folder, ""))
    patterns = [f"{base}.{globbing.escape(name)}.*.staged{globbing.escape(suffix)}",
                f"{base}..{globbing.escape(name)}.*.part", f"{base}.{globbing.escape(name)}.*.part"]
    removed = 0
    for pattern in patterns:  # a pattern whose name starts with "." matches hidden files
        for leftover in globbing.glob(pattern):
            try:
                os.unlink(leftover)
                removed += 1
            except OSError:
                pass
    return removed

"""Spreading a batch over a scheduler's tasks: which shard this is, and which jobs it runs (the results
manifest that records, resumes and merges them is ``attnviz.batch.results``).

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
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

from attnviz.errors import UsageError

SLURM_VARIABLES = ("SLURM_ARRAY_TASK_ID", "SLURM_ARRAY_TASK_COUNT", "SLURM_ARRAY_TASK_MIN", "SLURM_ARRAY_TASK_MAX",
                   "SLURM_ARRAY_TASK_STEP")


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
    if count < 1:
        raise UsageError(f"--shard {text}: COUNT is the number of shards, at least 1 (--shard 0/4: the first of 4).")
    if not 0 <= index < count:
        raise UsageError(f"--shard {text}: INDEX runs from 0 to {count - 1} for {count} shards "
                         f"(0/{count} the first, {count - 1}/{count} the last).")
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

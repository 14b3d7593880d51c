"""Running a batch (``attnviz batch``): every job of this shard through the runner it is handed, one
at a time or in threads (``--jobs``), each with its own stdout and stderr buffers; the results manifest
written as jobs finish, ``--resume`` and ``--fail-fast``. It prints nothing: ``plan_batch`` says what
will run, ``run_batch`` returns a ``BatchOutcome`` (its ``document`` is the JSON summary), and the
command line shows the progress bar and the summary table.

A job runs exactly as ``attnviz ARGV`` would (``Runner.execute``): the same parsing, messages, exit
codes and files. A job that fails is recorded with its exit code and the last lines of its stderr
(without the ``attnviz: error:`` prefix), and the other jobs run on.
"""

from __future__ import annotations

import io
import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from attnviz import interrupts
from attnviz.batch import Runner
from attnviz.batch.jobs import Job, plan_jobs
from attnviz.batch.results import JobResult, results_record
from attnviz.errors import UsageError
from attnviz.streams import redirected


def run_job(runner: Runner, job: Job) -> JobResult:
    """Run one job through the command line's own code (``runner.execute``), with its own stdout and
    stderr buffers."""
    start = time.perf_counter()
    if job.error:
        return JobResult(job, 2, 0.0, job.error)
    before = {path: _identity(path) for _, path in job.outputs}
    out, err = io.StringIO(), io.StringIO()
    message = None
    with redirected(out, err):
        try:  # usage errors and errors meant for users are worded on the job's stderr by the command line
            code = runner.execute(job.argv)
        except Exception as exc:  # a bug in one job must not end the batch: that job fails, the others run
            code, message = 1, f"internal error: {type(exc).__name__}: {exc}"[:500]
    seconds = time.perf_counter() - start
    if code and message is None:
        lines = [ln for ln in err.getvalue().splitlines() if ln.strip()]
        message = " ".join(ln.removeprefix("attnviz: error: ") for ln in lines[-2:]) or f"exit code {code}"
    document = None
    if job.wants_document and out.getvalue().strip():
        try:
            document = json.loads(out.getvalue())
        except json.JSONDecodeError:
            document = None
    written = []
    for option, path in job.outputs:  # a file is new when it is there and was not, or is another file now
        now = _identity(path)
        if now is not None and now != before.get(path):
            written.append({"option": option, "path": path, "bytes": now[-1]})
    return JobResult(job, code, seconds, message, document, written)


def _identity(path: str) -> tuple[Any, ...] | None:
    """What tells one version of a file from another, its size last ((inode, mtime, size) of a regular file;
    (tag, size) of an object), or None."""
    from attnviz import storage

    return storage.identity(path)


#: how long the main thread waits for a job before a signal that arrived meanwhile is raised (seconds)
WAIT_SLICE = 0.05


def threads_parse_options() -> None:
    """Let several threads parse command lines at once. Typer sets ``PYDANTIC_DISABLE_PLUGINS`` while it builds a
    parameter's adapter and deletes it afterwards unless it was set before: two jobs' threads that both found it
    unset both delete it, and the second failed with ``KeyError: 'PYDANTIC_DISABLE_PLUGINS'`` (an internal error
    in a job of ``batch --jobs N``). Set once before the threads start, it is put back, never deleted. attnviz
    loads no pydantic plugins (pydantic serves Typer's parsing only)."""
    import os

    os.environ.setdefault("PYDANTIC_DISABLE_PLUGINS", "1")


def run_all(runner: Runner, jobs: list[Job], workers: int, fail_fast: bool,
            progress: Callable[[], object] | None) -> Iterator[JobResult]:
    """The results of ``jobs`` as they finish (``workers`` threads: in the order they finish);
    ``progress`` is called once per job finished. With ``fail_fast``, no job starts after one failed.

    Ctrl-C, SIGTERM or SIGHUP (``attnviz.interrupts``) ends the batch: no job starts after it; the job it cut short
    gives no result (its command removed what it had staged; ``--resume`` runs it again); jobs running in
    other threads finish and give theirs; then the interruption is raised again."""
    if workers <= 1:
        for job in jobs:
            result = run_job(runner, job)
            interrupts.raise_received()  # the job was cut short: its command worded it, the batch ends
            with interrupts.deferred():  # a signal while the caller records the result: raised once it has
                if progress is not None:
                    progress()
                yield result
            if fail_fast and not result.ok:
                return
        return
    from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait

    threads_parse_options()
    pending: set[Future[JobResult]] = set()
    done: set[Future[JobResult]] = set()
    queue = list(jobs)
    stop = False
    interrupted: KeyboardInterrupt | None = None
    with ThreadPoolExecutor(max_workers=workers) as pool:
        while True:
            try:
                # the signal lands in wait() (the main thread waits there nearly all the time) or, put off by
                # deferred(), once the finished jobs' results are handed over and recorded: a job whose outputs
                # are written is never left out of the results
                with interrupts.deferred():
                    for future in done:
                        result = future.result()
                        if progress is not None:
                            progress()
                        stop = stop or (fail_fast and not result.ok)
                        yield result
                    done = set()
                    if stop:
                        queue.clear()
                    while queue and not stop and len(pending) < workers:
                        pending.add(pool.submit(run_job, runner, queue.pop(0)))
                    if not pending:
                        break
                # never inside wait(): it takes every pending future's lock in turn, and a signal's exception
                # raised between two of them left a lock held, so that the job finishing that future blocked
                # for ever and the batch hung at its end (seen under load: Ctrl-C to a batch of 3 jobs); the
                # signal is raised between two short waits instead
                with interrupts.deferred():
                    done, pending = wait(pending, timeout=WAIT_SLICE, return_when=FIRST_COMPLETED)
            except KeyboardInterrupt as exc:  # in the main thread: the jobs running in threads finish
                interrupted, stop = interrupted or exc, True
                queue.clear()
    if interrupted is not None:
        raise interrupted


def _same_file(a: str, b: str) -> bool:
    from attnviz import storage

    return storage.same_place(a, b)


@dataclass
class BatchPlan:
    """The jobs of a batch (``plan_batch``): all of them, this shard's, those still to run, and those a
    results manifest records as done (``--resume``)."""

    all_jobs: list[Job]
    jobs: list[Job]  # this shard's
    todo: list[Job]
    before: list[JobResult]  # done before (--resume)
    shard: tuple[int, int]  # (index, count)
    results_path: str | None = None
    each: bool = False  # one job per file (--each): the summary names files, not lines
    resumed: bool = False
    unreadable: int = 0  # lines of the manifest that could not be read
    torn: bool = False  # the manifest's last line was cut short (dropped: its job runs again)


@dataclass
class BatchOutcome:
    """What a batch did: every job's result (this run's and those done before), in the jobs' order."""

    plan: BatchPlan
    results: list[JobResult]  # this run's, as they finished
    seconds: float

    @property
    def everything(self) -> list[JobResult]:
        return sorted([*self.plan.before, *self.results], key=lambda r: r.job.index)

    @property
    def failed(self) -> list[JobResult]:
        return [r for r in self.everything if not r.ok]

    @property
    def not_run(self) -> int:
        """Jobs not run after one failed (--fail-fast)."""
        return len(self.plan.todo) - len(self.results)

    @property
    def ok(self) -> bool:
        return not self.failed and not self.not_run

    def document(self) -> dict[str, Any]:
        """The summary as ``attnviz batch --json`` prints it."""
        index, count = self.plan.shard
        return {
            "jobs": [{"line": r.job.number, "index": r.job.index,
                      **({"path": r.job.path} if r.job.path is not None else {}),
                      "command": r.job.command or None, "status": "ok" if r.ok else "failed",
                      "exit_code": r.exit_code, "error": r.error, "seconds": round(r.seconds, 4),
                      **({"resumed": True} if r.recorded is not None else {}),
                      **({"document": r.document} if r.document is not None else {})} for r in self.everything],
            "total": len(self.plan.jobs), "run": len(self.results), "failed": len(self.failed),
            "skipped": self.not_run, "resumed": len(self.plan.before), "shard": {"index": index, "count": count},
            "seconds": round(self.seconds, 3),
        }


def plan_batch(spec: list[str], each: str | None, shard: str | None, results_path: str | None, resume: bool, *,
               runner: Runner) -> BatchPlan:
    """The jobs of ``attnviz batch`` (``spec`` is JOBS or, with ``each``, the command after --) in this
    shard, less those ``--resume`` finds done in ``results_path`` (hidden staged files a killed run left
    beside this shard's outputs are removed then). Errors of the batch itself (a bad --shard, no jobs
    file, --results naming a file the jobs read or write) are raised as ``AttnvizError``."""
    from attnviz.batch.results import is_complete, read_results, remove_leftovers
    from attnviz.batch.shards import parse_shard, shard_positions

    index, count = parse_shard(shard)
    if resume and results_path is None:
        raise UsageError("--resume: needs --results FILE.jsonl, the record of the jobs done.")
    all_jobs, jobs_file = plan_jobs(spec, each, runner)
    if results_path is not None:
        from attnviz import storage

        if storage.is_url(results_path) and not resume:  # its bucket, before any job runs
            read_results(results_path)
        if jobs_file not in (None, "-") and _same_file(results_path, jobs_file):
            raise UsageError(f"--results {results_path}: that is the jobs file; refusing to write into it.")
        clash = next((p for j in all_jobs for _, p in j.outputs if _same_file(p, results_path)), None)
        if clash is not None:
            raise UsageError(f"--results {results_path}: a job writes that file ({clash}); give another name.")
    jobs = [all_jobs[n] for n in shard_positions([j.key for j in all_jobs], index, count)]
    plan = BatchPlan(all_jobs, jobs, jobs, [], (index, count), results_path, each is not None)
    if resume and results_path is not None:
        records, plan.unreadable, plan.torn = read_results(results_path)
        plan.todo, plan.resumed = [], True
        for job in jobs:
            record = records.get(job.key) if job.argv else None
            if record is not None and is_complete(record, [p for _, p in job.outputs]):
                plan.before.append(JobResult(job, int(record["exit_code"]), float(record.get("seconds") or 0.0),
                                             record.get("error"), recorded=record))
            else:
                plan.todo.append(job)
        for job in jobs:
            for _, path in job.outputs:
                remove_leftovers(path)
    return plan


def run_batch(plan: BatchPlan, *, runner: Runner, workers: int = 1, fail_fast: bool = False,
              progress: Callable[[], object] | None = None) -> BatchOutcome:
    """Run the plan's jobs still to do through ``runner`` (``workers`` threads), appending each result
    to the results manifest as it finishes; ``progress`` is called once per job finished."""
    from attnviz.batch.results import open_results

    start = time.perf_counter()
    results: list[JobResult] = []
    manifest = open_results(plan.results_path) if plan.results_path is not None else None
    try:
        if manifest is not None:
            manifest.repair()
        for result in run_all(runner, plan.todo, workers, fail_fast, progress):
            if manifest is not None:
                manifest.append(results_record(result))
            results.append(result)
    finally:
        if manifest is not None:
            manifest.close()
    return BatchOutcome(plan, results, time.perf_counter() - start)

"""Running a batch (``attnviz batch``): every job of this shard through the runner it is handed, one
at a time or in threads (``--jobs``), each with its own stdout and stderr buffers; the results manifest
written as jobs finish, ``--resume`` and ``--fail-fast``; the progress bar on stderr and the summary (a
table, or JSON with ``--json``) on stdout.

A job runs exactly as ``attnviz ARGV`` would (``Runner.execute``): the same parsing, messages, exit
codes and files. A job that fails is recorded with its exit code and the last lines of its stderr
(without the ``attnviz: error:`` prefix), and the other jobs run on.
"""

from __future__ import annotations

import io
import json
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from attnviz.batch import Runner
from attnviz.batch.jobs import Job, plan_jobs
from attnviz.batch.results import JobResult, results_record
from attnviz.errors import UsageError
from attnviz.streams import err_console, out_console, redirected, stdout


def _inert(text: str) -> str:
    """Text for the summary table with control characters (ESC, CR, BEL, C1 ...) made visible."""
    from attnviz.text import visible

    return visible(text)


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
            written.append({"option": option, "path": path, "bytes": now[2]})
    return JobResult(job, code, seconds, message, document, written)


def _identity(path: str) -> tuple[int, int, int] | None:
    """(inode, mtime, size) of a regular file, or None."""
    import stat

    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return None
    return (st.st_ino, st.st_mtime_ns, st.st_size) if stat.S_ISREG(st.st_mode) else None


def run_all(runner: Runner, jobs: list[Job], workers: int, fail_fast: bool,
            progress: Callable[[], object] | None) -> Iterator[JobResult]:
    """The results of ``jobs`` as they finish (``workers`` threads: in the order they finish);
    ``progress`` is called once per job finished. With ``fail_fast``, no job starts after one failed."""
    if workers <= 1:
        for job in jobs:
            result = run_job(runner, job)
            if progress is not None:
                progress()
            yield result
            if fail_fast and not result.ok:
                return
        return
    from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait

    pending: set[Future[JobResult]] = set()
    queue = list(jobs)
    stop = False
    with ThreadPoolExecutor(max_workers=workers) as pool:
        while queue or pending:
            while queue and not stop and len(pending) < workers:
                pending.add(pool.submit(run_job, runner, queue.pop(0)))
            if not pending:
                break
            done, pending = wait(pending, return_when=FIRST_COMPLETED)
            for future in done:
                result = future.result()
                if progress is not None:
                    progress()
                stop = stop or (fail_fast and not result.ok)
                yield result
            if stop:
                queue.clear()


def _same_file(a: str, b: str) -> bool:
    try:
        return Path(a).resolve() == Path(b).resolve()
    except OSError:
        return False


def run_batch(spec: list[str], each: str | None, shard: str | None, results_path: str | None, resume: bool,
              workers: int, fail_fast: bool, json_out: bool, quiet: bool, *, runner: Runner) -> bool:
    """Run a batch as ``attnviz batch`` does (its options by name: ``spec`` is JOBS or, with ``each``,
    the command after --), every job through ``runner``. True when a job failed or, after one failed
    (``fail_fast``), was not run. Errors of the batch itself (a bad --shard, no jobs file) are raised
    as ``AttnvizError``."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from attnviz.batch.results import ResultsFile, is_complete, read_results, remove_leftovers
    from attnviz.batch.shards import parse_shard, shard_positions

    index, count = parse_shard(shard)
    if resume and results_path is None:
        raise UsageError("--resume: needs --results FILE.jsonl, the record of the jobs done.")
    all_jobs, jobs_file = plan_jobs(spec, each, runner)
    if results_path is not None:
        if jobs_file not in (None, "-") and _same_file(results_path, jobs_file):
            raise UsageError(f"--results {results_path}: that is the jobs file; refusing to write into it.")
        clash = next((p for j in all_jobs for _, p in j.outputs if _same_file(p, results_path)), None)
        if clash is not None:
            raise UsageError(f"--results {results_path}: a job writes that file ({clash}); give another name.")
    jobs = [all_jobs[n] for n in shard_positions([j.key for j in all_jobs], index, count)]
    before: list[JobResult] = []
    todo = jobs
    err = err_console()
    if resume and results_path is not None:
        records, unreadable = read_results(results_path)
        todo = []
        for job in jobs:
            record = records.get(job.key) if job.argv else None
            if record is not None and is_complete(record, [p for _, p in job.outputs]):
                before.append(JobResult(job, int(record["exit_code"]), float(record.get("seconds") or 0.0),
                                        record.get("error"), recorded=record))
            else:
                todo.append(job)
        for job in jobs:  # hidden staged files a killed run left beside this shard's outputs
            for _, path in job.outputs:
                remove_leftovers(path)
        if not quiet:
            err.print(f"resume: {len(before)} of {len(jobs)} jobs done before ({results_path}); running {len(todo)}"
                      + (f"; {unreadable} unreadable line(s) ignored" if unreadable else ""), style="dim")
    start = time.perf_counter()
    results: list[JobResult] = []
    manifest = ResultsFile(results_path) if results_path is not None else None
    try:
        if manifest is not None:
            manifest.repair()

        def finished(result: JobResult) -> JobResult:
            if manifest is not None:
                manifest.append(results_record(result))
            return result

        if quiet or not todo:
            results = [finished(r) for r in run_all(runner, todo, workers, fail_fast, None)]
        else:
            with Progress(TextColumn("batch"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                          console=err, transient=False) as bar:
                task = bar.add_task("jobs", total=len(todo))
                results = [finished(r) for r in run_all(runner, todo, workers, fail_fast, lambda: bar.advance(task))]
    finally:
        if manifest is not None:
            manifest.close()
    seconds = time.perf_counter() - start
    everything = sorted([*before, *results], key=lambda r: r.job.index)
    failed = [r for r in everything if not r.ok]
    not_run = len(todo) - len(results)
    if json_out:
        doc = {
            "jobs": [{"line": r.job.number, "index": r.job.index,
                      **({"path": r.job.path} if r.job.path is not None else {}),
                      "command": r.job.command or None, "status": "ok" if r.ok else "failed",
                      "exit_code": r.exit_code, "error": r.error, "seconds": round(r.seconds, 4),
                      **({"resumed": True} if r.recorded is not None else {}),
                      **({"document": r.document} if r.document is not None else {})} for r in everything],
            "total": len(jobs), "run": len(results), "failed": len(failed), "skipped": not_run,
            "resumed": len(before), "shard": {"index": index, "count": count}, "seconds": round(seconds, 3),
        }
        stdout().write(json.dumps(doc) + "\n")
    elif not quiet:
        from rich.table import Table

        table = Table(title=f"batch: {len(everything) - len(failed)} of {len(jobs)} jobs succeeded in {seconds:.1f} s"
                      + (f" (shard {index}/{count} of {len(all_jobs)})" if count > 1 else ""))
        for column in ("line" if each is None else "file", "command", "status", "seconds", "error"):
            table.add_column(column, justify="right" if column in ("line", "seconds") else "left",
                             overflow="fold")
        for r in everything:
            status = "ok" if r.ok else f"failed ({r.exit_code})"
            table.add_row(str(r.job.number) if each is None else _inert(r.job.path or ""), _inert(r.job.command),
                          status + (", before" if r.recorded is not None else ""), f"{r.seconds:.2f}",
                          _inert(r.error or ""))
        notes = []
        if not_run:
            notes.append(f"{not_run} job(s) not run (--fail-fast)")
        if before:
            notes.append(f"{len(before)} job(s) done before (--resume)")
        if notes:
            table.caption = "; ".join(notes)
        out_console().print(table, crop=False)
    return bool(failed) or not_run > 0

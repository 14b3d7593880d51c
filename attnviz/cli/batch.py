"""``attnviz batch JOBS``: many jobs in one process, so TensorFlow is imported once.

A jobs file is JSON Lines, one job a line (blank lines and lines starting with ``#`` are skipped)::

    {"command": "scaled", "args": ["q.npy", "k.npy", "v.npy"],
     "options": {"causal": true, "png": "a.png", "json": "a.json"}}

Each job runs through the same command as on the command line: ``options`` become the command's
flags (``"causal": true`` is ``--causal``, ``"window": 2`` is ``--window 2``, false and null are left
out, a list repeats the flag), with one difference: ``"json": "a.json"`` writes the JSON document to
that file (``"json": true`` puts it in the batch's --json summary). Relative paths, in ``args`` and in
options that name files, resolve against the jobs file's folder. Jobs run quietly (no tables).

A line that cannot be a job (not UTF-8, not valid JSON, nested too deeply, not an object, wrong types,
option values other than strings, finite numbers, true/false/null or lists of those) fails that job
alone, with a message naming the line; the other jobs run. The jobs file (or ``-``, standard input) is
read like every text input: a regular file, in pieces, at most ``MAX_TEXT_BYTES``.
"""

from __future__ import annotations

import io
import json
import math
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

import typer

from attnviz.cli.options import OUTPUT, checked_option
from attnviz.cli.streams import err_console, out_console, redirected, stdout
from attnviz.errors import InputError, UsageError

#: options whose values are file names, resolved against the jobs file's folder
PATH_OPTIONS = {"png", "json", "json_file", "save_weights", "save_output", "save_params", "params", "mask",
                "key_padding_mask", "map_png", "stats_png", "check_mask", "adjacency", "unary", "from_keras",
                "positions"}
LABEL_OPTIONS = {"labels", "q_labels", "k_labels"}  # a file name, or the labels themselves
#: what an option name in a jobs file looks like (it becomes --name)
OPTION_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_-]{0,63}")
#: how much of a value from a jobs file a message quotes
QUOTED = 60


@dataclass
class Job:
    number: int  # its line in the jobs file, from 1
    command: str = ""
    argv: list[str] = field(default_factory=list)
    error: str | None = None  # the job could not even be read
    wants_document: bool = False


@dataclass
class JobResult:
    job: Job
    exit_code: int
    seconds: float
    error: str | None = None
    document: Any = None

    @property
    def ok(self) -> bool:
        return self.exit_code == 0


def parse_shard(text: str | None) -> tuple[int, int]:
    if text is None:
        return 0, 1
    try:
        index, count = (int(p) for p in text.split("/"))
    except ValueError:
        raise UsageError(f"--shard {text!r}: expected INDEX/COUNT, e.g. 0/4.") from None
    if count < 1 or not 0 <= index < count:
        raise UsageError(f"--shard {text}: INDEX runs from 0 to COUNT - 1.")
    return index, count


def _resolve(value: str, base: Path) -> str:
    """A path as the jobs file gives it, relative to the jobs file's folder exactly as the command line
    takes it relative to the current directory: ``a.npz``, ``a.npz:q``, ``x.safetensors:k``,
    ``run.h5:attn/*`` all become ``BASE/...`` with their key kept (a key follows the file name, so
    joining the folder in front keeps it)."""
    if value == "-" or Path(value).is_absolute():
        return value
    return str(base / value)


def _quoted(value: Any) -> str:
    """A value from a jobs file as a message quotes it: ``repr`` (control characters escaped), shortened."""
    text = repr(value)
    return text if len(text) <= QUOTED else text[: QUOTED - 3] + "..."


def _inert(text: str) -> str:
    """Text for the summary table with control characters (ESC, CR, BEL, C1 ...) made visible."""
    from attnviz.render.text import visible

    return visible(text)


def _scalar_problem(value: Any) -> str | None:
    """Why an option value cannot be a command-line value, or None."""
    if value is None or isinstance(value, (bool, str)):
        return None if not isinstance(value, str) or "\0" not in value else "a string with a NUL byte"
    if isinstance(value, int):
        return None if abs(value) < 10**100 else "an integer too large for an option"
    if isinstance(value, float):
        return None if math.isfinite(value) else "not a finite number"
    return f"a JSON {'object' if isinstance(value, dict) else type(value).__name__}"


def _options_problem(options: dict[str, Any]) -> str | None:
    for name, value in options.items():
        if not OPTION_NAME.fullmatch(name):
            return f"option name {_quoted(name)} is not an option (letters, digits, - and _)"
        for v in value if isinstance(value, list) else [value]:
            problem = _scalar_problem(v)
            if problem is not None:
                return (f'option "{name}": {_quoted(v)} is {problem}; values are strings, finite numbers, '
                        "true, false, null, or a list of those")
    return None


#: options whose values are files a job writes: never the jobs file itself
OUTPUT_PATH_OPTIONS = {"png", "json", "json_file", "save_weights", "save_output", "save_params", "map_png",
                       "stats_png"}


def job_from_line(number: int, line: str, base: Path, commands: set[str], jobs_file: Path | None = None) -> Job:
    """A jobs-file line as a command line (``argv``); a line that cannot be one (for any reason) gives a
    job with an error, and only that job fails. No job may write over ``jobs_file``."""
    from attnviz.formats._base import loads_json

    job = Job(number)
    try:
        spec = loads_json(line)
    except ValueError as exc:
        job.error = f"line {number}: not valid JSON ({exc})."
        return job
    if not isinstance(spec, dict) or not isinstance(spec.get("command"), str):
        job.error = f'line {number}: a job is an object with "command", "args" and "options".'
        return job
    job.command = spec["command"]
    args, options = spec.get("args", []), spec.get("options", {})
    unknown = sorted(set(spec) - {"command", "args", "options"})
    if job.command not in commands:
        job.error = f"line {number}: unknown command {_quoted(job.command)}; one of {', '.join(sorted(commands))}."
        job.command = job.command[:QUOTED]
    elif unknown:
        job.error = (f"line {number}: unknown entries {', '.join(_quoted(u) for u in unknown[:5])}"
                     f"{' ...' if len(unknown) > 5 else ''} (command, args, options).")
    elif not isinstance(args, list) or not all(isinstance(a, str) and "\0" not in a for a in args):
        job.error = f'line {number}: "args" is a list of file names.'
    elif not isinstance(options, dict):
        job.error = f'line {number}: "options" is an object of option names and values.'
    elif "-" in args:
        job.error = f"line {number}: a batch job cannot read standard input ('-')."
    else:
        problem = _options_problem(options)
        if problem is not None:
            job.error = f"line {number}: {problem}."
    if job.error:
        return job
    argv = [job.command, *(_resolve(a, base) for a in args)]
    written: list[tuple[str, str]] = []  # (option, file) of the outputs the job names
    for name, value in options.items():
        key = name.replace("-", "_")
        flag = "--" + key.replace("_", "-")
        if key == "json":
            if value is True:
                job.wants_document = True
                argv.append("--json")
            elif isinstance(value, str):
                argv += ["--json-file", _resolve(value, base)]
                written.append(("json", argv[-1]))
            continue
        values = value if isinstance(value, list) else [value]
        for v in values:
            if v is None or v is False:
                continue
            if v is True:
                argv.append(flag)
                continue
            text = str(v)
            if key in PATH_OPTIONS or (key in LABEL_OPTIONS and (base / text).exists()):
                text = _resolve(text, base)
            if key in OUTPUT_PATH_OPTIONS:
                written.append((name, text))
            argv += [flag, text]
    if jobs_file is not None:
        for name, target in written:
            try:
                same = Path(target).resolve() == jobs_file
            except OSError:
                same = False
            if same:
                job.error = (f"line {number}: {_quoted(name)} {target} is the jobs file itself; refusing to "
                             "overwrite it.")
                return job
    if "quiet" not in options:
        argv.append("--quiet")
    job.argv = argv
    return job


def _jobs_bytes(spec: str) -> tuple[bytes, str, Path]:
    """The jobs file's bytes (bounded, a regular file only), how to name it, and the folder paths resolve in."""
    import sys

    from attnviz.formats._base import MAX_TEXT_BYTES, read_limited, regular_file, size_str

    if spec == "-":
        source = "'-' (<stdin>)"
        stream = sys.stdin
        if stream is None:
            raise InputError(f"{source}: there is no standard input to read.")
        return read_limited(getattr(stream, "buffer", None) or stream, source, what="jobs"), source, Path.cwd()
    path = Path(spec)
    try:
        size = regular_file(path, spec)
    except UsageError as exc:
        if exc.message == f"{spec}: no such file.":
            raise UsageError(f"{spec}: no such jobs file.") from None
        raise
    if size > MAX_TEXT_BYTES:
        raise InputError(f"{spec}: {size_str(size)} of jobs, more than the {size_str(MAX_TEXT_BYTES)} attnviz reads; "
                         "split it, or use --shard.")
    try:
        with open(path, "rb") as fh:
            data = read_limited(fh, spec, what="jobs")
    except OSError as exc:
        raise InputError(f"{spec}: cannot read ({exc.strerror or exc}).") from None
    return data, spec, path.resolve().parent


def read_jobs(spec: str) -> tuple[list[Job], Path]:
    data, source, base = _jobs_bytes(spec)
    jobs_file = None if spec == "-" else Path(spec).resolve()
    nul = data.find(b"\0")
    if nul >= 0:
        raise InputError(f"{source}: holds binary data (a NUL byte at offset {nul}), not JSON Lines jobs.")
    from attnviz.cli.app import app

    commands = {c.name for c in app.registered_commands if c.name and c.name not in ("batch", "variants")}
    jobs = []
    lines = data.removeprefix(b"\xef\xbb\xbf").split(b"\n")
    for number, raw in enumerate(lines, 1):
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            jobs.append(Job(number, error=f"line {number}: not UTF-8 text (byte 0x{raw[exc.start]:02x} at column "
                                         f"{exc.start + 1})."))
            continue
        if line.strip() and not line.lstrip().startswith("#"):
            jobs.append(job_from_line(number, line, base, commands, jobs_file))
    return jobs, base


def run_job(click_command: Any, job: Job) -> JobResult:
    """Run one job through the command line's own code, with its own stdout and stderr buffers."""
    from typer._click.exceptions import ClickException  # Typer vendors Click

    from attnviz.cli.options import usage_message

    start = time.perf_counter()
    if job.error:
        return JobResult(job, 2, 0.0, job.error)
    out, err = io.StringIO(), io.StringIO()
    message = None
    with redirected(out, err):
        try:
            code = click_command.main(args=job.argv, prog_name="attnviz", standalone_mode=False) or 0
        except ClickException as exc:  # the command group words usage errors itself; anything else alike
            code, message = exc.exit_code, usage_message(exc)
        except Exception as exc:  # a bug in one job must not end the batch: that job fails, the others run
            code, message = 1, f"internal error: {type(exc).__name__}: {exc}"[:500]
    if not isinstance(code, int):
        code = 1
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
    return JobResult(job, int(code), seconds, message, document)


def run_all(jobs: list[Job], workers: int, fail_fast: bool, progress: Any | None) -> Iterator[JobResult]:
    import typer.main

    from attnviz.cli.app import app

    click_command = typer.main.get_command(app)
    if workers <= 1:
        for job in jobs:
            result = run_job(click_command, job)
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
                pending.add(pool.submit(run_job, click_command, queue.pop(0)))
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


def batch_command(
    jobs: Annotated[str, typer.Argument(metavar="JOBS", show_default=False,
                                        help="a JSON Lines file of jobs, or - for standard input")],
    shard: Annotated[str | None, typer.Option("--shard", metavar="INDEX/COUNT",
                                              help="run only the jobs whose number modulo COUNT is INDEX "
                                                   "(0-based), e.g. $SLURM_ARRAY_TASK_ID/4")] = None,
    workers: Annotated[int, checked_option(int, "--jobs", "-j", min=1, max=256,
                                           help="run this many jobs at once (threads)")] = 1,
    fail_fast: Annotated[bool, typer.Option("--fail-fast", help="stop at the first job that fails")] = False,
    json_out: Annotated[bool, typer.Option("--json", rich_help_panel=OUTPUT,
                                           help="print the summary as JSON on stdout")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", rich_help_panel=OUTPUT,
                                        help="no progress bar and no summary table")] = False,
) -> None:
    """Run many jobs (a JSON Lines file) in one process: TensorFlow is imported once."""
    from attnviz.cli.app import user_errors

    with user_errors():
        failed = run_batch(jobs, shard, workers, fail_fast, json_out, quiet)
    if failed:
        raise typer.Exit(1)


def run_batch(spec: str, shard: str | None, workers: int, fail_fast: bool, json_out: bool, quiet: bool) -> bool:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    index, count = parse_shard(shard)
    all_jobs, _ = read_jobs(spec)
    jobs = [job for n, job in enumerate(all_jobs) if n % count == index]
    start = time.perf_counter()
    results: list[JobResult] = []
    if quiet or not jobs:
        results = list(run_all(jobs, workers, fail_fast, None))
    else:
        with Progress(TextColumn("batch"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                      console=err_console(), transient=False) as bar:
            task = bar.add_task("jobs", total=len(jobs))
            results = list(run_all(jobs, workers, fail_fast, lambda: bar.advance(task)))
    seconds = time.perf_counter() - start
    results.sort(key=lambda r: r.job.number)
    failed = [r for r in results if not r.ok]
    if json_out:
        doc = {
            "jobs": [{"line": r.job.number, "command": r.job.command or None, "status": "ok" if r.ok else "failed",
                      "exit_code": r.exit_code, "error": r.error, "seconds": round(r.seconds, 4),
                      **({"document": r.document} if r.document is not None else {})} for r in results],
            "total": len(jobs), "run": len(results), "failed": len(failed), "skipped": len(jobs) - len(results),
            "shard": {"index": index, "count": count}, "seconds": round(seconds, 3),
        }
        stdout().write(json.dumps(doc) + "\n")
    elif not quiet:
        from rich.table import Table

        table = Table(title=f"batch: {len(results) - len(failed)} of {len(jobs)} jobs succeeded in {seconds:.1f} s"
                      + (f" (shard {index}/{count} of {len(all_jobs)})" if count > 1 else ""))
        for column in ("line", "command", "status", "seconds", "error"):
            table.add_column(column, justify="right" if column in ("line", "seconds") else "left",
                             overflow="fold")
        for r in results:
            table.add_row(str(r.job.number), _inert(r.job.command), "ok" if r.ok else f"failed ({r.exit_code})",
                          f"{r.seconds:.2f}", _inert(r.error or ""))
        if len(results) < len(jobs):
            table.caption = f"{len(jobs) - len(results)} job(s) not run (--fail-fast)"
        out_console().print(table, crop=False)
    return bool(failed) or len(results) < len(jobs)

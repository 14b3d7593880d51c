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

Without a jobs file, ``--each GLOB -- COMMAND ARGS...`` makes one job per file (``--each -``: paths
from standard input, one a line), the placeholders of ``attnviz.cli.filemaps`` filled in; paths are
taken relative to the current folder, as on the command line. ``--shard``, ``--results`` and
``--resume`` are ``attnviz.cli.shards``.
"""

from __future__ import annotations

import io
import json
import math
import os
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
                "key_padding_mask", "map_png", "stats_png", "received_png", "check_mask", "adjacency", "unary",
                "from_keras", "positions", "html", "save_ids", "save_labels"}
LABEL_OPTIONS = {"labels", "q_labels", "k_labels"}  # a file name, or the labels themselves
#: what an option name in a jobs file looks like (it becomes --name)
OPTION_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_-]{0,63}")
#: how much of a value from a jobs file a message quotes
QUOTED = 60


@dataclass
class Job:
    number: int  # its line in the jobs file, from 1 (--each: its index + 1)
    command: str = ""
    argv: list[str] = field(default_factory=list)
    error: str | None = None  # the job could not even be read
    wants_document: bool = False
    index: int = 0  # its 0-based position among all the jobs (--each: among the sorted files)
    path: str | None = None  # --each: the file it was made for
    outputs: list[tuple[str, str]] = field(default_factory=list)  # (option, file) the job writes

    @property
    def key(self) -> str:
        """What the job is, for shards and --resume: its command line as it runs."""
        from attnviz.cli.shards import record_key

        return record_key(self.argv[0], self.argv[1:]) if self.argv else "\0" + (self.error or "")


@dataclass
class JobResult:
    job: Job
    exit_code: int
    seconds: float
    error: str | None = None
    document: Any = None
    written: list[dict[str, Any]] = field(default_factory=list)  # {"option", "path", "bytes"} of files written
    recorded: dict[str, Any] | None = None  # --resume: done before, this is its results line

    @property
    def ok(self) -> bool:
        return self.exit_code == 0


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


#: commands whose arguments are not file names (repeat-test N): taken as written, not resolved
TEXT_ARGS = {"repeat-test"}
#: options whose values are files a job writes: never the jobs file itself
OUTPUT_PATH_OPTIONS = {"png", "json", "json_file", "save_weights", "save_output", "save_params", "map_png",
                       "stats_png", "received_png", "html", "save_ids", "save_labels"}


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
    argv = [job.command, *(a if job.command in TEXT_ARGS else _resolve(a, base) for a in args)]
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
                written.append(("--json-file", argv[-1]))
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
                written.append((flag, text))
            argv += [flag, text]
    if jobs_file is not None:
        for name, target in written:
            try:
                same = Path(target).resolve() == jobs_file
            except OSError:
                same = False
            if same:
                job.error = (f"line {number}: {_quoted(name.lstrip('-'))} {target} is the jobs file itself; "
                             "refusing to overwrite it.")
                return job
    if "quiet" not in options and takes_quiet(job.command):
        argv.append("--quiet")
    job.argv = argv
    job.outputs = written
    return job


#: the options of a command line that name a file the command writes
OUTPUT_FLAGS = {"--" + name.replace("_", "-") for name in OUTPUT_PATH_OPTIONS if name != "json"}


def named_outputs(argv: list[str]) -> list[tuple[str, str]]:
    """(option, file) of every output a command line names (``--png out.png`` or ``--png=out.png``)."""
    found = []
    for i, arg in enumerate(argv):
        flag, eq, value = arg.partition("=")
        if flag in OUTPUT_FLAGS:
            if eq:
                found.append((flag, value))
            elif i + 1 < len(argv):
                found.append((flag, argv[i + 1]))
    return found


def takes_quiet(command: str) -> bool:
    """Whether a command has --quiet, which batch adds to its jobs (repeat-test has none: it prints
    nothing but its result)."""
    import inspect

    from attnviz.cli.app import app

    found = next((c for c in app.registered_commands if c.name == command), None)
    return found is None or found.callback is None or "quiet" in inspect.signature(found.callback).parameters


def batch_commands() -> set[str]:
    """The commands a job may run."""
    from attnviz.cli.app import app

    return {c.name for c in app.registered_commands if c.name and c.name not in ("batch", "variants", "serve")}


#: options of batch that no job's command has: given after --, they are a mistake
BATCH_ONLY = {"--each", "--shard", "--results", "--resume", "--fail-fast", "--jobs"}


def jobs_from_template(template: list[str], paths: list[str]) -> list[Job]:
    """One job per path: the command line ``template`` with its placeholders filled in (exit 2 for an
    unknown command or placeholder, a template without placeholders, or two jobs writing one file)."""
    from attnviz.cli.filemaps import check_template, expand

    commands = batch_commands()
    if not template:
        raise UsageError("--each: give the command to run after --, e.g. --each 'acts/*.npz' -- inspect {} "
                         "--json-file out/{stem}.json.")
    if template[0] not in commands:
        raise UsageError(f"--each: unknown command {_quoted(template[0])} after --; one of "
                         f"{', '.join(sorted(commands))}.")
    for arg in template[1:]:
        if arg.partition("=")[0] in BATCH_ONLY:
            raise UsageError(f"--each: {arg.partition('=')[0]} is an option of batch, given after --, where the job's "
                             "command goes; put batch's options before --.")
    used = [check_template(arg, f"--each command, argument {n}") for n, arg in enumerate(template[1:], 1)]
    if not any(used):
        raise UsageError("--each: the command uses no placeholder, so every job would be the same; put {} where "
                         "the file goes.")
    if "-" in template[1:]:
        raise UsageError("--each: a batch job cannot read standard input ('-').")
    jobs = []
    writers: dict[str, tuple[str, int]] = {}
    for index, path in enumerate(paths):
        argv = [template[0], *(expand(arg, path, index) for arg in template[1:])]
        if not {"--quiet", "-q"} & set(argv) and takes_quiet(template[0]):
            argv.append("--quiet")
        job = Job(index + 1, template[0], argv, index=index, path=path, wants_document="--json" in argv,
                  outputs=named_outputs(argv))
        for option, target in job.outputs:
            where = os.path.normpath(target)
            if where in writers and writers[where][1] != index:
                raise UsageError(f"--each: {option} {target} is written by the jobs of {paths[writers[where][1]]} "
                                 f"and {path}; name outputs with a placeholder such as {{stem}}.")
            writers[where] = (option, index)
        jobs.append(job)
    return jobs


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
    commands = batch_commands()
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
    for index, job in enumerate(jobs):
        job.index = index
    return jobs, base


def run_job(click_command: Any, job: Job) -> JobResult:
    """Run one job through the command line's own code, with its own stdout and stderr buffers."""
    from typer._click.exceptions import ClickException  # Typer vendors Click

    from attnviz.cli.options import usage_message

    start = time.perf_counter()
    if job.error:
        return JobResult(job, 2, 0.0, job.error)
    before = {path: _identity(path) for _, path in job.outputs}
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
    written = []
    for option, path in job.outputs:  # a file is new when it is there and was not, or is another file now
        now = _identity(path)
        if now is not None and now != before.get(path):
            written.append({"option": option, "path": path, "bytes": now[2]})
    return JobResult(job, int(code), seconds, message, document, written)


def _identity(path: str) -> tuple[int, int, int] | None:
    """(inode, mtime, size) of a regular file, or None."""
    import stat

    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return None
    return (st.st_ino, st.st_mtime_ns, st.st_size) if stat.S_ISREG(st.st_mode) else None


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
    jobs: Annotated[list[str] | None, typer.Argument(
        metavar="JOBS | -- COMMAND", show_default=False,
        help="a JSON Lines file of jobs, or - for standard input; with --each, the command each file runs, after "
             "--")] = None,
    each: Annotated[str | None, typer.Option(
        "--each", metavar="GLOB|-", show_default=False,
        help="one job per file the glob matches (sorted naturally; ** descends into folders), or per path on "
             "standard input (-, one a line), running the command after --; placeholders {} {name} {stem} {dir} "
             "{index}, {{ }} for literal braces")] = None,
    shard: Annotated[str | None, typer.Option(
        "--shard", metavar="INDEX/COUNT|auto",
        help="run one of COUNT disjoint shards of the jobs (INDEX from 0); auto reads it from a Slurm job array "
             "(SLURM_ARRAY_TASK_*) or a Kubernetes Indexed Job (JOB_COMPLETION_INDEX with auto/COUNT or "
             "ATTNVIZ_SHARD_COUNT)")] = None,
    results: Annotated[str | None, typer.Option(
        "--results", metavar="FILE.jsonl", rich_help_panel=OUTPUT,
        help="append one JSON line per finished job (command, exit code, files written, seconds, summary of its "
             "JSON document); shards may share the file or write their own and cat them")] = None,
    resume: Annotated[bool, typer.Option(
        "--resume", help="skip the jobs --results records as done (exit 0 or 3, every file it wrote still there "
                         "at its size); the others run again")] = False,
    workers: Annotated[int, checked_option(int, "--jobs", "-j", min=1, max=256,
                                           help="run this many jobs at once (threads)")] = 1,
    fail_fast: Annotated[bool, typer.Option("--fail-fast", help="stop at the first job that fails")] = False,
    json_out: Annotated[bool, typer.Option("--json", rich_help_panel=OUTPUT,
                                           help="print the summary as JSON on stdout")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", rich_help_panel=OUTPUT,
                                        help="no progress bar and no summary table")] = False,
) -> None:
    """Run many jobs in one process (TensorFlow is imported once): a JSON Lines file of jobs, or one command
    over many files (--each GLOB -- COMMAND ARGS...)."""
    from attnviz.cli.app import user_errors

    with user_errors():
        failed = run_batch(jobs or [], each, shard, results, resume, workers, fail_fast, json_out, quiet)
    if failed:
        raise typer.Exit(1)


def _stdin_bytes(what: str) -> bytes:
    import sys

    from attnviz.formats._base import read_limited

    stream = sys.stdin
    if stream is None:
        raise InputError(f"{what}: there is no standard input to read.")
    return read_limited(getattr(stream, "buffer", None) or stream, what, what="paths")


def plan_jobs(spec: list[str], each: str | None) -> tuple[list[Job], str | None]:
    """Every job of the batch (all shards), and the jobs file if there is one."""
    from attnviz.cli.filemaps import glob_paths, stdin_paths

    if each is None:
        if not spec:
            raise UsageError("missing argument JOBS (a jobs file, or - for standard input), or --each GLOB -- COMMAND "
                             "ARGS...")
        if len(spec) > 1:
            raise UsageError(f"batch: one jobs file, not {len(spec)} arguments; to run a command over files, "
                             "--each GLOB -- COMMAND ARGS...")
        return read_jobs(spec[0])[0], spec[0]
    jobs_from_template(spec, [])  # the command and its placeholders, before any file is listed
    paths = stdin_paths(_stdin_bytes("--each -")) if each == "-" else glob_paths(each)
    return jobs_from_template(spec, paths), None


#: fields of a job's JSON document that its results line repeats (those it has)
SUMMARY_FIELDS = ("command", "variant", "source", "a", "b", "device", "dtype", "stored_dtype", "weights_shape",
                  "output_shape", "padded_rows", "max_abs_diff", "mean_abs_diff", "argmax_agreement")


def summary_of(document: Any) -> dict[str, Any] | None:
    """The summary of a JSON document for a results line: the fields of ``SUMMARY_FIELDS``, the checks
    (name, passed, failures), how many warnings, and compare's mean and max Jensen-Shannon divergence."""
    if not isinstance(document, dict):
        return None
    out = {k: document[k] for k in SUMMARY_FIELDS if k in document}
    js = document.get("js_divergence")
    if isinstance(js, dict):
        out["js_divergence"] = {k: js.get(k) for k in ("mean", "max")}
    if isinstance(document.get("checks"), list):
        out["checks"] = [{k: c.get(k) for k in ("name", "passed", "failures")} for c in document["checks"]
                         if isinstance(c, dict)]
    if isinstance(document.get("warnings"), list):
        out["warnings"] = len(document["warnings"])
    return out


def _document_of(result: JobResult) -> Any:
    if result.document is not None:
        return result.document
    for out in result.written:
        if out["option"] == "--json-file":
            try:
                with open(out["path"], "rb") as fh:
                    return json.load(fh)
            except (OSError, ValueError):
                return None
    return None


def results_record(result: JobResult) -> dict[str, Any]:
    """A job's line in the --results file."""
    job = result.job
    where: dict[str, Any] = {"path": job.path} if job.path is not None else {"line": job.number}
    return {"index": job.index, **where, "command": job.argv[0] if job.argv else (job.command or None),
            "args": job.argv[1:], "exit_code": result.exit_code, "error": result.error,
            "outputs": result.written, "summary": summary_of(_document_of(result)),
            "seconds": round(result.seconds, 4), "finished": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


def _same_file(a: str, b: str) -> bool:
    try:
        return Path(a).resolve() == Path(b).resolve()
    except OSError:
        return False


def run_batch(spec: list[str], each: str | None, shard: str | None, results_path: str | None, resume: bool,
              workers: int, fail_fast: bool, json_out: bool, quiet: bool) -> bool:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from attnviz.cli.shards import (
        ResultsFile,
        is_complete,
        parse_shard,
        read_results,
        remove_leftovers,
        shard_positions,
    )

    index, count = parse_shard(shard)
    if resume and results_path is None:
        raise UsageError("--resume: needs --results FILE.jsonl, the record of the jobs done.")
    all_jobs, jobs_file = plan_jobs(spec, each)
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
            results = [finished(r) for r in run_all(todo, workers, fail_fast, None)]
        else:
            with Progress(TextColumn("batch"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                          console=err, transient=False) as bar:
                task = bar.add_task("jobs", total=len(todo))
                results = [finished(r) for r in run_all(todo, workers, fail_fast, lambda: bar.advance(task))]
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

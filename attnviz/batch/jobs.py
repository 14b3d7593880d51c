"""A batch's jobs: each a command line to run (``Job``), read from a JSON Lines jobs file or made from
one command line over many files (``--each``), and the plan of every job of a batch (``plan_jobs``).

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
read like every text input: a regular file or a named pipe (``<(...)``), in pieces, at most
``MAX_TEXT_BYTES``. Relative paths in a jobs file from a pipe resolve against the current folder, as for ``-``.

Without a jobs file, ``--each GLOB -- COMMAND ARGS...`` makes one job per file (``--each -``: paths
from standard input, one a line), the placeholders of ``attnviz.batch.filemaps`` filled in; paths are
taken relative to the current folder, as on the command line.

Which commands a job may run, and which of them take ``--quiet``, the batch's ``Runner`` says
(``attnviz.batch``).
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from attnviz.batch import Runner
from attnviz.batch.results import record_key
from attnviz.errors import InputError, UsageError

#: options whose values are file names, resolved against the jobs file's folder
PATH_OPTIONS = {"png", "json", "json_file", "save_weights", "save_output", "save_params", "params", "mask",
                "key_padding_mask", "map_png", "stats_png", "received_png", "check_mask", "adjacency", "unary",
                "from_keras", "positions", "html", "save_ids", "save_labels", "overlay_png", "image", "grads",
                "save_maps"}
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
        return record_key(self.argv[0], self.argv[1:]) if self.argv else "\0" + (self.error or "")


def _resolve(value: str, base: str) -> str:
    """A path as the jobs file gives it, relative to the jobs file's folder exactly as the command line
    takes it relative to the current directory: ``a.npz``, ``a.npz:q``, ``x.safetensors:k``,
    ``run.h5:attn/*`` all become ``BASE/...`` with their key kept (a key follows the file name, so
    joining the folder in front keeps it). A jobs file at a URL has a URL's folder; a URL is kept."""
    from attnviz import storage

    return storage.join(base, value)


def _quoted(value: Any) -> str:
    """A value from a jobs file as a message quotes it: ``repr`` (control characters escaped), shortened."""
    text = repr(value)
    return text if len(text) <= QUOTED else text[: QUOTED - 3] + "..."


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
                       "stats_png", "received_png", "overlay_png", "html", "save_ids", "save_labels", "save_maps"}


def _every_command(command: str) -> bool:
    return True


def job_from_line(number: int, line: str, base: str | Path, commands: set[str], jobs_file: str | None = None,
                  takes_quiet: Callable[[str], bool] = _every_command) -> Job:
    """A jobs-file line as a command line (``argv``); a line that cannot be one (for any reason) gives a
    job with an error, and only that job fails. No job may write over ``jobs_file``. ``commands`` are
    those a job may run; ``takes_quiet`` says whether a command has --quiet, which the job gets unless
    it says otherwise (the batch's ``Runner.takes_quiet``; by default every command has it)."""
    from attnviz import storage
    from attnviz.jsontext import loads_json

    base = str(base)
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
            if key in PATH_OPTIONS or (key in LABEL_OPTIONS and storage.exists_relative(base, text)):
                text = _resolve(text, base)
            if key in OUTPUT_PATH_OPTIONS:
                written.append((flag, text))
            argv += [flag, text]
    if jobs_file is not None:
        for name, target in written:
            if storage.same_place(target, jobs_file):
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


#: options of batch that no job's command has: given after --, they are a mistake
BATCH_ONLY = {"--each", "--shard", "--results", "--resume", "--fail-fast", "--jobs"}


def jobs_from_template(template: list[str], paths: list[str], runner: Runner) -> list[Job]:
    """One job per path: the command line ``template`` with its placeholders filled in (exit 2 for an
    unknown command or placeholder, a template without placeholders, or two jobs writing one file)."""
    from attnviz.batch.filemaps import check_template, expand

    commands = runner.commands()
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
    from attnviz import storage

    for index, path in enumerate(paths):
        argv = [template[0], *(expand(arg, path, index) for arg in template[1:])]
        if not {"--quiet", "-q"} & set(argv) and runner.takes_quiet(template[0]):
            argv.append("--quiet")
        job = Job(index + 1, template[0], argv, index=index, path=path, wants_document="--json" in argv,
                  outputs=named_outputs(argv))
        for option, target in job.outputs:
            where = target if storage.is_url(target) else os.path.normpath(target)
            if where in writers and writers[where][1] != index:
                raise UsageError(f"--each: {option} {target} is written by the jobs of {paths[writers[where][1]]} "
                                 f"and {path}; name outputs with a placeholder such as {{stem}}.")
            writers[where] = (option, index)
        jobs.append(job)
    return jobs


def _jobs_bytes(spec: str) -> tuple[bytes, str, str]:
    """The jobs file's bytes (bounded, a regular file only), how to name it, and the folder paths resolve in."""
    import sys

    from attnviz import storage
    from attnviz.storage.local import is_pipe
    from attnviz.storage.textfiles import read_limited

    if spec == "-":
        source = "'-' (<stdin>)"
        stream = sys.stdin
        if stream is None:
            raise InputError(f"{source}: there is no standard input to read.")
        return read_limited(getattr(stream, "buffer", None) or stream, source, what="jobs"), source, str(Path.cwd())
    try:  # a regular file, a named pipe (<(...)) read once, or an object of a store
        data = storage.read_text_bytes(spec, spec, what="jobs")
    except UsageError as exc:
        if exc.message == f"{spec}: no such file.":
            raise UsageError(f"{spec}: no such jobs file.") from None
        raise
    return data, spec, str(Path.cwd()) if is_pipe(spec) else storage.folder_of(spec)  # a pipe has no folder


def read_jobs(spec: str, runner: Runner) -> tuple[list[Job], str]:
    """The jobs of a jobs file (``-``: standard input), and the folder their paths resolve in."""
    from attnviz import storage

    data, source, base = _jobs_bytes(spec)
    jobs_file = None if spec == "-" else spec if storage.is_url(spec) else str(Path(spec).resolve())
    nul = data.find(b"\0")
    if nul >= 0:
        raise InputError(f"{source}: holds binary data (a NUL byte at offset {nul}), not JSON Lines jobs.")
    commands = runner.commands()
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
            jobs.append(job_from_line(number, line, base, commands, jobs_file, runner.takes_quiet))
    for index, job in enumerate(jobs):
        job.index = index
    return jobs, base


def _stdin_bytes(what: str) -> bytes:
    import sys

    from attnviz.storage.textfiles import read_limited

    stream = sys.stdin
    if stream is None:
        raise InputError(f"{what}: there is no standard input to read.")
    return read_limited(getattr(stream, "buffer", None) or stream, what, what="paths")


def plan_jobs(spec: list[str], each: str | None, runner: Runner) -> tuple[list[Job], str | None]:
    """Every job of the batch (all shards), and the jobs file if there is one."""
    from attnviz.batch.filemaps import glob_paths, stdin_paths

    if each is None:
        if not spec:
            raise UsageError("missing argument JOBS (a jobs file, or - for standard input), or --each GLOB -- COMMAND "
                             "ARGS...")
        if len(spec) > 1:
            raise UsageError(f"batch: one jobs file, not {len(spec)} arguments; to run a command over files, "
                             "--each GLOB -- COMMAND ARGS...")
        return read_jobs(spec[0], runner)[0], spec[0]
    jobs_from_template(spec, [], runner)  # the command and its placeholders, before any file is listed
    paths = stdin_paths(_stdin_bytes("--each -")) if each == "-" else glob_paths(each)
    return jobs_from_template(spec, paths, runner), None

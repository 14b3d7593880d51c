"""The results manifest of a batch (``--results FILE.jsonl``): one JSON line per finished job (its
command line, exit code, files written, seconds and a summary of its JSON document), how such a line
is made from a job's result, and reading the manifest back for ``--resume`` and for merging shards.

A line is written with one ``write()`` on a file opened with ``O_APPEND`` while holding an exclusive
``flock``, so threads and processes sharing the file never interleave lines. A line goes in whole or not
at all: when the write fails or falls short and the rest cannot be written either (``ENOSPC`` on a full
disk, ``EFBIG``), the file is cut back to where the line began, its last line feed, before the error is
reported. A line without its line feed at the end of the file (a process killed while writing it) is cut
off, under the same lock, before the next line is written, and dropped when the file is read (``--resume``
says so).

A manifest at a URL (``--results s3://bucket/results.jsonl``: ``ResultsObject``) cannot be appended to: it is
kept in memory and the object written whole, in one request, on every record, so that it is always whole
lines; ``--resume`` reads it there. Shards write one object each (``cat`` merges them, as files).
"""

from __future__ import annotations

import errno
import json
import os
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from attnviz.errors import AttnvizError, OutputError, UsageError

if TYPE_CHECKING:
    from attnviz.batch.jobs import Job

#: exit codes of a finished job that --resume keeps: success, and checks that ran and failed
COMPLETE_CODES = (0, 3)
#: fields of a results line that differ from run to run of the same job
TIMING_FIELDS = ("seconds", "finished")
#: fields of a job's JSON document that its results line repeats (those it has)
SUMMARY_FIELDS = ("command", "variant", "source", "a", "b", "device", "dtype", "stored_dtype", "weights_shape",
                  "output_shape", "padded_rows", "max_abs_diff", "mean_abs_diff", "argmax_agreement")


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


# ---------------------------------------------------------------- a job's line


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
    from attnviz import storage

    if result.document is not None:
        return result.document
    for out in result.written:
        if out["option"] == "--json-file":
            try:
                data = storage.read_whole(out["path"])
                return None if data is None else json.loads(data)
            except (OSError, ValueError, AttnvizError):
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


# ---------------------------------------------------------------- the manifest

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
            start = os.fstat(self._fd).st_size  # just after the last line feed
            view = memoryview(data)
            try:
                while view:  # one write() in practice; the rest of a short write, still under the lock, may
                    written = os.write(self._fd, view)  # succeed (a signal cut it) or say why it cannot
                    if written <= 0:
                        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
                    view = view[written:]
            except OSError:
                if os.fstat(self._fd).st_size > start:
                    os.ftruncate(self._fd, start)  # the line goes in whole or not at all
                raise

        try:
            self._locked(write)
        except OSError as exc:
            raise OutputError(f"--results {self.path}: cannot write ({exc.strerror or exc}).") from None


class ResultsObject:
    """A results manifest at a URL: kept in memory, and written whole on every record (see the module)."""

    def __init__(self, path: str) -> None:
        from attnviz import storage

        self.path = path
        self.repaired = 0
        self._lock = threading.Lock()
        try:
            found = storage.read_whole(path)
            if found is None:  # made now, empty, as a local manifest is: a shard with no job still leaves one
                storage.write_whole(path, b"", "--results")
            self._data = found or b""
        except AttnvizError as exc:
            raise OutputError(f"--results {exc.message}") from None

    def close(self) -> None:
        pass

    def __enter__(self) -> ResultsObject:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def repair(self) -> None:
        """Drop a last line without its line feed (written again, whole, with the next record)."""
        with self._lock:
            if self._data and not self._data.endswith(b"\n"):
                cut = self._data.rfind(b"\n")
                self._data = self._data[:cut + 1]
                self.repaired += 1

    def append(self, record: Mapping[str, Any]) -> None:
        from attnviz import storage

        line = (json.dumps(record, ensure_ascii=False, allow_nan=False) + "\n").encode("utf-8")
        with self._lock:
            try:
                storage.write_whole(self.path, self._data + line, "--results")
            except AttnvizError as exc:
                raise OutputError(f"--results {exc.message}") from None
            self._data += line


def open_results(path: str) -> ResultsFile | ResultsObject:
    """The results manifest at ``path``: a local file appended to, or an object written whole."""
    from attnviz import storage

    return ResultsObject(path) if storage.is_url(path) else ResultsFile(path)


def read_results(path: str) -> tuple[dict[str, dict[str, Any]], int, bool]:
    """The last complete record of every job in a results file (by ``record_key``), how many lines were
    unreadable (not a record), and whether the last line was cut short (no line feed: its writer was
    killed, or its disk filled, while writing it; dropped). No file: nothing recorded."""
    from attnviz import storage

    try:
        data = storage.read_whole(path)
    except OSError as exc:
        raise OutputError(f"--results {path}: cannot read it ({exc.strerror or exc}).") from None
    except AttnvizError as exc:
        raise OutputError(f"--results {exc.message}") from None
    if data is None:
        return {}, 0, False
    records: dict[str, dict[str, Any]] = {}
    bad = 0
    lines = data.split(b"\n")
    torn = bool(lines[-1])  # a last line without its line feed
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
    return records, bad, torn


def is_complete(record: Mapping[str, Any] | None, outputs: Sequence[str]) -> bool:
    """Whether a job recorded in a results file is done: it finished with exit code 0 or 3, every file
    it recorded exists with the size recorded, and (after exit 0) every output it names is among them."""
    if not record or record.get("exit_code") not in COMPLETE_CODES:
        return False
    from attnviz import storage

    recorded = record.get("outputs") or []
    try:
        for out in recorded:
            if storage.size(out["path"]) != out["bytes"]:
                return False
    except (OSError, KeyError, TypeError, AttnvizError):
        return False
    if record.get("exit_code") == 0:
        paths = {out["path"] for out in recorded}
        return all(p in paths for p in outputs)
    return True


def remove_leftovers(path: str) -> int:
    """Remove the hidden staged and partial files a killed run left beside output ``path`` (see
    ``attnviz.staging.StagedOutputs`` and ``attnviz.io.write_atomic``). Only for a job about to be
    run again; names longer than the staging prefix are left alone. An output at a URL leaves nothing
    to remove (its upload was never completed)."""
    import glob as globbing

    from attnviz import storage

    if storage.is_url(path):
        return 0
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

"""The staged files a warm worker holds, recorded beside its socket (``worker-XXXXXXXX.staged``), so that the
files of a worker killed mid-request (SIGKILL, the out-of-memory killer: nothing of it runs any more) are
removed by whoever finds it dead: the client whose request it was, before it runs the command itself, and
the next worker, when it starts.

A run's outputs are staged as hidden files next to their targets (``attnviz.staging``); a cold run that ends
in any way it can see (an error, Ctrl-C, SIGTERM) removes them itself. A worker records each staged file's
absolute path here before creating it and drops it once the file is renamed into place or removed
(``Ledger``, handed to ``attnviz.staging.set_ledger``); ``sweep`` removes what a dead worker's ledger lists.

The ledger is NUL-separated paths, rewritten whole (a temporary file renamed over it) on every change. It
lives in the worker's private runtime folder; even so ``sweep`` removes only regular files (never through a
symbolic link) of this user whose names have the staged form. Recording is best effort: a runtime folder
that stops taking writes (removed, read-only) costs the record, never a request.

This module imports the standard library only (the client reads it).
"""

from __future__ import annotations

import os
import re
import stat
import threading

#: the names ``attnviz.staging`` gives staged files: ``.NAME.XXXXXXXX.staged.EXT``
STAGED_NAME = re.compile(r"\..+\.(staged(\.[^/]*)?|part)")


def ledger_path(sock_path: str) -> str:
    return sock_path.removesuffix(".sock") + ".staged"


class Ledger:
    """The staged files a worker holds now, kept in ``path``."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.held: set[str] = set()
        self._lock = threading.Lock()  # the jobs of `batch --jobs N` stage files from N threads
        self.failed: OSError | None = None  # the last write that failed

    def add(self, staged: str) -> None:
        with self._lock:
            self.held.add(os.path.abspath(staged))
            self._write()

    def remove(self, staged: str) -> None:
        with self._lock:
            before = len(self.held)
            self.held.discard(os.path.abspath(staged))
            if len(self.held) != before:
                self._write()

    def _write(self) -> None:
        tmp = f"{self.path}.{os.getpid()}.tmp"
        try:
            if not self.held:
                os.unlink(self.path)
                return
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            try:
                data = b"\0".join(os.fsencode(p) for p in sorted(self.held))
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view):]
            finally:
                os.close(fd)
            os.replace(tmp, self.path)
            self.failed = None
        except FileNotFoundError:
            if self.held:  # the folder is gone
                self.failed = FileNotFoundError("the worker's folder was removed")
        except OSError as exc:
            self.failed = exc
            try:
                os.unlink(tmp)
            except OSError:
                pass


def sweep(path: str) -> list[str]:
    """Remove the staged files listed in the ledger ``path`` of a worker that is gone, then the ledger: the
    paths removed. Call it only holding the worker's lock, or knowing it free (``protocol.lock_is_free``)."""
    try:
        with open(path, "rb") as f:
            data = f.read(1 << 24)
    except OSError:
        return []
    removed = []
    for raw in data.split(b"\0"):
        staged = os.fsdecode(raw)
        if not os.path.isabs(staged) or not STAGED_NAME.fullmatch(os.path.basename(staged)):
            continue
        try:
            st = os.lstat(staged)
            if stat.S_ISREG(st.st_mode) and st.st_uid == os.getuid():
                os.unlink(staged)
                removed.append(staged)
        except OSError:
            pass
    try:
        os.unlink(path)
    except OSError:
        pass
    return removed

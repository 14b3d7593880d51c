"""A run's output files, all or nothing (``StagedOutputs``): every output is written to a staged file
next to its target and all are put in place together once every one is written; a failed run leaves
no file behind and changes no file that was there before. Every command writes its files through here.

A target may be a URL of an object store (``attnviz.storage``): its staged file is made in the local
temporary folder, and the commit sends it as an upload that is not completed (``storage.remote.Upload``: a
multipart upload on S3), then completes every upload and renames every local file together; a failure, Ctrl-C,
SIGTERM or SIGHUP before that aborts the uploads, so no object appears at a URL unless the whole run succeeded.

A process that could be killed outright while it holds staged files (the warm worker) hands a ledger to
``set_ledger``: each staged file is recorded there before it is created and dropped once renamed or removed,
so that whoever finds the process dead removes them (``attnviz.worker.ledger``).
"""

from __future__ import annotations

import os
import random
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Protocol

from attnviz.errors import AttnvizError, OutputError
from attnviz.interrupts import deferred
from attnviz.storage import Place, Url


class Ledger(Protocol):
    """Where a process records the staged files it holds (``attnviz.worker.ledger.Ledger``)."""

    def add(self, staged: str) -> None: ...

    def remove(self, staged: str) -> None: ...


_ledger: Ledger | None = None


def set_ledger(ledger: Ledger | None) -> None:
    """Record every staged file of this process in ``ledger`` from now on (None: nowhere)."""
    global _ledger
    _ledger = ledger


_NAME_CHARACTERS = "abcdefghijklmnopqrstuvwxyz0123456789_"  # those of tempfile.mkstemp


def hidden_file(folder: Path | str, prefix: str, suffix: str) -> tuple[int, str]:
    """``tempfile.mkstemp(dir=folder, prefix=prefix, suffix=suffix)`` (a new file, mode 0600, created
    exclusively): (its open descriptor, its name). With a ledger, the name is recorded before the file
    exists; ``forget`` it once it is renamed or removed."""
    ledger = _ledger
    if ledger is None:
        return tempfile.mkstemp(dir=folder, prefix=prefix, suffix=suffix)
    pick = random.SystemRandom()
    for _ in range(100):
        name = os.path.join(folder, prefix + "".join(pick.choices(_NAME_CHARACTERS, k=8)) + suffix)
        ledger.add(name)
        try:
            fd = os.open(name, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        except FileExistsError:
            ledger.remove(name)
            continue
        except BaseException:
            ledger.remove(name)
            raise
        return fd, name
    raise FileExistsError(f"no free name for a hidden file in {folder}")


#: where Linux says a process's umask without changing it (``Umask:``, since Linux 4.7)
_STATUS = "/proc/self/status"


def umask() -> int:
    """The process's umask, read without changing it. ``os.umask`` reads it only by setting another one, and
    while that one is set a file that another thread creates (a capture's writer thread, a batch job's output)
    takes the wrong mode: with ``os.umask(0)``, 0666 or 0777. A file put in place is given ``0o666 & ~umask()``,
    the mode the user's umask gives any file they write (its staged file was private)."""
    try:
        with open(_STATUS, "rb") as fh:
            for line in fh:
                if line.startswith(b"Umask:"):
                    return int(line.split()[1], 8) & 0o777
    except (OSError, ValueError, IndexError):
        pass
    return _probed_umask()


def _probed_umask() -> int:
    """The umask as the kernel applies it to a new file of mode 0777 in the temporary folder (the system has no
    ``/proc/self/status``), or 022 (the usual one) when no file can be made there."""
    folder = tempfile.gettempdir()
    pick = random.SystemRandom()
    for _ in range(100):
        name = os.path.join(folder, ".attnviz.umask." + "".join(pick.choices(_NAME_CHARACTERS, k=8)))
        try:
            fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
                         | getattr(os, "O_CLOEXEC", 0), 0o777)
        except FileExistsError:
            continue
        except OSError:
            break
        try:
            return 0o777 & ~os.fstat(fd).st_mode
        finally:
            os.close(fd)
            try:
                os.unlink(name)
            except OSError:
                pass
    return 0o022


def forget(name: Path | str) -> None:
    """``name`` (a ``hidden_file``) was renamed into place or removed: drop it from the ledger."""
    ledger = _ledger
    if ledger is not None:
        ledger.remove(str(name))


class StagedOutputs:
    """A run's output files, all or nothing.

    ``reserve`` creates, before anything is computed, an empty hidden file next to each target
    (``.attn.png.x1y2.staged.png``): that proves the folder exists and takes new files. The run
    writes each output to its staged file (``staged[option]``); ``commit`` renames them all into
    place once every one is written. When the run fails, ``discard`` removes the staged files: a
    failed run leaves no new file behind and changes no file that was there before. A target that
    existed is replaced (atomically, by the rename) only when the whole run succeeded.
    """

    def __init__(self, targets: Mapping[str, Place]) -> None:
        self.targets = dict(targets)
        self.staged: dict[str, Path] = {}
        self.committed: list[Place] = []
        self.uploads: dict[str, Any] = {}  # option -> storage.remote.Upload, for a URL

    def reserve(self) -> None:
        with deferred():  # Ctrl-C or SIGTERM: never between creating a staged file and recording it
            self._reserve()

    def _reserve(self) -> None:
        for option, path in self.targets.items():
            if isinstance(path, Url):
                self._reserve_remote(option, path)
                continue
            if path.exists() and not path.is_file():  # a FIFO, a device: never replaced by a file
                self.discard()
                raise OutputError(f"{option} {path}: exists and is not a regular file; refusing to replace it.")
            folder = path.parent if str(path.parent) else Path(".")
            try:
                fd, name = hidden_file(folder, f".{path.name[:60]}.", f".staged{path.suffix}")
            except OSError as exc:
                self.discard()
                raise OutputError(f"{option} {path}: cannot write into {folder} ({exc.strerror or exc}).") from None
            os.close(fd)
            self.staged[option] = Path(name)

    def _reserve_remote(self, option: str, url: Url) -> None:
        """A URL's bucket is checked now; its staged file is made in the local temporary folder."""
        from attnviz.storage.remote import Upload

        upload = Upload(url, option)
        try:
            upload.check()
            fd, name = hidden_file(tempfile.gettempdir(), f".attnviz.{url.name[:60]}.", f".staged{url.suffix}")
        except OSError as exc:
            self.discard()
            raise OutputError(f"{option} {url}: cannot stage it in {tempfile.gettempdir()} "
                              f"({exc.strerror or exc}).") from None
        except BaseException:
            self.discard()
            raise
        os.close(fd)
        self.staged[option] = Path(name)
        self.uploads[option] = upload

    def __contains__(self, option: object) -> bool:
        return option in self.staged

    def __getitem__(self, option: str) -> Path:
        return self.staged[option]

    def get(self, option: str) -> Path | None:
        return self.staged.get(option)

    def commit(self) -> None:
        """Put every staged file in place. Files for URLs are sent first (uploads not yet completed: a signal
        or a failure then aborts them all); then every upload is completed and every local file renamed.
        Should one of those fail, the files already put in place by this commit are removed too (they replaced
        any older ones: those are gone). A signal waits until the files are in place, or removed."""
        try:
            for option, upload in self.uploads.items():
                upload.send(self.staged[option])
        except BaseException:
            self.discard()
            raise
        with deferred():
            self._commit()

    def _commit(self) -> None:
        for option, upload in list(self.uploads.items()):
            try:
                upload.complete()
            except BaseException:
                self.discard()
                raise
            self.committed.append(self.targets[option])
            del self.uploads[option]
            self._drop(option)
        for option, stage in list(self.staged.items()):
            try:
                os.replace(stage, self.targets[option])
            except OSError as exc:
                self.discard()
                raise OutputError(f"{option} {self.targets[option]}: cannot write ({exc.strerror or exc}).") from None
            self.committed.append(self.targets[option])
            del self.staged[option]
            forget(stage)
        self.committed.clear()

    def _drop(self, option: str) -> None:
        """Remove the staged file of an output put in place by other means (an upload)."""
        stage = self.staged.pop(option)
        try:
            stage.unlink()
        except OSError:
            pass
        forget(stage)

    def discard(self) -> None:
        """Remove the staged files, abort the uploads (and remove what a failed commit already put in place)."""
        with deferred():
            for upload in self.uploads.values():
                upload.abort()
            self.uploads.clear()
            for path in [*self.staged.values(), *self.committed]:
                if isinstance(path, Url):
                    from attnviz.storage.remote import remove

                    remove(path)
                    continue
                try:
                    path.unlink()
                except OSError:
                    pass
            for path in self.staged.values():
                forget(path)
            self.staged.clear()
            self.committed.clear()

    def real_names(self, text: str) -> str:
        """A message about a staged file, naming the target instead."""
        for option, stage in self.staged.items():
            text = text.replace(str(stage), str(self.targets[option]))
        return text


@contextmanager
def staged_outputs(targets: Mapping[str, Place]) -> Iterator[StagedOutputs]:
    """Reserve every target and run the body, which writes the staged files and calls ``commit``
    to put them all in place. On any error the staged files are removed (and the error re-raised,
    naming the targets); a body that ends without ``commit`` leaves nothing either."""
    staged = StagedOutputs(targets)
    try:
        staged.reserve()
        yield staged
    except BaseException as exc:
        if isinstance(exc, AttnvizError):
            exc.message = staged.real_names(exc.message)
            exc.args = (exc.message,)
        raise
    finally:
        staged.discard()  # after a commit, nothing is left to discard

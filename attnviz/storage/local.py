"""Local paths: what kind of file a path names, and a text input read from a regular file or a named pipe.

Arrays are read from regular files only (``regular_file``): a directory, a device such as ``/dev/zero``, a FIFO
or a socket, also behind a symbolic link, is refused before it is opened (exit 2, as a missing file); a FIFO's
message says that ``-`` reads an array (as JSON) from standard input. Text (labels, token files, jobs files,
configs, JSON) is also read from a named pipe (``<(...)``, a FIFO): once, in pieces, up to the same limit
(``read_text_bytes``; a run that asks for it again gets what was read). docs/inputs.md states these limits.
The standard library only.
"""

from __future__ import annotations

import errno
import os
import stat

from attnviz.errors import InputError, UsageError
from attnviz.quoting import short
from attnviz.sizes import size_str
from attnviz.storage.textfiles import MAX_TEXT_BYTES, TOO_MUCH, decode_text, read_limited

#: what a named pipe of an array is told (arrays are memory-mapped: a pipe cannot be)
PIPED_ARRAY = ("arrays are memory-mapped from regular files: save it to a file, or give the array as JSON on "
               "standard input with '-'")
#: how many named pipes' text a process keeps (a pipe is read once; a run may ask for it again)
PIPES_KEPT = 8

_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
          (stat.S_ISFIFO, "a named pipe (FIFO)"), (stat.S_ISSOCK, "a socket"))


def regular_file(path: str | os.PathLike[str], source: str | None = None, pipe: str = PIPED_ARRAY) -> int:
    """The size of ``path`` if it is a regular file (symbolic links followed); a directory, a device, a
    FIFO or a socket, also behind a symbolic link, is a usage error (exit 2) before anything opens it,
    so nothing hangs on a pipe or reads ``/dev/zero`` for ever. A FIFO's message adds ``pipe``."""
    name = source if source is not None else str(path)
    try:
        info = os.stat(path)
    except ValueError:
        raise UsageError(f"{short(name)!r}: a file name cannot contain a NUL byte.") from None
    except (FileNotFoundError, NotADirectoryError):
        if os.path.islink(path):
            raise UsageError(f"{name}: is a symbolic link to {os.readlink(path)}, which does not exist.") from None
        raise UsageError(f"{name}: no such file.") from None
    except OSError as exc:
        if exc.errno in (errno.ENAMETOOLONG, errno.ELOOP):  # the name itself is wrong: usage
            raise UsageError(f"{short(name)}: {exc.strerror}.") from None
        raise InputError(f"{name}: cannot read ({exc.strerror or exc}).") from None
    if stat.S_ISREG(info.st_mode):
        return int(info.st_size)
    kind = next((k for test, k in _KINDS if test(info.st_mode)), "not a regular file")
    via = f" (a symbolic link to {os.path.realpath(path)})" if os.path.islink(path) else ""
    if stat.S_ISDIR(info.st_mode):
        raise UsageError(f"{name}: is a directory{via}, not an array file.")
    if stat.S_ISFIFO(info.st_mode):
        raise UsageError(f"{name}: is {kind}{via}; {pipe}.")
    raise UsageError(f"{name}: is {kind}{via}, not a regular file; attnviz reads regular files only.")


def is_pipe(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is a named pipe (a FIFO, or ``/dev/fd/N`` of ``<(...)``), symbolic links followed."""
    try:
        return stat.S_ISFIFO(os.stat(path).st_mode)
    except (OSError, ValueError):
        return False


_PIPES: dict[tuple[int, int], bytes] = {}  # the text of the named pipes read, by (device, inode)


def read_text_bytes(path: str | os.PathLike[str], source: str, limit: int = MAX_TEXT_BYTES,
                    what: str = "JSON") -> bytes:
    """The bytes of a text input, at most ``limit``: a regular file, or a named pipe (``--labels <(...)``, a
    FIFO) read once, in pieces, to its end (what was read is kept: a run that reads it again, as a batch
    or several files do, gets the same text). Anything else is refused as ``regular_file`` refuses it."""
    try:
        info = os.stat(path)
    except (OSError, ValueError):
        info = None
    piped = info is not None and stat.S_ISFIFO(info.st_mode)
    if not piped:
        size = regular_file(path, source)
        if size > limit:
            advice = TOO_MUCH.get(what)
            raise InputError(f"{source}: {size_str(size)} of {what}, more than the {size_str(limit)} attnviz reads"
                             f"{'; ' + advice if advice else ''}.")
    key = (info.st_dev, info.st_ino) if info is not None and piped else None
    if key is not None and key in _PIPES:
        return _PIPES[key]
    try:
        with open(path, "rb") as fh:
            data = read_limited(fh, source, limit, what)
    except OSError as exc:
        raise InputError(f"{source}: cannot read ({exc.strerror or exc}).") from None
    if key is not None:
        _PIPES[key] = data
        while len(_PIPES) > PIPES_KEPT:
            del _PIPES[next(iter(_PIPES))]
    return data


def read_text_file(path: str | os.PathLike[str], source: str, limit: int = MAX_TEXT_BYTES,
                   what: str = "JSON") -> str:
    """A text input's text (``read_text_bytes``: a regular file or a named pipe): at most ``limit`` bytes,
    UTF-8 (a byte-order mark is dropped)."""
    return decode_text(read_text_bytes(path, source, limit, what), source, what)

"""Where files are: the one place that opens every path attnviz reads or writes, a local file or a URL of
an object store (``s3://bucket/key``, ``gs://``, ``az://``, ``memory://`` ... any scheme fsspec knows).

Commands, batch and the readers of ``attnviz.formats`` ask this package for what they need and never look
at a scheme themselves:

- ``open_input(path, source)``: a file to read, ``LocalFile`` or ``remote.RemoteFile``, with its size, a
  seekable stream, a range of bytes and an array at an offset (memory-mapped from a local file; fetched
  with one ranged request from a store, so that a key of a large file costs its own bytes only), and a
  stream read once from start to end (``stream()``: a corpus's text file, a block held at a time);
- ``read_text_bytes``: a text input (labels, jobs files, configs, JSON) whole, within a limit (``local``: a
  regular file, what kind of file a path names, a named pipe read once; ``textfiles``: text read within its
  limits, UTF-8, and a text file line by line);
- ``exists``, ``size``, ``identity``, ``glob``, ``join``, ``folder_of``, ``same_place``: what batch asks;
- ``place`` and ``check_output``: an output's target, a ``Path`` or a ``Url``; ``attnviz.staging`` writes
  every output through a staged file and, for a URL, an upload that is completed only when the whole
  run succeeded (``remote.Upload``).

A local path never imports fsspec: this module, ``local`` and ``textfiles`` are the standard library only, and
``attnviz.storage.remote`` (fsspec and the store's own package, such as s3fs) is imported the first time a URL
is met.

Endpoint and credentials come from where the store's package looks (for S3: the AWS environment, including
``AWS_ENDPOINT_URL``, ``~/.aws``, instance roles), from fsspec's own configuration, and from storage options
given with ``attnviz --storage-options`` (or ``ATTNVIZ_STORAGE_OPTIONS``, or ``storage_options=`` in Python):
a JSON object, flat (for every scheme) or by scheme (``{"s3": {...}}``). They are never printed and never
written into a document or a manifest.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from attnviz.storage import textfiles
from attnviz.storage.local import read_text_bytes as read_local
from attnviz.storage.local import regular_file
from attnviz.storage.options import OPTIONS_ENV, options_for, parse_options, set_options, using
from attnviz.storage.urls import BUCKET_SCHEMES, Place, Url, check_url, is_url, place

if TYPE_CHECKING:
    import numpy as np

__all__ = ["BUCKET_SCHEMES", "OPTIONS_ENV", "LocalFile", "Place", "Url", "check_url", "exists_relative", "folder_of",
           "glob", "identity", "is_file", "is_url", "join", "key", "local_copy", "open_input", "options_for",
           "parse_options", "place", "read_text", "read_text_bytes", "read_whole", "same_place", "set_options", "size",
           "using", "write_whole"]

# ---------------------------------------------------------------------------------------------------
# Reading


class LocalFile:
    """A local regular file to read: its size (checked to be a regular file, as ``regular_file`` does), a
    stream, ranges and memory-mapped arrays."""

    def __init__(self, path: str | os.PathLike[str], source: str) -> None:
        self.path: Path | None = Path(path)
        self.local = Path(path)
        self.source = source
        self.size = regular_file(self.local, source)

    def open(self) -> IO[bytes]:
        return open(self.local, "rb")

    def stream(self) -> IO[bytes]:
        """A stream read once from start to end (a text file line by line)."""
        return open(self.local, "rb")

    def read(self, start: int, end: int) -> bytes:
        with open(self.local, "rb") as fh:
            fh.seek(start)
            return fh.read(end - start)

    def array(self, dtype: np.dtype, offset: int, shape: tuple[int, ...], order: str = "C") -> np.ndarray:
        """The array of ``shape`` stored at ``offset``, memory-mapped (read on demand)."""
        import numpy as np

        return np.memmap(self.local, dtype=dtype, mode="r", offset=offset, shape=shape,
                         order=order)  # type: ignore[call-overload]


def open_input(path: str | os.PathLike[str], source: str) -> Any:
    """A file to read (``LocalFile``, or ``remote.RemoteFile`` for a URL): ``size``, ``open()``, ``stream()``,
    ``read(start, end)``, ``array(dtype, offset, shape, order)``, and ``local``, the path on disk of a local
    file (None for a URL: libraries that need a file name are handed the stream instead)."""
    text = os.fspath(path)
    if is_url(text):
        from attnviz.storage.remote import RemoteFile

        return RemoteFile(check_url(text), source)
    return LocalFile(path, source)


def read_text_bytes(path: str | os.PathLike[str], source: str, limit: int | None = None,
                    what: str = "JSON") -> bytes:
    """The bytes of a text input, at most ``limit``: a local regular file or named pipe
    (``local.read_text_bytes``), or an object of a store."""
    limit = textfiles.MAX_TEXT_BYTES if limit is None else limit
    text = os.fspath(path)
    if is_url(text):
        from attnviz.storage.remote import read_text

        return read_text(check_url(text), source, limit, what)
    return read_local(path, source, limit, what)


def read_text(path: str | os.PathLike[str], source: str, limit: int | None = None, what: str = "JSON") -> str:
    """A text input's text: ``read_text_bytes``, UTF-8."""
    return textfiles.decode_text(read_text_bytes(path, source, limit, what), source, what)


def is_file(path: str) -> bool:
    """Whether ``path`` is a regular file (a local one, or an object of a store); errors reaching a store are
    raised."""
    if is_url(path):
        from attnviz.storage.remote import object_size

        return object_size(check_url(path)) is not None
    return os.path.isfile(path)


def size(path: str) -> int | None:
    """The size of a regular file or an object; None when there is none."""
    if is_url(path):
        from attnviz.storage.remote import object_size

        return object_size(check_url(path))
    try:
        return os.stat(path).st_size if os.path.isfile(path) else None
    except (OSError, ValueError):
        return None


def identity(path: str) -> tuple[Any, ...] | None:
    """What tells one version of a file from another (inode, mtime and size; an object's tag and size), or
    None when there is none."""
    if is_url(path):
        from attnviz.storage.remote import object_identity

        return object_identity(check_url(path))
    import stat

    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return None
    return (st.st_ino, st.st_mtime_ns, st.st_size) if stat.S_ISREG(st.st_mode) else None


def glob(pattern: str, option: str = "--each") -> list[str]:
    """The files (not folders) a glob matches; ``**`` descends into folders. A URL's glob lists its store."""
    if is_url(pattern):
        from attnviz.storage.remote import glob as remote_glob

        return remote_glob(pattern, option)
    import glob as globbing

    return [p for p in globbing.glob(pattern, recursive=True) if not os.path.isdir(p)]


def join(base: str, relative: str) -> str:
    """``relative`` taken from the folder ``base`` (a local folder or a URL's); a URL or an absolute path is
    kept as it is."""
    if relative == "-" or is_url(relative) or os.path.isabs(relative):
        return relative
    if is_url(base):
        return f"{base.rstrip('/')}/{relative}"
    return str(Path(base) / relative)


def folder_of(path: str) -> str:
    """The folder a file is in: a URL's parent, or a local file's resolved folder."""
    if is_url(path):
        return str(Url(path).parent)
    return str(Path(path).resolve().parent)


def exists_relative(base: str, relative: str) -> bool:
    """Whether ``relative``, taken from the folder ``base``, names a file (a label option's value may be a
    file or the labels themselves; a store that cannot be reached says no)."""
    target = join(base, relative)
    if is_url(target):
        try:
            return is_file(target)
        except Exception:  # a malformed URL, an unreachable store: the text is labels
            return False
    return os.path.exists(target)


def same_place(a: str, b: str) -> bool:
    """Whether two names are one file: resolved local paths, or equal URLs."""
    if is_url(a) or is_url(b):
        return is_url(a) and is_url(b) and a.rstrip("/") == b.rstrip("/")
    try:
        return Path(a).resolve() == Path(b).resolve()
    except (OSError, ValueError):
        return False


def key(where: Place) -> str:
    """What tells places apart (an output written twice, an input written over): a URL as given, a local path
    resolved."""
    return str(where) if isinstance(where, Url) else str(where.resolve())


def read_whole(path: str) -> bytes | None:
    """The bytes of a file or object, or None when there is none (other failures raised as errors)."""
    if is_url(path):
        from attnviz.storage.remote import read_whole as remote_read

        return remote_read(check_url(path))
    try:
        return Path(path).read_bytes()
    except FileNotFoundError:
        return None


def write_whole(path: str, data: bytes, what: str = "") -> None:
    """Put ``data`` at a URL in one request: the object is whole, the old or the new (a store cannot append)."""
    from attnviz.storage.remote import write_whole as remote_write

    remote_write(check_url(path), data, what)


@contextmanager
def local_copy(path: str, source: str) -> Iterator[Path]:
    """A file on disk for a library that opens file names only (Keras, Pillow): a local path as it is, or a
    URL's object copied into the local temporary folder and removed after the block."""
    if not is_url(path):
        yield Path(path)
        return
    import tempfile

    from attnviz.storage.remote import fetch

    url = check_url(path)
    with tempfile.TemporaryDirectory(prefix="attnviz-") as folder:
        target = Path(folder) / (url.name or "object")
        fetch(url, target, source)
        yield target

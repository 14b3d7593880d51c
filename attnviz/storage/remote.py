"""Object stores through fsspec: a URL's filesystem (with the storage options and bounded timeouts), its
objects read by ranges, listed by globs, and written whole or not at all. Imported only when a URL is met.

**Reading** a ``RemoteFile`` asks for what it needs: ``read(start, end)`` is one ranged GET, and
``array(...)`` one ranged GET of exactly the array's bytes (into memory, within ``memory_limit()``), so a
safetensors key or a member of an ``.npz`` costs its header and its own bytes. ``open()`` gives a stream
for libraries that read a file themselves (zip directories, HDF5, ``torch.load``), fetched in small blocks
(``BLOCK``, each fetched once; the blocks of one read in one request: fsspec's ``mmap`` cache, a sparse
temporary file) rather than fsspec's default read-ahead of many megabytes; ``stream()`` one read once from
start to end (a text file line by line), a block of ``STREAM_BLOCK`` held at a time.

**Writing** an ``Upload`` is in two steps: ``send`` streams the staged file into a multipart upload that is
not completed (nothing appears at the URL), ``complete`` completes it. ``abort`` throws the upload away
(a failed run, Ctrl-C, SIGTERM): no object appears. ``attnviz.staging`` sends every upload of a run first,
then completes them together, as it renames local files.

**Errors** are one line naming the URL and the cause, exit 1 (``failure``): no such bucket, no such object,
access denied, no credentials, an unreachable endpoint, an unknown scheme, a store whose package is not
installed. Timeouts and retries are bounded (``DEFAULTS``; storage options override them).
"""

from __future__ import annotations

import json
import shutil
import threading
from pathlib import Path
from typing import IO, Any

import numpy as np

from attnviz.errors import AttnvizError, InputError, OutputError, UsageError
from attnviz.quoting import reason
from attnviz.sizes import check_memory, size_str
from attnviz.storage.options import options_for
from attnviz.storage.urls import Url, check_url

#: the block of a stream (zip directories, HDF5 metadata): small, so that little more is fetched than read
BLOCK = 8 * 2**10
#: the block of a stream read once from start to end (``RemoteFile.stream``: a corpus's text file)
STREAM_BLOCK = 4 * 2**20
#: what a store's package is called, and the extra of attnviz that installs it, by scheme
PACKAGES = {"s3": ("s3fs", "s3"), "s3a": ("s3fs", "s3"), "gs": ("gcsfs", "gcs"), "gcs": ("gcsfs", "gcs"),
            "az": ("adlfs", "azure"), "abfs": ("adlfs", "azure"), "abfss": ("adlfs", "azure"),
            "adl": ("adlfs", "azure")}
#: bounded waiting by default: a store that cannot be reached is an error within seconds, not minutes
DEFAULTS: dict[str, dict[str, Any]] = {
    "s3": {"config_kwargs": {"connect_timeout": 5, "read_timeout": 60,
                             "retries": {"max_attempts": 2, "mode": "standard"}}},  # 3 tries
}
DEFAULTS["s3a"] = DEFAULTS["s3"]
#: attributes of a filesystem set after it is made (s3fs's own loop of retries, over botocore's: once is enough)
ATTRIBUTES: dict[str, dict[str, Any]] = {"s3": {"retries": 1}, "s3a": {"retries": 1}}
#: the part size of an upload (S3 takes parts of 5 MiB to 5 GiB, at most 10,000 of them)
PART = 50 * 2**20

_lock = threading.Lock()
_filesystems: dict[tuple[str, str], Any] = {}


def known_scheme(name: str) -> bool:
    """Whether fsspec knows ``name`` as a scheme."""
    import fsspec

    return name in fsspec.available_protocols()


def _merged(defaults: dict[str, Any], given: dict[str, Any]) -> dict[str, Any]:
    out = dict(defaults)
    for k, v in given.items():
        out[k] = _merged(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def filesystem(url: Url) -> tuple[Any, str]:
    """The fsspec filesystem of ``url`` (one per scheme and storage options) and the path within it."""
    import fsspec

    scheme = url.scheme
    try:
        cls = fsspec.get_filesystem_class(scheme)
    except ImportError as exc:
        package, extra = PACKAGES.get(scheme, (None, None))
        if package is None:
            raise InputError(f"{url}: {scheme}:// URLs need a package that is not installed ({reason(exc)}).") \
                from None
        raise InputError(f"{url}: {scheme}:// URLs need {package}, which is not installed; pip install "
                         f"'attnviz[{extra}]' (or pip install {package}).") from None
    except ValueError:
        raise InputError(f"{url}: unknown scheme {scheme}://; attnviz opens the URLs fsspec knows (s3://, gs://, "
                         "az://, memory:// ...).") from None
    options = _merged(DEFAULTS.get(scheme, {}), options_for(scheme))
    tag = (scheme, json.dumps(options, sort_keys=True, default=str))
    with _lock:
        fs = _filesystems.get(tag)
        if fs is None:
            try:
                fs = cls(**options)
            except TypeError as exc:
                raise UsageError(f"{url}: the storage options do not fit {scheme}:// ({reason(exc)}).") from None
            except Exception as exc:
                raise failure(exc, url, "open") from None
            for name, value in ATTRIBUTES.get(scheme, {}).items():
                if hasattr(fs, name):
                    setattr(fs, name, value)
            _filesystems[tag] = fs
    return fs, cls._strip_protocol(str(url))


def _names(exc: BaseException) -> set[str]:
    return {t.__name__ for t in type(exc).__mro__}


def failure(exc: BaseException, url: str, doing: str = "read", output: bool = False) -> AttnvizError:
    """One line for an error of a store: the URL, and what went wrong (never the storage options)."""
    if isinstance(exc, AttnvizError):
        return exc
    kind = OutputError if output else InputError
    names = _names(exc)
    cause = exc.__cause__ or exc.__context__
    text = reason(exc)
    lowered = text.lower()
    if isinstance(exc, FileNotFoundError):
        if "bucket" in lowered or "container" in lowered:
            return kind(f"{url}: no such bucket ({text}).")
        return kind(f"{url}: no such object." if not output else f"{url}: cannot write ({text}).")
    if isinstance(exc, PermissionError) or "AccessDenied" in text or "Forbidden" in text:
        return kind(f"{url}: access denied ({text}).")
    if "NoCredentialsError" in names or "no credentials" in lowered or "unable to locate credentials" in lowered:
        return kind(f"{url}: no credentials to {doing} it; set them as the store's package looks for them (for S3: "
                    "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, ~/.aws, an instance role), or "
                    "--storage-options '{\"anon\": true}' for a public bucket.")
    unreachable = {"EndpointConnectionError", "ConnectTimeoutError", "ConnectionClosedError", "ClientConnectorError",
                   "ServerDisconnectedError", "ConnectionError", "TimeoutError", "FSTimeoutError", "ReadTimeoutError",
                   "ClientOSError", "ServerTimeoutError", "ProxyConnectionError"}
    if names & unreachable or (cause is not None and _names(cause) & unreachable):
        return kind(f"{url}: cannot reach the store ({text}); check the endpoint (AWS_ENDPOINT_URL, "
                    "--storage-options) and the network.")
    return kind(f"{url}: cannot {doing} it ({type(exc).__name__}: {text}).")


class RemoteFile:
    """An object of a store to read (``attnviz.storage.open_input``): ``size``, ``open()``, ``read(start,
    end)`` and ``array(...)``; ``local`` is None (there is no file on disk to map or hand a library)."""

    local: Path | None = None

    def __init__(self, url: Url, source: str) -> None:
        self.url = url
        self.source = source
        self.fs, self.path = filesystem(url)
        try:
            info = self.fs.info(self.path)
        except Exception as exc:
            raise failure(exc, url) from None
        if info.get("type") == "directory":
            raise UsageError(f"{source}: is a folder (a prefix of the store), not an object.")
        self.size = int(info.get("size") or 0)

    def open(self) -> IO[bytes]:
        """A seekable stream that fetches what is read, in blocks of ``BLOCK`` bytes, each once."""
        try:
            return self.fs.open(self.path, "rb", block_size=BLOCK, cache_type="mmap")  # type: ignore[no-any-return]
        except Exception as exc:
            raise failure(exc, self.url) from None

    def stream(self) -> Stream:
        """A stream read once from start to end (a text file line by line): fsspec's read-ahead cache, which
        holds one block (``STREAM_BLOCK``) and fetches the next as it is reached; nothing read is kept. An error
        of the store while it is read is one line (``failure``)."""
        try:
            return Stream(self.fs.open(self.path, "rb", block_size=STREAM_BLOCK, cache_type="readahead"), self.url)
        except Exception as exc:
            raise failure(exc, self.url) from None

    def read(self, start: int, end: int) -> bytes:
        """Bytes ``start`` to ``end`` (one ranged request)."""
        end = min(end, self.size)
        if end <= start:
            return b""
        try:
            data = self.fs.cat_file(self.path, start=start, end=end)
        except Exception as exc:
            raise failure(exc, self.url) from None
        if len(data) != end - start:
            raise InputError(f"{self.source}: the store sent {len(data)} of the {end - start} bytes asked for (the "
                             "object changed while it was read?).")
        return bytes(data)

    def array(self, dtype: np.dtype, offset: int, shape: tuple[int, ...], order: str = "C") -> np.ndarray:
        """The array of ``shape`` at ``offset``, fetched with one ranged request into memory (at most
        ``memory_limit()``), read-only as a memory map is."""
        count = 1
        for n in shape:
            count *= int(n)
        nbytes = count * dtype.itemsize
        check_memory(nbytes, self.source, "(fetched from the store)", shape)
        data = self.read(offset, offset + nbytes)
        arr = np.frombuffer(data, dtype=dtype, count=count).reshape(shape, order=order)  # type: ignore[call-overload]
        return arr  # type: ignore[no-any-return]


class Stream:
    """``RemoteFile.stream``'s stream: ``read`` and ``close`` (a context manager), the store's errors as one line."""

    def __init__(self, handle: Any, url: Url) -> None:
        self.handle, self.url = handle, url

    def read(self, size: int = -1) -> bytes:
        try:
            return bytes(self.handle.read(size))
        except Exception as exc:
            raise failure(exc, self.url) from None

    def close(self) -> None:
        self.handle.close()

    def __enter__(self) -> Stream:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


def read_text(url: Url, source: str, limit: int, what: str) -> bytes:
    """A text object whole, at most ``limit`` bytes."""
    from attnviz.storage.textfiles import TOO_MUCH

    fs, path = filesystem(url)
    try:
        info = fs.info(path)
    except Exception as exc:
        raise failure(exc, url) from None
    if info.get("type") == "directory":
        raise UsageError(f"{source}: is a folder (a prefix of the store), not an object.")
    size = int(info.get("size") or 0)
    if size > limit:
        advice = TOO_MUCH.get(what)
        raise InputError(f"{source}: {size_str(size)} of {what}, more than the {size_str(limit)} attnviz reads"
                         f"{'; ' + advice if advice else ''}.")
    try:
        return bytes(fs.cat_file(path))
    except Exception as exc:
        raise failure(exc, url) from None


def object_size(url: Url) -> int | None:
    """The size of the object at ``url``; None when there is none (errors reaching the store are raised)."""
    info = _info(url)
    return None if info is None else int(info.get("size") or 0)


def object_identity(url: Url) -> tuple[Any, ...] | None:
    """What tells one version of an object from another: its tag (or time) and size; None when there is none."""
    try:
        info = _info(url, refresh=True)
    except AttnvizError:
        return None
    if info is None:
        return None
    tag = info.get("ETag") or info.get("etag") or info.get("md5_checksum") or info.get("LastModified") \
        or info.get("mtime") or info.get("created")
    return (str(tag), int(info.get("size") or 0))


def _info(url: Url, refresh: bool = False) -> dict[str, Any] | None:
    fs, path = filesystem(url)
    try:
        if refresh:
            fs.invalidate_cache(path)
        info = fs.info(path)
    except FileNotFoundError as exc:
        _no_object(exc, url)
        return None
    except Exception as exc:
        raise failure(exc, url) from None
    return None if info.get("type") == "directory" else dict(info)


def _no_object(exc: FileNotFoundError, url: Url) -> None:
    """A missing object is the caller's None; a missing bucket is the one-line error, raised here."""
    if "bucket" in str(exc).lower():
        raise failure(exc, url) from None


def glob(pattern: str, option: str = "--each") -> list[str]:
    """The objects a glob matches (``**`` descends), as URLs."""
    url = check_url(pattern, option)
    fs, path = filesystem(url)
    try:
        found = fs.glob(path, detail=True)
        if not found and getattr(fs, "root_marker", "/") == "":  # nothing: is there a bucket at all?
            bucket = path.strip("/").split("/", 1)[0]
            if not fs.exists(bucket):
                raise FileNotFoundError(f"no bucket {bucket}")
    except Exception as exc:
        raise failure(exc, url, "list") from None
    return [fs.unstrip_protocol(name) for name, info in found.items() if info.get("type") != "directory"]


def remove(url: Url) -> None:
    """Delete an object (a committed output of a run that failed after all); errors are left unsaid."""
    try:
        fs, path = filesystem(url)
        fs.rm_file(path)
    except Exception:
        pass


def write_whole(url: Url, data: bytes, what: str) -> None:
    """Put ``data`` at ``url`` in one request: the object is the old one or the new one, never a part."""
    fs, path = filesystem(url)
    try:
        fs.pipe_file(path, data)
    except Exception as exc:
        raise failure(exc, url, "write", output=True) from None


def read_whole(url: Url) -> bytes | None:
    """The bytes of the object at ``url``, or None when there is none."""
    fs, path = filesystem(url)
    try:
        return bytes(fs.cat_file(path))
    except FileNotFoundError as exc:
        _no_object(exc, url)
        return None
    except Exception as exc:
        raise failure(exc, url) from None


class Upload:
    """An output's upload, whole or nothing: ``check`` (before the run: the bucket is there), ``send`` (the
    staged file into an upload that is not completed), ``complete``, ``abort``."""

    def __init__(self, url: Url, option: str) -> None:
        self.url = url
        self.option = option
        self._file: Any = None

    def _where(self) -> str:
        return f"{self.option} {self.url}"

    def check(self) -> None:
        """That the bucket (or container) is there and answers, before anything is computed."""
        fs, path = filesystem(self.url)
        if getattr(fs, "root_marker", "/") != "":  # a store without buckets (memory://)
            return
        bucket = path.strip("/").split("/", 1)[0]
        try:
            there = fs.exists(bucket)
        except Exception as exc:
            raise OutputError(failure(exc, str(self.url), "write", output=True).message.replace(
                str(self.url), self._where(), 1)) from None
        if not there:
            raise OutputError(f"{self._where()}: no such bucket ({bucket}).")

    def send(self, staged: Path) -> None:
        """Stream the staged file into an upload that is not completed yet: nothing appears at the URL."""
        fs, path = filesystem(self.url)
        try:
            self._file = fs.open(path, "wb", block_size=PART, autocommit=False)
            with open(staged, "rb") as src:
                shutil.copyfileobj(src, self._file, PART)
            self._file.close()
        except BaseException as exc:
            self.abort()
            if isinstance(exc, Exception):
                raise OutputError(failure(exc, str(self.url), "write", output=True).message.replace(
                    str(self.url), self._where(), 1)) from None
            raise

    def complete(self) -> None:
        """Complete the upload: the object appears whole."""
        if self._file is None:
            return
        try:
            self._file.commit()
        except Exception as exc:
            self.abort()
            raise OutputError(failure(exc, str(self.url), "write", output=True).message.replace(
                str(self.url), self._where(), 1)) from None
        self._file = None

    def abort(self) -> None:
        """Throw the upload away (nothing appears); errors are left unsaid (the store drops it in time)."""
        f, self._file = self._file, None
        if f is None:
            return
        try:
            f.discard()
        except Exception:
            pass
        f.closed = True  # a discarded file is not to be flushed when it is collected


def fetch(url: Url, target: Path, source: str) -> None:
    """The object at ``url`` copied to the local file ``target`` (for a library that opens file names only)."""
    fs, path = filesystem(url)
    try:
        info = fs.info(path)
        if info.get("type") == "directory":
            raise UsageError(f"{source}: is a folder (a prefix of the store), not an object.")
        fs.get_file(path, str(target))
    except AttnvizError:
        raise
    except Exception as exc:
        raise failure(exc, url) from None

"""URLs as attnviz takes them (``s3://bucket/key``): telling one from a local path, its parts, its form
checked (a malformed URL is a usage error, exit 2). The standard library only."""

from __future__ import annotations

import os
import re
from pathlib import Path, PurePosixPath

from attnviz.errors import UsageError

#: a URL: a scheme of two or more characters (a Windows drive letter is one) and ``://``
_URL = re.compile(r"([A-Za-z][A-Za-z0-9+.\-]+)://")
#: schemes whose first path component is a bucket (or container): it must be there
BUCKET_SCHEMES = ("s3", "s3a", "gs", "gcs", "az", "abfs", "abfss", "adl", "oss", "r2")


def is_url(text: object) -> bool:
    """Whether ``text`` is a URL (``scheme://...``) rather than a local path."""
    return isinstance(text, str) and _URL.match(text) is not None


class Url(str):
    """A URL as the user gave it (``s3://bucket/dumps/run.npz``), with the parts of a path that messages,
    output names and staging use (``name``, ``suffix``, ``parent``)."""

    @property
    def scheme(self) -> str:
        return self.split("://", 1)[0].lower()

    @property
    def rest(self) -> str:
        """What follows ``scheme://``."""
        return self.split("://", 1)[1]

    @property
    def name(self) -> str:
        return self.rest.rstrip("/").rpartition("/")[2]

    @property
    def suffix(self) -> str:
        return PurePosixPath(self.name).suffix

    @property
    def stem(self) -> str:
        return PurePosixPath(self.name).stem

    @property
    def parent(self) -> Url:
        head = self.rest.rstrip("/").rpartition("/")[0]
        return Url(f"{self.split('://', 1)[0]}://{head}")


#: where a file is: a local path or a URL
Place = Path | Url


def check_url(url: str, what: str = "") -> Url:
    """``url`` as a ``Url``; a malformed one is a usage error (exit 2): nothing after ``scheme://``, no bucket,
    white space or control characters, no object named (a folder)."""
    where = f"{what} {url}" if what else url
    rest = url.split("://", 1)[1]
    scheme = url.split("://", 1)[0].lower()
    if any(ord(c) < 32 or c == "\x7f" for c in url) or any(c.isspace() for c in url):
        raise UsageError(f"{where!r}: a URL cannot hold white space or control characters.")
    if not rest.strip("/"):
        raise UsageError(f"{where}: a malformed URL (nothing after {scheme}://); write {scheme}://BUCKET/KEY.")
    if scheme in BUCKET_SCHEMES and rest.startswith("/"):
        raise UsageError(f"{where}: a malformed URL (no bucket after {scheme}://); write {scheme}://BUCKET/KEY.")
    if scheme in BUCKET_SCHEMES and "/" not in rest.strip("/"):
        raise UsageError(f"{where}: names a bucket, not an object; write {scheme}://BUCKET/KEY.")
    if rest.endswith("/"):
        raise UsageError(f"{where}: names a folder (it ends in /), not an object.")
    return Url(url)


def place(value: str | os.PathLike[str]) -> Place:
    """Where ``value`` is: a ``Url`` (checked) or a local ``Path``."""
    text = os.fspath(value)
    return check_url(text) if is_url(text) else Path(text)

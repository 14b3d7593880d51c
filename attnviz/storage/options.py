"""Storage options: fsspec's options for a URL's filesystem (an endpoint, credentials, ``anon``), from
``ATTNVIZ_STORAGE_OPTIONS``, ``attnviz --storage-options`` and the Python API's ``storage_options=``. A JSON
object, flat (for every scheme) or by scheme (``{"s3": {...}}``); its text is never repeated in a message."""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

from attnviz.errors import UsageError

#: the environment variable of storage options (JSON, as ``--storage-options``)
OPTIONS_ENV = "ATTNVIZ_STORAGE_OPTIONS"

_given: dict[str, Any] | None = None  # --storage-options: the whole process (a batch's jobs run in threads)
_context: ContextVar[dict[str, Any] | None] = ContextVar("attnviz_storage_options", default=None)


def parse_options(text: str, where: str = "--storage-options") -> dict[str, Any]:
    """Storage options from a JSON object, or from a local JSON file that holds one. The text itself is
    never repeated in a message (it may hold a secret)."""
    import json

    body = text
    if not text.lstrip().startswith("{"):
        try:
            with open(text, "rb") as fh:
                body = fh.read(1 << 20).decode("utf-8")
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            raise UsageError(f"{where}: neither a JSON object nor a readable JSON file "
                             f"({getattr(exc, 'strerror', None) or type(exc).__name__}).") from None
    try:
        value = json.loads(body)
    except ValueError as exc:
        raise UsageError(f"{where}: not valid JSON ({str(exc).splitlines()[0][:80]}); give a JSON object such as "
                         "'{\"s3\": {\"anon\": true}}'.") from None
    if not isinstance(value, dict):
        raise UsageError(f"{where}: a JSON object of storage options, not a JSON {type(value).__name__}.")
    return value


def set_options(text: str | Mapping[str, Any] | None) -> None:
    """The storage options of this process (``attnviz --storage-options``); None leaves them as they are."""
    global _given
    if text is None:
        return
    _given = parse_options(text) if isinstance(text, str) else dict(text)


@contextmanager
def using(options: Mapping[str, Any] | None) -> Iterator[None]:
    """Storage options for the block (the Python API's ``storage_options=``), over the process's own."""
    if options is None:
        yield
        return
    if not isinstance(options, Mapping):
        raise UsageError(f"storage_options: a dict of fsspec storage options, not {type(options).__name__}.")
    token = _context.set({**(_context.get() or {}), **options})
    try:
        yield
    finally:
        _context.reset(token)


def options_for(scheme: str) -> dict[str, Any]:
    """The storage options for a URL of ``scheme``: the environment's (``ATTNVIZ_STORAGE_OPTIONS``), then
    ``--storage-options``, then the API's; in each, flat options apply to every scheme and an object under the
    scheme's name to that scheme only (a key that names another scheme is left out)."""
    layers: list[Mapping[str, Any]] = []
    env = os.environ.get(OPTIONS_ENV)
    if env:
        layers.append(parse_options(env, OPTIONS_ENV))
    for given in (_given, _context.get()):
        if given:
            layers.append(given)
    out: dict[str, Any] = {}
    for layer in layers:
        for key, value in layer.items():
            if key == scheme and isinstance(value, Mapping):
                out.update(value)
            elif not (isinstance(value, Mapping) and _is_scheme(key)):
                out[key] = value
    return out


def _is_scheme(name: str) -> bool:
    """Whether an options key names a scheme fsspec knows (its value is that scheme's options)."""
    import fsspec

    return name in fsspec.available_protocols()

"""File maps: one command over many files, named by placeholders.

``attnviz batch --each 'acts/*.npz' -- inspect {} --png out/{stem}.png`` runs the command once per
file; ``attnviz inspect a.npy b.npy --png out/{stem}.png`` does the same for the files it is given.
A template's placeholders, for the file ``acts/run_2.npz`` (or a spec ``acts/run_2.npz:KEY``):

    {}       the path (spec) as listed: ``acts/run_2.npz``
    {name}   its file name: ``run_2.npz``
    {stem}   the file name without its last suffix: ``run_2``
    {dir}    its folder: ``acts`` (``.`` when the path has none; ``s3://bucket/acts`` for a URL's)
    {index}  its 0-based position in the sorted list of files: ``0``, ``1`` ...

``{{`` and ``}}`` are a literal ``{`` and ``}``; any other use of a brace is an error (exit 2), so a
misspelt placeholder never becomes part of a file name. ``{name}``, ``{stem}`` and ``{dir}`` come
from the file part of a ``FILE:KEY`` spec.

The list of files is sorted naturally (``run_2`` before ``run_10``) and holds each path once, whatever
order a glob or standard input gives them in.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping

from attnviz.errors import InputError, UsageError

PLACEHOLDERS = ("{}", "{name}", "{stem}", "{dir}", "{index}")
_TOKEN = re.compile(r"\{\{|\}\}|\{([^{}]*)\}|\{|\}")
HINT = "placeholders: {}, {name}, {stem}, {dir}, {index}; {{ and }} are literal braces"


def _fields(path: str, index: int) -> dict[str, str]:
    from attnviz.io import split_spec

    file_part, _ = split_spec(path)
    folder, name = os.path.split(file_part)
    stem, dot, suffix = name.rpartition(".")
    if not dot or not stem:  # "run", ".hidden": no suffix to drop (as pathlib's stem)
        stem = name
    return {"": path, "name": name, "stem": stem, "dir": folder or ".", "index": str(index)}


def check_template(text: str, where: str) -> bool:
    """Whether ``text`` uses a placeholder; exit 2 (naming ``where``) on an unknown one or a lone brace."""
    used = False
    for match in _TOKEN.finditer(text):
        token = match.group(0)
        if token in ("{{", "}}"):
            continue
        field = match.group(1)
        if field is None:
            raise UsageError(f"{where}: a lone {token!r} in {text!r}; write {token * 2} for a literal brace "
                             f"({HINT}).")
        if field not in ("", "name", "stem", "dir", "index"):
            raise UsageError(f"{where}: unknown placeholder {{{field}}} in {text!r} ({HINT}).")
        used = True
    return used


def expand(text: str, path: str, index: int) -> str:
    """``text`` with its placeholders filled in for ``path`` (checked first with ``check_template``)."""
    fields = _fields(path, index)

    def one(match: re.Match[str]) -> str:
        token = match.group(0)
        if token in ("{{", "}}"):
            return token[0]
        return fields[match.group(1)]

    return _TOKEN.sub(one, text)


def sorted_paths(paths: Iterable[str]) -> list[str]:
    """Natural order, each path once."""
    from attnviz.formats import natural_key

    return sorted(set(paths), key=natural_key)


def glob_paths(pattern: str, option: str = "--each") -> list[str]:
    """The files (not folders) a glob matches, sorted naturally; ``**`` descends into folders; a URL's glob
    (``s3://bucket/dumps/**/*.npz``) lists its store. Exit 2 when nothing matches."""
    from attnviz import storage

    found = storage.glob(pattern, option)
    if not found:
        raise UsageError(f"{option} {pattern!r}: no file matches.")
    return sorted_paths(found)


def stdin_paths(data: bytes, option: str = "--each -") -> list[str]:
    """Paths read from standard input, one a line (a path cannot hold a line feed); blank lines are
    skipped and a trailing carriage return is dropped. Sorted naturally, each once."""
    nul = data.find(b"\0")
    if nul >= 0:
        raise InputError(f"{option}: a NUL byte at offset {nul} of standard input; give one path a line "
                         "(find -print, not -print0).")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(f"{option}: standard input is not UTF-8 text (byte 0x{data[exc.start]:02x} at offset "
                         f"{exc.start}).") from None
    paths = [line.removesuffix("\r") for line in text.split("\n") if line.strip()]
    if not paths:
        raise UsageError(f"{option}: no paths on standard input (one a line).")
    return sorted_paths(paths)


def per_file_outputs(outputs: Mapping[str, str | None], files: list[str]) -> list[dict[str, str | None]]:
    """Each file's output names (option -> name) from templates, for a command given several files.

    Every output named must use a placeholder (else every file would write it: exit 2), and no two
    files may give the same name (exit 2)."""
    from attnviz import storage

    given = {option: value for option, value in outputs.items() if value is not None}
    for option, value in given.items():
        if not check_template(value, option):
            raise UsageError(f"{option} {value}: {len(files)} files would all write it; name it with a placeholder, "
                             f"e.g. out/{{stem}}{os.path.splitext(value)[1]} ({HINT}).")
    plans: list[dict[str, str | None]] = []
    seen: dict[str, tuple[str, str]] = {}
    for index, path in enumerate(files):
        plan: dict[str, str | None] = dict.fromkeys(outputs)
        for option, value in given.items():
            name = expand(value, path, index)
            key = name if storage.is_url(name) else os.path.normpath(name)
            if key in seen and seen[key][1] != path:
                other = seen[key][1]
                raise UsageError(f"{option} {value}: {other} and {path} both give {name}; use a placeholder that "
                                 "tells them apart ({index}, {dir}).")
            seen[key] = (option, path)
            plan[option] = name
        plans.append(plan)
    return plans

"""Reading arrays, labels and bundles; writing output files atomically. The single entrance for inputs.

Inputs are ``file.npy``, ``file.json`` (nested numeric lists, or an object ``{"data": [...],
"labels": [...]}``), ``-`` for JSON on standard input, and files of named arrays: ``.npz``,
``.safetensors``, HDF5 (``.h5``, ``.hdf5``) and ``torch.save`` files (``.pt``, ``.pth``, ``.bin``),
read by the modules of ``attnviz.formats``. ``FILE:KEY`` picks one array of such a file (a file of
one array needs no key); the key may be a glob (``blocks.*.attn``, ``attn/layer[0-3]``) whose
matches come in natural order. A single file (or JSON object) holding one array per input name
(``q``, ``k``, ``v`` ...) may stand in for all the inputs of a command; it may also hold ``mask``,
``q_labels`` and ``k_labels``.

Nothing here unpickles: every ``numpy.load`` passes ``allow_pickle=False``, and ``torch.load`` is
called with ``weights_only=True``. NumPy only at import time.

Limits (docs/inputs.md): only regular files are opened (``storage.local``: a directory, device, FIFO or
socket, also behind a symbolic link, is a usage error, exit 2); array sizes are judged from headers before
anything is allocated (``attnviz.sizes``); JSON (a file or standard input) is read in pieces, at most
``MAX_TEXT_BYTES``, must be UTF-8 (``storage.textfiles``), and may nest at most ``MAX_JSON_DEPTH`` deep
(``attnviz.jsontext``).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import numpy as np

from attnviz import formats
from attnviz.errors import AttnvizError, InputError, OutputError, UsageError, shape_str
from attnviz.formats import CONTAINER_SUFFIXES, Container, is_glob, listing, natural
from attnviz.formats.npz import NpzArchive as NpzArchive  # re-exported for callers that import it from here
from attnviz.jsontext import loads_json
from attnviz.staging import forget, hidden_file, umask
from attnviz.storage import Place, Url, check_url, is_url
from attnviz.storage.local import PIPED_ARRAY, is_pipe, read_text_file, regular_file
from attnviz.storage.textfiles import MAX_TEXT_BYTES, BinaryText, decode_text, read_limited

ARRAY_SUFFIXES = (*formats.BY_SUFFIX, ".json")
#: a spec that starts with NUL (never in a file name) names a value handed over in memory (``in_memory``)
MEMORY = "\0"
_MEMORY: ContextVar[Mapping[str, Any] | None] = ContextVar("attnviz_memory", default=None)
#: what messages call some files: a temporary capture is named for its model (``inspect --model``)
_NAMES: ContextVar[Mapping[str, str] | None] = ContextVar("attnviz_names", default=None)


@contextmanager
def named(names: Mapping[str, str]) -> Iterator[None]:
    """Within the block, messages and documents call the file ``path`` by ``names[path]``."""
    token = _NAMES.set({**(_NAMES.get() or {}), **names})
    try:
        yield
    finally:
        _NAMES.reset(token)
#: bundle keys that are not inputs of a variant
BUNDLE_EXTRAS = ("mask", "q_labels", "k_labels")
STDIN = "-"


@dataclass
class Loaded:
    """One array read from a file, with where it came from (for messages) and optional labels."""

    data: np.ndarray
    source: str  # how to name it in a message: "q.npy", "acts.npz:q", "<stdin>"
    path: Place | None  # the file on disk (or its URL), None for stdin
    labels: list[str] | None = None
    #: the dtype the file stored, when reading widened it (bfloat16 and float16 become float32)
    stored_dtype: str | None = None


STDIN_SOURCE = "<stdin>"


def read_stdin(stream: IO[Any] | None = None, what: str = "JSON", limit: int = MAX_TEXT_BYTES) -> str:
    """Standard input as text: read in pieces (bytes where the stream has them), at most ``limit``,
    UTF-8; binary or undecodable input is an error naming ``'-' (<stdin>)``."""
    stream = stream if stream is not None else sys.stdin
    if stream is None:
        raise InputError(f"{STDIN_SOURCE}: there is no standard input to read ('-').")
    raw = getattr(stream, "buffer", None)
    source = f"'-' ({STDIN_SOURCE})"
    data = read_limited(raw if raw is not None else stream, source, limit, what)
    return decode_text(data, source, what)


class StdinReader:
    """Reads standard input once; a second ``-`` would find it empty, so it is refused."""

    def __init__(self, stream: IO[str] | None = None) -> None:
        self._stream = stream
        self._used = False

    def read(self) -> str:
        if self._used:
            raise UsageError("'-' (standard input) can be used for one input only.")
        self._used = True
        return read_stdin(self._stream)


class MemoryContainer(Container):
    """Named arrays handed over in memory (the Python API: a tuple of layers, ``generate()``'s tuple of
    steps of layers, a dict of parameters), under dotted keys as a ``torch.save`` file's."""

    noun = "value"

    def __init__(self, source: str, arrays: Mapping[str, np.ndarray]) -> None:
        super().__init__(source, list(arrays))
        self._arrays = dict(arrays)

    def read(self, key: str) -> np.ndarray:
        return self.upcast(key, self._arrays[key])


@contextmanager
def in_memory(values: Mapping[str, Any]) -> Iterator[None]:
    """Make ``values`` (NumPy arrays, ``MemoryContainer``s, label lists, JSON-like dicts) readable as the
    specs ``memory_spec(name)`` within the block (a context variable: threads and batch jobs keep theirs)."""
    token = _MEMORY.set({**(_MEMORY.get() or {}), **values})
    try:
        yield
    finally:
        _MEMORY.reset(token)


def memory_spec(name: str) -> str:
    """The spec of the value ``name`` handed over with ``in_memory``; messages call it ``name``."""
    return MEMORY + name


def spec_name(spec: str) -> str:
    """How a message or a document names ``spec``: a memory spec by its name, a file spec as given."""
    return spec[len(MEMORY):] if spec.startswith(MEMORY) else spec


def memory_value(spec: str) -> Any:
    """The value a memory spec names."""
    name = spec[len(MEMORY):]
    values = _MEMORY.get() or {}
    if name not in values:
        raise UsageError(f"{name}: no such value was handed over.")
    return values[name]


def split_spec(spec: str) -> tuple[str, str | None]:
    """Split ``FILE.EXT:KEY`` into ``("FILE.EXT", "KEY")`` for every file of named arrays (``.npz``,
    ``.safetensors``, ``.h5``, ``.hdf5``, ``.pt``, ``.pth``, ``.bin``); other specs have no key.

    A path that exists as given is never split, so file names containing ``:`` still work. The key
    may hold ``:`` and ``/`` (``run.h5:attn/layer0``); where several splits are possible, the first
    whose file exists wins, else the first. A URL (``s3://bucket/run.safetensors:layer.*.attn``) splits
    the same way; the store is asked only when several splits are possible.
    """
    from attnviz import storage

    url = is_url(spec)
    if spec == STDIN or ":" not in spec or (not url and os.path.exists(spec)):
        return spec, None
    first = spec.index("://") + 3 if url else 0
    cuts = [i for i, c in enumerate(spec)
            if c == ":" and i >= first and i + 1 < len(spec) and spec[:i].lower().endswith(CONTAINER_SUFFIXES)]
    if not cuts:
        return spec, None
    if len(cuts) == 1:
        cut = cuts[0]
    else:
        cut = next((i for i in cuts if _is_file(storage, spec[:i])), cuts[0])
    return spec[:cut], spec[cut + 1:]


def _is_file(storage: Any, path: str) -> bool:
    try:
        return bool(storage.is_file(path))
    except (AttnvizError, ValueError, OSError):
        return False


def supported() -> str:
    """The file types attnviz reads, for messages."""
    return (f"{formats.describe()}, .json, FILE:KEY for one array of a file of several ({formats.describe(True)}; "
            "the key may be a glob), or '-' for JSON on standard input")


def _check_path(path: str) -> Place:
    """A path that names a regular file of a type attnviz reads (exit 2 otherwise): a directory, device,
    FIFO or socket is refused before it is opened, also behind a symbolic link; but a named pipe of JSON
    text (``<(...)``, or a FIFO named ``.json``) is read as text, once. A URL is checked for its form and
    type here, and found (or not) when it is opened."""
    if not path:  # Path("") is the working folder
        raise UsageError("'': an empty file name.")
    if is_url(path):
        url = check_url(path)
        if url.suffix.lower() not in ARRAY_SUFFIXES:
            raise UsageError(f"{path}: unknown file type {url.suffix or '(none)'!r}; attnviz reads {supported()}.")
        return url
    p = Path(path)
    if p.suffix.lower() in ("", ".json") and is_pipe(p):
        return p
    if os.path.lexists(p) or "\0" in path:
        regular_file(p, path)  # exists: it must be a regular file
    if p.suffix.lower() not in ARRAY_SUFFIXES:
        raise UsageError(f"{path}: unknown file type {p.suffix or '(none)'!r}; attnviz reads {supported()}.")
    regular_file(p, path)  # missing: "no such file"
    return p


def validate_array(arr: np.ndarray, source: str, *, allow_neg_inf: bool = False,
                   allow_nonfinite: bool = False) -> np.ndarray:
    """Refuse what no attention variant can use: objects, strings, complex, empty or non-finite arrays
    (``allow_nonfinite``: the inspector reports NaN and Inf itself)."""
    if arr.dtype.kind not in "biuf":
        what = {
            "O": "Python objects",
            "U": "text",
            "S": "bytes",
            "c": "complex numbers",
            "V": "structured records",
        }.get(arr.dtype.kind, f"dtype {arr.dtype}")
        raise InputError(f"{source}: holds {what} ({arr.dtype}); attnviz needs a numeric array.")
    if arr.size == 0:
        raise InputError(f"{source}: the array is empty (shape {shape_str(arr.shape)}).")
    if arr.dtype.kind == "f" and not allow_nonfinite:
        count, first = 0, None
        for offset, chunk in flat_chunks(arr):  # bounded temporaries, also for a memory-mapped array
            bad = np.isnan(chunk) | (np.isposinf(chunk) if allow_neg_inf else np.isinf(chunk))
            if bad.any():
                count += int(bad.sum())
                if first is None:
                    first = np.unravel_index(offset + int(np.argmax(bad)), arr.shape)
        if first is not None:
            index = tuple(int(i) for i in first)
            allowed = " (-inf is allowed here, NaN and +inf are not)" if allow_neg_inf else ""
            raise InputError(
                f"{source}: {count} non-finite value(s), the first at index {list(index)} "
                f"= {arr[index]}; inputs must be finite{allowed}."
            )
    return arr


CHUNK = 2**22  # values a pass over a large array handles at a time


def array_max(arr: np.ndarray) -> float:
    """The largest value, a piece at a time (a memory-mapped array is not held in memory)."""
    return max(float(np.max(chunk)) for _, chunk in flat_chunks(arr)) if arr.size else 0.0


#: bytes: a memory-mapped input of at most this size keeps its pages while it is read (``release_pages``)
KEEP_MAPPED = 256 * 2**20


def release_pages(arr: np.ndarray) -> None:
    """Let the kernel drop the pages of a memory-mapped input read so far (they are read again from
    the page cache if needed), so that a pass over a long file does not hold it all as resident memory.
    A file of at most ``KEEP_MAPPED`` bytes keeps them: its pages cost less memory than mapping them
    again costs time, above all when two threads read it (the head pass and the picture drawn beside it
    would each drop the pages the other is reading)."""
    import mmap

    base: Any = arr
    while base is not None and not isinstance(base, mmap.mmap):
        base = getattr(base, "base", None)
    if base is None or len(base) <= KEEP_MAPPED:
        return
    if hasattr(base, "madvise") and hasattr(mmap, "MADV_DONTNEED"):
        try:
            base.madvise(mmap.MADV_DONTNEED)
        except (OSError, ValueError):
            pass


def flat_chunks(arr: np.ndarray, size: int = CHUNK) -> Iterator[tuple[int, np.ndarray]]:
    """(offset, values) pieces of an array in C order, without copying the whole array (one that is not
    C-contiguous, such as a Fortran-order file, is copied a block of leading rows at a time)."""
    if arr.size <= size or arr.ndim == 0:
        yield 0, np.asarray(arr).reshape(-1)
        return
    if not arr.flags.c_contiguous:
        row = arr.size // arr.shape[0]
        step = max(1, size // max(row, 1))
        for first in range(0, arr.shape[0], step):
            yield first * row, np.ascontiguousarray(arr[first:first + step]).reshape(-1)
            release_pages(arr)
        return
    flat = arr.reshape(-1)
    for start in range(0, flat.size, size):
        yield start, np.asarray(flat[start:start + size])
        release_pages(arr)


def _from_json_value(value: Any, source: str) -> np.ndarray:
    if isinstance(value, (dict, str)) or value is None:
        raise InputError(f"{source}: expected a nested list of numbers, got {type(value).__name__}.")
    try:
        arr = np.array(value)
    except ValueError:  # ragged nesting
        raise InputError(
            f"{source}: the nested lists are ragged (rows of different lengths); an array needs a rectangular shape."
        ) from None
    if arr.dtype.kind not in "biuf":
        raise InputError(
            f"{source}: holds non-numeric values ({arr.dtype}); expected numbers only, e.g. [[0.1, 0.2], ...]."
        )
    return arr


def _labels_from_value(value: Any, source: str) -> list[str]:
    if isinstance(value, np.ndarray):
        if value.ndim != 1 or value.dtype.kind not in "US":
            raise InputError(f"{source}: labels must be a 1-D array of strings, got {value.dtype} "
                             f"of shape {shape_str(value.shape)}.")
        return [str(x) for x in value.tolist()]
    if not isinstance(value, (list, tuple)) or not all(isinstance(x, (str, int, float)) for x in value):
        raise InputError(f"{source}: labels must be a list of strings, or one list of strings per batch entry.")
    return [str(x) for x in value]


def _parse_json_text(text: str, source: str) -> Any:
    """Parsed JSON, its nesting checked before parsing; any failure an ``InputError`` naming ``source``."""
    try:
        return loads_json(text)
    except ValueError as exc:
        raise InputError(f"{source}: not valid JSON ({exc}).") from None


@dataclass
class Opened:
    """A spec opened once: ``raw`` is an ndarray (a file of one array), a ``Container`` of named arrays
    (.npz, .safetensors, HDF5, torch.save), or a parsed JSON value. ``key`` is the ``FILE:KEY`` part."""

    spec: str
    source: str
    path: Place | None
    key: str | None
    raw: Any

    def array(self, *, allow_neg_inf: bool = False, allow_nonfinite: bool = False) -> Loaded:
        """The single array this spec names."""
        source, raw, labels = self.source, self.raw, None
        picked: str | None = None
        if isinstance(raw, Container):
            key = self.key
            if key is None:
                if not raw.keys:
                    raise InputError(f"{source}: holds no arrays.")
                if len(raw.keys) != 1:
                    raise InputError(
                        f"{source}: holds {len(raw.keys)} arrays ({listing(raw.keys) if raw.keys else 'none'}); "
                        f"name one as {source}:KEY."
                    )
                picked = raw.keys[0]
                arr = raw.get(picked)
            else:
                matches = raw.select(key)
                if len(matches) > 1:
                    raise InputError(
                        f"{source}:{key}: the pattern matches {len(matches)} arrays ({listing(matches)}); "
                        "one array is needed here: name it, or narrow the pattern."
                    )
                picked = matches[0]
                arr = raw.get(picked)
                source = f"{source}:{matches[0]}"
        elif isinstance(raw, np.ndarray):
            if self.key is not None:
                raise InputError(f"{source}: holds a single array, not named arrays; drop ':{self.key}'.")
            arr = raw
        else:  # JSON
            if isinstance(raw, dict):
                if "data" not in raw:
                    raise InputError(
                        f"{source}: a JSON object must have a \"data\" entry (and optionally \"labels\"), "
                        f"or one entry per input; it has {listing(list(raw)) if raw else 'no entries'}."
                    )
                if "labels" in raw:
                    labels = _labels_from_value(raw["labels"], f"{source} (labels)")
                raw = raw["data"]
            arr = _from_json_value(raw, source)
        validate_array(arr, source, allow_neg_inf=allow_neg_inf, allow_nonfinite=allow_nonfinite)
        stored = raw.stored.get(picked) if isinstance(raw, Container) and picked is not None else None
        return Loaded(arr, source, self.path, labels, stored)

    def bundle(self, names: Sequence[str], optional: Sequence[str] = ()) -> dict[str, Loaded] | None:
        """If this is an ``.npz`` archive or JSON object holding every one of ``names``, read them
        all, and whichever of ``BUNDLE_EXTRAS`` and ``optional`` are present; otherwise None.

        Labels come back as ``Loaded`` objects whose ``labels`` is set and ``data`` is empty.
        """
        raw, wanted = self.raw, [*names, *BUNDLE_EXTRAS, *optional]
        if self.key is not None:
            return None
        if isinstance(raw, Container):
            if not all(raw.has(n) for n in names):
                return None
            values: Mapping[str, Any] = {n: raw.get(n) for n in wanted if raw.has(n)}
        elif isinstance(raw, dict) and all(n in raw for n in names):
            values = {n: raw[n] for n in wanted if n in raw}
        else:
            return None
        out: dict[str, Loaded] = {}
        for name, value in values.items():
            where = f"{self.source}:{name}"
            if name.endswith("_labels"):
                out[name] = Loaded(np.empty(0), where, self.path, _labels_from_value(value, where))
                continue
            arr = value if isinstance(value, np.ndarray) else _from_json_value(value, where)
            validate_array(arr, where)
            out[name] = Loaded(arr, where, self.path)
        return out

    def layer_keys(self) -> list[str]:
        """The keys read as a stack of layers (``inspect``, ``compare``): every key of a file of several
        arrays named without a key, or the matches of a key glob when there are several, in natural
        order; empty when the spec names one array."""
        raw = self.raw
        if not isinstance(raw, Container):
            return []
        if self.key is None:
            return natural(raw.keys) if len(raw.keys) > 1 else []
        if raw.has(self.key) or not is_glob(self.key):
            return []
        matches = raw.select(self.key)
        return matches if len(matches) > 1 else []


def open_spec(spec: str, stdin: StdinReader | None = None) -> Opened:
    """Open ``-`` (JSON on stdin), ``file.json``, or any file ``attnviz.formats`` reads (``.npy``,
    ``.npz``, ``.safetensors``, ``.h5``/``.hdf5``, ``.pt``/``.pth``/``.bin``), with ``:KEY`` (or a key
    glob) for a file of named arrays."""
    if spec == STDIN:
        stdin = stdin or StdinReader()
        return Opened(spec, STDIN_SOURCE, None, None, _parse_json_text(stdin.read(), f"'-' ({STDIN_SOURCE})"))
    if spec.startswith(MEMORY):
        name, _, part = spec[len(MEMORY):].partition(":")
        return Opened(spec, name, None, part or None, memory_value(MEMORY + name))
    path, key = split_spec(spec)
    p = _check_path(path)
    fmt = formats.BY_SUFFIX.get(p.suffix.lower())
    if key is not None and (fmt is None or not fmt.keyed):
        raise UsageError(f"{spec}: only files of named arrays ({formats.describe(True)}) take ':KEY'.")
    if fmt is not None:
        shown = (_NAMES.get() or {}).get(path, path)
        try:
            return Opened(spec, shown, p, key, fmt.open(p, shown))
        except MemoryError:
            raise InputError(f"{path}: not enough memory to read it.") from None
    if isinstance(p, Url):
        from attnviz import storage

        return Opened(spec, path, p, None, _parse_json_text(storage.read_text(p, path), path))
    if is_pipe(p):
        try:
            text = read_text_file(p, path)
        except BinaryText:  # an array file through a pipe (<(cat w.npy)): it cannot be memory-mapped
            raise UsageError(f"{path}: a named pipe (FIFO) of binary data, not JSON text; {PIPED_ARRAY}.") from None
        return Opened(spec, path, p, None, _parse_json_text(text, path))
    return Opened(spec, path, p, None, _parse_json_text(read_text_file(p, path), path))


def load_array(spec: str, stdin: StdinReader | None = None, *, allow_neg_inf: bool = False) -> Loaded:
    """Read one array from a spec (any file ``open_spec`` reads, ``FILE:KEY``, or ``-``)."""
    return open_spec(spec, stdin).array(allow_neg_inf=allow_neg_inf)


def _nested(value: Any) -> bool:
    """A list of label lists (one per batch entry), not a list of labels."""
    if isinstance(value, np.ndarray):
        return value.ndim == 2
    return isinstance(value, (list, tuple)) and bool(value) and all(
        isinstance(v, (list, tuple)) or (isinstance(v, np.ndarray) and v.ndim == 1) for v in value)


PER_ENTRY = ("one list per batch entry is read by inspect, compare, rollout and view (--labels a JSON list of "
             "lists, or a text file with a blank line between the entries)")


@dataclass
class LabelInput:
    """Labels as given: ``rows``, one list per batch entry (one list: the same for every entry); ``lines``,
    a text file's lines read as one list (blank lines included) where its blank lines also split it into
    entries; the file read (or None) and how the value was read (for messages)."""

    rows: list[list[str]]
    path: Place | None
    how: str
    lines: list[str] | None = None

    @property
    def per_entry(self) -> bool:
        return len(self.rows) > 1 or self.lines is not None


def _label_rows(value: Any, source: str) -> list[list[str]]:
    if _nested(value):
        rows = [_labels_from_value(list(v) if not isinstance(v, np.ndarray) else v, f"{source} (entry {i})")
                for i, v in enumerate(value)]
        return rows
    return [_labels_from_value(value, source)]


def load_label_rows(spec: str) -> LabelInput:
    """Token labels, one list for every batch entry or one list per entry: a text file (one label a line;
    a blank line between entries), a JSON file or literal list (a list of lists: one per entry), or
    ``a,b,c``; a list handed over in memory (the API), flat or nested."""
    if spec.startswith(MEMORY):
        value = memory_value(spec)
        return LabelInput(_label_rows(value, spec[len(MEMORY):]), None, "a list")
    if is_url(spec):
        from attnviz import storage

        url = check_url(spec)
        return _labels_file(storage.read_text(url, spec, what="labels"), url, spec)
    p = Path(spec)
    special = os.path.lexists(p) and not os.path.isdir(p)  # a pipe is read once; a device is refused
    if os.path.isfile(p) or special:  # False (not an error) for a name too long to be a file: a long list
        return _labels_file(read_text_file(p, spec, what="labels"), p, spec)
    if spec.lstrip().startswith("["):
        try:
            value = loads_json(spec)
        except ValueError:
            value = None  # "[CLS],the,cat" is a comma-separated list that starts with a bracket
        if isinstance(value, list):
            return LabelInput(_label_rows(value, "labels"), None, "a JSON list")
    return LabelInput([[s.strip() for s in spec.split(",")]], None, "a comma-separated list (no such file)")


def _labels_file(text: str, place: Place, spec: str) -> LabelInput:
    """The labels of a file's text (local or at a URL): JSON (a list, a list of lists, or an object with
    ``labels``), else one label a line with a blank line between batch entries."""
    if place.suffix.lower() == ".json":
        value = _parse_json_text(text, spec)
        if isinstance(value, dict) and "labels" in value:
            value = value["labels"]
        return LabelInput(_label_rows(value, spec), place, f"file {spec}")
    lines = text.splitlines()
    blocks = _blocks(lines)
    if len(blocks) > 1:
        return LabelInput(blocks, place, f"file {spec}", lines=lines)
    return LabelInput([lines], place, f"file {spec}")


def _blocks(lines: list[str]) -> list[list[str]]:
    """A text file's lines split at blank lines (one or more), blank lines at its ends dropped."""
    blocks: list[list[str]] = [[]]
    for line in lines:
        if line.strip():
            blocks[-1].append(line)
        elif blocks[-1]:
            blocks.append([])
    return [b for b in blocks if b]


def load_labels(spec: str) -> tuple[list[str], Place | None, str]:
    """Token labels from a text file (one a line), a JSON file or literal list, or ``a,b,c``: one list.

    Returns the labels, the file they came from (or None) and how the value was read (for messages).
    A list of lists (one per batch entry) is refused here: the compute commands take one.
    """
    given = load_label_rows(spec)
    if given.lines is not None:
        return given.lines, given.path, given.how
    if len(given.rows) > 1:
        raise InputError(f"{spec_name(spec)}: {len(given.rows)} lists of labels; this command takes one list "
                         f"({PER_ENTRY}).")
    return given.rows[0], given.path, given.how


# ---------------------------------------------------------------------------------------------------
# Output


def write_atomic(path: Path, write: Callable[[IO[bytes]], None]) -> None:
    """Write a file through a temporary file in the same folder and a rename, so that a failure
    never leaves a half-written file at ``path``."""
    folder = path.parent if str(path.parent) else Path(".")
    try:
        fd, tmp = hidden_file(folder, f".{path.name}.", ".part")
    except OSError as exc:
        raise OutputError(f"{path}: cannot write ({exc.strerror or exc}).") from None
    try:
        with os.fdopen(fd, "wb") as fh:
            write(fh)
        os.chmod(tmp, 0o666 & ~umask())
        os.replace(tmp, path)
        forget(tmp)
    except BaseException as exc:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        forget(tmp)
        if isinstance(exc, OSError):
            raise OutputError(f"{path}: cannot write ({exc.strerror or exc}).") from None
        raise


def check_outputs(outputs: Mapping[str, str | None], inputs: Iterable[Place | None]) -> dict[str, Place]:
    """Refuse an output that would overwrite an input or another output, or whose folder is missing.

    ``outputs`` maps an option name (``--png``) to the path given, or None. Returns the paths given: a
    ``Path``, or a ``Url`` (checked for its form here; its bucket when the outputs are reserved).
    """
    from attnviz import storage

    in_paths = {storage.key(p) for p in inputs if p is not None}
    seen: dict[str, str] = {}
    result: dict[str, Place] = {}
    for option, value in outputs.items():
        if value is None:
            continue
        if is_url(value):
            url = check_url(value, option)
            if url in in_paths:
                raise UsageError(f"{option} {value}: that is one of the input files; refusing to overwrite it.")
            if url in seen:
                raise UsageError(f"{option} {value}: the same file as {seen[url]}; give each output its own path.")
            seen[url] = option
            result[option] = url
            continue
        p = Path(value)
        try:
            resolved = p.resolve()
            r = str(resolved)
            if r in in_paths:
                raise UsageError(f"{option} {value}: that is one of the input files; refusing to overwrite it.")
            if r in seen:
                raise UsageError(f"{option} {value}: the same file as {seen[r]}; give each output its own path.")
            if p.is_dir():
                raise UsageError(f"{option} {value}: is a directory; give a file name.")
            if not resolved.parent.is_dir():
                raise OutputError(f"{option} {value}: the folder {p.parent} does not exist.")
        except OSError as exc:  # a name too long for the file system, a loop of links ...
            raise OutputError(f"{option} {value}: cannot write there ({exc.strerror or exc}).") from None
        seen[r] = option
        result[option] = p
    return result


def save_npy(path: Path, arr: np.ndarray) -> None:
    write_atomic(path, lambda fh: np.save(fh, arr, allow_pickle=False))


#: what ``save_array`` writes, by suffix
ARRAY_OUTPUTS = (".npy", ".npz", ".safetensors")
#: NumPy dtype -> the safetensors dtype of ``save_array``
SAFETENSORS_DTYPES = {"float64": "F64", "float32": "F32", "float16": "F16", "bfloat16": "BF16", "int64": "I64",
                      "int32": "I32", "bool": "BOOL"}


def save_array(path: Path, arr: np.ndarray, key: str = "weights", suffix: str | None = None) -> None:
    """One array, atomically, as ``.npy``, or under ``key`` in an ``.npz`` or ``.safetensors`` (by
    ``suffix``, else the path's). A safetensors file is written here, the array streamed a piece at a
    time after its header (dtype, shape and offsets, padded to 8 bytes as the format asks)."""
    kind = (suffix or path.suffix).lower()
    if kind == ".npy":
        write_atomic(path, lambda fh: np.save(fh, arr, allow_pickle=False))
    elif kind == ".npz":
        write_atomic(path, lambda fh: np.savez(fh, **{key: arr}))  # type: ignore[arg-type]
    elif kind == ".safetensors":
        import json

        dtype = SAFETENSORS_DTYPES.get(arr.dtype.name)
        if dtype is None:
            raise OutputError(f"{path}: safetensors holds no {arr.dtype} arrays.")
        header = json.dumps({key: {"dtype": dtype, "shape": list(arr.shape),
                                   "data_offsets": [0, arr.size * arr.dtype.itemsize]}}).encode("utf-8")
        header += b" " * (-len(header) % 8)

        def write(fh: IO[bytes]) -> None:
            fh.write(len(header).to_bytes(8, "little") + header)
            for _, chunk in flat_chunks(arr):
                if chunk.dtype.byteorder == ">":
                    chunk = chunk.astype(chunk.dtype.newbyteorder("<"))
                fh.write(np.ascontiguousarray(chunk).view(np.uint8).data)

        write_atomic(path, write)
    else:
        raise UsageError(f"{path}: the file must end in {', '.join(ARRAY_OUTPUTS)}.")


def save_text(path: Path, text: str) -> None:
    def write(fh: IO[bytes]) -> None:
        fh.write(text.encode("utf-8"))

    write_atomic(path, write)

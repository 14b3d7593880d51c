"""The capture file: what ``attnviz capture`` and ``attnviz.capture(model)`` write, and how every other
part of attnviz reads it. NumPy only (no torch, no transformers): a capture is read like any dump.

One ``.safetensors`` file (or ``.npz``) holds, per attention site (``layers.N``; ``encoder.layers.N``,
``decoder.layers.N``, ``cross.layers.N`` for an encoder-decoder):

* ``SITE.weights`` [B, H, Lq, Lk]: the model's own probabilities (float32 unless asked otherwise);
* ``SITE.q`` [B, Lq, H, d], ``SITE.k`` and ``SITE.v`` [B, Lk, Hkv, d]: what the attention function
  received (after projections, norms and position encodings, before the grouped-query repeat);
* ``SITE.real_keys`` [B, Lk] bool, the padding vector, where the mask is made of padding, causal and a sliding
  window (the site's metadata ``mask`` names them; ``site_keep`` builds the mask); else ``SITE.mask``
  [B, 1, Lq, Lk] bool (True = kept);
* instead of weights, q, k and v, a summary capture's per-row, per-key and pooled arrays
  (``attnviz.summarystats``);
* ``SITE.wo`` [H, dv, d_model] and ``SITE.bo`` [d_model] where the module has an output projection;
* ``SITE.sinks`` [H] (gpt-oss), ``SITE.position_bias`` [1 or B, H, Lq, Lk] (T5) where the model has them;
* ``SITE.grad`` [B, H, Lq, Lk] with a target: d(target logit) / d(weights);

and at the top level ``input_ids`` and ``attention_mask`` (``decoder_input_ids``,
``decoder_attention_mask``), and after ``generate()`` ``generated_ids`` [B, N]: every token it returned past
the prompt, the last one too (no forward runs over it). The file's metadata (the safetensors header's
``__metadata__`` entry ``attnviz.capture``; an ``.npz`` member of that name) is a JSON object: ``format``,
``tokens`` (one list per row; ``generated``, the generated tokens, likewise), ``model_type``, ``transformers``,
``kinds``, and per site its ``module``, ``kind``, ``layer``, ``scale``, ``window``, ``softcap``, ``sinks``,
``heads``, ``kv_heads``.

Writing is streamed: each site's arrays are appended to the data section of a staged file as the model
runs them (a layer's weights are never held longer than it takes to write them), and the header is
written into the space reserved for it in front when the capture ends (safetensors allows the header to
be padded with spaces). Whatever cannot be streamed (generate()'s steps, which are stitched into one map
per site; a second run; an ``.npz``) is assembled from the streamed file into a new one.
"""

from __future__ import annotations

import json
import math
import os
import re
import struct
import threading
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import numpy as np

from attnviz.errors import InputError, OutputError, UsageError

#: the metadata key (safetensors ``__metadata__`` entry, ``.npz`` member) that marks a capture file
META_KEY = "attnviz.capture"
FORMAT = 1
#: the kinds of sites, in the order a file lists them
KINDS = ("layers", "encoder.layers", "decoder.layers", "cross.layers")
SITE_RE = re.compile(r"^(?P<site>(?:(?P<kind>encoder|decoder|cross)\.)?layers\.(?P<n>\d+))\.(?P<name>[a-z_]+)$")
#: the header space reserved in front of a streamed file (grown when a capture needs more)
HEADER_RESERVE = 256 * 1024 - 8  # the data starts 256 KiB in
ALIGN = 64

_DTYPE_NAMES = {"float64": "F64", "float32": "F32", "float16": "F16", "bfloat16": "BF16", "int64": "I64",
                "int32": "I32", "int16": "I16", "int8": "I8", "uint8": "U8", "bool": "BOOL", "uint16": "U16",
                "uint32": "U32", "uint64": "U64"}


def st_dtype(dtype: np.dtype) -> str:
    name = np.dtype(dtype).name
    if name not in _DTYPE_NAMES:
        raise TypeError(f"no safetensors dtype for {name}")
    return _DTYPE_NAMES[name]


@dataclass
class Entry:
    """One array in the data section of a streamed file: where its bytes are."""

    name: str
    dtype: np.dtype
    shape: tuple[int, ...]
    begin: int  # offset within the data section
    end: int


@dataclass
class StreamFile:
    """The data section of a capture, appended to as sites arrive; ``finish`` writes the header in
    front (or ``assemble`` builds another file from it). ``path`` is the staged file itself."""

    path: Path
    reserve: int = HEADER_RESERVE
    entries: list[Entry] = field(default_factory=list)
    size: int = 0
    _fh: IO[bytes] | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self._fh = open(self.path, "wb")  # noqa: SIM115 - closed by finish / close
        self._fh.seek(self.data_start)

    @property
    def data_start(self) -> int:
        return 8 + self.reserve

    def append(self, name: str, arr: np.ndarray | Any, dtype: np.dtype | None = None,
               shape: tuple[int, ...] | None = None) -> Entry:
        """Append an array's bytes (``arr``: an ndarray, or anything with the buffer protocol with
        ``dtype`` and ``shape`` given); returns its entry."""
        if isinstance(arr, np.ndarray):
            a = np.ascontiguousarray(arr)
            dtype, shape, data = a.dtype, tuple(a.shape), memoryview(a.reshape(-1).view(np.uint8))  # type: ignore[arg-type]
        else:
            assert dtype is not None and shape is not None
            data = memoryview(arr).cast("B")
        with self._lock:
            assert self._fh is not None
            begin = self.size
            try:
                self._fh.write(data)
            except OSError as exc:
                raise OutputError(f"{self.path}: cannot write ({exc.strerror or exc}).") from None
            self.size += len(data)
            entry = Entry(name, np.dtype(dtype), tuple(int(n) for n in shape), begin, self.size)
            self.entries.append(entry)
            return entry

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None

    def read(self, entry: Entry) -> np.ndarray:
        """An appended array, memory-mapped (the file is flushed first)."""
        if self._fh is not None:
            self._fh.flush()
        count = math.prod(entry.shape)
        if count == 0:
            return np.empty(entry.shape, entry.dtype)
        return np.memmap(self.path, dtype=entry.dtype, mode="r", offset=self.data_start + entry.begin,
                         shape=(count,)).reshape(entry.shape)


def header_bytes(tensors: list[tuple[str, np.dtype, tuple[int, ...], int, int]], metadata: dict[str, Any]) -> bytes:
    header: dict[str, Any] = {"__metadata__": {META_KEY: json.dumps(metadata, separators=(",", ":"))}}
    for name, dtype, shape, begin, end in tensors:
        header[name] = {"dtype": st_dtype(dtype), "shape": list(shape), "data_offsets": [begin, end]}
    return json.dumps(header, separators=(",", ":")).encode()


def finish_in_place(stream: StreamFile, order: list[Entry], metadata: dict[str, Any]) -> bool:
    """Write the header in front of the streamed data when ``order`` is the whole data section in order
    (no gap: safetensors wants the tensors back to back) and the header fits the reserved space.
    False when it cannot (the caller assembles a new file)."""
    at = 0
    tensors = []
    for e in order:  # safetensors wants the tensors back to back, covering the data
        if e.begin != at:
            return False
        tensors.append((e.name, e.dtype, e.shape, e.begin, e.end))
        at = e.end
    if at != stream.size:
        return False
    head = header_bytes(tensors, metadata)
    if len(head) > stream.reserve:
        return False
    assert stream._fh is not None
    fh = stream._fh
    try:
        fh.seek(0)
        fh.write(struct.pack("<Q", stream.reserve))
        fh.write(head + b" " * (stream.reserve - len(head)))
        fh.flush()
    except OSError as exc:
        raise OutputError(f"{stream.path}: cannot write ({exc.strerror or exc}).") from None
    stream.close()
    return True


Source = Callable[[], np.ndarray]


def write_safetensors(path: Path, arrays: list[tuple[str, np.dtype, tuple[int, ...], Source]],
                      metadata: dict[str, Any]) -> None:
    """A safetensors file of arrays made one at a time by their ``Source`` (each made, written and dropped)."""
    tensors, at = [], 0
    for name, dtype, shape, _ in arrays:
        n = math.prod(shape) * np.dtype(dtype).itemsize
        tensors.append((name, np.dtype(dtype), shape, at, at + n))
        at += n
    head = header_bytes(tensors, metadata)
    head += b" " * ((-(8 + len(head))) % ALIGN)
    try:
        with open(path, "wb") as fh:
            fh.write(struct.pack("<Q", len(head)))
            fh.write(head)
            for name, dtype, shape, make in arrays:
                arr = np.ascontiguousarray(make(), dtype=dtype)
                assert arr.shape == tuple(shape), (name, arr.shape, shape)
                fh.write(memoryview(arr.reshape(-1).view(np.uint8)))  # type: ignore[arg-type]
            fh.flush()
    except OSError as exc:
        raise OutputError(f"{path}: cannot write ({exc.strerror or exc}).") from None


def _reader(raw: Any, key: str, dtype: np.dtype) -> Source:
    return lambda: raw.read(key).astype(dtype, copy=False)


def write_npz(path: Path, arrays: list[tuple[str, np.dtype, tuple[int, ...], Source]],
              metadata: dict[str, Any]) -> None:
    """An ``.npz`` of the same arrays, the metadata as the member ``attnviz.capture`` (a text array, which
    ``numpy.load`` reads without pickle)."""
    try:
        with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED, allowZip64=True) as zf:
            for name, dtype, _, make in arrays:
                with zf.open(name + ".npy", "w", force_zip64=True) as member:
                    np.lib.format.write_array(member, np.ascontiguousarray(make(), dtype=dtype), allow_pickle=False)
            with zf.open(META_KEY + ".npy", "w") as member:
                np.lib.format.write_array(member, np.array(json.dumps(metadata, separators=(",", ":"))),
                                          allow_pickle=False)
    except OSError as exc:
        raise OutputError(f"{path}: cannot write ({exc.strerror or exc}).") from None


# ---------------------------------------------------------------------------------------------------
# Reading


@dataclass
class Capture:
    """A capture file as read: its metadata and the sites of each kind, in layer order."""

    source: str
    metadata: dict[str, Any]
    keys: list[str]

    @property
    def kinds(self) -> list[str]:
        """The kinds of sites the file holds (``layers``; ``encoder``, ``decoder``, ``cross``)."""
        found = {m.group("kind") or "layers" for m in map(SITE_RE.match, self.keys) if m}
        return [k for k in ("layers", "encoder", "decoder", "cross") if k in found]

    def sites(self, kind: str) -> list[str]:
        """The sites of one kind in layer order (``cross.layers.0``, ...)."""
        found: dict[int, str] = {}
        for m in map(SITE_RE.match, self.keys):
            if m and (m.group("kind") or "layers") == kind:
                found[int(m.group("n"))] = m.group("site")
        return [found[n] for n in sorted(found)]

    def has(self, site: str, name: str) -> bool:
        return f"{site}.{name}" in self.keys

    def tokens(self, kind: str) -> list[list[str]] | None:
        """The tokens of each row of the sequences a kind's queries run over (the decoder's for
        ``decoder`` and ``cross`` queries)."""
        meta = self.metadata
        tokens = meta.get("decoder_tokens") if kind in ("decoder", "cross") else meta.get("tokens")
        if not isinstance(tokens, list) or not all(isinstance(row, list) for row in tokens):
            return None
        return [[str(t) for t in row] for row in tokens]

    def key_tokens(self, kind: str) -> list[list[str]] | None:
        """The tokens of the keys: the encoder's for cross-attention."""
        return self.tokens("encoder" if kind == "cross" else kind)

    def token_style(self) -> str | None:
        """How the tokens stand for text (``attnviz.tokentext``: ``byte-level``, ``sentencepiece``, or None: as
        they are): as the capture recorded it from the tokenizer, else read from the tokens (a file written
        before it was recorded)."""
        from attnviz import tokentext

        meta = self.metadata
        if "token_style" in meta:
            style = meta.get("token_style")
            return style if style in tokentext.STYLES else None
        rows = [row for key in ("tokens", "decoder_tokens", "generated") for row in meta.get(key) or []
                if isinstance(row, list)]
        return tokentext.detect(rows)

    def generated_texts(self) -> list[str] | None:
        """The text each batch entry generated (``generate()``'s new tokens, decoded together), or None."""
        from attnviz import tokentext

        rows = self.metadata.get("generated")
        if not isinstance(rows, list) or not rows or not all(isinstance(row, list) for row in rows):
            return None
        style = self.token_style()
        return [tokentext.joined(tokentext.trailing_once([str(t) for t in row]), style) for row in rows]

    def choose_kind(self, wanted: str | None) -> str:
        """The kind a spec names (``run.safetensors:cross``), or the only one; an error listing them."""
        kinds = self.kinds
        if not kinds:
            raise InputError(f"{self.source}: a capture file with no attention sites.")
        if wanted is None:
            if len(kinds) == 1:
                return kinds[0]
            raise UsageError(f"{self.source}: a capture of an encoder-decoder holds {', '.join(kinds)} attention; "
                             f"name one: {self.source}:{kinds[-1]}.")
        name = wanted.removesuffix(".layers").removesuffix(".*")
        if name not in kinds:
            raise UsageError(f"{self.source}: no {wanted!r} attention in this capture; it holds "
                             f"{', '.join(kinds)} ({self.source}:KIND).")
        return name


def read_metadata(raw: Any) -> dict[str, Any] | None:
    """The capture metadata of an opened file of named arrays (``attnviz.formats`` container), or None."""
    text = None
    meta = getattr(raw, "metadata", None)
    if isinstance(meta, dict) and isinstance(meta.get(META_KEY), str):
        text = meta[META_KEY]
    elif hasattr(raw, "keys") and META_KEY in getattr(raw, "keys", ()):
        try:
            value = raw.read(META_KEY)
        except Exception:  # noqa: BLE001 - not a capture then
            return None
        if isinstance(value, np.ndarray) and value.dtype.kind == "U" and value.ndim == 0:
            text = str(value)
    if text is None:
        return None
    try:
        data = json.loads(text)
    except ValueError:
        raise InputError(f"{getattr(raw, 'source', 'capture')}: its capture metadata is not JSON.") from None
    if not isinstance(data, dict):
        raise InputError(f"{getattr(raw, 'source', 'capture')}: its capture metadata is not a JSON object.")
    return data


def as_capture(raw: Any) -> Capture | None:
    meta = read_metadata(raw)
    if meta is None:
        return None
    return Capture(raw.source, meta, [k for k in raw.keys if k != META_KEY])


def iter_sites(keys: list[str]) -> Iterator[tuple[str, str]]:
    for key in keys:
        m = SITE_RE.match(key)
        if m:
            yield m.group("site"), m.group("name")


def convert(source: Path, target: Path) -> None:
    """A capture file written again as ``target``'s format (``.npz`` or ``.safetensors``), array by array,
    through a staged file renamed into place; bfloat16 and float16 arrays become float32 (``.npy`` has no
    bfloat16)."""
    from attnviz.formats import open_file

    raw = open_file(source, str(source))
    meta = read_metadata(raw)
    if meta is None:
        raise InputError(f"{source}: not a capture file.")
    arrays: list[tuple[str, np.dtype, tuple[int, ...], Source]] = []
    for key in raw.keys:
        if key == META_KEY:
            continue
        arr = raw.read(key)  # memory-mapped where the format allows: read again when written
        arrays.append((key, arr.dtype, tuple(arr.shape), _reader(raw, key, arr.dtype)))
    write_whole(target, arrays, meta)


def write_whole(target: Path, arrays: list[tuple[str, np.dtype, tuple[int, ...], Source]],
                metadata: dict[str, Any], npz: bool | None = None) -> None:
    """A file of ``arrays`` in ``target``'s format (``npz``, or None: ``.npz`` by its suffix, else
    ``.safetensors``), written whole to a staged file next to it and renamed into place (the user's umask),
    or nothing written."""
    from attnviz.staging import forget, hidden_file, umask

    folder = target.parent if str(target.parent) else Path(".")
    try:
        fd, name = hidden_file(folder, f".{target.name[:60]}.", f".part{target.suffix}")
    except OSError as exc:
        raise OutputError(f"{target}: cannot write into {folder} ({exc.strerror or exc}).") from None
    os.close(fd)
    try:
        as_npz = target.suffix.lower() == ".npz" if npz is None else npz
        (write_npz if as_npz else write_safetensors)(Path(name), arrays, metadata)
        os.chmod(name, 0o666 & ~umask())
        os.replace(name, target)
    except OSError as exc:
        raise OutputError(f"{target}: cannot write ({exc.strerror or exc}).") from None
    finally:
        if os.path.exists(name):
            os.unlink(name)
        forget(name)


class open_capture:  # noqa: N801 - used as a context manager, like open()
    """``with open_capture(path) as (raw, capture):`` a capture file's arrays (a ``formats`` container) and
    its description; an error when the file is not a capture."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    def __enter__(self) -> tuple[Any, Capture]:
        from attnviz.formats import open_file

        raw = open_file(self.path, str(self.path))
        capture = as_capture(raw)
        if capture is None:
            raise InputError(f"{self.path}: not a capture file (attnviz capture writes them).")
        return raw, capture

    def __exit__(self, *exc: object) -> None:
        return None


# ---------------------------------------------------------------------------------------------------
# Masks as their parts


def array_shape(raw: Any, key: str) -> tuple[int, ...]:
    """An array's shape without reading its data where the format allows (a safetensors header)."""
    entry = getattr(raw, "entry", None)
    if callable(entry):
        return tuple(int(n) for n in entry(key)["shape"])
    return tuple(raw.get(key).shape)


def site_lengths(raw: Any, capture: Capture, site: str) -> tuple[int, int, int]:
    """``(B, Lq, Lk)`` of a site, from whichever of its arrays the file holds."""
    if capture.has(site, "weights"):
        b, _, lq, lk = array_shape(raw, f"{site}.weights")
        return b, lq, lk
    if capture.has(site, "entropy"):
        b, _, lq = array_shape(raw, f"{site}.entropy")
        lk = array_shape(raw, f"{site}.received")[-1]
        return b, lq, lk
    if capture.has(site, "q") and capture.has(site, "k"):
        b, lq = array_shape(raw, f"{site}.q")[:2]
        return b, lq, array_shape(raw, f"{site}.k")[1]
    if capture.has(site, "mask"):
        b, _, lq, lk = array_shape(raw, f"{site}.mask")
        return b, lq, lk
    raise InputError(f"{capture.source}: the site {site} holds neither weights, a summary nor q and k.")


def mask_parts_of(capture: Capture, site: str) -> dict[str, Any] | None:
    """A site's mask as the file describes its parts (``causal``, ``window``), or None (a dense ``SITE.mask``,
    or a file written before masks were kept as parts)."""
    meta = capture.metadata.get("sites", {}).get(site, {})
    parts = meta.get("mask") if isinstance(meta, dict) else None
    return parts if isinstance(parts, dict) else None


def site_keep(raw: Any, capture: Capture, site: str, rows: tuple[int, int] | None = None) -> np.ndarray | None:
    """The keep mask of a site, ``[B, 1, r, Lk]`` bool for query rows ``rows`` (all: None): the dense
    ``SITE.mask`` where the file holds one, else built from its parts (``SITE.real_keys`` the padding vector,
    causal from the bottom right, the window), a block of rows costing only that block. None when the file
    has neither."""
    if capture.has(site, "mask"):
        keep = raw.get(f"{site}.mask")
        keep = keep if rows is None else keep[..., rows[0]:rows[1], :]
        return np.asarray(keep, dtype=bool)
    parts = mask_parts_of(capture, site)
    if parts is None:
        return None
    b, lq, lk = site_lengths(raw, capture, site)
    r0, r1 = (0, lq) if rows is None else rows
    i = np.arange(r0, r1)[:, None] + (lk - lq if parts.get("self_attention", True) and lq <= lk else 0)
    j = np.arange(lk)[None]
    keep = np.ones((r1 - r0, lk), dtype=bool)
    if parts.get("causal"):
        keep &= j <= i
    window = parts.get("window")
    if window:
        keep &= j > i - int(window)
    real = np.ones((b, lk), dtype=bool)
    if capture.has(site, "real_keys"):
        got = np.asarray(raw.get(f"{site}.real_keys"), dtype=bool).reshape(-1, raw_len := array_shape(
            raw, f"{site}.real_keys")[-1])
        if raw_len < lk:  # generate()'s last step saw all but the last token generated: those are real
            got = np.concatenate([got, np.ones((got.shape[0], lk - raw_len), bool)], axis=-1)
        real = np.broadcast_to(got[..., -lk:], (b, lk))
    return keep[None, None] & real[:, None, None, :]

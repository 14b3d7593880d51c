"""``.safetensors``: named tensors behind a JSON header, read with the ``safetensors`` package's NumPy
API (never torch).

``safe_open(..., framework="np")`` checks the file and lists its tensors; the data is then
memory-mapped at the offsets the header gives, so a large tensor stays on disk until it is read. From an
object store (``attnviz.storage``) the header is one ranged request (two for a header past ``FIRST_READ``)
and each tensor read is one more, of exactly its bytes: a key of a large file costs that key.
bfloat16 (and 8-bit float) tensors are viewed through ``ml_dtypes``; half-precision tensors become
float32. ``safetensors`` and ``ml_dtypes`` are imported only when such a file is read.

The header is checked first, by attnviz itself and with bounded reads: its length must fit in the file
(and ``MAX_HEADER``), it is JSON of bounded depth, and every tensor's offsets must lie inside the data
and hold exactly what its dtype and shape claim.
"""

from __future__ import annotations

import math
import struct
from pathlib import Path
from typing import Any

import numpy as np

from attnviz.errors import InputError
from attnviz.formats.container import Container, natural
from attnviz.jsontext import loads_json
from attnviz.quoting import reason, short
from attnviz.sizes import check_memory
from attnviz.storage.textfiles import decode_text

SUFFIXES = (".safetensors",)
#: the longest header read (the safetensors library's own limit)
MAX_HEADER = 100_000_000
#: bytes per element of the dtypes the format names
ITEMSIZE = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U64": 8, "U32": 4,
            "U16": 2, "U8": 1, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1, "C64": 8, "C128": 16}

#: safetensors dtype -> NumPy dtype (little-endian, as the format stores them)
NATIVE = {"F64": "<f8", "F32": "<f4", "F16": "<f2", "I64": "<i8", "I32": "<i4", "I16": "<i2", "I8": "i1",
          "U64": "<u8", "U32": "<u4", "U16": "<u2", "U8": "u1", "BOOL": "?"}
#: safetensors dtype -> ml_dtypes type name
ML_DTYPES = {"BF16": "bfloat16", "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2"}


#: the bytes read first: the header's length and, in most files, the whole header (one request to a store)
FIRST_READ = 16 * 2**10


def _header(where: Any, file_size: int, source: str) -> tuple[int, dict[str, Any]]:
    """The header length and the parsed header (tensor name -> dtype, shape, data_offsets), every entry
    checked against the file's real size; a ``ValueError`` says what is wrong. ``where`` is the file
    (``attnviz.storage.open_input``): the first ``FIRST_READ`` bytes, then the rest of a longer header."""
    first = where.read(0, min(file_size, FIRST_READ))
    if len(first) < 8:
        raise ValueError("shorter than the 8-byte header length")
    (size,) = struct.unpack("<Q", first[:8])
    if size > min(MAX_HEADER, file_size - 8):
        raise ValueError(f"the header claims {size} bytes; the file holds {max(file_size - 8, 0)} after its length")
    text = first[8:8 + size]
    if len(text) < size:
        text += where.read(len(first), 8 + size)
    try:
        header = loads_json(decode_text(text, source, "header"))
    except InputError as exc:
        raise ValueError(exc.message.removeprefix(f"{source}: ")) from None
    if not isinstance(header, dict):
        raise ValueError("the header is not a JSON object")
    data_size = file_size - 8 - size
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        what = f"tensor {short(name)!r}"
        if not isinstance(entry, dict) or not isinstance(entry.get("dtype"), str):
            raise ValueError(f"{what}: no dtype")
        shape, offsets = entry.get("shape"), entry.get("data_offsets")
        if not isinstance(shape, list) or not all(type(n) is int and n >= 0 for n in shape):
            raise ValueError(f"{what}: the shape is not a list of sizes")
        if (not isinstance(offsets, list) or len(offsets) != 2 or not all(type(n) is int for n in offsets)
                or not 0 <= offsets[0] <= offsets[1] <= data_size):
            raise ValueError(f"{what}: data offsets {short(str(offsets))} outside the {data_size} bytes of data")
        itemsize = ITEMSIZE.get(entry["dtype"])
        if itemsize is not None and offsets[1] - offsets[0] != math.prod(shape) * itemsize:
            raise ValueError(f"{what}: the header claims a {entry['dtype']} tensor of shape {short(str(shape))}, "
                             f"but its offsets hold {offsets[1] - offsets[0]} bytes")
    return size, header


class SafetensorsFile(Container):
    def __init__(self, p: str | Path, source: str) -> None:
        from attnviz import storage

        try:
            from safetensors import safe_open
        except ImportError:
            raise InputError(f"{source}: reading .safetensors files needs the safetensors package, which is not "
                             "installed; pip install safetensors.") from None
        self.path = p
        self.where = storage.open_input(p, source)
        file_size = self.where.size
        try:
            size, header = _header(self.where, file_size, source)  # bounded reads, before the library maps the file
            if self.where.local is not None:
                with safe_open(str(self.where.local), framework="np") as f:  # checks the header against the file
                    keys = list(f.keys())
            else:  # an object of a store: the header's own checks (above) stand for the library's
                keys = [k for k in header if k != "__metadata__"]
            self._start = 8 + size
            self._entries = {k: header[k] for k in keys}
            meta = header.get("__metadata__")
            #: the header's ``__metadata__`` (text values), where it has one (a capture's description)
            self.metadata: dict[str, Any] | None = meta if isinstance(meta, dict) else None
        except Exception as exc:  # SafetensorError, OSError, ValueError, KeyError, struct.error ...
            raise InputError(f"{source}: not a readable .safetensors file ({reason(exc)}).") from None
        super().__init__(source, natural(keys))  # the header's order means nothing: natural order

    def entry(self, key: str) -> dict[str, Any]:
        """The header's entry of a tensor: its ``dtype``, ``shape`` and ``data_offsets``."""
        return self._entries[key]

    def read(self, key: str) -> np.ndarray:
        entry = self._entries[key]
        try:
            kind, shape, (begin, end) = entry["dtype"], tuple(int(n) for n in entry["shape"]), entry["data_offsets"]
            dtype: np.dtype | None = None
            if kind in NATIVE:
                dtype = np.dtype(NATIVE[kind])
            elif kind in ML_DTYPES:
                try:
                    import ml_dtypes

                    dtype = np.dtype(getattr(ml_dtypes, ML_DTYPES[kind]))
                except (ImportError, AttributeError):
                    dtype = None  # let safetensors try
            if dtype is not None and int(end) - int(begin) == math.prod(shape) * dtype.itemsize:
                arr = self._map(self._start + int(begin), dtype, shape)
            else:
                check_memory(int(end) - int(begin), f"{self.source}:{key}", "", shape)
                arr = self._library_read(key, entry)
            return self.upcast(key, arr)
        except InputError:
            raise
        except Exception as exc:
            raise InputError(f"{self.source}:{key}: cannot read the {entry.get('dtype', '?')} tensor "
                             f"({reason(exc)}).") from None

    def mapped(self, key: str) -> np.ndarray | None:
        """The tensor ``key`` memory-mapped as the file stores it (``read`` widens half precision to float32, in
        memory); None where it cannot be mapped: an object of a store, a dtype NumPy cannot view."""
        entry = self._entries[key]
        if self.where.local is None:
            return None
        kind, shape, (begin, end) = entry["dtype"], tuple(int(n) for n in entry["shape"]), entry["data_offsets"]
        try:
            if kind in NATIVE:
                dtype = np.dtype(NATIVE[kind])
            else:
                import ml_dtypes

                dtype = np.dtype(getattr(ml_dtypes, ML_DTYPES[kind]))
        except (ImportError, AttributeError, KeyError):
            return None
        if int(end) - int(begin) != math.prod(shape) * dtype.itemsize:
            return None
        return self._map(self._start + int(begin), dtype, shape)

    def _library_read(self, key: str, entry: dict[str, Any]) -> np.ndarray:
        """A tensor NumPy cannot view by itself, read by the safetensors library: from the file, or from a
        file of that one tensor made of its bytes (an object of a store)."""
        from safetensors import safe_open

        if self.where.local is not None:
            with safe_open(str(self.where.local), framework="np") as f:
                return f.get_tensor(key)  # type: ignore[no-any-return]
        import json

        from safetensors.numpy import load

        begin, end = (int(n) for n in entry["data_offsets"])
        head = json.dumps({key: {**entry, "data_offsets": [0, end - begin]}}).encode("utf-8")
        head += b" " * (-len(head) % 8)
        data = self.where.read(self._start + begin, self._start + end)
        return load(len(head).to_bytes(8, "little") + head + data)[key]  # type: ignore[no-any-return]

    def _map(self, offset: int, dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
        count = math.prod(shape)
        if count == 0:
            return np.empty(shape, dtype)
        return self.where.array(dtype, offset, (count,)).reshape(shape)  # type: ignore[no-any-return]


def open_file(p: str | Path, source: str) -> SafetensorsFile:
    return SafetensorsFile(p, source)

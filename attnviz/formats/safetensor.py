"""``.safetensors``: named tensors behind a JSON header, read with the ``safetensors`` package's NumPy
API (never torch).

``safe_open(..., framework="np")`` checks the file and lists its tensors; the data is then
memory-mapped at the offsets the header gives, so a large tensor stays on disk until it is read.
bfloat16 (and 8-bit float) tensors are viewed through ``ml_dtypes``; half-precision tensors become
float32. ``safetensors`` and ``ml_dtypes`` are imported only when such a file is read.
"""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path
from typing import Any

import numpy as np

from attnviz.errors import InputError
from attnviz.formats._base import Container, natural, reason

SUFFIXES = (".safetensors",)

#: safetensors dtype -> NumPy dtype (little-endian, as the format stores them)
NATIVE = {"F64": "<f8", "F32": "<f4", "F16": "<f2", "I64": "<i8", "I32": "<i4", "I16": "<i2", "I8": "i1",
          "U64": "<u8", "U32": "<u4", "U16": "<u2", "U8": "u1", "BOOL": "?"}
#: safetensors dtype -> ml_dtypes type name
ML_DTYPES = {"BF16": "bfloat16", "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2"}


def _header(p: Path) -> tuple[int, dict[str, Any]]:
    """The header length and the parsed header (tensor name -> dtype, shape, data_offsets)."""
    with open(p, "rb") as fh:
        (size,) = struct.unpack("<Q", fh.read(8))
        header = json.loads(fh.read(size))
    if not isinstance(header, dict):
        raise ValueError("the header is not a JSON object")
    return size, header


class SafetensorsFile(Container):
    def __init__(self, p: Path, source: str) -> None:
        try:
            from safetensors import safe_open
        except ImportError:
            raise InputError(f"{source}: reading .safetensors files needs the safetensors package, which is not "
                             "installed; pip install safetensors.") from None
        self.path = p
        try:
            with safe_open(str(p), framework="np") as f:  # checks the header against the file
                keys = list(f.keys())
            size, header = _header(p)
            self._start = 8 + size
            self._entries = {k: header[k] for k in keys}
        except Exception as exc:  # SafetensorError, OSError, ValueError, KeyError, struct.error ...
            raise InputError(f"{source}: not a readable .safetensors file ({reason(exc)}).") from None
        super().__init__(source, natural(keys))  # the header's order means nothing: natural order

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
                from safetensors import safe_open

                with safe_open(str(self.path), framework="np") as f:
                    arr = f.get_tensor(key)
            return self.upcast(key, arr)
        except Exception as exc:
            raise InputError(f"{self.source}:{key}: cannot read the {entry.get('dtype', '?')} tensor "
                             f"({reason(exc)}).") from None

    def _map(self, offset: int, dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
        count = math.prod(shape)
        if count == 0:
            return np.empty(shape, dtype)
        return np.memmap(self.path, dtype=dtype, mode="r", offset=offset, shape=(count,)).reshape(shape)


def open_file(p: Path, source: str) -> SafetensorsFile:
    return SafetensorsFile(p, source)

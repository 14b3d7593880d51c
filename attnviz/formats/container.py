"""What every reader shares: the ``Container`` of named arrays, natural key order, key globs, capped key listings
for messages, and half precision widened on reading (``upcast_half``). NumPy only.

``attnviz.formats`` names these for modules outside the package (``Container``, ``natural``, ``natural_key``,
``listing``, ``is_glob``).
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterable, Sequence

import numpy as np

from attnviz.errors import InputError
from attnviz.quoting import short
from attnviz.sizes import check_memory

#: how many keys a message lists before "and N more"
LISTED = 20
GLOB_CHARS = "*?["
#: ml_dtypes float types NumPy cannot compute with, by name
SMALL_FLOATS = ("bfloat16", "float8_", "float6_", "float4_")


def natural_key(text: str) -> list[object]:
    """``layer2`` before ``layer10``: digits compare as numbers."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", text)]


def natural(keys: Iterable[str]) -> list[str]:
    """Keys in natural order (``blocks.2`` before ``blocks.10``)."""
    return sorted(keys, key=natural_key)


def listing(keys: Sequence[str], limit: int = LISTED) -> str:
    """Keys for a message: ``a, b, c``, at most ``limit`` of them (each shortened to ``KEY_CHARS``),
    then ``and N more``."""
    if not keys:
        return "nothing"
    shown = ", ".join(short(k) for k in list(keys[:limit]))
    return shown if len(keys) <= limit else f"{shown} and {len(keys) - limit} more"


def is_glob(key: str) -> bool:
    """Whether a key is an fnmatch-style pattern (``*``, ``?``, ``[...]``)."""
    return any(c in key for c in GLOB_CHARS)


def upcast_half(arr: np.ndarray, source: str = "the input") -> np.ndarray:
    """float16, bfloat16 and 8-bit floats (ml_dtypes) become float32; other arrays are returned as they are.
    The float32 copy is held in memory: it may take at most ``memory_limit()``."""
    if arr.dtype == np.float16 or arr.dtype.name.startswith(SMALL_FLOATS):
        check_memory(arr.size * 4, source, f"as float32 ({arr.dtype} widened)", arr.shape)
        return np.array(arr, dtype=np.float32)  # a plain array, also from a memory map
    return arr


class Container:
    """A file of named arrays (``.npz``, ``.safetensors``, HDF5, a ``torch.save`` dict or list).

    Subclasses fill ``keys`` (in the file's own order) and implement ``read``; ``get`` and
    ``select`` give the errors, so every format says the same things the same way.
    """

    #: how a message names the kind of file ("archive", "file")
    noun = "file"

    def __init__(self, source: str, keys: Sequence[str]) -> None:
        self.source = source
        self.keys: list[str] = list(keys)
        self._known = set(self.keys)
        #: the dtype each array read had in the file, when it was widened on reading ("bfloat16")
        self.stored: dict[str, str] = {}

    def upcast(self, key: str, arr: np.ndarray) -> np.ndarray:
        """``upcast_half``, remembering the dtype the file stored (tolerances depend on it)."""
        out = upcast_half(arr, f"{self.source}:{key}")
        if out is not arr:
            self.stored[key] = arr.dtype.name
        return out

    def read(self, key: str) -> np.ndarray:  # pragma: no cover - every reader overrides it
        raise NotImplementedError

    def normalize(self, key: str) -> str:
        """A key as the file spells it (HDF5 drops a leading ``/``)."""
        return key

    def hint(self, key: str) -> str:
        """Anything more to say when ``key`` is not an array here (HDF5: it is a group)."""
        return ""

    def has(self, key: str) -> bool:
        return self.normalize(key) in self._known

    def get(self, key: str) -> np.ndarray:
        """The array named ``key``; an error listing what the file holds if there is none."""
        key = self.normalize(key)
        if key not in self._known:
            raise InputError(f"{self.source}: no array named {key!r}{self.hint(key)}; it holds {listing(self.keys)}.")
        return self.read(key)

    def select(self, key: str) -> list[str]:
        """The keys ``key`` names: itself if the file has it, else the matches of a glob in natural order.
        No match is an error listing the keys there are."""
        key = self.normalize(key)
        if key in self._known or not is_glob(key):
            if key not in self._known:
                self.get(key)  # the error
            return [key]
        matches = natural(k for k in self.keys if fnmatch.fnmatchcase(k, key))
        if not matches:
            raise InputError(f"{self.source}: no array matches {key!r}; it holds {listing(self.keys)}.")
        return matches

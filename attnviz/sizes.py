"""Sizes in bytes: for messages (``size_str``), of arrays (``array_bytes``), and the memory an input array may
take (``memory_limit``): sizes are judged from headers before anything is allocated (docs/inputs.md). Data that
stays on disk (memory-mapped) must lie within the file's real size (``check_stored``); data that must be held in
memory (compressed members, chunked or compressed HDF5 datasets, conversions such as float16 -> float32, an array
fetched from a store) may take at most ``memory_limit()`` bytes (``check_memory``). The standard library only.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

from attnviz.errors import InputError, shape_str

#: the units of a size a user writes (``512M``, ``2G``, ``1.5GiB``, ``1T``): powers of 1024, case ignored
SIZE_UNITS = {"": 1, "b": 1, "k": 2**10, "kb": 2**10, "kib": 2**10, "m": 2**20, "mb": 2**20, "mib": 2**20,
              "g": 2**30, "gb": 2**30, "gib": 2**30, "t": 2**40, "tb": 2**40, "tib": 2**40}
#: the least ``memory_limit()`` gives, however little memory seems free
MIN_MEMORY_LIMIT = 256 * 2**20


def size_str(nbytes: int) -> str:
    """Bytes for a message: ``512 B``, ``1.5 KiB``, ``3.7 TiB``."""
    value = float(nbytes)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if abs(value) < 1024 or unit == "PiB":
            return f"{int(value)} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{nbytes} B"  # pragma: no cover


def _available_memory() -> int | None:
    try:
        with open("/proc/meminfo", "rb") as fh:
            for line in fh.read(1 << 16).decode("ascii", "replace").splitlines():
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return None


def memory_limit() -> int:
    """The most bytes one input array may take when it must be held in memory (decompressed, or
    converted): half the memory available now (``MemAvailable`` on Linux, physical memory elsewhere),
    at most half an address-space limit (``ulimit -v``), and never less than ``MIN_MEMORY_LIMIT``."""
    available = _available_memory()
    limit = available // 2 if available else 8 * 2**30
    try:
        import resource

        soft, _ = resource.getrlimit(resource.RLIMIT_AS)
        if soft not in (resource.RLIM_INFINITY, -1) and soft > 0:
            limit = min(limit, soft // 2)
    except (ImportError, OSError, ValueError):
        pass
    return max(limit, MIN_MEMORY_LIMIT)


def array_bytes(shape: Iterable[int], itemsize: int) -> int:
    """The bytes an array of ``shape`` would take (Python integers: no overflow)."""
    count = 1
    for n in shape:
        count *= int(n)
    return count * int(itemsize)


def describe_array(dtype: Any, shape: Iterable[int], nbytes: int) -> str:
    return f"a {dtype} array of shape {shape_str(shape)} ({size_str(nbytes)})"


def check_memory(nbytes: int, source: str, what: str = "", shape: Iterable[int] | None = None) -> None:
    """Refuse, before allocating, an array that would take more than ``memory_limit()`` in memory."""
    limit = memory_limit()
    if nbytes > limit:
        shown = f" of shape {shape_str(shape)}" if shape is not None else ""
        how = f" {what}" if what else ""
        raise InputError(f"{source}: the array{shown} would take {size_str(nbytes)} in memory{how}, "
                         f"more than the {size_str(limit)} attnviz allows (half the memory available); "
                         "store it uncompressed (.npy, numpy.savez) so that it can stay on disk, or pass a slice.")


def check_stored(nbytes: int, available: int, source: str, dtype: Any, shape: Iterable[int], where: str) -> None:
    """Refuse a header that claims more bytes than ``available`` (what the file really holds)."""
    if nbytes > available:
        raise InputError(f"{source}: the header claims {describe_array(dtype, shape, nbytes)}, but {where} holds only "
                         f"{size_str(max(available, 0))}; the file is cut short or its header is wrong.")

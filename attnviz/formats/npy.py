"""``.npy``: one array, memory-mapped (read on demand), never unpickled.

From an object store (``attnviz.storage``) the header is read with a small range, then the data with one.

The header is read first (``read_header``) and its claim checked against the bytes that follow it, so a
header that promises more than the file holds is refused before NumPy maps or allocates anything.
"""

from __future__ import annotations

import errno
import warnings
from pathlib import Path
from typing import IO, Any

import numpy as np

from attnviz.errors import InputError
from attnviz.quoting import reason
from attnviz.sizes import array_bytes, check_stored, describe_array

SUFFIXES = (".npy",)
MAGIC = b"\x93NUMPY"
ZIP_MAGIC = b"PK\x03\x04"
#: the longest header read (NumPy's own default)
MAX_HEADER = 10000


def pickled(source: str) -> InputError:
    return InputError(f"{source}: holds pickled Python objects; attnviz never unpickles (allow_pickle=False). "
                      "Save a plain numeric array with numpy.save.")


def _header_reader() -> Any:
    impl = getattr(np.lib, "_format_impl", None) or np.lib.format  # NumPy 2 keeps it in _format_impl
    return impl._read_array_header


def read_header(fh: IO[bytes], source: str) -> tuple[tuple[int, ...], bool, np.dtype, int]:
    """``(shape, fortran_order, dtype, header length)`` of the ``.npy`` data at the stream's position,
    read without allocating the array; pickled (object) arrays are refused here."""
    start = fh.tell()
    head = fh.read(len(MAGIC))
    if head != MAGIC:
        if head.startswith(ZIP_MAGIC[:2]):
            raise InputError(f"{source}: is a zip archive (.npz), not a .npy file; rename it to .npz.")
        if head[:1] == b"\x80":
            raise pickled(source)
        raise InputError(f"{source}: not a readable .npy file (it does not start with the NumPy magic string).")
    fh.seek(start)
    try:
        with warnings.catch_warnings():  # a damaged header can make Python warn about its own text
            warnings.simplefilter("ignore")
            version = np.lib.format.read_magic(fh)
            shape, fortran, dtype = _header_reader()(fh, version, max_header_size=MAX_HEADER)
    except Exception as exc:  # ValueError, SyntaxError, EOFError, MemoryError from a hostile header ...
        raise InputError(f"{source}: not a readable .npy file ({reason(exc)}).") from None
    if not isinstance(dtype, np.dtype):
        raise InputError(f"{source}: not a readable .npy file (no dtype in the header).")
    if dtype.hasobject:
        raise pickled(source)
    if not all(isinstance(n, int) and n >= 0 for n in shape):
        raise InputError(f"{source}: not a readable .npy file (the header's shape {shape!r} is not a shape).")
    return tuple(int(n) for n in shape), bool(fortran), dtype, fh.tell() - start


def open_file(p: str | Path, source: str) -> np.ndarray:
    """The array of a ``.npy`` file: memory-mapped from a local file, fetched (its data, one range) from a store."""
    from attnviz import storage

    where = storage.open_input(p, source)
    size = where.size
    try:
        with where.open() as fh:
            shape, fortran, dtype, header = read_header(fh, source)
    except OSError as exc:
        raise InputError(f"{source}: not a readable .npy file ({reason(exc)}).") from None
    check_stored(array_bytes(shape, dtype.itemsize), size - header, source, dtype, shape, "the file")
    if where.local is None:  # an object of a store: its data, one range
        return where.array(dtype, header, shape, "F" if fortran else "C")  # type: ignore[no-any-return]
    try:
        return np.load(where.local, allow_pickle=False, mmap_mode="r")  # read on demand: long inputs stay on disk
    except ValueError as exc:
        if any(s in str(exc).lower() for s in ("pickle", "object arrays", "python objects")):
            raise pickled(source) from None
        raise InputError(f"{source}: not a readable .npy file ({reason(exc)}).") from None
    except (MemoryError, OSError) as exc:
        if isinstance(exc, MemoryError) or getattr(exc, "errno", None) == errno.ENOMEM:
            nbytes = array_bytes(shape, dtype.itemsize)
            raise InputError(f"{source}: {describe_array(dtype, shape, nbytes)} cannot be mapped into this process's "
                             "memory (an address-space limit, ulimit -v, is lower); pass a slice, or raise the "
                             "limit.") from None
        raise InputError(f"{source}: not a readable .npy file ({reason(exc)}).") from None
    except Exception as exc:  # EOFError ...
        raise InputError(f"{source}: not a readable .npy file ({reason(exc)}).") from None

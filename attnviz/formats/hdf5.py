"""HDF5 (``.h5``, ``.hdf5``) through h5py: keys are dataset paths (``attn/layer0``), found by walking
the groups. A contiguous, uncompressed dataset is memory-mapped; others are read whole. String
datasets come back as text (usable as ``q_labels``/``k_labels``). h5py is imported only when such a
file is read.
From an object store (``attnviz.storage``) h5py reads the file's metadata through a stream with a small
read-ahead, and a contiguous dataset is fetched with one ranged request of its bytes.

Sizes are judged from the dataset's shape and dtype before it is read: a memory-mapped dataset must lie
inside the file; one read into memory (chunked, compressed, never written) may take at most
``memory_limit()``. Data kept outside the file (external storage, virtual datasets) is refused: attnviz
reads only what the file itself holds.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from attnviz.errors import InputError
from attnviz.formats.container import Container, natural
from attnviz.quoting import reason
from attnviz.sizes import array_bytes, check_memory, check_stored

SUFFIXES = (".h5", ".hdf5")
#: what one element of a variable-length (string) dataset is counted as in memory
VLEN_BYTES = 64


class Hdf5File(Container):
    def __init__(self, p: str | Path, source: str) -> None:
        from attnviz import storage

        try:
            import h5py
        except ImportError:
            raise InputError(f"{source}: reading HDF5 files needs h5py, which is not installed; pip install h5py.") \
                from None
        self.path = p
        self.where = storage.open_input(p, source)
        self.size = self.where.size
        self._h5py = h5py
        datasets: list[str] = []
        self.groups: set[str] = set()
        #: names that are not UTF-8 (h5py gives them as bytes): shown with escapes, opened by their bytes
        self._raw_names: dict[str, bytes] = {}

        def visit(name: str | bytes, obj: Any) -> None:
            if isinstance(name, bytes):
                text = name.decode("utf-8", "backslashreplace")
                self._raw_names[text] = name
                name = text
            if isinstance(obj, h5py.Dataset):
                datasets.append(name)
            elif isinstance(obj, h5py.Group):
                self.groups.add(name)

        try:
            self._file = h5py.File(self.where.local or self.where.open(), "r")
            self._file.visititems(visit)
        except Exception as exc:  # OSError for a file that is not HDF5 or is cut short, KeyError, RuntimeError
            raise InputError(f"{source}: not a readable HDF5 file ({reason(exc)}).") from None
        super().__init__(source, natural(datasets))  # h5py walks alphabetically: natural order instead

    def normalize(self, key: str) -> str:
        return key.strip("/")

    def hint(self, key: str) -> str:
        if key in self.groups:
            return f" ({key!r} is a group: name one of its datasets, or all of them as {key}/*)"
        return ""

    def read(self, key: str) -> np.ndarray:
        where = f"{self.source}:{key}"
        try:
            dataset = self._file[self._raw_names.get(key, key)]
            if dataset.is_virtual or dataset.external:
                raise InputError(f"{where}: the dataset's data is kept in other files (a virtual dataset or "
                                 "external storage); attnviz reads only data inside the file itself.")
            shape, dtype = tuple(int(n) for n in dataset.shape or ()), dataset.dtype
            if self._h5py.check_string_dtype(dtype) is not None or dtype.kind == "O":
                check_memory(array_bytes(shape, max(dtype.itemsize, VLEN_BYTES)), where, "", shape)
                return np.asarray(dataset.asstr()[()], dtype=str)
            nbytes = array_bytes(shape, dtype.itemsize)
            mapped = self._mapped(dataset, where, nbytes)
            if mapped is None:
                check_memory(nbytes, where, "", shape)
            arr = mapped if mapped is not None else np.asarray(dataset[()])
            return self.upcast(key, arr)
        except InputError:
            raise
        except MemoryError:
            raise InputError(f"{where}: not enough memory to read the dataset.") from None
        except Exception as exc:
            raise InputError(f"{where}: cannot read the dataset ({reason(exc)}).") from None

    def _mapped(self, dataset: Any, where: str, nbytes: int) -> np.ndarray | None:
        """A memory map of a contiguous, uncompressed, numeric dataset; None when it cannot be one. One
        whose data would run past the end of the file is refused."""
        dtype, shape = dataset.dtype, tuple(dataset.shape)
        if (dataset.chunks is not None or dataset.compression is not None or dtype.kind not in "biuf"
                or dtype.names is not None or not shape or 0 in shape or self._file.userblock_size
                or dataset.external is not None):
            return None
        offset = dataset.id.get_offset()
        if offset is None:
            return None
        check_stored(nbytes, self.size - offset, where, dtype, shape, "the file after the dataset's offset")
        try:
            arr = self.where.array(dtype, offset, shape)
        except (OSError, ValueError):
            return None
        first = (0,) * len(shape)
        mine, theirs = arr[first], dataset[first]
        if not (mine == theirs or (dtype.kind == "f" and np.isnan(mine) and np.isnan(theirs))):
            return None  # not where HDF5 says: read it through h5py instead
        return arr


def open_file(p: str | Path, source: str) -> Hdf5File:
    return Hdf5File(p, source)

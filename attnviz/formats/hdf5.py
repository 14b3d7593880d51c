"""HDF5 (``.h5``, ``.hdf5``) through h5py: keys are dataset paths (``attn/layer0``), found by walking
the groups. A contiguous, uncompressed dataset is memory-mapped; others are read whole. String
datasets come back as text (usable as ``q_labels``/``k_labels``). h5py is imported only when such a
file is read.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from attnviz.errors import InputError
from attnviz.formats._base import Container, natural, reason

SUFFIXES = (".h5", ".hdf5")


class Hdf5File(Container):
    def __init__(self, p: Path, source: str) -> None:
        try:
            import h5py
        except ImportError:
            raise InputError(f"{source}: reading HDF5 files needs h5py, which is not installed; pip install h5py.") \
                from None
        self.path = p
        self._h5py = h5py
        datasets: list[str] = []
        self.groups: set[str] = set()

        def visit(name: str, obj: Any) -> None:
            if isinstance(obj, h5py.Dataset):
                datasets.append(name)
            elif isinstance(obj, h5py.Group):
                self.groups.add(name)

        try:
            self._file = h5py.File(p, "r")
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
        try:
            dataset = self._file[key]
            if self._h5py.check_string_dtype(dataset.dtype) is not None:
                return np.asarray(dataset.asstr()[()], dtype=str)
            mapped = self._mapped(dataset)
            arr = mapped if mapped is not None else np.asarray(dataset[()])
            return self.upcast(key, arr)
        except Exception as exc:
            raise InputError(f"{self.source}:{key}: cannot read the dataset ({reason(exc)}).") from None

    def _mapped(self, dataset: Any) -> np.ndarray | None:
        """A memory map of a contiguous, uncompressed, numeric dataset; None when it cannot be one."""
        dtype, shape = dataset.dtype, tuple(dataset.shape)
        if (dataset.chunks is not None or dataset.compression is not None or dtype.kind not in "biuf"
                or dtype.names is not None or not shape or 0 in shape or self._file.userblock_size
                or dataset.external is not None):
            return None
        offset = dataset.id.get_offset()
        if offset is None:
            return None
        try:
            arr = np.memmap(self.path, dtype=dtype, mode="r", offset=offset, shape=shape)
        except (OSError, ValueError):
            return None
        first = (0,) * len(shape)
        mine, theirs = arr[first], dataset[first]
        if not (mine == theirs or (dtype.kind == "f" and np.isnan(mine) and np.isnan(theirs))):
            return None  # not where HDF5 says: read it through h5py instead
        return arr


def open_file(p: Path, source: str) -> Hdf5File:
    return Hdf5File(p, source)

"""``.npz`` (``numpy.savez``): named arrays in a zip archive, read on demand, never unpickled."""

from __future__ import annotations

import zipfile
import zlib
from pathlib import Path

import numpy as np

from attnviz.errors import InputError
from attnviz.formats._base import Container

SUFFIXES = (".npz",)


class NpzArchive(Container):
    """A ``.npz`` archive opened without pickle; entries read on demand with clear errors."""

    noun = "archive"

    def __init__(self, p: Path, source: str) -> None:
        try:
            self._z = np.load(p, allow_pickle=False)
        except (ValueError, OSError, EOFError, zipfile.BadZipFile) as exc:
            raise InputError(f"{source}: not a readable .npz archive ({exc}).") from None
        if not hasattr(self._z, "files"):
            raise InputError(f"{source}: is a .npy file, not a .npz archive; rename it to .npy.")
        super().__init__(source, list(self._z.files))

    def read(self, key: str) -> np.ndarray:
        try:
            return np.asarray(self._z[key])
        except ValueError as exc:
            if "pickle" in str(exc).lower() or "object arrays" in str(exc).lower():
                raise InputError(
                    f"{self.source}:{key}: holds pickled Python objects; attnviz never unpickles "
                    "(allow_pickle=False)."
                ) from None
            raise InputError(f"{self.source}:{key}: unreadable ({exc}).") from None
        except (OSError, EOFError, zipfile.BadZipFile, zlib.error) as exc:
            raise InputError(f"{self.source}:{key}: unreadable ({exc}).") from None


def open_file(p: Path, source: str) -> NpzArchive:
    return NpzArchive(p, source)

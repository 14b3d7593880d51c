"""``.npz`` (``numpy.savez``): named arrays in a zip archive, read on demand, never unpickled.

The archive is read with ``zipfile`` and each member's ``.npy`` header before its data: a member whose
header claims more than the zip directory says it holds, or a directory that claims more than the file
(or than deflate can expand), is refused before anything is allocated. A large member stored
uncompressed (``numpy.savez``) is memory-mapped at its offset in the archive; a compressed one
(``numpy.savez_compressed``) is read into memory, and may take at most ``memory_limit()``. From an object
store (``attnviz.storage``) the zip directory and a member's headers are read in small pieces and a stored
member's data with one ranged request: a member costs its own bytes, not the archive's.
"""

from __future__ import annotations

import zipfile
from pathlib import Path

import numpy as np

from attnviz.errors import InputError
from attnviz.formats.container import Container
from attnviz.formats.npy import MAGIC, pickled, read_header
from attnviz.formats.zipfiles import check_zip_members, zip_data_offset
from attnviz.quoting import reason, short
from attnviz.sizes import array_bytes, check_memory, check_stored

SUFFIXES = (".npz",)
#: stored members at least this large are memory-mapped rather than read
MAP_BYTES = 1 << 20


class NpzArchive(Container):
    """A ``.npz`` archive opened without pickle; entries read on demand with clear errors."""

    noun = "archive"

    def __init__(self, p: str | Path, source: str) -> None:
        from attnviz import storage

        self.where = storage.open_input(p, source)
        self.path = p
        self.size = self.where.size
        try:
            head = self.where.read(0, len(MAGIC))
        except OSError as exc:
            raise InputError(f"{source}: not a readable .npz archive ({reason(exc)}).") from None
        if head == MAGIC:
            raise InputError(f"{source}: is a .npy file, not a .npz archive; rename it to .npy.")
        try:
            #: a store's object is read through one stream (small read-ahead) for the zip's directory and headers
            self._stream = None if self.where.local is not None else self.where.open()
            self._zip = zipfile.ZipFile(self.where.local if self._stream is None else self._stream)
            infos = self._zip.infolist()
        except Exception as exc:  # BadZipFile, OSError, ValueError, UnicodeDecodeError, struct.error ...
            raise InputError(f"{source}: not a readable .npz archive ({reason(exc)}).") from None
        try:
            check_zip_members(infos, self.size, source)
        except InputError as exc:
            raise InputError(exc.message.replace("not a readable zip archive", "not a readable .npz archive")) \
                from None
        self._info: dict[str, zipfile.ZipInfo] = {}
        for info in infos:  # numpy's names: "x.npy" is key "x"; a later duplicate wins, as in zipfile
            name = info.filename
            key = name[:-4] if name.endswith(".npy") else name
            if name and not name.endswith("/"):  # folders (and nameless entries) hold no array
                self._info[key] = info
        super().__init__(source, list(self._info))

    def read(self, key: str) -> np.ndarray:
        where = f"{self.source}:{key}"
        info = self._info[key]
        if not info.filename.endswith(".npy"):
            raise InputError(f"{where}: is not an array (the archive entry {short(info.filename)!r} is not a .npy "
                             "member).")
        if info.flag_bits & 0x1:
            raise InputError(f"{where}: the archive entry is encrypted; attnviz reads plain .npz archives.")
        try:
            with self._zip.open(info) as fh:
                shape, fortran, dtype, header = read_header(fh, where)  # type: ignore[arg-type]
            nbytes = array_bytes(shape, dtype.itemsize)
            check_stored(nbytes, info.file_size - header, where, dtype, shape, "the archive entry")
            remote = self.where.local is None
            if info.compress_type == zipfile.ZIP_STORED and (nbytes >= MAP_BYTES or remote):
                if self._stream is not None:
                    start = zip_data_offset(self._stream, info, self.size)
                else:
                    with open(self.where.local, "rb") as raw:
                        start = zip_data_offset(raw, info, self.size)
                return self.where.array(dtype, start + header, shape,  # type: ignore[no-any-return]
                                        "F" if fortran else "C")
            check_memory(nbytes, where, "", shape)
            with self._zip.open(info) as fh:
                return np.lib.format.read_array(fh, allow_pickle=False)  # type: ignore[arg-type]
        except InputError:
            raise
        except ValueError as exc:
            if "pickle" in str(exc).lower() or "object arrays" in str(exc).lower():
                raise pickled(where) from None
            raise InputError(f"{where}: unreadable ({reason(exc)}).") from None
        except MemoryError:
            raise InputError(f"{where}: not enough memory to read the array.") from None
        except Exception as exc:  # OSError, EOFError, BadZipFile (a bad CRC), zlib.error, NotImplementedError ...
            raise InputError(f"{where}: unreadable ({reason(exc)}).") from None


def open_file(p: str | Path, source: str) -> NpzArchive:
    return NpzArchive(p, source)

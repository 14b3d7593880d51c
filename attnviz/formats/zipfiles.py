"""Zip archives (``.npz``, zip ``torch.save`` files) checked before they are read: a directory whose entries claim
more than the archive can hold is refused (``check_zip_members``), and an entry's data is found after its local
header, inside the file (``zip_data_offset``). The standard library only.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import IO, Any

from attnviz.errors import InputError
from attnviz.quoting import short
from attnviz.sizes import size_str

#: the most a deflate stream can expand (1032:1), with room for a small member
DEFLATE_RATIO = 1032


def check_zip_members(infos: Iterable[Any], file_size: int, source: str) -> None:
    """Refuse a zip directory whose entries claim more than the archive can hold: a stored entry's bytes
    must lie inside the file, a deflated entry cannot expand more than deflate can. (What an entry may
    take in memory is judged when it is read.)"""
    import zipfile

    for info in infos:
        name = short(info.filename)
        if info.header_offset + info.compress_size > file_size:
            raise InputError(f"{source}: not a readable zip archive (the entry {name!r} claims "
                             f"{size_str(info.compress_size)} beyond the end of the file; it is cut short).")
        if info.compress_type == zipfile.ZIP_STORED and info.file_size != info.compress_size:
            raise InputError(f"{source}: not a readable zip archive (the stored entry {name!r} claims "
                             f"{size_str(info.file_size)} but holds {size_str(info.compress_size)}).")
        if info.compress_type == zipfile.ZIP_DEFLATED and info.file_size > info.compress_size * DEFLATE_RATIO + 1024:
            raise InputError(f"{source}: not a readable zip archive (the entry {name!r} claims "
                             f"{size_str(info.file_size)} from {size_str(info.compress_size)} of compressed data, "
                             "more than deflate can expand: a zip bomb or a damaged directory).")


def zip_data_offset(fh: IO[bytes], info: Any, file_size: int) -> int:
    """Where a zip entry's data starts in the file (after its local header), checked to lie inside it."""
    import struct

    fh.seek(info.header_offset)
    local = fh.read(30)
    if len(local) != 30 or local[:4] != b"PK\x03\x04":
        raise ValueError(f"bad local header for {short(info.filename)!r}")
    name_len, extra_len = struct.unpack("<HH", local[26:30])
    start = info.header_offset + 30 + name_len + extra_len
    if start + info.compress_size > file_size:
        raise ValueError(f"the entry {short(info.filename)!r} runs past the end of the file")
    return start

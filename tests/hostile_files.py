"""Builders of files that lie about themselves, shared by the hardening tests and the hostile corpus."""

from __future__ import annotations

import io
import struct

import numpy as np


def npy_bytes(arr: np.ndarray) -> bytes:
    """``arr`` as the bytes of a .npy file."""
    buf = io.BytesIO()
    np.save(buf, arr)
    return buf.getvalue()


def lying_npy(shape_text: str, data: bytes = b"\0" * 72) -> bytes:
    """A version 1.0 .npy whose header claims ``shape_text`` (float32) over ``data``."""
    header = f"{{'descr': '<f4', 'fortran_order': False, 'shape': {shape_text}, }}"
    header += " " * (118 - len(header)) + "\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header.encode() + data

"""``.npy``: one array, memory-mapped (read on demand), never unpickled."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from attnviz.errors import InputError

SUFFIXES = (".npy",)


def open_file(p: Path, source: str) -> np.ndarray:
    try:
        return np.load(p, allow_pickle=False, mmap_mode="r")  # read on demand: long inputs stay on disk
    except ValueError as exc:
        if any(s in str(exc).lower() for s in ("pickle", "object arrays", "python objects")):
            raise InputError(
                f"{source}: holds pickled Python objects; attnviz never unpickles (allow_pickle=False). "
                "Save a plain numeric array with numpy.save."
            ) from None
        raise InputError(f"{source}: not a readable .npy file ({exc}).") from None
    except (OSError, EOFError) as exc:
        raise InputError(f"{source}: not a readable .npy file ({exc}).") from None

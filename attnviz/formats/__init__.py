"""Readers for the array files users hold: the one place a file format is added.

Each reader module reads one format and has ``SUFFIXES`` and ``open_file(path, source)``, which returns a
NumPy array (a file of one array) or a ``Container`` of named arrays (``FILE:KEY`` picks one; a key
may be a glob). What the readers share is in ``container`` (``Container``, natural key order, key globs,
key listings, half precision widened; modules outside take them from this package) and ``zipfiles``
(zip directories checked before they are read); the limits every input is held to are below, in
``attnviz.sizes`` (memory), ``attnviz.storage`` (regular files, text) and ``attnviz.jsontext`` (JSON).

A reader asks ``attnviz.storage.open_input`` for the file (a local file, or an object of a
store named by a URL) and reads what it needs through it. ``attnviz.io.open_spec`` is the single entrance
that uses them; JSON and ``-`` (standard input) are read there. Readers import NumPy only at module level:
h5py, safetensors, ml_dtypes and torch are imported when a file of theirs is read.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from attnviz.formats import hdf5, npy, npz, pytorch, safetensor
from attnviz.formats.container import Container, is_glob, listing, natural, natural_key

__all__ = ["FORMATS", "BY_SUFFIX", "CONTAINER_SUFFIXES", "Container", "Format", "describe", "is_glob", "listing",
           "natural", "natural_key", "open_file"]


@dataclass(frozen=True)
class Format:
    """One file format: its suffixes, how messages name it, and its reader."""

    name: str  # ".safetensors", ".h5/.hdf5", ".pt/.pth/.bin (torch.save)"
    suffixes: tuple[str, ...]
    open: Callable[[str | Path, str], Any]  # (path or URL, source) -> np.ndarray | Container
    keyed: bool  # holds named arrays: FILE:KEY picks one


FORMATS: tuple[Format, ...] = (
    Format(".npy", npy.SUFFIXES, npy.open_file, keyed=False),
    Format(".npz", npz.SUFFIXES, npz.open_file, keyed=True),
    Format(".safetensors", safetensor.SUFFIXES, safetensor.open_file, keyed=True),
    Format(".h5/.hdf5", hdf5.SUFFIXES, hdf5.open_file, keyed=True),
    Format(".pt/.pth/.bin (torch.save)", pytorch.SUFFIXES, pytorch.open_file, keyed=True),
)
BY_SUFFIX: dict[str, Format] = {s: f for f in FORMATS for s in f.suffixes}
#: suffixes of files of named arrays: ``FILE.EXT:KEY`` splits for these
CONTAINER_SUFFIXES: tuple[str, ...] = tuple(s for f in FORMATS if f.keyed for s in f.suffixes)


def describe(keyed_only: bool = False) -> str:
    """The formats for a message: ``.npy, .npz, .safetensors, ...``."""
    return ", ".join(f.name for f in FORMATS if f.keyed or not keyed_only)


def open_file(p: Path | Any, source: str) -> Any:
    """Open a file (a ``Path``, or an ``attnviz.storage.Url``) by its suffix (which must be in ``BY_SUFFIX``):
    an array or a ``Container``."""
    return BY_SUFFIX[p.suffix.lower()].open(p, source)

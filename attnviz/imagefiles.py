"""Reading the picture of ``--image``: a PNG or JPEG file decoded by Pillow (imported when a picture is
read, never at start-up), or an array the model saw after preprocessing (``.npy``: ``[H, W, 3]``, or a
processor's ``pixel_values`` ``[3, H, W]`` / ``[1, 3, H, W]``), brought to RGB ``uint8 [H, W, 3]`` for
drawing (a normalised array is stretched from its lowest to its highest value, as DINO's
``save_image(normalize=True)`` shows the image it fed the model).

Errors name the file: a missing file or an unknown type is a usage error (exit 2), a file that cannot
be decoded or an array of another shape is bad data (exit 1).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from attnviz.errors import InputError, UsageError, shape_str
from attnviz.storage import Place

PICTURE_SUFFIXES = (".png", ".jpg", ".jpeg")
MAX_PIXELS = 64_000_000  # a larger picture is refused (Pillow's own bomb guard warns at 89M)


@dataclass(frozen=True)
class Picture:
    """An image to draw on: ``rgb uint8 [H, W, 3]``, where it came from and how it was read."""

    rgb: np.ndarray
    source: str
    how: str
    path: Place | None = None

    @property
    def size(self) -> tuple[int, int]:
        """(height, width) in pixels."""
        return int(self.rgb.shape[0]), int(self.rgb.shape[1])


def read_picture(spec: str) -> Picture:
    """The picture of ``--image spec`` (see the module's docstring); an array handed over in memory (the
    Python API's ``image=``) is read as a ``.npy`` file would be."""
    from attnviz.io import MEMORY, memory_value

    if spec.startswith(MEMORY):
        name = spec[len(MEMORY):]
        return Picture(_picture_array(np.asarray(memory_value(spec)), f"image= ({name})"), "image", "array")
    from attnviz import storage

    where = storage.place(spec)
    suffix = where.suffix.lower()
    if suffix not in (*PICTURE_SUFFIXES, ".npy"):
        raise UsageError(f"--image {spec}: unknown file type {where.suffix or '(none)'!r}; give a PNG or JPEG file, "
                         "or an array [H, W, 3] in a .npy file.")
    if isinstance(where, storage.Url):  # an object of a store: a copy on disk for Pillow (a picture is small)
        with storage.local_copy(spec, f"--image {spec}") as copy:
            if suffix == ".npy":
                return Picture(_from_array(spec, copy), spec, "array", where)
            return Picture(_decode(spec, copy), spec, suffix.lstrip(".").upper().replace("JPG", "JPEG"), where)
    p = Path(spec)
    if not os.path.lexists(p):
        raise UsageError(f"--image {spec}: no such file.")
    if not p.is_file():
        raise UsageError(f"--image {spec}: not a regular file.")
    if suffix == ".npy":
        return Picture(_from_array(spec, p), spec, "array", p)
    return Picture(_decode(spec, p), spec, suffix.lstrip(".").upper().replace("JPG", "JPEG"), p)


def _decode(spec: str, p: Path) -> np.ndarray:
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(p) as im:
            if im.format not in ("PNG", "JPEG"):
                raise InputError(f"--image {spec}: a {im.format} picture; attnviz reads PNG and JPEG.")
            if im.width * im.height > MAX_PIXELS:
                raise InputError(f"--image {spec}: {im.width} x {im.height} pixels is more than attnviz draws "
                                 f"({MAX_PIXELS} pixels); give the image as the model saw it.")
            return np.asarray(im.convert("RGB"), dtype=np.uint8).copy()
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as exc:
        reason = str(exc).split("\n")[0] or type(exc).__name__
        raise InputError(f"--image {spec}: cannot read it as a PNG or JPEG picture ({reason}).") from None


def _from_array(spec: str, p: Path) -> np.ndarray:
    try:
        arr = np.load(p, allow_pickle=False)
    except (ValueError, OSError, EOFError) as exc:
        raise InputError(f"--image {spec}: cannot read it as a .npy array ({str(exc).splitlines()[0]}).") from None
    return _picture_array(arr, f"--image {spec}")


def _picture_array(arr: np.ndarray, where: str) -> np.ndarray:
    shape = arr.shape
    if arr.ndim == 4 and arr.shape[0] == 1:
        arr = arr[0]
    if arr.ndim == 3 and arr.shape[-1] != 3 and arr.shape[0] == 3:
        arr = np.moveaxis(arr, 0, -1)  # a processor's pixel_values, channels first
    if arr.ndim != 3 or arr.shape[-1] != 3 or arr.dtype.kind not in "biuf" or arr.size == 0:
        raise InputError(f"{where}: an array {shape_str(shape)} of {arr.dtype}; expected a picture "
                         "[H, W, 3] (or [3, H, W], [1, 3, H, W]) of numbers.")
    values = arr.astype(np.float64)
    if not np.isfinite(values).all():
        raise InputError(f"{where}: the array holds NaN or infinity.")
    if arr.dtype == np.uint8:
        return arr.copy()
    low, high = float(values.min()), float(values.max())
    scaled = (values - low) / (high - low) if high > low else np.zeros_like(values)
    return np.round(scaled * 255).astype(np.uint8)

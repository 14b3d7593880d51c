"""Attention over an image: where the patches are among the keys, the chosen query's attention over
them as a grid, brought to the picture's pixels, and the patches that hold a share of it.

* A ViT's sequence is ``prefix`` tokens (CLS; DeiT's distillation token; DINOv2's registers) and then
  the patches in row-major order (``--prefix-tokens``, ``--patch-grid``); a vision-language model's
  is text with the image's tokens at ``START:END`` (``--image-tokens``; LLaVA-1.5: 576 = 24 x 24).
  ``patch_layout`` checks that the grid fits: prefix + rows x columns = Lk, or END - START = rows x
  columns within Lk.
* ``grid_maps``: the query's row over the patches, per head, reshaped to ``[heads, gh, gw]``, as DINO's
  ``visualize_attention.py`` takes ``attentions[0, :, 0, 1:].reshape(nh, w_featmap, h_featmap)``.
* ``upsample``: the grid at the picture's pixels: ``nearest`` as ``torch.nn.functional.interpolate
  (mode="nearest")`` (DINO: each patch a flat square), ``bilinear`` as ``mode="bilinear",
  align_corners=False``.
* ``keep_mass``: DINO's ``--threshold``: sort the weights, normalise, cumulative sum, keep those whose
  cumulative share is above ``1 - F``: the fewest patches that hold ``F`` of the mass.

NumPy only; typed options in (``ImageOptions``), arrays out.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

import numpy as np

from attnviz.errors import InputError, UsageError
from attnviz.inspection.options import ImageOptions


def parse_grid(text: str) -> tuple[int, int]:
    """``14x14`` as (rows, columns)."""
    found = re.fullmatch(r"\s*(\d{1,5})\s*[xX×]\s*(\d{1,5})\s*", text, re.ASCII)
    if found is None or min(int(found.group(1)), int(found.group(2))) < 1:
        raise UsageError(f"--patch-grid {text!r}: expected rows x columns of patches, e.g. 14x14.")
    return int(found.group(1)), int(found.group(2))


def parse_span(text: str) -> tuple[int, int]:
    """``5:581`` as (start, end), end excluded."""
    found = re.fullmatch(r"\s*(\d{1,9})\s*:\s*(\d{1,9})\s*", text, re.ASCII)
    if found is None or int(found.group(2)) <= int(found.group(1)):
        raise UsageError(f"--image-tokens {text!r}: expected START:END positions with END after START, e.g. 5:581.")
    return int(found.group(1)), int(found.group(2))


@dataclass(frozen=True)
class PatchLayout:
    """The patches among the keys: a grid of ``grid`` patches at positions ``start`` ... ``start + n - 1``;
    ``prefix`` is the ViT's prefix (None for a span of image tokens)."""

    grid: tuple[int, int]
    start: int
    prefix: int | None

    @property
    def count(self) -> int:
        return self.grid[0] * self.grid[1]

    @property
    def stop(self) -> int:
        return self.start + self.count

    def describe(self) -> str:
        gh, gw = self.grid
        where = (f"after {self.prefix} prefix token(s)" if self.prefix is not None
                 else f"image tokens {self.start}:{self.stop}")
        return f"patch grid {gh}x{gw} ({self.count} patches, {where})"

    def document(self) -> dict[str, Any]:
        return {"grid": list(self.grid), "prefix_tokens": self.prefix, "image_tokens": [self.start, self.stop]}


def patch_layout(options: ImageOptions, lk: int, source: str,
                 picture_size: tuple[int, int] | None = None) -> PatchLayout:
    """Where the patches are among ``lk`` keys (see the module's docstring). The grid is ``--patch-grid``,
    or the picture's size divided by ``--patch-size``, or the square that fills the keys after the prefix
    (or the span). A grid that does not fit the keys is bad data (exit 1) naming the numbers; options
    that contradict each other are usage errors (exit 2)."""
    if options.image_tokens is not None and options.prefix_tokens is not None:
        raise UsageError(f"--prefix-tokens {options.prefix_tokens} and --image-tokens {options.image_tokens}: the "
                         "patches follow a prefix (a ViT) or lie in a span (a vision-language model); give one.")
    if options.patch_grid is not None and options.patch_size is not None:
        raise UsageError(f"--patch-grid {options.patch_grid} and --patch-size {options.patch_size}: give one (the "
                         "grid is the image's size divided by the patch size).")
    span = parse_span(options.image_tokens) if options.image_tokens is not None else None
    if span is not None and span[1] > lk:
        raise InputError(f"{source}: --image-tokens {span[0]}:{span[1]} reaches past the {lk} key positions "
                         f"(0..{lk - 1}).")
    prefix = None if span is not None else (1 if options.prefix_tokens is None else options.prefix_tokens)
    available = span[1] - span[0] if span is not None else lk - (prefix or 0)
    where = f"--image-tokens {span[0]}:{span[1]} hold {available}" if span is not None else \
        f"the keys are {lk} positions, {prefix} prefix token(s) leave {available}"
    if options.patch_grid is not None:
        grid = parse_grid(options.patch_grid)
        how = f"--patch-grid {grid[0]}x{grid[1]}"
    elif options.patch_size is not None:
        if picture_size is None:
            raise UsageError(f"--patch-size {options.patch_size}: the grid comes from the image's size; give "
                             "--image, or the grid with --patch-grid.")
        height, width = picture_size
        grid = (height // options.patch_size, width // options.patch_size)
        how = f"--patch-size {options.patch_size} on the image's {height} x {width} pixels"
        if min(grid) < 1:
            raise InputError(f"--image {options.image}: {height} x {width} pixels hold no patch of "
                             f"{options.patch_size} pixels.")
    else:
        side = math.isqrt(max(available, 0))
        if available < 1 or side * side != available:
            raise InputError(f"{source}: {where} for the patches, not a square grid; give it with --patch-grid "
                             "HxW (or --patch-size with --image).")
        grid, how = (side, side), "a square grid"
    n = grid[0] * grid[1]
    if n != available:
        raise InputError(f"{source}: {how} makes {n} patches, but {where}"
                         f"{'' if span is not None else ' (prefix + patches must equal the keys)'}.")
    return PatchLayout(grid, span[0] if span is not None else int(prefix or 0), prefix)


def query_position(query: str, lq: int, labels: list[str] | None) -> int:
    """``--query``: ``cls`` (position 0), a position (negative: from the end), or a token label (its first
    occurrence among ``labels``). Out of range, or a label not found, is a usage error."""
    text = query.strip()
    if text.lower() == "cls":
        return 0
    if re.fullmatch(r"-?\d{1,9}", text, re.ASCII):
        position = int(text)
        if not -lq <= position < lq:
            raise UsageError(f"--query {position}: the weights have {lq} query positions (0..{lq - 1}).")
        return position % lq
    if labels is None:
        raise UsageError(f"--query {query!r}: a token is found among the labels; give --labels (or a position).")
    if text in labels:
        return labels.index(text)
    if query in labels:
        return labels.index(query)
    raise UsageError(f"--query {query!r}: no such token among the {lq} query labels (give a position instead).")


def grid_maps(layer: np.ndarray, query: int, layout: PatchLayout) -> np.ndarray:
    """``layer [heads, Lq, Lk]``: the row ``query`` of each head over the patches, ``[heads, gh, gw]``
    (float64)."""
    rows = np.asarray(layer[:, query, layout.start:layout.stop], dtype=np.float64)
    return rows.reshape(rows.shape[0], *layout.grid)


def keep_mass(values: np.ndarray, share: float) -> np.ndarray:
    """DINO's thresholding (``visualize_attention.py``, ``--threshold``) over the last axis of ``values
    [..., n]``: sort ascending, divide by the sum, cumulative sum, keep what lies above ``1 - share``
    (then back in the original order). True marks the fewest entries holding ``share`` of the mass."""
    flat = np.asarray(values, dtype=np.float64)
    order = np.argsort(flat, axis=-1, kind="stable")
    val = np.take_along_axis(flat, order, axis=-1)
    sums = val.sum(axis=-1, keepdims=True)
    val = np.divide(val, sums, out=np.zeros_like(val), where=sums != 0)
    kept_sorted = np.cumsum(val, axis=-1) > (1 - share)
    kept = np.empty_like(kept_sorted)
    np.put_along_axis(kept, order, kept_sorted, axis=-1)
    return kept


def grid_keep_mass(maps: np.ndarray, share: float) -> np.ndarray:
    """``keep_mass`` of each grid of ``maps [..., gh, gw]`` (as a grid again)."""
    shape = maps.shape
    return keep_mass(maps.reshape(*shape[:-2], -1), share).reshape(shape)


def upsample(grid: np.ndarray, size: tuple[int, int], how: str = "nearest") -> np.ndarray:
    """``grid [..., gh, gw]`` at ``size`` (height, width) pixels: ``nearest`` (source cell ``floor(y gh /
    H)``, as torch's ``interpolate(mode="nearest")``) or ``bilinear`` (torch's ``align_corners=False``)."""
    values = np.asarray(grid, dtype=np.float64)
    out_h, out_w = size
    for axis, (n_in, n_out) in ((-2, (values.shape[-2], out_h)), (-1, (values.shape[-1], out_w))):
        if how == "nearest":
            index = np.minimum((np.arange(n_out) * (n_in / n_out)).astype(np.int64), n_in - 1)
            values = np.take(values, index, axis=axis)
        elif how == "bilinear":
            src = np.maximum((np.arange(n_out) + 0.5) * (n_in / n_out) - 0.5, 0.0)
            low = np.minimum(np.floor(src).astype(np.int64), n_in - 1)
            high = np.minimum(low + 1, n_in - 1)
            frac = src - low
            shape = [1] * values.ndim
            shape[axis] = n_out
            frac = frac.reshape(shape)
            values = np.take(values, low, axis=axis) * (1 - frac) + np.take(values, high, axis=axis) * frac
        else:
            raise ValueError(f"upsample must be nearest or bilinear, not {how!r}")
    return values


@dataclass
class Overlay:
    """The attention one query pays to the patches of one layer: ``maps [heads, gh, gw]`` (the heads
    ``heads``), their ``mean [gh, gw]`` (over those heads), and with ``--keep-mass`` the patches that
    hold that share (``kept`` per head, ``kept_mean``)."""

    layout: PatchLayout
    layer: int
    batch: int
    query: int
    query_label: str | None
    heads: list[int]
    maps: np.ndarray
    mean: np.ndarray
    keep_mass: float | None = None
    kept: np.ndarray | None = None
    kept_mean: np.ndarray | None = None

    def document(self) -> dict[str, Any]:
        doc: dict[str, Any] = {**self.layout.document(), "layer": self.layer, "batch": self.batch,
                               "query": self.query, "query_label": self.query_label, "heads": self.heads,
                               "maps": self.maps, "mean": self.mean}
        if self.keep_mass is not None:
            doc.update({"keep_mass": self.keep_mass, "kept": self.kept, "kept_mean": self.kept_mean})
        return doc


def overlay(layer_maps: np.ndarray, layout: PatchLayout, query: int, *, layer: int, batch: int, heads: list[int],
            labels: list[str] | None = None, share: float | None = None) -> Overlay:
    """The ``Overlay`` of ``layer_maps [heads, Lq, Lk]`` (one layer, one batch entry) for ``heads``."""
    maps = grid_maps(np.asarray(layer_maps)[heads], query, layout)
    mean = maps.mean(axis=0)
    result = Overlay(layout, layer, batch, query, None if labels is None else labels[query], list(heads), maps, mean)
    if share is not None:
        result.keep_mass = share
        result.kept, result.kept_mean = grid_keep_mass(maps, share), grid_keep_mass(mean, share)
    return result


@dataclass
class ImageInput:
    """What a run over saved weights read for ``--image`` and friends, checked against the weights:
    the picture (or None: the maps are drawn on their own), the patches' layout and the query."""

    options: ImageOptions
    layout: PatchLayout
    query: int
    picture: Any = None  # attnviz.imagefiles.Picture

    @property
    def size(self) -> tuple[int, int] | None:
        return None if self.picture is None else self.picture.size


def read_image_input(options: ImageOptions, shape: tuple[int, ...], source: str, labels: list[str] | None,
                     paths: list[Any]) -> ImageInput | None:
    """The image options of a run over weights ``[layers, batch, heads, Lq, Lk]`` read and checked (None
    when none asks for a picture); the picture's file is appended to ``paths``."""
    if not options.wanted:
        if options.keep_mass is not None:
            raise UsageError(f"--keep-mass {options.keep_mass:g}: it outlines patches of an image; give --image (or "
                             "--patch-grid, --image-tokens).")
        return None
    picture = None
    if options.image is not None:
        from attnviz.imagefiles import read_picture

        picture = read_picture(options.image)
        if picture.path is not None:
            paths.append(picture.path)
    lq, lk = shape[-2:]
    layout = patch_layout(options, lk, source, None if picture is None else picture.size)
    if picture is not None and options.patch_size is not None:  # the patches cover the top left (DINO crops)
        from dataclasses import replace

        height, width = (n * options.patch_size for n in layout.grid)
        picture = replace(picture, rgb=picture.rgb[:height, :width])
    return ImageInput(options, layout, query_position(options.query, lq, labels), picture)

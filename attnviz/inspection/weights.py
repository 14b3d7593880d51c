"""Weights a model saved, read into one layout: ``[layers, batch, heads, Lq, Lk]``.

By rank a file is read as ``[Lq, Lk]``, ``[heads, Lq, Lk]``, ``[batch, heads, Lq, Lk]`` or
``[layers, batch, heads, Lq, Lk]``; ``--layout`` names the axes otherwise (e.g. ``batch,q,k``). An
``.npz`` with one array per layer (as ``numpy.savez(f, *attentions)`` writes a Hugging Face
``output_attentions`` tuple: ``arr_0``, ``arr_1``, ...; or named keys, ordered naturally so that
``layer10`` follows ``layer9``) is stacked along the layer axis. NumPy only.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from attnviz.errors import InputError, ShapeError, UsageError, shape_str
from attnviz.formats import Container, is_glob, listing
from attnviz.io import StdinReader, open_spec, validate_array
from attnviz.sizes import memory_limit, size_str
from attnviz.storage import Place

if TYPE_CHECKING:
    from attnviz.capturefile import Capture
    from attnviz.inspection.generation import Generation

AXES = ("layer", "batch", "head", "q", "k")
ALIASES = {"l": "layer", "layers": "layer", "b": "batch", "h": "head", "heads": "head", "lq": "q", "query": "q",
           "t": "q", "lk": "k", "key": "k", "s": "k"}
CHUNK = 2**22  # values compared at a time (masks)
DEFAULT_LAYOUTS = {2: ("q", "k"), 3: ("head", "q", "k"), 4: ("batch", "head", "q", "k"),
                   5: ("layer", "batch", "head", "q", "k")}
#: what the maps of each ``--weigh-by`` are called (titles, table headings) and what their colour bar measures
WEIGHED = {"weights": ("attention weights", "weight"),
           "value-norms": ("value-norm-weighted attention", "alpha * ||v W_O||")}
#: what the statistics that assume a distribution (entropy, pattern masses, tags, detectors) are computed over,
#: for maps whose rows are not distributions (``Weights.renormalised``)
RENORMALISED = "each row renormalised to sum 1"


@dataclass
class Weights:
    """Attention weights in the layout ``[layers, batch, heads, Lq, Lk]``."""

    data: np.ndarray
    source: str
    layout: tuple[str, ...]  # the axes the file had, in its order
    file_shape: tuple[int, ...]
    paths: list[Place] = field(default_factory=list)
    keys: list[str] = field(default_factory=list)  # the .npz keys stacked as layers, if any
    #: the dtype the file stored the weights in (bfloat16 and float16 files are read as float32):
    #: how closely rows can sum to 1 depends on it
    stored_dtype: str = "float32"
    generation: Generation | None = None  # a generation dump stitched into these maps (--generation)
    capture: Capture | None = None  # a capture file (attnviz capture): its tokens and masks go with the weights
    kind: str | None = None  # which of its kinds of attention (layers; encoder, decoder, cross)
    container: Any = None  # the capture file, opened
    weighed: str = "weights"  # --weigh-by: value-norms when the maps are alpha * ||v W_O|| (inspection.norms)
    pieces_shape: tuple[int, ...] | None = None  # --merge-subwords: the shape over sub-word pieces, before merging

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.data.shape)

    @property
    def what(self) -> str:
        """What the maps are, as titles say it: "attention weights", "value-norm-weighted attention"."""
        return WEIGHED[self.weighed][0]

    @property
    def renormalised(self) -> bool:
        """The rows are not distributions by design (value norms): statistics are of each row renormalised to
        sum 1 (``RENORMALISED``)."""
        return self.weighed != "weights"

    @property
    def unit(self) -> str:
        """What a colour bar of these maps measures: "weight", "alpha * ||v W_O||"."""
        return WEIGHED[self.weighed][1]

    def read_as(self, axes: str = "[layers, batch, heads, Lq, Lk]") -> str:
        """How the file was read, for the information line: ``FILE [shape] read as AXES = [shape]`` (stitched,
        and merged into words, in that order)."""
        read = self.shape if self.pieces_shape is None else self.pieces_shape
        merged = "" if self.pieces_shape is None else f", then merged into words: {shape_str(self.shape)}"
        if self.generation is not None:
            g = self.generation
            return (f"{self.source}: a generation of {g.steps} steps x {g.layers} layers ({g.kind}-attention, "
                    f"{g.prompt} prompt rows) stitched into {axes} = {shape_str(read)}{merged}")
        weighed = ", weighed by value norms (alpha * ||v W_O||)" if self.weighed == "value-norms" else ""
        return f"{self.source} {shape_str(self.file_shape)} read as {axes} = {shape_str(read)}{merged}{weighed}"


def parse_layout(text: str | None, rank: int, source: str) -> tuple[str, ...]:
    if text is None:
        if rank not in DEFAULT_LAYOUTS:
            raise ShapeError(f"{source}: {rank} dimensions; attention weights have 2 to 5 ([layers, batch, heads, "
                             "Lq, Lk]); name them with --layout.")
        return DEFAULT_LAYOUTS[rank]
    names = tuple(ALIASES.get(t.strip().lower(), t.strip().lower()) for t in text.split(",") if t.strip())
    unknown = [n for n in names if n not in AXES]
    if unknown or len(set(names)) != len(names) or names[-2:] != ("q", "k"):
        raise UsageError(f"--layout {text!r}: name each axis once from layer, batch, head, q, k, ending with q,k.")
    if len(names) != rank:
        raise UsageError(f"--layout {text!r} names {len(names)} axes, but {source} has {rank}.")
    return names


def to_standard(arr: np.ndarray, layout: tuple[str, ...]) -> np.ndarray:
    """Reorder and pad ``arr`` (axes named by ``layout``) to ``[layer, batch, head, q, k]``."""
    order = [layout.index(a) for a in AXES if a in layout]
    arr = np.transpose(arr, order)
    present = [a for a in AXES if a in layout]
    shape = [arr.shape[present.index(a)] if a in present else 1 for a in AXES]
    return arr.reshape(shape)


def load_weights(spec: str, layout: str | None = None, stdin: StdinReader | None = None,
                 generation: bool = False, generation_option: str = "--generation") -> Weights:
    """Read attention weights from a file (any rank), a file of one array per layer (.npz, .safetensors,
    HDF5, torch.save; named keys in natural order), or the matches of a key glob (``FILE:blocks.*.attn``),
    stacked as layers; with ``generation``, a generation dump stitched into one map per layer
    (``attnviz.inspection.generation``). ``generation_option``: the option messages name for that."""
    if generation:
        from attnviz.inspection.generation import check_layout, load_generation

        check_layout(layout)
        data, source, held, keys, path = load_generation(spec, stdin)
        return Weights(data, source, AXES, tuple(data.shape), [path] if path else [], keys, "float32", held)
    opened = open_spec(spec, stdin)
    if isinstance(opened.raw, Container) and not opened.raw.keys:  # numpy.savez(f, *()) of an SDPA model's
        from attnviz.errors import no_weights

        raise InputError(no_weights(f"{opened.source} holds no arrays"))
    captured = _captured(opened, layout)
    if captured is not None:
        return captured
    keys = opened.layer_keys()
    source = opened.source
    if keys:
        if opened.key is not None:
            source = f"{opened.source}:{opened.key}"
        arrays = [opened.raw.get(k) for k in keys]
        shapes = {tuple(a.shape) for a in arrays}
        if len(shapes) != 1:
            from attnviz.inspection.generation import looks_generated

            listed = listing([f"{k} {shape_str(a.shape)}" for k, a in zip(keys, arrays)])
            if looks_generated(keys):
                raise ShapeError(f"{source}: generate()'s attentions, keys STEP.LAYER whose maps grow a step at a "
                                 f"time ({listed}); read them with {generation_option}, which stitches them into "
                                 "one map per layer.")
            raise ShapeError(f"{source}: the layers have different shapes ({listed}); inspect one with "
                             f"{opened.source}:KEY.")
        for k, a in zip(keys, arrays):
            validate_array(a, f"{opened.source}:{k}", allow_nonfinite=True)
        stacked = sum(a.size for a in arrays) * np.result_type(*arrays).itemsize
        if stacked > memory_limit():  # the layers are stacked in memory, even when each is memory-mapped
            raise InputError(f"{source}: the {len(keys)} layers stacked would take {size_str(stacked)} in memory, "
                             f"more than the {size_str(memory_limit())} attnviz allows (half the memory "
                             f"available); inspect fewer with {opened.source}:KEY or a narrower pattern, or save "
                             "them as one [layers, ...] .npy, which stays on disk.")
        arr = np.stack(arrays)
        stored = coarsest([opened.raw.stored.get(k, a.dtype.name) for k, a in zip(keys, arrays)])
        per_layer = parse_layout(layout, arr.ndim - 1, source)
        names: tuple[str, ...] = ("layer", *per_layer)
        if "layer" in per_layer:
            raise UsageError(f"--layout: the layers of {source} are its arrays; name the axes of one array.")
    else:
        loaded = opened.array(allow_nonfinite=True)
        arr = loaded.data
        stored = loaded.stored_dtype or arr.dtype.name
        names = parse_layout(layout, arr.ndim, source)
    if arr.shape[-1] == 0 or arr.shape[-2] == 0:
        raise InputError(f"{source}: empty attention maps (shape {shape_str(arr.shape)}).")
    data = to_standard(arr.astype(np.float32, copy=False) if arr.dtype.kind != "f" else arr, names)
    return Weights(data, source, names, tuple(arr.shape), [opened.path] if opened.path else [], keys, stored)


def _captured(opened: Any, layout: str | None) -> Weights | None:
    """The weights of a capture file (``attnviz capture``), every site of one kind stacked as layers; None
    for any other file, or when the spec names an array of the capture (``run.safetensors:layers.3.q``)."""
    from attnviz.capturefile import as_capture
    from attnviz.formats import Container

    if not isinstance(opened.raw, Container):
        return None
    capture = as_capture(opened.raw)
    if capture is None or (opened.key is not None and (opened.raw.has(opened.key) or is_glob(opened.key))):
        return None
    if layout is not None:
        raise UsageError(f"--layout: {opened.source} is a capture, read as [layers, batch, heads, Lq, Lk]; drop it.")
    kind = capture.choose_kind(opened.key)
    sites = capture.sites(kind)
    missing = [s for s in sites if not capture.has(s, "weights")]
    if missing and isinstance(capture.metadata.get("summary"), dict):
        raise UsageError(f"{opened.source}: a summary capture (attnviz capture --summary) holds each site's summary, "
                         "not its weights: attnviz inspect and view read it; this needs every weight (capture without "
                         "--summary: fewer tokens, or --layers).")
    if missing:
        raise InputError(f"{opened.source}: the capture holds no attention weights for {missing[0]} (captured with "
                         "q, k and v only); capture again without --no-weights.")
    # half precision (--weights-dtype) of a large capture: widened into a temporary file, mapped as float32 is
    data = _widened(opened.raw, [f"{s}.weights" for s in sites])
    arrays = [] if data is not None else [opened.raw.get(f"{s}.weights") for s in sites]
    shapes = {tuple(a.shape) for a in arrays}
    if len(shapes) > 1:
        raise ShapeError(f"{opened.source}: the {kind} sites have different shapes; inspect one with "
                         f"{opened.source}:{sites[0]}.weights.")
    if data is None:  # the sites as one [layers, ...] array on disk, read as it is used
        data = stacked_view(arrays, np.float32)
    if data is None:
        stacked = sum(a.size for a in arrays) * 4
        if stacked > memory_limit():
            raise InputError(f"{opened.source}: the {len(sites)} sites stacked would take {size_str(stacked)} in "
                             f"memory, more than the {size_str(memory_limit())} attnviz allows; inspect one site with "
                             f"{opened.source}:{sites[0]}.weights, or capture fewer layers (--layers).")
        data = np.stack([a.astype(np.float32, copy=False) for a in arrays])
    # a model that runs in bfloat16 computes its weights in bfloat16 (stored widened): its rows sum to 1 as
    # closely as bfloat16 allows, and the checks' tolerances follow
    computed = [str(capture.metadata.get("dtype"))] if capture.metadata.get("dtype") in ROUNDOFF else []
    stored = coarsest([opened.raw.stored.get(f"{s}.weights", "float32") for s in sites] + computed)
    source = opened.source if opened.key is None else f"{opened.source}:{opened.key}"
    return Weights(data, source, AXES, tuple(data.shape), [opened.path] if opened.path else [],
                   [f"{s}.weights" for s in sites], stored, capture=capture, kind=kind, container=opened.raw)


#: bytes: half-precision weights that would take more than this as float32 are widened into a temporary file
#: (``_widened``), not into memory
WIDEN_TO_DISK = 256 * 2**20


def _widened(raw: Any, keys: list[str]) -> np.ndarray | None:
    """The half-precision arrays ``keys`` of a capture file as one float32 array ``[len(keys), ...]`` mapped from
    a temporary file (unlinked at once: it goes when the array does), filled a block at a time: a large capture
    saved with --weights-dtype float16 or bfloat16 is read in bounded memory. None where the arrays are not
    half precision, are smaller than ``WIDEN_TO_DISK`` as float32, cannot be mapped, differ in shape, or the
    temporary folder lacks the room (they are then read into memory)."""
    import shutil
    import tempfile

    from attnviz.io import release_pages

    mapped = getattr(raw, "mapped", None)
    if mapped is None:
        return None
    arrays = [mapped(k) for k in keys]
    if any(a is None or a.itemsize != 2 or a.shape != arrays[0].shape for a in arrays):
        return None
    size = sum(a.size for a in arrays) * 4
    folder = tempfile.gettempdir()
    if size <= WIDEN_TO_DISK or shutil.disk_usage(folder).free < size + 2**30:
        return None
    with tempfile.TemporaryFile(dir=folder, prefix="attnviz-") as fh:  # the map keeps the file while it lives
        out = np.memmap(fh, dtype=np.float32, mode="w+", shape=(len(arrays), *arrays[0].shape))
    for li in range(len(arrays)):
        source, arrays[li] = arrays[li].reshape(-1), None  # (each site's map goes once it is read)
        raw.stored[keys[li]] = source.dtype.name  # (tolerances follow the dtype stored)
        target = out[li].reshape(-1)
        for start in range(0, source.size, CHUNK):
            target[start:start + CHUNK] = source[start:start + CHUNK]
            release_pages(out)
            release_pages(source)
        del source
    out.flags.writeable = False
    return out


def _mapping(a: np.ndarray) -> tuple[Any, int] | None:
    """The memory map ``a`` reads (an ``numpy.memmap`` of a file) and where ``a`` starts in that file; None
    when ``a`` is not a C-ordered view of a mapped file."""
    import mmap

    base: Any = a
    while base is not None and not (isinstance(base, np.memmap) and isinstance(base.base, mmap.mmap)):
        base = getattr(base, "base", None)
    if base is None or getattr(base, "filename", None) is None or not a.flags.c_contiguous:
        return None
    return base, int(base.offset) + (a.__array_interface__["data"][0] - base.__array_interface__["data"][0])


def stacked_view(arrays: list[np.ndarray], dtype: Any) -> np.ndarray | None:
    """``numpy.stack(arrays)`` without a copy: one array ``[len(arrays), ...]`` over the file that holds them,
    when each is a memory-mapped ``dtype`` array of one shape and they lie at equal distances in one file (a
    capture's sites, each written as the model ran); None otherwise. Read a block at a time, a file larger
    than memory stays on disk (``attnviz.io.release_pages`` lets go of the pages read)."""
    if not arrays or any(a.dtype != np.dtype(dtype) or a.shape != arrays[0].shape for a in arrays):
        return None
    found = [_mapping(a) for a in arrays]
    if any(f is None for f in found):
        return None
    places = [f for f in found if f is not None]
    files = {str(base.filename) for base, _ in places}
    starts = [start for _, start in places]
    step = starts[1] - starts[0] if len(starts) > 1 else 0
    if len(files) != 1 or any(b - a != step for a, b in zip(starts, starts[1:])) or step < 0 or (
            len(starts) > 1 and step < arrays[0].nbytes) or step % np.dtype(dtype).itemsize:
        return None
    first = arrays[0]
    span = step * (len(arrays) - 1) + first.nbytes
    if span == 0:
        return np.stack(arrays)
    whole = np.memmap(files.pop(), dtype=np.uint8, mode="r", offset=starts[0], shape=(span,))
    return np.ndarray((len(arrays), *first.shape), dtype=first.dtype, buffer=whole,
                      strides=(step, *first.strides))


def capture_mask(w: Weights) -> np.ndarray | None:
    """The keep mask a capture recorded with its weights, ``[layers or 1, batch, 1, Lq, Lk]`` (one for all
    layers where every site has the same)."""
    if w.capture is None or w.kind is None:
        return None
    from attnviz.capturefile import site_keep

    sites = w.capture.sites(w.kind)
    # as the file holds them (a dense mask: bool, memory-mapped, not copied; or built from its parts), one for all
    # when every site has the same
    found = [site_keep(w.container, w.capture, s) for s in sites]
    masks = [m for m in found if m is not None]
    if len(masks) != len(sites) or not masks:
        return None
    if all(_same(m, masks[0]) for m in masks[1:]):
        masks = masks[:1]
    keep = stacked_view(masks, bool)
    if keep is None:
        keep = np.stack(masks)
    return keep.reshape(keep.shape[0], keep.shape[1], 1, *keep.shape[-2:])


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    """``numpy.array_equal``, a block of rows at a time (two mapped masks of a long capture stay on disk)."""
    from attnviz.io import release_pages

    if a.shape != b.shape:
        return False
    flat_a, flat_b = a.reshape(-1), b.reshape(-1)  # (views of C-ordered files)
    for start in range(0, flat_a.size, CHUNK):
        if not np.array_equal(flat_a[start:start + CHUNK], flat_b[start:start + CHUNK]):
            return False
        release_pages(a)
        release_pages(b)
    return True


def capture_labels(w: Weights) -> tuple[list[list[str]] | None, list[list[str]] | None]:
    """The tokens of a capture for the queries and the keys, one list per batch entry (None where the
    file has none, or they do not fit the maps)."""
    if w.capture is None or w.kind is None:
        return None, None
    lq, lk = w.shape[-2:]
    batches = w.shape[1]

    def fitting(rows: list[list[str]] | None, n: int) -> list[list[str]] | None:
        if not rows or len(rows) not in (1, batches) or any(len(r) != n for r in rows):
            return None
        return [list(r) for r in rows]

    return fitting(w.capture.tokens(w.kind), lq), fitting(w.capture.key_tokens(w.kind), lk)


def standard_mask(w: Weights, keep: np.ndarray, source: str) -> np.ndarray:
    """A keep mask given in the file's layout (broadcasting against one map, one layer's arrays, or
    the whole file) in the standard layout ``[layers, batch, heads, Lq, Lk]``, kept as small as it
    came (its size-1 axes stay size 1; ``numpy.broadcast_to`` widens it where needed)."""
    from attnviz.masks import check_broadcast

    shape = w.file_shape[1:] if w.keys else w.file_shape
    layout = w.layout[1:] if w.keys else w.layout
    check_broadcast(keep, shape, source)
    return to_standard(keep.reshape((1,) * (len(shape) - keep.ndim) + keep.shape), layout)


#: the unit roundoff of each storage dtype (half an ulp at 1): rows of n weights rounded to it sum to 1
#: within this (times the sum, which is 1) however long they are
ROUNDOFF = {"float64": 2.0**-53, "float32": 2.0**-24, "float16": 2.0**-11, "bfloat16": 2.0**-8,
            "float8_e4m3fn": 2.0**-4, "float8_e5m2": 2.0**-3}


def coarsest(dtypes: list[str]) -> str:
    """The storage dtype with the largest roundoff among ``dtypes`` (integers count as float32)."""
    return max(dtypes, key=lambda d: ROUNDOFF.get(d, ROUNDOFF["float32"]), default="float32")

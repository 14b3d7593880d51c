"""Inspecting attention weights a model saved: reading them into one layout, what each head does,
checks for CI, and comparing two sets of weights. NumPy only (no TensorFlow on this path).

Weights are held as ``[layers, batch, heads, Lq, Lk]``. By rank a file is read as ``[Lq, Lk]``,
``[heads, Lq, Lk]``, ``[batch, heads, Lq, Lk]`` or ``[layers, batch, heads, Lq, Lk]``; ``--layout``
names the axes otherwise (e.g. ``batch,q,k``). An ``.npz`` with one array per layer (as
``numpy.savez(f, *attentions)`` writes a Hugging Face ``output_attentions`` tuple: ``arr_0``,
``arr_1``, ...; or named keys, ordered naturally so that ``layer10`` follows ``layer9``) is stacked
along the layer axis.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from attnviz.errors import InputError, ShapeError, UsageError, shape_str
from attnviz.formats import listing
from attnviz.formats import natural_key as natural_key  # moved to attnviz.formats; importable from here
from attnviz.io import StdinReader, open_spec, release_pages, validate_array

AXES = ("layer", "batch", "head", "q", "k")
ALIASES = {"l": "layer", "layers": "layer", "b": "batch", "h": "head", "heads": "head", "lq": "q", "query": "q",
           "t": "q", "lk": "k", "key": "k", "s": "k"}
DEFAULT_LAYOUTS = {2: ("q", "k"), 3: ("head", "q", "k"), 4: ("batch", "head", "q", "k"),
                   5: ("layer", "batch", "head", "q", "k")}


@dataclass
class Weights:
    """Attention weights in the layout ``[layers, batch, heads, Lq, Lk]``."""

    data: np.ndarray
    source: str
    layout: tuple[str, ...]  # the axes the file had, in its order
    file_shape: tuple[int, ...]
    paths: list[Path] = field(default_factory=list)
    keys: list[str] = field(default_factory=list)  # the .npz keys stacked as layers, if any

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.data.shape)


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


def load_weights(spec: str, layout: str | None = None, stdin: StdinReader | None = None) -> Weights:
    """Read attention weights from a file (any rank), a file of one array per layer (.npz, .safetensors,
    HDF5, torch.save; named keys in natural order), or the matches of a key glob (``FILE:blocks.*.attn``),
    stacked as layers."""
    opened = open_spec(spec, stdin)
    keys = opened.layer_keys()
    source = opened.source
    if keys:
        if opened.key is not None:
            source = f"{opened.source}:{opened.key}"
        arrays = [opened.raw.get(k) for k in keys]
        shapes = {tuple(a.shape) for a in arrays}
        if len(shapes) != 1:
            listed = listing([f"{k} {shape_str(a.shape)}" for k, a in zip(keys, arrays)])
            raise ShapeError(f"{source}: the layers have different shapes ({listed}); inspect one with "
                             f"{opened.source}:KEY.")
        for k, a in zip(keys, arrays):
            validate_array(a, f"{opened.source}:{k}", allow_nonfinite=True)
        arr = np.stack(arrays)
        per_layer = parse_layout(layout, arr.ndim - 1, source)
        names: tuple[str, ...] = ("layer", *per_layer)
        if "layer" in per_layer:
            raise UsageError(f"--layout: the layers of {source} are its arrays; name the axes of one array.")
    else:
        arr = opened.array(allow_nonfinite=True).data
        names = parse_layout(layout, arr.ndim, source)
    if arr.shape[-1] == 0 or arr.shape[-2] == 0:
        raise InputError(f"{source}: empty attention maps (shape {shape_str(arr.shape)}).")
    data = to_standard(arr.astype(np.float32, copy=False) if arr.dtype.kind != "f" else arr, names)
    return Weights(data, source, names, tuple(arr.shape), [opened.path] if opened.path else [], keys)


def standard_mask(w: Weights, keep: np.ndarray, source: str) -> np.ndarray:
    """A keep mask given in the file's layout (broadcasting against one map, one layer's arrays, or
    the whole file) in the standard layout ``[layers, batch, heads, Lq, Lk]``."""
    from attnviz.masks import check_broadcast

    shape = w.file_shape[1:] if w.keys else w.file_shape
    layout = w.layout[1:] if w.keys else w.layout
    check_broadcast(keep, shape, source)
    return to_standard(np.broadcast_to(keep, shape), layout)


# ---------------------------------------------------------------------------------------------------
# What the heads do

HEAD_STATS = ("entropy", "entropy_norm", "distance", "diagonal", "previous", "first", "last", "max")
TAG_THRESHOLD = 0.5  # a pattern "dominates" when it takes at least half the mass on average
BROAD_THRESHOLD = 0.9  # normalised entropy at or above this: the head spreads its attention


CHUNK = 2**22  # values handled at a time on large inputs (32 MiB in float64)


def row_blocks(w: np.ndarray, chunk: int = CHUNK) -> Iterator[tuple[tuple[int, ...], int, int, np.ndarray]]:
    """((layer, batch, head), first row, end row, float64 block) over ``w [L, B, H, Lq, Lk]`` in pieces
    of about ``chunk`` values: a memory-mapped file is read a block at a time."""
    lq, lk = w.shape[-2:]
    rows = max(1, chunk // max(lk, 1))
    for idx in np.ndindex(*w.shape[:-2]):
        for start in range(0, lq, rows):
            stop = min(start + rows, lq)
            yield idx, start, stop, np.asarray(w[idx][start:stop], dtype=np.float64)
            release_pages(w)


def is_causal(w: np.ndarray, chunk: int = CHUNK) -> bool:
    """Nothing above the diagonal (top-left aligned), anywhere."""
    lk = w.shape[-1]
    for _, start, stop, block in row_blocks(w, chunk):
        above = np.arange(lk)[None, :] > np.arange(start, stop)[:, None]
        if np.any(block[above]):
            return False
    return True


def head_statistics(w: np.ndarray, keep: np.ndarray | None = None, chunk: int = CHUNK) -> dict[str, np.ndarray]:
    """Per (layer, head) means over batch and query rows of ``w [L, B, H, Lq, Lk]``:

    * ``entropy`` (nats) and ``entropy_norm`` (divided by log of the keys a row may attend to: the
      ``keep`` mask's count; without one, i + 1 when the weights are causal, else Lk; rows with a
      single key to attend are left out of this mean);
    * ``distance``: mean attention distance, sum_j w_ij |i - j|;
    * ``diagonal``, ``previous`` (j = i - 1, rows i >= 1), ``first`` (j = 0, rows i >= 1, the attention
      sink), ``last`` (j = Lk - 1): mean weight on those keys; ``max``: mean of each row's largest weight.

    Returns arrays ``[L, H]`` plus ``tag`` (an object array of short descriptions). Inputs larger
    than ``chunk`` values are summarised a block of rows at a time (``head_statistics_blocked``).
    """
    if w.size > chunk:
        return head_statistics_blocked(w, keep, chunk)
    w = np.asarray(w, dtype=np.float64)
    lq, lk = w.shape[-2:]
    i = np.arange(lq)[:, None]
    j = np.arange(lk)[None, :]
    if keep is not None:
        n = np.broadcast_to(keep, w.shape).sum(axis=-1)
    elif is_causal(w):
        n = np.broadcast_to(np.minimum(np.arange(lq) + 1, lk), w.shape[:-1])
    else:
        n = np.full(w.shape[:-1], lk)
    with np.errstate(divide="ignore", invalid="ignore"):
        h = 0.0 - np.where(w > 0, w * np.log(np.where(w > 0, w, 1.0)), 0.0).sum(axis=-1)
        h_norm = np.where(n > 1, h / np.log(np.maximum(n, 2)), np.nan)  # undefined with one key to attend

    def rows_mean(x: np.ndarray) -> np.ndarray:  # over batch entries and query rows
        return x.mean(axis=(1, 3))

    with np.errstate(invalid="ignore"):
        defined = (~np.isnan(h_norm)).sum(axis=(1, 3))
        entropy_norm = np.where(defined > 0, np.nansum(h_norm, axis=(1, 3)) / np.maximum(defined, 1), 0.0)
    stats = {
        "entropy": rows_mean(h),
        "entropy_norm": entropy_norm,
        "distance": rows_mean((w * np.abs(i - j)).sum(axis=-1)),
        "max": rows_mean(w.max(axis=-1)),
        "last": rows_mean(w[..., :, lk - 1]),
    }
    d = min(lq, lk)
    stats["diagonal"] = w[..., np.arange(d), np.arange(d)].mean(axis=(1, 3)) * d / lq
    if lq > 1:
        rows = np.arange(1, lq)
        prev = w[..., rows, np.minimum(rows - 1, lk - 1)] * (rows - 1 < lk)
        stats["previous"] = prev.mean(axis=(1, 3))
        stats["first"] = w[..., 1:, 0].mean(axis=(1, 3))
    else:
        stats["previous"] = np.zeros(w.shape[:1] + w.shape[2:3])
        stats["first"] = w[..., :, 0].mean(axis=(1, 3))
    stats["tag"] = head_tags(stats)
    return stats


def head_statistics_blocked(w: np.ndarray, keep: np.ndarray | None, chunk: int = CHUNK) -> dict[str, np.ndarray]:
    """``head_statistics`` a block of rows at a time: the same sums, in bounded memory."""
    layers, batches, heads, lq, lk = w.shape
    causal = keep is None and is_causal(w, chunk)
    names = ("entropy", "distance", "max", "last", "diagonal", "previous", "first")
    sums = {n: np.zeros((layers, heads)) for n in names}
    norm_sum, norm_count = np.zeros((layers, heads)), np.zeros((layers, heads))
    full_keep = None if keep is None else np.broadcast_to(keep, w.shape)
    j = np.arange(lk)
    for (li, bi, hi), start, stop, block in row_blocks(w, chunk):
        i = np.arange(start, stop)
        if full_keep is not None:
            n = full_keep[li, bi, hi, start:stop].sum(axis=-1)
        elif causal:
            n = np.minimum(i + 1, lk)
        else:
            n = np.full(stop - start, lk)
        logs = np.log(block, out=np.zeros_like(block), where=block > 0)
        h = 0.0 - np.einsum("ij,ij->i", block, logs)
        defined = n > 1
        norm_sum[li, hi] += (h[defined] / np.log(n[defined])).sum()
        norm_count[li, hi] += defined.sum()
        sums["entropy"][li, hi] += h.sum()
        sums["distance"][li, hi] += np.einsum("ij,ij->", block, np.abs(i[:, None] - j[None, :]))
        sums["max"][li, hi] += block.max(axis=-1).sum()
        sums["last"][li, hi] += block[:, lk - 1].sum()
        diagonal = i < lk
        sums["diagonal"][li, hi] += block[diagonal, i[diagonal]].sum()
        later = (i >= 1) & (i - 1 < lk)
        sums["previous"][li, hi] += block[later, i[later] - 1].sum()
        sums["first"][li, hi] += block[i >= 1, 0].sum()
    rows = batches * lq
    later_rows = batches * (lq - 1) if lq > 1 else rows
    stats = {n: sums[n] / (later_rows if n in ("previous", "first") and lq > 1 else rows) for n in names}
    if lq == 1:
        stats["previous"] = np.zeros((layers, heads))
    stats["entropy_norm"] = np.where(norm_count > 0, norm_sum / np.maximum(norm_count, 1), 0.0)
    stats["tag"] = head_tags(stats)
    return stats


def head_tags(stats: dict[str, np.ndarray]) -> np.ndarray:
    """A short description where one pattern dominates: previous-token, first-token sink, diagonal,
    last-token; broad for near-uniform heads; empty otherwise."""
    names = {"previous": "previous-token", "first": "first-token sink", "diagonal": "diagonal",
             "last": "last-token"}
    shape = stats["entropy"].shape
    tags = np.empty(shape, dtype=object)
    for idx in np.ndindex(*shape):
        best = max(names, key=lambda k: stats[k][idx])
        if stats[best][idx] >= TAG_THRESHOLD:
            tags[idx] = names[best]
        elif stats["entropy_norm"][idx] >= BROAD_THRESHOLD:
            tags[idx] = "broad"
        else:
            tags[idx] = ""
    return tags


# ---------------------------------------------------------------------------------------------------
# Checks (exit 3 when one fails)


@dataclass
class CheckResult:
    name: str
    passed: bool
    failures: int = 0  # rows or entries that fail
    worst: str = ""  # where and how much, for a person
    detail: dict[str, object] = field(default_factory=dict)  # the same for JSON

    def line(self) -> str:
        if self.passed:
            return f"{self.name}: passed"
        return f"{self.name}: FAILED, {self.failures} {self.detail.get('unit', 'entries')}; worst: {self.worst}"


def locate(index: Sequence[Any], names: Sequence[str] = ("layer", "batch", "head", "row", "column")) -> str:
    return ", ".join(f"{n} {int(i)}" for n, i in zip(names, index))


def check_finite(w: np.ndarray, chunk: int = CHUNK) -> CheckResult:
    count, first = 0, None
    for idx, start, _, block in row_blocks(w, chunk):
        bad = ~np.isfinite(block)
        if bad.any():
            count += int(bad.sum())
            if first is None:
                r, c = np.unravel_index(int(np.argmax(bad)), bad.shape)
                first = (*idx, start + int(r), int(c))
    if first is None:
        return CheckResult("check-finite", True)
    return CheckResult("check-finite", False, count, f"{locate(first)} is {w[first]}",
                       {"unit": "entries", "index": list(first)})


def all_finite(w: np.ndarray, chunk: int = CHUNK) -> bool:
    return all(np.isfinite(block).all() for _, _, _, block in row_blocks(w, chunk))


def check_rows(w: np.ndarray, atol: float, keep: np.ndarray | None = None) -> CheckResult:
    """Every row that may attend somewhere sums to 1 within ``atol``."""
    sums = np.zeros(w.shape[:-1])
    for idx, start, stop, block in row_blocks(w):
        sums[idx][start:stop] = block.sum(axis=-1)
    live = np.ones(sums.shape, bool) if keep is None else np.broadcast_to(keep, w.shape).any(axis=-1)
    off = np.where(live, np.abs(sums - 1.0), 0.0)
    off = np.where(np.isnan(off), np.inf, off)
    bad = off > atol
    if not bad.any():
        return CheckResult("check-rows", True, detail={"atol": atol})
    worst = np.unravel_index(int(np.argmax(off)), off.shape)
    return CheckResult("check-rows", False, int(bad.sum()),
                       f"{locate(worst)} sums to {sums[worst]:.6g} (atol {atol:g})",
                       {"unit": "rows", "index": [int(i) for i in worst], "sum": float(sums[worst]), "atol": atol})


def check_masked(w: np.ndarray, keep: np.ndarray, atol: float, name: str, chunk: int = CHUNK) -> CheckResult:
    """No weight above ``atol`` where ``keep`` is False."""
    full_keep = np.broadcast_to(keep, w.shape)
    count, worst, worst_value = 0, None, -1.0
    for idx, start, stop, block in row_blocks(w, chunk):
        leak = np.where(~full_keep[idx][start:stop], np.abs(np.nan_to_num(block, nan=np.inf)), 0.0)
        bad = leak > atol
        if bad.any():
            count += int(bad.sum())
            r, c = np.unravel_index(int(np.argmax(leak)), leak.shape)
            if leak[r, c] > worst_value:
                worst, worst_value = (*idx, start + int(r), int(c)), float(leak[r, c])
    if worst is None:
        return CheckResult(name, True, detail={"atol": atol})
    return CheckResult(name, False, count, f"{locate(worst)} has weight {w[worst]:.6g} on a masked position",
                       {"unit": "entries", "index": [int(i) for i in worst], "weight": float(w[worst]), "atol": atol})


# ---------------------------------------------------------------------------------------------------
# Comparing two sets of weights


def js_divergence(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """Jensen-Shannon divergence of each row in nats (0 to log 2), rows taken as given."""
    p = np.asarray(p, dtype=np.float64)
    q = np.asarray(q, dtype=np.float64)
    m = (p + q) / 2

    def kl(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(a > 0, a * np.log(np.where(a > 0, a, 1.0) / np.where(b > 0, b, 1.0)), 0.0).sum(axis=-1)

    return np.clip((kl(p, m) + kl(q, m)) / 2, 0.0, None)


@dataclass
class Comparison:
    diff: np.ndarray  # a - b
    max_abs: float
    mean_abs: float
    js: np.ndarray  # per row [L, B, H, Lq]
    argmax_agree: float  # fraction of rows whose argmax is the same
    worst_rows: list[dict[str, object]]


def compare(a: np.ndarray, b: np.ndarray, worst: int = 5) -> Comparison:
    a64 = np.asarray(a, dtype=np.float64)
    b64 = np.asarray(b, dtype=np.float64)
    diff = a64 - b64
    absd = np.abs(diff)
    js = js_divergence(a64, b64)
    agree = np.argmax(a64, axis=-1) == np.argmax(b64, axis=-1)
    row_max = absd.max(axis=-1)
    order = np.argsort(-js, axis=None, kind="stable")[:worst]
    rows = []
    for flat in order:
        idx = np.unravel_index(int(flat), js.shape)
        rows.append({"index": [int(i) for i in idx], "where": locate(idx), "js": float(js[idx]),
                     "max_abs": float(row_max[idx]), "argmax_a": int(np.argmax(a64[idx])),
                     "argmax_b": int(np.argmax(b64[idx]))})
    return Comparison(diff, float(absd.max()), float(absd.mean()), js, float(agree.mean()), rows)


def tolerance_check(a: np.ndarray, b: np.ndarray, atol: float, rtol: float) -> CheckResult:
    """``|a - b| <= atol + rtol |b|`` everywhere (numpy.allclose's rule)."""
    a64 = np.asarray(a, dtype=np.float64)
    b64 = np.asarray(b, dtype=np.float64)
    excess = np.abs(a64 - b64) - (atol + rtol * np.abs(b64))
    bad = excess > 0
    if not bad.any():
        return CheckResult("tolerance", True, detail={"atol": atol, "rtol": rtol})
    worst = np.unravel_index(int(np.argmax(excess)), excess.shape)
    return CheckResult("tolerance", False, int(bad.sum()),
                       f"{locate(worst)}: {a64[worst]:.6g} vs {b64[worst]:.6g} (atol {atol:g}, rtol {rtol:g})",
                       {"unit": "entries", "index": [int(i) for i in worst], "a": float(a64[worst]),
                        "b": float(b64[worst]), "atol": atol, "rtol": rtol})

"""Attention rollout (Abnar & Zuidema 2020, "Quantifying Attention Flow in Transformers", section 3).

Each layer's heads are combined into one map ``A`` (mean, as in the paper, or max or min), with
``discard_ratio`` its lowest entries are zeroed but the CLS token's own (jacobgil/vit-explain), the residual
connection is added as ``A' = (1 - r) A + r I`` (the paper's ``0.5 W_att + 0.5 I`` is ``r = 0.5``),
each row of ``A'`` is renormalised to sum to 1, and the maps are multiplied from the first layer up:
``R_s = A'_s``, ``R_l = A'_l R_{l-1}``. Row ``i`` of ``R_l`` says how much of position ``i``'s
representation after layer ``l`` comes from each input token, if attention alone mixed tokens and
the residual stream carried a share ``r`` through every layer. It is a model of information flow
built from the attention weights only: not a gradient attribution, blind to the value vectors, the
MLPs and layer norms. NumPy only; weights in the standard layout ``[layers, batch, heads, Lq, Lk]``.

For a ViT (``--image``) the result is vit-explain's mask: the query's row (CLS) of ``R`` over the patches,
reshaped to the patch grid and divided by its maximum. vit-explain divides ``a`` by ``a.sum(dim=-1)``
without ``keepdim`` (its issue #16), which scales columns; here rows are renormalised, as the paper
says (the two agree whenever the rows already sum to 1: mean of heads, no discard).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from attnviz.choices import HEAD_COMBINE
from attnviz.inspection.masks import read_masks
from attnviz.inspection.options import LabelOptions, RolloutOptions, Selection
from attnviz.inspection.weights import Weights, load_weights
from attnviz.io import release_pages
from attnviz.masks import Mask


def combine_heads(maps: np.ndarray, how: str = "mean") -> np.ndarray:
    """``maps [heads, Lq, Lk]`` combined into one ``[Lq, Lk]`` map in float64."""
    values = np.asarray(maps, dtype=np.float64)
    if how == "max":
        return values.max(axis=0)
    if how == "min":
        return values.min(axis=0)
    if how != "mean":
        raise ValueError(f"heads must be one of {HEAD_COMBINE}, not {how!r}")
    return values.mean(axis=0)


def discard_lowest(a: np.ndarray, ratio: float) -> np.ndarray:
    """vit-explain's discard (``vit_rollout.py``): of the ``L x L`` entries of the combined map ``a``, the
    ``int(L * L * ratio)`` lowest (``topk(largest=False)`` of the flattened map; ties: the lower index
    first) are set to 0, except the flat index 0, the first token's attention to itself (CLS to CLS),
    which is never dropped. Returns a new array."""
    out = np.array(a, dtype=np.float64)
    count = int(out.size * ratio)
    if count <= 0:
        return out
    flat = out.reshape(-1)
    lowest = np.argsort(flat, kind="stable")[:count]
    flat[lowest[lowest != 0]] = 0.0
    return out


def with_residual(a: np.ndarray, residual: float) -> np.ndarray:
    """``(1 - r) A + r I`` with each row renormalised to sum to 1 (a row of zeros becomes the identity
    row when r > 0, and stays zeros when r = 0)."""
    out = (1.0 - residual) * a
    out[np.diag_indices_from(out)] += residual
    sums = out.sum(axis=-1, keepdims=True)
    return np.divide(out, sums, out=np.zeros_like(out), where=sums != 0)


@dataclass
class Rollout:
    """The rollout of one batch entry: ``result [L, L]`` after the last layer, the layers it spans,
    and (when asked) the cumulative map after each of them, ``cumulative [n, L, L]``. Padded
    positions are NaN in both."""

    result: np.ndarray
    layers: list[int]
    cumulative: np.ndarray | None


def rollout(w: np.ndarray, *, heads: str = "mean", residual: float = 0.5, start_layer: int = 0,
            real: np.ndarray | None = None, all_layers: bool = False, discard_ratio: float = 0.0) -> Rollout:
    """Attention rollout of ``w [layers, heads, L, L]`` (one batch entry; see the module's docstring);
    ``discard_ratio`` drops the lowest entries of each combined map first (``discard_lowest``).

    ``real [L]`` marks the real tokens: the rollout runs over them alone (each head's rows
    renormalised among them first, so the residual keeps its share), and padded rows and columns
    of the result are NaN."""
    layers, _, lq, lk = w.shape
    if lq != lk:
        raise ValueError(f"rollout needs square maps (self-attention), not [{lq}, {lk}]")
    if not 0 <= start_layer < layers:
        raise ValueError(f"start layer {start_layer} is not one of the {layers} layers")
    keep = np.arange(lq) if real is None else np.flatnonzero(real)
    n = len(keep)
    current = np.eye(n)
    cumulative = []
    for li in range(start_layer, layers):
        one = w[li]
        if real is not None:  # the real tokens' weights, each head's rows renormalised among them
            one = np.asarray(one, dtype=np.float64)[:, keep][:, :, keep]
            sums = one.sum(axis=-1, keepdims=True)
            one = np.divide(one, sums, out=np.zeros_like(one), where=sums != 0)
        combined = combine_heads(one, heads)
        if discard_ratio > 0:
            combined = discard_lowest(combined, discard_ratio)
        step = with_residual(combined, residual)
        current = step @ current
        release_pages(w)
        if all_layers:
            cumulative.append(_scatter(current, keep, lq))
    return Rollout(_scatter(current, keep, lq), list(range(start_layer, layers)),
                   np.stack(cumulative) if all_layers else None)


def _scatter(values: np.ndarray, keep: np.ndarray, size: int) -> np.ndarray:
    if len(keep) == size:
        return values.copy()
    out = np.full((size, size), np.nan)
    out[np.ix_(keep, keep)] = values
    return out



# ---------------------------------------------------------------------------------------------------
# The run of ``attnviz rollout``: typed options in, a typed result out (it prints nothing)


@dataclass
class RolloutRun:
    options: RolloutOptions
    weights: Weights
    tokens: list[str] | None
    masks: Mask
    shown: int  # the batch entry shown
    entries: list[int]  # the batch entries rolled out
    results: dict[int, Rollout]  # by batch entry
    padded: np.ndarray | None  # the padded tokens of the shown entry
    paths: list[Path]
    words: dict[str, Any] | None = None  # --merge-subwords: the words and their pieces (for the JSON document)
    image: Any = None  # attnviz.inspection.images.ImageInput, with --image (or --patch-grid, --image-tokens)
    mask: np.ndarray | None = None  # the shown entry's query row over the patches [gh, gw], divided by its max

    @property
    def how(self) -> str:
        """heads, residual and layers, as titles and messages say them."""
        layers = self.results[self.shown].layers
        span = f"layers {layers[0]}-{layers[-1]}" if len(layers) > 1 else f"layer {layers[0]}"
        discard = f", discard {self.options.discard_ratio:g}" if self.options.discard_ratio else ""
        return f"heads {self.options.heads}, residual {self.options.residual:g}{discard}, {span}"


def cumulative(result: Rollout) -> np.ndarray:
    """The cumulative maps of a rollout computed with ``all_layers``."""
    assert result.cumulative is not None  # asked for with --all-layers
    return result.cumulative


def run_rollout(options: RolloutOptions) -> RolloutRun:
    """Read the weights (self-attention of every layer) and their masks, and roll out every batch entry
    asked for (padded tokens left out, rows renormalised among the real ones)."""
    from attnviz.errors import InputError, UsageError, shape_str
    from attnviz.inspection.checks import all_finite, check_finite
    from attnviz.inspection.selection import read_labels

    w = load_weights(options.weights, options.layout, generation=options.generation)
    layers, batches, _, lq, lk = w.shape
    if lq != lk:
        raise InputError(f"{w.source}: rollout multiplies self-attention maps [L, L] across layers; these are "
                         f"[{lq}, {lk}] (read as [layers, batch, heads, Lq, Lk] = {shape_str(w.shape)}).")
    if options.start_layer >= layers:
        raise UsageError(f"--start-layer {options.start_layer}: the weights have {layers} layer(s) "
                         f"(0..{layers - 1}).")
    paths = list(w.paths)
    tokens, _ = read_labels(LabelOptions(labels=options.labels), lq, lk, paths, w.generation)
    if w.capture is not None and tokens is None:  # the tokens the capture recorded
        from attnviz.inspection.weights import capture_labels

        tokens = capture_labels(w, getattr(options, "batch", None) or 0)[0]
    masks, _ = read_masks(options.masks, w, paths, check=False)
    words = None
    if options.merge_subwords:
        from attnviz.inspection.words import merge_run

        merged = merge_run(w, masks, None, tokens, tokens, options.subword_style)
        w, masks, tokens, words = merged.weights, merged.masks, merged.q_labels, merged.document()
        layers, batches, _, lq, lk = w.shape
    _, bi, _ = Selection(batch=options.batch).index(w.shape)
    from attnviz.inspection.images import read_image_input

    image = read_image_input(options.images, w.shape, w.source, tokens, paths)
    if not all_finite(w.data, rows=masks.real_rows):
        bad = check_finite(w.data, rows=masks.real_rows).failures
        raise InputError(f"{w.source}: {bad} non-finite value(s); attnviz inspect --check-finite locates them.")
    entries = [bi] if options.batch is not None else list(range(batches))
    real_tokens = None if masks.real_keys is None else np.broadcast_to(masks.real_keys, w.shape[:-2] + (lk,))
    results = {}
    for b in entries:
        real = None if real_tokens is None else real_tokens[0, b, 0]
        results[b] = rollout(w.data[:, b], heads=options.heads, residual=options.residual,
                             start_layer=options.start_layer, real=real, all_layers=options.all_layers,
                             discard_ratio=options.discard_ratio)
    padded = None if real_tokens is None else ~real_tokens[0, bi, 0]
    run = RolloutRun(options, w, tokens, masks, bi, entries, results, padded, paths, words, image)
    if image is not None:
        run.mask = image_mask(results[bi].result, image.query, image.layout)
    return run


def image_mask(result: np.ndarray, query: int, layout: Any) -> np.ndarray:
    """vit-explain's mask: row ``query`` of the rollout over the patches of ``layout``, as a grid, divided
    by its maximum (a padded patch, NaN in the rollout, stays NaN)."""
    row = np.asarray(result[query, layout.start:layout.stop], dtype=np.float64).reshape(layout.grid)
    top = np.nanmax(row) if np.isfinite(row).any() else 0.0
    return row / top if top > 0 else row

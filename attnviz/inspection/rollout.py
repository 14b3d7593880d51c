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

Rollout is one of the methods of ``attnviz rollout`` (``METHODS``, the one place a method is added):
attention flow (``attnviz.inspection.flow``) and gradient rollout (``attnviz.inspection.gradients``)
are the others. Each is a function of one batch entry's maps returning a ``Rollout``; ``run_rollout``
reads the files and runs the method chosen, and the renderers draw and table any of them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from attnviz.inspection.flow import attention_flow
from attnviz.inspection.gradients import gradient_entry
from attnviz.inspection.masks import read_masks
from attnviz.inspection.mixing import (
    Rollout,
    check_square,
    combine_heads,
    discard_lowest,
    mixing_maps,
    mixing_rows,
    real_indices,
    scatter,
    with_residual,
)
from attnviz.inspection.options import LabelOptions, RolloutOptions, Selection
from attnviz.inspection.weights import Weights, load_weights
from attnviz.io import release_pages
from attnviz.masks import Mask
from attnviz.storage import Place

__all__ = ["METHODS", "Method", "Rollout", "RolloutRun", "combine_heads", "discard_lowest", "rollout", "run_rollout",
           "with_residual"]


def rollout(w: np.ndarray, *, heads: str = "mean", residual: float = 0.5, start_layer: int = 0,
            real: np.ndarray | None = None, all_layers: bool = False, discard_ratio: float = 0.0,
            weighed: bool = False) -> Rollout:
    """Attention rollout of ``w [layers, heads, L, L]`` (one batch entry; see the module's docstring);
    ``discard_ratio`` drops the lowest entries of each combined map first (``discard_lowest``).

    ``real [L]`` marks the real tokens: the rollout runs over them alone (each head's rows
    renormalised among them first, so the residual keeps its share), and padded rows and columns
    of the result are NaN. ``weighed``: value-norm maps, whose heads are averaged as they are
    (``mixing.mixing_maps``)."""
    size = w.shape[-1]
    keep = real_indices(real, size)
    current = np.eye(len(keep))
    cumulative = []
    for step in mixing_maps(w, heads=heads, residual=residual, start_layer=start_layer, real=real,
                            discard_ratio=discard_ratio, weighed=weighed):
        current = step @ current
        if all_layers:
            cumulative.append(scatter(current, keep, size))
    return Rollout(scatter(current, keep, size), list(range(start_layer, w.shape[0])),
                   np.stack(cumulative) if all_layers else None)


#: values of a layer read at a time by ``pooled_rollout`` (its heads' rows)
CHUNK = 2**22


def pooled_rollout(w: np.ndarray, f: int, *, heads: str = "mean", residual: float = 0.5, start_layer: int = 0,
                   real: np.ndarray | None = None, chunk: int = CHUNK) -> np.ndarray:
    """The rollout of ``w [layers, heads, L, L]`` (``rollout``, no discard) in blocks of ``f x f`` positions:
    the mean of each block's cells over the real tokens (NaN where a block holds none), as
    ``blocks.reduce_blocks`` draws ``rollout(...).result`` in blocks, without making the ``[L, L]``
    result. The mean over a block of keys is a linear map ``P`` (``[n, m]``, ``m`` blocks), so the layers
    are applied to it from the right, ``A'_top (... (A'_start P))``, each ``A'`` read a block of rows at a
    time (``mixing.mixing_rows``; about ``chunk`` values); then the rows are averaged in their blocks. It
    holds ``[n, m]`` arrays: a map of 32,768 tokens drawn in 512 blocks a side is 128 MiB, not 8 GiB."""
    check_square(w, start_layer)
    size = w.shape[-1]
    keep = real_indices(real, size)
    n, m = len(keep), -(-size // f)
    col_block = keep // f
    counts = np.bincount(col_block, minlength=m).astype(np.float64)
    current = np.zeros((n, m))
    current[np.arange(n), col_block] = 1.0 / counts[col_block]
    picked = None if real is None else keep
    step = max(1, chunk // max(1, w.shape[1] * n))
    for li in range(start_layer, w.shape[0]):
        after = np.empty_like(current)
        for first in range(0, n, step):
            rows = np.arange(first, min(first + step, n))
            after[rows] = mixing_rows(w[li], rows, picked, heads=heads, residual=residual) @ current
            release_pages(w)
        current = after
    pooled = np.zeros((m, m))
    np.add.at(pooled, col_block, current)
    with np.errstate(invalid="ignore", divide="ignore"):
        out = pooled / counts[:, None]
    out[counts == 0] = np.nan
    out[:, counts == 0] = np.nan
    return out


@dataclass(frozen=True)
class Method:
    """A way of following attention through the layers (``attnviz rollout --method``): a function of
    one batch entry's weights ``[layers, heads, L, L]`` (keywords: ``start_layer``, ``real``,
    ``all_layers``, ``grads`` when it takes gradients, and the options it names in ``options``) that
    returns a ``Rollout``."""

    compute: Callable[..., Rollout]
    title: str  # what titles call the result
    label: str  # what a colour bar calls its values
    options: tuple[str, ...] = ("heads", "residual", "discard_ratio")  # the RolloutOptions it reads
    gradients: bool = False  # it needs --grads
    weighable: bool = True  # it follows value-norm maps (--weigh-by value-norms; keyword ``weighed``)


#: every method of ``attnviz rollout``: the one place a method is added (``choices.ROLLOUT_METHODS``
#: names them for the options, which load no NumPy; a test keeps the two the same)
METHODS: dict[str, Method] = {
    "rollout": Method(rollout, "attention rollout", "rollout: share of each input token"),
    "flow": Method(attention_flow, "attention flow", "flow: share of each input token"),
    "grad": Method(gradient_entry, "gradient rollout", "relevance of each input token", options=("heads",),
                   gradients=True, weighable=False),
}


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
    paths: list[Place]
    words: dict[str, Any] | None = None  # --merge-subwords: the words and their pieces (for the JSON document)
    image: Any = None  # attnviz.inspection.images.ImageInput, with --image (or --patch-grid, --image-tokens)
    mask: np.ndarray | None = None  # the shown entry's query row over the patches [gh, gw], divided by its max
    grads: Weights | None = None  # --method grad: the gradients, [layers, batch, heads, L, L] as the weights
    warnings: list[str] = field(default_factory=list)  # for stderr (the API: ``warnings``)
    labels: Any = None  # attnviz.inspection.selection.TokenLabels: every entry's tokens (``tokens``: the shown one's)

    def tokens_of(self, entry: int) -> list[str] | None:
        """The tokens of batch entry ``entry``."""
        return self.tokens if self.labels is None or entry == self.shown else self.labels.of(entry)[0]

    @property
    def method(self) -> Method:
        return METHODS[self.options.method]

    @property
    def title(self) -> str:
        """What the result is called: "attention rollout", "attention flow", "gradient rollout" (of
        value-norm-weighted attention, with ``--weigh-by value-norms``)."""
        w = self.weights
        return self.method.title if w.weighed == "weights" else f"{self.method.title} of {w.what}"

    @property
    def how(self) -> str:
        """heads, residual and layers (those the method uses), as titles and messages say them."""
        layers = self.results[self.shown].layers
        span = f"layers {layers[0]}-{layers[-1]}" if len(layers) > 1 else f"layer {layers[0]}"
        used = self.method.options
        parts = [f"heads {self.options.heads}"]
        if "residual" in used:
            parts.append(f"residual {self.options.residual:g}")
        if "discard_ratio" in used and self.options.discard_ratio:
            parts.append(f"discard {self.options.discard_ratio:g}")
        return ", ".join([*parts, span])


def cumulative(result: Rollout) -> np.ndarray:
    """The cumulative maps of a rollout computed with ``all_layers``."""
    assert result.cumulative is not None  # asked for with --all-layers
    return result.cumulative


def _check_memory(w: Weights, options: RolloutOptions) -> None:
    """A rollout of long maps refused in one line where its ``[L, L]`` maps (a layer's heads, the product, the
    step, and with --all-layers one per layer, in float64) would not fit in the memory attnviz allows."""
    from attnviz.errors import InputError
    from attnviz.sizes import memory_limit, size_str

    layers, _, heads, lq, lk = w.shape
    held = (heads + 4 + (layers if options.all_layers else 0)) * lq * lk * 8
    if held > memory_limit():
        raise InputError(f"{w.source}: {options.method} of [{lq}, {lk}] maps would hold about {size_str(held)} in "
                         f"memory, more than the {size_str(memory_limit())} attnviz allows; attnviz view draws the "
                         "rollout of long maps in blocks (key r), or roll out fewer tokens.")


def run_rollout(options: RolloutOptions) -> RolloutRun:
    """Read the weights (self-attention of every layer), their masks (and with ``--method grad`` the
    gradients), and run the method of ``options`` on every batch entry asked for (padded tokens left
    out)."""
    from attnviz.errors import InputError, UsageError, shape_str
    from attnviz.inspection.checks import all_finite, check_finite
    from attnviz.inspection.selection import read_labels

    method = METHODS[options.method]
    check_method(options, method)
    w = load_weights(options.weights, options.layout, generation=options.generation)
    if options.weigh_by != "weights":
        from attnviz.inspection.norms import weigh

        w = weigh(w, options.weigh_by)
    layers, batches, _, lq, lk = w.shape
    if lq != lk:
        raise InputError(f"{w.source}: {options.method} follows self-attention maps [L, L] across layers; these are "
                         f"[{lq}, {lk}] (read as [layers, batch, heads, Lq, Lk] = {shape_str(w.shape)}).")
    if options.start_layer >= layers:
        raise UsageError(f"--start-layer {options.start_layer}: the weights have {layers} layer(s) "
                         f"(0..{layers - 1}).")
    paths = list(w.paths)
    grads = read_gradients(options, w) if method.gradients else None
    if grads is not None:
        paths += [p for p in grads.paths if p not in paths]
    labels = read_labels(LabelOptions(labels=options.labels), lq, lk, paths, w.generation, batches)
    if w.capture is not None and labels.q is None:  # the tokens the capture recorded
        from attnviz.inspection.selection import TokenLabels
        from attnviz.inspection.weights import capture_labels

        labels = TokenLabels(*capture_labels(w), given=False, style=w.capture.token_style())
    masks, _ = read_masks(options.masks, w, paths, check=False)
    _, bi, _ = Selection(batch=options.batch).index(w.shape)
    words = None
    if options.merge_subwords:
        from attnviz.inspection.selection import TokenLabels, entry_labels_to_merge
        from attnviz.inspection.words import merge_run

        tokens = entry_labels_to_merge(labels, options.batch, bi)[0]
        merged = merge_run(w, masks, None, tokens, tokens, options.subword_style)
        w, masks, words = merged.weights, merged.masks, merged.document()
        labels = TokenLabels(None if merged.q_labels is None else [merged.q_labels], None,
                             labels.given and not labels.per_entry,  # the shown entry's own: nothing to warn of
                             style=labels.style)
        layers, batches, _, lq, lk = w.shape
    from attnviz.inspection.images import read_image_input

    tokens = labels.of(bi)[0]
    image = read_image_input(options.images, w.shape, w.source, tokens, paths)
    for read in (w, grads):
        if read is not None and not all_finite(read.data, rows=masks.real_rows):
            bad = check_finite(read.data, rows=masks.real_rows).failures
            raise InputError(f"{read.source}: {bad} non-finite value(s); attnviz inspect --check-finite locates "
                             "them.")
    entries = [bi] if options.batch is not None else list(range(batches))
    _check_memory(w, options)
    real_tokens = None if masks.real_keys is None else np.broadcast_to(masks.real_keys, w.shape[:-2] + (lk,))
    settings: dict[str, Any] = {name: getattr(options, name) for name in method.options}
    if w.renormalised:
        settings["weighed"] = True
    results = {}
    for b in entries:
        real = None if real_tokens is None else real_tokens[0, b, 0]
        given = {} if grads is None else {"grads": grads.data[:, b]}
        try:
            results[b] = method.compute(w.data[:, b], start_layer=options.start_layer, real=real,
                                        all_layers=options.all_layers, **given, **settings)
        except ValueError as exc:  # what the data cannot give (flow: a negative weight)
            raise InputError(f"{w.source}: batch entry {b}: {exc}.") from None
    padded = None if real_tokens is None else ~real_tokens[0, bi, 0]
    from attnviz.inspection.masks import mask_warnings
    from attnviz.inspection.selection import label_warnings

    warnings = mask_warnings(w, masks, options.masks, "rollout") + label_warnings(labels, masks, w.shape,
                                                                                  options.batch, bi)
    run = RolloutRun(options, w, tokens, masks, bi, entries, results, padded, paths, words, image, grads=grads,
                     warnings=warnings, labels=labels)
    if image is not None:
        run.mask = image_mask(results[bi].result, image.query, image.layout)
    return run


def check_method(options: RolloutOptions, method: Method) -> None:
    """Options the method cannot use are refused (exit 2), and gradients it needs but was not given
    (exit 1), before any file is read."""
    from dataclasses import fields

    from attnviz.errors import UsageError

    defaults = {f.name: f.default for f in fields(RolloutOptions)}
    for name in ("heads", "residual", "discard_ratio"):
        value = getattr(options, name)
        if name not in method.options and value != defaults[name]:
            shown = f"{value:g}" if isinstance(value, float) else value
            raise UsageError(f"--{name.replace('_', '-')} {shown}: --method {options.method} does not use it "
                             f"({method.title} takes {', '.join('--' + o.replace('_', '-') for o in method.options)}).")
    if options.weigh_by != "weights" and not method.weighable:
        raise UsageError(f"--weigh-by {options.weigh_by}: not with --method {options.method} ({method.title} weighs "
                         "each layer's attention weights by the gradient of the score with respect to them; a "
                         "value-norm map has no recorded gradient). Use --method rollout or flow.")
    if options.grads is not None and not method.gradients:
        raise UsageError(f"--grads {options.grads}: only --method grad reads gradients.")
    if method.gradients and options.merge_subwords:
        raise UsageError(f"--merge-subwords: not with --method {options.method} (the gradients are the pieces' own; "
                         "merged weights have none).")


def read_gradients(options: RolloutOptions, w: Weights) -> Weights:
    """The gradients of ``--grads``, read as the weights were (``--layout``, ``--generation``), and of
    their shape."""
    from attnviz.errors import InputError, shape_str

    if options.grads is None:
        return capture_gradients(options, w)
    grads = load_weights(options.grads, options.layout, generation=options.generation)
    if grads.shape != w.shape:
        raise InputError(f"{grads.source}: the gradients are {shape_str(grads.shape)} and the weights "
                         f"{shape_str(w.shape)} (read as [layers, batch, heads, L, L]); --grads needs one gradient "
                         "per weight.")
    return grads


def capture_gradients(options: RolloutOptions, w: Weights) -> Weights:
    """The gradients a capture file holds beside its weights (``attnviz capture --target``: ``SITE.grad``);
    without them, what to do."""
    from dataclasses import replace

    from attnviz.errors import CAPTURE_TARGET, InputError

    if w.capture is not None and w.kind is not None:
        sites = w.capture.sites(w.kind)
        if all(w.capture.has(s, "grad") for s in sites):
            data = np.stack([w.container.get(f"{s}.grad").astype(np.float32, copy=False) for s in sites])
            if data.shape == w.shape:
                return replace(w, data=data, keys=[f"{s}.grad" for s in sites], weighed="weights")
        raise InputError(f"{w.source}: --method {options.method} needs the gradients of the explained score with "
                         f"respect to every layer's attention weights, and this capture holds none: record them with "
                         f"{CAPTURE_TARGET}, or give them with --grads SPEC.")
    raise InputError(f"--method {options.method} needs the gradients of the explained score with respect to every "
                     "layer's attention weights: give them with --grads SPEC (read as the weights are), or "
                     f"record them with {CAPTURE_TARGET}.")


def image_mask(result: np.ndarray, query: int, layout: Any) -> np.ndarray:
    """vit-explain's mask: row ``query`` of the rollout over the patches of ``layout``, as a grid, divided
    by its maximum (a padded patch, NaN in the rollout, stays NaN)."""
    row = np.asarray(result[query, layout.start:layout.stop], dtype=np.float64).reshape(layout.grid)
    top = np.nanmax(row) if np.isfinite(row).any() else 0.0
    return row / top if top > 0 else row

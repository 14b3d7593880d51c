"""The run of ``attnviz inspect`` as a library function: typed options in, a typed result out; it
prints nothing and writes no file (the command line, or the Python API, presents the result).

Two steps, so that a caller can reserve its output files between them (``attnviz.staging``): ``prepare``
reads the weights, labels and masks and checks every choice against them (fast, and every usage or
data error is raised here); ``analyse`` runs the checks and computes the head statistics, token
scores, received attention and the shown map's per-query statistics.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from attnviz.inspection.checks import CheckResult, all_finite, check_finite, check_masked, check_rows
from attnviz.inspection.heads import (
    Distributions,
    HeadPass,
    default_atol,
    distributions,
    head_pass,
    map_row_stats,
    row_sum_tolerance,
)
from attnviz.inspection.images import ImageInput, Overlay, overlay, read_image_input
from attnviz.inspection.masks import read_masks
from attnviz.inspection.options import InspectOptions
from attnviz.inspection.received import received_summary
from attnviz.inspection.selection import (
    GridChoice,
    TokenLabels,
    entry_labels_to_merge,
    grid_choice,
    label_warnings,
    read_labels,
)
from attnviz.inspection.tokens import TOKEN_NOTE, TOKEN_STATS, add_token_scores
from attnviz.inspection.weights import Weights, load_weights
from attnviz.masks import Mask
from attnviz.storage import Place

__all__ = ["InspectOptions", "InspectResult", "Opened", "analyse", "prepare"]


@dataclass
class Opened:
    """The weights of a run and everything read with them, checked against each other."""

    options: InspectOptions
    weights: Weights
    q_labels: list[str] | None
    k_labels: list[str] | None
    tokens: list[list[str]] | None  # each counted entry's labels when both axes carry the same (token scores)
    index: tuple[int, int, int]  # (layer, batch, head) of the shown map
    grid: GridChoice
    masks: Mask  # --mask and --key-padding-mask (and --check-mask), with their padding
    checked: Mask | None  # --check-mask alone
    paths: list[Place]  # every file read: outputs may not replace them
    words: dict[str, Any] | None = None  # --merge-subwords: the words and their pieces (for the JSON document)
    image: ImageInput | None = None  # --image (or --patch-grid, --image-tokens): the patches and the query
    labels: TokenLabels = field(default_factory=TokenLabels)  # every entry's: ``q_labels`` are the shown one's
    warnings: list[str] = field(default_factory=list)  # what reading found (a label list that may not fit)

    def labels_of(self, entry: int) -> tuple[list[str] | None, list[str] | None]:
        """The labels of batch entry ``entry`` (queries, keys)."""
        if entry == self.index[1]:
            return self.q_labels, self.k_labels
        return self.labels.of(entry)

    @property
    def overlay_layer(self) -> int:
        """The layer drawn over the image: --layer, or the last (as DINO)."""
        layer = self.options.selection.layer
        return self.weights.shape[0] - 1 if layer is None else self.index[0]


@dataclass
class InspectResult:
    opened: Opened
    atol: float
    checks: list[CheckResult]
    finite: bool
    stats: dict[str, np.ndarray] = field(default_factory=dict)  # head statistics [L, H] (and "tag", "causal")
    distributions: Distributions | None = None
    notes: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    received: dict[str, Any] | None = None
    padded: int = 0  # padded query rows over the maps the statistics read
    data_shape: tuple[int, ...] = ()  # the weights the statistics read: every batch entry, or --batch's
    chosen: Mask = field(default_factory=Mask)  # their masks
    one: np.ndarray | None = None  # the shown map [Lq, Lk]
    one_keep: np.ndarray | None = None
    one_padded: np.ndarray | None = None  # its padded query rows
    drawn_keep: np.ndarray | None = None  # what its picture greys: masked keys and padded rows
    rows: Any = None  # its per-query statistics (RowStats)
    overlay: Overlay | None = None  # the query's attention over the image's patches
    meanwhile: Any = None  # what ``analyse``'s ``meanwhile`` made while the statistics were summed

    @property
    def failed(self) -> bool:
        return not self.finite or any(not c.passed for c in self.checks)

    def padded_positions(self) -> int:
        """Padded positions of the batch (a position padded in any layer or head)."""
        if not self.padded or self.chosen.real_rows is None:
            return 0
        rows_real = np.broadcast_to(self.chosen.real_rows, self.data_shape[:-1])
        return int((~rows_real).any(axis=(0, 2)).sum())


def prepare(options: InspectOptions, token_options: tuple[tuple[str, str | None], ...] = ()) -> Opened:
    """Read the weights, labels and masks of ``options``; ``token_options`` (``("--sort", "induction")``)
    are choices that need the tokens, refused without them."""
    from attnviz.errors import UsageError

    w = load_weights(options.weights, options.layout, generation=options.generation)
    if options.weigh_by != "weights":
        from attnviz.inspection.norms import weigh

        w = weigh(w, options.weigh_by)
    lq, lk = w.shape[-2:]
    paths = list(w.paths)
    labels = read_labels(options.labels, lq, lk, paths, w.generation, w.shape[1])
    if w.capture is not None and labels.q is None and labels.k is None:  # the tokens the capture recorded
        from attnviz.inspection.weights import capture_labels

        labels = TokenLabels(*capture_labels(w), given=False, style=w.capture.token_style())
    masks, checked = read_masks(options.masks, w, paths)
    index = options.selection.index(w.shape)
    words = None
    if options.labels.merge_subwords:
        from attnviz.inspection.words import merge_run

        q_labels, k_labels = entry_labels_to_merge(labels, options.selection.batch, index[1])
        merged = merge_run(w, masks, checked, q_labels, k_labels, options.labels.subword_style)
        w, masks, checked = merged.weights, merged.masks, merged.checked
        labels = TokenLabels(None if merged.q_labels is None else [merged.q_labels],
                             None if merged.k_labels is None else [merged.k_labels],
                             labels.given and not labels.per_entry,  # the shown entry's own: nothing to warn of
                             style=labels.style)
        words = merged.document()
    q_labels, k_labels = labels.of(index[1])
    entries = [index[1]] if options.selection.batch is not None else list(range(w.shape[1]))
    tokens = labels.tokens(entries)
    for option, value in token_options:
        if value in TOKEN_STATS and tokens is None:
            raise UsageError(f"{option} {value}: {TOKEN_NOTE}.")
    grid = grid_choice(options.grid.layers, options.grid.heads, w.shape, options.grid.reduce_heads)
    image = read_image_input(options.images, w.shape, w.source, q_labels, paths)
    opened = Opened(options, w, q_labels, k_labels, tokens, index, grid, masks, checked, paths, words, image,
                    labels=labels)
    opened.warnings = label_warnings(labels, masks, w.shape, options.selection.batch, index[1])
    return opened


def analyse(opened: Opened, meanwhile: Callable[[], Any] | None = None) -> InspectResult:
    """Checks, head statistics, token scores, received attention, and the shown map. Weights with
    NaN or infinity are an error unless ``--check-finite`` asked for them (then the result holds the
    failed check and nothing else).

    ``meanwhile``: work for this thread while the head statistics are summed in another (a picture drawn
    from ``opened`` alone: matplotlib's Python and NumPy's loops share the cores, the head pass letting
    go of the GIL); what it returns is ``result.meanwhile``. An exception it raises is raised once the
    weights are known to be finite (weights with NaN or infinity are reported as such instead)."""
    passed, made = _pass_and_meanwhile(opened, meanwhile)
    result = _analyse(opened, passed)
    if result.finite and isinstance(made, BaseException):
        raise made
    result.meanwhile = None if isinstance(made, BaseException) else made
    return result


def _pass_and_meanwhile(opened: Opened, meanwhile: Callable[[], Any] | None) -> tuple[HeadPass, Any]:
    """The head pass over the weights the statistics read (``head_pass``), and what ``meanwhile`` made
    (or raised) while it ran in a thread of its own."""
    o, w, masks = opened.options, opened.weights, opened.masks
    bi = opened.index[1]
    chosen = masks if o.selection.batch is None else masks.batch(bi)
    data = w.data if o.selection.batch is None else w.data[:, bi:bi + 1]

    def summed(threads: int | None = None) -> HeadPass:
        return head_pass(data, chosen.keep, real_rows=chosen.real_rows, real_keys=chosen.real_keys,
                         stored=w.stored_dtype, threads=threads, renormalise=w.renormalised)

    if meanwhile is None:
        return summed(), None
    import threading

    from attnviz.threads import THREADS, quick_switching

    got: dict[str, Any] = {}

    def run() -> None:
        try:
            got["pass"] = summed(max(1, THREADS - 1))  # this thread is busy with ``meanwhile``: the other cores
        except BaseException as exc:  # noqa: BLE001 - raised in the calling thread
            got["error"] = exc

    worker = threading.Thread(target=run, name="attnviz-pass")
    with quick_switching():  # the pass's NumPy calls wait less for the GIL while ``meanwhile`` runs Python
        worker.start()
        try:
            try:
                made: Any = meanwhile()
            except Exception as exc:  # noqa: BLE001 - raised by ``analyse`` once the weights are known finite
                made = exc
            while worker.is_alive():  # in short waits: this thread stays ready for Ctrl-C and SIGTERM
                worker.join(0.05)
        finally:
            # Ctrl-C or SIGTERM here: the pass ends first (a few tenths of a second at most), so that no thread
            # of this run outlives it (a process that ends with one still summing may crash in its finalisation)
            while worker.is_alive():
                try:
                    worker.join(0.05)
                except KeyboardInterrupt:
                    pass  # a second one while the first ends the run
    if "error" in got:
        raise got["error"]
    return got["pass"], made


def _analyse(opened: Opened, passed: HeadPass) -> InspectResult:
    from attnviz.errors import InputError
    from attnviz.masks import causal_keep

    o, w, masks = opened.options, opened.weights, opened.masks
    keep, real = masks.keep, masks.real_rows
    lq, lk = w.shape[-2:]
    atol = o.checks.atol if o.checks.atol is not None else default_atol(w.stored_dtype)
    li, bi, hi = opened.index
    batch = o.selection.batch
    chosen = masks if batch is None else masks.batch(bi)
    data = w.data if batch is None else w.data[:, bi:bi + 1]
    # one reading of the weights (``passed``): the head statistics, each key's column sums (received
    # attention) and whether the real rows are finite; when one is not (or --batch chose a part), look closer
    finite = (passed.finite and batch is None) or all_finite(w.data, rows=real)
    checks: list[CheckResult] = []
    if o.checks.check_finite:
        checks.append(check_finite(w.data, rows=real))
    if not finite and not o.checks.check_finite:
        bad = check_finite(w.data, rows=real).failures
        raise InputError(f"{w.source}: {bad} non-finite value(s); run with --check-finite to locate them.")
    result = InspectResult(opened, atol, checks, finite)
    if not finite:
        return result
    if o.checks.check_rows:
        checks.append(check_rows(w.data, atol, keep, real))
    if opened.checked is not None and opened.checked.keep is not None:
        checks.append(check_masked(w.data, opened.checked.keep, atol, "check-mask", rows=real))
    if o.checks.check_causal:
        checks.append(check_masked(w.data, causal_keep(lq, lk, o.checks.causal_align), atol, "check-causal",
                                   rows=real))

    stats = passed.stats
    found = distributions(stats, row_sum_tolerance(w.stored_dtype))
    note = add_token_scores(stats, data, opened.tokens, chosen.real_rows, found.ok, w.renormalised)
    if o.received:
        # the keys' labels: the shown entry's, unless the counted entries have labels of their own
        k_labels = None if opened.labels.per_entry and batch is None else opened.k_labels
        result.received = received_summary(data, chosen.keep, chosen.real_rows, k_labels,
                                           lq == lk and bool(stats["causal"]), list(range(w.shape[0])),
                                           columns=passed.columns)
    result.stats, result.distributions, result.chosen, result.data_shape = stats, found, chosen, data.shape
    result.notes = [note] if note else []
    hidden = None
    if chosen.keep is not None and opened.checked is None:  # (--check-mask says where weight lies itself)
        from attnviz.inspection.masks import hidden_weight_warning

        hidden = hidden_weight_warning(w.source, o.masks, passed.held, passed.hidden, int(np.sum(stats["rows"])),
                                       captured=w.capture is not None and o.masks.mask is None
                                       and o.masks.key_padding_mask is None)
    # value-norm maps are not distributions by design (their rows sum to the norm-weighted mass moved)
    distributed = found.warning(w.source) if w.weighed == "weights" else None
    result.warnings = [text for text in (hidden, *opened.warnings, distributed) if text]
    result.padded = chosen.padded_rows(data.shape)
    one = w.data[li, bi, hi]
    one_keep = None if keep is None else np.broadcast_to(keep, w.shape)[li, bi, hi]
    one_padded = None if real is None else ~np.broadcast_to(real, w.shape[:-1])[li, bi, hi]
    drawn_keep = one_keep  # the picture greys padded query rows as well as masked keys
    if one_padded is not None and one_padded.any():
        drawn_keep = np.ones(one.shape, bool) if one_keep is None else one_keep.copy()
        drawn_keep[one_padded] = False
    result.one, result.one_keep, result.one_padded, result.drawn_keep = one, one_keep, one_padded, drawn_keep
    if o.row_stats:
        result.rows = map_row_stats(one, one_keep, renormalise=w.renormalised)
    if opened.image is not None:
        layer = opened.overlay_layer
        result.overlay = overlay(w.data[layer, bi], opened.image.layout, opened.image.query, layer=layer, batch=bi,
                                 heads=opened.grid.heads, labels=opened.q_labels, share=o.images.keep_mass)
    return result

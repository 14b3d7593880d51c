"""Comparing two sets of weights of one shape: differences, Jensen-Shannon divergence, argmax
agreement, the most different rows, and the tolerance check."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from attnviz.errors import InputError, ShapeError, shape_str
from attnviz.inspection.checks import CheckResult, all_finite, locate
from attnviz.inspection.heads import Distributions, row_distributions, row_sum_tolerance
from attnviz.inspection.masks import read_masks
from attnviz.inspection.options import CompareOptions
from attnviz.inspection.selection import GridChoice, TokenLabels, grid_choice
from attnviz.inspection.weights import Weights, load_weights
from attnviz.masks import Mask
from attnviz.storage import Place

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
    diff: np.ndarray  # a - b (0 in padded rows)
    max_abs: float
    mean_abs: float
    js: np.ndarray  # per row [L, B, H, Lq]; NaN in padded rows
    argmax_agree: float  # fraction of rows whose argmax is the same
    worst_rows: list[dict[str, object]]
    js_mean: float = 0.0
    js_max: float = 0.0
    rows: int = 0  # the rows compared (padded rows are left out)
    padded_rows: int = 0
    distributions: tuple[Distributions, Distributions] | None = None  # of A and of B
    heads: list[dict[str, Any]] = field(default_factory=list)  # every head, those that changed most first


def head_changes(diff: np.ndarray, js: np.ndarray) -> list[dict[str, Any]]:
    """Every (layer, head) of ``diff [L, B, H, Lq, Lk]`` (A - B, 0 in padded rows) and ``js [L, B, H, Lq]`` (NaN in
    padded rows), those that changed most first: the mean Jensen-Shannon divergence of its real rows over every
    batch entry (``mean_js``; ties: layer and head order), the largest (``max_js``), and the mean and largest
    |A - B| (``mean_abs``, ``max_abs``); a head without a real row has None and comes last. Two recordings of a
    training: the heads whose attention moved most between them."""
    layers, _, heads = diff.shape[:3]
    real = ~np.isnan(js)
    out: list[dict[str, Any]] = []
    for li in range(layers):
        for hi in range(heads):
            d = np.abs(np.asarray(diff[li, :, hi], np.float64))
            n = int(real[li, :, hi].sum())
            j = js[li, :, hi][real[li, :, hi]]
            out.append({"layer": li, "head": hi, "mean_js": float(j.mean()) if n else None,
                        "max_js": float(j.max()) if n else None,
                        "mean_abs": float(d.sum() / (n * d.shape[-1])) if n else None,
                        "max_abs": float(d.max()) if d.size else 0.0})
    return sorted(out, key=lambda h: (h["mean_js"] is None, -(h["mean_js"] or 0.0)))


def compare(a: np.ndarray, b: np.ndarray, worst: int = 5, rows: np.ndarray | None = None,
            keep: np.ndarray | None = None, stored: tuple[str, str] | None = None) -> Comparison:
    """Differences of ``a`` and ``b`` over the real query rows (``rows``, bool broadcasting to
    ``[L, B, H, Lq]``; every row when None). ``keep`` only tells which rows are fully masked (they
    are not asked to be distributions)."""
    a64 = np.asarray(a, dtype=np.float64)
    b64 = np.asarray(b, dtype=np.float64)
    real = np.ones(a64.shape[:-1], bool) if rows is None else np.broadcast_to(rows, a64.shape[:-1])
    diff = a64 - b64 if rows is None else np.where(real[..., None], a64 - b64, 0.0)
    absd = np.abs(diff)
    n = int(real.sum())
    js = np.where(real, js_divergence(a64, b64), np.nan)
    agree = (np.argmax(a64, axis=-1) == np.argmax(b64, axis=-1)) & real
    row_max = absd.max(axis=-1)
    order = np.argsort(np.where(real, -js, np.inf), axis=None, kind="stable")[:min(worst, n)]
    worst_rows = []
    for flat in order:
        idx = np.unravel_index(int(flat), js.shape)
        worst_rows.append({"index": [int(i) for i in idx], "where": locate(idx), "js": float(js[idx]),
                           "max_abs": float(row_max[idx]), "argmax_a": int(np.argmax(a64[idx])),
                           "argmax_b": int(np.argmax(b64[idx]))})
    live = real if keep is None else real & np.broadcast_to(np.any(keep, axis=-1), real.shape)
    tol = (row_sum_tolerance(stored[0] if stored else np.asarray(a).dtype),
           row_sum_tolerance(stored[1] if stored else np.asarray(b).dtype))
    return Comparison(diff, float(absd.max()) if n else 0.0,
                      float(absd.sum() / (n * a64.shape[-1])) if n else 0.0, js,
                      float(agree.sum() / n) if n else 1.0, worst_rows,
                      float(np.nanmean(js)) if n else 0.0, float(np.nanmax(js)) if n else 0.0, n,
                      real.size - n, (row_distributions(a64, live, tol[0]), row_distributions(b64, live, tol[1])),
                      head_changes(diff, js))


def tolerance_check(a: np.ndarray, b: np.ndarray, atol: float, rtol: float,
                    rows: np.ndarray | None = None) -> CheckResult:
    """``|a - b| <= atol + rtol |b|`` everywhere (numpy.allclose's rule), padded rows aside."""
    a64 = np.asarray(a, dtype=np.float64)
    b64 = np.asarray(b, dtype=np.float64)
    excess = np.abs(a64 - b64) - (atol + rtol * np.abs(b64))
    if rows is not None:
        excess = np.where(np.broadcast_to(rows, a64.shape[:-1])[..., None], excess, -np.inf)
    bad = excess > 0
    if not bad.any():
        return CheckResult("tolerance", True, detail={"atol": atol, "rtol": rtol})
    worst = np.unravel_index(int(np.argmax(excess)), excess.shape)
    return CheckResult("tolerance", False, int(bad.sum()),
                       f"{locate(worst)}: {a64[worst]:.6g} vs {b64[worst]:.6g} (atol {atol:g}, rtol {rtol:g})",
                       {"unit": "entries", "index": [int(i) for i in worst], "a": float(a64[worst]),
                        "b": float(b64[worst]), "atol": atol, "rtol": rtol})


# ---------------------------------------------------------------------------------------------------
# The run of ``attnviz compare``: typed options in, a typed result out (it prints nothing)


@dataclass
class CompareRun:
    """Both sets of weights, read and checked against each other (``prepare_compare``)."""

    options: CompareOptions
    a: Weights
    b: Weights
    masks: Mask
    index: tuple[int, int, int]
    grid: GridChoice
    paths: list[Place]
    labels: TokenLabels = field(default_factory=TokenLabels)  # every entry's (``q_labels``: the shown one's)
    notes: list[str] = field(default_factory=list)  # how the two were brought to one shape

    @property
    def q_labels(self) -> list[str] | None:
        return self.labels.of(self.index[1])[0]

    @property
    def k_labels(self) -> list[str] | None:
        return self.labels.of(self.index[1])[1]


@dataclass
class CompareResult:
    run: CompareRun
    comparison: Comparison
    checks: list[CheckResult]
    warnings: list[str]

    @property
    def failed(self) -> bool:
        return any(not c.passed for c in self.checks)


def _load_side(options: CompareOptions, side: str, stdin: Any) -> Weights:
    """A or B, stitched when its --generation (or --generation-a/-b) says so."""
    spec = options.a if side == "a" else options.b
    alone = options.generation_a if side == "a" else options.generation_b
    stitched = options.generation or alone
    other = "--generation-b" if side == "a" else "--generation-a"
    try:
        return load_weights(spec, None if stitched else options.layout, stdin, stitched,
                            generation_option=f"--generation-{side} (--generation: both)")
    except InputError as exc:
        if options.generation and not alone and "--generation reads" in exc.message:
            exc.message += f" If only {'B' if side == 'a' else 'A'} is generate()'s, give {other} instead."
            exc.args = (exc.message,)
        raise


def _one_shape(a: Weights, b: Weights) -> tuple[Weights, Weights, list[str]]:
    """A stitched generation and a forward pass over ``out.sequences``: the forward pass has one position more
    (the last token, never fed back), left out. Other shapes that differ are an error."""
    from dataclasses import replace

    if a.shape == b.shape:
        return a, b, []
    for stitched, forward in ((a, b), (b, a)):
        if stitched.generation is None or forward.generation is not None:
            continue
        one_more = tuple(n + 1 for n in stitched.shape[-2:])
        if forward.shape[:-2] == stitched.shape[:-2] and forward.shape[-2:] == one_more:
            cut = replace(forward, data=forward.data[..., :-1, :-1])
            note = (f"{forward.source}: its last position (the last generated token, which generate() never fed "
                    f"back) is left out to match the {stitched.shape[-1]} positions stitched from {stitched.source}")
            return (cut, stitched, [note]) if forward is a else (stitched, cut, [note])
    hint = ""
    if a.generation is None and b.generation is None:
        hint = " (generate()'s attentions against a forward pass: --generation-a or --generation-b)"
    raise ShapeError(f"A ({a.source}) is {shape_str(a.shape)} and B ({b.source}) {shape_str(b.shape)} as [layers, "
                     f"batch, heads, Lq, Lk]; compare needs the same shape{hint}.")


def prepare_compare(options: CompareOptions) -> CompareRun:
    """Read A and B (same shape), their masks and labels; every usage and data error is raised here."""
    from attnviz.errors import UsageError
    from attnviz.inspection.selection import read_labels
    from attnviz.io import StdinReader

    if options.generation and (options.generation_a or options.generation_b):
        raise UsageError("--generation stitches both files; give it alone, or --generation-a or --generation-b.")
    stdin = StdinReader()
    a, b, notes = _one_shape(_load_side(options, "a", stdin), _load_side(options, "b", stdin))
    paths = [*a.paths, *b.paths]
    stitched = a if a.generation is not None else b
    masks, _ = read_masks(options.masks, stitched, paths, stdin, check=False)
    lq, lk = a.shape[-2:]
    labels = read_labels(options.labels, lq, lk, paths, stitched.generation, a.shape[1])
    for w in (a, b):
        if w.capture is not None and labels.q is None and labels.k is None:
            from attnviz.inspection.weights import capture_labels

            labels = TokenLabels(*capture_labels(w), given=False, style=w.capture.token_style())
    index = options.selection.index(a.shape)
    if options.labels.merge_subwords:
        from dataclasses import replace

        from attnviz.inspection.selection import entry_labels_to_merge
        from attnviz.inspection.words import merge_run

        q_labels, k_labels = entry_labels_to_merge(labels, options.selection.batch, index[1])
        merged_a = merge_run(a, masks, None, q_labels, k_labels, options.labels.subword_style)
        merged_b = merge_run(b, masks, None, q_labels, k_labels, options.labels.subword_style)
        a, b, masks = merged_a.weights, replace(b, data=merged_b.weights.data), merged_a.masks
        labels = TokenLabels(None if merged_a.q_labels is None else [merged_a.q_labels],
                             None if merged_a.k_labels is None else [merged_a.k_labels], labels.given,
                             style=labels.style)
    for w in (a, b):
        if not all_finite(w.data, rows=masks.real_rows):
            raise InputError(f"{w.source}: holds NaN or infinity; `attnviz inspect --check-finite` locates them.")
    grid = grid_choice(options.grid.layers, options.grid.heads, a.shape, options.grid.reduce_heads)
    return CompareRun(options, a, b, masks, index, grid, paths, labels, notes)


def run_compare(run: CompareRun) -> CompareResult:
    """The comparison of the run, its tolerance check (when asked) and warnings about rows that are not
    distributions."""
    o, a, b, masks = run.options, run.a, run.b, run.masks
    result = compare(a.data, b.data, o.worst, masks.real_rows, masks.keep, (a.stored_dtype, b.stored_dtype))
    checks = []
    if o.atol is not None or o.rtol is not None:
        checks.append(tolerance_check(a.data, b.data, o.atol or 0.0, o.rtol or 0.0, masks.real_rows))
    from attnviz.inspection.masks import mask_warnings

    # weight on hidden keys in both (an inverted mask hides the weight of both; in one alone it is a difference)
    warnings = mask_warnings(a, masks, o.masks, "compare")
    if warnings and not mask_warnings(b, masks, o.masks, "compare"):
        warnings = []
    from attnviz.inspection.selection import label_warnings

    warnings += label_warnings(run.labels, masks, a.shape, o.selection.batch, run.index[1])
    for w, found in zip((a, b), result.distributions or ()):
        text = found.warning(f"{'A' if w is a else 'B'} ({w.source})", tags=False)
        if text:
            warnings.append(text)
    return CompareResult(run, result, checks, warnings)

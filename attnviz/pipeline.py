"""One run of a variant, from file names to NumPy results, with no printing.

``prepare`` reads and checks everything with NumPy (inputs, labels, masks, shapes, option values)
so that a bad file fails fast, before TensorFlow is imported. ``execute`` computes on the chosen
device and adds the per-query statistics. The command line (and, later, batch jobs) call these two.

Two things every variant gets from ``execute`` without knowing:

* **Any number of leading axes.** TensorFlow's kernels stop at a rank (``tf.nn.softmax`` at 5-D,
  broadcasting binary ops at 5 axes), so inputs with more than ``MAX_LEAD`` leading (batch) axes
  are folded into one before ``compute`` and every result unfolded after: 6-D and 7-D ``q/k/v``
  give what the 4-D computation of each slice gives.
* **Overflow named.** Values that overflow the compute dtype (scores of huge inputs, float16
  products past 65504, integers near their limits) end in a ``NumericError`` that names the inputs
  to blame and what to do, never in NaN weights or an internal error.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from attnviz import blockwise
from attnviz import params as learned_params
from attnviz.blockwise import Streamed
from attnviz.captured import CaptureOptions
from attnviz.captured import prepare as prepare_captured
from attnviz.choices import CAUSAL_ALIGNS, DEVICES, KEYED_FORMATS, MASK_CONVENTIONS, MASK_KINDS
from attnviz.device import DTYPE_MAX, DTYPES, Device, resolve_device
from attnviz.errors import AttnvizError, InputError, ParamsError, ShapeError, UsageError
from attnviz.io import MEMORY, Loaded, StdinReader, load_array, load_labels, open_spec, shape_str
from attnviz.masks import Mask, Positional, build_mask, describe_rows, fully_masked_rows, key_padding_keep
from attnviz.run_options import ParamOptions, RunOptions
from attnviz.scoring import Logits, ModelScoring
from attnviz.stats import RowStats, fused_row_stats
from attnviz.storage import Place
from attnviz.subwords import Words
from attnviz.variants.base import Context, NumericError, Result, Variant, overflow_advice

#: leading (batch) axes passed to a variant as they are; more are folded into one ([batch, heads, L, d] is 2)
MAX_LEAD = 2
#: integers a dtype holds exactly (2**mantissa bits): larger ones are rounded when cast
EXACT_INTEGERS = {"float16": 2**11, "bfloat16": 2**8, "float32": 2**24, "float64": 2**53}


@dataclass(frozen=True)
class Magnitude:
    """How large an input's values are: what an overflow message names."""

    source: str  # "q.npy", "params.npz:W1"
    largest: float  # max |value|
    width: int  # the last dimension (what a dot product sums over)
    is_input: bool = True  # an input rather than a learned parameter


def largest_magnitude(arr: np.ndarray) -> float:
    """``max |arr|`` without a copy of the array and without integer overflow (``abs(int64 min)``)."""
    if arr.size == 0:
        return 0.0
    if arr.dtype.kind == "b":
        return float(bool(arr.any()))
    return max(abs(float(arr.min())), abs(float(arr.max())))


@dataclass
class Prepared:
    variant: Variant
    params: Any
    options: RunOptions
    inputs: dict[str, Loaded]
    weights_shape: tuple[int, ...]
    mask: Mask
    q_labels: list[str] | None
    k_labels: list[str] | None
    input_paths: list[Place]  # every file read, so that no output overwrites one
    warnings: list[str] = field(default_factory=list)
    learned: dict[str, np.ndarray] = field(default_factory=dict)
    learned_source: str | None = None  # "params.npz", "seed 0"
    seed: int = 0  # --seed, for variants that sample
    captured: dict[str, Any] = field(default_factory=dict)  # --layout, grouped heads, --rope: what was done
    #: the largest |value| of each input and of each parameter read from a file, to name overflows
    magnitudes: dict[str, Magnitude] = field(default_factory=dict)
    logits: Logits = field(default_factory=Logits)  # a model's softcap and sinks (attnviz.scoring)
    #: --merge-subwords: the words of the queries and of the keys (None on an axis without labels)
    words: tuple[Words | None, Words | None] | None = None

    def words_document(self) -> dict[str, Any] | None:
        if self.words is None:
            return None
        q, k = self.words
        either = q or k
        return {"style": either.style if either else None, "q": q.document() if q else None,
                "k": k.document() if k else None}

    @property
    def lead_names(self) -> tuple[str, ...]:
        """Names of the weights' last leading axes, for slice labels: the variant's, or those --layout gave."""
        layout = self.captured.get("layout")
        if layout:
            return tuple(a for a in layout["as"].split(",") if a not in ("seq", "d"))
        return self.variant.lead_names


@dataclass
class Outcome:
    prepared: Prepared
    result: Result
    stats: RowStats
    device: Device
    warnings: list[str]
    map_stats: dict[str, RowStats] = field(default_factory=dict)  # statistics of further distributions
    streamed: Streamed | None = None  # a blockwise run: no dense weights, see attnviz.blockwise
    notes: list[str] = field(default_factory=list)  # for the user, not warnings


def _choice(option: str, value: str, allowed: Sequence[str]) -> None:
    if value not in allowed:
        raise UsageError(f"{option} {value!r}: expected one of {', '.join(allowed)}.")


def _resolve_inputs(variant: Variant, specs: Sequence[str | None], stdin: StdinReader) -> dict[str, Loaded]:
    names = [i.name for i in variant.inputs]
    given = [s for s in specs if s is not None]
    if not given:
        raise UsageError(f"{variant.name} needs {' '.join(n.upper() for n in names)}.")
    if len(given) > len(names):
        raise UsageError(f"{variant.name} takes at most {len(names)} inputs; received {len(given)}.")
    opened = [open_spec(s, stdin) for s in given]
    required = [i.name for i in variant.inputs if not i.optional]
    if len(given) == 1 and len(names) > 1:
        bundle = opened[0].bundle(required, optional=[n for n in names if n not in required])
        if bundle is not None:
            return bundle
    if len(given) < len(required):
        listed = ", ".join(required)
        raise UsageError(
            f"{variant.name} needs {' '.join(n.upper() for n in required)}: {len(required)} files, or one "
            f"file ({KEYED_FORMATS}) holding arrays named {listed}; received {' '.join(given)}."
        )
    result: dict[str, Loaded] = {}
    for spec, o in zip(variant.inputs, opened):
        special = spec.reader(o) if spec.reader is not None else None
        if special is not None:
            result.update(special)
        else:
            result[spec.name] = o.array()
    return result


def _labels(option: str, spec: str | None, fallback: list[str] | None, count: int, axis: str,
            paths: list[Place]) -> list[str] | None:
    if spec is None:
        labels, how = fallback, "the input file"
    else:
        labels, path, how = load_labels(spec)
        if path is not None:
            paths.append(path)
    if labels is not None and len(labels) != count:
        where = f"{option} ({how})" if spec is not None else "labels in the input file"
        raise InputError(f"{where}: {len(labels)} labels for {count} {axis}; the counts must match.")
    return labels


def prepare(variant: Variant, specs: Sequence[str | None], options: RunOptions, params: Any,
            stdin: StdinReader | None = None, param_options: ParamOptions | None = None,
            capture: CaptureOptions | None = None) -> Prepared:
    """Read and check every input of a run; NumPy only."""
    param_options = param_options or ParamOptions()
    _choice("--mask-convention", options.mask_convention, MASK_CONVENTIONS)
    _choice("--mask-kind", options.mask_kind, MASK_KINDS)
    _choice("--causal-align", options.causal_align, CAUSAL_ALIGNS)
    _choice("--dtype", options.dtype, DTYPES)
    _choice("--device", options.device, DEVICES)
    blockwise.parse_size(options.max_memory)
    if options.labels is not None and (options.q_labels or options.k_labels):
        raise UsageError("--labels sets both axes; give it alone, or --q-labels and --k-labels.")
    stdin = stdin or StdinReader()

    inputs = _resolve_inputs(variant, specs, stdin)
    captured: dict[str, Any] = {}
    capture_paths: list[Place] = []
    scoring = ModelScoring()
    if variant.captured_qkv:
        captured, scoring = prepare_captured(inputs, capture or CaptureOptions(), stdin, capture_paths)
        _apply_scale(variant, params, scoring)
    given, given_path = None, None
    external = variant.external_params(params) if variant.external_params else None
    chosen = [option for option, value in (("--params", param_options.params), ("--seed", param_options.seed))
              if value is not None]
    if external is not None:
        chosen.append(external[2])
    if len(chosen) > 1 and not (variant.seeds_samples and chosen == ["--params", "--seed"]):
        raise UsageError(f"{' and '.join(chosen)} both say where the parameters come from; give one.")
    if variant.learned and param_options.params is not None:
        given, given_path = learned_params.read(param_options.params)
    elif external is not None:
        given, given_path = external[0], external[1]
    problem = variant.check(inputs, params, given)
    shape = problem.weights_shape
    learned: dict[str, np.ndarray] = {}
    learned_source = None
    if variant.learned:
        if given is not None:
            learned_source = str(given_path)
            learned = learned_params.check(given, problem.specs, learned_source)
        else:
            seed = param_options.seed if param_options.seed is not None else 0
            learned = learned_params.draw(problem.specs, seed)
            learned_source = f"seed {seed}" if problem.specs else None
    magnitudes, range_warnings = _check_range(inputs, learned if given is not None else {}, given_path,
                                              options.dtype)
    paths = [lo.path for lo in inputs.values() if lo.path is not None] + list(problem.files) + capture_paths
    if given_path is not None and not (param_options.params or "").startswith(MEMORY):
        paths.append(given_path)
    arrays = {n: lo for n, lo in inputs.items() if not n.endswith("_labels") and n != "mask"}

    lq, lk = shape[-2], shape[-1]
    q_in, k_in = inputs.get(variant.query_input), inputs.get(variant.key_input)
    bundle_q, bundle_k = inputs.get("q_labels"), inputs.get("k_labels")
    q_fallback = (bundle_q.labels if bundle_q else None) or (q_in.labels if q_in else None)
    k_fallback = (bundle_k.labels if bundle_k else None) or (k_in.labels if k_in else None)
    q_spec, k_spec = options.q_labels or options.labels, options.k_labels or options.labels
    if not variant.query_input:  # one learned query (pooling): --labels names the keys only
        q_spec = options.q_labels
    elif options.labels is not None and lq != lk:
        raise UsageError(
            f"--labels labels both axes, but there are {lq} queries and {lk} keys; "
            "use --q-labels and --k-labels."
        )
    q_labels = _labels("--q-labels" if options.q_labels else "--labels", q_spec, q_fallback, lq,
                       "queries (Lq)", paths)
    k_labels = _labels("--k-labels" if options.k_labels else "--labels", k_spec, k_fallback, lk,
                       "keys (Lk)", paths)
    words = None
    if options.merge_subwords:
        from attnviz.subwords import check_labels
        from attnviz.subwords import words as word_spans

        check_labels(q_labels, k_labels)
        q_words = word_spans(q_labels, options.subword_style) if q_labels is not None else None
        k_words = q_words if k_labels == q_labels else \
            word_spans(k_labels, options.subword_style) if k_labels is not None else None
        words = (q_words, k_words)

    mask_loaded = inputs.get("mask")
    if options.mask is not None:
        mask_loaded = load_array(options.mask, stdin, allow_neg_inf=options.mask_kind == "additive")
        if mask_loaded.path is not None:
            paths.append(mask_loaded.path)
    padding = None
    if options.key_padding_mask is not None:
        padding = load_array(options.key_padding_mask, stdin)
        if padding.path is not None:
            paths.append(padding.path)
    causal_align = options.causal_align if options.causal or not scoring.causal else "bottom-right"
    mask = build_mask(shape, mask=mask_loaded, convention=options.mask_convention, kind=options.mask_kind,
                      key_padding=padding, causal=options.causal or scoring.causal, causal_align=causal_align,
                      mask_shape=problem.mask_shape)
    if scoring.positional or scoring.logits:
        mask.positional = _positional(variant, scoring, shape, padding, options.mask_convention)
    if problem.keep is not None:
        mask.keep = problem.keep if mask.keep is None else np.logical_and(mask.keep, problem.keep)
        mask.described.append(problem.keep_described)

    warnings = list(range_warnings)
    rows = fully_masked_rows(mask, shape)
    if len(rows):
        warnings.append(
            f"{len(rows)} query row(s) have every key masked; their weights and output are all zero: "
            f"{'rows' if len(rows) > 1 else 'row'} {describe_rows(rows)}."
        )
    return Prepared(variant, params, options, arrays, shape, mask, q_labels, k_labels, paths, warnings,
                    learned, learned_source, param_options.seed or 0, captured, magnitudes, scoring.logits, words)


#: the variants whose scores go through the softmax of ``attnviz.variants.base`` as they are: a
#: softcap and sinks (``Logits``) act there
SOFTMAX_SCORES = ("scaled", "dot", "general", "local")


def _apply_scale(variant: Variant, params: Any, scoring: ModelScoring) -> None:
    """A config's scale becomes the variant's ``--scale`` unless one was given."""
    if scoring.scale is None:
        return
    if not hasattr(params, "scale"):
        raise UsageError(f"--hf-config gives a scale, but {variant.name} has no --scale; use scaled.")
    if params.scale is None:
        params.scale = scoring.scale
    else:
        scoring.described["scale"] = params.scale
        scoring.described["scale_from"] = "--scale"


def _positional(variant: Variant, scoring: ModelScoring, shape: tuple[int, ...], padding: Loaded | None,
                convention: str) -> Positional | None:
    """The model's windows, chunks and position biases as the run's ``Positional`` mask; the head count
    of per-head parts checked against the weights."""
    heads = scoring.per_head
    if heads is not None and (len(shape) < 3 or shape[-3] != heads):
        raise ShapeError(f"the weights {shape_str(shape)} need a head axis of {heads} at -3 for the per-head "
                         "ALiBi slopes, sinks or T5 bias; give Q, K and V as [batch, heads, L, d] (or --layout).")
    if scoring.logits and variant.name not in SOFTMAX_SCORES:
        raise UsageError(f"--softcap and --sinks act on a softmax of dot-product scores: "
                         f"{', '.join(SOFTMAX_SCORES)}; not {variant.name}.")
    if not scoring.positional:
        return None
    shift = None
    if (scoring.chunk is not None or scoring.alibi_keys) and padding is not None:
        keep = key_padding_keep(padding, convention, shape)  # [..., 1, Lk]
        first = np.where(keep.any(axis=-1), np.argmax(keep, axis=-1), keep.shape[-1])
        shift = first[..., None]  # [..., 1, 1]: the left padding of each sequence
    lq, lk = shape[-2], shape[-1]
    return Positional(lq, lk, lk - lq, scoring.band, scoring.chunk, shift, scoring.alibi, scoring.alibi_keys,
                      scoring.scale or 1.0 if scoring.alibi_keys else 1.0, scoring.relative)


def _check_range(inputs: Mapping[str, Loaded], learned: Mapping[str, np.ndarray], params_path: Place | None,
                 dtype: str) -> tuple[dict[str, Magnitude], list[str]]:
    """Every input (and parameter from a file) must fit the compute dtype: a value past its range
    would be infinite once cast. Integers past what the dtype holds exactly are rounded: a warning.
    Returns the magnitudes, for messages about overflow later, and the warnings."""
    limit = DTYPE_MAX[dtype]
    exact = EXACT_INTEGERS[dtype]
    magnitudes: dict[str, Magnitude] = {}
    warnings: list[str] = []
    for name, loaded in inputs.items():
        if name.endswith("_labels") or name == "mask" or loaded.data.dtype.kind not in "biuf":
            continue
        largest = largest_magnitude(loaded.data)
        if largest > limit:
            raise InputError(
                f"{loaded.source}: values up to {largest:.4g} exceed the {dtype} range (±{limit:.4g}); "
                f"{'rescale the input' if dtype == 'float64' else 'use --dtype float64 or rescale the input'}."
            )
        if loaded.data.dtype.kind in "iu" and largest > exact:
            wider = "; --dtype float64 keeps them exact up to 2**53." if dtype != "float64" else "."
            warnings.append(f"{loaded.source}: integers up to {largest:.4g} are rounded in {dtype} (exact up to "
                            f"2**{int(math.log2(exact))}){wider}")
        width = int(loaded.data.shape[-1]) if loaded.data.ndim else 1
        magnitudes[name] = Magnitude(str(loaded.source), largest, width)
    for key, arr in learned.items():
        largest = largest_magnitude(np.asarray(arr))
        source = f"{params_path}:{key}" if params_path is not None else key
        if largest > limit:
            raise ParamsError(f"{source}: values up to {largest:.4g} exceed the {dtype} range (±{limit:.4g}); "
                              "use --dtype float64 or rescale the parameters.")
        width = int(arr.shape[0]) if arr.ndim else 1  # x @ W sums over W's first axis
        magnitudes[f"param:{key}"] = Magnitude(source, largest, width, is_input=False)
    return magnitudes, warnings


def execute(prep: Prepared, save_weights: Path | None = None, reduce: str = "mean") -> Outcome:
    """Compute the variant with TensorFlow on the chosen device; add statistics.

    When the dense weights would not fit in ``--max-memory`` and the variant allows it, the work
    runs in blocks of query rows (``attnviz.blockwise``); ``save_weights`` is then written while
    computing, and ``reduce`` aggregates the heatmaps. Either way the variant's ``compute`` is
    wrapped (``guarded``): leading axes folded past ``MAX_LEAD``, overflow named."""
    device = resolve_device(prep.options.device)
    ctx = Context(device, prep.options.dtype, seed=prep.seed, logits=prep.logits if prep.logits else None)
    arrays = {n: lo.data for n, lo in prep.inputs.items()}
    variant = guarded(prep, arrays)
    budget = blockwise.parse_size(prep.options.max_memory)
    if not (prep.variant.blockwise and blockwise.needs_blocks(prep.weights_shape, budget)):
        prep.mask = prep.mask.materialized()  # the dense path holds [Lq, Lk] anyway
    elif prep.words is not None:
        raise UsageError(f"--merge-subwords merges the whole weights {shape_str(prep.weights_shape)}, which need more "
                         "than --max-memory; give a larger --max-memory.")
    else:
        try:
            result, stats, streamed = blockwise.run(variant, ctx, arrays, prep.mask, prep.params, prep.learned,
                                                    prep.weights_shape, budget, reduce, save_weights)
        except NumericError as exc:  # weights found not finite by their statistics: name the inputs to blame
            raise NumericError(overflow_message(prep, exc.stage), exc.stage) from None
        note = (f"weights {shape_str(prep.weights_shape)} computed in {streamed.blocks} blocks of "
                f"{streamed.rows_per_block} query rows to stay within --max-memory")
        return Outcome(prep, result, stats, device, [*prep.warnings, *result.warnings], {}, streamed, [note])
    result = variant.compute(ctx, arrays, prep.mask, prep.params, prep.learned)
    if result.weights.shape != prep.weights_shape:  # a variant bug, not a user error
        raise ShapeError(
            f"{prep.variant.name}: computed weights of shape {shape_str(result.weights.shape)}, "
            f"expected {shape_str(prep.weights_shape)}."
        )
    if result.keep is not None:
        prep.mask.keep = result.keep
    if prep.words is not None:
        _merge_words(prep, result)
    with np.errstate(all="ignore"):
        stats = fused_row_stats(result.weights, prep.mask.keep)
        if not weights_finite(stats):
            raise NumericError(overflow_message(prep, "the weights"), "the weights")
        extra = {view.name: fused_row_stats(result.maps[view.name], prep.mask.keep)
                 for view in result.views if view.stats}
    return Outcome(prep, result, stats, device, [*prep.warnings, *result.warnings], extra)


def _merge_words(prep: Prepared, result: Result) -> None:
    """--merge-subwords: the weights, their mask and labels over words (``attnviz.subwords``); the
    output stays per token."""
    from attnviz.subwords import merge, merge_keep

    assert prep.words is not None
    q, k = prep.words
    if result.maps:
        raise UsageError(f"--merge-subwords: {prep.variant.name} shows further maps beside the weights, which have "
                         "no words; leave it out here.")
    result.weights = merge(result.weights, q, k)
    keep = prep.mask.keep
    if keep is not None:
        keep = merge_keep(np.broadcast_to(keep, prep.weights_shape[:-2] + keep.shape[-2:]), q, k)
    prep.mask = Mask(keep, None, prep.mask.described)
    prep.weights_shape = tuple(result.weights.shape)
    prep.q_labels = q.labels if q is not None else prep.q_labels
    prep.k_labels = k.labels if k is not None else prep.k_labels


def weights_finite(stats: RowStats) -> bool:
    """Whether the weights the statistics were taken from are finite: a NaN or an infinity in a row
    makes its sum NaN or infinite (finite float32 weights never sum past float64's range), so the
    weights need no pass of their own."""
    return bool(np.isfinite(stats.row_sum).all())


# ----------------------------------------------------------------------------------------------
# What every variant's compute gets: folded leading axes, finite results, overflow named

Compute = Callable[..., Result]


def guarded(prep: Prepared, arrays: Mapping[str, np.ndarray]) -> Variant:
    """``prep.variant`` with its ``compute`` wrapped: inputs with more than ``MAX_LEAD`` leading
    axes folded into one and the results unfolded (``Fold``); results checked to be finite; an
    overflow (``NumericError``, or any failure when the inputs are large enough to overflow)
    reported naming the inputs."""
    fold = Fold.plan(prep.variant, arrays, prep.weights_shape)
    inner = prep.variant.compute

    def compute(ctx: Context, arrays: Mapping[str, np.ndarray], mask: Mask, params: Any,
                learned: Mapping[str, np.ndarray]) -> Result:
        try:
            with np.errstate(all="ignore"):  # NumPy's RuntimeWarnings are not for users; results are checked
                if fold is None:
                    result = inner(ctx, arrays, mask, params, learned)
                else:
                    result = fold.restore(inner(ctx, *fold.apply(arrays, mask, params), learned))
                check_finite(result, ctx.dtype, weights=False)  # the weights: by their statistics
        except NumericError as exc:
            raise NumericError(overflow_message(prep, exc.stage), exc.stage) from None
        except AttnvizError as exc:
            if "non-finite" not in exc.message:  # from finite inputs, only an overflow makes non-finite values
                raise
            raise NumericError(overflow_message(prep, "the result"), "the result") from None
        except Exception:
            if not may_overflow(prep):
                raise
            raise NumericError(overflow_message(prep, "the computation"), "the computation") from None
        return result

    return dataclasses.replace(prep.variant, compute=compute)


def check_finite(result: Result, dtype: str, weights: bool = True) -> None:
    """The weights and output are finite, and no further map holds NaN (a map may hold -inf where
    it is masked): anything else overflowed, and the first of these that did is named.

    ``weights=False`` leaves the weights (the one large array) to their statistics
    (``weights_finite``), unless the output or a map failed: then they are checked here first."""

    def bad(arr: np.ndarray | None) -> bool:
        return arr is not None and arr.dtype.kind == "f" and arr.size > 0 and not np.isfinite(arr).all()

    if weights and bad(result.weights):
        raise NumericError(f"the weights overflowed {dtype}.", "the weights")
    failed = ("the output", "the output") if bad(result.output) else None
    for name, arr in result.maps.items():
        if failed is None and isinstance(arr, np.ndarray) and arr.dtype.kind == "f" and np.isnan(arr).any():
            failed = (f"the map {name!r}", f"the map {name!r}")
    if failed is not None:
        if not weights and bad(result.weights):
            raise NumericError(f"the weights overflowed {dtype}.", "the weights")
        raise NumericError(f"{failed[0]} overflowed {dtype}.", failed[1])


def _pair_bound(magnitudes: Mapping[str, Magnitude]) -> float:
    """A bound on a dot product of two of the arrays: the two largest magnitudes times the widest d."""
    top = sorted((m.largest for m in magnitudes.values()), reverse=True)[:2]
    if not top:
        return 0.0
    width = max(m.width for m in magnitudes.values())
    return top[0] * (top[1] if len(top) > 1 else top[0]) * width


def may_overflow(prep: Prepared) -> bool:
    """Whether products of the inputs (and parameters) could pass the compute dtype's range."""
    return _pair_bound(prep.magnitudes) > DTYPE_MAX[prep.options.dtype] or bool(_culprits(prep))


def _culprits(prep: Prepared) -> list[Magnitude]:
    """The arrays large enough to overflow a dot product with an array like themselves: ``m^2 d``
    past the dtype's largest value."""
    limit = DTYPE_MAX[prep.options.dtype]
    return [m for m in prep.magnitudes.values() if m.largest * m.largest * max(m.width, 1) > limit]


def overflow_message(prep: Prepared, stage: str) -> str:
    """One line: what overflowed, which inputs hold the values to blame, and what to do."""
    dtype = prep.options.dtype
    limit = DTYPE_MAX[dtype]
    culprits = _culprits(prep)
    if culprits:
        named = [f"{m.source} (values up to {m.largest:.3g})" for m in culprits]
        why = f"{_join(named)} {'is' if len(named) == 1 else 'are'} too large for products in {dtype}"
    else:  # no single input is to blame: their products, or a scale, took the scores past the range
        ranked = sorted(prep.magnitudes.values(), key=lambda m: -m.largest)[:4]
        named = [f"{m.source} (up to {m.largest:.3g})" for m in ranked]
        why = f"from {_join(named)}" if named else ""
        scale = getattr(prep.params, "scale", None)
        if isinstance(scale, (int, float)) and not isinstance(scale, bool) and abs(scale) > 1:
            why += f" with --scale {scale:g}"
    return (f"{stage} overflowed {dtype} (largest finite value {limit:.4g}){': ' + why if why else ''}; "
            f"{overflow_advice(dtype)}.")


def _join(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


@dataclass(frozen=True)
class Fold:
    """Leading (batch) axes ``lead`` folded into one of ``size`` for a variant's ``compute``.

    Each input's batch axes are those before its ``core`` trailing axes (``InputSpec.core``); masks
    and array parameters broadcast to the weights, whose batch axes come before ``weights_core``.
    An array whose batch axes are all 1 keeps one axis of 1 (it still broadcasts); one that is
    broadcast along some batch axes is expanded first (a copy: folding needs a single stride)."""

    lead: tuple[int, ...]
    cores: dict[str, int]
    weights_core: int

    @property
    def size(self) -> int:
        return math.prod(self.lead)

    @classmethod
    def plan(cls, variant: Variant, arrays: Mapping[str, np.ndarray],
             weights_shape: tuple[int, ...]) -> Fold | None:
        """The fold of a run, or None when its leading axes are few enough to pass as they are."""
        declared = {spec.name: spec.core for spec in variant.inputs}
        cores: dict[str, int] = {}
        leads = []
        for name, arr in arrays.items():
            core = declared.get(name) or max(2, arr.ndim - len(weights_shape) + 2)
            if arr.ndim < core:
                return None
            cores[name] = core
            leads.append(arr.shape[:arr.ndim - core])
        try:
            lead = tuple(int(n) for n in np.broadcast_shapes(*leads))
        except ValueError:
            return None
        if len(lead) <= MAX_LEAD or tuple(weights_shape[:len(lead)]) != lead:
            return None
        return cls(lead, cores, len(weights_shape) - len(lead))

    def fold(self, arr: np.ndarray, core: int) -> np.ndarray:
        batch = arr.ndim - core
        if batch <= 0:
            return arr  # no batch axes: it broadcasts over all of them
        rest = arr.shape[batch:]
        if all(n == 1 for n in arr.shape[:batch]):
            return arr.reshape((1, *rest))
        if tuple(arr.shape[:batch]) != self.lead:
            arr = np.broadcast_to(arr, (*self.lead, *rest))
        return arr.reshape((self.size, *rest))

    def unfold(self, arr: Any) -> Any:
        if not isinstance(arr, np.ndarray) or arr.ndim < 1 or arr.shape[0] not in (self.size, 1):
            return arr
        lead = self.lead if arr.shape[0] == self.size else (1,) * len(self.lead)
        return arr.reshape((*lead, *arr.shape[1:]))

    def apply(self, arrays: Mapping[str, np.ndarray], mask: Mask,
              params: Any) -> tuple[dict[str, np.ndarray], Mask, Any]:
        """Inputs, mask and array parameters (which broadcast to the weights), folded."""
        folded = {name: self.fold(arr, self.cores.get(name, 2)) for name, arr in arrays.items()}
        w = self.weights_core
        mask = dataclasses.replace(mask, keep=None if mask.keep is None else self.fold(mask.keep, w),
                                   bias=None if mask.bias is None else self.fold(mask.bias, w))
        if dataclasses.is_dataclass(params) and not isinstance(params, type):
            changes = {f.name: self.fold(value, w) for f in dataclasses.fields(params)
                       if isinstance(value := getattr(params, f.name), np.ndarray)}
            if changes:
                params = dataclasses.replace(params, **changes)
        return folded, mask, params

    def restore(self, result: Result) -> Result:
        """A result of the folded computation with the leading axes back."""
        return dataclasses.replace(
            result, weights=self.unfold(result.weights), output=self.unfold(result.output),
            maps={name: self.unfold(arr) for name, arr in result.maps.items()}, keep=self.unfold(result.keep))

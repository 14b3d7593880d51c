"""One run of a variant, from file names to NumPy results, with no printing.

``prepare`` reads and checks everything with NumPy (inputs, labels, masks, shapes, option values)
so that a bad file fails fast, before TensorFlow is imported. ``execute`` computes on the chosen
device and adds the per-query statistics. The command line (and, later, batch jobs) call these two.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from attnviz import blockwise
from attnviz import params as learned_params
from attnviz.blockwise import Streamed
from attnviz.captured import CaptureOptions
from attnviz.captured import prepare as prepare_captured
from attnviz.choices import CAUSAL_ALIGNS, DEVICES, MASK_CONVENTIONS, MASK_KINDS
from attnviz.device import DTYPE_MAX, DTYPES, Device, resolve_device
from attnviz.errors import InputError, ShapeError, UsageError
from attnviz.io import Loaded, StdinReader, load_array, load_labels, open_spec, shape_str
from attnviz.masks import Mask, build_mask, describe_rows, fully_masked_rows
from attnviz.stats import RowStats, row_stats
from attnviz.variants._base import Context, Result, Variant


@dataclass
class RunOptions:
    """The options every compute command shares."""

    mask: str | None = None
    mask_convention: str = "keep"
    mask_kind: str = "bool"
    key_padding_mask: str | None = None
    causal: bool = False
    causal_align: str = "top-left"
    labels: str | None = None
    q_labels: str | None = None
    k_labels: str | None = None
    device: str = "auto"
    dtype: str = "float32"
    max_memory: str | None = None  # for the weights while computing; past it, blocks of query rows


@dataclass
class ParamOptions:
    """Where a variant's learned parameters come from (variants with ``learned=True`` only)."""

    params: str | None = None  # a .npz file
    seed: int | None = None  # draw them; 0 when neither is given
    save_params: str | None = None


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
    input_paths: list[Path]  # every file read, so that no output overwrites one
    warnings: list[str] = field(default_factory=list)
    learned: dict[str, np.ndarray] = field(default_factory=dict)
    learned_source: str | None = None  # "params.npz", "seed 0"
    seed: int = 0  # --seed, for variants that sample
    captured: dict[str, Any] = field(default_factory=dict)  # --layout, grouped heads, --rope: what was done

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
            f"file (.npz, .safetensors, .h5, .pt, JSON) holding arrays named {listed}; received {' '.join(given)}."
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
            paths: list[Path]) -> list[str] | None:
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
    capture_paths: list[Path] = []
    if variant.captured_qkv:
        captured = prepare_captured(inputs, capture or CaptureOptions(), stdin, capture_paths)
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
    limit = DTYPE_MAX[options.dtype]
    for loaded in inputs.values():
        largest = float(np.abs(loaded.data).max()) if loaded.data.size else 0.0
        if largest > limit:
            raise InputError(
                f"{loaded.source}: values up to {largest:g} exceed the {options.dtype} range (±{limit:g}); "
                "use a wider --dtype."
            )
    paths = [lo.path for lo in inputs.values() if lo.path is not None] + list(problem.files) + capture_paths
    if given_path is not None:
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
    mask = build_mask(shape, mask=mask_loaded, convention=options.mask_convention, kind=options.mask_kind,
                      key_padding=padding, causal=options.causal, causal_align=options.causal_align,
                      mask_shape=problem.mask_shape)
    if problem.keep is not None:
        mask.keep = problem.keep if mask.keep is None else np.logical_and(mask.keep, problem.keep)
        mask.described.append(problem.keep_described)

    warnings = []
    rows = fully_masked_rows(mask, shape)
    if len(rows):
        warnings.append(
            f"{len(rows)} query row(s) have every key masked; their weights and output are all zero: "
            f"{'rows' if len(rows) > 1 else 'row'} {describe_rows(rows)}."
        )
    return Prepared(variant, params, options, arrays, shape, mask, q_labels, k_labels, paths, warnings,
                    learned, learned_source, param_options.seed or 0, captured)


def execute(prep: Prepared, save_weights: Path | None = None, reduce: str = "mean") -> Outcome:
    """Compute the variant with TensorFlow on the chosen device; add statistics.

    When the dense weights would not fit in ``--max-memory`` and the variant allows it, the work
    runs in blocks of query rows (``attnviz.blockwise``); ``save_weights`` is then written while
    computing, and ``reduce`` aggregates the heatmaps."""
    device = resolve_device(prep.options.device)
    ctx = Context(device, prep.options.dtype, seed=prep.seed)
    arrays = {n: lo.data for n, lo in prep.inputs.items()}
    budget = blockwise.parse_size(prep.options.max_memory)
    if not (prep.variant.blockwise and blockwise.needs_blocks(prep.weights_shape, budget)):
        prep.mask = prep.mask.materialized()  # the dense path holds [Lq, Lk] anyway
    else:
        result, stats, streamed = blockwise.run(prep.variant, ctx, arrays, prep.mask, prep.params, prep.learned,
                                                prep.weights_shape, budget, reduce, save_weights)
        note = (f"weights {shape_str(prep.weights_shape)} computed in {streamed.blocks} blocks of "
                f"{streamed.rows_per_block} query rows to stay within --max-memory")
        return Outcome(prep, result, stats, device, [*prep.warnings, *result.warnings], {}, streamed, [note])
    result = prep.variant.compute(ctx, arrays, prep.mask, prep.params, prep.learned)
    if result.weights.shape != prep.weights_shape:  # a variant bug, not a user error
        raise ShapeError(
            f"{prep.variant.name}: computed weights of shape {shape_str(result.weights.shape)}, "
            f"expected {shape_str(prep.weights_shape)}."
        )
    if result.keep is not None:
        prep.mask.keep = result.keep
    stats = row_stats(result.weights, prep.mask.keep)
    extra = {view.name: row_stats(result.maps[view.name], prep.mask.keep) for view in result.views if view.stats}
    return Outcome(prep, result, stats, device, [*prep.warnings, *result.warnings], extra)

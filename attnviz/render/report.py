"""The JSON document of a run (``--json``): one object, documented in docs/output.md.

Arrays are nested lists; undefined statistics (those of fully masked rows) are ``null``; the
document never holds NaN or Infinity.
"""

from __future__ import annotations

import json
import math
from typing import TYPE_CHECKING, Any

import numpy as np

from attnviz import __version__
from attnviz.inspection.checks import CheckResult
from attnviz.inspection.compare import Comparison
from attnviz.inspection.heads import HEAD_STATS
from attnviz.inspection.weights import RENORMALISED, Weights
from attnviz.pipeline import Outcome
from attnviz.stats import RowStats

if TYPE_CHECKING:
    from attnviz.inspection.compare import CompareResult, CompareRun
    from attnviz.inspection.inspecting import InspectResult
    from attnviz.inspection.rollout import RolloutRun

#: past this many values the weights are not written into the JSON document (--save-weights is for that)
JSON_WEIGHTS_LIMIT = 4_000_000


def plain(value: Any) -> Any:
    """NumPy values as JSON-ready Python values, NaN as None."""
    if isinstance(value, np.ndarray):
        if value.dtype.kind in "biu" or (value.dtype.kind == "f" and np.isfinite(value).all()):
            return value.tolist()  # nothing to clean: the fast path for the big arrays
        return plain(value.tolist())
    if isinstance(value, np.generic):
        return plain(value.item())
    if isinstance(value, float):
        return None if math.isnan(value) or math.isinf(value) else value
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return value


def _null_where(values: np.ndarray, undefined: np.ndarray) -> np.ndarray:
    """``values`` with None where ``undefined`` (an object array, for JSON)."""
    out = values.astype(object)
    out[undefined] = None
    return out


def stats_document(stats: RowStats) -> dict[str, Any]:
    return {
        "entropy": stats.entropy,
        "entropy_normalized": stats.entropy_norm,
        "max": stats.max,
        "argmax": _null_where(stats.argmax, stats.masked),
        "top_k": {"index": stats.top_index, "weight": stats.top_weight},
        "row_sum": stats.row_sum,
        "unmasked_keys": stats.n_keys,
        "support": stats.support,
        "fully_masked": stats.masked,
    }


def build_report(outcome: Outcome, files: dict[str, str] | None = None) -> dict[str, Any]:
    prep, result = outcome.prepared, outcome.result
    size = math.prod(prep.weights_shape)
    omit = None
    if outcome.streamed is not None or size > JSON_WEIGHTS_LIMIT:
        omit = (f"the weights ({size} values) are left out of the JSON document; use --save-weights FILE.npy "
                f"for them (the document holds them up to {JSON_WEIGHTS_LIMIT} values)")
    return plain({
        "attnviz": __version__,
        "variant": prep.variant.name,
        "device": outcome.device.name,
        "dtype": prep.options.dtype,
        "inputs": {name: list(lo.data.shape) for name, lo in prep.inputs.items()},
        "params": result.params,
        **({"captured": prep.captured} if prep.captured else {}),
        "mask": prep.mask.described,
        "labels": {"q": prep.q_labels, "k": prep.k_labels},
        **({"words": prep.words_document()} if prep.words is not None else {}),
        "weights": None if omit else result.weights,
        "weights_shape": list(prep.weights_shape),
        "output": result.output,
        "output_shape": list(result.output.shape) if result.output is not None else None,
        "maps": {name: {"shape": list(m.shape), "data": m} for name, m in result.maps.items()},
        "stats": stats_document(outcome.stats),
        "map_stats": {name: stats_document(s) for name, s in outcome.map_stats.items()},
        "learned_params": None if prep.learned_source is None else {
            "source": prep.learned_source, "shapes": {k: list(v.shape) for k, v in prep.learned.items()}},
        "warnings": outcome.warnings + ([omit] if omit else []),
        "files": files or {},
    })


def _checks(checks: list[CheckResult]) -> list[dict[str, Any]]:
    return [{"name": c.name, "passed": c.passed, "failures": c.failures, "worst": c.worst or None, **c.detail}
            for c in checks]


def inspect_report(w: Weights, stats: dict[str, np.ndarray], rows: RowStats, index: tuple[int, int, int],
                   checks: list[CheckResult], files: dict[str, str], q_labels: list[str] | None,
                   k_labels: list[str] | None, *, warnings: list[str] | None = None, mask: list[str] | None = None,
                   padded: np.ndarray | None = None, padded_rows: int = 0, notes: list[str] | None = None,
                   received: dict[str, Any] | None = None, words: dict[str, Any] | None = None) -> dict[str, Any]:
    """The JSON document of ``attnviz inspect``: per-head statistics, the selected map's per-query
    statistics and the checks (the weights themselves are the input, so they are not repeated).
    ``padded``: the selected map's padded query rows; their statistics (but ``top_k``) are ``null``."""
    from attnviz.inspection.tags import tags_document
    from attnviz.statistics import WEIGHTS, tag_rules

    layers, heads = stats["entropy"].shape
    token_stats = [k for k in ("induction", "duplicate") if k in stats]  # only when the tokens were given
    head_rows = [{"layer": li, "head": hi, **{k: float(stats[k][li, hi]) for k in (*HEAD_STATS, *token_stats)},
                  "rows": int(stats["rows"][li, hi]) if "rows" in stats else None,
                  **({"token_rows": int(stats["token_rows"][li, hi])} if "token_rows" in stats else {}),
                  **({"sink_rate": float(stats["sink_rate"][li, hi])} if "sink_rate" in stats else {}),
                  "tag": str(stats["tag"][li, hi]) or None} for li in range(layers) for hi in range(heads)]
    per_query = stats_document(rows)
    if padded is not None:
        for name in ("entropy", "entropy_normalized", "max", "argmax", "row_sum"):
            per_query[name] = _null_where(np.asarray(per_query[name]), padded)
    per_query["padded"] = padded if padded is not None else np.zeros(rows.entropy.shape, dtype=bool)
    return plain({
        "attnviz": __version__,
        "command": "inspect",
        "source": w.source,
        "file_shape": list(w.file_shape),
        "stored_dtype": w.stored_dtype,
        "layout": list(w.layout),
        "layers_from_keys": (w.keys or None) if w.generation is None else None,
        **({"generation": w.generation.document()} if w.generation is not None else {}),
        **({"weighed_by": w.weighed, "statistics_of": RENORMALISED} if w.renormalised else {}),
        "weights_shape": list(w.shape),
        "selected": dict(zip(("layer", "batch", "head"), index)),
        "labels": {"q": q_labels, "k": k_labels},
        **({"words": words} if words is not None else {}),
        "mask": mask or [],
        "padded_rows": padded_rows,
        "head_stats": head_rows,
        "tags": tags_document(stats["tag"], list(range(layers)), tag_rules(WEIGHTS)),
        "received": received,
        "notes": notes or [],
        "stats": per_query,
        "checks": _checks(checks),
        "warnings": warnings or [],
        "files": files,
    })


def compare_report(a: Weights, b: Weights, result: Comparison, checks: list[CheckResult],
                   files: dict[str, str], *, warnings: list[str] | None = None,
                   mask: list[str] | None = None) -> dict[str, Any]:
    """The JSON document of ``attnviz compare``; padded rows are left out of every figure (their
    ``per_row`` divergence is ``null``)."""
    return plain({
        "attnviz": __version__,
        "command": "compare",
        "a": a.source,
        "b": b.source,
        "weights_shape": list(a.shape),
        "max_abs_diff": result.max_abs,
        "mean_abs_diff": result.mean_abs,
        "js_divergence": {"mean": result.js_mean, "max": result.js_max, "per_row": result.js},
        "argmax_agreement": result.argmax_agree,
        "worst_rows": result.worst_rows,
        "heads_changed": result.heads,
        "mask": mask or [],
        "rows_compared": result.rows,
        "padded_rows": result.padded_rows,
        "checks": _checks(checks),
        "warnings": warnings or [],
        "files": files,
    })


def to_json(doc: dict[str, Any]) -> str:
    return json.dumps(doc, allow_nan=False)


def inspect_document(result: InspectResult, files: dict[str, str]) -> dict[str, Any]:
    """``inspect``'s JSON document of an analysed run (``attnviz.inspection.inspecting.analyse``)."""
    opened = result.opened
    assert result.rows is not None  # analysed with row_stats
    doc = inspect_report(opened.weights, result.stats, result.rows, opened.index, result.checks, files,
                         opened.q_labels, opened.k_labels, warnings=result.warnings, mask=opened.masks.described,
                         padded=result.one_padded, padded_rows=result.padded, notes=result.notes,
                         received=result.received, words=opened.words)
    per_entry = opened.labels.document()
    if per_entry is not None:  # each batch entry's own labels ("labels": the shown entry's)
        doc["labels"]["per_entry"] = per_entry
    if result.overlay is not None:
        doc["overlay"] = plain({**_picture(opened.image), **result.overlay.document()})
    generated = None if opened.weights.capture is None else opened.weights.capture.generated_texts()
    if generated is not None:  # a capture made with --generate: each batch entry's answer
        doc["generated"] = generated
    return doc


def _picture(image: Any) -> dict[str, Any]:
    """The picture of an overlay, as the JSON document names it."""
    picture = image.picture
    return {"image": None if picture is None else picture.source,
            "image_size": None if picture is None else list(picture.size), "upsample": image.options.upsample}


def compare_document(run: CompareRun, result: CompareResult, files: dict[str, str]) -> dict[str, Any]:
    """``compare``'s JSON document."""
    doc = compare_report(run.a, run.b, result.comparison, result.checks, files, warnings=result.warnings,
                         mask=run.masks.described)
    doc["labels"] = plain({"q": run.q_labels, "k": run.k_labels,
                           **({"per_entry": run.labels.document()} if run.labels.per_entry else {})})
    doc["notes"] = list(run.notes)
    return doc


def rollout_document(run: RolloutRun, files: dict[str, str]) -> dict[str, Any]:
    """``rollout``'s JSON document: the maps of every batch entry that the method gave (and each
    layer's with ``all_layers``); the options a method does not use are null."""
    from attnviz.inspection.rollout import cumulative

    options, w, shown = run.options, run.weights, run.results[run.shown]
    lq, lk = w.shape[-2:]
    entries = run.entries
    used = run.method.options
    rollout_doc: dict[str, Any] = {
        "method": options.method, "heads": options.heads,
        "residual": options.residual if "residual" in used else None, "start_layer": options.start_layer,
        "layers": shown.layers, "batch": entries,
        "shape": [len(entries), lq, lk], "data": np.stack([run.results[b].result for b in entries]),
    }
    if run.grads is not None:
        rollout_doc["grads"] = {"source": run.grads.source, "file_shape": list(run.grads.file_shape)}
    if options.all_layers:
        rollout_doc["cumulative"] = {
            "shape": [len(entries), len(shown.layers), lq, lk],
            "data": np.stack([cumulative(run.results[b]) for b in entries])}
    rollout_doc["discard_ratio"] = options.discard_ratio if "discard_ratio" in used else None
    overlay = None
    if run.image is not None:
        image = run.image
        overlay = {**_picture(image), **image.layout.document(), "batch": run.shown, "query": image.query,
                   "query_label": None if run.tokens is None else run.tokens[image.query], "rollout": run.mask,
                   "normalised": "divided by its maximum (vit-explain)"}
    return plain({
        "attnviz": __version__, "command": "rollout", "source": w.source,
        "file_shape": list(w.file_shape), "weights_shape": list(w.shape), "labels": run.tokens,
        **({"weighed_by": w.weighed} if w.weighed != "weights" else {}),
        **({"labels_per_entry": run.labels.document()["q"]} if run.labels is not None and run.labels.per_entry
           else {}),
        **({"words": run.words} if run.words is not None else {}),
        "mask": run.masks.described, "rollout": rollout_doc, **({"overlay": overlay} if overlay else {}),
        "warnings": run.warnings, "files": files})

"""What ``inspect`` shows of a summary capture (``attnviz.inspection.summary``): the per-head table, the
JSON document, the layer x head grid of pooled maps (axes in token positions), the received attention by
position (the "lost in the middle" profile) and the chosen rows as strips. Objects only; the command saves
or prints them. matplotlib is imported inside the functions that draw."""

from __future__ import annotations

from typing import Any

import numpy as np

from attnviz.inspection.summary import HEAD_FIELDS, Retrieval, SummaryResult
from attnviz.statistics import SUMMARY, columns

#: the head table's columns: statistic -> header (``attnviz.statistics``)
COLUMNS = columns(SUMMARY)


def head_rows(result: SummaryResult, sort: str = "layer", reverse: bool = False,
              top: int | None = None) -> list[dict[str, Any]]:
    """One dict per (layer, head): its statistics and ``tag`` (``attnviz.statistics.TAGS``), sorted (statistics
    largest first) and cut to ``top``."""
    stats = result.heads
    layers, heads = stats["entropy"].shape
    tags = _tags(result)
    rows = []
    for li in range(layers):
        for hi in range(heads):
            row: dict[str, Any] = {"layer": li, "head": hi, "rows": int(stats["rows"][li, hi])}
            for name in HEAD_FIELDS:
                row[name] = _num(stats[name][li, hi])
            row["tag"] = str(tags[li, hi]) or None
            if result.retrieval is not None:
                row["retrieval"] = _num(result.retrieval.scores[li, hi])
            for name, got in result.spans.items():
                row.setdefault("spans", {})[name] = _num(got["received"][li, hi])
            rows.append(row)
    if sort not in ("layer", "head"):
        if sort not in rows[0]:
            from attnviz.errors import UsageError

            have = [name for name in COLUMNS if name in rows[0]]  # retrieval where its scores were asked for
            raise UsageError(f"--sort {sort}: a summary's head table has {', '.join(have)}.")
        rows.sort(key=lambda r: (r[sort] is None, -(r[sort] or 0.0)))
    elif sort == "head":
        rows.sort(key=lambda r: (r["head"], r["layer"]))
    if reverse:
        rows.reverse()
    return rows[:top] if top else rows


def _tags(result: SummaryResult) -> np.ndarray:
    from attnviz.inspection.summary import summary_tags

    return result.tags if result.tags is not None else summary_tags(result.read, result.heads, result.sinks,
                                                                     result.retrieval)


def _num(value: Any) -> float | None:
    v = float(value)
    return None if not np.isfinite(v) else v


#: the columns left out first when a terminal is too narrow for every column (headers)
FIT_DROPS = (*(COLUMNS[n] for n in ("distance", "last", "first", "previous", "local_mass")), "tag")


def head_table(result: SummaryResult, precision: int = 3, sort: str = "layer", reverse: bool = False,
               top: int | None = None) -> Any:
    """The per-head table of a summary (laid out for the width it is printed at, as inspect's own)."""
    from rich import box
    from rich.table import Table
    from rich.text import Text

    from attnviz.render.summaries import tags_caption
    from attnviz.render.table import WEIGHT_STATISTICS, Fitted, column_texts

    rows = head_rows(result, sort, reverse, top)
    s = result.read
    layers, b, h, lq, lk = s.shape
    names = ["layer", "head", "entropy", "entropy_norm", "max", "sink_mass", "local_mass", "distance", "previous",
             "first", "last", *(["retrieval"] if result.retrieval is not None else [])]
    spans = list(result.spans)
    cells: dict[str, list[str]] = {}
    uniform = 1.0 / max(lk, 1)  # a column of weights far below uniform attention's reads 0
    for name in names:  # each column's digits by its magnitude: at 19k tokens a weight is about 1e-4
        cells[COLUMNS.get(name, name)] = ([str(r[name]) for r in rows] if name in ("layer", "head") else
                                          column_texts([r.get(name) for r in rows], precision,
                                                       uniform if name in WEIGHT_STATISTICS else None))
    for name in spans:
        cells[f"on {name}"] = column_texts([r["spans"][name] for r in rows], precision, uniform)
    cells["tag"] = [r["tag"] or "" for r in rows]
    widths = {n: max([len(n), *(len(v) for v in values)]) for n, values in cells.items()}
    caption = ("means over real query rows and batch entries: entropy H (nats) and H/ln n (1: uniform); max: mean "
               f"largest weight; sink: weight on the first {s.settings.get('sinks')} real keys; local: on the "
               f"{s.settings.get('local')} keys up to the query; dist: mean |i - j| weighted; prev, first, last: "
               "weight on the previous, first and last real key" +
               ("; on SPAN: mean attention a key of the span receives" if spans else "") +
               ("; retrieval: Wu et al. 2024's score over the generated tokens" if result.retrieval is not None
                else ""))
    if top and len(rows) < layers * h:
        caption += f"; showing {len(rows)} of {layers * h} heads (--top)"
    footer = sink_rate_line(result.sinks, b)
    if result.retrieval is not None:
        found = result.retrieval.ranked()
        best = ", ".join(f"{li}:{hi} {score:.2f}" for li, hi, score in found[:5])
        footer += (f"\nretrieval heads (score > {result.retrieval.threshold:g}): {len(found)} of {layers * h}"
                   + (f"; best {best}" if best else ""))
    caption = footer + "\n" + tags_caption(_tags(result), list(range(layers)), SUMMARY) + caption

    def build(width: int | None) -> Table:
        shown = list(cells)
        dropped = []
        for name in FIT_DROPS:
            if width is None or sum(widths[n] for n in shown) + len(shown) + 1 <= width:
                break
            shown.remove(name)
            dropped.append(name)
        note = f"; left out to fit the terminal: {', '.join(dropped)}" if dropped else ""
        table = Table(title=f"heads of {s.source} ({s.kind}: {layers} sites x {h} heads, {lq} queries x {lk} keys; "
                            f"by {sort})", caption=caption + note, caption_justify="left", title_justify="left",
                      box=box.SIMPLE_HEAD, padding=0, pad_edge=False)
        for name in shown:
            table.add_column(name, justify="left" if name == "tag" else "right", no_wrap=True, overflow="ellipsis",
                             width=widths[name])
        for r in range(len(rows)):
            table.add_row(*[cells[n][r] if n != "tag" else Text(cells[n][r], style="bold cyan") for n in shown])
        return table

    return Fitted(build, whole_in_pipe=True)  # a pipe gets every column


def sink_rate_line(sinks: Any, texts: int) -> str:
    """The model-level sink rate in one line (Gu et al. 2024), with its epsilon and rows."""
    from attnviz.inspection.summary import SINK_ROWS

    value = sinks.value if sinks is not None else None
    if value is None:
        return "sink rate: no row sees the first token"
    layers, b, h = sinks.alpha.shape
    return (f"sink rate (Gu et al. 2024): {value:.3f} of {layers * h} heads x {texts} text{'s' * (texts != 1)} have a "
            f"mean weight on the first token above {sinks.epsilon:g}, over {SINK_ROWS} (the first column leaves the "
            "first row out)")


def sink_rate_document(sinks: Any) -> dict[str, Any]:
    """The sink rate in JSON: ``value`` (the model-level share), ``epsilon``, ``rows``, ``per_head`` [layers, H] (the
    share of texts in which each head is a sink) and ``alpha`` [layers, B, H]."""
    from attnviz.inspection.summary import SINK_ROWS

    return {"definition": "Gu et al. 2024: the share of (text, layer, head) whose mean weight on the first token "
                          "exceeds epsilon", "value": sinks.value, "epsilon": sinks.epsilon, "rows": SINK_ROWS,
            "per_head": [[_num(v) for v in row] for row in sinks.per_head],
            "alpha": [[[_num(v) for v in heads] for heads in entries] for entries in sinks.alpha]}


def summary_document(result: SummaryResult, files: dict[str, str], sort: str = "layer", reverse: bool = False,
                     top: int | None = None) -> dict[str, Any]:
    """The JSON document of ``inspect`` of a summary."""
    from attnviz import __version__
    from attnviz.inspection.tags import tags_document
    from attnviz.statistics import tag_rules

    s = result.read
    layers, b, h, lq, lk = s.shape
    bi = result.batch
    doc: dict[str, Any] = {
        "attnviz": __version__, "command": "inspect", "file": s.source, "kind": s.kind, "summary": s.settings,
        "shape": {"sites": layers, "batch": b, "heads": h, "queries": lq, "keys": lk}, "batch": bi,
        "head_stats": head_rows(result, sort, reverse, top),
        "received": received_document(result),
        "pooled": {"q_edges": s.q_edges, "k_edges": s.k_edges},
        "warnings": result.warnings, "files": files,
    }
    if s.chosen is not None:
        doc["rows"] = {"positions": s.chosen_positions,
                       "top_keys": [[[int(j) for j in np.argsort(-s.chosen[li, bi, hi, r])[:5]]
                                     for r in range(len(s.chosen_positions))] for li in range(layers)
                                    for hi in range(h)]}
    if result.spans:
        doc["spans"] = {name: {"start": got["start"], "end": got["end"],
                               "received": [[_num(v) for v in row] for row in got["received"]],
                               **({"rows": [[[_num(v) for v in r] for r in head] for head in got["rows"]],
                                   "row_positions": got["row_positions"]} if "rows" in got else {})}
                        for name, got in result.spans.items()}
    if result.sinks is not None:
        doc["sink_rate"] = sink_rate_document(result.sinks)
    doc["tags"] = tags_document(_tags(result), list(range(layers)), tag_rules(SUMMARY))
    if result.retrieval is not None:
        doc["retrieval"] = retrieval_document(result.retrieval)
    return doc


def retrieval_document(r: Retrieval) -> dict[str, Any]:
    """The retrieval scores in JSON: ``scores`` [layers, H] (the mean over batch entries), ``per_entry``, the
    retrieval ``heads`` past the threshold best first, each entry's ``needle`` span and answer ``recall``."""
    return {"definition": "Wu et al. 2024: distinct needle positions a head copied (its top key inside the needle "
                          "holding the token generated at that step) over the needle's length, per batch entry, "
                          "then the mean over entries; every decode step counts, the prompt's last row included",
            "threshold": r.threshold, "decode_rows": r.rows,
            "heads": [{"layer": li, "head": hi, "score": score} for li, hi, score in r.ranked()],
            "scores": [[_num(v) for v in row] for row in r.scores],
            "per_entry": [[[_num(v) for v in row] for row in entry] for entry in r.per_entry],
            "needle": [{"start": sp.start, "end": sp.end, "name": sp.name} for sp in r.needles],
            "recall": [float(v) for v in r.recall]}


def received_document(result: SummaryResult) -> dict[str, Any]:
    """The attention each key receives, as ``inspect``'s JSON of exact weights has it (``received``): per key
    the mean over the real rows that see it, averaged over batch entries: ``per_head [L, H, Lk]``,
    ``per_layer [L, Lk]``, ``mean [Lk]``, and the ``top`` receivers."""
    import warnings

    from attnviz.inspection.received import TOP_RECEIVERS

    s = result.read
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        per_head = np.nanmean(result.received["mean"], axis=1)
        per_layer = np.nanmean(per_head, axis=1)
        mean = np.nanmean(per_layer, axis=0)
    order = [int(j) for j in np.argsort(-np.nan_to_num(mean, nan=-np.inf), kind="stable")[:TOP_RECEIVERS]
             if not np.isnan(mean[j])]
    tokens = s.key_tokens[0] if s.key_tokens else None
    top = []
    for j in order:
        column = np.nan_to_num(per_head[:, :, j], nan=-np.inf)
        li, hi = np.unravel_index(int(np.argmax(column)), column.shape)
        top.append({"position": j, "token": tokens[j] if tokens and j < len(tokens) else None, "mean": float(mean[j]),
                    "max": float(per_head[li, hi, j]), "layer": int(li), "head": int(hi)})

    def listed(a: np.ndarray) -> Any:
        return [listed(x) for x in a] if a.ndim > 1 else [_num(v) for v in a]

    causal = bool((s.metadata.get("sites", {}).get(s.sites[0], {}).get("mask") or {}).get("causal"))
    return {"causal": causal, "layers": list(range(len(s.sites))), "mean": listed(mean),
            "per_layer": listed(per_layer), "per_head": listed(per_head), "top": top,
            "note": "per key: the attention it receives from the real rows that see it, divided by their number"}


def _norm_for(fig: Any, values: np.ndarray) -> tuple[Any, str]:
    """The colour scale of summary pictures, as every heatmap's (``--norm``), but ``auto`` (the default)
    takes a log scale as soon as the values above 0 span a decade above their median (block means are about
    1/L beside sinks of nearly 1: a linear scale shows the sinks alone); the name for the colour bar."""
    from dataclasses import replace

    from attnviz.render.scale import ValueRange, make_scaling

    scale = fig.scale()
    found = ValueRange(histogram=scale.norm == "auto")
    found.add(np.asarray(values, dtype=np.float64)[None])
    if scale.norm == "auto" and scale.vmin is None and scale.vmax is None and found.decades() >= 1.0:
        scale = replace(scale, norm="log", auto=True)
    scaling = make_scaling(scale, found)
    made = scaling.scale or scale
    return scaling, made.name


def pooled_grid_figure(result: SummaryResult, fig: Any) -> Any:
    """The layer x head grid of pooled block means of one batch entry, axes in token positions."""
    import matplotlib.pyplot as plt  # noqa: F401 - the Agg canvas below
    from matplotlib.figure import Figure

    from attnviz.render.scale import _colormap

    s = result.read
    layers, b, h, lq, lk = s.shape
    bi = result.batch
    data = s.pooled_mean[:, bi]  # [layers, H, Pq, Pk]
    scaling, name = _norm_for(fig, data[np.isfinite(data)])
    cmap = _colormap(fig.cmap or "viridis")
    size = 1.6
    figure = Figure(figsize=(max(4.0, h * size + 1.2), max(3.0, layers * size + 1.0)))
    axes = figure.subplots(layers, h, squeeze=False)
    image = None
    bq, bk = s.q_edges[1] - s.q_edges[0], s.k_edges[1] - s.k_edges[0]
    for li in range(layers):
        for hi in range(h):
            ax = axes[li][hi]
            image = ax.imshow(scaling.clip(data[li, hi]), norm=scaling.norm, cmap=cmap, aspect="auto",
                              interpolation="nearest", extent=(0, lk, lq, 0))
            ax.tick_params(labelsize=5, length=2)
            if li != layers - 1:
                ax.set_xticklabels([])
            if hi:
                ax.set_yticklabels([])
            if li == 0:
                ax.set_title(f"head {hi}", fontsize=7)
            if hi == 0:
                ax.set_ylabel(f"{s.sites[li]}\nquery", fontsize=6)
            if li == layers - 1:
                ax.set_xlabel("key position", fontsize=6)
    title = fig.title or (f"pooled attention of {s.source}" + (f", entry {bi}" if b > 1 else "")
                          + f": means of {bq} x {bk}-token blocks")
    figure.suptitle(title, fontsize=8)
    if image is not None:
        bar = figure.colorbar(image, ax=axes, shrink=0.6, extend=scaling.extend)
        bar.set_label("block mean weight" + (f" ({name})" if name else ""), fontsize=7)
        bar.ax.tick_params(labelsize=6)
    return figure


def received_profile_figure(result: SummaryResult, fig: Any, layer: int | None = None,
                            head: int | None = None) -> Any:
    """The attention each key position receives, mean over the real rows that see it: one line per layer
    (mean over heads), or per head of ``layer``; spans shaded."""
    from matplotlib.figure import Figure

    s = result.read
    layers, b, h, lq, lk = s.shape
    mean = result.received["mean"][:, result.batch]  # [layers, H, Lk]
    figure = Figure(figsize=(9, 3.6))
    ax = figure.add_subplot()
    x = np.arange(lk)
    if layer is None:
        for li in range(layers):
            ax.plot(x, np.nanmean(mean[li], 0) if h > 1 else mean[li, 0], lw=0.8, label=s.sites[li])
    else:
        for hi in range(h) if head is None else [head]:
            ax.plot(x, mean[layer, hi], lw=0.8, label=f"{s.sites[layer]} head {hi}")
    ax.set_yscale("log")
    for name, got in result.spans.items():
        ax.axvspan(got["start"], got["end"], color="orange", alpha=0.25)
        ax.text((got["start"] + got["end"]) / 2, 1.0, name, transform=ax.get_xaxis_transform(), ha="center",
                va="bottom", fontsize=7)
    ax.set_xlabel("key position")
    ax.set_ylabel("received (mean per row that sees it)", fontsize=8)
    ax.set_xlim(0, lk)
    ax.legend(fontsize=6, ncol=min(4, max(1, layers)), loc="upper right")
    ax.set_title(fig.title or f"attention received by position: {s.source}", fontsize=9)
    figure.tight_layout()
    return figure


def rows_figure(result: SummaryResult, fig: Any, layer: int) -> Any:
    """The chosen rows of ``layer`` as strips: one panel per row, heads x keys, token labels where they fit."""
    from matplotlib.figure import Figure

    from attnviz.render.scale import _colormap

    s = result.read
    assert s.chosen is not None
    rows = s.chosen[layer, result.batch]  # [H, R, Lk]
    h, r, lk = rows.shape
    scaling, name = _norm_for(fig, rows[np.isfinite(rows)])
    figure = Figure(figsize=(9, 0.9 + r * (0.35 + 0.18 * h)))
    axes = figure.subplots(r, 1, squeeze=False)
    labels = s.key_tokens[result.batch] if s.key_tokens and len(s.key_tokens) > result.batch else None
    image = None
    for n in range(r):
        ax = axes[n][0]
        image = ax.imshow(scaling.clip(rows[:, n]), norm=scaling.norm, cmap=_colormap(fig.cmap or "viridis"),
                          aspect="auto", interpolation="nearest", extent=(0, lk, h, 0))
        pos = s.chosen_positions[n]
        token = f" {labels[pos]!r}" if labels and pos < len(labels) else ""
        ax.set_ylabel(f"row {pos}{token}\nhead", fontsize=6)
        ax.tick_params(labelsize=5)
        if labels and lk <= 64:
            ax.set_xticks(np.arange(lk) + 0.5)
            ax.set_xticklabels(labels[:lk], rotation=90, fontsize=5)
    axes[-1][0].set_xlabel("key position", fontsize=7)
    figure.suptitle(fig.title or f"the chosen rows of {s.sites[layer]}: {s.source}", fontsize=8)
    if image is not None:
        bar = figure.colorbar(image, ax=axes, shrink=0.8, extend=scaling.extend)
        bar.set_label("weight" + (f" ({name})" if name else ""), fontsize=7)
    return figure

"""What ``inspect`` shows of a summary capture (``attnviz.inspection.summary``): the per-head table, the
JSON document, the layer x head grid of pooled maps (axes in token positions), the received attention by
position (the "lost in the middle" profile) and the chosen rows as strips. Objects only; the command saves
or prints them. matplotlib is imported inside the functions that draw."""

from __future__ import annotations

from typing import Any

import numpy as np

from attnviz.inspection.summary import HEAD_FIELDS, STAT_HINTS, Retrieval, SummaryResult, stat_columns
from attnviz.render.summaries import fitted_columns
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
    if result.retrieval is not None and not np.isfinite(result.retrieval.scores).any():
        footer += "\nretrieval heads: none can be named: no answer holds a token of the needle (see the warning)"
    elif result.retrieval is not None:
        found = result.retrieval.ranked()
        best = ", ".join(f"{li}:{hi} {score:.2f}" for li, hi, score in found[:5])
        footer += (f"\nretrieval heads (score > {result.retrieval.threshold:g}): {len(found)} of {layers * h}"
                   + (f"; best {best}" if best else ""))
    caption = footer + "\n" + tags_caption(_tags(result), list(range(layers)), SUMMARY) + caption

    def build(width: int | None) -> Table:
        shown, dropped = fitted_columns(list(cells), widths, FIT_DROPS, width)
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
    if s.generated is not None:
        doc["generated"] = s.generated
    if s.chosen is not None:
        doc["rows"] = {"positions": s.chosen_positions,
                       "top_keys": [[[int(j) for j in np.argsort(-s.chosen[li, bi, hi, r])[:5]]
                                     for r in range(len(s.chosen_positions))] for li in range(layers)
                                    for hi in range(h)]}
    if result.spans:
        where = {span.name: span.document() for span in result.found_spans}
        doc["spans"] = {name: {"start": got["start"], "end": got["end"], **where.get(name, {}),
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


def inspection_document(inspection: Any, files: dict[str, str]) -> dict[str, Any]:
    """The JSON document of ``inspect`` of a summary capture, inspected (``attnviz.inspection.kinds.SummaryInspection``:
    its head table in the order asked for)."""
    return summary_document(inspection.result, files, inspection.sort, inspection.reverse, inspection.top)


#: the pictures of a summary capture, by the name the API's ``figure(kind=...)`` takes, and inspect's option for each
SUMMARY_PICTURES = {"grid": "--png", "received": "--received-png", "map": "--map-png", "stats": "--stats-png"}


def inspection_figure(inspection: Any, fig: Any, kind: str = "grid", stat: str = "entropy") -> Any:
    """A picture of a summary capture, inspected: the pooled grid (``grid``, --png), the received attention by
    position (``received``), the chosen rows (``map``; of --layer, default the last site) or the layers x heads
    heatmap of ``stat`` (``stats``)."""
    result, layer = inspection.result, inspection.layer
    if kind == "grid":
        return pooled_grid_figure(result, fig)
    if kind == "received":
        return received_profile_figure(result, fig, layer)
    if kind == "map":
        return rows_figure(result, fig, result.read.shape[0] - 1 if layer is None else layer)
    if kind == "stats":
        return stat_grid(result, fig, stat)
    from attnviz.errors import UsageError

    raise UsageError(f"kind={kind!r}: expected one of {', '.join(SUMMARY_PICTURES)}.")


def compared_document(compared: Any) -> dict[str, Any]:
    """The JSON document of ``compare`` of two summaries (``attnviz.inspection.kinds.SummariesCompared``): each head
    statistic of A and B, the largest difference of each per-row statistic, --atol's check."""
    reads, result = compared.reads, compared.comparison
    return {"command": "compare", "a": reads[0].source, "b": reads[1].source, "summaries": True,
            "max_abs_diff": result.row_diff,
            "heads": [{"layer": li, "head": hi, **{name: {"a": _num(result.a.heads[name][li, hi]),
                                                       "b": _num(result.b.heads[name][li, hi])}
                                                for name in HEAD_FIELDS}}
                      for li in range(reads[0].shape[0]) for hi in range(reads[0].shape[2])],
            "check": None if compared.atol is None else {"atol": compared.atol, "passed": not compared.failed}}


def compared_table(compared: Any) -> Any:
    """``compare``'s table of two summaries: per statistic, the largest per-row difference and the largest
    difference of head means."""
    from rich import box
    from rich.table import Table

    reads, result = compared.reads, compared.comparison
    table = Table(title=f"summaries: {reads[0].source} (A) against {reads[1].source} (B)", box=box.SIMPLE_HEAD,
                  caption="per-row statistics over the real rows of both; heads: the mean of B less the mean of "
                          "A, the largest over heads", caption_justify="left")
    for name in ("statistic", "max |A - B| / max(1, |B|) per row", "max |B - A| of head means"):
        table.add_column(name, justify="right")
    for name in HEAD_FIELDS:
        per_row = result.row_diff.get(name)
        head = float(np.nanmax(np.abs(result.head_diff[name]))) if np.isfinite(result.head_diff[name]).any() \
            else float("nan")
        table.add_row(name, "–" if per_row is None else f"{per_row:.3g}", f"{head:.3g}")
    return table


def check_line(compared: Any) -> str:
    """--atol's verdict on two summaries, one line."""
    return (f"check: {'FAILED' if compared.failed else 'passed'}: largest per-row difference {compared.worst:.3g} "
            f"(atol {compared.atol:g})")


def retrieval_document(r: Retrieval) -> dict[str, Any]:
    """The retrieval scores in JSON: ``scores`` [layers, H] (the mean over batch entries), ``per_entry``, the
    retrieval ``heads`` past the threshold best first, each entry's ``needle`` span and answer ``recall``."""
    return {"definition": "Wu et al. 2024: distinct needle positions a head copied (its top key inside the needle "
                          "holding the token generated at that step) over the needle's length, per batch entry, "
                          "then the mean over the entries whose answer holds a token of the needle (scored_entries; "
                          "null when none does); every decode step counts, the prompt's last row included",
            "threshold": r.threshold, "decode_rows": r.rows,
            "heads": [{"layer": li, "head": hi, "score": score} for li, hi, score in r.ranked()],
            "scores": [[_num(v) for v in row] for row in r.scores],
            "per_entry": [[[_num(v) for v in row] for row in entry] for entry in r.per_entry],
            "scored_entries": [int(e) for e in np.flatnonzero(r.recall > 0)],
            "needle": [{"start": sp.start, "end": sp.end, "name": sp.name, **sp.document()} for sp in r.needles],
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
    tokens = s.key_labels(0)
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


def stat_grid(result: SummaryResult, fig: Any, stat: str) -> Any:
    """``--stats-png`` of a summary: the layers x heads heatmap of the column ``stat`` (``stat_columns``)."""
    from attnviz.render.figures import stat_grid_figure

    s = result.read
    return stat_grid_figure(stat_columns(result), stat, title=fig.title or f"summary of {s.source}", what=s.source,
                            fig=fig, hints=STAT_HINTS)


def summary_scale(fig: Any, values: np.ndarray) -> Any:
    """The colour scale of summary pictures (``--norm``, as every heatmap's), but ``auto`` (the default) is a
    log scale, as docs/long-context.md says: block means and a long row's weights are about 1/L beside sinks
    of nearly 1, and a linear scale shows the sinks alone. Linear where a log scale cannot be drawn (no value
    above 0, or --vmin or --vmax at 0). The colour bar names the scale either way."""
    from dataclasses import replace

    scale = fig.scale()
    if scale.norm != "auto":
        return scale
    shown = np.asarray(values, dtype=np.float64)
    fixed = [v for v in (scale.vmin, scale.vmax) if v is not None]
    positive = bool((shown > 0).any()) and all(v > 0 for v in fixed)
    return replace(scale, norm="log" if positive else "linear", auto=True)


def _norm_for(fig: Any, values: np.ndarray) -> tuple[Any, str]:
    """The scaling of ``values`` on the summary pictures' scale (``summary_scale``), and its name for the colour
    bar."""
    from attnviz.render.scale import ValueRange, make_scaling

    scale = summary_scale(fig, values)
    found = ValueRange()
    found.add(np.asarray(values, dtype=np.float64)[None])
    scaling = make_scaling(scale, found)
    return scaling, (scaling.scale or scale).name


def _layer_word(s: Any) -> str:
    """What a site of the summary is called in pictures: ``layer``, or ``encoder layer`` (``cross layer`` ...)
    for one kind of sites of an encoder-decoder. Sites are numbered 0, 1, ... as the head table numbers them."""
    return "layer" if s.kind == "layers" else f"{s.kind} layer"


def pooled_grid_figure(result: SummaryResult, fig: Any) -> Any:
    """The layer x head grid of pooled block means of one batch entry: one mosaic, as the grid of exact weights
    (``attnviz.render.mosaic``: panels a cell a block, rows numbered by layer and columns by head, one colour
    bar), on the summary pictures' scale (``summary_scale``); the block size in its heading."""
    from attnviz.render.mosaic import mosaic_figure

    s = result.read
    layers, b, h, lq, lk = s.shape
    bi = result.batch
    data = s.pooled_mean[:, bi]  # [layers, H, Pq, Pk]
    bq, bk = s.q_edges[1] - s.q_edges[0], s.k_edges[1] - s.k_edges[0]
    title = fig.title or (f"pooled attention of {s.source}" + (f", entry {bi}" if b > 1 else ""))
    heading = f"{title}: {_layer_word(s)}s x heads, maps [{lq}, {lk}]"  # the mosaic adds its blocks
    # block means of block means are the means of the larger blocks (--reduce max would be the largest mean, not
    # the largest weight): a mosaic that must shrink the maps further takes means
    return mosaic_figure(lambda r, c: (data[r, c], None), layers, h, (data.shape[-2], data.shape[-1]),
                         title=heading, row_labels=[str(li) for li in range(layers)],
                         col_labels=[str(hi) for hi in range(h)], row_name=_layer_word(s), col_name="head",
                         cmap=fig.cmap, reduce="mean", colorbar_label="block mean weight", blocks=(bq, bk),
                         scale=summary_scale(fig, data[np.isfinite(data)]))


#: the least width of a span's shading, in pixels of the saved picture: a needle of 7 tokens in 19k keys is
#: otherwise a hairline
SPAN_MIN_PX = 4


def received_profile_figure(result: SummaryResult, fig: Any, layer: int | None = None,
                            head: int | None = None) -> Any:
    """The attention each key position receives, mean over the real rows that see it: one line per layer
    (mean over heads), or per head of ``layer``; spans shaded (at least ``SPAN_MIN_PX`` wide) and named inside
    the plot's top edge, clear of the ticks and the title; the legend beside the plot, off its lines."""
    from matplotlib.figure import Figure

    from attnviz.render.heatmap import DPI, agg_canvas

    s = result.read
    layers, b, h, lq, lk = s.shape
    mean = result.received["mean"][:, result.batch]  # [layers, H, Lk]
    figure = Figure(figsize=(10, 3.8), dpi=DPI, layout="constrained")
    agg_canvas(figure)
    ax = figure.add_subplot()
    x = np.arange(lk)
    word = _layer_word(s)
    if layer is None:
        for li in range(layers):
            ax.plot(x, np.nanmean(mean[li], 0) if h > 1 else mean[li, 0], lw=0.8, label=f"{word} {li}")
        legend_title = "mean over heads"
    else:
        for hi in range(h) if head is None else [head]:
            ax.plot(x, mean[layer, hi], lw=0.8, label=f"{layer}:{hi}")
        legend_title = f"{word}:head"
    ax.set_yscale("log")
    ax.set_xlabel("key position")
    ax.set_ylabel("received (mean per row that sees it)", fontsize=8)
    ax.set_xlim(0, lk)
    lines = len(ax.get_lines())
    ax.legend(fontsize=6, title=legend_title, title_fontsize=6, ncol=max(1, -(-lines // 16)), loc="upper left",
              bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0, frameon=False)
    what = f"{word} {layer}" if layer is not None else f"mean over heads, per {word}"
    ax.set_title(fig.title or f"attention received by position ({what}): {s.source}", fontsize=9)
    if result.spans:
        _shade_spans(figure, ax, result.spans, lk)
    return figure


def _shade_spans(figure: Any, ax: Any, spans: dict[str, dict[str, Any]], lk: int) -> None:
    """Each span shaded over its keys, at least ``SPAN_MIN_PX`` pixels wide (centred on the span), and its name
    written inside the plot under its top edge (kept within the plot: never over a tick label or the title)."""
    figure.canvas.draw()  # the layout: the plot's width in pixels
    width_px = max(1.0, ax.get_window_extent().width)
    least = SPAN_MIN_PX * lk / width_px  # in key positions
    for name, got in spans.items():
        start, end = float(got["start"]), float(got["end"])
        if end - start < least:
            middle = (start + end) / 2
            start, end = middle - least / 2, middle + least / 2
            start, end = max(0.0, min(start, lk - least)), min(float(lk), max(end, least))  # within the plot
        ax.axvspan(start, end, color="orange", alpha=0.35, lw=0)
        middle = (start + end) / 2
        # near an edge the label runs into the plot rather than out of it
        ha, x, dx = (("left", start, 3) if middle < 0.1 * lk else ("right", end, -3) if middle > 0.9 * lk else
                     ("center", middle, 0))
        ax.annotate(name, (x, 0.97), xycoords=ax.get_xaxis_transform(), xytext=(dx, 0), textcoords="offset points",
                    ha=ha, va="top", fontsize=7,
                    bbox={"boxstyle": "round,pad=0.15", "facecolor": "white", "edgecolor": "none", "alpha": 0.8})


def rows_figure(result: SummaryResult, fig: Any, layer: int) -> Any:
    """The chosen rows of ``layer`` as strips: one panel per row, heads down (a tick per head, at its cell's
    centre) and key positions across, token labels where they fit; on the summary pictures' scale
    (``summary_scale``), the colour bar naming it and each tick its whole value."""
    from matplotlib.figure import Figure

    from attnviz.render.heatmap import DPI, agg_canvas
    from attnviz.render.scale import colour_map, plain_bar_ticks

    s = result.read
    assert s.chosen is not None
    rows = s.chosen[layer, result.batch]  # [H, R, Lk]
    h, r, lk = rows.shape
    scaling, name = _norm_for(fig, rows[np.isfinite(rows)])
    panel_h = 0.35 + 0.16 * h  # inches
    figure = Figure(figsize=(10, 1.0 + r * (panel_h + 0.45)), dpi=DPI, layout="constrained")
    agg_canvas(figure)
    axes = figure.subplots(r, 1, squeeze=False)
    labels = s.key_labels(result.batch)
    image = None
    # a head's label at most every 9 pixels of the panel (6-point labels never touch)
    step = max(1, -(-h // max(1, int(panel_h * DPI) // 9)))
    for n in range(r):
        ax = axes[n][0]
        image = ax.imshow(scaling.clip(rows[:, n]), norm=scaling.norm, cmap=colour_map(fig.cmap or "viridis"),
                          aspect="auto", interpolation="nearest", extent=(-0.5, lk - 0.5, h - 0.5, -0.5))
        pos = s.chosen_positions[n]
        token = f" {labels[pos]!r}" if labels and pos < len(labels) else ""
        ax.set_ylabel(f"row {pos}{token}\nhead", fontsize=7)
        ax.set_yticks(range(0, h, step))
        ax.tick_params(labelsize=6)
        if labels and lk <= 64:
            ax.set_xticks(np.arange(lk))
            ax.set_xticklabels(labels[:lk], rotation=90, fontsize=5)
        else:
            from matplotlib.ticker import MaxNLocator

            ax.xaxis.set_major_locator(MaxNLocator(nbins=10, integer=True))
        ax.set_xlabel("key position", fontsize=7)
    word = _layer_word(s)
    figure.suptitle(fig.title or f"the chosen rows of {word} {layer}: {s.source}", fontsize=9)
    if image is not None:
        bar = figure.colorbar(image, ax=axes, shrink=0.9, extend=scaling.extend)
        bar.set_label("weight" + (f" ({name})" if name else ""), fontsize=7)
        bar.ax.tick_params(labelsize=6)
        plain_bar_ticks(bar)
    return figure

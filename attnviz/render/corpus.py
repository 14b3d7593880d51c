"""A corpus file drawn and tabled (``attnviz inspect heads.safetensors``): the per-head table, the closest pairs of
heads, the strips of attention to the first and last tokens, punctuation and the token classes by layer (one
dot per head, as Clark et al. 2019's Figure 2), entropy by layer against uniform attention (their Figure 4),
and the heads placed by the Jensen-Shannon distances of their rows (their Figure 6: classical
multidimensional scaling), coloured by layer. Objects only: the caller prints and saves them."""

from __future__ import annotations

from typing import Any

import numpy as np

from attnviz.corpusfile import CorpusSums
from attnviz.errors import UsageError
from attnviz.inspection.corpus import classical_mds, closest_pairs, model_sink_rate, shown_tokens, stat_columns
from attnviz.render.summaries import fitted_columns
from attnviz.statistics import CORPUS, columns

#: the table's columns: statistic -> header (``attnviz.statistics``)
COLUMNS = columns(CORPUS)


def _order(sums: CorpusSums, sort: str, reverse: bool) -> list[int]:
    heads = sums.head_order
    index = list(range(len(heads)))
    if sort == "layer":
        order = sorted(index, key=lambda g: heads[g])
    elif sort == "head":
        order = sorted(index, key=lambda g: (heads[g][1], heads[g][0]))
    else:
        if sort not in sums.names:  # a statistic or a token class, class:NAME (attnviz.statistics.sort_key)
            choices = ", ".join(["layer", "head", *sums.names])
            raise UsageError(f"--sort {sort}: not a statistic of a corpus file; choose one of {choices}.")
        values = sums.means()[sort]
        order = sorted(index, key=lambda g: (-values[g] if np.isfinite(values[g]) else np.inf, heads[g]))
    return order[::-1] if reverse else order


#: columns left out, in this order, when the table is wider than the terminal (the JSON has them all)
FIT_DROPS = ("top next", "top prev", "H(first row)", "uniform", "next", "diag", "prev", "tag")


def corpus_table(sums: CorpusSums, precision: int = 3, *, sort: str = "layer", reverse: bool = False,
                 top: int | None = None) -> Any:
    """Every head's statistics, one row each (``sort``: layer, head or a statistic, largest first); laid out
    for the width it is printed at (``render.table.Fitted``: the least telling columns left out, and said)."""
    from attnviz.inspection.corpus import corpus_tags
    from attnviz.render.summaries import tags_caption
    from attnviz.render.table import WEIGHT_STATISTICS, Fitted, column_texts

    order = _order(sums, sort, reverse)
    shown = order[:top] if top else order
    means = sums.means()
    heads = sums.head_order
    corpus = sums.corpus
    first = ", ".join(shown_tokens(corpus.get("first_tokens"))[:2]) or "-"
    last = ", ".join(shown_tokens(corpus.get("last_tokens"))[:2]) or "-"
    caption = (f"{corpus.get('texts')} texts; means over each text's real query rows, then over texts; first = "
               f"the first real token ({first}), last = the last ({last}); punct = '.' and ','; diag = the token "
               f"itself; H = entropy in nats, uniform = that of uniform attention over the same rows; top prev/next = "
               f"share of rows whose largest weight is on the previous/next token; sink rate = share of texts "
               f"whose mean weight on the first token passes {(corpus.get('settings') or {}).get('sink_threshold')}")
    if len(shown) < len(order):
        caption += f"; showing {len(shown)} of {len(order)} heads (--top)"
    caption = tags_caption(corpus_tags(sums), [layer for layer, _ in heads], CORPUS, tuple(sums.classes),
                           (corpus.get("settings") or {}).get("sink_threshold")) + caption
    rate = model_sink_rate(sums)
    if rate["value"] is not None:
        caption = (f"sink rate (Gu et al. 2024): {rate['value']:.3f} of {rate['heads']} heads x {rate['texts']} texts "
                   f"have a mean weight on the first token above {rate['epsilon']}, over {rate['rows']} (the first "
                   "column leaves the first row out)\n" + caption)
    cells: dict[str, list[str]] = {"layer": [str(heads[g][0]) for g in shown],
                                   "head": [str(heads[g][1]) for g in shown]}
    # each column's digits by its magnitude (``column_texts``); weights far below uniform attention's over a text of
    # the corpus's mean length read 0
    uniform = float(corpus.get("texts") or 0) / max(float(sums.rows.max(initial=0)), 1.0) or None
    for stat, header in COLUMNS.items():
        cells[header] = column_texts(means[stat][shown], precision, uniform if stat in WEIGHT_STATISTICS else None)
    for name in sums.classes:
        cells[name] = column_texts(means[f"class:{name}"][shown], precision, uniform)
    tags = corpus_tags(sums)
    cells["tag"] = [str(tags[g]) for g in shown]
    widths = {name: max([len(name), *(len(v) for v in values)]) for name, values in cells.items()}

    def build(width: int | None) -> Any:
        from rich import box
        from rich.table import Table
        from rich.text import Text

        names, dropped = fitted_columns(list(cells), widths, FIT_DROPS, width)
        note = f"; left out to fit the terminal: {', '.join(dropped)} (--json has them)" if dropped else ""
        table = Table(title=f"corpus head statistics (by {sort}{', reversed' if reverse else ''})",
                      caption=caption + note, caption_justify="left", box=box.SIMPLE_HEAD, padding=0, pad_edge=False)
        for name in names:
            table.add_column(name, justify="left" if name == "tag" else "right", no_wrap=True, overflow="ellipsis",
                             width=widths[name])
        for r in range(len(shown)):
            table.add_row(*[cells[n][r] if n != "tag" else Text(cells[n][r], style="bold cyan") for n in names])
        return table

    return Fitted(build)


def closest_pairs_table(pairs: list[tuple[tuple[int, int], tuple[int, int], float]], precision: int = 4,
                        note: str | None = None) -> Any:
    """The pairs of heads whose rows are closest (least mean Jensen-Shannon divergence per row); ``note``, what
    the distances leave out, as its caption."""
    from rich import box
    from rich.table import Table

    table = Table(title="closest heads (mean Jensen-Shannon divergence per query row)", box=box.SIMPLE_HEAD,
                  padding=(0, 1), pad_edge=False, caption=note)
    for name in ("head", "head ", "divergence"):
        table.add_column(name, justify="right", no_wrap=True)
    for a, b, value in pairs:
        table.add_row(head_name(a), head_name(b), _num(value, precision))
    return table


def _num(value: float, precision: int) -> str:
    return "-" if not np.isfinite(value) else f"{value:.{precision}f}"


# ---------------------------------------------------------------------------------------------------
# Pictures


def _title(sums: CorpusSums, fig: Any, what: str) -> str:
    given = getattr(fig, "title", None)
    if given:
        return str(given)
    name = sums.meta.get("model_name") or sums.meta.get("model_type") or "model"  # files written before: the type
    return f"{name}: {what} over {sums.corpus.get('texts')} texts"


def layer_strips_figure(sums: CorpusSums, fig: Any = None) -> Any:
    """One panel per statistic (attention to the first token, the last, punctuation, each token class; then
    entropy against uniform): the layers along x, one dot per head, the layer's mean as a line."""
    from matplotlib.figure import Figure

    means = sums.means()
    corpus = sums.corpus
    first = "/".join(list(corpus.get("first_tokens") or {})[:2]) or "first"
    last = "/".join(list(corpus.get("last_tokens") or {})[:2]) or "last"
    panels = [("first", f"to the first token ({first})"), ("last", f"to the last token ({last})"),
              ("punctuation", "to punctuation (. ,)"), *((f"class:{c}", f"to {c}") for c in sums.classes)]
    n = len(panels) + 1
    cols = min(n, 4)
    rows = -(-n // cols)
    figure = Figure(figsize=(3.6 * cols, 3.2 * rows), dpi=100, layout="constrained")
    axes = figure.subplots(rows, cols, squeeze=False).ravel()
    heads = np.array(sums.head_order)
    layers = sorted({int(v) for v in heads[:, 0]}) if len(heads) else []
    position = {layer: k for k, layer in enumerate(layers)}
    x = np.array([position[int(v)] for v in heads[:, 0]]) if len(heads) else np.zeros(0)
    spread = (heads[:, 1] / max(1, heads[:, 1].max() + 1) - 0.5) * 0.4 if len(heads) else np.zeros(0)
    colours = _layer_colours(heads[:, 0] if len(heads) else np.zeros(0), layers)
    for ax, (stat, label) in zip(axes, panels):
        values = means[stat]
        ax.scatter(x + spread, values, s=12, c=colours, edgecolors="none", alpha=0.85)
        ax.plot(range(len(layers)), [np.nanmean(values[x == k]) for k in range(len(layers))], color="0.3", lw=1)
        ax.set_title(f"avg. attention {label}", fontsize=9)
        ax.set_ylim(-0.02, 1.02)
        _layer_axis(ax, layers)
    ax = axes[len(panels)]
    ax.scatter(x + spread, means["entropy"], s=12, c=colours, edgecolors="none", alpha=0.85, label="heads")
    ax.scatter(x + spread, means["first_row_entropy"], s=10, marker="x", color="0.45", linewidths=0.8,
               label="the first token's row")
    uniform = [np.nanmean(means["entropy_uniform"][x == k]) for k in range(len(layers))]
    ax.plot(range(len(layers)), uniform, ls="--", color="black", lw=1, label="uniform attention")
    ax.set_title("entropy (nats) by layer", fontsize=9)
    ax.legend(fontsize=7, loc="best", framealpha=0.8)
    _layer_axis(ax, layers)
    for ax in axes[n:]:
        ax.set_visible(False)
    figure.suptitle(_title(sums, fig, "attention by layer, one dot per head"), fontsize=10)
    return figure


def heads_map_figure(sums: CorpusSums, fig: Any = None, pairs: int = 5) -> Any:
    """The heads placed in the plane so that their distances follow the Jensen-Shannon distances of their
    rows (the square root of the mean divergence per query row; classical multidimensional scaling),
    coloured by layer, the closest pairs joined and listed. Each head is labelled ``LAYER:HEAD`` where its label
    overlaps no other (``_label_heads``: the closest pairs' heads first); the legend stands beside the plot."""
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D

    from attnviz.render.heatmap import agg_canvas

    d = sums.distances()
    d = np.sqrt(np.maximum(np.nan_to_num(d, nan=0.0), 0.0))
    points = classical_mds(d)
    heads = np.array(sums.head_order)
    layers = sorted({int(v) for v in heads[:, 0]})
    colours = _layer_colours(heads[:, 0], layers)
    figure = Figure(figsize=(9.0, 6.5), dpi=100, layout="constrained")
    agg_canvas(figure)
    ax = figure.subplots()
    closest = closest_pairs(sums, pairs)
    index = {tuple(h): g for g, h in enumerate(sums.head_order)}
    for a, b, _ in closest:
        i, j = index[a], index[b]
        ax.plot(points[[i, j], 0], points[[i, j], 1], color="0.6", lw=0.8, zorder=1)
    ax.scatter(points[:, 0], points[:, 1], c=colours, s=40, edgecolors="white", linewidths=0.5, zorder=2)
    handles = [Line2D([], [], marker="o", ls="", color=colours[list(heads[:, 0]).index(layer)], label=f"layer {layer}")
               for layer in layers]
    ax.legend(handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0,
              frameon=False)
    listed = "; ".join(f"{head_name(a)} & {head_name(b)}: {v:.3g}" for a, b, v in closest)
    ax.set_xticks([])
    ax.set_yticks([])
    ax.set_aspect("equal", adjustable="datalim")
    ax.set_xlabel(f"closest pairs (mean JS divergence per row): {listed}", fontsize=7)
    figure.suptitle(_title(sums, fig, "heads placed by the Jensen-Shannon distances of their rows"), fontsize=10)
    first = [index[h] for a, b, _ in closest for h in (a, b)]
    shown = _label_heads(figure, ax, points, [head_name(h) for h in sums.head_order], first)
    if shown < len(points):
        ax.set_xlabel(f"{ax.get_xlabel()}\nlabelled: {shown} of {len(points)} heads (LAYER:HEAD; the others' labels "
                      "would overlap)", fontsize=7)
    return figure


def head_name(head: tuple[int, int]) -> str:
    """How pictures write a head: ``LAYER:HEAD``, as the summary's retrieval heads are written."""
    return f"{head[0]}:{head[1]}"


#: where a head's label may stand, beside its dot: (dx, dy) in points, and its alignment there
LABEL_PLACES = ((4, 2, "left", "bottom"), (4, -2, "left", "top"), (-4, 2, "right", "bottom"),
                (-4, -2, "right", "top"), (0, 5, "center", "bottom"), (0, -5, "center", "top"),
                (8, 6, "left", "bottom"), (8, -6, "left", "top"), (-8, 6, "right", "bottom"), (-8, -6, "right", "top"))


def _label_heads(figure: Any, ax: Any, points: np.ndarray, names: list[str], first: list[int]) -> int:
    """Write each head's name beside its dot, in the first place of ``LABEL_PLACES`` where it overlaps no label
    written before, no other dot, and stays within the plot; heads ``first`` (the closest pairs', listed under the
    plot) first and over other dots where they must (a pair's dots may touch), then the rest in order. A head
    whose label fits nowhere is left unlabelled. Returns how many were labelled."""
    from matplotlib.transforms import Bbox

    figure.canvas.draw()  # the layout and the limits, settled: labels are placed in pixels
    renderer = figure.canvas.get_renderer()
    frame = ax.get_window_extent(renderer)
    dots = ax.transData.transform(points)
    radius = 3.5 * figure.dpi / 72  # a dot's radius (s=40: a diameter of about 6.3 points), in pixels
    boxes: list[Any] = []
    order = list(dict.fromkeys([*first, *range(len(points))]))
    shown = 0
    for g in order:
        others = [Bbox.from_bounds(x - radius, y - radius, 2 * radius, 2 * radius)
                  for k, (x, y) in enumerate(dots) if k != g]
        for dx, dy, ha, va in LABEL_PLACES:
            text = ax.annotate(names[g], points[g], xytext=(dx, dy), textcoords="offset points", ha=ha, va=va,
                               fontsize=6, color="0.2")
            text.set_in_layout(False)
            box = text.get_window_extent(renderer).padded(1)
            inside = (frame.x0 <= box.x0 and box.x1 <= frame.x1 and frame.y0 <= box.y0 and box.y1 <= frame.y1)
            clear = g in first or not any(box.overlaps(b) for b in others)
            if inside and clear and not any(box.overlaps(b) for b in boxes):
                boxes.append(box)
                shown += 1
                break
            text.remove()
    return shown


def stat_grid(sums: CorpusSums, fig: Any, stat: str, source: str) -> Any:
    """``--stats-png`` of a corpus file: the layers x heads heatmap of the column ``stat`` (``stat_columns``), its
    rows named by their layers."""
    from attnviz.render.figures import stat_grid_figure

    return stat_grid_figure(stat_columns(sums), stat, title=_title(sums, fig, "head statistics"), what=source, fig=fig,
                            layer_ids=list(sums.layers))


def _layer_colours(layer_of: np.ndarray, layers: list[int]) -> np.ndarray:
    from matplotlib import colormaps

    cmap = colormaps["viridis"]
    k = {layer: i for i, layer in enumerate(layers)}
    span = max(1, len(layers) - 1)
    return np.array([cmap(0.9 * k[int(v)] / span) for v in layer_of]).reshape(-1, 4)


def _layer_axis(ax: Any, layers: list[int]) -> None:
    ax.set_xticks(range(len(layers)), [str(v) for v in layers], fontsize=7)
    ax.set_xlabel("layer", fontsize=8)
    ax.tick_params(axis="y", labelsize=7)
    ax.grid(axis="y", color="0.92", lw=0.6)


def inspection_document(inspection: Any, files: dict[str, str]) -> dict[str, Any]:
    """The JSON document of ``inspect`` of a corpus file (``attnviz.inspection.kinds.CorpusInspection``)."""
    from attnviz.inspection.corpus import corpus_document

    return corpus_document(inspection.sums, inspection.source, files)


def inspection_tables(inspection: Any, precision: int = 3) -> list[Any]:
    """The tables ``inspect`` prints of a corpus file: the head table in the order asked for, the closest pairs."""
    from attnviz.inspection.corpus import distances_note

    sums = inspection.sums
    return [corpus_table(sums, precision, sort=inspection.sort, reverse=inspection.reverse, top=inspection.top),
            closest_pairs_table(closest_pairs(sums), note=distances_note(sums))]


#: the pictures of a corpus file, by the name the API's ``figure(kind=...)`` takes, and inspect's option for each
CORPUS_PICTURES = {"grid": "--png", "heads_map": "--heads-map", "stats": "--stats-png"}


def inspection_figure(inspection: Any, fig: Any, kind: str = "grid", stat: str = "entropy") -> Any:
    """A picture of a corpus file, inspected: the layer strips (``grid``, --png), the heads placed by their distances
    (``heads_map``) or the layers x heads heatmap of ``stat`` (``stats``)."""
    if kind == "grid":
        return layer_strips_figure(inspection.sums, fig)
    if kind == "heads_map":
        return heads_map_figure(inspection.sums, fig)
    if kind == "stats":
        return stat_grid(inspection.sums, fig, stat, inspection.source)
    raise UsageError(f"kind={kind!r}: expected one of {', '.join(CORPUS_PICTURES)}.")

"""The figures each command draws, built from its typed result and the figure options
(``attnviz.render.options.FigureOptions``): the compute commands' heatmap, inspect's layer x head grid
and single map, compare's A - B grid, received attention per layer, and rollout. Each returns a
matplotlib figure; the caller saves it (``attnviz.render.heatmap.save_figure``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from attnviz.errors import shape_str
from attnviz.render.options import FigureOptions

if TYPE_CHECKING:
    from attnviz.inspection.compare import CompareResult
    from attnviz.inspection.inspecting import InspectResult, Opened
    from attnviz.inspection.rollout import RolloutRun
    from attnviz.pipeline import Outcome


def compute_figure(outcome: Outcome, fig: FigureOptions) -> Any:
    """The heatmap of a compute run: many maps of one shape (``MOSAIC_PANELS`` or more slices of the
    weights, no further maps to draw) as one mosaic picture, rows and columns named by the leading
    axes; otherwise one panel per map (and per further map a variant shows)."""
    from attnviz.render.heatmap import Panel, heatmap_figure, slice_panels
    from attnviz.render.mosaic import MOSAIC_PANELS, slices_mosaic
    from attnviz.render.table import slice_label

    result, streamed, prep = outcome.result, outcome.streamed, outcome.prepared
    scale = fig.scale()
    drawn = [v for v in result.views if v.png and streamed is None]
    names = prep.lead_names
    title = fig.title or f"{prep.variant.name} attention weights {shape_str(prep.weights_shape)}"
    lead, (lq, lk) = prep.weights_shape[:-2], prep.weights_shape[-2:]
    count = int(np.prod(lead)) if lead else 1
    if count >= MOSAIC_PANELS and not drawn:
        if streamed is None:
            return slices_mosaic(result.weights, title=title, names=names, keep=prep.mask.keep, cmap=fig.cmap,
                                 reduce=fig.reduce, scale=scale)
        if len(streamed.grids) == count:  # a blockwise run aggregated every slice while computing
            return slices_mosaic(None, title=title, names=names, grids=streamed.grids, lead=tuple(lead),
                                 full_shape=(lq, lk), blocks=streamed.grid_blocks, cmap=fig.cmap, reduce=fig.reduce,
                                 scale=scale)
    if streamed is not None:
        lead, (lq, lk) = streamed.weights_shape[:-2], streamed.weights_shape[-2:]
        slices = list(np.ndindex(*lead)) if lead else [()]
        panels = [Panel(slice_label(s, names) if lead else "", grid, full_shape=(lq, lk),
                        blocks=streamed.grid_blocks) for s, grid in zip(slices, streamed.grids)]
    else:
        panels = slice_panels(result.weights, prep.mask.keep, prep.variant.weights_title if drawn else "", names)
    for view in drawn:
        if view.axis == "both":
            panels += slice_panels(result.maps[view.name], prep.mask.keep, view.title, names)
        else:  # a vector: a one-column strip along the queries, or a one-row strip along the keys
            data = result.maps[view.name]
            strip = data[..., :, None] if view.axis == "q" else data[..., None, :]
            for panel in slice_panels(strip, None, view.title, names):
                if view.axis == "q":
                    panel.k_labels, panel.xlabel = [""], ""
                else:
                    panel.q_labels, panel.ylabel = [""], ""
                panels.append(panel)
    return heatmap_figure(panels, title=title, q_labels=prep.q_labels, k_labels=prep.k_labels, cmap=fig.cmap,
                          reduce=fig.reduce, ylabel=prep.variant.axis_names[0], xlabel=prep.variant.axis_names[1],
                          scale=scale)


def tokens_note(figure: Any, name: str) -> str | None:
    """One line when a grid picture left its tokens out (its cells too small for a line of them), naming the
    options that draw them; None when it drew them, or had none to draw."""
    if not getattr(figure, "attnviz_tokens_left_out", False):
        return None
    return (f"{name}: the tokens are left out, the cells of its maps being too small for them; --layers and --heads "
            "draw fewer maps, larger, with their tokens, and --map-png one map with them")


def inspect_name(result: InspectResult, fig: FigureOptions) -> str:
    return opened_name(result.opened, fig)


def opened_name(opened: Opened, fig: FigureOptions) -> str:
    return fig.title or f"{opened.weights.what} of {opened.weights.source}"


def inspect_grid_figure(result: InspectResult, fig: FigureOptions) -> Any:
    """inspect's --png: a layer x head grid of the batch entry's maps (read a layer at a time; masked
    cells grey), or the one map with its labels."""
    return opened_grid_figure(result.opened, fig)


def opened_grid_figure(opened: Opened, fig: FigureOptions) -> Any:
    """``inspect_grid_figure`` from the opened weights alone (no statistics needed: it can be drawn while
    they are summed)."""
    from attnviz.inspection.masks import grid_masks
    from attnviz.render.heatmap import heatmap_figure
    from attnviz.render.mosaic import grid_getter, model_grid_figure

    w, (_, bi, _), grid = opened.weights, opened.index, opened.grid
    name = opened_name(opened, fig)
    keep, real = grid_masks(opened.masks, w.shape, bi)
    if grid.reduce_heads or len(grid.layers) * len(grid.heads) > 1:
        return model_grid_figure(w.data[:, bi], title=f"{name}, batch {bi}", cmap=fig.cmap, reduce=fig.reduce,
                                 keep=keep, real_rows=real, layers=grid.layers, heads=grid.heads,
                                 reduce_heads=grid.reduce_heads, scale=fig.scale(),
                                 tokens=(opened.q_labels, opened.k_labels), colorbar_label=w.unit)
    data, drawn_keep = grid_getter(w.data[:, bi], keep, real)(grid.layers[0], grid.heads[0])
    where = f", layer {grid.layers[0]}, batch {bi}, head {grid.heads[0]}" if w.shape[0] * w.shape[2] > 1 else ""
    return heatmap_figure(data, title=name + where, q_labels=opened.q_labels, k_labels=opened.k_labels,
                          keep=drawn_keep, cmap=fig.cmap, reduce=fig.reduce, scale=fig.scale(), colorbar_label=w.unit)


def inspect_map_figure(result: InspectResult, fig: FigureOptions) -> Any:
    """inspect's --map-png: the selected map alone, with its labels (padded rows grey)."""
    from attnviz.render.heatmap import heatmap_figure

    li, bi, hi = result.opened.index
    assert result.one is not None  # analysed: the weights are finite
    return heatmap_figure(result.one, title=f"{inspect_name(result, fig)}, layer {li}, batch {bi}, head {hi}",
                          q_labels=result.opened.q_labels, k_labels=result.opened.k_labels, keep=result.drawn_keep,
                          cmap=fig.cmap, reduce=fig.reduce, scale=fig.scale(),
                          colorbar_label=result.opened.weights.unit)


def inspect_stat_figure(result: InspectResult, fig: FigureOptions, stat: str) -> Any:
    """inspect's --stats-png: a layers x heads heatmap of one head statistic (the chosen layers and heads)."""
    from attnviz.statistics import WEIGHTS, names

    grid = result.opened.grid
    columns = {name: np.asarray(result.stats[name])[np.ix_(grid.layers, grid.heads)] for name in names(WEIGHTS)
               if name in result.stats}
    return stat_grid_figure(columns, stat, title=inspect_name(result, fig), what=result.opened.weights.source,
                            fig=fig, layer_ids=grid.layers, head_ids=grid.heads)


def stat_grid_figure(columns: dict[str, Any], stat: str, *, title: str, what: str, fig: FigureOptions,
                     layer_ids: Any = None, head_ids: Any = None, hints: dict[str, str] | None = None) -> Any:
    """--stats-png of any kind of file: the layers x heads heatmap of the column ``stat`` of ``columns`` (each
    ``[layers, heads]``; NaN where a layer has fewer heads), checked by ``check_stat``."""
    from attnviz.render.heatmap import stat_figure
    from attnviz.statistics import check_stat

    check_stat(columns, stat, what, hints)
    return stat_figure(np.asarray(columns[stat], dtype=np.float64), title=title, stat=stat, cmap=fig.cmap,
                       layer_ids=layer_ids, head_ids=head_ids)


def received_figure(summary: dict[str, Any], tokens: list[str] | None, *, title: str, cmap: str | None,
                    reduce: str, scale: Any) -> Any:
    """A strip heatmap: one row per layer, one column per key token, the attention it receives
    (mean over heads)."""
    from attnviz.render.heatmap import heatmap_figure

    return heatmap_figure(summary["per_layer"], title=title, q_labels=[str(li) for li in summary["layers"]],
                          k_labels=tokens, cmap=cmap or "magma", reduce=reduce, ylabel="layer", xlabel="key token",
                          colorbar_label="received (mean over heads)", scale=scale)


def inspect_received_figure(result: InspectResult, fig: FigureOptions) -> Any:
    """inspect's --received-png: the received-attention strip of the chosen layers."""
    assert result.received is not None
    layers = result.opened.grid.layers
    chosen = {**result.received, "per_layer": result.received["per_layer"][layers], "layers": layers}
    return received_figure(chosen, result.opened.k_labels, title=f"attention received per token: "
                           f"{inspect_name(result, fig)}", cmap=fig.cmap, reduce=fig.reduce, scale=fig.scale())


def compare_figure(result: CompareResult, fig: FigureOptions, max_panels: int) -> Any:
    """compare's --png of A - B of one batch entry: the chosen (layer, head) maps, or layers with
    --reduce-heads, ranked by their largest |A - B| and drawn largest first, at most ``max_panels`` of
    them (0: all), each captioned with its layer, head and max |A - B|; one map alone is drawn with its
    axes. One scale symmetric around 0 (``ColourScale``)."""
    from attnviz.inspection.masks import grid_masks
    from attnviz.render.heatmap import heatmap_figure
    from attnviz.render.mosaic import grid_getter, rank_panels, ranked_grid_figure

    run = result.run
    _, bi, _ = run.index
    name = fig.title or f"A - B: {run.a.source} - {run.b.source}, batch {bi}"
    diff = result.comparison.diff[:, bi]
    scale = fig.scale()
    keep, real = grid_masks(run.masks, run.a.shape, bi)
    layers, heads, reduce_heads = run.grid.layers, run.grid.heads, run.grid.reduce_heads
    panels: list[tuple[int, int | None]] = (
        [(layer, None) for layer in layers] if reduce_heads else [(layer, h) for layer in layers for h in heads])
    ranked = rank_panels(diff, panels, keep=keep, real_rows=real, heads=heads, reduce_heads=reduce_heads)
    # maps that do not differ (max |A - B| within --atol, or 0) are not drawn: the grid holds those that do
    atol = run.options.atol or 0.0
    differing = [item for item in ranked if item[1] > atol]
    if len(differing) == 1 and not reduce_heads or len(panels) == 1 and not reduce_heads:
        (layer, head), _ = (differing or ranked)[0]
        data, one = grid_getter(diff, keep, real)(layer, int(head or 0))
        where = f", layer {layer}, head {head}" if diff.shape[0] * diff.shape[1] > 1 else ""
        alone = (f" (the only one of {len(panels)} maps that differs)" if len(panels) > 1 and differing else "")
        return heatmap_figure(data, title=name + where + alone, keep=one, diverging=True, cmap=fig.cmap,
                              reduce=fig.reduce, colorbar_label="A - B", scale=scale, q_labels=run.q_labels,
                              k_labels=run.k_labels)
    same = len(ranked) - len(differing)
    within = f"within --atol {atol:g}" if atol else "identical"
    note = (f"; the other {same} are {within}" if differing and same else
            f"; every map is {within}" if not differing else "")
    shown = (differing or ranked[:1])[:max_panels or None]
    return ranked_grid_figure(diff, shown, title=name, total=len(panels), cmap=fig.cmap,
                              reduce=fig.reduce, keep=keep, real_rows=real, heads=heads, reduce_heads=reduce_heads,
                              scale=scale, note=note, tokens=(run.q_labels, run.k_labels))


def rollout_figure(run: RolloutRun, fig: FigureOptions) -> Any:
    """rollout's --png: the rollout of the shown batch entry, or with --all-layers the cumulative map
    after each layer of every entry (a mosaic)."""
    from attnviz.inspection.rollout import cumulative
    from attnviz.render.heatmap import heatmap_figure
    from attnviz.render.mosaic import slices_mosaic

    name = fig.title or f"{run.title} of {run.weights.source}"
    label = run.method.label
    scale = fig.scale()
    if run.options.all_layers:
        maps = np.stack([cumulative(run.results[b]) for b in run.entries])  # [B, n, L, L]
        entries = f"batch {run.entries[0]}" if len(run.entries) == 1 else "every batch entry"
        return slices_mosaic(maps, title=f"{name}, {entries} ({run.how}), cumulative after each layer",
                             names=["batch", "after layer"], cmap=fig.cmap, reduce=fig.reduce, scale=scale,
                             colorbar_label=label, ids=[run.entries, run.results[run.shown].layers],
                             tokens=(run.tokens, run.tokens) if len(run.entries) == 1 or run.labels is None
                             or not run.labels.per_entry else (None, None))
    return heatmap_figure(run.results[run.shown].result, title=f"{name}, batch {run.shown} ({run.how})",
                          q_labels=run.tokens, k_labels=run.tokens, cmap=fig.cmap, reduce=fig.reduce,
                          ylabel="token (output)", xlabel="input token", colorbar_label=label, scale=scale)


def rollout_html(run: RolloutRun, fig: FigureOptions) -> str:
    """The HTML report of a rollout: one row per batch entry; one column (the result), or one per layer
    (the cumulative maps) with --all-layers."""
    from attnviz.inspection.rollout import cumulative
    from attnviz.render.html import grid_report

    w, entries, all_layers = run.weights, run.entries, run.options.all_layers
    first = run.results[entries[0]]
    columns = first.layers if all_layers else [first.layers[-1]]

    def get(r: int, c: int) -> tuple[np.ndarray, np.ndarray | None]:
        one = run.results[entries[r]]
        data = cumulative(one)[c] if all_layers else one.result
        real = ~np.isnan(data)
        return np.nan_to_num(data), None if real.all() else real

    subtitle = f"{w.source} {shape_str(w.file_shape)} read as [layers, batch, heads, L, L] = {shape_str(w.shape)}"
    name = fig.title or run.title
    per_entry = [run.tokens_of(b) for b in entries] if run.labels is not None and run.labels.per_entry else None
    return grid_report(get, len(entries), len(columns), first.result.shape, title=f"{name} ({run.how})",
                       subtitle=subtitle, row_labels=[str(b) for b in entries], col_labels=[str(li) for li in columns],
                       row_name="batch", col_name="after layer", q_labels=run.tokens, k_labels=run.tokens,
                       row_q_labels=per_entry, row_k_labels=per_entry, q_name="output", k_name="input",
                       cmap=fig.cmap, reduce=fig.reduce,
                       colorbar_label=run.method.label, vmin=fig.vmin, vmax=fig.vmax, norm=fig.norm)

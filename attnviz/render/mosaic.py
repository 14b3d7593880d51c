"""Many attention maps in one picture: mosaics of a model's layer x head grid, of compare's
differences, and of the batch x head slices of a compute command.

``mosaic_figure`` draws many maps of one shape as ONE picture: each map aggregated in blocks
(``attnviz.blocks``) to at most a panel's side in pixels, placed into one array with white
separators, coloured with one shared scale (``attnviz.render.scale``; never each panel's own
maximum, unless asked) and drawn with a single ``imshow`` on one axes, with the rows and columns
named by tick labels and one colour bar. The picture is built a row of panels at a time from the
(perhaps memory-mapped) input, so its memory is one row's maps plus the picture. It is laid out
pixel for pixel (one cell of the picture is one pixel of the saved PNG at ``heatmap.DPI``, no
resampling) and put in its figure, margins measured from the text so that nothing is clipped, by
``attnviz.render.canvas`` (``mosaic_layout``, ``mosaic_canvas``).

The mosaics the commands draw: ``model_grid_figure`` for ``[layers, heads, Lq, Lk]`` (or one map
per layer, its heads reduced: ``reduce_heads_map``), ``ranked_grid_figure`` for the panels
``rank_panels`` chose (compare's largest differences first), and ``slices_mosaic`` for the slices of
``[..., Lq, Lk]``. Saving is ``attnviz.render.heatmap.save_figure``'s.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from attnviz import text as inert
from attnviz.blocks import reduce_panel
from attnviz.render.canvas import CAPTION_FONT, MOSAIC_SIDE, PANEL_MIN, MosaicLayout, mosaic_canvas, mosaic_layout
from attnviz.render.heatmap import DPI
from attnviz.render.scale import (
    ColourScale,
    Scaling,
    ValueRange,
    colour_map,
    make_scaling,
    number,
    own_scale,
    scale_label,
    unit_norm,
)

MOSAIC_PANELS = 5  # compute commands draw this many slices or more as one mosaic


def slices_layout(lead: tuple[int, ...], names: Sequence[str], offset: str = "+ offset in the row",
                  ids: Sequence[Sequence[Any]] | None = None) -> tuple[int, int, list[str], list[str], str, str]:
    """How the slices of leading axes ``lead`` are laid out, in a picture or in the terminal: the last axis
    across and the others down; one axis of more than 16 wraps into rows. (rows, cols, row labels, column
    labels, the rows' name, the columns' name.) ``ids``: what each axis's positions are called (the batch
    entries and layers shown), instead of 0, 1, ..."""
    axis = lead_axis_names(len(lead), names)
    count = int(np.prod(lead))
    ids = [list(range(n)) for n in lead] if ids is None else [list(i) for i in ids]
    if len(lead) == 1:
        cols = lead[0] if lead[0] <= 16 else math.ceil(math.sqrt(lead[0]))
        rows = math.ceil(lead[0] / cols)
        col_labels = [str(ids[0][c]) if rows == 1 else f"+{c}" for c in range(cols)]
        row_labels = [""] if rows == 1 else [f"{ids[0][r * cols]}-{ids[0][min(count, (r + 1) * cols) - 1]}"
                                             for r in range(rows)]
        row_name, col_name = ("", axis[0]) if rows == 1 else (f"{axis[0]}s", offset)
    else:
        cols, rows = lead[-1], count // lead[-1]
        col_labels = [str(ids[-1][c]) for c in range(cols)]
        row_labels = [", ".join(str(ids[a][i]) for a, i in enumerate(index)) for index in np.ndindex(*lead[:-1])]
        row_name, col_name = ", ".join(axis[:-1]), axis[-1]
    return rows, cols, row_labels, col_labels, row_name, col_name


def lead_axis_names(n: int, names: Sequence[str] = ()) -> list[str]:
    """Names of ``n`` leading axes, as ``slice_label`` names them: the last from ``names``, the
    first ``batch`` (one left over) or ``dim i``."""
    if len(names) >= n:
        return list(names)[len(names) - n:]
    extra = n - len(names)
    return (["batch"] if extra == 1 and names else [f"dim {i}" for i in range(extra)]) + list(names)


MapGetter = Callable[[int, int], "tuple[np.ndarray, np.ndarray | None] | None"]


def mosaic_figure(
    get: MapGetter,
    rows: int,
    cols: int,
    shape: tuple[int, int],
    *,
    title: str,
    row_labels: Sequence[str],
    col_labels: Sequence[str],
    row_name: str,
    col_name: str,
    cmap: str | None = None,
    reduce: str = "mean",
    diverging: bool = False,
    colorbar_label: str = "weight",
    full_shape: tuple[int, int] | None = None,
    blocks: tuple[int, int] = (1, 1),
    after_row: Callable[[int], None] | None = None,
    side: int = MOSAIC_SIDE,
    scale: ColourScale | None = None,
    captions: Sequence[str] | None = None,
    tokens: tuple[Sequence[str] | None, Sequence[str] | None] = (None, None),
) -> Any:
    """``rows x cols`` maps of ``shape`` as one picture on one axes (see the module's docstring).

    ``get(r, c)`` returns the map of panel ``(r, c)`` and its keep mask (None: nothing masked), or
    None for an empty slot; it is called row by row, and ``after_row(r)`` after each row (to let
    go of a memory-mapped input's pages). Maps that were aggregated before (a blockwise run's) come
    with ``blocks`` and the maps' ``full_shape``. One colour scale for every panel (``scale``; by
    default ``[min(0, low), high]`` of the values shown, or symmetric around 0 with ``diverging``),
    and one colour bar; with ``scale.per_panel`` each panel is drawn on its own scale and its maximum
    is written under it. ``captions`` (row-major, one per panel) are written under the panels too.
    ``tokens``: the maps' query and key labels, written where they fit (``canvas.token_labels``)."""
    scale = scale or ColourScale()
    texts = [list(captions[r * cols:(r + 1) * cols]) if captions else [""] * cols for r in range(rows)]
    layout = _captioned_layout(rows, cols, shape, side, texts, scale.per_panel)
    picture, values, masked = _fill_picture(get, layout, reduce, scale, diverging, texts, after_row, blocks[1])
    scaling = _scale_picture(picture, layout, scale, values, diverging)
    from matplotlib.cm import ScalarMappable

    colormap = colour_map(cmap or ("RdBu_r" if diverging else "viridis"))
    # white between panels; dark grey where white is a colour of the scale (diverging maps' zero)
    picture_map = colormap.with_extremes(over="#595959" if diverging else "white", under="white")
    note = _mosaic_note(layout, blocks, reduce, scale, scaling, masked)
    heading = f"{inert.title(title, 600)}{note}"  # the callers shorten the user's part of it (to 200)
    return mosaic_canvas(picture, layout, heading, ScalarMappable(norm=scaling.norm, cmap=colormap),
                         scale_label(colorbar_label, scaling.scale or scale, diverging), row_labels, col_labels,
                         row_name, col_name,
                         picture_map=picture_map, extend=scaling.extend, captions=texts,
                         per_panel=(scale, diverging) if scale.per_panel else None, tokens=tokens)


def _captioned_layout(rows: int, cols: int, shape: tuple[int, int], side: int, texts: Sequence[Sequence[str]],
                      per_panel: bool) -> MosaicLayout:
    """The layout of a mosaic with ``texts`` under its panels (row-major; and each panel's maximum
    with ``per_panel``): a strip of a line and a half under each row of panels, and panels wide
    enough for the longest caption. No strip when there is nothing to write."""
    longest = max((len(t) for row in texts for t in row), default=0)
    longest += len(" max -0.00e-00") if per_panel else 0
    line = CAPTION_FONT * DPI / 72
    caption = math.ceil(1.5 * line) if longest else 0
    return mosaic_layout(rows, cols, shape, side, caption=caption,
                         panel_min=max(PANEL_MIN, math.ceil(0.6 * line * longest) + 4) if longest else PANEL_MIN)


def _fill_picture(get: MapGetter, layout: MosaicLayout, reduce: str, scale: ColourScale, diverging: bool,
                  texts: list[list[str]],
                  after_row: Callable[[int], None] | None, block: int = 1) -> tuple[np.ndarray, ValueRange, bool]:
    """The picture of a mosaic (float32), a row of panels at a time: each map from ``get`` aggregated in
    the layout's blocks, its cells repeated to the layout's pixels, in its place; separators and
    empty slots infinite for now. With ``scale.per_panel`` each panel holds its positions 0..1 on its
    own scale, and its maximum joins its caption in ``texts``. Returns the picture, the values shown
    (for the shared scale) and whether a cell is masked (NaN)."""
    height, width = layout.size
    ph, pw = layout.panel
    sq, sk = layout.scale
    picture = np.full((height, width), np.inf, np.float32)  # separators and empty slots, for now
    masked = False
    values = ValueRange(histogram=scale.norm == "auto")
    skip = scale.skipped_columns(block * layout.blocks[1])  # the columns of the keys left out of the scale
    for r in range(layout.rows):
        shown = []  # the row's cells, for the shared scale: one look at the row rather than at each panel
        for c in range(layout.cols):
            got = get(r, c)
            if got is None:
                continue
            data, keep = got
            cells = reduce_panel(data, keep, *layout.blocks, reduce)
            if scale.per_panel:  # positions 0..1 on the panel's own scale
                masked = masked or bool(np.isnan(cells).any())
                cells, top = own_scale(cells, scale, diverging, block * layout.blocks[1])
                texts[r][c] = " ".join(t for t in (texts[r][c], f"max {number(top)}") if t)
            else:
                shown.append(cells)
            if sq > 1 or sk > 1:
                cells = np.repeat(np.repeat(cells, sq, axis=0), sk, axis=1)
            y, x = layout.origin(r, c)
            picture[y:y + ph, x:x + pw] = cells
        if shown:
            row = np.stack(shown)
            masked = masked or bool(np.isnan(row).any())
            values.add(row, diverging, skip)
        if after_row is not None:
            after_row(r)
    return picture, values, masked


def _scale_picture(picture: np.ndarray, layout: MosaicLayout, scale: ColourScale, values: ValueRange,
                   diverging: bool) -> Scaling:
    """The colour scale of a mosaic (for ``values``; 0..1 with ``scale.per_panel``), and the picture
    made ready for it, in place: values beyond the scale clipped to its ends, separators and empty
    slots above it, the caption strips below it."""
    if scale.per_panel:
        scaling = Scaling(unit_norm(), 0.0, 1.0, "neither")
    else:
        scaling = make_scaling(scale, values, diverging)
        # values beyond the scale take its end colours (a log scale's zeros too), never the colour of
        # the separators
        np.clip(picture, *scaling.bounds32(), out=picture, where=np.isfinite(picture))
    # separators and empty slots get a value above the scale: the picture's colour map's "over"
    # colour; masked cells are NaN: its "bad" grey. (Not infinity: matplotlib counts that as bad, too.)
    span = scaling.high - scaling.low
    np.copyto(picture, np.float32(scaling.high + span + 1.0), where=np.isinf(picture))
    if layout.caption:  # the strips under the panels, for their captions: the "under" colour, white
        for r in range(layout.rows):
            y = layout.origin(r, 0)[0] + layout.panel[0]
            picture[y:y + layout.caption] = np.float32(scaling.low - span - 1.0)
    return scaling


def _mosaic_note(layout: MosaicLayout, blocks: tuple[int, int], reduce: str, scale: ColourScale, scaling: Scaling,
                 masked: bool) -> str:
    """What a mosaic's heading adds in brackets: the blocks its maps are drawn in (a blockwise run's
    ``blocks`` times the layout's), the scale, the grey of masked cells; ``""`` when nothing."""
    total = (blocks[0] * layout.blocks[0], blocks[1] * layout.blocks[1])
    notes = [f"blocks of {total[0]}x{total[1]}, {reduce}"] if total != (1, 1) else []
    if scale.per_panel:
        notes.append("each panel on its own scale, its maximum under it")
    elif scaling.note:
        notes.append(scaling.note)
    if masked:
        notes.append("grey: masked")
    return f" ({'; '.join(notes)})" if notes else ""


def spans(ids: Sequence[int]) -> str:
    """``[0, 1, 2, 5]`` as ``0-2,5``: how a heading names chosen layers or heads."""
    parts: list[str] = []
    ids = list(ids)
    start = 0
    for n in range(1, len(ids) + 1):
        if n == len(ids) or ids[n] != ids[n - 1] + 1:
            parts.append(str(ids[start]) if n - 1 == start else f"{ids[start]}-{ids[n - 1]}")
            start = n
    return ",".join(parts)


def reduce_heads_map(stack: np.ndarray, keep: np.ndarray | None, how: str, signed: bool = False) -> np.ndarray:
    """The maps of one layer's heads ``stack [heads, Lq, Lk]`` reduced to one: the ``mean`` or the
    ``max`` over heads of each cell, masked cells (``keep`` False) left out; NaN where every head's
    cell is masked. With ``signed`` (differences), ``max`` keeps the value of largest magnitude
    with its sign."""
    values = np.array(stack, dtype=np.float32)
    if keep is not None:
        values[~np.broadcast_to(keep, values.shape)] = np.nan
    finite = ~np.isnan(values)
    count = finite.sum(axis=0)
    if how == "max" and signed:
        size = np.where(finite, np.abs(values), -1.0)
        pick = np.argmax(size, axis=0)
        out = np.take_along_axis(values, pick[None], axis=0)[0]
    elif how == "max":
        out = np.where(finite, values, -np.inf).max(axis=0)
    else:
        out = np.where(finite, values, 0.0).sum(axis=0) / np.maximum(count, 1)
    return np.where(count > 0, out, np.nan).astype(np.float32)


def model_grid_figure(w: np.ndarray, *, title: str, cmap: str | None = None, reduce: str = "mean",
                      layer_ids: Sequence[int] | None = None, head_ids: Sequence[int] | None = None,
                      keep: np.ndarray | None = None, real_rows: np.ndarray | None = None,
                      diverging: bool = False, colorbar_label: str = "weight",
                      layers: Sequence[int] | None = None, heads: Sequence[int] | None = None,
                      reduce_heads: str | None = None, scale: ColourScale | None = None,
                      tokens: tuple[Sequence[str] | None, Sequence[str] | None] = (None, None)) -> Any:
    """The layer x head grid of ``w [layers, heads, Lq, Lk]`` (perhaps memory-mapped) as one mosaic
    (like bertviz's model view, as a file), read a layer at a time. ``keep`` broadcasts to ``w``;
    ``real_rows`` (``[layers, heads, Lq]``, broadcasting) greys padded query rows too. ``layers`` and
    ``heads`` choose the rows and columns drawn (their numbers label them; ``layer_ids``/``head_ids``
    rename the positions of ``w``); ``reduce_heads`` (mean or max) draws one panel per layer, the
    chosen heads reduced to one map, in one row."""
    from attnviz.io import release_pages

    n_layers, n_heads = w.shape[:2]
    layers = list(layers) if layers is not None else list(range(n_layers))
    heads = list(heads) if heads is not None else list(range(n_heads))
    layer_names = [str(layer_ids[i]) if layer_ids is not None else str(i) for i in layers]
    head_names = [str(head_ids[i]) if head_ids is not None else str(i) for i in heads]
    get_map = grid_getter(w, keep, real_rows)
    shape = (w.shape[-2], w.shape[-1])
    chosen = []
    if len(layers) < n_layers:
        chosen.append(f"layers {spans(layers)} of {n_layers}")
    if len(heads) < n_heads and not reduce_heads:
        chosen.append(f"heads {spans(heads)} of {n_heads}")
    which = f" ({', '.join(chosen)})" if chosen else ""
    if reduce_heads:
        def get_reduced(_: int, c: int) -> tuple[np.ndarray, np.ndarray | None]:
            return reduced_layer(get_map, layers[c], heads, shape, reduce_heads or "mean", diverging), None

        of = "all heads" if len(heads) == n_heads else f"heads {spans(heads)} of {n_heads}"
        heading = (f"{inert.title(title)}: the {reduce_heads} of {of} in each layer{which}, "
                   f"maps [{shape[0]}, {shape[1]}]")
        return mosaic_figure(get_reduced, 1, len(layers), shape, title=heading, row_labels=[reduce_heads],
                             col_labels=layer_names, row_name="heads", col_name="layer", cmap=cmap, reduce=reduce,
                             diverging=diverging, colorbar_label=colorbar_label,
                             after_row=lambda _: release_pages(w), scale=scale, tokens=tokens)
    heading = f"{inert.title(title)}: layers x heads{which}, maps [{shape[0]}, {shape[1]}]"
    return mosaic_figure(lambda r, c: get_map(layers[r], heads[c]), len(layers), len(heads), shape, title=heading,
                         row_labels=layer_names, col_labels=head_names, row_name="layer", col_name="head",
                         cmap=cmap, reduce=reduce, diverging=diverging, colorbar_label=colorbar_label,
                         after_row=lambda _: release_pages(w), scale=scale, tokens=tokens)


def grid_getter(w: np.ndarray, keep: np.ndarray | None,
                 real_rows: np.ndarray | None) -> Callable[[int, int], tuple[np.ndarray, np.ndarray | None]]:
    """``get(layer, head)``: that map of ``w [layers, heads, Lq, Lk]`` and its keep mask, padded query
    rows (``real_rows`` False) masked too."""
    full_keep = None if keep is None else np.broadcast_to(keep, w.shape)
    rows_real = None if real_rows is None else np.broadcast_to(real_rows, w.shape[:-1])

    def get(li: int, hi: int) -> tuple[np.ndarray, np.ndarray | None]:
        one = None if full_keep is None else full_keep[li, hi]
        if rows_real is not None and not rows_real[li, hi].all():
            one = (np.ones(w.shape[-2:], bool) if one is None else one.copy())
            one[~rows_real[li, hi]] = False
        return w[li, hi], one

    return get


def reduced_layer(get_map: Callable[[int, int], tuple[np.ndarray, np.ndarray | None]], layer: int,
                  heads: Sequence[int], shape: tuple[int, int], how: str, signed: bool) -> np.ndarray:
    """The ``heads`` of ``layer`` reduced to one map (``reduce_heads_map``)."""
    maps = [get_map(layer, h) for h in heads]
    masks = None if all(k is None for _, k in maps) else np.stack(
        [np.ones(shape, bool) if k is None else k for _, k in maps])
    return reduce_heads_map(np.stack([m for m, _ in maps]), masks, how, signed)


def ranked_grid_figure(w: np.ndarray, ranked: Sequence[tuple[tuple[int, int | None], float]], *, title: str,
                       total: int,
                       cmap: str | None = None, reduce: str = "mean", keep: np.ndarray | None = None,
                       real_rows: np.ndarray | None = None, heads: Sequence[int] | None = None,
                       reduce_heads: str | None = None, diverging: bool = True, colorbar_label: str = "A - B",
                       measure: str = "max |A - B|", scale: ColourScale | None = None, note: str = "",
                       tokens: tuple[Sequence[str] | None, Sequence[str] | None] = (None, None)) -> Any:
    """Chosen panels of ``w [layers, heads, Lq, Lk]`` in the order given (``rank_panels``: largest
    difference first), each with its score: ``(layer, head)``, or ``(layer, None)`` with
    ``reduce_heads`` (the ``heads`` reduced to one map). Each panel's caption names its layer and
    head and its ``measure``; the heading says how many of ``total`` are shown and in what order (and
    ``note``, what of the others)."""
    get_map = grid_getter(w, keep, real_rows)
    shape = (w.shape[-2], w.shape[-1])
    heads = list(heads) if heads is not None else list(range(w.shape[1]))
    panels = [panel for panel, _ in ranked]
    scores = [score for _, score in ranked]

    def one(n: int) -> tuple[np.ndarray, np.ndarray | None]:
        layer, head = panels[n]
        if head is not None:
            return get_map(layer, head)
        return reduced_layer(get_map, layer, heads, shape, reduce_heads or "mean", diverging), None

    count = len(panels)
    cols = count if count <= 4 else math.ceil(math.sqrt(count))
    rows = math.ceil(count / cols)
    captions = [(f"{layer}:{head}" if head is not None else f"{layer}:{reduce_heads}") + f" {number(score)}"
                for (layer, head), score in zip(panels, scores)]
    what = "(layer, head) maps" if not reduce_heads else f"layers ({reduce_heads} of heads {spans(heads)})"
    shown = f"the {count} of {total} {what}" if count < total else f"all {total} {what}"
    heading = (f"{inert.title(title)}: {shown}, ordered by largest difference ({measure}; under each: layer:head, "
               f"{measure}), maps [{shape[0]}, {shape[1]}]{note}")

    def get(r: int, c: int) -> tuple[np.ndarray, np.ndarray | None] | None:
        n = r * cols + c
        return one(n) if n < count else None

    row_labels = [f"#{r * cols + 1}" if min(count, (r + 1) * cols) == r * cols + 1 else
                  f"#{r * cols + 1}-{min(count, (r + 1) * cols)}" for r in range(rows)]
    return mosaic_figure(get, rows, cols, shape, title=heading, row_labels=row_labels, col_labels=[""] * cols,
                         row_name="rank", col_name="", cmap=cmap, reduce=reduce, diverging=diverging,
                         colorbar_label=colorbar_label, scale=scale, captions=captions, tokens=tokens)


def rank_panels(w: np.ndarray, panels: Sequence[tuple[int, int | None]], *, keep: np.ndarray | None = None,
                real_rows: np.ndarray | None = None, heads: Sequence[int] | None = None,
                reduce_heads: str | None = None) -> list[tuple[tuple[int, int | None], float]]:
    """``panels`` of ``w`` with their largest ``|value|`` (masked cells and padded rows left out), the
    largest first (ties in the order given)."""
    get_map = grid_getter(w, keep, real_rows)
    heads = list(heads) if heads is not None else list(range(w.shape[1]))
    scored = []
    for layer, head in panels:
        if head is not None:
            data, one = get_map(layer, head)
            size = np.abs(np.asarray(data, dtype=np.float64))
            score = float(np.where(one, size, 0.0).max() if one is not None else size.max()) if size.size else 0.0
        else:
            reduced = reduced_layer(get_map, layer, heads, (w.shape[-2], w.shape[-1]), reduce_heads or "mean", True)
            score = float(np.nanmax(np.abs(reduced), initial=0.0))
        scored.append(((layer, head), score))
    return sorted(scored, key=lambda item: -item[1])


def slices_mosaic(maps: np.ndarray | None, *, title: str, names: Sequence[str] = (), keep: np.ndarray | None = None,
                  grids: Sequence[np.ndarray] | None = None, lead: tuple[int, ...] | None = None,
                  full_shape: tuple[int, int] | None = None, blocks: tuple[int, int] = (1, 1),
                  cmap: str | None = None, reduce: str = "mean", colorbar_label: str = "weight",
                  scale: ColourScale | None = None, ids: Sequence[Sequence[Any]] | None = None,
                  tokens: tuple[Sequence[str] | None, Sequence[str] | None] = (None, None)) -> Any:
    """The slices of ``maps [..., Lq, Lk]`` (``keep`` broadcasts to it) as one mosaic titled ``title``: the last
    leading axis across, the others down (``batch 0``, or ``0, 1`` for several); one leading axis of
    more than 16 wraps into rows. Or already aggregated ``grids`` of the slices of ``lead`` in
    C order (a blockwise run's), with ``full_shape`` and ``blocks``. ``ids``: each axis's positions' names
    (``slices_layout``)."""
    if maps is not None:
        lead = tuple(maps.shape[:-2])
        shape = (maps.shape[-2], maps.shape[-1])
        full_keep = None if keep is None else np.broadcast_to(keep, maps.shape)
    else:
        assert grids is not None and lead is not None
        shape = (grids[0].shape[0], grids[0].shape[1])
        full_keep = None
    count = int(np.prod(lead))
    rows, cols, row_labels, col_labels, row_name, col_name = slices_layout(lead, names, ids=ids)

    def get(r: int, c: int) -> tuple[np.ndarray, np.ndarray | None] | None:
        n = r * cols + c
        if n >= count:
            return None
        if maps is None:
            assert grids is not None
            return grids[n], None
        index = tuple(int(i) for i in np.unravel_index(n, lead))
        return maps[index], None if full_keep is None else full_keep[index]

    return mosaic_figure(get, rows, cols, shape, title=title, row_labels=row_labels, col_labels=col_labels,
                         row_name=row_name, col_name=col_name, cmap=cmap, reduce=reduce,
                         colorbar_label=colorbar_label, full_shape=full_shape, blocks=blocks, scale=scale,
                         tokens=tokens)

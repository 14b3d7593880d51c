"""The offline HTML report (``--html FILE``): one self-contained page, script, style and data inline.

What the page shows (drawn by ``assets/report.js``, styled by ``assets/report.css``, both inlined here
so that the file opens from disk, offline, with no server and no network request of any kind):

* the grid of maps (a model's layer x head grid; a compute command's batch x head slices) as
  thumbnails, all on one colour scale with a colour bar;
* one map at a time, larger, with token labels on its axes: a click on a thumbnail opens it, a
  hover over a cell reads its query, key and weight (and their positions);
* a head view (as bertviz draws it: the tokens in two columns, lines from a chosen query token to
  the keys it attends to, opacity by weight; a head selector) when the maps have at most
  ``HEAD_VIEW_MAX`` tokens a side;
* a statistics table (inspect's head statistics, compare's per-head differences, a compute
  command's per-slice summary), sorted by a click on a column header.

Long maps are aggregated in blocks with the functions the PNGs use (``attnviz.blocks.block_factors``
and ``attnviz.blocks.reduce_panel``): the thumbnails as the ``--png`` grid lays out its panels
(``canvas.mosaic_layout``), the opened maps as ``--map-png`` (at most ``attnviz.blocks.MAX_SIDE``
cells a side), coarser when the whole report would hold more than ``MAX_VALUES`` numbers; the page
says so wherever a map is aggregated. That bounds the file: 16 MB for the opened maps (float32,
base64) plus the thumbnails, one colour index a cell (base64; the grid is at most about
``canvas.MOSAIC_SIDE`` cells a side up to 123 x 123 maps, 3.4 MB), under 20 MB in all; a BERT-base
dump (12 layers x 12 heads x 512 tokens) gives 15.8 MB (docs/output.md, "The HTML report").

The data travels as JSON in a ``<script type="application/json">`` element, with ``<``, ``>`` and
``&`` written as ``\\u003c`` ... so that no label from a user's file can end the element; the script
puts every label into the page with ``textContent``, never as markup. A Content-Security-Policy
forbids every fetch (images only from ``data:``, for the empty icon that keeps browsers from asking for
a favicon): the page loads nothing (the thumbnails are canvases the script paints).

NumPy only: no matplotlib (the colour maps are small tables here; ``--cmap`` reads matplotlib's,
which checking the option has loaded already), no TensorFlow.
"""

from __future__ import annotations

import base64
import html
import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from importlib import resources
from typing import TYPE_CHECKING, Any

import numpy as np

from attnviz import __version__
from attnviz import text as inert
from attnviz.blocks import MAX_SIDE, block_factors, reduce_panel
from attnviz.render.canvas import mosaic_layout

if TYPE_CHECKING:
    from attnviz.pipeline import Outcome

#: the opened maps of a report hold at most this many values in all (4 bytes each, base64: about 16 MB)
MAX_VALUES = 3_000_000
#: the head view is drawn for maps of at most this many tokens a side, at full resolution
HEAD_VIEW_MAX = 256
LABEL_WIDTH = 64  # characters of a token label kept in the page (the page shortens further for the axes)
BAD = (0xD9, 0xD9, 0xD9)  # masked cells: light grey, as in the PNGs
LEVELS = 255  # colours of a scale: a thumbnail's cells are indices 0..254 into them, 255 for masked

# matplotlib's viridis and RdBu_r at 33 evenly spaced points; the page and the thumbnails interpolate
_STOPS = {
    "viridis": "440154 470d60 48186a 482374 472d7b 453781 424086 3e4989 3b528b 375b8d 33638d 2f6b8e 2c728e 297a8e "
               "26828e 23898e 21918c 1f988b 1fa088 22a785 28ae80 32b67a 3fbc73 4ec36b 5ec962 70cf57 84d44b 98d83e "
               "addc30 c2df23 d8e219 ece51b fde725",
    "RdBu_r": "053061 0e4179 175290 1f63a8 2a71b2 3480b9 3f8ec0 529dc8 6bacd1 84bcd9 9bc9e0 aed3e6 c2ddec d4e6f1 "
              "e0ecf3 ecf2f5 f7f6f6 f9eee7 fbe5d8 fddcc9 fbccb4 f8bb9e f5aa89 ee9677 e48066 db6b55 d05548 c53e3d "
              "ba2832 ab162a 930e26 7c0722 67001f",
}


def colour_table(cmap: str | None, diverging: bool = False) -> np.ndarray:
    """``LEVELS`` RGB colours (``uint8 [LEVELS, 3]``) of a colour map: viridis (RdBu_r when ``diverging``)
    from the tables above; any other name from matplotlib (``check_cmap`` has vetted it)."""
    name = cmap or ("RdBu_r" if diverging else "viridis")
    if name in _STOPS:
        stops = np.array([[int(h[i:i + 2], 16) for i in (0, 2, 4)] for h in _STOPS[name].split()], np.float64)
        at = np.linspace(0.0, 1.0, len(stops))
        t = np.linspace(0.0, 1.0, LEVELS)
        return np.stack([np.interp(t, at, stops[:, ch]) for ch in range(3)], axis=1).round().astype(np.uint8)
    from matplotlib import colormaps

    rgba = colormaps[name](np.linspace(0.0, 1.0, LEVELS))
    return (rgba[:, :3] * 255).round().astype(np.uint8)


def colour_index(values: np.ndarray, vmin: float, vmax: float) -> np.ndarray:
    """The colour of each value, an index into the table (0 at ``vmin``, ``LEVELS - 1`` at ``vmax``);
    ``LEVELS`` for NaN (masked). The page's script computes the same."""
    span = vmax - vmin if vmax > vmin else 1.0
    with np.errstate(invalid="ignore"):
        t = np.clip((np.asarray(values, np.float64) - vmin) / span, 0.0, 1.0)
    index = np.floor(np.nan_to_num(t, nan=0.0) * (LEVELS - 1) + 0.5).astype(np.uint8)
    index[np.isnan(values)] = LEVELS
    return index


@dataclass
class StatsTable:
    """A sortable table of the page: ``columns`` are (name, kind, description), kind ``int``,
    ``num`` or ``text``; ``maps[n]`` is the map row ``n`` opens (or None)."""

    title: str
    columns: list[tuple[str, str, str]]
    rows: list[list[Any]] = field(default_factory=list)
    maps: list[int | None] = field(default_factory=list)
    caption: str = ""
    precision: int = 3
    sort: int | None = None  # the column the page sorts on when it opens (numbers: largest first)

    def as_json(self) -> dict[str, Any]:
        def value(v: Any) -> Any:
            if isinstance(v, (float, np.floating)):
                return float(v) if math.isfinite(float(v)) else None
            if isinstance(v, (int, np.integer)):
                return int(v)
            return None if v is None else inert.label(str(v), 80)

        return {"title": inert.title(self.title), "caption": inert.title(self.caption, 2000),
                "precision": self.precision, "sort": self.sort,
                "columns": [{"name": n, "kind": k, "description": d} for n, k, d in self.columns],
                "rows": [[value(v) for v in row] for row in self.rows], "maps": self.maps}


def detail_blocks(count: int, shape: tuple[int, int], budget: int = MAX_VALUES,
                  max_side: int = MAX_SIDE) -> tuple[int, int]:
    """Block sizes of the opened maps: ``--map-png``'s (at most ``max_side`` cells a side), coarser
    until ``count`` maps of ``shape`` hold at most ``budget`` values in all."""
    longest = max(shape)
    f = 1
    while True:
        side = min(max_side, math.ceil(longest / f))
        fr, fc = block_factors(shape[0], shape[1], side)
        if count * math.ceil(shape[0] / fr) * math.ceil(shape[1] / fc) <= budget or side == 1:
            return fr, fc
        f += 1


MapGetter = Callable[[int, int], "tuple[np.ndarray, np.ndarray | None] | None"]


def grid_report(
    get: MapGetter,
    rows: int,
    cols: int,
    shape: tuple[int, int],
    *,
    title: str,
    subtitle: str = "",
    row_labels: Sequence[str],
    col_labels: Sequence[str],
    row_name: str,
    col_name: str,
    map_names: Sequence[Sequence[str]] | None = None,
    q_labels: Sequence[str] | None = None,
    k_labels: Sequence[str] | None = None,
    row_q_labels: Sequence[Sequence[str] | None] | None = None,
    row_k_labels: Sequence[Sequence[str] | None] | None = None,
    q_name: str = "query",
    k_name: str = "key",
    cmap: str | None = None,
    reduce: str = "mean",
    diverging: bool = False,
    colorbar_label: str = "weight",
    stats: StatsTable | None = None,
    selected: tuple[int, int] = (0, 0),
    notes: Sequence[str] = (),
    full_shape: tuple[int, int] | None = None,
    blocks: tuple[int, int] = (1, 1),
    after_row: Callable[[int], None] | None = None,
    budget: int = MAX_VALUES,
    count: int | None = None,
    vmin: float | None = None,
    vmax: float | None = None,
    norm: str = "linear",
    image: dict[str, Any] | None = None,
) -> str:
    """The HTML document of ``rows x cols`` maps of ``shape`` (``get(r, c)`` as for
    ``mosaic.mosaic_figure``: the map of panel ``(r, c)`` and its keep mask, or None for an empty
    slot, ``count`` the maps that are not; maps already aggregated come with ``blocks`` and their
    ``full_shape``). ``row_q_labels``/``row_k_labels``: each grid row's own labels (a row per batch
    entry), instead of ``q_labels``/``k_labels``. The opened maps hold at most ``budget`` values in all.
    ``vmin``/``vmax`` fix the ends of the colour scale (``--vmin``/``--vmax``; ``vmax`` alone for diverging
    maps); the page's colours are linear whatever ``norm`` the PNGs use, and the page says so."""
    full = full_shape or shape
    thumb_blocks = mosaic_layout(rows, cols, shape).blocks  # the PNG grid's
    fr, fc = detail_blocks(count or rows * cols, shape, budget)

    def name(r: int, c: int) -> str:
        return map_names[r][c] if map_names is not None else f"{row_name} {row_labels[r]}, {col_name} {col_labels[c]}"

    found = _gather_maps(get, rows, cols, thumb_blocks, (fr, fc), reduce, name, after_row)
    low, high, fixed = _page_scale(found.low, found.high, vmin, vmax, diverging)
    found.encode(low, high)
    total = (blocks[0] * fr, blocks[1] * fc)
    page_notes = _page_notes(notes, fixed, norm, reduce, full, total,
                             (blocks[0] * thumb_blocks[0], blocks[1] * thumb_blocks[1]), (fr, fc) != (1, 1))
    return document({
        "attnviz": __version__, "title": inert.title(title), "subtitle": inert.title(subtitle, 2000),
        "notes": page_notes, **_grid_axes(row_name, col_name, row_labels, col_labels, rows, cols),
        "maps": found.maps, "selected": found.index(selected),
        "shape": list(full), "cells": [math.ceil(shape[0] / fr), math.ceil(shape[1] / fc)], "blocks": list(total),
        "thumbCells": list(found.thumbs[0].shape) if found.thumbs else [0, 0], "reduce": reduce,
        **_map_axes(q_labels, k_labels, q_name, k_name),
        **_row_axes(row_q_labels, row_k_labels),
        "scale": _scale_doc(low, high, diverging, colorbar_label, colour_table(cmap, diverging), found.masked),
        "headView": {"max": HEAD_VIEW_MAX,
                     "enabled": total == (1, 1) and max(full) <= HEAD_VIEW_MAX and bool(found.maps)},
        "stats": stats.as_json() if stats is not None else None,
        "image": image,
    })


@dataclass
class _Maps:
    """The maps of a report as ``_gather_maps`` reads them: each map's entry of the page (its place and
    name; its thumbnail and data once ``encode``d), its thumbnail and its opened map (float32), the
    highest and lowest value shown (the lowest at most 0), and whether a cell is masked."""

    maps: list[dict[str, Any]] = field(default_factory=list)
    thumbs: list[np.ndarray] = field(default_factory=list)
    details: list[np.ndarray] = field(default_factory=list)
    high: float = -math.inf
    low: float = 0.0
    masked: bool = False

    def encode(self, low: float, high: float) -> None:
        """Each map's thumbnail as colour indices on the scale ``[low, high]`` and its opened map as
        little-endian float32, both base64, into its entry of the page."""
        for m, thumb, detail in zip(self.maps, self.thumbs, self.details):
            m["thumb"] = base64.b64encode(colour_index(thumb, low, high).tobytes()).decode("ascii")
            m["data"] = base64.b64encode(detail.tobytes()).decode("ascii")

    def index(self, place: tuple[int, int]) -> int:
        """The number of the map at ``place`` (row, column) of the grid; 0 when there is none."""
        return {(m["row"], m["col"]): n for n, m in enumerate(self.maps)}.get(place, 0)


def _gather_maps(get: MapGetter, rows: int, cols: int, thumb_blocks: tuple[int, int], opened: tuple[int, int],
                 reduce: str, name: Callable[[int, int], str], after_row: Callable[[int], None] | None) -> _Maps:
    """Every map from ``get``, a row at a time (``after_row`` after each), in the thumbnails' blocks
    and in the ``opened`` maps' (the same array when the blocks are)."""
    found = _Maps()
    for r in range(rows):
        for c in range(cols):
            got = get(r, c)
            if got is None:
                continue
            data, keep = got
            thumb = reduce_panel(data, keep, *thumb_blocks, reduce)
            detail = thumb if opened == thumb_blocks else reduce_panel(data, keep, *opened, reduce)
            found.masked = found.masked or bool(np.isnan(detail).any())
            for cells in (thumb, detail):
                if np.isfinite(cells).any():
                    found.high = max(found.high, float(np.nanmax(cells)))
                    found.low = min(found.low, float(np.nanmin(cells)))
            found.maps.append({"row": r, "col": c, "name": inert.title(name(r, c))})
            found.thumbs.append(thumb)
            found.details.append(detail.astype("<f4"))
        if after_row is not None:
            after_row(r)
    return found


def _page_scale(low: float, high: float, vmin: float | None, vmax: float | None,
                diverging: bool) -> tuple[float, float, list[str]]:
    """The page's colour scale for values from ``low`` to ``high``: ``vmin``/``vmax`` where given
    (``vmax`` alone for diverging maps, symmetric around 0), and the options that fixed it."""
    if not math.isfinite(high):  # nothing but masked cells
        high, low = 1.0, 0.0
    fixed = []
    if vmin is not None and not diverging:
        low = vmin
        fixed.append(f"--vmin {vmin:g}")
    if vmax is not None:
        high = vmax
        fixed.append(f"--vmax {vmax:g}")
    if diverging:
        high = max(abs(low), abs(high)) if vmax is None else abs(vmax)
        high = high or 1.0
        low = -high
    elif high <= low:
        high = low + 1.0
    return low, high, fixed


def _page_notes(notes: Sequence[str], fixed: Sequence[str], norm: str, reduce: str, full: tuple[int, int],
                total: tuple[int, int], thumb_total: tuple[int, int], smaller: bool) -> list[str]:
    """The notes the page shows: the caller's, then what fixed the scale, that its colours are linear,
    and the blocks the opened maps (coarser than ``--map-png``'s when ``smaller``) and the thumbnails
    are drawn in."""
    page_notes = [inert.title(n, 2000) for n in notes]
    if fixed:
        page_notes.append(f"The colour scale is fixed by {' and '.join(fixed)}; values beyond it take its end colours "
                          "(hover a cell for its value).")
    if norm not in ("linear", "auto"):
        page_notes.append(f"Colours here are on a linear scale (--norm {inert.label(norm, 20)} applies to the PNGs).")
    if total != (1, 1):
        page_notes.append(f"Maps [{full[0]}, {full[1]}] are shown in blocks of {total[0]}x{total[1]} positions "
                          f"({reduce} of each block){', to keep this file small' if smaller else ''}.")
    if thumb_total != (1, 1):
        page_notes.append(f"Thumbnails: blocks of {thumb_total[0]}x{thumb_total[1]} positions ({reduce}).")
    return page_notes


def _scale_doc(low: float, high: float, diverging: bool, label: str, lut: np.ndarray, masked: bool) -> dict[str, Any]:
    """The page's colour scale: its ends, its label, its colours (``lut``) and whether a cell is masked."""
    return {"vmin": low, "vmax": high, "diverging": diverging, "label": inert.label(label, 40),
            "lut": base64.b64encode(lut.tobytes()).decode("ascii"), "masked": masked}


def _grid_axes(row_name: str, col_name: str, row_labels: Sequence[str], col_labels: Sequence[str], rows: int,
               cols: int) -> dict[str, Any]:
    """The page's names of the grid's axes and of its rows and columns, and its size."""
    return {"rowName": inert.label(row_name, 40), "colName": inert.label(col_name, 40),
            "rowLabels": [inert.label(t, 40) for t in row_labels],
            "colLabels": [inert.label(t, 40) for t in col_labels],
            "rows": rows, "cols": cols}


def _map_axes(q_labels: Sequence[str] | None, k_labels: Sequence[str] | None, q_name: str,
              k_name: str) -> dict[str, Any]:
    """The page's token labels of an opened map's axes and the axes' names."""
    return {"qLabels": None if q_labels is None else [inert.label(t, LABEL_WIDTH) for t in q_labels],
            "kLabels": None if k_labels is None else [inert.label(t, LABEL_WIDTH) for t in k_labels],
            "qName": inert.label(q_name, 40), "kName": inert.label(k_name, 40)}


def _row_axes(row_q: Sequence[Sequence[str] | None] | None,
              row_k: Sequence[Sequence[str] | None] | None) -> dict[str, Any]:
    """Each grid row's own token labels (``qLabelRows``, ``kLabelRows``), where the rows have their own."""
    def rows(given: Sequence[Sequence[str] | None] | None) -> list[list[str] | None] | None:
        if given is None:
            return None
        return [None if r is None else [inert.label(t, LABEL_WIDTH) for t in r] for r in given]

    return {"qLabelRows": rows(row_q), "kLabelRows": rows(row_k)}


def _asset(name: str) -> str:
    return resources.files("attnviz.render").joinpath("assets", name).read_text(encoding="utf-8")


def embed_json(doc: Any) -> str:
    """``doc`` as JSON that is safe inside a ``<script>`` element: ``<``, ``>`` and ``&`` escaped
    (``</script>`` in a label cannot end it); no NaN (not JSON)."""
    text = json.dumps(doc, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


CSP = ("default-src 'none'; img-src data:; style-src 'unsafe-inline'; script-src 'unsafe-inline'; "
       "base-uri 'none'; form-action 'none'")


def document(doc: dict[str, Any]) -> str:
    """The whole page: the style, the data and the scripts inline (the image panel's only when the page
    has a picture)."""
    css, js = _asset("report.css"), _asset("report.js")
    if doc.get("image") is not None:
        js += _asset("images.js")
    for name, text, tag in (("report.css", css, "</style"), ("report.js", js, "</script")):
        if tag in text.lower() or "<!--" in text:  # our own files; a guard against an edit that breaks the page
            raise ValueError(f"{name} must not contain {tag!r} or '<!--'")
    return (
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
        f"<meta http-equiv=\"Content-Security-Policy\" content=\"{CSP}\">\n"
        "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n"
        f"<meta name=\"generator\" content=\"attnviz {html.escape(__version__)}\">\n"
        "<link rel=\"icon\" href=\"data:,\">\n"
        f"<title>{html.escape(doc['title'])}</title>\n"
        f"<style>\n{css}</style>\n</head>\n<body>\n"
        "<noscript><p>This attnviz report draws its maps with JavaScript; please allow scripts for this file.</p>"
        "</noscript>\n<main id=\"app\"></main>\n"
        f"<script type=\"application/json\" id=\"attnviz-data\">{embed_json(doc)}</script>\n"
        f"<script>\n{js}</script>\n</body>\n</html>\n"
    )


# ----------------------------------------------------------------------------------------------
# The three kinds of report


def model_report(w: np.ndarray, *, title: str, subtitle: str = "", q_labels: Sequence[str] | None = None,
                 k_labels: Sequence[str] | None = None, keep: np.ndarray | None = None,
                 real_rows: np.ndarray | None = None, stats: StatsTable | None = None,
                 selected: tuple[int, int] = (0, 0), cmap: str | None = None, reduce: str = "mean",
                 diverging: bool = False, colorbar_label: str = "weight", notes: Sequence[str] = (),
                 layers: Sequence[int] | None = None, heads: Sequence[int] | None = None,
                 vmin: float | None = None, vmax: float | None = None, norm: str = "linear",
                 image: dict[str, Any] | None = None) -> str:
    """The report of a model's ``w [layers, heads, Lq, Lk]`` (perhaps memory-mapped), read a layer
    at a time, as ``mosaic.model_grid_figure``: ``keep`` broadcasts to ``w``, ``real_rows``
    (``[layers, heads, Lq]``) greys padded query rows; ``layers`` and ``heads`` choose the maps
    (``--layers``/``--heads``; all by default), ``selected`` is the (layer, head) opened first.
    ``stats`` has one row per layer and head of ``w``: those of the chosen maps are kept."""
    from attnviz.io import release_pages

    layer_ids = list(range(w.shape[0])) if layers is None else list(layers)
    head_ids = list(range(w.shape[1])) if heads is None else list(heads)
    full_keep = None if keep is None else np.broadcast_to(keep, w.shape)
    rows_real = None if real_rows is None else np.broadcast_to(real_rows, w.shape[:-1])

    def get(r: int, c: int) -> tuple[np.ndarray, np.ndarray | None]:
        li, hi = layer_ids[r], head_ids[c]
        one = None if full_keep is None else full_keep[li, hi]
        if rows_real is not None and not rows_real[li, hi].all():
            one = np.ones(w.shape[-2:], bool) if one is None else one.copy()
            one[~rows_real[li, hi]] = False
        return w[li, hi], one

    if stats is not None:  # the rows of the maps shown, opening them by their place in the grid
        place = {li * w.shape[1] + hi: r * len(head_ids) + c
                 for r, li in enumerate(layer_ids) for c, hi in enumerate(head_ids)}
        kept = [n for n, m in enumerate(stats.maps) if m in place]
        stats.rows = [stats.rows[n] for n in kept]
        stats.maps = [place[stats.maps[n]] for n in kept]  # type: ignore[index]
    at = (layer_ids.index(selected[0]) if selected[0] in layer_ids else 0,
          head_ids.index(selected[1]) if selected[1] in head_ids else 0)
    return grid_report(get, len(layer_ids), len(head_ids), (w.shape[-2], w.shape[-1]), title=title,
                       subtitle=subtitle, row_labels=[str(i) for i in layer_ids], col_labels=[str(i) for i in head_ids],
                       row_name="layer", col_name="head", q_labels=q_labels, k_labels=k_labels, cmap=cmap,
                       reduce=reduce, diverging=diverging, colorbar_label=colorbar_label, stats=stats,
                       selected=at, notes=notes, after_row=lambda _: release_pages(w), vmin=vmin, vmax=vmax, norm=norm,
                       image=image)


def head_stats_table(stats: dict[str, np.ndarray], columns: dict[str, str], *, caption: str = "",
                     precision: int = 3) -> StatsTable:
    """inspect's head statistics (``inspect.head_statistics``), one row per layer and head;
    ``columns`` maps a statistic to its column name."""
    layers, heads = stats["entropy"].shape
    table = StatsTable("head statistics", [("layer", "int", "layer"), ("head", "int", "head")]
                       + [(name, "num", key) for key, name in columns.items()] + [("tag", "text", "")],
                       caption=caption, precision=precision)
    for li in range(layers):
        for hi in range(heads):
            table.rows.append([li, hi, *[float(np.asarray(stats[k])[li, hi]) for k in columns],
                               str(stats["tag"][li, hi])])
            table.maps.append(li * heads + hi)
    return table


def compare_stats_table(diff: np.ndarray, js: np.ndarray, precision: int = 3) -> StatsTable:
    """Per layer and head of ``diff [L, B, H, Lq, Lk]`` (A - B, 0 in padded rows) and ``js
    [L, B, H, Lq]`` (NaN in padded rows): largest and mean |A - B| and Jensen-Shannon divergence
    over every batch entry's real rows."""
    heads = diff.shape[2]
    table = StatsTable("differences per head (every batch entry, real query rows)",
                       [("layer", "int", "layer"), ("head", "int", "head"),
                        ("max |A-B|", "num", "largest |A - B|"), ("mean |A-B|", "num", "mean |A - B|"),
                        ("mean JS", "num", "mean Jensen-Shannon divergence of the rows (nats)"),
                        ("max JS", "num", "largest Jensen-Shannon divergence of a row")],
                       caption="JS: Jensen-Shannon divergence of a query row of A and of B, in nats (at most ln 2)",
                       precision=precision)
    from attnviz.inspection.compare import head_changes

    for h in sorted(head_changes(diff, js), key=lambda h: (h["layer"], h["head"])):
        table.rows.append([h["layer"], h["head"], h["max_abs"], h["mean_abs"], h["mean_js"], h["max_js"]])
        table.maps.append(h["layer"] * heads + h["head"])
    return table


def compute_report(outcome: Outcome, *, title: str | None = None, cmap: str | None = None, reduce: str = "mean",
                   index: tuple[int, ...] = (), precision: int = 3, vmin: float | None = None,
                   vmax: float | None = None, norm: str = "linear") -> str:
    """The report of a compute command: its weights' batch x head slices (the last leading axis
    across, the others down; one leading axis of more than 16 wraps, as ``mosaic.slices_mosaic``),
    and the per-slice summary. A blockwise run's aggregated maps stand in for the weights."""
    from attnviz.errors import shape_str
    from attnviz.render.mosaic import lead_axis_names
    from attnviz.render.table import slice_label

    prep, result, streamed = outcome.prepared, outcome.result, outcome.streamed
    names = prep.lead_names
    lead, (lq, lk) = tuple(prep.weights_shape[:-2]), tuple(prep.weights_shape[-2:])
    heading = title or f"{prep.variant.name} attention weights {shape_str(prep.weights_shape)}"
    slices = list(np.ndindex(*lead)) if lead else [()]
    count = len(slices)
    notes: list[str] = []
    if any(v.png for v in result.views):
        notes.append(f"The report shows the {prep.variant.weights_title}; the PNG also draws "
                     + ", ".join(v.title for v in result.views if v.png) + ".")
    if streamed is not None:
        grids = list(streamed.grids)
        if len(grids) < count:
            notes.append(f"A blockwise run keeps the maps of the first {len(grids)} of {count} slices: those are "
                         "shown.")
            slices, count = slices[:len(grids)], len(grids)
        shape: tuple[int, int] = (grids[0].shape[0], grids[0].shape[1])
        blocks, full = streamed.grid_blocks, (lq, lk)
    else:
        shape, blocks, full = (lq, lk), (1, 1), None
        full_keep = None if prep.mask.keep is None else np.broadcast_to(prep.mask.keep, prep.weights_shape)
    axis = lead_axis_names(len(lead), names)
    if len(lead) <= 1:
        n = count
        cols = n if n <= 16 else math.ceil(math.sqrt(n))
        rows = math.ceil(n / cols)
        col_labels = [str(c) if rows == 1 else f"+{c}" for c in range(cols)]
        row_labels = [""] if rows == 1 else [f"{r * cols}-{min(n, (r + 1) * cols) - 1}" for r in range(rows)]
        row_name, col_name = ("", axis[0] if axis else "") if rows == 1 else (f"{axis[0]}s", "+ offset in the row")
    else:
        cols, rows = lead[-1], count // lead[-1]
        col_labels = [str(c) for c in range(cols)]
        row_labels = [", ".join(str(i) for i in s) for s in np.ndindex(*lead[:-1])]
        row_name, col_name = ", ".join(axis[:-1]), axis[-1]
    map_names = [[slice_label(slices[r * cols + c], names) if lead and r * cols + c < count else "map"
                  for c in range(cols)] for r in range(rows)]

    def get(r: int, c: int) -> tuple[np.ndarray, np.ndarray | None] | None:
        n = r * cols + c
        if n >= count:
            return None
        if streamed is not None:
            return streamed.grids[n], None
        return result.weights[slices[n]], None if full_keep is None else full_keep[slices[n]]

    stats = StatsTable("per-slice summary (means over the query rows that may attend)",
                       [("slice", "text", "batch/head slice"), ("H", "num", "mean entropy (nats)"),
                        ("H/ln n", "num", "mean entropy over log of the keys a row may attend"),
                        ("max", "num", "mean largest weight"), ("masked rows", "int", "fully masked query rows")],
                       precision=precision)
    for n, s in enumerate(np.ndindex(*lead) if lead else [()]):
        one = outcome.stats.select(s)
        live = ~one.masked
        means = [float(x[live].mean()) if live.any() else None for x in (one.entropy, one.entropy_norm, one.max)]
        stats.rows.append([slice_label(s, names) if lead else "weights", *means, int(one.masked.sum())])
        stats.maps.append(n if n < count else None)
    flat = int(np.ravel_multi_index(index, lead)) if lead and index else 0
    selected = divmod(flat, cols) if flat < count else (0, 0)
    lead_note = f"leading axes {', '.join(axis)}" if lead else "one map"
    return grid_report(get, rows, cols, shape, title=heading,
                       subtitle=f"{prep.variant.name}: weights {shape_str(prep.weights_shape)}, {lead_note}",
                       row_labels=row_labels, col_labels=col_labels, row_name=row_name, col_name=col_name,
                       map_names=map_names, q_labels=prep.q_labels, k_labels=prep.k_labels,
                       q_name=prep.variant.axis_names[0], k_name=prep.variant.axis_names[1], cmap=cmap, reduce=reduce,
                       stats=stats, selected=selected, notes=notes, full_shape=full, blocks=blocks, count=count,
                       vmin=vmin, vmax=vmax, norm=norm)


def inspect_html(result: Any, fig: Any, precision: int) -> str:
    """inspect's --html: every map of the batch entry (as the --png grid) and the head statistics, from
    an ``attnviz.inspection.inspecting.InspectResult`` and ``FigureOptions``."""
    from attnviz.errors import shape_str
    from attnviz.inspection.masks import grid_masks
    from attnviz.render.summaries import COLUMNS

    opened = result.opened
    w, (li, bi, hi), grid = opened.weights, opened.index, opened.grid
    name = fig.title or f"{w.what} of {w.source}"
    keep, real = grid_masks(opened.masks, w.shape, bi)
    batches = "every batch entry" if opened.options.selection.batch is None else f"batch entry {bi}"
    table = head_stats_table(result.stats, {k: v for k, v in COLUMNS.items() if k in result.stats},
                             precision=precision,
                             caption=("statistics of each row renormalised to sum 1; " if w.renormalised else "")
                             + f"means over query rows of {batches}: entropy H (nats) and H/ln n; dist: mean "
                                     "|i - j| weighted; diag, prev (j = i - 1), first (j = 0), last: mean weight on "
                                     "that key; max: mean largest weight")
    return model_report(
        w.data[:, bi], title=f"{name}, batch {bi}", q_labels=opened.q_labels, k_labels=opened.k_labels, keep=keep,
        real_rows=real, stats=table, selected=(li, hi), cmap=fig.cmap, reduce=fig.reduce, layers=grid.layers,
        heads=grid.heads, vmin=fig.vmin, vmax=fig.vmax, norm=fig.norm, colorbar_label=w.unit,
        image=None if result.overlay is None else image_panel(result),
        subtitle=f"{w.source} {shape_str(w.file_shape)} read as [layers, batch, heads, Lq, Lk] = "
                 f"{shape_str(w.shape)}; batch entry {bi} of {w.shape[1]}")


def compare_html(result: Any, fig: Any, precision: int) -> str:
    """compare's --html: A - B for every layer and head of the batch entry, and per-head differences,
    from an ``attnviz.inspection.compare.CompareResult``."""
    from attnviz.errors import shape_str
    from attnviz.inspection.masks import grid_masks

    run, c = result.run, result.comparison
    a, b, (li, bi, hi) = run.a, run.b, run.index
    keep, real = grid_masks(run.masks, a.shape, bi)
    if run.options.selection.layer is None:  # open on the largest difference of the entry shown
        li, hi = largest_difference(c.diff[:, bi], keep, real, run.grid.layers, run.grid.heads)
    stats = compare_stats_table(c.diff, c.js, precision)
    stats.sort = 2  # max |A-B|, largest first
    return model_report(
        c.diff[:, bi], title=fig.title or f"A - B: {a.source} - {b.source}, batch {bi}",
        subtitle=f"A = {a.source}, B = {b.source}, {shape_str(a.shape)} [layers, batch, heads, Lq, Lk]; "
                 f"batch entry {bi}", keep=keep, real_rows=real, diverging=True, colorbar_label="A - B",
        stats=stats, selected=(li, hi), cmap=fig.cmap, reduce=fig.reduce, q_labels=run.q_labels,
        k_labels=run.k_labels, layers=run.grid.layers, heads=run.grid.heads, vmax=fig.vmax, norm=fig.norm,
        notes=run.notes)


def largest_difference(diff: np.ndarray, keep: np.ndarray | None, real: np.ndarray | None, layers: Sequence[int],
                       heads: Sequence[int]) -> tuple[int, int]:
    """The (layer, head) of ``diff [layers, heads, Lq, Lk]`` with the largest |A - B| (masked cells and padded
    rows left out; ties: the first)."""
    from attnviz.render.mosaic import rank_panels

    ranked = rank_panels(diff, [(layer, head) for layer in layers for head in heads], keep=keep, real_rows=real,
                         heads=heads)
    (layer, head), _ = ranked[0]
    return layer, int(head or 0)


#: the image panel holds at most this many values (float32, base64: about 6 MB): every query row over
#: the patches for the mean of the heads and each head, or for the mean alone, or the rows of the
#: query and of the tokens outside the image
IMAGE_VALUES = 1_500_000


def image_panel(result: Any) -> dict[str, Any]:
    """The image panel of inspect's report (``--image`` or ``--patch-grid``): the picture (a PNG data
    URI), the patch grid and where the patches are among the keys, and for the overlay's layer the rows
    of the queries over the patches (the mean of the heads, and each head when they fit in
    ``IMAGE_VALUES``): hovering a patch shows its row, hovering a token outside the image (CLS,
    registers, a text token) shows its."""
    from attnviz.render.heatmap import png_bytes

    opened, found = result.opened, result.overlay
    image, w = opened.image, opened.weights
    layout = image.layout
    lq = w.shape[-2]
    layer = w.data[found.layer, found.batch][found.heads][:, :, layout.start:layout.stop].astype(np.float64)
    inside = [p for p in range(lq) if layout.start <= p < layout.stop]
    outside = [p for p in range(lq) if not layout.start <= p < layout.stop]
    choices = ["mean of heads"] + [f"head {h}" for h in found.heads] * (len(found.heads) > 1)
    stacks = [layer.mean(axis=0)] + list(layer) * (len(found.heads) > 1)
    rows = list(range(lq))
    notes = []
    if len(stacks) * lq * layout.count > IMAGE_VALUES:
        stacks, choices = stacks[:1], choices[:1]
        notes.append("Only the mean of the heads is in this page (the heads would make it too large).")
    if lq * layout.count > IMAGE_VALUES:
        rows = sorted(set(outside) | {image.query})
        notes.append(f"{layout.count} patches are too many to hover: the page holds the rows of the tokens outside "
                     "the image only.")
    data = np.stack([s[rows] for s in stacks]).astype("<f4")
    src = None
    if image.picture is not None:
        rgb = image.picture.rgb
        rgba = np.concatenate([rgb, np.full(rgb.shape[:2] + (1,), 255, np.uint8)], axis=-1)
        src = "data:image/png;base64," + base64.b64encode(png_bytes(rgba, level=6)).decode("ascii")
    labels = opened.q_labels
    return {"src": src, "size": list(image.size) if image.size else None, "grid": list(layout.grid),
            "start": layout.start, "count": layout.count, "layer": found.layer, "batch": found.batch,
            "choices": choices, "rows": rows, "query": image.query,
            "patchRows": all(p in rows for p in inside) and bool(inside),
            "tokens": [{"pos": p, "label": inert.label(labels[p], LABEL_WIDTH) if labels else None}
                       for p in outside if p in rows][:512],
            "describe": layout.describe(), "notes": notes,
            "data": base64.b64encode(data.tobytes()).decode("ascii")}

"""A mosaic's picture laid out pixel for pixel, and the matplotlib figure drawn around it.

``mosaic_layout`` says where the panels of a ``rows x cols`` mosaic go in its picture
(``MosaicLayout``): each map aggregated in blocks (``attnviz.blocks``) to at most a panel's side,
each cell drawn as a whole number of pixels, separators between the panels, and a strip under each
row of panels for their captions. ``mosaic_canvas`` puts the picture in a figure: one axes exactly
the picture's size in pixels at ``heatmap.DPI`` (one cell of the picture is one pixel of the saved
PNG, no resampling), row and column labels, a colour bar, the heading wrapped to the figure's width
and each panel's caption, with the margins measured from the text so that nothing is clipped.

What goes into the picture is ``attnviz.render.mosaic``'s (``mosaic_figure``); the HTML report
lays out its thumbnails with ``mosaic_layout`` too. matplotlib is imported inside the functions that
need it, never at import.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from attnviz import text as inert
from attnviz.blocks import block_factors
from attnviz.render.heatmap import DPI, PANEL_TITLE_WIDTH, PLAIN, agg_canvas, quiet_matplotlib, wrap_text
from attnviz.render.scale import ColourScale, per_panel_ticks, plain_bar_ticks

MOSAIC_SIDE = 1600  # a mosaic picture is at most about this many pixels a side ...
PANEL_MAX = 160  # ... each panel at most this many a side (small maps: cells of several pixels)
PANEL_MIN = 12  # ... and at least this many (the picture grows beyond MOSAIC_SIDE instead)
CAPTION_FONT = 7  # points: the line of text under each panel (its layer and head, or its own maximum)
TICK_FONT, AXIS_FONT, TITLE_FONT = 9, 10, 12  # points
TOKEN_FONT = 7  # points: the token labels along the grid's outer panels, drawn when a cell holds a line of them
TOKEN_WIDTH = 12  # characters of a token label there (longer ones shortened with …)
PAD = 12  # pixels around the figure's content
BAR_GAP, BAR_W = 16, 18  # pixels: between the picture and the colour bar, and the colour bar's width


@dataclass(frozen=True)
class MosaicLayout:
    """Where the panels of a ``rows x cols`` mosaic go, in pixels of the picture: each map aggregated
    in ``blocks`` to ``cells``, each cell drawn as ``scale`` pixels, ``gap`` pixels between panels,
    and ``caption`` pixels under each row of panels for a line of text per panel (0: none)."""

    rows: int
    cols: int
    cells: tuple[int, int]
    blocks: tuple[int, int]
    scale: tuple[int, int]
    gap: int
    caption: int = 0

    @property
    def panel(self) -> tuple[int, int]:
        """A panel's height and width in pixels."""
        return self.cells[0] * self.scale[0], self.cells[1] * self.scale[1]

    @property
    def size(self) -> tuple[int, int]:
        """The picture's height and width in pixels."""
        ph, pw = self.panel
        return (self.rows * (ph + self.caption) + (self.rows - 1) * self.gap,
                self.cols * pw + (self.cols - 1) * self.gap)

    def origin(self, r: int, c: int) -> tuple[int, int]:
        """The top-left pixel (row, column) of panel ``(r, c)``."""
        ph, pw = self.panel
        return r * (ph + self.caption + self.gap), c * (pw + self.gap)


def mosaic_layout(rows: int, cols: int, shape: tuple[int, int], side: int = MOSAIC_SIDE, caption: int = 0,
                  panel_min: int = PANEL_MIN) -> MosaicLayout:
    """The layout of ``rows x cols`` maps of ``shape`` in a picture of about ``side`` pixels a side:
    panels of at most ``PANEL_MAX`` (at least ``panel_min``) pixels, long maps aggregated in blocks,
    short ones drawn with cells of several pixels; ``caption`` pixels under each panel for its label."""
    def target(gap: int) -> int:
        fit = min((side - (cols - 1) * gap) // cols, (side - (rows - 1) * gap) // rows - caption)
        return max(panel_min, min(max(PANEL_MAX, panel_min), fit))

    gap = 2 if target(2) >= 32 else 1
    side_px = target(gap)
    fr, fc = block_factors(shape[0], shape[1], side_px)
    cells = (math.ceil(shape[0] / fr), math.ceil(shape[1] / fc))
    scale = (max(1, side_px // cells[0]), max(1, side_px // cells[1]))
    if panel_min > PANEL_MIN:  # wide enough for its caption, whatever the map's length
        scale = (scale[0], max(scale[1], math.ceil(panel_min / cells[1])))
    return MosaicLayout(rows, cols, cells, (fr, fc), scale, gap, caption)


def _thin(n: int, pitch: int, needed: float) -> int:
    """Label every ``step``-th of ``n`` positions ``pitch`` pixels apart, so that labels ``needed``
    pixels wide (or tall) never touch."""
    return max(1, math.ceil(needed / max(pitch, 1))) if n > 1 else 1


def mosaic_canvas(picture: np.ndarray, layout: MosaicLayout, heading: str, mappable: Any, colorbar_label: str,
                  row_labels: Sequence[str], col_labels: Sequence[str], row_name: str, col_name: str, *,
                  picture_map: Any = None, extend: str = "neither", captions: Sequence[Sequence[str]] = (),
                  per_panel: tuple[ColourScale, bool] | None = None,
                  tokens: tuple[Sequence[str] | None, Sequence[str] | None] = (None, None)) -> Any:
    """The figure around a mosaic picture: one axes exactly the picture's size in pixels (at ``DPI``),
    row labels on the left, column labels on top, a colour bar on the right (``mappable``; the picture
    is drawn with ``picture_map``, whose "over" colour is the separators'), the heading above,
    wrapped to the figure's width, and each panel's caption under it; margins measured from the text,
    so nothing is clipped. ``tokens``: the maps' query and key labels, written along the first column's
    panels and under the last row's where each cell holds a line of them (``token_labels``)."""
    from matplotlib.figure import Figure

    quiet_matplotlib()
    height, width = picture.shape
    spare = 100  # a provisional canvas: text sizes and extents (measured beyond its edges too) do not depend on it
    fig: Any = Figure(figsize=((width + 2 * spare) / DPI, (height + 2 * spare) / DPI), dpi=DPI)
    agg_canvas(fig)
    ax = _picture_axes(fig, picture, picture_map or mappable.cmap, mappable.norm)
    renderer = fig.canvas.get_renderer()
    written = len(ax.texts)
    beside = token_labels(ax, layout, tokens[0], tokens[1], renderer)
    # a map a cell a position, its tokens given, none written: its cells are too small (``figures.tokens_note``)
    fig.attnviz_tokens_left_out = (layout.blocks == (1, 1) and len(ax.texts) == written
                                   and (tokens[0] is not None or tokens[1] is not None))
    fig.attnviz_mosaic = (ax, layout)  # where each panel is drawn (``attnviz.monitoring.tensorboard.layer_bands``)
    labels = _label_picture(ax, layout, row_labels, col_labels, row_name, col_name, renderer, beside)
    cax = _mosaic_colour_bar(fig, mappable, colorbar_label, extend, per_panel)
    labels.captions = _write_captions(ax, layout, captions, renderer)
    _place(ax, cax, (spare, spare), picture.shape, (width + 2 * spare, height + 2 * spare))
    left, right, below, above = _margins(ax, cax, renderer, spare, picture.shape)
    content_w = math.ceil(left + width + right)
    content_h = math.ceil(below + height + above)

    text = fig.text(0.5, 0.5, heading, fontsize=TITLE_FONT, ha="center", va="top", **PLAIN)
    one_line = text.get_window_extent(renderer).width
    fig_w = max(content_w, min(math.ceil(one_line), max(content_w, 900))) + 2 * PAD
    if one_line > fig_w - 2 * PAD:  # wrap the heading to the figure's width (a long path breaks too)
        wrap_text(text, fig_w - 2 * PAD, renderer, fewest=10)
    title_h = math.ceil(text.get_window_extent(renderer).height)
    fig_h = PAD + title_h + 10 + content_h + PAD
    x0 = round((fig_w - content_w) / 2 + left)  # the picture starts on a whole pixel: no resampling
    y0 = round(PAD + below)
    # a hair more than whole pixels: the canvas is int(inches * dpi) pixels, never one short
    fig_w_in, fig_h_in = (fig_w + 0.25) / DPI, (fig_h + 0.25) / DPI
    fig.set_size_inches(fig_w_in, fig_h_in)
    _place(ax, cax, (x0, y0), picture.shape, (fig_w_in * DPI, fig_h_in * DPI))
    text.set_position((0.5, 1 - PAD / (fig_h_in * DPI)))
    fig.mosaic_layout = layout  # where each panel is in the picture (tests read pixels by it)
    fig.mosaic_labels = labels  # its row and column labels and their names
    return fig


def _picture_axes(fig: Any, picture: np.ndarray, cmap: Any, norm: Any) -> Any:
    """An axes with the picture in it as one image (``pixel_image``), frameless (a frame would be drawn
    over the outermost cells); placed later."""
    height, width = picture.shape
    ax = fig.add_axes((0, 0, 1, 1))
    image = pixel_image(ax, cmap, norm)
    image.set_data(picture)
    image.set_extent((-0.5, width - 0.5, height - 0.5, -0.5))
    ax.add_image(image)
    ax.set_xlim(-0.5, width - 0.5)
    ax.set_ylim(height - 0.5, -0.5)
    ax.spines[:].set_visible(False)
    return ax


def pixel_image(ax: Any, cmap: Any, norm: Any) -> Any:
    """An image for ``ax`` that puts each cell of its data on one pixel (nearest, at the same size).
    Where it lands on whole pixels of an Agg canvas (a PNG) at its own size, as a mosaic's picture does,
    it is coloured once (``cmap(norm(data))``, what matplotlib's resampling at that size gives, to the
    bit) and drawn as it is, without resampling; elsewhere (SVG, PDF, another size) it is matplotlib's
    image."""
    from matplotlib.backends.backend_agg import RendererAgg
    from matplotlib.image import AxesImage
    from matplotlib.transforms import IdentityTransform

    class PixelImage(AxesImage):
        def make_image(self, renderer: Any, magnification: float = 1.0, unsampled: bool = False) -> Any:
            data = self.get_array()
            if isinstance(renderer, RendererAgg) and magnification == 1.0 and not unsampled and data is not None:
                box = self.get_window_extent(renderer)
                rows, cols = data.shape[:2]
                x0, y0 = round(box.x0), round(box.y0)
                if max(abs(box.x0 - x0), abs(box.y0 - y0), abs(box.width - cols), abs(box.height - rows)) < 1e-3:
                    # matplotlib's images come bottom row first
                    return self.to_rgba(data, bytes=True)[::-1], x0, y0, IdentityTransform()
            return super().make_image(renderer, magnification, unsampled)

    return PixelImage(ax, cmap=cmap, norm=norm, interpolation="nearest", interpolation_stage="data", origin="upper")


@dataclass
class MosaicLabels:
    """The texts that name a mosaic's rows and columns of panels: the labels drawn (thinned where they
    would touch; empty ones left out) and the names of the two axes (None when empty)."""

    rows: list[Any]
    cols: list[Any]
    row_name: Any
    col_name: Any
    captions: list[Any] = field(default_factory=list)  # the panels' captions, row-major (empty ones left out)


def token_labels(ax: Any, layout: MosaicLayout, q_labels: Sequence[str] | None, k_labels: Sequence[str] | None,
                 renderer: Any) -> float:
    """The query labels left of the first column's panels (every row of panels) and the key labels under the
    last row's (written downwards), as ``--map-png`` writes them, where the maps are drawn a cell a position
    and a cell holds a line of ``TOKEN_FONT``; the pixels the query labels take on the left (0: none)."""
    from matplotlib.transforms import blended_transform_factory, offset_copy

    if layout.blocks != (1, 1):
        return 0.0
    line = TOKEN_FONT * DPI / 72
    sq, sk = layout.scale
    ph, pw = layout.panel
    fig = ax.figure
    pad = 3 * DPI / 72
    widest = 0.0
    if q_labels is not None and sq >= 1.05 * line:
        left = offset_copy(blended_transform_factory(ax.transAxes, ax.transData), fig=fig, x=-pad, units="dots")
        for r in range(layout.rows):
            y0 = layout.origin(r, 0)[0]
            for i, text in enumerate(q_labels[:layout.cells[0]]):
                drawn = ax.text(0, y0 + i * sq + (sq - 1) / 2, inert.label(str(text), TOKEN_WIDTH), transform=left,
                                ha="right", va="center_baseline", fontsize=TOKEN_FONT, **PLAIN)
                widest = max(widest, drawn.get_window_extent(renderer).width)
    if k_labels is not None and sk >= 1.05 * line:
        below = offset_copy(blended_transform_factory(ax.transData, ax.transAxes), fig=fig, y=-pad, units="dots")
        for c in range(layout.cols):
            x0 = layout.origin(layout.rows - 1, c)[1]
            for j, text in enumerate(k_labels[:layout.cells[1]]):
                ax.text(x0 + j * sk + (sk - 1) / 2, 0, inert.label(str(text), TOKEN_WIDTH), transform=below,
                        rotation=90, ha="center", va="top", fontsize=TOKEN_FONT, **PLAIN)
    return widest + pad if widest else 0.0


def _label_picture(ax: Any, layout: MosaicLayout, row_labels: Sequence[str], col_labels: Sequence[str],
                   row_name: str, col_name: str, renderer: Any, beside: float = 0.0) -> MosaicLabels:
    """The rows of panels labelled on the left and the columns on top, every one or every ``step``-th
    so that labels never touch (the axis name then says which), and the axes named. Plain texts placed
    in pixels from the picture's edges, as tick labels and axis labels would be (3 points out, the
    names 4 points beyond the labels): the picture's axes has no ticks and no axis artists, which cost
    more to make and to draw than all of the rest of the figure."""
    from matplotlib.transforms import blended_transform_factory, offset_copy

    ph, pw = layout.panel
    row_text = [inert.label(t, PANEL_TITLE_WIDTH) for t in row_labels]
    col_text = [inert.label(t, PANEL_TITLE_WIDTH) for t in col_labels]
    line = TICK_FONT * DPI / 72  # pixels of a line of tick labels
    row_step = _thin(layout.rows, ph + layout.gap, 1.3 * line)
    widest = max((len(t) for t in col_text), default=1)
    col_step = _thin(layout.cols, pw + layout.gap, 0.65 * line * widest + 0.8 * line)
    ax.set_axis_off()
    fig = ax.figure
    pad, name_pad = 3 * DPI / 72, 4 * DPI / 72  # pixels: matplotlib's tick label and axis label pads
    left = offset_copy(blended_transform_factory(ax.transAxes, ax.transData), fig=fig, x=-(pad + beside),
                       units="dots")  # beyond the token labels, when there are
    top = offset_copy(blended_transform_factory(ax.transData, ax.transAxes), fig=fig, y=pad, units="dots")
    rows = [ax.text(0, layout.origin(r, 0)[0] + (ph - 1) / 2, row_text[r], transform=left, ha="right",
                    va="center_baseline", fontsize=TICK_FONT, **PLAIN)
            for r in range(0, layout.rows, row_step) if row_text[r]]
    cols = [ax.text(layout.origin(0, c)[1] + (pw - 1) / 2, 1, col_text[c], transform=top, ha="center", va="bottom",
                    fontsize=TICK_FONT, **PLAIN)
            for c in range(0, layout.cols, col_step) if col_text[c]]
    thinned = " (every %d)"
    row_title = inert.label(row_name, PANEL_TITLE_WIDTH) + (thinned % row_step if row_step > 1 else "")
    col_title = inert.label(col_name, PANEL_TITLE_WIDTH) + (thinned % col_step if col_step > 1 else "")
    row_named = col_named = None
    if row_title:
        out = pad + beside + max((t.get_window_extent(renderer).width for t in rows), default=0.0) + name_pad
        row_named = ax.text(0, 0.5, row_title, transform=offset_copy(ax.transAxes, fig=fig, x=-out, units="dots"),
                            rotation=90, rotation_mode="anchor", ha="center", va="bottom", fontsize=AXIS_FONT,
                            **PLAIN)
    if col_title:
        up = pad + max((t.get_window_extent(renderer).height for t in cols), default=0.0) + name_pad
        col_named = ax.text(0.5, 1, col_title, transform=offset_copy(ax.transAxes, fig=fig, y=up, units="dots"),
                            ha="center", va="bottom", fontsize=AXIS_FONT, **PLAIN)
    return MosaicLabels(rows, cols, row_named, col_named)


def _mosaic_colour_bar(fig: Any, mappable: Any, label: str, extend: str,
                       per_panel: tuple[ColourScale, bool] | None) -> Any:
    """The colour bar's axes (placed later), the bar labelled, its ends each panel's own with
    ``per_panel``."""
    cax = fig.add_axes((0, 0, 0.1, 0.1))
    bar = fig.colorbar(mappable, cax=cax, extend=extend)
    bar.set_label(inert.label(label, PANEL_TITLE_WIDTH), fontsize=AXIS_FONT, **PLAIN)
    if per_panel is not None:
        per_panel_ticks(bar, *per_panel)
    else:
        plain_bar_ticks(bar)
    cax.tick_params(labelsize=TICK_FONT)
    return cax


def _write_captions(ax: Any, layout: MosaicLayout, captions: Sequence[Sequence[str]], renderer: Any) -> list[Any]:
    """Each panel's caption (row-major) under it, within the picture's own pixels: in the strip under
    its row, in a smaller font when it is wider than the panel."""
    ph, pw = layout.panel
    written = []
    for r, row in enumerate(captions):
        for c, words in enumerate(row):
            if not words:
                continue
            y, x = layout.origin(r, c)
            text = ax.text(x + (pw - 1) / 2, y + ph + layout.caption / 2 - 0.5, inert.label(words, PANEL_TITLE_WIDTH),
                           ha="center", va="center", fontsize=CAPTION_FONT, **PLAIN)
            while text.get_window_extent(renderer).width > pw and text.get_fontsize() > 4:
                text.set_fontsize(text.get_fontsize() - 0.5)
            written.append(text)
    return written


def _place(ax: Any, cax: Any, at: tuple[float, float], shape: tuple[int, int], figure: tuple[float, float]) -> None:
    """The picture's axes with its bottom-left corner ``at`` (pixels from the bottom left of a figure
    ``figure`` pixels wide and tall), the size of the ``shape`` picture; the colour bar on its right,
    centred on it."""
    height, width = shape
    fig_w, fig_h = figure
    bar_h = max(160, min(height, 900))
    bar_y = (height - bar_h) / 2

    def place(axes: Any, x: float, y: float, w: float, h: float) -> None:  # pixels, from the bottom left
        axes.set_position((x / fig_w, y / fig_h, w / fig_w, h / fig_h))

    place(ax, at[0], at[1], width, height)
    place(cax, at[0] + width + BAR_GAP, at[1] + bar_y, BAR_W, bar_h)


def _margins(ax: Any, cax: Any, renderer: Any, spare: int, shape: tuple[int, int]) -> tuple[float, float, float, float]:
    """How far the text of the picture's and the colour bar's axes reaches beyond the picture (placed
    ``spare`` pixels from the bottom left): left, right, below and above, in pixels."""
    height, width = shape
    boxes = [a.get_tightbbox(renderer) for a in (ax, cax)]
    left = spare - min(b.x0 for b in boxes)
    right = max(b.x1 for b in boxes) - spare - width
    below = spare - min(b.y0 for b in boxes)
    above = max(b.y1 for b in boxes) - spare - height
    return left, right, below, above

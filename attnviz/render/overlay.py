"""Attention drawn over the picture the model saw (``--overlay-png``): inspect's per-head mosaic (each
head of the layer and their mean, as DINO's ``visualize_attention.py`` draws a head per picture) and
rollout's single map (as jacobgil/vit-explain's ``show_mask_on_image``).

Each panel is composed here in NumPy, pixel for pixel, before matplotlib shows it: the patch grid
brought to the picture's pixels (``attnviz.inspection.images.upsample``), coloured on the figure's
scale (``colour_values``) and blended half and half over the picture (``blend``), so what a panel
shows at a pixel is exactly the patch that covers it. ``--keep-mass F`` outlines the patches that
hold F of the mass (DINO's contours, drawn around the nearest-upsampled mask). The heading says what
is drawn and how the colours are normalised: one scale shared by every panel from 0 to the largest
weight (``--vmax`` to fix it), or each panel from 0 to its own largest (``--scale-per-panel``, as
DINO saves each head); the rollout mask is divided by its maximum (vit-explain), so 0 to 1.
matplotlib is imported inside the functions, never at import.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from attnviz import text as inert
from attnviz.inspection.images import upsample
from attnviz.render.heatmap import DPI, PLAIN, new_figure, wrap_text
from attnviz.render.options import FigureOptions
from attnviz.render.scale import colour_map, number

if TYPE_CHECKING:
    from attnviz.inspection.inspecting import InspectResult
    from attnviz.inspection.rollout import RolloutRun

OVERLAY_CMAP = "jet"  # vit-explain's and most notebooks' (cv2.COLORMAP_JET); --cmap to choose another
ALPHA = 0.5  # the map's share of a blended pixel (DINO's apply_mask and vit-explain's overlay: half and half)
CONTOUR = "white"
PANEL_INCHES = 3.2
MAP_SIDE = 224  # pixels a side of a map drawn with no picture under it


def colour_values(values: np.ndarray, top: float, cmap: str | None) -> np.ndarray:
    """RGB in 0..1 (``[..., 3]``) of ``values`` on the linear scale from 0 to ``top`` (values above it
    take the top colour)."""
    t = np.clip(np.asarray(values, np.float64) / (top if top > 0 else 1.0), 0.0, 1.0)
    return np.asarray(colour_map(cmap or OVERLAY_CMAP)(t))[..., :3]


def blend(picture: np.ndarray | None, grid: np.ndarray, top: float, cmap: str | None, how: str = "nearest",
          size: tuple[int, int] | None = None) -> np.ndarray:
    """One panel's pixels, RGB ``uint8 [H, W, 3]``: ``grid [gh, gw]`` brought to the picture's pixels
    (``how``), coloured from 0 to ``top`` and blended over ``picture`` (``ALPHA`` of the colour); with no
    picture the coloured map alone, at ``size`` (default ``MAP_SIDE`` pixels on the longer side)."""
    if picture is not None:
        size = (picture.shape[0], picture.shape[1])
    elif size is None:
        gh, gw = grid.shape
        scale = max(1, MAP_SIDE // max(gh, gw))
        size = (gh * scale, gw * scale)
    colours = colour_values(upsample(grid, size, how), top, cmap)
    if picture is not None:
        colours = (1 - ALPHA) * (np.asarray(picture, np.float64) / 255.0) + ALPHA * colours
    return np.round(np.clip(colours, 0.0, 1.0) * 255).astype(np.uint8)


def overlay_figure(picture: np.ndarray | None, grids: Sequence[np.ndarray], titles: Sequence[str], *, heading: str,
                   fig: FigureOptions, how: str = "nearest", kept: Sequence[np.ndarray | None] | None = None,
                   per_panel: bool = False, top: float | None = None, colorbar_label: str = "attention weight") -> Any:
    """A figure of one panel per grid (``grids[n] [gh, gw]`` titled ``titles[n]``) over the picture, one
    colour bar; ``kept[n]`` (a boolean grid) is outlined. Colours run from 0 to ``top`` (default the
    largest value of every grid, or ``--vmax``), or from 0 to each panel's own largest (``per_panel``)."""
    from matplotlib.cm import ScalarMappable
    from matplotlib.colors import Normalize

    grids = [np.nan_to_num(np.asarray(g, np.float64)) for g in grids]
    shared = top if top is not None else (fig.vmax if fig.vmax is not None else
                                          max(float(g.max()) for g in grids) if grids else 1.0)
    shared = shared if shared > 0 else 1.0
    cols = math.ceil(math.sqrt(len(grids)))
    rows = math.ceil(len(grids) / cols)
    panels = [blend(picture, g, float(g.max()) if per_panel else shared, fig.cmap, how) for g in grids]
    height, width = panels[0].shape[:2]
    panel_w = PANEL_INCHES
    panel_h = PANEL_INCHES * height / width
    figure = new_figure(max(7.0, panel_w * cols + 1.6), panel_h * rows + 0.5 * rows + 1.2)
    axes = []
    for n, (pixels, title) in enumerate(zip(panels, titles)):
        ax = figure.add_subplot(rows, cols, n + 1)
        axes.append(ax)
        ax.imshow(pixels, interpolation="nearest", extent=(0, width, height, 0))
        mask = None if kept is None else kept[n]
        if mask is not None and mask.any():
            outline = upsample(mask.astype(np.float64), (height, width), "nearest")
            padded = np.pad(outline, 1)  # closed contours along the edges, as DINO pads its mask
            ax.contour(np.arange(-1, width + 1) + 0.5, np.arange(-1, height + 1) + 0.5, padded, levels=[0.5],
                       colors=CONTOUR, linewidths=1.2)
        ax.set_xlim(0, width)
        ax.set_ylim(height, 0)
        ax.set_xticks([])
        ax.set_yticks([])
        extra = f" (max {number(float(grids[n].max()))})" if per_panel else ""
        ax.set_title(inert.title(title, 60) + extra, fontsize=9, **PLAIN)
    mappable = ScalarMappable(Normalize(0.0, 1.0 if per_panel else shared), colour_map(fig.cmap or OVERLAY_CMAP))
    bar = figure.colorbar(mappable, ax=axes, shrink=0.85)
    label = f"{colorbar_label}, share of each panel's largest" if per_panel else colorbar_label
    bar.set_label(inert.label(label, 80), **PLAIN)
    text = figure.suptitle(inert.title(heading, 2000), fontsize=10, **PLAIN)
    wrap_text(text, figure.get_figwidth() * DPI - 24, figure.canvas.get_renderer())
    return figure


def inspect_overlay_figure(result: InspectResult, fig: FigureOptions) -> Any:
    """inspect's --overlay-png: the query's attention over the patches, one panel per head of the layer
    and one for their mean."""
    opened, found = result.opened, result.overlay
    assert opened.image is not None and found is not None
    image = opened.image
    picture = None if image.picture is None else image.picture.rgb
    titles = [f"head {h}" for h in found.heads] + ["mean of heads"] * (len(found.heads) > 1)
    grids = list(found.maps) + [found.mean] * (len(found.heads) > 1)
    kept = None
    if found.kept is not None and found.kept_mean is not None:
        kept = list(found.kept) + [found.kept_mean] * (len(found.heads) > 1)
    name = fig.title or f"attention over the image: {opened.weights.source}"
    label = f" ({inert.label(found.query_label, 24)})" if found.query_label is not None else ""
    top = number(fig.vmax) if fig.vmax is not None else f"the largest weight, {number(max_of(found))}"
    scale = ("colours: each panel from 0 to its own largest weight" if fig.scale_per_panel else
             f"colours: one scale for all panels, 0 to {top}")
    mass = f"; outlined: the fewest patches holding {found.keep_mass:g} of the mass" if found.keep_mass else ""
    heading = (f"{name}; query {found.query}{label} over {image.layout.describe()}, layer {found.layer}, batch "
               f"{found.batch}; {image.options.upsample} upsampling; {scale}{mass}")
    return overlay_figure(picture, grids, titles, heading=heading, fig=fig, how=image.options.upsample, kept=kept,
                          per_panel=fig.scale_per_panel)


def max_of(found: Any) -> float:
    """The largest weight of an overlay's panels."""
    return float(max(np.nanmax(found.maps), np.nanmax(found.mean)))


def rollout_overlay_figure(run: RolloutRun, fig: FigureOptions) -> Any:
    """rollout's --overlay-png: the rollout's query row (CLS) over the patches, divided by its maximum,
    over the picture (vit-explain's picture)."""
    image = run.image
    assert image is not None and run.mask is not None
    picture = None if image.picture is None else image.picture.rgb
    name = fig.title or f"{run.title} over the image: {run.weights.source}"
    label = f" ({inert.label(run.tokens[image.query], 24)})" if run.tokens is not None else ""
    kept = None
    share = image.options.keep_mass
    if share is not None:
        from attnviz.inspection.images import grid_keep_mass

        kept = [grid_keep_mass(np.nan_to_num(run.mask), share)]
    mass = f"; outlined: the fewest patches holding {share:g} of the mass" if share else ""
    heading = (f"{name}; query {image.query}{label} over {image.layout.describe()}, batch {run.shown} ({run.how}); "
               f"{image.options.upsample} upsampling; colours: divided by its maximum, 0 to 1{mass}")
    label = run.method.label
    return overlay_figure(picture, [run.mask], [label], heading=heading, fig=fig, how=image.options.upsample,
                          kept=kept, top=1.0, colorbar_label=f"{label} / its maximum")

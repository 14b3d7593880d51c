"""The options every heatmap takes (``FigureOptions``: title, colour map, block aggregation, the colour
scale), checked whatever the data (contradictions are usage errors, exit 2), and the ``ColourScale``
they make. Declared once here; every command that draws shows them under Figure.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from attnviz.errors import UsageError
from attnviz.fields import FIGURE, option


@dataclass(frozen=True)
class FigureOptions:
    """How a command's heatmaps look."""

    title: str | None = option(None, "the heatmap's title", panel=FIGURE)
    cmap: str | None = option(None, "a matplotlib colour map for heatmaps (default viridis)", panel=FIGURE)
    reduce: Literal["mean", "max"] = option("mean", "how long maps are aggregated in blocks for heatmaps: mean or max",
                                            panel=FIGURE)
    vmin: float | None = option(None, "the bottom of the colour scale (default 0, or the lowest value when below 0; "
                                "with --norm log the smallest positive value shown, at most 4 decades below the top)",
                                panel=FIGURE, metavar="V")
    vmax: float | None = option(None, "the top of the colour scale (default the largest value shown); larger values "
                                "take its top colour", panel=FIGURE, metavar="V")
    norm: str = option("auto", "how values map to colours: linear, log (small weights visible; zeros in the bottom "
                       "colour), power:G (matplotlib's PowerNorm, e.g. power:0.5) or auto: log when the largest value "
                       "lies 2 decades or more above the median of those above 0 (long maps), else linear; the colour "
                       "bar names the scale drawn", panel=FIGURE, metavar="linear|log|power:G|auto", parse="norm")
    scale_skip_keys: int = option(0, "leave the first S keys out of the colour scale (an attention sink's column "
                                  "takes the top colour instead of washing out every other cell)", panel=FIGURE,
                                  metavar="S", min=0)
    scale_per_panel: bool = option(False, "draw each panel on its own scale, 0 to its own maximum (compare: symmetric "
                                   "around 0, up to its own largest difference), written with the panel, instead of "
                                   "one scale shared by all", panel=FIGURE)

    def check(self, diverging: bool = False) -> None:
        """Option values that are wrong whatever the data (exit 2): an unknown colour map, a contradictory scale."""
        if self.cmap is not None:
            from attnviz.render.scale import check_cmap

            check_cmap(self.cmap)
        check_scale(self.vmin, self.vmax, self.norm, self.scale_per_panel, diverging=diverging)

    def scale(self) -> Any:
        """The ``ColourScale`` of these options (imports the renderer: call when drawing)."""
        return figure_scale(self.vmin, self.vmax, self.norm, self.scale_per_panel, self.scale_skip_keys)


#: the magnitudes a colour scale's end may take (besides 0)
SCALE_ENDS = (1e-30, 1e30)


def check_scale(vmin: float | None, vmax: float | None, norm: str | None, per_panel: bool = False,
                diverging: bool = False) -> None:
    """Figure options that contradict each other, whatever the data (exit 2, one line)."""
    kind = (norm or "linear").partition(":")[0]
    for name, value in (("--vmin", vmin), ("--vmax", vmax)):
        # maps are drawn in float32: an end beyond these would round to 0 or infinity there (and 1e-30 or 1e30 is
        # far beyond any weight, score or gradient's scale that a picture can show)
        if value is not None and not (value == 0 or SCALE_ENDS[0] <= abs(value) <= SCALE_ENDS[1]):
            raise UsageError(f"{name} {value:g}: a colour scale's ends are 0 or between {SCALE_ENDS[0]:g} and "
                             f"{SCALE_ENDS[1]:g} in magnitude.")
    if diverging and vmin is not None:
        raise UsageError(f"--vmin {vmin:g}: A - B is drawn on a scale symmetric around 0, from -V to V; "
                         "give its V with --vmax.")
    if diverging and vmax is not None and vmax <= 0:
        raise UsageError(f"--vmax {vmax:g}: must be positive (A - B is drawn from -V to V).")
    if per_panel and vmax is not None:
        raise UsageError(f"--vmax {vmax:g} and --scale-per-panel: each panel is drawn up to its own maximum; "
                         "give one of them.")
    if vmin is not None and vmax is not None and vmin >= vmax:
        raise UsageError(f"--vmin {vmin:g} --vmax {vmax:g}: --vmin must be below --vmax.")
    if kind == "log" and vmax is not None and vmax <= 0:
        raise UsageError(f"--norm log --vmax {vmax:g}: a log scale needs --vmax above 0.")
    if kind == "log" and vmin is not None and vmin <= 0:
        raise UsageError(f"--norm log --vmin {vmin:g}: a log scale needs --vmin above 0 (zeros are drawn in its "
                         "bottom colour).")


def figure_scale(vmin: float | None, vmax: float | None, norm: str | None, per_panel: bool,
                 skip_keys: int = 0) -> Any:
    """The ``ColourScale`` of the figure options (imports the renderer: call when drawing)."""
    from attnviz.render.scale import ColourScale

    return ColourScale.from_options(vmin, vmax, norm, per_panel, skip_keys)




#: how --show draws: a graphics protocol, half-blocks, or nothing (``attnviz.render.graphics``)
GRAPHICS = ("auto", "kitty", "iterm", "sixel", "blocks", "none")
GRAPHICS_ENV = "ATTNVIZ_GRAPHICS"


@dataclass(frozen=True)
class ShowOptions:
    """Whether and how a command draws its picture in the terminal (``--show``, ``--graphics``)."""

    show: bool = option(False, "draw the picture of --png in the terminal too, after the tables (alone with "
                        "--no-table)", panel=FIGURE)
    graphics: Literal[GRAPHICS] | None = option(  # type: ignore[valid-type]
        None, "how --show draws: auto (a graphics protocol the terminal has, else coloured half-blocks; plain "
        "characters in a pipe), kitty, iterm, sixel, blocks or none (default: ATTNVIZ_GRAPHICS, else auto)",
        panel=FIGURE)

    def mode(self, environ: Any = None) -> str:
        """The ``--graphics`` word asked for: the option, else ``ATTNVIZ_GRAPHICS``, else ``auto``; a bad
        ``ATTNVIZ_GRAPHICS`` is a usage error."""
        import os

        if self.graphics is not None:
            return str(self.graphics)
        value = (os.environ if environ is None else environ).get(GRAPHICS_ENV, "").strip().lower()
        if value and value not in GRAPHICS:
            raise UsageError(f"{GRAPHICS_ENV}={value!r}: expected one of {', '.join(GRAPHICS)}.")
        return value or "auto"

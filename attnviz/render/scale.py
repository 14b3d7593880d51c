"""Colour scales: how the values of attention maps become colours, shared by every figure.

``ColourScale`` is what the options ask for (``--vmin``, ``--vmax``, ``--norm``,
``--scale-per-panel``); ``make_scaling`` makes it for the values shown (a ``ValueRange``): the
matplotlib norm, the range values are clipped to, and the ends of the colour bar that carry a
triangle. ``own_scale`` draws a panel on its own scale (``--scale-per-panel``); ``scale_label``,
``per_panel_ticks`` and ``number`` say on the colour bar and under the panels what the scale is.
``check_cmap`` vets ``--cmap`` against matplotlib's colour maps; masked cells take their "bad"
colour, a light grey.

Used by ``attnviz.render.heatmap`` (single heatmaps) and ``attnviz.render.mosaic`` (many maps in
one picture). matplotlib is imported inside the functions that need it, never at import.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

LOG_DECADES = 4  # --norm log without --vmin: the scale starts at most this many decades below its top
NORMS = ("linear", "log", "power", "auto")
#: --norm auto: a log scale when the largest value shown lies at least this many decades above the median of
#: the values above 0 (a long map's block means are ~1/L while a sink column holds most of the weight)
AUTO_DECADES = 2.0
#: --norm auto: a value this far below the largest (float32's resolution, 2**-23) is zero in effect and counted as
#: 0: a softmax weight of 4e-26 beside 0.5 is exp of a far lower score, which adds nothing to any sum in float32
#: (the README's 3 x 4 example: its "zeros" put the median of the values above 0 25 decades below the top)
EFFECTIVE_ZERO = 2.0**-23
#: the bins (decades) of the values above 0 that ``--norm auto`` looks at: a quarter of a decade each
_DECADE_EDGES = np.arange(-45.0, 45.25, 0.25)


def colour_map(name: str) -> Any:
    """matplotlib's colour map ``name`` (``--cmap``), masked cells light grey; an unknown name is a usage
    error (exit 2)."""
    from matplotlib import colormaps

    from attnviz.errors import UsageError

    if name not in colormaps:
        raise UsageError(f"--cmap {name!r}: not a matplotlib colour map (e.g. viridis, magma, Blues, RdBu_r).")
    return colormaps[name].with_extremes(bad="#d9d9d9")  # masked cells: light grey


def check_cmap(name: str | None) -> None:
    """Fail early (exit 2) on an unknown colour map; imports matplotlib's colour maps only."""
    if name is not None:
        colour_map(name)


@dataclass(frozen=True)
class ColourScale:
    """How values become colours. ``vmin``/``vmax`` fix the ends of the scale (None: from the values
    shown); ``norm`` is ``linear``, ``log`` or ``power`` (matplotlib's PowerNorm, ``gamma``);
    ``per_panel`` gives each panel its own scale (0, or its lowest value, to its own maximum), and each
    panel then says its maximum.

    Defaults: linear from ``min(0, lowest)`` to the highest value shown. ``log`` starts at ``vmin``,
    or else at the smallest positive value shown but never more than ``LOG_DECADES`` decades below the
    top; values at or below the start (zeros too) take the bottom colour, not the grey of masked
    cells. Diverging maps (compare's A - B) are symmetric around 0 from ``-V`` to ``V`` (``vmax``, or
    the largest ``|value|``): ``log`` is then a symmetric log scale, linear within the start of the
    log scale (as above, of ``|value|``) and logarithmic beyond, and ``power:G`` is
    ``sign(x) |x|^G``. The command line checks the values (``attnviz.render.options.check_scale``)."""

    vmin: float | None = None
    vmax: float | None = None
    norm: str = "linear"
    gamma: float = 1.0
    per_panel: bool = False
    #: the first keys left out of the scale (``--scale-skip-keys``): an attention sink's column is drawn in the
    #: top colour instead of setting the top for every other cell
    skip_keys: int = 0
    #: ``norm`` was ``auto``, resolved to this by the values shown (``make_scaling``)
    auto: bool = False

    @classmethod
    def from_options(cls, vmin: float | None = None, vmax: float | None = None, norm: str | None = "linear",
                     per_panel: bool = False, skip_keys: int = 0) -> ColourScale:
        kind, _, gamma = (norm or "linear").partition(":")
        return cls(vmin, vmax, kind, float(gamma) if gamma else 1.0, per_panel, skip_keys)

    @property
    def name(self) -> str:
        """``""`` (linear), ``"log"``, ``"power 0.5"``, ``"auto"`` (not yet resolved) or ``"log, auto"`` (chosen
        by the values): how the colour bar's label names the scale."""
        kind = {"log": "log", "power": f"power {self.gamma:g}", "auto": "auto"}.get(self.norm, "")
        return f"{kind}, auto" if self.auto and kind else kind

    def skipped_columns(self, block: int = 1) -> int:
        """The columns of a map drawn in blocks of ``block`` keys that hold one of the first ``skip_keys`` keys."""
        return -(-self.skip_keys // max(1, block)) if self.skip_keys else 0


@dataclass
class ValueRange:
    """The values a scale is made for: lowest, highest, and the smallest above 0 (of ``|value|``
    for diverging maps), over every cell shown (NaN, masked, left out)."""

    low: float = math.inf
    high: float = -math.inf
    tiny: float = math.inf
    #: the lowest and highest of every cell, those of the keys left out of the scale too (the colour bar's
    #: triangles say that some lie beyond it)
    bottom: float = math.inf
    top: float = -math.inf
    #: with ``histogram`` (``--norm auto``): how many values above 0 fall in each quarter of a decade
    histogram: bool = False
    counts: np.ndarray | None = None

    def add(self, cells: np.ndarray, diverging: bool = False, skip: int = 0) -> None:
        """Count ``cells`` (``[..., rows, columns]``) in, their first ``skip`` columns left out of the scale."""
        if not cells.size:
            return
        low, high = float(np.nanmin(cells, initial=np.inf)), float(np.nanmax(cells, initial=-np.inf))
        self.bottom, self.top = min(self.bottom, low), max(self.top, high)
        if skip:
            cells = cells[..., skip:]
            if not cells.size:
                return
            low, high = float(np.nanmin(cells, initial=np.inf)), float(np.nanmax(cells, initial=-np.inf))
        self.low, self.high = min(self.low, low), max(self.high, high)
        size = np.abs(cells) if diverging else cells
        self.tiny = min(self.tiny, float(np.nanmin(np.where(size > 0, size, np.inf), initial=np.inf)))
        if self.histogram:
            above = size[size > 0]  # (NaN is not)
            decades = np.clip(np.log10(above[np.isfinite(above)]), _DECADE_EDGES[0], _DECADE_EDGES[-1])
            counts = np.histogram(decades, bins=_DECADE_EDGES)[0]
            self.counts = counts if self.counts is None else self.counts + counts

    @property
    def empty(self) -> bool:
        return not self.high >= self.low

    def decades(self) -> float:
        """How many decades the largest value lies above the median of the values above 0 (of ``|value|``
        diverging), to a quarter of a decade; values ``EFFECTIVE_ZERO`` times the largest or less count as 0 (a
        quarter of a decade above that may too); 0 when nothing is above 0."""
        if self.counts is None or not self.high > 0:
            return 0.0
        top = max(abs(self.low), abs(self.high))
        counts = np.where(_DECADE_EDGES[:-1] < math.log10(top * EFFECTIVE_ZERO), 0, self.counts)
        if not counts.sum():
            return 0.0
        cumulative = np.cumsum(counts)
        middle = int(np.searchsorted(cumulative, cumulative[-1] / 2))
        return max(0.0, math.log10(top) - float(_DECADE_EDGES[middle + 1]))


@dataclass
class Scaling:
    """A scale made for some values: the matplotlib norm, the range values are clipped to before
    colouring (so that a log scale shows zeros in its bottom colour), and which ends of the colour
    bar carry a triangle for values beyond them."""

    norm: Any
    low: float
    high: float
    extend: str
    note: str = ""
    log: bool = False
    #: the scale made (``--norm auto`` resolved to the one chosen), for the colour bar's label
    scale: ColourScale | None = None

    def bounds32(self) -> tuple[np.float32, np.float32]:
        """``low`` and ``high`` as float32, a hair inside ``[low, high]`` (far below one step of a colour
        map: two float32 steps, or a 1e-5 factor on a log scale): a value clipped to them never falls
        outside the scale by the rounding of the image pipeline (it would take the colour of the
        separators, or a log scale's zeros the white of the caption strips)."""
        if self.log:
            return np.float32(self.low * (1 + 1e-5)), np.float32(self.high * (1 - 1e-5))
        up, down = np.float32(np.inf), np.float32(-np.inf)
        low, high = np.float32(self.low), np.float32(self.high)
        if low <= self.low:
            low = np.nextafter(low, up)
        if high >= self.high:
            high = np.nextafter(high, down)
        return np.nextafter(low, up), np.nextafter(high, down)  # and one step more

    def clip(self, values: np.ndarray) -> np.ndarray:
        """``values`` within ``[low, high]`` (NaN stays NaN), as float32."""
        out = np.array(values, dtype=np.float32)
        np.clip(out, *self.bounds32(), out=out, where=np.isfinite(out))
        return out


def choose_norm(scale: ColourScale, values: ValueRange, diverging: bool = False) -> tuple[ColourScale, str]:
    """``--norm auto`` resolved by ``values``: log when the largest value lies ``AUTO_DECADES`` or more above
    the median of those above 0 (and none is below 0, unless the map is diverging), else linear; with a note
    saying what was chosen and why. Any other scale is returned as it is, with no note."""
    from dataclasses import replace

    if scale.norm != "auto":
        return scale, ""
    span = values.decades()
    negative = not values.empty and values.low < 0 and not diverging
    fixed = [v for v in (scale.vmin, scale.vmax) if v is not None]  # a log scale needs them above 0
    if span >= AUTO_DECADES and not negative and all(v > 0 for v in fixed):
        return replace(scale, norm="log", auto=True), f"--norm auto: log, the top {span:.1f} decades above the median"
    return replace(scale, norm="linear", auto=True), ""


def make_scaling(scale: ColourScale, values: ValueRange, diverging: bool = False) -> Scaling:
    """The norm of ``scale`` for ``values`` (see ``ColourScale`` for the defaults; ``auto``: ``choose_norm``);
    the values of keys left out of the scale (``skip_keys``) take its ends' colours."""
    from dataclasses import replace

    chosen, why = choose_norm(scale, values, diverging)
    made = _make_scaling(chosen, values, diverging)
    if values.top > values.high or values.bottom < values.low:  # cells left out of the scale lie beyond it
        made.extend = _extend(values.bottom < made.low or made.extend in ("min", "both"),
                              values.top > made.high or made.extend in ("max", "both"))
    skipped = ("" if not scale.skip_keys else "the first key left out of the scale" if scale.skip_keys == 1 else
               f"the first {scale.skip_keys} keys left out of the scale")
    made.note = "; ".join(t for t in (why, made.note, skipped) if t)
    made.scale = replace(chosen, skip_keys=scale.skip_keys)
    return made


def _make_scaling(scale: ColourScale, values: ValueRange, diverging: bool = False) -> Scaling:
    from matplotlib import colors

    low, high = (0.0, 0.0) if values.empty else (values.low, values.high)
    tiny = values.tiny if math.isfinite(values.tiny) else None
    if diverging:
        lim = scale.vmax if scale.vmax is not None else max(abs(low), abs(high))
        lim = lim or 1.0
        extend = _extend(low < -lim, high > lim)
        if scale.norm == "log":
            floor = min(max(tiny or 0.0, lim / 10**LOG_DECADES), lim / 10)
            norm: Any = colors.SymLogNorm(linthresh=floor, linscale=0.5, vmin=-lim, vmax=lim, base=10)
            return Scaling(norm, -lim, lim, extend, f"symmetric log scale, linear within ±{floor:.2g}")
        if scale.norm == "power":
            g = scale.gamma

            def forward(x: Any) -> Any:
                return np.sign(x) * np.abs(x) ** g

            def inverse(y: Any) -> Any:
                return np.sign(y) * np.abs(y) ** (1 / g)

            norm = colors.FuncNorm((forward, inverse), vmin=-lim, vmax=lim)
            return Scaling(norm, -lim, lim, extend, f"power {g:g} scale, sign(x) |x|^{g:g}")
        return Scaling(colors.Normalize(-lim, lim), -lim, lim, extend)
    if scale.norm == "log":
        hi = scale.vmax if scale.vmax is not None else (high if high > 0 else 1.0)
        if scale.vmin is not None:
            lo = scale.vmin
        else:
            lo = max(tiny or 0.0, hi / 10**LOG_DECADES)
            if lo >= hi:  # every value the same (or nothing above 0): one decade below it
                lo = hi / 10
        if hi <= lo:  # --vmin above every value: a decade above it
            hi = lo * 10
        return Scaling(colors.LogNorm(lo, hi), lo, hi, _extend(low < lo, high > hi),
                       f"log scale from {lo:.2g}; lower values and zeros in its bottom colour", log=True)
    lo = scale.vmin if scale.vmin is not None else min(0.0, low)
    hi = scale.vmax if scale.vmax is not None else high
    if hi <= lo and scale.vmax is not None and scale.vmin is None:  # --vmax at or below the default bottom:
        lo = hi - (abs(hi) or 1.0)  # keep the user's top (values above it take the top colour)
    elif hi <= lo:  # every value equal, or --vmin above every value: the given bottom is kept
        hi = lo + (abs(lo) or 1.0)
    extend = _extend(low < lo, high > hi)
    if scale.norm == "power":
        return Scaling(colors.PowerNorm(scale.gamma, lo, hi), lo, hi, extend, f"power {scale.gamma:g} scale")
    return Scaling(colors.Normalize(lo, hi), lo, hi, extend)


def _extend(below: bool, above: bool) -> str:
    return {(False, False): "neither", (True, False): "min", (False, True): "max"}.get((below, above), "both")


def own_scale(cells: np.ndarray, scale: ColourScale, diverging: bool = False,
              block: int = 1) -> tuple[np.ndarray, float]:
    """A panel on its own scale (``--scale-per-panel``): its cells as positions 0..1 of the colour map
    (NaN stays NaN), and the panel's maximum (of ``|value|`` when diverging) for its label."""
    values = ValueRange(histogram=scale.norm == "auto")
    values.add(cells, diverging, scale.skipped_columns(block))
    scaling = make_scaling(scale, values, diverging)
    clipped = scaling.clip(cells)
    position = np.ma.filled(scaling.norm(np.ma.masked_invalid(clipped)), np.nan)
    top = max(abs(values.low), abs(values.high)) if diverging else values.high
    return np.asarray(position, dtype=np.float32), (top if not values.empty else 0.0)


def scale_label(label: str, scale: ColourScale, diverging: bool = False) -> str:
    """The colour bar's label: what the values are, and the kind of scale."""
    if scale.per_panel:
        span = "-max to +max of each panel" if diverging else "0 to each panel's max"
        return f"{label}, per panel: {span}" + (f" ({scale.name})" if scale.name else "")
    return f"{label} ({scale.name})" if scale.name else label


def per_panel_ticks(bar: Any, scale: ColourScale, diverging: bool) -> None:
    """A per-panel colour bar (positions 0..1) marks its ends as each panel's own."""
    ticks, names = ([0.0, 0.5, 1.0], ["-max", "0", "+max"]) if diverging else (
        [0.0, 1.0], ["panel min" if scale.norm == "log" else "0", "panel max"])
    bar.set_ticks(ticks)
    bar.set_ticklabels(names)


def plain_bar_ticks(bar: Any) -> None:
    """A colour bar on a linear (or power) scale labels each tick with its whole value: matplotlib's default
    writes a shared factor or offset over the bar instead (``1e-5`` above ticks 1, 2, 3), which reads as a value
    of the scale and sits on the label of its top. Log scales keep their own labels (10^-3), which carry none."""
    from matplotlib.ticker import ScalarFormatter

    if not isinstance(bar.formatter, ScalarFormatter):
        return
    formatter = ScalarFormatter(useOffset=False)
    formatter.set_scientific(False)
    bar.formatter = formatter
    bar.update_ticks()


def number(value: float) -> str:
    """A value as a panel's label shows it: three significant digits."""
    return f"{value:.3g}"


def unit_norm() -> Any:
    """The linear norm from 0 to 1: the scale of maps each scaled to its own largest value (``--scale-per-panel``)."""
    from matplotlib.colors import Normalize

    return Normalize(0.0, 1.0)

"""The options every compute command shares, as ``inspect.Parameter`` objects with Annotated Typer
types; ``app.py`` puts them after each variant's own arguments and options.

Option values are checked when the command line is read, before any file is opened: every number
and choice goes through a parser here (``Number``, ``OneOf``, ``Size``, ``Positions``), which
refuses a bad value with a message that names it (``--heads 0: must be at least 1.``, exit 2).
``typed`` builds such an option; a variant's ``Params`` field declares its bounds in its metadata
(``min``, ``max``, ``above``), and every float must be finite.

``StagedOutputs`` makes a run's files all or nothing: see its docstring.
"""

from __future__ import annotations

import inspect
import math
import os
import re
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import UnionType
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import typer

from attnviz.choices import CAUSAL_ALIGNS, DEVICES, DTYPES, MASK_CONVENTIONS, MASK_KINDS, ROPE_STYLES
from attnviz.errors import AttnvizError, OutputError, UsageError

MASKS = "Masks"
PARAMS = "Learned parameters"
LABELS = "Labels"
RUN = "Device and precision"
OUTPUT = "Output"
CAPTURED = "Captured Q/K/V (layouts, grouped heads, RoPE)"
FIGURE = "Figure"

_KW = inspect.Parameter.KEYWORD_ONLY

#: bounds of every whole-number option unless it says otherwise (no option needs more; sizes
#: computed from them stay within NumPy's integers)
INT_MIN, INT_MAX = -(2**31), 2**31 - 1
SEED_MAX = 2**63 - 1


# ----------------------------------------------------------------------------------------------
# Option values: parsed and checked as the command line is read


def _inert(text: str, limit: int | None = 40, keep: str = "") -> str:
    """Text from the command line as a message shows it (``attnviz.render.text.visible``: control
    characters such as ESC, CR, BEL escaped; a line feed kept when ``keep`` has it), shortened to
    ``limit`` characters."""
    from attnviz.render.text import visible

    if limit is not None and len(text) > limit:
        text = text[:limit] + "..."
    return visible(text, newlines="\n" in keep)


def error_line(message: str, kind: str = "error") -> str:
    """An error as attnviz prints it on stderr: one line of inert text (control characters escaped,
    a line feed too: a file name holding one cannot forge a second message line), written as is (no
    markup, no emoji codes)."""
    return f"attnviz: {kind}: {_inert(message, limit=None)}\n"


_PLAIN_NUMBER = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)(e[+-]?\d+)?|[+-]?(nan|inf|infinity)", re.IGNORECASE | re.ASCII)


def shown(value: object) -> str:
    """A value as an error message quotes it: a number as typed, anything else quoted."""
    text = str(value)
    if _PLAIN_NUMBER.fullmatch(text.strip()) and len(text) <= 40:
        return text.strip()
    return "'" + _inert(text).replace("'", "\\'") + "'"


class OptionValueError(typer.BadParameter):
    """An option value attnviz refuses; shown as ``--heads 0: must be at least 1.``"""

    def __init__(self, value: object, problem: str) -> None:
        super().__init__(problem)
        self.value = value
        self.problem = problem


def _number_text(value: float) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


@dataclass(frozen=True)
class Number:
    """Parses a whole number (``kind=int``) or a finite float, within ``[min, max]`` and above
    ``above`` (exclusive) when given. Whole numbers default to 32-bit bounds."""

    kind: type = int
    min: float | None = None
    max: float | None = None
    above: float | None = None

    def __call__(self, value: Any) -> Any:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            number: int | float = value
        else:
            text = str(value).strip()
            if self.kind is int:
                if not re.fullmatch(r"[+-]?\d+", text, re.ASCII):
                    raise OptionValueError(value, "expected a whole number")
                digits = text.lstrip("+-").lstrip("0")
                number = int(text) if len(digits) <= 30 else (-1 if text.startswith("-") else 1) * 10**30
            else:
                try:
                    number = float(text)
                except ValueError:
                    raise OptionValueError(value, "expected a number") from None
        if isinstance(number, float) and not math.isfinite(number):
            raise OptionValueError(value, "must be a finite number")
        if self.kind is int and isinstance(number, float):
            if not number.is_integer():
                raise OptionValueError(value, "expected a whole number")
            number = int(number)
        if self.above is not None and not number > self.above:
            raise OptionValueError(value, "must be positive" if self.above == 0 else
                                   f"must be greater than {_number_text(self.above)}")
        low = self.min if self.min is not None else (INT_MIN if self.kind is int else None)
        if low is not None and number < low:
            raise OptionValueError(value, f"must be at least {_number_text(low)}")
        if number > self._max():
            raise OptionValueError(value, f"must be at most {_number_text(self._max())}")
        return self.kind(number)

    def _max(self) -> float:
        if self.max is not None:
            return self.max
        return INT_MAX if self.kind is int else math.inf


@dataclass(frozen=True)
class OneOf:
    """Parses one of a fixed set of words (a ``Literal`` option)."""

    choices: tuple[str, ...]

    def __call__(self, value: Any) -> str:
        if isinstance(value, str) and value in self.choices:
            return value
        raise OptionValueError(value, f"expected one of {', '.join(self.choices)}")


@dataclass(frozen=True)
class Size:
    """``--max-memory``: ``512M``, ``2G``, ``1.5GiB``, ``300000000`` (bytes), at least 1M; returns
    the number of bytes as text, which ``attnviz.blockwise.parse_size`` reads back as is."""

    minimum: int = 2**20

    UNITS = {"": 1, "b": 1, "k": 2**10, "kb": 2**10, "kib": 2**10, "m": 2**20, "mb": 2**20, "mib": 2**20,
             "g": 2**30, "gb": 2**30, "gib": 2**30, "t": 2**40, "tb": 2**40, "tib": 2**40}

    def __call__(self, value: Any) -> str:
        text = str(value).strip().lower()
        found = re.fullmatch(r"([+-]?(?:\d+\.?\d*|\.\d+)(?:e[+-]?\d{1,3})?)\s*([a-z]*)", text, re.ASCII)
        if found is None or found.group(2) not in self.UNITS:
            raise OptionValueError(value, "expected a size such as 512M, 2G or 300000000 (bytes)")
        size = float(found.group(1)) * self.UNITS[found.group(2)]
        if not math.isfinite(size) or size > 2**60:
            raise OptionValueError(value, "too large")
        if size < self.minimum:
            raise OptionValueError(value, "must be at least 1M")
        return str(int(size))


@dataclass(frozen=True)
class Positions:
    """A list of whole numbers separated by commas (``--index 0,2``, ``--global-tokens 0,5``),
    checked for form here and against the data later; returned as given."""

    negative: bool = True

    def __call__(self, value: Any) -> str:
        text = str(value)
        sign = "-?" if self.negative else ""
        if not re.fullmatch(rf"\s*{sign}\d{{1,9}}\s*(,\s*{sign}\d{{1,9}}\s*)*,?\s*", text, re.ASCII):
            example = "0,2" if self.negative else "0,5"
            raise OptionValueError(value, f"expected whole numbers separated by commas, e.g. {example}")
        return text


@dataclass(frozen=True)
class NormSpec:
    """``--norm``: ``linear``, ``log`` or ``power:G`` (G a positive number, matplotlib's PowerNorm
    gamma); returned as ``power:0.5`` for ``attnviz.render.scale.ColourScale``."""

    def __call__(self, value: Any) -> str:
        text = str(value).strip().lower()
        if text in ("linear", "log"):
            return text
        kind, sep, gamma = text.partition(":")
        if kind != "power":
            raise OptionValueError(value, "expected linear, log or power:G (G a positive number, e.g. power:0.5)")
        try:
            number = float(gamma) if sep else math.nan
        except ValueError:
            number = math.nan
        if not (math.isfinite(number) and number > 0):
            raise OptionValueError(value, "the G of power:G must be a positive number, e.g. power:0.5")
        return f"power:{number:g}"


@dataclass(frozen=True)
class Ranges:
    """``--layers``/``--heads``: numbers and ranges separated by commas (``0,3,5-7``), checked for
    form here and against the weights by ``select_indices``; returned as given."""

    def __call__(self, value: Any) -> str:
        text = str(value).replace(" ", "")
        item = r"-?\d{1,9}(?:--?\d{1,9})?"
        if not re.fullmatch(rf"{item}(?:,{item})*,?", text, re.ASCII):
            raise OptionValueError(value, "expected numbers and ranges separated by commas, e.g. 0,3,5-7")
        return text


def select_indices(text: str | None, size: int, option: str, what: str) -> list[int] | None:
    """The positions ``--layers 0,3,5-7`` chooses among ``size`` (None: all), in the order given,
    each once. A number below 0 or from ``size`` up, or a range going down, is a usage error that
    names the size."""
    if text is None:
        return None
    chosen: list[int] = []
    for part in text.split(","):
        if not part:
            continue
        found = re.fullmatch(r"(-?\d+)(?:-(-?\d+))?", part, re.ASCII)
        if found is None:
            raise UsageError(f"{option} {_inert(text)}: expected numbers and ranges separated by commas, e.g. 0,3,5-7.")
        low = int(found.group(1))
        high = int(found.group(2)) if found.group(2) is not None else low
        for value in (low, high):
            if not 0 <= value < size:
                raise UsageError(f"{option} {_inert(text)}: {what} {value} is out of range; the weights have {size} "
                                 f"{what}s (0-{size - 1}).")
        if high < low:
            raise UsageError(f"{option} {_inert(text)}: the range {part} goes down; write it {high}-{low}.")
        chosen.extend(i for i in range(low, high + 1) if i not in chosen)
    if not chosen:
        raise UsageError(f"{option} {_inert(text)}: chooses no {what}.")
    return chosen


def check_scale(vmin: float | None, vmax: float | None, norm: str | None, per_panel: bool = False,
                diverging: bool = False) -> None:
    """Figure options that contradict each other, whatever the data (exit 2, one line)."""
    kind = (norm or "linear").partition(":")[0]
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


def figure_scale(vmin: float | None, vmax: float | None, norm: str | None, per_panel: bool) -> Any:
    """The ``ColourScale`` of the figure options (imports the renderer: call when drawing)."""
    from attnviz.render.scale import ColourScale

    return ColourScale.from_options(vmin, vmax, norm, per_panel)


def parser_for(annotation: Any, *, min: float | None = None, max: float | None = None,
               above: float | None = None) -> Any:
    """The parser of an option of this type: ``Number`` for int and float, ``OneOf`` for a
    ``Literal``; None for text and flags."""
    if get_origin(annotation) in (Union, UnionType):
        inner = [a for a in get_args(annotation) if a is not type(None)]
        annotation = inner[0] if len(inner) == 1 else annotation
    if get_origin(annotation) is Literal:
        return OneOf(tuple(str(v) for v in get_args(annotation)))
    if annotation is int or annotation is float:
        return Number(annotation, min=min, max=max, above=above)
    return None


def checked_option(annotation: Any, *decls: str, min: float | None = None, max: float | None = None,
           above: float | None = None, parser: Any = None, **kwargs: Any) -> Any:
    """``typer.Option(*decls, ...)`` for a value of type ``annotation``, with attnviz's parser for
    that type (or ``parser``); ``min``/``max`` also show in the help. Use it as
    ``Annotated[int, checked_option(int, "--top", min=1, help=...)]``."""
    parser = parser or parser_for(annotation, min=min, max=max, above=above)
    if parser is not None:
        kwargs["parser"] = parser
    if isinstance(parser, Number):
        kwargs.update({k: v for k, v in (("min", min), ("max", max)) if v is not None})
    return typer.Option(*decls, **kwargs)


def typed(annotation: Any, *decls: str, **kwargs: Any) -> Any:
    """``Annotated[annotation, checked_option(annotation, *decls, ...)]``, for signatures built at run time."""
    return Annotated[annotation, checked_option(annotation, *decls, **kwargs)]


def _opt(name: str, annotation: object, default: object) -> inspect.Parameter:
    return inspect.Parameter(name, _KW, default=default, annotation=annotation)


#: RunOptions fields (see attnviz.pipeline.RunOptions)
RUN_OPTIONS = [
    _opt("mask", Annotated[str | None, typer.Option(
        "--mask", metavar="FILE", rich_help_panel=MASKS,
        help="mask broadcasting to [..., Lq, Lk] (any array file, FILE:KEY); a 1-D [Lk] mask applies to every "
             "query")], None),
    _opt("mask_convention", typed(Literal[MASK_CONVENTIONS],  # type: ignore[valid-type]
        "--mask-convention", rich_help_panel=MASKS,
        help="keep: 1 = may attend (Keras, PyTorch SDPA); block: 1 = masked (TF tutorial)"), "keep"),
    _opt("mask_kind", typed(Literal[MASK_KINDS],  # type: ignore[valid-type]
        "--mask-kind", rich_help_panel=MASKS,
        help="bool: 0/1 mask; additive: float bias added to the scores (0 keeps, -inf masks)"), "bool"),
    _opt("key_padding_mask", Annotated[str | None, typer.Option(
        "--key-padding-mask", metavar="FILE", rich_help_panel=MASKS,
        help="[batch..., Lk] mask of real keys vs padding, aligned on the batch dimensions")], None),
    _opt("causal", Annotated[bool, typer.Option(
        "--causal", rich_help_panel=MASKS, help="query i attends to keys j <= i only")], False),
    _opt("causal_align", typed(Literal[CAUSAL_ALIGNS],  # type: ignore[valid-type]
        "--causal-align", rich_help_panel=MASKS,
        help="when Lq != Lk: top-left (j <= i; Keras, PyTorch) or bottom-right (j <= i + Lk - Lq; KV cache)"),
        "top-left"),
    _opt("labels", Annotated[str | None, typer.Option(
        "--labels", metavar="TOKENS", rich_help_panel=LABELS,
        help="labels for both axes (self-attention): a text file (one a line), JSON list, or a,b,c")], None),
    _opt("q_labels", Annotated[str | None, typer.Option(
        "--q-labels", metavar="TOKENS", rich_help_panel=LABELS, help="labels of the queries (rows)")], None),
    _opt("k_labels", Annotated[str | None, typer.Option(
        "--k-labels", metavar="TOKENS", rich_help_panel=LABELS, help="labels of the keys (columns)")], None),
    _opt("device", typed(Literal[DEVICES],  # type: ignore[valid-type]
        "--device", rich_help_panel=RUN, help="auto: the GPU when TensorFlow sees one, else the CPU"), "auto"),
    _opt("dtype", typed(Literal[DTYPES],  # type: ignore[valid-type]
        "--dtype", rich_help_panel=RUN,
        help="compute precision; float16/bfloat16 scores are upcast to float32 for the softmax"), "float32"),
    _opt("max_memory", typed(str | None,
        "--max-memory", parser=Size(), metavar="SIZE", rich_help_panel=RUN,
        help="memory for the weights while computing, e.g. 512M or 2G (default 512M or RAM/8); longer inputs "
             "run in blocks of query rows"), None),
]


#: ParamOptions fields (see attnviz.pipeline.ParamOptions), for variants with learned parameters
PARAM_OPTIONS = [
    _opt("params", Annotated[str | None, typer.Option(
        "--params", metavar="FILE", rich_help_panel=PARAMS,
        help="the learned parameters: .npz, .safetensors, .h5 or .pt, one array per key ([in, out] kernels, "
             "applied as x @ W)")], None),
    _opt("seed", typed(int | None,
        "--seed", min=0, parser=Number(int, min=0, max=SEED_MAX), rich_help_panel=PARAMS,
        help="draw the parameters (Glorot-uniform kernels, zero biases) from this seed; default 0 "
             "when --params is not given"), None),
    _opt("save_params", Annotated[str | None, typer.Option(
        "--save-params", metavar="FILE.npz", rich_help_panel=PARAMS,
        help="write the parameters used, to repeat the run exactly with --params")], None),
]


#: CaptureOptions fields (see attnviz.captured), for commands whose inputs are Q, K and V
CAPTURE_OPTIONS = [
    _opt("layout", Annotated[str | None, typer.Option(
        "--layout", metavar="AXES", rich_help_panel=CAPTURED,
        help="the axes of Q, K and V from batch, head, seq, d, e.g. batch,seq,head,d for the [B, L, H, d] that "
             "hooks capture; weights come out [batch, head, Lq, Lk]")], None),
    _opt("layout_kv", Annotated[str | None, typer.Option(
        "--layout-kv", metavar="AXES", rich_help_panel=CAPTURED,
        help="the axes of K and V when they differ from Q's")], None),
    _opt("rope", Annotated[bool, typer.Option(
        "--rope", rich_help_panel=CAPTURED,
        help="apply rotary position embeddings to Q and K before the scores (q/k captured before RoPE)")], False),
    _opt("rope_theta", typed(float,
        "--rope-theta", min=1, rich_help_panel=CAPTURED, help="RoPE base (Llama 10000; Llama 3 500000)"), 10000.0),
    _opt("rope_style", typed(Literal[ROPE_STYLES],  # type: ignore[valid-type]
        "--rope-style", rich_help_panel=CAPTURED,
        help="half: Hugging Face Llama's rotate_half; interleaved: GPT-J / RoFormer pairs (2i, 2i+1)"), "half"),
    _opt("rope_dim", typed(int | None,
        "--rope-dim", min=2, metavar="N", rich_help_panel=CAPTURED,
        help="rotate the first N dimensions of each head only (partial rotary, GPT-NeoX); default all"), None),
    _opt("positions", Annotated[str | None, typer.Option(
        "--positions", metavar="FILE", rich_help_panel=CAPTURED,
        help="position ids [L] or [B, L] for --rope (default 0..L-1); needed for left padding")], None),
]


@dataclass
class OutputOptions:
    index: str | None = None
    precision: int = 3
    max_rows: int = 40
    max_cols: int | None = None
    png: str | None = None
    html: str | None = None
    json: bool = False
    json_file: str | None = None
    save_weights: str | None = None
    save_output: str | None = None
    no_table: bool = False
    quiet: bool = False
    title: str | None = None
    cmap: str | None = None
    reduce: str = "mean"
    vmin: float | None = None
    vmax: float | None = None
    norm: str = "linear"
    scale_per_panel: bool = False

    def check(self) -> None:
        """Option values that are wrong whatever the data (exit 2)."""
        check_png_path(self.png)
        check_html_path(self.html)
        if self.cmap is not None:
            from attnviz.render.scale import check_cmap

            check_cmap(self.cmap)
        check_scale(self.vmin, self.vmax, self.norm, self.scale_per_panel)
        for option, value in (("--save-weights", self.save_weights), ("--save-output", self.save_output)):
            if value is not None and not value.lower().endswith(".npy"):
                raise UsageError(f"{option} {value}: the file must end in .npy.")


def check_png_path(value: str | None, option: str = "--png") -> None:
    if value is not None and not value.lower().endswith((".png", ".svg", ".pdf")):
        raise UsageError(f"{option} {value}: the file must end in .png, .svg or .pdf.")


def check_html_path(value: str | None, option: str = "--html") -> None:
    if value is not None and not value.lower().endswith((".html", ".htm")):
        raise UsageError(f"{option} {value}: the file must end in .html or .htm.")


def check_save_params(value: str | None) -> None:
    if value is not None and not value.lower().endswith(".npz"):
        raise UsageError(f"--save-params {value}: the file must end in .npz.")


OUTPUT_OPTIONS = [
    _opt("index", typed(str | None,
        "--index", parser=Positions(), metavar="I,J", rich_help_panel=OUTPUT,
        help="which batch/head slice the tables show, e.g. 0,2 (default: the first)"), None),
    _opt("precision", typed(int,
        "--precision", min=0, max=12, rich_help_panel=OUTPUT, help="digits after the point in tables"), 3),
    _opt("max_rows", typed(int,
        "--max-rows", min=0, rich_help_panel=OUTPUT,
        help="show at most this many query rows, eliding the middle (0: all)"), 40),
    _opt("max_cols", typed(int | None,
        "--max-cols", min=0, rich_help_panel=OUTPUT,
        help="show at most this many key columns (default: what fits the terminal; 0: all)"), None),
    _opt("png", Annotated[str | None, typer.Option(
        "--png", metavar="FILE", rich_help_panel=OUTPUT,
        help="save a heatmap (.png, .svg or .pdf); a grid of panels when there are batch/head dimensions")],
        None),
    _opt("html", Annotated[str | None, typer.Option(
        "--html", metavar="FILE.html", rich_help_panel=OUTPUT,
        help="write an interactive report: one offline HTML file (thumbnails, hover, head view, statistics)")],
        None),
    _opt("json", Annotated[bool, typer.Option(
        "--json", rich_help_panel=OUTPUT, help="print the JSON document on stdout instead of tables")], False),
    _opt("json_file", Annotated[str | None, typer.Option(
        "--json-file", metavar="FILE.json", rich_help_panel=OUTPUT, help="write the JSON document to this file")],
        None),
    _opt("save_weights", Annotated[str | None, typer.Option(
        "--save-weights", metavar="FILE.npy", rich_help_panel=OUTPUT, help="save the weights [..., Lq, Lk]")],
        None),
    _opt("save_output", Annotated[str | None, typer.Option(
        "--save-output", metavar="FILE.npy", rich_help_panel=OUTPUT, help="save the output [..., Lq, d_v]")],
        None),
    _opt("no_table", Annotated[bool, typer.Option(
        "--no-table", rich_help_panel=OUTPUT, help="print no tables")], False),
    _opt("quiet", Annotated[bool, typer.Option(
        "--quiet", "-q", rich_help_panel=OUTPUT,
        help="print no tables and no progress or device lines; warnings and errors still go to stderr")],
        False),
]

#: the colour scale of heatmaps (compute commands and inspect; compare declares its own --vmax)
VminOpt = Annotated[float | None, checked_option(
    float | None, "--vmin", metavar="V", rich_help_panel=FIGURE,
    help="the bottom of the colour scale (default 0, or the lowest value when below 0; with --norm log the "
         "smallest positive value shown, at most 4 decades below the top)")]
VmaxOpt = Annotated[float | None, checked_option(
    float | None, "--vmax", metavar="V", rich_help_panel=FIGURE,
    help="the top of the colour scale (default the largest value shown); larger values take its top colour")]
def _norm_completions(incomplete: str) -> list[str]:
    """What TAB offers for --norm: its forms (a power needs its exponent after the colon)."""
    return [form for form in ("linear", "log", "power:0.5", "power:2") if form.startswith(incomplete)]


NormOpt = Annotated[str, checked_option(
    str, "--norm", parser=NormSpec(), metavar="linear|log|power:G", rich_help_panel=FIGURE,
    autocompletion=_norm_completions,
    help="how values map to colours: linear, log (small weights visible; zeros in the bottom colour) or "
         "power:G (matplotlib's PowerNorm, e.g. power:0.5)")]
ScalePerPanelOpt = Annotated[bool, typer.Option(
    "--scale-per-panel", rich_help_panel=FIGURE,
    help="draw each panel on its own scale, 0 to its own maximum (compare: symmetric around 0, up to its own "
         "largest difference), written with the panel, instead of one scale shared by all")]

#: heatmap appearance, for every command that draws one
FIGURE_OPTIONS = [
    _opt("title", Annotated[str | None, typer.Option(
        "--title", rich_help_panel=FIGURE, help="the heatmap's title")], None),
    _opt("cmap", Annotated[str | None, typer.Option(
        "--cmap", rich_help_panel=FIGURE, help="a matplotlib colour map for heatmaps (default viridis)")], None),
    _opt("reduce", typed(Literal["mean", "max"],
        "--reduce", rich_help_panel=FIGURE,
        help="how long maps are aggregated in blocks for heatmaps: mean or max"), "mean"),
    _opt("vmin", VminOpt, None),
    _opt("vmax", VmaxOpt, None),
    _opt("norm", NormOpt, "linear"),
    _opt("scale_per_panel", ScalePerPanelOpt, False),
]


def parse_index(text: str | None, lead: tuple[int, ...]) -> tuple[int, ...]:
    """``--index 0,2`` as a tuple over the leading dimensions; missing trailing ones are 0."""
    if text is None:
        return (0,) * len(lead)
    try:
        parts = [int(p) for p in text.replace(" ", "").split(",") if p != ""]
    except ValueError:
        raise UsageError(f"--index {text!r}: expected whole numbers separated by commas, e.g. 0,2.") from None
    if not lead:
        raise UsageError(f"--index {text}: these weights have no batch/head dimensions to pick from.")
    if len(parts) > len(lead):
        raise UsageError(f"--index {text}: {len(parts)} numbers for {len(lead)} leading dimension(s) {list(lead)}.")
    index = []
    for n, (i, size) in enumerate(zip(parts, lead)):
        if not -size <= i < size:
            raise UsageError(f"--index {text}: position {n} is {i}, but that dimension has size {size}.")
        index.append(i % size)
    return tuple(index) + (0,) * (len(lead) - len(parts))


# ----------------------------------------------------------------------------------------------
# Usage errors in attnviz's format


def _flag(param: Any) -> str:
    """How a message names a parameter: its long option, or an argument's metavar."""
    if param is None:
        return "option"
    if getattr(param, "param_type_name", "") == "argument":
        return str(param.metavar or param.name or "argument").strip("{}[]").upper()
    opts = [o for o in param.opts if o.startswith("--")] or list(param.opts)
    return max(opts, key=len) if opts else str(param.name)


def _usage(ctx: Any) -> str:
    if ctx is None or ctx.command is None:
        return ""
    pieces = " ".join(ctx.command.collect_usage_pieces(ctx)).replace("{", "").replace("}", "")
    return f"{ctx.command_path} {pieces}".strip()


def _sentence(text: str) -> str:
    text = _inert(" ".join(text.split()), limit=300)
    if len(text) > 1 and text[0].isupper() and text[1].islower():
        text = text[0].lower() + text[1:]
    return text if text.endswith((".", "?", "!")) else text + "."


def _either(names: list[str]) -> str:
    names = [_inert(n) for n in names]
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " or " + names[-1]


#: Typer's own number checks (options declared without ``typed``), as attnviz words them
_PYDANTIC = {"int_parsing": "expected a whole number", "int_type": "expected a whole number",
             "int_from_float": "expected a whole number", "float_parsing": "expected a number",
             "float_type": "expected a number", "finite_number": "must be a finite number",
             "greater_than_equal": "must be at least {ge}", "less_than_equal": "must be at most {le}",
             "greater_than": "must be greater than {gt}", "less_than": "must be less than {lt}"}


def _bad_parameter(exc: Any) -> str:
    flag = _flag(exc.param)
    value, problem = None, exc.message
    cause = exc.__cause__
    errors = cause.errors() if hasattr(cause, "errors") else []
    if errors:
        first = errors[0]
        value = first.get("input")
        template = _PYDANTIC.get(first.get("type", ""))
        problem = template.format(**first.get("ctx", {})) if template else str(first.get("msg", problem))
        problem = problem.removeprefix("Value error, ")
    problem = _sentence(problem)
    return f"{flag} {shown(value)}: {problem}" if value is not None else f"{flag}: {problem}"


def usage_message(exc: Exception) -> str:
    """A usage error of the command line (Typer's Click: unknown option or command, bad or missing
    value, missing argument) as one line: ``--device 'tpu': expected one of auto, cpu, gpu.``"""
    from typer._click import exceptions as clk  # Typer vendors Click

    ctx = getattr(exc, "ctx", None)
    command = ctx.command_path if ctx is not None else "attnviz"
    if isinstance(exc, OptionValueError):
        return f"{_flag(exc.param)} {shown(exc.value)}: {exc.problem}."
    if isinstance(exc, clk.MissingParameter):
        if getattr(exc.param, "param_type_name", "") == "argument":
            usage = _usage(ctx)
            return f"missing argument {_flag(exc.param)}" + (f"; usage: {usage}." if usage else ".")
        return f"missing option {_flag(exc.param)}."
    if isinstance(exc, clk.BadParameter):
        return _bad_parameter(exc)
    if isinstance(exc, clk.NoSuchOption):
        name = shown(exc.option_name).strip("'")
        if exc.possibilities:
            return f"{name}: no such option of {command}; did you mean {_either(sorted(exc.possibilities))}?"
        return f"{name}: no such option of {command} (`{command} --help` lists them)."
    if isinstance(exc, clk.BadOptionUsage):
        name = shown(exc.option_name).strip("'")
        if " requires " in exc.message:
            return f"{name}: needs a value."
        if "does not take a value" in exc.message:
            return f"{name}: a flag, it takes no value."
        return f"{name}: {_sentence(exc.message)}"
    message = exc.format_message() if isinstance(exc, clk.ClickException) else str(exc)
    unknown = re.fullmatch(r"No such command (.+?)\.(?: Did you mean (.+)\?)?", message)
    if unknown:
        hint = f"; did you mean {unknown.group(2)}?" if unknown.group(2) else f" (`{command} --help` lists them)."
        return f"{_inert(unknown.group(1), 60)}: no such command{hint}"
    if message == "Missing command.":
        return (f"missing command: `{command} COMMAND ...`, e.g. `{command} scaled q.npy k.npy v.npy` or "
                f"`{command} inspect attn.npz` (`{command} --help` lists the commands).")
    text = _sentence(message.removeprefix("Got "))
    usage = _usage(ctx) if ctx is not None and ctx.parent is not None else ""
    return f"{text.rstrip('.')}; usage: {usage}." if usage else text


# ----------------------------------------------------------------------------------------------
# Output files, all or nothing


class StagedOutputs:
    """A run's output files, all or nothing.

    ``reserve`` creates, before anything is computed, an empty hidden file next to each target
    (``.attn.png.x1y2.staged.png``): that proves the folder exists and takes new files. The run
    writes each output to its staged file (``staged[option]``); ``commit`` renames them all into
    place once every one is written. When the run fails, ``discard`` removes the staged files: a
    failed run leaves no new file behind and changes no file that was there before. A target that
    existed is replaced (atomically, by the rename) only when the whole run succeeded.
    """

    def __init__(self, targets: Mapping[str, Path]) -> None:
        self.targets = dict(targets)
        self.staged: dict[str, Path] = {}
        self.committed: list[Path] = []

    def reserve(self) -> None:
        for option, path in self.targets.items():
            if path.exists() and not path.is_file():  # a FIFO, a device: never replaced by a file
                self.discard()
                raise OutputError(f"{option} {path}: exists and is not a regular file; refusing to replace it.")
            folder = path.parent if str(path.parent) else Path(".")
            try:
                fd, name = tempfile.mkstemp(dir=folder, prefix=f".{path.name[:60]}.", suffix=f".staged{path.suffix}")
            except OSError as exc:
                self.discard()
                raise OutputError(f"{option} {path}: cannot write into {folder} ({exc.strerror or exc}).") from None
            os.close(fd)
            self.staged[option] = Path(name)

    def __contains__(self, option: object) -> bool:
        return option in self.staged

    def __getitem__(self, option: str) -> Path:
        return self.staged[option]

    def get(self, option: str) -> Path | None:
        return self.staged.get(option)

    def commit(self) -> None:
        """Put every staged file in place. Should a rename fail, the files already put in place by
        this commit are removed too (they replaced any older ones: those are gone)."""
        for option, stage in list(self.staged.items()):
            try:
                os.replace(stage, self.targets[option])
            except OSError as exc:
                self.discard()
                raise OutputError(f"{option} {self.targets[option]}: cannot write ({exc.strerror or exc}).") from None
            self.committed.append(self.targets[option])
            del self.staged[option]
        self.committed.clear()

    def discard(self) -> None:
        """Remove the staged files (and what a failed commit already put in place)."""
        for path in [*self.staged.values(), *self.committed]:
            try:
                path.unlink()
            except OSError:
                pass
        self.staged.clear()
        self.committed.clear()

    def real_names(self, text: str) -> str:
        """A message about a staged file, naming the target instead."""
        for option, stage in self.staged.items():
            text = text.replace(str(stage), str(self.targets[option]))
        return text


@contextmanager
def staged_outputs(targets: Mapping[str, Path]) -> Iterator[StagedOutputs]:
    """Reserve every target and run the body, which writes the staged files and calls ``commit``
    to put them all in place. On any error the staged files are removed (and the error re-raised,
    naming the targets); a body that ends without ``commit`` leaves nothing either."""
    staged = StagedOutputs(targets)
    try:
        staged.reserve()
        yield staged
    except BaseException as exc:
        if isinstance(exc, AttnvizError):
            exc.message = staged.real_names(exc.message)
            exc.args = (exc.message,)
        raise
    finally:
        staged.discard()  # after a commit, nothing is left to discard

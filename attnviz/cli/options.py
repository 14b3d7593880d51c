"""The options every compute command shares, as ``inspect.Parameter`` objects with Annotated Typer
types; ``app.py`` puts them after each variant's own arguments and options."""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Annotated, Literal

import typer

from attnviz.choices import CAUSAL_ALIGNS, DEVICES, DTYPES, MASK_CONVENTIONS, MASK_KINDS, ROPE_STYLES
from attnviz.errors import UsageError

MASKS = "Masks"
PARAMS = "Learned parameters"
LABELS = "Labels"
RUN = "Device and precision"
OUTPUT = "Output"
CAPTURED = "Captured Q/K/V (layouts, grouped heads, RoPE)"

_KW = inspect.Parameter.KEYWORD_ONLY


def _opt(name: str, annotation: object, default: object) -> inspect.Parameter:
    return inspect.Parameter(name, _KW, default=default, annotation=annotation)


#: RunOptions fields (see attnviz.pipeline.RunOptions)
RUN_OPTIONS = [
    _opt("mask", Annotated[str | None, typer.Option(
        "--mask", metavar="FILE", rich_help_panel=MASKS,
        help="mask broadcasting to [..., Lq, Lk] (any array file, FILE:KEY); a 1-D [Lk] mask applies to every "
             "query")], None),
    _opt("mask_convention", Annotated[Literal[MASK_CONVENTIONS], typer.Option(  # type: ignore[valid-type]
        "--mask-convention", rich_help_panel=MASKS,
        help="keep: 1 = may attend (Keras, PyTorch SDPA); block: 1 = masked (TF tutorial)")], "keep"),
    _opt("mask_kind", Annotated[Literal[MASK_KINDS], typer.Option(  # type: ignore[valid-type]
        "--mask-kind", rich_help_panel=MASKS,
        help="bool: 0/1 mask; additive: float bias added to the scores (0 keeps, -inf masks)")], "bool"),
    _opt("key_padding_mask", Annotated[str | None, typer.Option(
        "--key-padding-mask", metavar="FILE", rich_help_panel=MASKS,
        help="[batch..., Lk] mask of real keys vs padding, aligned on the batch dimensions")], None),
    _opt("causal", Annotated[bool, typer.Option(
        "--causal", rich_help_panel=MASKS, help="query i attends to keys j <= i only")], False),
    _opt("causal_align", Annotated[Literal[CAUSAL_ALIGNS], typer.Option(  # type: ignore[valid-type]
        "--causal-align", rich_help_panel=MASKS,
        help="when Lq != Lk: top-left (j <= i; Keras, PyTorch) or bottom-right (j <= i + Lk - Lq; KV cache)")],
        "top-left"),
    _opt("labels", Annotated[str | None, typer.Option(
        "--labels", metavar="TOKENS", rich_help_panel=LABELS,
        help="labels for both axes (self-attention): a text file (one a line), JSON list, or a,b,c")], None),
    _opt("q_labels", Annotated[str | None, typer.Option(
        "--q-labels", metavar="TOKENS", rich_help_panel=LABELS, help="labels of the queries (rows)")], None),
    _opt("k_labels", Annotated[str | None, typer.Option(
        "--k-labels", metavar="TOKENS", rich_help_panel=LABELS, help="labels of the keys (columns)")], None),
    _opt("device", Annotated[Literal[DEVICES], typer.Option(  # type: ignore[valid-type]
        "--device", rich_help_panel=RUN, help="auto: the GPU when TensorFlow sees one, else the CPU")], "auto"),
    _opt("dtype", Annotated[Literal[DTYPES], typer.Option(  # type: ignore[valid-type]
        "--dtype", rich_help_panel=RUN,
        help="compute precision; float16/bfloat16 scores are upcast to float32 for the softmax")], "float32"),
    _opt("max_memory", Annotated[str | None, typer.Option(
        "--max-memory", metavar="SIZE", rich_help_panel=RUN,
        help="memory for the weights while computing, e.g. 512M or 2G (default 512M or RAM/8); longer inputs "
             "run in blocks of query rows")], None),
]


#: ParamOptions fields (see attnviz.pipeline.ParamOptions), for variants with learned parameters
PARAM_OPTIONS = [
    _opt("params", Annotated[str | None, typer.Option(
        "--params", metavar="FILE", rich_help_panel=PARAMS,
        help="the learned parameters: .npz, .safetensors, .h5 or .pt, one array per key ([in, out] kernels, "
             "applied as x @ W)")], None),
    _opt("seed", Annotated[int | None, typer.Option(
        "--seed", rich_help_panel=PARAMS,
        help="draw the parameters (Glorot-uniform kernels, zero biases) from this seed; default 0 "
             "when --params is not given")], None),
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
    _opt("rope_theta", Annotated[float, typer.Option(
        "--rope-theta", rich_help_panel=CAPTURED, help="RoPE base (Llama 10000; Llama 3 500000)")], 10000.0),
    _opt("rope_style", Annotated[Literal[ROPE_STYLES], typer.Option(  # type: ignore[valid-type]
        "--rope-style", rich_help_panel=CAPTURED,
        help="half: Hugging Face Llama's rotate_half; interleaved: GPT-J / RoFormer pairs (2i, 2i+1)")], "half"),
    _opt("rope_dim", Annotated[int | None, typer.Option(
        "--rope-dim", metavar="N", rich_help_panel=CAPTURED,
        help="rotate the first N dimensions of each head only (partial rotary, GPT-NeoX); default all")], None),
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
    json: bool = False
    json_file: str | None = None
    save_weights: str | None = None
    save_output: str | None = None
    no_table: bool = False
    quiet: bool = False
    title: str | None = None
    cmap: str | None = None
    reduce: str = "mean"

    def check(self) -> None:
        """Option values that are wrong whatever the data (exit 2)."""
        check_png_path(self.png)
        if self.cmap is not None:
            from attnviz.render.heatmap import check_cmap

            check_cmap(self.cmap)
        for option, value in (("--save-weights", self.save_weights), ("--save-output", self.save_output)):
            if value is not None and not value.lower().endswith(".npy"):
                raise UsageError(f"{option} {value}: the file must end in .npy.")


def check_png_path(value: str | None, option: str = "--png") -> None:
    if value is not None and not value.lower().endswith((".png", ".svg", ".pdf")):
        raise UsageError(f"{option} {value}: the file must end in .png, .svg or .pdf.")


def check_save_params(value: str | None) -> None:
    if value is not None and not value.lower().endswith(".npz"):
        raise UsageError(f"--save-params {value}: the file must end in .npz.")


OUTPUT_OPTIONS = [
    _opt("index", Annotated[str | None, typer.Option(
        "--index", metavar="I,J", rich_help_panel=OUTPUT,
        help="which batch/head slice the tables show, e.g. 0,2 (default: the first)")], None),
    _opt("precision", Annotated[int, typer.Option(
        "--precision", min=0, max=12, rich_help_panel=OUTPUT, help="digits after the point in tables")], 3),
    _opt("max_rows", Annotated[int, typer.Option(
        "--max-rows", min=0, rich_help_panel=OUTPUT,
        help="show at most this many query rows, eliding the middle (0: all)")], 40),
    _opt("max_cols", Annotated[int | None, typer.Option(
        "--max-cols", min=0, rich_help_panel=OUTPUT,
        help="show at most this many key columns (default: what fits the terminal; 0: all)")], None),
    _opt("png", Annotated[str | None, typer.Option(
        "--png", metavar="FILE", rich_help_panel=OUTPUT,
        help="save a heatmap (.png, .svg or .pdf); a grid of panels when there are batch/head dimensions")],
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

#: heatmap appearance, for every command that draws one
FIGURE_OPTIONS = [
    _opt("title", Annotated[str | None, typer.Option(
        "--title", rich_help_panel=OUTPUT, help="the heatmap's title")], None),
    _opt("cmap", Annotated[str | None, typer.Option(
        "--cmap", rich_help_panel=OUTPUT, help="a matplotlib colour map for heatmaps (default viridis)")], None),
    _opt("reduce", Annotated[Literal["mean", "max"], typer.Option(
        "--reduce", rich_help_panel=OUTPUT,
        help="how long maps are aggregated in blocks for heatmaps: mean or max")], "mean"),
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

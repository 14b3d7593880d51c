"""The options of the runs over saved weights (``inspect``, ``compare``, ``rollout``), declared once
(``attnviz.fields.option``): what to read, which map to show, masks, checks, the grids' layers and
heads. The standard library only: the command line builds its options from these without NumPy.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from attnviz.choices import (
    CAUSAL_ALIGNS,
    HEAD_COMBINE,
    MASK_CONVENTIONS,
    MASK_KINDS,
    ROLLOUT_METHODS,
    SUBWORD_STYLES,
    UPSAMPLING,
    WEIGH_BY,
)
from attnviz.errors import UsageError
from attnviz.fields import CHECKS, FIGURE, IMAGE, LABELS, MASKS, OUTPUT, ROLLOUT, SELECT, option

WEIGH_HELP = ("weights: the attention weights; value-norms: alpha_ij * ||v_j W_O^h|| per head (Kobayashi et al. "
              "2020), from a capture file's v and wo; not normalised")
LAYOUT_HELP = "name the axes when the rank does not say, e.g. batch,q,k (from layer, batch, head, q, k)"
MERGE_HELP = ("merge sub-word tokens into words (WordPiece ##, SentencePiece ▁, byte-level BPE Ġ, read from the "
              "labels): keys of a word summed, queries averaged, rows renormalised")
STYLE_HELP = "the sub-word convention of --merge-subwords (auto: read from the labels)"
GENERATION_HELP = ("the file holds generate()'s attentions, keys STEP.LAYER (torch.save of out.attentions): "
                   "stitched into one map per layer over the prompt and the generated tokens")
PER_ENTRY_HELP = ("a padded batch of different sentences: one list per batch entry (a JSON list of lists, or a text "
                  "file with a blank line between the entries)")
BATCH_HELP = "the batch entry shown; head statistics average over all entries unless this is given"
ROLLOUT_BATCH_HELP = ("the batch entry rolled out, printed and drawn (default: every entry is rolled out, into the "
                      "JSON and --html, and the first printed and drawn)")


@dataclass(frozen=True)
class LabelOptions:
    """Token labels: ``--labels`` (both axes, self-attention) or ``--q-labels``/``--k-labels``."""

    labels: str | None = option(None, "labels for both axes (self-attention): a text file (one a line), JSON list, "
                                "or a,b,c; " + PER_ENTRY_HELP, panel=LABELS, metavar="TOKENS")
    q_labels: str | None = option(None, "labels of the queries (rows), as --labels", panel=LABELS, metavar="TOKENS")
    k_labels: str | None = option(None, "labels of the keys (columns), as --labels", panel=LABELS, metavar="TOKENS")
    merge_subwords: bool = option(False, MERGE_HELP, panel=LABELS)
    subword_style: Literal[SUBWORD_STYLES] = option("auto", STYLE_HELP, panel=LABELS)  # type: ignore[valid-type]


@dataclass(frozen=True)
class Selection:
    """The map the tables show: ``--layer``, ``--batch`` (None: every entry counts in the head
    statistics, the first is shown), ``--head``; negative numbers count from the end."""

    layer: int | None = option(None, "the layer the tables show (default 0) and the image overlay's (default the "
                               "last, as DINO draws it)", panel=SELECT)
    head: int = option(0, "the head the tables show", panel=SELECT)
    batch: int | None = option(None, BATCH_HELP, panel=SELECT)

    def index(self, shape: tuple[int, ...]) -> tuple[int, int, int]:
        """(layer, batch, head) in weights of ``shape [layers, batch, heads, ...]`` (exit 2 when out of range)."""
        layers, batches, heads = shape[:3]
        for option_name, value, size in (("--layer", self.layer or 0, layers), ("--batch", self.batch or 0, batches),
                                         ("--head", self.head, heads)):
            if not -size <= value < size:
                raise UsageError(f"{option_name} {value}: the weights have {size} ({option_name[2:]} 0..{size - 1}).")
        return (self.layer or 0) % layers, (self.batch or 0) % batches, self.head % heads


@dataclass(frozen=True)
class ImageOptions:
    """Attention over an image (``attnviz.inspection.images``): the picture, where its patches are among
    the keys (a ViT's prefix tokens then a patch grid, or a vision-language model's span of image
    tokens), the query drawn, and how the grid is brought to the picture's pixels."""

    image: str | None = option(None, "the picture the model saw: a PNG or JPEG file, or an array [H, W, 3] (.npy; "
                               "also [3, H, W] or [1, 3, H, W] pixel_values) after preprocessing; the attention is "
                               "drawn over it (--overlay-png, the --html image panel)", panel=IMAGE, metavar="FILE")
    patch_grid: str | None = option(None, "the patch grid, rows x columns, e.g. 14x14 (default: from --patch-size "
                                    "and the image, or the square that fills the keys)", panel=IMAGE, metavar="HxW",
                                    parse="grid")
    patch_size: int | None = option(None, "the patch side in pixels: the grid is the image's height and width "
                                    "divided by it (the rest cropped, as DINO does)", panel=IMAGE, min=1)
    prefix_tokens: int | None = option(None, "tokens before the patches (default 1, the CLS token; DeiT's "
                                       "distillation token makes 2, DINOv2 with 4 registers 5)", panel=IMAGE, min=0)
    image_tokens: str | None = option(None, "vision-language models: the image's tokens are the positions START to "
                                      "END - 1 of the sequence (e.g. 5:581 for LLaVA's 576), instead of a prefix",
                                      panel=IMAGE, metavar="START:END", parse="span")
    query: str = option("cls", "the query whose attention over the patches is drawn: cls (position 0), a position "
                        "(negative: from the end) or a token label (--labels; its first occurrence)", panel=IMAGE,
                        metavar="cls|POS|TOKEN")
    upsample: Literal[UPSAMPLING] = option(  # type: ignore[valid-type]
        "nearest", "how the patch grid is brought to the image's pixels: nearest (each patch one flat square, as "
        "DINO) or bilinear", panel=IMAGE)
    keep_mass: float | None = option(None, "outline the fewest patches holding this share of the attention (DINO's "
                                     "--threshold), e.g. 0.6", panel=IMAGE, above=0, max=1, metavar="F")

    @property
    def wanted(self) -> bool:
        """Whether the run maps attention onto patches at all."""
        return any(value is not None for value in (self.image, self.patch_grid, self.patch_size, self.prefix_tokens,
                                                   self.image_tokens))


@dataclass(frozen=True)
class MaskOptions:
    """The masks a run over saved weights was given."""

    mask: str | None = option(None, "what the model was allowed to attend: [B, S] (a Hugging Face attention_mask), "
                              "4-D [B, 1|N, 1|T, S], or broadcasting to the maps [..., Lq, Lk]; masked keys and padded "
                              "query rows are left out of statistics and checks", panel=MASKS, metavar="FILE")
    key_padding_mask: str | None = option(None, "[B, S] or [S]: 1 = real token, 0 = padding (with --mask-convention "
                                          "keep); padded keys, and the query rows at padded positions when Lq = Lk, "
                                          "are left out", panel=MASKS, metavar="FILE")
    mask_convention: Literal[MASK_CONVENTIONS] = option(  # type: ignore[valid-type]
        "keep", "keep: 1 = may attend; block: 1 = masked", panel=MASKS)
    mask_kind: Literal[MASK_KINDS] = option(  # type: ignore[valid-type]
        "bool", "of --mask: bool (0/1) or additive (a float bias: 0 keeps; -inf or <= -1e4, as Hugging Face's dtype "
        "minimum, masks)", panel=MASKS)
    check_mask: str | None = option(None, "no weight where this 0/1 mask forbids it (shapes as --mask); it masks the "
                                    "statistics too", panel=CHECKS, metavar="FILE")


@dataclass(frozen=True)
class CheckOptions:
    """The checks of inspect (each fails the run with exit 3 on the command line)."""

    check_rows: bool = option(False, "every row that may attend sums to 1 within --atol", panel=CHECKS)
    check_causal: bool = option(False, "nothing above the diagonal", panel=CHECKS)
    causal_align: Literal[CAUSAL_ALIGNS] = option(  # type: ignore[valid-type]
        "top-left", "the diagonal when Lq != Lk", panel=CHECKS)
    check_finite: bool = option(False, "no NaN or infinity", panel=CHECKS)
    atol: float | None = option(None, "absolute tolerance of the checks (default 1e-5; for weights stored in float16 "
                                "2e-3, bfloat16 1.6e-2, their rounding)", panel=CHECKS, min=0)


@dataclass(frozen=True)
class GridOptions:
    """The layers and heads the grids draw (None: all), and one map per layer instead of every head."""

    layers: str | None = option(None, "the layers the grids draw (--png, --html; inspect's --stats-png too), e.g. "
                                "0,3,5-7; default all", panel=FIGURE, metavar="0,3,5-7", parse="ranges")
    heads: str | None = option(None, "the heads the grids draw, e.g. 0-3; default all", panel=FIGURE,
                               metavar="0,3,5-7", parse="ranges")
    reduce_heads: Literal["mean", "max"] | None = option(
        None, "draw one map per layer, the mean (or max) of its heads (those of --heads), instead of every head",
        panel=FIGURE)


@dataclass(frozen=True)
class InspectOptions:
    """What ``inspect`` reads and computes for one file of weights."""

    weights: str = option("", cli=False)
    layout: str | None = option(None, LAYOUT_HELP, panel=SELECT, metavar="AXES")
    generation: bool = option(False, GENERATION_HELP, panel=SELECT)
    labels: LabelOptions = field(default_factory=LabelOptions)
    selection: Selection = field(default_factory=Selection)
    masks: MaskOptions = field(default_factory=MaskOptions)
    checks: CheckOptions = field(default_factory=CheckOptions)
    grid: GridOptions = field(default_factory=GridOptions)
    images: ImageOptions = field(default_factory=ImageOptions)
    weigh_by: Literal[WEIGH_BY] = option("weights", WEIGH_HELP, panel=SELECT)  # type: ignore[valid-type]
    received: bool = option(True, cli=False)  # compute the attention each token receives
    row_stats: bool = option(True, cli=False)  # compute the shown map's per-query statistics


@dataclass(frozen=True)
class CompareOptions:
    """What ``compare`` reads and computes."""

    a: str = option("", cli=False)
    b: str = option("", cli=False)
    layout: str | None = option(None, LAYOUT_HELP, panel=SELECT, metavar="AXES")
    generation: bool = option(False, GENERATION_HELP + " (both files)", panel=SELECT)
    generation_a: bool = option(False, "A alone holds generate()'s attentions (as --generation); B may be a forward "
                                "pass over out.sequences, whose last token, never fed back, is left out", panel=SELECT)
    generation_b: bool = option(False, "B alone holds generate()'s attentions (as --generation-a)", panel=SELECT)
    labels: LabelOptions = field(default_factory=LabelOptions)
    atol: float | None = option(None, "fail (exit 3) where |A - B| > atol + rtol |B|", panel=CHECKS, min=0)
    rtol: float | None = option(None, "relative tolerance of the check (default 0)", panel=CHECKS, min=0)
    worst: int = option(5, "list this many of the most different rows", panel=OUTPUT, min=1)
    selection: Selection = field(default_factory=Selection)
    masks: MaskOptions = field(default_factory=MaskOptions)
    grid: GridOptions = field(default_factory=GridOptions)


@dataclass(frozen=True)
class RolloutOptions:
    """What ``rollout`` reads and computes."""

    weights: str = option("", cli=False)
    layout: str | None = option(None, LAYOUT_HELP, panel=SELECT, metavar="AXES")
    generation: bool = option(False, GENERATION_HELP, panel=SELECT)
    labels: str | None = option(None, "the tokens (both axes): a text file (one a line), JSON list or a,b,c; "
                                + PER_ENTRY_HELP, panel=LABELS, metavar="TOKENS")
    merge_subwords: bool = option(False, MERGE_HELP, panel=LABELS)
    subword_style: Literal[SUBWORD_STYLES] = option("auto", STYLE_HELP, panel=LABELS)  # type: ignore[valid-type]
    batch: int | None = option(None, ROLLOUT_BATCH_HELP, panel=SELECT)
    weigh_by: Literal[WEIGH_BY] = option("weights", WEIGH_HELP, panel=SELECT)  # type: ignore[valid-type]
    method: Literal[ROLLOUT_METHODS] = option(  # type: ignore[valid-type]
        "rollout", "rollout: the layers' maps multiplied (Abnar & Zuidema); flow: the maximum flow through them "
        "from each token to each input, rows renormalised (Abnar & Zuidema; L^2 max-flow problems: seconds at 48 "
        "tokens, far longer at hundreds); grad: Chefer et al.'s R = R + mean_h(clamp(grad * A, min=0)) R, which "
        "needs the gradients: --grads, or a capture taken with --target", panel=ROLLOUT)
    grads: str | None = option(None, "--method grad: the gradients of the explained score with respect to every "
                               "layer's attention weights, read as the weights are (same formats and shape); not "
                               "needed for a capture taken with --target, which holds them", panel=ROLLOUT,
                               metavar="FILE")
    heads: Literal[HEAD_COMBINE] = option(  # type: ignore[valid-type]
        "mean", "how each layer's heads are combined (the paper: mean)", panel=ROLLOUT)
    residual: float = option(0.5, "r in A' = (1 - r) A + r I, the residual connection's share (the paper: 0.5; 0: "
                             "attention alone)", panel=ROLLOUT, min=0, max=1)
    start_layer: int = option(0, "begin the product at this layer", panel=ROLLOUT, min=0)
    all_layers: bool = option(False, "also give the cumulative map after each layer (JSON rollout.cumulative; the PNG "
                              "shows them all)", panel=ROLLOUT)
    discard_ratio: float = option(0.0, "in each layer's combined map, zero this share of the lowest entries (never "
                                  "the first token's own, CLS to CLS) before the residual, as vit-explain does (e.g. "
                                  "0.9)", panel=ROLLOUT, min=0, max=1, metavar="R")
    masks: MaskOptions = field(default_factory=MaskOptions)
    images: ImageOptions = field(default_factory=ImageOptions)


SUMMARY = "Summary (long inputs)"


@dataclass(frozen=True)
class SpanOptions:
    """What inspect reads in a summary capture alone (``attnviz.inspection.kinds.inspect_summary``): spans of key
    positions (``--span``), spans found by their text (``--span-text``) and the needle whose retrieval scores are
    asked for (``--needle``). The command line declares them as repeatable options of their own; the Python API
    takes them as keywords (``span=["doc=10:50"]``, ``needle="doc"``)."""

    span: tuple[str, ...] = option((), "a summary: each head's attention on the key positions START..END-1 (a "
                                   "document of a retrieval prompt, a needle); repeatable", panel=SUMMARY,
                                   metavar="NAME=START:END")
    span_text: tuple[str, ...] = option((), "a summary: a span found by its text in the tokens; repeatable",
                                        panel=SUMMARY, metavar="NAME=TEXT")
    needle: str | None = option(None, "a summary captured with --generate: each head's retrieval score (Wu et al. "
                                "2024) for this span (a --span name) or text", panel=SUMMARY, metavar="NAME|TEXT")

    @property
    def given(self) -> bool:
        return bool(self.span or self.span_text or self.needle)

    @classmethod
    def of(cls, span: Any = None, span_text: Any = None, needle: str | None = None) -> SpanOptions:
        """From the command line's values (lists, or None) or the API's (a string or a sequence of them)."""
        def listed(value: Any) -> tuple[str, ...]:
            return (value,) if isinstance(value, str) else tuple(value or ())

        return cls(listed(span), listed(span_text), needle)

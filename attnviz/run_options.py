"""The options of a compute run, declared once (``attnviz.fields.option``): ``RunOptions`` (masks,
labels, device and precision), ``ParamOptions`` (learned parameters) and ``CaptureOptions`` (captured
Q/K/V: layouts, RoPE). The standard library only: the command line builds its options from these
without importing NumPy.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from attnviz.choices import (
    CAUSAL_ALIGNS,
    DEVICES,
    MASK_CONVENTIONS,
    MASK_KINDS,
    MODEL_ATTENTION,
    ROPE_PARTS,
    ROPE_STYLES,
    SUBWORD_STYLES,
)
from attnviz.choices import DTYPES as DTYPE_NAMES
from attnviz.fields import CAPTURED, LABELS, MASKS, MODEL, PARAMS, RUN, option


@dataclass
class RunOptions:
    """The options every compute command shares."""

    mask: str | None = option(None, "mask broadcasting to [..., Lq, Lk] (any array file, FILE:KEY); a 1-D [Lk] mask "
                              "applies to every query", panel=MASKS, metavar="FILE")
    mask_convention: Literal[MASK_CONVENTIONS] = option(  # type: ignore[valid-type]
        "keep", "keep: 1 = may attend (Keras, PyTorch SDPA); block: 1 = masked (TF tutorial)", panel=MASKS)
    mask_kind: Literal[MASK_KINDS] = option(  # type: ignore[valid-type]
        "bool", "bool: 0/1 mask; additive: float bias added to the scores (0 keeps, -inf masks)", panel=MASKS)
    key_padding_mask: str | None = option(None, "[batch..., Lk] mask of real keys vs padding, aligned on the batch "
                                          "dimensions", panel=MASKS, metavar="FILE")
    causal: bool = option(False, "query i attends to keys j <= i only", panel=MASKS)
    causal_align: Literal[CAUSAL_ALIGNS] = option(  # type: ignore[valid-type]
        "top-left", "when Lq != Lk: top-left (j <= i; Keras, PyTorch) or bottom-right (j <= i + Lk - Lq; KV cache)",
        panel=MASKS)
    labels: str | None = option(None, "labels for both axes (self-attention): a text file (one a line), JSON list, "
                                "or a,b,c", panel=LABELS, metavar="TOKENS")
    q_labels: str | None = option(None, "labels of the queries (rows)", panel=LABELS, metavar="TOKENS")
    k_labels: str | None = option(None, "labels of the keys (columns)", panel=LABELS, metavar="TOKENS")
    merge_subwords: bool = option(False, "merge sub-word tokens into words in the weights shown and saved (WordPiece "
                                  "##, SentencePiece ▁, byte-level BPE Ġ, read from the labels): keys summed, queries "
                                  "averaged, rows renormalised; the output stays per token", panel=LABELS)
    subword_style: Literal[SUBWORD_STYLES] = option(  # type: ignore[valid-type]
        "auto", "the sub-word convention of --merge-subwords (auto: read from the labels)", panel=LABELS)
    device: Literal[DEVICES] = option(  # type: ignore[valid-type]
        "auto", "auto: the GPU when TensorFlow sees one, else the CPU", panel=RUN)
    dtype: Literal[DTYPE_NAMES] = option(  # type: ignore[valid-type]
        "float32", "compute precision; float16/bfloat16 scores are upcast to float32 for the softmax", panel=RUN)
    max_memory: str | None = option(None, "memory for the weights while computing, e.g. 512M or 2G (default 512M or "
                                    "RAM/8); longer inputs run in blocks of query rows", panel=RUN, metavar="SIZE",
                                    parse="size")


@dataclass
class ParamOptions:
    """Where a variant's learned parameters come from (variants with ``learned=True`` only)."""

    params: str | None = option(None, "the learned parameters: .npz, .safetensors, .h5 or .pt, one array per key "
                                "([in, out] kernels, applied as x @ W)", panel=PARAMS, metavar="FILE")
    seed: int | None = option(None, "draw the parameters (Glorot-uniform kernels, zero biases) from this seed; "
                              "default 0 when --params is not given", panel=PARAMS, min=0, parse="seed")
    save_params: str | None = option(None, "write the parameters used, to repeat the run exactly with --params",
                                     panel=PARAMS, metavar="FILE.npz")


@dataclass
class CaptureOptions:
    """The options of commands whose inputs are Q, K and V (see ``attnviz.captured``)."""

    layout: str | None = option(None, "the axes of Q, K and V from batch, head, seq, d, e.g. batch,seq,head,d for "
                                "the [B, L, H, d] that hooks capture; weights come out [batch, head, Lq, Lk]",
                                panel=CAPTURED, metavar="AXES")
    layout_kv: str | None = option(None, "the axes of K and V when they differ from Q's", panel=CAPTURED,
                                   metavar="AXES")
    rope: bool = option(False, "apply rotary position embeddings to Q and K before the scores (q/k captured before "
                        "RoPE)", panel=CAPTURED)
    rope_theta: float = option(10000.0, "RoPE base (Llama 10000; Llama 3 500000)", panel=CAPTURED, min=1)
    rope_style: Literal[ROPE_STYLES] = option(  # type: ignore[valid-type]
        "half", "half: Hugging Face Llama's rotate_half; interleaved: GPT-J / RoFormer pairs (2i, 2i+1)",
        panel=CAPTURED)
    rope_dim: int | None = option(None, "rotate the first N dimensions of each head only (partial rotary, "
                                  "GPT-NeoX); default all", panel=CAPTURED, min=2, metavar="N")
    rope_part: Literal[ROPE_PARTS] = option(  # type: ignore[valid-type]
        "first", "which dimensions of each head --rope-dim rotates: the first (GPT-NeoX, Phi) or the last "
                 "(DeepSeek's multi-head latent attention)", panel=CAPTURED)
    positions: str | None = option(None, "position ids [L] or [B, L] for --rope (default 0..L-1); needed for left "
                                   "padding", panel=CAPTURED, metavar="FILE")
    rope_scaling: str | None = option(None, "RoPE scaling as a config's rope_scaling / rope_parameters object (JSON "
                                      "text or a .json file): linear, dynamic, yarn, longrope, llama3, proportional",
                                      panel=CAPTURED, metavar="JSON")
    hf_config: str | None = option(None, "a model's config.json (or its folder): apply the scale, softcap, windows, "
                                   "RoPE, ALiBi and causality it gives to layer --model-layer", panel=MODEL,
                                   metavar="FILE")
    model_layer: int | None = option(None, "the layer of --hf-config the q/k/v come from (0-based)", panel=MODEL,
                                     min=0, metavar="N")
    model_attention: Literal[MODEL_ATTENTION] | None = option(  # type: ignore[valid-type]
        None, "which attention of an encoder-decoder --hf-config (T5, BART, Whisper): encoder or decoder "
              "self-attention, or cross", panel=MODEL)
    softcap: float | None = option(None, "attention-logit softcap C: scores become C tanh(s / C) before masking "
                                   "(Gemma 2 attn_logit_softcapping)", panel=MODEL, above=0, metavar="C")
    sliding_window: int | None = option(None, "transformers' sliding window W: query i sees key j when "
                                        "0 <= i - j < W (causal)", panel=MODEL, min=1, metavar="W")
    chunk_size: int | None = option(None, "chunked attention (Llama 4): query i sees key j in its own chunk of N "
                                    "positions (causal; chunks counted from the first real key)", panel=MODEL, min=1,
                                    metavar="N")
    alibi: bool = option(False, "ALiBi: add slope_h (j - i) to the scores, BLOOM's slopes for the head count",
                         panel=MODEL)
    alibi_max_bias: float | None = option(None, "ALiBi with MPT's slopes for this alibi_bias_max (implies --alibi)",
                                          panel=MODEL, above=0, metavar="B")
    sinks: str | None = option(None, "per-head sink logits [H] (gpt-oss): a column that takes part in the softmax "
                               "and is dropped, so rows sum to less than 1", panel=MODEL, metavar="FILE")
    relative_bias_table: str | None = option(None, "T5's relative_attention_bias weight [buckets, heads]: add its "
                                             "bucketed relative position bias", panel=MODEL, metavar="FILE")
    relative_buckets: int | None = option(None, "T5 relative_attention_num_buckets (default: the table's rows)",
                                          panel=MODEL, min=2, metavar="N")
    relative_max_distance: int = option(128, "T5 relative_attention_max_distance", panel=MODEL, min=2, metavar="N")
    relative_bidirectional: bool = option(True, "T5 buckets for both directions (encoder) or past keys only "
                                          "(decoder)", panel=MODEL,
                                          flag="--relative-bidirectional/--relative-causal")

"""``--hf-config``: what a model's ``config.json`` says about the attention of one layer, as the values
of attnviz's own options (``CaptureOptions``, ``--scale``, ``--causal``), so that a config and the
explicit options give the same numbers by construction. The standard library and NumPy only: no
transformers needed; configs saved by transformers 4 (``rope_theta``, ``rope_scaling``, ``rotary_pct``)
and 5 (``rope_parameters``, per layer type) are both read.

Per family (``model_type``) the rules transformers' modeling code follows:

* the scale: ``head_dim^-0.5``; Gemma 2/3 ``query_pre_attn_scalar^-0.5``; GPT-2 ``scale_attn_weights``
  and ``scale_attn_by_inverse_layer_idx``; MPT ``attn_config.softmax_scale``; Granite
  ``attention_multiplier``; T5 1;
* the layer's type: ``layer_types[N]``, or the family's default pattern (Gemma 2 and gpt-oss alternate
  sliding/full, Gemma 3 five sliding then one full, Qwen sliding from ``max_window_layers`` when
  ``use_sliding_window``, Mistral/Mixtral/Phi-3/Starcoder2 sliding everywhere when ``sliding_window``
  is set, Llama 4 chunked on RoPE layers and full on NoPE layers, ModernBERT local except every
  ``global_attn_every_n_layers``-th);
* RoPE: theta and scaling (per layer type where the config has them: Gemma 3, ModernBERT), partial
  rotary (``partial_rotary_factor``, ``rotary_pct``, ``rotary_dim``), the pretraining length of llama3, YaRN and
  LongRoPE (in the rope object; Phi-3's ``original_max_position_embeddings`` beside it, which wins, as transformers
  reads it), the style (interleaved for GPT-J,
  CodeGen, Cohere and Llama 4, half otherwise); none on NoPE layers;
* ALiBi: BLOOM; MPT with ``alibi_bias_max``; Falcon with ``alibi`` (its bias rounded to bfloat16 and
  scaled with the scores, as Falcon does);
* causal for decoders (and encoder-decoder decoders), not for encoders; T5's relative position bias
  (the table from ``--relative-bias-table``), gpt-oss's sinks (from ``--sinks``), Llama 4's attention
  temperature on NoPE layers;
* the head counts, checked against the arrays.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from attnviz.errors import InputError, ShapeError, UsageError
from attnviz.run_options import CaptureOptions
from attnviz.storage import Place

#: decoder-only families with rotary embeddings (half style unless in INTERLEAVED)
ROPE_DECODERS = ("llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "gemma", "gemma2",
                 "gemma3_text", "phi", "phi3", "olmo", "olmo2", "olmo3", "gpt_oss", "starcoder2", "cohere", "cohere2",
                 "granite", "stablelm", "persimmon", "gpt_neox", "falcon", "gptj", "codegen", "llama4_text",
                 "ministral", "smollm3", "helium", "glm", "deepseek_v3")
INTERLEAVED = ("gptj", "codegen", "cohere", "cohere2", "llama4_text")  # and DeepSeek V3 with rope_interleave
OTHER_DECODERS = ("gpt2", "bloom", "mpt", "gpt_bigcode", "opt")
ENCODERS = ("bert", "roberta", "xlm-roberta", "distilbert", "vit", "deit", "dinov2", "dinov2_with_registers",
            "modernbert", "electra", "camembert")
ENCODER_DECODERS = ("t5", "mt5", "bart", "mbart", "whisper", "marian", "pegasus")
KNOWN = ROPE_DECODERS + OTHER_DECODERS + ENCODERS + ENCODER_DECODERS
#: families whose config keeps ``original_max_position_embeddings`` beside the rope object (transformers 4's
#: Phi-3 form; transformers 5 still reads it there first), with transformers' default
ORIGINAL_AT_TOP = {"phi3": 4096}
#: composite configs whose text model holds the attention
COMPOSITE = {"llama4": "llama4_text", "gemma3": "gemma3_text"}


@dataclass
class ConfigReading:
    """A config applied to one layer: the options it gives, and what the pipeline takes besides."""

    options: CaptureOptions
    scale: float | None = None
    causal: bool = False
    bidirectional_band: int | None = None
    #: Llama 4's attention temperature on NoPE layers: (floor_scale, attn_scale)
    query_temperature: tuple[float, float] | None = None
    falcon_alibi: bool = False  # Falcon's ALiBi: per key, rounded to bfloat16, scaled with the scores
    #: Llama 4's QK-norm after RoPE (an L2 norm without weights, this epsilon): applied after the rotation
    qk_norm_after_rope: float | None = None
    described: dict[str, Any] = field(default_factory=dict)


def _first(cfg: Mapping[str, Any], *names: str) -> Any:
    for name in names:
        if cfg.get(name) is not None:
            return cfg[name]
    return None


def read_json_config(spec: str, paths: list[Place]) -> tuple[dict[str, Any], str]:
    """The config object of ``spec`` (a ``config.json`` or the folder holding it; a URL of either: one that
    does not end in ``.json`` is a folder) and its name."""
    from attnviz import storage
    from attnviz.io import MEMORY, memory_value
    from attnviz.jsontext import loads_json

    if spec.startswith(MEMORY):  # a config dict handed over in memory (the Python API)
        value = memory_value(spec)
        return dict(value), spec[len(MEMORY):]
    path = storage.place(spec) if not storage.is_url(spec) or spec.lower().endswith(".json") \
        else storage.place(storage.join(spec, "config.json"))
    if isinstance(path, Path) and path.is_dir():
        path = path / "config.json"
        if not path.exists():
            raise UsageError(f"--hf-config {spec}: the folder holds no config.json.")
    source = str(path)
    text = storage.read_text(path, source)
    paths.append(path)
    try:
        value = loads_json(text)
    except ValueError as exc:
        raise InputError(f"{source}: not JSON ({exc}).") from None
    if not isinstance(value, dict):
        raise InputError(f"{source}: a config.json holds a JSON object.")
    return value, source


def _layer_type(kind: str, cfg: Mapping[str, Any], layer: int) -> str:
    types = cfg.get("layer_types")
    if isinstance(types, list) and types:
        return str(types[layer])
    window = cfg.get("sliding_window")
    if kind in ("gemma2", "gpt_oss"):
        return "sliding_attention" if (layer + 1) % 2 else "full_attention"
    if kind == "gemma3_text":
        pattern = int(cfg.get("sliding_window_pattern") or cfg.get("_sliding_window_pattern") or 6)
        return "sliding_attention" if (layer + 1) % pattern else "full_attention"
    if kind in ("qwen2", "qwen2_moe", "qwen3", "qwen3_moe"):
        use = cfg.get("use_sliding_window", False) and window is not None
        return "sliding_attention" if use and layer >= int(cfg.get("max_window_layers", 28)) else "full_attention"
    if kind in ("mistral", "mixtral", "phi3", "starcoder2", "ministral"):
        return "sliding_attention" if window is not None else "full_attention"
    if kind == "llama4_text":
        return "chunked_attention" if _uses_rope(kind, cfg, layer) else "full_attention"
    if kind == "modernbert":
        every = int(cfg.get("global_attn_every_n_layers", 3))
        return "sliding_attention" if layer % every else "full_attention"
    if kind == "cohere2":
        pattern = int(cfg.get("sliding_window_pattern") or 4)
        return "sliding_attention" if (layer + 1) % pattern else "full_attention"
    return "full_attention"


def _uses_rope(kind: str, cfg: Mapping[str, Any], layer: int) -> bool:
    if kind == "llama4_text":
        flags = cfg.get("no_rope_layers")
        if not flags:
            interval = int(cfg.get("no_rope_layer_interval", 4))
            return (layer + 1) % interval != 0
        return bool(flags[layer])
    if kind == "falcon":
        return not cfg.get("alibi", False)
    return kind in ROPE_DECODERS or kind == "modernbert"


def _rope_object(kind: str, cfg: Mapping[str, Any], layer_type: str) -> dict[str, Any]:
    """The layer's rope object with ``rope_theta`` (and the partial factor when the config has one), each
    field read where transformers 4 or 5 puts it, as transformers' ``standardize_rope_params`` does."""
    params = None if cfg.get("rope_scaling") else cfg.get("rope_parameters")  # transformers: rope_scaling first
    layered = params.get(layer_type) if isinstance(params, dict) else None
    nested = isinstance(layered, dict)  # one rope object per layer type
    if isinstance(layered, dict):
        rope = dict(layered)
    elif isinstance(params, dict) and ("rope_type" in params or "rope_theta" in params or "type" in params):
        rope = dict(params)
    else:
        rope = dict(cfg.get("rope_scaling") or {})
        if kind == "gemma3_text" and layer_type == "sliding_attention":
            rope = {"rope_type": "default", "rope_theta": cfg.get("rope_local_base_freq", 10000.0)}
        elif kind == "modernbert":
            local = layer_type == "sliding_attention"
            rope["rope_theta"] = cfg.get("local_rope_theta" if local else "global_rope_theta",
                                         10000.0 if local else 160000.0)
    if rope.get("rope_theta") is None:
        rope["rope_theta"] = _first(cfg, "rope_theta", "rotary_emb_base", "rope_embedding_base") or \
            (1e6 if kind == "gemma3_text" and layer_type != "sliding_attention" else 10000.0)
    if rope.get("partial_rotary_factor") is None:
        partial = _first(cfg, "partial_rotary_factor", "rotary_pct")
        if partial is not None and float(partial) != 1.0:
            rope["partial_rotary_factor"] = float(partial)
    rope.setdefault("rope_type", rope.pop("type", "default"))
    rope.pop("type", None)
    if rope["rope_type"] in ("llama3", "yarn", "longrope"):  # the pretraining length
        if kind in ORIGINAL_AT_TOP and not nested:  # Phi-3's own field, beside the rope object, wins
            rope["original_max_position_embeddings"] = int(cfg.get("original_max_position_embeddings")
                                                           or ORIGINAL_AT_TOP[kind])
        elif rope.get("original_max_position_embeddings") is None and cfg.get("max_position_embeddings"):
            rope["original_max_position_embeddings"] = int(cfg["max_position_embeddings"])
    return rope


def _heads(kind: str, cfg: Mapping[str, Any], attention: str | None) -> tuple[int | None, int | None, int | None]:
    """(query heads, key/value heads, head size) the config gives."""
    if kind in ("bart", "mbart", "whisper", "marian", "pegasus"):
        heads = _first(cfg, "encoder_attention_heads" if attention == "encoder" else "decoder_attention_heads")
    elif kind == "mpt":
        heads = cfg.get("n_heads")
    else:
        heads = _first(cfg, "num_attention_heads", "n_head", "num_heads", "n_heads")
    hidden = _first(cfg, "hidden_size", "n_embd", "d_model")
    head_dim = _first(cfg, "head_dim", "d_kv")
    if kind == "deepseek_v3":  # q and k: the part without position, then the rotary part
        head_dim = int(cfg.get("qk_nope_head_dim", 128)) + int(cfg.get("qk_rope_head_dim", 64))
    if head_dim is None and heads and hidden:
        head_dim = int(hidden) // int(heads)
    kv = _first(cfg, "num_key_value_heads", "num_kv_heads") if kind != "falcon" else None
    if kind == "falcon":
        kv = cfg.get("num_kv_heads") if cfg.get("new_decoder_architecture") else \
            1 if cfg.get("multi_query", True) else heads
    if kind == "gpt_bigcode" and cfg.get("multi_query", True):
        kv = 1
    return (None if heads is None else int(heads), None if kv is None else int(kv),
            None if head_dim is None else int(head_dim))


def _scale(kind: str, cfg: Mapping[str, Any], layer: int, head_dim: int) -> float:
    if kind in ("gemma2", "gemma3_text") and cfg.get("query_pre_attn_scalar") is not None:
        return float(cfg["query_pre_attn_scalar"]) ** -0.5
    if kind == "gpt2":
        scale = head_dim ** -0.5 if cfg.get("scale_attn_weights", True) else 1.0
        return scale / float(layer + 1) if cfg.get("scale_attn_by_inverse_layer_idx", False) else scale
    if kind == "mpt":
        given = (cfg.get("attn_config") or {}).get("softmax_scale")
        return float(given) if given is not None else 1 / math.sqrt(int(cfg["d_model"]) / int(cfg["n_heads"]))
    if kind == "granite" and cfg.get("attention_multiplier") is not None:
        return float(cfg["attention_multiplier"])
    if kind in ("t5", "mt5"):
        return 1.0
    if kind == "deepseek_v3":  # yarn_apply_mscale
        rope = _rope_object(kind, cfg, "full_attention")
        scale = head_dim ** -0.5
        if rope.get("rope_type", "default") != "default" and rope.get("mscale_all_dim"):
            factor = float(rope["factor"])
            mscale = 1.0 if factor <= 1 else 0.1 * float(rope["mscale_all_dim"]) * math.log(factor) + 1.0
            scale = scale * mscale * mscale
        return scale
    return head_dim ** -0.5


def _layers(kind: str, cfg: Mapping[str, Any], attention: str | None) -> int | None:
    if kind in ENCODER_DECODERS:
        names = ("num_layers", "encoder_layers") if attention == "encoder" else \
            ("num_decoder_layers", "decoder_layers", "num_layers")
        return _first(cfg, *names)
    return _first(cfg, "num_hidden_layers", "n_layer", "n_layers", "num_layers")


def _unknown(kind: str, cfg: Mapping[str, Any], source: str) -> UsageError:
    heads, kv, head_dim = _heads(kind, cfg, None)
    read = {"heads": heads, "kv heads": kv, "head_dim": head_dim,
            "rope_theta": _first(cfg, "rope_theta", "rotary_emb_base"),
            "rope_scaling": "given" if cfg.get("rope_scaling") or cfg.get("rope_parameters") else None,
            "sliding_window": cfg.get("sliding_window"), "softcap": cfg.get("attn_logit_softcapping")}
    found = ", ".join(f"{k} {v}" for k, v in read.items() if v is not None) or "nothing about attention"
    return UsageError(f"{source}: model type {kind!r} is not one attnviz knows (it reads {found}; it cannot tell "
                      "the scale, causality, positions or windows); give them as options instead: --scale, --causal, "
                      "--rope --rope-theta --rope-scaling --rope-dim --rope-style, --sliding-window, --chunk-size, "
                      "--softcap, --alibi, --sinks, --relative-bias-table.")


def _model_config(spec: str, paths: list[Place]) -> tuple[dict[str, Any], str, str]:
    """The config of the model that holds the attention (a composite's text model), its family and its file's
    name; a family attnviz does not know is an error saying what the config holds."""
    cfg, source = read_json_config(spec, paths)
    kind = str(cfg.get("model_type", ""))
    if kind in COMPOSITE and isinstance(cfg.get("text_config"), dict):
        cfg = {**cfg["text_config"]}
        kind = str(cfg.get("model_type") or COMPOSITE[kind])
    if kind not in KNOWN:
        raise _unknown(kind, cfg, source)
    return cfg, kind, source


def _checked_heads(kind: str, cfg: Mapping[str, Any], attention: str | None, source: str, q_heads: int | None,
                   kv_heads: int | None, head_dim: int) -> tuple[int, int | None, int]:
    """(query heads, key/value heads, head size) the config gives, checked against the arrays' axes."""
    heads, kv, size = _heads(kind, cfg, attention)
    if heads is None or size is None:
        raise InputError(f"{source}: no head count or head size ({kind}); give --scale and the other options "
                         "instead.")
    if q_heads is not None and q_heads != heads:
        raise ShapeError(f"{source}: {kind} has {heads} query heads, but Q has {q_heads} (axis -3 after --layout).")
    if kv_heads is not None and kv is not None and kv_heads not in (kv, heads):
        raise ShapeError(f"{source}: {kind} has {kv} key/value heads, but K has {kv_heads} (axis -3 after --layout).")
    if head_dim != size:
        raise ShapeError(f"{source}: {kind} has heads of {size}, but Q's last axis is {head_dim}.")
    return heads, kv, size


def _chosen_layer(kind: str, cfg: Mapping[str, Any], layers: int | None, layer: int | None, source: str) -> int:
    """The layer the q/k/v come from: ``--model-layer``, or any layer (0) when all of them are alike."""
    if layer is not None:
        return layer
    varies = {(_layer_type(kind, cfg, i), _uses_rope(kind, cfg, i)) for i in range(int(layers or 1))}
    if kind == "gpt2" and cfg.get("scale_attn_by_inverse_layer_idx"):
        varies.add(("scale", True))
    if len(varies) > 1:
        raise UsageError(f"{source}: the layers of this {kind} differ (sliding, chunked, full or NoPE); say which "
                         "layer the q/k/v come from with --model-layer N.")
    return 0


def _rope_values(kind: str, cfg: Mapping[str, Any], layer_type: str) -> dict[str, Any]:
    """The RoPE options of a layer that rotates q and k: theta, the dimensions rotated and which part, the style,
    and the scaling as JSON (left out when it is plain, all dimensions rotated)."""
    rope = _rope_object(kind, cfg, layer_type)
    values: dict[str, Any] = {"rope": True, "rope_theta": float(rope.pop("rope_theta"))}
    if kind in ("gptj", "codegen") and cfg.get("rotary_dim"):
        values["rope_dim"] = int(cfg["rotary_dim"])
        rope.pop("partial_rotary_factor", None)
    if kind == "deepseek_v3":
        values["rope_dim"], values["rope_part"] = int(cfg.get("qk_rope_head_dim", 64)), "last"
        rope.pop("partial_rotary_factor", None)
    if cfg.get("max_position_embeddings") is not None:
        rope["max_position_embeddings"] = int(cfg["max_position_embeddings"])
    interleaved = kind in INTERLEAVED or (kind == "deepseek_v3" and cfg.get("rope_interleave", True))
    values["rope_style"] = "interleaved" if interleaved else "half"
    if rope.get("rope_type") != "default" or rope.get("partial_rotary_factor") is not None:
        values["rope_scaling"] = json.dumps(rope, sort_keys=True)
    return values


def _window_values(kind: str, cfg: Mapping[str, Any], layer_type: str,
                   causal: bool) -> tuple[dict[str, Any], int | None]:
    """A sliding or chunked layer's window as options (a sliding window for causal layers only), and ModernBERT's
    local band (half its window on each side) or None."""
    values: dict[str, Any] = {}
    band = None
    if layer_type == "sliding_attention" and cfg.get("sliding_window") is not None:
        if kind == "modernbert":
            band = int(cfg["local_attention"]) // 2 if cfg.get("local_attention") else int(cfg["sliding_window"])
        elif causal:
            values["sliding_window"] = int(cfg["sliding_window"])
    elif kind == "modernbert" and layer_type == "sliding_attention":
        band = int(cfg.get("local_attention", 128)) // 2
    if layer_type == "chunked_attention" and cfg.get("attention_chunk_size") is not None:
        values["chunk_size"] = int(cfg["attention_chunk_size"])
    return values, band


def _bias_values(kind: str, cfg: Mapping[str, Any], attention: str | None, opts: CaptureOptions,
                 source: str) -> tuple[dict[str, Any], list[str]]:
    """Position biases as options (ALiBi: BLOOM, MPT, Falcon; T5's relative buckets), with the notes where
    attnviz follows transformers rather than the config. T5's bias table and gpt-oss's sinks are arrays of the
    model, not of its config: a run without the option that names their file is refused."""
    values: dict[str, Any] = {}
    notes: list[str] = []
    if kind == "bloom":
        values["alibi"] = True
    if kind == "mpt" and (cfg.get("attn_config") or {}).get("alibi", True):
        values["alibi_max_bias"] = 8.0  # transformers' MptModel builds its ALiBi with the default 8 always
        given_max = (cfg.get("attn_config") or {}).get("alibi_bias_max", 8)
        if float(given_max) != 8.0:
            notes.append(f"alibi_bias_max 8 as transformers' MPT (the config says {given_max:g}; "
                         "--alibi-max-bias overrides)")
    if kind == "falcon" and cfg.get("alibi"):
        values["alibi"] = True
    if kind in ("t5", "mt5") and attention != "cross":
        values["relative_buckets"] = int(cfg.get("relative_attention_num_buckets", 32))
        values["relative_max_distance"] = int(cfg.get("relative_attention_max_distance", 128))
        values["relative_bidirectional"] = attention == "encoder"
        if opts.relative_bias_table is None:
            raise UsageError(f"{source}: T5 adds a relative position bias to every self-attention layer; pass the "
                             f"{attention}'s table, {attention}.block.0.layer.0.SelfAttention.relative_attention_bias"
                             ".weight [buckets, heads], with --relative-bias-table FILE.")
    if kind == "gpt_oss" and opts.sinks is None:
        raise UsageError(f"{source}: gpt-oss attention has learned sinks; pass the layer's self_attn.sinks [heads] "
                         "with --sinks FILE.")
    return values, notes


def _given_win(opts: CaptureOptions, values: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """The config's values of the options not given explicitly (an option at its default is not given), and the
    options given that win over the config's (as their flags are spelled, without ``--``)."""
    defaults = CaptureOptions()
    chosen: dict[str, Any] = {}
    overridden = []
    for name, value in values.items():
        given = getattr(opts, name)
        if given != getattr(defaults, name):
            overridden.append(name.replace("_", "-"))
            continue
        chosen[name] = value
    return chosen, overridden


def _summary_parts(reading: ConfigReading, chosen: dict[str, Any], applied: dict[str, Any], nope: bool,
                   notes: list[str], overridden: list[str]) -> list[str]:
    """What the one-line summary says the config gave: the scale, causality, each position encoding, window and
    bias applied (``nope``: a NoPE layer of a RoPE family), the notes, and the options given that win."""
    parts = [f"scale {reading.scale:.6g}", "causal" if reading.causal else "not causal"]
    if chosen.get("rope"):
        scaling = applied.get("rope_scaling", {})
        parts.append(f"RoPE theta {chosen['rope_theta']:g} {chosen.get('rope_style', 'half')}"
                     + (f" {scaling.get('rope_type')}" if scaling.get("rope_type", "default") != "default" else "")
                     + (f" partial {scaling['partial_rotary_factor']:g}" if scaling.get("partial_rotary_factor")
                        else "") + (f" dims {chosen['rope_dim']}" if chosen.get("rope_dim") else "")
                     + (" (the last)" if chosen.get("rope_part") == "last" else ""))
    elif nope:
        parts.append("no RoPE (NoPE layer)")
    for name, label in (("softcap", "softcap"), ("sliding_window", "sliding window"), ("chunk_size", "chunks of")):
        if name in chosen:
            parts.append(f"{label} {chosen[name]:g}")
    if reading.bidirectional_band:
        parts.append(f"local window ±{reading.bidirectional_band}")
    if chosen.get("alibi") or "alibi_max_bias" in chosen:
        bias = f" max bias {chosen['alibi_max_bias']:g}" if "alibi_max_bias" in chosen else ""
        parts.append(("Falcon's ALiBi" if reading.falcon_alibi else "ALiBi") + bias)
    if "relative_buckets" in chosen:
        parts.append(f"T5 bias {chosen['relative_buckets']} buckets")
    if reading.query_temperature:
        parts.append("attention temperature")
    if reading.qk_norm_after_rope is not None:
        parts.append("L2 QK-norm after RoPE")
    parts.extend(notes)
    if overridden:
        parts.append(f"options given win: {', '.join('--' + o for o in overridden)}")
    return parts


def apply_config(opts: CaptureOptions, q_heads: int | None, kv_heads: int | None, head_dim: int,
                 paths: list[Place]) -> ConfigReading:
    """Read ``opts.hf_config`` for layer ``opts.model_layer`` and merge it with ``opts``: an option
    given explicitly (not its default) wins over the config. In steps: the model's config, the layer and its
    heads checked against the arrays, the values of the options it gives (RoPE, softcap, windows, biases), those
    of options given explicitly dropped, and what was read described (``ConfigReading.described``)."""
    assert opts.hf_config is not None
    cfg, kind, source = _model_config(opts.hf_config, paths)
    attention = opts.model_attention
    if kind in ENCODER_DECODERS:
        if attention is None:
            raise UsageError(f"{source}: {kind} has encoder and decoder self-attention and cross-attention; say "
                             "which with --model-attention encoder|decoder|cross.")
    elif attention is not None:
        raise UsageError(f"--model-attention: {kind} has one kind of attention; leave it out.")
    layers = _layers(kind, cfg, attention)
    if opts.model_layer is not None and layers is not None and opts.model_layer >= int(layers):
        raise UsageError(f"--model-layer {opts.model_layer}: {source} has {layers} layers (0..{int(layers) - 1}).")
    heads, kv, size = _checked_heads(kind, cfg, attention, source, q_heads, kv_heads, head_dim)
    layer = _chosen_layer(kind, cfg, layers, opts.model_layer, source)

    self_attention = attention != "cross"
    layer_type = _layer_type(kind, cfg, layer) if self_attention else "full_attention"
    reading = ConfigReading(opts)
    reading.scale = _scale(kind, cfg, layer, size)
    decoder = kind in ROPE_DECODERS or kind in OTHER_DECODERS or attention == "decoder"
    reading.causal = decoder and not cfg.get("use_bidirectional_attention", False) and self_attention
    rotates = self_attention and _uses_rope(kind, cfg, layer)
    values = _rope_values(kind, cfg, layer_type) if rotates else {}
    softcap = cfg.get("attn_logit_softcapping")
    if softcap is not None and self_attention:
        values["softcap"] = float(softcap)
    windows, reading.bidirectional_band = _window_values(kind, cfg, layer_type, reading.causal)
    biases, notes = _bias_values(kind, cfg, attention, opts, source)
    values.update({**windows, **biases})
    reading.falcon_alibi = kind == "falcon" and bool(cfg.get("alibi"))
    if kind == "llama4_text" and cfg.get("attn_temperature_tuning", True) and not _uses_rope(kind, cfg, layer):
        reading.query_temperature = (float(cfg.get("floor_scale", 8192)), float(cfg.get("attn_scale", 0.1)))
    if kind == "llama4_text" and cfg.get("use_qk_norm", True) and _uses_rope(kind, cfg, layer):
        reading.qk_norm_after_rope = float(cfg.get("rms_norm_eps", 1e-5))
    if kind in ("qwen3", "qwen3_moe", "gemma3_text", "olmo2", "olmo3") or \
            (kind in ("phi", "persimmon", "stablelm") and cfg.get("qk_layernorm")):
        notes.append("q/k after the model's QK-norm")

    chosen, overridden = _given_win(opts, values)
    reading.options = dataclasses.replace(opts, **chosen)
    applied = {k: (json.loads(v) if k == "rope_scaling" else v) for k, v in chosen.items()}
    temperature = reading.query_temperature
    reading.described = {"file": source, "model_type": kind, "layer": layer, "layer_type": layer_type,
                         **({"attention": attention} if attention else {}), "heads": heads,
                         "kv_heads": kv if kv is not None else heads, "head_dim": size, "scale": reading.scale,
                         "causal": reading.causal, "applied": applied,
                         **({"local_window": reading.bidirectional_band} if reading.bidirectional_band else {}),
                         **({"falcon_alibi": True} if reading.falcon_alibi else {}),
                         **({"qk_norm_after_rope": {"eps": reading.qk_norm_after_rope}}
                            if reading.qk_norm_after_rope is not None else {}),
                         **({"query_temperature": {"floor_scale": temperature[0], "attn_scale": temperature[1]}}
                            if temperature else {}),
                         **({"notes": notes} if notes else {}), **({"overridden_by": overridden} if overridden else {})}
    nope = self_attention and kind in ROPE_DECODERS and not _uses_rope(kind, cfg, layer)
    parts = _summary_parts(reading, chosen, applied, nope, notes, overridden)
    shown = source if source.startswith("/dev/fd/") else Path(source).name  # <(...): the pipe's whole name
    reading.described["summary"] = (f"{shown}: {kind} layer {layer} ({layer_type.replace('_', ' ')}"
                                    f"{', ' + attention if attention else ''}): " + ", ".join(parts))
    return reading

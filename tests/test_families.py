"""The "Model families" table (docs/model-families.md), row by row (issue 19): a small randomly initialised
model of each family is built from its config (eager attention, a padded batch of two), hooked on the modules the row
names, its hook outputs turned into q, k and v with the row's expression, and attnviz run with
``--hf-config`` and the row's options; its weights equal the model's own ``output_attentions`` on the real
rows and keys to 1e-5. Each row also runs once with the family's special feature left out (the same
options spelled out without it) and must then differ. Skips cleanly without torch and transformers."""

from __future__ import annotations

import json
import re
import shlex

import numpy as np
import pytest
from typer.testing import CliRunner

from attnviz.cli import app
from tests.conftest import LazyModule
from tests.docs_text import page

torch = LazyModule("torch")  # imported when a test first uses it: not while every worker collects
transformers = LazyModule("transformers")

runner = CliRunner()
B, L, PAD, LAYER = 2, 10, 3, 1


def table() -> dict[str, dict[str, object]]:
    """{row key: {family, hooks, split, options}} from the README's table; the key is the model type, and
    the attention of an encoder-decoder model after a colon (``bart:cross``)."""
    section = page("model-families.md")
    rows = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 5 or cells[1] in ("`model_type`", "---"):
            continue
        family, kind, hooks, split, options = cells
        attention = re.search(r"--model-attention (\w+)", options)
        key = kind + (f":{attention.group(1)}" if attention else "")
        rows[key] = {"family": family, "hooks": re.findall(r"`([^`]+)`", hooks),
                     "split": re.findall(r"`([^`]+)`", split)[0],
                     "options": shlex.split(re.findall(r"`([^`]+)`", options)[0]) if "`" in options else []}
    return rows


ROWS = table()

DECODER = dict(vocab_size=50, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
               intermediate_size=48, max_position_embeddings=64)

def T5():
    return transformers.T5Config(vocab_size=50, d_model=32, d_kv=8, d_ff=48, num_layers=2, num_heads=4,
                                 relative_attention_num_buckets=8, relative_attention_max_distance=16,
                                 decoder_start_token_id=0)


def BART():
    return transformers.BartConfig(vocab_size=50, d_model=32, encoder_layers=2, decoder_layers=2,
                                   encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=48,
                                   decoder_ffn_dim=48, max_position_embeddings=64)


def WHISPER():
    return transformers.WhisperConfig(vocab_size=60, num_mel_bins=8, encoder_layers=2, decoder_layers=2,
                                      encoder_attention_heads=4, decoder_attention_heads=4, d_model=32,
                                      encoder_ffn_dim=48, decoder_ffn_dim=48, max_source_positions=8,
                                      max_target_positions=16, pad_token_id=0, decoder_start_token_id=1)


#: row key -> (config, the options that give everything but the family's special feature[, layers])
FAMILIES = {
    "llama": (lambda: transformers.LlamaConfig(**DECODER, num_key_value_heads=2, rope_parameters={
        "rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
        "high_freq_factor": 4.0, "original_max_position_embeddings": 16}),
        ["--rope", "--rope-theta", "500000", "--causal"]),
    "mistral": (lambda: transformers.MistralConfig(**DECODER, num_key_value_heads=2, sliding_window=4),
                ["--rope", "--causal"]),
    "mixtral": (lambda: transformers.MixtralConfig(**DECODER, num_key_value_heads=2, num_local_experts=2,
                                                   sliding_window=None), ["--causal"]),
    "qwen2": (lambda: transformers.Qwen2Config(**DECODER, num_key_value_heads=2, rope_parameters={
        "rope_type": "default", "rope_theta": 1000000.0}), ["--rope", "--causal"]),
    "qwen3": (lambda: transformers.Qwen3Config(**DECODER, num_key_value_heads=2, head_dim=8), ["--causal"]),
    "gemma": (lambda: transformers.GemmaConfig(**DECODER, num_key_value_heads=1, head_dim=8), ["--causal"]),
    "gemma2": (lambda: transformers.Gemma2Config(**DECODER, num_key_value_heads=2, head_dim=8,
                                                 query_pre_attn_scalar=16, attn_logit_softcapping=0.5,
                                                 initializer_range=0.5,
                                                 sliding_window=4, layer_types=["sliding_attention"] * 2),
               ["--rope", "--causal", "--scale", "0.25", "--sliding-window", "4"]),
    "gemma3_text": (lambda: transformers.Gemma3TextConfig(**DECODER, num_key_value_heads=2, head_dim=8,
                                                         query_pre_attn_scalar=8, sliding_window=4,
                                                         layer_types=["full_attention", "sliding_attention"]),
                    ["--rope", "--rope-theta", "1000000", "--causal", "--sliding-window", "4", "--scale",
                     str(8 ** -0.5)]),  # the global base on a local layer
    "olmo2": (lambda: transformers.Olmo2Config(**DECODER), ["--causal"]),
    "phi": (lambda: transformers.PhiConfig(**DECODER, partial_rotary_factor=0.5), ["--rope", "--causal"]),
    "phi3": (lambda: transformers.Phi3Config(**DECODER, num_key_value_heads=2, original_max_position_embeddings=8,
                                             pad_token_id=0, partial_rotary_factor=0.5,  # as Phi-4-mini
                                             rope_parameters={"rope_type": "longrope", "rope_theta": 10000.0,
                                                              "short_factor": [1.0, 1.5],
                                                              "long_factor": [3.0, 5.0],
                                                              "original_max_position_embeddings": 8}),
             ["--rope", "--causal"]),
    "gpt_neox": (lambda: transformers.GPTNeoXConfig(**DECODER, rotary_pct=0.25), ["--rope", "--causal"]),
    "gptj": (lambda: transformers.GPTJConfig(vocab_size=50, n_embd=32, n_layer=2, n_head=4, rotary_dim=4,
                                             n_positions=64), ["--rope", "--rope-dim", "4", "--causal"]),
    "falcon": (lambda: transformers.FalconConfig(vocab_size=50, hidden_size=32, num_hidden_layers=2,
                                                 num_attention_heads=4, multi_query=True,
                                                 new_decoder_architecture=False), ["--causal"]),
    "gpt2": (lambda: transformers.GPT2Config(vocab_size=50, n_embd=32, n_layer=2, n_head=4, n_positions=64,
                                             scale_attn_by_inverse_layer_idx=True), ["--causal"]),
    "bloom": (lambda: transformers.BloomConfig(vocab_size=50, hidden_size=32, n_layer=2, n_head=4),
              ["--causal"]),
    "mpt": (lambda: transformers.MptConfig(vocab_size=50, d_model=48, n_layers=2, n_heads=6, max_seq_len=64,
                                           attn_config={"alibi_bias_max": 16}),  # transformers uses 8 anyway
            ["--causal"]),
    "gpt_oss": (lambda: transformers.GptOssConfig(**{**DECODER, "intermediate_size": 32}, num_key_value_heads=2,
                                                  head_dim=8, num_local_experts=2, num_experts_per_tok=1,
                                                  sliding_window=4, rope_parameters={
                                                      "rope_type": "yarn", "rope_theta": 150000.0, "factor": 8.0,
                                                      "original_max_position_embeddings": 8, "beta_fast": 32.0,
                                                      "beta_slow": 1.0, "truncate": False}),
                ["--rope", "--rope-theta", "150000", "--causal", "--sliding-window", "4"]),
    "llama4_text": (lambda: transformers.Llama4TextConfig(**{**DECODER, "num_hidden_layers": 4},
                                                          num_key_value_heads=2, head_dim=8, intermediate_size_mlp=48,
                                                          num_local_experts=2, attention_chunk_size=4, floor_scale=3,
                                                          attn_scale=0.5, pad_token_id=0),
                    ["--rope", "--rope-style", "interleaved", "--causal"], (1, 3)),
    "deepseek_v3": (lambda: transformers.DeepseekV3Config(
        **{**DECODER, "num_hidden_layers": 2}, num_key_value_heads=4, q_lora_rank=16, kv_lora_rank=8,
        qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=6, n_routed_experts=2, num_experts_per_tok=1,
        first_k_dense_replace=2, n_group=1, topk_group=1, rope_parameters={
            "rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 8,
            "mscale": 1.0, "mscale_all_dim": 1.0, "beta_fast": 32, "beta_slow": 1}),
        ["--rope", "--rope-dim", "4", "--rope-style", "interleaved", "--causal"]),
    "t5:encoder": (T5, ["--scale", "1"]),
    "t5:decoder": (T5, ["--scale", "1", "--causal"]),
    "t5:cross": (T5, None),
    "bart:encoder": (BART, None),
    "bart:decoder": (BART, None),
    "bart:cross": (BART, None),
    "whisper:encoder": (WHISPER, None),
    "whisper:decoder": (WHISPER, None),
    "whisper:cross": (WHISPER, None),
    "bert": (lambda: transformers.BertConfig(vocab_size=50, hidden_size=32, num_hidden_layers=2,
                                             num_attention_heads=4, intermediate_size=48), None),
    "modernbert": (lambda: transformers.ModernBertConfig(vocab_size=50, hidden_size=32, num_hidden_layers=2,
                                                         num_attention_heads=4, intermediate_size=48,
                                                         local_attention=4, global_attn_every_n_layers=2,
                                                         pad_token_id=0), ["--rope", "--rope-theta", "10000"]),
    "vit": (lambda: transformers.ViTConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                           intermediate_size=48, image_size=8, patch_size=2), None),
}
ENCODERS = ("bert", "modernbert", "vit")
SEQ2SEQ = ("t5", "bart", "whisper")
DECODER_LENGTH = 6
CASES = [(key, layer) for key, spec in FAMILIES.items() for layer in (spec[2] if len(spec) > 2 else (LAYER,))]


def test_every_row_of_the_table_has_a_test_and_back():
    assert set(ROWS) == set(FAMILIES)


def build(kind, config=None):
    torch.manual_seed(0)
    config = config or FAMILIES[kind][0]()
    config._attn_implementation = "eager"
    if kind.split(":")[0] in SEQ2SEQ or kind in ENCODERS:
        return transformers.AutoModel.from_config(config, attn_implementation="eager").eval()
    return transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager").eval()


def inputs(kind):
    """The model's inputs and the key padding mask of the row's attention (None: no padding)."""
    generator = torch.Generator().manual_seed(1)
    if kind == "vit":
        return {"pixel_values": torch.randn(B, 3, 8, 8, generator=generator)}, None
    family, _, attention = kind.partition(":")
    decoder_ids = torch.randint(3, 50, (B, DECODER_LENGTH), generator=generator)
    if family == "whisper":  # no padding: the encoder sees fixed-length features
        return {"input_features": torch.randn(B, 8, 16, generator=generator), "decoder_input_ids": decoder_ids}, None
    ids = torch.randint(3, 50, (B, L), generator=generator)
    mask = torch.ones(B, L, dtype=torch.long)
    if family in ENCODERS or family in SEQ2SEQ:
        mask[1, L - PAD:] = 0  # encoders: right padding
    else:
        mask[1, :PAD] = 0  # decoders: left padding, as generation uses
    batch = {"input_ids": ids, "attention_mask": mask}
    if family in SEQ2SEQ:
        batch["decoder_input_ids"] = decoder_ids
        if attention == "decoder":
            return batch, torch.ones(B, DECODER_LENGTH, dtype=torch.long)
    return batch, mask


def transformers4_form(saved):
    """A config saved by transformers 5 as transformers 4 wrote it, and many checkpoints still ship it: rope_theta
    and partial_rotary_factor (GPT-NeoX: rotary_emb_base, rotary_pct) at the top, the scaling in ``rope_scaling``
    with ``type``, Phi-3's original_max_position_embeddings at the top only, the per-layer bases under their own
    names (Gemma 3: rope_local_base_freq; ModernBERT: global_ and local_rope_theta). None: the model has no RoPE."""
    cfg = dict(saved)
    params = cfg.pop("rope_parameters", None)
    if not params:
        return None
    kind = cfg["model_type"]
    if "full_attention" in params:  # per layer type
        full, local = dict(params["full_attention"]), params["sliding_attention"]
        if kind == "modernbert":
            return {**cfg, "global_rope_theta": full["rope_theta"], "local_rope_theta": local["rope_theta"]}
        cfg.update(rope_theta=full.pop("rope_theta"), rope_local_base_freq=local["rope_theta"])
        params = full
    else:
        params = dict(params)
        cfg["rotary_emb_base" if kind == "gpt_neox" else "rope_theta"] = params.pop("rope_theta")
    partial = params.pop("partial_rotary_factor", None)
    if partial is not None:
        cfg["rotary_pct" if kind == "gpt_neox" else "partial_rotary_factor"] = partial
    rope_type = params.pop("rope_type")
    params.pop("type", None)
    if rope_type != "default":
        if kind == "phi3":
            cfg["original_max_position_embeddings"] = params.pop("original_max_position_embeddings")
        cfg["rope_scaling"] = {"type": rope_type, **params}
    return cfg


def untyped(params):
    """rope_parameters without the 4.x ``type`` key transformers keeps beside ``rope_type``."""
    if isinstance(params, dict):
        return {k: untyped(v) for k, v in params.items() if k != "type"}
    return params


def check_transformers4_form(model, folder, options, theirs, cells):
    """The 4.x form of the saved config: transformers reads it into the same model, and attnviz into the same
    weights (issue 34: Phi-3's LongRoPE read from it was 0.55 away on a sequence past the original length)."""
    form = transformers4_form(json.loads((folder / "model" / "config.json").read_text()))
    if form is None:
        return
    (folder / "model4").mkdir()
    (folder / "model4" / "config.json").write_text(json.dumps(form))
    read = transformers.AutoConfig.from_pretrained(folder / "model4")
    assert untyped(read.rope_parameters) == untyped(model.config.get_text_config().rope_parameters)
    r = runner.invoke(app, [*options[:options.index("--hf-config") + 1], "model4",
                            *options[options.index("--hf-config") + 2:]])
    assert r.exit_code == 0, r.stderr
    np.testing.assert_allclose(np.where(cells, np.load("ours.npy"), 0), np.where(cells, theirs, 0), atol=1e-5,
                               err_msg="the transformers-4 form of the config")


def reproduce(kind, layer, folder, config=None):
    """Run the row's recipe on a tiny model; returns (the common options, the model's weights, the real
    cells): ours.npy holds attnviz's weights with --hf-config and the row's options."""
    row = ROWS[kind]
    model = build(kind, config)
    model.config.save_pretrained(folder / "model")
    captured = {}
    for i, path in enumerate(row["hooks"]):
        module = model.get_submodule(path.format(N=layer))
        module.register_forward_hook(lambda m, args, out, i=i: captured.update({i: out[0] if isinstance(out, tuple)
                                                                                  else out}))
    batch, mask = inputs(kind)
    with torch.no_grad():
        out = model(**batch, output_attentions=True)
    attention = kind.partition(":")[2]
    text = model.config.get_text_config()
    captured = [captured[i] for i in range(len(row["hooks"]))]
    attentions = {"encoder": getattr(out, "encoder_attentions", None),
                  "decoder": getattr(out, "decoder_attentions", None),
                  "cross": getattr(out, "cross_attentions", None)}.get(attention) or out.attentions
    b, length = attentions[layer].shape[0], attentions[layer].shape[-2]
    h = text.num_attention_heads
    g = getattr(text, "num_key_value_heads", None) or h
    d = getattr(text, "head_dim", None) or text.hidden_size // h
    n, r = getattr(text, "qk_nope_head_dim", 0), getattr(text, "qk_rope_head_dim", 0)
    outs = [o.detach().float() for o in captured]
    names = {"outs": outs, "torch": torch, "B": b, "L": length, "H": h, "G": g, "d": d, "n": n, "r": r}
    split = row["split"]
    parts = [eval(split, {**names, "o": o}) for o in outs] if "outs" not in split else [eval(split, names)]
    q, k, v = parts if len(parts) == 3 else parts[0]
    for n, t in zip("qkv", (q, k, v)):
        np.save(f"{n}.npy", t.contiguous().numpy())
    common = ["scaled", "q.npy", "k.npy", "v.npy", "--layout", "batch,seq,head,d", "--save-weights", "ours.npy",
              "--quiet"]
    if mask is not None:
        np.save("padding.npy", mask.numpy())  # the keys' padding
        np.save("positions.npy", (mask.cumsum(-1) - 1).clamp(min=0).numpy())
        common += ["--key-padding-mask", "padding.npy"]
    if kind == "gpt_oss":
        np.save("sinks.npy", model.get_submodule(f"model.layers.{layer}.self_attn").sinks.detach().numpy())
    if kind in ("t5:encoder", "t5:decoder"):
        table = model.get_submodule(f"{attention}.block.0.layer.0.SelfAttention.relative_attention_bias").weight
        np.save("table.npy", table.detach().numpy())
    theirs = attentions[layer].float().numpy()
    keys = np.ones((b, theirs.shape[-1]), dtype=bool) if mask is None else mask.numpy().astype(bool)
    rows = keys if theirs.shape[-2] == theirs.shape[-1] and attention != "cross" else np.ones((b, length), bool)
    cells = rows[:, None, :, None] & keys[:, None, None, :]

    options = [*common, "--hf-config", "model", "--model-layer", str(layer), *row["options"]]
    r = runner.invoke(app, options)
    assert r.exit_code == 0, r.stderr
    ours = np.load("ours.npy")
    assert ours.shape == theirs.shape
    np.testing.assert_allclose(np.where(cells, ours, 0), np.where(cells, theirs, 0), atol=1e-5)
    check_transformers4_form(model, folder, options, theirs, cells)
    return common, theirs, cells


@pytest.mark.parametrize("kind,layer", CASES, ids=[f"{k}-{n}" for k, n in CASES])
def test_family_row_reproduces_the_model(kind, layer, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    common, theirs, cells = reproduce(kind, layer, tmp_path)
    row = ROWS[kind]
    off = FAMILIES[kind][1]
    if off is None:
        return  # nothing special to leave out
    extra = [o for o in row["options"] if o not in ("--model-attention", "encoder", "decoder", "cross")]
    if "--positions" in extra and "--rope" not in off:
        extra = [o for o in extra if o not in ("--positions", "positions.npy")]
    r = runner.invoke(app, [*common, *off, *extra])
    assert r.exit_code == 0, r.stderr
    without = np.load("ours.npy")
    assert np.abs(np.where(cells, without, 0) - np.where(cells, theirs, 0)).max() > 1e-4, \
        f"{kind}: the family's special feature made no difference"


ROPE_TYPES = {
    "linear": {"rope_type": "linear", "factor": 4.0},
    "dynamic": {"rope_type": "dynamic", "factor": 3.0},  # the sequence (10) is past max_position_embeddings (6)
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 4},
    "longrope": {"rope_type": "longrope", "short_factor": [1.0, 2.0, 3.0, 4.0], "long_factor": [2.0, 4.0, 8.0, 16.0],
                 "original_max_position_embeddings": 4},
    "llama3": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 8},
}


@pytest.mark.parametrize("name", list(ROPE_TYPES))
def test_every_rope_type_on_a_tiny_llama(name, tmp_path, monkeypatch):
    """The Llama row with each rope_type in the model's config: attnviz's frequencies are the model's."""
    monkeypatch.chdir(tmp_path)
    config = transformers.LlamaConfig(**{**DECODER, "max_position_embeddings": 6}, num_key_value_heads=2,
                                      rope_parameters={**ROPE_TYPES[name], "rope_theta": 10000.0})
    common, theirs, cells = reproduce("llama", LAYER, tmp_path, config)
    r = runner.invoke(app, [*common, "--rope", "--causal", "--positions", "positions.npy"])  # no scaling
    assert r.exit_code == 0, r.stderr
    assert np.abs(np.where(cells, np.load("ours.npy"), 0) - np.where(cells, theirs, 0)).max() > 1e-4


def test_falcon_with_alibi(tmp_path, monkeypatch):
    """A Falcon with ``alibi``: the bias of each key rounded to bfloat16 (slopes, then products) and scaled
    with the scores, once. transformers' eager Falcon adds that bias twice (in the scores and again in
    the causal mask it builds), so its ``output_attentions`` is not what the model computes with SDPA;
    the reference here is the SDPA run's attention output (the input of ``dense``), against attnviz's
    ``--save-output``."""
    monkeypatch.chdir(tmp_path)
    config = transformers.FalconConfig(vocab_size=50, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                       multi_query=True, new_decoder_architecture=False, alibi=True)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="sdpa").eval()
    model.config.save_pretrained("model")
    captured = {}
    attention = model.get_submodule(f"transformer.h.{LAYER}.self_attention")
    attention.query_key_value.register_forward_hook(lambda m, a, out: captured.update(qkv=out))
    attention.dense.register_forward_pre_hook(lambda m, a: captured.update(merged=a[0]))
    batch, mask = inputs("falcon")
    with torch.no_grad():
        model(**batch)
    row = ROWS["falcon"]
    q, k, v = eval(row["split"], {"o": captured["qkv"].float(), "B": B, "L": L, "H": 4, "G": 1, "d": 8})
    for n, t in zip("qkv", (q, k, v)):
        np.save(f"{n}.npy", t.contiguous().numpy())
    np.save("padding.npy", mask.numpy())
    r = runner.invoke(app, ["scaled", "q.npy", "k.npy", "v.npy", "--layout", "batch,seq,head,d", "--hf-config",
                            "model", "--model-layer", str(LAYER), "--key-padding-mask", "padding.npy",
                            "--save-output", "out.npy", "--quiet"])
    assert r.exit_code == 0, r.stderr
    ours = np.load("out.npy").transpose(0, 2, 1, 3).reshape(B, L, 32)  # [B, H, L, d] -> [B, L, H * d]
    real = mask.numpy().astype(bool)
    np.testing.assert_allclose(ours[real], captured["merged"].numpy()[real], atol=1e-5)
    r = runner.invoke(app, ["scaled", "q.npy", "k.npy", "v.npy", "--layout", "batch,seq,head,d", "--causal",
                            "--alibi", "--key-padding-mask", "padding.npy", "--save-output", "out.npy", "--quiet"])
    assert r.exit_code == 0, r.stderr  # BLOOM's form (unscaled, not rounded) is not Falcon's
    without = np.load("out.npy").transpose(0, 2, 1, 3).reshape(B, L, 32)
    assert np.abs(without[real] - captured["merged"].numpy()[real]).max() > 1e-4

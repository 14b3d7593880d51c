"""Model attention parts (issue 19) against independent references: every RoPE type, ALiBi slopes, T5
buckets and bfloat16 rounding against transformers' own functions; softcap, sliding windows, chunks,
sinks, ALiBi and T5 bias through the command line against NumPy transcriptions of transformers' eager
attention; ``--hf-config`` and the explicit options giving identical weights; bad configs and options
as one clear line."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from attnviz.cli import app
from attnviz.positional import alibi_slopes, bfloat16_round, rope_frequencies, t5_buckets

runner = CliRunner()

ROPE_CASES = {
    "default": {"rope_type": "default"},
    "linear": {"rope_type": "linear", "factor": 4.0},
    "dynamic": {"rope_type": "dynamic", "factor": 2.0},
    "yarn": {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 64, "beta_fast": 32,
             "beta_slow": 1},
    "yarn-mscale": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32, "mscale": 0.707,
                    "mscale_all_dim": 0.707, "truncate": False},
    "longrope": {"rope_type": "longrope", "short_factor": [1.0 + i / 10 for i in range(8)],
                 "long_factor": [2.0 + i / 5 for i in range(8)], "original_max_position_embeddings": 64},
    "llama3": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 64},
}


@pytest.mark.parametrize("name", list(ROPE_CASES))
@pytest.mark.parametrize("seq_len", [20, 600])
def test_rope_frequencies_equal_transformers(name, seq_len):
    pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    params = {**ROPE_CASES[name], "rope_theta": 10000.0}
    config = transformers.LlamaConfig(hidden_size=64, num_attention_heads=4, max_position_embeddings=256,
                                      rope_parameters=dict(params))
    if name == "default":
        from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

        expected, factor = LlamaRotaryEmbedding.compute_default_rope_parameters(config)
    else:
        expected, factor = ROPE_INIT_FUNCTIONS[params["rope_type"]](config, "cpu", seq_len=seq_len)
    ours, our_factor = rope_frequencies(params, 10000.0, 16, 16, seq_len, 256)
    np.testing.assert_allclose(ours, expected.numpy(), rtol=1e-6)
    assert our_factor == pytest.approx(factor, rel=1e-7)


def test_longrope_picks_the_long_factors_past_the_original_length():
    params = {**ROPE_CASES["longrope"], "rope_theta": 10000.0}
    short, _ = rope_frequencies(params, 10000.0, 16, 16, 64, 256)
    long, _ = rope_frequencies(params, 10000.0, 16, 16, 65, 256)
    assert not np.allclose(short, long)


@pytest.mark.parametrize("heads", [1, 2, 3, 4, 5, 6, 8, 12, 16, 20, 24, 32, 40])
def test_alibi_slopes_equal_bloom_and_mpt(heads):
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from transformers.models.bloom.modeling_bloom import build_alibi_tensor
    from transformers.models.mpt.modeling_mpt import build_mpt_alibi_tensor

    bloom = build_alibi_tensor(torch.ones(1, 3), heads, torch.float32).reshape(heads, 3)[:, 1]  # slope * 1
    np.testing.assert_allclose(alibi_slopes(heads), bloom.numpy(), rtol=1e-6)  # torch's pow: an ulp apart
    for max_bias in (8.0, 16.0):
        mpt = build_mpt_alibi_tensor(heads, 3, max_bias)[:, 0, 1]  # slope * -1
        np.testing.assert_allclose(alibi_slopes(heads, max_bias), -mpt.numpy(), rtol=1e-7)


@pytest.mark.parametrize("bidirectional", [True, False])
@pytest.mark.parametrize("buckets,distance", [(32, 128), (16, 40), (8, 20)])
def test_t5_buckets_equal_transformers(bidirectional, buckets, distance):
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from transformers.models.t5.modeling_t5 import T5Attention

    rel = np.arange(-300, 301)
    expected = T5Attention._relative_position_bucket(torch.tensor(rel), bidirectional, buckets, distance)
    np.testing.assert_array_equal(t5_buckets(rel, bidirectional, buckets, distance), expected.numpy())


def test_bfloat16_rounding_equals_torch():
    torch = pytest.importorskip("torch")
    x = np.random.default_rng(0).normal(size=10000).astype(np.float32) * 50
    x[:4] = [0.0, -0.0, 1.00390625, 3.0e38]  # a tie (rounds to even) and a large value
    np.testing.assert_array_equal(bfloat16_round(x), torch.tensor(x).bfloat16().float().numpy())


# ----------------------------------------------------------------------------------------------
# Through the command line, against NumPy transcriptions of transformers' eager attention


def eager(q, k, scale, keep=None, bias=None, softcap=None, sinks=None):
    """transformers' eager_attention_forward: scores * scale, softcap, + mask/bias, (sinks), softmax."""
    s = np.einsum("...id,...jd->...ij", q.astype(np.float64), k.astype(np.float64)) * scale
    if softcap is not None:
        s = np.tanh(s / softcap) * softcap
    if bias is not None:
        s = s + bias
    if keep is not None:
        s = np.where(keep, s, -np.inf)
    if sinks is not None:
        sink = np.broadcast_to(np.asarray(sinks, dtype=np.float64)[:, None, None], s.shape[:-1] + (1,))
        s = np.concatenate([s, sink], axis=-1)
    with np.errstate(invalid="ignore"):  # a fully masked row is NaN here; the tests compare real rows only
        s = s - s.max(axis=-1, keepdims=True)
        e = np.exp(s)
        w = e / e.sum(axis=-1, keepdims=True)
    return w[..., :-1] if sinks is not None else w


@pytest.fixture
def qkv(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    rng = np.random.default_rng(7)
    arrays = {n: rng.normal(size=(2, 4, 9, 8)).astype(np.float32) for n in "qkv"}
    for n, a in arrays.items():
        np.save(f"{n}.npy", a)
    return arrays


def run(*args):
    r = runner.invoke(app, ["scaled", "q.npy", "k.npy", "v.npy", *args, "--save-weights", "w.npy", "--quiet"])
    assert r.exit_code == 0, r.stderr
    return np.load("w.npy")


def causal(lq=9, lk=9):
    return np.arange(lk)[None, :] <= np.arange(lq)[:, None] + (lk - lq)


def test_softcap(qkv):
    expected = eager(qkv["q"], qkv["k"], 8 ** -0.5, softcap=0.5)
    np.testing.assert_allclose(run("--softcap", "0.5"), expected, atol=1e-6)
    assert np.abs(run() - expected).max() > 1e-3  # the cap matters here


@pytest.mark.parametrize("window", [1, 3, 8])
def test_sliding_window_is_transformers_meaning(qkv, window):
    i, j = np.arange(9)[:, None], np.arange(9)[None, :]
    keep = (i - j >= 0) & (i - j < window)  # masking_utils.sliding_window_causal_mask_function
    np.testing.assert_allclose(run("--sliding-window", str(window)), eager(qkv["q"], qkv["k"], 8 ** -0.5, keep),
                               atol=1e-6)


def test_chunks_count_from_the_first_real_key(qkv):
    pad = np.ones((2, 9), dtype=np.int64)
    pad[1, :2] = 0  # the second sequence is left-padded by 2
    np.save("pad.npy", pad)
    i, j = np.arange(9)[:, None], np.arange(9)[None, :]
    keeps = []
    for b, left in enumerate((0, 2)):  # masking_utils.chunked_overlay with left_padding
        keeps.append(((j - left) // 4 == (i - left) // 4) & (j <= i) & pad[b].astype(bool)[None, :])
    keep = np.stack(keeps)[:, None]
    ours = run("--chunk-size", "4", "--key-padding-mask", "pad.npy")
    expected = eager(qkv["q"], qkv["k"], 8 ** -0.5, keep)
    real = keep.any(-1)[..., None] & np.ones_like(keep)
    np.testing.assert_allclose(np.where(real, ours, 0), np.where(real, expected, 0), atol=1e-6)


def test_sinks_take_part_and_are_dropped(qkv):
    sinks = np.array([0.5, -1.0, 2.0, 0.0], dtype=np.float32)
    np.save("sinks.npy", sinks)
    ours = run("--sinks", "sinks.npy", "--sliding-window", "4")
    i, j = np.arange(9)[:, None], np.arange(9)[None, :]
    expected = eager(qkv["q"], qkv["k"], 8 ** -0.5, (i - j >= 0) & (i - j < 4), sinks=sinks)
    np.testing.assert_allclose(ours, expected, atol=1e-6)
    assert (ours.sum(-1) < 0.999).all()


@pytest.mark.parametrize("max_bias", [None, 8.0])
def test_alibi(qkv, max_bias):
    slopes = alibi_slopes(4, max_bias).astype(np.float64)
    j = np.arange(9)[None, :]
    bias = slopes[:, None, None] * j[None]  # BLOOM: slope * key position; softmax-equal to slope (j - i)
    args = ["--alibi"] if max_bias is None else ["--alibi-max-bias", str(max_bias)]
    np.testing.assert_allclose(run(*args, "--causal"), eager(qkv["q"], qkv["k"], 8 ** -0.5, causal(), bias),
                               atol=1e-6)


@pytest.mark.parametrize("bidirectional", [True, False])
def test_t5_relative_bias(qkv, bidirectional):
    table = np.random.default_rng(3).normal(size=(16, 4)).astype(np.float32)
    np.save("table.npy", table)
    i, j = np.arange(9)[:, None], np.arange(9)[None, :]
    buckets = t5_buckets(j - i, bidirectional, 16, 20)
    bias = np.moveaxis(table[buckets], -1, 0)
    flag = "--relative-bidirectional" if bidirectional else "--relative-causal"
    ours = run("--relative-bias-table", "table.npy", "--relative-max-distance", "20", flag, "--scale", "1")
    np.testing.assert_allclose(ours, eager(qkv["q"], qkv["k"], 1.0, None, bias), atol=1e-6)


def test_rope_scaling_option_equals_the_oracle(qkv):
    pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    import torch
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    rope = ROPE_CASES["llama3"]
    config = transformers.LlamaConfig(hidden_size=32, num_attention_heads=4,
                                      rope_parameters={**rope, "rope_theta": 500000.0})
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    inv, _ = ROPE_INIT_FUNCTIONS["llama3"](config, "cpu")
    pos = torch.arange(9, dtype=torch.float32) + 3000
    emb = torch.cat([pos[:, None] * inv, pos[:, None] * inv], -1)[None]
    q, k = apply_rotary_pos_emb(torch.tensor(qkv["q"]), torch.tensor(qkv["k"]), emb.cos(), emb.sin())
    np.save("pos.npy", np.arange(9) + 3000)
    ours = run("--rope", "--rope-theta", "500000", "--rope-scaling", json.dumps(rope), "--positions", "pos.npy")
    np.testing.assert_allclose(ours, eager(q.numpy(), k.numpy(), 8 ** -0.5), atol=2e-6)


def test_hf_config_and_explicit_options_give_identical_weights(qkv):
    config = {"model_type": "gemma2", "hidden_size": 32, "num_attention_heads": 4, "num_key_value_heads": 4,
              "head_dim": 8, "num_hidden_layers": 2, "query_pre_attn_scalar": 16, "attn_logit_softcapping": 3.0,
              "sliding_window": 4, "rope_theta": 10000.0, "max_position_embeddings": 64}
    with open("config.json", "w") as fh:
        json.dump(config, fh)
    from_config = run("--hf-config", "config.json", "--model-layer", "0")
    explicit = run("--scale", str(16 ** -0.5), "--softcap", "3", "--sliding-window", "4", "--rope", "--causal",
                   "--causal-align", "bottom-right")
    np.testing.assert_array_equal(from_config, explicit)
    full_layer = run("--hf-config", ".", "--model-layer", "1")  # layer 1 of Gemma 2 is global: no window
    assert (full_layer[..., 8, :4] > 0).all()
    r = runner.invoke(app, ["scaled", "q.npy", "k.npy", "v.npy", "--hf-config", "config.json", "--model-layer", "0",
                            "--json"])
    doc = json.loads(r.stdout)
    assert doc["captured"]["config"]["applied"]["softcap"] == 3.0
    assert doc["captured"]["config"]["layer_type"] == "sliding_attention"
    assert "gemma2 layer 0 (sliding attention): scale 0.25, causal" in r.stderr


@pytest.mark.parametrize("config,args,code,words", [
    ({"model_type": "mystery", "num_attention_heads": 4, "hidden_size": 32}, [], 2,
     ["mystery", "not one attnviz knows", "heads 4", "--scale"]),
    ({"model_type": "llama", "num_attention_heads": 8, "hidden_size": 64, "num_hidden_layers": 2}, [], 1,
     ["8 query heads", "Q has 4"]),
    ({"model_type": "llama", "num_attention_heads": 4, "hidden_size": 32, "num_hidden_layers": 2,
      "rope_scaling": {"rope_type": "warp", "factor": 2}}, [], 2, ["unknown rope type 'warp'"]),
    ({"model_type": "llama", "num_attention_heads": 4, "hidden_size": 32, "num_hidden_layers": 2,
      "rope_scaling": {"rope_type": "llama3", "factor": 8}}, [], 2, ["llama3", "low_freq_factor"]),
    ({"model_type": "llama", "num_attention_heads": 4, "hidden_size": 32, "num_hidden_layers": 2}, ["--model-layer",
                                                                                                      "5"], 2,
     ["--model-layer 5", "2 layers"]),
    ({"model_type": "gemma2", "num_attention_heads": 4, "hidden_size": 32, "head_dim": 8, "num_hidden_layers": 2,
      "sliding_window": 4}, [], 2, ["differ", "--model-layer"]),
    ({"model_type": "t5", "num_heads": 4, "d_model": 32, "d_kv": 8, "num_layers": 2}, [], 2,
     ["--model-attention"]),
    ({"model_type": "t5", "num_heads": 4, "d_model": 32, "d_kv": 8, "num_layers": 2}, ["--model-attention",
                                                                                       "encoder"], 2,
     ["--relative-bias-table", "relative_attention_bias"]),
    ({"model_type": "gpt_oss", "num_attention_heads": 4, "num_key_value_heads": 4, "head_dim": 8,
      "hidden_size": 32, "num_hidden_layers": 2}, ["--model-layer", "0"], 2, ["sinks", "--sinks"]),
    ("not json", [], 1, ["config.json", "not JSON"]),
])
def test_bad_configs_are_one_clear_line(qkv, config, args, code, words):
    with open("config.json", "w") as fh:
        fh.write(config if isinstance(config, str) else json.dumps(config))
    r = runner.invoke(app, ["scaled", "q.npy", "k.npy", "v.npy", "--hf-config", "config.json", *args])
    assert r.exit_code == code, r.stderr
    assert r.stderr.startswith("attnviz: error: ") and r.stderr.count("\n") <= 2, r.stderr
    for word in words:
        assert word in r.stderr, (word, r.stderr)


@pytest.mark.parametrize("args,words", [
    (["--sinks", "s.npy"], ["s.npy", "one per head of the 4"]),
    (["--softcap", "0"], ["--softcap"]),
    (["--relative-buckets", "8"], ["--relative-buckets goes with --relative-bias-table"]),
    (["--rope-scaling", '{"rope_type": "linear"}', "--rope"], ["linear", "factor"]),
    (["--rope-scaling", '{"rope_type": "linear", "factor": 2}'], ["go with --rope"]),
    (["--model-layer", "1"], ["--model-layer goes with --hf-config"]),
])
def test_bad_options_are_one_clear_line(qkv, args, words):
    np.save("s.npy", np.zeros(3, dtype=np.float32))
    r = runner.invoke(app, ["scaled", "q.npy", "k.npy", "v.npy", *args])
    assert r.exit_code in (1, 2), r.stderr
    assert r.stderr.startswith("attnviz: error: ") and "Traceback" not in r.stderr
    for word in words:
        assert word in r.stderr, (word, r.stderr)


def test_softcap_and_sinks_refused_where_no_softmax_takes_them(qkv):
    r = runner.invoke(app, ["sparse", "q.npy", "k.npy", "v.npy", "--softcap", "2"])
    assert r.exit_code == 2 and "--softcap and --sinks act on" in r.stderr, r.stderr


def test_long_inputs_in_blocks_give_the_dense_numbers(tmp_path, monkeypatch):
    """Windows, ALiBi and sinks built a block of query rows at a time (--max-memory) equal the dense run."""
    monkeypatch.chdir(tmp_path)
    rng = np.random.default_rng(1)
    for n in "qkv":
        np.save(f"{n}.npy", rng.normal(size=(1, 2, 1200, 8)).astype(np.float32))
    np.save("sinks.npy", np.array([0.3, -0.2], dtype=np.float32))
    args = ["--sliding-window", "17", "--alibi", "--sinks", "sinks.npy", "--softcap", "4"]
    dense = run(*args)
    r = runner.invoke(app, ["scaled", "q.npy", "k.npy", "v.npy", *args, "--max-memory", "2M", "--save-weights",
                            "b.npy", "--quiet"])
    assert r.exit_code == 0, r.stderr
    np.testing.assert_allclose(np.load("b.npy"), dense, atol=1e-7)
    assert (dense[0, 0, 1199, :1199 - 16] == 0).all() and (dense[0, 0, 1199, 1199 - 16:] > 0).all()


# ----------------------------------------------------------------------------------------------
# --scale on every command that scores with a dot product


def test_dot_and_local_scale_against_numpy(qkv):
    for cmd, extra, keep in (("dot", [], None), ("local", ["--window", "2"],
                                                    np.abs(np.arange(9)[:, None] - np.arange(9)[None, :]) <= 2)):
        r = runner.invoke(app, [cmd, "q.npy", "k.npy", "v.npy", *extra, "--scale", "0.3", "--save-weights", "w.npy",
                                "--quiet"])
        assert r.exit_code == 0, r.stderr
        np.testing.assert_allclose(np.load("w.npy"), eager(qkv["q"], qkv["k"], 0.3, keep), atol=1e-6)


@pytest.mark.parametrize("command", [
    ["local", "--window", "2", "--score", "dot"],
    ["sparse", "--score", "dot"],
    ["hard", "--score", "dot", "--mode", "sample", "--samples", "50", "--seed", "3"],
    ["structured", "--score", "dot", "--adjacency", "adj.npy"],
    ["general", "--seed", "3"],
])
def test_scale_equals_scaling_the_queries(qkv, command):
    """--scale s on Q is --scale 1 on s Q, for every command whose scores are linear in Q."""
    np.save("q2.npy", qkv["q"] * 2.5)
    np.save("adj.npy", np.random.default_rng(0).random((9, 9)) < 0.6)
    outs = []
    for q, scale in (("q.npy", "2.5"), ("q2.npy", "1")):
        r = runner.invoke(app, [command[0], q, "k.npy", "v.npy", *command[1:], "--scale", scale, "--save-weights",
                                "w.npy", "--quiet"])
        assert r.exit_code == 0, r.stderr
        outs.append(np.load("w.npy"))
    np.testing.assert_allclose(outs[0], outs[1], atol=1e-5)
    r = runner.invoke(app, [command[0], "q.npy", "k.npy", "v.npy", *command[1:], "--save-weights", "w.npy", "--quiet"])
    assert np.abs(np.load("w.npy") - outs[0]).max() > 1e-3  # and the scale mattered


def test_hf_config_on_local_sets_its_scale(qkv):
    with open("config.json", "w") as fh:
        json.dump({"model_type": "gemma2", "hidden_size": 32, "num_attention_heads": 4, "head_dim": 8,
                   "num_hidden_layers": 1, "query_pre_attn_scalar": 64, "layer_types": ["full_attention"]}, fh)
    r = runner.invoke(app, ["local", "q.npy", "k.npy", "v.npy", "--window", "3", "--hf-config", "config.json",
                            "--save-weights", "w.npy", "--quiet"])
    assert r.exit_code == 0, r.stderr
    keep = np.abs(np.arange(9)[:, None] - np.arange(9)[None, :]) <= 3
    i, j = np.arange(9)[:, None], np.arange(9)[None, :]
    from attnviz.positional import apply_rope, rope_angles, rope_frequencies

    inv, _ = rope_frequencies(None, 10000.0, 8, 8, 9)
    q = apply_rope(qkv["q"], rope_angles(np.arange(9), inv), "half")
    k = apply_rope(qkv["k"], rope_angles(np.arange(9), inv), "half")
    np.testing.assert_allclose(np.load("w.npy"), eager(q, k, 64 ** -0.5, keep & (j <= i)), atol=1e-6)


def test_proportional_rope_equals_transformers():
    pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    params = {"rope_type": "proportional", "rope_theta": 10000.0, "partial_rotary_factor": 0.25, "factor": 2.0}
    config = transformers.LlamaConfig(hidden_size=64, num_attention_heads=4, rope_parameters=dict(params))
    expected, factor = ROPE_INIT_FUNCTIONS["proportional"](config, "cpu")
    ours, our_factor = rope_frequencies(params, 10000.0, 16, 16, 20)
    np.testing.assert_allclose(ours, expected.numpy(), rtol=1e-6)
    assert our_factor == factor


@pytest.mark.parametrize("old,new", [
    ({"model_type": "llama", "rope_theta": 500000.0, "rope_scaling": {
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 4}},
     lambda t, **kw: t.LlamaConfig(rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                                                    "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                                    "original_max_position_embeddings": 4}, **kw)),
    ({"model_type": "gpt_neox", "rotary_pct": 0.5, "rotary_emb_base": 20000},
     lambda t, **kw: t.GPTNeoXConfig(rotary_pct=0.5, rotary_emb_base=20000, **kw)),
    ({"model_type": "llama", "rope_theta": 1000.0, "rope_scaling": {"type": "linear", "factor": 2.0},
      "rope_parameters": {"rope_type": "linear", "rope_theta": 100000.0, "factor": 3.0}},  # rope_scaling wins
     lambda t, **kw: t.LlamaConfig(rope_parameters={"rope_type": "linear", "rope_theta": 1000.0, "factor": 2.0}, **kw)),
    ({"model_type": "llama", "rope_theta": 1000.0, "rope_scaling": {"type": "llama3", "factor": 2.0,
                                                                    "low_freq_factor": 1.0, "high_freq_factor": 4.0}},
     lambda t, **kw: t.LlamaConfig(rope_parameters={"rope_type": "llama3", "rope_theta": 1000.0, "factor": 2.0,
                                                    "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                                    "original_max_position_embeddings": 64}, **kw)),
])
def test_configs_of_transformers_4_and_5_read_alike(qkv, old, new):
    """A config.json as the hub holds it (transformers 4: rope_theta, rope_scaling, rotary_pct) and the
    same model's config saved by transformers 5 (rope_parameters) give the same weights."""
    transformers = pytest.importorskip("transformers")
    shape = {"hidden_size": 32, "num_attention_heads": 4, "num_hidden_layers": 2, "max_position_embeddings": 64}
    with open("config.json", "w") as fh:
        json.dump({**old, **shape}, fh)
    first = run("--hf-config", "config.json")
    new(transformers, **shape).save_pretrained("v5")
    np.testing.assert_array_equal(run("--hf-config", "v5"), first)

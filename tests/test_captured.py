"""Captured q/k/v (attnviz.captured): --layout, grouped-query heads, --rope. Each is compared with a
NumPy oracle written here from the papers' and transformers' definitions (repeat_kv, rotate_half,
GPT-J's rotate_every_two, GPT-NeoX's partial rotary), and RoPE with transformers' own
apply_rotary_pos_emb when transformers and torch are installed."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from attnviz.cli import app

runner = CliRunner()


def softmax_attention(q, k, v, keep=None):
    """[..., Lq, d] x [..., Lk, d]: float64 scaled dot-product attention, masked rows zero."""
    s = q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1])
    if keep is not None:
        s = np.where(keep, s, -np.inf)
    m = np.max(s, axis=-1, keepdims=True)
    e = np.exp(s - np.where(np.isfinite(m), m, 0))
    w = e / np.maximum(e.sum(-1, keepdims=True), 1e-300)
    return w, w @ v


def oracle_repeat_kv(x, n_rep):
    """transformers' repeat_kv: [B, G, L, d] -> [B, G * n_rep, L, d], head g repeated n_rep times."""
    b, g, length, d = x.shape
    return np.broadcast_to(x[:, :, None], (b, g, n_rep, length, d)).reshape(b, g * n_rep, length, d)


def oracle_rope_half(x, pos, theta=10000.0, rot=None):
    """Llama (rotate_half), with GPT-NeoX's partial rotary over the first `rot` dims."""
    d = x.shape[-1]
    rot = rot or d
    inv = 1.0 / theta ** (np.arange(0, rot, 2) / rot)
    freqs = np.asarray(pos, float)[..., None] * inv
    emb = np.concatenate([freqs, freqs], axis=-1)
    cos, sin = np.cos(emb), np.sin(emb)
    xr, xp = x[..., :rot], x[..., rot:]
    half = np.concatenate([-xr[..., rot // 2:], xr[..., : rot // 2]], axis=-1)
    return np.concatenate([xr * cos + half * sin, xp], axis=-1)


def oracle_rope_interleaved(x, pos, theta=10000.0, rot=None):
    """GPT-J's rotate_every_two with sin/cos repeated per pair, over the first `rot` dims."""
    d = x.shape[-1]
    rot = rot or d
    inv = 1.0 / theta ** (np.arange(0, rot, 2) / rot)
    freqs = np.asarray(pos, float)[..., None] * inv
    cos, sin = np.repeat(np.cos(freqs), 2, axis=-1), np.repeat(np.sin(freqs), 2, axis=-1)
    xr, xp = x[..., :rot], x[..., rot:]
    every_two = np.stack([-xr[..., 1::2], xr[..., 0::2]], axis=-1).reshape(xr.shape)
    return np.concatenate([xr * cos + every_two * sin, xp], axis=-1)


def run_json(tmp_path, arrays, *options, command="scaled"):
    names = []
    for name, arr in arrays.items():
        np.save(tmp_path / f"{name}.npy", arr)
        names.append(str(tmp_path / f"{name}.npy"))
    args = [command, *names[:3], *[str(tmp_path / o) if isinstance(o, str) and o.endswith(".npy") else str(o)
                                   for o in options], "--json"]
    r = runner.invoke(app, args)
    assert r.exit_code == 0, r.stderr
    doc = json.loads(r.stdout)
    return np.array(doc["weights"]), np.array(doc["output"]), doc


def hooked(rng, b=2, length=6, n=4, g=2, d=8):
    """q [B, L, N, d] and k, v [B, L, G, d]: what forward hooks on q_proj/k_proj/v_proj give after view."""
    q = rng.normal(size=(b, length, n, d)).astype(np.float32)
    k = rng.normal(size=(b, length, g, d)).astype(np.float32)
    v = rng.normal(size=(b, length, g, d)).astype(np.float32)
    return q, k, v


def test_layout_and_grouped_heads_equal_repeat_kv_oracle(tmp_path):
    q, k, v = hooked(np.random.default_rng(0))
    w, o, doc = run_json(tmp_path, {"q": q, "k": k, "v": v}, "--layout", "batch,seq,head,d")
    qs, ks, vs = (np.transpose(x, (0, 2, 1, 3)).astype(np.float64) for x in (q, k, v))
    ew, eo = softmax_attention(qs, oracle_repeat_kv(ks, 2), oracle_repeat_kv(vs, 2))
    assert w.shape == (2, 4, 6, 6)  # [batch, head, Lq, Lk]
    np.testing.assert_allclose(w, ew, atol=1e-5)
    np.testing.assert_allclose(o, eo, atol=1e-4)
    assert doc["captured"]["grouped_heads"] == {"query_heads": 4, "kv_heads": 2}
    assert doc["captured"]["layout"]["as"] == "batch,head,seq,d"
    # head n uses kv head n // 2: heads 0 and 1 share keys, so with equal queries they are equal
    q2 = q.copy()
    q2[:, :, 1] = q2[:, :, 0]
    w2, _, _ = run_json(tmp_path, {"q": q2, "k": k, "v": v}, "--layout", "batch,seq,head,d")
    np.testing.assert_allclose(w2[:, 0], w2[:, 1], atol=1e-6)
    assert not np.allclose(w2[:, 0], w2[:, 2], atol=1e-3)


def test_grouped_heads_without_layout_and_multi_query(tmp_path):
    rng = np.random.default_rng(1)
    q = rng.normal(size=(1, 6, 5, 4)).astype(np.float32)  # [B, N, L, d]
    for g in (3, 1):
        k = rng.normal(size=(1, g, 5, 4)).astype(np.float32)
        v = rng.normal(size=(1, g, 5, 3)).astype(np.float32)
        w, o, _ = run_json(tmp_path, {"q": q, "k": k, "v": v})
        ew, eo = softmax_attention(q.astype(np.float64), oracle_repeat_kv(k.astype(np.float64), 6 // g),
                                   oracle_repeat_kv(v.astype(np.float64), 6 // g))
        np.testing.assert_allclose(w, ew, atol=1e-5)
        np.testing.assert_allclose(o, eo, atol=1e-4)


def test_layout_kv_differs_from_q(tmp_path):
    rng = np.random.default_rng(2)
    q = rng.normal(size=(2, 3, 5, 4)).astype(np.float32)  # [B, H, L, d]
    k = rng.normal(size=(2, 7, 3, 4)).astype(np.float32)  # [B, L, H, d]
    v = rng.normal(size=(2, 7, 3, 2)).astype(np.float32)
    w, _, _ = run_json(tmp_path, {"q": q, "k": k, "v": v}, "--layout", "batch,head,seq,d",
                       "--layout-kv", "batch,seq,head,d")
    ew, _ = softmax_attention(q.astype(np.float64), np.transpose(k, (0, 2, 1, 3)).astype(np.float64),
                              np.transpose(v, (0, 2, 1, 3)).astype(np.float64))
    np.testing.assert_allclose(w, ew, atol=1e-5)


@pytest.mark.parametrize("style, oracle", [("half", oracle_rope_half), ("interleaved", oracle_rope_interleaved)])
@pytest.mark.parametrize("rot", [None, 4])
def test_rope_equals_numpy_transcriptions(tmp_path, style, oracle, rot):
    q, k, v = hooked(np.random.default_rng(3), length=9, d=8)
    extra = ["--rope-dim", rot] if rot else []
    w, _, doc = run_json(tmp_path, {"q": q, "k": k, "v": v}, "--layout", "batch,seq,head,d", "--rope",
                         "--rope-style", style, "--rope-theta", 500, *extra)
    pos = np.arange(9)[:, None]  # [L, 1]: broadcast over d
    qs, ks, vs = (np.transpose(x, (0, 2, 1, 3)).astype(np.float64) for x in (q, k, v))
    qr = oracle(qs, pos[:, 0], theta=500.0, rot=rot)
    kr = oracle(ks, pos[:, 0], theta=500.0, rot=rot)
    ew, _ = softmax_attention(qr, oracle_repeat_kv(kr, 2), oracle_repeat_kv(vs, 2))
    np.testing.assert_allclose(w, ew, atol=1e-5)
    plain, _, _ = run_json(tmp_path, {"q": q, "k": k, "v": v}, "--layout", "batch,seq,head,d")
    assert not np.allclose(w, plain, atol=1e-3)  # the rotation did something
    assert doc["captured"]["rope"]["dims"] == (rot or 8)


def test_rope_equals_transformers_apply_rotary_pos_emb():
    torch = pytest.importorskip("torch")
    llama = pytest.importorskip("transformers.models.llama.modeling_llama")
    from attnviz.positional import apply_rope, rope_angles, rope_frequencies

    rng = np.random.default_rng(4)
    x = rng.normal(size=(2, 3, 40, 16)).astype(np.float32)  # [B, H, L, d]
    # left padding, HF style; and positions in the thousands, where float32 angles round as the model's do
    pos = np.stack([np.arange(40) + 7000, np.concatenate([np.ones(5), np.arange(35)])])
    inv = 1.0 / 10000.0 ** (torch.arange(0, 16, 2, dtype=torch.float32) / 16)
    freqs = torch.tensor(pos, dtype=torch.float32)[..., None] * inv
    emb = torch.cat([freqs, freqs], dim=-1)
    xt = torch.tensor(x)
    expected, _ = llama.apply_rotary_pos_emb(xt, xt, emb.cos(), emb.sin())
    inv_freq, factor = rope_frequencies(None, 10000.0, 16, 16, 7040)
    ours = apply_rope(x, rope_angles(pos[:, None, :], inv_freq), "half", factor)
    np.testing.assert_allclose(ours, expected.numpy(), atol=2e-6)


def test_positions_for_left_padding_give_the_unpadded_numbers(tmp_path):
    """A left-padded batch entry with its position ids (and the padding as --key-padding-mask) has,
    on its real tokens, exactly the weights of the same sequence run alone, unpadded."""
    rng = np.random.default_rng(5)
    b, length, pad, n, d = 2, 7, 3, 2, 8
    q, k, v = hooked(rng, b=b, length=length, n=n, g=n, d=d)
    keep = np.ones((b, length), np.int8)
    keep[1, :pad] = 0
    positions = np.stack([np.arange(length), np.concatenate([np.ones(pad), np.arange(length - pad)])]).astype(
        np.int64)  # transformers: position_ids = cumsum(mask) - 1, padding filled with 1
    np.save(tmp_path / "pos.npy", positions)
    np.save(tmp_path / "keep.npy", keep)
    w, _, _ = run_json(tmp_path, {"q": q, "k": k, "v": v}, "--layout", "batch,seq,head,d", "--rope",
                       "--positions", "pos.npy", "--key-padding-mask", "keep.npy", "--causal")
    alone, _, _ = run_json(tmp_path, {"q": q[1:, pad:], "k": k[1:, pad:], "v": v[1:, pad:]}, "--layout",
                           "batch,seq,head,d", "--rope", "--causal")
    np.testing.assert_allclose(w[1, :, pad:, pad:], alone[0], atol=1e-5)
    assert np.all(w[1, :, pad:, :pad] == 0)
    # without the position ids the padded entry's rotations are shifted: the numbers differ
    shifted, _, _ = run_json(tmp_path, {"q": q, "k": k, "v": v}, "--layout", "batch,seq,head,d", "--rope",
                             "--key-padding-mask", "keep.npy", "--causal")
    np.testing.assert_allclose(shifted[1, :, pad:, pad:], alone[0], atol=1e-5)  # RoPE is relative: a shift
    np.testing.assert_allclose(shifted[0], w[0], atol=1e-6)  # keeps scores; entry 0 is unpadded anyway


def test_rope_with_gapped_positions_changes_the_numbers(tmp_path):
    """Positions that are not a shift of 0..L-1 (packed sequences restart at 0) change the scores."""
    rng = np.random.default_rng(6)
    q, k, v = hooked(rng, b=1, length=6, n=2, g=2, d=8)
    np.save(tmp_path / "pos.npy", np.array([0, 1, 2, 0, 1, 2]))
    a, _, _ = run_json(tmp_path, {"q": q, "k": k, "v": v}, "--layout", "batch,seq,head,d", "--rope",
                       "--positions", "pos.npy")
    b, _, _ = run_json(tmp_path, {"q": q, "k": k, "v": v}, "--layout", "batch,seq,head,d", "--rope")
    qs, ks, vs = (np.transpose(x, (0, 2, 1, 3)).astype(np.float64) for x in (q, k, v))
    pos = np.array([0, 1, 2, 0, 1, 2])
    ew, _ = softmax_attention(oracle_rope_half(qs, pos), oracle_rope_half(ks, pos), vs)
    np.testing.assert_allclose(a, ew, atol=1e-5)
    assert not np.allclose(a, b, atol=1e-3)


def test_rope_with_kv_cache_queries_take_the_last_positions(tmp_path):
    rng = np.random.default_rng(7)
    q = rng.normal(size=(1, 2, 2, 8)).astype(np.float32)  # [B, H, Lq=2, d]: the last two tokens
    k = rng.normal(size=(1, 2, 5, 8)).astype(np.float32)
    v = rng.normal(size=(1, 2, 5, 4)).astype(np.float32)
    w, _, _ = run_json(tmp_path, {"q": q, "k": k, "v": v}, "--rope")
    ew, _ = softmax_attention(oracle_rope_half(q.astype(np.float64), np.array([3, 4])),
                              oracle_rope_half(k.astype(np.float64), np.arange(5)), v.astype(np.float64))
    np.testing.assert_allclose(w, ew, atol=1e-5)


@pytest.mark.parametrize("args, code, words", [
    (["--layout", "batch,seq,d"], 1, "has 4 axes"),
    (["--layout", "batch,seq,seq,d"], 2, "name each axis once"),
    (["--layout", "batch,tokens,heads,dim", "--rope", "--rope-dim", "3"], 2, "--rope-dim 3"),
    (["--rope-dim", "4"], 2, "go with --rope"),
    (["--layout-kv", "batch,seq,head,d"], 2, "goes with --layout"),
    (["--layout", "batch,seq,head,d", "--rope", "--positions", "bad_pos.npy"], 1, "position ids"),
    (["--rope", "--rope-theta", "0"], 2, "--rope-theta"),
])
def test_bad_capture_options(tmp_path, args, code, words):
    q, k, v = hooked(np.random.default_rng(8))
    for name, arr in (("q", q), ("k", k), ("v", v)):
        np.save(tmp_path / f"{name}.npy", arr)
    np.save(tmp_path / "bad_pos.npy", np.arange(5))
    r = runner.invoke(app, ["scaled", *(str(tmp_path / f"{n}.npy") for n in "qkv"),
                            *[str(tmp_path / a) if a.endswith(".npy") else a for a in args]])
    assert r.exit_code == code, r.stderr
    assert words in r.stderr and "Traceback" not in r.stderr


def test_capture_options_on_q_k_v_commands_only():
    for command, has in (("scaled", True), ("dot", True), ("local", True), ("multihead", False),
                         ("inspect", True), ("pooling", False)):
        r = runner.invoke(app, [command, "--help"], env={"COLUMNS": "200"})
        assert r.exit_code == 0
        assert ("--rope" in r.stdout) is (has and command != "inspect"), command


def test_slices_are_named_by_the_layout(tmp_path):
    q, k, v = hooked(np.random.default_rng(9))
    for name, arr in (("q", q), ("k", k), ("v", v)):
        np.save(tmp_path / f"{name}.npy", arr)
    r = runner.invoke(app, ["scaled", *(str(tmp_path / f"{n}.npy") for n in "qkv"), "--layout", "batch,seq,head,d",
                            "--index", "1,3"], env={"COLUMNS": "160"})
    assert r.exit_code == 0, r.stderr
    assert "batch 1, head 3" in r.stdout

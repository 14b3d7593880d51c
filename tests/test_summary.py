"""Summary captures (long contexts): each statistic a summary records equals what the exact weights of the
same model give (the model's own eager ``output_attentions``), for grouped-query heads, sliding windows,
softcaps, sinks, left and right padding, an encoder and an encoder-decoder's cross attention; the three
paths of one definition (torch blocks, NumPy, the head statistics of exact weights) agree on the same q and
k; the file and its bad input."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from safetensors import safe_open  # noqa: E402

import attnviz  # noqa: E402
from attnviz.errors import UsageError  # noqa: E402
from attnviz.summarystats import PER_ROW, MaskParts, SummarySettings, pool_edges  # noqa: E402

pytestmark = pytest.mark.xdist_group("capture")

SMALL = dict(vocab_size=99, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4)
FAMILIES = {
    "llama (grouped-query)": ("LlamaConfig", dict(num_key_value_heads=2)),
    "mistral (sliding window)": ("MistralConfig", dict(num_key_value_heads=2, sliding_window=5)),
    "gemma2 (softcap, windows)": ("Gemma2Config", dict(num_key_value_heads=2, head_dim=8, sliding_window=5,
                                                       attn_logit_softcapping=5.0, query_pre_attn_scalar=8)),
    "gpt-oss (sinks)": ("GptOssConfig", dict(num_key_value_heads=2, head_dim=8, num_local_experts=2,
                                             num_experts_per_tok=1, sliding_window=5)),
}
SETTINGS = dict(sinks=2, local=3, pool=4, rows="0,5,-1")


def _pair(config_name: str, extra: dict, cls_name: str = "AutoModelForCausalLM") -> tuple[object, object]:
    cfg = getattr(transformers, config_name)(**{**SMALL, **extra})
    auto = getattr(transformers, cls_name)
    torch.manual_seed(0)
    model = auto.from_config(cfg).eval()
    eager = auto.from_config(copy.deepcopy(cfg), attn_implementation="eager").eval()
    eager.load_state_dict(model.state_dict())
    return model, eager


def _ids(length: int = 13, left: bool = True) -> tuple[object, object]:
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(3, 99, (2, length), generator=g)
    mask = torch.ones(2, length, dtype=torch.long)
    if left:
        mask[1, :4] = 0
    else:
        mask[1, -4:] = 0
    return ids, mask


def oracle(a: np.ndarray, keep: np.ndarray, real_keys: np.ndarray, *, sinks: int, local: int, pool: int,
           rows: list[int], self_attention: bool = True) -> dict[str, np.ndarray]:
    """Each statistic transcribed from its definition, from exact weights ``a [B, H, Lq, Lk]`` (float64),
    ``keep [B, 1, Lq, Lk]`` and the real keys ``[B, Lk]``."""
    b, h, lq, lk = a.shape
    a = np.where(keep, a, 0.0)
    live = np.broadcast_to(keep.any(-1), (b, h, lq))
    pos = np.arange(lq) + (lk - lq if self_attention else 0)
    j = np.arange(lk)
    out: dict[str, np.ndarray] = {}
    with np.errstate(divide="ignore", invalid="ignore"):
        out["entropy"] = -np.where(a > 0, a * np.log(a), 0.0).sum(-1)
    out["max"] = a.max(-1)
    first_s = np.zeros((b, lk), bool)
    for bi in range(b):
        first_s[bi, np.flatnonzero(real_keys[bi])[:sinks]] = True
    out["sink_mass"] = (a * first_s[:, None, None]).sum(-1)
    band = (j[None] <= pos[:, None]) & (j[None] > pos[:, None] - local)
    out["local_mass"] = (a * band).sum(-1)
    out["total"] = a.sum(-1)
    out["distance"] = (a * np.abs(pos[:, None] - j[None])).sum(-1)
    out["diagonal"] = np.stack([a[..., i, pos[i]] if pos[i] < lk else np.zeros((b, h)) for i in range(lq)], -1)
    out["previous"] = np.stack([a[..., i, pos[i] - 1] if 0 < pos[i] <= lk else np.zeros((b, h))
                                for i in range(lq)], -1)
    f = [np.flatnonzero(r)[0] for r in real_keys]
    la = [np.flatnonzero(r)[-1] for r in real_keys]
    out["first"] = np.stack([a[bi, :, :, f[bi]] for bi in range(b)])
    out["last"] = np.stack([a[bi, :, :, la[bi]] for bi in range(b)])
    for name in list(out):
        out[name] = np.where(live, out[name], np.nan)
    out["argmax"] = np.where(live, np.where(keep, a, -1).argmax(-1), -1)
    real_rows = real_keys[:, lk - lq:] if self_attention else np.ones((b, lq), bool)
    counted = real_rows & keep[:, 0].any(-1)
    out["received"] = (a * counted[:, None, :, None]).sum(-2)
    out["seen_by"] = (keep[:, 0] & counted[..., None]).sum(-2)
    qe, ke = pool_edges(lq, pool), pool_edges(lk, pool)
    mean = np.full((b, h, len(qe) - 1, len(ke) - 1), np.nan)
    top = np.full_like(mean, np.nan)
    for bi in range(b):
        for qi in range(len(qe) - 1):
            rr = [i for i in range(qe[qi], qe[qi + 1]) if counted[bi, i]]
            for kj in range(len(ke) - 1):
                cell = keep[bi, 0][np.ix_(rr, range(ke[kj], ke[kj + 1]))]
                if rr and cell.any():
                    block = a[bi][:, rr, ke[kj]:ke[kj + 1]]
                    mean[bi, :, qi, kj] = block.sum((-1, -2)) / (len(rr) * (ke[kj + 1] - ke[kj]))
                    top[bi, :, qi, kj] = block.max((-1, -2))
    out["pooled_mean"], out["pooled_max"] = mean, top
    out["rows"] = a[:, :, rows]
    return out


def _summary(path: Path, site: str) -> dict[str, np.ndarray]:
    with safe_open(str(path), "np") as f:
        names = [k[len(site) + 1:] for k in f.keys() if k.startswith(site + ".")]
        return {n: f.get_tensor(f"{site}.{n}") for n in names}


def _assert_summary(got: dict[str, np.ndarray], want: dict[str, np.ndarray], where: str, atol: float = 1e-5) -> None:
    for name, value in want.items():
        assert name in got, (where, name, sorted(got))
        assert got[name].shape == value.shape, (where, name, got[name].shape, value.shape)
        if name == "argmax":
            live = value >= 0
            np.testing.assert_array_equal(got[name][live], value[live], err_msg=f"{where} {name}")
            continue
        np.testing.assert_allclose(got[name].astype(np.float64), value, atol=atol, rtol=1e-5,
                                   equal_nan=True, err_msg=f"{where} {name}")


def _keep_of(eager_mask: np.ndarray, lq: int, lk: int, causal: bool, window: int | None) -> np.ndarray:
    i = np.arange(lq)[:, None] + (lk - lq)
    j = np.arange(lk)[None]
    keep = np.ones((lq, lk), bool)
    if causal:
        keep &= j <= i
    if window:
        keep &= j > i - window
    return keep[None, None] & eager_mask.astype(bool)[:, None, None, -lk:]


@pytest.mark.parametrize("left", [True, False], ids=["left padding", "right padding"])
@pytest.mark.parametrize("family", list(FAMILIES))
def test_summary_equals_the_exact_weights(family: str, left: bool, tmp_path: Path) -> None:
    config_name, extra = FAMILIES[family]
    model, eager = _pair(config_name, extra)
    ids, mask = _ids(left=left)
    path = tmp_path / "sum.safetensors"
    with torch.no_grad():
        outside = model(ids, attention_mask=mask).logits
        with attnviz.capture(model, path=path, summary=True, **{k: v for k, v in SETTINGS.items()}):
            inside = model(ids, attention_mask=mask).logits
        ref = eager(ids, attention_mask=mask, output_attentions=True).attentions
    real = mask.bool()
    torch.testing.assert_close(inside[real], outside[real], atol=1e-5, rtol=0)  # the model computes as outside
    meta = json.loads(safe_open(str(path), "np").metadata()["attnviz.capture"])
    assert meta["summary"] == {"sinks": 2, "local": 3, "pool": 4, "rows": "0,5,-1"}
    layer_types = getattr(model.config, "layer_types", None) or ["full_attention"] * 2
    for i, site in enumerate(["layers.0", "layers.1"]):
        window = extra.get("sliding_window") if layer_types[i] == "sliding_attention" or config_name == \
            "MistralConfig" else None
        a = ref[i].double().numpy()
        keep = _keep_of(mask.numpy(), 13, 13, True, window)
        want = oracle(a, keep, mask.numpy().astype(bool), sinks=2, local=3, pool=4, rows=[0, 5, 12])
        got = _summary(path, site)
        assert "weights" not in got and "q" not in got
        _assert_summary(got, want, f"{family} {site}")
        if config_name == "GptOssConfig":
            assert np.nanmax(got["total"]) < 1.0  # the sinks take their share of each row


def test_encoder_both_directions_and_cross_attention(tmp_path: Path) -> None:
    """BERT (bidirectional, right padding) and BART's cross attention (decoder rows over encoder keys)."""
    cfg = transformers.BertConfig(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                  intermediate_size=64)
    torch.manual_seed(0)
    model = transformers.AutoModel.from_config(cfg).eval()
    eager = transformers.AutoModel.from_config(copy.deepcopy(cfg), attn_implementation="eager").eval()
    eager.load_state_dict(model.state_dict())
    ids, mask = _ids(left=False)
    path = tmp_path / "bert.safetensors"
    with torch.no_grad():
        with attnviz.capture(model, path=path, summary=True, **SETTINGS):
            model(ids, attention_mask=mask)
        ref = eager(ids, attention_mask=mask, output_attentions=True).attentions
    for i, site in enumerate(["layers.0", "layers.1"]):
        keep = _keep_of(mask.numpy(), 13, 13, False, None)
        want = oracle(ref[i].double().numpy(), keep, mask.numpy().astype(bool), sinks=2, local=3, pool=4,
                      rows=[0, 5, 12])
        _assert_summary(_summary(path, site), want, f"bert {site}")

    cfg = transformers.BartConfig(vocab_size=99, d_model=32, encoder_layers=1, decoder_layers=1,
                                  encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64,
                                  decoder_ffn_dim=64, max_position_embeddings=64)
    torch.manual_seed(0)
    model = transformers.AutoModel.from_config(cfg).eval()
    eager = transformers.AutoModel.from_config(copy.deepcopy(cfg), attn_implementation="eager").eval()
    eager.load_state_dict(model.state_dict())
    dec = torch.randint(3, 99, (2, 6), generator=torch.Generator().manual_seed(2))
    path = tmp_path / "bart.safetensors"
    with torch.no_grad():
        with attnviz.capture(model, path=path, summary=True, sinks=2, local=3, pool=4, rows="0,-1"):
            model(ids, attention_mask=mask, decoder_input_ids=dec)
        out = eager(ids, attention_mask=mask, decoder_input_ids=dec, output_attentions=True)
    keep = np.broadcast_to(mask.numpy().astype(bool)[:, None, None, :], (2, 1, 6, 13))
    want = oracle(out.cross_attentions[0].double().numpy(), keep, mask.numpy().astype(bool), sinks=2, local=3,
                  pool=4, rows=[0, 5], self_attention=False)
    for name in ("local_mass", "distance", "diagonal", "previous"):  # positions of another sequence: no meaning
        want.pop(name)
    _assert_summary(_summary(path, "cross.layers.0"), want, "bart cross")


def test_three_paths_of_one_definition() -> None:
    """The torch blocks, the NumPy form and (for the head means) the head statistics of exact weights, on the
    same q and k: grouped heads, a window, a softcap and sinks, left padding, blocks smaller than the map."""
    from attnviz.capturing.summary import summarise as in_torch
    from attnviz.summarystats import summarise as in_numpy

    rng = np.random.default_rng(0)
    q, k = rng.normal(size=(2, 4, 37, 8)).astype(np.float32), rng.normal(size=(2, 2, 37, 8)).astype(np.float32)
    pad = np.ones((2, 37), bool)
    pad[1, :5] = False
    for parts, softcap, sinks in [(MaskParts(causal=True, padding=pad), None, None),
                                  (MaskParts(causal=True, window=7, padding=pad), 20.0, None),
                                  (MaskParts(causal=False, padding=pad), None, rng.normal(size=4)),
                                  (MaskParts(causal=True), None, None)]:
        settings = SummarySettings(sinks=3, local=4, pool=6, rows="0,20,-1")
        a = in_torch(torch.tensor(q), torch.tensor(k), scale=0.3, settings=settings, parts=parts, softcap=softcap,
                     sinks=None if sinks is None else torch.tensor(sinks), row_budget=2 * 4 * 37 * 5)
        b = in_numpy(q, k, scale=0.3, settings=settings, parts=parts, softcap=softcap, sinks=sinks, block=7)
        for name, value in b.items():
            np.testing.assert_allclose(a[name].double().numpy(), value.astype(np.float64), atol=1e-5, rtol=1e-5,
                                       equal_nan=True, err_msg=f"{parts} {name}")


def test_pool_edges_and_bad_settings() -> None:
    assert pool_edges(10, 4) == [0, 3, 6, 9, 10]
    assert pool_edges(3, 256) == [0, 1, 2, 3]
    for bad in (dict(pool=0), dict(sinks=-1), dict(local=0)):
        with pytest.raises(UsageError):
            SummarySettings(**bad)
    with pytest.raises(UsageError, match="outside the sequence"):
        SummarySettings(rows="50").row_positions(10)
    with pytest.raises(UsageError, match="give row numbers"):
        SummarySettings(rows="x")
    assert SummarySettings(rows="0,-1,2:4,last").row_positions(10) == [0, 2, 3, 9]
    assert set(PER_ROW) >= {"entropy", "max", "sink_mass", "local_mass", "total"}

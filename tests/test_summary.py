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
from safetensors import safe_open

import attnviz
from attnviz.errors import UsageError
from attnviz.summarystats import PER_ROW, MaskParts, SummarySettings, pool_edges
from tests.conftest import LazyModule
from tests.hfmodels import model_pair as _pair

torch = LazyModule("torch")  # imported when a test first uses it: not while every worker collects
transformers = LazyModule("transformers")

pytestmark = pytest.mark.xdist_group("summary")  # its own worker: beside capture's, not after it

FAMILIES = {
    "llama (grouped-query)": ("LlamaConfig", dict(num_key_value_heads=2)),
    "mistral (sliding window)": ("MistralConfig", dict(num_key_value_heads=2, sliding_window=5)),
    "gemma2 (softcap, windows)": ("Gemma2Config", dict(num_key_value_heads=2, head_dim=8, sliding_window=5,
                                                       attn_logit_softcapping=5.0, query_pre_attn_scalar=8)),
    "gpt-oss (sinks)": ("GptOssConfig", dict(num_key_value_heads=2, head_dim=8, num_local_experts=2,
                                             num_experts_per_tok=1, sliding_window=5)),
}
SETTINGS = dict(sinks=2, local=3, pool=4, rows="0,5,-1")


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
    ``keep [B, 1 or H, Lq, Lk]`` (a mask per head: each head's own rows and keys) and the real keys ``[B, Lk]``."""
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
    counted = real_rows[:, None] & keep.any(-1)  # [B, 1 or H, Lq]
    out["received"] = (a * counted[..., None]).sum(-2)
    seen_by, keys_seen = (keep & counted[..., None]).sum(-2), keep.sum(-1)
    out["seen_by"], out["keys_seen"] = (seen_by[:, 0], keys_seen[:, 0]) if keep.shape[1] == 1 else (seen_by, keys_seen)
    qe, ke = pool_edges(lq, pool), pool_edges(lk, pool)
    mean = np.full((b, h, len(qe) - 1, len(ke) - 1), np.nan)
    top = np.full_like(mean, np.nan)
    for bi in range(b):
        for hi in range(h):
            m = min(hi, keep.shape[1] - 1)  # the head's own mask
            for qi in range(len(qe) - 1):
                rr = [i for i in range(qe[qi], qe[qi + 1]) if counted[bi, m, i]]
                for kj in range(len(ke) - 1):
                    cell = keep[bi, m][np.ix_(rr, range(ke[kj], ke[kj + 1]))]
                    if rr and cell.any():
                        block = a[bi, hi][rr, ke[kj]:ke[kj + 1]]
                        mean[bi, hi, qi, kj] = block.sum() / (len(rr) * (ke[kj + 1] - ke[kj]))
                        top[bi, hi, qi, kj] = block.max()
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
        assert got["pool_q_edges"].tolist() == got["pool_k_edges"].tolist() == pool_edges(13, 4) == [0, 4, 8, 12, 13]
        assert got["row_positions"].tolist() == [0, 5, 12]
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
    from attnviz.summarystats import summarise as in_numpy
    from attnviz.summarytorch import summarise as in_torch

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


def _per_head_mask(b: int, h: int, n: int) -> np.ndarray:
    """[B, H, n, n] keep: causal, a window of 3, every key, and even keys with the diagonal where row 4 sees no
    key; batch entry 1's first 3 keys padding. Its heads' union is causal-or-more: no mask of parts."""
    i, j = np.arange(n)[:, None], np.arange(n)[None]
    causal = j <= i
    heads = [causal, causal & (j > i - 3), np.ones((n, n), bool), causal & ((j % 2 == 0) | (j == i)) & (i != 4)]
    keep = np.broadcast_to(np.stack(heads)[None], (b, h, n, n)).copy()
    keep[1:, :, :, :3] = False
    return keep


def _masked_softmax(q: np.ndarray, k: np.ndarray, keep: np.ndarray, scale: float) -> np.ndarray:
    """The weights ``[B, H, Lq, Lk]`` (float64) of q ``[B, H, Lq, d]`` and k ``[B, Hkv, Lk, d]`` over the keys
    ``keep [B, 1 or H, Lq, Lk]`` keeps; 0 in a row that keeps none."""
    k = np.repeat(k, q.shape[1] // k.shape[1], axis=1)
    s = np.einsum("bhid,bhjd->bhij", q.astype(np.float64), k.astype(np.float64)) * scale
    s = np.where(keep, s, -np.inf)
    top = s.max(-1, keepdims=True)
    e = np.exp(s - np.where(np.isfinite(top), top, 0.0))
    total = e.sum(-1, keepdims=True)
    return np.divide(e, total, out=np.zeros_like(e), where=total > 0)


def test_a_mask_that_differs_per_head_masks_each_head() -> None:
    """A dense mask [B, H, Lq, Lk] whose heads keep different keys: the torch blocks and the NumPy form give
    each head's statistics over its own keys (a row live where its head's mask keeps a key; keys seen and rows
    seeing a key per head), equal to the definition transcribed from the weights; and the capture keeps such
    a mask whole, not as the parts of its heads' union."""
    from attnviz.summarystats import summarise as in_numpy
    from attnviz.summarytorch import mask_parts
    from attnviz.summarytorch import summarise as in_torch

    rng = np.random.default_rng(5)
    b, h, n = 2, 4, 11
    q, k = rng.normal(size=(b, h, n, 8)).astype(np.float32), rng.normal(size=(b, 2, n, 8)).astype(np.float32)
    keep = _per_head_mask(b, h, n)
    settings = SummarySettings(sinks=2, local=3, pool=4, rows="0,4,-1")
    want = oracle(_masked_softmax(q, k, keep, 0.4), keep, keep.any((1, 2)), sinks=2, local=3, pool=4,
                  rows=[0, 4, 10])
    got = in_torch(torch.tensor(q), torch.tensor(k), scale=0.4, settings=settings, parts=MaskParts(),
                   dense=torch.tensor(keep), row_budget=2 * 4 * 12 * 3)
    _assert_summary({name: value.numpy() for name, value in got.items()}, want, "torch blocks")
    _assert_summary(in_numpy(q, k, scale=0.4, settings=settings, parts=MaskParts(), dense=keep, block=3), want,
                    "numpy")
    assert np.isnan(want["entropy"][0, 3, 4]) and np.isfinite(want["entropy"][0, :3, 4]).all()
    parts, _ = mask_parts(torch.tensor(keep[:1, [0, 0, 0, 1]]), causal=True, window=None, lq=n, lk=n,
                          self_attention=True)
    assert parts is None  # causal in three heads, a window in the fourth: their union is causal, the mask not


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


# -- the command line: a Llama folder with a word-level tokenizer (benchmarks/models.py), long-ish inputs


@pytest.fixture(scope="module")
def llama_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    from models import llama_folder as make

    folder = tmp_path_factory.mktemp("models") / "llama"
    return make(folder, layers=2, heads=4, kv_heads=2, hidden=32, positions=4096)


def invoke(*args: object) -> object:
    from typer.testing import CliRunner

    from attnviz.cli import app

    result = CliRunner().invoke(app, [str(a) for a in args])
    assert "Traceback" not in result.stderr, result.stderr
    return result


def _text(tokens: int, needle: str | None = None) -> str:
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    from models import long_text

    return long_text(tokens, needle)


def test_inspect_of_a_summary_equals_inspect_of_the_exact_capture(llama_folder: Path, tmp_path: Path) -> None:
    """The same run captured whole and summarised: inspect --json gives the same head statistics and received
    attention (a padded batch of two texts; the document as one text through --text @FILE)."""
    doc = tmp_path / "doc.txt"
    doc.write_text(_text(300).replace(" . ", " .\n"))  # newlines inside: still one text
    args = ["--text", f"@{doc}", "--text", _text(120)]
    exact, summary = tmp_path / "exact.safetensors", tmp_path / "summary.safetensors"
    assert invoke("capture", llama_folder, *args, "-o", exact).exit_code == 0
    done = invoke("capture", llama_folder, *args, "-o", summary, "--summary", "--json")
    assert done.exit_code == 0, done.stderr
    assert json.loads(done.stdout)["summary"] is True
    a = json.loads(invoke("inspect", exact, "--json").stdout)
    b = json.loads(invoke("inspect", summary, "--json").stdout)
    assert len(a["head_stats"]) == len(b["head_stats"]) == 8
    for x, y in zip(a["head_stats"], b["head_stats"]):
        for name in ("entropy", "entropy_norm", "distance", "diagonal", "previous", "first", "last", "max", "rows"):
            assert y[name] == pytest.approx(x[name], rel=1e-5, abs=1e-5), (x["layer"], x["head"], name)
        # the same tags, less the summary's own (local: the --local window's mass, which exact weights lack)
        assert [t for t in (y["tag"] or "").split(", ") if t != "local"] == [t for t in (x["tag"] or "").split(", ")
                                                                             if t], (x, y)
    ra, rb = np.array(a["received"]["per_head"], float), np.array(b["received"]["per_head"], float)
    np.testing.assert_allclose(rb, ra, rtol=1e-5, atol=1e-6, equal_nan=True)
    assert b["summary"]["sinks"] == 4 and b["shape"]["keys"] == 300


def test_summary_pictures_spans_and_sorting(llama_folder: Path, tmp_path: Path) -> None:
    needle = "the secret code is magic blue"
    path = tmp_path / "s.safetensors"
    assert invoke("capture", llama_folder, "--text", _text(600, needle), "-o", path, "--summary", "--pool", "32",
                  "--rows", "0,-1").exit_code == 0
    out = invoke("inspect", path, "--png", tmp_path / "grid.png", "--received-png", tmp_path / "rec.png",
                 "--map-png", tmp_path / "rows.png", "--span-text", f"needle={needle}", "--span", "start=1:50",
                 "--sort", "sink_mass", "--top", "3", "--json")
    assert out.exit_code == 0, out.stderr
    doc = json.loads(out.stdout)
    sinks = [r["sink_mass"] for r in doc["head_stats"]]
    assert len(sinks) == 3 and sinks == sorted(sinks, reverse=True)
    spans = doc["spans"]
    assert spans["needle"]["end"] - spans["needle"]["start"] == 6 and spans["start"]["start"] == 1
    assert np.array(spans["needle"]["rows"]).shape == (2, 4, 2)  # [layers, heads, chosen rows]
    from PIL import Image

    for name in ("grid.png", "rec.png", "rows.png"):
        with Image.open(tmp_path / name) as im:
            assert im.size[0] > 300 and len(set(im.convert("L").getdata())) > 10, name


def test_generate_under_a_summary_keeps_every_decode_row_and_token(llama_folder: Path, tmp_path: Path) -> None:
    """--generate with --summary keeps every row that decodes a token (the prompt's last row, even with --rows
    none, and each step's) and every generated token, the last one too (generated_ids: no forward runs over it):
    the rows equal the eager model's own weights of the same generation, the tokens its own. (The scores of a
    random model are zeros; tests/test_real_models.py scores SmolLM2's retrieval heads.)"""
    import transformers

    from attnviz.capturefile import open_capture
    from attnviz.inspection.summary import decode_rows, read_summary

    text = _text(200, "the secret code is magic blue")
    path = tmp_path / "g.safetensors"
    done = invoke("capture", llama_folder, "--text", text, "-o", path, "--summary", "--generate", "4", "--rows", "none")
    assert done.exit_code == 0, done.stderr
    with open_capture(path) as (raw, capture):
        read = read_summary(raw, capture, "layers")
        assert capture.metadata["generated"] and len(capture.metadata["generated"][0]) == 4
    rows, tokens = decode_rows(read)
    model = transformers.AutoModelForCausalLM.from_pretrained(llama_folder, attn_implementation="eager").eval()
    tok = transformers.AutoTokenizer.from_pretrained(llama_folder)
    ids = tok(text, return_tensors="pt")["input_ids"]
    p = ids.shape[1]
    with torch.no_grad():
        gen = model.generate(ids, max_new_tokens=4, do_sample=False, pad_token_id=0)
        attn = model(gen, output_attentions=True).attentions
    np.testing.assert_array_equal(read.generated_ids, gen[:, p:].numpy())
    np.testing.assert_array_equal(tokens, gen[:, p:].numpy())
    assert rows.shape == (2, 1, 4, 4, p + 3)
    for li in range(2):
        for t in range(4):  # the row that generates token t is position p - 1 + t
            np.testing.assert_allclose(rows[li, 0, :, t, :p + t], attn[li][0, :, p - 1 + t, :p + t].numpy(), atol=2e-6)
            assert not rows[li, 0, :, t, p + t:].any()
    shown = invoke("inspect", path, "--needle", "the secret code is magic blue", "--json")
    doc = json.loads(shown.stdout)
    assert doc["retrieval"]["decode_rows"] == 4 and np.array(doc["retrieval"]["scores"]).shape == (2, 4)
    # a random model's answer repeats none of the needle: no score is given, and the warning says why
    # (tests/test_generation_text.py)
    assert doc["retrieval"]["recall"] == [0.0] and "cannot mean anything" in shown.stderr


@pytest.mark.parametrize("args, message", [
    (["--summary", "--rows", "5000"], "--rows 5000: outside the sequence"),
    (["--summary", "--pool", "0"], "--pool"),
    (["--pool", "8"], "--pool goes with --summary"),
    (["--summary", "--no-weights"], "drop --no-weights"),
    (["--max-file", "1K"], "--summary"),
])
def test_capture_bad_summary_input(llama_folder: Path, tmp_path: Path, args: list[str], message: str) -> None:
    out = tmp_path / "x.safetensors"
    done = invoke("capture", llama_folder, "--text", _text(50), "-o", out, *args)
    assert done.exit_code in (1, 2) and message in done.stderr, done.stderr
    assert not out.exists() and not list(tmp_path.iterdir())  # nothing written, nothing staged left behind


def test_inspect_bad_summary_input(llama_folder: Path, tmp_path: Path) -> None:
    path = tmp_path / "s.safetensors"
    assert invoke("capture", llama_folder, "--text", _text(80), "-o", path, "--summary").exit_code == 0
    for args, message in ((["--span", "a=70:900"], "outside the sequence"), (["--span", "oops"], "NAME=START:END"),
                          (["--span-text", "n=magic purple"], "do not spell"),
                          (["--needle", "the"], "--generate"),
                          (["--stats-png", tmp_path / "x.png", "--stat", "induction"], "head table has entropy"),
                          (["--batch", "3"], "--batch 3")):
        done = invoke("inspect", path, *args)
        assert done.exit_code == 2 and message in done.stderr, (args, done.stderr)
    done = invoke("rollout", path)
    assert done.exit_code in (1, 2) and "summar" in done.stderr, done.stderr


def test_inspect_model_chooses_the_summary_when_weights_would_not_fit(llama_folder: Path, tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    from attnviz.capturing import folder

    monkeypatch.setattr(folder, "MAX_FILE", 2**16)
    done = invoke("inspect", "--model", llama_folder, "--text", _text(100), "--json")
    assert done.exit_code == 0, done.stderr
    assert "captured a summary instead" in done.stderr and "summary" in json.loads(done.stdout)


def test_inspect_of_a_no_weights_capture_summarises_its_q_and_k(llama_folder: Path, tmp_path: Path) -> None:
    """--no-weights keeps q, k and v: inspect computes the summary from them (NumPy) instead of refusing, equal
    to the summary the capture computes where the model runs."""
    args = ["--text", _text(150), "--text", _text(90)]
    qk, summary = tmp_path / "qk.safetensors", tmp_path / "summary.safetensors"
    assert invoke("capture", llama_folder, *args, "-o", qk, "--no-weights").exit_code == 0
    assert invoke("capture", llama_folder, *args, "-o", summary, "--summary").exit_code == 0
    a = json.loads(invoke("inspect", qk, "--json").stdout)
    b = json.loads(invoke("inspect", summary, "--json").stdout)
    assert a["summary"]["computed_from"] == "q and k"
    for x, y in zip(a["head_stats"], b["head_stats"]):
        for name in ("entropy", "entropy_norm", "max", "sink_mass", "local_mass", "distance", "first", "last"):
            assert x[name] == pytest.approx(y[name], rel=1e-5, abs=1e-6), name
    np.testing.assert_allclose(np.array(a["received"]["per_head"], float), np.array(b["received"]["per_head"], float),
                               rtol=1e-5, atol=1e-7, equal_nan=True)


#: ``attnviz ARGS`` in a fresh process; with ``no-torch`` first, torch cannot be imported there (as where it is not
#: installed): a --no-weights capture is then summarised by NumPy (``attnviz.summarystats.summarise``)
WITHOUT_TORCH = """
import sys
if sys.argv[1] == "no-torch":
    sys.modules["torch"] = None  # import torch raises ImportError
from attnviz.cli.console import run
run(sys.argv[2:])
"""


def test_a_no_weights_capture_is_summarised_alike_with_and_without_torch(llama_folder: Path, tmp_path: Path) -> None:
    """inspect --json of a --no-weights capture in a process where torch cannot be imported (NumPy computes the
    summary) and in one where it can (the torch blocks): the same head table, received attention, pooled maps
    and chosen rows, the head table that of the same run's exact weights, and nothing on stderr but the line
    that says what was read (torch warned there of the file's read-only arrays)."""
    import subprocess
    import sys

    args = ["--text", _text(150), "--text", _text(90)]
    qk, exact = tmp_path / "qk.safetensors", tmp_path / "exact.safetensors"
    assert invoke("capture", llama_folder, *args, "-o", qk, "--no-weights").exit_code == 0
    assert invoke("capture", llama_folder, *args, "-o", exact).exit_code == 0
    docs = {}
    for mode in ("no-torch", "torch"):
        done = subprocess.run([sys.executable, "-c", WITHOUT_TORCH, mode, "inspect", str(qk), "--json"],
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, (mode, done.stderr)
        lines = done.stderr.splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"inspect: {qk}: summaries of 2 sites"), (mode, done.stderr)
        docs[mode] = json.loads(done.stdout)
    numpy_doc, torch_doc = docs["no-torch"], docs["torch"]
    assert numpy_doc["summary"]["computed_from"] == "q and k"
    for x, y in zip(numpy_doc["head_stats"], torch_doc["head_stats"], strict=True):
        assert x.keys() == y.keys()
        for name, value in x.items():
            assert value == (pytest.approx(y[name], rel=1e-5, abs=1e-6) if isinstance(value, float) else y[name]), name
    for key in ("received", "pooled", "rows"):
        np.testing.assert_allclose(_numbers(numpy_doc[key]), _numbers(torch_doc[key]), rtol=1e-5, atol=1e-6,
                                   err_msg=key)
    weights = json.loads(invoke("inspect", exact, "--json").stdout)
    for x, y in zip(numpy_doc["head_stats"], weights["head_stats"], strict=True):
        for name in ("entropy", "entropy_norm", "max", "distance", "diagonal", "previous", "first", "last"):
            assert x[name] == pytest.approx(y[name], rel=1e-4, abs=1e-6), name


def _numbers(doc: object) -> np.ndarray:
    """Every number of a JSON value, in order (None as NaN)."""
    if isinstance(doc, dict):
        return np.concatenate([_numbers(v) for v in doc.values()] or [np.zeros(0)])
    if isinstance(doc, list):
        return np.concatenate([_numbers(v) for v in doc] or [np.zeros(0)])
    if isinstance(doc, bool) or isinstance(doc, str):
        return np.zeros(0)
    return np.array([np.nan if doc is None else float(doc)])


def _retrieval_read(ids: np.ndarray, last: np.ndarray, step: np.ndarray, generated: np.ndarray | None):
    from attnviz.inspection.summary import SummaryRead

    layers, b, h, _, lq = last.shape
    rows = {name: np.zeros((layers, b, h, lq)) for name in PER_ROW}
    rows["entropy"][:] = 1.0
    return SummaryRead("x", "layers", ["layers.0"], {}, rows, np.ones((layers, b, lq), np.int64),
                       np.zeros((layers, b, h, lq)), np.ones((layers, b, lq), np.int64), np.zeros((layers, b, h, 1, 1)),
                       np.zeros((layers, b, h, 1, 1)), [0, lq], [0, lq], np.ones((b, lq), bool), last, [lq - 1], step,
                       None, None, ids, generated_ids=generated)


def test_retrieval_score_counts_distinct_needle_positions_per_entry() -> None:
    """Wu et al.'s score: a step copies when its top key lies in the needle and holds the token generated; an
    entry's score is the distinct needle positions copied over the needle's length (a position copied twice
    counts once: at most 1); each batch entry is scored with its own needle span, then the entries averaged.
    Every step counts, the prompt's last row and the last generated token (held in generated_ids only) too."""
    from attnviz.inspection.summary import Span, retrieval_scores

    lq, n = 6, 3  # a 6-token prompt, 3 generated tokens: rows = the prompt's last row and 2 steps
    # entry 0: the needle [8, 9] at 2:4; entry 1 (left-padded by one): the needle at 3:5
    ids = np.array([[5, 7, 8, 9, 4, 2, 8, 9], [0, 5, 7, 8, 9, 4, 8, 8]])
    generated = np.array([[8, 9, 8], [8, 8, 9]])  # the last token (index 2) is in no forward's inputs
    lk = lq + n - 1
    # the key each (entry, head) attends to, row by row: the prompt's last row, then the 2 steps
    tops = {
        (0, 0): (2, 3, 2),  # key 2 (8) generating 8, key 3 (9) generating 9, key 2 (8) again generating 8: 2 distinct
        (0, 1): (2, 2, 2),  # key 2 three times; only rows generating 8 copy: one distinct position
        (1, 0): (3, 3, 4),  # (its needle at 3:5) key 3 (8) generating 8 twice, key 4 (9) at the last step generating 9
        (1, 1): (2, 1, 1),  # key 2 (7, outside the needle), then key 1 (5): nothing
    }
    last = np.zeros((1, 2, 2, 1, lq))
    step = np.zeros((1, 2, 2, n - 1, lk))
    for (entry, head), (first, *steps) in tops.items():
        last[0, entry, head, 0, first] = 1
        for row, key in enumerate(steps):
            step[0, entry, head, row, key] = 1
    got = retrieval_scores(_retrieval_read(ids, last, step, generated), [Span("needle", 2, 4), Span("needle", 3, 5)])
    assert got.rows == n
    np.testing.assert_allclose(got.per_entry[:, 0], [[2 / 2, 1 / 2], [2 / 2, 0.0]])
    np.testing.assert_allclose(got.scores, [[1.0, 0.25]])
    np.testing.assert_allclose(got.recall, [1.0, 1.0])
    assert got.ranked() == [(0, 0, 1.0), (0, 1, 0.25)]
    # scored with entry 0's span for both (the old way), entry 1's head 0 would copy nothing at 3:5's place
    wrong = retrieval_scores(_retrieval_read(ids, last, step, generated), [Span("needle", 2, 4)] * 2)
    assert wrong.per_entry[1, 0, 0] != got.per_entry[1, 0, 0]
    # without generated_ids (a file written before them) the last step's token is unknown: that step cannot copy
    older = retrieval_scores(_retrieval_read(ids, last, step, None), [Span("needle", 2, 4), Span("needle", 3, 5)])
    np.testing.assert_allclose(older.per_entry[1, 0, 0], 1 / 2)


def test_compare_two_summaries_and_refusals(llama_folder: Path, tmp_path: Path) -> None:
    """A --no-weights capture summarised from q and k against the summary of the same run: within float32
    rounding (--atol passes); against a summary of another input, or exact weights: one line, exit 1 or 2.
    view opens the summary (its pooled maps)."""
    text = _text(120)
    qk, summary, exact = tmp_path / "qk.safetensors", tmp_path / "s.safetensors", tmp_path / "e.safetensors"
    for out, extra in ((qk, ["--no-weights"]), (summary, ["--summary"]), (exact, [])):
        assert invoke("capture", llama_folder, "--text", text, "-o", out, *extra).exit_code == 0
    done = invoke("compare", qk, summary, "--atol", "1e-5", "--json")
    assert done.exit_code == 0, done.stderr
    doc = json.loads(done.stdout)
    assert doc["check"]["passed"] and max(doc["max_abs_diff"].values()) < 1e-5
    other = tmp_path / "o.safetensors"
    assert invoke("capture", llama_folder, "--text", _text(60), "-o", other, "--summary").exit_code == 0
    done = invoke("compare", summary, other)
    assert done.exit_code == 1 and "same input" in done.stderr
    done = invoke("compare", summary, exact)
    assert done.exit_code == 2 and "holds attention weights" in done.stderr
    # view reads a summary (tests/test_view_summary.py): the pooled maps of the model's own summary
    from attnviz.cli.commands.view import view
    from attnviz.inspection.options import InspectOptions
    from attnviz.render.options import FigureOptions

    model = view(InspectOptions(weights=str(summary)), FigureOptions(), run=False).model
    with safe_open(str(summary), "np") as f:
        np.testing.assert_array_equal(model.map()[0], f.get_tensor("layers.0.pooled_mean")[0, 0])
    assert model.rollout_refused() == "a summary keeps no full weights; rollout needs them"


def test_the_tensorflow_blockwise_statistics_follow_the_same_definition() -> None:
    """The variants' per-row statistics, computed by TensorFlow a block of rows at a time (a long scaled
    dot-product run under --max-memory), equal the summary's on the same q and k: entropy, largest weight and
    its key, over a causal map."""
    from attnviz.summarytorch import summarise as in_torch

    rng = np.random.default_rng(3)
    lq, d = 300, 16
    q, k = rng.normal(size=(lq, d)).astype(np.float32), rng.normal(size=(lq, d)).astype(np.float32)
    v = rng.normal(size=(lq, d)).astype(np.float32)
    computed = attnviz.scaled(q, k, v, causal=True, max_memory="1M")
    ours = in_torch(torch.tensor(q)[None, None], torch.tensor(k)[None, None], scale=d ** -0.5,
                    settings=SummarySettings(rows=None), parts=MaskParts(causal=True), row_budget=4096)
    np.testing.assert_allclose(ours["entropy"][0, 0].numpy(), computed.stats["entropy"], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(ours["max"][0, 0].numpy(), computed.stats["max"], rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(ours["argmax"][0, 0].numpy(), computed.stats["argmax"])


def test_a_family_the_blocks_cannot_reproduce_is_refused(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A family whose eager attention does something the summary's scores do not (here: queries doubled) is
    refused in one line naming its attention class; nothing is written."""
    from transformers.models.llama import modeling_llama

    from attnviz.errors import InputError

    model, _ = _pair("LlamaConfig", dict(num_key_value_heads=2))
    original = modeling_llama.eager_attention_forward

    def odd(module, query, key, value, mask, **kwargs):  # noqa: ANN001, ANN003, ANN202
        return original(module, query * 2, key, value, mask, **kwargs)

    monkeypatch.setattr(modeling_llama, "eager_attention_forward", odd)
    ids, mask = _ids()
    with pytest.raises(InputError, match="LlamaAttention: attnviz cannot reproduce"):
        with torch.no_grad(), attnviz.capture(model, path=tmp_path / "s.safetensors", summary=True):
            model(ids, attention_mask=mask)
    assert not list(tmp_path.iterdir())


def test_a_family_the_check_cannot_run_is_refused(llama_folder: Path, monkeypatch: pytest.MonkeyPatch,
                                                  tmp_path: Path) -> None:
    """A family whose eager attention cannot take the check's few rows (here: it raises unless it is handed every
    row) is refused in one line naming its attention class and what to do instead: a summary is never written
    unchecked. Nothing is written."""
    from transformers.models.llama import modeling_llama

    original = modeling_llama.eager_attention_forward

    def whole_rows_only(module, query, key, value, mask, **kwargs):  # noqa: ANN001, ANN003, ANN202
        if query.shape[-2] != key.shape[-2]:
            raise RuntimeError("this family's eager attention takes every row\nor none")
        return original(module, query, key, value, mask, **kwargs)

    monkeypatch.setattr(modeling_llama, "eager_attention_forward", whole_rows_only)
    out = tmp_path / "s.safetensors"
    done = invoke("capture", llama_folder, "--text", _text(40), "-o", out, "--summary")
    assert done.exit_code == 1, (done.exit_code, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "error: LlamaAttention: attnviz cannot check" in lines[0], done.stderr
    assert "without --summary" in lines[0], lines[0]
    assert not list(tmp_path.iterdir())


def test_each_kind_of_layer_is_checked(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Gemma 2's sliding-window and global layers are one class (``Gemma2Attention``): each kind is checked the
    first time it is met. An eager function that the blocks do not reproduce on the global layers only (queries
    doubled where there is no window) is refused at the first global layer, after the sliding one passed."""
    from transformers.models.gemma2 import modeling_gemma2

    from attnviz.errors import InputError

    config_name, extra = FAMILIES["gemma2 (softcap, windows)"]
    model, _ = _pair(config_name, extra)
    assert model.config.layer_types == ["sliding_attention", "full_attention"]
    original = modeling_gemma2.eager_attention_forward
    seen = []

    def odd_global_layers(module, query, key, value, mask, **kwargs):  # noqa: ANN001, ANN003, ANN202
        seen.append(kwargs.get("sliding_window"))
        if kwargs.get("sliding_window") is None:
            query = query * 2
        return original(module, query, key, value, mask, **kwargs)

    monkeypatch.setattr(modeling_gemma2, "eager_attention_forward", odd_global_layers)
    ids, mask = _ids()
    with pytest.raises(InputError, match=r"Gemma2Attention: attnviz cannot reproduce .*layers\.1"):
        with torch.no_grad(), attnviz.capture(model, path=tmp_path / "s.safetensors", summary=True):
            model(ids, attention_mask=mask)
    assert 5 in seen and None in seen  # both kinds ran through the family's eager function
    assert not list(tmp_path.iterdir())


def test_the_softcap_at_work(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Gemma 2 with weights drawn large (scores of several units against a softcap of 5): ``tanh(s/c)*c`` differs
    from ``s`` by far more than the tolerances, the summary's statistics still equal the model's own eager
    weights, and scores without the softcap are refused by the check."""
    from transformers.models.gemma2 import modeling_gemma2

    from attnviz.capturing import hf
    from attnviz.errors import InputError

    config_name, extra = FAMILIES["gemma2 (softcap, windows)"]
    model, eager = _pair(config_name, {**extra, "initializer_range": 0.5})
    ids, mask = _ids()
    original = modeling_gemma2.eager_attention_forward
    scores = []

    def spy(module, query, key, value, attention_mask, **kwargs):  # noqa: ANN001, ANN003, ANN202
        k = modeling_gemma2.repeat_kv(key, module.num_key_value_groups)
        scores.append((query @ k.transpose(2, 3) * kwargs["scaling"], kwargs["softcap"]))
        return original(module, query, key, value, attention_mask, **kwargs)

    with torch.no_grad(), monkeypatch.context() as patch:
        patch.setattr(modeling_gemma2, "eager_attention_forward", spy)
        ref = eager(ids, attention_mask=mask, output_attentions=True).attentions
    real = mask.bool()[:, None, :, None] & mask.bool()[:, None, None, :]
    for s, cap in scores:
        assert cap == 5.0
        capped = torch.tanh(s / cap) * cap
        assert float((capped - s).abs()[real.expand_as(s)].max()) > 1e-3  # the softcap changes the scores

    path = tmp_path / "sum.safetensors"
    with torch.no_grad(), attnviz.capture(model, path=path, summary=True, **SETTINGS):
        model(ids, attention_mask=mask)
    for i, (site, window) in enumerate([("layers.0", 5), ("layers.1", None)]):
        keep = _keep_of(mask.numpy(), 13, 13, True, window)
        want = oracle(ref[i].double().numpy(), keep, mask.numpy().astype(bool), sinks=2, local=3, pool=4,
                      rows=[0, 5, 12])
        _assert_summary(_summary(path, site), want, f"gemma2 softcap {site}")

    scoring = hf._scoring

    def without_softcap(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        scale, _, sinks, bias = scoring(*args, **kwargs)
        return scale, None, sinks, bias

    monkeypatch.setattr(hf, "_scoring", without_softcap)
    with pytest.raises(InputError, match="Gemma2Attention: attnviz cannot reproduce"):
        with torch.no_grad(), attnviz.capture(model, path=tmp_path / "x.safetensors", summary=True):
            model(ids, attention_mask=mask)
    assert not (tmp_path / "x.safetensors").exists()


def test_summary_head_table_with_no_table_and_an_order(llama_folder: Path, tmp_path: Path) -> None:
    """--no-table with --sort or --top keeps the head table that was asked for (a summary's one table)."""
    path = tmp_path / "s.safetensors"
    assert invoke("capture", llama_folder, "--text", _text(40), "-o", path, "--summary").exit_code == 0
    assert invoke("inspect", path, "--no-table").stdout == ""
    out = invoke("inspect", path, "--sort", "entropy", "--top", "2", "--no-table")
    assert out.exit_code == 0, out.stderr
    text = " ".join(out.stdout.split())
    assert "by entropy" in text and "showing 2 of" in text, text
    # a column the file cannot give: the retrieval scores need --needle (and --generate); another statistic is
    # named among those the table has
    out = invoke("inspect", path, "--sort", "retrieval")
    assert out.exit_code == 2 and "--needle" in out.stderr and "--generate" in out.stderr, out.stderr
    assert len(out.stderr.strip().splitlines()) == 1 and out.stdout.strip().count("\n") == 0
    out = invoke("inspect", path, "--sort", "induction")
    assert out.exit_code == 2 and "sink_mass" in out.stderr and "retrieval" not in out.stderr, out.stderr

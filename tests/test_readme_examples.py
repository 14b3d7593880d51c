"""Docs that run: every example command line of the documentation (the pages of docs/, the README's
tour among them), run as written against sample files.

How the lines are found (``readme_examples``): each page is read line by line as Markdown (the recipes
and model families pages are left out: tests/test_recipes.py and tests/test_families.py run those with
a model); every line of the README's tour is one of the pages' examples (a test says so).

* Fenced blocks (```` ``` ````) are tracked; lines inside a fence tagged ``sh``, ``bash`` or ``shell``
  are candidates. The first fenced block of the file (the opening install lines, which CI runs) and
  every block of the ``## Recipes`` section (run by tests/test_recipes.py after their Python part)
  are skipped.
* Outside fences, an indented code block is a run of lines indented by four spaces or more that
  starts after a blank line (CommonMark: an indented line cannot interrupt a paragraph).
* Of those lines, every one that starts with ``attnviz `` is an example (a line ending in ``\\``
  continues on the next line of its block).

Each example becomes one test. It runs with ``typer``'s ``CliRunner`` and ``attnviz.cli.app`` (the
argv of ``shlex`` without the leading ``attnviz``) in one folder, built once per session by the
``folder`` fixture, that holds every file the examples name, with shapes that fit each command. A
shell pipe or redirection (``| jq ...``, ``> file``) runs the attnviz part only, and stdout is checked
for what the rest of the line expects (JSON for ``jq`` and for a ``.json`` file, the ``jq`` path
present). Each run must exit 0 (or the code of ``EXPECTED_EXIT``, for an example showing a check
failing) with no traceback, print valid JSON under ``--json``, and write the files it names.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
import typer
from typer.testing import CliRunner

from attnviz.cli import app
from tests.conftest import ROOT, SAMPLES

runner = CliRunner()

FENCE = re.compile(r"^(```+|~~~+)\s*([\w+-]*)")
SHELL_TAGS = {"sh", "bash", "shell"}

# README lines that cannot run here, with the reason. Keep it as short as possible.
SKIP: dict[str, str] = {
    "attnviz serve --detach": "starts a background worker in the user's runtime folder; tests/test_serve.py starts "
                              "and stops workers in private folders",
    "attnviz batch --each 'acts/*.npz' -- inspect {} --png out/{stem}.png --json-file out/{stem}.json":
        "output names are placeholders; tests/test_scale_out.py runs the README's file maps in folders of their own",
    "attnviz batch --each 'run1/*.npy' -- compare {} run2/{name} --atol 1e-5 --json-file diffs/{stem}.json":
        "output names are placeholders; tests/test_scale_out.py runs the README's file maps in folders of their own",
}

# README lines that demonstrate a check failing, with the exit code the README promises.
EXPECTED_EXIT: dict[str, int] = {}

# options naming a file the command writes
OUTPUT_OPTIONS = {"--png", "--map-png", "--stats-png", "--overlay-png", "--html", "--json-file", "--save-weights",
                  "--save-output", "--save-params", "--heads-map"}


def readme_examples(text: str | None = None, first_fence_is_install: bool = True) -> list[str]:
    """Every ``attnviz ...`` line in the code blocks of a page (default the README), in order (see the module
    docstring); the README's first fenced block (the install commands) is not an example."""
    if text is None:
        text = (ROOT / "README.md").read_text()
    found: list[str] = []
    continued = False  # the last example ended in a backslash

    def take(line: str) -> None:
        nonlocal continued
        stripped = line.strip()
        if continued:
            found[-1] = found[-1][:-1].rstrip() + " " + stripped
        elif stripped.startswith("attnviz "):
            found.append(stripped)
        else:
            return
        continued = found[-1].endswith("\\")

    fence: str | None = None  # the fence that opened the current fenced block
    fence_is_shell = False
    fenced_blocks = 0
    in_recipes = False
    previous_blank = True
    in_indented = False
    for line in text.splitlines():
        if fence is None:
            heading = re.match(r"^(#{1,6}) ", line)
            if heading and len(heading.group(1)) <= 2:
                in_recipes = line.startswith("## Recipes")
            opening = FENCE.match(line)
            if opening:
                fence = opening.group(1)
                fenced_blocks += 1
                fence_is_shell = opening.group(2) in SHELL_TAGS and (fenced_blocks > 1 or not first_fence_is_install) \
                    and not in_recipes
                in_indented = False
                previous_blank = False
                continue
            indented = line.startswith("    ") and line.strip() != ""
            in_indented = indented and (previous_blank or in_indented)
            previous_blank = line.strip() == ""
            if in_indented and not in_recipes:
                take(line)
            elif not in_indented:
                continued = False
        else:
            if line.strip().startswith(fence) and line.strip().strip(fence[0]) == "":
                fence = None
                continued = False
                previous_blank = False
                continue
            if fence_is_shell:
                take(line)
    return found


def docs_examples() -> list[str]:
    """The examples of every docs page but the recipes and model families (their own tests run those, in
    folders with a model), each once."""
    from tests.docs_text import pages

    found: list[str] = []
    for path in pages():
        if path.name in ("recipes.md", "model-families.md"):
            continue
        for line in readme_examples(path.read_text(), first_fence_is_install=False):
            if line not in found:
                found.append(line)
    return found


EXAMPLES = docs_examples()
# the long-context page's retrieval example runs a real LLM (SmolLM2, converted from its GGUF file): the real-model
# tier runs those lines as the page prints them and checks the page's table (tests/test_real_models.py)
SKIP.update({line: "needs SmolLM2: tests/test_real_models.py runs it and checks the page's table" for line in EXAMPLES
             if (" smollm2 " in line and not line.startswith("attnviz ablate "))
             or line.startswith("attnviz inspect needle.safetensors --needle \"The best")})
# attnviz ablate's examples run SmolLM2 on needles of 2,000 tokens (--rank: half an hour on 2 cores): the same command
# lines run on a tiny Llama in tests/test_ablation.py, and tests/test_real_models.py checks SmolLM2's key-value head
# 18:2 against the model's own eager attention
SKIP.update({line: "runs SmolLM2 on 2,000-token needles: tests/test_ablation.py runs these command lines on a tiny "
             "model, tests/test_real_models.py checks SmolLM2" for line in EXAMPLES
             if line.startswith("attnviz ablate smollm2 ")})


def short(line: str, width: int = 70) -> str:
    line = line[len("attnviz "):]
    return line if len(line) <= width else line[: width - 3] + "..."


def split_shell(line: str) -> tuple[list[str], list[str]]:
    """(argv of the attnviz command, the rest of the line from the first pipe or redirection)."""
    lexer = shlex.shlex(line, posix=True, punctuation_chars="|&;<>")
    lexer.whitespace_split = True
    lexer.commenters = "#"
    tokens = list(lexer)
    for i, token in enumerate(tokens):
        if token in {"|", ">", ">>", "&&", ";", "<"}:
            return tokens[:i], tokens[i:]
    return tokens, []


# ---------------------------------------------------------------- the sample folder


def softmax(x: np.ndarray, keep: np.ndarray) -> np.ndarray:
    s = np.where(keep, x, -np.inf)
    e = np.exp(s - s.max(-1, keepdims=True))
    e = np.where(keep, e, 0.0)
    return e / e.sum(-1, keepdims=True)


def invoke(argv: list[str]):
    r = runner.invoke(app, argv)
    assert r.exit_code == 0, f"making samples: attnviz {' '.join(argv)}\n{r.stdout}\n{r.stderr}"
    return r


#: the README's inputs as made once in this process (``folder`` hands each module a copy of them)
_MADE: dict[str, Path] = {}


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    """Every file the README's examples read, deterministic, small, with shapes that fit each command: a copy of
    its own for each module that asks (the examples write their outputs into it). They are made once in a
    process (``make_inputs``: models built and captured, ~6 s of CPU besides the imports), and the modules that
    read them (this one, tests/test_api.py's examples, tests/test_long_paths.py) run on one xdist worker
    (tests/conftest.py, SHARED_UNITS)."""
    if "inputs" not in _MADE:
        _MADE["inputs"] = make_inputs(tmp_path_factory.mktemp("readme-inputs"))
    d = tmp_path_factory.mktemp("readme")
    shutil.copytree(_MADE["inputs"], d, dirs_exist_ok=True)
    return d


def make_inputs(d: Path) -> Path:
    """Write the README's inputs into the folder ``d``."""
    rng = np.random.default_rng(2024)

    def save(name: str, arr) -> None:
        np.save(d / name, np.asarray(arr))

    def normal(*shape: int) -> np.ndarray:
        return rng.normal(size=shape).astype(np.float32)

    # the bundled samples, under their own folder name too
    shutil.copytree(SAMPLES, d / "sample_inputs", ignore=shutil.ignore_patterns("*.py", "__pycache__"))
    tokens = (SAMPLES / "tokens.txt").read_text()  # "the cat sat on the mat ." : 7 tokens
    (d / "tokens.txt").write_text(tokens)
    n_tok = len(tokens.split())
    seed = np.load(SAMPLES / "seed_example.npz")

    # q, k, v as forward hooks capture them, [B, L, H, d] (scaled --layout); with L = H the other
    # commands read the same files as [batch, heads, L, d].
    b, length, d_head = 2, 6, 4
    for name in "qkv":
        save(f"{name}.npy", normal(b, length, length, d_head))
    padding = np.ones((b, length), np.int8)
    padding[1, :2] = 0  # left padding, as a tokenizer's attention_mask
    save("padding.npy", padding)
    pad = np.ones((b, length), np.int8)
    pad[1, -2:] = 0  # right padding
    save("pad.npy", pad)
    keep = np.tril(np.ones((length, length), np.int8)) | (rng.random((length, length)) < 0.3)
    save("keep.npy", keep.astype(np.int8))
    np.savez(d / "acts.npz", q=seed["q"], k=seed["k"], v=seed["v"])  # the seed example as one bundle

    # one sequence [B, L, d] per token of tokens.txt
    save("x.npy", normal(b, n_tok, 16))
    save("states.npy", normal(b, n_tok, 8))
    save("dec.npy", normal(b, 5, 16))
    save("enc.npy", normal(b, 10, 16))
    save("premise.npy", normal(b, 6, 8))
    save("hypothesis.npy", normal(b, 4, 8))
    (d / "p.txt").write_text("a man plays the guitar outside\n".replace(" ", "\n"))
    (d / "h.txt").write_text("someone is making music\n".replace(" ", "\n"))
    save("nodes.npy", normal(5, 8))
    graph = np.zeros((5, 5), np.int8)
    for i, j in [(0, 1), (1, 2), (2, 3), (3, 4), (4, 0), (0, 2)]:
        graph[i, j] = graph[j, i] = 1
    save("graph.npy", graph)
    save("doc.npy", normal(b, 3, 5, 8))  # [batch, n_sent, n_word, d]
    words = np.ones((b, 3, 5), np.int8)
    words[0, 2, 3:] = 0
    words[1, 1, 2:] = 0
    words[1, 2, :] = 0  # a padded sentence
    save("words.npy", words)
    save("context.npy", normal(b, 9, 6))
    save("question.npy", normal(b, 4, 6))
    (d / "ctx.txt").write_text("\n".join("the band played on a warm evening in june".split()) + "\n")
    (d / "q.txt").write_text("\n".join("when did they play".split()) + "\n")
    long = 1024
    for name in ("q32k", "k32k", "v32k"):
        save(f"{name}.npy", normal(long, 16))

    # attention weights a model saved: two layers of [batch, heads, L, L], causal; batch entry 1 is
    # left-padded, its padded rows spread over the causal keys as a model's masked row may
    heads = 2
    attention_mask = np.ones((b, n_tok), np.int8)
    attention_mask[1, :2] = 0
    save("attention_mask.npy", attention_mask)
    causal = np.tril(np.ones((n_tok, n_tok), bool))
    allowed = causal & attention_mask[:, None, None, :].astype(bool)
    allowed = allowed | (~allowed.any(-1, keepdims=True) & causal)  # fully masked rows: uniform causal
    layers = [softmax(3 * rng.normal(size=(b, heads, n_tok, n_tok)), allowed).astype(np.float32) for _ in range(2)]
    np.savez(d / "attn.npz", *layers)
    np.savez(d / "grads.npz", *[normal(*layer.shape) for layer in layers])  # d(score)/d(weights), rollout --method grad
    save("ours.npy", layers[0])
    # generate()'s attentions of entry 0 as a dump of steps (keys STEP.LAYER: a prompt of 4, a row a step) and the
    # forward pass over the whole sequence it stitches into (compare --generation-a)
    forward = [layer[:1] for layer in layers]
    steps = {f"{s}.{li}": f[:, :, (slice(0, 4) if s == 0 else slice(3 + s, 4 + s)), :4 + s]
             for s in range(n_tok - 4) for li, f in enumerate(forward)}
    np.savez(d / "gen.npz", **steps)
    np.savez(d / "forward.npz", *forward)
    theirs = layers[0] * (1 + rng.normal(scale=1e-6, size=layers[0].shape))  # the same to float32 rounding
    save("theirs.npy", (theirs / theirs.sum(-1, keepdims=True)).astype(np.float32))

    # batch: the documentation's own jobs file
    section = (ROOT / "docs" / "commands" / "batch.md").read_text()
    jobs = [ln.strip() for ln in section.splitlines() if ln.strip().startswith('{"command"')]
    (d / "jobs.jsonl").write_text("\n".join(jobs) + "\n")

    # Keras: AdditiveAttention's own weights, and a saved model with a cross-attention layer
    from attnviz.device import tensorflow

    tensorflow()  # TensorFlow's start-up lines silenced, as attnviz does
    import keras

    additive = keras.layers.AdditiveAttention()
    q_in = np.load(d / "q.npy")
    additive([q_in, np.load(d / "v.npy"), np.load(d / "k.npy")])
    np.savez(d / "additive_layer.npz", **{w.path.split("/", 1)[1]: keras.ops.convert_to_numpy(w)
                                           for w in additive.weights})
    dec = keras.Input((None, 16), name="dec")
    enc = keras.Input((None, 16), name="enc")
    out = keras.layers.MultiHeadAttention(num_heads=2, key_dim=8, name="cross_attention")(dec, enc)
    keras.Model([dec, enc], out).save(d / "model.keras")

    # parameter files: --save-params of seeded runs
    quiet = ["--quiet", "--device", "cpu"]
    invoke(["general", *(str(d / f"{n}.npy") for n in "qkv"), "--seed", "1", "--save-params", str(d / "luong.npz"),
            *quiet])
    invoke(["multihead", str(d / "x.npy"), "--heads", "4", "--seed", "2", "--save-params", str(d / "mha.npz"),
            *quiet])
    invoke(["self", str(d / "x.npy"), "--seed", "3", "--save-params", str(d / "proj.npz"), *quiet])
    invoke(["pooling", str(d / "states.npy"), "--units", "8", "--seed", "4", "--save-params", str(d / "pool.npz"),
            *quiet])
    invoke(["local", str(d / "dec.npy"), str(d / "enc.npy"), str(d / "enc.npy"), "--mode", "local-p", "--window",
            "3", "--units", "8", "--seed", "5", "--save-params", str(d / "localp.npz"), *quiet])
    invoke(["structured", *(str(d / f"{n}.npy") for n in "qkv"), "--method", "crf", "--seed", "6",
            "--save-params", str(d / "crf.npz"), *quiet])
    invoke(["hierarchical", str(d / "doc.npy"), "--units", "8", "--seed", "7", "--save-params", str(d / "han.npz"),
            *quiet])
    invoke(["bidirectional", str(d / "context.npy"), str(d / "question.npy"), "--seed", "8", "--save-params",
            str(d / "bidaf.npz"), *quiet])
    _model_folder(d / "my-model")
    if (d / "my-model").is_dir():  # what `attnviz capture ./my-model ... -o run.safetensors` writes
        invoke(["capture", str(d / "my-model"), "--text", "The cat sat on the mat.", "--text", "A dog ran.", "-o",
                str(d / "run.safetensors")])
        _gradient_capture(d / "grads.safetensors")
        # docs/training.md: recordings a training kept (attnviz.keras.AttentionMonitor's keep=, a capture file an
        # epoch; tests/test_keras_monitor.py makes real ones), here two captures of the model on other texts
        for kept in ("runs/kept", "logs/kept"):
            (d / kept).mkdir(parents=True, exist_ok=True)
            for epoch, text in ((0, "A dog sat on the mat."), (19, "The dog ran to the cat.")):
                invoke(["capture", str(d / "my-model"), "--text", text, "-o",
                        str(d / kept / f"epoch_{epoch:06d}.safetensors")])
        for name in ("epoch_000000", "epoch_000019"):
            shutil.copy(d / "runs" / "kept" / f"{name}.safetensors", d / "runs" / f"{name}.safetensors")
        # corpus files (docs/corpus.md, docs/commands/merge.md): a whole run and two shards of a short text file
        (d / "corpus.txt").write_text("The cat sat on the mat.\nA dog ran.\n\nThe dog sat, the cat ran.\nThe cat ran.\n"
                                       "A dog sat on the mat.\n")
        invoke(["capture", str(d / "my-model"), "--text-file", str(d / "corpus.txt"), "--corpus", "-o",
                str(d / "heads.safetensors")])
        for i in range(3):
            invoke(["capture", str(d / "my-model"), "--text-file", str(d / "corpus.txt"), "--corpus", "--shard",
                    f"{i}/3", "-o", str(d / f"shard-{i}.safetensors")])
        invoke(["merge", *(str(d / f"shard-{i}.safetensors") for i in range(3)), "-o", str(d / "all.safetensors")])
        _long_context(d)
    _preset_folder(d / "bert-preset")
    return d


def _long_context(d: Path) -> None:
    """The long-context page's ./my-llama (a tiny Llama with a word-level tokenizer, benchmarks/models.py), its
    long.txt and haystack.txt (a needle inside), and the summaries its reading examples read."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from models import llama_folder, long_text

    llama_folder(d / "my-llama", layers=2, heads=4, kv_heads=2, hidden=32, positions=4096)
    (d / "long.txt").write_text(long_text(700, "the secret code is magic blue").replace(" . ", " .\n"))
    (d / "haystack.txt").write_text(long_text(300, "the secret code is magic blue"))
    invoke(["capture", str(d / "my-llama"), "--text", "@" + str(d / "long.txt"), "--summary", "-o",
            str(d / "long.safetensors")])
    invoke(["capture", str(d / "my-llama"), "--text", "@" + str(d / "haystack.txt"), "--summary", "--generate", "8",
            "-o", str(d / "needle.safetensors")])


def _preset_folder(path: Path) -> None:
    """A tiny KerasHub BERT and its WordPiece tokenizer saved by save_to_preset (the capture page's
    ./bert-preset), where keras-hub is installed."""
    try:
        import keras
        import keras_hub
    except ImportError:
        return

    keras.utils.set_random_seed(0)
    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *"the cat sat on mat a dog ran . ,".split()]
    keras_hub.models.BertBackbone(vocabulary_size=len(words), num_layers=2, num_heads=2, hidden_dim=8,
                                  intermediate_dim=8, max_sequence_length=16).save_to_preset(str(path))
    keras_hub.tokenizers.BertTokenizer(vocabulary=words).save_to_preset(str(path))


def _model_folder(path: Path) -> None:
    """A tiny BERT saved with a real WordPiece tokenizer (the capture examples' ./my-model), where PyTorch and
    transformers are installed."""
    try:
        import torch
        import transformers
    except ImportError:
        return
    path.mkdir()
    words = "the cat sat on mat a dog ran . ,".split()
    (path / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *words]) + "\n")
    tok = transformers.BertTokenizerFast(str(path / "vocab.txt"))
    torch.manual_seed(0)
    cfg = transformers.BertConfig(vocab_size=len(words) + 5, hidden_size=32, num_hidden_layers=2,
                                  num_attention_heads=4, intermediate_size=64)
    transformers.BertModel(cfg).save_pretrained(str(path))
    tok.save_pretrained(str(path))


def _gradient_capture(path: Path) -> None:
    """A capture with gradients (``attnviz capture --target next``) of a tiny Llama: rollout --method grad's
    example reads it."""
    import torch
    import transformers

    import attnviz

    cfg = transformers.LlamaConfig(vocab_size=50, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg).eval()
    with attnviz.capture(model, path=path, target="next"):
        model(torch.randint(0, 50, (2, 6)))


# ---------------------------------------------------------------- the tests


def jq_path(doc, expression: str):
    """The value of a plain jq path (``.a.b``) in ``doc``; other filters only need JSON."""
    if not re.fullmatch(r"(\.[A-Za-z_]\w*)+", expression):
        return doc
    for key in expression.split(".")[1:]:
        assert isinstance(doc, dict) and key in doc, f"jq {expression}: no key {key!r} in the document"
        doc = doc[key]
    return doc


def test_the_parser_finds_the_examples():
    synthetic = "\n".join([
        "# title", "```sh", "attnviz opening-block", "```", "text", "    attnviz not-code (a paragraph's line)",
        "", "    attnviz a", "    attnviz b | jq '.x'", "    {\"command\": \"scaled\"}", "", "## Commands",
        "```python", "attnviz in-python", "```", "```sh", "attnviz c --flag  # a comment", "```",
        "~~~bash", "attnviz d \\", "  --long-option", "~~~", "## Recipes", "", "    attnviz recipe-indented", "",
        "```sh", "attnviz recipe", "```", "## After", "", "    attnviz e", ""])
    assert readme_examples(synthetic) == ["attnviz a", "attnviz b | jq '.x'", "attnviz c --flag  # a comment",
                                          "attnviz d --long-option", "attnviz e"]
    assert split_shell("attnviz b x.npy --json | jq '.x.y'") == (["attnviz", "b", "x.npy", "--json"],
                                                                 ["|", "jq", ".x.y"])
    assert split_shell("attnviz c --flag  # a comment") == (["attnviz", "c", "--flag"], [])
    assert split_shell("attnviz batch j.jsonl --json > s.json") == (["attnviz", "batch", "j.jsonl", "--json"],
                                                                    [">", "s.json"])
    assert jq_path({"stats": {"entropy": [1]}}, ".stats.entropy") == [1]
    with pytest.raises(AssertionError):
        jq_path({"stats": {}}, ".stats.entropy")
    # the real documentation: the opening install lines and the recipes are left out
    assert len(EXAMPLES) >= 30
    assert not any(".venv" in line for line in EXAMPLES)
    assert EXAMPLES[0] == "attnviz scaled q.npy k.npy v.npy --png attn.png"


def test_every_command_has_a_readme_example():
    commands = typer.main.get_command(app).commands  # type: ignore[attr-defined]
    used = {split_shell(line)[0][1] for line in EXAMPLES}
    missing = sorted(set(commands) - used)
    assert not missing, f"commands with no example line in the documentation: {missing}"


def test_the_readme_tour_shows_examples_the_documentation_runs():
    """Every command line of the README is an example of a docs page (run here), or of the recipes and
    model families pages (run by their own tests)."""
    from tests.docs_text import page

    run_elsewhere = readme_examples(page("recipes.md"), first_fence_is_install=False) + \
        [line for line in page("model-families.md").splitlines() if line.startswith("attnviz ")]
    tour = readme_examples()
    assert len(tour) >= 6
    assert [line for line in tour if line not in EXAMPLES and line not in run_elsewhere] == []


def _globbed(argv: list[str], folder: Path) -> list[str]:
    """The arguments as the shell hands them over: a file pattern (``runs/*.safetensors``; not a key glob after
    ``:``) that matches files becomes those files, in order."""
    out: list[str] = []
    for arg in argv:
        if any(c in arg for c in "*?[") and ":" not in arg and not arg.startswith("-"):
            found = sorted(str(p.relative_to(folder)) for p in folder.glob(arg))
            if found:
                out.extend(found)
                continue
        out.append(arg)
    return out


@pytest.mark.parametrize("line", EXAMPLES, ids=[short(x) for x in EXAMPLES])
def test_readme_example_runs(line, folder, monkeypatch):
    if line in SKIP:
        pytest.skip(SKIP[line])
    monkeypatch.chdir(folder)
    argv, rest = split_shell(line)
    assert argv[0] == "attnviz"
    argv = _globbed(argv[1:], folder)
    outputs = [folder / argv[i + 1] for i, a in enumerate(argv[:-1]) if a in OUTPUT_OPTIONS]
    for path in outputs:
        path.unlink(missing_ok=True)
    r = runner.invoke(app, argv)
    expected = EXPECTED_EXIT.get(line, 0)
    detail = f"{line}\nexit {r.exit_code}\nstdout:\n{r.stdout}\nstderr:\n{r.stderr}"
    assert r.exit_code == expected, detail
    assert r.exception is None or isinstance(r.exception, SystemExit), detail
    assert "Traceback" not in r.stderr and "Traceback" not in r.stdout, detail
    for path in outputs:
        assert path.is_file() and path.stat().st_size > 0, f"{line}: {path.name} was not written"
    if "--json" in argv:
        json.loads(r.stdout)  # the document, and nothing else, on stdout
    if rest:
        op = rest[0]
        if op == "|" and rest[1:2] == ["jq"]:
            jq_path(json.loads(r.stdout), next(a for a in rest[2:] if not a.startswith("-")))
        elif op in {">", ">>"}:
            target = rest[1]
            assert r.stdout.strip(), f"{line}: nothing on stdout for {target}"
            if target.endswith(".json"):
                json.loads(r.stdout)
            (folder / target).write_text(r.stdout)
        else:
            pytest.fail(f"{line}: the test cannot check what {' '.join(rest)!r} expects")

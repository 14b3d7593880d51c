"""Claims that need trained heads, on real models: SmolLM2-135M-Instruct (a Llama: 30 layers, 9 query heads, 3
key-value heads; tests/realmodels.py turns its GGUF file into a folder once) retrieves a needle from the middle of
licence texts, and its retrieval heads (Wu et al. 2024) and attention sinks (Gu et al. 2024) as attnviz reports
them equal a transcription of each definition over the model's own eager weights. all-MiniLM-L6-v2's sinks
likewise. The texts are short (a few hundred to a thousand tokens) to keep the suite's time."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tests.realmodels import minilm, smollm2


@pytest.fixture(scope="module")
def smol() -> Path:
    return smollm2()


def invoke(*args: object):
    from typer.testing import CliRunner

    from attnviz.cli import app

    result = CliRunner().invoke(app, [str(a) for a in args])
    assert "Traceback" not in result.stderr, result.stderr
    return result


def _eager_decode(model, ids, steps: int):
    """An independent greedy decode of one unpadded prompt: the prompt less its last token through the model (SDPA:
    no weights are read there), then one token a step (the prompt's last first) with the eager attention and
    ``output_attentions``. Returns the generated tokens [steps] and each step's top key per layer and head
    [steps, layers, H]."""
    import torch

    model.set_attn_implementation("sdpa")
    with torch.no_grad():
        out = model(ids[:, :-1], use_cache=True)
        cache, token = out.past_key_values, ids[:, -1:]
        model.set_attn_implementation("eager")
        generated, tops = [], []
        for _ in range(steps):
            out = model(token, cache=cache, use_cache=True, output_attentions=True)
            cache = out.past_key_values
            tops.append(torch.stack([a[0, :, -1].argmax(-1) for a in out.attentions]).numpy())  # [layers, H]
            token = out.logits[:, -1:].argmax(-1)
            generated.append(int(token))
    return np.array(generated), np.stack(tops)


def _find(ids: list[int], part: list[int]) -> int:
    for i in range(len(ids) - len(part) + 1):
        if ids[i:i + len(part)] == part:
            return i
    raise AssertionError("the needle's tokens are not in the prompt")


ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "long-context.md"


def _page_lines() -> tuple[list[str], str]:
    """The long-context page's retrieval example: its two command lines (capture, inspect) and its table."""
    text = PAGE.read_text(encoding="utf-8")
    lines = [" ".join(ln.split()) for ln in text.splitlines()]
    commands = [ln for ln in lines if ln.startswith("attnviz ") and (" smollm2 " in ln or "--needle \"The best" in ln)]
    at = text.index(commands[-1].split(" --sort")[0].split("--needle")[0])
    block = text[text.index("```text", at) + len("```text"):]
    return commands, block[:block.index("```")]


@pytest.fixture(scope="module")
def docs_needle(smol: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, object, dict]:
    """The page's capture and inspect, run as it prints them, in a folder where ``smollm2`` is the converted model
    and ``sample_inputs`` the repository's: (the folder, the inspect table's result, the inspect JSON)."""
    import os
    import shlex

    folder = tmp_path_factory.mktemp("docs-needle")
    (folder / "smollm2").symlink_to(smol)
    (folder / "sample_inputs").symlink_to(ROOT / "sample_inputs")
    commands, _ = _page_lines()
    assert len(commands) == 2 and commands[0].startswith("attnviz capture smollm2"), commands
    here = os.getcwd()
    os.chdir(folder)
    try:
        done = invoke(*shlex.split(commands[0])[1:])
        assert done.exit_code == 0, done.stderr
        table = invoke(*shlex.split(commands[1])[1:])
        assert table.exit_code == 0, table.stderr
        doc = invoke(*shlex.split(commands[1].split(" --sort")[0])[1:], "--json")
    finally:
        os.chdir(here)
    return folder, table, json.loads(doc.stdout)


def test_the_long_context_page_shows_what_its_commands_print(docs_needle) -> None:
    """The page's table of SmolLM2's retrieval heads (and its sink rate and retrieval-head lines) is what the page's
    own commands print: the same heads in the same order, every column as printed."""
    _, table, _ = docs_needle
    _, shown = _page_lines()
    want = [ln.rstrip() for ln in shown.strip("\n").splitlines()]
    lines = [" ".join(ln.split()) for ln in table.stdout.splitlines()]
    header = next(ln.split() for ln in want if ln.split()[:2] == ["layer", "head"])
    assert header[-1] == "tag" and header == next(ln.split() for ln in table.stdout.splitlines()
                                                  if ln.split()[:2] == ["layer", "head"]), table.stdout

    def cells(ln: str) -> list[str]:  # the numbers, then the tag column's words (a head may have several tags)
        parts = ln.split()
        numbers = next((k for k, v in enumerate(parts) if not v.replace(".", "", 1).isdigit()), len(parts))
        return [*parts[:numbers], " ".join(parts[numbers:])]

    rows = [cells(ln) for ln in want if ln.strip() and ln.split()[0].isdigit()]
    printed = {tuple(ln.split()[:2]): cells(ln) for ln in table.stdout.splitlines()
               if ln.strip() and ln.split()[0].isdigit()}
    assert len(rows) == 8 and [r[:2] for r in rows] == [list(k) for k in list(printed)[:8]], table.stdout
    for row in rows:  # the same heads in the same order; each value as printed (a float sum's last digit may differ)
        got = printed[tuple(row[:2])]
        assert row[-2:] == got[-2:], (row, got)  # the retrieval score (a count over the needle, exact) and the tags
        np.testing.assert_allclose([float(v) for v in got[2:-1]], [float(v) for v in row[2:-1]], rtol=2e-3,
                                   atol=1.5e-3, err_msg=f"the page's table is out of date\n{table.stdout}")
    prose = " ".join(" ".join(ln.split()) for ln in want if ln.strip() and not ln.split()[0].isdigit()
                     and not ln.strip().startswith(("layer", "─")))
    assert prose in " ".join(lines), f"{prose!r}\n{table.stdout}"


def test_smollm2_retrieval_heads_equal_their_transcription(smol: Path, docs_needle) -> None:
    """The page's three prompts (the needle at three depths of ~1,000 tokens), 20 generated tokens. The model
    repeats the needle (recall > 0.5); every head's score equals Wu et al.'s definition transcribed over an eager
    greedy decode of each prompt alone (distinct needle positions whose token the step generates, at the step's
    top key, over the needle's length; every step, the first included); a handful of heads pass 0.1, ranked as
    the transcription ranks them."""
    import transformers

    from tests.realmodels import NEEDLE

    folder, _, doc = docs_needle
    got = doc["retrieval"]
    assert got["decode_rows"] == 20 and min(got["recall"]) > 0.5, got["recall"]
    tok = transformers.AutoTokenizer.from_pretrained(smol)
    model = transformers.AutoModelForCausalLM.from_pretrained(smol, attn_implementation="eager").eval()
    needle_ids = tok(" " + NEEDLE, add_special_tokens=False)["input_ids"]
    want = []
    for bi, depth in enumerate((20, 50, 80)):
        prompt = (ROOT / "sample_inputs" / f"haystack-{depth}.txt").read_text(encoding="utf-8")
        ids = tok(prompt, return_tensors="pt")["input_ids"]
        tokens, tops = _eager_decode(model, ids, 20)
        row = ids[0].tolist()
        start = _find(row, needle_ids)
        span = got["needle"][bi]
        assert span["end"] - span["start"] == len(needle_ids)
        copied = [[set() for _ in range(tops.shape[2])] for _ in range(tops.shape[1])]
        for t in range(20):
            for li in range(tops.shape[1]):
                for hi in range(tops.shape[2]):
                    j = int(tops[t, li, hi])
                    if start <= j < start + len(needle_ids) and row[j] == tokens[t]:
                        copied[li][hi].add(j)
        want.append([[len(c) / len(needle_ids) for c in layer] for layer in copied])
        np.testing.assert_allclose(np.array(got["per_entry"][bi], float), want[-1], err_msg=f"entry {bi}")
    mean = np.mean(want, axis=0)
    np.testing.assert_allclose(np.array(got["scores"], float), mean)
    ranked = sorted(((li, hi) for li in range(mean.shape[0]) for hi in range(mean.shape[1]) if mean[li, hi] > 0.1),
                    key=lambda lh: (-mean[lh], lh))
    assert [(h["layer"], h["head"]) for h in got["heads"]] == ranked
    assert 3 <= len(ranked) <= 40 and max(h["score"] for h in got["heads"]) > 0.3


def _sink_texts(tokenizer, count: int, tokens: int) -> list[str]:
    """``count`` pieces of the licence texts of about ``tokens`` tokens each (Gu et al. probe with 64)."""
    from tests.realmodels import LICENCES

    ids = tokenizer(LICENCES.read_text(encoding="utf-8"), add_special_tokens=False)["input_ids"]
    step = len(ids) // count
    return [" ".join(tokenizer.decode(ids[i * step:i * step + tokens]).split()) for i in range(count)]  # a line each


def _gu_sink_rate(model, tokenizer, texts: list[str], epsilon: float = 0.3) -> float:
    """Gu et al.'s sink rate transcribed from their evaluation (sail-sg/Attention-Sink): each text alone through
    the eager model with ``output_attentions``; the importance of key k is sum_t A[t, k] / (T - k) (the mean over
    the rows that see it under a causal mask; for an encoder every row sees the first key, which divides by T
    too); a (text, layer, head) is a sink when the first token's exceeds epsilon; the rate is their share."""
    import torch

    flags = []
    for text in texts:
        enc = tokenizer(text, return_tensors="pt")
        with torch.no_grad():
            attentions = model(**enc, output_attentions=True).attentions
        for a in attentions:  # [1, H, T, T]
            t = a.shape[-1]
            importance = (a[0] / torch.arange(t, 0, -1, dtype=a.dtype)[None, None, :]).sum(-2)  # [H, T]
            flags.append((importance[:, 0] > epsilon).float())
    return float(torch.cat(flags).double().mean())


@pytest.mark.parametrize("which", ["smollm2", "minilm"])
def test_sink_rate_equals_gu_et_al(which: str, tmp_path: Path) -> None:
    """The model-level sink rate a summary and a corpus run report (table footer and JSON) equals Gu et al.'s,
    transcribed over the model's own eager weights, on 6 texts of ~64 tokens: SmolLM2 (causal, a padded batch)
    and all-MiniLM-L6-v2 (an encoder: [CLS] is the first token)."""
    import transformers

    folder = smollm2() if which == "smollm2" else minilm()
    tok = transformers.AutoTokenizer.from_pretrained(folder)
    texts = _sink_texts(tok, 6, 64)
    auto = transformers.AutoModelForCausalLM if which == "smollm2" else transformers.AutoModel
    model = auto.from_pretrained(folder, attn_implementation="eager").eval()
    want = _gu_sink_rate(model, tok, texts)
    assert 0.05 < want < 0.95, want  # trained heads: some sink, some do not (a random model's sink nowhere)

    summary = tmp_path / "s.safetensors"
    args = [a for t in texts for a in ("--text", t)]
    assert invoke("capture", folder, *args, "--summary", "-o", summary).exit_code == 0
    shown = invoke("inspect", summary, "--json")
    doc = json.loads(shown.stdout)["sink_rate"]
    assert doc["epsilon"] == 0.3 and doc["value"] == pytest.approx(want, abs=1e-9)
    assert f"sink rate (Gu et al. 2024): {want:.3f}" in " ".join(invoke("inspect", summary).stdout.split())

    lines = tmp_path / "texts.txt"
    lines.write_text("\n".join(texts) + "\n", encoding="utf-8")
    corpus = tmp_path / "c.safetensors"
    done = invoke("capture", folder, "--text-file", lines, "--corpus", "-o", corpus)
    assert done.exit_code == 0, done.stderr
    doc = json.loads(invoke("inspect", corpus, "--json").stdout)["sink_rate"]
    assert doc["value"] == pytest.approx(want, abs=1e-9) and doc["texts"] == 6
    assert f"sink rate (Gu et al. 2024): {want:.3f}" in " ".join(invoke("inspect", corpus).stdout.split())


# -- attnviz ablate on SmolLM2: a key-value head the answer needs, against the model's own eager attention


def _streamed_eager_logprob(model, ids: list[int], answer: list[int], layer: int, kv_head: int, sink: int,
                            recent: int) -> float:
    """The answer's log-probability with one key-value head of one layer streaming, computed by the model's own
    eager attention: that layer's attention module handed a per-head additive mask built here (a forward pre-hook
    swaps the mask the model built)."""
    import torch

    heads, kv = model.config.num_attention_heads, model.config.num_key_value_heads
    seq = torch.tensor([ids + answer])
    n = seq.shape[1]
    i, j = np.arange(n)[:, None], np.arange(n)[None, :]
    keep = np.repeat((j <= i)[None], heads, 0)
    for q in range(kv_head * heads // kv, (kv_head + 1) * heads // kv):
        keep[q] &= (j < sink) | (j > i - recent)
    mask = torch.where(torch.from_numpy(keep)[None], 0.0, torch.finfo(torch.float32).min)

    def swap(module, args, kwargs):
        kwargs["attention_mask"] = mask
        return args, kwargs

    model.set_attn_implementation("eager")
    hook = model.model.layers[layer].self_attn.register_forward_pre_hook(swap, with_kwargs=True)
    try:
        with torch.no_grad():
            logp = torch.log_softmax(model(seq).logits[0].double(), -1)
    finally:
        hook.remove()
        model.set_attn_implementation("sdpa")
    return float(sum(logp[len(ids) - 1 + k, t] for k, t in enumerate(answer)))


def test_ablate_finds_the_key_value_head_smollm2_needs(smol: Path) -> None:
    """Streaming layer 18's key-value head 2 (query heads 18:6-8, its best retrieval heads) costs the answer
    nats of log-probability, layer 0's head 0 next to nothing, and the restricted log-probability is the eager
    model's with that head's mask. The plain run and the two restricted ones are entries of one batch, as the
    ranking runs them."""
    import torch
    import transformers

    from attnviz.ablation.heads import Plan, Restriction, restricted
    from attnviz.ablation.needles import needle_suite
    from attnviz.ablation.restrict import geometry
    from attnviz.ablation.runs import Loaded, greedy, teacher_forced

    tok = transformers.AutoTokenizer.from_pretrained(str(smol))
    model = transformers.AutoModelForCausalLM.from_pretrained(str(smol), dtype=torch.float32,
                                                              attn_implementation="sdpa").eval()
    needle = needle_suite(1, tokens=900, seed=3, depths=[0.5], tokenizer=tok)[0]
    g = geometry(model)
    loaded = Loaded(model, tok, "cpu", g, "smollm2")
    stream = Restriction("stream", sink=16, recent=64)
    ids = tok(needle.text)["input_ids"]
    answer = tok(needle.answer, add_special_tokens=False)["input_ids"]
    plan = Plan([{}, restricted([(18, 2)], stream, g, kv_heads=True), restricted([(0, 0)], stream, g, kv_heads=True)])
    assert needle.code in greedy(loaded, ids, 6, Plan([{}]))[0]  # the model answers
    plain, needed, cheap = teacher_forced(loaded, ids, answer, plan)[0]
    drops = (plain.logprob - needed.logprob, plain.logprob - cheap.logprob)
    assert drops[0] > 1.0 and abs(drops[1]) < drops[0] / 5, drops
    want = _streamed_eager_logprob(model, ids, answer, 18, 2, 16, 64)
    assert needed.logprob == pytest.approx(want, abs=2e-3)

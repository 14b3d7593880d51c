"""One definition per statistic (``attnviz.statistics``): every path that computes one (the summary's NumPy form
``summarystats.summarise`` and its torch blocks ``summarytorch``, the summary's head table, the head
statistics of exact weights ``inspection.heads``, the corpus's exact path from weights and its blocked path from q
and k) gives, on the same q and k, what a transcription of the statistic's formula gives over the rows its rule
in the table names: a causal case with left padding and a bidirectional one with right padding. A word (a name
or a column's header) names one statistic across the faces; a corpus file written with the names before reads
as today's."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from attnviz.statistics import BY_NAME, CORPUS, ROWS, STATISTICS, SUMMARY, WEIGHTS, names
from tests.conftest import LazyModule

torch = LazyModule("torch")  # imported when a test first uses it: not while every worker collects

B, H, HKV, L, D = 2, 4, 2, 11, 8
SCALE = 0.45
SINKS, LOCAL = 2, 3  # the summary's --sinks and --local
PAD = 3  # the second entry's padding: on the left of the causal case, on the right of the bidirectional one


def _case(causal: bool) -> dict:
    rng = np.random.default_rng(7 if causal else 8)
    q = rng.normal(size=(B, H, L, D)).astype(np.float32)
    k = rng.normal(size=(B, HKV, L, D)).astype(np.float32)
    k[:, :, 0] *= 3.0  # a first key that draws weight (a sink in some heads, not in others)
    real = np.ones((B, L), bool)
    if causal:
        real[1, :PAD] = False
    else:
        real[1, -PAD:] = False
    classes = np.stack([rng.random((B, L)) < 0.3, rng.random((B, L)) < 0.5]).astype(np.float32)  # punct, "odd"
    keep = real[:, None, None, :] & (np.tril(np.ones((L, L), bool)) if causal else True)  # [B, 1, L, L]
    return dict(q=q, k=k, real=real, classes=classes, keep=np.broadcast_to(keep, (B, 1, L, L)), causal=causal)


def _weights(c: dict) -> np.ndarray:
    """The definition of the weights, transcribed: softmax over the keys the mask keeps, float64, 0 elsewhere."""
    k = np.repeat(c["k"], H // HKV, axis=1).astype(np.float64)
    s = np.einsum("bhid,bhjd->bhij", c["q"].astype(np.float64), k) * SCALE
    a = np.zeros_like(s)
    for b, h, i in np.ndindex(B, H, L):
        kept = c["keep"][b, 0, i]
        if kept.any():
            e = np.exp(s[b, h, i, kept] - s[b, h, i, kept].max())
            a[b, h, i, kept] = e / e.sum()
    return a


def _reference(c: dict, a: np.ndarray) -> tuple[dict, dict]:
    """Each statistic per row, from its formula (a loop over rows), and each row rule, from its words: values
    ``{name: [B, H, L]}`` and rules ``{rule: [B, L]}``."""
    real = c["real"]
    per_row: dict[str, np.ndarray] = {}
    ends = [(np.flatnonzero(r)[0], np.flatnonzero(r)[-1]) for r in real]
    n_keys = c["keep"][:, 0].sum(-1)  # [B, L]
    for b, h, i in np.ndindex(B, H, L):
        row, f, last = a[b, h, i], *ends[b]
        logs = np.log(np.where(row > 0, row, 1.0))
        values = {
            "entropy": -(row * logs).sum(), "distance": sum(row[j] * abs(i - j) for j in range(L)),
            "diagonal": row[i], "previous": row[i - 1] if i > 0 else 0.0, "first": row[f], "last": row[last],
            "max": row.max(), "next": row[i + 1] if i + 1 < L else 0.0, "entropy_uniform": np.log(max(n_keys[b, i], 1)),
            "top_previous": float(np.argmax(row) == i - 1), "top_next": float(np.argmax(row) == i + 1),
            "punctuation": row @ c["classes"][0, b], "class:odd": row @ c["classes"][1, b], "total": row.sum(),
            "sink_mass": row[np.flatnonzero(real[b])[:SINKS]].sum(),
            "local_mass": row[max(0, i - LOCAL + 1):i + 1].sum()}
        values["entropy_norm"] = values["entropy"] / np.log(n_keys[b, i]) if n_keys[b, i] > 1 else 0.0
        values["first_row_entropy"] = values["entropy"]
        for name, value in values.items():
            per_row.setdefault(name, np.zeros((B, H, L)))[b, h, i] = value
    pos = np.arange(L)[None]
    f = np.array([e[0] for e in ends])[:, None]
    last = np.array([e[1] for e in ends])[:, None]
    counted = real & c["keep"][:, 0].any(-1)
    rules = {"counted": counted, "later": counted & (pos > f), "earlier": counted & (pos < last),
             "first row": counted & (pos == f), "several": counted & (n_keys > 1),
             "sees first": counted & c["keep"][:, 0][np.arange(B), :, f[:, 0]]}
    assert set(rules) | {"repeated", "decode"} == set(ROWS)  # every rule of the table transcribed here
    return per_row, rules


def _mean(values: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """[B, H]: the mean over each entry's rows (NaN where it has none)."""
    n = rows.sum(-1)[:, None]
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(n > 0, np.where(rows[:, None], values, 0.0).sum(-1) / n, np.nan)


def _corpus_exact(c: dict, a: np.ndarray, threshold: float) -> dict[str, np.ndarray]:
    """The corpus's exact path, each entry a text of its own (its padding kept): ``{name: [B, H]}``."""
    from attnviz.capturing.corpus import CorpusAccumulator

    out: dict[str, list] = {}
    site = SimpleNamespace(name="layers.0", kind="layers", layer=0)
    for b in range(B):
        acc = CorpusAccumulator(threshold, ["odd"])
        acc.begin(torch.tensor(c["real"][b:b + 1]), torch.tensor(c["classes"][:, b:b + 1]))
        acc.add(site, torch.tensor(a[b:b + 1], dtype=torch.float32),
                torch.tensor(np.ascontiguousarray(c["keep"][b:b + 1])))
        acc.end()
        for name, value in acc.result({}).means().items():
            out.setdefault(name, []).append(value)
    return {name: np.stack(v) for name, v in out.items()}


def _corpus_blocked(c: dict, threshold: float) -> dict[str, np.ndarray]:
    """The corpus's blocked path (a long text: alone, its real tokens only, a few rows a block), from q and k."""
    from attnviz.capturing.corpuslong import site_sums
    from attnviz.corpusfile import CORPUS_STATS
    from attnviz.summarystats import MaskParts

    out: dict[str, list] = {}
    for b in range(B):
        idx = np.flatnonzero(c["real"][b])
        n = len(idx)
        q = torch.tensor(np.ascontiguousarray(c["q"][b:b + 1, :, idx]))
        k = torch.tensor(np.ascontiguousarray(c["k"][b:b + 1, :, idx]))
        means, had, _ = site_sums(q, k, scale=SCALE, parts=MaskParts(causal=c["causal"]),
                                  real=torch.ones((1, n), dtype=torch.bool),
                                  classes=torch.tensor(np.ascontiguousarray(c["classes"][:, b:b + 1, idx])),
                                  sink_threshold=threshold, row_budget=H * n * 3)
        for s, name in enumerate([*CORPUS_STATS, "class:odd"]):
            out.setdefault(name, []).append(np.where(had[s].numpy() > 0, means[s].numpy(), np.nan))
    return {name: np.stack(v) for name, v in out.items()}


def _summary_read(got: dict[str, np.ndarray], entry: int):
    """A summary read (``inspection.summary.SummaryRead``) of the arrays ``summarise`` returned, one entry."""
    from attnviz.inspection.summary import SummaryRead, one_entry
    from attnviz.summarystats import PER_ROW

    rows = {n: np.asarray(got[n], np.float64)[None] for n in (*PER_ROW, "argmax")}
    read = SummaryRead("x", "layers", ["layers.0"], {}, rows, got["keys_seen"][None], got["received"][None],
                       got["seen_by"][None], got["pooled_mean"][None], got["pooled_max"][None],
                       got["pool_q_edges"].tolist(), got["pool_k_edges"].tolist(), got["real_keys"], None, [], None,
                       None, None, None)
    return one_entry(read, entry)


@pytest.mark.parametrize("causal", [True, False], ids=["causal, left padding", "bidirectional, right padding"])
def test_every_path_follows_the_table(causal: bool) -> None:
    from attnviz.inspection.heads import head_statistics
    from attnviz.inspection.summary import head_table, sink_rate
    from attnviz.summarystats import PER_ROW, MaskParts, SummarySettings
    from attnviz.summarystats import summarise as in_numpy
    from attnviz.summarytorch import summarise as in_torch

    c = _case(causal)
    a = _weights(c)
    per_row, rules = _reference(c, a)
    want = {name: _mean(values, rules[BY_NAME[name].rows]) for name, values in per_row.items()
            if name in BY_NAME}
    want["class:odd"] = _mean(per_row["class:odd"], rules["counted"])
    alpha = _mean(per_row["first"], rules["sees first"])  # Gu et al.'s alpha: [B, H]
    threshold = float(np.median(alpha))
    assert np.abs(alpha - threshold).min() > 1e-4 and 0 < (alpha > threshold).mean() < 1
    want["sink_rate"] = (alpha > threshold).astype(np.float64)
    for name in ("entropy", "first", "previous", "diagonal", "max"):  # heads differ: the test can tell them apart
        assert np.ptp(want[name]) > 1e-3, name

    # the summary: per row, every live row; its head table, the mean over the rule's rows
    parts = MaskParts(causal=causal, padding=c["real"])
    settings = SummarySettings(sinks=SINKS, local=LOCAL, pool=4, rows=None)
    by_numpy = in_numpy(c["q"], c["k"], scale=SCALE, settings=settings, parts=parts, block=3)
    by_torch = {n: v.double().numpy() if v.is_floating_point() else v.numpy() for n, v in in_torch(
        torch.tensor(c["q"]), torch.tensor(c["k"]), scale=SCALE, settings=settings,
        parts=MaskParts(causal=causal, padding=torch.tensor(c["real"])), row_budget=H * L * 3).items()}
    counted = rules["counted"][:, None]
    for path, got in (("summarystats.summarise", by_numpy), ("summarytorch", by_torch)):
        for name in PER_ROW:
            if name in per_row:
                np.testing.assert_allclose(np.where(counted, got[name], 0.0), np.where(counted, per_row[name], 0.0),
                                           atol=2e-5, rtol=1e-5, err_msg=f"{path} {name}")
        for b in range(B):
            table = head_table(_summary_read(got, b))
            for name in names(SUMMARY):
                if name in want:
                    np.testing.assert_allclose(table[name][0], want[name][b], atol=2e-5, rtol=1e-5,
                                               err_msg=f"{path}, head table, {name}, entry {b}")
            read = _summary_read(got, b)
            read.metadata = {"sites": {"layers.0": {"mask": {"causal": causal}}}}
            np.testing.assert_allclose(sink_rate(read).alpha[0, 0], alpha[b], atol=2e-5, err_msg=f"{path} alpha")

    # the head statistics of exact weights, each entry alone (its padding kept)
    for b in range(B):
        real = c["real"][b][None, None, None]
        stats = head_statistics(a[None, b:b + 1].astype(np.float32), c["keep"][None, b:b + 1], real_rows=real,
                                real_keys=real)
        for name in names(WEIGHTS):
            if name in want:
                np.testing.assert_allclose(stats[name][0], want[name][b], atol=2e-5, rtol=1e-5,
                                           err_msg=f"inspection.heads {name}, entry {b}")

    # the corpus: each entry a text; the exact path from the weights, the blocked one from q and k
    exact, blocked = _corpus_exact(c, a, threshold), _corpus_blocked(c, threshold)
    for name in (*names(CORPUS), "class:odd"):
        np.testing.assert_allclose(exact[name], want[name], atol=2e-5, rtol=1e-5, err_msg=f"corpus exact {name}")
        np.testing.assert_allclose(blocked[name], want[name], atol=2e-5, rtol=1e-5, err_msg=f"corpus blocked {name}")
    checked = {s.name for s in STATISTICS if s.rows not in ("repeated", "decode")}  # tokens, generate(): elsewhere
    assert checked <= set(want)


def test_one_word_one_statistic() -> None:
    """Each statistic has one name and one header in every face's lists and tables, and no word (a name or a
    header) stands for two statistics: a corpus's ``sink`` (whether a head is a sink in a text) was a summary's
    ``sink`` column (the weight on its first keys); the corpus's ``diagonal`` was headed ``self``, its entropy
    ``entropy``."""
    from attnviz.cli.commands.inspect import SORTABLE, SUMMARY_ONLY
    from attnviz.corpusfile import CORPUS_STATS
    from attnviz.inspection.heads import HEAD_STATS
    from attnviz.inspection.summary import HEAD_FIELDS
    from attnviz.render import corpus, summaries, summary
    from attnviz.summarystats import PER_ROW

    headers: dict[str, set[str]] = {}
    for columns in (summary.COLUMNS, summaries.COLUMNS, corpus.COLUMNS):
        for name, header in columns.items():
            headers.setdefault(name, set()).add(header)
    assert {n: h for n, h in headers.items() if len(h) > 1} == {}
    words: dict[str, set[str]] = {}
    for name, header in headers.items():
        words.setdefault(name, set()).add(name)
        words.setdefault(next(iter(header)), set()).add(name)
    assert {w: n for w, n in words.items() if len(n) > 1} == {}
    for listed in (HEAD_STATS, HEAD_FIELDS, PER_ROW, CORPUS_STATS, SORTABLE[2:], SUMMARY_ONLY):
        assert set(listed) <= set(headers), listed
    # --sort's words (a name, a header or an alias, on each kind of file): each one statistic wherever it is taken
    from attnviz.statistics import CORPUS, SUMMARY, WEIGHTS, sort_words

    meant: dict[str, set[str]] = {}
    for face in (WEIGHTS, SUMMARY, CORPUS):
        for word, name in sort_words(face).items():
            meant.setdefault(word, set()).add(name)
    assert {w: n for w, n in meant.items() if len(n) > 1} == {}
    assert set().union(*meant.values()) == set(headers)


def test_a_corpus_file_of_the_names_before_reads_as_today(tmp_path) -> None:
    """A corpus file written when ``sink_rate`` was ``sink``, in that release's order of statistics, reads with
    today's names and order, and merges with a file written today."""
    from attnviz.corpusfile import CORPUS_STATS, CorpusSums, merge_corpora, read_corpus, write_corpus

    before = ["first", "last", "punctuation", "diagonal", "previous", "next", "entropy", "entropy_uniform",
              "first_row_entropy", "max", "top_previous", "top_next", "sink", "class:odd"]
    rng = np.random.default_rng(0)
    sums, texts = rng.random((len(before), 3)), rng.integers(1, 5, (len(before), 3)).astype(np.float64)
    old = CorpusSums(["layers.0"], [0], [3], before, sums, texts, np.full(3, 7.0), np.zeros((3, 3)),
                     np.zeros((3, 3)), {"corpus": {"texts": 4}})
    write_corpus(tmp_path / "old.safetensors", old)
    got = read_corpus(str(tmp_path / "old.safetensors"))
    assert got.names == [*CORPUS_STATS, "class:odd"]
    means = got.means()
    for k, name in enumerate(before):
        want = sums[k] / texts[k]
        np.testing.assert_allclose(means["sink_rate" if name == "sink" else name], want, err_msg=name)
    write_corpus(tmp_path / "new.safetensors", got)
    both = merge_corpora([("old", got), ("new", read_corpus(str(tmp_path / "new.safetensors")))])
    np.testing.assert_allclose(both.sums, 2 * got.sums)

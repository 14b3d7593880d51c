"""The head tables as a terminal shows them (the exact weights', a summary's, a corpus file's): numbers written with
the digits their column's magnitude needs (at long contexts a weight is about 1e-4: never a column of 0.000 over
values that differ). Golden text on a console of fixed width, the values against a NumPy transcription of each
statistic."""

from __future__ import annotations

import io

import numpy as np
import pytest
from rich.console import Console

L = 512  # keys of the summary case: a weight on the first key of 1e-4 is real at this length


def _text(renderable: object, width: int = 200) -> str:
    console = Console(width=width, record=True, file=io.StringIO(), color_system=None)
    console.print(renderable, crop=False)
    return console.export_text()


def _column(text: str, name: str) -> list[str]:
    """The cells of the right-justified column headed ``name`` (a whole word of the header line) of the first head
    table in ``text``: its rows run from the line under the header to the first line that is not a head's."""
    import re

    lines = text.splitlines()
    at = next(i for i, line in enumerate(lines) if line.split()[:2] == ["layer", "head"])
    found = re.search(rf"(?<!\S){re.escape(name)}(?!\S)", lines[at])
    assert found, f"no column {name!r} in {lines[at]!r}"
    cells = []
    for line in lines[at + 2:]:
        if not line.split() or not line.split()[0].isdigit():
            break
        cells.append(line[:found.end()].split()[-1])
    return cells


def _summary_result(logit: np.ndarray, causal: bool = False, needle: str | None = None):
    """A summary (the NumPy path, ``summarystats.summarise``) of one layer of ``len(logit)`` heads over ``L`` keys:
    head h's key 0 has score ``logit[h]``, every other key 0, so that A[i, 0] = e^c / (e^c + n_i - 1)."""
    from attnviz.inspection.summary import SummaryRead, analyse_summary
    from attnviz.summarystats import PER_ROW, MaskParts, SummarySettings, summarise

    h = len(logit)
    q = np.zeros((1, h, L, 1), np.float64)
    q[0, :, :, 0] = np.asarray(logit)[:, None]
    k = np.zeros((1, h, L, 1), np.float64)
    k[0, :, 0, 0] = 1.0
    settings = SummarySettings(sinks=1, local=8, pool=64, rows=None)
    got = summarise(q, k, scale=1.0, settings=settings, parts=MaskParts(causal=causal))
    rows = {n: np.asarray(got[n], np.float64)[None] for n in (*PER_ROW, "argmax")}
    read = SummaryRead("long.safetensors", "layers", ["layers.0"], settings.as_metadata(), rows,
                       got["keys_seen"][None], got["received"][None], got["seen_by"][None], got["pooled_mean"][None],
                       got["pooled_max"][None], got["pool_q_edges"].tolist(), got["pool_k_edges"].tolist(),
                       got["real_keys"], None, [], None, None, None, None,
                       metadata={"sites": {"layers.0": {"mask": {"causal": causal}}}})
    return analyse_summary(read)


def test_a_summary_column_of_small_weights_reads_its_values() -> None:
    """Bidirectional, 512 keys: the weight on the first key is 3.0e-4 in head 0 and 1.7e-4 in head 1 (every row
    alike), beside 1/511.6 on every other key. With 3 decimals both read 0.000; the column takes the digits that
    show 3 significant ones, and each cell equals the transcription."""
    from attnviz.render.summary import head_table

    n = L  # keys a row sees
    want_first = np.array([3.0e-4, 1.7e-4])
    logit = np.log(want_first * (n - 1) / (1 - want_first))  # e^c / (e^c + n - 1) = want
    result = _summary_result(logit)
    np.testing.assert_allclose(result.heads["first"][0], want_first, rtol=1e-9)
    text = _text(head_table(result))
    assert _column(text, "first") == ["0.000300", "0.000170"]
    # every weight on another key: (1 - A[i, 0]) / (n - 1), the largest of the row; the previous key's the same but
    # in row 1 (its previous key is key 0), over the rows after the first
    other = (1 - want_first) / (n - 1)
    assert _column(text, "max") == [f"{v:.5f}" for v in other] == ["0.00196", "0.00196"]  # 3 significant digits
    previous = (want_first + (n - 2) * other) / (n - 1)
    assert _column(text, "prev") == [f"{v:.5f}" for v in previous]
    assert _column(text, "H") == [f"{v:.3f}" for v in result.heads["entropy"][0]]  # as before


def test_an_exact_column_of_small_weights_reads_its_values() -> None:
    """The exact table (2 decimals): the last key's weight of 0.0043 and 0.0021 reads so, not 0.00; a column of
    larger values keeps its 2 decimals."""
    from attnviz.inspection.heads import head_statistics
    from attnviz.render.summaries import head_stats_table

    n = 8
    w = np.zeros((1, 1, 2, n, n))
    for hi, last in enumerate((0.0043, 0.0021)):
        w[0, 0, hi, :, :] = (1 - last) / (n - 1)
        w[0, 0, hi, :, n - 1] = last
    stats = head_statistics(w)
    text = _text(head_stats_table(stats, sort="layer", reverse=False, top=None))
    assert _column(text, "last") == ["0.0043", "0.0021"]
    assert _column(text, "first") == [f"{(1 - v) / (n - 1):.2f}" for v in (0.0043, 0.0021)]


def test_a_corpus_column_of_small_weights_reads_its_values() -> None:
    """A corpus file's table: over texts of 10,000 tokens (uniform attention's weight 1e-4), a class column of 2.5e-4
    and 1.2e-4 (per-text means, then over texts) reads so; over texts of 10 tokens such weights are negligible
    (below 1% of uniform attention's 0.1) and read 0."""
    from attnviz.corpusfile import CORPUS_STATS, CorpusSums
    from attnviz.render.corpus import corpus_table

    names = [*CORPUS_STATS, "class:rare"]
    g = 2
    sums = np.full((len(names), g), 0.5)
    texts = np.full((len(names), g), 4.0)
    sums[names.index("class:rare")] = [4 * 2.5e-4, 4 * 1.2e-4]  # four texts each
    sums[names.index("last")] = [4 * 0.2, 4 * 3.1e-5]  # one large value: the small one is negligible beside it
    corpus = CorpusSums(["layers.0"], [0], [g], names, sums, texts, np.full(g, 40000.0), np.zeros((g, g)),
                        np.zeros((g, g)), {"corpus": {"texts": 4, "settings": {"sink_threshold": 0.3}}})
    text = _text(corpus_table(corpus))
    assert _column(text, "rare") == ["0.000250", "0.000120"]
    assert _column(text, "last") == ["0.200", "0.000"]
    assert _column(text, "first") == ["0.125", "0.125"]
    corpus.rows = np.full(g, 40.0)
    assert _column(_text(corpus_table(corpus)), "rare") == ["0.000", "0.000"]


@pytest.mark.parametrize(("values", "precision", "want"), [
    ([3.2e-4, 1.7e-4, 0.0], 3, ["0.000320", "0.000170", "0.000000"]),
    ([0.359, 0.0043, None], 3, ["0.359", "0.004", "\u2013"]),
    ([0.99996, 0.5], 3, ["1.000", "0.500"]),
    ([182.6, 5.7], 3, ["182.600", "5.700"]),
    ([2e-12, 1e-12], 3, ["2.00e-12", "1.00e-12"]),
    ([0.3, 0.1], 0, ["0.3", "0.1"]),
])
def test_column_texts(values: list, precision: int, want: list[str]) -> None:
    from attnviz.render.table import column_texts

    assert column_texts(values, precision) == want


# ---------------------------------------------------------------------------------------------------
# Tags: every head table has them, by the rules of attnviz.statistics.TAGS, counted per layer

ROOT = __import__("pathlib").Path(__file__).resolve().parent.parent


def _inspect(*args: object, columns: str | None = "200"):
    from typer.testing import CliRunner

    from attnviz.cli import app

    result = CliRunner().invoke(app, ["inspect", *map(str, args)], env={"COLUMNS": columns})
    assert result.exit_code == 0, result.stderr
    return result


def _tag_cells(text: str) -> dict[tuple[int, int], str]:
    """(layer, head) -> the tag column's text, of the first head table in ``text`` (the last column, left-justified:
    what follows the header's ``tag``)."""
    lines = text.splitlines()
    at = next(i for i, line in enumerate(lines) if line.split()[:2] == ["layer", "head"])
    start = lines[at].index(" tag") + 1
    out = {}
    for line in lines[at + 2:]:
        if not line.split() or not line.split()[0].isdigit():
            break
        out[int(line.split()[0]), int(line.split()[1])] = line[start:].strip()
    return out


def _rule_tags(values: dict[str, float], rules: list[tuple], broad: float) -> str:
    """The tags of one head by the documented rules, transcribed: each ``(tag, value, threshold, unless)`` at or above
    its threshold unless a tag of ``unless`` passes too (a sink or local head is not a previous-token, diagonal or
    broad one), in the rules' order; broad alone."""
    passed = {tag for tag, name, threshold, _ in rules if values.get(name) is not None and values[name] >= threshold}
    if values["broad"] is not None and values["broad"] >= broad:
        passed.add("broad")
    earned = [tag for tag, _, _, unless in rules if tag in passed and not passed & set(unless)]
    return ", ".join(earned) if earned else ("broad" if "broad" in passed else "")


GIVES_WAY = ("previous-token", "diagonal", "broad")
POSITIONAL = [("previous-token", "previous", 0.5, ()), ("diagonal", "diagonal", 0.5, ()),
              ("last-token", "last", 0.5, ())]


def test_minilm_summary_heads_are_tagged_by_the_rules() -> None:
    """The real all-MiniLM-L6-v2 on 481 tokens: its strongest first-token head (4:5, 0.36 on [CLS]; Gu et al.'s alpha
    above 0.3) is a sink, as is 4:2; every head's tag is what the rules give from the JSON's values (sink: the share
    of texts whose alpha passes 0.3, here one text; local: the 64 keys up to the query, 64 <= 481 / 4); a line per
    layer counts them, and the JSON holds the rules and the counts."""
    path = ROOT / "sample_inputs" / "minilm_summary.safetensors"
    doc = __import__("json").loads(_inspect(path, "--json").stdout)
    alpha = np.asarray(doc["sink_rate"]["alpha"])[:, 0]  # [layers, H] of the one text
    share = np.asarray(doc["sink_rate"]["per_head"])
    assert np.array_equal(share, (alpha > 0.3).astype(float))
    want = {}
    for h in doc["head_stats"]:
        values = {**h, "sink": share[h["layer"], h["head"]], "broad": h["entropy_norm"]}
        rules = [("sink", "sink", 0.5, GIVES_WAY), *POSITIONAL, ("local", "local_mass", 0.5, GIVES_WAY)]
        want[h["layer"], h["head"]] = _rule_tags(values, rules, 0.9)
    strongest = max(doc["head_stats"], key=lambda h: h["first"])
    assert (strongest["layer"], strongest["head"]) == (4, 5) and 0.3 < strongest["first"] < 0.4
    assert want[4, 5] == "sink" and want[4, 2] == "sink"
    assert {(h["layer"], h["head"]): h["tag"] or "" for h in doc["head_stats"]} == want
    text = _inspect(path).stdout
    assert _tag_cells(text) == want
    counts = {layer: sum(1 for (li, _), t in want.items() if li == layer and "sink" in t) for layer in range(6)}
    assert counts == {0: 0, 1: 0, 2: 0, 3: 0, 4: 2, 5: 0}
    flat = " ".join(text.split())
    assert "layer 4: 2 of 12 heads sink, 1 local" in flat
    assert "layer 0: 1 of 12 heads previous-token, 1 local, 8 broad" in flat
    tags = doc["tags"]
    assert tags["counts"]["sink"] == 2 and tags["heads"] == 72
    assert {r["tag"]: (r["reads"], r["threshold"], r["passes"]) for r in tags["rules"]}["sink"] == \
        ("sink_rate", 0.5, ">=")
    assert tags["per_layer"][4] == {"layer": 4, "heads": 12, "counts": {"sink": 2, "local": 1}}


def test_minilm_corpus_heads_are_tagged_by_the_rules() -> None:
    """The real MiniLM over 235 sentences: a head is a sink where most texts find it one (sink rate >= 0.5: 0:8 at
    0.634, with 0.30 on [CLS], where the exact tags' old 0.5 left it untagged); broad from H over uniform."""
    path = ROOT / "sample_inputs" / "river_town.minilm.safetensors"
    doc = __import__("json").loads(_inspect(path, "--json").stdout)
    want = {}
    for h in doc["head_stats"]:
        values = {**h, "sink": h["sink_rate"], "broad": h["entropy"] / h["entropy_uniform"]}
        values.update(h["classes"])
        want[h["layer"], h["head"]] = _rule_tags(values, [("sink", "sink", 0.5, GIVES_WAY), *POSITIONAL,
                                                          ("punctuation", "punctuation", 0.5, ()),
                                                          *((c, c, 0.5, ()) for c in h["classes"])], 0.9)
    assert want[0, 8] == "sink" and want[0, 2] == "previous-token"
    assert {(h["layer"], h["head"]): h["tag"] or "" for h in doc["head_stats"]} == want
    text = _inspect(path).stdout
    assert _tag_cells(text) == want
    flat = " ".join(text.split())
    assert "layer 0: 1 of 12 heads sink, 1 previous-token, 1 broad" in flat and "layer 1: 12 of 12 heads sink" in flat
    assert doc["tags"]["counts"]["sink"] == sum("sink" in t for t in want.values()) == 55
    assert "articles" in [r["tag"] for r in doc["tags"]["rules"]]  # the file's token class has its rule


def test_exact_weights_sink_by_gu_et_al() -> None:
    """Exact weights, bidirectional, 12 tokens: a head that puts 0.35 on the first token (alpha 0.35 > 0.3 in both
    batch entries) is a sink, and one at 0.25 (0.45 on itself) is not; the old tag needed 0.5. A uniform causal head
    of 6 tokens, whose first token gets 1/i from row i (alpha 0.41), is broad, not a sink."""
    from attnviz.inspection.heads import head_statistics
    from attnviz.render.summaries import head_stats_table

    n = 12
    w = np.zeros((1, 2, 2, n, n))
    w[0, :, 0] = 0.65 / (n - 1)
    w[0, :, 0, :, 0] = 0.35
    w[0, :, 1] = 0.30 / (n - 2)
    w[0, :, 1, :, 0] = 0.25
    w[0, :, 1, np.arange(1, n), np.arange(1, n)] = 0.45
    w[0, :, 1, 0, 1] = 0.45  # row 0: its own key is the first; 0.45 on key 1 instead
    stats = head_statistics(w)
    alpha = w[0, 0, :, :, 0].mean(-1)  # Gu et al.'s alpha of entry 0: the mean over every row of A[i, 0]
    np.testing.assert_allclose(alpha, [0.35, 0.25])
    assert list(stats["tag"][0]) == ["sink", ""]
    np.testing.assert_allclose(stats["sink_rate"][0], [1.0, 0.0])
    text = _text(head_stats_table(stats, sort="layer", reverse=False, top=None))
    assert _tag_cells(text) == {(0, 0): "sink", (0, 1): ""}
    assert "layer 0: 1 of 2 heads sink" in " ".join(text.split())
    causal = (np.tril(np.ones((6, 6))) / np.arange(1, 7)[:, None])[None, None, None]
    uniform = head_statistics(causal)
    assert np.mean(1 / np.arange(1, 7)) > 0.3 and uniform["sink_rate"][0, 0] == 1.0
    assert uniform["tag"][0, 0] == "broad"


def test_corpus_token_class_tag_and_the_table_golden() -> None:
    """A corpus whose head 1 puts 0.6 on a token class is tagged with the class's name; the table, its tag column
    and the lines under it, as a terminal of 100 columns shows them."""
    from attnviz.corpusfile import CORPUS_STATS, CorpusSums
    from attnviz.render.corpus import corpus_table

    names = [*CORPUS_STATS, "class:rare"]
    means = {n: [0.1, 0.1] for n in names}
    means.update({"entropy": [2.5, 1.0], "entropy_uniform": [2.7, 2.7], "class:rare": [0.05, 0.6],
                  "sink_rate": [0.2, 0.0], "top_previous": [0.1, 0.1]})
    texts = np.full((len(names), 2), 4.0)
    sums = np.array([means[n] for n in names]) * 4
    corpus = CorpusSums(["layers.0"], [0], [2], names, sums, texts, np.full(2, 40.0), np.zeros((2, 2)),
                        np.zeros((2, 2)), {"corpus": {"texts": 4, "settings": {"sink_threshold": 0.3}}})
    text = _text(corpus_table(corpus), width=100)
    assert _tag_cells(text) == {(0, 0): "broad", (0, 1): "rare"}
    lines = [line.rstrip() for line in text.splitlines()]
    assert lines[2:6] == [
        " layer head     H  diag  prev first  last   max punct  next uniform sink rate  rare tag",
        " " + "\u2500" * 88,
        "     0    0 2.500 0.100 0.100 0.100 0.100 0.100 0.100 0.100   2.700     0.200 0.050 broad",
        "     0    1 1.000 0.100 0.100 0.100 0.100 0.100 0.100 0.100   2.700     0.000 0.600 rare"]
    at = lines.index("layer 0: 1 of 2 heads rare, 1 broad")
    assert lines[at + 1:at + 3] == ["tags: rare = rare >= 0.5 (its weight on the class's tokens); broad = H/uniform >= "
                                    "0.9 and", "no other tag"], lines[at:at + 4]


# ---------------------------------------------------------------------------------------------------
# Big maps: the head tables and a line, not 40 of 512 rows twice over


def _weights_file(path, n: int, layers: int = 2, heads: int = 3):
    rng = np.random.default_rng(n)
    w = rng.random((layers, 1, heads, n, n)).astype(np.float32)
    np.save(path, w / w.sum(-1, keepdims=True))
    return path


def test_a_512_token_capture_prints_its_head_table_and_a_line(tmp_path) -> None:
    """512 tokens, 2 layers x 3 heads: the head table, the received attention and one line naming --max-rows
    (the weights and per-query tables printed 40 of the 512 rows each: about 130 lines more); --max-rows asks for
    them; a map of 40 rows (what the tables show whole) still gets its tables, one of 41 does not."""
    big = _weights_file(tmp_path / "big.npy", 512)
    text = _inspect(big, columns="100").stdout
    lines = text.splitlines()
    assert "head statistics (by layer)" in text and "tokens that receive the most attention" in text
    assert "weights of layer" not in text and "per-query statistics" not in text
    assert lines[-1] == "weights [512, 512] not tabled (over 40 rows): --max-rows N shows N rows, 0 all"
    assert len(lines) < 60, len(lines)
    asked = _inspect(big, "--max-rows", "10", columns="100").stdout
    assert "weights of layer 0, batch 0, head 0 [512, 512]" in asked and "per-query statistics" in asked
    assert "not tabled" not in asked
    assert "per-query statistics" in _inspect(big, "--max-rows", "0", columns="100").stdout
    assert "weights of layer 0" in _inspect(_weights_file(tmp_path / "40.npy", 40), columns="100").stdout
    over = _inspect(_weights_file(tmp_path / "41.npy", 41), columns="100").stdout
    assert "weights of layer 0" not in over and over.splitlines()[-1].startswith("weights [41, 41] not tabled")

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
    """A corpus file's table: a class column of 2.5e-4 and 1.2e-4 (per-text means, then over texts) reads so."""
    from attnviz.inspection.corpus import CORPUS_STATS, CorpusSums
    from attnviz.render.corpus import corpus_table

    names = [*CORPUS_STATS, "class:rare"]
    g = 2
    sums = np.full((len(names), g), 0.5)
    texts = np.full((len(names), g), 4.0)
    sums[names.index("class:rare")] = [4 * 2.5e-4, 4 * 1.2e-4]  # four texts each
    sums[names.index("last")] = [4 * 0.2, 4 * 3.1e-5]  # one large value: the small one is negligible beside it
    corpus = CorpusSums(["layers.0"], [0], [g], names, sums, texts, np.full(g, 40.0), np.zeros((g, g)),
                        np.zeros((g, g)), {"corpus": {"texts": 4, "settings": {"sink_threshold": 0.3}}})
    text = _text(corpus_table(corpus))
    assert _column(text, "rare") == ["0.000250", "0.000120"]
    assert _column(text, "last") == ["0.200", "0.000"]
    assert _column(text, "first") == ["0.125", "0.125"]


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

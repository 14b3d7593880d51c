"""What a corpus file says (NumPy only): each head's means over texts with its tags, the model's sink rate, the
head distances' closest pairs and map (classical multidimensional scaling), the JSON document. The file itself (its
arrays, reading, writing, merging shards) is ``attnviz.corpusfile``, whose docstring gives each statistic's
definition."""

from __future__ import annotations

from typing import Any

import numpy as np

from attnviz.corpusfile import CORPUS_STATS, CorpusSums, distance_texts
from attnviz.statistics import CORPUS


def head_records(sums: CorpusSums) -> list[dict[str, Any]]:
    """One entry per (layer, head): ``layer``, ``head``, ``texts``, ``rows``, every statistic, ``classes``
    ({NAME: mass}) and ``tag`` (``corpus_tags``)."""
    means = sums.means()
    texts = sums.texts[sums.names.index("last")]
    tags = corpus_tags(sums)
    out = []
    for g, (layer, head) in enumerate(sums.head_order):
        entry: dict[str, Any] = {"layer": layer, "head": head, "texts": int(texts[g]), "rows": int(sums.rows[g])}
        for name in CORPUS_STATS:
            entry[name] = _number(means[name][g])
        entry["classes"] = {c: _number(means[f"class:{c}"][g]) for c in sums.classes}
        entry["tag"] = str(tags[g]) or None
        out.append(entry)
    return out


def corpus_tags(sums: CorpusSums) -> np.ndarray:
    """Each head's tags (the rules of ``attnviz.statistics.TAGS`` for a corpus), ``[G]`` in ``head_order``: from its
    means over texts, ``sink_rate`` the share of texts in which it is a sink, and ``broad`` from its entropy over
    uniform attention's (the means' ratio)."""
    from attnviz.inspection.tags import tag_heads

    values: dict[str, Any] = dict(sums.means())
    with np.errstate(invalid="ignore", divide="ignore"):
        values["entropy_norm"] = np.where(values["entropy_uniform"] > 0,
                                          values["entropy"] / values["entropy_uniform"], np.nan)
    return tag_heads(values, CORPUS, sums.classes)


def corpus_tags_document(sums: CorpusSums) -> dict[str, Any]:
    """The JSON's ``tags`` of a corpus file: the rules, how many heads earn each tag, per layer."""
    from attnviz.inspection.tags import tags_document
    from attnviz.statistics import tag_rules

    epsilon = (sums.corpus.get("settings") or {}).get("sink_threshold")
    return tags_document(corpus_tags(sums), [layer for layer, _ in sums.head_order],
                         tag_rules(CORPUS, tuple(sums.classes), epsilon))


def model_sink_rate(sums: CorpusSums) -> dict[str, Any]:
    """Gu et al. 2024's model-level sink rate: the share of (text, layer, head) that are sinks (``sink_rate`` per
    text: alpha, the mean weight on the first token over every real row that sees it, the first token's own row
    included, above the threshold), over every head and text: the per-head ``sink_rate`` averaged, each head
    weighed by its texts."""
    at = sums.names.index("sink_rate")
    n = float(sums.texts[at].sum())
    return {"definition": "Gu et al. 2024: the share of (text, layer, head) whose mean weight on the first token "
                          "exceeds epsilon", "value": float(sums.sums[at].sum() / n) if n else None,
            "epsilon": (sums.corpus.get("settings") or {}).get("sink_threshold"),
            "rows": "every real row that sees the first token, the first token's own row included",
            "heads": int(sums.sums.shape[1]), "texts": int(sums.corpus.get("texts") or 0)}


def _number(value: float) -> float | None:
    return None if not np.isfinite(value) else float(value)


def classical_mds(distance: np.ndarray, dims: int = 2) -> np.ndarray:
    """Points ``[n, dims]`` whose Euclidean distances best match ``distance`` [n, n] (Torgerson's classical
    multidimensional scaling: the top eigenvectors of the doubly centred squared distances, scaled by the
    square roots of their eigenvalues; negative eigenvalues count as 0)."""
    d = np.asarray(distance, dtype=np.float64)
    n = d.shape[0]
    if n == 0:
        return np.zeros((0, dims))
    centre = np.eye(n) - 1.0 / n
    b = -0.5 * centre @ (d ** 2) @ centre
    values, vectors = np.linalg.eigh((b + b.T) / 2)
    order = np.argsort(values)[::-1][:dims]
    points = vectors[:, order] * np.sqrt(np.maximum(values[order], 0.0))
    if points.shape[1] < dims:
        points = np.pad(points, ((0, 0), (0, dims - points.shape[1])))
    for k in range(dims):  # a sign fixed by the data: the largest coordinate is positive
        if points[np.argmax(np.abs(points[:, k])), k] < 0:
            points[:, k] = -points[:, k]
    return points


def closest_pairs(sums: CorpusSums, count: int = 5) -> list[tuple[tuple[int, int], tuple[int, int], float]]:
    """The ``count`` pairs of heads with the least mean Jensen-Shannon divergence."""
    d = sums.distances()
    order = sums.head_order
    upper = np.triu_indices(d.shape[0], 1)
    values = d[upper]
    keep = np.isfinite(values)
    pairs = sorted(zip(values[keep], upper[0][keep], upper[1][keep]), key=lambda t: (t[0], t[1], t[2]))[:count]
    return [(order[i], order[j], float(v)) for v, i, j in pairs]


def corpus_document(sums: CorpusSums, source: str, files: dict[str, str] | None = None) -> dict[str, Any]:
    """The JSON document of ``inspect --json`` on a corpus file."""
    from attnviz import __version__

    corpus = sums.corpus
    d = sums.distances()
    return {"attnviz": __version__, "command": "inspect", "kind": "corpus", "file": source,
            "model_type": sums.meta.get("model_type"),
            "texts": corpus.get("texts"), "empty_lines": corpus.get("empty_lines"),
            "truncated_texts": corpus.get("truncated_texts"), "dropped_tokens": corpus.get("dropped_tokens"),
            "blocked_texts": int(corpus.get("blocked_texts") or 0), "distance_texts": distance_texts(corpus),
            "settings": corpus.get("settings"), "first_tokens": corpus.get("first_tokens"),
            "last_tokens": corpus.get("last_tokens"), "sources": corpus.get("sources"),
            "head_stats": head_records(sums), "sink_rate": model_sink_rate(sums), "tags": corpus_tags_document(sums),
            "head_order": [list(p) for p in sums.head_order],
            "head_distances": [[_number(v) for v in row] for row in d],
            "closest_pairs": [{"heads": [list(a), list(b)], "js": v} for a, b, v in closest_pairs(sums)],
            "files": dict(files or {})}


def corpus_sites_text(sums: CorpusSums) -> str:
    """One line: what the file holds."""
    corpus = sums.corpus
    first = ", ".join(shown_tokens(corpus.get("first_tokens"))[:3])
    last = ", ".join(shown_tokens(corpus.get("last_tokens"))[:3])
    text = (f"{corpus.get('texts')} texts, {int(sums.rows.max(initial=0))} query rows, {len(sums.sites)} layers x "
            f"{max(sums.heads, default=0)} heads of {sums.meta.get('model_type')}; first tokens: {first or '-'}; "
            f"last tokens: {last or '-'}")
    note = distances_note(sums)
    return text + (f"; {note}" if note else "")


def shown_tokens(counted: dict[str, int] | None) -> list[str]:
    """The tokens of a corpus's ``first_tokens`` or ``last_tokens`` (most common first) as the text they stand for
    (``attnviz.tokentext``: a byte-level BPE token's bytes, a space as ``·``); the file keeps them as spelled."""
    from attnviz import tokentext

    tokens = [str(t) for t in (counted or {})]
    style = tokentext.detect([tokens])
    return [tokentext.shown(t, style) for t in tokens]


def distances_note(sums: CorpusSums) -> str | None:
    """What the head distances leave out, when they do: the long texts whose q and k did not fit."""
    corpus = sums.corpus
    total, held = int(corpus.get("texts") or 0), distance_texts(corpus)
    if held >= total:
        return None
    return (f"head distances over {held} of {total} texts ({total - held} long text(s) left out: their q and k did "
            "not fit the distance budget)")


def stat_columns(sums: CorpusSums) -> dict[str, np.ndarray]:
    """The columns of the head table a layers x heads picture draws (``--stats-png --stat NAME``): every statistic
    of the file (``CORPUS_STATS``, then ``class:NAME`` for each token class), its means over texts as
    ``[sites, most heads]``, NaN where a site has fewer heads."""
    means = sums.means()
    width = max(sums.heads, default=0)
    columns = {}
    for name in sums.names:
        grid = np.full((len(sums.sites), width), np.nan)
        start = 0
        for row, n in enumerate(sums.heads):
            grid[row, :n] = means[name][start:start + n]
            start += n
        columns[name] = grid
    return columns

"""The corpus file: per-head statistics over many texts, kept as sums and counts (NumPy only): its arrays and
metadata, written, read and checked, and shards merged. ``capture --corpus`` writes it; ``inspection.corpus``
reads what it says (means, tags, distances, the JSON document).

A corpus file is a capture file (safetensors; metadata key ``attnviz.capture``) whose metadata holds a
``corpus`` object (the settings, the model's and tokenizer's identity, the tokens that stood first and
last, the sources and shards) and whose arrays are sums and counts, so that shards add:

* ``corpus.sums`` [S, G]: per statistic and head, the per-text means summed over texts;
* ``corpus.texts`` [S, G]: how many texts each sum holds (texts that had rows for it);
* ``corpus.rows`` [G]: the real query rows seen;
* ``corpus.js`` [G, G]: the Jensen-Shannon divergence between two heads' rows, summed over every real
  query row; ``corpus.js_rows`` [G, G] the rows summed;
* ``corpus.heads`` [G, 2] int64: each head's (layer, head).

G counts every head of every self-attention site, in the order the sites run; S the statistics of
``CORPUS_STATS`` then one per token class (``class:NAME``).

**Definitions**: the statistics marked ``corpus`` in the one table of ``attnviz.statistics`` (Clark et al.
2019, "What Does BERT Look At?", arXiv 1906.04341; Voita et al. 2019, arXiv 1905.09418; Gu et al. 2024, arXiv
2410.10781): each one's formula per row and the rows of a text it is a mean over (``first`` and ``previous``
over the rows after the first real one, ``next`` and ``top_next`` before the last, ``first_row_entropy`` the
first row alone, ``sink_rate`` per text: whether the mean of A[i, f] over the rows that see f passes the
threshold), with ``class:NAME`` (the weight on tokens whose text the class's regex matches whole) per
``--token-class``. ``sink_rate`` was ``sink`` in files written before (``statistics.RENAMED``): a summary's
``sink`` column is another thing, the weight on its first S keys; such files read as they are.

Each is a mean over the text's rows; the means are summed over texts (each text weighs the same) with the
number of texts (``blocked_texts`` of them long texts run a block of rows at a time, the same sums). The
head distances: per real query row, p = 0.001 / n_i + 0.999 A_h[i] and q likewise
for head g (over the keys the row may see), m = (p + q) / 2, JS = (1/2) sum_j [p log(p / m) + q log(q / m)],
summed over rows; ``head_distances`` is the mean per row, over the rows of ``distance_texts`` texts (a long
text whose every layer's q and k did not fit the budget is left out of them only).
"""

from __future__ import annotations

import json
import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from attnviz.errors import InputError, UsageError
from attnviz.statistics import CORPUS, current_name, names

#: per-text means kept for every head, in the order of the file's rows (the table of ``attnviz.statistics``)
CORPUS_STATS = names(CORPUS)
PUNCTUATION = (".", ",")
#: the share of each smoothed row spread evenly over the keys it may see (Clark's head distances)
SMOOTHING = 0.001
ARRAYS = ("corpus.sums", "corpus.texts", "corpus.rows", "corpus.js", "corpus.js_rows", "corpus.heads")
#: what must agree for two files to merge, in the order a difference is reported
IDENTITY = ("model", "tokenizer", "settings")


@dataclass
class CorpusSums:
    """The sums and counts of a corpus file, and its metadata (the capture metadata, ``corpus`` inside)."""

    sites: list[str]
    layers: list[int]  # each site's layer number
    heads: list[int]  # each site's heads
    names: list[str]  # the statistics: CORPUS_STATS, then class:NAME
    sums: np.ndarray  # [S, G]
    texts: np.ndarray  # [S, G]
    rows: np.ndarray  # [G]
    js: np.ndarray  # [G, G]
    js_rows: np.ndarray  # [G, G]
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def corpus(self) -> dict[str, Any]:
        return dict(self.meta.get("corpus") or {})

    @property
    def head_order(self) -> list[tuple[int, int]]:
        """(layer, head) of each column, in order."""
        return [(layer, h) for layer, n in zip(self.layers, self.heads) for h in range(n)]

    @property
    def classes(self) -> list[str]:
        return [n.removeprefix("class:") for n in self.names if n.startswith("class:")]

    def means(self) -> dict[str, np.ndarray]:
        """Each statistic's mean over texts, ``[G]`` (NaN where no text had rows for it)."""
        with np.errstate(divide="ignore", invalid="ignore"):
            values = np.where(self.texts > 0, self.sums / self.texts, np.nan)
        return {name: values[k] for k, name in enumerate(self.names)}

    def distances(self) -> np.ndarray:
        """The mean Jensen-Shannon divergence per real query row between every two heads, ``[G, G]``."""
        with np.errstate(divide="ignore", invalid="ignore"):
            out = np.where(self.js_rows > 0, self.js / self.js_rows, np.nan)
        np.fill_diagonal(out, 0.0)
        return out


# ---------------------------------------------------------------------------------------------------
# The file


def corpus_metadata(sums: CorpusSums) -> dict[str, Any]:
    from attnviz.capturefile import FORMAT

    meta = dict(sums.meta)
    corpus = dict(meta.get("corpus") or {})
    corpus.update({"sites": list(sums.sites), "layers": list(sums.layers), "heads": list(sums.heads),
                   "statistics": list(sums.names)})
    meta["corpus"] = corpus
    meta["format"] = FORMAT
    return meta


def write_corpus(path: str | os.PathLike[str], sums: CorpusSums) -> Path:
    """Write ``sums`` as a corpus file (safetensors), whole next to ``path`` and renamed into place."""
    from attnviz.capturefile import Source, write_whole

    target = Path(path)
    arrays = {"corpus.sums": sums.sums, "corpus.texts": sums.texts, "corpus.rows": sums.rows, "corpus.js": sums.js,
              "corpus.js_rows": sums.js_rows,
              "corpus.heads": np.asarray(sums.head_order, dtype=np.int64).reshape(-1, 2)}
    listed: list[tuple[str, np.dtype, tuple[int, ...], Source]] = []
    for name, arr in arrays.items():
        a = np.ascontiguousarray(arr, dtype=np.int64 if name == "corpus.heads" else np.float64)
        listed.append((name, a.dtype, tuple(a.shape), _constant(a)))
    write_whole(target, listed, corpus_metadata(sums), npz=False)
    return target


def _constant(arr: np.ndarray) -> Any:
    return lambda: arr


def is_corpus(meta: dict[str, Any] | None) -> bool:
    return isinstance(meta, dict) and isinstance(meta.get("corpus"), dict)


def corpus_meta_of(path: str) -> dict[str, Any] | None:
    """The metadata of ``path`` when it is a corpus file; None for any other file (or one that cannot be
    read: the ordinary reading reports that)."""
    if ":" in Path(path).name or not str(path).lower().endswith(".safetensors"):
        return None
    from attnviz.capturefile import read_metadata
    from attnviz.formats import open_file
    from attnviz.storage.urls import place

    try:
        raw = open_file(place(path), str(path))
        meta = read_metadata(raw)
    except Exception:  # noqa: BLE001 - not ours to report
        return None
    return meta if is_corpus(meta) else None


def read_corpus(path: str) -> CorpusSums:
    """A corpus file's sums and counts; an error naming the file when it is not one or does not add up."""
    from attnviz.capturefile import read_metadata
    from attnviz.formats import open_file
    from attnviz.storage.urls import place

    if not str(path).lower().endswith(".safetensors"):
        raise InputError(f"{path}: not a corpus file (attnviz capture --corpus writes .safetensors).")
    raw = open_file(place(path), str(path))
    meta = read_metadata(raw)
    if not is_corpus(meta):
        raise InputError(f"{path}: not a corpus file (attnviz capture --corpus writes them).")
    assert meta is not None
    corpus = meta["corpus"]
    missing = [a for a in ARRAYS if a not in raw.keys]
    if missing:
        raise InputError(f"{path}: a corpus file without {missing[0]}.")
    try:
        sites = [str(s) for s in corpus["sites"]]
        layers = [int(v) for v in corpus["layers"]]
        heads = [int(v) for v in corpus["heads"]]
        stored = [current_name(str(s)) for s in corpus["statistics"]]  # a file written before: old names
    except (KeyError, TypeError, ValueError):
        raise InputError(f"{path}: its corpus metadata lacks the sites, heads or statistics.") from None
    arrays = {a: np.asarray(raw.read(a)) for a in ARRAYS}
    g, s = sum(heads), len(stored)
    want = {"corpus.sums": (s, g), "corpus.texts": (s, g), "corpus.rows": (g,), "corpus.js": (g, g),
            "corpus.js_rows": (g, g), "corpus.heads": (g, 2)}
    for name, shape in want.items():
        if arrays[name].shape != shape:
            raise InputError(f"{path}: {name} has shape {list(arrays[name].shape)}; its metadata says {list(shape)}.")
    # the statistics in today's order, whatever the file's (files of any release read, and merge, alike)
    names = [*CORPUS_STATS, *(n for n in stored if n.startswith("class:"))]
    if len(sites) != len(heads) or len(layers) != len(heads) or len(set(stored)) != len(stored) or \
            sorted(stored) != sorted(names):
        raise InputError(f"{path}: its corpus metadata does not describe its arrays.")
    for name in ARRAYS[:-1]:
        if not np.all(np.isfinite(arrays[name])):
            raise InputError(f"{path}: {name} holds NaN or infinity.")
    order = [stored.index(n) for n in names]
    values = [arrays[a].astype(np.float64) for a in ARRAYS[:-1]]
    values[0], values[1] = values[0][order], values[1][order]
    return CorpusSums(sites, layers, heads, names, values[0], values[1], values[2], values[3], values[4], meta)


# ---------------------------------------------------------------------------------------------------
# Shards


def merge_corpora(parts: list[tuple[str, CorpusSums]]) -> CorpusSums:
    """The sums of several corpus files (shards of one corpus, or corpora of one model): every sum and count
    added. Refused, in one line naming the difference: files of different models, tokenizers, settings or
    heads, and a shard of one text file that two files both hold."""
    if not parts:
        raise UsageError("merge: give the corpus files to add up.")
    base_name, base = parts[0]
    for name, part in parts[1:]:
        _same(base_name, base, name, part)
    _disjoint(parts)
    first: Counter[str] = Counter()
    last: Counter[str] = Counter()
    sources: dict[str, dict[str, Any]] = {}
    totals: Counter[str] = Counter()
    for _, part in parts:
        corpus = part.corpus
        first.update(corpus.get("first_tokens") or {})
        last.update(corpus.get("last_tokens") or {})
        for key in ("texts", "empty_lines", "truncated_texts", "dropped_tokens", "blocked_texts"):
            totals[key] += int(corpus.get(key) or 0)
        totals["distance_texts"] += distance_texts(corpus)
        for source in corpus.get("sources") or []:
            kept = sources.setdefault(str(source.get("sha256")), {**source, "shards": []})
            kept["shards"] = sorted(kept["shards"] + [list(s) for s in source.get("shards") or []])
    meta = json.loads(json.dumps(base.meta))
    corpus = meta.setdefault("corpus", {})
    corpus.update(dict(totals))
    corpus["first_tokens"] = dict(first.most_common())
    corpus["last_tokens"] = dict(last.most_common())
    corpus["sources"] = list(sources.values())
    corpus["merged"] = len(parts)
    added = {a: np.sum([getattr(p, a) for _, p in parts], axis=0) for a in ("sums", "texts", "rows", "js", "js_rows")}
    return CorpusSums(list(base.sites), list(base.layers), list(base.heads), list(base.names), added["sums"],
                      added["texts"], added["rows"], added["js"], added["js_rows"], meta)


def distance_texts(corpus: dict[str, Any]) -> int:
    """The texts whose rows the head distances hold (a file written before long texts ran blocked: all)."""
    found = corpus.get("distance_texts")
    return int(corpus.get("texts") or 0) if found is None else int(found)


def _same(a_name: str, a: CorpusSums, b_name: str, b: CorpusSums) -> None:
    ca, cb = a.corpus, b.corpus
    da, db = a.meta.get("dtype"), b.meta.get("dtype")
    if da != db:  # the weights' sample differs too, but the dtype is what a user changed: name it
        raise InputError(f"merge: {b_name} and {a_name} were computed in different dtypes ({db} against {da}); "
                         "only files of one model, tokenizer and settings add up.")
    for key in IDENTITY:
        va, vb = ca.get(key) or {}, cb.get(key) or {}
        if va != vb:
            field_name = next((k for k in sorted(set(va) | set(vb)) if va.get(k) != vb.get(k)), key)
            raise InputError(f"merge: {b_name} and {a_name} differ in their {key} ({field_name}: "
                             f"{_short(vb.get(field_name))} against {_short(va.get(field_name))}); only files of "
                             "one model, tokenizer and settings add up.")
    for what in ("sites", "heads", "names"):
        if getattr(a, what) != getattr(b, what):
            raise InputError(f"merge: {b_name} and {a_name} hold different {what}; only files of one model and "
                             "settings add up.")


def _disjoint(parts: list[tuple[str, CorpusSums]]) -> None:
    """No text of a source file in two parts: the same shard twice, or shards of different counts."""
    seen: dict[str, tuple[str, list[int]]] = {}
    for name, part in parts:
        for source in part.corpus.get("sources") or []:
            sha = str(source.get("sha256"))
            for shard in source.get("shards") or []:
                index, count = (int(v) for v in shard)
                key = f"{sha}:{index}/{count}"
                for other_key, (other, other_shard) in seen.items():
                    if not other_key.startswith(sha + ":"):
                        continue
                    o_index, o_count = other_shard
                    if o_count != count or o_index == index:
                        what = (f"shard {index}/{count}" if (o_index, o_count) == (index, count) else
                                f"shards {o_index}/{o_count} and {index}/{count}")
                        raise InputError(f"merge: {other} and {name} both hold texts of {source.get('file')} "
                                         f"({what}); each text may be counted once.")
                seen[key] = (name, [index, count])


def _short(value: Any) -> str:
    text = json.dumps(value) if not isinstance(value, str) else value
    return text if len(text) <= 24 else text[:12] + "..." + text[-8:]

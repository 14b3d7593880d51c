"""The tags each head earns (the rules of ``attnviz.statistics.TAGS``), counted per layer: the head tables' ``tag``
column, the line per layer under them and the JSON's ``tags``. NumPy only; any shape of per-head values (``[layers,
heads]``, or a corpus's ``[G]`` heads in order)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

import numpy as np

from attnviz.statistics import TagRule, tag_rules


def tag_heads(values: dict[str, Any], face: str, classes: Sequence[str] = (),
              skip: Sequence[str] = ()) -> np.ndarray:
    """Each head's tags (an object array of ``values``' per-head shape): the words of the rules of ``face`` it
    passes, in the rules' order, joined by ", "; empty where none. A rule whose value ``values`` lacks (no
    retrieval scores, no tokens), or named in ``skip`` (it does not apply to this file), is not tried; NaN never
    passes."""
    rules = [r for r in tag_rules(face, tuple(classes)) if r.reads in values and r.tag not in skip]
    shape = np.shape(next(iter(values[r.reads] for r in rules))) if rules else np.shape(values.get("entropy", 0))
    tags = np.full(shape, "", dtype=object)
    arrays = {r.reads: np.asarray(values[r.reads], dtype=np.float64) for r in rules}
    for idx in np.ndindex(*shape):
        passed = [r for r in rules if (v := float(arrays[r.reads][idx])) == v and r.passes(v)]
        words = {r.tag for r in passed}
        earned = [r.tag for r in passed if not r.alone and not words.intersection(r.unless)]
        if not earned:  # a tag given alone (broad): where no other tag is earned
            earned = [r.tag for r in passed if r.alone]
        tags[idx] = ", ".join(earned)
    return tags


def split_tags(tag: Any) -> list[str]:
    """The words of one head's tag text."""
    return [t for t in str(tag or "").split(", ") if t]


def layer_counts(tags: np.ndarray, layer_of: Sequence[int]) -> list[tuple[int, int, Counter[str]]]:
    """Per layer, in order: (layer, its heads, how many earn each tag). ``tags`` flat in the order of ``layer_of``
    (each head's layer), or ``[layers, heads]`` with ``layer_of`` the layers' numbers."""
    flat = np.asarray(tags, dtype=object)
    if flat.ndim == 2:
        layer_of = [layer for layer in layer_of for _ in range(flat.shape[1])]
        flat = flat.reshape(-1)
    out: dict[int, tuple[int, Counter[str]]] = {}
    for layer, tag in zip(layer_of, flat.tolist()):
        heads, counts = out.get(int(layer), (0, Counter()))
        counts.update(split_tags(tag))
        out[int(layer)] = (heads + 1, counts)
    return [(layer, heads, counts) for layer, (heads, counts) in out.items()]


def layer_lines(tags: np.ndarray, layer_of: Sequence[int], order: Sequence[str]) -> list[str]:
    """One line per layer: ``layer 4: 7 of 12 heads sink, 2 local`` (``order``: the tags' order), or ``layer 0:
    none of 12 heads tagged``."""
    lines = []
    for layer, heads, counts in layer_counts(tags, layer_of):
        found = [(t, counts[t]) for t in order if counts.get(t)]
        found += [(t, n) for t, n in counts.items() if t not in order]
        if not found:
            lines.append(f"layer {layer}: none of {heads} heads tagged")
            continue
        first, *rest = found
        lines.append(f"layer {layer}: {first[1]} of {heads} heads {first[0]}"
                     + "".join(f", {n} {t}" for t, n in rest))
    return lines


def rules_line(rules: Sequence[TagRule], tags: np.ndarray, face: str) -> str:
    """The rules of the tags found in ``tags``, in one line: ``tags: previous-token = prev >= 0.5; ...``."""
    found = {t for tag in np.asarray(tags, dtype=object).reshape(-1).tolist() for t in split_tags(tag)}
    said = [r.brief(face) for r in rules if r.tag in found]
    return ("tags: " + "; ".join(said)) if said else ""


def tags_document(tags: np.ndarray, layer_of: Sequence[int], rules: Sequence[TagRule]) -> dict[str, Any]:
    """The JSON's ``tags``: each rule (its tag, the value it reads, threshold, comparison, words, source), how many
    heads earn each tag, and per layer."""
    per_layer = layer_counts(tags, layer_of)
    total: Counter[str] = Counter()
    for _, _, counts in per_layer:
        total.update(counts)
    return {"rules": [{"tag": r.tag, "reads": r.reads, "threshold": r.threshold, "passes": ">" if r.strict else ">=",
                       "rule": r.rule, **({"unless": list(r.unless)} if r.unless else {}),
                       **({"alone": True} if r.alone else {}), **({"source": r.source} if r.source else {})}
                      for r in rules],
            "heads": int(np.asarray(tags).size),
            "counts": {r.tag: int(total.get(r.tag, 0)) for r in rules},
            "per_layer": [{"layer": layer, "heads": heads, "counts": {r.tag: int(counts.get(r.tag, 0)) for r in rules
                                                                       if counts.get(r.tag)}}
                          for layer, heads, counts in per_layer]}

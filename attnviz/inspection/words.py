"""Saved weights over words: ``--merge-subwords`` applied to the weights a run read, their masks and
labels (``attnviz.subwords`` does the merging). NumPy only."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from attnviz.inspection.weights import Weights
from attnviz.masks import Mask
from attnviz.subwords import Words, check_labels, merge, merge_keep, words


@dataclass(frozen=True)
class Merged:
    """The weights, masks and labels over words, and the words (for the JSON document)."""

    weights: Weights
    masks: Mask
    checked: Mask | None
    q_labels: list[str] | None
    k_labels: list[str] | None
    q_words: Words | None
    k_words: Words | None

    def document(self) -> dict[str, Any]:
        words_of = self.q_words or self.k_words
        return {"style": words_of.style if words_of else None,
                "q": self.q_words.document() if self.q_words else None,
                "k": self.k_words.document() if self.k_words else None}


def _mask(mask: Mask, q: Words | None, k: Words | None, shape: tuple[int, ...]) -> Mask:
    return Mask(keep=merge_keep(mask.keep, q, k), described=list(mask.described)).with_padding(shape)


def merge_run(w: Weights, masks: Mask, checked: Mask | None, q_labels: list[str] | None,
              k_labels: list[str] | None, style: str) -> Merged:
    """Everything a run read, over words instead of sub-word pieces."""
    check_labels(q_labels, k_labels)
    q = words(q_labels, style) if q_labels is not None else None
    k = q if k_labels is not None and k_labels == q_labels else words(k_labels, style) if k_labels is not None \
        else None
    merged = replace(w, data=merge(w.data, q, k), pieces_shape=w.pieces_shape or w.shape)
    shape = merged.shape
    return Merged(merged, _mask(masks, q, k, shape), None if checked is None else _mask(checked, q, k, shape),
                  q.labels if q else None, k.labels if k else None, q, k)

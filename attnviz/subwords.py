"""Sub-word tokens merged into words (``--merge-subwords``): a map over pieces becomes a map over
words, the way inseq aggregates attention: the key pieces of a word are summed, its query pieces
averaged, and each row renormalised to sum to 1 (a row with no weight stays zero). NumPy only.

The convention is read from the labels (``--subword-style`` forces one):

* ``wordpiece`` (BERT): a piece starting with ``##`` continues the word before it; the word is the
  pieces without ``##`` (``play ##ing`` -> ``playing``);
* ``sentencepiece`` (T5, Llama 2, Gemma): a piece starting with ``▁`` begins a word and the others
  continue it (``▁play ing`` -> ``playing``); the word drops the ``▁``;
* ``bpe`` (byte-level BPE: GPT-2, RoBERTa, Llama 3): ``Ġ`` (a space) or ``Ċ`` (a newline) begins a word
  (``Ġplay ing`` -> ``playing``).

Special tokens (``[CLS]``, ``<s>``, ``</s>``, ``<|endoftext|>``, ``<pad>``) are words of their own, and
the piece after one begins a word. Every word keeps the span of its pieces (``[start, stop)``), which
the JSON document lists.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from attnviz.choices import SUBWORD_STYLES as STYLES
from attnviz.errors import InputError, UsageError

SPECIAL = re.compile(r"^(\[[A-Za-z_]+\]|<\|?[^<>|\s]*\|?>)$")
BPE_STARTS = ("Ġ", "Ċ")


@dataclass(frozen=True)
class Words:
    """Words of a label list: their text and the span of pieces ``[start, stop)`` of each."""

    style: str
    labels: list[str]
    spans: list[tuple[int, int]]

    @property
    def starts(self) -> np.ndarray:
        return np.array([s for s, _ in self.spans], dtype=np.intp)

    @property
    def sizes(self) -> np.ndarray:
        return np.array([e - s for s, e in self.spans], dtype=np.intp)

    def document(self) -> list[dict[str, object]]:
        return [{"word": w, "pieces": [s, e]} for w, (s, e) in zip(self.labels, self.spans)]


def detect(labels: list[str], option: str = "--merge-subwords") -> str:
    """The convention the labels follow: the one whose mark most labels carry."""
    counts = {"wordpiece": sum(len(t) > 2 and t.startswith("##") for t in labels),
              "sentencepiece": sum(t.startswith("▁") for t in labels),
              "bpe": sum(t.startswith(BPE_STARTS) for t in labels)}
    style, count = max(counts.items(), key=lambda kv: kv[1])
    if count == 0:
        raise UsageError(f"{option}: none of the labels carries a WordPiece ##, SentencePiece ▁ or byte-level BPE "
                         "Ġ mark; say which convention they follow with --subword-style.")
    return style


def words(labels: list[str], style: str = "auto") -> Words:
    """The words of ``labels`` in ``style`` (``auto``: ``detect``)."""
    if style not in STYLES:
        raise UsageError(f"--subword-style {style!r}: expected one of {', '.join(STYLES)}.")
    if style == "auto":
        style = detect(labels)
    texts: list[str] = []
    spans: list[tuple[int, int]] = []
    after_special = True
    for i, piece in enumerate(labels):
        special = bool(SPECIAL.match(piece))
        if style == "wordpiece":
            begins = not (piece.startswith("##") and len(piece) > 2)
            text = piece if begins else piece[2:]
        elif style == "sentencepiece":
            begins = piece.startswith("▁")
            text = piece.lstrip("▁")
        else:
            begins = piece.startswith(BPE_STARTS)
            text = piece[1:] if begins else piece
        if special or after_special or begins or not spans:
            texts.append(piece if special else text)
            spans.append((i, i + 1))
        else:
            texts[-1] += text
            spans[-1] = (spans[-1][0], i + 1)
        after_special = special
    return Words(style, texts, spans)


def merge(arr: np.ndarray, q: Words | None, k: Words | None) -> np.ndarray:
    """``arr [..., Lq, Lk]`` over words: key pieces summed, query pieces averaged, rows renormalised."""
    out: np.ndarray = np.asarray(arr, dtype=np.float32)
    if k is not None:
        out = np.add.reduceat(out, k.starts, axis=-1)
    if q is not None:
        out = np.add.reduceat(out, q.starts, axis=-2) / q.sizes[:, None].astype(np.float32)
    total = out.sum(axis=-1, keepdims=True, dtype=np.float64).astype(np.float32)
    positive = total > 0
    return np.where(positive, out / np.where(positive, total, np.float32(1)), np.float32(0)).astype(np.float32)


def merge_keep(keep: np.ndarray | None, q: Words | None, k: Words | None) -> np.ndarray | None:
    """A keep mask ``[..., Lq or 1, Lk or 1]`` over words: a word is kept where any of its pieces is."""
    if keep is None:
        return None
    out = keep
    if k is not None and out.shape[-1] > 1:
        out = np.logical_or.reduceat(out, k.starts, axis=-1)
    if q is not None and out.shape[-2] > 1:
        out = np.logical_or.reduceat(out, q.starts, axis=-2)
    return out


def check_labels(q_labels: list[str] | None, k_labels: list[str] | None) -> None:
    if q_labels is None and k_labels is None:
        raise InputError("--merge-subwords merges the pieces the labels name; give the tokens with --labels (or "
                         "--q-labels and --k-labels).")

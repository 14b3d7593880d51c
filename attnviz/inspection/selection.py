"""What a run over saved weights looks at: the map the tables show (``--layer``, ``--batch``,
``--head``), the layers and heads the grids draw (``--layers``, ``--heads``), and the token labels
of the two axes. Checked against the weights ``[layers, batch, heads, Lq, Lk]``: a choice out of
range is a usage error that names the size."""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING

import numpy as np

from attnviz.errors import InputError, UsageError
from attnviz.inspection.options import LabelOptions
from attnviz.storage import Place
from attnviz.text import user_text

if TYPE_CHECKING:
    from attnviz.inspection.generation import Generation
    from attnviz.masks import Mask


def select_indices(text: str | None, size: int, option: str, what: str) -> list[int] | None:
    """The positions ``--layers 0,3,5-7`` chooses among ``size`` (None: all), in the order given,
    each once. A number below 0 or from ``size`` up, or a range going down, is a usage error that
    names the size."""
    if text is None:
        return None
    chosen: list[int] = []
    for part in text.split(","):
        if not part:
            continue
        found = re.fullmatch(r"(-?\d+)(?:-(-?\d+))?", part, re.ASCII)
        if found is None:
            raise UsageError(f"{option} {user_text(text)}: expected numbers and ranges separated by commas, "
                             "e.g. 0,3,5-7.")
        low = int(found.group(1))
        high = int(found.group(2)) if found.group(2) is not None else low
        for value in (low, high):
            if not 0 <= value < size:
                raise UsageError(f"{option} {user_text(text)}: {what} {value} is out of range; the weights have {size} "
                                 f"{what}s (0-{size - 1}).")
        if high < low:
            raise UsageError(f"{option} {user_text(text)}: the range {part} goes down; write it {high}-{low}.")
        chosen.extend(i for i in range(low, high + 1) if i not in chosen)
    if not chosen:
        raise UsageError(f"{option} {user_text(text)}: chooses no {what}.")
    return chosen


@dataclass(frozen=True)
class GridChoice:
    """The layers and heads the grids draw (``--layers``, ``--heads``; all when not given), and
    ``--reduce-heads`` (one map per layer: the mean or max of its chosen heads)."""

    layers: list[int]
    heads: list[int]
    reduce_heads: str | None = None


def grid_choice(layers: str | None, heads: str | None, shape: tuple[int, ...],
                reduce_heads: str | None = None) -> GridChoice:
    """``--layers``/``--heads`` checked against the weights ``[layers, batch, heads, Lq, Lk]`` (exit 2
    naming the size)."""
    chosen_layers = select_indices(layers, shape[0], "--layers", "layer")
    chosen_heads = select_indices(heads, shape[2], "--heads", "head")
    return GridChoice(chosen_layers if chosen_layers is not None else list(range(shape[0])),
                      chosen_heads if chosen_heads is not None else list(range(shape[2])), reduce_heads)


@dataclass(frozen=True)
class TokenLabels:
    """The labels of the queries and of the keys: one list per batch entry, or one list for every entry
    (None: not given). ``given``: from --labels (a capture's own tokens are not, nor the words merged from
    the shown entry's own list). ``style``: a capture's tokens, as its tokenizer spells them (``Ġdo``), whose
    convention (``attnviz.tokentext``) shows each as the text it stands for (``·do``): ``of`` and ``document``
    give those labels, ``tokens_of`` and ``tokens`` the tokens themselves (merging sub-words and the
    token-aware scores read those)."""

    q: list[list[str]] | None = None
    k: list[list[str]] | None = None
    given: bool = True
    style: str | None = None

    @cached_property
    def _shown(self) -> tuple[list[list[str]] | None, list[list[str]] | None]:
        from attnviz.tokentext import shown_rows

        return shown_rows(self.q, self.style), shown_rows(self.k, self.style)

    @property
    def per_entry(self) -> bool:
        """Whether the entries have labels of their own (a list for each, not all the same)."""
        return any(rows is not None and len(rows) > 1 and any(r != rows[0] for r in rows[1:])
                   for rows in (self.q, self.k))

    @property
    def single(self) -> bool:
        """One list given for every entry."""
        return any(rows is not None and len(rows) == 1 for rows in (self.q, self.k))

    def of(self, entry: int) -> tuple[list[str] | None, list[str] | None]:
        """The labels of batch entry ``entry`` as shown: (queries, keys)."""
        q, k = self._shown
        return _row(q, entry), _row(k, entry)

    def tokens_of(self, entry: int) -> tuple[list[str] | None, list[str] | None]:
        """The labels of batch entry ``entry`` as given or recorded: (queries, keys)."""
        return _row(self.q, entry), _row(self.k, entry)

    def tokens(self, entries: list[int]) -> list[list[str]] | None:
        """One token list per entry of ``entries`` where both axes carry the same labels (token-aware
        scores need them), else None."""
        if self.q is None or self.k is None:
            return None
        rows = [self.tokens_of(b) for b in entries]
        if any(q != k for q, k in rows):
            return None
        return [q for q, _ in rows if q is not None]

    def document(self) -> dict[str, list[list[str]]] | None:
        """``{"q": [...], "k": [...]}``, each entry's labels, for the JSON documents; None with one list."""
        if not self.per_entry:
            return None
        q, k = self._shown
        return {"q": q or [], "k": k or []}


def _row(rows: list[list[str]] | None, entry: int) -> list[str] | None:
    if rows is None:
        return None
    return rows[entry] if len(rows) > 1 else rows[0]


PER_ENTRY_FORMS = "a JSON list of lists, or a text file with a blank line between the entries"


def read_labels(options: LabelOptions, lq: int, lk: int, paths: list[Place],
                generation: Generation | None = None, batches: int = 1) -> TokenLabels:
    """The labels of the queries and the keys (None where not given), one list for every batch entry or
    one per entry (``batches`` of them), checked against ``lq`` and ``lk``; the files read are appended
    to ``paths``. For a stitched generation, the whole sequence (one token more than the rows) loses its
    last token (``generation.fit_labels``)."""
    from attnviz.inspection.generation import fit_labels
    from attnviz.io import load_label_rows

    labels, q_labels, k_labels = options.labels, options.q_labels, options.k_labels
    if labels is not None and (q_labels or k_labels):
        raise UsageError("--labels sets both axes; give it alone, or --q-labels and --k-labels.")
    if labels is not None and lq != lk:
        raise UsageError(f"--labels labels both axes, but the maps are [{lq}, {lk}]; use --q-labels and --k-labels.")
    out: list[list[list[str]] | None] = []
    for option, spec, n, axis in (("--q-labels", q_labels or labels, lq, "queries"),
                                  ("--k-labels", k_labels or labels, lk, "keys")):
        if spec is None:
            out.append(None)
            continue
        given = load_label_rows(spec)
        if given.path is not None:
            paths.append(given.path)
        name = option if not labels else "--labels"
        rows = given.rows
        if given.lines is not None and len(fit_labels(given.lines, n, generation) or given.lines) == n:
            rows = [given.lines]  # a file of one list that holds an empty label
        if len(rows) > 1 and len(rows) != batches:
            raise InputError(f"{name} ({given.how}): {len(rows)} lists of labels (one per batch entry) for "
                             f"{batches} batch entr{'y' if batches == 1 else 'ies'}.")
        fitted = []
        for i, values in enumerate(rows):
            values = fit_labels(values, n, generation) or values
            if len(values) != n:
                entry = f", batch entry {i}" if len(rows) > 1 else ""
                hint = ("" if len(rows) > 1 or batches == 1 else
                        f"; for a batch of {batches} different sentences give one list per entry ({PER_ENTRY_FORMS}), "
                        "each padded as the batch is")
                raise InputError(f"{name} ({given.how}{entry}): {len(values)} labels for {n} {axis}{hint}.")
            fitted.append(values)
        out.append(fitted)
    return TokenLabels(out[0], out[1])


def entry_labels_to_merge(labels: TokenLabels, batch: int | None,
                          entry: int) -> tuple[list[str] | None, list[str] | None]:
    """The labels --merge-subwords merges by: the one list, or with one list per entry those of the
    entry shown (``--batch``: the run reads that entry alone); entries with different tokens without
    ``--batch`` are a usage error."""
    if labels.per_entry and batch is None:
        raise UsageError("--merge-subwords: the batch entries have different tokens, so different words; merge "
                         "one entry at a time with --batch.")
    return labels.tokens_of(entry)


def label_warnings(labels: TokenLabels, masks: Mask, shape: tuple[int, ...], batch: int | None,
                   entry: int) -> list[str]:
    """One line when a single list of labels is applied to batch entries that the masks show are different
    sentences (their padding differs), unless it fits the entry shown (--batch) by its padding tokens."""
    batches = shape[1]
    if not labels.given or not labels.single or labels.per_entry or batches < 2 or masks.real_keys is None:
        return []
    real = np.broadcast_to(masks.real_keys, (*shape[:3], shape[-1]))[0, :, 0]  # [B, Lk]
    if all(np.array_equal(real[0], real[b]) for b in range(1, batches)):
        return []
    one = labels.k[0] if labels.k is not None else labels.q[0] if labels.q is not None else None
    if batch is not None and one is not None and _fits_padding(one, real[entry]):
        return []
    counts = ", ".join(f"{int(r.sum())}" for r in real)
    used = (f"batch entry {entry} is labelled with it, though it may hold another entry's tokens" if batch is not None
            else "every entry is labelled with it, though they hold different sentences")
    return [f"one list of labels for a padded batch whose entries differ ({counts} real tokens): {used}; give one "
            f"list per entry ({PER_ENTRY_FORMS})."]


#: tokens that pad a batch (BERT, T5 and Llama-style, GPT-2's end of text)
PAD_TOKENS = ("[pad]", "<pad>", "<|endoftext|>", "</s>", "<|pad|>", "<unk>", "<|finetune_right_pad_id|>")


def _fits_padding(labels: list[str], real: np.ndarray) -> bool:
    """Whether ``labels`` carry pad tokens exactly where ``real`` says an entry is padding."""
    padded = np.array([str(t).strip().lower() in PAD_TOKENS for t in labels])
    return bool(padded.shape == real.shape and padded.any() == (~real).any() and
                np.array_equal(padded[~real], np.ones(int((~real).sum()), bool)) and not padded[real].any())

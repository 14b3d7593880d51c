"""Token-aware head detectors (Elhage et al. 2021, Olsson et al. 2022; TransformerLens' head detector
patterns): for each real query ``i`` whose token occurred earlier in the sequence, the *duplicate-token*
score is the weight on the earlier occurrences of that token, the *induction* score the weight on the
tokens right after the earlier occurrences (``j + 1`` for each ``j < i`` with the same token); each is
averaged over those queries (and over batch entries). Also the repeated random sequence that probes
for induction heads (``attnviz repeat-test``). NumPy only."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from attnviz.io import release_pages
from attnviz.statistics import TAG_BY_NAME

CHUNK = 2**22  # values (or pattern pairs) handled at a time on long inputs
#: more pairs than one in this many cells of a map: the patterns are read row by row (``_dense_mass``)
DENSE_SHARE = 16

#: a token-aware pattern "dominates" a head, as the other tags: at least half the mass on average (the rules of
#: ``attnviz.statistics.TAGS``: statistic -> tag)
TOKEN_TAG_THRESHOLD = TAG_BY_NAME["induction"].threshold
TOKEN_TAGS = {TAG_BY_NAME[t].reads: t for t in ("induction", "duplicate-token")}
#: the fewest query rows (over batch entries) a head's induction or duplicate-token score may be averaged over
#: and still earn it a tag: one repeated token says nothing about a head
TOKEN_TAG_MIN_ROWS = 5



def token_ids(tokens: Sequence[str]) -> np.ndarray:
    """One integer per token, equal where the tokens are equal (``[L]``)."""
    return np.unique(np.asarray(list(tokens), dtype=object).astype(str), return_inverse=True)[1].reshape(-1)


def token_patterns(tokens: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """Boolean ``[L, L]`` patterns of a token sequence: ``duplicate[i, j]`` when ``j < i`` holds the
    same token as ``i``; ``induction[i, j]`` when ``j - 1`` does (the token after an earlier
    occurrence). The definition, as a picture; ``token_scores`` walks the same pairs without it."""
    ids = token_ids(tokens)
    same = ids[:, None] == ids[None, :]
    duplicate = np.tril(same, k=-1)
    induction = np.zeros_like(duplicate)
    induction[:, 1:] = duplicate[:, :-1]
    return duplicate, induction


def earlier_occurrences(ids: np.ndarray, limit: int = CHUNK) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """The pairs ``(i, j)``, ``j < i``, where position ``j`` holds the token of ``i`` (the duplicate
    pattern; ``j + 1`` is the induction target), in pieces of about ``limit`` pairs, never an
    ``[L, L]`` array: a long sequence with frequent tokens has many pairs."""
    order = np.argsort(ids, kind="stable")  # positions grouped by token, ascending within a group
    bounds = np.flatnonzero(np.diff(ids[order])) + 1
    rows: list[np.ndarray] = []
    cols: list[np.ndarray] = []
    held = 0
    for group in np.split(order, bounds):
        for b in range(1, len(group)):
            rows.append(np.full(b, group[b]))
            cols.append(group[:b])
            held += b
            if held >= limit:
                yield np.concatenate(rows), np.concatenate(cols)
                rows, cols, held = [], [], 0
    if held:
        yield np.concatenate(rows), np.concatenate(cols)


def _entry_tokens(tokens: Sequence[str] | Sequence[Sequence[str]], batches: int) -> list[Sequence[str]]:
    """One token list per batch entry, from one list for all or a list per entry."""
    if tokens and not isinstance(tokens[0], str):
        rows = list(tokens)
        return rows if len(rows) == batches else [rows[0]] * batches  # type: ignore[list-item]
    return [tokens] * batches  # type: ignore[list-item]


def token_scores(w: np.ndarray, tokens: Sequence[str] | Sequence[Sequence[str]],
                 real_rows: np.ndarray | None = None, renormalise: bool = False) -> dict[str, np.ndarray]:
    """Per (layer, head) of ``w [L, B, H, Lq, Lk]`` (``Lq == Lk == len(tokens)``; ``tokens`` one list, or
    one per batch entry): the ``induction`` and ``duplicate`` scores (module docstring), averaged over
    the real query rows whose token occurred before and over batch entries; ``rows`` is how many rows
    each head's scores were averaged over (``[L, H]``), ``repeated`` how many such rows there are per batch
    entry (``[B]``). NaN where no query qualifies. ``real_rows``
    broadcasts to ``[L, B, H, Lq]``. Only the weights of the patterns' pairs are read; with ``renormalise``
    (maps whose rows are not distributions: value norms) each weight is divided by its row's sum."""
    layers, batches, heads, lq, lk = w.shape
    entry_ids = [token_ids(t) for t in _entry_tokens(tokens, batches)]
    entry_qualifies = []
    for ids in entry_ids:
        qualifies = np.zeros(lq, bool)  # [Lq]: the token occurred before
        for pi, _ in earlier_occurrences(ids):
            qualifies[pi] = True
        entry_qualifies.append(qualifies)
    rows = None if real_rows is None else np.broadcast_to(real_rows, w.shape[:-1])
    sums = {name: np.zeros((layers, heads)) for name in ("induction", "duplicate")}
    counts = np.zeros((layers, heads))
    repeated = np.zeros(batches, dtype=np.int64)
    for li in range(layers):
        for bi in range(batches):
            ids, qualifies = entry_ids[bi], entry_qualifies[bi]
            block = w[li, bi]  # [H, Lq, Lk], perhaps memory-mapped
            live = np.broadcast_to(qualifies, (heads, lq)) if rows is None else rows[li, bi] & qualifies
            if li == 0:
                repeated[bi] = int(live[0].sum())
            mass = {name: np.zeros((heads, lq)) for name in sums}
            counts_of = np.bincount(ids)
            if int((counts_of * (counts_of - 1) // 2).sum()) > lq * lk // DENSE_SHARE:
                _dense_mass(block, ids, mass, lk)  # most pairs repeat: read the map row by row instead
                release_pages(w)
                pairs: Any = ()
            else:
                pairs = earlier_occurrences(ids)
            for pi, pj in pairs:
                for name, cols in (("duplicate", pj), ("induction", pj + 1)):
                    for h in range(heads):  # a head at a time: the pages read are let go of as it goes
                        values = np.asarray(block[h, pi, cols], dtype=np.float64)  # [pairs]
                        mass[name][h] += np.bincount(pi, weights=values, minlength=lq)
                        release_pages(w)
            if renormalise:  # value-norm maps: each row's masses as shares of the row (linear in the row)
                for h in range(heads):
                    totals = np.asarray(block[h], dtype=np.float64).sum(axis=-1)  # [Lq]
                    for name in mass:
                        mass[name][h] = np.divide(mass[name][h], totals, out=np.zeros(lq), where=totals > 0)
                    release_pages(w)
            for name in sums:
                sums[name][li] += np.where(live, mass[name], 0.0).sum(axis=-1)
            counts[li] += live.sum(axis=-1)
            release_pages(w)
    with np.errstate(invalid="ignore", divide="ignore"):
        out = {name: np.where(counts > 0, total / np.maximum(counts, 1), np.nan) for name, total in sums.items()}
    out["rows"] = counts
    out["repeated"] = repeated
    return out


def _dense_mass(block: np.ndarray, ids: np.ndarray, mass: dict[str, np.ndarray], lk: int,
                chunk: int = CHUNK) -> None:
    """``token_scores``' per-row masses of one entry's heads ``block [H, Lq, Lk]`` summed over the patterns'
    keys a block of rows at a time, the patterns made for those rows (a text where most tokens repeat has
    nearly ``Lq * Lq / 2`` pairs: reading the rows whole is quicker than gathering them)."""
    heads, lq = block.shape[0], block.shape[1]
    step = max(1, chunk // max(1, heads * lk))
    j = np.arange(lk)
    key_ids = ids[:lk]
    shifted = np.full(lk, -1, dtype=ids.dtype)  # the token before each key: key k is an induction target of
    shifted[1:] = key_ids[:-1]  # query i when token k - 1 is i's, k - 1 < i
    for first in range(0, lq, step):
        i = np.arange(first, min(first + step, lq))
        values = np.asarray(block[:, first:first + len(i)], dtype=np.float64)
        earlier = j[None, :] < i[:, None]
        duplicate = (ids[i, None] == key_ids[None, :]) & earlier
        induction = (ids[i, None] == shifted[None, :]) & (j[None, :] <= i[:, None]) & (j[None, :] >= 1)
        mass["duplicate"][:, i] += np.einsum("hrk,rk->hr", values, duplicate.astype(np.float64))
        mass["induction"][:, i] += np.einsum("hrk,rk->hr", values, induction.astype(np.float64))
        release_pages(block)


def token_tags(scores: dict[str, np.ndarray]) -> np.ndarray:
    """``induction`` or ``duplicate-token`` where that score is at least ``TOKEN_TAG_THRESHOLD`` (the
    larger, when both are) over at least ``TOKEN_TAG_MIN_ROWS`` rows (``scores["rows"]``, when given), else
    empty; ``[L, H]`` object array."""
    shape = scores["induction"].shape
    tags = np.full(shape, "", dtype=object)
    for idx in np.ndindex(*shape):
        if "rows" in scores and scores["rows"][idx] < TOKEN_TAG_MIN_ROWS:
            continue
        best = max(TOKEN_TAGS, key=lambda k: np.nan_to_num(scores[k][idx], nan=-1.0))
        if scores[best][idx] >= TOKEN_TAG_THRESHOLD:
            tags[idx] = TOKEN_TAGS[best]
    return tags




def repeated_sequence(n: int, vocab: int, seed: int | None = None) -> np.ndarray:
    """The standard induction probe: ``n`` distinct random token ids from ``[0, vocab)``, then the same
    ``n`` again (``[2n]`` int64). Distinct, so that only the second half repeats."""
    if n < 1 or vocab < n:
        raise ValueError(f"need 1 <= n <= vocab, got n={n}, vocab={vocab}")
    first = np.random.default_rng(seed).choice(vocab, size=n, replace=False).astype(np.int64)
    return np.concatenate([first, first])


#: the head statistics that need the tokens
TOKEN_STATS = ("induction", "duplicate")
TOKEN_NOTE = "induction and duplicate-token scores need the tokens: --labels (self-attention, Lq = Lk)"


def add_token_scores(stats: dict[str, Any], data: np.ndarray, tokens: Sequence[str] | Sequence[Sequence[str]] | None,
                     real_rows: Any,
                     tags: bool, renormalise: bool = False) -> str | None:
    """Put the ``induction`` and ``duplicate`` scores of ``data [L, B, H, L, L]`` into the head
    statistics and their tags into ``stats["tag"]`` (with ``tags``: the rows are distributions);
    returns a note when they cannot be computed (no tokens)."""
    if tokens is None:
        return TOKEN_NOTE
    scores = token_scores(data, tokens, real_rows, renormalise)
    stats["induction"], stats["duplicate"] = scores["induction"], scores["duplicate"]
    stats["token_rows"] = scores["rows"]
    if not tags:
        return None
    found = token_tags(scores)
    for idx in np.ndindex(*found.shape):
        extra = str(found[idx])
        if not extra:
            continue
        have = str(stats["tag"][idx])
        stats["tag"][idx] = extra if have in ("", "broad") else f"{have}, {extra}"
    if not int(scores["repeated"].max(initial=0)):
        return "no token occurs twice in --labels: induction and duplicate-token scores are undefined"
    few = scores["rows"] < TOKEN_TAG_MIN_ROWS
    if few.any():
        counted = int(scores["rows"][few].max())
        return (f"induction and duplicate-token scores of {int(few.sum())} head(s) are averaged over {counted} query "
                f"row(s) or fewer (rows whose token occurred before); a tag needs at least {TOKEN_TAG_MIN_ROWS}, "
                "so those heads are not tagged by them")
    return None

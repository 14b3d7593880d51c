"""Analysis across heads and layers of weights a model saved: attention rollout, token-aware head
detectors (induction and duplicate-token heads) and the attention each token receives. NumPy only.

Weights are in ``attnviz.inspect``'s standard layout, ``[layers, batch, heads, Lq, Lk]`` (perhaps
memory-mapped: everything here reads a layer, or a layer of one batch entry, at a time).

**Rollout** (Abnar & Zuidema 2020, "Quantifying Attention Flow in Transformers", section 3): each
layer's heads are combined into one map ``A`` (mean, as in the paper, or max or min), the residual
connection is added as ``A' = (1 - r) A + r I`` (the paper's ``0.5 W_att + 0.5 I`` is ``r = 0.5``),
each row of ``A'`` is renormalised to sum to 1, and the maps are multiplied from the first layer up:
``R_s = A'_s``, ``R_l = A'_l R_{l-1}``. Row ``i`` of ``R_l`` says how much of position ``i``'s
representation after layer ``l`` comes from each input token, if attention alone mixed tokens and
the residual stream carried a share ``r`` through every layer. It is a model of information flow
built from the attention weights only: not a gradient attribution, blind to the value vectors, the
MLPs and layer norms.

**Token-aware head detectors** (Elhage et al. 2021, Olsson et al. 2022; TransformerLens' head
detector patterns): for each real query ``i`` whose token occurred earlier in the sequence, the
*duplicate-token* score is the weight on the earlier occurrences of that token, the *induction*
score the weight on the tokens right after the earlier occurrences (``j + 1`` for each ``j < i``
with the same token); each is averaged over those queries (and over batch entries).

**Received attention**: per key token ``j``, the mean over the query rows that may attend to ``j``
of ``w[i, j]`` (a column mean, counting only the queries allowed to see ``j``: the mask's, the real
rows, and ``i >= j`` for causal weights), so that the last token of a causal model, seen by one
query only, is not penalised for it. A sink gets about 1 from every query.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from attnviz.choices import HEAD_COMBINE
from attnviz.io import release_pages

__all__ = ["HEAD_COMBINE", "Rollout", "combine_heads", "received", "repeated_sequence", "rollout", "token_patterns",
           "token_scores", "token_tags", "with_residual"]
CHUNK = 2**22  # values (or pattern pairs) handled at a time on long inputs

#: a token-aware pattern "dominates" a head, as the other tags: at least half the mass on average
TOKEN_TAG_THRESHOLD = 0.5
TOKEN_TAGS = {"induction": "induction", "duplicate": "duplicate-token"}


def combine_heads(maps: np.ndarray, how: str = "mean") -> np.ndarray:
    """``maps [heads, Lq, Lk]`` combined into one ``[Lq, Lk]`` map in float64."""
    values = np.asarray(maps, dtype=np.float64)
    if how == "max":
        return values.max(axis=0)
    if how == "min":
        return values.min(axis=0)
    if how != "mean":
        raise ValueError(f"heads must be one of {HEAD_COMBINE}, not {how!r}")
    return values.mean(axis=0)


def with_residual(a: np.ndarray, residual: float) -> np.ndarray:
    """``(1 - r) A + r I`` with each row renormalised to sum to 1 (a row of zeros becomes the identity
    row when r > 0, and stays zeros when r = 0)."""
    out = (1.0 - residual) * a
    out[np.diag_indices_from(out)] += residual
    sums = out.sum(axis=-1, keepdims=True)
    return np.divide(out, sums, out=np.zeros_like(out), where=sums != 0)


@dataclass
class Rollout:
    """The rollout of one batch entry: ``result [L, L]`` after the last layer, the layers it spans,
    and (when asked) the cumulative map after each of them, ``cumulative [n, L, L]``. Padded
    positions are NaN in both."""

    result: np.ndarray
    layers: list[int]
    cumulative: np.ndarray | None


def rollout(w: np.ndarray, *, heads: str = "mean", residual: float = 0.5, start_layer: int = 0,
            real: np.ndarray | None = None, all_layers: bool = False) -> Rollout:
    """Attention rollout of ``w [layers, heads, L, L]`` (one batch entry; see the module's docstring).

    ``real [L]`` marks the real tokens: the rollout runs over them alone (each head's rows
    renormalised among them first, so the residual keeps its share), and padded rows and columns
    of the result are NaN."""
    layers, _, lq, lk = w.shape
    if lq != lk:
        raise ValueError(f"rollout needs square maps (self-attention), not [{lq}, {lk}]")
    if not 0 <= start_layer < layers:
        raise ValueError(f"start layer {start_layer} is not one of the {layers} layers")
    keep = np.arange(lq) if real is None else np.flatnonzero(real)
    n = len(keep)
    current = np.eye(n)
    cumulative = []
    for li in range(start_layer, layers):
        one = w[li]
        if real is not None:  # the real tokens' weights, each head's rows renormalised among them
            one = np.asarray(one, dtype=np.float64)[:, keep][:, :, keep]
            sums = one.sum(axis=-1, keepdims=True)
            one = np.divide(one, sums, out=np.zeros_like(one), where=sums != 0)
        step = with_residual(combine_heads(one, heads), residual)
        current = step @ current
        release_pages(w)
        if all_layers:
            cumulative.append(_scatter(current, keep, lq))
    return Rollout(_scatter(current, keep, lq), list(range(start_layer, layers)),
                   np.stack(cumulative) if all_layers else None)


def _scatter(values: np.ndarray, keep: np.ndarray, size: int) -> np.ndarray:
    if len(keep) == size:
        return values.copy()
    out = np.full((size, size), np.nan)
    out[np.ix_(keep, keep)] = values
    return out


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


def token_scores(w: np.ndarray, tokens: Sequence[str], real_rows: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """Per (layer, head) of ``w [L, B, H, Lq, Lk]`` (``Lq == Lk == len(tokens)``): the ``induction``
    and ``duplicate`` scores (module docstring), averaged over the real query rows whose token
    occurred before and over batch entries; ``repeated`` is how many such rows there are per batch
    entry (``[B]``). NaN where no query qualifies. ``real_rows`` broadcasts to ``[L, B, H, Lq]``.
    Only the weights of the patterns' pairs are read."""
    layers, batches, heads, lq, lk = w.shape
    ids = token_ids(tokens)
    qualifies = np.zeros(lq, bool)  # [Lq]: the token occurred before
    for pi, _ in earlier_occurrences(ids):
        qualifies[pi] = True
    rows = None if real_rows is None else np.broadcast_to(real_rows, w.shape[:-1])
    sums = {name: np.zeros((layers, heads)) for name in ("induction", "duplicate")}
    counts = np.zeros((layers, heads))
    repeated = np.zeros(batches, dtype=np.int64)
    for li in range(layers):
        for bi in range(batches):
            block = w[li, bi]  # [H, Lq, Lk], perhaps memory-mapped
            live = np.broadcast_to(qualifies, (heads, lq)) if rows is None else rows[li, bi] & qualifies
            if li == 0:
                repeated[bi] = int(live[0].sum())
            mass = {name: np.zeros((heads, lq)) for name in sums}
            for pi, pj in earlier_occurrences(ids):
                for name, cols in (("duplicate", pj), ("induction", pj + 1)):
                    values = np.asarray(block[:, pi, cols], dtype=np.float64)  # [H, pairs]
                    for h in range(heads):
                        mass[name][h] += np.bincount(pi, weights=values[h], minlength=lq)
            for name in sums:
                sums[name][li] += np.where(live, mass[name], 0.0).sum(axis=-1)
            counts[li] += live.sum(axis=-1)
            release_pages(w)
    with np.errstate(invalid="ignore", divide="ignore"):
        out = {name: np.where(counts > 0, total / np.maximum(counts, 1), np.nan) for name, total in sums.items()}
    out["repeated"] = repeated
    return out


def token_tags(scores: dict[str, np.ndarray]) -> np.ndarray:
    """``induction`` or ``duplicate-token`` where that score is at least ``TOKEN_TAG_THRESHOLD`` (the
    larger, when both are), else empty; ``[L, H]`` object array."""
    shape = scores["induction"].shape
    tags = np.full(shape, "", dtype=object)
    for idx in np.ndindex(*shape):
        best = max(TOKEN_TAGS, key=lambda k: np.nan_to_num(scores[k][idx], nan=-1.0))
        if scores[best][idx] >= TOKEN_TAG_THRESHOLD:
            tags[idx] = TOKEN_TAGS[best]
    return tags


def received(w: np.ndarray, keep: np.ndarray | None = None, real_rows: np.ndarray | None = None,
             causal: bool = False) -> np.ndarray:
    """``[L, B, H, Lk]``: per key token, the mean weight it gets from the query rows allowed to see
    it (module docstring). ``keep`` broadcasts to ``w``; ``real_rows`` to ``[L, B, H, Lq]``; with
    ``causal``, query ``i`` sees keys ``j <= i``. NaN for a token no query may attend."""
    layers, batches, heads, lq, lk = w.shape
    full_keep = None if keep is None else np.broadcast_to(keep, w.shape)
    rows = None if real_rows is None else np.broadcast_to(real_rows, w.shape[:-1])
    step = max(1, CHUNK // max(lk, 1))  # query rows at a time: a long map is never held whole
    out = np.empty((layers, batches, heads, lk))
    for li, bi, hi in np.ndindex(layers, batches, heads):
        total = np.zeros(lk)
        count = np.zeros(lk, dtype=np.int64)
        for start in range(0, lq, step):
            stop = min(start + step, lq)
            block = np.asarray(w[li, bi, hi, start:stop], dtype=np.float64)  # [rows, Lk]
            allowed = np.ones(block.shape, bool)
            if full_keep is not None:
                allowed &= full_keep[li, bi, hi, start:stop]
            if rows is not None:
                allowed &= rows[li, bi, hi, start:stop, None]
            if causal:
                allowed &= np.arange(lk)[None, :] <= np.arange(start, stop)[:, None]
            count += allowed.sum(axis=0)
            total += np.where(allowed, block, 0.0).sum(axis=0)
        with np.errstate(invalid="ignore", divide="ignore"):
            out[li, bi, hi] = np.where(count > 0, total / np.maximum(count, 1), np.nan)
        release_pages(w)
    return out


def repeated_sequence(n: int, vocab: int, seed: int | None = None) -> np.ndarray:
    """The standard induction probe: ``n`` distinct random token ids from ``[0, vocab)``, then the same
    ``n`` again (``[2n]`` int64). Distinct, so that only the second half repeats."""
    if n < 1 or vocab < n:
        raise ValueError(f"need 1 <= n <= vocab, got n={n}, vocab={vocab}")
    first = np.random.default_rng(seed).choice(vocab, size=n, replace=False).astype(np.int64)
    return np.concatenate([first, first])

"""The arithmetic every attention statistic shares (``attnviz.statistics`` defines the statistics), written once,
NumPy and torch side by side: the softmax of masked scores (whole rows, or a block's rows left unnormalised, as
the blockwise paths keep them), the entropy of a row (0 log 0 = 0; from the weights, or from a block's
exponentials), the first and last real position of each entry from its padding vector, and the row rules (which
rows a statistic is a mean over).

Numerics, as ``DESIGN.md`` asks: masked scores are left out of the softmax (``-inf`` in NumPy's float64 form; the
blocks' ``MASKED``, whose exponential is exactly 0), the row's maximum (or the sink logit, when larger) is
subtracted first, and a row with no key kept has weights 0, never NaN.

NumPy at import; torch is imported inside the functions that take tensors.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

#: what a zero becomes before its logarithm in torch's ``x log x`` (x log x of it is 0 to float32)
TINY = 1e-30


# ---------------------------------------------------------------------------------------------------
# The first and last real position


def real_ends(real: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The first and last True of ``real [..., n]`` (a padding vector: True = a real token), int64 ``[...]``;
    0 and n - 1 where nothing is real."""
    real = np.asarray(real, dtype=bool)
    n = real.shape[-1]
    anything = real.any(axis=-1)
    first = np.where(anything, np.argmax(real, axis=-1), 0)
    last = np.where(anything, n - 1 - np.argmax(real[..., ::-1], axis=-1), n - 1)
    return first.astype(np.int64), last.astype(np.int64)


def real_ends_torch(real: Any) -> tuple[Any, Any]:
    """``real_ends`` of a tensor (any device): int64 tensors ``[...]``."""
    import torch

    real = real.to(torch.bool)
    n = real.shape[-1]
    anything = real.any(-1)
    as_int = real.to(torch.int8)  # torch's argmax takes no bools; the first of equal maxima, as NumPy's
    first = torch.where(anything, as_int.argmax(-1), 0)
    last = torch.where(anything, n - 1 - as_int.flip(-1).argmax(-1), n - 1)
    return first, last


# ---------------------------------------------------------------------------------------------------
# The row rules


def row_rule(rule: str, counted: Any, pos: Any, first: Any, last: Any) -> Any:
    """The rows a statistic of ``rule`` (``attnviz.statistics.POSITIONAL``) is a mean over: ``counted`` (bool, the
    real rows that may attend some key), ``pos`` the rows' positions, ``first`` and ``last`` the first and last
    real position, all broadcast together by the caller. NumPy arrays or torch tensors alike (the comparisons and
    ``&`` are the same)."""
    if rule == "counted":
        return counted
    if rule == "later":
        return counted & (pos > first)
    if rule == "earlier":
        return counted & (pos < last)
    if rule == "first row":
        return counted & (pos == first)
    raise ValueError(f"the row rule {rule!r} is not drawn from positions")


# ---------------------------------------------------------------------------------------------------
# Entropy


def entropy(weights: np.ndarray) -> np.ndarray:
    """Shannon entropy of each row in nats, with ``0 log 0 = 0`` (float64)."""
    w = np.asarray(weights, dtype=np.float64)
    logs = np.log(w, out=np.zeros_like(w), where=w > 0)
    return 0.0 - np.einsum("...i,...i->...", w, logs)  # 0 - x, not -x: no "-0.000" for a one-hot row


def plogp_torch(x: Any) -> Any:
    """``x log x`` of probabilities, 0 where x is 0 (the logarithm of a clamped copy: several times faster
    than ``xlogy`` on a CPU)."""
    import torch

    return torch.log(x.clamp_min(TINY)).mul_(x)


def entropy_torch(weights: Any) -> Any:
    """``entropy`` of a tensor's rows, in its dtype."""
    return plogp_torch(weights).sum(-1).neg_()


def normalised_entropy(h: np.ndarray, n: np.ndarray) -> np.ndarray:
    """``h / log n`` (1: uniform over the n keys a row may attend), 0 where n <= 1."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(n > 1, h / np.log(np.maximum(n, 2)), 0.0)


# ---------------------------------------------------------------------------------------------------
# Softmax of masked scores


def masked_softmax(scores: np.ndarray, keep: np.ndarray | None, sink: np.ndarray | None = None) -> np.ndarray:
    """The weights of ``scores [..., Lk]`` in float64: masked keys (``keep`` False) weigh 0, a row with no key kept
    0 throughout; ``sink`` (broadcast to ``[..., 1]``: gpt-oss's one logit per head) adds to each row's
    denominator only, so that a row sums to less than 1."""
    s = np.asarray(scores, dtype=np.float64)
    if keep is not None:
        s = np.where(keep, s, -np.inf)
    top = s.max(-1, keepdims=True)
    if sink is not None:
        sink = np.asarray(sink, dtype=np.float64)
        top = np.maximum(top, sink)
    top = np.where(np.isfinite(top), top, 0.0)
    e = np.exp(s - top)
    denom = e.sum(-1, keepdims=True)
    if sink is not None:
        denom = denom + np.exp(sink - top)
    return np.divide(e, denom, out=np.zeros_like(e), where=denom > 0)


def masked_softmax_torch(scores: Any, keep: Any = None, sink: Any = None) -> Any:
    """``masked_softmax`` of a tensor, in float32 (``sink`` broadcast to ``[..., 1]``)."""
    import torch

    s = scores.to(torch.float32)
    if keep is not None:
        s = s.masked_fill(~keep, -torch.inf)
    top = s.amax(-1, keepdim=True)
    if sink is not None:
        sink = sink.to(torch.float32)
        top = torch.maximum(top, sink)
    top = torch.where(torch.isfinite(top), top, torch.zeros_like(top))
    e = torch.exp(s - top)
    denom = e.sum(-1, keepdim=True)
    if sink is not None:
        denom = denom + torch.exp(sink - top)
    return e / denom.clamp_min(torch.finfo(torch.float32).tiny)  # a row with no key: 0 / tiny = 0


def softmax_of_scores(scores: np.ndarray, keep: np.ndarray | None, *, softcap: float | None = None,
                      bias: np.ndarray | None = None, sinks: np.ndarray | None = None) -> np.ndarray:
    """The weights of scaled scores ``[B, H, r, Lk]`` (float64) as the families form them: Gemma's ``softcap``
    (``tanh(s / c) * c``), then a position ``bias`` (T5's) added, then ``masked_softmax`` with gpt-oss's ``sinks``
    (``[H]``, one logit a head). The NumPy recomputations (``capture --check``, ``summarystats``) share it, each
    making the scores its own way first."""
    if softcap is not None:
        scores = np.tanh(scores / softcap) * softcap
    if bias is not None:
        scores = scores + bias.astype(np.float64)
    return masked_softmax(scores, keep, None if sinks is None else sinks.astype(np.float64)[None, :, None, None])


def softmax_of_scores_torch(scores: Any, keep: Any = None, *, softcap: float | None = None, bias: Any = None,
                            sinks: Any = None) -> Any:
    """``softmax_of_scores`` of a float32 tensor (``masked_softmax_torch``: float32)."""
    import torch

    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    if bias is not None:
        scores = scores + bias.to(torch.float32)
    return masked_softmax_torch(scores, keep, None if sinks is None else sinks.reshape(1, -1, 1, 1))


class ExpRows(NamedTuple):
    """A block's rows left unnormalised (``exp_rows``): the weights are ``e * inv[..., None]``."""

    e: Any  # [..., r, width]: exp(s - shift); 0 on masked keys and on rows that see no key
    shift: Any  # [..., r]: what was subtracted: the row's largest score, or the sink logit where larger
    total: Any  # [..., r]: e summed over the keys
    denom: Any  # [..., r]: total, plus exp(sink - shift) with a sink
    inv: Any  # [..., r]: 1 / denom; 0 for a row that sees no key


def exp_rows(s: Any, top: Any, *, sink: Any = None, live: Any = None, inplace: bool = False) -> ExpRows:
    """The softmax of a block of scores ``s [..., r, width]`` (torch, masked scores already ``MASKED``), kept as
    exponentials and one factor a row, as the blockwise paths sum them: ``top [..., r]`` each row's largest
    score (the caller has it, with its key); ``sink`` gpt-oss's logit (broadcast to ``top``); ``live`` the rows
    that see some key (broadcast to ``top``; None: all). ``s`` is shifted in place (``entropy_of_rows`` reads it
    after); ``inplace``: ``e`` takes its place (``s`` not wanted after)."""
    import torch

    shift = top if sink is None else torch.maximum(top, sink)
    s.sub_(shift[..., None])
    e = s.exp_() if inplace else torch.exp(s)
    if live is not None and not bool(live.all()):
        e.mul_(live[..., None])
    total = e.sum(-1)
    denom = total if sink is None else total + torch.exp(sink - shift)
    inv = 1.0 / denom
    if live is not None:
        inv = torch.where(live, inv, torch.zeros((), dtype=inv.dtype, device=inv.device))
    return ExpRows(e, shift, total, denom, inv)


def softmax_block(s: Any, top: Any, *, sink: Any = None, live: Any = None) -> tuple[ExpRows, Any, Any]:
    """A block's rows as the blockwise paths sum them (``exp_rows``, ``s`` shifted in place), with each row's
    entropy (``entropy_of_rows``) and its largest weight (``[..., r]``: ``1 / Z``, or ``exp(top - sink) / Z``
    where the sink logit is the larger and so the shift): ``(rows, entropy, largest)``."""
    import torch

    rows = exp_rows(s, top, sink=sink, live=live)
    largest = rows.inv if sink is None else torch.exp(top - rows.shift) * rows.inv
    return rows, entropy_of_rows(rows, s), largest


def entropy_of_rows(rows: ExpRows, shifted: Any) -> Any:
    """Each row's entropy from its exponentials (``exp_rows``) and its scores less the shift: with the weights
    ``p = e / Z``, ``-sum p log p = (total / Z) log Z - sum_j e (s - shift) / Z``; 0 log 0 = 0 as the masked keys'
    e is 0. One row dot, no logarithm of a weight."""
    import torch

    return rows.total * rows.inv * torch.log(rows.denom) - torch.linalg.vecdot(rows.e, shifted) * rows.inv

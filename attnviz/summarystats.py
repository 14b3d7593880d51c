"""What a long-context summary records, and its plain NumPy form. Each statistic's name, formula and the rows its
head mean takes are in the one table of ``attnviz.statistics`` (the ``recorded`` ones are this module's
``PER_ROW``); the shared arithmetic (the masked softmax, the entropy, the first and last real key) is
``attnviz.rowmath``'s. Below, what a summary file holds of them.

Notation, for one head of one batch entry: ``A[i, j]`` the model's attention weight of query row ``i`` on
key ``j`` (its softmax over the keys the mask keeps; a masked weight is 0; with gpt-oss's sinks the
denominator holds one more logit per head, so a row sums to ``total < 1``). Query row ``i`` sits at key
position ``pos(i) = i + q_offset`` (``q_offset`` = Lk - Lq for a causal model's new rows after a cache, 0
otherwise). A row is *live* when the mask keeps some key for it; a statistic of a row that is not live is
NaN (argmax -1). A key is *real* when some query row may attend it (not padding); in self-attention a row
is *real* when its own position is a real key (a padded query is padding). Means over rows (``inspect``'s
head table of a summary) take the real live rows, as ``attnviz.inspection.heads`` does with the weights.

Per query row, ``[B, H, Lq]`` (``PER_ROW``; every live row, whatever the statistic's row rule):

=============  ===================================================================================
entropy        ``-sum_j A_ij log A_ij`` (nats; 0 log 0 = 0); Zhai et al. 2023
max            ``max_j A_ij`` (Voita et al. 2019's confidence); ``argmax`` its key (the lowest on ties)
sink_mass      ``sum_{j in first S real keys} A_ij`` (``sinks`` S); StreamingLLM, Gu et al. 2024
local_mass     ``sum_{pos(i) - W < j <= pos(i)} A_ij`` (``local`` W); MInference's A-shape
total          ``sum_j A_ij`` (1, or less with sinks)
distance       ``sum_j A_ij |pos(i) - j|``
diagonal       ``A_{i, pos(i)}``; previous ``A_{i, pos(i) - 1}`` (0 where there is no such key)
first, last    ``A_{i, f}``, ``A_{i, l}``: f and l the first and last real key
=============  ===================================================================================

Per key: ``received [B, H, Lk] = sum_{i real} A_ij`` (H2O's heavy-hitter score), ``seen_by [B, Lk]`` the
real rows whose mask keeps key j (kvpress' ObservedAttentionPress divides by it); ``keys_seen [B, Lq]``
how many keys row i may attend (for the normalised entropy, ``entropy / log keys_seen``). A mask that differs
per head (``[B, H, Lq, Lk]``) is each head's own: its rows live and counted, and ``seen_by [B, H, Lk]`` and
``keys_seen [B, H, Lq]``, per head.

Pooled: the query and key axes cut into blocks of ``ceil(L / P)`` positions (``pool_edges``), ``pooled_mean
[B, H, Pq, Pk]`` the sum of ``A_ij`` over the cell's real rows and its keys divided by (real rows x keys of
the block), masked weights counting 0; ``pooled_max`` the cell's largest weight; NaN where the cell has no
real row or no key its rows may see; ``pool_q_edges [Pq + 1]`` and ``pool_k_edges [Pk + 1]`` the blocks'
edges in positions (block I covers ``edges[I]`` to ``edges[I + 1] - 1``). ``rows [B, H, R, Lk]``: the
chosen rows' weights over every key, ``row_positions [R]`` which rows.

The three paths that compute these (the capture's torch blocks, ``attnviz.summarytorch``; this
module's ``summarise`` in NumPy; ``attnviz.inspection.heads`` on exact weights for the head means) are
tested against each other on the same q and k (``tests/test_summary.py``), and with the corpus's paths
(``tests/test_statistics.py``). A new statistic is added to the table of ``attnviz.statistics`` first, then
here (its line above and in ``summarise``), to the torch blocks and to the reader (``attnviz.inspection.summary``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from attnviz.errors import UsageError
from attnviz.rowmath import entropy, real_ends, softmax_of_scores
from attnviz.statistics import recorded

#: per query row, [B, H, Lq] float32 (``argmax`` int64, separately): the table's ``recorded`` statistics
PER_ROW = recorded()
#: every array a summary site holds (beside ``argmax``)
PER_KEY = ("received", "seen_by")
POOLED = ("pooled_mean", "pooled_max")
DEFAULT_SINKS = 4  # StreamingLLM keeps 4 initial tokens
DEFAULT_LOCAL = 64
DEFAULT_POOL = 256


@dataclass
class SummarySettings:
    """What a summary capture records: ``sinks`` S, ``local`` W, ``pool`` P and the chosen ``rows``."""

    sinks: int = DEFAULT_SINKS
    local: int = DEFAULT_LOCAL
    pool: int = DEFAULT_POOL
    rows: str | None = "last"

    def __post_init__(self) -> None:
        for name, value in (("--sinks", self.sinks), ("--local", self.local), ("--pool", self.pool)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise UsageError(f"{name} {value!r}: give a whole number of 1 or more.")
        parse_rows(self.rows, None)

    def row_positions(self, lq: int) -> list[int]:
        return parse_rows(self.rows, lq)

    def as_metadata(self) -> dict[str, Any]:
        return {"sinks": self.sinks, "local": self.local, "pool": self.pool, "rows": self.rows}


def parse_rows(spec: str | None, lq: int | None) -> list[int]:
    """The query rows ``--rows`` names (``last``, ``first``, ``0,512,-1``, ``100:200``, ``-64:``), sorted and
    each once; with ``lq`` None only the spelling is checked. A row outside the sequence is a usage error."""
    if spec is None or spec.strip() in ("", "none"):
        return []
    found: list[int] = []
    for part in spec.replace(" ", "").split(","):
        if not part:
            continue
        try:
            if part in ("last", "first"):
                values = [-1 if part == "last" else 0]
            elif ":" in part:
                a, _, z = part.partition(":")
                if lq is None:
                    int(a or 0), int(z or 0)
                    continue
                start = int(a) if a else 0
                stop = int(z) if z else lq
                start, stop = (start + lq if start < 0 else start), (stop + lq if stop < 0 else stop)
                if not 0 <= start < stop <= lq:
                    raise UsageError(f"--rows {part}: outside the sequence of {lq} rows (0..{lq - 1}).")
                values = list(range(start, stop))
            else:
                values = [int(part)]
        except ValueError:
            raise UsageError(f"--rows {spec!r}: give row numbers, ranges (100:200) or last, separated by "
                             "commas.") from None
        if lq is not None:
            for v in values:
                at = v + lq if v < 0 else v
                if not 0 <= at < lq:
                    raise UsageError(f"--rows {v}: outside the sequence of {lq} rows (0..{lq - 1}, or -1 for the "
                                     "last).")
                found.append(at)
    return sorted(set(found))


def pool_edges(n: int, pool: int) -> list[int]:
    """Block edges in positions: blocks of ``ceil(n / pool)`` positions (the last may be shorter); block I
    covers ``edges[I]`` to ``edges[I + 1] - 1``."""
    size = max(1, math.ceil(n / pool))
    return [*range(0, n, size), n]


@dataclass
class MaskParts:
    """A site's mask as its parts: ``padding`` ([B, Lk] bool, True = a real key; None: no padding),
    ``causal`` (key j only for rows at positions >= j), ``window`` (keys pos - W < j <= pos), ``q_offset``
    (the first row's position among the keys) and whether the site is a self-attention (its rows are the
    last Lq of its keys)."""

    causal: bool = False
    window: int | None = None
    padding: Any = None
    q_offset: int = 0
    self_attention: bool = True
    extra: dict[str, Any] = field(default_factory=dict)

    def padding_tensor(self, b: int, lk: int, device: Any) -> Any:
        import torch

        if self.padding is None:
            return torch.ones((b, lk), dtype=torch.bool, device=device)
        pad = torch.as_tensor(self.padding, device=device).to(torch.bool)
        return pad[..., -lk:].expand(b, lk) if pad.shape[-1] >= lk else pad.expand(b, lk)

    def keep_rows(self, b: int, r0: int, r1: int, lk: int) -> np.ndarray:
        """[B, 1, r, Lk] bool, NumPy: the keep mask of rows r0:r1."""
        i = np.arange(r0, r1)[:, None] + self.q_offset
        j = np.arange(lk)[None]
        keep = np.ones((r1 - r0, lk), bool)
        if self.causal:
            keep &= j <= i
        if self.window is not None:
            keep &= j > i - self.window
        pad = np.ones((b, lk), bool) if self.padding is None else np.broadcast_to(
            np.asarray(self.padding, bool)[..., -lk:], (b, lk))
        return keep[None, None] & pad[:, None, None, :]

    def as_metadata(self) -> dict[str, Any]:
        return {"causal": self.causal, "window": self.window, "self_attention": self.self_attention}


def _softmax_rows(q: np.ndarray, k: np.ndarray, keep: np.ndarray, scale: float, softcap: float | None,
                  sinks: np.ndarray | None, bias: np.ndarray | None) -> np.ndarray:
    """The weights of a block of rows ``[B, H, r, Lk]`` in float64: q ``[B, H, r, d]``, k ``[B, H, Lk, d]``
    (heads already repeated), keep ``[B, 1, r, Lk]``."""
    s = np.einsum("bhid,bhjd->bhij", q.astype(np.float64), k.astype(np.float64)) * scale
    return softmax_of_scores(s, keep, softcap=softcap, bias=bias, sinks=sinks)


def summarise(q: np.ndarray, k: np.ndarray, *, scale: float, settings: SummarySettings, parts: MaskParts,
              dense: np.ndarray | None = None, softcap: float | None = None, sinks: np.ndarray | None = None,
              bias: np.ndarray | None = None, block: int = 256) -> dict[str, np.ndarray]:
    """Every statistic above by its definition, in NumPy, a block of ``block`` query rows at a time:
    ``q [B, H, Lq, d]``, ``k [B, Hkv, Lk, d]``, ``dense`` a keep mask ``[B or 1, 1 or H, Lq, Lk]`` or None (then
    ``parts``). The arrays ``attnviz.summarytorch.summarise`` returns, as NumPy: with a mask per head, each
    head's weights over its own keys, and ``keys_seen`` ``[B, H, Lq]`` and ``seen_by`` ``[B, H, Lk]`` per head."""
    b, h, lq, _ = q.shape
    lk = k.shape[-2]
    k = np.repeat(k, h // k.shape[1], axis=1)
    hm = 1 if dense is None else int(np.shape(dense)[1])  # 1, or H: a mask per head
    if dense is not None:
        dense = np.broadcast_to(np.asarray(dense, bool), (b, hm, lq, lk))
        real_keys = np.asarray(dense.any(axis=(1, 2)))
    else:
        real_keys = np.ones((b, lk), bool)
        if parts.padding is not None:
            real_keys = np.broadcast_to(np.asarray(parts.padding, bool)[..., -lk:], (b, lk)).copy()
    if parts.self_attention and lq <= lk:
        real_rows = real_keys[:, lk - lq:]
    else:
        real_rows = np.ones((b, lq), bool)
    ranks = np.cumsum(real_keys, axis=-1)
    sink_keys = real_keys & (ranks <= settings.sinks)
    first_key, last_key = real_ends(real_keys)
    out = {n: np.full((b, h, lq), np.nan) for n in PER_ROW}
    argmax = np.full((b, h, lq), -1, np.int64)
    keys_seen = np.zeros((b, hm, lq), np.int64)
    received = np.zeros((b, h, lk))
    seen_by = np.zeros((b, hm, lk), np.int64)
    qe, ke = pool_edges(lq, settings.pool), pool_edges(lk, settings.pool)
    cell_sum = np.zeros((b, h, len(qe) - 1, len(ke) - 1))
    cell_max = np.zeros((b, h, len(qe) - 1, len(ke) - 1))
    cell_rows = np.zeros((b, hm, len(qe) - 1), np.int64)
    cell_seen = np.zeros((b, hm, len(qe) - 1, len(ke) - 1), bool)
    positions = settings.row_positions(lq)
    rows = np.zeros((b, h, len(positions), lk))
    j = np.arange(lk)
    block = max(1, min(block, (1 << 21) // max(1, h * lk)))  # float64 blocks of at most 16 MiB
    for r0 in range(0, lq, block):
        r1 = min(lq, r0 + block)
        keep = dense[:, :, r0:r1] if dense is not None else parts.keep_rows(b, r0, r1, lk)
        a = _softmax_rows(q[:, :, r0:r1], k, keep, scale, softcap, sinks,
                          None if bias is None else bias[..., r0:r1, :])
        pos = np.arange(r0, r1) + parts.q_offset
        live = np.broadcast_to(keep.any(-1), (b, h, r1 - r0))
        local = (j[None] <= pos[:, None]) & (j[None] > pos[:, None] - settings.local)
        values = {
            "entropy": entropy(a), "max": a.max(-1), "sink_mass": (a * sink_keys[:, None, None]).sum(-1),
            "local_mass": (a * local).sum(-1), "total": a.sum(-1),
            "distance": (a * np.abs(pos[:, None] - j[None])).sum(-1),
            "diagonal": _pick(a, pos), "previous": _pick(a, pos - 1),
            "first": np.take_along_axis(a, np.broadcast_to(first_key[:, None, None, None], (b, h, r1 - r0, 1)),
                                        -1)[..., 0],
            "last": np.take_along_axis(a, np.broadcast_to(last_key[:, None, None, None], (b, h, r1 - r0, 1)),
                                       -1)[..., 0],
        }
        for name, value in values.items():
            out[name][:, :, r0:r1] = np.where(live, value, np.nan)
        argmax[:, :, r0:r1] = np.where(live, np.where(keep, a, -1.0).argmax(-1), -1)
        keys_seen[..., r0:r1] = keep.sum(-1)
        for n, p in enumerate(positions):
            if r0 <= p < r1:
                rows[:, :, n] = a[:, :, p - r0]
        counted = real_rows[:, None, r0:r1] & keep.any(-1)  # [B, 1 or H, r]
        a = a * counted[..., None]
        received += a.sum(-2)
        seen_by += (keep & counted[..., None]).sum(-2)
        # the pooled cells: each key block's sum and maximum per row, then added into the rows' query blocks
        bk = ke[1] - ke[0]
        pad = (len(ke) - 1) * bk - lk
        blocks = np.pad(a, ((0, 0), (0, 0), (0, 0), (0, pad))).reshape(b, h, r1 - r0, len(ke) - 1, bk)
        seen = np.pad(keep & counted[..., None], ((0, 0), (0, 0), (0, 0), (0, pad))).reshape(b, hm, r1 - r0, -1, bk)
        qblock = np.searchsorted(qe, np.arange(r0, r1), side="right") - 1
        for qi in np.unique(qblock):
            at = qblock == qi
            cell_rows[..., qi] += counted[..., at].sum(-1)
            cell_sum[:, :, qi] += blocks[:, :, at].sum((2, 4))
            cell_max[:, :, qi] = np.maximum(cell_max[:, :, qi], blocks[:, :, at].max((2, 4)))
            cell_seen[:, :, qi] |= seen[:, :, at].any((2, 4))
    widths = np.diff(ke).astype(np.float64)
    ok = cell_seen & (cell_rows[..., None] > 0)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = cell_sum / (cell_rows[..., None] * widths)
    if hm == 1:  # one mask for every head: the keys seen and the rows that see a key, as [B, Lq] and [B, Lk]
        keys_seen, seen_by = keys_seen[:, 0], seen_by[:, 0]
    result: dict[str, np.ndarray] = {**out, "argmax": argmax, "keys_seen": keys_seen, "received": received,
                                     "seen_by": seen_by, "real_keys": real_keys,
                                     "pooled_mean": np.where(ok, mean, np.nan),
                                     "pooled_max": np.where(ok, cell_max, np.nan)}
    result["pool_q_edges"], result["pool_k_edges"] = np.array(qe, np.int64), np.array(ke, np.int64)
    if positions:
        result["rows"] = rows
        result["row_positions"] = np.array(positions, np.int64)
    return result


def _pick(a: np.ndarray, index: np.ndarray) -> np.ndarray:
    lk = a.shape[-1]
    inside = (index >= 0) & (index < lk)
    got = np.take_along_axis(a, np.broadcast_to(np.clip(index, 0, lk - 1)[:, None], (*a.shape[:-1], 1)), -1)[..., 0]
    return np.where(inside, got, 0.0)

"""Summaries of a site's attention computed where the model runs (torch), a block of query rows at a time,
never holding a head's [Lq, Lk] map: what ``attnviz.capture(model, summary=True)`` and ``attnviz capture
--summary`` record instead of the weights.

Each statistic follows its one written definition in ``attnviz.summarystats`` (name, formula, which rows
count); ``attnviz.summarystats.summarise`` is the same computation in NumPy (for ``--no-weights`` captures
read by ``inspect``, and the tests' second path). The scores are the family's own: ``scale``, ``softcap``,
a position ``bias``, gpt-oss's ``sinks`` (one logit per head in the denominator only: a row sums to less
than 1), grouped-query heads (``Hkv`` key heads shared by ``H / Hkv`` query heads), and the mask: the dense
boolean mask the model built (sliced a block of rows at a time), or its parts (padding, causal, window) when
the model built none.

torch is imported inside the functions: importing this module costs nothing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from attnviz.summarystats import PER_ROW, MaskParts, SummarySettings, pool_edges

#: scores held at a time per block (float32 values, all heads): the block's rows follow from it
BLOCK_VALUES = 1 << 24  # 64 MiB of scores; with the weights and their shifted scores about 3x that
MASKED = -1e30  # masked scores: exp underflows to exactly 0, and 0 * MASKED is 0 (not NaN as with -inf)


@dataclass
class SiteSummary:
    """The arrays of one site's summary, on the model's device until ``host`` (``attnviz.summarystats``
    names and shapes)."""

    arrays: dict[str, Any] = field(default_factory=dict)


def summarise(query: Any, key: Any, *, scale: float, settings: SummarySettings, parts: MaskParts,
              dense: Any = None, softcap: float | None = None, sinks: Any = None, bias: Any = None,
              row_budget: int = BLOCK_VALUES) -> dict[str, Any]:
    """The summary of one call of a site: ``query [B, H, Lq, d]``, ``key [B, Hkv, Lk, d]`` (torch, any
    device), ``dense`` a boolean keep mask ``[B or 1, 1 or H, Lq, Lk]`` (or None: ``parts`` say it all).
    Returns torch tensors on the same device, named as ``attnviz.summarystats.PER_ROW`` and the per-key and
    pooled arrays."""
    import torch

    dev = query.device
    b, h, lq, _ = query.shape
    hkv, lk = key.shape[1], key.shape[-2]
    groups = h // hkv
    f32 = torch.float32
    k32 = key.to(f32)
    kt = k32.transpose(-1, -2)  # [B, Hkv, d, Lk]
    q_pos0 = parts.q_offset  # the position of query row 0 among the keys (steps: the cache's length)
    real_keys = _real_keys(parts, dense, b, lq, lk, dev)  # [B, Lk] bool
    real_rows = real_keys[:, lk - lq:] if parts.self_attention and lq <= lk else _rows_seeing(parts, dense, b, lq, lk,
                                                                                              dev)
    sink_keys = _first_real(real_keys, settings.sinks)  # [B, Lk] bool: the first S real keys
    first_key = torch.where(real_keys.any(-1), real_keys.float().argmax(-1), 0)  # [B]
    last_key = torch.where(real_keys.any(-1), lk - 1 - real_keys.flip(-1).float().argmax(-1), lk - 1)
    out = {name: torch.full((b, h, lq), math.nan, dtype=f32, device=dev) for name in PER_ROW}
    out["argmax"] = torch.full((b, h, lq), -1, dtype=torch.int64, device=dev)
    keys_seen = torch.zeros((b, lq), dtype=torch.int64, device=dev)
    received = torch.zeros((b, h, lk), dtype=torch.float64, device=dev)
    seen_by = torch.zeros((b, lk), dtype=torch.int64, device=dev)
    qe, ke = pool_edges(lq, settings.pool), pool_edges(lk, settings.pool)
    bq, bk = qe[1] - qe[0] if len(qe) > 1 else 1, ke[1] - ke[0] if len(ke) > 1 else 1
    pq, pk = len(qe) - 1, len(ke) - 1
    pooled_sum = torch.zeros((b, h, pq, pk), dtype=torch.float64, device=dev)
    pooled_max = torch.zeros((b, h, pq, pk), dtype=f32, device=dev)
    pooled_rows = torch.zeros((b, pq), dtype=torch.int64, device=dev)  # real rows per query block
    pooled_seen = torch.zeros((b, pq, pk), dtype=torch.bool, device=dev)  # a kept (row, key) in the cell
    positions = settings.row_positions(lq)
    rows_out = torch.zeros((b, h, len(positions), lk), dtype=f32, device=dev) if positions else None
    wanted = {p: n for n, p in enumerate(positions)}
    sink_logit = None if sinks is None else sinks.to(f32).reshape(1, h, 1).to(dev)
    key_pos = torch.arange(lk, device=dev)
    step = max(1, min(lq, row_budget // max(1, h * lk * b)))
    step = max(bq, step // bq * bq) if bq <= step else step  # whole query blocks of the pooled map where they fit
    for r0 in range(0, lq, step):
        r1 = min(lq, r0 + step)
        r = r1 - r0
        qpos = torch.arange(r0, r1, device=dev) + q_pos0  # the rows' positions among the keys
        lo, hi = _key_range(parts, dense, r0, r1, q_pos0, lk)
        lo = lo // bk * bk  # whole key blocks of the pooled map
        keep = _keep_block(parts, dense, real_keys, r0, r1, lo, hi, q_pos0, dev)  # [B, 1, r, K] bool
        qb = query[:, :, r0:r1].to(f32).reshape(b, hkv, groups * r, -1)
        s = torch.matmul(qb, kt[..., lo:hi]).reshape(b, h, r, hi - lo)
        s.mul_(scale)
        if softcap is not None:
            s.div_(softcap).tanh_().mul_(softcap)
        if bias is not None:
            s.add_(bias[..., r0:r1, lo:hi].to(f32))
        s.masked_fill_(~keep, MASKED)
        top, arg = s.max(-1)  # [B, H, r]
        if sink_logit is not None:
            top = torch.maximum(top, sink_logit)
        s.sub_(top[..., None])
        e = torch.exp(s)
        total_e = e.sum(-1)
        if sink_logit is not None:
            total_e = total_e + torch.exp(sink_logit - top)
        e.div_(total_e[..., None])  # the weights A
        p = e
        live = keep.any(-1)  # [B, 1, r]: rows that may attend somewhere
        row_real = real_rows[:, r0:r1][:, None] & live  # [B, 1, r]
        rows = out
        cols = torch.stack([torch.ones(hi - lo, device=dev), (key_pos[lo:hi] - lo).to(f32)], -1)  # [K, 2]
        features = torch.zeros((b, 1, hi - lo, 5), dtype=f32, device=dev)
        features[..., 0:2] = cols
        features[..., 2] = sink_keys[:, None, lo:hi]
        features[..., 3] = (key_pos[lo:hi][None] == first_key[:, None])[:, None].to(f32)
        features[..., 4] = (key_pos[lo:hi][None] == last_key[:, None])[:, None].to(f32)
        got = torch.matmul(p, features)  # [B, H, r, 5]: total, sum p (j - lo), sink, first, last
        total, jsum = got[..., 0], got[..., 1]
        # entropy: -sum A log A = total * log(sum e) - sum A (s - top), s - top as shifted above
        entropy = total * torch.log(total_e) - torch.mul(p, s, out=s).sum(-1)  # s is not needed after this
        # the largest weight: exp(0) / sum e, the row's largest score being the shift (with sinks it may not be)
        maxw = p.amax(-1) if sink_logit is not None else 1.0 / total_e
        i_rel = (qpos - lo).to(f32)  # [r]
        band = _band(p, qpos, lo, hi, settings.local)
        # distance: sum A |i - j|, split at the diagonal: keys left of the block's first row and right of its last
        # are on one side for every row; the keys in between are summed exactly
        c0, c1 = max(lo, int(qpos[0])), min(hi, int(qpos[-1]) + 1)
        if c1 > c0:
            mid = p[..., c0 - lo:c1 - lo]
            jm = key_pos[c0:c1].to(f32)
            dmid = (mid * (qpos[:, None].to(f32) - jm[None]).abs()).sum(-1)
            amid = mid.sum(-1)
            jmid = torch.matmul(mid, (jm - lo)[:, None])[..., 0]
        else:
            dmid = amid = jmid = torch.zeros_like(total)
        left = p[..., :max(0, c0 - lo)]
        if left.shape[-1]:
            aleft = left.sum(-1)
            jleft = torch.matmul(left, (key_pos[lo:c0] - lo).to(f32)[:, None])[..., 0]
        else:
            aleft = jleft = torch.zeros_like(total)
        aright, jright = total - aleft - amid, jsum - jleft - jmid
        distance = (i_rel * aleft - jleft) + dmid + (jright - i_rel * aright)
        diag = _at(p, qpos - lo, hi - lo)
        prev = _at(p, qpos - 1 - lo, hi - lo)
        nan = torch.tensor(math.nan, device=dev)
        valid = live.expand(b, h, r)
        values = {"entropy": entropy, "max": maxw, "sink_mass": got[..., 2], "local_mass": band, "total": total,
                  "distance": distance, "diagonal": diag, "previous": prev, "first": got[..., 3],
                  "last": got[..., 4]}
        for name, value in values.items():
            rows[name][:, :, r0:r1] = torch.where(valid, value, nan)
        out["argmax"][:, :, r0:r1] = torch.where(valid, arg + lo, -1)
        keys_seen[:, r0:r1] = keep[:, 0].sum(-1)
        if not bool(live.all()):  # a row that may attend nothing has no weights
            p.mul_(live[..., None])
        if rows_out is not None:
            for pos in range(r0, r1):
                if pos in wanted:
                    rows_out[:, :, wanted[pos], lo:hi] = p[:, :, pos - r0]
        if not bool(row_real.all()):  # padded rows add nothing to the per-key and pooled sums
            p.mul_(row_real[..., None])
        received[..., lo:hi] += p.sum(-2)
        seen_by[:, lo:hi] += (keep[:, 0] & row_real[:, 0, :, None]).sum(-2)
        # the pooled map: each cell's sum and largest weight, over whole key blocks
        kk = hi - lo
        nkb = -(-kk // bk)
        pad = nkb * bk - kk
        pp = torch.nn.functional.pad(p, (0, pad)) if pad else p
        kb = torch.nn.functional.pad(keep, (0, pad)) if pad else keep
        qblock = (torch.arange(r0, r1, device=dev) // bq)
        kb0 = lo // bk
        cell_sum = pp.reshape(b, h, r, nkb, bk).sum(-1).to(torch.float64)
        cell_max = pp.reshape(b, h, r, nkb, bk).amax(-1)
        cell_seen = (kb[:, 0] & row_real[:, 0, :, None]).reshape(b, r, nkb, bk).any(-1)
        pooled_sum[:, :, :, kb0:kb0 + nkb].index_add_(2, qblock, cell_sum)
        block_max = pooled_max[:, :, :, kb0:kb0 + nkb]
        block_max.scatter_reduce_(2, qblock[None, None, :, None].expand_as(cell_max), cell_max, "amax")
        seen_cells = torch.zeros((b, pq, nkb), dtype=torch.int64, device=dev)
        seen_cells.index_add_(1, qblock, cell_seen.to(torch.int64))
        pooled_seen[:, :, kb0:kb0 + nkb] |= seen_cells > 0
        pooled_rows.index_add_(1, qblock, row_real[:, 0].to(torch.int64))
    widths = torch.tensor([ke[i + 1] - ke[i] for i in range(pk)], dtype=torch.float64, device=dev)
    cells = pooled_rows[:, None, :, None].to(torch.float64) * widths
    ok = (pooled_seen & (pooled_rows[:, :, None] > 0))[:, None]
    result = dict(out)
    result["pooled_mean"] = torch.where(ok, pooled_sum / cells.clamp_min(1), math.nan).to(f32)
    result["pooled_max"] = torch.where(ok, pooled_max, torch.tensor(math.nan, device=dev))
    result["received"] = received.to(f32)
    result["seen_by"] = seen_by.to(torch.int32)
    result["keys_seen"] = keys_seen.to(torch.int32)
    result["real_keys"] = real_keys
    if rows_out is not None:
        result["rows"] = rows_out
    return result


def _at(p: Any, index: Any, width: int) -> Any:
    """``p[..., i, index[i]]`` for each row i (0 where the index is outside the block's keys)."""
    import torch

    inside = (index >= 0) & (index < width)
    got = p.gather(-1, index.clamp(0, max(width - 1, 0)).expand(*p.shape[:-2], -1)[..., None])[..., 0]
    return torch.where(inside, got, torch.zeros((), device=p.device))


def _band(p: Any, qpos: Any, lo: int, hi: int, window: int) -> Any:
    """The mass on the keys i - W < j <= i of each row i (``window`` W)."""
    import torch

    first = max(lo, int(qpos[0]) - window + 1)
    last = min(hi, int(qpos[-1]) + 1)
    if last <= first:
        return torch.zeros(p.shape[:-1], device=p.device)
    j = torch.arange(first, last, device=p.device)
    inside = (j[None] <= qpos[:, None]) & (j[None] > qpos[:, None] - window)
    return (p[..., first - lo:last - lo] * inside).sum(-1)


def _real_keys(parts: MaskParts, dense: Any, b: int, lq: int, lk: int, dev: Any) -> Any:
    """[B, Lk] bool: the keys some query row may attend (the padding vector; from a dense mask, its columns'
    any, a block of rows at a time)."""
    import torch

    if dense is None:
        return parts.padding_tensor(b, lk, dev)
    found = torch.zeros((b, lk), dtype=torch.bool, device=dev)
    step = max(1, (1 << 26) // max(1, lk))
    for r0 in range(0, lq, step):
        found |= dense[:, :, r0:r0 + step].any(-2).any(1).expand(b, lk)
    return found


def _rows_seeing(parts: MaskParts, dense: Any, b: int, lq: int, lk: int, dev: Any) -> Any:
    """[B, Lq] bool: the rows that may attend some key (cross attention: every decoder row)."""
    import torch

    if dense is None:
        return torch.ones((b, lq), dtype=torch.bool, device=dev) if parts.padding_tensor(b, lk, dev).any() else \
            torch.zeros((b, lq), dtype=torch.bool, device=dev)
    found = torch.zeros((b, lq), dtype=torch.bool, device=dev)
    step = max(1, (1 << 26) // max(1, lk))
    for r0 in range(0, lq, step):
        found[:, r0:r0 + step] = dense[:, :, r0:r0 + step].any(-1).any(1).expand(b, -1)
    return found


def _first_real(real: Any, count: int) -> Any:
    """[B, Lk] float: 1 on each row's first ``count`` real keys."""
    import torch

    ranks = real.to(torch.int64).cumsum(-1)
    return (real & (ranks <= count)).float()


def _key_range(parts: MaskParts, dense: Any, r0: int, r1: int, q_pos0: int, lk: int) -> tuple[int, int]:
    """The keys rows ``r0:r1`` may attend lie in ``[lo, hi)``: causal rows see no later key, a window no
    earlier one than its width."""
    hi, lo = lk, 0
    if dense is None:
        if parts.causal:
            hi = min(lk, q_pos0 + r1)
        if parts.window is not None:
            lo = max(0, q_pos0 + r0 - parts.window + 1)
    return lo, max(hi, lo + 1)


def _keep_block(parts: MaskParts, dense: Any, real_keys: Any, r0: int, r1: int, lo: int, hi: int, q_pos0: int,
                dev: Any) -> Any:
    """[B, 1, r, hi - lo] bool: the keep mask of rows r0:r1 over keys lo:hi."""
    import torch

    if dense is not None:
        block = dense[:, :, r0:r1, lo:hi]
        return block if block.shape[1] == 1 else block.any(1, keepdim=True)
    i = torch.arange(r0, r1, device=dev)[:, None] + q_pos0
    j = torch.arange(lo, hi, device=dev)[None]
    keep = real_keys[:, None, None, lo:hi]
    if parts.causal:
        keep = keep & (j <= i)
    if parts.window is not None:
        keep = keep & (j > i - parts.window)
    return keep.expand(real_keys.shape[0], 1, r1 - r0, hi - lo)


def mask_parts(dense: Any, *, causal: bool, window: int | None, lq: int, lk: int,
               self_attention: bool) -> tuple[MaskParts | None, Any]:
    """A site's mask as parts, and its real keys ``[B, Lk]`` (bool, torch). ``dense`` is the boolean keep mask
    the attention function received (``[B or 1, 1 or H, Lq, Lk]``; None: none was built, so ``causal`` says
    it all, as SDPA's ``is_causal`` does). With a dense mask, the padding is the keys some row may attend,
    and the parts are tried in turn (causal with the site's window, causal, none) against every row, a block
    at a time on the mask's device; None when none of them is the mask (a user's 4-D mask, packed sequences,
    bidirectional image spans: the dense mask is kept)."""
    import torch

    if dense is None:
        return MaskParts(causal=causal and lq > 1, window=None, q_offset=lk - lq if self_attention else 0,
                         self_attention=self_attention), None
    b = dense.shape[0]
    dev = dense.device
    real = torch.zeros((b, lk), dtype=torch.bool, device=dev)
    step = max(1, (1 << 25) // max(1, lk))
    for r0 in range(0, lq, step):
        real |= dense[:, :, r0:r0 + step].any(-2).any(1)
    offset = lk - lq if self_attention else 0
    tried: list[tuple[bool, int | None]] = []
    if self_attention and window is not None:
        tried.append((True, int(window)))
    if self_attention:
        tried.append((True, None))
    tried.append((False, None))
    for is_causal, win in tried:
        parts = MaskParts(causal=is_causal, window=win, padding=real, q_offset=offset, self_attention=self_attention)
        if _same_mask(parts, dense, real, lq, lk, step):
            return parts, real
    return None, real


def _same_mask(parts: MaskParts, dense: Any, real: Any, lq: int, lk: int, step: int) -> bool:
    dev = dense.device
    sample = sorted({0, lq - 1, lq // 2, *range(0, lq, max(1, lq // 16))})
    spans = [(r, r + 1) for r in sample] + [(r, min(lq, r + step)) for r in range(0, lq, step)]
    for r0, r1 in spans:  # a few rows first: a mask of other parts fails there at once
        built = _keep_block(parts, None, real, r0, r1, 0, lk, parts.q_offset, dev)
        given = dense[:, :, r0:r1]
        given = given if given.shape[1] == 1 else given.any(1, keepdim=True)
        if not bool((built == given).all()):
            return False
    return True


def step_row(query: Any, key: Any, *, scale: float, dense: Any = None, softcap: float | None = None,
             sinks: Any = None, bias: Any = None) -> Any:
    """The exact weights of a few rows, ``[B, H, r, Lk]`` float32: query ``[B, H, r, d]`` (a decode step's row,
    or rows chosen to check a family), keys ``[B, Hkv, Lk, d]``, ``dense`` their keep mask ``[B, 1, r, Lk]``."""
    import torch

    b, h, r, _ = query.shape
    hkv, lk = key.shape[1], key.shape[-2]
    s = torch.matmul(query.to(torch.float32).reshape(b, hkv, (h // hkv) * r, -1),
                     key.to(torch.float32).transpose(-1, -2)).reshape(b, h, r, lk) * scale
    if softcap is not None:
        s = torch.tanh(s / softcap) * softcap
    if bias is not None:
        s = s + bias.to(torch.float32)
    if dense is not None:
        s = s.masked_fill(~dense, -math.inf)
    if sinks is not None:
        s = torch.cat([s, sinks.to(torch.float32).reshape(1, h, 1, 1).expand(b, h, r, 1)], -1)
    top = s.amax(-1, keepdim=True)
    top = torch.where(torch.isfinite(top), top, torch.zeros_like(top))
    e = torch.exp(s - top)
    w = e / e.sum(-1, keepdim=True).clamp_min(torch.finfo(torch.float32).tiny)
    return w[..., :lk]

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
import threading
from typing import Any

from attnviz.rowmath import real_ends_torch, softmax_block, softmax_of_scores_torch
from attnviz.summarystats import PER_ROW, MaskParts, SummarySettings, pool_edges

#: scores held at a time per block (float32 values, all heads): the block's rows follow from it
BLOCK_VALUES = 1 << 20  # 4 MiB of scores a block: the block stays in the caches while it is read again
MASKED = -1e30  # masked scores: exp underflows to exactly 0, and 0 * MASKED is 0 (not NaN as with -inf)


def summarise(query: Any, key: Any, **options: Any) -> dict[str, Any]:
    """``_summarise`` (below); on the CPU its many small operations each on one thread of torch's, the blocks
    of rows as many at once as torch had threads (``run_blocks``)."""
    return threaded(_summarise, query, key, **options)


def threaded(run: Any, query: Any, *args: Any, **options: Any) -> Any:
    """``run(query, *args, threads=N, **options)``: on the CPU with N torch threads, torch set to one thread while
    it runs (each block of rows on one thread: ``run_blocks``); elsewhere N = 1."""
    import torch

    threads = torch.get_num_threads()
    if query.device.type != "cpu" or threads < 2:
        return run(query, *args, threads=1, **options)
    torch.set_num_threads(1)
    try:
        return run(query, *args, threads=threads, **options)
    finally:
        torch.set_num_threads(threads)


class BlockScores:
    """The scores of a site's query rows a block at a time, as the family makes them: ``query [B, H, Lq, d]``
    times ``scale``, against ``key [B, Hkv, Lk, d]`` (grouped-query heads: ``H / Hkv`` query heads a key head),
    the ``softcap``, a position ``bias``, then the mask: ``dense`` (a boolean keep mask ``[B or 1, 1 or H, Lq,
    Lk]``, sliced a block at a time; a mask per head masks each head's scores by its own keys, as the model does)
    or ``parts`` (padding, causal, window: only what they mask is touched). Masked scores are ``MASKED``.
    ``key_block``: the keys are padded (masked) to a multiple of it (the summary's pooled blocks). Shared by the
    summary (below) and the corpus's long texts (``capturing.corpuslong``)."""

    def __init__(self, query: Any, key: Any, *, scale: float, parts: MaskParts, dense: Any = None,
                 softcap: float | None = None, bias: Any = None, key_block: int = 1) -> None:
        import torch

        dev = query.device
        f32 = torch.float32
        query, key = query.detach(), key.detach()  # the blocks may run in threads where autograd is on
        bias = None if bias is None else bias.detach()
        b, h, lq, _ = query.shape
        hkv, lk = key.shape[1], key.shape[-2]
        self.b, self.h, self.hkv, self.lq, self.lk = b, h, hkv, lq, lk
        self.groups = h // hkv
        self.lkp = -(-lk // key_block) * key_block  # the keys padded to whole blocks (the padding is masked)
        if self.lkp == lk and key.dtype == f32:
            self.kt = key.transpose(-1, -2)  # a view: no copy of the keys
        else:
            self.kt = torch.zeros((b, hkv, key.shape[-1], self.lkp), dtype=f32, device=dev)
            self.kt[..., :lk] = key.to(f32).transpose(-1, -2)
        self.query, self.scale = query, scale
        self.parts, self.dense, self.softcap, self.bias = parts, dense, softcap, bias
        self.q_pos0 = parts.q_offset
        self.mask_heads = 1 if dense is None else int(dense.shape[1])  # 1, or H: a mask per head
        self.real_keys = _real_keys(parts, dense, b, lq, lk, dev)  # [B, Lk] bool
        self.realp = torch.zeros((b, self.lkp), dtype=torch.bool, device=dev)
        self.realp[:, :lk] = self.real_keys
        #: per batch entry, the real keys before each position (a row's keys seen, from its window of them)
        self.counts = None if dense is not None else torch.nn.functional.pad(self.realp.to(torch.int64).cumsum(-1),
                                                                             (1, 0))

    def key_range(self, r0: int, r1: int) -> tuple[int, int]:
        """The keys rows ``r0:r1`` may attend lie in ``[lo, hi)`` (``_key_range``)."""
        return _key_range(self.parts, self.dense, r0, r1, self.q_pos0, self.lk)

    def scores(self, r0: int, r1: int, lo: int, hi: int) -> tuple[Any, Any, Any, Any]:
        """Rows ``r0:r1`` against keys ``lo:hi`` (``hi`` up to the padded keys): the scores ``[B, H, r, hi - lo]``
        (float32, masked ones ``MASKED``), the keep mask ``[B, M, r, hi - lo]`` (None for a mask of parts), how
        many keys each row may see ``[B, M, r]`` and whether it may see any ``[B, M, r]``: ``M`` is
        ``mask_heads``, 1, or H where the mask differs per head."""
        import torch

        b, h, r, width = self.b, self.h, r1 - r0, hi - lo
        lk = self.lk
        dev = self.query.device
        qs = self.query[:, :, r0:r1].to(torch.float32) * self.scale
        s = torch.matmul(qs.reshape(b, self.hkv, self.groups * r, -1), self.kt[..., lo:hi]).view(b, h, r, width)
        if self.softcap is not None:
            s.div_(self.softcap).tanh_().mul_(self.softcap)
        if self.bias is not None:
            s[..., :max(0, min(hi, lk) - lo)].add_(self.bias[..., r0:r1, lo:min(hi, lk)].to(torch.float32))
        if self.dense is not None:
            keep = torch.zeros((b, self.mask_heads, r, width), dtype=torch.bool, device=dev)
            got = self.dense[:, :, r0:r1, lo:min(hi, lk)]
            keep[..., :got.shape[-1]] = got
            s.masked_fill_(~keep, MASKED)
            return s, keep, keep.sum(-1), keep.any(-1)
        pos = torch.arange(r0, r1, device=dev) + self.q_pos0
        seen = _mask_parts_block(s, self.parts, self.realp, self.counts, pos, lo, hi, lk)[:, None]
        return s, None, seen, seen > 0

    def keep(self, r0: int, r1: int, lo: int, hi: int) -> Any:
        """[B, M, r, hi - lo] bool: the keep mask of rows r0:r1 over keys lo:hi (``hi`` <= Lk; M as ``scores``)."""
        return _keep_block(self.parts, self.dense, self.real_keys, r0, r1, lo, hi, self.q_pos0, self.query.device)


def _summarise(query: Any, key: Any, *, scale: float, settings: SummarySettings, parts: MaskParts,
               dense: Any = None, softcap: float | None = None, sinks: Any = None, bias: Any = None,
               row_budget: int = BLOCK_VALUES, threads: int = 1, on_rows: Any = None) -> dict[str, Any]:
    """The summary of one call of a site: ``query [B, H, Lq, d]``, ``key [B, Hkv, Lk, d]`` (torch, any
    device), ``dense`` a boolean keep mask ``[B or 1, 1 or H, Lq, Lk]`` (or None: ``parts`` say it all);
    ``on_rows(n)`` is told of each block's ``n`` query rows once they are summed (a progress bar's steps).
    Returns torch tensors on the same device, named as ``attnviz.summarystats`` names them (with a mask per
    head, ``keys_seen`` and ``seen_by`` per head too: ``[B, H, Lq]``, ``[B, H, Lk]``).

    Each block of query rows is read a few times only: its scores ``s`` (the keys it may see, in whole
    blocks of the pooled map), the maximum of each (row, key block) (which gives the row's maximum, its key,
    and the pooled maxima), ``e = exp(s - max)`` beside the shifted scores (kept for the entropy), its row
    sums, one small matrix product for the per-row sums over key functions (sink keys, the first and last
    real key, positions),
    one row dot for the entropy, and one matrix product per query block for the received attention and the
    pooled sums; every per-row quantity is divided by the row's sum at the end, not each weight. The steps are
    ``_Summary``'s: the sums made ready, each block of rows (``block``: its per-row statistics, the rows kept,
    its share of the sums over rows), then the sums over rows as the summary's arrays (``result``)."""
    lq = query.shape[2]
    qe, ke = pool_edges(lq, settings.pool), pool_edges(key.shape[-2], settings.pool)
    scorer = BlockScores(query, key, scale=scale, parts=parts, dense=dense, softcap=softcap, bias=bias,
                         key_block=ke[1] - ke[0])
    summary = _Summary(scorer, settings, qe, ke, sinks, row_budget, on_rows)
    run_blocks(summary.block, list(range(0, lq, summary.step)), threads)
    return summary.result()


class _Summary:
    """One call's summary while its blocks of query rows are summed (``_summarise``): the per-row statistics are
    written into each block's rows, the sums over rows (received attention, the pooled map, the rows and keys
    seen) added under a lock, as blocks run a few threads at a time (``run_blocks``)."""

    def __init__(self, scorer: BlockScores, settings: SummarySettings, qe: list[int], ke: list[int], sinks: Any,
                 row_budget: int, on_rows: Any) -> None:
        import torch

        parts, dense = scorer.parts, scorer.dense
        dev = scorer.query.device
        b, h, lq, lk, lkp = scorer.b, scorer.h, scorer.lq, scorer.lk, scorer.lkp
        f32 = torch.float32
        pq, pk = len(qe) - 1, len(ke) - 1
        hm = scorer.mask_heads  # 1, or H: the keys seen, the rows counted and the cells seen are per head
        self.scorer, self.settings, self.qe, self.ke, self.on_rows = scorer, settings, qe, ke, on_rows
        self.dev, self.hm = dev, hm
        self.bq, self.bk = qe[1] - qe[0], ke[1] - ke[0]
        self.step = max(1, min(lq, row_budget // max(1, b * h * lkp)))  # the rows of a block: row_budget scores
        real_keys, realp = scorer.real_keys, scorer.realp  # [B, Lk], [B, Lkp] bool
        self.real_rows = real_keys[:, lk - lq:] if parts.self_attention and lq <= lk else \
            _rows_seeing(parts, dense, b, lq, lk, dev)
        first_key, last_key = real_ends_torch(real_keys)  # [B]
        self.key_pos = key_pos = torch.arange(lkp, device=dev)
        self.features = features = torch.zeros((b, 1, lkp, 4), dtype=f32, device=dev)  # position, sink, first, last
        features[..., 0] = key_pos.to(f32)
        features[..., 1] = _first_real(realp, settings.sinks)[:, None]
        features[..., 2] = (key_pos[None] == first_key[:, None]).to(f32)[:, None]
        features[..., 3] = (key_pos[None] == last_key[:, None]).to(f32)[:, None]
        self.out = {name: torch.full((b, h, lq), math.nan, dtype=f32, device=dev) for name in PER_ROW}
        self.out["argmax"] = torch.full((b, h, lq), -1, dtype=torch.int64, device=dev)
        self.keys_seen = torch.zeros((b, hm, lq), dtype=torch.int64, device=dev)
        self.counted_rows = torch.zeros((b, hm, lq), dtype=torch.bool, device=dev)
        self.received = torch.zeros((b, h, lkp), dtype=torch.float64, device=dev)
        self.seen_by = torch.zeros((b, hm, lkp), dtype=torch.int64, device=dev)
        self.pooled_sum = torch.zeros((b, h, pq, pk), dtype=torch.float64, device=dev)
        self.pooled_max = torch.zeros((b, h, pq, pk), dtype=f32, device=dev)
        #: whether a kept (real row, key) lies in the cell
        self.pooled_seen = torch.zeros((b, hm, pq, pk), dtype=torch.bool, device=dev)
        self.positions = positions = settings.row_positions(lq)
        self.rows_out = torch.zeros((b, h, len(positions), lk), dtype=f32, device=dev) if positions else None
        self.wanted = {p: n for n, p in enumerate(positions)}
        self.sink_logit = None if sinks is None else sinks.to(f32).reshape(1, h, 1).to(dev)
        self.lock = threading.Lock()

    def block(self, r0: int) -> None:
        """The rows ``r0`` to ``r0 + step``: their scores and weights, each row's statistics, the rows kept whole,
        and their share of the sums over rows."""
        import torch

        scorer, dev, bk, out = self.scorer, self.dev, self.bk, self.out
        b, h, lq, lkp = scorer.b, scorer.h, scorer.lq, scorer.lkp
        r1 = min(lq, r0 + self.step)
        r = r1 - r0
        pos = torch.arange(r0, r1, device=dev) + scorer.q_pos0  # the rows' positions among the keys
        lo, hi = scorer.key_range(r0, r1)
        lo, hi = lo // bk * bk, min(lkp, -(-hi // bk) * bk)  # whole key blocks of the pooled map
        width, nj, j0 = hi - lo, (hi - lo) // bk, lo // bk
        s, keep, seen, live = scorer.scores(r0, r1, lo, hi)  # live: [B, M, r], the rows that may see a key
        row_real = self.real_rows[:, None, r0:r1] & live  # [B, M, r]: the rows that count in sums over rows
        blocks = s.view(b, h, r, nj, bk)
        block_max = blocks.amax(-1)  # [B, H, r, nj]
        top, which = block_max.max(-1)
        inside = blocks.gather(3, which[..., None, None].expand(b, h, r, 1, bk))[..., 0, :].argmax(-1)
        arg = (which + j0) * bk + inside
        alive = live.expand(b, h, r)  # live: [B, M, r] (M: 1, or H with a mask per head)
        x, entropy, maxw = softmax_block(s, top, sink=self.sink_logit, live=alive)  # a row that sees nothing: none
        e, top, total_e, inv = x.e, x.shift, x.total, x.inv
        got = torch.matmul(e, self.features[:, :, lo:hi])  # [B, H, r, 4]: sums of e times position, sink, first, last
        total = total_e * inv
        distance = _distance(e, got[..., 0], total_e, inv, pos, lo, hi, self.key_pos)
        values = {"entropy": entropy, "max": maxw, "sink_mass": got[..., 1] * inv,
                  "local_mass": _band(e, pos, lo, hi, self.settings.local) * inv, "total": total, "distance": distance,
                  "diagonal": values_at(e, pos - lo, width) * inv, "previous": values_at(e, pos - 1 - lo, width) * inv,
                  "first": got[..., 2] * inv, "last": got[..., 3] * inv}
        nan = torch.tensor(math.nan, device=dev)
        for name, value in values.items():
            out[name][:, :, r0:r1] = torch.where(alive, value, nan)
        out["argmax"][:, :, r0:r1] = torch.where(alive, arg, -1)
        self.keys_seen[..., r0:r1] = seen
        self.counted_rows[..., r0:r1] = row_real
        self._keep_rows(e, inv, r0, r1, lo, hi)
        self._add_sums(e, inv, row_real, block_max, top, keep, r0, r1, lo, hi)
        if self.on_rows is not None:
            with self.lock:
                self.on_rows(r)

    def _keep_rows(self, e: Any, inv: Any, r0: int, r1: int, lo: int, hi: int) -> None:
        """The weights of the rows ``--rows`` chose among ``r0:r1``, whole (keys ``lo:hi``; the others are 0)."""
        rows_out, wanted, lk = self.rows_out, self.wanted, self.scorer.lk
        for pos_wanted in range(r0, r1):
            if pos_wanted in wanted and rows_out is not None:
                n = wanted[pos_wanted]
                end = min(hi, lk)
                rows_out[:, :, n, lo:end] = e[:, :, pos_wanted - r0, :end - lo] * inv[:, :, pos_wanted - r0, None]

    def _add_sums(self, e: Any, inv: Any, row_real: Any, block_max: Any, top: Any, keep: Any, r0: int, r1: int,
                  lo: int, hi: int) -> None:
        """Per query block of the pooled map: the weights of its real rows summed per key (one matrix product),
        which give the received attention and the pooled sums; the pooled maxima from the block maxima; the keys
        and cells a counted row sees, where the mask is dense (a mask of parts gives them at the end)."""
        import torch

        b, h, hm, bk = self.scorer.b, self.scorer.h, self.hm, self.bk
        r, nj, j0 = r1 - r0, (hi - lo) // bk, lo // bk
        weight = inv * row_real  # [B, H, r]
        cell_top = torch.exp(block_max - top[..., None]) * weight[..., None]  # [B, H, r, nj]
        qb = (torch.arange(r0, r1) // self.bq).tolist()
        start = 0
        while start < r:
            qi = qb[start]
            stop = start
            while stop < r and qb[stop] == qi:
                stop += 1
            sums = torch.matmul(weight[:, :, None, start:stop], e[:, :, start:stop])[:, :, 0]  # [B, H, width]
            cells = sums.view(b, h, nj, bk).sum(-1)
            tops = cell_top[:, :, start:stop].amax(2)
            kept = None if keep is None else keep[:, :, start:stop] & row_real[:, :, start:stop, None]
            with self.lock:  # blocks run a few threads at a time (``run_blocks``); their sums meet here
                self.received[..., lo:hi] += sums
                self.pooled_sum[:, :, qi, j0:j0 + nj] += cells
                self.pooled_max[:, :, qi, j0:j0 + nj] = torch.maximum(self.pooled_max[:, :, qi, j0:j0 + nj], tops)
                if kept is not None:
                    self.seen_by[..., lo:hi] += kept.sum(2)
                    self.pooled_seen[:, :, qi, j0:j0 + nj] |= kept.view(b, hm, stop - start, nj, bk).any(-1).any(2)
            start = stop

    def result(self) -> dict[str, Any]:
        """The summary's arrays once every block is summed: the per-row statistics, the pooled map's means (over
        the cells' kept elements) and maxima, the received attention, the keys and rows seen."""
        import torch

        scorer, qe, ke, dev, out = self.scorer, self.qe, self.ke, self.dev, self.out
        lk, parts = scorer.lk, scorer.parts
        pq, pk = len(qe) - 1, len(ke) - 1
        f32 = torch.float32
        seen_by, pooled_seen, counted_rows = self.seen_by, self.pooled_seen, self.counted_rows
        if scorer.dense is None:
            seen_by, pooled_seen = _seen_from_parts(parts, scorer.counts, counted_rows[:, 0], scorer.realp,
                                                    scorer.q_pos0, lk, qe, ke)
            seen_by, pooled_seen = seen_by[:, None], pooled_seen[:, None]
        pooled_rows = torch.stack([counted_rows[..., qe[i]:qe[i + 1]].sum(-1) for i in range(pq)], -1)  # [B, M, Pq]
        widths = torch.tensor([ke[i + 1] - ke[i] for i in range(pk)], dtype=torch.float64, device=dev)
        cells = pooled_rows[..., None].to(torch.float64) * widths
        ok = pooled_seen & (pooled_rows[..., None] > 0)
        result = dict(out)
        result["pooled_mean"] = torch.where(ok, self.pooled_sum / cells.clamp_min(1), math.nan).to(f32)
        result["pooled_max"] = torch.where(ok, self.pooled_max, torch.tensor(math.nan, device=dev))
        result["received"] = self.received[..., :lk].to(f32)
        one = (lambda t: t[:, 0]) if self.hm == 1 else (lambda t: t)  # one mask for every head: [B, Lk], [B, Lq]
        result["seen_by"] = one(seen_by[..., :lk]).to(torch.int32)
        result["keys_seen"] = one(self.keys_seen).to(torch.int32)
        result["argmax"] = out["argmax"].to(torch.int32)
        result["real_keys"] = scorer.real_keys
        result["pool_q_edges"] = torch.tensor(qe, dtype=torch.int64, device=dev)
        result["pool_k_edges"] = torch.tensor(ke, dtype=torch.int64, device=dev)
        if self.rows_out is not None:
            result["rows"] = self.rows_out
            result["row_positions"] = torch.tensor(self.positions, dtype=torch.int64, device=dev)
        return result


def _distance(e: Any, jsum: Any, total_e: Any, inv: Any, pos: Any, lo: int, hi: int, key_pos: Any) -> Any:
    """Each row's mean distance to the keys it attends, sum A |pos - j|, from the block's exponentials ``e`` (keys
    ``lo:hi``), their sums ``total_e`` and times the key's position ``jsum``: the keys left of the block's first
    row and right of its last are on one side of every row's diagonal; the keys in between are summed exactly."""
    import torch

    f32 = torch.float32
    posf = pos.to(f32)
    c0, c1 = max(lo, int(pos[0])), min(hi, int(pos[-1]) + 1)
    if c1 > c0:
        mid = e[..., c0 - lo:c1 - lo]
        jm = key_pos[c0:c1].to(f32)
        dmid = torch.matmul(mid, jm[:, None])[..., 0]
        amid = mid.sum(-1)
        absmid = (mid * (posf[:, None] - jm[None]).abs()).sum(-1)
    else:
        dmid = amid = absmid = torch.zeros_like(total_e)
    if c0 > lo:
        left = e[..., :c0 - lo]
        aleft = left.sum(-1)
        jleft = torch.matmul(left, key_pos[lo:c0].to(f32)[:, None])[..., 0]
    else:
        aleft = jleft = torch.zeros_like(total_e)
    aright, jright = total_e - aleft - amid, jsum - jleft - dmid
    return ((posf * aleft - jleft) + absmid + (jright - posf * aright)) * inv


def _mask_parts_block(s: Any, parts: MaskParts, realp: Any, counts: Any, pos: Any, lo: int, hi: int,
                      lk: int) -> Any:
    """Mask the scores of a block of rows (keys ``lo:hi``) by the mask's parts, touching only what they mask:
    padding columns, the triangle above the diagonal, the edge of the window. Returns how many keys each
    row may see, ``[B, r]``."""
    import torch

    dev = s.device
    pad = realp[:, lo:hi]
    if not bool(pad.all()):
        s.masked_fill_(~pad[:, None, None, :], MASKED)
    first, last = int(pos[0]), int(pos[-1])
    if parts.causal and hi > first + 1:  # keys after a row's own position
        c0 = max(lo, first + 1)
        j = torch.arange(c0, hi, device=dev)
        s[..., c0 - lo:].masked_fill_(j[None] > pos[:, None], MASKED)
    if parts.window is not None:
        edge = min(hi, last - parts.window + 1)  # keys at or before pos - W
        if edge > lo:
            j = torch.arange(lo, edge, device=dev)
            s[..., :edge - lo].masked_fill_(j[None] <= pos[:, None] - parts.window, MASKED)
    top = torch.clamp(pos + 1, max=lk) if parts.causal else torch.full_like(pos, lk)
    bottom = torch.clamp(pos - parts.window + 1, min=0) if parts.window is not None else torch.zeros_like(pos)
    return counts.gather(1, top[None].expand(counts.shape[0], -1)) - counts.gather(
        1, torch.minimum(bottom, top)[None].expand(counts.shape[0], -1))


def _seen_from_parts(parts: MaskParts, counts: Any, counted: Any, realp: Any, q_pos0: int, lk: int,
                     qe: list[int], ke: list[int]) -> tuple[Any, Any]:
    """For a mask of parts: per key, the counted rows that may see it (``seen_by``), and per pooled cell,
    whether a counted row may see a key of it; from each row's window of keys, without a block of bools."""
    import torch

    dev = counted.device
    b, lq = counted.shape
    pos = torch.arange(lq, device=dev) + q_pos0
    top = torch.clamp(pos + 1, max=lk) if parts.causal else torch.full_like(pos, lk)
    bottom = torch.clamp(pos - parts.window + 1, min=0) if parts.window is not None else torch.zeros_like(pos)
    bottom = torch.minimum(bottom, top)
    diff = torch.zeros((b, realp.shape[-1] + 1), dtype=torch.int64, device=dev)
    c = counted.to(torch.int64)
    diff.index_add_(1, bottom, c)
    diff.index_add_(1, top, -c)
    seen_by = diff.cumsum(-1)[:, :-1] * realp
    pq, pk = len(qe) - 1, len(ke) - 1
    seen = torch.zeros((b, pq, pk), dtype=torch.bool, device=dev)
    k_lo = torch.tensor(ke[:-1], device=dev)
    k_hi = torch.tensor(ke[1:], device=dev)
    for qi in range(pq):
        rows = slice(qe[qi], qe[qi + 1])
        lo_i = torch.maximum(bottom[rows, None], k_lo[None])  # [r, Pk]
        hi_i = torch.minimum(top[rows, None], k_hi[None])
        for bi in range(b):
            n = counts[bi][hi_i.clamp(min=0)] - counts[bi][torch.minimum(lo_i, hi_i)]
            seen[bi, qi] = ((n > 0) & counted[bi, rows, None]).any(0)
    return seen_by, seen


def run_blocks(run: Any, starts: list[int], threads: int) -> None:
    """``run`` on every block, ``threads`` Python threads at a time (torch lets go of the GIL in its
    operations, each on one thread of its own: OpenMP's count is per thread): a block's dozens of small
    operations never wait at a barrier for a thread the system has lent to another process, as torch's own
    threads would, every operation, on a shared machine."""
    if threads < 2 or len(starts) < 2:
        for r0 in starts:
            run(r0)
        return
    from concurrent.futures import ThreadPoolExecutor

    import torch

    from attnviz.threads import quick_switching

    pool = ThreadPoolExecutor(threads, thread_name_prefix="attnviz-summary", initializer=torch.set_num_threads,
                              initargs=(1,))
    try:
        with quick_switching():
            for done in [pool.submit(run, r0) for r0 in starts]:
                done.result()
    finally:  # on Ctrl-C, SIGTERM or a failed block, the blocks not started are dropped, not run to the end
        pool.shutdown(wait=True, cancel_futures=True)


def values_at(p: Any, index: Any, width: int) -> Any:
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
    """[B, 1 or H, r, hi - lo] bool: the keep mask of rows r0:r1 over keys lo:hi (a dense mask's own heads)."""
    import torch

    if dense is not None:
        return dense[:, :, r0:r1, lo:hi]
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
    and the parts are tried in turn (causal with the site's window, causal, none) against every row of every
    head, a block at a time on the mask's device; None when none of them is the mask (a user's 4-D mask, packed
    sequences, bidirectional image spans, a mask that differs per head: the dense mask is kept)."""
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
        if not bool((built == dense[:, :, r0:r1]).all()):  # every head's mask (one that differs per head: not parts)
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
    return softmax_of_scores_torch(s, dense, softcap=softcap, bias=bias, sinks=sinks)

"""A corpus's long texts (``attnviz capture --corpus``): each site's statistics computed from its q and k a block
of query rows at a time, never holding the site's ``[H, L, L]`` weights, and equal to what the exact path
(``capturing.corpus.CorpusAccumulator.add``, from the weights) would add for the same text.

A text whose exact weights over every site, ``sites x H x L x L`` float32 values, would take more than
``BLOCKED_FROM`` bytes runs alone (a batch of one: no padding) and its sites hand their q and k here
(``CorpusAccumulator.add_blocked``). The scores are the family's own, as the summary computes them
(``summarytorch.BlockScores``: scale, softcap, position bias, grouped-query heads, the mask as its parts or
the boolean mask the model built) and gpt-oss's sinks in the denominator. Per block of rows: the row maximum
and its key, ``e = exp(s - max)``, the row sum, one matrix product for the weights on the first and last real
tokens and on each key class (punctuation, the user's classes), one row dot for the entropy, and the weights on
the diagonal and its two neighbours; every per-row quantity is divided by the row's sum at the end. The sums
over rows are kept per head (float64), then each text's means as ``add`` keeps them.

**Head distances** need every layer's rows at once: each site's q and k (the keys at their key-value heads)
are kept while the text runs, when all of them fit ``DISTANCE_BUDGET`` bytes; after the forward, a block of
query rows at a time, every head's smoothed rows are recomputed, gathered flat on the block's real (row, key)
elements and summed pair by pair by the function ``end`` sums a batch's with (``capturing.divergence``). A
text whose q and k do not fit is left out of the distances only (the accumulator counts it; its rows are not in
``js_rows``, so the distances stay a mean per row of the texts they hold).

torch is imported inside the functions.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from attnviz.capturing.divergence import divergence_sums
from attnviz.corpusfile import CORPUS_STATS, SMOOTHING
from attnviz.rowmath import exp_rows, real_ends_torch, row_rule, softmax_block
from attnviz.statistics import BY_NAME, POSITIONAL
from attnviz.summarytorch import MASKED, BlockScores, run_blocks, threaded, values_at

#: a text runs alone, a block of rows at a time, when its exact weights over every site (sites x H x L x L
#: float32) would take more than this many bytes (256 MiB: past 964 tokens of a 6 x 12 encoder, 682 of a 12 x 12
#: one, 362 of a 16 x 32 decoder)
BLOCKED_FROM = 256 << 20
#: the texts of a mini-batch that run exact are split into batches whose weights over every site (texts x sites
#: x H x L x L float32, L the batch's longest) stay within this many bytes (at least one text a batch)
BATCH_BYTES = 256 << 20
#: the most bytes of q and k (every site, as the model holds them) kept for one long text's head distances
DISTANCE_BUDGET = 1 << 30
#: scores held per block of rows of one site (float32 values, all heads), as the summary's blocks
ROW_VALUES = 1 << 20
#: smoothed weights held per block of rows of the head distances (float32 values, every head of every site)
DISTANCE_VALUES = 1 << 22


def exact_bytes(heads: int, tokens: int) -> int:
    """The bytes of a text's exact weights over ``heads`` heads (every site's: sites x H): ``heads x tokens x
    tokens`` float32."""
    return 4 * int(heads) * int(tokens) * int(tokens)


def exact_batches(lengths: list[int], heads: int, budget: int | None = None) -> list[list[int]]:
    """The texts (indices into ``lengths``, in order) cut into consecutive batches whose exact weights over
    ``heads`` heads, padded to the batch's longest text, stay within ``budget`` bytes (``BATCH_BYTES``; one
    text at least)."""
    budget = BATCH_BYTES if budget is None else budget
    out: list[list[int]] = []
    longest = 0
    for k, n in enumerate(lengths):
        wide = max(longest, int(n))
        if out and exact_bytes(heads, wide) * (len(out[-1]) + 1) <= budget:
            out[-1].append(k)
            longest = wide
        else:
            out.append([k])
            longest = int(n)
    return out


def site_count(model: Any) -> int:
    """The self-attention sites a text passes through: the (text or encoder) config's layers; 1 when it names
    none."""
    return _config_count(model, ("num_hidden_layers", "n_layer", "num_layers", "encoder_layers"))


def site_heads(model: Any) -> int:
    """The query heads of a model's attention sites, from its (text) config; 1 when it names none."""
    return _config_count(model, ("num_attention_heads", "n_head", "num_heads", "encoder_attention_heads"))


def _config_count(model: Any, names: tuple[str, ...]) -> int:
    """The first of ``names`` that the model's (text) config sets to a positive integer; 1 when none is."""
    config = model.config
    get = getattr(config, "get_text_config", None)
    text = get() if callable(get) else config
    for name in names:
        value = getattr(text, name, None)
        if isinstance(value, int) and value > 0:
            return value
    return 1


@dataclass
class Call:
    """One site's call of a long text, kept for its head distances: what its scores are made of."""

    site: int  # the accumulator's index of the site
    query: Any  # [1, H, L, d]
    key: Any  # [1, Hkv, L, d]
    parts: Any  # attnviz.summarystats.MaskParts
    dense: Any = None  # the boolean keep mask when the mask is not made of parts
    scale: float = 1.0
    softcap: float | None = None
    sinks: Any = None
    bias: Any = None

    def __post_init__(self) -> None:
        self.sinks = None if self.sinks is None else self.sinks.detach()

    def scorer(self) -> BlockScores:
        return BlockScores(self.query, self.key, scale=self.scale, parts=self.parts, dense=self.dense,
                           softcap=self.softcap, bias=self.bias)


@dataclass
class LongText:
    """The long text running now: its sites' calls kept for the head distances while they fit ``budget`` bytes
    (a tensor several sites share, such as a mask, counted once)."""

    budget: int = DISTANCE_BUDGET
    calls: list[Call] = field(default_factory=list)
    held: int = 0
    counted: set[int] = field(default_factory=set)
    over: bool = False  # the q and k did not fit: the text is left out of the head distances

    def keep(self, call: Call) -> None:
        if self.over:
            return
        more = 0
        for t in (call.query, call.key, call.dense, call.bias, call.sinks):
            if t is not None and id(t) not in self.counted:
                more += int(t.numel()) * int(t.element_size())
        if self.held + more > self.budget:
            self.over = True
            self.calls.clear()
            self.counted.clear()
            return
        self.held += more
        self.counted.update(id(t) for t in (call.query, call.key, call.dense, call.bias, call.sinks) if t is not None)
        self.calls.append(call)


def site_sums(query: Any, key: Any, **options: Any) -> tuple[Any, Any, Any]:
    """``_site_sums`` (below), its blocks of rows a few threads at a time on the CPU (``summary.threaded``)."""
    return threaded(_site_sums, query, key, **options)


def _site_sums(query: Any, key: Any, *, scale: float, parts: Any, real: Any, classes: Any, sink_threshold: float,
               dense: Any = None, softcap: float | None = None, sinks: Any = None, bias: Any = None,
               row_budget: int | None = None, threads: int = 1) -> tuple[Any, Any, Any]:
    """One text's statistics at one site, as ``CorpusAccumulator.add`` keeps them: ``query [1, H, L, d]``,
    ``key [1, Hkv, L, d]``, ``real [1, L]`` its real tokens, ``classes [C, 1, L]`` (punctuation, then the
    user's classes). Returns the text's means ``[S, H]`` (``CORPUS_STATS`` then the user's classes; float64),
    whether the text had rows for each ``[S, H]`` and the real query rows per head ``[H]``."""
    import torch

    dev = query.device
    f32, wide = torch.float32, _wide(dev)
    b, h, lq, _ = query.shape
    lk = key.shape[-2]
    scorer = BlockScores(query, key, scale=scale, parts=parts, dense=dense, softcap=softcap, bias=bias)
    real = real.to(dev).to(torch.bool)
    first, last = (int(t[0]) for t in real_ends_torch(real))
    ncls = int(classes.shape[0])
    feats = torch.zeros((b, 1, lk, 2 + ncls), dtype=f32, device=dev)  # per key: first, last, each class
    feats[:, 0, first, 0] = 1.0
    feats[:, 0, last, 1] = 1.0
    feats[:, 0, :, 2:] = classes.to(dev, f32).permute(1, 2, 0)[:, :lk]
    sink_logit = None if sinks is None else sinks.detach().to(dev, f32).reshape(1, h, 1)
    budget = ROW_VALUES if row_budget is None else row_budget
    step = max(1, min(lq, budget // max(1, b * h * lk)))
    found: dict[int, tuple[Any, ...]] = {}

    def one_block(r0: int) -> None:
        r1 = min(lq, r0 + step)
        pos = torch.arange(r0, r1, device=dev)
        lo, hi = scorer.key_range(r0, r1)
        width = hi - lo
        s, _, seen, live = scorer.scores(r0, r1, lo, hi)  # seen, live: [1, M, r] (M: 1, or H with a mask per head)
        top, arg = s.max(-1)  # ties: the lower index, as the exact path's
        arg = arg + lo
        x, entropy, top_w = softmax_block(s, top, sink=sink_logit, live=live)  # live: [1, M, r], over the heads
        e, inv = x.e, x.inv
        got = torch.matmul(e, feats[:, :, lo:hi]) * inv[..., None]  # [1, H, r, 2 + C]
        rows = real[:, None, r0:r1] & live  # [1, M, r]: each head's rows where the mask differs per head
        # the rows each statistic is a mean over (its rule in attnviz.statistics)
        where = {rule: row_rule(rule, rows, pos, first, last) for rule in POSITIONAL}
        sees_first = rows & scorer.keep(r0, r1, first, first + 1)[..., 0]
        values = {"first": got[..., 0], "last": got[..., 1], "punctuation": got[..., 2],
                  "diagonal": values_at(e, pos - lo, width) * inv, "previous": values_at(e, pos - 1 - lo, width) * inv,
                  "next": values_at(e, pos + 1 - lo, width) * inv, "entropy": entropy,
                  "entropy_uniform": torch.log(seen.clamp_min(1).to(f32)), "max": top_w,
                  "top_previous": (arg == pos - 1).to(f32), "top_next": (arg == pos + 1).to(f32)}
        per_row = {name: (values[name], where[BY_NAME[name].rows]) for name in CORPUS_STATS if name in values}
        for k in range(1, ncls):
            per_row[f"class{k}"] = (got[..., 2 + k], rows)
        sums = torch.stack([torch.where(w, v.expand(b, h, -1), 0.0).to(wide).sum((0, 2)) for v, w in per_row.values()])
        counts = torch.stack([w.expand(b, h, -1).sum((0, 2)) for _, w in per_row.values()]).to(wide)  # [S', H]
        sink = (torch.where(sees_first, got[..., 0], 0.0).to(wide).sum((0, 2)),
                sees_first.expand(b, h, -1).sum((0, 2)).to(wide))
        own = None
        if r0 <= first < r1:  # the first row's entropy, of the heads whose mask lets it see a key
            own = (entropy[0, :, first - r0].to(wide), rows[0, :, first - r0].expand(h))
        found[r0] = (sums, counts, sink, own, rows.expand(b, h, -1).sum((0, 2)).to(wide))

    run_blocks(_without_grad(one_block), list(range(0, lq, step)), threads)
    blocks = [found[r0] for r0 in sorted(found)]
    sums = torch.stack([t[0] for t in blocks]).sum(0)  # [S', H]
    counts = torch.stack([t[1] for t in blocks]).sum(0)  # [S', H]
    sink_sum = torch.stack([t[2][0] for t in blocks]).sum(0)
    sink_rows = torch.stack([t[2][1] for t in blocks]).sum(0)
    own = next((t[3] for t in blocks if t[3] is not None), None)
    rows = torch.stack([t[4] for t in blocks]).sum(0)  # [H]
    names = [*(n for n in CORPUS_STATS if n not in ("first_row_entropy", "sink_rate")),
             *(f"class{k}" for k in range(1, ncls))]  # per_row's, in its order
    means = sums / counts.clamp_min(1)
    had = counts > 0
    by_name = {n: (means[i], had[i]) for i, n in enumerate(names)}
    zero = torch.zeros(h, dtype=wide, device=dev)
    by_name["first_row_entropy"] = (torch.where(own[1], own[0], zero), own[1]) if own is not None else \
        (zero, torch.zeros(h, dtype=torch.bool, device=dev))
    alpha = sink_sum / sink_rows.clamp_min(1)  # Gu et al.: the mean weight on the first token of the rows that see it
    by_name["sink_rate"] = (torch.where(sink_rows > 0, (alpha > sink_threshold).to(wide), 0.0), sink_rows > 0)
    order = [*CORPUS_STATS, *(f"class{k}" for k in range(1, ncls))]
    out_means = torch.stack([by_name[n][0] for n in order])
    out_had = torch.stack([by_name[n][1] for n in order]).to(wide)
    return out_means, out_had, rows


def head_distances(calls: list[Call], real: Any) -> Any:
    """The Jensen-Shannon divergences between every two heads of ``calls`` (every site of one text, in the order
    of the accumulator's heads) summed over the text's real query rows (``real [1, L]``): ``[G, G]`` (float64,
    the pairs above the diagonal; below it, whatever the passes computed). Per row, as ``CorpusAccumulator.end``:
    p = 0.001 / n + 0.999 A over the keys the row may see; each block's real (row, key) elements gathered flat and
    summed by ``divergence.divergence_sums``, the exact path's own function (its scaled sums in float32 over 64
    elements, then float64: whole rows in float32 lose a near-uniform head's divergence). The blocks of rows run a
    few threads at a time on the CPU, each operation on one thread of torch's (``summary.threaded``)."""
    return threaded(_head_distances, calls[0].query, calls, real)


def _head_distances(_query: Any, calls: list[Call], real: Any, threads: int = 1) -> Any:
    import threading

    import torch

    dev = calls[0].query.device
    wide = _wide(dev)
    scorers = [c.scorer() for c in calls]
    g = sum(int(c.query.shape[1]) for c in calls)
    lq = int(calls[0].query.shape[-2])
    lk = int(calls[0].key.shape[-2])
    real_rows = real.to(dev)[0].to(torch.bool)  # the real rows count
    pairs = torch.zeros((g, g), dtype=wide, device=dev)
    step = max(1, min(lq, DISTANCE_VALUES // max(1, g * lk)))
    lock = threading.Lock()

    def one_block(r0: int) -> None:
        r1 = min(lq, r0 + step)
        rows = real_rows[r0:r1]
        count = int(rows.sum())
        if not count:
            return
        ranges = [sc.key_range(r0, r1) for sc in scorers]
        lo, hi = min(r[0] for r in ranges), max(r[1] for r in ranges)
        p = torch.cat([_smoothed(sc, c, r0, r1, lo, hi) for sc, c in zip(scorers, calls)])  # [G, r, width]
        # the block's real (row, key) elements some head sees (each holds at least the smoothing's floor there),
        # gathered flat as the exact path gathers a batch's, and summed by the same function: the same rounding
        where = ((p != 0).any(0) & rows[:, None]).reshape(-1).nonzero().squeeze(1)
        flat = p.reshape(g, -1).index_select(1, where)  # [G, E]
        del p
        got = divergence_sums(flat, count, clamp=bool((flat == 0).any()))
        with lock:  # blocks run a few threads at a time; their sums meet here
            pairs.add_(got)

    run_blocks(_without_grad(one_block), list(range(0, lq, step)), threads)
    return pairs


def _smoothed(scorer: BlockScores, call: Call, r0: int, r1: int, lo: int, hi: int) -> Any:
    """Rows ``r0:r1`` of a site over keys ``lo:hi``: the smoothed weights ``[H, r, width]`` (0 off the keys each
    row may see)."""
    import torch

    s, keep, seen, live = scorer.scores(r0, r1, lo, hi)
    masked = ~keep if keep is not None else s < MASKED / 2  # [1, 1|H, r, width]
    sink = None if call.sinks is None else call.sinks.to(s.device, torch.float32).reshape(1, -1, 1)
    x = exp_rows(s, s.amax(-1), sink=sink, live=live, inplace=True)  # 0 where masked
    p = x.e.mul_(x.inv[..., None] * (1 - SMOOTHING)).add_(SMOOTHING / seen.clamp_min(1)[..., None])
    return p.masked_fill_(masked, 0.0)[0]


def _without_grad(run: Any) -> Any:
    """``run`` under ``torch.no_grad()`` in whichever thread runs it (the mode is per thread; a parameter such as
    gpt-oss's sinks would otherwise take the blocks into autograd)."""
    import torch

    def quiet(r0: int) -> None:
        with torch.no_grad():
            run(r0)

    return quiet


def _wide(device: Any) -> Any:
    import torch

    return torch.float32 if getattr(device, "type", "cpu") == "mps" else torch.float64  # MPS has no float64


__all__ = ["BATCH_BYTES", "BLOCKED_FROM", "DISTANCE_BUDGET", "Call", "LongText", "exact_batches", "exact_bytes",
           "head_distances", "site_count", "site_heads",
           "site_sums"]

"""Heads ranked by what restricting each alone costs, and policies of a share of heads checked on held-out texts.

``head_costs``: for each unit (a key-value head with ``kv_heads``, and the query heads that share it; else a
query head) and each calibration text with its answer, one teacher-forced forward with that unit alone
restricted; its cost is the drop of the answer's log-probability from the plain run (nats), averaged over the
texts, with the KL of the answer rows beside it. The units are run ``batch`` at a time, as entries of one batch
of the same text (each entry restricts its own unit); the plain run is the first entry of the first batch.

``policy``: the ``share`` of units whose restriction costs least, restricted together (DuoAttention's streaming
heads: the rest keep a full cache). ``random_policies``: as many units drawn at random, a seed each.
``evaluate``: each policy on held-out needles, all of them entries of one batch per needle: the greedy answers
(right when they hold the needle's code), the answer's log-probability, and the KV cache the policy keeps at each
needle's length.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator, Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any

from attnviz.ablation.heads import Geometry, Plan, Restriction, restricted
from attnviz.ablation.prefix import LayerPrefix
from attnviz.ablation.runs import Loaded, encode_answer, encode_text, greedy, holds, mean, teacher_forced


@dataclass
class Costs:
    """Each unit's cost: ``drop[u]`` (nats, the mean over texts of the plain answer log-probability minus the
    restricted one; positive: the restriction hurts), ``kl[u]`` (the mean KL of the answer rows), per text
    ``per_text[t][u]``; ``units`` the (layer, head) of each, ``kv_heads`` whether they are key-value heads."""

    units: list[tuple[int, int]]
    kv_heads: bool
    drop: list[float]
    kl: list[float]
    per_text: list[list[float]]
    plain_logprob: list[float]
    forwards: int
    seconds: float
    tokens: list[int] = field(default_factory=list)

    def order(self) -> list[int]:
        """Unit indices from the cheapest restriction to the dearest (ties by position)."""
        return sorted(range(len(self.units)), key=lambda u: (self.drop[u], self.kl[u], u))

    def rank_of(self) -> list[int]:
        """Each unit's rank (0: the cheapest to restrict)."""
        ranks = [0] * len(self.units)
        for r, u in enumerate(self.order()):
            ranks[u] = r
        return ranks


def head_costs(loaded: Loaded, texts: Sequence[str], answers: Sequence[str], restriction: Restriction, *,
               kv_heads: bool = True, batch: int = 4, reuse: bool = True,
               progress: Callable[[int, int], None] | None = None) -> Costs:
    """Each unit's cost of restriction on ``texts`` (each with its answer), at most ``batch`` units of one layer a
    forward; with ``reuse`` the layers below the batch's layer are the plain run's (``prefix.LayerPrefix``)."""
    import time

    g = loaded.geometry
    units = g.units(kv_heads)
    started = time.perf_counter()
    per_text: list[list[float]] = []
    kls: list[list[float]] = []
    plain: list[float] = []
    tokens: list[int] = []
    forwards = 0
    total = len(texts) * len(units)
    done = 0
    prefix = LayerPrefix(loaded.model, g) if reuse else None
    for t, (text, answer) in enumerate(zip(texts, answers)):
        answer_ids = encode_answer(loaded.tokenizer, answer)
        ids = encode_text(loaded, text, len(answer_ids), f"calibration text {t + 1}")
        tokens.append(len(ids) + len(answer_ids))
        drops: list[float] = []
        kl: list[float] = []
        base: float | None = None
        reference: Any = None
        for chunk in _chunks(units, batch):
            entries = [restricted([u], restriction, g, kv_heads=kv_heads) for u in chunk]
            if base is None:  # the plain run rides along as the first batch's first entry (its layers recorded)
                with prefix.recording() if prefix is not None else nullcontext():
                    outcomes, reference = teacher_forced(loaded, ids, answer_ids, Plan([{}, *entries]))
                base = outcomes[0].logprob
                assert base is not None
                plain.append(base)
                outcomes = outcomes[1:]
                forwards += 1
            else:
                with prefix.starting_at(chunk[0][0], len(entries)) if prefix is not None else nullcontext():
                    outcomes, _ = teacher_forced(loaded, ids, answer_ids, Plan(entries), reference=reference)
            forwards += len(entries)
            for o in outcomes:
                assert o.logprob is not None
                drops.append(base - o.logprob)
                kl.append(float(o.kl or 0.0))
            done += len(chunk)
            if progress is not None:
                progress(done, total)
        per_text.append(drops)
        kls.append(kl)
    n = len(units)
    return Costs(units, kv_heads, [mean([d[u] for d in per_text]) for u in range(n)],
                 [mean([k[u] for k in kls]) for u in range(n)], per_text, plain, forwards,
                 time.perf_counter() - started, tokens)


def _chunks(units: list[tuple[int, int]], batch: int) -> Iterator[list[tuple[int, int]]]:
    """The units in runs of at most ``batch``, each of one layer (units are in layer order)."""
    for layer in dict.fromkeys(u[0] for u in units):
        mine = [u for u in units if u[0] == layer]
        for start in range(0, len(mine), batch):
            yield mine[start:start + batch]


def policy(costs: Costs, share: float) -> list[tuple[int, int]]:
    """The ``share`` of units whose restriction costs least (at least one)."""
    count = max(1, round(share * len(costs.units)))
    return [costs.units[u] for u in costs.order()[:count]]


def policy_gates(costs: Costs, share: float, geometry: Geometry) -> Any:
    """DuoAttention's gates (``[layers, kv_heads]``, or ``[layers, heads]`` for query heads) of the ranking and its
    policy: the units the policy restricts below 0.5 and the others above, each side in the ranking's order
    (the cheapest restriction lowest). A reader that thresholds at 0.5 (DuoAttention's default) streams exactly
    the policy's units; one that streams the lowest share (DuoAttention's ``sparsity``, kvpress's
    ``head_compression_ratio``) streams the ranking's cheapest units of that share."""
    import numpy as np

    order = costs.order()
    count = len(policy(costs, share))
    rest = len(order) - count
    per = geometry.kv_heads if costs.kv_heads else geometry.heads
    gates = np.ones((geometry.layers, per))
    for r, u in enumerate(order):
        layer, head = costs.units[u]
        gates[layer, head] = 0.5 * r / count if r < count else 0.5 + 0.5 * (r - count + 1) / rest
    return gates


def random_policies(units: list[tuple[int, int]], share: float, count: int, seed: int) -> list[list[tuple[int, int]]]:
    """``count`` draws of the same share of units, by ``random.Random(seed + i)``."""
    size = max(1, round(share * len(units)))
    return [sorted(random.Random(seed + i).sample(units, size)) for i in range(count)]


@dataclass
class PolicyResult:
    """A policy on the held-out needles: which answers held the code, their log-probabilities, the KV cache kept."""

    name: str
    units: list[tuple[int, int]]
    right: list[bool]
    logprob: list[float]
    generated: list[str]
    cache_kept: float  # the share of the full KV cache the policy keeps, at the needles' mean length

    @property
    def correct(self) -> int:
        return sum(self.right)


def cache_kept(units: int, streamed: int, restriction: Restriction, length: int) -> float:
    """The share of the full KV cache kept at ``length`` tokens when ``streamed`` of ``units`` (of the same size)
    keep ``restriction.cache(length)`` entries and the others all of them."""
    return ((units - streamed) * length + streamed * restriction.cache(length)) / (units * length)


def evaluate(loaded: Loaded, needles: Sequence[Any], policies: list[tuple[str, list[tuple[int, int]]]],
             restriction: Restriction, *, kv_heads: bool = True, generate: int = 12,
             progress: Callable[[int, int], None] | None = None) -> list[PolicyResult]:
    """Each policy (name, units) on each needle (``text``, ``answer``, ``code``), the plain model first, all of
    them entries of one batch per needle: greedy answers and the answer's log-probability."""
    g = loaded.geometry
    plans: list[dict[int, dict[int, Restriction]]] = [{}]
    plans += [restricted(units, restriction, g, kv_heads=kv_heads) for _, units in policies]
    names = ["full model", *(name for name, _ in policies)]
    chosen: list[list[tuple[int, int]]] = [[], *(units for _, units in policies)]
    right: list[list[bool]] = [[] for _ in plans]
    logp: list[list[float]] = [[] for _ in plans]
    said: list[list[str]] = [[] for _ in plans]
    lengths = []
    for n, needle in enumerate(needles):
        answer_ids = encode_answer(loaded.tokenizer, needle.answer)
        ids = encode_text(loaded, needle.text, max(generate, len(answer_ids)), f"needle {n + 1}")
        lengths.append(len(ids))
        plan = Plan(list(plans))
        outcomes, _ = teacher_forced(loaded, ids, answer_ids, plan)
        answers = greedy(loaded, ids, generate, plan)
        for p, (o, a) in enumerate(zip(outcomes, answers)):
            right[p].append(holds(a, needle.code))
            logp[p].append(float(o.logprob if o.logprob is not None else float("nan")))
            said[p].append(a)
        if progress is not None:
            progress(n + 1, len(needles))
    length = round(mean([float(v) for v in lengths])) if lengths else 0
    total = len(g.units(kv_heads))
    return [PolicyResult(names[p], chosen[p], right[p], logp[p], said[p],
                         cache_kept(total, len(chosen[p]), restriction, length) if length else 1.0)
            for p in range(len(plans))]


__all__ = ["Costs", "Geometry", "PolicyResult", "cache_kept", "evaluate", "head_costs", "policy", "policy_gates",
           "random_policies"]

"""The runs of ``attnviz ablate`` (and ``attnviz.ablate``): chosen heads restricted on the texts given
(``compare_run``), or every head ranked on a calibration needle suite and the policies of a share of heads checked
on held-out needles (``rank_run``). Typed results that the command line, the API and the renderers read."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from attnviz.ablation.heads import Geometry, Restriction, label, parse_heads, restricted
from attnviz.ablation.options import AblateOptions
from attnviz.ablation.ranking import Costs, PolicyResult, evaluate, head_costs, policy, random_policies
from attnviz.ablation.runs import Loaded, TextRuns, compare, load, mean

#: progress(what, done, total): told as a run goes
Progress = Callable[[str, int, int], None]


@dataclass
class Restricted:
    """One head restricted: its layer and head (a key-value head with ``kv_head``), the query heads it stands
    for, and the restriction."""

    layer: int
    head: int
    query_heads: list[int]
    restriction: Restriction
    kv_head: bool


@dataclass
class Comparison:
    """``attnviz ablate --stream ...``: each text run plainly and with the heads restricted."""

    model: str
    geometry: Geometry
    heads: list[Restricted]
    texts: list[TextRuns]
    answer: str | None
    generate: int
    seconds: float
    device: str

    @property
    def cache_kept(self) -> list[float]:
        """Per text, the share of the full KV cache the restricted heads leave (every key-value head counted; a
        key-value head restricted for some of its query heads only keeps its full cache)."""
        out = []
        g = self.geometry
        for runs in self.texts:
            length = runs.tokens
            kept = 0.0
            for layer in range(g.layers):
                for kv in range(g.kv_heads):
                    limits = [r.restriction for r in self.heads if r.layer == layer
                              and any(g.kv_head(q) == kv for q in r.query_heads)]
                    covered = {q for r in self.heads if r.layer == layer for q in r.query_heads}
                    if limits and all(q in covered for q in g.query_heads(kv)):
                        kept += max(x.cache(length) for x in limits)
                    else:
                        kept += length
            out.append(kept / (g.layers * g.kv_heads * length))
        return out


def restricted_heads(options: AblateOptions, geometry: Geometry) -> tuple[list[Restricted], dict[int, dict[int, Any]]]:
    """The heads named by ``--stream``, ``--window``, ``--zero`` and ``--mean``, and the plan entry they make; a
    head named twice is refused."""
    heads: list[Restricted] = []
    entry: dict[int, dict[int, Any]] = {}
    for kind, spec in options.restricted_heads():
        r = restriction_of(kind, options)
        for layer, head in parse_heads(spec, geometry, kv_heads=options.kv_heads, option=f"--{kind}"):
            qs = geometry.query_heads(head) if options.kv_heads else [head]
            for q in qs:
                if q in entry.get(layer, {}):
                    from attnviz.errors import UsageError

                    raise UsageError(f"--{kind} {layer}:{head}: head {layer}:{q} is already restricted by another "
                                     "option; name each head once.")
            heads.append(Restricted(layer, head, qs, r, options.kv_heads))
            entry.update({layer: {**entry.get(layer, {}), **restricted([(layer, head)], r, geometry,
                                                                         kv_heads=options.kv_heads)[layer]}})
    return heads, entry


def restriction_of(kind: str, options: AblateOptions) -> Restriction:
    if kind == "stream":
        return Restriction("stream", sink=options.sink, recent=options.recent)
    if kind == "window":
        return Restriction("window", window=options.recent)
    return Restriction(kind)


def compare_run(options: AblateOptions, texts: list[str], progress: Progress | None = None,
                loaded: Loaded | None = None) -> Comparison:
    """The texts run plainly and with the named heads restricted."""
    from attnviz.ablation.heads import Plan

    options.check()
    started = time.perf_counter()
    loaded = loaded or load(options.model, device=options.device, dtype=options.dtype)
    heads, entry = restricted_heads(options, loaded.geometry)
    told = None if progress is None else (lambda n: progress("texts", n, len(texts)))
    runs = compare(loaded, texts, lambda _: Plan([{}, entry]), answer=options.answer, generate=options.generate,
                   kl_rows=options.kl_rows, progress=told)
    return Comparison(loaded.name, loaded.geometry, heads, runs, options.answer, options.generate,
                      time.perf_counter() - started, loaded.device)


@dataclass
class NeedleInfo:
    """A needle of the suite: its length in tokens, depth, code and seed."""

    tokens: int
    depth: float
    code: str
    seed: int


@dataclass
class Ranking:
    """``attnviz ablate --rank``: every unit's cost, the statistics beside it, and the policies compared."""

    model: str
    geometry: Geometry
    restriction: Restriction
    costs: Costs
    share: float
    policies: list[PolicyResult]
    calibration: list[NeedleInfo]
    held_out: list[NeedleInfo]
    seconds: float
    plain_seconds: float  # one plain forward of each calibration needle, timed alone: the cost's baseline
    device: str
    statistics: dict[str, list[float]] = field(default_factory=dict)  # per unit, beside the cost
    retrieval: Any = None  # [layers, heads, calibration needles] Wu et al.'s scores of the query heads, or None
    warnings: list[str] = field(default_factory=list)
    positions: int = 0  # the positions the model takes (a full head's sizes in MInference's file)

    @property
    def longest(self) -> int:
        """The longest needle, in tokens."""
        return max((n.tokens for n in [*self.calibration, *self.held_out]), default=0)

    @property
    def kv_heads(self) -> bool:
        return self.costs.kv_heads

    def unit_label(self, u: int) -> str:
        layer, head = self.costs.units[u]
        return label(layer, head, self.geometry, kv_heads=self.kv_heads)


def rank_run(options: AblateOptions, progress: Progress | None = None, loaded: Loaded | None = None) -> Ranking:
    """Rank every unit (the key-value heads of a model that groups its query heads, else the query heads) on
    ``options.calibration`` needles, then check the share's policy and random policies on ``options.needles``
    held-out needles."""
    from attnviz.ablation.needles import needle_suite

    options.check()
    started = time.perf_counter()
    loaded = loaded or load(options.model, device=options.device, dtype=options.dtype)
    g = loaded.geometry
    kv_heads = options.kv_heads or g.kv_heads < g.heads
    r = restriction_of(options.restrict, options)
    calibration = needle_suite(options.calibration, tokens=options.tokens, seed=options.seed,
                               tokenizer=loaded.tokenizer)
    held = needle_suite(options.needles, tokens=options.tokens, seed=options.seed + 1, tokenizer=loaded.tokenizer)

    def told(what: str) -> Callable[[int, int], None] | None:
        return None if progress is None else (lambda done, total: progress(what, done, total))

    plain_seconds = _plain_seconds(loaded, [n.text + n.answer for n in calibration])
    costs = head_costs(loaded, [n.text for n in calibration], [n.answer for n in calibration], r,
                       kv_heads=kv_heads, batch=options.batch, progress=told("ranking"))
    statistics: dict[str, list[float]] = {}
    retrieval = None
    warnings: list[str] = []
    if options.statistics:
        from attnviz.ablation.statistics import unit_statistics

        statistics, retrieval, warnings = unit_statistics(loaded, calibration, costs.units, kv_heads,
                                                          sink=options.sink, recent=options.recent,
                                                          progress=told("statistics"))
    chosen = policy(costs, options.share)
    randoms = random_policies(costs.units, options.share, options.random, options.seed + 100)
    policies = [("ranked", chosen), *((f"random {i + 1}", units) for i, units in enumerate(randoms))]
    results = evaluate(loaded, held, policies, r, kv_heads=kv_heads, generate=_generate_for(held, loaded),
                       progress=told("policies"))

    def info(needles: list[Any]) -> list[NeedleInfo]:
        return [NeedleInfo(len(loaded.tokenizer(n.text)["input_ids"]), float(n.depth), str(n.code), int(n.seed))
                for n in needles]

    return Ranking(loaded.name, g, r, costs, options.share, results, info(calibration), info(held),
                   time.perf_counter() - started, plain_seconds, loaded.device, statistics, retrieval, warnings,
                   positions=loaded.limit or 0)


def _generate_for(needles: list[Any], loaded: Loaded) -> int:
    """New tokens enough for the answer and a few more."""
    longest = max(len(loaded.tokenizer(n.answer, add_special_tokens=False)["input_ids"]) for n in needles)
    return longest + 4


def _plain_seconds(loaded: Loaded, texts: list[str]) -> float:
    """The time of one plain forward of each text (the ranking's baseline)."""
    import torch

    started = time.perf_counter()
    for text in texts:
        ids = torch.tensor([loaded.tokenizer(text)["input_ids"]], device=loaded.device)
        with torch.no_grad():
            loaded.model(input_ids=ids, logits_to_keep=1, use_cache=False)
    return time.perf_counter() - started


def policy_summary(results: list[PolicyResult]) -> dict[str, Any]:
    """The random policies' mean accuracy and log-probability."""
    randoms = [p for p in results if p.name.startswith("random")]
    return {"random_mean_correct": mean([float(p.correct) for p in randoms]) if randoms else None,
            "random_mean_logprob": mean([mean(p.logprob) for p in randoms]) if randoms else None}

"""``attnviz ablate`` drawn and tabled: a comparison of runs (plain and restricted), the ranking of heads by
what restricting each alone costs beside attnviz's statistics, the policies compared, the layer x head picture
of the costs, and the JSON documents. Objects only: the caller prints and saves them."""

from __future__ import annotations

import math
from typing import Any

from attnviz.ablation.running import Comparison, Ranking, policy_summary
from attnviz.ablation.runs import mean

ANSWER_WIDTH = 40


def _num(value: float | None, precision: int = 3) -> str:
    if value is None or not math.isfinite(value):
        return "–"
    return f"{value:.{precision}f}"


def _said(text: str | None) -> str:
    from attnviz.tokentext import one_line

    return "–" if text is None else repr(one_line(text, ANSWER_WIDTH))


def _table(title: str, caption: str | None = None) -> Any:
    from rich import box
    from rich.table import Table

    return Table(title=title, caption=caption, caption_justify="left", box=box.SIMPLE_HEAD, padding=(0, 1),
                 pad_edge=False)


# ---------------------------------------------------------------------------------------------------
# A comparison of runs


def heads_line(c: Comparison) -> str:
    """The heads restricted, one phrase per restriction."""
    by: dict[str, list[str]] = {}
    for r in c.heads:
        name = f"{r.layer}:{r.head}" + (f" (q {r.layer}:{r.query_heads[0]}-{r.query_heads[-1]})"
                                        if r.kv_head and len(r.query_heads) > 1 else "")
        by.setdefault(r.restriction.describe(), []).append(name)
    kind = "key-value heads" if c.heads and c.heads[0].kv_head else "heads"
    return "; ".join(f"{kind} {', '.join(names)}: {what}" for what, names in by.items())


def comparison_table(c: Comparison, precision: int = 3) -> Any:
    """One row per text: its tokens, the answer's log-probability plain and restricted, the drop, the KL and the
    KV cache kept (the greedy answers are ``comparison_answers``' lines)."""
    caption = (f"logprob: the answer {_said(c.answer)}'s log-probability in nats, teacher-forced"
               if c.answer is not None else "no --answer: no log-probabilities")
    caption += "; KL(plain || restricted) of the next-token distributions, mean over the " + (
        "answer's rows" if c.answer is not None else "text's last rows") + "; cache: the KV cache kept"
    table = _table(f"{c.model}: {heads_line(c)}", caption)
    for name in ("text", "tokens", "plain logprob", "restricted", "drop", "KL", "cache"):
        table.add_column(name, justify="right", no_wrap=True)
    for n, (runs, kept) in enumerate(zip(c.texts, c.cache_kept)):
        plain, limited = runs.runs[0], runs.runs[1]
        drop = None if plain.logprob is None or limited.logprob is None else plain.logprob - limited.logprob
        table.add_row(str(n + 1), str(runs.tokens), _num(plain.logprob, precision), _num(limited.logprob, precision),
                      _num(drop, precision), _num(limited.kl, precision + 1), f"{kept:.1%}")
    return table


def comparison_answers(c: Comparison) -> list[str]:
    """The greedy answers of each text, plain and restricted, a line each."""
    from attnviz.tokentext import one_line

    lines = []
    for n, runs in enumerate(c.texts):
        which = f"text {n + 1} " if len(c.texts) > 1 else ""
        for name, outcome in (("plain", runs.runs[0]), ("restricted", runs.runs[1])):
            if outcome.generated is not None:
                lines.append(f"{which}{name}: \"{one_line(outcome.generated, 100)}\"")
    return lines


def comparison_document(c: Comparison) -> dict[str, Any]:
    """The JSON document of a comparison."""
    from attnviz import __version__

    texts = []
    for runs, kept in zip(c.texts, c.cache_kept):
        plain, limited = runs.runs[0], runs.runs[1]
        entry: dict[str, Any] = {"tokens": runs.tokens, "kl": limited.kl, "cache_kept": kept}
        if c.answer is not None:
            entry.update(plain_logprob=plain.logprob, restricted_logprob=limited.logprob,
                         logprob_drop=None if plain.logprob is None or limited.logprob is None
                         else plain.logprob - limited.logprob,
                         plain_token_logprobs=plain.token_logprobs, restricted_token_logprobs=limited.token_logprobs)
        if c.generate:
            entry.update(plain_generated=plain.generated, restricted_generated=limited.generated)
        texts.append(entry)
    g = c.geometry
    return {"attnviz": __version__, "command": "ablate", "model": c.model, "device": c.device,
            "geometry": {"layers": g.layers, "heads": g.heads, "kv_heads": g.kv_heads},
            "restricted": [{"layer": r.layer, "head": r.head, "kv_head": r.kv_head, "query_heads": r.query_heads,
                            "restriction": r.restriction.as_dict()} for r in c.heads],
            "answer": c.answer, "generate": c.generate, "texts": texts,
            "mean_logprob_drop": mean([t["logprob_drop"] for t in texts]) if c.answer is not None else None,
            "mean_kl": mean([t["kl"] for t in texts]), "seconds": round(c.seconds, 3)}


# ---------------------------------------------------------------------------------------------------
# A ranking and its policies


def ranking_rows(r: Ranking) -> list[dict[str, Any]]:
    """Every unit's row: its name, cost, KL, rank (0: the cheapest to restrict) and statistics, dearest first."""
    costs = r.costs
    ranks = costs.rank_of()
    rows = []
    g = r.geometry
    for u, (layer, head) in enumerate(costs.units):
        row: dict[str, Any] = {"layer": layer, "head": head, "label": r.unit_label(u), "logprob_drop": costs.drop[u],
                               "kl": costs.kl[u], "rank": ranks[u],
                               "per_text_logprob_drop": [t[u] for t in costs.per_text]}
        if r.kv_heads:
            row["query_heads"] = g.query_heads(head)
        for name, values in r.statistics.items():
            row[name] = values[u]
        rows.append(row)
    return sorted(rows, key=lambda x: -x["rank"])


def ranking_table(r: Ranking, precision: int = 3, max_rows: int = 40) -> Any:
    """The units, dearest to restrict first; with more than ``max_rows`` the middle is left out (0: all)."""
    rows = ranking_rows(r)
    what = "key-value heads" if r.kv_heads else "heads"
    caption = (f"rank 1: the dearest to restrict; cost: the drop of the answer's log-probability (nats) with that "
               f"{what[:-1]} alone restricted "
               f"({r.restriction.describe()}), mean over {len(r.calibration)} calibration needles of "
               f"~{round(mean([float(n.tokens) for n in r.calibration]))} tokens; KL over the answer's rows")
    if r.statistics:
        caption += ("; sink, local: the weight on the first and last keys a streaming head keeps; middle: the share "
                    "of the head's attention on the middle half of the keys; retr.: Wu et al.'s retrieval score "
                    "of the code")
        if r.kv_heads:
            caption += f" (a key-value head: its {r.geometry.group} query heads' mean, their best retrieval score)"
    shown = rows
    elided = 0
    if max_rows and len(rows) > max_rows:
        top = max_rows // 2
        shown = rows[:top] + rows[len(rows) - (max_rows - top):]
        elided = len(rows) - len(shown)
    table = _table(f"{r.model}: {len(rows)} {what} ranked by the cost of restricting each alone", caption)
    unit = "kv head" if r.kv_heads else "head"
    names = ["rank", unit, *(["q heads"] if r.kv_heads else []), "cost", "KL",
             *(_STAT_HEADERS[n] for n in r.statistics)]
    for name in names:
        table.add_column(name, justify="right", no_wrap=True)
    for i, row in enumerate(shown):
        if elided and i == max_rows // 2:
            table.add_row("…", f"{elided} more", *[""] * (len(names) - 2))
        cells = [str(len(rows) - row["rank"]), f"{row['layer']}:{row['head']}"]
        if r.kv_heads:
            qs = row["query_heads"]
            cells.append(f"{qs[0]}-{qs[-1]}" if len(qs) > 1 else str(qs[0]))
        table.add_row(*cells, _num(row["logprob_drop"], precision), _num(row["kl"], precision + 1),
                      *[_num(row[n], precision) for n in r.statistics])
    return table


_STAT_HEADERS = {"sink_mass": "sink", "local_mass": "local", "middle": "middle", "retrieval": "retr."}


def policies_table(r: Ranking, precision: int = 2) -> Any:
    """The policies side by side on the held-out needles: answers right, the answer's mean log-probability, the
    KV cache kept."""
    n = len(r.held_out)
    tokens = round(mean([float(x.tokens) for x in r.held_out]))
    what = "key-value heads" if r.kv_heads else "heads"
    share = f"{r.share:.0%} of the {what}"
    table = _table(f"policies restricting {share} ({r.restriction.describe()}) on {n} held-out needles of "
                   f"~{tokens} tokens",
                   "ranked: the units whose restriction cost least; random: as many drawn at random; needles: each "
                   "answer right (✓, it holds the code) or not (✗); logprob: of the answer, in nats; cache kept: the "
                   "share of the full KV cache at the needles' mean length")
    for name in ("policy", "heads", "right", "needles", "mean logprob", "cache kept"):
        table.add_column(name, justify="left" if name in ("policy", "needles") else "right", no_wrap=True)
    for p in r.policies:
        table.add_row(p.name, str(len(p.units)), f"{p.correct}/{n}", "".join("✓" if ok else "✗" for ok in p.right),
                      _num(mean(p.logprob), precision), f"{p.cache_kept:.1%}")
    summary = policy_summary(r.policies)
    if summary["random_mean_correct"] is not None:
        table.add_row("random, mean", "", f"{summary['random_mean_correct']:.1f}/{n}", "",
                      _num(summary["random_mean_logprob"], precision), "")
    return table


def policy_answers(r: Ranking) -> list[str]:
    """The wrong answers of each policy, a line each (the full model's first)."""
    from attnviz.tokentext import one_line

    lines = []
    for p in r.policies:
        for i, (said, ok) in enumerate(zip(p.generated, p.right)):
            if not ok:
                lines.append(f"{p.name}, needle {i + 1} (code {r.held_out[i].code}): \"{one_line(said, 60)}\"")
    return lines


def ranking_document(r: Ranking, files: dict[str, str] | None = None) -> dict[str, Any]:
    """The JSON document of a ranking and its policies."""
    from attnviz import __version__

    g = r.geometry
    return {"attnviz": __version__, "command": "ablate", "mode": "rank", "model": r.model, "device": r.device,
            "geometry": {"layers": g.layers, "heads": g.heads, "kv_heads": g.kv_heads},
            "units": "kv_heads" if r.kv_heads else "heads", "restriction": r.restriction.as_dict(),
            "calibration": [vars(n) for n in r.calibration], "held_out": [vars(n) for n in r.held_out],
            "ranking": ranking_rows(r),
            "plain_logprob": r.costs.plain_logprob,
            "share": r.share,
            "policies": [{"name": p.name, "heads": [list(u) for u in p.units], "correct": p.correct,
                          "needles": len(p.right), "right": p.right, "logprob": p.logprob,
                          "mean_logprob": mean(p.logprob), "generated": p.generated, "cache_kept": p.cache_kept}
                         for p in r.policies],
            **policy_summary(r.policies),
            "cost": {"forwards": r.costs.forwards, "seconds": round(r.costs.seconds, 3),
                     "plain_forward_seconds": round(r.plain_seconds, 3),
                     "ratio": r.costs.seconds / r.plain_seconds if r.plain_seconds else None},
            "seconds": round(r.seconds, 3), "warnings": r.warnings, "files": files or {}}


def cost_figure(r: Ranking, title: str | None = None) -> Any:
    """The layers x heads (or key-value heads) picture of the costs."""
    import numpy as np

    from attnviz.render.heatmap import stat_figure

    g = r.geometry
    per = g.kv_heads if r.kv_heads else g.heads
    values = np.full((g.layers, per), np.nan)
    for u, (layer, head) in enumerate(r.costs.units):
        values[layer, head] = r.costs.drop[u]
    what = "key-value head" if r.kv_heads else "head"
    heading = title or f"{r.model}, each {what} restricted alone"
    return stat_figure(values, title=heading, stat="the answer's logprob drop (nats)", unit=what)

"""The summary tables of inspect, compare and rollout (rich renderables; the caller prints them): head
statistics laid out for the terminal's width, the tokens that receive the most attention, and
compare's measures and most different rows.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rich.table import Table
from rich.text import Text

from attnviz.errors import shape_str
from attnviz.statistics import WEIGHTS, columns

if TYPE_CHECKING:
    import numpy as np

    from attnviz.inspection.compare import CompareResult
    from attnviz.inspection.inspecting import InspectResult
    from attnviz.inspection.rollout import RolloutRun
    from attnviz.pipeline import Outcome
    from attnviz.render.table import Fitted

#: the head statistics' columns (``attnviz.statistics``); ``induction`` and ``duplicate`` only when the tokens are
#: known (--labels)
COLUMNS = columns(WEIGHTS)
#: head statistics left out, in this order, when the terminal is too narrow for all of them
FIT_DROPS = ("last", "first", "prev", "diag", "dist", "dup", "ind", "tag")


def fitted_columns(names: list[str], widths: dict[str, int], drops: tuple[str, ...],
                   width: int | None) -> tuple[list[str], list[str]]:
    """The columns of a head table that fit ``width`` characters (None: all of them), and those left out: the
    columns of ``drops`` are left out in that order until the rest fit (box SIMPLE_HEAD, no padding: one space
    between and around columns)."""
    shown = list(names)
    dropped: list[str] = []
    for name in drops:
        if name not in shown:
            continue
        if width is None or sum(widths[n] for n in shown) + len(shown) + 1 <= width:
            break
        shown.remove(name)
        dropped.append(name)
    return shown, dropped


def head_stats_table(stats: dict[str, np.ndarray], *, sort: str, reverse: bool, top: int | None,
                     precision: int = 2, padded: int = 0, of: str | None = None, keys: int | None = None) -> Fitted:
    """One row per (layer, head): by layer or head ascending, by a statistic descending (largest
    first); ``reverse`` turns the order round. Laid out for the width it is printed at: on a terminal
    too narrow for every column, the columns of ``FIT_DROPS`` are left out in that order (the caption
    names them), never a number cut short. ``of``: what the statistics were computed over, when not the rows
    as they are (value-norm maps: ``RENORMALISED``). Each column is written with the digits its magnitude needs
    (``render.table.column_texts``); ``keys``, the maps' keys: a column of weights far below uniform attention's
    reads 0."""
    import numpy as np

    from attnviz.render.table import UNDEFINED, WEIGHT_STATISTICS, Fitted, column_texts

    layers, heads = stats["entropy"].shape
    rows = [(li, hi) for li in range(layers) for hi in range(heads)]
    if sort == "head":
        rows.sort(key=lambda r: (r[1], r[0]))
    elif sort != "layer":
        def largest_first(r: tuple[int, int]) -> tuple[bool, float]:  # undefined (NaN) last
            value = float(stats[sort][r])
            return value != value, -value if value == value else 0.0

        rows.sort(key=largest_first)  # stable: ties keep layer/head order
    if reverse:
        rows.reverse()
    shown = rows[:top] if top else rows
    caption = ("means over query rows (and batch entries): entropy H (nats) and H/ln n; dist: mean |i - j| weighted; "
               "diag, prev (j = i - 1), first (j = 0), last: mean weight on that key; max: mean largest weight")
    if of:
        caption = f"statistics of {of}; {caption}"
    if "induction" in stats:
        caption += ("; ind, dup: mean weight on the token after an earlier occurrence of the query's token "
                    "(induction) and on the earlier occurrences (duplicate-token), over queries whose token "
                    f"occurred before ({UNDEFINED} where no token occurs twice)")
        if "token_rows" in stats:
            from attnviz.inspection.tokens import TOKEN_TAG_MIN_ROWS

            least, most = int(np.min(stats["token_rows"])), int(np.max(stats["token_rows"]))
            counted = f"{least}" if least == most else f"{least} to {most}"
            caption += (f", over {counted} query row{'' if most == 1 else 's'} (a tag needs at least "
                        f"{TOKEN_TAG_MIN_ROWS})")
    else:
        caption += "; induction and duplicate-token scores need the tokens (--labels)"
    if padded:
        caption += f"; {padded} padded query rows left out, first and last are the first and last real keys"
    if len(shown) < len(rows):
        caption += f"; showing {len(shown)} of {len(rows)} heads (--top)"
    p = precision
    cells = {"layer": [str(li) for li, _ in shown], "head": [str(hi) for _, hi in shown]}
    for key, name in COLUMNS.items():
        if key not in stats:
            continue
        column = np.asarray(stats[key])
        cells[name] = column_texts([column[li, hi] for li, hi in shown], p,  # digits by the column's magnitude
                                   1.0 / keys if keys and key in WEIGHT_STATISTICS else None)
    cells["tag"] = [str(stats["tag"][li, hi]) for li, hi in shown]
    caption = tags_caption(stats["tag"], list(range(layers)), WEIGHTS) + caption
    widths = {name: max([len(name), *(len(v) for v in values)]) for name, values in cells.items()}

    def build(width: int | None) -> Table:
        from rich import box

        names, dropped = fitted_columns(list(cells), widths, FIT_DROPS, width)
        note = f"; left out to fit the terminal: {', '.join(dropped)}" if dropped else ""
        table = Table(title=f"head statistics (by {sort}{', reversed' if reverse else ''})", caption=caption + note,
                      caption_justify="left", box=box.SIMPLE_HEAD, padding=0, pad_edge=False)
        for name in names:
            table.add_column(name, justify="left" if name == "tag" else "right", no_wrap=True,
                             overflow="ellipsis", width=widths[name])
        for r in range(len(shown)):
            tag = cells["tag"][r]
            table.add_row(*[cells[n][r] for n in names if n != "tag"],
                          *([Text(tag, style="bold cyan" if tag else "")] if "tag" in names else []))
        return table

    return Fitted(build, whole_in_pipe=True)


def tags_caption(tags: Any, layer_of: list[int], face: str, classes: tuple[str, ...] = (),
                 epsilon: float | None = None) -> str:
    """The lines a head table's caption opens with: how many heads of each layer earn each tag (every head, whatever
    ``--top`` shows), and the rules of the tags found (``attnviz.statistics.TAGS``; ``epsilon`` the sink's, where a
    corpus was captured with another)."""
    from attnviz.inspection.tags import layer_lines, rules_line
    from attnviz.statistics import tag_rules

    rules = tag_rules(face, classes, epsilon)
    said = rules_line(rules, tags, face)
    return "\n".join([*layer_lines(tags, layer_of, [r.tag for r in rules]), *([said] if said else []), ""])


def received_table(summary: dict[str, Any], precision: int) -> Any:
    """The top receivers as a small table (fits any terminal: four short columns)."""
    from rich import box
    from rich.table import Table
    from rich.text import Text

    from attnviz.render.table import column_texts
    from attnviz.text import label as visible_label

    seen = "the queries that may attend to it" + (" (j <= i: causal weights)" if summary["causal"] else "")
    table = Table(title="tokens that receive the most attention", box=box.SIMPLE_HEAD, padding=(0, 1),
                  caption=f"received: mean weight from {seen}, averaged over heads and layers; "
                          "max: the largest over heads, at layer:head", caption_justify="left", min_width=72)
    table.add_column("key", no_wrap=True, overflow="ellipsis", max_width=24)
    table.add_column("received", justify="right", no_wrap=True)
    table.add_column("max", justify="right", no_wrap=True)
    table.add_column("at", justify="right", no_wrap=True)
    uniform = 1.0 / max(len(summary["mean"]), 1)
    means = column_texts([entry["mean"] for entry in summary["top"]], precision, uniform)
    maxima = column_texts([entry["max"] for entry in summary["top"]], precision, uniform)
    for entry, mean, most in zip(summary["top"], means, maxima):
        token = entry["token"]
        label = str(entry["position"]) if token is None else f"{entry['position']} {visible_label(token, 16)}"
        table.add_row(Text(label), mean, most, f"{summary['layers'][entry['layer']]}:{entry['head']}")
    return table


def compare_tables(result: CompareResult, precision: int) -> list[Table]:
    """compare's tables: the summary measures, the most different rows, and the heads that changed most (as many as
    rows: ``--worst``)."""
    from attnviz.text import label as inert_label
    from attnviz.text import title as inert_title

    run, c, p = result.run, result.comparison, precision
    summary = Table(title=Text(inert_title(f"A = {run.a.source}, B = {run.b.source}, {shape_str(run.a.shape)} "
                                           "[layers, batch, heads, Lq, Lk]")))
    summary.add_column("measure")
    summary.add_column("value", justify="right")
    for name, value in (("max |A - B|", f"{c.max_abs:.{max(p, 3)}g}"),
                        ("mean |A - B|", f"{c.mean_abs:.{max(p, 3)}g}"),
                        ("mean Jensen-Shannon (nats, max ln 2)", f"{c.js_mean:.{max(p, 3)}g}"),
                        ("max Jensen-Shannon", f"{c.js_max:.{max(p, 3)}g}"),
                        ("rows with the same argmax", f"{100 * c.argmax_agree:.2f}%")):
        summary.add_row(name, value)
    rows = Table(title=f"the {len(c.worst_rows)} most different rows (by Jensen-Shannon divergence)")
    for column in ("where", "JS", "max |A - B|", "argmax A", "argmax B"):
        rows.add_column(column, justify="left" if column == "where" else "right")
    for r in c.worst_rows:
        q_labels, k_labels = run.labels.of(int(r["index"][1]))  # type: ignore[index]
        where = str(r["where"]) + (f" ({inert_label(q_labels[int(r['index'][3])], 12)})"  # type: ignore[index]
                                   if q_labels is not None else "")

        def key(j: Any, k_labels: list[str] | None = k_labels) -> str:
            return str(j) + (f" {inert_label(k_labels[int(j)], 12)}" if k_labels is not None else "")

        rows.add_row(where, f"{r['js']:.{max(p, 3)}g}", f"{r['max_abs']:.{max(p, 3)}g}", key(r["argmax_a"]),
                     key(r["argmax_b"]))
    shown = [h for h in c.heads if h["mean_js"] is not None][:len(c.worst_rows) or 5]
    heads = Table(title=f"the {len(shown)} heads that changed most (mean Jensen-Shannon divergence of their rows)")
    for column in ("where", "mean JS", "max JS", "mean |A - B|", "max |A - B|"):
        heads.add_column(column, justify="left" if column == "where" else "right")
    for h in shown:
        heads.add_row(f"layer {h['layer']}, head {h['head']}",
                      *(f"{h[k]:.{max(p, 3)}g}" for k in ("mean_js", "max_js", "mean_abs", "max_abs")))
    return [summary, rows, heads]


def batch_table(outcome: Any) -> Table:
    """``attnviz batch``'s summary: one row per job (its line, or its file with --each), with the notes
    of jobs not run (--fail-fast) and done before (--resume); from an ``attnviz.batch.running.BatchOutcome``."""
    from attnviz.text import visible

    plan, everything, failed = outcome.plan, outcome.everything, outcome.failed
    index, count = plan.shard
    table = Table(title=f"batch: {len(everything) - len(failed)} of {len(plan.jobs)} jobs succeeded in "
                        f"{outcome.seconds:.1f} s" + (f" (shard {index}/{count} of {len(plan.all_jobs)})"
                                                        if count > 1 else ""))
    for column in ("file" if plan.each else "line", "command", "status", "seconds", "error"):
        table.add_column(column, justify="right" if column in ("line", "seconds") else "left", overflow="fold")
    for r in everything:
        status = "ok" if r.ok else f"failed ({r.exit_code})"
        table.add_row(visible(r.job.path or "") if plan.each else str(r.job.number), visible(r.job.command),
                      status + (", before" if r.recorded is not None else ""), f"{r.seconds:.2f}",
                      visible(r.error or ""))
    notes = []
    if outcome.not_run:
        notes.append(f"{outcome.not_run} job(s) not run (--fail-fast)")
    if plan.before:
        notes.append(f"{len(plan.before)} job(s) done before (--resume)")
    if notes:
        table.caption = "; ".join(notes)
    return table


def compute_tables(outcome: Outcome, index: tuple[int, ...], precision: int = 3, max_rows: int | None = 40,
                   max_cols: int | None = None) -> list[Any]:
    """The tables a compute command prints (the shown slice's weights, further maps, per-query
    statistics, a summary per slice), as rich renderables; ``max_cols`` None: what fits the console."""
    from attnviz.render.table import (
        slice_label,
        slice_summary_table,
        stats_table,
        vector_table,
        weights_table,
    )

    prep, result, streamed = outcome.prepared, outcome.result, outcome.streamed
    tables: list[Any] = []
    shape = prep.weights_shape
    keep = prep.mask.full_keep(shape)
    keep2d = keep[index] if keep is not None else None
    lead = shape[:-2]
    names = prep.lead_names
    shown = slice_label(index, names)
    where = f", {shown} of leading dims {list(lead)} (--index picks another)" if lead else ""
    weights = result.weights[index] if streamed is None else streamed.preview[index]
    row_ids = None if streamed is None else streamed.preview_ids
    if streamed is not None and max_rows is None:
        max_rows = len(row_ids or [])

    def show_map(data: Any, title: str, ids: list[int] | None = None) -> None:
        tables.append(weights_table(data, q_labels=prep.q_labels, k_labels=prep.k_labels, keep=keep2d,
                                    precision=precision, max_rows=max_rows, max_cols=max_cols,
                                    title=title, axis_names=prep.variant.axis_names, row_ids=ids,
                                    total_rows=shape[-2]))

    name = prep.variant.name
    primary = "" if prep.variant.weights_title == "weights" else f": {prep.variant.weights_title}"
    show_map(weights, f"{name} attention weights {shape_str(shape)}{primary}{where}", row_ids)
    for view in result.views:
        data = result.maps[view.name][index]
        if view.axis == "both":
            show_map(data, f"{view.title}{where}")
            if view.name in outcome.map_stats:
                tables.append(stats_table(outcome.map_stats[view.name].select(index), q_labels=prep.q_labels,
                                          k_labels=prep.k_labels, precision=precision, max_rows=max_rows,
                                          row_name=prep.variant.axis_names[0],
                                          title=f"per-query statistics of {view.title}"))
        else:
            labels = prep.q_labels if view.axis == "q" else prep.k_labels
            tables.append(vector_table(data, labels=labels, precision=precision, max_cols=max_cols,
                                       title=f"{view.title}{where}"))
    tables.append(stats_table(outcome.stats.select(index), q_labels=prep.q_labels, k_labels=prep.k_labels,
                              precision=precision, max_rows=max_rows, row_name=prep.variant.axis_names[0], keep=keep2d,
                              title="per-query statistics" + (f", {shown}" if lead else "")))
    if lead:
        tables.append(slice_summary_table(outcome.stats, precision=precision, max_rows=max_rows, names=names))
    return tables


#: the most query rows a map may have and still get its weights and per-query statistics tables by default: the
#: rows those tables show (--max-rows' default), about what a terminal shows at once; a longer map's tables would
#: show 40 of its rows twice over (a 512-token capture: about 190 lines), so a line says how to see them instead
MAP_TABLE_ROWS = 40


def inspect_tables(result: InspectResult, precision: int = 3, max_rows: int | None = 40, max_cols: int | None = None,
                   sort: str = "layer", reverse: bool = False, top: int | None = None,
                   map_tables: bool | None = None) -> list[Any]:
    """The tables ``inspect`` prints (head statistics, received attention, the shown map and its
    per-query statistics), as rich renderables. ``map_tables``: whether the shown map's two tables are among
    them; None (rows not asked for): where the map has at most ``MAP_TABLE_ROWS`` query rows, else a line
    saying how to see them."""
    from attnviz.render.table import stats_table, weights_table

    opened = result.opened
    li, bi, hi = opened.index
    lq, lk = opened.weights.shape[-2:]
    assert result.one is not None and result.rows is not None  # a finite run
    tables: list[Any] = []
    from attnviz.inspection.weights import RENORMALISED

    w = opened.weights
    of = RENORMALISED if w.renormalised else None
    tables.append(head_stats_table(result.stats, sort=sort, reverse=reverse, top=top,
                                   padded=result.padded, of=of, keys=lk))
    if result.received is not None and result.received["top"]:
        tables.append(received_table(result.received, precision))
    where = f"layer {li}, batch {bi}, head {hi}"
    what = "weights" if opened.weights.weighed == "weights" else opened.weights.what
    if not (lq <= MAP_TABLE_ROWS if map_tables is None else map_tables):
        tables.append(Text(f"{what} [{lq}, {lk}] not tabled (over {MAP_TABLE_ROWS} rows): --max-rows N shows N rows, "
                           "0 all", style="dim"))
        return tables
    max_r = max_rows
    tables.append(weights_table(result.one, q_labels=opened.q_labels, k_labels=opened.k_labels, keep=result.one_keep,
                                precision=precision, max_rows=max_r, max_cols=max_cols,
                                title=f"{what} of {where} [{lq}, {lk}] (--layer/--batch/--head pick another)",
                                padded=result.one_padded))
    tables.append(stats_table(result.rows, q_labels=opened.q_labels, k_labels=opened.k_labels, precision=precision,
                              max_rows=max_r, title=f"per-query statistics, {where}"
                              + (" (entropies of each row renormalised to sum 1)" if of else ""),
                              padded=result.one_padded, keep=result.one_keep))
    return tables


def rollout_table(run: RolloutRun, precision: int = 3, max_rows: int | None = 40, max_cols: int | None = None) -> Any:
    """The rolled-out map (or flow, or relevance) of the shown batch entry, as ``rollout`` prints it."""
    import numpy as np

    from attnviz.render.table import weights_table

    shown = run.results[run.shown].result
    padded = run.padded
    keep = None if padded is None else ~(padded[:, None] | padded[None, :])
    lq, lk = shown.shape
    return weights_table(np.nan_to_num(shown), q_labels=run.tokens, k_labels=run.tokens, keep=keep,
                         precision=precision, max_rows=max_rows, max_cols=max_cols, padded=padded,
                         axis_names=("output", "input"),
                         title=f"{run.title}, batch {run.shown} [{lq}, {lk}] ({run.how})")

"""``attnviz inspect`` and ``attnviz compare``: weights a model already produced. No TensorFlow here.

Exit codes: 0, 1 (bad data), 2 (bad usage) as everywhere, and 3 when a check asked for fails
(--check-rows, --check-mask, --check-causal, --check-finite, compare's --atol/--rtol).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any, Literal

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from attnviz.choices import CAUSAL_ALIGNS, MASK_CONVENTIONS, MASK_KINDS
from attnviz.cli.options import (
    FIGURE,
    LABELS,
    MASKS,
    OUTPUT,
    NormOpt,
    NormSpec,
    Ranges,
    ScalePerPanelOpt,
    StagedOutputs,
    VmaxOpt,
    VminOpt,
    check_html_path,
    check_png_path,
    check_scale,
    checked_option,
    staged_outputs,
)
from attnviz.cli.streams import out_console, stdout

if TYPE_CHECKING:
    import numpy as np

    from attnviz.inspect import CheckResult, InspectMask, Weights
    from attnviz.render.table import Fitted

CHECKS = "Checks (exit 3 when one fails)"
SELECT = "Selection"
CHECK_FAILED = 3

SORTABLE = ("layer", "head", "entropy", "entropy_norm", "distance", "diagonal", "previous", "first", "last", "max",
            "induction", "duplicate")
#: the head statistics' columns; ``induction`` and ``duplicate`` only when the tokens are known (--labels)
COLUMNS = {"entropy": "H", "entropy_norm": "H/ln n", "distance": "dist", "diagonal": "diag",
           "previous": "prev", "first": "first", "last": "last", "max": "max", "induction": "ind",
           "duplicate": "dup"}
TOKEN_STATS = ("induction", "duplicate")

Layout = Annotated[str | None, typer.Option("--layout", metavar="AXES", rich_help_panel=SELECT,
                                            help="name the axes when the rank does not say, e.g. batch,q,k "
                                                 "(from layer, batch, head, q, k)")]
LayerOpt = Annotated[int, checked_option(int, "--layer", rich_help_panel=SELECT,
                                          help="the layer the tables show")]
HeadOpt = Annotated[int, checked_option(int, "--head", rich_help_panel=SELECT,
                                        help="the head the tables show")]
BatchOpt = Annotated[int | None, checked_option(int | None, "--batch", rich_help_panel=SELECT,
                                                help="the batch entry shown; head statistics average over all "
                                                     "entries unless this is given")]
Precision = Annotated[int, checked_option(int, "--precision", min=0, max=12, rich_help_panel=OUTPUT,
                                          help="digits after the point in tables")]
MaxRows = Annotated[int, checked_option(int, "--max-rows", min=0, rich_help_panel=OUTPUT,
                                        help="show at most this many rows, eliding the middle (0: all)")]
MaxCols = Annotated[int | None, checked_option(int | None, "--max-cols", min=0, rich_help_panel=OUTPUT,
                                               help="show at most this many key columns (default: what fits "
                                                    "the terminal; 0: all)")]
JsonOpt = Annotated[bool, typer.Option("--json", rich_help_panel=OUTPUT,
                                       help="print the JSON document on stdout instead of tables")]
JsonFile = Annotated[str | None, typer.Option("--json-file", metavar="FILE.json", rich_help_panel=OUTPUT,
                                              help="write the JSON document to this file")]
NoTable = Annotated[bool, typer.Option("--no-table", rich_help_panel=OUTPUT, help="print no tables")]
Quiet = Annotated[bool, typer.Option("--quiet", "-q", rich_help_panel=OUTPUT,
                                     help="print no tables and no informational lines")]
Title = Annotated[str | None, typer.Option("--title", rich_help_panel=FIGURE, help="the heatmap's title")]
Cmap = Annotated[str | None, typer.Option("--cmap", rich_help_panel=FIGURE, help="a matplotlib colour map")]
HtmlOpt = Annotated[str | None, typer.Option(
    "--html", metavar="FILE.html", rich_help_panel=OUTPUT,
    help="write an interactive report: one offline HTML file (every map of the batch entry as thumbnails, hover, "
         "head view, sortable statistics)")]
Reduce = Annotated[Literal["mean", "max"], checked_option(Literal["mean", "max"], "--reduce", rich_help_panel=FIGURE,
                                                          help="how long maps are aggregated in blocks: mean or max")]
LayersOpt = Annotated[str | None, checked_option(
    str | None, "--layers", parser=Ranges(), metavar="0,3,5-7", rich_help_panel=FIGURE,
    help="the layers the grids draw (--png, --html; inspect's --stats-png too), e.g. 0,3,5-7; default all")]
HeadsOpt = Annotated[str | None, checked_option(
    str | None, "--heads", parser=Ranges(), metavar="0,3,5-7", rich_help_panel=FIGURE,
    help="the heads the grids draw, e.g. 0-3; default all")]
ReduceHeadsOpt = Annotated[Literal["mean", "max"] | None, checked_option(
    Literal["mean", "max"] | None, "--reduce-heads", rich_help_panel=FIGURE,
    help="draw one map per layer, the mean (or max) of its heads (those of --heads), instead of every head")]
Atol = Annotated[float | None, checked_option(
    float | None, "--atol", min=0, rich_help_panel=CHECKS,
    help="absolute tolerance of the checks (default 1e-5; for weights stored in float16 2e-3, bfloat16 1.6e-2, "
         "their rounding)")]
MaskOpt = Annotated[str | None, typer.Option(
    "--mask", metavar="FILE", rich_help_panel=MASKS,
    help="what the model was allowed to attend: [B, S] (a Hugging Face attention_mask), 4-D [B, 1|N, 1|T, S], or "
         "broadcasting to the maps [..., Lq, Lk]; masked keys and padded query rows are left out of statistics "
         "and checks")]
KeyPaddingOpt = Annotated[str | None, typer.Option(
    "--key-padding-mask", metavar="FILE", rich_help_panel=MASKS,
    help="[B, S] or [S]: 1 = real token, 0 = padding (with --mask-convention keep); padded keys, and the query "
         "rows at padded positions when Lq = Lk, are left out")]
MaskConvention = Annotated[Literal[MASK_CONVENTIONS], checked_option(  # type: ignore[valid-type]
    Literal[MASK_CONVENTIONS], "--mask-convention", rich_help_panel=MASKS,  # type: ignore[valid-type]
    help="keep: 1 = may attend; block: 1 = masked")]
MaskKind = Annotated[Literal[MASK_KINDS], checked_option(  # type: ignore[valid-type]
    Literal[MASK_KINDS], "--mask-kind", rich_help_panel=MASKS,  # type: ignore[valid-type]
    help="of --mask: bool (0/1) or additive (a float bias: 0 keeps; -inf or <= -1e4, as Hugging Face's "
         "dtype minimum, masks)")]


@dataclass
class Selection:
    layer: int
    batch: int | None
    head: int

    def index(self, shape: tuple[int, ...]) -> tuple[int, int, int]:
        from attnviz.errors import UsageError

        layers, batches, heads = shape[:3]
        for option, value, size in (("--layer", self.layer, layers), ("--batch", self.batch or 0, batches),
                                    ("--head", self.head, heads)):
            if not -size <= value < size:
                raise UsageError(f"{option} {value}: the weights have {size} ({option[2:]} 0..{size - 1}).")
        return self.layer % layers, (self.batch or 0) % batches, self.head % heads


def _labels(q_labels: str | None, k_labels: str | None, labels: str | None, lq: int, lk: int,
            paths: list[Any]) -> tuple[list[str] | None, list[str] | None]:
    from attnviz.errors import InputError, UsageError
    from attnviz.io import load_labels

    if labels is not None and (q_labels or k_labels):
        raise UsageError("--labels sets both axes; give it alone, or --q-labels and --k-labels.")
    if labels is not None and lq != lk:
        raise UsageError(f"--labels labels both axes, but the maps are [{lq}, {lk}]; use --q-labels and --k-labels.")
    out: list[list[str] | None] = []
    for option, spec, n, axis in (("--q-labels", q_labels or labels, lq, "queries"),
                                  ("--k-labels", k_labels or labels, lk, "keys")):
        if spec is None:
            out.append(None)
            continue
        values, path, how = load_labels(spec)
        if path is not None:
            paths.append(path)
        if len(values) != n:
            raise InputError(f"{option if not labels else '--labels'} ({how}): {len(values)} labels for {n} {axis}.")
        out.append(values)
    return out[0], out[1]


def _report_checks(results: list[CheckResult], err: Console, source: str | None = None) -> bool:
    failed = False
    for r in results:  # with several files, each line names its file
        err.print(f"{source}: {r.line()}" if source else r.line(), markup=False,
                  style="green" if r.passed else "bold red")
        failed = failed or not r.passed
    return failed


def _run_checked(run: Any, options: dict[str, Any]) -> None:
    """Run a command body with the usual error handling; exit 3 when one of its checks failed."""
    from attnviz.cli.app import user_errors

    with user_errors():
        failed = run(options)
    if failed:
        raise typer.Exit(CHECK_FAILED)


#: how bad an exit code is, for a run over several files: usage error, bad data, a check failed, success
SEVERITY = {0: 0, CHECK_FAILED: 1, 1: 2, 2: 3}


def _run_each(run: Any, options: dict[str, Any], files_key: str, outputs: tuple[str, ...]) -> None:
    """``_run_checked`` for each file of ``options[files_key]`` in turn; output names with several files
    are templates (attnviz.cli.filemaps). A file that fails does not stop the others; the exit code is
    the worst: 2 (usage) before 1 (bad data) before 3 (a check failed) before 0."""
    files = options[files_key]
    outputs = tuple(o for o in outputs if o in options)  # the options this command has
    if len(files) == 1:
        _run_checked(run, {**options, files_key: files[0]})
        return
    from attnviz.cli.app import user_errors
    from attnviz.cli.filemaps import per_file_outputs
    from attnviz.errors import UsageError

    with user_errors():
        if "-" in files:
            raise UsageError(f"{files_key.upper()}: '-' (standard input) cannot be one of several files; "
                             "give file names.")
        plans = per_file_outputs({"--" + o.replace("_", "-"): options[o] for o in outputs}, files)
    worst = 0
    tables = not (options.get("json_out") or options.get("no_table") or options.get("quiet"))
    for path, plan in zip(files, plans):
        one = {**options, files_key: path, "_source": path, **{o: plan["--" + o.replace("_", "-")] for o in outputs}}
        if tables:
            out_console().print(f"== {path}", style="bold")
        try:
            _run_checked(run, one)
            code = 0
        except typer.Exit as exc:
            code = exc.exit_code
            if code not in SEVERITY:  # interrupted: stop here
                raise
        if SEVERITY[code] > SEVERITY[worst]:
            worst = code
    if worst:
        raise typer.Exit(worst)


def head_stats_table(stats: dict[str, np.ndarray], *, sort: str, reverse: bool, top: int | None,
                     precision: int = 2, padded: int = 0) -> Fitted:
    """One row per (layer, head): by layer or head ascending, by a statistic descending (largest
    first); ``reverse`` turns the order round. Laid out for the width it is printed at: on a terminal
    too narrow for every column, the columns of ``FIT_DROPS`` are left out in that order (the caption
    names them), never a number cut short."""
    import numpy as np

    from attnviz.render.table import Fitted

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
    if "induction" in stats:
        caption += ("; ind, dup: mean weight on the token after an earlier occurrence of the query's token "
                    "(induction) and on the earlier occurrences (duplicate-token), over queries whose token "
                    "occurred before")
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
        cells[name] = [f"{float(column[li, hi]):.{p}f}" for li, hi in shown]
    cells["pattern"] = [str(stats["tag"][li, hi]) for li, hi in shown]
    widths = {name: max([len(name), *(len(v) for v in values)]) for name, values in cells.items()}

    def build(width: int | None) -> Table:
        from rich import box

        names = list(cells)
        dropped: list[str] = []
        for name in FIT_DROPS:  # box SIMPLE_HEAD, no padding: one space between and around columns
            if name not in names:
                continue
            if width is None or sum(widths[n] for n in names) + len(names) + 1 <= width:
                break
            names.remove(name)
            dropped.append(name)
        note = f"; left out to fit the terminal: {', '.join(dropped)}" if dropped else ""
        table = Table(title=f"head statistics (by {sort}{', reversed' if reverse else ''})", caption=caption + note,
                      caption_justify="left", box=box.SIMPLE_HEAD, padding=0, pad_edge=False)
        for name in names:
            table.add_column(name, justify="left" if name == "pattern" else "right", no_wrap=True,
                             overflow="ellipsis", width=widths[name])
        for r in range(len(shown)):
            tag = cells["pattern"][r]
            table.add_row(*[cells[n][r] for n in names if n != "pattern"],
                          *([Text(tag, style="bold cyan" if tag else "")] if "pattern" in names else []))
        return table

    return Fitted(build)


#: head statistics left out, in this order, when the terminal is too narrow for all of them
FIT_DROPS = ("last", "first", "prev", "diag", "dist", "dup", "ind", "pattern")


def inspect_command(
    weights: Annotated[list[str], typer.Argument(
        metavar="WEIGHTS", show_default=False,
        help="attention weights [..., Lq, Lk] (.npy, .npz, .npz:KEY, .json, -); an .npz of one array per layer is "
             "stacked; several files are inspected in turn, output names then need a placeholder ({stem}, {name}, "
             "{dir}, {index}, {})")],
    layout: Layout = None,
    labels: Annotated[str | None, typer.Option("--labels", metavar="TOKENS", rich_help_panel=LABELS,
                                               help="labels for both axes (self-attention)")] = None,
    q_labels: Annotated[str | None, typer.Option("--q-labels", metavar="TOKENS", rich_help_panel=LABELS,
                                                 help="labels of the queries (rows)")] = None,
    k_labels: Annotated[str | None, typer.Option("--k-labels", metavar="TOKENS", rich_help_panel=LABELS,
                                                 help="labels of the keys (columns)")] = None,
    layer: LayerOpt = 0,
    head: HeadOpt = 0,
    batch: BatchOpt = None,
    sort: Annotated[Literal[SORTABLE], checked_option(  # type: ignore[valid-type]
        Literal[SORTABLE], "--sort", rich_help_panel=OUTPUT,  # type: ignore[valid-type]
        help="order the head statistics by this column (statistics: largest first)")] = "layer",
    reverse: Annotated[bool, typer.Option("--reverse", rich_help_panel=OUTPUT,
                                          help="turn the order round (statistics sort largest first)")] = False,
    top: Annotated[int | None, checked_option(int | None, "--top", min=1, rich_help_panel=OUTPUT,
                                              help="show only the first N heads of the sorted table")] = None,
    check_rows: Annotated[bool, typer.Option("--check-rows", rich_help_panel=CHECKS,
                                             help="every row that may attend sums to 1 within --atol")] = False,
    check_mask: Annotated[str | None, typer.Option("--check-mask", metavar="FILE", rich_help_panel=CHECKS,
                                                   help="no weight where this 0/1 mask forbids it (shapes as "
                                                        "--mask); it masks the statistics too")] = None,
    mask: MaskOpt = None,
    key_padding_mask: KeyPaddingOpt = None,
    mask_convention: MaskConvention = "keep",
    mask_kind: MaskKind = "bool",
    check_causal: Annotated[bool, typer.Option("--check-causal", rich_help_panel=CHECKS,
                                               help="nothing above the diagonal")] = False,
    causal_align: Annotated[Literal[CAUSAL_ALIGNS], checked_option(  # type: ignore[valid-type]
        Literal[CAUSAL_ALIGNS], "--causal-align", rich_help_panel=CHECKS,  # type: ignore[valid-type]
        help="the diagonal when Lq != Lk")] = "top-left",
    check_finite: Annotated[bool, typer.Option("--check-finite", rich_help_panel=CHECKS,
                                               help="no NaN or infinity")] = False,
    atol: Atol = None,
    png: Annotated[str | None, typer.Option("--png", metavar="FILE", rich_help_panel=OUTPUT,
                                            help="a layer x head grid of every map (the map itself when there "
                                                 "is one); .png, .svg or .pdf")] = None,
    map_png: Annotated[str | None, typer.Option("--map-png", metavar="FILE", rich_help_panel=OUTPUT,
                                                help="the selected map alone, with labels")] = None,
    stats_png: Annotated[str | None, typer.Option("--stats-png", metavar="FILE", rich_help_panel=OUTPUT,
                                                  help="a layers x heads heatmap of --stat")] = None,
    stat: Annotated[Literal[SORTABLE[2:]], checked_option(  # type: ignore[valid-type]
        Literal[SORTABLE[2:]], "--stat", rich_help_panel=OUTPUT,  # type: ignore[valid-type]
        help="the statistic of --stats-png")] = "entropy",
    received_png: Annotated[str | None, typer.Option(
        "--received-png", metavar="FILE", rich_help_panel=OUTPUT,
        help="a strip per layer of the attention each key token receives (mean over heads)")] = None,
    html: HtmlOpt = None,
    title: Title = None,
    cmap: Cmap = None,
    reduce: Reduce = "mean",
    vmin: VminOpt = None,
    vmax: VmaxOpt = None,
    norm: NormOpt = "linear",
    scale_per_panel: ScalePerPanelOpt = False,
    layers: LayersOpt = None,
    heads: HeadsOpt = None,
    reduce_heads: ReduceHeadsOpt = None,
    precision: Precision = 3,
    max_rows: MaxRows = 40,
    max_cols: MaxCols = None,
    json_out: JsonOpt = False,
    json_file: JsonFile = None,
    no_table: NoTable = False,
    quiet: Quiet = False,
) -> None:
    """Inspect attention weights a model saved: head statistics, tables, PNGs and checks."""
    _run_each(run_inspect, locals(), "weights", ("png", "map_png", "stats_png", "received_png", "json_file", "html"))


def read_masks(o: dict[str, Any], w: Weights, paths: list[Any], stdin: Any = None,
               check: bool = True) -> tuple[InspectMask, InspectMask | None]:
    """The masks a run was given (--mask, --key-padding-mask, --check-mask), combined; and the
    --check-mask alone, for its check."""
    from attnviz import inspect as insp
    from attnviz.io import load_array

    combined = insp.InspectMask()
    checked = None
    wanted = [("--mask", o["mask"], o["mask_kind"], False), ("--key-padding-mask", o["key_padding_mask"], "bool", True)]
    if check:
        wanted.append(("--check-mask", o["check_mask"], "bool", False))
    for option, spec, kind, key_padding in wanted:
        if spec is None:
            continue
        loaded = load_array(spec, stdin, allow_neg_inf=kind == "additive")
        if loaded.path is not None:
            paths.append(loaded.path)
        one = insp.read_mask(w, loaded, convention=o["mask_convention"], kind=kind, key_padding=key_padding,
                             option=option)
        if option == "--check-mask":
            checked = one
        combined = combined & one
    return combined.finish(w.shape), checked


def run_inspect(o: dict[str, Any]) -> bool:
    import numpy as np

    from attnviz import inspect as insp
    from attnviz.cli.app import _stderr
    from attnviz.errors import InputError, shape_str
    from attnviz.io import check_outputs
    from attnviz.masks import causal_keep
    from attnviz.render.scale import check_cmap

    for option in ("png", "map_png", "stats_png", "received_png"):
        check_png_path(o[option], "--" + option.replace("_", "-"))
    check_html_path(o["html"])
    check_cmap(o["cmap"])
    check_scale(o["vmin"], o["vmax"], o["norm"], o["scale_per_panel"])
    err = _stderr()
    w = insp.load_weights(o["weights"], o["layout"])
    lq, lk = w.shape[-2:]
    paths = list(w.paths)
    q_labels, k_labels = _labels(o["q_labels"], o["k_labels"], o["labels"], lq, lk, paths)
    tokens = q_labels if q_labels is not None and q_labels == k_labels else None  # token-aware heads need them
    for option, value in (("--sort", o["sort"]), ("--stat", o["stat"] if o["stats_png"] else None)):
        if value in TOKEN_STATS and tokens is None:
            from attnviz.cli.analysis_commands import TOKEN_NOTE
            from attnviz.errors import UsageError

            raise UsageError(f"{option} {value}: {TOKEN_NOTE}.")
    sel = Selection(o["layer"], o["batch"], o["head"])
    li, bi, hi = sel.index(w.shape)
    o = {**o, **grid_choice(o, w.shape)}
    masks, checked = read_masks(o, w, paths)
    keep, real = masks.keep, masks.real_rows
    targets = check_outputs({"--png": o["png"], "--map-png": o["map_png"], "--stats-png": o["stats_png"],
                             "--received-png": o["received_png"], "--json-file": o["json_file"], "--html": o["html"]},
                            paths)
    # the targets are reserved now, before any statistics are computed; every file is written to
    # its staged path and all are put in place together, or none (attnviz.cli.options.StagedOutputs)
    with staged_outputs(targets) as staged:
        if o["atol"] is None:  # the storage's own rounding: bfloat16 rows cannot sum to 1 within 1e-5
            atol = insp.default_atol(w.stored_dtype)
            o["atol"] = atol
            if atol > 1e-5 and o["check_rows"] and not o["quiet"]:
                err.print(f"check-rows: the weights were stored as {w.stored_dtype}: tolerance {atol:g} "
                          "(--atol to choose)", markup=False, style="dim")
        finite = insp.all_finite(w.data, rows=real)
        checks: list[insp.CheckResult] = []
        if o["check_finite"]:
            checks.append(insp.check_finite(w.data, rows=real))
        if not finite and not o["check_finite"]:
            bad = insp.check_finite(w.data, rows=real).failures
            raise InputError(f"{w.source}: {bad} non-finite value(s); run with --check-finite to locate them.")
        if finite:
            if o["check_rows"]:
                checks.append(insp.check_rows(w.data, o["atol"], keep, real))
            if checked is not None and checked.keep is not None:
                checks.append(insp.check_masked(w.data, checked.keep, o["atol"], "check-mask", rows=real))
            if o["check_causal"]:
                checks.append(insp.check_masked(w.data, causal_keep(lq, lk, o["causal_align"]), o["atol"],
                                                "check-causal", rows=real))
        failed = _report_checks(checks, err, o.get("_source")) if checks else False
        if not finite:
            return True

        chosen = masks if o["batch"] is None else masks.batch(bi)
        data = w.data if o["batch"] is None else w.data[:, bi:bi + 1]
        stats = insp.head_statistics(data, chosen.keep, real_rows=chosen.real_rows, real_keys=chosen.real_keys,
                                     stored=w.stored_dtype)
        distributions = insp.distributions(stats, insp.row_sum_tolerance(w.stored_dtype))
        from attnviz.cli.analysis_commands import add_token_scores, received_summary

        notes = [text for text in (add_token_scores(stats, data, tokens, chosen.real_rows, distributions.ok),)
                 if text]
        received = None
        if o["json_out"] or o["json_file"] or o["received_png"] or not (o["no_table"] or o["quiet"]):
            received = received_summary(data, chosen.keep, chosen.real_rows, k_labels,
                                        lq == lk and bool(stats["causal"]), list(range(w.shape[0])))
        warnings = [text for text in (distributions.warning(w.source),) if text]
        for text in warnings:
            err.print(f"warning: {text}", markup=False, style="yellow")
        padded = chosen.padded_rows(data.shape)
        one = w.data[li, bi, hi]
        one_keep = None if keep is None else np.broadcast_to(keep, w.shape)[li, bi, hi]
        one_padded = None if real is None else ~np.broadcast_to(real, w.shape[:-1])[li, bi, hi]

        wanted = o["json_out"] or o["json_file"] or not (o["no_table"] or o["quiet"])
        rows = insp.map_row_stats(one, one_keep) if wanted else None
        drawn_keep = one_keep  # the picture greys padded query rows as well as masked keys
        if one_padded is not None and one_padded.any():
            drawn_keep = np.ones(one.shape, bool) if one_keep is None else one_keep.copy()
            drawn_keep[one_padded] = False
        document = None
        files = _inspect_files(w, staged, stats, (li, bi, hi), q_labels, k_labels, o, drawn_keep, masks, received)
        if (o["json_out"] or o["json_file"]) and rows is not None:
            from attnviz.render.report import inspect_report, to_json

            if o["json_file"]:
                files["json"] = o["json_file"]
            document = to_json(inspect_report(w, stats, rows, (li, bi, hi), checks, files, q_labels, k_labels,
                                              warnings=warnings, mask=masks.described, padded=one_padded,
                                              padded_rows=padded, notes=notes,
                                              received=received))
            _save_json(document, staged)
        staged.commit()
        if not o["quiet"]:
            err.print(f"inspect: {w.source} {shape_str(w.file_shape)} read as [layers, batch, heads, Lq, Lk] = "
                      f"{shape_str(w.shape)}", markup=False, style="dim")
            if masks.described:
                left_out = ""
                if padded and chosen.real_rows is not None:  # positions of the batch, and their rows in every map
                    rows_real = np.broadcast_to(chosen.real_rows, data.shape[:-1])
                    positions = int((~rows_real).any(axis=(0, 2)).sum())
                    left_out = (f"; {positions} padded position(s) of the batch ({padded} padded query rows over "
                                "layers and heads) left out")
                err.print(f"masks: {', '.join(masks.described)}{left_out}", markup=False, style="dim")
            for what, path in files.items():
                err.print(f"saved {what} to {path}", markup=False, style="dim")
        if o["json_out"] and document is not None:
            stdout().write(document + "\n")
        if not o["json_out"] and rows is not None and not (o["no_table"] or o["quiet"]):
            from attnviz.render.table import stats_table, weights_table

            console = out_console()
            console.print(head_stats_table(stats, sort=o["sort"], reverse=o["reverse"], top=o["top"], padded=padded),
                          crop=False)
            if received is not None and received["top"]:
                from attnviz.cli.analysis_commands import received_table

                console.print(received_table(received, o["precision"]), crop=False)
            where = f"layer {li}, batch {bi}, head {hi}"
            max_r = o["max_rows"] or None
            console.print(weights_table(one, q_labels=q_labels, k_labels=k_labels, keep=one_keep,
                                        precision=o["precision"], max_rows=max_r, max_cols=o["max_cols"],
                                        title=f"weights of {where} [{lq}, {lk}] (--layer/--batch/--head pick another)",
                                        padded=one_padded),
                          crop=False)
            console.print(stats_table(rows, q_labels=q_labels, k_labels=k_labels, precision=o["precision"],
                                      max_rows=max_r, title=f"per-query statistics, {where}", padded=one_padded),
                          crop=False)
        return failed


def _save_json(text: str, staged: StagedOutputs) -> None:
    """The JSON document in its file (--json-file)."""
    if "--json-file" in staged:
        from attnviz.io import save_text

        save_text(staged["--json-file"], text + "\n")


def _grid_masks(masks: InspectMask | None, shape: tuple[int, ...],
                bi: int) -> tuple[np.ndarray | None, np.ndarray | None]:
    """The keep mask and real query rows of batch entry ``bi`` for a layer x head grid (views that
    broadcast, never a copy the size of the weights)."""
    import numpy as np

    keep = real = None
    if masks is not None and masks.keep is not None:
        keep = np.broadcast_to(masks.keep, shape)[:, bi]
    if masks is not None and masks.real_rows is not None:
        real = np.broadcast_to(masks.real_rows, shape[:-1])[:, bi]
    return keep, real


def grid_choice(o: dict[str, Any], shape: tuple[int, ...]) -> dict[str, list[int]]:
    """The layers and heads the grids draw (``--layers``, ``--heads``; all when not given), checked
    against the weights ``[layers, batch, heads, Lq, Lk]`` (exit 2 naming the size)."""
    from attnviz.cli.options import select_indices

    layers = select_indices(o["layers"], shape[0], "--layers", "layer")
    heads = select_indices(o["heads"], shape[2], "--heads", "head")
    return {"_layers": layers if layers is not None else list(range(shape[0])),
            "_heads": heads if heads is not None else list(range(shape[2]))}


def _inspect_files(w: Weights, targets: StagedOutputs, stats: dict[str, np.ndarray], index: tuple[int, int, int],
                   q_labels: list[str] | None, k_labels: list[str] | None, o: dict[str, Any],
                   one_keep: np.ndarray | None, masks: InspectMask | None = None,
                   received: dict[str, Any] | None = None) -> dict[str, str]:
    li, bi, hi = index
    written: dict[str, str] = {}
    if not targets:
        return written
    from attnviz.cli.options import figure_scale
    from attnviz.render.heatmap import heatmap_figure, save_figure, stat_figure
    from attnviz.render.mosaic import grid_getter, model_grid_figure

    name = o["title"] or f"attention weights of {w.source}"
    scale = figure_scale(o["vmin"], o["vmax"], o["norm"], o["scale_per_panel"])
    layers, heads = o["_layers"], o["_heads"]
    if "--png" in targets:
        keep, real = _grid_masks(masks, w.shape, bi)
        if o["reduce_heads"] or len(layers) * len(heads) > 1:  # one mosaic, read a layer at a time; masked grey
            fig = model_grid_figure(w.data[:, bi], title=f"{name}, batch {bi}", cmap=o["cmap"], reduce=o["reduce"],
                                    keep=keep, real_rows=real, layers=layers, heads=heads,
                                    reduce_heads=o["reduce_heads"], scale=scale)
        else:  # one map: drawn with its labels
            data, drawn_keep = grid_getter(w.data[:, bi], keep, real)(layers[0], heads[0])
            where = f", layer {layers[0]}, batch {bi}, head {heads[0]}" if w.shape[0] * w.shape[2] > 1 else ""
            fig = heatmap_figure(data, title=name + where, q_labels=q_labels, k_labels=k_labels, keep=drawn_keep,
                                 cmap=o["cmap"], reduce=o["reduce"], scale=scale)
        save_figure(fig, targets["--png"])
        written["png"] = o["png"]
    if "--map-png" in targets:
        fig = heatmap_figure(w.data[li, bi, hi], title=f"{name}, layer {li}, batch {bi}, head {hi}",
                             q_labels=q_labels, k_labels=k_labels, keep=one_keep, cmap=o["cmap"], reduce=o["reduce"],
                             scale=scale)
        save_figure(fig, targets["--map-png"])
        written["map_png"] = o["map_png"]
    if "--stats-png" in targets:  # the chosen layers and heads (--layers/--heads), by their numbers
        import numpy as np

        values = np.asarray(stats[o["stat"]])[np.ix_(layers, heads)]
        save_figure(stat_figure(values, title=name, stat=o["stat"], cmap=o["cmap"], layer_ids=layers, head_ids=heads),
                    targets["--stats-png"])
        written["stats_png"] = o["stats_png"]
    if "--received-png" in targets and received is not None:
        from attnviz.cli.analysis_commands import received_figure

        chosen = {**received, "per_layer": received["per_layer"][layers], "layers": layers}
        save_figure(received_figure(chosen, k_labels, title=f"attention received per token: {name}", cmap=o["cmap"],
                                    reduce=o["reduce"], scale=scale), targets["--received-png"])
        written["received_png"] = o["received_png"]
    if "--html" in targets:  # every map of the batch entry, as the --png grid, and the head statistics
        from attnviz.errors import shape_str
        from attnviz.io import save_text
        from attnviz.render.html import head_stats_table as html_stats
        from attnviz.render.html import model_report

        keep, real = _grid_masks(masks, w.shape, bi)
        batches = "every batch entry" if o["batch"] is None else f"batch entry {bi}"
        table = html_stats(stats, {k: v for k, v in COLUMNS.items() if k in stats}, precision=o["precision"],
                           caption=f"means over query rows of {batches}: entropy H (nats) and H/ln n; dist: mean "
                                   "|i - j| weighted; diag, prev (j = i - 1), first (j = 0), last: mean weight on "
                                   "that key; max: mean largest weight")
        save_text(targets["--html"], model_report(
            w.data[:, bi], title=f"{name}, batch {bi}", q_labels=q_labels, k_labels=k_labels, keep=keep,
            real_rows=real, stats=table, selected=(li, hi), cmap=o["cmap"], reduce=o["reduce"], layers=layers,
            heads=heads, vmin=o["vmin"], vmax=o["vmax"], norm=o["norm"],
            subtitle=f"{w.source} {shape_str(w.file_shape)} read as [layers, batch, heads, Lq, Lk] = "
                     f"{shape_str(w.shape)}; batch entry {bi} of {w.shape[1]}"))
        written["html"] = o["html"]
    return written


def compare_figure(o: dict[str, Any], diff: np.ndarray, masks: tuple[np.ndarray | None, np.ndarray | None],
                   name: str) -> Any:
    """compare's --png of ``diff [layers, heads, Lq, Lk]`` (A - B of one batch entry): the chosen
    (layer, head) maps, or layers with --reduce-heads, ranked by their largest |A - B| and drawn largest
    first, at most --max-panels of them, each captioned with its layer, head and max |A - B|; one map
    alone is drawn with its axes. One scale symmetric around 0 (``ColourScale``)."""
    from attnviz.cli.options import figure_scale
    from attnviz.render.heatmap import heatmap_figure
    from attnviz.render.mosaic import grid_getter, rank_panels, ranked_grid_figure

    scale = figure_scale(None, o["vmax"], o["norm"], o["scale_per_panel"])
    keep, real = masks
    layers, heads = o["_layers"], o["_heads"]
    panels: list[tuple[int, int | None]] = (
        [(layer, None) for layer in layers] if o["reduce_heads"] else [(layer, h) for layer in layers for h in heads])
    if len(panels) == 1 and not o["reduce_heads"]:
        layer, head = layers[0], heads[0]
        data, one = grid_getter(diff, keep, real)(layer, head)
        where = f", layer {layer}, head {head}" if diff.shape[0] * diff.shape[1] > 1 else ""
        return heatmap_figure(data, title=name + where, keep=one, diverging=True, cmap=o["cmap"], reduce=o["reduce"],
                              colorbar_label="A - B", scale=scale)
    ranked = rank_panels(diff, panels, keep=keep, real_rows=real, heads=heads, reduce_heads=o["reduce_heads"])
    return ranked_grid_figure(diff, ranked[:o["max_panels"] or None], title=name, total=len(panels), cmap=o["cmap"],
                              reduce=o["reduce"], keep=keep, real_rows=real, heads=heads,
                              reduce_heads=o["reduce_heads"], scale=scale)


def compare_command(
    a: Annotated[str, typer.Argument(metavar="A", show_default=False, help="attention weights (as for inspect)")],
    b: Annotated[str, typer.Argument(metavar="B", show_default=False, help="weights of the same shape")],
    layout: Layout = None,
    atol: Annotated[float | None, checked_option(float | None, "--atol", min=0, rich_help_panel=CHECKS,
                help="fail (exit 3) where |A - B| > atol + rtol |B|")] = None,
    rtol: Annotated[float | None, checked_option(float | None, "--rtol", min=0, rich_help_panel=CHECKS,
                help="relative tolerance of the check (default 0)")] = None,
    worst: Annotated[int, checked_option(int, "--worst", min=1, rich_help_panel=OUTPUT,
                                         help="list this many of the most different rows")] = 5,
    layer: LayerOpt = 0,
    head: HeadOpt = 0,
    batch: BatchOpt = None,
    mask: MaskOpt = None,
    key_padding_mask: KeyPaddingOpt = None,
    mask_convention: MaskConvention = "keep",
    mask_kind: MaskKind = "bool",
    png: Annotated[str | None, typer.Option("--png", metavar="FILE", rich_help_panel=OUTPUT,
                                            help="heatmap of A - B (diverging colours, one symmetric scale) for "
                                                 "every layer and head of the batch entry; .png, .svg or .pdf")] = None,
    html: HtmlOpt = None,
    title: Title = None,
    cmap: Cmap = None,
    reduce: Reduce = "mean",
    vmax: Annotated[float | None, checked_option(
        float | None, "--vmax", metavar="V", rich_help_panel=FIGURE,
        help="draw A - B from -V to V (default the largest |A - B|); larger differences take the end colours")] = None,
    norm: Annotated[str, checked_option(
        str, "--norm", parser=NormSpec(), metavar="linear|log|power:G", rich_help_panel=FIGURE,
        help="linear; log: symmetric log scale (linear near 0, within 4 decades of V or the smallest |A - B|); "
             "power:G: sign(x) |x|^G, e.g. power:0.5")] = "linear",
    scale_per_panel: ScalePerPanelOpt = False,
    layers: LayersOpt = None,
    heads: HeadsOpt = None,
    reduce_heads: ReduceHeadsOpt = None,
    max_panels: Annotated[int, checked_option(
        int, "--max-panels", min=0, metavar="N", rich_help_panel=FIGURE,
        help="--png draws the N maps with the largest max |A - B|, largest first (0: all)")] = 16,
    precision: Precision = 3,
    json_out: JsonOpt = False,
    json_file: JsonFile = None,
    no_table: NoTable = False,
    quiet: Quiet = False,
) -> None:
    """Compare two sets of attention weights: differences, Jensen-Shannon divergence, argmax agreement."""
    _run_checked(run_compare, locals())


def run_compare(o: dict[str, Any]) -> bool:
    from attnviz import inspect as insp
    from attnviz.cli.app import _stderr
    from attnviz.errors import InputError, ShapeError, shape_str
    from attnviz.io import StdinReader, check_outputs
    from attnviz.render.scale import check_cmap

    check_png_path(o["png"])
    check_html_path(o["html"])
    check_cmap(o["cmap"])
    check_scale(None, o["vmax"], o["norm"], o["scale_per_panel"], diverging=True)
    stdin = StdinReader()
    a = insp.load_weights(o["a"], o["layout"], stdin)
    b = insp.load_weights(o["b"], o["layout"], stdin)
    if a.shape != b.shape:
        raise ShapeError(f"A ({a.source}) is {shape_str(a.file_shape)} and B ({b.source}) {shape_str(b.file_shape)}; "
                         "compare needs the same shape.")
    paths = [*a.paths, *b.paths]
    masks, _ = read_masks(o, a, paths, stdin, check=False)
    for w in (a, b):
        if not insp.all_finite(w.data, rows=masks.real_rows):
            raise InputError(f"{w.source}: holds NaN or infinity; `attnviz inspect --check-finite` locates them.")
    _, bi, _ = Selection(o["layer"], o["batch"], o["head"]).index(a.shape)
    o = {**o, **grid_choice(o, a.shape)}
    targets = check_outputs({"--png": o["png"], "--json-file": o["json_file"], "--html": o["html"]}, paths)
    err = _stderr()
    files: dict[str, str] = {}
    text = None
    with staged_outputs(targets) as staged:  # all files or none (attnviz.cli.options.StagedOutputs)
        result = insp.compare(a.data, b.data, o["worst"], masks.real_rows, masks.keep,
                              (a.stored_dtype, b.stored_dtype))
        checks = []
        if o["atol"] is not None or o["rtol"] is not None:
            checks.append(insp.tolerance_check(a.data, b.data, o["atol"] or 0.0, o["rtol"] or 0.0, masks.real_rows))
        failed = _report_checks(checks, err) if checks else False
        warnings = []
        for w, found in zip((a, b), result.distributions or ()):
            found_text = found.warning(f"{'A' if w is a else 'B'} ({w.source})", tags=False)
            if found_text:
                warnings.append(found_text)
                err.print(f"warning: {found_text}", markup=False, style="yellow")
        if masks.described and not o["quiet"]:
            left_out = f"; {result.padded_rows} padded query rows left out" if result.padded_rows else ""
            err.print(f"masks: {', '.join(masks.described)}{left_out}", markup=False, style="dim")
        if "--png" in staged:
            from attnviz.render.heatmap import save_figure

            name = o["title"] or f"A - B: {a.source} - {b.source}, batch {bi}"
            save_figure(compare_figure(o, result.diff[:, bi], _grid_masks(masks, a.shape, bi), name), staged["--png"])
            files["png"] = o["png"]
        if "--html" in staged:  # A - B for every layer and head of the batch entry, and per-head differences
            from attnviz.io import save_text
            from attnviz.render.html import compare_stats_table, model_report

            li, _, hi = Selection(o["layer"], o["batch"], o["head"]).index(a.shape)
            keep, real = _grid_masks(masks, a.shape, bi)
            save_text(staged["--html"], model_report(
                result.diff[:, bi], title=o["title"] or f"A - B: {a.source} - {b.source}, batch {bi}",
                subtitle=f"A = {a.source}, B = {b.source}, {shape_str(a.shape)} [layers, batch, heads, Lq, Lk]; "
                         f"batch entry {bi}", keep=keep, real_rows=real, diverging=True, colorbar_label="A - B",
                stats=compare_stats_table(result.diff, result.js, o["precision"]), selected=(li, hi),
                cmap=o["cmap"], reduce=o["reduce"], layers=o["_layers"], heads=o["_heads"], vmax=o["vmax"],
                norm=o["norm"]))
            files["html"] = o["html"]
        if o["json_out"] or o["json_file"]:
            from attnviz.render.report import compare_report, to_json

            if o["json_file"]:
                files["json"] = o["json_file"]
            text = to_json(compare_report(a, b, result, checks, files, warnings=warnings, mask=masks.described))
            _save_json(text, staged)
        staged.commit()
    for what in ("png", "html"):
        if what in files and not o["quiet"]:
            err.print(f"saved {what} to {files[what]}", markup=False, style="dim")
    if o["json_out"] and text is not None:
        stdout().write(text + "\n")
    if not (o["json_out"] or o["no_table"] or o["quiet"]):
        console = out_console()
        p = o["precision"]
        from attnviz.render.text import title as inert_title

        summary = Table(title=Text(inert_title(f"A = {a.source}, B = {b.source}, {shape_str(a.shape)} "
                                               "[layers, batch, heads, Lq, Lk]")))
        summary.add_column("measure")
        summary.add_column("value", justify="right")
        for name, value in (("max |A - B|", f"{result.max_abs:.{max(p, 3)}g}"),
                            ("mean |A - B|", f"{result.mean_abs:.{max(p, 3)}g}"),
                            ("mean Jensen-Shannon (nats, max ln 2)", f"{result.js_mean:.{max(p, 3)}g}"),
                            ("max Jensen-Shannon", f"{result.js_max:.{max(p, 3)}g}"),
                            ("rows with the same argmax", f"{100 * result.argmax_agree:.2f}%")):
            summary.add_row(name, value)
        console.print(summary, crop=False)
        rows = Table(title=f"the {len(result.worst_rows)} most different rows (by Jensen-Shannon divergence)")
        for column in ("where", "JS", "max |A - B|", "argmax A", "argmax B"):
            rows.add_column(column, justify="left" if column == "where" else "right")
        for r in result.worst_rows:
            rows.add_row(str(r["where"]), f"{r['js']:.{max(p, 3)}g}", f"{r['max_abs']:.{max(p, 3)}g}",
                         str(r["argmax_a"]), str(r["argmax_b"]))
        console.print(rows, crop=False)
    return failed

"""``attnviz inspect``: weights a model already produced. The command parses its options into typed
dataclasses, runs ``attnviz.inspection.inspecting`` (prepare, reserve the output files, analyse), and
prints and saves what it gets back. No TensorFlow here.
"""

from __future__ import annotations

import inspect
import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Annotated, Any

import typer

from attnviz.choices import INPUT_FORMATS
from attnviz.cli.checked import report_checks, run_each
from attnviz.cli.commands.capture import model_parameters
from attnviz.cli.options import (
    OUTPUT,
    TableOptions,
    build,
    check_array_path,
    check_html_path,
    check_png_path,
    parameters,
)
from attnviz.fields import option
from attnviz.inspection.options import InspectOptions, SpanOptions
from attnviz.render.options import FigureOptions, ShowOptions
from attnviz.statistics import STATISTICS, SUMMARY, WEIGHTS, names, sort_key
from attnviz.streams import err_console, out_console, stdout

#: the head statistics of exact weights, then a summary's own (the table of attnviz.statistics): --stat's choices
SORTABLE = ("layer", "head", *names(WEIGHTS), *(n for n in names(SUMMARY) if n not in names(WEIGHTS)))
SUMMARY_ONLY = tuple(n for n in names(SUMMARY) if n not in names(WEIGHTS))
#: --span, --span-text and --needle: declared with their help in attnviz.inspection.options.SpanOptions
SPAN_FIELDS = SpanOptions.__dataclass_fields__
#: what --sort takes: a column by its statistic's name or its header (attnviz.statistics.sort_key checks it against
#: the file's kind), a corpus file's token class
SORT_HELP = ("order the head statistics by this column, its name or its header (statistics: largest first): layer, "
             "head, " + ", ".join(s.name if s.header.replace(" ", "_") == s.name else f"{s.name} or {s.header}"
                                 for s in STATISTICS) + "; a corpus file's token classes (--token-class NAME)")
FILE_OUTPUTS = ("png", "map_png", "stats_png", "received_png", "overlay_png", "json_file", "html", "save_maps",
                "heads_map", "tensorboard")
OVERLAY_HELP = ("the query's attention over the image's patches, blended over the picture (--image): a panel per "
                "head of the layer (--layer; default the last) and their mean; .png, .svg or .pdf")


@dataclass
class InspectOutputs(TableOptions):
    """What inspect prints and saves."""

    sort: str = option("layer", SORT_HELP, panel=OUTPUT, parse="column", metavar="COLUMN")
    reverse: bool = option(False, "turn the order round (statistics sort largest first)", panel=OUTPUT)
    top: int | None = option(None, "show only the first N heads of the sorted table", panel=OUTPUT, min=1)
    # None where not given (TableOptions' is 40): a long map's weights tables are printed only when asked for
    max_rows: int | None = option(None, "show at most this many query rows, eliding the middle (0: all; default "  # type: ignore[assignment]
                                  "40, and a map of more rows than that gets the head tables and a line instead of "
                                  "its weights tables)", panel=OUTPUT, min=0)
    no_table: bool = option(False, "print no tables; with --sort, --reverse or --top, the head statistics table alone",
                            panel=OUTPUT)
    png: str | None = option(None, "a layer x head grid of every map (the map itself when there is one); .png, .svg "
                             "or .pdf", panel=OUTPUT, metavar="FILE")
    map_png: str | None = option(None, "the selected map alone, with labels", panel=OUTPUT, metavar="FILE")
    stats_png: str | None = option(None, "a layers x heads heatmap of --stat (of weights, a summary or a corpus "
                                   "file)", panel=OUTPUT, metavar="FILE")
    stat: str = option("entropy", "the column of --stats-png: a statistic of the file's head table (entropy, max, "
                       "first ...; a summary's sink_mass, sink_rate, retrieval with --needle, on:SPAN; a corpus "
                       "file's sink_rate, punctuation, class:NAME ...); one the file lacks is refused, naming those "
                       "it has", panel=OUTPUT, metavar="NAME", parse="stat")
    received_png: str | None = option(None, "a strip per layer of the attention each key token receives (mean over "
                                      "heads)", panel=OUTPUT, metavar="FILE")
    overlay_png: str | None = option(None, OVERLAY_HELP, panel=OUTPUT, metavar="FILE")
    html: str | None = option(None, "write an interactive report: one offline HTML file (every map of the batch "
                              "entry as thumbnails, hover, head view, sortable statistics; with --image a panel of "
                              "the picture: hover a patch to see its attention)", panel=OUTPUT,
                              metavar="FILE.html")
    heads_map: str | None = option(None, "a corpus file's heads placed by the Jensen-Shannon distances of their rows "
                                   "(classical multidimensional scaling), coloured by layer; .png, .svg or .pdf",
                                   panel=OUTPUT, metavar="FILE")
    tensorboard: str | None = option(None, "write the head statistics as TensorBoard summaries into this folder (a "
                                     "run; made if needed): per head attnviz/layer_L/head_H/STAT and its tags as "
                                     "scalars, the grid and each layer as images, the head table as text "
                                     "(docs/training.md); of weights, a summary or a corpus file", panel=OUTPUT,
                                     metavar="DIR")
    tensorboard_step: int = option(0, "TensorBoard's step of --tensorboard's summaries (an epoch, a checkpoint's "
                                   "step)", panel=OUTPUT, min=0, metavar="N")
    save_maps: str | None = option(None, "save the maps inspected, [layers, batch, heads, Lq, Lk] (after --generation "
                                   "and --merge-subwords; without them the weights as read): .npy, .npz or "
                                   ".safetensors (key weights)", panel=OUTPUT, metavar="FILE")

    @property
    def head_table(self) -> bool:
        """--no-table with an order asked for (--sort, --reverse, --top): the head table the user sorted."""
        return (self.no_table and not (self.json or self.quiet)
                and (self.sort != "layer" or self.reverse or self.top is not None))


ORDER = ("layout", "generation", "weigh_by",
         "labels", "q_labels", "k_labels", "merge_subwords", "subword_style",
         "layer", "head", "batch", "sort", "reverse", "top", "check_rows",
         "check_mask", "mask", "key_padding_mask", "mask_convention", "mask_kind", "check_causal", "causal_align",
         "check_finite", "atol", "image", "patch_grid", "patch_size", "prefix_tokens", "image_tokens", "query",
         "upsample", "keep_mass", "png", "map_png", "stats_png", "stat", "received_png", "overlay_png", "html",
         "save_maps", "heads_map", "tensorboard", "tensorboard_step", "title", "cmap",
         "reduce", "vmin", "vmax", "norm", "scale_skip_keys", "scale_per_panel", "layers", "heads", "reduce_heads",
         "show", "graphics", "precision", "max_rows", "max_cols", "json", "json_file", "no_table", "quiet")


def inspect_command(**values: Any) -> None:
    """Inspect attention weights a model saved: head statistics, tables, PNGs and checks."""
    from attnviz.cli.commands.capture import captured_input
    from attnviz.cli.errors import user_errors

    asked = {name: values.pop(name) for name in ("span", "span_text", "needle")}
    with user_errors():
        from attnviz.inspection.kinds import check_retrieval_sort

        check_retrieval_sort(values.get("sort") or "layer", SpanOptions.of(**asked))  # before any file is read
        with captured_input(values.pop("weights") or [], values) as files:
            _inspect_files(files, values, asked)


def _inspect_files(files: list[str], values: dict[str, Any], asked: dict[str, Any] | None = None) -> None:
    options: InspectOptions = build(InspectOptions, values)
    fig: FigureOptions = build(FigureOptions, values)
    out: InspectOutputs = build(InspectOutputs, values)
    show: ShowOptions = build(ShowOptions, values)
    spans = SpanOptions.of(**(asked or {}))

    def one(path: str, names: dict[str, Any], source: str | None) -> bool:
        board = names.get("tensorboard")
        if board is not None:  # before any file is read or written
            from attnviz.monitoring.tensorboard import check_log_dir

            if path == "-":
                from attnviz.errors import UsageError

                raise UsageError("--tensorboard reads its file twice; give a file name, not '-' (standard input).")
            check_log_dir(board)
        failed = route(path, replace(out, **names), source)
        if board is not None:
            write_tensorboard(path, board, out.tensorboard_step, replace(options, weights=path), out.quiet)
        return failed

    def route(path: str, out: InspectOutputs, source: str | None) -> bool:
        from attnviz.inspection.kinds import CORPUS, kind_of, refuse_spans

        found = kind_of(path)  # exact weights, a summary, q and k to summarise, or a corpus file
        refuse_spans(found, spans)
        if found.kind == CORPUS:  # per-head statistics over many texts (attnviz capture --corpus)
            inspect_corpus(found, out, fig)
            return False
        if found.summarised:
            return inspect_summary(found, options, fig, out, spans)
        return inspect_file(replace(options, weights=path), fig, out, source, show)

    run_each(files, {"--" + o.replace("_", "-"): getattr(out, o) for o in FILE_OUTPUTS}, lambda path, plan, source:
             one(path, {o: plan["--" + o.replace("_", "-")] for o in FILE_OUTPUTS}, source), "WEIGHTS", out.tables)


def _span_parameter(name: str, hint: Any) -> inspect.Parameter:
    """--span, --span-text or --needle: a parameter of its own (repeatable, or one text), declared in
    ``SpanOptions``."""
    meta = SPAN_FIELDS[name].metadata
    return inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=None, annotation=Annotated[
        hint, typer.Option("--" + name.replace("_", "-"), metavar=meta["metavar"], rich_help_panel=meta["panel"],
                           help=meta["help"])])


inspect_command.__signature__ = inspect.Signature([  # type: ignore[attr-defined]
    inspect.Parameter("weights", inspect.Parameter.POSITIONAL_OR_KEYWORD, default=None, annotation=Annotated[
        list[str] | None, typer.Argument(metavar="WEIGHTS", show_default=False,
        help=f"attention weights [..., Lq, Lk] ({INPUT_FORMATS}; FILE:KEY for one array of a file of several), "
             "or a capture file (attnviz capture; an encoder-decoder's as FILE:encoder, :decoder or :cross); a file "
             "of one array per layer is stacked; several files are inspected in turn, output names then need a "
             "placeholder ({stem}, {name}, {dir}, {index}, {})")]),
    *parameters(InspectOptions, FigureOptions, InspectOutputs, ShowOptions, order=ORDER, overrides={"cmap": {
        "help": "a matplotlib colour map for heatmaps (default viridis; magma for --received-png)"}}),
    *model_parameters(),
    _span_parameter("span", list[str] | None),
    _span_parameter("span_text", list[str] | None),
    _span_parameter("needle", str | None),
])


def write_tensorboard(path: str, board: str, step: int, options: InspectOptions, quiet: bool) -> None:
    """--tensorboard DIR: the head statistics inspect reported of ``path`` (weights read with ``options``, a summary,
    a corpus file) as one event file in DIR, at TensorBoard's step ``step`` (``attnviz.monitoring``)."""
    from attnviz.monitoring.records import record_of
    from attnviz.monitoring.tensorboard import write_record

    record = record_of(path, options)
    local = record.face == "weights" and Path(path).is_file()  # (a URL, FILE:KEY: no head view)
    written = write_record(board, record, step, capture=path if local else None)
    if not quiet:
        err_console().print(f"saved TensorBoard summaries (step {step}) to {written}", markup=False, style="dim")


def inspect_summary(found: Any, options: InspectOptions, fig: FigureOptions, out: InspectOutputs,
                    spans: SpanOptions) -> bool:
    """A summary capture: the per-head table (sortable, --top), the pooled grid (--png), the received
    attention by position (--received-png), the chosen rows (--map-png), JSON; spans and retrieval heads
    (``attnviz.inspection.kinds.inspect_summary`` reads and checks it)."""
    from attnviz.inspection import kinds
    from attnviz.io import check_outputs
    from attnviz.render import summary as drawn
    from attnviz.staging import staged_outputs

    for name in ("png", "map_png", "stats_png", "received_png"):
        check_png_path(getattr(out, name), "--" + name.replace("_", "-"))
    fig.check()
    inspected = kinds.inspect_summary(found, options, spans, sort=out.sort, reverse=out.reverse, top=out.top,
                                      stat=out.stat if out.stats_png else None, map_rows=bool(out.map_png),
                                      outputs=_asked(out))
    targets = check_outputs({"--png": out.png, "--map-png": out.map_png, "--stats-png": out.stats_png,
                             "--received-png": out.received_png, "--json-file": out.json_file}, [])
    err = err_console()
    files: dict[str, str] = {}
    with staged_outputs(targets) as staged:
        from attnviz.render.heatmap import save_figure

        for kind, flag in drawn.SUMMARY_PICTURES.items():
            if flag in staged:
                save_figure(drawn.inspection_figure(inspected, fig, kind, out.stat), staged[flag])
                files[flag[2:].replace("-", "_")] = getattr(out, flag[2:].replace("-", "_"))
        document = None
        if out.document:
            if out.json_file:
                files["json"] = out.json_file
            document = json.dumps(drawn.inspection_document(inspected, files))
            save_json(document, staged)
        staged.commit()
    if not out.quiet:
        err.print(f"inspect: {inspected.read_as()}", markup=False, style="dim")
        _say_generated(inspected.read.generated, err)
        for what, path in files.items():
            err.print(f"saved {what} to {path}", markup=False, style="dim")
    for text in inspected.warnings:  # said under --quiet too
        err.print(f"warning: {text}", markup=False, style="yellow")
    if out.json and document is not None:
        stdout().write(document + "\n")
    elif out.tables or out.head_table:  # its one table: the head table, which --sort and --top ask for
        out_console().print(drawn.head_table(inspected.result, out.precision, inspected.sort, out.reverse, out.top),
                            crop=False)
    return False


def inspect_corpus(found: Any, out: InspectOutputs, fig: FigureOptions) -> None:
    """``attnviz inspect heads.safetensors``: the per-head table (sorted, ``--top``) or ``--json``; with
    ``--png`` the layer strips, with ``--heads-map`` the heads placed by their distances, with ``--stats-png`` the
    layers x heads heatmap of ``--stat`` (``attnviz.inspection.kinds.inspect_corpus`` reads and checks it)."""
    from pathlib import Path

    from attnviz.inspection import kinds
    from attnviz.io import check_outputs
    from attnviz.render import corpus as drawn
    from attnviz.staging import staged_outputs

    inspected = kinds.inspect_corpus(found, sort=out.sort, reverse=out.reverse, top=out.top,
                                     stat=out.stat if out.stats_png else None, outputs=_asked(out))
    for name in ("png", "heads_map", "stats_png"):
        check_png_path(getattr(out, name), "--" + name.replace("_", "-"))
    targets = check_outputs({"--png": out.png, "--heads-map": out.heads_map, "--stats-png": out.stats_png,
                             "--json-file": out.json_file}, [Path(inspected.source)])
    files: dict[str, str] = {}
    err = err_console()
    with staged_outputs(targets) as staged:
        from attnviz.render.heatmap import save_figure

        for kind, flag in drawn.CORPUS_PICTURES.items():
            if flag in staged:
                save_figure(drawn.inspection_figure(inspected, fig, kind, out.stat), staged[flag])
                files[flag[2:].replace("-", "_")] = getattr(out, flag[2:].replace("-", "_")) or ""
        document = json.dumps(drawn.inspection_document(inspected, files))
        if "--json-file" in staged:
            from attnviz.io import save_text

            save_text(staged["--json-file"], document + "\n")
            files["json"] = out.json_file or ""
        staged.commit()
    if not out.quiet:
        err.print(f"inspect: {inspected.read_as()}", markup=False, style="dim")
        for what, where in files.items():
            err.print(f"saved {what} to {where}", markup=False, style="dim")
    if out.json:
        stdout().write(document + "\n")
    elif out.tables:
        console = out_console()
        for table in drawn.inspection_tables(inspected, out.precision):
            console.print(table, crop=False)


def _asked(out: InspectOutputs) -> dict[str, Any]:
    """The files inspect was asked to write, by output name (what a kind of file cannot write is refused)."""
    return {name: getattr(out, name) for name in FILE_OUTPUTS}


def inspect_file(options: InspectOptions, fig: FigureOptions, out: InspectOutputs, source: str | None,
                 show: ShowOptions | None = None) -> bool:
    """One file of weights: returns whether a check failed."""
    from attnviz.inspection import kinds

    kinds.refuse_outputs(kinds.WEIGHTS, str(options.weights), {"heads_map": out.heads_map})
    out = replace(out, sort=sort_key(out.sort, WEIGHTS, str(options.weights)))
    from attnviz.cli import show as shown
    from attnviz.inspection import inspecting
    from attnviz.io import check_outputs
    from attnviz.staging import staged_outputs

    if out.stats_png:  # before the weights are read: what exact weights have is known
        kinds.check_weights_stat(out.stat, options.weights or "WEIGHTS")
    for name in ("png", "map_png", "stats_png", "received_png", "overlay_png"):
        check_png_path(getattr(out, name), "--" + name.replace("_", "-"))
    check_html_path(out.html)
    check_array_path(out.save_maps, "--save-maps")
    check_overlay(out.overlay_png, options.images)
    fig.check()
    show = show or ShowOptions()
    show = shown.check(show, out.json)
    err = err_console()
    options = replace(options, received=out.document or out.received_png is not None or out.tables,
                      row_stats=out.document or out.tables)
    opened = inspecting.prepare(options, (("--sort", out.sort), ("--stat", out.stat if out.stats_png else None)))
    w = opened.weights
    targets = check_outputs({"--png": out.png, "--map-png": out.map_png, "--stats-png": out.stats_png,
                             "--received-png": out.received_png, "--overlay-png": out.overlay_png,
                             "--json-file": out.json_file, "--html": out.html, "--save-maps": out.save_maps},
                            opened.paths)
    # the targets are reserved now, before any statistics are computed; every file is written to
    # its staged path and all are put in place together, or none (attnviz.staging.StagedOutputs)
    with staged_outputs(targets) as staged:
        if options.checks.atol is None and options.checks.check_rows and not out.quiet:
            from attnviz.inspection.heads import default_atol

            atol = default_atol(w.stored_dtype)
            if atol > 1e-5:  # the storage's own rounding: bfloat16 rows cannot sum to 1 within 1e-5
                err.print(f"check-rows: the weights were stored as {w.stored_dtype}: tolerance {atol:g} "
                          "(--atol to choose)", markup=False, style="dim")
        notes: list[str] = []  # what a picture could not show (its tokens), for stderr
        result = inspecting.analyse(opened, _grid_meanwhile(opened, staged, fig, options, notes, out.png))
        failed = report_checks(result.checks, err, source) if result.checks else False
        if not result.finite:
            return True
        for text in result.warnings:
            err.print(f"warning: {text}", markup=False, style="yellow")
        files = _save_files(result, staged, fig, out, notes)
        if "--save-maps" in staged:
            from attnviz.io import save_array

            save_array(staged["--save-maps"], w.data, suffix=Path(out.save_maps or "").suffix)
            files["maps"] = out.save_maps or ""
        document = None
        if out.document and result.rows is not None:
            from attnviz.render.report import inspect_document, to_json

            if out.json_file:
                files["json"] = out.json_file
            document = to_json(inspect_document(result, files))
            save_json(document, staged)
        staged.commit()
        if not out.quiet:
            err.print(f"inspect: {w.read_as()}", markup=False, style="dim")
            _say_generated(None if w.capture is None else w.capture.generated_texts(), err)
            if opened.words:
                err.print(f"merged {w.file_shape[-1]} pieces into {w.shape[-1]} words "
                          f"({opened.words['style']}; --merge-subwords)", markup=False, style="dim")
            if opened.masks.described:
                left_out = ""
                if result.padded and result.chosen.real_rows is not None:
                    left_out = (f"; {result.padded_positions()} padded position(s) of the batch ({result.padded} "
                                "padded query rows over layers and heads) left out")
                err.print(f"masks: {', '.join(opened.masks.described)}{left_out}", markup=False, style="dim")
            for what, path in files.items():
                err.print(f"saved {what} to {path}", markup=False, style="dim")
            for note in notes:
                err.print(note, markup=False, style="dim")
        if out.json and document is not None:
            stdout().write(document + "\n")
        if not out.json and result.rows is not None and out.tables:
            _print_tables(result, out)
        elif out.head_table and result.stats:
            _print_head_table(result, out)
        _draw(show, result, fig)
        return failed


def _say_generated(texts: list[str] | None, err: Any) -> None:
    """What a capture made with --generate generated, a line per batch entry on stderr."""
    if texts is None:
        return
    from attnviz.tokentext import answer_lines

    for line in answer_lines(texts):
        err.print(line, markup=False)


def check_overlay(path: str | None, images: Any) -> None:
    """--overlay-png draws over patches: it needs --image (or --patch-grid, --image-tokens) (exit 2)."""
    if path is not None and not images.wanted:
        from attnviz.errors import UsageError

        raise UsageError(f"--overlay-png {path}: give the picture with --image (and its patches with --patch-grid or "
                         "--patch-size when the grid is not square).")


def save_json(text: str, staged: Any) -> None:
    """The JSON document in its file (--json-file)."""
    if "--json-file" in staged:
        from attnviz.io import save_text

        save_text(staged["--json-file"], text + "\n")


def _grid_meanwhile(opened: Any, staged: Any, fig: FigureOptions, options: InspectOptions, notes: list[str],
                    name: str | None) -> Any:
    """--png's picture needs the weights, not their statistics: it is drawn (and a PNG encoded) while the
    statistics are summed (``inspecting.analyse``'s ``meanwhile``). Not when --check-finite asked to
    locate NaN and infinity (nothing is drawn then)."""
    if "--png" not in staged or options.checks.check_finite:
        return None
    target = staged["--png"]

    def draw() -> Any:
        from attnviz.render.figures import opened_grid_figure, tokens_note
        from attnviz.render.heatmap import figure_file

        figure = opened_grid_figure(opened, fig)
        notes.extend(note for note in [tokens_note(figure, name or "--png")] if note)
        return figure_file(figure, target.suffix)

    return draw


def _save_files(result: Any, staged: Any, fig: FigureOptions, out: InspectOutputs,
                notes: list[str] | None = None) -> dict[str, str]:
    """Every figure and the HTML report asked for, written to their staged paths."""
    from attnviz.render import figures

    written: dict[str, str] = {}
    if not staged.staged:
        return written
    from attnviz.render.heatmap import save_figure

    for flag, name, make in (("--png", "png", figures.inspect_grid_figure),
                               ("--map-png", "map_png", figures.inspect_map_figure),
                               ("--stats-png", "stats_png", lambda r, f: figures.inspect_stat_figure(r, f, out.stat)),
                               ("--received-png", "received_png", figures.inspect_received_figure)):
        if flag in staged and (name != "received_png" or result.received is not None):
            if flag == "--png" and result.meanwhile is not None:  # drawn while the statistics were summed
                result.meanwhile(staged[flag])
            else:
                figure = make(result, fig)
                note = figures.tokens_note(figure, out.png or "--png") if flag == "--png" else None
                if note and notes is not None:
                    notes.append(note)
                save_figure(figure, staged[flag])
            written[name] = getattr(out, name)
    if "--overlay-png" in staged:
        from attnviz.render.overlay import inspect_overlay_figure

        save_figure(inspect_overlay_figure(result, fig), staged["--overlay-png"])
        written["overlay_png"] = out.overlay_png or ""
    if "--html" in staged:
        from attnviz.io import save_text
        from attnviz.render.html import inspect_html

        save_text(staged["--html"], inspect_html(result, fig, out.precision))
        written["html"] = out.html or ""
    return written


def _draw(show: ShowOptions, result: Any, fig: FigureOptions) -> None:
    """--show: the picture of --png in the terminal."""
    from attnviz.cli.show import draw
    from attnviz.render.figures import inspect_grid_figure
    from attnviz.render.terminal import inspect_picture

    draw(show, lambda: inspect_grid_figure(result, fig), lambda plain, height: inspect_picture(result, fig, plain,
                                                                                                 height))


def _print_head_table(result: Any, out: InspectOutputs) -> None:
    """--no-table with an order asked for (--sort, --reverse, --top): the head statistics table, alone."""
    from attnviz.inspection.weights import RENORMALISED
    from attnviz.render.summaries import head_stats_table

    renormalised = result.opened.weights.renormalised
    out_console().print(head_stats_table(result.stats, sort=out.sort, reverse=out.reverse, top=out.top,
                                         padded=result.padded, of=RENORMALISED if renormalised else None,
                                         keys=result.opened.weights.shape[-1]), crop=False)


def _print_tables(result: Any, out: InspectOutputs) -> None:
    from attnviz.render.summaries import MAP_TABLE_ROWS, inspect_tables

    console = out_console()
    asked = out.max_rows is not None  # --max-rows given: the map's tables, however long the map
    for table in inspect_tables(result, out.precision, (out.max_rows if asked else MAP_TABLE_ROWS) or None,
                                out.max_cols, sort=out.sort, reverse=out.reverse, top=out.top,
                                map_tables=True if asked else None):
        console.print(table, crop=False)

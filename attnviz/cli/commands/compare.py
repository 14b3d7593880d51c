"""``attnviz compare``: two sets of weights of one shape. The command parses its options into typed
dataclasses, runs ``attnviz.inspection.compare`` and prints and saves what it gets back.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Annotated, Any

import typer

from attnviz.choices import INPUT_FORMATS
from attnviz.cli.checked import report_checks, run_checked
from attnviz.cli.commands.inspect import save_json
from attnviz.cli.options import FIGURE, OUTPUT, TableOptions, build, check_html_path, check_png_path, parameters
from attnviz.fields import option
from attnviz.inspection.options import CompareOptions
from attnviz.render.options import FigureOptions, ShowOptions
from attnviz.streams import err_console, out_console, stdout


@dataclass
class CompareOutputs(TableOptions):
    """What compare prints and saves."""

    png: str | None = option(None, "heatmap of A - B (diverging colours, one symmetric scale) for every layer and "
                             "head of the batch entry; .png, .svg or .pdf", panel=OUTPUT, metavar="FILE")
    html: str | None = option(None, "write an interactive report: one offline HTML file (every map of the batch "
                              "entry as thumbnails, hover, head view, sortable statistics)", panel=OUTPUT,
                              metavar="FILE.html")
    max_panels: int = option(16, "--png draws the N maps with the largest max |A - B|, largest first (0: all)",
                             panel=FIGURE, min=0, metavar="N")


#: A - B is drawn on a scale symmetric around 0: --vmax and --norm say so, and there is no --vmin
FIGURE_OVERRIDES = {
    "vmax": {"help": "draw A - B from -V to V (default the largest |A - B|); larger differences take the end colours"},
    "norm": {"help": "linear; log: symmetric log scale (linear near 0, within 4 decades of V or the smallest "
                     "|A - B|); power:G: sign(x) |x|^G, e.g. power:0.5"},
}
ORDER = ("layout", "generation", "generation_a", "generation_b",
         "labels", "q_labels", "k_labels", "merge_subwords", "subword_style",
         "atol", "rtol", "worst", "layer", "head", "batch", "mask", "key_padding_mask", "mask_convention",
         "mask_kind", "png", "html", "title", "cmap", "reduce", "vmax", "norm", "scale_skip_keys", "scale_per_panel",
         "layers", "heads", "reduce_heads", "max_panels", "show", "graphics", "precision", "json", "json_file",
         "no_table", "quiet")


def compare_command(**values: Any) -> None:
    """Compare two sets of attention weights: differences, Jensen-Shannon divergence, argmax agreement."""
    options: CompareOptions = build(CompareOptions, values, a=values["a"], b=values["b"])
    fig: FigureOptions = build(FigureOptions, values)
    out: CompareOutputs = build(CompareOutputs, values)
    show: ShowOptions = build(ShowOptions, values)
    run_checked(lambda: compare_files(options, fig, out, show))


compare_command.__signature__ = inspect.Signature([  # type: ignore[attr-defined]
    inspect.Parameter("a", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=Annotated[str, typer.Argument(
        metavar="A", show_default=False,
        help=f"attention weights, as inspect reads them ({INPUT_FORMATS}; FILE:KEY, a glob over layers, a capture "
             "file)")]),
    inspect.Parameter("b", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=Annotated[str, typer.Argument(
        metavar="B", show_default=False, help="weights of the same shape, in any of those formats")]),
    *parameters(CompareOptions, FigureOptions, CompareOutputs, ShowOptions, order=ORDER, overrides=FIGURE_OVERRIDES,
                exclude=("vmin", "check_mask", "max_rows", "max_cols"))])


def compare_files(options: CompareOptions, fig: FigureOptions, out: CompareOutputs,
                  show: ShowOptions | None = None) -> bool:
    """Returns whether the tolerance check failed."""
    from attnviz.cli import show as shown
    from attnviz.inspection import compare
    from attnviz.inspection.kinds import compared_kinds
    from attnviz.io import check_outputs
    from attnviz.staging import staged_outputs

    found = compared_kinds(options.a, options.b)
    if any(f.summarised for f in found):
        return compare_summaries(found, options, out)
    check_png_path(out.png)
    check_html_path(out.html)
    fig.check(diverging=True)
    show = show or ShowOptions()
    show = shown.check(show, out.json)
    run = compare.prepare_compare(options)
    targets = check_outputs({"--png": out.png, "--json-file": out.json_file, "--html": out.html}, run.paths)
    err = err_console()
    files: dict[str, str] = {}
    text = None
    with staged_outputs(targets) as staged:  # all files or none (attnviz.staging.StagedOutputs)
        result = compare.run_compare(run)
        failed = report_checks(result.checks, err) if result.checks else False
        for warning in result.warnings:
            err.print(f"warning: {warning}", markup=False, style="yellow")
        if not out.quiet:
            for note in run.notes:
                err.print(note, markup=False, style="dim")
        if run.masks.described and not out.quiet:
            padded = result.comparison.padded_rows
            left_out = f"; {padded} padded query rows left out" if padded else ""
            err.print(f"masks: {', '.join(run.masks.described)}{left_out}", markup=False, style="dim")
        if "--png" in staged:
            from attnviz.render.figures import compare_figure
            from attnviz.render.heatmap import save_figure

            save_figure(compare_figure(result, fig, out.max_panels), staged["--png"])
            files["png"] = out.png or ""
        if "--html" in staged:
            from attnviz.io import save_text
            from attnviz.render.html import compare_html

            save_text(staged["--html"], compare_html(result, fig, out.precision))
            files["html"] = out.html or ""
        if out.document:
            from attnviz.render.report import compare_document, to_json

            if out.json_file:
                files["json"] = out.json_file
            text = to_json(compare_document(run, result, files))
            save_json(text, staged)
        staged.commit()
    for what in ("png", "html"):
        if what in files and not out.quiet:
            err.print(f"saved {what} to {files[what]}", markup=False, style="dim")
    if out.json and text is not None:
        stdout().write(text + "\n")
    if out.tables:
        from attnviz.render.summaries import compare_tables

        console = out_console()
        for table in compare_tables(result, out.precision):
            console.print(table, crop=False)
    from attnviz.render.figures import compare_figure
    from attnviz.render.terminal import compare_picture

    shown.draw(show, lambda: compare_figure(result, fig, out.max_panels),
               lambda plain, height: compare_picture(result, fig, out.max_panels, plain, height))
    return failed


def compare_summaries(found: tuple[Any, Any], options: CompareOptions, out: CompareOutputs) -> bool:
    """Two summary captures (or ``--no-weights`` captures, summarised from their q and k;
    ``attnviz.inspection.kinds.compare_summary_files``): each head statistic of A and B and their difference, the
    largest difference of each per-row statistic; --atol checks them."""
    import json

    from attnviz.inspection.kinds import compare_summary_files
    from attnviz.io import check_outputs
    from attnviz.render import summary as drawn
    from attnviz.staging import staged_outputs

    compared = compare_summary_files(found[0], found[1], atol=options.atol, outputs={"png": out.png, "html": out.html})
    targets = check_outputs({"--json-file": out.json_file}, [])
    with staged_outputs(targets) as staged:
        text = json.dumps(drawn.compared_document(compared))
        save_json(text, staged)
        staged.commit()
    if out.json:
        stdout().write(text + "\n")
    elif out.tables:
        out_console().print(drawn.compared_table(compared), crop=False)
    if options.atol is not None:
        err_console().print(drawn.check_line(compared), markup=False, style="red" if compared.failed else "green")
    return compared.failed

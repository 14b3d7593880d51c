"""``attnviz rollout``: attention rollout, attention flow or gradient rollout across layers
(``attnviz.inspection.rollout`` and its ``METHODS``), printed and saved. NumPy only (and SciPy for
flow), no TensorFlow: weights a model saved, read as ``inspect`` reads them.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Annotated, Any

import typer

from attnviz.choices import INPUT_FORMATS
from attnviz.cli.checked import run_checked
from attnviz.cli.commands.capture import model_parameters
from attnviz.cli.options import OUTPUT, TableOptions, build, check_html_path, check_png_path, parameters
from attnviz.fields import option
from attnviz.inspection.options import RolloutOptions
from attnviz.render.options import FigureOptions, ShowOptions
from attnviz.streams import err_console, out_console, stdout


@dataclass
class RolloutOutputs(TableOptions):
    """What rollout prints and saves."""

    png: str | None = option(None, "a heatmap of the rollout (.png, .svg or .pdf)", panel=OUTPUT, metavar="FILE")
    overlay_png: str | None = option(None, "with --image: the rollout's query row (CLS) over the patches, divided by "
                                     "its maximum, blended over the picture (vit-explain's picture); .png, .svg or "
                                     ".pdf", panel=OUTPUT, metavar="FILE")
    html: str | None = option(None, "an offline HTML page of the rollout of every batch entry (and each layer's with "
                              "--all-layers): hover a cell to read it", panel=OUTPUT, metavar="FILE.html")


ORDER = ("layout", "generation", "weigh_by",
         "labels", "merge_subwords", "subword_style",
         "batch", "method", "grads", "heads", "residual", "discard_ratio", "start_layer", "all_layers", "mask",
         "key_padding_mask", "mask_convention", "mask_kind", "image", "patch_grid", "patch_size", "prefix_tokens",
         "image_tokens", "query",
         "upsample", "keep_mass", "png", "overlay_png", "html", "title", "cmap", "reduce", "vmin", "vmax", "norm",
         "show", "graphics", "precision", "max_rows", "max_cols", "json", "json_file", "no_table", "quiet")


def rollout_command(**values: Any) -> None:
    """Attention rollout across layers (Abnar & Zuidema 2020), attention flow, or gradient rollout.

    Per layer the heads are combined (--heads), the lowest entries dropped (--discard-ratio, but never
    the first token's own: vit-explain), the residual connection is added as
    A' = (1 - r) A + r I (--residual r), rows are renormalised, and the layers are multiplied from
    the first (or --start-layer) up: R = A'_last ... A'_first. Row i of R estimates how much of
    position i's representation after the last layer comes from each input token, if attention alone
    mixed tokens. It is a model of information flow from the attention weights only (no value
    vectors, MLPs or layer norms), not a gradient attribution. Padded tokens (--mask,
    --key-padding-mask) are left out and the rows renormalised among the real ones.

    --method flow (attention flow, the same paper) takes the same maps as capacities of a layered
    graph: row i holds the maximum flow from position i after the last layer to each input token,
    renormalised to sum to 1 (one max-flow problem per pair: seconds at 48 tokens, minutes or more at
    hundreds). --method grad (Chefer, Gur and Wolf 2021) needs the gradient of the explained score
    with respect to every layer's weights, from --grads or from a capture taken with --target (attnviz
    capture): R = I, then R = R + mean_h(clamp(grad * A, min=0)) R from the first layer (or
    --start-layer) up.

    --weigh-by value-norms (a capture) follows alpha * ||v W_O|| instead of the weights, each layer's heads
    averaged as they are (not renormalised one by one), with --method rollout or flow.

    With --image (a ViT's patches after --prefix-tokens, or --image-tokens) the result is also the
    query's row (CLS) over the patches, divided by its maximum (JSON overlay.rollout; --overlay-png).
    """
    from attnviz.cli.commands.capture import captured_input
    from attnviz.cli.errors import user_errors

    given = values.pop("weights")
    with user_errors(), captured_input([given] if given else [], values) as files:
        options: RolloutOptions = build(RolloutOptions, values, weights=files[0])
        fig: FigureOptions = build(FigureOptions, values)
        out: RolloutOutputs = build(RolloutOutputs, values)
        show: ShowOptions = build(ShowOptions, values)
        run_checked(lambda: rollout_file(options, fig, out, show))


rollout_command.__signature__ = inspect.Signature([  # type: ignore[attr-defined]
    inspect.Parameter("weights", inspect.Parameter.POSITIONAL_OR_KEYWORD, default=None, annotation=Annotated[
        str | None, typer.Argument(
        metavar="WEIGHTS", show_default=False,
        help="attention weights of every layer, as inspect reads them: [layers, batch, heads, L, L] "
             f"({INPUT_FORMATS}; a file of one array per layer, FILE:KEY with a glob over layers, a capture file)")]),
    *parameters(RolloutOptions, FigureOptions, RolloutOutputs, ShowOptions, order=ORDER,
                exclude=("check_mask", "scale_per_panel")),
    *model_parameters()])


def rollout_file(options: RolloutOptions, fig: FigureOptions, out: RolloutOutputs,
                 show: ShowOptions | None = None) -> bool:
    """Roll out, save and print; no check can fail (returns False)."""
    from attnviz.cli import show as shown
    from attnviz.cli.commands.inspect import check_overlay, save_json
    from attnviz.inspection.rollout import run_rollout
    from attnviz.io import check_outputs
    from attnviz.staging import staged_outputs

    check_png_path(out.png)
    check_png_path(out.overlay_png, "--overlay-png")
    check_html_path(out.html)
    check_overlay(out.overlay_png, options.images)
    fig.check()
    show = show or ShowOptions()
    show = shown.check(show, out.json)
    run = run_rollout(options)
    w = run.weights
    targets = check_outputs({"--png": out.png, "--overlay-png": out.overlay_png, "--json-file": out.json_file,
                             "--html": out.html}, run.paths)
    with staged_outputs(targets) as staged:
        files: dict[str, str] = {}
        if "--png" in staged:
            from attnviz.render.figures import rollout_figure
            from attnviz.render.heatmap import save_figure

            save_figure(rollout_figure(run, fig), staged["--png"])
            files["png"] = out.png or ""
        if "--overlay-png" in staged:
            from attnviz.render.heatmap import save_figure
            from attnviz.render.overlay import rollout_overlay_figure

            save_figure(rollout_overlay_figure(run, fig), staged["--overlay-png"])
            files["overlay_png"] = out.overlay_png or ""
        if "--html" in staged:
            from attnviz.io import save_text
            from attnviz.render.figures import rollout_html

            save_text(staged["--html"], rollout_html(run, fig))
            files["html"] = out.html or ""
        document = None
        if out.document:
            from attnviz.render.report import rollout_document, to_json

            if out.json_file:
                files["json"] = out.json_file
            document = to_json(rollout_document(run, files))
            save_json(document, staged)
        staged.commit()
    for text in run.warnings:
        err_console().print(f"warning: {text}", markup=False, style="yellow")
    if not out.quiet:
        err = err_console()
        err.print(f"{run.title}: {w.read_as('[layers, batch, heads, L, L]')}; {run.how}", markup=False, style="dim")
        if run.grads is not None:
            err.print(f"gradients: {run.grads.read_as('[layers, batch, heads, L, L]')}", markup=False, style="dim")
        if run.masks.described:
            err.print(f"masks: {', '.join(run.masks.described)}; padded tokens left out", markup=False, style="dim")
        for what, path in files.items():
            err.print(f"saved {what} to {path}", markup=False, style="dim")
    if out.json and document is not None:
        stdout().write(document + "\n")
    elif out.tables:
        from attnviz.render.summaries import rollout_table

        out_console().print(rollout_table(run, out.precision, out.max_rows or None, out.max_cols), crop=False)
    from attnviz.render.figures import rollout_figure
    from attnviz.render.terminal import rollout_picture

    shown.draw(show, lambda: rollout_figure(run, fig), lambda plain, height: rollout_picture(run, fig, plain, height))
    return False

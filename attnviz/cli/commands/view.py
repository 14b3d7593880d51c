"""``attnviz view``: an interactive viewer of saved attention weights in the terminal. The same inputs
and options as ``inspect`` (``InspectOptions``: layouts, globs, labels, masks, the layers and heads;
``FigureOptions``: the colours); the run is ``inspect``'s (``attnviz.inspection.inspecting``), the
application is ``attnviz.viewer`` (Textual, imported only here, when the command runs). A summary capture
(``capture --summary``; a ``--no-weights`` capture is summarised from its q and k, as inspect does) is viewed
through its pooled maps and head table (``attnviz.viewer.summary``).
"""

from __future__ import annotations

import inspect
from dataclasses import replace
from typing import Annotated, Any

import typer

from attnviz.choices import INPUT_FORMATS
from attnviz.cli.commands.capture import model_parameters
from attnviz.cli.errors import user_errors
from attnviz.cli.options import build, parameters
from attnviz.errors import UsageError
from attnviz.inspection.options import CheckOptions, ImageOptions, InspectOptions
from attnviz.render.options import FigureOptions
from attnviz.streams import err_console

#: inspect's checks are not the viewer's business; nor, yet, the picture a ViT's patches came from (--overlay-png)
LEFT_OUT = (*CheckOptions.__dataclass_fields__, *ImageOptions.__dataclass_fields__, "check_mask", "title",
            "scale_per_panel")
ORDER = ("layout", "generation", "weigh_by", "labels", "q_labels", "k_labels", "merge_subwords", "subword_style",
         "layer", "head", "batch", "mask", "key_padding_mask", "mask_convention", "mask_kind", "layers", "heads",
         "reduce_heads", "cmap", "reduce", "vmin", "vmax", "norm", "scale_skip_keys")


def view_command(**values: Any) -> None:
    """Walk every layer and head of attention weights in the terminal (arrows or h/j/k/l; b/B the batch entry;
    shift+arrows or H/J/K/L move the cursor; / finds a token; s sorts heads by a statistic; m: block means or
    maxima; r shows the rollout; ? lists the keys; q quits). A summary capture (capture --summary) shows each
    head's pooled map and the summary's head table."""
    from attnviz.cli.commands.capture import captured_input

    with user_errors():
        given = values.pop("weights")
        if values.get("model") is not None:
            need_terminal()  # before the model is captured (seconds), not after
        with captured_input([given] if given else [], values) as files:
            options: InspectOptions = build(InspectOptions, values, weights=files[0])
            fig: FigureOptions = build(FigureOptions, values)
            view(options, fig)


view_command.__signature__ = inspect.Signature([  # type: ignore[attr-defined]
    inspect.Parameter("weights", inspect.Parameter.POSITIONAL_OR_KEYWORD, default=None, annotation=Annotated[
        str | None, typer.Argument(
            metavar="WEIGHTS", show_default=False,
            help=f"attention weights, as inspect reads them ({INPUT_FORMATS}; FILE:KEY, a glob over layers, a capture "
                 "file, a summary capture)")]),
    *parameters(InspectOptions, FigureOptions, order=ORDER, exclude=LEFT_OUT),
    *model_parameters()])


def need_terminal() -> None:
    import sys

    if not (sys.stdin.isatty() and sys.stdout.isatty()):
        raise UsageError("attnviz view needs a terminal (standard input and output); use inspect --show in a "
                         "pipe or a script.")


def view(options: InspectOptions, fig: FigureOptions, *, run: bool = True) -> Any:
    """Read, analyse and open the viewer (returns the application unstarted when ``run`` is False: the
    tests drive it)."""

    from attnviz.inspection import inspecting
    from attnviz.inspection.kinds import kind_of

    fig.check()
    if run:
        need_terminal()
    found = kind_of(options.weights)
    if found.summary is not None:  # pooled maps and the head table instead of weights
        from attnviz.viewer.summary import SummaryViewerModel, summary_source

        source = summary_source(found.summary, options)
        from attnviz.viewer.app import ViewerApp

        app = ViewerApp(SummaryViewerModel(source, fig), source.heading())
        if run:
            app.run()
        return app
    options = replace(options, received=False, row_stats=False)
    opened = inspecting.prepare(options)
    result = inspecting.analyse(opened)
    if not result.finite:  # analyse raised for it unless --check-finite, which view does not take
        return None
    for text in result.warnings:
        err_console().print(f"warning: {text}", markup=False, style="yellow")
    from attnviz.viewer.app import ViewerApp
    from attnviz.viewer.model import ViewerModel

    model = ViewerModel(result, fig)
    w = opened.weights
    app = ViewerApp(model, f"attnviz view: {w.read_as()}")
    if run:
        app.run()
    return app

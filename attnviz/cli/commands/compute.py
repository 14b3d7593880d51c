"""The compute commands, one per registered variant (``attnviz.variants.REGISTRY``): the command's
signature is made from the variant's inputs and ``Params`` and the shared option dataclasses
(``RunOptions``, ``ParamOptions``, ``CaptureOptions``, ``OutputOptions``, ``FigureOptions``); a run
prepares (NumPy checks) and executes (TensorFlow) through ``attnviz.pipeline``, then prints the tables
and writes the files, all or nothing (``attnviz.staging``).
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated, Any

import typer

from attnviz.choices import INPUT_FORMATS
from attnviz.cli.errors import user_errors
from attnviz.cli.options import OutputOptions, check_save_params, parameters, parse_index
from attnviz.cli.show import check as show_check
from attnviz.cli.show import draw
from attnviz.errors import AttnvizError, ParamsError, shape_str
from attnviz.render.options import FigureOptions, ShowOptions
from attnviz.run_options import CaptureOptions, ParamOptions, RunOptions
from attnviz.staging import StagedOutputs, staged_outputs
from attnviz.streams import err_console, out_console, stdout
from attnviz.variants.base import Variant

if TYPE_CHECKING:  # the pipeline loads NumPy: imported when a command runs, not for --help
    from attnviz.pipeline import Outcome


def _variant_parameters(variant: Variant) -> list[inspect.Parameter]:
    params = []
    for n, spec in enumerate(variant.inputs):
        if n == 0:
            first = f"{spec.help} ({INPUT_FORMATS}; FILE:KEY for one array of a file of several)"
            annotation: Any = Annotated[str, typer.Argument(metavar=spec.name.upper(), help=first,
                                                            show_default=False)]
            params.append(inspect.Parameter(spec.name, inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                            annotation=annotation))
        else:
            annotation = Annotated[str | None, typer.Argument(metavar=spec.name.upper(), help=spec.help,
                                                                 show_default=False)]
            params.append(inspect.Parameter(spec.name, inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                            default=None, annotation=annotation))
    # numbers and choices are parsed and checked as the command line is read, with the bounds the field declares
    return [*params, *parameters(variant.params, panel=f"{variant.name} options")]


def make_command(variant: Variant) -> Callable[..., None]:
    """A Typer command function for a variant, with its signature built from the registry entry."""

    def command(**kwargs: Any) -> None:
        with user_errors():
            run_command(variant, kwargs)

    parameters_ = [*_variant_parameters(variant), *(parameters(ParamOptions) if variant.learned else []),
                   *(parameters(CaptureOptions) if variant.captured_qkv else []), *parameters(RunOptions),
                   *parameters(OutputOptions), *parameters(FigureOptions), *parameters(ShowOptions)]
    command.__signature__ = inspect.Signature(parameters_)  # type: ignore[attr-defined]
    command.__name__ = f"{variant.name}_command"
    command.__doc__ = f"{variant.summary}.\n\n{variant.formula}"
    return command


def _take(kwargs: dict[str, Any], cls: type) -> Any:
    return cls(**{f.name: kwargs.pop(f.name) for f in dataclasses.fields(cls) if f.metadata.get("cli") is not False})


def run_command(variant: Variant, kwargs: dict[str, Any]) -> None:
    from attnviz.io import check_outputs
    from attnviz.pipeline import execute, prepare
    from attnviz.render.figures import compute_figure
    from attnviz.render.terminal import compute_picture

    kwargs = dict(kwargs)
    specs = [kwargs.pop(spec.name) for spec in variant.inputs]
    run_options: RunOptions = _take(kwargs, RunOptions)
    param_options: ParamOptions = _take(kwargs, ParamOptions) if variant.learned else ParamOptions()
    capture: CaptureOptions | None = _take(kwargs, CaptureOptions) if variant.captured_qkv else None
    params = _take(kwargs, variant.params)
    out: OutputOptions = _take(kwargs, OutputOptions)
    fig: FigureOptions = _take(kwargs, FigureOptions)
    show: ShowOptions = _take(kwargs, ShowOptions)
    out.check()
    fig.check()
    show = show_check(show, out.json)
    check_save_params(param_options.save_params)

    try:
        prepared = prepare(variant, specs, run_options, params, param_options=param_options, capture=capture)
    except ParamsError as exc:  # a variant's check names the keys; the file is named here
        raise ParamsError(name_params_file(exc.message, param_options.params, params)) from None
    targets = check_outputs(
        {"--png": out.png, "--save-weights": out.save_weights, "--save-output": out.save_output,
         "--save-params": param_options.save_params, "--json-file": out.json_file, "--html": out.html},
        prepared.input_paths,
    )
    index = parse_index(out.index, prepared.weights_shape[:-2])
    err = err_console()
    info = not out.quiet

    # every output is written to a staged file next to its target, and all are put in place only
    # when every one was written: a failed run leaves no file behind (see StagedOutputs)
    with staged_outputs(targets) as staged:
        outcome = execute(prepared, staged.get("--save-weights"), fig.reduce)
        if info:
            config = prepared.captured.get("config")
            if config:
                err.print(config["summary"], markup=False, style="dim")
            for note in outcome.notes:
                err.print(note, markup=False, style="dim")
            learned = f", parameters from {prepared.learned_source}" if prepared.learned_source else ""
            err.print(f"{variant.name}: {outcome.device.name}, {run_options.dtype}, weights "
                      f"{shape_str(prepared.weights_shape)}{learned}", markup=False, style="dim")
        for warning in outcome.warnings:
            err.print(f"warning: {warning}", markup=False, style="yellow")

        files = write_files(outcome, staged, out, fig)
        text = None
        if out.json or out.json_file:
            from attnviz.io import save_text
            from attnviz.render.report import build_report, to_json

            if out.json_file:
                files["json"] = out.json_file
            text = to_json(build_report(outcome, files)) + "\n"
            if out.json_file:
                save_text(staged["--json-file"], text)
        staged.commit()
    if info:
        for what, path in files.items():
            err.print(f"saved {what} to {path}", markup=False, style="dim")
    if out.json and text is not None:
        stdout().write(text)
    if not (out.json or out.no_table or out.quiet):
        print_tables(outcome, index, out)
    draw(show, lambda: compute_figure(outcome, fig),
         lambda plain, height: compute_picture(outcome, fig, plain, height))


def name_params_file(message: str, params_file: str | None, params: Any) -> str:
    """A variant's check says ``parameters: ...`` of the arrays it was given; name their file."""
    source = params_file or getattr(params, "from_keras", None)
    if source and message.startswith("parameters: "):
        return f"{source}: " + message.removeprefix("parameters: ")
    return message


def write_files(outcome: Outcome, staged: StagedOutputs, out: OutputOptions, fig: FigureOptions) -> dict[str, str]:
    """Write every requested file to its staged path; returns {"png": path, ...} (the paths the
    user gave, for the JSON document and the "saved" lines)."""
    from attnviz import params as learned_params
    from attnviz.io import save_npy

    written: dict[str, str] = {}
    result = outcome.result
    streamed = outcome.streamed
    if "--save-output" in staged and result.output is None:
        raise AttnvizError(f"--save-output: {outcome.prepared.variant.name} has no output array.")
    if "--save-params" in staged:
        learned_params.save(staged["--save-params"], outcome.prepared.learned)
        written["params"] = str(staged.targets["--save-params"])
    if "--save-weights" in staged:
        if streamed is None:  # a blockwise run wrote them while computing
            save_npy(staged["--save-weights"], result.weights)
        written["weights"] = out.save_weights or ""
    if "--save-output" in staged and result.output is not None:
        save_npy(staged["--save-output"], result.output)
        written["output"] = out.save_output or ""
    if "--png" in staged:
        from attnviz.render.figures import compute_figure
        from attnviz.render.heatmap import save_figure

        save_figure(compute_figure(outcome, fig), staged["--png"])
        written["png"] = out.png or ""
    if "--html" in staged:
        from attnviz.io import save_text
        from attnviz.render.html import compute_report

        index = parse_index(out.index, outcome.prepared.weights_shape[:-2])
        save_text(staged["--html"], compute_report(outcome, title=fig.title, cmap=fig.cmap, reduce=fig.reduce,
                                                   index=index, precision=out.precision, vmin=fig.vmin,
                                                   vmax=fig.vmax, norm=fig.norm))
        written["html"] = out.html or ""
    return written


def print_tables(outcome: Outcome, index: tuple[int, ...], out: OutputOptions) -> None:
    from attnviz.render.summaries import compute_tables

    console = out_console()
    for table in compute_tables(outcome, index, out.precision, out.max_rows or None, out.max_cols):
        console.print(table, crop=False)

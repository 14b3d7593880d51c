"""The ``attnviz`` command line: one command per registered variant, plus ``variants``.

Results go to stdout (tables, or JSON with ``--json``); everything else (device, saved files,
warnings, errors) to stderr. Errors meant for users end the run with a one- or two-line message and
exit code 1 (bad data, run-time failure) or 2 (bad usage); nothing reaches the user as a traceback.
"""

from __future__ import annotations

import dataclasses
import inspect
import os
import sys
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Annotated, Any, Literal, get_type_hints

import typer
from rich.console import Console
from rich.table import Table
from typer.core import TyperGroup

from attnviz import __version__
from attnviz.cli.completion import SHELL_CHOICES
from attnviz.cli.options import (
    CAPTURE_OPTIONS,
    FIGURE_OPTIONS,
    OUTPUT_OPTIONS,
    PARAM_OPTIONS,
    RUN_OPTIONS,
    OutputOptions,
    StagedOutputs,
    check_save_params,
    checked_option,
    error_line,
    parse_index,
    staged_outputs,
    typed,
    usage_message,
)
from attnviz.cli.streams import err_console, out_console, silence, stderr, stdout
from attnviz.errors import AttnvizError, ParamsError, shape_str
from attnviz.variants import REGISTRY
from attnviz.variants._base import Variant

# NumPy's floating-point RuntimeWarnings ("invalid value encountered in cast") would reach users' stderr
# as Python warnings; attnviz checks non-finite values itself and says what they mean. Process-wide, as
# batch runs jobs in threads (warnings.catch_warnings is not thread-safe).
warnings.filterwarnings("ignore", message=r"(invalid value|overflow|divide by zero|underflow) encountered",
                        category=RuntimeWarning)

if TYPE_CHECKING:  # the pipeline loads NumPy: imported when a command runs, not for --help
    from attnviz.pipeline import Outcome


class AttnvizGroup(TyperGroup):
    """The command group: usage errors (unknown option or command, a bad or missing value, a
    missing argument) of any command end in attnviz's one line on stderr and exit 2, instead of
    Click's usage block. ``attnviz`` alone is one of them: a line naming ``attnviz --help``."""

    def make_context(self, info_name: str | None, args: list[str], parent: Any = None, **extra: Any) -> Any:
        if not extra.get("resilient_parsing"):  # a completion request completes the shell's name instead
            args = shell_optional(args)
        with usage_errors():
            return super().make_context(info_name, args, parent, **extra)

    def invoke(self, ctx: Any) -> Any:
        with usage_errors():
            return super().invoke(ctx)

    def _main_shell_completion(self, ctx_args: Any, prog_name: str, complete_var: str | None = None) -> None:
        from attnviz.cli.completion import handle_request  # see there: files, both spellings, in process

        handle_request(self, ctx_args, prog_name, complete_var)


def shell_optional(args: list[str]) -> list[str]:
    """``--show-completion`` and ``--install-completion`` (before the command) without a shell's name
    take ``auto``: the shell is found out (``attnviz.cli.completion``)."""
    args = list(args)
    for i, arg in enumerate(args):
        if not arg.startswith("-"):
            break
        if arg in ("--show-completion", "--install-completion") and (i + 1 == len(args) or args[i + 1].startswith("-")):
            args.insert(i + 1, "auto")
            break
    return args


class AttnvizTyper(typer.Typer):
    """The app: every command's class is ``AttnvizCommand`` unless it says otherwise (help in sections,
    the usage line as typed: ``attnviz.cli.help``)."""

    def command(self, *args: Any, cls: Any = None, **kwargs: Any) -> Any:
        from attnviz.cli.help import AttnvizCommand

        return super().command(*args, cls=cls or AttnvizCommand, **kwargs)


@contextmanager
def usage_errors() -> Iterator[None]:
    from typer._click.exceptions import ClickException, NoArgsIsHelpError  # Typer vendors Click

    try:
        yield
    except NoArgsIsHelpError:
        raise
    except ClickException as exc:
        stderr().write(error_line(usage_message(exc)))
        raise typer.Exit(exc.exit_code) from None
    except BrokenPipeError:  # help or --version into `| head`: a reader that went away is no error
        silence(sys.stdout)
        raise typer.Exit(0) from None


app = AttnvizTyper(
    name="attnviz",
    cls=AttnvizGroup,
    help="Compute, inspect and visualise attention from the command line: tables, statistics, "
    "heatmap PNGs and JSON.",
    no_args_is_help=False,  # `attnviz` alone: one usage line naming --help (exit 2), not 40 lines of help
    add_completion=False,  # attnviz's own --install-completion/--show-completion [SHELL] (attnviz.cli.completion)
    rich_markup_mode=None,  # plain help: fast (no rich.markdown import) and brackets print as written
    pretty_exceptions_enable=False,
)


def _stderr() -> Console:
    return err_console()


def _completion(what: str, value: str | None) -> None:
    from attnviz.cli import completion

    (completion.install_callback if what == "install" else completion.show_callback)(value)


def _shells(incomplete: str) -> list[str]:  # TAB after --show-completion / --install-completion
    return [name for name in SHELL_CHOICES if name.startswith(incomplete)]


def _version(value: bool) -> None:
    from attnviz.cli.completion import completing

    if value and not completing():  # TAB after --version: complete, print no version into the answers
        typer.echo(f"attnviz {__version__}")
        raise typer.Exit()


@app.callback()
def main(
    version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True,
                                          help="print the version and exit")] = False,
    no_server: Annotated[bool, typer.Option("--no-server", help="run in this process, not on a warm worker "
                                                                "(attnviz serve; also ATTNVIZ_NO_SERVER=1)")] = False,
    install_completion: Annotated[str | None, checked_option(
        Literal[SHELL_CHOICES], "--install-completion", metavar="[SHELL]", is_eager=True,  # type: ignore[misc]
        expose_value=False, callback=lambda value: _completion("install", value), autocompletion=_shells,
        help="install shell completion (commands, options, choices, files) for SHELL, or for the shell this "
             "runs in; it takes effect in a new shell")] = None,
    show_completion: Annotated[str | None, checked_option(
        Literal[SHELL_CHOICES], "--show-completion", metavar="[SHELL]", is_eager=True,  # type: ignore[misc]
        expose_value=False, callback=lambda value: _completion("show", value), autocompletion=_shells,
        help="print the completion script of SHELL (bash, zsh, fish, powershell), to install it by hand")] = None,
) -> None:
    """Compute, inspect and visualise attention from the command line.

    One command per attention type; `attnviz variants` lists them.
    """


@contextmanager
def user_errors() -> Iterator[None]:
    """Turn errors meant for users into a message on stderr and the exit code; hide tracebacks of
    unexpected errors too unless ATTNVIZ_DEBUG is set."""
    try:
        yield
    except AttnvizError as exc:
        stderr().write(error_line(exc.message))
        raise typer.Exit(exc.exit_code) from None
    except KeyboardInterrupt:
        _stderr().print("attnviz: interrupted", markup=False)
        raise typer.Exit(130) from None
    except (typer.Exit, typer.Abort):
        raise
    except BrokenPipeError:  # a write past attnviz.cli.streams' guards: the output ends, not as an error
        silence(sys.stdout)
        raise typer.Exit(0) from None
    except Exception as exc:  # a bug: say so briefly, keep the traceback for those who ask
        if os.environ.get("ATTNVIZ_DEBUG"):
            raise
        stderr().write(error_line(f"{type(exc).__name__}: {exc}", "internal error")
                       + "This is a bug; rerun with ATTNVIZ_DEBUG=1 for the traceback and please report it.\n")
        raise typer.Exit(1) from None


@app.command("variants")
def variants_command(
    json_out: Annotated[bool, typer.Option("--json", help="print the list as JSON")] = False,
) -> None:
    """List every attention type attnviz computes, with its formula."""
    if json_out:
        import json

        doc = [{"name": v.name, "summary": v.summary, "formula": v.formula,
                "inputs": [i.name for i in v.inputs]} for v in REGISTRY.values()]
        stdout().write(json.dumps(doc, indent=2) + "\n")
        return
    table = Table(title="attention variants", pad_edge=False)  # rich wraps it to the width; long words fold
    table.add_column("command", style="bold", no_wrap=True)
    table.add_column("inputs")
    table.add_column("formula", overflow="fold")
    table.add_column("what it is", overflow="fold")
    for v in REGISTRY.values():
        table.add_row(v.name, " ".join(i.name.upper() for i in v.inputs), v.formula, v.summary)
    out_console().print(table)


# ----------------------------------------------------------------------------------------------
# Compute commands, one per registry entry


def _variant_parameters(variant: Variant) -> list[inspect.Parameter]:
    params = []
    for n, spec in enumerate(variant.inputs):
        if n == 0:
            annotation: Any = Annotated[str, typer.Argument(metavar=spec.name.upper(), help=spec.help,
                                                            show_default=False)]
            params.append(inspect.Parameter(spec.name, inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                            annotation=annotation))
        else:
            annotation = Annotated[str | None, typer.Argument(metavar=spec.name.upper(), help=spec.help,
                                                                 show_default=False)]
            params.append(inspect.Parameter(spec.name, inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                            default=None, annotation=annotation))
    hints = get_type_hints(variant.params)
    for f in dataclasses.fields(variant.params):
        if f.metadata.get("cli") is False:  # set by the variant itself (e.g. an array read in check)
            continue
        flag = f.metadata.get("flag", "--" + f.name.replace("_", "-"))
        # numbers and choices are parsed and checked here, with the bounds the field declares
        annotation = typed(hints[f.name], flag, min=f.metadata.get("min"), max=f.metadata.get("max"),
                           above=f.metadata.get("above"), help=f.metadata.get("help", ""),
                           metavar=f.metadata.get("metavar"), rich_help_panel=f"{variant.name} options")
        params.append(inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=f.default,
                                        annotation=annotation))
    return params


def make_command(variant: Variant) -> Callable[..., None]:
    """A Typer command function for a variant, with its signature built from the registry entry."""

    def command(**kwargs: Any) -> None:
        with user_errors():
            run_command(variant, kwargs)

    parameters = [*_variant_parameters(variant), *(PARAM_OPTIONS if variant.learned else []),
                  *(CAPTURE_OPTIONS if variant.captured_qkv else []), *RUN_OPTIONS,
                  *OUTPUT_OPTIONS, *FIGURE_OPTIONS]
    command.__signature__ = inspect.Signature(parameters)  # type: ignore[attr-defined]
    command.__name__ = f"{variant.name}_command"
    command.__doc__ = f"{variant.summary}.\n\n{variant.formula}"
    return command


def _take(kwargs: dict[str, Any], cls: type) -> Any:
    return cls(**{f.name: kwargs.pop(f.name) for f in dataclasses.fields(cls) if f.metadata.get("cli") is not False})


def run_command(variant: Variant, kwargs: dict[str, Any]) -> None:
    from attnviz.captured import CaptureOptions
    from attnviz.io import check_outputs
    from attnviz.pipeline import ParamOptions, RunOptions, execute, prepare

    kwargs = dict(kwargs)
    specs = [kwargs.pop(spec.name) for spec in variant.inputs]
    run_options: RunOptions = _take(kwargs, RunOptions)
    param_options: ParamOptions = _take(kwargs, ParamOptions) if variant.learned else ParamOptions()
    capture: CaptureOptions | None = _take(kwargs, CaptureOptions) if variant.captured_qkv else None
    params = _take(kwargs, variant.params)
    out: OutputOptions = _take(kwargs, OutputOptions)
    out.check()
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
    err = _stderr()
    info = not out.quiet

    # every output is written to a staged file next to its target, and all are put in place only
    # when every one was written: a failed run leaves no file behind (see StagedOutputs)
    with staged_outputs(targets) as staged:
        outcome = execute(prepared, staged.get("--save-weights"), out.reduce)
        if info:
            for note in outcome.notes:
                err.print(note, markup=False, style="dim")
            learned = f", parameters from {prepared.learned_source}" if prepared.learned_source else ""
            err.print(f"{variant.name}: {outcome.device.name}, {run_options.dtype}, weights "
                      f"{shape_str(prepared.weights_shape)}{learned}", markup=False, style="dim")
        for warning in outcome.warnings:
            err.print(f"warning: {warning}", markup=False, style="yellow")

        files = write_files(outcome, staged, out)
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


def name_params_file(message: str, params_file: str | None, params: Any) -> str:
    """A variant's check says ``parameters: ...`` of the arrays it was given; name their file."""
    source = params_file or getattr(params, "from_keras", None)
    if source and message.startswith("parameters: "):
        return f"{source}: " + message.removeprefix("parameters: ")
    return message


def write_files(outcome: Outcome, staged: StagedOutputs, out: OutputOptions) -> dict[str, str]:
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
        from attnviz.render.heatmap import save_figure

        save_figure(png_figure(outcome, out), staged["--png"])
        written["png"] = out.png or ""
    if "--html" in staged:
        from attnviz.io import save_text
        from attnviz.render.html import compute_report

        index = parse_index(out.index, outcome.prepared.weights_shape[:-2])
        save_text(staged["--html"], compute_report(outcome, title=out.title, cmap=out.cmap, reduce=out.reduce,
                                                   index=index, precision=out.precision, vmin=out.vmin,
                                                   vmax=out.vmax, norm=out.norm))
        written["html"] = out.html or ""
    return written


def png_figure(outcome: Outcome, out: OutputOptions) -> Any:
    """The heatmap of a run: many maps of one shape (``MOSAIC_PANELS`` or more slices of the weights,
    no further maps to draw) as one mosaic picture, rows and columns named by the leading axes;
    otherwise one panel per map (and per further map a variant shows)."""
    import numpy as np

    from attnviz.cli.options import figure_scale
    from attnviz.render.heatmap import Panel, heatmap_figure, slice_panels
    from attnviz.render.mosaic import MOSAIC_PANELS, slices_mosaic
    from attnviz.render.table import slice_label

    result, streamed, prep = outcome.result, outcome.streamed, outcome.prepared
    scale = figure_scale(out.vmin, out.vmax, out.norm, out.scale_per_panel)
    drawn = [v for v in result.views if v.png and streamed is None]
    names = prep.lead_names
    title = out.title or f"{prep.variant.name} attention weights {shape_str(prep.weights_shape)}"
    lead, (lq, lk) = prep.weights_shape[:-2], prep.weights_shape[-2:]
    count = int(np.prod(lead)) if lead else 1
    if count >= MOSAIC_PANELS and not drawn:
        if streamed is None:
            return slices_mosaic(result.weights, title=title, names=names, keep=prep.mask.keep, cmap=out.cmap,
                                 reduce=out.reduce, scale=scale)
        if len(streamed.grids) == count:  # a blockwise run aggregated every slice while computing
            return slices_mosaic(None, title=title, names=names, grids=streamed.grids, lead=tuple(lead),
                                 full_shape=(lq, lk), blocks=streamed.grid_blocks, cmap=out.cmap, reduce=out.reduce,
                                 scale=scale)
    if streamed is not None:
        lead, (lq, lk) = streamed.weights_shape[:-2], streamed.weights_shape[-2:]
        slices = list(np.ndindex(*lead)) if lead else [()]
        panels = [Panel(slice_label(s, names) if lead else "", grid, full_shape=(lq, lk),
                        blocks=streamed.grid_blocks) for s, grid in zip(slices, streamed.grids)]
    else:
        panels = slice_panels(result.weights, prep.mask.keep, prep.variant.weights_title if drawn else "", names)
    for view in drawn:
        if view.axis == "both":
            panels += slice_panels(result.maps[view.name], prep.mask.keep, view.title, names)
        else:  # a vector: a one-column strip along the queries, or a one-row strip along the keys
            data = result.maps[view.name]
            strip = data[..., :, None] if view.axis == "q" else data[..., None, :]
            for panel in slice_panels(strip, None, view.title, names):
                if view.axis == "q":
                    panel.k_labels, panel.xlabel = [""], ""
                else:
                    panel.q_labels, panel.ylabel = [""], ""
                panels.append(panel)
    return heatmap_figure(panels, title=title, q_labels=prep.q_labels, k_labels=prep.k_labels, cmap=out.cmap,
                          reduce=out.reduce, ylabel=prep.variant.axis_names[0], xlabel=prep.variant.axis_names[1],
                          scale=scale)


def print_tables(outcome: Outcome, index: tuple[int, ...], out: OutputOptions) -> None:
    from attnviz.render.table import (
        slice_label,
        slice_summary_table,
        stats_table,
        vector_table,
        weights_table,
    )

    prep, result, streamed = outcome.prepared, outcome.result, outcome.streamed
    console = out_console()
    shape = prep.weights_shape
    keep = prep.mask.full_keep(shape)
    keep2d = keep[index] if keep is not None else None
    lead = shape[:-2]
    names = prep.lead_names
    shown = slice_label(index, names)
    where = f", {shown} of leading dims {list(lead)} (--index picks another)" if lead else ""
    max_rows = out.max_rows or None
    max_cols = out.max_cols  # None: the key columns that fit the console; 0: all; N: at most N (render.table)
    weights = result.weights[index] if streamed is None else streamed.preview[index]
    row_ids = None if streamed is None else streamed.preview_ids
    if streamed is not None and max_rows is None:
        max_rows = len(row_ids or [])

    def show_map(data: Any, title: str, ids: list[int] | None = None) -> None:
        console.print(weights_table(data, q_labels=prep.q_labels, k_labels=prep.k_labels, keep=keep2d,
                                    precision=out.precision, max_rows=max_rows, max_cols=max_cols,
                                    title=title, axis_names=prep.variant.axis_names, row_ids=ids,
                                    total_rows=shape[-2]), crop=False)

    name = prep.variant.name
    primary = "" if prep.variant.weights_title == "weights" else f": {prep.variant.weights_title}"
    show_map(weights, f"{name} attention weights {shape_str(shape)}{primary}{where}", row_ids)
    for view in result.views:
        data = result.maps[view.name][index]
        if view.axis == "both":
            show_map(data, f"{view.title}{where}")
            if view.name in outcome.map_stats:
                console.print(stats_table(outcome.map_stats[view.name].select(index), q_labels=prep.q_labels,
                                          k_labels=prep.k_labels, precision=out.precision, max_rows=max_rows,
                                          row_name=prep.variant.axis_names[0],
                                          title=f"per-query statistics of {view.title}"), crop=False)
        else:
            labels = prep.q_labels if view.axis == "q" else prep.k_labels
            console.print(vector_table(data, labels=labels, precision=out.precision, max_cols=max_cols,
                                       title=f"{view.title}{where}"), crop=False)
    console.print(stats_table(outcome.stats.select(index), q_labels=prep.q_labels, k_labels=prep.k_labels,
                              precision=out.precision, max_rows=max_rows, row_name=prep.variant.axis_names[0],
                              title="per-query statistics" + (f", {shown}" if lead else "")),
                  crop=False)
    if lead:
        console.print(slice_summary_table(outcome.stats, precision=out.precision, max_rows=max_rows, names=names),
                      crop=False)


for _variant in REGISTRY.values():
    _command = make_command(_variant)
    app.command(_variant.name, help=_command.__doc__, short_help=_variant.summary)(_command)

from attnviz.cli.batch import batch_command  # noqa: E402
from attnviz.cli.inspect_commands import compare_command, inspect_command  # noqa: E402 - after the app exists

app.command("inspect")(inspect_command)
app.command("compare")(compare_command)
app.command("batch")(batch_command)

from attnviz.cli.serve import serve_command  # noqa: E402

app.command("serve")(serve_command)

from attnviz.cli.analysis_commands import repeat_test_command, rollout_command  # noqa: E402

app.command("rollout")(rollout_command)
app.command("repeat-test")(repeat_test_command)

"""``attnviz ablate MODEL_DIR``: a model run on texts as it is and with chosen heads restricted (streaming, a
window, removed), what changed printed (``attnviz.ablation``); or, with ``--rank``, every head ranked by what
restricting it alone costs and the policies of a share of heads checked on held-out needles, exported as the
files serving stacks read."""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Annotated, Any

import typer

from attnviz.ablation.options import AblateOptions
from attnviz.cli.options import OUTPUT, build, check_png_path, parameters
from attnviz.fields import option
from attnviz.streams import err_console, out_console, stdout


@dataclass
class AblateOutputs:
    """What ablate prints and saves."""

    png: str | None = option(None, "--rank: the layer x head picture of the costs (.png, .svg or .pdf)",
                             panel=OUTPUT, metavar="FILE")
    export_duo: str | None = option(None, "--rank: write the policy as DuoAttention's pattern folder "
                                    "(full_attention_heads.tsv and config.json)", panel=OUTPUT, metavar="DIR")
    export_minference: str | None = option(None, "--rank: write the policy as MInference's per-layer pattern file "
                                           "(vLLM's sparse_attention_config, SGLang)", panel=OUTPUT,
                                           metavar="FILE.json")
    export_retrieval: str | None = option(None, "--rank: write the heads' retrieval scores as Wu et al.'s score "
                                          "file ({\"LAYER-HEAD\": [scores]}, as HeadKV reads it)", panel=OUTPUT,
                                          metavar="FILE.json")
    precision: int = option(3, "digits after the point in tables", panel=OUTPUT, min=0, max=12)
    max_rows: int = option(40, "--rank: show at most this many heads, eliding the middle (0: all)", panel=OUTPUT,
                           min=0)
    json: bool = option(False, "print the JSON document on stdout instead of tables", panel=OUTPUT)
    json_file: str | None = option(None, "write the JSON document to this file", panel=OUTPUT, metavar="FILE.json")
    quiet: bool = option(False, "print no tables and no informational lines", panel=OUTPUT, short="-q")


ORDER = ("stream", "window", "zero", "mean", "kv_heads", "sink", "recent", "answer", "generate", "kl_rows",
         "rank", "restrict", "calibration", "needles", "tokens", "share", "random", "seed", "statistics",
         "batch", "device", "dtype",
         "png", "export_duo", "export_minference", "export_retrieval", "precision", "max_rows", "json", "json_file",
         "quiet")


def ablate_command(model: str, text: list[str] | None = None, text_file: str | None = None, **values: Any) -> None:
    """Run a model as it is and with chosen heads restricted, and say what changed.

    Streaming heads (--stream L:H,...) see only the first --sink and the last --recent keys, as DuoAttention's
    streaming heads and their KV cache; --window heads the last --recent keys; --zero and --mean heads have their
    output removed or replaced by its mean. With --kv-heads the heads named are key-value heads (each restricts
    the query heads that share it). Both runs are compared on each text: the log-probability of --answer
    (teacher-forced), the greedy answers (--generate N) and the KL divergence of the next-token distributions.

    --rank restricts every head alone in turn on a calibration needle suite (a code hidden in public-domain
    prose, the codes and depths chosen by --seed), ranks them by the cost, and checks the policy that restricts
    the --share of heads that cost least against random policies of the same share on held-out needles; the
    exports write that policy and the scores for DuoAttention, MInference (vLLM, SGLang) and HeadKV.
    """
    from attnviz.cli.errors import user_errors

    with user_errors():
        options: AblateOptions = build(AblateOptions, values, model=model, text=list(text or []))
        out: AblateOutputs = build(AblateOutputs, values)
        if text_file is not None and not options.rank:
            options.text.append(text_file)  # read with the texts below; named here for the checks
        options.check()
        if text_file is not None and options.rank:
            from attnviz.errors import UsageError

            raise UsageError("--rank runs its own needle suite; drop --text-file.")
        _check_outputs(options, out)
        if not options.rank:
            from attnviz.capturing.folder import read_texts

            options.text = read_texts(text or [], text_file)
            _compare(options, out)
        else:
            _rank(options, out)


def _check_outputs(options: AblateOptions, out: AblateOutputs) -> None:
    from attnviz.errors import UsageError

    check_png_path(out.png)
    if not options.rank:
        for flag, value in (("--png", out.png), ("--export-duo", out.export_duo),
                            ("--export-minference", out.export_minference),
                            ("--export-retrieval", out.export_retrieval)):
            if value is not None:
                raise UsageError(f"{flag} goes with --rank (the ranking's picture and policy).")
    if out.export_retrieval is not None and not options.statistics:
        raise UsageError("--export-retrieval writes the retrieval scores --statistics measures; drop "
                         "--no-statistics.")


def _progress(quiet: bool) -> Any:
    """A progress bar on stderr (a terminal, without --quiet), one task per stage; None otherwise."""
    err = err_console()
    if quiet or not err.is_terminal:
        return None, None
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                   TimeRemainingColumn(), console=err, transient=True)
    tasks: dict[str, Any] = {}

    def told(what: str, done: int, total: int) -> None:
        if what not in tasks:
            if not tasks:
                bar.start()
            tasks[what] = bar.add_task(what, total=total)
        bar.update(tasks[what], completed=done, total=total)

    return bar, told


def _compare(options: AblateOptions, out: AblateOutputs) -> None:
    import json

    from attnviz.ablation.running import compare_run
    from attnviz.io import check_outputs
    from attnviz.render.ablation import comparison_answers, comparison_document, comparison_table
    from attnviz.staging import staged_outputs

    targets = check_outputs({"--json-file": out.json_file}, [])
    bar, told = _progress(out.quiet)
    try:
        result = compare_run(options, options.text, told)
    finally:
        if bar is not None:
            bar.stop()
    document = json.dumps(comparison_document(result))
    with staged_outputs(targets) as staged:
        if "--json-file" in staged:
            from attnviz.io import save_text

            save_text(staged["--json-file"], document + "\n")
        staged.commit()
    if out.json:
        stdout().write(document + "\n")
    elif not out.quiet:
        console = out_console()
        console.print(comparison_table(result, out.precision), crop=False)
        for line in comparison_answers(result):
            console.print(line, markup=False, highlight=False)
    if not out.quiet:
        err_console().print(f"{len(result.texts)} text(s) run twice on {result.device} in {result.seconds:.1f} s",
                            markup=False, style="dim")
        if out.json_file:
            err_console().print(f"saved json to {out.json_file}", markup=False, style="dim")


def _rank(options: AblateOptions, out: AblateOutputs) -> None:
    import json

    from attnviz.ablation.exports import duo_attention_targets
    from attnviz.ablation.running import rank_run
    from attnviz.io import check_outputs
    from attnviz.render.ablation import cost_figure, policies_table, policy_answers, ranking_document, ranking_table
    from attnviz.staging import staged_outputs

    outputs = {"--png": out.png, "--json-file": out.json_file, "--export-minference": out.export_minference,
               "--export-retrieval": out.export_retrieval}
    with duo_attention_targets(out.export_duo) as duo:
        targets = check_outputs({**outputs, **duo}, [])
        bar, told = _progress(out.quiet)
        try:
            result = rank_run(options, told)
        finally:
            if bar is not None:
                bar.stop()
        files = {k.lstrip("-").replace("-", "_"): v for k, v in {**outputs, "--export-duo": out.export_duo}.items()
                 if v is not None}
        document = json.dumps(ranking_document(result, files))
        with staged_outputs(targets) as staged:
            if "--png" in staged:
                from attnviz.render.heatmap import save_figure

                save_figure(cost_figure(result), staged["--png"])
            if "--json-file" in staged:
                from attnviz.io import save_text

                save_text(staged["--json-file"], document + "\n")
            _exports(result, out, staged)
            staged.commit()
    err = err_console()
    for line in result.warnings:
        err.print(f"warning: {line}", markup=False, style="yellow")
    if out.json:
        stdout().write(document + "\n")
    elif not out.quiet:
        console = out_console()
        console.print(ranking_table(result, out.precision, out.max_rows), crop=False)
        console.print(policies_table(result), crop=False)
        for line in policy_answers(result):
            console.print(f"wrong: {line}", markup=False, highlight=False)
    if not out.quiet:
        cost = result.costs
        err.print(f"ranked {len(cost.units)} units with {cost.forwards} forwards in {cost.seconds:.1f} s "
                  f"({cost.seconds / result.plain_seconds:.1f}x one plain forward of each calibration needle, "
                  f"{result.plain_seconds:.1f} s); {result.seconds:.1f} s in all on {result.device}",
                  markup=False, style="dim")
        for what, path in files.items():
            err.print(f"saved {what.replace('_', ' ')} to {path}", markup=False, style="dim")


def _exports(result: Any, out: AblateOutputs, staged: Any) -> None:
    """The exports, written into their staged places: the ranking's gates and policy (``policy_gates``) for
    DuoAttention and MInference, the retrieval scores for HeadKV."""
    from attnviz.ablation import exports
    from attnviz.ablation.ranking import policy_gates

    g = result.geometry
    gates = policy_gates(result.costs, result.share, g)
    sink, recent = result.restriction.sink, result.restriction.recent or result.restriction.window
    if out.export_duo is not None:
        exports.write_duo_attention(out.export_duo, gates, sink_size=sink, recent_size=recent, staged=staged,
                                    extra={"model": result.model, "found_by": "attnviz ablate --rank",
                                           "share": result.share})
    if out.export_minference is not None:
        exports.write_minference(out.export_minference, gates, heads=g.heads, sink_size=sink, recent_size=recent,
                                 length=max(result.positions, result.longest + 1), staged=staged)
    if out.export_retrieval is not None and result.retrieval is not None:
        exports.write_retrieval_scores(out.export_retrieval, retrieval_runs(result.retrieval), staged=staged)


def retrieval_runs(scores: Any) -> Any:
    """The retrieval scores ``[layers, heads, needles]`` of the calibration needles whose answer held the code (a
    needle whose answer held none has no score, NaN: no head can have copied from it); one error when none did."""
    import numpy as np

    from attnviz.errors import InputError

    kept = [n for n in range(scores.shape[-1]) if np.isfinite(scores[..., n]).all()]
    if not kept:
        raise InputError("--export-retrieval: no calibration answer held the needle's code, so no head copied from "
                         "it and there are no retrieval scores to write (the other outputs are not written either).")
    return scores[..., kept]


ablate_command.__signature__ = inspect.Signature([  # type: ignore[attr-defined]
    inspect.Parameter("model", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=Annotated[
        str, typer.Argument(metavar="MODEL_DIR", show_default=False,
                            help="a local model folder (a decoder language model: config.json, the weights and the "
                                 "tokenizer, as save_pretrained writes them); nothing is downloaded")]),
    inspect.Parameter("text", inspect.Parameter.KEYWORD_ONLY, default=None, annotation=Annotated[
        list[str] | None, typer.Option("--text", metavar="TEXT", help="a text to run the model on; repeat for more; "
                                                                     "@FILE: a whole file as one text")]),
    inspect.Parameter("text_file", inspect.Parameter.KEYWORD_ONLY, default=None, annotation=Annotated[
        str | None, typer.Option("--text-file", metavar="FILE", help="more texts, one a line")]),
    *parameters(AblateOptions, AblateOutputs, order=ORDER, exclude=("model", "text"))])


__all__ = ["AblateOutputs", "ablate_command"]

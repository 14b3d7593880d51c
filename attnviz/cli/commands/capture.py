"""``attnviz capture MODEL_DIR --text ... -o run.safetensors``: a local model folder run on a padded batch
of texts (one forward, or ``--generate N`` tokens) with every attention site recorded into one capture
file (``attnviz.capture``). Also the model options of ``inspect`` and ``rollout`` (``--model``, ``--text``),
which capture into a temporary file and read it."""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any, Literal

import typer

from attnviz.cli.errors import user_errors
from attnviz.cli.parsers import checked_option, parser_for
from attnviz.streams import err_console, stdout

DEVICES = ("auto", "cpu", "cuda")
DTYPES = ("auto", "float32", "float16", "bfloat16")
WEIGHT_DTYPES = ("float32", "float16", "bfloat16")
MODEL = "Model (capture)"
SUMMARY = "Summary (long inputs)"
CORPUS = "Corpus (--corpus)"
LONGS = ("truncate", "refuse")
LONG_HELP = ("texts past the model's positions: refuse (stop before the model runs, naming the text; the default "
             "of a plain capture, where a rotary model past its max_position_embeddings only warns unless --long "
             "refuse is given) or truncate (keep their first tokens and say how many were dropped; the default of "
             "--corpus)")


def capture_command(
    model: Annotated[str, typer.Argument(metavar="MODEL_DIR", show_default=False,
                                         help="a local model folder: config.json, the weights and the tokenizer "
                                              "(what save_pretrained writes), or a KerasHub preset folder "
                                              "(save_to_preset's); nothing is downloaded")],
    text: Annotated[list[str] | None, typer.Option(
        "--text", metavar="TEXT", help="a text to run the model on; repeat for a padded batch; @FILE: a whole file "
                                       "as one text (a long document, newlines kept)")] = None,
    text_file: Annotated[str | None, typer.Option("--text-file", metavar="FILE",
                                                  help="more texts, one a line")] = None,
    output: Annotated[str | None, typer.Option("-o", "--output", metavar="FILE",
                                               help="the capture file: .safetensors (or .npz)")] = None,
    device: Annotated[str, checked_option(Literal[DEVICES], "--device",  # type: ignore[valid-type]
                                          help="where the model runs: cuda when a GPU is visible (auto)")] = "auto",
    dtype: Annotated[str, checked_option(Literal[DTYPES], "--dtype",  # type: ignore[valid-type]
                                         help="the model's dtype (auto: as saved)")] = "auto",
    layers: Annotated[str | None, typer.Option("--layers", metavar="N,N,...",
                                               help="keep only these sites (0-based; negative from the end)")] = None,
    generate: Annotated[int, checked_option(int, "--generate", min=0, metavar="N",
                                            help="generate N tokens (greedy); each site's steps are stitched into "
                                                 "one map")] = 0,
    no_weights: Annotated[bool, typer.Option("--no-weights", help="keep q, k, v and masks only (long inputs: no "
                                                                   "[L, L] maps)")] = False,
    weights_dtype: Annotated[str, checked_option(Literal[WEIGHT_DTYPES], "--weights-dtype",  # type: ignore[valid-type]
                                                 help="store the weights as this (reduced where the model runs)")]
    = "float32",
    target: Annotated[str | None, typer.Option("--target", metavar="next|TOKEN|ID",
                                               help="also save d(logit of TARGET at the last position)/d(weights) "
                                                    "of every site as SITE.grad (next: the top prediction)")] = None,
    decoder_text: Annotated[str | None, typer.Option("--decoder-text", metavar="TEXT",
                                                     help="an encoder-decoder's decoder input (default: its start "
                                                          "token)")] = None,
    check: Annotated[bool, typer.Option("--check", help="recompute every site from its q, k, mask and settings and "
                                                        "report the largest difference (exit 3 past --atol)")] = False,
    atol: Annotated[float | None, checked_option(float | None, "--atol", min=0.0,
                                                 help="tolerance of --check (default by the model's dtype: 1e-5 "
                                                      "float32, 1e-3 float16, 8e-3 bfloat16)")] = None,
    summary: Annotated[bool, typer.Option("--summary", rich_help_panel=SUMMARY, help=(
        "long inputs: record each site's summary instead of its weights, computed where the model runs a block of "
        "query rows at a time (per row: entropy, largest weight and its key, sink, local and total mass; per key: "
        "received attention; a pooled map; the rows of --rows)"))] = False,
    sinks: Annotated[int | None, checked_option(int | None, "--sinks", min=1, metavar="S", rich_help_panel=SUMMARY,
                                                help="with --summary: the sink mass is the weight on the first S "
                                                     "real keys (default 4)")] = None,
    local: Annotated[int | None, checked_option(int | None, "--local", min=1, metavar="W", rich_help_panel=SUMMARY,
                                                help="with --summary: the local mass is the weight on the keys "
                                                     "i - W < j <= i (default 64)")] = None,
    pool: Annotated[int | None, checked_option(int | None, "--pool", min=1, metavar="P", rich_help_panel=SUMMARY,
                                               help="with --summary: pooled maps of at most P x P blocks (means "
                                                    "and maxima; default 256)")] = None,
    rows: Annotated[str | None, typer.Option("--rows", metavar="ROWS", rich_help_panel=SUMMARY,
                                             help="with --summary: query rows kept whole: last (the default), "
                                                  "0,512,-1, ranges 100:200, none")] = None,
    max_file: Annotated[str | None, typer.Option("--max-file", metavar="SIZE", help=(
        "refuse, before the model runs, an exact capture whose weights would take more than SIZE (default 4G; "
        "0: no limit)"))] = None,
    json_out: Annotated[bool, typer.Option("--json", help="print a JSON object instead of the table")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="print no progress bar and no informational lines; "
                                                              "warnings and errors still go to stderr")] = False,
    truncate: Annotated[bool, typer.Option("--truncate", hidden=True, help="the same as --long truncate")] = False,
    long: Annotated[str | None, checked_option(Literal[LONGS] | None, "--long",  # type: ignore[valid-type]
                                               metavar="truncate|refuse", help=LONG_HELP)] = None,
    corpus: Annotated[bool, typer.Option("--corpus", rich_help_panel=CORPUS, help="per-head statistics over every "
                                         "line of --text-file instead of the weights (a corpus file: attnviz inspect "
                                         "reads it, attnviz merge adds shards)")] = False,
    batch_size: Annotated[int | None, checked_option(int | None, "--batch-size", min=1, metavar="N",
                                                     rich_help_panel=CORPUS, help="texts per forward pass (8)")] = None,
    shard: Annotated[str | None, typer.Option("--shard", metavar="INDEX/COUNT|auto", rich_help_panel=CORPUS,
                                              help="every COUNT-th line from INDEX on (auto: from a Slurm array or "
                                                   "a Kubernetes Indexed Job)")] = None,
    token_class: Annotated[list[str] | None, typer.Option("--token-class", metavar="NAME=REGEX",
                                                          rich_help_panel=CORPUS,
                                                          help="each head's weight on the tokens whose text the "
                                                               "regex matches whole; repeatable")] = None,
    sink_threshold: Annotated[float | None, checked_option(float | None, "--sink-threshold", min=0.0, max=1.0,
                                                           rich_help_panel=CORPUS,
                                                           help="a head is a sink in a text when its mean weight on "
                                                                "the first token passes this (0.3)")] = None,
) -> None:
    """Capture every attention site of a local model on some texts into one file.

    Every model family whose attention goes through transformers' attention interface (Llama, Mistral,
    Qwen, Gemma, gpt-oss, BERT, BART, T5, Whisper, GPT-2 ...) is recorded the same way, whatever
    implementation it was saved with: the weights as its eager attention computes them, q, k, v, the
    mask and the output projection. Then `attnviz inspect run.safetensors`.
    """
    with user_errors():
        given = {"--batch-size": batch_size, "--shard": shard, "--token-class": token_class,
                 "--sink-threshold": sink_threshold}
        long = long_choice(long, truncate)
        if corpus:
            from attnviz.cli.corpus import CorpusOptions, capture_corpus_command, refuse_with_corpus

            refuse_with_corpus({"--layers": layers, "--generate": generate, "--no-weights": no_weights,
                                "--weights-dtype": weights_dtype != "float32", "--target": target,
                                "--decoder-text": decoder_text, "--check": check, "--summary": summary,
                                "--max-file": max_file, "--sinks": sinks is not None,
                                "--local": local is not None, "--pool": pool is not None, "--rows": rows is not None})
            options = CorpusOptions(batch_size=batch_size or 8, shard=shard, token_class=tuple(token_class or ()),
                                    sink_threshold=0.3 if sink_threshold is None else sink_threshold,
                                    long=long or "truncate")
            return capture_corpus_command(model, text or [], text_file, output, device, dtype, options, json_out,
                                          quiet)
        from attnviz.cli.corpus import refuse_without_corpus

        refuse_without_corpus(given)
        settings = summary_settings(summary, sinks, local, pool, rows, no_weights, target, check)
        _capture(model, text or [], text_file, output, device, dtype, layers, generate, no_weights, weights_dtype,
                 target, decoder_text, check, atol, json_out, settings, parse_max_file(max_file), long, quiet)


def long_choice(long: str | None, truncate: bool) -> str | None:
    """``--long`` with ``--truncate`` (its older name: ``--long truncate``); None when neither was given (each
    command's default: refuse for a capture, truncate for a corpus). Both, disagreeing: exit 2."""
    from attnviz.errors import UsageError

    if not truncate:
        return long
    if long == "refuse":
        raise UsageError("--truncate is --long truncate; give one of --truncate and --long refuse.")
    return "truncate"


def summary_settings(summary: bool, sinks: int | None, local: int | None, pool: int | None, rows: str | None,
                     no_weights: bool, target: str | None, check: bool) -> Any:
    """--summary's settings (``attnviz.summarystats.SummarySettings``), or None; its conflicts (exit 2)."""
    from attnviz.errors import UsageError

    if not summary:
        for flag, value in (("--sinks", sinks), ("--local", local), ("--pool", pool), ("--rows", rows)):
            if value is not None:
                raise UsageError(f"{flag} goes with --summary (a summary capture's settings).")
        return None
    for flag, given in (("--no-weights", no_weights), ("--target", target is not None), ("--check", check)):
        if given:
            raise UsageError(f"--summary records no weights: drop {flag}.")
    from attnviz.summarystats import DEFAULT_LOCAL, DEFAULT_POOL, DEFAULT_SINKS, SummarySettings

    rows = "last" if rows is None else rows
    return SummarySettings(DEFAULT_SINKS if sinks is None else sinks, DEFAULT_LOCAL if local is None else local,
                           DEFAULT_POOL if pool is None else pool, None if rows.strip().lower() == "none" else rows)


def parse_max_file(text: str | None) -> int | None:
    """--max-file as bytes (0: no limit), or None for the default."""
    from attnviz.errors import UsageError

    if text is None:
        return None
    if text.strip() == "0":
        return 0
    from attnviz.blockwise import UNITS

    t = text.strip().lower()
    number = t.rstrip("abcdefghijklmnopqrstuvwxyz")
    try:
        return int(float(number) * UNITS[t[len(number):]])
    except (ValueError, KeyError):
        raise UsageError(f"--max-file {text!r}: expected a size such as 4G, 500M or 0 (no limit).") from None


def _capture(model: str, texts: list[str], text_file: str | None, output: str | None, device: str, dtype: str,
             layers: str | None, generate: int, no_weights: bool, weights_dtype: str, target: str | None,
             decoder_text: str | None, check: bool, atol: float | None, json_out: bool, summary: Any = None,
             max_file: int | None = None, long: str | None = None, quiet: bool = False) -> None:
    import json

    from attnviz.capturing.folder import capture_folder, read_texts
    from attnviz.errors import UsageError
    from attnviz.io import check_outputs

    if output is None:
        raise UsageError("capture: name the file to write with -o FILE.safetensors (or .npz).")
    if not output.lower().endswith((".safetensors", ".npz")):
        raise UsageError(f"-o {output}: a capture is written as .safetensors or .npz.")
    if no_weights and (target is not None or check):
        raise UsageError(f"{'--target' if target else '--check'} needs the weights; drop --no-weights.")
    wanted = parse_layers(layers)
    all_texts = read_texts(texts, text_file)
    folder = Path(model)  # -o may not replace a file of the model's own (its weights, its config)
    targets = check_outputs({"-o": output}, list(folder.iterdir()) if folder.is_dir() else [])

    def run(path: Any) -> Any:
        with progress_bar("summary" if summary is not None else "capture", quiet) as progress:
            return capture_folder(model, all_texts, path, device=device, dtype=dtype, layers=wanted,
                                  generate=generate, weights=not no_weights, weights_dtype=weights_dtype,
                                  target=target, decoder_text=decoder_text, check=check, summary=summary,
                                  max_file=max_file, long=long, progress=progress)

    if isinstance(targets["-o"], Path):
        done = run(output)
    else:  # a URL: captured into its staged file, then uploaded whole (its bucket checked before the model runs)
        from attnviz.staging import staged_outputs

        with staged_outputs(targets) as staged:
            done = run(staged["-o"])
            staged.commit()
        done.path = targets["-o"]
    err = err_console()
    if atol is None:
        from attnviz.capturing.check import TOLERANCE

        atol = TOLERANCE.get(done.dtype, 1e-5)
    for text in done.warnings:
        err.print(f"warning: {text}", markup=False, style="yellow")
    failed = done.checked is not None and any(v > atol for v in done.checked.values())
    if json_out:
        doc = {"attnviz": _version(), "command": "capture", "model": model, "model_type": done.model_type,
               "device": done.device, "file": str(done.path), "sites": done.sites, "shape": list(done.shape),
               "texts": len(all_texts), "generate": generate, "seconds": round(done.seconds, 3),
               "summary": done.summary, "dense_mask_bytes": done.dense_mask_bytes, "warnings": done.warnings}
        if done.generated is not None:
            doc["generated"] = done.generated
        if done.checked is not None:
            doc["check"] = {"atol": atol, "passed": not failed, "max_abs_diff": done.checked}
        stdout().write(json.dumps(doc) + "\n")
    elif quiet:  # a failed check is not information: it is said (and the exit status is 3)
        if failed:
            stdout().write(_check_line(done.checked or {}, atol, failed))
    else:
        out = stdout()
        kinds = list(dict.fromkeys(s.rpartition(".layers.")[0] or "layers" for s in done.sites))
        what = ("[" + ", ".join(str(n) for n in done.shape) + "] each" if len(kinds) == 1 else
                ", ".join(f"{sum(s.startswith(k + '.') for s in done.sites)} {k}" for k in kinds))
        kind = "summaries of " if done.summary else ""
        out.write(f"captured {kind}{len(done.sites)} attention sites of {done.model_type} ({what}) on {done.device} "
                  f"in {done.seconds:.1f} s\n")
        if done.dense_mask_bytes:
            from attnviz.sizes import size_str

            out.write(f"masks: not made of padding, causal and a window: kept whole ("
                      f"{size_str(done.dense_mask_bytes)})\n")
        if done.checked is not None:
            out.write(_check_line(done.checked, atol, failed))
    if not quiet:
        if done.generated is not None:
            from attnviz.tokentext import answer_lines

            for line in answer_lines(done.generated):
                err.print(line, markup=False)
        err.print(f"saved capture to {done.path}", markup=False, style="dim")
    if failed:
        raise typer.Exit(3)


#: a capture's progress bar appears once its forward pass has run this long (seconds): a short one stays silent
BAR_AFTER = 1.0


@contextmanager
def progress_bar(what: str, quiet: bool) -> Iterator[Any]:
    """A progress bar on stderr while a capture's forward pass runs over its texts (a long one: the prompt of a
    --generate run too): the layers done (a summary's share of a layer's rows too), tokens a second, the time
    spent and the time left. Only on a terminal, without --quiet (None is yielded then: nothing is told); it
    appears after ``BAR_AFTER`` seconds and is gone when the pass ends (the summary line says how long it took)."""
    import time

    err = err_console()
    if quiet or not err.is_terminal:
        yield None
        return
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    bar = Progress(TextColumn(what), BarColumn(), TextColumn("{task.fields[layers]}"),
                   TextColumn("{task.fields[rate]}"), TimeElapsedColumn(), TimeRemainingColumn(), console=err,
                   transient=True)
    started: list[float] = []
    task: list[Any] = []

    def progress(done: float, total: int, tokens: int) -> None:
        now = time.monotonic()
        if not started:
            started.append(now)
        layer = f"layer {min(int(done) + 1, total)}/{total}"  # the one running (1-based)
        if not task:
            if now - started[0] < BAR_AFTER:
                return
            bar.start()
            task.append(bar.add_task(what, total=total, layers=layer, rate=""))
        bar.update(task[0], completed=done, layers=layer)
        speed = bar.tasks[0].speed  # layers a second
        bar.update(task[0], rate=f"{speed * tokens / max(total, 1):,.0f} tokens/s" if speed else "")

    try:
        yield progress
    finally:
        if task:
            bar.stop()


def _check_line(checked: dict[str, float], atol: float, failed: bool) -> str:
    """What --check found: the largest difference, its site and the tolerance."""
    if not checked:
        return "check: no site holds weights to check\n"
    worst = max(checked, key=lambda s: checked[s])
    return (f"check: {'passed' if not failed else 'FAILED'}: largest difference {checked[worst]:.3g} at {worst} "
            f"(atol {atol:g}) over {len(checked)} sites\n")


def parse_layers(text: str | None) -> list[int] | None:
    from attnviz.errors import UsageError

    if text is None:
        return None
    try:
        values = [int(part) for part in text.replace(" ", "").split(",") if part]
    except ValueError:
        raise UsageError(f"--layers {text!r}: give site numbers separated by commas (0,3,-1).") from None
    if not values:
        raise UsageError("--layers: give at least one site number.")
    return values


def _version() -> str:
    from attnviz import __version__

    return __version__


# ---------------------------------------------------------------------------------------------------
# --model and --text on the commands that read weights: capture first, into a temporary file


def model_parameters() -> list[inspect.Parameter]:
    """``--model``, ``--text``, ``--text-file``, ``--device`` for ``inspect`` and ``rollout``."""
    p = inspect.Parameter
    kw = p.KEYWORD_ONLY
    return [
        p("model", kw, default=None, annotation=Annotated[str | None, typer.Option(
            "--model", metavar="MODEL_DIR", rich_help_panel=MODEL,
            help="capture a local model folder on --text first (attnviz capture), then read that")]),
        p("text", kw, default=None, annotation=Annotated[list[str] | None, typer.Option(
            "--text", metavar="TEXT", rich_help_panel=MODEL, help="with --model: a text; repeat for a batch")]),
        p("text_file", kw, default=None, annotation=Annotated[str | None, typer.Option(
            "--text-file", metavar="FILE", rich_help_panel=MODEL, help="with --model: texts, one a line")]),
        p("model_device", kw, default="auto", annotation=Annotated[str, checked_option(
            Literal[DEVICES], "--model-device", rich_help_panel=MODEL,  # type: ignore[valid-type]
            help="with --model: where it runs")]),
        p("model_long", kw, default=None, annotation=Annotated[str | None, checked_option(
            Literal[LONGS] | None, "--long", metavar="truncate|refuse", rich_help_panel=MODEL,  # type: ignore[valid-type]
            help="with --model: texts past the model's positions: refuse (the default: stop before the model runs; "
                 "a rotary model past its max_position_embeddings only warns unless --long refuse is given) or "
                 "truncate (keep their first tokens and say how many were dropped)")]),
        p("truncate", kw, default=False, annotation=Annotated[bool, typer.Option(
            "--truncate", hidden=True, rich_help_panel=MODEL, help="with --model: the same as --long truncate")]),
    ]


@contextmanager
def captured_input(files: list[str], values: dict[str, Any]) -> Iterator[list[str]]:
    """The files to read: as given, or (``--model``) a capture of the model on the texts in a temporary
    folder, removed afterwards."""
    from attnviz.errors import UsageError

    model, texts, text_file = values.pop("model"), values.pop("text") or [], values.pop("text_file")
    device, long = values.pop("model_device"), long_choice(values.pop("model_long"), values.pop("truncate"))
    if model is None:
        if texts or text_file or long is not None:
            raise UsageError("--text, --text-file and --long go with --model MODEL_DIR.")
        if not files:
            raise UsageError("missing argument WEIGHTS (or a model folder: --model DIR --text TEXT).")
        yield files
        return
    if files:
        raise UsageError("--model captures the weights to read: give WEIGHTS or --model, not both.")
    import shutil
    import tempfile

    from attnviz.capturing.folder import capture_folder, model_name, read_texts

    all_texts = read_texts(texts, text_file)
    folder = tempfile.mkdtemp(prefix="attnviz-model-")
    try:
        path = Path(folder) / f"{Path(model).name or 'model'}.safetensors"
        done = capture_folder(model, all_texts, path, device=device, auto_summary=True, long=long)
        for text in done.warnings:
            err_console().print(f"warning: {text}", markup=False, style="yellow")
        from attnviz.io import named

        with named({str(path): f"{model_name(model)} (captured)"}):
            yield [str(path)]
    finally:
        shutil.rmtree(folder, ignore_errors=True)


__all__ = ["capture_command", "captured_input", "model_parameters", "parse_layers", "parser_for"]

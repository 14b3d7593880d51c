"""``attnviz capture MODEL_DIR --text ... -o run.safetensors``: a local model folder run on a padded batch
of texts (one forward, or ``--generate N`` tokens) with every attention site recorded into one capture
file (``attnviz.capture``). Also the model options of ``inspect`` and ``rollout`` (``--model``, ``--text``),
which capture into a temporary file and read it."""

from __future__ import annotations

import dataclasses
import inspect
import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

import typer

from attnviz.capturing.options import CaptureRun, CaptureSettings, ModelInput, long_choice
from attnviz.cli.errors import user_errors
from attnviz.cli.options import build, parameters, write_through
from attnviz.streams import err_console, stdout

#: the order of capture's options in its help
ORDER = ("text", "text_file", "output", "device", "dtype", "layers", "generate", "no_weights", "no_qkv",
         "weights_dtype", "target", "decoder_text", "check", "atol", "summary", "sinks", "local", "pool", "rows",
         "max_file", "json", "quiet", "truncate", "long", "corpus", "batch_size", "shard", "token_class",
         "sink_threshold")


def capture_command(model: str, **values: Any) -> None:
    """Capture every attention site of a local model on some texts into one file.

    Every model family whose attention goes through transformers' attention interface (Llama, Mistral,
    Qwen, Gemma, gpt-oss, BERT, BART, T5, Whisper, GPT-2 ...) is recorded the same way, whatever
    implementation it was saved with: the weights as its eager attention computes them, q, k, v, the
    mask and the output projection. Then `attnviz inspect run.safetensors`.
    """
    with user_errors():
        options: CaptureSettings = build(CaptureSettings, values, model=model)
        options.check()
        if options.corpus.corpus:
            from attnviz.cli.corpus import capture_corpus_command

            return capture_corpus_command(options)
        _capture(options)


capture_command.__signature__ = inspect.Signature([  # type: ignore[attr-defined]
    inspect.Parameter("model", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=Annotated[
        str, typer.Argument(metavar="MODEL_DIR", show_default=False,
                            help="a local model folder: config.json, the weights and the tokenizer (what "
                                 "save_pretrained writes), or a KerasHub preset folder (save_to_preset's); nothing "
                                 "is downloaded")]),
    *parameters(CaptureSettings, order=ORDER),
])


def _capture(options: CaptureSettings) -> None:
    """``attnviz capture``: the texts read, the model captured into ``-o`` (a URL's staged file, uploaded whole),
    what it did said (a table line, or ``--json``); exit 3 when ``--check`` finds a site past ``--atol``."""
    from attnviz.capturing.folder import capture_folder, read_texts

    run, out = options.run, options.output
    texts = read_texts(run.texts, run.text_file)

    def capture(path: Any) -> Any:
        with progress_bar("summary" if options.summary.summary else "capture", out.quiet) as progress:
            return capture_folder(options, texts, path, progress=progress)

    done = write_through("-o", str(options.output.output), capture, options.model_files())
    err = err_console()
    atol = run.atol
    if atol is None:
        from attnviz.capturing.check import TOLERANCE

        atol = TOLERANCE.get(done.dtype, 1e-5)
    for text in done.warnings:
        err.print(f"warning: {text}", markup=False, style="yellow")
    failed = done.checked is not None and any(v > atol for v in done.checked.values())
    if out.json:
        stdout().write(json.dumps(_document(options, done, len(texts), atol, failed)) + "\n")
    elif out.quiet:  # a failed check is not information: it is said (and the exit status is 3)
        if failed:
            stdout().write(_check_line(done.checked or {}, atol, failed))
    else:
        stdout().write(_said(done, atol, failed))
    if not out.quiet:
        if done.generated is not None:
            from attnviz.tokentext import answer_lines

            for line in answer_lines(done.generated):
                err.print(line, markup=False)
        err.print(f"saved capture to {done.path}", markup=False, style="dim")
    if failed:
        raise typer.Exit(3)


def _document(options: CaptureSettings, done: Any, texts: int, atol: float, failed: bool) -> dict[str, Any]:
    """``--json``: what the capture did, as one object."""
    doc = {"attnviz": _version(), "command": "capture", "model": options.model, "model_type": done.model_type,
           "device": done.device, "file": str(done.path), "sites": done.sites, "shape": list(done.shape),
           "texts": texts, "generate": options.run.generate, "seconds": round(done.seconds, 3),
           "summary": done.summary, "dense_mask_bytes": done.dense_mask_bytes, "warnings": done.warnings}
    if done.generated is not None:
        doc["generated"] = done.generated
    if done.checked is not None:
        doc["check"] = {"atol": atol, "passed": not failed, "max_abs_diff": done.checked}
    return doc


def _said(done: Any, atol: float, failed: bool) -> str:
    """The lines a capture prints: its sites, their shape, the model, the device and the time; masks kept
    whole; what ``--check`` found."""
    kinds = list(dict.fromkeys(s.rpartition(".layers.")[0] or "layers" for s in done.sites))
    what = ("[" + ", ".join(str(n) for n in done.shape) + "] each" if len(kinds) == 1 else
            ", ".join(f"{sum(s.startswith(k + '.') for s in done.sites)} {k}" for k in kinds))
    kind = "summaries of " if done.summary else ""
    text = (f"captured {kind}{len(done.sites)} attention sites of {done.model_type} ({what}) on {done.device} "
            f"in {done.seconds:.1f} s\n")
    if done.dense_mask_bytes:
        from attnviz.sizes import size_str

        text += f"masks: not made of padding, causal and a window: kept whole ({size_str(done.dense_mask_bytes)})\n"
    if done.checked is not None:
        text += _check_line(done.checked, atol, failed)
    return text


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


def _version() -> str:
    from attnviz import __version__

    return __version__


# ---------------------------------------------------------------------------------------------------
# --model and --text on the commands that read weights: capture first, into a temporary file


def model_parameters() -> list[inspect.Parameter]:
    """``--model``, ``--text``, ``--text-file``, ``--model-device`` and ``--long`` for ``inspect``, ``rollout``
    and ``view`` (``capturing.options.ModelInput``)."""
    return parameters(ModelInput)


@contextmanager
def captured_input(files: list[str], values: dict[str, Any]) -> Iterator[list[str]]:
    """The files to read: as given, or (``--model``) a capture of the model on the texts in a temporary
    folder, removed afterwards. The ``ModelInput`` options are taken out of ``values``."""
    from attnviz.errors import UsageError

    given: ModelInput = build(ModelInput, {f.name: values.pop(f.name) for f in dataclasses.fields(ModelInput)})
    long = long_choice(given.model_long, given.truncate)
    if given.model is None:
        if given.text or given.text_file or long is not None:
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

    model = given.model
    all_texts = read_texts(list(given.text or []), given.text_file)
    folder = tempfile.mkdtemp(prefix="attnviz-model-")
    try:
        path = Path(folder) / f"{Path(model).name or 'model'}.safetensors"
        options = CaptureSettings(model=model, run=CaptureRun(device=given.model_device, long=long))
        done = capture_folder(options, all_texts, path, auto_summary=True)
        for text in done.warnings:
            err_console().print(f"warning: {text}", markup=False, style="yellow")
        from attnviz.io import named

        with named({str(path): f"{model_name(model)} (captured)"}):
            yield [str(path)]
    finally:
        shutil.rmtree(folder, ignore_errors=True)


__all__ = ["capture_command", "captured_input", "model_parameters"]

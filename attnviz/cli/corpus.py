"""The command line's corpus face: ``attnviz capture MODEL_DIR --text-file FILE --corpus -o heads.safetensors``
(per-head statistics over every text, a progress bar on stderr). The work is in ``attnviz.capturing.corpus``.
``attnviz inspect heads.safetensors`` reads such a file through ``attnviz.inspection.kinds.inspect_corpus``
(``cli/commands/inspect.py``)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from attnviz.capturing.options import CaptureSettings
from attnviz.cli.options import write_through
from attnviz.errors import UsageError
from attnviz.streams import err_console, stdout


def capture_corpus_command(options: CaptureSettings) -> None:
    """``attnviz capture MODEL_DIR --text-file FILE --corpus -o FILE.safetensors``, its ``options`` checked
    (``CaptureSettings.check``)."""
    from attnviz.batch.shards import parse_shard
    from attnviz.capturing.corpus import capture_corpus, compile_classes, read_corpus_text

    text_file, quiet = options.run.text_file, options.output.quiet
    assert text_file is not None  # checked
    compile_classes(options.corpus.classes)  # before the file is read
    shard = parse_shard(options.corpus.shard)
    corpus = read_corpus_text(text_file, shard)
    if not corpus.count:
        raise UsageError(f"--shard {shard[0]}/{shard[1]}: {text_file} has {corpus.source['lines']} lines; this "
                         "shard holds no text (fewer shards).")
    err = err_console()

    def run(path: Any) -> Any:
        try:
            with corpus_bar(quiet) as progress:
                return capture_corpus(options, corpus, path, progress=progress)
        finally:
            corpus.close()  # a named pipe's copy

    done = write_through("-o", str(options.output.output), run, options.model_files())
    if corpus.empty and not quiet:
        err.print(f"skipped {corpus.empty} empty line{'s' if corpus.empty != 1 else ''} of {text_file}", markup=False,
                  style="dim")
    for text in done.warnings:
        err.print(f"warning: {text}", markup=False, style="yellow")
    if options.output.json:
        stdout().write(json.dumps(_corpus_document(options, done, corpus.empty, shard)) + "\n")
    elif not quiet:
        meta = done.sums.corpus
        blocked = int(meta.get("blocked_texts") or 0)
        blocked_text = f" ({blocked} long, a block of rows at a time)" if blocked else ""
        shard_text = f" (shard {shard[0]}/{shard[1]})" if shard[1] > 1 else ""
        stdout().write(f"corpus statistics of {len(done.sums.sites)} layers x {max(done.sums.heads)} heads of "
                       f"{done.model_type} over {done.texts} texts{shard_text}{blocked_text} on {done.device} in "
                       f"{done.seconds:.1f} s\n")
    if not quiet:
        err.print(f"saved corpus statistics to {done.path}", markup=False, style="dim")


@contextmanager
def corpus_bar(quiet: bool) -> Iterator[Callable[[int, int], None] | None]:
    """A progress bar on stderr while a corpus runs, told after each batch (the texts done, texts a second, the
    time spent and left); it starts with the first batch done and stays when the run ends. None with --quiet."""
    if quiet:
        yield None
        return
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    bar = Progress(TextColumn("corpus"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[rate]}"),
                   TimeElapsedColumn(), TimeRemainingColumn(), console=err_console(), transient=False)
    task = None

    def progress(done: int, total: int) -> None:
        nonlocal task
        if task is None:
            bar.start()
            task = bar.add_task("texts", total=total, rate="")
        bar.update(task, completed=done)
        speed = bar.tasks[0].speed
        bar.update(task, rate=f"{speed:.1f} texts/s" if speed else "")

    try:
        yield progress
    finally:
        if task is not None:
            bar.stop()


def _corpus_document(options: CaptureSettings, done: Any, empty: int, shard: tuple[int, int]) -> dict[str, Any]:
    """``capture --corpus --json``: what the run did, as one object."""
    from attnviz import __version__

    meta = done.sums.corpus
    return {"attnviz": __version__, "command": "capture", "corpus": True, "model": options.model,
            "model_type": done.model_type, "device": done.device, "file": str(done.path), "texts": done.texts,
            "empty_lines": empty, "truncated_texts": meta.get("truncated_texts"),
            "dropped_tokens": meta.get("dropped_tokens"), "blocked_texts": meta.get("blocked_texts"),
            "distance_texts": meta.get("distance_texts"), "shard": list(shard), "sites": list(done.sums.sites),
            "heads": sum(done.sums.heads), "seconds": round(done.seconds, 3), "warnings": done.warnings}


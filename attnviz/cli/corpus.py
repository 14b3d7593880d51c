"""The command line's corpus face: ``attnviz capture MODEL_DIR --text-file FILE --corpus -o heads.safetensors``
(per-head statistics over every text, a progress bar on stderr). The work is in ``attnviz.capturing.corpus``.
``attnviz inspect heads.safetensors`` reads such a file through ``attnviz.inspection.kinds.inspect_corpus``
(``cli/commands/inspect.py``)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from attnviz.errors import UsageError
from attnviz.streams import err_console, stdout

LONG = ("truncate", "refuse")


@dataclass
class CorpusOptions:
    """The options of a corpus run (``attnviz capture --corpus``)."""

    batch_size: int = 8
    shard: str | None = None
    token_class: tuple[str, ...] = ()
    sink_threshold: float = 0.3
    long: str = "truncate"


def refuse_without_corpus(given: dict[str, Any]) -> None:
    """The corpus options need --corpus (exit 2)."""
    for flag, value in given.items():
        if value not in (None, (), []):
            raise UsageError(f"{flag} goes with --corpus (per-head statistics over a text file).")


def refuse_with_corpus(given: dict[str, Any]) -> None:
    """What a corpus run does not take (exit 2)."""
    for flag, value in given.items():
        if value:
            raise UsageError(f"{flag}: a corpus run (--corpus) keeps per-head statistics, not the weights of one "
                             "batch; drop it.")


def capture_corpus_command(model: str, texts: list[str], text_file: str | None, output: str | None, device: str,
                           dtype: str, options: CorpusOptions, json_out: bool, quiet: bool = False) -> None:
    """``attnviz capture MODEL_DIR --text-file FILE --corpus -o FILE.safetensors``."""
    from attnviz.batch.shards import parse_shard
    from attnviz.capturing.corpus import capture_corpus, compile_classes, read_corpus_text
    from attnviz.io import check_outputs

    if texts or text_file is None:
        raise UsageError("--corpus reads its texts from --text-file FILE (one text a line), not --text.")
    if output is None:
        raise UsageError("capture --corpus: name the file to write with -o FILE.safetensors.")
    if not output.lower().endswith(".safetensors"):
        raise UsageError(f"-o {output}: a corpus file is written as .safetensors.")
    if options.long not in LONG:
        raise UsageError(f"--long {options.long!r}: choose truncate or refuse.")
    classes = compile_classes(options.token_class)
    shard = parse_shard(options.shard)
    corpus = read_corpus_text(text_file, shard)
    if not corpus.count:
        raise UsageError(f"--shard {shard[0]}/{shard[1]}: {text_file} has {corpus.source['lines']} lines; this "
                         "shard holds no text (fewer shards).")
    folder = Path(model)
    targets = check_outputs({"-o": output}, list(folder.iterdir()) if folder.is_dir() else [])
    err = err_console()

    def run(path: Any) -> Any:
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        bar = Progress(TextColumn("corpus"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[rate]}"),
                       TimeElapsedColumn(), TimeRemainingColumn(), console=err, transient=False)
        task = None

        def progress(done: int, total: int) -> None:  # the bar starts with the first batch done
            nonlocal task
            if task is None:
                bar.start()
                task = bar.add_task("texts", total=total, rate="")
            bar.update(task, completed=done)
            speed = bar.tasks[0].speed
            bar.update(task, rate=f"{speed:.1f} texts/s" if speed else "")

        try:
            return capture_corpus(model, corpus, path, device=device, dtype=dtype, batch_size=options.batch_size,
                                  classes=classes, sink_threshold=options.sink_threshold, long=options.long,
                                  progress=None if quiet else progress)
        finally:
            corpus.close()  # a named pipe's copy
            if task is not None:
                bar.stop()

    if isinstance(targets["-o"], Path):
        done = run(output)
    else:  # a URL: written to its staged file, then uploaded whole
        from attnviz.staging import staged_outputs

        with staged_outputs(targets) as staged:
            done = run(staged["-o"])
            staged.commit()
        done.path = targets["-o"]
    if corpus.empty and not quiet:
        err.print(f"skipped {corpus.empty} empty line{'s' if corpus.empty != 1 else ''} of {text_file}", markup=False,
                  style="dim")
    for text in done.warnings:
        err.print(f"warning: {text}", markup=False, style="yellow")
    meta = done.sums.corpus
    shard_text = f" (shard {shard[0]}/{shard[1]})" if shard[1] > 1 else ""
    if json_out:
        from attnviz import __version__

        doc = {"attnviz": __version__, "command": "capture", "corpus": True, "model": model,
               "model_type": done.model_type, "device": done.device, "file": str(done.path), "texts": done.texts,
               "empty_lines": corpus.empty, "truncated_texts": meta.get("truncated_texts"),
               "dropped_tokens": meta.get("dropped_tokens"), "blocked_texts": meta.get("blocked_texts"),
               "distance_texts": meta.get("distance_texts"), "shard": list(shard),
               "sites": list(done.sums.sites), "heads": sum(done.sums.heads), "seconds": round(done.seconds, 3),
               "warnings": done.warnings}
        stdout().write(json.dumps(doc) + "\n")
    elif not quiet:
        blocked = int(meta.get("blocked_texts") or 0)
        blocked_text = f" ({blocked} long, a block of rows at a time)" if blocked else ""
        stdout().write(f"corpus statistics of {len(done.sums.sites)} layers x {max(done.sums.heads)} heads of "
                       f"{done.model_type} over {done.texts} texts{shard_text}{blocked_text} on {done.device} in "
                       f"{done.seconds:.1f} s\n")
    if not quiet:
        err.print(f"saved corpus statistics to {done.path}", markup=False, style="dim")

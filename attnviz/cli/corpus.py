"""The command line's corpus faces: ``attnviz capture MODEL_DIR --text-file FILE --corpus -o heads.safetensors``
(per-head statistics over every text, a progress bar on stderr) and ``attnviz inspect heads.safetensors`` on a
corpus file (the per-head table, JSON, the layer strips, the heads map and a statistic's layers x heads heatmap).
The work is in ``attnviz.capturing.corpus`` and ``attnviz.inspection.corpus``; the pictures in
``attnviz.render.corpus``."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from attnviz.capturing.options import CaptureSettings
from attnviz.cli.options import write_through
from attnviz.errors import UsageError
from attnviz.streams import err_console, out_console, stdout


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


# ---------------------------------------------------------------------------------------------------
# inspect on a corpus file


def inspect_corpus(path: str, meta: dict[str, Any], out: Any, fig: Any, heads_map: str | None) -> None:
    """``attnviz inspect heads.safetensors``: the per-head table (sorted, ``--top``) or ``--json``; with
    ``--png`` the layer strips, with ``--heads-map`` the heads placed by their distances, with ``--stats-png`` the
    layers x heads heatmap of ``--stat``."""
    from attnviz.corpusfile import read_corpus
    from attnviz.inspection.corpus import closest_pairs, corpus_document
    from attnviz.io import check_outputs
    from attnviz.staging import staged_outputs

    del meta
    unsupported = [flag for flag, value in (("--map-png", out.map_png), ("--received-png", out.received_png),
                                            ("--overlay-png", out.overlay_png), ("--html", out.html),
                                            ("--save-maps", out.save_maps)) if value]
    if unsupported:
        raise UsageError(f"{unsupported[0]}: {path} is a corpus file (per-head statistics, no maps); it draws "
                         "--png, --heads-map and --stats-png.")
    sums = read_corpus(path)
    from attnviz.statistics import CORPUS, sort_key

    sort = sort_key(out.sort, CORPUS, path, sums.classes)  # before any file is written
    from attnviz.cli.options import check_png_path

    check_png_path(out.png, "--png")
    check_png_path(heads_map, "--heads-map")
    check_png_path(out.stats_png, "--stats-png")
    if out.stats_png:  # before any file is written
        from attnviz.render.corpus import stat_columns
        from attnviz.render.figures import check_stat

        check_stat(stat_columns(sums), out.stat, path)
    targets = check_outputs({"--png": out.png, "--heads-map": heads_map, "--stats-png": out.stats_png,
                             "--json-file": out.json_file}, [Path(path)])
    files: dict[str, str] = {}
    err = err_console()
    with staged_outputs(targets) as staged:
        from attnviz.render.heatmap import save_figure

        if "--png" in staged:
            from attnviz.render.corpus import layer_strips_figure

            save_figure(layer_strips_figure(sums, fig), staged["--png"])
            files["png"] = out.png
        if "--heads-map" in staged:
            from attnviz.render.corpus import heads_map_figure

            save_figure(heads_map_figure(sums, fig), staged["--heads-map"])
            files["heads_map"] = heads_map or ""
        if "--stats-png" in staged:
            from attnviz.render.corpus import stat_grid

            save_figure(stat_grid(sums, fig, out.stat, path), staged["--stats-png"])
            files["stats_png"] = out.stats_png
        document = json.dumps(corpus_document(sums, path, files))
        if "--json-file" in staged:
            from attnviz.io import save_text

            save_text(staged["--json-file"], document + "\n")
            files["json"] = out.json_file
        staged.commit()
    if not out.quiet:
        from attnviz.inspection.corpus import corpus_sites_text

        err.print(f"inspect: corpus file: {corpus_sites_text(sums)}", markup=False, style="dim")
        for what, where in files.items():
            err.print(f"saved {what} to {where}", markup=False, style="dim")
    if out.json:
        stdout().write(document + "\n")
        return
    if not out.tables:
        return
    from attnviz.inspection.corpus import distances_note
    from attnviz.render.corpus import closest_pairs_table, corpus_table

    console = out_console()
    console.print(corpus_table(sums, out.precision, sort=sort, reverse=out.reverse, top=out.top), crop=False)
    console.print(closest_pairs_table(closest_pairs(sums), note=distances_note(sums)), crop=False)

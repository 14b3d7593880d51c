"""``attnviz merge a.safetensors b.safetensors ... -o all.safetensors``: corpus files (``attnviz capture
--corpus``, one per shard) added into one: every sum and count added, so the result is what one run over all
the texts gives (to float rounding). Files of different models, tokenizers or settings, or two files holding
the same shard of one text file, are refused in one line naming the difference."""

from __future__ import annotations

from typing import Annotated

import typer

from attnviz.streams import err_console, stdout


def merge_command(
    files: Annotated[list[str], typer.Argument(metavar="CORPUS...", show_default=False,
                                               help="corpus files (attnviz capture --corpus), e.g. one per shard")],
    output: Annotated[str | None, typer.Option("-o", "--output", metavar="FILE",
                                               help="the merged corpus file (.safetensors)")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="print a JSON object instead of the line")] = False,
) -> None:
    """Add corpus files (the shards of one corpus run) into one.

    Every statistic of a corpus file is a sum and a count, so the merged file is what one run over every
    text gives. Then `attnviz inspect all.safetensors`.
    """
    from attnviz.cli.errors import user_errors

    with user_errors():
        _merge(files, output, json_out)


def _merge(files: list[str], output: str | None, json_out: bool) -> None:
    import json

    from attnviz import storage
    from attnviz.corpusfile import merge_corpora, read_corpus, write_corpus
    from attnviz.errors import UsageError
    from attnviz.io import check_outputs
    from attnviz.staging import staged_outputs
    from attnviz.storage.urls import place

    if output is None:
        raise UsageError("merge: name the file to write with -o FILE.safetensors.")
    if not output.lower().endswith(".safetensors"):
        raise UsageError(f"-o {output}: a corpus file is written as .safetensors.")
    if len(files) < 2:
        raise UsageError("merge: give two or more corpus files to add up.")
    for name in files:
        if not storage.is_url(name) and not storage.is_file(name):
            raise UsageError(f"{name}: no such file.")
    targets = check_outputs({"-o": output}, [place(f) for f in files])
    merged = merge_corpora([(name, read_corpus(name)) for name in files])
    with staged_outputs(targets) as staged:
        write_corpus(staged["-o"], merged)
        staged.commit()
    corpus = merged.corpus
    if json_out:
        from attnviz import __version__

        stdout().write(json.dumps({"attnviz": __version__, "command": "merge", "files": files, "file": output,
                                   "texts": corpus.get("texts"), "sources": corpus.get("sources")}) + "\n")
    else:
        stdout().write(f"merged {len(files)} corpus files: {corpus.get('texts')} texts\n")
    err_console().print(f"saved corpus statistics to {output}", markup=False, style="dim")

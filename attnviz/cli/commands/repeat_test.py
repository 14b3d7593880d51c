"""``attnviz repeat-test``: the repeated random sequence that probes for induction heads
(``attnviz.inspection.tokens.repeated_sequence``), printed and saved for a model's input_ids and for
``inspect --labels``.
"""

from __future__ import annotations

from typing import Annotated

import typer

from attnviz.cli.errors import user_errors
from attnviz.cli.parsers import checked_option, parser_for
from attnviz.staging import staged_outputs
from attnviz.streams import stdout


def repeat_test_command(
    length: Annotated[int, typer.Argument(metavar="N", show_default=False, parser=parser_for(int, min=1),
                                          help="tokens in the random sequence (repeated once: 2N in all)")],
    vocab_size: Annotated[int, checked_option(int, "--vocab-size", min=1, metavar="V",
                                              help="draw token ids from 0..V-1 (the model's vocabulary size)")],
    seed: Annotated[int | None, checked_option(int | None, "--seed", min=0,
                                               help="random seed (repeatable probes)")] = None,
    ids: Annotated[str | None, typer.Option("--save-ids", metavar="FILE.npy",
                                            help="save the ids [1, 2N] (int64), ready as a model's input_ids")] = None,
    labels: Annotated[str | None, typer.Option("--save-labels", metavar="FILE.txt",
                                               help="save one label a line (the id), for inspect --labels")] = None,
    json_out: Annotated[bool, typer.Option("--json",
                                           help="print a JSON object (ids, n, vocab_size, seed)")] = False,
) -> None:
    """Write the standard induction-head probe: N distinct random token ids, then the same N again.

    Run the model on it with output_attentions, save the attentions, then
    `attnviz inspect attn.npz --labels probe.txt --sort induction`: in the second half, an induction
    head attends to the token after the earlier occurrence of the current token.
    """
    with user_errors():
        _repeat_test(length, vocab_size, seed, ids, labels, json_out)


def _repeat_test(length: int, vocab: int, seed: int | None, ids: str | None, labels: str | None,
                 json_out: bool) -> None:
    import json

    from attnviz.errors import UsageError
    from attnviz.inspection.tokens import repeated_sequence
    from attnviz.io import check_outputs, save_npy, save_text

    if length < 1:
        raise UsageError(f"N {length}: the sequence needs at least 1 token.")
    if length > vocab:
        raise UsageError(f"N {length}: more distinct tokens than --vocab-size {vocab}.")
    if ids is not None and not ids.lower().endswith(".npy"):
        raise UsageError(f"--save-ids {ids}: the file must end in .npy.")
    sequence = repeated_sequence(length, vocab, seed)
    targets = check_outputs({"--save-ids": ids, "--save-labels": labels}, [])
    with staged_outputs(targets) as staged:
        if "--save-ids" in staged:
            save_npy(staged["--save-ids"], sequence[None, :])
        if "--save-labels" in staged:
            save_text(staged["--save-labels"], "".join(f"{i}\n" for i in sequence))
        staged.commit()
    values = [int(i) for i in sequence]
    stdout().write((json.dumps({"ids": values, "n": length, "vocab_size": vocab, "seed": seed}) if json_out
                    else " ".join(str(i) for i in values)) + "\n")

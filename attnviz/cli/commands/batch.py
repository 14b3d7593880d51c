"""``attnviz batch``: the command (its options and help); the batch itself is ``attnviz.batch``, handed
the runner that runs this command (``attnviz.cli.runner.Runner.of``) to run each job."""

from __future__ import annotations

from typing import Annotated

import typer

from attnviz.cli.errors import user_errors
from attnviz.cli.options import OUTPUT
from attnviz.cli.parsers import checked_option


def batch_command(
    ctx: typer.Context,
    jobs: Annotated[list[str] | None, typer.Argument(
        metavar="JOBS | -- COMMAND", show_default=False,
        help="a JSON Lines file of jobs, or - for standard input; with --each, the command each file runs, after "
             "--")] = None,
    each: Annotated[str | None, typer.Option(
        "--each", metavar="GLOB|-", show_default=False,
        help="one job per file the glob matches (sorted naturally; ** descends into folders), or per path on "
             "standard input (-, one a line), running the command after --; placeholders {} {name} {stem} {dir} "
             "{index}, {{ }} for literal braces")] = None,
    shard: Annotated[str | None, typer.Option(
        "--shard", metavar="INDEX/COUNT|auto",
        help="run one of COUNT disjoint shards of the jobs (INDEX from 0); auto reads it from a Slurm job array "
             "(SLURM_ARRAY_TASK_*) or a Kubernetes Indexed Job (JOB_COMPLETION_INDEX with auto/COUNT or "
             "ATTNVIZ_SHARD_COUNT)")] = None,
    results: Annotated[str | None, typer.Option(
        "--results", metavar="FILE.jsonl", rich_help_panel=OUTPUT,
        help="append one JSON line per finished job (command, exit code, files written, seconds, summary of its "
             "JSON document); shards may share the file or write their own and cat them")] = None,
    resume: Annotated[bool, typer.Option(
        "--resume", help="skip the jobs --results records as done (exit 0 or 3, every file it wrote still there "
                         "at its size); the others run again")] = False,
    workers: Annotated[int, checked_option(int, "--jobs", "-j", min=1, max=256,
                                           help="run this many jobs at once (threads)")] = 1,
    fail_fast: Annotated[bool, typer.Option("--fail-fast", help="stop at the first job that fails")] = False,
    json_out: Annotated[bool, typer.Option("--json", rich_help_panel=OUTPUT,
                                           help="print the summary as JSON on stdout")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", rich_help_panel=OUTPUT,
                                        help="no progress bar and no summary table")] = False,
) -> None:
    """Run many jobs in one process (TensorFlow is imported once): a JSON Lines file of jobs, or one command
    over many files (--each GLOB -- COMMAND ARGS...)."""
    from attnviz.batch.running import run_batch
    from attnviz.cli.runner import Runner

    with user_errors():
        failed = run_batch(jobs or [], each, shard, results, resume, workers, fail_fast, json_out, quiet,
                           runner=Runner.of(ctx))
    if failed:
        raise typer.Exit(1)

"""``attnviz batch``: the command (its options and help); the batch itself is ``attnviz.batch``, handed
the runner that runs this command (``attnviz.cli.runner.Runner.of``) to run each job."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from attnviz.cli.errors import user_errors
from attnviz.cli.options import OUTPUT
from attnviz.cli.parsers import checked_option
from attnviz.cli.runner import Runner
from attnviz.streams import err_console, out_console, stdout

if TYPE_CHECKING:
    from attnviz.batch.running import BatchOutcome


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
    with user_errors():
        outcome = run_batch_command(jobs or [], each, shard, results, resume, workers, fail_fast, json_out, quiet,
                                    Runner.of(ctx))
    if not outcome.ok:
        raise typer.Exit(1)


def run_batch_command(spec: list[str], each: str | None, shard: str | None, results_path: str | None, resume: bool,
                      workers: int, fail_fast: bool, json_out: bool, quiet: bool, runner: Runner) -> BatchOutcome:
    """Plan the batch, say what --resume found, run the jobs under a progress bar (stderr), and print
    the summary: a table, or JSON with --json (stdout)."""
    import json

    from attnviz.batch.running import plan_batch, run_batch

    plan = plan_batch(spec, each, shard, results_path, resume, runner=runner)
    err = err_console()
    if plan.resumed and not quiet:
        err.print(f"resume: {len(plan.before)} of {len(plan.jobs)} jobs done before ({results_path}); running "
                  f"{len(plan.todo)}" + (f"; {plan.unreadable} unreadable line(s) ignored" if plan.unreadable else ""),
                  style="dim")
    if plan.torn:
        err.print(f"warning: --results {results_path}: its last line was cut short (a run stopped, or its disk "
                  "filled, while writing it); dropped it, and that job runs again", style="yellow")
    if quiet or not plan.todo:
        outcome = run_batch(plan, runner=runner, workers=workers, fail_fast=fail_fast)
    else:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        with Progress(TextColumn("batch"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), console=err,
                      transient=False) as bar:
            task = bar.add_task("jobs", total=len(plan.todo))
            outcome = run_batch(plan, runner=runner, workers=workers, fail_fast=fail_fast,
                                progress=lambda: bar.advance(task))
    if json_out:
        stdout().write(json.dumps(outcome.document()) + "\n")
    elif not quiet:
        from attnviz.render.summaries import batch_table

        out_console().print(batch_table(outcome), crop=False)
    return outcome

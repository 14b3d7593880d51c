"""Many attnviz commands in one process (``attnviz batch``): the jobs (``jobs``: a JSON Lines file, or
one command over many files with ``filemaps``), which of them this shard runs (``shards``), the
results manifest (``results``) and running them (``running``).

The package runs commands without knowing the command line: it is handed a ``Runner`` (the command
line's in-process runner) that executes ``attnviz ARGV`` with the streams of ``attnviz.streams``.
"""

from __future__ import annotations

from typing import Protocol


class Runner(Protocol):
    """What a batch needs of the command line: run one command line in this process, and know its
    commands."""

    def execute(self, argv: list[str], /) -> int:
        """Run ``attnviz ARGV`` in this process (its output on ``attnviz.streams``' stdout and stderr,
        its errors worded there) and return its exit status."""
        ...

    def commands(self) -> set[str]:
        """The commands a batch job may run."""
        ...

    def takes_quiet(self, command: str, /) -> bool:
        """Whether ``command`` has --quiet (a batch adds it to its jobs)."""
        ...

"""MkDocs hook: each command page's ``<!-- attnviz-help: NAME -->`` becomes that command's ``--help``,
as the installed attnviz prints it when the site is built, so the pages cannot drift from the tool."""

from __future__ import annotations

import re
from typing import Any

MARK = re.compile(r"<!-- attnviz-help: ([\w-]+) -->")


def command_help(name: str) -> str:
    from typer.testing import CliRunner

    from attnviz.cli import app

    result = CliRunner().invoke(app, [name, "--help"], env={"COLUMNS": "100", "TERM": "dumb", "NO_COLOR": "1"})
    if result.exit_code != 0:
        raise RuntimeError(f"attnviz {name} --help failed: {result.output}")
    return result.stdout.rstrip()


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    return MARK.sub(lambda m: "```text\n" + command_help(m.group(1)) + "\n```", markdown)

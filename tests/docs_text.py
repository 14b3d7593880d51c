"""The documentation as the tests read it: README.md and the pages of ``docs/`` in the order of
mkdocs.yml's navigation, and the sections of a page by heading (any level)."""

from __future__ import annotations

import re
from pathlib import Path

from tests.conftest import ROOT

DOCS = ROOT / "docs"


def pages() -> list[Path]:
    """The docs pages in navigation order."""
    nav = (ROOT / "mkdocs.yml").read_text().split("\nnav:", 1)[1]
    return [DOCS / m.group(1) for m in re.finditer(r"^\s*- (?:[^:\n]+: )?([\w/.-]+\.md)\s*$", nav, re.M)]


def page(name: str) -> str:
    return (DOCS / name).read_text()


def section(text: str, title: str) -> str:
    """The part of ``text`` under the first heading whose words start with ``title``, up to the next
    heading of the same or a higher level (fenced code is not read as headings)."""
    lines = text.splitlines(keepends=True)
    fence = False
    start = level = None
    for i, line in enumerate(lines):
        if line.startswith("```"):
            fence = not fence
            continue
        m = re.match(r"^(#{1,6}) (.*)$", line)
        if fence or not m:
            continue
        if start is None and m.group(2).strip().startswith(title):
            start, level = i, len(m.group(1))
        elif start is not None and len(m.group(1)) <= level:
            return "".join(lines[start:i])
    if start is None:
        raise AssertionError(f"no heading starts with {title!r}")
    return "".join(lines[start:])

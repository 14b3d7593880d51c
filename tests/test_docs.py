"""The documentation site (issue 21): ``mkdocs build --strict`` (warnings are errors: a broken link, a
page left out of the navigation, an API name the reference cannot find), offline; every command's page
carries the command's current ``--help``; the built pages load nothing from the network."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from attnviz.cli import app
from tests.conftest import ROOT
from tests.docs_text import DOCS, pages

pytest.importorskip("mkdocs")
pytest.importorskip("mkdocstrings")


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    out = tmp_path_factory.mktemp("site")
    r = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)], cwd=ROOT,
                       capture_output=True, text=True, env={"PATH": "/usr/bin:/bin", "NO_MKDOCS_2_WARNING": "1",
                                                            "HOME": str(out), "COLUMNS": "100"})
    assert r.returncode == 0, r.stdout + r.stderr
    assert "WARNING" not in r.stderr, r.stderr
    return out


def test_every_page_is_in_the_navigation():
    listed = {p.relative_to(DOCS) for p in pages()}
    found = {p.relative_to(DOCS) for p in DOCS.rglob("*.md")}
    assert listed == found


def test_the_site_builds_strict_and_offline(site):
    html = list(site.rglob("*.html"))
    assert len(html) >= len(pages())
    for path in html:
        text = path.read_text()
        loads = re.findall(r'<(?:script|link|img|iframe)[^>]+(?:src|href)="(https?://[^"]+)"', text)
        assert loads == [], f"{path.name} loads {loads[:3]} from the network"


@pytest.mark.parametrize("name", ["scaled", "inspect", "batch"])
def test_command_pages_carry_the_current_help(site, name):
    text = (site / "commands" / f"{name}.html").read_text()
    usage = CliRunner().invoke(app, [name, "--help"], env={"COLUMNS": "100"}).stdout.splitlines()[0].strip()
    assert usage.startswith(f"Usage: attnviz {name}") and usage in text


def test_the_api_reference_is_built_from_the_docstrings(site):
    text = (site / "python.html").read_text()
    for name in ("compute", "inspect", "compare", "rollout", "load", "Computed", "Inspected"):
        assert "attnviz.api." in text and name in text
    assert "Compute the attention type" in text  # compute's docstring

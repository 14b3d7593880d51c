"""The project's own promises: every variant documented, samples reproducible, README and CI in step,
lint and types clean."""

from __future__ import annotations

import dataclasses
import re
import subprocess
import sys

import numpy as np
import pytest

from attnviz.cli.options import OUTPUT_OPTIONS, PARAM_OPTIONS, RUN_OPTIONS
from attnviz.variants import REGISTRY
from tests.conftest import ROOT, SAMPLES

README = (ROOT / "README.md").read_text()


@pytest.mark.parametrize("name", list(REGISTRY))
def test_every_variant_is_documented(name):
    v = REGISTRY[name]
    assert len(v.doc.strip()) > 200 and v.formula and v.summary
    text = (ROOT / "docs" / "commands" / f"{name}.md").read_text()
    assert text.startswith(f"# `attnviz {name}`"), f"docs/commands has no page for {name}"
    assert f"<!-- attnviz-help: {name} -->" in text  # its --help, put in when the site is built


@pytest.mark.parametrize("name", list(REGISTRY))
def test_variant_options_do_not_clash_with_shared_ones(name):
    shared = {p.name for p in [*RUN_OPTIONS, *OUTPUT_OPTIONS, *PARAM_OPTIONS]}
    fields = dataclasses.fields(REGISTRY[name].params)
    own = [f.name for f in fields] + [i.name for i in REGISTRY[name].inputs]
    assert len(own) == len(set(own)) and not set(own) & shared
    flags = [f.metadata.get("flag", "--" + f.name.replace("_", "-")) for f in fields]
    assert len(flags) == len(set(flags))


def test_readme_opens_with_the_two_commands_and_ci_runs_them():
    first_block = re.search(r"```(?:sh|bash)?\n(.*?)```", README, re.S).group(1)
    commands = [ln for ln in first_block.splitlines() if ln.strip() and not ln.startswith("#")]
    assert len(commands) == 2
    assert "attnviz scaled sample_inputs/" in commands[0] and "pytest" in commands[1]
    ci = (ROOT / ".ci" / "run").read_text()
    assert "README.md" in ci  # CI takes its commands from the README, so they cannot drift apart


def test_samples_are_what_the_script_makes(tmp_path):
    sys.path.insert(0, str(SAMPLES))
    try:
        import make_samples
    finally:
        sys.path.remove(str(SAMPLES))
    make_samples.main(tmp_path)
    for path in tmp_path.iterdir():
        committed = SAMPLES / path.name
        assert committed.exists(), path.name
        if path.suffix == ".npz":
            a, b = np.load(path), np.load(committed)
            assert a.files == b.files
            for key in a.files:
                np.testing.assert_array_equal(a[key], b[key])
        else:
            assert path.read_bytes() == committed.read_bytes(), path.name


def test_ruff():
    pytest.importorskip("ruff")
    out = subprocess.run([sys.executable, "-m", "ruff", "check", "attnviz", "tests", "benchmarks", "sample_inputs"],
                         cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


def test_mypy():
    pytest.importorskip("mypy")
    out = subprocess.run([sys.executable, "-m", "mypy"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr

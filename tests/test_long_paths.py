"""Every line fits the terminal, with long paths (issue 34, item 3): on a terminal, the messages a command
writes to stderr ("inspect: FILE [shape] read as ...", "saved png to FILE", "FILE: check-rows: passed") and
the lines of text it prints to stdout (a file's "== FILE" heading) have their paths shortened in the middle
(the file name kept) and wrap, so that no line passes ``COLUMNS``. Every command runs on inputs in a folder
whose path is about 200 characters long, with its outputs there too. A terminal is what rich takes for one:
``TTY_COMPATIBLE=1`` here (the command line's own runner), and a real pseudo-terminal once. To a pipe or a
file nothing changes: a message is one line, its paths whole."""

from __future__ import annotations

import os
import re
import shutil

import numpy as np
import pytest
from rich.cells import cell_len
from typer.testing import CliRunner

from attnviz.cli import app
from tests.terminals import run_in_terminal
from tests.test_api import COMPUTE_EXAMPLES, FILE_FLAGS
from tests.test_readme_examples import folder, split_shell  # noqa: F401  (the README's inputs)

runner = CliRunner()
WIDTH = 80
TERMINAL = {"COLUMNS": str(WIDTH), "TTY_COMPATIBLE": "1"}  # rich's switch: stdout and stderr are a terminal
ESCAPES = re.compile(r"\x1b(\[[0-9;?]*[ -/]*[@-~]|\][^\x07\x1b]*(\x07|\x1b\\)|[()][0-9A-Za-z])")
NESTED = ["a_folder_whose_name_is_rather_long"] * 5


def shown_lines(text: str) -> list[str]:
    """The lines a terminal shows: escape sequences out, a carriage return starting the line again."""
    return [re.split(r"\r(?!\n)", line)[-1] for line in ESCAPES.sub("", text).splitlines()]


def assert_fits(result, width: int = WIDTH) -> None:
    for name, text in (("stdout", result.stdout), ("stderr", result.stderr)):
        over = [line for line in shown_lines(text) if cell_len(line) > width]
        assert not over, f"{name}: {len(over)} lines wider than {width}, e.g. {over[0]!r} ({cell_len(over[0])})"


@pytest.fixture(scope="module")
def deep(folder, tmp_path_factory):  # noqa: F811
    """The README's input files, and weights for inspect, in a folder ~200 characters deep."""
    d = tmp_path_factory.mktemp("long").joinpath(*NESTED)
    shutil.copytree(folder, d)
    rng = np.random.default_rng(0)
    np.save(d / "weights_of_a_model_with_a_long_name.npy",
            rng.dirichlet(np.ones(12), size=(2, 1, 2, 12)).astype(np.float32))
    shutil.copy(d / "weights_of_a_model_with_a_long_name.npy", d / "the_same_weights_under_another_long_name.npy")
    (d / "tokens_of_the_sentence.txt").write_text("".join(f"tok{i}\n" for i in range(12)))
    (d / "jobs.jsonl").write_text(
        f'{{"command": "inspect", "args": ["{d}/weights_of_a_model_with_a_long_name.npy"], '
        f'"options": {{"png": "{d}/from_the_batch.png"}}}}\n'
        f'{{"command": "rollout", "args": ["{d}/missing_weights_with_a_long_name.npy"]}}\n')
    assert len(str(d)) > 2 * WIDTH
    return d


def absolute(argv: list[str], d) -> list[str]:
    """A README example's arguments with every file, read or written, as its path in ``d``."""
    out = []
    for i, a in enumerate(argv):
        written = i > 0 and argv[i - 1] in FILE_FLAGS
        out.append(str(d / a) if written or (d / a.split(":")[0]).is_file() else a)
    return out


def one_per_type() -> list[list[str]]:
    seen, lines = set(), []
    for line in COMPUTE_EXAMPLES:
        argv = split_shell(line)[0][1:]
        if argv[0] not in seen:
            seen.add(argv[0])
            lines.append(argv)
    return lines


W, W2, TOK = "weights_of_a_model_with_a_long_name.npy", "the_same_weights_under_another_long_name.npy", \
    "tokens_of_the_sentence.txt"
SHOW = ["--show", "--graphics", "blocks"]  # drawn on a stdout that is not a real terminal
COMMANDS = [
    *[[*argv, "--save-weights", "saved_weights.npy"] for argv in one_per_type()],
    ["scaled", "sample_inputs/sentence.npz", *SHOW, "--png", "sentence.png", "--html", "sentence.html"],
    ["inspect", W, "--labels", TOK, "--check-rows", "--png", "grid.png", "--html", "report.html", *SHOW],
    ["inspect", W, W2, "--check-rows", "--max-rows", "3"],  # a "== FILE" heading before each
    ["compare", W, W2, "--png", "difference.png", *SHOW],
    ["rollout", W, "--labels", TOK, "--png", "rollout.png", *SHOW],
    ["batch", "jobs.jsonl", "--results", "results_of_the_batch.jsonl"],
    ["repeat-test", "5", "--vocab-size", "50", "--save-ids", "probe_ids.npy", "--save-labels", "probe.txt"],
    ["variants"],
]
CODES = {"batch": 1}  # one job of the batch fails (its message names the missing file)


@pytest.mark.parametrize("argv", COMMANDS, ids=[" ".join(a[:2]) for a in COMMANDS])
def test_every_line_of_every_command_fits_the_terminal(argv, deep, monkeypatch):
    monkeypatch.chdir(deep)
    flags = {"--labels", "--results", "--save-ids", "--save-labels", "--png", "--html", "--save-weights"}
    argv = [str(deep / a) if (i and argv[i - 1] in flags) or a in (W, W2, "jobs.jsonl") else a
            for i, a in enumerate(absolute(argv, deep))]
    assert any(str(deep) in a for a in argv) or argv == ["variants"]
    result = runner.invoke(app, argv, env=TERMINAL)
    assert result.exit_code == CODES.get(argv[0], 0), (result.stdout, result.stderr)
    assert_fits(result)
    if "--png" in argv:  # the message still names the file: its start and its name
        name = os.path.basename(argv[argv.index("--png") + 1])
        assert any(line.startswith("saved png to /") and line.endswith(name) for line in
                   shown_lines(result.stderr)), result.stderr


def test_to_a_pipe_a_message_is_one_line_with_its_paths_whole(deep, monkeypatch):
    monkeypatch.chdir(deep)
    target = str(deep / "grid_to_a_pipe.png")
    result = runner.invoke(app, ["inspect", str(deep / W), "--png", target], env={"COLUMNS": str(WIDTH)})
    assert result.exit_code == 0, result.stderr
    assert f"saved png to {target}\n" in result.stderr
    assert f"inspect: {deep / W} [2, 1, 2, 12, 12] read as" in result.stderr


def test_inspect_show_in_a_real_terminal(deep):
    """The issue's case: ``inspect /long/path/blk.npy --show`` on an 80-column terminal (stdout and stderr
    both on it, ``COLUMNS`` unset): the heading "inspect: FILE [..] read as ..." was 102 characters wide."""
    code, text = run_in_terminal(["inspect", deep / W, "--show", "--png", deep / "pty.png"], width=WIDTH)
    assert code == 0, text
    lines = shown_lines(text)
    assert any(line.startswith("inspect: /") for line in lines), text
    over = [line for line in lines if cell_len(line) > WIDTH]
    assert not over, over


@pytest.mark.parametrize("line,width,expected", [
    ("saved png to /a/bb/ccc/dddd/eeeee/ffffff/ggggggg/out.png", 40, "saved png to /a/bb/ccc/dddd/eee…/out.png"),
    ("short enough /a/b.png", 40, "short enough /a/b.png"),
    ("A = /x/yyyyyyyyyyyyyyyy/a.npy, B = /x/yyyyyyyyyyyyyyyyyyyyyyyyyyyyyy/b.npy", 60,
     "A = /x/yyyyyyyyyyyyyyyy/a.npy, B = /x/yyyyyyyyyyyyyyy…/b.npy"),  # the longer one only
])
def test_fit_paths(line, width, expected):
    from attnviz.text import fit_paths

    assert fit_paths(line, width, floor=12) == expected
    assert len(expected) <= width


def test_middle_keeps_the_file_name_and_both_ends():
    from attnviz.text import middle

    assert middle("/" + "d" * 50 + "/name.npy", 20) == "/ddddddddd…/name.npy"
    assert middle("x" * 30, 9) == "xx…xxxxxx" and len(middle("y" * 100, 10)) == 10

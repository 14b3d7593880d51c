"""Tables printed without colour (to a pipe or a file) are laid out line by line by
``attnviz.render.table.plain_table``, not cell by cell by rich: the text must be rich's own, to the
character. rich is the oracle: every command that prints tables runs twice, once with the plain path
turned off, over widths from a narrow terminal (where columns are dropped and labels cut) to a wide one."""

from __future__ import annotations

import numpy as np
import pytest
from typer.testing import CliRunner

from attnviz.cli import app
from attnviz.render import table as tables
from tests.conftest import SAMPLES

runner = CliRunner()


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tables")
    rng = np.random.default_rng(0)
    n = 30
    scores = rng.normal(size=(3, 2, 4, n, n)) * 2
    scores[..., :, :4] = -np.inf  # left padding: keys 0-3
    w = np.exp(scores - scores.max(-1, keepdims=True))
    w = (w / w.sum(-1, keepdims=True)).astype(np.float32)
    np.save(folder / "w.npy", w)
    causal = np.tril(np.ones((n, n), bool))
    c = np.where(causal, rng.random((2, 1, 3, n, n)), 0.0)
    np.save(folder / "c.npy", (c / c.sum(-1, keepdims=True)).astype(np.float32))
    labels = ["[CLS]", "猫が", "sat:on", "a" * 40, "\u00e9t\u00e9", "[x]", ":smile:", *[f"t{i}" for i in range(n - 7)]]
    (folder / "tok.txt").write_text("\n".join(labels) + "\n", encoding="utf-8")
    pad = np.ones((2, n), bool)
    pad[:, :4] = False
    np.save(folder / "pad.npy", pad)
    return folder


COMMANDS = [
    ["inspect", "{f}/w.npy"],
    ["inspect", "{f}/w.npy", "--labels", "{f}/tok.txt", "--mask", "{f}/pad.npy", "--mask-convention", "keep"],
    ["inspect", "{f}/w.npy", "--labels", "{f}/tok.txt", "--sort", "entropy", "--top", "5", "--max-rows", "6"],
    ["inspect", "{f}/c.npy", "--max-cols", "0", "--precision", "4"],
    ["inspect", "{f}/c.npy", "--max-cols", "3", "--max-rows", "0", "--sort", "head", "--reverse"],
    ["scaled", "{s}/sentence.npz", "--index", "1"],
    ["scaled", "{s}/sentence.npz", "--causal", "--max-cols", "4", "--precision", "2"],
    ["sparse", "{s}/q.npy", "{s}/k.npy", "{s}/v.npy"],
    ["multihead", "{s}/q.npy", "{s}/k.npy", "{s}/v.npy", "--heads", "2", "--seed", "0"],
]


@pytest.mark.parametrize("argv", COMMANDS, ids=lambda a: " ".join(a[:1] + [x.rsplit("/", 1)[-1] for x in a[1:]]))
def test_plain_tables_are_richs_tables_to_the_character(argv, files, monkeypatch):
    args = [a.format(f=files, s=SAMPLES) for a in argv]
    used = []
    fast = tables.plain_table

    def counted(*a):
        got = fast(*a)
        used.append(got is not None)
        return got

    for columns in ("30", "52", "80", "200"):
        env = {"COLUMNS": columns}
        monkeypatch.setattr(tables, "plain_table", lambda *a: None)
        theirs = runner.invoke(app, args, env=env)
        monkeypatch.setattr(tables, "plain_table", counted)
        ours = runner.invoke(app, args, env=env)
        assert theirs.exit_code == ours.exit_code == 0, (theirs.stderr, ours.stderr)
        assert ours.stdout == theirs.stdout, f"COLUMNS={columns}"
        assert ours.stderr == theirs.stderr
    assert any(used), "no table took the plain path"


def test_a_pipe_gets_the_whole_head_table(tmp_path):
    """Written to a pipe (no terminal, no COLUMNS) the head table keeps every column, where a terminal of 80
    columns drops some to fit (a long tag: "sink, duplicate-token")."""
    tokens = [t for pair in zip("aaaaaa", "uvwxyz") for t in pair]  # "a" at 0, 2, ..., 10
    n = len(tokens)
    w = np.zeros((2, 1, 2, n, n), np.float32)
    w[..., 0] = 1.0  # every row on the first token, the earlier occurrences of "a" among them
    np.save(tmp_path / "w.npy", w)
    (tmp_path / "tok.txt").write_text("".join(f"{t}\n" for t in tokens))
    args = ["inspect", str(tmp_path / "w.npy"), "--labels", str(tmp_path / "tok.txt"), "--max-rows", "2",
            "--max-cols", "3"]
    narrow = runner.invoke(app, args, env={"COLUMNS": "80"})
    assert narrow.exit_code == 0, narrow.stderr
    assert "left out to fit the terminal" in narrow.stdout  # the table is wider than 80 columns
    piped = runner.invoke(app, args, env={"COLUMNS": None})
    assert piped.exit_code == 0, piped.stderr
    assert "left out to fit" not in piped.stdout
    header = next(line.split() for line in piped.stdout.splitlines() if line.split()[:2] == ["layer", "head"])
    assert header[-5:] == ["last", "max", "ind", "dup", "tag"]
    assert "sink, duplicate-token" in piped.stdout


def test_no_table_keeps_the_head_table_that_was_sorted(files):
    args = ["inspect", str(files / "w.npy"), "--no-table"]
    assert runner.invoke(app, args).stdout == ""
    r = runner.invoke(app, [*args, "--sort", "previous", "--top", "5"])
    assert r.exit_code == 0, r.stderr
    assert "head statistics (by previous)" in r.stdout
    rows = [line.split() for line in r.stdout.splitlines() if line.split()[:1] and line.split()[0].isdigit()]
    assert len(rows) == 5
    assert "per-query statistics" not in r.stdout and "weights of" not in r.stdout


def test_top_k_leaves_masked_keys_out(tmp_path):
    """Left padding: row 4 may attend to keys 3 and 4 only; its top-3 names those two, never a padded key."""
    n = 6
    w = np.zeros((1, 1, 1, n, n), np.float32)
    for i in range(n):
        w[0, 0, 0, i, 3:i + 1] = 1 / max(i - 2, 1) if i >= 3 else 0.0
    np.save(tmp_path / "w.npy", w)
    keep = np.ones((1, n), bool)
    keep[:, :3] = False
    np.save(tmp_path / "pad.npy", keep)
    (tmp_path / "tok.txt").write_text("<pad>\n<pad>\n<pad>\nThe\ncat\nsat\n")
    r = runner.invoke(app, ["inspect", str(tmp_path / "w.npy"), "--mask", str(tmp_path / "pad.npy"),
                            "--labels", str(tmp_path / "tok.txt")])
    assert r.exit_code == 0, r.stderr
    lines = r.stdout.split("per-query statistics")[1].splitlines()
    row = next(line for line in lines if "4 cat" in line)
    assert "3 The: 0.500" in row and "4 cat: 0.500" in row and "<pad>" not in row

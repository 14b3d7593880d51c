"""The terminal (issue 12, item 4): tables that fit the width, help in sections with the usage line as
typed, shell completion, and a closed pipe that is no error.

Widths are terminal cells (``rich.cells.cell_len``: a CJK character counts two), measured on what the
command line prints, at ``COLUMNS=80`` and ``120``. The tables' contents are checked against NumPy
(top-k entries from an argsort of the weights), not against attnviz's own statistics.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from rich.cells import cell_len
from typer.testing import CliRunner

from attnviz.cli import app
from attnviz.cli.completion import SHELL_CHOICES
from attnviz.variants import REGISTRY
from attnviz.worker import client
from tests.conftest import ROOT, SAMPLES

runner = CliRunner()
WIDTHS = (80, 120)
SENTENCE = str(SAMPLES / "sentence.npz")
TOKENS = str(SAMPLES / "tokens.txt")
LONG_WORDS = ["the", "Supercalifragilistic", "expialidocious", "[CLS]", "antidisestablishmentarianism", "cat",
              "日本語のトークン", "##ing", "Pneumonoultramicroscopicsilicovolcanoconiosis", "."]


def run(*args, columns=80, input=None):
    result = runner.invoke(app, [str(a) for a in args], env={"COLUMNS": str(columns)}, input=input)
    assert result.exit_code == 0, (result.stdout, result.stderr)
    return result


def widest(text: str) -> int:
    return max((cell_len(line) for line in text.splitlines()), default=0)


def assert_fits(text: str, width: int) -> None:
    over = [line for line in text.splitlines() if cell_len(line) > width]
    assert not over, f"{len(over)} lines wider than {width}, e.g. {over[0]!r} ({cell_len(over[0])})"


def tables(text: str) -> list[list[str]]:
    """The lines of each boxed table (from its top rule ┏ to its bottom rule └)."""
    found, current = [], None
    for line in text.splitlines():
        if line.lstrip().startswith("┏"):
            current = []
        if current is not None:
            current.append(line.strip())
            if line.lstrip().startswith("└"):
                found.append(current)
                current = None
    return found


def header_cells(table: list[str]) -> list[list[str]]:
    """The header lines of a table, split into cells."""
    end = next(i for i, line in enumerate(table) if line.startswith("┡"))
    return [[c.strip() for c in line.strip("┃").split("┃")] for line in table[1:end]]


def body(table: list[str]) -> list[list[str]]:
    start = next(i for i, line in enumerate(table) if line.startswith("┡"))
    return [[c.strip() for c in line.strip("│").split("│")] for line in table[start + 1:-1]]


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    """Files for every command and a model dump of 12 layers x 24 heads of 64 tokens, labelled with long
    and wide tokens."""
    d = tmp_path_factory.mktemp("terminal")
    rng = np.random.default_rng(0)
    scores = rng.normal(size=(12, 1, 24, 64, 64)).astype(np.float32) * 3
    w = np.exp(scores - scores.max(-1, keepdims=True))
    w /= w.sum(-1, keepdims=True)
    np.save(d / "w24.npy", w.astype(np.float32))
    other = w.copy()
    other[3, 0, 7] = np.roll(other[3, 0, 7], 1, axis=-1)
    np.save(d / "w24b.npy", other.astype(np.float32))
    (d / "tok64.txt").write_text("\n".join(LONG_WORDS[i % len(LONG_WORDS)] for i in range(64)) + "\n")
    np.save(d / "adjacency.npy", np.ones((7, 7)))
    np.save(d / "x300.npy", rng.normal(size=(300, 8)).astype(np.float32))
    return d


def compute_args(name: str, d: Path) -> list[str]:
    """Each compute command on the sample sentence (2 slices of 7 tokens), labelled."""
    labels = ["--labels", TOKENS]
    cases = {
        "multihead": [f"{SENTENCE}:q", "--heads", "16", "--key-dim", "4", *labels],  # 16 heads
        "self": [f"{SENTENCE}:q", *labels], "pooling": [f"{SENTENCE}:q", *labels],
        "hierarchical": [f"{SENTENCE}:q", *labels],
        "coattention": [f"{SENTENCE}:q", f"{SENTENCE}:k", "--q-labels", TOKENS, "--k-labels", TOKENS],
        "bidirectional": [f"{SENTENCE}:q", f"{SENTENCE}:k", "--q-labels", TOKENS, "--k-labels", TOKENS],
        "structured": [f"{SENTENCE}:q", "--adjacency", str(d / "adjacency.npy"), *labels],
        "local": [SENTENCE, "--window", "2", *labels],
    }
    return cases.get(name, [SENTENCE, *labels])


# ----------------------------------------------------------------------------------------------
# Tables fit the width


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("name", list(REGISTRY))
def test_every_compute_command_fits(inputs, name, width):
    out = run(name, *compute_args(name, inputs), columns=width).stdout
    assert tables(out), out
    assert_fits(out, width)


@pytest.mark.parametrize("width", WIDTHS)
def test_inspect_of_24_heads_with_long_labels_fits(inputs, width):
    # a map of 64 rows: its weights tables when asked for (--max-rows; by default a line says how)
    out = run("inspect", inputs / "w24.npy", "--labels", inputs / "tok64.txt", "--max-rows", "40", columns=width).stdout
    assert "head statistics" in out and len(tables(out)) == 2
    assert_fits(out, width)
    weights = tables(out)[0]
    assert len(header_cells(weights)) == 1  # headers are never folded over lines
    head = header_cells(weights)[0]
    assert head.count("…") == 1 and head[-1] == "[CLS]"  # 64 keys do not fit: the middle ones are elided
    assert re.search(r"not shown: rows \d+-\d+ of 64, columns \d+-\d+ of 64", " ".join(out.split()))


@pytest.mark.parametrize("width", WIDTHS)
def test_compare_fits(inputs, width):
    out = run("compare", inputs / "w24.npy", inputs / "w24b.npy", columns=width).stdout
    assert "Jensen-Shannon" in out and "layer 3, batch 0, head 7" in out
    assert_fits(out, width)


@pytest.mark.parametrize("width", WIDTHS)
def test_variants_table_fits(width):
    assert_fits(run("variants", columns=width).stdout, width)


def test_the_width_is_80_on_a_pipe_and_columns_when_set():
    from attnviz.streams import output_width

    class Pipe:
        def isatty(self):
            return False

    saved = os.environ.pop("COLUMNS", None)
    try:
        assert output_width(Pipe()) == 80
        os.environ["COLUMNS"] = "97"
        assert output_width(Pipe()) == 97
    finally:
        os.environ.pop("COLUMNS", None)
        if saved is not None:
            os.environ["COLUMNS"] = saved


def test_piped_is_80_wide_even_beside_a_wide_terminal(inputs):
    """stdout on a pipe, stdin a terminal 200 columns wide (``attnviz ... | less``): 80, not 200."""
    import fcntl
    import struct
    import termios

    master, slave = os.openpty()
    try:
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 200, 0, 0))
        env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
        env["ATTNVIZ_NO_SERVER"] = "1"
        out = subprocess.run([sys.executable, "-m", "attnviz", "inspect", str(inputs / "w24.npy"), "--labels",
                              str(inputs / "tok64.txt"), "--max-rows", "6"], capture_output=True, text=True, env=env,
                             cwd=ROOT, timeout=120, stdin=slave)
    finally:
        os.close(slave)
        os.close(master)
    assert out.returncode == 0, out.stderr
    assert_fits(out.stdout, 80)
    assert widest(out.stdout) > 70  # laid out for 80, not for something narrower


# ----------------------------------------------------------------------------------------------
# What the tables show when space is short


def expected_entries(w: np.ndarray, k: int = 3) -> list[list[tuple[int, str]]]:
    """Each row's top-k keys and weights, largest first, ties to the lower index (a stable argsort)."""
    order = np.argsort(-w, axis=-1, kind="stable")[:, :k]
    return [[(int(j), f"{w[i, j]:.3f}") for j in order[i]] for i in range(w.shape[0])]


@pytest.mark.parametrize("width", WIDTHS)
def test_top_k_entries_are_never_split(inputs, width):
    w = np.load(inputs / "w24.npy")[0, 0, 0]
    out = run("inspect", inputs / "w24.npy", "--labels", inputs / "tok64.txt", "--max-rows", "0",
              columns=width).stdout
    stats = tables(out)[1]
    text = "\n".join(stats)
    for i, entries in enumerate(expected_entries(w)):
        for j, weight in entries:
            # index, (shortened) label and weight on one line of the table
            pattern = re.compile(rf"(^|[│ ]){j} [^│:]*: {re.escape(weight)}( |│)", re.MULTILINE)
            assert pattern.search(text), (i, j, weight)
    assert "Supercalifr…" in text and "Supercalifragilistic" not in text  # long labels shortened, whole


def test_top_k_on_one_line_when_it_fits():
    from rich.console import Console

    from attnviz.render.table import stats_table
    from attnviz.stats import row_stats

    w = np.array([[0.7, 0.2, 0.1, 0.0], [0.1, 0.1, 0.3, 0.5]])
    console = Console(width=120, record=True, file=open(os.devnull, "w"))  # noqa: SIM115
    console.print(stats_table(row_stats(w, None), q_labels=list("abcd"), k_labels=["w", "x", "y", "z"]))
    text = console.export_text()
    assert "0 w: 0.700  1 x: 0.200  2 y: 0.100" in text and "3 z: 0.500  2 y: 0.300  0 w: 0.100" in text
    assert "argmax" in text  # room enough: nothing left out


def test_key_columns_elided_with_a_marker_and_max_cols(inputs):
    w24 = inputs / "w24.npy"
    fitted = header_cells(tables(run("inspect", w24, "--max-rows", "40", columns=80).stdout)[0])[0]
    assert "…" in fitted
    wider = header_cells(tables(run("inspect", w24, "--max-rows", "40", columns=120).stdout)[0])[0]
    assert len(wider) > len(fitted)  # a wider terminal shows more keys
    for n in (1, 2, 4, 5):
        out = run("inspect", w24, "--max-cols", n, "--max-rows", "40", columns=80).stdout
        head = header_cells(tables(out)[0])[0]
        keys = [c for c in head[1:] if c != "…"]
        first = (n + 1) // 2
        assert keys == [str(j) for j in [*range(first), *range(64 - (n - first), 64)]], (n, head)
        assert head.count("…") == 1
        assert f"columns {first}-{63 - (n - first)} of 64" in " ".join(out.split())
    everything = run("inspect", w24, "--max-cols", "0", "--max-rows", "3", columns=80).stdout
    head = header_cells(tables(everything)[0])[0]
    assert head[1:] == [str(j) for j in range(64)] and "…" not in head  # 0: all, at their own width


def test_max_cols_on_a_compute_command(inputs):
    x = inputs / "x300.npy"
    out = run("scaled", x, x, x, "--max-cols", "6", "--max-rows", "4", columns=120).stdout
    head = header_cells(tables(out)[0])[0]
    assert head[1:] == ["0", "1", "2", "…", "297", "298", "299"]
    default = header_cells(tables(run("scaled", x, x, x, "--max-rows", "4", columns=80).stdout)[0])[0]
    assert "…" in default and len(default) > 4


def test_row_labels_are_cut_with_an_ellipsis_not_wrapped(inputs):
    out = run("inspect", inputs / "w24.npy", "--labels", inputs / "tok64.txt", "--max-rows", "14", columns=80).stdout
    weights = tables(out)[0]
    rows = body(weights)
    assert len(rows) == 15  # 14 rows and the ⋮ row: no continuation lines
    labels = [r[0] for r in rows]
    assert labels[1].startswith("1 Supercali") and labels[1].endswith("…")
    assert labels[6].startswith("6 日本語") and labels[6].endswith("…") and cell_len(labels[6]) <= 16
    headers = header_cells(weights)[0]
    assert any(h.startswith("Supercali") and h.endswith("…") for h in headers)


def test_headers_are_shortened_not_folded(inputs):
    for width in WIDTHS:
        out = run("scaled", SENTENCE, "--labels", TOKENS, columns=width).stdout
        for table in tables(out):
            assert len(header_cells(table)) == 1, table[:4]
    narrow = run("scaled", SENTENCE, "--labels", TOKENS, columns=80).stdout
    stats = tables(narrow)[1]
    assert "top-3" in header_cells(stats)[0][-2]


def test_titles_and_notes_wrap_at_words(inputs):
    out = run("inspect", inputs / "w24.npy", "--labels", inputs / "tok64.txt", "--max-rows", "40",
              columns=80).stdout.splitlines()
    top = next(i for i, line in enumerate(out) if line.lstrip().startswith("┏"))
    title = next(i for i, line in enumerate(out) if "weights of" in line)
    assert top - title > 1  # the title takes two lines at 80 columns
    expected = "weights of layer 0, batch 0, head 0 [64, 64] (--layer/--batch/--head pick another)"
    assert " ".join(out[title:top]).split() == expected.split()  # whole words on each line
    bottom = max(i for i, line in enumerate(out) if line.lstrip().startswith("└"))
    assert bottom < len(out) - 2  # the note under the statistics takes several lines
    note = ("H: entropy in nats; H/ln n: normalised by the unmasked key count; argmax: the first top-k entry; "
            "not shown: rows 20-43 of 64 (--max-rows shows more)")
    assert " ".join(out[bottom + 1:]).split() == note.split()
    assert all(cell_len(line) <= 80 for line in out)


# ----------------------------------------------------------------------------------------------
# Help


def test_help_groups_options_in_sections_and_shows_the_usage_line():
    out = run("scaled", "--help").stdout
    assert out.startswith("Usage: attnviz scaled [OPTIONS] Q [K] [V]\n")
    for heading in ("Inputs:", "Masks:", "Labels:", "Device and precision:", "Output:", "scaled options:",
                    "Options:"):
        assert f"\n{heading}\n" in out, heading
    assert re.search(r"^  Q FILE +queries", out, re.MULTILINE)
    assert out.index("Inputs:") < out.index("Masks:") < out.index("\nOptions:")
    assert "--mask-convention [keep|block]" in out and "--precision INTEGER" in out
    learned = run("multihead", "--help").stdout
    assert "Usage: attnviz multihead [OPTIONS] QUERY [VALUE] [KEY]" in learned and "\nLearned parameters:\n" in learned
    inspect = run("inspect", "--help").stdout
    assert "Usage: attnviz inspect [OPTIONS] [WEIGHTS]..." in inspect
    assert "\nChecks (exit 3 when one fails):\n" in inspect
    assert "Usage: attnviz compare [OPTIONS] A B\n" in run("compare", "--help").stdout


@pytest.mark.parametrize("command", [None, *REGISTRY, "inspect", "compare", "batch", "serve", "variants"])
def test_help_fits_80_columns_with_real_metavars(command):
    out = run(*([command] if command else []), "--help", columns=200).stdout
    assert_fits(out, 80)
    assert not re.search(r"<(str|int|float|int range|float range)>|\{[A-Z]", out), out


# ----------------------------------------------------------------------------------------------
# Shell completion


def complete(env: dict[str, str], cwd: Path = ROOT) -> subprocess.CompletedProcess:
    """A shell's completion request: ``attnviz`` run with the request in its environment (``env``, and
    no other variable of attnviz) in ``cwd``. It is answered here by what ``python -m attnviz`` runs for
    it, ``attnviz.cli.console.run`` (a completion request never goes to a warm worker: see
    test_completion_runs_here_and_imports_neither_tensorflow_nor_matplotlib, which makes one in a real
    process, as test_the_bash_script_completes_in_bash does through bash), with its stdout and stderr."""
    import contextlib
    import io

    from attnviz.cli.console import run as console_run

    full = {k: v for k, v in os.environ.items() if not k.startswith(("ATTNVIZ_", "_ATTNVIZ"))}
    full.update(env)
    saved_env, saved_cwd = dict(os.environ), os.getcwd()
    out, err = io.StringIO(), io.StringIO()
    code = None
    try:
        os.environ.clear()
        os.environ.update(full)
        os.chdir(cwd)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                console_run([])
            except SystemExit as exc:
                code = exc.code
    finally:
        os.chdir(saved_cwd)
        os.environ.clear()
        os.environ.update(saved_env)
    return subprocess.CompletedProcess(["attnviz"], code, out.getvalue(), err.getvalue())


def bash_request(words: str, spelling: str = "complete_bash", cwd: Path = ROOT) -> list[str]:
    parts = words.split(" ")
    r = complete({"_ATTNVIZ_COMPLETE": spelling, "COMP_WORDS": words, "COMP_CWORD": str(len(parts) - 1)}, cwd)
    assert r.returncode == 0 and r.stderr == "", r.stderr
    return r.stdout.split("\n")[:-1] if r.stdout else []


def test_completion_script_is_produced():
    bash = run("--show-completion", "bash").stdout
    assert "complete -o default -F _attnviz_completion attnviz" in bash and "_ATTNVIZ_COMPLETE=complete_bash" in bash
    assert "#compdef attnviz" in run("--show-completion", "zsh").stdout
    assert "complete --command attnviz" in run("--show-completion", "fish").stdout
    bad = runner.invoke(app, ["--show-completion", "tcsh"])
    assert bad.exit_code == 2 and "expected one of" in bad.stderr
    help_text = run("--help").stdout
    assert "--install-completion [SHELL]" in help_text and "--show-completion [SHELL]" in help_text


def test_install_completion_for_bash(tmp_path):
    env = {"HOME": str(tmp_path), "COLUMNS": "80"}
    r = runner.invoke(app, ["--install-completion", "bash"], env=env)
    assert r.exit_code == 0, r.stderr
    script = tmp_path / ".bash_completions" / "attnviz.sh"
    assert "_attnviz_completion" in script.read_text()
    assert f"source '{script}'" in (tmp_path / ".bashrc").read_text()
    runner.invoke(app, ["--install-completion", "bash"], env=env)
    assert (tmp_path / ".bashrc").read_text().count("source") == 1  # once


def test_tab_after_an_eager_option_runs_nothing(tmp_path):
    # a completion request only parses: TAB after --install-completion must not install (write ~/.bashrc),
    # --show-completion and --version must not print into the answers; the shells are offered instead
    for words in ("attnviz --install-completion ", "attnviz --install-completion b", "attnviz --show-completion ",
                  "attnviz --version --n"):
        r = complete({"_ATTNVIZ_COMPLETE": "complete_bash", "COMP_WORDS": words,
                      "COMP_CWORD": str(len(words.split(" ")) - 1), "HOME": str(tmp_path), "SHELL": "/bin/bash"})
        assert r.returncode == 0 and r.stderr == "", (words, r.stderr)
        assert "_attnviz_completion" not in r.stdout and "attnviz " not in r.stdout, (words, r.stdout)
        assert list(tmp_path.iterdir()) == [], words
    assert bash_request("attnviz --show-completion ") == list(SHELL_CHOICES)
    assert bash_request("attnviz --install-completion b") == ["bash"]
    assert bash_request("attnviz --version --n") == ["--no-server"]


def test_completion_of_commands_choices_and_options():
    for spelling in ("bash_complete", "complete_bash"):  # Click's and Typer's spellings of the request
        assert bash_request("attnviz sca", spelling) == ["scaled"]
    assert set(bash_request("attnviz s")) == {"scaled", "self", "sparse", "structured", "serve"}
    assert bash_request("attnviz scaled --mask-convention ") == ["keep", "block"]
    assert bash_request("attnviz scaled --device ") == ["auto", "cpu", "gpu"]
    assert bash_request("attnviz scaled --rope-style ") == ["half", "interleaved"]
    assert bash_request("attnviz inspect w.npy --sort e") == ["entropy", "entropy_norm", "entropy_uniform"]
    assert "--mask-convention" in bash_request("attnviz scaled --mask-c")
    assert set(bash_request("attnviz r")) == {"rollout", "repeat-test"}
    assert bash_request("attnviz inspect w.npy --norm ") == ["auto", "linear", "log", "power:0.5", "power:2"]
    assert bash_request("attnviz scaled q.npy --norm p") == ["power:0.5", "power:2"]


def test_completion_of_file_paths(tmp_path):
    for name in ("a.npy", "ab.npz", "tokens.txt", ".hidden.npy"):
        (tmp_path / name).write_bytes(b"")
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "q.npy").write_bytes(b"")
    assert bash_request("attnviz scaled ", cwd=tmp_path) == ["a.npy", "ab.npz", "data/", "tokens.txt"]
    assert bash_request("attnviz scaled a", cwd=tmp_path) == ["a.npy", "ab.npz"]
    assert bash_request("attnviz scaled data/", cwd=tmp_path) == ["data/q.npy"]
    assert bash_request("attnviz scaled a.npy --mask d", cwd=tmp_path) == ["data/"]
    assert bash_request("attnviz scaled a.npy --labels t", cwd=tmp_path) == ["tokens.txt"]
    assert bash_request("attnviz inspect .h", cwd=tmp_path) == [".hidden.npy"]
    zsh = complete({"_ATTNVIZ_COMPLETE": "complete_zsh", "_TYPER_COMPLETE_ARGS": "attnviz scaled a"}, tmp_path)
    assert zsh.stdout.strip() == "_files"  # zsh's own file completion


@pytest.mark.skipif(shutil.which("bash") is None, reason="no bash")
def test_the_bash_script_completes_in_bash(tmp_path):
    (tmp_path / "my data").mkdir()
    (tmp_path / "q.npy").write_bytes(b"")
    env = {k: v for k, v in os.environ.items() if not k.startswith("ATTNVIZ_")}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    script = run("--show-completion", "bash").stdout
    (tmp_path / "completion.sh").write_text(script)
    probe = ("attnviz() { python -m attnviz \"$@\"; }; source completion.sh; "
             "COMP_WORDS=(attnviz sca); COMP_CWORD=1; _attnviz_completion attnviz; echo \"[${COMPREPLY[*]}]\"; "
             "COMP_WORDS=(attnviz scaled m); COMP_CWORD=2; _attnviz_completion attnviz; echo \"[${COMPREPLY[*]}]\"")
    out = subprocess.run(["bash", "--norc", "-c", probe], env=env, cwd=tmp_path, capture_output=True, text=True,
                         timeout=120)
    assert out.stdout.splitlines() == ["[scaled]", "[my data/]"], (out.stdout, out.stderr)


def test_completion_runs_here_and_imports_neither_tensorflow_nor_matplotlib():
    assert client.bypass_reason(["scaled", "q.npy"], {"_ATTNVIZ_COMPLETE": "bash_complete"}) == "shell completion"
    code = ("import sys\nfrom attnviz.cli.console import run\ntry:\n    run([])\nexcept SystemExit:\n    pass\n"
            "sys.stderr.write(' '.join(m for m in ('tensorflow', 'matplotlib', 'keras') if m in sys.modules))")
    env = {k: v for k, v in os.environ.items() if not k.startswith("ATTNVIZ_")}
    env.update(_ATTNVIZ_COMPLETE="complete_bash", COMP_WORDS="attnviz scaled --dev", COMP_CWORD="2")
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.stdout.split() == ["--device"] and out.stderr == "", out.stderr


# ----------------------------------------------------------------------------------------------
# A reader that goes away


def through_pipe(args: list[str], env: dict[str, str], cwd: Path, read_first: bool) -> tuple[int, str, bytes]:
    """Run attnviz with stdout on a pipe closed early: after its first line, or before it writes."""
    p = subprocess.Popen([sys.executable, "-m", "attnviz", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         stdin=subprocess.DEVNULL, env=env, cwd=cwd)
    first = p.stdout.readline() if read_first else b""
    p.stdout.close()
    err = p.stderr.read().decode()
    p.stderr.close()
    return p.wait(timeout=180), err, first


def quiet_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ATTNVIZ_")}
    env.update(COLUMNS="100", **extra)
    return env


CLOSED_PIPE_CASES = [  # (args, whether to read the first line): large tables and JSON, and output that fits a pipe
    (["scaled", "{x}", "{x}", "{x}", "--max-rows", "0", "--max-cols", "0"], True),
    (["scaled", "{x}", "{x}", "{x}", "--json"], False),  # one line: reading it would read it all
    (["inspect", "{w}", "--max-rows", "0"], True),
    (["variants"], False), (["scaled", "--help"], False), (["--version"], False),
]


@pytest.mark.parametrize("args, read_first", CLOSED_PIPE_CASES)
def test_a_closed_pipe_exits_0_quietly(inputs, args, read_first):
    """Cold runs; through a warm worker: tests/test_serve.py (test_a_closed_pipe_through_a_warm_worker)."""
    args = [a.format(x=inputs / "x300.npy", w=inputs / "w24.npy") for a in args]
    code, err, first = through_pipe(args, quiet_env(ATTNVIZ_NO_SERVER="1"), inputs, read_first)
    assert code == 0, err
    assert all(line.startswith(("scaled:", "inspect:")) for line in err.splitlines()), err  # only its usual line
    assert not read_first or first.strip()


def test_a_table_goes_out_in_pieces_with_the_bytes_rich_writes_at_once():
    """``print(table, crop=False)`` writes a long table in pieces as it is rendered: the bytes are those
    rich's own print writes in one go, colours and all."""
    import io

    from rich.console import Console
    from rich.text import Text

    from attnviz.render.table import weights_table
    from attnviz.streams import MessageConsole

    w = np.random.default_rng(3).dirichlet(np.ones(40), size=40).astype(np.float32)
    for table, pieces in ((weights_table(w, max_cols=0, title="t"), 1), (weights_table(w, max_rows=8), 0)):
        for terminal in (False, True):
            outs = []
            for kind in (Console, MessageConsole):
                out = io.StringIO()
                console = kind(file=out, width=100, highlight=False, markup=False, emoji=False,
                               force_terminal=terminal, color_system="truecolor" if terminal else None)
                console.print(table, crop=False, markup=False, emoji=False)
                outs.append(out.getvalue())
            assert outs[1] == outs[0]
            assert len(outs[0]) > pieces * MessageConsole.PIECE  # the whole map: more than one piece
    for text in (Text("x" * 20_000, style="bold"), Text("a\nb", end="")):  # text is printed whole, with print's end
        outs = []
        for kind in (Console, MessageConsole):
            out = io.StringIO()
            kind(file=out, width=100, force_terminal=True, color_system="truecolor").print(text, crop=False)
            outs.append(out.getvalue())
        assert outs[1] == outs[0] and outs[0].endswith("\n")


def test_a_reader_that_goes_away_stops_the_rendering():
    """Once a piece of a table finds its reader gone, the console is silenced and the rest of the table
    is neither rendered nor written."""
    import io

    from rich.segment import Segment

    from attnviz.streams import MessageConsole

    rendered = []

    class Lines:  # a long renderable that counts the lines rendered
        def __rich_console__(self, console, options):
            for i in range(10_000):
                rendered.append(i)
                yield Segment(f"line {i:5d} " + "x" * 90)
                yield Segment.line()

    class ClosedAfterOneWrite(io.StringIO):  # a pipe whose reader reads one piece and goes away
        writes = 0

        def write(self, text):
            self.writes += 1
            if self.writes > 1:
                raise BrokenPipeError
            return super().write(text)

    out = ClosedAfterOneWrite()
    console = MessageConsole(file=out, width=100)
    console.print(Lines(), crop=False)
    assert console.quiet and out.writes == 2
    assert out.getvalue().startswith("line     0 xxx") and out.getvalue().endswith("x\n")
    assert len(rendered) <= 3 * MessageConsole.PIECE // 100  # two pieces of about PIECE characters, of 10 000 lines
    console.print(Lines(), crop=False)  # a silenced console renders nothing more
    assert len(rendered) <= 3 * MessageConsole.PIECE // 100

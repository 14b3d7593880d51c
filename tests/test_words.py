"""The words of the errors a new user meets first, through the command line: each one line on stderr, exit 1 (bad
data) or 2 (usage), naming the file and what was wrong with it in the user's own terms. Junk bytes given as a text
(``--text @FILE``, ``--text-file``, a corpus) are "not text", never "not JSON text" or "text must be UTF-8 text"; an
empty ``--text-file`` is named, not asked for; ``--shard 0/0`` says what COUNT is; a model folder whose weights do
not fit its config names the parameters and their shapes (transformers' report is a log line attnviz hides), and a
config transformers refuses gives the cause under its validator's heading. ``--sort`` takes a statistic's name or
the header its table prints (``sink``, ``punct``, ``diag``, ``self``), and a corpus file's token classes."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from attnviz.cli import app
from tests.conftest import LazyModule

torch = LazyModule("torch")  # imported when a test first uses it: not while every worker collects
transformers = LazyModule("transformers")

VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", ".", ",", *"the a cat sat on mat dog ran fast".split()]
LINES = "the cat sat on the mat.\na dog ran fast, the cat sat.\nthe dog sat on a mat.\n"


@pytest.fixture(scope="module")
def bert(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("words") / "bert"
    folder.mkdir()
    (folder / "vocab.txt").write_text("\n".join(VOCAB) + "\n")
    tok = transformers.BertTokenizerFast(str(folder / "vocab.txt"))
    torch.manual_seed(0)
    cfg = transformers.BertConfig(vocab_size=len(VOCAB), hidden_size=16, num_hidden_layers=2, num_attention_heads=4,
                                  intermediate_size=32, max_position_embeddings=32)
    transformers.BertModel(cfg).save_pretrained(str(folder))
    tok.save_pretrained(str(folder))
    return folder


def _run(*args: str):
    done = CliRunner().invoke(app, list(args))
    assert done.exception is None or isinstance(done.exception, SystemExit), (done.exception, done.stderr)
    return done


def _one_line(done, code: int, *words: str, never: tuple[str, ...] = ()) -> str:
    """The run's stderr: one line, exit ``code``, holding every word and none of ``never``."""
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.exit_code == code, done.stderr
    assert len(lines) == 1 and lines[0].startswith("attnviz: error: "), done.stderr
    for word in words:
        assert word in lines[0], (word, lines[0])
    for word in never:
        assert word not in lines[0], (word, lines[0])
    return lines[0]


# -- junk bytes given as text


JUNK = {"nul.txt": (b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR", "holds binary data (a NUL byte at offset 8), not text"),
        "latin.txt": ("caf\xe9 au lait\n".encode("latin-1"), "not UTF-8 text (byte 0xe9 at offset 3)")}


@pytest.mark.parametrize("name", sorted(JUNK))
@pytest.mark.parametrize("how", ["--text @", "--text-file", "--corpus --text-file"])
def test_junk_bytes_as_text_say_not_text(how: str, name: str, bert: Path, tmp_path: Path) -> None:
    data, said = JUNK[name]
    (tmp_path / name).write_bytes(data)
    given = ["--text", f"@{tmp_path / name}"] if how == "--text @" else [*how.split(), str(tmp_path / name)]
    out = tmp_path / "o.safetensors"
    _one_line(_run("capture", str(bert), *given, "-o", str(out)), 1, name, said,
              never=("JSON", "text text", "text must be"))
    assert not out.exists()


def test_an_empty_text_file_is_named(bert: Path, tmp_path: Path) -> None:
    """Without --corpus as with it: the file given holds no text, not "give --text-file FILE"."""
    (tmp_path / "empty.txt").write_text("\n  \n")
    for corpus in ([], ["--corpus"]):
        _one_line(_run("capture", str(bert), "--text-file", str(tmp_path / "empty.txt"), *corpus, "-o",
                       str(tmp_path / "o.safetensors")), 1, "--text-file", "empty.txt", "holds no text",
                  never=("give the text",))


@pytest.mark.parametrize(("shard", "words"), [("0/0", ("COUNT", "at least 1")), ("-1/0", ("COUNT", "at least 1")),
                                              ("4/4", ("0 to 3", "4 shards")), ("-1/2", ("0 to 1", "2 shards"))])
def test_shard_out_of_range_says_which_numbers(shard: str, words: tuple[str, ...], bert: Path,
                                                tmp_path: Path) -> None:
    (tmp_path / "lines.txt").write_text(LINES)
    _one_line(_run("capture", str(bert), "--corpus", "--text-file", str(tmp_path / "lines.txt"), "--shard", shard,
                   "-o", str(tmp_path / "o.safetensors")), 2, f"--shard {shard}", *words,
              never=("COUNT - 1",))


# -- model folders transformers refuses


def test_weights_that_do_not_fit_the_config_are_named(bert: Path, tmp_path: Path) -> None:
    """transformers raises "For details look at the above report!" over a report it logs, which attnviz hides:
    the message gives the report's gist, the parameters whose shapes differ and both shapes."""
    import shutil

    folder = tmp_path / "mismatch"
    shutil.copytree(bert, folder)
    config = json.loads((folder / "config.json").read_text())
    config["intermediate_size"] = 24
    (folder / "config.json").write_text(json.dumps(config))
    line = _one_line(_run("capture", str(folder), "--text", "the cat", "-o", str(tmp_path / "o.safetensors")), 1,
                     "mismatch", "config.json", "encoder.layer.0.intermediate.dense.bias", "[32]", "[24]",
                     never=("above report", "ignore_mismatched_sizes"))
    assert "6 " in line, line  # two layers' intermediate weight and bias, and output weight


def test_a_config_the_validator_refuses_gives_its_cause(tmp_path: Path) -> None:
    """transformers' config classes are validated by huggingface_hub, whose message puts the cause on a line of
    its own under "Class validation error for validator 'validate_architecture':"."""
    folder = tmp_path / "llama"
    folder.mkdir()
    cfg = transformers.LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                   num_attention_heads=2, num_key_value_heads=1)
    cfg.save_pretrained(str(folder))
    config = json.loads((folder / "config.json").read_text())
    config["num_attention_heads"] = 3
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "model.safetensors").write_bytes(b"")  # never read: the config is refused first
    try:  # what this transformers says: the test holds it to whatever it is
        transformers.LlamaConfig(hidden_size=16, num_attention_heads=3, num_key_value_heads=1)
    except Exception as exc:  # noqa: BLE001
        cause = str(exc.__cause__ or exc).splitlines()[-1].strip()
    else:
        pytest.skip("this transformers does not validate the heads against the hidden size")
    _one_line(_run("capture", str(folder), "--text", "the cat", "-o", str(tmp_path / "o.safetensors")), 1,
              "config.json", cause.rstrip("."), never=("':)",))


# -- --sort: a statistic's name or its column's header


@pytest.fixture(scope="module")
def captures(bert: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("sorted")
    (root / "lines.txt").write_text(LINES)
    files = {"exact": root / "exact.safetensors", "summary": root / "summary.safetensors",
             "corpus": root / "corpus.safetensors"}
    text = ["--text", "the cat sat on the mat. a dog ran fast, the cat sat."]
    for args in (["-o", str(files["exact"]), *text], ["-o", str(files["summary"]), "--summary", *text],
                 ["-o", str(files["corpus"]), "--corpus", "--text-file", str(root / "lines.txt"), "--token-class",
                  "articles=the|a"]):
        done = _run("capture", str(bert), *args)
        assert done.exit_code == 0, done.stderr
    return files


def _table_heads(stdout: str) -> list[tuple[int, int]]:
    """The (layer, head) of the first table's rows, in the order printed."""
    rows: list[tuple[int, int]] = []
    for line in stdout.splitlines():
        found = re.match(r"\s*(\d+)\s+(\d+)\s", line)
        if found:
            rows.append((int(found.group(1)), int(found.group(2))))
        elif rows:
            break
    return rows


def _largest_first(entries: list[dict], value) -> list[tuple[int, int]]:
    """The heads by ``value`` of each JSON entry, largest first (ties: layer, head), as the definition says."""
    ordered = sorted(entries, key=lambda e: (-value(e), e["layer"], e["head"]))
    return [(e["layer"], e["head"]) for e in ordered]


@pytest.mark.parametrize(("kind", "word", "name"), [
    ("exact", "diag", "diagonal"), ("exact", "self", "diagonal"), ("exact", "H", "entropy"),
    ("exact", "prev", "previous"),
    ("summary", "sink", "sink_mass"), ("summary", "local", "local_mass"), ("summary", "dist", "distance"),
    ("corpus", "punct", "punctuation"), ("corpus", "top_prev", "top_previous"), ("corpus", "sink rate", "sink_rate"),
    ("corpus", "articles", "class:articles"), ("corpus", "class:articles", "class:articles"),
])
def test_sort_takes_the_column_header(kind: str, word: str, name: str, captures: dict[str, Path]) -> None:
    """``--sort WORD`` orders the table as the values of the statistic it names do, largest first."""
    path = str(captures[kind])
    doc = json.loads(_run("inspect", path, "--json").stdout)
    if name.startswith("class:"):
        expected = _largest_first(doc["head_stats"], lambda e: e["classes"][name[6:]])
    else:
        expected = _largest_first(doc["head_stats"], lambda e: e[name])
    done = _run("inspect", path, "--sort", word, *(["--no-table"] if kind == "exact" else []))
    assert done.exit_code == 0, done.stderr
    assert _table_heads(done.stdout) == expected
    assert _table_heads(_run("inspect", path, "--sort", name, *(["--no-table"] if kind == "exact" else [])).stdout) \
        == expected


@pytest.mark.parametrize(("kind", "word", "words"), [
    ("exact", "articles", ("--sort articles", "entropy", "diag")),
    ("exact", "sink", ("--sort sink", "summary capture")),
    ("summary", "punct", ("--sort punct", "corpus")),
    ("corpus", "nouns", ("--sort nouns", "articles", "punct")),
    ("corpus", "sink", ("--sort sink", "sink_mass", "summary capture", "sink_rate")),
    ("corpus", "entorpy", ("--sort entorpy", "entropy")),
])
def test_sort_names_what_the_file_has(kind: str, word: str, words: tuple[str, ...],
                                      captures: dict[str, Path]) -> None:
    """A word no column of this file answers to: exit 2, before anything is computed, with the columns it has."""
    _one_line(_run("inspect", str(captures[kind]), "--sort", word), 2, captures[kind].name, *words)


def test_the_python_api_sorts_by_a_header_too() -> None:
    """``.table(sort=...)`` takes the same words; one that names no column is attnviz's error, not a KeyError."""
    import io

    import numpy as np
    from rich.console import Console

    import attnviz
    from attnviz.errors import UsageError

    weights = np.random.default_rng(0).dirichlet(np.ones(5), size=(2, 1, 3, 5)).astype(np.float32)
    result = attnviz.inspect(weights)

    def text(sort: str) -> str:
        console = Console(width=200, record=True, file=io.StringIO())
        console.print(result.table(sort=sort, top=6))
        return console.export_text()

    assert text("diag") == text("diagonal") != text("layer")
    with pytest.raises(UsageError, match="did you mean entropy"):
        result.table(sort="entorpy")


# -- the first minutes


def test_the_readme_says_how_to_install_capture_before_it_shows_one() -> None:
    """Capture needs the [torch] extra; its default build on Linux is the CUDA one (8 GB of NVIDIA libraries on a
    machine without a GPU): the README says so, and how to take the CPU build, before its first capture line, and
    keeps its two opening commands (CI runs them) as they are."""
    from tests.conftest import ROOT

    text = (ROOT / "README.md").read_text()
    opening = text.split("```")[1]
    assert opening.strip().splitlines()[1:] == [
        "python3 -m venv .venv && .venv/bin/pip install . && .venv/bin/attnviz scaled sample_inputs/q.npy "
        "sample_inputs/k.npy sample_inputs/v.npy --png attn.png",
        "python3 -m venv .venv && .venv/bin/pip install '.[test]' && .venv/bin/python -m pytest"]
    before = text[:text.index("attnviz capture ")]
    assert "'.[torch]'" in before and "--index-url https://download.pytorch.org/whl/cpu" in before
    assert "GPU" in before.split("whl/cpu")[-1]  # what the CUDA build adds


def test_the_first_commands_picture_is_linear_and_says_no_decades(tmp_path: Path) -> None:
    """The README's first command: a 3 x 4 matrix of 0, 0.5 and 1 (its zeros are softmax weights of 4e-26, zeros
    in float32) was drawn on a log scale from 1e-4, 0.5 and 1 two close yellows, titled "--norm auto: log, the
    top 25.0 decades above the median". On a linear scale 0.5 is the colour map's middle; the title says
    nothing of decades. Read from the rendered figure (title, colour bar, scale) and the saved PNG's cells."""
    import numpy as np
    from matplotlib.colors import LogNorm

    import attnviz
    from attnviz.render.heatmap import save_figure
    from tests.conftest import SAMPLES
    from tests.test_mosaic import read, rgb

    q, k, v = (np.load(SAMPLES / f"{n}.npy") for n in "qkv")
    fig = attnviz.scaled(q, k, v).figure()
    title = " ".join(t.get_text() for t in [*fig.texts, *(ax.title for ax in fig.axes)])
    assert "scaled attention weights [3, 4]" in title and "decades" not in title and "log" not in title, title
    ax = next(ax for ax in fig.axes if ax.images)
    norm = ax.images[0].norm
    assert not isinstance(norm, LogNorm) and (norm.vmin, norm.vmax) == (0.0, 1.0)
    assert "log" not in " ".join(a.get_ylabel() for a in fig.axes)
    save_figure(fig, tmp_path / "attn.png")
    img = read(tmp_path / "attn.png")
    x0, y0, x1, y1 = ax.bbox.extents

    def cell(row: int, col: int) -> tuple[int, ...]:  # a quarter of the way down the cell: clear of its number
        x, y = x0 + (col + 0.5) * (x1 - x0) / 4, y1 - (row + 0.25) * (y1 - y0) / 3
        return tuple(int(c) for c in img[img.shape[0] - round(y), round(x)])

    for (row, col), value in {(0, 0): 0.0, (0, 2): 0.5, (1, 1): 1.0, (2, 3): 0.0}.items():
        assert max(abs(a - b) for a, b in zip(cell(row, col), rgb("viridis", value))) <= 3, (row, col)
    done = _run("scaled", *(str(SAMPLES / f"{n}.npy") for n in "qkv"), "--png", str(tmp_path / "cli.png"))
    assert done.exit_code == 0 and np.array_equal(read(tmp_path / "cli.png"), img)

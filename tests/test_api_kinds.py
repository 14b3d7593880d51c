"""The Python API reads every kind of file the command line reads (issue 51): exact weights, a summary capture, a
``--no-weights`` capture (summarised from its q and k) and a corpus file, and compares two summaries; each result's
JSON is the document ``attnviz inspect FILE --json`` (``attnviz compare A B --json``) prints for the same file and
options. The files are captured once from a tiny Llama folder."""

from __future__ import annotations

import json
import sys
import warnings
from pathlib import Path

import pytest
from typer.testing import CliRunner

import attnviz
from attnviz.cli import app
from attnviz.errors import UsageError

pytest.importorskip("torch")
pytest.importorskip("transformers")


def _cli(*args: object) -> str:
    done = CliRunner().invoke(app, [str(a) for a in args])
    assert done.exit_code == 0 and "Traceback" not in done.stderr, done.stderr
    return done.stdout.strip()


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A file of each kind from one tiny model (``folder``): ``exact``, ``summary`` (with chosen rows), ``no-weights``,
    ``other`` (a summary of the same text, pooled otherwise) and ``corpus``."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    from models import llama_folder, long_text

    root = tmp_path_factory.mktemp("kinds")
    folder = llama_folder(root / "llama", layers=2, heads=4, kv_heads=2, hidden=32, positions=512)
    text = long_text(60, "the magic code is blue")
    made = {name: root / f"{name}.safetensors" for name in ("exact", "summary", "no-weights", "other", "corpus")}
    for name, extra in (("exact", []), ("summary", ["--summary", "--rows", "0,-1"]), ("no-weights", ["--no-weights"]),
                        ("other", ["--summary", "--pool", "16"])):
        _cli("capture", folder, "--text", text, "--text", long_text(40, seed=1), "-o", made[name], *extra)
    corpus = root / "corpus.txt"
    corpus.write_text("\n".join(long_text(20 + 5 * n, seed=n) for n in range(4)) + "\n")
    _cli("capture", folder, "--text-file", corpus, "--corpus", "--batch-size", "2", "-o", made["corpus"])
    return {**made, "folder": folder}


#: (kind, the command line's options, the same as the API's keywords)
CASES = [
    ("exact", ["--layer", "1", "--sort", "entropy"], {"layer": 1, "sort": "entropy"}),
    ("summary", [], {}),
    ("summary", ["--span", "doc=2:20", "--span-text", "code=magic code", "--sort", "first", "--reverse", "--top", "5",
                 "--batch", "0"],
     {"span": ["doc=2:20"], "span_text": "code=magic code", "sort": "first", "reverse": True, "top": 5, "batch": 0}),
    ("no-weights", [], {}),
    ("no-weights", ["--span", "doc=0:8", "--sort", "sink_mass"], {"span": "doc=0:8", "sort": "sink_mass"}),
    ("corpus", [], {}),
    ("corpus", ["--sort", "first", "--top", "3"], {"sort": "first", "top": 3}),
]


@pytest.mark.parametrize(("kind", "argv", "keywords"), CASES)
def test_inspect_of_every_kind_gives_the_command_s_document(files: dict[str, Path], kind: str, argv: list[str],
                                                            keywords: dict[str, object]) -> None:
    path = files[kind]
    cli = _cli("inspect", path, *argv, "--json")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        api = attnviz.inspect(str(path), **keywords)
    assert api.to_json() == cli
    doc = json.loads(cli)
    assert api.document() == doc
    if kind == "corpus":
        assert doc["kind"] == "corpus" and type(api).__name__ == "InspectedCorpus"
        assert api.head_stats["first"].shape == (2, 4)
    elif kind != "exact":
        assert "summary" in doc and type(api).__name__ == "InspectedSummary" and api.kind == kind
        assert api.head_stats["entropy"].shape == (2, 4) and api.head_stats["tag"].shape == (2, 4)
    else:
        assert type(api).__name__ == "Inspected"


def test_a_recording_of_summaries_is_inspected_as_its_message_says(files: dict[str, Path]) -> None:
    """``attnviz.capture(model, tokenizer, summary=True)``: the recording's own message says attnviz.inspect reads it;
    a recording without weights is summarised from its q and k, and the two agree."""
    import torch
    import transformers

    tokenizer = transformers.AutoTokenizer.from_pretrained(str(files["folder"]))
    model = transformers.AutoModelForCausalLM.from_pretrained(str(files["folder"])).eval()
    batch = tokenizer(["the magic code is blue . what is the code ?"], return_tensors="pt")
    recordings = []
    for options in ({"summary": True}, {"weights": False}):
        with attnviz.capture(model, tokenizer, **options) as rec, torch.no_grad():
            model(**batch)
        recordings.append(rec)
    summary, summarised = (attnviz.inspect(rec, span="doc=0:4") for rec in recordings)
    assert summary.kind == "summary" and summarised.kind == "no-weights"
    assert summary.document()["file"] == "llama (captured)" and list(summary.spans) == ["doc"]
    assert attnviz.compare(*recordings, atol=1e-4).passed


def test_compare_of_summaries_gives_the_command_s_document(files: dict[str, Path]) -> None:
    """A --no-weights capture summarised against the model's own summary of the same texts: the same document and
    verdict as ``attnviz compare``."""
    cli = _cli("compare", files["no-weights"], files["summary"], "--atol", "1e-4", "--json")
    done = attnviz.compare(str(files["no-weights"]), str(files["summary"]), atol=1e-4)
    assert done.to_json() == cli and done.passed and json.loads(cli)["check"]["passed"]
    assert json.loads(attnviz.compare(str(files["summary"]), str(files["summary"])).to_json())["check"] is None


def test_every_kind_saves_and_draws_what_the_command_writes(files: dict[str, Path], tmp_path: Path) -> None:
    """The pictures and JSON file of a summary and a corpus file, as keywords of the run or through ``save``."""
    summary = attnviz.inspect(str(files["summary"]), png=tmp_path / "grid.png", map_png=tmp_path / "rows.png",
                              stats_png=tmp_path / "sink.png", stat="sink_mass", json_file=tmp_path / "s.json")
    assert json.loads((tmp_path / "s.json").read_text()) == summary.document()
    for name in ("grid.png", "rows.png", "sink.png"):
        assert (tmp_path / name).stat().st_size > 1000, name
    corpus = attnviz.inspect(str(files["corpus"]), heads_map=tmp_path / "heads.png")
    assert (tmp_path / "heads.png").stat().st_size > 1000
    corpus.save(png=tmp_path / "strips.png", json=tmp_path / "c.json")
    assert json.loads((tmp_path / "c.json").read_text()) == corpus.document()
    from rich.console import Console

    console = Console(width=200, record=True)
    head_table, pairs = corpus.table(sort="first", top=2).renderables
    console.print(head_table)
    rows = [line for line in console.export_text().splitlines() if line.strip()[:2] in ("0 ", "1 ")]
    assert len(rows) == 2 and pairs is not None  # the two heads asked for; the closest pairs


@pytest.mark.parametrize(("kind", "keywords", "words"), [
    ("summary", {"html": "x.html"}, "holds summaries, not weights; it draws .save(png=...) (pooled maps)"),
    ("summary", {"save_maps": "x.npy"}, "save_maps=…: "),
    ("summary", {"sort": "retrieval"}, "retrieval scores need needle="),
    ("summary", {"layer": 7}, "layer=7: "),
    ("summary", {"span": "doc=1"}, "span="),
    ("summary", {"spam": "doc=1:4"}, "did you mean span=?"),
    ("summary", {"needel": "x"}, "did you mean needle=?"),
    ("summary", {"needle": "no such words"}, "needle="),
    ("exact", {"needle": "magic"}, "needle=… read a summary capture"),
    ("exact", {"heads_map": "x.png"}, "heads_map=…: a picture of corpus files"),
    ("corpus", {"span": "doc=1:4"}, "a corpus file holds per-head statistics"),
    ("corpus", {"map_png": "x.png"}, "is a corpus file (per-head statistics, no maps); it draws .save(png=...), "
                                     "heads_map=…"),
    ("corpus", {"stats_png": "x.png", "stat": "retrieval"}, "stat=… retrieval: "),
])
def test_what_a_kind_cannot_do_is_said_in_python_s_words(files: dict[str, Path], kind: str,
                                                         keywords: dict[str, object], words: str,
                                                         tmp_path: Path) -> None:
    with pytest.raises(UsageError) as caught:
        attnviz.inspect(str(files[kind]), **keywords)
    message = str(caught.value)
    plain = message  # less the capture's options that make such a file
    for made in ("capture --summary", "capture --corpus", "with --summary --generate N"):
        plain = plain.replace(made, "")
    assert words in message and " --" not in plain and not message.startswith("--"), message
    assert not (tmp_path / "x.png").exists()


def test_compare_refuses_a_summary_against_weights_and_pictures(files: dict[str, Path]) -> None:
    with pytest.raises(UsageError, match="holds attention weights, the other file a summary"):
        attnviz.compare(str(files["summary"]), str(files["exact"]))
    with pytest.raises(UsageError, match="comparing summaries prints a table and JSON"):
        attnviz.compare(str(files["summary"]), str(files["no-weights"]), png="x.png")
    from attnviz.errors import InputError

    with pytest.raises(InputError, match="corpus.safetensors: a capture file with no attention sites"):
        attnviz.compare(str(files["summary"]), str(files["corpus"]))  # as attnviz compare says it, exit 1

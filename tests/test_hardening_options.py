"""Hostile and broken option values, usage errors, parameter files and output targets (issue 10,
items 2, 3, 6 and 8, and the option half of item 9).

* Every option value is checked as the command line is read, before any file is opened (and so
  before TensorFlow or NumPy are imported): counts, seeds, sizes, finite floats, choices.
* Usage errors of every command are one line, ``attnviz: error: --device 'tpu': expected one of
  auto, cpu, gpu.``, exit 2; Click's usage block never shows; batch jobs report them alike.
* A parameter file whose arrays disagree names the file, the keys and their shapes (exit 1), and
  never an option the user did not give.
* Outputs are all or nothing: checked before anything is computed, written to staged files, put in
  place together; a failed run leaves no new file and no changed file.

Each table case runs the command line (typer's CliRunner) in a fresh folder holding copies of the
inputs, and checks the exit code, the one- or two-line message naming the culprit, no traceback,
nothing on stdout, inputs byte-identical and no new file. Then a hypothesis fuzz over random values
of random options of random commands.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
import typer.main
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from attnviz.cli import app
from attnviz.cli.parsers import Number, OneOf, Positions, Size
from attnviz.errors import OutputError
from tests.conftest import ROOT, SAMPLES

runner = CliRunner()
COMMANDS = typer.main.get_command(app).commands  # name -> the click command Typer built


# ----------------------------------------------------------------------------------------------
# The folder every case runs in


def build(folder: Path) -> Path:
    """Copies of the sample inputs, a few more inputs, and parameter files whose arrays disagree."""
    folder.mkdir(parents=True, exist_ok=True)
    for name in ("q.npy", "k.npy", "v.npy", "tokens.txt", "seed_example.npz"):
        shutil.copy(SAMPLES / name, folder / name)
    rng = np.random.default_rng(0)
    weights = rng.random((3, 4)).astype(np.float32)
    np.save(folder / "weights.npy", weights / weights.sum(-1, keepdims=True))
    other = rng.random((3, 4)).astype(np.float32)
    np.save(folder / "w2.npy", other / other.sum(-1, keepdims=True))
    np.save(folder / "doc.npy", rng.normal(size=(2, 3, 3)).astype(np.float32))
    np.save(folder / "adj.npy", np.ones((3, 3), np.int8))
    (folder / "jobs.jsonl").write_text(json.dumps({"command": "scaled", "args": ["q.npy", "k.npy", "v.npy"]}) + "\n")
    ones = np.ones

    def save(name: str, **arrays: np.ndarray) -> None:
        np.savez(folder / name, **{k.replace("__", "/"): v for k, v in arrays.items()})

    mh = {"query__kernel": ones((3, 2, 3)), "key__kernel": ones((3, 2, 3)), "value__kernel": ones((3, 2, 3)),
          "attention_output__kernel": ones((2, 3, 3))}
    save("mh_ok.npz", **mh)
    save("mh_kv.npz", **{**mh, "key__kernel": ones((3, 3, 3)), "value__kernel": ones((3, 3, 3))})
    save("mh_keydim.npz", **{**mh, "key__kernel": ones((3, 2, 4))})
    save("mh_heads.npz", **{**mh, "attention_output__kernel": ones((3, 3, 3))})
    save("mh_features.npz", **{**mh, "query__kernel": ones((5, 2, 3))})
    save("mh_bias.npz", **{**mh, "query__bias": ones((2, 4))})
    save("mh_rank.npz", **{**mh, "value__kernel": ones((3, 6))})
    save("additive.npz", W1=ones((3, 4)), W2=ones((3, 5)), v=ones(4))
    save("pooling.npz", W=ones((3, 4)), v=ones(5))
    save("self_scaled.npz", W_Q=ones((3, 2)), W_K=ones((3, 3)), W_V=ones((3, 3)))
    save("self_rank.npz", W_Q=ones(3), W_K=ones((3, 3)), W_V=ones((3, 3)))
    save("self_packed.npz", kernel=ones((3, 3, 2)))
    save("self_additive.npz", Wt=ones((3, 4)), Wx=ones((3, 5)), Wa=ones((4, 1)))
    save("hier.npz", W_w=ones((3, 4)), u_w=ones(5), W_s=ones((3, 4)), u_s=ones(4))
    save("gat.npz", W=ones((3, 4)), a_src=ones(5), a_dst=ones(4))
    save("localp.npz", W_p=ones((3, 4)), v_p=ones(5))
    save("general.npz", W_a=ones((3, 4)))
    save("bidaf.npz", w=ones(10))
    save("crf.npz", W=ones((2, 3)), T=ones((2, 2)))
    return folder


@pytest.fixture
def folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(build(tmp_path / "run"))
    return tmp_path / "run"


def snapshot(folder: Path) -> dict[str, str]:
    """Every file below ``folder`` (hidden ones too) and a hash of its bytes."""
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
            for p in sorted(folder.rglob("*"))}


def invoke(argv: list[str]):
    return runner.invoke(app, [str(a) for a in argv])


def assert_one_clear_line(result, code: int, words: list[str]) -> None:
    out = (result.exit_code, result.stdout, result.stderr)
    assert result.exit_code == code, out
    lines = result.stderr.strip().splitlines()
    assert 1 <= len(lines) <= 2, out
    assert lines[0].startswith("attnviz: error: "), out
    for word in words:
        assert word in result.stderr, out
    for bad in ("Traceback", "internal error", "Usage:", "Try '", "Error: "):
        assert bad not in result.stderr, out
    assert result.stdout == "", out


QKV = ["q.npy", "k.npy", "v.npy"]


# ----------------------------------------------------------------------------------------------
# The table: (argv, exit code, words the message must hold)

OPTION_VALUES = [  # item 2: option values, refused as the command line is read
    (["multihead", "q.npy", "--heads", "0"], 2, ["--heads 0: must be at least 1."]),
    (["multihead", "q.npy", "--heads", "-3"], 2, ["--heads -3: must be at least 1."]),
    (["multihead", "q.npy", "--heads", "2", "--key-dim", "0"], 2, ["--key-dim 0: must be at least 1."]),
    (["multihead", "q.npy", "--heads", "2", "--value-dim", "0"], 2, ["--value-dim 0"]),
    (["multihead", "q.npy", "--heads", "2", "--output-dim", "-1"], 2, ["--output-dim -1"]),
    (["multihead", "q.npy", "--heads", "2", "--kv-heads", "0"], 2, ["--kv-heads 0"]),
    (["multihead", "q.npy", "--heads", "99999999999999999999999999999999999"], 2, ["--heads", "at most 1024"]),
    (["multihead", "q.npy", "--heads", "1.5"], 2, ["--heads 1.5: expected a whole number."]),
    (["additive", *QKV, "--units", "0"], 2, ["--units 0: must be at least 1."]),
    (["pooling", "q.npy", "--units", "100000"], 2, ["--units 100000: must be at most 8192."]),
    (["self", "q.npy", "--width", "0"], 2, ["--width 0"]),
    (["self", "q.npy", "--key-dim", "0"], 2, ["--key-dim 0"]),
    (["local", *QKV, "--window", "-1"], 2, ["--window -1: must be at least 0."]),
    (["local", *QKV, "--window", "1", "--dilation", "0"], 2, ["--dilation 0"]),
    (["local", *QKV, "--window-style", "band", "--left", "-2", "--right", "0"], 2, ["--left -2: must be at least -1."]),
    (["sparse", *QKV, "--method", "topk", "--k", "0"], 2, ["--k 0: must be at least 1."]),
    (["sparse", *QKV, "--method", "strided", "--stride", "0"], 2, ["--stride 0"]),
    (["sparse", *QKV, "--method", "fixed", "--c", "0"], 2, ["--c 0"]),
    (["sparse", *QKV, "--method", "entmax", "--n-iter", "0"], 2, ["--n-iter 0"]),
    (["sparse", *QKV, "--method", "entmax", "--alpha", "nan"], 2, ["--alpha nan: must be a finite number."]),
    (["sparse", *QKV, "--method", "entmax", "--alpha", "1"], 2, ["--alpha 1: must be greater than 1."]),
    (["hard", *QKV, "--mode", "sample", "--samples", "0"], 2, ["--samples 0"]),
    (["hard", *QKV, "--mode", "gumbel", "--tau", "0"], 2, ["--tau 0"]),
    (["hard", *QKV, "--mode", "gumbel", "--tau", "inf"], 2, ["--tau inf: must be a finite number."]),
    (["hard", *QKV, "--mode", "sample", "--samples", "1000000"], 2, ["--samples 1000000", "use fewer samples"]),
    (["general", *QKV, "--seed", "-1"], 2, ["--seed -1: must be at least 0."]),
    (["scaled", *QKV, "--scale", "nan"], 2, ["--scale nan: must be a finite number."]),
    (["scaled", *QKV, "--scale", "-inf"], 2, ["--scale -inf"]),
    (["scaled", *QKV, "--scale", "0"], 2, ["--scale 0: must be positive."]),
    (["scaled", *QKV, "--scale", "-0.0"], 2, ["--scale -0.0: must be positive."]),
    (["coattention", "q.npy", "k.npy", "--scale", "1e999"], 2, ["--scale 1e999: must be a finite number."]),
    (["structured", "q.npy", "--adjacency", "adj.npy", "--score", "gat", "--negative-slope", "nan"], 2,
     ["--negative-slope nan"]),
    (["structured", "q.npy", "--method", "crf", "--normalize", "0"], 2, ["--normalize 0: must be positive."]),
    (["scaled", *QKV, "--rope", "--rope-theta", "nan"], 2, ["--rope-theta nan"]),
    (["scaled", *QKV, "--rope", "--rope-dim", "0"], 2, ["--rope-dim 0"]),
    (["scaled", *QKV, "--max-memory", "inf"], 2, ["--max-memory inf: expected a size such as 512M"]),
    (["scaled", *QKV, "--max-memory", "nan"], 2, ["--max-memory nan"]),
    (["scaled", *QKV, "--max-memory", "-1G"], 2, ["--max-memory '-1G': must be at least 1M."]),
    (["scaled", *QKV, "--max-memory", "12 parsecs"], 2, ["--max-memory '12 parsecs'"]),
    (["scaled", *QKV, "--max-memory", "1e300G"], 2, ["--max-memory '1e300G': too large."]),
    (["scaled", *QKV, "--precision", "13"], 2, ["--precision 13: must be at most 12."]),
    (["scaled", *QKV, "--max-rows", "-1"], 2, ["--max-rows -1"]),
    (["scaled", *QKV, "--index", "0;1"], 2, ["--index '0;1': expected whole numbers separated by commas"]),
    (["local", *QKV, "--window", "1", "--global-tokens", "a,b"], 2, ["--global-tokens 'a,b'"]),
    (["inspect", "weights.npy", "--top", "0"], 2, ["--top 0: must be at least 1."]),
    (["inspect", "weights.npy", "--atol", "nan"], 2, ["--atol nan: must be a finite number."]),
    (["inspect", "weights.npy", "--atol", "-1"], 2, ["--atol -1: must be at least 0."]),
    (["inspect", "weights.npy", "--layer", "x"], 2, ["--layer 'x': expected a whole number."]),
    (["compare", "weights.npy", "w2.npy", "--rtol", "inf"], 2, ["--rtol inf"]),
    (["compare", "weights.npy", "w2.npy", "--worst", "0"], 2, ["--worst 0: must be at least 1."]),
    (["batch", "jobs.jsonl", "--jobs", "0"], 2, ["--jobs 0: must be at least 1."]),
    (["batch", "jobs.jsonl", "--jobs", "many"], 2, ["--jobs 'many': expected a whole number."]),
]

USAGE_ERRORS = [  # item 3: Click's usage errors, in attnviz's one format, for every command
    (["scaled", *QKV, "--device", "tpu"], 2, ["--device 'tpu': expected one of auto, cpu, gpu."]),
    (["scaled", *QKV, "--dtype", "int8"], 2, ["--dtype 'int8': expected one of float32, float64"]),
    (["multihead", "q.npy", "--heads", "two"], 2, ["--heads 'two': expected a whole number."]),
    (["scaled", *QKV, "--bogus"], 2, ["--bogus: no such option of attnviz scaled"]),
    (["scaled", *QKV, "--scal", "1"], 2, ["--scal: no such option", "did you mean", "--scale"]),
    (["scaled"], 2, ["missing argument Q; usage: attnviz scaled [OPTIONS] Q [K] [V]."]),
    (["scaled", *QKV, "--scale"], 2, ["--scale: needs a value."]),
    (["scaled", *QKV, "--causal=yes"], 2, ["--causal: a flag, it takes no value."]),
    (["scaled", *QKV, "extra.npy"], 2, ["unexpected extra argument", "extra.npy", "usage: attnviz scaled"]),
    (["scaledd", *QKV], 2, ["'scaledd': no such command; did you mean 'scaled'?"]),
    (["--bogus"], 2, ["--bogus: no such option of attnviz"]),
    (["variants", "--x"], 2, ["--x: no such option of attnviz variants"]),
    (["inspect"], 2, ["missing argument WEIGHTS"]),
    (["inspect", "weights.npy", "--sort", "size"], 2, ["--sort size: not a column of weights.npy",
                                                       "its table has layer, head, entropy (H)"]),
    (["inspect", "weights.npy", "--mask-kind", "soft"], 2, ["--mask-kind 'soft': expected one of bool, additive."]),
    (["compare", "weights.npy"], 2, ["missing argument B"]),
    (["compare", "weights.npy", "w2.npy", "--reduce", "median"], 2, ["--reduce 'median': expected one of mean, max."]),
    (["batch"], 2, ["missing argument JOBS"]),
    (["batch", "jobs.jsonl", "--jobs"], 2, ["--jobs: needs a value."]),
    (["local", *QKV, "--window", "1", "--mode", "local-q"], 2, ["--mode 'local-q': expected one of window, local-m"]),
    (["scaled", *QKV, "--device", "\x1b[31mgpu"], 2, ["--device '\\x1b[31mgpu'"]),
    (["scaled", *QKV, "--\x1b]0;pwned\x07"], 2, ["\\x1b]0;pwned\\x07: no such option"]),
]

PARAMETER_FILES = [  # item 6: the file, the keys and their shapes; never an option the user did not give
    (["multihead", "q.npy", "--params", "mh_kv.npz"], 1,
     ["mh_kv.npz: query/kernel [3, 2, 3] has 2 query heads and key/kernel [3, 3, 3] 3 key/value heads"]),
    (["multihead", "q.npy", "--params", "mh_keydim.npz"], 1,
     ["mh_keydim.npz: the arrays disagree on the key_dim: query/kernel [3, 2, 3] has 3, key/kernel [3, 2, 4] has 4."]),
    (["multihead", "q.npy", "--params", "mh_heads.npz"], 1,
     ["mh_heads.npz: the arrays disagree on the query heads N", "attention_output/kernel [3, 3, 3] has 3"]),
    (["multihead", "q.npy", "--params", "mh_features.npz"], 1,
     ["mh_features.npz: query/kernel [5, 2, 3] takes 5 features, but QUERY (q.npy) has 3"]),
    (["multihead", "q.npy", "--params", "mh_bias.npz"], 1, ["mh_bias.npz", "query/bias [2, 4] has 4"]),
    (["multihead", "q.npy", "--params", "mh_rank.npz"], 1, ["mh_rank.npz: key 'value/kernel' has shape [3, 6]"]),
    (["multihead", "q.npy", "--params", "mh_ok.npz", "--heads", "3"], 1,
     ["mh_ok.npz: query/kernel [3, 2, 3] has 2 heads, but --heads 3 was given."]),
    (["multihead", "q.npy", "--params", "mh_ok.npz", "--no-bias", "--kv-heads", "1"], 1,
     ["mh_ok.npz: key/kernel [3, 2, 3] has 2 key/value heads, but --kv-heads 1 was given."]),
    (["multihead", "q.npy", "--heads", "4"], 2, ["--heads 4 is more than QUERY's 3 features", "give --key-dim"]),
    (["additive", *QKV, "--params", "additive.npz"], 1,
     ["additive.npz: W1 [3, 4] and W2 [3, 5] disagree on the width (units): 4 and 5."]),
    (["additive", *QKV, "--params", "general.npz", "--units", "4"], 1, ["general.npz: unexpected key(s) W_a"]),
    (["pooling", "q.npy", "--params", "pooling.npz"], 1, ["pooling.npz: W [3, 4] and v [5] disagree"]),
    (["pooling", "q.npy", "--params", "pooling.npz", "--units", "2"], 1, ["pooling.npz: W [3, 4] and v [5]"]),
    (["self", "q.npy", "--params", "self_scaled.npz"], 1, ["self_scaled.npz: W_Q [3, 2] and W_K [3, 3] disagree"]),
    (["self", "q.npy", "--params", "self_rank.npz"], 1, ["self_rank.npz: key 'W_Q' has shape [3]"]),
    (["self", "q.npy", "--params", "self_packed.npz", "--key-dim", "3"], 1,
     ["self_packed.npz: the packed 'kernel' [3, 3, 2] has d_out = 2, but --key-dim 3 was given."]),
    (["self", "q.npy", "--score", "additive", "--params", "self_additive.npz"], 1,
     ["self_additive.npz: Wt [3, 4] and Wx [3, 5] disagree"]),
    (["hierarchical", "doc.npy", "--params", "hier.npz"], 1, ["hier.npz: W_w [3, 4] and u_w [5] disagree"]),
    (["structured", "q.npy", "--adjacency", "adj.npy", "--score", "gat", "--params", "gat.npz"], 1,
     ["gat.npz: W [3, 4] and a_src [5] disagree"]),
    (["structured", "q.npy", "--method", "crf", "--params", "crf.npz"], 1, ["crf.npz: key 'W' has shape [2, 3]"]),
    (["local", *QKV, "--mode", "local-p", "--window", "1", "--params", "localp.npz"], 1,
     ["localp.npz: W_p [3, 4] and v_p [5] disagree"]),
    (["general", *QKV, "--params", "general.npz"], 1, ["general.npz: key 'W_a' has shape [3, 4], expected [3, 3]."]),
    (["local", *QKV, "--window", "1", "--score", "general", "--params", "general.npz"], 1,
     ["general.npz: key 'W_a' has shape [3, 4], expected [3, 3]."]),
    (["sparse", *QKV, "--score", "general", "--params", "general.npz"], 1, ["general.npz: key 'W_a'"]),
    (["hard", *QKV, "--score", "general", "--params", "general.npz"], 1, ["general.npz: key 'W_a'"]),
    (["bidirectional", "q.npy", "k.npy", "--params", "bidaf.npz"], 1, ["bidaf.npz: key 'w' has shape [10]"]),
    (["multihead", "q.npy", "--heads", "1024", "--key-dim", "8192"], 2, ["parameters to draw", "fewer heads"]),
]

OUTPUT_TARGETS = [  # item 8: every target checked before anything is computed
    (["scaled", *QKV, "--png", "nodir/a.png"], 1, ["--png nodir/a.png: the folder nodir does not exist."]),
    (["scaled", *QKV, "--save-weights", "q.npy"], 2, ["--save-weights q.npy", "refusing to overwrite it"]),
    (["scaled", *QKV, "--save-output", "sub.npy"], 2, ["--save-output sub.npy: is a directory"]),
    (["scaled", *QKV, "--json-file", "q.npy/doc.json"], 1, ["--json-file q.npy/doc.json", "does not exist"]),
    (["scaled", *QKV, "--png", "a.png", "--json-file", "a.png"], 2, ["--json-file a.png: the same file as --png"]),
    (["general", *QKV, "--save-params", "k.npy"], 2, ["--save-params k.npy: the file must end in .npz."]),
    (["inspect", "weights.npy", "--map-png", "nodir/m.png"], 1, ["--map-png nodir/m.png"]),
    (["inspect", "weights.npy", "--stats-png", "weights.npy"], 2, ["--stats-png weights.npy"]),
    (["compare", "weights.npy", "w2.npy", "--png", "w2.npy"], 2, ["--png w2.npy"]),
]

CASES = [(f"{group}-{n}", argv, code, words) for group, table in
         (("options", OPTION_VALUES), ("usage", USAGE_ERRORS), ("params", PARAMETER_FILES),
          ("outputs", OUTPUT_TARGETS)) for n, (argv, code, words) in enumerate(table)]


def test_the_table_is_large():
    assert len(CASES) >= 100
    assert {argv[0] for argv, _, _ in USAGE_ERRORS} >= {"scaled", "inspect", "compare", "batch", "variants"}


@pytest.mark.parametrize("case, argv, code, words", CASES, ids=[c[0] for c in CASES])
def test_case(folder, case, argv, code, words):
    (folder / "sub.npy").mkdir()
    before = snapshot(folder)
    result = invoke(argv)
    assert_one_clear_line(result, code, words)
    assert snapshot(folder) == before  # inputs byte-identical, no new file (staged ones neither)


# ----------------------------------------------------------------------------------------------
# Item 2: every numeric option of every command, and before any import


def _options(kind: type) -> list[tuple[str, str]]:
    out = []
    for name, command in COMMANDS.items():
        for param in command.params:
            if param.param_type_name == "option" and param.type_descriptor.annotation in (kind, kind | None):
                out.append((name, max(param.opts, key=len)))
    return out


BASE = {"scaled": QKV, "dot": QKV, "general": QKV, "additive": QKV, "multihead": ["q.npy", "--heads", "1"],
        "self": ["q.npy"], "pooling": ["q.npy"], "coattention": ["q.npy", "k.npy"], "local": [*QKV, "--window", "1"],
        "hard": QKV, "sparse": QKV, "structured": ["q.npy", "--adjacency", "adj.npy"], "hierarchical": ["doc.npy"],
        "bidirectional": ["q.npy", "k.npy"], "inspect": ["weights.npy"], "compare": ["weights.npy", "w2.npy"],
        "batch": ["jobs.jsonl"], "variants": [], "serve": ["--status"], "rollout": ["weights.npy"],
        "capture": ["weights.npy", "--text", "a", "-o", "c.safetensors"],
        "repeat-test": ["5", "--vocab-size", "10"], "view": ["weights.npy"],
        "merge": ["weights.npy", "w2.npy", "-o", "m.safetensors"], "ablate": ["model", "--text", "a", "--zero", "0:0"]}
NUMERIC = _options(int) + _options(float)


def test_every_command_is_covered():
    assert set(BASE) == set(COMMANDS)
    assert len(NUMERIC) > 60


def test_every_number_and_choice_is_parsed_by_attnviz():
    """One mechanism: every int, float and choice option goes through a parser of
    attnviz.cli.options (bounds from the declaration, floats finite)."""
    unchecked = []
    for name, command in COMMANDS.items():
        for param in command.params:
            desc = param.type_descriptor
            if desc.annotation in (str, bool, str | None, list[str], list[str] | None):  # text: no number to parse
                continue
            parser = desc.parameter_info.parser
            if not isinstance(parser, (Number, OneOf, Size, Positions)):
                unchecked.append((name, param.opts))
    assert unchecked == []


@pytest.mark.parametrize("value, words", [("nan", ["nan"]), ("1e999", ["1e999"]), ("ten", ["'ten'", "expected"])])
def test_every_numeric_option_refuses_non_numbers(folder, value, words):
    before = snapshot(folder)
    for command, flag in NUMERIC:
        result = invoke([command, *BASE[command], flag, value])
        assert_one_clear_line(result, 2, [flag, *words])
    assert snapshot(folder) == before


@pytest.mark.parametrize("argv", [
    ["multihead", "q.npy", "--heads", "0"], ["scaled", "q.npy", "k.npy", "v.npy", "--scale", "nan"],
    ["scaled", "q.npy", "--device", "tpu"], ["scaled", "--max-memory", "inf", "q.npy"],
    ["inspect", "w.npy", "--top", "0"], ["sparse", "q.npy", "--bogus"], ["local", "q.npy", "--window"],
    ["general", "q.npy", "--seed", "-1"],
])
def test_option_errors_come_before_any_file_or_import(argv):
    """Refused while the command line is read: in a fresh interpreter, neither NumPy nor
    TensorFlow gets imported (and the files named do not even exist)."""
    probe = ("import contextlib, io, sys\nfrom attnviz.cli import app\nerr = io.StringIO()\n"
             "with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):\n"
             f"    try:\n        app({argv!r}, prog_name='attnviz')\n"
             "    except SystemExit as exc:\n        code = exc.code\n"
             "print(code, [m for m in ('numpy', 'tensorflow', 'matplotlib') if m in sys.modules])\n"
             "print(err.getvalue())")
    out = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=120)
    first, message = out.stdout.split("\n", 1)
    assert first == "2 []", (out.stdout, out.stderr)
    assert message.startswith("attnviz: error: ") and len(message.strip().splitlines()) == 1


def test_batch_jobs_report_usage_errors_in_the_same_words(folder):
    jobs = [{"command": "multihead", "args": ["q.npy"], "options": {"heads": 0}},
            {"command": "scaled", "args": QKV, "options": {"device": "tpu"}},
            {"command": "scaled", "args": QKV, "options": {"bogus": True}},
            {"command": "scaled", "args": QKV}]
    Path("many.jsonl").write_text("".join(json.dumps(j) + "\n" for j in jobs))
    result = invoke(["batch", "many.jsonl", "--json"])
    assert result.exit_code == 1
    errors = [job["error"] for job in json.loads(result.stdout)["jobs"]]
    assert errors == ["--heads 0: must be at least 1.", "--device 'tpu': expected one of auto, cpu, gpu.",
                      "--bogus: no such option of attnviz scaled (`attnviz scaled --help` lists them).", None]


# ----------------------------------------------------------------------------------------------
# Item 8: all or nothing


def _fail_figures(monkeypatch):
    import attnviz.render.heatmap as heatmap

    def broken(path, write):
        raise OutputError(f"{path}: cannot write (No space left on device).")

    monkeypatch.setattr(heatmap, "write_atomic", broken)  # every figure's file goes through it


def test_a_failure_after_some_outputs_were_written_leaves_none(folder, monkeypatch):
    """The arrays and the parameters are written before the figure; the figure fails: nothing is
    left, and a file that was there before is untouched."""
    _fail_figures(monkeypatch)
    Path("w.npy").write_bytes(b"old contents")
    before = snapshot(folder)
    result = invoke(["general", *QKV, "--save-weights", "w.npy", "--save-output", "o.npy", "--save-params", "p.npz",
                     "--json-file", "d.json", "--png", "a.png", "--quiet"])
    assert_one_clear_line(result, 1, ["a.png: cannot write (No space left on device)."])
    assert ".staged" not in result.stderr  # the message names the target, not the staged file
    assert snapshot(folder) == before


def test_inspect_and_compare_are_all_or_nothing(folder, monkeypatch):
    _fail_figures(monkeypatch)
    before = snapshot(folder)
    result = invoke(["inspect", "weights.npy", "--json-file", "d.json", "--png", "a.png", "--quiet"])
    assert_one_clear_line(result, 1, ["a.png: cannot write"])
    result = invoke(["compare", "weights.npy", "w2.npy", "--json-file", "d.json", "--png", "a.png", "--quiet"])
    assert_one_clear_line(result, 1, ["a.png: cannot write"])
    assert snapshot(folder) == before


def test_a_failed_computation_leaves_no_output(folder):
    before = snapshot(folder)
    result = invoke(["scaled", *QKV, "--dtype", "float16", "--scale", "100000", "--save-weights", "w.npy",
                     "--png", "a.png", "--json-file", "d.json"])
    assert result.exit_code == 1 and "Traceback" not in result.stderr
    assert snapshot(folder) == before


def test_a_fifo_target_is_refused_before_computing(folder):
    os.mkfifo("f.npy")
    before = snapshot(folder)
    result = invoke(["scaled", *QKV, "--png", "a.png", "--save-weights", "f.npy"])
    assert_one_clear_line(result, 1, ["--save-weights f.npy: exists and is not a regular file"])
    assert snapshot(folder) == before


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0, reason="root writes into any folder")
def test_an_unwritable_folder_is_refused_before_computing(folder):
    Path("ro").mkdir()
    Path("ro").chmod(0o555)
    try:
        result = invoke(["scaled", *QKV, "--png", "a.png", "--json-file", "ro/d.json"])
        assert_one_clear_line(result, 1, ["--json-file ro/d.json: cannot write into ro"])
        assert not Path("a.png").exists()
    finally:
        Path("ro").chmod(0o755)


def test_success_puts_every_output_in_place_and_leaves_nothing_else(folder):
    Path("w.npy").write_bytes(b"old contents")
    before = set(snapshot(folder))
    result = invoke(["general", *QKV, "--save-weights", "w.npy", "--save-output", "o.npy", "--save-params", "p.npz",
                     "--json-file", "d.json", "--png", "a.png", "--quiet"])
    assert result.exit_code == 0, result.stderr
    assert set(snapshot(folder)) - before == {"o.npy", "p.npz", "d.json", "a.png"}
    assert np.load("w.npy").shape == (3, 4)  # replaced, atomically, by a run that succeeded
    assert json.loads(Path("d.json").read_text())["files"]["png"] == "a.png"
    result = invoke(["inspect", "weights.npy", "--png", "i.png", "--map-png", "m.png", "--stats-png", "s.png",
                     "--json-file", "i.json", "--quiet"])
    assert result.exit_code == 0, result.stderr
    assert {"i.png", "m.png", "s.png", "i.json"} <= set(snapshot(folder))
    assert not [name for name in snapshot(folder) if ".staged" in name]


# ----------------------------------------------------------------------------------------------
# Item 9, the option half: a fuzz over random values of random options of random commands

PATH_OPTIONS = {"--png", "--map-png", "--stats-png", "--json-file", "--save-weights", "--save-output", "--save-params",
                "--received-png", "--save-ids", "--save-labels",
                "--params", "--mask", "--key-padding-mask", "--check-mask", "--positions", "--adjacency", "--unary",
                "--from-keras", "--labels", "--q-labels", "--k-labels"}
PATHS = ["out.png", "out.svg", "o.json", "w.npy", "p.npz", "q.npy", "weights.npy", "mh_ok.npz", "tokens.txt",
         "nodir/x.png", "sub", ".", "", "a,b,c", "adj.npy"]
ODD = ["0", "-0", "-0.0", "1", "-1", "2", "3", "nan", "-nan", "inf", "-inf", "1e309", "1e-320", "0x10", "1_000", "½",
       "٣", "", " ", "--", "-", "--help-me", "\x1b[31m", "\x00", "\u202e", "\r", ":smile:", "[bold]x", "$x$", "a,b",
       "0,0", "-1,0", "512M", "0.5G", "1e3", "9" * 40, "keep", "block", "cpu", "gpu", "float64", "general", "topk"]


def _option_lists() -> dict[str, list[tuple[str, bool]]]:
    """Each command's options: (flag, is a flag without value)."""
    out = {}
    for name, command in COMMANDS.items():
        out[name] = [(max(p.opts, key=len), p.type_descriptor.annotation is bool)
                     for p in command.params if p.param_type_name == "option" and "--help" not in p.opts]
    return out


OPTIONS = _option_lists()
VALUES = st.one_of(st.integers(-(2**70), 2**70).map(str), st.floats(allow_nan=True, allow_infinity=True).map(str),
                   st.floats(allow_nan=True, allow_infinity=True).map(repr), st.sampled_from(ODD),
                   st.text(max_size=12))


@st.composite
def command_lines(draw):
    command = draw(st.sampled_from(sorted(OPTIONS)))
    argv = [command, *BASE[command]]
    for _ in range(draw(st.integers(1, 3))):
        flag, is_flag = draw(st.sampled_from(OPTIONS[command]))
        if is_flag:
            argv.append(flag)
        else:
            argv += [flag, draw(st.sampled_from(PATHS)) if flag in PATH_OPTIONS else draw(VALUES)]
    if command not in ("variants", "batch") and draw(st.booleans()):
        argv.append("--quiet")
    return argv


@contextmanager
def chdir(path: Path):
    old = os.getcwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(old)


@pytest.fixture(scope="module")
def fuzz_folder(tmp_path_factory) -> tuple[Path, Path]:
    """The folder the fuzz runs in, and a pristine copy to restore what a successful run replaced."""
    base = tmp_path_factory.mktemp("fuzz")
    folder, pristine = build(base / "run"), build(base / "pristine")
    (folder / "sub").mkdir()
    return folder, pristine


OUTPUTS = {"--png", "--map-png", "--stats-png", "--json-file", "--save-weights", "--save-output", "--save-params",
           "--received-png", "--save-ids", "--save-labels"}


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                    HealthCheck.too_slow])
@given(argv=command_lines())
def test_fuzz_option_values(fuzz_folder, argv):
    folder, pristine = fuzz_folder
    targets = {value for flag, value in zip(argv, argv[1:]) if flag in OUTPUTS}
    with chdir(folder):
        before = snapshot(folder)
        result = invoke(argv)
        after = snapshot(folder)
        try:
            assert result.exit_code in (0, 1, 2, 3), (argv, result.exit_code, result.stderr, result.exception)
            for text in (result.stdout, result.stderr):
                assert "Traceback" not in text and "internal error" not in text, (argv, text)
            assert not [name for name in after if ".staged" in name], (argv, after)
            unchanged = {k: v for k, v in before.items() if k not in targets}
            assert {k: after.get(k) for k in unchanged} == unchanged, argv  # inputs untouched
            if result.exit_code not in (0, 3):
                assert after == before, (argv, result.stderr)  # no new or changed file on failure
                lines = result.stderr.strip().splitlines()
                where = [n for n, line in enumerate(lines) if line.startswith("attnviz: error: ")]
                assert where and len(lines) - where[0] <= 2, (argv, result.stderr)  # one or two lines
                assert not any(ch in result.stderr for ch in "\x1b\x00\r\x07\u202e"), (argv, result.stderr)
        finally:  # back to the folder as built: a run that succeeded may have written its outputs
            for name in set(after) - set(before):
                if (folder / name).is_file():
                    (folder / name).unlink()
            for name in before:
                if after.get(name) != before[name] and (pristine / name).is_file():
                    shutil.copy(pristine / name, folder / name)


@pytest.mark.parametrize("argv, expected", [
    (["scaled", "q.npy", "k.npy", "v.npy", "--sinks", ""], "--sinks is per head"),  # found by the fuzz test
    (["scaled", "q.npy", "k.npy", "v.npy", "--relative-bias-table", ""], "--relative-bias-table is per head"),
    (["scaled", "q4.npy", "q4.npy", "q4.npy", "--sinks", ""], "'': an empty file name."),
    (["scaled", "q.npy", "k.npy", "v.npy", "--mask", ""], "'': an empty file name."),
    (["inspect", ""], "'': an empty file name."),
])
def test_empty_file_names_are_one_line(tmp_path, monkeypatch, argv, expected):
    """An empty file name once passed the per-head check of --sinks (an empty name is false) and ended in an
    internal error; and Path('') is the working folder, which read as 'is a directory'."""
    for name in "qkv":
        shutil.copy(SAMPLES / f"{name}.npy", tmp_path)
    np.save(tmp_path / "q4.npy", np.ones((1, 2, 3, 4), np.float32))
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, argv)
    assert result.exit_code == 2
    assert result.stderr.startswith(f"attnviz: error: {expected}") and result.stderr.count("\n") == 1, result.stderr

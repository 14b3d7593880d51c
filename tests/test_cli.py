"""The command line through typer's CliRunner: exit codes, stdout and stderr apart, tables, JSON,
files. The outputs are checked against the numbers of the seed note's worked example."""

from __future__ import annotations

import json
import pickle

import numpy as np
import pytest
from typer.testing import CliRunner

from attnviz import __version__
from attnviz.cli import app
from attnviz.variants import REGISTRY
from tests.conftest import SAMPLES

runner = CliRunner()
QKV = [str(SAMPLES / n) for n in ("q.npy", "k.npy", "v.npy")]
SEED_WEIGHTS = [[0, 0, 0.5, 0.5], [0, 1, 0, 0], [0.5, 0.5, 0, 0]]
SEED_OUTPUT = [[550, 5.5], [10, 0], [5.5, 0]]


def run(*args, input=None):
    return runner.invoke(app, [str(a) for a in args], input=input)


def ok(*args, input=None):
    result = run(*args, input=input)
    assert result.exit_code == 0, (result.stdout, result.stderr)
    return result


def fails(code, *args, match, input=None):
    result = run(*args, input=input)
    assert result.exit_code == code, (result.exit_code, result.stdout, result.stderr)
    assert match in result.stderr, result.stderr
    assert "Traceback" not in result.stderr and "Traceback" not in result.stdout
    assert result.stdout == ""
    assert len(result.stderr.strip().splitlines()) <= 2  # one or two lines, usage errors too
    return result


def test_version_and_help():
    assert ok("--version").stdout.strip() == f"attnviz {__version__}"
    out = ok("--help").stdout
    for name in REGISTRY:
        assert name in out


@pytest.mark.parametrize("command", ["variants", *REGISTRY])
def test_every_command_has_help(command):
    assert "Usage" in ok(command, "--help").stdout


def test_variants_lists_formulas():
    out = ok("variants").stdout
    assert "softmax(Q K^T / sqrt(d_k))" in out
    doc = json.loads(ok("variants", "--json").stdout)
    assert [d["name"] for d in doc] == list(REGISTRY)


def test_seed_example_table_prints_exact_weights():
    r = ok("scaled", *QKV)
    rows = [[c.strip() for c in ln.split("│")[1:-1]] for ln in r.stdout.splitlines() if ln.startswith("│ ")]
    assert rows[:3] == [
        ["0", "0.000", "0.000", "0.500", "0.500"],
        ["1", "0.000", "1.000", "0.000", "0.000"],
        ["2", "0.500", "0.500", "0.000", "0.000"],
    ]
    assert rows[3][:5] == ["0", "0.693", "0.500", "0.500", "2"]  # statistics: H, H/ln n, max, argmax
    assert "per-query statistics" in r.stdout
    assert "CPU:0" in r.stderr and "CPU:0" not in r.stdout


@pytest.mark.parametrize("inputs", [
    QKV,
    [str(SAMPLES / "seed_example.npz")],
    [str(SAMPLES / n) for n in ("q.json", "k.json", "v.json")],
    [f"{SAMPLES / 'seed_example.npz'}:q", f"{SAMPLES / 'seed_example.npz'}:k", f"{SAMPLES / 'seed_example.npz'}:v"],
])
def test_json_document_for_every_input_form(inputs):
    r = ok("scaled", *inputs, "--json")
    doc = json.loads(r.stdout)  # stdout holds the JSON document and nothing else
    assert doc["attnviz"] == __version__ and doc["variant"] == "scaled"
    assert doc["device"] == "CPU:0" and doc["dtype"] == "float32"
    assert doc["inputs"] == {"q": [3, 3], "k": [4, 3], "v": [4, 2]}
    assert doc["params"]["scale"] == pytest.approx(1 / np.sqrt(3))
    np.testing.assert_allclose(doc["weights"], SEED_WEIGHTS, atol=1e-6)
    assert doc["weights_shape"] == [3, 4] and doc["output_shape"] == [3, 2]
    np.testing.assert_allclose(doc["output"], SEED_OUTPUT, rtol=1e-6, atol=1e-4)
    np.testing.assert_allclose(doc["stats"]["entropy"], [np.log(2), 0, np.log(2)], atol=1e-6)
    assert doc["stats"]["argmax"] == [2, 1, 0]
    np.testing.assert_allclose(doc["stats"]["row_sum"], [1, 1, 1], atol=1e-6)
    assert doc["maps"] == {} and doc["warnings"] == [] and doc["files"] == {}


def test_stdin_json():
    q = json.dumps(np.load(SAMPLES / "q.npy").tolist())
    doc = json.loads(ok("dot", "-", QKV[1], QKV[2], "--json", input=q).stdout)
    assert doc["variant"] == "dot" and doc["params"]["scale"] == 1.0
    bundle = json.dumps({n: np.load(SAMPLES / f"{n}.npy").tolist() for n in "qkv"})
    doc = json.loads(ok("scaled", "-", "--json", input=bundle).stdout)
    np.testing.assert_allclose(doc["weights"], SEED_WEIGHTS, atol=1e-6)


def test_mask_conventions_and_padding_file():
    keep = ok("scaled", *QKV, "--mask", SAMPLES / "padding_mask.npy", "--json")
    doc = json.loads(keep.stdout)
    assert [row[3] for row in doc["weights"]] == [0, 0, 0]
    np.testing.assert_allclose(doc["weights"][0], [0, 0, 1, 0], atol=1e-6)
    block = json.loads(ok("scaled", *QKV, "--mask", SAMPLES / "padding_mask.npy",
                          "--mask-convention", "block", "--json").stdout)
    # block: only key 3 may be attended
    np.testing.assert_allclose(block["weights"], [[0, 0, 0, 1]] * 3, atol=1e-6)


def test_fully_masked_rows_warn_and_give_zeros(tmp_path):
    mask = np.ones((3, 4), np.int8)
    mask[1] = 0
    np.save(tmp_path / "m.npy", mask)
    r = ok("scaled", *QKV, "--mask", tmp_path / "m.npy", "--json")
    doc = json.loads(r.stdout)
    assert doc["weights"][1] == [0, 0, 0, 0] and doc["output"][1] == [0, 0]
    assert "every key masked" in r.stderr and "row 1" in r.stderr
    assert doc["warnings"] and doc["stats"]["entropy"][1] is None and doc["stats"]["argmax"][1] is None
    table = ok("scaled", *QKV, "--mask", tmp_path / "m.npy").stdout
    assert "masked" in table and "·" in table


def test_causal_and_key_padding_mask(tmp_path):
    doc = json.loads(ok("scaled", QKV[1], QKV[1], QKV[2], "--causal", "--json").stdout)
    w = np.array(doc["weights"])
    assert (np.triu(w, 1) == 0).all()
    np.save(tmp_path / "pad.npy", np.array([1, 1, 0, 0]))
    doc = json.loads(ok("scaled", *QKV, "--key-padding-mask", tmp_path / "pad.npy", "--json").stdout)
    assert all(row[2] == 0 and row[3] == 0 for row in doc["weights"])


def test_labels_on_tables_and_json(tmp_path):
    r = ok("scaled", SAMPLES / "sentence.npz", "--index", "1")
    assert "the" in r.stdout and "mat" in r.stdout and "slice [1]" in r.stdout
    doc = json.loads(ok("scaled", *QKV, "--q-labels", "a,b,c", "--k-labels", '["w","x","y","z"]', "--json").stdout)
    assert doc["labels"] == {"q": ["a", "b", "c"], "k": ["w", "x", "y", "z"]}
    r = ok("scaled", QKV[1], QKV[1], QKV[2], "--labels", "w,x,y,z")
    assert "0 w" in r.stdout


def test_long_maps_are_elided(tmp_path):
    rng = np.random.default_rng(0)
    x = tmp_path / "x.npy"
    np.save(x, rng.normal(size=(100, 8)))
    r = ok("scaled", x, x, x, "--max-rows", "10", "--max-cols", "6")
    assert "not shown: rows 5-94 of 100, columns 3-96 of 100" in r.stdout
    assert "⋮" in r.stdout and "…" in r.stdout
    full = ok("scaled", x, x, x, "--max-rows", "0", "--max-cols", "0")
    assert "not shown" not in full.stdout


def test_saves_weights_output_and_png(tmp_path):
    w, o, png = tmp_path / "w.npy", tmp_path / "o.npy", tmp_path / "attn.png"
    r = ok("scaled", *QKV, "--save-weights", w, "--save-output", o, "--png", png, "--quiet")
    assert r.stdout == ""
    np.testing.assert_allclose(np.load(w), SEED_WEIGHTS, atol=1e-6)
    np.testing.assert_allclose(np.load(o), SEED_OUTPUT, rtol=1e-6, atol=1e-4)
    assert png.stat().st_size > 5000
    doc = json.loads(ok("scaled", *QKV, "--png", png, "--json").stdout)
    assert doc["files"] == {"png": str(png)}


def test_no_table_prints_nothing_on_stdout():
    r = ok("scaled", *QKV, "--no-table")
    assert r.stdout == "" and "CPU:0" in r.stderr


@pytest.mark.parametrize("dtype", ["float64", "float16", "bfloat16"])
def test_dtypes(dtype):
    doc = json.loads(ok("scaled", *QKV, "--dtype", dtype, "--json").stdout)
    assert doc["dtype"] == dtype
    np.testing.assert_allclose(doc["weights"], SEED_WEIGHTS, atol=1e-2)


# ---- every bad input: a short message naming the problem, the right exit code, no traceback ----

@pytest.fixture
def bad(tmp_path):
    np.save(tmp_path / "obj.npy", np.array([{"a": 1}], dtype=object), allow_pickle=True)
    (tmp_path / "pickle.npy").write_bytes(pickle.dumps({"evil": True}))
    np.save(tmp_path / "nan.npy", np.array([[0, 0, np.nan]]))
    np.save(tmp_path / "k2.npy", np.ones((4, 2)))
    np.save(tmp_path / "v5.npy", np.ones((5, 2)))
    np.save(tmp_path / "empty.npy", np.ones((0, 3)))
    np.save(tmp_path / "mask35.npy", np.ones((3, 5)))
    (tmp_path / "ragged.json").write_text("[[1, 2, 3], [4]]")
    (tmp_path / "words.json").write_text('[["a", "b", "c"]]')
    (tmp_path / "x.csv").write_text("1,2,3")
    return tmp_path


@pytest.mark.parametrize("code, args, match", [
    (2, ["missing.npy", QKV[1], QKV[2]], "missing.npy: no such file"),
    (2, ["x.csv", QKV[1], QKV[2]], "x.csv: unknown file type '.csv'"),
    (1, ["obj.npy", QKV[1], QKV[2]], "obj.npy: holds pickled Python objects"),
    (1, ["pickle.npy", QKV[1], QKV[2]], "never unpickles"),
    (1, ["ragged.json", QKV[1], QKV[2]], "ragged.json: the nested lists are ragged"),
    (1, ["words.json", QKV[1], QKV[2]], "words.json: holds non-numeric values"),
    (1, ["empty.npy", QKV[1], QKV[2]], "empty.npy: the array is empty (shape [0, 3])"),
    (1, ["nan.npy", QKV[1], QKV[2]], "nan.npy: 1 non-finite value(s), the first at index [0, 2]"),
    (1, [QKV[0], "k2.npy", QKV[2]], "d_k differs"),
    (1, [QKV[0], QKV[1], "v5.npy"], "Lk differs"),
    (1, [*QKV, "--mask", "mask35.npy"], "does not broadcast to the weights' shape [3, 4]"),
    (1, [*QKV, "--q-labels", "a,b"], "2 labels for 3 queries"),
    (2, [*QKV, "--labels", "a,b,c"], "use --q-labels and --k-labels"),
    (2, [QKV[0]], "scaled needs Q K V"),
    (2, [*QKV, "--png", "out.gif"], "must end in .png, .svg or .pdf"),
    (2, [*QKV, "--save-weights", QKV[0]], "one of the input files; refusing to overwrite it"),
    (1, [*QKV, "--save-weights", "nodir/w.npy"], "does not exist"),
    (1, [*QKV, "--device", "gpu"], "TensorFlow sees no GPU"),
    (2, [*QKV, "--dtype", "int8"], "--dtype 'int8': expected one of float32, float64, float16, bfloat16."),
    (2, [*QKV, "--scale", "-1"], "--scale -1: must be positive."),
    (2, [*QKV, "--index", "1"], "no batch/head dimensions"),
    (2, [*QKV, "--bogus"], "--bogus: no such option of attnviz scaled"),
    (1, [*QKV, "--dtype", "float16", "--scale", "100000"], "overflowed float16"),
])
def test_bad_inputs(bad, monkeypatch, code, args, match):
    monkeypatch.chdir(bad)
    if "--device" in args:
        import tensorflow as tf

        if tf.config.list_physical_devices("GPU"):
            pytest.skip("a GPU is visible")
    fails(code, "scaled", *args, match=match)


def test_failed_run_writes_no_file(tmp_path):
    out = tmp_path / "w.npy"
    fails(1, "scaled", *QKV, "--dtype", "float16", "--scale", "100000", "--save-weights", out, match="overflow")
    assert not out.exists()
    assert list(tmp_path.iterdir()) == []


def test_index_out_of_range_on_batched_input():
    fails(2, "scaled", SAMPLES / "sentence.npz", "--index", "2", match="that dimension has size 2")


def _gpu_visible():
    import tensorflow as tf

    return bool(tf.config.list_physical_devices("GPU"))


def test_gpu_matches_cpu():
    if not _gpu_visible():
        pytest.skip("no GPU visible to TensorFlow")
    rng = np.random.default_rng(0)
    from tests.conftest import compute

    q, k, v = rng.normal(size=(2, 5, 8)), rng.normal(size=(2, 6, 8)), rng.normal(size=(2, 6, 3))
    cpu = compute("scaled", q, k, v)
    doc = json.loads(ok("scaled", SAMPLES / "seed_example.npz", "--device", "gpu", "--json").stdout)
    assert doc["device"].startswith("GPU")
    from attnviz.device import Device
    from attnviz.masks import Mask
    from attnviz.variants import REGISTRY as R
    from attnviz.variants.base import Context

    gpu = R["scaled"].compute(Context(Device("GPU:0", "/GPU:0"), "float32"), {"q": q, "k": k, "v": v}, Mask(),
                              R["scaled"].params(), {})
    np.testing.assert_allclose(gpu.weights, cpu.weights, atol=1e-5)


def test_bracketed_token_labels_are_text_not_markup():
    r = ok("scaled", *QKV, "--q-labels", "[CLS],cat,[SEP]", "--k-labels", "[CLS],a,b,[bold]x")
    assert "[CLS]" in r.stdout and "[SEP]" in r.stdout and "[bold]x" in r.stdout
    assert "variants" in ok("--help").stdout and "S = w^T[h; u; h*u]" in ok("variants").stdout

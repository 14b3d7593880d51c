"""The Python API (issue 21): the same numbers and documents as the command line, from arrays and
tensors; results that table, draw, save and show themselves inline; errors and warnings as the command
line's; ``import attnviz`` instant."""

from __future__ import annotations

import json
import subprocess
import sys
import warnings

import numpy as np
import pytest
from typer.testing import CliRunner

import attnviz
from attnviz.cli import app
from tests.conftest import ROOT
from tests.test_readme_examples import EXAMPLES, folder, split_shell  # noqa: F401  (the README's inputs)

runner = CliRunner()


def test_import_attnviz_imports_neither_numpy_nor_tensorflow():
    code = ("import sys, attnviz; attnviz.__all__; print(sorted(m for m in ('numpy', 'tensorflow', 'matplotlib', "
            "'rich', 'typer') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert out.stdout.strip() == "[]"


def test_the_api_names_every_attention_type():
    from attnviz.variants import REGISTRY

    assert list(attnviz.VARIANTS) == list(REGISTRY)
    for name in attnviz.__all__:
        assert getattr(attnviz, name) is not None
    assert "scaled dot-product attention" in attnviz.scaled.__doc__ and ">>> result = attnviz.scaled(q, k, v)" in \
        attnviz.scaled.__doc__


def cli_json(argv):
    r = runner.invoke(app, [*argv, "--json"])
    assert r.exit_code == 0, r.stderr
    return r.stdout.strip()


OUTPUTS = {"png", "json", "json_file", "html", "save_weights", "save_output", "save_params", "quiet", "no_table",
           "index", "precision", "max_rows", "max_cols", "title", "cmap", "reduce", "vmin", "vmax", "norm",
           "scale_per_panel", "show"}
COMPUTE_EXAMPLES = [line for line in EXAMPLES if split_shell(line)[0][1] in attnviz.VARIANTS and "--help" not in line
                    and "{" not in line and "acts.npz" not in line and "padding.npy" not in line and "32k" not in line]
FILE_FLAGS = ("--png", "--html", "--save-weights", "--save-output", "--save-params", "--json-file")


def without_outputs(argv):
    """The command line without the files it writes (the API's document lists none)."""
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a in FILE_FLAGS:
            skip = True
        elif a not in ("--json", "--quiet", "--no-table", "--show"):
            out.append(a)
    return out


def parsed(argv):
    """The command's values, as the command line parsed them: (inputs, options)."""
    from attnviz.cli.console import click_command
    from attnviz.variants import REGISTRY

    name = argv[0]
    command = click_command(name).commands[name]
    with command.make_context(name, list(argv[1:])) as ctx:
        values = dict(ctx.params)
    inputs = [values.pop(spec.name) for spec in REGISTRY[name].inputs]
    options = {k: v for k, v in values.items() if k not in OUTPUTS and v != ctx.command.params[
        [p.name for p in ctx.command.params].index(k)].default}
    return inputs, options


@pytest.mark.parametrize("line", COMPUTE_EXAMPLES)
def test_every_attention_type_gives_the_command_s_document(line, folder, monkeypatch):  # noqa: F811
    monkeypatch.chdir(folder)
    argv = [a for a in split_shell(line)[0][1:]]
    inputs, options = parsed(argv)
    keep = without_outputs(argv)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from_files = attnviz.compute(argv[0], *[s for s in inputs if s is not None], **options)
    assert from_files.to_json() == cli_json(keep)
    # the same with arrays instead of the input files
    arrays = [np.load(s) if s is not None and s.endswith(".npy") else s for s in inputs if s is not None]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from_arrays = attnviz.compute(argv[0], *arrays, **options)
    a, b = json.loads(from_arrays.to_json()), json.loads(cli_json(keep))
    for doc in (a, b):  # what names the inputs' sources differs: a file's name, or the argument's
        doc.pop("mask", None)
        if doc.get("learned_params"):
            doc["learned_params"].pop("source")
    assert a == b


def test_tensors_torch_bf16_and_tensorflow(tmp_path):
    torch = pytest.importorskip("torch")
    tf = pytest.importorskip("tensorflow")
    rng = np.random.default_rng(0)
    q, k, v = (rng.normal(size=(2, 5, 8)).astype(np.float32) for _ in range(3))
    expected = attnviz.scaled(q, k, v).weights
    np.testing.assert_allclose(attnviz.scaled(torch.tensor(q), torch.tensor(k), torch.tensor(v)).weights, expected,
                               atol=1e-6)
    np.testing.assert_allclose(attnviz.scaled(tf.constant(q), tf.constant(k), tf.constant(v)).weights, expected,
                               atol=1e-6)
    bf16 = attnviz.scaled(torch.tensor(q).bfloat16(), torch.tensor(k).bfloat16(), v)
    assert bf16.weights.dtype == np.float32 and np.abs(bf16.weights - expected).max() < 0.05
    layers = tuple(torch.tensor(expected)[None] for _ in range(3))  # out.attentions: a tuple of [B, H, L, L]
    report = attnviz.inspect(layers, labels=list("abcde"), mask=torch.ones(1, 5))
    assert report.weights.shape == (3, 1, 2, 5, 5) and report.head_stats["entropy"].shape == (3, 2)


def test_inspect_compare_rollout_give_the_command_s_documents(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    w = np.random.default_rng(1).dirichlet(np.ones(6), size=(2, 1, 3, 6)).astype(np.float32)
    np.save("w.npy", w)
    (tmp_path / "tok.txt").write_text("a\nb\nc\nd\ne\nf\n")
    api = attnviz.inspect("w.npy", labels="tok.txt", check_rows=True)
    assert api.to_json() == cli_json(["inspect", "w.npy", "--labels", "tok.txt", "--check-rows"])
    from_arrays = attnviz.inspect(w, labels=list("abcdef"), check_rows=True)
    assert from_arrays.document()["head_stats"] == json.loads(api.to_json())["head_stats"]
    assert attnviz.compare("w.npy", "w.npy", atol=1e-6).to_json() == cli_json(["compare", "w.npy", "w.npy", "--atol",
                                                                               "1e-6"])
    assert attnviz.rollout("w.npy", labels="tok.txt").to_json() == cli_json(["rollout", "w.npy", "--labels",
                                                                             "tok.txt"])
    with pytest.warns(UserWarning, match="does not hold attention weights as distributions"):
        assert attnviz.compare(w, w * 0.5, atol=1e-3).passed is False


def test_results_table_draw_save_and_show_inline(tmp_path, monkeypatch):
    from rich.console import Console

    monkeypatch.chdir(tmp_path)
    rng = np.random.default_rng(2)
    q, k, v = (rng.normal(size=(2, 4, 6, 8)).astype(np.float32) for _ in range(3))
    result = attnviz.scaled(q, k, v, causal=True, labels=list("abcdef"))
    console = Console(width=100, record=True)
    console.print(result.table(index=(1, 2)))
    assert "slice [1, 2]" in console.export_text()
    fig = result.figure(title="mine")
    assert type(fig).__name__ == "Figure" and fig.axes
    result.save("a.png", html="a.html", json="a.json", weights="w.npy")
    assert (tmp_path / "a.png").stat().st_size > 1000 and np.load("w.npy").shape == (2, 4, 6, 6)
    assert json.loads((tmp_path / "a.json").read_text())["variant"] == "scaled"
    inline = result._repr_html_()
    other = attnviz.inspect(result.weights)._repr_html_()
    assert inline.startswith("<iframe srcdoc=") and other.startswith("<iframe srcdoc=")
    for page in (inline, other):
        assert "http://" not in page and "https://" not in page  # offline: no network reference
    assert repr(result) == "<attnviz scaled: weights [2, 4, 6, 6], CPU:0, float32>"


def test_errors_and_warnings_in_python_s_words(tmp_path):
    q = np.zeros((3, 4), np.float32)
    with pytest.raises(attnviz.ShapeError, match="d_k differs"):
        attnviz.scaled(q, np.zeros((3, 5), np.float32), np.zeros((3, 2), np.float32))
    with pytest.raises(attnviz.UsageError, match=r"no keyword 'casual'; did you mean causal=\?"):
        attnviz.scaled(q, q, q, casual=True)
    with pytest.raises(attnviz.UsageError, match="dtype='float8'"):
        attnviz.scaled(q, q, q, dtype="float8")
    with pytest.raises(attnviz.UsageError, match="scale=0: must be greater than 0"):
        attnviz.scaled(q, q, q, scale=0)
    mask = np.zeros((3, 3), bool)
    mask[1:] = True
    with pytest.warns(UserWarning, match="have every key masked"):
        attnviz.scaled(q, q, q, mask=mask)
    with pytest.raises(attnviz.AttnvizError) as info:
        attnviz.inspect(str(tmp_path / "missing.npy"))
    assert str(info.value).endswith("no such file.")


def test_the_example_notebook_runs_in_a_real_kernel_offline():
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    notebook = nbformat.read(ROOT / "examples" / "attention.ipynb", as_version=4)
    # a last cell of the test's own, without output: the kernel's objects (TensorFlow's, torch's, transformers')
    # frozen out of the garbage collector's passes at its shutdown, which the test waits for (~3 s)
    notebook.cells.append(nbformat.v4.new_code_cell("import gc\ngc.freeze()"))
    nbclient.NotebookClient(notebook, timeout=300, kernel_name="python3",
                            resources={"metadata": {"path": str(ROOT)}}).execute()
    outputs = [o for cell in notebook.cells if cell.cell_type == "code" for o in cell.get("outputs", [])]
    assert not [o for o in outputs if o.output_type == "error"]
    html = [o["data"]["text/html"] for o in outputs if "text/html" in o.get("data", {})]
    assert sum("<iframe srcdoc=" in h for h in html) == 2  # the two inline reports, each in its own frame
    assert any("image/png" in o.get("data", {}) for o in outputs)  # the figure
    text = json.dumps([o for o in outputs])
    assert "http://" not in text and "https://" not in text  # the saved outputs hold no network reference
    assert "[2, 4, 6, 6]" in text
    assert "(2, 1, 4, 6, 6)" in text  # the captured GPT-2's maps


def test_the_readme_python_section_runs(tmp_path, monkeypatch):
    """The three common uses of docs/python.md, on a small Llama with its own attentions and hooked q, k, v."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    import re

    monkeypatch.chdir(tmp_path)
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=50, hidden_size=32, num_hidden_layers=4, num_attention_heads=4,
                                      num_key_value_heads=2, intermediate_size=48, max_position_embeddings=64)
    config._attn_implementation = "eager"
    model = transformers.LlamaForCausalLM(config).eval()
    model.config.save_pretrained("model")
    captured = {}
    attention = model.model.layers[3].self_attn
    for name in ("q_proj", "k_proj", "v_proj"):
        getattr(attention, name).register_forward_hook(lambda m, a, o, name=name: captured.update({name: o}))
    batch = {"input_ids": torch.randint(3, 50, (2, 7)), "attention_mask": torch.ones(2, 7, dtype=torch.long)}
    with torch.no_grad():
        out = model(**batch, output_attentions=True)
    q, k, v = (captured[n].view(2, 7, -1, 8) for n in ("q_proj", "k_proj", "v_proj"))
    from tests.docs_text import page

    section = page("python.md")
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    names = {"out": out, "batch": batch, "tokens": [f"t{i}" for i in range(7)], "q": q, "k": k, "v": v}
    exec(compile(code, "docs/python.md", "exec"), names)
    assert names["report"].head_stats["entropy"].shape == (4, 4)
    assert (tmp_path / "attn.png").stat().st_size > 1000
    checked = attnviz.compare(names["result"].weights, out.attentions[3], mask=batch["attention_mask"], atol=1e-5)
    assert checked.passed  # the config and hooks reproduce the model's own layer 3


def test_bfloat16_tensors_keep_their_stored_dtype_for_the_checks():
    """A model's bfloat16 attentions, handed over as tensors, are checked with bfloat16's tolerance, as a
    bfloat16 file is (rows of bfloat16 weights sum to 1 only within ~1e-2)."""
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    layers = tuple(torch.softmax(torch.randn(1, 4, 64, 64), -1).bfloat16() for _ in range(2))
    report = attnviz.inspect(layers, check_rows=True)
    assert report.passed and report.document()["stored_dtype"] == "bfloat16"
    assert attnviz.inspect(layers[0], check_rows=True).document()["stored_dtype"] == "bfloat16"



def _file_options():
    """(function, option) for every option of every API function whose command-line value is a file the run
    reads (metavar FILE or TOKENS): every attention type's RunOptions and its own (structured's adjacency and
    unary); CaptureOptions and ParamOptions, read by one code path for every type that has them, on the first
    type with q, k and v; inspect's, compare's and rollout's."""
    from attnviz.fields import flat_fields
    from attnviz.inspection.options import CompareOptions, InspectOptions, RolloutOptions
    from attnviz.run_options import CaptureOptions, ParamOptions, RunOptions
    from attnviz.variants import REGISTRY

    def files(cls):
        return [f.name for f, _ in flat_fields(cls) if f.metadata.get("metavar") in ("FILE", "TOKENS")]

    pairs, shared = [], set()
    for name, variant in REGISTRY.items():
        pairs += [(name, option) for option in files(RunOptions) + files(variant.params)]
        for cls in ([ParamOptions] if variant.learned else []) + ([CaptureOptions] if variant.captured_qkv else []):
            if cls not in shared and variant.captured_qkv:
                shared.add(cls)
                pairs += [(name, option) for option in files(cls)]
    assert shared == {CaptureOptions, ParamOptions}
    for name, cls in (("inspect", InspectOptions), ("compare", CompareOptions), ("rollout", RolloutOptions)):
        pairs += [(name, option) for option in files(cls)]
    return pairs


FILE_OPTION_PAIRS = _file_options()


def _kinds(value):
    """The value as NumPy, PyTorch and TensorFlow hand it over (a dict of arrays: each of them)."""
    torch = pytest.importorskip("torch")
    tf = pytest.importorskip("tensorflow")
    convert = {"numpy": np.asarray, "torch": torch.as_tensor, "tensorflow": tf.constant}
    for kind, to in convert.items():
        yield kind, ({k: to(v) for k, v in value.items()} if isinstance(value, dict) else to(value))


def _outcome(run, given, names):
    """The run's document, or its error, with the sources named alike (a file by its path, a value by the
    option's name)."""
    try:
        text = run(given).to_json()
    except attnviz.AttnvizError as exc:
        text = json.dumps({"error": type(exc).__name__, "message": str(exc)})
    for name, option in names:
        text = text.replace(name, option)
    return json.loads(text)


@pytest.mark.parametrize("function,option", FILE_OPTION_PAIRS, ids=[f"{f}-{o}" for f, o in FILE_OPTION_PAIRS])
def test_every_file_option_of_every_function_takes_arrays(function, option, tmp_path, monkeypatch,
                                                          folder):  # noqa: F811
    """Issue 34: each option that takes a file on the command line takes the value itself in the API (an array
    as NumPy, PyTorch or TensorFlow hand it over; a label list; a config dict) and gives what the file gives.
    Before, an array for structured's adjacency reached the file reader ("The truth value of an array ... is
    ambiguous"). Attention types other than scaled run their README example, the value shaped to its map."""
    rng = np.random.default_rng(4)
    q = rng.normal(size=(2, 4, 8)).astype(np.float32)  # 2 heads, 4 positions, d 8
    w = rng.dirichlet(np.ones(17), size=(2, 1, 2, 17)).astype(np.float32)  # a ViT's [CLS] and 4x4 patches
    inputs, fixed = [q, q, q], {}
    if function in attnviz.VARIANTS and function != "scaled" and option in (
            "mask", "key_padding_mask", "labels", "q_labels", "k_labels"):
        monkeypatch.chdir(folder)  # the README example's files
        line = next(line for line in COMPUTE_EXAMPLES if split_shell(line)[0][1] == function)
        given_inputs, fixed = parsed(split_shell(line)[0][1:])
        if option.endswith("labels"):
            fixed = {k: v for k, v in fixed.items() if not k.endswith("labels")}
        inputs = [s for s in given_inputs if s is not None]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            lq, lk = attnviz.compute(function, *inputs, **fixed).weights.shape[-2:]
    else:
        monkeypatch.chdir(tmp_path)
        lq = lk = 4
    keep = np.ones((lq, lk), np.int64)
    keep[:, -1] = 0
    tril = np.tril(np.ones((4, 4), np.int64))
    cases = {  # option: (value, further options)
        "mask": (keep, {}), "key_padding_mask": (keep[0], {}), "positions": (np.array([3, 2, 1, 0]), {"rope": True}),
        "sinks": (np.array([0.5, -1.0], np.float32), {}), "relative_bias_table": (rng.normal(size=(8, 2)), {}),
        "adjacency": (tril, {}), "unary": (rng.normal(size=(4, 4)), {"method": "crf"}),
        "labels": ([f"t{i}" for i in range(lk)], {}), "q_labels": ([f"t{i}" for i in range(lq)], {}),
        "k_labels": ([f"t{i}" for i in range(lk)], {}),
        "hf_config": ({"model_type": "llama", "hidden_size": 16, "num_attention_heads": 2, "num_hidden_layers": 1,
                       "rope_theta": 500.0}, {}),
    }
    if function in ("inspect", "compare", "rollout"):
        keep = np.ones((17, 17), np.int64)
        keep[:, -1] = 0
        labels = [f"t{i}" for i in range(17)]
        cases.update({"mask": (keep, {}), "key_padding_mask": (keep[0], {}), "check_mask": (keep, {}),
                      "image": (rng.integers(0, 256, size=(32, 32, 3)).astype(np.uint8), {"patch_grid": "4x4"}),
                      "labels": (labels, {}), "q_labels": (labels, {}), "k_labels": (labels, {}),
                      "grads": (rng.normal(size=w.shape).astype(np.float32), {"method": "grad"})})
    if option == "params":
        np.save(tmp_path / "q.npy", q)
        r = runner.invoke(app, [function, "q.npy", "q.npy", "q.npy", "--seed", "0", "--save-params", "p.npz",
                                "--quiet"])
        assert r.exit_code == 0, r.stderr
        cases["params"] = (dict(np.load("p.npz")), {})
    assert option in cases, f"{function}: no case for its file option {option}"
    value, extra = cases[option]

    def run(given):
        options = {**fixed, option: given, **extra}
        if function == "compare":
            return attnviz.compare(w, w, **options)
        if function in ("inspect", "rollout"):
            return getattr(attnviz, function)(w, **options)
        return attnviz.compute(function, *inputs, **options)

    if isinstance(value, dict) and option == "hf_config":
        path = tmp_path / "given.json"
        path.write_text(json.dumps(value))
    elif isinstance(value, dict):
        path = tmp_path / "given.npz"
        np.savez(path, **value)
    elif isinstance(value, list):
        path = tmp_path / "given.txt"
        path.write_text("\n".join(value) + "\n")
    else:
        path = tmp_path / "given.npy"
        np.save(path, value)
    names = [(str(path), option), (path.name, option)]  # a path, or its name (the config's summary)
    if isinstance(value, list):
        givens = [("list", value), ("numpy", np.array(value))]
    elif option == "hf_config":
        givens = [("dict", value)]
    else:
        givens = list(_kinds(value))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        expected = _outcome(run, str(path), names)
        for kind, given in givens:
            assert _outcome(run, given, names) == expected, kind

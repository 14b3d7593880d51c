"""Files users hold: .safetensors (NumPy API, bf16/f16), HDF5 and torch.save files next to .npy/.npz,
behind io.open_spec; key globs in natural order; capped key listings; --params and masks from every
container; corrupt files, objects torch refuses and a missing torch exit 1 with one clear line."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
from typer.testing import CliRunner

from attnviz.cli import app
from attnviz.errors import InputError, ParamsError, UsageError
from attnviz.formats import CONTAINER_SUFFIXES, listing, natural_key
from attnviz.inspection.weights import load_weights
from attnviz.io import load_array, open_spec, split_spec
from attnviz.params import read as read_params
from tests.conftest import ROOT

h5py = pytest.importorskip("h5py")
safetensors_numpy = pytest.importorskip("safetensors.numpy")
ml_dtypes = pytest.importorskip("ml_dtypes")

runner = CliRunner()
RNG = np.random.default_rng(7)
A = RNG.normal(size=(2, 3, 4)).astype(np.float32)


def invoke(*args, input=None):
    return runner.invoke(app, [str(a) for a in args], input=input)


def ok(*args):
    r = invoke(*args)
    assert r.exit_code == 0, (r.stdout, r.stderr)
    return r


def fails(code, *args, match):
    r = invoke(*args)
    assert r.exit_code == code, (r.exit_code, r.stdout, r.stderr)
    assert match in r.stderr, r.stderr
    assert "Traceback" not in r.stderr and "Traceback" not in r.stdout
    assert len(r.stderr.strip().splitlines()) <= 4, r.stderr
    return r


def save_h5(path, arrays):
    with h5py.File(path, "w") as f:
        for key, value in arrays.items():
            f[key] = value


def save_st(path, arrays):
    safetensors_numpy.save_file({k: np.ascontiguousarray(v) for k, v in arrays.items()}, str(path))


# ---------------------------------------------------------------------------------------------------
# Each format reads what a .npy of the same array reads


def test_every_format_round_trips_against_npy(tmp_path):
    np.save(tmp_path / "a.npy", A)
    reference = load_array(str(tmp_path / "a.npy")).data
    save_st(tmp_path / "a.safetensors", {"x": A})
    save_h5(tmp_path / "a.h5", {"x": A})
    save_h5(tmp_path / "g.hdf5", {"group/sub/x": A, "other": A + 1})
    for spec in ("a.safetensors", "a.safetensors:x", "a.h5", "a.h5:x", "g.hdf5:group/sub/x", "g.hdf5:/group/sub/x"):
        got = load_array(str(tmp_path / spec))
        assert got.data.dtype == np.float32 and got.data.shape == A.shape, spec
        np.testing.assert_array_equal(got.data, reference)
    assert load_array(str(tmp_path / "a.safetensors:x")).source.endswith("a.safetensors:x")


def test_float64_and_integer_dtypes_are_kept(tmp_path):
    ints = np.arange(6, dtype=np.int64).reshape(2, 3)
    save_st(tmp_path / "a.safetensors", {"d": A.astype(np.float64), "i": ints, "b": ints > 2})
    save_h5(tmp_path / "a.h5", {"d": A.astype(np.float64), "i": ints})
    for name in ("a.safetensors", "a.h5"):
        assert load_array(f"{tmp_path / name}:d").data.dtype == np.float64
        np.testing.assert_array_equal(load_array(f"{tmp_path / name}:i").data, ints)
    np.testing.assert_array_equal(load_array(f"{tmp_path / 'a.safetensors'}:b").data, ints > 2)


def test_large_safetensors_and_h5_arrays_are_memory_mapped(tmp_path):
    big = RNG.random((64, 128)).astype(np.float32)
    save_st(tmp_path / "a.safetensors", {"a": big, "b": big[:3]})
    save_h5(tmp_path / "a.h5", {"a": big})
    with h5py.File(tmp_path / "c.h5", "w") as f:
        f.create_dataset("a", data=big, compression="gzip")
    for spec in ("a.safetensors:a", "a.safetensors:b", "a.h5:a", "c.h5:a"):
        got = load_array(str(tmp_path / spec)).data
        np.testing.assert_array_equal(got, big if spec.endswith(":a") else big[:3])
    assert isinstance(load_array(f"{tmp_path / 'a.safetensors'}:a").data, np.memmap)
    assert isinstance(load_array(f"{tmp_path / 'a.h5'}:a").data, np.memmap)
    assert not isinstance(load_array(f"{tmp_path / 'c.h5'}:a").data, np.memmap)  # compressed: read whole


def test_bf16_and_f16_safetensors_become_float32(tmp_path):
    bf16 = A.astype(ml_dtypes.bfloat16)
    save_st(tmp_path / "h.safetensors", {"bf": bf16, "f16": A.astype(np.float16)})
    got = load_array(f"{tmp_path / 'h.safetensors'}:bf").data
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, bf16.astype(np.float32))  # exact: bf16 -> f32 is lossless
    np.testing.assert_allclose(got, A, rtol=1e-2)
    got = load_array(f"{tmp_path / 'h.safetensors'}:f16").data
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, A.astype(np.float16).astype(np.float32))


def test_torch_save_round_trips(tmp_path):
    torch = pytest.importorskip("torch")
    np.save(tmp_path / "a.npy", A)
    t = torch.from_numpy(A)
    torch.save(t, tmp_path / "one.pt")
    torch.save({"q": t, "nested": {"k": t, "list": [t, t * 2]}, "step": 3}, tmp_path / "d.pth")
    torch.save((t, t * 2), tmp_path / "tup.bin")
    torch.save(t, tmp_path / "legacy.pt", _use_new_zipfile_serialization=False)
    for spec in ("one.pt", "legacy.pt", "d.pth:q", "d.pth:nested.k", "d.pth:nested.list.0", "tup.bin:0"):
        got = load_array(str(tmp_path / spec)).data
        assert got.dtype == np.float32, spec
        np.testing.assert_array_equal(got, A)
    np.testing.assert_array_equal(load_array(f"{tmp_path / 'tup.bin'}:1").data, 2 * A)
    assert open_spec(str(tmp_path / "d.pth")).raw.keys == ["q", "nested.k", "nested.list.0", "nested.list.1"]
    torch.save({"b": t.bfloat16(), "h": t.half()}, tmp_path / "half.pt")
    got = load_array(f"{tmp_path / 'half.pt'}:b").data
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, t.bfloat16().float().numpy())
    assert load_array(f"{tmp_path / 'half.pt'}:h").data.dtype == np.float32
    with pytest.raises(InputError, match="holds a single array, not named arrays"):
        load_array(f"{tmp_path / 'one.pt'}:x")


def test_a_bundle_in_every_container_stands_in_for_q_k_v(tmp_path):
    q, k, v = (RNG.normal(size=(3, 4)).astype(np.float32) for _ in range(3))
    np.savez(tmp_path / "b.npz", q=q, k=k, v=v)
    save_st(tmp_path / "b.safetensors", {"q": q, "k": k, "v": v})
    labels = np.array(["tokA", "tokB", "tokC"], dtype=h5py.string_dtype())
    save_h5(tmp_path / "b.h5", {"q": q, "k": k, "v": v, "q_labels": labels})
    expected = json.loads(ok("scaled", tmp_path / "b.npz", "--json").stdout)
    for name in ("b.safetensors", "b.h5"):
        doc = json.loads(ok("scaled", tmp_path / name, "--json").stdout)
        np.testing.assert_allclose(doc["weights"], expected["weights"], rtol=1e-6)
        np.testing.assert_allclose(doc["output"], expected["output"], rtol=1e-6)
    # separate keys of one file as separate inputs
    doc = json.loads(ok("scaled", f"{tmp_path / 'b.safetensors'}:q", f"{tmp_path / 'b.safetensors'}:k",
                        f"{tmp_path / 'b.h5'}:v", "--json").stdout)
    np.testing.assert_allclose(doc["weights"], expected["weights"], rtol=1e-6)
    r = ok("scaled", tmp_path / "b.h5")
    assert "tokA" in r.stdout and "tokC" in r.stdout  # the HDF5 string dataset labels the queries


def test_torch_bundle(tmp_path):
    torch = pytest.importorskip("torch")
    q, k, v = (RNG.normal(size=(3, 4)).astype(np.float32) for _ in range(3))
    np.savez(tmp_path / "b.npz", q=q, k=k, v=v)
    torch.save({"q": torch.from_numpy(q), "k": torch.from_numpy(k), "v": torch.from_numpy(v)}, tmp_path / "b.pt")
    expected = json.loads(ok("scaled", tmp_path / "b.npz", "--json").stdout)
    doc = json.loads(ok("scaled", tmp_path / "b.pt", "--json").stdout)
    np.testing.assert_allclose(doc["weights"], expected["weights"], rtol=1e-6)


# ---------------------------------------------------------------------------------------------------
# Keys, globs, listings


def test_split_spec_knows_every_container(tmp_path):
    for suffix in CONTAINER_SUFFIXES:
        assert split_spec(f"dir/x{suffix}:key") == (f"dir/x{suffix}", "key")
    assert split_spec("x.NPZ:q") == ("x.NPZ", "q")
    assert split_spec("run.h5:attn/*") == ("run.h5", "attn/*")
    assert split_spec("a.npy:q") == ("a.npy:q", None)
    assert split_spec("a.npz:") == ("a.npz:", None)
    assert split_spec("-") == ("-", None)
    odd = tmp_path / "run.h5:odd.npz"  # a file that exists as given is never split
    with open(odd, "wb") as fh:
        np.savez(fh, q=A)
    assert split_spec(str(odd)) == (str(odd), None)
    np.testing.assert_array_equal(load_array(str(odd)).data, A)


def test_natural_order_and_capped_listing():
    assert sorted(["layer10", "layer2", "layer1"], key=natural_key) == ["layer1", "layer2", "layer10"]
    keys = [f"k{i}" for i in range(25)]
    text = listing(keys)
    assert text.endswith("k19 and 5 more") and "k20" not in text
    assert listing(keys[:20]) == ", ".join(keys[:20])


def layered(tmp_path, n=12):
    """blocks.0.attn.hook_pattern ... in every container; layer i is filled with (i + 1) / 100."""
    maps = {f"blocks.{i}.attn.hook_pattern": np.full((1, 2, 3, 3), (i + 1) / 100, np.float32) for i in range(n)}
    maps["blocks.0.mlp.hook_post"] = np.ones((1, 3, 5), np.float32)
    np.savez(tmp_path / "cache.npz", **maps)
    save_st(tmp_path / "cache.safetensors", maps)
    save_h5(tmp_path / "cache.h5", {k.replace(".attn.", "/attn/"): v for k, v in maps.items()})
    return maps


@pytest.mark.parametrize("name, pattern", [
    ("cache.npz", "blocks.*.attn.hook_pattern"),
    ("cache.safetensors", "blocks.*.attn.hook_pattern"),
    ("cache.h5", "blocks.*/attn/hook_pattern"),
])
def test_globs_stack_layers_in_natural_order(tmp_path, name, pattern):
    layered(tmp_path)
    w = load_weights(f"{tmp_path / name}:{pattern}")
    assert w.shape == (12, 1, 2, 3, 3)
    assert [natural_key(k)[1] for k in w.keys] == list(range(12))  # 2 before 10
    np.testing.assert_allclose(w.data[:, 0, 0, 0, 0], (np.arange(12) + 1) / 100)
    doc = json.loads(ok("inspect", f"{tmp_path / name}:{pattern}", "--json").stdout)
    assert len(doc["layers_from_keys"]) == 12 and doc["layers_from_keys"][10].startswith("blocks.10")
    r = ok("compare", f"{tmp_path / name}:{pattern}", f"{tmp_path / 'cache.npz'}:blocks.*.attn.hook_pattern",
           "--json")
    assert json.loads(r.stdout)["max_abs_diff"] == 0


def test_a_glob_with_one_match_is_that_array(tmp_path):
    layered(tmp_path)
    for spec in ("cache.safetensors:blocks.1[1].attn.hook_*", "cache.npz:blocks.[1][1].attn.*"):
        got = load_array(str(tmp_path / spec))
        assert got.source.endswith("blocks.11.attn.hook_pattern")
        w = load_weights(str(tmp_path / spec))
        assert w.keys == [] and w.shape == (1, 1, 2, 3, 3)


@pytest.mark.parametrize("name, pattern", [
    ("cache.npz", "blocks.*.attn.hook_pattern"),
    ("cache.safetensors", "blocks.*.attn.hook_pattern"),
    ("cache.h5", "blocks.*/attn/hook_pattern"),
])
def test_a_glob_of_many_is_an_error_where_one_array_is_wanted(tmp_path, name, pattern):
    layered(tmp_path)
    r = fails(1, "scaled", *[f"{tmp_path / name}:{pattern}"] * 3, match="the pattern matches 12 arrays")
    assert "and 2 more" not in r.stderr and "blocks.10" in r.stderr  # 12 listed, natural order
    first = r.stderr.index("blocks.2")
    assert first < r.stderr.index("blocks.10")
    qkv = [f"{tmp_path / 'cache.npz'}:blocks.0.attn.hook_pattern"] * 3
    fails(1, "scaled", *qkv, "--mask", f"{tmp_path / name}:{pattern}", match="the pattern matches 12 arrays")


def test_no_match_and_missing_keys_list_what_there_is_capped(tmp_path):
    maps = {f"w{i}": np.eye(2, dtype=np.float32) for i in range(30)}
    save_st(tmp_path / "many.safetensors", maps)
    np.savez(tmp_path / "many.npz", **maps)
    for name in ("many.safetensors", "many.npz"):
        r = fails(1, "scaled", *[f"{tmp_path / name}:x*"] * 3, match="no array matches 'x*'; it holds w0, w1, w2")
        assert "w19 and 10 more" in r.stderr and "w20" not in r.stderr
        r = fails(1, "scaled", *[f"{tmp_path / name}:nope"] * 3, match="no array named 'nope'")
        assert "and 10 more" in r.stderr
        r = fails(1, "scaled", tmp_path / name, tmp_path / name, tmp_path / name, match="holds 30 arrays")
        assert "and 10 more" in r.stderr
    save_h5(tmp_path / "g.h5", {"attn/a": np.eye(2)})
    fails(1, "scaled", *[f"{tmp_path / 'g.h5'}:attn"] * 3, match="'attn' is a group")


def test_inspect_stacks_every_array_of_a_container_without_a_key(tmp_path):
    maps = {f"layer{i}": np.full((2, 3, 3), i / 10, np.float32) for i in (10, 2, 1)}
    save_st(tmp_path / "w.safetensors", maps)
    save_h5(tmp_path / "w.h5", maps)
    for name in ("w.safetensors", "w.h5"):
        w = load_weights(str(tmp_path / name))
        assert w.keys == ["layer1", "layer2", "layer10"] and w.data[2, 0, 0, 0, 0] == pytest.approx(1.0)


def test_torch_globs(tmp_path):
    torch = pytest.importorskip("torch")
    attentions = tuple(torch.full((1, 2, 3, 3), (i + 1) / 100) for i in range(11))
    torch.save(attentions, tmp_path / "out.pt")  # as a Hugging Face output_attentions tuple
    w = load_weights(str(tmp_path / "out.pt"))
    assert w.keys == [str(i) for i in range(11)] and w.shape == (11, 1, 2, 3, 3)
    torch.save({"blocks": [{"attn": a} for a in attentions]}, tmp_path / "m.pt")
    w = load_weights(f"{tmp_path / 'm.pt'}:blocks.*.attn")
    np.testing.assert_allclose(w.data[:, 0, 0, 0, 0], (np.arange(11) + 1) / 100, rtol=1e-6)
    fails(1, "scaled", *[f"{tmp_path / 'm.pt'}:blocks.*.attn"] * 3, match="the pattern matches 11 arrays")


# ---------------------------------------------------------------------------------------------------
# --params and masks


def test_multihead_params_from_safetensors_h5_and_torch_equal_the_npz(tmp_path):
    x = RNG.normal(size=(5, 4)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    base = ["multihead", tmp_path / "x.npy", "--heads", "2", "--json"]
    seeded = json.loads(ok(*base, "--seed", "3", "--save-params", tmp_path / "p.npz").stdout)
    params = dict(np.load(tmp_path / "p.npz"))
    assert "query/kernel" in params
    save_st(tmp_path / "p.safetensors", params)
    save_h5(tmp_path / "p.h5", params)  # "query/kernel" is a group path in HDF5
    for name in ("p.npz", "p.safetensors", "p.h5"):
        got, _ = read_params(str(tmp_path / name))
        assert set(got) == set(params)
        for key in params:
            np.testing.assert_array_equal(got[key], params[key])
        doc = json.loads(ok(*base, "--params", tmp_path / name).stdout)
        assert doc["weights"] == seeded["weights"] and doc["output"] == seeded["output"], name
    torch = pytest.importorskip("torch")
    torch.save({k: torch.from_numpy(v) for k, v in params.items()}, tmp_path / "p.pt")
    doc = json.loads(ok(*base, "--params", tmp_path / "p.pt").stdout)
    assert doc["weights"] == seeded["weights"]


def test_params_errors(tmp_path):
    x = RNG.normal(size=(5, 4)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    base = ["multihead", tmp_path / "x.npy", "--heads", "2"]
    np.save(tmp_path / "p.npy", x)
    r = fails(2, *base, "--params", tmp_path / "p.npy", match="a parameter file is a .npz archive")
    assert ".safetensors" in r.stderr and ".h5" in r.stderr and ".pt" in r.stderr
    (tmp_path / "bad.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json}......")
    fails(1, *base, "--params", tmp_path / "bad.safetensors", match="not a readable .safetensors file")
    ok(*base, "--save-params", tmp_path / "p.npz")
    save_st(tmp_path / "extra.safetensors", {**np.load(tmp_path / "p.npz"), "surplus": np.ones(2, np.float32)})
    fails(1, *base, "--params", tmp_path / "extra.safetensors", match="unexpected key(s) surplus")


def test_masks_from_safetensors(tmp_path):
    q = RNG.normal(size=(3, 4)).astype(np.float32)
    np.save(tmp_path / "q.npy", q)
    keep = np.array([[1, 1, 0], [1, 0, 0], [1, 1, 1]], dtype=np.int8)
    np.save(tmp_path / "mask.npy", keep)
    save_st(tmp_path / "masks.safetensors", {"keep": keep, "padding": np.array([1, 1, 0], np.int8)})
    np.save(tmp_path / "padding.npy", np.array([1, 1, 0], np.int8))
    qkv = [tmp_path / "q.npy"] * 3
    expected = json.loads(ok("scaled", *qkv, "--mask", tmp_path / "mask.npy", "--json").stdout)
    doc = json.loads(ok("scaled", *qkv, "--mask", f"{tmp_path / 'masks.safetensors'}:keep", "--json").stdout)
    assert doc["weights"] == expected["weights"] and np.asarray(doc["weights"])[0, 2] == 0
    expected = json.loads(ok("scaled", *qkv, "--key-padding-mask", tmp_path / "padding.npy", "--json").stdout)
    doc = json.loads(ok("scaled", *qkv, "--key-padding-mask", f"{tmp_path / 'masks.safetensors'}:pad*",
                        "--json").stdout)
    assert doc["weights"] == expected["weights"]


# ---------------------------------------------------------------------------------------------------
# Bad files: exit 1, one line, no traceback


def corrupt_files(tmp_path):
    save_st(tmp_path / "good.safetensors", {"x": A})
    data = (tmp_path / "good.safetensors").read_bytes()
    (tmp_path / "cut.safetensors").write_bytes(data[:-7])
    (tmp_path / "junk.safetensors").write_bytes(b"garbage, not a header" * 3)
    save_h5(tmp_path / "good.h5", {"x": A})
    data = (tmp_path / "good.h5").read_bytes()
    (tmp_path / "cut.h5").write_bytes(data[: len(data) // 2])
    (tmp_path / "junk.h5").write_bytes(b"garbage" * 20)
    (tmp_path / "junk.pt").write_bytes(b"garbage" * 20)
    (tmp_path / "empty.bin").write_bytes(b"")
    return ["cut.safetensors", "junk.safetensors", "cut.h5", "junk.h5", "junk.pt", "empty.bin"]


def test_corrupt_files_exit_1_naming_the_file(tmp_path):
    names = corrupt_files(tmp_path)
    torch_installed = _has_torch()
    for name in names:
        if name.endswith((".pt", ".bin")) and not torch_installed:
            continue
        r = fails(1, "scaled", tmp_path / name, match=str(tmp_path / name))
        assert "not a readable" in r.stderr, r.stderr
        r = fails(1, "inspect", tmp_path / name, match="not a readable")
        with pytest.raises(InputError):
            load_array(str(tmp_path / name))


def test_torch_refuses_pickled_objects(tmp_path):
    torch = pytest.importorskip("torch")
    torch.save({"x": torch.ones(2, 2), "config": Custom()}, tmp_path / "obj.pt")
    r = fails(1, "scaled", tmp_path / "obj.pt", match="weights_only=True")
    assert "Custom" in r.stderr and "never unpickles" in r.stderr
    fails(1, "inspect", tmp_path / "obj.pt", match="refuses")


class Custom:
    """A class torch.load(weights_only=True) must refuse to build."""


def _has_torch():
    try:
        import torch  # noqa: F401
    except ImportError:
        return False
    return True


def test_missing_torch_is_a_clear_error(tmp_path, monkeypatch):
    (tmp_path / "w.pt").write_bytes(b"anything")
    monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` now raises ImportError
    r = fails(1, "scaled", tmp_path / "w.pt", match="needs PyTorch, which is not installed")
    assert "pip install torch" in r.stderr and "safetensors" in r.stderr
    with pytest.raises(ParamsError, match="not installed"):
        read_params(str(tmp_path / "w.pt"))


def test_unknown_type_lists_every_supported_type(tmp_path):
    (tmp_path / "a.csv").write_text("1,2")
    r = fails(2, "scaled", tmp_path / "a.csv", match="unknown file type '.csv'")
    text = " ".join(r.stderr.split())
    for suffix in (".npy", ".npz", ".safetensors", ".h5", ".hdf5", ".pt", ".pth", ".bin", ".json"):
        assert suffix in text, suffix
    with pytest.raises(UsageError, match="unknown file type"):  # only files of named arrays take :KEY
        open_spec(str(tmp_path / "a.npy:x"))


READ_OTHERS = """
import sys
from attnviz.io import load_array
for spec in sys.argv[1:]:
    load_array(spec)
print(" ".join(m for m in ("torch", "tensorflow", "matplotlib", "h5py", "safetensors") if m in sys.modules))
"""


def test_reading_other_formats_never_imports_torch(tmp_path):
    np.save(tmp_path / "a.npy", A)
    np.savez(tmp_path / "a.npz", x=A)
    save_st(tmp_path / "a.safetensors", {"x": A})
    save_h5(tmp_path / "a.h5", {"x": A})
    specs = [str(tmp_path / n) for n in ("a.npy", "a.npz:x", "a.safetensors:x", "a.h5:x")]
    out = subprocess.run([sys.executable, "-c", READ_OTHERS, *specs], cwd=ROOT, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    loaded = out.stdout.split()
    assert "torch" not in loaded and "tensorflow" not in loaded and "matplotlib" not in loaded
    assert {"h5py", "safetensors"} <= set(loaded)
    out = subprocess.run([sys.executable, "-c", READ_OTHERS, specs[0]], cwd=ROOT, capture_output=True, text=True,
                         timeout=120)
    assert out.stdout.split() == []  # a .npy needs none of them


def _bf16_attention(rng, shape, pad_from=None):
    """Softmax rows rounded to bfloat16, as a bf16 model's output_attentions gives them: each row sums
    to 1 only within the storage's rounding (about 3e-3 here), never within 1e-5."""
    import ml_dtypes

    s = rng.normal(scale=3, size=shape)
    w = np.exp(s - s.max(-1, keepdims=True))
    w /= w.sum(-1, keepdims=True)
    return w.astype(ml_dtypes.bfloat16)


def test_weights_stored_in_bfloat16_are_judged_by_their_own_rounding(tmp_path):
    """A bf16 dump is attention weights: no "not distributions" warning, and --check-rows passes with
    the bfloat16 tolerance by default (it fails at --atol 1e-5, and the same sums in a float32 file
    draw the warning)."""
    rng = np.random.default_rng(11)
    layers = {f"layer.{i}": _bf16_attention(rng, (2, 3, 64, 64)) for i in range(3)}
    save_st(tmp_path / "attn.safetensors", layers)
    off = max(abs(float(a.astype(np.float64).sum(-1).max()) - 1) for a in layers.values())
    assert 1e-3 < off < 1e-2  # rounding moves the sums past a float32 tolerance
    spec = str(tmp_path / "attn.safetensors") + ":layer.*"
    assert load_weights(spec).stored_dtype == "bfloat16"
    r = invoke("inspect", spec, "--check-rows", "--json")
    assert r.exit_code == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["stored_dtype"] == "bfloat16" and not doc["warnings"]
    assert "tolerance 0.015625" in r.stderr
    assert invoke("inspect", spec, "--check-rows", "--atol", "1e-5", "--no-table").exit_code == 3
    np.savez(tmp_path / "f32.npz", **{k: v.astype(np.float32) for k, v in layers.items()})
    r = invoke("inspect", str(tmp_path / "f32.npz"), "--no-table")
    assert r.exit_code == 0 and "sum neither to 1 nor to 0" in r.stderr
    r = invoke("compare", spec, str(tmp_path / "f32.npz"), "--json")
    assert r.exit_code == 0 and len(json.loads(r.stdout)["warnings"]) == 1  # B (float32 storage) only


def test_storage_dtype_is_remembered_for_torch_and_h5(tmp_path):
    torch = pytest.importorskip("torch")
    w = torch.softmax(torch.randn(2, 4, 4), -1)
    torch.save({"layers.0": w.to(torch.bfloat16), "layers.1": w.to(torch.float16)}, tmp_path / "a.pt")
    assert load_weights(str(tmp_path / "a.pt") + ":layers.0").stored_dtype == "bfloat16"
    assert load_weights(str(tmp_path / "a.pt")).stored_dtype == "bfloat16"  # the coarser of the layers
    assert load_weights(str(tmp_path / "a.pt") + ":layers.1").stored_dtype == "float16"
    save_h5(tmp_path / "a.h5", {"attn/0": w.numpy().astype(np.float16)})
    assert load_weights(str(tmp_path / "a.h5") + ":attn/0").stored_dtype == "float16"
    np.save(tmp_path / "a.npy", w.numpy())
    assert load_weights(str(tmp_path / "a.npy")).stored_dtype == "float32"

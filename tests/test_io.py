"""Loaders: every accepted input form, and a clear error for every malformed one."""

from __future__ import annotations

import io
import json
import os
import pickle

import numpy as np
import pytest

from attnviz.errors import InputError, OutputError, UsageError
from attnviz.io import StdinReader, check_outputs, load_array, load_labels, open_spec, save_npy, write_atomic

A = np.arange(6, dtype=np.float32).reshape(2, 3)


def test_npy(tmp_path):
    np.save(tmp_path / "a.npy", A)
    got = load_array(str(tmp_path / "a.npy"))
    np.testing.assert_array_equal(got.data, A)
    assert got.labels is None and got.path == tmp_path / "a.npy"


def test_npz_single_and_key(tmp_path):
    np.savez(tmp_path / "one.npz", x=A)
    np.savez(tmp_path / "two.npz", x=A, y=A * 2)
    np.testing.assert_array_equal(load_array(str(tmp_path / "one.npz")).data, A)
    got = load_array(f"{tmp_path / 'two.npz'}:y")
    np.testing.assert_array_equal(got.data, A * 2)
    assert got.source.endswith("two.npz:y")
    with pytest.raises(InputError, match=r"holds 2 arrays \(x, y\); name one as .*two.npz:KEY"):
        load_array(str(tmp_path / "two.npz"))
    with pytest.raises(InputError, match="no array named 'z'; it holds x, y"):
        load_array(f"{tmp_path / 'two.npz'}:z")


def test_json_list_and_object_with_labels(tmp_path):
    (tmp_path / "a.json").write_text(json.dumps(A.tolist()))
    (tmp_path / "b.json").write_text(json.dumps({"data": A.tolist(), "labels": ["x", "y"]}))
    np.testing.assert_array_equal(load_array(str(tmp_path / "a.json")).data, A)
    got = load_array(str(tmp_path / "b.json"))
    np.testing.assert_array_equal(got.data, A)
    assert got.labels == ["x", "y"]


def test_stdin_json_read_once():
    reader = StdinReader(io.StringIO(json.dumps(A.tolist())))
    np.testing.assert_array_equal(load_array("-", reader).data, A)
    with pytest.raises(UsageError, match="one input only"):
        load_array("-", reader)


def test_bundle_npz_and_json(tmp_path):
    np.savez(tmp_path / "b.npz", q=A, k=A, v=A, mask=np.ones(3), q_labels=np.array(["a", "b"]))
    bundle = open_spec(str(tmp_path / "b.npz")).bundle(["q", "k", "v"])
    assert bundle is not None and set(bundle) == {"q", "k", "v", "mask", "q_labels"}
    assert bundle["q_labels"].labels == ["a", "b"]
    (tmp_path / "b.json").write_text(json.dumps({"q": A.tolist(), "k": A.tolist(), "v": A.tolist()}))
    assert set(open_spec(str(tmp_path / "b.json")).bundle(["q", "k", "v"])) == {"q", "k", "v"}
    np.savez(tmp_path / "partial.npz", q=A, k=A)
    assert open_spec(str(tmp_path / "partial.npz")).bundle(["q", "k", "v"]) is None


def test_never_unpickles(tmp_path):
    np.save(tmp_path / "obj.npy", np.array([{"a": 1}], dtype=object), allow_pickle=True)
    (tmp_path / "pickle.npy").write_bytes(pickle.dumps([1, 2, 3]))
    np.savez(tmp_path / "obj.npz", x=np.array([None, 1], dtype=object))
    for name in ("obj.npy", "pickle.npy"):
        with pytest.raises(InputError, match="pickled Python objects; attnviz never unpickles"):
            load_array(str(tmp_path / name))
    with pytest.raises(InputError, match="never unpickles"):
        load_array(str(tmp_path / "obj.npz"))


@pytest.mark.parametrize("content, message", [
    ("[[1, 2], [3]]", "ragged"),
    ('[["a", "b"]]', "non-numeric"),
    ("[[1, 2", "not valid JSON"),
    ("[[1, null]]", "expected a nested list of numbers|non-numeric"),
    ("[]", "empty"),
    ("[[1, NaN]]", "non-finite value.*index \\[0, 1\\]"),
    ("[[1, Infinity]]", "non-finite"),
    ('{"values": [1]}', 'must have a "data" entry'),
    ('"text"', "expected a nested list"),
])
def test_bad_json(tmp_path, content, message):
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(InputError, match=message) as exc:
        load_array(str(path))
    assert str(path) in exc.value.message


def test_empty_nan_complex_npy(tmp_path):
    np.save(tmp_path / "empty.npy", np.zeros((0, 3)))
    np.save(tmp_path / "nan.npy", np.array([[1.0, np.inf]]))
    np.save(tmp_path / "c.npy", np.array([1 + 2j]))
    with pytest.raises(InputError, match=r"empty \(shape \[0, 3\]\)"):
        load_array(str(tmp_path / "empty.npy"))
    with pytest.raises(InputError, match="non-finite"):
        load_array(str(tmp_path / "nan.npy"))
    with pytest.raises(InputError, match="complex"):
        load_array(str(tmp_path / "c.npy"))


def test_corrupt_files(tmp_path):
    (tmp_path / "junk.npy").write_bytes(b"not an array")
    (tmp_path / "junk.npz").write_bytes(b"not a zip")
    with pytest.raises(InputError, match="junk.npy"):
        load_array(str(tmp_path / "junk.npy"))
    with pytest.raises(InputError, match="junk.npz: not a readable .npz"):
        load_array(str(tmp_path / "junk.npz"))


def test_usage_errors(tmp_path):
    with pytest.raises(UsageError, match="no such file"):
        load_array(str(tmp_path / "missing.npy"))
    (tmp_path / "a.csv").write_text("1,2")
    with pytest.raises(UsageError, match="unknown file type '.csv'"):
        load_array(str(tmp_path / "a.csv"))
    with pytest.raises(UsageError, match="is a directory"):
        load_array(str(tmp_path))


def test_labels_forms(tmp_path):
    (tmp_path / "t.txt").write_text("the\ncat\nsat\n")
    (tmp_path / "t.json").write_text('["a", "b"]')
    assert load_labels(str(tmp_path / "t.txt"))[0] == ["the", "cat", "sat"]
    assert load_labels(str(tmp_path / "t.json"))[0] == ["a", "b"]
    assert load_labels('["x", "y"]')[0] == ["x", "y"]
    assert load_labels("a, b,c")[0] == ["a", "b", "c"]


def test_write_atomic_leaves_nothing_on_failure(tmp_path):
    target = tmp_path / "out.npy"
    target.write_bytes(b"previous")

    def fail(fh):
        fh.write(b"half")
        raise RuntimeError("disk on fire")

    with pytest.raises(RuntimeError):
        write_atomic(target, fail)
    assert target.read_bytes() == b"previous"
    assert os.listdir(tmp_path) == ["out.npy"]
    save_npy(target, A)
    np.testing.assert_array_equal(np.load(target), A)
    assert os.listdir(tmp_path) == ["out.npy"]


def test_check_outputs(tmp_path):
    inp = tmp_path / "q.npy"
    inp.write_bytes(b"")
    with pytest.raises(UsageError, match="one of the input files"):
        check_outputs({"--save-weights": str(inp)}, [inp])
    with pytest.raises(UsageError, match="the same file as --png"):
        check_outputs({"--png": str(tmp_path / "a.png"), "--save-weights": str(tmp_path / "a.png")}, [])
    with pytest.raises(OutputError, match="does not exist"):
        check_outputs({"--png": str(tmp_path / "nope" / "a.png")}, [])
    assert check_outputs({"--png": None}, []) == {}


def test_comma_separated_labels_may_start_with_a_bracket():
    assert load_labels("[CLS],the,cat")[0] == ["[CLS]", "the", "cat"]
    assert load_labels('["[CLS]", "x"]')[0] == ["[CLS]", "x"]


def _resident_kib(start: int) -> int:
    """The resident size of this process's mapping that starts at address ``start`` (Linux)."""
    lines = open("/proc/self/smaps").read().splitlines()
    for i, line in enumerate(lines):
        if line.split("-", 1)[0] == f"{start:x}":
            for rest in lines[i + 1:]:
                if rest.startswith("Rss:"):
                    return int(rest.split()[1])
    raise AssertionError("mapping not found")


@pytest.mark.skipif(not os.path.exists("/proc/self/smaps"), reason="reads /proc/self/smaps")
def test_release_pages_lets_go_of_a_large_file_only(tmp_path, monkeypatch):
    """A memory-mapped file read in blocks gives its pages back after each (``release_pages``) when it is larger
    than ``KEEP_MAPPED``; a smaller one keeps them (mapping them again costs more time than they cost memory)."""
    import mmap

    import attnviz.io as aio

    path = tmp_path / "w.npy"
    np.save(path, np.ones((64, 4096), np.float32))  # 1 MiB
    for keep, resident_after in ((aio.KEEP_MAPPED, True), (2**19, False)):
        monkeypatch.setattr(aio, "KEEP_MAPPED", keep)
        w = np.load(path, mmap_mode="r")
        base = w
        while not isinstance(base, mmap.mmap):
            base = base.base
        start = np.frombuffer(base, np.uint8).ctypes.data
        assert float(w.sum()) == 64 * 4096  # every page read
        assert _resident_kib(start) >= 1024
        aio.release_pages(w)
        assert (_resident_kib(start) >= 1024) == resident_after
        del w, base

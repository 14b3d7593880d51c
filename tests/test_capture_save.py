"""``rec.save(path)`` after a capture without ``path=``: the temporary file is moved into place when it lies on
the same file system (as ``path=`` streams there), not copied; the recording then reads from the saved file, a
later save copies it, and ``close`` leaves it. Across file systems it is copied."""

from __future__ import annotations

import copy
import errno
import os
import stat
from pathlib import Path

import numpy as np
import pytest

import attnviz
from tests.conftest import LazyModule

torch = LazyModule("torch")  # imported when a test first uses it: not while every worker collects
transformers = LazyModule("transformers")


def _recorded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # the temporary file on the target's file system
    cfg = transformers.LlamaConfig(vocab_size=50, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                                   num_attention_heads=2, num_key_value_heads=1)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(copy.deepcopy(cfg)).eval()
    with torch.no_grad(), attnviz.capture(model) as rec:
        model(torch.randint(3, 50, (1, 5)))
    return rec


def test_save_moves_the_temporary_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rec = _recorded(tmp_path, monkeypatch)
    temp = Path(rec.path)
    inode, before = temp.stat().st_ino, temp.read_bytes()
    target = tmp_path / "out" / "run.safetensors"
    target.parent.mkdir()
    assert rec.save(target) == target
    assert not temp.exists() and target.stat().st_ino == inode and target.read_bytes() == before
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE(target.stat().st_mode) == 0o666 & ~umask
    assert Path(rec.path) == target
    np.testing.assert_array_equal(attnviz.inspect(rec).weights, attnviz.inspect(str(target)).weights)
    again = tmp_path / "again.safetensors"
    rec.save(again)
    assert again.read_bytes() == before and target.exists()
    rec.close()
    assert target.exists()


def test_save_across_file_systems_copies(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rec = _recorded(tmp_path, monkeypatch)
    temp = Path(rec.path)
    before = temp.read_bytes()

    real = os.replace

    def elsewhere(src: object, dst: object) -> None:  # the temporary file on another file system
        if Path(str(src)) == temp:
            raise OSError(errno.EXDEV, "Invalid cross-device link")
        real(src, dst)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "replace", elsewhere)
    target = tmp_path / "run.safetensors"
    rec.save(target)
    monkeypatch.undo()
    assert target.read_bytes() == before and temp.exists()
    rec.close()
    assert not temp.exists() and target.exists()


def test_files_take_the_umask_which_is_read_never_set(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every file a capture puts in place (streamed to ``path=``, written whole as ``.npz``, moved or copied by
    ``save``, converted) has mode ``0o666 & ~umask``, and the umask is read without ``os.umask``: setting it to 0
    to read it gave a file another thread created in that moment (a writer thread's) mode 0666."""
    real = os.umask
    old = real(0o027)
    try:
        calls: list[int] = []

        def spy(mask: int) -> int:
            calls.append(mask)
            return real(mask)

        monkeypatch.setattr(os, "umask", spy)
        rec = _recorded(tmp_path, monkeypatch)
        model = transformers.AutoModelForCausalLM.from_config(transformers.LlamaConfig(
            vocab_size=50, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2)).eval()
        for name in ("streamed.safetensors", "whole.npz"):
            with torch.no_grad(), attnviz.capture(model, path=tmp_path / name):
                model(torch.randint(3, 50, (1, 4)))
        for name in ("moved.safetensors", "copied.safetensors", "converted.npz"):
            rec.save(tmp_path / name)
        modes = {p.name: oct(stat.S_IMODE(p.stat().st_mode)) for p in tmp_path.iterdir()}
    finally:
        real(old)
    assert modes == {name: oct(0o640) for name in ("streamed.safetensors", "whole.npz", "moved.safetensors",
                                                   "copied.safetensors", "converted.npz")}
    assert calls == []


def test_umask_read_from_proc_or_from_a_probe_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``staging.umask`` says the umask set, from ``/proc/self/status`` and, where that is missing, from a file it
    creates and removes in the temporary folder."""
    import tempfile

    from attnviz import staging

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    for mask in (0o022, 0o077, 0o002, 0):
        old = os.umask(mask)
        try:
            if os.path.exists(staging._STATUS):
                assert staging.umask() == mask
            monkeypatch.setattr(staging, "_STATUS", str(tmp_path / "no-such-status"))
            assert staging.umask() == mask
            monkeypatch.undo()
        finally:
            os.umask(old)
    assert list(tmp_path.iterdir()) == []

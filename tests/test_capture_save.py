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

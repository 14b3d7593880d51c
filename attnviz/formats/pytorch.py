"""``torch.save`` files (``.pt``, ``.pth``, ``.bin``): a tensor, or a dict/list/tuple (nested) of tensors.

Read only with ``torch.load(path, map_location="cpu", weights_only=True)`` (memory-mapped when the
file is a zip archive, as ``torch.save`` writes by default): PyTorch's restricted unpickler, which
loads tensors and plain containers and refuses any other Python object. attnviz never unpickles
arbitrary objects. Keys are dict keys, or ``0``, ``1`` ... for list and tuple items, nested ones
joined with ``.`` (``layers.0.attn``). Half-precision tensors become float32.

torch is optional: it is imported (by name, at run time) only when such a file is read.
"""

from __future__ import annotations

import importlib
import re
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from attnviz.errors import InputError
from attnviz.formats._base import Container, reason, upcast_half

SUFFIXES = (".pt", ".pth", ".bin")


def _torch(source: str) -> Any:
    try:
        return importlib.import_module("torch")  # by name: no static import of torch anywhere
    except ImportError:
        raise InputError(f"{source}: reading torch.save files (.pt, .pth, .bin) needs PyTorch, which is not "
                         "installed; pip install torch, or save the arrays with numpy.save or safetensors.") from None
    except Exception as exc:
        raise InputError(f"{source}: reading torch.save files needs PyTorch, which fails to import "
                         f"({reason(exc)}).") from None


def _load(torch: Any, p: Path, source: str) -> Any:
    import pickle

    try:
        if zipfile.is_zipfile(p):
            return torch.load(p, map_location="cpu", weights_only=True, mmap=True)
        return torch.load(p, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        found = re.search(r"Unsupported global: GLOBAL (\S+)", str(exc))
        if found:
            raise InputError(
                f"{source}: holds a Python object ({found.group(1)}) that torch.load(weights_only=True) refuses; "
                "attnviz never unpickles arbitrary objects. Save tensors only (a tensor, or a dict or list of "
                "tensors such as a state_dict), or use safetensors."
            ) from None
        detail = re.search(r"WeightsUnpickler error:\s*(.+)", str(exc))
        why = detail.group(1).strip() if detail else reason(exc)
        raise InputError(f"{source}: not a readable torch.save file, or one torch.load(weights_only=True) "
                         f"refuses ({why}).") from None
    except Exception as exc:  # RuntimeError (a damaged zip), EOFError, OSError, ...
        raise InputError(f"{source}: not a readable torch.save file ({reason(exc)}).") from None


def _flatten(torch: Any, value: Any, prefix: str, out: dict[str, Any]) -> None:
    """Tensors (and lists of strings, as labels) under dotted keys; other leaves (numbers, None) are left out."""
    if isinstance(value, torch.Tensor):
        out[prefix] = value
    elif isinstance(value, dict):
        for k, v in value.items():
            _flatten(torch, v, f"{prefix}.{k}" if prefix else str(k), out)
    elif isinstance(value, (list, tuple)):
        if value and all(isinstance(v, str) for v in value):
            out[prefix] = np.array(value, dtype=str)
            return
        for i, v in enumerate(value):
            _flatten(torch, v, f"{prefix}.{i}" if prefix else str(i), out)


def to_numpy(torch: Any, tensor: Any) -> np.ndarray:
    t = tensor.detach()
    if t.layout != torch.strided:
        t = t.to_dense()
    if t.is_quantized:
        t = t.dequantize()
    if t.is_floating_point() and t.element_size() <= 2:  # float16, bfloat16, float8: NumPy float32
        t = t.float()
    return upcast_half(t.numpy())


class TorchFile(Container):
    def __init__(self, source: str, torch: Any, tensors: dict[str, Any]) -> None:
        self._torch = torch
        self._tensors = tensors
        super().__init__(source, list(tensors))

    def read(self, key: str) -> np.ndarray:
        value = self._tensors[key]
        if isinstance(value, np.ndarray):
            return value
        try:
            arr = to_numpy(self._torch, value)
        except Exception as exc:
            raise InputError(f"{self.source}:{key}: cannot convert the {value.dtype} tensor to an array "
                             f"({reason(exc)}).") from None
        if value.is_floating_point() and value.element_size() <= 2:
            self.stored[key] = str(value.dtype).removeprefix("torch.")
        return arr


def open_file(p: Path, source: str) -> np.ndarray | TorchFile:
    """A single tensor as an array; a container of tensors as a ``TorchFile``."""
    torch = _torch(source)
    value = _load(torch, p, source)
    if isinstance(value, torch.Tensor):
        try:
            return to_numpy(torch, value)
        except Exception as exc:
            raise InputError(f"{source}: cannot convert the {value.dtype} tensor to an array ({reason(exc)}).") \
                from None
    tensors: dict[str, Any] = {}
    _flatten(torch, value, "", tensors)
    if not tensors:
        raise InputError(f"{source}: holds no tensors (a {type(value).__name__}); attnviz reads a tensor, or a "
                         "dict or list of tensors.")
    return TorchFile(source, torch, tensors)

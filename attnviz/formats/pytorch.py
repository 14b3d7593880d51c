"""``torch.save`` files (``.pt``, ``.pth``, ``.bin``): a tensor, or a dict/list/tuple (nested) of tensors.

Read only with ``torch.load(path, map_location="cpu", weights_only=True)`` (memory-mapped when the
file is a zip archive, as ``torch.save`` writes by default): PyTorch's restricted unpickler, which
loads tensors and plain containers and refuses any other Python object. attnviz never unpickles
arbitrary objects. Keys are dict keys, or ``0``, ``1`` ... for list and tuple items, nested ones
joined with ``.`` (``layers.0.attn``). Half-precision tensors become float32.

Sizes before allocation: a zip file's directory is checked first (stored entries inside the file,
compressed ones within ``memory_limit()``), and PyTorch itself refuses a storage larger than its
record; a legacy (non-zip) file is read into memory whole, so it may be at most ``memory_limit()``. A
tensor that is a view of more elements than its storage holds (an expanded tensor), or that must be
converted (sparse, quantized, half precision), may take at most ``memory_limit()`` as an array.
Nesting deeper than ``MAX_DEPTH`` containers, and containers that hold themselves, are refused.

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
from attnviz.formats.container import Container, upcast_half
from attnviz.formats.zipfiles import check_zip_members
from attnviz.quoting import reason
from attnviz.sizes import check_memory, size_str

SUFFIXES = (".pt", ".pth", ".bin")
#: the deepest nesting of dicts, lists and tuples read
MAX_DEPTH = 64


def _torch(source: str) -> Any:
    try:
        return importlib.import_module("torch")  # by name: no static import of torch anywhere
    except ImportError:
        raise InputError(f"{source}: reading torch.save files (.pt, .pth, .bin) needs PyTorch, which is not "
                         "installed; pip install torch, or save the arrays with numpy.save or safetensors.") from None
    except Exception as exc:
        raise InputError(f"{source}: reading torch.save files needs PyTorch, which fails to import "
                         f"({reason(exc)}).") from None


def _check_sizes(where: Any, source: str) -> bool:
    """Whether the file is a zip archive (torch.save's default), its directory checked; a legacy file is
    read whole, so it must fit in ``memory_limit()``."""
    size = where.size
    try:
        with where.open() as fh:
            is_zip = zipfile.is_zipfile(fh)
            if is_zip:
                with zipfile.ZipFile(fh) as archive:
                    infos = archive.infolist()
    except Exception as exc:
        raise InputError(f"{source}: not a readable torch.save file ({reason(exc)}).") from None
    if is_zip:
        try:
            check_zip_members(infos, size, source)
        except InputError as exc:
            raise InputError(exc.message.replace("not a readable zip archive", "not a readable torch.save file")) \
                from None
        for info in infos:
            if info.compress_type != zipfile.ZIP_STORED:
                check_memory(info.file_size, f"{source} (entry {info.filename!r})", "once decompressed")
    else:
        check_memory(size, source, "(a legacy torch.save file is read whole)")
    return is_zip


def _load(torch: Any, p: str | Path, source: str) -> Any:
    import pickle
    import warnings

    from attnviz import storage

    where = storage.open_input(p, source)
    is_zip = _check_sizes(where, source)
    try:
        with warnings.catch_warnings():  # torch's warnings about a file are not for attnviz's users
            warnings.simplefilter("ignore")
            if where.local is None:  # an object of a store: read through a stream (torch reads every tensor)
                with where.open() as fh:
                    return torch.load(fh, map_location="cpu", weights_only=True)
            if is_zip:
                return torch.load(where.local, map_location="cpu", weights_only=True, mmap=True)
            return torch.load(where.local, map_location="cpu", weights_only=True)
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
    except Exception as exc:  # RuntimeError (a damaged zip, a storage larger than its record), EOFError, OSError, ...
        raise InputError(f"{source}: not a readable torch.save file ({reason(exc)}).") from None


def _no_attentions(value: Any) -> bool:
    """``out.attentions`` of a model that returns no weights: an empty tuple, or Nones (per layer, or per
    step and layer for generate())."""
    if value is None:
        return True
    if isinstance(value, (tuple, list)):
        return all(_no_attentions(v) for v in value)
    return False


def _flatten(torch: Any, value: Any, source: str) -> dict[str, Any]:
    """Tensors (and lists of strings, as labels) under dotted keys, in the file's order; other leaves
    (numbers, None) are left out. Iterative: deep nesting is an error, never a RecursionError."""
    out: dict[str, Any] = {}
    stack: list[tuple[Any, str, int, tuple[int, ...]]] = [(value, "", 0, ())]
    while stack:
        item, prefix, depth, parents = stack.pop()
        if isinstance(item, torch.Tensor):
            out[prefix] = item
            continue
        if not isinstance(item, (dict, list, tuple)):
            continue
        if depth >= MAX_DEPTH:
            raise InputError(f"{source}: containers nested more than {MAX_DEPTH} deep (at {prefix!r}); attnviz "
                             "reads a tensor, or dicts and lists of tensors.")
        if id(item) in parents:
            raise InputError(f"{source}: a container that holds itself (at {prefix!r}); attnviz reads a tensor, "
                             "or dicts and lists of tensors.")
        if isinstance(item, (list, tuple)) and item and all(isinstance(v, str) for v in item):
            out[prefix] = np.array(item, dtype=str)
            continue
        pairs = item.items() if isinstance(item, dict) else enumerate(item)
        children = [(v, f"{prefix}.{k}" if prefix else str(k), depth + 1, (*parents, id(item))) for k, v in pairs]
        stack.extend(reversed(children))
    return out


def _check_tensor(torch: Any, t: Any, source: str) -> None:
    """Refuse, before converting, a tensor whose array would not fit in ``memory_limit()`` where it is
    not simply the bytes the file stores: an expanded view, a sparse, quantized or half-precision tensor."""
    numel = int(t.numel())
    converted = t.layout != torch.strided or t.is_quantized or (t.is_floating_point() and t.element_size() <= 2)
    if converted:
        check_memory(numel * max(int(t.element_size()), 4), source, "once converted", tuple(t.shape))
        return
    stored = int(t.untyped_storage().nbytes())
    logical = numel * int(t.element_size())
    if logical > stored:
        check_memory(logical, source, f"(a view of {size_str(stored)} of storage)", tuple(t.shape))


def to_numpy(torch: Any, tensor: Any, source: str = "the tensor") -> np.ndarray:
    _check_tensor(torch, tensor, source)
    t = tensor.detach()
    if t.layout != torch.strided:
        t = t.to_dense()
    if t.is_quantized:
        t = t.dequantize()
    if t.is_floating_point() and t.element_size() <= 2:  # float16, bfloat16, float8: NumPy float32
        t = t.float()
    return upcast_half(t.numpy(), source)


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
            arr = to_numpy(self._torch, value, f"{self.source}:{key}")
        except InputError:
            raise
        except Exception as exc:
            raise InputError(f"{self.source}:{key}: cannot convert the {value.dtype} tensor to an array "
                             f"({reason(exc)}).") from None
        if value.is_floating_point() and value.element_size() <= 2:
            self.stored[key] = str(value.dtype).removeprefix("torch.")
        return arr


def open_file(p: str | Path, source: str) -> np.ndarray | TorchFile:
    """A single tensor as an array; a container of tensors as a ``TorchFile``."""
    torch = _torch(source)
    value = _load(torch, p, source)
    if isinstance(value, torch.Tensor):
        try:
            return to_numpy(torch, value, source)
        except InputError:
            raise
        except Exception as exc:
            raise InputError(f"{source}: cannot convert the {value.dtype} tensor to an array ({reason(exc)}).") \
                from None
    tensors = _flatten(torch, value, source)
    if not tensors and _no_attentions(value):
        from attnviz.errors import no_weights

        what = ("an empty tuple" if not value else f"a tuple of {len(value)} Nones" if all(v is None for v in value)
                else "only Nones")
        raise InputError(no_weights(f"{source} holds {what}"))
    if not tensors:
        raise InputError(f"{source}: holds no tensors (a {type(value).__name__}); attnviz reads a tensor, or a "
                         "dict or list of tensors.")
    return TorchFile(source, torch, tensors)

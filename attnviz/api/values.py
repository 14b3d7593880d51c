"""What the Python API accepts for arrays: NumPy arrays, anything with ``__array__``, PyTorch and
TensorFlow tensors (bfloat16 included, read as float32), and nested tuples, lists or dicts of them (a
model's ``out.attentions``; ``generate()``'s tuple of steps of layers; a dict of parameters), turned
into the values ``attnviz.io`` reads behind in-memory specs. NumPy only (tensors are handled through
their own methods, never by importing their library)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from attnviz.errors import InputError
from attnviz.io import MemoryContainer

#: the metavars of the options whose command-line value is a file the run reads (``FILE``: an array, a
#: parameters file, a config; ``TOKENS``: labels): the API takes the value itself (an array or tensor, a
#: dict of them, a label list, a config dict) and hands it over in memory; a string is still a file name
#: (or a spec). Files a run writes have other metavars (``FILE.npz``, ``FILE.npy``).
INPUT_METAVARS = ("FILE", "TOKENS")
LABEL_OPTIONS = ("labels", "q_labels", "k_labels")


def file_options(classes: Sequence[type]) -> tuple[str, ...]:
    """The options of the option dataclasses ``classes`` whose command-line value is a file the run reads."""
    from attnviz.fields import flat_fields

    names = (f.name for cls in classes for f, _ in flat_fields(cls) if f.metadata.get("metavar") in INPUT_METAVARS)
    return tuple(dict.fromkeys(names))


#: PyTorch's small floats, which NumPy holds through ml_dtypes (as files of them are read)
SMALL_TORCH = {"torch.bfloat16": ("int16", "bfloat16"), "torch.float8_e4m3fn": ("uint8", "float8_e4m3fn"),
               "torch.float8_e5m2": ("uint8", "float8_e5m2")}


def to_array(value: Any, name: str) -> np.ndarray:
    """An array of numbers from a NumPy array, a tensor or anything array-like. bfloat16 and 8-bit floats
    stay as they are (ml_dtypes): reading widens them to float32 and remembers that they were stored so,
    for the tolerances of checks, as for a file."""
    if isinstance(value, np.ndarray):
        arr = value
    elif hasattr(value, "detach") and hasattr(value, "cpu"):  # a PyTorch tensor
        tensor = value.detach().cpu()
        small = SMALL_TORCH.get(str(tensor.dtype))
        if small is not None:
            import ml_dtypes
            import torch

            arr = tensor.view(getattr(torch, small[0])).numpy().view(getattr(ml_dtypes, small[1]))
        else:
            arr = tensor.numpy()
    elif value is None:
        from attnviz.errors import no_weights

        raise InputError(no_weights(f"{name} is None"))
    else:
        try:
            arr = np.asarray(value)
        except (TypeError, ValueError) as exc:
            raise InputError(f"{name}: not an array ({exc}).") from None
    if arr.dtype.kind not in "biuf" and arr.dtype.name not in ("bfloat16", "float8_e4m3fn", "float8_e5m2"):
        kind = type(value).__name__
        what = f"an array of {arr.dtype}" if arr.dtype.kind != "O" else f"{'an' if kind[0] in 'aeiou' else 'a'} {kind}"
        raise InputError(f"{name}: an array of numbers (or a tensor) is needed; received {what}.")
    return arr


def _is_nested(value: Any) -> bool:
    """A container of arrays (layers, steps), not a nested list of numbers."""
    if isinstance(value, Mapping):
        return True
    if not isinstance(value, (list, tuple)) or not value:
        return False
    return any(not isinstance(v, (int, float, list)) for v in value)


def _flatten(value: Any, prefix: str, out: dict[str, np.ndarray], name: str) -> None:
    if isinstance(value, Mapping):
        items: Any = value.items()
    elif _is_nested(value):
        items = enumerate(value)
    else:
        out[prefix] = to_array(value, f"{name}[{prefix.replace('.', '][')}]" if prefix else name)
        return
    for key, item in items:
        _flatten(item, f"{prefix}.{key}" if prefix else str(key), out, name)


def to_value(value: Any, name: str) -> Any:
    """An array, or a ``MemoryContainer`` of named arrays for a tuple, list or dict of them."""
    if _is_nested(value):
        arrays: dict[str, np.ndarray] = {}
        _flatten(value, "", arrays, name)
        return MemoryContainer(name, arrays)
    arr = to_array(value, name)
    if arr.dtype == np.float16 or arr.dtype.kind not in "biuf":  # widened on reading, its dtype remembered
        return MemoryContainer(name, {name: arr})
    return arr


def labels_value(value: Any, name: str) -> list[str] | list[list[str]]:
    """Token labels handed over: one list of strings, or one list per batch entry."""
    if isinstance(value, str) or not hasattr(value, "__iter__"):
        raise InputError(f"{name}: a list of token strings (or one list per batch entry) is needed; received "
                         f"{type(value).__name__}.")
    items = list(value)
    if items and all(not isinstance(v, str) and hasattr(v, "__iter__") for v in items):
        return [[str(t) for t in row] for row in items]
    return [str(v) for v in items]


def option_values(options: dict[str, Any], memory: dict[str, Any], classes: Sequence[type]) -> dict[str, Any]:
    """Options of the dataclasses ``classes`` as the library takes them: arrays, label lists and config
    dicts given for a file option go to ``memory`` under the option's name and the option becomes its
    in-memory spec; a dict for ``rope_scaling`` becomes its JSON text."""
    from attnviz.io import memory_spec

    out = dict(options)
    for name in file_options(classes):
        value = out.get(name)
        if value is None or isinstance(value, str):
            continue
        if name in LABEL_OPTIONS:
            memory[name] = labels_value(value, name)
        elif name == "hf_config" and isinstance(value, Mapping):
            memory[name] = dict(value)
        else:
            memory[name] = to_value(value, name)
        out[name] = memory_spec(name)
    if isinstance(out.get("rope_scaling"), Mapping):
        out["rope_scaling"] = json.dumps(out["rope_scaling"])
    return out

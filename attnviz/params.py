"""Learned parameters: what a variant expects, reading them from ``--params FILE`` (``.npz``,
``.safetensors``, HDF5 or a ``torch.save`` dict), drawing them with ``--seed N``, and writing them
with ``--save-params FILE.npz``. NumPy only.

Kernels are stored in the Keras orientation ``[in, out]`` and applied as ``x @ W``. Drawn kernels are
Glorot-uniform, ``U(-l, l)`` with ``l = sqrt(6 / (fan_in + fan_out))`` from
``numpy.random.default_rng(seed)``, in the order the variant lists them; biases are zeros. These are
the Keras defaults, but the draws do not match Keras's own random numbers.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from attnviz.errors import ParamsError, UsageError
from attnviz.storage import Place

if TYPE_CHECKING:  # NumPy is imported in the functions: variant modules import ParamSpec for --help
    import numpy as np


@dataclass(frozen=True)
class ParamSpec:
    """One learned array a variant expects."""

    shape: tuple[int, ...]
    init: str | float = "glorot"  # "glorot", "zeros", "ones", or a constant
    fans: tuple[int, int] | None = None  # Glorot fans when not those of a 1-D or 2-D shape
    optional: bool = False  # may be left out of a parameter file: then ``init`` (zeros for biases)


def bias(*shape: int) -> ParamSpec:
    """An optional bias, zeros unless the file has it."""
    return ParamSpec(tuple(shape), init="zeros", optional=True)


def fans(spec: ParamSpec) -> tuple[int, int]:
    """Glorot fans as Keras ``compute_fans`` gives them (explicit ``fans`` win)."""
    if spec.fans is not None:
        return spec.fans
    shape = spec.shape
    if len(shape) == 0:
        return 1, 1
    if len(shape) == 1:
        return shape[0], shape[0]
    if len(shape) == 2:
        return shape[0], shape[1]
    receptive = math.prod(shape[:-2])
    return shape[-2] * receptive, shape[-1] * receptive


def initial(spec: ParamSpec, rng: np.random.Generator | None) -> np.ndarray:
    import numpy as np

    if spec.init == "glorot":
        if rng is None:
            raise ValueError("a Glorot draw needs a generator")
        fan_in, fan_out = fans(spec)
        limit = math.sqrt(6.0 / (fan_in + fan_out))
        return rng.uniform(-limit, limit, size=spec.shape).astype(np.float32)
    value = {"zeros": 0.0, "ones": 1.0}.get(spec.init, spec.init) if isinstance(spec.init, str) else spec.init
    return np.full(spec.shape, float(value), dtype=np.float32)


def draw(specs: Mapping[str, ParamSpec], seed: int) -> dict[str, np.ndarray]:
    """Every parameter, drawn reproducibly from ``seed`` in the order of ``specs``."""
    import numpy as np

    rng = np.random.default_rng(seed)
    return {name: initial(spec, rng) for name, spec in specs.items()}


def read(spec: str) -> tuple[dict[str, np.ndarray], Place]:
    """The arrays of a parameter file of named arrays (``.npz``, ``.safetensors``, ``.h5``/``.hdf5``, or a
    ``torch.save`` dict in ``.pt``/``.pth``/``.bin``), checked to be numeric and finite (never unpickled).
    Keys are the file's own: ``query/kernel`` is a key of a ``.npz`` or ``.safetensors`` file and a
    dataset path in HDF5."""
    from attnviz import storage
    from attnviz.errors import InputError
    from attnviz.formats import CONTAINER_SUFFIXES, Container, describe, open_file
    from attnviz.io import MEMORY, open_spec, validate_array
    from attnviz.storage.local import regular_file

    if spec.startswith(MEMORY):  # parameters handed over in memory (the Python API)
        container = open_spec(spec).raw
        out = {}
        for key in container.keys:
            arr = container.get(key)
            validate_array(arr, f"{container.source}:{key}")
            out[key] = arr
        return out, Path(container.source)
    path = storage.place(spec)
    if path.suffix.lower() not in CONTAINER_SUFFIXES:
        raise UsageError(f"--params {spec}: a parameter file is a .npz archive (numpy.savez), or a file of named "
                         f"arrays ({describe(keyed_only=True)}).")
    if isinstance(path, Path):  # a directory, device or FIFO is refused before it is opened
        regular_file(path, f"--params {spec}", pipe="parameter files are memory-mapped from regular files: save it "
                     "to a file")
    try:  # errors of a store stay InputError (exit 1), as a missing object is
        container = open_file(path, spec)
        if not isinstance(container, Container):
            raise ParamsError(f"{spec}: a parameter file holds named arrays (a dict of tensors), not a single "
                              "tensor.")
        out = {}
        for key in container.keys:
            arr = container.get(key)
            validate_array(arr, f"{spec}:{key}")
            out[key] = arr
    except InputError as exc:
        raise ParamsError(exc.message) from None
    except MemoryError:
        raise ParamsError(f"{spec}: not enough memory to read the parameters.") from None
    return out, path


def check(given: Mapping[str, np.ndarray], specs: Mapping[str, ParamSpec], source: str) -> dict[str, np.ndarray]:
    """The parameters a file gives, checked against what the variant expects: a missing, extra or
    wrongly shaped key is an error naming the key, the shape received and the shape expected."""
    import numpy as np

    from attnviz.formats import listing, natural
    from attnviz.io import shape_str

    extra = natural(set(given) - set(specs))
    if extra:
        raise ParamsError(
            f"{source}: unexpected key(s) {listing(extra)}; this run expects "
            + listing([f"{k} {shape_str(s.shape)}" for k, s in specs.items()])
            + "."
        )
    out = {}
    for name, spec in specs.items():
        if name not in given:
            if spec.optional:
                out[name] = initial(spec, None)
                continue
            raise ParamsError(f"{source}: missing key {name!r}, expected shape {shape_str(spec.shape)}.")
        arr = given[name]
        if tuple(arr.shape) != spec.shape:
            raise ParamsError(
                f"{source}: key {name!r} has shape {shape_str(arr.shape)}, expected {shape_str(spec.shape)}."
            )
        out[name] = arr.astype(np.float64 if arr.dtype == np.float64 else np.float32, copy=False)
    return out


def save(path: Path, params: Mapping[str, np.ndarray]) -> None:
    """Write parameters as a ``.npz`` that ``--params`` reads back (keys may contain ``/``)."""
    import numpy as np

    from attnviz.io import write_atomic

    write_atomic(path, lambda fh: np.savez(fh, **dict(params)))  # type: ignore[arg-type]

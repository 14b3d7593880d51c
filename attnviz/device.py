"""TensorFlow, imported lazily and once; the device and precision a run uses.

``import tensorflow`` costs seconds, so nothing imports it at module level: call ``tensorflow()``.
``resolve_device("auto")`` picks the first GPU TensorFlow sees, else the CPU; ``"gpu"`` with no GPU
visible is an error (exit 1). GPU memory growth is switched on before any GPU is used, so attnviz
takes what it needs rather than the whole card.

Precision: inputs are cast to the requested dtype and the scores are computed in it; float16 and
bfloat16 scores are upcast to float32 before masking and softmax, so the weights reported for them
are float32.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cache
from typing import Any

from attnviz.choices import DEVICES, DTYPES
from attnviz.errors import DeviceError

__all__ = ["DEVICES", "DTYPES", "Device", "resolve_device", "softmax_dtype", "tensorflow"]
LOW_PRECISION = ("float16", "bfloat16")
#: largest finite value of each dtype, to catch inputs that would overflow when cast
DTYPE_MAX = {"float16": 65504.0, "bfloat16": 3.3895e38, "float32": 3.4028e38, "float64": 1.7976e308}


@contextmanager
def _silenced_fd2(silence: bool) -> Iterator[None]:
    """Point file descriptor 2 at /dev/null for the duration: TensorFlow's C++ start-up lines
    ("oneDNN custom operations are on", "Could not find cuda drivers") are written there before
    its log level is read. Python exceptions still propagate."""
    if not silence:
        yield
        return
    saved = os.dup(2)
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


def tensorflow_chatter_wanted() -> bool:
    """Whether TensorFlow's own start-up lines may reach the user: only when asked for, with
    ``ATTNVIZ_DEBUG`` set or ``TF_CPP_MIN_LOG_LEVEL`` set to 0, 1 or 2. Unset, or 3 (what people export
    to silence TensorFlow), they never do: some of them are written before TensorFlow reads its level."""
    if os.environ.get("ATTNVIZ_DEBUG", "") not in ("", "0"):
        return True
    return os.environ.get("TF_CPP_MIN_LOG_LEVEL", "").strip() in ("0", "1", "2")


class _KerasLeftOut:
    """A finder that, while ``import tensorflow`` runs, lets ``keras`` be found but not loaded.

    TensorFlow's ``__init__`` imports Keras 3 eagerly (``keras.src.optimizers``, in a ``try`` that
    passes over an ImportError), and Keras imports matplotlib's pyplot and every application model:
    a fifth of TensorFlow's start-up, for an API attnviz never calls (it uses ``tf.linalg``, ``tf.nn``
    and plain ops). ``tf.keras`` and ``import keras`` still work afterwards: the finder is gone by
    then, and Keras loads on first use as it would have."""

    class _Refused:
        def create_module(self, spec: Any) -> None:
            return None

        def exec_module(self, module: Any) -> None:
            raise ImportError("keras is loaded on first use, not with tensorflow")

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name != "keras":
            return None
        from importlib.machinery import PathFinder

        spec = PathFinder.find_spec(name, path)
        if spec is not None:
            spec.loader = self._Refused()  # type: ignore[assignment]
        return spec


@contextmanager
def _keras_left_out() -> Iterator[None]:
    if "keras" in sys.modules:  # already loaded by the caller (a notebook): nothing to save
        yield
        return
    finder = _KerasLeftOut()
    sys.meta_path.insert(0, finder)
    try:
        yield
    finally:
        sys.meta_path.remove(finder)
        for name in [n for n in sys.modules if n == "keras" or n.startswith("keras.")]:
            if sys.modules[name] is None:  # a failed import's marker would hide Keras from a later import
                del sys.modules[name]


_IMPORT_LOCK = threading.Lock()


def tensorflow() -> Any:
    """The ``tensorflow`` module, imported on first use with its start-up chatter silenced.

    Set ``TF_CPP_MIN_LOG_LEVEL`` to 0, 1 or 2 (or ``ATTNVIZ_DEBUG=1``) to see TensorFlow's own messages.
    One thread imports it; the jobs of ``attnviz batch --jobs N`` that ask at the same time wait for it
    (two imports at once would each point file descriptor 2 at /dev/null and put back what the other
    had left there, so that stderr could stay silenced for the rest of the run).
    """
    tf = _imported
    if tf is not None:
        return tf
    with _IMPORT_LOCK:
        return _import_tensorflow()


_imported: Any = None


@contextmanager
def quiet_tensorflow() -> Iterator[None]:
    """Around an import that brings TensorFlow with it (``import keras_hub``, Keras on its TensorFlow backend):
    TensorFlow's C++ log kept to what stops it (``TF_CPP_MIN_LOG_LEVEL`` 3 unless the user set a level; with 3
    the "failed call to cuInit" of a machine without a GPU is not written when the devices start), and the lines it
    writes while it loads, before it reads that level (twice: two libraries load absl), kept off stderr unless
    asked for (``tensorflow_chatter_wanted``). Nothing changes once TensorFlow is imported."""
    if "tensorflow" in sys.modules:
        yield
        return
    with _IMPORT_LOCK:
        wanted = tensorflow_chatter_wanted()
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
        with _silenced_fd2(not wanted):
            yield


def _import_tensorflow() -> Any:
    global _imported
    if _imported is not None:
        return _imported
    wanted = tensorflow_chatter_wanted()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    with _silenced_fd2(not wanted):
        if "tensorflow" in sys.modules:
            import tensorflow as tf
        else:
            try:
                with _keras_left_out():
                    import tensorflow as tf
            except ImportError:  # a TensorFlow that cannot start without Keras: import it as it is
                import tensorflow as tf

    for gpu in tf.config.list_physical_devices("GPU"):
        try:
            tf.config.experimental.set_memory_growth(gpu, True)
        except (RuntimeError, ValueError):  # already initialised: keep going
            pass
    _imported = tf
    return tf


@dataclass(frozen=True)
class Device:
    name: str  # "CPU:0", "GPU:0": what reports show
    tf_name: str  # "/CPU:0": what tf.device takes

    @property
    def is_gpu(self) -> bool:
        return self.name.startswith("GPU")


@cache
def visible_gpus() -> tuple[Any, ...]:
    """The GPUs TensorFlow sees (asked once a process: batch jobs do not ask again)."""
    return tuple(tensorflow().config.list_physical_devices("GPU"))


def resolve_device(request: str) -> Device:
    """``auto`` -> GPU:0 when TensorFlow sees a GPU, else CPU:0; ``cpu``; ``gpu`` (error if none)."""
    if request not in DEVICES:
        raise DeviceError(f"--device {request!r}: expected one of {', '.join(DEVICES)}.")
    gpus = visible_gpus() if request != "cpu" else []
    if request == "gpu" and not gpus:
        raise DeviceError(
            "--device gpu: TensorFlow sees no GPU on this machine (is the CUDA build installed, "
            "pip install 'attnviz[gpu]', and a driver present?). Use --device cpu or auto."
        )
    if gpus:
        return Device("GPU:0", "/GPU:0")
    return Device("CPU:0", "/CPU:0")


def softmax_dtype(dtype: str) -> str:
    """The dtype scores are masked and normalised in: float32 for float16/bfloat16."""
    return "float32" if dtype in LOW_PRECISION else dtype

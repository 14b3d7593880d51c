"""``attnviz.keras.AttentionMonitor``: a Keras callback that records a model's attention on a fixed probe batch
while it trains, every N epochs or steps, and writes what ``attnviz inspect`` reports of it to TensorBoard.

Each recording is one forward pass of the probe batch, outside the training step (``model(probe,
training=False)``, eagerly, between two steps): the model is captured as ``attnviz.capture`` captures it
(``attnviz.capturing.keras``: each attention layer's weights computed from the q and k it received, which is also
how a ``MultiHeadAttention`` with flash attention, whose fused kernel returns no scores, is seen; said once), into a
capture file; ``attnviz.monitoring.records.exact_record`` reads it as ``inspect`` does, and
``attnviz.monitoring.tensorboard.write_record`` writes the statistics, tags, pictures and table as one event file.
The capture file is removed, or kept (``keep``: one file per recording, named by the step, that ``inspect``,
``compare`` and ``view`` read). The monitor keeps nothing of a recording once it is written: memory stays flat
over a long run.

Training is unchanged: no dropout or random state is used by the probe's forward (``training=False``), no
weight or optimizer state is touched, and the layers' patched methods are restored before the next step. A
failure inside a recording (a probe the model refuses, a full disk) is said once, as a warning, and ends the
recordings; it never stops the training.
"""

from __future__ import annotations

import os
import tempfile
import warnings
from pathlib import Path
from typing import Any

from attnviz.errors import AttnvizError, UsageError

PER = ("epoch", "step")
#: the capture files a monitor keeps (``keep``), by step
KEPT_FILE = "{per}_{step:06d}.safetensors"


class Monitor:
    """What ``AttentionMonitor`` does, apart from Keras' callback class (see the module's docstring and
    ``AttentionMonitor``'s)."""

    def __init__(self, probe: Any, log_dir: str | os.PathLike[str] | None = None, *, tokens: Any = None,
                 tokenizer: Any = None, every: int = 1, per: str = "epoch", pictures: bool = True,
                 keep: str | os.PathLike[str] | None = None, layers: Any = None) -> None:
        if per not in PER:
            raise UsageError(f"AttentionMonitor: per={per!r}; choose 'epoch' or 'step'.")
        if not isinstance(every, int) or isinstance(every, bool) or every < 1:
            raise UsageError(f"AttentionMonitor: every={every!r}; give a whole number of {per}s, 1 or more.")
        if log_dir is None and keep is None:
            raise UsageError("AttentionMonitor: give log_dir (TensorBoard's event files), keep (a folder for a capture "
                             "file per recording), or both.")
        if tokens is not None and tokenizer is not None:
            raise UsageError("AttentionMonitor: give tokens or a tokenizer, not both.")
        _check_backend()
        from attnviz.monitoring.tensorboard import check_log_dir

        self.log_dir = None if log_dir is None else check_log_dir(log_dir)
        self.keep = None if keep is None else check_log_dir(keep)
        self.probe = probe
        self.tokens = None if tokens is None else [[str(t) for t in row] for row in _rows(tokens)]
        self.tokenizer = tokenizer
        self.every, self.per, self.pictures, self.layers = every, per, pictures, layers
        self.steps = 0  # training steps done (per="step")
        self.recorded: list[int] = []  # the steps recorded, in order
        self.failed: str | None = None  # what ended the recordings
        self.said: set[str] = set()  # what was said once
        self.watched: Any = None  # the model (Keras' callback sets ``model``)

    # -- when

    def epoch_end(self, epoch: int) -> None:
        if self.per == "epoch" and (epoch + 1) % self.every == 0:
            self.record(epoch)

    def batch_end(self) -> None:
        self.steps += 1
        if self.per == "step" and self.steps % self.every == 0:
            self.record(self.steps)

    # -- a recording

    def record(self, step: int) -> None:
        """Record the probe at ``step``; a failure is said once and ends the recordings (never the training)."""
        if self.failed is not None or self.watched is None:
            return
        try:
            self._record(step)
        except Exception as exc:  # noqa: BLE001 - the training it watches goes on, whatever happened here
            self.failed = _one_line(exc)
            warnings.warn(f"attnviz AttentionMonitor: {self.per} {step}: {self.failed}; no further recordings (the "
                          "training goes on).", UserWarning, stacklevel=2)

    def _record(self, step: int) -> None:
        from attnviz.capturing.session import Capture
        from attnviz.monitoring.records import exact_record

        model = self.watched
        self._say_fused(model)
        kept = None
        if self.keep is not None:
            self.keep.mkdir(parents=True, exist_ok=True)
            kept = self.keep / KEPT_FILE.format(per=self.per, step=step)
        with warnings.catch_warnings(record=True) as said:
            warnings.simplefilter("always")
            capture = Capture(model, self.tokenizer, self.layers, path=kept or _temporary())
            try:
                with capture:
                    self._forward(model)
                    if self.tokens is not None:
                        _record_tokens(capture, self.tokens)
                if self.log_dir is not None:
                    from attnviz.monitoring.tensorboard import write_record

                    record = exact_record(str(capture.path), title=f"{self.per} {step}")
                    notes = [f"attnviz: {text}" for text in self._once([str(w.message) for w in said])]
                    write_record(self.log_dir, record, step, pictures=self.pictures, notes=notes, capture=kept)
            finally:
                if kept is None and capture.path is not None:
                    _remove(capture.path)
        self.recorded.append(step)

    def _forward(self, model: Any) -> None:
        """One forward pass of the probe, in inference mode (no dropout, no update of a layer's statistics)."""
        probe = self.probe
        try:
            model(probe, training=False)
        except AttnvizError:
            raise
        except Exception as exc:
            raise UsageError(f"the model refused the probe batch ({_one_line(exc)})") from None

    def _once(self, texts: list[str]) -> list[str]:
        fresh = [t for t in texts if t not in self.said]
        self.said.update(fresh)
        return fresh

    def _say_fused(self, model: Any) -> None:
        """Keras' flash attention returns no scores: the weights are computed from each layer's q and k (said once)."""
        if "fused" in self.said:
            return
        self.said.add("fused")
        from attnviz.capturing.keras import attention_layers

        mha, _ = attention_layers(model)
        fused = [layer.name for layer in mha if getattr(layer, "_flash_attention", False)]
        if fused:
            warnings.warn(f"attnviz AttentionMonitor: {', '.join(fused)}: Keras' flash attention returns no scores; "
                          "attnviz computes these layers' weights from the q and k each received.", UserWarning,
                          stacklevel=4)

    def check_model(self, model: Any) -> None:
        """At the start of training: the model has an attention layer attnviz sees (else said once, and nothing is
        recorded)."""
        from attnviz.capturing.keras import attention_layers

        self.watched = model
        try:
            mha, hub = attention_layers(model)
            if not mha and not hub:
                raise UsageError(f"{type(model).__name__}: no attention layer in the model; attnviz records "
                                 "keras.layers.MultiHeadAttention and KerasHub's attention layers")
        except AttnvizError as exc:
            self.failed = _one_line(exc)
            warnings.warn(f"attnviz AttentionMonitor: {self.failed}; nothing will be recorded (the training goes on).",
                          UserWarning, stacklevel=3)


def _check_backend() -> None:
    import keras

    backend = keras.backend.backend()
    if backend not in ("tensorflow", "torch"):
        raise UsageError(f"AttentionMonitor: Keras' {backend} backend is not supported; attnviz records attention on "
                         "the tensorflow and torch backends.")


def _rows(tokens: Any) -> list[Any]:
    rows = list(tokens)
    if rows and isinstance(rows[0], str):
        return [rows]
    return rows


class _GivenTokens:
    """A tokenizer for the capture's metadata whose ids are positions in the given token rows (``_record_tokens``)."""

    def __init__(self, rows: list[list[str]]) -> None:
        self.flat = [t for row in rows for t in row]

    def convert_ids_to_tokens(self, ids: list[int]) -> list[str]:
        return [self.flat[i] for i in ids]


def _record_tokens(capture: Any, rows: list[list[str]]) -> None:
    """The probe's tokens into the capture file (``tokens`` in its metadata, as a tokenizer's would be)."""
    import numpy as np

    lengths = {len(r) for r in rows}
    if len(lengths) != 1:
        raise UsageError(f"tokens: rows of {sorted(lengths)} tokens; give one list of the probe's length per row.")
    n = lengths.pop()
    ids = np.arange(len(rows) * n, dtype=np.int64).reshape(len(rows), n)
    capture._rec.record_inputs({"input_ids": ids}, continuing=False)
    capture.tokenizer = _GivenTokens(rows)


def _temporary() -> Path:
    fd, name = tempfile.mkstemp(prefix="attnviz-monitor-", suffix=".safetensors")
    os.close(fd)
    os.unlink(name)
    return Path(name)


def _remove(path: Any) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return (text[0] if text else type(exc).__name__).rstrip(".")


_CLASS: Any = None


def keras_callback() -> Any:
    """``AttentionMonitor``, the Keras callback class (made once, when Keras is first asked for)."""
    global _CLASS
    if _CLASS is not None:
        return _CLASS
    import keras

    class AttentionMonitor(keras.callbacks.Callback):
        """Record a model's attention on a fixed probe batch while it trains; write it to TensorBoard.

        >>> monitor = attnviz.keras.AttentionMonitor(x_val[:8], log_dir="logs/attnviz")
        >>> model.fit(x, y, epochs=20, callbacks=[monitor])

        ``probe``: the model's inputs (an array, a list or a dict of arrays) of the batch whose attention is
        recorded, the same batch each time; ``log_dir``: TensorBoard's folder for this run (give the monitor a
        folder of its own, beside Keras' ``logs/train``: TensorBoard reads one writer's files per folder);
        ``tokens`` (one list of strings per probe row) or ``tokenizer`` (a KerasHub or transformers tokenizer,
        for ``token_ids`` inputs): the labels of the positions, and the induction and duplicate-token scores;
        ``every`` N ``per`` ``"epoch"`` (TensorBoard's step: the epoch, from 0, as Keras' own callback) or ``"step"``
        (the training steps done); ``pictures=False``: no images (the scalars and the table alone); ``keep``: a
        folder for one capture file per recording (``epoch_000003.safetensors``), which ``attnviz inspect``,
        ``compare`` and ``view`` read; ``layers``: the sites to record (as ``attnviz.capture``'s).

        A recording that fails is said once, as a warning, and ends the recordings; the training goes on.
        """

        def __init__(self, probe: Any, log_dir: str | os.PathLike[str] | None = None, **options: Any) -> None:
            super().__init__()
            self.monitor = Monitor(probe, log_dir, **options)

        @property
        def recorded(self) -> list[int]:
            """The steps recorded so far."""
            return self.monitor.recorded

        def on_train_begin(self, logs: Any = None) -> None:
            self.monitor.check_model(self.model)

        def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
            self.monitor.epoch_end(epoch)

        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            self.monitor.batch_end()

    AttentionMonitor.__module__ = "attnviz.keras"
    _CLASS = AttentionMonitor
    return _CLASS

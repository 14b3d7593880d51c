"""``attnviz.keras.AttentionMonitor``: a tiny Keras transformer trains with the callback, and

- its training is unchanged: the same losses and weights, bit for bit, with TensorFlow's op determinism on (in a
  fresh process: op determinism would stay on in this one);
- the event files hold the documented tags (``attnviz.monitoring.tensorboard.TAGS``), each scalar equal to
  ``attnviz.inspect``'s head statistic of the same weights (the capture file the monitor keeps), the tags' counts,
  the grid and per-layer images and the head table as ``inspect`` prints it;
- a failure inside a recording (a probe the model refuses, a full disk) is one warning, the training goes on, and
  nothing is half-written in the log directory; a model with no attention layer, JAX and a bad log directory are
  said in one line; memory stays flat over many recordings.
"""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

from tests.kerasmodels import SOURCE, copying_data, tiny_transformer

keras = pytest.importorskip("keras")
pytest.importorskip("tensorboard")

ROOT = Path(__file__).resolve().parent.parent


def _events(folder: Path) -> dict[str, list[tuple[int, np.ndarray]]]:
    """Every summary of ``folder``'s event files, read by TensorBoard's own reader: tag -> [(step, value)]."""
    import tensorflow as tf
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(folder), size_guidance={"tensors": 0, "scalars": 0, "images": 0})
    acc.Reload()
    return {tag: [(e.step, tf.make_ndarray(e.tensor_proto)) for e in acc.Tensors(tag)]
            for tag in acc.Tags()["tensors"]}


def _monitor(*args, **kwargs):
    from attnviz.keras import AttentionMonitor

    return AttentionMonitor(*args, **kwargs)


def _train(logs: Path | None) -> tuple[list[float], list[np.ndarray]]:
    """The bit-for-bit test's training (dropout on, shuffled batches), with a monitor recording every two steps
    into ``logs`` or without one: its losses and final weights."""
    model = tiny_transformer(dropout=0.1)
    x, y = copying_data(n=32)
    keras.utils.set_random_seed(1)
    monitor = [] if logs is None else [_monitor(x[:4], logs, per="step", every=2)]
    history = model.fit(x, y, epochs=3, batch_size=16, verbose=0, shuffle=True, callbacks=monitor)
    return history.history["loss"], [w.numpy() if hasattr(w, "numpy") else np.asarray(w) for w in model.weights]


def test_training_is_unchanged_bit_for_bit(tmp_path):
    """The same losses and weights with and without the monitor (dropout on, shuffled batches, a recording every
    two steps), with op determinism and the same seeds; 3 recordings were written. In this process, which has
    TensorFlow and the monitor imported already (a fresh one took a third of the test's time to import them); op
    determinism is put back off afterwards (TensorFlow exports no way to: its config module's own function)."""
    import tensorflow as tf
    from tensorflow.python.framework import config as tf_config

    assert not tf_config.is_op_determinism_enabled()
    tf.config.experimental.enable_op_determinism()
    try:
        loss_a, weights_a = _train(None)
        loss_b, weights_b = _train(tmp_path / "logs")
    finally:
        tf_config.disable_op_determinism()
    assert loss_a == loss_b
    assert len(weights_a) > 10 and all(np.array_equal(a, b) for a, b in zip(weights_a, weights_b, strict=True))
    assert len(os.listdir(tmp_path / "logs")) == 3  # 3 epochs of 2 steps, every 2 steps


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A tiny transformer trained 3 epochs with the monitor (its capture files kept), and its log directory."""
    folder = tmp_path_factory.mktemp("monitor")
    model = tiny_transformer()
    x, y = copying_data()
    tokens = [[f"t{v}" for v in row] for row in x[:4]]
    monitor = _monitor(x[:4], folder / "logs", keep=folder / "kept", tokens=tokens)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing to say on a good run
        history = model.fit(x, y, epochs=3, batch_size=16, verbose=0, callbacks=[monitor])
    return folder, monitor, history, model


@pytest.fixture
def model(trained):
    """The module's model, trained and traced already (each test fits it a little more with a monitor of its own)."""
    return trained[3]


def test_event_files_hold_the_documented_tags_with_inspect_s_values(trained):
    """Each head's scalars equal attnviz.inspect's head statistics of the capture file kept for that epoch (its
    tokens give induction and duplicate), the tags 1 where inspect's tag column names them, their counts; a grid
    image, a picture per layer and the head table, at steps 0, 1, 2 (the epochs)."""
    import attnviz
    from attnviz.inspection.tags import split_tags
    from attnviz.monitoring.tensorboard import TAGS
    from attnviz.statistics import WEIGHTS, names, tag_rules

    folder, monitor, history, _ = trained
    assert monitor.recorded == [0, 1, 2] and len(history.history["loss"]) == 3
    assert sorted(os.listdir(folder / "kept")) == [f"epoch_00000{e}.safetensors" for e in range(3)]
    events = _events(folder / "logs")
    assert not [n for n in os.listdir(folder / "logs") if "tfevents" not in n]  # nothing staged left behind
    stats = [n for n in names(WEIGHTS)]
    rules = [r.tag for r in tag_rules(WEIGHTS)]
    for epoch in range(3):
        inspected = attnviz.inspect(str(folder / "kept" / f"epoch_00000{epoch}.safetensors"))
        head = inspected.head_stats
        for layer in range(2):
            for h in range(2):
                for stat in stats:
                    tag = TAGS["statistic"].format(layer=layer, head=h, stat=stat)
                    ((step, value),) = [e for e in events[tag] if e[0] == epoch]
                    np.testing.assert_allclose(float(value), float(head[stat][layer, h]), rtol=1e-6, atol=1e-7,
                                               err_msg=tag)
                for rule in rules:
                    tag = TAGS["head tag"].format(layer=layer, head=h, tag=rule)
                    ((_, value),) = [e for e in events[tag] if e[0] == epoch]
                    assert float(value) == float(rule in split_tags(head["tag"][layer, h])), tag
        for rule in rules:
            count = sum(rule in split_tags(t) for t in np.asarray(head["tag"]).ravel())
            ((_, value),) = [e for e in events[TAGS["tag count"].format(tag=rule)] if e[0] == epoch]
            assert float(value) == count
    assert {step for step, _ in events["attnviz/grid"]} == {0, 1, 2}
    for tag in ("attnviz/grid", "attnviz/layer_0", "attnviz/layer_1"):
        import io

        from PIL import Image

        width, height, png = events[tag][-1][1][:3]
        picture = Image.open(io.BytesIO(png))
        assert picture.size == (int(width), int(height)) and min(picture.size) > 100
    ((_, table),) = [e for e in events[TAGS["table"]] if e[0] == 2]
    text = table.item().decode()
    assert "head statistics" in text and "layer 0:" in text and "ind" in text


TORCH = SOURCE + r'''
import json, sys
import numpy as np, keras
import attnviz
from attnviz.keras import AttentionMonitor

model = tiny_transformer()
x, y = copying_data()
monitor = AttentionMonitor(x[:2], sys.argv[1] + "/logs", keep=sys.argv[1] + "/kept")
model.fit(x, y, epochs=2, batch_size=16, verbose=0, callbacks=[monitor])
layer = model.get_layer("attention_1")
inputs = keras.Model(model.inputs, layer._inbound_nodes[0].input_tensors[0])([x[:2]])
_, scores = layer(inputs, inputs, use_causal_mask=True, return_attention_scores=True)
got = attnviz.inspect(sys.argv[1] + "/kept/epoch_000001.safetensors").weights[1]
print(json.dumps({"backend": keras.backend.backend(), "recorded": monitor.recorded, "failed": monitor.monitor.failed,
                  "diff": float(np.abs(got - keras.ops.convert_to_numpy(scores)).max())}))
'''


def test_keras_on_the_torch_backend(tmp_path):
    """Keras 3 on its torch backend (a fresh process): the monitor records every epoch, and the weights it keeps
    equal the layer's own return_attention_scores=True."""
    pytest.importorskip("torch")
    import json

    env = {**os.environ, "PYTHONPATH": str(ROOT), "TF_CPP_MIN_LOG_LEVEL": "3", "KERAS_BACKEND": "torch"}
    done = subprocess.run([sys.executable, "-c", TORCH, str(tmp_path)], capture_output=True, text=True, env=env,
                          timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["backend"] == "torch" and got["recorded"] == [0, 1] and got["failed"] is None
    assert got["diff"] < 1e-6
    assert len(os.listdir(tmp_path / "logs")) == 2


def test_a_probe_the_model_refuses_is_one_warning_and_training_goes_on(model, tmp_path):
    x, y = copying_data()
    monitor = _monitor(x[:4, :5], tmp_path / "logs")
    with pytest.warns(UserWarning) as said:
        history = model.fit(x[:32], y[:32], epochs=3, batch_size=16, verbose=0, callbacks=[monitor])
    lines = [str(w.message) for w in said if "AttentionMonitor" in str(w.message)]
    assert len(lines) == 1 and "epoch 0: the model refused the probe batch" in lines[0], lines
    assert "\n" not in lines[0] and len(history.history["loss"]) == 3 and monitor.recorded == []
    assert not (tmp_path / "logs").exists() or os.listdir(tmp_path / "logs") == []


def test_a_full_disk_leaves_nothing_half_written(model, tmp_path, monkeypatch):
    """The event file's copy into the log directory fails (ENOSPC) at the second recording: one warning, no part
    file and no second event file; the first recording's file stays whole."""
    from attnviz.monitoring import tensorboard

    x, y = copying_data()
    monitor = _monitor(x[:4], tmp_path / "logs", pictures=False)
    real = tensorboard.shutil.copyfileobj
    calls = []

    def full(src, dst, *args):
        calls.append(1)
        if len(calls) == 2:
            dst.write(b"\0" * 100)  # part of it written, then the disk is full
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(src, dst, *args)

    monkeypatch.setattr(tensorboard.shutil, "copyfileobj", full)
    with pytest.warns(UserWarning, match=r"epoch 1: .*No space left on device\); no further recordings"):
        history = model.fit(x[:32], y[:32], epochs=3, batch_size=16, verbose=0, callbacks=[monitor])
    assert len(history.history["loss"]) == 3 and monitor.recorded == [0]
    (name,) = os.listdir(tmp_path / "logs")
    assert "tfevents" in name
    assert {step for step, _ in _events(tmp_path / "logs")["attnviz/heads"]} == {0}


def test_a_model_without_attention_is_said_once(tmp_path):
    inp = keras.Input((4,))
    model = keras.Model(inp, keras.layers.Dense(2)(inp))
    model.compile(optimizer="sgd", loss="mse")
    with pytest.warns(UserWarning, match="no attention layer in the model.*nothing will be recorded") as said:
        model.fit(np.zeros((8, 4)), np.zeros((8, 2)), epochs=2, verbose=0,
                  callbacks=[_monitor(np.zeros((2, 4)), tmp_path / "logs")])
    assert len([w for w in said if "AttentionMonitor" in str(w.message)]) == 1
    assert not (tmp_path / "logs").exists()


def test_bad_arguments_and_log_dirs_are_one_line(tmp_path, monkeypatch):
    from attnviz.errors import OutputError, UsageError

    afile = tmp_path / "file"
    afile.write_text("x")
    with pytest.raises(OutputError, match="must be a folder"):
        _monitor(np.zeros((1, 12)), afile)
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        if not os.access(locked, os.W_OK):  # (root writes anywhere)
            with pytest.raises(OutputError, match="not writable"):
                _monitor(np.zeros((1, 12)), locked / "logs")
    finally:
        locked.chmod(0o700)
    with pytest.raises(UsageError, match="per='week'"):
        _monitor(np.zeros((1, 12)), tmp_path, per="week")
    with pytest.raises(UsageError, match="every=0"):
        _monitor(np.zeros((1, 12)), tmp_path, every=0)
    with pytest.raises(UsageError, match="give log_dir"):
        _monitor(np.zeros((1, 12)))
    monkeypatch.setattr(keras.backend, "backend", lambda: "jax")
    with pytest.raises(UsageError, match="^AttentionMonitor: Keras' jax backend is not supported"):
        _monitor(np.zeros((1, 12)), tmp_path)


def test_flash_attention_is_said_once_and_weights_come_from_q_and_k(model, tmp_path, monkeypatch):
    """A MultiHeadAttention whose flash attention is on returns no scores (TensorFlow has no such kernel: the layer's
    attention stands in for one here, and refuses scores as Keras does): the monitor says so once, and records the
    weights attnviz computes from the layer's q and k, which equal the scores the layer gives with flash attention
    off."""
    x, y = copying_data()
    layer = model.get_layer("attention_0")
    original = layer._compute_attention

    def fused(query, key, value, attention_mask=None, training=None, return_attention_scores=False,
              use_causal_mask=False):
        if return_attention_scores:  # Keras' own refusal
            raise ValueError("Returning attention scores is not supported when flash attention is enabled.")
        object.__setattr__(layer, "_flash_attention", False)  # TensorFlow's kernel: the explicit one
        try:
            return original(query, key, value, attention_mask, training, False, use_causal_mask)
        finally:
            object.__setattr__(layer, "_flash_attention", True)

    monkeypatch.setattr(layer, "_compute_attention", fused, raising=False)
    object.__setattr__(layer, "_flash_attention", True)
    monitor = _monitor(x[:2], tmp_path / "logs", keep=tmp_path / "kept", pictures=False)
    with pytest.warns(UserWarning) as said:
        model.fit(x[:32], y[:32], epochs=2, batch_size=16, verbose=0, callbacks=[monitor])
    lines = [str(w.message) for w in said if "AttentionMonitor" in str(w.message)]
    assert len(lines) == 1 and "attention_0: Keras' flash attention" in lines[0] and "q and k" in lines[0], lines
    assert monitor.recorded == [0, 1]
    object.__setattr__(layer, "_flash_attention", False)
    monkeypatch.undo()
    emb = keras.Model(model.inputs, layer._inbound_nodes[0].input_tensors[0])(x[:2])  # the layer's input
    _, scores = layer(emb, emb, use_causal_mask=True, return_attention_scores=True)
    import attnviz

    np.testing.assert_allclose(attnviz.inspect(str(tmp_path / "kept" / "epoch_000001.safetensors")).weights[0],
                               np.asarray(scores), atol=1e-6)


def test_memory_stays_flat_over_many_recordings(model, tmp_path, monkeypatch):
    """Python's allocations (NumPy's included) after 3 recordings and after 6 more are within 1 MB: a recording
    keeps nothing once it is written (and no capture file is left in the temporary folder: a folder of this test's
    own, as the system's is shared with the other test processes, whose recordings stage their files there too).
    The recordings are the callback's own (``record``, as its hooks call it), between the steps of a short
    training."""
    import gc
    import tempfile
    import tracemalloc

    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    x, y = copying_data(n=16)
    monitor = _monitor(x[:4], tmp_path / "logs", pictures=False)
    model.fit(x, y, epochs=1, batch_size=16, verbose=0, callbacks=[monitor])
    before = set(os.listdir(tempfile.gettempdir()))
    sizes = []
    tracemalloc.start()
    try:
        for step in range(1, 10):
            monitor.monitor.record(step)
            if step in (3, 9):
                gc.collect()
                sizes.append(tracemalloc.get_traced_memory()[0])
    finally:
        tracemalloc.stop()
    assert monitor.recorded == list(range(10)) and monitor.monitor.failed is None
    assert sizes[1] - sizes[0] < 2**20, sizes
    assert not [n for n in set(os.listdir(tempfile.gettempdir())) - before if n.startswith("attnviz-")]
    assert len(os.listdir(tmp_path / "logs")) == 10

"""A small Keras transformer learns to copy, and attnviz's AttentionMonitor watches an induction head form.

Each sequence holds a run of random tokens (4 to 10 of them), the same run again, then random tokens to the end;
the model predicts the next token at every position. Inside the repeated run the next token can only be found by
looking back: at the copy of token t, attend to the token after t's first occurrence. That is an induction head
(Olsson et al. 2022), which needs a previous-token head in the layer before it; the run's length varies, so no
fixed offset does it. The monitor records a fixed probe batch every epoch (TensorBoard's event files in
runs/attnviz, a capture file per epoch in runs/kept), and its tokens give the induction and duplicate-token scores.

    python examples/training_monitor.py [--epochs 20] [--out runs]
    tensorboard --logdir runs
    attnviz inspect runs/kept/epoch_000019.safetensors --no-table --sort induction
    attnviz compare runs/kept/epoch_000000.safetensors runs/kept/epoch_000019.safetensors
"""

from __future__ import annotations

import argparse
import os
import warnings

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

LENGTH, VOCAB = 24, 32


def copying(n: int, seed: int):
    """``n`` sequences of 25 tokens (a run, the run again, random tokens) as 24 inputs and the next token of each."""
    import numpy as np

    rng = np.random.default_rng(seed)
    seq = rng.integers(0, VOCAB, (n, LENGTH + 1))
    for row, run in zip(seq, rng.integers(4, 11, n)):
        row[run:2 * run] = row[:run]
    seq = seq.astype("int32")
    return seq[:, :-1], seq[:, 1:]


def model(width: int = 64, heads: int = 2, layers: int = 2):
    import keras

    ids = keras.Input((LENGTH,), dtype="int32")
    h = keras.layers.Embedding(VOCAB, width)(ids)
    h = h + keras.layers.Embedding(LENGTH, width)(keras.ops.arange(LENGTH)[None])
    for i in range(layers):  # attention only, as Olsson et al.'s two-layer models
        a = keras.layers.MultiHeadAttention(heads, width // heads, name=f"attention_{i}")(h, h, use_causal_mask=True)
        h = h + a
    out = keras.layers.Dense(VOCAB)(keras.layers.LayerNormalization()(h))
    m = keras.Model(ids, out)
    m.compile(optimizer=keras.optimizers.Adam(1e-2),
              loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    return m


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--out", default="runs")
    args = parser.parse_args()
    import keras

    from attnviz.keras import AttentionMonitor

    keras.utils.set_random_seed(0)
    x, y = copying(8192, seed=0)
    probe, _ = copying(8, seed=1)
    tokens = [[f"t{t}" for t in row] for row in probe]
    monitor = AttentionMonitor(probe, os.path.join(args.out, "attnviz"), tokens=tokens,
                               keep=os.path.join(args.out, "kept"))
    m = model()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        history = m.fit(x, y, epochs=args.epochs, batch_size=64, verbose=0, callbacks=[
            monitor, keras.callbacks.TensorBoard(os.path.join(args.out, "train"))])
    accuracy = " ".join(f"{a:.2f}" for a in history.history["accuracy"])
    print(f"accuracy by epoch (every position; only the repeated runs can be predicted): {accuracy}")
    print(f"recorded epochs {monitor.recorded[0]} to {monitor.recorded[-1]} into {args.out}/attnviz and "
          f"{args.out}/kept")
    watch(os.path.join(args.out, "attnviz"))


def watch(log_dir: str) -> None:
    """The induction and previous-token scores by epoch, as TensorBoard reads them from the monitor's event files:
    the head with the largest induction score at the end, the layer-0 head with the largest previous-token score,
    and how many heads are tagged induction."""
    import tensorflow as tf
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(log_dir, size_guidance={"tensors": 0})
    events.Reload()

    def series(tag: str) -> dict[int, float]:
        return {e.step: float(tf.make_ndarray(e.tensor_proto)) for e in events.Tensors(tag)}

    tags = events.Tags()["tensors"]
    induction = max((t for t in tags if t.startswith("attnviz/layer_") and t.split("/")[3:] == ["induction"]),
                    key=lambda t: list(series(t).values())[-1])
    previous = max((t for t in tags if t.startswith("attnviz/layer_0/") and t.split("/")[3:] == ["previous"]),
                   key=lambda t: list(series(t).values())[-1])
    rows = [("epoch", {e: f"{e:4d}" for e in series(induction)}),
            (induction, {e: f"{v:4.2f}" for e, v in series(induction).items()}),
            (previous, {e: f"{v:4.2f}" for e, v in series(previous).items()}),
            ("attnviz/tags/induction", {e: f"{int(v):4d}" for e, v in series("attnviz/tags/induction").items()})]
    width = max(len(name) for name, _ in rows)
    for name, values in rows:
        print(f"{name:{width}s} {' '.join(values[e] for e in sorted(values))}")


if __name__ == "__main__":
    main()

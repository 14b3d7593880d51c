"""The overhead of ``attnviz.keras.AttentionMonitor`` on a training, against the same training without it, in one run.

A 4-layer, 4-head Keras transformer of width 64 on sequences of 128 tokens (causal MultiHeadAttention, a next-token
head), 100 steps of batches of 16 per epoch; the monitor records a probe batch of 8 every epoch, with its statistics
and pictures (the grid and a picture per layer), and with pictures off. Each configuration trains its own model from
the same seed; a first epoch (TensorFlow's tracing) is left out; the configurations take turns, ``--rounds`` times,
and the fastest epoch time of each is compared; beside it, each recording's own time (the callback's work, which
a noisy machine's epoch times can hide) against the epoch without the monitor.

    python benchmarks/training_monitor.py [--rounds 3] [--epochs 2]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
import warnings

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

LAYERS, HEADS, WIDTH, LENGTH, VOCAB = 4, 4, 64, 128, 64
STEPS, BATCH, PROBE = 100, 16, 8


def build():
    import keras

    keras.utils.set_random_seed(0)
    ids = keras.Input((LENGTH,), dtype="int32")
    h = keras.layers.Embedding(VOCAB, WIDTH)(ids)
    h = h + keras.layers.Embedding(LENGTH, WIDTH)(keras.ops.arange(LENGTH)[None])
    for i in range(LAYERS):
        a = keras.layers.MultiHeadAttention(HEADS, WIDTH // HEADS, name=f"attention_{i}")(h, h, use_causal_mask=True)
        h = keras.layers.LayerNormalization()(h + a)
        f = keras.layers.Dense(WIDTH)(keras.layers.Dense(4 * WIDTH, activation="gelu")(h))
        h = keras.layers.LayerNormalization()(h + f)
    model = keras.Model(ids, keras.layers.Dense(VOCAB)(h))
    model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=2, help="timed epochs per round (after a first, untimed)")
    args = parser.parse_args()
    import numpy as np

    from attnviz.keras import AttentionMonitor

    rng = np.random.default_rng(0)
    x = rng.integers(0, VOCAB, (STEPS * BATCH, LENGTH)).astype("int32")
    y = np.roll(x, 1, axis=1)
    probe = x[:PROBE]
    folder = tempfile.mkdtemp(prefix="attnviz-bench-")
    configs = {"without the monitor": None, "monitor, pictures off": False, "monitor, statistics and pictures": True}
    models = {}
    for name in configs:  # each its own model, traced by a first epoch outside the timing
        models[name] = build()
        models[name].fit(x, y, epochs=1, batch_size=BATCH, verbose=0)
    epoch: dict[str, list[float]] = {name: [] for name in configs}
    record: dict[str, list[float]] = {name: [] for name in configs}
    steps: dict[str, list[float]] = {name: [] for name in configs}  # an epoch less its recordings
    for r in range(args.rounds):
        for name, pictures in configs.items():
            callbacks = []
            monitor = None
            if pictures is not None:
                monitor = AttentionMonitor(probe, os.path.join(folder, f"{r}-{pictures}"), pictures=pictures)
                timed = monitor.monitor.record

                def timing(step: int, timed=timed, name=name) -> None:
                    start = time.perf_counter()
                    timed(step)
                    record[name].append(time.perf_counter() - start)

                monitor.monitor.record = timing
                callbacks.append(monitor)
            start = time.perf_counter()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DeprecationWarning)
                models[name].fit(x, y, epochs=args.epochs, batch_size=BATCH, verbose=0, callbacks=callbacks)
            epoch[name].append((time.perf_counter() - start) / args.epochs)
            steps[name].append(epoch[name][-1] - sum(record[name][-args.epochs:]) / args.epochs
                               if record[name] else epoch[name][-1])
            if monitor is not None:
                assert monitor.monitor.failed is None, monitor.monitor.failed
                assert len(monitor.recorded) == args.epochs
    base = min(epoch["without the monitor"])
    print(f"{LAYERS} layers x {HEADS} heads, width {WIDTH}, {LENGTH} tokens, {STEPS} steps of {BATCH} per epoch, "
          f"a probe of {PROBE} recorded every epoch; fastest of {args.rounds} rounds x {args.epochs} epochs")
    for name in configs:
        best = min(epoch[name])
        one = (f", a recording {min(record[name]):.2f} s (median {np.median(record[name]):.2f} s, "
               f"{np.median(record[name]) / base:.1%} of an epoch without it)" if record[name] else "")
        print(f"  {name:34s} {best:6.2f} s an epoch, {best / base:5.3f}x{one}; the steps alone "
              f"{min(steps[name]):.2f} s")


if __name__ == "__main__":
    main()

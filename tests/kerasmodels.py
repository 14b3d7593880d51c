"""A tiny Keras transformer (token and position embeddings, causal MultiHeadAttention blocks, a next-token head) for
the tests of ``attnviz.keras.AttentionMonitor``: built from seeds, no download; ``SOURCE`` is the same builder as
text, for the tests that train in a fresh process."""

from __future__ import annotations

SOURCE = r'''
def tiny_transformer(vocab=16, length=12, width=16, heads=2, layers=2, seed=0, dropout=0.0, flash=None):
    import keras

    class Positions(keras.layers.Layer):  # a learned position embedding added in the call (every backend)
        def __init__(self, length, width, **kwargs):
            super().__init__(**kwargs)
            self.table = keras.layers.Embedding(length, width)

        def call(self, h):
            return h + self.table(keras.ops.arange(keras.ops.shape(h)[1]))[None]

    keras.utils.set_random_seed(seed)
    ids = keras.Input((length,), dtype="int32")
    h = Positions(length, width)(keras.layers.Embedding(vocab, width)(ids))
    for i in range(layers):
        a = keras.layers.MultiHeadAttention(heads, width // heads, dropout=dropout, name=f"attention_{i}",
                                            flash_attention=flash)(h, h, use_causal_mask=True)
        h = keras.layers.LayerNormalization()(h + a)
        h = h + keras.layers.Dense(width)(keras.layers.Dense(2 * width, activation="relu")(h))
    model = keras.Model(ids, keras.layers.Dense(vocab)(h))
    model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def copying_data(n=64, vocab=16, length=12, seed=0):
    import numpy as np

    x = np.random.default_rng(seed).integers(0, vocab, (n, length)).astype("int32")
    return x, np.roll(x, 1, axis=1)
'''

exec(SOURCE)

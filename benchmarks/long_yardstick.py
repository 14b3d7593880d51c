"""The yardstick `benchmarks/long.py` measures `attnviz scaled` against: the same maths as a short
TensorFlow script a user would write, softmax(Q K^T / sqrt(d)) and its output A V computed a block of
query rows at a time, each block's weights brought back with .numpy() and their entropy taken.

    python benchmarks/long_yardstick.py Q.npy K.npy V.npy [ROWS]
"""

import sys

import numpy as np
import tensorflow as tf

q, k, v = (np.load(path) for path in sys.argv[1:4])
rows = int(sys.argv[4]) if len(sys.argv) > 4 else 1024
kt, vt = tf.constant(k), tf.constant(v)
scale = 1 / np.sqrt(q.shape[-1])
entropy, output = [], []
for start in range(0, len(q), rows):
    w = tf.nn.softmax(tf.matmul(tf.constant(q[start:start + rows]) * scale, kt, transpose_b=True))
    output.append(tf.matmul(w, vt).numpy())
    w = w.numpy()
    entropy.append(-np.sum(w * np.log(np.maximum(w, 1e-30)), axis=-1))
entropy, output = np.concatenate(entropy), np.concatenate(output)
print(f"{len(entropy)} rows, entropy {entropy.min():.4f} .. {entropy.max():.4f} nats, output {output.shape}")

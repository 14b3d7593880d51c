"""Compute throughput of `scaled` against raw TensorFlow ops doing the same maths, and NumPy, in one
process (TensorFlow imported once, every case warmed up, the fastest of --repeat runs counts).

    python benchmarks/throughput.py [--repeat 3]

Three attnviz figures per shape: the variant's compute alone (softmax weights and output, as NumPy:
target within 1.2x of raw TensorFlow), and the whole run the command line does (the same plus the
per-query statistics, in blocks when the weights pass --max-memory).
"""

from __future__ import annotations

import argparse
import time

import numpy as np

SHAPES = [(1, 8, 2048, 64), (1, 1, 8192, 64)]


def best(fn, repeat: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()

    from attnviz.device import resolve_device, tensorflow
    from attnviz.io import Loaded
    from attnviz.masks import Mask
    from attnviz.pipeline import Prepared, RunOptions, execute
    from attnviz.variants import REGISTRY
    from attnviz.variants._base import Context

    tf = tensorflow()
    variant = REGISTRY["scaled"]
    ctx = Context(resolve_device("auto"), "float32")
    rng = np.random.default_rng(0)
    for shape in SHAPES:
        q, k, v = (rng.normal(size=shape).astype(np.float32) for _ in range(3))
        d = shape[-1]

        def raw() -> None:
            qt, kt, vt = tf.constant(q), tf.constant(k), tf.constant(v)
            w = tf.nn.softmax(tf.matmul(qt * (1 / np.sqrt(d)), kt, transpose_b=True), axis=-1)
            o = tf.matmul(w, vt)
            w.numpy(), o.numpy()

        def numpy() -> None:
            s = (q / np.sqrt(d)) @ np.swapaxes(k, -1, -2)
            e = np.exp(s - s.max(axis=-1, keepdims=True))
            w = e / e.sum(axis=-1, keepdims=True)
            w @ v

        arrays = {"q": q, "k": k, "v": v}
        params = variant.params()

        def compute() -> None:
            variant.compute(ctx, arrays, Mask(), params, {})

        inputs = {n: Loaded(a, n, None) for n, a in arrays.items()}
        problem = variant.check(inputs, params, None)
        prep = Prepared(variant, params, RunOptions(), inputs, problem.weights_shape, Mask(), None, None, [])

        def whole() -> None:
            execute(prep)

        t_raw, t_np, t_compute, t_whole = (best(f, args.repeat) for f in (raw, numpy, compute, whole))
        print(f"scaled {list(shape)}: raw TensorFlow {t_raw:.3f} s | attnviz compute {t_compute:.3f} s "
              f"= {t_compute / t_raw:.2f}x (target <= 1.2x) | whole run with statistics {t_whole:.3f} s "
              f"= {t_whole / t_raw:.2f}x | NumPy {t_np:.3f} s = {t_np / t_raw:.2f}x", flush=True)


if __name__ == "__main__":
    main()

"""Compute throughput of `scaled` against raw TensorFlow ops doing the same maths, and NumPy, in one
process (TensorFlow imported once, every case warmed up, the cases taken in turn --repeat times and
the fastest time of each counted, so that a busy moment of a shared machine hits them alike).

    python benchmarks/throughput.py [--repeat 5]

Per shape:

* raw TensorFlow: `tf.nn.softmax(q @ k^T / sqrt(d))` and `@ v`, both brought back with `.numpy()`;
* attnviz compute: the variant's `compute` alone (weights and output as NumPy): target <= 1.2x raw;
* whole run: `pipeline.execute`, everything the command line does once the inputs are loaded: the
  compute (in blocks of query rows when the weights pass --max-memory, as both shapes here do), the
  weights back from TensorFlow, the per-query statistics (entropy, max/argmax, top-3, support, row
  sums), the finiteness checks, the table previews and the block-aggregated heatmap grids: target
  <= 1.5x raw;
* the statistics alone, the fused pass (`stats.fused_row_stats`) against the float64 reference
  (`stats.row_stats`), on the weights of the whole map.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

SHAPES = [(1, 8, 2048, 64), (1, 1, 8192, 64)]


def fastest(cases: dict, repeat: int) -> dict[str, float]:
    """Each case warmed up, then all taken in turn ``repeat`` times; the fastest time of each."""
    for fn in cases.values():
        fn()
    times: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(repeat):
        for name, fn in cases.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    return {name: min(t) for name, t in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()

    from attnviz.device import resolve_device, tensorflow
    from attnviz.io import Loaded
    from attnviz.masks import Mask
    from attnviz.pipeline import Prepared, RunOptions, execute
    from attnviz.stats import fused_row_stats, row_stats, workers
    from attnviz.variants import REGISTRY
    from attnviz.variants.base import Context

    tf = tensorflow()
    variant = REGISTRY["scaled"]
    ctx = Context(resolve_device("auto"), "float32")
    rng = np.random.default_rng(0)
    print(f"{ctx.device.name}, {workers()} cores; fastest of {args.repeat} rounds", flush=True)
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

        outcomes = []

        def whole() -> None:
            prep = Prepared(variant, params, RunOptions(), inputs, problem.weights_shape, Mask(), None, None, [])
            outcomes[:] = [execute(prep)]

        t = fastest({"raw": raw, "compute": compute, "whole": whole, "numpy": numpy}, args.repeat)
        blocks = outcomes[0].streamed
        how = f"{blocks.blocks} blocks of {blocks.rows_per_block} rows" if blocks is not None else "dense"
        print(f"scaled {list(shape)}: raw TensorFlow {t['raw']:.3f} s | attnviz compute {t['compute']:.3f} s "
              f"= {t['compute'] / t['raw']:.2f}x (target <= 1.2x) | whole run with statistics ({how}) "
              f"{t['whole']:.3f} s = {t['whole'] / t['raw']:.2f}x (target <= 1.5x) | NumPy {t['numpy']:.3f} s "
              f"= {t['numpy'] / t['raw']:.2f}x", flush=True)

        weights = variant.compute(ctx, arrays, Mask(), params, {}).weights
        s = fastest({"fused": lambda: fused_row_stats(weights), "reference": lambda: row_stats(weights)},
                    max(1, args.repeat // 2))
        print(f"  statistics of the {weights.size:,} weights alone: fused pass {s['fused']:.3f} s, "
              f"float64 reference {s['reference']:.3f} s ({s['reference'] / s['fused']:.1f}x)", flush=True)


if __name__ == "__main__":
    main()

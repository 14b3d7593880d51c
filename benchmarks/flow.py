"""Attention flow (``attnviz rollout --method flow``) on 12 layers x 12 heads x 48 tokens, every row,
beside the reference's way of computing it, measured in the same run:

* attnviz: ``attnviz.inspection.flow.attention_flow`` (heads averaged, the residual added, one maximum
  flow per pair of tokens by SciPy's Dinic on integer capacities, only the nodes on some path), all
  48 x 48 pairs, on dense maps (an encoder's) and on causal ones (a decoder's), fastest and median of
  ``--repeat``;
* the baseline: samiraabnar/attention_flow's computation without networkx (whose ``from_numpy_matrix``
  is gone from networkx 3): its graph of 13 x 48 nodes, an edge for every non-zero capacity, and one
  Edmonds-Karp per pair written in plain Python as networkx's is (residual capacities in dicts,
  breadth-first search for the shortest augmenting path, floating point), on the first
  ``--baseline-rows`` rows (48 pairs each), extrapolated to all 48 rows. Its flows are checked
  against attnviz's (1e-6).

    python benchmarks/flow.py [--repeat N] [--baseline-rows R] [--tokens N] [--layers N]

Target (issue 35): every row in seconds, not the reference's minutes.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections import deque

import numpy as np


def attentions(rng: np.random.Generator, layers: int, heads: int, n: int, causal: bool) -> np.ndarray:
    """Softmax rows of random scores, ``[layers, heads, n, n]``."""
    scores = rng.normal(size=(layers, heads, n, n)) * 2
    if causal:
        scores = np.where(np.tril(np.ones((n, n), bool)), scores, -np.inf)
    e = np.exp(scores - scores.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def reference_graph(maps: np.ndarray) -> dict[int, dict[int, float]]:
    """``get_adjmat``'s graph as adjacency dicts: node ``l n + k`` above layer ``l``, an edge to each node
    below with a non-zero capacity ``maps[l - 1][k, k']``."""
    layers, n, _ = maps.shape
    graph: dict[int, dict[int, float]] = {u: {} for u in range((layers + 1) * n)}
    for layer in range(1, layers + 1):
        for k_f in range(n):
            row = graph[layer * n + k_f]
            for k_t in np.flatnonzero(maps[layer - 1][k_f]):
                row[(layer - 1) * n + int(k_t)] = float(maps[layer - 1][k_f, k_t])
    return graph


def edmonds_karp(graph: dict[int, dict[int, float]], source: int, sink: int) -> float:
    """The maximum flow from ``source`` to ``sink``: residual capacities in dicts (reverse edges at 0),
    shortest augmenting paths by breadth-first search, as networkx's ``edmonds_karp`` finds them."""
    residual: dict[int, dict[int, float]] = {u: dict(edges) for u, edges in graph.items()}
    for u, edges in graph.items():
        for v in edges:
            residual[v].setdefault(u, 0.0)
    total = 0.0
    while True:
        parent = {source: source}
        queue = deque([source])
        while queue and sink not in parent:
            u = queue.popleft()
            for v, c in residual[u].items():
                if c > 1e-15 and v not in parent:
                    parent[v] = u
                    queue.append(v)
        if sink not in parent:
            return total
        push, v = float("inf"), sink
        while v != source:
            u = parent[v]
            push = min(push, residual[u][v])
            v = u
        v = sink
        while v != source:
            u = parent[v]
            residual[u][v] -= push
            residual[v][u] += push
            v = u
        total += push


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--baseline-rows", type=int, default=1,
                        help="rows (48 pairs each) the baseline solves (0: none)")
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--heads", type=int, default=12)
    args = parser.parse_args()

    import scipy

    from attnviz.inspection.flow import attention_flow, max_flows
    from attnviz.inspection.mixing import mixing_maps

    n, layers = args.tokens, args.layers
    print(f"attention flow, {layers} layers x {args.heads} heads x {n} tokens: every row ({n * n} max-flow "
          f"problems); NumPy {np.__version__}, SciPy {scipy.__version__}")
    rng = np.random.default_rng(0)
    ours: dict[str, float] = {}
    for kind in ("dense", "causal"):
        w = attentions(rng, layers, args.heads, n, causal=kind == "causal")
        times = []
        for _ in range(args.repeat):
            start = time.perf_counter()
            result = attention_flow(w)
            times.append(time.perf_counter() - start)
        assert np.allclose(result.result.sum(axis=1), 1.0)
        ours[kind] = min(times)
        print(f"  attnviz, {kind:6}: fastest {min(times):.2f} s, median {statistics.median(times):.2f} s "
              f"({min(times) / (n * n) * 1e3:.2f} ms a pair)")
        if kind != "dense" or args.baseline_rows <= 0:
            continue
        maps = np.stack(list(mixing_maps(w)))
        flows = max_flows(maps)
        graph = reference_graph(maps)
        rows = range(min(args.baseline_rows, n))
        start = time.perf_counter()
        baseline = np.array([[edmonds_karp(graph, layers * n + i, j) for j in range(n)] for i in rows])
        spent = time.perf_counter() - start
        error = float(np.abs(baseline - flows[:len(rows)]).max())
        assert error < 1e-6, error
        whole = spent / len(rows) * n
        print(f"  baseline (plain Edmonds-Karp per pair, the reference's graph), dense: {spent:.1f} s for "
              f"{len(rows)} row(s), {spent / len(rows):.1f} s a row, {whole:.0f} s extrapolated to {n} rows; "
              f"its flows and attnviz's differ by at most {error:.1e}")
        print(f"  ratio: attnviz {whole / ours['dense']:.0f}x faster than the baseline on every row (dense)")


if __name__ == "__main__":
    main()

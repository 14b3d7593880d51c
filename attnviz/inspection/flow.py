"""Attention flow (Abnar & Zuidema 2020, "Quantifying Attention Flow in Transformers", section 4), as
samiraabnar/attention_flow computes it.

Each layer's mixing map ``A'_l`` is made as rollout makes it (``attnviz.inspection.mixing``: heads
combined, ``A' = (1 - r) A + r I``, rows renormalised). The maps are a layered graph: one node per
token and layer boundary (the inputs at the bottom, each layer's outputs above them), and an edge
from node ``i`` above layer ``l`` to node ``j`` below it with capacity ``A'_l[i, j]``. The flow from
a last-layer position ``i`` to an input token ``j`` is the maximum flow from the one node to the
other (one max-flow problem per pair: the pairs' flows overlap), and each row is renormalised to sum
to 1. Where rollout multiplies the maps (every path's product, summed), flow is bounded by the
narrowest cut between the two tokens. Two layers have a closed form, ``flow(i, j) = sum_k min(A2[i,
k], A1[k, j])`` (each middle node carries one path); one layer is the map itself.

The cost is ``L^2`` max-flow problems on a graph of ``(layers - 1) L`` nodes and up to ``(layers -
2) L^2`` edges. Each is solved by SciPy's Dinic (``scipy.sparse.csgraph.maximum_flow``) on integer
capacities, the weights scaled by ``2^30`` (each capacity within ``2^-31`` of its value; a flow,
the sum of a cut's capacities, within that times the cut's edges). Only the nodes on some path from
the one token to the other take part (a causal model's flow from ``i`` to ``j`` uses the tokens
``j..i`` alone). The reference solves each pair with networkx's Edmonds-Karp in floating point:
12.6 s a row at 12 layers and 48 tokens; this takes about 2.3 s for all 48 rows (benchmarks/flow.py).
NumPy, and SciPy when a flow is solved.
"""

from __future__ import annotations

import numpy as np

from attnviz.inspection.mixing import Rollout, mixing_maps, real_indices, scatter

#: capacities are ``round(A' * SCALE)`` (divided by the largest entry first when it exceeds 1): the
#: solver's integers are 32-bit, and a source's edges sum to about ``SCALE``
SCALE = 2 ** 30


def max_flows(maps: np.ndarray) -> np.ndarray:
    """The maximum flow from each top node to each input token: ``maps [m, n, n]`` are the layers'
    mixing maps, the first layer first (non-negative; ``maps[l][i, j]`` the capacity from node ``i``
    above layer ``l`` to node ``j`` below it). Returns ``[n, n]``, not normalised: ``out[i, j]`` is the
    maximum flow from node ``i`` above the last layer to input token ``j``."""
    maps = np.asarray(maps, dtype=np.float64)
    if maps.ndim != 3 or maps.shape[1] != maps.shape[2]:
        raise ValueError(f"flow needs square maps [layers, n, n], not {list(maps.shape)}")
    if not np.isfinite(maps).all() or (maps < 0).any():
        raise ValueError("flow needs finite, non-negative capacities")
    m, n, _ = maps.shape
    if m == 1 or n == 0:
        return maps[0].copy() if m else np.zeros((n, n))
    scale = SCALE / max(1.0, float(maps.max()))
    graph = LayeredGraph(np.rint(maps * scale).astype(np.int64))
    out = np.zeros((n, n))
    for i in range(n):
        for j in range(n):
            out[i, j] = graph.flow(i, j)
    return out / scale


def normalised_rows(flows: np.ndarray) -> np.ndarray:
    """Each row divided by its sum (a row of zeros stays zeros)."""
    sums = flows.sum(axis=-1, keepdims=True)
    return np.divide(flows, sums, out=np.zeros_like(flows), where=sums != 0)


class LayeredGraph:
    """The graph of integer capacities ``caps [m, n, n]`` (``m >= 2``), built once; ``flow(i, j)`` solves
    one pair. Between the top node (the source) and the input token (the sink) lie ``m - 1`` layers of
    ``n`` nodes, numbered from the top: node ``a`` of the ``k``-th is ``k n + a``. A pair's graph keeps
    the nodes that lie on a path from its source to its sink (``reach``, ``back``), in compressed
    sparse rows: the source, those nodes in order, the sink."""

    def __init__(self, caps: np.ndarray) -> None:
        m, n, _ = caps.shape
        self.caps, self.m, self.n = caps, m, n
        positive = caps > 0
        mixing = positive.astype(np.float32)
        src, dst, cap = [], [], []
        for k in range(m - 2):  # from the k-th middle layer to the next, through map m - 2 - k
            a, b = np.nonzero(positive[m - 2 - k])
            src.append(k * n + a)
            dst.append((k + 1) * n + b)
            cap.append(caps[m - 2 - k][a, b])
        empty = np.zeros(0, np.int64)
        self.src = np.concatenate(src) if src else empty
        self.dst = np.concatenate(dst) if dst else empty
        self.cap = np.concatenate(cap) if cap else empty
        # reach[i, k, a]: node a of middle layer k is reached from top node i; back[j, k, a]: it reaches input j
        self.reach = np.zeros((n, m - 1, n), bool)
        self.reach[:, 0] = positive[m - 1]
        for k in range(1, m - 1):
            self.reach[:, k] = self.reach[:, k - 1].astype(np.float32) @ mixing[m - 1 - k] > 0
        self.back = np.zeros((n, m - 1, n), bool)
        self.back[:, m - 2] = positive[0].T
        for k in range(m - 3, -1, -1):
            self.back[:, k] = self.back[:, k + 1].astype(np.float32) @ mixing[m - 2 - k].T > 0

    def flow(self, i: int, j: int) -> int:
        """The maximum flow from top node ``i`` to input token ``j``, in the capacities' integers."""
        from scipy.sparse import csr_array
        from scipy.sparse.csgraph import maximum_flow

        m = self.m
        keep = self.reach[i] & self.back[j]  # [m - 1, n]
        top, bottom = np.flatnonzero(keep[0]), np.flatnonzero(keep[m - 2])
        if not len(top):
            return 0
        flat = keep.reshape(-1)
        count = int(flat.sum())
        if count == flat.size:
            src, dst, cap = self.src, self.dst, self.cap
        else:
            number = np.cumsum(flat) - 1
            edges = flat[self.src] & flat[self.dst]
            src, dst, cap = number[self.src[edges]], number[self.dst[edges]], self.cap[edges]
        degree = np.bincount(src, minlength=count)
        degree[count - len(bottom):] += 1  # the last layer's nodes: one edge each, to the sink
        sink = count + 1
        data = np.concatenate([self.caps[m - 1][i, top], cap, self.caps[0][bottom, j]]).astype(np.int32)
        indices = np.concatenate([np.arange(1, len(top) + 1), dst + 1, np.full(len(bottom), sink)]).astype(np.int32)
        indptr = np.zeros(count + 3, np.int32)
        indptr[1] = len(top)
        np.cumsum(degree, out=indptr[2:-1])
        indptr[2:-1] += len(top)
        indptr[-1] = indptr[-2]
        graph = csr_array((data, indices, indptr), shape=(count + 2, count + 2))
        return int(maximum_flow(graph, 0, sink).flow_value)


def attention_flow(w: np.ndarray, *, heads: str = "mean", residual: float = 0.5, start_layer: int = 0,
                   real: np.ndarray | None = None, all_layers: bool = False, discard_ratio: float = 0.0,
                   weighed: bool = False) -> Rollout:
    """Attention flow of ``w [layers, heads, L, L]`` (one batch entry; see the module's docstring), each
    row renormalised to sum to 1. The layers' maps are made as rollout makes them (``heads``,
    ``residual``, ``discard_ratio``, from ``start_layer``). ``real [L]`` marks the real tokens: the graph
    holds them alone, and padded rows and columns of the result are NaN. ``all_layers``: also the flow
    from the nodes above each layer (``cumulative``; the reference computes these too). ``weighed``: value-norm
    maps, whose heads are combined as they are (``mixing.mixing_maps``)."""
    maps = np.stack(list(mixing_maps(w, heads=heads, residual=residual, start_layer=start_layer, real=real,
                                     discard_ratio=discard_ratio, weighed=weighed)))
    size = w.shape[-1]
    keep = real_indices(real, size)
    layers = list(range(start_layer, w.shape[0]))
    if not all_layers:
        return Rollout(scatter(normalised_rows(max_flows(maps)), keep, size), layers, None)
    cumulative = np.stack([scatter(normalised_rows(max_flows(maps[:k + 1])), keep, size) for k in range(len(maps))])
    return Rollout(cumulative[-1].copy(), layers, cumulative)

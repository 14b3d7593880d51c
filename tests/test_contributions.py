"""The methods of ``attnviz rollout`` beside rollout, as functions of arrays (issue 35):

* attention flow (``attnviz.inspection.flow``) against the reference's computation written out here: the
  graph of samiraabnar/attention_flow's ``get_adjmat`` (``(layers + 1) n`` nodes, an edge from node ``k``
  above layer ``l`` to node ``k'`` below it holding ``A'_l[k, k']``), one maximum flow per pair solved by a
  plain Edmonds-Karp in floating point (the reference calls networkx's ``edmonds_karp``), each row
  divided by its sum as ``compute_flows`` does; the two-layer closed form ``sum_k min(A2[i, k], A1[k, j])``;
  one layer = the residual-mixed weights; padding, start layer, cumulative maps, causal maps;
* gradient rollout (``attnviz.inspection.gradients``) against a transcription of
  Transformer-MM-Explainability's ``avg_heads`` / ``apply_self_attention_rules`` / ``generate_relevance``
  (which assume one batch entry), run on each batch entry alone;
* the registry of methods and the options' choices are the same.
"""

from __future__ import annotations

from collections import deque

import numpy as np
import pytest

from attnviz.choices import ROLLOUT_METHODS
from attnviz.inspection.flow import attention_flow, max_flows, normalised_rows
from attnviz.inspection.gradients import gradient_entry, gradient_rollout
from attnviz.inspection.mixing import with_residual
from attnviz.inspection.rollout import METHODS

# ---------------------------------------------------------------------------------------------------
# oracles


def edmonds_karp(capacity: np.ndarray, source: int, sink: int) -> float:
    """The maximum flow from ``source`` to ``sink`` over the dense capacities ``capacity [N, N]``: shortest
    augmenting paths found by breadth-first search, in floating point (Edmonds and Karp 1972)."""
    residual = np.array(capacity, dtype=np.float64)
    total = 0.0
    while True:
        parent = np.full(len(residual), -1)
        parent[source] = source
        queue = deque([source])
        while queue and parent[sink] < 0:
            u = queue.popleft()
            for v in np.flatnonzero(residual[u] > 1e-15):
                if parent[v] < 0:
                    parent[v] = u
                    queue.append(v)
        if parent[sink] < 0:
            return total
        path, v = [], sink
        while v != source:
            path.append((parent[v], v))
            v = parent[v]
        push = min(residual[u, v] for u, v in path)
        for u, v in path:
            residual[u, v] -= push
            residual[v, u] += push
        total += push


def reference_flows(maps: np.ndarray) -> np.ndarray:
    """attention_flow's graph (``get_adjmat``) and its last layer's flows (``compute_flows``), not
    normalised: ``maps [layers, n, n]`` are the mixed maps, the first layer first."""
    layers, n, _ = maps.shape
    adjacency = np.zeros(((layers + 1) * n, (layers + 1) * n))
    for i in range(1, layers + 1):
        for k_f in range(n):
            for k_t in range(n):
                adjacency[i * n + k_f, (i - 1) * n + k_t] = maps[i - 1][k_f][k_t]
    return np.array([[edmonds_karp(adjacency, layers * n + u, v) for v in range(n)] for u in range(n)])


def mixed(w: np.ndarray, r: float = 0.5) -> np.ndarray:
    """The notebook's maps: heads averaged, ``A + I`` (r = 0.5) rows renormalised (general r here)."""
    return np.stack([with_residual(layer.mean(axis=0), r) for layer in w])


def attentions(rng: np.random.Generator, shape: tuple[int, ...], causal: bool = False, sparse: float = 0.0
               ) -> np.ndarray:
    """Softmax rows of random scores; ``sparse`` zeroes that share of the entries first (not the diagonal)."""
    e = np.exp(rng.normal(size=shape) * 2)
    n = shape[-1]
    keep = np.ones(shape, bool)
    if causal:
        keep &= np.tril(np.ones((n, n), bool))
    if sparse:
        keep &= (rng.random(shape) >= sparse) | np.eye(n, dtype=bool)
    e = np.where(keep, e, 0.0)
    return e / e.sum(axis=-1, keepdims=True)


def chefer_reference(cams: list[np.ndarray], grads: list[np.ndarray]) -> np.ndarray:
    """Transformer-MM-Explainability's ``generate_relevance`` (ViT notebook), in NumPy: each block's
    ``attn`` [batch, heads, n, n] and its gradient; batch and heads reshaped together, so it assumes
    batch 1."""
    num_tokens = cams[0].shape[-1]
    relevance = np.eye(num_tokens, num_tokens)
    for cam, grad in zip(cams, grads):
        # avg_heads
        cam = cam.reshape(-1, cam.shape[-2], cam.shape[-1])
        grad = grad.reshape(-1, grad.shape[-2], grad.shape[-1])
        cam = grad * cam
        cam = np.clip(cam, 0, None).mean(axis=0)
        # apply_self_attention_rules
        relevance += cam @ relevance
    return relevance


# ---------------------------------------------------------------------------------------------------
# attention flow


@pytest.mark.parametrize("layers, n, sparse", [(1, 4, 0.0), (2, 1, 0.0), (2, 5, 0.5), (3, 4, 0.0), (3, 5, 0.6),
                                               (4, 5, 0.3), (5, 3, 0.7)])
def test_max_flows_equal_edmonds_karp_on_the_reference_graph(layers, n, sparse):
    rng = np.random.default_rng(layers * 10 + n)
    maps = mixed(attentions(rng, (layers, 2, n, n), sparse=sparse))
    want = reference_flows(maps)
    np.testing.assert_allclose(max_flows(maps), want, atol=1e-6, rtol=0)
    np.testing.assert_allclose(normalised_rows(max_flows(maps)), want / want.sum(axis=1, keepdims=True), atol=1e-6)


def test_without_the_residual_some_pairs_have_no_path():
    """r = 0 and sparse maps: pairs with no path carry 0, and rows with no flow at all stay 0."""
    rng = np.random.default_rng(3)
    maps = mixed(attentions(rng, (3, 1, 5, 5), sparse=0.75), r=0.0)
    maps[1][:, 2] = 0.0  # nothing flows through node 2 above the first layer
    want = reference_flows(maps)
    got = max_flows(maps)
    assert (want == 0).any()
    np.testing.assert_allclose(got, want, atol=1e-6, rtol=0)


def test_two_layers_have_the_closed_form():
    """Each middle node carries one path: flow(i, j) = sum_k min(A2[i, k], A1[k, j]) (through the solver)."""
    rng = np.random.default_rng(7)
    for n in (3, 8, 16):
        a1, a2 = mixed(attentions(rng, (2, 3, n, n), sparse=0.3))
        closed = np.minimum(a2[:, :, None], a1[None, :, :]).sum(axis=1)
        np.testing.assert_allclose(max_flows(np.stack([a1, a2])), closed, atol=1e-7, rtol=0)


def test_one_layer_is_the_mixed_weights():
    w = attentions(np.random.default_rng(1), (1, 4, 6, 6))
    got = attention_flow(w, residual=0.3)
    np.testing.assert_allclose(got.result, with_residual(w[0].mean(axis=0), 0.3), atol=1e-12)
    assert got.layers == [0]


def test_causal_flow_never_reaches_a_later_token():
    w = attentions(np.random.default_rng(2), (4, 2, 7, 7), causal=True)
    got = attention_flow(w).result
    assert (got[np.triu_indices(7, 1)] == 0).all()
    np.testing.assert_allclose(got.sum(axis=1), 1.0, atol=1e-12)
    np.testing.assert_allclose(got, normalised_rows(reference_flows(mixed(w))), atol=1e-6)


def test_options_shape_the_maps_as_rollout_does():
    """--heads, --residual, --start-layer, --discard-ratio: the graph holds the maps rollout would multiply."""
    rng = np.random.default_rng(4)
    w = attentions(rng, (4, 3, 5, 5))
    got = attention_flow(w, heads="max", residual=0.25, start_layer=1).result
    maps = np.stack([with_residual(layer.max(axis=0), 0.25) for layer in w[1:]])
    np.testing.assert_allclose(got, normalised_rows(reference_flows(maps)), atol=1e-6)
    assert attention_flow(w, start_layer=1).layers == [1, 2, 3]


def test_all_layers_gives_the_flow_above_each_layer():
    w = attentions(np.random.default_rng(5), (3, 2, 4, 4))
    got = attention_flow(w, all_layers=True)
    assert got.cumulative is not None and got.cumulative.shape == (3, 4, 4)
    for k in range(3):
        np.testing.assert_allclose(got.cumulative[k], attention_flow(w[:k + 1]).result, atol=1e-12)
    np.testing.assert_array_equal(got.result, got.cumulative[-1])


def test_padded_tokens_take_no_part():
    rng = np.random.default_rng(6)
    w = attentions(rng, (3, 2, 6, 6))
    real = np.array([False, True, True, False, True, True])
    got = attention_flow(w, real=real).result
    assert np.isnan(got[~real]).all() and np.isnan(got[:, ~real]).all()
    sub = w[:, :, real][:, :, :, real]
    sub = sub / sub.sum(axis=-1, keepdims=True)  # each head's rows among the real tokens, as rollout
    np.testing.assert_allclose(got[np.ix_(real, real)], normalised_rows(reference_flows(mixed(sub))), atol=1e-6)


def test_permuting_the_tokens_permutes_the_flow():
    rng = np.random.default_rng(8)
    w = attentions(rng, (4, 2, 9, 9), sparse=0.4)
    order = rng.permutation(9)
    moved = w[:, :, order][:, :, :, order]
    np.testing.assert_allclose(attention_flow(moved).result, attention_flow(w).result[np.ix_(order, order)],
                               atol=1e-8)


def test_capacities_above_one_and_bad_maps():
    maps = 3.0 * mixed(attentions(np.random.default_rng(9), (3, 1, 4, 4)))
    np.testing.assert_allclose(max_flows(maps), reference_flows(maps), atol=1e-6)
    with pytest.raises(ValueError, match="non-negative"):
        max_flows(-maps)
    with pytest.raises(ValueError, match="square"):
        max_flows(maps[:, :3])


# ---------------------------------------------------------------------------------------------------
# gradient rollout (Chefer, Gur and Wolf 2021)


def test_gradient_rollout_is_the_reference_on_each_batch_entry():
    rng = np.random.default_rng(10)
    w = attentions(rng, (4, 3, 2, 5, 5))  # [layers, batch, heads, L, L]
    g = rng.normal(size=w.shape)
    got = gradient_rollout(w, g)
    assert got.shape == (3, 5, 5)
    for b in range(3):
        want = chefer_reference([w[li, b:b + 1] for li in range(4)], [g[li, b:b + 1] for li in range(4)])
        np.testing.assert_allclose(got[b], want, atol=1e-12)
    # the reference's own reshape would average the heads of every entry together: not what any entry has
    mixed_batch = chefer_reference([w[li] for li in range(4)], [g[li] for li in range(4)])
    assert not np.allclose(mixed_batch, got[0])


def test_gradient_rollout_start_layer_heads_cumulative_and_padding():
    rng = np.random.default_rng(11)
    w = attentions(rng, (3, 1, 4, 6, 6))
    g = rng.normal(size=w.shape)
    one = gradient_entry(w[:, 0], grads=g[:, 0], start_layer=1, all_layers=True)
    assert one.layers == [1, 2] and one.cumulative is not None
    np.testing.assert_allclose(one.result, chefer_reference(list(w[1:]), list(g[1:])), atol=1e-12)
    np.testing.assert_allclose(one.cumulative[0], chefer_reference(list(w[1:2]), list(g[1:2])), atol=1e-12)
    top = gradient_entry(w[:, 0], grads=g[:, 0], heads="max").result
    cam_max = [np.clip(g[li, 0] * w[li, 0], 0, None).max(axis=0) for li in range(3)]
    want = np.eye(6)
    for cam in cam_max:
        want = want + cam @ want
    np.testing.assert_allclose(top, want, atol=1e-12)
    real = np.array([True, True, False, True, True, False])
    padded = gradient_rollout(w, g, real=real[None])[0]
    assert np.isnan(padded[~real]).all() and np.isnan(padded[:, ~real]).all()
    keep = np.ix_(real, real)
    want = chefer_reference([layer[:, :, real][:, :, :, real] for layer in w],
                            [layer[:, :, real][:, :, :, real] for layer in g])  # not renormalised: the model's own
    np.testing.assert_allclose(padded[keep], want, atol=1e-12)
    with pytest.raises(ValueError, match="shape"):
        gradient_rollout(w, g[:2])


# ---------------------------------------------------------------------------------------------------
# the registry


def test_every_method_is_a_choice_and_has_a_docstring():
    assert tuple(METHODS) == ROLLOUT_METHODS
    for method in METHODS.values():
        assert method.compute.__doc__ and method.title and method.label
        assert set(method.options) <= {"heads", "residual", "discard_ratio"}
    assert [name for name, m in METHODS.items() if m.gradients] == ["grad"]

"""Per-query statistics against values worked out by hand."""

from __future__ import annotations

import numpy as np

from attnviz.stats import row_stats


def test_uniform_one_hot_and_half_rows():
    w = np.array([[0.25, 0.25, 0.25, 0.25], [0, 1, 0, 0], [0.5, 0.5, 0, 0]])
    s = row_stats(w)
    np.testing.assert_allclose(s.entropy, [np.log(4), 0, np.log(2)])
    np.testing.assert_allclose(s.entropy_norm, [1, 0, 0.5])
    np.testing.assert_allclose(s.max, [0.25, 1, 0.5])
    assert s.argmax.tolist() == [0, 1, 0]  # ties go to the lower index
    assert s.top_index.tolist() == [[0, 1, 2], [1, 0, 2], [0, 1, 2]]
    np.testing.assert_allclose(s.row_sum, [1, 1, 1])


def test_normalised_by_unmasked_keys_and_masked_rows_undefined():
    w = np.array([[0.5, 0.5, 0, 0], [0, 0, 0, 0], [1, 0, 0, 0]])
    keep = np.array([[1, 1, 0, 0], [0, 0, 0, 0], [1, 0, 0, 0]], bool)
    s = row_stats(w, keep)
    assert s.n_keys.tolist() == [2, 0, 1]
    assert s.masked.tolist() == [False, True, False]
    np.testing.assert_allclose(s.entropy_norm[[0, 2]], [1.0, 0.0])  # log 2 / log 2; one key: 0
    assert np.isnan(s.entropy[1]) and np.isnan(s.max[1]) and s.argmax[1] == -1
    assert s.row_sum[1] == 0


def test_top_k_is_capped_by_key_count_and_select_slices():
    w = np.random.default_rng(0).dirichlet(np.ones(2), size=(3, 4))
    s = row_stats(w, k=3)
    assert s.top_index.shape == (3, 4, 2)
    one = s.select((1,))
    assert one.entropy.shape == (4,)
    np.testing.assert_allclose(one.max, w[1].max(-1))


def test_fast_top_k_equals_a_stable_sort_with_ties():
    from attnviz.stats import top_k_indices

    rng = np.random.default_rng(1)
    for shape in [(40, 100), (3, 7, 257)]:
        for _ in range(10):
            w = rng.integers(0, 4, size=shape).astype(float)  # many ties
            for k in (1, 3, 5):
                expected = np.argsort(-w, axis=-1, kind="stable")[..., :k]
                np.testing.assert_array_equal(top_k_indices(w, k), expected)

"""The fused statistics pass (``stats.fused_row_stats``) against the float64 NumPy reference
(``stats.row_stats``, the oracle), over named cases.

Documented tolerances (``stats.FUSED_RTOL``): ``max``, ``argmax``, ``top_index``, ``top_weight``,
``support``, ``n_keys`` and ``masked`` are equal exactly (comparisons and copies of the same values);
``entropy``, ``entropy_norm`` and ``row_sum`` agree within a relative 1e-6 for float32, float16 and
bfloat16 weights (float32 logarithms and float32 partial sums of at most 64 values, added in
float64), and within 1e-12 for float64 weights. Every term ``-w log w`` of a distribution's entropy
has the same sign, so the relative tolerance holds for near-one-hot rows too, whose entropy is
tiny; a one-hot row's entropy is exactly 0 in both. The heatmap grids gathered during the pass
(``blockwise.BlockGrids``) equal ``attnviz.blocks.reduce_blocks``: maxima exactly, means within
a relative 2e-6.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from attnviz import stats
from attnviz.blocks import reduce_blocks
from attnviz.blockwise import BlockGrids
from attnviz.stats import FUSED_RTOL, RowStats, fused_row_stats, row_stats

EXACT = ("max", "argmax", "top_index", "top_weight", "support", "n_keys", "masked")
CLOSE = ("entropy", "entropy_norm", "row_sum")


def softmax(scores: np.ndarray) -> np.ndarray:
    e = np.exp(scores - scores.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def assert_same(weights, keep=None, k=3, threads=None):
    """Fused (forced, whatever the size) equals the reference within the documented tolerances."""
    ref = row_stats(weights, keep, k)
    fast = fused_row_stats(weights, keep, k, threads=threads, min_size=0)
    rtol = 1e-12 if np.asarray(weights).dtype == np.float64 else FUSED_RTOL
    for name in RowStats.__dataclass_fields__:
        a, b = getattr(ref, name), getattr(fast, name)
        assert a.shape == b.shape and a.dtype == b.dtype, (name, a.shape, b.shape, a.dtype, b.dtype)
        if name in EXACT:
            np.testing.assert_array_equal(b, a, err_msg=name)
        else:
            np.testing.assert_allclose(b, a, rtol=rtol, atol=0, equal_nan=True, err_msg=name)
    return ref, fast


def near_one_hot(n: int, eps: float) -> np.ndarray:
    row = np.zeros(n)
    row[n // 3] = 1 - eps
    row[n // 2] = eps
    return row


CASES = {
    "softmax rows": lambda rng: softmax(rng.normal(size=(3, 40, 300)) * 2),
    "peaked softmax rows": lambda rng: softmax(rng.normal(size=(50, 257)) * 40),
    "uniform rows": lambda rng: np.full((6, 512), 1 / 512),
    "one-hot rows": lambda rng: np.eye(128)[rng.integers(0, 128, size=64)],
    "near-one-hot rows 1e-7": lambda rng: np.stack([near_one_hot(1000, 1e-7)] * 70),
    "near-one-hot rows 1e-4 .. 1e-30": lambda rng: np.stack([near_one_hot(640, 10.0 ** -e) for e in range(4, 31)]),
    "rows of exact zeros (sparse)": lambda rng: np.where(rng.random((64, 200)) < 0.8, 0, rng.random((64, 200))),
    "ties: small integers": lambda rng: rng.integers(0, 4, size=(80, 333)).astype(float) / 10,
    "ties: every maximum twice": lambda rng: np.tile(softmax(rng.normal(size=(40, 100))), 2) / 2,
    "tiny rows Lk=1": lambda rng: np.ones((300, 1)),
    "tiny rows Lk=2": lambda rng: softmax(rng.normal(size=(300, 2))),
    "tiny rows Lk=3": lambda rng: softmax(rng.normal(size=(200, 3)) * 5),
    "long rows Lk=33000": lambda rng: softmax(rng.normal(size=(3, 33000))),
    "long rows Lk=40000, half zeros": lambda rng: softmax(rng.normal(size=(2, 40000))) * (np.arange(40000) % 2),
    "rows of zeros": lambda rng: np.zeros((20, 700)),
    "not distributions: weights above 1": lambda rng: rng.random((30, 300)) * 5,
    "not distributions: negative weights": lambda rng: rng.normal(size=(30, 300)),
}


@pytest.mark.parametrize("tiles", ["few tiles", "many tiles"])
@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "bfloat16"])
@pytest.mark.parametrize("case", list(CASES))
def test_fused_equals_the_reference(case, dtype, tiles, monkeypatch):
    """With many small tiles a thread that met rows with zeros takes the next tile the other way
    (0 log 0 arranged from the start, every row counted): both ways are checked."""
    if tiles == "many tiles":
        monkeypatch.setattr(stats, "TILE", 512)
    w = CASES[case](np.random.default_rng(0)).astype(ml_dtypes.bfloat16 if dtype == "bfloat16" else dtype)
    assert_same(w)
    assert_same(w, threads=1)


def test_near_one_hot_entropy_keeps_reference_accuracy():
    """[1 - 1e-7, 1e-7, 0, ...]: H = 1.7e-6 nats, tiny next to the float32 resolution of the weights
    near 1, yet the fused entropy is within 1e-6 of it relatively (every term has the same sign)."""
    w = np.stack([near_one_hot(4096, 1e-7)] * 20).astype(np.float32)
    ref, fast = assert_same(w)
    assert 1.5e-6 < ref.entropy[0] < 2e-6
    np.testing.assert_allclose(fast.entropy, ref.entropy, rtol=FUSED_RTOL)
    one_hot = np.eye(4096, dtype=np.float32)[:20]
    ref, fast = assert_same(one_hot)
    assert (fast.entropy == 0).all() and not np.signbit(fast.entropy).any()  # 0, never -0.000


def test_masked_rows_and_support():
    rng = np.random.default_rng(1)
    scores = rng.normal(size=(2, 4, 50, 300))
    keep = rng.random((50, 300)) < 0.7
    keep[[3, 17]] = False  # fully masked rows
    keep[5, :] = False
    keep[5, 299] = True  # one key
    with np.errstate(invalid="ignore"):
        w = np.where(keep, softmax(np.where(keep, scores, -np.inf)), 0.0)
    w = np.nan_to_num(w)  # the fully masked rows: all zero, as masked_softmax makes them
    w[..., 7, 11] = 0.0  # an exact zero where the mask keeps a key: support < n_keys
    for dtype in ("float32", "float64"):
        ref, fast = assert_same(w.astype(dtype), keep)
        assert fast.masked[..., [3, 17]].all() and fast.n_keys[0, 0, 5] == 1
        assert np.isnan(fast.entropy[..., 3]).all() and (fast.argmax[..., 3] == -1).all()
        assert (fast.support[..., 7] == fast.n_keys[..., 7] - 1).all()


def test_keep_of_lower_rank_broadcasts():
    rng = np.random.default_rng(2)
    w = softmax(rng.normal(size=(3, 64, 400))).astype(np.float32)
    assert_same(w * (np.arange(400) % 3 > 0), np.arange(400) % 3 > 0)  # a key-padding style [Lk] mask
    assert_same(w, np.tril(np.ones((64, 400), bool)))  # [Lq, Lk], broadcast over the leading axis


@pytest.mark.parametrize("k", [1, 3, 5, 8, 12])
def test_top_k_ties_go_to_the_lower_index(k):
    rng = np.random.default_rng(3)
    w = rng.integers(0, 3, size=(4, 60, 700)).astype(np.float32)  # many equal values
    ref, fast = assert_same(w, k=k)
    expected = np.argsort(-w, axis=-1, kind="stable")[..., :k]
    np.testing.assert_array_equal(fast.top_index, expected)


def test_threads_and_layouts_give_the_same_statistics():
    rng = np.random.default_rng(4)
    w = softmax(rng.normal(size=(4, 130, 520))).astype(np.float32)
    one = fused_row_stats(w, threads=1, min_size=0)
    for other in (fused_row_stats(w, threads=2, min_size=0), fused_row_stats(w, threads=3, min_size=0)):
        for name in RowStats.__dataclass_fields__:
            np.testing.assert_array_equal(getattr(other, name), getattr(one, name), err_msg=name)
    assert_same(np.swapaxes(softmax(rng.normal(size=(4, 520, 130))), -1, -2).astype(np.float32))  # not contiguous
    assert_same(np.broadcast_to(w[:1], (6, 130, 520)))  # broadcast along the leading axis (stride 0)
    assert_same(np.broadcast_to(w[0, :1], (130, 520)))  # every row the same one


def test_small_inputs_take_the_reference_itself():
    w = softmax(np.random.default_rng(5).normal(size=(3, 7)))
    ref, fast = row_stats(w), fused_row_stats(w)
    for name in RowStats.__dataclass_fields__:
        np.testing.assert_array_equal(getattr(fast, name), getattr(ref, name), err_msg=name)


def test_non_finite_weights_spoil_their_row_sum():
    """The pipeline checks the weights' finiteness through their row sums (no pass of its own)."""
    w = softmax(np.random.default_rng(6).normal(size=(40, 300))).astype(np.float32)
    w[3, 7], w[9, 0], w[20, 299] = np.nan, np.inf, -np.inf
    fast = fused_row_stats(w, min_size=0)
    assert [i for i in range(40) if not np.isfinite(fast.row_sum[i])] == [3, 9, 20]


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 5), st.integers(1, 300), st.integers(0, 2**32 - 1), st.sampled_from([0.0, 0.3, 0.9]),
       st.sampled_from(["float32", "float64", "float16"]), st.integers(1, 6))
def test_property_fused_equals_the_reference(rows, keys, seed, zeros, dtype, k):
    rng = np.random.default_rng(seed)
    w = softmax(rng.normal(size=(rows, keys)) * rng.uniform(0.1, 30))
    w = np.where(rng.random(w.shape) < zeros, 0.0, w)
    if rng.random() < 0.3:
        w = np.round(w, 1)  # ties
    keep = rng.random(w.shape) < 0.8 if rng.random() < 0.5 else None
    assert_same(w.astype(dtype), keep, k)


@pytest.mark.parametrize("reduce", ["mean", "max"])
@pytest.mark.parametrize("shape, fr, fc", [((3, 816, 2048), 4, 4), ((2, 100, 770), 8, 5), ((1, 200, 6400), 64, 64),
                                           ((2, 70, 90), 2, 3), ((1, 300, 300), 7, 1)])
def test_block_grids_equal_reduce_blocks(shape, fr, fc, reduce):
    rng = np.random.default_rng(7)
    for dtype in (np.float32, np.float64):
        w = rng.random(shape).astype(dtype)
        grids = BlockGrids(2, shape[2], fr, fc, reduce)
        for keep in (None, rng.random(shape) > 0.5, rng.random(shape[-1]) > 0.9, np.tril(np.ones(shape[-2:], bool))):
            grids.start(shape[1], keep is not None, dtype)
            fused_row_stats(w, keep, visit=grids.visit, align=fr, min_size=0)
            full_keep = None if keep is None else np.broadcast_to(keep, shape)
            for n in range(min(2, shape[0])):
                expected = reduce_blocks(w[n], None if full_keep is None else full_keep[n], fr, fc, reduce)
                got = grids.result(n)
                assert got.shape == expected.shape and got.dtype == expected.dtype
                np.testing.assert_array_equal(np.isnan(got), np.isnan(expected))
                if reduce == "max":
                    np.testing.assert_array_equal(got, expected)
                else:
                    np.testing.assert_allclose(got, expected, rtol=2e-6 if dtype == np.float32 else 1e-12)


@pytest.mark.parametrize("tile, fr", [(3 * 90, 7), (5 * 90, 7), (2 * 90, 64), (90 * 90, 7)])
def test_block_grids_with_tiles_shorter_than_a_cell(tile, fr, monkeypatch):
    """Tiles of 2, 3 or 5 rows against cells of 7 or 64 rows: tiles never straddle a cell, and each
    cell's rows are gathered by one thread (threads=4, many units)."""
    monkeypatch.setattr(stats, "TILE", tile)
    rng = np.random.default_rng(9)
    w = rng.random((3, 300, 90)).astype(np.float32)
    for keep in (None, rng.random((300, 90)) > 0.3):
        grids = BlockGrids(3, 90, fr, 4, "mean")
        grids.start(300, keep is not None)
        fused_row_stats(w, keep, visit=grids.visit, align=fr, min_size=0, threads=4)
        for n in range(3):
            expected = reduce_blocks(w[n], None if keep is None else keep, fr, 4)
            np.testing.assert_allclose(grids.result(n), expected, rtol=2e-6)


def test_blockwise_run_equals_the_dense_run():
    """Statistics and the heatmap grid of a run in blocks of query rows (fused pass, grids gathered
    during it) against the dense run (the statistics' reference, the heatmaps' ``attnviz.blocks.reduce_blocks``)."""
    from attnviz.blocks import block_factors
    from attnviz.io import Loaded
    from attnviz.masks import Mask
    from attnviz.pipeline import Prepared, RunOptions, execute
    from attnviz.variants import REGISTRY

    rng = np.random.default_rng(8)
    arrays = {n: rng.normal(size=(2, 600, 16)).astype(np.float32) for n in "qkv"}
    variant = REGISTRY["scaled"]
    params = variant.params()
    inputs = {n: Loaded(a, n, None) for n, a in arrays.items()}
    shape = variant.check(inputs, params, None).weights_shape
    keep = np.tril(np.ones((600, 600), bool))

    def run(max_memory):
        prep = Prepared(variant, params, RunOptions(max_memory=max_memory), inputs, shape, Mask(keep=keep),
                        None, None, [])
        return execute(prep)

    dense, blocked = run("1G"), run("4M")
    assert dense.streamed is None and blocked.streamed is not None and blocked.streamed.blocks > 1
    for name in RowStats.__dataclass_fields__:
        a, b = getattr(dense.stats, name), getattr(blocked.stats, name)
        if name in CLOSE:
            np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-7, equal_nan=True, err_msg=name)
        elif name not in ("argmax", "top_index", "top_weight", "max"):  # may flip between near-equal weights
            np.testing.assert_array_equal(b, a, err_msg=name)
    fr, fc = block_factors(600, 600)
    assert (fr, fc) == (2, 2)
    for n in range(2):
        expected = reduce_blocks(dense.result.weights[n], keep, fr, fc)
        np.testing.assert_allclose(blocked.streamed.grids[n], expected, rtol=1e-5, atol=1e-8, equal_nan=True)

"""`sparse`: the reference's sparsemax / entmax / top-k values (which the entmax package agrees with),
the Sparse Transformer masks, exact zeros and rows summing to 1, and bad options refused."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from attnviz.errors import UsageError
from attnviz.variants.sparse import entmax15, entmax_bisect, pattern_keep, sparsemax, top_k_keep
from tests.conftest import compute

ALL = np.ones(3, bool)


@pytest.mark.parametrize("z, expected", [
    ([1.0, 0.8, 0.1], [0.6, 0.4, 0]),
    ([2.0, 1, 0], [1, 0, 0]),
    ([0.0, 0, 0], [1 / 3] * 3),
])
def test_sparsemax_reference(z, expected):
    np.testing.assert_allclose(sparsemax(np.array(z), ALL), expected, atol=1e-12)


def test_entmax_reference():
    np.testing.assert_allclose(entmax15(np.array([2.0, 1, 0]), ALL), [0.830719, 0.169281, 0], atol=1e-6)
    np.testing.assert_allclose(entmax15(np.array([1.0, 0.8, 0.1]), ALL), [0.529248, 0.393749, 0.077003], atol=1e-6)
    np.testing.assert_allclose(entmax_bisect(np.array([1.0, 0.8, 0.1]), ALL, 1.25), [0.484180, 0.378119, 0.137701],
                               atol=1e-6)
    np.testing.assert_allclose(entmax_bisect(np.array([2.0, 1, 0]), ALL, 1.25), [0.750700, 0.214850, 0.034450],
                               atol=1e-6)
    np.testing.assert_allclose(entmax_bisect(np.array([1.0, 0.8, 0.1]), ALL, 2.0), [0.6, 0.4, 0], atol=1e-6)
    np.testing.assert_allclose(entmax_bisect(np.array([2.0, 1, 0]), ALL, 1.5), [0.830719, 0.169281, 0], atol=1e-6)


def test_topk_reference():
    z = np.array([1.0, 0.8, 0.1, 0.9])
    assert top_k_keep(z, np.ones(4, bool), 2).tolist() == [True, False, False, True]
    assert top_k_keep(np.array([1, 0.5, 1, 0.5]), np.ones(4, bool), 3).tolist() == [True, True, True, False]
    r = compute("sparse", np.array([[1.0]]), z[:, None], np.eye(4), method="topk", top_k=2, score="dot")
    np.testing.assert_allclose(r.weights, [[0.524979, 0, 0, 0.475021]], atol=1e-6)
    r = compute("sparse", np.array([[1.0]]), np.array([[1], [0.5], [1], [0.5]]), np.eye(4), method="topk", top_k=3,
                score="dot")
    np.testing.assert_allclose(r.weights, [[0.383652, 0.232697, 0.383652, 0]], atol=1e-6)


def test_patterns_reference_n8_l4_c1():
    strided = pattern_keep(8, 8, "strided", 4, 1)
    fixed = pattern_keep(8, 8, "fixed", 4, 1)
    assert (strided[0] | strided[1]).astype(int).tolist()[4:] == [
        [1, 1, 1, 1, 1, 0, 0, 0], [0, 1, 1, 1, 1, 1, 0, 0], [0, 0, 1, 1, 1, 1, 1, 0], [0, 0, 0, 1, 1, 1, 1, 1]]
    assert (fixed[0] | fixed[1]).astype(int).tolist()[4:] == [
        [0, 0, 0, 1, 1, 0, 0, 0], [0, 0, 0, 1, 1, 1, 0, 0], [0, 0, 0, 1, 1, 1, 1, 0], [0, 0, 0, 1, 1, 1, 1, 1]]
    second = fixed[1].astype(int)
    assert second[:, 3].tolist() == [0, 0, 0, 1, 1, 1, 1, 1] and second[7, 7] == 1 and second.sum() == 6
    x = np.ones((8, 2))
    r = compute("sparse", x, x, np.eye(8), method="fixed", stride=4, c=1)
    np.testing.assert_allclose(r.weights[4], [0, 0, 0, 0.5, 0.5, 0, 0, 0])
    split = compute("sparse", x, x, np.eye(8), method="strided", stride=4, combine="split")
    assert split.weights.shape == (2, 8, 8) and ((split.weights[1] > 0) == strided[1]).all()


rows = st.integers(1, 5).flatmap(lambda n: st.tuples(
    hnp.arrays(np.float64, (3, n), elements=st.floats(-5, 5)), hnp.arrays(np.bool_, (3, n))))


@settings(max_examples=50, deadline=None)
@given(rows)
def test_normalisers_give_distributions_with_exact_zeros_on_masked_keys(case):
    z, keep = case
    for fn in (sparsemax, entmax15, lambda a, b: entmax_bisect(a, b, 1.7)):
        p = fn(z, keep)
        assert (p >= 0).all() and (p[~keep] == 0).all()
        live = keep.any(-1)
        np.testing.assert_allclose(p.sum(-1)[live], 1, atol=1e-6)
        assert (p.sum(-1)[~live] == 0).all()
        # sparsemax solves the projection: no kept entry outranks a larger score
        order = np.argsort(-np.where(keep, z, -np.inf), axis=-1, kind="stable")
        sorted_p = np.take_along_axis(p, order, -1)
        assert (np.diff(sorted_p, axis=-1) <= 1e-9).all()


def test_cli_rows_report_support(tmp_path):
    from typer.testing import CliRunner

    from attnviz.cli import app

    rng = np.random.default_rng(0)
    np.save(tmp_path / "x.npy", rng.normal(size=(4, 3)) * 3)
    x = str(tmp_path / "x.npy")
    r = CliRunner().invoke(app, ["sparse", x, x, x])
    assert r.exit_code == 0 and "support" in r.stdout
    import json

    doc = json.loads(CliRunner().invoke(app, ["sparse", x, x, x, "--json"]).stdout)
    w = np.array(doc["weights"])
    assert doc["stats"]["support"] == (w > 0).sum(-1).tolist() and (w == 0).any()


@pytest.mark.parametrize("kwargs, match", [
    ({"method": "entmax", "alpha": 1.0}, "alpha > 1"),
    ({"method": "entmax", "alpha": 0.5}, "alpha > 1"),
    ({"method": "topk", "top_k": 0}, "1 <= k <= Lk"),
    ({"method": "topk", "top_k": 9}, "1 <= k <= Lk"),
    ({"method": "topk"}, "1 <= k"),
    ({"top_k": 2}, "--k goes with"),
    ({"method": "fixed", "stride": 2, "c": 3}, "--c 3"),
    ({"method": "strided", "stride": 0}, "--stride 0"),
])
def test_bad_options(kwargs, match):
    x = np.ones((5, 2))
    with pytest.raises(UsageError, match=match):
        compute("sparse", x, x, x, **kwargs)

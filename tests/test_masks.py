"""Masks: conventions, broadcasting, key padding, causal alignment and fully masked rows."""

from __future__ import annotations

import numpy as np
import pytest

from attnviz.errors import InputError, ShapeError
from attnviz.io import Loaded
from attnviz.masks import build_mask, causal_keep, describe_rows, fully_masked_rows


def L(arr, name="m.npy"):
    return Loaded(np.asarray(arr), name, None)


def test_keep_and_block_conventions_are_opposite():
    m = L([[1, 0, 1]])
    keep = build_mask((2, 3), mask=m, convention="keep").keep
    block = build_mask((2, 3), mask=m, convention="block").keep
    np.testing.assert_array_equal(keep, [[True, False, True]])
    np.testing.assert_array_equal(block, [[False, True, False]])


def test_non_binary_boolean_mask_is_refused():
    with pytest.raises(InputError, match="only 0 and 1.*--mask-kind additive"):
        build_mask((2, 3), mask=L([0.5, 1, 1]))


def test_mask_must_broadcast_to_weights_without_enlarging_them():
    with pytest.raises(ShapeError, match=r"\[3, 5\] does not broadcast to the weights' shape \[3, 4\]"):
        build_mask((3, 4), mask=L(np.ones((3, 5))))
    with pytest.raises(ShapeError):
        build_mask((3, 4), mask=L(np.ones((2, 3, 4))))  # would add a batch dimension
    assert build_mask((2, 3, 4), mask=L(np.ones(4))).keep.shape == (4,)


def test_key_padding_aligns_with_batch_dimension():
    pad = L([[1, 1, 0], [1, 0, 0]])  # [batch=2, Lk=3]
    keep = build_mask((2, 4, 5, 3), key_padding=pad).keep  # weights [B, H, Lq, Lk]
    assert keep.shape == (2, 1, 1, 3)
    full = np.broadcast_to(keep, (2, 4, 5, 3))
    assert full[0, 3, 2].tolist() == [True, True, False]
    assert full[1, 0, 4].tolist() == [True, False, False]
    with pytest.raises(ShapeError, match="key-padding"):
        build_mask((2, 5, 3), key_padding=L(np.ones((2, 4))))


def test_additive_bias_moves_neg_inf_into_keep():
    m = build_mask((1, 3), mask=L([0.0, -1.0, -np.inf]), kind="additive")
    np.testing.assert_array_equal(m.keep, [True, True, False])
    np.testing.assert_array_equal(m.bias, [0.0, -1.0, 0.0])


def test_causal_combines_with_mask():
    m = build_mask((3, 3), mask=L([1, 1, 0]), causal=True)
    np.testing.assert_array_equal(m.keep, [[1, 0, 0], [1, 1, 0], [1, 1, 0]])
    assert causal_keep(2, 4, "bottom-right").tolist() == [[1, 1, 1, 0], [1, 1, 1, 1]]


def test_fully_masked_rows_named():
    keep = np.ones((2, 3, 4), bool)
    keep[0, 1] = False
    keep[1, 2] = False
    rows = fully_masked_rows(keep, (2, 3, 4))
    assert rows.tolist() == [[0, 1], [1, 2]]
    assert describe_rows(rows) == "(0, 1), (1, 2)"
    assert describe_rows(np.arange(20)[:, None], limit=3) == "0, 1, 2 and 17 more"
    assert len(fully_masked_rows(None, (3, 4))) == 0

"""attnviz.inspection's rollout, tokens and received against independent transcriptions: rollout
(Abnar & Zuidema's own code, in NumPy), hand-checkable 2 x 2 cases, constructed induction /
duplicate-token / previous-token heads on a repeated random sequence, and received attention on a
sink head."""

from __future__ import annotations

import numpy as np
import pytest

import attnviz.inspection.received as received_module
from attnviz.inspection.received import received
from attnviz.inspection.rollout import rollout
from attnviz.inspection.tokens import (
    earlier_occurrences,
    repeated_sequence,
    token_ids,
    token_patterns,
    token_scores,
    token_tags,
)


def rows_softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def compute_joint_attention(att_mat: np.ndarray, add_residual: bool = True) -> np.ndarray:
    """The paper's reference code (github.com/samiraabnar/attention_flow), transcribed: ``att_mat``
    is ``[layers, L, L]``, already averaged over heads."""
    if add_residual:
        residual_att = np.eye(att_mat.shape[1])[None, ...]
        aug_att_mat = att_mat + residual_att
        aug_att_mat = aug_att_mat / aug_att_mat.sum(axis=-1)[..., None]
    else:
        aug_att_mat = att_mat
    joint_attentions = np.zeros(aug_att_mat.shape)
    layers = joint_attentions.shape[0]
    joint_attentions[0] = aug_att_mat[0]
    for i in np.arange(1, layers):
        joint_attentions[i] = aug_att_mat[i].dot(joint_attentions[i - 1])
    return joint_attentions


def general_oracle(w: np.ndarray, heads: str, r: float, start: int) -> np.ndarray:
    """Straight from the definition, one loop per layer, every row normalised by hand."""
    out = None
    for layer in w[start:]:
        a = {"mean": layer.mean(0), "max": layer.max(0), "min": layer.min(0)}[heads]
        a = (1 - r) * a + r * np.eye(a.shape[0])
        for i in range(a.shape[0]):
            s = a[i].sum()
            a[i] = a[i] / s if s else 0.0
        out = a if out is None else a @ out
    return out


@pytest.fixture
def random_weights() -> np.ndarray:
    rng = np.random.default_rng(7)
    return rows_softmax(rng.normal(size=(5, 4, 9, 9)) * 2)  # [layers, heads, L, L]


def test_rollout_equals_the_papers_code(random_weights: np.ndarray) -> None:
    got = rollout(random_weights, all_layers=True)
    joint = compute_joint_attention(random_weights.mean(axis=1))
    np.testing.assert_allclose(got.result, joint[-1], atol=1e-12)
    np.testing.assert_allclose(got.cumulative, joint, atol=1e-12)
    assert got.layers == [0, 1, 2, 3, 4]
    np.testing.assert_allclose(got.result.sum(axis=-1), 1.0, atol=1e-12)


@pytest.mark.parametrize("heads", ["mean", "max", "min"])
@pytest.mark.parametrize("residual", [0.0, 0.5, 0.9])
@pytest.mark.parametrize("start", [0, 2])
def test_rollout_equals_the_definition(random_weights: np.ndarray, heads: str, residual: float, start: int) -> None:
    got = rollout(random_weights, heads=heads, residual=residual, start_layer=start)
    np.testing.assert_allclose(got.result, general_oracle(random_weights, heads, residual, start), atol=1e-12)


def test_residual_zero_is_the_plain_product(random_weights: np.ndarray) -> None:
    got = rollout(random_weights, residual=0.0)
    joint = compute_joint_attention(random_weights.mean(axis=1), add_residual=False)
    np.testing.assert_allclose(got.result, joint[-1], atol=1e-12)


def test_rollout_by_hand_two_by_two() -> None:
    # layer 0: A = [[1, 0], [.5, .5]] -> A' = [[1, 0], [.25, .75]]
    # layer 1: A = [[0, 1], [1, 0]]   -> A' = [[.5, .5], [.5, .5]]
    # R = A'_1 A'_0 = [[.625, .375], [.625, .375]]
    w = np.array([[[[1.0, 0.0], [0.5, 0.5]]], [[[0.0, 1.0], [1.0, 0.0]]]])
    got = rollout(w, all_layers=True)
    np.testing.assert_allclose(got.cumulative[0], [[1.0, 0.0], [0.25, 0.75]])
    np.testing.assert_allclose(got.result, [[0.625, 0.375], [0.625, 0.375]])
    # two heads combined by max: layer 0 heads [[1,0],[0,1]] and [[0,1],[1,0]] -> max all ones;
    # with r = 0.5: [[1, .5], [.5, 1]] / 1.5 each row
    two = np.array([[[[1.0, 0.0], [0.0, 1.0]], [[0.0, 1.0], [1.0, 0.0]]]])
    np.testing.assert_allclose(rollout(two, heads="max").result, [[2 / 3, 1 / 3], [1 / 3, 2 / 3]])
    np.testing.assert_allclose(rollout(two, heads="min", residual=0.0).result, [[0, 0], [0, 0]])


def test_rollout_over_real_tokens_only(random_weights: np.ndarray) -> None:
    real = np.ones(9, bool)
    real[:3] = False  # left padding
    sub = random_weights[:, :, 3:, 3:]
    sub = sub / sub.sum(axis=-1, keepdims=True)
    got = rollout(random_weights, real=real)
    assert np.isnan(got.result[:3]).all() and np.isnan(got.result[:, :3]).all()
    np.testing.assert_allclose(got.result[3:, 3:], general_oracle(sub, "mean", 0.5, 0), atol=1e-12)


def test_rollout_refuses_rectangles() -> None:
    with pytest.raises(ValueError, match="square"):
        rollout(np.ones((2, 1, 3, 4)) / 4)


# --- token-aware heads on a repeated random sequence ---------------------------------------------


def repeated_tokens(n: int = 8, seed: int = 3) -> list[str]:
    ids = repeated_sequence(n, 1000, seed)
    return [f"t{i}" for i in ids]


def constructed_heads(tokens: list[str]) -> np.ndarray:
    """[1, 1, 4, L, L]: induction, duplicate-token, previous-token and a first-token sink; rows
    with nothing to attend by their rule attend to themselves."""
    length = len(tokens)
    n = length // 2
    w = np.zeros((4, length, length))
    for i in range(length):
        w[0, i, i - n + 1 if i >= n else i] = 1.0  # the token after the earlier occurrence
        w[1, i, i - n if i >= n else i] = 1.0  # the earlier occurrence
        w[2, i, max(i - 1, 0)] = 1.0
        w[3, i, 0] = 1.0
    return w[None, None]


def test_constructed_heads_get_exact_scores_and_tags() -> None:
    tokens = repeated_tokens()
    w = constructed_heads(tokens)
    scores = token_scores(w, tokens)
    np.testing.assert_allclose(scores["induction"][0], [1.0, 0.0, 0.0, 0.0])
    # the sink head: the first repeated token's earlier occurrence is position 0, 1 query of 8
    np.testing.assert_allclose(scores["duplicate"][0], [0.0, 1.0, 0.0, 1 / 8])
    assert list(scores["repeated"]) == [8]  # the second half
    assert list(token_tags(scores)[0]) == ["induction", "duplicate-token", "", ""]


def test_scores_average_over_repeated_queries_only() -> None:
    tokens = ["a", "b", "a", "c", "b"]
    w = np.zeros((1, 1, 1, 5, 5))
    w[..., :, :] = 0.2  # uniform
    scores = token_scores(w, tokens)
    # query 2 ("a"): earlier a at 0 -> duplicate 0.2, induction (pos 1) 0.2
    # query 4 ("b"): earlier b at 1 -> duplicate 0.2, induction (pos 2) 0.2
    np.testing.assert_allclose(scores["duplicate"], [[0.2]])
    np.testing.assert_allclose(scores["induction"], [[0.2]])
    w2 = np.zeros((1, 1, 1, 5, 5))
    w2[0, 0, 0, 2, 1] = 1.0  # query 2 attends the token after its earlier occurrence
    w2[0, 0, 0, 4, 1] = 1.0  # query 4 attends its earlier occurrence
    scores = token_scores(w2, tokens)
    np.testing.assert_allclose(scores["induction"], [[0.5]])
    np.testing.assert_allclose(scores["duplicate"], [[0.5]])


def test_padded_queries_are_left_out_of_token_scores() -> None:
    tokens = ["a", "b", "a", "b"]
    w = np.zeros((1, 1, 1, 4, 4))
    w[0, 0, 0, 2, 0] = 1.0  # duplicate
    w[0, 0, 0, 3, 3] = 1.0  # neither
    real = np.array([True, True, True, False])
    np.testing.assert_allclose(token_scores(w, tokens, real)["duplicate"], [[1.0]])
    np.testing.assert_allclose(token_scores(w, tokens)["duplicate"], [[0.5]])


def test_no_repeats_give_nan_and_no_tag() -> None:
    tokens = ["a", "b", "c"]
    scores = token_scores(np.full((1, 1, 2, 3, 3), 1 / 3), tokens)
    assert np.isnan(scores["induction"]).all() and np.isnan(scores["duplicate"]).all()
    assert (token_tags(scores) == "").all()


def test_repeated_sequence_is_two_copies_of_distinct_ids() -> None:
    ids = repeated_sequence(20, 50, seed=1)
    assert ids.shape == (40,) and (ids[:20] == ids[20:]).all() and len(set(ids[:20])) == 20
    assert (repeated_sequence(20, 50, seed=1) == ids).all()
    with pytest.raises(ValueError):
        repeated_sequence(20, 10)


# --- received attention --------------------------------------------------------------------------


def received_oracle(w: np.ndarray, allowed: np.ndarray) -> np.ndarray:
    out = np.full(w.shape[-1], np.nan)
    for j in range(w.shape[-1]):
        seen = [w[i, j] for i in range(w.shape[-2]) if allowed[i, j]]
        if seen:
            out[j] = sum(seen) / len(seen)
    return out


def test_sink_head_receives_everything_on_the_first_token() -> None:
    w = constructed_heads(repeated_tokens())[:, :, 3:4]  # the sink head
    got = received(w, causal=True)
    assert got[0, 0, 0, 0] == 1.0
    np.testing.assert_allclose(got[0, 0, 0, 1:], 0.0)


def test_received_counts_only_queries_allowed_to_see_the_key() -> None:
    rng = np.random.default_rng(0)
    length = 6
    scores = rng.normal(size=(2, 3, length, length))
    causal = np.tril(np.ones((length, length), bool))
    w = rows_softmax(np.where(causal, scores, -np.inf))[None]  # [1, 2, 3, L, L]
    got = received(w, causal=True)
    for b in range(2):
        for h in range(3):
            np.testing.assert_allclose(got[0, b, h], received_oracle(w[0, b, h], causal), atol=1e-12)
    # the last token is seen by the last query only: its received value is that one weight
    np.testing.assert_allclose(got[0, :, :, -1], w[0, :, :, -1, -1])
    # padding: key 0 and query 0 padded
    keep = np.ones((length, length), bool)
    keep[:, 0] = False
    real = np.ones(length, bool)
    real[0] = False
    masked = received(w, keep=keep, real_rows=real, causal=True)
    allowed = causal & keep & real[:, None]
    assert np.isnan(masked[..., 0]).all()
    np.testing.assert_allclose(masked[0, 1, 2], received_oracle(w[0, 1, 2], allowed), atol=1e-12)


def test_token_scores_equal_the_dense_patterns_with_many_repeats():
    rng = np.random.default_rng(4)
    tokens = [f"t{i}" for i in rng.integers(0, 5, size=40)]  # a small vocabulary: many earlier occurrences
    w = rows_softmax(rng.normal(size=(2, 2, 3, 40, 40)))
    real = np.ones((1, 2, 1, 40), bool)
    real[0, 1, 0, :4] = False  # entry 1 left-padded
    duplicate, induction = token_patterns(tokens)
    got = token_scores(w, tokens, real)
    live = duplicate.any(axis=1)[None, None, None, :] & real  # [1, B, 1, Lq]
    for name, pattern in (("duplicate", duplicate), ("induction", induction)):
        mass = np.where(pattern, w, 0.0).sum(axis=-1)  # [L, B, H, Lq]
        expected = np.where(live, mass, 0.0).sum(axis=(1, 3)) / np.broadcast_to(live, mass.shape).sum(axis=(1, 3))
        np.testing.assert_allclose(got[name], expected, atol=1e-12)


def test_earlier_occurrences_come_in_pieces_and_cover_the_pattern():
    tokens = list("abacabadabacaba")
    duplicate, _ = token_patterns(tokens)
    pieces = list(earlier_occurrences(token_ids(tokens), limit=5))
    assert len(pieces) > 3
    pairs = [(int(i), int(j)) for pi, pj in pieces for i, j in zip(pi, pj)]
    assert len(pairs) == len(set(pairs)) and set(pairs) == set(zip(*map(lambda a: a.tolist(), np.nonzero(duplicate))))


@pytest.mark.parametrize("chunk", [6, 12, 2**22])  # one query row, two, the whole map at a time
def test_received_a_few_rows_at_a_time(monkeypatch, chunk):
    monkeypatch.setattr(received_module, "CHUNK", chunk)
    rng = np.random.default_rng(3)
    length = 6
    causal = np.tril(np.ones((length, length), bool))
    w = rows_softmax(np.where(causal, rng.normal(size=(2, 1, 2, length, length)), -np.inf))
    keep = np.ones((length, length), bool)
    keep[:, 1] = False
    real = np.array([True, True, False, True, True, True])
    got = received(w, keep=keep, real_rows=real, causal=True)
    allowed = causal & keep & real[:, None]
    for li in range(2):
        for h in range(2):
            np.testing.assert_allclose(got[li, 0, h], received_oracle(w[li, 0, h], allowed), atol=1e-12)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("chunk", [6, 40, 2**22])  # a row, a few rows and whole maps per block
def test_received_from_the_head_pass_column_sums_equals_the_oracle(causal, chunk):
    """inspect reads the weights once: received attention comes from the head pass's column sums (masked
    keys and padded rows as 0) and counts worked out from the masks. Causal weights (as the pass found them:
    nothing above the diagonal) count only the queries at or after each key."""
    from attnviz.inspection.heads import head_pass
    from attnviz.inspection.received import received_from_columns

    rng = np.random.default_rng(7)
    length = 6
    tril = np.tril(np.ones((length, length), bool))
    scores = rng.normal(size=(2, 2, 3, length, length))
    w = rows_softmax(np.where(tril, scores, -np.inf) if causal else scores).astype(np.float32)
    keep = np.ones((length, length), bool)
    keep[:, 1] = False
    real = np.ones((1, 2, 1, length), bool)
    real[0, 1, 0, :2] = False  # entry 1 left-padded
    for k, r in ((None, None), (keep, real)):
        passed = head_pass(w, k, chunk, real_rows=r)
        assert bool(passed.stats["causal"]) == causal and passed.finite
        got = received_from_columns(passed.columns, w.shape, k, r, causal)
        for li, bi, hi in np.ndindex(2, 2, 3):
            allowed = (tril if causal else np.ones((length, length), bool)) & (True if k is None else k)
            if r is not None:
                allowed = allowed & r[0, bi, 0][:, None]
            np.testing.assert_allclose(got[li, bi, hi], received_oracle(w[li, bi, hi].astype(np.float64), allowed),
                                       rtol=1e-6, atol=1e-7)

"""The files serving stacks read (``attnviz.ablation.exports``), checked against their consumers: each consumer's
reading logic is transcribed below (a few lines each, the repository and file named) and must read back the
decision attnviz meant; attnviz's own readers round-trip them; malformed files and bad arguments give one-line
errors; files are written whole or not at all."""

from __future__ import annotations

import json
from io import StringIO

import numpy as np
import pytest

from attnviz.ablation.exports import (
    DUO_CONFIG,
    DUO_GATES,
    duo_attention_targets,
    read_duo_attention,
    read_minference,
    read_retrieval_scores,
    write_duo_attention,
    write_minference,
    write_retrieval_scores,
)
from attnviz.errors import AttnvizError, InputError, OutputError, UsageError

LAYERS, HEADS, KV_HEADS = 4, 6, 2
SINK, RECENT, LENGTH = 16, 64, 8192


def policy(share: float = 0.25, seed: int = 0) -> np.ndarray:
    """A 0/1 policy [layers, kv_heads] streaming ``share`` of the key-value heads (0: streams)."""
    rng = np.random.default_rng(seed)
    gates = np.ones(LAYERS * KV_HEADS)
    gates[rng.choice(gates.size, round(share * gates.size), replace=False)] = 0
    return gates.reshape(LAYERS, KV_HEADS)


def ranking(seed: int = 1) -> np.ndarray:
    """A ranking's scores in [0, 1], distinct."""
    return np.random.default_rng(seed).permutation(LAYERS * KV_HEADS).reshape(LAYERS, KV_HEADS) / (LAYERS * KV_HEADS)


def one_line_error(excinfo: pytest.ExceptionInfo[AttnvizError], exit_code: int, *words: str) -> str:
    """The error's message, checked: one line, the exit code, and every word in it."""
    message = str(excinfo.value)
    assert "\n" not in message and excinfo.value.exit_code == exit_code, message
    for word in words:
        assert word in message, message
    return message


# ---------------------------------------------------------------------------------------------------
# The consumers' reading logic, transcribed


def duo_load_attn_pattern(folder):
    """mit-han-lab/duo-attention, duo_attn/utils.py: load_attn_pattern."""
    full_attention_heads = np.loadtxt(folder / "full_attention_heads.tsv", dtype=float, delimiter="\t")
    full_attention_heads = np.clip(full_attention_heads, 0, 1)
    config = json.load(open(folder / "config.json"))
    return full_attention_heads, config["sink_size"], config["recent_size"]


def duo_sparsify_attention_heads(full_attention_heads, sparsity, seed=0):
    """mit-han-lab/duo-attention, duo_attn/utils.py: sparsify_attention_heads with a sparsity (its evals'
    --sparsity); the noise that breaks ties drawn from a seeded generator."""
    noise = np.random.default_rng(seed).uniform(0, 1e-6, full_attention_heads.shape)
    full_attention_heads = full_attention_heads + noise
    threshold = np.quantile(full_attention_heads, sparsity)
    if sparsity >= 1:
        threshold = 2
    if sparsity <= 0:
        threshold = -1
    return (full_attention_heads >= threshold).astype(float)


def kvpress_streaming_mask(folder, head_compression_ratio):
    """NVIDIA/kvpress, kvpress/presses/duo_attention_press.py: load_attention_pattern (the files read locally, as
    its tests override it) and post_init_from_model's mask of streaming heads [layers, kv_heads]."""
    config = json.loads((folder / "config.json").read_text())
    head_scores = np.loadtxt(StringIO((folder / "full_attention_heads.tsv").read_text()), dtype=float, delimiter="\t")
    head_scores = np.clip(head_scores, 0, 1)
    sink_size, recent_size = config["sink_size"], config["recent_size"]
    n_pruned = round(head_scores.size * head_compression_ratio)
    streaming_mask = np.zeros(head_scores.shape, dtype=bool)
    if n_pruned > 0:
        indices = np.argsort(head_scores, axis=None)[:n_pruned]
        streaming_mask[np.unravel_index(indices, head_scores.shape)] = True
    return sink_size, recent_size, streaming_mask


def kvpress_kept_keys(sink_size, recent_size, k_len):
    """NVIDIA/kvpress, duo_attention_press.py: compress masks keys[..., sink_size:-recent_size] of a streaming
    head; the keys it keeps."""
    masked = np.zeros(k_len, dtype=bool)
    masked[sink_size:-recent_size] = True
    return np.flatnonzero(~masked)


def vllm_heads_of_rank(path, layer_idx, num_heads, rank):
    """vllm-project/vllm, vllm/attention/backends/dual_chunk_flash_attn.py (DualChunkFlashAttentionImpl.__init__)
    and sgl-project/sglang, python/sglang/srt/layers/attention/dual_chunk_flashattention_backend.py
    (get_sparse_attention_config): the file (sparse_attention_config.json, read with json.load by both) indexed
    [layer][query head] for the query heads of one tensor-parallel rank; then the prefill's per-head sizes."""
    sparse_attention_config = json.load(open(path))
    sparse_attention_config = {int(i): j for i, j in sparse_attention_config[layer_idx].items()}
    start_head = num_heads * rank
    end_head = start_head + num_heads
    sparse_attention_config = [sparse_attention_config[i] for i in range(start_head, end_head)]
    sizes = []
    for head_id in range(num_heads):
        ty, vertical_size, slash_size, _ = sparse_attention_config[head_id]
        assert ty == "vertical_and_slash", "only support slash mode"
        if vertical_size == 30:
            vertical_size += 100
        sizes.append((vertical_size, slash_size))
    return sizes


def vllm_last_row_keys(vertical_size, slash_size, k_len, rng):
    """The keys the last query row of one chunk keeps in vLLM's (and SGLang's) _dual_chunk_flash_attn_prefill_func:
    the top vertical_size columns of the last queries' attention with columns [:30] scored infinity, and the top
    slash_size diagonals with the last 100 scored infinity (index k_len - 1 - d is the diagonal d keys back). The
    attention is random and the ties among infinite scores are broken in a random order (torch.topk promises
    none)."""

    def topk(scores, k):
        order = np.lexsort((rng.permutation(scores.size), -scores))  # by score, ties in a random order
        return order[:k]

    vertical = rng.random(k_len)
    vertical[:30] = np.inf
    columns = topk(vertical, min(vertical_size, k_len))
    slash = rng.random(k_len)
    slash[-100:] = np.inf
    diagonals = (k_len - 1) - topk(slash, min(slash_size, k_len))
    return set(columns.tolist()) | set(((k_len - 1) - diagonals).tolist())


def minference_best_pattern(path, layer_idx):
    """microsoft/MInference, minference/modules/minference_forward.py: init_minference_parameters' best_pattern
    of a layer, and the lookup of each head with its default."""
    best_pattern = {int(ii): jj for ii, jj in json.load(open(path))[layer_idx].items()}
    return lambda head_id: best_pattern.get(head_id, ("vertical_and_slash", 1000, 6096, 1))


def retrieval_head_top(path, k):
    """nightdessert/Retrieval_Head, needle_in_haystack_with_mask.py: the heads with the highest mean score."""
    with open(path) as file:
        stable_block_list = json.loads(file.readline())
    stable_block_list = [(l[0], np.mean(l[1])) for l in stable_block_list.items()]  # noqa: E741 (as written there)
    stable_block_list = sorted(stable_block_list, key=lambda x: x[1], reverse=True)
    return [[int(ll) for ll in l[0].split("-")] for l in stable_block_list][:k]  # noqa: E741


def headkv_total_attention(path, num_hidden_layers, num_attention_heads, temp=1):
    """FYYFU/HeadKV, headkv/snapkv_utils.py: ReasonSnapKVCluster.__init__'s share of the cache per head (NumPy for
    torch)."""
    with open(path) as file:
        head_list = json.loads(file.readline())
    head_score_list = [np.mean(l[1]) for l in head_list.items()]  # noqa: E741 (as written there)
    head_score_list = np.array(head_score_list / sum(head_score_list))
    head_score_list = np.power(head_score_list, temp)
    head_score_list = head_score_list / np.sum(head_score_list)
    return head_score_list.reshape(num_hidden_layers, num_attention_heads)


# ---------------------------------------------------------------------------------------------------
# DuoAttention


@pytest.mark.parametrize("share", [0.25, 0.5])
def test_duo_attention_policy_reads_back_in_duo_attention_and_kvpress(tmp_path, share):
    gates = policy(share)
    folder = tmp_path / "duo"
    write_duo_attention(folder, gates, sink_size=SINK, recent_size=RECENT, extra={"model_name": "tiny"})
    assert sorted(p.name for p in folder.iterdir()) == [DUO_CONFIG, DUO_GATES]

    heads, sink, recent = duo_load_attn_pattern(folder)
    assert (sink, recent) == (SINK, RECENT)
    np.testing.assert_array_equal(heads, gates)
    np.testing.assert_array_equal(heads >= 0.5, gates == 1)  # DuoAttention's default threshold
    np.testing.assert_array_equal(duo_sparsify_attention_heads(heads, share), gates)  # and its --sparsity

    sink, recent, streaming = kvpress_streaming_mask(folder, share)
    assert (sink, recent) == (SINK, RECENT)
    np.testing.assert_array_equal(streaming, gates == 0)  # exactly the heads the policy streams
    np.testing.assert_array_equal(kvpress_kept_keys(sink, recent, 300), [*range(SINK), *range(300 - RECENT, 300)])

    back = read_duo_attention(folder)
    np.testing.assert_array_equal(back.gates, gates)
    assert (back.sink_size, back.recent_size, back.config["model_name"]) == (SINK, RECENT, "tiny")


def test_duo_attention_ranking_streams_the_lowest_scores_in_kvpress(tmp_path):
    scores = ranking()
    write_duo_attention(tmp_path, scores, sink_size=SINK, recent_size=RECENT)
    for ratio in (0.125, 0.25, 0.5, 0.75):
        _, _, streaming = kvpress_streaming_mask(tmp_path, ratio)
        lowest = np.argsort(scores, axis=None)[:round(scores.size * ratio)]
        assert set(np.flatnonzero(streaming).tolist()) == set(lowest.tolist())
    np.testing.assert_array_equal(read_duo_attention(tmp_path).gates, scores)  # %.18e: every float64 whole


def test_duo_attention_gates_are_written_as_numpy_savetxt_writes_them(tmp_path):
    """duo_attn/utils.py save_full_attention_heads: numpy.savetxt(..., delimiter="\\t")."""
    scores = ranking()
    write_duo_attention(tmp_path / "a", scores, sink_size=0, recent_size=1)
    np.savetxt(tmp_path / "reference.tsv", scores, delimiter="\t")
    assert (tmp_path / "a" / DUO_GATES).read_bytes() == (tmp_path / "reference.tsv").read_bytes()
    # and a folder in the published form (numpy.savetxt's gates, the training run's arguments beside the sizes)
    (tmp_path / "b").mkdir()
    np.savetxt(tmp_path / "b" / DUO_GATES, scores * 1.5 - 0.2, delimiter="\t")
    (tmp_path / "b" / DUO_CONFIG).write_text(json.dumps({"model_name": "m", "lr": 0.02, "sink_size": 128,
                                                         "recent_size": 256, "deploy_sink_size": None}))
    back = read_duo_attention(tmp_path / "b")
    np.testing.assert_array_equal(back.gates, np.clip(scores * 1.5 - 0.2, 0, 1))  # clipped as its readers clip
    assert (back.sink_size, back.recent_size) == (128, 256)


def test_duo_attention_folder_is_made_and_refused_as_other_outputs(tmp_path):
    write_duo_attention(tmp_path / "new", policy(), sink_size=SINK, recent_size=RECENT)
    assert (tmp_path / "new" / DUO_GATES).is_file()
    (tmp_path / "file").write_text("x")
    with pytest.raises(UsageError) as e:
        write_duo_attention(tmp_path / "file", policy(), sink_size=SINK, recent_size=RECENT)
    one_line_error(e, 2, "file", "not a folder")
    with pytest.raises(OutputError) as e:
        write_duo_attention(tmp_path / "missing" / "duo", policy(), sink_size=SINK, recent_size=RECENT)
    one_line_error(e, 1, "does not exist")
    assert not (tmp_path / "missing").exists()
    (tmp_path / "held" / DUO_CONFIG).mkdir(parents=True)  # a folder where config.json goes: nothing is written
    with pytest.raises(UsageError) as e:
        write_duo_attention(tmp_path / "held", policy(), sink_size=SINK, recent_size=RECENT)
    one_line_error(e, 2, DUO_CONFIG, "refusing")
    assert sorted(p.name for p in (tmp_path / "held").iterdir()) == [DUO_CONFIG]


def test_duo_attention_failed_write_leaves_no_folder_and_no_file(tmp_path, monkeypatch):
    import attnviz.io

    real = attnviz.io.save_text

    def failing(path, text):  # the second file cannot be written
        if "config" in path.name:
            raise OSError("disk full")
        real(path, text)

    monkeypatch.setattr(attnviz.io, "save_text", failing)
    with pytest.raises(OSError):
        write_duo_attention(tmp_path / "duo", policy(), sink_size=SINK, recent_size=RECENT)
    assert list(tmp_path.iterdir()) == []  # neither file, nor the folder made for them
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / DUO_GATES).write_text("1\t1\n")
    with pytest.raises(OSError):
        write_duo_attention(tmp_path / "old", policy(), sink_size=SINK, recent_size=RECENT)
    assert [p.name for p in (tmp_path / "old").iterdir()] == [DUO_GATES]
    assert (tmp_path / "old" / DUO_GATES).read_text() == "1\t1\n"  # the file that was there, unchanged


def test_a_command_stages_the_exports_with_its_other_files(tmp_path):
    from attnviz.io import check_outputs, save_text
    from attnviz.staging import staged_outputs

    gates = policy()
    json_file, minference, retrieval = (str(tmp_path / n) for n in ("run.json", "p.json", "r.json"))

    def run(fail: bool) -> None:
        with duo_attention_targets(tmp_path / "duo") as duo:
            targets = check_outputs({"--json-file": json_file, "--export-minference": minference,
                                     "--export-retrieval": retrieval, **duo}, [])
            with staged_outputs(targets) as staged:
                write_duo_attention(tmp_path / "duo", gates, sink_size=SINK, recent_size=RECENT, staged=staged)
                write_minference(minference, gates, heads=HEADS, sink_size=SINK, recent_size=RECENT, length=LENGTH,
                                 staged=staged)
                write_retrieval_scores(retrieval, np.ones((LAYERS, HEADS)), staged=staged)
                save_text(staged["--json-file"], "{}\n")
                if fail:
                    raise InputError("a later step failed")
                staged.commit()

    with pytest.raises(InputError):
        run(fail=True)
    assert list(tmp_path.iterdir()) == []  # nothing at all, the folder included
    run(fail=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["duo", "p.json", "r.json", "run.json"]
    np.testing.assert_array_equal(read_duo_attention(tmp_path / "duo").gates, gates)


# ---------------------------------------------------------------------------------------------------
# MInference, vLLM, SGLang


@pytest.mark.parametrize("ranks", [1, 2, 3])
def test_minference_file_gives_vllm_and_sglang_each_query_heads_pattern(tmp_path, ranks):
    gates = policy(0.5)
    path = tmp_path / "sparse_attention_config.json"
    write_minference(path, gates, heads=HEADS, sink_size=SINK, recent_size=RECENT, length=LENGTH)
    per_rank = HEADS // ranks
    for layer in range(LAYERS):
        sizes = [s for rank in range(ranks) for s in vllm_heads_of_rank(path, layer, per_rank, rank)]
        assert len(sizes) == HEADS
        for head, size in enumerate(sizes):
            streams = gates[layer, head // (HEADS // KV_HEADS)] == 0  # the key-value head it shares
            assert size == ((30 + 100, 100) if streams else (LENGTH, LENGTH)), (layer, head)
            lookup = minference_best_pattern(path, layer)  # MInference's own reader: no head falls to its default
            assert lookup(head)[:3] == ["vertical_and_slash", *((30, 100) if streams else (LENGTH, LENGTH))]
            assert lookup(head)[3] == gates[layer, head // (HEADS // KV_HEADS)]


@pytest.mark.parametrize(("sink", "recent"), [(4, 64), (16, 100), (30, 32), (48, 160)])
def test_minference_streaming_head_keeps_its_sinks_and_recent_keys_in_vllm(tmp_path, sink, recent):
    path = tmp_path / "p.json"
    gates = np.zeros((1, KV_HEADS))
    gates[0, 1] = 1
    write_minference(path, gates, heads=HEADS, sink_size=sink, recent_size=recent, length=LENGTH)
    sizes = vllm_heads_of_rank(path, 0, HEADS, 0)
    streaming, full = sizes[0], sizes[-1]  # query head 0 shares key-value head 0, the last head the last
    rng = np.random.default_rng(0)
    k_len = 1000
    # all its sinks and recent keys where they fit in the 30 columns and 100 diagonals vLLM always keeps; past
    # those, as many columns and diagonals, the rest chosen by attention (MInference's pattern has no more)
    wanted = set(range(min(sink, 30))) | set(range(k_len - min(recent, 100), k_len))
    for _ in range(50):  # whatever order torch.topk breaks the ties among the forced columns and diagonals in
        kept = vllm_last_row_keys(*streaming, k_len, rng)
        assert wanted <= kept and len(kept) <= sum(streaming)
        assert vllm_last_row_keys(*full, k_len, rng) == set(range(k_len))


def test_vllm_transcription_catches_sizes_below_the_forced_ones():
    """The sizes taken as they are (vertical = 16 sink keys, slash = 64 recent) keep an arbitrary 16 of the first
    30 columns: the check above would fail for them."""
    rng = np.random.default_rng(0)
    wanted = set(range(16)) | set(range(1000 - 64, 1000))
    assert any(not wanted <= vllm_last_row_keys(16, 64, 1000, rng) for _ in range(50))


def test_minference_takes_gates_per_query_head_and_a_threshold(tmp_path):
    path = tmp_path / "p.json"
    scores = np.linspace(0, 1, LAYERS * HEADS).reshape(LAYERS, HEADS)
    write_minference(path, scores, heads=HEADS, sink_size=SINK, recent_size=RECENT, length=LENGTH, threshold=0.7)
    back = read_minference(path)
    np.testing.assert_array_equal(back.vertical == LENGTH, scores >= 0.7)
    np.testing.assert_array_equal(back.slash, np.where(scores >= 0.7, LENGTH, 100))
    np.testing.assert_array_equal(back.score, scores)
    assert (back.patterns == "vertical_and_slash").all()
    # one layer a line, and JSON whole
    assert path.read_text().count("\n") == LAYERS + 2 and len(json.loads(path.read_text())) == LAYERS


def test_minference_round_trip_of_a_policy(tmp_path):
    gates = policy(0.25, seed=3)
    write_minference(tmp_path / "p.json", gates, heads=HEADS, sink_size=200, recent_size=300, length=4096)
    back = read_minference(tmp_path / "p.json")
    expected = np.repeat(gates, HEADS // KV_HEADS, axis=1)
    assert back.vertical.shape == (LAYERS, HEADS)
    np.testing.assert_array_equal(back.vertical, np.where(expected == 1, 4096, 200))
    np.testing.assert_array_equal(back.slash, np.where(expected == 1, 4096, 300))


# ---------------------------------------------------------------------------------------------------
# Retrieval scores


def test_retrieval_scores_read_back_in_retrieval_head_and_headkv(tmp_path):
    rng = np.random.default_rng(2)
    scores = rng.random((LAYERS, HEADS, 5)) * (rng.random((LAYERS, HEADS, 1)) < 0.5)
    scores[0, 0] = 0
    path = tmp_path / "scores.json"
    write_retrieval_scores(path, scores)
    text = path.read_text()
    assert text.count("\n") == 1 and text.endswith("\n")  # one line: both read file.readline()
    assert list(json.loads(text))[:HEADS + 1] == [*(f"0-{h}" for h in range(HEADS)), "1-0"]

    means = scores.mean(-1)
    top = retrieval_head_top(path, 5)
    assert [means[layer, head] for layer, head in top] == sorted(means.ravel(), reverse=True)[:5]
    np.testing.assert_allclose(headkv_total_attention(path, LAYERS, HEADS), means / means.sum(), rtol=1e-12)
    np.testing.assert_allclose(headkv_total_attention(path, LAYERS, HEADS, temp=2), means**2 / (means**2).sum(),
                               rtol=1e-12)
    np.testing.assert_array_equal(read_retrieval_scores(path), scores)


def test_retrieval_scores_of_one_run(tmp_path):
    write_retrieval_scores(tmp_path / "s.json", np.full((2, 3), 0.25))
    assert json.loads((tmp_path / "s.json").read_text())["1-2"] == [0.25]
    assert read_retrieval_scores(tmp_path / "s.json").shape == (2, 3, 1)


# ---------------------------------------------------------------------------------------------------
# Errors


@pytest.mark.parametrize(("tsv", "config", "words"), [
    ("1\t0\nx\t1\n", {"sink_size": 4, "recent_size": 8}, ["line 2", "'x' is not a number"]),
    ("1\t0\n1\n", {"sink_size": 4, "recent_size": 8}, ["line 2 holds 1 gates, line 1 2"]),
    ("", {"sink_size": 4, "recent_size": 8}, ["no gates"]),
    ("1\tnan\n", {"sink_size": 4, "recent_size": 8}, ["layer 0 head 1 is nan"]),
    ("1\t0\n", {"recent_size": 8}, ["config.json", "no sink_size"]),
    ("1\t0\n", {"sink_size": 4, "recent_size": 0}, ["recent_size 0", "at least 1"]),
    ("1\t0\n", {"sink_size": 4.5, "recent_size": 8}, ["sink_size 4.5"]),
    ("1\t0\n", [4, 8], ["holds a JSON object"]),
    ("1\t0\n", "{not json", ["not JSON"]),
])
def test_malformed_duo_attention_folders(tmp_path, tsv, config, words):
    (tmp_path / DUO_GATES).write_text(tsv)
    (tmp_path / DUO_CONFIG).write_text(config if isinstance(config, str) else json.dumps(config))
    with pytest.raises(InputError) as e:
        read_duo_attention(tmp_path)
    one_line_error(e, 1, str(tmp_path), *words)


def test_duo_attention_reader_wants_the_folder(tmp_path):
    (tmp_path / "f.tsv").write_text("1\n")
    with pytest.raises(UsageError) as e:
        read_duo_attention(tmp_path / "f.tsv")
    one_line_error(e, 2, "a file", DUO_GATES)
    with pytest.raises(UsageError) as e:
        read_duo_attention(tmp_path)  # a folder without the files
    one_line_error(e, 2, DUO_GATES, "no such file")


@pytest.mark.parametrize(("doc", "words"), [
    ({"0": ["vertical_and_slash", 1, 2, 0.5]}, ["a list with one object per layer"]),
    ([], ["a list with one object per layer"]),
    ([["vertical_and_slash", 1, 2, 0.5]], ["layer 0 is not an object"]),
    ([{"0": ["vertical_and_slash", 1, 2, 0.5]}, {"0": ["vertical_and_slash", 1, 2, 0.5], "1": ["a_shape", 1, 2, 0]}],
     ["layer 1 holds 2 heads, layer 0 1"]),
    ([{"0": ["vertical_and_slash", 1, 2, 0.5], "2": ["vertical_and_slash", 1, 2, 0.5]}], ["layer 0 has no head 1"]),
    ([{"h": ["vertical_and_slash", 1, 2, 0.5]}], ["'h' is not a head's number"]),
    ([{"0": ["a_shape", 1, 2, 0.5]}], ["layer 0 head 0", "vertical_and_slash, stream_llm, block_sparse"]),
    ([{"0": ["vertical_and_slash", 0, 2, 0.5]}], ["layer 0 head 0", "at least 1"]),
    ([{"0": ["vertical_and_slash", 1.5, 2, 0.5]}], ["layer 0 head 0"]),
    ([{"0": ["vertical_and_slash", 1, 2]}], ["layer 0 head 0"]),
])
def test_malformed_minference_files(tmp_path, doc, words):
    (tmp_path / "p.json").write_text(json.dumps(doc))
    with pytest.raises(InputError) as e:
        read_minference(tmp_path / "p.json")
    one_line_error(e, 1, "p.json", *words)


@pytest.mark.parametrize(("text", "words"), [
    ('["0-0"]', ["holds a JSON object"]),
    ('{"0-0": [1],\n "0-1": [1]}', ["JSON over 2 lines", "one line"]),
    ('{"0-0": [1], "0.1": [1]}', ["'0.1' does not name a head"]),
    ('{"0-0": [1], "0-1": "1"}', ["'0-1' is", "a list of scores"]),
    ('{"0-0": [1], "0-1": []}', ["a list of scores"]),
    ('{"0-0": [1], "0-1": [true]}', ["a list of scores"]),
    ('{"0-0": [1], "1-1": [1]}', ["no scores for 0-1"]),
    ('{"0-0": [1, 2], "0-1": [1]}', ["1 to 2 runs"]),
    ('{"0-1": [1], "0-0": [1]}', ["'0-0' comes after 0-1", "file's order"]),
    ('{"0-0": [1], ', ["not JSON"]),
])
def test_malformed_retrieval_score_files(tmp_path, text, words):
    (tmp_path / "s.json").write_text(text)
    with pytest.raises(InputError) as e:
        read_retrieval_scores(tmp_path / "s.json")
    one_line_error(e, 1, "s.json", *words)


@pytest.mark.parametrize(("call", "words"), [
    (lambda p: write_duo_attention(p, [[0.5, 2.0]], sink_size=1, recent_size=1), ["layer 0 head 1 is 2.0", "[0, 1]"]),
    (lambda p: write_duo_attention(p, [[0.5, np.nan]], sink_size=1, recent_size=1), ["layer 0 head 1 is nan"]),
    (lambda p: write_duo_attention(p, [0, 1], sink_size=1, recent_size=1), ["gates [2]", "[layers, key-value heads]"]),
    (lambda p: write_duo_attention(p, [["a"]], sink_size=1, recent_size=1), ["gates"]),
    (lambda p: write_duo_attention(p, [[1]], sink_size=-1, recent_size=1), ["sink_size -1"]),
    (lambda p: write_duo_attention(p, [[1]], sink_size=1, recent_size=0), ["recent_size 0", "at least 1"]),
    (lambda p: write_duo_attention(p, [[1]], sink_size=1, recent_size=1, extra={"x": object()}), ["JSON"]),
    (lambda p: write_minference(p, [[1, 0]], heads=3, sink_size=1, recent_size=1, length=200),
     ["heads 3", "2 key-value heads"]),
    (lambda p: write_minference(p, [[1, 0]], heads=4, sink_size=1, recent_size=1, length=100),
     ["length 100", "must exceed"]),
    (lambda p: write_minference(p, [[1, 0]], heads=4, sink_size=1, recent_size=1, length=200, threshold=0),
     ["threshold 0"]),
    (lambda p: write_retrieval_scores(p, np.ones(3)), ["scores [3]"]),
    (lambda p: write_retrieval_scores(p, -np.ones((2, 2))), ["at least 0"]),
])
def test_bad_arguments_write_nothing(tmp_path, call, words):
    with pytest.raises(UsageError) as e:
        call(tmp_path / "out")
    one_line_error(e, 2, *words)
    assert list(tmp_path.iterdir()) == []


def test_single_file_exports_refuse_a_directory_and_replace_a_file(tmp_path):
    (tmp_path / "d.json").mkdir()
    with pytest.raises(UsageError) as e:
        write_minference(tmp_path / "d.json", policy(), heads=HEADS, sink_size=SINK, recent_size=RECENT,
                         length=LENGTH)
    one_line_error(e, 2, "--export-minference", "is a directory")
    (tmp_path / "s.json").write_text("old")
    write_retrieval_scores(tmp_path / "s.json", np.ones((1, 1)))
    assert read_retrieval_scores(tmp_path / "s.json").tolist() == [[[1.0]]]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d.json", "s.json"]  # no staged file left

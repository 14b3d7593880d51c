"""Generation dumps and words (issue 20): ``--generation`` stitches ``generate()``'s attentions into the
maps of the model's own full forward pass over the final sequence, for every saved form, decoder-only
(a left-padded batch) and encoder-decoder (decoder self- and cross-attention); ``--merge-subwords``
against hand-checkable examples of each convention and against inseq's rule on random maps; bad dumps
and label counts as one clear line."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from attnviz.cli import app
from attnviz.subwords import merge, words
from tests.conftest import LazyModule

runner = CliRunner()


def invoke(*args):
    r = runner.invoke(app, list(args))
    assert "Traceback" not in r.stderr
    return r


# ----------------------------------------------------------------------------------------------
# Sub-word merging


@pytest.mark.parametrize("labels,style,expected", [
    (["[CLS]", "play", "##ing", "dog", "##s", "[SEP]"], "wordpiece", ["[CLS]", "playing", "dogs", "[SEP]"]),
    (["<s>", "▁play", "ing", "▁dog", "s", "</s>"], "sentencepiece", ["<s>", "playing", "dogs", "</s>"]),
    (["<|endoftext|>", "play", "ing", "Ġdog", "s", "Ċ"], "bpe", ["<|endoftext|>", "playing", "dogs", ""]),
])
def test_each_convention_by_hand(labels, style, expected):
    found = words(labels)
    assert found.style == style and found.labels == expected
    assert found.spans == [(0, 1), (1, 3), (3, 5), (5, 6)]
    # a hand-checkable map: row i puts weight 1 on key i
    eye = np.eye(6, dtype=np.float32)
    merged = merge(eye, found, found)
    # word rows average their pieces' rows; key pieces sum: "playing" (pieces 1, 2) puts 0.5 + 0.5 on itself
    np.testing.assert_allclose(merged, np.eye(4), atol=1e-7)
    a = np.zeros((6, 6), np.float32)
    a[1, 0], a[1, 3] = 0.25, 0.75  # piece "play" -> [CLS] 0.25, "dog" 0.75
    a[2, 4] = 1.0  # piece "ing" -> "s"
    merged = merge(a, found, found)
    np.testing.assert_allclose(merged[1], [0.125, 0, 0.875, 0], atol=1e-7)  # (0.25, 0.75 + 1) / 2


def test_the_readme_example_by_hand():
    a = np.array([[1, 0, 0], [0.2, 0.3, 0.5], [0.4, 0.4, 0.2]], dtype=np.float32)
    found = words(["[CLS]", "play", "##ing"])
    np.testing.assert_allclose(merge(a, found, found), [[1, 0], [0.3, 0.7]], atol=1e-7)


def inseq_rule(a, q_groups, k_groups):
    """Sum the key pieces of each word, average its query pieces, renormalise each row (loops)."""
    out = np.zeros((len(q_groups), len(k_groups)))
    for i, qs in enumerate(q_groups):
        for j, ks in enumerate(k_groups):
            out[i, j] = np.mean([sum(a[q, k] for k in ks) for q in qs])
        if out[i].sum() > 0:
            out[i] /= out[i].sum()
    return out


def test_merge_equals_inseq_rule_on_random_maps():
    rng = np.random.default_rng(0)
    for _ in range(20):
        n = int(rng.integers(2, 12))
        labels = [("##" if i and rng.random() < 0.4 else "") + f"t{i}" for i in range(n)]
        found = words(labels, "wordpiece")
        groups = [list(range(s, e)) for s, e in found.spans]
        a = rng.dirichlet(np.ones(n), size=(3, n)).astype(np.float32)
        a[0, -1] = 0  # a padded row stays zero
        ours = merge(a, found, found)
        for h in range(3):
            np.testing.assert_allclose(ours[h], inseq_rule(a[h], groups, groups), atol=1e-6)


def test_inspect_and_rollout_merge_and_say_which_pieces(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    a = np.random.default_rng(1).dirichlet(np.ones(6), size=(2, 1, 3, 6)).astype(np.float32)  # [L, B, H, 6, 6]
    np.save("w.npy", a)
    (tmp_path / "tok.txt").write_text("[CLS]\nplay\n##ing\ndog\n##s\n[SEP]\n")
    r = invoke("inspect", "w.npy", "--labels", "tok.txt", "--merge-subwords", "--json", "--check-rows",
               "--save-maps", "words.safetensors")
    assert r.exit_code == 0, r.stderr
    doc = json.loads(r.stdout)
    from attnviz.inspection.weights import load_weights

    saved = load_weights("words.safetensors").data  # the maps inspected: the words'
    assert saved.shape == (2, 1, 3, 4, 4) and doc["files"]["maps"] == "words.safetensors"
    pieces = np.array([[1, 0, 0, 0], [0, 1, 0, 0], [0, 1, 0, 0], [0, 0, 1, 0], [0, 0, 1, 0], [0, 0, 0, 1]])
    np.testing.assert_allclose(saved[:, :, :, 1], a[:, :, :, 1:3].mean(axis=3) @ pieces, atol=1e-6)  # "playing"
    assert doc["labels"]["q"] == ["[CLS]", "playing", "dogs", "[SEP]"]
    assert doc["words"]["q"][1] == {"word": "playing", "pieces": [1, 3]} and doc["weights_shape"][-2:] == [4, 4]
    assert "merged 6 pieces into 4 words" in r.stderr
    r = invoke("rollout", "w.npy", "--labels", "tok.txt", "--merge-subwords", "--json")
    assert r.exit_code == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["labels"] == ["[CLS]", "playing", "dogs", "[SEP]"] and doc["words"]["style"] == "wordpiece"
    r = invoke("inspect", "w.npy", "--merge-subwords")
    assert r.exit_code == 1 and "--merge-subwords merges the pieces the labels name" in r.stderr
    (tmp_path / "plain.txt").write_text("a\nb\nc\nd\ne\nf\n")
    r = invoke("inspect", "w.npy", "--labels", "plain.txt", "--merge-subwords")
    assert r.exit_code == 2 and "--subword-style" in r.stderr


def test_compute_command_merges_its_weights(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    rng = np.random.default_rng(2)
    for n in "qkv":
        np.save(f"{n}.npy", rng.normal(size=(6, 8)).astype(np.float32))
    (tmp_path / "tok.txt").write_text("<s>\n▁play\ning\n▁dog\ns\n</s>\n")
    r = invoke("scaled", "q.npy", "k.npy", "v.npy", "--labels", "tok.txt", "--save-weights", "pieces.npy", "--quiet")
    assert r.exit_code == 0, r.stderr
    r = invoke("scaled", "q.npy", "k.npy", "v.npy", "--labels", "tok.txt", "--merge-subwords", "--save-weights",
               "words.npy", "--json")
    assert r.exit_code == 0, r.stderr
    found = words(["<s>", "▁play", "ing", "▁dog", "s", "</s>"])
    np.testing.assert_allclose(np.load("words.npy"), merge(np.load("pieces.npy"), found, found), atol=1e-7)
    assert json.loads(r.stdout)["labels"]["q"] == ["<s>", "playing", "dogs", "</s>"]


# ----------------------------------------------------------------------------------------------
# Generation dumps against the model's full forward pass

torch = LazyModule("torch")  # imported when a test first uses it: not while every worker collects
transformers = LazyModule("transformers")


def save_forms(attentions, folder):
    """The README's saved forms: torch.save of out.attentions, and .npz / .safetensors keyed STEP.LAYER."""
    from safetensors.numpy import save_file

    torch.save(attentions, folder / "gen.pt")
    flat = {f"{s}.{layer}": a.float().numpy() for s, step in enumerate(attentions) for layer, a in enumerate(step)}
    np.savez(folder / "gen.npz", **flat)
    save_file({k: np.ascontiguousarray(v) for k, v in flat.items()}, str(folder / "gen.safetensors"))
    return ["gen.pt", "gen.npz", "gen.safetensors"]


@pytest.fixture(scope="module")
def decoder_only(tmp_path_factory):
    folder = tmp_path_factory.mktemp("gen")
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=50, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=2, intermediate_size=48, max_position_embeddings=64,
                                      pad_token_id=0, bos_token_id=1, eos_token_id=None)
    config._attn_implementation = "eager"
    model = transformers.LlamaForCausalLM(config).eval()
    ids = torch.randint(3, 50, (2, 6), generator=torch.Generator().manual_seed(1))
    mask = torch.ones(2, 6, dtype=torch.long)
    mask[1, :2], ids[1, :2] = 0, 0  # the second prompt is left-padded
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=5, do_sample=False,
                             output_attentions=True, return_dict_in_generate=True)
        full = torch.cat([mask, torch.ones(2, out.sequences.shape[1] - 6, dtype=torch.long)], -1)
        ref = model(input_ids=out.sequences[:, :-1], attention_mask=full[:, :-1], output_attentions=True)
    forms = save_forms(out.attentions, folder)
    np.save(folder / "prompt_mask.npy", mask.numpy())
    (folder / "tokens.txt").write_text("\n".join(f"Ġt{int(t)}" for t in out.sequences[0]) + "\n")
    return folder, forms, torch.stack(ref.attentions).numpy(), full[:, :-1].numpy().astype(bool)


@pytest.mark.parametrize("form", [0, 1, 2])
def test_stitched_generation_equals_the_full_forward_pass(decoder_only, form, monkeypatch):
    folder, forms, ref, real = decoder_only
    monkeypatch.chdir(folder)
    from attnviz.inspection.weights import load_weights

    w = load_weights(forms[form], generation=True)
    assert w.shape == ref.shape  # [layers, batch, heads, 10, 10]: 6 prompt tokens, 5 steps
    cells = real[None, :, None, :, None] & real[None, :, None, None, :]
    np.testing.assert_allclose(np.where(cells, w.data, 0), np.where(cells, ref, 0), atol=1e-6)
    r = invoke("inspect", forms[form], "--generation", "--mask", "prompt_mask.npy", "--labels", "tokens.txt",
               "--check-rows", "--check-causal", "--json", "--save-maps", "stitched.npz")
    assert r.exit_code == 0, r.stderr
    np.testing.assert_array_equal(np.load("stitched.npz")["weights"], w.data)  # the maps inspect stitched
    doc = json.loads(r.stdout)
    assert doc["generation"] == {"steps": 5, "layers": 2, "prompt_rows": 6, "attention": "self"}
    assert len(doc["labels"]["q"]) == 10  # the 11 tokens of out.sequences, the last never a query
    assert "a generation of 5 steps x 2 layers" in r.stderr


def test_the_readme_command_draws_prompt_and_generated_words(decoder_only, monkeypatch):
    folder, forms, _, _ = decoder_only
    monkeypatch.chdir(folder)
    r = invoke("inspect", "gen.pt", "--generation", "--labels", "tokens.txt", "--merge-subwords", "--png", "gen.png")
    assert r.exit_code == 0, r.stderr
    assert (folder / "gen.png").stat().st_size > 1000
    r = invoke("rollout", "gen.pt", "--generation", "--mask", "prompt_mask.npy", "--json")
    assert r.exit_code == 0, r.stderr
    r = invoke("compare", "gen.pt", "gen.npz", "--generation", "--atol", "1e-6")
    assert r.exit_code == 0, r.stderr


def test_encoder_decoder_self_and_cross_attention(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    torch.manual_seed(0)
    config = transformers.BartConfig(vocab_size=50, d_model=32, encoder_layers=2, decoder_layers=2,
                                     encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=48,
                                     decoder_ffn_dim=48, max_position_embeddings=64, pad_token_id=1,
                                     decoder_start_token_id=2, eos_token_id=None, forced_eos_token_id=None)
    config._attn_implementation = "eager"
    model = transformers.BartForConditionalGeneration(config).eval()
    ids = torch.randint(3, 50, (2, 7), generator=torch.Generator().manual_seed(1))
    mask = torch.ones(2, 7, dtype=torch.long)
    mask[1, 5:] = 0  # the second source is right-padded
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=4, do_sample=False, num_beams=1,
                             output_attentions=True, return_dict_in_generate=True)
        ref = model(input_ids=ids, attention_mask=mask, decoder_input_ids=out.sequences[:, :-1],
                    output_attentions=True)
    torch.save(out.decoder_attentions, "self.pt")
    torch.save(out.cross_attentions, "cross.pt")
    from attnviz.inspection.weights import load_weights

    w = load_weights("self.pt", generation=True)
    assert w.generation.kind == "self"
    np.testing.assert_allclose(w.data, torch.stack(ref.decoder_attentions).numpy(), atol=1e-6)
    c = load_weights("cross.pt", generation=True)
    assert c.generation.kind == "cross"
    real = mask.numpy().astype(bool)[None, :, None, None, :]
    np.testing.assert_allclose(np.where(real, c.data, 0), np.where(real, torch.stack(ref.cross_attentions).numpy(),
                                                                      0), atol=1e-6)
    np.save("src_mask.npy", mask.numpy())
    r = invoke("inspect", "cross.pt", "--generation", "--key-padding-mask", "src_mask.npy", "--check-rows")
    assert r.exit_code == 0, r.stderr


@pytest.mark.parametrize("drop,code,words_", [
    ("2.1", 1, ["step 2 has no layer 1"]),
    ("3.*", 1, ["generation step 3 is missing"]),
])
def test_broken_dumps_are_one_clear_line(decoder_only, tmp_path, monkeypatch, drop, code, words_):
    folder, _, _, _ = decoder_only
    monkeypatch.chdir(tmp_path)
    import fnmatch

    arrays = dict(np.load(folder / "gen.npz"))
    np.savez("broken.npz", **{k: v for k, v in arrays.items() if not fnmatch.fnmatch(k, drop)})
    r = invoke("inspect", "broken.npz", "--generation")
    assert r.exit_code == code, r.stderr
    assert r.stderr.startswith("attnviz: error: ") and r.stderr.count("\n") <= 2
    for word in words_:
        assert word in r.stderr, r.stderr


def test_wrong_label_count_and_no_step_keys(decoder_only, tmp_path, monkeypatch):
    folder, _, _, _ = decoder_only
    monkeypatch.chdir(tmp_path)
    (tmp_path / "few.txt").write_text("a\nb\nc\n")
    r = invoke("inspect", str(folder / "gen.pt"), "--generation", "--labels", "few.txt")
    assert r.exit_code == 1 and "3 labels for 10" in r.stderr, r.stderr
    np.savez("plain.npz", attn=np.ones((2, 2), np.float32))
    r = invoke("inspect", "plain.npz", "--generation")
    assert r.exit_code == 1 and "STEP.LAYER" in r.stderr and "attn" in r.stderr, r.stderr
    r = invoke("inspect", str(folder / "gen.pt"), "--generation", "--layout", "batch,head,q,k")
    assert r.exit_code == 2 and "--layout" in r.stderr

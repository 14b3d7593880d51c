"""Regenerate the files in sample_inputs/ (run from anywhere: python sample_inputs/make_samples.py
[OUT_DIR]).

* ``q.npy``, ``k.npy``, ``v.npy`` (and ``q.json``, ``k.json``, ``v.json``, and the bundle
  ``seed_example.npz``): the worked example of the scaled dot-product seed note (the TensorFlow
  Transformer tutorial's ``temp_q``, ``temp_k``, ``temp_v``). ``attnviz scaled`` on them gives the
  weights [[0, 0, .5, .5], [0, 1, 0, 0], [.5, .5, 0, 0]] and the output
  [[550, 5.5], [10, 0], [5.5, 0]].
* ``sentence.npz``: a small two-head self-attention example over the sentence "the cat sat on the
  mat ." with token labels: q, k, v of shape [2 heads, 7 tokens, 8], plus q_labels and k_labels.
  Head 0 is built to attend to the previous token, head 1 to attend from each word to the nouns
  ("cat", "mat"); a little seeded noise keeps it realistic.
* ``tokens.txt``: the sentence's tokens, one a line (for --labels).
* ``padding_mask.npy``: a keep mask [4] for the seed example that masks the last key.
* ``batch_attn.npz``: attention weights as ``numpy.savez(f, *out.attentions)`` saves a BERT-style model's on
  a padded batch of two sentences: two layers (``arr_0``, ``arr_1``) of [2 entries, 4 heads, 9, 9]; padded keys
  get 0 and padded query rows attend the real keys, as BERT's do. The heads are built: previous token, next
  token, [SEP] sink, broad; [CLS] sink, the same word, itself, the nouns.
* ``batch_tokens.json``: the tokens of each entry, one list per entry (``--labels``); ``attention_mask.npy``
  the batch's attention_mask [2, 9] (``--mask``).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent


def seed_example() -> dict[str, np.ndarray]:
    k = np.array([[10, 0, 0], [0, 10, 0], [0, 0, 10], [0, 0, 10]], dtype=np.float32)
    v = np.array([[1, 0], [10, 0], [100, 5], [1000, 6]], dtype=np.float32)
    q = np.array([[0, 0, 10], [0, 10, 0], [10, 10, 0]], dtype=np.float32)
    return {"q": q, "k": k, "v": v}


def sentence() -> dict[str, np.ndarray]:
    tokens = ["the", "cat", "sat", "on", "the", "mat", "."]
    n, d = len(tokens), 8
    rng = np.random.default_rng(7)
    # head 0: query i points along key i-1 (the previous token); token 0 along its own key.
    # Keys are orthonormal rows, so the score of the intended key stands out.
    k0 = np.linalg.qr(rng.normal(size=(d, d)))[0][:n]
    previous = np.maximum(np.arange(n) - 1, 0)
    q0 = 9.0 * k0[previous]
    # head 1: every query looks for nouns
    noun = np.array([0, 1, 0, 0, 0, 1, 0], dtype=float)
    k1 = rng.normal(scale=0.3, size=(n, d))
    k1[:, 0] += 4.0 * noun
    q1 = np.tile([1.2] + [0.0] * (d - 1), (n, 1)) + rng.normal(scale=0.2, size=(n, d))
    q = np.stack([q0, q1]) + rng.normal(scale=0.05, size=(2, n, d))
    k = np.stack([k0, k1])
    v = rng.normal(size=(2, n, d))
    return {
        "q": q.astype(np.float32),
        "k": k.astype(np.float32),
        "v": v.astype(np.float32),
        "q_labels": np.array(tokens),
        "k_labels": np.array(tokens),
    }


BATCH = [["[CLS]", "the", "cat", "sat", "on", "the", "mat", ".", "[SEP]"],
         ["[CLS]", "a", "dog", "ran", ".", "[SEP]", "[PAD]", "[PAD]", "[PAD]"]]


def padded_batch() -> tuple[list[np.ndarray], np.ndarray]:
    """Two layers of [2, 4, 9, 9] over ``BATCH`` (module docstring), and the attention_mask [2, 9]."""
    rng = np.random.default_rng(11)
    n = len(BATCH[0])
    mask = np.array([[t != "[PAD]" for t in row] for row in BATCH], dtype=np.int64)
    i, j = np.arange(n)[:, None], np.arange(n)[None, :]
    layers = []
    for layer in range(2):
        scores = rng.normal(scale=0.3, size=(2, 4, n, n))
        for b, row in enumerate(BATCH):
            real = int(mask[b].sum())
            sep = row.index("[SEP]")
            nouns = np.array([t in ("cat", "mat", "dog") for t in row])
            same = np.array([[a == c and a not in ("[PAD]",) for c in row] for a in row])
            if layer == 0:
                patterns = [j == np.maximum(i - 1, 0), j == np.minimum(i + 1, real - 1),
                            np.broadcast_to(j == sep, (n, n)), np.zeros((n, n), bool)]
            else:
                patterns = [np.broadcast_to(j == 0, (n, n)), same, i == j, np.broadcast_to(nouns[None, :], (n, n))]
            for h, pattern in enumerate(patterns):
                scores[b, h] += 4.0 * pattern
        scores = np.where(mask[:, None, None, :] == 1, scores, -np.inf)
        weights = np.exp(scores - scores.max(-1, keepdims=True))
        layers.append((weights / weights.sum(-1, keepdims=True)).astype(np.float32))
    return layers, mask


def main(out: Path = HERE) -> None:
    ex = seed_example()
    for name, arr in ex.items():
        np.save(out / f"{name}.npy", arr)
        (out / f"{name}.json").write_text(json.dumps(arr.tolist()) + "\n")
    np.savez(out / "seed_example.npz", **ex)
    np.save(out / "padding_mask.npy", np.array([1, 1, 1, 0], dtype=np.int8))
    s = sentence()
    np.savez(out / "sentence.npz", **s)
    (out / "tokens.txt").write_text("\n".join(s["q_labels"].tolist()) + "\n")
    layers, mask = padded_batch()
    np.savez(out / "batch_attn.npz", *layers)
    np.save(out / "attention_mask.npy", mask)
    (out / "batch_tokens.json").write_text(json.dumps(BATCH) + "\n")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else HERE)

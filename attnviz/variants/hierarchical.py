"""Hierarchical attention (Yang et al. 2016, "Hierarchical Attention Networks for Document
Classification"): words attend into sentence vectors, sentences into a document vector.

    word level:      u_it = tanh(h_it W_w + b_w),  a_it = softmax_t(u_it . u_w),  s_i = sum_t a_it h_it
    sentence level:  u_i = tanh(s_i W_s + b_s),    b_i = softmax_i(u_i . u_s),    v = sum_i b_i s_i

Input DOC ``[..., n_sent, n_word, d]``: word annotations (normally the outputs of a word encoder),
or a JSON document of tokenised sentences with their vectors,
``{"sentences": [{"tokens": ["the", "cat"], "vectors": [[...], [...]]}, ...]}``, which is padded to
the longest sentence with a word mask, and labels each sentence by its words;
the paper runs a sentence encoder over ``s_i``, here ``s_i`` is used directly. The weights are the
word weights ``[..., n_sent, n_word]`` (one row per sentence); the output is the sentence vectors
``[..., n_sent, d]``; map ``sentence_weights [..., n_sent]`` (shown beside the word weights in the
table and the PNG) and map ``document [..., d]``. A word mask is ``--mask [..., n_sent, n_word]``
(1 = a real word); a sentence with no real word is padding: zero word weights and zero sentence
weight.

Parameters: ``W_w [d, d_a]``, ``b_w [d_a]``, ``u_w [d_a]``, ``W_s [d, d_s]``, ``b_s [d_s]``, ``u_s [d_s]``
(biases optional; --units sets d_a = d_s when drawing).

Reference example (spec section 7): sentences [[1,0],[0,1],[2,0]] and [[0,0],[1,1],[0,2]], W_w = W_s =
I, u_w = [1, 0], u_s = [0, 1]: word weights [[0.371568, 0.173493, 0.454939], [0.241447, 0.517105,
0.241447]], sentence weights [0.356676, 0.643324], document [0.789727, 0.705205].
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from attnviz.params import ParamSpec, bias
from attnviz.variants.base import (
    Context,
    InputSpec,
    Problem,
    Result,
    View,
    masked_softmax,
    read_units,
    require_rank,
    units_field,
    variant,
)

if TYPE_CHECKING:
    import numpy as np

    from attnviz.io import Loaded
    from attnviz.masks import Mask


def read_tokenised(opened: Any) -> dict[str, Loaded] | None:
    """A JSON document of tokenised sentences with vectors, as the DOC array, a word mask and
    sentence labels; None for anything else (read as a plain array)."""
    import numpy as np

    from attnviz.errors import InputError, shape_str
    from attnviz.io import Loaded, validate_array

    raw, source = opened.raw, opened.source
    if not (isinstance(raw, dict) and "sentences" in raw):
        return None
    sentences = raw["sentences"]
    if not isinstance(sentences, list) or not sentences:
        raise InputError(f'{source}: "sentences" must be a non-empty list of {{"tokens": [...], "vectors": [...]}}.')
    rows, tokens = [], []
    for n, sentence in enumerate(sentences):
        if not isinstance(sentence, dict) or "vectors" not in sentence:
            raise InputError(f'{source}: sentence {n} needs "vectors" (one per token) and "tokens".')
        try:
            vectors = np.array(sentence["vectors"], dtype=np.float64)
        except (ValueError, TypeError):
            raise InputError(f"{source}: sentence {n}: the vectors are not a rectangular list of numbers.") from None
        words = [str(t) for t in sentence.get("tokens", [])] or [str(i) for i in range(len(vectors))]
        if vectors.ndim != 2 or len(words) != len(vectors) or not len(vectors):
            raise InputError(f"{source}: sentence {n} has {len(words)} tokens and vectors of shape "
                             f"{shape_str(vectors.shape)}; expected one vector [d] per token.")
        rows.append(vectors)
        tokens.append(words)
    widths = {r.shape[1] for r in rows}
    if len(widths) != 1:
        raise InputError(f"{source}: the word vectors have different sizes ({', '.join(map(str, sorted(widths)))}).")
    longest = max(len(r) for r in rows)
    doc = np.zeros((len(rows), longest, widths.pop()))
    mask = np.zeros((len(rows), longest), np.int8)
    for n, r in enumerate(rows):
        doc[n, :len(r)] = r
        mask[n, :len(r)] = 1
    validate_array(doc, source)
    labels = [" ".join(words)[:24] for words in tokens]
    return {"doc": Loaded(doc, source, opened.path),
            "mask": Loaded(mask, f"{source} (word mask)", opened.path),
            "q_labels": Loaded(np.empty(0), f"{source} (sentences)", opened.path, labels)}


@dataclass
class Params:
    units: int | None = units_field("d_a = d_s, the width of the attention layers")


def check(inputs: Mapping[str, Loaded], params: Params, given: Mapping[str, np.ndarray] | None) -> Problem:
    doc = inputs["doc"]
    require_rank(doc, "DOC", 3, "[..., n_sent, n_word, d]")
    lead, (n_sent, n_word, d) = doc.data.shape[:-3], doc.data.shape[-3:]
    d_a = read_units(given, "W_w", params.units, also={"b_w": 0, "u_w": 0})
    d_s = read_units(given, "W_s", params.units, also={"b_s": 0, "u_s": 0})
    specs = {"W_w": ParamSpec((d, d_a)), "b_w": bias(d_a), "u_w": ParamSpec((d_a,)),
             "W_s": ParamSpec((d, d_s)), "b_s": bias(d_s), "u_s": ParamSpec((d_s,))}
    params.units = d_a
    return Problem((*lead, n_sent, n_word), specs)


def compute(ctx: Context, arrays: Mapping[str, np.ndarray], mask: Mask, params: Params,
            learned: Mapping[str, np.ndarray]) -> Result:
    import numpy as np

    from attnviz.masks import Mask
    from attnviz.variants.base import check_finite_result

    tf = ctx.tf
    p = {name: ctx.tensor(value) for name, value in learned.items()}
    shape = arrays["doc"].shape[:-1]
    word_keep = None if mask.keep is None else np.broadcast_to(mask.keep, shape)
    sentence_keep = None if word_keep is None else np.asarray(word_keep.any(axis=-1))
    with tf.device(ctx.device.tf_name):
        h = ctx.tensor(arrays["doc"])  # [..., S, W, d]
        word_logits = tf.tensordot(tf.tanh(tf.tensordot(h, p["W_w"], axes=1) + p["b_w"]), p["u_w"], axes=1)
        words = masked_softmax(ctx, word_logits, Mask(word_keep, mask.bias))  # [..., S, W]
        sentences = tf.einsum("...sw,...swd->...sd", tf.cast(words, h.dtype), h)  # [..., S, d]
        sent_logits = tf.tensordot(tf.tanh(tf.tensordot(sentences, p["W_s"], axes=1) + p["b_s"]), p["u_s"], axes=1)
        sent = masked_softmax(ctx, sent_logits, Mask(sentence_keep))  # [..., S]
        document = tf.einsum("...s,...sd->...d", tf.cast(sent, h.dtype), sentences)
        weights = ctx.numpy(words)
        maps = {"sentence_weights": ctx.numpy(sent), "document": ctx.numpy(document)}
        output = ctx.numpy(sentences)
    check_finite_result(weights, ctx.dtype)
    views = [View("sentence_weights", "sentence weights (sentence level)", axis="q", png=True)]
    return Result(weights, output, params={"units": params.units}, maps=maps, views=views)


VARIANT = variant(
    __name__,
    name="hierarchical",
    summary="hierarchical attention (HAN, Yang et al. 2016): word weights per sentence, then sentence weights",
    formula="a_it = softmax_t(tanh(h_it W_w + b_w) u_w); b_i = softmax_i(tanh(s_i W_s + b_s) u_s)",
    inputs=(InputSpec("doc", "word annotations [..., n_sent, n_word, d], or JSON of tokenised sentences with "
                             "vectors", reader=read_tokenised),),
    query_input="",
    key_input="",
    learned=True,
    axis_names=("sentence", "word"),
    weights_title="word weights (word level)",
)

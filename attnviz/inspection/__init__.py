"""Weights a model saved: reading them into one layout, masks and padding, what each head does,
checks, comparing two sets of weights, token-aware head detectors, received attention and rollout;
and the runs of ``inspect``, ``compare`` and ``rollout`` (typed options in, typed results out).
NumPy only, no TensorFlow; nothing here prints or draws.

* ``weights``: ``load_weights`` and layouts (the standard ``[layers, batch, heads, Lq, Lk]``)
* ``masks``: mask files read onto ``attnviz.masks.Mask`` (padding included), ``MaskOptions``
* ``selection``: the shown map, the grids' layers and heads, token labels
* ``heads``: head statistics, tags, whether rows are distributions, one map's row statistics
* ``checks``: rows sum to 1, masked, causal, finite
* ``compare``: differences of two sets of weights, and the run of ``compare``
* ``tokens``: induction and duplicate-token scores, the repeated-sequence probe
* ``received``: the attention each token receives
* ``rollout``: attention rollout, and the run of ``rollout``
* ``inspecting``: the run of ``inspect`` on exact weights
* ``kinds``: the kind of a file ``inspect`` reads (weights, a summary, q and k to summarise, a corpus file), and
  one function per kind
"""

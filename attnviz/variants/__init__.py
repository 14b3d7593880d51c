"""The registry of attention variants: the one place a variant is added.

Each entry is a module with a ``VARIANT``; the command line makes one command of each. Importing
this package imports no TensorFlow.
"""

from __future__ import annotations

from attnviz.variants import (
    additive,
    bidirectional,
    coattention,
    dot,
    general,
    hard,
    hierarchical,
    local,
    multihead,
    pooling,
    scaled,
    self_attention,
    sparse,
    structured,
)
from attnviz.variants.base import Variant

REGISTRY: dict[str, Variant] = {
    v.name: v
    for v in (
        scaled.VARIANT,
        dot.VARIANT,
        general.VARIANT,
        additive.VARIANT,
        multihead.VARIANT,
        self_attention.VARIANT,
        pooling.VARIANT,
        coattention.VARIANT,
        local.VARIANT,
        hard.VARIANT,
        sparse.VARIANT,
        structured.VARIANT,
        hierarchical.VARIANT,
        bidirectional.VARIANT,
    )
}


def get(name: str) -> Variant:
    return REGISTRY[name]

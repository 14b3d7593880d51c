from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from attnviz.device import Device
from attnviz.io import Loaded
from attnviz.masks import build_mask
from attnviz.variants import REGISTRY
from attnviz.variants._base import Context

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = ROOT / "sample_inputs"
CPU = Device("CPU:0", "/CPU:0")

os.environ.setdefault("COLUMNS", "120")


def compute(name, q, k, v, *, keep=None, bias=None, dtype="float32", causal=False, causal_align="top-left",
            **params):
    """Run a registered variant on arrays, with masks built the way the command line builds them."""
    variant = REGISTRY[name]
    p = variant.params(**params)
    inputs = {n: Loaded(np.asarray(a), n, None) for n, a in (("q", q), ("k", k), ("v", v))}
    shape = variant.check(inputs, p)
    mask = build_mask(shape, causal=causal, causal_align=causal_align)
    if keep is not None:
        mask.keep = keep if mask.keep is None else np.logical_and(mask.keep, keep)
    mask.bias = bias
    result = variant.compute(Context(CPU, dtype), {n: lo.data for n, lo in inputs.items()}, mask, p)
    return result


@pytest.fixture
def samples() -> Path:
    return SAMPLES

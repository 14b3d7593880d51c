"""attnviz: compute, inspect and visualise attention, from the command line or from Python.

The Python API (loaded on first use, so ``import attnviz`` stays instant and imports neither NumPy
nor TensorFlow):

* one function per attention type, named as the commands: ``attnviz.scaled(q, k, v, causal=True)``,
  ``attnviz.multihead(query, value, params=..., heads=4)``, ... and ``attnviz.compute(name, *arrays,
  **options)``; arrays may be NumPy arrays, PyTorch or TensorFlow tensors (bfloat16 included);
* ``attnviz.capture(model, tokenizer)``: a context manager that records every attention site of a
  transformers or Keras model while it runs, into a capture file the other functions read;
* ``attnviz.corpus(model, tokenizer, texts)``: per-head statistics over many texts, as sums and counts;
* ``attnviz.ablate(model, tokenizer, texts, stream="18:2", answer=...)``: the model run as it is and with chosen
  heads restricted (or every head ranked, ``rank=True``), what changed;
* ``attnviz.inspect(weights, labels=None, mask=None, ...)`` for saved weights or a model's
  ``out.attentions``, ``attnviz.compare(a, b, ...)``, ``attnviz.rollout(weights, ...)`` and
  ``attnviz.load(spec)``.

Options are the commands' options as keyword arguments. Results hold NumPy arrays and give the
command's JSON document (``to_json()``), tables (``table()``), picture (``figure()``), files
(``save(png=..., html=..., json=...)``) and, in a notebook, the offline interactive report inline.
Errors are ``attnviz.AttnvizError`` subclasses with the command line's one-line messages; warnings go
through ``warnings``.

    >>> import attnviz
    >>> result = attnviz.scaled(q, k, v, causal=True)
    >>> result.weights.shape, result.stats["entropy"].shape
"""

from __future__ import annotations

import importlib

TYPE_CHECKING = False  # typing is not imported at run time: the console script's first steps stay quick
if TYPE_CHECKING:
    from typing import Any

__version__ = "0.1.0"

#: the attention types, as the commands (``attnviz.variants.REGISTRY``; a test keeps the two equal)
VARIANTS = ("scaled", "dot", "general", "additive", "multihead", "self", "pooling", "coattention", "local", "hard",
            "sparse", "structured", "hierarchical", "bidirectional")
RUNS = ("compute", "inspect", "compare", "rollout", "load", "capture", "corpus", "ablate")
ERRORS = ("AttnvizError", "UsageError", "InputError", "ShapeError", "ParamsError", "DeviceError", "OutputError")
RESULTS = ("Computed", "Inspected", "Compared", "RolledOut", "Ablated")

__all__ = ["__version__", *RUNS, *VARIANTS, *ERRORS, *RESULTS]


def __getattr__(name: str) -> Any:
    """The API's names, imported when first used (PEP 562)."""
    if name in ERRORS:
        value = getattr(importlib.import_module("attnviz.errors"), name)
    elif name in RUNS:
        value = getattr(importlib.import_module("attnviz.api.running"), name)
    elif name in RESULTS:
        value = getattr(importlib.import_module("attnviz.api.results"), name)
    elif name in VARIANTS:
        value = importlib.import_module("attnviz.api.running").variant_function(name)
    else:
        raise AttributeError(f"module 'attnviz' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))

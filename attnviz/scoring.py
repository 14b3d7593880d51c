"""What a model does to the dot-product scores of captured Q/K/V besides the product itself, read from
the options (``CaptureOptions``; ``--hf-config`` fills them from a model's config, see
``attnviz.hfconfig``). NumPy only; the pipeline puts the parts where they act:

* ``--softcap C`` and ``--sinks FILE`` go to the softmax (``Logits`` on the compute ``Context``):
  scores become ``C tanh(s / C)`` before any bias or mask (Gemma 2); the sink logit of each head
  ``[H]`` is one more column of the softmax, dropped after it (gpt-oss), so rows sum to less than 1;
* ``--sliding-window W`` (transformers' meaning: key ``j`` visible from query ``i`` when
  ``0 <= i - j < W``, causal), ``--chunk-size N`` (Llama 4: the same chunk of ``N`` positions, causal),
  ``--alibi`` / ``--alibi-max-bias B`` and ``--relative-bias-table`` (T5) go into the run's mask
  (``attnviz.masks.Positional``), built a block of query rows at a time;
* a model's causality turns ``--causal`` on, aligned bottom-right (queries at the end of their keys);
* a model's scale becomes the variant's ``--scale`` (an explicit ``--scale`` wins).

Positions are indices: query row ``i`` of ``Lq`` sits at key index ``i + Lk - Lq``, as with a KV
cache, and equals ``i`` when ``Lq == Lk``. A head axis is needed (axis -3 of the weights, after
``--layout``) for per-head parts (ALiBi, sinks, T5 bias): their head count must match it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from attnviz.errors import InputError, ShapeError, UsageError, shape_str
from attnviz.io import StdinReader, load_array
from attnviz.positional import alibi_slopes
from attnviz.run_options import CaptureOptions
from attnviz.storage import Place

if TYPE_CHECKING:
    from attnviz.hfconfig import ConfigReading


@dataclass(frozen=True)
class Logits:
    """What the softmax does besides masking: a logit softcap and per-head sink logits ``[H]``."""

    softcap: float | None = None
    sinks: np.ndarray | None = None

    def __bool__(self) -> bool:
        return self.softcap is not None or self.sinks is not None


@dataclass
class ModelScoring:
    """The parts of a model's scoring a run applies (see the module)."""

    scale: float | None = None
    causal: bool = False
    band: tuple[int, int] | None = None
    chunk: int | None = None
    alibi: np.ndarray | None = None
    relative: tuple[np.ndarray, int, int, bool] | None = None
    alibi_keys: bool = False  # Falcon's ALiBi (attnviz.masks.Positional)
    logits: Logits = field(default_factory=Logits)
    described: dict[str, Any] = field(default_factory=dict)  # for the JSON document (captured.scoring)

    @property
    def positional(self) -> bool:
        return self.band is not None or self.chunk is not None or self.alibi is not None or self.relative is not None

    @property
    def per_head(self) -> int | None:
        """The head count the per-head parts need, or None."""
        for arr in (self.alibi, self.logits.sinks, None if self.relative is None else self.relative[0]):
            if arr is not None:
                return int(arr.shape[-1])
        return None


def _per_head(spec: str, what: str, heads: int, stdin: StdinReader | None, paths: list[Place], option: str,
              rank: int) -> np.ndarray:
    loaded = load_array(spec, stdin)
    if loaded.path is not None:
        paths.append(loaded.path)
    arr = np.asarray(loaded.data)
    if arr.dtype.kind not in "biuf":
        raise InputError(f"{loaded.source}: {option} holds numbers; received {arr.dtype}.")
    arr = arr.astype(np.float32)
    if arr.ndim != rank or arr.shape[-1] != heads:
        raise ShapeError(f"{loaded.source}: {option} takes {what}, one per head of the {heads} query heads here; "
                         f"received shape {shape_str(arr.shape)}.")
    if not np.isfinite(arr).all():
        raise InputError(f"{loaded.source}: {option} holds a value that is not finite.")
    return arr


def read_scoring(opts: CaptureOptions, heads: int | None, config: ConfigReading | None = None,
                 stdin: StdinReader | None = None, paths: list[Place] | None = None) -> ModelScoring:
    """The scoring of ``opts`` for weights with ``heads`` query heads (None: no head axis), with what a
    config gives besides options (``attnviz.hfconfig``): the scale, causality, a bidirectional local
    window (ModernBERT: keys within that distance on both sides) and Falcon's form of ALiBi."""
    paths = paths if paths is not None else []
    s = ModelScoring()
    scale = bidirectional_band = None
    if config is not None:
        s.causal, s.alibi_keys = config.causal, config.falcon_alibi
        scale, bidirectional_band = config.scale, config.bidirectional_band
    s.scale = scale
    d = s.described
    if scale is not None:
        d["scale"] = scale
    needs_heads = [o for o, v in (("--alibi", opts.alibi or opts.alibi_max_bias is not None),
                                  ("--sinks", opts.sinks is not None),
                                  ("--relative-bias-table", opts.relative_bias_table is not None)) if v]
    if needs_heads and heads is None:
        raise UsageError(f"{needs_heads[0]} is per head: Q, K and V need a head axis ([batch, heads, L, d], or "
                         "--layout naming head).")
    if opts.relative_bias_table is None and opts.relative_buckets is not None:
        raise UsageError("--relative-buckets goes with --relative-bias-table.")
    if opts.sliding_window is not None:
        s.band, s.causal = (opts.sliding_window - 1, 0), True
        d["sliding_window"] = opts.sliding_window
    if bidirectional_band is not None:
        s.band = (bidirectional_band, bidirectional_band)
        d["local_window"] = {"left": bidirectional_band, "right": bidirectional_band}
    if opts.chunk_size is not None:
        s.chunk, s.causal = opts.chunk_size, True
        d["chunk_size"] = opts.chunk_size
    if opts.alibi or opts.alibi_max_bias is not None:
        assert heads is not None
        s.alibi = alibi_slopes(heads, opts.alibi_max_bias)
        d["alibi"] = {"slopes": "mpt" if opts.alibi_max_bias is not None else "bloom",
                      **({"max_bias": opts.alibi_max_bias} if opts.alibi_max_bias is not None else {}),
                      "values": [float(x) for x in s.alibi]}
    if opts.relative_bias_table is not None:
        assert heads is not None
        table = _per_head(opts.relative_bias_table, "T5's relative_attention_bias weight [buckets, heads]", heads,
                          stdin, paths, "--relative-bias-table", 2)
        buckets = opts.relative_buckets if opts.relative_buckets is not None else table.shape[0]
        if buckets != table.shape[0]:
            raise ShapeError(f"{opts.relative_bias_table}: the table has {table.shape[0]} buckets, but "
                             f"--relative-buckets {buckets} was given.")
        s.relative = (table, buckets, opts.relative_max_distance, opts.relative_bidirectional)
        d["relative_bias"] = {"buckets": buckets, "max_distance": opts.relative_max_distance,
                              "bidirectional": opts.relative_bidirectional}
    softcap, sinks = opts.softcap, None
    if softcap is not None:
        if not (np.isfinite(softcap) and softcap > 0):
            raise UsageError(f"--softcap {softcap}: must be a positive finite number.")
        d["softcap"] = softcap
    if opts.sinks is not None:
        assert heads is not None
        sinks = _per_head(opts.sinks, "sink logits [H]", heads, stdin, paths, "--sinks", 1)
        d["sinks"] = [float(x) for x in sinks]
    s.logits = Logits(softcap, sinks)
    if s.causal:
        d["causal"] = True
    return s

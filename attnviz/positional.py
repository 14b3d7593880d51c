"""Position encodings models put into attention, transcribed from transformers' own functions to NumPy:
rotary frequencies for every RoPE type (with its scaling), ALiBi slopes, and T5's bucketed relative
positions. NumPy only.

**RoPE** (``rope_frequencies``): the inverse frequencies ``inv_freq [r/2]`` of ``r`` rotated
dimensions and the factor by which cos and sin are multiplied (``attention_factor``), for the
``rope_type`` of a ``rope_scaling`` / ``rope_parameters`` object:

* ``default``: ``theta^(-2i / r)``;
* ``linear``: divided by ``factor``;
* ``dynamic`` (NTK): when the sequence (``max(position) + 1``) is longer than
  ``max_position_embeddings``, the base becomes ``theta ((factor L / max) - (factor - 1))^(r / (r - 2))``;
* ``yarn``: interpolation and extrapolation mixed by a linear ramp between the correction dimensions of
  ``beta_fast`` and ``beta_slow`` (truncated unless ``truncate`` is false), with
  ``attention_factor = 0.1 ln(factor) + 1`` (or ``mscale`` / ``mscale_all_dim``, or as given);
* ``longrope``: ``short_factor`` or, for sequences longer than ``original_max_position_embeddings``,
  ``long_factor`` per frequency, ``attention_factor = sqrt(1 + ln(factor) / ln(original))``;
* ``llama3``: low frequencies divided by ``factor``, high ones kept, those between smoothed;
* ``proportional``: the frequencies of the first ``partial_rotary_factor`` of the head over the whole
  head size, zeros after (Gemma 4's global layers).

Frequencies and angles are computed in float32 as transformers computes them, so that positions in the
thousands give the model's own rounding.

**ALiBi**: ``alibi_slopes(H)`` are BLOOM's and Falcon's (Press et al.: ``2^(-8 i / n)`` for the closest
power of two ``n``, the rest interleaved from ``2n``); ``alibi_slopes(H, max_bias=B)`` are MPT's
(``1 / 2^(B i / n)`` for the next power of two ``n``, then the odd ones first). The bias of query ``i``
and key ``j`` is ``slope (j - i)``, which the softmax cannot tell from the models' ``slope j``.

**T5** (``t5_buckets``): relative position ``j - i`` into ``num_buckets`` buckets, half of them for
exact small distances and the rest logarithmic up to ``max_distance``; bidirectional (encoder) uses
half the buckets for each sign.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from attnviz.errors import UsageError

ROPE_TYPES = ("default", "linear", "dynamic", "yarn", "longrope", "llama3", "proportional")

#: the keys each rope type needs, besides rope_type (and rope_theta, given elsewhere or in the object)
ROPE_REQUIRED = {"linear": ("factor",), "dynamic": ("factor",), "yarn": ("factor",),
                 "longrope": ("short_factor", "long_factor"), "llama3": ("factor", "low_freq_factor",
                                                                          "high_freq_factor",
                                                                          "original_max_position_embeddings")}


def rope_type(params: Mapping[str, Any] | None) -> str:
    """The ``rope_type`` (or the older ``type``) of a rope scaling object; ``default`` when there is none."""
    if not params:
        return "default"
    kind = params.get("rope_type", params.get("type", "default"))
    return "dynamic" if kind == "dynamic" or str(kind).endswith("dynamic") else str(kind)


def check_rope_parameters(params: Mapping[str, Any], option: str) -> str:
    """The rope type of ``params``, or a ``UsageError`` naming what is unknown or missing."""
    kind = rope_type(params)
    if kind not in ROPE_TYPES:
        raise UsageError(f"{option}: unknown rope type {kind!r}; attnviz knows {', '.join(ROPE_TYPES)}.")
    missing = [k for k in ROPE_REQUIRED.get(kind, ()) if params.get(k) is None]
    if kind == "yarn" and params.get("factor") is None and params.get("original_max_position_embeddings") is not None:
        missing = []  # DeepSeek: factor = max_position_embeddings / original
    if missing:
        raise UsageError(f"{option}: rope type {kind!r} needs {', '.join(missing)}.")
    return kind


def _default_inv_freq(theta: float, dims: int) -> np.ndarray:
    """``1 / theta^(arange(0, r, 2) / r)`` in float32, as transformers."""
    exponent = (np.arange(0, dims, 2, dtype=np.int64).astype(np.float32) / np.float32(dims)).astype(np.float32)
    return (np.float32(1.0) / np.power(np.float32(theta), exponent, dtype=np.float32)).astype(np.float32)


def rope_frequencies(params: Mapping[str, Any] | None, theta: float, head_dim: int, dims: int,
                     seq_len: int, max_position_embeddings: int | None = None) -> tuple[np.ndarray, float]:
    """``(inv_freq [dims / 2] float32, attention_factor)`` of a rope scaling object (None: default RoPE)
    for ``dims`` rotated dimensions of a head of ``head_dim``, at a sequence of ``seq_len`` positions."""
    kind = rope_type(params)
    p = dict(params or {})
    if kind == "default":
        return _default_inv_freq(theta, dims), 1.0
    if kind == "linear":
        return (_default_inv_freq(theta, dims) / np.float32(p["factor"])).astype(np.float32), 1.0
    if kind == "dynamic":
        limit = max_position_embeddings or p.get("original_max_position_embeddings")
        if limit is None:
            raise UsageError("rope type 'dynamic' needs max_position_embeddings (in the config, or in the rope "
                             "object as original_max_position_embeddings).")
        factor = float(p["factor"])
        length = max(seq_len, limit)
        base = theta * ((factor * length / limit) - (factor - 1)) ** (dims / (dims - 2))
        return _default_inv_freq(base, dims), 1.0
    if kind == "proportional":
        factor = float(p.get("factor", 1.0))
        partial = float(p.get("partial_rotary_factor", 1.0))
        angles = int(partial * head_dim // 2)
        exponent = (np.arange(0, 2 * angles, 2, dtype=np.int64).astype(np.float32) / np.float32(head_dim))
        rotated = np.float32(1.0) / np.power(np.float32(theta), exponent.astype(np.float32), dtype=np.float32)
        inv = np.concatenate([rotated, np.zeros(head_dim // 2 - angles, dtype=np.float32)])
        return (inv / np.float32(factor)).astype(np.float32), 1.0
    if kind == "llama3":
        inv = _default_inv_freq(theta, dims)
        factor, low, high = float(p["factor"]), float(p["low_freq_factor"]), float(p["high_freq_factor"])
        old = float(p["original_max_position_embeddings"])
        low_wavelen, high_wavelen = old / low, old / high
        wavelen = (np.float32(2 * math.pi) / inv).astype(np.float32)
        scaled = np.where(wavelen > low_wavelen, inv / np.float32(factor), inv).astype(np.float32)
        smooth = ((np.float32(old) / wavelen - np.float32(low)) / np.float32(high - low)).astype(np.float32)
        smoothed = ((1 - smooth) * scaled / np.float32(factor) + smooth * scaled).astype(np.float32)
        medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
        return np.where(medium, smoothed, scaled).astype(np.float32), 1.0
    if kind == "yarn":
        return _yarn(p, theta, dims, max_position_embeddings)
    if kind == "longrope":
        original = p.get("original_max_position_embeddings") or max_position_embeddings
        if original is None:
            raise UsageError("rope type 'longrope' needs original_max_position_embeddings.")
        given = p.get("factor")
        factor = float(given) if given is not None else (max_position_embeddings or original) / original
        attention = p.get("attention_factor")
        if attention is None:
            attention = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(original))
        ext = np.asarray(p["long_factor"] if seq_len > original else p["short_factor"], dtype=np.float32)
        if ext.shape != (dims // 2,):
            raise UsageError(f"rope type 'longrope': short_factor and long_factor hold {dims // 2} numbers here "
                             f"(one per rotated pair); received {ext.size}.")
        shape = (np.arange(0, dims, 2, dtype=np.int64).astype(np.float32) / np.float32(dims)).astype(np.float32)
        inv = np.float32(1.0) / (ext * np.power(np.float32(theta), shape, dtype=np.float32))
        return inv.astype(np.float32), float(attention)
    raise UsageError(f"unknown rope type {kind!r}; attnviz knows {', '.join(ROPE_TYPES)}.")


def _yarn(p: Mapping[str, Any], theta: float, dims: int,
          max_position_embeddings: int | None) -> tuple[np.ndarray, float]:
    original = p.get("original_max_position_embeddings") or max_position_embeddings
    if original is None:
        raise UsageError("rope type 'yarn' needs original_max_position_embeddings.")
    factor = p.get("factor")
    if factor is None:
        factor = (max_position_embeddings or original) / original
    factor = float(factor)

    def get_mscale(scale: float, mscale: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0

    attention = p.get("attention_factor")
    if attention is None:
        mscale, mscale_all = p.get("mscale"), p.get("mscale_all_dim")
        attention = (get_mscale(factor, mscale) / get_mscale(factor, mscale_all)) if mscale and mscale_all \
            else get_mscale(factor)
    beta_fast = p.get("beta_fast") or 32
    beta_slow = p.get("beta_slow") or 1

    def correction_dim(rotations: float) -> float:
        return (dims * math.log(original / (rotations * 2 * math.pi))) / (2 * math.log(theta))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if p.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dims - 1)
    if low == high:
        high += 0.001
    ramp = np.clip((np.arange(dims // 2, dtype=np.float32) - np.float32(low)) / np.float32(high - low), 0, 1)
    pos_freqs = np.power(np.float32(theta), (np.arange(0, dims, 2).astype(np.float32) / np.float32(dims)),
                         dtype=np.float32)
    extrapolation = np.float32(1.0) / pos_freqs
    interpolation = np.float32(1.0) / (np.float32(factor) * pos_freqs)
    extra_factor = (1 - ramp).astype(np.float32)
    inv = interpolation * (1 - extra_factor) + extrapolation * extra_factor
    return inv.astype(np.float32), float(attention)


def rope_angles(positions: np.ndarray, inv_freq: np.ndarray) -> np.ndarray:
    """``[..., L, r/2]`` angles ``position * inv_freq`` in float32, as transformers computes them."""
    return np.asarray(positions).astype(np.float32)[..., None] * inv_freq.astype(np.float32)


def apply_rope(x: np.ndarray, angles: np.ndarray, style: str, factor: float = 1.0, part: str = "first") -> np.ndarray:
    """Rotate the first (``part="last"``: the last) ``2 * angles.shape[-1]`` dimensions of ``x [..., L, d]``
    by ``angles [..., L, r/2]`` (broadcasting), cos and sin (float32, as the model's) times ``factor``; the
    rotation in float64, the rest of ``x`` passing through."""
    r = 2 * angles.shape[-1]
    x64 = np.asarray(x, dtype=np.float64)
    if part == "last":
        rest, rot = x64[..., : x64.shape[-1] - r], x64[..., x64.shape[-1] - r:]
        return np.concatenate([rest, apply_rope(rot, angles, style, factor)], axis=-1)
    rot, rest = x64[..., :r], x64[..., r:]
    cos = (np.cos(angles) * np.float32(factor)).astype(np.float64)
    sin = (np.sin(angles) * np.float32(factor)).astype(np.float64)
    if style == "half":  # transformers' rotate_half: pairs (i, i + r/2)
        x1, x2 = rot[..., : r // 2], rot[..., r // 2:]
        turned = np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
    else:  # GPT-J / RoFormer: pairs (2i, 2i + 1)
        x1, x2 = rot[..., 0::2], rot[..., 1::2]
        turned = np.stack([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1).reshape(rot.shape)
    return np.concatenate([turned, rest], axis=-1)


# ----------------------------------------------------------------------------------------------
# ALiBi


def alibi_slopes(heads: int, max_bias: float | None = None) -> np.ndarray:
    """The ALiBi slope of each head ``[H]`` (float32): BLOOM's and Falcon's, or MPT's with ``max_bias``."""
    if max_bias is not None:  # MPT: build_mpt_alibi_tensor
        n = 2 ** math.ceil(math.log2(heads))
        base = np.arange(1, n + 1, dtype=np.int64).astype(np.float32) * np.float32(max_bias / n)
        slopes = (np.float32(1.0) / np.power(np.float32(2), base, dtype=np.float32)).astype(np.float32)
        if n != heads:
            slopes = np.concatenate([slopes[1::2], slopes[::2]])[:heads]
        return slopes.astype(np.float32)
    closest = 2 ** math.floor(math.log2(heads))  # BLOOM: build_alibi_tensor
    start = np.float32(2 ** (-(2 ** -(math.log2(closest) - 3))))
    slopes = np.power(start, np.arange(1, 1 + closest, dtype=np.int32).astype(np.float32), dtype=np.float32)
    if closest != heads:
        extra_base = np.float32(2 ** (-(2 ** -(math.log2(2 * closest) - 3))))
        remaining = min(closest, heads - closest)
        extra = np.power(extra_base, np.arange(1, 1 + 2 * remaining, 2, dtype=np.int32).astype(np.float32),
                         dtype=np.float32)
        slopes = np.concatenate([slopes, extra])
    return slopes.astype(np.float32)


def bfloat16_round(x: np.ndarray) -> np.ndarray:
    """float32 values rounded to the nearest bfloat16 (ties to even), as float32 (Falcon's ALiBi)."""
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    rounded = (bits + (np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1)))) & np.uint32(0xFFFF0000)
    return rounded.astype(np.uint32).view(np.float32)


# ----------------------------------------------------------------------------------------------
# T5


def t5_buckets(relative: np.ndarray, bidirectional: bool, num_buckets: int, max_distance: int) -> np.ndarray:
    """T5's ``_relative_position_bucket``: the bucket of each relative position ``j - i`` (int64)."""
    relative = np.asarray(relative, dtype=np.int64)
    buckets = np.zeros(relative.shape, dtype=np.int64)
    if bidirectional:
        num_buckets //= 2
        buckets += (relative > 0).astype(np.int64) * num_buckets
        relative = np.abs(relative)
    else:
        relative = -np.minimum(relative, 0)
    max_exact = num_buckets // 2
    small = relative < max_exact
    with np.errstate(divide="ignore"):
        large = max_exact + (np.log(np.maximum(relative, 1).astype(np.float32) / np.float32(max_exact))
                             / np.float32(math.log(max_distance / max_exact))
                             * np.float32(num_buckets - max_exact)).astype(np.int64)
    large = np.minimum(large, num_buckets - 1)
    return buckets + np.where(small, relative, large)

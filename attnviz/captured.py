"""Queries, keys and values as hooks capture them from a model: axis layouts, grouped heads and
rotary position embeddings. Input preparation, between reading the files and the variant, so every
variant whose inputs are Q, K and V gets it without knowing. NumPy only.

* ``--layout AXES`` names the axes of Q, K and V with ``batch``, ``head``, ``seq`` and ``d`` (for
  example ``batch,seq,head,d``, the ``[B, L, H, d]`` that forward hooks on a projection capture after a
  ``view``); ``--layout-kv`` when K and V differ from Q. They are transposed to ``[batch, head, seq,
  d]`` (the axes present), so the weights and everything after them are ``[batch, head, Lq, Lk]``.
* Grouped-query attention (Llama, Mistral, Qwen): Q with N heads and K/V with G heads, N a multiple
  of G, attend as Hugging Face's ``repeat_kv``: query head n uses key/value head ``n // (N / G)``. The
  head axis is the layout's ``head``, or axis -3 of ``[batch, heads, L, d]`` without a layout.
* ``--rope``: rotary position embeddings applied to Q and K before the scores, for q/k captured
  before the rotation. ``--rope-style half`` is Hugging Face Llama's ``rotate_half`` (the two halves
  of the rotated dimensions form the pairs), ``interleaved`` is GPT-J's and the RoFormer paper's
  (neighbouring dimensions ``2i, 2i+1`` form the pairs). Pair ``i`` of ``r`` rotated dimensions
  turns by ``position * theta^(-2i / r)``; ``--rope-dim r`` rotates the first ``r`` dimensions only
  (GPT-NeoX's partial rotary), the rest pass through. Positions are ``0 .. Lk-1`` for the keys and the
  last ``Lq`` of them for the queries (a query block at the end of its keys, as with a KV cache), or
  ``--positions FILE``: ``[L]`` or ``[B, L]`` position ids (Hugging Face ``position_ids``, needed for
  left padding), aligned with the batch axes from the left. Angles, sines and cosines are computed
  in float64 (transformers computes them in float32; the two agree to about 1e-6 at the positions
  of ordinary prompts).
"""

from __future__ import annotations

from collections.abc import MutableMapping
from dataclasses import replace
from typing import Any

import numpy as np

from attnviz.choices import ROPE_PARTS, ROPE_STYLES
from attnviz.errors import ShapeError, UsageError, shape_str
from attnviz.io import Loaded, StdinReader, load_array, spec_name
from attnviz.positional import apply_rope, check_rope_parameters, rope_angles, rope_frequencies, rope_type
from attnviz.run_options import CaptureOptions
from attnviz.scoring import ModelScoring, read_scoring
from attnviz.storage import Place

AXES = ("batch", "head", "seq", "d")
DEFAULT_THETA = 10000.0  # --rope-theta's default
ALIASES = {"b": "batch", "batches": "batch", "h": "head", "heads": "head", "n": "head", "l": "seq", "s": "seq",
           "t": "seq", "len": "seq", "length": "seq", "sequence": "seq", "token": "seq", "tokens": "seq",
           "dim": "d", "head_dim": "d", "e": "d", "features": "d"}


def parse_layout(text: str, option: str) -> tuple[str, ...]:
    """``batch,seq,head,d`` as axis names; each at most once, ``seq`` and ``d`` required."""
    names = tuple(ALIASES.get(t.strip().lower(), t.strip().lower()) for t in text.split(",") if t.strip())
    unknown = [n for n in names if n not in AXES]
    if unknown or len(set(names)) != len(names) or "seq" not in names or "d" not in names:
        raise UsageError(f"{option} {text!r}: name each axis once from batch, head, seq, d (seq and d required), "
                         "e.g. batch,seq,head,d.")
    return names


def to_standard(loaded: Loaded, axes: tuple[str, ...], option: str) -> Loaded:
    """The array with its axes in the order batch, head, seq, d (those present)."""
    arr = loaded.data
    if arr.ndim != len(axes):
        raise ShapeError(f"{loaded.source}: shape {shape_str(arr.shape)} has {arr.ndim} axes, but {option} "
                         f"{','.join(axes)} names {len(axes)}.")
    order = [axes.index(a) for a in AXES if a in axes]
    return replace(loaded, data=np.transpose(arr, order))


def repeat_kv(inputs: MutableMapping[str, Loaded]) -> tuple[int, int] | None:
    """Grouped-query attention: K and V with G heads at axis -3, Q with N (a multiple of G): repeat
    each key/value head N / G times (query head n uses head n // (N / G)). Returns (N, G) or None."""
    q, k, v = inputs["q"].data, inputs["k"].data, inputs["v"].data
    if min(q.ndim, k.ndim, v.ndim) < 3:
        return None
    n, g = q.shape[-3], k.shape[-3]
    if g in (1, n) or n % g or v.shape[-3] != g:
        return None  # equal, broadcast, or not grouped: the usual shape checks speak
    for name in ("k", "v"):
        inputs[name] = replace(inputs[name], data=np.repeat(inputs[name].data, n // g, axis=-3))
    return n, g


def rope_scaling(text: str | None, paths: list[Place]) -> dict[str, Any] | None:
    """``--rope-scaling``: a rope scaling object as JSON text or a ``.json`` file, checked."""
    if text is None:
        return None
    from attnviz import storage
    from attnviz.jsontext import loads_json

    stripped = text.strip()
    source = "--rope-scaling"
    if not stripped.startswith("{"):
        source = text
        stripped = storage.read_text(text, text)
        paths.append(storage.place(text))
    try:
        value = loads_json(stripped)
    except ValueError as exc:
        raise UsageError(f"{source}: not a JSON object ({exc}).") from None
    if not isinstance(value, dict):
        raise UsageError(f"{source}: a rope scaling object is a JSON object, e.g. "
                         '{"rope_type": "llama3", "factor": 8, ...}.')
    check_rope_parameters(value, source)
    return value


def _positions(opts: CaptureOptions, lead: tuple[int, ...], length: int, stdin: StdinReader | None,
               paths: list[Place]) -> np.ndarray:
    """Position ids ``[..., L]`` shaped to broadcast against ``[*lead, L]`` (batch axes from the left)."""
    if opts.positions is None:
        return np.arange(length)
    loaded = load_array(opts.positions, stdin)
    if loaded.path is not None:
        paths.append(loaded.path)
    pos = np.asarray(loaded.data)
    if pos.shape[-1] != length or pos.ndim - 1 > len(lead) or (pos.ndim > 1 and not all(
            p in (1, n) for p, n in zip(pos.shape[:-1], lead))):
        raise ShapeError(f"{loaded.source}: position ids have shape [L] or [B, L] = [{', '.join(map(str, lead[:1]))}"
                         f"{', ' if lead else ''}{length}] here (batch axes from the left); received "
                         f"{shape_str(pos.shape)}.")
    return pos.reshape(pos.shape[:-1] + (1,) * (len(lead) - (pos.ndim - 1)) + (length,))


def prepare(inputs: MutableMapping[str, Loaded], opts: CaptureOptions, stdin: StdinReader | None = None,
            paths: list[Place] | None = None) -> tuple[dict[str, Any], ModelScoring]:
    """Apply ``--layout``, ``--hf-config``, ``--rope`` and grouped heads to ``inputs["q"]``, ``["k"]``,
    ``["v"]`` in place; returns what was done, for the JSON document (empty when nothing was), and the
    model's scoring (``attnviz.scoring``)."""
    paths = paths if paths is not None else []
    done: dict[str, Any] = {}
    if opts.layout_kv is not None and opts.layout is None:
        raise UsageError("--layout-kv goes with --layout (the axes of Q).")
    if opts.layout is not None:
        q_axes = parse_layout(opts.layout, "--layout")
        kv_axes = parse_layout(opts.layout_kv, "--layout-kv") if opts.layout_kv else q_axes
        done["file_shapes"] = {n: list(inputs[n].data.shape) for n in ("q", "k", "v")}
        inputs["q"] = to_standard(inputs["q"], q_axes, "--layout")
        for name in ("k", "v"):
            inputs[name] = to_standard(inputs[name], kv_axes, "--layout-kv" if opts.layout_kv else "--layout")
        done["layout"] = {"q": ",".join(q_axes), "kv": ",".join(kv_axes),
                          "as": ",".join(a for a in AXES if a in q_axes)}
    has_heads = opts.layout is None or "head" in (parse_layout(opts.layout, "--layout"))
    config = None
    if opts.model_layer is not None and opts.hf_config is None:
        raise UsageError("--model-layer goes with --hf-config.")
    if opts.model_attention is not None and opts.hf_config is None:
        raise UsageError("--model-attention goes with --hf-config.")
    if opts.hf_config is not None:
        from attnviz.hfconfig import apply_config

        q, k = inputs["q"].data, inputs["k"].data
        config = apply_config(opts, q.shape[-3] if has_heads and q.ndim >= 3 else None,
                              k.shape[-3] if has_heads and k.ndim >= 3 else None, q.shape[-1], paths)
        opts = config.options
        done["config"] = config.described
    if opts.rope_style not in ROPE_STYLES:
        raise UsageError(f"--rope-style {opts.rope_style!r}: expected one of {', '.join(ROPE_STYLES)}.")
    if opts.rope_part not in ROPE_PARTS:
        raise UsageError(f"--rope-part {opts.rope_part!r}: expected one of {', '.join(ROPE_PARTS)}.")
    if not opts.rope and (opts.rope_dim is not None or opts.positions is not None or opts.rope_scaling is not None
                          or opts.rope_part != "first"):
        if config is None:
            raise UsageError("--rope-dim, --rope-part, --rope-scaling and --positions go with --rope.")
        # the config's layer has no RoPE (a NoPE layer, ALiBi): the row's --positions has nothing to do
        opts = replace(opts, rope_dim=None, positions=None, rope_scaling=None, rope_part="first")
        done["config"]["unused"] = "--positions, --rope-dim and --rope-scaling: this layer has no RoPE"
    if not (np.isfinite(opts.rope_theta) and opts.rope_theta > 0):
        raise UsageError(f"--rope-theta {opts.rope_theta}: must be a positive finite number.")
    scaling = rope_scaling(opts.rope_scaling, paths)
    if opts.rope:
        done["rope"] = _apply_rope(inputs, opts, scaling, stdin, paths)
    if config is not None and config.qk_norm_after_rope is not None:
        for name in ("q", "k"):
            inputs[name] = _l2_norm(inputs[name], config.qk_norm_after_rope)
        done["qk_norm_after_rope"] = {"eps": config.qk_norm_after_rope}
    grouped = repeat_kv(inputs)
    if grouped is not None:
        done["grouped_heads"] = {"query_heads": grouped[0], "kv_heads": grouped[1]}
    q = inputs["q"].data
    heads = int(q.shape[-3]) if has_heads and q.ndim >= 3 else None
    if config is not None and config.query_temperature is not None:
        done["query_temperature"] = _query_temperature(inputs, *config.query_temperature)
    scoring = read_scoring(opts, heads, config, stdin, paths)
    if scoring.described:
        done["scoring"] = scoring.described
    return done, scoring


def _l2_norm(loaded: Loaded, eps: float) -> Loaded:
    """Llama 4's ``x * rsqrt(mean(x^2) + eps)`` over each head's dimensions, in float32 as the model."""
    x = np.asarray(loaded.data, dtype=np.float32)
    normed = x / np.sqrt(np.mean(np.square(x), axis=-1, keepdims=True) + np.float32(eps))
    dtype = loaded.data.dtype if loaded.data.dtype.kind == "f" else np.float32
    return replace(loaded, data=normed.astype(dtype))


def _query_temperature(inputs: MutableMapping[str, Loaded], floor_scale: float, attn_scale: float) -> dict[str, Any]:
    """Llama 4's attention temperature on NoPE layers: query row ``i`` (at key position ``i + Lk - Lq``)
    times ``log1p(floor((p + 1) / floor_scale)) attn_scale + 1``, in float32 as the model."""
    q, lk = inputs["q"], inputs["k"].data.shape[-2]
    lq = q.data.shape[-2]
    positions = np.arange(lk - lq, lk, dtype=np.float32)
    scales = (np.log1p(np.floor((positions + np.float32(1)) / np.float32(floor_scale))) * np.float32(attn_scale)
              + np.float32(1)).astype(np.float32)
    dtype = q.data.dtype if q.data.dtype.kind == "f" else np.float32
    inputs["q"] = replace(q, data=(q.data * scales[:, None]).astype(dtype))
    return {"floor_scale": floor_scale, "attn_scale": attn_scale}


def _apply_rope(inputs: MutableMapping[str, Loaded], opts: CaptureOptions, scaling: dict[str, Any] | None,
                stdin: StdinReader | None, paths: list[Place]) -> dict[str, Any]:
    q, k = inputs["q"], inputs["k"]
    d = q.data.shape[-1]
    if k.data.shape[-1] != d:
        raise ShapeError(f"--rope: Q ({q.source}) and K ({k.source}) need the same last dimension; received "
                         f"{shape_str(q.data.shape)} and {shape_str(k.data.shape)}.")
    kind = rope_type(scaling)
    theta = opts.rope_theta
    if scaling is not None and scaling.get("rope_theta") is not None and theta == DEFAULT_THETA:
        theta = float(scaling["rope_theta"])
    partial = None if scaling is None else scaling.get("partial_rotary_factor")
    dims = opts.rope_dim if opts.rope_dim is not None else int(d * float(partial)) if partial and \
        kind != "proportional" else d
    if kind == "proportional":
        dims = d
    if not (0 < dims <= d and dims % 2 == 0):
        raise UsageError(f"--rope-dim {dims}: must be even, from 2 to the head size {d}.")
    lq, lk = q.data.shape[-2], k.data.shape[-2]
    if opts.positions is not None and lq != lk:
        raise UsageError(f"--positions: Q has {lq} positions and K {lk}; position ids cover Q and K of one "
                         "length (without --positions, queries take the last Lq key positions).")
    k_pos = _positions(opts, k.data.shape[:-2], lk, stdin, paths)
    q_pos = _positions(opts, q.data.shape[:-2], lq, stdin, paths) if opts.positions is not None \
        else np.arange(max(lk - lq, 0), max(lk - lq, 0) + lq)
    seq_len = int(max(np.max(k_pos), np.max(q_pos))) + 1 if lk and lq else 0
    max_positions = None if scaling is None else scaling.get("max_position_embeddings")
    inv_freq, factor = rope_frequencies(scaling, theta, d, dims, seq_len, max_positions)
    for name, pos in (("q", q_pos), ("k", k_pos)):
        loaded = inputs[name]
        rotated = apply_rope(loaded.data, rope_angles(pos, inv_freq), opts.rope_style, factor, opts.rope_part)
        dtype = loaded.data.dtype if loaded.data.dtype.kind == "f" else np.float32
        inputs[name] = replace(loaded, data=rotated.astype(dtype))
    done: dict[str, Any] = {"theta": theta, "style": opts.rope_style, "dims": dims,
                            **({"part": "last"} if opts.rope_part == "last" else {}),
                            "positions": spec_name(opts.positions) if opts.positions else "0..L-1"}
    if scaling is not None:
        done["scaling"] = {**scaling, "rope_type": kind, "attention_factor": factor}
    return done

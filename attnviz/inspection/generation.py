"""Generation dumps (``--generation``): the attentions of ``generate(..., output_attentions=True,
return_dict_in_generate=True)``, one tuple of layers per step, stitched into one map per layer.

The file holds arrays under keys ``STEP.LAYER`` (a ``torch.save`` of ``out.attentions``, or of
``out.decoder_attentions`` / ``out.cross_attentions``; an ``.npz`` or ``.safetensors`` with those keys;
a common prefix such as ``attentions.`` is allowed). Each is ``[batch, heads, q, k]`` (or ``[heads, q,
k]``). Step 0 is the forward pass over the prompt (``q`` rows, for a decoder-only model the prompt's
``P`` tokens); each later step adds the rows of the tokens it fed (one each, ``q = 1``).

* Self-attention (the keys grow with the rows: ``k_0 = q_0``, ``k_t = k_{t-1} + q_t``): one causal map
  ``[layers, batch, heads, L, L]`` over the prompt and the generated tokens, ``L = P + steps - 1``; the
  row of step ``t`` is the fed token's attention over everything before it, zeros to its right. The
  last generated token is never fed back, so it has no row: a label list of ``L + 1`` tokens (the whole
  ``out.sequences``) drops its last.
* Cross-attention (the same keys at every step, the encoder's): ``[layers, batch, heads, steps, S]``.

NumPy only.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from attnviz.errors import InputError, ShapeError, UsageError, shape_str
from attnviz.formats import Container, listing
from attnviz.io import StdinReader, open_spec, validate_array
from attnviz.sizes import memory_limit, size_str
from attnviz.storage import Place

STEP_LAYER = re.compile(r"^(?P<prefix>(?:.*\.)?)(?P<step>\d+)\.(?P<layer>\d+)$")


@dataclass(frozen=True)
class Generation:
    """What a generation dump held: steps, layers, the prompt's rows and the kind of attention."""

    steps: int
    layers: int
    prompt: int  # the rows of step 0
    kind: str  # "self" or "cross"

    def document(self) -> dict[str, object]:
        return {"steps": self.steps, "layers": self.layers, "prompt_rows": self.prompt, "attention": self.kind}


def looks_generated(keys: list[str]) -> bool:
    """Keys of generate()'s attentions saved whole (STEP.LAYER, several steps): to be read with --generation."""
    found = [STEP_LAYER.match(k) for k in keys]
    return bool(keys) and all(found) and len({m["step"] for m in found if m}) > 1


def _keys(raw: Container, source: str) -> dict[tuple[int, int], str]:
    found: dict[tuple[int, int], str] = {}
    prefixes = set()
    for key in raw.keys:
        m = STEP_LAYER.match(key)
        if m:
            found[(int(m["step"]), int(m["layer"]))] = key
            prefixes.add(m["prefix"])
    if not found:
        raise InputError(f"{source}: --generation reads arrays under keys STEP.LAYER (a torch.save of generate()'s "
                         f"out.attentions); it holds {listing(raw.keys) if raw.keys else 'none'}.")
    if len(prefixes) > 1:
        listed = ", ".join(sorted(p or "(none)" for p in prefixes))
        raise InputError(f"{source}: keys STEP.LAYER under several prefixes ({listed}); name one with FILE:PREFIX.*.")
    return found


def load_generation(spec: str, stdin: StdinReader | None = None
                    ) -> tuple[np.ndarray, str, Generation, list[str], Place | None]:
    """The stitched weights ``[layers, batch, heads, rows, keys]`` (float32), the source's name, what
    the dump held, the keys read and the file."""
    opened = open_spec(spec, stdin)
    raw, source = opened.raw, opened.source
    if not isinstance(raw, Container):
        raise InputError(f"{source}: --generation reads a file of arrays under keys STEP.LAYER (torch.save, .npz, "
                         ".safetensors, HDF5); this holds a single array.")
    if not raw.keys:
        from attnviz.errors import no_weights

        raise InputError(no_weights(f"{source} holds no arrays"))
    keys = _keys(raw, source)
    if opened.key is not None:
        wanted = set(raw.select(opened.key))
        keys = {sl: k for sl, k in keys.items() if k in wanted}
        source = f"{source}:{opened.key}"
        if not keys:
            raise InputError(f"{source}: no key STEP.LAYER matches.")
    steps = max(s for s, _ in keys) + 1
    layers = max(layer for _, layer in keys) + 1
    missing_steps = [s for s in range(steps) if not any((s, layer) in keys for layer in range(layers))]
    if missing_steps:
        raise InputError(f"{source}: generation step {missing_steps[0]} is missing (steps 0..{steps - 1} expected, "
                         "one tuple of layers per generated token).")
    for s in range(steps):
        absent = [layer for layer in range(layers) if (s, layer) not in keys]
        if absent:
            raise InputError(f"{source}: step {s} has no layer {absent[0]} (the other steps have {layers} layers).")
    shapes: dict[tuple[int, int], tuple[int, ...]] = {}
    arrays: dict[tuple[int, int], np.ndarray] = {}
    for sl, key in keys.items():
        arr = raw.get(key)
        if arr.ndim == 3:
            arr = arr[None]
        if arr.ndim != 4:
            raise ShapeError(f"{opened.source}:{key}: a step's attention is [batch, heads, q, k]; received "
                             f"{shape_str(arr.shape)}.")
        validate_array(arr, f"{opened.source}:{key}", allow_nonfinite=True)
        arrays[sl], shapes[sl] = arr, tuple(arr.shape)
    lead = {shape[:2] for shape in shapes.values()}
    if len(lead) != 1:
        listed = ", ".join(sorted(shape_str(s) for s in lead))
        raise ShapeError(f"{source}: the steps disagree on [batch, heads] ({listed}).")
    batch, heads = next(iter(lead))
    rows = [shapes[(s, 0)][2] for s in range(steps)]
    cols = [shapes[(s, 0)][3] for s in range(steps)]
    for (s, layer), shape in shapes.items():
        if shape[2:] != (rows[s], cols[s]):
            raise ShapeError(f"{source}: step {s} layer {layer} is {shape_str(shape)}, layer 0 of that step "
                             f"{shape_str(shapes[(s, 0)])}.")
    grows = cols[0] == rows[0] and all(cols[t] == cols[t - 1] + rows[t] for t in range(1, steps))
    fixed = all(c == cols[0] for c in cols)
    if grows and not (fixed and steps > 1 and rows[0] != cols[0]):
        kind, width = "self", cols[-1]
    elif fixed:
        kind, width = "cross", cols[0]
    else:
        listed = ", ".join(f"{s}: {shape_str(shapes[(s, 0)])}" for s in range(min(steps, 6)))
        raise ShapeError(f"{source}: the steps do not fit one generation (self-attention: each step's keys are the "
                         f"previous step's plus its rows; cross-attention: the same keys at every step); {listed}.")
    total = sum(rows)
    size = layers * batch * heads * total * width * 4
    if size > memory_limit():
        raise InputError(f"{source}: the stitched maps would take {size_str(size)}, more than the "
                         f"{size_str(memory_limit())} attnviz allows; save fewer layers or steps.")
    out = np.zeros((layers, batch, heads, total, width), dtype=np.float32)
    start = 0
    for s in range(steps):
        stop = start + rows[s]
        for layer in range(layers):
            out[layer, :, :, start:stop, :cols[s]] = arrays[(s, layer)]
        start = stop
    return out, source, Generation(steps, layers, rows[0], kind), [keys[sl] for sl in sorted(keys)], opened.path


def fit_labels(labels: list[str] | None, count: int, generation: Generation | None) -> list[str] | None:
    """Labels of a stitched self-attention map: the whole ``out.sequences`` (one more than the rows, the
    last token never fed back) loses its last."""
    if labels is not None and generation is not None and generation.kind == "self" and len(labels) == count + 1:
        return labels[:-1]
    return labels


def fit_mask(keep: np.ndarray, keys: int, generation: Generation | None) -> np.ndarray:
    """A prompt's ``[B, P]`` attention mask (or ``[B, P + steps]``, generate's final one) as the keys of a
    stitched self-attention map: generated tokens are real, so ones are added (or the last dropped)."""
    if generation is None or generation.kind != "self" or keep.ndim not in (1, 2):
        return keep
    width = keep.shape[-1]
    if width == generation.prompt and width < keys:
        pad = np.ones(keep.shape[:-1] + (keys - width,), dtype=keep.dtype)
        return np.concatenate([keep, pad], axis=-1)
    if width == keys + 1:
        return keep[..., :keys]
    return keep


def check_layout(layout: str | None) -> None:
    if layout is not None:
        raise UsageError("--layout goes without --generation: each step of a generation dump is [batch, heads, q, k].")

"""Value-norm maps (Kobayashi, Kuribayashi, Yokoi and Inui, EMNLP 2020, "Attention is Not Only a Weight"):
what each key actually contributes to a query, ``alpha_ij * || f_h(x_j) ||`` with ``f_h(x_j) = v_j^h W_O^h``
(the value of key j in head h, ``b_V`` included, through head h's slice of the output projection; ``b_O``
is not), from a capture file's ``SITE.v`` [B, Lk, Hkv, dv] and ``SITE.wo`` [H, dv, d_model]. Grouped-query
values are repeated to the query heads as the model does. The maps are not normalised: a row sums to the
norm-weighted mass the head moves, which is the point. The factorised form needs only ``[B, H, Lk]`` norms,
never the reference code's ``[B, H, Lq, Lk, d_model]`` tensor. NumPy only."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from attnviz.errors import CAPTURE_RUN, InputError, ShapeError, shape_str
from attnviz.inspection.weights import Weights


def value_norms(v: np.ndarray, wo: np.ndarray) -> np.ndarray:
    """``|| v_j^h W_O^h ||`` of every key and head, ``[B, H, Lk]``, from ``v`` [B, Lk, Hkv, dv] and ``wo``
    [H, dv, d_model] (each kv head's values serve ``H / Hkv`` query heads, in order, as ``repeat_kv``)."""
    heads = wo.shape[0]
    if v.ndim != 4 or wo.ndim != 3 or v.shape[-1] != wo.shape[1] or heads % v.shape[2]:
        raise ShapeError(f"value norms: v {shape_str(v.shape)} [B, Lk, Hkv, dv] and wo {shape_str(wo.shape)} "
                         "[H, dv, d_model] do not fit together.")
    vr = np.repeat(v.astype(np.float32, copy=False), heads // v.shape[2], axis=2)  # [B, Lk, H, dv]
    out = np.empty((v.shape[0], heads, v.shape[1]), np.float32)
    for h in range(heads):  # one head at a time: [B, Lk, d_model] at most
        out[:, h] = np.linalg.norm(vr[:, :, h] @ wo[h].astype(np.float32, copy=False), axis=-1)
    return out


def weigh(w: Weights, by: str) -> Weights:
    """The weights of ``w`` weighed as ``--weigh-by`` asks (``weights``: as they are)."""
    if by == "weights":
        return w
    if w.capture is None or w.kind is None:
        raise InputError(f"{w.source}: --weigh-by value-norms needs every layer's v and output projection W_O, "
                         f"which a capture file holds: {CAPTURE_RUN}.")
    if w.generation is not None:
        raise InputError(f"{w.source}: --weigh-by value-norms reads a capture's sites, not a generation dump.")
    sites = w.capture.sites(w.kind)
    for site in sites:
        for name, why in (("v", "captured without its values"),
                          ("wo", "attnviz found no output projection on its attention module")):
            if not w.capture.has(site, name):
                raise InputError(f"{w.source}: --weigh-by value-norms needs {site}.{name}, which the capture does "
                                 f"not hold ({why}).")
    data = np.empty(w.data.shape, np.float32)
    for layer, site in enumerate(sites):
        norms = value_norms(w.container.get(f"{site}.v"), w.container.get(f"{site}.wo"))
        if norms.shape != (w.shape[1], w.shape[2], w.shape[4]):
            raise ShapeError(f"{w.source}: {site}'s value norms {shape_str(norms.shape)} do not fit its weights "
                             f"{shape_str(w.shape[1:])} [batch, heads, Lq, Lk].")
        np.multiply(w.data[layer], norms[:, :, None, :], out=data[layer])
    return replace(w, data=data, weighed=by)

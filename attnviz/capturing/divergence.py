"""The Jensen-Shannon head distances of a corpus (Clark et al. 2019), summed over query rows from every head's
smoothed rows gathered flat: one function for the exact path (``capturing.corpus``, a mini-batch's weights) and
for a long text's blocks of rows (``capturing.corpuslong``), so that both round alike.

Per row, JS(h, k) = (1/2)(A_h + A_k) + (1/2) log 2 (C_h + C_k) - (1/2) M(h, k), with A = sum_j p log p,
C = sum_j p and M = sum_j t log t, t = p + q = 2m. Summed over rows, only M needs the pairs, and it is a sum over
(row, key) elements: over a flat ``[G, E]``, a head against a chunk of later heads a pass (a few hundred
thousand elements on a CPU: the pass stays in the cache).

The divergences are small differences of large sums (a near-uniform head's is ~1e-5 a row against sums of
order log n): each sum is taken in float64 (float32 on MPS) of float32 terms, and M of ``gamma t log(gamma t)``,
near 0 where rows are near uniform, in float32 over 64 elements then float64 (``pair_sums``).

torch is imported inside the functions.
"""

from __future__ import annotations

import math
from typing import Any

from attnviz.rowmath import TINY, plogp_torch  # TINY: what a zero becomes before its logarithm

#: elements of each temporary of the head distances (one head against K later heads over E elements: K x E);
#: on a CPU a pass this size stays in the cache, on a GPU it is large enough to fill the device
PAIR_BUDGET = 1 << 18
GPU_PAIR_BUDGET = 1 << 26
#: the elements summed in float32 before the float64 sum (``pair_sums``)
PARTIAL = 64


def divergence_sums(flat: Any, rows: int, clamp: bool) -> Any:
    """The Jensen-Shannon divergences between every two heads of ``flat`` ``[G, E]`` (every head's smoothed rows,
    ``0.001 / n_i + 0.999 A_ij`` over the keys row i may see and 0 off them, on the same E (row, key) elements of
    ``rows`` query rows) summed over those rows: ``[G, G]`` in the wide type, the pairs above the diagonal (on and
    below it, whatever the sums give). ``clamp``: some elements are 0 in two heads (a head that does not see a
    key another head sees)."""
    wide = sum_dtype(flat.device)
    a = plogp_torch(flat).sum(-1, dtype=wide)
    c = flat.sum(-1, dtype=wide)
    m = pair_sums(flat, clamp=clamp, per_row=flat.shape[1] / max(1, int(rows)))
    return 0.5 * (a[:, None] + a[None, :]) + (0.5 * math.log(2.0)) * (c[:, None] + c[None, :]) - 0.5 * m


def pair_sums(flat: Any, clamp: bool, per_row: float = 2.0) -> Any:
    """``M[h, k] = sum_e t log t`` with ``t = flat[h, e] + flat[k, e]`` for every h < k (0 on and below the
    diagonal), in the wide type; ``clamp``: some elements are 0 in both (t log t taken as 0 there).

    Of ``M`` only the divergences are wanted, small differences of large sums: the sums are taken of
    ``t' log t'`` with ``t' = gamma t`` (gamma = ``per_row`` / 2, the elements per row: t' near 1 where a row
    is near uniform, so the terms are small), float32 over 64 elements, then float64. Then
    ``M = sum t' log t' / gamma - log(gamma) sum t``."""
    import torch

    g, n = flat.shape
    wide = sum_dtype(flat.device)
    out = torch.zeros((g, g), dtype=wide, device=flat.device)
    if n == 0 or g < 2:
        return out
    gamma = max(1.0, per_row / 2)
    width = PARTIAL
    pad = -n % width
    scaled = torch.empty((g, n + pad), dtype=flat.dtype, device=flat.device)
    torch.mul(flat, gamma, out=scaled[:, :n])
    scaled[:, n:] = 0.5  # t' = 1 there: t' log t' = 0
    n += pad
    budget = GPU_PAIR_BUDGET if flat.device.type != "cpu" else PAIR_BUDGET
    kc = max(1, min(g - 1, budget // n))
    t_buf = torch.empty(kc * n, dtype=flat.dtype, device=flat.device)
    log_buf = torch.empty(kc * n, dtype=flat.dtype, device=flat.device)
    for h in range(g - 1):
        for k0 in range(h + 1, g, kc):
            k1 = min(g, k0 + kc)
            t = t_buf[:(k1 - k0) * n].view(k1 - k0, n)
            log_t = log_buf[:(k1 - k0) * n].view(k1 - k0, n)
            torch.add(scaled[h], scaled[k0:k1], out=t)
            if clamp:
                t.clamp_min_(TINY)
            torch.log(t, out=log_t)
            out[h, k0:k1] = log_t.mul_(t).view(k1 - k0, -1, width).sum(-1).sum(-1, dtype=wide)
    total = flat.sum(-1, dtype=wide)
    return out / gamma - math.log(gamma) * torch.triu(total[:, None] + total[None, :], diagonal=1)


def sum_dtype(device: Any) -> Any:
    """The type the sums are kept in: float64, float32 on MPS (which has no float64)."""
    import torch

    return torch.float32 if getattr(device, "type", "cpu") == "mps" else torch.float64


__all__ = ["GPU_PAIR_BUDGET", "PAIR_BUDGET", "divergence_sums", "pair_sums", "sum_dtype"]

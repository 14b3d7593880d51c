"""Checks for CI (exit 3 when one fails): rows sum to 1, nothing where a mask forbids it, nothing
above the diagonal, no NaN or infinity. ``rows`` (bool, broadcasting to [L, B, H, Lq]) marks the real
query rows: padded rows are skipped."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from attnviz.inspection.heads import CHUNK, row_blocks


@dataclass
class CheckResult:
    name: str
    passed: bool
    failures: int = 0  # rows or entries that fail
    worst: str = ""  # where and how much, for a person
    detail: dict[str, object] = field(default_factory=dict)  # the same for JSON

    def line(self) -> str:
        if self.passed:
            return f"{self.name}: passed"
        return f"{self.name}: FAILED, {self.failures} {self.detail.get('unit', 'entries')}; worst: {self.worst}"


def locate(index: Sequence[Any], names: Sequence[str] = ("layer", "batch", "head", "row", "column")) -> str:
    return ", ".join(f"{n} {int(i)}" for n, i in zip(names, index))


def _real_rows(rows: np.ndarray | None, shape: tuple[int, ...]) -> np.ndarray | None:
    return None if rows is None else np.broadcast_to(rows, shape[:-1])


def check_finite(w: np.ndarray, chunk: int = CHUNK, rows: np.ndarray | None = None) -> CheckResult:
    count, first = 0, None
    real = _real_rows(rows, w.shape)
    for idx, start, stop, block in row_blocks(w, chunk):
        bad = ~np.isfinite(block)
        if real is not None:
            bad &= real[idx][start:stop, None]
        if bad.any():
            count += int(bad.sum())
            if first is None:
                r, c = np.unravel_index(int(np.argmax(bad)), bad.shape)
                first = (*idx, start + int(r), int(c))
    if first is None:
        return CheckResult("check-finite", True)
    return CheckResult("check-finite", False, count, f"{locate(first)} is {w[first]}",
                       {"unit": "entries", "index": list(first)})


def all_finite(w: np.ndarray, chunk: int = CHUNK, rows: np.ndarray | None = None) -> bool:
    if rows is None:
        return all(np.isfinite(block).all()
                   for _, _, _, block in row_blocks(w, chunk, None if w.dtype.kind == "f" else np.float64))
    return check_finite(w, chunk, rows).passed


def check_rows(w: np.ndarray, atol: float, keep: np.ndarray | None = None,
               rows: np.ndarray | None = None) -> CheckResult:
    """Every real row that may attend somewhere sums to 1 within ``atol``."""
    sums = np.zeros(w.shape[:-1])
    for idx, start, stop, block in row_blocks(w):
        sums[idx][start:stop] = block.sum(axis=-1)
    live = np.ones(sums.shape, bool) if keep is None else np.broadcast_to(np.any(keep, axis=-1), sums.shape)
    if rows is not None:
        live = live & np.broadcast_to(rows, sums.shape)
    off = np.where(live, np.abs(sums - 1.0), 0.0)
    off = np.where(np.isnan(off), np.inf, off)
    bad = off > atol
    if not bad.any():
        return CheckResult("check-rows", True, detail={"atol": atol})
    worst = np.unravel_index(int(np.argmax(off)), off.shape)
    return CheckResult("check-rows", False, int(bad.sum()),
                       f"{locate(worst)} sums to {sums[worst]:.6g} (atol {atol:g})",
                       {"unit": "rows", "index": [int(i) for i in worst], "sum": float(sums[worst]), "atol": atol})


def check_masked(w: np.ndarray, keep: np.ndarray, atol: float, name: str, chunk: int = CHUNK,
                 rows: np.ndarray | None = None) -> CheckResult:
    """No weight above ``atol`` where ``keep`` is False (in the real rows)."""
    full_keep = np.broadcast_to(keep, w.shape)
    real = _real_rows(rows, w.shape)
    count, worst, worst_value = 0, None, -1.0
    for idx, start, stop, block in row_blocks(w, chunk):
        forbidden = ~full_keep[idx][start:stop]
        if real is not None:
            forbidden &= real[idx][start:stop, None]
        leak = np.where(forbidden, np.abs(np.nan_to_num(block, nan=np.inf)), 0.0)
        bad = leak > atol
        if bad.any():
            count += int(bad.sum())
            r, c = np.unravel_index(int(np.argmax(leak)), leak.shape)
            if leak[r, c] > worst_value:
                worst, worst_value = (*idx, start + int(r), int(c)), float(leak[r, c])
    if worst is None:
        return CheckResult(name, True, detail={"atol": atol})
    return CheckResult(name, False, count, f"{locate(worst)} has weight {w[worst]:.6g} on a masked position",
                       {"unit": "entries", "index": [int(i) for i in worst], "weight": float(w[worst]), "atol": atol})



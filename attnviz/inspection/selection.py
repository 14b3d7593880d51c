"""What a run over saved weights looks at: the map the tables show (``--layer``, ``--batch``,
``--head``), the layers and heads the grids draw (``--layers``, ``--heads``), and the token labels
of the two axes. Checked against the weights ``[layers, batch, heads, Lq, Lk]``: a choice out of
range is a usage error that names the size."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from attnviz.errors import InputError, UsageError
from attnviz.inspection.options import LabelOptions
from attnviz.storage import Place
from attnviz.text import visible

if TYPE_CHECKING:
    from attnviz.inspection.generation import Generation


def _inert(text: str, limit: int = 40) -> str:
    return visible(text[:limit] + "..." if len(text) > limit else text)


def select_indices(text: str | None, size: int, option: str, what: str) -> list[int] | None:
    """The positions ``--layers 0,3,5-7`` chooses among ``size`` (None: all), in the order given,
    each once. A number below 0 or from ``size`` up, or a range going down, is a usage error that
    names the size."""
    if text is None:
        return None
    chosen: list[int] = []
    for part in text.split(","):
        if not part:
            continue
        found = re.fullmatch(r"(-?\d+)(?:-(-?\d+))?", part, re.ASCII)
        if found is None:
            raise UsageError(f"{option} {_inert(text)}: expected numbers and ranges separated by commas, e.g. 0,3,5-7.")
        low = int(found.group(1))
        high = int(found.group(2)) if found.group(2) is not None else low
        for value in (low, high):
            if not 0 <= value < size:
                raise UsageError(f"{option} {_inert(text)}: {what} {value} is out of range; the weights have {size} "
                                 f"{what}s (0-{size - 1}).")
        if high < low:
            raise UsageError(f"{option} {_inert(text)}: the range {part} goes down; write it {high}-{low}.")
        chosen.extend(i for i in range(low, high + 1) if i not in chosen)
    if not chosen:
        raise UsageError(f"{option} {_inert(text)}: chooses no {what}.")
    return chosen


@dataclass(frozen=True)
class GridChoice:
    """The layers and heads the grids draw (``--layers``, ``--heads``; all when not given), and
    ``--reduce-heads`` (one map per layer: the mean or max of its chosen heads)."""

    layers: list[int]
    heads: list[int]
    reduce_heads: str | None = None


def grid_choice(layers: str | None, heads: str | None, shape: tuple[int, ...],
                reduce_heads: str | None = None) -> GridChoice:
    """``--layers``/``--heads`` checked against the weights ``[layers, batch, heads, Lq, Lk]`` (exit 2
    naming the size)."""
    chosen_layers = select_indices(layers, shape[0], "--layers", "layer")
    chosen_heads = select_indices(heads, shape[2], "--heads", "head")
    return GridChoice(chosen_layers if chosen_layers is not None else list(range(shape[0])),
                      chosen_heads if chosen_heads is not None else list(range(shape[2])), reduce_heads)


def read_labels(options: LabelOptions, lq: int, lk: int, paths: list[Place],
                generation: Generation | None = None) -> tuple[list[str] | None, list[str] | None]:
    """The labels of the queries and the keys (None where not given), checked against ``lq`` and
    ``lk``; the files read are appended to ``paths``. For a stitched generation, the whole sequence
    (one token more than the rows) loses its last token (``generation.fit_labels``)."""
    from attnviz.inspection.generation import fit_labels
    from attnviz.io import load_labels

    labels, q_labels, k_labels = options.labels, options.q_labels, options.k_labels
    if labels is not None and (q_labels or k_labels):
        raise UsageError("--labels sets both axes; give it alone, or --q-labels and --k-labels.")
    if labels is not None and lq != lk:
        raise UsageError(f"--labels labels both axes, but the maps are [{lq}, {lk}]; use --q-labels and --k-labels.")
    out: list[list[str] | None] = []
    for option, spec, n, axis in (("--q-labels", q_labels or labels, lq, "queries"),
                                  ("--k-labels", k_labels or labels, lk, "keys")):
        if spec is None:
            out.append(None)
            continue
        values, path, how = load_labels(spec)
        if path is not None:
            paths.append(path)
        values = fit_labels(values, n, generation) or values
        if len(values) != n:
            raise InputError(f"{option if not labels else '--labels'} ({how}): {len(values)} labels for {n} {axis}.")
        out.append(values)
    return out[0], out[1]

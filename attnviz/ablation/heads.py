"""Heads and what is done to them: the restrictions of ``attnviz ablate``, heads named as everywhere in attnviz
(``LAYER:HEAD``; for a grouped-query model, with ``--kv-heads``, a key-value head and the query heads that share it),
and a plan (each batch entry's restricted heads, per layer). The standard library only.

Restrictions (each on the keys a query row sees, or on the head's output):

- ``stream``: the first ``sink`` real keys and the last ``recent`` keys (``i - recent < j <= i``):
  DuoAttention's streaming heads, whose KV cache holds ``sink + recent`` entries whatever the length;
- ``window``: the last ``window`` keys only (``i - window < j <= i``), a sliding-window head;
- ``zero``: the head's output set to zero (the head removed);
- ``mean``: the head's output replaced by its mean over the prompt's real rows (mean ablation).

A key-value head streams for every query head that shares it: query head ``q`` reads key-value head
``q // (heads // kv_heads)`` (transformers' ``repeat_kv``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from attnviz.errors import UsageError

KINDS = ("stream", "window", "zero", "mean")


@dataclass(frozen=True)
class Restriction:
    """What is done to a head: ``kind`` (one of ``KINDS``) with ``sink`` and ``recent`` (stream) or ``window``."""

    kind: str = "stream"
    sink: int = 0
    recent: int = 0
    window: int = 0

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise UsageError(f"restriction {self.kind!r}: choose one of {', '.join(KINDS)}.")
        if self.kind == "stream" and (self.sink < 0 or self.recent < 1):
            raise UsageError(f"a streaming head keeps sink >= 0 and recent >= 1 keys (sink {self.sink}, recent "
                             f"{self.recent}).")
        if self.kind == "window" and self.window < 1:
            raise UsageError(f"a window keeps at least one key (window {self.window}).")

    @property
    def masks(self) -> bool:
        """Whether the restriction is on the keys (a mask) rather than on the head's output."""
        return self.kind in ("stream", "window")

    def describe(self) -> str:
        if self.kind == "stream":
            return f"stream (the first {self.sink} and the last {self.recent} keys)"
        if self.kind == "window":
            return f"window (the last {self.window} keys)"
        return "output zeroed" if self.kind == "zero" else "output replaced by its mean over the prompt's rows"

    def cache(self, length: int) -> int:
        """The KV-cache entries the head keeps at ``length`` tokens (a removed head keeps none)."""
        if self.kind == "stream":
            return min(length, self.sink + self.recent)
        if self.kind == "window":
            return min(length, self.window)
        return 0

    def as_dict(self) -> dict[str, object]:
        out: dict[str, object] = {"kind": self.kind}
        if self.kind == "stream":
            out.update(sink=self.sink, recent=self.recent)
        elif self.kind == "window":
            out["window"] = self.window
        return out


@dataclass(frozen=True)
class Geometry:
    """A model's attention heads: ``layers`` attention layers, ``heads`` query heads and ``kv_heads`` key-value
    heads each."""

    layers: int
    heads: int
    kv_heads: int

    @property
    def group(self) -> int:
        """Query heads per key-value head."""
        return self.heads // self.kv_heads

    def query_heads(self, kv_head: int) -> list[int]:
        """The query heads that read key-value head ``kv_head``."""
        return list(range(kv_head * self.group, (kv_head + 1) * self.group))

    def kv_head(self, head: int) -> int:
        return head // self.group

    def units(self, kv_heads: bool) -> list[tuple[int, int]]:
        """Every (layer, head), of key-value heads or query heads, in order."""
        per = self.kv_heads if kv_heads else self.heads
        return [(layer, head) for layer in range(self.layers) for head in range(per)]


HEAD = re.compile(r"^\s*(-?\d+)\s*:\s*(\*|\d+)\s*$")


def parse_heads(spec: str, geometry: Geometry, *, kv_heads: bool = False,
                option: str = "--stream") -> list[tuple[int, int]]:
    """``"L:H,L:H"`` (``L:*``: every head of layer L; a negative layer counts from the end) as (layer, head) pairs
    of query heads, or of key-value heads with ``kv_heads``; one usage error naming a head that does not exist."""
    per = geometry.kv_heads if kv_heads else geometry.heads
    what = "key-value heads" if kv_heads else "heads"
    out: list[tuple[int, int]] = []
    for part in spec.split(","):
        if not part.strip():
            continue
        match = HEAD.match(part)
        if match is None:
            raise UsageError(f"{option} {part.strip()!r}: name a head as LAYER:HEAD (e.g. 18:2, or 18:* for every "
                             "head of layer 18).")
        layer = int(match.group(1))
        if not -geometry.layers <= layer < geometry.layers:
            raise UsageError(f"{option} {part.strip()}: the model has {geometry.layers} attention layers "
                             f"(0-{geometry.layers - 1}).")
        layer %= geometry.layers
        heads = range(per) if match.group(2) == "*" else [int(match.group(2))]
        for head in heads:
            if head >= per:
                hint = "" if kv_heads or geometry.kv_heads == geometry.heads else (
                    f"; with --kv-heads, heads are the {geometry.kv_heads} key-value heads")
                raise UsageError(f"{option} {part.strip()}: layer {layer} has {per} {what} (0-{per - 1}){hint}.")
            if (layer, head) not in out:
                out.append((layer, head))
    if not out:
        raise UsageError(f"{option}: name at least one head (LAYER:HEAD).")
    return out


@dataclass
class Plan:
    """The restricted query heads of each batch entry: ``entries[b][layer][head]`` a ``Restriction``."""

    entries: list[dict[int, dict[int, Restriction]]] = field(default_factory=list)

    @classmethod
    def of(cls, heads: list[tuple[int, int]], restriction: Restriction, geometry: Geometry, *, kv_heads: bool = False,
           batch: int = 1) -> Plan:
        """The same restriction of ``heads`` (query heads, or key-value heads with ``kv_heads``) in every entry."""
        one = restricted(heads, restriction, geometry, kv_heads=kv_heads)
        return cls([one for _ in range(batch)])

    def at(self, layer: int) -> list[dict[int, Restriction]]:
        """Each entry's restricted heads of ``layer`` (an empty dict where none)."""
        return [entry.get(layer, {}) for entry in self.entries]

    def touches(self, layer: int) -> bool:
        return any(layer in entry for entry in self.entries)


def restricted(heads: list[tuple[int, int]], restriction: Restriction, geometry: Geometry, *,
               kv_heads: bool = False) -> dict[int, dict[int, Restriction]]:
    """``{layer: {query head: restriction}}`` for ``heads`` (key-value heads expanded to the query heads that
    share them)."""
    out: dict[int, dict[int, Restriction]] = {}
    for layer, head in heads:
        for q in (geometry.query_heads(head) if kv_heads else [head]):
            out.setdefault(layer, {})[q] = restriction
    return out


def label(layer: int, head: int, geometry: Geometry | None = None, *, kv_heads: bool = False) -> str:
    """``L:H``, and for a key-value head the query heads that share it (``18:2 (18:6-18:8)``)."""
    if not kv_heads or geometry is None or geometry.group == 1:
        return f"{layer}:{head}"
    qs = geometry.query_heads(head)
    return f"{layer}:{head} (q {layer}:{qs[0]}-{qs[-1]})"

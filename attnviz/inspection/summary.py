"""Reading a summary capture (``attnviz capture --summary``; ``attnviz.summarystats`` defines each array):
the per-head table, the received attention by position, the pooled maps, the chosen rows, spans and
retrieval heads. NumPy only; every array is read once, and none is larger than ``[layers, B, H, Lk]``
(the pooled maps are at most P x P per head)."""

from __future__ import annotations

import re
import warnings
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from attnviz.errors import InputError, UsageError
from attnviz.rowmath import normalised_entropy, real_ends, row_rule
from attnviz.statistics import BY_NAME, SINK_EPSILON, SUMMARY, names
from attnviz.summarystats import PER_ROW

#: the per-head table of a summary (``summary`` in the table of ``attnviz.statistics``): the same fields as
#: ``inspect``'s head statistics of exact weights (``attnviz.inspection.heads.HEAD_STATS``), then the summary's own
#: (retrieval apart: its scores are the decode rows', ``retrieval_scores``)
HEAD_FIELDS = tuple(n for n in names(SUMMARY) if BY_NAME[n].rows != "decode")


def is_summary(capture: Any) -> bool:
    """Whether a capture file (``capturefile.Capture``) holds summaries instead of weights."""
    return isinstance(capture.metadata.get("summary"), dict)


@dataclass
class Span:
    """A span of key positions ``[start, end)`` with a name (``--span``, ``--span-text``); a span found by its
    text is ``occurrence`` (1-based) of the ``found`` places the tokens spell it, ``chosen`` when the user said
    which (``NAME=TEXT@k``)."""

    name: str
    start: int
    end: int
    occurrence: int | None = None
    found: list[tuple[int, int]] = field(default_factory=list)
    chosen: bool = False

    def document(self) -> dict[str, Any]:
        """Where a span found by its text lies among the places it was found (for the JSON documents)."""
        if self.occurrence is None:
            return {}
        return {"occurrence": self.occurrence, "occurrences": len(self.found)}


@dataclass
class SummaryRead:
    """The arrays of one kind of sites of a summary capture, stacked over sites as layers."""

    source: str
    kind: str
    sites: list[str]
    settings: dict[str, Any]
    rows: dict[str, np.ndarray]  # PER_ROW and argmax, [layers, B, H, Lq]
    keys_seen: np.ndarray  # [layers, B, Lq], or [layers, B, H, Lq] where a site's mask differs per head
    received: np.ndarray  # [layers, B, H, Lk]
    seen_by: np.ndarray  # [layers, B, Lk], or [layers, B, H, Lk] as keys_seen
    pooled_mean: np.ndarray  # [layers, B, H, Pq, Pk]
    pooled_max: np.ndarray
    q_edges: list[int]
    k_edges: list[int]
    real_keys: np.ndarray  # [B, Lk] (of the first site)
    chosen: np.ndarray | None  # [layers, B, H, R, Lk]
    chosen_positions: list[int]
    step_rows: np.ndarray | None  # [layers, B, H, N, Lk]: generate()'s decode rows
    tokens: list[list[str]] | None
    key_tokens: list[list[str]] | None
    input_ids: np.ndarray | None
    self_attention: bool = True
    metadata: dict[str, Any] = field(default_factory=dict)
    generated_ids: np.ndarray | None = None  # [B, N]: generate()'s tokens past the prompt, the last one too
    token_style: str | None = None  # how the tokens stand for text (``attnviz.tokentext``)
    generated: list[str] | None = None  # the text each batch entry generated

    def key_labels(self, entry: int) -> list[str] | None:
        """The keys' tokens of batch entry ``entry`` as labels: the text each stands for (``attnviz.tokentext``)."""
        from attnviz.tokentext import shown

        rows = self.key_tokens
        if not rows:
            return None
        return [shown(t, self.token_style) for t in (rows[entry] if len(rows) > entry else rows[0])]

    @property
    def shape(self) -> tuple[int, int, int, int, int]:
        layers, b, h, lq = self.rows["entropy"].shape
        return layers, b, h, lq, self.received.shape[-1]

    @property
    def keys_seen_heads(self) -> np.ndarray:
        """[layers, B, 1 or H, Lq]: the keys each row may see (of each head, where a mask differs per head)."""
        return self.keys_seen if self.keys_seen.ndim == 4 else self.keys_seen[:, :, None]

    @property
    def seen_by_heads(self) -> np.ndarray:
        """[layers, B, 1 or H, Lk]: the real rows that may see each key (of each head, as ``keys_seen_heads``)."""
        return self.seen_by if self.seen_by.ndim == 4 else self.seen_by[:, :, None]

    @property
    def real_rows(self) -> np.ndarray:
        """[B, Lq]: the rows that are not padding (self-attention: their own position is a real key)."""
        _, b, _, lq, lk = self.shape
        if self.self_attention and lq <= lk:
            return self.real_keys[:, lk - lq:]
        return np.ones((b, lq), bool)


def read_summary(raw: Any, capture: Any, kind: str) -> SummaryRead:
    """The summary arrays of the sites of ``kind``, stacked as layers."""
    from attnviz.capturefile import array_shape, mask_parts_of

    sites = capture.sites(kind)
    missing = [s for s in sites if not capture.has(s, "entropy")]
    if missing:
        raise InputError(f"{capture.source}: the site {missing[0]} holds no summary.")

    def stack(name: str, dtype: Any = np.float32) -> np.ndarray:
        arrays = [np.asarray(raw.get(f"{s}.{name}"), dtype=dtype) for s in sites]
        if name in ("keys_seen", "seen_by") and len({a.ndim for a in arrays}) > 1:  # some sites' masks per head
            heads = next(a.shape[1] for a in arrays if a.ndim == 3)
            arrays = [np.broadcast_to(a[:, None], (a.shape[0], heads, a.shape[-1])) if a.ndim == 2 else a
                      for a in arrays]
        shapes = sorted({a.shape for a in arrays})
        if len(shapes) > 1:
            listed = ", ".join(map(str, shapes))
            raise InputError(f"{capture.source}: the sites' {name} arrays differ in shape ({listed}); a summary's "
                             "sites of one kind share their shapes.")
        return np.stack(arrays)

    rows = {n: stack(n) for n in PER_ROW}
    rows["argmax"] = stack("argmax", np.int64)
    b, _, lq = rows["entropy"].shape[1:]
    lk = array_shape(raw, f"{sites[0]}.received")[-1]
    real = np.ones((b, lk), bool)
    if capture.has(sites[0], "real_keys"):
        real = np.broadcast_to(np.asarray(raw.get(f"{sites[0]}.real_keys"), bool)[..., -lk:], (b, lk)).copy()
    settings = dict(capture.metadata.get("summary") or {})
    from attnviz.summarystats import parse_rows, pool_edges

    pool = int(settings.get("pool", 256))
    edges = [np.asarray(raw.get(f"{sites[0]}.{n}")).tolist() if capture.has(sites[0], n) else None
             for n in ("pool_q_edges", "pool_k_edges")]
    chosen = stack("rows") if all(capture.has(s, "rows") for s in sites) else None
    steps = stack("step_rows") if all(capture.has(s, "step_rows") for s in sites) else None
    parts = mask_parts_of(capture, sites[0]) or {}
    ids = raw.get("input_ids") if "input_ids" in raw.keys and kind != "cross" else None
    if kind == "decoder" and "decoder_input_ids" in raw.keys:
        ids = raw.get("decoder_input_ids")
    read = SummaryRead(capture.source, kind, sites, settings, rows, stack("keys_seen", np.int64),
                       stack("received", np.float64), stack("seen_by", np.int64), stack("pooled_mean"),
                       stack("pooled_max"), edges[0] or pool_edges(lq, pool), edges[1] or pool_edges(lk, pool), real,
                       chosen, (np.asarray(raw.get(f"{sites[0]}.row_positions")).tolist()
                                if capture.has(sites[0], "row_positions") else
                                parse_rows(settings.get("rows"), lq)) if chosen is not None else [], steps,
                       capture.tokens(kind), capture.key_tokens(kind), None if ids is None else np.asarray(ids),
                       bool(parts.get("self_attention", kind != "cross")), capture.metadata,
                       np.asarray(raw.get("generated_ids")) if "generated_ids" in raw.keys and kind == "layers"
                       else None, capture.token_style(), capture.generated_texts() if kind == "layers" else None)
    _check_shapes(read)
    return read


def _check_shapes(s: SummaryRead) -> None:
    """The arrays of a summary agree with each other (a damaged or hand-made file fails here, in one line naming
    it, not later in a computation)."""
    layers, b, h, lq, lk = s.shape
    want: dict[str, tuple[int, ...]] = {"per-row statistics": (layers, b, h, lq), "received": (layers, b, h, lk),
            "seen_by": (layers, b, h, lk) if s.seen_by.ndim == 4 else (layers, b, lk),
            "keys_seen": (layers, b, h, lq) if s.keys_seen.ndim == 4 else (layers, b, lq)}
    got = {"per-row statistics": next((a.shape for a in s.rows.values() if a.shape != want["per-row statistics"]),
                                      want["per-row statistics"]),
           "received": s.received.shape, "seen_by": s.seen_by.shape, "keys_seen": s.keys_seen.shape}
    for name, (qe, n) in (("pool_q_edges", (s.q_edges, lq)), ("pool_k_edges", (s.k_edges, lk))):
        edges = np.asarray(qe)
        if edges.ndim != 1 or len(edges) < 2 or edges[0] != 0 or edges[-1] != n or (np.diff(edges) <= 0).any():
            raise InputError(f"{s.source}: {name} {edges.tolist()[:8]} do not cut the {n} positions into blocks "
                             f"(0 < ... < {n}).")
    pooled = (layers, b, h, len(s.q_edges) - 1, len(s.k_edges) - 1)
    want.update(pooled_mean=pooled, pooled_max=pooled)
    got.update(pooled_mean=s.pooled_mean.shape, pooled_max=s.pooled_max.shape)
    for name, shape in want.items():
        if tuple(got[name]) != shape:
            raise InputError(f"{s.source}: its {name} have shape {list(got[name])} where the summary's other arrays "
                             f"make {list(shape)} ([sites, batch, heads, ...]); the file is damaged or not a summary.")


def one_entry(s: SummaryRead, entry: int) -> SummaryRead:
    """The summary of batch entry ``entry`` alone (``head_table`` of it is that entry's)."""
    from dataclasses import replace

    at = slice(entry, entry + 1)
    return replace(s, rows={n: a[:, at] for n, a in s.rows.items()}, keys_seen=s.keys_seen[:, at],
                   received=s.received[:, at], seen_by=s.seen_by[:, at], pooled_mean=s.pooled_mean[:, at],
                   pooled_max=s.pooled_max[:, at], real_keys=s.real_keys[at],
                   chosen=None if s.chosen is None else s.chosen[:, at],
                   step_rows=None if s.step_rows is None else s.step_rows[:, at])


@dataclass
class PooledMap:
    """One head's pooled map (``pooled_mean`` or ``pooled_max`` ``[Pq, Pk]``; NaN: a cell with no real row, or
    none of whose keys its rows may see) with what each cell's mean is taken over: ``rows [Pq]`` the real rows of
    each query block that attend somewhere, ``widths [Pk]`` the keys of each key block."""

    cells: np.ndarray
    rows: np.ndarray
    widths: np.ndarray
    reduce: str = "mean"

    def coarser(self, fq: int, fk: int) -> PooledMap:
        """The map in blocks of ``fq x fk`` cells, as a summary pooled in blocks that large would hold them:
        ``mean`` the cells' means weighed by their sizes (rows x keys), a cell whose keys its rows cannot see
        counting 0 (as a masked weight does in the definition); ``max`` the largest. NaN where no cell of the
        block has a value. Exact: a coarser map of a coarser map is the coarser map."""
        pq, pk = self.cells.shape
        if fq == 1 and fk == 1:
            return self
        nq, nk = -(-pq // fq), -(-pk // fk)
        padded = np.full((nq * fq, nk * fk), np.nan)
        padded[:pq, :pk] = self.cells
        rows, widths = np.zeros(nq * fq), np.zeros(nk * fk)
        rows[:pq], widths[:pk] = self.rows, self.widths
        finite = np.isfinite(padded)
        some = finite.reshape(nq, fq, nk, fk).any(axis=(1, 3))
        if self.reduce == "max":
            out = np.where(finite, padded, -np.inf).reshape(nq, fq, nk, fk).max(axis=(1, 3))
        else:
            weight = rows[:, None] * widths[None, :]
            total = (np.where(finite, padded, 0.0) * weight).reshape(nq, fq, nk, fk).sum(axis=(1, 3))
            count = weight.reshape(nq, fq, nk, fk).sum(axis=(1, 3))
            with np.errstate(invalid="ignore", divide="ignore"):
                out = total / count
        return PooledMap(np.where(some, out, np.nan), rows.reshape(nq, fq).sum(1), widths.reshape(nk, fk).sum(1),
                         self.reduce)


def pooled_map(s: SummaryRead, layer: int, entry: int, head: int, reduce: str = "mean") -> PooledMap:
    """The pooled map of one head of one batch entry: block means (``reduce`` mean) or maxima (max)."""
    cells = (s.pooled_max if reduce == "max" else s.pooled_mean)[layer, entry, head]
    live = s.real_rows[entry] & (s.keys_seen_heads[layer, entry, min(head, s.keys_seen_heads.shape[2] - 1)] > 0)
    rows = np.add.reduceat(live.astype(np.float64), np.asarray(s.q_edges[:-1]))
    return PooledMap(np.asarray(cells, np.float64), rows, np.diff(np.asarray(s.k_edges)).astype(np.float64), reduce)


def head_table(s: SummaryRead) -> dict[str, np.ndarray]:
    """Per (layer, head) means over batch entries and real rows that attend somewhere, as
    ``attnviz.inspection.heads.head_statistics`` defines them on exact weights: ``previous`` and ``first``
    over the rows after the first real one, ``entropy_norm`` over rows with more than one key. Plus the
    summary's ``sink_mass``, ``local_mass`` and ``total``, and ``rows`` (the rows counted)."""
    layers, b, h, lq, _ = s.shape
    real = s.real_rows  # [B, Lq]
    live = np.isfinite(s.rows["entropy"]) & real[None, :, None, :]  # [layers, B, H, Lq]
    first_row, _ = real_ends(real)  # [B]
    # each statistic over the rows of its rule (attnviz.statistics)
    where = {rule: row_rule(rule, live, np.arange(lq)[None, None, None, :], first_row[None, :, None, None], None)
             for rule in ("counted", "later")}
    out: dict[str, np.ndarray] = {}
    count = live.sum(axis=(1, 3)).astype(np.float64)

    def mean(values: np.ndarray, where: np.ndarray) -> np.ndarray:
        total = np.where(where, values.astype(np.float64), 0.0).sum(axis=(1, 3))
        n = where.sum(axis=(1, 3))
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(n > 0, total / n, np.nan)

    for name in HEAD_FIELDS:
        if name != "entropy_norm":
            out[name] = mean(s.rows[name], where[BY_NAME[name].rows])
    # no row later than the first (one-token inputs): first over every row counted, previous 0 (as heads does)
    none_later = ~where["later"].any(axis=(1, 3)) & (count > 0)
    out["first"] = np.where(none_later, mean(s.rows["first"], live), out["first"])
    out["previous"] = np.where(none_later, 0.0, out["previous"])
    n_keys = s.keys_seen_heads.astype(np.float64)  # [layers, B, 1 or H, Lq]
    many = live & (n_keys > 1)
    normed = np.where(many, normalised_entropy(s.rows["entropy"], n_keys), 0.0)
    n_many = many.sum(axis=(1, 3)).astype(np.float64)
    out["entropy_norm"] = np.where(n_many > 0, normed.sum(axis=(1, 3)) / np.maximum(n_many, 1),
                                   np.where(count > 0, 0.0, np.nan))
    out["rows"] = count
    return out


def received_profile(s: SummaryRead) -> dict[str, np.ndarray]:
    """The attention each key receives: ``sum`` [layers, B, H, Lk] as recorded, ``mean`` the sum over the
    real rows that see the key divided by their number (kvpress' observed attention: early keys of a causal
    model are seen by more rows), NaN for keys no real row sees."""
    seen = s.seen_by_heads
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = np.where(seen > 0, s.received / seen, np.nan)
    return {"sum": s.received, "mean": mean, "seen_by": s.seen_by}


SPAN_RE = re.compile(r"^(?P<name>[^=]+)=(?P<start>-?\d+):(?P<end>-?\d+)$")
#: ``TEXT@k``: the k-th place (1-based; negative from the last) the tokens spell TEXT
OCCURRENCE_RE = re.compile(r"^(?P<text>.*\S)@(?P<k>-?\d+)$", re.DOTALL)


def parse_spans(spans: list[str], texts: list[str], s: SummaryRead, batch: int = 0) -> list[Span]:
    """``--span NAME=START:END`` (key positions, END exclusive, negative from the end) and ``--span-text
    NAME=TEXT`` (the first place the tokens of batch entry ``batch`` spell TEXT; ``NAME=TEXT@k`` the k-th) as
    spans; bad ones are usage errors naming them."""
    lk = s.shape[-1]
    out: list[Span] = []
    for spec in spans:
        m = SPAN_RE.match(spec.strip())
        if not m:
            raise UsageError(f"--span {spec!r}: give NAME=START:END (token positions, END exclusive).")
        start, end = int(m.group("start")), int(m.group("end"))
        start, end = (start + lk if start < 0 else start), (end + lk if end < 0 else end)
        if not 0 <= start < end <= lk:
            raise UsageError(f"--span {spec}: outside the sequence of {lk} tokens (0..{lk}).")
        if not s.real_keys[batch, start:end].all():
            raise UsageError(f"--span {spec}: covers padding of batch entry {batch}; give the real tokens' positions.")
        out.append(Span(m.group("name"), start, end))
    for spec in texts:
        name, eq, text = spec.partition("=")
        if not eq or not name or not text:
            raise UsageError(f"--span-text {spec!r}: give NAME=TEXT (NAME=TEXT@k: the k-th place it is found).")
        out.append(text_span(s, name, text, batch, f"--span-text {spec}"))
    return out


def text_span(s: SummaryRead, name: str, text: str, batch: int, option: str) -> Span:
    """The span named ``name`` where the keys' tokens of entry ``batch`` spell ``text`` (``TEXT@k``: the k-th place,
    1-based, negative from the last; else the first); a text not found, or no k-th place, is a usage error
    naming ``option``."""
    wanted = None
    m = OCCURRENCE_RE.match(text)
    if m and m.group("k") not in ("0", "-0"):
        text, wanted = m.group("text"), int(m.group("k"))
    elif m:
        raise UsageError(f"{option}: @{m.group('k')}: places are counted from 1 (@1 the first, @-1 the last).")
    found = find_all(s.key_tokens, text, batch, s.token_style)
    if not found:
        raise UsageError(f"{option}: the tokens of batch entry {batch} do not spell {text!r}"
                         + ("" if s.key_tokens else " (the capture holds no tokens)") + ".")
    k = 1 if wanted is None else wanted
    if not -len(found) <= k <= len(found) or k == 0:
        raise UsageError(f"{option}: the tokens of batch entry {batch} spell {text!r} {_times(len(found))}; "
                         f"choose @1 to @{len(found)} (@-1 the last).")
    k = k if k > 0 else len(found) + 1 + k
    start, end = found[k - 1]
    return Span(name, start, end, k, found, wanted is not None)


def _times(n: int) -> str:
    return "once" if n == 1 else "twice" if n == 2 else f"{n} times"


def occurrence_note(option: str, text: str, spans: list[tuple[int, Span]]) -> str | None:
    """A line saying which of several places a text was taken at, and how to choose another (``TEXT@k``), for
    the entries (``(batch entry, span)``) where the user did not choose; None where it was found once."""
    several = [(entry, span) for entry, span in spans if len(span.found) > 1 and not span.chosen]
    if not several:
        return None
    entry, span = several[0]
    most = max(len(sp.found) for _, sp in several)
    places = ", ".join(f"{a}:{b}" for a, b in span.found[:4]) + (", ..." if len(span.found) > 4 else "")
    where = (f"batch entry {entry}" if len(spans) == 1 else
             f"batch entr{'y' if len(several) == 1 else 'ies'} {', '.join(str(e) for e, _ in several)}")
    return (f"{option}: the tokens of {where} spell {text!r} {_times(len(span.found))} (tokens {places}); the first "
            f"was taken ({span.start}:{span.end}); choose another with {text}@2" +
            (f" ... @{most}" if most > 2 else "") + " (@-1 the last)")


def _clean(token: str) -> str:
    return token.replace("\u0120", " ").replace("\u2581", " ").replace("##", "").replace("\u010a", "\n")


def find_all(tokens: list[list[str]] | None, text: str, batch: int,
             style: str | None = None) -> list[tuple[int, int]]:
    """Every token span of entry ``batch`` whose text holds ``text``, in order and apart: the text the tokens stand
    for (``attnviz.tokentext`` in ``style``; else with sub-word marks dropped), spaces ignored, case too (an
    uncased tokenizer lowers the text); each span the fewest tokens that hold it, every byte of its characters."""
    from attnviz.tokentext import STYLES, characters

    if not tokens:
        return []
    row = tokens[batch] if len(tokens) > batch else tokens[0]
    if style in STYLES:
        chars = characters(row, style)
    else:
        chars = [(c, i, i) for i, t in enumerate(row) for c in _clean(t)]
    hay, where = "", []  # the text without its spaces, lowered; each of its characters' (first, last) token
    for char, first, last in chars:
        if not char.isspace():
            low = char.lower()
            hay += low
            where += [(first, last)] * len(low)
    target = "".join(text.split()).lower()
    if not target:
        return []
    found: list[tuple[int, int]] = []
    at = hay.find(target)
    while at >= 0:
        start, end = where[at][0], where[at + len(target) - 1][1] + 1
        if not found or start >= found[-1][1]:
            found.append((start, end))
        at = hay.find(target, at + len(target))
    return found


def span_masses(s: SummaryRead, spans: list[Span], batch: int = 0) -> dict[str, dict[str, Any]]:
    """Per span: ``rows`` (each chosen row's weight on the span, [layers, H, R], when rows were recorded),
    and ``received`` (the span's mean received attention per key over the real rows that see it, [layers,
    H])."""
    out: dict[str, dict[str, Any]] = {}
    for span in spans:
        got: dict[str, Any] = {"start": span.start, "end": span.end}
        rec = s.received[:, batch, :, span.start:span.end].sum(-1)
        seen = s.seen_by_heads[:, batch, :, span.start:span.end].sum(-1).astype(np.float64)  # [layers, 1 or H]
        with np.errstate(invalid="ignore", divide="ignore"):
            got["received"] = np.where(seen > 0, rec / seen, np.nan)
        if s.chosen is not None:
            got["rows"] = s.chosen[:, batch, :, :, span.start:span.end].sum(-1)
            got["row_positions"] = list(s.chosen_positions)
        out[span.name] = got
    return out


#: Wu et al. 2024's threshold: a head whose retrieval score passes it is a retrieval head
RETRIEVAL_THRESHOLD = 0.1


@dataclass
class Retrieval:
    """Retrieval scores (Wu et al. 2024) of one needle in each batch entry: ``scores`` [layers, H] their mean over
    the entries, ``per_entry`` [B, layers, H], ``needles`` each entry's span, ``rows`` the decode rows read (the
    prompt's last row and every step), ``recall`` [B] how much of the needle each answer repeats (the share of
    the needle's tokens found among the generated tokens, counted with multiplicity: a ROUGE-1 recall over token
    ids)."""

    scores: np.ndarray
    per_entry: np.ndarray
    needles: list[Span]
    rows: int
    recall: np.ndarray
    threshold: float = RETRIEVAL_THRESHOLD

    def ranked(self) -> list[tuple[int, int, float]]:
        """(layer, head, score) of every head whose score passes the threshold, best first (ties: lower layer,
        then head)."""
        layers, h = self.scores.shape
        found = [(li, hi, float(self.scores[li, hi])) for li in range(layers) for hi in range(h)
                 if self.scores[li, hi] > self.threshold]
        return sorted(found, key=lambda t: (-t[2], t[0], t[1]))


def decode_rows(s: SummaryRead) -> tuple[np.ndarray, np.ndarray]:
    """The rows of ``generate()``'s steps, ``[layers, B, H, N, Lk]`` (keys at positions, 0 where a row does not
    reach), and the token each row generated ``[B, N]`` (-1 where the file does not hold it). Row 0 is the
    prompt's last row when the capture kept it (a capture under ``generate()`` always does): it decodes the
    first new token. The file's ``generated_ids`` hold every generated token, the last one too; an older file
    without them gives the tokens the steps ran over, which lack the last one."""
    if s.step_rows is None or s.input_ids is None:
        raise UsageError(f"{s.source}: retrieval scores need a capture made with --generate N and --summary.")
    layers, b, h, lq, lk = s.shape
    rows = [s.step_rows]
    with_last = s.chosen is not None and (lq - 1) in s.chosen_positions
    if with_last:
        assert s.chosen is not None
        last = s.chosen[:, :, :, s.chosen_positions.index(lq - 1)][:, :, :, None]
        pad = np.zeros((*last.shape[:-1], s.step_rows.shape[-1] - last.shape[-1]), last.dtype)
        rows = [np.concatenate([last, pad], -1), s.step_rows]
    decode = np.concatenate(rows, axis=3)
    n = decode.shape[3]
    first = 0 if with_last else 1  # the index among the generated tokens of row 0's token
    if s.generated_ids is not None:
        gen = np.asarray(s.generated_ids).reshape(b, -1)
    else:
        gen = np.asarray(s.input_ids).reshape(b, -1)[:, lq:]
    tokens = np.full((b, n), -1, np.int64)
    have = gen[:, first:first + n]
    tokens[:, :have.shape[1]] = have
    return decode, tokens


def retrieval_scores(s: SummaryRead, needles: list[Span]) -> Retrieval:
    """Wu et al. 2024's retrieval score of each (layer, head), each batch entry with its own needle span
    (``needles[b]``): a head *copies* at a decode step when its most-attended key lies inside the needle and the
    token there is the token that step generates; an entry's score is the number of distinct needle positions
    copied over the needle's length (at most 1), and ``scores`` their mean over the entries whose answer holds a
    token of the needle (an answer without one cannot have been copied from it: its entry's scores are NaN, and
    so is ``scores`` when no answer holds one). Every step counts:
    the prompt's last row (the first new token) and every later step, the last one included. (Wu et al.'s
    released code adds 1/length at every copying step, so a position copied twice counts twice and a score may
    pass 1; the paper's definition, a set of copied tokens, is the one kept here.)"""
    decode, tokens = decode_rows(s)
    layers, b, h, n, lk = decode.shape
    if len(needles) != b:
        raise UsageError(f"{s.source}: {b} batch entries but {len(needles)} needle spans.")
    ids = np.asarray(s.input_ids).reshape(b, -1)
    top = decode.argmax(-1)  # [layers, B, H, N]: the lowest key on ties
    live = decode.max(-1) > 0  # a row with weights (a step the entry did not reach has none)
    per_entry = np.zeros((b, layers, h))
    recall = np.zeros(b)
    for bi, span in enumerate(needles):
        length = span.end - span.start
        t_top = top[:, bi]  # [layers, H, N]
        at_top = ids[bi][np.minimum(t_top, ids.shape[1] - 1)]
        hit = ((t_top >= span.start) & (t_top < span.end) & live[:, bi] & (at_top == tokens[bi][None, None, :])
               & (tokens[bi] >= 0)[None, None, :])
        where = np.where(hit, t_top - span.start, -1)
        srt = np.sort(where, axis=-1)
        distinct = (srt[..., :1] >= 0).sum(-1) + ((srt[..., 1:] != srt[..., :-1]) & (srt[..., 1:] >= 0)).sum(-1)
        per_entry[bi] = distinct / length
        needle_ids = ids[bi, span.start:span.end].tolist()
        pool = [int(t) for t in tokens[bi] if t >= 0]
        found = 0
        for t in needle_ids:
            if t in pool:
                pool.remove(t)
                found += 1
        recall[bi] = found / length
    per_entry[recall == 0] = np.nan  # an answer without a needle token: no head could copy, its zeros mean nothing
    with np.errstate(invalid="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # every entry left out: no score (NaN)
        scores = np.nanmean(per_entry, axis=0)
    return Retrieval(scores, per_entry, list(needles), n, recall)


#: the rows the sink rate's alpha takes, in words (the JSON and the docs say it)
SINK_ROWS = "every real row that sees the first token, the first token's own row included"


@dataclass
class SinkRate:
    """Gu et al. 2024's sink rate: ``alpha`` [layers, B, H] the mean weight each head puts on the first real token
    over the rows that see it (``SINK_ROWS``); a (text, layer, head) is a sink when alpha > ``epsilon``; ``value``
    the share of sinks over every layer, head and text (the model-level figure), ``per_head`` [layers, H] the share
    of texts in which each head is one."""

    alpha: np.ndarray
    epsilon: float = SINK_EPSILON

    @property
    def sinks(self) -> np.ndarray:
        return np.isfinite(self.alpha) & (np.nan_to_num(self.alpha, nan=-1.0) > self.epsilon)

    @property
    def counted(self) -> np.ndarray:
        return np.isfinite(self.alpha)

    @property
    def value(self) -> float | None:
        n = int(self.counted.sum())
        return None if n == 0 else float(self.sinks.sum() / n)

    @property
    def per_head(self) -> np.ndarray:
        n = self.counted.sum(1)
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(n > 0, self.sinks.sum(1) / np.maximum(n, 1), np.nan)


def sink_rate(s: SummaryRead, epsilon: float = SINK_EPSILON) -> SinkRate:
    """Each head's alpha (``SinkRate``) from the per-row weight on the first real key (``first``): the mean over
    the real rows that attend somewhere and may see that key (a causal row at or after it, within a sliding
    window of it), the first token's own row included; NaN where no row sees it."""
    layers, b, h, lq, lk = s.shape
    real = s.real_rows
    live = np.isfinite(s.rows["entropy"]) & real[None, :, None, :]  # [layers, B, H, Lq]
    first_key, _ = real_ends(s.real_keys)  # [B]
    offset = lk - lq if s.self_attention and lq <= lk else 0
    pos = np.arange(lq)[None, :] + offset  # [1, Lq]
    sees = np.ones((b, lq), bool)
    parts = _site_parts(s)
    if parts.get("causal"):
        sees &= pos >= first_key[:, None]
    window = parts.get("window")
    if isinstance(window, int) and window > 0:
        sees &= pos - first_key[:, None] < window
    where = live & sees[None, :, None, :]
    n = where.sum(-1)
    total = np.where(where, s.rows["first"].astype(np.float64), 0.0).sum(-1)
    with np.errstate(invalid="ignore", divide="ignore"):
        alpha = np.where(n > 0, total / np.maximum(n, 1), np.nan)
    return SinkRate(alpha, epsilon)


def _site_parts(s: SummaryRead) -> dict[str, Any]:
    """The first site's mask as its parts (``causal``, ``window``) as the file's metadata names them; a file
    without them: causal for a decoder's self-attention (a row sees the keys up to its own)."""
    meta = (s.metadata.get("sites") or {}).get(s.sites[0]) if s.sites else None
    parts = meta.get("mask") if isinstance(meta, dict) else None
    if isinstance(parts, dict):
        return parts
    return {"causal": s.self_attention and s.kind in ("layers", "decoder")}


@dataclass
class SummaryResult:
    """What ``inspect`` finds in a summary capture (one batch entry's spans and pictures, every entry's head
    means)."""

    read: SummaryRead
    heads: dict[str, np.ndarray]
    received: dict[str, np.ndarray]
    spans: dict[str, dict[str, Any]]
    retrieval: Retrieval | None = None
    sinks: SinkRate | None = None
    batch: int = 0
    warnings: list[str] = field(default_factory=list)
    found_spans: list[Span] = field(default_factory=list)  # the spans asked for, where they were found
    tags: Any = None  # [layers, H] object array: each head's tags (``summary_tags``)


def summary_tags(read: SummaryRead, heads: dict[str, np.ndarray], sinks: SinkRate | None,
                 retrieval: Retrieval | None = None) -> np.ndarray:
    """Each head's tags (the rules of ``attnviz.statistics.TAGS`` for a summary) from its head means, the share of
    batch entries in which it is a sink (``sinks.per_head``) and its retrieval score where one was asked for;
    ``local`` only where the window (``--local W``) is at most a quarter of the keys (a window over most of a
    short text says nothing)."""
    from attnviz.inspection.tags import tag_heads

    values: dict[str, Any] = dict(heads)
    if sinks is not None:
        values["sink_rate"] = sinks.per_head
    if retrieval is not None:
        values["retrieval"] = retrieval.scores
    window = read.settings.get("local")
    wide = not isinstance(window, int) or 4 * window > read.shape[-1]
    return tag_heads(values, SUMMARY, skip=("local",) if wide else ())


def _opened_capture(spec: str) -> tuple[Any, Any]:
    """``(opened, capture)`` of a capture file (``attnviz.io.open_spec``'s, ``capturefile.Capture``), or
    ``(None, None)`` for any other input: stdin and arrays in memory are never opened here (stdin is read
    once, by the reader of weights), nor files a capture cannot be (.safetensors and .npz only)."""
    from attnviz.capturefile import as_capture
    from attnviz.formats import Container
    from attnviz.io import MEMORY, STDIN, open_spec, split_spec

    if spec == STDIN or spec.startswith(MEMORY) or not split_spec(spec)[0].lower().endswith((".safetensors", ".npz")):
        return None, None
    try:
        opened = open_spec(spec)
    except Exception:  # noqa: BLE001 - the weights reader says what is wrong with it
        return None, None
    if not isinstance(opened.raw, Container):
        return None, None
    return opened, as_capture(opened.raw)


def open_summary(spec: str) -> tuple[Any, Any, str] | None:
    """``(raw, capture, kind)`` when ``spec`` (a path or URL, ``:KIND`` allowed) is a summary capture; None
    for any other input (read as weights)."""
    opened, capture = _opened_capture(spec)
    if capture is None or not is_summary(capture):
        return None
    if opened.key is not None and opened.raw.has(opened.key):
        raise UsageError(f"{spec}: a summary capture is read whole (or by kind: FILE:cross), not one array.")
    return opened.raw, capture, capture.choose_kind(opened.key)


def analyse_summary(read: SummaryRead, *, batch: int | None = None, spans: list[str] | None = None,
                    span_texts: list[str] | None = None, needle: str | None = None) -> SummaryResult:
    """The head table over every batch entry and real row; the received profile; the spans and the
    retrieval scores of batch entry ``batch`` (0 by default)."""
    b = read.shape[1]
    bi = 0 if batch is None else batch
    if not 0 <= bi < b:
        raise UsageError(f"--batch {bi}: {read.source} holds {b} batch entr{'y' if b == 1 else 'ies'} (0..{b - 1}).")
    found = parse_spans(spans or [], span_texts or [], read, bi)
    result = SummaryResult(read, head_table(read), received_profile(read), span_masses(read, found, bi),
                           sinks=sink_rate(read), batch=bi, found_spans=found)
    needle_text = None if needle is None else _needle_text(needle, spans or [], span_texts or [])
    for span, spec in zip(found[len(spans or []):], span_texts or []):
        name, _, text = spec.partition("=")
        if needle_text is not None and name == needle:
            continue  # said of every entry below
        note = occurrence_note(f"--span-text {name}", f"{name}={text}", [(bi, span)])
        if note:
            result.warnings.append(note)
    if needle is not None:
        needles = [_needle_span(read, needle, spans or [], span_texts or [], entry) for entry in range(b)]
        result.retrieval = retrieval_scores(read, needles)
        if needle_text is not None:
            option = "--needle" if needle_text == needle else f"--needle {needle} (--span-text {needle})"
            spec = needle_text if needle_text == needle else f"{needle}={needle_text}"
            note = occurrence_note(option, spec, list(enumerate(needles)))
            if note:
                result.warnings.append(note)
        result.warnings += retrieval_warnings(result.retrieval, read.generated)
    result.tags = summary_tags(read, result.heads, result.sinks, result.retrieval)
    return result


def retrieval_warnings(r: Retrieval, generated: list[str] | None) -> list[str]:
    """What the answers say of the retrieval scores: an entry whose answer holds no token of the needle has no score
    (no head can copy a token the answer does not hold: its zeros would mean nothing), and one that repeats at most
    half of the needle's tokens measures little (Wu et al. score only answers that recall more than half)."""
    from attnviz.tokentext import one_line

    def answer(entry: int) -> str:
        return repr(one_line(generated[entry], 60)) if generated and entry < len(generated) else ""

    out = []
    none = [entry for entry, recall in enumerate(r.recall) if recall == 0]
    if none:
        said = "; ".join(f"{e}: {answer(e)}" if len(r.recall) > 1 else answer(e) for e in none[:3] if answer(e))
        said = f" ({said})" if said else ""
        if len(none) == len(r.recall):
            which = "the answer" if len(r.recall) == 1 else "no batch entry's answer"
            out.append(f"--needle: {which}{said} holds {'no token' if len(r.recall) == 1 else 'a token'} of the "
                       "needle: no head can have copied from it, so the retrieval scores of this run cannot mean "
                       "anything, and none is given (–); generate more tokens, or ask for the needle more plainly")
        else:
            out.append(f"--needle: the answer{'s' * (len(none) > 1)} of batch entr{'y' if len(none) == 1 else 'ies'} "
                       f"{', '.join(map(str, none))}{said} hold{'s' * (len(none) == 1)} no token of the needle: no "
                       "head can have copied from it, so the retrieval scores are the mean over the other entries")
    weak = [f"{entry} ({recall:.2f})" for entry, recall in enumerate(r.recall) if 0 < recall <= 0.5]
    if weak:
        out.append(f"--needle: the answer of batch entr{'y' if len(weak) == 1 else 'ies'} {', '.join(weak)} repeats "
                   "at most half of the needle's tokens (Wu et al. score only answers that recall more than half): the "
                   "retrieval scores of such an entry measure little; generate more tokens, or ask for the needle "
                   "more plainly")
    return out


def _needle_text(needle: str, spans: list[str], span_texts: list[str]) -> str | None:
    """The text the needle is found by (a ``--span-text`` of its name, or itself), None for a ``--span`` of its name."""
    if any(spec.partition("=")[0] == needle for spec in spans):
        return None
    return next((t.partition("=")[2] for t in span_texts if t.partition("=")[0] == needle), needle)


def _needle_span(read: SummaryRead, needle: str, spans: list[str], span_texts: list[str], entry: int) -> Span:
    """The needle's span in batch entry ``entry``: a ``--span NAME=START:END`` named ``needle`` (positions: the same
    in every entry), the text of a ``--span-text NAME=TEXT`` named ``needle``, or ``needle`` itself as text; a text
    is found in each entry's own tokens (left padding moves it)."""
    for spec in spans:
        if spec.partition("=")[0] == needle:
            return parse_spans([spec], [], read, entry)[0]
    text = _needle_text(needle, spans, span_texts)
    assert text is not None
    return text_span(read, needle, text, entry, f"--needle {needle}")


class _Computed:
    """Arrays computed in memory, read as ``read_summary`` reads a file's."""

    def __init__(self, source: str, arrays: dict[str, np.ndarray]) -> None:
        self.source, self.arrays, self.keys = source, arrays, list(arrays)

    def get(self, key: str) -> np.ndarray:
        return self.arrays[key]

    def has(self, key: str) -> bool:
        return key in self.arrays


def summarise_qk(raw: Any, capture: Any, kind: str, settings: Any = None) -> tuple[Any, Any]:
    """The summary of a capture that holds q and k but no weights (``--no-weights``), computed by attnviz's
    own blockwise scoring in NumPy (``attnviz.summarystats.summarise``) with each site's scale, softcap,
    sinks, position bias and mask: ``(arrays, capture)`` as ``read_summary`` takes them."""
    from dataclasses import replace

    from attnviz.capturefile import mask_parts_of
    from attnviz.summarystats import MaskParts, SummarySettings

    settings = settings or SummarySettings()
    arrays: dict[str, np.ndarray] = {}
    meta_sites = capture.metadata.get("sites", {})
    for site in capture.sites(kind):
        if not (capture.has(site, "q") and capture.has(site, "k")):
            raise InputError(f"{capture.source}: the site {site} holds neither weights nor q and k.")
        q = np.asarray(raw.get(f"{site}.q"), np.float32).transpose(0, 2, 1, 3)
        k = np.asarray(raw.get(f"{site}.k"), np.float32).transpose(0, 2, 1, 3)
        meta = meta_sites.get(site, {})
        if meta.get("window") and not mask_parts_of(capture, site) and not capture.has(site, "mask"):
            raise InputError(f"{capture.source}: {site} has a sliding window but no mask recorded.")
        parts_meta = mask_parts_of(capture, site)
        dense = None
        parts = MaskParts(self_attention=kind != "cross")
        if capture.has(site, "mask"):
            dense = np.asarray(raw.get(f"{site}.mask"), bool)
        elif parts_meta is not None:
            real = np.asarray(raw.get(f"{site}.real_keys"), bool) if capture.has(site, "real_keys") else None
            lq, lk = q.shape[2], k.shape[2]
            parts = MaskParts(causal=bool(parts_meta.get("causal")), window=parts_meta.get("window"), padding=real,
                              q_offset=lk - lq if parts_meta.get("self_attention", True) else 0,
                              self_attention=bool(parts_meta.get("self_attention", True)))
        sinks = np.asarray(raw.get(f"{site}.sinks")) if capture.has(site, "sinks") else None
        bias = np.asarray(raw.get(f"{site}.position_bias")) if capture.has(site, "position_bias") else None
        scale = meta.get("scale") or q.shape[-1] ** -0.5
        got = _summarised(q, k, scale=float(scale), settings=settings, parts=parts, dense=dense,
                          softcap=meta.get("softcap"), sinks=sinks, bias=bias)
        real_keys = got.pop("real_keys")
        for name, value in got.items():
            arrays[f"{site}.{name}"] = value
        arrays[f"{site}.real_keys"] = real_keys
    for name in ("input_ids", "decoder_input_ids"):
        if name in raw.keys:
            arrays[name] = np.asarray(raw.get(name))
    computed = _Computed(capture.source, arrays)
    meta = dict(capture.metadata)
    meta["summary"] = {**settings.as_metadata(), "computed_from": "q and k"}
    return computed, replace(capture, metadata=meta, keys=list(arrays))


def _summarised(q: np.ndarray, k: np.ndarray, **options: Any) -> dict[str, np.ndarray]:
    """One site's summary: by the torch blocks where torch is installed (the same definition, tested equal;
    several times quicker than NumPy's float64 form), else by ``attnviz.summarystats.summarise``."""
    from attnviz.summarystats import summarise

    try:
        import torch
    except ImportError:
        return summarise(q, k, **options)
    from dataclasses import replace

    from attnviz.summarytorch import summarise as in_torch

    def tensor(value: Any) -> Any:  # a copy of a read-only array (mapped from the file): torch warns of those
        return None if value is None else torch.from_numpy(np.require(value, requirements=("C", "W")))

    parts = options["parts"]
    if parts.padding is not None:
        options["parts"] = replace(parts, padding=tensor(np.asarray(parts.padding, bool)))
    for name in ("dense", "sinks", "bias"):
        options[name] = tensor(options.get(name))
    got = in_torch(tensor(q), tensor(k), **options)
    return {name: value.numpy() for name, value in got.items()}


def open_qk_capture(spec: str) -> tuple[Any, Any, str] | None:
    """``(arrays, capture, kind)`` of the summary computed from a capture's q and k when it holds no weights
    (``--no-weights``); None for any other input."""
    opened, capture = _opened_capture(spec)
    if capture is None or is_summary(capture) or (opened.key is not None and opened.raw.has(opened.key)):
        return None
    kind = capture.choose_kind(opened.key)
    sites = capture.sites(kind)
    if not sites or any(capture.has(s, "weights") for s in sites):
        return None
    computed, described = summarise_qk(opened.raw, capture, kind)
    return computed, described, kind


@dataclass
class SummaryComparison:
    """Two summaries of the same shape: each head statistic of A and B and the largest difference of each
    per-row statistic over the real rows."""

    a: SummaryResult
    b: SummaryResult
    row_diff: dict[str, float]  # per-row statistic: the largest |A - B| / max(1, |B|) over real rows
    head_diff: dict[str, np.ndarray]  # per head statistic: B - A, [layers, H]


def compare_summaries(a: SummaryRead, b: SummaryRead) -> SummaryComparison:
    """A and B must hold the same sites, heads and rows (the same run of two models, or two settings)."""
    if a.shape != b.shape:
        raise InputError(f"{b.source}: summaries of shape {list(b.shape)}, where {a.source} holds {list(a.shape)} "
                         "(sites, batch, heads, queries, keys); compare summaries of the same input.")
    left, right = analyse_summary(a), analyse_summary(b)
    real = a.real_rows[None, :, None, :] & b.real_rows[None, :, None, :]
    row_diff = {}
    for name in PER_ROW:
        both = real & np.isfinite(a.rows[name]) & np.isfinite(b.rows[name])
        theirs = b.rows[name].astype(np.float64)  # relative above 1: distances run to thousands
        diff = np.abs(a.rows[name].astype(np.float64) - theirs) / np.maximum(1.0, np.abs(theirs))
        row_diff[name] = float(diff[both].max()) if both.any() else 0.0
    head_diff = {name: right.heads[name] - left.heads[name] for name in HEAD_FIELDS}
    return SummaryComparison(left, right, row_diff, head_diff)


#: what --stat says of a column a summary could have but this run lacks
STAT_HINTS = {"retrieval": "retrieval scores need --needle NAME|TEXT (the needle's span) and a capture made with "
                           "--summary --generate N"}


def stat_columns(result: SummaryResult) -> dict[str, np.ndarray]:
    """The columns of the head table a layers x heads picture draws (``--stats-png --stat NAME``), each
    ``[layers, H]``: the head means (``HEAD_FIELDS``), the retrieval score where ``--needle`` scored it, the sink
    rate's share of texts in which each head is a sink (``sink_rate``, Gu et al. 2024) and each span's received
    attention (``on:NAME``, the table's ``on NAME``)."""
    columns = {name: np.asarray(result.heads[name], dtype=np.float64) for name in HEAD_FIELDS}
    if result.sinks is not None:
        columns["sink_rate"] = np.asarray(result.sinks.per_head, dtype=np.float64)
    if result.retrieval is not None:
        columns["retrieval"] = np.asarray(result.retrieval.scores, dtype=np.float64)
    for name, got in result.spans.items():
        columns[f"on:{name}"] = np.asarray(got["received"], dtype=np.float64)
    return columns

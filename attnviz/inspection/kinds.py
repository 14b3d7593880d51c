"""The four kinds of file ``inspect`` reads, told apart in one place (``kind_of``), and one function per kind that
reads and analyses it, checking every choice that depends on the data, and returns a typed result:

* ``WEIGHTS``, exact weights: ``attnviz.inspection.inspecting.prepare`` and ``analyse`` (``InspectResult``);
* ``SUMMARY``, a summary capture (``capture --summary``), and ``NO_WEIGHTS``, a ``--no-weights`` capture summarised
  from its q and k: ``inspect_summary`` (``SummaryInspection``);
* ``CORPUS``, a corpus file (``capture --corpus``): ``inspect_corpus`` (``CorpusInspection``);

and two summaries compared: ``compare_summary_files`` (``SummariesCompared``). The command line, the Python API,
``monitoring.records`` and the viewer call these; ``attnviz.render`` makes their tables, pictures and JSON
documents. NumPy only; nothing here prints or writes a file.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from attnviz.errors import InputError, UsageError
from attnviz.inspection.options import InspectOptions, SpanOptions

WEIGHTS, SUMMARY, NO_WEIGHTS, CORPUS = "weights", "summary", "no-weights", "corpus"
KINDS = (WEIGHTS, SUMMARY, NO_WEIGHTS, CORPUS)

#: what a span or a needle reads, said where it is given for another kind of file
SPANS_READ = "--span, --span-text and --needle read a summary capture (attnviz capture --summary)"
#: the outputs each kind cannot write, and what it draws instead (``refuse_outputs``)
NOT_DRAWN = {
    WEIGHTS: ("heads_map",),
    SUMMARY: ("overlay_png", "html", "save_maps"),
    CORPUS: ("map_png", "received_png", "overlay_png", "html", "save_maps"),
}


@dataclass
class Found:
    """What ``spec`` is (``kind``, one of ``KINDS``) and what telling it opened: a summary's or a summarised
    capture's ``(raw, capture, kind)`` (``summary``), a corpus file's metadata (``corpus``)."""

    spec: str
    kind: str
    summary: tuple[Any, Any, str] | None = None
    corpus: dict[str, Any] | None = None

    @property
    def summarised(self) -> bool:
        """A summary capture, or a ``--no-weights`` capture summarised from its q and k: read alike."""
        return self.summary is not None


def kind_of(spec: str) -> Found:
    """The kind of ``spec`` (a path or URL; ``FILE:KIND`` for a capture's sites): a corpus file, a summary capture, a
    capture of q and k without weights (its summary computed here, from them), or weights (any other input, arrays in
    memory and standard input included: the reader of weights says what is wrong with one that is none)."""
    from attnviz.corpusfile import corpus_meta_of
    from attnviz.inspection.summary import open_qk_capture, open_summary

    meta = corpus_meta_of(spec)
    if meta is not None:
        return Found(spec, CORPUS, corpus=meta)
    found = open_summary(spec)
    if found is not None:
        return Found(spec, SUMMARY, summary=found)
    found = open_qk_capture(spec)
    if found is not None:
        return Found(spec, NO_WEIGHTS, summary=found)
    return Found(spec, WEIGHTS)


def refuse_outputs(kind: str, source: str, outputs: dict[str, Any]) -> None:
    """The outputs asked for (``outputs``: inspect's output name, ``map_png``, ``html`` ..., and its value) that a
    file of ``kind`` cannot write: a usage error (exit 2) saying what it writes instead."""
    kind = SUMMARY if kind == NO_WEIGHTS else kind
    for name in NOT_DRAWN[kind]:
        if not outputs.get(name):
            continue
        flag = "--" + name.replace("_", "-")
        if kind == WEIGHTS:
            raise UsageError(f"{flag}: a picture of corpus files (attnviz capture --corpus); {source} holds weights.")
        if kind == SUMMARY:
            raise UsageError(f"{flag}: {source} holds summaries, not weights; it draws --png (pooled maps), "
                             "--received-png, --map-png (the chosen rows) and --stats-png.")
        raise UsageError(f"{flag}: {source} is a corpus file (per-head statistics, no maps); it draws --png, "
                         "--heads-map and --stats-png.")


def check_retrieval_sort(sort: str, spans: SpanOptions | None) -> None:
    """--sort retrieval needs --needle: said before any file is read or model run (exit 2)."""
    if sort == "retrieval" and not (spans and spans.needle):
        raise UsageError("--sort retrieval: retrieval scores need --needle NAME|TEXT (the needle's span) and a "
                         "capture made with --summary --generate N.")


def refuse_spans(found: Found, spans: SpanOptions | None) -> None:
    """--span, --span-text and --needle read a summary: refused for any other kind of file (exit 2)."""
    if found.summarised or spans is None or not spans.given:
        return
    if found.kind == CORPUS:
        raise UsageError(f"{SPANS_READ}; a corpus file holds per-head statistics.")
    raise UsageError(f"{SPANS_READ}.")


# ---------------------------------------------------------------------------------------------------
# exact weights


def check_weights_stat(stat: str, source: str) -> None:
    """``--stat`` on exact weights, before they are read: what exact weights have is known (the statistics of a
    summary or a corpus file alone are said to be theirs)."""
    from attnviz.statistics import CORPUS as CORPUS_FACE
    from attnviz.statistics import SUMMARY as SUMMARY_FACE
    from attnviz.statistics import WEIGHTS as WEIGHTS_FACE
    from attnviz.statistics import check_stat, names

    others = (*(n for n in names(SUMMARY_FACE) if n not in names(WEIGHTS_FACE)),
              *(n for n in names(CORPUS_FACE) if n not in names(WEIGHTS_FACE)))
    check_stat(dict.fromkeys(names(WEIGHTS_FACE)), stat, source,
               dict.fromkeys(others, "a column of a summary capture's or a corpus file's head table"))


# ---------------------------------------------------------------------------------------------------
# a summary capture, or a capture of q and k summarised


@dataclass
class SummaryInspection:
    """A summary capture inspected (or a ``--no-weights`` capture, summarised): the analysed ``result`` (its
    ``read``), the site the pictures of one layer show (``layer``: None for their default) and the head table's
    order (``sort``, a column's name; ``reverse``, ``top``)."""

    found: Found
    result: Any  # attnviz.inspection.summary.SummaryResult
    layer: int | None = None
    sort: str = "layer"
    reverse: bool = False
    top: int | None = None

    @property
    def read(self) -> Any:
        return self.result.read

    @property
    def source(self) -> str:
        return str(self.result.read.source)

    @property
    def warnings(self) -> list[str]:
        return list(self.result.warnings)

    def read_as(self) -> str:
        """inspect's line of what the file holds."""
        layers, b, h, lq, lk = self.read.shape
        kind = self.found.summary[2] if self.found.summary else "layers"
        what = "sites" if kind == "layers" else f"{kind} sites"
        return f"{self.source}: summaries of {layers} {what} x {h} heads, {lq} queries x {lk} keys, batch {b}"


def inspect_summary(found: Found, options: InspectOptions | None = None, spans: SpanOptions | None = None, *,
                    sort: str = "layer", reverse: bool = False, top: int | None = None, stat: str | None = None,
                    map_rows: bool = False, outputs: dict[str, Any] | None = None) -> SummaryInspection:
    """A summary capture (``found``, ``kind_of``'s) read and analysed: the head table over every batch entry and
    real row, the received profile, the spans and the retrieval scores of ``spans`` (``--span``, ``--span-text``,
    ``--needle``) of the batch entry ``options.selection.batch``. Checked against the data, each a usage error (exit
    2): ``sort`` (a column of a summary's table; retrieval needs a needle), the ``outputs`` it cannot draw, --layer's
    range, ``map_rows`` (--map-png) needing the rows chosen at capture, ``stat`` (--stats-png's column)."""
    from attnviz.inspection.summary import STAT_HINTS, analyse_summary, read_summary, stat_columns
    from attnviz.statistics import SUMMARY as SUMMARY_FACE
    from attnviz.statistics import check_stat, sort_key

    assert found.summary is not None
    options = options or InspectOptions()
    spans = spans or SpanOptions()
    raw, capture, kind = found.summary
    check_retrieval_sort(sort, spans)
    sort = sort_key(sort, SUMMARY_FACE, str(capture.source), absent=() if spans.needle else ("retrieval",))
    refuse_outputs(SUMMARY, str(capture.source), outputs or {})
    read = read_summary(raw, capture, kind)
    layers = read.shape[0]
    layer = options.selection.layer
    if layer is not None and not -layers <= layer < layers:
        raise UsageError(f"--layer {layer}: {capture.source} holds {layers} sites (0..{layers - 1}).")
    if map_rows and read.chosen is None:
        raise UsageError(f"--map-png: {capture.source} holds no chosen rows (capture with --rows).")
    result = analyse_summary(read, batch=options.selection.batch, spans=list(spans.span) or None,
                             span_texts=list(spans.span_text) or None, needle=spans.needle)
    if stat is not None:
        check_stat(stat_columns(result), stat, capture.source, STAT_HINTS)
    return SummaryInspection(found, result, None if layer is None else layer % layers, sort, reverse, top)


@dataclass
class SummariesCompared:
    """Two summaries (or ``--no-weights`` captures, summarised) compared: ``comparison`` (each head statistic of A
    and B, the largest difference of each per-row statistic), the reads of A and B, and --atol's check."""

    reads: tuple[Any, Any]
    comparison: Any  # attnviz.inspection.summary.SummaryComparison
    atol: float | None = None
    warnings: list[str] = field(default_factory=list)

    @property
    def worst(self) -> float:
        """The largest per-row difference."""
        return max(self.comparison.row_diff.values(), default=0.0)

    @property
    def failed(self) -> bool:
        return self.atol is not None and self.worst > self.atol


def compared_kinds(a: str, b: str) -> tuple[Found, Found]:
    """What ``compare`` reads in A and B (``kind_of``): two sets of weights, or summaries (``compare_summary_files``:
    one of them a summary). A corpus file holds no attention sites to compare: a data error (exit 1) naming it."""
    found = (kind_of(a), kind_of(b))
    for f in found:
        if f.kind == CORPUS:
            raise InputError(f"{f.spec}: a capture file with no attention sites.")
    return found


def compare_summary_files(a: Found, b: Found, atol: float | None = None,
                          outputs: dict[str, Any] | None = None) -> SummariesCompared:
    """A and B, summaries both (``kind_of``'s): a summary against weights, and the pictures (``outputs``: ``png``,
    ``html``), are usage errors; summaries of different shapes a data error (exit 1)."""
    from attnviz.inspection.summary import compare_summaries, read_summary

    if not (a.summarised and b.summarised):
        plain = b.spec if a.summarised else a.spec
        raise UsageError(f"{plain}: holds attention weights, the other file a summary; compare two summaries, or "
                         "two captures with weights.")
    for flag in ("png", "html"):
        if (outputs or {}).get(flag):
            raise UsageError(f"--{flag}: comparing summaries prints a table and JSON; draw each with inspect --png.")
    assert a.summary is not None and b.summary is not None
    reads = (read_summary(*a.summary), read_summary(*b.summary))
    return SummariesCompared(reads, compare_summaries(*reads), atol)


# ---------------------------------------------------------------------------------------------------
# a corpus file


@dataclass
class CorpusInspection:
    """A corpus file inspected: its ``sums`` (``attnviz.corpusfile.CorpusSums``), ``source`` and the head table's
    order (``sort``: a column's name or ``class:NAME``; ``reverse``, ``top``)."""

    sums: Any
    source: str
    sort: str = "layer"
    reverse: bool = False
    top: int | None = None
    warnings: list[str] = field(default_factory=list)

    def read_as(self) -> str:
        """inspect's line of what the file holds."""
        from attnviz.inspection.corpus import corpus_sites_text

        return f"corpus file: {corpus_sites_text(self.sums)}"


def inspect_corpus(found: Found, *, sort: str = "layer", reverse: bool = False, top: int | None = None,
                   stat: str | None = None, outputs: dict[str, Any] | None = None) -> CorpusInspection:
    """A corpus file (``found``, ``kind_of``'s) read, its choices checked (usage errors, exit 2): the ``outputs`` it
    cannot draw, ``sort`` (a statistic or a token class of the file), ``stat`` (--stats-png's column)."""
    from attnviz.corpusfile import read_corpus
    from attnviz.inspection.corpus import stat_columns
    from attnviz.statistics import CORPUS as CORPUS_FACE
    from attnviz.statistics import check_stat, sort_key

    path = found.spec
    refuse_outputs(CORPUS, path, outputs or {})
    sums = read_corpus(path)
    sort = sort_key(sort, CORPUS_FACE, path, sums.classes)
    if stat is not None:
        check_stat(stat_columns(sums), stat, path)
    return CorpusInspection(sums, path, sort, reverse, top)


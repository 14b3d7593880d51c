"""What a recording of attention holds for TensorBoard: each head's statistics, as the head table of the file's
kind reports them (exact weights: ``attnviz.inspection.inspecting``; a summary capture: ``attnviz.inspection.summary``;
a corpus file: ``attnviz.inspection.corpus``), its tags (``attnviz.inspection.tags``), the head table itself and the
pictures inspect draws (``attnviz.render``). Nothing here computes a statistic of its own: every value is the one
``attnviz inspect`` prints for the same file."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from attnviz.statistics import CORPUS, SUMMARY, WEIGHTS, names

#: a picture of a recording: its name (the image tag's last part) and a function that draws its figure
Picture = tuple[str, Callable[[], Any]]


@dataclass
class HeadRecord:
    """The head statistics of one file (or one recording), ready to be written: ``columns`` (a statistic's name:
    ``[layers, heads]`` values, NaN where a layer has fewer heads, in the order of the face's head table), ``tags``
    (``[layers, heads]``: each head's tags, as the table's ``tag`` column), ``rules`` (the tags this face can give,
    in order), ``layers`` (each row's layer number), the head ``table`` (a rich renderable) and the ``pictures``
    (drawn when written)."""

    face: str
    source: str
    columns: dict[str, np.ndarray]
    tags: np.ndarray
    rules: list[str]
    layers: list[int]
    table: Any
    pictures: list[Picture] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    #: the grid's rows of panels are the layers: each is also written as a picture of its own
    layer_rows: bool = False

    @property
    def heads(self) -> int:
        return int(self.tags.shape[1]) if self.tags.ndim == 2 else 0


def _rules(face: str, values: dict[str, Any], classes: tuple[str, ...] = ()) -> list[str]:
    """The tags of ``face`` whose value the file holds (induction needs the tokens, retrieval a needle)."""
    from attnviz.statistics import tag_rules

    return [r.tag for r in tag_rules(face, classes) if r.reads in values]


def exact_record(spec: str, options: Any = None, title: str | None = None) -> HeadRecord:
    """The head statistics of exact weights (a capture file, or any file ``inspect`` reads as weights), as ``inspect``
    computes them (``inspecting.prepare`` and ``analyse``) with ``options`` (``InspectOptions``: inspect's layout,
    labels, masks, --batch; its defaults otherwise): the mean over every counted row of the batch entries. The
    pictures: the layer x head grid of the shown batch entry and one picture per layer; ``title`` names the record
    (the file's name otherwise)."""
    from dataclasses import replace

    from attnviz.inspection import inspecting
    from attnviz.inspection.options import InspectOptions
    from attnviz.render.summaries import head_stats_table

    options = replace(options or InspectOptions(), weights=spec, received=False, row_stats=False)
    opened = inspecting.prepare(options)
    result = inspecting.analyse(opened)
    if not result.finite:  # pragma: no cover - analyse raises on non-finite weights unless asked to locate them
        from attnviz.errors import InputError

        raise InputError(f"{spec}: non-finite weights.")
    stats = result.stats
    columns = {name: np.asarray(stats[name], dtype=np.float64) for name in names(WEIGHTS) if name in stats}
    table = head_stats_table(stats, sort="layer", reverse=False, top=None, padded=result.padded,
                             keys=opened.weights.shape[-1])
    layers = list(range(opened.weights.shape[0]))
    return HeadRecord(WEIGHTS, title or opened.weights.source, columns, np.asarray(stats["tag"], dtype=object),
                      _rules(WEIGHTS, stats), layers, table, _exact_pictures(opened, title), list(result.warnings),
                      layer_rows=True)


def _exact_pictures(opened: Any, title: str | None) -> list[Picture]:
    """inspect's ``--png`` grid (the shown batch entry); its rows, the layers, are cut from it
    (``HeadRecord.layer_rows``)."""
    from attnviz.render.figures import opened_grid_figure
    from attnviz.render.options import FigureOptions

    return [("grid", lambda: opened_grid_figure(opened, FigureOptions(title=title)))]


def summary_record(found: Any) -> HeadRecord:
    """The head table of a summary capture (or of a capture of q and k alone, summarised: ``found``,
    ``attnviz.inspection.kinds.kind_of``'s), as ``inspect`` prints it; the picture: its pooled grid."""
    from attnviz.inspection.kinds import inspect_summary
    from attnviz.inspection.summary import stat_columns
    from attnviz.render import summary as drawn
    from attnviz.render.options import FigureOptions

    result = inspect_summary(found).result
    columns = {name: value for name, value in stat_columns(result).items() if not name.startswith("on:")}
    tags = np.asarray(result.tags, dtype=object)
    return HeadRecord(SUMMARY, str(result.read.source), columns, tags, _rules(SUMMARY, columns),
                      list(range(result.read.shape[0])), drawn.head_table(result),
                      [("grid", lambda: drawn.pooled_grid_figure(result, FigureOptions()))], list(result.warnings))


def corpus_record(found: Any) -> HeadRecord:
    """The head table of a corpus file (its means over texts; ``found``, ``attnviz.inspection.kinds.kind_of``'s), as
    ``inspect`` prints it; the picture: its layer strips."""
    from attnviz.inspection.corpus import corpus_tags, stat_columns
    from attnviz.inspection.kinds import inspect_corpus
    from attnviz.render.corpus import corpus_table, layer_strips_figure
    from attnviz.render.options import FigureOptions

    inspected = inspect_corpus(found)
    sums = inspected.sums
    columns = stat_columns(sums)  # every statistic of the file, its token classes' (class:NAME) included
    flat = corpus_tags(sums)
    width = max(sums.heads, default=0)
    tags = np.full((len(sums.sites), width), "", dtype=object)
    start = 0
    for row, n in enumerate(sums.heads):
        tags[row, :n] = flat[start:start + n]
        start += n
    values = {**columns, "entropy_norm": None, "sink_rate": None}
    return HeadRecord(CORPUS, inspected.source, columns, tags, _rules(CORPUS, values, tuple(sums.classes)),
                      list(sums.layers), corpus_table(sums),
                      [("strips", lambda: layer_strips_figure(sums, FigureOptions()))])


def record_of(spec: str, options: Any = None) -> HeadRecord:
    """The record of any file ``inspect`` reads (``attnviz.inspection.kinds.kind_of`` tells which): a corpus file, a
    summary capture (or q and k alone), or weights (read with ``options``, ``InspectOptions``)."""
    from attnviz.inspection.kinds import CORPUS as CORPUS_FILE
    from attnviz.inspection.kinds import kind_of

    found = kind_of(spec)
    if found.kind == CORPUS_FILE:
        return corpus_record(found)
    if found.summarised:
        return summary_record(found)
    return exact_record(spec, options)

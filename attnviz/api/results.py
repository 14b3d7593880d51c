"""The Python API's results: typed objects holding NumPy arrays, with the command's JSON document
(``to_json``), its tables (``table``, a rich renderable), its picture (``figure``, a matplotlib
``Figure`` with no pyplot state), its files (``save``) and, in a notebook, its offline HTML report
inline (``_repr_html_``: in an ``iframe`` of its own, so that several in one notebook never share ids).
Every one is built by the same functions the command line calls."""

from __future__ import annotations

import html as html_text
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from attnviz.errors import UsageError, shape_str

if TYPE_CHECKING:
    from attnviz.inspection.compare import CompareResult, CompareRun
    from attnviz.inspection.inspecting import InspectResult
    from attnviz.inspection.kinds import CorpusInspection, SummariesCompared, SummaryInspection
    from attnviz.inspection.rollout import RolloutRun
    from attnviz.pipeline import Outcome
    from attnviz.render.options import FigureOptions

PICTURES = (".png", ".svg", ".pdf")
#: keywords of ``figure`` that choose a picture, not how it is drawn (the report has no use for them)
PICTURE_ONLY = ("kind", "stat", "max_panels")


def checked_figure_options(options: dict[str, Any]) -> FigureOptions:
    """``FigureOptions`` of the API's figure keywords (``cmap="magma"``), each value checked by its field; an
    unknown keyword a usage error with a did-you-mean."""
    import difflib

    from attnviz.fields import check_value, flat_fields
    from attnviz.render.options import FigureOptions

    known = {f.name: (f, hint) for f, hint in flat_fields(FigureOptions)}
    unknown = sorted(set(options) - set(known))
    if unknown:
        close = difflib.get_close_matches(unknown[0], list(known), n=1, cutoff=0.75)
        guess = f"; did you mean {close[0]}=?" if close else ""
        raise UsageError(f"no figure keyword {unknown[0]!r}{guess} (the figure keywords: {', '.join(sorted(known))}).")
    for name, value in options.items():
        check_value(*known[name], value)
    fig = FigureOptions(**options)
    fig.check()
    return fig


def _iframe(page: str, height: int = 640) -> str:
    """A whole HTML page shown inline: its ids, styles and scripts stay inside its own frame."""
    return (f'<iframe srcdoc="{html_text.escape(page, quote=True)}" style="width: 100%; height: {height}px; '
            'border: 0" sandbox="allow-scripts"></iframe>')


def _write(files: dict[str, Any], storage_options: dict[str, Any] | None = None) -> None:
    """Write ``{path: (kind, make)}`` all or none (``attnviz.staging``), never over each other; a path may be a
    URL (``storage_options``: fsspec's options for it)."""
    from attnviz import storage
    from attnviz.io import check_outputs
    from attnviz.staging import staged_outputs

    wanted = {path: what for path, what in files.items()}
    with storage.using(storage_options):
        targets = check_outputs({f"{kind} {path}": path for path, (kind, _) in wanted.items()}, [])
        with staged_outputs(targets) as staged:
            for path, (kind, make) in wanted.items():
                make(staged[f"{kind} {path}"])
            staged.commit()


class _Result:
    """What every result shares: ``weights`` (the maps it shows), ``q_labels``, ``k_labels`` and ``labels`` (both),
    ``warnings``, the JSON document (``document``, ``to_json``), ``table``, ``figure``, ``html``, ``save`` and the
    inline report. ``figure_defaults`` and ``table_defaults``: keywords given to the run that its figures and
    tables take (``attnviz.inspect(w, cmap="magma", sort="entropy")``)."""

    command = ""
    figure_defaults: dict[str, Any] = {}  # replaced per result, never changed in place
    table_defaults: dict[str, Any] = {}

    @property
    def labels(self) -> tuple[list[str] | None, list[str] | None]:
        """(``q_labels``, ``k_labels``): the labels of the rows and columns of the map shown."""
        return getattr(self, "q_labels", None), getattr(self, "k_labels", None)

    def _fig(self, options: dict[str, Any]) -> FigureOptions:
        """The figure options of a call, over those the run was given."""
        return checked_figure_options({**self.figure_defaults, **options})

    def _tab(self, given: dict[str, Any]) -> dict[str, Any]:
        """The table keywords of a call: those given (not None), else the run's, else the method's defaults."""
        return {name: (value if value is not None else self.table_defaults.get(name, value))
                for name, value in given.items()}

    def document(self) -> dict[str, Any]:
        """The command's JSON document as a dict."""
        raise NotImplementedError

    def to_json(self) -> str:
        """The same text as the command's ``--json``."""
        from attnviz.render.report import to_json

        return to_json(self.document())

    def figure(self, **options: Any) -> Any:  # pragma: no cover - each result draws its own
        raise NotImplementedError

    def html(self, **options: Any) -> str:  # pragma: no cover
        raise NotImplementedError

    def _repr_html_(self) -> str:
        return _iframe(self.html())

    def save(self, png: str | Path | None = None, *, svg: str | Path | None = None, pdf: str | Path | None = None,
             html: str | Path | None = None, json: str | Path | None = None,
             storage_options: dict[str, Any] | None = None, **figure_options: Any) -> None:
        """Write the picture (``png``, ``svg``, ``pdf``), the HTML report and the JSON document: every
        file or none; each may be a URL (``s3://bucket/x.png``; ``storage_options`` for fsspec).
        ``figure_options`` are those of ``figure``."""
        from attnviz.io import save_text
        from attnviz.render.heatmap import save_figure

        files: dict[str, Any] = {}
        for kind, path in (("png", png), ("svg", svg), ("pdf", pdf)):
            if path is not None:
                if not str(path).lower().endswith(PICTURES):
                    raise UsageError(f"{kind}={path}: a picture's file ends in .png, .svg or .pdf.")
                files[str(path)] = (kind, lambda target: save_figure(self.figure(**figure_options), target))
        if html is not None:
            page_options = {k: v for k, v in figure_options.items() if k not in PICTURE_ONLY}
            files[str(html)] = ("html", lambda target: save_text(target, self.html(**page_options)))
        if json is not None:
            files[str(json)] = ("json", lambda target: save_text(target, self.to_json() + "\n"))
        _write(files, storage_options)


@dataclass(repr=False)
class Computed(_Result):
    """One attention type computed (``attnviz.scaled(q, k, v)`` ...): ``weights [..., Lq, Lk]``,
    ``output [..., Lq, d_v]`` (or None), further ``maps``, the per-query statistics ``stats``
    (``entropy``, ``entropy_norm``, ``max``, ``argmax``, ``row_sum``, top-k ...), the ``params`` used and
    the labels."""

    outcome: Outcome
    weights: np.ndarray = field(init=False)
    output: np.ndarray | None = field(init=False)
    maps: dict[str, np.ndarray] = field(init=False)
    params: dict[str, Any] = field(init=False)
    stats: dict[str, np.ndarray] = field(init=False)
    q_labels: list[str] | None = field(init=False)
    k_labels: list[str] | None = field(init=False)
    warnings: list[str] = field(init=False)

    def __post_init__(self) -> None:
        result, prep = self.outcome.result, self.outcome.prepared
        self.command = prep.variant.name
        self.weights, self.output, self.maps = result.weights, result.output, dict(result.maps)
        self.params = dict(result.params)
        self.stats = dict(self.outcome.stats.as_dict())
        self.q_labels, self.k_labels = prep.q_labels, prep.k_labels
        self.warnings = list(self.outcome.warnings)

    def document(self) -> dict[str, Any]:
        from attnviz.render.report import build_report

        return build_report(self.outcome, {})

    def table(self, index: tuple[int, ...] | None = None, precision: int | None = None, max_rows: int | None = None,
              max_cols: int | None = None) -> Any:
        """The tables the command prints, of the slice ``index`` of the leading axes (default the first);
        ``precision`` (3), ``max_rows`` (40), ``max_cols``."""
        from rich.console import Group

        from attnviz.render.summaries import compute_tables

        got = self._tab({"index": index, "precision": precision, "max_rows": max_rows, "max_cols": max_cols})
        lead = self.outcome.prepared.weights_shape[:-2]
        return Group(*compute_tables(self.outcome, _index(got["index"], lead), _or(got["precision"], 3),
                                     _or(got["max_rows"], 40), got["max_cols"]))

    def figure(self, **options: Any) -> Any:
        """The command's heatmap (``--png``) as a matplotlib Figure; options as the command's Figure
        options (``title``, ``cmap``, ``reduce``, ``vmin``, ``vmax``, ``norm``)."""
        from attnviz.render.figures import compute_figure

        return compute_figure(self.outcome, self._fig(options))

    def html(self, **options: Any) -> str:
        """The offline HTML report (``--html``) as text."""
        from attnviz.render.html import compute_report

        fig = self._fig(options)
        return compute_report(self.outcome, title=fig.title, cmap=fig.cmap, reduce=fig.reduce, vmin=fig.vmin,
                              vmax=fig.vmax, norm=fig.norm)

    def save(self, png: str | Path | None = None, *, weights: str | Path | None = None,  # type: ignore[override]
             output: str | Path | None = None, storage_options: dict[str, Any] | None = None, **others: Any) -> None:
        """As ``_Result.save``, and the arrays: ``weights`` and ``output`` as ``.npy``."""
        if weights is not None or output is not None:
            from attnviz.io import save_npy

            files = {}
            for kind, path, arr in (("weights", weights, self.weights), ("output", output, self.output)):
                if path is None:
                    continue
                if arr is None:
                    raise UsageError(f"{kind}=: {self.command} has no output array.")
                if not str(path).lower().endswith(".npy"):
                    raise UsageError(f"{kind}={path}: the file must end in .npy.")
                files[str(path)] = (kind, lambda target, arr=arr: save_npy(target, arr))
            _write(files, storage_options)
        if png is not None or others:
            super().save(png, storage_options=storage_options, **others)

    def __repr__(self) -> str:
        prep = self.outcome.prepared
        return (f"<attnviz {self.command}: weights {shape_str(prep.weights_shape)}, {self.outcome.device.name}, "
                f"{prep.options.dtype}>")


def _or(value: Any, default: Any) -> Any:
    return default if value is None else value


def _index(index: tuple[int, ...] | str | None, lead: tuple[int, ...]) -> tuple[int, ...]:
    if isinstance(index, str):  # the command line's form, "0,2"
        index = tuple(int(part) for part in index.split(",") if part.strip())
    if index is None:
        return tuple(0 for _ in lead)
    index = tuple(index)
    if len(index) != len(lead) or not all(-n <= i < n for i, n in zip(index, lead)):
        raise UsageError(f"index {index}: the leading axes are {list(lead)}.")
    return tuple(i % n for i, n in zip(index, lead))


@dataclass(repr=False)
class Inspected(_Result):
    """Saved weights inspected (``attnviz.inspect``): ``weights [layers, batch, heads, Lq, Lk]``, the head
    statistics ``head_stats`` (``[layers, heads]`` each, with ``tag``), the ``checks``, the shown map's
    per-query statistics ``stats``, and the labels."""

    result: InspectResult
    command = "inspect"

    @property
    def weights(self) -> np.ndarray:
        return self.result.opened.weights.data

    @property
    def head_stats(self) -> dict[str, np.ndarray]:
        return dict(self.result.stats)

    @property
    def checks(self) -> list[Any]:
        return list(self.result.checks)

    @property
    def stats(self) -> dict[str, np.ndarray]:
        rows = self.result.rows
        return {} if rows is None else dict(rows.as_dict())

    @property
    def q_labels(self) -> list[str] | None:
        return self.result.opened.q_labels

    @property
    def k_labels(self) -> list[str] | None:
        return self.result.opened.k_labels

    @property
    def warnings(self) -> list[str]:
        return list(self.result.warnings)

    @property
    def passed(self) -> bool:
        return not self.result.failed

    def document(self) -> dict[str, Any]:
        from attnviz.render.report import inspect_document

        return inspect_document(self.result, {})

    def table(self, precision: int | None = None, max_rows: int | None = None, max_cols: int | None = None,
              sort: str | None = None, reverse: bool | None = None, top: int | None = None) -> Any:
        """The tables the command prints: ``precision`` (3), ``max_rows`` (40), ``max_cols``, and the head
        statistics' order: ``sort`` (a column: "layer", "entropy", ...), ``reverse``, ``top`` (the first N)."""
        from rich.console import Group

        from attnviz.render.summaries import inspect_tables
        from attnviz.statistics import WEIGHTS, sort_key

        got = self._tab({"precision": precision, "max_rows": max_rows, "max_cols": max_cols, "sort": sort,
                         "reverse": reverse, "top": top})
        order = sort_key(str(_or(got["sort"], "layer")), WEIGHTS, "the weights")  # a name or a header: "diag"
        return Group(*inspect_tables(self.result, _or(got["precision"], 3), _or(got["max_rows"], 40), got["max_cols"],
                                     sort=order, reverse=bool(got["reverse"]), top=got["top"]))

    def figure(self, kind: str = "grid", stat: str = "entropy", **options: Any) -> Any:
        """The layer x head grid (``kind="grid"``, ``--png``), the shown map (``"map"``, ``--map-png``), a head
        statistic per layer and head (``"stats"``, ``--stats-png``; ``stat``), the received attention
        (``"received"``) or the attention over the image (``"overlay"``, ``--overlay-png``)."""
        from attnviz.render import figures

        makers = {"grid": figures.inspect_grid_figure, "map": figures.inspect_map_figure,
                  "stats": lambda r, f: figures.inspect_stat_figure(r, f, stat),
                  "received": figures.inspect_received_figure, "overlay": _inspect_overlay}
        if kind not in makers:
            raise UsageError(f"kind={kind!r}: expected one of {', '.join(makers)}.")
        return makers[kind](self.result, self._fig(options))

    def html(self, **options: Any) -> str:
        from attnviz.render.html import inspect_html

        return inspect_html(self.result, self._fig(options), _or(self.table_defaults.get("precision"), 3))

    def __repr__(self) -> str:
        w = self.result.opened.weights
        checks = "" if not self.result.checks else f", checks {'passed' if self.passed else 'FAILED'}"
        return f"<attnviz inspect: {w.source}, weights {shape_str(w.shape)}{checks}>"


class _Kind(_Result):
    """What the results of a summary and a corpus file share: the command's JSON as the command writes it, no HTML
    report (their pictures are ``figure``'s), nothing inline but the repr."""

    command = "inspect"

    def to_json(self) -> str:
        """The same text as the command's ``--json``."""
        import json

        return json.dumps(self.document())

    def html(self, **options: Any) -> str:
        raise UsageError(f"{self._what()}: no HTML report; table(), figure() or save(png=..., json=...).")

    def _repr_html_(self) -> str:  # type: ignore[override]
        return ""

    def _what(self) -> str:  # pragma: no cover - each kind says what it is
        raise NotImplementedError


@dataclass(repr=False)
class InspectedSummary(_Kind):
    """A summary capture inspected (``attnviz.inspect`` of a ``capture --summary`` file, or of a ``--no-weights``
    capture, summarised from its q and k): ``head_stats`` (each column of the head table ``[layers, heads]``, with
    ``tag``), ``received`` (the attention each key receives), ``spans``, ``retrieval`` (with ``needle=``), ``sinks``;
    ``result``, the whole ``attnviz.inspection.summary.SummaryResult``."""

    inspection: SummaryInspection

    @property
    def result(self) -> Any:
        return self.inspection.result

    @property
    def kind(self) -> str:
        """``summary``, or ``no-weights`` (summarised here from the capture's q and k)."""
        return self.inspection.found.kind

    @property
    def head_stats(self) -> dict[str, np.ndarray]:
        from attnviz.inspection.summary import stat_columns

        return {**stat_columns(self.result), "tag": np.asarray(self.result.tags, dtype=object)}

    @property
    def received(self) -> dict[str, np.ndarray]:
        return dict(self.result.received)

    @property
    def spans(self) -> dict[str, dict[str, Any]]:
        return dict(self.result.spans)

    @property
    def retrieval(self) -> Any:
        return self.result.retrieval

    @property
    def sinks(self) -> Any:
        return self.result.sinks

    @property
    def warnings(self) -> list[str]:
        return self.inspection.warnings

    def document(self) -> dict[str, Any]:
        from attnviz.render.summary import inspection_document

        return inspection_document(self.inspection, {})

    def table(self, precision: int | None = None, sort: str | None = None, reverse: bool | None = None,
              top: int | None = None, **_: Any) -> Any:
        """The head table the command prints: ``precision`` (3) and the order: ``sort`` (a column), ``reverse``,
        ``top`` (the first N)."""
        from attnviz.render.summary import head_table
        from attnviz.statistics import SUMMARY, sort_key

        got = self._tab({"precision": precision, "sort": sort, "reverse": reverse, "top": top})
        order = sort_key(str(_or(got["sort"], "layer")), SUMMARY, self.inspection.source,
                         absent=() if self.result.retrieval is not None else ("retrieval",))
        return head_table(self.result, _or(got["precision"], 3), order, bool(got["reverse"]), got["top"])

    def figure(self, kind: str = "grid", stat: str = "entropy", **options: Any) -> Any:
        """The pooled maps' layer x head grid (``kind="grid"``, ``--png``), the received attention by position
        (``"received"``), the chosen rows (``"map"``, ``--map-png``) or a column of the head table per layer and
        head (``"stats"``, ``--stats-png``; ``stat``)."""
        from attnviz.render.summary import inspection_figure

        if kind == "map" and self.result.read.chosen is None:
            raise UsageError(f"kind=\"map\": {self.inspection.source} holds no chosen rows (capture with rows=).")
        return inspection_figure(self.inspection, self._fig(options), kind, stat)

    def _what(self) -> str:
        return f"{self.inspection.source} holds summaries"

    def __repr__(self) -> str:
        layers, b, h, lq, lk = self.result.read.shape
        return f"<attnviz inspect: {self.inspection.source}, a summary of {layers} sites x {h} heads, {lk} keys>"


@dataclass(repr=False)
class InspectedCorpus(_Kind):
    """A corpus file inspected (``attnviz.inspect`` of a ``capture --corpus`` file): ``head_stats`` (each statistic's
    means over texts ``[sites, heads]``, NaN where a site has fewer heads; ``class:NAME`` for each token class),
    ``sums`` (the file's ``attnviz.corpusfile.CorpusSums``: ``means()``, ``distances()``)."""

    inspection: CorpusInspection

    @property
    def sums(self) -> Any:
        return self.inspection.sums

    @property
    def head_stats(self) -> dict[str, np.ndarray]:
        from attnviz.inspection.corpus import stat_columns

        return stat_columns(self.sums)

    @property
    def warnings(self) -> list[str]:
        return list(self.inspection.warnings)

    def document(self) -> dict[str, Any]:
        from attnviz.render.corpus import inspection_document

        return inspection_document(self.inspection, {})

    def table(self, precision: int | None = None, sort: str | None = None, reverse: bool | None = None,
              top: int | None = None, **_: Any) -> Any:
        """The tables the command prints: the head table (``precision``, 3; ``sort``, ``reverse``, ``top``) and the
        closest pairs of heads."""
        from dataclasses import replace

        from rich.console import Group

        from attnviz.render.corpus import inspection_tables
        from attnviz.statistics import CORPUS, sort_key

        got = self._tab({"precision": precision, "sort": sort, "reverse": reverse, "top": top})
        order = sort_key(str(_or(got["sort"], "layer")), CORPUS, self.inspection.source, self.sums.classes)
        ordered = replace(self.inspection, sort=order, reverse=bool(got["reverse"]), top=got["top"])
        return Group(*inspection_tables(ordered, _or(got["precision"], 3)))

    def figure(self, kind: str = "grid", stat: str = "entropy", **options: Any) -> Any:
        """The layer strips (``kind="grid"``, ``--png``), the heads placed by their distances (``"heads_map"``,
        ``--heads-map``) or a statistic per layer and head (``"stats"``, ``--stats-png``; ``stat``)."""
        from attnviz.render.corpus import inspection_figure

        return inspection_figure(self.inspection, self._fig(options), kind, stat)

    def _what(self) -> str:
        return f"{self.inspection.source} is a corpus file"

    def __repr__(self) -> str:
        return f"<attnviz inspect: {self.inspection.read_as()}>"


def _inspect_overlay(result: Any, fig: Any) -> Any:
    from attnviz.render.overlay import inspect_overlay_figure

    if result.overlay is None:
        raise UsageError("kind=\"overlay\": draws attention over an image; give image= (or patch_grid=).")
    return inspect_overlay_figure(result, fig)


@dataclass(repr=False)
class Compared(_Result):
    """Two sets of weights compared (``attnviz.compare``): the ``comparison`` (differences per layer and
    head, the worst rows), ``checks`` and ``passed``."""

    run: CompareRun
    result: CompareResult
    command = "compare"

    @property
    def comparison(self) -> Any:
        return self.result.comparison

    @property
    def weights(self) -> np.ndarray:
        """The maps the result shows: A - B, ``[layers, batch, heads, Lq, Lk]`` (0 in padded rows)."""
        return self.result.comparison.diff

    @property
    def a(self) -> np.ndarray:
        return self.run.a.data

    @property
    def b(self) -> np.ndarray:
        return self.run.b.data

    @property
    def q_labels(self) -> list[str] | None:
        return self.run.q_labels

    @property
    def k_labels(self) -> list[str] | None:
        return self.run.k_labels

    @property
    def warnings(self) -> list[str]:
        return list(self.result.warnings)

    @property
    def checks(self) -> list[Any]:
        return list(self.result.checks)

    @property
    def passed(self) -> bool:
        return all(c.passed for c in self.result.checks)

    def document(self) -> dict[str, Any]:
        from attnviz.render.report import compare_document

        return compare_document(self.run, self.result, {})

    def table(self, precision: int | None = None) -> Any:
        """The tables the command prints (``precision``: 3)."""
        from rich.console import Group

        from attnviz.render.summaries import compare_tables

        return Group(*compare_tables(self.result, _or(self._tab({"precision": precision})["precision"], 3)))

    def figure(self, max_panels: int | None = None, **options: Any) -> Any:
        """A - B of the maps that differ, largest first (``--png``): at most ``max_panels`` (16; 0: all)."""
        from attnviz.render.figures import compare_figure

        fig = self._fig(options)
        fig.check(diverging=True)
        return compare_figure(self.result, fig, _or(_or(max_panels, self.table_defaults.get("max_panels")), 16))

    def html(self, **options: Any) -> str:
        from attnviz.render.html import compare_html

        return compare_html(self.result, self._fig(options), _or(self.table_defaults.get("precision"), 3))

    def __repr__(self) -> str:
        return f"<attnviz compare: {self.run.a.source} vs {self.run.b.source}, max |A - B| " \
               f"{float(self.result.comparison.max_abs):.3g}>"


@dataclass(repr=False)
class ComparedSummaries(_Kind):
    """Two summary captures compared (``attnviz.compare``; or ``--no-weights`` captures, summarised): ``comparison``
    (each head statistic of A and B, ``row_diff`` the largest difference of each per-row statistic, ``head_diff``
    B - A of the head means), ``passed`` (``atol=``'s check)."""

    compared: SummariesCompared
    command = "compare"

    @property
    def comparison(self) -> Any:
        return self.compared.comparison

    @property
    def passed(self) -> bool:
        return not self.compared.failed

    @property
    def warnings(self) -> list[str]:
        return list(self.compared.warnings)

    def document(self) -> dict[str, Any]:
        from attnviz.render.summary import compared_document

        return compared_document(self.compared)

    def table(self, **_: Any) -> Any:
        """The table the command prints."""
        from attnviz.render.summary import compared_table

        return compared_table(self.compared)

    def figure(self, **options: Any) -> Any:
        raise UsageError("attnviz.compare: comparing summaries gives a table and JSON; draw each with "
                         "attnviz.inspect(...).figure().")

    def _what(self) -> str:
        return "attnviz.compare of summaries"

    def __repr__(self) -> str:
        a, b = self.compared.reads
        return f"<attnviz compare: summaries {a.source} vs {b.source}, largest per-row difference " \
               f"{self.compared.worst:.3g}>"


@dataclass(repr=False)
class RolledOut(_Result):
    """Attention rollout, flow or gradient rollout (``attnviz.rollout``, ``method=``): ``maps`` by batch
    entry ``[L, L]`` and ``map``, the shown entry's."""

    run: RolloutRun
    command = "rollout"

    @property
    def maps(self) -> dict[int, np.ndarray]:
        return {b: r.result for b, r in self.run.results.items()}

    @property
    def map(self) -> np.ndarray:
        """The shown entry's result ``[L, L]`` (also ``weights``)."""
        return self.run.results[self.run.shown].result

    @property
    def weights(self) -> np.ndarray:
        """The maps the result shows: the shown entry's rollout (flow, relevance) ``[L, L]``, as ``map``."""
        return self.map

    @property
    def warnings(self) -> list[str]:
        return list(self.run.warnings)

    @property
    def q_labels(self) -> list[str] | None:
        """The tokens of the entry shown (rows: the outputs)."""
        return self.run.tokens

    @property
    def k_labels(self) -> list[str] | None:
        """The tokens of the entry shown (columns: the inputs)."""
        return self.run.tokens

    @property
    def labels(self) -> tuple[list[str] | None, list[str] | None]:
        return self.q_labels, self.k_labels

    def document(self) -> dict[str, Any]:
        from attnviz.render.report import rollout_document

        return rollout_document(self.run, {})

    def table(self, precision: int | None = None, max_rows: int | None = None, max_cols: int | None = None) -> Any:
        """The table the command prints: ``precision`` (3), ``max_rows`` (40), ``max_cols``."""
        from attnviz.render.summaries import rollout_table

        got = self._tab({"precision": precision, "max_rows": max_rows, "max_cols": max_cols})
        return rollout_table(self.run, _or(got["precision"], 3), _or(got["max_rows"], 40), got["max_cols"])

    def figure(self, kind: str = "map", **options: Any) -> Any:
        """The rollout (``kind="map"``, ``--png``; every layer's with ``all_layers=True``) or, over an image,
        the query's row over the patches (``"overlay"``, ``--overlay-png``)."""
        from attnviz.render.figures import rollout_figure

        if kind == "overlay":
            from attnviz.render.overlay import rollout_overlay_figure

            if self.run.image is None:
                raise UsageError("kind=\"overlay\": draws the rollout over an image; give image= (or patch_grid=).")
            return rollout_overlay_figure(self.run, self._fig(options))
        if kind != "map":
            raise UsageError(f"kind={kind!r}: expected map or overlay.")
        return rollout_figure(self.run, self._fig(options))

    def html(self, **options: Any) -> str:
        from attnviz.render.figures import rollout_html

        return rollout_html(self.run, self._fig(options))

    def __repr__(self) -> str:
        return f"<attnviz {self.run.title}: {self.run.weights.source}, {self.run.how}>"


@dataclass(repr=False)
class Ablated(_Result):
    """What ``attnviz.ablate`` found: ``result``, an ``attnviz.ablation.running.Comparison`` (the texts run plainly
    and with the heads restricted: ``result.texts[i].runs[0]`` plain, ``[1]`` restricted, each with ``logprob``,
    ``generated``, ``kl``) or a ``Ranking`` (``--rank``: ``result.costs``, ``result.statistics``,
    ``result.policies``). ``document()``/``to_json()`` give the command's JSON, ``table()`` its tables,
    ``figure()`` the ranking's layer x head picture of the costs."""

    result: Any
    command = "ablate"

    @property
    def ranked(self) -> bool:
        from attnviz.ablation.running import Ranking

        return isinstance(self.result, Ranking)

    @property
    def warnings(self) -> list[str]:
        return list(getattr(self.result, "warnings", []))

    def document(self) -> dict[str, Any]:
        from attnviz.render.ablation import comparison_document, ranking_document

        return ranking_document(self.result) if self.ranked else comparison_document(self.result)

    def table(self, precision: int = 3, max_rows: int = 40) -> Any:
        """The command's tables (a rich renderable)."""
        from rich.console import Group

        from attnviz.render.ablation import comparison_table, policies_table, ranking_table

        if self.ranked:
            return Group(ranking_table(self.result, precision, max_rows), policies_table(self.result))
        return comparison_table(self.result, precision)

    def figure(self, **options: Any) -> Any:
        """The ranking's layer x head picture of the costs (``title=``)."""
        if not self.ranked:
            raise UsageError("attnviz.ablate: a comparison has no picture; rank the heads (rank=True) for one.")
        from attnviz.render.ablation import cost_figure

        return cost_figure(self.result, options.get("title"))

    def html(self, **options: Any) -> str:
        raise UsageError("attnviz.ablate: no HTML report; save(json=...) or figure().")

    def _repr_html_(self) -> str:  # type: ignore[override]
        return ""

    def __repr__(self) -> str:
        what = "ranking" if self.ranked else "comparison"
        return f"<attnviz.Ablated: a {what} of {self.result.model}>"

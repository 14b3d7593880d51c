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
    from attnviz.inspection.rollout import RolloutRun
    from attnviz.pipeline import Outcome
    from attnviz.render.options import FigureOptions

PICTURES = (".png", ".svg", ".pdf")


def _figure_options(options: dict[str, Any]) -> FigureOptions:
    from attnviz.fields import check_value, flat_fields
    from attnviz.render.options import FigureOptions

    known = {f.name: (f, hint) for f, hint in flat_fields(FigureOptions)}
    unknown = sorted(set(options) - set(known))
    if unknown:
        raise UsageError(f"no figure option {unknown[0]!r}; the figure options are {', '.join(sorted(known))}.")
    for name, value in options.items():
        check_value(*known[name], value)
    fig = FigureOptions(**options)
    fig.check()
    return fig


def _iframe(page: str, height: int = 640) -> str:
    """A whole HTML page shown inline: its ids, styles and scripts stay inside its own frame."""
    return (f'<iframe srcdoc="{html_text.escape(page, quote=True)}" style="width: 100%; height: {height}px; '
            'border: 0" sandbox="allow-scripts"></iframe>')


def _write(files: dict[str, Any]) -> None:
    """Write ``{path: (kind, make)}`` all or none (``attnviz.staging``), never over each other."""
    from attnviz.io import check_outputs
    from attnviz.staging import staged_outputs

    wanted = {path: what for path, what in files.items()}
    targets = check_outputs({f"{kind} {path}": path for path, (kind, _) in wanted.items()}, [])
    with staged_outputs(targets) as staged:
        for path, (kind, make) in wanted.items():
            make(staged[f"{kind} {path}"])
        staged.commit()


class _Result:
    """What every result shares: JSON, save, inline HTML."""

    command = ""

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
             html: str | Path | None = None, json: str | Path | None = None, **figure_options: Any) -> None:
        """Write the picture (``png``, ``svg``, ``pdf``), the HTML report and the JSON document: every
        file or none. ``figure_options`` are those of ``figure``."""
        from attnviz.io import save_text
        from attnviz.render.heatmap import save_figure

        files: dict[str, Any] = {}
        for kind, path in (("png", png), ("svg", svg), ("pdf", pdf)):
            if path is not None:
                if not str(path).lower().endswith(PICTURES):
                    raise UsageError(f"{kind}={path}: a picture's file ends in .png, .svg or .pdf.")
                files[str(path)] = (kind, lambda target: save_figure(self.figure(**figure_options), target))
        if html is not None:
            files[str(html)] = ("html", lambda target: save_text(target, self.html(**figure_options)))
        if json is not None:
            files[str(json)] = ("json", lambda target: save_text(target, self.to_json() + "\n"))
        _write(files)


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

    def table(self, index: tuple[int, ...] | None = None, precision: int = 3, max_rows: int | None = 40,
              max_cols: int | None = None) -> Any:
        """The tables the command prints, of the slice ``index`` of the leading axes (default the first)."""
        from rich.console import Group

        from attnviz.render.summaries import compute_tables

        lead = self.outcome.prepared.weights_shape[:-2]
        return Group(*compute_tables(self.outcome, _index(index, lead), precision, max_rows, max_cols))

    def figure(self, **options: Any) -> Any:
        """The command's heatmap (``--png``) as a matplotlib Figure; options as the command's Figure
        options (``title``, ``cmap``, ``reduce``, ``vmin``, ``vmax``, ``norm``)."""
        from attnviz.render.figures import compute_figure

        return compute_figure(self.outcome, _figure_options(options))

    def html(self, **options: Any) -> str:
        """The offline HTML report (``--html``) as text."""
        from attnviz.render.html import compute_report

        fig = _figure_options(options)
        return compute_report(self.outcome, title=fig.title, cmap=fig.cmap, reduce=fig.reduce, vmin=fig.vmin,
                              vmax=fig.vmax, norm=fig.norm)

    def save(self, png: str | Path | None = None, *, weights: str | Path | None = None,  # type: ignore[override]
             output: str | Path | None = None, **others: Any) -> None:
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
            _write(files)
        if png is not None or others:
            super().save(png, **others)

    def __repr__(self) -> str:
        prep = self.outcome.prepared
        return (f"<attnviz {self.command}: weights {shape_str(prep.weights_shape)}, {self.outcome.device.name}, "
                f"{prep.options.dtype}>")


def _index(index: tuple[int, ...] | None, lead: tuple[int, ...]) -> tuple[int, ...]:
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
    def labels(self) -> tuple[list[str] | None, list[str] | None]:
        return self.result.opened.q_labels, self.result.opened.k_labels

    @property
    def passed(self) -> bool:
        return not self.result.failed

    def document(self) -> dict[str, Any]:
        from attnviz.render.report import inspect_document

        return inspect_document(self.result, {})

    def table(self, precision: int = 3, max_rows: int | None = 40, max_cols: int | None = None,
              sort: str = "layer", reverse: bool = False, top: int | None = None) -> Any:
        from rich.console import Group

        from attnviz.render.summaries import inspect_tables

        return Group(*inspect_tables(self.result, precision, max_rows, max_cols, sort=sort, reverse=reverse,
                                     top=top))

    def figure(self, kind: str = "grid", **options: Any) -> Any:
        """The layer x head grid (``kind="grid"``, ``--png``), the shown map (``"map"``, ``--map-png``) or the
        received attention (``"received"``)."""
        from attnviz.render import figures

        makers = {"grid": figures.inspect_grid_figure, "map": figures.inspect_map_figure,
                  "received": figures.inspect_received_figure}
        if kind not in makers:
            raise UsageError(f"kind={kind!r}: expected one of {', '.join(makers)}.")
        return makers[kind](self.result, _figure_options(options))

    def html(self, **options: Any) -> str:
        from attnviz.render.html import inspect_html

        return inspect_html(self.result, _figure_options(options), 3)

    def __repr__(self) -> str:
        w = self.result.opened.weights
        checks = "" if not self.result.checks else f", checks {'passed' if self.passed else 'FAILED'}"
        return f"<attnviz inspect: {w.source}, weights {shape_str(w.shape)}{checks}>"


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
    def checks(self) -> list[Any]:
        return list(self.result.checks)

    @property
    def passed(self) -> bool:
        return all(c.passed for c in self.result.checks)

    def document(self) -> dict[str, Any]:
        from attnviz.render.report import compare_document

        return compare_document(self.run, self.result, {})

    def table(self, precision: int = 3) -> Any:
        from rich.console import Group

        from attnviz.render.summaries import compare_tables

        return Group(*compare_tables(self.result, precision))

    def figure(self, max_panels: int = 16, **options: Any) -> Any:
        from attnviz.render.figures import compare_figure

        fig = _figure_options(options)
        fig.check(diverging=True)
        return compare_figure(self.result, fig, max_panels)

    def html(self, **options: Any) -> str:
        from attnviz.render.html import compare_html

        return compare_html(self.result, _figure_options(options), 3)

    def __repr__(self) -> str:
        return f"<attnviz compare: {self.run.a.source} vs {self.run.b.source}, max |A - B| " \
               f"{float(self.result.comparison.max_abs):.3g}>"


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
        return self.run.results[self.run.shown].result

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

    def table(self, precision: int = 3, max_rows: int | None = 40, max_cols: int | None = None) -> Any:
        from attnviz.render.summaries import rollout_table

        return rollout_table(self.run, precision, max_rows, max_cols)

    def figure(self, **options: Any) -> Any:
        from attnviz.render.figures import rollout_figure

        return rollout_figure(self.run, _figure_options(options))

    def html(self, **options: Any) -> str:
        from attnviz.render.figures import rollout_html

        return rollout_html(self.run, _figure_options(options))

    def __repr__(self) -> str:
        return f"<attnviz {self.run.title}: {self.run.weights.source}, {self.run.how}>"

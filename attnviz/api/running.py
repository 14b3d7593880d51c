"""The Python API's runs: ``compute`` (and one function per attention type, made from the registry),
``inspect``, ``compare``, ``rollout`` and ``load``. Options are the commands' options as keyword
arguments (the field names of the option dataclasses: ``causal=True``, ``max_memory="2G"``,
``merge_subwords=True``), checked as the command line checks them; arrays, tensors and label lists
stand where the command line takes a file. The runs are the command line's own library calls."""

from __future__ import annotations

import contextlib
import dataclasses
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from attnviz.api.results import (
    Compared,
    ComparedSummaries,
    Computed,
    Inspected,
    InspectedCorpus,
    InspectedSummary,
    RolledOut,
)
from attnviz.api.values import option_values, to_value
from attnviz.api.wording import python_words
from attnviz.errors import UsageError


def _split(command: str, options: dict[str, Any], classes: Sequence[type]) -> list[Any]:
    """One instance of each option dataclass from flat keyword ``options`` (nested dataclasses
    included), every value checked; an unknown name is a ``UsageError`` with the nearest known one."""
    from attnviz.fields import build, check_value, flat_fields

    known: dict[str, tuple[Any, Any]] = {}
    for cls in classes:
        for f, hint in flat_fields(cls):
            known.setdefault(f.name, (f, hint))
    unknown = sorted(set(options) - set(known))
    if unknown:
        raise UsageError(unknown_keywords(command, unknown, [*known, *output_keywords(command)]))
    for name, value in options.items():
        check_value(*known[name], value)
    return [build(cls, options) for cls in classes]


#: the command line's table options each function takes, kept for the result's ``table()`` (and compare's
#: ``figure()``: max_panels)
TABLE_KEYWORDS = {"inspect": ("precision", "max_rows", "max_cols", "sort", "reverse", "top"),
                  "compare": ("precision", "max_panels"), "rollout": ("precision", "max_rows", "max_cols"),
                  "compute": ("index", "precision", "max_rows", "max_cols")}
#: the files each function writes as its command does: keyword -> how the result saves it (a picture's
#: ``figure`` keywords, "html", "json", or the array it saves)
FILE_KEYWORDS: dict[str, dict[str, Any]] = {
    "inspect": {"png": {}, "map_png": {"kind": "map"}, "stats_png": {"kind": "stats"},
                "received_png": {"kind": "received"}, "overlay_png": {"kind": "overlay"}, "html": "html",
                "json_file": "json", "save_maps": "maps", "heads_map": {"kind": "heads_map"}},
    "compare": {"png": {}, "html": "html", "json_file": "json"},
    "rollout": {"png": {}, "overlay_png": {"kind": "overlay"}, "html": "html", "json_file": "json"},
    "compute": {"png": {}, "html": "html", "json_file": "json", "save_weights": "weights", "save_output": "output"},
}


def output_keywords(command: str) -> list[str]:
    """The figure, table and file keywords a function takes besides its run's options."""
    from attnviz.fields import flat_fields
    from attnviz.render.options import FigureOptions

    key = command if command in TABLE_KEYWORDS else "compute"
    return [*(f.name for f, _ in flat_fields(FigureOptions)), *TABLE_KEYWORDS[key], *FILE_KEYWORDS[key],
            *(["stat"] if key == "inspect" else [])]


def _outputs(command: str, options: dict[str, Any], classes: Sequence[type]) -> tuple[dict[str, Any], ...]:
    """The keywords of ``options`` that are the command line's figure, table and file options rather than the
    run's: (figure keywords, table keywords, files to write, the run's own options). Where a name is both,
    the run's wins."""
    from attnviz.api.results import checked_figure_options
    from attnviz.fields import flat_fields
    from attnviz.render.options import FigureOptions

    own = {f.name for cls in classes for f, _ in flat_fields(cls)}
    figure_names = {f.name for f, _ in flat_fields(FigureOptions)}
    table_names = set(TABLE_KEYWORDS[command])
    file_names = set(FILE_KEYWORDS[command]) | ({"stat"} if command == "inspect" else set())
    figure, table, files, rest = {}, {}, {}, {}
    for name, value in options.items():
        if name in own:
            rest[name] = value
        elif name in figure_names:
            figure[name] = value
        elif name in table_names:
            table[name] = value
        elif name in file_names:
            files[name] = value
        else:
            rest[name] = value
    checked_figure_options(figure)  # checked before the run
    return figure, table, files, rest


def _finish(result: Any, command: str, figure: dict[str, Any], table: dict[str, Any], files: dict[str, Any]) -> Any:
    """The result with the figure and table keywords the run was given, and the files asked for written."""
    from pathlib import Path

    result.figure_defaults, result.table_defaults = dict(figure), dict(table)
    how = FILE_KEYWORDS[command]
    for name, path in files.items():
        if name == "stat" or path is None:
            continue
        way = how[name]
        if isinstance(way, dict):
            suffix = Path(str(path)).suffix.lower().lstrip(".")
            picture = {"png": "png", "svg": "svg", "pdf": "pdf"}.get(suffix, "png")
            extra = {"stat": files["stat"]} if way.get("kind") == "stats" and "stat" in files else {}
            result.save(**{picture: path}, **way, **extra)
        elif way in ("html", "json"):
            result.save(**{way: path})
        elif way == "maps":
            from attnviz.io import save_array

            save_array(Path(str(path)), result.weights, suffix=Path(str(path)).suffix)
        else:  # compute's weights and output arrays
            result.save(**{way: path})
    return result


def unknown_keywords(command: str, unknown: Sequence[str], known: Sequence[str] | dict[str, Any]) -> str:
    """One line for keywords ``command`` does not take: a did-you-mean for a misspelt one, and where an output
    option of the command line goes in the API instead."""
    import difflib

    from attnviz.api.wording import ELSEWHERE

    parts = []
    for name in unknown:
        where = ELSEWHERE.get(name.replace("_", "-"))
        close = difflib.get_close_matches(name, list(known), n=1, cutoff=0.75)
        if where is not None:
            parts.append(f"{name}= goes to the result's {where}")
        elif close:
            parts.append(f"no keyword {name!r}; did you mean {close[0]}=?")
        else:
            parts.append(f"no keyword {name!r}")
    listed = ", ".join(sorted(known))
    return f"attnviz.{command}: {'; '.join(parts)} (its keywords: {listed})."


def _spec(value: Any, name: str, memory: dict[str, Any], shown: str | None = None) -> str:
    """A file spec as given, or the in-memory spec of an array, tensor or tuple of them (put in ``memory``
    under ``shown``, how messages and titles name it; default ``name``); a capture (``attnviz.capture``) or
    a path is its file."""
    import os

    from attnviz.io import memory_spec

    if isinstance(value, str):
        return value
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    _no_weights(value, name)
    if hasattr(value, "keys") and "attentions" in value.keys():  # a model's whole output
        raise UsageError(f"{name}: a model's output ({type(value).__name__}); hand over its attentions: "
                         "out.attentions (out.encoder_attentions, out.cross_attentions for an encoder-decoder).")
    key = shown or name
    memory[key] = to_value(value, name)
    return memory_spec(key)


def recordings(*values: Any) -> dict[str, str]:
    """What titles and messages call the files of the recordings handed over (``attnviz.capture``): their
    model (``my-org/model (captured)``), not a temporary file that ``save`` may move."""
    import os

    from attnviz.capturing.folder import recorded_name
    from attnviz.capturing.session import Capture

    return {os.fspath(v): f"{recorded_name(v.model)} (captured)" for v in values
            if isinstance(v, Capture) and v.path is not None}


def described(value: Any, given_as: str = "") -> str:
    """How messages, titles and documents name weights handed over in memory (``the tuple of 12 arrays
    given``, ``the array [2, 12, 7, 7] given as a``): what they are, since their variable's name is unknown."""
    from collections.abc import Mapping

    from attnviz.errors import shape_str

    suffix = f" given as {given_as}" if given_as else " given"
    if isinstance(value, (tuple, list, Mapping)):
        items = list(value.values()) if isinstance(value, Mapping) else list(value)
        inner = {type(v).__name__ for v in items if isinstance(v, (tuple, list, Mapping))}
        what = f"{inner.pop()}s" if len(inner) == 1 and len(items) > 0 else "arrays"
        return f"the {type(value).__name__} of {len(value)} {what}{suffix}"
    shape = getattr(value, "shape", None)
    what = "tensor" if hasattr(value, "detach") or type(value).__module__.startswith("tensorflow") else "array"
    return f"the {what} {shape_str(shape)}{suffix}" if shape is not None else f"the value{suffix}"


def _no_weights(value: Any, name: str) -> None:
    """What a model built with SDPA returns for ``output_attentions``: an empty tuple, or Nones."""
    from attnviz.errors import InputError, no_weights

    if value is None:
        raise InputError(no_weights(f"{name} is None"))
    if isinstance(value, (tuple, list)) and (not value or all(v is None for v in value)):
        raise InputError(no_weights(f"{name} is " + ("an empty tuple" if not value else
                                                     f"a tuple of {len(value)} Nones")))


def capture(model: Any, tokenizer: Any = None, layers: Any = None, *, path: Any = None, weights: bool = True,
            qkv: bool | None = None, weights_dtype: str = "float32", target: Any = None, summary: bool = False,
            sinks: int | None = None, local: int | None = None, pool: int | None = None, rows: str | None = "last",
            corpus: Any = None, progress: Any = None) -> Any:
    """Record every attention site of ``model`` (transformers or Keras) while the block runs::

        with attnviz.capture(model, tokenizer) as rec:
            model(**batch)            # or model.generate(...)
        attnviz.inspect(rec)          # rec.save("run.safetensors")

    Options: ``path`` (write the file there), ``weights=False`` (q, k, v and masks only),
    ``weights_dtype`` ("float16", "bfloat16"), ``target`` ("next" or a token id: SITE.grad), ``summary=True``
    (long inputs: each site's summary instead of its weights, with ``sinks``, ``local``, ``pool``, ``rows``;
    docs/long-context.md). A long document is one string: ``tokenizer(open("doc.txt").read())``.
    See ``attnviz.capturing.session.Capture``."""
    from attnviz.capturing.options import CaptureRun, CaptureSettings, SummaryOptions
    from attnviz.capturing.session import Capture
    from attnviz.fields import check_values

    # the command line's options, checked as it checks them: a summary records no weights (weights=False is
    # then what it does anyway), and its rows are its own (rows=None keeps none, as --rows none does)
    options = CaptureSettings(
        run=CaptureRun(no_weights=not weights and not summary, weights_dtype=weights_dtype,
                       target=None if target is None else str(target)),
        summary=SummaryOptions(summary, sinks, local, pool, ("none" if rows is None else rows) if summary else None))
    with _capture_words("capture"):
        check_values(options)
        options.check_summary()
        options.check_weights()
    return Capture(model, tokenizer, layers, path=path, weights=weights, qkv=qkv, weights_dtype=weights_dtype,
                   target=target, summary=options.summary.settings(), corpus=corpus, progress=progress)


def corpus(model: Any, tokenizer: Any, texts: Sequence[str], *, path: Any = None, batch_size: int = 8,
           token_class: Sequence[str] = (), sink_threshold: float = 0.3, long: str = "truncate",
           blocked_from: int | None = None, distance_budget: int | None = None) -> Any:
    """Per-head statistics of a transformers model over many texts, as ``attnviz capture --corpus`` keeps
    them (see the corpus page of the documentation)::

        sums = attnviz.corpus(model, tokenizer, texts, batch_size=16, token_class=["digits=[0-9]+"])
        sums.means()["first"], sums.distances()          # [heads], [heads, heads]

    ``texts``: one string per text. Options as the command line's: ``batch_size``, ``token_class``
    (``"NAME=REGEX"`` strings), ``sink_threshold``, ``long`` ("truncate" or "refuse"); ``path`` writes the
    corpus file (``attnviz inspect`` reads it, ``attnviz merge`` adds such files). Long texts: one whose exact
    weights over every site (sites x heads x L x L float32) would take more than ``blocked_from`` bytes (256 MiB)
    runs alone, a block of query rows at a time (the same sums); its head distances need every layer's q and k within
    ``distance_budget`` bytes (1 GiB), else it is left out of the distances only, with a warning. Returns an
    ``attnviz.corpusfile.CorpusSums``."""
    import hashlib

    from attnviz.capturing.corpus import CorpusText, compile_classes, run_corpus
    from attnviz.capturing.options import CaptureRun, CaptureSettings, CorpusOptions
    from attnviz.corpusfile import write_corpus
    from attnviz.fields import check_values

    if isinstance(texts, str) or not all(isinstance(t, str) for t in texts):
        raise UsageError("attnviz.corpus: texts is a list of strings, one per text.")
    kept = [t for t in texts if t.strip()]
    if not kept:
        raise UsageError("attnviz.corpus: no text (every one is empty).")
    options = CaptureSettings(run=CaptureRun(long=long), corpus=CorpusOptions(
        corpus=True, batch_size=batch_size, token_class=list(token_class), sink_threshold=sink_threshold,
        blocked_from=blocked_from, distance_budget=distance_budget))
    with _capture_words("corpus"):
        check_values(options)
        options.corpus.check()
        compile_classes(options.corpus.classes)
    digest = hashlib.sha256("\n".join(texts).encode()).hexdigest()
    source = {"file": "(texts)", "sha256": digest, "lines": len(texts), "shards": [[0, 1]]}
    lines = [n + 1 for n, t in enumerate(texts) if t.strip()]
    device = next((p.device for p in model.parameters()), "cpu") if hasattr(model, "parameters") else "cpu"
    sums, warned = run_corpus(model, tokenizer, CorpusText(kept, lines, len(texts) - len(kept), source), options,
                              device=device)
    _warn(warned)
    if path is not None:
        write_corpus(path, sums)
    return sums


@contextlib.contextmanager
def _capture_words(run: str) -> Iterator[None]:
    """``attnviz.capture``'s and ``attnviz.corpus``'s usage errors (``capturing.options``, in the command line's
    words) said in the API's, after the function's name: ``--no-weights`` is ``weights=False``."""
    from attnviz.api.wording import Keyword, for_python, keywords
    from attnviz.capturing.options import CaptureSettings

    known = {name: keyword for name, keyword in keywords([CaptureSettings]).items() if name != "no-weights"}
    known["weights"] = Keyword("weights", flag=True)
    try:
        yield
    except UsageError as exc:
        raise UsageError(f"attnviz.{run}: {for_python(exc.message, known)}") from None


def _stores(run: Callable[..., Any]) -> Callable[..., Any]:
    """A run that also takes ``storage_options=``: fsspec storage options for the URLs among its file specs
    (``s3://bucket/dump.npz``), as ``attnviz --storage-options`` gives them on the command line."""
    import functools

    @functools.wraps(run)
    def with_options(*args: Any, storage_options: dict[str, Any] | None = None, **options: Any) -> Any:
        from attnviz import storage

        with storage.using(storage_options):
            return run(*args, **options)

    return with_options


def _warn(texts: Sequence[str], classes: Sequence[type] = (), memory: dict[str, str] | None = None) -> None:
    """Each warning of a run through ``warnings``, in the API's words."""
    from attnviz.api.wording import for_python, keywords

    known = keywords(classes)
    for text in texts:
        warnings.warn(for_python(text, known, memory), UserWarning, stacklevel=3)


@_stores
def compute(name: str, *arrays: Any, **options: Any) -> Computed:
    """Compute the attention type ``name`` (``attnviz.VARIANTS`` lists them) on ``arrays`` (in the order
    of the command's inputs, e.g. Q, K, V; or as keywords ``q=``, ``k=``, ``v=``) with the command's
    options as keywords.

    >>> result = attnviz.compute("scaled", q, k, v, causal=True)
    >>> result.weights.shape
    (4, 4)
    """
    from attnviz.io import in_memory
    from attnviz.pipeline import execute, prepare
    from attnviz.run_options import CaptureOptions, ParamOptions, RunOptions
    from attnviz.variants import REGISTRY

    if name not in REGISTRY:
        raise UsageError(f"no attention type {name!r}; attnviz has {', '.join(REGISTRY)}.")
    variant = REGISTRY[name]
    names = [spec.name for spec in variant.inputs]
    given = dict(zip(names, arrays))
    if len(arrays) > len(names):
        raise UsageError(f"{name} takes at most {len(names)} arrays ({', '.join(names)}); received {len(arrays)}.")
    for input_name in names:
        if input_name in options:
            if input_name in given:
                raise UsageError(f"{name}: {input_name} given twice.")
            given[input_name] = options.pop(input_name)
    classes: list[type] = [RunOptions, variant.params]
    if variant.learned:
        classes.append(ParamOptions)
    if variant.captured_qkv:
        classes.append(CaptureOptions)
    memory: dict[str, Any] = {}
    with python_words(classes):
        figure, table, files, options = _outputs("compute", options, classes)
        options = option_values(options, memory, classes)
        built = dict(zip((c.__name__ for c in classes), _split(name, options, classes)))
        specs: list[str | None] = []
        for input_name in names:
            value = given.get(input_name)
            if value is None:
                specs.append(None)
                continue
            specs.append(_spec(value, input_name, memory))
        while specs and specs[-1] is None:
            specs.pop()
        if any(s is None for s in specs):
            missing = names[specs.index(None)]
            raise UsageError(f"{name}: {missing} is needed before the inputs given after it.")
        with in_memory(memory):
            prepared = prepare(variant, specs, built["RunOptions"], built[variant.params.__name__],
                               param_options=built.get("ParamOptions"), capture=built.get("CaptureOptions"))
            outcome = execute(prepared)
        _warn(outcome.warnings, classes)
        return _finish(Computed(outcome), "compute", figure, table, files)


def variant_function(name: str) -> Callable[..., Computed]:
    """``attnviz.<name>(...)``: ``compute(name, ...)`` with the variant's inputs as named parameters and its
    documentation."""
    from attnviz.variants import REGISTRY

    variant = REGISTRY[name]
    inputs = [spec.name for spec in variant.inputs]

    def run(*arrays: Any, **options: Any) -> Computed:
        return compute(name, *arrays, **options)

    run.__name__ = run.__qualname__ = name.replace("-", "_")
    listed = "\n".join(f"    {spec.name}: {spec.help}" for spec in variant.inputs)
    options = _options_doc(variant)
    run.__doc__ = (f"{variant.summary}.\n\n    {variant.formula}\n\nArrays (NumPy, PyTorch or TensorFlow; in this "
                   f"order, or as keywords):\n{listed}\n\nOptions: the options of `attnviz {name} --help` as keyword "
                   f"arguments (arrays where the command takes a file):\n{options}\n\nReturns a Computed: weights, "
                   f"output, stats, to_json(), table(), figure(), save(), shown inline in a notebook.\n\n"
                   f"    >>> result = attnviz.{run.__name__}({', '.join(inputs[:3])})\n\n{variant.doc}")
    return run


def _options_doc(variant: Any) -> str:
    """``    name=default  help`` for each keyword option of a variant, as its command's help lists them."""
    from attnviz.fields import flat_fields
    from attnviz.run_options import CaptureOptions, ParamOptions, RunOptions

    classes = [variant.params, RunOptions, *([ParamOptions] if variant.learned else []),
               *([CaptureOptions] if variant.captured_qkv else [])]
    lines = []
    for cls in classes:
        for f, _ in flat_fields(cls):
            default = f.default if f.default is not dataclasses.MISSING else None
            lines.append(f"    {f.name}={default!r}: {f.metadata.get('help', '')}")
    return "\n".join(lines)


@_stores
def inspect(weights: Any, labels: Any = None, mask: Any = None, **options: Any) -> Any:
    """Inspect saved attention weights: an array ``[..., Lq, Lk]`` (read as ``[layers, batch, heads, Lq,
    Lk]`` by rank, or name the axes with ``layout="batch,q,k"``), a model's ``out.attentions`` (a tuple of
    layers ``[batch, heads, L, L]``; with ``generation=True`` generate()'s tuple of steps), or a file spec.

    >>> report = attnviz.inspect(out.attentions, labels=tokens, mask=batch["attention_mask"])
    >>> report.head_stats["entropy"].shape
    (12, 12)

    Every file ``attnviz inspect`` reads: a summary capture (``capture --summary``, or ``summary=True``) and a
    ``--no-weights`` capture (summarised from its q and k) give an ``InspectedSummary`` (``span=``,
    ``span_text=``, ``needle=`` as the command's --span, --span-text and --needle), a corpus file an
    ``InspectedCorpus``; each result's ``to_json()`` is the command's ``--json``."""
    from dataclasses import replace

    from attnviz.inspection import inspecting, kinds
    from attnviz.inspection.options import InspectOptions, SpanOptions
    from attnviz.io import in_memory, named

    memory: dict[str, Any] = {}
    shown = described(weights)
    classes = [InspectOptions, SpanOptions]
    with python_words(classes, {shown: "weights"}, ("save_maps", "heads_map", "stat")):
        figure, table, files, options = _outputs("inspect", options, classes)
        options = option_values({**options, "labels": labels, "mask": mask}, memory, classes)
        built, asked = _split("inspect", options, classes)
        spans = SpanOptions.of(asked.span, asked.span_text, asked.needle)
        spec = _spec(weights, "weights", memory, shown)
        with in_memory(memory), named(recordings(weights)):
            found = kinds.kind_of(spec)  # exact weights, a summary, q and k to summarise, or a corpus file
            kinds.refuse_spans(found, spans)
            result: Any
            if found.kind == kinds.CORPUS:
                result = InspectedCorpus(kinds.inspect_corpus(found, **_order(table), **_asked(files)))
            elif found.summarised:
                result = InspectedSummary(kinds.inspect_summary(found, built, spans, **_order(table), **_asked(files),
                                                                map_rows=files.get("map_png") is not None))
            else:
                kinds.refuse_outputs(kinds.WEIGHTS, spec, files)
                opened = inspecting.prepare(replace(built, weights=spec))
                result = Inspected(inspecting.analyse(opened))
        _warn(result.warnings, classes, {shown: "weights"})
        return _finish(result, "inspect", figure, table, files)


def _order(table: dict[str, Any]) -> dict[str, Any]:
    """The head table's order among the table keywords (``sort``, ``reverse``, ``top``): a summary's and a corpus
    file's JSON lists the heads in it, as the command's does."""
    return {name: table[name] for name in ("sort", "reverse", "top") if table.get(name) is not None}


def _asked(files: dict[str, Any]) -> dict[str, Any]:
    """The files asked for, as the readers of a summary and a corpus file check them: ``stat`` where a picture of it
    is asked for, and the ``outputs`` (what that kind of file cannot write is refused)."""
    return {"stat": files.get("stat", "entropy") if files.get("stats_png") is not None else None,
            "outputs": {name: path for name, path in files.items() if name != "stat"}}


@_stores
def compare(a: Any, b: Any, **options: Any) -> Any:
    """Compare two sets of attention weights (arrays, layer tuples or file specs), e.g. attnviz's against
    a model's own: ``attnviz.compare(ours.weights, out.attentions, atol=1e-5).passed``. Two summary captures (or
    ``--no-weights`` captures) give a ``ComparedSummaries``, as ``attnviz compare`` compares them."""
    from dataclasses import replace

    from attnviz.inspection import compare as comparing
    from attnviz.inspection import kinds
    from attnviz.inspection.options import CompareOptions
    from attnviz.io import in_memory, named

    memory: dict[str, Any] = {}
    names = {described(a, "a"): "a", described(b, "b"): "b"}
    with python_words([CompareOptions], names):
        figure, table, files, options = _outputs("compare", options, [CompareOptions])
        options = option_values(options, memory, [CompareOptions])
        (built,) = _split("compare", options, [CompareOptions])
        specs = [_spec(a, "a", memory, described(a, "a")), _spec(b, "b", memory, described(b, "b"))]
        with in_memory(memory), named(recordings(a, b)):
            found = kinds.compared_kinds(specs[0], specs[1])
            if any(f.summarised for f in found):
                summaries = ComparedSummaries(kinds.compare_summary_files(found[0], found[1], atol=built.atol,
                                                                              outputs=files))
                return _finish(summaries, "compare", figure, table, files)
            run = comparing.prepare_compare(replace(built, a=specs[0], b=specs[1]))
            result = comparing.run_compare(run)
        _warn(result.warnings, [CompareOptions], names)
        return _finish(Compared(run, result), "compare", figure, table, files)


@_stores
def rollout(weights: Any, labels: Any = None, mask: Any = None, **options: Any) -> RolledOut:
    """Attention rollout (Abnar & Zuidema 2020) of self-attention weights ``[layers, batch, heads, L, L]``
    (or a model's ``out.attentions``): ``attnviz.rollout(out.attentions, labels=tokens).map``.
    ``method="flow"`` gives attention flow, and ``method="grad"`` Chefer et al.'s gradient rollout,
    with ``grads=`` the gradients of the explained score with respect to the weights (arrays or
    tensors, as the weights): ``attnviz.rollout(attentions, method="grad", grads=[a.grad for a in
    attentions])``."""
    from dataclasses import replace

    from attnviz.inspection.options import RolloutOptions
    from attnviz.inspection.rollout import run_rollout
    from attnviz.io import in_memory, named

    memory: dict[str, Any] = {}
    shown = described(weights)
    with python_words([RolloutOptions], {shown: "weights"}):
        figure, table, files, options = _outputs("rollout", options, [RolloutOptions])
        options = option_values({**options, "labels": labels, "mask": mask}, memory, [RolloutOptions])
        (built,) = _split("rollout", options, [RolloutOptions])
        spec = _spec(weights, "weights", memory, shown)
        with in_memory(memory), named(recordings(weights)):
            run = run_rollout(replace(built, weights=spec))
        _warn(run.warnings, [RolloutOptions], {shown: "weights"})
        return _finish(RolledOut(run), "rollout", figure, table, files)


@_stores
def load(spec: str, layout: str | None = None, generation: bool = False) -> Any:
    """Read attention weights as the command line does (every format, ``FILE:KEY``, key globs stacked as
    layers, ``generation=True`` for generate()'s steps): an ``attnviz.inspection.weights.Weights`` whose
    ``data`` is ``[layers, batch, heads, Lq, Lk]``."""
    from attnviz.inspection.options import InspectOptions
    from attnviz.inspection.weights import load_weights

    with python_words([InspectOptions]):
        return load_weights(spec, layout, generation=generation)


def ablate(model: Any, tokenizer: Any = None, texts: Sequence[str] | str | None = None, **options: Any) -> Any:
    """A model run as it is and with chosen heads restricted (``attnviz ablate``)::

        done = attnviz.ablate("smollm2", texts=[prompt], stream="18:2", kv_heads=True, answer=" 5831")
        done.result.texts[0].runs[1].logprob, done.to_json()
        ranked = attnviz.ablate("smollm2", rank=True, share=0.25)   # every head ranked, policies checked

    ``model``: a local model folder, or a transformers causal language model in hand with its ``tokenizer``.
    Options are the command's, as keywords: ``stream``, ``window``, ``zero``, ``mean`` ("L:H,..."), ``kv_heads``,
    ``sink``, ``recent``, ``answer``, ``generate``, ``kl_rows``, ``rank``, ``restrict``, ``calibration``,
    ``needles``, ``tokens``, ``share``, ``random``, ``seed``, ``statistics``, ``batch``, ``device``, ``dtype``.
    Returns an ``attnviz.api.results.Ablated``."""
    from attnviz.ablation.options import AblateOptions
    from attnviz.ablation.running import compare_run, rank_run
    from attnviz.api.results import Ablated

    known = {f.name for f in dataclasses.fields(AblateOptions)} - {"model", "text"}
    unknown = sorted(set(options) - known)
    if unknown:
        from difflib import get_close_matches

        near = get_close_matches(unknown[0], known, n=1)
        raise UsageError(f"attnviz.ablate: no option {unknown[0]!r}{f'; did you mean {near[0]!r}?' if near else ''}")
    listed = [texts] if isinstance(texts, str) else list(texts or [])
    folder = str(model) if isinstance(model, (str, bytes)) or hasattr(model, "__fspath__") else "(model)"
    settings = AblateOptions(model=folder, text=listed, **options)
    loaded = None if folder != "(model)" else _loaded(model, tokenizer)
    if settings.rank:
        return Ablated(rank_run(settings, loaded=loaded))
    return Ablated(compare_run(settings, listed, loaded=loaded))


def _loaded(model: Any, tokenizer: Any) -> Any:
    """A model in hand (and its tokenizer) as ``attnviz.ablation.runs.Loaded``."""
    from attnviz.ablation.restrict import geometry
    from attnviz.ablation.runs import Loaded
    from attnviz.capturing.folder import position_limits, recorded_name

    if tokenizer is None:
        raise UsageError("attnviz.ablate: a model in hand needs its tokenizer (attnviz.ablate(model, tokenizer, ...)).")
    if not hasattr(model, "generate") or not hasattr(model, "config"):
        raise UsageError(f"attnviz.ablate: expected a transformers causal language model or a folder; received "
                         f"{type(model).__name__}.")
    device = str(next((p.device for p in model.parameters()), "cpu"))
    learned, trained = position_limits(model, tokenizer)
    return Loaded(model.eval(), tokenizer, device, geometry(model), recorded_name(model), learned or trained)

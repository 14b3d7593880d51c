"""The files serving stacks read: a head policy or a ranking of heads written as DuoAttention's pattern folder,
MInference's per-layer pattern file and a retrieval-head score file, and read back (NumPy, json and the standard
library; no torch).

Each file is written as its consumers' own code reads it:

- **DuoAttention** (mit-han-lab/duo-attention, ``duo_attn/utils.py``: ``load_attn_pattern``; kvpress's
  ``DuoAttentionPress.load_attention_pattern``): a folder holding ``full_attention_heads.tsv``, one row per layer
  and one tab-separated column per key-value head, each a gate in [0, 1] (1: the head keeps its full cache;
  ``numpy.loadtxt(..., delimiter="\\t")`` then ``numpy.clip(.., 0, 1)``), and ``config.json``, an object with
  ``sink_size`` and ``recent_size`` (a streaming head keeps the first ``sink_size`` and the last ``recent_size``
  keys). DuoAttention keeps the heads whose gate is at least 0.5 (``sparsify_attention_heads``' threshold), or
  streams the lowest share of gates it is given (``--sparsity``); kvpress streams the ``head_compression_ratio``
  share of heads with the lowest gates (``numpy.argsort``). A policy's gates are 0 and 1; a ranking's scores
  may be any value in [0, 1], higher for a head that matters more.
- **MInference** (microsoft/MInference, ``minference/configs/*.json``), which vLLM's and SGLang's dual-chunk
  attention read as ``sparse_attention_config.json`` in the model's folder (or as ``dual_chunk_attention_config``'s
  ``sparse_attention_config``): a JSON list with one object per layer, ``{"HEAD": [pattern, vertical_size,
  slash_size, score]}``. The heads are **query heads**: vLLM and SGLang look up ``int(key)`` for every query head
  of the layer (``range(start_head, end_head)`` of the tensor-parallel rank), and MInference's published files
  hold one entry per query head (32 for Llama-3.1-8B's 8 key-value heads). With grouped-query attention a
  key-value head's decision is written for each query head that shares it: query head i uses key-value head
  i // (heads // kv_heads). vLLM and SGLang accept only ``vertical_and_slash``: the head keeps ``vertical_size``
  key columns and ``slash_size`` diagonals, chosen by top-k over the last 64 queries' attention, where the first
  30 columns and the last 100 diagonals always score infinity (and vLLM widens a vertical size of exactly 30 to
  130). A top-k of fewer than 30 columns (or 100 diagonals) takes an arbitrary few of those tied ones, so a
  **streaming head** is written as ``[vertical_and_slash, max(sink, 30), max(recent, 100), score]``: its first
  ``sink`` and last ``recent`` keys are always among those kept (exactly those when sink <= 30 and recent <= 100;
  otherwise as many columns and diagonals, the rest chosen by attention). A **full head** is written with both
  sizes ``length``, the longest prompt the file is for: every column is kept, which is the whole head (vLLM and
  SGLang cut the sizes to the prompt's length). ``score`` holds the head's gate (1 for a head kept whole; a
  ranking's score); MInference's own files hold the share of attention its search found the pattern keeps, and
  no reader uses it (vLLM, SGLang and MInference unpack it as ``_``).
- **Retrieval scores** (nightdessert/Retrieval_Head, ``retrieval_head_detection.py``; FYYFU/HeadKV,
  ``headkv/snapkv_utils.py``): a JSON object ``{"LAYER-HEAD": [score per run, ...]}`` on **one line** (both read
  ``json.loads(file.readline())``), its keys in layer-major order (HeadKV takes ``numpy.mean`` of each value in
  the file's order and reshapes them to ``[num_hidden_layers, num_attention_heads]``: query heads).

Files are written whole or not at all (``attnviz.staging``): on their own (``staged=None``) or into the
``StagedOutputs`` of a command that writes other files beside them (its targets named by
``duo_attention_targets`` and the options). Each reader gives one-line errors (``InputError``, exit 1) naming the
file and what is wrong with it.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from attnviz.errors import InputError, OutputError, UsageError, shape_str
from attnviz.staging import StagedOutputs

#: DuoAttention's folder: the gates and the sizes
DUO_GATES = "full_attention_heads.tsv"
DUO_CONFIG = "config.json"
#: the options a command names these outputs by (the keys of their staged files)
DUO_OPTION = "--export-duo"
MINFERENCE_OPTION = "--export-minference"
RETRIEVAL_OPTION = "--export-retrieval"
#: a gate at least this keeps the head's full cache (``duo_attn.utils.sparsify_attention_heads``' threshold)
THRESHOLD = 0.5
#: the pattern vLLM and SGLang accept; MInference's own kernels also run the other two
VERTICAL_AND_SLASH = "vertical_and_slash"
PATTERNS = (VERTICAL_AND_SLASH, "stream_llm", "block_sparse")
#: the key columns and diagonals every ``vertical_and_slash`` head keeps (scored infinity before the top-k)
FORCED_VERTICAL = 30
FORCED_SLASH = 100
#: vLLM and SGLang hold the sizes in int32 tensors
MAX_SIZE = 2**31 - 1


@dataclass(frozen=True)
class DuoPattern:
    """A DuoAttention folder read back: ``gates`` [layers, kv_heads] in [0, 1] (clipped as its readers clip
    them), the sizes of a streaming head's cache, and the whole ``config.json``."""

    gates: np.ndarray
    sink_size: int
    recent_size: int
    config: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class MinferencePattern:
    """An MInference pattern file read back, per layer and query head ([layers, heads] each): the pattern's
    name, its vertical and slash sizes and its score."""

    patterns: np.ndarray
    vertical: np.ndarray
    slash: np.ndarray
    score: np.ndarray


# ---------------------------------------------------------------------------------------------------
# Writing


def write_duo_attention(folder: str | os.PathLike[str], gates: Any, *, sink_size: int, recent_size: int,
                        extra: Mapping[str, Any] | None = None, staged: StagedOutputs | None = None,
                        option: str = DUO_OPTION) -> None:
    """DuoAttention's pattern folder: ``full_attention_heads.tsv`` (``gates`` [layers, kv_heads] in [0, 1], one
    row per layer, written as ``numpy.savetxt`` writes DuoAttention's own) and ``config.json`` (``sink_size``,
    ``recent_size``, and ``extra``: the model's name, how the gates were found ...). The two files are put in
    place together. ``staged``: a command's ``StagedOutputs`` holding the targets of
    ``duo_attention_targets(folder, option)``; without it the folder is made when it is missing (its parent must
    exist) and removed again when nothing could be written."""
    g = _gates(gates, "gates")
    sink, recent = _sizes(sink_size, recent_size)
    config = {**(dict(extra) if extra else {}), "sink_size": sink, "recent_size": recent}
    text = _json_line(config, "config.json")
    rows = "".join("\t".join(f"{v:.18e}" for v in row) + "\n" for row in g.tolist())
    if staged is not None:
        _save(staged, f"{option} {DUO_GATES}", rows)
        _save(staged, f"{option} {DUO_CONFIG}", text + "\n")
        return
    from attnviz.io import check_outputs
    from attnviz.staging import staged_outputs

    with duo_attention_targets(folder, option) as wanted, staged_outputs(check_outputs(wanted, [])) as own:
        _save(own, f"{option} {DUO_GATES}", rows)
        _save(own, f"{option} {DUO_CONFIG}", text + "\n")
        own.commit()


@contextmanager
def duo_attention_targets(folder: str | os.PathLike[str] | None, option: str = DUO_OPTION) -> Iterator[dict[str, str]]:
    """The two files of a DuoAttention folder as a command's outputs (``{"--export-duo config.json": path}``,
    for ``io.check_outputs`` and ``staging.staged_outputs``; nothing for None). A local folder that is missing is
    made (its parent must exist) and removed on leaving when it is still empty: a run that failed leaves no
    folder behind. A path that is not a folder, or a file name in it that is a folder, is refused."""
    if folder is None:
        yield {}
        return
    from attnviz import storage

    where = os.fspath(folder)
    names = {f"{option} {name}": storage.join(where, name) for name in (DUO_GATES, DUO_CONFIG)}
    if storage.is_url(where):
        yield names
        return
    path = Path(where)
    made = False
    try:
        if path.exists() and not path.is_dir():
            raise UsageError(f"{option} {where}: exists and is not a folder; DuoAttention's pattern is a folder "
                             f"({DUO_GATES}, {DUO_CONFIG}).")
        for name in (DUO_GATES, DUO_CONFIG):
            if (path / name).is_dir():
                raise UsageError(f"{option} {where}: its {name} is a folder; refusing to replace it.")
        if not path.exists():
            if not path.resolve().parent.is_dir():
                raise OutputError(f"{option} {where}: the folder {path.parent} does not exist.")
            path.mkdir()
            made = True
    except OSError as exc:  # a name too long, a folder that cannot be made ...
        raise OutputError(f"{option} {where}: cannot write there ({exc.strerror or exc}).") from None
    try:
        yield names
    finally:
        if made:
            try:
                path.rmdir()  # only when empty: the files were not put in place
            except OSError:
                pass


def write_minference(path: str | os.PathLike[str], gates: Any, *, heads: int, sink_size: int, recent_size: int,
                     length: int, threshold: float = THRESHOLD, staged: StagedOutputs | None = None,
                     option: str = MINFERENCE_OPTION) -> None:
    """MInference's per-layer pattern file (vLLM's and SGLang's ``sparse_attention_config.json``): per layer,
    ``{"QUERY_HEAD": ["vertical_and_slash", vertical, slash, score]}`` for every query head. ``gates``:
    [layers, kv_heads] (each key-value head's decision written for the ``heads // kv_heads`` query heads that
    share it: query head i uses key-value head i // (heads // kv_heads)) or [layers, heads]. A head whose gate is
    below ``threshold`` streams: ``[max(sink_size, 30), max(recent_size, 100)]``, so that its first sink and last
    recent keys are always among those kept (the consumers keep the first 30 columns and the last 100 diagonals
    of every head and choose the rest by top-k); a head kept whole has both sizes ``length`` (the longest prompt
    the file is for; every key is kept). ``score``: the head's gate (no consumer reads it)."""
    g = _gates(gates, "gates")
    layers, groups = g.shape
    heads = _whole(heads, "heads", 1)
    if heads % groups:
        raise UsageError(f"heads {heads}: the gates hold {groups} key-value heads a layer, and {heads} query heads "
                         "do not share them evenly (give gates per key-value head or per query head).")
    sink, recent = _sizes(sink_size, recent_size)
    stream = (max(sink, FORCED_VERTICAL), max(recent, FORCED_SLASH))
    length = _whole(length, "length", 1)
    if length <= max(stream):
        raise UsageError(f"length {length}: a full head's sizes must exceed a streaming head's ({stream[0]} columns, "
                         f"{stream[1]} diagonals).")
    if length > MAX_SIZE:
        raise UsageError(f"length {length}: vLLM and SGLang hold the sizes as int32 (at most {MAX_SIZE}).")
    if not (isinstance(threshold, (int, float)) and 0 < threshold <= 1):
        raise UsageError(f"threshold {threshold!r}: a gate in (0, 1]; a head whose gate is below it streams.")
    per_query = np.repeat(g, heads // groups, axis=1)  # query head i: key-value head i // (heads // groups)
    document = [{str(h): [VERTICAL_AND_SLASH, *((length, length) if gate >= threshold else stream), float(gate)]
                 for h, gate in enumerate(row)} for row in per_query.tolist()]
    # one layer a line: json.load reads it whole, and a person can read it
    text = "[\n" + ",\n".join(_json_line(layer, "the pattern") for layer in document) + "\n]\n"
    _write_one(path, text, staged, option)


def write_retrieval_scores(path: str | os.PathLike[str], scores: Any, *, staged: StagedOutputs | None = None,
                           option: str = RETRIEVAL_OPTION) -> None:
    """A retrieval-head score file as Wu et al.'s Retrieval_Head code writes it and HeadKV reads it:
    ``{"LAYER-HEAD": [score per run, ...]}`` on one line, layer-major. ``scores``: [layers, heads, runs], or
    [layers, heads] (one run); per query head, each at least 0 (Wu et al.'s: the share of a needle's tokens the
    head copied)."""
    s = np.asarray(scores, dtype=np.float64) if _numeric(scores) else None
    if s is None or s.ndim not in (2, 3) or 0 in s.shape:
        shape = shape_str(np.shape(scores)) if s is not None else type(scores).__name__
        raise UsageError(f"scores {shape}: give numbers [layers, heads, runs] or [layers, heads] (one run).")
    if s.ndim == 2:
        s = s[:, :, None]
    if not np.isfinite(s).all() or (s < 0).any():
        raise UsageError("scores: every score is a finite number of at least 0 (HeadKV normalises them by their "
                         "sum).")
    document = {f"{layer}-{head}": runs for layer, row in enumerate(s.tolist()) for head, runs in enumerate(row)}
    _write_one(path, _json_line(document, "the scores") + "\n", staged, option)


def _write_one(path: str | os.PathLike[str], text: str, staged: StagedOutputs | None, option: str) -> None:
    """One file, into a command's staged outputs or put in place on its own (all or nothing)."""
    if staged is not None:
        _save(staged, option, text)
        return
    from attnviz.io import check_outputs
    from attnviz.staging import staged_outputs

    with staged_outputs(check_outputs({option: os.fspath(path)}, [])) as own:
        _save(own, option, text)
        own.commit()


def _save(staged: StagedOutputs, option: str, text: str) -> None:
    from attnviz.io import save_text

    save_text(staged[option], text)


def _json_line(value: Any, what: str) -> str:
    try:
        return json.dumps(value, allow_nan=False)
    except (TypeError, ValueError) as exc:  # an extra value JSON cannot hold
        raise UsageError(f"{what}: cannot be written as JSON ({exc}).") from None


def _numeric(value: Any) -> bool:
    try:
        return np.asarray(value).dtype.kind in "biuf"
    except (TypeError, ValueError):  # ragged lists
        return False


def _gates(gates: Any, what: str) -> np.ndarray:
    """Gates as float64 [layers, heads], each in [0, 1]."""
    g = np.asarray(gates, dtype=np.float64) if _numeric(gates) else None
    if g is None or g.ndim != 2 or 0 in g.shape:
        shape = shape_str(np.shape(gates)) if g is not None else type(gates).__name__
        raise UsageError(f"{what} {shape}: give numbers [layers, key-value heads], one gate a head.")
    if not np.isfinite(g).all() or (g < 0).any() or (g > 1).any():
        bad = np.argwhere(~(np.isfinite(g) & (g >= 0) & (g <= 1)))[0]
        raise UsageError(f"{what}: layer {bad[0]} head {bad[1]} is {float(g[tuple(bad)])!r}; a gate is a number in "
                         "[0, 1] (1: the head keeps its full cache).")
    return g


def _whole(value: Any, what: str, least: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < least:
        raise UsageError(f"{what} {value!r}: a whole number of at least {least}.")
    return int(value)


def _sizes(sink_size: Any, recent_size: Any) -> tuple[int, int]:
    """A streaming head's cache: the first ``sink_size`` keys (0 or more) and the last ``recent_size`` (1 or more:
    kvpress masks ``keys[sink_size:-recent_size]``, which for 0 masks nothing)."""
    return _whole(sink_size, "sink_size", 0), _whole(recent_size, "recent_size", 1)


# ---------------------------------------------------------------------------------------------------
# Reading


def read_duo_attention(folder: str | os.PathLike[str]) -> DuoPattern:
    """A DuoAttention pattern folder: the gates of ``full_attention_heads.tsv`` (clipped to [0, 1] as
    ``load_attn_pattern`` and kvpress clip them) and ``config.json``'s ``sink_size`` and ``recent_size``."""
    from attnviz import storage

    where = os.fspath(folder)
    if not storage.is_url(where) and Path(where).is_file():
        raise UsageError(f"{where}: a file; DuoAttention's pattern is the folder holding {DUO_GATES} and {DUO_CONFIG}.")
    tsv = storage.join(where, DUO_GATES)
    rows = []
    for number, line in enumerate(storage.read_text(tsv, tsv, what="text").splitlines(), 1):
        if not line.strip():
            continue
        try:
            rows.append([float(cell) for cell in line.split("\t")])
        except ValueError:
            cell = next(c for c in line.split("\t") if not _is_float(c))
            raise InputError(f"{tsv}: line {number}: {_shown(cell)} is not a number; {DUO_GATES} holds one "
                             "tab-separated gate per key-value head.") from None
        if len(rows[-1]) != len(rows[0]):
            raise InputError(f"{tsv}: line {number} holds {len(rows[-1])} gates, line 1 {len(rows[0])}; every layer "
                             "has a gate per key-value head.")
    if not rows:
        raise InputError(f"{tsv}: no gates; {DUO_GATES} holds a row per layer.")
    gates = np.array(rows, dtype=np.float64)
    if not np.isfinite(gates).all():
        layer, head = np.argwhere(~np.isfinite(gates))[0]
        raise InputError(f"{tsv}: layer {layer} head {head} is {float(gates[layer, head])!r}, not a gate.")
    config_path = storage.join(where, DUO_CONFIG)
    config = _read_json(config_path, "a DuoAttention config.json")
    if not isinstance(config, dict):
        raise InputError(f"{config_path}: a DuoAttention config.json holds a JSON object.")
    sizes = []
    for key, least in (("sink_size", 0), ("recent_size", 1)):
        value = config.get(key)
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            said = "no " + key if key not in config else f"{key} {_json_shown(value)}"
            raise InputError(f"{config_path}: {said}; DuoAttention reads a whole number of at least {least} there.")
        sizes.append(value)
    return DuoPattern(np.clip(gates, 0, 1), sizes[0], sizes[1], config)


def read_minference(path: str | os.PathLike[str]) -> MinferencePattern:
    """An MInference pattern file (``sparse_attention_config.json``): a list of layers, each an object mapping
    every query head 0 .. heads - 1 to ``[pattern, vertical_size, slash_size, score]``."""
    source = os.fspath(path)
    doc = _read_json(source, "an MInference pattern")
    if not isinstance(doc, list) or not doc:
        raise InputError(f"{source}: an MInference pattern file holds a list with one object per layer.")
    heads = None
    rows: list[list[list[Any]]] = []
    for layer, entry in enumerate(doc):
        if not isinstance(entry, dict) or not entry:
            raise InputError(f"{source}: layer {layer} is not an object mapping each head to its pattern.")
        numbers = {}
        for key in entry:
            if not (key.isascii() and key.isdigit()):
                raise InputError(f"{source}: layer {layer}: {_shown(key)} is not a head's number.")
            numbers[int(key)] = entry[key]
        if heads is None:
            heads = len(numbers)
        if len(numbers) != heads:
            raise InputError(f"{source}: layer {layer} holds {len(numbers)} heads, layer 0 {heads}; every layer holds "
                             "every query head.")
        missing = next((h for h in range(heads) if h not in numbers), None)
        if missing is not None:
            raise InputError(f"{source}: layer {layer} has no head {missing}; vLLM and SGLang look up every query "
                             f"head 0..{heads - 1}.")
        row = []
        for head in range(heads):
            value = numbers[head]
            if not (isinstance(value, list) and len(value) == 4 and value[0] in PATTERNS
                    and all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in value[1:3])
                    and isinstance(value[3], (int, float)) and not isinstance(value[3], bool)
                    and math.isfinite(value[3])):
                raise InputError(f"{source}: layer {layer} head {head} is {_json_shown(value)}; a head's "
                                 f"pattern is [name, vertical_size, slash_size, score], the name one of "
                                 f"{', '.join(PATTERNS)}, the sizes whole numbers of at least 1.")
            row.append(value)
        rows.append(row)
    return MinferencePattern(np.array([[v[0] for v in r] for r in rows], dtype=object),
                             np.array([[v[1] for v in r] for r in rows], dtype=np.int64),
                             np.array([[v[2] for v in r] for r in rows], dtype=np.int64),
                             np.array([[v[3] for v in r] for r in rows], dtype=np.float64))


def read_retrieval_scores(path: str | os.PathLike[str]) -> np.ndarray:
    """A retrieval-head score file: [layers, heads, runs], each head's scores under its ``"LAYER-HEAD"`` key.
    Every head of every layer must be there, with as many runs as the others, and the object on one line (its
    consumers read the first line only)."""
    from attnviz import storage
    from attnviz.jsontext import loads_json

    source = os.fspath(path)
    text = storage.read_text(source, source)
    lines = text.rstrip("\r\n").count("\n") + 1
    try:
        doc = loads_json(text)
    except ValueError as exc:
        raise InputError(f"{source}: not JSON ({exc}).") from None
    if not isinstance(doc, dict) or not doc:
        raise InputError(f"{source}: a retrieval score file holds a JSON object {{\"LAYER-HEAD\": [scores]}}.")
    if lines > 1:
        raise InputError(f"{source}: JSON over {lines} lines; Retrieval_Head and HeadKV read the first line only "
                         "(json.loads(file.readline())): write it on one line.")
    found: dict[tuple[int, int], list[float]] = {}
    for key, value in doc.items():
        layer, dash, head = key.partition("-")
        if not (dash and layer.isascii() and layer.isdigit() and head.isascii() and head.isdigit()):
            raise InputError(f"{source}: the key {_shown(key)} does not name a head as LAYER-HEAD (\"3-7\").")
        if not (isinstance(value, list) and value and all(
                isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in value)):
            raise InputError(f"{source}: {_shown(key)} is {_json_shown(value)}; a head's value is a list "
                             "of scores, one per run.")
        here = (int(layer), int(head))
        if found and here <= next(reversed(found)):
            last = "-".join(map(str, next(reversed(found))))
            raise InputError(f"{source}: {_shown(key)} comes after {last}; HeadKV reads the scores in the file's "
                             "order as [layers, heads], so the keys run layer by layer, head by head.")
        found[here] = [float(v) for v in value]
    layers = 1 + max(layer for layer, _ in found)
    heads = 1 + max(head for _, head in found)
    for layer in range(layers):
        for head in range(heads):
            if (layer, head) not in found:
                raise InputError(f"{source}: no scores for {layer}-{head}; the file holds {layers} layers x "
                                 f"{heads} heads, and HeadKV reshapes one value per head.")
    runs = {len(v) for v in found.values()}
    if len(runs) > 1:
        raise InputError(f"{source}: the heads hold {min(runs)} to {max(runs)} runs; every head is scored on "
                         "every run.")
    return np.array([[found[layer, head] for head in range(heads)] for layer in range(layers)], dtype=np.float64)


def _read_json(source: str, what: str) -> Any:
    from attnviz import storage
    from attnviz.jsontext import loads_json

    try:
        return loads_json(storage.read_text(source, source))
    except ValueError as exc:
        raise InputError(f"{source}: not JSON ({exc}); {what} is a JSON file.") from None


def _is_float(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _json_shown(value: Any) -> str:
    """A value of a JSON file in a message, as JSON: control characters visible, at most 40 characters."""
    from attnviz.text import shorten

    return shorten(json.dumps(value), 40)


def _shown(text: str) -> str:
    """A file's text in a message: control characters visible, at most 40 characters."""
    from attnviz.text import shorten

    return repr(shorten(text, 40))

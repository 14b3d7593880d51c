"""Declaring a run's options once: a dataclass field whose metadata says how the command line shows
it (``attnviz.cli.options.parameters`` makes the Typer options from it), as the variants' ``Params``
already do. The library reads only the values; the metadata is for the command line and the docs.

Metadata keys: ``help``; ``flag`` (default ``--field-name``) and ``short`` (``-q``); ``panel`` (the help
section); ``metavar`` (``FILE`` and ``TOKENS`` mark a file the run reads: the Python API takes the value
itself there, ``api.values.file_options``); ``min``, ``max``, ``above`` (bounds of a number); ``parse`` (a
named parser for values that are not plain numbers or choices: ``size``, ``positions``, ``norm``, ``ranges``, ``seed``,
``grid``, ``span``, ``column``); ``choices`` (the words a text option takes, parsed as a ``Literal`` option's are
while its help shows its metavar or ``TEXT``); ``hidden`` (an older spelling the help leaves out);
``cli=False`` for a field the command line does not set.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Mapping
from dataclasses import MISSING, field
from typing import Any, Literal, get_args, get_origin, get_type_hints

# help sections, in the order a command's help usually shows them
MASKS = "Masks"
PARAMS = "Learned parameters"
LABELS = "Labels"
RUN = "Device and precision"
OUTPUT = "Output"
CAPTURED = "Captured Q/K/V (layouts, grouped heads, RoPE)"
MODEL = "Model attention (--hf-config, or part by part)"
FIGURE = "Figure"
SELECT = "Selection"
CHECKS = "Checks (exit 3 when one fails)"
ROLLOUT = "Rollout"
IMAGE = "Image (ViT patches, vision-language image tokens)"


def option(default: Any = MISSING, help: str = "", *, factory: Any = MISSING, **meta: Any) -> Any:  # noqa: A002
    """A dataclass field declaring an option: ``option(None, "the heatmap's title", panel=FIGURE)``."""
    metadata = {"help": help, **{k: v for k, v in meta.items() if v is not None}}
    if factory is not MISSING:
        return field(default_factory=factory, metadata=metadata)
    return field(default=default, metadata=metadata)



@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    """``cls``'s type hints, resolved once (each run builds its options from them)."""
    return get_type_hints(cls)


def flat_fields(cls: type) -> list[tuple[dataclasses.Field[Any], Any]]:
    """The fields of ``cls`` with their types, a nested dataclass's fields in its place."""
    hints = _hints(cls)
    out: list[tuple[dataclasses.Field[Any], Any]] = []
    for f in dataclasses.fields(cls):
        if f.metadata.get("cli") is False:
            continue
        if dataclasses.is_dataclass(hints[f.name]):
            out.extend(flat_fields(hints[f.name]))
        else:
            out.append((f, hints[f.name]))
    return out


def build(cls: Any, values: Mapping[str, Any], **given: Any) -> Any:
    """An instance of the dataclass ``cls`` from flat ``values`` (nested dataclasses built from theirs);
    ``given`` sets fields the command line does not (``weights=...``)."""
    hints = _hints(cls)
    kwargs: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if f.name in given:
            kwargs[f.name] = given[f.name]
        elif dataclasses.is_dataclass(hints[f.name]):
            kwargs[f.name] = build(hints[f.name], values)
        elif f.name in values and f.metadata.get("cli") is not False:
            kwargs[f.name] = values[f.name]
    return cls(**kwargs)


def flag(f: dataclasses.Field[Any]) -> str:
    """The option's name on the command line (``--max-rows``)."""
    return str(f.metadata.get("flag", "--" + f.name.replace("_", "-"))).split("/")[0]


def check_value(f: dataclasses.Field[Any], hint: Any, value: Any) -> None:
    """A value given outside the command line (the Python API) checked as the command line checks it:
    its choices and bounds; a ``UsageError`` in the command line's words otherwise."""
    from attnviz.errors import UsageError

    if value is None:
        return
    name = flag(f)
    choices = _choices(hint) or tuple(f.metadata.get("choices", ()))
    if choices and value not in choices:
        raise UsageError(f"{name} {value!r}: expected one of {', '.join(map(str, choices))}.")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return
    meta = f.metadata
    if not math.isfinite(value):
        raise UsageError(f"{name} {value}: must be a finite number.")
    if "min" in meta and value < meta["min"]:
        raise UsageError(f"{name} {value}: must be at least {meta['min']}.")
    if "max" in meta and value > meta["max"]:
        raise UsageError(f"{name} {value}: must be at most {meta['max']}.")
    if "above" in meta and value <= meta["above"]:
        raise UsageError(f"{name} {value}: must be greater than {meta['above']}.")


def check_values(instance: Any) -> None:
    """Every field of the dataclass ``instance`` (those of nested dataclasses too) checked by ``check_value``."""
    cls: type = type(instance)
    hints = _hints(cls)
    for f in dataclasses.fields(instance):
        value = getattr(instance, f.name)
        if dataclasses.is_dataclass(hints[f.name]):
            check_values(value)
        else:
            check_value(f, hints[f.name], value)


def choices_of(hint: Any) -> tuple[Any, ...]:
    """The allowed values of an option typed ``Literal[...]`` (or ``Literal[...] | None``); () otherwise."""
    return _choices(hint)


def _choices(hint: Any) -> tuple[Any, ...]:
    if get_origin(hint) is Literal:
        return get_args(hint)
    for arg in get_args(hint):
        if get_origin(arg) is Literal:
            return get_args(arg)
    return ()

"""The library's messages in the words of the Python API: the library writes them as the command line
speaks (``--layer 5``, ``--check-finite``, ``weights:KEY``, ``attnviz inspect``); a run of the API says
``layer=5``, ``check_finite=True``, ``weights[KEY]`` and ``attnviz.inspect(...)`` instead, and names
where an output option of the command goes (``.table(sort=...)``, ``.save(png=...)``). Errors keep
their class (and exit code); warnings are worded the same way."""

from __future__ import annotations

import copy
import re
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from attnviz.errors import PYTHON_WORDS, AttnvizError


@dataclass(frozen=True)
class Keyword:
    """An option as a keyword argument: its name, whether it is a flag (``True``/``False``) and its choices."""

    name: str
    flag: bool = False
    choices: tuple[Any, ...] = ()


#: where the command line's output options go in the API (they are no options of the run itself)
ELSEWHERE = {
    "png": ".save(png=...)", "svg": ".save(svg=...)", "pdf": ".save(pdf=...)", "html": ".save(html=...)",
    "json": ".to_json()", "json-file": ".save(json=...)", "map-png": ".save(png=..., kind=\"map\")",
    "stats-png": ".save(png=..., kind=\"stats\")", "received-png": ".save(png=..., kind=\"received\")",
    "sort": ".table(sort=...)", "reverse": ".table(reverse=True)", "top": ".table(top=...)",
    "precision": ".table(precision=...)", "max-rows": ".table(max_rows=...)", "max-cols": ".table(max_cols=...)",
    "no-table": ".table() (nothing is printed)", "quiet": "nothing (nothing is printed)",
    "show": ".figure()", "save-weights": ".save(weights=...)", "save-output": ".save(output=...)",
}

OPTION = re.compile(r"(?<![\w/.\-])--([a-z][a-z0-9]*(?:-[a-z0-9]+)*)"
                    r"(?:( )('[^']*'|\"[^\"]*\"|-?\d[\w.+\-]*|[A-Za-z_][\w\-]*))?")
COMMAND = re.compile(r"`?attnviz (inspect|compare|rollout|view|load)((?: --[a-z][\w\-]*)*)`?")


def keywords(classes: Sequence[type]) -> dict[str, Keyword]:
    """The command-line flags of the option dataclasses ``classes`` (``--check-rows``) as keywords."""
    from attnviz.fields import choices_of, flag, flat_fields

    found: dict[str, Keyword] = {}
    for cls in classes:
        for f, hint in flat_fields(cls):
            name = flag(f).removeprefix("--")
            found.setdefault(name, Keyword(f.name, hint is bool or f.type in ("bool", bool), choices_of(hint)))
    return found


def _option(match: re.Match[str], known: Mapping[str, Keyword], memory: Mapping[str, str]) -> str:
    flag, space, value = match.group(1), match.group(2) or "", match.group(3) or ""
    negated = flag.startswith("no-") and flag[3:] in known and known[flag[3:]].flag
    keyword = known.get(flag[3:] if negated else flag)
    if keyword is None:
        where = ELSEWHERE.get(flag)
        return match.group(0) if where is None else where + space + value
    if keyword.flag:
        return f"{keyword.name}={'False' if negated else 'True'}" + space + value
    if not value or value.isupper():  # a placeholder (``--grads SPEC``): the keyword takes the value itself
        return f"{keyword.name}=…"
    if value[0] in "'\"" or re.fullmatch(r"-?\d[\w.+\-]*", value):
        return f"{keyword.name}={value}"
    if value in {str(c) for c in keyword.choices}:
        return f'{keyword.name}="{value}"'
    if value in memory:  # ``--mask mask``: the array handed over
        return f"{keyword.name}=…"
    return f"{keyword.name}=…" + space + value


def for_python(message: str, known: Mapping[str, Keyword], memory: Mapping[str, str] | None = None) -> str:
    """``message`` in the API's words. ``memory``: the names of the values handed over (as messages name
    their sources) and the keyword each was given as, for ``NAME:KEY`` (``weights[KEY]``)."""
    memory = memory or {}
    text = message
    for theirs, ours in PYTHON_WORDS.items():
        text = text.replace(theirs, ours)
    for name, keyword in sorted(memory.items(), key=lambda item: -len(item[0])):
        text = text.replace(f"{name}:KEY", f"{keyword}[KEY]")

    def command(match: re.Match[str]) -> str:
        from attnviz.inspection.options import CompareOptions, InspectOptions, RolloutOptions

        theirs = {**keywords([InspectOptions, CompareOptions, RolloutOptions]), **known}
        flags = [f for f in match.group(2).split() if f]
        given = [OPTION.sub(lambda m: _option(m, theirs, memory), f) for f in flags]
        return f"attnviz.{match.group(1)}({', '.join(['...', *given])})"

    text = COMMAND.sub(command, text)
    return OPTION.sub(lambda m: _option(m, known, memory), text)


@contextmanager
def python_words(classes: Sequence[type], memory: Mapping[str, str] | None = None,
                 outputs: Sequence[str] = ()) -> Iterator[None]:
    """Errors raised inside worded for the API (``for_python``), their class and attributes kept; ``outputs``, the
    run's output keywords its messages may name (``save_maps``: ``--save-maps`` is ``save_maps=…``)."""
    try:
        yield
    except AttnvizError as exc:
        worded = copy.copy(exc)
        known = {**{name.replace("_", "-"): Keyword(name) for name in outputs}, **keywords(classes)}
        worded.message = for_python(exc.message, known, memory)
        worded.args = (worded.message,)
        raise worded from None

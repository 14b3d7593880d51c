"""Option values, parsed and checked as the command line is read, before any file is opened: every
number and choice goes through a parser here (``Number``, ``OneOf``, ``Size``, ``Positions``,
``NormSpec``, ``Ranges``), which refuses a bad value with a message that names it (``--heads 0: must
be at least 1.``, exit 2). ``checked_option``/``typed`` build such an option; a dataclass field
declares its bounds in its metadata (``min``, ``max``, ``above``) and, for values that are not plain
numbers or choices, the parser by name (``parse``: see ``PARSERS``); every float must be finite.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from types import UnionType
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import typer

from attnviz.text import user_text

#: bounds of every whole-number option unless it says otherwise (no option needs more; sizes
#: computed from them stay within NumPy's integers)
INT_MIN, INT_MAX = -(2**31), 2**31 - 1
SEED_MAX = 2**63 - 1


_PLAIN_NUMBER = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)(e[+-]?\d+)?|[+-]?(nan|inf|infinity)", re.IGNORECASE | re.ASCII)


def shown(value: object) -> str:
    """A value as an error message quotes it: a number as typed, anything else quoted."""
    text = str(value)
    if _PLAIN_NUMBER.fullmatch(text.strip()) and len(text) <= 40:
        return text.strip()
    return "'" + user_text(text).replace("'", "\\'") + "'"


class OptionValueError(typer.BadParameter):
    """An option value attnviz refuses; shown as ``--heads 0: must be at least 1.``"""

    def __init__(self, value: object, problem: str) -> None:
        super().__init__(problem)
        self.value = value
        self.problem = problem


def _number_text(value: float) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


@dataclass(frozen=True)
class Number:
    """Parses a whole number (``kind=int``) or a finite float, within ``[min, max]`` and above
    ``above`` (exclusive) when given. Whole numbers default to 32-bit bounds."""

    kind: type = int
    min: float | None = None
    max: float | None = None
    above: float | None = None

    def __call__(self, value: Any) -> Any:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            number: int | float = value
        else:
            text = str(value).strip()
            if self.kind is int:
                if not re.fullmatch(r"[+-]?\d+", text, re.ASCII):
                    raise OptionValueError(value, "expected a whole number")
                digits = text.lstrip("+-").lstrip("0")
                number = int(text) if len(digits) <= 30 else (-1 if text.startswith("-") else 1) * 10**30
            else:
                try:
                    number = float(text)
                except ValueError:
                    raise OptionValueError(value, "expected a number") from None
        if isinstance(number, float) and not math.isfinite(number):
            raise OptionValueError(value, "must be a finite number")
        if self.kind is int and isinstance(number, float):
            if not number.is_integer():
                raise OptionValueError(value, "expected a whole number")
            number = int(number)
        if self.above is not None and not number > self.above:
            raise OptionValueError(value, "must be positive" if self.above == 0 else
                                   f"must be greater than {_number_text(self.above)}")
        low = self.min if self.min is not None else (INT_MIN if self.kind is int else None)
        if low is not None and number < low:
            raise OptionValueError(value, f"must be at least {_number_text(low)}")
        if number > self._max():
            raise OptionValueError(value, f"must be at most {_number_text(self._max())}")
        return self.kind(number)

    def _max(self) -> float:
        if self.max is not None:
            return self.max
        return INT_MAX if self.kind is int else math.inf


@dataclass(frozen=True)
class OneOf:
    """Parses one of a fixed set of words (a ``Literal`` option)."""

    choices: tuple[str, ...]

    def __call__(self, value: Any) -> str:
        if isinstance(value, str) and value in self.choices:
            return value
        raise OptionValueError(value, f"expected one of {', '.join(self.choices)}")


@dataclass(frozen=True)
class Size:
    """``--max-memory``: ``512M``, ``2G``, ``1.5GiB``, ``300000000`` (bytes), at least 1M; returns
    the number of bytes as text, which ``attnviz.blockwise.parse_size`` reads back as is."""

    minimum: int = 2**20

    def __call__(self, value: Any) -> str:
        from attnviz.sizes import SIZE_UNITS

        text = str(value).strip().lower()
        found = re.fullmatch(r"([+-]?(?:\d+\.?\d*|\.\d+)(?:e[+-]?\d{1,3})?)\s*([a-z]*)", text, re.ASCII)
        if found is None or found.group(2) not in SIZE_UNITS:
            raise OptionValueError(value, "expected a size such as 512M, 2G or 300000000 (bytes)")
        size = float(found.group(1)) * SIZE_UNITS[found.group(2)]
        if not math.isfinite(size) or size > 2**60:
            raise OptionValueError(value, "too large")
        if size < self.minimum:
            raise OptionValueError(value, "must be at least 1M")
        return str(int(size))


@dataclass(frozen=True)
class Positions:
    """A list of whole numbers separated by commas (``--index 0,2``, ``--global-tokens 0,5``),
    checked for form here and against the data later; returned as given."""

    negative: bool = True

    def __call__(self, value: Any) -> str:
        text = str(value)
        sign = "-?" if self.negative else ""
        if not re.fullmatch(rf"\s*{sign}\d{{1,9}}\s*(,\s*{sign}\d{{1,9}}\s*)*,?\s*", text, re.ASCII):
            example = "0,2" if self.negative else "0,5"
            raise OptionValueError(value, f"expected whole numbers separated by commas, e.g. {example}")
        return text


@dataclass(frozen=True)
class NormSpec:
    """``--norm``: ``linear``, ``log``, ``power:G`` (G a positive number, matplotlib's PowerNorm
    gamma) or ``auto``; returned as ``power:0.5`` for ``attnviz.render.heatmap.ColourScale``."""

    def __call__(self, value: Any) -> str:
        text = str(value).strip().lower()
        if text in ("linear", "log", "auto"):
            return text
        kind, sep, gamma = text.partition(":")
        if kind != "power":
            raise OptionValueError(value, "expected linear, log, power:G (G a positive number, e.g. power:0.5) "
                                   "or auto")
        try:
            number = float(gamma) if sep else math.nan
        except ValueError:
            number = math.nan
        if not (math.isfinite(number) and number > 0):
            raise OptionValueError(value, "the G of power:G must be a positive number, e.g. power:0.5")
        return f"power:{number:g}"


@dataclass(frozen=True)
class Ranges:
    """``--layers``/``--heads``: numbers and ranges separated by commas (``0,3,5-7``), checked for
    form here and against the weights by ``select_indices``; returned as given."""

    def __call__(self, value: Any) -> str:
        text = str(value).replace(" ", "")
        item = r"-?\d{1,9}(?:--?\d{1,9})?"
        if not re.fullmatch(rf"{item}(?:,{item})*,?", text, re.ASCII):
            raise OptionValueError(value, "expected numbers and ranges separated by commas, e.g. 0,3,5-7")
        return text


@dataclass(frozen=True)
class GridSpec:
    """``--patch-grid``: rows x columns of patches (``14x14``, ``16X12``); checked for form here and against
    the keys by ``attnviz.inspection.images``; returned as ``14x14``."""

    def __call__(self, value: Any) -> str:
        found = re.fullmatch(r"\s*(\d{1,5})\s*[xX×]\s*(\d{1,5})\s*", str(value), re.ASCII)
        if found is None or int(found.group(1)) < 1 or int(found.group(2)) < 1:
            raise OptionValueError(value, "expected rows x columns of patches, e.g. 14x14")
        return f"{int(found.group(1))}x{int(found.group(2))}"


@dataclass(frozen=True)
class SpanSpec:
    """``--image-tokens``: ``START:END`` positions (END excluded, START below END); checked against the
    weights by ``attnviz.inspection.images``."""

    def __call__(self, value: Any) -> str:
        found = re.fullmatch(r"\s*(\d{1,9})\s*:\s*(\d{1,9})\s*", str(value), re.ASCII)
        if found is None:
            raise OptionValueError(value, "expected START:END positions, e.g. 5:581 (END excluded)")
        start, end = int(found.group(1)), int(found.group(2))
        if end <= start:
            raise OptionValueError(value, "END must be after START (END excluded), e.g. 5:581")
        return f"{start}:{end}"


@dataclass(frozen=True)
class ColumnWord:
    """``--sort``: a column of a head table, by its statistic's name or its header (``sink_mass`` or ``sink``), or
    a corpus file's token class; checked for form here and against the file's table by
    ``attnviz.statistics.sort_key`` (which statistics a file has depends on its kind); returned as given."""

    def __call__(self, value: Any) -> str:
        text = str(value).strip()
        if not text or not text.isprintable():
            raise OptionValueError(value, "expected a column of the head table: layer, head, a statistic's name or "
                                   "its header (entropy or H), a corpus file's token class")
        return text


def parser_for(annotation: Any, *, min: float | None = None, max: float | None = None,
               above: float | None = None) -> Any:
    """The parser of an option of this type: ``Number`` for int and float, ``OneOf`` for a
    ``Literal``; None for text and flags."""
    if get_origin(annotation) in (Union, UnionType):
        inner = [a for a in get_args(annotation) if a is not type(None)]
        annotation = inner[0] if len(inner) == 1 else annotation
    if get_origin(annotation) is Literal:
        return OneOf(tuple(str(v) for v in get_args(annotation)))
    if annotation is int or annotation is float:
        return Number(annotation, min=min, max=max, above=above)
    return None


def checked_option(annotation: Any, *decls: str, min: float | None = None, max: float | None = None,
           above: float | None = None, parser: Any = None, **kwargs: Any) -> Any:
    """``typer.Option(*decls, ...)`` for a value of type ``annotation``, with attnviz's parser for
    that type (or ``parser``); ``min``/``max`` also show in the help. Use it as
    ``Annotated[int, checked_option(int, "--top", min=1, help=...)]``."""
    parser = parser or parser_for(annotation, min=min, max=max, above=above)
    if parser is not None:
        kwargs["parser"] = parser
    if isinstance(parser, Number):
        kwargs.update({k: v for k, v in (("min", min), ("max", max)) if v is not None})
    return typer.Option(*decls, **kwargs)


def typed(annotation: Any, *decls: str, **kwargs: Any) -> Any:
    """``Annotated[annotation, checked_option(annotation, *decls, ...)]``, for signatures built at run time."""
    return Annotated[annotation, checked_option(annotation, *decls, **kwargs)]




@dataclass(frozen=True)
class StatName:
    """``--stat``: a column of the file's head table, which only the file can tell (a statistic's name, ``on:SPAN``
    for a summary's span, ``class:NAME`` for a corpus file's token class); a word, checked against the file when
    it is read (``attnviz.statistics.check_stat``)."""

    def __call__(self, value: Any) -> str:
        text = str(value).strip()
        if not text or any(c.isspace() or not c.isprintable() for c in text.partition(":")[0]):
            raise OptionValueError(value, "expected a statistic's name, e.g. entropy, sink_mass or on:needle")
        return text


def _stat_completions(incomplete: str) -> list[str]:
    """What TAB offers for --stat: every statistic of the table (``attnviz.statistics``), then the forms of a
    span's and a token class's columns."""
    from attnviz.statistics import STATISTICS

    return [name for name in (*(s.name for s in STATISTICS), "on:", "class:") if name.startswith(incomplete)]


def _norm_completions(incomplete: str) -> list[str]:
    """What TAB offers for --norm: its forms (a power needs its exponent after the colon)."""
    return [form for form in ("auto", "linear", "log", "power:0.5", "power:2") if form.startswith(incomplete)]


def _column_completions(incomplete: str) -> list[str]:
    """What TAB offers for --sort: layer, head and every statistic's name and header (as ``--sort`` spells it)."""
    from attnviz.statistics import CORPUS, SUMMARY, WEIGHTS, sort_words

    words = dict.fromkeys(["layer", "head", *(w for face in (WEIGHTS, SUMMARY, CORPUS) for w in sort_words(face))])
    return [word for word in words if word.startswith(incomplete)]


#: the parsers a dataclass field names in its metadata (``parse``), and what TAB offers for them
PARSERS: dict[str, Any] = {
    "size": Size(),
    "positions": Positions(),
    "positions+": Positions(negative=False),
    "norm": NormSpec(),
    "ranges": Ranges(),
    "grid": GridSpec(),
    "span": SpanSpec(),
    "seed": Number(int, min=0, max=SEED_MAX),
    "stat": StatName(),
    "column": ColumnWord(),
}
COMPLETIONS: dict[str, Any] = {"norm": _norm_completions, "stat": _stat_completions, "column": _column_completions}

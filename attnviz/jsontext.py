"""JSON text parsed within bounds: a JSON text may nest at most ``MAX_JSON_DEPTH`` brackets deep, checked in
linear time before it is parsed (``loads_json``), so that no input makes the parser recurse out of its stack;
every failure is one short line. Arrays given as JSON, configs, jobs files, safetensors headers and exported
policies are read through it (docs/inputs.md).
"""

from __future__ import annotations

import json
import re
from typing import Any

import numpy as np

from attnviz.quoting import reason

#: the deepest nesting of ``[``/``{`` a JSON text may have (NumPy arrays have at most 64 dimensions)
MAX_JSON_DEPTH = 64

#: an escape inside a JSON string (a backslash and the character after it)
_JSON_ESCAPE = re.compile(r"\\[\s\S]")
#: a JSON string once its escapes are gone, or what is left of one cut short (never backtracks)
_JSON_STRING = re.compile(r'"[^"]*(?:"|\Z)')
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")


def json_depth(text: str) -> int:
    """How deeply ``[`` and ``{`` nest in a JSON text, outside strings: linear time, no recursion, NumPy
    for the counting (bounded temporaries)."""
    skeleton = _NOT_BRACKET.sub("", _JSON_STRING.sub("", _JSON_ESCAPE.sub("", text))).encode("ascii")
    depth = deepest = 0
    step = 1 << 22
    for start in range(0, len(skeleton), step):
        codes = np.frombuffer(skeleton, np.uint8, count=min(step, len(skeleton) - start), offset=start)
        moves = np.where((codes == 91) | (codes == 123), 1, -1).astype(np.int64)
        levels = np.cumsum(moves) + depth
        deepest = max(deepest, int(levels.max()))
        depth = int(levels[-1])
    return deepest


def loads_json(text: str, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """``json.loads`` with the nesting checked first; every failure is a ``ValueError`` with one short line."""
    depth = json_depth(text)
    if depth > max_depth:
        raise ValueError(f"nested {depth} levels deep; attnviz reads JSON nested at most {max_depth} deep")
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{exc.msg} at line {exc.lineno}, column {exc.colno}") from None
    except RecursionError:  # pragma: no cover - the depth check comes first
        raise ValueError("nested too deeply") from None
    except ValueError as exc:  # an integer of more than 4300 digits, ...
        raise ValueError(reason(exc)) from None

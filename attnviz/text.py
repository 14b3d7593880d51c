"""Text from files made inert before it reaches a terminal or a figure.

Labels (``--labels`` files and lists, JSON labels, bundle ``q_labels``), file names and anything
else a user's files put into a message, a table or a figure go through here first:

* control characters are made visible as Python-style escapes, never sent: C0 (``\\x00``-``\\x1f``,
  ESC shown as ``\\x1b``, CR as ``\\r``, tab as ``\\t``, a newline in a label as ``\\n``), DEL and C1
  (``\\x7f``-``\\x9f``), the bidirectional overrides, embeddings, isolates and marks (U+202E shown
  as ``\\u202e``), the line and paragraph separators, a byte-order mark, and lone surrogates (the
  bytes of a file name that is not UTF-8, which a terminal could not even encode);
* long text is shortened with an ellipsis *before* anything else looks at it, so a one-megabyte
  label costs no more than a short one;
* a line for a terminal too narrow for it has its long paths shortened in the middle (``fit_paths``),
  the file name kept.

Rich markup (``[bold red]``) and emoji codes (``:smile:``) are not changed here (a backslash would
show); the renderers hand such text to rich as ``rich.text.Text``, which rich never parses, and the
command line prints messages with ``markup=False, emoji=False``. Figures draw text with
``parse_math=False``, so ``$x^2$`` shows as written.

The standard library only: fast, and importable without NumPy.
"""

from __future__ import annotations

import re

ELLIPSIS = "…"
LABEL_WIDTH = 24  # table headers and heatmap tick labels
TITLE_WIDTH = 200  # table and figure titles
MESSAGE_WIDTH = 2000  # a message on stderr (the middle is cut, so that its advice stays)
PATH_FLOOR = 24  # a path shortened to fit a line keeps this many characters at least

_UNSAFE = re.compile(
    "[\x00-\x1f\x7f-\x9f"  # C0, DEL, C1
    "\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069"  # bidirectional marks, embeddings, overrides, isolates
    "\u2028\u2029\ufeff"  # line and paragraph separators, byte-order mark
    "\ud800-\udfff]"  # lone surrogates (undecodable bytes of a file name)
)
_UNSAFE_OR_NEWLINE_KEPT = re.compile(_UNSAFE.pattern.replace("\x00-\x1f", "\x00-\x09\x0b-\x1f"))
_NAMED = {"\t": "\\t", "\n": "\\n", "\r": "\\r"}
_PATH = re.compile(r"[^\s/\\]*[/\\]\S*")  # a word with a slash in it: a path, relative or absolute


def _escape(match: re.Match[str]) -> str:
    ch = match.group()
    named = _NAMED.get(ch)
    if named is not None:
        return named
    code = ord(ch)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def visible(text: str, *, newlines: bool = False) -> str:
    """``text`` with every control character escaped (``\\x1b``, ``\\r``, ``\\u202e``); with
    ``newlines`` a line feed stays a line break (messages of two lines)."""
    text = str(text)
    pattern = _UNSAFE_OR_NEWLINE_KEPT if newlines else _UNSAFE
    return pattern.sub(_escape, text) if pattern.search(text) else text


def user_text(text: str, limit: int | None = 40, keep: str = "") -> str:
    """Text a user gave (an option's value, a command's name, a message quoting them) as a message shows it
    (``visible``: control characters such as ESC, CR, BEL escaped; a line feed kept when ``keep`` has it),
    shortened to ``limit`` characters and ``...``."""
    if limit is not None and len(text) > limit:
        text = text[:limit] + "..."
    return visible(text, newlines="\n" in keep)


def shorten(text: str, width: int) -> str:
    """At most ``width`` characters, the last an ellipsis when some were cut; made visible first
    (escapes count), but only a prefix of a long text is ever looked at."""
    text = str(text)
    shown = visible(text[: width + 1])
    if len(shown) <= width and len(text) <= width:
        return shown
    return shown[: max(width - 1, 0)] + ELLIPSIS


def label(text: str, width: int = LABEL_WIDTH) -> str:
    """A token label for a table header, a tick or a row name: visible and at most ``width`` long."""
    return shorten(text, width)


def title(text: str, width: int = TITLE_WIDTH) -> str:
    """A title (it may hold file names): visible and at most ``width`` long."""
    return shorten(text, width)


def message(text: str, width: int = MESSAGE_WIDTH) -> str:
    """A message for stderr: control characters visible except line breaks; an over-long message
    keeps its beginning and its end (where the advice is) around an ellipsis."""
    text = str(text)
    if len(text) > width:
        half = width // 2
        text = text[:half] + ELLIPSIS + text[-half:]
    return visible(text, newlines=True)


def middle(text: str, width: int) -> str:
    """``text`` in at most ``width`` characters: its beginning and its end around an ellipsis, the end
    holding a path's file name whole where it takes at most two thirds of the room."""
    if len(text) <= width:
        return text
    room = max(width - 1, 2)
    name = len(text) - max(text.rfind("/", 0, len(text) - 1), text.rfind("\\", 0, len(text) - 1))
    tail = name if name <= room * 2 // 3 else room - room // 3
    return text[: room - tail] + ELLIPSIS + text[len(text) - tail:]


def fit_paths(text: str, width: int, floor: int = PATH_FLOOR) -> str:
    """Each line of ``text`` longer than ``width`` with its paths (words with a slash) shortened in the
    middle, the longest first, none below ``floor`` characters, so that it fits. A line that cannot fit
    so is left to wrap at its spaces: only a path longer than a whole line is shortened then, to the width."""
    return "\n".join(_fit_line(line, width, floor) for line in text.split("\n"))


def _fit_line(line: str, width: int, floor: int) -> str:
    excess = len(line) - width
    if excess <= 0:
        return line
    spans = sorted((m.span() for m in _PATH.finditer(line) if m.end() - m.start() > floor),
                   key=lambda span: span[0] - span[1])
    cuts: dict[tuple[int, int], int] = {}
    if sum(end - start - floor for start, end in spans) < excess:  # it wraps: each path on a line at most
        room = {span: width - span[0] - 1 if span[0] < width // 2 else width for span in spans}  # the first: after
        cuts = {span: span[1] - span[0] - room[span] for span in spans if span[1] - span[0] > room[span]}  # its prefix
    for start, end in spans if not cuts and excess > 0 else ():
        if excess <= 0:
            break
        cut = min(excess, end - start - floor)
        cuts[(start, end)] = cut
        excess -= cut
    out, at = [], 0
    for (start, end), cut in sorted(cuts.items()):
        out += [line[at:start], middle(line[start:end], end - start - cut)]
        at = end
    return "".join(out) + line[at:]

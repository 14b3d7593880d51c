"""A tokenizer's tokens as the text they stand for, for labels a user reads (axes, row labels, tables, the
viewer) and for finding a text among them. A capture keeps the tokens as the tokenizer spells them
(``convert_ids_to_tokens``); they are read back unchanged, and shown through here:

* ``byte-level`` (byte-level BPE: GPT-2, RoBERTa, Llama 3, SmolLM2, Qwen): each character of a token stands for
  one byte (GPT-2's ``bytes_to_unicode`` table: ``Ġ`` a space, ``Ċ`` a newline, ``Ã©`` the two bytes of ``é``);
  the token's text is its bytes read as UTF-8;
* ``sentencepiece`` (Llama 2, Mistral, T5, Gemma): ``▁`` is a space, and a byte-fallback token ``<0x0A>`` is
  that byte;
* anything else (WordPiece's ``##ing``, a special token, a token outside the table) is its own text.

A token that holds only part of a character's bytes (byte-level BPE cuts a rare character, a SentencePiece byte
fallback spells one a byte a token) shows those bytes as escapes (``\\xe4\\xbd``): the tokenizer's own decoding
of it alone is a replacement character, which says less. ``shown`` marks what would be invisible on an axis:
a space as ``·`` and a newline as ``⏎``; a tab and the other control characters are escaped as every label is
(``attnviz.text``). ``joined`` is the text of a whole sequence (a generated answer), its bytes decoded together.

The convention is the capture's (``token_style`` in its metadata, recorded from the tokenizer); a file written
without it has it read from its tokens (``detect``). The standard library only.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

from attnviz.text import shorten

BYTE_LEVEL = "byte-level"
SENTENCEPIECE = "sentencepiece"
STYLES = (BYTE_LEVEL, SENTENCEPIECE)
SPACE_MARK = "·"
NEWLINE_MARK = "⏎"
_BYTE_FALLBACK = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")
_SPECIAL = re.compile(r"^(\[[A-Za-z_]+\]|<\|?[^<>|\s]*\|?>)$")  # [CLS], <s>, <|endoftext|>: a word of its own


def _byte_table() -> dict[str, int]:
    """GPT-2's ``bytes_to_unicode``, read backwards: the character that stands for each byte -> the byte.
    Printable Latin-1 bytes stand for themselves; the others (space, control characters ...) are moved to
    ``U+0100`` on, in byte order (``Ġ`` is U+0120: byte 32, a space)."""
    kept = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table = {chr(b): b for b in kept}
    moved = 0
    for b in range(256):
        if b not in kept:
            table[chr(256 + moved)] = b
            moved += 1
    return table


BYTE_OF = _byte_table()
#: the characters of the table that only byte-level BPE writes: a space, a newline, a tab
_BYTE_MARKS = ("Ġ", "Ċ", "ĉ")


def detect(rows: Iterable[Sequence[str]]) -> str | None:
    """The convention of tokens a file holds without saying it: the mark most tokens carry (``▁``
    SentencePiece, ``Ġ``/``Ċ``/``ĉ`` byte-level BPE, ``##`` WordPiece), byte-level BPE only where every token
    is spelled in the byte table; None for WordPiece or none (shown as they are)."""
    counts = {SENTENCEPIECE: 0, BYTE_LEVEL: 0, "wordpiece": 0}
    outside = False  # a character no byte-level token holds
    for row in rows:
        for token in map(str, row):
            if "▁" in token:
                counts[SENTENCEPIECE] += 1
            elif any(mark in token for mark in _BYTE_MARKS):
                counts[BYTE_LEVEL] += 1
            elif len(token) > 2 and token.startswith("##") and token[2].isalnum():
                counts["wordpiece"] += 1
            if not outside and not _SPECIAL.match(token) and any(ch not in BYTE_OF for ch in token):
                outside = True
    if outside:
        counts[BYTE_LEVEL] = 0
    style, count = max(counts.items(), key=lambda kv: kv[1])
    return style if count and style in STYLES else None


def token_bytes(token: str, style: str | None) -> bytes | None:
    """The bytes a token stands for in ``style``; None where it is its own text (a special token, a WordPiece
    piece, a token outside the byte table)."""
    if style == BYTE_LEVEL:
        if _SPECIAL.match(token) or any(ch not in BYTE_OF for ch in token):
            return None
        return bytes(BYTE_OF[ch] for ch in token)
    if style == SENTENCEPIECE:
        fallback = _BYTE_FALLBACK.match(token)
        if fallback:
            return bytes([int(fallback.group(1), 16)])
        if _SPECIAL.match(token):
            return None
        return token.replace("▁", " ").encode("utf-8", "surrogatepass")
    return None


def text(token: str, style: str | None) -> str:
    """The text ``token`` stands for: its bytes as UTF-8, a byte that makes no whole character alone as an
    escape (``\\xe4``); the token itself where it stands for itself."""
    raw = token_bytes(str(token), style)
    return str(token) if raw is None else raw.decode("utf-8", "backslashreplace")


def mark(value: str) -> str:
    """``value`` with a space as ``·`` and a newline as ``⏎``: the whitespace a token holds, visible."""
    return value.replace(" ", SPACE_MARK).replace("\n", NEWLINE_MARK)


def shown(token: str, style: str | None) -> str:
    """A token as a label: the text it stands for, its spaces and newlines marked (only where the style says
    the token is a tokenizer's: a label of the user's own is shown as written)."""
    return mark(text(token, style)) if style in STYLES else str(token)


def shown_rows(rows: list[list[str]] | None, style: str | None) -> list[list[str]] | None:
    """``shown`` of every token of every row (None stays None)."""
    if rows is None or style not in STYLES:
        return rows
    return [[shown(t, style) for t in row] for row in rows]


def characters(tokens: Sequence[str], style: str | None) -> list[tuple[str, int, int]]:
    """The text ``tokens`` spell, a character at a time, each with the tokens that hold its first and its last byte
    (the same token but for a character split over tokens). Bytes that make no character read as the replacement
    character, one each, as the tokenizers' own decoding reads them."""
    data = bytearray()
    owner: list[int] = []
    for i, token in enumerate(tokens):
        raw = token_bytes(str(token), style)
        raw = str(token).encode("utf-8", "surrogatepass") if raw is None else raw
        data += raw
        owner += [i] * len(raw)
    out = []
    at = 0
    while at < len(data):
        lead = data[at]
        size = 1 if lead < 0x80 else 2 if 0xC0 <= lead < 0xE0 else 3 if 0xE0 <= lead < 0xF0 else \
            4 if 0xF0 <= lead < 0xF8 else 1
        try:
            char = bytes(data[at:at + size]).decode("utf-8")
        except UnicodeDecodeError:
            char, size = "\ufffd", 1
        out.append((char, owner[at], owner[at + size - 1]))
        at += size
    return out


def pieces(tokens: Sequence[str], style: str | None) -> list[str]:
    """The text of ``tokens`` cut at their boundaries: each character given to the token that holds its first
    byte (a token holding only the rest of a character's bytes gets ""), so that ``"".join(pieces)`` is the
    text the sequence spells."""
    out = [""] * len(tokens)
    for char, first, _ in characters(tokens, style):
        out[first] += char
    return out


def joined(tokens: Sequence[str], style: str | None) -> str:
    """The text a sequence of tokens spells, its bytes decoded together (a character split over tokens is whole);
    WordPiece pieces joined as the tokenizer joins them (``##`` continues a word, others begin one)."""
    if style in STYLES:
        return "".join(pieces(tokens, style))
    out = ""
    for token in tokens:
        token = str(token)
        out += token[2:] if token.startswith("##") and len(token) > 2 else (" " if out else "") + token
    return out


def trailing_once(tokens: list[str]) -> list[str]:
    """``tokens`` with a run of one special token at the end kept once: ``generate()`` pads an answer that
    ended before the others with the end-of-text (or pad) token, which says no more than once."""
    end = len(tokens)
    while end > 1 and tokens[end - 1] == tokens[end - 2] and _SPECIAL.match(tokens[end - 1]):
        end -= 1
    return tokens[:end]


#: a generated text said on one line of stderr keeps this many characters (its end cut with an ellipsis)
ANSWER_WIDTH = 2000


def answer_lines(texts: Sequence[str]) -> list[str]:
    """What each batch entry generated, a line each (``generated: "..."``, with the entry's number when there are
    several): its newlines as ``⏎``, control characters escaped, quoted so that its spaces show."""
    lines = []
    for entry, value in enumerate(texts):
        said = one_line(value, ANSWER_WIDTH)
        lines.append(f"generated{f' by batch entry {entry}' if len(texts) > 1 else ''}: \"{said}\"")
    return lines


def one_line(value: str, width: int) -> str:
    """A text said on one line: its newlines as ``⏎``, control characters escaped, at most ``width`` characters."""
    return shorten(str(value).replace("\n", NEWLINE_MARK), width)

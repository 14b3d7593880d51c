"""Text inputs read within bounds (docs/inputs.md): text (labels, token files, jobs files, configs, JSON, standard
input) is read in pieces up to ``MAX_TEXT_BYTES`` (``read_limited``, never one unbounded read) and must be UTF-8
(``decode_text``: a NUL byte or a byte that is not UTF-8 is an error saying where); a corpus's text file is read
line by line, of any size, a line at most ``MAX_LINE_CHARS`` long (``text_lines``). Where the bytes come from is
the caller's: ``storage.local`` (a regular file, or a named pipe read once), ``storage.remote`` (an object of a
store), a stream. The standard library only.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import IO, Any

from attnviz.errors import InputError
from attnviz.sizes import size_str

#: the most text (bytes) read from a JSON file, standard input, a label file or a jobs file
MAX_TEXT_BYTES = 64 * 2**20
#: what to do about too much text, by what it is
TOO_MUCH = {"JSON": "save large arrays with numpy.save (.npy)", "jobs": "split it, or use --shard"}
#: the longest line (characters) ``text_lines`` reads: one text, far past any model's positions; it keeps a file
#: without line ends from being read whole into memory
MAX_LINE_CHARS = 64 * 2**20
#: the bytes ``text_lines`` reads at a time
LINE_BLOCK = 1 << 20


class BinaryText(InputError):
    """Text that holds binary data (a NUL byte)."""


#: what the messages of text that is not text call each kind of text read (``what``), in the plural
TEXT_NAMES = {"JSON": "JSON", "labels": "labels", "jobs": "jobs files", "paths": "lists of paths",
              "header": "safetensors headers", "text": "texts"}


def binary_text(source: str, offset: int, what: str) -> BinaryText:
    """The error of a NUL byte in text: "not JSON text" where JSON was expected, else "not text" (the kind of
    text is the option's or the file's, which ``source`` names)."""
    return BinaryText(f"{source}: holds binary data (a NUL byte at offset {offset}), not "
                      f"{'JSON text' if what == 'JSON' else 'text'}.")


def not_utf8(source: str, where: str, what: str) -> InputError:
    """The error of bytes that are not UTF-8 (``where``: "byte 0xe9 at offset 3")."""
    return InputError(f"{source}: not UTF-8 text ({where}); attnviz reads {TEXT_NAMES.get(what, what)} as UTF-8.")


def read_limited(stream: IO[Any], source: str, limit: int = MAX_TEXT_BYTES, what: str = "JSON") -> bytes:
    """At most ``limit`` bytes of a stream, read in pieces (never one unbounded read); more is an error."""
    chunks: list[bytes] = []
    total = 0
    while True:
        try:
            chunk = stream.read(min(1 << 20, limit + 1 - total))
        except UnicodeDecodeError as exc:  # a text stream that decodes itself
            raise not_utf8(source, f"byte {exc.start} of a piece: 0x{exc.object[exc.start]:02x}", what) from None
        except OSError as exc:
            raise InputError(f"{source}: cannot read ({exc.strerror or exc}).") from None
        if not chunk:
            break
        data = chunk.encode("utf-8", "surrogateescape") if isinstance(chunk, str) else bytes(chunk)
        nul = data.find(b"\0")
        if nul >= 0:  # binary: say so now rather than after reading up to the limit (/dev/zero, /dev/urandom)
            raise binary_text(source, total + nul, what)
        chunks.append(data)
        total += len(data)
        if total > limit:
            advice = TOO_MUCH.get(what)
            raise InputError(f"{source}: more than {size_str(limit)} of {what}; attnviz reads at most that much "
                             f"text{'; ' + advice if advice else ''}.")
    return b"".join(chunks)


def decode_text(data: bytes, source: str, what: str = "JSON") -> str:
    """UTF-8 text, or an error saying where the first byte that is not text is."""
    nul = data.find(b"\x00")
    if nul >= 0:
        raise binary_text(source, nul, what)
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise not_utf8(source, f"byte 0x{data[exc.start]:02x} at offset {exc.start}", what) from None


def text_lines(stream: IO[bytes], source: str, what: str = "text", digest: Any = None,
               max_line: int | None = None, block: int | None = None) -> Iterator[str]:
    """The lines of the UTF-8 text of ``stream``, read ``block`` bytes at a time (``LINE_BLOCK``) to its end:
    split where ``str.splitlines`` splits (a ``\\r\\n`` across two blocks is one line end), without their
    ends, a byte-order mark at the start dropped. What is held is a block and the line being read, never the
    text: a line longer than ``max_line`` characters (``MAX_LINE_CHARS``) is an error naming it. A NUL byte or
    a byte that is not UTF-8 is ``decode_text``'s error, its offset counted from the start of the stream.
    ``digest`` (a ``hashlib`` object) is updated with every byte read."""
    import codecs

    max_line = MAX_LINE_CHARS if max_line is None else max_line
    block = LINE_BLOCK if block is None else block
    decoder = codecs.getincrementaldecoder("utf-8")()
    offset = 0  # the bytes read before this block
    number = 0  # the lines handed over
    started = False  # whether text was decoded (the byte-order mark looked for)
    held = ""  # a "\r" ending a block: its "\n" may open the next one
    carry: list[str] = []  # the line being read, in the pieces the blocks gave
    carried = 0
    while True:
        data = stream.read(block)
        final = not data
        if digest is not None:
            digest.update(data)
        nul = data.find(b"\x00")
        if nul >= 0:
            raise binary_text(source, offset + nul, what)
        pending = len(decoder.getstate()[0])  # the bytes of a character the last block cut in two
        try:
            text = decoder.decode(data, final)
        except UnicodeDecodeError as exc:
            raise not_utf8(source, f"byte 0x{exc.object[exc.start]:02x} at offset {offset - pending + exc.start}",
                           what) from None
        offset += len(data)
        if text and not started:
            started = True
            text = text.removeprefix("\ufeff")
        text, held = held + text, ""
        if not final and text.endswith("\r"):
            text, held = text[:-1], "\r"
        for part in text.splitlines(keepends=True):
            line = part.splitlines()[0]
            carried += len(line)
            if carried > max_line:
                raise InputError(f"{source}: line {number + 1} is longer than {max_line:,} characters; attnviz "
                                 f"reads one {what} a line, at most that long.")
            if len(line) == len(part):  # no line end yet: the line goes on in the next block
                carry.append(part)
                continue
            if carry:
                line, carry = "".join(carry) + line, []
            carried = 0
            number += 1
            yield line
        if final:
            break
    if carry:
        yield "".join(carry)

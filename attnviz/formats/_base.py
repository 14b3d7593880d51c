"""What every reader shares: the ``Container`` of named arrays, natural key order, key globs, capped
key listings for messages, and the limits every input is held to. NumPy only.

The limits (docs/inputs.md):

- arrays are read from regular files only (``regular_file``): a directory, a device such as ``/dev/zero``,
  a FIFO or a socket, also behind a symbolic link, is refused before it is opened (exit 2, as a missing
  file); a FIFO's message says that ``-`` reads an array (as JSON) from standard input;
- text (labels, token files, jobs files, configs, JSON) is also read from a named pipe (``<(...)``, a
  FIFO): once, in pieces, up to the same limit (``read_text_bytes``; a run that asks for it again gets
  what was read);
- sizes are judged from headers before anything is allocated: data that stays on disk (memory-mapped:
  ``.npy``, uncompressed ``.npz`` members, safetensors, contiguous HDF5 datasets, zip ``torch.save``
  files) must lie within the file's real size; data that must be held in memory (compressed members,
  chunked or compressed HDF5 datasets, conversions such as float16 -> float32) may take at most
  ``memory_limit()`` bytes;
- text (JSON files and standard input, label files, jobs files) is read in pieces up to
  ``MAX_TEXT_BYTES`` and must be UTF-8; JSON may nest at most ``MAX_JSON_DEPTH`` brackets deep,
  checked before it is parsed; a corpus's text file is read line by line, of any size, a line at most
  ``MAX_LINE_CHARS`` long (``text_lines``).
"""

from __future__ import annotations

import errno
import fnmatch
import json
import os
import re
import stat
from collections.abc import Iterable, Iterator, Sequence
from typing import IO, Any

import numpy as np

from attnviz.errors import InputError, UsageError, shape_str

#: how many keys a message lists before "and N more"
LISTED = 20
#: how many characters of one key a message shows
KEY_CHARS = 80
#: the most text (bytes) read from a JSON file, standard input, a label file or a jobs file
MAX_TEXT_BYTES = 64 * 2**20
#: what to do about too much text, by what it is
TOO_MUCH = {"JSON": "save large arrays with numpy.save (.npy)", "jobs": "split it, or use --shard"}
#: what a named pipe of an array is told (arrays are memory-mapped: a pipe cannot be)
PIPED_ARRAY = ("arrays are memory-mapped from regular files: save it to a file, or give the array as JSON on "
               "standard input with '-'")
#: how many named pipes' text a process keeps (a pipe is read once; a run may ask for it again)
PIPES_KEPT = 8
#: the longest line (characters) ``text_lines`` reads: one text, far past any model's positions; it keeps a file
#: without line ends from being read whole into memory
MAX_LINE_CHARS = 64 * 2**20
#: the bytes ``text_lines`` reads at a time
LINE_BLOCK = 1 << 20
#: the deepest nesting of ``[``/``{`` a JSON text may have (NumPy arrays have at most 64 dimensions)
MAX_JSON_DEPTH = 64
#: the least ``memory_limit()`` gives, however little memory seems free
MIN_MEMORY_LIMIT = 256 * 2**20
GLOB_CHARS = "*?["
#: ml_dtypes float types NumPy cannot compute with, by name
SMALL_FLOATS = ("bfloat16", "float8_", "float6_", "float4_")


def natural_key(text: str) -> list[object]:
    """``layer2`` before ``layer10``: digits compare as numbers."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", text)]


def natural(keys: Iterable[str]) -> list[str]:
    """Keys in natural order (``blocks.2`` before ``blocks.10``)."""
    return sorted(keys, key=natural_key)


def short(text: str, limit: int = KEY_CHARS) -> str:
    """A name from a file as a message shows it: at most ``limit`` characters."""
    text = str(text)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def listing(keys: Sequence[str], limit: int = LISTED) -> str:
    """Keys for a message: ``a, b, c``, at most ``limit`` of them (each shortened to ``KEY_CHARS``),
    then ``and N more``."""
    if not keys:
        return "nothing"
    shown = ", ".join(short(k) for k in list(keys[:limit]))
    return shown if len(keys) <= limit else f"{shown} and {len(keys) - limit} more"


def is_glob(key: str) -> bool:
    """Whether a key is an fnmatch-style pattern (``*``, ``?``, ``[...]``)."""
    return any(c in key for c in GLOB_CHARS)


def reason(exc: BaseException, limit: int = 160) -> str:
    """An exception's message as one short line for an error message. A first line that ends in a colon is a
    heading whose cause follows (huggingface_hub's "Class validation error for validator 'validate_architecture':",
    torch's "Error(s) in loading state_dict for BertModel:"): the cause is given, the exception it was raised from
    or the heading and the next line, never the heading alone."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    text = lines[0] if lines else type(exc).__name__
    if text.endswith(":") and exc.__cause__ is not None and exc.__cause__ is not exc:
        cause = reason(exc.__cause__, limit)
        return cause if cause.endswith("...") else cause.removesuffix(".")  # the message closes the sentence
    if text.endswith(":") and len(lines) > 1:
        text = f"{text} {lines[1]}"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def upcast_half(arr: np.ndarray, source: str = "the input") -> np.ndarray:
    """float16, bfloat16 and 8-bit floats (ml_dtypes) become float32; other arrays are returned as they are.
    The float32 copy is held in memory: it may take at most ``memory_limit()``."""
    if arr.dtype == np.float16 or arr.dtype.name.startswith(SMALL_FLOATS):
        check_memory(arr.size * 4, source, f"as float32 ({arr.dtype} widened)", arr.shape)
        return np.array(arr, dtype=np.float32)  # a plain array, also from a memory map
    return arr


# ---------------------------------------------------------------------------------------------------
# Limits


def size_str(nbytes: int) -> str:
    """Bytes for a message: ``512 B``, ``1.5 KiB``, ``3.7 TiB``."""
    value = float(nbytes)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if abs(value) < 1024 or unit == "PiB":
            return f"{int(value)} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{nbytes} B"  # pragma: no cover


def _available_memory() -> int | None:
    try:
        with open("/proc/meminfo", "rb") as fh:
            for line in fh.read(1 << 16).decode("ascii", "replace").splitlines():
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return None


def memory_limit() -> int:
    """The most bytes one input array may take when it must be held in memory (decompressed, or
    converted): half the memory available now (``MemAvailable`` on Linux, physical memory elsewhere),
    at most half an address-space limit (``ulimit -v``), and never less than ``MIN_MEMORY_LIMIT``."""
    available = _available_memory()
    limit = available // 2 if available else 8 * 2**30
    try:
        import resource

        soft, _ = resource.getrlimit(resource.RLIMIT_AS)
        if soft not in (resource.RLIM_INFINITY, -1) and soft > 0:
            limit = min(limit, soft // 2)
    except (ImportError, OSError, ValueError):
        pass
    return max(limit, MIN_MEMORY_LIMIT)


def array_bytes(shape: Iterable[int], itemsize: int) -> int:
    """The bytes an array of ``shape`` would take (Python integers: no overflow)."""
    count = 1
    for n in shape:
        count *= int(n)
    return count * int(itemsize)


def describe_array(dtype: Any, shape: Iterable[int], nbytes: int) -> str:
    return f"a {dtype} array of shape {shape_str(shape)} ({size_str(nbytes)})"


def check_memory(nbytes: int, source: str, what: str = "", shape: Iterable[int] | None = None) -> None:
    """Refuse, before allocating, an array that would take more than ``memory_limit()`` in memory."""
    limit = memory_limit()
    if nbytes > limit:
        shown = f" of shape {shape_str(shape)}" if shape is not None else ""
        how = f" {what}" if what else ""
        raise InputError(f"{source}: the array{shown} would take {size_str(nbytes)} in memory{how}, "
                         f"more than the {size_str(limit)} attnviz allows (half the memory available); "
                         "store it uncompressed (.npy, numpy.savez) so that it can stay on disk, or pass a slice.")


def check_stored(nbytes: int, available: int, source: str, dtype: Any, shape: Iterable[int], where: str) -> None:
    """Refuse a header that claims more bytes than ``available`` (what the file really holds)."""
    if nbytes > available:
        raise InputError(f"{source}: the header claims {describe_array(dtype, shape, nbytes)}, but {where} holds only "
                         f"{size_str(max(available, 0))}; the file is cut short or its header is wrong.")


_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
          (stat.S_ISFIFO, "a named pipe (FIFO)"), (stat.S_ISSOCK, "a socket"))


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


def regular_file(path: str | os.PathLike[str], source: str | None = None, pipe: str = PIPED_ARRAY) -> int:
    """The size of ``path`` if it is a regular file (symbolic links followed); a directory, a device, a
    FIFO or a socket, also behind a symbolic link, is a usage error (exit 2) before anything opens it,
    so nothing hangs on a pipe or reads ``/dev/zero`` for ever. A FIFO's message adds ``pipe``."""
    name = source if source is not None else str(path)
    try:
        info = os.stat(path)
    except ValueError:
        raise UsageError(f"{short(name)!r}: a file name cannot contain a NUL byte.") from None
    except (FileNotFoundError, NotADirectoryError):
        if os.path.islink(path):
            raise UsageError(f"{name}: is a symbolic link to {os.readlink(path)}, which does not exist.") from None
        raise UsageError(f"{name}: no such file.") from None
    except OSError as exc:
        if exc.errno in (errno.ENAMETOOLONG, errno.ELOOP):  # the name itself is wrong: usage
            raise UsageError(f"{short(name)}: {exc.strerror}.") from None
        raise InputError(f"{name}: cannot read ({exc.strerror or exc}).") from None
    if stat.S_ISREG(info.st_mode):
        return int(info.st_size)
    kind = next((k for test, k in _KINDS if test(info.st_mode)), "not a regular file")
    via = f" (a symbolic link to {os.path.realpath(path)})" if os.path.islink(path) else ""
    if stat.S_ISDIR(info.st_mode):
        raise UsageError(f"{name}: is a directory{via}, not an array file.")
    if stat.S_ISFIFO(info.st_mode):
        raise UsageError(f"{name}: is {kind}{via}; {pipe}.")
    raise UsageError(f"{name}: is {kind}{via}, not a regular file; attnviz reads regular files only.")


def is_pipe(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is a named pipe (a FIFO, or ``/dev/fd/N`` of ``<(...)``), symbolic links followed."""
    try:
        return stat.S_ISFIFO(os.stat(path).st_mode)
    except (OSError, ValueError):
        return False


# ---------------------------------------------------------------------------------------------------
# Text and JSON, bounded


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


_PIPES: dict[tuple[int, int], bytes] = {}  # the text of the named pipes read, by (device, inode)


def read_text_bytes(path: str | os.PathLike[str], source: str, limit: int = MAX_TEXT_BYTES,
                    what: str = "JSON") -> bytes:
    """The bytes of a text input, at most ``limit``: a regular file, or a named pipe (``--labels <(...)``, a
    FIFO) read once, in pieces, to its end (what was read is kept: a run that reads it again, as a batch
    or several files do, gets the same text). Anything else is refused as ``regular_file`` refuses it."""
    try:
        info = os.stat(path)
    except (OSError, ValueError):
        info = None
    piped = info is not None and stat.S_ISFIFO(info.st_mode)
    if not piped:
        size = regular_file(path, source)
        if size > limit:
            advice = TOO_MUCH.get(what)
            raise InputError(f"{source}: {size_str(size)} of {what}, more than the {size_str(limit)} attnviz reads"
                             f"{'; ' + advice if advice else ''}.")
    key = (info.st_dev, info.st_ino) if info is not None and piped else None
    if key is not None and key in _PIPES:
        return _PIPES[key]
    try:
        with open(path, "rb") as fh:
            data = read_limited(fh, source, limit, what)
    except OSError as exc:
        raise InputError(f"{source}: cannot read ({exc.strerror or exc}).") from None
    if key is not None:
        _PIPES[key] = data
        while len(_PIPES) > PIPES_KEPT:
            del _PIPES[next(iter(_PIPES))]
    return data


def read_text_file(path: str | os.PathLike[str], source: str, limit: int = MAX_TEXT_BYTES,
                   what: str = "JSON") -> str:
    """A text input's text (``read_text_bytes``: a regular file or a named pipe): at most ``limit`` bytes,
    UTF-8 (a byte-order mark is dropped)."""
    return decode_text(read_text_bytes(path, source, limit, what), source, what)


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


class Container:
    """A file of named arrays (``.npz``, ``.safetensors``, HDF5, a ``torch.save`` dict or list).

    Subclasses fill ``keys`` (in the file's own order) and implement ``read``; ``get`` and
    ``select`` give the errors, so every format says the same things the same way.
    """

    #: how a message names the kind of file ("archive", "file")
    noun = "file"

    def __init__(self, source: str, keys: Sequence[str]) -> None:
        self.source = source
        self.keys: list[str] = list(keys)
        self._known = set(self.keys)
        #: the dtype each array read had in the file, when it was widened on reading ("bfloat16")
        self.stored: dict[str, str] = {}

    def upcast(self, key: str, arr: np.ndarray) -> np.ndarray:
        """``upcast_half``, remembering the dtype the file stored (tolerances depend on it)."""
        out = upcast_half(arr, f"{self.source}:{key}")
        if out is not arr:
            self.stored[key] = arr.dtype.name
        return out

    def read(self, key: str) -> np.ndarray:  # pragma: no cover - every reader overrides it
        raise NotImplementedError

    def normalize(self, key: str) -> str:
        """A key as the file spells it (HDF5 drops a leading ``/``)."""
        return key

    def hint(self, key: str) -> str:
        """Anything more to say when ``key`` is not an array here (HDF5: it is a group)."""
        return ""

    def has(self, key: str) -> bool:
        return self.normalize(key) in self._known

    def get(self, key: str) -> np.ndarray:
        """The array named ``key``; an error listing what the file holds if there is none."""
        key = self.normalize(key)
        if key not in self._known:
            raise InputError(f"{self.source}: no array named {key!r}{self.hint(key)}; it holds {listing(self.keys)}.")
        return self.read(key)

    def select(self, key: str) -> list[str]:
        """The keys ``key`` names: itself if the file has it, else the matches of a glob in natural order.
        No match is an error listing the keys there are."""
        key = self.normalize(key)
        if key in self._known or not is_glob(key):
            if key not in self._known:
                self.get(key)  # the error
            return [key]
        matches = natural(k for k in self.keys if fnmatch.fnmatchcase(k, key))
        if not matches:
            raise InputError(f"{self.source}: no array matches {key!r}; it holds {listing(self.keys)}.")
        return matches


# ---------------------------------------------------------------------------------------------------
# Zip archives (.npz, torch.save)

#: the most a deflate stream can expand (1032:1), with room for a small member
DEFLATE_RATIO = 1032


def check_zip_members(infos: Iterable[Any], file_size: int, source: str) -> None:
    """Refuse a zip directory whose entries claim more than the archive can hold: a stored entry's bytes
    must lie inside the file, a deflated entry cannot expand more than deflate can. (What an entry may
    take in memory is judged when it is read.)"""
    import zipfile

    for info in infos:
        name = short(info.filename)
        if info.header_offset + info.compress_size > file_size:
            raise InputError(f"{source}: not a readable zip archive (the entry {name!r} claims "
                             f"{size_str(info.compress_size)} beyond the end of the file; it is cut short).")
        if info.compress_type == zipfile.ZIP_STORED and info.file_size != info.compress_size:
            raise InputError(f"{source}: not a readable zip archive (the stored entry {name!r} claims "
                             f"{size_str(info.file_size)} but holds {size_str(info.compress_size)}).")
        if info.compress_type == zipfile.ZIP_DEFLATED and info.file_size > info.compress_size * DEFLATE_RATIO + 1024:
            raise InputError(f"{source}: not a readable zip archive (the entry {name!r} claims "
                             f"{size_str(info.file_size)} from {size_str(info.compress_size)} of compressed data, "
                             "more than deflate can expand: a zip bomb or a damaged directory).")


def zip_data_offset(fh: IO[bytes], info: Any, file_size: int) -> int:
    """Where a zip entry's data starts in the file (after its local header), checked to lie inside it."""
    import struct

    fh.seek(info.header_offset)
    local = fh.read(30)
    if len(local) != 30 or local[:4] != b"PK\x03\x04":
        raise ValueError(f"bad local header for {short(info.filename)!r}")
    name_len, extra_len = struct.unpack("<HH", local[26:30])
    start = info.header_offset + 30 + name_len + extra_len
    if start + info.compress_size > file_size:
        raise ValueError(f"the entry {short(info.filename)!r} runs past the end of the file")
    return start

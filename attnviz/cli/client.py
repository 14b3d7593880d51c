"""The ``attnviz`` console script: a command goes to a warm worker (``attnviz serve``) when one for this
user and this exact attnviz is listening, and runs in this process otherwise.

This module imports the standard library only (no NumPy, TensorFlow, typer or rich): a run through a
worker costs a Python start and a round trip on a Unix socket. ``attnviz.cli.serve`` (the worker)
shares its paths, checks and framing.

**Where.** The socket is ``worker-TAG.sock`` (TAG: a checksum of where this attnviz is installed, so
two installations have two workers) in a private directory: ``$ATTNVIZ_RUNTIME_DIR`` if set, else
``$XDG_RUNTIME_DIR/attnviz`` (when that runtime directory is the user's own, mode 0700), else
``$TMPDIR/attnviz-UID`` (``/tmp/attnviz-UID``). The directory must be a real directory (not a link)
owned by the user and closed to group and others (0700); the socket file must be the user's; the
process at the other end must run as the same user (``SO_PEERCRED``). Anything else and the client
does not talk to it. No TCP, ever.

**When not.** The command runs in this process, as it always did, with ``ATTNVIZ_NO_SERVER=1`` or the
global ``--no-server`` flag; for help, ``--version``, ``attnviz`` alone and ``attnviz serve`` itself; for
a shell's completion request (``_ATTNVIZ_COMPLETE``, ``attnviz.cli.completion``);
with ``ATTNVIZ_DEBUG`` or a ``TF_CPP_MIN_LOG_LEVEL`` of 0 to 2 (TensorFlow's own messages come from a
fresh import only); when no worker listens; when the one listening is another attnviz (version,
installation or source files changed since it started) or runs with another environment for
TensorFlow, CUDA, matplotlib or Python (``FIXED_PREFIXES``) or another text encoding; when the
socket file is left by a worker that died (nobody listening: the client removes it); when the worker
declines the request or dies before it answers (its output is only shown once complete, so nothing
is shown twice: standard input it had already read is replayed to the command here).

**The conversation** (frames: one byte of kind, four of length, the payload). The worker says hello
(``H``: protocol, identity, process id, its fixed environment); the client sends the request (``Q``:
argv, working directory, umask, the forwarded environment, whether each standard stream is a
terminal and its encoding, the terminal sizes); while the command runs, the worker asks for standard
input when the command reads it (``I``: a byte count; the client answers ``D`` with bytes read from
its own standard input, empty at end of file, or ``F`` with an errno), so nothing is read that a cold
run would not read; at the end the worker sends stdout and stderr in the order they were written
(``O``/``E``) and the exit code (``X``), or declines (``N``). ``attnviz serve --status`` and
``--stop`` send ``Q`` with another op and get ``S``.
"""

from __future__ import annotations

import errno
import io
import os
import stat
import sys
from typing import IO, TYPE_CHECKING, Any, NoReturn

if TYPE_CHECKING:  # socket, json and struct are imported when a worker's socket is there to talk to
    import socket

PROTOCOL = 1
RUNTIME_ENV = "ATTNVIZ_RUNTIME_DIR"
NO_SERVER_ENV = "ATTNVIZ_NO_SERVER"
COMPLETE_ENV = "_ATTNVIZ_COMPLETE"  # set by the shell completion scripts
#: the client's variables a command may read, set in the worker for each request (any ATTNVIZ_* too)
FORWARDED = ("COLUMNS", "LINES", "NO_COLOR", "FORCE_COLOR", "TERM", "COLORTERM", "TTY_COMPATIBLE",
             "TTY_INTERACTIVE", "CLICOLOR", "CLICOLOR_FORCE", "JUPYTER_COLUMNS", "JUPYTER_LINES")
FORWARDED_PREFIX = "ATTNVIZ_"
#: variables read when TensorFlow, matplotlib or Python start: a worker serves only clients with the same
FIXED_PREFIXES = ("TF_", "CUDA_", "XLA_", "KERAS_", "MPL", "OMP_", "KMP_", "MKL_", "OPENBLAS_", "PYTHONPATH",
                  "PYTHONHASHSEED", "PYTHONWARNINGS", "PYTHONUTF8", "LD_PRELOAD", "LD_LIBRARY_PATH")
NOT_FIXED = ("TF_CPP_MIN_LOG_LEVEL",)  # the worker sets it to 3 itself (see bypass_reason)
HELLO_TIMEOUT = 10.0  # a worker answers at once, even when busy: no hello means a wedged worker
MAX_FRAME = 1 << 31
STDIN_PIECE = 1 << 20


# ----------------------------------------------------------------------------------------------
# Where the worker listens, and whether that place is safe


def runtime_dir(environ: Any = None) -> str:
    environ = os.environ if environ is None else environ
    chosen = environ.get(RUNTIME_ENV)
    if chosen:
        return os.path.abspath(chosen)
    xdg = environ.get("XDG_RUNTIME_DIR")
    if xdg and os.path.isabs(xdg):
        try:
            st = os.stat(xdg)
        except OSError:
            st = None
        if st is not None and stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid() and not st.st_mode & 0o077:
            return os.path.join(xdg, "attnviz")
    return os.path.join(environ.get("TMPDIR") or "/tmp", f"attnviz-{os.getuid()}")


def private_dir_problem(path: str) -> str | None:
    """Why ``path`` is not a directory only this user can enter, or None."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return "does not exist"
    except OSError as exc:
        return f"cannot be read ({exc.strerror})"
    if stat.S_ISLNK(st.st_mode):
        return "is a symbolic link"
    if not stat.S_ISDIR(st.st_mode):
        return "is not a directory"
    if st.st_uid != os.getuid():
        return f"belongs to another user (uid {st.st_uid})"
    if st.st_mode & 0o077:
        return f"is open to other users (mode {stat.S_IMODE(st.st_mode):04o}; it must be 0700)"
    return None


def package_dir() -> str:
    return os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def socket_path(directory: str | None = None) -> str:
    import zlib

    tag = zlib.crc32(package_dir().encode("utf-8", "surrogateescape")) & 0xFFFFFFFF
    return os.path.join(directory or runtime_dir(), f"worker-{tag:08x}.sock")


def side_path(sock: str, suffix: str) -> str:
    """The worker's lock file (``.lock``) or log (``.log``) beside its socket."""
    return sock.removesuffix(".sock") + suffix


def identity() -> str:
    """This attnviz: its version, where it is installed, and its source files (count and newest
    modification), so a worker started before an upgrade or an edit serves no one."""
    import attnviz

    count, newest = 0, 0
    folders = [package_dir()]
    while folders:
        with os.scandir(folders.pop()) as entries:
            for entry in entries:
                if entry.is_dir(follow_symlinks=False):
                    if not entry.name.startswith((".", "__")):
                        folders.append(entry.path)
                elif entry.name.endswith(".py"):
                    count += 1
                    newest = max(newest, entry.stat().st_mtime_ns)
    return f"attnviz {attnviz.__version__} at {package_dir()} ({count} files, newest {newest})"


def fixed_environment(environ: Any = None) -> dict[str, str]:
    environ = os.environ if environ is None else environ
    return {k: v for k, v in environ.items() if k.startswith(FIXED_PREFIXES) and k not in NOT_FIXED}


def encodings() -> dict[str, Any]:
    import locale

    return {"filesystem": sys.getfilesystemencoding(), "utf8_mode": sys.flags.utf8_mode,
            "locale": locale.getpreferredencoding(False)}


def forwarded_environment(environ: Any = None) -> dict[str, str]:
    environ = os.environ if environ is None else environ
    return {k: v for k, v in environ.items() if k in FORWARDED or k.startswith(FORWARDED_PREFIX)}


# ----------------------------------------------------------------------------------------------
# Frames


def send_frame(sock: socket.socket, kind: bytes, payload: bytes = b"") -> None:
    import struct

    sock.sendall(kind + struct.pack(">I", len(payload)) + payload)


def _recv_exactly(sock: socket.socket, n: int) -> bytes:
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        k = sock.recv_into(view[got:], n - got)
        if k == 0:
            raise EOFError("the other side closed the connection")
        got += k
    return bytes(buf)


def recv_frame(sock: socket.socket, limit: int = MAX_FRAME) -> tuple[bytes, bytes]:
    import struct

    head = _recv_exactly(sock, 5)
    (length,) = struct.unpack(">I", head[1:])
    if length > limit:
        raise EOFError(f"a frame of {length} bytes, more than {limit}")
    return head[:1], _recv_exactly(sock, length) if length else b""


def send_json(sock: socket.socket, kind: bytes, doc: Any) -> None:
    import json

    send_frame(sock, kind, json.dumps(doc).encode())


def peer(sock: socket.socket) -> tuple[int, int] | None:
    """(process id, user id) of the process at the other end of a Unix socket (Linux: SO_PEERCRED)."""
    import socket
    import struct

    option = getattr(socket, "SO_PEERCRED", None)
    if option is None:
        return None
    pid, uid, _ = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, option, struct.calcsize("3i")))
    return int(pid), int(uid)


# ----------------------------------------------------------------------------------------------
# Finding a worker


def lock_is_free(sock_path: str) -> bool:
    """Whether no worker holds the lock beside ``sock_path`` (a worker holds it while it lives)."""
    import fcntl

    try:
        fd = os.open(side_path(sock_path, ".lock"), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return False
    finally:
        os.close(fd)  # closing releases the lock
    return True


def remove_stale(sock_path: str, seen: os.stat_result) -> None:
    """Remove a socket file nobody listens on, unless a worker is starting (it holds the lock)."""
    import fcntl

    try:
        fd = os.open(side_path(sock_path, ".lock"), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError:
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        st = os.lstat(sock_path)
        if stat.S_ISSOCK(st.st_mode) and (st.st_ino, st.st_dev) == (seen.st_ino, seen.st_dev):
            os.unlink(sock_path)
    except OSError:
        pass
    finally:
        os.close(fd)


def connect(sock_path: str | None = None, timeout: float = HELLO_TIMEOUT) -> socket.socket | None:
    """A connection to this user's worker, checked (private directory, socket and process of this
    user), or None; a socket file nobody listens on is removed."""
    directory = runtime_dir() if sock_path is None else os.path.dirname(sock_path)
    if private_dir_problem(directory) is not None:
        return None
    sock_path = sock_path or socket_path(directory)
    if len(os.fsencode(sock_path)) > 107:
        return None
    try:
        st = os.lstat(sock_path)
    except OSError:
        return None
    if not stat.S_ISSOCK(st.st_mode) or st.st_uid != os.getuid():
        return None
    import socket

    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    try:
        sock.connect(sock_path)
        credentials = peer(sock)
    except ConnectionRefusedError:
        sock.close()
        remove_stale(sock_path, st)
        return None
    except OSError:
        sock.close()
        return None
    if credentials is not None and credentials[1] != os.getuid():
        sock.close()
        return None
    return sock


def hello(sock: socket.socket) -> dict[str, Any] | None:
    import json

    try:
        kind, payload = recv_frame(sock, limit=1 << 20)
        doc = json.loads(payload) if kind == b"H" else None
    except (OSError, EOFError, ValueError):
        return None
    return doc if isinstance(doc, dict) and doc.get("protocol") == PROTOCOL else None


def matches(doc: dict[str, Any]) -> bool:
    """Whether the worker that said ``doc`` runs this attnviz, as this process would."""
    return (doc.get("identity") == identity() and doc.get("environment") == fixed_environment()
            and doc.get("encodings") == encodings())


def ask(op: str, sock_path: str | None = None) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """Send ``op`` ("status", "stop") to the worker, of whatever version: (its hello, its answer)."""
    import json

    sock = connect(sock_path)
    if sock is None:
        return None
    with sock:
        said = hello(sock)
        if said is None:
            return None
        try:
            send_json(sock, b"Q", {"op": op})
            kind, payload = recv_frame(sock, limit=1 << 20)
            answer = json.loads(payload) if kind == b"S" else None
        except (OSError, EOFError, ValueError):
            return None
    return (said, answer) if isinstance(answer, dict) else None


# ----------------------------------------------------------------------------------------------
# The console script


def bypass_reason(args: list[str], environ: Any = None) -> str | None:
    """Why this command line runs in this process rather than through a worker, or None."""
    environ = os.environ if environ is None else environ
    if environ.get(NO_SERVER_ENV, "") not in ("", "0"):
        return NO_SERVER_ENV
    if environ.get(COMPLETE_ENV):  # a shell asking for completions (attnviz.cli.completion): answered here
        return "shell completion"
    if not args or args[0].startswith("-"):  # help, --version, --no-server, or a usage error
        return "global options"
    if args[0] == "serve":
        return "attnviz serve"
    if "--help" in args:
        return "help"
    if "-" in args[1:] and _isatty(0):  # typed by hand: a worker would wait for it, and every other client too
        return "standard input from a terminal"
    if environ.get("ATTNVIZ_DEBUG", "") not in ("", "0") or \
            environ.get("TF_CPP_MIN_LOG_LEVEL", "").strip() in ("0", "1", "2"):
        return "TensorFlow's messages asked for (they come from a fresh import)"
    if sys.stdout is None or sys.stderr is None:
        return "no standard output"
    return None


def _isatty(fd: int) -> bool:
    try:
        return os.isatty(fd)
    except OSError:
        return False


def _stream_info(stream: Any, fd: int) -> dict[str, Any] | None:
    if stream is None:
        return None
    return {"tty": _isatty(fd), "encoding": getattr(stream, "encoding", None) or "utf-8",
            "errors": getattr(stream, "errors", None) or "strict"}


def _terminal_size(fd: int) -> list[int] | None:
    try:
        size = os.get_terminal_size(fd)
    except (OSError, ValueError):
        return None
    return [size.columns, size.lines]


def request(args: list[str]) -> dict[str, Any]:
    umask = os.umask(0o022)
    os.umask(umask)
    return {"op": "run", "argv": args, "cwd": os.getcwd(), "umask": umask, "env": forwarded_environment(),
            "stdin": _stream_info(sys.stdin, 0), "stdout": _stream_info(sys.stdout, 1),
            "stderr": _stream_info(sys.stderr, 2), "terminal": [_terminal_size(fd) for fd in (0, 1, 2)]}


def _read_stdin(n: int) -> tuple[bytes, int]:
    try:
        return os.read(0, max(1, min(n, STDIN_PIECE))), 0
    except OSError as exc:
        return b"", exc.errno or errno.EIO


def through_worker(args: list[str], forwarded: bytearray) -> tuple[int, list[tuple[bytes, bytes]]] | None:
    """Run ``args`` on the worker: (exit code, output chunks), or None when there is no worker to
    run it (the caller runs it itself). Standard input passed to the worker is kept in ``forwarded``."""
    sock = connect()
    if sock is None:
        return None
    import json

    with sock:
        said = hello(sock)
        if said is None or not matches(said):
            return None
        try:
            send_json(sock, b"Q", request(args))
            sock.settimeout(None)  # a command takes as long as it takes
            chunks: list[tuple[bytes, bytes]] = []
            while True:
                kind, payload = recv_frame(sock)
                if kind == b"I":
                    data, error = _read_stdin(int.from_bytes(payload[:4], "big"))
                    forwarded += data
                    if error:
                        send_frame(sock, b"F", error.to_bytes(4, "big"))
                    else:
                        send_frame(sock, b"D", data)
                elif kind in (b"O", b"E"):
                    chunks.append((kind, payload))
                elif kind == b"X":
                    return int(json.loads(payload)["exit"]), chunks
                else:  # declined ("N"), or not a frame this client knows
                    return None
        except (OSError, EOFError, ValueError, KeyError, TypeError):  # the worker died or spoke nonsense
            return None


def _write(stream: IO[str], data: bytes, info: dict[str, Any] | None) -> None:
    binary = getattr(stream, "buffer", None)
    if binary is not None:
        stream.flush()
        binary.write(data)
    else:
        info = info or {}
        stream.write(data.decode(info.get("encoding") or "utf-8", info.get("errors") or "strict"))


def silence(fd: int) -> None:
    """The reader of ``fd`` (1 or 2) went away (``attnviz ... | head``): point it at /dev/null, so that
    what is still written, and Python's flush at exit, go nowhere quietly (as ``attnviz.cli.streams``
    does in a cold run)."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, fd)
    finally:
        os.close(devnull)


def emit(chunks: list[tuple[bytes, bytes]]) -> None:
    """Write the worker's output: stdout's and stderr's bytes, in the order the command wrote them. A
    stream whose reader went away is silenced and skipped; the other one is still written."""
    out, err = sys.stdout, sys.stderr
    closed: set[int] = set()
    last = None

    def flushed(stream: IO[str], fd: int) -> None:
        try:
            stream.flush()
        except BrokenPipeError:
            silence(fd)
            closed.add(fd)

    for kind, data in chunks:
        fd = 1 if kind == b"O" else 2
        stream = out if fd == 1 else err
        if fd in closed:
            continue
        if last is not None and last is not stream:
            flushed(last, 2 if fd == 1 else 1)
        try:
            _write(stream, data, _stream_info(stream, fd))
        except BrokenPipeError:
            silence(fd)
            closed.add(fd)
        last = stream
    for stream, fd in ((out, 1), (err, 2)):
        if fd not in closed:
            flushed(stream, fd)


class _Replayed(io.RawIOBase):
    """Standard input for a command run here after a worker had read part of it: those bytes first,
    then the rest of the real standard input."""

    def __init__(self, prefix: bytes) -> None:
        super().__init__()
        self.prefix = memoryview(prefix)

    def readable(self) -> bool:
        return True

    def isatty(self) -> bool:
        return os.isatty(0)

    def readinto(self, b: Any) -> int:
        if self.prefix:
            n = min(len(b), len(self.prefix))
            b[:n] = self.prefix[:n]
            self.prefix = self.prefix[n:]
            return n
        data = os.read(0, len(b))
        b[: len(data)] = data
        return len(data)


def replayed_stdin(prefix: bytes) -> IO[str]:
    old = sys.stdin
    return io.TextIOWrapper(io.BufferedReader(_Replayed(prefix)), encoding=getattr(old, "encoding", None) or "utf-8",
                            errors=getattr(old, "errors", None) or "strict", newline="\n")


def main(argv: list[str] | None = None) -> NoReturn:
    """The console script: through a worker when one answers, else here, exactly as before."""
    args = list(sys.argv[1:] if argv is None else argv)
    forwarded = bytearray()
    if bypass_reason(args) is None:
        try:
            served = through_worker(args, forwarded)
        except KeyboardInterrupt:
            sys.stderr.write("attnviz: interrupted\n")
            raise SystemExit(130) from None
        except Exception:  # never let the worker's path break the command line: run it here
            served = None
        if served is not None:
            code, chunks = served
            emit(chunks)  # a reader that went away (`| head`) is no error: the command's own status stands
            raise SystemExit(code)
        if forwarded:
            sys.stdin = replayed_stdin(bytes(forwarded))
    from attnviz.cli.runner import run

    run(args)

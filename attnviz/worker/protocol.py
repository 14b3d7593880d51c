"""What the warm worker (``attnviz serve``, ``attnviz.worker.server``) and its clients share: where the
worker listens and whether that place is safe, which attnviz and which environment it runs, the frames
they speak, and finding a worker. The standard library only: the console script's client imports it
before anything else.

**Where.** The socket is ``worker-TAG.sock`` (TAG: a checksum of where this attnviz is installed, so
two installations have two workers) in a private directory: ``$ATTNVIZ_RUNTIME_DIR`` if set, else
``$XDG_RUNTIME_DIR/attnviz`` (when that runtime directory is the user's own, mode 0700), else
``$TMPDIR/attnviz-UID`` (``/tmp/attnviz-UID``). The directory must be a real directory (not a link)
owned by the user and closed to group and others (0700); the socket file must be the user's; the
process at the other end must run as the same user (``SO_PEERCRED``). Anything else and the client
does not talk to it. No TCP, ever.

**Which.** A worker serves only clients of the same attnviz (``identity``: version, installation,
source files) with the same environment for TensorFlow, CUDA, matplotlib and Python
(``FIXED_PREFIXES``) and the same text encodings; the variables a command may read (``FORWARDED``,
``ATTNVIZ_*``) travel with each request.

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

import os
import stat
import sys

TYPE_CHECKING = False  # typing is not imported at run time: the console script's first steps stay quick
if TYPE_CHECKING:
    from typing import Any

if TYPE_CHECKING:  # socket, json and struct are imported when a worker's socket is there to talk to
    import _socket

PROTOCOL = 1
RUNTIME_ENV = "ATTNVIZ_RUNTIME_DIR"
#: the client's variables a command may read, set in the worker for each request (any ATTNVIZ_* too)
FORWARDED = ("COLUMNS", "LINES", "NO_COLOR", "FORCE_COLOR", "TERM", "COLORTERM", "TTY_COMPATIBLE",
             "TTY_INTERACTIVE", "CLICOLOR", "CLICOLOR_FORCE", "JUPYTER_COLUMNS", "JUPYTER_LINES",
             # the terminal --show draws in (attnviz.render.graphics.detect)
             "TERM_PROGRAM", "LC_TERMINAL", "KITTY_WINDOW_ID", "WT_SESSION", "KONSOLE_VERSION", "WEZTERM_EXECUTABLE",
             "TMUX", "STY")
FORWARDED_PREFIX = "ATTNVIZ_"
#: variables read when TensorFlow, matplotlib or Python start: a worker serves only clients with the same
FIXED_PREFIXES = ("TF_", "CUDA_", "XLA_", "KERAS_", "MPL", "OMP_", "KMP_", "MKL_", "OPENBLAS_", "PYTHONPATH",
                  "PYTHONHASHSEED", "PYTHONWARNINGS", "PYTHONUTF8", "LD_PRELOAD", "LD_LIBRARY_PATH")
NOT_FIXED = ("TF_CPP_MIN_LOG_LEVEL",)  # the worker sets it to 3 itself (see client.bypass_reason)
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
    """This attnviz: its version, where it is installed, its source files (count and newest modification),
    and the Python running it (version, executable, environment), so that a worker started before an
    upgrade or an edit, or by another Python or virtual environment, serves no one. The executable is
    named by its real path: a virtual environment's ``python`` and ``python3`` (the console script's) are
    one interpreter."""
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
    return (f"attnviz {attnviz.__version__} at {package_dir()} ({count} files, newest {newest}); "
            f"Python {sys.version} at {os.path.realpath(sys.executable)} in {sys.prefix}")


def fixed_environment(environ: Any = None) -> dict[str, str]:
    environ = os.environ if environ is None else environ
    return {k: v for k, v in environ.items() if k.startswith(FIXED_PREFIXES) and k not in NOT_FIXED}


def encodings() -> dict[str, Any]:
    return {"filesystem": sys.getfilesystemencoding(), "utf8_mode": sys.flags.utf8_mode,
            "locale": _preferred_encoding()}


def _preferred_encoding() -> str:
    """``locale.getpreferredencoding(False)`` without importing ``locale`` (a client's start) where Python
    has ``_locale.getencoding`` (3.11 on), which is what it answers outside UTF-8 mode."""
    if sys.flags.utf8_mode:
        return "utf-8"
    try:
        from _locale import getencoding  # type: ignore[attr-defined,unused-ignore]
    except ImportError:
        import locale

        return locale.getpreferredencoding(False)
    return str(getencoding())


def forwarded_environment(environ: Any = None) -> dict[str, str]:
    environ = os.environ if environ is None else environ
    return {k: v for k, v in environ.items() if k in FORWARDED or k.startswith(FORWARDED_PREFIX)}


# ----------------------------------------------------------------------------------------------
# Frames


def send_frame(sock: _socket.socket, kind: bytes, payload: bytes = b"") -> None:
    import struct

    sock.sendall(kind + struct.pack(">I", len(payload)) + payload)


def _recv_exactly(sock: _socket.socket, n: int) -> bytes:
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        k = sock.recv_into(view[got:], n - got)
        if k == 0:
            raise EOFError("the other side closed the connection")
        got += k
    return bytes(buf)


def recv_frame(sock: _socket.socket, limit: int = MAX_FRAME) -> tuple[bytes, bytes]:
    import struct

    head = _recv_exactly(sock, 5)
    (length,) = struct.unpack(">I", head[1:])
    if length > limit:
        raise EOFError(f"a frame of {length} bytes, more than {limit}")
    return head[:1], _recv_exactly(sock, length) if length else b""


def send_json(sock: _socket.socket, kind: bytes, doc: Any) -> None:
    import json

    send_frame(sock, kind, json.dumps(doc).encode())


def peer(sock: _socket.socket) -> tuple[int, int] | None:
    """(process id, user id) of the process at the other end of a Unix socket (Linux: SO_PEERCRED)."""
    import _socket  # socket's C module: ``socket`` itself costs a client's start a few milliseconds
    import struct

    option = getattr(_socket, "SO_PEERCRED", None)
    if option is None:
        return None
    pid, uid, _ = struct.unpack("3i", sock.getsockopt(_socket.SOL_SOCKET, option, struct.calcsize("3i")))
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
    """Remove a socket file nobody listens on, and the staged files its dead worker left (``ledger``), unless
    a worker is starting (it holds the lock)."""
    import fcntl

    from attnviz.worker.ledger import ledger_path, sweep

    try:
        fd = os.open(side_path(sock_path, ".lock"), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError:
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        st = os.lstat(sock_path)
        if stat.S_ISSOCK(st.st_mode) and (st.st_ino, st.st_dev) == (seen.st_ino, seen.st_dev):
            os.unlink(sock_path)
        sweep(ledger_path(sock_path))
    except OSError:
        pass
    finally:
        os.close(fd)


#: seconds a client whose worker went away mid-request waits for the worker's lock (a killed process lets go
#: of its files one after another: the connection may end a moment before the lock does)
DEAD_WAIT = 2.0


def sweep_dead(sock_path: str, wait: float = DEAD_WAIT) -> list[str]:
    """The worker of ``sock_path`` went away mid-request: once it is dead (its lock free, waiting ``wait``
    seconds at most), remove the staged files it left (``attnviz.worker.ledger``); the paths removed. A worker
    still alive after that removes its own."""
    import fcntl
    import time

    from attnviz.worker.ledger import ledger_path, sweep

    try:
        fd = os.open(side_path(sock_path, ".lock"), os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return []
    try:
        deadline = time.monotonic() + wait
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    return []
                time.sleep(0.01)
        return sweep(ledger_path(sock_path))
    except OSError:
        return []
    finally:
        os.close(fd)


def connect(sock_path: str | None = None, timeout: float = HELLO_TIMEOUT) -> _socket.socket | None:
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
    import _socket  # socket's C module (its methods; ``socket`` adds enums and files a client has no use for)

    sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
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


def hello(sock: _socket.socket) -> dict[str, Any] | None:
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
    try:
        said = hello(sock)
        if said is None:
            return None
        try:
            send_json(sock, b"Q", {"op": op})
            kind, payload = recv_frame(sock, limit=1 << 20)
            answer = json.loads(payload) if kind == b"S" else None
        except (OSError, EOFError, ValueError):
            return None
    finally:
        sock.close()
    return (said, answer) if isinstance(answer, dict) else None

"""The warm worker (``attnviz serve``): one process keeps TensorFlow, NumPy, matplotlib, rich and the
command line imported (and warmed up by a small ``scaled`` run with a PNG before it listens), and runs
the commands ordinary ``attnviz`` invocations send it (``attnviz.worker.client``; where it listens, who
may talk to it and the conversation are ``attnviz.worker.protocol``).

**One code path.** The worker is handed the command line's runner (``Worker(execute=..., preload=...)``):
a request runs through ``execute(argv)``, exactly as a cold run does (the same Click command in
standalone mode, so usage errors, exit codes and ``--help`` are Click's and attnviz's own), with the
command's streams set by ``attnviz.streams.redirected`` as ``batch`` sets a job's. Its output is kept
as bytes, encoded as the client's own streams encode, and sent once the command ends: stdout and
stderr in the order they were written, then the exit code. The client writes them to its own streams.
``preload`` imports what commands need before the worker listens.

**One request at a time.** A cold run owns its process: the working directory, the environment, the
umask, ``sys.stdin``/``stdout``/``stderr`` and the terminal. So does a request here: on the main thread,
the worker enters the client's working directory (relative paths resolve there, and messages name them
as typed), sets the client's forwarded environment (``COLUMNS``, ``NO_COLOR``, ``TERM``, ``ATTNVIZ_*`` ...)
and umask, presents the client's terminal (whether each stream is one, and its size, for rich) and fresh
warning registries, and restores all of it afterwards. Threads would have to make every path absolute,
which changes what messages say; so clients queue instead (connections are accepted and greeted at once
by other threads, and served in turn; a long command makes the next one wait). ``batch --jobs`` still
runs its jobs in threads inside a request.

**Standard input** is read only when the command reads it: the worker asks the client for each piece,
so ``attnviz scaled -`` with JSON on a pipe, an interactive terminal, or an endless stream behave as in a
cold run.

**Stopping.** After the idle timeout without a request (default 15 minutes; 0: never), on ``attnviz
serve --stop``, on SIGTERM, SIGHUP or Ctrl-C, and when its socket file is removed or replaced (its runtime folder
deleted: no client could reach it any more). A request cut short (a signal mid-command) sends no output: its
client runs the command itself (a command's files are all or nothing, so nothing is done twice); but a
``batch`` cut short sends what it printed and its exit status (143, 129 or 130), as a batch terminated in its own
process would, since its finished jobs are done (``--resume`` completes it). A client that goes away
mid-request (Ctrl-C) has its command interrupted as Ctrl-C interrupts a cold run
(``attnviz.interrupts.deliver``: never between creating a staged file and recording it, never in the middle
of an import; a signal whose exception lands in a finaliser, where Python cannot raise it, is tried again a
moment later), and nothing is sent. The staged files of the running command are recorded beside
the socket (``attnviz.worker.ledger``): a worker killed outright (SIGKILL) leaves them to its client, which
removes them before it runs the command itself, or to the next worker.

**Security.** The socket is created inside the private directory (``protocol.runtime_dir``: owned by
the user, mode 0700, checked, never a symbolic link; refused otherwise), bound under umask 077 to a
temporary name, made 0600 and renamed into place once listening. Every connection's peer must run as
the same user (``SO_PEERCRED``); others are closed unanswered. A lock file beside the socket is held for
the worker's life, so two workers never share a socket and a socket left by a dead worker is known to be
stale. Requests are bounded in size and checked before anything runs. There is no TCP.
"""

from __future__ import annotations

import codecs
import errno
import gc
import io
import json
import os
import queue
import signal
import sys
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from attnviz import interrupts, staging
from attnviz.errors import AttnvizError
from attnviz.worker import protocol
from attnviz.worker.control import duration_text
from attnviz.worker.ledger import Ledger, ledger_path, sweep

if TYPE_CHECKING:  # imported where used: importing the worker must not cost a socket module
    import socket

MAX_REQUEST = 4 << 20  # argv, environment and the rest of a request, as JSON
GREETING_TIMEOUT = 30.0  # a client sends its request at once after the hello

#: ``execute(argv)``: run ``attnviz ARGV`` in this process and return its exit status
Execute = Callable[[list[str]], int]


# ----------------------------------------------------------------------------------------------
# A request's streams


class _Bytes:
    """``sys.stdout.buffer`` of a request: bytes written as they are."""

    def __init__(self, kind: bytes, chunks: list[tuple[bytes, bytes]], tty: bool) -> None:
        self._kind, self._chunks, self._tty = kind, chunks, tty

    def write(self, data: Any) -> int:
        data = bytes(data)
        if data:
            self._chunks.append((self._kind, data))
        return len(data)

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return self._tty

    def writable(self) -> bool:
        return True


class _Output(io.TextIOBase):
    """The stdout or stderr of a request, as the client's own stream would be: its encoding (text is
    encoded as it is written, so a character the client's stream cannot encode fails here, as it would
    there) and whether it is a terminal (rich decides colours and live displays from that)."""

    def __init__(self, kind: bytes, chunks: list[tuple[bytes, bytes]], info: dict[str, Any]) -> None:
        super().__init__()
        self._kind, self._chunks = kind, chunks
        self._tty = bool(info.get("tty"))
        self._encoding = str(info.get("encoding") or "utf-8")
        self._errors = str(info.get("errors") or "strict")
        self.buffer = _Bytes(kind, chunks, self._tty)

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return self._encoding

    @property
    def errors(self) -> str:  # type: ignore[override]
        return self._errors

    def writable(self) -> bool:
        return True

    def isatty(self) -> bool:
        return self._tty

    def write(self, text: str) -> int:
        if not isinstance(text, str):
            raise TypeError(f"write() argument must be str, not {type(text).__name__}")
        if text:
            self._chunks.append((self._kind, text.encode(self._encoding, self._errors)))
        return len(text)

    def flush(self) -> None:
        pass


class _ClientGone(Exception):
    pass


class _RemoteInput(io.RawIOBase):
    """The client's standard input, read piece by piece as the command asks for it."""

    def __init__(self, request: _Request | None, tty: bool) -> None:
        super().__init__()
        self._request, self._tty = request, tty

    def readable(self) -> bool:
        return True

    def isatty(self) -> bool:
        return self._tty

    def readinto(self, b: Any) -> int:
        r = self._request
        if r is None or r.gone:
            return 0
        protocol.send_frame(r.conn, b"I", min(len(b), protocol.STDIN_PIECE).to_bytes(4, "big"))
        kind, data = r.incoming.get()
        if kind == b"F":
            code = int.from_bytes(data[:4], "big") or errno.EIO
            raise OSError(code, os.strerror(code))
        if kind != b"D":
            return 0
        data = data[: len(b)]
        b[: len(data)] = data
        return len(data)

    def readall(self) -> bytes:
        parts: list[bytes] = []
        piece = bytearray(protocol.STDIN_PIECE)
        while True:
            n = self.readinto(piece)
            if not n:
                return b"".join(parts)
            parts.append(bytes(piece[:n]))


@dataclass
class _Request:
    number: int
    conn: socket.socket
    client: int | None  # its process id
    incoming: queue.Queue[tuple[bytes | None, bytes]] = field(default_factory=queue.Queue)
    running: bool = False  # the command is running (a cancel may interrupt it)
    gone: bool = False  # the client went away
    done: bool = False  # the worker is finished with it


class _Declined(Exception):
    """A request the worker will not run (the client runs it itself)."""


class _Stop(BaseException):
    """Leave the serving loop (a signal while idle)."""


def _check_request(req: Any) -> str | None:
    """Why ``req`` is not a well-formed run request, or None."""
    if not isinstance(req, dict):
        return "not a request"
    argv, env, cwd, umask = req.get("argv"), req.get("env"), req.get("cwd"), req.get("umask")
    if not isinstance(argv, list) or not all(isinstance(a, str) and "\0" not in a for a in argv):
        return "argv"
    if not isinstance(cwd, str) or not os.path.isabs(cwd) or "\0" in cwd:
        return "working directory"
    if not isinstance(umask, int) or not 0 <= umask <= 0o777:
        return "umask"
    if not isinstance(env, dict) or not all(
            isinstance(k, str) and isinstance(v, str) and k and "=" not in k and "\0" not in k + v
            for k, v in env.items()):
        return "environment"
    for name in ("stdout", "stderr", "stdin"):
        info = req.get(name)
        if info is None and name == "stdin":
            continue
        if not isinstance(info, dict):
            return name
        try:
            codecs.lookup(str(info.get("encoding") or "utf-8"))
            codecs.lookup_error(str(info.get("errors") or "strict"))
        except LookupError:
            return f"{name} encoding"
    sizes = req.get("terminal")
    if not isinstance(sizes, list) or len(sizes) != 3 or not all(
            s is None or (isinstance(s, list) and len(s) == 2 and all(isinstance(n, int) and 0 <= n < 1 << 16
                                                                       for n in s)) for s in sizes):
        return "terminal"
    return None


@contextmanager
def _client_process(req: dict[str, Any], stdin: Any, out: _Output, err: _Output) -> Iterator[None]:
    """The process-wide state of a cold run of the client, for the duration of one request."""
    with ExitStack() as stack:
        home = os.open(".", os.O_RDONLY | os.O_CLOEXEC)
        stack.callback(os.close, home)
        try:
            os.chdir(req["cwd"])
        except OSError as exc:
            raise _Declined(f"cannot enter {req['cwd']} ({exc.strerror})") from None
        stack.callback(os.fchdir, home)

        wanted = protocol.forwarded_environment(req["env"])
        names = set(wanted) | set(protocol.forwarded_environment(os.environ))
        saved_env = {k: os.environ.get(k) for k in names}

        def restore_env() -> None:
            for k, v in saved_env.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v

        stack.callback(restore_env)
        for k in names:
            if k in wanted:
                os.environ[k] = wanted[k]
            else:
                os.environ.pop(k, None)

        stack.callback(os.umask, os.umask(req["umask"]))

        sizes = req["terminal"]
        real_size = os.get_terminal_size

        def terminal_size(fd: int = 1) -> os.terminal_size:
            if fd in (0, 1, 2):
                size = sizes[fd]
                if size is None:
                    raise OSError(errno.ENOTTY, os.strerror(errno.ENOTTY))
                return os.terminal_size(size)
            return real_size(fd)

        os.get_terminal_size = terminal_size
        stack.callback(setattr, os, "get_terminal_size", real_size)

        saved_streams = sys.stdin, sys.stdout, sys.stderr
        sys.stdin, sys.stdout, sys.stderr = stdin, out, err

        def restore_streams() -> None:
            sys.stdin, sys.stdout, sys.stderr = saved_streams

        stack.callback(restore_streams)
        stack.enter_context(warnings.catch_warnings())  # fresh registries: a warning shows once per run

        from attnviz.streams import redirected

        stack.enter_context(redirected(out, err))  # type: ignore[arg-type]  # text streams, not IO[str] subclasses
        yield


def run_request(req: dict[str, Any], execute: Execute,
                request: _Request | None = None) -> tuple[int, list[tuple[bytes, bytes]]]:
    """Run one request through ``execute`` as a cold run of its client would: (exit status, output
    chunks in order)."""
    import traceback

    chunks: list[tuple[bytes, bytes]] = []
    out, err = _Output(b"O", chunks, req["stdout"]), _Output(b"E", chunks, req["stderr"])
    stdin = None
    if req.get("stdin") is not None:
        info = req["stdin"]
        stdin = io.TextIOWrapper(io.BufferedReader(_RemoteInput(request, bool(info.get("tty")))),
                                 encoding=str(info.get("encoding") or "utf-8"),
                                 errors=str(info.get("errors") or "strict"), newline="\n")
    with _client_process(req, stdin, out, err):
        interrupts.reset()
        if request is not None:
            request.running = True
        try:
            code = execute(list(req["argv"]))
        except (KeyboardInterrupt, _Stop):
            raise
        except BaseException:  # as Python ends a process on an uncaught exception
            traceback.print_exc()
            code = 1
        finally:
            if request is not None:
                request.running = False
    return code, chunks


def _merged(chunks: list[tuple[bytes, bytes]]) -> Iterator[tuple[bytes, bytes]]:
    """Consecutive chunks of one stream as one."""
    kind = b""
    parts: list[bytes] = []
    for k, data in chunks:
        if k != kind and parts:
            yield kind, b"".join(parts)
            parts = []
        kind = k
        parts.append(data)
    if parts:
        yield kind, b"".join(parts)


# ----------------------------------------------------------------------------------------------
# The worker


#: container objects a request may leave alive on balance before the garbage collector looks at the young
#: ones (Python's default is 700): a BERT-base grid makes about 10000, which took a dozen collections (6 ms,
#: holding the GIL) per request; now none until the request is over (``serve_one`` collects then). A batch
#: of many jobs in one request is still collected, every this many objects.
GC_THRESHOLD = 20000


def collect_less_often() -> None:
    """The worker's garbage collector runs on ``GC_THRESHOLD`` new objects (its older generations' thresholds
    stay)."""
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(GC_THRESHOLD, older, oldest)


class Worker:
    """The worker: listens on ``sock_path`` (by default this user's, ``protocol.socket_path``) until
    ``idle_timeout`` seconds pass without a request (0: never), and runs each request through
    ``execute`` (the command line's runner); ``preload`` imports what commands need before it listens."""

    def __init__(self, idle_timeout: float, sock_path: str | None = None, *, execute: Execute,
                 preload: Callable[[], None]) -> None:
        self.execute = execute
        self._preload = preload
        self.directory = os.path.dirname(sock_path) if sock_path else protocol.runtime_dir()
        self.path = sock_path or protocol.socket_path(self.directory)
        self.idle_timeout = idle_timeout
        self.log_stream = sys.stderr
        self.queue: queue.Queue[tuple[socket.socket, dict[str, Any]] | None] = queue.Queue()
        self.stopping = threading.Event()
        self.signalled = False
        self.served = 0
        self.numbered = 0
        self.started = time.time()
        self.last_active = time.monotonic()
        self.current: _Request | None = None
        self.cancel_for: int | None = None
        self.postponed: dict[int, int] = {}  # request number -> the signal to end it with, after an import
        self.listener: socket.socket | None = None
        self.bound: str | None = None  # the socket's temporary name, until listen() puts it in place
        self.socket_id: tuple[int, int] | None = None
        self.lock_fd: int | None = None
        self.ledger: Ledger | None = None  # the staged files of the command running (made by prepare)
        self.accepter: threading.Thread | None = None
        # what this worker runs, taken before anything is imported (TensorFlow sets variables of its own)
        self.identity = protocol.identity()
        self.environment = protocol.fixed_environment()
        self.encodings = protocol.encodings()

    def log(self, text: str) -> None:
        try:
            print(f"attnviz serve: {text}", file=self.log_stream, flush=True)
        except (OSError, ValueError):
            pass

    # -- start

    def run(self) -> None:
        self.prepare()
        try:
            staging.set_ledger(self.ledger)
            self.bind()  # before the preload's seconds: a folder that takes no socket fails at once
            self.preload()
            self.listen()
            self.log(f"listening on {self.path} (pid {os.getpid()}, idle timeout {duration_text(self.idle_timeout)}); "
                     "Ctrl-C or attnviz serve --stop stops it")
            self.serve_forever()
        finally:
            self.shutdown()

    def prepare(self) -> None:
        try:
            os.makedirs(self.directory, mode=0o700, exist_ok=True)
        except OSError as exc:
            raise AttnvizError(f"{self.directory}: cannot create the worker's folder ({exc.strerror}).") from None
        problem = protocol.private_dir_problem(self.directory)
        if problem is not None:
            raise AttnvizError(f"{self.directory} {problem}: the worker listens only in a folder of yours that "
                               "others cannot enter (chmod 700 it, or set ATTNVIZ_RUNTIME_DIR to another).")
        if len(os.fsencode(self.path)) > 90:
            raise AttnvizError(f"{self.path}: too long for a Unix socket; set ATTNVIZ_RUNTIME_DIR to a shorter folder.")
        import fcntl

        try:
            fd = os.open(protocol.side_path(self.path, ".lock"), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC,
                         0o600)
        except OSError as exc:
            raise AttnvizError(f"{self.directory}: cannot create the worker's lock file ({exc.strerror}); "
                               "set ATTNVIZ_RUNTIME_DIR to a folder you can write.") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            raise AttnvizError(f"another worker is running or starting ({self.path}); "
                               "attnviz serve --status says which.") from None
        self.lock_fd = fd
        left = sweep(ledger_path(self.path))  # a worker killed mid-request (SIGKILL) left these
        if left:
            self.log(f"removed {len(left)} staged file(s) a killed worker had left: {', '.join(left[:3])}")
        self.ledger = Ledger(ledger_path(self.path))

    def preload(self) -> None:
        """Import what commands need (the handed ``preload``), then run a few (``warm_up``). What is left
        is frozen out of the garbage collector's reach: TensorFlow's million objects would otherwise be
        walked by every full collection, a tenth of a second in the middle of some request. Young objects
        are then looked at less often (``collect_less_often``)."""
        self._preload()
        self.warm_up()
        gc.collect()
        gc.freeze()
        collect_less_often()

    def warm_up(self) -> None:
        """A small run with tables, statistics, a PNG and JSON: TensorFlow's first operations, the
        fonts and every lazy import are paid for before the first client waits."""
        import tempfile

        import numpy as np

        start = time.perf_counter()
        plain = {"tty": False, "encoding": "utf-8", "errors": "strict"}
        with tempfile.TemporaryDirectory(prefix="attnviz-warm-up-") as folder:
            rng = np.random.default_rng(0)
            for name, shape in (("q", (4, 8)), ("k", (6, 8)), ("v", (6, 8))):
                np.save(os.path.join(folder, f"{name}.npy"), rng.standard_normal(shape).astype(np.float32))
            for argv in (["scaled", "q.npy", "k.npy", "v.npy", "--png", "w.png"],
                         ["scaled", "q.npy", "k.npy", "v.npy", "--causal", "--json"]):
                req = {"argv": argv, "cwd": folder, "umask": 0o077, "env": protocol.forwarded_environment(),
                       "stdin": None, "stdout": plain, "stderr": plain, "terminal": [None, None, None]}
                code, chunks = run_request(req, self.execute)
                if code:
                    message = b"".join(d for k, d in chunks if k == b"E").decode(errors="replace").strip()
                    self.log(f"warm-up run {' '.join(argv)} failed (exit {code}): {message[-300:]}")
        self.log(f"warmed up in {time.perf_counter() - start:.1f} s")

    def bind(self) -> None:
        """Bind the socket under a hidden temporary name in the worker's folder (``listen`` puts it in place)."""
        tmp = os.path.join(self.directory, f".{os.path.basename(self.path)}.{os.getpid()}")
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        except OSError:
            pass  # bind says what is wrong
        import socket

        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old = os.umask(0o077)
        try:
            sock.bind(tmp)
            os.chmod(tmp, 0o600)
        except OSError as exc:
            sock.close()
            raise AttnvizError(f"{self.directory}: cannot create the worker's socket ({exc.strerror}); "
                               "set ATTNVIZ_RUNTIME_DIR to a folder you can write.") from None
        finally:
            os.umask(old)
        self.bound = tmp
        self.listener = sock

    def listen(self) -> None:
        """Listen, and rename the bound socket into place: atomically, so a client never sees a socket that
        does not listen yet."""
        sock, tmp = self.listener, self.bound
        assert sock is not None and tmp is not None
        try:
            sock.listen(64)
            os.rename(tmp, self.path)
        except OSError as exc:
            raise AttnvizError(f"{self.directory}: cannot create the worker's socket ({exc.strerror}); "
                               "set ATTNVIZ_RUNTIME_DIR to a folder you can write.") from None
        self.bound = None
        st = os.lstat(self.path)
        self.socket_id = (st.st_ino, st.st_dev)
        sock.settimeout(0.25)

    # -- serve

    def serve_forever(self) -> None:
        self.last_active = time.monotonic()
        self.accepter = threading.Thread(target=self.accept_loop, name="attnviz-serve-accept", daemon=True)
        self.accepter.start()
        main = threading.current_thread() is threading.main_thread()
        previous = {}
        hook = sys.unraisablehook
        if main:
            for sig in interrupts.SIGNALS:  # SIGHUP: the terminal of a worker run in the foreground went away
                previous[sig] = signal.signal(sig, self.on_signal)
            sys.unraisablehook = self.unraisable_hook(hook)
        try:
            while not self.stopping.is_set():
                wait = 1.0
                if self.idle_timeout > 0:
                    left = self.idle_timeout - (time.monotonic() - self.last_active)
                    if left <= 0 and self.queue.empty():
                        self.log(f"no request for {duration_text(self.idle_timeout)}: stopping")
                        break
                    wait = min(wait, max(left, 0.01))
                try:
                    item = self.queue.get(timeout=wait)
                except queue.Empty:
                    if not self.socket_is_ours():
                        self.log(f"{self.path} was removed or replaced: stopping (no client can reach this worker)")
                        break
                    continue
                if item is not None:
                    self.serve_one(*item)
        except _Stop:
            pass
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            sys.unraisablehook = hook

    def on_signal(self, signum: int, frame: Any) -> None:
        target, self.cancel_for = self.cancel_for, None
        r = self.current
        if target is not None and signum == signal.SIGINT:  # sent by send_cancel: its client went away
            if r is not None and r.number == target and r.running:
                self.interrupt(r, self.postponed.pop(target, signal.SIGINT))  # as Ctrl-C in a cold run
            return
        self.signalled = True
        self.begin_stop(signal.Signals(signum).name)
        if r is not None and r.running:
            self.interrupt(r, signum)  # the command ends as a cold run would; its output is not sent
            return
        raise _Stop

    def interrupt(self, r: _Request, signum: int) -> None:
        """End the running command of ``r`` as ``signum`` ends a cold run (``attnviz.interrupts.deliver``: its
        staged files are removed), but never in the middle of an import: a module cut short is left half made
        for every later request (``AttributeError`` on names it had yet to define). Then it is tried again
        a moment later, once the import is done."""
        if interrupts.importing():
            self.postpone(r, signum)
            return
        interrupts.deliver(signum)

    def postpone(self, r: _Request, signum: int) -> None:
        """End ``r``'s command with ``signum`` a moment from now (``send_cancel``: the signal is raised then)."""
        self.postponed[r.number] = signum
        timer = threading.Timer(0.02, self.send_cancel, args=(r,))
        timer.daemon = True
        timer.start()

    def unraisable_hook(self, previous: Callable[[Any], None]) -> Callable[[Any], None]:
        """A hook for exceptions Python cannot raise (in a finaliser: ``__del__``, a weak reference's callback)
        that tries the interruption of the running command again a moment later (``postpone``) when the
        exception of its signal landed there: printed and forgotten, it would leave the command running to its
        end. (``attnviz.interrupts``' own hook sends the signal again only while its handler is in force; here
        the worker's is, and a bare SIGINT would stop the worker instead of its command.)"""
        def hook(unraisable: Any) -> None:
            exc, r = unraisable.exc_value, self.current
            if isinstance(exc, KeyboardInterrupt) and r is not None and r.running:
                self.postpone(r, exc.signum if isinstance(exc, interrupts.Terminated) else signal.SIGINT)
                return
            previous(unraisable)

        return hook

    def send_cancel(self, r: _Request) -> None:
        """Interrupt ``r``'s command from another thread: SIGINT to the main thread, marked as meant for it."""
        if r.done or not threading.main_thread().is_alive() or signal.getsignal(signal.SIGINT) != self.on_signal:
            return
        self.cancel_for = r.number
        signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGINT)

    def accept_loop(self) -> None:
        listener = self.listener
        assert listener is not None
        while not self.stopping.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError as exc:
                if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    time.sleep(0.1)
                    continue
                return
            threading.Thread(target=self.greet, args=(conn,), name="attnviz-serve-greet", daemon=True).start()

    def status(self) -> dict[str, Any]:
        import attnviz

        return {"pid": os.getpid(), "identity": self.identity, "version": attnviz.__version__, "socket": self.path,
                "started": self.started, "idle_timeout": self.idle_timeout, "served": self.served,
                "busy": self.current is not None, "client": self.current.client if self.current else None,
                "queued": self.queue.qsize(), "python": sys.executable}

    def greet(self, conn: socket.socket) -> None:
        keep = False
        try:
            credentials = protocol.peer(conn)
            if credentials is not None and credentials[1] != os.getuid():
                self.log(f"refused a connection from uid {credentials[1]} (pid {credentials[0]})")
                return
            conn.settimeout(GREETING_TIMEOUT)
            protocol.send_json(conn, b"H", {"protocol": protocol.PROTOCOL, "identity": self.identity,
                                            "pid": os.getpid(), "environment": self.environment,
                                            "encodings": self.encodings})
            kind, payload = protocol.recv_frame(conn, limit=MAX_REQUEST)
            req = json.loads(payload) if kind == b"Q" else None
            op = req.get("op") if isinstance(req, dict) else None
            if op == "status":
                protocol.send_json(conn, b"S", self.status())
            elif op == "stop":
                protocol.send_json(conn, b"S", {"stopping": True, "pid": os.getpid()})
                self.begin_stop("attnviz serve --stop")
            elif op == "run":
                problem = _check_request(req)
                if self.stopping.is_set():
                    problem = "stopping"
                if problem is not None:
                    protocol.send_json(conn, b"N", {"reason": problem})
                    return
                assert isinstance(req, dict)
                conn.settimeout(None)
                keep = True
                req["client"] = credentials[0] if credentials is not None else None
                self.queue.put((conn, req))
        except (OSError, EOFError, ValueError):
            pass
        finally:
            if not keep:
                conn.close()

    def serve_one(self, conn: socket.socket, req: dict[str, Any]) -> None:
        import socket

        if self.stopping.is_set() or _closed(conn):
            conn.close()
            return
        self.numbered += 1
        r = _Request(self.numbered, conn, req.get("client"))
        self.current = r
        threading.Thread(target=self.watch, args=(r,), name="attnviz-serve-watch", daemon=True).start()
        start = time.perf_counter()
        try:
            try:
                code, chunks = run_request(req, self.execute, r)
            except _Declined as exc:
                protocol.send_json(conn, b"N", {"reason": str(exc)})
                return
            if r.gone:
                return
            if self.signalled and req["argv"][:1] != ["batch"]:  # cut short: the client runs it itself
                return
            # a batch cut short is not run again from its start (its finished jobs have their files and their
            # lines in the results file): the client gets what a batch terminated in its own process gives,
            # and --resume completes it
            for kind, data in _merged(chunks):
                protocol.send_frame(conn, kind, data)
            self.served += 1  # counted before the client hears the end: its next ``--status`` includes this one
            protocol.send_json(conn, b"X", {"exit": code})
            self.log(f"{req['argv'][0] if req['argv'] else '(no command)'}: exit {code} "
                     f"in {time.perf_counter() - start:.2f} s")
        except KeyboardInterrupt:
            if not r.gone:
                raise
        except OSError:  # the client went away while the output was sent
            pass
        finally:
            r.done = True
            self.current = None
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            conn.close()
            self.last_active = time.monotonic()
            if self.queue.empty():
                gc.collect()  # this request's garbage, while no one waits (not in the middle of the next one)

    def watch(self, r: _Request) -> None:
        """Read the client's frames while its command runs: standard input for the command; the end of
        the connection means the client went away (its command is then interrupted)."""
        try:
            while True:
                kind, payload = protocol.recv_frame(r.conn, limit=protocol.STDIN_PIECE + 16)
                if kind not in (b"D", b"F"):
                    break
                r.incoming.put((kind, payload))
        except (OSError, EOFError):
            pass
        if r.done:
            return
        r.gone = True
        r.incoming.put((None, b""))
        self.send_cancel(r)

    # -- stop

    def begin_stop(self, reason: str) -> None:
        if self.stopping.is_set():
            return
        self.stopping.set()
        self.log(f"stopping ({reason})")
        self.remove_socket()  # new clients run their commands themselves from now on
        self.queue.put(None)

    def socket_is_ours(self) -> bool:
        """Whether clients still find this worker: its socket file is the one it made (not removed with its
        folder, nor replaced)."""
        try:
            st = os.lstat(self.path)
        except FileNotFoundError:
            return False
        except OSError:
            return True  # cannot tell (a folder made unreadable): keep serving those already connected
        return (st.st_ino, st.st_dev) == self.socket_id

    def remove_socket(self) -> None:
        try:
            st = os.lstat(self.path)
            if (st.st_ino, st.st_dev) == self.socket_id:
                os.unlink(self.path)
        except OSError:
            pass

    def shutdown(self) -> None:
        self.stopping.set()
        self.remove_socket()
        if self.accepter is not None:
            self.accepter.join(timeout=2)
        if self.listener is not None:
            self.listener.close()
        if self.bound is not None:  # bound, never put in place
            try:
                os.unlink(self.bound)
            except OSError:
                pass
        while True:  # clients still waiting run their commands themselves
            try:
                item = self.queue.get_nowait()
            except queue.Empty:
                break
            if item is not None:
                item[0].close()
        staging.set_ledger(None)
        if self.lock_fd is not None:
            os.close(self.lock_fd)
            self.lock_fd = None


def _closed(conn: socket.socket) -> bool:
    """Whether the client hung up while it waited in the queue."""
    import socket

    try:
        return conn.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True

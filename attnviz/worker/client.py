"""The console script's client: a command goes to a warm worker (``attnviz serve``) when one for this
user and this exact attnviz is listening (``run_on_worker``), and runs in the console script's own
process otherwise.

This module imports the standard library only (no NumPy, TensorFlow, Typer or rich; ``protocol`` has
the paths, checks and framing it shares with the worker): a run through a worker costs a Python start
and a round trip on a Unix socket.

**When not.** The command runs in its own process, as it always did, with ``ATTNVIZ_NO_SERVER=1`` or
the global ``--no-server`` flag; for help, ``--version``, ``attnviz`` alone and ``attnviz serve``
itself; for a shell's completion request (``_ATTNVIZ_COMPLETE``); when an argument names a pipe
(``<(...)`` is open in this process only); when an argument is a URL (an object store's credentials and
endpoint come from the environment of the process that opens it: this one); with ``ATTNVIZ_DEBUG`` or a
``TF_CPP_MIN_LOG_LEVEL`` of 0 to 2 (TensorFlow's own messages come from a fresh import only); when no
worker listens; when the one listening is another attnviz (version, installation or source files
changed since it started) or runs with another environment for TensorFlow, CUDA, matplotlib or Python
(``protocol.FIXED_PREFIXES``) or another text encoding; when the socket file is left by a worker that
died (nobody listening: the client removes it); when the worker declines the request or dies before
it answers (its output is only shown once complete, so nothing is shown twice: standard input it had
already read is replayed to the command run here, ``replayed_stdin``).
"""

from __future__ import annotations

import errno
import io
import os
import sys

from attnviz.worker.protocol import (
    STDIN_PIECE,
    connect,
    forwarded_environment,
    hello,
    matches,
    recv_frame,
    runtime_dir,
    send_frame,
    send_json,
    socket_path,
    sweep_dead,
)

TYPE_CHECKING = False  # typing is not imported at run time: the console script's first steps stay quick
if TYPE_CHECKING:
    from typing import IO, Any

NO_SERVER_ENV = "ATTNVIZ_NO_SERVER"
COMPLETE_ENV = "_ATTNVIZ_COMPLETE"  # set by the shell completion scripts


def bypass_reason(args: list[str], environ: Any = None) -> str | None:
    """Why this command line runs in this process rather than through a worker, or None."""
    environ = os.environ if environ is None else environ
    if environ.get(NO_SERVER_ENV, "") not in ("", "0"):
        return NO_SERVER_ENV
    if environ.get(COMPLETE_ENV):  # a shell asking for completions: answered by the command line itself
        return "shell completion"
    if not args or args[0].startswith("-"):  # help, --version, --no-server, or a usage error
        return "global options"
    if args[0] == "serve":
        return "attnviz serve"
    if args[0] == "view":
        return "attnviz view (an application in this terminal)"
    if "--help" in args:
        return "help"
    if "-" in args[1:] and _isatty(0):  # typed by hand: a worker would wait for it, and every other client too
        return "standard input from a terminal"
    if any(_names_a_pipe(a) for a in args[1:]):  # <(...) is open in this process only; a FIFO is read here once
        return "a named pipe among the arguments"
    if any("://" in a for a in args[1:]):  # credentials and endpoints: this process's environment, not the worker's
        return "a URL among the arguments"
    if environ.get("ATTNVIZ_DEBUG", "") not in ("", "0") or \
            environ.get("TF_CPP_MIN_LOG_LEVEL", "").strip() in ("0", "1", "2"):
        return "TensorFlow's messages asked for (they come from a fresh import)"
    if sys.stdout is None or sys.stderr is None:
        return "no standard output"
    return None


def _names_a_pipe(arg: str) -> bool:
    """Whether a command-line argument (or the value of ``--option=VALUE``) names a pipe: ``/dev/fd/N`` of
    process substitution, or a FIFO."""
    import stat

    value = arg.split("=", 1)[1] if arg.startswith("--") and "=" in arg else arg
    if value.startswith(("/dev/fd/", "/proc/self/fd/")):
        return True
    try:
        return stat.S_ISFIFO(os.stat(value).st_mode)
    except (OSError, ValueError):
        return False


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


#: seconds a client interrupted here waits for the worker to end the command (and remove what it staged)
CANCEL_WAIT = 10.0


def through_worker(args: list[str], forwarded: bytearray,
                   sock_path: str | None = None) -> tuple[int, list[tuple[bytes, bytes]]] | None:
    """Run ``args`` on the worker: (exit code, output chunks), or None when there is no worker to
    run it (the caller runs it itself). Standard input passed to the worker is kept in ``forwarded``.

    A worker that goes away after it was sent the request (killed) leaves staged files only a dead worker's
    ledger knows of: they are removed here (``protocol.sweep_dead``) before the caller runs the command.
    Ctrl-C, SIGTERM or SIGHUP here (``KeyboardInterrupt``, while ``attnviz.interrupts.handled()`` is in force) is
    passed on by closing this side of the connection; the worker interrupts the command as a cold run is
    interrupted, and this process waits (``CANCEL_WAIT`` at most) until it has, then raises again."""
    sock_path = sock_path or socket_path(runtime_dir())
    sock = connect(sock_path)
    if sock is None:
        return None
    import json

    sent = False
    try:
        said = hello(sock)
        if said is None or not matches(said):
            return None
        try:
            send_json(sock, b"Q", request(args))
            sent = True
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
        except KeyboardInterrupt:
            if sent:
                _cancel(sock)
            raise
        except (OSError, EOFError, ValueError, KeyError, TypeError):  # the worker died or spoke nonsense
            if sent:
                sweep_dead(sock_path)
            return None
    finally:
        sock.close()  # the C socket has no ``with``


def _cancel(sock: Any) -> None:
    """Tell the worker that this client is going away (the end of its side of the connection) and wait until
    the worker closes the connection, once it has ended the command; a second signal stops the wait."""
    import _socket

    try:
        sock.shutdown(_socket.SHUT_WR)
        sock.settimeout(CANCEL_WAIT)
        while sock.recv(1 << 16):
            pass
    except (OSError, KeyboardInterrupt):
        pass


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
    what is still written, and Python's flush at exit, go nowhere quietly (as ``attnviz.streams``
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



def run_on_worker(args: list[str]) -> int | None:
    """Run ``attnviz ARGS`` on a warm worker when one should and can (``bypass_reason``,
    ``through_worker``): its output is written to this process's stdout and stderr and its exit status
    returned (130, 143 or 129 when Ctrl-C, SIGTERM or SIGHUP ends it here, as for a cold run: ``attnviz.interrupts``).
    None: run the command in this process, as before; standard input the worker had read is then replayed
    to it (``sys.stdin`` is set to ``replayed_stdin``)."""
    if bypass_reason(args) is not None:
        return None
    from attnviz import interrupts

    forwarded = bytearray()
    try:
        with interrupts.handled():
            try:
                served = through_worker(args, forwarded)
            except Exception:  # never let the worker's path break the command line: run it here
                served = None
            if served is not None:
                code, chunks = served
                emit(chunks)  # a reader that went away (`| head`) is no error: the command's own status stands
                return code
    except KeyboardInterrupt as exc:
        try:
            sys.stderr.write(f"attnviz: {interrupts.said(exc)}\n")
            sys.stderr.flush()
        except (OSError, ValueError):
            pass
        return interrupts.exit_code(exc)
    if forwarded:
        sys.stdin = replayed_stdin(bytes(forwarded))
    return None

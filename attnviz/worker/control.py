"""Managing the warm worker from the command line (``attnviz serve --detach``, ``--status``, ``--stop``):
start one in the background and wait until it listens, replace one of another attnviz, say whether
one listens and what it runs, stop it. It prints nothing: what it did goes to the ``say`` function it
is handed (the command line prints ``attnviz serve: ...`` on stderr), ``show_status`` returns its text,
and failures are raised as ``AttnvizError``.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable

from attnviz.errors import AttnvizError
from attnviz.worker import protocol

DEFAULT_IDLE = 15 * 60.0  # --idle-timeout: seconds without a request before a worker stops
MAX_IDLE = 30 * 24 * 3600.0
START_TIMEOUT = 300.0  # importing TensorFlow takes seconds; on a loaded machine, more
STOP_TIMEOUT = 30.0


#: how control says what it did (the command line prints it on stderr)
Say = Callable[[str], None]


def duration_text(seconds: float) -> str:
    """A number of seconds as messages say it: ``15 min``, ``2 h``, ``90 s``; 0 is ``never``."""
    if seconds <= 0:
        return "never"
    for unit, size in (("h", 3600), ("min", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds / size:g} {unit}"
    return f"{seconds:g} s"


def stop_worker(path: str) -> tuple[int, bool] | None:
    """Ask the worker at ``path`` to stop: (its pid, whether it has exited), or None if none listens."""
    found = protocol.ask("stop", path)
    if found is None:
        return None
    pid = int(found[1].get("pid") or 0)
    deadline = time.monotonic() + STOP_TIMEOUT
    while time.monotonic() < deadline:
        if protocol.lock_is_free(path):
            return pid, True
        time.sleep(0.05)
    return pid, False


def replace_or_report(path: str, detach: bool, say: Say) -> bool:
    """Look for a worker at ``path`` before starting one. True: a worker of this attnviz already listens
    (--detach has nothing to do). A worker of another attnviz (an upgrade, edited files) is stopped."""
    found = protocol.ask("status", path)
    if found is None:
        return False
    said, status = found
    pid = status.get("pid")
    if protocol.matches(said):
        if detach:
            say(f"a worker is already listening on {path} (pid {pid}).")
            return True
        raise AttnvizError(f"a worker is already listening on {path} (pid {pid}); attnviz serve --stop stops it.")
    say(f"stopping the worker of another attnviz (pid {pid}, {said.get('identity')}).")
    stopped = stop_worker(path)
    if stopped is not None and not stopped[1]:
        raise AttnvizError(f"the worker (pid {pid}) did not stop within {STOP_TIMEOUT:g} s.")
    return False


def start_detached(idle_timeout: float, say: Say) -> None:
    """``attnviz serve --detach``: start a worker in the background (``python -m attnviz serve``, its log
    beside its socket) and return once it listens."""
    import subprocess

    directory = protocol.runtime_dir()
    path = protocol.socket_path(directory)
    if replace_or_report(path, detach=True, say=say):
        return
    try:
        os.makedirs(directory, mode=0o700, exist_ok=True)
    except OSError as exc:
        raise AttnvizError(f"{directory}: cannot create the worker's folder ({exc.strerror}).") from None
    problem = protocol.private_dir_problem(directory)
    if problem is not None:
        raise AttnvizError(f"{directory} {problem}: the worker listens only in a folder of yours that others "
                           "cannot enter (chmod 700 it, or set ATTNVIZ_RUNTIME_DIR to another).")
    log = protocol.side_path(path, ".log")
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        proc = subprocess.Popen([sys.executable, "-m", "attnviz", "serve", "--idle-timeout", repr(idle_timeout)],
                                stdin=subprocess.DEVNULL, stdout=fd, stderr=fd, cwd="/", start_new_session=True,
                                env={**os.environ, protocol.RUNTIME_ENV: directory})  # absolute: it runs in /
    finally:
        os.close(fd)
    deadline = time.monotonic() + START_TIMEOUT
    while True:
        code = proc.poll()
        if code is not None:
            found = protocol.ask("status", path)
            if found is not None and protocol.matches(found[0]):  # another --detach was quicker
                say(f"a worker is already listening on {path} (pid {found[1].get('pid')}).")
                return
            with open(log, errors="replace") as fh:
                tail = [ln for ln in fh.read().splitlines() if ln.strip()][-3:]
            raise AttnvizError(f"the worker stopped before it listened (exit {code}); {log} says:\n"
                               + "\n".join(tail))
        found = protocol.ask("status", path)
        if found is not None and found[1].get("pid") == proc.pid:
            break
        if time.monotonic() > deadline:
            proc.terminate()
            raise AttnvizError(f"the worker did not listen within {START_TIMEOUT:g} s; see {log}.")
        time.sleep(0.1)
    proc.returncode = 0  # it runs on without us: nothing to wait for
    say(f"listening on {path} (pid {proc.pid}, idle timeout {duration_text(idle_timeout)}); "
         "attnviz serve --stop stops it.")


def show_status() -> str:
    """``attnviz serve --status``: what the worker that listens runs (an error when none listens)."""
    path = protocol.socket_path()
    found = protocol.ask("status", path)
    if found is None:
        raise AttnvizError(f"no worker is listening on {path}; attnviz serve --detach starts one.")
    said, st = found
    up = max(0.0, time.time() - float(st.get("started") or time.time()))
    text = (f"a worker is listening on {path}\n"
              f"  pid {st.get('pid')}, attnviz {st.get('version')}, up {duration_text(round(up))}, "
              f"{st.get('served')} requests served, {'busy' if st.get('busy') else 'idle'}, "
              f"idle timeout {duration_text(float(st.get('idle_timeout') or 0))}\n")
    if not protocol.matches(said):
        text += (f"  it runs another attnviz ({said.get('identity')}) or another environment: commands run in "
                 "their own process; attnviz serve --detach replaces it\n")
    return text




def stop(say: Say) -> None:
    """``attnviz serve --stop``: ask this user's worker to stop, and say whether it did."""
    path = protocol.socket_path()
    stopped = stop_worker(path)
    if stopped is None:
        say(f"no worker is listening on {path}.")
    elif stopped[1]:
        say(f"stopped the worker (pid {stopped[0]}).")
    else:
        say(f"the worker (pid {stopped[0]}) stops once its current command ends.")

"""Ctrl-C (SIGINT), SIGTERM and SIGHUP during a run: the run ends as an exception, so that what it staged is
removed.

Python turns SIGINT into ``KeyboardInterrupt``; SIGTERM (what schedulers, ``kill`` and ``timeout`` send) and
SIGHUP (the terminal went away: an ssh connection that drops) end the process on the spot by default, leaving a
run's staged files behind and a batch's current job half done. While ``handled()`` is in force (the console
script's run: ``attnviz.cli.console.run``), each raises in the main thread: ``KeyboardInterrupt`` for SIGINT,
``Terminated`` (a ``KeyboardInterrupt``, with its ``signum``) for SIGTERM and SIGHUP, and ``received()`` says
which arrived, so that code that catches the exception (a batch job, whose command words it as "interrupted")
can tell that the whole run is to end. The command line exits 130, 143 or 129 (128 + the signal), as a shell
reports a process ended by it, and says so in one line (``said``), which a terminal that went away never shows.
"""

from __future__ import annotations

import signal
import threading

TYPE_CHECKING = False  # typing is not imported at run time: the console script's first steps stay quick
if TYPE_CHECKING:
    from typing import Any

#: the signals handled: SIGHUP where the system has it
SIGNALS: tuple[int, ...] = (signal.SIGINT, signal.SIGTERM, *((signal.SIGHUP,) if hasattr(signal, "SIGHUP") else ()))
_received: int | None = None
_deferring = 0  # deferred() blocks open in the main thread
_pending = False  # a signal arrived in one: raised when the outermost ends


class Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP (``signum``), raised in the main thread while ``handled()`` is in force."""

    def __init__(self, signum: int = signal.SIGTERM) -> None:
        super().__init__()
        self.signum = int(signum)

    def __reduce__(self) -> tuple[Any, ...]:
        return type(self), (self.signum,)


def received() -> int | None:
    """The signal (SIGINT, SIGTERM or SIGHUP) that arrived while ``handled()`` was in force, or None."""
    return _received


def exit_code(exc: BaseException) -> int:
    """What the command line exits with after ``exc`` (a KeyboardInterrupt): 128 + its signal (143 for SIGTERM,
    129 for SIGHUP), else 130 (Ctrl-C)."""
    return 128 + (exc.signum if isinstance(exc, Terminated) else signal.SIGINT)


def said(exc: BaseException) -> str:
    """How the command line words the end of a run by ``exc`` (a KeyboardInterrupt): ``attnviz: {said}``."""
    if not isinstance(exc, Terminated):
        return "interrupted"
    return "hung up" if exc.signum == getattr(signal, "SIGHUP", None) else "terminated"


def interruption(exc: BaseException) -> KeyboardInterrupt | None:
    """The Ctrl-C or SIGTERM behind ``exc``, if one is: Python wraps an exception raised while a class is
    made (``__set_name__``: "Error calling __set_name__") or an extension module is initialised ("initialization
    failed") in another, so a signal that lands in the middle of an import reaches the command as a
    RuntimeError or ImportError caused by it."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, KeyboardInterrupt):
            return current
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return None


def raise_received() -> None:
    """Raise the exception of the signal that arrived, if one did."""
    if _received == signal.SIGINT:
        raise KeyboardInterrupt()
    if _received is not None:
        raise Terminated(_received)


def deliver(signum: int) -> None:
    """The signal ``signum`` (SIGINT, SIGTERM or SIGHUP) arrived for the run in the main thread: raise its
    exception now, or, inside ``deferred()``, when that block ends. The handler of ``handled()`` calls this; so
    does the warm worker's own handler for the command it runs (its client went away, or the worker is stopped)."""
    global _received, _pending
    _received = signum
    if _deferring:
        _pending = True
        return
    raise KeyboardInterrupt() if signum == signal.SIGINT else Terminated(signum)


def reset() -> None:
    """Forget a signal of an earlier run in this process (the warm worker runs one command after another), and
    any ``deferred()`` block it left open (a batch's results generator closed late holds one until then)."""
    global _received, _pending, _deferring
    _received, _pending, _deferring = None, False, 0


def _on_signal(signum: int, frame: Any) -> None:
    if importing():  # never in the middle of an import: a module cut short is left half made (a class whose
        _deliver_later(signum)  # __set_name__ was cut short, an extension that "failed" to initialise)
        return
    deliver(signum)


def importing() -> bool:
    """Whether a module is being imported in this process now (its body running: the import system marks
    its spec ``_initializing`` meanwhile)."""
    import sys

    for module in list(sys.modules.values()):
        if getattr(getattr(module, "__spec__", None), "_initializing", False):
            return True
    return False


def _deliver_later(signum: int) -> None:
    """The signal again, to the main thread, in 20 ms (an import is over by then, or it is put off again),
    while ``handled()`` is still in force."""
    def again() -> None:
        main = threading.main_thread()
        if main.is_alive() and signal.getsignal(signum) is _on_signal:
            signal.pthread_kill(main.ident or 0, signum)

    timer = threading.Timer(0.02, again)
    timer.daemon = True
    timer.start()


class deferred:  # noqa: N801 - used as a function: ``with deferred():``
    """A few steps that must not be cut in two (a file created and then recorded as one to remove; a file
    renamed into place and recorded as such): a signal that arrives meanwhile is raised once they are done.
    Only the main thread receives signals; elsewhere this changes nothing. (Context managers as classes, not
    ``contextlib``'s: the console script's client imports this module, and contextlib costs it time.)"""

    def __enter__(self) -> None:
        global _deferring
        self.main = threading.current_thread() is threading.main_thread()
        if self.main:
            _deferring += 1

    def __exit__(self, *exc: object) -> None:
        global _deferring, _pending
        if not self.main:
            return
        _deferring -= 1
        if not _deferring and _pending:
            _pending = False
            raise_received()


class handled:  # noqa: N801 - used as a function: ``with handled():``
    """SIGINT, SIGTERM and SIGHUP as exceptions in the main thread for the duration (elsewhere: nothing
    changes, as only the main thread may set handlers). A signal a parent process ignores (SIGINT in a shell's
    background job, SIGHUP under ``nohup``) stays ignored."""

    def __enter__(self) -> None:
        global _received, _pending
        import sys

        self.previous: dict[Any, Any] = {}
        self.hook = None
        if threading.current_thread() is not threading.main_thread():
            return
        for sig in SIGNALS:
            if signal.getsignal(sig) is not signal.SIG_IGN:
                self.previous[sig] = signal.signal(sig, _on_signal)
        _received, _pending = None, False
        self.hook = sys.unraisablehook
        sys.unraisablehook = _unraisable(self.hook)

    def __exit__(self, *exc: object) -> None:
        import sys

        for sig, handler in self.previous.items():
            signal.signal(sig, handler)
        if self.hook is not None:
            sys.unraisablehook = self.hook


def _unraisable(previous: Any) -> Any:
    """A hook for exceptions Python cannot raise (in a finaliser, ``__del__``, a weak reference's callback)
    that does not let the exception of a signal end there, printed and forgotten: the signal is raised again
    a moment later, in the run itself."""
    def hook(unraisable: Any) -> None:
        if isinstance(unraisable.exc_value, KeyboardInterrupt):
            exc = unraisable.exc_value
            _deliver_later(exc.signum if isinstance(exc, Terminated) else signal.SIGINT)
            return
        previous(unraisable)

    return hook

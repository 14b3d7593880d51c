"""Work on blocks in a few threads at once: NumPy and zlib let go of the GIL in their loops, so the
head statistics' blocks, a mosaic's panels and a PNG's pieces use the cores this process may run on.
Standard library only."""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any


def cores() -> int:
    """The cores this process may run on (a Slurm or container CPU set, not the machine's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


#: threads that work at once (each holds one block: a few MiB)
THREADS = max(1, min(4, cores()))


def in_threads(work: Callable[[Any], Any], items: Iterable[Any], threads: int | None = None) -> Iterator[Any]:
    """``work(item)`` for each of ``items``, in order, ``threads`` (default THREADS) at a time: at most that
    many items are in hand, and the results come in the order of the items (added up in that order, sums
    are the same to the last bit as one at a time)."""
    items = iter(items)
    first = next(items, None)
    if first is None:
        return
    second = next(items, None)
    threads = THREADS if threads is None else max(1, threads)
    if second is None or threads == 1:  # one item (a small file) or one core: no threads
        yield work(first)
        if second is not None:
            yield work(second)
            for item in items:
                yield work(item)
        return
    from collections import deque
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(threads, thread_name_prefix="attnviz-blocks") as pool:
        pending = deque([pool.submit(work, first), pool.submit(work, second)])
        for item in items:
            if len(pending) >= threads:
                yield pending.popleft().result()
            pending.append(pool.submit(work, item))
        while pending:
            yield pending.popleft().result()


#: seconds a thread runs Python before another that waits for the GIL gets it, while ``quick_switching``
#: is in force (Python's default is 0.005). Measured on the BERT-base grid (the head pass beside the
#: picture, 2 cores): 5 ms 0.22 s, 1 ms 0.22 s, 0.2 ms 0.21 s, 50 us 0.205 s, 20 us and less 0.20 s.
QUICK_SWITCH = 0.00002


class quick_switching:  # noqa: N801 - used as a function: ``with quick_switching():``
    """Python code in one thread (drawing a figure) beside NumPy work in another (the head pass): the
    NumPy thread lets go of the GIL for each operation and must get it back to start the next, which
    takes up to the switch interval while the other thread runs Python. A shorter interval for the
    time the two run side by side keeps the NumPy thread's core busy (the head pass of the BERT-base
    grid waited 40 ms for the GIL, now 20 ms: ``benchmarks/grid.py``). Nested and concurrent uses
    (``batch --jobs``) share it: the interval is put back when the last one ends."""

    _lock = threading.Lock()
    _depth = 0
    _saved = 0.0

    def __enter__(self) -> None:
        cls = quick_switching
        with cls._lock:
            if cls._depth == 0:
                cls._saved = sys.getswitchinterval()
                sys.setswitchinterval(min(QUICK_SWITCH, cls._saved))
            cls._depth += 1

    def __exit__(self, *exc: object) -> None:
        cls = quick_switching
        with cls._lock:
            cls._depth -= 1
            if cls._depth == 0:
                sys.setswitchinterval(cls._saved)

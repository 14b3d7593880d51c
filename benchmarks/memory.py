"""This process's resident memory (Linux's /proc), for the benchmarks that measure what a run adds to it: the
size now, and the peak since the last ``reset_peak``."""

from __future__ import annotations

import os


def rss_peak() -> int:
    """The peak resident size since the last ``reset_peak`` (Linux's VmHWM), in bytes."""
    with open("/proc/self/status") as fh:
        return next(int(line.split()[1]) * 1024 for line in fh if line.startswith("VmHWM:"))


def reset_peak() -> None:
    """Start the peak (``rss_peak``) from the resident size now."""
    with open("/proc/self/clear_refs", "w") as fh:
        fh.write("5")


def rss_now() -> int:
    """The resident size now, in bytes."""
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

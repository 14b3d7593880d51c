"""Running the console script in a real pseudo-terminal: stdout and stderr both on it, as a user sees them."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.conftest import ROOT


def run_in_terminal(args: list[str], width: int = 80, height: int = 40, timeout: float = 120,
                    **env: str) -> tuple[int, str]:
    """(exit code, what the terminal received) of ``python -m attnviz ARGS`` in a ``width`` x ``height``
    pseudo-terminal (``COLUMNS`` and ``LINES`` unset, no warm worker)."""
    import fcntl
    import pty
    import struct
    import termios

    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", height, width, 0, 0))
    environ = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES") and not k.startswith("ATTNVIZ_")}
    environ.update(PYTHONPATH=str(ROOT), ATTNVIZ_NO_SERVER="1", TERM="xterm-256color", **env)
    proc = subprocess.Popen([sys.executable, "-m", "attnviz", *map(str, args)], stdin=subprocess.DEVNULL,
                            stdout=slave, stderr=slave, env=environ)
    os.close(slave)
    chunks = []
    while True:
        try:
            data = os.read(master, 65536)
        except OSError:  # the other end closed
            break
        if not data:
            break
        chunks.append(data)
    os.close(master)
    return proc.wait(timeout=timeout), b"".join(chunks).decode("utf-8", "replace")

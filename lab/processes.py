"""The lab's long-running processes (API server, agents): started in a namespace, watched, stopped.

Processes outlive the Python that started them (`lab up` returns, later commands stop them),
so liveness is read from /proc by pid rather than from a Popen; children this Python did
start are also reaped, so none lingers as a zombie.
"""
from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time

from netagent.kernel import namespaces


def process_alive(pid: int | None) -> bool:
    """Whether `pid` runs (a zombie does not)."""
    if not pid:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def tail(path: str, lines: int = 40) -> str:
    """The last lines of a log, for error messages."""
    with contextlib.suppress(OSError), open(path, errors="replace") as f:
        return "".join(f.readlines()[-lines:])
    return f"(no log at {path})"


class Processes:
    """Starts programs inside a namespace with their output in a log; stops them by pid."""

    def __init__(self, *, cwd: str) -> None:
        self.cwd = cwd
        self._children: dict[int, subprocess.Popen] = {}  # processes this Python started

    def spawn(self, netns: str | None, argv: list, log_path: str, *, pass_fds: tuple[int, ...] = ()) -> int:
        """Start `argv` in `netns` (None: this one); `pass_fds` stay open in it (a socket opened here, say)."""
        os.makedirs(os.path.dirname(log_path), exist_ok=True)
        with open(log_path, "ab") as log:
            proc = subprocess.Popen([*namespaces.exec_prefix(netns), *argv], stdout=log, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, cwd=self.cwd, start_new_session=True,
                                    pass_fds=pass_fds)
        self._children[proc.pid] = proc
        return proc.pid

    def kill(self, pid: int | None, *, sig: int = signal.SIGTERM, timeout: float = 10.0) -> None:
        """`sig`, then SIGKILL after `timeout` seconds; quiet when the process is gone."""
        if pid is None or not process_alive(pid):
            self._reap(pid)
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
        deadline = time.monotonic() + timeout
        while process_alive(pid) and time.monotonic() < deadline:
            self._reap(pid)
            time.sleep(0.02)
        if process_alive(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            time.sleep(0.05)
        self._reap(pid)

    def _reap(self, pid: int | None) -> None:
        proc = self._children.get(pid) if pid is not None else None
        if proc is not None and pid is not None and proc.poll() is not None:
            del self._children[pid]

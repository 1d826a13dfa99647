"""`FakeTcNetlink` and `FakeLinkWatch`: the tc path's kernel (ebpf/tc.py, ebpf/pod_veths.py) in memory.

Devices come and go with fresh ifindexes (a re-made name is a new device, as in the kernel);
a device's clsact qdisc and filters go with it. It refuses what the kernel refuses: a device
that is not there (ENODEV), a filter on a device without clsact (EINVAL), deleting a filter that
is not there (ENOENT). `fail(method, error)` makes the next call of `method` raise `error`.
`FakeLinkWatch` is the link notifications: `notify()` what `add_link`/`remove_link` would send.
"""
from __future__ import annotations

import errno
import os
import threading
from collections import deque

from ebpf.pod_veths import LinkWatch
from ebpf.tc import PRIORITY, TcFilter, TcNetlink


def _refused(code: int, what: str) -> OSError:
    return OSError(code, f"{os.strerror(code)}: {what}")


class FakeTcNetlink(TcNetlink):
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._next_index = 1
        self.devices: dict[int, str] = {}
        self.clsact: set[int] = set()
        self.bpf: dict[tuple[int, int], dict[tuple[int, int], tuple[TcFilter, int]]] = {}  # (index, parent) ->
        self._faults: dict[str, deque[Exception]] = {}
        self.calls: list[str] = []

    # ---- the test's side
    def add_link(self, name: str) -> int:
        with self._lock:
            if name in self.devices.values():
                raise _refused(errno.EEXIST, name)
            index, self._next_index = self._next_index, self._next_index + 1
            self.devices[index] = name
            return index

    def remove_link(self, name: str) -> None:
        with self._lock:
            index = next(i for i, n in self.devices.items() if n == name)
            del self.devices[index]
            self.clsact.discard(index)
            for key in [key for key in self.bpf if key[0] == index]:
                del self.bpf[key]

    def fail(self, method: str, error: Exception) -> None:
        with self._lock:
            self._faults.setdefault(method, deque()).append(error)

    def programs_on(self, name: str) -> dict[int, str]:
        """parent -> program name of the filters on the device `name`."""
        with self._lock:
            index = next((i for i, n in self.devices.items() if n == name), None)
            return {parent: entry.name or "" for (i, parent), entries in self.bpf.items() if i == index
                    for entry, _ in entries.values()}

    # ---- TcNetlink
    def _call(self, method: str) -> None:
        self.calls.append(method)
        queued = self._faults.get(method)
        if queued:
            raise queued.popleft()

    def _device(self, index: int) -> None:
        if index not in self.devices:
            raise _refused(errno.ENODEV, f"ifindex {index}")

    def links(self) -> dict[int, str]:
        with self._lock:
            self._call("links")
            return dict(self.devices)

    def link_index(self, name: str) -> int | None:
        with self._lock:
            self._call("link_index")
            return next((i for i, n in self.devices.items() if n == name), None)

    def ensure_clsact(self, index: int) -> None:
        with self._lock:
            self._call("ensure_clsact")
            self._device(index)
            self.clsact.add(index)

    def replace_bpf_filter(self, index: int, *, parent: int, name: str, fd: int) -> None:
        with self._lock:
            self._call("replace_bpf_filter")
            self._device(index)
            if index not in self.clsact:
                raise _refused(errno.EINVAL, f"no clsact qdisc on ifindex {index}")
            entry = TcFilter(kind="bpf", name=name, handle=1, prio=PRIORITY, protocol=0x0003)
            self.bpf.setdefault((index, parent), {})[(PRIORITY, 1)] = (entry, fd)

    def filters(self, index: int, *, parent: int) -> list[TcFilter]:
        with self._lock:
            self._call("filters")
            if index not in self.clsact:
                return []
            return [entry for entry, _ in self.bpf.get((index, parent), {}).values()]

    def delete_filter(self, index: int, *, parent: int, entry: TcFilter) -> None:
        with self._lock:
            self._call("delete_filter")
            found = self.bpf.get((index, parent), {})
            if found.pop((entry.prio, entry.handle), None) is None:
                raise _refused(errno.ENOENT, f"filter {entry.name} on ifindex {index}")


class FakeLinkWatch(LinkWatch):
    """Link notifications a test sends with `notify()`; `closed` once the attacher is done."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._pending = 0
        self.closed = False

    def notify(self, count: int = 1) -> None:
        with self._cond:
            self._pending += count
            self._cond.notify_all()

    def wait(self, timeout: float) -> bool:
        with self._cond:
            if not self._pending:
                self._cond.wait(timeout)
            got, self._pending = self._pending > 0, 0
            return got

    def close(self) -> None:
        with self._cond:
            self.closed = True
            self._cond.notify_all()

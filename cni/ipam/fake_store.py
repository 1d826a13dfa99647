"""`FakeStore`: the reservation store in memory, with fault injection, for unit tests.

Faults: `writable = False` refuses every write, names in `unreleasable` fail to be released,
and `fail_on("reserve" | "release" | "set_last_reserved", nth=...)` fails the nth call of one
write from now (once), having done nothing, as a failed create, unlink or write does.
`writes` lists every write attempted, in order, so a test can fail each one in turn.
"""
from __future__ import annotations

import threading

from cni.errors import CniError, ErrorCode
from cni.ipam.store import LAST_RESERVED_PREFIX, LOCK_NAME, ReservationStore


class _ThreadLockHeld:
    def __init__(self, lock: threading.Lock) -> None:
        self._lock = lock

    def __enter__(self) -> None:
        self._lock.acquire()

    def __exit__(self, *exc_info) -> None:
        self._lock.release()


class FakeStore(ReservationStore):
    """In-memory store with DiskStore's interface, for unit tests.

    `files` maps reservation names to their content, `last` maps set indexes to the
    last reserved address. Fault injection: `writable = False` makes the store refuse
    every write (as a read-only data directory would), and names in `unreleasable` fail
    to be released.
    """

    def __init__(self) -> None:
        self.files: dict = {}
        self.last: dict = {}
        self.created = False
        self.writable = True
        self.unreleasable: set = set()
        self.writes: list[str] = []
        self._faults: list[list] = []  # [operation, countdown]
        self._lock = threading.Lock()

    def fail_on(self, operation: str, *, nth: int = 1) -> None:
        """Make the `nth` call of the write `operation` from now fail with code 5."""
        self._faults.append([operation, nth])

    def _write(self, operation: str, name: str) -> None:
        self.writes.append(operation)
        for fault in list(self._faults):
            if fault[0] == operation:
                fault[1] -= 1
                if fault[1] == 0:
                    self._faults.remove(fault)
                    raise CniError(ErrorCode.IO_FAILURE, f"cannot {operation} {name}", "injected (fake)")

    def _require_writable(self, name: str) -> None:
        if not self.writable:
            raise CniError(ErrorCode.IO_FAILURE, f"cannot write {name}", "read-only (fake)")

    def exists(self) -> bool:
        return self.created or bool(self.files) or bool(self.last)

    def ensure_writable(self) -> None:
        self._require_writable(LOCK_NAME)
        self.created = True

    def locked(self) -> _ThreadLockHeld:
        self.created = True
        return _ThreadLockHeld(self._lock)

    def names(self) -> list:
        return list(self.files)

    def read_owner(self, name: str) -> str | None:
        content = self.files.get(name)
        return None if content is None else content.strip()

    def read_owners(self, names) -> dict:
        return {name: self.files[name].strip() for name in names if name in self.files}

    def reserve(self, name: str, *, owner: str) -> bool:
        self._require_writable(name)
        self._write("reserve", name)
        if name in self.files:
            return False
        self.files[name] = owner
        return True

    def release(self, name: str) -> bool:
        self._write("release", name)
        if name in self.unreleasable:
            raise CniError(ErrorCode.IO_FAILURE, f"cannot remove {name}", "injected (fake)")
        return self.files.pop(name, None) is not None

    def last_reserved(self, set_index: int) -> str | None:
        return self.last.get(set_index)

    def set_last_reserved(self, set_index: int, address: str) -> None:
        self._require_writable(f"{LAST_RESERVED_PREFIX}{set_index}")
        self._write("set_last_reserved", f"{LAST_RESERVED_PREFIX}{set_index}")
        self.last[set_index] = address

"""`FakeStore`: the reservation store in memory, with fault injection, for unit tests."""
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
        self._lock = threading.Lock()

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
        if name in self.files:
            return False
        self.files[name] = owner
        return True

    def release(self, name: str) -> bool:
        if name in self.unreleasable:
            raise CniError(ErrorCode.IO_FAILURE, f"cannot remove {name}", "injected (fake)")
        return self.files.pop(name, None) is not None

    def last_reserved(self, set_index: int) -> str | None:
        return self.last.get(set_index)

    def set_last_reserved(self, set_index: int, address: str) -> None:
        self._require_writable(f"{LAST_RESERVED_PREFIX}{set_index}")
        self.last[set_index] = address

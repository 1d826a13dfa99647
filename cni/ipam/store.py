"""Where IP reservations live: the `ReservationStore` seam and `DiskStore` (host-local's layout);
`FakeStore` (memory, fake_store.py) stands beside it for unit tests.

The on-disk layout is host-local's, byte for byte, so host-local and netagent can share a
data directory (and a node can switch between them) without losing a reservation:

    <dataDir>/<network>/            created 0755 on demand
        10.244.1.5                  "containerID\\r\\nifname", created with O_CREAT|O_EXCL
        fd00::5                     (older host-local wrote only "containerID")
        last_reserved_ip.0          the last address handed out from range set 0, no newline
        lock                        flock(LOCK_EX) held around every allocate/release/GC

The store is deliberately dumb: it lists, reads, creates and removes files by name and
knows nothing about ranges. The allocator holds `locked()` around a whole operation,
lists the directory once and works from that listing, so a /16 costs one `getdents`
pass rather than 65k `stat`s. The lock file is opened per operation, so the flock
excludes other threads of this process as well as other processes (host-local included).

Both stores raise `CniError` code 5 for I/O failures; a file that vanished is not one.
Standard library only: the standalone IPAM binary imports this module.
"""
from __future__ import annotations

import abc
import fcntl
import os
from collections.abc import Iterable
from contextlib import AbstractContextManager

from cni.errors import CniError, ErrorCode

LOCK_NAME = "lock"
LAST_RESERVED_PREFIX = "last_reserved_ip."
LINE_BREAK = "\r\n"
_READ_CHUNK = 4096


def owner_text(container_id: str, ifname: str) -> str:
    """What a reservation file holds for (container_id, ifname), as host-local writes it."""
    return container_id.strip() + LINE_BREAK + ifname


def is_bookkeeping(name: str) -> bool:
    """The lock and round-robin files: never reservations, never released or collected."""
    return name == LOCK_NAME or name.startswith(LAST_RESERVED_PREFIX)


def _io_error(action: str, path: str, *, exc: OSError) -> CniError:
    return CniError(ErrorCode.IO_FAILURE, f"cannot {action} {path}", exc.strerror or str(exc))


def _remove_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def _read_small_file(name: str, *, dir_fd: int | None = None) -> str | None:
    """Trimmed content of a reservation-sized file; usually one open, one read, one close."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW, dir_fd=dir_fd)
    except OSError:
        return None
    try:
        chunks = [os.read(fd, _READ_CHUNK)]
        while len(chunks[-1]) == _READ_CHUNK:  # a short read of a regular file means EOF
            chunks.append(os.read(fd, _READ_CHUNK))
    except OSError:
        return None
    finally:
        os.close(fd)
    return b"".join(chunks).decode("utf-8", errors="replace").strip()


class _FlockHeld:
    """Context manager: an exclusive flock on a freshly opened lock file."""

    def __init__(self, store: DiskStore) -> None:
        self._store = store
        self._fd = -1

    def __enter__(self) -> None:
        self._fd = self._store.open_lock_file()
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX)
        except OSError as exc:
            os.close(self._fd)
            raise _io_error("lock", self._store.lock_path, exc=exc) from None

    def __exit__(self, *exc_info) -> None:
        os.close(self._fd)  # closing the only descriptor releases the flock


class ReservationStore(abc.ABC):
    """What the allocator needs of a store: named reservations, their owners, a lock."""

    @abc.abstractmethod
    def exists(self) -> bool:
        """Whether the network's store was ever created (nothing to release otherwise)."""

    @abc.abstractmethod
    def ensure_writable(self) -> None:
        """Raise code 5 unless reservations could be created right now."""

    @abc.abstractmethod
    def locked(self) -> AbstractContextManager[None]:
        """Held around a whole allocate, release or GC."""

    @abc.abstractmethod
    def names(self) -> list:
        """Names that may be reservations (bookkeeping included; see `is_bookkeeping`)."""

    @abc.abstractmethod
    def read_owner(self, name: str) -> str | None:
        """The owner text of one reservation; None when it does not exist."""

    @abc.abstractmethod
    def read_owners(self, names: Iterable[str]) -> dict:
        """Owner text by name for those of `names` that exist."""

    @abc.abstractmethod
    def reserve(self, name: str, *, owner: str) -> bool:
        """Create the reservation; False when it already exists."""

    @abc.abstractmethod
    def release(self, name: str) -> bool:
        """Remove the reservation; False when there was none."""

    @abc.abstractmethod
    def last_reserved(self, set_index: int) -> str | None:
        """The last address handed out from range set `set_index`."""

    @abc.abstractmethod
    def set_last_reserved(self, set_index: int, address: str) -> None:
        """Remember the last address handed out from range set `set_index`."""


class DiskStore(ReservationStore):
    """Reservations as files in one network's directory (host-local compatible)."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self.lock_path = os.path.join(directory, LOCK_NAME)

    def _path(self, name: str) -> str:
        return os.path.join(self.directory, name)

    def exists(self) -> bool:
        return os.path.isdir(self.directory)

    def open_lock_file(self) -> int:
        """Open (creating the directory and the file if needed) the lock file."""
        flags = os.O_RDWR | os.O_CREAT | os.O_CLOEXEC
        try:
            return os.open(self.lock_path, flags, 0o644)
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise _io_error("open", self.lock_path, exc=exc) from None
        try:
            os.makedirs(self.directory, mode=0o755, exist_ok=True)
            return os.open(self.lock_path, flags, 0o644)
        except OSError as exc:
            raise _io_error("create", self.directory, exc=exc) from None

    def ensure_writable(self) -> None:
        """Raise code 5 unless reservations could be created here right now."""
        os.close(self.open_lock_file())
        if not os.access(self.directory, os.W_OK | os.X_OK):
            raise CniError(ErrorCode.IO_FAILURE, f"{self.directory} is not writable")

    def locked(self) -> _FlockHeld:
        return _FlockHeld(self)

    def names(self) -> list:
        """Names of the regular files that may be reservations (one directory listing)."""
        try:
            with os.scandir(self.directory) as entries:
                return [e.name for e in entries if not is_bookkeeping(e.name) and e.is_file()]
        except FileNotFoundError:
            return []
        except OSError as exc:
            raise _io_error("list", self.directory, exc=exc) from None

    def read_owner(self, name: str) -> str | None:
        """The file's trimmed content, or None when it vanished or cannot be read."""
        return _read_small_file(self._path(name))

    def read_owners(self, names) -> dict:
        """name -> trimmed content for each readable file; opened relative to one dir fd."""
        try:
            dir_fd = os.open(self.directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError:
            return {}
        try:
            owners = {}
            for name in names:
                content = _read_small_file(name, dir_fd=dir_fd)
                if content is not None:
                    owners[name] = content
            return owners
        finally:
            os.close(dir_fd)

    def reserve(self, name: str, *, owner: str) -> bool:
        """Create the reservation file; False when it already exists (taken)."""
        path = self._path(name)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        except FileExistsError:
            return False
        except OSError as exc:
            raise _io_error("create", path, exc=exc) from None
        try:
            os.write(fd, owner.encode())
        except OSError as exc:
            os.close(fd)
            _remove_quietly(path)
            raise _io_error("write", path, exc=exc) from None
        os.close(fd)
        return True

    def release(self, name: str) -> bool:
        """Remove a reservation; False when it was already gone."""
        try:
            os.unlink(self._path(name))
        except FileNotFoundError:
            return False
        except OSError as exc:
            raise _io_error("remove", self._path(name), exc=exc) from None
        return True

    def last_reserved(self, set_index: int) -> str | None:
        content = self.read_owner(f"{LAST_RESERVED_PREFIX}{set_index}")
        return content or None

    def set_last_reserved(self, set_index: int, address: str) -> None:
        path = self._path(f"{LAST_RESERVED_PREFIX}{set_index}")
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
            try:
                os.write(fd, address.encode())
            finally:
                os.close(fd)
        except OSError as exc:
            raise _io_error("write", path, exc=exc) from None

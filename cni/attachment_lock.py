"""One CNI operation at a time per attachment (network, container ID, ifname), on every path.

A crash-looping kubelet can send DEL while the ADD of the same container is still running.
Without an order between them, DEL can remove the veth and release the address half-way
through the ADD, which then reports success with an address free for the next pod. So ADD,
DEL (and the agent's deferred DEL) and CHECK of one attachment hold an exclusive flock on a
file named after the attachment's host veth:

    <ipam dataDir, else /var/lib/cni/networks>/.netagent-attachments/<host veth name>.lock

The agent's workers and an in-process plugin (the Python client without an agent, the lab)
derive the same path from the same config, so they exclude each other as well as
themselves: flock excludes descriptors, and each holder opens its own. A process killed
while holding it releases it with its descriptors. A DEL removes the file while holding it;
whoever was waiting on the removed file notices (its inode is no longer the path's) and
opens the new one. The wait is bounded: past `timeout` the answer is code 11, a condition
that clears.
"""
from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import time
from collections.abc import Iterator

from cni.config import NetConf
from cni.errors import CniError, ErrorCode
from cni.ipam.config import DEFAULT_DATA_DIR

LOCK_DIR_NAME = ".netagent-attachments"  # not a network name: those start with a letter or digit
LOCK_TIMEOUT = 60.0
_POLL = (0.001, 0.05)  # first and longest sleep between tries


def lock_path(conf: NetConf, host_name: str) -> str:
    data_dir = conf.ipam.get("dataDir")
    if not (isinstance(data_dir, str) and os.path.isabs(data_dir) and "\0" not in data_dir):
        data_dir = DEFAULT_DATA_DIR
    return os.path.join(data_dir, LOCK_DIR_NAME, host_name + ".lock")


class AttachmentLock:
    """A held lock; `remove()` deletes its file (DEL: the attachment is gone)."""

    def __init__(self, path: str, fd: int) -> None:
        self.path = path
        self.fd = fd

    def remove(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)


def _open(path: str) -> int:
    flags = os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW
    try:
        return os.open(path, flags, 0o600)
    except FileNotFoundError:
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        return os.open(path, flags, 0o600)


def _is_current(path: str, fd: int) -> bool:
    try:
        return os.stat(path, follow_symlinks=False).st_ino == os.fstat(fd).st_ino
    except FileNotFoundError:
        return False


@contextlib.contextmanager
def held(path: str, *, timeout: float = LOCK_TIMEOUT) -> Iterator[AttachmentLock]:
    """Hold the attachment's lock for the block; CniError 11 after `timeout` seconds of waiting."""
    deadline = time.monotonic() + timeout
    pause = _POLL[0]
    while True:
        try:
            fd = _open(path)
        except OSError as exc:
            raise CniError(ErrorCode.IO_FAILURE, f"cannot open the attachment lock {path}",
                           exc.strerror or str(exc)) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise CniError(ErrorCode.IO_FAILURE, f"cannot lock {path}", exc.strerror or str(exc)) from None
            if time.monotonic() >= deadline:
                raise CniError(ErrorCode.TRY_AGAIN_LATER, "another CNI operation on this attachment is still "
                               "running", f"waited {timeout:.0f} s for {path}") from None
            time.sleep(pause)
            pause = min(pause * 2, _POLL[1])
            continue
        if _is_current(path, fd):
            break
        os.close(fd)  # removed by a DEL while we waited: take the new file
    try:
        yield AttachmentLock(path, fd)
    finally:
        os.close(fd)


def try_remove_stale(path: str) -> bool:
    """Remove a lock file nobody holds (GC of attachments that are gone); False if held."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return False
    try:
        if _is_current(path, fd):
            os.unlink(path)
            return True
        return False
    finally:
        os.close(fd)

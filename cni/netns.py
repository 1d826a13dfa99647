"""Network-namespace entry for one thread at a time, and warm netlink sockets.

A netlink socket belongs to the namespace it was created in, and `setns(2)` moves only the
calling thread. So the agent's worker threads keep one warm socket for the node's own
namespace and, per request, briefly enter the pod's namespace to create a socket there
(about 0.8 ms, against about 9 ms for pyroute2's own process-based netns mode). The
thread always returns to its home namespace before doing anything else.
"""
from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import threading

from pyroute2 import IPRoute

from cni.errors import CniError, ErrorCode
from cni.rtnl import Rtnl

CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)
_local = threading.local()


def _setns(fd: int) -> None:
    if _libc.setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


def open_netns(path: str) -> int:
    """Open a netns file; a missing one is 'container unknown' (code 3)."""
    try:
        return os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        raise CniError(ErrorCode.CONTAINER_UNKNOWN, f"network namespace {path} does not exist") from None
    except OSError as exc:
        raise CniError(ErrorCode.INVALID_ENVIRONMENT, f"cannot open network namespace {path}",
                       exc.strerror or str(exc)) from None


@contextlib.contextmanager
def entered(netns_fd: int):
    """Run the block with this thread inside the namespace `netns_fd`."""
    home = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    try:
        try:
            _setns(netns_fd)
        except OSError as exc:
            code = ErrorCode.INVALID_ENVIRONMENT if exc.errno == errno.EINVAL else ErrorCode.INTERNAL
            raise CniError(code, "CNI_NETNS is not a network namespace" if exc.errno == errno.EINVAL
                           else "cannot enter the network namespace", str(exc)) from None
        try:
            yield
        finally:
            _setns(home)  # if this fails the thread is unusable: let it raise
    finally:
        os.close(home)


def netlink_in(netns_fd: int) -> IPRoute:
    """A new netlink socket bound to the namespace `netns_fd`; the caller closes it."""
    with entered(netns_fd):
        return IPRoute()


def rtnl_in(netns_fd: int) -> Rtnl:
    """A new hot-path socket (`cni.rtnl`) bound to the namespace `netns_fd`."""
    with entered(netns_fd):
        return Rtnl()


def host_netlink() -> IPRoute:
    """This thread's warm pyroute2 socket in its home namespace (slow paths)."""
    ipr = getattr(_local, "ipr", None)
    if ipr is None:
        ipr = _local.ipr = IPRoute()
    return ipr


def host_rtnl() -> Rtnl:
    """This thread's warm hot-path socket in its home namespace."""
    rtnl = getattr(_local, "rtnl", None)
    if rtnl is None:
        rtnl = _local.rtnl = Rtnl()
    return rtnl


def drop_host_netlink() -> None:
    """Forget this thread's warm sockets (after an error that may have broken them)."""
    for attr in ("ipr", "rtnl"):
        sock = getattr(_local, attr, None)
        setattr(_local, attr, None)
        if sock is not None:
            with contextlib.suppress(Exception):
                sock.close()

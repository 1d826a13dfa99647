"""Network namespaces: named ones for the lab, the tests and the benchmarks, and a thread's
brief visit to another one.

Everything netagent builds for demonstration or testing lives in namespaces created here
(named with a caller's prefix and a random suffix, so parallel runs never collide) and is
removed by the same code, also on failure. Nothing here touches the root namespace.

`entered(fd)` is the one `setns(2)` of the project: a netlink socket belongs to the namespace
it was created in and `setns` moves only the calling thread, so the CNI server and the
routing kernel step one thread in, open or use a socket, and step back before anything else.
"""
from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import secrets
import subprocess
from collections.abc import Callable, Iterator
from typing import TypeVar

T = TypeVar("T")

NETNS_DIR = "/var/run/netns"
THREAD_NETNS = "/proc/thread-self/ns/net"
CLONE_NEWNET = 0x40000000   # setns(2)'s nstype and NS_GET_NSTYPE's answer (cni/netns.py) for a netns
_libc = ctypes.CDLL(None, use_errno=True)


def setns(fd: int) -> None:
    """Move the calling thread into the network namespace open at `fd`; OSError on failure."""
    if _libc.setns(fd, CLONE_NEWNET) != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code))


def identity(path_or_fd: str | int) -> tuple[int, int]:
    """(device, inode): equal for two handles on the same namespace."""
    found = os.stat(path_or_fd)
    return found.st_dev, found.st_ino


@contextlib.contextmanager
def entered(netns_fd: int) -> Iterator[None]:
    """Run the block with this thread inside the namespace `netns_fd`, then return it home.

    Entering fails with OSError (EINVAL: `netns_fd` is not a network namespace); leaving
    cannot fail short of a broken thread, and then it raises, since the thread is unusable.
    """
    home = os.open(THREAD_NETNS, os.O_RDONLY | os.O_CLOEXEC)
    try:
        setns(netns_fd)
        try:
            yield
        finally:
            setns(home)
    finally:
        os.close(home)


def made_in(name: str | None, make: Callable[[], T]) -> T:
    """`make()` run inside the named namespace (under /run/netns), or where the thread is when
    `name` is None: a socket belongs to the namespace it is opened in, for life."""
    if name is None:
        return make()
    fd = os.open(netns_path(name), os.O_RDONLY | os.O_CLOEXEC)
    try:
        with entered(fd):
            return make()
    finally:
        os.close(fd)


def in_own_netns(method):
    """Decorate a method of a kernel object to run with the calling thread inside that object's
    network namespace (its `_netns_fd`, opened on `THREAD_NETNS` by the thread that made it, and
    `_netns_identity`, that fd's `identity`): pyroute2 sockets belong to the namespace they
    were opened in, so every netlink call of such an object enters it first, or runs at once
    when the thread is already there."""
    @functools.wraps(method)
    def run(self, *args, **kwargs):
        if identity(THREAD_NETNS) == self._netns_identity:
            return method(self, *args, **kwargs)
        with entered(self._netns_fd):
            return method(self, *args, **kwargs)
    return run


def unique_name(prefix: str) -> str:
    return f"{prefix}-{secrets.token_hex(3)}"


def netns_path(name: str) -> str:
    return os.path.join(NETNS_DIR, name)


def create(name: str) -> str:
    """Create a namespace with loopback up; return its path."""
    subprocess.run(["ip", "netns", "add", name], check=True, capture_output=True, text=True)
    try:
        run_in(name, ["ip", "link", "set", "lo", "up"], check=True)
    except BaseException:
        remove(name)
        raise
    return netns_path(name)


def remove(name: str) -> None:
    """Delete a namespace and everything inside it; quiet when it is already gone."""
    if os.path.exists(netns_path(name)):
        subprocess.run(["ip", "netns", "delete", name], capture_output=True)


def run_in(name: str, argv: list, *, check: bool = False, timeout: float = 30,
           input: bytes | str | None = None, env: dict | None = None) -> subprocess.CompletedProcess:
    text = not isinstance(input, bytes)
    return subprocess.run(["ip", "netns", "exec", name, *argv], capture_output=True, text=text,
                          check=check, timeout=timeout, input=input, env=env)


def exec_prefix(name: str | None) -> list[str]:
    """argv prefix that runs a program inside the namespace; none for None (the caller's own)."""
    return ["ip", "netns", "exec", name] if name else []

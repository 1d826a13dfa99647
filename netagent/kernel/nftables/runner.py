"""`Nft`: the seam through which the product reads and writes nf_tables, and `NftRunner`, its
real implementation over libnftables (the `python3-nftables` bindings) in-process.

Why in-process and text batches. A process per change (`nft -f`) costs an exec and a full
cache fetch each time; libnftables keeps no cache between `cmd()` calls either, so each call
re-reads what it needs: callers keep batches few and big (one transaction per sync). Text is
what the renderers write (multi-line: nft 1.0.6 refuses a chain body on one line) and every
string in it comes from `text.py`; reading back is JSON (`list table` with JSON output), the
shape `FakeNft` reproduces for what consumers rely on.

Elements alone (`apply_elements`, a `model.ElementWrite`): `NftRunner` encodes them as
netlink messages itself (netlink.py: libnftables' parsing of 130,000 elements cost 1.2-1.5 s
and 260 MiB of heap, the kernel's share 0.3 s), on a socket its worker thread opens, so in
the same namespace; what netlink.py does not encode goes as text. `FakeNft` takes the text.

One batch is one transaction: libnftables sends the whole text as one netlink batch, and the
kernel commits all of it or nothing. A failure raises `NftError` (a `KernelError`, code 0:
libnftables reports words, not an errno) with nft's own error text, and nothing changed.

Namespaces. A netlink socket belongs to the namespace of the thread that opens it, and
`setns(2)` moves one thread. So every `NftRunner` owns ONE worker thread: it enters the
runner's namespace first (`/run/netns/<name>`, or for `netns=None` the namespace of the thread
that built the runner), checks that it is there, creates the libnftables context, and then
serves every call in order. If entering fails the constructor raises: a runner meant for a
test namespace can never act on the root namespace, and no call runs anywhere but its own.
"""
from __future__ import annotations

import abc
import json
import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from netagent.kernel import namespaces
from netagent.kernel.heap import release_freed_heap
from netagent.kernel.errors import KernelError
from netagent.kernel.nftables.model import ElementWrite

FAMILIES = ("ip", "ip6", "inet", "arp", "bridge", "netdev")
_T = TypeVar("_T")


class NftError(KernelError):
    """nf_tables refused a batch or a read (nft's error text in `str()`), or libnftables
    cannot be used here; `code` is 0 (libnftables reports text, not an errno)."""

    def __init__(self, message: str) -> None:
        super().__init__(0, message)


class Nft(abc.ABC):
    """nf_tables as netagent uses it: text batches in, libnftables JSON objects out."""

    @abc.abstractmethod
    def apply(self, batch: str) -> None:
        """Run `batch` (nft commands, one per line) as ONE transaction; NftError (and nothing
        changed) when any command is refused."""

    native_elements = False   # apply_elements writes netlink itself (NftRunner), not text

    def apply_elements(self, write: ElementWrite) -> None:
        """Delete and add the elements `write` names, as ONE transaction; NftError (and nothing
        changed) when any is refused. This default writes `write.text()`; `NftRunner` encodes
        the netlink messages itself (netlink.py)."""
        batch = write.text()
        if batch:
            self.apply(batch)

    @abc.abstractmethod
    def list_table(self, family: str, name: str) -> list[dict[str, Any]] | None:
        """The table's objects as libnftables JSON (the `nftables` array without `metainfo`:
        `{"table": ...}`, `{"chain": ...}`, `{"rule": ...}`, `{"set": ...}`, `{"map": ...}`),
        or None when the table does not exist."""

    @abc.abstractmethod
    def tables(self) -> list[tuple[str, str]]:
        """(family, name) of every table in the namespace, ours and others'."""


def objects_of(listing: str) -> list[dict[str, Any]]:
    """The entries of a libnftables JSON answer, `metainfo` left out."""
    try:
        document = json.loads(listing) if listing.strip() else {"nftables": []}
        entries = document["nftables"]
    except (ValueError, KeyError, TypeError) as error:
        raise NftError(f"libnftables answered something that is not its JSON: {error}") from error
    return [entry for entry in entries if isinstance(entry, dict) and "metainfo" not in entry]


def tables_of(objects: list[dict[str, Any]]) -> list[tuple[str, str]]:
    return [(entry["table"]["family"], entry["table"]["name"]) for entry in objects if "table" in entry]


def check_family(family: str) -> str:
    if family not in FAMILIES:
        raise NftError(f"unknown nft family {family!r} (one of {', '.join(FAMILIES)})")
    return family


def _missing(error: str) -> bool:
    return "No such file or directory" in error


class NftRunner(Nft):
    """libnftables in-process, every call on one worker thread inside the runner's namespace.

    `netns`: a name under /run/netns, or None for the namespace of the constructing thread.
    Raises NftError when the bindings are missing or the namespace cannot be entered."""

    def __init__(self, netns: str | None = None) -> None:
        self.netns = netns
        path = namespaces.netns_path(netns) if netns else namespaces.THREAD_NETNS
        try:
            self._target_fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError as error:
            raise NftError(f"cannot open network namespace {path}: {error.strerror}") from error
        self._target = namespaces.identity(self._target_fd)
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"nft-{netns or 'self'}")
        self._context: Any = None
        self._netlink: Any = None     # netlink.NetlinkWriter, opened by the worker thread
        self._lock = threading.Lock()
        try:
            self._call(self._enter)
        except BaseException:
            self.close()
            raise

    # -- the worker thread
    def _enter(self) -> None:
        try:
            namespaces.setns(self._target_fd)
        except OSError as error:
            raise NftError(f"cannot enter network namespace {self.netns or 'of the caller'}: "
                           f"{error.strerror}") from error
        if namespaces.identity(namespaces.THREAD_NETNS) != self._target:
            raise NftError(f"the nft worker thread is not in namespace {self.netns}")
        try:
            import nftables  # type: ignore[import-not-found,import-untyped,unused-ignore]
        except ImportError as error:
            raise NftError(f"the libnftables Python bindings (python3-nftables) are missing: "
                           f"{error}") from error
        context = nftables.Nftables()
        context.set_json_output(True)
        context.set_handle_output(True)
        self._context = context

    def _cmd(self, text: str) -> tuple[int, str, str]:
        try:
            code, output, error = self._context.cmd(text)
        except UnicodeDecodeError as failure:
            raise NftError(f"libnftables answered bytes that are not UTF-8: {failure}") from failure
        return int(code), str(output or ""), str(error or "")

    def _call(self, work: Callable[[], _T]) -> _T:
        with self._lock:
            if self._pool is None:
                raise NftError("this nft runner is closed")
            future = self._pool.submit(work)
        return future.result()

    # -- the seam
    def apply(self, batch: str) -> None:
        def work() -> None:
            code, _output, error = self._cmd(batch)
            if len(batch) > LARGE_OUTPUT:
                release_freed_heap()
            if code != 0:
                raise NftError(f"nft refused the batch: {error.strip() or 'no reason given'}")
        self._call(work)

    native_elements = True

    def apply_elements(self, write: ElementWrite) -> None:
        from netagent.kernel.nftables import netlink
        if not len(write):
            return
        try:
            batch, acked = netlink.encode(write)
        except netlink.Unencodable:   # not a shape netlink.py encodes: the text, through libnftables
            super().apply_elements(write)
            return

        def work() -> None:
            if self._netlink is None:
                self._netlink = netlink.NetlinkWriter()   # on the worker thread: in our namespace
            self._netlink.send(batch, acked)
        self._call(work)

    def list_table(self, family: str, name: str) -> list[dict[str, Any]] | None:
        check_family(family)
        from netagent.kernel.nftables.text import name_for_listing
        command = f"list table {family} {name_for_listing(name)}"

        def work() -> list[dict[str, Any]] | None:
            code, output, error = self._cmd(command)
            if code != 0:
                if _missing(error):
                    return None
                raise NftError(f"nft could not list table {family} {name}: {error.strip()}")
            if len(output) > LARGE_OUTPUT:
                release_freed_heap()
            return objects_of(output)
        return self._call(work)

    def tables(self) -> list[tuple[str, str]]:
        def work() -> list[tuple[str, str]]:
            code, output, error = self._cmd("list tables")
            if code != 0:
                raise NftError(f"nft could not list tables: {error.strip()}")
            return tables_of(objects_of(output))
        return self._call(work)

    def close(self) -> None:
        with self._lock:
            pool, self._pool = self._pool, None  # type: ignore[assignment]
        if pool is not None:
            if self._netlink is not None:
                pool.submit(self._netlink.close)
            pool.shutdown(wait=True)
        if self._target_fd >= 0:
            os.close(self._target_fd)
            self._target_fd = -1

    def __enter__(self) -> NftRunner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


LARGE_OUTPUT = 1 << 20   # characters of a listing or batch after which libnftables' freed heap is returned (kernel/heap.py)


def nftables_usable(netns: str | None = None) -> tuple[bool, str]:
    """Can this process use nf_tables here: the bindings import and the kernel answers a
    read-only `list tables`. (True, "") or (False, the reason). Creates nothing."""
    try:
        runner = NftRunner(netns)
    except NftError as error:
        return False, str(error)
    try:
        runner.tables()
    except NftError as error:
        return False, str(error)
    finally:
        runner.close()
    return True, ""

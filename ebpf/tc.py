"""Attaching the tc programs (ebpf/nodeport.c) to a device's clsact qdisc, and finding ours.

`attach_tc` puts `na_tc_ingress` (`na_tc_from_pod` on pod host veths, ebpf/pod_veths.py)
on the device's ingress hook and `na_tc_egress` on its egress hook (direct action), creating
the clsact qdisc when missing and replacing filters of ours in place (same priority and
handle), so a restarted agent swaps the code without a gap.
The device must let a translated packet whose source is now a node address in
(`accept_local`: a NodePort packet SNATed for a remote backend, and its reply translated back,
both carry the node's address as their source); `TC_SYSCTLS` says so and the caller ensures it.
IPv6 needs no such sysctl (measured: tests/netns/test_ebpf_conntrack.py's IPv6 NodePort lab): the
same programs handle both families (ebpf/nodeport_progs.c dispatches by the packet's).
`detach_tc` removes our filters (by name) from every device of the namespace, never the
qdisc, which other software may share. Runs in the caller's network namespace.

The kernel is behind `TcNetlink` (links, the clsact qdisc, bpf filters), entered as a context
for a batch of requests: `NetlinkTc` over pyroute2's `IPRoute` (the only place here that
builds one), `FakeTcNetlink` (ebpf/fake_tc.py) in unit tests.
"""
from __future__ import annotations

import errno
import socket
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from netagent.kernel.owned import BPF_NAME_PREFIX
from netagent.kernel.sysctl import Sysctl

INGRESS, EGRESS = 0xFFFFFFF2, 0xFFFFFFF3
PRIORITY = 0xC0DE   # our filters' preference on both hooks
ETH_P_ALL = 0x0003


@dataclass(frozen=True)
class TcFilter:
    """One filter on a clsact hook, as the kernel lists it."""
    kind: str               # "bpf" for ours
    name: str | None        # the bpf program's name (TCA_BPF_NAME)
    handle: int
    prio: int
    protocol: int           # host order


class TcNetlink(ABC):
    """The netlink requests the tc path makes, in the caller's network namespace.

    Use it as a context (`with netlink as tc:`): the real one holds one netlink socket for the
    batch. Not for two threads at once."""

    def __enter__(self) -> TcNetlink:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    @abstractmethod
    def links(self) -> dict[int, str]:
        """Every device: ifindex -> name."""

    @abstractmethod
    def link_index(self, name: str) -> int | None:
        """The device's ifindex; None when there is no such device."""

    @abstractmethod
    def ensure_clsact(self, index: int) -> None:
        """The clsact qdisc on the device (there already, ours or shared: fine)."""

    @abstractmethod
    def replace_bpf_filter(self, index: int, *, parent: int, name: str, fd: int) -> None:
        """Our bpf filter `name` (program `fd`, direct action) at `PRIORITY`, handle 1, on a hook."""

    @abstractmethod
    def filters(self, index: int, *, parent: int) -> list[TcFilter]:
        """The filters on a hook of the device; [] when it has no clsact qdisc."""

    @abstractmethod
    def delete_filter(self, index: int, *, parent: int, entry: TcFilter) -> None:
        """Remove one filter `filters` listed."""


class NetlinkTc(TcNetlink):
    """`TcNetlink` over pyroute2's `IPRoute`: one socket per `with` block."""

    def __init__(self) -> None:
        self._ipr: Any = None

    def __enter__(self) -> NetlinkTc:
        from pyroute2 import IPRoute
        self._ipr = IPRoute()
        return self

    def __exit__(self, *exc: object) -> None:
        ipr, self._ipr = self._ipr, None
        if ipr is not None:
            ipr.close()

    @property
    def _socket(self) -> Any:
        if self._ipr is None:
            raise RuntimeError("NetlinkTc is used inside `with`")
        return self._ipr

    def links(self) -> dict[int, str]:
        return {link["index"]: link.get_attr("IFLA_IFNAME") for link in self._socket.get_links()}

    def link_index(self, name: str) -> int | None:
        found = self._socket.link_lookup(ifname=name)
        return found[0] if found else None

    def ensure_clsact(self, index: int) -> None:
        from pyroute2.netlink.exceptions import NetlinkError
        try:
            self._socket.tc("add", "clsact", index)
        except NetlinkError as error:
            if error.code != errno.EEXIST:   # the qdisc is there (ours or shared)
                raise

    def replace_bpf_filter(self, index: int, *, parent: int, name: str, fd: int) -> None:
        self._socket.tc("replace-filter", "bpf", index, handle=1, fd=fd, name=name, parent=parent,
                        prio=PRIORITY, classid=1, direct_action=True, protocol=ETH_P_ALL)

    def filters(self, index: int, *, parent: int) -> list[TcFilter]:
        from pyroute2.netlink.exceptions import NetlinkError
        try:
            entries = self._socket.get_filters(index=index, parent=parent)
        except NetlinkError:
            return []   # no clsact on this device
        found = []
        for entry in entries:
            options = entry.get_attr("TCA_OPTIONS")
            found.append(TcFilter(kind=entry.get_attr("TCA_KIND"),
                                  name=options.get_attr("TCA_BPF_NAME") if options else None,
                                  handle=entry["handle"], prio=entry["info"] >> 16,
                                  protocol=socket.ntohs(entry["info"] & 0xFFFF)))
        return found

    def delete_filter(self, index: int, *, parent: int, entry: TcFilter) -> None:
        self._socket.tc("del-filter", "bpf", index, handle=entry.handle, parent=parent, prio=entry.prio,
                        protocol=entry.protocol)


def tc_sysctls(device: str) -> list[Sysctl]:
    return [Sysctl(f"net.ipv4.conf.{device}.accept_local", "1",
                   "the tc path's translated packets carry a node address as their source")]


def _ours(tc: TcNetlink, index: int, parent: int) -> list[TcFilter]:
    return [entry for entry in tc.filters(index, parent=parent)
            if entry.kind == "bpf" and entry.name and entry.name.startswith(BPF_NAME_PREFIX)]


def attach_tc(device: str, fds: Mapping[str, int], *, ingress: str = "na_tc_ingress",
              netlink: TcNetlink | None = None) -> None:
    """`ingress` on the device's ingress hook (the underlay's, or `na_tc_from_pod` on a pod's
    host veth), `na_tc_egress` on its egress hook."""
    with netlink if netlink is not None else NetlinkTc() as tc:
        index = tc.link_index(device)
        if index is None:
            raise LookupError(f"no device {device} to attach the tc programs to")
        tc.ensure_clsact(index)
        for name, parent in ((ingress, INGRESS), ("na_tc_egress", EGRESS)):
            tc.replace_bpf_filter(index, parent=parent, name=name, fd=fds[name])


def detach_tc(*, netlink: TcNetlink | None = None) -> list[str]:
    """Remove every bpf filter of ours from every device's clsact hooks; what was removed."""
    removed = []
    with netlink if netlink is not None else NetlinkTc() as tc:
        for index, device in tc.links().items():
            for parent in (INGRESS, EGRESS):
                for entry in _ours(tc, index, parent):
                    tc.delete_filter(index, parent=parent, entry=entry)
                    removed.append(f"tc filter {entry.name} on {device}")
    return removed


def attached_tc(*, netlink: TcNetlink | None = None) -> list[tuple[str, str]]:
    """(device, program name) of every filter of ours in this namespace."""
    out = []
    with netlink if netlink is not None else NetlinkTc() as tc:
        for index, device in tc.links().items():
            for parent in (INGRESS, EGRESS):
                out += [(device, entry.name) for entry in _ours(tc, index, parent) if entry.name]
    return out

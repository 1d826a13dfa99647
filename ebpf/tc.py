"""Attaching the tc programs (ebpf/nodeport.c) to a device's clsact qdisc, and finding ours.

`attach_tc` puts `na_tc_ingress` (`na_tc_from_pod` on pod host veths, ebpf/pod_veths.py)
on the device's ingress hook and `na_tc_egress` on its egress hook (direct action), creating
the clsact qdisc when missing and replacing filters of ours in place (same priority and
handle), so a restarted agent swaps the code without a gap.
The device must let a translated packet whose source is now a node address in
(`accept_local`: a NodePort packet SNATed for a remote backend, and its reply translated back,
both carry the node's address as their source); `TC_SYSCTLS` says so and the caller ensures it.
`detach_tc` removes our filters (by name) from every device of the namespace, never the
qdisc, which other software may share. Runs in the caller's network namespace.
"""
from __future__ import annotations

import socket
from collections.abc import Mapping

from netagent.kernel.owned import BPF_NAME_PREFIX
from netagent.kernel.sysctl import Sysctl

INGRESS, EGRESS = 0xFFFFFFF2, 0xFFFFFFF3
PRIORITY = 0xC0DE   # our filters' preference on both hooks


def tc_sysctls(device: str) -> list[Sysctl]:
    return [Sysctl(f"net.ipv4.conf.{device}.accept_local", "1",
                   "the tc path's translated packets carry a node address as their source")]


def _ours(ipr, index: int, parent: int) -> list:
    found = []
    for entry in ipr.get_filters(index=index, parent=parent):
        options = entry.get_attr("TCA_OPTIONS")
        name = options.get_attr("TCA_BPF_NAME") if options else None
        if entry.get_attr("TCA_KIND") == "bpf" and name and name.startswith(BPF_NAME_PREFIX):
            found.append(entry)
    return found


def attach_tc(device: str, fds: Mapping[str, int], *, ingress: str = "na_tc_ingress") -> None:
    """`ingress` on the device's ingress hook (the underlay's, or `na_tc_from_pod` on a pod's
    host veth), `na_tc_egress` on its egress hook."""
    from pyroute2 import IPRoute
    from pyroute2.netlink.exceptions import NetlinkError
    with IPRoute() as ipr:
        found = ipr.link_lookup(ifname=device)
        if not found:
            raise LookupError(f"no device {device} to attach the tc programs to")
        index = found[0]
        try:
            ipr.tc("add", "clsact", index)
        except NetlinkError as error:
            if error.code != 17:   # EEXIST: the qdisc is there (ours or shared)
                raise
        for name, parent in ((ingress, INGRESS), ("na_tc_egress", EGRESS)):
            ipr.tc("replace-filter", "bpf", index, handle=1, fd=fds[name], name=name, parent=parent,
                   prio=PRIORITY, classid=1, direct_action=True, protocol=0x0003)


def detach_tc() -> list[str]:
    """Remove every bpf filter of ours from every device's clsact hooks; what was removed."""
    from pyroute2 import IPRoute
    from pyroute2.netlink.exceptions import NetlinkError
    removed = []
    with IPRoute() as ipr:
        for link in ipr.get_links():
            index, device = link["index"], link.get_attr("IFLA_IFNAME")
            for parent in (INGRESS, EGRESS):
                try:
                    ours = _ours(ipr, index, parent)
                except NetlinkError:
                    continue   # no clsact on this device
                for entry in ours:
                    ipr.tc("del-filter", "bpf", index, handle=entry["handle"], parent=parent,
                           prio=entry["info"] >> 16, protocol=socket.ntohs(entry["info"] & 0xFFFF))
                    name = entry.get_attr("TCA_OPTIONS").get_attr("TCA_BPF_NAME")
                    removed.append(f"tc filter {name} on {device}")
    return removed


def attached_tc() -> list[tuple[str, str]]:
    """(device, program name) of every filter of ours in this namespace."""
    from pyroute2 import IPRoute
    from pyroute2.netlink.exceptions import NetlinkError
    out = []
    with IPRoute() as ipr:
        for link in ipr.get_links():
            for parent in (INGRESS, EGRESS):
                try:
                    ours = _ours(ipr, link["index"], parent)
                except NetlinkError:
                    continue
                out += [(link.get_attr("IFLA_IFNAME"), e.get_attr("TCA_OPTIONS").get_attr("TCA_BPF_NAME"))
                        for e in ours]
    return out

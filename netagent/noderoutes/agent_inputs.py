"""What the node agent is given and reads before it routes: its settings (`AgentSettings`, parsed
from `netagent run`'s flags: `--cluster-cidr` once per IP family, `--service-cidr`), which Node
changes matter to it (`node_changes`), the checksum offload choice by kernel release, and this
node's own networks that no peer may claim (`own_networks`, every family; read again at every
sync, so an address added after start is refused to peers too) and the bounds they make
(`peer_bounds`).

Kept apart from `agent.py` (the start-up and the sync loop), which re-exports these names.
"""
from __future__ import annotations

import ipaddress
from collections.abc import Callable
from dataclasses import dataclass

from netagent.errors import NetagentError
from netagent.kernel import owned
from netagent.kernel.families import IpFamily
from netagent.kube.changes import ChangeRecorder
from netagent.noderoutes.host import ChecksumOffloadPolicy, Masquerade
from netagent.noderoutes.routing.model import ChecksumOffload, PeerBounds, RoutingSettings
from netagent.noderoutes.underlay import UnderlaySnapshot

DEFAULT_SERVICE_CIDRS = (ipaddress.ip_network("10.96.0.0/12"),)  # kubeadm's --service-cidr default


class AgentStartError(NetagentError):
    """The agent cannot start without guessing; the message says what to fix."""


@dataclass(frozen=True)
class AgentSettings:
    """`netagent run`'s node-routing flags; `routing.vxlan_checksum_offload` is set from `checksum_offload`."""
    node_name: str
    cluster_cidrs: tuple
    routing: RoutingSettings
    service_cidrs: tuple = DEFAULT_SERVICE_CIDRS  # --service-cidr: no peer may claim it
    api_server_addresses: tuple = ()   # where this agent reaches the API server: no peer may be it
    iface: str | None = None
    iface_regex: str | None = None
    lease_timeout: float = 60.0
    masquerade: Masquerade = Masquerade.ON
    min_sync_interval: float = 0.0
    resync_interval: float = 30.0
    checksum_offload: ChecksumOffloadPolicy = ChecksumOffloadPolicy.AUTO  # sets routing.vxlan_checksum_offload


def kernel_release_at_least(release: str, wanted: tuple) -> bool:
    parts = []
    for piece in release.split("-")[0].split(".")[:2]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits or 0))
    return tuple(parts) >= wanted


def auto_checksum_offload(*, kernel_release: str, behind_nat: bool) -> ChecksumOffload:
    """On unless the kernel predates the 5.7 netfilter fix or the node is behind NAT (where
    rewritten outer headers still break offloaded checksums)."""
    if behind_nat or not kernel_release_at_least(kernel_release, (5, 7)):
        return ChecksumOffload.OFF
    return ChecksumOffload.ON


def checksum_offload(policy: ChecksumOffloadPolicy, *, kernel_release: str, behind_nat: bool) -> ChecksumOffload:
    """The VXLAN device's checksum offload under `policy` (auto: `auto_checksum_offload`)."""
    if policy is ChecksumOffloadPolicy.AUTO:
        return auto_checksum_offload(kernel_release=kernel_release, behind_nat=behind_nat)
    return ChecksumOffload.ON if policy is ChecksumOffloadPolicy.ON else ChecksumOffload.OFF


def node_changes(*, on_change: Callable[[], None] = lambda: None) -> ChangeRecorder:
    """The Nodes whose routing inputs changed since the last sync (status heartbeats are not changes)."""
    return ChangeRecorder("nodes", on_change=on_change, relevant=routing_inputs_differ)


ROUTING_METADATA = ("annotations", "uid", "creationTimestamp")  # what read_peer reads of metadata


def routing_inputs_differ(old: object, new: object) -> bool:
    """Whether an update may change what `read_peer` makes of a Node: its raw `spec` or the raw
    metadata fields it reads differ (a heartbeat changes only `status` and the resourceVersion).
    On the watch thread, so nothing is parsed or looked into: raw values compared for equality,
    and anything not shaped like a Node counts as changed (`read_peer` judges it on the sync thread)."""
    if not isinstance(old, dict) or not isinstance(new, dict):
        return True
    old_meta, new_meta = old.get("metadata"), new.get("metadata")
    if not isinstance(old_meta, dict) or not isinstance(new_meta, dict):
        return True
    try:
        return old.get("spec") != new.get("spec") or \
            any(old_meta.get(key) != new_meta.get(key) for key in ROUTING_METADATA)
    except RecursionError:  # nested deeper than equality goes: changed, read_peer refuses it
        return True


def own_networks(snapshot: UnderlaySnapshot) -> tuple:
    """(network, what) pairs no peer may claim: every address of this node (/32, /128) and every
    connected IPv4 and global IPv6 subnet of its interfaces (not loopback, not our own devices), except a
    subnet so wide that it holds a whole cluster CIDR (routes to pods inside it are then the
    normal case); the addresses still protect the node itself."""
    reserved = []
    for info in snapshot.interfaces:
        if info.name == "lo" or info.name.startswith(owned.DEVICE_PREFIX):
            continue
        for address in (*info.addresses, *info.addresses6):
            reserved.append((ipaddress.ip_network(address.ip), f"this node's address on {info.name}"))
            reserved.append((address.network, f"this node's network on {info.name}"))
    return tuple(reserved)


def peer_bounds(settings: AgentSettings, family: IpFamily, *, pod_cidrs: tuple, host_networks: tuple) -> PeerBounds:
    """Where peers' pod CIDRs of `family` may lie: its cluster CIDR, clear of the service range, the
    API server's addresses and of this node's own networks (except one that holds a whole cluster CIDR: see `own_networks`)."""
    cluster = tuple(c for c in settings.cluster_cidrs if family.holds(c))
    reserved = [(c, "the service range (--service-cidr)") for c in settings.service_cidrs
                if family.holds(c)]
    ours = [c for c in pod_cidrs if family.holds(c)]  # claimed as this node's by the planner
    reserved += [(network, what) for network, what in host_networks
                 if family.holds(network) and not any(network.subnet_of(c) for c in ours)
                 and (network.prefixlen == network.max_prefixlen
                      or not any(c.subnet_of(network) for c in cluster))]
    api_server = tuple((ipaddress.ip_network(a), "the API server's address") for a in settings.api_server_addresses
                       if family.holds(a))
    return PeerBounds(cluster_cidrs=cluster, reserved=tuple(reserved), outside_pod_cidrs=api_server)


def parse_cluster_cidrs(values) -> tuple:
    """--cluster-cidr, given once per IP family (IPv4 and/or IPv6), IPv4 first."""
    try:
        cidrs = tuple(ipaddress.ip_network(v, strict=True) for v in values)
    except ValueError as exc:
        raise AgentStartError(f"--cluster-cidr: {exc}") from None
    for family in IpFamily:
        same = [str(c) for c in cidrs if family.holds(c)]
        if len(same) > 1:
            raise AgentStartError(f"--cluster-cidr is given once per IP family; {family.label} has "
                                  f"{len(same)}: {', '.join(same)}")
    return tuple(sorted(cidrs, key=lambda c: c.version))


def parse_service_cidrs(values) -> tuple:
    """--service-cidr (repeatable); kubeadm's 10.96.0.0/12 when none is given."""
    if not values:
        return DEFAULT_SERVICE_CIDRS
    try:
        return tuple(ipaddress.ip_network(v, strict=True) for v in values)
    except ValueError as exc:
        raise AgentStartError(f"--service-cidr: {exc}") from None

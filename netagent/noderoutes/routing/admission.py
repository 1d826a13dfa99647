"""Which peers may be routed at all: bounds, then claims resolved by seniority.

Every Node is written by someone we do not trust (any kubelet writes its own Node's
annotations; a lax or compromised API server writes anything), and a route is a promise
to deliver a prefix into the overlay. So before a peer's objects are planned:

- **bounds**: each of its IPv4 pod CIDRs must lie inside `--cluster-cidr` and overlap no
  reserved range (`PeerBounds.reserved`: the service range, this node's own underlay
  subnets); its public IP must be a unicast address outside the cluster CIDR (a tunnel
  endpoint inside the overlay would loop). A peer claiming `169.254.169.254/32`, the
  service range or the node subnet is refused, never routed;
- **claims**: a pod CIDR overlapping this node's or another accepted peer's, a public IP
  or a VTEP MAC equal to ours or another accepted peer's, is a conflict. Peers are
  admitted in seniority order (`Peer.seniority`: the older Node by creationTimestamp, then
  uid, then name), so the holder of a claim is always the older Node: a newcomer copying
  node-2's MAC or CIDR is refused, whatever its name, and node-2 keeps its routes. A
  refused peer holds nothing, and every render starts afresh, so when the holder goes
  away the refused one is admitted at the next render (the reconciler re-plans on every
  change).

Overlap checks walk the prefix lengths of one CIDR (at most 33 integer lookups), never
all pairs, and only when a sort-and-sweep over all CIDRs found an overlap at all: a plan
for 1,000 peers renders in about 20 ms.
"""
from __future__ import annotations

from ipaddress import IPv4Address
from typing import Iterable

from netagent.noderoutes.routing.model import (
    LocalNode,
    Peer,
    PeerBounds,
    PeerPlan,
    Pending,
    RefusalReason,
    Refused,
    VxlanDevice,
)

_MASKS = tuple((0xFFFFFFFF << (32 - n)) & 0xFFFFFFFF for n in range(33))
_BROADCAST = IPv4Address("255.255.255.255")


class _Claims:
    """Who holds which IPv4 prefix; an overlap check costs one lookup per prefix length."""

    def __init__(self) -> None:
        self._exact: dict[tuple, str] = {}  # (network int, prefixlen) -> owner
        self._below: dict[tuple, str] = {}  # a supernet of some claimed prefix -> its owner

    def overlapping_owner(self, cidr) -> str | None:
        network = int(cidr.network_address)
        for prefixlen in range(cidr.prefixlen, -1, -1):
            owner = self._exact.get((network & _MASKS[prefixlen], prefixlen))
            if owner is not None:
                return owner
        return self._below.get((network, cidr.prefixlen))

    def claim(self, cidr, owner: str) -> None:
        network = int(cidr.network_address)
        self._exact[(network, cidr.prefixlen)] = owner
        for prefixlen in range(cidr.prefixlen):
            self._below.setdefault((network & _MASKS[prefixlen], prefixlen), owner)


class _NoClaims:
    """Stands in for `_Claims` when a sweep has shown that no two CIDRs overlap."""

    def overlapping_owner(self, cidr) -> None:
        return None

    def claim(self, cidr, owner: str) -> None:
        pass


def _claims_for(local: LocalNode, peers: Iterable[Peer]) -> _Claims | _NoClaims:
    """One sort and sweep over every IPv4 CIDR: only when some overlap is the lookup table needed."""
    nodes: tuple[LocalNode | Peer, ...] = (local, *peers)
    spans = sorted((int(c.network_address), int(c.broadcast_address))
                   for node in nodes for c in node.pod_cidrs if c.version == 4)
    reach = -1
    for start, end in spans:
        if start <= reach:
            return _Claims()
        reach = end
    return _NoClaims()


def _unicast_problem(address: IPv4Address) -> str:
    if address.is_unspecified or address.is_loopback or address.is_multicast or address == _BROADCAST \
            or address.is_reserved:
        return f"public IP {address} is not a unicast address a tunnel can reach"
    return ""


class Admission:
    """One render's claims; `check` before a peer's backend render, `check_macs` and `admit` after."""

    def __init__(self, local: LocalNode, peers: Iterable[Peer], *, bounds: PeerBounds,
                 devices: tuple) -> None:
        self.local = local
        self.bounds = bounds
        self.cluster = tuple(c for c in bounds.cluster_cidrs if c.version == 4)
        self.claims = _claims_for(local, peers)
        ours = f"this node ({local.name})"
        for cidr in local.pod_cidrs:
            if cidr.version == 4:
                self.claims.claim(cidr, ours)
        self.public_ips: dict[IPv4Address, str] = {local.public_ip: ours}
        self.macs = {device.mac: ours for device in devices if isinstance(device, VxlanDevice)}

    def check(self, peer: Peer, cidrs: tuple) -> Refused | None:
        """Bounds and CIDR / public IP conflicts of one peer's IPv4 `cidrs` (None: go on)."""
        problem = _unicast_problem(peer.public_ip)
        if problem:
            return Refused(problem, RefusalReason.MALFORMED)
        for cluster in self.cluster:
            if peer.public_ip in cluster:
                return Refused(f"public IP {peer.public_ip} lies inside the cluster CIDR {cluster}: "
                               f"tunnel packets to it would enter the overlay", RefusalReason.RESERVED)
        holder = self.public_ips.get(peer.public_ip)
        if holder is not None:
            return Refused(f"announces public IP {peer.public_ip}, which is "
                           f"{'this node' if holder.startswith('this node') else holder}'s own",
                           RefusalReason.CONFLICT)
        for index, cidr in enumerate(cidrs):
            if not any(cidr.subnet_of(cluster) for cluster in self.cluster):
                inside = ", ".join(map(str, self.cluster)) or "none configured for IPv4"
                return Refused(f"pod CIDR {cidr} is outside the cluster CIDR ({inside}, --cluster-cidr)",
                               RefusalReason.OUTSIDE_CLUSTER_CIDR)
            for reserved, what in self.bounds.reserved:
                if reserved.version == 4 and cidr.overlaps(reserved):
                    return Refused(f"pod CIDR {cidr} overlaps {what} {reserved}", RefusalReason.RESERVED)
            if any(cidr.overlaps(other) for other in cidrs[:index]):
                return Refused(f"its pod CIDRs {', '.join(map(str, cidrs))} overlap each other",
                               RefusalReason.MALFORMED)
            owner = self.claims.overlapping_owner(cidr)
            if owner is not None:
                return Refused(f"pod CIDR {cidr} overlaps one held by {owner}", RefusalReason.OVERLAP)
        return None

    def check_macs(self, plan: PeerPlan) -> Refused | None:
        for entry in plan.fdb:
            if entry.mac in self.macs:
                return Refused(f"VTEP MAC {entry.mac} is already used by {self.macs[entry.mac]}",
                               RefusalReason.CONFLICT)
        return None

    def admit(self, peer: Peer, cidrs: tuple, result: PeerPlan | Pending) -> None:
        """The peer holds its CIDRs, public IP and MACs from now on in this render."""
        for cidr in cidrs:
            self.claims.claim(cidr, peer.name)
        self.public_ips[peer.public_ip] = peer.name
        if isinstance(result, PeerPlan):
            for entry in result.fdb:
                self.macs[entry.mac] = peer.name

"""Which peers may be routed at all: bounds, then claims resolved by seniority.

Every Node is written by someone we do not trust (any kubelet writes its own Node's
annotations; a lax or compromised API server writes anything), and a route is a promise
to deliver a prefix into the overlay. So before a peer's objects are planned:

Admission runs per family (one planner per family of the cluster, see `plan.py`): the peer's
CIDRs, public IP and VTEP MAC are those of the planner's family (`Peer.in_family`), checked
against the cluster CIDR and reserved ranges of that family only.

- **bounds**: each of its pod CIDRs must lie inside `--cluster-cidr` of its family and overlap no
  reserved range (`PeerBounds.reserved`: the service range, this node's own underlay
  subnets; `PeerBounds.outside_pod_cidrs`: the API server's addresses, which a Node's public
  IP may be, as the API server may run on a node); its public IP must be a unicast address outside the cluster CIDR (a tunnel
  endpoint inside the overlay would loop). A peer claiming `169.254.169.254/32`, the
  service range or the node subnet is refused, never routed;
- **addresses that are not a node's**: a public IP equal to one of this node's own addresses
  (`PeerBounds.reserved`'s host entries), to an external BGP peer of the operator's or to one of
  this node's gateways (`reserved_addresses`, handed over by the BGP speaker through
  `routing/bgp.LearntTable`) is refused: a Node announcing the top-of-rack router's address must
  not replace the router's session (`bgp/topology.py` never lets it) nor be routed through;
- **claims**: a pod CIDR overlapping this node's or another accepted peer's, a public IP
  or a VTEP MAC equal to ours or another accepted peer's, is a conflict. Peers are
  admitted in seniority order (`Peer.seniority`: the older Node by creationTimestamp, then
  uid, then name), so the holder of a claim is always the older Node: a newcomer copying
  node-2's MAC or CIDR is refused, whatever its name, and node-2 keeps its routes. A
  refused peer holds nothing, and every render starts afresh, so when the holder goes
  away the refused one is admitted at the next render (the reconciler re-plans on every
  change).

The incremental plan (`incremental.py`) keeps one `Admission` over a `ReleasableClaims` index
across changes: a changed peer `release`s what it held and is checked again against every holder.

Overlap checks walk the prefix lengths of one CIDR (at most 33, or 129, integer lookups), never
all pairs, and only when a sort-and-sweep over all CIDRs found an overlap at all: a plan
for 1,000 peers renders in about 20 ms.
"""
from __future__ import annotations

from ipaddress import IPv4Address
from typing import Callable, Iterable

from netagent.kernel.families import IpFamily

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

def _masks(bits: int) -> tuple:
    full = (1 << bits) - 1
    return tuple((full << (bits - n)) & full for n in range(bits + 1))


_MASKS = {IpFamily.V4: _masks(32), IpFamily.V6: _masks(128)}
_BROADCAST = IPv4Address("255.255.255.255")


class _Claims:
    """Who holds which prefix of one family; an overlap check costs one lookup per prefix length."""

    def __init__(self, family: IpFamily = IpFamily.V4) -> None:
        self._masks = _MASKS[family]
        self._exact: dict[tuple, str] = {}  # (network int, prefixlen) -> owner
        self._below: dict[tuple, str] = {}  # a supernet of some claimed prefix -> its owner

    def _covering_owner(self, cidr) -> str | None:
        """The owner of a claimed prefix equal to or holding `cidr`."""
        network = int(cidr.network_address)
        for prefixlen in range(cidr.prefixlen, -1, -1):
            owner = self._exact.get((network & self._masks[prefixlen], prefixlen))
            if owner is not None:
                return owner
        return None

    def overlapping_owner(self, cidr) -> str | None:
        owner = self._covering_owner(cidr)
        return owner if owner is not None else self._below.get((int(cidr.network_address), cidr.prefixlen))

    def claim(self, cidr, owner: str) -> None:
        network = int(cidr.network_address)
        self._exact[(network, cidr.prefixlen)] = owner
        for prefixlen in range(cidr.prefixlen):
            self._below.setdefault((network & self._masks[prefixlen], prefixlen), owner)


class ReleasableClaims(_Claims):
    """`_Claims` whose holders can give a claim back (the incremental plan keeps one across
    changes). A prefix under several claims answers its oldest holder by `rank`, as the full
    render's first claimer would be."""

    def __init__(self, family: IpFamily, rank: Callable[[str], tuple]) -> None:
        super().__init__(family)
        self._rank = rank
        self._under: dict[tuple, dict[str, None]] = {}  # a supernet of claimed prefixes -> their owners

    def overlapping_owner(self, cidr) -> str | None:
        owner = self._covering_owner(cidr)
        if owner is not None:
            return owner
        owners = self._under.get((int(cidr.network_address), cidr.prefixlen))
        return min(owners, key=self._rank) if owners else None

    def claim(self, cidr, owner: str) -> None:
        network = int(cidr.network_address)
        self._exact[(network, cidr.prefixlen)] = owner
        for prefixlen in range(cidr.prefixlen):
            self._under.setdefault((network & self._masks[prefixlen], prefixlen), {})[owner] = None

    def release(self, cidr, owner: str) -> None:
        network = int(cidr.network_address)
        if self._exact.get((network, cidr.prefixlen)) == owner:
            del self._exact[(network, cidr.prefixlen)]
        for prefixlen in range(cidr.prefixlen):
            key = (network & self._masks[prefixlen], prefixlen)
            owners = self._under.get(key)
            if owners is not None:
                owners.pop(owner, None)
                if not owners:
                    del self._under[key]


class _NoClaims:
    """Stands in for `_Claims` when a sweep has shown that no two CIDRs overlap."""

    def overlapping_owner(self, cidr) -> None:
        return None

    def claim(self, cidr, owner: str) -> None:
        pass


def _claims_for(local: LocalNode, peers: Iterable[Peer], family: IpFamily) -> _Claims | _NoClaims:
    """One sort and sweep over every CIDR of `family`: only when some overlap is the lookup table needed."""
    nodes: tuple[LocalNode | Peer, ...] = (local, *peers)
    spans = sorted((int(c.network_address), int(c.broadcast_address))
                   for node in nodes for c in node.pod_cidrs if family.holds(c))
    reach = -1
    for start, end in spans:
        if start <= reach:
            return _Claims(family)
        reach = end
    return _NoClaims()


def _unicast_problem(address, family: IpFamily) -> str:
    if not family.holds(address):
        return f"public IP {address} is not an {family.label} address"
    if address.is_unspecified or address.is_loopback or address.is_multicast or address == _BROADCAST \
            or address.is_reserved or (family is IpFamily.V6 and address.is_link_local):
        return f"public IP {address} is not a unicast address a tunnel can reach"
    return ""


class Admission:
    """One render's claims; `check` before a peer's backend render, `check_macs` and `admit` after."""

    def __init__(self, local: LocalNode, peers: Iterable[Peer], *, bounds: PeerBounds,
                 devices: tuple, reserved_addresses: Iterable = (), claims: ReleasableClaims | None = None) -> None:
        """`reserved_addresses`: (address, what it is), ...: no peer's public IP. `claims`: a
        releasable index (then `release` works and `peers` is not looked at)."""
        self.local = local
        self.family = family = local.family
        self.bounds = bounds
        self.cluster = tuple(c for c in bounds.cluster_cidrs if family.holds(c))
        self.claims: _Claims | _NoClaims = claims if claims is not None else _claims_for(local, peers, family)
        self._held: dict[str, tuple] = {}  # peer -> (CIDRs, public IP, MACs) it holds
        ours = f"this node ({local.name})"
        for cidr in local.pod_cidrs:
            if family.holds(cidr):
                self.claims.claim(cidr, ours)
        self.public_ips: dict = {local.public_ip: ours}
        self.reserved: dict = {}
        for address, what in reserved_addresses:  # the first name of an address is its name
            if family.holds(address):
                self.reserved.setdefault(address, what)
        for network, what in bounds.reserved:  # this node's own addresses (host entries)
            if family.holds(network) and network.prefixlen == network.max_prefixlen:
                self.reserved.setdefault(network.network_address, what)
        self.macs = {device.mac: ours for device in devices if isinstance(device, VxlanDevice)}

    def check(self, peer: Peer, cidrs: tuple) -> Refused | None:
        """Bounds and CIDR / public IP conflicts of one peer's `cidrs` of this family (None: go on)."""
        problem = _unicast_problem(peer.public_ip, self.family)
        if problem:
            return Refused(problem, RefusalReason.MALFORMED)
        for cluster in self.cluster:
            if peer.public_ip in cluster:
                return Refused(f"public IP {peer.public_ip} lies inside the cluster CIDR {cluster}: "
                               f"tunnel packets to it would enter the overlay", RefusalReason.RESERVED)
        what = self.reserved.get(peer.public_ip)
        if what is not None and peer.public_ip != self.local.public_ip:
            return Refused(f"announces public IP {peer.public_ip}, which is {what}, not a node's",
                           RefusalReason.RESERVED)
        holder = self.public_ips.get(peer.public_ip)
        if holder is not None:
            return Refused(f"announces public IP {peer.public_ip}, which is "
                           f"{'this node' if holder.startswith('this node') else holder}'s own",
                           RefusalReason.CONFLICT)
        for index, cidr in enumerate(cidrs):
            if not any(cidr.subnet_of(cluster) for cluster in self.cluster):
                inside = ", ".join(map(str, self.cluster)) or f"none configured for {self.family.label}"
                return Refused(f"pod CIDR {cidr} is outside the cluster CIDR ({inside}, --cluster-cidr)",
                               RefusalReason.OUTSIDE_CLUSTER_CIDR)
            for reserved, what in (*self.bounds.reserved, *self.bounds.outside_pod_cidrs):
                if reserved.version == cidr.version and cidr.overlaps(reserved):
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
        macs = tuple(entry.mac for entry in result.fdb) if isinstance(result, PeerPlan) else ()
        for mac in macs:
            self.macs[mac] = peer.name
        self._held[peer.name] = (cidrs, peer.public_ip, macs)

    def holds(self, name: str) -> bool:
        """Whether the peer holds claims in this admission."""
        return name in self._held

    def release(self, name: str) -> None:
        """The peer holds nothing any more (needs releasable `claims`); a peer holding nothing is a no-op."""
        held = self._held.pop(name, None)
        if held is None:
            return
        cidrs, public_ip, macs = held
        assert isinstance(self.claims, ReleasableClaims), "release needs a releasable claims index"
        for cidr in cidrs:
            self.claims.release(cidr, name)
        if self.public_ips.get(public_ip) == name:
            del self.public_ips[public_ip]
        for mac in macs:
            if self.macs.get(mac) == name:
                del self.macs[mac]

"""Who peers with whom, and what each peer may announce: the cluster's view as a `BgpNodeConfig`.

`compose_node_config` is pure: this node, the Nodes the agent admitted (`routing/admission.py`:
pod CIDRs inside the cluster CIDR, no claim taken from an older Node), the topology
(`TopologySettings`, from the ConfigMap and flags, `cluster_config.py`) and the external peers
that apply to this node. Topologies, as Calico has them:

- full mesh (`mesh`, no reflectors): every admitted node is an iBGP peer; each may announce
  exactly its own pod CIDRs;
- route reflectors (Nodes carrying the reflector label, which must lie under
  `node-restriction.kubernetes.io/`: the NodeRestriction admission plugin forbids a kubelet to set
  such a label on its own Node, so only the operator makes a reflector): a client peers only with the reflectors and
  accepts from them any admitted node's CIDRs; a reflector peers with every other reflector
  (accepting any admitted CIDR) and with every client (`rr client`, accepting that client's own
  CIDRs) and reflects the admitted CIDRs; each reflector is its own cluster (its router id);
- external peers (top-of-rack routers, per node or per underlay subnet): eBGP (or iBGP when
  they share our AS); they may announce only admitted nodes' CIDRs, never anything else.

A peer on another subnet than this node's underlay is a multihop session. Our own CIDRs are
never accepted from anyone.

Routing trust comes from the operator, never from a Node: the operator's external peers (the
ConfigMap and flags) are added first and keep their address, AS and password; a Node whose
address is one of them, this node's, or another address the caller reserves (its gateways, the
API server) is refused (`screen_nodes`: no session, its CIDRs accepted from no one) instead of
replacing that session. Peers of this Node's own annotation come last and take no address
already in use.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from ipaddress import IPv4Address, IPv4Network
from typing import Iterable

from netagent.noderoutes.bgp.model import Bfd, BgpNodeConfig, BgpPeer, GracefulRestart, PeerRole, Timers

DEFAULT_AS = 64512
MULTIHOP_TTL = 255
# NodeRestriction refuses a kubelet any label under this prefix on its own Node: the operator's alone
TRUSTED_LABEL_PREFIX = "node-restriction.kubernetes.io/"
REFLECTOR_LABEL = TRUSTED_LABEL_PREFIX + "netagent-route-reflector"


@dataclass(frozen=True)
class ExternalPeer:
    """A router outside the cluster; `subnet` set: for every node whose underlay address is in it."""
    address: IPv4Address
    asn: int
    password: str | None = None
    subnet: IPv4Network | None = None


@dataclass(frozen=True)
class TopologySettings:
    asn: int = DEFAULT_AS
    mesh: bool = True
    bfd: bool = False
    reflector_label: str = REFLECTOR_LABEL  # a Node with this label set to "true" (operator-set only)
    external: tuple = ()                                    # ExternalPeer (per subnet), from the ConfigMap
    timers: Timers = field(default_factory=Timers)
    graceful_restart: GracefulRestart = field(default_factory=GracefulRestart)
    bfd_timers: Bfd = field(default_factory=Bfd)


@dataclass(frozen=True)
class BgpNode:
    """A node as BGP sees it: its peering address and its pod CIDRs (IPv4Network, ...)."""
    name: str
    address: IPv4Address
    cidrs: tuple
    reflector: bool = False


def _hops(local_network: IPv4Network, address: IPv4Address) -> int | None:
    return None if address in local_network else MULTIHOP_TTL


def reserved_addresses(local: BgpNode, topology: TopologySettings, extra: Iterable = ()) -> dict:
    """Address -> what it is, for every address no Node may peer from: this node's, the operator's
    external peers (of every subnet: a router is never a node) and `extra` ((address, what), ...:
    the caller's gateways, the API server)."""
    reserved = {address: what for address, what in extra}
    for external in topology.external:
        reserved[external.address] = f"the external BGP peer {external.address} (AS {external.asn})"
    reserved[local.address] = f"this node's ({local.name}) address"
    return reserved


def screen_nodes(local: BgpNode, admitted: Iterable[BgpNode], reserved: dict) -> tuple[list, dict]:
    """(the Nodes that may be peers, {name: why refused}): a Node whose address is reserved
    (`reserved_addresses`) is refused; this node itself is left out."""
    kept, refused = [], {}
    for node in admitted:
        if node.name == local.name:
            continue
        what = reserved.get(node.address)
        if what is not None:
            refused[node.name] = f"its public IP {node.address} is {what}"
        else:
            kept.append(node)
    return kept, refused


def compose_node_config(local: BgpNode, admitted: Iterable[BgpNode], topology: TopologySettings, *,
                        local_network: IPv4Network, node_peers: tuple = (), reserved: Iterable = ()) -> BgpNodeConfig:
    """This node's BIRD configuration. `admitted` are the other Nodes the agent routes to (those
    `screen_nodes` refuses are left out); `node_peers` the external peers of this Node's annotation
    (`cluster_config.parse_node_peers`); `reserved` further addresses no Node may hold."""
    kept, _ = screen_nodes(local, admitted, reserved_addresses(local, topology, reserved))
    others = sorted(kept, key=lambda n: n.address)
    every = tuple(sorted({c for n in others for c in n.cidrs} - set(local.cidrs), key=str))
    bfd = topology.bfd
    peers: dict[IPv4Address, BgpPeer] = {}

    def add(address: IPv4Address, asn: int, role: PeerRole, accept: tuple, password: str | None = None) -> None:
        if address not in peers and address != local.address:
            peers[address] = BgpPeer(address, asn, role, accept=accept, password=password, bfd=bfd,
                                     multihop=_hops(local_network, address))

    for external in topology.external:  # the operator's first: no Node takes their session
        if external.subnet is None or local.address in external.subnet:
            add(external.address, external.asn, PeerRole.EXTERNAL, every, external.password)
    reflectors = [n for n in others if n.reflector]
    rr_cluster_id = None
    if local.reflector:
        rr_cluster_id = local.address
        for node in others:
            if node.reflector:
                add(node.address, topology.asn, PeerRole.REFLECTOR, every)
            else:
                add(node.address, topology.asn, PeerRole.REFLECTOR_CLIENT, _own(node, local))
    elif reflectors:
        for node in reflectors:
            add(node.address, topology.asn, PeerRole.REFLECTOR, every)
    elif topology.mesh:
        for node in others:
            add(node.address, topology.asn, PeerRole.MESH, _own(node, local))
    for external in node_peers:  # this Node's own annotation: last, into no address in use
        add(external.address, external.asn, PeerRole.EXTERNAL, every, external.password)
    return BgpNodeConfig(
        router_id=local.address, local_address=local.address, asn=topology.asn, own_cidrs=tuple(local.cidrs),
        peers=tuple(peers.values()), reflected=every if local.reflector else (), rr_cluster_id=rr_cluster_id,
        timers=topology.timers, graceful_restart=topology.graceful_restart, bfd=topology.bfd_timers)


def _own(node: BgpNode, local: BgpNode) -> tuple:
    return tuple(c for c in node.cidrs if c not in local.cidrs)

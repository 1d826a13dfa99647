"""Pod egress masquerade: pods reach the world with the node's address, and each other with
their own.

Two chains of ours, each entered from a built-in chain by one commented jump at the top:

nat POSTROUTING -> NETAGENT-POSTRTG (evaluated in order, first match wins):
  1. cluster source -> cluster destination: RETURN. Pod-to-pod traffic, on this node or
     across the overlay, keeps the pod's address: network policies, logs and the receiving
     pod see who really called. One rule per (source CIDR, destination CIDR) pair.
  2. cluster source -> anything but multicast: MASQUERADE. Pod addresses mean nothing outside
     the cluster network and replies could not find their way back; the node's address on
     the way out does. Multicast (224.0.0.0/4, ff00::/8) is left alone: it is not routed
     back, and masquerading it breaks protocols that read the source (mDNS, VRRP, ...).
  3. -> this node's pod CIDR: RETURN. Traffic from outside the cluster network (the node
     itself, a NodePort client routed here) reaches local pods with its own address.
  4. -> any other cluster destination: MASQUERADE. Traffic from outside the cluster network
     sent towards another node's pods over the overlay gets this node's (overlay) address,
     so the reply comes back through this node, which holds the connection's state.
  Rules 3 and 4 carry no `! -s CLUSTER`: every cluster source already left the chain at rule
  1 or 2 except multicast destinations, which no cluster CIDR contains. That keeps them one
  rule each when the cluster has several CIDRs, where a negated source cannot be expressed.
  MASQUERADE uses `--random-fully` when iptables supports it (1.6.2+): it randomises the
  source port of every mapping, which avoids the conntrack insertion races that drop the
  first packets of parallel connections (the DNS five-second delays users of flannel hit).

filter FORWARD -> NETAGENT-FORWARD:
  traffic from and to the cluster CIDRs: ACCEPT. Hosts whose FORWARD policy is DROP (Docker
  sets it) would otherwise drop every forwarded pod packet. Nothing else is accepted here.

The jumps sit at the top (before every rule not ours) so another tool's earlier rule cannot
RETURN/MASQUERADE pod traffic first; each rule carries a comment saying what it is for.
`render_masquerade_rules` is pure; `MasqueradeManager` compares what the kernel holds with
it and rewrites only what drifted, each table in one atomic restore, touching no rule that
neither is in nor jumps to one of its two chains.
"""
from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from netagent.kernel.families import IpFamily
from netagent.kernel.iptables.restore_format import (
    RestoreBuilder,
    Table,
    canonical_spec,
)
from netagent.kernel.iptables.runner import (
    OWNED_PREFIX,
    Iptables,
    JumpPosition,
    PortRandomization,
    add_jump_repair,
    jump_drift,
    jump_spec,
)

IpNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

MULTICAST = {IpFamily.V4: ipaddress.ip_network("224.0.0.0/4"), IpFamily.V6: ipaddress.ip_network("ff00::/8")}
POSTROUTING_JUMP_COMMENT = "netagent: pod egress masquerade"
FORWARD_JUMP_COMMENT = "netagent: forward pod traffic"


@dataclass(frozen=True)
class OwnedChain:
    """One chain of ours: where it lives, who jumps to it, and its wanted rules."""
    table: str
    name: str
    parent: str
    jump_comment: str
    rules: tuple[tuple[str, ...], ...]

    @property
    def jump(self) -> tuple[str, ...]:
        return jump_spec(self.name, comment=self.jump_comment)


def masquerade_chains(*, cluster_cidrs: Iterable[IpNetwork | str], pod_cidrs: Iterable[IpNetwork | str],
                      chain_prefix: str = OWNED_PREFIX,
                      ports: PortRandomization = PortRandomization.FULLY) -> tuple[OwnedChain, OwnedChain]:
    """The two chains (nat, filter) with their wanted rules, in canonical save form."""
    cluster, pods = validated_networks(cluster_cidrs=cluster_cidrs, pod_cidrs=pod_cidrs)
    multicast = MULTICAST[IpFamily.of(cluster[0])]
    masquerade = ("-j", *ports.target)
    nat: list[tuple[str, ...]] = []
    for source in cluster:
        for destination in cluster:
            nat.append(_rule("-s", str(source), "-d", str(destination),
                             comment="netagent: pod to pod keeps the pod address", action=("-j", "RETURN")))
    for source in cluster:
        nat.append(_rule("-s", str(source), "!", "-d", str(multicast),
                         comment="netagent: pods leaving the cluster use the node address",
                         action=masquerade))
    for pod_cidr in pods:
        nat.append(_rule("-d", str(pod_cidr), comment="netagent: outside to local pods keeps the client address",
                         action=("-j", "RETURN")))
    for destination in cluster:
        nat.append(_rule("-d", str(destination),
                         comment="netagent: outside to remote pods is masqueraded for the return path",
                         action=masquerade))
    forward: list[tuple[str, ...]] = []
    for network in cluster:
        forward.append(_rule("-s", str(network), comment="netagent: forward from pods", action=("-j", "ACCEPT")))
        forward.append(_rule("-d", str(network), comment="netagent: forward to pods", action=("-j", "ACCEPT")))
    return (OwnedChain("nat", f"{chain_prefix}POSTRTG", "POSTROUTING", POSTROUTING_JUMP_COMMENT, tuple(nat)),
            OwnedChain("filter", f"{chain_prefix}FORWARD", "FORWARD", FORWARD_JUMP_COMMENT, tuple(forward)))


def validated_networks(*, cluster_cidrs: Iterable[IpNetwork | str],
                       pod_cidrs: Iterable[IpNetwork | str]) -> tuple[list[IpNetwork], list[IpNetwork]]:
    """The cluster and pod CIDRs collapsed and sorted, or ValueError: at least one cluster
    CIDR, one IP version, no cluster CIDR overlapping multicast, every pod CIDR inside a
    cluster CIDR. Both renderings (iptables here, nftables in `masquerade_nft.py`) use it."""
    cluster = _networks(cluster_cidrs, what="cluster CIDR")
    pods = _networks(pod_cidrs, what="pod CIDR")
    if not cluster:
        raise ValueError("at least one cluster CIDR is needed")
    family = IpFamily.of(cluster[0])
    for network in cluster + pods:
        if not family.holds(network):
            raise ValueError(f"{network} is not {family.label} like {cluster[0]}")
    multicast = MULTICAST[family]
    for network in cluster:
        if network.overlaps(multicast):
            raise ValueError(f"cluster CIDR {network} overlaps multicast {multicast}")
    for network in pods:
        if not any(_subnet_of(network, outer) for outer in cluster):
            raise ValueError(f"pod CIDR {network} is outside every cluster CIDR {[str(c) for c in cluster]}")
    return cluster, pods


def render_masquerade_rules(*, cluster_cidrs: Iterable[IpNetwork | str], pod_cidrs: Iterable[IpNetwork | str],
                            chain_prefix: str = OWNED_PREFIX,
                            ports: PortRandomization = PortRandomization.FULLY) -> str:
    """Restore text (for --noflush) that creates or rewrites our two chains. The jumps from
    POSTROUTING and FORWARD are not in it: placing them needs the chains' current content."""
    builder = RestoreBuilder()
    for chain in masquerade_chains(cluster_cidrs=cluster_cidrs, pod_cidrs=pod_cidrs,
                                   chain_prefix=chain_prefix, ports=ports):
        _add_chain_rewrite(builder, chain)
    return builder.text()


class MasqueradeManager:
    """Keeps the masquerade chains and their jumps as rendered, through an `Iptables`."""

    def __init__(self, *, runner: Iptables, cluster_cidrs: Sequence[IpNetwork | str],
                 pod_cidrs: Sequence[IpNetwork | str], chain_prefix: str = OWNED_PREFIX,
                 forward_only: bool = False):
        """`forward_only`: keep only the filter FORWARD accept (the nftables mode's masquerade
        on a host whose iptables FORWARD policy is DROP, `masquerade_nft.py`)."""
        self.runner = runner
        ports = runner.port_randomization
        chains = masquerade_chains(cluster_cidrs=cluster_cidrs, pod_cidrs=pod_cidrs,
                                   chain_prefix=chain_prefix, ports=ports)
        self.chains: tuple[OwnedChain, ...] = chains[1:] if forward_only else chains
        family = IpFamily.of(next(iter(cluster_cidrs)))
        if family is not runner.family:
            raise ValueError(f"{family.label} cluster CIDRs need an {family.label} iptables, "
                             f"not {runner.family.name}")

    def check(self) -> list[str]:
        """What differs from the wanted state, one sentence per problem (empty: in sync)."""
        problems = []
        for chain in self.chains:
            problems.extend(_drift(self.runner.table(chain.table), chain))
        return problems

    def ensure(self) -> list[str]:
        """Repair whatever drifted; return what was repaired. Writes nothing when in sync."""
        builder = RestoreBuilder()
        problems = []
        for chain in self.chains:
            current = self.runner.table(chain.table)
            chain_problems = _chain_drift(current, chain)
            jump_problems = jump_drift(current, chain.parent, chain.jump, position=JumpPosition.FIRST)
            if chain_problems:
                _add_chain_rewrite(builder, chain)
            if jump_problems:
                add_jump_repair(builder, current, chain.parent, chain.jump, position=JumpPosition.FIRST)
            problems += chain_problems + jump_problems
        if builder:
            self.runner.restore(builder.text())
        return problems

    def cleanup(self) -> None:
        """Remove both chains and the jumps to them; nothing else. Quiet when already gone."""
        for chain in self.chains:
            self.runner.delete_chains(chain.table, [chain.name])


def _networks(values: Iterable[IpNetwork | str], *, what: str) -> list[IpNetwork]:
    try:
        networks = [ipaddress.ip_network(value) for value in values]
    except ValueError as error:
        raise ValueError(f"bad {what}: {error}") from None
    v4 = [network for network in networks if isinstance(network, ipaddress.IPv4Network)]
    v6 = [network for network in networks if isinstance(network, ipaddress.IPv6Network)]
    # Collapsed and sorted (IPv4 first): the same set of networks always renders the same rules.
    return [*ipaddress.collapse_addresses(v4), *ipaddress.collapse_addresses(v6)]


def _subnet_of(inner: IpNetwork, outer: IpNetwork) -> bool:
    """`inner.subnet_of(outer)`, spelled per family so each call has one address type."""
    if isinstance(inner, ipaddress.IPv4Network) and isinstance(outer, ipaddress.IPv4Network):
        return inner.subnet_of(outer)
    if isinstance(inner, ipaddress.IPv6Network) and isinstance(outer, ipaddress.IPv6Network):
        return inner.subnet_of(outer)
    raise TypeError(f"{inner} and {outer} are not of the same version")


def _rule(*match: str, comment: str, action: tuple[str, ...]) -> tuple[str, ...]:
    return canonical_spec([*match, "-m", "comment", "--comment", comment, *action])


def _add_chain_rewrite(builder: RestoreBuilder, chain: OwnedChain) -> None:
    builder.declare_chain(chain.table, chain.name)
    for spec in chain.rules:
        builder.append(chain.table, chain.name, spec)


def _chain_drift(table: Table, chain: OwnedChain) -> list[str]:
    where = f"{chain.table} {chain.name}"
    current = table.chains.get(chain.name)
    if current is None:
        return [f"{where}: chain missing"]
    if tuple(current.rules) != chain.rules:
        return [f"{where}: {len(current.rules)} rule(s) differ from the {len(chain.rules)} wanted"]
    return []


def _drift(table: Table, chain: OwnedChain) -> list[str]:
    return _chain_drift(table, chain) + jump_drift(table, chain.parent, chain.jump, position=JumpPosition.FIRST)

"""Tunnel source filter (issue 29 item 5): the tunnel devices decapsulate only what admitted
peers send.

A VXLAN socket or an IPIP/ip6tnl device accepts an encapsulated packet from any underlay host;
the inner packet then enters the node as if it came from a peer, any pod source address
included, and passes another namespace's ingress policy. So in iptables filter INPUT (before
the UDP socket or the tunnel handler decapsulates: both run after the local-in hook) one chain
of ours, `NETAGENT-TUNNEL-IN` (`owned.TUNNEL_FILTER_CHAIN`), jumped to first:

  -s <admitted peer's underlay address> -j RETURN     one rule per peer of the family
  -s <this node's own underlay address> -j RETURN
  -p udp --dport <VXLAN port> -j DROP                  vxlan, auto
  -p <4 | 41> -j DROP                                  ipip, auto over IPIP (IPv4: IPIP; IPv6: ip6ip6, 41)

One chain per family (ip6tables for the IPv6 underlay of `na-vxlan6`, `na-ipip6`). Modes without
a tunnel (host-gw, bgp) keep no chain: `tunnel_protocols` is empty and the manager removes it.
Per-peer RETURN rules (no ipset) keep the chain readable by `iptables-save` and its drift
a plain comparison, as masquerade's; every packet reaching INPUT walks them (one rule per
peer: an ipset is the step up for large clusters).

`TunnelFilter` has `MasqueradeManager`'s contract: `check()`, `ensure()` (one restore, only
when drifted), `cleanup()`; `update(peers)` sets the wanted peers of this sync. The agent calls
`sync_tunnel_filters` after every sync (full and partial), so a peer added or removed changes the
chain in the same sync, and a full sync repairs drift. `netagent cleanup` removes the chain with
every other `NETAGENT-` chain. In nftables mode (`HostAccess.nft`), where no iptables rule of
ours may exist, the same filter is the table of `tunnel_filter_nft.py`.
"""
from __future__ import annotations

import ipaddress
from collections.abc import Iterable

from netagent.kernel import owned
from netagent.kernel.families import IpFamily
from netagent.kernel.iptables.restore_format import RestoreBuilder, Table, canonical_spec
from netagent.kernel.iptables.runner import Iptables, JumpPosition, add_jump_repair, jump_drift
from netagent.noderoutes.masquerade import OwnedChain
from netagent.noderoutes.routing.model import Mode, Peer, RoutingSettings

TABLE, PARENT = "filter", "INPUT"
JUMP_COMMENT = "netagent: tunnel packets only from admitted peers"
IP_IN_IP = {IpFamily.V4: "4", IpFamily.V6: "41"}  # IPv4-in-IPv4; IPv6-in-IPv6 (ip6tnl ip6ip6)
# iptables-save names a protocol number by /etc/protocols when it lists it; we write numbers (a
# minimal image may have no /etc/protocols) and read both spellings back as the number
SAVED_PROTOCOL_NAMES = {"ipencap": "4", "ipv6": "41"}

Address = ipaddress.IPv4Address | ipaddress.IPv6Address


def tunnel_protocols(settings: RoutingSettings, family: IpFamily) -> tuple[tuple[str, ...], ...]:
    """The matches of the encapsulated packets `settings` receive (empty: no tunnel in use)."""
    modes = {settings.mode} | ({settings.auto_encap} if settings.mode is Mode.AUTO else set())
    matches: list[tuple[str, ...]] = []
    if Mode.VXLAN in modes:
        matches.append(("-p", "udp", "-m", "udp", "--dport", str(settings.vxlan_port)))
    if Mode.IPIP in modes:
        matches.append(("-p", IP_IN_IP[family]))
    return tuple(matches)


def tunnel_chain(*, family: IpFamily, protocols: tuple[tuple[str, ...], ...], own: Iterable[Address],
                 peers: Iterable[Address]) -> OwnedChain:
    """The wanted chain: own and peers' addresses (deduplicated, sorted) return, the rest of
    `protocols` is dropped."""
    sources = sorted({ipaddress.ip_address(a) for a in (*own, *peers)
                      if ipaddress.ip_address(a).version == family.value}, key=int)
    rules = [canonical_spec(("-s", str(source), "-m", "comment", "--comment", "netagent: admitted tunnel source",
                             "-j", "RETURN")) for source in sources]
    rules += [canonical_spec((*match, "-m", "comment", "--comment", "netagent: tunnel packet from a non-peer",
                              "-j", "DROP")) for match in protocols]
    return OwnedChain(TABLE, owned.TUNNEL_FILTER_CHAIN, PARENT, JUMP_COMMENT, tuple(rules))


class TunnelFilter:
    """Keeps one family's tunnel source chain and its jump as wanted, through an `Iptables`."""

    def __init__(self, *, runner: Iptables, settings: RoutingSettings, own: Iterable[Address]) -> None:
        self.runner = runner
        self.family = runner.family
        self.protocols = tunnel_protocols(settings, self.family)
        self.own = tuple(own)
        self.chain = tunnel_chain(family=self.family, protocols=self.protocols, own=self.own, peers=())

    def update(self, peers: Iterable[Address]) -> None:
        """The admitted peers' underlay addresses of this sync."""
        self.chain = tunnel_chain(family=self.family, protocols=self.protocols, own=self.own, peers=peers)

    def check(self) -> list[str]:
        """What differs from the wanted state, one sentence per problem (empty: in sync)."""
        return self._drift(self.runner.table(TABLE))

    def ensure(self) -> list[str]:
        """Repair whatever drifted; return what was repaired. Writes nothing when in sync; with
        no tunnel in use, removes the chain instead."""
        if not self.protocols:
            return ["tunnel filter removed: no tunnel in use"] if self.runner.delete_chains(
                TABLE, [self.chain.name]) else []
        current = self.runner.table(TABLE)
        chain_problems = self._chain_drift(current)
        jump_problems = jump_drift(current, PARENT, self.chain.jump, position=JumpPosition.FIRST)
        builder = RestoreBuilder()
        if chain_problems:
            builder.declare_chain(TABLE, self.chain.name)
            for spec in self.chain.rules:
                builder.append(TABLE, self.chain.name, spec)
        if jump_problems:
            add_jump_repair(builder, current, PARENT, self.chain.jump, position=JumpPosition.FIRST)
        if builder:
            self.runner.restore(builder.text())
        return chain_problems + jump_problems

    def cleanup(self) -> None:
        """Remove the chain and the jump to it; quiet when already gone."""
        self.runner.delete_chains(TABLE, [self.chain.name])

    def _drift(self, table: Table) -> list[str]:
        if not self.protocols:
            held = table.chains.get(self.chain.name)
            return [] if held is None else [f"{TABLE} {self.chain.name} present with no tunnel in use"]
        return self._chain_drift(table) + jump_drift(table, PARENT, self.chain.jump, position=JumpPosition.FIRST)

    def _chain_drift(self, table: Table) -> list[str]:
        held = table.chains.get(self.chain.name)
        if held is None:
            return [f"{TABLE} {self.chain.name}: chain missing"]
        if tuple(_numbered(rule) for rule in held.rules) != self.chain.rules:
            wanted = len(self.chain.rules)
            return [f"{TABLE} {self.chain.name}: {len(held.rules)} rule(s) differ from the {wanted} wanted"]
        return []


def _numbered(rule: tuple[str, ...]) -> tuple[str, ...]:
    """`rule` with a saved protocol name (`SAVED_PROTOCOL_NAMES`) back as its number."""
    return tuple(SAVED_PROTOCOL_NAMES.get(token, token) if index and rule[index - 1] == "-p" else token
                 for index, token in enumerate(rule))


def sync_tunnel_filters(filters: dict, host, route_managers: dict, report) -> None:
    """The agent's hook, at every sync: each routed family's filter (built at the first call, over
    the host's iptables of the family, or its nftables table in nftables mode) given the peers its route manager
    admitted (known, neither refused nor pending, projected onto the family), then ensured."""
    left_out = set(report.refused) | set(report.pending)
    for family, manager in route_managers.items():
        runner = host.iptables if family is IpFamily.V4 else host.iptables6
        own = (manager.local.public_ip,)
        if family not in filters and host.nft is not None:
            from netagent.noderoutes.tunnel_filter_nft import NftTunnelFilter
            filters[family] = NftTunnelFilter(nft=host.nft, settings=manager.settings, own=own, family=family)
        elif family not in filters and runner is not None:
            filters[family] = TunnelFilter(runner=runner, settings=manager.settings, own=own)
        if family not in filters:
            continue
        projected = [p.in_family(family) for p in manager.known_peers() if p.name not in left_out]
        filters[family].update(p.public_ip for p in projected
                               if isinstance(p, Peer) and p.public_ip.version == family.value)
        filters[family].ensure()

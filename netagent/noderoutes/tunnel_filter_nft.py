"""The tunnel source filter in nftables (`--proxy-mode nftables`, `HostAccess.nft`):
`tunnel_filter.py`'s behaviour in our own table `ip netagent-tunnel` (`ip6 netagent-tunnel`,
owned.NFT_TUNNEL_TABLE), no iptables rule at all.

The table holds one set and one base chain:
- `ADMITTED` (`ipv4_addr` / `ipv6_addr`): this node's and every admitted peer's underlay address;
- `INPUT`: type filter, hook input, priority `filter - 10` (-10): the mode's encapsulation
  (UDP to the VXLAN port; protocol 4, or 41 for ip6ip6) dropped unless its source is in
  `ADMITTED`, e.g. `udp dport 4789 ip saddr != @ADMITTED drop`: the protocol is matched first,
  so only tunnel packets look the set up. A drop is final whatever another table's input chain
  accepts; what we let through is left to the others.

`NftTunnelFilter` has `TunnelFilter`'s contract (`update`, `check`, `ensure`, `cleanup`): the
table read back (chain hook/type/priority/policy, set elements, rule comments carrying a hash of
their text) is compared with the rendering and the table replaced in one transaction only when
it drifted; with no tunnel in use the table is removed.
"""
from __future__ import annotations

import hashlib
import ipaddress
from collections.abc import Iterable
from typing import Any

from netagent.kernel import owned
from netagent.kernel.families import IpFamily
from netagent.kernel.nftables import listing, text
from netagent.kernel.nftables.runner import Nft
from netagent.noderoutes.routing.model import Mode, RoutingSettings
from netagent.noderoutes.tunnel_filter import IP_IN_IP, Address

TABLE = owned.NFT_TUNNEL_TABLE
CHAIN = "INPUT"
ADMITTED_SET = "ADMITTED"
PRIORITY = ("filter - 10", -10)


def nft_tunnel_rules(settings: RoutingSettings, family: IpFamily) -> tuple[tuple[str, str], ...]:
    """(statements, comment) of the chain; empty when no tunnel is in use."""
    modes = {settings.mode} | ({settings.auto_encap} if settings.mode is Mode.AUTO else set())
    matches = []
    if Mode.VXLAN in modes:
        matches.append(f"udp dport {text.port(settings.vxlan_port)}")
    if Mode.IPIP in modes:
        matches.append(f"meta l4proto {IP_IN_IP[family]}")
    statements = [f"{match} {family.nft} saddr != @{text.name(ADMITTED_SET)} drop" for match in matches]
    return tuple((s, _comment(s)) for s in statements)


def _comment(statements: str) -> str:
    digest = hashlib.sha256(statements.encode()).hexdigest()[:8]
    return text.safe_comment_text(f"netagent: tunnel packets only from admitted peers [{digest}]")


def render_tunnel_nft(family: IpFamily, rules: tuple[tuple[str, str], ...], admitted: Iterable[Address]) -> str:
    """One batch replacing the table (the `add` first makes the `delete` succeed when missing)."""
    table = f"{family.nft} {text.name(TABLE)}"
    lines = [f"add table {table}", f"delete table {table}", f"add table {table}",
             f"add set {table} {text.name(ADMITTED_SET)} {{ type {family.nft_address_type}; }}"]
    addresses = [text.address(str(a)) for a in admitted]
    if addresses:
        lines.append(f"add element {table} {text.name(ADMITTED_SET)} {text.element_block(addresses)}")
    lines.append(f"add chain {table} {text.name(CHAIN)} {{ type filter hook input priority {PRIORITY[0]}; "
                 f"policy accept; }}")
    for statements, comment in rules:
        lines.append(f"add rule {table} {CHAIN} {statements} comment {text.comment(comment)}")
    return "\n".join(lines) + "\n"


class NftTunnelFilter:
    """Keeps `ip netagent-tunnel` (`ip6 netagent-tunnel`) as wanted, through an `Nft`."""

    def __init__(self, *, nft: Nft, settings: RoutingSettings, own: Iterable[Address],
                 family: IpFamily = IpFamily.V4) -> None:
        self.nft = nft
        self.family = family
        self.rules = nft_tunnel_rules(settings, family)
        self.own = tuple(own)
        self.admitted: tuple[Address, ...] = ()
        self.update(())

    def update(self, peers: Iterable[Address]) -> None:
        """The admitted peers' underlay addresses of this sync."""
        self.admitted = tuple(sorted({ipaddress.ip_address(a) for a in (*self.own, *peers)
                                      if ipaddress.ip_address(a).version == self.family.value}, key=int))

    def check(self) -> list[str]:
        """What differs from the wanted state, one sentence per problem (empty: in sync)."""
        return self._drift(self.nft.list_table(self.family.nft, TABLE))

    def ensure(self) -> list[str]:
        """Repair whatever drifted; return what was repaired. Writes nothing when in sync."""
        problems = self.check()
        if problems and not self.rules:
            self.cleanup()
        elif problems:
            self.nft.apply(render_tunnel_nft(self.family, self.rules, self.admitted))
        return problems

    def cleanup(self) -> None:
        """Delete the table; quiet when gone."""
        if self.nft.list_table(self.family.nft, TABLE) is not None:
            self.nft.apply(f"delete table {self.family.nft} {text.name(TABLE)}\n")

    def _drift(self, objects: list[dict[str, Any]] | None) -> list[str]:
        where = f"table {self.family.nft} {TABLE}"
        if not self.rules:
            return [] if objects is None else [f"{where} present with no tunnel in use"]
        if objects is None:
            return [f"{where} missing"]
        problems = []
        held_set = listing.sets(objects).get(ADMITTED_SET)
        if held_set is None:
            problems.append(f"set {ADMITTED_SET} missing")
        elif sorted(listing.key_text(key) for key, _ in listing.elements(held_set)) != \
                sorted(listing.key_text(str(a)) for a in self.admitted):
            problems.append(f"set {ADMITTED_SET} holds other addresses than {[str(a) for a in self.admitted]}")
        chains = listing.chains(objects)
        chain = chains.get(CHAIN)
        spec = {"type": "filter", "hook": "input", "prio": PRIORITY[1], "policy": "accept"}
        if chain is None:
            problems.append(f"chain {CHAIN} missing")
        else:
            if {key: chain.get(key) for key in spec} != spec:
                problems.append(f"chain {CHAIN} is not {spec}")
            comments = [rule.get("comment") for rule in listing.rules(objects, CHAIN)]
            if comments != [comment for _, comment in self.rules]:
                problems.append(f"chain {CHAIN}: {len(comments)} rule(s) differ from the {len(self.rules)} wanted")
        if set(chains) - {CHAIN}:
            problems.append(f"chains not ours to keep: {sorted(set(chains) - {CHAIN})}")
        return problems

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

`NftTunnelFilter` has `TunnelFilter`'s contract (`update`, `check`, `ensure`, `cleanup`); it
only builds the table (`tunnel_table`, `kernel/nftables/model.py` values): the model renders it,
reads it back (chain hook/type/priority/policy, set elements, rule comments carrying a hash of
their text) and compares, and the table is replaced in one transaction only when it drifted;
with no tunnel in use the table is removed.
"""
from __future__ import annotations

import ipaddress
from collections.abc import Iterable

from netagent.kernel import owned
from netagent.kernel.families import IpFamily
from netagent.kernel.nftables import model, tables, text
from netagent.kernel.nftables.runner import Nft
from netagent.noderoutes.routing.model import Mode, RoutingSettings
from netagent.noderoutes.tunnel_filter import IP_IN_IP, Address

TABLE = owned.NFT_TUNNEL_TABLE
CHAIN = "INPUT"
ADMITTED_SET = "ADMITTED"
INPUT = model.BaseChain("filter", "input", -10, "filter - 10")
PURPOSE = "tunnel packets only from admitted peers"


def nft_tunnel_rules(settings: RoutingSettings, family: IpFamily) -> tuple[tuple[str, str | None], ...]:
    """(statements, comment) of the chain's rules; empty when no tunnel is in use."""
    return tuple((rule.statements, rule.comment) for rule in tunnel_rules(settings, family))


def tunnel_rules(settings: RoutingSettings, family: IpFamily) -> tuple[model.Rule, ...]:
    """The chain's rules; none when no tunnel is in use."""
    modes = {settings.mode} | ({settings.auto_encap} if settings.mode is Mode.AUTO else set())
    matches = []
    if Mode.VXLAN in modes:
        matches.append(f"udp dport {text.port(settings.vxlan_port)}")
    if Mode.IPIP in modes:
        matches.append(f"meta l4proto {IP_IN_IP[family]}")
    return tuple(model.digested_rule(f"{match} {family.nft} saddr != {model.ref(ADMITTED_SET)} drop", PURPOSE,
                                     sets=(ADMITTED_SET,)) for match in matches)


def tunnel_table(family: IpFamily, rules: tuple[model.Rule, ...], admitted: Iterable[Address]) -> model.Table:
    """The wanted table: the `ADMITTED` set and the `INPUT` chain."""
    elements = tuple(model.Element((text.address(str(a)),)) for a in admitted)
    return model.Table(family.nft, TABLE, (model.Chain(CHAIN, rules, INPUT),),
                       (model.Set(ADMITTED_SET, (family.nft_address_type,), (), elements),))


def render_tunnel_nft(family: IpFamily, rules: tuple[model.Rule, ...], admitted: Iterable[Address]) -> str:
    """One batch replacing the table (`model.render_table`)."""
    return model.render_table(tunnel_table(family, rules, admitted))


class NftTunnelFilter:
    """Keeps `ip netagent-tunnel` (`ip6 netagent-tunnel`) as wanted, through an `Nft`."""

    def __init__(self, *, nft: Nft, settings: RoutingSettings, own: Iterable[Address],
                 family: IpFamily = IpFamily.V4) -> None:
        self.nft = nft
        self.family = family
        self.rules = tunnel_rules(settings, family)
        self.own = tuple(own)
        self.admitted: tuple[Address, ...] = ()
        self._written: tuple[Address, ...] | None = None  # the members of the last ensure
        self.update(())

    def update(self, peers: Iterable[Address]) -> None:
        """The admitted peers' underlay addresses of this sync."""
        self.admitted = tuple(sorted({ipaddress.ip_address(a) for a in (*self.own, *peers)
                                      if self.family.holds(ipaddress.ip_address(a))}, key=int))

    def wanted(self) -> model.Table:
        return tunnel_table(self.family, self.rules, self.admitted)

    def check(self) -> list[str]:
        """What differs from the wanted state, one sentence per problem (empty: in sync)."""
        if not self.rules:
            held = self.nft.list_table(self.family.nft, TABLE)
            return [] if held is None else [f"table {self.family.nft} {TABLE} present with no tunnel in use"]
        return tables.table_drift(self.nft, self.wanted())

    def ensure(self) -> list[str]:
        """Repair whatever drifted; return what was repaired. Writes nothing when in sync."""
        if not self.rules:
            problems = self.check()
            self.cleanup()
            self._written = self.admitted
            return problems
        self._written = None
        problems = tables.ensure_table(self.nft, self.wanted())
        self._written = self.admitted
        return problems

    def ensure_members(self) -> list[str]:
        """A partial sync's write: nothing when the members are those of the last `ensure` (nothing
        read; with no tunnel, nothing after the `ensure` that removed the table), else `ensure`."""
        return [] if self._written is not None and (self._written == self.admitted or not self.rules) \
            else self.ensure()

    def cleanup(self) -> None:
        """Delete the table; quiet when gone."""
        tables.remove_table(self.nft, self.family.nft, TABLE)

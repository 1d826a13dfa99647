"""Tunnel source filter (issue 29 item 5): the tunnel devices decapsulate only what admitted
peers send.

A VXLAN socket or an IPIP/ip6tnl device accepts an encapsulated packet from any underlay host;
the inner packet then enters the node as if it came from a peer, any pod source address
included, and passes another namespace's ingress policy. So in iptables filter INPUT (before
the UDP socket or the tunnel handler decapsulates: both run after the local-in hook) one chain
of ours, `NETAGENT-TUNNEL-IN` (`owned.TUNNEL_FILTER_CHAIN`), jumped to first, drops the mode's
encapsulated packets whose source is not in our ipset of admitted underlay addresses:

  -p udp --dport <VXLAN port> -m set ! --match-set <set> src -j DROP    vxlan, auto
  -p <4 | 41> -m set ! --match-set <set> src -j DROP                    ipip, auto over IPIP (IPv6: ip6ip6, 41)

The set (`owned.TUNNEL_FILTER_SET`, hash:ip family inet; `TUNNEL_FILTER_SET6`, family inet6, for
ip6tables and the IPv6 underlay of `na-vxlan6`, `na-ipip6`) holds every admitted peer's and this
node's own underlay address. So a packet that is no tunnel packet walks one or two protocol
matches, a tunnel packet adds one hash lookup, whatever the number of peers (5,000 nodes), and
the chain's rules are constant for a mode: a peer change adds or deletes set members (one
`ipset restore`). `maxelem` leaves room to double (`set_capacity`); a set that outgrows it is
refilled at its new size and swapped in (`ipset.replace_set`), so no rule ever changes for it.
Modes without a tunnel (host-gw, bgp) keep neither chain nor set (`tunnel_protocols` is empty).
The sets live beside the runner's iptables (`ipset_beside`: `HostAccess` carries no `Ipset`).

`TunnelFilter` has `MasqueradeManager`'s contract: `check()`, `ensure()` (writes only what
drifted: members, chain, jump), `cleanup()` (chain and jump, then the set no rule names any
more); `update(peers)` sets the wanted peers of this sync. Every route sync (full and partial)
hands its admitted peers to `TunnelFilterLoop`, whose own runner then writes the filters at once
(a peer added or removed changes the set within milliseconds, without delaying the next route
write), and a full sync repairs drift; a partial sync writes only the members
changed since the last write (`ensure_members`), reading nothing, so a Node change costs one
`ipset restore` when its address is new and no process at all otherwise. `netagent cleanup` removes the chain with
every other `NETAGENT-` chain, then the sets. In nftables mode (`HostAccess.nft`), where no
iptables rule of ours may exist, the same filter is the table of `tunnel_filter_nft.py`.
"""
from __future__ import annotations

import ipaddress
import threading
from collections.abc import Iterable
from dataclasses import dataclass

from netagent.infra.sync_runner import SyncKind, SyncRunner
from netagent.kernel import owned
from netagent.kernel.families import IpFamily
from netagent.kernel.ipset.model import IpsetInfo, IpsetNotInstalled, IpsetSpec, IpsetType
from netagent.kernel.ipset.runner import Ipset, IpsetRunner, replace_set
from netagent.kernel.iptables.restore_format import RestoreBuilder, Table, canonical_spec
from netagent.kernel.iptables.runner import (
    Iptables,
    IptablesRunner,
    JumpPosition,
    add_jump_repair,
    jump_drift,
)
from netagent.noderoutes.masquerade import OwnedChain
from netagent.noderoutes.routing.model import Mode, Peer, RoutingSettings

TABLE, PARENT = "filter", "INPUT"
JUMP_COMMENT = "netagent: tunnel packets only from admitted peers"
DROP_COMMENT = "netagent: tunnel packet from a non-peer"
IP_IN_IP = {IpFamily.V4: "4", IpFamily.V6: "41"}  # IPv4-in-IPv4; IPv6-in-IPv6 (ip6tnl ip6ip6)
# iptables-save names a protocol number by /etc/protocols when it lists it; we write numbers (a
# minimal image may have no /etc/protocols) and read both spellings back as the number
SAVED_PROTOCOL_NAMES = {"ipencap": "4", "ipv6": "41"}
SETS = {IpFamily.V4: owned.TUNNEL_FILTER_SET, IpFamily.V6: owned.TUNNEL_FILTER_SET6}
SCRATCH_SUFFIX = "-NEW"            # `replace_set`'s scratch set: the set's name + this
MIN_CAPACITY = 1024

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


def tunnel_chain(*, family: IpFamily, protocols: tuple[tuple[str, ...], ...]) -> OwnedChain:
    """The wanted chain: each of `protocols` dropped unless its source is in the family's set."""
    rules = tuple(canonical_spec((*match, "-m", "set", "!", "--match-set", SETS[family], "src",
                                  "-m", "comment", "--comment", DROP_COMMENT, "-j", "DROP")) for match in protocols)
    return OwnedChain(TABLE, owned.TUNNEL_FILTER_CHAIN, PARENT, JUMP_COMMENT, rules)


def admitted_members(family: IpFamily, addresses: Iterable[Address]) -> frozenset[str]:
    """The set's members: `addresses` of `family`, spelled as `ipset save` prints them."""
    return frozenset(str(a) for a in map(ipaddress.ip_address, addresses) if family.holds(a))


def set_capacity(members: int) -> int:
    """The set's `maxelem` for `members` addresses: a power of two leaving room to double."""
    capacity = MIN_CAPACITY
    while capacity < 2 * members:
        capacity *= 2
    return capacity


def ipset_beside(runner: Iptables) -> Ipset:
    """The sets of the namespace `runner` writes: the `ipset` tool, run like the runner's
    binaries (its `exec_prefix`); beside an in-memory iptables (a test's `FakeIptables`),
    in-memory sets that its `--match-set` rules hold."""
    if isinstance(runner, IptablesRunner):
        return IpsetRunner(exec_prefix=runner.exec_prefix, timeout=runner.timeout)
    from netagent.kernel.ipset.fake import FakeIpset, iptables_references
    return FakeIpset(in_use=iptables_references(runner))


class TunnelFilter:
    """Keeps one family's tunnel source chain, its jump and its set as wanted, through an
    `Iptables` and an `Ipset` (by default `ipset_beside(runner)`)."""

    def __init__(self, *, runner: Iptables, settings: RoutingSettings, own: Iterable[Address],
                 ipset: Ipset | None = None) -> None:
        self.runner = runner
        self.family = runner.family
        self.ipset = ipset if ipset is not None else ipset_beside(runner)
        self.protocols = tunnel_protocols(settings, self.family)
        self.own = tuple(own)
        self.chain = tunnel_chain(family=self.family, protocols=self.protocols)
        self.set_name = SETS[self.family]
        self.admitted = admitted_members(self.family, self.own)
        self._written: tuple[frozenset[str], int] | None = None  # (members, maxelem) after the last write
    def update(self, peers: Iterable[Address]) -> None:
        """The admitted peers' underlay addresses of this sync."""
        self.admitted = admitted_members(self.family, (*self.own, *peers))

    @property
    def set_spec(self) -> IpsetSpec:
        return IpsetSpec(self.set_name, IpsetType.HASH_IP, comment="admitted tunnel sources",
                         max_elements=set_capacity(len(self.admitted)), family=self.family.ipset)

    def check(self) -> list[str]:
        """What differs from the wanted state, one sentence per problem (empty: in sync)."""
        if not self.protocols:
            return self._leftovers()
        table = self.runner.table(TABLE)
        return (self._set_drift(self.ipset.read(self.set_name))[0] + self._chain_drift(table)
                + jump_drift(table, PARENT, self.chain.jump, position=JumpPosition.FIRST))

    def ensure(self) -> list[str]:
        """Repair whatever drifted (the set first, so a rewritten rule never names a missing
        or empty set); return what was repaired. Writes nothing when in sync; with no tunnel in
        use, removes the chain and the set instead."""
        if not self.protocols:
            problems = self._leftovers()
            if problems:
                self.cleanup()
            self._written = (frozenset(), 0)
            return problems
        set_problems = self._ensure_set()
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
        return set_problems + chain_problems + jump_problems

    def ensure_members(self) -> list[str]:
        """A partial sync's write, from memory: the members changed since the last `ensure` or
        `ensure_members`, in one `ipset restore`, with nothing read back (a full sync's `ensure`
        repairs drift). `ensure` when there is no such memory or the set would outgrow its maxelem."""
        written = self._written
        if written is not None and not self.protocols:  # no tunnel: `ensure` removed ours; a full sync looks again
            return []
        if written is None or len(self.admitted) > written[1]:
            return self.ensure()
        add, delete = self.admitted - written[0], written[0] - self.admitted
        if not add and not delete:
            return []
        self._written = None  # a failed write leaves no memory: the next call reads and repairs
        self.ipset.update_many({self.set_name: (add, delete)}, types={self.set_name: IpsetType.HASH_IP})
        self._written = (self.admitted, written[1])
        return [f"ipset {self.set_name}: {len(add)} admitted, {len(delete)} no longer"]

    def cleanup(self) -> None:
        """Remove the chain and the jump to it, then the set (and a refill's leftover scratch
        set); quiet when already gone, or when there is no `ipset` tool (so no set of ours)."""
        self.runner.delete_chains(TABLE, [self.chain.name])
        try:
            for name in (self.set_name, self.set_name + SCRATCH_SUFFIX):
                self.ipset.destroy(name)
        except IpsetNotInstalled:
            pass

    def _leftovers(self) -> list[str]:
        """With no tunnel in use: what of ours is still there."""
        problems = []
        if self.chain.name in self.runner.table(TABLE).chains:
            problems.append(f"{TABLE} {self.chain.name} present with no tunnel in use")
        try:
            held = self.ipset.describe(self.set_name) is not None
        except IpsetNotInstalled:
            held = False
        return problems + ([f"ipset {self.set_name} present with no tunnel in use"] if held else [])

    def _set_drift(self, read: tuple[IpsetInfo, frozenset[str]] | None) -> tuple[list[str], str, frozenset[str]]:
        """(problems, repair, members held) of what `Ipset.read` found: `repair` is "" (in sync,
        or members to add and delete), "fill" (missing or too small: `replace_set`) or
        "recreate" (wrong type or family)."""
        name = self.set_name
        if read is None:
            return [f"ipset {name} missing"], "fill", frozenset()
        info, held = read
        if info.type != IpsetType.HASH_IP or info.family != self.family.ipset:
            held_type = getattr(info.type, "value", info.type)
            return [f"ipset {name} is {held_type} family {info.family}, not hash:ip family "
                    f"{self.family.ipset}"], "recreate", held
        if info.max_elements is not None and info.max_elements < len(self.admitted):
            return [f"ipset {name}: maxelem {info.max_elements} is below the {len(self.admitted)} admitted"], \
                "fill", held
        missing, extra = self.admitted - held, held - self.admitted
        problems = [f"ipset {name}: {len(missing)} admitted address(es) missing"] if missing else []
        problems += [f"ipset {name}: {len(extra)} address(es) no longer admitted"] if extra else []
        return problems, "", held

    def _ensure_set(self) -> list[str]:
        """Members added and deleted in place (one `ipset restore`); a missing or too small set
        filled whole (`replace_set`); one of another kind recreated once no rule names it."""
        found = self.ipset.read(self.set_name)
        problems, repair, held = self._set_drift(found)
        if repair == "recreate":   # `ipset swap` needs the same type: the rules naming it go first
            self.runner.delete_chains(TABLE, [self.chain.name])
            self.ipset.destroy(self.set_name)
        self._written = None
        if repair:
            replace_set(self.ipset, self.set_spec, self.admitted, scratch=self.set_name + SCRATCH_SUFFIX)
        elif problems:
            self.ipset.update_many({self.set_name: (self.admitted - held, held - self.admitted)},
                                   types={self.set_name: IpsetType.HASH_IP})
        capacity = found[0].max_elements if found is not None and not repair else None
        self._written = (self.admitted, capacity if capacity is not None else self.set_spec.max_elements)
        return problems

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


@dataclass(frozen=True)
class FilterInputs:
    """What one family's filter admits, as a route sync left it: handed to the filter's own thread."""
    own: Address               # this node's underlay address of the family
    settings: RoutingSettings
    peers: tuple[Peer, ...]    # every peer the route manager knows
    left_out: frozenset[str]   # those it refused or holds pending


class TunnelFilterLoop:
    """The filters of every routed family, written by their own runner ("tunnel-filter"), so a
    Node change's route never waits for the filter's `ipset restore` (a process, 10 to 20 ms).
    The route sync `hand`s over what each family admits (immutable inputs, no shared state) and
    asks for a run of its own kind; the runner coalesces, retries and resyncs as every runner does."""

    def __init__(self, host, *, resync_interval: float) -> None:
        self.filters: dict = {}  # IpFamily -> TunnelFilter | NftTunnelFilter, built at the first run
        self.host = host
        self._lock = threading.Lock()
        self._inputs: dict[IpFamily, FilterInputs] | None = None
        self.runner = SyncRunner(name="tunnel-filter", sync=self.sync, min_interval=0.0,
                                 max_interval=resync_interval, retry_interval=1.0)

    def hand(self, route_managers: dict, report, kind: SyncKind) -> None:
        """From the route sync thread: the peers each family's manager knows, and who is left out."""
        left_out = frozenset(report.refused) | frozenset(report.pending)
        inputs = {family: FilterInputs(manager.local.public_ip, manager.settings, tuple(manager.known_peers()),
                                       left_out) for family, manager in route_managers.items()}
        with self._lock:
            self._inputs = inputs
        self.runner.request(kind)

    def sync(self, kind: SyncKind) -> None:
        with self._lock:
            inputs = self._inputs
        if inputs is not None:
            sync_tunnel_filters(self.filters, self.host, inputs, kind)


def sync_tunnel_filters(filters: dict, host, inputs: dict[IpFamily, FilterInputs],
                        kind: SyncKind = SyncKind.FULL) -> None:
    """Each routed family's filter (built at the first call, over the host's iptables of the family
    and the ipsets beside it, or its nftables table in nftables mode) given the peers its route
    manager admitted (known, neither refused nor pending, projected onto the family), then ensured
    (FULL: read back and repaired) or brought up to date from memory (PARTIAL: `ensure_members`)."""
    for family, wanted in inputs.items():
        if kind is SyncKind.PARTIAL and family in filters and not tunnel_protocols(wanted.settings, family):
            continue  # no tunnel (host-gw, bgp): nothing follows the peers; a full sync looks for leftovers
        runner = host.iptables.get(family)
        own = (wanted.own,)
        if family not in filters and host.nft is not None:
            from netagent.noderoutes.tunnel_filter_nft import NftTunnelFilter
            filters[family] = NftTunnelFilter(nft=host.nft, settings=wanted.settings, own=own, family=family)
        elif family not in filters and runner is not None:
            filters[family] = TunnelFilter(runner=runner, settings=wanted.settings, own=own)
        if family not in filters:
            continue
        projected = [p.in_family(family) for p in wanted.peers if p.name not in wanted.left_out]
        filters[family].update(p.public_ip for p in projected
                               if isinstance(p, Peer) and family.holds(p.public_ip))
        if kind is SyncKind.FULL:
            filters[family].ensure()
        else:
            filters[family].ensure_members()

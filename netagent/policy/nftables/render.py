"""The nftables form of a `NodePlan` (`--proxy-mode nftables`), rendered purely: table
`ip netagent-policy` (kernel/owned.py's NFT_POLICY_TABLE; `ip6` the same shape), in which every
object is ours, as a `model.Table` of kernel/nftables/ (`render_nft` returns it in an
`NftPolicy`, beside the pods it had to leave closed).

    chain NETAGENT-NP-FORWARD    type filter hook forward priority filter - 5; policy accept;
      ct state established,related return        replies and ICMP errors of allowed connections
      icmpv6 type { nd-neighbor-solicit, ... } ip6 hoplimit 255 return   ip6 only: neighbour discovery
      icmpv6 type { mld-listener-query, ... } ip6 hoplimit 1 return      and MLD (`ndp.py`)
      ip saddr <pod CIDR> ip saddr != @NETAGENT-NP-KNOWN drop     (and daddr): new pods closed
      ip saddr vmap @NETAGENT-NP-EGRESS          bridge mode; routed mode: iifname vmap
      ip daddr vmap @NETAGENT-NP-INGRESS         bridge mode; routed mode: oifname vmap
    chain NETAGENT-NPE-<hash> / NETAGENT-NPI-<hash>   one per isolated pod and direction:
      counter (a header: whose chain, which policies), allow rules `... return`, a rate-limited
      `log group` (the flow records: prefix the chain's name), `counter drop`

One lookup per packet: a verdict map keyed by the pod's address (bridge mode) or its host veth
(routed mode) jumps into the pod's chain; a pod that is not isolated has no element and costs
nothing but the lookup. Bridge mode keys by address because nftables has no physdev match for
br_netfilter's bridged packets (the bridge is their `iifname`/`oifname`); the address is also
what routed-into-the-bridge packets carry, so one element per pod and direction covers both.
The KNOWN set holds every programmed local pod (each element's comment its `ns/name`: the pod
directory `netagent status policy` reads), and an address of a local pod CIDR not in it is
dropped, so a new pod is closed until the sync that covers it. Selectors are named sets: pod
addresses (`ipv4_addr`), ipBlock except lists and plain ipBlocks (`flags interval`, written as
collapsed networks, so no two elements overlap and what the kernel lists back compares equal),
egress named ports (`ipv4_addr . inet_proto . inet_service`). Sets carry no `size`: an nft set
without one has no maximum, so a growing selector never needs a new set as an ipset does.

The hook priority, `filter - 5` (-5): forward runs after prerouting, so every Service packet
is seen after its DNAT (kube-proxy's and ours are at dstnat, -100), and after kube-proxy's own
filter chains (dstnat - 10, -110: its rejects of Services without endpoints answer first), and
before iptables-nft's filter FORWARD (priority filter, 0) and anyone else's at 0, so a packet a
policy denies is dropped (and counted) here whatever other tables say. Only drops are final
across base chains: our `return`s (an accept of this base chain) leave every other table's
verdict to it, which is all a policy needs, since it only takes away.

Rules are recognised by their comments: `model.digested_rule`'s `netagent: <purpose> [digest]`,
the purpose in words (a pod chain's header: direction, address, pod and the policies; an allow:
its policy rule; the deny), the digest that of the rule's statements, so a changed rule has a
changed comment; `model.purpose_of` gives the words back (`netagent status policy`). Every
string reaching nft text goes through kernel/nftables/text.py; the table's differ and batch
are kernel/nftables/changes.py's (dataplane.py). A pod that cannot be rendered, or whose
rules would use an except set that cannot be written, is `refused`: not in KNOWN, so it stays
closed.
"""
from __future__ import annotations

import functools
import ipaddress
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from netagent.kernel import nflog, owned
from netagent.kernel.families import IpFamily
from netagent.kernel.nftables import model
from netagent.kernel.nftables import text as nft_text
from netagent.kernel.nftables.model import BaseChain, Chain, Element, Map, Rule, Set, Table
from netagent.kernel.pod_attachment import PodAttachment
from netagent.policy import ndp
from netagent.policy.pod_plan import PodAdded, PodRemoved
from netagent.policy.semantics import (Allow, CidrMatch, Member, NodePlan, PodPlan, PortMatch, PortMember, SetKind,
                                       SetRef, member_address)
from netagent.policy.shared import (INTERFACE_NAME, RenderSettings, checked_sets, pod_chain, pod_directions,
                                    removable_chains)

TABLE = owned.NFT_POLICY_TABLE
BASE_CHAIN = owned.POLICY_CHAIN
PRIORITY = -5                                  # "filter - 5": see the module docstring
HOOK = BaseChain("filter", "forward", PRIORITY)
EGRESS_MAP = owned.POLICY_PREFIX + "-EGRESS"   # source address / input veth -> jump egress chain
INGRESS_MAP = owned.POLICY_PREFIX + "-INGRESS"  # destination address / output veth -> jump ingress chain
KNOWN_SET = owned.POLICY_KNOWN_SET
HEADER_WORDS = ("ingress", "egress")           # a pod chain's header purpose starts with its direction


@dataclass(frozen=True)
class TableIndex:
    """An `NftPolicy` table's lookups by name: what the one-pod renders and `removable_chains`
    read. `of` builds them from a table (a walk of every pod's objects); a one-pod render
    derives the next from the previous in a few changes."""
    chains: dict[str, tuple[Rule, ...]]        # the pod chains' rules (the base chain left out)
    sets: dict[str, Set | Map]                 # the selector sets (KNOWN and the verdict maps left out)
    known: dict[str, str]                      # programmed local pod address -> its KNOWN comment (ns/name)
    egress: dict[str, str]                     # EGRESS_MAP: address or host interface -> its pod chain
    ingress: dict[str, str]

    @classmethod
    def of(cls, table: Table) -> TableIndex:
        def elements(name: str) -> tuple[Element, ...]:
            found = table.set(name)
            return () if found is None else found.elements
        return cls({chain.name: chain.rules for chain in table.chains if chain.base is None},
                   {entry.name: entry for entry in table.sets if entry.name not in (KNOWN_SET, EGRESS_MAP, INGRESS_MAP)},
                   {element.key[0]: element.comment or "" for element in elements(KNOWN_SET)},
                   _jumps(elements(EGRESS_MAP)), _jumps(elements(INGRESS_MAP)))


@dataclass(frozen=True)
class NftPolicy:
    """What the plan asks of the policy table (`table`), the local pods left out of it, and the
    table's lookups (`index`; `NftPolicy.of` builds them)."""
    table: Table
    pending: tuple[str, ...]                   # local pods left closed: no host interface found
    refused: tuple[str, ...]                   # why local pods were left closed
    index: TableIndex = field(compare=False, repr=False)

    @classmethod
    def of(cls, table: Table, *, pending: tuple[str, ...] = (), refused: tuple[str, ...] = ()) -> NftPolicy:
        return cls(table, pending, refused, TableIndex.of(table))

    @property
    def family(self) -> IpFamily:
        return IpFamily.V4 if self.table.family == IpFamily.V4.nft else IpFamily.V6

    @property
    def chains(self) -> dict[str, tuple[Rule, ...]]:
        return self.index.chains

    @property
    def base(self) -> tuple[Rule, ...]:
        chain = self.table.chain(BASE_CHAIN)
        return () if chain is None else chain.rules

    @property
    def sets(self) -> dict[str, Set | Map]:
        return self.index.sets

    @property
    def known(self) -> dict[str, str]:
        return self.index.known

    @property
    def egress(self) -> dict[str, str]:
        return self.index.egress

    @property
    def ingress(self) -> dict[str, str]:
        return self.index.ingress

    @property
    def key_type(self) -> str:
        """The verdict maps' key: an address type (bridge mode) or `ifname` (routed)."""
        found = self.table.set(EGRESS_MAP)
        return found.key_type[0] if found is not None else self.family.nft_address_type


def _jumps(elements: tuple[Element, ...]) -> dict[str, str]:
    return {element.key[0].strip('"'): (element.value or "").removeprefix("jump ") for element in elements}


def set_type(kind: SetKind, family: IpFamily) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(key type, flags) of a selector set of `kind`."""
    if kind is SetKind.NAMED:
        return (family.nft_address_type, "inet_proto", "inet_service"), ()
    return (family.nft_address_type,), ("interval",) if kind in (SetKind.EXCEPT, SetKind.NETS) else ()


def element_key(kind: SetKind, member: Member) -> tuple[str, ...]:
    """A checked set member (shared.py's `checked_sets`) as an nft key, one part per datatype,
    through kernel/nftables/text.py: an address, a network, or a named port's (addr, proto, port)."""
    if isinstance(member, PortMember):
        return (nft_text.address(member.address), nft_text.protocol(member.protocol), nft_text.port(member.port))
    if kind is SetKind.PODS:
        return (nft_text.address(member),)
    return (nft_text.network(str(ipaddress.ip_network(member, strict=False))),)


def collapsed(networks: frozenset[str] | set[str]) -> frozenset[str]:
    """An interval set's members as the fewest non-overlapping networks."""
    parsed = [ipaddress.ip_network(n) for n in networks]
    v4 = ipaddress.collapse_addresses(n for n in parsed if isinstance(n, ipaddress.IPv4Network))
    v6 = ipaddress.collapse_addresses(n for n in parsed if isinstance(n, ipaddress.IPv6Network))
    return frozenset(str(net) for net in (*v4, *v6))


def _peer(peer: SetRef | CidrMatch | None, side: str, family: IpFamily) -> tuple[list[str], list[str]]:
    """(matches, sets named) of an allow's peer."""
    if peer is None:
        return [], []
    if isinstance(peer, SetRef):
        return [f"{family.nft} {side} {model.ref(peer.name)}"], [peer.name]
    match = [] if peer.cidr.endswith("/0") else [f"{family.nft} {side} {nft_text.network(peer.cidr)}"]
    if peer.excepts is None:
        return match, []
    return [*match, f"{family.nft} {side} != {model.ref(peer.excepts.name)}"], [peer.excepts.name]


def _port(port: PortMatch | None) -> list[str]:
    if port is None:
        return []
    protocol = nft_text.protocol(port.protocol.value)
    if port.first is None:
        return [f"meta l4proto {protocol}"]
    first = nft_text.port(port.first)
    ports = first if port.last in (None, port.first) else f"{first}-{nft_text.port(port.last or 0)}"
    return [f"meta l4proto {protocol} th dport {ports}"]


def _allow_rule(allow: Allow, *, ingress: bool, family: IpFamily) -> Rule:
    match, sets = _peer(allow.peer, "saddr" if ingress else "daddr", family)
    match += _port(allow.port)
    if allow.named is not None:
        match.append(f"{family.nft} daddr . meta l4proto . th dport {model.ref(allow.named.name)}")
        sets.append(allow.named.name)
    return model.digested_rule(" ".join([*match, "return"]), f"allow {allow.origin}", sets=sets)


def header_text(pod: PodPlan, *, ingress: bool) -> str:
    """The header's purpose (the address before the key, so a long key is what gets cut)."""
    policies = pod.ingress_policies if ingress else pod.egress_policies
    return f"{'ingress' if ingress else 'egress'} {pod.ip} {pod.key} selected by {','.join(policies)}"


@functools.lru_cache(maxsize=16384)
def render_pod_chain(allows: tuple[Allow, ...], *, pod: PodPlan, ingress: bool,
                     family: IpFamily = IpFamily.V4) -> tuple[Rule, ...]:
    """A pod chain's rules; cached, since a sync re-renders every pod and most chains do not
    change (and the differ then finds the same objects)."""
    rules = [model.digested_rule("counter", header_text(pod, ingress=ingress))]
    rules += [_allow_rule(allow, ingress=ingress, family=family) for allow in allows]
    word = "ingress to" if ingress else "egress from"
    rules.append(model.digested_rule(_log_statement(pod, ingress=ingress), f"log denied {pod.key}"))
    rules.append(model.digested_rule("counter drop", f"deny {word} {pod.key}"))
    return tuple(rules)


def _log_statement(pod: PodPlan, *, ingress: bool) -> str:
    """What reaches the drop first goes to the policy's nflog group (at most nflog.LOG_RATE a
    second per chain), prefixed with the chain's name (quoted through text.py), from which
    `netagent flows` names the pod and policies (policy/flows.py)."""
    chain = pod_chain(owned.POLICY_INGRESS_PREFIX if ingress else owned.POLICY_EGRESS_PREFIX, pod.key)
    return nflog.nft_log(chain)


@functools.lru_cache(maxsize=64)
def _base_chain(settings: RenderSettings, family: IpFamily) -> Chain:
    known = model.ref(KNOWN_SET)
    rules = [model.digested_rule("ct state established,related return", "replies of allowed connections")]
    rules += [model.digested_rule(body, "IPv6 neighbour discovery and MLD") for body in ndp.nft_bodies(family)]
    for cidr in settings.local_cidrs:
        network = nft_text.network(str(ipaddress.ip_network(cidr, strict=False)))
        for side in ("saddr", "daddr"):
            rules.append(model.digested_rule(f"{family.nft} {side} {network} {family.nft} {side} != {known} drop",
                                             "pod not programmed yet", sets=(KNOWN_SET,)))
    if settings.mode is PodAttachment.ROUTED:
        egress, ingress = "iifname", "oifname"
    else:
        egress, ingress = f"{family.nft} saddr", f"{family.nft} daddr"
    rules.append(model.digested_rule(f"{egress} vmap {model.ref(EGRESS_MAP)}", "isolated pods' egress",
                                     sets=(EGRESS_MAP,)))
    rules.append(model.digested_rule(f"{ingress} vmap {model.ref(INGRESS_MAP)}", "isolated pods' ingress",
                                     sets=(INGRESS_MAP,)))
    return Chain(BASE_CHAIN, tuple(rules), HOOK)


@dataclass(frozen=True)
class _Pod:
    """One pod's pieces of the table (cached per pod: most pods are as before)."""
    chains: tuple[tuple[Chain, bool], ...]     # (its chain, ingress?) per isolated direction
    refs: frozenset[SetRef]                    # the sets its rules use
    known: Element                             # its KNOWN element: address, comment ns/name
    jumps: tuple[tuple[Element, bool], ...]    # (its verdict map element, ingress?) per chain


def _map_key(interface: str, address: str) -> tuple[str, ...]:
    return (nft_text.interface(interface),) if interface else (address,)


@functools.lru_cache(maxsize=16384)
def _render_pod(pod: PodPlan, interface: str, family: IpFamily, broken: frozenset[SetRef]) -> _Pod:
    """One pod's chains, sets used and elements; raises when it cannot be rendered."""
    if interface and not INTERFACE_NAME.match(interface):
        raise ValueError(f"host interface {interface[:40]!r} is not an interface name")
    address = nft_text.address(pod.ip)
    directions, refs = pod_directions(pod)
    if refs & broken:
        raise ValueError(f"it uses a set that cannot be written ({sorted(r.key[:60] for r in refs & broken)})")
    chains = tuple((Chain(chain, render_pod_chain(allows, pod=pod, ingress=ingress, family=family)), ingress)
                   for allows, chain, ingress in directions)
    key = _map_key(interface, address)
    jumps = tuple((Element(key, nft_text.jump(chain.name)), ingress) for chain, ingress in chains)
    return _Pod(chains, frozenset(refs), Element((address,), comment=nft_text.safe_comment_text(pod.key)), jumps)


@functools.lru_cache(maxsize=16384)
def _nft_set(ref: SetRef, members: frozenset[Member], family: IpFamily) -> Set:
    """A selector set; cached, since most sets keep their members from sync to sync."""
    key_type, flags = set_type(ref.kind, family)
    if flags:
        members = collapsed(frozenset(member_address(member) for member in members))
    return Set(ref.name, key_type, flags, tuple(Element(element_key(ref.kind, m)) for m in sorted(members)))


def _table(family: IpFamily, base: Chain, chains: list[Chain], sets: list[Set | Map], known: list[Element],
           egress: list[Element], ingress: list[Element], key_type: str) -> Table:
    return Table(family.nft, TABLE, (base, *chains), (
        *sets,
        Set(KNOWN_SET, (family.nft_address_type,), elements=tuple(known)),
        Map(EGRESS_MAP, (key_type,), "verdict", elements=tuple(egress)),
        Map(INGRESS_MAP, (key_type,), "verdict", elements=tuple(ingress))))


_NOTHING: frozenset[SetRef] = frozenset()


def render_nft(plan: NodePlan, *, settings: RenderSettings, interface_of: Callable[[PodPlan], str | None],
               family: IpFamily = IpFamily.V4) -> NftPolicy:
    """Everything the plan asks of the table. Routed mode keys the maps by host veth: a pod
    whose veth is unknown is left out (and out of KNOWN: it stays closed) and `pending`."""
    refused: list[str] = []
    members, broken = checked_sets(plan, refused)
    frozen_broken = frozenset(broken) if broken else _NOTHING
    chains: list[Chain] = []
    known: list[Element] = []
    jumps: tuple[list[Element], list[Element]] = ([], [])
    pending: list[str] = []
    used: set[SetRef] = set()
    routed = settings.mode is PodAttachment.ROUTED
    for pod in plan.pods:
        try:
            interface = interface_of(pod) if pod.isolated and routed else ""
            if interface is None:
                pending.append(pod.key)
                continue
            rendered = _render_pod(pod, interface, family, frozen_broken)
        except Exception as error:     # the guard: this pod stays closed (not in KNOWN), the others go on
            refused.append(f"pod {pod.key}: cannot be rendered ({type(error).__name__}: {str(error)[:160]}); "
                           f"it stays closed")
            continue
        known.append(rendered.known)
        chains.extend(chain for chain, _ in rendered.chains)
        for element, ingress in rendered.jumps:
            jumps[ingress].append(element)
        used.update(rendered.refs)
    sets: list[Set | Map] = [_nft_set(ref, held, family) for ref, held in members.items() if ref in used]
    table = _table(family, _base_chain(settings, family), chains, sets, known, jumps[False], jumps[True],
                   "ifname" if routed else family.nft_address_type)
    return NftPolicy.of(table, pending=tuple(pending), refused=tuple(refused))


def render_nft_with_pod(previous: NftPolicy, added: PodAdded, *, settings: RenderSettings,
                        interface_of: Callable[[PodPlan], str | None],
                        family: IpFamily = IpFamily.V4) -> NftPolicy | None:
    """`previous` (`render_nft` of the plan without the pod) with `added.pod`: what `render_nft(added.plan)`
    gives, computed from the pod's own pieces (its chains, map elements, KNOWN element, and its
    address in the sets it joined). None when the pod would be pending or refused, or a set
    member could not be written: the full render says why."""
    pod = added.pod
    if previous.refused or previous.family is not family:
        return None
    interface = interface_of(pod) if pod.isolated and settings.mode is PodAttachment.ROUTED else ""
    if interface is None:
        return None
    rendered = _render_pod(pod, interface, family, _NOTHING)
    if rendered.known.key[0] in previous.known or any(
            element.key[0].strip('"') in (previous.ingress if ingress else previous.egress)
            for element, ingress in rendered.jumps):
        return None
    held = previous.sets
    grown = {ref: frozenset((pod.ip,)) for ref in added.grown if ref.name in held}
    new = {ref: members for ref, members in added.new.items() if ref in rendered.refs and ref.name not in held}
    refused: list[str] = []
    members, broken = checked_sets(NodePlan((), {**grown, **new}), refused)
    if refused or broken or any(ref.name not in held and ref not in new for ref in rendered.refs):
        return None
    replaced: dict[str, Set | Map] = {}
    for ref in grown:
        entry = held[ref.name]
        if entry.flags:
            return None                 # an interval set would need collapsing again: the full render
        replaced[ref.name] = replace(entry, elements=(*entry.elements,
                                                      *(Element(element_key(ref.kind, m)) for m in sorted(members[ref]))))
    table = previous.table
    made = {ref.name: _nft_set(ref, members[ref], family) for ref in new}
    sets = [replaced.get(entry.name, entry) for entry in table.sets] if replaced else list(table.sets)
    sets[-3:-3] = made.values()
    sets = [_grown(entry, rendered) if entry.name in _GROWN else entry for entry in sets]
    chains = (*table.chains, *(chain for chain, _ in rendered.chains))
    jumps: tuple[dict[str, str], dict[str, str]] = ({}, {})
    for element, ingress in rendered.jumps:
        jumps[ingress].update(_jumps((element,)))
    return NftPolicy(replace(table, chains=chains, sets=tuple(sets)), previous.pending, previous.refused, TableIndex(
        chains={**previous.chains, **{chain.name: chain.rules for chain, _ in rendered.chains}},
        sets={**held, **replaced, **made},
        known={**previous.known, rendered.known.key[0]: rendered.known.comment or ""},
        egress={**previous.egress, **jumps[False]}, ingress={**previous.ingress, **jumps[True]}))


_GROWN = frozenset((KNOWN_SET, EGRESS_MAP, INGRESS_MAP))


def _grown(entry: Set | Map, rendered: _Pod) -> Set | Map:
    """KNOWN and the verdict maps with the pod's elements."""
    if entry.name == KNOWN_SET:
        return replace(entry, elements=(*entry.elements, rendered.known))
    for name, ingress in ((EGRESS_MAP, False), (INGRESS_MAP, True)):
        if entry.name == name:
            added = tuple(element for element, is_ingress in rendered.jumps if is_ingress is ingress)
            return replace(entry, elements=(*entry.elements, *added)) if added else entry
    return entry


def render_nft_without_pod(previous: NftPolicy, removed: PodRemoved) -> NftPolicy | None:
    """`previous` without `removed.pod`: what `render_nft(removed.plan)` gives. None when the
    pod is not there as rendered, or pods are pending or refused."""
    pod = removed.pod
    own = removable_chains(pod, previous.chains, previous.known, clean=not (previous.refused or previous.pending))
    if own is None:
        return None
    dropped = {ref.name for ref in removed.dropped}
    shrunk = {ref.name: ref for ref in removed.shrunk}
    address = nft_text.address(pod.ip)
    sets: list[Set | Map] = []
    for entry in previous.table.sets:
        if entry.name in dropped:
            continue
        if entry.name in shrunk:
            gone = element_key(shrunk[entry.name].kind, pod.ip)
            entry = replace(entry, elements=tuple(e for e in entry.elements if e.key != gone))
        elif entry.name == KNOWN_SET:
            entry = replace(entry, elements=tuple(e for e in entry.elements if e.key[0] != address))
        elif entry.name in (EGRESS_MAP, INGRESS_MAP) and own:
            entry = replace(entry, elements=tuple(e for e in entry.elements
                                                  if (e.value or "").removeprefix("jump ") not in own))
        sets.append(entry)
    table = previous.table
    chains = tuple(chain for chain in table.chains if chain.name not in own)
    kept = {name: entry for name, entry in ((s.name, s) for s in sets) if name in previous.sets}
    return NftPolicy(replace(table, chains=chains, sets=tuple(sets)), previous.pending, previous.refused, TableIndex(
        chains={name: rules for name, rules in previous.chains.items() if name not in own},
        sets=kept, known={ip: key for ip, key in previous.known.items() if ip != address},
        egress={k: v for k, v in previous.egress.items() if v not in own},
        ingress={k: v for k, v in previous.ingress.items() if v not in own}))

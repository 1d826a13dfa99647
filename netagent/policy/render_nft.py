"""The nftables form of a `NodePlan` (`--proxy-mode nftables`), rendered purely: table
`ip netagent-policy` (kernel/owned.py's NFT_POLICY_TABLE; `ip6` the same shape, `Family`), in
which every object is ours.

    chain NETAGENT-NP-FORWARD    type filter hook forward priority filter - 5; policy accept;
      ct state established,related return        replies and ICMP errors of allowed connections
      icmpv6 type { nd-neighbor-solicit, ... } ip6 hoplimit 255 return   ip6 only: neighbour discovery
      icmpv6 type { mld-listener-query, ... } ip6 hoplimit 1 return      and MLD (`ndp.py`)
      ip saddr <pod CIDR> ip saddr != @NETAGENT-NP-KNOWN drop     (and daddr): new pods closed
      ip saddr vmap @NETAGENT-NP-EGRESS          bridge mode; routed mode: iifname vmap
      ip daddr vmap @NETAGENT-NP-INGRESS         bridge mode; routed mode: oifname vmap
    chain NETAGENT-NPE-<hash> / NETAGENT-NPI-<hash>   one per isolated pod and direction:
      counter (a header: whose chain, which policies), allow rules `... return`, `counter drop`

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

Rules are compared with the kernel by their comments: each ends in ` #` + 8 hex digits, the
digest of the rule's text, so a changed rule has a changed comment (the programmer reads them
back and rewrites a chain whose comments or verdicts differ). nft keeps at most 128 bytes of a
comment, so the text before the digest is cut to fit. Every string reaching nft text goes
through kernel/nftables/text.py. A pod that cannot be rendered, or whose rules would use an
except set that cannot be written, is `refused`: not in KNOWN, so it stays closed.
"""
from __future__ import annotations

import functools
import hashlib
import ipaddress
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace

from netagent.kernel.families import IpFamily
from netagent.kernel import owned
from netagent.kernel.nftables import text as nft_text
from netagent.kernel.pod_attachment import PodAttachment
from netagent.policy import ndp
from netagent.policy.pod_plan import PodAdded, PodRemoved
from netagent.policy.render import INTERFACE_NAME, RenderSettings, checked_sets, pod_directions, removable_chains
from netagent.policy.semantics import Allow, CidrMatch, NodePlan, PodPlan, PortMatch, SetKind, SetRef

TABLE = owned.NFT_POLICY_TABLE
BASE_CHAIN = owned.POLICY_CHAIN
PRIORITY = -5                                  # "filter - 5": see the module docstring
EGRESS_MAP = owned.POLICY_PREFIX + "-EGRESS"   # source address / input veth -> jump egress chain
INGRESS_MAP = owned.POLICY_PREFIX + "-INGRESS"  # destination address / output veth -> jump ingress chain
KNOWN_SET = owned.POLICY_KNOWN_SET
COMMENT_MAX = 128                              # what nft keeps of a comment
HEADER = "netagent policy: "
DIGEST = re.compile(r" #[0-9a-f]{8}$")
_SAFE = re.compile(r"[^A-Za-z0-9 ./:_,=()\[\]{}@+-]")   # kept as is by nft_text.comment


@dataclass(frozen=True)
class Family:
    """What differs between `ip` and `ip6`: the table family, address type and payload."""
    name: str
    address_type: str
    payload: str


    @classmethod
    def of(cls, family: IpFamily) -> Family:
        return cls(family.nft, family.nft_address_type, family.nft)


IPV4 = Family.of(IpFamily.V4)
IPV6 = Family.of(IpFamily.V6)

@dataclass(frozen=True)
class NftRule:
    body: str                 # matches and verdict, no comment
    comment: str              # as the kernel lists it back (digest included)
    verdict: str              # "return" | "drop" | "vmap" | "" (the header), compared on read-back

    @property
    def text(self) -> str:
        return f"{self.body} comment {nft_text.comment(self.comment)}"


@dataclass(frozen=True)
class NftSet:
    name: str
    type: str                        # nft type expression, e.g. "ipv4_addr . inet_proto . inet_service"
    interval: bool
    elements: frozenset[str]         # canonical members (`canonical_element`)
    comment: str = ""


@dataclass(frozen=True)
class NftWanted:
    """Everything the plan asks of the policy table; compared whole by programmer_nft.py."""
    family: Family
    base: tuple[NftRule, ...]
    chains: Mapping[str, tuple[NftRule, ...]]     # pod chains
    sets: Mapping[str, NftSet]                    # selector sets
    egress: Mapping[str, str]                     # EGRESS_MAP: address or interface -> pod chain
    ingress: Mapping[str, str]                    # INGRESS_MAP
    known: Mapping[str, str]                      # programmed local pod address -> ns/name (KNOWN, comment)
    key_type: str = "ipv4_addr"                   # the verdict maps' key: an address type or ifname
    pending: tuple[str, ...] = ()                 # local pods left closed: no host interface found
    refused: tuple[str, ...] = ()                 # why local pods were left closed
    hook_priority: int = field(default=PRIORITY)


def safe_text(text: str, room: int = COMMENT_MAX) -> str:
    """`text` in characters nft keeps as they are (others become `?`), cut to `room` bytes:
    what the kernel lists back is then exactly this."""
    safe = _SAFE.sub("?", text)
    return safe if len(safe) <= room else safe[:room - 3] + "..."


def comment_text(text: str, body: str) -> str:
    """A rule's comment: `text` made safe and cut to fit, + ` #` + the digest of the rule."""
    digest = hashlib.sha256(f"{body}\0{text}".encode("utf-8", "surrogatepass")).hexdigest()[:8]
    return f"{safe_text(text, COMMENT_MAX - 10)} #{digest}"


def plain_comment(comment: str) -> str:
    """A comment without its digest (what `netagent status policy` shows)."""
    return DIGEST.sub("", comment)


def _rule(body: str, text: str, verdict: str) -> NftRule:
    return NftRule(body, comment_text(HEADER + text, body), verdict)


def canonical_element(kind: SetKind, member: str) -> str:
    """An ipset-spelled member (render.py's `checked_sets`) in the spelling this module writes
    and the read-back normalises to: an address, a network, or `addr . proto . port`."""
    if kind is SetKind.NAMED:
        address, _, protocol_port = member.partition(",")
        protocol, _, port = protocol_port.partition(":")
        return f"{ipaddress.ip_address(address)} . {protocol.lower()} . {int(port)}"
    if kind is SetKind.PODS:
        return str(ipaddress.ip_address(member))
    return str(ipaddress.ip_network(member, strict=False))


def element_nft(member: str) -> str:
    """A canonical member (`canonical_element`) as nft element text, through kernel/nftables/text.py."""
    if " . " in member:
        address, protocol, port = member.split(" . ")
        return nft_text.concat([nft_text.address(address), nft_text.protocol(protocol), nft_text.port(int(port))])
    return nft_text.network(member) if "/" in member else nft_text.address(member)


def collapsed(networks: frozenset[str] | set[str]) -> frozenset[str]:
    """An interval set's members as the fewest non-overlapping networks."""
    parsed = [ipaddress.ip_network(n) for n in networks]
    v4 = ipaddress.collapse_addresses(n for n in parsed if isinstance(n, ipaddress.IPv4Network))
    v6 = ipaddress.collapse_addresses(n for n in parsed if isinstance(n, ipaddress.IPv6Network))
    return frozenset(str(net) for net in (*v4, *v6))


def set_type(kind: SetKind, family: Family) -> tuple[str, bool]:
    if kind is SetKind.NAMED:
        return f"{family.address_type} . inet_proto . inet_service", False
    return family.address_type, kind in (SetKind.EXCEPT, SetKind.NETS)


def _peer(peer: SetRef | CidrMatch | None, side: str, family: Family) -> list[str]:
    if peer is None:
        return []
    if isinstance(peer, SetRef):
        return [f"{family.payload} {side} @{nft_text.name(peer.name)}"]
    match = [] if peer.cidr.endswith("/0") else [f"{family.payload} {side} {nft_text.network(peer.cidr)}"]
    if peer.excepts is not None:
        match.append(f"{family.payload} {side} != @{nft_text.name(peer.excepts.name)}")
    return match


def _port(port: PortMatch | None) -> list[str]:
    if port is None:
        return []
    protocol = nft_text.protocol(port.protocol.value)
    if port.first is None:
        return [f"meta l4proto {protocol}"]
    first = nft_text.port(port.first)
    ports = first if port.last in (None, port.first) else f"{first}-{nft_text.port(port.last or 0)}"
    return [f"meta l4proto {protocol} th dport {ports}"]


def _allow_body(allow: Allow, *, ingress: bool, family: Family) -> str:
    match = _peer(allow.peer, "saddr" if ingress else "daddr", family) + _port(allow.port)
    if allow.named is not None:
        match.append(f"{family.payload} daddr . meta l4proto . th dport @{nft_text.name(allow.named.name)}")
    return " ".join([*match, "return"])


def header_text(pod: PodPlan, *, ingress: bool) -> str:
    """The header's words (the address before the key, so a long key is what gets cut)."""
    policies = pod.ingress_policies if ingress else pod.egress_policies
    return f"{'ingress' if ingress else 'egress'} {pod.ip} {pod.key} selected by {','.join(policies)}"


@functools.lru_cache(maxsize=16384)
def render_pod_chain(allows: tuple[Allow, ...], *, pod: PodPlan, ingress: bool,
                     family: Family = IPV4) -> tuple[NftRule, ...]:
    """A pod chain; cached, since a sync re-renders every pod and most chains do not change
    (and the programmer then compares the same objects)."""
    rules = [_rule("counter", header_text(pod, ingress=ingress), "")]
    for allow in allows:
        rules.append(_rule(_allow_body(allow, ingress=ingress, family=family), f"allow {allow.origin}", "return"))
    word = "ingress to" if ingress else "egress from"
    rules.append(_rule("counter drop", f"deny {word} {pod.key}", "drop"))
    return tuple(rules)


def _base_rules(settings: RenderSettings, family: Family) -> tuple[NftRule, ...]:
    rules = [_rule("ct state established,related return", "replies of allowed connections", "return")]
    if family.name == IPV6.name:
        rules += [_rule(body, "IPv6 neighbour discovery and MLD", "return") for body in ndp.nft_bodies(IpFamily.V6)]
    for cidr in settings.local_cidrs:
        network = nft_text.network(str(ipaddress.ip_network(cidr, strict=False)))
        for side in ("saddr", "daddr"):
            rules.append(_rule(f"{family.payload} {side} {network} {family.payload} {side} != @{KNOWN_SET} drop",
                               "pod not programmed yet", "drop"))
    if settings.mode is PodAttachment.ROUTED:
        egress, ingress = "iifname", "oifname"
    else:
        egress, ingress = f"{family.payload} saddr", f"{family.payload} daddr"
    rules.append(_rule(f"{egress} vmap @{EGRESS_MAP}", "isolated pods' egress", "vmap"))
    rules.append(_rule(f"{ingress} vmap @{INGRESS_MAP}", "isolated pods' ingress", "vmap"))
    return tuple(rules)


def render_nft(plan: NodePlan, *, settings: RenderSettings, interface_of: Callable[[PodPlan], str | None],
               family: Family = IPV4) -> NftWanted:
    """Everything the plan asks of the table. Routed mode keys the maps by host veth: a pod
    whose veth is unknown is left out (and out of KNOWN: it stays closed) and `pending`."""
    refused: list[str] = []
    members, broken = checked_sets(plan, refused)
    chains: dict[str, tuple[NftRule, ...]] = {}
    egress: dict[str, str] = {}
    ingress: dict[str, str] = {}
    known: dict[str, str] = {}
    pending: list[str] = []
    used: set[SetRef] = set()
    routed = settings.mode is PodAttachment.ROUTED
    for pod in plan.pods:
        try:
            interface = interface_of(pod) if pod.isolated and routed else ""
            if interface is None:
                pending.append(pod.key)
                continue
            pod_chains, refs, address, comment = _render_pod(pod, interface, family,
                                                             frozenset(broken) if broken else _NOTHING)
        except Exception as error:     # the guard: this pod stays closed (not in KNOWN), the others go on
            refused.append(f"pod {pod.key}: cannot be rendered ({type(error).__name__}: {str(error)[:160]}); "
                           f"it stays closed")
            continue
        known[address] = comment
        for chain, (rules, is_ingress) in pod_chains.items():
            chains[chain] = rules
            (ingress if is_ingress else egress)[interface or pod.ip] = chain
        used.update(refs)
    sets = {ref.name: _nft_set(ref, held, family) for ref, held in members.items() if ref in used}
    return NftWanted(family, _base_rules(settings, family), chains, sets, egress, ingress, known,
                     key_type="ifname" if routed else family.address_type,
                     pending=tuple(pending), refused=tuple(refused))


def render_nft_with_pod(previous: NftWanted, added: PodAdded, *, settings: RenderSettings,
                        interface_of: Callable[[PodPlan], str | None], family: Family = IPV4) -> NftWanted | None:
    """`previous` (`render_nft` of the plan without the pod) with `added.pod`: what `render_nft(added.plan)`
    gives, computed from the pod's own pieces (its chains, map entries, KNOWN entry, and its
    address in the sets it joined). None when the pod would be pending or refused, or a set
    member could not be written: the full render says why."""
    pod = added.pod
    if previous.refused or previous.family != family:
        return None
    interface = interface_of(pod) if pod.isolated and settings.mode is PodAttachment.ROUTED else ""
    if interface is None:
        return None
    pod_chains, refs, address, comment = _render_pod(pod, interface, family, _NOTHING)
    keys = [(ingress, interface or pod.ip) for _, ingress in pod_chains.values()]
    if address in previous.known or any(key in (previous.ingress if ingress else previous.egress)
                                        for ingress, key in keys):
        return None
    grown = {ref: frozenset((pod.ip,)) for ref in added.grown if ref.name in previous.sets}
    new = {ref: members for ref, members in added.new.items() if ref in refs and ref.name not in previous.sets}
    refused: list[str] = []
    members, broken = checked_sets(NodePlan((), {**grown, **new}), refused)
    if refused or broken or any(ref.name not in previous.sets and ref not in new for ref in refs):
        return None
    sets = dict(previous.sets)
    for ref in grown:
        held = sets[ref.name]
        sets[ref.name] = replace(held, elements=held.elements | {canonical_element(ref.kind, m) for m in members[ref]})
    for ref in new:
        sets[ref.name] = _nft_set(ref, members[ref], family)
    egress, ingress = dict(previous.egress), dict(previous.ingress)
    for chain, (_, is_ingress) in pod_chains.items():
        (ingress if is_ingress else egress)[interface or pod.ip] = chain
    return replace(previous, chains={**previous.chains, **{name: rules for name, (rules, _) in pod_chains.items()}},
                   sets=sets, egress=egress, ingress=ingress, known={**previous.known, address: comment})


def render_nft_without_pod(previous: NftWanted, removed: PodRemoved) -> NftWanted | None:
    """`previous` without `removed.pod`: what `render_nft(removed.plan)` gives. None when the
    pod is not there as rendered, or pods are pending or refused."""
    pod = removed.pod
    own = removable_chains(pod, previous.chains, previous.known, clean=not (previous.refused or previous.pending))
    if own is None:
        return None
    dropped = {ref.name for ref in removed.dropped}
    sets = {name: spec for name, spec in previous.sets.items() if name not in dropped}
    for ref in removed.shrunk:
        if ref.name in sets:
            sets[ref.name] = replace(sets[ref.name], elements=sets[ref.name].elements - {canonical_element(ref.kind, pod.ip)})
    known = dict(previous.known)
    del known[pod.ip]
    return replace(previous, chains={name: rules for name, rules in previous.chains.items() if name not in own},
                   sets=sets, egress={k: v for k, v in previous.egress.items() if v not in own} if own else previous.egress,
                   ingress={k: v for k, v in previous.ingress.items() if v not in own} if own else previous.ingress,
                   known=known)


@functools.lru_cache(maxsize=16384)
def _nft_set(ref: SetRef, members: frozenset[str], family: Family) -> NftSet:
    """A selector set in nft spelling; cached, since most sets keep their members from sync to sync."""
    type_text, interval = set_type(ref.kind, family)
    elements = frozenset(canonical_element(ref.kind, member) for member in members)
    return NftSet(ref.name, type_text, interval, collapsed(elements) if interval else elements, comment=ref.key)


_NOTHING: frozenset[SetRef] = frozenset()


@functools.lru_cache(maxsize=16384)
def _render_pod(pod: PodPlan, interface: str, family: Family, broken: frozenset[SetRef]
                ) -> tuple[dict[str, tuple[tuple[NftRule, ...], bool]], frozenset[SetRef], str, str]:
    """(chain -> (rules, ingress?), sets used, address, KNOWN comment) of one pod; raises when
    it cannot be rendered. Cached: a sync renders every local pod, and most are as before
    (the result is shared: read, never changed)."""
    if interface and not INTERFACE_NAME.match(interface):
        raise ValueError(f"host interface {interface[:40]!r} is not an interface name")
    address = str(ipaddress.ip_address(pod.ip))
    directions, refs = pod_directions(pod)
    chains = {chain: (render_pod_chain(allows, pod=pod, ingress=ingress, family=family), ingress)
              for allows, chain, ingress in directions}
    if refs & broken:
        raise ValueError(f"it uses a set that cannot be written ({sorted(r.key[:60] for r in refs & broken)})")
    return chains, frozenset(refs), address, safe_text(pod.key)

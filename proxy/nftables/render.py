"""The nftables service proxy's contents, rendered from a `ProxyState`: pure, deterministic.

Why this shape (measured with nft 1.0.6 on this kernel; see names.py for the names):
chains are what cost nf_tables time (a batch adding 10,000 chains took 17 s), elements are
cheap (110,000 map elements in one batch took 1.6 s). So no chain exists per Service: a
packet to a service address finds its verdict in ONE verdict-map lookup, and the endpoint in
one more, keyed by the entry point and a random slot:

    SERVICES (from the nat PREROUTING and OUTPUT hooks):
      ip daddr . proto . dport in FIREWALL-IPS, and daddr . proto . dport . saddr not in
          FIREWALL-ALLOW (an interval set of the allowed source ranges)    -> drop
      ip daddr . meta l4proto . th dport vmap @SERVICE-IPS               (cluster, external, LB IPs)
      <local address> meta l4proto . th dport vmap @SERVICE-NODEPORTS    (node ports)
    SERVICE-IPS[10.96.0.10 . tcp . 80] = goto IP-C-3     (3 endpoints; `reject`/`drop` verdicts too)
    IP-C-3: mark for masquerade unless the source is a pod; then, per protocol,
      meta l4proto tcp dnat ip to ip daddr . th dport . numgen random mod 3 map @ENDPOINTS-TCP
    ENDPOINTS-TCP[10.96.0.10 . 80 . 0..2] = 10.244.1.5 . 8080, ...

One balancing chain exists per (key space, role, endpoint count) in use (`names.count_chain`),
so their number does not grow with Services. externalTrafficPolicy Local sends an entry point
to the fixed `LOCAL-IP`/`LOCAL-NODEPORT` chains, which look the entry point up again in
`LOCAL-*-INSIDE` (pods and the node itself: served like cluster-IP clients) or
`LOCAL-*-OUTSIDE` (everyone else: the local endpoints, source kept). ClientIP affinity is
the one per-service-port structure (a chain per role and endpoint, a dynamic set per
endpoint, as kube-proxy's); it is rare and says so in names.py.

Refusal: a service port with no endpoints anywhere is `goto REJECT-NEW` (logged first to the flow
records' nflog group, rate limited, prefix owned.NO_ENDPOINTS_LOG_PREFIX; then TCP reset, ICMP port
unreachable otherwise); endpoints but none for this traffic (a Local policy) is `drop`.
Hairpin: `ip saddr . ip daddr @HAIRPIN masquerade` in POSTROUTING, the set holding
`endpoint . endpoint` per selected endpoint on this node (or of no known node): a pod can only
reach itself through the node it lives on, so remote endpoints cost no element. Off-cluster
clients: the mark bit, cleared and masqueraded in POSTROUTING, as the iptables backend does.

Sizes: the static maps and sets are hash sets without `size`, which nf_tables grows with their
elements (no "set is full" at any number of Services); only the affinity sets, filled by the
packet path, are dynamic and take `size` (`NftProxySettings.affinity_set_size` clients per
endpoint; past it a new client is still balanced, without affinity, until entries time out:
the `update` is a rule of its own, before the DNAT).

Every rule is a `model.Rule` whose comment names its purpose and carries the digest of its
statements (`model.digested_rule`), so a full sync compares a chain read back with the rendered
one without parsing rule expressions, and names every set and map it uses (`Rule.sets`);
statements are composed here from `netagent.kernel.nftables`' text gates and `model.ref()`.
Elements are `model.Element`s whose keys are tuples of parts (`('10.96.0.10', 'tcp', '80')`).
Element comments name the service port and entry kind (readability and `netagent status
services`; in the sets `SERVICE-*-NAMES`, see names.py), bounded by `text.safe_comment_text`.
Every string reaching the text goes through the gates (addresses through `Spelling.address`,
which also refuses one of the other family; source ranges through `Spelling.network`, before
and after collapsing); a service port whose values they refuse is `UnrenderablePort` (left
out and reported). An affinity rule's purpose names its endpoint (`affinity to
10.244.1.5:8080`): status reads it back from the comment.

IPv6: the same shape in `ip6 netagent`, written with the family's spelling (spelling.py,
`NftProxySettings.family`): `ip6 daddr`, `ipv6_addr` keys, `dnat ip6 to`, `::1` as the loopback
NodePorts skip; `reject` answers ICMPv6 port unreachable there.
"""
from __future__ import annotations

import dataclasses
import ipaddress
from dataclasses import dataclass

from netagent.errors import NetagentError
from netagent.kernel import nflog, owned
from netagent.kernel.families import IpFamily
from netagent.kernel.nftables import model, text
from netagent.kernel.nftables.model import BaseChain, Chain, Element, Rule, Set
from proxy.service_hash import service_hash
from proxy.model import Endpoint, EntryKind, NodeContext, ServicePort, ServicePortName, TrafficPolicy
from proxy.nftables import names as N
from proxy.nftables.names import KeySpace, Role
from proxy.selection import EndpointSelection
from proxy.nftables.spelling import Spelling, spelling
from proxy.source_ranges import source_ranges

DEFAULT_AFFINITY_SET_SIZE = 65536   # clients remembered per endpoint of an affinity service

Key = tuple[str, ...]            # an element's key, one rendered part per datatype
ElementKey = tuple[str, Key]     # (holder, key): an element's identity in the table
AFFINITY_PURPOSE = "affinity to "   # + the endpoint: the purpose of an affinity role chain's rule


class UnrenderablePort(NetagentError, ValueError):
    """One service port holds a value nft text cannot carry (an IPv6 address in the ip
    table, a string `text` refuses); the backend leaves it out and reports it."""

    def __init__(self, name: ServicePortName, reason: str) -> None:
        super().__init__(f"{name}: {reason}")
        self.name, self.reason = name, reason


@dataclass(frozen=True)
class NftProxySettings:
    masquerade_mark: int = owned.MASQUERADE_MARK
    affinity_set_size: int = DEFAULT_AFFINITY_SET_SIZE
    family: IpFamily = IpFamily.V4       # the table's: `ip netagent` or `ip6 netagent` (spelling.py)

    def __post_init__(self) -> None:
        mark = self.masquerade_mark
        if mark <= 0 or mark >= 1 << 32 or mark & (mark - 1):
            raise ValueError(f"masquerade mark {mark:#x} must be a single bit of the 32-bit mark")
        if not 1 <= self.affinity_set_size < 1 << 31:
            raise ValueError(f"affinity set size {self.affinity_set_size} out of range")

    @property
    def spelling(self) -> Spelling:
        return spelling(self.family)

    def of_family(self, family: IpFamily) -> NftProxySettings:
        return self if family is self.family else dataclasses.replace(self, family=family)


@dataclass(frozen=True)
class PortObjects:
    """Everything one service port contributes: elements of the shared maps and sets (grouped
    by holder: no (holder, key) pair is kept per element), the balancing chains it needs
    (shared, by name), and its own chains and sets (affinity: the sets declared, their
    elements the packet path's)."""
    name: ServicePortName
    elements: tuple[tuple[str, tuple[Element, ...]], ...] = ()
    count_chains: frozenset[str] = frozenset()
    chains: tuple[Chain, ...] = ()
    sets: tuple[Set, ...] = ()


# ---- the fixed skeleton ---------------------------------------------------------------------

PORT_KEY = "meta l4proto . th dport"

BASE_CHAINS: dict[str, BaseChain] = {
    N.PREROUTING: BaseChain("nat", "prerouting", N.PRIORITY_DSTNAT),
    N.OUTPUT: BaseChain("nat", "output", N.PRIORITY_DSTNAT),
    N.POSTROUTING: BaseChain("nat", "postrouting", N.PRIORITY_SRCNAT),
}


def rule(statements: str, purpose: str, *sets: str) -> Rule:
    """A rule whose comment says `purpose` and carries its digest; `sets`: the sets and maps
    its statements name through `model.ref`."""
    return model.digested_rule(statements, purpose, sets=sets)


def _mark(settings: NftProxySettings) -> str:
    return f"meta mark set meta mark | {settings.masquerade_mark:#x}"


def _cluster_mark(node: NodeContext, settings: NftProxySettings) -> str:
    """Cluster-IP traffic is masqueraded unless it comes from a pod (all of it without a CIDR)."""
    cidr = _cluster_cidr(node, settings.spelling)
    if cidr:
        return f"{settings.spelling.ip} saddr != {cidr} {_mark(settings)}"
    return _mark(settings)


def _cluster_cidr(node: NodeContext, spell: Spelling) -> str | None:
    """The node's cluster CIDR as text, if it is of the table's family (a proxy is built per
    family with that family's CIDR; one of the other family says nothing about this one)."""
    if node.cluster_cidr and spell.of_family(node.cluster_cidr):
        return spell.network(node.cluster_cidr)
    return None


def _nodeport_addresses(node: NodeContext, spell: Spelling) -> list[str]:
    """`--nodeport-addresses` of the table's family; none of it: every local address (kube-proxy's
    rule per family)."""
    return sorted({spell.address(a) for a in node.nodeport_addresses if spell.of_family(a)})


def fixed_chains(node: NodeContext, settings: NftProxySettings) -> dict[str, tuple[Rule, ...]]:
    """The hooked chains and the fixed regular chains; their rules depend on the node only."""
    mark = f"{settings.masquerade_mark:#x}"
    spell = settings.spelling
    ip, address_key = spell.ip, spell.address_key
    nodeport_addresses = _nodeport_addresses(node, spell)
    if nodeport_addresses:
        where = f"{ip} daddr {{ " + ", ".join(nodeport_addresses) + " }"
    else:
        where = f"fib daddr type local {ip} daddr != {spell.loopback}"
    cidr = _cluster_cidr(node, spell)
    inside = [f"{ip} saddr {cidr}"] if cidr else []
    inside.append("fib saddr type local")
    ref = model.ref
    return {
        N.PREROUTING: (rule(text.jump(N.SERVICES), "to the services"),),
        N.OUTPUT: (rule(text.jump(N.SERVICES), "to the services"),),
        N.POSTROUTING: (
            rule(f"{ip} saddr . {ip} daddr {ref(N.HAIRPIN)} masquerade fully-random", "hairpin", N.HAIRPIN),
            rule(f"meta mark & {mark} == 0 return", "unmarked: untouched"),
            rule(f"meta mark set meta mark ^ {mark}", "mark cleared"),
            rule("masquerade fully-random", "marked: masqueraded"),
        ),
        N.SERVICES: (
            rule(f"{address_key} {ref(N.FIREWALL_IPS)} {address_key} . {ip} saddr != {ref(N.FIREWALL_ALLOW)} drop",
                 "source ranges", N.FIREWALL_IPS, N.FIREWALL_ALLOW),
            rule(f"{address_key} vmap {ref(N.SERVICE_IPS)}", "service addresses", N.SERVICE_IPS),
            rule(f"{where} {PORT_KEY} vmap {ref(N.SERVICE_NODEPORTS)}", "node ports", N.SERVICE_NODEPORTS),
        ),
        N.LOCAL_IP: (*(rule(f"{match} {address_key} vmap {ref(N.LOCAL_IPS_INSIDE)}", "pods and the node",
                            N.LOCAL_IPS_INSIDE) for match in inside),
                     rule(f"{address_key} vmap {ref(N.LOCAL_IPS_OUTSIDE)}", "local endpoints", N.LOCAL_IPS_OUTSIDE)),
        N.LOCAL_NODEPORT: (*(rule(f"{match} {PORT_KEY} vmap {ref(N.LOCAL_NODEPORTS_INSIDE)}", "pods and the node",
                                  N.LOCAL_NODEPORTS_INSIDE) for match in inside),
                           rule(f"{PORT_KEY} vmap {ref(N.LOCAL_NODEPORTS_OUTSIDE)}", "local endpoints",
                                N.LOCAL_NODEPORTS_OUTSIDE)),
        N.REJECT: (rule(nflog.nft_log(owned.NO_ENDPOINTS_LOG_PREFIX), "flow record: no endpoints"),
                   rule("meta l4proto tcp counter reject with tcp reset", "tcp reset"),
                   rule("counter reject", "port unreachable")),
    }


def count_chain_rules(name: str, node: NodeContext, settings: NftProxySettings) -> tuple[Rule, ...]:
    """The rules of a balancing chain, from its name alone (`IP-C-3`)."""
    found = N.COUNT_CHAIN.fullmatch(name)
    if found is None:
        raise ValueError(f"not a balancing chain: {name}")
    space, role, count = KeySpace(found.group(1)), Role(found.group(2)), int(found.group(3))
    rules = _mark_rules(role, node, settings)
    ip = settings.spelling.ip
    key = f"{ip} daddr . th dport" if space is KeySpace.ADDRESS else "th dport"
    for proto in N.PROTOCOLS:
        endpoints = N.endpoint_map(space, role, proto)
        rules.append(rule(f"meta l4proto {proto} dnat {ip} to {key} . numgen random mod {text.number(count)} "
                          f"map {model.ref(endpoints)}", f"{proto} endpoints", endpoints))
    return tuple(rules)


def _mark_rules(role: Role, node: NodeContext, settings: NftProxySettings) -> list[Rule]:
    """What a balancing chain of `role` does first: mark for masquerade (or not)."""
    if role is Role.CLUSTER:
        return [rule(_cluster_mark(node, settings), "mark unless from a pod")]
    if role is Role.EXTERNAL:
        return [rule(_mark(settings), "mark")]
    return []


# ---- one service port -------------------------------------------------------------------------

def render_port(service: ServicePort, selection: EndpointSelection, *, node: NodeContext,
                settings: NftProxySettings) -> PortObjects:
    try:
        return _render_port(service, selection, node=node, settings=settings)
    except (ValueError, text.UnsafeNftText) as error:
        raise UnrenderablePort(service.name, str(error)) from error


class _PortBuilder:
    def __init__(self, service: ServicePort, node: NodeContext, settings: NftProxySettings) -> None:
        self.service, self.node, self.settings = service, node, settings
        self.spell = settings.spelling
        self.proto = text.protocol(service.protocol.value)
        self.elements: dict[str, dict[Key, Element]] = {}
        self.count_chains: set[str] = set()
        self.chains: dict[str, Chain] = {}
        self.sets: dict[str, Set] = {}
        self.hash = service_hash(service.name, service.protocol)
        self._targets: dict[int, list[str]] = {}

    def element(self, holder: str, key: Key, value: str | None = None, comment: str | None = None) -> None:
        held = self.elements.setdefault(holder, {})
        if key not in held:
            held[key] = Element(key, value, text.safe_comment_text(comment) if comment else None)

    def targets(self, endpoints: tuple[Endpoint, ...]) -> list[str]:
        """Each endpoint as a slot's value (`10.244.1.5 . 8080`), through the gates; made once
        per endpoint tuple (a NodePort balances the same endpoints as the cluster IP)."""
        found = self._targets.get(id(endpoints))
        if found is None:
            address, port = self.spell.address, _port_text
            found = self._targets[id(endpoints)] = [f"{address(e.ip)} . {port(e.port)}" for e in endpoints]
        return found

    def slots(self, space: KeySpace, role: Role, slot_key: Key, endpoints: tuple[Endpoint, ...]) -> str:
        """The verdict balancing `endpoints` for an entry point (`slot_key`: its address and
        port, or its port alone): its slots written, and the balancing (or affinity) chain named."""
        if self.service.affinity_timeout is not None:
            return text.goto(self.affinity(role, endpoints))
        held = self.elements.setdefault(N.endpoint_map(space, role, self.proto), {})
        for slot, target in enumerate(self.targets(endpoints)):
            key = (*slot_key, _SLOTS[slot] if slot < len(_SLOTS) else str(slot))
            if key not in held:
                held[key] = Element(key, target)
        chain = N.count_chain(space, role, len(endpoints))
        self.count_chains.add(chain)
        return text.goto(chain)

    def affinity(self, role: Role, endpoints: tuple[Endpoint, ...]) -> str:
        timeout = int(text.number(self.service.affinity_timeout or 0))
        size = int(text.number(self.settings.affinity_set_size))
        chain = N.affinity_chain(self.hash, role)
        rules = _mark_rules(role, self.node, self.settings)
        choices = []
        family = self.spell.ip
        for slot, endpoint in enumerate(endpoints):
            ip, port = self.spell.address(endpoint.ip), text.port(endpoint.port)
            target_address = self.spell.host_port(ip, port)
            members = N.affinity_set(self.hash, ip, endpoint.port)
            target = N.affinity_endpoint(self.hash, ip, endpoint.port)
            self.sets[members] = Set(text.name(members), (self.spell.addr_type,), ("dynamic", "timeout"),
                                     timeout=timeout, size=size)
            dnat = f"meta l4proto {self.proto} dnat {family} to {target_address}"
            self.chains[target] = Chain(text.name(target), (
                rule(f"update {model.ref(members)} {{ {family} saddr }}", "remember the client", members),
                rule(dnat, f"to {target_address}")))
            rules.append(rule(f"{family} saddr {model.ref(members)} {dnat}", AFFINITY_PURPOSE + target_address,
                              members))
            choices.append(text.element(str(slot), text.goto(target)))
        rules.append(rule(f"numgen random mod {len(endpoints)} vmap {text.element_block(choices)}",
                          "a new client's endpoint"))
        self.chains[chain] = Chain(text.name(chain), tuple(rules))
        return chain


def _render_port(service: ServicePort, selection: EndpointSelection, *, node: NodeContext,
                 settings: NftProxySettings) -> PortObjects:
    b = _PortBuilder(service, node, settings)
    spell = b.spell
    cluster = _in_address_order(selection.cluster, spell)
    external = cluster if selection.external is selection.cluster else _in_address_order(selection.external, spell)
    refuse = text.goto(N.REJECT) if not selection.has_endpoints else "drop"
    local_policy = service.external_policy is TrafficPolicy.LOCAL
    fence = source_ranges(service.load_balancer_source_ranges, spell.family)
    for point in service.entry_points():
        label = f"{service.name} {point.kind.value}"
        port = text.port(point.port)
        key: Key
        slot_key: Key
        if point.kind is EntryKind.NODE_PORT:
            space, key, slot_key = KeySpace.NODEPORT, (b.proto, port), (port,)
            dispatch, inside, outside = N.SERVICE_NODEPORTS, N.LOCAL_NODEPORTS_INSIDE, N.LOCAL_NODEPORTS_OUTSIDE
            local_chain, names = N.LOCAL_NODEPORT, N.NODEPORT_NAMES
        else:
            address = spell.address(point.address or "")
            space, key, slot_key = KeySpace.ADDRESS, (address, b.proto, port), (address, port)
            dispatch, inside, outside = N.SERVICE_IPS, N.LOCAL_IPS_INSIDE, N.LOCAL_IPS_OUTSIDE
            local_chain, names = N.LOCAL_IP, N.IP_NAMES
        if not selection.has_endpoints:
            verdict = refuse
        elif point.kind is EntryKind.CLUSTER_IP:
            verdict = b.slots(space, Role.CLUSTER, slot_key, cluster) if cluster else refuse
        elif not local_policy:
            verdict = b.slots(space, Role.EXTERNAL, slot_key, external) if external else refuse
        else:   # Local: pods and the node like cluster-IP clients, the rest to local endpoints
            if cluster:
                b.element(inside, key, b.slots(space, Role.CLUSTER, slot_key, cluster))
            b.element(outside, key, b.slots(space, Role.LOCAL, slot_key, external) if external else refuse)
            verdict = text.goto(local_chain)
        b.element(dispatch, key, verdict)
        b.element(names, key, None, label)
        if point.kind is EntryKind.LOAD_BALANCER and fence is not None:
            b.element(N.FIREWALL_IPS, key)
            for allowed in _fence_elements(fence, spell):
                b.element(N.FIREWALL_ALLOW, (*key, allowed))
    for endpoints in (selection.cluster, selection.external):   # `all_selected`, without hashing every endpoint
        for endpoint in endpoints:
            if endpoint.node_name in (None, node.name):   # only a pod on this node can reach itself here
                ip = spell.address(endpoint.ip)
                b.element(N.HAIRPIN, (ip, ip))
    return PortObjects(service.name, tuple((holder, tuple(held.values())) for holder, held in b.elements.items()),
                       frozenset(b.count_chains),
                       tuple(b.chains[name] for name in sorted(b.chains)),
                       tuple(b.sets[name] for name in sorted(b.sets)))


def _in_address_order(endpoints: tuple[Endpoint, ...], spell: Spelling) -> tuple[Endpoint, ...]:
    if len(endpoints) < 2:
        return endpoints
    return tuple(sorted(endpoints, key=lambda e: (spell.sort_key(e.ip), e.port)))


_SLOTS = tuple(str(slot) for slot in range(64))   # a slot's text, made once


_PORT_TEXTS: dict[int, str] = {}


def _port_text(port: int) -> str:
    """`text.port`, remembered per port number (at most 65,536: endpoints share a few)."""
    if type(port) is not int:
        return text.port(port)   # refuses it, a bool included
    found = _PORT_TEXTS.get(port)
    if found is None:
        found = _PORT_TEXTS[port] = text.port(port)
    return found


def _fence_elements(fence: tuple[str, ...], spell: Spelling) -> list[str]:
    """The allowed source ranges as interval elements, each through the gate (`Spelling.network`,
    `Spelling.address`) before and after collapsing: a range the gate refuses (an IPv6 zone, which
    `ipaddress` reads and collapsing would silently drop or keep) makes the port unrenderable."""
    gated = [ipaddress.ip_network(spell.network(r)) for r in fence]
    out = []
    for network in ipaddress.collapse_addresses(gated):  # type: ignore[type-var]
        if network.prefixlen == network.max_prefixlen:
            out.append(spell.address(str(network.network_address)))
        else:
            out.append(spell.network(str(network)))
    return out

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

Refusal: a service port with no endpoints anywhere is `goto REJECT-NEW` (TCP reset, ICMP port
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

Every rule carries a comment with a digest of its text, so a full sync compares a chain read
back as JSON with the rendered one without parsing rule expressions. Element comments name
the service port and entry kind (readability and `netagent status services`; in the sets
`SERVICE-*-NAMES`, see names.py), bounded by nft-core's `text.comment`. Every string reaching
the text goes through `netagent.kernel.nftables.text` (addresses through `Spelling.address`,
which also refuses one of the other family; source ranges through `Spelling.network`, before
and after collapsing); a service port whose values it refuses is
`UnrenderablePort` (left out and reported).

IPv6: the same shape in `ip6 netagent`, written with the family's spelling (spelling.py,
`NftProxySettings.family`): `ip6 daddr`, `ipv6_addr` keys, `dnat ip6 to`, `::1` as the loopback
NodePorts skip; `reject` answers ICMPv6 port unreachable there.
"""
from __future__ import annotations

import dataclasses
import hashlib
import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass, field

from netagent.errors import NetagentError
from netagent.kernel import owned
from netagent.kernel.families import IpFamily
from netagent.kernel.nftables import text
from proxy.service_hash import service_hash
from proxy.model import Endpoint, EntryKind, NodeContext, ServicePort, ServicePortName, TrafficPolicy
from proxy.nftables import names as N
from proxy.nftables.names import KeySpace, Role
from proxy.selection import EndpointSelection
from proxy.nftables.spelling import Spelling, spelling
from proxy.source_ranges import source_ranges

DEFAULT_AFFINITY_SET_SIZE = 65536   # clients remembered per endpoint of an affinity service

# (holder, key) -> (value or None for a set, comment or None)
ElementKey = tuple[str, str]
ElementValue = tuple[str | None, str | None]


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
    """Everything one service port contributes: elements of the shared maps and sets, the
    balancing chains it needs (shared, by name), and its own chains and sets (affinity)."""
    name: ServicePortName
    elements: tuple[tuple[ElementKey, ElementValue], ...] = ()
    count_chains: frozenset[str] = frozenset()
    chains: tuple[tuple[str, tuple[str, ...]], ...] = ()   # own chains: name, rules
    sets: tuple[tuple[str, str], ...] = ()                  # own sets: name, declaration body


@dataclass
class Contents:
    """The whole table as wanted: elements by holder, chains with their rules (fixed,
    balancing and affinity), and the declarations of the sets that are not fixed."""
    elements: dict[str, dict[str, ElementValue]] = field(default_factory=dict)
    chains: dict[str, tuple[str, ...]] = field(default_factory=dict)
    sets: dict[str, str] = field(default_factory=dict)

    @property
    def size(self) -> int:
        """Elements plus rules: what `BackendSyncReport.rules` counts."""
        return sum(len(held) for held in self.elements.values()) + sum(len(r) for r in self.chains.values())


# ---- the fixed skeleton ---------------------------------------------------------------------

PORT_KEY = "meta l4proto . th dport"

BASE_CHAINS: dict[str, str] = {   # name -> hook declaration
    N.PREROUTING: f"type nat hook prerouting priority {N.PRIORITY_DSTNAT}; policy accept",
    N.OUTPUT: f"type nat hook output priority {N.PRIORITY_DSTNAT}; policy accept",
    N.POSTROUTING: f"type nat hook postrouting priority {N.PRIORITY_SRCNAT}; policy accept",
}


def rule(body: str) -> str:
    """A rule with the digest comment a full sync compares (`digest_of`)."""
    return f"{body} comment {text.comment(digest(body))}"


def digest(body: str) -> str:
    return "h" + hashlib.sha256(body.encode()).hexdigest()[:12]


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


def fixed_chains(node: NodeContext, settings: NftProxySettings) -> dict[str, tuple[str, ...]]:
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
    return {
        N.PREROUTING: (rule(f"jump {N.SERVICES}"),),
        N.OUTPUT: (rule(f"jump {N.SERVICES}"),),
        N.POSTROUTING: (
            rule(f"{ip} saddr . {ip} daddr @{N.HAIRPIN} masquerade fully-random"),
            rule(f"meta mark & {mark} == 0 return"),
            rule(f"meta mark set meta mark ^ {mark}"),
            rule("masquerade fully-random"),
        ),
        N.SERVICES: (
            rule(f"{address_key} @{N.FIREWALL_IPS} {address_key} . {ip} saddr != @{N.FIREWALL_ALLOW} drop"),
            rule(f"{address_key} vmap @{N.SERVICE_IPS}"),
            rule(f"{where} {PORT_KEY} vmap @{N.SERVICE_NODEPORTS}"),
        ),
        N.LOCAL_IP: (*(rule(f"{match} {address_key} vmap @{N.LOCAL_IPS_INSIDE}") for match in inside),
                     rule(f"{address_key} vmap @{N.LOCAL_IPS_OUTSIDE}")),
        N.LOCAL_NODEPORT: (*(rule(f"{match} {PORT_KEY} vmap @{N.LOCAL_NODEPORTS_INSIDE}") for match in inside),
                           rule(f"{PORT_KEY} vmap @{N.LOCAL_NODEPORTS_OUTSIDE}")),
        N.REJECT: (rule("meta l4proto tcp counter reject with tcp reset"), rule("counter reject")),
    }


def count_chain_rules(name: str, node: NodeContext, settings: NftProxySettings) -> tuple[str, ...]:
    """The rules of a balancing chain, from its name alone (`IP-C-3`)."""
    found = N.COUNT_CHAIN.fullmatch(name)
    if found is None:
        raise ValueError(f"not a balancing chain: {name}")
    space, role, count = KeySpace(found.group(1)), Role(found.group(2)), int(found.group(3))
    rules = []
    if role is Role.CLUSTER:
        rules.append(rule(_cluster_mark(node, settings)))
    elif role is Role.EXTERNAL:
        rules.append(rule(_mark(settings)))
    ip = settings.spelling.ip
    key = f"{ip} daddr . th dport" if space is KeySpace.ADDRESS else "th dport"
    rules.extend(rule(f"meta l4proto {proto} dnat {ip} to {key} . numgen random mod {count} "
                      f"map @{N.endpoint_map(space, role, proto)}") for proto in N.PROTOCOLS)
    return tuple(rules)


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
        self.elements: dict[ElementKey, ElementValue] = {}
        self.count_chains: set[str] = set()
        self.chains: dict[str, tuple[str, ...]] = {}
        self.sets: dict[str, str] = {}
        self.hash = service_hash(service.name, service.protocol)

    def element(self, holder: str, key: str, value: str | None = None, comment: str | None = None) -> None:
        self.elements.setdefault((holder, key), (value, text.safe_comment_text(comment) if comment else None))

    def slots(self, space: KeySpace, role: Role, key: str, endpoints: tuple[Endpoint, ...]) -> str:
        """The verdict balancing `endpoints` for the entry `key`: its slots written, and the
        balancing (or affinity) chain named."""
        if self.service.affinity_timeout is not None:
            return "goto " + self.affinity(role, endpoints)
        holder = N.endpoint_map(space, role, self.proto)
        slot_key = key.replace(f" . {self.proto} . ", " . ") if space is KeySpace.ADDRESS else key.split(" . ")[1]
        for slot, endpoint in enumerate(endpoints):
            self.elements.setdefault((holder, f"{slot_key} . {slot}"),
                                     (f"{self.spell.address(endpoint.ip)} . {text.port(endpoint.port)}", None))
        chain = N.count_chain(space, role, len(endpoints))
        self.count_chains.add(chain)
        return "goto " + chain

    def affinity(self, role: Role, endpoints: tuple[Endpoint, ...]) -> str:
        timeout = text.number(self.service.affinity_timeout or 0)
        chain = N.affinity_chain(self.hash, role)
        rules = []
        if role is Role.CLUSTER:
            rules.append(rule(_cluster_mark(self.node, self.settings)))
        elif role is Role.EXTERNAL:
            rules.append(rule(_mark(self.settings)))
        choices = []
        for slot, endpoint in enumerate(endpoints):
            ip, port = self.spell.address(endpoint.ip), text.port(endpoint.port)
            target_address = self.spell.host_port(ip, port)
            members, target = N.affinity_set(self.hash, ip, endpoint.port), N.affinity_endpoint(self.hash, ip, endpoint.port)
            self.sets[members] = (f"type {self.spell.addr_type}; flags dynamic,timeout; timeout {timeout}s; "
                                  f"size {text.number(self.settings.affinity_set_size)}")
            family = self.spell.ip
            self.chains[target] = (rule(f"update @{text.name(members)} {{ {family} saddr }}"),
                                   rule(f"meta l4proto {self.proto} dnat {family} to {target_address}"))
            rules.append(rule(f"{family} saddr @{members} meta l4proto {self.proto} dnat {family} to {target_address}"))
            choices.append(f"{slot} : goto {text.name(target)}")
        rules.append(rule(f"numgen random mod {len(endpoints)} vmap {{ {', '.join(choices)} }}"))
        self.chains[text.name(chain)] = tuple(rules)
        return chain


def _render_port(service: ServicePort, selection: EndpointSelection, *, node: NodeContext,
                 settings: NftProxySettings) -> PortObjects:
    b = _PortBuilder(service, node, settings)
    spell = b.spell
    cluster = tuple(sorted(selection.cluster, key=lambda e: (spell.sort_key(e.ip), e.port)))
    external = tuple(sorted(selection.external, key=lambda e: (spell.sort_key(e.ip), e.port)))
    refuse = "goto " + N.REJECT if not selection.has_endpoints else "drop"
    local_policy = service.external_policy is TrafficPolicy.LOCAL
    fence = source_ranges(service.load_balancer_source_ranges, spell.family)
    for point in service.entry_points():
        label = f"{service.name} {point.kind.value}"
        port = text.port(point.port)
        if point.kind is EntryKind.NODE_PORT:
            space, key = KeySpace.NODEPORT, f"{b.proto} . {port}"
            dispatch, inside, outside = N.SERVICE_NODEPORTS, N.LOCAL_NODEPORTS_INSIDE, N.LOCAL_NODEPORTS_OUTSIDE
            local_chain, names = N.LOCAL_NODEPORT, N.NODEPORT_NAMES
        else:
            space, key = KeySpace.ADDRESS, f"{spell.address(point.address or '')} . {b.proto} . {port}"
            dispatch, inside, outside = N.SERVICE_IPS, N.LOCAL_IPS_INSIDE, N.LOCAL_IPS_OUTSIDE
            local_chain, names = N.LOCAL_IP, N.IP_NAMES
        if not selection.has_endpoints:
            verdict = refuse
        elif point.kind is EntryKind.CLUSTER_IP:
            verdict = b.slots(space, Role.CLUSTER, key, cluster) if cluster else refuse
        elif not local_policy:
            verdict = b.slots(space, Role.EXTERNAL, key, external) if external else refuse
        else:   # Local: pods and the node like cluster-IP clients, the rest to local endpoints
            if cluster:
                b.element(inside, key, b.slots(space, Role.CLUSTER, key, cluster))
            b.element(outside, key, b.slots(space, Role.LOCAL, key, external) if external else refuse)
            verdict = "goto " + local_chain
        b.element(dispatch, key, verdict)
        b.element(names, key, None, label)
        if point.kind is EntryKind.LOAD_BALANCER and fence is not None:
            b.element(N.FIREWALL_IPS, key)
            for allowed in _fence_elements(fence, spell):
                b.element(N.FIREWALL_ALLOW, f"{key} . {allowed}")
    for endpoint in selection.all_selected:
        if endpoint.node_name in (None, node.name):   # only a pod on this node can reach itself here
            ip = spell.address(endpoint.ip)
            b.element(N.HAIRPIN, f"{ip} . {ip}")
    return PortObjects(service.name, tuple(b.elements.items()), frozenset(b.count_chains),
                       tuple(sorted(b.chains.items())), tuple(sorted(b.sets.items())))


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


# ---- the whole table --------------------------------------------------------------------------

class Assembly:
    """Service ports' objects put together, kept up to date port by port (a partial sync
    replaces only the changed ports' contributions). An element two ports both name (the
    same address and port: a clash) takes the value of the port first in name order."""

    def __init__(self, node: NodeContext, settings: NftProxySettings) -> None:
        self.node, self.settings = node, settings
        self.ports: dict[ServicePortName, PortObjects] = {}
        self._owners: dict[ElementKey, dict[ServicePortName, ElementValue]] = {}
        self._chain_users: dict[str, set[ServicePortName]] = {}
        self._port_rules = 0    # rules of the ports' own chains (affinity), kept as ports come and go

    def put(self, port: PortObjects | None, name: ServicePortName) -> set[ElementKey]:
        """Replace `name`'s contribution with `port` (None: remove it); the element keys touched."""
        touched: set[ElementKey] = set()
        old = self.ports.pop(name, None)
        if old is not None:
            self._port_rules -= sum(len(r) for _, r in old.chains)
            for key, _ in old.elements:
                owners = self._owners[key]
                del owners[name]
                if not owners:
                    del self._owners[key]
                touched.add(key)
            for chain in old.count_chains:
                users = self._chain_users[chain]
                users.discard(name)
                if not users:
                    del self._chain_users[chain]
        if port is not None:
            self.ports[name] = port
            self._port_rules += sum(len(r) for _, r in port.chains)
            for key, value in port.elements:
                self._owners.setdefault(key, {})[name] = value
                touched.add(key)
            for chain in port.count_chains:
                self._chain_users.setdefault(chain, set()).add(name)
        return touched

    def value(self, key: ElementKey) -> ElementValue | None:
        owners = self._owners.get(key)
        if not owners:
            return None
        return owners[min(owners)]

    def count_chains(self) -> set[str]:
        return set(self._chain_users)

    def size(self) -> int:
        """Elements plus rules, as `Contents.size` counts them, without building the contents or
        walking every port (a partial sync asks for it)."""
        rules = sum(len(r) for r in fixed_chains(self.node, self.settings).values())
        rules += sum(len(count_chain_rules(chain, self.node, self.settings)) for chain in self._chain_users)
        return len(self._owners) + rules + self._port_rules

    def contents(self) -> Contents:
        out = Contents(elements={holder: {} for holder in N.ELEMENT_HOLDERS})
        for (holder, key), owners in self._owners.items():
            out.elements[holder][key] = owners[min(owners)]
        out.chains = dict(fixed_chains(self.node, self.settings))
        for chain in sorted(self._chain_users):
            out.chains[chain] = count_chain_rules(chain, self.node, self.settings)
        for port in self.ports.values():
            out.chains.update(port.chains)
            out.sets.update(port.sets)
        return out


def assemble(ports: Iterable[PortObjects], *, node: NodeContext, settings: NftProxySettings) -> Assembly:
    assembly = Assembly(node, settings)
    for port in ports:
        assembly.put(port, port.name)
    return assembly

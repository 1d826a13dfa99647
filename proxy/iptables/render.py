"""The iptables service-proxy ruleset, rendered from a `ProxyState`: pure, deterministic, lean.

Why lean. Applying restore input costs time in proportion to the whole table, not to the
input: legacy iptables-restore (libiptc) reads, rebuilds and writes back the entire table
even for a three-line `--noflush` change, and iptables-nft-restore pays per rule and per
chain. Measured at 10,000 services x 10 endpoints, a kube-proxy-shaped table (a chain per
endpoint, a comment on every rule) makes even a tiny restore take 1.8 s; this shape takes
0.35 s. So per service port there is one chain holding ONE rule per endpoint (a random
choice that DNATs inline), endpoint chains exist only where ClientIP affinity needs a
`recent` list per endpoint, and the only comments name the service port on the few rules
that enter it (so `programmed()` can read names back after a restart).

nat table (first match wins; `M` is the masquerade mark, 0x4000 by default):

    PREROUTING, OUTPUT -> NETAGENT-SERVICES
      -d CLUSTER_IP -p P --dport PORT -> NETAGENT-SVC-h          (cluster IP, when it has endpoints)
      -d EXTERNAL_IP / LB_IP ...      -> NETAGENT-EXT-h
      -d LB_IP with source ranges     -> NETAGENT-FW-h            (allowed sources -> EXT-h)
      last: local destination (or each --nodeport-address) -> NETAGENT-NODEPORTS
    NETAGENT-NODEPORTS:   -p P --dport NODE_PORT -> NETAGENT-EXT-h
    NETAGENT-SVC-h:       mark M unless the source is in the cluster CIDR (all traffic when no
                          CIDR is known, or with MasqueradeScope.ALL); affinity `recent` checks;
                          then per endpoint `-m statistic --probability 1/(n-i) -j DNAT`
    NETAGENT-EXT-h:       Cluster policy: mark M, -> SVC-h (or SVL-h if the external set differs)
                          Local policy: pods -> SVC-h; local processes: mark M -> SVC-h;
                          the rest -> NETAGENT-SVL-h (the local endpoints, no mark: the
                          client's source address survives)
    NETAGENT-SVC-POSTRTG (from POSTROUTING): hairpin set match -> MASQUERADE; unmarked ->
                          RETURN; clear M; MASQUERADE

filter table:

    INPUT, FORWARD, OUTPUT (new connections) -> NETAGENT-SVC-FILTER
      a service port with no endpoints at all: NFLOG to the flow records' group (rate limited,
      prefix owned.NO_ENDPOINTS_LOG_PREFIX: `netagent flows` shows it "dropped (no-endpoints)"),
      then REJECT (icmp-port-unreachable, which makes a TCP connect fail at once too); endpoints but none for this traffic (a Local policy
      with no local endpoint): DROP; load-balancer IPs with source ranges: DROP. These only
      see packets nat left alone (a DNATed packet no longer has the service address), which
      is how a source range filters in nat's stead: DROP is not valid in nat.
    FORWARD -> NETAGENT-SVC-FORWARD: accept marked and established traffic (FORWARD DROP hosts)

Hairpin (a pod reaching itself through its service) costs no rule per endpoint: one
MASQUERADE rule matches the ipset NETAGENT-HAIRPIN (hash:ip,port,ip) against (destination
ip, destination port, source ip), and the set holds (endpoint, proto:port, endpoint) for
every endpoint; the backend syncs its members incrementally.

IPv6 (ip6tables, a ruleset rendered from a state whose `family` is IPv6): the same chains,
names and shape, with what the family's tools spell differently (as ip6tables-save prints it,
checked on both backends): host masks /128, loopback ::1/128, `--to-destination [addr]:port`,
REJECT with icmp6-port-unreachable, the recent match's mask of 128 bits, and a hairpin set of
its own (`family inet6`, NETAGENT-HAIRPIN6: ipsets are per namespace, not per family). The
masquerade mark is the same bit in both families.

The result is split the way a partial sync writes it: `ServicePortRules` per service port
(its own nat chains, plus its lines in the shared chains) and the shared chains assembled
from them. `render_ruleset(..., reuse=previous, changed=...)` renders only the changed
service ports and reuses the rest, with the same result as a full render. Rules are written
exactly as iptables-save prints them (checked against both real backends), so the kernel's
save and this text compare line for line.
"""
from __future__ import annotations

import enum
import functools
import ipaddress
import socket
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from types import MappingProxyType

from netagent.errors import NetagentError
from netagent.kernel import nflog, owned
from netagent.kernel.families import IpFamily
from netagent.kernel.ipset import entry as ipset_entry
from netagent.kernel.ipset.model import IpsetError
from netagent.kernel.iptables.restore_format import BUILTIN_CHAINS, join_tokens, quote_comment
from netagent.kernel.iptables.runner import PortRandomization
from proxy.service_hash import service_hash
from proxy.iptables.names import (
    FILTER_CHAIN,
    FORWARD_CHAIN,
    HAIRPIN_SET,
    NODEPORTS_CHAIN,
    POSTROUTING_CHAIN,
    SERVICES_CHAIN,
    ChainKind,
    chain_name,
    endpoint_chain,
)
from proxy.large_sync import CANONICAL_IPV4
from proxy.model import (
    Endpoint,
    EntryKind,
    EntryPoint,
    NodeContext,
    ProxyState,
    ServicePort,
    ServicePortName,
    TrafficPolicy,
)
from proxy.selection import EndpointSelection

TABLE_ORDER = ("filter", "nat")
LOOPBACK = "127.0.0.0/8"
REJECT = "REJECT --reject-with icmp-port-unreachable"
_LOOPBACK = {IpFamily.V4: LOOPBACK, IpFamily.V6: "::1/128"}
_REJECT = {IpFamily.V4: REJECT, IpFamily.V6: "REJECT --reject-with icmp6-port-unreachable"}
_LOG_NO_ENDPOINTS = " ".join(token for part in nflog.iptables_log(owned.NO_ENDPOINTS_LOG_PREFIX) for token in part)
_HOST_MASK = {IpFamily.V4: "255.255.255.255", IpFamily.V6: "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff"}


class UnrenderablePort(NetagentError, ValueError):
    """One service port's rules cannot be written (a value the token rules refuse); the
    backend leaves that port out as it does one the tool refuses."""

    def __init__(self, name: ServicePortName, reason: str) -> None:
        super().__init__(f"{name}: {reason}")
        self.name, self.reason = name, reason


class MasqueradeScope(str, enum.Enum):
    """Which cluster-IP traffic is masqueraded (NodePort and external traffic under the
    Cluster policy always is)."""
    OFF_CLUSTER = "off-cluster"   # sources outside the cluster CIDR (all when it is unknown)
    ALL = "all"                   # every source, kube-proxy's --masquerade-all


class JumpLines(enum.Enum):
    """Whether restore text carries the built-in chains and the jumps into ours."""
    OMIT = "omit"       # the agent's --noflush input: the backend places the jumps itself
    APPEND = "append"   # a self-contained ruleset (goldens, the tracer, a fresh namespace)


@dataclass(frozen=True)
class IptablesProxySettings:
    masquerade_mark: int = owned.MASQUERADE_MARK  # one bit
    masquerade: MasqueradeScope = MasqueradeScope.OFF_CLUSTER
    ports: PortRandomization = PortRandomization.FULLY
    hairpin_set: str = HAIRPIN_SET

    def __post_init__(self):
        mark = self.masquerade_mark
        if mark <= 0 or mark >= 1 << 32 or mark & (mark - 1):
            raise ValueError(f"masquerade mark {mark:#x} must be a single bit of the 32-bit mark")

    @property
    def mark(self) -> str:
        return f"{self.masquerade_mark:#x}"


@dataclass(frozen=True)
class RenderedChain:
    """One chain of ours and its rules, as restore lines (`-A NAME ...`)."""
    table: str
    name: str
    rules: tuple[str, ...]

    @property
    def declaration(self) -> str:
        return f":{self.name} - [0:0]"


@dataclass(frozen=True)
class BuiltinJump:
    """One jump from a built-in chain into ours; the backend keeps it on top of the chain."""
    table: str
    chain: str
    target: str
    comment: str
    match: tuple[str, ...] = ()

    @property
    def spec(self) -> tuple[str, ...]:
        return (*self.match, "-m", "comment", "--comment", self.comment, "-j", self.target)


@dataclass(frozen=True)
class ServicePortRules:
    """Everything one service port contributes: its own nat chains, its lines (rule specs
    without `-A CHAIN`) in the shared chains, and its hairpin set members."""
    name: ServicePortName
    chains: tuple[RenderedChain, ...]
    services: tuple[str, ...] = ()
    nodeports: tuple[str, ...] = ()
    filter: tuple[str, ...] = ()
    hairpin: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Ruleset:
    node: NodeContext
    settings: IptablesProxySettings
    ports: Mapping[ServicePortName, ServicePortRules]   # in name order
    shared: tuple[RenderedChain, ...]
    jumps: tuple[BuiltinJump, ...]
    hairpin_members: frozenset[str]

    def chains(self, table: str | None = None) -> list[RenderedChain]:
        """Shared chains first, then each service port's, in name order."""
        found = [chain for chain in self.shared if table in (None, chain.table)]
        for port in self.ports.values():
            found.extend(chain for chain in port.chains if table in (None, chain.table))
        return found

    def with_hairpin_set(self, name: str) -> Ruleset:
        """The same ruleset with its MASQUERADE rule matching the hairpin set `name` (the
        backend sizes the set from the members: hairpin.py)."""
        if name == self.settings.hairpin_set:
            return self
        match = f" --match-set {self.settings.hairpin_set} "
        shared = tuple(replace(chain, rules=tuple(rule.replace(match, f" --match-set {name} ", 1)
                                                  for rule in chain.rules))
                       if chain.name == POSTROUTING_CHAIN else chain for chain in self.shared)
        return replace(self, shared=shared)

    @property
    def rule_count(self) -> int:
        return sum(len(chain.rules) for chain in self.chains()) + len(self.jumps)

    def restore_text(self, *, jumps: JumpLines = JumpLines.OMIT) -> str:
        """The whole ruleset as restore input: per table, every chain declared (which creates
        or empties it under --noflush), then every rule, then COMMIT."""
        out: list[str] = []
        for table in TABLE_ORDER:
            chains = self.chains(table)
            out.append(f"*{table}")
            if jumps is JumpLines.APPEND:
                out.extend(f":{builtin} ACCEPT [0:0]" for builtin in BUILTIN_CHAINS[table])
            out.extend(chain.declaration for chain in chains)
            if jumps is JumpLines.APPEND:
                out.extend(f"-A {jump.chain} {join_tokens(jump.spec)}" for jump in self.jumps
                           if jump.table == table)
            for chain in chains:
                out.extend(chain.rules)
            out.append("COMMIT")
        return "\n".join(out) + "\n"


SERVICE_JUMP_COMMENT = "netagent: service portals"
POSTROUTING_JUMP_COMMENT = "netagent: service masquerade"
FILTER_JUMP_COMMENT = "netagent: service reject, drop and source ranges"
FORWARD_JUMP_COMMENT = "netagent: forward service traffic"
NEW_CONNECTIONS = ("-m", "conntrack", "--ctstate", "NEW")

BUILTIN_JUMPS = (
    BuiltinJump("filter", "INPUT", FILTER_CHAIN, FILTER_JUMP_COMMENT, NEW_CONNECTIONS),
    BuiltinJump("filter", "FORWARD", FILTER_CHAIN, FILTER_JUMP_COMMENT, NEW_CONNECTIONS),
    BuiltinJump("filter", "FORWARD", FORWARD_CHAIN, FORWARD_JUMP_COMMENT),
    BuiltinJump("filter", "OUTPUT", FILTER_CHAIN, FILTER_JUMP_COMMENT, NEW_CONNECTIONS),
    BuiltinJump("nat", "PREROUTING", SERVICES_CHAIN, SERVICE_JUMP_COMMENT),
    BuiltinJump("nat", "OUTPUT", SERVICES_CHAIN, SERVICE_JUMP_COMMENT),
    BuiltinJump("nat", "POSTROUTING", POSTROUTING_CHAIN, POSTROUTING_JUMP_COMMENT),
)


# ---- the whole ruleset ------------------------------------------------------------------------

def render_ruleset(state: ProxyState, *, settings: IptablesProxySettings, reuse: Ruleset | None = None,
                   changed: Iterable[ServicePortName] | None = None) -> Ruleset:
    """The ruleset for `state`. With `reuse` (a ruleset rendered for the same node and
    settings) and `changed`, service ports not in `changed` are taken from `reuse` rather
    than rendered again; the result is the same as without."""
    reusable: Mapping[ServicePortName, ServicePortRules] = {}
    if reuse is not None and changed is not None and reuse.node == state.node and reuse.settings == settings:
        changed = frozenset(changed)
        reusable = {name: rules for name, rules in reuse.ports.items() if name not in changed}
    ports = {}
    for name in sorted(state.services, key=_name_key):
        rules = reusable.get(name)
        if rules is None:
            try:
                rules = render_service_port(state.services[name], state.selection(name),
                                            node=state.node, settings=settings)
            except (ValueError, IpsetError) as error:  # tokens.UnsafeText, a set member it cannot be
                raise UnrenderablePort(name, str(error)) from error
        ports[name] = rules
    return assemble_ruleset(ports, node=state.node, settings=settings)


def _name_key(name: ServicePortName) -> tuple[str, str, str]:
    return name.namespace, name.name, name.port


def assemble_ruleset(ports: Mapping[ServicePortName, ServicePortRules], *, node: NodeContext,
                     settings: IptablesProxySettings) -> Ruleset:
    """The shared chains around per-service-port rules (`ports` in the order to write them)."""
    mark = f"{settings.mark}/{settings.mark}"
    masquerade = " ".join(settings.ports.target)
    services = [f"-A {SERVICES_CHAIN} {line}" for rules in ports.values() for line in rules.services]
    services.extend(f"-A {SERVICES_CHAIN} {match} -j {NODEPORTS_CHAIN}" for match in _nodeport_matches(node))
    shared = (
        RenderedChain("filter", FILTER_CHAIN,
                      tuple(f"-A {FILTER_CHAIN} {line}" for rules in ports.values() for line in rules.filter)),
        RenderedChain("filter", FORWARD_CHAIN, (
            f"-A {FORWARD_CHAIN} -m mark --mark {mark} -j ACCEPT",
            f"-A {FORWARD_CHAIN} -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT",
        )),
        RenderedChain("nat", SERVICES_CHAIN, tuple(services)),
        RenderedChain("nat", NODEPORTS_CHAIN,
                      tuple(f"-A {NODEPORTS_CHAIN} {line}" for rules in ports.values() for line in rules.nodeports)),
        RenderedChain("nat", POSTROUTING_CHAIN, (
            f"-A {POSTROUTING_CHAIN} -m set --match-set {settings.hairpin_set} dst,dst,src -j {masquerade}",
            f"-A {POSTROUTING_CHAIN} -m mark ! --mark {mark} -j RETURN",
            f"-A {POSTROUTING_CHAIN} -j MARK --set-xmark {settings.mark}/0x0",
            f"-A {POSTROUTING_CHAIN} -j {masquerade}",
        )),
    )
    hairpin: set[str] = set()
    for rules in ports.values():
        hairpin.update(rules.hairpin)
    return Ruleset(node=node, settings=settings, ports=MappingProxyType(dict(ports)), shared=shared,
                   jumps=BUILTIN_JUMPS, hairpin_members=frozenset(hairpin))


def _nodeport_matches(node: NodeContext) -> list[str]:
    """Where NodePorts answer: every local address but loopback (NodePorts on 127.0.0.1 would
    need route_localnet), or only the configured addresses."""
    if not node.nodeport_addresses:
        return [f"! -d {_LOOPBACK[node.family]} -m addrtype --dst-type LOCAL"]
    return [_address_match(address) for address in node.nodeport_addresses]


def _address_match(address: str) -> str:
    network = _canonical_network(address)
    if ipaddress.ip_network(network).prefixlen == IpFamily.of(network).max_prefix:   # one host
        return f"-d {network}"
    return f"-d {network} -m addrtype --dst-type LOCAL"


# ---- one service port -------------------------------------------------------------------------

def render_service_port(service: ServicePort, selection: EndpointSelection, *, node: NodeContext,
                        settings: IptablesProxySettings) -> ServicePortRules:
    """`selection`: the service port's endpoints as `ProxyState.selection` chose them."""
    proto = service.protocol.lowercase
    port_match = f"-p {proto}"
    mark = f"-j MARK --set-xmark {settings.mark}/{settings.mark}"
    family = node.family
    host = f"/{family.max_prefix}"

    def entry(kind: EntryKind, destination: str, port: int, *, extra: str = "") -> str:
        comment = quote_comment(f"{service.name} {kind.value}")
        return f"{destination}{port_match} -m comment --comment {comment}{extra} -m {proto} --dport {port}"

    def entries(point: EntryPoint) -> list[str]:
        """The entry's match lines; a NodePort (no address: every local one) at each nodeport match."""
        if point.address is None:
            return [_nodeport_filter_entry(entry, match, point.port) for match in _nodeport_matches(node)]
        return [entry(point.kind, f"-d {point.address}{host} ", point.port)]

    by_kind: dict[EntryKind, list[str]] = {kind: [] for kind in EntryKind}
    for point in service.entry_points():
        by_kind[point.kind].extend(entries(point))
    (cluster_entry,) = by_kind[EntryKind.CLUSTER_IP]
    external_entries = by_kind[EntryKind.EXTERNAL_IP]
    fenced = bool(service.load_balancer_source_ranges)
    balancer_entries = by_kind[EntryKind.LOAD_BALANCER]
    nodeport_entries = by_kind[EntryKind.NODE_PORT]

    if not selection.has_endpoints:
        rejected = [cluster_entry, *external_entries, *balancer_entries, *nodeport_entries]
        return ServicePortRules(service.name, (), filter=tuple(
            rule for line in rejected for rule in (f"{line} {_LOG_NO_ENDPOINTS}", f"{line} -j {_REJECT[family]}")))

    hashed = service_hash(service.name, service.protocol)
    svc, svl, ext, fw = (chain_name(kind, hashed) for kind in
                         (ChainKind.SERVICE, ChainKind.SECOND, ChainKind.EXTERNAL, ChainKind.FIREWALL))
    cluster_cidr = _canonical_network(node.cluster_cidr) if node.cluster_cidr else None
    cluster_rules = [f"-A {svc} ! -s {cluster_cidr} {mark}"
                     if cluster_cidr and settings.masquerade is MasqueradeScope.OFF_CLUSTER
                     else f"-A {svc} {mark}"]
    endpoint_chains: dict[str, RenderedChain] = {}
    chains, services, nodeports, filtered = [], [], [], []
    if selection.cluster:
        cluster_rules += _balance(svc, service, selection.cluster, endpoint_chains, family)
        chains.append(RenderedChain("nat", svc, tuple(cluster_rules)))
        services.append(f"{cluster_entry} -j {svc}")
    else:   # endpoints elsewhere only, internal policy Local: nothing for cluster-IP traffic here
        filtered.append(f"{cluster_entry} -j DROP")

    if service.has_external_addresses:
        local_policy = service.external_policy is TrafficPolicy.LOCAL
        if selection.external and (local_policy or selection.external != selection.cluster):
            chains.append(RenderedChain("nat", svl, tuple(_balance(svl, service, selection.external,
                                                                   endpoint_chains, family))))
            external_target = svl
        else:
            external_target = svc
        if local_policy:
            ext_rules = []
            if selection.cluster:   # pods and the node itself are served like cluster-IP clients
                ext_rules += [f"-A {ext} -s {cluster_cidr} -j {svc}"] if cluster_cidr else []
                ext_rules += [f"-A {ext} -m addrtype --src-type LOCAL {mark}",
                              f"-A {ext} -m addrtype --src-type LOCAL -j {svc}"]
            if selection.external:
                ext_rules.append(f"-A {ext} -j {svl}")
        else:
            ext_rules = [f"-A {ext} {mark}", f"-A {ext} -j {external_target}"]
        chains.append(RenderedChain("nat", ext, tuple(ext_rules)))
        services.extend(f"{line} -j {ext}" for line in external_entries)
        services.extend(f"{line} -j {fw if fenced else ext}" for line in balancer_entries)
        if fenced:
            chains.append(RenderedChain("nat", fw, tuple(
                f"-A {fw} -s {_canonical_network(source)} -j {ext}"
                for source in service.load_balancer_source_ranges)))
        if service.node_port:
            nodeports.append(f"{entry(EntryKind.NODE_PORT, '', service.node_port)} -j {ext}")
        if not selection.external:
            filtered.extend(f"{line} -j DROP" for line in [*external_entries, *balancer_entries, *nodeport_entries])
        elif fenced:
            filtered.extend(f"{line} -j DROP" for line in balancer_entries)
    chains.extend(endpoint_chains[name] for name in sorted(endpoint_chains))
    hairpin = frozenset(_hairpin_member(endpoint, proto) for endpoint in selection.all_selected)
    return ServicePortRules(service.name, tuple(chains), services=tuple(services), nodeports=tuple(nodeports),
                            filter=tuple(filtered), hairpin=hairpin)


def _nodeport_filter_entry(entry, match: str, node_port: int) -> str:
    """A filter-table entry for the node port at one of the nodeport matches: the address
    part goes first (as save prints it), the addrtype match after the comment."""
    destination, _, addrtype = match.partition(" -m addrtype ")
    extra = f" -m addrtype {addrtype}" if addrtype else ""
    return entry(EntryKind.NODE_PORT, f"{destination} ", node_port, extra=extra)


def _balance(chain: str, service: ServicePort, endpoints: tuple[Endpoint, ...],
             endpoint_chains: dict[str, RenderedChain], family: IpFamily) -> list[str]:
    """The endpoint choice: affinity checks first (with affinity), then one rule per endpoint
    taking 1/(n-i) of what is left, the last one taking the rest."""
    proto = service.protocol.lowercase
    ordered = sorted(endpoints, key=lambda endpoint: _endpoint_key(endpoint, family))
    mask = _HOST_MASK[family]
    count = len(ordered)
    rules = []
    if service.affinity_timeout is None:
        for index, endpoint in enumerate(ordered):
            choice = f"-m statistic --mode random --probability {_probability(count - index)} " \
                if index < count - 1 else ""
            rules.append(f"-A {chain} -p {proto} {choice}-j DNAT --to-destination {_dnat_to(endpoint, family)}")
        return rules
    seps = [endpoint_chain(service, endpoint) for endpoint in ordered]
    for sep, endpoint in zip(seps, ordered):
        rules.append(f"-A {chain} -m recent --rcheck --seconds {service.affinity_timeout} --reap "
                     f"--name {sep} --mask {mask} --rsource -j {sep}")
        endpoint_chains[sep] = RenderedChain("nat", sep, (
            f"-A {sep} -p {proto} -m recent --set --name {sep} --mask {mask} --rsource "
            f"-j DNAT --to-destination {_dnat_to(endpoint, family)}",))
    for index, sep in enumerate(seps):
        choice = f"-m statistic --mode random --probability {_probability(count - index)} " \
            if index < count - 1 else ""
        rules.append(f"-A {chain} {choice}-j {sep}")
    return rules


@functools.lru_cache(maxsize=4096)
def _canonical_network(text: str) -> str:
    """`10.244.0.0/16`, `192.0.2.7/32`: the spelling save prints for -s/-d."""
    return str(ipaddress.ip_network(text, strict=False))


def _dnat_to(endpoint: Endpoint, family: IpFamily) -> str:
    """`10.0.0.5:8080`, `[fd00::5]:8080`: DNAT's address and port, as save prints them
    (`family`: the state's, every endpoint's)."""
    return f"[{endpoint.ip}]:{endpoint.port}" if family is IpFamily.V6 else endpoint.address


def _endpoint_key(endpoint: Endpoint, family: IpFamily) -> tuple[bytes, int]:
    if family is IpFamily.V6:
        return socket.inet_pton(socket.AF_INET6, endpoint.ip), endpoint.port
    return socket.inet_aton(endpoint.ip), endpoint.port


def _hairpin_member(endpoint: Endpoint, proto: str) -> str:
    """`ip,proto:port,ip` as ipset spells it. An address already in canonical dotted-decimal
    form is spelled directly (ipset.entry validates through ipaddress, which at 100,000
    endpoints costs seconds); anything else goes through entry(), which canonicalises or
    refuses it."""
    if CANONICAL_IPV4.fullmatch(endpoint.ip) and 0 <= endpoint.port <= 65535:
        return f"{endpoint.ip},{proto}:{endpoint.port},{endpoint.ip}"
    return ipset_entry(endpoint.ip, proto, endpoint.port, extra_ip=endpoint.ip)


@functools.lru_cache(maxsize=1024)
def _probability(remaining: int) -> str:
    """1/remaining as iptables-save prints it: the kernel keeps round(2^31 * p) and save
    prints that back with 11 decimals; rendering the same makes our text equal the saved."""
    stored = int(0x80000000 / remaining + 0.5)
    return f"{stored / 0x80000000:.11f}"

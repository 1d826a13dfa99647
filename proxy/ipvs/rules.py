"""The IPVS backend's iptables rules and the ipsets they match: constant rules, changing sets.

IPVS balances; iptables only has to say which of those connections are masqueraded, refused
or filtered. Every rule matches an ipset, so the ruleset is the same ten rules at one service
or ten thousand, and a sync changes set members, never rules (kube-proxy's IPVS design; the
names and the rules are ours).

IPv6 (`family=IpFamily.V6`): the same chains under the same names in ip6tables (rejecting with
icmp6-port-unreachable), matching the same sets of `family inet6` named NETAGENT-IPVS6-<set>
(`family_set`): ipsets are per namespace, not per family, so the two families' sets need names
of their own, and NETAGENT-IPVS- is not a prefix of NETAGENT-IPVS6- (each family's cleanup
deletes its own sets by prefix, `set_prefix`).

Sets (hash types, `family inet`; members spelled by netagent.kernel.ipset.entry):
  CLUSTER-IP      cluster IP,proto:port of every service port
  EXTERNAL        external and load-balancer IP,proto:port, externalTrafficPolicy Cluster
  EXTERNAL-LOCAL  external and load-balancer IP,proto:port, externalTrafficPolicy Local
  ADDRESSES       every service address na-ipvs0 holds (hash:ip): the addresses IPVS makes local
  NODEPORT        node address,proto:nodePort, externalTrafficPolicy Cluster
  NODEPORT-LOCAL  node address,proto:nodePort, externalTrafficPolicy Local. No rule matches it:
                  it records which virtual servers on the node's own addresses are ours (those
                  on na-ipvs0's addresses are ours by the device), so a restart or a cleanup can
                  remove a stale NodePort without touching anyone else's virtual servers.
  HAIRPIN         endpoint,proto:port,endpoint: a pod reaching itself through a service
  LB-FW           load-balancer IP,proto:port of services with loadBalancerSourceRanges
  LB-SRC          load-balancer IP,proto:port,allowed source CIDR
  NO-EP           every address,proto:port of a service port without any endpoint

Chains (nat):
  NETAGENT-IPVS-SVCS    <- PREROUTING, OUTPUT. Marks (0x4000) what must be masqueraded, before
                        IPVS rewrites the destination (nat runs at priority -100, IPVS after):
                        a cluster IP reached from outside the cluster CIDR (every source when the
                        cluster CIDR is unknown), external/LB IPs and NodePorts under policy
                        Cluster. Policy Local is not marked: the endpoint sees the client.
  NETAGENT-IPVS-POSTRTG <- POSTROUTING. Hairpin connections (after IPVS: destination, port and
                        source all the endpoint) and marked ones are masqueraded; the mark is
                        cleared first so a later pass (an encapsulating device) does not repeat it.
Chains (filter):
  NETAGENT-IPVS-FILTER  <- INPUT, OUTPUT, FORWARD. New connections to a service port without
                        endpoints are REJECTed (ICMP port unreachable: the client fails at once;
                        a virtual server without real servers would not say so on every path).
                        Only NEW ones: a connection draining to a weight-0 real server after its
                        endpoint was deleted keeps going. Load-balancer traffic from sources
                        outside loadBalancerSourceRanges is dropped (Kubernetes' behaviour).
                        A new connection to a service address (ADDRESSES) on a port that is not
                        one of its service ports (CLUSTER-IP, EXTERNAL, EXTERNAL-LOCAL) is dropped:
                        the address is local on na-ipvs0, so without this every socket of the node
                        listening on a wildcard address (sshd, the kubelet) would answer on a
                        Service's address (kube-proxy's KUBE-IPVS-IPS filter; issue 29, item 4).
                        filter INPUT runs before IPVS's LOCAL_IN hook, so these rules see the
                        service address, not the endpoint.
  NETAGENT-IPVS-FORWARD <- FORWARD. Accepts packets of established connections: an endpoint's
                        reply to an off-node client is forwarded by the node and de-NATed by IPVS
                        after the filter table, so a FORWARD policy of DROP would eat it.

Rules are written in the exact form iptables-save prints them (`--set-xmark`, the REJECT's
`--reject-with`), measured with both backends, so comparing saved rules with these finds
drift without false alarms: `ensure_ipvs_rules` writes only when something differs, and a
restarted agent writes nothing.
"""
from __future__ import annotations

import dataclasses
import ipaddress
from dataclasses import dataclass

from netagent.kernel import owned
from netagent.kernel.families import IpFamily
from netagent.kernel.ipset import IpsetSpec, IpsetType
from netagent.kernel.iptables.restore_format import RestoreBuilder, Table, canonical_spec
from netagent.kernel.iptables.runner import (
    Iptables,
    JumpPosition,
    PortRandomization,
    add_jump_repair,
    jump_drift,
    jump_spec,
)

SET_PREFIX = owned.IPVS_SET_PREFIX
SET6_PREFIX = owned.IPVS6_SET_PREFIX
CHAIN_PREFIX = owned.IPVS_SET_PREFIX
MASQUERADE_MARK = owned.MASQUERADE_MARK

CLUSTER_IP_SET = IpsetSpec(f"{SET_PREFIX}CLUSTER-IP", IpsetType.HASH_IP_PORT,
                           "cluster IP,proto:port of every service port")
EXTERNAL_SET = IpsetSpec(f"{SET_PREFIX}EXTERNAL", IpsetType.HASH_IP_PORT,
                         "external and load-balancer IP,proto:port under externalTrafficPolicy Cluster")
NODEPORT_SET = IpsetSpec(f"{SET_PREFIX}NODEPORT", IpsetType.HASH_IP_PORT,
                         "node address,proto:nodePort under externalTrafficPolicy Cluster")
NODEPORT_LOCAL_SET = IpsetSpec(f"{SET_PREFIX}NODEPORT-LOCAL", IpsetType.HASH_IP_PORT,
                               "node address,proto:nodePort under externalTrafficPolicy Local")
HAIRPIN_SET = IpsetSpec(f"{SET_PREFIX}HAIRPIN", IpsetType.HASH_IP_PORT_IP,
                        "endpoint,proto:port,endpoint: pods reaching themselves through a service")
LB_FIREWALL_SET = IpsetSpec(f"{SET_PREFIX}LB-FW", IpsetType.HASH_IP_PORT,
                            "load-balancer IP,proto:port with loadBalancerSourceRanges")
LB_SOURCES_SET = IpsetSpec(f"{SET_PREFIX}LB-SRC", IpsetType.HASH_IP_PORT_NET,
                           "load-balancer IP,proto:port,allowed source range")
EXTERNAL_LOCAL_SET = IpsetSpec(f"{SET_PREFIX}EXTERNAL-LOCAL", IpsetType.HASH_IP_PORT,
                               "external and load-balancer IP,proto:port under externalTrafficPolicy Local")
SERVICE_ADDRESSES_SET = IpsetSpec(f"{SET_PREFIX}ADDRESSES", IpsetType.HASH_IP,
                                  "every service address on the IPVS device (other ports dropped)")
NO_ENDPOINTS_SET = IpsetSpec(f"{SET_PREFIX}NO-EP", IpsetType.HASH_IP_PORT,
                             "address,proto:port of service ports without endpoints (rejected)")
IPVS_SETS: tuple[IpsetSpec, ...] = (CLUSTER_IP_SET, EXTERNAL_SET, NODEPORT_SET, NODEPORT_LOCAL_SET, HAIRPIN_SET,
                                    LB_FIREWALL_SET, LB_SOURCES_SET, NO_ENDPOINTS_SET, EXTERNAL_LOCAL_SET,
                                    SERVICE_ADDRESSES_SET)
NODEPORT_SETS = (NODEPORT_SET, NODEPORT_LOCAL_SET)



def set_prefix(family: IpFamily) -> str:
    """The prefix of every set of `family`'s backend (and of no set of the other's)."""
    return SET_PREFIX if family is IpFamily.V4 else SET6_PREFIX


def family_set(spec: IpsetSpec, family: IpFamily) -> IpsetSpec:
    """The kernel set of `family` for one of the sets above (IPv4: the set itself)."""
    if family is IpFamily.V4:
        return spec
    return dataclasses.replace(spec, name=SET6_PREFIX + spec.name.removeprefix(SET_PREFIX), family=family.ipset)


SERVICES_CHAIN = f"{CHAIN_PREFIX}SVCS"
POSTROUTING_CHAIN = f"{CHAIN_PREFIX}POSTRTG"
FILTER_CHAIN = f"{CHAIN_PREFIX}FILTER"
FORWARD_CHAIN = f"{CHAIN_PREFIX}FORWARD"


@dataclass(frozen=True)
class IpvsChain:
    """One chain of ours, the built-in chains that jump to it, and its wanted rules."""
    table: str
    name: str
    parents: tuple[str, ...]
    jump_comment: str
    rules: tuple[tuple[str, ...], ...]

    @property
    def jump(self) -> tuple[str, ...]:
        return jump_spec(self.name, comment=self.jump_comment)


def _rule(*parts: str) -> tuple[str, ...]:
    return canonical_spec(parts)


def _match(spec: IpsetSpec, directions: str, *, negate: bool = False) -> tuple[str, ...]:
    return ("-m", "set") + (("!",) if negate else ()) + ("--match-set", spec.name, directions)


def render_ipvs_chains(*, cluster_cidr: str | None, ports: PortRandomization = PortRandomization.FULLY,
                       mark: int = MASQUERADE_MARK, hairpin_set: str | None = None,
                       family: IpFamily = IpFamily.V4) -> tuple[IpvsChain, ...]:
    """The four chains, in the form (ip6)tables-save prints them. Pure. `hairpin_set` is the
    hairpin set of the size the state needs (proxy/hairpin_set.py: a larger one replaces it;
    None: the family's base set). `cluster_cidr` is `family`'s (ValueError for another family's)."""
    def match(spec: IpsetSpec, directions: str, *, negate: bool = False) -> tuple[str, ...]:
        return _match(family_set(spec, family), directions, negate=negate)

    hairpin_set = hairpin_set or family_set(HAIRPIN_SET, family).name
    set_mark = ("-j", "MARK", "--set-xmark", f"{mark:#x}/{mark:#x}")
    masquerade = ("-j", *ports.target)
    from_outside: tuple[str, ...] = ()
    if cluster_cidr:
        network = ipaddress.ip_network(cluster_cidr, strict=False)
        if IpFamily.of(network) is not family:
            raise ValueError(f"cluster CIDR {network} is not {family.label}")
        from_outside = ("!", "-s", str(network))
    reject = "icmp-port-unreachable" if family is IpFamily.V4 else "icmp6-port-unreachable"
    services = (
        _rule(*from_outside, *match(CLUSTER_IP_SET, "dst,dst"), *set_mark),
        _rule(*match(EXTERNAL_SET, "dst,dst"), *set_mark),
        _rule(*match(NODEPORT_SET, "dst,dst"), *set_mark),
    )
    postrouting = (
        _rule("-m", "set", "--match-set", hairpin_set, "dst,dst,src", *masquerade),
        _rule("-m", "mark", "!", "--mark", f"{mark:#x}/{mark:#x}", "-j", "RETURN"),
        _rule("-j", "MARK", "--set-xmark", f"{mark:#x}/0x0"),
        _rule(*masquerade),
    )
    filtering = (
        _rule("-m", "conntrack", "--ctstate", "NEW", *match(NO_ENDPOINTS_SET, "dst,dst"),
              "-j", "REJECT", "--reject-with", reject),
        _rule(*match(LB_FIREWALL_SET, "dst,dst"), *match(LB_SOURCES_SET, "dst,dst,src", negate=True),
              "-j", "DROP"),
        _rule("-m", "conntrack", "--ctstate", "NEW", *match(SERVICE_ADDRESSES_SET, "dst"),
              *match(CLUSTER_IP_SET, "dst,dst", negate=True), *match(EXTERNAL_SET, "dst,dst", negate=True),
              *match(EXTERNAL_LOCAL_SET, "dst,dst", negate=True), "-j", "DROP"),
    )
    forward = (
        _rule("-m", "conntrack", "--ctstate", "RELATED,ESTABLISHED", "-j", "ACCEPT"),
    )
    return (
        IpvsChain("nat", SERVICES_CHAIN, ("PREROUTING", "OUTPUT"), "netagent: ipvs services", services),
        IpvsChain("nat", POSTROUTING_CHAIN, ("POSTROUTING",), "netagent: ipvs masquerade", postrouting),
        IpvsChain("filter", FORWARD_CHAIN, ("FORWARD",), "netagent: ipvs forward replies", forward),
        IpvsChain("filter", FILTER_CHAIN, ("INPUT", "OUTPUT", "FORWARD"), "netagent: ipvs reject and firewall",
                  filtering),
    )


def chain_drift(table: Table, chain: IpvsChain) -> list[str]:
    """What differs from the wanted chain and its jumps, one sentence each (empty: in sync)."""
    where = f"{chain.table} {chain.name}"
    current = table.chains.get(chain.name)
    problems = []
    if current is None:
        problems.append(f"{where}: chain missing")
    elif tuple(current.rules) != chain.rules:
        problems.append(f"{where}: {len(current.rules)} rule(s) differ from the {len(chain.rules)} wanted")
    for parent in chain.parents:
        problems += jump_drift(table, parent, chain.jump, position=JumpPosition.FIRST)
    return problems


def ensure_ipvs_rules(iptables: Iptables, chains: tuple[IpvsChain, ...]) -> list[str]:
    """Rewrite what drifted; returns the problems repaired. One save of every table to read,
    and one restore (one block per table) when something drifted: nothing written otherwise.
    The sets the rules match must exist first: the kernel refuses a rule naming a missing set."""
    tables = iptables.tables()
    problems = []
    builder = RestoreBuilder()
    for chain in chains:
        current = tables.get(chain.table) or Table(chain.table)
        chain_problems = chain_drift(current, chain)
        if not chain_problems:
            continue
        problems += chain_problems
        builder.declare_chain(chain.table, chain.name)
        for spec in chain.rules:
            builder.append(chain.table, chain.name, spec)
        for parent in chain.parents:
            if jump_drift(current, parent, chain.jump, position=JumpPosition.FIRST):
                add_jump_repair(builder, current, parent, chain.jump, position=JumpPosition.FIRST)
    if builder:
        iptables.restore(builder.text())
    return problems


def remove_ipvs_rules(iptables: Iptables, chains: tuple[IpvsChain, ...]) -> None:
    """Remove our chains and the jumps to them; quiet when already gone."""
    for table_name in dict.fromkeys(chain.table for chain in chains):
        iptables.delete_chains(table_name, [chain.name for chain in chains if chain.table == table_name])

"""Which external and load-balancer IPs a Service may claim on this node: none that hijacks.

A Service's `spec.externalIPs` are written by whoever may write the Service (a tenant), and every
proxy mode makes the node answer on them: IPVS even makes each one a local address of every node.
A tenant naming the API server's address cut every kubelet and agent off it (issue 29, item 4);
naming a node's address, a pod's or a cluster IP steals that traffic the same way. So before a
Service is programmed, `AddressGuard.screen` refuses each external or load-balancer IP that is:

- the API server's address: where the agent reaches it (`kube/config.api_server_addresses`:
  its client's host, resolved, and `$KUBERNETES_SERVICE_HOST`), and the addresses of the
  `default/kubernetes` EndpointSlices (the API servers themselves, as the cluster publishes
  them; the catalog passes them in);
- an address of this node (`NodeContext.local_addresses`; other nodes' addresses are not known to
  the proxy, so a Service can still name one of them: see the closing note of issue 29);
- inside the pod network (`--cluster-cidr`) or the Service network (`--service-cidr`, the
  flag the node agent already takes; only when given: its kubeadm default is the node agent's
  guess, so with no flag the Service-range check is skipped, and the log says so once);
- not a unicast address a client can reach (loopback, unspecified, link-local, multicast,
  the IPv4 broadcast).

With `--deny-external-ips` (the `DenyServiceExternalIPs` admission plugin's policy, enforced on the
node for a cluster that cannot turn the plugin on) every external IP is refused; load-balancer
IPs, which a controller writes to the status, still pass the checks above.

The refusal is per address, as kube-proxy drops what it cannot use: the Service keeps its cluster
IP, NodePorts and good addresses, and the catalog rejects it with the reason `forbidden-address`
(a log line, the gauge, an Event on the Service) naming each refused address and why.
"""
from __future__ import annotations

import ipaddress
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace

from netagent.kernel.families import IpFamily
from proxy.model import NodeContext, ServicePort, ServicePortName

log = logging.getLogger("netagent.proxy.external_ips")

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


@dataclass(frozen=True)
class ExternalIpPolicy:
    """The operator's part: refuse every external IP, and the Service ranges (none: unknown)."""
    deny_external_ips: bool = False
    service_cidrs: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for cidr in self.service_cidrs:
            ipaddress.ip_network(cidr, strict=False)   # ValueError: a bad flag fails at start


def add_external_ip_arguments(group) -> None:
    group.add_argument("--deny-external-ips", action="store_true",
                       help="refuse every Service externalIP (as the DenyServiceExternalIPs admission plugin); "
                            "addresses of the node, pod and Service networks and the API server's are refused always")


def external_ip_policy_from_args(args) -> ExternalIpPolicy:
    """`--deny-external-ips`, and the node agent's `--service-cidr` when it was given."""
    cidrs = getattr(args, "service_cidr", None) or ()
    if isinstance(cidrs, str):
        cidrs = (cidrs,)
    return ExternalIpPolicy(deny_external_ips=bool(getattr(args, "deny_external_ips", False)),
                            service_cidrs=tuple(part.strip() for value in cidrs for part in value.split(",")
                                                if part.strip()))


def _address(text: object) -> str | None:
    try:
        return str(ipaddress.ip_address(str(text).strip().strip("[]")))
    except ValueError:
        return None


@dataclass(frozen=True)
class AddressGuard:
    """Everything one family's screening needs (a value: the catalog screens every Service again
    when it changes)."""
    policy: ExternalIpPolicy = ExternalIpPolicy()
    cluster_cidr: str | None = None
    node_addresses: frozenset[str] = frozenset()
    api_servers: frozenset[str] = frozenset()

    @classmethod
    def of(cls, policy: ExternalIpPolicy, node: NodeContext, api_servers: Iterable[str]) -> AddressGuard:
        return cls(policy=policy, cluster_cidr=node.cluster_cidr, node_addresses=frozenset(node.local_addresses),
                   api_servers=frozenset(api_servers))

    def _networks(self) -> list[tuple[Network, str]]:
        networks: list[tuple[Network, str]] = []
        if self.cluster_cidr:
            networks.append((ipaddress.ip_network(self.cluster_cidr, strict=False),
                             f"inside the pod network {self.cluster_cidr} (--cluster-cidr)"))
        for cidr in self.policy.service_cidrs:
            network = ipaddress.ip_network(cidr, strict=False)
            networks.append((network, f"inside the Service network {network} (--service-cidr)"))
        return networks

    def why_refused(self, address: str, *, external_ip: bool) -> str | None:
        """Why `address` may not be claimed (None: it may)."""
        if external_ip and self.policy.deny_external_ips:
            return "this node refuses external IPs (--deny-external-ips)"
        ip = ipaddress.ip_address(address)
        if address in self.api_servers:
            return "the API server's address"
        if address in self.node_addresses:
            return "an address of this node"
        if ip.is_loopback or ip.is_unspecified or ip.is_link_local or ip.is_multicast or \
                ip == ipaddress.IPv4Address("255.255.255.255"):
            return "not a unicast address a client can reach"
        family = IpFamily.of(ip)
        for network, why in self._networks():
            if IpFamily.of(network) is family and ip in network:
                return why
        return None

    def screen(self, ports: Mapping[ServicePortName, ServicePort]) -> tuple[dict[ServicePortName, ServicePort],
                                                                           tuple[str, ...]]:
        """`ports` without the addresses they may not claim, and one sentence per refused address."""
        refused: dict[str, str] = {}

        def keep(addresses: Iterable[str], *, external_ip: bool) -> tuple[str, ...]:
            kept = []
            for address in addresses:
                why = self.why_refused(address, external_ip=external_ip)
                if why is None:
                    kept.append(address)
                else:
                    kind = "external IP" if external_ip else "load-balancer IP"
                    refused.setdefault(f"{kind} {address}", why)
            return tuple(kept)

        screened = {}
        for name, port in ports.items():
            external = keep(port.external_ips, external_ip=True)
            balancers = keep(port.load_balancer_ips, external_ip=False)
            if external != port.external_ips or balancers != port.load_balancer_ips:
                port = replace(port, external_ips=external, load_balancer_ips=balancers,
                               load_balancer_source_ranges=port.load_balancer_source_ranges if balancers else ())
            screened[name] = port
        return screened, tuple(f"{what}: {why}" for what, why in sorted(refused.items()))


def log_unknown_service_range(policy: ExternalIpPolicy, family: IpFamily) -> None:
    if not any(IpFamily.of(cidr) is family for cidr in policy.service_cidrs):
        log.info("no %s --service-cidr given: external IPs inside the Service range are not refused", family.label)

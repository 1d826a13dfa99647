"""The service proxy's per-object and per-node limits: what bounds the work one object can cause.

Every Service and EndpointSlice is untrusted, and the work of programming one grows with its
ports and endpoints: one Service with 100,000 ports rendered 300,000 iptables rules (35 MB of
restore input, 8 s) before these limits. So the proxy refuses, with a `too-large` rejection
(`infra/rejections.py`: a log line, the `netagent_rejected_objects` gauge, an Event, the
proxy's /healthz details), any object above them, and the rest of the cluster keeps its
programming. The defaults sit well above what a real cluster writes and well below what
hurts a node:

- `ports_per_service` (1,000): Kubernetes sets no limit, but a Service with more ports than
  this is a port range written out by hand; `--proxy-max-ports-per-service`.
- `addresses_per_service` (1,000): external IPs, load-balancer ingress IPs and source ranges
  together; each is a rule per port (and a conntrack filter per gone UDP endpoint);
  `--proxy-max-addresses-per-service`.
- `endpoints_per_service_port` (20,000): the endpoints of one service port across all its
  slices (Kubernetes' scalability envelope is 5,000 pods per Service);
  `--proxy-max-endpoints-per-port`.
- `endpoint_ports` (1,000,000): the whole node's programmed (service port, endpoint) pairs,
  about one iptables rule each (a port's addresses count one each too, and a port without
  endpoints one); `--proxy-max-endpoint-ports`. It is shared by `proxy/admission.py`: what
  is programmed stays programmed (a newcomer, another namespace's flood or an update of an
  admitted Service never evicts it), and room goes to the namespace that holds least, oldest
  Service first; the ones that do not fit are rejected until room is made.
- `endpoint_ports_per_service` (100,000): what one Service may cost of that budget (ports x
  (endpoints + addresses)), so no single object can take it: without it the per-object limits
  allowed 1,000 ports x 1,000 external IPs, the whole budget. kube-proxy bounds nothing;
  Kubernetes' scalability envelope is 10,000 Services and 5,000 backends per Service (about 250
  endpoints per Service on average). 100,000 holds the envelope's largest Service with 20 ports
  (and tests/cluster's legal 100 ports x 1,000 endpoints), is a tenth of the budget, so ten
  Services at the cap are needed to fill a node. `--proxy-max-endpoint-ports-per-service`.
- `endpoint_ports_per_namespace` (500,000): what one namespace's Services may hold of the budget
  together, so a tenant flooding its namespace leaves at least half to the others; the envelope
  allows 5,000 Services per namespace, half its 10,000, hence half the budget (a cluster that
  keeps everything in one namespace raises it). `--proxy-max-endpoint-ports-per-namespace`.
  Both are clamped to the budget.
- `health_check_ports` (2,768): the health-check node ports this node listens on (one
  descriptor each, all served by one thread: `proxy/healthcheck.py`). Every healthCheckNodePort
  is allocated from the NodePort range, whose default (30000-32767) holds 2,768 ports, so a
  cluster with the default range never asks for more; a wider range raises it.
  `--proxy-max-health-check-ports`.
- `external_ips`: which external and load-balancer IPs a Service may claim at all
  (`proxy/external_ips.py`: `--deny-external-ips`, and the node agent's `--service-cidr`).
- `endpoints_per_slice` and `ports_per_slice` (1,000 and 100): the API server's own
  validation limits for one EndpointSlice, enforced here for a lax server; not flags.
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass, field

from proxy.external_ips import ExternalIpPolicy, add_external_ip_arguments, external_ip_policy_from_args


@dataclass(frozen=True)
class ProxyLimits:
    ports_per_service: int = 1000
    addresses_per_service: int = 1000
    endpoints_per_service_port: int = 20000
    endpoint_ports: int = 1_000_000
    endpoint_ports_per_service: int = 100_000
    endpoint_ports_per_namespace: int = 500_000
    endpoints_per_slice: int = 1000
    ports_per_slice: int = 100
    health_check_ports: int = 2768
    external_ips: ExternalIpPolicy = field(default_factory=ExternalIpPolicy)

    def __post_init__(self) -> None:
        for name, value in vars(self).items():
            if name == "external_ips":
                continue
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"proxy limit {name} must be a positive integer, not {value!r}")


DEFAULT_LIMITS = ProxyLimits()


def positive_int(text: str) -> int:
    """The argparse type of every limit flag (the proxy's and the policy engine's)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} must be at least 1")
    return value


def add_limit_arguments(group) -> None:
    """The limits' flags, in the proxy's argument group."""
    group.add_argument("--proxy-max-ports-per-service", type=positive_int, default=DEFAULT_LIMITS.ports_per_service,
                       help="a Service with more ports is rejected (too-large) and not programmed")
    group.add_argument("--proxy-max-addresses-per-service", type=positive_int,
                       default=DEFAULT_LIMITS.addresses_per_service,
                       help="a Service with more external IPs, load-balancer IPs and source ranges (together) is "
                            "rejected")
    group.add_argument("--proxy-max-endpoints-per-port", type=positive_int,
                       default=DEFAULT_LIMITS.endpoints_per_service_port,
                       help="a Service one of whose ports has more endpoints (all slices together) is rejected")
    group.add_argument("--proxy-max-endpoint-ports", type=positive_int, default=DEFAULT_LIMITS.endpoint_ports,
                       help="the node's budget of (service port, endpoint) pairs; Services beyond it are rejected "
                            "until it has room (what is programmed is never pushed out)")
    group.add_argument("--proxy-max-endpoint-ports-per-service", type=positive_int,
                       default=DEFAULT_LIMITS.endpoint_ports_per_service,
                       help="a Service whose ports x (endpoints + addresses) are more is rejected (too-large)")
    group.add_argument("--proxy-max-endpoint-ports-per-namespace", type=positive_int,
                       default=DEFAULT_LIMITS.endpoint_ports_per_namespace,
                       help="the share of the node's budget one namespace's Services may hold together")
    group.add_argument("--proxy-max-health-check-ports", type=positive_int,
                       default=DEFAULT_LIMITS.health_check_ports,
                       help="the health-check node ports listened on at most (default: the default NodePort "
                            "range's size); the ones beyond are logged and not served")
    add_external_ip_arguments(group)


def limits_from_args(args) -> ProxyLimits:
    return ProxyLimits(
        ports_per_service=getattr(args, "proxy_max_ports_per_service", DEFAULT_LIMITS.ports_per_service),
        addresses_per_service=getattr(args, "proxy_max_addresses_per_service", DEFAULT_LIMITS.addresses_per_service),
        endpoints_per_service_port=getattr(args, "proxy_max_endpoints_per_port",
                                           DEFAULT_LIMITS.endpoints_per_service_port),
        endpoint_ports=getattr(args, "proxy_max_endpoint_ports", DEFAULT_LIMITS.endpoint_ports),
        endpoint_ports_per_service=getattr(args, "proxy_max_endpoint_ports_per_service",
                                           DEFAULT_LIMITS.endpoint_ports_per_service),
        endpoint_ports_per_namespace=getattr(args, "proxy_max_endpoint_ports_per_namespace",
                                             DEFAULT_LIMITS.endpoint_ports_per_namespace),
        health_check_ports=getattr(args, "proxy_max_health_check_ports", DEFAULT_LIMITS.health_check_ports),
        external_ips=external_ip_policy_from_args(args))

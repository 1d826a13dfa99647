"""Which endpoints receive a service port's traffic on this node: one pure function.

Every backend programs what `select_endpoints` answers, so traffic policies, the terminating
fallback and topology behave the same in iptables, IPVS and eBPF. It is asked through
`ProxyState.selection`, once per service port per state: the renderers, conntrack cleanup
and the Local-policy metrics of one sync share that answer.
The rules are Kubernetes' (see ../shared/REFERENCE.md):

- Traffic goes to *ready* endpoints. When a set has none ready, its *serving and
  terminating* endpoints take the traffic instead, so a rolling update with every pod
  shutting down still answers rather than refusing.
- `internalTrafficPolicy: Local` limits cluster-IP traffic to endpoints on this node;
  `externalTrafficPolicy: Local` does the same for NodePort, external and load-balancer
  traffic (which then keeps the client's source address).
- Topology: when the service asks for it (`trafficDistribution: PreferClose`, or the
  topology-mode annotation) and every usable endpoint carries hints, cluster-policy traffic
  goes to the endpoints hinted for this node (`forNodes`), else for this node's zone
  (`forZones`); when no endpoint is hinted for us the hints are ignored, never obeyed into
  an empty set.
- `has_endpoints` says whether the service port has any usable endpoint anywhere: a
  service with none *rejects* (ICMP unreachable, TCP reset); one whose endpoints all live
  on other nodes under a Local policy *drops* external traffic, as kube-proxy does.
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from proxy.model import Endpoint, NodeContext, ServicePort, TrafficPolicy


@dataclass(frozen=True)
class EndpointSelection:
    cluster: tuple[Endpoint, ...]   # receives traffic to the cluster IP
    external: tuple[Endpoint, ...]  # receives NodePort, external-IP and load-balancer traffic
    local_ready: int                # ready endpoints on this node (the health-check answer)
    has_endpoints: bool             # any usable endpoint on any node

    @property
    def all_selected(self) -> tuple[Endpoint, ...]:
        """The union of both sets, in a stable order (what a backend must be able to reach)."""
        seen = dict.fromkeys(self.cluster)
        seen.update(dict.fromkeys(self.external))
        return tuple(seen)


def usable(endpoints: Iterable[Endpoint]) -> tuple[Endpoint, ...]:
    """Ready endpoints; if there are none, the serving-and-terminating ones."""
    endpoints = tuple(endpoints)
    ready = tuple(e for e in endpoints if e.ready)
    return ready or tuple(e for e in endpoints if e.serving_terminating)


def _local(endpoints: Iterable[Endpoint], node: NodeContext) -> tuple[Endpoint, ...]:
    return tuple(e for e in endpoints if e.node_name == node.name)


def _by_topology(service: ServicePort, endpoints: tuple[Endpoint, ...], node: NodeContext) -> tuple[Endpoint, ...]:
    if not service.prefer_close or not endpoints:
        return endpoints
    if all(e.node_hints for e in endpoints):
        for_node = tuple(e for e in endpoints if node.name in e.node_hints)
        if for_node:
            return for_node
    if node.zone and all(e.zone_hints for e in endpoints):
        for_zone = tuple(e for e in endpoints if node.zone in e.zone_hints)
        if for_zone:
            return for_zone
    return endpoints


def select_endpoints(service: ServicePort, endpoints: Iterable[Endpoint], node: NodeContext) -> EndpointSelection:
    endpoints = tuple(endpoints)
    everywhere = usable(endpoints)
    local = usable(_local(endpoints, node))
    cluster_wide = _by_topology(service, everywhere, node)
    cluster = local if service.internal_policy is TrafficPolicy.LOCAL else cluster_wide
    if not service.has_external_addresses:
        external: tuple[Endpoint, ...] = ()
    elif service.external_policy is TrafficPolicy.LOCAL:
        external = local
    else:
        external = cluster_wide
    return EndpointSelection(
        cluster=cluster,
        external=external,
        local_ready=sum(1 for e in _local(endpoints, node) if e.ready),
        has_endpoints=bool(everywhere),
    )

"""Services and EndpointSlices, as the API sends them (plain dicts), turned into model values.

Pure functions, so every odd field a user can write is unit-tested here once and no backend
ever sees a raw object. A Service that cannot be programmed (headless, ExternalName, no
IPv4 cluster IP) yields no service ports and a `reason`; a single bad port or address is
dropped with a reason while the rest of the Service still works, as kube-proxy does. The
API server validates most fields, but the proxy must not crash or program garbage when a
value slips through (an old object, a hand-written EndpointSlice).
"""
from __future__ import annotations

import functools
import ipaddress
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime

from netagent.kube.endpoint_slices import SERVICE_NAME_LABEL, endpoint_conditions
from proxy.model import DEFAULT_AFFINITY_TIMEOUT, Endpoint, Protocol, ServicePort, ServicePortName, TrafficPolicy

TRIGGER_TIME_ANNOTATION = "endpoints.kubernetes.io/last-change-trigger-time"
TOPOLOGY_MODE_ANNOTATIONS = ("service.kubernetes.io/topology-mode", "service.kubernetes.io/topology-aware-hints")
SOURCE_RANGES_ANNOTATION = "service.beta.kubernetes.io/load-balancer-source-ranges"
ZONE_LABEL = "topology.kubernetes.io/zone"
PREFER_CLOSE_DISTRIBUTIONS = frozenset({"PreferClose", "PreferSameZone", "PreferSameNode"})
EXTERNAL_TYPES = frozenset({"NodePort", "LoadBalancer"})
MAX_AFFINITY_TIMEOUT = 86400  # seconds, the API's upper bound


@dataclass(frozen=True)
class ParsedService:
    ports: dict[ServicePortName, ServicePort]
    problems: tuple[str, ...] = ()  # why something in it is not programmed ("" when all is fine)


@dataclass(frozen=True)
class ParsedSlice:
    """One EndpointSlice: the service it belongs to and its endpoints per (port name, protocol)."""

    namespace: str
    service: str
    endpoints: dict[tuple[str, Protocol], tuple[Endpoint, ...]] = field(default_factory=dict)
    trigger_time: float | None = None  # epoch seconds of the change that caused this version
    problems: tuple[str, ...] = ()


def _ipv4(text: object) -> str | None:
    try:
        address = ipaddress.ip_address(str(text))
    except ValueError:
        return None
    return str(address) if address.version == 4 else None


def _ipv4_cidr(text: object) -> str | None:
    try:
        network = ipaddress.ip_network(str(text).strip(), strict=False)
    except ValueError:
        return None
    return str(network) if network.version == 4 else None


def _port_number(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and 0 < value < 65536 else None


def _protocol(value: object) -> Protocol | None:
    try:
        return Protocol(value if value is not None else "TCP")
    except ValueError:
        return None


def _addresses(values: Iterable | None, what: str, problems: list[str], *, parse=_ipv4) -> tuple[str, ...]:
    kept = []
    for value in values or ():
        address = parse(value)
        if address is None:
            problems.append(f"{what} {value!r} is not an IPv4 address: skipped")
        elif address not in kept:
            kept.append(address)
    return tuple(kept)


def _cluster_ip(spec: Mapping) -> str | None:
    candidates = list(spec.get("clusterIPs") or ()) or [spec.get("clusterIP")]
    for candidate in candidates:
        address = _ipv4(candidate)
        if address is not None:
            return address
    return None


def _source_ranges(service: Mapping, problems: list[str]) -> tuple[str, ...]:
    ranges = (service.get("spec") or {}).get("loadBalancerSourceRanges") or ()
    if not ranges:
        annotation = ((service.get("metadata") or {}).get("annotations") or {}).get(SOURCE_RANGES_ANNOTATION, "")
        ranges = [part for part in annotation.split(",") if part.strip()]
    return _addresses(ranges, "load-balancer source range", problems, parse=_ipv4_cidr)


def _affinity_timeout(spec: Mapping) -> int | None:
    if spec.get("sessionAffinity") != "ClientIP":
        return None
    timeout = ((spec.get("sessionAffinityConfig") or {}).get("clientIP") or {}).get("timeoutSeconds")
    valid = isinstance(timeout, int) and not isinstance(timeout, bool) and 0 < timeout <= MAX_AFFINITY_TIMEOUT
    return timeout if valid else DEFAULT_AFFINITY_TIMEOUT


def _prefers_close(service: Mapping) -> bool:
    spec = service.get("spec") or {}
    annotations = (service.get("metadata") or {}).get("annotations") or {}
    if spec.get("trafficDistribution") in PREFER_CLOSE_DISTRIBUTIONS:
        return True
    return any(annotations.get(key, "").lower() == "auto" for key in TOPOLOGY_MODE_ANNOTATIONS)


def parse_service(service: Mapping) -> ParsedService:
    """The service ports of one Service; none (with the reason) when it is not proxied."""
    metadata = service.get("metadata") or {}
    spec = service.get("spec") or {}
    namespace, name = metadata.get("namespace") or "default", metadata.get("name") or ""
    kind = spec.get("type") or "ClusterIP"
    if kind == "ExternalName":
        return ParsedService({}, ("type ExternalName is DNS only: not proxied",))
    if spec.get("clusterIP") == "None":
        return ParsedService({}, ("headless (clusterIP None): not proxied",))
    cluster_ip = _cluster_ip(spec)
    if cluster_ip is None:
        return ParsedService({}, (f"no IPv4 cluster IP in {spec.get('clusterIPs') or spec.get('clusterIP')!r}: "
                                  f"not proxied",))
    problems: list[str] = []
    external_ips = _addresses(spec.get("externalIPs"), "external IP", problems)
    lb_ips: tuple[str, ...] = ()
    if kind == "LoadBalancer":
        ingress = [entry.get("ip") for entry in ((service.get("status") or {}).get("loadBalancer") or {})
                   .get("ingress") or () if isinstance(entry, Mapping) and entry.get("ip")
                   and entry.get("ipMode") != "Proxy"]
        lb_ips = _addresses(ingress, "load-balancer ingress IP", problems)
    external_local = spec.get("externalTrafficPolicy") == "Local"
    health_port = _port_number(spec.get("healthCheckNodePort")) if external_local and kind == "LoadBalancer" else None
    service_port = functools.partial(
        ServicePort,
        cluster_ip=cluster_ip,
        external_ips=external_ips,
        load_balancer_ips=lb_ips,
        load_balancer_source_ranges=_source_ranges(service, problems) if lb_ips else (),
        affinity_timeout=_affinity_timeout(spec),
        internal_policy=TrafficPolicy.LOCAL if spec.get("internalTrafficPolicy") == "Local" else TrafficPolicy.CLUSTER,
        external_policy=TrafficPolicy.LOCAL if external_local else TrafficPolicy.CLUSTER,
        health_check_node_port=health_port,
        prefer_close=_prefers_close(service),
    )
    ports: dict[ServicePortName, ServicePort] = {}
    for raw in spec.get("ports") or ():
        if not isinstance(raw, Mapping):
            problems.append(f"port entry {raw!r} is not an object: skipped")
            continue
        port_name = ServicePortName(namespace, name, str(raw.get("name") or ""))
        protocol, port = _protocol(raw.get("protocol")), _port_number(raw.get("port"))
        if protocol is None or port is None:
            problems.append(f"port {port_name.port or '(unnamed)'}: protocol {raw.get('protocol')!r} / port "
                            f"{raw.get('port')!r} not usable: skipped")
            continue
        if port_name in ports:
            problems.append(f"port name {port_name.port!r} repeated: the first one wins")
            continue
        node_port = _port_number(raw.get("nodePort")) if kind in EXTERNAL_TYPES else None
        ports[port_name] = service_port(name=port_name, protocol=protocol, port=port, node_port=node_port)
    if not ports and not problems:
        problems.append("no ports: nothing to proxy")
    return ParsedService(ports, tuple(problems))


def _trigger_time(metadata: Mapping) -> float | None:
    text = (metadata.get("annotations") or {}).get(TRIGGER_TIME_ANNOTATION)
    if not text:
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def _names(hints: Mapping, key: str) -> frozenset[str]:
    return frozenset(str(entry.get("name")) for entry in hints.get(key) or () if isinstance(entry, Mapping))


def _endpoint(raw: Mapping, port: int) -> Endpoint | None:
    addresses = raw.get("addresses") or ()
    ip = _ipv4(addresses[0]) if addresses else None
    if ip is None:
        return None
    conditions = endpoint_conditions(raw)
    hints = raw.get("hints") or {}
    return Endpoint(
        ip=ip, port=port, ready=conditions.ready, serving=conditions.serving, terminating=conditions.terminating,
        node_name=raw.get("nodeName"), zone=raw.get("zone"),
        zone_hints=_names(hints, "forZones"), node_hints=_names(hints, "forNodes"),
    )


def parse_endpoint_slice(endpoint_slice: Mapping) -> ParsedSlice | None:
    """The slice's endpoints per port; None when it belongs to no service or is not IPv4."""
    metadata = endpoint_slice.get("metadata") or {}
    service = (metadata.get("labels") or {}).get(SERVICE_NAME_LABEL)
    namespace = metadata.get("namespace") or "default"
    if not service or endpoint_slice.get("addressType", "IPv4") != "IPv4":
        return None
    problems: list[str] = []
    endpoints: dict[tuple[str, Protocol], tuple[Endpoint, ...]] = {}
    for raw_port in endpoint_slice.get("ports") or ():
        port, protocol = _port_number((raw_port or {}).get("port")), _protocol((raw_port or {}).get("protocol"))
        if port is None or protocol is None:
            problems.append(f"slice port {raw_port!r} not usable: skipped")
            continue
        found = []
        for raw in endpoint_slice.get("endpoints") or ():
            endpoint = _endpoint(raw, port) if isinstance(raw, Mapping) else None
            if endpoint is None:
                problems.append(f"endpoint {raw!r} has no IPv4 address: skipped")
            else:
                found.append(endpoint)
        endpoints[(str(raw_port.get("name") or ""), protocol)] = tuple(found)
    return ParsedSlice(namespace=namespace, service=service, endpoints=endpoints,
                       trigger_time=_trigger_time(metadata), problems=tuple(dict.fromkeys(problems)))


def _ip_key(endpoint: Endpoint) -> tuple[int, int]:
    return int(ipaddress.IPv4Address(endpoint.ip)), endpoint.port


def merge_endpoints(service_port: ServicePort, slices: Iterable[ParsedSlice]) -> tuple[Endpoint, ...]:
    """The endpoints of one service port across all its slices: matched by port name and
    protocol, one per address (the first slice, by name order of the caller, wins), sorted."""
    key = (service_port.name.port, service_port.protocol)
    merged: dict[tuple[str, int], Endpoint] = {}
    for parsed in slices:
        for endpoint in parsed.endpoints.get(key, ()):
            merged.setdefault((endpoint.ip, endpoint.port), endpoint)
    return tuple(sorted(merged.values(), key=_ip_key))


def node_zone(node: Mapping | None) -> str | None:
    if not node:
        return None
    return ((node.get("metadata") or {}).get("labels") or {}).get(ZONE_LABEL)

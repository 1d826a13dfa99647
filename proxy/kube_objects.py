"""Services and EndpointSlices, as the API sends them (plain dicts), turned into model values.

Pure functions, so every odd field a user can write is unit-tested here once and no backend
ever sees a raw object. A Service that cannot be programmed (headless, ExternalName, no
usable cluster IP) yields no service ports and a `reason`; a single bad port or address is
dropped with a reason while the rest of the Service still works, as kube-proxy does. The
API server validates most fields, but the proxy must not crash or program garbage when a
value slips through (an old object, a hand-written EndpointSlice).

Parsing is per IP family (`family`, default IPv4), as kube-proxy runs one proxier per family:
a Service yields the service ports of that family only (its cluster IP of that family out of
`clusterIPs`, the external IPs, load-balancer IPs and source ranges of that family), and a
Service of the other family only (SingleStack IPv6 seen by the IPv4 parser, and vice versa) is
simply absent: no ports, no problem. An EndpointSlice of another `addressType` (or FQDN) is
ignored. `clusterIPs`/`ipFamilies`/`ipFamilyPolicy` that contradict each other (more than two
cluster IPs, one family twice, a family listed against an address of the other, SingleStack
with two) make the Service malformed for every family alike.

Every object is untrusted (a lax API server, a hand-written object): a field of the wrong
type raises `MalformedObject` (never an AttributeError deep inside), and an annotation whose
value is not a string is read as absent, so a null annotation costs nothing. The caller
(`catalog.py`) parses each object alone inside a guard and rejects what raises.
"""
from __future__ import annotations

import functools
import ipaddress
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime

from netagent.kube.endpoint_slices import SERVICE_NAME_LABEL, endpoint_conditions
from netagent.infra.rejections import printable
from netagent.kernel.families import IpFamily
from proxy.limits import DEFAULT_LIMITS
from proxy.model import DEFAULT_AFFINITY_TIMEOUT, NO_CLIENT_SOURCE_RANGE, Endpoint, Protocol, ServicePort, ServicePortName, TrafficPolicy
from netagent.errors import NetagentError

TRIGGER_TIME_ANNOTATION = "endpoints.kubernetes.io/last-change-trigger-time"
TOPOLOGY_MODE_ANNOTATIONS = ("service.kubernetes.io/topology-mode", "service.kubernetes.io/topology-aware-hints")
SOURCE_RANGES_ANNOTATION = "service.beta.kubernetes.io/load-balancer-source-ranges"
ZONE_LABEL = "topology.kubernetes.io/zone"
PREFER_CLOSE_DISTRIBUTIONS = frozenset({"PreferClose", "PreferSameZone", "PreferSameNode"})
EXTERNAL_TYPES = frozenset({"NodePort", "LoadBalancer"})
MAX_AFFINITY_TIMEOUT = 86400  # seconds, the API's upper bound
FAMILY_POLICIES = frozenset({"SingleStack", "PreferDualStack", "RequireDualStack"})


class MalformedObject(NetagentError, ValueError):
    """A Service or EndpointSlice whose shape cannot be read (a field of the wrong type)."""


class TooLarge(NetagentError, ValueError):
    """A Service or EndpointSlice above one of the per-object limits (`proxy/limits.py`)."""


@dataclass(frozen=True)
class ParsedService:
    ports: dict[ServicePortName, ServicePort]
    problems: tuple[str, ...] = ()  # why something in it is not programmed ("" when all is fine)
    created: str = ""               # metadata.creationTimestamp (RFC 3339 sorts as text), "" unknown


def _mapping(value: object, what: str) -> Mapping:
    """`value` as an object; None (unset) reads as empty; any other type is malformed."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise MalformedObject(f"{what} is {type(value).__name__}, not an object")
    return value


def _sequence(value: object, what: str) -> tuple:
    if value is None:
        return ()
    if not isinstance(value, (list, tuple)):
        raise MalformedObject(f"{what} is {type(value).__name__}, not a list")
    return tuple(value)


def _text(value: object, what: str, *, default: str = "") -> str:
    if value is None or value == "":
        return default
    if not isinstance(value, str):
        raise MalformedObject(f"{what} is {type(value).__name__}, not a string")
    return value


def _annotation(metadata: Mapping, key: str) -> str:
    """An annotation's value; one that is not a string (null from a lax server) is absent."""
    value = _mapping(metadata.get("annotations"), "metadata.annotations").get(key)
    return value if isinstance(value, str) else ""


@dataclass(frozen=True)
class ParsedSlice:
    """One EndpointSlice: the service it belongs to and its endpoints per (port name, protocol)."""

    namespace: str
    service: str
    endpoints: dict[tuple[str, Protocol], tuple[Endpoint, ...]] = field(default_factory=dict)
    trigger_time: float | None = None  # epoch seconds of the change that caused this version
    problems: tuple[str, ...] = ()


def _address_of(text: object) -> tuple[IpFamily, str] | None:
    """An IP address's family and canonical text; None when `text` is not an address, or is
    one with an IPv6 zone (`fe80::1%eth0`: `ipaddress` keeps any text after the `%`, a newline
    included, and no Service, endpoint or client range has one; Kubernetes refuses them)."""
    try:
        address = ipaddress.ip_address(str(text).strip())
    except ValueError:
        return None
    if getattr(address, "scope_id", None) is not None:
        return None
    return IpFamily(address.version), str(address)


def _cidr_of(text: object) -> tuple[IpFamily, str] | None:
    """A network's family and canonical text; None when it is not one or has an IPv6 zone."""
    try:
        network = ipaddress.ip_network(str(text).strip(), strict=False)
    except ValueError:
        return None
    if getattr(network.network_address, "scope_id", None) is not None:
        return None
    return IpFamily(network.version), str(network)


def _port_number(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and 0 < value < 65536 else None


def _protocol(value: object) -> Protocol | None:
    if value is not None and not isinstance(value, str):
        return None
    try:
        return Protocol(value or "TCP")
    except ValueError:
        return None


def _addresses(values: Iterable | None, what: str, problems: list[str], family: IpFamily, *,
               parse=_address_of) -> tuple[str, ...]:
    """The entries of `values` of `family`, each once; an unreadable one is a problem, one of the
    other family is the other proxier's and left out silently."""
    kept: list[str] = []
    for value in _sequence(values, what):
        found = parse(value)
        if found is None:
            kind = "a network" if parse is _cidr_of else "an IP address"
            problems.append(f"{what} {printable(value, limit=80)} is not {kind}: skipped")
        elif found[0] is family and found[1] not in kept:
            kept.append(found[1])
    return tuple(kept)


def _ip_families(spec: Mapping) -> tuple[IpFamily, ...]:
    families: list[IpFamily] = []
    for label in _sequence(spec.get("ipFamilies"), "spec.ipFamilies"):
        try:
            family = IpFamily.from_label(_text(label, "spec.ipFamilies entry"))
        except ValueError:
            raise MalformedObject(f"spec.ipFamilies entry {printable(label, limit=40)} is not IPv4 or IPv6") from None
        if family in families:
            raise MalformedObject(f"spec.ipFamilies lists {family.label} twice")
        families.append(family)
    return tuple(families)


def _cluster_ips(spec: Mapping) -> dict[IpFamily, str]:
    """The Service's cluster IP per family, checked against `ipFamilies` and `ipFamilyPolicy`
    (`MalformedObject` when they contradict each other); unreadable entries are left out."""
    raw = _sequence(spec.get("clusterIPs"), "spec.clusterIPs") or (spec.get("clusterIP"),)
    if len(raw) > 2:
        raise MalformedObject(f"spec.clusterIPs has {len(raw)} entries: at most one per family")
    families = _ip_families(spec)
    policy = _text(spec.get("ipFamilyPolicy"), "spec.ipFamilyPolicy")
    if policy and policy not in FAMILY_POLICIES:
        raise MalformedObject(f"spec.ipFamilyPolicy {printable(policy, limit=40)} is not one of "
                              f"{', '.join(sorted(FAMILY_POLICIES))}")
    found: dict[IpFamily, str] = {}
    for index, value in enumerate(raw):
        parsed = _address_of(value) if isinstance(value, str) else None
        if parsed is None:
            continue
        family, address = parsed
        if family in found:
            raise MalformedObject(f"spec.clusterIPs holds two {family.label} addresses")
        if index < len(families) and families[index] is not family:
            raise MalformedObject(f"spec.clusterIPs[{index}] {address} is not of spec.ipFamilies[{index}] "
                                  f"{families[index].label}")
        found[family] = address
    if policy == "SingleStack" and (len(found) > 1 or len(families) > 1):
        raise MalformedObject("ipFamilyPolicy SingleStack with two families")
    if families:   # a family not listed is not the Service's, whatever address is there
        found = {family: address for family, address in found.items() if family in families}
    return found


def _source_ranges(service: Mapping, problems: list[str], family: IpFamily) -> tuple[str, ...]:
    ranges = _sequence(_mapping(service.get("spec"), "spec").get("loadBalancerSourceRanges"),
                       "spec.loadBalancerSourceRanges")
    if not ranges:
        annotation = _annotation(_mapping(service.get("metadata"), "metadata"), SOURCE_RANGES_ANNOTATION)
        ranges = tuple(part for part in annotation.split(",") if part.strip())
    mine = _addresses(ranges, "load-balancer source range", problems, family, parse=_cidr_of)
    if ranges and not mine:   # restricted, but to the other family's clients only: none of ours
        return (NO_CLIENT_SOURCE_RANGE[family],)
    return mine


def _affinity_timeout(spec: Mapping) -> int | None:
    if spec.get("sessionAffinity") != "ClientIP":
        return None
    config = _mapping(spec.get("sessionAffinityConfig"), "spec.sessionAffinityConfig")
    timeout = _mapping(config.get("clientIP"), "spec.sessionAffinityConfig.clientIP").get("timeoutSeconds")
    valid = isinstance(timeout, int) and not isinstance(timeout, bool) and 0 < timeout <= MAX_AFFINITY_TIMEOUT
    return timeout if valid else DEFAULT_AFFINITY_TIMEOUT


def _prefers_close(service: Mapping) -> bool:
    spec = _mapping(service.get("spec"), "spec")
    metadata = _mapping(service.get("metadata"), "metadata")
    if spec.get("trafficDistribution") in PREFER_CLOSE_DISTRIBUTIONS:
        return True
    return any(_annotation(metadata, key).lower() == "auto" for key in TOPOLOGY_MODE_ANNOTATIONS)


def parse_service(service: Mapping, *, family: IpFamily = IpFamily.V4,
                  max_ports: int = DEFAULT_LIMITS.ports_per_service,
                  max_addresses: int = DEFAULT_LIMITS.addresses_per_service) -> ParsedService:
    """The service ports of one Service in `family`; none (with the reason) when it is not
    proxied, none and no reason when it is of the other family only. `MalformedObject` when a
    field has the wrong type or its cluster IPs and families contradict each other."""
    service = _mapping(service, "the Service")
    metadata = _mapping(service.get("metadata"), "metadata")
    spec = _mapping(service.get("spec"), "spec")
    namespace = _text(metadata.get("namespace"), "metadata.namespace", default="default")
    name = _text(metadata.get("name"), "metadata.name")
    if not name:
        raise MalformedObject("metadata.name is missing")
    created = metadata.get("creationTimestamp")
    created = created if isinstance(created, str) else ""
    kind = _text(spec.get("type"), "spec.type", default="ClusterIP")
    if kind == "ExternalName":
        return ParsedService({}, ("type ExternalName is DNS only: not proxied",), created)
    if spec.get("clusterIP") == "None":
        return ParsedService({}, ("headless (clusterIP None): not proxied",), created)
    cluster_ips = _cluster_ips(spec)
    cluster_ip = cluster_ips.get(family)
    if cluster_ip is None:
        if cluster_ips:   # the other family's Service: its proxier programs it
            return ParsedService({}, (), created)
        shown = printable(spec.get('clusterIPs') or spec.get('clusterIP'), limit=80)
        return ParsedService({}, (f"no {family.label} cluster IP in {shown}: not proxied",), created)
    problems: list[str] = []
    raw_external = _sequence(spec.get("externalIPs"), "spec.externalIPs")
    raw_ranges = _sequence(spec.get("loadBalancerSourceRanges"), "spec.loadBalancerSourceRanges")
    if len(raw_external) + len(raw_ranges) > max_addresses:
        raise TooLarge(f"{len(raw_external)} external IPs and {len(raw_ranges)} source ranges, more than the limit "
                       f"of {max_addresses} addresses per Service (--proxy-max-addresses-per-service)")
    external_ips = _addresses(raw_external, "external IP", problems, family)
    lb_ips: tuple[str, ...] = ()
    if kind == "LoadBalancer":
        balancer = _mapping(_mapping(service.get("status"), "status").get("loadBalancer"), "status.loadBalancer")
        ingress = [entry.get("ip") for entry in _sequence(balancer.get("ingress"), "status.loadBalancer.ingress")
                   if isinstance(entry, Mapping) and entry.get("ip") and entry.get("ipMode") != "Proxy"]
        lb_ips = _addresses(ingress, "load-balancer ingress IP", problems, family)
    source_ranges = _source_ranges(service, problems, family) if lb_ips else ()
    if len(external_ips) + len(lb_ips) + len(source_ranges) > max_addresses:
        raise TooLarge(f"{len(external_ips)} external IPs, {len(lb_ips)} load-balancer IPs and {len(source_ranges)} "
                       f"source ranges, more than the limit of {max_addresses} addresses per Service "
                       f"(--proxy-max-addresses-per-service)")
    external_local = spec.get("externalTrafficPolicy") == "Local"
    health_port = _port_number(spec.get("healthCheckNodePort")) if external_local and kind == "LoadBalancer" else None
    service_port = functools.partial(
        ServicePort,
        cluster_ip=cluster_ip,
        external_ips=external_ips,
        load_balancer_ips=lb_ips,
        load_balancer_source_ranges=source_ranges,
        affinity_timeout=_affinity_timeout(spec),
        internal_policy=TrafficPolicy.LOCAL if spec.get("internalTrafficPolicy") == "Local" else TrafficPolicy.CLUSTER,
        external_policy=TrafficPolicy.LOCAL if external_local else TrafficPolicy.CLUSTER,
        health_check_node_port=health_port,
        prefer_close=_prefers_close(service),
    )
    ports: dict[ServicePortName, ServicePort] = {}
    raw_ports = _sequence(spec.get("ports"), "spec.ports")
    if len(raw_ports) > max_ports:
        raise TooLarge(f"{len(raw_ports)} ports, more than the limit of {max_ports} per Service "
                       f"(--proxy-max-ports-per-service)")
    for raw in raw_ports:
        if not isinstance(raw, Mapping):
            problems.append(f"port entry {printable(raw, limit=80)} is not an object: skipped")
            continue
        port_name = ServicePortName(namespace, name, _text(raw.get("name"), "port name"))
        protocol, port = _protocol(raw.get("protocol")), _port_number(raw.get("port"))
        if protocol is None or port is None:
            problems.append(f"port {port_name.port or '(unnamed)'}: protocol "
                            f"{printable(raw.get('protocol'), limit=40)} / port "
                            f"{printable(raw.get('port'), limit=40)} not usable: skipped")
            continue
        if port_name in ports:
            problems.append(f"port name {port_name.port!r} repeated: the first one wins")
            continue
        node_port = _port_number(raw.get("nodePort")) if kind in EXTERNAL_TYPES else None
        ports[port_name] = service_port(name=port_name, protocol=protocol, port=port, node_port=node_port)
    if not ports and not problems:
        problems.append("no ports: nothing to proxy")
    return ParsedService(ports, tuple(dict.fromkeys(problems)), created)


def _trigger_time(metadata: Mapping) -> float | None:
    text = _annotation(metadata, TRIGGER_TIME_ANNOTATION)
    if not text:
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def _names(hints: Mapping, key: str) -> frozenset[str]:
    return frozenset(str(entry.get("name")) for entry in _sequence(hints.get(key), f"hints.{key}")
                     if isinstance(entry, Mapping) and isinstance(entry.get("name"), str))


def _optional_text(value: object) -> str | None:
    return value if isinstance(value, str) and value else None


def _endpoint(raw: Mapping, port: int, family: IpFamily) -> Endpoint | None:
    addresses = _sequence(raw.get("addresses"), "endpoint addresses")
    found = _address_of(addresses[0]) if addresses and isinstance(addresses[0], str) else None
    if found is None or found[0] is not family:
        return None
    ip = found[1]
    _mapping(raw.get("conditions"), "endpoint conditions")
    conditions = endpoint_conditions(raw)
    hints = _mapping(raw.get("hints"), "endpoint hints")
    return Endpoint(
        ip=ip, port=port, ready=conditions.ready, serving=conditions.serving, terminating=conditions.terminating,
        node_name=_optional_text(raw.get("nodeName")), zone=_optional_text(raw.get("zone")),
        zone_hints=_names(hints, "forZones"), node_hints=_names(hints, "forNodes"),
    )


def parse_endpoint_slice(endpoint_slice: Mapping, *, family: IpFamily = IpFamily.V4,
                         max_endpoints: int = DEFAULT_LIMITS.endpoints_per_slice,
                         max_ports: int = DEFAULT_LIMITS.ports_per_slice) -> ParsedSlice | None:
    """The slice's endpoints per port; None when it belongs to no service or its `addressType`
    is not `family`'s (the other family's proxier reads it; FQDN is not proxied).
    `MalformedObject` when a field has the wrong type, `TooLarge` above the limits."""
    endpoint_slice = _mapping(endpoint_slice, "the EndpointSlice")
    metadata = _mapping(endpoint_slice.get("metadata"), "metadata")
    service = _mapping(metadata.get("labels"), "metadata.labels").get(SERVICE_NAME_LABEL)
    namespace = _text(metadata.get("namespace"), "metadata.namespace", default="default")
    if not service or not isinstance(service, str) or endpoint_slice.get("addressType", "IPv4") != family.label:
        return None
    raw_ports = _sequence(endpoint_slice.get("ports"), "ports")
    raw_endpoints = _sequence(endpoint_slice.get("endpoints"), "endpoints")
    if len(raw_ports) > max_ports or len(raw_endpoints) > max_endpoints:
        raise TooLarge(f"{len(raw_ports)} ports and {len(raw_endpoints)} endpoints: the limits per EndpointSlice "
                       f"are {max_ports} ports and {max_endpoints} endpoints (the API's own)")
    problems: list[str] = []
    found: list[Endpoint] = []
    template = 1
    for raw in raw_endpoints:   # parsed once, then copied per port
        endpoint = _endpoint(raw, template, family) if isinstance(raw, Mapping) else None
        if endpoint is None:
            problems.append(f"endpoint {printable(raw, limit=80)} has no {family.label} address: skipped")
        else:
            found.append(endpoint)
    endpoints: dict[tuple[str, Protocol], tuple[Endpoint, ...]] = {}
    for raw_port in raw_ports:
        raw_port = raw_port if isinstance(raw_port, Mapping) else {}
        port, protocol = _port_number(raw_port.get("port")), _protocol(raw_port.get("protocol"))
        if port is None or protocol is None:
            problems.append(f"slice port {printable(raw_port, limit=80)} not usable: skipped")
            continue
        key = (_text(raw_port.get("name"), "slice port name"), protocol)
        endpoints[key] = tuple(replace(endpoint, port=port) for endpoint in found)
    return ParsedSlice(namespace=namespace, service=service, endpoints=endpoints,
                       trigger_time=_trigger_time(metadata), problems=tuple(dict.fromkeys(problems)))


def _ip_key(endpoint: Endpoint) -> tuple[int, int]:
    return int(ipaddress.ip_address(endpoint.ip)), endpoint.port


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
    """The node's zone label; None when unset or unreadable (a Node is untrusted too)."""
    metadata = node.get("metadata") if isinstance(node, Mapping) else None
    labels = metadata.get("labels") if isinstance(metadata, Mapping) else None
    zone = labels.get(ZONE_LABEL) if isinstance(labels, Mapping) else None
    return zone if isinstance(zone, str) and zone else None

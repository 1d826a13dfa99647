"""Service defaulting, validation and address allocation, as the real API server's registry does.

A proxy is only as good as the Services it is fed, so the lab's API server must refuse what
Kubernetes refuses and fill in what Kubernetes fills in; otherwise a test could pass here on a
Service no cluster would store. This module owns that, for the fields a service proxy reads:

- defaults: `type` ClusterIP, `sessionAffinity` None (ClientIP gets a 10800 s timeout),
  port `protocol` TCP and `targetPort` = `port`, `internalTrafficPolicy` Cluster,
  `externalTrafficPolicy` Cluster for externally reachable services (NodePort,
  LoadBalancer, or any with `externalIPs`), `allocateLoadBalancerNodePorts` true;
- validation (every problem found, reported together with its field path): types,
  protocols, port numbers, port names (required and unique once there are two ports),
  duplicate ports, `targetPort` numbers or IANA names, `clusterIP` `None` only for
  ClusterIP services, traffic policies,
  `sessionAffinityConfig` (1..86400 s, only with ClientIP), `healthCheckNodePort` only for
  LoadBalancer + Local, `loadBalancerSourceRanges` only for LoadBalancer, `externalIPs`
  that are plain unicast addresses, `trafficDistribution` values;
- allocation: a cluster IP per family from that family's range (which families, and the
  checks of `clusterIPs`, `ipFamilies` and `ipFamilyPolicy`: `service_families.py`), node ports from 30000-32767 and a
  `healthCheckNodePort` for LoadBalancer services with `externalTrafficPolicy: Local`.
  Node ports are one pool whatever the protocol, as in Kubernetes: two services cannot
  share a number, but one service may use a number for both TCP and UDP (and gets the same
  number for a port it exposes over two protocols). Updates keep what was allocated when
  the new spec omits it, release what is no longer used, and drop type-dependent fields the
  client merely carried over when the type changes (as `kubectl edit` from NodePort to
  ClusterIP does).

Errors are `InvalidService` with Kubernetes-style field messages; the API server turns them
into a 422 Invalid Status.
"""
from __future__ import annotations

import ipaddress
import json
import re

from lab.service_families import InvalidFamilies, parse_service_cidrs, plan_families
from netagent.kernel.families import IpFamily

NODE_PORT_RANGE = range(30000, 32768)
DEFAULT_AFFINITY_TIMEOUT = 10800
MAX_AFFINITY_TIMEOUT = 86400
SERVICE_TYPES = ("ClusterIP", "NodePort", "LoadBalancer", "ExternalName")
PROTOCOLS = ("TCP", "UDP", "SCTP")
TRAFFIC_POLICIES = ("Cluster", "Local")
SESSION_AFFINITIES = ("None", "ClientIP")
TRAFFIC_DISTRIBUTIONS = ("PreferClose", "PreferSameZone", "PreferSameNode")

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_IANA_SERVICE_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]{0,13}[a-z0-9])?$")
_DNS_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


class InvalidService(Exception):
    """The spec breaks Kubernetes' rules; `errors` are field messages (`spec.x: ...`)."""

    def __init__(self, errors: list[str]) -> None:
        self.errors = errors
        super().__init__(errors[0] if len(errors) == 1 else "[" + ", ".join(errors) + "]")


def _clone(value):
    return json.loads(json.dumps(value))


def _is_port_number(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= 65535


def externally_accessible(spec: dict) -> bool:
    """Kubernetes' rule for where externalTrafficPolicy applies."""
    service_type = spec.get("type") or "ClusterIP"
    if service_type in ("NodePort", "LoadBalancer"):
        return True
    return service_type == "ClusterIP" and bool(spec.get("externalIPs"))


def wants_node_ports(spec: dict) -> bool:
    service_type = spec.get("type") or "ClusterIP"
    if service_type == "LoadBalancer":
        return spec.get("allocateLoadBalancerNodePorts", True) is not False
    return service_type == "NodePort"


def wants_health_check_node_port(spec: dict) -> bool:
    return spec.get("type") == "LoadBalancer" and spec.get("externalTrafficPolicy") == "Local"


def node_ports_of(spec: dict | None) -> set[int]:
    """Every node port number a stored spec holds (its ports' and its health check's)."""
    spec = spec or {}
    numbers = {int(p["nodePort"]) for p in spec.get("ports") or [] if p.get("nodePort")}
    if spec.get("healthCheckNodePort"):
        numbers.add(int(spec["healthCheckNodePort"]))
    return numbers


def cluster_ips_of(spec: dict | None) -> set[str]:
    spec = spec or {}
    return {ip for ip in (spec.get("clusterIPs") or [spec.get("clusterIP")]) if ip and ip != "None"}


# --------------------------------------------------------------------------------------------
# Defaults and type changes
# --------------------------------------------------------------------------------------------
def _drop_carried_over_fields(spec: dict, old_spec: dict) -> None:
    """On a type change, forget what only the old type needed if the client sent it unchanged."""
    if not wants_node_ports(spec):
        old_node_ports = {(p.get("port"), p.get("protocol", "TCP")): p.get("nodePort")
                          for p in old_spec.get("ports") or []}
        for port in spec.get("ports") or []:
            carried = old_node_ports.get((port.get("port"), port.get("protocol", "TCP")))
            if port.get("nodePort") and port.get("nodePort") == carried:
                del port["nodePort"]
    health = spec.get("healthCheckNodePort")
    if not wants_health_check_node_port(spec) and health == old_spec.get("healthCheckNodePort"):
        spec.pop("healthCheckNodePort", None)
    if not externally_accessible(spec) and spec.get("externalTrafficPolicy") == old_spec.get("externalTrafficPolicy"):
        spec.pop("externalTrafficPolicy", None)
    if spec.get("type") != "LoadBalancer" and spec.get("allocateLoadBalancerNodePorts") == old_spec.get(
        "allocateLoadBalancerNodePorts"
    ):
        spec.pop("allocateLoadBalancerNodePorts", None)
    if spec.get("type") == "ExternalName":
        for field in ("clusterIP", "clusterIPs"):
            if spec.get(field) == old_spec.get(field):
                spec.pop(field, None)


def _apply_defaults(spec: dict) -> None:
    spec.setdefault("type", "ClusterIP")
    spec.setdefault("sessionAffinity", "None")
    if spec["sessionAffinity"] == "ClientIP":
        config = spec.setdefault("sessionAffinityConfig", {})
        if isinstance(config, dict):
            client_ip = config.setdefault("clientIP", {})
            if isinstance(client_ip, dict):
                client_ip.setdefault("timeoutSeconds", DEFAULT_AFFINITY_TIMEOUT)
    for port in spec.get("ports") or []:
        if not isinstance(port, dict):
            continue
        port.setdefault("protocol", "TCP")
        if port.get("targetPort") in (None, 0, "") and "port" in port:
            port["targetPort"] = port["port"]
    if spec["type"] != "ExternalName":
        spec.setdefault("internalTrafficPolicy", "Cluster")
    if externally_accessible(spec):
        spec.setdefault("externalTrafficPolicy", "Cluster")
    if spec["type"] == "LoadBalancer":
        spec.setdefault("allocateLoadBalancerNodePorts", True)


# --------------------------------------------------------------------------------------------
# Validation (no allocation state needed)
# --------------------------------------------------------------------------------------------
def _validate_port(index: int, port: object, *, many: bool, node_ports_allowed: bool) -> list[str]:
    path = f"spec.ports[{index}]"
    if not isinstance(port, dict):
        return [f"{path}: Invalid value: must be an object"]
    errors = []
    if not _is_port_number(port.get("port")):
        errors.append(f"{path}.port: Invalid value: {port.get('port')!r}: must be between 1 and 65535, inclusive")
    if port.get("protocol") not in PROTOCOLS:
        errors.append(f"{path}.protocol: Unsupported value: {port.get('protocol')!r}: supported values: "
                      + ", ".join(f'"{p}"' for p in PROTOCOLS))
    name = port.get("name") or ""
    if many and not name:
        errors.append(f"{path}.name: Required value")
    elif name and (not isinstance(name, str) or not _DNS_LABEL.match(name)):
        errors.append(f"{path}.name: Invalid value: {name!r}: must be a lowercase DNS label")
    target = port.get("targetPort")
    if isinstance(target, str):  # a name, never digits in a string (Kubernetes refuses "8080" too)
        if not _IANA_SERVICE_NAME.match(target) or "--" in target or not re.search("[a-z]", target):
            errors.append(f"{path}.targetPort: Invalid value: {target!r}: must be a port number or an IANA "
                          "service name (at most 15 lowercase letters, digits and '-', with a letter)")
    elif not _is_port_number(target):
        errors.append(f"{path}.targetPort: Invalid value: {target!r}: must be between 1 and 65535, inclusive")
    node_port = port.get("nodePort")
    if node_port not in (None, 0):
        if not node_ports_allowed:
            errors.append(f"{path}.nodePort: Forbidden: may not be used when `type` is not 'NodePort' or "
                          "'LoadBalancer' (or LoadBalancer with allocateLoadBalancerNodePorts false)")
        elif not isinstance(node_port, int) or isinstance(node_port, bool) or node_port not in NODE_PORT_RANGE:
            errors.append(f"{path}.nodePort: Invalid value: {node_port!r}: provided port is not in the valid "
                          f"range. The range of valid ports is {NODE_PORT_RANGE.start}-{NODE_PORT_RANGE.stop - 1}")
    return errors


def _validate_address(path: str, text: object, *, service_cidr) -> list[str]:
    """A plain unicast address (service_cidr None), or one inside the service CIDR (the family
    fields, ranges per family included, are `service_families.py`'s)."""
    try:
        address = ipaddress.ip_address(text)  # type: ignore[arg-type]
    except ValueError:
        return [f"{path}: Invalid value: {text!r}: must be a valid IP address"]
    if service_cidr is not None and address not in service_cidr:
        return [f"{path}: Invalid value: {text!r}: provided IP is not in the valid range. "
                f"The range of valid IPs is {service_cidr}"]
    if service_cidr is None and (address.is_unspecified or address.is_loopback or address.is_link_local
                                 or address.is_multicast):
        return [f"{path}: Invalid value: {text!r}: may not be unspecified, loopback, link-local or multicast"]
    return []


def validate(spec: dict) -> None:
    """Raise InvalidService listing every rule `spec` (defaulted) breaks."""
    errors: list[str] = []
    service_type = spec.get("type")
    if service_type not in SERVICE_TYPES:
        errors.append(f"spec.type: Unsupported value: {service_type!r}: supported values: "
                      + ", ".join(f'"{t}"' for t in SERVICE_TYPES))
        raise InvalidService(errors)
    cluster_ip = spec.get("clusterIP") or (spec.get("clusterIPs") or [""])[0] or ""
    headless = cluster_ip == "None"
    ports = spec.get("ports") or []
    if not isinstance(ports, list):
        raise InvalidService(["spec.ports: Invalid value: must be a list"])
    if service_type == "ExternalName":
        external_name = spec.get("externalName")
        if not external_name or not isinstance(external_name, str) or not _DNS_NAME.match(external_name.rstrip(".")):
            errors.append(f"spec.externalName: Invalid value: {external_name!r}: must be a DNS name")
        if cluster_ip:
            errors.append("spec.clusterIP: Forbidden: may not be set for ExternalName services")
    else:
        if not ports and not headless:
            errors.append("spec.ports: Required value")
        if headless and service_type != "ClusterIP":
            errors.append(f"spec.clusterIP: Invalid value: \"None\": may not be set to 'None' for "
                          f"{service_type} services")
        elif cluster_ip and not headless:
            errors.extend(_validate_address("spec.clusterIP", cluster_ip, service_cidr=None))
    node_ports_allowed = wants_node_ports(spec)
    seen_names: set[str] = set()
    seen_ports: set[tuple[object, object]] = set()
    seen_node_ports: set[tuple[object, object]] = set()
    for index, port in enumerate(ports):
        errors.extend(_validate_port(index, port, many=len(ports) > 1, node_ports_allowed=node_ports_allowed))
        if not isinstance(port, dict):
            continue
        name = port.get("name") or ""
        if name and name in seen_names:
            errors.append(f"spec.ports[{index}].name: Duplicate value: {name!r}")
        seen_names.add(name)
        key = (port.get("port"), port.get("protocol"))
        if key in seen_ports:
            errors.append(f"spec.ports[{index}]: Duplicate value: {key[0]}/{key[1]}")
        seen_ports.add(key)
        if port.get("nodePort"):
            node_key = (port.get("nodePort"), port.get("protocol"))
            if node_key in seen_node_ports:
                errors.append(f"spec.ports[{index}].nodePort: Duplicate value: {node_key[0]}/{node_key[1]}")
            seen_node_ports.add(node_key)
    for field, value in (("internalTrafficPolicy", spec.get("internalTrafficPolicy")),
                         ("externalTrafficPolicy", spec.get("externalTrafficPolicy"))):
        if value is not None and value not in TRAFFIC_POLICIES:
            errors.append(f"spec.{field}: Unsupported value: {value!r}: supported values: \"Cluster\", \"Local\"")
    if spec.get("externalTrafficPolicy") is not None and not externally_accessible(spec):
        errors.append("spec.externalTrafficPolicy: Invalid value: may only be set for externally-accessible "
                      "services (NodePort, LoadBalancer, or with externalIPs)")
    errors.extend(_validate_affinity(spec))
    health = spec.get("healthCheckNodePort")
    if health not in (None, 0):
        if not wants_health_check_node_port(spec):
            errors.append("spec.healthCheckNodePort: Forbidden: may only be set when `type` is 'LoadBalancer' "
                          "and `externalTrafficPolicy` is 'Local'")
        elif not isinstance(health, int) or isinstance(health, bool) or health not in NODE_PORT_RANGE:
            errors.append(f"spec.healthCheckNodePort: Invalid value: {health!r}: provided port is not in the valid "
                          f"range. The range of valid ports is {NODE_PORT_RANGE.start}-{NODE_PORT_RANGE.stop - 1}")
    for index, address in enumerate(spec.get("externalIPs") or []):
        errors.extend(_validate_address(f"spec.externalIPs[{index}]", address, service_cidr=None))
    ranges = spec.get("loadBalancerSourceRanges") or []
    if ranges and service_type != "LoadBalancer":
        errors.append("spec.loadBalancerSourceRanges: Forbidden: may only be used when `type` is 'LoadBalancer'")
    for index, cidr in enumerate(ranges):
        try:
            ipaddress.ip_network(cidr, strict=False)
        except (TypeError, ValueError):
            errors.append(f"spec.loadBalancerSourceRanges[{index}]: Invalid value: {cidr!r}: must be a CIDR")
    distribution = spec.get("trafficDistribution")
    if distribution is not None and distribution not in TRAFFIC_DISTRIBUTIONS:
        errors.append(f"spec.trafficDistribution: Unsupported value: {distribution!r}: supported values: "
                      + ", ".join(f'"{d}"' for d in TRAFFIC_DISTRIBUTIONS))
    selector = spec.get("selector")
    if selector is not None and (not isinstance(selector, dict)
                                 or not all(isinstance(k, str) and isinstance(v, str) for k, v in selector.items())):
        errors.append("spec.selector: Invalid value: must map label keys to string values")
    if errors:
        raise InvalidService(errors)


def _validate_affinity(spec: dict) -> list[str]:
    affinity = spec.get("sessionAffinity")
    config = spec.get("sessionAffinityConfig")
    if affinity not in SESSION_AFFINITIES:
        return [f"spec.sessionAffinity: Unsupported value: {affinity!r}: supported values: \"ClientIP\", \"None\""]
    if affinity == "None":
        if config:
            return ["spec.sessionAffinityConfig: Forbidden: must not be set when sessionAffinity is None"]
        return []
    timeout = ((config or {}).get("clientIP") or {}).get("timeoutSeconds") if isinstance(config, dict) else None
    if not isinstance(timeout, int) or isinstance(timeout, bool) or not 1 <= timeout <= MAX_AFFINITY_TIMEOUT:
        return [f"spec.sessionAffinityConfig.clientIP.timeoutSeconds: Invalid value: {timeout!r}: must be greater "
                f"than 0 and less than or equal to {MAX_AFFINITY_TIMEOUT}"]
    return []


# --------------------------------------------------------------------------------------------
# Allocation
# --------------------------------------------------------------------------------------------
class ServiceAddresses:
    """The cluster IPs and node ports in use; `complete()` is the registry's create/update step."""

    def __init__(self, cidr: str) -> None:
        """`cidr`: the Service range, or one per family comma-separated (the primary first)."""
        self.ranges = parse_service_cidrs(cidr)
        self.network = next(iter(self.ranges.values()))  # the primary family's
        self.used_ips: set[str] = set()
        self.used_node_ports: set[int] = set()
        self._next_ip = dict.fromkeys(self.ranges, 1)
        self._next_port = NODE_PORT_RANGE.start

    def observe(self, service: dict) -> None:
        """Mark a stored service's addresses used (at start-up, from the state file)."""
        spec = service.get("spec") or {}
        self.used_ips |= cluster_ips_of(spec)
        self.used_node_ports |= node_ports_of(spec)

    def release(self, service: dict) -> None:
        spec = service.get("spec") or {}
        self.used_ips -= cluster_ips_of(spec)
        self.used_node_ports -= node_ports_of(spec)

    def _allocate_ip(self, family: IpFamily, taken: set[str]) -> str:
        network = self.ranges[family]
        size = network.num_addresses
        for _ in range(size):
            offset = self._next_ip[family]
            self._next_ip[family] = offset + 1 if offset + 1 < size - 1 else 1
            candidate = str(network.network_address + offset)
            if candidate not in self.used_ips and candidate not in taken:
                return candidate
        raise InvalidService([f"spec.clusterIP: Internal error: no free address in {network}"])

    def _allocate_node_port(self, taken: set[int]) -> int:
        for _ in NODE_PORT_RANGE:
            candidate = self._next_port
            self._next_port = candidate + 1 if candidate + 1 < NODE_PORT_RANGE.stop else NODE_PORT_RANGE.start
            if candidate not in self.used_node_ports and candidate not in taken:
                return candidate
        raise InvalidService(["spec.ports: Internal error: no free node port"])

    def complete(self, spec: dict, *, old_spec: dict | None) -> dict:
        """The spec with defaults and allocations (old ones kept), validated; commits the allocations."""
        spec = _clone(spec)
        if old_spec is not None:
            _drop_carried_over_fields(spec, old_spec)
        _apply_defaults(spec)
        validate(spec)
        old_ips = cluster_ips_of(old_spec)
        old_node_ports = node_ports_of(old_spec)
        self._complete_cluster_ip(spec, old_spec=old_spec)
        self._complete_node_ports(spec, old_spec=old_spec or {}, old_node_ports=old_node_ports)
        new_ips, new_node_ports = cluster_ips_of(spec), node_ports_of(spec)
        self.used_ips = (self.used_ips - (old_ips - new_ips)) | new_ips
        self.used_node_ports = (self.used_node_ports - (old_node_ports - new_node_ports)) | new_node_ports
        return spec

    def _complete_cluster_ip(self, spec: dict, *, old_spec: dict | None) -> None:
        """The family fields (`service_families.plan_families`) and an address per family."""
        if spec["type"] == "ExternalName":
            for field in ("clusterIP", "clusterIPs", "ipFamilies", "ipFamilyPolicy"):
                spec.pop(field, None)
            return
        try:
            plan = plan_families(spec, ranges=self.ranges, old_spec=old_spec)
        except InvalidFamilies as error:
            raise InvalidService(error.errors) from None
        old_ips = cluster_ips_of(old_spec)
        addresses: list[str] = []
        for family in plan.families:
            wanted = plan.wanted.get(family)
            if wanted == "None":
                addresses = ["None"]
                break
            if wanted is None:
                wanted = self._allocate_ip(family, set(addresses))
            elif wanted in self.used_ips and wanted not in old_ips:
                path = "spec.clusterIP" if not addresses else f"spec.clusterIPs[{len(addresses)}]"
                raise InvalidService([f"{path}: Invalid value: {wanted!r}: provided IP is already allocated"])
            addresses.append(wanted)
        spec["clusterIP"] = addresses[0]
        spec["clusterIPs"] = addresses
        spec["ipFamilies"] = [family.label for family in plan.families]
        spec["ipFamilyPolicy"] = plan.policy

    def _complete_node_ports(self, spec: dict, *, old_spec: dict, old_node_ports: set[int]) -> None:
        ports = spec.get("ports") or []
        if not wants_node_ports(spec):
            for port in ports:
                port.pop("nodePort", None)
        else:
            kept = {(p.get("port"), p.get("protocol", "TCP")): p.get("nodePort")
                    for p in old_spec.get("ports") or [] if p.get("nodePort")}
            taken = {int(p["nodePort"]) for p in ports if p.get("nodePort")}
            for number in taken - old_node_ports:
                if number in self.used_node_ports:
                    raise InvalidService([f"spec.ports[].nodePort: Invalid value: {number}: provided port is "
                                          "already allocated"])
            by_port_number: dict[object, int] = {}
            for port in ports:  # a port kept from before, or one exposed over another protocol, keeps its number
                if not port.get("nodePort"):
                    previous = kept.get((port["port"], port["protocol"]))
                    if previous and previous not in taken:
                        port["nodePort"] = previous
                        taken.add(previous)
                if port.get("nodePort"):
                    by_port_number.setdefault(port["port"], port["nodePort"])
            for port in ports:
                if not port.get("nodePort"):
                    port["nodePort"] = by_port_number.get(port["port"]) or self._allocate_node_port(taken)
                    taken.add(port["nodePort"])
                    by_port_number.setdefault(port["port"], port["nodePort"])
        if not wants_health_check_node_port(spec):
            spec.pop("healthCheckNodePort", None)
            return
        taken = {int(p["nodePort"]) for p in ports if p.get("nodePort")}
        health = spec.get("healthCheckNodePort") or old_spec.get("healthCheckNodePort")
        if health:
            if health not in old_node_ports and (health in self.used_node_ports or health in taken):
                raise InvalidService([f"spec.healthCheckNodePort: Invalid value: {health}: provided port is "
                                      "already allocated"])
        else:
            health = self._allocate_node_port(taken)
        spec["healthCheckNodePort"] = health

"""Reading NetworkPolicy, Pod and Namespace dicts (as the reflector delivers them) into the
frozen values of model.py, with a sentence for everything that could not be read.

Why fail closed, and how. The API server validates policies, but the agent must not trust
that (an older server, a hand-edited object, a field from a newer API version): a field it
cannot read is reported and left out in the direction that allows LESS. A bad peer or port
item is dropped from its rule, and a rule whose items were all dropped matches nothing
(never "everything", which an empty list would mean). Only a policy whose own podSelector
cannot be read is ignored as a whole, since nobody can say which pods it isolates; that is
reported too. Defaulting follows the API: `policyTypes` absent means Ingress, plus Egress
when the policy has at least one egress rule; a port's protocol defaults to TCP.
"""
from __future__ import annotations

import ipaddress

from netagent.policy.model import (
    ContainerPort,
    IpBlock,
    LabelSelector,
    NamespaceInfo,
    NetworkPolicy,
    Operator,
    Peer,
    PodInfo,
    PodScope,
    PolicyType,
    PortSpec,
    Protocol,
    Requirement,
    Rule,
    labels_of,
)

FINISHED_PHASES = ("Succeeded", "Failed")


class ObjectError(ValueError):
    """A field that cannot be read; the message names the field."""


def parse_selector(raw: object, *, where: str) -> LabelSelector:
    if raw is None:
        return LabelSelector()
    if not isinstance(raw, dict):
        raise ObjectError(f"{where}: a label selector must be an object, not {type(raw).__name__}")
    match_labels = raw.get("matchLabels") or {}
    if not isinstance(match_labels, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in match_labels.items()):
        raise ObjectError(f"{where}.matchLabels: must map strings to strings")
    requirements = []
    for index, item in enumerate(raw.get("matchExpressions") or []):
        at = f"{where}.matchExpressions[{index}]"
        if not isinstance(item, dict) or not isinstance(item.get("key"), str):
            raise ObjectError(f"{at}: needs a key")
        try:
            operator = Operator(item.get("operator"))
        except ValueError:
            raise ObjectError(f"{at}: operator {item.get('operator')!r} is not one of "
                              f"{[op.value for op in Operator]}") from None
        values = item.get("values") or []
        if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
            raise ObjectError(f"{at}: values must be a list of strings")
        if operator in (Operator.IN, Operator.NOT_IN) and not values:
            raise ObjectError(f"{at}: {operator.value} needs at least one value")
        if operator in (Operator.EXISTS, Operator.DOES_NOT_EXIST) and values:
            raise ObjectError(f"{at}: {operator.value} takes no values")
        requirements.append(Requirement(item["key"], operator, tuple(sorted(set(values)))))
    return LabelSelector(labels_of(match_labels), tuple(sorted(set(requirements), key=repr)))


def _network(text: object, *, where: str) -> str:
    if not isinstance(text, str) or "/" not in text:
        raise ObjectError(f"{where}: {text!r} is not a CIDR")
    try:
        network = ipaddress.ip_network(text, strict=False)
    except ValueError as error:
        raise ObjectError(f"{where}: {error}") from None
    if network.version != 4:
        raise ObjectError(f"{where}: {text} is IPv6; this agent enforces IPv4 policies")
    return str(network)


def parse_ip_block(raw: object, *, where: str) -> IpBlock:
    if not isinstance(raw, dict):
        raise ObjectError(f"{where}: must be an object")
    cidr = _network(raw.get("cidr"), where=f"{where}.cidr")
    excepts = []
    for index, item in enumerate(raw.get("except") or []):
        network = _network(item, where=f"{where}.except[{index}]")
        if not ipaddress.ip_network(network).subnet_of(ipaddress.ip_network(cidr)):  # type: ignore[arg-type]
            raise ObjectError(f"{where}.except[{index}]: {network} is not inside {cidr}")
        excepts.append(network)
    return IpBlock(cidr, tuple(sorted(set(excepts))))


def parse_peer(raw: object, *, namespace: str, where: str) -> Peer:
    if not isinstance(raw, dict) or not raw:
        raise ObjectError(f"{where}: a peer needs podSelector, namespaceSelector or ipBlock")
    unknown = set(raw) - {"podSelector", "namespaceSelector", "ipBlock"}
    if unknown:
        raise ObjectError(f"{where}: unknown field(s) {sorted(unknown)}")
    if "ipBlock" in raw:
        if len(raw) > 1:
            raise ObjectError(f"{where}: ipBlock cannot be combined with a selector")
        return Peer(ip_block=parse_ip_block(raw["ipBlock"], where=f"{where}.ipBlock"))
    pods = parse_selector(raw.get("podSelector"), where=f"{where}.podSelector")
    namespaces = (parse_selector(raw["namespaceSelector"], where=f"{where}.namespaceSelector")
                  if raw.get("namespaceSelector") is not None else None)
    return Peer(scope=PodScope(pods, namespaces, namespace))


def parse_port(raw: object, *, where: str) -> PortSpec:
    if not isinstance(raw, dict):
        raise ObjectError(f"{where}: must be an object")
    try:
        protocol = Protocol(raw.get("protocol") or "TCP")
    except ValueError:
        raise ObjectError(f"{where}.protocol: {raw.get('protocol')!r} is not TCP, UDP or SCTP") from None
    port = raw.get("port")
    end_port = raw.get("endPort")
    if isinstance(port, str) and port.isdigit():
        port = int(port)
    if port is not None and not isinstance(port, (int, str)) or isinstance(port, bool):
        raise ObjectError(f"{where}.port: {port!r} is neither a number nor a name")
    if isinstance(port, int) and not 1 <= port <= 65535:
        raise ObjectError(f"{where}.port: {port} is not a port number")
    if isinstance(port, str) and not port:
        raise ObjectError(f"{where}.port: empty name")
    if end_port is not None:
        if not isinstance(port, int):
            raise ObjectError(f"{where}.endPort: needs a numeric port")
        if not isinstance(end_port, int) or isinstance(end_port, bool) or not port <= end_port <= 65535:
            raise ObjectError(f"{where}.endPort: {end_port!r} must be a port number >= port {port}")
        if end_port == port:
            end_port = None
    return PortSpec(protocol, port, end_port)


def _parse_rule(raw: object, *, peer_field: str, namespace: str, where: str,
                problems: list[str]) -> Rule:
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        problems.append(f"{where}: a rule must be an object; it allows nothing")
        return Rule(peers=(), ports=())
    peers: tuple[Peer, ...] | None = None
    raw_peers = raw.get(peer_field)
    if raw_peers:  # missing or [] both mean every peer
        kept = []
        for index, item in enumerate(raw_peers if isinstance(raw_peers, list) else [raw_peers]):
            try:
                kept.append(parse_peer(item, namespace=namespace, where=f"{where}.{peer_field}[{index}]"))
            except ObjectError as error:
                problems.append(f"{error}; this peer is ignored")
        peers = tuple(dict.fromkeys(kept))
    ports: tuple[PortSpec, ...] | None = None
    raw_ports = raw.get("ports")
    if raw_ports:
        kept_ports = []
        for index, item in enumerate(raw_ports if isinstance(raw_ports, list) else [raw_ports]):
            try:
                kept_ports.append(parse_port(item, where=f"{where}.ports[{index}]"))
            except ObjectError as error:
                problems.append(f"{error}; this port is ignored")
        ports = tuple(dict.fromkeys(kept_ports))
    return Rule(peers, ports)


def parse_policy(obj: dict) -> tuple[NetworkPolicy | None, list[str]]:
    """The policy and what could not be read of it (None: the policy is ignored as a whole)."""
    metadata = obj.get("metadata") or {}
    namespace, name = metadata.get("namespace") or "default", metadata.get("name") or "?"
    where = f"NetworkPolicy {namespace}/{name}"
    spec = obj.get("spec")
    problems: list[str] = []
    if not isinstance(spec, dict):
        return None, [f"{where}: no spec; ignored"]
    try:
        pod_selector = parse_selector(spec.get("podSelector"), where=f"{where}: spec.podSelector")
    except ObjectError as error:
        return None, [f"{error}; the policy is ignored"]
    raw_ingress, raw_egress = spec.get("ingress") or [], spec.get("egress") or []
    if not isinstance(raw_ingress, list) or not isinstance(raw_egress, list):
        return None, [f"{where}: ingress and egress must be lists; the policy is ignored"]
    types = set()
    raw_types = spec.get("policyTypes")
    if raw_types:
        for value in raw_types:
            try:
                types.add(PolicyType(value))
            except ValueError:
                problems.append(f"{where}: policyTypes value {value!r} is not Ingress or Egress; ignored")
        if not types:
            problems.append(f"{where}: no usable policyTypes; treated as [Ingress]")
            types.add(PolicyType.INGRESS)
    else:
        types.add(PolicyType.INGRESS)
        if raw_egress:
            types.add(PolicyType.EGRESS)
    ingress = tuple(_parse_rule(rule, peer_field="from", namespace=namespace, where=f"{where}: ingress[{i}]",
                                problems=problems) for i, rule in enumerate(raw_ingress))
    egress = tuple(_parse_rule(rule, peer_field="to", namespace=namespace, where=f"{where}: egress[{i}]",
                               problems=problems) for i, rule in enumerate(raw_egress))
    return NetworkPolicy(namespace, name, pod_selector, frozenset(types), ingress, egress), problems


def parse_pod(obj: dict) -> tuple[PodInfo, list[str]]:
    metadata, spec, status = obj.get("metadata") or {}, obj.get("spec") or {}, obj.get("status") or {}
    namespace, name = metadata.get("namespace") or "default", metadata.get("name") or "?"
    problems: list[str] = []
    ip = status.get("podIP") or None
    if ip is not None:
        try:
            if ipaddress.ip_address(ip).version != 4:
                ip = next((entry.get("ip") for entry in status.get("podIPs") or []
                           if ":" not in str(entry.get("ip"))), None)
        except ValueError:
            problems.append(f"Pod {namespace}/{name}: status.podIP {ip!r} is not an address")
            ip = None
    if status.get("phase") in FINISHED_PHASES:
        ip = None   # a finished pod's address may already belong to another pod
    ports = []
    for container in spec.get("containers") or []:
        for port in (container or {}).get("ports") or []:
            if not isinstance(port, dict) or not port.get("name"):
                continue
            try:
                ports.append(ContainerPort(str(port["name"]), Protocol(port.get("protocol") or "TCP"),
                                           int(port["containerPort"])))
            except (KeyError, TypeError, ValueError):
                problems.append(f"Pod {namespace}/{name}: container port {port!r} is unusable; ignored")
    labels = metadata.get("labels") or {}
    if not isinstance(labels, dict):
        problems.append(f"Pod {namespace}/{name}: labels are not a map; treated as none")
        labels = {}
    return PodInfo(namespace, name, labels_of({str(k): str(v) for k, v in labels.items()}), ip,
                   spec.get("nodeName"), bool(spec.get("hostNetwork")), tuple(ports)), problems


def parse_namespace(obj: dict) -> NamespaceInfo:
    metadata = obj.get("metadata") or {}
    labels = metadata.get("labels") or {}
    return NamespaceInfo(metadata.get("name") or "?",
                         labels_of({str(k): str(v) for k, v in labels.items()} if isinstance(labels, dict) else {}))

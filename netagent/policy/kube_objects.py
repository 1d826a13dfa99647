"""Reading NetworkPolicy, Pod and Namespace dicts (as the reflector delivers them) into the
frozen values of model.py: every object alone, inside a guard, failing closed.

Why. Every object is untrusted (an older or lax API server, a hand-edited object, a field
from a newer API version, a tenant probing the agent): the agent must neither crash on one
nor let one cost another object its programming, and a policy it cannot read must never
leave a pod more open than the policy meant. So each `parse_*` returns a `Reading` (the
value, a sentence per thing that could not be read, and a short reason label for the
rejection record: "" when read fully, `malformed` or `too-large`) and never raises,
whatever the object holds (wrong types at any depth, nulls, unknown fields, huge lists).

How a NetworkPolicy fails closed, from the least to the most of it:
- an item (a peer, a port) that cannot be read is dropped from its rule, and a rule whose
  items were all dropped matches nothing (never "everything", which an empty list means);
  a rule that is not an object, is null, has unknown fields or a non-list `from`/`to`/
  `ports` allows nothing; a direction whose rule list is not a list allows nothing;
- `policyTypes` that cannot be read (not a list, an unknown value) count as both directions;
- a spec with unknown fields, or a policy above the `PolicyLimits` (`too-large`), is read
  *closed*: it isolates the pods it selects in its directions and allows nothing;
- a podSelector that cannot be read (or no spec at all, or anything unexpected) isolates
  every pod of the policy's namespace; with no readable policyTypes, in both directions.
Defaulting follows the API: `policyTypes` absent means Ingress, plus Egress when the policy
has an egress section; a port's protocol defaults to TCP.

Pods and namespaces: a field that cannot be read is left out in the direction that allows
less: unreadable labels make a pod isolated by every policy of its namespace but a member
of no selector peer (`labels_known` False; a namespace likewise matches only an empty
namespaceSelector), an unreadable address or hostNetwork leaves the pod unprogrammed (a
local one stays closed by the KNOWN guard; an unusable address of one family leaves it
unprogrammed in that family), and an unusable container port (70000, a float,
a bad name or protocol) is ignored, so a named port resolves to nothing rather than reach
an ipset or a rule.
"""
from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Generic, TypeVar

from netagent.policy.limits import DEFAULT_LIMITS, PolicyLimits, measure
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
from netagent.errors import NetagentError
from netagent.kube import labels

FINISHED_PHASES = ("Succeeded", "Failed")
BOTH = frozenset({PolicyType.INGRESS, PolicyType.EGRESS})
MALFORMED, TOO_LARGE = "malformed", "too-large"
SPEC_FIELDS = frozenset({"podSelector", "ingress", "egress", "policyTypes"})
SELECTOR_FIELDS = frozenset({"matchLabels", "matchExpressions"})
REQUIREMENT_FIELDS = frozenset({"key", "operator", "values"})
PEER_FIELDS = frozenset({"podSelector", "namespaceSelector", "ipBlock"})
IP_BLOCK_FIELDS = frozenset({"cidr", "except"})
PORT_FIELDS = frozenset({"protocol", "port", "endPort"})
PORT_NAME = re.compile(r"^(?=.*[a-z])[a-z0-9](?:[a-z0-9-]{0,13}[a-z0-9])?$")   # IANA_SVC_NAME
T = TypeVar("T")




@dataclass(frozen=True)
class Reading(Generic[T]):
    """A parsed object: its value (always usable, closed where unreadable), what could not be
    read, and the rejection reason ("" when nothing was refused)."""
    value: T
    problems: tuple[str, ...] = ()
    reason: str = ""


class ObjectError(NetagentError, ValueError):
    """A field that cannot be read; the message names the field."""


def _check_fields(raw: dict, allowed: frozenset[str], *, where: str) -> None:
    unknown = sorted(str(key)[:40] for key in raw if key not in allowed)
    if unknown:
        raise ObjectError(f"{where}: unknown field(s) {unknown[:5]}")


def _list(raw: object, *, where: str) -> list:
    """A list field: null/absent is empty; anything else but a list cannot be read."""
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise ObjectError(f"{where}: must be a list, not {type(raw).__name__}")
    return raw


def _string_map(raw: object, *, where: str) -> dict[str, str]:
    if raw is None:
        return {}
    if not isinstance(raw, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in raw.items()):
        raise ObjectError(f"{where}: must map strings to strings")
    return raw


def _check_label(key: str, value: str, *, where: str) -> None:
    """Keys and values in the API's label syntax (kube/labels.py): the selector's text names
    its sets, and only that syntax keeps two different selectors from one name."""
    if not labels.valid_key(key):
        raise ObjectError(f"{where}: {key[:80]!r} is not a label key")
    if not labels.valid_value(value):
        raise ObjectError(f"{where}: {value[:80]!r} is not a label value (for {key[:80]!r})")


def parse_selector(raw: object, *, where: str) -> LabelSelector:
    if raw is None:
        return LabelSelector()
    if not isinstance(raw, dict):
        raise ObjectError(f"{where}: a label selector must be an object, not {type(raw).__name__}")
    _check_fields(raw, SELECTOR_FIELDS, where=where)
    match_labels = _string_map(raw.get("matchLabels"), where=f"{where}.matchLabels")
    for key, value in match_labels.items():
        _check_label(key, value, where=f"{where}.matchLabels")
    requirements = []
    for index, item in enumerate(_list(raw.get("matchExpressions"), where=f"{where}.matchExpressions")):
        at = f"{where}.matchExpressions[{index}]"
        if not isinstance(item, dict) or not isinstance(item.get("key"), str):
            raise ObjectError(f"{at}: needs a key")
        _check_fields(item, REQUIREMENT_FIELDS, where=at)
        operator_text = item.get("operator")
        if not isinstance(operator_text, str) or operator_text not in {op.value for op in Operator}:
            raise ObjectError(f"{at}: operator {str(operator_text)[:40]!r} is not one of "
                              f"{[op.value for op in Operator]}")
        operator = Operator(operator_text)
        values = _list(item.get("values"), where=f"{at}.values")
        if not all(isinstance(v, str) for v in values):
            raise ObjectError(f"{at}: values must be a list of strings")
        for value in values or [""]:          # the key alone for Exists, DoesNotExist
            _check_label(item["key"], value, where=at)
        if operator in (Operator.IN, Operator.NOT_IN) and not values:
            raise ObjectError(f"{at}: {operator.value} needs at least one value")
        if operator in (Operator.EXISTS, Operator.DOES_NOT_EXIST) and values:
            raise ObjectError(f"{at}: {operator.value} takes no values")
        requirements.append(Requirement(item["key"], operator, tuple(sorted(set(values)))))
    return LabelSelector(labels_of(match_labels), tuple(sorted(set(requirements), key=repr)))


Network = ipaddress.IPv4Network | ipaddress.IPv6Network
MAPPED = ipaddress.IPv6Network("::ffff:0:0/96")      # v4-mapped: an IPv4 address in IPv6 clothing


def _network(text: object, *, where: str) -> Network:
    """A CIDR of either family; refused: no prefix, a zone (`%eth0`), a bad prefix, and any
    IPv6 network touching the v4-mapped range (which would let an IPv4 peer be named twice)."""
    if not isinstance(text, str) or "/" not in text:
        raise ObjectError(f"{where}: {str(text)[:60]!r} is not a CIDR")
    if "%" in text:
        raise ObjectError(f"{where}: {str(text)[:60]!r} has a zone, which a CIDR cannot have")
    try:
        network = ipaddress.ip_network(text, strict=False)
    except ValueError as error:
        raise ObjectError(f"{where}: {str(error)[:100]}") from None
    if isinstance(network, ipaddress.IPv6Network) and network.overlaps(MAPPED) and network.prefixlen >= 1:
        raise ObjectError(f"{where}: {text} is (or holds) v4-mapped IPv6 addresses; name IPv4 peers as IPv4")
    return network


def parse_ip_block(raw: object, *, where: str) -> IpBlock:
    """An ipBlock of either family; each `except` of the block's own family and inside it,
    else the whole block is refused (its peer dropped: the rule allows less, never more)."""
    if not isinstance(raw, dict):
        raise ObjectError(f"{where}: must be an object")
    _check_fields(raw, IP_BLOCK_FIELDS, where=where)
    cidr = _network(raw.get("cidr"), where=f"{where}.cidr")
    excepts = set()
    for index, item in enumerate(_list(raw.get("except"), where=f"{where}.except")):
        network = _network(item, where=f"{where}.except[{index}]")
        if network.version != cidr.version:
            raise ObjectError(f"{where}.except[{index}]: {network} is not of {cidr}'s family")
        if not network.subnet_of(cidr):    # type: ignore[arg-type]  # same family, checked above
            raise ObjectError(f"{where}.except[{index}]: {network} is not inside {cidr}")
        if network == cidr:
            raise ObjectError(f"{where}.except[{index}]: {network} is the whole block, which so matches nothing")
        excepts.add(str(network))
    return IpBlock(str(cidr), tuple(sorted(excepts)))


def parse_peer(raw: object, *, namespace: str, where: str) -> Peer:
    if not isinstance(raw, dict) or not any(raw.get(name) is not None for name in PEER_FIELDS):
        raise ObjectError(f"{where}: a peer needs podSelector, namespaceSelector or ipBlock")
    _check_fields(raw, PEER_FIELDS, where=where)
    if raw.get("ipBlock") is not None:
        if any(raw.get(name) is not None for name in PEER_FIELDS - {"ipBlock"}):
            raise ObjectError(f"{where}: ipBlock cannot be combined with a selector")
        return Peer(ip_block=parse_ip_block(raw["ipBlock"], where=f"{where}.ipBlock"))
    pods = parse_selector(raw.get("podSelector"), where=f"{where}.podSelector")
    namespaces = (parse_selector(raw["namespaceSelector"], where=f"{where}.namespaceSelector")
                  if raw.get("namespaceSelector") is not None else None)
    return Peer(scope=PodScope(pods, namespaces, namespace))


def _protocol(raw: object, *, where: str) -> Protocol:
    if raw is None:
        return Protocol.TCP
    if not isinstance(raw, str) or raw not in {p.value for p in Protocol}:
        raise ObjectError(f"{where}: {str(raw)[:40]!r} is not TCP, UDP or SCTP")
    return Protocol(raw)


def _port_number(raw: object) -> bool:
    return isinstance(raw, int) and not isinstance(raw, bool) and 1 <= raw <= 65535


def parse_port(raw: object, *, where: str) -> PortSpec:
    if not isinstance(raw, dict):
        raise ObjectError(f"{where}: must be an object")
    _check_fields(raw, PORT_FIELDS, where=where)
    protocol = _protocol(raw.get("protocol"), where=f"{where}.protocol")
    port, end_port = raw.get("port"), raw.get("endPort")
    if isinstance(port, str) and port.isascii() and port.isdigit() and len(port) <= 5:
        port = int(port)
    if port is not None and not isinstance(port, (int, str)) or isinstance(port, bool):
        raise ObjectError(f"{where}.port: {str(port)[:40]!r} is neither a number nor a name")
    if isinstance(port, int) and not _port_number(port):
        raise ObjectError(f"{where}.port: {port} is not a port number")
    if isinstance(port, str) and not PORT_NAME.match(port):
        raise ObjectError(f"{where}.port: {port[:40]!r} is not a port name")
    if end_port is not None:
        if not isinstance(port, int):
            raise ObjectError(f"{where}.endPort: needs a numeric port")
        if not _port_number(end_port) or not port <= end_port:
            raise ObjectError(f"{where}.endPort: {str(end_port)[:40]!r} must be a port number >= port {port}")
        if end_port == port:
            end_port = None
    return PortSpec(protocol, port, end_port)


def _parse_items(raw: object, parse, *, where: str, what: str, problems: list[str]) -> tuple | None:
    """None: the list was missing or empty (every peer / port); else the items that could be
    read (an empty tuple matches nothing)."""
    if raw is None or raw == []:
        return None
    if not isinstance(raw, list):
        problems.append(f"{where}: must be a list, not {type(raw).__name__}; the rule allows nothing")
        return ()
    kept = []
    for index, item in enumerate(raw):
        try:
            kept.append(parse(item, where=f"{where}[{index}]"))
        except ObjectError as error:
            problems.append(f"{error}; this {what} is ignored")
    return tuple(dict.fromkeys(kept))


def _parse_rule(raw: object, *, peer_field: str, namespace: str, where: str, problems: list[str]) -> Rule:
    if not isinstance(raw, dict):
        problems.append(f"{where}: a rule must be an object, not {type(raw).__name__}; it allows nothing")
        return Rule(peers=(), ports=())
    try:
        _check_fields(raw, frozenset({peer_field, "ports"}), where=where)
    except ObjectError as error:
        problems.append(f"{error}; the rule allows nothing")
        return Rule(peers=(), ports=())

    def peer(item: object, *, where: str) -> Peer:
        return parse_peer(item, namespace=namespace, where=where)
    peers = _parse_items(raw.get(peer_field), peer, where=f"{where}.{peer_field}", what="peer", problems=problems)
    ports = _parse_items(raw.get("ports"), parse_port, where=f"{where}.ports", what="port", problems=problems)
    return Rule(peers, ports)


def _policy_types(spec: dict, *, where: str, problems: list[str]) -> frozenset[PolicyType]:
    raw = spec.get("policyTypes")
    if raw is None or raw == []:
        egress = spec.get("egress")
        return BOTH if egress is not None and egress != [] else frozenset({PolicyType.INGRESS})
    values = {p.value for p in PolicyType}
    if not isinstance(raw, list) or not all(isinstance(v, str) and v in values for v in raw):
        problems.append(f"{where}: policyTypes {str(raw)[:80]} cannot be read; treated as both directions")
        return BOTH
    return frozenset(PolicyType(v) for v in raw)


def _identity(obj: object, key: str) -> tuple[str, str]:
    """(namespace, name): from the recorder's key when given (what the view is keyed by)."""
    if key:
        space, _, called = key.rpartition("/")
        return space or "default", called
    metadata = obj.get("metadata") if isinstance(obj, dict) else None
    fields = metadata if isinstance(metadata, dict) else {}
    namespace, name = fields.get("namespace"), fields.get("name")
    return (namespace if isinstance(namespace, str) and namespace else "default",
            name if isinstance(name, str) and name else "?")


def _closed(namespace: str, name: str, selector: LabelSelector | None, types: Iterable[PolicyType],
            why: str) -> NetworkPolicy:
    return NetworkPolicy(namespace, name, selector if selector is not None else LabelSelector(),
                         frozenset(types) or BOTH, (), (), closed=why)


def parse_policy(obj: object, *, key: str = "", limits: PolicyLimits = DEFAULT_LIMITS) -> Reading[NetworkPolicy]:
    """The policy as far as it can be read, closed where it cannot (see the module docstring)."""
    namespace, name = _identity(obj, key)
    where = f"NetworkPolicy {namespace}/{name}"
    try:
        return _parse_policy(obj, namespace=namespace, name=name, where=where, limits=limits)
    except Exception as error:     # the guard: nothing an object holds may escape
        why = (f"{where}: cannot be read ({type(error).__name__}: {str(error)[:120]}); it isolates every pod "
               f"of {namespace} both ways")
        return Reading(_closed(namespace, name, None, BOTH, why), (why,), MALFORMED)


def _parse_policy(obj: object, *, namespace: str, name: str, where: str,
                  limits: PolicyLimits) -> Reading[NetworkPolicy]:
    spec = obj.get("spec") if isinstance(obj, dict) else None
    if not isinstance(spec, dict):
        why = f"{where}: spec is not an object; it isolates every pod of {namespace} both ways"
        return Reading(_closed(namespace, name, None, BOTH, why), (why,), MALFORMED)
    problems: list[str] = []
    selector: LabelSelector | None
    try:
        selector = parse_selector(spec.get("podSelector"), where=f"{where}: spec.podSelector")
    except ObjectError as error:
        selector = None
        problems.append(f"{error}")
    types = _policy_types(spec, where=where, problems=problems)
    directions = "/".join(sorted(t.value for t in types))
    whom = f"the pods it selects ({directions})" if selector is not None else f"every pod of {namespace} ({directions})"
    if selector is None:
        why = f"{where}: its podSelector cannot be read, so it isolates {whom} and allows nothing"
        return Reading(_closed(namespace, name, None, types, why), (*problems, why), MALFORMED)
    over = measure(spec, limits)
    if over:
        why = f"{where}: too large ({over}); it isolates {whom} and allows nothing"
        return Reading(_closed(namespace, name, selector, types, why), (*problems, why), TOO_LARGE)
    try:
        _check_fields(spec, SPEC_FIELDS, where=f"{where}: spec")
    except ObjectError as error:
        why = f"{error}; it isolates {whom} and allows nothing"
        return Reading(_closed(namespace, name, selector, types, why), (*problems, why), MALFORMED)
    rules: dict[PolicyType, tuple[Rule, ...]] = {}
    for direction, field, peer_field in ((PolicyType.INGRESS, "ingress", "from"), (PolicyType.EGRESS, "egress", "to")):
        raw = spec.get(field)
        if raw is not None and not isinstance(raw, list):
            problems.append(f"{where}: {field} is not a list; it allows nothing")
            raw = []
        rules[direction] = tuple(_parse_rule(rule, peer_field=peer_field, namespace=namespace,
                                             where=f"{where}: {field}[{i}]", problems=problems)
                                 for i, rule in enumerate(raw or ()))
    policy = NetworkPolicy(namespace, name, selector, types, rules[PolicyType.INGRESS], rules[PolicyType.EGRESS])
    return Reading(policy, tuple(problems), MALFORMED if problems else "")


def _address(raw: object) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(raw) if isinstance(raw, str) else None
    except ValueError:
        return None


def _pod_ips(status: dict, *, where: str, problems: list[str]) -> tuple[str, ...]:
    """`status.podIP` and `status.podIPs`: at most one address per family, IPv4 first (the
    primary, whichever the API lists first, so the ADD's binding and the kubelet's report
    agree). An unusable entry (not an address, a zone, link-local, v4-mapped, a second of one family) is
    left out: the pod is then not programmed in that family, which keeps it closed there."""
    raw_entries: list[object] = [status.get("podIP")]
    entries = status.get("podIPs")
    if entries is not None and not isinstance(entries, list):
        problems.append(f"{where}: status.podIPs is not a list; ignored")
        entries = []
    raw_entries += [entry.get("ip") if isinstance(entry, dict) else entry for entry in (entries or ())][:8]
    found: dict[int, str] = {}
    for raw in raw_entries:
        if raw is None or raw == "":
            continue
        address = _address(raw)
        if address is None or address.is_link_local or (isinstance(address, ipaddress.IPv6Address) and (
                address.scope_id is not None or address.ipv4_mapped is not None)):
            problems.append(f"{where}: pod address {str(raw)[:60]!r} is not a usable address; ignored")
            continue
        text = str(address)
        held = found.setdefault(address.version, text)
        if held != text:
            problems.append(f"{where}: two IPv{address.version} addresses ({held}, {text}); the first is used")
    return tuple(found[version] for version in (4, 6) if version in found)


def _container_ports(spec: dict, *, where: str, problems: list[str]) -> tuple[ContainerPort, ...]:
    ports = []
    containers = spec.get("containers")
    if containers is not None and not isinstance(containers, list):
        problems.append(f"{where}: spec.containers is not a list; its named ports are ignored")
        return ()
    for index, container in enumerate(containers or ()):
        raw_ports = container.get("ports") if isinstance(container, dict) else None
        if container is None or raw_ports is None:
            continue
        if not isinstance(raw_ports, list):
            problems.append(f"{where}: containers[{index}] or its ports cannot be read; ignored")
            continue
        for port in raw_ports:
            if not isinstance(port, dict) or port.get("name") is None:
                continue                       # an unnamed port is never named by a policy
            name, number = port.get("name"), port.get("containerPort")
            try:
                protocol = _protocol(port.get("protocol"), where="protocol")
            except ObjectError:
                protocol = None
            if not isinstance(name, str) or not PORT_NAME.match(name) or not _port_number(number) \
                    or protocol is None:
                problems.append(f"{where}: container port {str(port)[:120]} is unusable; ignored")
                continue
            assert isinstance(number, int)
            ports.append(ContainerPort(name, protocol, number))
    return tuple(ports)


def parse_pod(obj: object, *, key: str = "") -> Reading[PodInfo]:
    namespace, name = _identity(obj, key)
    where = f"Pod {namespace}/{name}"
    try:
        return _parse_pod(obj, namespace=namespace, name=name, where=where)
    except Exception as error:     # the guard: unprogrammed (closed), a member of nothing
        why = f"{where}: cannot be read ({type(error).__name__}: {str(error)[:120]}); left unprogrammed"
        return Reading(PodInfo(namespace, name, (), None, None, True, (), labels_known=False), (why,), MALFORMED)


def _section(obj: dict, field: str, *, where: str, problems: list[str]) -> dict:
    value = obj.get(field)
    if value is None or isinstance(value, dict):
        return value or {}
    problems.append(f"{where}: {field} is not an object")
    return {}


def _parse_pod(obj: object, *, namespace: str, name: str, where: str) -> Reading[PodInfo]:
    problems: list[str] = []
    if not isinstance(obj, dict):
        raise ObjectError("not an object")
    metadata = _section(obj, "metadata", where=where, problems=problems)
    labels_known = not problems
    spec = _section(obj, "spec", where=where, problems=problems)
    status = _section(obj, "status", where=where, problems=problems)
    try:
        labels = _string_map(metadata.get("labels"), where="metadata.labels")
    except ObjectError:
        problems.append(f"{where}: labels are not a map of strings; isolated by any policy of {namespace}, "
                        f"matched by no selector")
        labels, labels_known = {}, False
    node_name = spec.get("nodeName")
    if node_name is not None and not isinstance(node_name, str):
        problems.append(f"{where}: spec.nodeName is not a string")
        node_name = None
    host_network = spec.get("hostNetwork")
    if host_network is not None and not isinstance(host_network, bool):
        problems.append(f"{where}: spec.hostNetwork is not a boolean; treated as host network (unprogrammed)")
        host_network = True
    ips = _pod_ips(status, where=where, problems=problems)
    phase = status.get("phase")
    if phase in FINISHED_PHASES or (phase is not None and not isinstance(phase, str)):
        ips = ()   # a finished pod's addresses may already belong to another pod
    ports = _container_ports(spec, where=where, problems=problems)
    info = PodInfo(namespace, name, labels_of(labels), ips[0] if ips else None, node_name or None,
                   bool(host_network), ports, labels_known=labels_known, ips=ips if len(ips) > 1 else ())
    return Reading(info, tuple(problems), MALFORMED if problems else "")


def parse_namespace(obj: object, *, key: str = "") -> Reading[NamespaceInfo]:
    _, name = _identity(obj, key)
    try:
        metadata = obj.get("metadata") if isinstance(obj, dict) else None
        labels = _string_map(metadata.get("labels") if isinstance(metadata, dict) else None, where="labels")
        if not isinstance(metadata, dict):
            raise ObjectError("no metadata")
        return Reading(NamespaceInfo(name, labels_of(labels)))
    except Exception:              # the guard: a namespace only an empty namespaceSelector matches
        why = f"Namespace {name}: labels cannot be read; matched by no namespace selector but an empty one"
        return Reading(NamespaceInfo(name, (), labels_known=False), (why,), MALFORMED)

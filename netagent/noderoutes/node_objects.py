"""What a Node object means to the agent: its lease, its announcement, and the peer it is.

A Node is read as a plain dict (the reflector's JSON, not the client's model classes).
Our own data lives in annotations under our prefix, as flannel does under its own:

    netagent.io/backend-type          vxlan | host-gw | ipip | auto
    netagent.io/public-ip             the node's IPv4 underlay address
    netagent.io/public-ipv6           the node's IPv6 underlay address (dual-stack, IPv6-only)
    netagent.io/backend-data          JSON, e.g. {"vtepMAC": "...", "vtepMAC6": "..."} for VXLAN
    netagent.io/public-ip-overwrite   set by the user: announce this address instead

A Node becomes a routing peer only once its agent has announced itself (a public IP of either
family and, for encapsulation, backend data) and it has a pod CIDR; until then it is "pending".
Its IPv6 announcement is read on its own: a malformed `public-ipv6` (wrong type, too long, not
a global unicast IPv6 address) makes only its IPv6 pod CIDR unroutable, with the reason
(`Peer.ipv6_problem`), and costs its IPv4 routes nothing.

Every Node is untrusted (any kubelet writes its own Node's annotations; a lax API server
stores wrong types). `read_peer` is total: each field is checked for its type and size
before use, the backend data's length and JSON nesting are bounded before `json.loads`
sees it, and a Node that cannot be read is `Unusable` with a reason label, costing no
other Node anything. Whether a readable peer may be routed (cluster CIDR, conflicts) is
the planner's decision (`routing/admission.py`).
"""
from __future__ import annotations

import ipaddress
import json
from dataclasses import dataclass
from datetime import datetime, timezone

from netagent.noderoutes.routing.model import Peer, RefusalReason
from netagent.errors import NetagentError
from netagent.kernel.families import IpFamily

PREFIX = "netagent.io/"
BACKEND_TYPE = PREFIX + "backend-type"
PUBLIC_IP = PREFIX + "public-ip"
PUBLIC_IPV6 = PREFIX + "public-ipv6"
BACKEND_DATA = PREFIX + "backend-data"
PUBLIC_IP_OVERWRITE = PREFIX + "public-ip-overwrite"
ANNOUNCED = (BACKEND_TYPE, PUBLIC_IP, PUBLIC_IPV6, BACKEND_DATA)  # the keys our agent writes and re-asserts
MAX_ADDRESS_CHARS = 64

# Bounds read before parsing: our own announcement is about 30 characters of flat JSON.
MAX_BACKEND_DATA_CHARS = 1024
MAX_BACKEND_DATA_DEPTH = 4
MAX_POD_CIDRS = 2  # the API allows one per IP family


class LeaseError(NetagentError):
    """The node's pod CIDR is unusable (unset, malformed, or outside the cluster CIDR)."""


def node_annotations(node: object) -> dict:
    """The Node's annotations; {} when any level is missing or not a mapping."""
    metadata = node.get("metadata") if isinstance(node, dict) else None
    notes = metadata.get("annotations") if isinstance(metadata, dict) else None
    return notes if isinstance(notes, dict) else {}


def node_name(node: dict) -> str:
    return node["metadata"]["name"]


def pod_cidr_strings(node: object) -> list:
    """spec.podCIDRs (or podCIDR) as listed; entries are not checked here (see read_peer and
    node_pod_cidrs); [] when the spec is missing or not a mapping."""
    spec = node.get("spec") if isinstance(node, dict) else None
    if not isinstance(spec, dict):
        return []
    many = spec.get("podCIDRs")
    if isinstance(many, list) and many:
        return list(many)
    return [spec["podCIDR"]] if spec.get("podCIDR") else []


def node_pod_cidrs(node: dict, *, cluster_cidrs: list) -> tuple:
    """The node's lease, checked against the cluster CIDRs; raise LeaseError with the reason."""
    raw = pod_cidr_strings(node)
    if not raw:
        raise LeaseError(f"node {node_name(node)} has no spec.podCIDR: the cluster must allocate node "
                         f"CIDRs (kube-controller-manager --allocate-node-cidrs) or set it by hand")
    cidrs: list = []
    for text in raw:
        try:
            if not isinstance(text, str):
                raise ValueError(f"a {type(text).__name__}, not a string")
            cidr = ipaddress.ip_network(text, strict=True)
        except ValueError as exc:
            raise LeaseError(f"node {node_name(node)}: spec.podCIDR {text!r}: {exc}") from None
        family = IpFamily.of(cidr)
        same_family = [c for c in cluster_cidrs if family.holds(c)]
        if same_family and not any(cidr.subnet_of(c) for c in same_family):
            raise LeaseError(f"node {node_name(node)}: pod CIDR {cidr} is outside the cluster CIDR "
                             f"{', '.join(map(str, same_family))} (--cluster-cidr)")
        if any(family.holds(c) for c in cidrs):
            raise LeaseError(f"node {node_name(node)}: spec.podCIDRs holds two {family.label} CIDRs "
                             f"({', '.join(map(str, raw))}); at most one per IP family")
        cidrs.append(cidr)
    return tuple(cidrs)


def render_announcement(*, backend_type: str, public_ip, backend_data: dict, public_ipv6=None) -> dict:
    """The annotations this node's agent patches onto its Node: `public-ip` for an IPv4
    `public_ip` (an IPv6 one, on an IPv6-only node, is `public-ipv6`), `public-ipv6` for `public_ipv6`."""
    notes = {BACKEND_TYPE: backend_type}
    if public_ip is not None and IpFamily.V6.holds(str(public_ip)):
        public_ip, public_ipv6 = None, public_ip
    if public_ip is not None:
        notes[PUBLIC_IP] = str(public_ip)
    if public_ipv6 is not None:
        notes[PUBLIC_IPV6] = str(public_ipv6)
    notes[BACKEND_DATA] = json.dumps(backend_data, sort_keys=True, separators=(",", ":"))
    return notes


@dataclass(frozen=True)
class NotYet:
    """The Node is fine but not a peer yet (its agent has not announced itself)."""
    detail: str


@dataclass(frozen=True)
class Unusable:
    """The Node cannot be read as a peer: refused, with the label and an operator's sentence."""
    reason: RefusalReason
    detail: str


class _Bad(Exception):
    def __init__(self, reason: RefusalReason, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason
        self.detail = detail


def _text(value: object, what: str, *, limit: int) -> str:
    if not isinstance(value, str):
        raise _Bad(RefusalReason.MALFORMED, f"{what} is a {type(value).__name__}, not a string")
    if len(value) > limit:
        raise _Bad(RefusalReason.TOO_LARGE, f"{what} has {len(value)} characters (at most {limit})")
    return value


def json_depth_exceeds(text: str, limit: int) -> bool:
    """True when arrays/objects in `text` nest deeper than `limit` (strings are skipped), read
    before json.loads so that no nesting reaches the parser's recursion."""
    depth, in_string, escaped = 0, False, False
    for char in text:
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            if depth > limit:
                return True
        elif char in "]}":
            depth -= 1
    return False


def _backend_data(notes: dict) -> dict:
    raw = notes.get(BACKEND_DATA)
    if raw is None:
        return {}
    text = _text(raw, f"annotation {BACKEND_DATA}", limit=MAX_BACKEND_DATA_CHARS)
    if json_depth_exceeds(text, MAX_BACKEND_DATA_DEPTH):
        raise _Bad(RefusalReason.TOO_LARGE, f"annotation {BACKEND_DATA} nests JSON deeper than "
                                            f"{MAX_BACKEND_DATA_DEPTH} levels")
    try:
        data = json.loads(text) if text else {}
    except ValueError as exc:
        raise _Bad(RefusalReason.MALFORMED, f"annotation {BACKEND_DATA} is not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise _Bad(RefusalReason.MALFORMED, f"annotation {BACKEND_DATA} is a JSON {type(data).__name__}, "
                                            f"not an object")
    return data


def _created(metadata: dict) -> datetime | None:
    """metadata.creationTimestamp as an aware UTC time; None (the youngest) when unreadable."""
    raw = metadata.get("creationTimestamp")
    if not isinstance(raw, str) or len(raw) > 64:
        return None
    try:
        created = datetime.fromisoformat(raw.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        return None
    return created.astimezone(timezone.utc) if created.tzinfo is not None else created.replace(tzinfo=timezone.utc)


def _read_peer(node: object) -> Peer | NotYet:
    if not isinstance(node, dict):
        raise _Bad(RefusalReason.MALFORMED, f"the object is a {type(node).__name__}, not a mapping")
    metadata = node.get("metadata")
    if not isinstance(metadata, dict):
        raise _Bad(RefusalReason.MALFORMED, "metadata is not a mapping")
    name = _text(metadata.get("name"), "metadata.name", limit=253)
    notes = metadata.get("annotations")
    if notes is None:
        notes = {}
    if not isinstance(notes, dict):
        raise _Bad(RefusalReason.MALFORMED, "metadata.annotations is not a mapping")
    spec = node.get("spec")
    if spec is None:
        spec = {}
    if not isinstance(spec, dict):
        raise _Bad(RefusalReason.MALFORMED, "spec is not a mapping")
    raw_cidrs = spec.get("podCIDRs")
    if raw_cidrs is None:
        single = spec.get("podCIDR")
        raw_cidrs = [] if single is None or single == "" else [single]
    if not isinstance(raw_cidrs, list):
        raise _Bad(RefusalReason.MALFORMED, "spec.podCIDRs is not a list")
    if len(raw_cidrs) > MAX_POD_CIDRS:
        raise _Bad(RefusalReason.TOO_LARGE, f"spec.podCIDRs has {len(raw_cidrs)} entries (at most "
                                            f"{MAX_POD_CIDRS}, one per IP family)")
    cidrs = []
    for text in raw_cidrs:
        text = _text(text, "a spec.podCIDRs entry", limit=64)
        try:
            cidrs.append(ipaddress.ip_network(text))
        except ValueError:
            raise _Bad(RefusalReason.MALFORMED, f"pod CIDR {text!r} is malformed") from None
    if PUBLIC_IP not in notes and PUBLIC_IPV6 not in notes:
        return NotYet("its agent has not announced a public IP yet")
    public_ipv6, ipv6_problem = _public_ipv6(notes)
    if PUBLIC_IP in notes:
        public = _text(notes[PUBLIC_IP], f"annotation {PUBLIC_IP}", limit=MAX_ADDRESS_CHARS)
        try:
            public_ip: ipaddress.IPv4Address | ipaddress.IPv6Address = ipaddress.IPv4Address(public)
        except ValueError:
            raise _Bad(RefusalReason.MALFORMED, f"announced public IP {public!r} is not an IPv4 address") from None
    elif public_ipv6 is not None:
        public_ip = public_ipv6
    else:
        raise _Bad(RefusalReason.MALFORMED, f"no usable public IP: {ipv6_problem}")
    if not cidrs:
        return NotYet("it has no pod CIDR")
    data = _backend_data(notes)
    vtep_mac, vtep_mac6 = data.get("vtepMAC"), data.get("vtepMAC6")
    if vtep_mac is not None:
        vtep_mac = _text(vtep_mac, f"{BACKEND_DATA} vtepMAC", limit=64)
    if vtep_mac6 is not None:
        vtep_mac6 = _text(vtep_mac6, f"{BACKEND_DATA} vtepMAC6", limit=64)
    uid = metadata.get("uid")
    return Peer(name=name, public_ip=public_ip, pod_cidrs=tuple(cidrs), vtep_mac=vtep_mac,
                created=_created(metadata), uid=uid if isinstance(uid, str) and len(uid) <= 128 else "",
                public_ipv6=public_ipv6, vtep_mac6=vtep_mac6, ipv6_problem=ipv6_problem)


def _public_ipv6(notes: dict) -> tuple[ipaddress.IPv6Address | None, str]:
    """(address, "") or (None, why): the IPv6 announcement judged alone, never raising."""
    raw = notes.get(PUBLIC_IPV6)
    if raw is None:
        return None, ""
    what = f"annotation {PUBLIC_IPV6}"
    if not isinstance(raw, str):
        return None, f"{what} is a {type(raw).__name__}, not a string"
    if len(raw) > MAX_ADDRESS_CHARS:
        return None, f"{what} has {len(raw)} characters (at most {MAX_ADDRESS_CHARS})"
    try:
        address = ipaddress.IPv6Address(raw)
    except ValueError:
        return None, f"announced public IPv6 {raw!r} is not an IPv6 address"
    if address.scope_id is not None or address.ipv4_mapped is not None or not _global_unicast(address):
        return None, f"announced public IPv6 {raw!r} is not a global unicast IPv6 address"
    return address, ""


def _global_unicast(address: ipaddress.IPv6Address) -> bool:
    return not (address.is_unspecified or address.is_loopback or address.is_multicast or address.is_link_local
                or address.is_reserved)


def read_peer(node: object) -> Peer | NotYet | Unusable:
    """The routing peer a Node is, NotYet, or Unusable with the reason. Total: never raises,
    whatever the object holds (every field is checked for its type and size before use)."""
    try:
        return _read_peer(node)
    except _Bad as bad:
        return Unusable(bad.reason, bad.detail)
    except Exception as exc:  # a case the checks above missed must still cost only this Node
        return Unusable(RefusalReason.MALFORMED, f"unreadable: {type(exc).__name__}: {exc}")


def announced_vtep_mac(node: object, *, ipv6: bool = False) -> str:
    """The VTEP MAC a Node announces (`vtepMAC`, or `vtepMAC6` with `ipv6`), normalized; "" when
    none or unreadable. Total, as `read_peer`."""
    from netagent.noderoutes.routing.vxlan import normalize_mac
    found = read_peer(node)
    mac = getattr(found, "vtep_mac6" if ipv6 else "vtep_mac", None)
    return (normalize_mac(mac) or "") if isinstance(mac, str) else ""

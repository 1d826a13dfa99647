"""What a Node object means to the agent: its lease, its announcement, and the peer it is.

A Node is read as a plain dict (the reflector's JSON, not the client's model classes).
Our own data lives in annotations under our prefix, as flannel does under its own:

    netagent.io/backend-type          vxlan | host-gw | ipip | auto
    netagent.io/public-ip             the node's underlay address
    netagent.io/backend-data          JSON, e.g. {"vtepMAC": "..."} for VXLAN
    netagent.io/public-ip-overwrite   set by the user: announce this address instead

A Node becomes a routing peer only once its agent has announced itself (public IP and,
for encapsulation, backend data) and it has a pod CIDR; until then it is "pending".
"""
from __future__ import annotations

import ipaddress
import json

from netagent.noderoutes.routing.model import Peer

PREFIX = "netagent.io/"
BACKEND_TYPE = PREFIX + "backend-type"
PUBLIC_IP = PREFIX + "public-ip"
BACKEND_DATA = PREFIX + "backend-data"
PUBLIC_IP_OVERWRITE = PREFIX + "public-ip-overwrite"


class LeaseError(Exception):
    """The node's pod CIDR is unusable (unset, malformed, or outside the cluster CIDR)."""


def node_annotations(node: dict) -> dict:
    return (node.get("metadata") or {}).get("annotations") or {}


def node_name(node: dict) -> str:
    return node["metadata"]["name"]


def pod_cidr_strings(node: dict) -> list[str]:
    spec = node.get("spec") or {}
    return list(spec.get("podCIDRs") or ([spec["podCIDR"]] if spec.get("podCIDR") else []))


def node_pod_cidrs(node: dict, *, cluster_cidrs: list) -> tuple:
    """The node's lease, checked against the cluster CIDRs; raise LeaseError with the reason."""
    raw = pod_cidr_strings(node)
    if not raw:
        raise LeaseError(f"node {node_name(node)} has no spec.podCIDR: the cluster must allocate node "
                         f"CIDRs (kube-controller-manager --allocate-node-cidrs) or set it by hand")
    cidrs = []
    for text in raw:
        try:
            cidr = ipaddress.ip_network(text, strict=True)
        except ValueError as exc:
            raise LeaseError(f"node {node_name(node)}: spec.podCIDR {text!r}: {exc}") from None
        same_family = [c for c in cluster_cidrs if c.version == cidr.version]
        if same_family and not any(cidr.subnet_of(c) for c in same_family):
            raise LeaseError(f"node {node_name(node)}: pod CIDR {cidr} is outside the cluster CIDR "
                             f"{', '.join(map(str, same_family))} (--cluster-cidr)")
        cidrs.append(cidr)
    return tuple(cidrs)


def render_announcement(*, backend_type: str, public_ip, backend_data: dict) -> dict:
    """The annotations this node's agent patches onto its Node."""
    return {BACKEND_TYPE: backend_type, PUBLIC_IP: str(public_ip),
            BACKEND_DATA: json.dumps(backend_data, sort_keys=True, separators=(",", ":"))}


def peer_from_node(node: dict) -> tuple[Peer | None, str]:
    """(the routing peer, "") or (None, why it is not one yet)."""
    notes = node_annotations(node)
    if PUBLIC_IP not in notes:
        return None, "its agent has not announced a public IP yet"
    try:
        public_ip = ipaddress.IPv4Address(notes[PUBLIC_IP])
    except ValueError:
        return None, f"announced public IP {notes[PUBLIC_IP]!r} is not an IPv4 address"
    cidrs = []
    for text in pod_cidr_strings(node):
        try:
            cidrs.append(ipaddress.ip_network(text))
        except ValueError:
            return None, f"pod CIDR {text!r} is malformed"
    if not cidrs:
        return None, "it has no pod CIDR"
    try:
        data = json.loads(notes.get(BACKEND_DATA) or "{}")
    except ValueError:
        data = {}
    vtep_mac = data.get("vtepMAC") if isinstance(data, dict) else None
    return Peer(name=node_name(node), public_ip=public_ip, pod_cidrs=tuple(cidrs),
                vtep_mac=vtep_mac if isinstance(vtep_mac, str) else None), ""

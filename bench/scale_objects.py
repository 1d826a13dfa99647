"""The scale harness's cluster, as API objects: the address plan, the sizes, and every object
`bench/scale.py` creates (Nodes, Namespaces, their ServiceAccounts, Pods and their status,
NetworkPolicies, Services, EndpointSlices), and the one record each size writes.

Pure, so the unit tests check the shapes without an API server. Objects are built by the
lab's own renderers where the lab has one (a Node as `lab/node_objects.py` renders it plus the
announcement `netagent/noderoutes/node_objects.py` reads; a Pod as `lab/pod_objects.py`; an
endpoint as `lab/endpointslices.py`), so the agent reads here what it reads in the lab. The
plan is fixed by indexes, so every figure names what it measured: node 0 is the agent's own
node; node i has pod CIDR 10.(128 + i // 256).(i % 256).0/24 and underlay address
172.20.0.0 + 16 + i on the one /16 segment (host-gw needs its peers on-link); pod k of node
i is .(k + 2) in it; pods go round-robin over the nodes, namespaces hold 300 pods each, and
Service s has the 10 pods s*10 .. s*10+9 (mod the pods) as its endpoints. Each Namespace has
one NetworkPolicy: its `role=server` pods accept only `role=client` pods of namespaces of the
same `team`, so every policy's peer set holds pods of many nodes.
"""
from __future__ import annotations

import dataclasses
import ipaddress
import json
from collections.abc import Sequence

from lab.endpointslices import owner_references, render_endpoint, slice_labels
from lab.node_objects import render_node
from lab.pod_objects import render_pod
from netagent.noderoutes import node_objects as announcement

CLUSTER_CIDR = "10.128.0.0/9"
SERVICE_CIDR = "10.96.0.0/16"
SEGMENT = ipaddress.IPv4Network("172.20.0.0/16")
API_ADDRESS = str(SEGMENT[1])         # the API server's end of the segment
NODE_BASE = 16                        # node i's underlay address is SEGMENT[NODE_BASE + i]
PODS_PER_NAMESPACE = 300
TEAMS = 10
ENDPOINTS = 10
MAX_NODES = 32768                     # /24s in the cluster CIDR
MAX_PODS_PER_NODE = 250
FIELDS = ("nodes", "pods", "services", "start_s", "rss_mib", "cpu_s", "node_change_ms", "endpoint_change_ms",
          "policy_change_ms", "relist_requests", "relist_bytes")
EXTRA_FIELDS = ("mode", "create_s", "relist_s", "load_1m", "agent_version", "apiserver", "notes")


class SizeError(ValueError):
    """A `--sizes` entry this plan cannot hold; the message says which and why."""


@dataclasses.dataclass(frozen=True)
class Size:
    nodes: int
    pods: int
    services: int = 1000

    @property
    def namespaces(self) -> int:
        return max(1, -(-self.pods // PODS_PER_NAMESPACE))

    @property
    def label(self) -> str:
        return f"{self.nodes} nodes / {self.pods} pods / {self.services} Services"


def parse_sizes(text: str, *, services: int = 1000) -> list[Size]:
    """`100:3000,1000:30000` (nodes:pods) -> sizes, checked against the address plan."""
    sizes = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        nodes_text, sep, pods_text = item.partition(":")
        if not sep or not nodes_text.isdigit() or not pods_text.isdigit():
            raise SizeError(f"size {item!r}: expected nodes:pods, e.g. 1000:30000")
        size = Size(int(nodes_text), int(pods_text), services)
        if not 2 <= size.nodes <= MAX_NODES:
            raise SizeError(f"size {item!r}: nodes must be 2..{MAX_NODES} (the agent's node and its peers)")
        if not size.nodes <= size.pods <= size.nodes * MAX_PODS_PER_NODE:
            raise SizeError(f"size {item!r}: pods must be between the nodes and {MAX_PODS_PER_NODE} per node")
        sizes.append(size)
    if not sizes:
        raise SizeError("no size given")
    if services < 1:
        raise SizeError("services must be at least 1")
    return sizes


# ------------------------------------------------------------------ the address plan
def node_name(index: int) -> str:
    return f"scale-{index}"


def node_address(index: int) -> str:
    return str(SEGMENT[NODE_BASE + index])


def pod_cidr(index: int) -> str:
    return f"10.{128 + index // 256}.{index % 256}.0/24"


def pod_place(size: Size, pod: int) -> tuple[int, int]:
    """(node, slot on it) of pod number `pod`: round-robin over the nodes."""
    return pod % size.nodes, pod // size.nodes


def pod_address(size: Size, pod: int) -> str:
    node, slot = pod_place(size, pod)
    return str(ipaddress.IPv4Network(pod_cidr(node))[slot + 2])


def namespace_name(index: int) -> str:
    return f"scale-ns-{index}"


def namespace_of(pod: int) -> int:
    return pod // PODS_PER_NAMESPACE


def team_of(namespace: int) -> str:
    return f"t{namespace % TEAMS}"


def pod_name(pod: int) -> str:
    return f"pod-{pod}"


def role_of(pod: int) -> str:
    return "server" if pod % 2 == 0 else "client"


def local_pods(size: Size) -> list[int]:
    """The pods on node 0, the agent's node."""
    return list(range(0, size.pods, size.nodes))


def service_endpoints(size: Size, service: int) -> list[int]:
    return [(service * ENDPOINTS + e) % size.pods for e in range(ENDPOINTS)]


# ------------------------------------------------------------------ objects
def node(index: int, *, mode: str) -> dict:
    """Node `index` as node IPAM and its kubelet leave it, announced as its agent announces it."""
    address = node_address(index)
    obj = render_node(node_name(index), segment=1, pod_cidr=pod_cidr(index), address=address)
    if index > 0:   # node 0 is the measured agent's: it announces itself
        data = {"vtepMAC": f"0e:42:{(index >> 8) & 0xff:02x}:{index & 0xff:02x}:00:01"} if mode == "vxlan" else {}
        obj["metadata"]["annotations"] = announcement.render_announcement(
            backend_type=mode, public_ip=address, backend_data=data)
    return obj


def namespace(index: int) -> dict:
    return {"apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": namespace_name(index), "labels": {"team": team_of(index), "scale": "yes"}}}


def service_account(index: int) -> dict:
    """The `default` ServiceAccount the controller manager would make (none runs here)."""
    return {"apiVersion": "v1", "kind": "ServiceAccount",
            "metadata": {"name": "default", "namespace": namespace_name(index)}}


def pod(size: Size, index: int, *, role: str | None = None) -> dict:
    """Pod `index` on its node, Running with its address (its status goes in through /status)."""
    node_index, _ = pod_place(size, index)
    obj = render_pod(pod_name(index), namespace=namespace_name(namespace_of(index)), node=node_name(node_index),
                     host_ip=node_address(node_index), pod_ip=pod_address(size, index),
                     labels={"role": role or role_of(index), "app": f"app-{index % 50}"},
                     ports={"http": [8080, "TCP"]})
    obj["spec"]["automountServiceAccountToken"] = False
    return obj


def pod_status_patch(pod_obj: dict) -> dict:
    """What a kubelet writes: the whole status, as a merge patch of /status."""
    return {"status": pod_obj["status"]}


def network_policy(index: int) -> dict:
    return {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
            "metadata": {"name": "servers", "namespace": namespace_name(index)},
            "spec": {"podSelector": {"matchLabels": {"role": "server"}}, "policyTypes": ["Ingress"],
                     "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"team": team_of(index)}},
                                            "podSelector": {"matchLabels": {"role": "client"}}}],
                                  "ports": [{"protocol": "TCP", "port": 8080}]}]}}


def service(size: Size, index: int) -> dict:
    """Service `index` in its first endpoint's namespace (the API server allots the cluster IP)."""
    first = service_endpoints(size, index)[0]
    return {"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": f"svc-{index}", "namespace": namespace_name(namespace_of(first))},
            "spec": {"type": "ClusterIP", "ports": [{"name": "http", "port": 80, "targetPort": 8080,
                                                     "protocol": "TCP"}]}}


def endpoint_slice(size: Size, created_service: dict, index: int, *, extra: Sequence[dict] = ()) -> dict:
    """The slice of Service `index` (as created: it needs the uid) with its 10 endpoints and `extra`
    (pods, rendered as endpoints too: an endpoint added)."""
    pods = [pod(size, p) for p in service_endpoints(size, index)] + list(extra)
    metadata = created_service["metadata"]
    return {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": f"svc-{index}-scale", "namespace": metadata["namespace"],
                         "labels": slice_labels(created_service),
                         "ownerReferences": owner_references(created_service)},
            "addressType": "IPv4", "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
            "endpoints": [render_endpoint(created_service, p, node=None) for p in pods]}


def extra_endpoint_pod(size: Size, sample: int) -> dict:
    """A pod that is in no Service yet, to add as an endpoint: on the last node, past its slots."""
    node_index = size.nodes - 1
    obj = pod(size, 0)
    address = ipaddress.IPv4Network(pod_cidr(node_index))[200 + sample % 50]
    obj["metadata"]["name"] = f"extra-{sample}"
    obj["spec"]["nodeName"] = node_name(node_index)
    obj["status"]["podIP"] = str(address)
    obj["status"]["podIPs"] = [{"ip": str(address)}]
    return obj


# ------------------------------------------------------------------ the record
def record(size: Size, **figures: object) -> dict:
    """One size's record: the issue's FIELDS (None where not measured), then EXTRA_FIELDS."""
    unknown = set(figures) - set(FIELDS) - set(EXTRA_FIELDS)
    if unknown:
        raise KeyError(f"not a record field: {', '.join(sorted(unknown))}")
    base = {"nodes": size.nodes, "pods": size.pods, "services": size.services}
    out = {key: base.get(key, figures.get(key)) for key in FIELDS}
    out.update({key: figures.get(key) for key in EXTRA_FIELDS})
    return out


def records_json(records: list[dict]) -> str:
    return json.dumps(records, indent=1) + "\n"

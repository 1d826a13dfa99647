"""The v1 Node objects the lab publishes for its nodes, as node IPAM and a kubelet would.

What the rest of a cluster sees of a lab node: its hostname and zone labels (the zone is its
segment, for topology-aware routing), `spec.podCIDR(s)` as kube-controller-manager's node
IPAM assigns them (one per family of the cluster), its InternalIP (one per underlay family) and Hostname addresses, and the Ready condition a kubelet
posts once it runs (reason KubeletReady, with heartbeat and transition times), so kubectl
shows the node Ready rather than Unknown, and the kubelet's port (`daemonEndpoints`), which the
lab's kubelet stand-in serves and the API server reads a pod's log from. Pure: `cluster.py` writes it.
"""
from __future__ import annotations

from lab.pod_objects import now_rfc3339

KUBELET_PORT = 10250   # the kubelet's port, where the lab's kubelet stand-in (`kubelet.py`) listens


def ready_condition(*, since: str) -> dict:
    return {"type": "Ready", "status": "True", "reason": "KubeletReady",
            "message": "kubelet is posting ready status", "lastHeartbeatTime": since,
            "lastTransitionTime": since}


def render_node(name: str, *, segment: int, pod_cidr: str, address: str, pod_cidrs: list[str] | None = None,
                addresses: list[str] | None = None) -> dict:
    """The Node as the lab's node controller creates it and its kubelet reports it: `pod_cidrs`
    one per family (the primary first; default [`pod_cidr`]), `addresses` its InternalIPs
    (default [`address`])."""
    pod_cidrs = list(pod_cidrs or [pod_cidr])
    return {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name,
                                              "topology.kubernetes.io/zone": f"segment-{segment}"}},
        "spec": {"podCIDR": pod_cidrs[0], "podCIDRs": pod_cidrs},
        "status": {"addresses": [*({"type": "InternalIP", "address": ip} for ip in addresses or [address]),
                                 {"type": "Hostname", "address": name}],
                   "conditions": [ready_condition(since=now_rfc3339())],
                   "daemonEndpoints": {"kubeletEndpoint": {"Port": KUBELET_PORT}}},
    }

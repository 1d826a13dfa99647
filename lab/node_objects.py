"""The v1 Node objects the lab publishes for its nodes, as node IPAM and a kubelet would.

What the rest of a cluster sees of a lab node: its hostname and zone labels (the zone is its
segment, for topology-aware routing), `spec.podCIDR(s)` as kube-controller-manager's node
IPAM assigns it, its InternalIP and Hostname addresses, and the Ready condition a kubelet
posts once it runs (reason KubeletReady, with heartbeat and transition times), so kubectl
shows the node Ready rather than Unknown. Pure: `cluster.py` writes it.
"""
from __future__ import annotations

from lab.pod_objects import now_rfc3339


def ready_condition(*, since: str) -> dict:
    return {"type": "Ready", "status": "True", "reason": "KubeletReady",
            "message": "kubelet is posting ready status", "lastHeartbeatTime": since,
            "lastTransitionTime": since}


def render_node(name: str, *, segment: int, pod_cidr: str, address: str) -> dict:
    """The Node as the lab's node controller creates it and its kubelet reports it."""
    return {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name,
                                              "topology.kubernetes.io/zone": f"segment-{segment}"}},
        "spec": {"podCIDR": pod_cidr, "podCIDRs": [pod_cidr]},
        "status": {"addresses": [{"type": "InternalIP", "address": address},
                                 {"type": "Hostname", "address": name}],
                   "conditions": [ready_condition(since=now_rfc3339())]},
    }

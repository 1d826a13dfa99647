"""API objects for the policy engine's unit tests: pods, namespaces and policies as dicts."""
from __future__ import annotations


def pod(namespace: str, name: str, ip: str | None, labels: dict, *, node: str = "node-1",
        ports: tuple = (), host_network: bool = False, phase: str = "Running") -> dict:
    return {"metadata": {"namespace": namespace, "name": name, "labels": labels},
            "spec": {"nodeName": node, "hostNetwork": host_network,
                     "containers": [{"name": "main", "ports": [
                         {"name": port_name, "containerPort": number, "protocol": protocol}
                         for port_name, number, protocol in ports]}]},
            "status": {"phase": phase, "podIP": ip}}


def namespace(name: str, **labels: str) -> dict:
    return {"metadata": {"name": name, "labels": {"kubernetes.io/metadata.name": name, **labels}}}


def policy(namespace: str, name: str, spec: dict) -> dict:
    return {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
            "metadata": {"namespace": namespace, "name": name}, "spec": spec}

"""Builders for Service and EndpointSlice objects (plain dicts, as the API sends them) in proxy tests."""
from __future__ import annotations


def service(name: str, *, namespace: str = "default", cluster_ip: str = "10.96.0.10", ports=None,
            kind: str = "ClusterIP", annotations: dict | None = None, status: dict | None = None,
            labels: dict | None = None, **spec) -> dict:
    body = {"type": kind, "clusterIP": cluster_ip, "clusterIPs": [cluster_ip],
            "ports": ports if ports is not None else [{"name": "http", "port": 80, "protocol": "TCP"}], **spec}
    metadata = {"name": name, "namespace": namespace}
    if annotations:
        metadata["annotations"] = annotations
    if labels:
        metadata["labels"] = labels
    obj = {"apiVersion": "v1", "kind": "Service", "metadata": metadata, "spec": body}
    if status:
        obj["status"] = status
    return obj


def endpoint(ip: str, *, node: str | None = "node-a", ready: bool | None = True, serving: bool | None = None,
             terminating: bool | None = None, zone: str | None = None, for_zones=(), for_nodes=()) -> dict:
    conditions = {key: value for key, value in
                  (("ready", ready), ("serving", serving), ("terminating", terminating)) if value is not None}
    raw = {"addresses": [ip], "conditions": conditions}
    if node:
        raw["nodeName"] = node
    if zone:
        raw["zone"] = zone
    hints = {}
    if for_zones:
        hints["forZones"] = [{"name": z} for z in for_zones]
    if for_nodes:
        hints["forNodes"] = [{"name": n} for n in for_nodes]
    if hints:
        raw["hints"] = hints
    return raw


def endpoint_slice(name: str, service_name: str, endpoints, *, namespace: str = "default", ports=None,
                   trigger_time: str | None = None, address_type: str = "IPv4") -> dict:
    metadata = {"name": name, "namespace": namespace, "labels": {"kubernetes.io/service-name": service_name}}
    if trigger_time:
        metadata["annotations"] = {"endpoints.kubernetes.io/last-change-trigger-time": trigger_time}
    return {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", "metadata": metadata,
            "addressType": address_type, "endpoints": list(endpoints),
            "ports": ports if ports is not None else [{"name": "http", "port": 8080, "protocol": "TCP"}]}

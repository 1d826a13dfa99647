"""Table responses: what `kubectl get` prints, computed by the server as the real one does.

kubectl asks for a meta.k8s.io/v1 `Table` (`Accept: ...;as=Table;v=v1;g=meta.k8s.io`) and
prints its cells; the server owns the columns. These are Kubernetes' own printer columns
for the served kinds, wide ones (`-o wide`) with priority 1, and each row carries the
object's metadata as PartialObjectMetadata, as with the default `includeObject=Metadata`.
A kind without an entry here gets NAME and AGE, as the real server gives custom kinds.
Ages are Kubernetes' human durations (`45s`, `3m2s`, `5h`, `12d`).
"""
from __future__ import annotations

import calendar
import time
from collections.abc import Callable
from typing import Any

Cell = Callable[[dict], object]


def human_duration(seconds: float) -> str:
    s = int(max(seconds, 0))
    if s < 120:
        return f"{s}s"
    minutes, hours, days = s // 60, s // 3600, s // 86400
    if minutes < 10:
        return f"{minutes}m{s % 60}s" if s % 60 else f"{minutes}m"
    if hours < 3:
        return f"{minutes}m"
    if hours < 8:
        return f"{hours}h{minutes % 60}m" if minutes % 60 else f"{hours}h"
    if hours < 48:
        return f"{hours}h"
    if hours < 192:
        return f"{days}d{hours % 24}h" if hours % 24 else f"{days}d"
    if days < 365 * 2:
        return f"{days}d"
    return f"{days // 365}y{days % 365}d" if days < 365 * 8 else f"{days // 365}y"


def _since(timestamp: object) -> str:
    if not isinstance(timestamp, str) or not timestamp:
        return "<unknown>"
    try:
        then = calendar.timegm(time.strptime(timestamp[:19], "%Y-%m-%dT%H:%M:%S"))
    except ValueError:
        return "<unknown>"
    return human_duration(time.time() - then)


def _get(obj: dict, *path: str) -> Any:
    node: object = obj
    for step in path:
        node = node.get(step) if isinstance(node, dict) else None
    return node


def _age(obj: dict) -> str:
    return _since(_get(obj, "metadata", "creationTimestamp"))


def _none(value: object) -> str:
    return str(value) if value not in (None, "", []) else "<none>"


def _pod_ready(pod: dict) -> str:
    statuses = _get(pod, "status", "containerStatuses") or []
    ready = sum(1 for s in statuses if isinstance(s, dict) and s.get("ready"))
    return f"{ready}/{len(_get(pod, 'spec', 'containers') or [])}"


def _pod_status(pod: dict) -> str:
    if _get(pod, "metadata", "deletionTimestamp"):
        return "Terminating"
    return str(_get(pod, "status", "reason") or _get(pod, "status", "phase") or "Pending")


def _restarts(pod: dict) -> int:
    return sum(int(s.get("restartCount") or 0) for s in _get(pod, "status", "containerStatuses") or []
               if isinstance(s, dict))


def _readiness_gates(pod: dict) -> str:
    gates = _get(pod, "spec", "readinessGates") or []
    if not gates:
        return "<none>"
    conditions = {c.get("type"): c.get("status") for c in _get(pod, "status", "conditions") or []}
    return f"{sum(1 for g in gates if conditions.get(g.get('conditionType')) == 'True')}/{len(gates)}"


def _service_external(service: dict) -> str:
    kind = _get(service, "spec", "type") or "ClusterIP"
    ips = list(_get(service, "spec", "externalIPs") or [])
    if kind == "ExternalName":
        return str(_get(service, "spec", "externalName") or "<none>")
    if kind == "LoadBalancer":
        ingress = [i.get("ip") or i.get("hostname") for i in _get(service, "status", "loadBalancer", "ingress") or []]
        ips = [str(i) for i in ingress if i] + ips
        return ",".join(ips) if ips else "<pending>"
    return ",".join(ips) if ips else "<none>"


def _service_ports(service: dict) -> str:
    parts = []
    for port in _get(service, "spec", "ports") or []:
        node_port = f":{port['nodePort']}" if port.get("nodePort") else ""
        parts.append(f"{port.get('port')}{node_port}/{port.get('protocol', 'TCP')}")
    return ",".join(parts) if parts else "<none>"


def _selector(service: dict) -> str:
    selector = _get(service, "spec", "selector") or {}
    return ",".join(f"{k}={v}" for k, v in sorted(selector.items())) if selector else "<none>"


def _endpoints(endpoints: dict) -> str:
    shown = []
    for subset in endpoints.get("subsets") or []:
        ports = [p.get("port") for p in subset.get("ports") or []] or [None]
        for address in subset.get("addresses") or []:
            shown += [f"{address.get('ip')}:{p}" if p is not None else str(address.get("ip")) for p in ports]
    if not shown:
        return "<none>"
    return ",".join(shown[:3]) + (f" + {len(shown) - 3} more..." if len(shown) > 3 else "")


def _slice_ports(endpoint_slice: dict) -> str:
    ports = [str(p.get("port")) for p in endpoint_slice.get("ports") or [] if p.get("port") is not None]
    return ",".join(ports) if ports else "<unset>"


def _slice_endpoints(endpoint_slice: dict) -> str:
    addresses = [a for e in endpoint_slice.get("endpoints") or [] for a in e.get("addresses") or []]
    if not addresses:
        return "<unset>"
    return ",".join(addresses[:3]) + (f" + {len(addresses) - 3} more..." if len(addresses) > 3 else "")


def _node_status(node: dict) -> str:
    ready = next((c for c in _get(node, "status", "conditions") or [] if c.get("type") == "Ready"), None)
    status = "Ready" if ready and ready.get("status") == "True" else "NotReady" if ready else "Unknown"
    return status + (",SchedulingDisabled" if _get(node, "spec", "unschedulable") else "")


def _node_roles(node: dict) -> str:
    prefix = "node-role.kubernetes.io/"
    roles = sorted(k[len(prefix):] for k in _get(node, "metadata", "labels") or {} if k.startswith(prefix))
    return ",".join(r for r in roles if r) or "<none>"


def _node_address(kind: str) -> Cell:
    return lambda node: next((a.get("address") for a in _get(node, "status", "addresses") or []
                              if a.get("type") == kind), "<none>")


def _event_object(event: dict) -> str:
    involved = event.get("involvedObject") or {}
    return f"{str(involved.get('kind', '')).lower()}/{involved.get('name', '')}"


def _event_source(event: dict) -> str:
    source = event.get("source") or {}
    component = source.get("component") or event.get("reportingComponent") or ""
    return f"{component}, {source['host']}" if source.get("host") else component


def _event_last_seen(event: dict) -> str:
    return _since(event.get("lastTimestamp") or event.get("eventTime") or _get(event, "metadata", "creationTimestamp"))


def _field(*path: str) -> Cell:
    return lambda obj: _none(_get(obj, *path))


# kind -> [(column name, type, priority, cell)]
COLUMNS: dict[str, list[tuple[str, str, int, Cell]]] = {
    "Namespace": [("Status", "string", 0, lambda o: str(_get(o, "status", "phase") or "Active"))],
    "Node": [
        ("Status", "string", 0, _node_status), ("Roles", "string", 0, _node_roles),
        ("Age", "string", 0, _age), ("Version", "string", 0, _field("status", "nodeInfo", "kubeletVersion")),
        ("Internal-IP", "string", 1, _node_address("InternalIP")),
        ("External-IP", "string", 1, _node_address("ExternalIP")),
        ("OS-Image", "string", 1, _field("status", "nodeInfo", "osImage")),
        ("Kernel-Version", "string", 1, _field("status", "nodeInfo", "kernelVersion")),
        ("Container-Runtime", "string", 1, _field("status", "nodeInfo", "containerRuntimeVersion")),
    ],
    "Pod": [
        ("Ready", "string", 0, _pod_ready), ("Status", "string", 0, _pod_status),
        ("Restarts", "string", 0, lambda o: str(_restarts(o))), ("Age", "string", 0, _age),
        ("IP", "string", 1, _field("status", "podIP")), ("Node", "string", 1, _field("spec", "nodeName")),
        ("Nominated Node", "string", 1, _field("status", "nominatedNodeName")),
        ("Readiness Gates", "string", 1, _readiness_gates),
    ],
    "Service": [
        ("Type", "string", 0, lambda o: str(_get(o, "spec", "type") or "ClusterIP")),
        ("Cluster-IP", "string", 0, _field("spec", "clusterIP")), ("External-IP", "string", 0, _service_external),
        ("Port(s)", "string", 0, _service_ports), ("Age", "string", 0, _age), ("Selector", "string", 1, _selector),
    ],
    "Endpoints": [("Endpoints", "string", 0, _endpoints), ("Age", "string", 0, _age)],
    "EndpointSlice": [
        ("AddressType", "string", 0, _field("addressType")), ("Ports", "string", 0, _slice_ports),
        ("Endpoints", "string", 0, _slice_endpoints), ("Age", "string", 0, _age),
    ],
}
# Events lead with LAST SEEN, not NAME (the real printer's order).
EVENT_COLUMNS: list[tuple[str, str, int, Cell]] = [
    ("Last Seen", "string", 0, _event_last_seen), ("Type", "string", 0, _field("type")),
    ("Reason", "string", 0, _field("reason")), ("Object", "string", 0, _event_object),
    ("Subobject", "string", 1, lambda e: str(_get(e, "involvedObject", "fieldPath") or "")),
    ("Source", "string", 1, _event_source), ("Message", "string", 0, lambda e: str(e.get("message") or "")),
    ("First Seen", "string", 1, lambda e: _since(e.get("firstTimestamp") or e.get("eventTime"))),
    ("Count", "integer", 1, lambda e: int(e.get("count") or 1)),
    ("Name", "string", 1, _field("metadata", "name")),
]
_NAME = ("Name", "string", 0, lambda o: str(_get(o, "metadata", "name")))


def columns_for(kind: str) -> list[tuple[str, str, int, Cell]]:
    if kind == "Event":
        return EVENT_COLUMNS
    extra = COLUMNS.get(kind, [("Age", "string", 0, _age)])
    if kind == "Namespace":
        extra = [*extra, ("Age", "string", 0, _age)]
    return [_NAME, *extra]


def render_table(payload: dict) -> dict:
    """A list (`XList`) or one object as a Table; a watch event's object goes through here too."""
    listed = str(payload.get("kind", "")).endswith("List") and isinstance(payload.get("items"), list)
    kind = str(payload["kind"])[:-4] if listed else str(payload.get("kind"))
    objects = payload["items"] if listed else [payload]
    columns = columns_for(kind)
    rows = [{
        "cells": [cell(obj) for _, _, _, cell in columns],
        "object": {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": obj.get("metadata")},
    } for obj in objects]
    metadata = {k: v for k, v in (payload.get("metadata") or {}).items()
                if k in ("resourceVersion", "continue", "remainingItemCount")} if listed else {
        "resourceVersion": (payload.get("metadata") or {}).get("resourceVersion", "")}
    return {
        "kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": metadata,
        "columnDefinitions": [
            {"name": name, "type": kind_, "format": "name" if name == "Name" else "", "description": "",
             "priority": priority}
            for name, kind_, priority, _ in columns
        ],
        "rows": rows,
    }

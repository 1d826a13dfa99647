"""What `lab status` says about Services: their addresses and the endpoints their slices publish.

Pure: it takes the Service and EndpointSlice objects (listed by the caller) and returns one
JSON-ready dict per Service, so the CLI, tests and the text view read the same summary:

    {"namespace", "name", "type", "clusterIP", "clusterIPs", "ipFamilies", "ports": [{"name", "protocol", "port",
     "targetPort", "nodePort"}], "externalIPs", "loadBalancerIPs", "selector",
     "endpoints": ["ip:port", ...],      ready endpoints (a proxy's first choice; IPv6 as [ip]:port)
     "terminating": ["ip:port", ...],    terminating ones (serving or not)
     "notReady": ["ip:port", ...]}       the rest (not ready, not terminating)

Endpoints come from every slice labelled `kubernetes.io/service-name` (managed or written
by users), one "ip:port" per address and slice port, sorted and without repeats; a missing
`ready` condition counts as ready, as the EndpointSlice API says.
"""
from __future__ import annotations

import ipaddress

from netagent.kube.endpoint_slices import SERVICE_NAME_LABEL, endpoint_conditions


def _address_order(text: str) -> tuple:
    address, _, port = text.rpartition(":")
    try:
        parsed = ipaddress.ip_address(address.strip("[]"))
        return (parsed.version, int(parsed), int(port))
    except ValueError:
        return (0, 0, 0)


def _host_port(address: str, port: object) -> str:
    return f"[{address}]:{port}" if ":" in address else f"{address}:{port}"


def _endpoint_lists(slices: list[dict]) -> dict[str, list[str]]:
    lists: dict[str, set[str]] = {"endpoints": set(), "terminating": set(), "notReady": set()}
    for endpoint_slice in slices:
        ports = [p["port"] for p in endpoint_slice.get("ports") or [] if p.get("port") is not None]
        for endpoint in endpoint_slice.get("endpoints") or []:
            conditions = endpoint_conditions(endpoint)
            if conditions.terminating:
                bucket = "terminating"
            elif not conditions.ready:
                bucket = "notReady"
            else:
                bucket = "endpoints"
            for address in endpoint.get("addresses") or []:
                lists[bucket].update(_host_port(str(address), port) for port in ports)
    return {bucket: sorted(entries, key=_address_order) for bucket, entries in lists.items()}


def summarize_services(services: list[dict], slices: list[dict]) -> list[dict]:
    by_service: dict[tuple[str, str], list[dict]] = {}
    for endpoint_slice in slices:
        metadata = endpoint_slice.get("metadata") or {}
        owner = (metadata.get("labels") or {}).get(SERVICE_NAME_LABEL)
        if owner:
            by_service.setdefault((metadata.get("namespace", ""), owner), []).append(endpoint_slice)
    summaries = []
    for service in sorted(services, key=lambda s: (s["metadata"].get("namespace", ""), s["metadata"]["name"])):
        metadata, spec = service["metadata"], service.get("spec") or {}
        key = (metadata.get("namespace", ""), metadata["name"])
        ingress = ((service.get("status") or {}).get("loadBalancer") or {}).get("ingress") or []
        summaries.append({
            "namespace": key[0],
            "name": key[1],
            "type": spec.get("type", "ClusterIP"),
            "clusterIP": spec.get("clusterIP"),
            "clusterIPs": list(spec.get("clusterIPs") or ([spec["clusterIP"]] if spec.get("clusterIP") else [])),
            "ipFamilies": list(spec.get("ipFamilies") or []),
            "ports": [{"name": p.get("name", ""), "protocol": p.get("protocol", "TCP"), "port": p.get("port"),
                       "targetPort": p.get("targetPort"), "nodePort": p.get("nodePort")}
                      for p in spec.get("ports") or []],
            "externalIPs": list(spec.get("externalIPs") or []),
            "loadBalancerIPs": [entry["ip"] for entry in ingress if entry.get("ip")],
            "selector": dict(spec.get("selector") or {}),
            **_endpoint_lists(by_service.get(key, [])),
        })
    return summaries


def describe_service(summary: dict) -> str:
    """One line for the text status."""
    ports = ",".join(
        f"{p['port']}{'>' + str(p['targetPort']) if p['targetPort'] != p['port'] else ''}"
        f"{':' + str(p['nodePort']) if p.get('nodePort') else ''}/{p['protocol']}"
        for p in summary["ports"]
    )
    cluster_ips = ",".join(summary["clusterIPs"]) or "-"
    line = (f"  svc  {summary['namespace']}/{summary['name']:<20} {summary['type']:<12} "
            f"{cluster_ips:<14} {ports or '-'}  -> {' '.join(summary['endpoints']) or '(none ready)'}")
    if summary["terminating"]:
        line += f"  terminating: {' '.join(summary['terminating'])}"
    if summary["notReady"]:
        line += f"  not ready: {' '.join(summary['notReady'])}"
    return line

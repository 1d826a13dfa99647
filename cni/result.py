"""CNI results: one internal shape, converted to whatever version the runtime asked for.

Internally a result is a dict in the 1.1.0 shape (`interfaces`, `ips` without `version`,
`routes`, `dns`). `to_version` renders it for 0.3.x/0.4.0 (which carry `ips[].version`)
or 1.0.0 (which lacks 1.1's interface and route extras). `normalize` reads any supported
version back, which is what we need for `prevResult` and for delegated IPAM output.
"""
from __future__ import annotations

import copy
import ipaddress

from cni import version as cni_version

_INTERFACE_KEYS_1_1 = ("mtu", "socketPath", "pciID")
_ROUTE_KEYS_1_1 = ("mtu", "advmss", "priority", "table", "scope")


def empty() -> dict:
    return {"interfaces": [], "ips": [], "routes": [], "dns": {}}


def normalize(result: dict | None) -> dict:
    """Any supported version's result -> the internal shape (a deep copy)."""
    out = empty()
    if not result:
        return out
    for key in ("interfaces", "ips", "routes"):
        out[key] = [dict(item) for item in result.get(key) or [] if isinstance(item, dict)]
    for ip in out["ips"]:
        ip.pop("version", None)
    if isinstance(result.get("dns"), dict):
        out["dns"] = copy.deepcopy(result["dns"])
    return out


def to_version(result: dict, version: str) -> dict:
    out = copy.deepcopy(result)
    out["cniVersion"] = version
    if not cni_version.at_least(version, "1.1.0"):
        for iface in out.get("interfaces", []):
            for key in _INTERFACE_KEYS_1_1:
                iface.pop(key, None)
        for route in out.get("routes", []):
            for key in _ROUTE_KEYS_1_1:
                route.pop(key, None)
    if not cni_version.at_least(version, "1.0.0"):
        for ip in out.get("ips", []):
            ip["version"] = str(ipaddress.ip_interface(ip["address"]).version)
    if not out.get("dns"):
        out.pop("dns", None)
    if not out.get("interfaces"):
        out.pop("interfaces", None)
    return out


def merge(previous: dict, own: dict) -> dict:
    """Chain semantics: previous plugins' work first, ours appended, indices shifted."""
    merged = normalize(previous)
    shift = len(merged["interfaces"])
    merged["interfaces"].extend(own.get("interfaces", []))
    for ip in own.get("ips", []):
        ip = dict(ip)
        if "interface" in ip:
            ip["interface"] += shift
        merged["ips"].append(ip)
    merged["routes"].extend(own.get("routes", []))
    if own.get("dns"):
        merged["dns"] = own["dns"]
    return merged

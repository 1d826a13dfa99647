"""Validation of result-shaped input: a config's `prevResult` and every `dns` object.

A chained plugin's `prevResult` and the DNS settings we copy into our own result come from
someone else. Whatever we echo to the runtime must be something a Go runtime can decode
(`types/100`'s field types), and whatever we compute from (addresses, interface indices)
must parse, so both are checked here before ADD or CHECK does any work: a malformed one is
code 7 naming the location (`prevResult.ips[0].address`), never a crash after the veth and
the reservation exist. Standard library only, like `cni.result`.
"""
from __future__ import annotations

import ipaddress

from cni.errors import CniError, ErrorCode

_INTERFACE_STRINGS = ("name", "mac", "sandbox", "socketPath", "pciID")
_ROUTE_INTS = ("mtu", "advmss", "priority", "table", "scope")
_DNS_LISTS = ("nameservers", "search", "options")


def _invalid(where: str, problem: str, value: object) -> CniError:
    """'key' <problem>, with the location and the value in the details."""
    key = where.rsplit(".", 1)[-1]
    return CniError(ErrorCode.INVALID_CONFIG, f"'{key}' {problem}",
                    f"{where}: got {type(value).__name__}: {repr(value)[:200]}")


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _list_of_objects(value: object, where: str) -> list:
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(item, dict) for item in value):
        raise _invalid(where, "must be a list of objects", value)
    return value


def _cidr(value: object, where: str) -> ipaddress.IPv4Interface | ipaddress.IPv6Interface:
    if not isinstance(value, str) or "/" not in value or not value.isascii():
        raise _invalid(where, "must be an address in CIDR notation", value)
    try:
        return ipaddress.ip_interface(value)
    except ValueError:
        raise _invalid(where, "must be an address in CIDR notation", value) from None


def _address(value: object, where: str) -> None:
    if not isinstance(value, str) or not value.isascii():
        raise _invalid(where, "must be an IP address", value)
    try:
        ipaddress.ip_address(value)
    except ValueError:
        raise _invalid(where, "must be an IP address", value) from None


def validate_dns(value: object, where: str) -> dict:
    """A CNI `dns` object: string lists `nameservers` (IP addresses), `search`, `options`, string
    `domain`. Returns it (an empty dict for None)."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise _invalid(where, "must be an object", value)
    for key in _DNS_LISTS:
        items = value.get(key)
        if items is None:
            continue
        if not isinstance(items, list) or not all(isinstance(i, str) for i in items):
            raise _invalid(f"{where}.{key}", "must be a list of strings", items)
    for i, server in enumerate(value.get("nameservers") or []):
        _address(server, f"{where}.nameservers[{i}]")
    if value.get("domain") is not None and not isinstance(value["domain"], str):
        raise _invalid(f"{where}.domain", "must be a string", value["domain"])
    return value


def _check_interfaces(prev: dict) -> int:
    interfaces = _list_of_objects(prev.get("interfaces"), "prevResult.interfaces")
    for i, itf in enumerate(interfaces):
        where = f"prevResult.interfaces[{i}]"
        for key in _INTERFACE_STRINGS:
            if itf.get(key) is not None and not isinstance(itf[key], str):
                raise _invalid(f"{where}.{key}", "must be a string", itf[key])
        if itf.get("mtu") is not None and not _is_int(itf["mtu"]):
            raise _invalid(f"{where}.mtu", "must be an integer", itf["mtu"])
    return len(interfaces)


def _check_ips(prev: dict, *, interfaces: int) -> None:
    for i, ip in enumerate(_list_of_objects(prev.get("ips"), "prevResult.ips")):
        where = f"prevResult.ips[{i}]"
        address = _cidr(ip.get("address"), f"{where}.address")
        if ip.get("gateway") not in (None, ""):
            _address(ip["gateway"], f"{where}.gateway")
        version = ip.get("version")
        if version is not None and version != str(address.version):
            raise _invalid(f"{where}.version", f"must be \"{address.version}\" for {address}", version)
        index = ip.get("interface")
        if index is not None and not (_is_int(index) and 0 <= index < interfaces):
            raise _invalid(f"{where}.interface", f"must index prevResult.interfaces (0..{interfaces - 1})",
                           index)


def _check_routes(prev: dict) -> None:
    for i, route in enumerate(_list_of_objects(prev.get("routes"), "prevResult.routes")):
        where = f"prevResult.routes[{i}]"
        _cidr(route.get("dst"), f"{where}.dst")
        if route.get("gw") not in (None, ""):
            _address(route["gw"], f"{where}.gw")
        for key in _ROUTE_INTS:
            if route.get(key) is not None and not _is_int(route[key]):
                raise _invalid(f"{where}.{key}", "must be an integer", route[key])


def validate_prev_result(prev: object) -> dict | None:
    """The config's `prevResult` when present and well-formed; CniError 7 otherwise."""
    if prev is None:
        return None
    if not isinstance(prev, dict):
        raise _invalid("prevResult", "must be an object", prev)
    interfaces = _check_interfaces(prev)
    _check_ips(prev, interfaces=interfaces)
    _check_routes(prev)
    validate_dns(prev.get("dns"), "prevResult.dns")
    return prev

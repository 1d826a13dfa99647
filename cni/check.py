"""CHECK's verdict as a pure function: what the runtime's `prevResult` promised against what the
kernel holds now, as a list of findings with the messages the runtime will see.

`expected_from` reads the promise (the pod interface, its MAC, addresses and routes of both
families, the host end and, by mode, the bridge it must be a port of or the node routes to the
pod and, with IPv6, the pod's gateway held by the host end);
`find_problems` compares it with a `PodInterface` and a `HostVeth` read through the kernel
seam. No kernel here, so every way an attachment can drift is a unit test, and the handler
only reads, calls this and reports.
"""
from __future__ import annotations

import enum
import ipaddress
from dataclasses import dataclass

from cni.errors import CniError, ErrorCode
from cni.kernel import Address, HostVeth, Interface, Network, PodInterface
from cni.wiring import routed_host_addresses
from netagent.kernel.pod_attachment import PodAttachment


class Problem(enum.Enum):
    POD_INTERFACE_MISSING = "pod interface missing"
    MAC_DIFFERS = "MAC differs"
    POD_INTERFACE_DOWN = "pod interface down"
    ADDRESS_MISSING = "address missing"
    ROUTE_MISSING = "route missing"
    HOST_VETH_MISSING = "host veth missing"
    HOST_VETH_DOWN = "host veth down"
    NOT_ON_BRIDGE = "not on the bridge"
    NODE_ROUTE_MISSING = "node route missing"
    HOST_GATEWAY_MISSING = "host gateway missing"


@dataclass(frozen=True)
class Finding:
    problem: Problem
    message: str

    def __str__(self) -> str:
        return self.message


@dataclass(frozen=True)
class ExpectedRoute:
    dst: Network
    gateway: Address | None
    text: str  # as the finding names it: "0.0.0.0/0 via 10.244.1.1"


@dataclass(frozen=True)
class Expected:
    ifname: str
    mac: str  # lower case; "" when prevResult gives none
    addresses: tuple[tuple[str, Interface], ...]  # (as prevResult spells it, parsed)
    routes: tuple[ExpectedRoute, ...]
    host_name: str
    bridge: str | None  # bridge mode: the bridge the host end must be a port of
    node_routes: tuple[Interface, ...]  # routed mode: each pod address routed to the host end
    host_addresses: tuple[Interface, ...] = ()  # routed mode with IPv6: the pod's gateway on the host end


def _invalid(what: str, value: object) -> CniError:
    return CniError(ErrorCode.INVALID_CONFIG, f"prevResult {what} {value!r} is not valid")


def pod_interface_index(prev: dict, ifname: str) -> int | None:
    """The index in prevResult's `interfaces` of `ifname` inside a sandbox."""
    interfaces = prev.get("interfaces") or []
    return next((i for i, itf in enumerate(interfaces)
                 if itf.get("name") == ifname and itf.get("sandbox")), None)


def expected_from(prev: dict, *, ifname: str, host_name: str, mode: PodAttachment, bridge: str) -> Expected:
    """What prevResult promises for this attachment; CniError 101 when it names no pod
    interface, 7 when an address or route in it does not parse."""
    index = pod_interface_index(prev, ifname)
    if index is None:
        raise CniError(ErrorCode.CHECK_FAILED, f"prevResult has no interface {ifname} in a sandbox")
    ips = prev.get("ips") or []
    addresses: list[tuple[str, Interface]] = []
    node_routes: list[Interface] = []
    for ip in ips:
        try:
            parsed = ipaddress.ip_interface(ip["address"])
        except (KeyError, ValueError):
            raise _invalid("address", ip.get("address")) from None
        if ip.get("interface", index) == index:
            addresses.append((ip["address"], parsed))
        node_routes.append(parsed)
    routes = []
    for route in prev.get("routes") or []:
        try:
            dst = ipaddress.ip_network(route["dst"], strict=False)
            gateway = ipaddress.ip_address(route["gw"]) if route.get("gw") else None
        except (KeyError, ValueError):
            raise _invalid("route", route) from None
        routes.append(ExpectedRoute(dst=dst, gateway=gateway,
                                    text=f"{dst}" + (f" via {route['gw']}" if gateway else "")))
    return Expected(ifname=ifname, mac=(prev["interfaces"][index].get("mac") or "").lower(),
                    addresses=tuple(addresses), routes=tuple(routes), host_name=host_name,
                    bridge=bridge if mode is PodAttachment.BRIDGE else None,
                    node_routes=tuple(node_routes) if mode is PodAttachment.ROUTED else (),
                    host_addresses=routed_host_addresses(node_routes) if mode is PodAttachment.ROUTED else ())


def find_problems(expected: Expected, pod: PodInterface | None, host: HostVeth | None) -> list[Finding]:
    """Every difference, pod side first; a missing pod interface is the only finding then."""
    ifname = expected.ifname
    if pod is None:
        return [Finding(Problem.POD_INTERFACE_MISSING, f"interface {ifname} is missing in the container")]
    found = []
    if expected.mac and pod.mac.lower() != expected.mac:
        found.append(Finding(Problem.MAC_DIFFERS, f"{ifname} has MAC {pod.mac}, expected {expected.mac}"))
    if not pod.up:
        found.append(Finding(Problem.POD_INTERFACE_DOWN, f"{ifname} is down"))
    for text, address in expected.addresses:
        if address not in pod.addresses:
            found.append(Finding(Problem.ADDRESS_MISSING, f"address {text} is missing on {ifname}"))
    for route in expected.routes:
        if not any(r.dst == route.dst and (route.gateway is None or r.gateway == route.gateway)
                   for r in pod.routes):
            found.append(Finding(Problem.ROUTE_MISSING, f"route {route.text} is missing"))

    name = expected.host_name
    if host is None:
        found.append(Finding(Problem.HOST_VETH_MISSING, f"host interface {name} is missing"))
        return found
    if not host.up:
        found.append(Finding(Problem.HOST_VETH_DOWN, f"host interface {name} is down"))
    if expected.bridge is not None and host.master != expected.bridge:
        found.append(Finding(Problem.NOT_ON_BRIDGE, f"{name} is not attached to bridge {expected.bridge}"))
    for address in expected.node_routes:
        if ipaddress.ip_network(f"{address.ip}/{address.max_prefixlen}") not in host.routes:
            found.append(Finding(Problem.NODE_ROUTE_MISSING, f"node route to {address.ip} via {name} is missing"))
    for address in expected.host_addresses:
        if address not in host.addresses:
            found.append(Finding(Problem.HOST_GATEWAY_MISSING, f"the pods' gateway {address} is missing on {name}"))
    return found

"""The lab's simulated physical network, all inside network namespaces.

    segment 1  198.18.16.0/20 ─┐                        ┌─ internet 203.0.113.0/24
    segment 2  198.18.32.0/20 ─┼─ router (.1 on each) ──┘  (a namespace playing the internet)
    (bridges in one "switch" namespace)

Nodes hang off a segment with `eth0` (the segment's 10+i-th address; /20 leaves room
for the benchmark's thousand simulated peers) and a default route via the router,
so nodes on one segment share L2 (host-gw works) and nodes on different segments meet only
through the router (host-gw cannot, encapsulation must). The router knows no pod CIDRs and
does no NAT, so a pod packet reaches the internet only if its node masquerades it. The
addresses come from the benchmarking (198.18/15) and documentation (203.0.113/24) ranges and
exist only inside these namespaces; the root namespace is never touched.

With IPv6 (`lab up --ip-family ipv6` or `dual`) the same wires also carry IPv6: segment k is
fd00:172:k::/64 (router ::1, node i ::(10+i)), the internet 2001:db8:113::/64 (the router ::1,
the host ::2), the router forwards IPv6 too, and every namespace built here has duplicate
address detection off (`accept_dad` 0 before its links exist, `nodad` on each address), so
addresses work at once instead of after a second of tentativeness. The underlay is dual in
both cases (an IPv6-only cluster still reaches its API server and the IPv4 internet as
before); which families pods and Services get is the cluster's choice, not the wires'.
Without IPv6 nothing of this is built, so an IPv4 lab is exactly what it was.

In bgp mode (`build_tors`) each segment also has a top-of-rack router (`<prefix>-tor<k>`, the
segment's .2) and the ToRs are joined by a point-to-point fabric link (198.18.0.0/30): the nodes
peer with their ToR, which carries pod routes between segments (`bgp_fabric.py`). The router
above stays what it is in every mode (default route, API server, internet), so the other modes
are unchanged and a pod packet between segments takes the ToRs, never the router.
"""
from __future__ import annotations

import ipaddress

from netagent.kernel import namespaces

INTERNET_NETWORK = ipaddress.ip_network("203.0.113.0/24")
INTERNET_HOST = ipaddress.ip_address("203.0.113.2")
ROUTER_INTERNET_ADDRESS = ipaddress.ip_address("203.0.113.1")
UNDERLAY_SUPERNET = ipaddress.ip_network("198.18.0.0/15")
FABRIC_NETWORK = ipaddress.IPv4Network("198.18.0.0/30")  # bgp mode: the ToRs' link (segment k: .k)
INTERNET6_NETWORK = ipaddress.IPv6Network("2001:db8:113::/64")
INTERNET6_HOST = INTERNET6_NETWORK[2]
ROUTER_INTERNET6_ADDRESS = INTERNET6_NETWORK[1]
UNDERLAY6_SUPERNET = ipaddress.IPv6Network("fd00:172::/32")


def segment_network(segment: int) -> ipaddress.IPv4Network:
    return ipaddress.IPv4Network(f"198.18.{16 * segment}.0/20")


def segment_network6(segment: int) -> ipaddress.IPv6Network:
    return ipaddress.IPv6Network(f"fd00:172:{segment:x}::/64")


def router_address6(segment: int) -> ipaddress.IPv6Address:
    return segment_network6(segment)[1]


def node_address6(segment: int, index: int) -> ipaddress.IPv6Address:
    return segment_network6(segment)[10 + index]


def router_address(segment: int) -> ipaddress.IPv4Address:
    return segment_network(segment)[1]


def node_address(segment: int, index: int) -> ipaddress.IPv4Address:
    return segment_network(segment)[10 + index]


def tor_address(segment: int) -> ipaddress.IPv4Address:
    return segment_network(segment)[2]


def fabric_address(segment: int) -> ipaddress.IPv4Address:
    return FABRIC_NETWORK[segment]


def _ip(ns: str, *args: str) -> None:
    namespaces.run_in(ns, ["ip", *args], check=True)


def _sysctl(ns: str, key: str, value: str) -> None:
    namespaces.run_in(ns, ["sysctl", "-qw", f"{key}={value}"], check=True)


def _no_dad(ns: str) -> None:
    """IPv6 addresses usable at once in `ns`: no duplicate address detection on links made from now."""
    for scope in ("all", "default"):
        _sysctl(ns, f"net.ipv6.conf.{scope}.accept_dad", "0")


def _addr6(ns: str, address: ipaddress.IPv6Address, network: ipaddress.IPv6Network, dev: str) -> None:
    _ip(ns, "-6", "addr", "add", f"{address}/{network.prefixlen}", "dev", dev, "nodad")


def _cable(ns_a: str, name_a: str, ns_b: str, name_b: str) -> None:
    """A veth from one namespace to another, both ends up."""
    _ip(ns_a, "link", "add", name_a, "type", "veth", "peer", "name", name_b, "netns", namespaces.netns_path(ns_b))
    _ip(ns_a, "link", "set", name_a, "up")
    _ip(ns_b, "link", "set", name_b, "up")


def build_backbone(*, switch: str, router: str, internet: str, segments: int, ipv6: bool = False) -> None:
    """The switch with one bridge per segment, the router on every segment, the internet
    (`ipv6`: IPv6 on them all too)."""
    for ns in (switch, router, internet):
        namespaces.create(ns)
        if ipv6:
            _no_dad(ns)
    _sysctl(router, "net.ipv4.ip_forward", "1")
    if ipv6:
        _sysctl(router, "net.ipv6.conf.all.forwarding", "1")
    for segment in range(1, segments + 1):
        bridge = f"seg{segment}"
        _ip(switch, "link", "add", bridge, "type", "bridge")
        _ip(switch, "link", "set", bridge, "up")
        _cable(switch, f"r{segment}", router, f"seg{segment}")
        _ip(switch, "link", "set", f"r{segment}", "master", bridge)
        _ip(router, "addr", "add", f"{router_address(segment)}/{segment_network(segment).prefixlen}",
            "dev", f"seg{segment}")
        if ipv6:
            _addr6(router, router_address6(segment), segment_network6(segment), f"seg{segment}")
    _cable(router, "inet", internet, "eth0")
    _ip(router, "addr", "add", f"{ROUTER_INTERNET_ADDRESS}/24", "dev", "inet")
    _ip(internet, "addr", "add", f"{INTERNET_HOST}/24", "dev", "eth0")
    _ip(internet, "route", "add", str(UNDERLAY_SUPERNET), "via", str(ROUTER_INTERNET_ADDRESS))
    if ipv6:
        _addr6(router, ROUTER_INTERNET6_ADDRESS, INTERNET6_NETWORK, "inet")
        _addr6(internet, INTERNET6_HOST, INTERNET6_NETWORK, "eth0")
        _ip(internet, "-6", "route", "add", str(UNDERLAY6_SUPERNET), "via", str(ROUTER_INTERNET6_ADDRESS))


def plug_node(*, switch: str, node: str, segment: int, index: int, port: str,
              ipv6: bool = False) -> ipaddress.IPv4Address:
    """Create the node namespace and cable it to its segment; return its address (`ipv6`: DAD
    off before its link exists; `plug_node6` then gives it its IPv6 address)."""
    namespaces.create(node)
    if ipv6:
        _no_dad(node)
    _cable(switch, port, node, "eth0")
    _ip(switch, "link", "set", port, "master", f"seg{segment}")
    address = node_address(segment, index)
    _ip(node, "addr", "add", f"{address}/{segment_network(segment).prefixlen}", "dev", "eth0")
    _ip(node, "route", "add", "default", "via", str(router_address(segment)))
    return address


def plug_node6(*, node: str, segment: int, index: int) -> ipaddress.IPv6Address:
    """After `plug_node(..., ipv6=True)`: the node's IPv6 address on its
    segment and its IPv6 default route; return the address."""
    address = node_address6(segment, index)
    _addr6(node, address, segment_network6(segment), "eth0")
    _ip(node, "-6", "route", "add", "default", "via", str(router_address6(segment)))
    return address


def build_tors(*, switch: str, tors: dict[int, str]) -> None:
    """bgp mode: a ToR router namespace per segment (`tors`: segment -> namespace) on its segment's
    bridge, forwarding, and (two segments) the fabric link between them."""
    for segment, ns in tors.items():
        namespaces.create(ns)
        _sysctl(ns, "net.ipv4.ip_forward", "1")
        _cable(switch, f"t{segment}", ns, "eth0")
        _ip(switch, "link", "set", f"t{segment}", "master", f"seg{segment}")
        _ip(ns, "addr", "add", f"{tor_address(segment)}/{segment_network(segment).prefixlen}", "dev", "eth0")
    if len(tors) == 2:
        (one, ns_one), (two, ns_two) = sorted(tors.items())
        _cable(ns_one, "fabric", ns_two, "fabric")
        for segment, ns in ((one, ns_one), (two, ns_two)):
            _ip(ns, "addr", "add", f"{fabric_address(segment)}/{FABRIC_NETWORK.prefixlen}", "dev", "fabric")

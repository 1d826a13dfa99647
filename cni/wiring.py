"""Pod wiring, as plain values: the names, MACs and routes of an attachment (no kernel calls).

Shape of an attachment:
- A veth pair created in one netlink request, its pod end born inside the pod's namespace
  already named `CNI_IFNAME`, both MACs chosen by us (so no read-back is needed).
- The host end's name is derived from (network, container ID, ifname): `na` + 12 hex
  digits. DEL therefore needs neither the netns nor any saved state, and GC can tell which
  host veths belong to still-valid attachments. The alias `netagent:<network>` scopes GC to
  one network.
- bridge mode: the host end joins a Linux bridge holding the gateway address (as the
  reference `bridge` plugin with `isGateway`); the pod's default route goes via it.
- routed mode (as Calico): no bridge; the pod address is a /32 (/128); the host end has
  the fixed MAC ee:ee:ee:ee:ee:ee and proxy ARP; the pod routes via the link-local
  gateway 169.254.1.1 (fe80::ecee:eeff:feee:eeee), pinned by a permanent neighbour entry
  so the first packet needs no ARP round trip; the node routes the pod address to the veth.
- IPv6, both modes: every IPv6 address is added without DAD (`IFA_F_NODAD`), and the pod's
  interface gets `accept_dad=0` (its link-local too is valid at once), `accept_ra=0` (no
  other pod's Router Advertisement can give it a route or an address) and
  `disable_ipv6=0` (a runtime may disable IPv6 in new namespaces), all while it is down;
  host veths and the bridge get `accept_ra=0`. Routed mode answers the pod's neighbour
  solicitations for its gateway by the host end HOLDING the gateway (not by NDP proxying):
  `addr_gen_mode=1` (none) leaves it no link-local of its own, and fe80::ecee:eeff:feee:eeee/64
  is added without DAD, so it answers from the first packet, whatever the node's
  `addr_gen_mode` default. Linux's proxy NDP needs an entry per address, and answers a
  multicast solicitation only after a random delay of up to `proxy_delay` (0.8 s).
  What the plugin relies on beyond its own interfaces: `net.ipv6.conf.all.forwarding=1`,
  which it ensures as it does `net.ipv4.ip_forward` (the node agent sets both too).

This module only describes: `plan_pod` and `plan_node_routes` turn IPAM's answer into the
`cni.kernel` values a `CniKernel` applies, and the linear ADD with rollback lives in
`cni.handlers`. Keeping the plan pure is what lets the fake kernel and the real one be
handed exactly the same thing.
"""
from __future__ import annotations

import hashlib
import ipaddress
import os
from collections.abc import Iterable, Mapping

from cni.kernel import (
    Address,
    Interface,
    LinkSetting,
    Neighbour,
    NodeRoutes,
    OwnedLink,
    PodSetup,
    Route,
)
from netagent.kernel import owned
from netagent.kernel.families import IpFamily
from netagent.kernel.pod_attachment import PodAttachment

HOST_VETH_PREFIX = owned.HOST_VETH_PREFIX
ALIAS_PREFIX = owned.VETH_ALIAS_PREFIX
BRIDGE_ALIAS = owned.BRIDGE_ALIAS
ROUTED_HOST_MAC = "ee:ee:ee:ee:ee:ee"
ROUTED_GATEWAY_V4 = ipaddress.ip_address("169.254.1.1")
ROUTED_GATEWAY_V6 = ipaddress.ip_address("fe80::ecee:eeff:feee:eeee")
ROUTED_GATEWAY_V6_ON_HOST = ipaddress.ip_interface(f"{ROUTED_GATEWAY_V6}/64")  # the host end's link-local
DEFAULT_DST = {IpFamily.V4: ipaddress.ip_network("0.0.0.0/0"), IpFamily.V6: ipaddress.ip_network("::/0")}


def host_veth_name(network: str, container_id: str, ifname: str) -> str:
    digest = hashlib.sha256(f"{network}\0{container_id}\0{ifname}".encode()).hexdigest()
    return HOST_VETH_PREFIX + digest[:12]


def network_alias(network: str) -> str:
    return ALIAS_PREFIX + network


def random_mac() -> str:
    raw = bytearray(os.urandom(6))
    raw[0] = (raw[0] & 0xFE) | 0x02  # unicast, locally administered
    return ":".join(f"{b:02x}" for b in raw)


def host_mac_for(mode: PodAttachment) -> str:
    return ROUTED_HOST_MAC if mode is PodAttachment.ROUTED else random_mac()


def network_veths(links: Iterable[OwnedLink], network: str) -> list[str]:
    """Names of the host veths that carry this network's alias (GC's candidates)."""
    alias = network_alias(network)
    return [link.name for link in links
            if link.name.startswith(HOST_VETH_PREFIX) and link.alias == alias and link.kind == "veth"]


# ---------------------------------------------------------------- per-interface settings

_NO_RAS = LinkSetting(IpFamily.V6, "accept_ra", "0")
_IPV6_ON = LinkSetting(IpFamily.V6, "disable_ipv6", "0")
POD_IPV6_SETTINGS = (LinkSetting(IpFamily.V6, "accept_dad", "0"), _NO_RAS, _IPV6_ON)


def families_of(addresses: Iterable[Interface]) -> frozenset[IpFamily]:
    return frozenset(IpFamily.of(a.ip) for a in addresses)


def pod_settings(families: frozenset[IpFamily]) -> tuple[LinkSetting, ...]:
    """The pod interface's sysctls, written while it is down: none for IPv4 alone."""
    return POD_IPV6_SETTINGS if IpFamily.V6 in families else ()


def host_veth_settings(mode: PodAttachment, families: frozenset[IpFamily]) -> tuple[LinkSetting, ...]:
    """The host end's sysctls, written before the pod end comes up (so before the host end
    has a carrier, and with it an automatic link-local address)."""
    settings: list[LinkSetting] = []
    routed = mode is PodAttachment.ROUTED
    if routed and IpFamily.V4 in families:
        settings.append(LinkSetting(IpFamily.V4, "proxy_arp", "1"))
    if IpFamily.V6 in families:
        if routed:  # the gateway address alone, added by `plan_node_routes`
            settings += [LinkSetting(IpFamily.V6, "addr_gen_mode", "1"), _IPV6_ON]
        settings.append(_NO_RAS)
    return tuple(settings)


def bridge_settings(gateways: Iterable[Interface]) -> tuple[LinkSetting, ...]:
    """The bridge's sysctls, before its IPv6 gateway is added: IPv6 on, RAs ignored."""
    return (_IPV6_ON, _NO_RAS) if IpFamily.V6 in families_of(gateways) else ()


# ---------------------------------------------------------------- the pod side

def pod_gateway(mode: PodAttachment, family: IpFamily, ipam_gateway: Address | None) -> Address | None:
    if mode is PodAttachment.ROUTED:
        return ROUTED_GATEWAY_V4 if family is IpFamily.V4 else ROUTED_GATEWAY_V6
    return ipam_gateway


def pod_address(mode: PodAttachment, interface: Interface) -> Interface:
    """The address as the pod gets it: IPAM's prefix in bridge mode, a host prefix when routed."""
    if mode is PodAttachment.ROUTED:
        return ipaddress.ip_interface((interface.ip, interface.max_prefixlen))
    return interface


def bridge_gateways(addresses: Iterable[Interface], gateways: Mapping[IpFamily, Address]) -> tuple[Interface, ...]:
    """The bridge's addresses: each family's IPAM gateway with its subnet's prefix length."""
    return tuple(ipaddress.ip_interface(f"{gateways[family]}/{a.network.prefixlen}")
                 for a in addresses if (family := IpFamily.of(a.ip)) in gateways)


def plan_pod(*, ifname: str, mode: PodAttachment, addresses: list[Interface], gateways: Mapping[IpFamily, Address],
             routes: list[dict], host_mac: str) -> tuple[PodSetup, list[dict]]:
    """The pod side of an ADD, and the routes it reports in the CNI result.

    `addresses` are ip_interface values as IPAM returned them; `gateways` maps family to the
    IPAM gateway; `routes` are the IPAM config's extra routes. In routed mode each family
    first gets a link route to the link-local gateway (and its MAC pinned to the host end),
    so the default route through it is reachable; those two stay out of the result.
    """
    kernel_routes: list[Route] = []
    neighbours: list[Neighbour] = []
    result_routes: list[dict] = []
    for family in sorted(families_of(addresses), key=lambda f: f.value):
        gateway = pod_gateway(mode, family, gateways.get(family))
        if gateway is None:
            continue
        if mode is PodAttachment.ROUTED:
            kernel_routes.append(Route(dst=ipaddress.ip_network((gateway, gateway.max_prefixlen))))
            neighbours.append(Neighbour(address=gateway, mac=host_mac))
        kernel_routes.append(Route(dst=DEFAULT_DST[family], gateway=gateway))
        result_routes.append({"dst": str(DEFAULT_DST[family]), "gw": str(gateway)})
    for route in routes:
        dst = ipaddress.ip_network(route["dst"], strict=False)
        family = IpFamily.of(dst)
        if dst == DEFAULT_DST[family]:
            continue  # already added above
        gw = ipaddress.ip_address(route["gw"]) if route.get("gw") else \
            pod_gateway(mode, family, gateways.get(family))
        kernel_routes.append(Route(dst=dst, gateway=gw))
        result_routes.append({"dst": str(dst), **({"gw": str(gw)} if gw else {})})
    setup = PodSetup(ifname=ifname, addresses=tuple(pod_address(mode, a) for a in addresses),
                     routes=tuple(kernel_routes), neighbours=tuple(neighbours),
                     settings=pod_settings(families_of(addresses)))
    return setup, result_routes


# ---------------------------------------------------------------- the node side

def routed_host_addresses(addresses: Iterable[Interface]) -> tuple[Interface, ...]:
    """What a routed host end holds itself: the pods' IPv6 gateway when the pod has IPv6."""
    return (ROUTED_GATEWAY_V6_ON_HOST,) if IpFamily.V6 in families_of(addresses) else ()


def plan_node_routes(*, host_name: str, addresses: Iterable[Interface], pod_mac: str) -> NodeRoutes:
    """Routed mode: each pod address routed to the host end, and pinned to the pod's MAC there
    (as the gateway is pinned inside the pod: no ARP or neighbour discovery either way); with
    IPv6 the host end holds the pod's gateway, so a pod whose entry went still finds it."""
    addresses = list(addresses)
    return NodeRoutes(
        host_name=host_name,
        addresses=routed_host_addresses(addresses),
        routes=tuple(Route(dst=ipaddress.ip_network((a.ip, a.max_prefixlen))) for a in addresses),
        neighbours=tuple(Neighbour(address=a.ip, mac=pod_mac) for a in addresses))

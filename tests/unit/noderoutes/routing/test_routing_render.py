"""Routing render goldens: every mode's plan for one set of peers, printed the way `ip` shows it.

The VTEP MACs are spelled out on purpose: they are derived from node names and must never
change between releases (peers hold them in their FDBs), so a change here is a bug.
Besides the goldens: conflict resolution, pending and refused peers, IPv6, settings
validation, the object diff and the device drift check.
"""
import dataclasses
import random
from ipaddress import IPv4Address, IPv4Interface, IPv4Network, ip_network

import pytest

from netagent.noderoutes.routing.model import (
    FdbEntry,
    IpipDevice,
    LocalNode,
    Mode,
    Neighbour,
    ObservedDevice,
    Peer,
    PeerBounds,
    PeerPlan,
    RefusalReason,
    Refused,
    Route,
    RoutingSettings,
    VxlanDevice,
)
from netagent.noderoutes.routing.plan import describe_plan, device_drift, diff_objects, render_devices, render_plan
from netagent.noderoutes.routing.vxlan import normalize_mac, vtep_mac

LOCAL = LocalNode(name="node-a", vtep_mac=vtep_mac("node-a"), public_ip=IPv4Address("192.0.2.1"), underlay_ifname="eth0",
                  underlay_network=IPv4Network("192.0.2.0/24"), underlay_mtu=1500,
                  pod_cidrs=(IPv4Network("10.244.1.0/24"),))
BOUNDS = PeerBounds(cluster_cidrs=(IPv4Network("10.0.0.0/8"),))


def peer(name, ip, *cidrs, mac="derive"):
    return Peer(name=name, public_ip=IPv4Address(ip), pod_cidrs=tuple(ip_network(c) for c in cidrs),
                vtep_mac=vtep_mac(name) if mac == "derive" else mac)


PEERS = [
    peer("node-b", "192.0.2.2", "10.244.2.0/24"),                                       # same subnet
    peer("node-c", "198.51.100.3", "10.244.3.0/24"),                                   # across a router
    peer("node-d", "198.51.100.4", "10.244.4.0/24", mac=None),                         # no VTEP MAC yet
    peer("node-e", "192.0.2.5", "10.244.5.0/24", "10.245.5.0/24", "2001:db8:5::/64"),  # several CIDRs
]

GOLDEN = {
    Mode.VXLAN: """\
link na-vxlan type vxlan id 1 dstport 4789 local 192.0.2.1 dev eth0 nolearning address 56:57:5a:8a:3a:9a mtu 1450 up, addr 10.244.1.0/32, tx-checksum-ip-generic off
peer node-b vxlan
  neigh 10.244.2.0 lladdr a2:26:7e:92:d0:c1 dev na-vxlan permanent
  fdb a2:26:7e:92:d0:c1 dst 192.0.2.2 dev na-vxlan self permanent
  route 10.244.2.0/24 via 10.244.2.0 dev na-vxlan onlink
peer node-c vxlan
  neigh 10.244.3.0 lladdr 1a:56:a2:64:69:96 dev na-vxlan permanent
  fdb 1a:56:a2:64:69:96 dst 198.51.100.3 dev na-vxlan self permanent
  route 10.244.3.0/24 via 10.244.3.0 dev na-vxlan onlink
peer node-e vxlan
  neigh 10.244.5.0 lladdr 46:10:5d:92:16:e6 dev na-vxlan permanent
  neigh 10.245.5.0 lladdr 46:10:5d:92:16:e6 dev na-vxlan permanent
  fdb 46:10:5d:92:16:e6 dst 192.0.2.5 dev na-vxlan self permanent
  route 10.244.5.0/24 via 10.244.5.0 dev na-vxlan onlink
  route 10.245.5.0/24 via 10.245.5.0 dev na-vxlan onlink
pending node-d: no VTEP MAC announced yet (vxlan)
ignored IPv6 node-e 2001:db8:5::/64""",
    Mode.HOST_GW: """\
peer node-b host-gw
  route 10.244.2.0/24 via 192.0.2.2 dev eth0
peer node-e host-gw
  route 10.244.5.0/24 via 192.0.2.5 dev eth0
  route 10.245.5.0/24 via 192.0.2.5 dev eth0
refused node-c: public IP 198.51.100.3 is not on this node's underlay subnet 192.0.2.0/24 (eth0); host-gw needs all nodes on one L2 segment (use vxlan, ipip or auto across subnets)
refused node-d: public IP 198.51.100.4 is not on this node's underlay subnet 192.0.2.0/24 (eth0); host-gw needs all nodes on one L2 segment (use vxlan, ipip or auto across subnets)
ignored IPv6 node-e 2001:db8:5::/64""",
    Mode.IPIP: """\
link na-ipip type ipip local 192.0.2.1 mtu 1480 up, addr 10.244.1.0/32
peer node-b ipip
  route 10.244.2.0/24 via 192.0.2.2 dev na-ipip onlink
peer node-c ipip
  route 10.244.3.0/24 via 198.51.100.3 dev na-ipip onlink
peer node-d ipip
  route 10.244.4.0/24 via 198.51.100.4 dev na-ipip onlink
peer node-e ipip
  route 10.244.5.0/24 via 192.0.2.5 dev na-ipip onlink
  route 10.245.5.0/24 via 192.0.2.5 dev na-ipip onlink
ignored IPv6 node-e 2001:db8:5::/64""",
}

GOLDEN_AUTO = {
    Mode.VXLAN: """\
link na-vxlan type vxlan id 1 dstport 4789 local 192.0.2.1 dev eth0 nolearning address 56:57:5a:8a:3a:9a mtu 1450 up, addr 10.244.1.0/32, tx-checksum-ip-generic off
peer node-b host-gw
  route 10.244.2.0/24 via 192.0.2.2 dev eth0
peer node-c vxlan
  neigh 10.244.3.0 lladdr 1a:56:a2:64:69:96 dev na-vxlan permanent
  fdb 1a:56:a2:64:69:96 dst 198.51.100.3 dev na-vxlan self permanent
  route 10.244.3.0/24 via 10.244.3.0 dev na-vxlan onlink
peer node-e host-gw
  route 10.244.5.0/24 via 192.0.2.5 dev eth0
  route 10.245.5.0/24 via 192.0.2.5 dev eth0
pending node-d: no VTEP MAC announced yet (vxlan)
ignored IPv6 node-e 2001:db8:5::/64""",
    Mode.IPIP: """\
link na-ipip type ipip local 192.0.2.1 mtu 1480 up, addr 10.244.1.0/32
peer node-b host-gw
  route 10.244.2.0/24 via 192.0.2.2 dev eth0
peer node-c ipip
  route 10.244.3.0/24 via 198.51.100.3 dev na-ipip onlink
peer node-d ipip
  route 10.244.4.0/24 via 198.51.100.4 dev na-ipip onlink
peer node-e host-gw
  route 10.244.5.0/24 via 192.0.2.5 dev eth0
  route 10.245.5.0/24 via 192.0.2.5 dev eth0
ignored IPv6 node-e 2001:db8:5::/64""",
}


@pytest.mark.parametrize("mode", [Mode.VXLAN, Mode.HOST_GW, Mode.IPIP], ids=lambda m: m.value)
def test_golden_per_mode(mode):
    assert describe_plan(render_plan(LOCAL, PEERS, RoutingSettings(mode=mode), bounds=BOUNDS)) == GOLDEN[mode]


@pytest.mark.parametrize("encap", [Mode.VXLAN, Mode.IPIP], ids=lambda m: m.value)
def test_golden_auto_mixes_host_gw_and_encapsulation(encap):
    plan = render_plan(LOCAL, PEERS, RoutingSettings(mode=Mode.AUTO, auto_encap=encap), bounds=BOUNDS)
    assert describe_plan(plan) == GOLDEN_AUTO[encap]


def test_render_is_deterministic_whatever_the_input_order():
    settings = RoutingSettings(mode=Mode.AUTO)
    expected = render_plan(LOCAL, PEERS, settings, bounds=BOUNDS)
    shuffled = list(PEERS)
    random.Random(7).shuffle(shuffled)
    assert render_plan(LOCAL, shuffled, settings, bounds=BOUNDS) == expected
    assert describe_plan(render_plan(LOCAL, reversed(PEERS), settings, bounds=BOUNDS)) == describe_plan(expected)


def test_vxlan_device_settings_are_honoured():
    settings = RoutingSettings(mode=Mode.VXLAN, vxlan_vni=42, vxlan_port=8472, vxlan_ifname="na-vx42")
    local = LocalNode(name="node-a", vtep_mac=vtep_mac("node-a"), public_ip=IPv4Address("192.0.2.1"), underlay_ifname="ens3",
                      underlay_network=IPv4Network("192.0.2.0/24"), underlay_mtu=9000,
                      pod_cidrs=(ip_network("fd00:1::/64"), IPv4Network("10.244.7.0/24")))
    (device,) = render_devices(local, settings)
    assert device == VxlanDevice(ifname="na-vx42", vni=42, port=8472, local=IPv4Address("192.0.2.1"),
                                 underlay_ifname="ens3", mac="56:57:5a:8a:3a:9a", mtu=8950,
                                 address=IPv4Interface("10.244.7.0/32"))
    plan = render_plan(local, [PEERS[0]], settings, bounds=BOUNDS)
    assert plan.peers["node-b"].routes[0].ifname == "na-vx42"
    assert plan.ignored_ipv6 == ("node-a fd00:1::/64",)


def test_encapsulation_needs_an_ipv4_pod_cidr_but_host_gw_does_not():
    v6_only = LocalNode(name="node-a", vtep_mac=vtep_mac("node-a"), public_ip=IPv4Address("192.0.2.1"), underlay_ifname="eth0",
                        underlay_network=IPv4Network("192.0.2.0/24"), underlay_mtu=1500,
                        pod_cidrs=(ip_network("fd00:1::/64"),))
    for mode in (Mode.VXLAN, Mode.IPIP, Mode.AUTO):
        with pytest.raises(ValueError, match="no IPv4 pod CIDR"):
            render_devices(v6_only, RoutingSettings(mode=mode))
    assert render_devices(v6_only, RoutingSettings(mode=Mode.HOST_GW)) == ()


def test_vtep_mac_is_stable_unicast_locally_administered_and_per_node():
    macs = {vtep_mac(f"node-{i}") for i in range(500)}
    assert len(macs) == 500
    for mac in macs:
        first = int(mac[:2], 16)
        assert first & 0x01 == 0 and first & 0x02 == 0x02
        assert normalize_mac(mac) == mac
    assert vtep_mac("node-a") == "56:57:5a:8a:3a:9a"


def test_announced_macs_are_normalised_or_refused():
    assert normalize_mac("A2-26-7E-92-D0-C1") == "a2:26:7e:92:d0:c1"
    for bad in ("01:00:5e:00:00:01", "00:00:00:00:00:00", "a2:26:7e:92:d0", "zz:26:7e:92:d0:c1"):
        assert normalize_mac(bad) is None
    upper = Peer(name="node-b", public_ip=IPv4Address("192.0.2.2"), pod_cidrs=(IPv4Network("10.244.2.0/24"),),
                 vtep_mac="A2:26:7E:92:D0:C1")
    broken = Peer(name="node-c", public_ip=IPv4Address("192.0.2.3"), pod_cidrs=(IPv4Network("10.244.3.0/24"),),
                  vtep_mac="not-a-mac")
    plan = render_plan(LOCAL, [upper, broken], RoutingSettings(mode=Mode.VXLAN), bounds=BOUNDS)
    assert plan.peers["node-b"].fdb == (FdbEntry(mac="a2:26:7e:92:d0:c1", dst=IPv4Address("192.0.2.2"),
                                                 ifname="na-vxlan"),)
    assert plan.refused == {"node-c": Refused("announced VTEP MAC 'not-a-mac' is not a unicast MAC address",
                                              RefusalReason.MALFORMED)}


def test_conflicts_between_equally_old_nodes_refuse_the_later_name():
    peers = [
        peer("node-z", "192.0.2.26", "10.244.9.0/24"),
        peer("node-y", "192.0.2.25", "10.244.0.0/16"),     # covers the local CIDR
        peer("node-m", "192.0.2.13", "10.244.9.128/25"),   # inside node-z's, and sorts first
        peer("node-n", "192.0.2.14", "10.250.0.0/24", mac=vtep_mac("node-m")),  # node-m's MAC
        peer("node-o", "192.0.2.1", "10.250.1.0/24"),      # our own public IP
        peer("node-a", "192.0.2.99", "10.250.2.0/24"),     # ourselves: skipped
        peer("node-p", "192.0.2.16", mac=None),            # no pod CIDR yet
        peer("node-q", "192.0.2.17", "2001:db8:17::/64"),  # IPv6 only: ignored, not pending
    ]
    plan = render_plan(LOCAL, peers, RoutingSettings(mode=Mode.VXLAN), bounds=BOUNDS)
    assert sorted(plan.peers) == ["node-m"]
    assert {name: r.label for name, r in plan.refused.items()} == {
        "node-n": RefusalReason.CONFLICT, "node-o": RefusalReason.CONFLICT, "node-y": RefusalReason.OVERLAP,
        "node-z": RefusalReason.OVERLAP}
    assert {name: r.reason for name, r in plan.refused.items()} == {
        "node-n": "VTEP MAC 7a:3a:96:51:d0:96 is already used by node-m",
        "node-o": "announces public IP 192.0.2.1, which is this node's own",
        "node-y": "pod CIDR 10.244.0.0/16 overlaps one held by this node (node-a)",
        "node-z": "pod CIDR 10.244.9.0/24 overlaps one held by node-m",
    }
    assert plan.pending == {"node-p": "no pod CIDR yet"}
    assert plan.ignored_ipv6 == ("node-q 2001:db8:17::/64",)


def test_a_peer_claiming_our_vtep_mac_is_refused():
    thief = peer("node-b", "192.0.2.2", "10.244.2.0/24", mac=vtep_mac("node-a"))
    plan = render_plan(LOCAL, [thief], RoutingSettings(mode=Mode.VXLAN), bounds=BOUNDS)
    assert plan.refused == {"node-b": Refused(f"VTEP MAC {vtep_mac('node-a')} is already used by this node "
                                              f"(node-a)", RefusalReason.CONFLICT)}


def test_many_peers_without_overlap_all_render():
    peers = [peer(f"n{i:04}", str(IPv4Address("100.64.0.1") + i), f"10.{100 + i // 256}.{i % 256}.0/24")
             for i in range(1000)]
    plan = render_plan(LOCAL, peers, RoutingSettings(mode=Mode.VXLAN), bounds=BOUNDS)
    assert len(plan.peers) == 1000 and not plan.refused


def test_settings_are_validated():
    with pytest.raises(ValueError, match="auto_encap"):
        RoutingSettings(mode=Mode.AUTO, auto_encap=Mode.HOST_GW)
    with pytest.raises(ValueError, match="must start with 'na-'"):
        RoutingSettings(mode=Mode.VXLAN, vxlan_ifname="flannel.1")
    with pytest.raises(ValueError, match="vxlan_vni"):
        RoutingSettings(mode=Mode.VXLAN, vxlan_vni=0)
    assert RoutingSettings(mode=Mode.AUTO, auto_encap=Mode.IPIP).encap is Mode.IPIP
    assert RoutingSettings(mode=Mode.HOST_GW).encap is None


# ---------------------------------------------------------------- diff and drift

def _route(dst, gw, dev="na-vxlan"):
    return Route(dst=IPv4Network(dst), gateway=IPv4Address(gw), ifname=dev, onlink=dev != "eth0")


def test_diff_orders_writes_per_peer_and_deletes_by_dependency():
    mac = "a2:26:7e:92:d0:c1"
    neigh = Neighbour(address=IPv4Address("10.244.2.0"), mac=mac, ifname="na-vxlan")
    fdb = FdbEntry(mac=mac, dst=IPv4Address("192.0.2.2"), ifname="na-vxlan")
    route = _route("10.244.2.0/24", "10.244.2.0")
    kept = _route("10.244.3.0/24", "192.0.2.3", "eth0")
    desired = [PeerPlan(name="node-b", mode=Mode.VXLAN, neighbours=(neigh,), fdb=(fdb,), routes=(route,)),
               PeerPlan(name="node-c", mode=Mode.HOST_GW, routes=(kept,))]
    stale_neigh = Neighbour(address=IPv4Address("10.244.9.0"), mac="aa:bb:cc:00:00:09", ifname="na-vxlan")
    stale_fdb = FdbEntry(mac="aa:bb:cc:00:00:09", dst=IPv4Address("192.0.2.9"), ifname="na-vxlan")
    stale_route = _route("10.244.9.0/24", "10.244.9.0")
    wrong_route = _route("10.244.2.0/24", "192.0.2.2", "eth0")  # same destination, other mode
    changes = diff_objects(desired, [stale_neigh, kept, stale_fdb, wrong_route, stale_route])
    assert changes.writes == (("node-b", neigh), ("node-b", fdb), ("node-b", route))
    assert changes.deletes == (stale_route, stale_fdb, stale_neigh)
    assert changes.unchanged == 1


VXLAN = VxlanDevice(ifname="na-vxlan", vni=1, port=4789, local=IPv4Address("192.0.2.1"), underlay_ifname="eth0",
                    mac="56:57:5a:8a:3a:9a", mtu=1450, address=IPv4Interface("10.244.1.0/32"))
GOOD = ObservedDevice(ifname="na-vxlan", kind="vxlan", mtu=1450, up=True, mac="56:57:5a:8a:3a:9a",
                      addresses=frozenset({IPv4Interface("10.244.1.0/32")}), vni=1, port=4789,
                      local=IPv4Address("192.0.2.1"), underlay_ifname="eth0", learning=False, tx_checksum=False)


def test_device_drift_repairs_in_place_what_it_can():
    assert not device_drift(VXLAN, GOOD)
    stray = IPv4Interface("10.9.9.9/24")
    drifted = dataclasses.replace(GOOD, mtu=1400, mac="02:00:00:00:00:01", up=False, addresses=frozenset({stray}),
                                  tx_checksum=True)
    drift = device_drift(VXLAN, drifted)
    assert (drift.recreate, drift.mtu, drift.mac, drift.bring_up) == ("", 1450, "56:57:5a:8a:3a:9a", True)
    assert drift.add_addresses == (VXLAN.address,) and drift.remove_addresses == (stray,)
    assert drift.tx_checksum is False


@pytest.mark.parametrize("change, reason", [
    ({"vni": 2}, "VNI is 2, want 1"),
    ({"port": 8472}, "port is 8472, want 4789"),
    ({"underlay_ifname": "eth1"}, "underlay is eth1, want eth0"),
    ({"learning": True}, "learning is True, want False"),
    ({"local": IPv4Address("192.0.2.7")}, "local is 192.0.2.7, want 192.0.2.1"),
    ({"kind": "bridge"}, "it is a bridge device, not vxlan"),
])
def test_device_drift_recreates_what_cannot_change(change, reason):
    assert device_drift(VXLAN, dataclasses.replace(GOOD, **change)).recreate == reason


def test_ipip_drift():
    ipip = IpipDevice(ifname="na-ipip", local=IPv4Address("192.0.2.1"), mtu=1480,
                      address=IPv4Interface("10.244.1.0/32"))
    good = ObservedDevice(ifname="na-ipip", kind="ipip", mtu=1480, up=True, local=IPv4Address("192.0.2.1"),
                          remote=IPv4Address("0.0.0.0"), addresses=frozenset({ipip.address}))
    assert not device_drift(ipip, good)
    assert device_drift(ipip, None).recreate == "it does not exist"
    assert device_drift(ipip, dataclasses.replace(good, remote=IPv4Address("192.0.2.9"))).recreate \
        == "remote is 192.0.2.9, want 0.0.0.0"
    assert device_drift(ipip, dataclasses.replace(good, mtu=1500)).mtu == 1480

"""The node's own identity: underlay choice, lease checks, announcement and peers from Nodes."""
import ipaddress
import json

import pytest

from netagent.noderoutes import node_objects as nodes
from netagent.noderoutes.agent import auto_checksum_offload, node_changes, routing_inputs_differ
from netagent.noderoutes.routing.model import ChecksumOffload, Mode, Peer, pod_mtu
from netagent.noderoutes.underlay import InterfaceInfo, UnderlayError, UnderlaySnapshot, choose_underlay


def iface(name, index, *addresses, mtu=1500):
    return InterfaceInfo(name=name, index=index, mtu=mtu,
                         addresses=tuple(ipaddress.IPv4Interface(a) for a in addresses))


SNAPSHOT = UnderlaySnapshot(
    interfaces=(iface("lo", 1, "127.0.0.1/8"), iface("eth0", 2, "192.0.2.10/24", mtu=9000),
                iface("eth1", 3, "198.51.100.7/25"), iface("eth2", 4), iface("ens5", 5, "203.0.113.9/24")),
    default_route_ifindexes=(3, 2))


def test_default_route_interface_is_the_default_choice():
    chosen = choose_underlay(SNAPSHOT)
    assert (chosen.ifname, str(chosen.public_ip), str(chosen.network), chosen.mtu) == \
        ("eth1", "198.51.100.7", "198.51.100.0/25", 1500)
    assert "default route" in chosen.reason


def test_iface_by_name():
    chosen = choose_underlay(SNAPSHOT, iface="eth0")
    assert (chosen.ifname, str(chosen.public_ip), chosen.mtu) == ("eth0", "192.0.2.10", 9000)


@pytest.mark.parametrize("kwargs, message", [
    ({"iface": "eth9"}, "no such interface"),
    ({"iface": "eth2"}, "has no IPv4 address"),
    ({"iface_regex": "eth[01]"}, "matches 2 interfaces"),
    ({"iface_regex": "wlan.*"}, "matches no interface"),
    ({"iface_regex": "eth[("}, "--iface-regex"),
    ({"iface": "eth0", "iface_regex": "eth0"}, "not both"),
    ({"public_ip_override": "not-an-ip"}, "public-ip-overwrite"),
])
def test_ambiguous_or_wrong_choices_fail_with_the_reason(kwargs, message):
    with pytest.raises(UnderlayError, match=message):
        choose_underlay(SNAPSHOT, **kwargs)


def test_regex_matching_exactly_one_interface_with_an_address():
    assert choose_underlay(SNAPSHOT, iface_regex="ens[0-9]+").ifname == "ens5"
    assert choose_underlay(SNAPSHOT, iface_regex="eth[02]").ifname == "eth0"  # eth2 has no address


def test_no_default_route_means_no_guess():
    with pytest.raises(UnderlayError, match="no IPv4 default route"):
        choose_underlay(UnderlaySnapshot(interfaces=SNAPSHOT.interfaces, default_route_ifindexes=()))


def test_public_ip_override_local_and_behind_nat():
    local = choose_underlay(SNAPSHOT, public_ip_override="192.0.2.10")
    assert (local.ifname, str(local.network)) == ("eth0", "192.0.2.0/24")
    nat = choose_underlay(SNAPSHOT, public_ip_override="100.64.0.5")
    assert (nat.ifname, str(nat.public_ip), str(nat.network)) == ("eth1", "100.64.0.5", "100.64.0.5/32")
    assert nat.behind_nat and not local.behind_nat


CLUSTER = [ipaddress.ip_network("10.244.0.0/16")]


def node(name="node-1", *, cidrs=("10.244.1.0/24",), annotations=None):
    return {"metadata": {"name": name, "annotations": annotations or {}},
            "spec": {"podCIDR": cidrs[0], "podCIDRs": list(cidrs)} if cidrs else {}}


def test_lease_inside_the_cluster_cidr():
    assert nodes.node_pod_cidrs(node(), cluster_cidrs=CLUSTER) == (ipaddress.ip_network("10.244.1.0/24"),)


@pytest.mark.parametrize("cidrs, message", [
    ((), "has no spec.podCIDR"),
    (("10.99.1.0/24",), "outside the cluster CIDR"),
    (("10.244.1.1/24",), "host bits"),
    (("banana",), "does not appear"),
])
def test_bad_leases_name_the_problem(cidrs, message):
    with pytest.raises(nodes.LeaseError, match=message):
        nodes.node_pod_cidrs(node(cidrs=cidrs), cluster_cidrs=CLUSTER)


def test_announcement_round_trips_into_a_peer():
    notes = nodes.render_announcement(backend_type="vxlan", public_ip="192.0.2.11",
                                      backend_data={"vtepMAC": "0e:00:00:00:00:01"})
    assert json.loads(notes[nodes.BACKEND_DATA]) == {"vtepMAC": "0e:00:00:00:00:01"}
    peer = nodes.read_peer(node("node-2", cidrs=("10.244.2.0/24",), annotations=notes))
    assert isinstance(peer, Peer)
    assert (peer.name, str(peer.public_ip), peer.pod_cidrs, peer.vtep_mac) == \
        ("node-2", "192.0.2.11", (ipaddress.ip_network("10.244.2.0/24"),), "0e:00:00:00:00:01")


@pytest.mark.parametrize("annotations, cidrs, why", [
    ({}, ("10.244.2.0/24",), "not announced"),
    ({nodes.PUBLIC_IP: "192.0.2.11"}, (), "no pod CIDR"),
])
def test_nodes_that_are_not_peers_yet(annotations, cidrs, why):
    found = nodes.read_peer(node("node-2", cidrs=cidrs, annotations=annotations))
    assert isinstance(found, nodes.NotYet) and why in found.detail


def test_tracker_ignores_heartbeats_but_records_routing_changes():
    pokes = []
    tracker = node_changes(on_change=lambda: pokes.append(1))
    old = node("node-2", annotations={nodes.PUBLIC_IP: "192.0.2.11"})
    heartbeat = dict(old, status={"conditions": [{"type": "Ready"}]})
    tracker.on_update(old, heartbeat)
    assert tracker.drain().keys() == set() and pokes == []
    moved = node("node-2", annotations={nodes.PUBLIC_IP: "192.0.2.12"})
    tracker.on_update(old, moved)
    tracker.on_delete(node("node-3"))
    assert tracker.drain().keys() == {"node-2", "node-3"} and len(pokes) == 2
    assert tracker.drain().keys() == set()


@pytest.mark.parametrize("change, differs", [
    (lambda n: n.update(status={"conditions": [{"type": "Ready"}]}), False),        # a heartbeat
    (lambda n: n["metadata"].update(resourceVersion="99", managedFields=[{}]), False),
    (lambda n: n["metadata"].update(labels={"zone": "b"}), False),
    (lambda n: n["spec"].update(podCIDR="10.244.9.0/24"), True),
    (lambda n: n["spec"].update(unschedulable=True), True),                          # raw spec: any change
    (lambda n: n["metadata"]["annotations"].update({nodes.PUBLIC_IP: "192.0.2.99"}), True),
    (lambda n: n["metadata"].update(uid="another"), True),
    (lambda n: n["metadata"].update(creationTimestamp="2027-01-01T00:00:00Z"), True),
    (lambda n: n.update(metadata=["not", "a", "map"]), True),
    (lambda n: n.update(spec="podCIDR=10.244.9.0/24"), True),
])
def test_the_watch_filter_compares_raw_fields_only(change, differs):
    old = node("node-2", annotations={nodes.PUBLIC_IP: "192.0.2.11"})
    new = json.loads(json.dumps(old))
    change(new)
    assert routing_inputs_differ(old, new) is differs
    assert routing_inputs_differ("junk", new) and routing_inputs_differ(old, None)


def test_the_watch_filter_does_not_parse_what_it_compares():
    """Garbage that read_peer would refuse is compared as it is, without raising on the watch thread;
    values nested deeper than equality can go count as changed."""
    garbage = node("node-2", cidrs=("not a CIDR",), annotations={nodes.BACKEND_DATA: "{" * 50})
    assert routing_inputs_differ(garbage, json.loads(json.dumps(garbage))) is False
    deep_old, deep_new = node("node-2"), node("node-2")
    deep_old["metadata"]["annotations"]["x"], deep_new["metadata"]["annotations"]["x"] = deep_list(), deep_list()
    assert routing_inputs_differ(deep_old, deep_new) is True


def deep_list(depth: int = 100_000) -> list:
    value: list = []
    for _ in range(depth):
        value = [value]
    return value


def test_pod_mtu_leaves_room_for_the_worst_encapsulation():
    assert pod_mtu(Mode.VXLAN, Mode.VXLAN, 1500) == 1450
    assert pod_mtu(Mode.IPIP, Mode.VXLAN, 1500) == 1480
    assert pod_mtu(Mode.HOST_GW, Mode.VXLAN, 9000) == 9000
    assert pod_mtu(Mode.AUTO, Mode.IPIP, 1500) == 1480


@pytest.mark.parametrize("release, behind_nat, expected", [
    ("6.18.0-1-amd64", False, ChecksumOffload.ON),
    ("5.7.0", False, ChecksumOffload.ON),
    ("5.4.0-150-generic", False, ChecksumOffload.OFF),   # before the netfilter checksum fix
    ("4.18.0-513.el8.x86_64", False, ChecksumOffload.OFF),
    ("6.1.0-56-amd64", True, ChecksumOffload.OFF),        # NAT rewrites still break offloaded sums
])
def test_vxlan_checksum_offload_auto_choice(release, behind_nat, expected):
    assert auto_checksum_offload(kernel_release=release, behind_nat=behind_nat) is expected

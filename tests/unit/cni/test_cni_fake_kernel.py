"""The fake CNI kernel refuses what the kernel refuses (so handler tests mean something), the
pure plans of `cni.wiring` are what the kernel accepts, and `netagent cleanup` removes pod
interfaces through the seam by our aliases only."""
from __future__ import annotations

import errno
import ipaddress

import pytest

from cni.errors import CniError, ErrorCode
from cni.fake_kernel import FakeCniKernel, Timing
from cni.kernel import BridgeSpec, LinkExists, PodSetup, Route, VethPair
from cni.wiring import network_veths, plan_node_routes, plan_pod
from netagent.daemon.cleanup import remove_owned_links
from netagent.kernel.errors import KernelError
from netagent.kernel.families import IpFamily
from netagent.kernel.pod_attachment import PodAttachment

NETNS = "/var/run/netns/p"


def pair(host: str = "na000000000001", pod: str = "eth0") -> VethPair:
    return VethPair(host_name=host, pod_ifname=pod, mtu=1500, host_mac="02:00:00:00:00:01",
                    pod_mac="02:00:00:00:00:02", alias="netagent:podnet")


@pytest.fixture
def fake() -> FakeCniKernel:
    kernel = FakeCniKernel()
    kernel.add_netns(NETNS)
    return kernel


def test_routed_plan_applies_in_its_order_and_not_in_another(fake):
    address = ipaddress.ip_interface("10.244.1.2/24")
    setup, result_routes = plan_pod(ifname="eth0", mode=PodAttachment.ROUTED, addresses=[address], gateways={},
                                    routes=[{"dst": "10.96.0.0/12"}], host_mac="ee:ee:ee:ee:ee:ee")
    assert [str(a) for a in setup.addresses] == ["10.244.1.2/32"]
    assert [(str(r.dst), r.gateway and str(r.gateway)) for r in setup.routes] == [
        ("169.254.1.1/32", None), ("0.0.0.0/0", "169.254.1.1"), ("10.96.0.0/12", "169.254.1.1")]
    assert result_routes == [{"dst": "0.0.0.0/0", "gw": "169.254.1.1"}, {"dst": "10.96.0.0/12", "gw": "169.254.1.1"}]

    netns = fake.open_netns(NETNS)
    fake.create_veth(pair(), netns)
    reversed_setup = PodSetup(ifname="eth0", addresses=setup.addresses, routes=setup.routes[::-1])
    with pytest.raises(KernelError) as refused:
        fake.configure_pod(netns, reversed_setup)  # the gateway is not reachable yet
    assert refused.value.code == errno.ENETUNREACH

    fresh = FakeCniKernel()
    fresh.add_netns(NETNS)
    netns = fresh.open_netns(NETNS)
    fresh.create_veth(pair(), netns)
    fresh.configure_pod(netns, setup)
    with pytest.raises(KernelError) as again:
        fresh.configure_pod(netns, setup)
    assert again.value.code == errno.EEXIST


def test_bridge_plan_reaches_its_gateway_through_the_connected_prefix(fake):
    addresses = [ipaddress.ip_interface("10.244.1.2/24"), ipaddress.ip_interface("fd00::2/64")]
    gateways = {IpFamily.V4: ipaddress.ip_address("10.244.1.1"), IpFamily.V6: ipaddress.ip_address("fd00::1")}
    setup, _ = plan_pod(ifname="eth0", mode=PodAttachment.BRIDGE, addresses=addresses, gateways=gateways,
                        routes=[{"dst": "0.0.0.0/0"}, {"dst": "192.0.2.0/24", "gw": "10.244.1.254"}],
                        host_mac="02:00:00:00:00:01")
    assert setup.neighbours == ()
    netns = fake.open_netns(NETNS)
    fake.create_veth(pair(), netns)
    fake.configure_pod(netns, setup)
    assert {(str(r.dst), str(r.gateway)) for r in fake.namespaces[NETNS].routes} == {
        ("0.0.0.0/0", "10.244.1.1"), ("::/0", "fd00::1"), ("192.0.2.0/24", "10.244.1.254")}


def test_names_taken_at_creation_say_which(fake):
    netns = fake.open_netns(NETNS)
    fake.add_link("eth0", netns=NETNS)
    with pytest.raises(LinkExists) as taken:
        fake.create_veth(pair(), netns)
    assert taken.value.name == "eth0" and taken.value.code == errno.EEXIST
    fake.add_link("na000000000001")
    with pytest.raises(LinkExists) as taken:
        fake.create_veth(pair(), netns)
    assert taken.value.name == "na000000000001"


def test_deleting_the_host_end_takes_the_pod_end_and_routes_along(fake):
    netns = fake.open_netns(NETNS)
    fake.create_veth(pair(), netns)
    fake.route_to_pod(plan_node_routes(host_name="na000000000001",
                                       addresses=[ipaddress.ip_interface("10.244.1.2/24")], pod_mac="02:00:00:00:00:02"))
    assert fake.node.routes == {Route(ipaddress.ip_network("10.244.1.2/32")): "na000000000001"}
    assert fake.delete_link("na000000000001") is True
    assert fake.node.routes == {} and fake.node.neighbours == {}
    assert list(fake.namespaces[NETNS].links) == ["lo"]
    assert fake.delete_link("na000000000001") is False


def test_a_stale_bridge_is_not_joined_and_a_non_bridge_is_refused(fake):
    bridge = fake.ensure_bridge(BridgeSpec(name="na0", mtu=1500, gateways=()))
    assert fake.known_bridge("na0") == bridge
    fake.delete_link("na0")
    netns = fake.open_netns(NETNS)
    assert fake.create_veth(pair(), netns, master=bridge) is False
    assert fake.ensure_bridge(BridgeSpec(name="na0", mtu=1500, gateways=())) == bridge  # remembered, stale
    with pytest.raises(KernelError) as stale:
        fake.attach_to_bridge("na000000000001", bridge)
    assert stale.value.code == errno.ENODEV
    fake.forget_bridge("na0")
    fake.add_link("na0", kind="dummy")
    with pytest.raises(CniError) as refused:
        fake.ensure_bridge(BridgeSpec(name="na0", mtu=1500, gateways=()))
    assert refused.value.code == ErrorCode.INVALID_CONFIG


def test_faults_fire_once_by_name_count_or_position(fake):
    fake.fail_on("delete_link", nth=2)
    assert fake.delete_link("x") is False
    with pytest.raises(KernelError):
        fake.delete_link("x")
    assert fake.delete_link("x") is False
    fake.fail_at(2, timing=Timing.AFTER, error=KernelError(errno.EPERM, "no"))
    netns = fake.open_netns(NETNS)
    with pytest.raises(KernelError):
        fake.create_veth(pair(), netns)
    assert "na000000000001" in fake.node.links  # AFTER: done, then refused
    assert fake.calls == ["delete_link"] * 3 + ["open_netns", "create_veth"]


def test_missing_netns_and_closed_handles(fake):
    with pytest.raises(CniError) as missing:
        fake.open_netns("/var/run/netns/none")
    assert missing.value.code == ErrorCode.CONTAINER_UNKNOWN
    netns = fake.open_netns(NETNS)
    fake.close_netns(netns)
    with pytest.raises(KernelError) as closed:
        fake.create_veth(pair(), netns)
    assert closed.value.code == errno.EBADF


def test_gc_candidates_are_this_networks_veths_only(fake):
    netns = fake.open_netns(NETNS)
    fake.create_veth(pair(), netns)
    fake.add_link("na000000000002", kind="veth", alias="netagent:othernet")
    fake.add_link("na000000000003", kind="veth")
    fake.add_link("xy000000000004", kind="veth", alias="netagent:podnet")
    fake.ensure_bridge(BridgeSpec(name="na0", mtu=1500, gateways=()))
    assert network_veths(fake.owned_links(), "podnet") == ["na000000000001"]


def test_cleanup_removes_by_alias_through_the_seam(fake):
    netns = fake.open_netns(NETNS)
    fake.create_veth(pair(), netns)
    fake.create_veth(pair(host="na000000000002", pod="eth1"), netns)
    fake.ensure_bridge(BridgeSpec(name="na0", mtu=1500, gateways=(ipaddress.ip_interface("10.244.1.1/24"),)))
    fake.add_link("na-admin", kind="veth")  # an administrator's: no alias of ours
    assert sorted(remove_owned_links(fake)) == ["na0", "na000000000001", "na000000000002"]
    assert sorted(fake.node.links) == ["lo", "na-admin"]
    assert list(fake.namespaces[NETNS].links) == ["lo"]
    assert remove_owned_links(fake) == []

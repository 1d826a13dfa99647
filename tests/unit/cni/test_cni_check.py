"""CHECK: `cni.check` (prevResult against what the kernel holds, pure) and the handler that reads
both ends through the fake kernel. Each test makes one kind of drift and expects its finding."""
from __future__ import annotations

import ipaddress

import pytest

from cni import result as cni_result
from cni.check import Problem, expected_from, find_problems
from cni.errors import CniError, ErrorCode
from cni.fake_kernel import FakeCniKernel
from cni.handlers import PluginHandlers
from cni.kernel import HostVeth, PodInterface, Route
from cni.wiring import ROUTED_GATEWAY_V6_ON_HOST, host_veth_name
from netagent.kernel.pod_attachment import PodAttachment
from tests.unit.cni.test_cni_handlers import NETNS, NETWORK, make_conf, make_req

HOST = host_veth_name(NETWORK, "c1", "eth0")


@pytest.fixture
def fake() -> FakeCniKernel:
    kernel = FakeCniKernel()
    kernel.add_netns(NETNS)
    return kernel


def attach(fake: FakeCniKernel, tmp_path, *, mode: str = "bridge", subnets=("10.244.1.0/24",)):
    """ADD, then the handlers and the config a CHECK gets (prevResult as the runtime caches it)."""
    handlers = PluginHandlers(kernel=fake)
    result = handlers.add(make_conf(tmp_path, mode=mode, subnets=subnets), make_req())
    cached = cni_result.to_version(result, "1.1.0")
    return handlers, make_conf(tmp_path, mode=mode, subnets=subnets, prev_result=cached)


def check_message(handlers: PluginHandlers, conf) -> str:
    with pytest.raises(CniError) as failed:
        handlers.check(conf, make_req("CHECK"))
    assert failed.value.code == ErrorCode.CHECK_FAILED
    return failed.value.msg


# ---------------------------------------------------------------- through the handler

@pytest.mark.parametrize("mode", ["bridge", "routed"])
def test_a_fresh_attachment_checks_clean(fake, tmp_path, mode):
    handlers, conf = attach(fake, tmp_path, mode=mode, subnets=("10.244.1.0/24", "fd00:244:1::/64"))
    handlers.check(conf, make_req("CHECK"))
    assert fake.open_handles == {}


def test_missing_address_and_route_are_named(fake, tmp_path):
    handlers, conf = attach(fake, tmp_path)
    pod = fake.namespaces[NETNS]
    pod.routes = {r: dev for r, dev in pod.routes.items() if r.dst.prefixlen != 0}
    assert check_message(handlers, conf) == "route 0.0.0.0/0 via 10.244.1.1 is missing"
    pod.links["eth0"].addresses.clear()
    assert check_message(handlers, conf) == ("address 10.244.1.2/24 is missing on eth0; "
                                             "route 0.0.0.0/0 via 10.244.1.1 is missing")


def test_a_route_via_another_gateway_is_a_missing_route(fake, tmp_path):
    handlers, conf = attach(fake, tmp_path)
    pod = fake.namespaces[NETNS]
    pod.routes = {Route(dst=ipaddress.ip_network("0.0.0.0/0"), gateway=ipaddress.ip_address("10.244.1.254")): "eth0"}
    assert check_message(handlers, conf) == "route 0.0.0.0/0 via 10.244.1.1 is missing"


def test_missing_pod_interface(fake, tmp_path):
    handlers, conf = attach(fake, tmp_path)
    assert fake.delete_link(HOST)  # takes the pod end along
    assert check_message(handlers, conf) == "interface eth0 is missing in the container"
    assert fake.open_handles == {}


def test_missing_host_veth(fake, tmp_path):
    handlers, conf = attach(fake, tmp_path)
    del fake.node.links[HOST]  # drift the kernel itself would not make: the pod end survives
    assert check_message(handlers, conf) == f"host interface {HOST} is missing"


def test_down_interfaces_and_a_veth_off_the_bridge(fake, tmp_path):
    handlers, conf = attach(fake, tmp_path)
    fake.namespaces[NETNS].links["eth0"].up = False
    fake.node.links[HOST].up = False
    fake.node.links[HOST].master = None
    assert check_message(handlers, conf) == (f"eth0 is down; host interface {HOST} is down; "
                                             f"{HOST} is not attached to bridge na0")


def test_changed_mac(fake, tmp_path):
    handlers, conf = attach(fake, tmp_path)
    expected = conf.prev_result["interfaces"][-1]["mac"]
    fake.namespaces[NETNS].links["eth0"].mac = "02:00:00:00:00:99"
    assert check_message(handlers, conf) == f"eth0 has MAC 02:00:00:00:00:99, expected {expected}"


def test_routed_mode_missing_node_route(fake, tmp_path):
    handlers, conf = attach(fake, tmp_path, mode="routed")
    fake.node.routes.clear()
    assert check_message(handlers, conf) == f"node route to 10.244.1.2 via {HOST} is missing"


def test_prev_result_without_a_sandbox_interface_and_a_lost_reservation(fake, tmp_path):
    handlers, conf = attach(fake, tmp_path)
    bare = make_conf(tmp_path, prev_result={"cniVersion": "1.1.0", "interfaces": [{"name": "eth0"}]})
    assert check_message(handlers, bare) == "prevResult has no interface eth0 in a sandbox"
    (tmp_path / NETWORK / "10.244.1.2").unlink()
    assert "no address reserved for container c1 interface eth0" in check_message(handlers, conf)


def test_check_in_a_missing_netns_is_code_3(fake, tmp_path):
    handlers, conf = attach(fake, tmp_path)
    with pytest.raises(CniError) as failed:
        handlers.check(conf, make_req("CHECK", netns="/var/run/netns/gone"))
    assert failed.value.code == ErrorCode.CONTAINER_UNKNOWN


# ---------------------------------------------------------------- the pure comparison

PREV = {"interfaces": [{"name": "na0"}, {"name": HOST}, {"name": "eth0", "mac": "02:AA:00:00:00:01", "sandbox": "/x"}],
        "ips": [{"address": "10.244.1.2/24", "interface": 2, "gateway": "10.244.1.1"},
                {"address": "192.0.2.9/32", "interface": 0}],  # another plugin's, on another interface
        "routes": [{"dst": "0.0.0.0/0", "gw": "10.244.1.1"}, {"dst": "10.96.0.0/12"}]}


def observed_pod(**changes) -> PodInterface:
    values = dict(ifname="eth0", mac="02:aa:00:00:00:01", up=True,
                  addresses=frozenset({ipaddress.ip_interface("10.244.1.2/24"),
                                       ipaddress.ip_interface("fe80::1/64")}),
                  routes=frozenset({Route(ipaddress.ip_network("0.0.0.0/0"), ipaddress.ip_address("10.244.1.1")),
                                    Route(ipaddress.ip_network("10.96.0.0/12"), ipaddress.ip_address("10.244.1.1")),
                                    Route(ipaddress.ip_network("10.244.1.0/24"))}))
    values.update(changes)
    return PodInterface(**values)


def observed_host(**changes) -> HostVeth:
    values = dict(name=HOST, up=True, master="na0", routes=frozenset())
    values.update(changes)
    return HostVeth(**values)


def test_expected_reads_only_the_pod_interfaces_addresses():
    expected = expected_from(PREV, ifname="eth0", host_name=HOST, mode=PodAttachment.BRIDGE, bridge="na0")
    assert [text for text, _ in expected.addresses] == ["10.244.1.2/24"]
    assert expected.mac == "02:aa:00:00:00:01" and expected.bridge == "na0" and expected.node_routes == ()
    assert [r.text for r in expected.routes] == ["0.0.0.0/0 via 10.244.1.1", "10.96.0.0/12"]
    assert find_problems(expected, observed_pod(), observed_host()) == []


def test_a_route_without_gw_matches_any_gateway_and_none_is_missing():
    expected = expected_from(PREV, ifname="eth0", host_name=HOST, mode=PodAttachment.BRIDGE, bridge="na0")
    pod = observed_pod(routes=frozenset({Route(ipaddress.ip_network("0.0.0.0/0"),
                                               ipaddress.ip_address("10.244.1.1"))}))
    findings = find_problems(expected, pod, observed_host())
    assert [(f.problem, f.message) for f in findings] == [(Problem.ROUTE_MISSING, "route 10.96.0.0/12 is missing")]


def test_every_finding_in_order():
    expected = expected_from(PREV, ifname="eth0", host_name=HOST, mode=PodAttachment.BRIDGE, bridge="na0")
    pod = observed_pod(mac="02:bb:00:00:00:01", up=False, addresses=frozenset(), routes=frozenset())
    findings = find_problems(expected, pod, observed_host(up=False, master="cni0"))
    assert [f.problem for f in findings] == [Problem.MAC_DIFFERS, Problem.POD_INTERFACE_DOWN, Problem.ADDRESS_MISSING,
                                             Problem.ROUTE_MISSING, Problem.ROUTE_MISSING, Problem.HOST_VETH_DOWN,
                                             Problem.NOT_ON_BRIDGE]
    assert find_problems(expected, None, None)[0].problem is Problem.POD_INTERFACE_MISSING
    assert [f.problem for f in find_problems(expected, observed_pod(), None)] == [Problem.HOST_VETH_MISSING]


def test_routed_mode_wants_a_node_route_per_address_not_a_bridge():
    prev = {"interfaces": [{"name": HOST}, {"name": "eth0", "sandbox": "/x"}],
            "ips": [{"address": "10.244.1.2/32", "interface": 1}, {"address": "fd00::2/128", "interface": 1}]}
    expected = expected_from(prev, ifname="eth0", host_name=HOST, mode=PodAttachment.ROUTED, bridge="na0")
    pod = observed_pod(addresses=frozenset({ipaddress.ip_interface("10.244.1.2/32"),
                                            ipaddress.ip_interface("fd00::2/128")}))
    host = observed_host(master=None, routes=frozenset({ipaddress.ip_network("10.244.1.2/32")}),
                         addresses=frozenset({ROUTED_GATEWAY_V6_ON_HOST}))
    assert [f.message for f in find_problems(expected, pod, host)] == [f"node route to fd00::2 via {HOST} is missing"]
    host = observed_host(master=None, routes=frozenset({ipaddress.ip_network("10.244.1.2/32"),
                                                        ipaddress.ip_network("fd00::2/128")}))
    assert [(f.problem, f.message) for f in find_problems(expected, pod, host)] == [
        (Problem.HOST_GATEWAY_MISSING, f"the pods' gateway fe80::ecee:eeff:feee:eeee/64 is missing on {HOST}")]
    ipv4_only = dict(prev, ips=prev["ips"][:1])  # no IPv6: the host end needs no gateway of its own
    expected = expected_from(ipv4_only, ifname="eth0", host_name=HOST, mode=PodAttachment.ROUTED, bridge="na0")
    assert expected.host_addresses == () and find_problems(expected, pod, host) == []


DUAL_PREV = {"interfaces": [{"name": "na0"}, {"name": HOST}, {"name": "eth0", "sandbox": "/x"}],
             "ips": [{"address": "10.244.1.2/24", "interface": 2, "gateway": "10.244.1.1"},
                     {"address": "fd00:244:1::2/64", "interface": 2, "gateway": "fd00:244:1::1"}],
             "routes": [{"dst": "0.0.0.0/0", "gw": "10.244.1.1"}, {"dst": "::/0", "gw": "fd00:244:1::1"}]}
DUAL_POD = dict(addresses=frozenset(ipaddress.ip_interface(a) for a in ("10.244.1.2/24", "fd00:244:1::2/64",
                                                                           "fe80::1/64")),
                routes=frozenset({Route(ipaddress.ip_network("0.0.0.0/0"), ipaddress.ip_address("10.244.1.1")),
                                  Route(ipaddress.ip_network("::/0"), ipaddress.ip_address("fd00:244:1::1"))}))


@pytest.mark.parametrize("drift, findings", [
    ({}, []),
    ({"addresses": DUAL_POD["addresses"] - {ipaddress.ip_interface("fd00:244:1::2/64")}},
     ["address fd00:244:1::2/64 is missing on eth0"]),
    ({"addresses": DUAL_POD["addresses"] - {ipaddress.ip_interface("10.244.1.2/24")}},
     ["address 10.244.1.2/24 is missing on eth0"]),
    ({"routes": frozenset(r for r in DUAL_POD["routes"] if r.dst.version == 4)}, ["route ::/0 via fd00:244:1::1 is missing"]),
    ({"routes": frozenset({Route(ipaddress.ip_network("::/0"), ipaddress.ip_address("fe80::1"))})},
     ["route 0.0.0.0/0 via 10.244.1.1 is missing", "route ::/0 via fd00:244:1::1 is missing"]),
], ids=["clean", "no-v6-address", "no-v4-address", "no-v6-default", "v6-default-elsewhere"])
def test_dual_stack_compares_each_family(drift, findings):
    expected = expected_from(DUAL_PREV, ifname="eth0", host_name=HOST, mode=PodAttachment.BRIDGE, bridge="na0")
    pod = observed_pod(**{**DUAL_POD, **drift})
    assert [f.message for f in find_problems(expected, pod, observed_host())] == findings


def test_routed_ipv6_host_gateway_removed_is_found(fake, tmp_path):
    handlers, conf = attach(fake, tmp_path, mode="routed", subnets=("10.244.1.0/24", "fd00:244:1::/64"))
    handlers.check(conf, make_req("CHECK"))
    fake.node.links[HOST].addresses.discard(ROUTED_GATEWAY_V6_ON_HOST)
    assert check_message(handlers, conf) == f"the pods' gateway fe80::ecee:eeff:feee:eeee/64 is missing on {HOST}"


def test_an_unreadable_prev_result_is_a_config_error():
    broken = dict(PREV, routes=[{"dst": "not-a-network"}])
    with pytest.raises(CniError) as failed:
        expected_from(broken, ifname="eth0", host_name=HOST, mode=PodAttachment.BRIDGE, bridge="na0")
    assert failed.value.code == ErrorCode.INVALID_CONFIG

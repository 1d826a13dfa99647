"""The CNI handlers on the fake kernel (`cni.fake_kernel`) and the real IPAM store in a tmp dir:
ADD's result and kernel state, rollback at every kernel step, CHECK's findings, GC, DEL.

No root: every kernel step goes through `FakeCniKernel`, which refuses what the kernel
refuses and fails any step on demand. tests/netns/test_cni_plugin.py proves the same
handlers on the real kernel.
"""
from __future__ import annotations

import copy
import errno
import ipaddress
import json
import os
from pathlib import Path

import pytest

from cni.config import NetConf, parse_netconf
from cni.errors import CniError, ErrorCode
from cni.fake_kernel import NODE, FakeCniKernel, Timing, setting_owner
from cni.handlers import PluginHandlers
from cni.ipam.builtin import BuiltinIpam
from cni.kernel import Route, VethPair
from cni.request import CniRequest
from cni.wiring import host_veth_name
from netagent.kernel.errors import KernelError

NETNS = "/var/run/netns/pod-a"
DUAL_SUBNETS = ("10.244.1.0/24", "fd00:244:1::/64")
NETWORK = "podnet"


# ---------------------------------------------------------------- helpers

def make_conf(data_dir: Path, *, mode: str = "bridge", subnets: tuple = ("10.244.1.0/24",),
              name: str = NETWORK, prev_result: dict | None = None, **extra) -> NetConf:
    raw = {"cniVersion": "1.1.0", "name": name, "type": "netagent", "mode": mode,
           "ipam": {"type": "netagent", "dataDir": str(data_dir),
                    "ranges": [[{"subnet": s}] for s in subnets]}, **extra}
    if prev_result is not None:
        raw["prevResult"] = prev_result
    return parse_netconf(json.dumps(raw).encode())


def make_req(command: str = "ADD", *, container_id: str = "c1", netns: str = NETNS,
             ifname: str = "eth0") -> CniRequest:
    return CniRequest(command=command, container_id=container_id, netns=netns, ifname=ifname)


def reservations(data_dir: Path, network: str = NETWORK) -> list[str]:
    directory = data_dir / network
    if not directory.is_dir():
        return []
    return sorted(f for f in os.listdir(directory) if f != "lock" and not f.startswith("last_reserved_ip"))


def leftovers(fake: FakeCniKernel) -> list[str]:
    """Everything an attachment leaves in the fake. The bridge is shared, so it may stay
    (as it does on the real kernel), but with no ports and only its gateway addresses."""
    found = [f"node link {name}" for name, link in fake.node.links.items() if link.kind == "veth"]
    found += [f"port {name}" for name, link in fake.node.links.items() if link.master is not None]
    found += [f"node route {route.dst} dev {dev}" for route, dev in fake.node.routes.items()]
    found += [f"node neighbour {key}" for key in fake.node.neighbours]
    for path, space in fake.namespaces.items():
        if path == NODE:
            continue
        found += [f"{path}: link {name}" for name in space.links if name != "lo"]
        found += [f"{path}: route {route.dst}" for route in space.routes]
        found += [f"{path}: neighbour {key}" for key in space.neighbours]
    found += [f"open netns handle {fd}" for fd in fake.open_handles]
    for path, space in fake.namespaces.items():  # the bridge's settings stay with it
        found += [f"{path or 'node'}: sysctl {key}" for key in space.settings
                  if setting_owner(key) not in ("", "na0")]
    return found


@pytest.fixture
def fake() -> FakeCniKernel:
    kernel = FakeCniKernel()
    kernel.add_netns(NETNS)
    return kernel


@pytest.fixture
def handlers(fake: FakeCniKernel) -> PluginHandlers:
    return PluginHandlers(kernel=fake)


def add_pod(handlers: PluginHandlers, fake: FakeCniKernel, conf: NetConf, container_id: str) -> dict:
    netns = f"/var/run/netns/{container_id}"
    if netns not in fake.namespaces:
        fake.add_netns(netns)
    return handlers.add(conf, make_req(container_id=container_id, netns=netns))


# ---------------------------------------------------------------- ADD

def test_add_in_bridge_mode_builds_what_the_result_says(handlers, fake, tmp_path):
    conf = make_conf(tmp_path, subnets=("10.244.1.0/24", "fd00:244:1::/64"))
    result = handlers.add(conf, make_req())

    host = host_veth_name(NETWORK, "c1", "eth0")
    bridge, host_itf, pod_itf = result["interfaces"]
    assert (bridge["name"], host_itf["name"], pod_itf["name"]) == ("na0", host, "eth0")
    assert pod_itf["sandbox"] == NETNS and pod_itf["mtu"] == 1500
    assert [ip["address"] for ip in result["ips"]] == ["10.244.1.2/24", "fd00:244:1::2/64"]
    assert [ip["gateway"] for ip in result["ips"]] == ["10.244.1.1", "fd00:244:1::1"]
    assert {ip["interface"] for ip in result["ips"]} == {2}
    assert result["routes"] == [{"dst": "0.0.0.0/0", "gw": "10.244.1.1"}, {"dst": "::/0", "gw": "fd00:244:1::1"}]

    na0 = fake.node.links["na0"]
    assert na0.kind == "bridge" and na0.up and na0.alias == "netagent-bridge" and na0.mac == bridge["mac"]
    assert {str(a) for a in na0.addresses} == {"10.244.1.1/24", "fd00:244:1::1/64"}
    veth = fake.node.links[host]
    assert veth.up and veth.master == na0.index and veth.alias == "netagent:podnet"
    assert veth.mac == host_itf["mac"] and veth.peer == (NETNS, "eth0")
    eth0 = fake.namespaces[NETNS].links["eth0"]
    assert eth0.up and eth0.mac == pod_itf["mac"]
    assert {str(a) for a in eth0.addresses} == {"10.244.1.2/24", "fd00:244:1::2/64"}
    assert {(str(r.dst), str(r.gateway)) for r in fake.namespaces[NETNS].routes} == \
        {("0.0.0.0/0", "10.244.1.1"), ("::/0", "fd00:244:1::1")}
    assert fake.sysctls.values["net.ipv4.ip_forward"] == "1"
    assert fake.sysctls.values["net.ipv6.conf.all.forwarding"] == "1"
    assert fake.open_handles == {}
    assert reservations(tmp_path) == ["10.244.1.2", "fd00:244:1::2"]


def test_add_in_routed_mode_pins_the_gateway_and_routes_the_pod(handlers, fake, tmp_path):
    conf = make_conf(tmp_path, mode="routed")
    result = handlers.add(conf, make_req())

    host = host_veth_name(NETWORK, "c1", "eth0")
    host_itf, pod_itf = result["interfaces"]
    assert host_itf == {"name": host, "mac": "ee:ee:ee:ee:ee:ee"}
    assert result["ips"] == [{"address": "10.244.1.2/32", "interface": 1, "gateway": "169.254.1.1"}]
    assert result["routes"] == [{"dst": "0.0.0.0/0", "gw": "169.254.1.1"}]
    assert "na0" not in fake.node.links

    pod = fake.namespaces[NETNS]
    assert {str(a) for a in pod.links["eth0"].addresses} == {"10.244.1.2/32"}
    assert pod.routes == {Route(dst=ipaddress.ip_network("169.254.1.1/32")): "eth0",
                          Route(dst=ipaddress.ip_network("0.0.0.0/0"),
                                gateway=ipaddress.ip_address("169.254.1.1")): "eth0"}
    assert pod.neighbours == {("eth0", "169.254.1.1"): "ee:ee:ee:ee:ee:ee"}
    assert fake.node.routes == {Route(dst=ipaddress.ip_network("10.244.1.2/32")): host}
    assert fake.node.neighbours == {(host, "10.244.1.2"): pod_itf["mac"]}
    assert fake.sysctls.values[f"net.ipv4.conf.{host}.proxy_arp"] == "1"
    assert fake.sysctls.values["net.ipv4.ip_forward"] == "1"


FAMILY_SUBNETS = {"ipv4": ("10.244.1.0/24",), "ipv6": ("fd00:244:1::/64",), "dual": DUAL_SUBNETS}
POD_V6 = {"accept_dad": "0", "accept_ra": "0", "disable_ipv6": "0"}
HOST_V6 = {"bridge": {"accept_ra": "0"}, "routed": {"addr_gen_mode": "1", "disable_ipv6": "0", "accept_ra": "0"}}


@pytest.mark.parametrize("family", sorted(FAMILY_SUBNETS))
@pytest.mark.parametrize("mode", ["bridge", "routed"])
def test_each_family_gets_its_address_route_and_ipv6_settings(handlers, fake, tmp_path, mode, family):
    """One address and one default route per family, both in the result; the IPv6 settings
    only where there is IPv6 (an IPv4-only pod's is left alone), the routed host end holding
    the pods' IPv6 gateway; and DEL takes every one of them."""
    conf = make_conf(tmp_path, mode=mode, subnets=FAMILY_SUBNETS[family])
    result = handlers.add(conf, make_req())
    versions = [ipaddress.ip_network(s).version for s in FAMILY_SUBNETS[family]]
    routed = mode == "routed"
    assert [ipaddress.ip_interface(ip["address"]).version for ip in result["ips"]] == versions
    assert {ip["interface"] for ip in result["ips"]} == {len(result["interfaces"]) - 1}
    gateways = {4: "169.254.1.1", 6: "fe80::ecee:eeff:feee:eeee"} if routed else {4: "10.244.1.1",
                                                                                   6: "fd00:244:1::1"}
    assert result["routes"] == [{"dst": "0.0.0.0/0" if v == 4 else "::/0", "gw": gateways[v]} for v in versions]
    host = host_veth_name(NETWORK, "c1", "eth0")
    ipv6 = 6 in versions
    assert fake.link_settings("eth0", netns=NETNS) == (POD_V6 if ipv6 else {})
    assert fake.link_settings(host) == {**({"proxy_arp": "1"} if routed and 4 in versions else {}),
                                        **(HOST_V6[mode] if ipv6 else {})}
    assert fake.link_settings("na0") == ({"disable_ipv6": "0", "accept_ra": "0"} if ipv6 and not routed else {})
    host_addresses = {str(a) for a in fake.node.links[host].addresses}
    assert host_addresses == ({"fe80::ecee:eeff:feee:eeee/64"} if ipv6 and routed else set())
    handlers.delete(conf, make_req("DEL"))
    assert leftovers(fake) == [] and reservations(tmp_path) == []


def test_ipv6_disabled_by_default_in_the_namespaces_is_turned_on_where_we_need_it(handlers, fake, tmp_path):
    """A runtime that disables IPv6 in new namespaces (and a node whose default is off): the
    pod's interface and the routed host end get it back before their addresses are added."""
    fake.namespaces[NETNS].settings["net.ipv6.conf.default.disable_ipv6"] = "1"
    fake.sysctls.values["net.ipv6.conf.default.disable_ipv6"] = "1"
    result = handlers.add(make_conf(tmp_path, mode="routed", subnets=DUAL_SUBNETS), make_req())
    assert [ip["address"] for ip in result["ips"]] == ["10.244.1.2/32", "fd00:244:1::2/128"]
    assert fake.link_settings("eth0", netns=NETNS)["disable_ipv6"] == "0"


def test_a_warm_bridge_is_joined_at_creation_without_a_second_write(handlers, fake, tmp_path):
    conf = make_conf(tmp_path)
    add_pod(handlers, fake, conf, "first")
    assert "attach_to_bridge" in fake.calls
    fake.calls.clear()
    add_pod(handlers, fake, conf, "second")
    assert "attach_to_bridge" not in fake.calls
    assert fake.node.links[host_veth_name(NETWORK, "second", "eth0")].master == fake.node.links["na0"].index


def test_a_bridge_replaced_under_us_is_code_11_then_repaired(handlers, fake, tmp_path):
    conf = make_conf(tmp_path)
    add_pod(handlers, fake, conf, "first")
    assert fake.delete_link("na0")  # an administrator's `ip link del na0`
    with pytest.raises(CniError) as failed:
        add_pod(handlers, fake, conf, "second")
    assert failed.value.code == ErrorCode.TRY_AGAIN_LATER and "bridge na0 changed during ADD" in failed.value.msg
    assert host_veth_name(NETWORK, "second", "eth0") not in fake.node.links
    assert reservations(tmp_path) == ["10.244.1.2"]  # the first pod's only

    add_pod(handlers, fake, conf, "second")  # the retry ensures a new bridge
    na0 = fake.node.links["na0"]
    assert fake.node.links[host_veth_name(NETWORK, "second", "eth0")].master == na0.index
    assert {str(a) for a in na0.addresses} == {"10.244.1.1/24"}


def test_hairpin_and_mtu_are_applied(handlers, fake, tmp_path):
    handlers.add(make_conf(tmp_path, hairpinMode=True, mtu=1400), make_req())
    veth = fake.node.links[host_veth_name(NETWORK, "c1", "eth0")]
    assert veth.hairpin and veth.mtu == 1400
    assert fake.namespaces[NETNS].links["eth0"].mtu == 1400


# ---------------------------------------------------------------- ADD's rollback

def _successful_calls(tmp_path: Path, conf_args: dict) -> list[str]:
    fake = FakeCniKernel()
    fake.add_netns(NETNS)
    PluginHandlers(kernel=fake).add(make_conf(tmp_path / "probe", **conf_args), make_req())
    return list(fake.calls)


ROLLBACK_CASES = {
    "bridge": dict(mode="bridge", hairpinMode=True, subnets=DUAL_SUBNETS),
    "routed": dict(mode="routed", subnets=DUAL_SUBNETS),
    "bridge-ipv6": dict(mode="bridge", subnets=("fd00:244:1::/64",)),
    "routed-ipv6": dict(mode="routed", subnets=("fd00:244:1::/64",)),
    "routed-ipv4": dict(mode="routed", subnets=("10.244.1.0/24",)),
}
ADD_STEPS = {
    "bridge": ["open_netns", "known_bridge", "create_veth", "ensure_bridge", "enable_forwarding",
               "enable_forwarding", "set_link_settings", "configure_pod", "attach_to_bridge", "set_hairpin",
               "close_netns"],
    "routed": ["open_netns", "create_veth", "set_link_settings", "configure_pod", "enable_forwarding",
               "enable_forwarding", "route_to_pod", "close_netns"],
    "bridge-ipv6": ["open_netns", "known_bridge", "create_veth", "ensure_bridge", "enable_forwarding",
                    "set_link_settings", "configure_pod", "attach_to_bridge", "close_netns"],
    "routed-ipv6": ["open_netns", "create_veth", "set_link_settings", "configure_pod", "enable_forwarding",
                    "route_to_pod", "close_netns"],
    "routed-ipv4": ["open_netns", "create_veth", "set_link_settings", "configure_pod", "enable_forwarding",
                    "route_to_pod", "close_netns"],
}


@pytest.mark.parametrize("timing", list(Timing), ids=lambda t: t.value)
@pytest.mark.parametrize("case", sorted(ROLLBACK_CASES))
def test_add_failing_at_any_kernel_step_leaves_nothing(tmp_path, case, timing):
    conf_args = ROLLBACK_CASES[case]
    calls = _successful_calls(tmp_path, conf_args)
    assert calls == ADD_STEPS[case]
    for step, operation in enumerate(calls, start=1):
        data_dir = tmp_path / f"step{step}"
        fake = FakeCniKernel()
        fake.add_netns(NETNS)
        handlers = PluginHandlers(kernel=fake)
        conf = make_conf(data_dir, **conf_args)
        fake.fail_at(step, timing=timing)
        with pytest.raises(CniError) as failed:
            handlers.add(conf, make_req())
        where = f"failure at step {step} ({operation}, {timing.value})"
        expected = ErrorCode.TRY_AGAIN_LATER if operation in ("attach_to_bridge", "set_hairpin") \
            else ErrorCode.INTERNAL
        assert failed.value.code == expected, where
        assert fake.calls[step - 1] == operation, where
        assert leftovers(fake) == [], where
        assert reservations(data_dir) == [], where
        # and the runtime's retry on the same kernel works (round robin: the next addresses)
        handlers.add(conf, make_req())
        assert len(reservations(data_dir)) == len(conf_args["subnets"]), where


def test_add_failing_in_ipam_leaves_no_veth(handlers, fake, tmp_path):
    conf = make_conf(tmp_path, subnets=("10.244.9.0/30",))  # one usable address
    add_pod(handlers, fake, conf, "first")
    fake.add_netns("/var/run/netns/second")
    with pytest.raises(CniError) as failed:
        handlers.add(conf, make_req(container_id="second", netns="/var/run/netns/second"))
    assert failed.value.code == ErrorCode.RANGE_EXHAUSTED
    assert [n for n, link in fake.node.links.items() if link.kind == "veth"] == [host_veth_name(NETWORK, "first", "eth0")]
    assert list(fake.namespaces["/var/run/netns/second"].links) == ["lo"]
    assert fake.open_handles == {}


def test_add_into_a_missing_netns_is_code_3_and_reserves_nothing(handlers, fake, tmp_path):
    with pytest.raises(CniError) as failed:
        handlers.add(make_conf(tmp_path), make_req(netns="/var/run/netns/nowhere"))
    assert failed.value.code == ErrorCode.CONTAINER_UNKNOWN
    assert reservations(tmp_path) == [] and leftovers(fake) == []


def test_add_when_the_container_has_the_interface_fails_and_del_spares_it(handlers, fake, tmp_path):
    conf = make_conf(tmp_path)
    own = fake.add_link("eth0", kind="veth", netns=NETNS)
    with pytest.raises(CniError) as failed:
        handlers.add(conf, make_req())
    assert failed.value.code == ErrorCode.INTERFACE_EXISTS
    assert failed.value.msg == "interface eth0 already exists in the container"
    assert reservations(tmp_path) == []
    handlers.delete(conf, make_req("DEL"))  # the DEL that follows a failed ADD
    assert fake.namespaces[NETNS].links["eth0"] is own
    assert not [n for n, link in fake.node.links.items() if link.kind == "veth"]


def test_add_over_an_attachment_never_deleted_leaves_the_old_one_alone(handlers, fake, tmp_path):
    conf = make_conf(tmp_path)
    handlers.add(conf, make_req())
    host = host_veth_name(NETWORK, "c1", "eth0")
    before = copy.deepcopy(fake.node.links[host])
    fake.add_netns("/var/run/netns/pod-b")
    with pytest.raises(CniError) as failed:
        handlers.add(conf, make_req(netns="/var/run/netns/pod-b"))  # same container ID and ifname
    assert failed.value.code in (ErrorCode.INTERFACE_EXISTS, ErrorCode.ADDRESS_CONFLICT)
    assert fake.node.links[host] == before
    assert reservations(tmp_path) == ["10.244.1.2"]
    assert list(fake.namespaces["/var/run/netns/pod-b"].links) == ["lo"]


def test_a_second_routed_network_sharing_the_subnet_is_an_address_conflict_and_leaves_nothing(
        handlers, fake, tmp_path):
    """Two networks with one subnet on one node, routed: each IPAM gives the same first address,
    and the node already routes it to the first pod. The second ADD is code 103 (it was 100, an
    internal error, found by test_cni_fuzz.py), and everything it built is undone."""
    first, second = make_conf(tmp_path, mode="routed"), make_conf(tmp_path, mode="routed", name="other")
    add_pod(handlers, fake, first, "c1")
    before = leftovers(fake)
    with pytest.raises(CniError) as failed:
        add_pod(handlers, fake, second, "c2")
    assert failed.value.code == ErrorCode.ADDRESS_CONFLICT and "already routes" in failed.value.msg
    assert leftovers(fake) == before
    assert reservations(tmp_path, "other") == []


def test_a_failed_rollback_step_does_not_stop_the_others(handlers, fake, tmp_path):
    conf = make_conf(tmp_path)
    fake.fail_on("configure_pod")
    fake.fail_on("delete_link")  # the rollback's first step
    with pytest.raises(CniError):
        handlers.add(conf, make_req())
    assert reservations(tmp_path) == []  # released although the veth's undo failed
    assert fake.open_handles == {}
    assert host_veth_name(NETWORK, "c1", "eth0") in fake.node.links  # what failed is what is left


# ---------------------------------------------------------------- DEL

def test_del_twice_and_without_a_netns(handlers, fake, tmp_path):
    conf = make_conf(tmp_path, mode="routed")
    handlers.add(conf, make_req())
    handlers.delete(conf, make_req("DEL"))
    assert leftovers(fake) == [] and reservations(tmp_path) == []
    handlers.delete(conf, make_req("DEL"))
    handlers.delete(conf, make_req("DEL", netns=""))
    assert leftovers(fake) == [] and reservations(tmp_path) == []


def test_del_of_a_half_built_attachment(handlers, fake, tmp_path):
    conf = make_conf(tmp_path)
    # an agent killed mid-ADD: the pair exists, nothing reserved, nothing configured
    netns = fake.open_netns(NETNS)
    fake.create_veth(VethPair(host_name=host_veth_name(NETWORK, "c1", "eth0"), pod_ifname="eth0", mtu=1500,
                              host_mac="02:00:00:00:00:01", pod_mac="02:00:00:00:00:02",
                              alias="netagent:podnet"), netns)
    fake.close_netns(netns)
    handlers.delete(conf, make_req("DEL"))
    assert leftovers(fake) == []
    # killed earlier still: an address reserved, no veth
    BuiltinIpam().add(conf, make_req(container_id="c2"))
    assert reservations(tmp_path) == ["10.244.1.2"]
    handlers.delete(conf, make_req("DEL", container_id="c2"))
    assert reservations(tmp_path) == []


def test_del_keeps_the_address_while_the_veth_cannot_be_deleted(handlers, fake, tmp_path):
    conf = make_conf(tmp_path)
    handlers.add(conf, make_req())
    fake.fail_on("delete_link", error=KernelError(errno.EBUSY, "Device or resource busy"))
    with pytest.raises(CniError) as failed:
        handlers.delete(conf, make_req("DEL"))
    assert failed.value.code == ErrorCode.INTERNAL and "Device or resource busy" in failed.value.details
    assert reservations(tmp_path) == ["10.244.1.2"]
    handlers.delete(conf, make_req("DEL"))  # the runtime retries
    assert leftovers(fake) == [] and reservations(tmp_path) == []


class RecordingDeferred:
    def __init__(self) -> None:
        self.events: list[tuple] = []

    def submit(self, key: str, conf: NetConf, req: CniRequest) -> None:
        self.events.append(("submit", key, req.container_id))

    def wait_for(self, key: str, timeout: float = 30.0) -> bool:
        self.events.append(("wait_for", key))
        return True

    def wait_idle(self, timeout: float = 60.0) -> bool:
        self.events.append(("wait_idle",))
        return True


def test_with_the_agents_journal_del_is_deferred_and_add_and_gc_wait(fake, tmp_path):
    deferred = RecordingDeferred()
    handlers = PluginHandlers(kernel=fake, deferred=deferred)
    conf = make_conf(tmp_path)
    host = host_veth_name(NETWORK, "c1", "eth0")
    handlers.add(conf, make_req())
    handlers.delete(conf, make_req("DEL"))
    assert host in fake.node.links  # the journal's worker deletes it later
    handlers.gc(conf, make_req("GC"), {("c1", "eth0")})
    # ADD waits for a pending DEL before taking the attachment's lock, and looks again once it holds it
    assert deferred.events == [("wait_for", host), ("wait_for", host), ("submit", host, "c1"), ("wait_idle",)]


# ---------------------------------------------------------------- GC

def test_gc_removes_only_what_is_not_valid(handlers, fake, tmp_path):
    conf = make_conf(tmp_path)
    for pod in ("keep", "gone1", "gone2"):
        add_pod(handlers, fake, conf, pod)
    other = make_conf(tmp_path, name="othernet", subnets=("10.245.0.0/24",))
    add_pod(handlers, fake, other, "elsewhere")
    fake.add_link("na00000000beef", kind="veth")  # an administrator's, no alias of ours

    handlers.gc(conf, make_req("GC"), {("keep", "eth0")})
    veths = sorted(n for n, link in fake.node.links.items() if link.kind == "veth")
    assert veths == sorted([host_veth_name(NETWORK, "keep", "eth0"), host_veth_name("othernet", "elsewhere", "eth0"),
                            "na00000000beef"])
    assert reservations(tmp_path) == ["10.244.1.2"]
    assert reservations(tmp_path, "othernet") == ["10.245.0.2"]
    assert list(fake.namespaces["/var/run/netns/gone1"].links) == ["lo"]
    assert "na0" in fake.node.links

    handlers.gc(conf, make_req("GC"), set())
    assert reservations(tmp_path) == [] and host_veth_name(NETWORK, "keep", "eth0") not in fake.node.links


def test_gc_goes_on_past_a_failed_delete_and_reports_it(handlers, fake, tmp_path):
    conf = make_conf(tmp_path)
    for pod in ("gone1", "gone2"):
        add_pod(handlers, fake, conf, pod)
    fake.fail_on("delete_link")
    with pytest.raises(CniError) as failed:
        handlers.gc(conf, make_req("GC"), set())
    assert failed.value.code == ErrorCode.INTERNAL and failed.value.msg == "GC finished with errors"
    assert "cannot delete na" in failed.value.details
    assert len([n for n, link in fake.node.links.items() if link.kind == "veth"]) == 1
    assert reservations(tmp_path) == []
    handlers.gc(conf, make_req("GC"), set())
    assert leftovers(fake) == []

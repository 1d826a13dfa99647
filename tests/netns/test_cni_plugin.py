"""The CNI plugin against the real kernel: every operation, both modes, agent and in-process.

Each test builds a node namespace with pods made by executing the installed plugin binary
as a runtime would, sends real packets between them, and checks that after DEL, GC or a
failed ADD nothing of ours is left: no veth, no reservation file, no namespace.
"""
import ipaddress
import json
import os
import re
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

from netagent.kernel import namespaces
from netagent.kernel.pod_attachment import PodAttachment
from tests.cluster.lab_tools import wait_for


def node_links(node) -> dict:
    out = namespaces.run_in(node.node, ["ip", "-j", "-d", "link", "show"], check=True).stdout
    return {link["ifname"]: link for link in json.loads(out)}


def our_veths(node) -> list:
    return [name for name, link in node_links(node).items()
            if link.get("linkinfo", {}).get("info_kind") == "veth" and re.fullmatch(r"na[0-9a-f]{12}", name)]


def reservations(node) -> list:
    directory = os.path.join(node.data_dir, "netagent")
    if not os.path.isdir(directory):
        return []
    return [f for f in os.listdir(directory) if f != "lock" and not f.startswith("last_reserved_ip")]


def pod_addresses(node, pod: str) -> set:
    out = node.exec_in(pod, ["ip", "-j", "addr", "show", "dev", "eth0"], check=True).stdout
    return {f"{a['local']}/{a['prefixlen']}" for a in json.loads(out)[0]["addr_info"]
            if a.get("scope") == "global"}


def assert_clean(node):
    node.settle()
    assert our_veths(node) == []
    assert reservations(node) == []


FAMILIES = {"ipv4": ("10.244.1.0/24",), "ipv6": ("fd00:244:1::/64",),
            "dual": ("10.244.1.0/24", "fd00:244:1::/64")}
NODE_ADDRESS = {4: "198.18.0.1", 6: "fd00:198:18::1"}  # the node's own, on its lo
ROUTED_GATEWAY = {4: "169.254.1.1", 6: "fe80::ecee:eeff:feee:eeee"}


def pod_ips(pod) -> dict:
    """The pod's addresses in the result, by family."""
    return {ipaddress.ip_interface(ip["address"]).version: ip for ip in pod.result["ips"]}


def answers_one_echo(node, source: str, address: str) -> bool:
    """One echo request, one reply: nothing to retry, so a pod whose address is not usable yet
    (tentative during DAD, an interface the kernel has not brought up) fails."""
    out = node.exec_in(source, ["ping", "-c", "1", "-W", "10", address]).stdout
    return "1 packets transmitted, 1 received" in out


def sysctl_in(netns_name: str, path: str) -> str:
    return namespaces.run_in(netns_name, ["cat", f"/proc/sys/{path}"], check=True).stdout.strip()


def not_ready_ipv6(netns_name: str, ifname: str) -> list:
    """IPv6 addresses on `ifname` that are not usable yet (tentative, DAD failed)."""
    out = namespaces.run_in(netns_name, ["ip", "-6", "-j", "addr", "show", "dev", ifname], check=True).stdout
    return [a["local"] for link in json.loads(out) for a in link["addr_info"]
            if a.get("tentative") or a.get("dadfailed")]


@pytest.mark.parametrize("family", sorted(FAMILIES))
@pytest.mark.parametrize("mode", list(PodAttachment), ids=lambda m: m.value)
def test_pods_get_addresses_and_reach_each_other(make_node, where, mode, family):
    node = make_node(mode=mode, with_agent=(where == "agent"), subnets=FAMILIES[family])
    namespaces.run_in(node.node, ["ip", "addr", "add", NODE_ADDRESS[6] + "/128", "dev", "lo"], check=True)
    for name in ("a", "b"):
        # at once: the pod answers the first echo; no address of its (or of its gateway) is tentative
        pod = node.add_pod(name)
        link = json.loads(node.exec_in(name, ["ip", "-j", "link", "show", "eth0"], check=True).stdout)[0]
        assert link["operstate"] == "UP", link  # ADD waited for the kernel to apply the carrier
        for version, ip in pod_ips(pod).items():
            assert answers_one_echo(node, "node", ip["address"].split("/")[0]), (name, version)
        if 6 in pod_ips(pod):  # (an IPv4-only pod's IPv6 is left as its runtime made it)
            assert not_ready_ipv6(pod.netns_name, "eth0") == []
    a, b = node.pods["a"], node.pods["b"]
    families = sorted(pod_ips(b))
    assert families == sorted(ipaddress.ip_network(s).version for s in FAMILIES[family])

    routed = mode is PodAttachment.ROUTED
    pod_index = len(a.result["interfaces"]) - 1
    assert a.result["cniVersion"] == "1.0.0"
    assert a.result["interfaces"][-1]["sandbox"] == a.netns
    assert {ip["interface"] for ip in a.result["ips"]} == {pod_index}
    gateways = {v: ROUTED_GATEWAY[v] if routed else str(ipaddress.ip_network(s)[1])
                for v, s in ((ipaddress.ip_network(s).version, s) for s in FAMILIES[family])}
    assert {v: ip["gateway"] for v, ip in pod_ips(a).items()} == gateways
    assert a.result["routes"] == [{"dst": "0.0.0.0/0" if v == 4 else "::/0", "gw": gateways[v]} for v in families]
    assert pod_addresses(node, "a") == {ip["address"] for ip in a.result["ips"]}
    assert {ip["address"].split("/")[1] for ip in a.result["ips"]} == \
        {("32" if v == 4 else "128") if routed else ("24" if v == 4 else "64") for v in families}
    assert a.ip != b.ip

    for version in families:
        a_ip, b_ip = (pod_ips(p)[version]["address"].split("/")[0] for p in (a, b))
        assert node.ping("a", b_ip) and node.ping("b", a_ip), version
        assert node.ping("a", NODE_ADDRESS[version]), version  # pod to host
        if not routed:
            assert node.ping("a", gateways[version]), version
    if 6 in families:  # the pod's IPv6: no DAD, no Router Advertisements taken
        assert sysctl_in(a.netns_name, "net/ipv6/conf/eth0/accept_dad") == "0"
        assert sysctl_in(a.netns_name, "net/ipv6/conf/eth0/accept_ra") == "0"
    host = a.result["interfaces"][-2]["name"]
    if not routed:
        assert node_links(node)[host]["master"] == "na0"
        if 6 in families:
            assert sysctl_in(node.node, "net/ipv6/conf/na0/accept_ra") == "0"
    else:
        routes = namespaces.run_in(node.node, ["ip", "route", "show", "dev", host], check=True).stdout
        routes += namespaces.run_in(node.node, ["ip", "-6", "route", "show", "dev", host], check=True).stdout
        for version in families:
            assert f"{pod_ips(a)[version]['address'].split('/')[0]} " in routes, version
        assert ("scope link" in routes) == (4 in families)
        if 4 in families:
            assert sysctl_in(node.node, f"net/ipv4/conf/{host}/proxy_arp") == "1"
        if 6 in families:  # the host end holds the pods' gateway, usable at once, and nothing else
            host_v6 = namespaces.run_in(node.node, ["ip", "-6", "-o", "addr", "show", "dev", host],
                                        check=True).stdout
            assert [line.split()[3] for line in host_v6.splitlines()] == ["fe80::ecee:eeff:feee:eeee/64"]
            assert not_ready_ipv6(node.node, host) == []
            assert sysctl_in(node.node, f"net/ipv6/conf/{host}/accept_ra") == "0"
    mtu = json.loads(node.exec_in("a", ["ip", "-j", "link", "show", "eth0"]).stdout)[0]["mtu"]
    assert mtu == 1500
    check = dict(container_id=a.container_id, netns=a.netns, config=node.plugin_config(prev_result=a.result))
    assert node.cni("CHECK", **check) == (0, None)
    addresses = [ip["address"].split("/")[0] for pod in (a, b) for ip in pod.result["ips"]]
    node.delete_pod("a")
    node.delete_pod("b")
    assert_clean(node)
    for version in (4, 6):  # no route to a pod, pinned neighbour or NDP proxy entry is left on the node
        for what in (["route"], ["neigh", "show", "nud", "permanent"], ["neigh", "show", "proxy"]):
            left = namespaces.run_in(node.node, ["ip", f"-{version}", *what], check=True).stdout.split()
            assert [x for x in addresses if x in left] == [], (version, what, left)


@pytest.mark.parametrize("mode", list(PodAttachment), ids=lambda m: m.value)
def test_check_compares_ipv6_too(make_node, mode):
    node = make_node(mode=mode, subnets=FAMILIES["dual"], with_agent=False)
    pod = node.add_pod("a")
    check = dict(container_id=pod.container_id, netns=pod.netns, config=node.plugin_config(prev_result=pod.result))
    assert node.cni("CHECK", **check) == (0, None)
    gateway = pod_ips(pod)[6]["gateway"]
    if mode is PodAttachment.ROUTED:
        host = pod.result["interfaces"][0]["name"]
        namespaces.run_in(node.node, ["ip", "-6", "addr", "del", f"{gateway}/64", "dev", host], check=True)
        code, out = node.cni("CHECK", **check)
        assert (code, out["msg"]) == (1, f"the pods' gateway {gateway}/64 is missing on {host}")
    node.exec_in("a", ["ip", "-6", "route", "del", "default"], check=True)
    code, out = node.cni("CHECK", **check)
    assert out["code"] == 101 and f"route ::/0 via {gateway} is missing" in out["msg"]
    assert "0.0.0.0/0" not in out["msg"]


def test_mtu_and_hairpin_are_applied(make_node):
    node = make_node(mtu=1400)
    node.conflist["plugins"][0]["hairpinMode"] = True
    pod = node.add_pod("a")
    assert json.loads(node.exec_in("a", ["ip", "-j", "link", "show", "eth0"]).stdout)[0]["mtu"] == 1400
    host = pod.result["interfaces"][1]["name"]
    assert node_links(node)[host]["mtu"] == 1400
    assert node_links(node)[host]["linkinfo"]["info_slave_data"]["hairpin"] is True


@pytest.mark.parametrize("version", ["0.3.1", "0.4.0", "1.0.0", "1.1.0"])
def test_answers_in_the_version_asked_for(make_node, version):
    node = make_node(cni_version=version)
    result = node.add_pod("a").result
    assert result["cniVersion"] == version
    has_ip_version = "version" in result["ips"][0]
    assert has_ip_version == (version in ("0.3.1", "0.4.0"))
    assert ("mtu" in result["interfaces"][-1]) == (version == "1.1.0")


def test_delete_is_forgiving(make_node, where):
    node = make_node(with_agent=(where == "agent"))
    pod = node.add_pod("a")
    args = dict(container_id=pod.container_id, ifname="eth0")
    assert node.cni("DEL", netns=pod.netns, **args)[0] == 0
    assert node.cni("DEL", netns=pod.netns, **args)[0] == 0            # twice
    assert node.cni("DEL", **args)[0] == 0                             # no CNI_NETNS at all
    assert node.cni("DEL", netns="/var/run/netns/na-t-gone", **args)[0] == 0  # netns gone
    node.pods.pop("a")
    namespaces.remove(pod.netns_name)
    assert_clean(node)


def test_delete_after_the_netns_is_gone_removes_everything(make_node):
    node = make_node()
    pod = node.add_pod("a")
    namespaces.remove(pod.netns_name)  # the runtime destroyed the sandbox first
    assert node.cni("DEL", container_id=pod.container_id, netns=pod.netns)[0] == 0
    node.pods.pop("a")
    assert_clean(node)


def test_add_into_missing_netns_is_code_3_and_leaks_nothing(make_node, where):
    node = make_node(with_agent=(where == "agent"))
    code, out = node.cni("ADD", container_id="c1", netns="/var/run/netns/na-t-nowhere")
    assert (code, out["code"]) == (1, 3)
    assert_clean(node)


def test_add_when_interface_exists_in_container_fails_cleanly(make_node, where):
    node = make_node(with_agent=(where == "agent"))
    netns_name = node.new_pod_netns("busy")
    namespaces.run_in(netns_name, ["ip", "link", "add", "eth0", "type", "veth", "peer", "name", "own0"],
                      check=True)
    code, out = node.cni("ADD", container_id="c1", netns=namespaces.netns_path(netns_name))
    assert code == 1 and out["code"] == 104 and "already exists in the container" in out["msg"]
    assert_clean(node)
    # the runtime's DEL after a failed ADD must not remove the container's own eth0
    assert node.cni("DEL", container_id="c1", netns=namespaces.netns_path(netns_name))[0] == 0
    assert "eth0" in namespaces.run_in(netns_name, ["ip", "-o", "link"]).stdout


def test_exhausted_range_is_code_102_and_leaks_nothing(make_node, where):
    node = make_node(subnets=("10.244.9.0/30",), with_agent=(where == "agent"))  # one usable address
    node.add_pod("a")
    netns_name = node.new_pod_netns("b")
    code, out = node.cni("ADD", container_id="cb", netns=namespaces.netns_path(netns_name))
    assert (code, out["code"]) == (1, 102)
    assert "no IP addresses available" in out["msg"]
    assert len(our_veths(node)) == 1 and len(reservations(node)) == 1
    assert "eth0" not in namespaces.run_in(netns_name, ["ip", "-o", "link"]).stdout


def test_check_detects_missing_route_and_address(make_node, where):
    node = make_node(with_agent=(where == "agent"))
    pod = node.add_pod("a")
    conf = node.plugin_config(prev_result=pod.result)
    check = dict(container_id=pod.container_id, netns=pod.netns, config=conf)
    assert node.cni("CHECK", **check) == (0, None)

    node.exec_in("a", ["ip", "route", "del", "default"], check=True)
    code, out = node.cni("CHECK", **check)
    assert (code, out["code"]) == (1, 101) and "route 0.0.0.0/0 via 10.244.1.1 is missing" in out["msg"]

    node.exec_in("a", ["ip", "addr", "flush", "dev", "eth0"], check=True)
    code, out = node.cni("CHECK", **check)
    assert out["code"] == 101 and f"address {pod.ip}/24 is missing" in out["msg"]


def test_check_detects_missing_host_veth_and_needs_prev_result(make_node):
    node = make_node(mode=PodAttachment.ROUTED)
    pod = node.add_pod("a")
    code, out = node.cni("CHECK", container_id=pod.container_id, netns=pod.netns)
    assert out["code"] == 7 and "prevResult" in out["msg"]
    host = pod.result["interfaces"][0]["name"]
    namespaces.run_in(node.node, ["ip", "route", "del", f"{pod.ip}/32"], check=True)
    code, out = node.cni("CHECK", container_id=pod.container_id, netns=pod.netns,
                         config=node.plugin_config(prev_result=pod.result))
    assert out["code"] == 101 and f"node route to {pod.ip} via {host} is missing" in out["msg"]


def test_check_is_refused_for_old_config_versions(make_node):
    node = make_node(cni_version="0.3.1")
    pod = node.add_pod("a")
    code, out = node.cni("CHECK", container_id=pod.container_id, netns=pod.netns,
                         config=node.plugin_config(prev_result=pod.result))
    assert (code, out["code"]) == (1, 1)


@pytest.mark.parametrize("family", ["ipv4", "dual"])
def test_gc_removes_what_is_not_valid(make_node, where, family):
    node = make_node(cni_version="1.1.0", with_agent=(where == "agent"), subnets=FAMILIES[family])
    keep, gone1, gone2 = node.add_pod("keep"), node.add_pod("gone1"), node.add_pod("gone2")
    valid = [{"containerID": keep.container_id, "ifname": "eth0"}]
    code, out = node.cni("GC", config=node.plugin_config(**{"cni.dev/valid-attachments": valid}))
    assert (code, out) == (0, None)
    assert our_veths(node) == [keep.result["interfaces"][1]["name"]]
    assert sorted(reservations(node)) == sorted(ip["address"].split("/")[0] for ip in keep.result["ips"])
    for ip in keep.result["ips"]:
        assert node.ping("keep", ip["gateway"])
    for pod in (gone1, gone2):
        node.pods.pop(pod.name)
    # the 1.1.0 tag's spelling of the key works too
    code, _ = node.cni("GC", config=node.plugin_config(**{"cni.dev/attachments": []}))
    assert code == 0 and our_veths(node) == [] and reservations(node) == []
    node.pods.clear()


def test_gc_leaves_other_networks_alone(make_node):
    node = make_node(cni_version="1.1.0")
    node.add_pod("a")
    other = node.plugin_config(**{"name": "othernet", "cni.dev/valid-attachments": []})
    assert node.cni("GC", config=other)[0] == 0
    assert len(our_veths(node)) == 1 and len(reservations(node)) == 1


def test_status(make_node, where):
    node = make_node(cni_version="1.1.0", subnets=("10.244.9.0/30",), with_agent=(where == "agent"))
    assert node.cni("STATUS") == (0, None)
    node.add_pod("a")  # takes the only address
    code, out = node.cni("STATUS")
    assert (code, out["code"]) == (1, 50)
    code, out = node.cni("STATUS", config=node.plugin_config(cniVersion="1.0.0"))
    assert out["code"] == 1


def test_version_command():
    from lab import LabNode
    with LabNode(prefix="na-t", with_agent=False) as node:
        code, out = node.cni("VERSION", config=b'{"cniVersion": "0.4.0"}')
        assert code == 0 and out["cniVersion"] == "0.4.0"
        assert out["supportedVersions"] == ["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"]


def test_prev_result_is_passed_on(make_node):
    node = make_node()
    netns_name = node.new_pod_netns("chained")
    prev = {"cniVersion": "1.0.0", "interfaces": [{"name": "lo0", "sandbox": "/x"}],
            "ips": [{"address": "192.0.2.5/32", "interface": 0}], "dns": {"nameservers": ["192.0.2.53"]}}
    code, out = node.cni("ADD", container_id="c1", netns=namespaces.netns_path(netns_name),
                         config=node.plugin_config(prev_result=prev))
    assert code == 0
    assert out["interfaces"][0]["name"] == "lo0" and out["ips"][0]["address"] == "192.0.2.5/32"
    assert out["ips"][1]["interface"] == 3  # lo0, na0, host veth, eth0
    assert out["dns"] == {"nameservers": ["192.0.2.53"]}
    assert node.cni("DEL", container_id="c1", netns=namespaces.netns_path(netns_name))[0] == 0


def test_delegated_ipam_reference_host_local(make_node, where):
    node = make_node(with_agent=(where == "agent"))
    node.conflist["plugins"][0]["ipam"] = {"type": "host-local", "subnet": "10.244.7.0/24",
                                           "dataDir": node.data_dir}
    a, b = node.add_pod("a"), node.add_pod("b")
    assert a.ip.startswith("10.244.7.") and node.ping("a", b.ip)
    assert sorted(os.listdir(os.path.join(node.data_dir, "netagent"))) == \
        sorted([a.ip, b.ip, "last_reserved_ip.0", "lock"])
    node.delete_pod("a")
    node.delete_pod("b")
    assert_clean(node)


@pytest.mark.parametrize("ipam, code", [
    ({"type": "no-such-ipam"}, 7),
    ({"type": "netagent", "ranges": [[{"subnet": "10.0.0.0/33"}]]}, 7),
    ({"type": "netagent", "ranges": [[{"subnet": "not-a-cidr"}]]}, 7),
])
def test_bad_ipam_configs_fail_cleanly(make_node, ipam, code):
    node = make_node()
    node.conflist["plugins"][0]["ipam"] = ipam
    netns_name = node.new_pod_netns("x")
    got, out = node.cni("ADD", container_id="c1", netns=namespaces.netns_path(netns_name))
    assert (got, out["code"]) == (1, code)
    assert our_veths(node) == [] and "eth0" not in namespaces.run_in(netns_name, ["ip", "-o", "link"]).stdout


def test_bad_input_is_rejected_before_touching_anything(make_node, where):
    node = make_node(with_agent=(where == "agent"))
    netns_name = node.new_pod_netns("x")
    netns = namespaces.netns_path(netns_name)
    cases = [
        (dict(config=b"{oops"), 6),
        (dict(config=b'{"cniVersion": "2.0.0", "name": "n", "type": "netagent"}'), 1),
        (dict(config=node.plugin_config(mtu="big")), 7),
        (dict(env_overrides={"CNI_CONTAINERID": "../../../etc"}), 4),
        (dict(env_overrides={"CNI_CONTAINERID": "a$(touch /tmp/pwned)"}), 4),
        (dict(ifname="eth0;reboot"), 4),
        (dict(ifname="x" * 16), 4),
        (dict(args="K8S_POD_NAME=a;Surprise=1"), 2),
    ]
    for kwargs, code in cases:
        kwargs.setdefault("container_id", "c1")
        got, out = node.cni("ADD", netns=netns, **kwargs)
        assert (got, (out or {}).get("code")) == (1, code), (kwargs, out)
    assert node.cni("ADD", container_id="c1", netns=netns, args="Surprise=1;IgnoreUnknown=1")[0] == 0
    assert node.cni("DEL", container_id="c1", netns=netns)[0] == 0
    assert_clean(node)
    assert not os.path.exists("/tmp/pwned")


def test_concurrent_adds_get_unique_addresses(make_node, where):
    node = make_node(with_agent=(where == "agent"), subnets=("10.244.16.0/22",))
    count = 40 if where == "agent" else 12
    names = [node.new_pod_netns(f"p{i}") for i in range(count)]

    def add(i):
        return node.cni("ADD", container_id=f"c{i}", netns=namespaces.netns_path(names[i]))

    with ThreadPoolExecutor(max_workers=count) as pool:
        results = list(pool.map(add, range(count)))
    assert all(code == 0 for code, _ in results), [out for code, out in results if code]
    addresses = [out["ips"][0]["address"] for _, out in results]
    assert len(set(addresses)) == count
    with ThreadPoolExecutor(max_workers=count) as pool:
        deleted = list(pool.map(lambda i: node.cni("DEL", container_id=f"c{i}",
                                                   netns=namespaces.netns_path(names[i])), range(count)))
    assert all(code == 0 for code, _ in deleted)
    assert_clean(node)


def test_agent_restart_keeps_pods_and_serves_del(make_node):
    node = make_node()
    node.add_pod("a")
    node.stop_agent()
    # with no agent, the plugin still works in-process
    b = node.add_pod("b")
    node.start_agent()
    assert node.ping("a", b.ip)
    node.delete_pod("a")
    node.delete_pod("b")
    assert_clean(node)


def test_add_waits_for_a_pending_del_of_the_same_attachment(make_node):
    node = make_node()
    pod = node.add_pod("a")
    assert node.cni("DEL", container_id=pod.container_id, netns=pod.netns)[0] == 0
    code, out = node.cni("ADD", container_id=pod.container_id, netns=pod.netns)
    assert code == 0, out
    assert node.cni("DEL", container_id=pod.container_id, netns=pod.netns)[0] == 0
    node.pods.clear()
    assert_clean(node)


def test_cleanup_removes_only_what_we_own(make_node):
    node = make_node()
    node.add_pod("a")
    namespaces.run_in(node.node, ["ip", "link", "add", "na-admin", "type", "veth", "peer", "name", "na-admin2"],
                      check=True)
    out = namespaces.run_in(node.node, [sys.executable, "-m", "netagent.cli", "cleanup"], check=True).stdout
    assert "removed interface na0" in out and "2 item(s) removed" in out
    remaining = node_links(node)
    assert "na-admin" in remaining and "na0" not in remaining and our_veths(node) == []
    node.pods.clear()


ROUTER_ADVERTISEMENT = r"""
import socket, struct, sys
# type 134, code 0, checksum (the kernel's), hop limit 64, no flags, router lifetime 1800 s,
# then a prefix information option: 2001:db8:bad::/64, on-link and autonomous, lifetimes 1 h
prefix = socket.inet_pton(socket.AF_INET6, "2001:db8:bad::")
ra = struct.pack("!BBHBBHII", 134, 0, 0, 64, 0, 1800, 0, 0)
ra += struct.pack("!BBBBIII", 3, 4, 64, 0xC0, 3600, 3600, 0) + prefix
s = socket.socket(socket.AF_INET6, socket.SOCK_RAW, socket.IPPROTO_ICMPV6)
s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_MULTICAST_HOPS, 255)
s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_MULTICAST_IF, socket.if_nametoindex("eth0"))
s.sendto(ra, ("ff02::1", 0, 0, socket.if_nametoindex("eth0")))
"""


def router_advertisements_received(node, pod: str) -> int:
    out = node.exec_in(pod, ["cat", "/proc/net/snmp6"], check=True).stdout
    return int(next(line.split()[1] for line in out.splitlines()
                    if line.startswith("Icmp6InRouterAdvertisements")))


def test_a_pod_takes_no_router_advertisement_from_another(make_node):
    """Bridge mode puts pods on one link: a pod that sends Router Advertisements must not give
    its neighbours a default route or an address. Pod c has accept_ra put back to 1 (as
    without the plugin's setting) and takes the advertisement; pod a, as the plugin left it,
    counts it received and ignores it."""
    node = make_node(subnets=FAMILIES["ipv6"], with_agent=False)
    a, c = node.add_pod("a"), node.add_pod("c")
    node.add_pod("rogue")
    node.exec_in("c", ["sh", "-c", "echo 1 > /proc/sys/net/ipv6/conf/eth0/accept_ra"], check=True)
    seen = {name: router_advertisements_received(node, name) for name in ("a", "c")}
    sent = node.exec_in("rogue", [sys.executable, "-c", ROUTER_ADVERTISEMENT])
    assert sent.returncode == 0, sent.stderr
    wait_for(lambda: all(router_advertisements_received(node, n) > seen[n] for n in seen))

    def taken(name: str) -> list:
        routes = node.exec_in(name, ["ip", "-6", "route"], check=True).stdout
        addresses = node.exec_in(name, ["ip", "-6", "addr"], check=True).stdout
        return [line for line in (routes + addresses).splitlines() if "proto ra" in line or "2001:db8:bad" in line]

    wait_for(lambda: taken("c"))  # the control: an interface that accepts RAs takes this one
    assert taken("a") == []
    assert node.exec_in("a", ["ip", "-6", "route", "show", "default"], check=True).stdout.split()[:3] == \
        ["default", "via", pod_ips(a)[6]["gateway"]]


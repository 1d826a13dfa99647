"""The routing backends against the real kernel: pods on different nodes ping each other.

The lab is all namespaces this file creates and always removes: an "underlay" namespace
holds one bridge per L2 segment and routes between the segments; each node namespace
has `eth0` on a segment, IP forwarding on, and one pod namespace behind a veth. Each
node runs its own `RouteManager` over a `NetlinkKernel` whose sockets were opened inside
that node's namespace, and peers are built the way the agent builds them (each node's
announced VTEP MAC comes from its own `ensure_local`). Kernel state is asserted with
`ip -j` / `bridge -j`, connectivity with real pings from pod to pod.

Per IP family (`test_pods_reach_each_other_per_family`): the lab builds IPv4, IPv6 or both
(`Lab(families=...)`: IPv6 underlay addresses and pod addresses with DAD off), each node runs
one `RouteManager` per family, as the agent does, and pods ping each other over every family
in host-gw, vxlan (IPv6 over `na-vxlan6` on the IPv6 underlay) and auto.

IPIP cannot run on this kernel (no CONFIG_NET_IPIP): its test first proves that
`ip link add type ipip` fails in a test namespace and only then skips; on a kernel with
IPIP (the VM tier) the same test runs the real code path.
"""
import json
import os
import queue
import re
import subprocess
import threading
import time
from dataclasses import dataclass
from ipaddress import IPv4Address, IPv4Network, IPv6Address, IPv6Network

import pytest

from cni.netns import entered
from netagent.kernel import namespaces
from netagent.kernel.families import IpFamily
from netagent.noderoutes.routing.kernel import NetlinkKernel
from netagent.noderoutes.routing.model import ROUTE_PROTOCOL, LocalNode, Mode, Peer, PeerBounds, RoutingSettings
from netagent.noderoutes.routing.routes import RouteManager
from netagent.noderoutes.routing.vxlan import vtep_mac
from netagent.noderoutes.underlay import choose_underlay

SEGMENTS = {"a": IPv4Network("192.0.2.0/24"), "b": IPv4Network("198.51.100.0/24")}
SEGMENTS6 = {"a": IPv6Network("2001:db8:a::/64"), "b": IPv6Network("2001:db8:b::/64")}
ROUTER_HOST = 254
V4, V6 = (IpFamily.V4,), (IpFamily.V6,)
DUAL = (IpFamily.V4, IpFamily.V6)
NO_DAD = ["net.ipv6.conf.all.accept_dad=0", "net.ipv6.conf.default.accept_dad=0"]  # addresses usable at once


def ip_batch(netns: str, commands: list[str]) -> None:
    out = subprocess.run(["ip", "-n", netns, "-batch", "-"], input="\n".join(commands) + "\n",
                         capture_output=True, text=True)
    assert out.returncode == 0, f"ip -batch in {netns} failed: {out.stderr}"


def sysctl(netns: str, setting: str) -> None:
    namespaces.run_in(netns, ["sysctl", "-qw", setting], check=True)


def ip_json(netns: str, *argv) -> list:
    out = subprocess.run(["ip", "-n", netns, "-j", *argv], capture_output=True, text=True, check=True).stdout
    return json.loads(out or "[]")


def fdb_json(netns: str, ifname: str) -> list:
    out = namespaces.run_in(netns, ["bridge", "-j", "fdb", "show", "dev", ifname], check=True).stdout
    return json.loads(out or "[]")


def our_routes(netns: str) -> dict:
    """{dst: (gateway, dev, onlink)} for routes of our protocol in the main table."""
    return {r["dst"]: (r.get("gateway"), r["dev"], "onlink" in r.get("flags", []))
            for r in ip_json(netns, "route", "show", "proto", str(ROUTE_PROTOCOL))}


def our_links(netns: str) -> list:
    return sorted(link["ifname"] for link in ip_json(netns, "link", "show") if link["ifname"].startswith("na-"))


BOUNDS = PeerBounds(cluster_cidrs=(IPv4Network("10.0.0.0/8"), IPv6Network("fd00:10:244::/56")))  # every pod CIDR


@dataclass
class Node:
    name: str
    netns: str
    pod_netns: str
    segment: str
    public_ip: IPv4Address
    pod_cidr: IPv4Network
    public_ip6: IPv6Address
    pod_cidr6: IPv6Network
    families: tuple = V4
    kernel: NetlinkKernel | None = None
    routes: RouteManager | None = None  # the first family's
    managers: dict | None = None  # IpFamily -> RouteManager
    backend_data: dict | None = None

    @property
    def pod_ip(self) -> str:
        return str(self.pod_cidr.network_address + 2)

    def pod_ip_of(self, family: IpFamily) -> str:
        return self.pod_ip if family is IpFamily.V4 else str(self.pod_cidr6.network_address + 2)

    def local(self, family: IpFamily = IpFamily.V4) -> LocalNode:
        if family is IpFamily.V6:
            return LocalNode(name=self.name, vtep_mac=vtep_mac(self.name, IpFamily.V6), public_ip=self.public_ip6, underlay_ifname="eth0",
                             underlay_network=SEGMENTS6[self.segment], underlay_mtu=1500,
                             pod_cidrs=self.pod_cidrs())
        return LocalNode(name=self.name, vtep_mac=vtep_mac(self.name), public_ip=self.public_ip, underlay_ifname="eth0",
                         underlay_network=SEGMENTS[self.segment], underlay_mtu=1500, pod_cidrs=self.pod_cidrs())

    def pod_cidrs(self) -> tuple:
        return tuple(self.pod_cidr if f is IpFamily.V4 else self.pod_cidr6 for f in self.families)

    def as_peer(self) -> Peer:
        data = self.backend_data or {}
        if self.families == V6:  # an IPv6-only node announces public-ipv6 alone
            return Peer(name=self.name, public_ip=self.public_ip6, public_ipv6=self.public_ip6,
                        pod_cidrs=self.pod_cidrs(), vtep_mac6=data.get("vtepMAC6"))
        return Peer(name=self.name, public_ip=self.public_ip, pod_cidrs=self.pod_cidrs(),
                    vtep_mac=data.get("vtepMAC"), vtep_mac6=data.get("vtepMAC6"),
                    public_ipv6=self.public_ip6 if IpFamily.V6 in self.families else None)


class Lab:
    def __init__(self, families: tuple = V4) -> None:
        self.families = families
        self.namespaces: list[str] = []
        self.kernels: list[NetlinkKernel] = []
        self.nodes: list[Node] = []
        self.underlay = self.new_namespace("ul")
        sysctl(self.underlay, "net.ipv4.ip_forward=1")
        for setting in NO_DAD + ["net.ipv6.conf.all.forwarding=1"]:
            sysctl(self.underlay, setting)
        ip_batch(self.underlay, [f"link add br-{s} type bridge" for s in SEGMENTS] +
                 [f"link set br-{s} up" for s in SEGMENTS] +
                 [f"addr add {net.network_address + ROUTER_HOST}/{net.prefixlen} dev br-{s}"
                  for s, net in SEGMENTS.items()] +
                 [f"addr add {net.network_address + ROUTER_HOST}/{net.prefixlen} dev br-{s} nodad"
                  for s, net in SEGMENTS6.items()])

    def new_namespace(self, role: str) -> str:
        name = namespaces.unique_name(f"na-t{role}")
        namespaces.create(name)
        self.namespaces.append(name)
        return name

    def add_node(self, *, segment: str = "a") -> Node:
        index = len(self.nodes) + 1
        net, net6 = SEGMENTS[segment], SEGMENTS6[segment]
        node = Node(name=f"node-{index}", netns=self.new_namespace(f"n{index}"),
                    pod_netns=self.new_namespace(f"p{index}"), segment=segment,
                    public_ip=net.network_address + index, pod_cidr=IPv4Network(f"10.244.{index}.0/24"),
                    public_ip6=net6.network_address + index, pod_cidr6=IPv6Network(f"fd00:10:244:{index}::/64"),
                    families=self.families)
        ip_batch(self.underlay, [f"link add u{index} type veth peer name eth0 netns {node.netns}",
                                 f"link set u{index} master br-{segment} up"])
        for netns in (node.netns, node.pod_netns):
            for setting in NO_DAD:
                sysctl(netns, setting)
        other = next(s for s in SEGMENTS if s != segment)
        node_side, pod_side = ["link set eth0 up", f"link add pod0 type veth peer name eth0 netns {node.pod_netns}",
                               "link set pod0 up"], ["link set eth0 up"]
        if IpFamily.V4 in self.families:
            node_side += [f"addr add {node.public_ip}/{net.prefixlen} dev eth0",
                          f"route add {SEGMENTS[other]} via {net.network_address + ROUTER_HOST}",
                          f"addr add {node.pod_cidr.network_address + 1}/24 dev pod0"]
            pod_side += [f"addr add {node.pod_ip}/24 dev eth0",
                         f"route add default via {node.pod_cidr.network_address + 1}"]
        if IpFamily.V6 in self.families:
            node_side += [f"addr add {node.public_ip6}/64 dev eth0 nodad",
                          f"route add {SEGMENTS6[other]} via {net6.network_address + ROUTER_HOST}",
                          f"addr add {node.pod_cidr6.network_address + 1}/64 dev pod0 nodad"]
            pod_side += [f"addr add {node.pod_ip_of(IpFamily.V6)}/64 dev eth0 nodad",
                         f"route add default via {node.pod_cidr6.network_address + 1}"]
        ip_batch(node.netns, node_side)
        ip_batch(node.pod_netns, pod_side)
        sysctl(node.netns, "net.ipv4.ip_forward=1")
        sysctl(node.netns, "net.ipv6.conf.all.forwarding=1")
        self.nodes.append(node)
        return node

    def kernel_in(self, netns: str) -> NetlinkKernel:
        kernel = NetlinkKernel.in_namespace(netns)
        self.kernels.append(kernel)
        return kernel

    def start(self, node: Node, settings: RoutingSettings) -> RouteManager:
        """One manager per family of the lab, as the agent builds them; `node.routes` is the first."""
        node.kernel = self.kernel_in(node.netns)
        node.managers = {family: RouteManager(kernel=node.kernel, settings=settings, local=node.local(family),
                                              bounds=BOUNDS) for family in self.families}
        node.backend_data = {}
        for family, manager in node.managers.items():
            manager.keep_devices = frozenset(d.ifname for other, m in node.managers.items() if other is not family
                                             for d in m.devices)
            manager.ipv6_routed = IpFamily.V6 in self.families
            node.backend_data.update(manager.ensure_local())
        node.routes = node.managers[self.families[0]]
        return node.routes

    def start_all(self, settings: RoutingSettings) -> dict:
        """Start every node; the first family's report per node (`start_all_families` for all)."""
        return {name: reports[self.families[0]] for name, reports in self.start_all_families(settings).items()}

    def start_all_families(self, settings: RoutingSettings) -> dict:
        for node in self.nodes:
            self.start(node, settings)
        return {node.name: {family: manager.sync_all(self.peers_of(node)) for family, manager in node.managers.items()}
                for node in self.nodes}

    def peers_of(self, node: Node) -> list:
        return [other.as_peer() for other in self.nodes if other is not node]

    def close(self) -> None:
        for kernel in self.kernels:
            kernel.close()
        for name in reversed(self.namespaces):
            namespaces.remove(name)


def ping(src: Node, dst: Node, family: IpFamily = IpFamily.V4) -> bool:
    """Whether dst's pod answers src's within 10 s (pinging every 0.05 s, done at the first reply)."""
    return namespaces.run_in(src.pod_netns, ["ping", "-c", "1", "-w", "10", "-i", "0.05",
                                             dst.pod_ip_of(family)]).returncode == 0


def silent(src: Node, dst: Node) -> bool:
    """Whether dst's pod leaves an echo request from src unanswered for 1 s (a path that works
    answers in microseconds; one that does not never does)."""
    return namespaces.run_in(src.pod_netns, ["ping", "-c", "1", "-W", "1", dst.pod_ip]).returncode != 0


def assert_full_mesh(lab: Lab) -> None:
    failed = [(a.name, b.name, f.label) for f in lab.families for a in lab.nodes for b in lab.nodes
              if a is not b and not ping(a, b, f)]
    assert not failed, f"pod-to-pod pings failed: {failed}"


@pytest.fixture
def lab(request):
    built = Lab(getattr(request, "param", V4))
    try:
        yield built
    finally:
        built.close()


def test_vxlan_pods_reach_each_other_and_the_kernel_holds_exactly_the_plan(lab):
    for _ in range(3):
        lab.add_node()
    reports = lab.start_all(RoutingSettings(mode=Mode.VXLAN))
    assert all(r.added == 6 and r.peers_by_mode["vxlan"] == 2 for r in reports.values())
    assert_full_mesh(lab)
    n1, n2, n3 = lab.nodes
    (link,) = ip_json(n1.netns, "-d", "link", "show", "na-vxlan")
    vxlan = link["linkinfo"]["info_data"]
    assert (vxlan["id"], vxlan["port"], vxlan["local"], vxlan["learning"]) == (1, 4789, "192.0.2.1", False)
    assert (link["mtu"], link["address"], link["operstate"] != "DOWN") == (1450, vtep_mac("node-1"), True)
    assert [(a["local"], a["prefixlen"]) for a in ip_json(n1.netns, "-4", "addr", "show", "na-vxlan")[0]["addr_info"]] \
        == [("10.244.1.0", 32)]
    assert n1.kernel.observe("na-vxlan").tx_checksum is False
    assert our_routes(n1.netns) == {"10.244.2.0/24": ("10.244.2.0", "na-vxlan", True),
                                    "10.244.3.0/24": ("10.244.3.0", "na-vxlan", True)}
    neighbours = {(n["dst"], n["lladdr"]) for n in ip_json(n1.netns, "neigh", "show", "dev", "na-vxlan")
                  if "PERMANENT" in n["state"]}
    assert neighbours == {("10.244.2.0", vtep_mac("node-2")), ("10.244.3.0", vtep_mac("node-3"))}
    assert {(e["mac"], e["dst"]) for e in fdb_json(n1.netns, "na-vxlan")} == {
        (vtep_mac("node-2"), "192.0.2.2"), (vtep_mac("node-3"), "192.0.2.3")}


def test_host_gw_pods_reach_each_other_through_plain_routes(lab):
    for _ in range(3):
        lab.add_node()
    lab.start_all(RoutingSettings(mode=Mode.HOST_GW))
    assert_full_mesh(lab)
    n1 = lab.nodes[0]
    assert our_links(n1.netns) == []
    assert our_routes(n1.netns) == {"10.244.2.0/24": ("192.0.2.2", "eth0", False),
                                    "10.244.3.0/24": ("192.0.2.3", "eth0", False)}


def test_auto_across_two_segments_mixes_host_gw_and_vxlan(lab):
    n1, _, _ = lab.add_node(segment="a"), lab.add_node(segment="a"), lab.add_node(segment="b")
    reports = lab.start_all(RoutingSettings(mode=Mode.AUTO))
    assert reports["node-1"].peers_by_mode == {"host-gw": 1, "vxlan": 1, "ipip": 0}
    assert reports["node-3"].peers_by_mode == {"host-gw": 0, "vxlan": 2, "ipip": 0}
    assert our_routes(n1.netns) == {"10.244.2.0/24": ("192.0.2.2", "eth0", False),
                                    "10.244.3.0/24": ("10.244.3.0", "na-vxlan", True)}
    assert_full_mesh(lab)


def test_host_gw_refuses_a_peer_behind_a_router(lab):
    n1, n2, n3 = lab.add_node(segment="a"), lab.add_node(segment="a"), lab.add_node(segment="b")
    reports = lab.start_all(RoutingSettings(mode=Mode.HOST_GW))
    assert set(reports["node-1"].refused) == {"node-3"}
    assert "not on this node's underlay subnet 192.0.2.0/24" in reports["node-1"].refused["node-3"].reason
    assert set(our_routes(n1.netns)) == {"10.244.2.0/24"}
    assert ping(n1, n2) and silent(n1, n3)


class NetlinkMonitor:
    """`ip monitor` inside a namespace, for "nothing was written" assertions.

    It is known to be subscribed once it reports one of the marker routes the test adds (one
    added before it subscribed is never reported, so another follows every half second), and
    to have reported everything before `stop()` once it reports a last marker: no sleeps."""

    TABLE = "4242"

    def __init__(self, netns: str) -> None:
        self.netns = netns
        self.markers: list[str] = []
        self.proc = subprocess.Popen(["ip", "-n", netns, "-o", "monitor", "link", "address", "route", "neigh"],
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        self.lines: queue.Queue = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        deadline = time.monotonic() + 60
        while True:
            assert time.monotonic() < deadline, "ip monitor never reported a marker route"
            self._add_marker(f"198.18.254.{len(self.markers) + 1}")
            if self._lines_until("unreachable 198.18.254.", wait=0.5) is not None:
                return

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def _add_marker(self, address: str) -> None:
        subprocess.run(["ip", "-n", self.netns, "route", "add", "unreachable", f"{address}/32", "table", self.TABLE],
                       check=True)
        self.markers.append(address)

    def _lines_until(self, marker: str, *, wait: float) -> list | None:
        """The lines reported before one containing `marker`, or None if none came within `wait` s."""
        before, deadline = [], time.monotonic() + wait
        while True:
            try:
                line = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                return None
            assert line is not None, "ip monitor exited"
            if marker in line:
                return before
            before.append(line)

    def stop(self) -> list:
        self._add_marker("198.18.255.254")
        out = self._lines_until("unreachable 198.18.255.254 ", wait=60)
        assert out is not None, "ip monitor did not report the last marker route"
        self.proc.terminate()
        self.proc.wait(timeout=60)
        for address in self.markers:
            subprocess.run(["ip", "-n", self.netns, "route", "del", "unreachable", f"{address}/32",
                            "table", self.TABLE], check=True)
        return [line for line in out if "na-vxlan" in line or f"proto {ROUTE_PROTOCOL}" in line]


def test_a_restarted_manager_adopts_without_writes_and_traffic_never_drops(lab):
    n1, n2 = lab.add_node(), lab.add_node()
    settings = RoutingSettings(mode=Mode.VXLAN)
    lab.start_all(settings)
    assert ping(n1, n2)
    # -w: the 60 replies are awaited (a late one on a loaded machine is not a lost one)
    pinger = subprocess.Popen(namespaces.exec_prefix(n1.pod_netns) + ["ping", "-c", "60", "-i", "0.02", "-w", "60",
                                                                      n2.pod_ip],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    monitor = NetlinkMonitor(n1.netns)
    restarted = RouteManager(kernel=lab.kernel_in(n1.netns), settings=settings, local=n1.local(), bounds=BOUNDS)
    assert restarted.ensure_local() == {"vtepMAC": vtep_mac("node-1")}
    report = restarted.sync_all(lab.peers_of(n1))
    events = monitor.stop()
    out, _ = pinger.communicate(timeout=120)
    assert (report.added, report.removed, report.unchanged) == (0, 0, 3)
    assert events == []
    assert " 0% packet loss" in out, out
    # the monitor does see our writes: a repair right after shows up
    subprocess.run(["ip", "-n", n1.netns, "route", "del", "10.244.2.0/24"], check=True)
    monitor = NetlinkMonitor(n1.netns)
    assert restarted.sync_all(lab.peers_of(n1)).added == 1
    assert any("10.244.2.0/24" in line for line in monitor.stop())


def test_sync_all_repairs_a_deleted_route_fdb_entry_and_device(lab):
    n1, n2, n3 = lab.add_node(), lab.add_node(), lab.add_node()
    lab.start_all(RoutingSettings(mode=Mode.VXLAN))
    subprocess.run(["ip", "-n", n1.netns, "route", "del", "10.244.2.0/24"], check=True)
    namespaces.run_in(n1.netns, ["bridge", "fdb", "del", vtep_mac("node-3"), "dev", "na-vxlan"], check=True)
    assert silent(n1, n2) and silent(n1, n3)
    report = n1.routes.sync_all(lab.peers_of(n1))
    assert (report.added, report.removed, report.unchanged) == (2, 0, 4)
    assert ping(n1, n2) and ping(n1, n3)

    ip_batch(n1.netns, ["link set na-vxlan address 02:00:00:00:00:01", "link set na-vxlan mtu 1400",
                        "addr add 10.9.9.9/24 dev na-vxlan"])
    n1.routes.ensure_local()  # fixed in place; the kernel flushed the neighbours and they are put back
    (link,) = ip_json(n1.netns, "addr", "show", "na-vxlan")
    assert (link["address"], link["mtu"], [a["local"] for a in link["addr_info"] if a["family"] == "inet"]) == \
        (vtep_mac("node-1"), 1450, ["10.244.1.0"])
    assert len(our_routes(n1.netns)) == 2 and ping(n1, n2)

    subprocess.run(["ip", "-n", n1.netns, "link", "del", "na-vxlan"], check=True)
    assert our_routes(n1.netns) == {} and silent(n1, n2)
    report = n1.routes.sync_all(lab.peers_of(n1))
    assert report.added == 6
    (link,) = ip_json(n1.netns, "link", "show", "na-vxlan")
    assert link["address"] == vtep_mac("node-1")  # peers' FDB entries stay valid
    assert_full_mesh(lab)


def test_the_kernel_object_stays_in_its_namespace_whatever_thread_calls_it(lab):
    """pyroute2 0.9 opens a socket per calling thread, in that thread's namespace: we must not follow it."""
    n1, n2 = lab.add_node(), lab.add_node()
    decoy = lab.new_namespace("decoy")  # the calling thread sits here: anything written here is a bug
    for node in lab.nodes:
        lab.start(node, RoutingSettings(mode=Mode.VXLAN))
    outcome = {}

    def sync_from_another_thread():
        fd = os.open(namespaces.netns_path(decoy), os.O_RDONLY | os.O_CLOEXEC)
        try:
            with entered(fd):
                outcome["reports"] = [node.routes.sync_all(lab.peers_of(node)) for node in lab.nodes]
        except Exception as exc:  # reported below with the assertion
            outcome["error"] = exc
        finally:
            os.close(fd)

    worker = threading.Thread(target=sync_from_another_thread)
    worker.start()
    worker.join(timeout=120)
    assert "error" not in outcome, outcome.get("error")
    assert [r.added for r in outcome["reports"]] == [3, 3]
    assert [link["ifname"] for link in ip_json(decoy, "link", "show")] == ["lo"]
    assert ip_json(decoy, "route", "show", "table", "all", "proto", str(ROUTE_PROTOCOL)) == []
    assert ping(n1, n2) and ping(n2, n1)


def test_a_removed_node_loses_route_neighbour_and_fdb_entry(lab):
    n1, n2, n3 = lab.add_node(), lab.add_node(), lab.add_node()
    lab.start_all(RoutingSettings(mode=Mode.VXLAN))
    report = n1.routes.apply_changes(upserts=[], removals=["node-3"])
    assert (report.added, report.removed) == (0, 3)
    assert set(our_routes(n1.netns)) == {"10.244.2.0/24"}
    assert [n["dst"] for n in ip_json(n1.netns, "neigh", "show", "dev", "na-vxlan")] == ["10.244.2.0"]
    assert [e["mac"] for e in fdb_json(n1.netns, "na-vxlan")] == [vtep_mac("node-2")]
    assert ping(n1, n2) and silent(n1, n3)


def test_mode_switch_on_restart_leaves_only_the_new_modes_objects(lab):
    n1, n2 = lab.add_node(), lab.add_node()
    lab.start_all(RoutingSettings(mode=Mode.VXLAN))
    for node in lab.nodes:
        lab.start(node, RoutingSettings(mode=Mode.HOST_GW))
        node.routes.sync_all(lab.peers_of(node))
    assert our_links(n1.netns) == []
    assert our_routes(n1.netns) == {"10.244.2.0/24": ("192.0.2.2", "eth0", False)}
    assert ping(n1, n2) and ping(n2, n1)


def test_cleanup_removes_ours_and_nothing_else(lab):
    n1, _, _ = lab.add_node(segment="a"), lab.add_node(segment="a"), lab.add_node(segment="b")
    ip_batch(n1.netns, ["route add 10.200.0.0/16 via 192.0.2.254 proto static",
                        "route add 10.244.3.0/24 via 192.0.2.254 metric 500 proto static",  # same dst as ours
                        "link add na-other type bridge"])
    lab.start_all(RoutingSettings(mode=Mode.AUTO))
    assert our_routes(n1.netns) == {"10.244.2.0/24": ("192.0.2.2", "eth0", False),
                                    "10.244.3.0/24": ("10.244.3.0", "na-vxlan", True)}
    assert our_links(n1.netns) == ["na-other", "na-vxlan"]
    assert n1.routes.sync_all(lab.peers_of(n1)).unchanged == 4  # the foreign route is neither ours nor stale
    n1.routes.cleanup()
    assert our_routes(n1.netns) == {}
    assert our_links(n1.netns) == ["na-other"]
    remaining = {(r["dst"], r.get("metric", 0)): r.get("protocol") for r in ip_json(n1.netns, "route", "show")}
    assert remaining[("10.200.0.0/16", 0)] == remaining[("10.244.3.0/24", 500)] == "static"
    assert {("192.0.2.0/24", 0), ("10.244.1.0/24", 0), ("198.51.100.0/24", 0)} <= set(remaining)


def _kernel_has_ipip(netns: str) -> bool:
    probe = subprocess.run(["ip", "-n", netns, "link", "add", "na-probe", "type", "ipip", "local", "192.0.2.1"],
                           capture_output=True, text=True)
    if probe.returncode == 0:
        subprocess.run(["ip", "-n", netns, "link", "del", "na-probe"], check=True)
        return True
    assert re.search(r"Unknown device type|not supported", probe.stderr, re.I), probe.stderr
    return False


def test_ipip_and_auto_with_ipip_pods_reach_each_other(lab):
    n1, _, _ = lab.add_node(segment="a"), lab.add_node(segment="a"), lab.add_node(segment="b")
    if not _kernel_has_ipip(n1.netns):
        pytest.skip("this kernel lacks IPIP (CONFIG_NET_IPIP)")
    reports = lab.start_all(RoutingSettings(mode=Mode.IPIP))
    assert all(r.peers_by_mode["ipip"] == 2 for r in reports.values())
    (link,) = ip_json(n1.netns, "-d", "link", "show", "na-ipip")
    assert (link["linkinfo"]["info_kind"], link["linkinfo"]["info_data"].get("local"), link["mtu"]) == \
        ("ipip", "192.0.2.1", 1480)
    assert our_routes(n1.netns) == {"10.244.2.0/24": ("192.0.2.2", "na-ipip", True),
                                    "10.244.3.0/24": ("198.51.100.3", "na-ipip", True)}
    assert_full_mesh(lab)
    reports = lab.start_all(RoutingSettings(mode=Mode.AUTO, auto_encap=Mode.IPIP))  # every node restarts in auto
    assert reports["node-1"].peers_by_mode == {"host-gw": 1, "vxlan": 0, "ipip": 1}
    assert our_routes(n1.netns) == {"10.244.2.0/24": ("192.0.2.2", "eth0", False),
                                    "10.244.3.0/24": ("198.51.100.3", "na-ipip", True)}
    assert_full_mesh(lab)


@pytest.mark.parametrize("mode", [Mode.VXLAN, Mode.HOST_GW], ids=lambda m: m.value)
def test_thousand_peers_timings(lab, mode, capsys):
    """Not a benchmark gate: counts are asserted, timings are printed for the report."""
    netns = lab.new_namespace("big")
    ip_batch(netns, ["link add eth0 type veth peer name eth1", "addr add 172.31.0.1/16 dev eth0",
                     "link set eth0 up", "link set eth1 up"])
    local = LocalNode(name="big", vtep_mac=vtep_mac("big"), public_ip=IPv4Address("172.31.0.1"), underlay_ifname="eth0",
                      underlay_network=IPv4Network("172.31.0.0/16"), underlay_mtu=1500,
                      pod_cidrs=(IPv4Network("10.99.0.0/24"),))
    peers = [Peer(name=f"n{i:04}", public_ip=IPv4Address(f"172.31.{4 + i // 250}.{i % 250 + 1}"),
                  pod_cidrs=(IPv4Network(f"10.{100 + i // 256}.{i % 256}.0/24"),), vtep_mac=vtep_mac(f"n{i:04}"))
             for i in range(1000)]
    routes = RouteManager(kernel=lab.kernel_in(netns), settings=RoutingSettings(mode=mode), local=local,
                          bounds=BOUNDS)
    routes.ensure_local()
    per_peer = 3 if mode is Mode.VXLAN else 1
    started = time.perf_counter()
    fresh = routes.sync_all(peers)
    fresh_s = time.perf_counter() - started
    started = time.perf_counter()
    noop = routes.sync_all(peers)
    noop_s = time.perf_counter() - started
    newcomer = Peer(name="n9999", public_ip=IPv4Address("172.31.200.1"), pod_cidrs=(IPv4Network("10.250.0.0/24"),),
                    vtep_mac=vtep_mac("n9999"))
    started = time.perf_counter()
    one = routes.apply_changes(upserts=[newcomer], removals=[])
    one_s = time.perf_counter() - started
    assert fresh.added == 1000 * per_peer and (noop.added, noop.removed, noop.unchanged) == (0, 0, 1000 * per_peer)
    assert (one.added, one.removed) == (per_peer, 0)
    assert len(our_routes(netns)) == 1001
    with capsys.disabled():
        print(f"\n[{mode.value}] 1,000 peers: sync_all fresh {fresh_s:.2f} s, no-op {noop_s:.2f} s; "
              f"apply_changes one peer {one_s * 1000:.1f} ms")


def test_the_underlay_is_read_in_the_kernels_own_namespace(lab):
    """The agent chooses its underlay from `NetlinkKernel.underlay_snapshot()`: the node's links,
    addresses and default route, read in the namespace the kernel object was built in (this
    thread is in another)."""
    node = lab.add_node()
    ip_batch(node.netns, [f"route add default via {SEGMENTS['a'].network_address + ROUTER_HOST}"])
    snapshot = lab.kernel_in(node.netns).underlay_snapshot()
    assert {info.name for info in snapshot.interfaces} == {"lo", "eth0", "pod0"}
    chosen = choose_underlay(snapshot)
    assert (chosen.ifname, chosen.public_ip, chosen.network) == ("eth0", node.public_ip, SEGMENTS["a"])


FAMILIES = [pytest.param(V4, id="ipv4"), pytest.param(V6, id="ipv6"), pytest.param(DUAL, id="dual")]


@pytest.mark.parametrize("lab", FAMILIES, indirect=True)
@pytest.mark.parametrize("mode", [Mode.HOST_GW, Mode.VXLAN, Mode.AUTO], ids=lambda m: m.value)
def test_pods_reach_each_other_per_family(lab, mode):
    """Every family's pods reach every other node's: host-gw and vxlan on one segment, auto across
    two (host-gw to the neighbour, vxlan over the router); one manager per family per node."""
    lab.add_node(segment="a"), lab.add_node(segment="a"), lab.add_node(segment="b" if mode is Mode.AUTO else "a")
    reports = lab.start_all_families(RoutingSettings(mode=mode))
    for name, by_family in reports.items():
        for family, report in by_family.items():
            assert not report.refused and not report.pending, (name, family, report)
            want = {Mode.HOST_GW: {"host-gw": 2}, Mode.VXLAN: {"vxlan": 2},
                    Mode.AUTO: {"host-gw": 1, "vxlan": 1} if name != "node-3" else {"vxlan": 2}}[mode]
            assert {m: n for m, n in report.peers_by_mode.items() if n} == want, (name, family)
    assert_full_mesh(lab)
    n1 = lab.nodes[0]
    links = {Mode.HOST_GW: [], Mode.VXLAN: ["na-vxlan"], Mode.AUTO: ["na-vxlan"]}[mode]
    assert our_links(n1.netns) == sorted(("na-vxlan6" if f is IpFamily.V6 else name)
                                         for f in lab.families for name in links)
    if IpFamily.V6 not in lab.families:
        return
    routes6 = {r["dst"]: (r.get("gateway"), r["dev"]) for r in ip_json(n1.netns, "-6", "route", "show", "proto",
                                                                         str(ROUTE_PROTOCOL))}
    direct = ("2001:db8:a::2", "eth0")
    tunnel = ("fd00:10:244:3::", "na-vxlan6")
    assert routes6["fd00:10:244:2::/64"] == (direct if mode is not Mode.VXLAN else ("fd00:10:244:2::", "na-vxlan6"))
    assert routes6["fd00:10:244:3::/64"] == (("2001:db8:a::3", "eth0") if mode is Mode.HOST_GW else tunnel)
    if mode is Mode.HOST_GW:
        return
    (link,) = ip_json(n1.netns, "-d", "link", "show", "na-vxlan6")
    assert (link["linkinfo"]["info_data"]["local6"], link["mtu"], link["address"]) == \
        ("2001:db8:a::1", 1430, vtep_mac("node-1", IpFamily.V6))
    assert (vtep_mac("node-3", IpFamily.V6), str(lab.nodes[2].public_ip6)) in \
        {(e["mac"], e["dst"]) for e in fdb_json(n1.netns, "na-vxlan6")}
    neighbours = {(n["dst"], n["lladdr"]) for n in ip_json(n1.netns, "-6", "neigh", "show", "dev", "na-vxlan6")
                  if "PERMANENT" in n["state"]}
    assert ("fd00:10:244:3::", vtep_mac("node-3", IpFamily.V6)) in neighbours
    # a restart adopts both families without a write
    for node in lab.nodes:
        for manager in node.managers.values():
            again = manager.sync_all(lab.peers_of(node))
            assert (again.added, again.removed) == (0, 0)


@pytest.mark.parametrize("lab", [pytest.param(DUAL, id="dual")], indirect=True)
def test_a_peer_with_a_malformed_ipv6_announcement_keeps_its_ipv4_routes(lab):
    n1, n2 = lab.add_node(), lab.add_node()
    settings = RoutingSettings(mode=Mode.VXLAN)
    for node in (n1, n2):
        lab.start(node, settings)
    import dataclasses
    bad = dataclasses.replace(n2.as_peer(), public_ipv6=None, ipv6_problem="announced public IPv6 'fe80::1' is not global")
    v4, v6 = n1.managers[IpFamily.V4].sync_all([bad]), n1.managers[IpFamily.V6].sync_all([bad])
    n2.managers[IpFamily.V4].sync_all(lab.peers_of(n2))
    assert v4.peers_by_mode["vxlan"] == 1 and "fe80::1" in v6.refused["node-2"].reason
    assert ping(n1, n2, IpFamily.V4) and silent_v6(n1, n2)
    assert our_links(n1.netns) == ["na-vxlan", "na-vxlan6"]


def silent_v6(src: Node, dst: Node) -> bool:
    return namespaces.run_in(src.pod_netns, ["ping", "-c", "1", "-W", "1",
                                             dst.pod_ip_of(IpFamily.V6)]).returncode != 0

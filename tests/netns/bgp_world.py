"""Nodes that route pods over BGP with real BIRD, in namespaces: for tests/netns/test_bgp*.py.

`BgpWorld(n)` makes a switch namespace (one bridge) and, per node, a node namespace on it
(underlay `u0`, 192.168.60.(10+i)/24) and a pod namespace behind a veth (the pod 10.244.(i+1).2,
the node's side 10.244.(i+1).1/24, default route through it). Each node runs the agent's BGP part
as the agent drives it: a `BirdSupervisor` (BIRD in the node namespace, its own socket and
state directory), a `BgpSpeaker` configured from the cluster's view, and the `RouteManager` in
`bgp` mode copying admitted learnt routes into main (protocol 78) from a `SyncRunner` poked by
netlink route notifications of our table. Nothing else: no tunnel device is ever made.
"""
from __future__ import annotations

import os
import subprocess
import tempfile
from ipaddress import IPv4Address, IPv4Network

from netagent.infra.sync_runner import SyncKind, SyncRunner
from netagent.kernel import namespaces
from netagent.noderoutes.bgp.learnt import NetlinkLearntRoutes
from netagent.noderoutes.bgp.speaker import BgpSpeaker
from netagent.noderoutes.bgp.supervisor import BirdSupervisor
from netagent.noderoutes.bgp.topology import BgpNode, TopologySettings
from netagent.noderoutes.routing.kernel import NetlinkKernel
from netagent.noderoutes.routing.model import LocalNode, Mode, Peer, PeerBounds, RoutingSettings
from netagent.noderoutes.routing.routes import RouteManager
from netagent.noderoutes.routing.vxlan import vtep_mac
from tests.netns.topology import NamespaceTopology

CLUSTER = IPv4Network("10.244.0.0/16")
UNDERLAY = IPv4Network("192.168.60.0/24")
BOUNDS = PeerBounds(cluster_cidrs=(CLUSTER,))


def node_address(i: int) -> IPv4Address:
    return IPv4Address(f"192.168.60.{10 + i}")


def pod_cidr(i: int) -> IPv4Network:
    return IPv4Network(f"10.244.{i + 1}.0/24")


def pod_address(i: int) -> str:
    return f"10.244.{i + 1}.2"


class BgpNodeRunner:
    """One node's BGP part, in its namespace."""

    def __init__(self, world: BgpWorld, i: int, state_dir: str) -> None:
        self.i, self.world = i, world
        self.ns = world.names[f"n{i}"]
        self.bird = BirdSupervisor(state_dir, launcher=tuple(namespaces.exec_prefix(self.ns)))
        fd = os.open(namespaces.netns_path(self.ns), os.O_RDONLY | os.O_CLOEXEC)
        try:
            with namespaces.entered(fd):
                self.kernel = NetlinkKernel()
                learnt = NetlinkLearntRoutes()
        finally:
            os.close(fd)
        self.speaker = BgpSpeaker(bird=self.bird, learnt=learnt, topology=world.topology)
        self.me = BgpNode(f"node{i}", world.node_address(i), (pod_cidr(i),), reflector=i in world.reflectors)
        self.network = world.underlay(i)
        local = LocalNode(name=self.me.name, public_ip=self.me.address, underlay_ifname="u0",
                          underlay_network=self.network, underlay_mtu=1500, pod_cidrs=self.me.cidrs,
                          vtep_mac=vtep_mac(self.me.name))  # what the peers' `Peer`s announce for it
        self.routes = RouteManager(kernel=self.kernel, settings=RoutingSettings(mode=world.mode), local=local,
                                   bounds=BOUNDS, learnt=self.speaker.learnt)
        self.routes.ensure_local()
        self.admitted: list = []
        self.runner = SyncRunner(name=f"bgp-{i}", sync=self._sync, min_interval=0.0, max_interval=30.0,
                                 retry_interval=0.5)

    def _sync(self, kind: SyncKind) -> None:
        peers = [Peer(name=n.name, public_ip=n.address, pod_cidrs=n.cidrs, vtep_mac=vtep_mac(n.name))
                 for n in self.admitted]
        report = self.routes.sync_all(peers)
        self.report = report
        admitted = [n for n in self.admitted if n.name not in report.refused]  # as the plan admitted them
        self.speaker.configure(self.me, admitted, local_network=self.network)

    def start(self, admitted) -> None:
        self.admitted = list(admitted)
        self.speaker.watch_learnt(lambda: self.runner.request(SyncKind.PARTIAL))
        self.runner.start()
        self.sync_now()

    def sync_now(self) -> None:
        from netagent.infra.sync_runner import SyncResult
        assert self.runner.run_now_and_wait(timeout=60, kind=SyncKind.FULL) is SyncResult.SUCCEEDED, \
            self.runner.status().last_error

    def set_admitted(self, admitted) -> None:
        self.admitted = list(admitted)
        self.sync_now()

    def main_routes(self) -> dict:
        return {str(r.dst): str(r.gateway) for r in self.kernel.dump_routes()}

    def table_routes(self) -> dict:
        return {str(dst): str(r.gateway) for dst, r in self.speaker.learnt().items()}

    def close(self) -> None:
        self.runner.stop(timeout=10)
        self.speaker.stop(withdraw=True)
        self.kernel.close()


class BgpWorld(NamespaceTopology):
    def __init__(self, count: int, *, reflectors=(), topology: TopologySettings | None = None,
                 mode: Mode = Mode.BGP, extra_roles=()) -> None:
        self.count = count
        self.mode = mode
        self.reflectors = set(reflectors)
        self.topology = topology or TopologySettings()
        self.nodes: list[BgpNodeRunner] = []
        self._state = tempfile.TemporaryDirectory(prefix="na-bgp-")
        super().__init__(["sw"] + [f"n{i}" for i in range(count)] + [f"p{i}" for i in range(count)]
                         + list(extra_roles))

    def node_address(self, i: int) -> IPv4Address:
        return node_address(i)

    def underlay(self, i: int) -> IPv4Network:
        return UNDERLAY

    def _build(self) -> None:
        self._wire_underlay()
        self._wire_pods()
        for i in range(self.count):
            self.nodes.append(BgpNodeRunner(self, i, f"{self._state.name}/n{i}"))

    def _wire_underlay(self) -> None:
        """Every node's `u0` on one bridge in `sw`."""
        sw = self.names["sw"]
        self.run("sw", "ip", "link", "add", "br0", "type", "bridge")
        self.run("sw", "ip", "link", "set", "br0", "up")
        for i in range(self.count):
            node, pod = self.names[f"n{i}"], self.names[f"p{i}"]
            subprocess.run(["ip", "link", "add", "u0", "netns", node, "type", "veth", "peer", f"s{i}", "netns", sw],
                           check=True)
            self.run("sw", "ip", "link", "set", f"s{i}", "master", "br0", "up")
            self.run(f"n{i}", "ip", "addr", "add", f"{node_address(i)}/24", "dev", "u0")

    def _wire_pods(self) -> None:
        for i in range(self.count):
            node, pod = self.names[f"n{i}"], self.names[f"p{i}"]
            self.run(f"n{i}", "ip", "link", "set", "u0", "up")
            self.run(f"n{i}", "ip", "link", "set", "lo", "up")
            self.run(f"n{i}", "sysctl", "-qw", "net.ipv4.ip_forward=1")
            subprocess.run(["ip", "link", "add", "pod", "netns", node, "type", "veth", "peer", "eth0", "netns", pod],
                           check=True)
            self.run(f"n{i}", "ip", "addr", "add", f"10.244.{i + 1}.1/24", "dev", "pod")
            self.run(f"n{i}", "ip", "link", "set", "pod", "up")
            self.run(f"p{i}", "ip", "addr", "add", f"{pod_address(i)}/24", "dev", "eth0")
            self.run(f"p{i}", "ip", "link", "set", "eth0", "up")
            self.run(f"p{i}", "ip", "link", "set", "lo", "up")
            self.run(f"p{i}", "ip", "route", "add", "default", "via", f"10.244.{i + 1}.1")

    def view(self, *, without=()) -> list:
        return [n.me for n in self.nodes if n.i not in without]

    def start(self) -> None:
        for node in self.nodes:
            node.start(self.view())

    def ping(self, src: int, dst: int, *, count: int = 1) -> bool:
        done = namespaces.run_in(self.names[f"p{src}"], ["ping", "-n", "-q", "-c", str(count), "-W", "1",
                                                         pod_address(dst)], timeout=30)
        return done.returncode == 0

    def close(self) -> None:
        for node in self.nodes:
            try:
                node.close()
            except Exception:  # the namespaces go anyway
                pass
        super().close()
        self._state.cleanup()

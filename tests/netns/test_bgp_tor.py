"""Two segments joined by a top-of-rack router that speaks BGP (real BIRD, AS 65000): nodes in
`auto` mode beside BIRD route to the other segment's pods over the BGP-learnt route (no tunnel
packet), and fall back to VXLAN through the router once the router's BIRD is gone; in `bgp` mode
the same pods talk with no tunnel device at all.

Every BIRD runs in a namespace this test made; the router's configuration is the test's own
(a ToR is not a node: it accepts and re-announces the cluster's /24s, eBGP both ways).
"""
from __future__ import annotations

import shutil
import subprocess
import tempfile
from ipaddress import IPv4Address, IPv4Network
from pathlib import Path

import pytest

from netagent.kernel import namespaces
from netagent.noderoutes.bgp.model import GracefulRestart, Timers
from netagent.noderoutes.bgp.topology import ExternalPeer, TopologySettings
from netagent.noderoutes.routing.model import Mode
from tests.cluster.lab_tools import wait_for
from tests.netns.bgp_world import BgpWorld, pod_cidr

pytestmark = pytest.mark.skipif(shutil.which("bird") is None, reason="bird2 is not installed")

SEGMENTS = (IPv4Network("192.168.61.0/24"), IPv4Network("192.168.62.0/24"))
ROUTER = tuple(IPv4Address(f"192.168.6{s + 1}.1") for s in (0, 1))
TOR = TopologySettings(mesh=False, timers=Timers(hold=3, keepalive=1, connect_retry=1),
                       graceful_restart=GracefulRestart(restart_time=5, wait=10),
                       external=tuple(ExternalPeer(ROUTER[s], 65000, subnet=SEGMENTS[s]) for s in (0, 1)))

ROUTER_CONFIG = """router id 192.168.61.1;
protocol device { scan time 10; }
protocol kernel { ipv4 { import none; export all; }; }
filter cluster_routes { if net ~ [ 10.244.0.0/16{24,24} ] then accept; reject; }
""" + "".join(f"""protocol bgp node{i} {{
  local {ROUTER[i]} as 65000; neighbor 192.168.6{i + 1}.{10 + i} as 64512;
  hold time 3; keepalive time 1; connect delay time 1; connect retry time 1;
  ipv4 {{ import filter cluster_routes; export filter cluster_routes; }};
}}
""" for i in (0, 1))


class TorWorld(BgpWorld):
    """Node i on segment i (192.168.6<i+1>.<10+i>/24, default route via the router's .1)."""

    def __init__(self, mode: Mode) -> None:
        self.router_dir = tempfile.TemporaryDirectory(prefix="na-bgp-tor-")
        self.router: subprocess.Popen | None = None
        super().__init__(2, topology=TOR, mode=mode, extra_roles=("rtr",))

    def node_address(self, i: int) -> IPv4Address:
        return IPv4Address(f"192.168.6{i + 1}.{10 + i}")

    def underlay(self, i: int) -> IPv4Network:
        return SEGMENTS[i]

    def _wire_underlay(self) -> None:
        rtr = self.names["rtr"]
        self.run("rtr", "sysctl", "-qw", "net.ipv4.ip_forward=1")
        self.run("rtr", "ip", "link", "set", "lo", "up")
        for i in (0, 1):
            subprocess.run(["ip", "link", "add", "u0", "netns", self.names[f"n{i}"], "type", "veth", "peer",
                            f"seg{i}", "netns", rtr], check=True)
            self.run("rtr", "ip", "addr", "add", f"{ROUTER[i]}/24", "dev", f"seg{i}")
            self.run("rtr", "ip", "link", "set", f"seg{i}", "up")
            self.run(f"n{i}", "ip", "addr", "add", f"{self.node_address(i)}/24", "dev", "u0")
            self.run(f"n{i}", "ip", "link", "set", "u0", "up")
            self.run(f"n{i}", "ip", "route", "add", "default", "via", str(ROUTER[i]))
        conf = Path(self.router_dir.name) / "bird.conf"
        conf.write_text(ROUTER_CONFIG)
        self.router = subprocess.Popen([*namespaces.exec_prefix(rtr), "bird", "-f", "-c", str(conf), "-s",
                                        str(Path(self.router_dir.name) / "bird.ctl")],
                                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def stop_router_bird(self) -> None:
        if self.router is not None and self.router.poll() is None:
            self.router.terminate()  # SIGTERM: BIRD tells the nodes, which withdraw what it gave them
            self.router.wait(timeout=30)

    def close(self) -> None:
        self.stop_router_bird()
        super().close()
        self.router_dir.cleanup()


def vxlan_tx_packets(world: BgpWorld, i: int) -> int:
    path = "/sys/class/net/na-vxlan/statistics/tx_packets"
    return int(namespaces.run_in(world.names[f"n{i}"], ["cat", path], check=True).stdout)


def test_bgp_mode_across_a_tor_router_needs_no_tunnel():
    with TorWorld(Mode.BGP) as world:
        world.start()
        wait_for(lambda: str(pod_cidr(1)) in world.nodes[0].main_routes()
                 and str(pod_cidr(0)) in world.nodes[1].main_routes(), what="routes through the ToR")
        assert world.nodes[0].main_routes()[str(pod_cidr(1))] == "192.168.61.1"  # next hop: the router
        assert wait_for(lambda: world.ping(0, 1), what="pod 0 -> pod 1 across the router")
        links = namespaces.run_in(world.names["n0"], ["ip", "-d", "-o", "link"], check=True).stdout
        assert "vxlan" not in links and "ipip" not in links


def test_auto_prefers_the_learnt_route_and_falls_back_to_vxlan_without_one():
    with TorWorld(Mode.AUTO) as world:
        world.start()
        node = world.nodes[0]
        wait_for(lambda: node.main_routes().get(str(pod_cidr(1))) == "192.168.61.1", what="the BGP route in main")
        assert wait_for(lambda: world.ping(0, 1), what="pod 0 -> pod 1 over the BGP route")
        before = vxlan_tx_packets(world, 0)
        assert world.ping(0, 1, count=5)
        assert vxlan_tx_packets(world, 0) == before  # not one packet through the tunnel
        assert node.report.peers_by_mode["bgp"] == 1
        world.stop_router_bird()  # no BGP route any more: encapsulation to the peer's public IP
        wait_for(lambda: node.main_routes().get(str(pod_cidr(1))) == "10.244.2.0", what="the VXLAN route")
        assert wait_for(lambda: world.ping(0, 1), what="pod 0 -> pod 1 through VXLAN")
        assert vxlan_tx_packets(world, 0) > before

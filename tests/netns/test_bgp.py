"""BGP routing with real BIRD 2 in namespaces: pods on 4 nodes reach each other with no tunnel,
route reflectors, a killed BIRD restarted with forwarding kept, a node removed, a configuration
change with no session reset, and import filters on what a rogue peer announces.

Every BIRD runs in a node namespace this test made (never port 179 in the root namespace);
the node side is the agent's BGP part (`tests/netns/bgp_world.py`).
"""
from __future__ import annotations

import dataclasses
import shutil
import subprocess
from ipaddress import IPv4Address, IPv4Network

import pytest

from netagent.kernel import namespaces
from netagent.noderoutes.bgp.bird_config import render_bird_config
from netagent.noderoutes.bgp.control import BirdError
from netagent.noderoutes.bgp.model import GracefulRestart, Timers
from netagent.noderoutes.bgp.topology import ExternalPeer, TopologySettings, compose_node_config
from tests.cluster.lab_tools import wait_for as lab_wait_for
from tests.netns.bgp_world import UNDERLAY, BgpWorld, pod_address, pod_cidr

pytestmark = pytest.mark.skipif(shutil.which("bird") is None, reason="bird2 is not installed")

FAST = TopologySettings(timers=Timers(hold=3, keepalive=1, connect_retry=1),
                        graceful_restart=GracefulRestart(restart_time=120, wait=30))
DEADLINE = 90.0


def wait_for(predicate, *, what: str, timeout: float = DEADLINE):
    return lab_wait_for(predicate, what=what, timeout=timeout, interval=0.1)


def all_routed(world: BgpWorld, nodes=None) -> bool:
    nodes = list(nodes if nodes is not None else range(world.count))
    for i in nodes:
        want = {str(pod_cidr(j)) for j in nodes if j != i}
        if not want <= set(world.nodes[i].main_routes()):
            return False
    return True


def sessions_up(world: BgpWorld, i: int, count: int) -> bool:
    try:
        sessions = world.nodes[i].speaker.sessions()
    except BirdError:  # BIRD is (re)starting: its socket is not there yet
        return False
    return len(sessions) == count and all(s.up for s in sessions)


def bird_argv(node) -> list:
    with open(f"/proc/{node.bird.pid}/cmdline") as cmdline:
        return cmdline.read().split("\0")


def no_tunnel_devices(world: BgpWorld) -> None:
    for i in range(world.count):
        links = namespaces.run_in(world.names[f"n{i}"], ["ip", "-d", "-o", "link"], check=True).stdout
        assert "vxlan" not in links and "ipip" not in links, links


def test_full_mesh_of_four_nodes_routes_pods_without_a_tunnel():
    with BgpWorld(4, topology=FAST) as world:
        world.start()
        wait_for(lambda: all_routed(world), what="every pod CIDR routed on every node")
        for i in range(4):
            assert sessions_up(world, i, 3)
            routes = world.nodes[i].main_routes()
            for j in range(4):
                if j != i:  # next hop: the peer itself, on the shared segment
                    assert routes[str(pod_cidr(j))] == f"192.168.60.{10 + j}"
        for src in range(4):
            for dst in range(4):
                if src != dst:
                    assert wait_for(lambda: world.ping(src, dst), what=f"pod {src} -> pod {dst}")
        no_tunnel_devices(world)
        assert "-R" not in bird_argv(world.nodes[0])  # a first start recovers nothing
        for i in range(4):  # each node's own CIDR: a blackhole of ours behind the connected route
            holes = namespaces.run_in(world.names[f"n{i}"], ["ip", "route", "show", "type", "blackhole"],
                                      check=True).stdout
            assert holes.split() == ["blackhole", str(pod_cidr(i)), "proto", "78", "metric", str(0xFF000000)], holes


def test_route_reflectors_two_reflectors_four_clients():
    with BgpWorld(6, reflectors=(0, 1), topology=FAST) as world:
        world.start()
        wait_for(lambda: all_routed(world), what="every pod CIDR routed on every node")
        for client in range(2, 6):
            sessions = world.nodes[client].speaker.sessions()
            assert sorted(s.neighbor for s in sessions) == ["192.168.60.10", "192.168.60.11"]
        assert sessions_up(world, 0, 5) and sessions_up(world, 1, 5)
        for src, dst in ((2, 5), (5, 3), (4, 0), (1, 2)):
            assert wait_for(lambda: world.ping(src, dst), what=f"pod {src} -> pod {dst}")
        # clients route to each other directly: the reflectors pass the clients' next hops on
        assert world.nodes[2].main_routes()[str(pod_cidr(5))] == "192.168.60.15"
        no_tunnel_devices(world)


STREAM_PACKETS = 600


def ping_stream(world: BgpWorld, src: int, dst: int) -> subprocess.Popen:
    """`STREAM_PACKETS` pings, one every 50 ms, each answered within 2 s or lost."""
    return subprocess.Popen([*namespaces.exec_prefix(world.names[f"p{src}"]), "ping", "-n", "-i", "0.05", "-W", "2",
                             "-c", str(STREAM_PACKETS), pod_address(dst)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def finish_stream(stream: subprocess.Popen) -> tuple:
    output, _ = stream.communicate(timeout=300)
    summary = next(line for line in output.splitlines() if "packets transmitted" in line)
    sent, received = int(summary.split()[0]), int(summary.split(", ")[1].split()[0])
    return sent, received


def test_bird_killed_and_restarted_by_the_supervisor_keeps_forwarding():
    with BgpWorld(2, topology=FAST) as world:
        world.start()
        wait_for(lambda: all_routed(world), what="both pod CIDRs routed")
        wait_for(lambda: world.ping(0, 1), what="pod 0 -> pod 1")
        supervisor = world.nodes[0].bird
        stream = ping_stream(world, 0, 1)
        wait_for(lambda: world.ping(1, 0), what="stream running")  # one exchange while it runs
        old_pid = supervisor.pid
        subprocess.run(["kill", "-9", str(old_pid)], check=True)
        wait_for(lambda: supervisor.health().restarts == 1 and supervisor.pid not in (None, old_pid),
                 what="the supervisor to start BIRD again")
        wait_for(lambda: sessions_up(world, 0, 1) and sessions_up(world, 1, 1), what="the session back up")
        wait_for(lambda: sessions_up(world, 0, 1) and world.nodes[0].speaker.sessions()[0].imported == 1,
                 what="routes re-learnt")
        assert stream.poll() is None, "the stream ended before BIRD was back: nothing was tested"
        sent, received = finish_stream(stream)
        assert sent == STREAM_PACKETS and received == sent, f"{sent - received} of {sent} packets lost across the restart"
        assert all_routed(world)


def test_agent_restart_keeps_forwarding_and_bird_recovers_gracefully():
    from tests.netns.bgp_world import BgpNodeRunner
    with BgpWorld(2, topology=FAST) as world:
        world.start()
        wait_for(lambda: all_routed(world), what="both pod CIDRs routed")
        wait_for(lambda: world.ping(0, 1), what="pod 0 -> pod 1")
        old = world.nodes[0]
        stream = ping_stream(world, 0, 1)
        wait_for(lambda: world.ping(1, 0), what="stream running")
        old.runner.stop(timeout=10)
        old.speaker.stop(withdraw=False)  # the agent exits: SIGKILL, peers hold our routes
        old.kernel.close()
        new = world.nodes[0] = BgpNodeRunner(world, 0, str(old.bird.state_dir))
        new.start(world.view())           # a pid file was left: BIRD starts with -R
        wait_for(lambda: sessions_up(world, 0, 1) and new.speaker.sessions()[0].imported == 1,
                 what="the new agent's BIRD back in session")
        assert str(pod_cidr(1)) in new.main_routes()
        assert "-R" in bird_argv(new)
        assert stream.poll() is None, "the stream ended before the restart was over: nothing was tested"
        sent, received = finish_stream(stream)
        assert received == sent == STREAM_PACKETS, f"{sent - received} of {sent} packets lost across the restart"


def test_node_removed_is_withdrawn_everywhere():
    with BgpWorld(4, topology=FAST) as world:
        world.start()
        wait_for(lambda: all_routed(world), what="every pod CIDR routed on every node")
        for i in range(3):  # node 3's Node object is deleted: every other agent drops it
            world.nodes[i].set_admitted(world.view(without=(3,)))
        gone = str(pod_cidr(3))
        wait_for(lambda: all(gone not in world.nodes[i].main_routes() and gone not in world.nodes[i].table_routes()
                             for i in range(3)), what="node 3's CIDR withdrawn from every peer")
        assert all_routed(world, range(3))


def test_node_lost_without_bfd_is_withdrawn_when_its_hold_time_runs_out():
    with BgpWorld(3, topology=FAST) as world:  # hold 3 s; graceful restart would hold routes 120 s
        world.start()
        wait_for(lambda: all_routed(world), what="every pod CIDR routed on every node")
        world.run("n2", "ip", "link", "set", "u0", "down")  # node 2 vanishes: no TCP close, no notification
        gone = str(pod_cidr(2))
        # an expired hold timer is a failure, not a restart: withdrawn, not kept as stale for 120 s
        wait_for(lambda: all(gone not in world.nodes[i].main_routes() and gone not in world.nodes[i].table_routes()
                             for i in range(2)), what="node 2's CIDR withdrawn on hold timer expiry", timeout=60)
        assert all_routed(world, range(2))


def test_node_lost_with_bfd_is_withdrawn_everywhere():
    topology = TopologySettings(timers=Timers(hold=30, keepalive=10, connect_retry=1), bfd=True,
                                graceful_restart=GracefulRestart(restart_time=120, wait=30))
    with BgpWorld(3, topology=topology) as world:
        world.start()
        wait_for(lambda: all_routed(world), what="every pod CIDR routed on every node")
        world.run("n2", "ip", "link", "set", "u0", "down")  # node 2 vanishes from the segment
        gone = str(pod_cidr(2))
        # the hold time is 30 s and graceful restart 120 s: only BFD takes it away this soon
        wait_for(lambda: all(gone not in world.nodes[i].main_routes() for i in range(2)),
                 what="node 2's CIDR withdrawn by BFD", timeout=20)
        assert all(s.up for s in world.nodes[0].speaker.sessions() if s.neighbor == "192.168.60.11")


def test_configuration_change_resets_no_session():
    with BgpWorld(3, topology=FAST) as world:
        world.start()
        wait_for(lambda: all_routed(world) and sessions_up(world, 0, 2), what="routes and sessions")
        node = world.nodes[0]
        before = {s.name: (s.since, s.bgp_state) for s in node.speaker.sessions()}
        pid = node.bird.pid
        text = node.speaker.last_text
        node.speaker.node_peers = (ExternalPeer(IPv4Address("192.168.60.250"), 65001, password="tor key"),)
        node.sync_now()
        assert node.speaker.last_text != text and node.bird.pid == pid
        after = {s.name: (s.since, s.bgp_state) for s in node.speaker.sessions()}
        assert {k: v for k, v in after.items() if k in before} == before
        assert len(after) == 3  # the new external session exists, the old ones untouched
        assert node.speaker.bird.apply_config(node.speaker.last_text) is False  # same text: no reload


def test_rogue_announcements_outside_the_cluster_or_of_another_node_are_filtered():
    with BgpWorld(3, topology=FAST) as world:
        world.start()
        wait_for(lambda: all_routed(world), what="every pod CIDR routed on every node")
        rogue, receiver = world.nodes[2], world.nodes[0]
        config = compose_node_config(rogue.me, world.view(), FAST, local_network=UNDERLAY)
        hostile = dataclasses.replace(config, own_cidrs=(
            pod_cidr(2), IPv4Network("10.99.0.0/24"), pod_cidr(1), pod_cidr(0), IPv4Network("10.244.3.128/25")))
        rogue.runner.stop(timeout=10)  # the rogue's agent no longer rewrites its BIRD
        assert rogue.bird.apply_config(render_bird_config(hostile))

        def from_rogue():
            return next(s for s in receiver.speaker.sessions() if s.neighbor == "192.168.60.12")
        # all five announced; the four that are not node 2's own CIDR refused by the import filter
        wait_for(lambda: from_rogue().updates_received >= 5 and from_rogue().updates_filtered == 4,
                 what="the rogue's announcements to arrive and be filtered")
        assert from_rogue().imported == 1
        table, main = receiver.table_routes(), receiver.main_routes()
        assert "10.99.0.0/24" not in table and "10.99.0.0/24" not in main
        assert "10.244.3.128/25" not in table and "10.244.3.128/25" not in main
        assert table[str(pod_cidr(1))] == "192.168.60.11"   # node 1's CIDR still from node 1
        assert str(pod_cidr(0)) not in table                  # our own never learnt
        assert main[str(pod_cidr(2))] == "192.168.60.12"


def test_status_bgp_and_cleanup_from_the_cli_in_a_node_namespace():
    import json
    import sys
    with BgpWorld(2, topology=FAST) as world:
        world.start()
        wait_for(lambda: all_routed(world), what="both pod CIDRs routed")
        node = world.nodes[0]
        state_dir = str(node.bird.state_dir)
        status = namespaces.run_in(world.names["n0"], [sys.executable, "-m", "netagent.cli", "status", "bgp",
                                                       "--json", "--bgp-state-dir", state_dir], check=True)
        [peer] = json.loads(status.stdout)["peers"]
        assert (peer["neighbor"], peer["as"], peer["bgpState"], peer["routesImported"]) == \
            ("192.168.60.11", 64512, "Established", 1)
        node.runner.stop(timeout=10)  # the agent is gone; what it left is cleaned up
        pid = node.bird.pid
        node.bird._stopping.set()     # and its supervisor no longer restarts BIRD
        out = namespaces.run_in(world.names["n0"], [sys.executable, "-m", "netagent.cli", "cleanup",
                                                    "--bgp-state-dir", state_dir], check=True).stdout
        assert "removed BIRD" in out and f"route {pod_cidr(1)} table 7878" in out and f"blackhole {pod_cidr(0)}" in out
        wait_for(lambda: not __import__("os").path.exists(f"/proc/{pid}"), what="our BIRD to exit")
        assert node.table_routes() == {} and node.main_routes() == {}
        assert namespaces.run_in(world.names["n0"], ["ip", "route", "show", "type", "blackhole"]).stdout == ""
        # SIGTERM: BIRD told its peer, which withdrew our CIDR at once (no graceful restart hold)
        wait_for(lambda: str(pod_cidr(0)) not in world.nodes[1].main_routes(), what="peer withdrew node 0's CIDR")

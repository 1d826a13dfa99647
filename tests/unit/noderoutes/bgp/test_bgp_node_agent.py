"""The node agent in `bgp` mode on the fakes: BIRD configured from the admitted Nodes in the
first sync, learnt routes copied into main (protocol 78) on the sync their arrival asks for,
the topology ConfigMap and the Node annotation parsed value by value (bad ones refused in scope
`bgp`, the rest applied), and /healthz unhealthy while BIRD is down."""
from __future__ import annotations

import dataclasses
import json
from ipaddress import IPv4Address, IPv4Network

import pytest

from netagent.infra.rejections import Rejections
from netagent.infra.sync_runner import SyncKind
from netagent.noderoutes.agent import AgentStartError
from netagent.noderoutes.bgp.cluster_config import PEERS_ANNOTATION, parse_node_peers, parse_topology
from netagent.noderoutes.bgp.fake_control import FakeBird
from netagent.noderoutes.bgp.fake_learnt import FakeLearntRoutes
from netagent.noderoutes.bgp.speaker import BgpSpeaker
from netagent.noderoutes.bgp.topology import REFLECTOR_LABEL, TopologySettings
from netagent.noderoutes.routing.model import Mode, Route
from tests.unit.noderoutes.node_agent_support import LOCAL_NAME, AgentWorld, node


class BgpWorld(AgentWorld):
    def __init__(self, *, config_map: dict | None = None, own_annotations: dict | None = None, peers=(2, 3)):
        own = node(LOCAL_NAME, 1)
        own["metadata"]["annotations"].update(own_annotations or {})
        outsider = node("node-9", 9, cidr="10.250.9.0/24")  # outside the cluster CIDR: never admitted
        super().__init__(mode=Mode.BGP, nodes=[own, outsider] + [node(f"node-{i}", i) for i in peers])
        self.bird, self.table = FakeBird(), FakeLearntRoutes()
        self.bgp_rejections = Rejections().scope("bgp")
        self.config_map = config_map
        self.speaker = BgpSpeaker(bird=self.bird, learnt=self.table, topology=TopologySettings(),
                                  rejections=self.bgp_rejections, topology_source=lambda: self.config_map)
        self.agent.host = dataclasses.replace(self.agent.host, bgp=self.speaker)
        self.agent.prepare()

    def sync(self, kind: SyncKind = SyncKind.PARTIAL) -> None:
        self.agent._sync(kind)


def learnt(i: int) -> Route:
    return Route(dst=IPv4Network(f"10.244.{i}.0/24"), gateway=IPv4Address(f"198.18.16.{10 + i}"), ifname="eth0")


def test_first_sync_configures_bird_with_the_admitted_nodes_only():
    world = BgpWorld()
    world.sync(SyncKind.FULL)
    assert world.bird.running and world.bird.starts == 1
    assert "neighbor 198.18.16.12 as 64512;" in world.bird.text and "neighbor 198.18.16.13" in world.bird.text
    assert "198.18.16.19" not in world.bird.text and "10.250.9.0" not in world.bird.text
    assert world.leases[-1].mtu == 1500  # no encapsulation


def test_learnt_routes_reach_main_on_the_sync_they_ask_for_and_leave_with_them():
    world = BgpWorld()
    world.sync(SyncKind.FULL)
    requests = []
    world.agent._request_partial = lambda: requests.append(1)  # what the runner would hear
    world.speaker.watch_learnt(world.agent._request_partial)
    world.table.learn(learnt(2))
    world.table.learn(Route(dst=IPv4Network("10.250.9.0/24"), gateway=IPv4Address("198.18.16.19"), ifname="eth0"))
    assert requests
    world.sync()
    assert world.overlay_routes() == {learnt(2).dst: learnt(2)}
    world.table.forget(learnt(2).dst)
    world.sync()
    assert world.overlay_routes() == {}


def test_a_new_node_is_a_reload_not_a_restart():
    world = BgpWorld()
    world.sync(SyncKind.FULL)
    world.put(node("node-4", 4))
    world.sync()
    assert "neighbor 198.18.16.14" in world.bird.text
    assert (world.bird.starts, world.bird.configures, world.bird.restarts) == (1, 1, 0)


def test_topology_configmap_values_apply_one_by_one_and_bad_ones_are_refused():
    world = BgpWorld(config_map={"metadata": {"name": "netagent-bgp", "namespace": "kube-system"},
                                 "data": {"asNumber": "not-a-number", "nodeToNodeMesh": "false",
                                          "bogus": "x"}})
    world.sync(SyncKind.FULL)
    assert "protocol bgp" not in world.bird.text  # mesh off, no reflectors, no external peers
    [refusal] = world.bgp_rejections.snapshot()
    assert refusal.ref.kind == "ConfigMap" and "asNumber" in refusal.detail and "bogus" in refusal.detail


def test_node_annotation_peers_are_parsed_and_a_hostile_entry_refused():
    peers = [{"address": "198.18.16.1", "as": 65001, "password": "ok"},
             {"address": "198.18.16.2\";}protocol x {", "as": 65002},
             {"address": "198.18.16.3", "as": 65003, "password": "a\"b"}]
    world = BgpWorld(own_annotations={PEERS_ANNOTATION: json.dumps(peers)})
    world.sync(SyncKind.FULL)
    assert "neighbor 198.18.16.1 as 65001;" in world.bird.text and 'password "ok";' in world.bird.text
    assert "protocol x" not in world.bird.text and "65003" not in world.bird.text
    [refusal] = world.bgp_rejections.snapshot()
    assert refusal.ref.name == LOCAL_NAME and "peer 1" in refusal.detail and "peer 2" in refusal.detail


def test_health_reports_a_bird_that_is_down():
    world = BgpWorld()
    world.sync(SyncKind.FULL)
    world.agent.runner = object()  # started: health reads the runner only when BIRD is up
    world.bird.crash()
    report = world.agent.health()
    assert not report.healthy and "BIRD is not running" in report.reason


def test_bgp_mode_without_bird_refuses_to_start():
    world = AgentWorld(mode=Mode.BGP, nodes=[node(LOCAL_NAME, 1)])
    with pytest.raises(AgentStartError, match="bgp"):
        world.agent.prepare()


@pytest.mark.parametrize("text", ["", "{}", "[1]", "[" * 5000, json.dumps([{"address": "x", "as": 1}] * 20),
                                  json.dumps([{"address": "10.0.0.1", "as": "1; reject"}]),
                                  json.dumps([{"address": "10.0.0.1", "as": 0}]),
                                  json.dumps([{"address": "10.0.0.1", "as": 1, "extra": 1}])])
def test_hostile_peer_annotations_are_refused(text):
    peers, refusals = parse_node_peers(text)
    assert peers == () and refusals


def test_topology_parser_keeps_defaults_for_refused_values():
    settings, refusals = parse_topology({"asNumber": "4294967296", "bfd": "true", "reflectorLabel": "bad label!"},
                                        TopologySettings())
    assert settings.asn == 64512 and settings.bfd is True and settings.reflector_label == REFLECTOR_LABEL
    assert len(refusals) == 2


@pytest.mark.parametrize("argv, wanted", [
    (["run", "--backend", "bgp"], True), (["run", "--backend", "auto"], False),
    (["run", "--backend", "auto", "--auto-bgp", "on"], True), (["run", "--backend", "vxlan", "--auto-bgp", "on"], False)])
def test_bird_runs_with_bgp_and_with_auto_when_asked(argv, wanted):
    from netagent.cli import build_parser
    from netagent.daemon.config import parse_run_config
    argv = [*argv, "--node-name", "n", "--cluster-cidr", "10.244.0.0/16"]
    cluster = parse_run_config(build_parser().parse_args(argv)).cluster
    assert cluster is not None and cluster.bgp.wanted is wanted
    assert cluster.bgp.asn == 64512 and cluster.bgp.config_map == "kube-system/netagent-bgp"


def test_status_bgp_and_cleanup_take_the_state_dir():
    from netagent.cli import build_parser
    from netagent.kernel import owned
    assert build_parser().parse_args(["status", "bgp", "--json"]).bgp_state_dir == owned.BIRD_STATE_DIR
    assert build_parser().parse_args(["cleanup", "--bgp-state-dir", "/x"]).bgp_state_dir == "/x"

"""VTEP MACs are random per node, so no Node can squat a future node's MAC (issue 29, item 11).

The MAC used to be a hash of the node name: an older Node could announce `vtep_mac("node-5")`
before node-5 existed and, the older Node winning a MAC conflict, keep node-5 out of every
other node's FDB. Now a node's first MAC is random, kept across agent restarts (the device's
MAC; after a reboot our Node's announcement, unless another Node holds it) and announced as
before; the older-Node-wins rule is unchanged. Through the agent over the fakes
(`node_agent_support.AgentHarness`): start-up, announcement, `read_peer`, admission, FDB.
"""
from __future__ import annotations

import json

from netagent.infra.metrics import Registry
from netagent.infra.sync_runner import SyncKind
from netagent.noderoutes import node_objects as nodes
from netagent.noderoutes.agent import NodeAgent
from netagent.noderoutes.routing.vxlan import normalize_mac, vtep_mac
from tests.unit.noderoutes.node_agent_support import LOCAL_NAME, AgentHarness, node


def unannounced(name: str, index: int, **kwargs) -> dict:
    fresh = node(name, index, **kwargs)
    fresh["metadata"]["annotations"] = {}
    return fresh


def own_mac(world: AgentHarness) -> str:
    mac = world.kernel.links["na-vxlan"].mac
    assert mac is not None
    return mac


def announced_mac(world: AgentHarness, name: str = LOCAL_NAME) -> str:
    notes = nodes.node_annotations(world.api.store.get(name))
    return json.loads(notes[nodes.BACKEND_DATA])["vtepMAC"]


def restarted(world: AgentHarness) -> NodeAgent:
    """A new agent process over the same kernel and API (the device and our Node kept)."""
    agent = NodeAgent(world.agent.settings, api=world.api, host=world.agent.host, registry=Registry(),
                      rejections=world.rejections)
    agent.prepare()
    return agent


def test_a_new_nodes_mac_is_random_and_a_precomputed_squat_does_not_keep_it_out():
    # the squatter, older, announced what the name-derived MAC of node-5 would have been
    squatter = node("a-squatter", 66, created="2020-01-01T00:00:00Z", mac=vtep_mac("node-5"))
    first = AgentHarness(nodes=[unannounced(LOCAL_NAME, 1), squatter])
    second = AgentHarness(nodes=[unannounced(LOCAL_NAME, 1), squatter])
    mac = own_mac(first)
    assert mac == announced_mac(first) and normalize_mac(mac) == mac
    assert int(mac[:2], 16) & 0x03 == 0x02   # locally administered, unicast
    assert mac != vtep_mac(LOCAL_NAME) and mac != own_mac(second)   # not derivable, not shared
    # node-5 joins with the random MAC its agent chose (the harness's agent is always node-1, whose
    # choice is node-5's as well), and another node (node-1) admits it beside the squatter
    node5_mac = own_mac(AgentHarness(nodes=[unannounced(LOCAL_NAME, 1)]))
    assert node5_mac != vtep_mac("node-5")
    first.put(node("node-5", 5, created="2026-06-01T00:00:00Z", mac=node5_mac))
    first.sync(SyncKind.FULL)
    assert "node-5" not in first.rejected()
    fdb = {entry.mac: str(entry.dst) for entry in first.kernel.dump_fdb("na-vxlan")}
    assert fdb[node5_mac] == "198.18.16.15" and fdb[vtep_mac("node-5")] == "198.18.16.76"


def test_a_restarted_agent_keeps_its_mac_and_patches_nothing():
    world = AgentHarness(nodes=[unannounced(LOCAL_NAME, 1)])
    mac = own_mac(world)
    patches = len(world.api.patches)
    again = restarted(world)
    assert own_mac(world) == mac and announced_mac(world) == mac
    assert len(world.api.patches) == patches
    again.stop()


def test_after_a_reboot_the_announced_mac_is_kept_unless_another_node_holds_it():
    world = AgentHarness(nodes=[unannounced(LOCAL_NAME, 1)])
    mac = own_mac(world)
    world.kernel.delete_link("na-vxlan")   # a reboot: the device is gone, our Node still says `mac`
    again = restarted(world)
    assert own_mac(world) == mac   # the peers' FDB entries stay right
    again.stop()
    # another Node announces our MAC meanwhile: we take a fresh one rather than lose to it
    world.put(node("node-7", 7, created="2020-01-01T00:00:00Z", mac=mac))
    world.kernel.delete_link("na-vxlan")
    third = restarted(world)
    assert own_mac(world) != mac and announced_mac(world) == own_mac(world)
    third.stop()


def test_a_device_mac_that_is_not_one_we_choose_is_replaced_by_a_random_one():
    world = AgentHarness(nodes=[unannounced(LOCAL_NAME, 1)])
    world.kernel.links["na-vxlan"] = world.kernel.links["na-vxlan"].__class__(
        **{**world.kernel.links["na-vxlan"].__dict__, "mac": "00:11:22:33:44:55"})   # globally administered
    world.api.store.get(LOCAL_NAME)["metadata"]["annotations"] = {}
    again = restarted(world)
    assert own_mac(world) not in ("00:11:22:33:44:55", vtep_mac(LOCAL_NAME))
    again.stop()


def test_the_older_node_still_wins_a_mac_conflict():
    world = AgentHarness(nodes=[unannounced(LOCAL_NAME, 1), node("node-2", 2, created="2024-01-01T00:00:00Z")])
    world.sync(SyncKind.FULL)
    thief = node("node-3", 3, created="2025-01-01T00:00:00Z", mac=vtep_mac("node-2"))
    world.put(thief)
    world.sync()
    assert world.rejected() == {"node-3": "conflict"}
    mine = node("node-4", 4, created="2025-01-01T00:00:00Z", mac=own_mac(world))
    world.put(mine)
    world.sync()
    assert world.rejected() == {"node-3": "conflict", "node-4": "conflict"}

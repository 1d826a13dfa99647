"""The cluster under change and failure: node churn, API server restarts, a killed agent,
drift, and pod egress through masquerade.

Established TCP connections between pods are the yardstick: a long-lived connection (a
line every 20 ms), established before the change and stopped after it, must see every answer
while nodes come and go, while the API server is down, and while an agent is SIGKILLed and
restarted. Routes for a removed node must go, and a new node's routes must appear.
"""
import contextlib
import json
import os
import signal

import pytest

from netagent.kernel import owned
from tests.cluster.lab_tools import ip_routes, lab_cluster, pods_by_node, serve, stop_stream, stream, traffic, wait_for


def routes_to(lab, node, cidr):
    return [r for r in ip_routes(lab, node) if r.get("dst") == cidr]


def routes_everywhere(lab, cidr: str, *, present: bool = True) -> None:
    """Wait until every node other than the one owning `cidr` has (or, `present` False, lacks) a route to it."""
    for name in sorted(lab.state.nodes):
        if lab.state.nodes[name].pod_cidr != cidr:
            wait_for(lambda: bool(routes_to(lab, name, cidr)) == present,
                     what=f"{name}'s route to {cidr} {'to appear' if present else 'to go'}")


class LongConnection:
    """A TCP conversation between two pods, established (it has had an answer) when made."""

    def __init__(self, lab, client, server, *, port: int = 9000) -> None:
        self.server = serve(lab, server.name, "tcp", port)
        try:
            self.client = stream(lab, client.name, "tcp", server.ip, port)
        except BaseException:
            self.server.stop()
            raise

    def finish(self) -> dict:
        """Stop the conversation (its last line is exchanged now) and return its summary."""
        try:
            return stop_stream(self.client)
        finally:
            self.server.stop()


def assert_unbroken(summary):
    assert summary["error"] is None, summary
    assert summary["sent"] == summary["answered"] and summary["sent"] > 1, summary


@contextlib.contextmanager
def agent_frozen(lab, node: str):
    """The node's agent stopped (SIGSTOP) for the block: nothing it would repair is repaired yet."""
    pid = lab.state.nodes[node].agent_pid
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


@pytest.fixture(scope="module")
def churn_lab():
    with lab_cluster(nodes=2, mode="vxlan", pods_per_node=1, resync_period=2.0) as lab:
        yield lab


def test_node_churn_while_traffic_flows(churn_lab):
    lab = churn_lab
    pods = pods_by_node(lab)
    conversation = LongConnection(lab, pods["node-1"], pods["node-2"])
    node = lab.add_node()
    pod = lab.add_pod("churn-pod", node=node.name)
    routes_everywhere(lab, node.pod_cidr)   # the pings below need node-1's and node-2's
    assert lab.ping(pods["node-1"].name, pod.ip, count=2)
    assert lab.ping(pod.name, pods["node-2"].ip, count=2)
    lab.remove_node(node.name)
    routes_everywhere(lab, node.pod_cidr, present=False)
    neighbours = json.loads(lab.exec("node-1", ["ip", "-j", "neigh", "show", "dev", "na-vxlan"], check=True).stdout)
    fdb = json.loads(lab.exec("node-1", ["bridge", "-j", "fdb", "show", "dev", "na-vxlan"], check=True).stdout)
    assert not [n for n in neighbours if n["dst"] == node.pod_cidr.split("/")[0]]
    assert not [f for f in fdb if f.get("dst") == node.address]
    assert_unbroken(conversation.finish())


def test_api_server_restart(churn_lab):
    lab = churn_lab
    pods = pods_by_node(lab)
    conversation = LongConnection(lab, pods["node-1"], pods["node-2"], port=9001)
    lab.stop_apiserver()
    assert lab.ping(pods["node-1"].name, pods["node-2"].ip)  # the dataplane does not need the API
    lab.start_apiserver()
    node = lab.add_node()  # the agents must have re-listed and be watching again
    try:   # node-1's and node-2's agents see a node created after the API server restarted
        routes_everywhere(lab, node.pod_cidr)
    finally:
        lab.remove_node(node.name)
    assert_unbroken(conversation.finish())
    routes_everywhere(lab, node.pod_cidr, present=False)   # the next test starts from two nodes


def test_kill_9_agent_keeps_connections_and_adopts_state(churn_lab):
    lab = churn_lab
    pods = pods_by_node(lab)
    peers = {node.pod_cidr for name, node in lab.state.nodes.items() if name != "node-1"}
    wait_for(lambda: {r["dst"] for r in ip_routes(lab, "node-1") if r.get("protocol") == str(owned.ROUTE_PROTOCOL)}
             == peers, what="node-1 to route to exactly its peers")   # no node removal still in flight
    before = ip_routes(lab, "node-1")
    conversation = LongConnection(lab, pods["node-1"], pods["node-2"], port=9002)
    lab.stop_agent("node-1", sig=signal.SIGKILL)
    assert lab.ping(pods["node-1"].name, pods["node-2"].ip)
    lab.start_agent("node-1")
    assert_unbroken(conversation.finish())
    assert ip_routes(lab, "node-1") == before  # adopted, not re-created
    with open(lab.agent_log("node-1")) as f:
        first_syncs = [line for line in f if "first sync:" in line]
    assert len(first_syncs) >= 2
    assert "added 0, removed 0," in first_syncs[-1], first_syncs[-1]  # the restart wrote nothing


def test_drift_is_repaired(churn_lab):
    lab = churn_lab
    pods = pods_by_node(lab)
    peer_cidr = lab.state.nodes["node-2"].pod_cidr
    with agent_frozen(lab, "node-1"):   # else it may repair the route before the ping shows the break
        lab.exec("node-1", ["ip", "route", "del", peer_cidr], check=True)
        assert not lab.ping(pods["node-1"].name, pods["node-2"].ip)
    wait_for(lambda: routes_to(lab, "node-1", peer_cidr), what="the deleted route to come back")
    lab.exec("node-1", ["ip", "link", "del", "na-vxlan"], check=True)
    wait_for(lambda: routes_to(lab, "node-1", peer_cidr), what="the vxlan device and route to come back")
    assert wait_for(lambda: lab.ping(pods["node-1"].name, pods["node-2"].ip), what="traffic again")


def test_pod_egress_is_masqueraded_but_pod_to_pod_is_not(churn_lab):
    lab = churn_lab
    pods = pods_by_node(lab)
    internet = lab.status()["internet"]
    with serve(lab, "internet", "udp", 7000), serve(lab, "internet", "tcp", 7001):
        udp = traffic(lab, pods["node-1"].name, "ask-udp", internet["address"], "7000")
        tcp = traffic(lab, pods["node-1"].name, "ask-tcp", internet["address"], "7001")
    node_address = lab.state.nodes["node-1"].address
    assert udp.stdout.split()[0] == node_address, udp.stderr
    assert tcp.stdout.split()[0] == node_address, tcp.stderr
    with serve(lab, pods["node-2"].name, "udp", 7002):
        direct = traffic(lab, pods["node-1"].name, "ask-udp", pods["node-2"].ip, "7002")
    assert direct.stdout.split()[0] == pods["node-1"].ip

"""The cluster under change and failure: node churn, API server restarts, a killed agent,
drift, and pod egress through masquerade.

Established TCP connections between pods are the yardstick: a long-lived connection (a
line every 20 ms) must see every answer while nodes come and go, while the API server is
down, and while an agent is SIGKILLed and restarted. Routes for a removed node must go,
and a new node's routes must appear, within seconds.
"""
import json
import signal
import threading

import pytest

from tests.cluster.lab_tools import ip_routes, lab_cluster, pods_by_node, serve, traffic, wait_for


def routes_to(lab, node, cidr):
    return [r for r in ip_routes(lab, node) if r.get("dst") == cidr]


class LongConnection:
    """A TCP conversation between two pods, running in the background for `seconds`."""

    def __init__(self, lab, client, server, *, seconds: float, port: int = 9000) -> None:
        self.server = serve(lab, server.name, "tcp", port)
        self.result = None

        def run():
            out = traffic(lab, client.name, "stream-tcp", server.ip, str(port), str(seconds))
            self.result = json.loads(out.stdout) if out.stdout.strip() else {"error": out.stderr}
        self.thread = threading.Thread(target=run)
        self.thread.start()

    def finish(self) -> dict:
        self.thread.join(timeout=120)
        self.server.stop()
        return self.result


def assert_unbroken(summary):
    assert summary["error"] is None, summary
    assert summary["sent"] == summary["answered"] and summary["sent"] > 20, summary


@pytest.fixture(scope="module")
def churn_lab():
    with lab_cluster(nodes=2, mode="vxlan", pods_per_node=1, resync_period=2.0) as lab:
        yield lab


def test_node_churn_while_traffic_flows(churn_lab):
    lab = churn_lab
    pods = pods_by_node(lab)
    conversation = LongConnection(lab, pods["node-1"], pods["node-2"], seconds=8)
    node = lab.add_node()
    pod = lab.add_pod("churn-pod", node=node.name)
    wait_for(lambda: routes_to(lab, "node-1", node.pod_cidr), timeout=5, what="a route to the new node")
    assert lab.ping(pods["node-1"].name, pod.ip, count=2)
    assert lab.ping(pod.name, pods["node-2"].ip, count=2)
    lab.remove_node(node.name)
    wait_for(lambda: not routes_to(lab, "node-1", node.pod_cidr), timeout=5, what="the removed node's route to go")
    neighbours = json.loads(lab.exec("node-1", ["ip", "-j", "neigh", "show", "dev", "na-vxlan"], check=True).stdout)
    fdb = json.loads(lab.exec("node-1", ["bridge", "-j", "fdb", "show", "dev", "na-vxlan"], check=True).stdout)
    assert not [n for n in neighbours if n["dst"] == node.pod_cidr.split("/")[0]]
    assert not [f for f in fdb if f.get("dst") == node.address]
    assert_unbroken(conversation.finish())


def test_api_server_restart(churn_lab):
    lab = churn_lab
    pods = pods_by_node(lab)
    conversation = LongConnection(lab, pods["node-1"], pods["node-2"], seconds=5, port=9001)
    lab.stop_apiserver()
    assert lab.ping(pods["node-1"].name, pods["node-2"].ip)  # the dataplane does not need the API
    lab.start_apiserver()
    node = lab.add_node()  # the agents must have re-listed and be watching again
    try:
        wait_for(lambda: routes_to(lab, "node-1", node.pod_cidr), timeout=15,
                 what="node-1's agent to see a node created after the API server restarted")
        wait_for(lambda: routes_to(lab, "node-2", node.pod_cidr), timeout=15, what="node-2's agent likewise")
    finally:
        lab.remove_node(node.name)
    assert_unbroken(conversation.finish())


def test_kill_9_agent_keeps_connections_and_adopts_state(churn_lab):
    lab = churn_lab
    pods = pods_by_node(lab)
    before = ip_routes(lab, "node-1")
    conversation = LongConnection(lab, pods["node-1"], pods["node-2"], seconds=6, port=9002)
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
    lab.exec("node-1", ["ip", "route", "del", peer_cidr], check=True)
    assert not lab.ping(pods["node-1"].name, pods["node-2"].ip)
    wait_for(lambda: routes_to(lab, "node-1", peer_cidr), timeout=8, what="the deleted route to come back")
    lab.exec("node-1", ["ip", "link", "del", "na-vxlan"], check=True)
    wait_for(lambda: routes_to(lab, "node-1", peer_cidr), timeout=8, what="the vxlan device and route to come back")
    assert wait_for(lambda: lab.ping(pods["node-1"].name, pods["node-2"].ip), timeout=5, what="traffic again")


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

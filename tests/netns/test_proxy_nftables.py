"""The nftables service proxy on the real kernel, with real packets: test_proxy_iptables.py's
lab (a node between three endpoint namespaces, a pod and an outside client), its probes and
its assertions, with the nft backend in the node namespace; plus what only nft has: the table
adopted by a restarted agent with zero writes, drift repaired by a full sync, coexistence with
other users' nft and iptables-nft rules, and load-balancer source ranges."""
import json

import pytest

from netagent.kernel.iptables.backend import IptablesBackend
from netagent.kernel.nftables.runner import NftRunner
from proxy.backend import ProxyMode
from proxy.factory import programmed_mode
from proxy.model import Protocol, ServicePort, TrafficPolicy
from proxy.nftables import NftablesProxy
from proxy.nftables import names as N
from tests.netns.test_proxy_iptables import (DNS, NODE_OUTSIDE, OUTSIDE, POD, SPREAD, WEB, endpoints,  # noqa: F401
                                             lab, name, seen_sources, state, who)


@pytest.fixture
def nft(lab):  # noqa: F811
    runner = NftRunner(lab.names["node"])
    yield runner
    runner.close()


@pytest.fixture
def proxy(nft):
    return NftablesProxy(nft=nft)


def rejected(lab) -> int:
    """Packets our REJECT-NEW chain has refused so far (its rules' counters)."""
    listing = json.loads(lab.run("node", "nft", "-j", "list", "chain", "ip", N.TABLE, N.REJECT).stdout)
    return sum(expr["counter"]["packets"] for entry in listing["nftables"] if "rule" in entry
               for expr in entry["rule"]["expr"] if "counter" in expr)


ALL = {"ep1", "ep2", "ep3"}
MASQUERADED = {"10.244.1.1", "10.244.2.1", "10.244.3.1"}   # the node's address on each endpoint's link


@pytest.mark.parametrize("client, address, port, protocol, sources", [
    ("pod", "10.96.0.10", 80, "tcp", {POD}),               # a pod to a cluster IP keeps its address
    ("out", NODE_OUTSIDE, 30080, "tcp", MASQUERADED),      # off-cluster to a node port: masqueraded
    ("pod", "10.96.0.53", 53, "udp", {POD}),
])
def test_every_endpoint_answers_each_way_in(lab, proxy, client, address, port, protocol, sources):  # noqa: F811
    proxy.sync(state((WEB, endpoints("ep1", "ep2", "ep3")), (DNS, endpoints("ep1", "ep2", "ep3"))), changed=None)
    answers = lab.answers(client, address, port, count=SPREAD, protocol=protocol)
    assert who(answers) == ALL and seen_sources(answers) == sources
    assert {(entry.kind, entry.address, len(entry.backends)) for entry in proxy.programmed()} == {
        ("ClusterIP", "10.96.0.10:80/TCP", 3), ("NodePort", "*:30080/TCP", 3), ("ClusterIP", "10.96.0.53:53/UDP", 3)}


def test_external_local_keeps_the_client_address_and_affinity_pins(lab, proxy):  # noqa: F811
    local_web = ServicePort(name("web"), Protocol.TCP, 80, "10.96.0.10", node_port=30080,
                            external_policy=TrafficPolicy.LOCAL)
    sticky = ServicePort(name("sticky"), Protocol.TCP, 80, "10.96.0.11", affinity_timeout=60)
    proxy.sync(state((local_web, endpoints("ep1", "ep2", "ep3")), (sticky, endpoints("ep1", "ep2", "ep3"))),
               changed=None)

    from_outside = lab.answers("out", NODE_OUTSIDE, 30080, count=SPREAD)
    assert who(from_outside) == {"ep1", "ep2"} and seen_sources(from_outside) == {OUTSIDE}
    from_pod = lab.answers("pod", NODE_OUTSIDE, 30080, count=SPREAD)   # a pod: served like cluster-IP traffic
    assert who(from_pod) == {"ep1", "ep2", "ep3"}
    pinned = lab.answers("pod", "10.96.0.11", 80, count=12)
    assert len(who(pinned)) == 1
    spread = lab.answers("pod", "10.96.0.10", 80, count=SPREAD)   # the same client, no affinity: spread
    assert who(spread) == {"ep1", "ep2", "ep3"}


def test_no_endpoints_refuses_at_once_and_partial_syncs_follow_endpoint_changes(lab, proxy):  # noqa: F811
    assert lab.answers("pod", "10.96.0.10", 80, timeout=0.5) == ["timeout"]   # control: nothing refuses yet
    proxy.sync(state((WEB, ()), (DNS, ())), changed=None)
    for role, host, port, protocol in (("pod", "10.96.0.10", 80, "tcp"), ("out", NODE_OUTSIDE, 30080, "tcp"),
                                       ("pod", "10.96.0.53", 53, "udp")):
        # refused, not timed out: only our reject answers (the control above), the first packet
        before = rejected(lab)
        assert lab.answers(role, host, port, protocol=protocol) == ["refused"]
        assert rejected(lab) == before + 1

    one = state((WEB, endpoints("ep1")), (DNS, ()))
    assert proxy.sync(one, changed=frozenset({WEB.name})).scope.value == "partial"
    assert who(lab.answers("pod", "10.96.0.10", 80, count=5)) == {"ep1"}
    moved = state((WEB, endpoints("ep2", "ep3")), (DNS, ()))
    proxy.sync(moved, changed=frozenset({WEB.name}))
    assert who(lab.answers("pod", "10.96.0.10", 80, count=SPREAD)) == {"ep2", "ep3"}
    applies = proxy.applies
    assert proxy.sync(moved, changed=None).detail.count(" 0 nft writes") == 1   # partial == full
    assert proxy.applies == applies


def test_a_restarted_agent_adopts_its_table_with_no_write_and_a_full_sync_repairs_drift(lab, nft, proxy):  # noqa: F811
    desired = state((WEB, endpoints("ep1", "ep2", "ep3")), (DNS, endpoints("ep1")))
    proxy.sync(desired, changed=None)
    restarted = NftablesProxy(nft=nft)
    restarted.sync(desired, changed=None)
    assert restarted.applies == 0

    lab.run("node", "nft", "delete", "element", "ip", N.TABLE, "SERVICE-IPS", "{ 10.96.0.10 . tcp . 80 }")
    lab.run("node", "nft", "flush", "chain", "ip", N.TABLE, N.POSTROUTING)
    assert lab.answers("pod", "10.96.0.10", 80, timeout=0.5) == ["timeout"]   # the drift is real
    restarted.sync(desired, changed=None)
    assert restarted.applies == 1
    assert who(lab.answers("pod", "10.96.0.10", 80, count=SPREAD)) == {"ep1", "ep2", "ep3"}
    assert seen_sources(lab.answers("out", NODE_OUTSIDE, 30080, count=3)) <= {"10.244.1.1", "10.244.2.1",
                                                                            "10.244.3.1"}
    restarted.sync(desired, changed=None)
    assert restarted.applies == 1


def test_source_ranges_admit_only_the_listed_clients(lab, proxy):  # noqa: F811
    lab.run("out", "ip", "route", "add", "203.0.113.0/24", "via", NODE_OUTSIDE)
    open_lb = ServicePort(name("open"), Protocol.TCP, 80, "10.96.0.20", load_balancer_ips=("203.0.113.10",),
                          load_balancer_source_ranges=("192.168.77.0/24",))
    closed_lb = ServicePort(name("closed"), Protocol.TCP, 80, "10.96.0.21", load_balancer_ips=("203.0.113.11",),
                            load_balancer_source_ranges=("10.0.0.0/8", "172.16.0.9/32"))
    proxy.sync(state((open_lb, endpoints("ep1")), (closed_lb, endpoints("ep1"))), changed=None)
    assert who(lab.answers("out", "203.0.113.10", 80, count=3)) == {"ep1"}
    assert lab.answers("out", "203.0.113.11", 80, timeout=1.0) == ["timeout"]
    assert who(lab.answers("pod", "10.96.0.21", 80, count=3)) == {"ep1"}     # the cluster IP is not fenced


def test_hairpin_is_masqueraded_and_cleanup_leaves_others_alone(lab, nft, proxy):  # noqa: F811
    lab.run("node", "nft", "add table ip other; add chain ip other post { type nat hook postrouting priority 100; }; "
                           "add rule ip other post counter")
    lab.run("node", "iptables-nft", "-t", "nat", "-A", "POSTROUTING", "-d", "198.51.100.1", "-j", "RETURN")
    before = lab.run("node", "nft", "list", "ruleset").stdout
    lonely = ServicePort(name("lonely"), Protocol.TCP, 80, "10.96.0.12")
    proxy.sync(state((lonely, endpoints("ep1"))), changed=None)
    assert lab.answers("ep1", "10.96.0.12", 80) == ["ep1 10.244.1.1"]   # itself, via the node's address

    assert programmed_mode(iptables_backend=IptablesBackend.NFT, netns=lab.names["node"]) is ProxyMode.NFTABLES
    proxy.cleanup()
    proxy.cleanup()
    assert (("ip", N.TABLE) not in nft.tables()) and ("ip", "other") in nft.tables()
    assert programmed_mode(iptables_backend=IptablesBackend.NFT, netns=lab.names["node"]) is None
    after = lab.run("node", "nft", "list", "ruleset").stdout
    assert _without_counters(after) == _without_counters(before)
    assert lab.answers("pod", "10.96.0.12", 80, timeout=0.5) == ["timeout"]


def _without_counters(ruleset: str) -> str:
    import re
    return re.sub(r"counter packets \d+ bytes \d+", "counter", ruleset)


UDP_FROM_ONE_PORT = r"""
import socket, sys
client = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
client.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
client.bind(("0.0.0.0", 40053)); client.settimeout(15)
client.sendto(b"hello", (sys.argv[1], int(sys.argv[2])))
print(client.recv(64).decode().split()[0])
"""


def test_udp_flows_to_a_gone_endpoint_are_deleted_by_the_conntrack_cleanup(lab, proxy):  # noqa: F811
    import sys
    from netagent.kernel import namespaces
    from proxy.conntrack import ConntrackCommand, stale_flows
    before = state((DNS, endpoints("ep1")))
    proxy.sync(before, changed=None)

    def ask() -> str:
        return lab.run("pod", sys.executable, "-c", UDP_FROM_ONE_PORT, "10.96.0.53", "53").stdout.strip()
    assert ask() == "ep1"
    after = state((DNS, endpoints("ep2")))
    proxy.sync(after, changed=frozenset({DNS.name}))
    assert ask() == "ep1"   # the flow's conntrack entry still says ep1 (it still serves, in this lab)
    deleted = ConntrackCommand(exec_prefix=namespaces.exec_prefix(lab.names["node"])).delete_all(
        stale_flows(before, after, frozenset({DNS.name})))
    assert deleted >= 1
    assert ask() == "ep2"

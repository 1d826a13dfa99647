"""Pod egress masquerade on the real kernel: the iptables chains (`masquerade.py`) on both
iptables backends, and the nftables table (`masquerade_nft.py`, `--proxy-mode nftables`) with
either backend as the host's iptables (which it touches only while FORWARD drops). The same
assertions run on every dataplane.

Topology (all namespaces created here and removed afterwards; the root namespace is untouched):

    pod  10.244.1.2 --- 10.244.1.1 [node, ip_forward=1] 10.244.2.1 --- 10.244.2.2  remote pod
                                   203.0.113.1
                                        |
                                   203.0.113.2  internet

The node plays this node (pod CIDR 10.244.1.0/24 of cluster 10.244.0.0/16); the "remote pod"
stands for another node's pod behind it. Each far end runs a UDP server that answers with the
source address it saw. The internet namespace routes 10.244.0.0/16 back to the node, so
without masquerade its server sees the pod address: the control probes show the assertions
can fail.
"""
import itertools
import sys

import pytest

from netagent.kernel import namespaces
from netagent.kernel.iptables.runner import IptablesRunner
from netagent.kernel.nftables.runner import NftRunner
from netagent.noderoutes.masquerade import MasqueradeManager
from netagent.noderoutes.masquerade_nft import FAMILY, TABLE, NftMasqueradeManager
from tests.netns.topology import NamespaceTopology

PORT = 7777
POD, REMOTE_POD, INTERNET = "10.244.1.2", "10.244.2.2", "203.0.113.2"
NODE_TOWARDS_INTERNET, NODE_TOWARDS_REMOTE = "203.0.113.1", "10.244.2.1"

SOURCE_ECHO = r"""
import socket, sys
server = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
server.bind(("0.0.0.0", int(sys.argv[1])))
print("ready", flush=True)
while True:
    data, peer = server.recvfrom(64)
    server.sendto(peer[0].encode(), peer)
"""

PROBE = r"""
import socket, sys
client = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
client.bind(("0.0.0.0", int(sys.argv[3])))
client.settimeout(float(sys.argv[4]))
try:
    client.sendto(b"who am i", (sys.argv[1], int(sys.argv[2])))
    print(client.recvfrom(64)[0].decode())
except socket.timeout:
    print("timeout")
"""


class Lab(NamespaceTopology):
    """The five-address topology above; `seen_by(src_ns, dst_addr)` is what the far end saw."""

    def __init__(self):
        super().__init__(("node", "pod", "remote", "inet"))
        self.source_ports = itertools.count(40000)  # a fresh port per probe: a fresh conntrack entry

    def node(self, *argv):
        namespaces.run_in(self.names["node"], list(argv), check=True)

    def _build(self):
        self.node("sysctl", "-qw", "net.ipv4.ip_forward=1")
        for role, node_address, far_address, gateway in (
                ("pod", "10.244.1.1/24", POD + "/24", "10.244.1.1"),
                ("remote", "10.244.2.1/24", REMOTE_POD + "/24", "10.244.2.1"),
                ("inet", "203.0.113.1/24", INTERNET + "/24", None)):
            far = self.names[role]
            link = f"n-{role}"
            self.node("ip", "link", "add", link, "type", "veth", "peer", "name", "eth0", "netns", far)
            self.node("ip", "addr", "add", node_address, "dev", link)
            self.node("ip", "link", "set", link, "up")
            namespaces.run_in(far, ["ip", "addr", "add", far_address, "dev", "eth0"], check=True)
            namespaces.run_in(far, ["ip", "link", "set", "eth0", "up"], check=True)
            route = ["default", "via", gateway] if gateway else ["10.244.0.0/16", "via", "203.0.113.1"]
            namespaces.run_in(far, ["ip", "route", "add", *route], check=True)
        for role in ("pod", "remote", "inet"):
            self.start_server(role, [sys.executable, "-c", SOURCE_ECHO, str(PORT)])

    def seen_by(self, source_role: str, destination: str, *, timeout: float = 15.0) -> str:
        """What the far end answered; `timeout` is for its echo server to be scheduled on a loaded
        machine (a probe expected to go unanswered passes a short one)."""
        done = namespaces.run_in(self.names[source_role],
                                 [sys.executable, "-c", PROBE, destination, str(PORT),
                                  str(next(self.source_ports)), str(timeout)], check=True)
        return done.stdout.strip()


@pytest.fixture
def lab():
    with Lab() as lab:
        yield lab


@pytest.fixture
def runner(lab, backend):
    return IptablesRunner(backend=backend, exec_prefix=namespaces.exec_prefix(lab.names["node"]), timeout=120,
                          lock_wait_seconds=60)  # the xtables lock is shared with every other namespace


@pytest.fixture(params=["iptables", "nftables"])
def dataplane(request):
    return request.param


@pytest.fixture
def nft(lab):
    with NftRunner(lab.names["node"]) as runner:
        yield runner


@pytest.fixture
def manager(runner, dataplane, nft):
    cidrs = {"cluster_cidrs": ["10.244.0.0/16"], "pod_cidrs": ["10.244.1.0/24"]}
    if dataplane == "nftables":
        return NftMasqueradeManager(nft=nft, forward_iptables=runner, **cidrs)
    return MasqueradeManager(runner=runner, **cidrs)


FOREIGN_RULES = ("*nat\n:OTHER-TOOL - [0:0]\n-A POSTROUTING -o lo -j OTHER-TOOL\nCOMMIT\n"
                 "*filter\n-A FORWARD -p udp --dport 9 -j DROP\nCOMMIT\n")


def test_pods_leave_with_the_node_address_and_meet_pods_with_their_own(lab, runner, manager, dataplane, nft):
    runner.restore(FOREIGN_RULES)
    foreign = {table: runner.table(table) for table in ("nat", "filter")}
    assert lab.seen_by("pod", INTERNET) == POD  # control: no masquerade yet

    assert manager.ensure()
    assert manager.check() == []            # what the kernel saved is exactly what we rendered
    assert manager.ensure() == []           # so a second ensure writes nothing
    assert lab.seen_by("pod", INTERNET) == NODE_TOWARDS_INTERNET
    assert lab.seen_by("pod", REMOTE_POD) == POD
    assert lab.seen_by("inet", POD) == INTERNET                 # outside -> local pods: kept
    assert lab.seen_by("inet", REMOTE_POD) == NODE_TOWARDS_REMOTE  # outside -> remote pods: masqueraded

    if dataplane == "nftables":
        assert "NETAGENT" not in runner.save()    # FORWARD accepts: no iptables rule of ours
        assert nft.list_table(FAMILY, TABLE) is not None

    manager.cleanup()
    assert "NETAGENT" not in runner.save()
    assert nft.list_table(FAMILY, TABLE) is None
    assert {table: runner.table(table) for table in ("nat", "filter")} == foreign
    assert lab.seen_by("pod", INTERNET) == POD


@pytest.mark.parametrize("dataplane", ["iptables"], indirect=True)
def test_ensure_repairs_a_flushed_chain_and_a_deleted_jump(lab, runner, manager):
    manager.ensure()
    runner.restore("*nat\n-F NETAGENT-POSTRTG\nCOMMIT\n")
    assert lab.seen_by("pod", INTERNET) == POD
    assert manager.check()
    manager.ensure()
    assert lab.seen_by("pod", INTERNET) == NODE_TOWARDS_INTERNET

    runner.restore('*nat\n-D POSTROUTING -m comment --comment "netagent: pod egress masquerade" '
                   '-j NETAGENT-POSTRTG\nCOMMIT\n')
    assert lab.seen_by("pod", INTERNET) == POD
    assert manager.ensure() == ["nat POSTROUTING: no jump to NETAGENT-POSTRTG"]
    assert manager.check() == []
    assert lab.seen_by("pod", INTERNET) == NODE_TOWARDS_INTERNET
    manager.cleanup()


def test_forward_chain_lets_pod_traffic_through_a_drop_policy(lab, runner, manager):
    runner.restore("*filter\n:FORWARD DROP [0:0]\nCOMMIT\n")
    assert lab.seen_by("pod", REMOTE_POD, timeout=0.5) == "timeout"
    manager.ensure()
    assert manager.check() == []
    assert lab.seen_by("pod", REMOTE_POD) == POD
    runner.restore("*filter\n:FORWARD ACCEPT [0:0]\nCOMMIT\n")
    manager.ensure()           # nftables: FORWARD accepts again, the iptables accept goes
    assert manager.check() == []
    assert lab.seen_by("pod", REMOTE_POD) == POD
    runner.restore("*filter\n:FORWARD DROP [0:0]\nCOMMIT\n")
    manager.ensure()
    assert lab.seen_by("pod", REMOTE_POD) == POD
    manager.cleanup()
    assert runner.table("filter").chains["FORWARD"].policy == "DROP"
    assert lab.seen_by("pod", REMOTE_POD, timeout=0.5) == "timeout"


@pytest.mark.parametrize("dataplane", ["nftables"], indirect=True)
def test_nft_ensure_repairs_a_flushed_chain_an_emptied_set_and_a_deleted_table(lab, nft, manager):
    manager.ensure()
    writes = []
    for damage in (f"flush chain {FAMILY} {TABLE} POSTROUTING", f"flush set {FAMILY} {TABLE} CLUSTER-CIDRS",
                   f"delete table {FAMILY} {TABLE}"):
        nft.apply(damage)
        assert lab.seen_by("pod", INTERNET) == POD
        assert manager.check()
        writes.append(manager.ensure())
        assert manager.check() == []
        assert lab.seen_by("pod", INTERNET) == NODE_TOWARDS_INTERNET
    assert all(writes)
    manager.cleanup()


@pytest.mark.parametrize("dataplane", ["nftables"], indirect=True)
def test_nft_forward_accept_is_not_final_across_tables(lab, nft, manager, runner):
    """Another table's forward chain that drops wins over our accept (nf_tables semantics):
    the reason the manager keeps the iptables accept while iptables' FORWARD drops."""
    manager.ensure()
    nft.apply("add table ip other-tool\n"
              "add chain ip other-tool Forward { type filter hook forward priority 20; policy drop; }\n")
    assert lab.seen_by("pod", REMOTE_POD, timeout=0.5) == "timeout"
    nft.apply("delete table ip other-tool\n")
    assert lab.seen_by("pod", REMOTE_POD) == POD
    manager.cleanup()

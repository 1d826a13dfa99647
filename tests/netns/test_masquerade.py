"""Pod egress masquerade on the real kernel: the iptables chains (`masquerade.py`) on both
iptables backends, and the nftables table (`masquerade_nft.py`, `--proxy-mode nftables`) with
either backend as the host's iptables (which it touches only while FORWARD drops). The same
assertions run on every dataplane.

Topology (all namespaces created here and removed afterwards; the root namespace is untouched):

    pod  10.244.1.2 --- 10.244.1.1 [node, ip_forward=1] 10.244.2.1 --- 10.244.2.2  remote pod
                                   203.0.113.1
                                        |
                                   203.0.113.2  internet

IPv6 (`family` ipv6, the main test on every dataplane): the same topology in fd00:10:244::/56
(pod fd00:10:244:1::2, remote pod fd00:10:244:2::2) and 2001:db8:113::/64 towards the internet,
masqueraded by the managers built for IPv6 (ip6tables, table `ip6 netagent-masq`).

The node plays this node (pod CIDR 10.244.1.0/24 of cluster 10.244.0.0/16); the "remote pod"
stands for another node's pod behind it. Each far end runs a UDP server that answers with the
source address it saw. The internet namespace routes 10.244.0.0/16 back to the node, so
without masquerade its server sees the pod address: the control probes show the assertions
can fail.
"""
import itertools
import sys
from dataclasses import dataclass

import pytest

from netagent.kernel import namespaces
from netagent.kernel.families import IpFamily
from netagent.kernel.iptables.runner import IptablesRunner
from netagent.kernel.nftables.runner import NftRunner
from netagent.noderoutes.masquerade import MasqueradeManager
from netagent.noderoutes.masquerade_nft import FAMILY, TABLE, NftMasqueradeManager
from tests.netns.topology import NamespaceTopology

PORT = 7777
POD, REMOTE_POD, INTERNET = "10.244.1.2", "10.244.2.2", "203.0.113.2"
NODE_TOWARDS_INTERNET, NODE_TOWARDS_REMOTE = "203.0.113.1", "10.244.2.1"


@dataclass(frozen=True)
class Plan:
    """One family's addresses of the topology."""
    pod: str
    remote_pod: str
    internet: str
    node_towards_internet: str
    node_towards_remote: str
    cluster: str
    pod_cidr: str
    links: tuple  # (role, node address, far address, far gateway or None)
    inet_route: str  # the internet's route back to the cluster CIDR via the node


PLANS = {
    IpFamily.V4: Plan(POD, REMOTE_POD, INTERNET, NODE_TOWARDS_INTERNET, NODE_TOWARDS_REMOTE, "10.244.0.0/16",
                      "10.244.1.0/24",
                      (("pod", "10.244.1.1/24", POD + "/24", "10.244.1.1"),
                       ("remote", "10.244.2.1/24", REMOTE_POD + "/24", "10.244.2.1"),
                       ("inet", "203.0.113.1/24", INTERNET + "/24", None)), "10.244.0.0/16"),
    IpFamily.V6: Plan("fd00:10:244:1::2", "fd00:10:244:2::2", "2001:db8:113::2", "2001:db8:113::1",
                      "fd00:10:244:2::1", "fd00:10:244::/56", "fd00:10:244:1::/64",
                      (("pod", "fd00:10:244:1::1/64", "fd00:10:244:1::2/64", "fd00:10:244:1::1"),
                       ("remote", "fd00:10:244:2::1/64", "fd00:10:244:2::2/64", "fd00:10:244:2::1"),
                       ("inet", "2001:db8:113::1/64", "2001:db8:113::2/64", None)), "fd00:10:244::/56"),
}

SOURCE_ECHO = r"""
import socket, sys
server = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
server.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)  # both families: IPv4 as ::ffff:a.b.c.d
server.bind(("::", int(sys.argv[1])))
print("ready", flush=True)
while True:
    data, peer = server.recvfrom(64)
    server.sendto(peer[0].removeprefix("::ffff:").encode(), peer)
"""

PROBE = r"""
import socket, sys
v6 = ":" in sys.argv[1]
client = socket.socket(socket.AF_INET6 if v6 else socket.AF_INET, socket.SOCK_DGRAM)
client.bind(("::" if v6 else "0.0.0.0", int(sys.argv[3])))
client.settimeout(float(sys.argv[4]))
try:
    client.sendto(b"who am i", (sys.argv[1], int(sys.argv[2])))
    print(client.recvfrom(64)[0].decode())
except socket.timeout:
    print("timeout")
"""


class Lab(NamespaceTopology):
    """The five-address topology above; `seen_by(src_ns, dst_addr)` is what the far end saw."""

    def __init__(self, family: IpFamily = IpFamily.V4):
        super().__init__(("node", "pod", "remote", "inet"))
        self.family = family
        self.plan = PLANS[family]
        self.source_ports = itertools.count(40000)  # a fresh port per probe: a fresh conntrack entry

    def node(self, *argv):
        namespaces.run_in(self.names["node"], list(argv), check=True)

    def _build(self):
        plan = self.plan
        self.node("sysctl", "-qw", "net.ipv4.ip_forward=1")
        self.node("sysctl", "-qw", "net.ipv6.conf.all.forwarding=1")
        nodad = ["nodad"] if self.family is IpFamily.V6 else []
        for role, node_address, far_address, gateway in plan.links:
            far = self.names[role]
            link = f"n-{role}"
            self.node("ip", "link", "add", link, "type", "veth", "peer", "name", "eth0", "netns", far)
            self.node("ip", "addr", "add", node_address, "dev", link, *nodad)
            self.node("ip", "link", "set", link, "up")
            namespaces.run_in(far, ["ip", "addr", "add", far_address, "dev", "eth0", *nodad], check=True)
            namespaces.run_in(far, ["ip", "link", "set", "eth0", "up"], check=True)
            back = plan.node_towards_internet
            route = ["default", "via", gateway] if gateway else [plan.inet_route, "via", back]
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
def family(request):
    return getattr(request, "param", IpFamily.V4)


@pytest.fixture
def lab(family):
    with Lab(family) as lab:
        yield lab


@pytest.fixture
def runner(lab, backend):
    return IptablesRunner(backend=backend, exec_prefix=namespaces.exec_prefix(lab.names["node"]), timeout=120,
                          lock_wait_seconds=60, family=lab.family)  # the xtables lock is shared with every other namespace


@pytest.fixture(params=["iptables", "nftables"])
def dataplane(request):
    return request.param


@pytest.fixture
def nft(lab):
    with NftRunner(lab.names["node"]) as runner:
        yield runner


@pytest.fixture
def manager(lab, runner, dataplane, nft):
    cidrs = {"cluster_cidrs": [lab.plan.cluster], "pod_cidrs": [lab.plan.pod_cidr]}
    if dataplane == "nftables":
        return NftMasqueradeManager(nft=nft, forward_iptables=runner, family=lab.family, **cidrs)
    return MasqueradeManager(runner=runner, **cidrs)


FOREIGN_RULES = ("*nat\n:OTHER-TOOL - [0:0]\n-A POSTROUTING -o lo -j OTHER-TOOL\nCOMMIT\n"
                 "*filter\n-A FORWARD -p udp --dport 9 -j DROP\nCOMMIT\n")


@pytest.mark.parametrize("family", [IpFamily.V4, IpFamily.V6], ids=["ipv4", "ipv6"], indirect=True)
def test_pods_leave_with_the_node_address_and_meet_pods_with_their_own(lab, runner, manager, dataplane, nft):
    a = lab.plan
    runner.restore(FOREIGN_RULES)
    foreign = {table: runner.table(table) for table in ("nat", "filter")}
    assert lab.seen_by("pod", a.internet) == a.pod  # control: no masquerade yet

    assert manager.ensure()
    assert manager.check() == []            # what the kernel saved is exactly what we rendered
    assert manager.ensure() == []           # so a second ensure writes nothing
    assert lab.seen_by("pod", a.internet) == a.node_towards_internet
    assert lab.seen_by("pod", a.remote_pod) == a.pod
    assert lab.seen_by("inet", a.pod) == a.internet                       # outside -> local pods: kept
    assert lab.seen_by("inet", a.remote_pod) == a.node_towards_remote     # outside -> remote pods: masqueraded

    if dataplane == "nftables":
        assert "NETAGENT" not in runner.save()    # FORWARD accepts: no iptables rule of ours
        assert nft.list_table(lab.family.nft, TABLE) is not None
        assert nft.list_table(FAMILY, TABLE) is None or lab.family is IpFamily.V4  # only its own family's table

    manager.cleanup()
    assert "NETAGENT" not in runner.save()
    assert nft.list_table(lab.family.nft, TABLE) is None
    assert {table: runner.table(table) for table in ("nat", "filter")} == foreign
    assert lab.seen_by("pod", a.internet) == a.pod


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

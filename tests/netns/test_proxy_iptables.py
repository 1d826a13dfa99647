"""The iptables service proxy on the real kernel, legacy and nft backends, with real packets.

Topology (every namespace created here and removed afterwards; the root namespace is untouched):

    ep1 10.244.1.2 --+                                  +-- 10.244.9.2  pod (a client on this node)
    ep2 10.244.2.2 --+-- [node, ip_forward, the rules] -+
    ep3 10.244.3.2 --+     default via 192.168.77.2     +-- 192.168.77.2 outside (192.168.77.1 is the node)

Every link is dual-stack (IPv6 `fd00:10:244:N::2` beside `10.244.N.2`, the outside link
fd00:77::/64, DAD off, IPv6 forwarding on the node), so the IPv6 proxy (ip6tables, its own
hairpin set) is checked on the same topology by a representative test of its own.

Each endpoint namespace runs a server on TCP and UDP 8080 answering "<its name> <the source
address it saw>", so every probe tells which endpoint answered and whether the client was
masqueraded. ep1 and ep2 are "on this node" for the model, ep3 on another. The node's
default route points at the outside namespace, which does not forward: a packet to a
service address that no rule translates disappears, so "refused at once" can only come
from our REJECT, and the control probes before the first sync show it.
"""
import subprocess
import sys

import pytest

from netagent.infra.flows import Verdict
from netagent.kernel import namespaces
from netagent.kernel.families import IpFamily
from netagent.kernel.ipset import IpsetRunner
from netagent.kernel.iptables.backend import IptablesTool, binary_name
from netagent.kernel.iptables.restore_format import parse_save, split_tokens
from netagent.kernel.iptables.runner import IptablesRunner
from proxy.iptables import IptablesProxy
from proxy.iptables.names import HAIRPIN_SET, HAIRPIN_SET6, is_owned_chain
from proxy.iptables.render import render_ruleset
from proxy.model import Endpoint, NodeContext, Protocol, ProxyState, ServicePort, ServicePortName, TrafficPolicy
from tests.netns.flow_capture import flow_records, wait_for
from tests.netns.topology import NamespaceTopology

NODE_NAME = "node"
OUTSIDE, NODE_OUTSIDE = "192.168.77.2", "192.168.77.1"
POD = "10.244.9.2"
ENDPOINT_IPS = {"ep1": "10.244.1.2", "ep2": "10.244.2.2", "ep3": "10.244.3.2"}
OUTSIDE6, NODE_OUTSIDE6, POD6 = "fd00:77::2", "fd00:77::1", "fd00:10:244:9::2"
ENDPOINT_IPS6 = {"ep1": "fd00:10:244:1::2", "ep2": "fd00:10:244:2::2", "ep3": "fd00:10:244:3::2"}
NODE_OF = {"ep1": NODE_NAME, "ep2": NODE_NAME, "ep3": "other-node"}
SERVER_PORT = 8080

SERVER = r"""
import socket, sys, threading
name, port = sys.argv[1], int(sys.argv[2])
def serve_tcp(tcp):
    while True:
        connection, peer = tcp.accept()
        connection.sendall(f"{name} {peer[0]}".encode())
        connection.close()
def serve_udp(udp):
    while True:
        data, peer = udp.recvfrom(64)
        udp.sendto(f"{name} {peer[0]}".encode(), peer)
for family, anywhere in ((socket.AF_INET, "0.0.0.0"), (socket.AF_INET6, "::")):
    tcp = socket.socket(family); tcp.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    udp = socket.socket(family, socket.SOCK_DGRAM)
    if family == socket.AF_INET6:
        for s in (tcp, udp):
            s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
    tcp.bind((anywhere, port)); tcp.listen(64); udp.bind((anywhere, port))
    threading.Thread(target=serve_tcp, args=(tcp,), daemon=True).start()
    threading.Thread(target=serve_udp, args=(udp,), daemon=True).start()
print("ready", flush=True)
threading.Event().wait()
"""

PROBE = r"""
import errno, socket, sys, time
protocol, host, port, count, timeout = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5])
for _ in range(count):
    started = time.monotonic()
    try:
        if protocol == "tcp":
            client = socket.create_connection((host, port), timeout=timeout)
            answer = client.recv(64).decode()
        else:
            client = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_DGRAM)
            client.settimeout(timeout)
            client.connect((host, port))
            client.send(b"hello")
            answer = client.recv(64).decode()
        client.close()
    except ConnectionRefusedError:
        answer = "refused"
    except socket.timeout:
        answer = "timeout"
    except OSError as error:
        answer = errno.errorcode.get(error.errno, str(error))
    print(f"{answer}|{time.monotonic() - started:.3f}", flush=True)
"""


class Lab(NamespaceTopology):
    def __init__(self):
        super().__init__(("node", "pod", "out", *ENDPOINT_IPS))

    def _build(self):
        self.run("node", "sysctl", "-qw", "net.ipv4.ip_forward=1")
        links = {"pod": ("10.244.9.1/24", POD + "/24"), "out": (NODE_OUTSIDE + "/24", OUTSIDE + "/24")}
        links.update({role: (ip.rsplit(".", 1)[0] + ".1/24", ip + "/24") for role, ip in ENDPOINT_IPS.items()})
        self.run("node", "sysctl", "-qw", "net.ipv6.conf.all.forwarding=1")
        links6 = {"pod": ("fd00:10:244:9::1/64", POD6 + "/64"), "out": (NODE_OUTSIDE6 + "/64", OUTSIDE6 + "/64")}
        links6.update({role: (ip.rsplit(":", 1)[0] + ":1/64", ip + "/64") for role, ip in ENDPOINT_IPS6.items()})
        for role, (node_address, far_address) in links.items():
            self.run("node", "ip", "link", "add", f"n-{role}", "type", "veth", "peer", "name", "eth0",
                     "netns", self.names[role])
            self.run("node", "ip", "addr", "add", node_address, "dev", f"n-{role}")
            self.run("node", "ip", "addr", "add", links6[role][0], "dev", f"n-{role}", "nodad")
            self.run("node", "ip", "link", "set", f"n-{role}", "up")
            self.run(role, "ip", "addr", "add", far_address, "dev", "eth0")
            self.run(role, "ip", "addr", "add", links6[role][1], "dev", "eth0", "nodad")
            self.run(role, "ip", "link", "set", "eth0", "up")
            if role != "out":
                self.run(role, "ip", "route", "add", "default", "via", node_address.split("/")[0])
                self.run(role, "ip", "-6", "route", "add", "default", "via", links6[role][0].split("/")[0])
        self.run("node", "ip", "route", "add", "default", "via", OUTSIDE)
        self.run("node", "ip", "-6", "route", "add", "default", "via", OUTSIDE6)
        for role in ENDPOINT_IPS:
            self.start_server(role, [sys.executable, "-c", SERVER, role, str(SERVER_PORT)])

    def probe(self, role: str, host: str, port: int, *, count: int = 1, protocol: str = "tcp",
              timeout: float = 15.0) -> list[tuple[str, float]]:
        """`count` requests, each given `timeout` to be answered (an endpoint's server answers
        when a loaded machine schedules it); a probe expected to go unanswered passes a short one."""
        done = namespaces.run_in(self.names[role], [sys.executable, "-c", PROBE, protocol, host, str(port),
                                                    str(count), str(timeout)], check=True,
                                 timeout=count * timeout + 10)
        return [(answer, float(elapsed)) for answer, elapsed in
                (line.rsplit("|", 1) for line in done.stdout.splitlines())]

    def answers(self, role: str, host: str, port: int, **kwargs) -> list[str]:
        return [answer for answer, _ in self.probe(role, host, port, **kwargs)]


@pytest.fixture
def lab():
    with Lab() as lab:
        yield lab


@pytest.fixture
def runner(lab, backend):
    return IptablesRunner(backend=backend, exec_prefix=namespaces.exec_prefix(lab.names["node"]), timeout=120,
                          lock_wait_seconds=60)  # the xtables lock is shared with every other namespace


@pytest.fixture
def proxy(lab, runner):
    return IptablesProxy(iptables=runner, ipset=IpsetRunner(exec_prefix=namespaces.exec_prefix(lab.names["node"])))


NODE = NodeContext(name=NODE_NAME, cluster_cidr="10.244.0.0/16")


def name(service: str) -> ServicePortName:
    return ServicePortName("default", service, "p")


def endpoints(*roles: str) -> tuple[Endpoint, ...]:
    return tuple(Endpoint(ENDPOINT_IPS[role], SERVER_PORT, node_name=NODE_OF[role]) for role in roles)


def state(*entries: tuple[ServicePort, tuple[Endpoint, ...]]) -> ProxyState:
    return ProxyState(NODE, {s.name: s for s, _ in entries}, {s.name: e for s, e in entries})


def assert_kernel_holds_the_render(runner, proxy, desired: ProxyState):
    """What iptables-save prints for our chains is, line for line, what was rendered."""
    ruleset = render_ruleset(desired, settings=proxy.settings)
    saved = parse_save(runner.save())
    for chain in ruleset.chains():
        assert saved[chain.table].chains[chain.name].rules == [tuple(split_tokens(line)[2:]) for line in chain.rules]
    ours = {name for table in saved.values() for name in table.chains if is_owned_chain(name)}
    assert ours == {chain.name for chain in ruleset.chains()}


def rejected(runner) -> int:
    """How many packets our REJECT rules in the node's filter table have answered so far."""
    save = binary_name(runner.family, runner.backend, IptablesTool.SAVE)
    out = subprocess.run([*runner.exec_prefix, save, "-c", "-t", "filter"], capture_output=True, text=True,
                         check=True, timeout=60).stdout
    return sum(int(line[1:line.index(":")]) for line in out.splitlines()
               if line.startswith("[") and " -j REJECT" in line)


def who(answers: list[str]) -> set[str]:
    return {answer.split()[0] for answer in answers}


def seen_sources(answers: list[str]) -> set[str]:
    return {answer.split()[1] for answer in answers}


# requests whose random endpoints must cover all three: one endpoint never picked has odds of 3 * (2/3)**60
SPREAD = 60

WEB = ServicePort(name("web"), Protocol.TCP, 80, "10.96.0.10", node_port=30080)
DNS = ServicePort(name("dns"), Protocol.UDP, 53, "10.96.0.53")


def test_cluster_ip_node_port_and_udp_reach_every_endpoint(lab, runner, proxy):
    desired = state((WEB, endpoints("ep1", "ep2", "ep3")), (DNS, endpoints("ep1", "ep2", "ep3")))
    proxy.sync(desired, changed=None)
    assert_kernel_holds_the_render(runner, proxy, desired)

    from_pod = lab.answers("pod", "10.96.0.10", 80, count=SPREAD)
    assert who(from_pod) == {"ep1", "ep2", "ep3"} and seen_sources(from_pod) == {POD}
    from_outside = lab.answers("out", NODE_OUTSIDE, 30080, count=SPREAD)
    assert who(from_outside) == {"ep1", "ep2", "ep3"}
    assert seen_sources(from_outside) == {"10.244.1.1", "10.244.2.1", "10.244.3.1"}   # masqueraded
    over_udp = lab.answers("pod", "10.96.0.53", 53, count=SPREAD, protocol="udp")
    assert who(over_udp) == {"ep1", "ep2", "ep3"}
    assert {(entry.kind, entry.address) for entry in proxy.programmed()} == {
        ("ClusterIP", "10.96.0.10:80/TCP"), ("NodePort", "*:30080/TCP"), ("ClusterIP", "10.96.0.53:53/UDP")}


def test_external_local_keeps_the_client_address_and_affinity_pins(lab, runner, proxy):
    local_web = ServicePort(name("web"), Protocol.TCP, 80, "10.96.0.10", node_port=30080,
                            external_policy=TrafficPolicy.LOCAL)
    sticky = ServicePort(name("sticky"), Protocol.TCP, 80, "10.96.0.11", affinity_timeout=60)
    desired = state((local_web, endpoints("ep1", "ep2", "ep3")), (sticky, endpoints("ep1", "ep2", "ep3")))
    proxy.sync(desired, changed=None)
    assert_kernel_holds_the_render(runner, proxy, desired)

    from_outside = lab.answers("out", NODE_OUTSIDE, 30080, count=SPREAD)
    assert who(from_outside) == {"ep1", "ep2"} and seen_sources(from_outside) == {OUTSIDE}
    pinned = lab.answers("pod", "10.96.0.11", 80, count=12)
    assert len(who(pinned)) == 1
    spread = lab.answers("pod", "10.96.0.10", 80, count=SPREAD)   # the same client, no affinity: spread
    assert who(spread) == {"ep1", "ep2", "ep3"}


def test_no_endpoints_refuses_at_once_and_partial_syncs_follow_endpoint_changes(lab, runner, proxy):
    assert lab.answers("pod", "10.96.0.10", 80, timeout=0.5) == ["timeout"]   # control: nothing refuses yet
    empty = state((WEB, ()))
    proxy.sync(empty, changed=None)
    assert_kernel_holds_the_render(runner, proxy, empty)
    with flow_records(lab.names["node"]) as ring:
        for role, host, port in (("pod", "10.96.0.10", 80), ("out", NODE_OUTSIDE, 30080)):
            # refused, not timed out: only our REJECT answers (the control above); the SYN it answered
            # was the first, not a retransmission, however slowly the machine ran the probe
            before = rejected(runner)
            assert lab.answers(role, host, port) == ["refused"]
            assert rejected(runner) == before + 1
        logged = wait_for(ring, count=2)        # each refusal was logged first: dropped for no endpoints
    assert {(flow.verdict, flow.reason, flow.destination, flow.destination_port) for flow in logged} == {
        (Verdict.DROPPED, "no-endpoints", "10.96.0.10", 80), (Verdict.DROPPED, "no-endpoints", NODE_OUTSIDE, 30080)}

    one = state((WEB, endpoints("ep1")))
    assert proxy.sync(one, changed=frozenset({WEB.name})).scope.value == "partial"
    assert who(lab.answers("pod", "10.96.0.10", 80, count=5)) == {"ep1"}
    moved = state((WEB, endpoints("ep2", "ep3")))
    proxy.sync(moved, changed=frozenset({WEB.name}))
    assert who(lab.answers("pod", "10.96.0.10", 80, count=SPREAD)) == {"ep2", "ep3"}
    assert_kernel_holds_the_render(runner, proxy, moved)


def test_hairpin_is_masqueraded_and_cleanup_leaves_nothing_of_ours(lab, runner, proxy):
    runner.restore("*nat\n:OTHER-TOOL - [0:0]\n-A POSTROUTING -j OTHER-TOOL\nCOMMIT\n")
    foreign = runner.table("nat")
    lonely = ServicePort(name("lonely"), Protocol.TCP, 80, "10.96.0.12")
    proxy.sync(state((lonely, endpoints("ep1"))), changed=None)
    assert lab.answers("ep1", "10.96.0.12", 80) == ["ep1 10.244.1.1"]   # itself, via the node's address

    proxy.cleanup()
    proxy.cleanup()
    assert "NETAGENT" not in runner.save()
    assert runner.table("nat") == foreign
    assert HAIRPIN_SET not in lab.run("node", "ipset", "list", "-n").stdout.split()
    assert lab.answers("pod", "10.96.0.12", 80, timeout=0.5) == ["timeout"]


def hairpin_sets(lab) -> dict[str, int]:
    """Our hairpin sets in the node namespace -> their maxelem, as the real ipset reports them."""
    found = {}
    for set_name in lab.run("node", "ipset", "list", "-n").stdout.split():
        if set_name.startswith(HAIRPIN_SET):
            header = lab.run("node", "ipset", "list", "-t", set_name).stdout
            found[set_name] = int(header.split("maxelem ", 1)[1].split()[0])
    return found


def test_the_hairpin_set_grows_past_its_capacity_with_the_real_tools(lab, runner):
    """Issue 18 item 3: a full hairpin set failed every sync ('Hash is full', nothing
    programmed). A 64-member first capacity stands for ipset's default 262,144."""
    proxy = IptablesProxy(iptables=runner, ipset=IpsetRunner(exec_prefix=namespaces.exec_prefix(lab.names["node"])),
                          hairpin_minimum=64)
    lonely = ServicePort(name("lonely"), Protocol.TCP, 80, "10.96.0.12")
    proxy.sync(state((lonely, endpoints("ep1"))), changed=None)
    assert hairpin_sets(lab) == {HAIRPIN_SET: 64}
    many = [(ServicePort(name(f"s{i}"), Protocol.TCP, 80, f"10.96.1.{i + 1}"),
             tuple(Endpoint(ip, 9000 + i) for ip in ENDPOINT_IPS.values())) for i in range(100)]
    grown = state((lonely, endpoints("ep1")), *many)      # 301 members
    report = proxy.sync(grown, changed=frozenset(grown.services))
    assert report.scope.value == "partial" and hairpin_sets(lab) == {f"{HAIRPIN_SET}-10": 1024}
    assert f"--match-set {HAIRPIN_SET}-10 dst,dst,src" in runner.save()
    assert lab.answers("ep1", "10.96.0.12", 80) == ["ep1 10.244.1.1"]        # hairpin still masqueraded
    proxy.cleanup()
    assert hairpin_sets(lab) == {}


def test_a_service_port_the_real_tool_refuses_is_left_out_and_the_rest_answers(lab, runner, proxy):
    """Issue 18 item 3: iptables-restore is all or nothing; a Service whose rule the tool
    refuses (here a cluster IP that is no address, "host/network ... not found", as if a value
    had slipped past the parser) no longer costs every other Service its rules. A 1,100-character
    name, which the tool refused in a comment before comments were cut to what xt_comment
    holds, is programmed."""
    refused = ServicePort(ServicePortName("default", "bad", "p"), Protocol.TCP, 80, "10.96.0.300")
    long_named = ServicePort(ServicePortName("default", "x" * 1100, "p"), Protocol.TCP, 80, "10.96.0.21")
    desired = state((WEB, endpoints("ep1")), (refused, endpoints("ep2")), (long_named, endpoints("ep2")))
    report = proxy.sync(desired, changed=None)
    assert set(report.unprogrammed) == {refused.name}
    assert report.unprogrammed[refused.name].startswith("iptables-restore: ")
    assert who(lab.answers("pod", "10.96.0.10", 80, count=3)) == {"ep1"}
    assert who(lab.answers("pod", "10.96.0.21", 80, count=3)) == {"ep2"}
    assert_kernel_holds_the_render(runner, proxy, state((WEB, endpoints("ep1")), (long_named, endpoints("ep2"))))


def test_ipv6_cluster_ip_node_port_hairpin_and_cleanup_through_ip6tables(lab, backend):
    """The IPv6 proxy on the same lab: ip6tables only (IPv4's tables untouched), its own
    hairpin set, NodePorts on the node's IPv6 address, cleanup of its family alone."""
    prefix = namespaces.exec_prefix(lab.names["node"])
    runner6 = IptablesRunner(backend=backend, family=IpFamily.V6, exec_prefix=prefix, timeout=120,
                             lock_wait_seconds=60)
    runner4 = IptablesRunner(backend=backend, exec_prefix=prefix, timeout=120, lock_wait_seconds=60)
    proxy6 = IptablesProxy(iptables=runner6, ipset=IpsetRunner(exec_prefix=prefix))
    web = ServicePort(name("web"), Protocol.TCP, 80, "fd00:10:96::a", node_port=30080)
    lonely = ServicePort(name("lonely"), Protocol.TCP, 80, "fd00:10:96::c")
    node6 = NodeContext(name=NODE_NAME, cluster_cidr="fd00:10:244::/56", family=IpFamily.V6)
    endpoints6 = tuple(Endpoint(ENDPOINT_IPS6[role], SERVER_PORT, node_name=NODE_OF[role]) for role in ENDPOINT_IPS6)
    desired = ProxyState(node6, {web.name: web, lonely.name: lonely},
                         {web.name: endpoints6, lonely.name: endpoints6[:1]})
    proxy6.sync(desired, changed=None)
    assert_kernel_holds_the_render(runner6, proxy6, desired)
    assert "NETAGENT" not in runner4.save()

    from_pod = lab.answers("pod", "fd00:10:96::a", 80, count=SPREAD)
    assert who(from_pod) == {"ep1", "ep2", "ep3"} and seen_sources(from_pod) == {POD6}
    from_outside = lab.answers("out", NODE_OUTSIDE6, 30080, count=SPREAD)
    assert who(from_outside) == {"ep1", "ep2", "ep3"}
    assert seen_sources(from_outside) == {"fd00:10:244:1::1", "fd00:10:244:2::1", "fd00:10:244:3::1"}
    assert lab.answers("ep1", "fd00:10:96::c", 80) == ["ep1 fd00:10:244:1::1"]   # hairpin, masqueraded
    assert HAIRPIN_SET6 in lab.run("node", "ipset", "list", "-n").stdout.split()

    proxy6.cleanup()
    assert "NETAGENT" not in runner6.save()
    assert HAIRPIN_SET6 not in lab.run("node", "ipset", "list", "-n").stdout.split()


STATUS_AND_CLEANUP = r"""
import json, sys
from netagent.daemon.cleanup import remove_proxy_state
from netagent.daemon.status_services import status_services
listing = json.loads(status_services(iptables_backend=sys.argv[1], as_json=True, agent_url="http://127.0.0.1:9/x"))
print(json.dumps({"listed": sorted(s["address"] for s in listing["services"]), "removed": remove_proxy_state()}))
"""


def test_status_services_lists_and_cleanup_removes_both_families(backend):
    """`netagent status services` reads ip6tables beside iptables, and `netagent cleanup` removes
    the IPv6 proxy's chains and hairpin set too (both run inside a namespace of the test's)."""
    import json
    import os
    netns = namespaces.unique_name("na-t-clean")
    namespaces.create(netns)
    try:
        prefix = namespaces.exec_prefix(netns)
        for family, cluster_ip, endpoint in ((IpFamily.V4, "10.96.0.10", "10.244.1.2"),
                                             (IpFamily.V6, "fd00:10:96::a", "fd00:10:244:1::2")):
            web = ServicePort(name("web"), Protocol.TCP, 80, cluster_ip)
            proxy = IptablesProxy(iptables=IptablesRunner(backend=backend, family=family, exec_prefix=prefix,
                                                          timeout=120, lock_wait_seconds=60),
                                  ipset=IpsetRunner(exec_prefix=prefix))
            proxy.sync(ProxyState(NodeContext(name=NODE_NAME, family=family), {web.name: web},
                                  {web.name: (Endpoint(endpoint, SERVER_PORT),)}), changed=None)
        repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        done = namespaces.run_in(netns, [sys.executable, "-c", STATUS_AND_CLEANUP, backend.value], check=True,
                                 timeout=300, env={**os.environ, "PYTHONPATH": repo})
        out = json.loads(done.stdout)
        assert out["listed"] == ["10.96.0.10:80/TCP", "[fd00:10:96::a]:80/TCP"]
        assert any("ip6tables" in line for line in out["removed"])
        for family in IpFamily:
            saved = IptablesRunner(backend=backend, family=family, exec_prefix=prefix).save()
            assert "NETAGENT" not in saved, family
        assert namespaces.run_in(netns, ["ipset", "list", "-n"], check=True).stdout.split() == []
    finally:
        namespaces.remove(netns)

"""The IPVS backend on a kernel that has IPVS (Debian's 6.1 in the VM tier's guest): real packets.

One topology per module (Python under TCG is slow; the backend's syncs and every namespace
cost seconds), built in namespaces of ours and removed at the end. Pods are wired as the CNI's
routed mode does it (a /32, a gateway 169.254.1.1 pinned to the host veth's MAC, a /32 route
on the node): with pods sharing a plain bridge, an endpoint's reply to a pod client would go
straight across the bridge and never reach IPVS to be translated back.

    pod-a 10.244.0.11 ── na-v0 ┐
    pod-b 10.244.0.12 ── na-v1 ├ node (the backends: IpvsProxy.in_namespace; na-ipvs0)
    client 10.244.0.20 ─ na-v2 ┘   na-out 192.168.50.1 ─── outside 192.168.50.2

The lab is dual-stack (pods also fd00:10:244::11, ::12, ::20 behind a gateway fe80::1; the
outside link fd00:50::1/64 and ::2; DAD off in every namespace of ours): an IPv4 and an IPv6
backend share the node's IPVS table and device, as on a dual-stack node. The family-
parameterised tests run on IPv4's full service list and on IPv6's representative subset (web,
web-local, empty: cluster IP, NodePort on the node's IPv6 address, policy Local, hairpin, refusal).

Servers run as threads of this process on sockets made inside the pods' namespaces (a thread
that setns()es only itself), so no extra Python starts: TCP answers each line with
"<pod> <peer address> <line>", UDP each datagram the same way.

Services: web (cluster IP + NodePort, both pods), web-local (externalTrafficPolicy Local),
sticky (ClientIP affinity), empty and empty-udp (no endpoints), dns (UDP), drain (for graceful
removal). Measured here: IPVS itself answers a TCP SYN to a virtual server without real servers
with port-unreachable, but drops UDP silently; the backend's REJECT rule refuses both.
"""
from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import os
import socket
import subprocess
import threading
import time

import pytest

from netagent.infra.fake_clock import FakeClock
from netagent.kernel import namespaces
from netagent.kernel.families import IpFamily
from netagent.kernel.ipset import IpsetRunner
from netagent.kernel.iptables.backend import IptablesBackend
from netagent.kernel.iptables.runner import IptablesRunner
from proxy.ipvs import IpvsProxy, IpvsSettings
from proxy.ipvs.netlink import NetlinkIpvsTable
from proxy.ipvs.table import Destination, VirtualServerKey
from proxy.model import Endpoint, NodeContext, Protocol, ProxyState, ServicePort, ServicePortName, TrafficPolicy
from tests.cluster.lab_tools import syn_retransmits

CLONE_NEWNET = 0x40000000
PODS = {"pod-a": "10.244.0.11", "pod-b": "10.244.0.12"}
CLIENT_IP = "10.244.0.20"
NODE_OUTSIDE_IP = "192.168.50.1"
OUTSIDE_IP = "192.168.50.2"
TCP_PORT, UDP_PORT = 8080, 5353
GRACEFUL_TIMEOUT = 15.0
NODE = NodeContext(name="node-1", cluster_cidr="10.244.0.0/16", local_addresses=(NODE_OUTSIDE_IP,))
V4, V6 = IpFamily.V4, IpFamily.V6
PODS6 = {"pod-a": "fd00:10:244::11", "pod-b": "fd00:10:244::12"}
CLIENT_IP6 = "fd00:10:244::20"
NODE_OUTSIDE_IP6, OUTSIDE_IP6 = "fd00:50::1", "fd00:50::2"
NODE6 = NodeContext(name="node-1", cluster_cidr="fd00:10:244::/56", local_addresses=(NODE_OUTSIDE_IP6,), family=V6)
# per family: the pods, the client, the node's outside address, the outside, web / web-local / empty's cluster IPs
ADDRESSES = {V4: (PODS, CLIENT_IP, NODE_OUTSIDE_IP, OUTSIDE_IP, "10.96.0.10", "10.96.0.11", "10.96.0.13"),
             V6: (PODS6, CLIENT_IP6, NODE_OUTSIDE_IP6, OUTSIDE_IP6, "fd00:10:96::a", "fd00:10:96::b",
                  "fd00:10:96::d")}


def name(service: str, port: str = "") -> ServicePortName:
    return ServicePortName("default", service, port)


WEB, WEB_LOCAL, STICKY, EMPTY, EMPTY_UDP, DNS, DRAIN = (
    name("web"), name("web-local"), name("sticky"), name("empty"), name("empty-udp"), name("dns"), name("drain"))
BOTH = tuple(Endpoint(ip, TCP_PORT, node_name="node-1") for ip in PODS.values())
BOTH_UDP = tuple(Endpoint(ip, UDP_PORT, node_name="node-1") for ip in PODS.values())
SERVICES = {
    WEB: ServicePort(WEB, Protocol.TCP, 80, "10.96.0.10", node_port=30080),
    WEB_LOCAL: ServicePort(WEB_LOCAL, Protocol.TCP, 80, "10.96.0.11", node_port=30081,
                           external_policy=TrafficPolicy.LOCAL),
    STICKY: ServicePort(STICKY, Protocol.TCP, 80, "10.96.0.12", affinity_timeout=60),
    EMPTY: ServicePort(EMPTY, Protocol.TCP, 80, "10.96.0.13", node_port=30083),
    EMPTY_UDP: ServicePort(EMPTY_UDP, Protocol.UDP, 53, "10.96.0.15"),
    DNS: ServicePort(DNS, Protocol.UDP, 53, "10.96.0.53"),
    DRAIN: ServicePort(DRAIN, Protocol.TCP, 80, "10.96.0.14"),
}
ENDPOINTS = {WEB: BOTH, WEB_LOCAL: BOTH, STICKY: BOTH, EMPTY: (), EMPTY_UDP: (), DNS: BOTH_UDP, DRAIN: BOTH}
BOTH6 = tuple(Endpoint(ip, TCP_PORT, node_name="node-1") for ip in PODS6.values())
SERVICES6 = {name: dataclasses.replace(SERVICES[name], cluster_ip=ip)   # IPv6's subset: the same ports
             for name, ip in ((WEB, "fd00:10:96::a"), (WEB_LOCAL, "fd00:10:96::b"), (EMPTY, "fd00:10:96::d"))}
ENDPOINTS6 = {WEB: BOTH6, WEB_LOCAL: BOTH6, EMPTY: ()}

_libc = ctypes.CDLL(None, use_errno=True)


def socket_in(netns: str, kind: int, family: int = socket.AF_INET) -> socket.socket:
    """A socket created inside `netns` (by a short-lived thread that switched only itself)."""
    made: dict = {}

    def make():
        fd = os.open(namespaces.netns_path(netns), os.O_RDONLY)
        try:
            if _libc.setns(fd, CLONE_NEWNET) != 0:
                made["error"] = OSError(ctypes.get_errno(), "setns")
                return
            made["socket"] = socket.socket(family, kind)
        finally:
            os.close(fd)

    thread = threading.Thread(target=make)
    thread.start()
    thread.join()
    if "error" in made:
        raise made["error"]
    return made["socket"]


def serve_tcp(listener: socket.socket, pod: str) -> None:
    def answer(conn: socket.socket, peer: str):
        with conn, conn.makefile("rwb") as stream:
            for line in stream:
                stream.write(f"{pod} {peer} {line.decode().strip()}\n".encode())
                stream.flush()

    while True:
        try:
            conn, address = listener.accept()
            peer = address[0]
        except OSError:
            return
        threading.Thread(target=answer, args=(conn, peer), daemon=True).start()


def serve_udp(sock: socket.socket, pod: str) -> None:
    while True:
        try:
            data, (peer, port) = sock.recvfrom(2048)
            sock.sendto(f"{pod} {peer} {data.decode().strip()}".encode(), (peer, port))
        except OSError:
            return


class Connection:
    """A TCP connection from a namespace that sends lines and reads answers."""

    def __init__(self, netns: str, address: str, port: int, *, timeout: float = 5):
        family = socket.AF_INET6 if ":" in address else socket.AF_INET
        self.sock = socket_in(netns, socket.SOCK_STREAM, family)
        self.sock.settimeout(timeout)
        self.sock.connect((address, port))
        self.stream = self.sock.makefile("rwb")

    def ask(self, line: str = "hello") -> list[str]:
        self.stream.write(f"{line}\n".encode())
        self.stream.flush()
        answer = self.stream.readline().decode().split()
        assert answer, "connection closed without an answer"
        return answer

    def close(self):
        self.stream.close()
        self.sock.close()


def ask_once(netns: str, address: str, port: int) -> list[str]:
    connection = Connection(netns, address, port)
    try:
        return connection.ask()
    finally:
        connection.close()


def ip_batch(netns: str, *commands: str) -> None:
    done = subprocess.run(["ip", "-n", netns, "-batch", "-"], input="\n".join(commands) + "\n",
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, f"ip -n {netns} -batch: {done.stderr}\n{commands}"


class Lab:
    def __init__(self):
        self.ns: dict[str, str] = {}
        self.sockets: list[socket.socket] = []
        self.proxy: IpvsProxy | None = None
        self.proxy6: IpvsProxy | None = None
        self.clock = FakeClock()  # the backends' clock: graceful removal is timed by the test, not waited for
        self.state = ProxyState(NODE, services=SERVICES, endpoints=ENDPOINTS)
        self.state6 = ProxyState(NODE6, services=SERVICES6, endpoints=ENDPOINTS6)

    def build(self):
        for role in ("node", "pod-a", "pod-b", "client", "outside"):
            self.ns[role] = namespaces.unique_name(f"na-t-{role[:3]}")
            namespaces.create(self.ns[role])
            namespaces.run_in(self.ns[role], ["sh", "-c", "echo 0 > /proc/sys/net/ipv6/conf/all/accept_dad; "
                                              "echo 0 > /proc/sys/net/ipv6/conf/default/accept_dad"], check=True)
        node = self.ns["node"]
        wiring = []
        addresses6 = {**PODS6, "client": CLIENT_IP6}
        for index, (role, address) in enumerate([*PODS.items(), ("client", CLIENT_IP)]):
            wiring += [f"link add na-v{index} type veth peer name eth0 netns {self.ns[role]}",
                       f"link set na-v{index} address ee:ee:ee:ee:ee:ee up",
                       f"route add {address}/32 dev na-v{index} scope link",
                       f"route add {addresses6[role]}/128 dev na-v{index}"]
        wiring += [f"link add na-out type veth peer name eth0 netns {self.ns['outside']}",
                   f"addr add {NODE_OUTSIDE_IP}/24 dev na-out", f"addr add {NODE_OUTSIDE_IP6}/64 dev na-out nodad",
                   "link set na-out up"]
        ip_batch(node, *wiring)
        for role, address in [*PODS.items(), ("client", CLIENT_IP)]:
            ip_batch(self.ns[role], f"addr add {address}/32 dev eth0", f"addr add {addresses6[role]}/128 dev eth0 nodad",
                     "link set eth0 up",
                     "route add 169.254.1.1 dev eth0 scope link",
                     "neigh add 169.254.1.1 lladdr ee:ee:ee:ee:ee:ee dev eth0 nud permanent",
                     "route add default via 169.254.1.1 dev eth0",
                     "neigh add fe80::1 lladdr ee:ee:ee:ee:ee:ee dev eth0 nud permanent",
                     "route add ::/0 via fe80::1 dev eth0")
        ip_batch(self.ns["outside"], f"addr add {OUTSIDE_IP}/24 dev eth0", f"addr add {OUTSIDE_IP6}/64 dev eth0 nodad",
                 "link set eth0 up")
        for pod in PODS:
            listener6 = socket_in(self.ns[pod], socket.SOCK_STREAM, socket.AF_INET6)
            listener6.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            listener6.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listener6.bind(("::", TCP_PORT))
            listener6.listen(64)
            self.sockets.append(listener6)
            threading.Thread(target=serve_tcp, args=(listener6, pod), daemon=True).start()
            listener = socket_in(self.ns[pod], socket.SOCK_STREAM)
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listener.bind(("0.0.0.0", TCP_PORT))
            listener.listen(64)
            udp = socket_in(self.ns[pod], socket.SOCK_DGRAM)
            udp.bind(("0.0.0.0", UDP_PORT))
            self.sockets += [listener, udp]
            threading.Thread(target=serve_tcp, args=(listener, pod), daemon=True).start()
            threading.Thread(target=serve_udp, args=(udp, pod), daemon=True).start()
        self.proxy = self.new_proxy()
        self.proxy.sync(self.state, changed=None)
        self.proxy6 = self.new_proxy(V6)
        self.proxy6.sync(self.state6, changed=None)

    def new_proxy(self, family: IpFamily = V4) -> IpvsProxy:
        return IpvsProxy.in_namespace(netns=self.ns["node"], iptables_backend=IptablesBackend.NFT,
                                      settings=IpvsSettings(graceful_timeout=GRACEFUL_TIMEOUT), clock=self.clock,
                                      family=family)

    def update(self, **endpoints) -> None:
        """Change endpoints of services (by attribute name of this module) with a partial sync."""
        changed = dict(self.state.endpoints)
        for key, value in endpoints.items():
            changed[globals()[key.upper()]] = value
        new = ProxyState(NODE, services=SERVICES, endpoints=changed)
        self.proxy.sync(new, changed=new.changed_since(self.state))
        self.state = new

    def teardown(self):
        for sock in self.sockets:
            sock.close()
        for proxy in (self.proxy, self.proxy6):
            if proxy is not None:
                proxy.close()
        for netns in self.ns.values():
            namespaces.remove(netns)


@pytest.fixture(scope="module")
def lab():
    built = Lab()
    try:
        built.build()
        yield built
    finally:
        built.teardown()
    leaked = [n for n in built.ns.values() if os.path.exists(namespaces.netns_path(n))]
    assert not leaked, f"namespaces leaked: {leaked}"


FAMILIES = pytest.mark.parametrize("family", [V4, V6], ids=["ipv4", "ipv6"])


@FAMILIES
def test_cluster_ip_answers_from_every_endpoint_in_turn(lab, family):
    _, client_ip, _, _, web, _, _ = ADDRESSES[family]
    answers = [ask_once(lab.ns["client"], web, 80) for _ in range(4)]
    pods = [answer[0] for answer in answers]
    assert set(pods) == set(PODS) and pods[0] != pods[1] and pods[:2] == pods[2:], pods
    assert {answer[1] for answer in answers} == {client_ip}, "pod traffic keeps its address"


@FAMILIES
def test_node_port_from_outside_is_masqueraded(lab, family):
    _, _, node_ip, outside_ip, _, _, _ = ADDRESSES[family]
    pod, peer, _ = ask_once(lab.ns["outside"], node_ip, 30080)
    assert pod in PODS and peer != outside_ip, "policy Cluster: the endpoint sees the node"


@FAMILIES
def test_external_traffic_policy_local_keeps_the_client_address(lab, family):
    _, _, node_ip, outside_ip, _, _, _ = ADDRESSES[family]
    pod, peer, _ = ask_once(lab.ns["outside"], node_ip, 30081)
    assert pod in PODS and peer == outside_ip


def test_affinity_pins_a_client(lab):
    pods = {ask_once(lab.ns["client"], "10.96.0.12", 80)[0] for _ in range(4)}
    assert len(pods) == 1, pods


@FAMILIES
def test_hairpin_a_pod_reaches_itself_through_its_service(lab, family):
    pods, _, _, _, web, _, _ = ADDRESSES[family]
    answers = [ask_once(lab.ns["pod-a"], web, 80) for _ in range(2)]
    itself = [answer for answer in answers if answer[0] == "pod-a"]
    assert itself and itself[0][1] != pods["pod-a"], "hairpin traffic is masqueraded"


@pytest.mark.parametrize("where, address, port", [("client", "10.96.0.13", 80), ("node", "10.96.0.13", 80),
                                                   ("outside", NODE_OUTSIDE_IP, 30083),
                                                   ("client", "fd00:10:96::d", 80),
                                                   ("outside", NODE_OUTSIDE_IP6, 30083)])
def test_no_endpoints_refuses_at_once(lab, where, address, port):
    before = syn_retransmits(namespaces.exec_prefix(lab.ns[where]))
    with pytest.raises(ConnectionRefusedError):
        Connection(lab.ns[where], address, port, timeout=5)
    # IPv4: refused at the first SYN. IPv6: the port-unreachable answering the first SYN comes
    # back over the veth while connect() still holds the socket lock, and TCP takes it as a soft
    # error (TcpExtLockDroppedIcmps); the one answering the retransmit ends it. Measured the same
    # with a plain ip6tables REJECT between two namespaces, no IPVS: a kernel trait, not ours.
    # A silent drop would time out instead, after several retransmits.
    retransmits = syn_retransmits(namespaces.exec_prefix(lab.ns[where])) - before
    assert retransmits <= (1 if ":" in address else 0)


@FAMILIES
def test_a_service_address_answers_only_on_its_service_ports(lab, family):
    """Issue 29 item 4: na-ipvs0 makes every service address local, so a socket of the node on a
    wildcard address would answer on it; the filter drops every port that is not the Service's,
    while the service port keeps working from a pod and from the node itself (replies pass)."""
    _, _, node_ip, _, web, _, _ = ADDRESSES[family]
    inet, port = (socket.AF_INET6, 2223) if family is V6 else (socket.AF_INET, 2222)   # a thread keeps each
    listener = socket_in(lab.ns["node"], socket.SOCK_STREAM, inet)
    if family is V6:
        listener.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("::" if family is V6 else "0.0.0.0", port))
    listener.listen(8)
    threading.Thread(target=serve_tcp, args=(listener, "node-sshd"), daemon=True).start()
    try:
        assert ask_once(lab.ns["client"], node_ip, port)[0] == "node-sshd"   # the node's own address: answered
        for where in ("client", "node"):
            with pytest.raises(TimeoutError):   # dropped: never an answer or a refusal
                Connection(lab.ns[where], web, port, timeout=3)
            assert ask_once(lab.ns[where], web, 80)[0] in PODS
    finally:
        listener.close()


def test_no_endpoints_refuses_udp_at_once(lab):
    client = socket_in(lab.ns["client"], socket.SOCK_DGRAM)
    client.settimeout(2)
    try:
        client.connect(("10.96.0.15", 53))
        client.send(b"anyone?")
        with pytest.raises(ConnectionRefusedError):
            client.recv(2048)
    finally:
        client.close()


def test_udp_client_moves_to_a_new_endpoint_after_the_old_one_goes(lab):
    client = socket_in(lab.ns["client"], socket.SOCK_DGRAM)
    client.settimeout(1)
    try:
        first = ""
        deadline = time.monotonic() + 60   # the server answers in its own time under TCG
        while not first:
            assert time.monotonic() < deadline, "no answer from the DNS service"
            client.sendto(b"first", ("10.96.0.53", 53))
            with contextlib.suppress(socket.timeout):
                first = client.recv(2048).decode().split()[0]
        survivor = next(pod for pod in PODS if pod != first)
        lab.update(dns=tuple(e for e in BOTH_UDP if e.ip == PODS[survivor]))
        deadline = time.monotonic() + 60
        answers = []
        while time.monotonic() < deadline:
            client.sendto(b"again", ("10.96.0.53", 53))
            try:
                answers.append(client.recv(2048).decode().split()[0])
            except socket.timeout:
                continue
            if answers[-1] == survivor:
                break
        assert answers and answers[-1] == survivor, answers
    finally:
        client.close()
        lab.update(dns=BOTH_UDP)


def real_servers(lab, key: VirtualServerKey) -> dict:
    table = NetlinkIpvsTable(netns=lab.ns["node"])
    try:
        return {r.destination: r for r in table.real_servers(key)}
    finally:
        table.close()


def test_graceful_removal_keeps_an_established_connection_until_it_ends(lab):
    key = VirtualServerKey("10.96.0.14", Protocol.TCP, 80)
    connection = Connection(lab.ns["client"], "10.96.0.14", 80)
    try:
        pod = connection.ask("before")[0]
        other = next(p for p in PODS if p != pod)
        leaving, staying = Destination(PODS[pod], TCP_PORT), Destination(PODS[other], TCP_PORT)
        lab.update(drain=tuple(e for e in BOTH if e.ip == staying.address))
        reals = real_servers(lab, key)
        assert {d: r.weight for d, r in reals.items()} == {leaving: 0, staying: 1}
        assert reals[leaving].active_connections == 1
        assert connection.ask("during")[0] == pod, "the draining endpoint still serves its connection"
        assert {ask_once(lab.ns["client"], "10.96.0.14", 80)[0] for _ in range(2)} == {other}
        restarted = lab.new_proxy()          # an agent restart adopts, and the connection survives
        try:
            restarted.sync(lab.state, changed=None)
        finally:
            restarted.close()
        assert connection.ask("after restart")[0] == pod
        lab.clock.advance(GRACEFUL_TIMEOUT - 1)
        lab.proxy.reap_drained()
        assert connection.ask("still draining")[0] == pod and real_servers(lab, key)[leaving].weight == 0
    finally:
        connection.close()
    lab.clock.advance(1)                            # closed connections linger as inactive: the timeout ends the drain
    lab.proxy.reap_drained()
    assert set(real_servers(lab, key)) == {staying}


def test_cleanup_of_each_family_removes_its_own_and_the_last_removes_everything(lab):
    node = lab.ns["node"]
    prefix = namespaces.exec_prefix(node)
    iptables = {f: IptablesRunner(backend=IptablesBackend.NFT, family=f, exec_prefix=prefix) for f in (V4, V6)}
    table = NetlinkIpvsTable(netns=node)
    try:
        lab.proxy6.cleanup()
        assert {s.key.family for s in table.virtual_servers()} == {V4}
        assert ask_once(lab.ns["client"], "10.96.0.10", 80)[0] in PODS, "IPv4 still serves"
        assert "NETAGENT" not in iptables[V6].save() and "NETAGENT-IPVS-SVCS" in iptables[V4].save()
        assert not [n for n in IpsetRunner(exec_prefix=prefix).list_names() if n.startswith("NETAGENT-IPVS6-")]
        assert namespaces.run_in(node, ["ip", "-6", "addr", "show", "dev", "na-ipvs0", "scope", "global"],
                                 check=True).stdout.strip() == ""
        lab.proxy.cleanup()
        assert table.virtual_servers() == []
    finally:
        table.close()
    assert namespaces.run_in(node, ["ip", "link", "show", "na-ipvs0"]).returncode != 0
    assert IpsetRunner(exec_prefix=prefix).list_names() == []
    assert "NETAGENT" not in iptables[V4].save()

"""The socket load balancer on the real kernel: compiled by bcc, maps pinned in a private bpffs,
programs attached to a test-made cgroup; real sockets in a test-made network namespace.
The topology is dual-stack; the family-parameterised tests run once with an IPv4 backend and
once with an IPv6 one (`family=IpFamily.V6`, the connect6/sendmsg6/recvmsg6/getpeername6 hooks),
and a v4-mapped address on an AF_INET6 socket reaches an IPv4 Service."""
import ctypes

import pytest

from ebpf import maps as M
from tests.netns.ebpf_fixtures import bpf_root, require_bcc, test_cgroup  # noqa: F401


@pytest.fixture(autouse=True)
def _bcc():
    require_bcc()


def test_python_views_match_the_c_structs_as_bcc_compiles_them(bpf_root, test_cgroup):  # noqa: F811
    from bcc import BPF

    from ebpf.loader import SocketLbLoader
    loader = SocketLbLoader(bpf_root=bpf_root, cgroup=test_cgroup)
    import os
    os.makedirs(loader.pin_dir)
    compiled = BPF(text=loader.source().encode())
    try:
        for name, layout in M.LAYOUTS.items():
            table = compiled[name.encode()]
            for ours, theirs in ((layout.key, table.Key), (layout.value, table.Leaf)):
                assert ctypes.sizeof(ours) == ctypes.sizeof(theirs), name
                if hasattr(theirs, "_fields_"):
                    assert [f[0] for f in ours._fields_] == [f[0] for f in theirs._fields_], name
                    for field, *_ in theirs._fields_:
                        assert getattr(ours, field).offset == getattr(theirs, field).offset, (name, field)
                        assert getattr(ours, field).size == getattr(theirs, field).size, (name, field)
    finally:
        compiled.cleanup()


# ---- real sockets, through the backend ---------------------------------------------------------------

import errno  # noqa: E402
import json  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402

from netagent.kernel.families import IpFamily  # noqa: E402
from proxy.ebpf.backend import EbpfPaths, EbpfProxy  # noqa: E402
from proxy.factory import build_ebpf_backend  # noqa: E402
from proxy.model import Endpoint, NodeContext, Protocol, ProxyState, ServicePort, ServicePortName  # noqa: E402
from netagent.kernel import namespaces  # noqa: E402
from tests.netns.ebpf_fixtures import run_in_cgroup  # noqa: E402
from tests.netns.topology import NamespaceTopology  # noqa: E402

BACKENDS = ("10.77.0.2", "10.77.0.3")
BACKENDS6 = ("fd77::2", "fd77::3")
CLIENT6 = "fd77::1"
WEB = ServicePortName("default", "web", "http")
DNS = ServicePortName("kube-system", "dns", "dns")
EMPTY = ServicePortName("default", "empty")
EMPTY_UDP = ServicePortName("default", "empty-udp")
NODE = NodeContext(name="node-1", local_addresses=("10.77.0.1",))

SERVERS = r"""
import socket, sys, threading
def tcp(s, addr):
    while True:
        c, _ = s.accept(); c.sendall(addr.encode()); c.close()
def udp(s, addr):
    while True:
        data, peer = s.recvfrom(512); s.sendto(addr.encode() + b" " + data, peer)
sockets = []
for addr in sys.argv[1:]:   # bound and listening before "ready": only the serving is left to the threads
    family = socket.AF_INET6 if ":" in addr else socket.AF_INET
    s = socket.socket(family); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind((addr, 8080)); s.listen(64)
    u = socket.socket(family, socket.SOCK_DGRAM); u.bind((addr, 5353))
    sockets += [(tcp, s, addr), (udp, u, addr)]
for serve, s, addr in sockets:
    threading.Thread(target=serve, args=(s, addr), daemon=True).start()
print("ready", flush=True)
threading.Event().wait()
"""


class ClientAndBackends(NamespaceTopology):
    """client (10.77.0.1, fd77::1) -- veth -- backends (10.77.0.2, 10.77.0.3, fd77::2, fd77::3),
    TCP 8080 and UDP 5353 each."""

    def __init__(self):
        super().__init__(["cli", "be"])

    def _build(self):
        veth_client, veth_backends = (f"na-e{self.names['cli'][-6:]}", f"na-f{self.names['cli'][-6:]}")
        subprocess.run(["ip", "-n", self.names["cli"], "link", "add", veth_client, "type", "veth", "peer", "name",
                        veth_backends, "netns", self.names["be"]], check=True)
        self.run("cli", "ip", "addr", "add", "10.77.0.1/24", "dev", veth_client)
        self.run("cli", "ip", "addr", "add", f"{CLIENT6}/64", "dev", veth_client, "nodad")
        self.run("cli", "ip", "link", "set", veth_client, "up")
        for address in BACKENDS:
            self.run("be", "ip", "addr", "add", f"{address}/24", "dev", veth_backends)
        for address in BACKENDS6:
            self.run("be", "ip", "addr", "add", f"{address}/64", "dev", veth_backends, "nodad")
        self.run("be", "ip", "link", "set", veth_backends, "up")
        self.run("be", "ip", "link", "set", "lo", "up")
        self.start_server("be", [sys.executable, "-c", SERVERS, *BACKENDS, *BACKENDS6])


# the cluster IPs of each family: web (TCP), dns (UDP), empty (TCP), empty (UDP)
CLUSTER_IPS = {IpFamily.V4: ("10.96.0.10", "10.96.0.53", "10.96.0.99", "10.96.0.98"),
               IpFamily.V6: ("fd00:10:96::10", "fd00:10:96::53", "fd00:10:96::99", "fd00:10:96::98")}
SERVED_BY = {IpFamily.V4: BACKENDS, IpFamily.V6: BACKENDS6}
NODE6 = NodeContext(name="node-1", local_addresses=(CLIENT6,), family=IpFamily.V6)


def service_state(*, affinity: int | None = None, family: IpFamily = IpFamily.V4) -> ProxyState:
    web, dns, empty, empty_udp = CLUSTER_IPS[family]
    services = {
        WEB: ServicePort(name=WEB, protocol=Protocol.TCP, port=80, cluster_ip=web, affinity_timeout=affinity),
        DNS: ServicePort(name=DNS, protocol=Protocol.UDP, port=53, cluster_ip=dns),
        EMPTY: ServicePort(name=EMPTY, protocol=Protocol.TCP, port=80, cluster_ip=empty),
        EMPTY_UDP: ServicePort(name=EMPTY_UDP, protocol=Protocol.UDP, port=53, cluster_ip=empty_udp),
    }
    endpoints = {WEB: tuple(Endpoint(ip=ip, port=8080) for ip in SERVED_BY[family]),
                 DNS: tuple(Endpoint(ip=ip, port=5353) for ip in SERVED_BY[family])}
    return ProxyState(node=NODE if family is IpFamily.V4 else NODE6, services=services, endpoints=endpoints)


def client(family: IpFamily, *, mapped: bool = False) -> str:
    """CLIENT aimed at `family`'s cluster IPs; `mapped`: IPv4's, as v4-mapped addresses on AF_INET6 sockets."""
    addresses = [f"::ffff:{ip}" if mapped else ip for ip in CLUSTER_IPS[family]]
    inet = "AF_INET6" if mapped or family is IpFamily.V6 else "AF_INET"
    return f"WEB, DNS, EMPTY, EMPTY_UDP = {addresses!r}\nINET = {inet!r}\n" + CLIENT


CLIENT = r"""
import errno, json, socket
INET = getattr(socket, INET)
out = {"tcp": [], "peer": [], "udp": [], "udp_from": [], "connected_udp_peer": None}
for _ in range(40):   # two backends picked at random: all 40 alike has odds of 2 in 2**40
    s = socket.socket(INET); s.settimeout(30); s.connect((WEB, 80))
    out["peer"].append(list(s.getpeername())[:2]); out["tcp"].append(s.recv(64).decode()); s.close()
u = socket.socket(INET, socket.SOCK_DGRAM); u.settimeout(30)
for i in range(40):
    u.sendto(b"q%d" % i, (DNS, 53))
    data, source = u.recvfrom(512)
    out["udp"].append(data.decode()); out["udp_from"].append(list(source)[:2])
c = socket.socket(INET, socket.SOCK_DGRAM); c.settimeout(30); c.connect((DNS, 53))
c.send(b"hello"); c.recv(512); out["connected_udp_peer"] = list(c.getpeername())[:2]
e = socket.socket(INET); e.settimeout(30)
try:
    e.connect((EMPTY, 80)); out["empty"] = [0]
except OSError as error:
    out["empty"] = [error.errno]
e = socket.socket(INET, socket.SOCK_DGRAM)
try:
    e.sendto(b"q", (EMPTY_UDP, 53)); out["empty"].append(0)
except OSError as error:
    out["empty"].append(error.errno)
print(json.dumps(out))
"""


@pytest.fixture
def lab(bpf_root, test_cgroup):  # noqa: F811
    with ClientAndBackends() as topology:
        paths = EbpfPaths(bpf_root=bpf_root, cgroup=test_cgroup)
        backend = build_ebpf_backend(paths)
        try:
            yield topology, backend, paths
        finally:
            backend.cleanup()


def family_backend(backend, family: IpFamily):
    """The backend of `family` over the same loaded programs and pinned maps (IPv4's is `backend`)."""
    return backend if family is IpFamily.V4 else EbpfProxy(maps=backend.maps, paths=backend.paths, family=family)


def assert_balanced(out: dict, family: IpFamily, *, mapped: bool = False) -> None:
    web, dns, _, _ = (f"::ffff:{ip}" if mapped else ip for ip in CLUSTER_IPS[family])
    assert set(out["tcp"]) == set(SERVED_BY[family])            # both backends answered (40 connects)
    assert all(peer == [web, 80] for peer in out["peer"])
    assert {reply.split()[0] for reply in out["udp"]} == set(SERVED_BY[family])
    assert all(source == [dns, 53] for source in out["udp_from"])   # replies from the service
    assert out["connected_udp_peer"] == [dns, 53]
    assert out["empty"] == [errno.ECONNREFUSED, errno.ECONNREFUSED]


@pytest.mark.parametrize("family", list(IpFamily), ids=lambda f: f.label)
def test_tcp_udp_getpeername_and_refusal_through_the_socket_load_balancer(lab, family):
    topology, backend, paths = lab
    family_backend(backend, family).sync(service_state(family=family), changed=None)
    result = run_in_cgroup(paths.cgroup, topology.names["cli"], client(family))
    assert result.returncode == 0, result.stderr
    assert_balanced(json.loads(result.stdout), family)


def test_v4_mapped_addresses_on_an_ipv6_socket_reach_the_ipv4_service(lab):
    """An AF_INET6 socket naming ::ffff:10.96.0.10 is balanced by the IPv4 Service (as Cilium
    does); getpeername and the UDP replies show the mapped service address."""
    topology, backend, paths = lab
    backend.sync(service_state(), changed=None)
    result = run_in_cgroup(paths.cgroup, topology.names["cli"], client(IpFamily.V4, mapped=True))
    assert result.returncode == 0, result.stderr
    assert_balanced(json.loads(result.stdout), IpFamily.V4, mapped=True)


def test_both_families_side_by_side_keep_their_own_maps(lab):
    topology, backend, paths = lab
    backend6 = family_backend(backend, IpFamily.V6)
    backend.sync(service_state(), changed=None)
    backend6.sync(service_state(family=IpFamily.V6), changed=None)
    for family in IpFamily:
        result = run_in_cgroup(paths.cgroup, topology.names["cli"], client(family))
        assert result.returncode == 0, result.stderr
        assert_balanced(json.loads(result.stdout), family)
    shown4 = {s.address for s in backend.programmed()}
    shown6 = {s.address for s in backend6.programmed()}
    assert "10.96.0.10:80/TCP" in shown4 and "fd00:10:96::10:80/TCP" in shown6 and not shown4 & shown6
    web6 = {s.address: s.backends for s in backend6.programmed()}["fd00:10:96::10:80/TCP"]
    assert set(web6) == {f"[{ip}]:8080" for ip in BACKENDS6}


def test_client_ip_affinity_keeps_one_backend(lab):
    topology, backend, paths = lab
    backend.sync(service_state(affinity=300), changed=None)
    result = run_in_cgroup(paths.cgroup, topology.names["cli"], client(IpFamily.V4))
    assert result.returncode == 0, result.stderr
    assert len(set(json.loads(result.stdout)["tcp"])) == 1


def test_only_the_given_cgroup_is_balanced(lab):
    topology, backend, _ = lab
    backend.sync(service_state(), changed=None)
    outside = subprocess.run(["ip", "netns", "exec", topology.names["cli"], sys.executable, "-c",
                              "import socket\ntry:\n socket.create_connection(('10.96.0.10', 80), timeout=30)\n"
                              "except OSError as e: print(e.errno)"], capture_output=True, text=True, timeout=120)
    assert outside.stdout.strip() == str(errno.ENETUNREACH)   # no route to the cluster IP: untouched


def test_a_restarted_agent_adopts_the_pinned_maps_and_writes_nothing(lab):
    topology, backend, paths = lab
    backend.sync(service_state(), changed=None)
    established = subprocess.Popen(
        ["sh", "-c", f'echo $$ > {paths.cgroup}/cgroup.procs && exec ip netns exec {topology.names["cli"]} '
                     f'{sys.executable} -c "$0"',
         "import socket,sys\ns=socket.create_connection(('10.96.0.10',80),timeout=30)\n"
         "print(s.recv(64).decode(),flush=True)\nsys.stdin.readline()\nprint(s.getpeername(),flush=True)"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert established.stdout.readline().strip() in BACKENDS
        again = build_ebpf_backend(paths)        # a new agent: compiles, finds the same programs attached
        assert again.load_report.attached == () and len(again.load_report.kept) == 8
        report = again.sync(service_state(), changed=None)
        assert "0 map entries written" in report.detail
        established.stdin.write("\n")
        established.stdin.flush()
        assert established.stdout.readline().strip() == "('10.96.0.10', 80)"
        shown = {(s.address, s.name): s.backends for s in again.programmed()}
        assert set(shown[("10.96.0.10:80/TCP", "default/web:http")]) == {f"{ip}:8080" for ip in BACKENDS}
    finally:
        established.kill()
        established.wait()


def test_cleanup_detaches_every_program_and_unpins_every_map(lab):
    import os

    from ebpf.loader import attached_programs, pin_dir
    _, backend, paths = lab
    backend.sync(service_state(), changed=None)
    assert len([p for p in attached_programs(paths.cgroup) if p.ours]) == 8
    backend.cleanup()
    assert not [p for p in attached_programs(paths.cgroup) if p.ours]
    assert not os.path.exists(pin_dir(paths.bpf_root))


def test_status_bpf_lists_programs_and_map_fill_and_status_services_reads_the_maps(lab):
    topology, backend, paths = lab
    backend.sync(service_state(), changed=None)
    family_backend(backend, IpFamily.V6).sync(service_state(family=IpFamily.V6), changed=None)
    shown = subprocess.run([sys.executable, "-m", "netagent.cli", "status", "bpf", "--json", "--bpf-root",
                            paths.bpf_root, "--cgroup-root", paths.cgroup], capture_output=True, text=True, timeout=60)
    status = json.loads(shown.stdout)
    assert sorted(p["hook"] for p in status["programs"] if p["ours"]) == \
        ["connect4", "connect6", "getpeername4", "getpeername6", "recvmsg4", "recvmsg6", "sendmsg4", "sendmsg6"]
    fill = {m["name"]: m["entries"] for m in status["maps"]}
    assert fill["na_svc"] == 4 and fill["na_slots"] == 4 and fill["na_setname"] == 4
    assert fill["na_svc6"] == 4 and fill["na_slots6"] == 4 and fill["na_sock_revnat6"] is None
    # from the test's own namespace: the agent it asks first (127.0.0.1:10249) is nobody's there,
    # where in the root namespace another suite's agent might answer
    services = subprocess.run([*namespaces.exec_prefix(topology.names["cli"]), sys.executable, "-m", "netagent.cli",
                               "status", "services", "--json", "--bpf-root", paths.bpf_root],
                              capture_output=True, text=True, timeout=60)
    listing = json.loads(services.stdout)
    assert (listing["source"], listing["mode"]) == ("kernel", "ebpf")
    assert {s["address"] for s in listing["services"]} == {"10.96.0.10:80/TCP", "10.96.0.53:53/UDP",
                                                           "10.96.0.99:80/TCP", "10.96.0.98:53/UDP",
                                                           "fd00:10:96::10:80/TCP", "fd00:10:96::53:53/UDP",
                                                           "fd00:10:96::99:80/TCP", "fd00:10:96::98:53/UDP"}


def test_map_counts_in_the_kernel_over_many_batches_and_without_batch_lookups(lab):
    from ebpf import maps as M
    from ebpf import syscall
    _, backend, _ = lab
    slots = backend.maps.slots   # a hash map: counted by MAP_LOOKUP_BATCH chunks
    slots.update({M.slot_key(900, i): M.backend(f"10.250.{i // 250}.{i % 250 + 1}", 80) for i in range(300)})
    lbsrc = backend.maps.lbsrc   # an LPM trie: no batch lookups, counted by a key walk
    lbsrc.update({M.lbsrc_key(900, f"192.0.2.{i * 16}/28"): M.ALLOWED for i in range(3)})
    try:
        assert syscall.map_count(slots.fd, slots.key_size, slots.value_size, chunk=64) == 300 == slots.count()
        assert lbsrc.count() == 3 == len(lbsrc.read_all())
        assert {name: fill for name, (fill, _) in backend.table_fill().items()}[M.SLOTS_MAP] == 300
    finally:
        slots.delete([M.slot_key(900, i) for i in range(300)])
        lbsrc.delete(list(lbsrc.read_all()))
    assert slots.count() == 0 and lbsrc.count() == 0

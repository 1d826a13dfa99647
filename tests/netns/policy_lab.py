"""A node with nine pods for NetworkPolicy truth tables: namespaces x, y, z with pods a, b, c.

Modelled on the upstream suite's probe matrix (test/e2e/network/netpol): every pod serves TCP
and UDP on ports 80 and 81; a probe round asks every source for every target at once (one
probe process per source, all its connections in parallel) and gives a `Matrix`, which is
compared whole with a hand-written `Expect` and printed side by side on failure.

The node is a real `LabNode` (our CNI plugin wires the pods, bridge or routed mode) plus an
`ext` namespace routed through the node (192.0.2.2: an address outside the cluster, and
traffic that reaches the pods routed rather than bridged). The policy engine runs in the test
process on the node's namespace through the real iptables and ipset tools, or, with
`dataplane=ProxyMode.NFTABLES` (as `netagent run --proxy-mode nftables` chooses it), through
libnftables into the node's `ip netagent-policy` table; the API objects are fed to its
recorders as the reflectors would. With `dual=True` the pods get an IPv6 address too
(fd00:10:244:1::/64; `ext` 2001:db8:2::2), the engine programs one dataplane per family
(policy/families.py), and `family` says which family's addresses the probes use. SCTP: this kernel has no SCTP sockets
(CONFIG_IP_SCTP unset), so SCTP probes are INIT chunks sent and received on raw sockets
(the netfilter SCTP match and conntrack are there); one packet each way, no association.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor

from lab import LabNode
from netagent.infra.sync_runner import SyncKind, SyncResult
from netagent.kernel import namespaces
from netagent.kernel.families import IpFamily
from netagent.kernel.ipset.runner import IpsetRunner
from netagent.kernel.iptables.backend import IptablesBackend
from netagent.kernel.iptables.runner import IptablesRunner
from netagent.kernel.nftables.runner import NftRunner
from netagent.kernel.pod_attachment import PodAttachment
from netagent.policy.engine import PolicyEngine, PolicySettings
from netagent.policy.dataplane import PolicyDataplane
from netagent.policy.families import FamilyDataplanes
from netagent.policy.iptables.dataplane import IptablesDataplane
from netagent.policy.nftables.dataplane import NftablesDataplane
from netagent.policy.shared import RenderSettings
from proxy.backend import ProxyMode
from tests.unit.policy.policy_objects import namespace as namespace_object
from tests.unit.policy.policy_objects import pod as pod_object

NAMESPACES = ("x", "y", "z")
PODS = ("a", "b", "c")
PORTS = (80, 81)
NODE_NAME = "node-1"
SUBNET = "10.244.1.0/24"
SUBNET6 = "fd00:10:244:1::/64"
EXT_ADDRESS = "192.0.2.2"
EXT_ADDRESS6 = "2001:db8:2::2"
PROBE_TIMEOUT = 1.0     # the window in which a probe expected to be dropped must stay unanswered
PROBE_PATIENCE = 30.0   # how long a probe expected to get through may take on a loaded machine
# not "na-t": the lab outlives single tests (one per module), which netns/conftest checks for leaks
LAB_PREFIX = "na-np"
# named container ports: one name, a different number per pod (c has none)
NAMED_PORTS = {"a": {"serve": (80, "TCP"), "serve-udp": (80, "UDP")},
               "b": {"serve": (81, "TCP"), "serve-udp": (81, "UDP")}, "c": {}}

SERVER = r"""
import selectors, socket, struct, sys
sel = selectors.DefaultSelector()
args, log = sys.argv[1:], None
if args and args[0].startswith("--sctp-log="):     # SCTP: a raw socket logs "source port" per packet
    log = open(args.pop(0).partition("=")[2], "a", buffering=1)
    raw = socket.socket(socket.AF_INET, socket.SOCK_RAW, 132)
    sel.register(raw, selectors.EVENT_READ, "sctp")
for port in map(int, args):
    for family, any_address in ((socket.AF_INET, "0.0.0.0"), (socket.AF_INET6, "::")):
        tcp = socket.socket(family); tcp.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        udp = socket.socket(family, socket.SOCK_DGRAM)
        if family == socket.AF_INET6:
            for sock in (tcp, udp):
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        tcp.bind((any_address, port)); tcp.listen(128); sel.register(tcp, selectors.EVENT_READ, "tcp")
        udp.bind((any_address, port)); sel.register(udp, selectors.EVENT_READ, "udp")
print("ready", flush=True)
while True:
    for key, _ in sel.select():
        if key.data == "tcp":
            conn, _ = key.fileobj.accept(); conn.close()
        elif key.data == "sctp":
            data, peer = key.fileobj.recvfrom(2048)
            start = (data[0] & 15) * 4
            log.write(f"{peer[0]} {struct.unpack('!H', data[start + 2:start + 4])[0]}\n")
        else:
            data, peer = key.fileobj.recvfrom(64); key.fileobj.sendto(data, peer)
"""

# SCTP without the kernel's SCTP stack (CONFIG_IP_SCTP is unset here): an INIT chunk sent on a
# raw socket, with a valid CRC32c so conntrack tracks it as a new SCTP association
SCTP_SEND = r"""
import json, socket, struct, sys
table = []
for n in range(256):
    c = n
    for _ in range(8):
        c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
    table.append(c)
def crc32c(data):
    c = 0xFFFFFFFF
    for b in data:
        c = table[(c ^ b) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFF
s = socket.socket(socket.AF_INET, socket.SOCK_RAW, 132)
for n, (ip, port) in enumerate(json.loads(sys.argv[1])):
    chunk = struct.pack("!BBHIIHHI", 1, 0, 20, 0x1000 + n, 65535, 1, 1, 1)
    header = struct.pack("!HHII", 40000 + n, port, 0, 0)
    checksum = struct.pack("<I", crc32c(header + chunk))
    s.sendto(header[:8] + checksum + chunk, (ip, 0))
"""

PROBE = r"""
import json, selectors, socket, sys, time
# argv: the jobs [ident, ip, proto, port(, expected to answer)], the window every probe gets
# (an unanswered probe is "unreachable"), and optionally how long a probe expected to answer
# may take: a loaded machine may schedule an echo server late, never a dropped packet's answer
jobs, window = json.loads(sys.argv[1]), float(sys.argv[2])
patience = max(window, float(sys.argv[3])) if len(sys.argv) > 3 else window
sel, results, awaited = selectors.DefaultSelector(), {}, set()
for ident, ip, proto, port, *expected in jobs:
    kind = socket.SOCK_STREAM if proto == "tcp" else socket.SOCK_DGRAM
    s = socket.socket(socket.AF_INET6 if ":" in ip else socket.AF_INET, kind); s.setblocking(False)
    if proto == "tcp":
        s.connect_ex((ip, port)); sel.register(s, selectors.EVENT_WRITE, ident)
    else:
        s.connect((ip, port)); s.send(b"probe"); sel.register(s, selectors.EVENT_READ, ident)
    results[ident] = False
    if expected and expected[0]:
        awaited.add(ident)
start = time.monotonic()
while sel.get_map():
    waiting = {key.data for key in sel.get_map().values()}
    end = start + (patience if waiting & awaited else window)
    # once past the end this polls: what arrived while this process was not scheduled still counts
    ready = sel.select(max(0.0, end - time.monotonic()))
    for key, _ in ready:
        s = key.fileobj
        try:
            if s.type == socket.SOCK_STREAM:
                results[key.data] = s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0
            else:
                results[key.data] = s.recv(64) == b"probe"
        except OSError:
            results[key.data] = False
        sel.unregister(s); s.close()
    if not ready and time.monotonic() >= end:
        break
print(json.dumps(results))
"""

Probe = tuple[str, int]          # ("tcp", 80)


class Matrix:
    """probe -> (source, target) -> reachable."""

    def __init__(self, cells: dict[Probe, dict[tuple[str, str], bool]]) -> None:
        self.cells = cells


class Expect:
    """A hand-written expectation: a default, then overrides by source and/or target."""

    def __init__(self, default: bool = True) -> None:
        self.default = default
        self.rules: list[tuple[Iterable[str] | None, Iterable[str] | None, Iterable[Probe] | None, bool]] = []

    def set(self, value: bool, *, sources: Iterable[str] | None = None, targets: Iterable[str] | None = None,
            probes: Iterable[Probe] | None = None) -> Expect:
        self.rules.append((None if sources is None else set(sources), None if targets is None else set(targets),
                           None if probes is None else set(probes), value))
        return self

    def deny(self, **where) -> Expect:
        return self.set(False, **where)

    def allow(self, **where) -> Expect:
        return self.set(True, **where)

    def value(self, probe: Probe, source: str, target: str) -> bool:
        result = self.default
        for sources, targets, probes, value in self.rules:
            if ((sources is None or source in sources) and (targets is None or target in targets)
                    and (probes is None or probe in probes)):
                result = value
        return result


def compare(matrix: Matrix, expect: Expect) -> str:
    """Empty when everything matches; else each probe's expected and observed tables."""
    report = []
    for probe, cells in matrix.cells.items():
        sources = sorted({s for s, _ in cells})
        targets = sorted({t for _, t in cells})
        wrong = [(s, t) for (s, t), seen in cells.items() if seen != expect.value(probe, s, t)]
        if not wrong:
            continue
        lines = [f"{probe[0]}/{probe[1]}: {len(wrong)} cell(s) differ (. reachable, X not, ! unexpected)",
                 "expected".ljust(8 + 4 * len(targets)) + "   observed",
                 " " * 7 + "".join(t.ljust(4) for t in targets) + "   " + " " * 7 + "".join(t.ljust(4) for t in targets)]
        for s in sources:
            exp = "".join(("." if expect.value(probe, s, t) else "X").ljust(4) if (s, t) in cells else "-   "
                          for t in targets)
            obs = "".join((("." if cells[(s, t)] else "X") + ("!" if (s, t) in wrong else "")).ljust(4)
                          if (s, t) in cells else "-   " for t in targets)
            lines.append(s.ljust(7) + exp + "   " + s.ljust(7) + obs)
        report.append("\n".join(lines))
    return "\n\n".join(report)


class PolicyLab:
    """The node, its nine pods, `ext`, and a policy engine programming the node's kernel."""

    def __init__(self, *, mode: PodAttachment, backend: IptablesBackend = IptablesBackend.LEGACY,
                 dataplane: ProxyMode = ProxyMode.IPTABLES, dual: bool = False) -> None:
        self.mode = mode
        self.backend = backend
        self.dataplane = dataplane            # IPTABLES (chains and ipsets) or NFTABLES (the nft table)
        self.dual = dual                      # pods of both families, a dataplane per family
        self.family = IpFamily.V4             # the family the probes (and `addresses`) use
        self.subnets = (SUBNET, SUBNET6) if dual else (SUBNET,)
        self.nft: NftRunner | None = None
        self.node = LabNode(prefix=LAB_PREFIX, mode=mode, subnets=self.subnets, with_agent=False)
        self.ext_netns = ""
        self.by_family: dict[IpFamily, dict[str, str]] = {family: {} for family in IpFamily}   # "x/a" -> address
        self.veths: dict[str, str] = {}           # pod address -> host interface
        self.netns_of: dict[str, str] = {}        # "x/a" / "ext" / "node" -> namespace name
        self.servers: dict[str, subprocess.Popen] = {}
        self.policies: dict[str, dict] = {}
        self.pod_objects: dict[str, dict] = {}

    def _new_engine(self) -> PolicyEngine:
        prefix = namespaces.exec_prefix(self.node.node)
        self.iptables = IptablesRunner(backend=self.backend, exec_prefix=prefix, lock_wait_seconds=60)
        programmer: PolicyDataplane
        if self.dataplane is ProxyMode.NFTABLES:
            if self.nft is None:
                self.nft = NftRunner(netns=self.node.node)
            programmer = NftablesDataplane(self.nft)
            if self.dual:
                programmer = FamilyDataplanes({IpFamily.V4: programmer,
                                               IpFamily.V6: NftablesDataplane(self.nft, family=IpFamily.V6)})
        else:
            programmer = IptablesDataplane(iptables=self.iptables, ipset=IpsetRunner(exec_prefix=prefix))
            if self.dual:
                iptables6 = IptablesRunner(backend=self.backend, family=IpFamily.V6, exec_prefix=prefix,
                                           lock_wait_seconds=60)
                programmer = FamilyDataplanes({IpFamily.V4: programmer, IpFamily.V6: IptablesDataplane(
                    iptables=iptables6, ipset=IpsetRunner(exec_prefix=prefix), family=IpFamily.V6)})
        settings = PolicySettings(NODE_NAME, RenderSettings(self.mode, local_cidrs=self.subnets))
        engine = PolicyEngine(settings, dataplane=programmer, interface_of=lambda plan: self.veths.get(plan.ip))
        for recorder in (engine.policies, engine.pods, engine.namespaces):
            recorder.on_synced()
        return engine

    @property
    def addresses(self) -> dict[str, str]:
        """Every probe end's address in the probed family: "x/a" -> 10.244.1.x (or fd00:...)."""
        return self.by_family[self.family]

    # ------------------------------------------------------------ building
    def __enter__(self) -> PolicyLab:
        self.node.__enter__()
        try:
            self.engine = self._new_engine()          # needs the node's namespace (nft enters it)
            self.netns_of["node"] = self.node.node
            namespaces.run_in(self.node.node, ["sysctl", "-qw", "net.ipv4.ip_forward=1"], check=True)
            if self.dual:
                namespaces.run_in(self.node.node, ["sysctl", "-qw", "net.ipv6.conf.all.forwarding=1"], check=True)
            self._add_ext()
            for namespace in NAMESPACES:
                self.engine.namespaces.on_add(namespace_object(namespace, ns=namespace))
            for namespace in NAMESPACES:
                for name in PODS:
                    self.add_pod(namespace, name, {"pod": name}, ports=NAMED_PORTS[name])
            self.sync(SyncKind.FULL)
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        for server in self.servers.values():
            server.kill()
            server.wait()
        self.servers.clear()
        if self.nft is not None:
            self.nft.close()
            self.nft = None
        self.node.close()

    def _add_ext(self) -> None:
        self.ext_netns = self.node.new_pod_netns("ext")
        self.netns_of["ext"] = self.ext_netns
        node = self.node.node
        namespaces.run_in(node, ["ip", "link", "add", "np-ext", "type", "veth", "peer", "name", "eth0",
                                 "netns", self.ext_netns], check=True)
        namespaces.run_in(node, ["ip", "addr", "add", "192.0.2.1/24", "dev", "np-ext"], check=True)
        if self.dual:
            namespaces.run_in(node, ["ip", "addr", "add", "2001:db8:2::1/64", "dev", "np-ext", "nodad"], check=True)
        namespaces.run_in(node, ["ip", "link", "set", "np-ext", "up"], check=True)
        for argv in (["ip", "addr", "add", EXT_ADDRESS + "/24", "dev", "eth0"], ["ip", "link", "set", "eth0", "up"],
                     ["ip", "link", "set", "lo", "up"], ["ip", "route", "add", "default", "via", "192.0.2.1"]):
            namespaces.run_in(self.ext_netns, argv, check=True)
        if self.dual:
            for argv in (["ip", "addr", "add", EXT_ADDRESS6 + "/64", "dev", "eth0", "nodad"],
                         ["ip", "-6", "route", "add", "default", "via", "2001:db8:2::1"]):
                namespaces.run_in(self.ext_netns, argv, check=True)
            self.by_family[IpFamily.V6]["ext"] = EXT_ADDRESS6
        self.by_family[IpFamily.V4]["ext"] = EXT_ADDRESS
        self._start_server("ext", self.ext_netns)

    def _start_server(self, key: str, netns: str) -> None:
        server = subprocess.Popen([*namespaces.exec_prefix(netns), sys.executable, "-c", SERVER,
                                   f"--sctp-log={self._sctp_log(key)}", *map(str, PORTS)],
                                  stdout=subprocess.PIPE, text=True)
        self.servers[key] = server
        assert server.stdout is not None and server.stdout.readline().strip() == "ready"

    def add_pod(self, namespace: str, name: str, labels: dict, *, ports: dict | None = None,
                record: bool = True) -> str:
        """Wire a pod with the CNI plugin, start its servers, and (record) tell the engine."""
        key = f"{namespace}/{name}"
        pod = self.node.add_pod(f"{namespace}-{name}")
        host = next(i["name"] for i in pod.result["interfaces"] if "sandbox" not in i and i["name"] != "na0")
        ips = [entry["address"].split("/")[0] for entry in pod.result["ips"]]
        for ip in ips:
            self.by_family[IpFamily.of(ip)][key] = ip
            self.veths[ip] = host
        self.netns_of[key] = pod.netns_name
        self._start_server(key, pod.netns_name)
        self.pod_objects[key] = pod_object(namespace, name, pod.ip, labels,
                                           ports=tuple((port, *spec) for port, spec in (ports or {}).items()))
        if self.dual:
            self.pod_objects[key]["status"]["podIPs"] = [{"ip": ip} for ip in ips]
        if record:
            self.engine.pods.on_add(self.pod_objects[key])
        return key

    def remove_pod(self, key: str) -> None:
        """Tell the engine the pod is gone, stop its servers and delete it with the CNI plugin."""
        obj = self.pod_objects.pop(key)
        self.engine.pods.on_delete(obj)
        server = self.servers.pop(key)
        server.kill()
        server.wait()
        self.node.delete_pod(key.replace("/", "-"))
        for addresses in self.by_family.values():
            if key in addresses:
                del self.veths[addresses.pop(key)]
        del self.netns_of[key]

    # ------------------------------------------------------------ changing the API objects
    def apply(self, *policies: dict) -> None:
        """Make these the policies in force (others are deleted), then sync."""
        wanted = {f"{p['metadata']['namespace']}/{p['metadata']['name']}": p for p in policies}
        for key, old in list(self.policies.items()):
            if key not in wanted:
                self.engine.policies.on_delete(old)
                del self.policies[key]
        for key, policy in wanted.items():
            if key in self.policies:
                self.engine.policies.on_update(self.policies[key], policy)
            else:
                self.engine.policies.on_add(policy)
            self.policies[key] = policy
        self.sync()

    def relabel_pod(self, key: str, labels: dict) -> None:
        old = self.pod_objects[key]
        new = json.loads(json.dumps(old))
        new["metadata"]["labels"] = labels
        self.pod_objects[key] = new
        self.engine.pods.on_update(old, new)

    def relabel_namespace(self, name: str, labels: dict) -> None:
        self.engine.namespaces.on_update(namespace_object(name, ns=name), namespace_object(name, **labels))

    def sync(self, kind: SyncKind = SyncKind.PARTIAL) -> None:
        assert self.engine.sync(kind) is SyncResult.SUCCEEDED

    def restart_engine(self, backend: IptablesBackend | None = None) -> PolicyEngine:
        """A new engine (an agent restart) that has seen every current object."""
        self.backend = backend or self.backend
        self.engine = self._new_engine()
        for namespace in NAMESPACES:
            self.engine.namespaces.on_add(namespace_object(namespace, ns=namespace))
        for obj in self.pod_objects.values():
            self.engine.pods.on_add(obj)
        for policy in self.policies.values():
            self.engine.policies.on_add(policy)
        return self.engine

    def kernel_text(self) -> str:
        """What the node's dataplane holds, as its tool prints it."""
        if self.dataplane is ProxyMode.NFTABLES:
            argv = ["nft", "list", "ruleset"]
        else:
            argv = [f"{self.family.command}-{self.backend.value}-save", "-t", "filter"]
        return namespaces.run_in(self.node.node, argv, check=True).stdout

    # ------------------------------------------------------------ probing
    def _sctp_log(self, key: str) -> str:
        return os.path.join(self.node.workdir, f"sctp-{key.replace('/', '-')}.log")

    def _probe_sctp(self, probes: list[Probe], sources: list[str], targets: list[str],
                    expect: Expect | None) -> dict:
        """Each source sends one INIT per (target, port); a target's log says what arrived.

        Every log is read for PROBE_TIMEOUT at least (what is dropped never arrives), and on
        until each INIT `expect` says gets through has arrived (PROBE_PATIENCE at most): the
        servers write their logs when a loaded machine gets round to scheduling them."""
        for target in targets:
            open(self._sctp_log(target), "w").close()
        by_address = {address: key for key, address in self.addresses.items()}

        def send(source: str) -> None:
            jobs = [[self.addresses[t], port] for _, port in probes for t in targets if t != source]
            subprocess.run([*namespaces.exec_prefix(self.netns_of[source]), sys.executable, "-c", SCTP_SEND,
                            json.dumps(jobs)], check=True, timeout=60)

        with ThreadPoolExecutor(max_workers=len(sources)) as pool:
            list(pool.map(send, sources))
        sent = time.monotonic()
        awaited = {(probe, s, t) for probe in probes for s in sources for t in targets
                   if s != t and expect is not None and expect.value(probe, s, t)}
        while True:
            cells = self._sctp_arrivals(probes, sources, targets, by_address)
            elapsed = time.monotonic() - sent
            arrived = all(cells[probe][(s, t)] for probe, s, t in awaited)
            if elapsed >= PROBE_PATIENCE or (elapsed >= PROBE_TIMEOUT and arrived):
                return cells
            time.sleep(0.05)

    def _sctp_arrivals(self, probes: list[Probe], sources: list[str], targets: list[str],
                       by_address: dict[str, str]) -> dict:
        cells: dict = {probe: {(s, t): False for s in sources for t in targets if s != t} for probe in probes}
        for target in targets:
            with open(self._sctp_log(target)) as log:
                for line in log:
                    if not line.endswith("\n"):
                        continue                   # the server is still writing this line
                    source, port = by_address.get(line.split()[0]), ("sctp", int(line.split()[1]))
                    if port in cells and (source, target) in cells[port]:
                        cells[port][(source, target)] = True
        return cells

    def pods(self) -> list[str]:
        """Every probe end: the pods and `ext` (the outside, 192.0.2.2)."""
        return sorted(self.addresses)

    def probe(self, probes: Iterable[Probe] = (("tcp", 80),), *, sources: Iterable[str] | None = None,
              targets: Iterable[str] | None = None, expect: Expect | None = None) -> Matrix:
        """Probe every (source, target) pair; a probe `expect` says gets through may take up to
        PROBE_PATIENCE, every other one is given PROBE_TIMEOUT to be answered."""
        probes = list(probes)
        sources = list(sources) if sources is not None else self.pods()
        targets = list(targets) if targets is not None else self.pods()
        cells: dict[Probe, dict[tuple[str, str], bool]] = {probe: {} for probe in probes}
        sctp = [probe for probe in probes if probe[0] == "sctp"]
        if sctp:
            cells.update(self._probe_sctp(sctp, sources, targets, expect))
            probes = [probe for probe in probes if probe[0] != "sctp"]
            if not probes:
                return Matrix(cells)

        def run(source: str) -> dict[str, bool]:
            jobs = [[f"{n}|{t}", self.addresses[t], probe[0], probe[1],
                     expect is not None and expect.value(probe, source, t)]
                    for n, probe in enumerate(probes) for t in targets if t != source]
            done = subprocess.run([*namespaces.exec_prefix(self.netns_of[source]), sys.executable, "-c", PROBE,
                                   json.dumps(jobs), str(PROBE_TIMEOUT), str(PROBE_PATIENCE)],
                                  capture_output=True, text=True, timeout=PROBE_PATIENCE + 60, check=True)
            return json.loads(done.stdout)

        with ThreadPoolExecutor(max_workers=len(sources)) as pool:
            for source, answers in zip(sources, pool.map(run, sources)):
                for ident, reachable in answers.items():
                    index, target = ident.split("|")
                    cells[probes[int(index)]][(source, target)] = reachable
        return Matrix(cells)

    def check(self, expect: Expect, probes: Iterable[Probe] = (("tcp", 80),), **where) -> None:
        difference = compare(self.probe(probes, expect=expect, **where), expect)
        assert not difference, "\n" + difference

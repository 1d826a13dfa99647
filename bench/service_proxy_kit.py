"""The service proxy benchmark's parts: the state it programs, the namespace, and one mode's run.

`bench/service_proxy.py` is the script (arguments, order, the table, `--json`); this module
holds what one measurement needs, so that the script, `bench/kube_proxy_floor.py` and
the tests share one definition of the bench state (N services x 10 endpoints, one NodePort in
ten), of the namespace every measurement runs in (a veth holding the listener's address, a
route for the pod and service ranges), and of connect() latency. Each measurement runs in
its own process (`isolated`): a mode's RSS is then its own, not what an earlier mode left.

Every part takes the IP family (`family`, default IPv4): the IPv6 state is the same shape
(services in fd00:96::/64, pods in fd00:128::/64 inside the cluster CIDR fd00:128::/32, the
listener fd00:128:ffff::1 with DAD off), programmed by the family's backend (ip6tables for
iptables modes), so the two families' figures compare like for like.
"""
from __future__ import annotations

import contextlib
import ipaddress
import json
import multiprocessing
import os
import resource
import signal
import statistics
import subprocess
import sys
import threading
import time
import traceback

from netagent.kernel import namespaces
from netagent.kernel.families import IpFamily
from netagent.kernel.iptables.backend import IptablesBackend
from netagent.kernel.owned import NFT_PROXY_TABLE
from proxy.model import Endpoint, NodeContext, Protocol, ProxyState, ServicePort, ServicePortName

ENDPOINTS = 10
NODE = NodeContext(name="node-a", cluster_cidr="10.128.0.0/9", local_addresses=("198.18.16.11",))
NODE6 = NodeContext(name="node-a", cluster_cidr="fd00:128::/32", local_addresses=("2001:db8:16::11",),
                    family=IpFamily.V6)
LISTENER = "10.255.255.1"   # the last service's one endpoint, a listener in the bench namespace
LISTENER6 = "fd00:128:ffff::1"
ROUTED = {IpFamily.V4: "10.0.0.0/8", IpFamily.V6: "fd00::/8"}
SERVICE_CIDRS = {IpFamily.V4: "10.96.0.0/16", IpFamily.V6: "fd00:96::/112"}   # the API server's, holding vip()   # pods, services, the listener: via bench0
NETAGENT_MODES = ("nftables", "iptables-legacy", "iptables-nft", "ebpf", "ipvs")
_VIP6, _POD6, _CHANGED6 = (int(ipaddress.IPv6Address(a)) for a in ("fd00:96::", "fd00:128::", "fd00:128:250::"))


def node_of(family: IpFamily) -> NodeContext:
    return NODE if family is IpFamily.V4 else NODE6


def listener_ip(family: IpFamily) -> str:
    return LISTENER if family is IpFamily.V4 else LISTENER6


def vip(i: int, family: IpFamily = IpFamily.V4) -> str:
    if family is IpFamily.V6:
        return str(ipaddress.IPv6Address(_VIP6 + i))
    return f"10.{96 + i // 65536}.{(i // 256) % 256}.{i % 256}"


def pod_ip(n: int, family: IpFamily = IpFamily.V4) -> str:
    if family is IpFamily.V6:
        return str(ipaddress.IPv6Address(_POD6 + n))
    return f"10.{128 + n // 65536}.{(n // 256) % 256}.{n % 256}"


def changed_ip(sample: int, family: IpFamily = IpFamily.V4) -> str:
    """The address a one-endpoint change puts in (one per sample, in no service yet)."""
    if family is IpFamily.V6:
        return str(ipaddress.IPv6Address(_CHANGED6 + sample))
    return f"10.250.{sample // 256}.{sample % 256}"


NODE_PORTS = 2768   # 30000-32767, the API server's default range


def node_port(i: int) -> int | None:
    """One service in ten has a NodePort, each its own as the API server allots them, while the
    range lasts (the first 27,680 services)."""
    return 30000 + i // 10 if i % 10 == 0 and i // 10 < NODE_PORTS else None


def make_state(services: int, family: IpFamily = IpFamily.V4) -> ProxyState:
    ports, endpoints = {}, {}
    for i in range(services):
        name = ServicePortName("bench", f"svc-{i}", "http")
        ports[name] = ServicePort(name=name, protocol=Protocol.TCP, port=80, cluster_ip=vip(i, family),
                                  node_port=node_port(i))
        endpoints[name] = tuple(Endpoint(ip=pod_ip(i * ENDPOINTS + e, family), port=8080, node_name="node-b")
                                for e in range(ENDPOINTS))
    return ProxyState(node=node_of(family), services=ports, endpoints=endpoints)


def index_of(name: ServicePortName) -> int:
    return int(name.name.split("-")[1])


def last_service(state: ProxyState) -> ServicePortName:
    return max(state.services, key=index_of)


def with_one_endpoint_changed(state: ProxyState, sample: int) -> tuple[ProxyState, ServicePortName]:
    """One endpoint of one service (spread over the services by `sample`) replaced."""
    name = ServicePortName("bench", f"svc-{(sample * 7919) % len(state.services)}", "http")
    endpoints = dict(state.endpoints)
    replaced = list(endpoints[name])
    replaced[0] = Endpoint(ip=changed_ip(sample, state.family), port=8080, node_name="node-b")
    endpoints[name] = tuple(replaced)
    return ProxyState(node=state.node, services=state.services, endpoints=endpoints), name


def with_listener(state: ProxyState) -> ProxyState:
    """The last service's endpoints replaced by the one listener of `connect_latency`."""
    endpoints = dict(state.endpoints)
    endpoints[last_service(state)] = (Endpoint(ip=listener_ip(state.family), port=8080, node_name="node-a"),)
    return ProxyState(node=state.node, services=state.services, endpoints=endpoints)


def rss_mib() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def cpu_seconds() -> float:
    """User + system CPU of this process and its waited-for children (nft, iptables-restore)."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def count_iptables_rules(netns: str, backend: str, family: IpFamily = IpFamily.V4) -> int:
    saved = namespaces.run_in(netns, [f"{family.command}-{backend}-save"], timeout=600).stdout
    return sum(1 for line in saved.splitlines() if line.startswith("-A NETAGENT-"))


def count_nft(netns: str, table: str, family: IpFamily = IpFamily.V4) -> tuple[int, int]:
    """(rules, set and map elements) of the nft table `ip <table>` (`ip6` for IPv6), read from the kernel."""
    listed = namespaces.run_in(netns, ["nft", "-j", "list", "table", family.nft, table], timeout=900,
                               check=True).stdout
    objects = json.loads(listed)["nftables"]
    rules = sum(1 for obj in objects if "rule" in obj)
    elements = sum(len(obj.get(kind, {}).get("elem", ())) for obj in objects for kind in ("set", "map"))
    return rules, elements


def prepare_namespace(netns: str, family: IpFamily = IpFamily.V4) -> None:
    """The listener's address on a veth (DAD off for IPv6), and a route for the pod and service ranges."""
    address = ["ip", "addr", "add", f"{LISTENER}/32", "dev", "bench0"] if family is IpFamily.V4 else \
        ["ip", "-6", "addr", "add", f"{LISTENER6}/128", "dev", "bench0", "nodad"]
    for argv in (["ip", "link", "set", "lo", "up"],
                 ["ip", "link", "add", "bench0", "type", "veth", "peer", "name", "bench1"],
                 ["ip", "link", "set", "bench0", "up"], address,
                 ["ip", "route", "add", ROUTED[family], "dev", "bench0"]):
        namespaces.run_in(netns, argv, check=True)


@contextlib.contextmanager
def bench_namespace(family: IpFamily = IpFamily.V4):
    netns = namespaces.unique_name("na-tbench")
    namespaces.create(netns)
    try:
        prepare_namespace(netns, family)
        yield netns
    finally:
        namespaces.remove(netns)


@contextlib.contextmanager
def ebpf_places():
    """A private bpffs and a child cgroup of the cgroup v2 mount, made and removed here."""
    import tempfile
    import uuid

    from ebpf.loader import detach_owned, remove_pins
    from lab.bpf_places import cgroup2_mount
    cgroup = os.path.join(cgroup2_mount(), f"netagent-bench-{uuid.uuid4().hex[:8]}")
    with tempfile.TemporaryDirectory(prefix="na-bench-bpffs-") as bpf_root:
        subprocess.run(["mount", "-t", "bpf", "bpf", bpf_root], check=True)
        os.mkdir(cgroup)
        try:
            yield bpf_root, cgroup
        finally:
            detach_owned(cgroup)
            remove_pins(bpf_root)
            subprocess.run(["umount", bpf_root], check=True)
            for _ in range(100):
                with contextlib.suppress(OSError):
                    os.rmdir(cgroup)
                    break
                time.sleep(0.05)


CONNECT_CLIENT = r"""
import socket, statistics, sys, time
n = int(sys.argv[1]); times = []
for _ in range(n):
    t = time.perf_counter(); s = socket.create_connection((sys.argv[2], 80), timeout=5)
    times.append(time.perf_counter() - t); s.close()
times.sort(); print(statistics.median(times), times[int(len(times) * 0.99) - 1])
"""


def connect_latency(netns: str, cgroup: str | None, address: str, count: int) -> tuple[float, float]:
    """(median, p99) seconds of connect() to `address`:80, whose endpoint listens in `netns`."""
    family = IpFamily.of(address)
    listener = subprocess.Popen([*namespaces.exec_prefix(netns), sys.executable, "-c",
                                 f"import socket;s=socket.socket({'socket.AF_INET6' if family is IpFamily.V6 else ''});"
                                 f"s.setsockopt(1,2,1);s.bind(('{listener_ip(family)}',8080));"
                                 "s.listen(4096);print('ready',flush=True)\nwhile True: s.accept()[0].close()"],
                                stdout=subprocess.PIPE, text=True)
    try:
        assert listener.stdout is not None and listener.stdout.readline().strip() == "ready"
        enter = f"echo $$ > {cgroup}/cgroup.procs && " if cgroup else ""
        out = subprocess.run(["sh", "-c", f'{enter}exec {" ".join(namespaces.exec_prefix(netns))} '
                                          f'{sys.executable} -c "$0" {count} {address}',
                              CONNECT_CLIENT], capture_output=True, text=True, timeout=600, check=True).stdout
        median, p99 = (float(x) for x in out.split())
        return median, p99
    finally:
        listener.kill()
        listener.wait()


def make_backend(mode: str, netns: str, *, bpf_root: str | None, cgroup: str | None,
                 family: IpFamily = IpFamily.V4):
    from proxy.backend import ProxyMode
    from proxy.factory import EbpfSpec, build_backend, spec_for
    if mode == "ebpf":
        from proxy.ebpf.backend import EbpfPaths
        return build_backend(EbpfSpec(EbpfPaths(bpf_root=bpf_root, cgroup=cgroup)), family=family)
    if mode in ("ipvs", "nftables"):
        return build_backend(spec_for(ProxyMode(mode), iptables_backend=IptablesBackend.LEGACY), netns=netns,
                             family=family)
    return build_backend(spec_for(ProxyMode.IPTABLES, iptables_backend=IptablesBackend(mode.split("-")[1])),
                         netns=netns, family=family)


def bench_backend(mode: str, services: int, samples: int, connects: int = 0, family: str = "ipv4") -> dict:
    """One netagent backend at one size, in a fresh namespace (and cgroup and bpffs, for ebpf);
    `family` by its flag spelling (`ipv4`, `ipv6`: it crosses a process boundary as text)."""
    ip_family = family_of_flag(family)
    places = ebpf_places() if mode == "ebpf" else contextlib.nullcontext((None, None))
    with bench_namespace(ip_family) as netns, places as (bpf_root, cgroup):
        return _bench_in(netns, mode, services, samples, connects, bpf_root=bpf_root, cgroup=cgroup,
                         family=ip_family)


def family_of_flag(flag: str) -> IpFamily:
    """`--family ipv4|ipv6` as an IpFamily."""
    return IpFamily.from_label({"ipv4": "IPv4", "ipv6": "IPv6"}[flag])


def _bench_in(netns: str, mode: str, services: int, samples: int, connects: int, *, bpf_root, cgroup,
              family: IpFamily = IpFamily.V4) -> dict:
    extra: dict = {}
    started = time.perf_counter()
    backend = make_backend(mode, netns, bpf_root=bpf_root, cgroup=cgroup, family=family)
    if mode == "ebpf":
        load = backend.load_report
        extra = {"start": time.perf_counter() - started, "compile": load.compile_seconds, "load": load.load_seconds}
    state = with_listener(make_state(services, family))
    cpu_before = cpu_seconds()
    started = time.perf_counter()
    report = backend.sync(state, changed=None)
    full = time.perf_counter() - started
    extra["cpu"] = cpu_seconds() - cpu_before
    memory = rss_mib()
    changes = []
    for sample in range(samples):
        state, name = with_one_endpoint_changed(state, sample)
        started = time.perf_counter()
        backend.sync(state, changed=frozenset({name}))
        changes.append(time.perf_counter() - started)
    if mode == "ebpf":   # what a /metrics scrape costs: every map's fill counted in the kernel
        started = time.perf_counter()
        fill = backend.table_fill()
        extra["scrape"] = time.perf_counter() - started
        extra["entries"] = sum(entries for entries, _ in fill.values())
    if connects:
        state = with_listener(state)   # a change may have hit the last service: put its listener back
        backend.sync(state, changed=frozenset({last_service(state)}))
        extra["connect"] = connect_latency(netns, cgroup, state.services[last_service(state)].cluster_ip, connects)
    if mode not in ("ebpf", "ipvs"):   # a restarted agent: a new backend's first (full) sync, table in place
        again = make_backend(mode, netns, bpf_root=bpf_root, cgroup=cgroup, family=family)
        started = time.perf_counter()
        restart = again.sync(state, changed=None)
        seconds = time.perf_counter() - started
        # nftables counts the transactions it wrote (none when the table already agrees);
        # the others say how many service ports their full sync (re)wrote
        extra["restart"] = ((seconds, again.applies, "nft transactions") if hasattr(again, "applies")
                            else (seconds, restart.services_written, "service ports"))
        extra["restart_detail"] = restart.detail
    if mode == "nftables":
        rules, extra["elements"] = count_nft(netns, NFT_PROXY_TABLE, family)
    elif mode.startswith("iptables-"):
        rules = count_iptables_rules(netns, mode.split("-")[1], family)
    else:
        rules = report.rules
    backend.cleanup()
    return {"full": full, "change": statistics.median(changes), "change_max": max(changes),
            "rules": rules, "rss": memory, **extra}


class _Watched:
    """Wraps a backend: records when a sync has programmed `wanted` (an endpoint address)."""

    def __init__(self, backend) -> None:
        self.backend = backend
        self.wanted: str | None = None
        self.done = threading.Event()

    def sync(self, state, *, changed):
        report = self.backend.sync(state, changed=changed)
        if self.wanted and any(e.ip == self.wanted for eps in state.endpoints.values() for e in eps):
            self.done.set()
        return report

    def __getattr__(self, name):
        return getattr(self.backend, name)


def bench_agent_path(mode: str, services: int, samples: int, family: str = "ipv4") -> float | None:
    """Median seconds from an EndpointSlice update in the API server to the partial sync that
    programmed it, through the real watch, catalog and sync runner of `mode`'s backend."""
    ip_family = family_of_flag(family)
    places = ebpf_places() if mode == "ebpf" else contextlib.nullcontext((None, None))
    with bench_namespace(ip_family) as netns, places as (bpf_root, cgroup):
        return _agent_path_in(netns, mode, services, samples, bpf_root=bpf_root, cgroup=cgroup, family=ip_family)


def _agent_path_in(netns: str, mode: str, services: int, samples: int, *, bpf_root, cgroup,
                   family: IpFamily = IpFamily.V4) -> float | None:
    from kubernetes import client

    from lab.apiserver import ApiServer
    from netagent.infra.metrics import Registry
    from proxy.service_proxy import ProxySettings, ServiceProxy

    api = ApiServer(service_cidr=SERVICE_CIDRS[family])
    api.start()
    proxy = None
    watched = _Watched(make_backend(mode, netns, bpf_root=bpf_root, cgroup=cgroup, family=family))
    try:
        api.create({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-a"}})
        api.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "bench"}})
        for i in range(services):
            port = {"name": "http", "port": 80, "targetPort": 8080, **({"nodePort": node_port(i)} if node_port(i) else {})}
            api.create({"apiVersion": "v1", "kind": "Service", "metadata": {"name": f"svc-{i}", "namespace": "bench"},
                        "spec": {"type": "NodePort" if node_port(i) else "ClusterIP", "clusterIP": vip(i, family),
                                 "clusterIPs": [vip(i, family)], "ipFamilies": [family.label], "ports": [port]}})
            api.create(_slice(i, [pod_ip(i * ENDPOINTS + e, family) for e in range(ENDPOINTS)], family))
        # no periodic resync during the samples: each change is a lone partial sync
        proxy = ServiceProxy(api_client=client.ApiClient(client.Configuration(host=api.url)),
                             settings=ProxySettings(node_name="node-a", cluster_cidr=node_of(family).cluster_cidr,
                                                    sync_period=3600.0, family=family),
                             backend=watched, registry=Registry())
        proxy.start()
        deadline = time.monotonic() + 1800
        while proxy.runner.status().runs < 1 and time.monotonic() < deadline:
            time.sleep(0.1)
        times = []
        for sample in range(samples):
            time.sleep(1.1)  # past --min-sync-period, as a lone change in a quiet cluster
            i = (sample * 7919) % services
            new_ip = changed_ip(sample, family)
            watched.wanted, _ = new_ip, watched.done.clear()
            started = time.perf_counter()
            api.update(_slice(i, [new_ip] + [pod_ip(i * ENDPOINTS + e, family) for e in range(1, ENDPOINTS)], family))
            if watched.done.wait(120):
                times.append(time.perf_counter() - started)
        return statistics.median(times) if times else None
    finally:
        if proxy is not None:
            proxy.stop()
        watched.backend.cleanup()
        api.stop()


def _slice(i: int, ips: list[str], family: IpFamily = IpFamily.V4) -> dict:
    return {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": f"svc-{i}-1", "namespace": "bench", "labels": {"kubernetes.io/service-name": f"svc-{i}"}},
            "addressType": family.label, "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
            "endpoints": [{"addresses": [ip], "conditions": {"ready": True}, "nodeName": "node-b"} for ip in ips]}


def _child(send, fn, args) -> None:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))   # run the clean-ups (namespace, cgroup, bpffs)
    try:
        outcome = (True, fn(*args))
    except BaseException:   # noqa: BLE001 - handed to the parent, which raises it
        outcome = (False, traceback.format_exc())
    send.send(outcome)
    send.close()


class IsolatedError(RuntimeError):
    pass


def isolated(fn, *args):
    """`fn(*args)` in a fresh interpreter (spawned, not forked: its RSS is its own); its
    exception re-raised here. A SIGTERM to this process stops the child, which cleans up."""
    context = multiprocessing.get_context("spawn")
    receive, send = context.Pipe(duplex=False)
    child = context.Process(target=_child, args=(send, fn, args), daemon=True)
    child.start()
    send.close()
    try:
        try:
            ok, value = receive.recv()
        except EOFError:
            raise IsolatedError(f"{fn.__name__}{args}: the child died (exit {child.join() or child.exitcode})") from None
        if not ok:
            raise IsolatedError(f"{fn.__name__}{args} failed in its child:\n{value}")
        return value
    finally:
        if child.is_alive():
            child.join(30)
        if child.is_alive():
            child.terminate()
            child.join(300)

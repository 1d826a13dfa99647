"""Benchmark: the service proxy at 1,000 and 10,000 services x 10 endpoints, per backend.

    sudo .venv/bin/python bench/service_proxy.py [--services 1000,10000] [--modes iptables-legacy,iptables-nft,ebpf]
    scripts/vm-run -- .venv/bin/python bench/service_proxy.py --modes ipvs --services 1000   # IPVS: VM only

For each size and backend, in a fresh network namespace:
1. full sync: the first `sync()` of the whole state (render + apply), as after an agent start;
2. one endpoint change: one endpoint of one service replaced, programmed by a partial sync
   (median of `--samples`), and the same change through the whole agent path: the
   EndpointSlice updated in the in-repo API server -> watch -> catalog -> sync returned;
3. rules: iptables rules in our chains (or IPVS real servers); memory: the benchmark
   process's resident size after the full sync, which holds what an agent holds (the
   catalog, the state, the backend's memory of what it wrote);
4. the floor: `iptables-restore --noflush` of a kube-proxy-shaped ruleset of the same size
   (KUBE-SVC/KUBE-SEP chains, comments, two rules per endpoint), and of a one-service change
   on top of it (what kube-proxy's partial sync costs at least). The nft floor at 10,000
   services is skipped (ENVIRONMENT.md: more than 25 minutes) unless `--nft-floor-at-10k`.
5. ebpf: programs compiled by bcc and attached to a cgroup the benchmark makes, maps pinned
   in a private bpffs it mounts (both removed after); the compile and load times at start are
   printed; "rules" are map entries (service entries + slots); "/metrics map fill" is what
   a scrape of the map-size metrics costs (every map's entries counted in the kernel).
6. `--connect N`: connect() latency (median, p99 over N connects) from a client in the
   benchmark's namespace (and cgroup, for ebpf) to the last service, whose one endpoint is a
   listener in that namespace: does it grow with the number of services?
"""
from __future__ import annotations

import argparse
import contextlib
import hashlib
import os
import resource
import signal
import statistics
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from netagent.kernel import namespaces  # noqa: E402
from netagent.kernel.iptables.backend import IptablesBackend  # noqa: E402
from proxy.factory import build_backend  # noqa: E402
from proxy.model import Endpoint, NodeContext, Protocol, ProxyState, ServicePort, ServicePortName  # noqa: E402

ENDPOINTS = 10
NODE = NodeContext(name="node-a", cluster_cidr="10.128.0.0/9", local_addresses=("198.18.16.11",))


def vip(i: int) -> str:
    return f"10.{96 + i // 65536}.{(i // 256) % 256}.{i % 256}"


def pod_ip(n: int) -> str:
    return f"10.{128 + n // 65536}.{(n // 256) % 256}.{n % 256}"


def make_state(services: int, *, generation: int = 0) -> ProxyState:
    ports, endpoints = {}, {}
    for i in range(services):
        name = ServicePortName("bench", f"svc-{i}", "http")
        ports[name] = ServicePort(name=name, protocol=Protocol.TCP, port=80, cluster_ip=vip(i),
                                  node_port=30000 + i % 2000 if i % 10 == 0 else None)
        endpoints[name] = tuple(Endpoint(ip=pod_ip(i * ENDPOINTS + e), port=8080, node_name="node-b")
                                for e in range(ENDPOINTS))
    return ProxyState(node=NODE, services=ports, endpoints=endpoints)


def with_one_endpoint_changed(state: ProxyState, sample: int) -> tuple[ProxyState, ServicePortName]:
    name = ServicePortName("bench", f"svc-{(sample * 7919) % len(state.services)}", "http")
    endpoints = dict(state.endpoints)
    replaced = list(endpoints[name])
    replaced[0] = Endpoint(ip=f"10.250.{sample // 256}.{sample % 256}", port=8080, node_name="node-b")
    endpoints[name] = tuple(replaced)
    return ProxyState(node=state.node, services=state.services, endpoints=endpoints), name


def rss_mib() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def count_rules(netns: str, backend: str) -> int:
    saved = namespaces.run_in(netns, [f"iptables-{backend}-save"], timeout=600).stdout
    return sum(1 for line in saved.splitlines() if line.startswith("-A NETAGENT-"))


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
LISTENER = "10.255.255.1"


def connect_latency(netns: str, cgroup: str | None, state: ProxyState, count: int) -> tuple[float, float]:
    """(median, p99) seconds of connect() to the last service, whose endpoint listens in `netns`."""
    last = max(state.services, key=lambda n: int(n.name.split("-")[1]))
    listener = subprocess.Popen([*namespaces.exec_prefix(netns), sys.executable, "-c",
                                 f"import socket;s=socket.socket();s.setsockopt(1,2,1);s.bind(('{LISTENER}',8080));"
                                 "s.listen(4096);print('ready',flush=True)\nwhile True: s.accept()[0].close()"],
                                stdout=subprocess.PIPE, text=True)
    try:
        listener.stdout.readline()
        enter = f"echo $$ > {cgroup}/cgroup.procs && " if cgroup else ""
        out = subprocess.run(["sh", "-c", f'{enter}exec {" ".join(namespaces.exec_prefix(netns))} '
                                          f'{sys.executable} -c "$0" {count} {state.services[last].cluster_ip}',
                              CONNECT_CLIENT], capture_output=True, text=True, timeout=600, check=True).stdout
        median, p99 = (float(x) for x in out.split())
        return median, p99
    finally:
        listener.kill()
        listener.wait()


def with_listener(state: ProxyState) -> ProxyState:
    """The last service's endpoints replaced by the one listener of `connect_latency`."""
    last = max(state.services, key=lambda n: int(n.name.split("-")[1]))
    endpoints = dict(state.endpoints)
    endpoints[last] = (Endpoint(ip=LISTENER, port=8080, node_name="node-a"),)
    return ProxyState(node=state.node, services=state.services, endpoints=endpoints)


def bench_backend(mode: str, services: int, samples: int, connects: int = 0) -> dict:
    netns = namespaces.unique_name("na-tbench")
    namespaces.create(netns)
    places = ebpf_places() if mode == "ebpf" else contextlib.nullcontext((None, None))
    try:
        with places as (bpf_root, cgroup):
            return _bench_in(netns, mode, services, samples, connects, bpf_root=bpf_root, cgroup=cgroup)
    finally:
        namespaces.remove(netns)


def _bench_in(netns: str, mode: str, services: int, samples: int, connects: int, *, bpf_root, cgroup) -> dict:
    extra = {}
    for argv in (["ip", "link", "set", "lo", "up"], ["ip", "link", "add", "bench0", "type", "veth", "peer", "name", "bench1"],
                 ["ip", "link", "set", "bench0", "up"], ["ip", "addr", "add", f"{LISTENER}/32", "dev", "bench0"],
                 ["ip", "route", "add", "10.0.0.0/8", "dev", "bench0"]):
        namespaces.run_in(netns, argv, check=True)
    if mode == "ebpf":
        from proxy.ebpf.backend import EbpfPaths
        from proxy.factory import build_ebpf_backend
        started = time.perf_counter()
        backend = build_ebpf_backend(EbpfPaths(bpf_root=bpf_root, cgroup=cgroup))
        load = backend.load_report  # type: ignore[attr-defined]
        extra = {"start": time.perf_counter() - started, "compile": load.compile_seconds, "load": load.load_seconds}
    elif mode == "ipvs":
        backend = build_backend("ipvs", iptables_backend=IptablesBackend.LEGACY, netns=netns)
    else:
        backend = build_backend("iptables", iptables_backend=IptablesBackend(mode.split("-")[1]), netns=netns)
    state = with_listener(make_state(services))
    started = time.perf_counter()
    report = backend.sync(state, changed=None)
    full = time.perf_counter() - started
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
        backend.sync(state, changed=frozenset({max(state.services, key=lambda n: int(n.name.split("-")[1]))}))
        extra["connect"] = connect_latency(netns, cgroup, state, connects)
    rules = report.rules if mode in ("ipvs", "ebpf") else count_rules(netns, mode.split("-")[1])
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


def bench_agent_path(services: int, samples: int) -> float:
    """Median seconds from an EndpointSlice update in the API server to the partial sync that
    programmed it, through the real watch, catalog and sync runner (iptables legacy)."""
    from kubernetes import client

    from netagent.infra.metrics import Registry
    from lab.apiserver import ApiServer
    from proxy.service_proxy import ProxySettings, ServiceProxy

    api = ApiServer()
    api.start()
    netns = namespaces.unique_name("na-tbench")
    namespaces.create(netns)
    proxy = None
    try:
        api.create({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-a"}})
        api.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "bench"}})
        for i in range(services):
            api.create({"apiVersion": "v1", "kind": "Service", "metadata": {"name": f"svc-{i}", "namespace": "bench"},
                        "spec": {"clusterIP": vip(i), "clusterIPs": [vip(i)],
                                 "ports": [{"name": "http", "port": 80, "targetPort": 8080}]}})
            api.create(_slice(i, [pod_ip(i * ENDPOINTS + e) for e in range(ENDPOINTS)]))
        watched = _Watched(build_backend("iptables", iptables_backend=IptablesBackend.LEGACY, netns=netns))
        proxy = ServiceProxy(api_client=client.ApiClient(client.Configuration(host=api.url)),
                             settings=ProxySettings(node_name="node-a", cluster_cidr="10.128.0.0/9"),
                             backend=watched, registry=Registry())
        proxy.start()
        deadline = time.monotonic() + 900
        while proxy.runner.status().runs < 1 and time.monotonic() < deadline:
            time.sleep(0.1)
        times = []
        for sample in range(samples):
            time.sleep(1.1)  # past --min-sync-period, as a lone change in a quiet cluster
            i = (sample * 7919) % services
            new_ip = f"10.250.{sample // 256}.{sample % 256}"
            watched.wanted, _ = new_ip, watched.done.clear()
            started = time.perf_counter()
            api.update(_slice(i, [new_ip] + [pod_ip(i * ENDPOINTS + e) for e in range(1, ENDPOINTS)]))
            if watched.done.wait(60):
                times.append(time.perf_counter() - started)
        return statistics.median(times) if times else float("nan")
    finally:
        if proxy is not None:
            proxy.stop()
        namespaces.remove(netns)
        api.stop()


def _slice(i: int, ips: list[str]) -> dict:
    return {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": f"svc-{i}-1", "namespace": "bench", "labels": {"kubernetes.io/service-name": f"svc-{i}"}},
            "addressType": "IPv4", "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
            "endpoints": [{"addresses": [ip], "conditions": {"ready": True}, "nodeName": "node-b"} for ip in ips]}


def kube_proxy_shaped(services: int) -> str:
    """A ruleset shaped as kube-proxy's iptables mode writes it (chains, comments, SEP pairs)."""
    def digest(text: str) -> str:
        return hashlib.sha256(text.encode()).hexdigest()[:16].upper()
    chains, rules = [":KUBE-SERVICES - [0:0]", ":KUBE-MARK-MASQ - [0:0]"], []
    rules.append("-A KUBE-MARK-MASQ -j MARK --or-mark 0x4000")
    for i in range(services):
        svc = f"KUBE-SVC-{digest(f'svc{i}')}"
        chains.append(f":{svc} - [0:0]")
        name = f"bench/svc-{i}:http"
        rules.append(f'-A KUBE-SERVICES -d {vip(i)}/32 -p tcp -m comment --comment "{name} cluster IP" '
                     f"-m tcp --dport 80 -j {svc}")
        rules.append(f'-A {svc} ! -s 10.128.0.0/9 -d {vip(i)}/32 -p tcp -m comment --comment "{name} cluster IP" '
                     f"-m tcp --dport 80 -j KUBE-MARK-MASQ")
        for e in range(ENDPOINTS):
            ip = pod_ip(i * ENDPOINTS + e)
            sep = f"KUBE-SEP-{digest(f'svc{i}/{e}')}"
            chains.append(f":{sep} - [0:0]")
            probability = f"-m statistic --mode random --probability {1 / (ENDPOINTS - e):.10f} " \
                if e < ENDPOINTS - 1 else ""
            rules.append(f'-A {svc} -m comment --comment "{name} -> {ip}:8080" {probability}-j {sep}')
            rules.append(f'-A {sep} -s {ip}/32 -m comment --comment "{name}" -j KUBE-MARK-MASQ')
            rules.append(f'-A {sep} -p tcp -m comment --comment "{name}" -m tcp -j DNAT --to-destination {ip}:8080')
    return "\n".join(["*nat", *chains, *rules, "COMMIT", ""])


def kube_proxy_change() -> str:
    svc = f"KUBE-SVC-{hashlib.sha256(b'svc5').hexdigest()[:16].upper()}"
    return "\n".join(["*nat", f":{svc} - [0:0]", ":KUBE-SEP-BENCHCHANGE - [0:0]", f"-A {svc} -j KUBE-SEP-BENCHCHANGE",
                      "-A KUBE-SEP-BENCHCHANGE -p tcp -m tcp -j DNAT --to-destination 10.250.0.1:8080",
                      "COMMIT", ""])


def bench_floor(backend: str, services: int, timeout: float) -> dict:
    netns = namespaces.unique_name("na-tbench")
    namespaces.create(netns)
    try:
        text = kube_proxy_shaped(services)
        started = time.perf_counter()
        try:
            namespaces.run_in(netns, [f"iptables-{backend}-restore", "--noflush"], input=text, timeout=timeout,
                              check=True)
        except subprocess.TimeoutExpired:
            return {"full": None, "change": None, "rules": text.count("\n-A ")}
        full = time.perf_counter() - started
        started = time.perf_counter()
        namespaces.run_in(netns, [f"iptables-{backend}-restore", "--noflush"], input=kube_proxy_change(),
                          timeout=timeout, check=True)
        return {"full": full, "change": time.perf_counter() - started, "rules": text.count("\n-A ")}
    finally:
        namespaces.remove(netns)


def seconds(value) -> str:
    return "-" if value is None else f"{value:.3f}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--services", default="1000,10000")
    parser.add_argument("--modes", default="iptables-legacy,iptables-nft")
    parser.add_argument("--samples", type=int, default=5)
    parser.add_argument("--floor-timeout", type=float, default=600)
    parser.add_argument("--nft-floor-at-10k", action="store_true")
    parser.add_argument("--connect", type=int, default=0, metavar="N",
                        help="also measure connect() latency to the last service over N connects")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))   # run the clean-ups (namespace, cgroup, bpffs)
    sizes = [int(n) for n in args.services.split(",")]
    modes = args.modes.split(",")
    print(f"# service proxy benchmark: {ENDPOINTS} endpoints per service, {args.samples} one-endpoint changes, "
          f"kernel {os.uname().release}")
    print(f"{'services':>8}  {'backend':<28} {'full sync s':>11} {'1 change s':>10} {'rules':>8} {'RSS MiB':>8}")
    for size in sizes:
        floors = {}
        for mode in modes:
            result = bench_backend(mode, size, args.samples, args.connect)
            print(f"{size:>8}  {'netagent ' + mode:<28} {seconds(result['full']):>11} {result['change']:>10.5f} "
                  f"{result['rules']:>8} {result['rss']:>8.0f}", flush=True)
            if "compile" in result:
                print(f"{'':>8}  {'  ebpf start':<28} bcc compile {result['compile']:.3f} s, load+attach "
                      f"{result['load']:.3f} s, open maps {result['start'] - result['compile'] - result['load']:.3f} s")
                print(f"{'':>8}  {'  /metrics map fill':<28} {result['entries']} entries counted in "
                      f"{result['scrape'] * 1e3:.1f} ms")
            if "connect" in result:
                median, p99 = result["connect"]
                print(f"{'':>8}  {'  connect() to last service':<28} median {median * 1e6:.0f} us, "
                      f"p99 {p99 * 1e6:.0f} us ({args.connect} connects)", flush=True)
            if mode.startswith("iptables-"):
                backend = mode.split("-")[1]
                if backend == "nft" and size > 1000 and not args.nft_floor_at_10k:
                    floors[backend] = None
                    continue
                floors[backend] = bench_floor(backend, size, args.floor_timeout)
        for backend, floor in floors.items():
            if floor is None:
                print(f"{size:>8}  {'kube-proxy shape, ' + backend:<28} {'skipped':>11} (ENVIRONMENT.md: > 25 min)")
                continue
            print(f"{size:>8}  {'kube-proxy shape, ' + backend:<28} {seconds(floor['full']):>11} "
                  f"{seconds(floor['change']):>10} {floor['rules']:>8} {'-':>8}", flush=True)
    if "iptables-legacy" in modes:
        for size in sizes:
            print(f"{size:>8}  {'agent path, iptables-legacy':<28} {'':>11} {seconds(bench_agent_path(size, args.samples)):>10}"
                  f"   (EndpointSlice update in the API -> programmed)", flush=True)
    print(f"# peak RSS of this process: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())

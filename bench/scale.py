"""Benchmark (issue 32): one real netagent agent in a cluster of thousands of nodes and tens of
thousands of pods, against the real kube-apiserver.

    sudo .venv/bin/python bench/scale.py [--sizes 100:3000,1000:30000] [--services 1000]
        [--mode host-gw|vxlan] [--samples 5] [--workers 8] [--agent-root DIR] [--json FILE]

Per size (nodes:pods), on a fresh cluster (`scale_cluster.py`: etcd and kube-apiserver, built by
scripts/build-kubernetes, in a namespace of their own; the agent in another, on one wire):
1. the objects (`scale_objects.py`), created in parallel through `--workers` keep-alive HTTPS
   connections: Namespaces with labels (and their default ServiceAccount), Nodes with pod
   CIDRs and announcements, Pods with their status (/status, as a kubelet), one
   NetworkPolicy per Namespace, `--services` Services with an EndpointSlice of 10 endpoints;
2. `start_s`: the agent started -> fully programmed, judged from the kernel every 0.5 s: a
   route to every peer, a DNAT rule per endpoint, every local pod in the policy's KNOWN set;
   `cpu_s` its CPU (its children included) and `rss_mib` its resident memory then;
3. `node_change_ms`: a Node created -> its route (`ip monitor`, bench/node_routes.py's);
   `endpoint_change_ms`: an endpoint added to a slice -> a new jump in that Service's chain;
   `policy_change_ms`: a pod of another node relabelled into a policy's peers -> its address in
   the peer ipset (medians of `--samples`, polled by the real tools: a few ms of resolution);
4. a kube-apiserver restart: `relist_requests` (the agent's requests from the restart until it
   is programmed again, from the audit log of its own user), `relist_bytes` (the LIST response
   bytes of the agent's resources, from the restarted API server's apiserver_response_sizes;
   its own start-up lists are included), `relist_s` (the kill -> a Node created after the
   restart routed by the agent).
Printed as it goes; `--json FILE` writes one record per size (`scale_objects.FIELDS`, then the
mode, creation time, relist time, the 1-minute load average, versions and notes).
"""
from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from importlib.metadata import version

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(1, os.path.dirname(os.path.abspath(__file__)))

from netagent.kube.resources import resource_for  # noqa: E402
import scale_cluster  # noqa: E402
import scale_kernel as kernel  # noqa: E402
import scale_objects as objects  # noqa: E402
from node_routes import RouteMonitor, rss_mib  # noqa: E402

DEFAULT_SIZES = "1000:30000"
MERGE = "application/merge-patch+json"


def create(client, obj: dict) -> dict:
    resource = resource_for(obj["apiVersion"], obj["kind"])
    namespace = obj["metadata"].get("namespace") if resource.namespaced else None
    return client.json("POST", resource.list_path(namespace), obj)


def create_pod(client, size: objects.Size, index: int) -> None:
    pod = objects.pod(size, index)
    create(client, pod)
    path = resource_for("v1", "Pod").object_path(pod["metadata"]["name"], pod["metadata"]["namespace"])
    client.json("PATCH", path + "/status", objects.pod_status_patch(pod), content_type=MERGE)


def parallel(pool: ThreadPoolExecutor, fn, items) -> list:
    return list(pool.map(fn, items))


def create_cluster(client, size: objects.Size, mode: str, workers: int) -> tuple[list[dict], float]:
    """Every object of `size`; the created Services (their uids make the slices) and the seconds."""
    started = time.monotonic()
    pool = ThreadPoolExecutor(workers)
    try:
        parallel(pool, lambda i: create(client, objects.namespace(i)), range(size.namespaces))
        parallel(pool, lambda i: client.json("POST", f"/api/v1/namespaces/{objects.namespace_name(i)}/serviceaccounts",
                                             objects.service_account(i)), range(size.namespaces))
        parallel(pool, lambda i: create(client, objects.node(i, mode=mode)), range(size.nodes))
        step = max(1, size.pods // 10)
        for first in range(0, size.pods, step):
            parallel(pool, lambda i: create_pod(client, size, i), range(first, min(size.pods, first + step)))
            print(f"    {min(size.pods, first + step)} pods, {time.monotonic() - started:.0f} s", flush=True)
        parallel(pool, lambda i: create(client, objects.network_policy(i)), range(size.namespaces))
        services = parallel(pool, lambda i: create(client, objects.service(size, i)), range(size.services))
        parallel(pool, lambda i: create(client, objects.endpoint_slice(size, services[i], i)), range(size.services))
    finally:   # Ctrl-C: the requests under way end, the queued ones are dropped
        pool.shutdown(wait=True, cancel_futures=True)
    return services, time.monotonic() - started


def programmed(m: scale_cluster.Machines, size: objects.Size) -> tuple[bool, str]:
    routes = kernel.route_count(m.node_ns)
    dnat = kernel.dnat_count(kernel.nat_rules(m.node_ns))
    known = kernel.known_pods(m.node_ns)
    # DNAT: every endpoint, and the `kubernetes` Service's one (the API server)
    want = (size.nodes - 1, size.services * objects.ENDPOINTS + 1, len(objects.local_pods(size)))
    return (routes, dnat, known) == want, f"routes {routes}/{want[0]}, DNAT {dnat}/{want[1]}, KNOWN {known}/{want[2]}"


def wait_programmed(m: scale_cluster.Machines, size: objects.Size, started: float, *, timeout: float) -> float:
    last = ""
    while time.monotonic() - started < timeout:
        if m.agent_pid is None or not os.path.exists(f"/proc/{m.agent_pid}"):
            raise RuntimeError(f"the agent exited; its log: {m.agent_log()}")
        done, last = programmed(m, size)
        if done:
            return time.monotonic() - started
        time.sleep(0.5)
    raise TimeoutError(f"not programmed in {timeout:.0f} s: {last}")


def wait_for(check, *, timeout: float, what: str, pause: float = 0.002) -> float:
    """Seconds until `check()`; polled as fast as the tool answers."""
    started = time.monotonic()
    while not check():
        if time.monotonic() - started > timeout:
            raise TimeoutError(f"{what}: not seen in {timeout:.0f} s")
        time.sleep(pause)
    return time.monotonic() - started


def node_changes(m, monitor: RouteMonitor, size: objects.Size, mode: str, samples: int) -> list[float]:
    times = []
    for k in range(samples):
        node = objects.node(size.nodes + k, mode=mode)
        cidr = node["spec"]["podCIDR"]
        posted = time.time()
        create(m.client, node)
        monitor.wait(monitor.added, [cidr])
        times.append((monitor.added[cidr] - posted) * 1000)
        m.client.json("DELETE", resource_for("v1", "Node").object_path(node["metadata"]["name"]))
        monitor.wait(monitor.deleted, [cidr])
        time.sleep(1.1)
    return times


def endpoint_changes(m, size: objects.Size, services: list[dict], samples: int) -> list[float]:
    saved = kernel.nat_rules(m.node_ns)
    slices = resource_for("discovery.k8s.io/v1", "EndpointSlice")
    times = []
    for k in range(samples):
        index = (k * 7919 + 1) % size.services
        chain = kernel.chain_of_service(saved, services[index]["spec"]["clusterIP"])
        before = kernel.chain_endpoints(m.node_ns, chain)
        body = objects.endpoint_slice(size, services[index], index, extra=[objects.extra_endpoint_pod(size, k)])
        path = slices.object_path(body["metadata"]["name"], body["metadata"]["namespace"])
        time.sleep(1.1)   # past the proxy's minimum sync period: a lone change in a quiet cluster
        posted = time.monotonic()
        m.client.json("PATCH", path, {"endpoints": body["endpoints"]}, content_type=MERGE)
        wait_for(lambda: kernel.chain_endpoints(m.node_ns, chain) > before, timeout=120, what=f"endpoint in {chain}")
        times.append((time.monotonic() - posted) * 1000)
    return times


def policy_changes(m, size: objects.Size, samples: int) -> list[float]:
    """Server pods of namespace 0 (team t0, as local pod 0's) on other nodes relabelled client:
    each joins the peer sets that hold pod 1 (a client of t0)."""
    sets = [name for name, members in kernel.ipsets(m.node_ns).items() if objects.pod_address(size, 1) in members]
    if not sets:
        raise LookupError("no policy set holds the client pod 1")
    targets = [p for p in range(2, min(size.pods, objects.PODS_PER_NAMESPACE), 2) if p % size.nodes][:samples]
    pods = resource_for("v1", "Pod")
    times = []
    for index in targets:
        address = objects.pod_address(size, index)
        path = pods.object_path(objects.pod_name(index), objects.namespace_name(objects.namespace_of(index)))
        time.sleep(1.1)
        posted = time.monotonic()
        m.client.json("PATCH", path, {"metadata": {"labels": {"role": "client"}}}, content_type=MERGE)
        wait_for(lambda: kernel.in_set(m.node_ns, sets[0], address), timeout=120, what=f"{address} in {sets[0]}")
        times.append((time.monotonic() - posted) * 1000)
    return times


def relist(m, monitor: RouteMonitor, size: objects.Size, mode: str) -> dict:
    """Restart kube-apiserver; the agent's requests and LIST bytes until it routes a new Node."""
    offset = os.path.getsize(m.audit_log()) if os.path.exists(m.audit_log()) else 0
    killed = time.time()
    m.stop_apiserver()
    ready_s = m.start_apiserver()
    node = objects.node(size.nodes + 1000, mode=mode)
    create(m.client, node)
    monitor.wait(monitor.added, [node["spec"]["podCIDR"]], timeout=900)
    relist_s = monitor.added[node["spec"]["podCIDR"]] - killed
    time.sleep(5)   # the lists that started before the Node's route finish
    with open(m.audit_log()) as f:
        f.seek(offset)
        verbs = kernel.audit_requests(f.read(), scale_cluster.AGENT_USER)
    metrics = m.client.request("GET", "/metrics").decode()
    return {"relist_requests": sum(verbs.values()), "relist_bytes": int(kernel.metric_sum(
                metrics, "apiserver_response_sizes_sum")), "relist_s": round(relist_s, 2),
            "verbs": verbs, "apiserver_ready_s": round(ready_s, 1)}


def agent_version(root: str) -> str:
    """The agent's version and the commit of the checkout it ran from (with a + when that has changes)."""
    commit = subprocess.run(["git", "-C", root, "describe", "--always", "--dirty=+"], capture_output=True,
                            text=True).stdout.strip()
    return f"{version('netagent')} ({commit or 'not a git checkout'})"


def writes(size: objects.Size) -> int:
    """Objects the harness writes for `size` (a pod is two writes: itself and its status)."""
    return 3 * size.namespaces + size.nodes + 2 * size.pods + 2 * size.services


def median(values: list[float]) -> float | None:
    return round(statistics.median(values), 1) if values else None


def run_size(size: objects.Size, args) -> dict:
    print(f"== {size.label} ({args.mode}, iptables, policy on)", flush=True)
    notes: list[str] = []
    with scale_cluster.machines(mode=args.mode, agent_root=args.agent_root, keep_workdir=args.keep_workdir) as m:
        m.start_control_plane()
        assert m.client is not None
        apiserver = m.version()
        services, create_s = create_cluster(m.client, size, args.mode, args.workers)
        print(f"  created in {create_s:.0f} s (kube-apiserver {apiserver})", flush=True)
        m.reserve_local_pods([objects.pod_address(size, p) for p in objects.local_pods(size)])
        monitor = RouteMonitor(m.node_ns)
        try:
            started = time.monotonic()
            pid = m.start_agent()
            start_s = wait_programmed(m, size, started, timeout=args.timeout)
            cpu_s, rss = kernel.process_cpu_s(pid), rss_mib(pid)
            print(f"  start -> programmed {start_s:.1f} s, CPU {cpu_s:.1f} s, RSS {rss:.0f} MiB", flush=True)
            assert m.pids.apiserver and m.pids.etcd
            notes.append(f"created at {writes(size) / create_s:.0f} writes/s; kube-apiserver RSS "
                         f"{rss_mib(m.pids.apiserver):.0f} MiB, etcd {rss_mib(m.pids.etcd):.0f} MiB")
            node_ms = median(node_changes(m, monitor, size, args.mode, args.samples))
            endpoint_ms = median(endpoint_changes(m, size, services, args.samples))
            policy_ms = median(policy_changes(m, size, args.samples))
            print(f"  Node -> route {node_ms} ms; endpoint -> rule {endpoint_ms} ms; label -> set member "
                  f"{policy_ms} ms (medians of {args.samples})", flush=True)
            again = relist(m, monitor, size, args.mode)
            print(f"  API server restart: {again['relist_requests']} requests {again['verbs']}, "
                  f"{again['relist_bytes'] / 2**20:.1f} MiB listed, routing again {again['relist_s']} s after the "
                  f"kill (API server ready in {again['apiserver_ready_s']} s)", flush=True)
            notes.append(f"API server ready {again['apiserver_ready_s']} s after the kill; agent verbs {again['verbs']}")
            rss_end = rss_mib(pid)
            notes.append(f"RSS after the changes and the relist {rss_end:.0f} MiB")
        finally:
            monitor.stop()
    return objects.record(size, start_s=round(start_s, 1), rss_mib=round(rss, 1), cpu_s=round(cpu_s, 1),
                          node_change_ms=node_ms, endpoint_change_ms=endpoint_ms, policy_change_ms=policy_ms,
                          relist_requests=again["relist_requests"], relist_bytes=again["relist_bytes"],
                          mode=args.mode, create_s=round(create_s, 1), relist_s=again["relist_s"],
                          load_1m=round(os.getloadavg()[0], 2), agent_version=agent_version(args.agent_root),
                          apiserver=apiserver, notes="; ".join(notes))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default=DEFAULT_SIZES, help="nodes:pods,... (default: the largest run here)")
    parser.add_argument("--services", type=int, default=1000, help="Services, 10 endpoints each")
    parser.add_argument("--mode", choices=("host-gw", "vxlan"), default="host-gw")
    parser.add_argument("--samples", type=int, default=5)
    parser.add_argument("--workers", type=int, default=8, help="parallel HTTPS connections for creation")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds the agent may take to program")
    parser.add_argument("--agent-root", default=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                        help="the checkout the agent runs from (a pinned worktree keeps runs comparable)")
    parser.add_argument("--keep-workdir", action="store_true", help="keep logs (the namespaces go anyway)")
    parser.add_argument("--json", metavar="FILE")
    args = parser.parse_args(argv)
    try:
        args.sizes = objects.parse_sizes(args.sizes, services=args.services)
    except objects.SizeError as error:
        parser.error(str(error))
    if not 1 <= args.samples <= 100 or not 1 <= args.workers <= 64:
        parser.error("--samples must be 1..100 and --workers 1..64")
    return args


def main() -> int:
    args = parse_args()
    if os.geteuid() != 0:
        print("needs root (it builds network namespaces)", file=sys.stderr)
        return 1
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))   # the finally blocks clean up
    signal.signal(signal.SIGINT, signal.default_int_handler)   # Ctrl-C too, even if started with it ignored
    records = []
    for size in args.sizes:
        records.append(run_size(size, args))
        if args.json:
            with open(args.json + ".tmp", "w") as f:
                f.write(objects.records_json(records))
            os.replace(args.json + ".tmp", args.json)
    print(objects.records_json(records))
    return 0


if __name__ == "__main__":
    sys.exit(main())

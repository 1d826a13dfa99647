"""Benchmark: how fast Node changes become usable routes, what the agent costs, what pods get,
beside the real flannel.

    sudo .venv/bin/python bench/node_routes.py [--peers 10,100,1000] [--samples 20] [--iperf-seconds 3]
                                               [--family ipv4,ipv6] [--throughput-only]
                                               [--flannel vxlan,host-gw|none] [--json FILE]

1. Convergence, per mode (host-gw, vxlan): a one-node lab (the real agent, the in-repo API
   server), then simulated peers: Node objects whose announcements point at addresses on the
   node's segment (they need not answer; programming routes does not need them). For each
   peer count, the time to program the whole batch, then, one by one, `--samples` single
   Nodes created in the API: the time from just before the create call to the kernel's route
   notification (`ip -ts monitor route` in the node's namespace), and the same for deletion.
   flannel (bench/flannel_peer.py: flanneld v<pinned> with its kube subnet manager, against the
   lab's API server) gets the same peers, announced as flanneld announces a node, and the
   same measurement in its node's namespace; its rows are `flannel-<backend>`.
2. The agent's resident memory at each peer count (VmRSS).
3. Throughput: iperf3 between two pods on two nodes per mode, against two namespaces joined
   by a bare veth (the ceiling) and the same veth carrying a plain kernel VXLAN pair (no agent:
   the kernel's own VXLAN limit), in alternating rounds of the same run (`--rounds`, medians).
   IPIP runs only in the VM tier (this kernel has no IPIP), so it is not in this table.
4. With `--family`: pod-to-pod throughput per mode and IP family and the IPv6/IPv4 ratio
   (`bench/pod_throughput.py`: two nodes programmed by the routing code, one per family).
"""
from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from importlib.metadata import version

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(1, os.path.dirname(os.path.abspath(__file__)))  # bench/'s own modules, when imported as bench.<name>

from lab import physical  # noqa: E402
from lab.cluster import LabCluster  # noqa: E402
from netagent.kernel import namespaces  # noqa: E402
from netagent.noderoutes import node_objects as nodes  # noqa: E402
import flannel_peer  # noqa: E402  (bench/, beside this file)
import go_peers  # noqa: E402


class RouteMonitor:
    """`ip -ts monitor route` in a namespace: when each destination was added or deleted."""

    def __init__(self, netns: str) -> None:
        self.added: dict[str, float] = {}
        self.deleted: dict[str, float] = {}
        self.lock = threading.Lock()
        self.proc = subprocess.Popen([*namespaces.exec_prefix(netns), "ip", "-ts", "monitor", "route"],
                                     stdout=subprocess.PIPE, text=True)
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()
        time.sleep(0.3)

    def _read(self) -> None:
        for line in self.proc.stdout:
            if not line.startswith("["):
                continue
            stamp, _, rest = line[1:].partition("] ")
            when = datetime.datetime.fromisoformat(stamp).timestamp()
            words = rest.split()
            target = self.deleted if words[:1] == ["Deleted"] else self.added
            dst = words[1] if words[:1] == ["Deleted"] else words[0]
            with self.lock:
                target.setdefault(dst, when)

    def wait(self, table: dict, dsts, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while True:
            with self.lock:
                if all(d in table for d in dsts):
                    return
            if time.monotonic() > deadline:
                raise TimeoutError(f"routes did not converge: {len([d for d in dsts if d not in table])} missing")
            time.sleep(0.005)

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait()


def fake_node(index: int, segment_network, mode: str) -> dict:
    pod_cidr = f"10.244.{128 + index // 16}.{(index % 16) * 16}/28"
    address = segment_network[1000 + index]
    data = {"vtepMAC": f"0e:42:{(index >> 8) & 0xff:02x}:{index & 0xff:02x}:00:01"} if mode != "host-gw" else {}
    notes = nodes.render_announcement(backend_type=mode, public_ip=address, backend_data=data)
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": f"sim-{index}", "annotations": notes},
            "spec": {"podCIDR": pod_cidr, "podCIDRs": [pod_cidr]}}


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def percentile(values, q):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def convergence(mode: str, peer_counts: list[int], samples: int) -> list[dict]:
    with LabCluster.create(nodes=1, mode=mode, prefix="na-bench", resync_period=3600) as lab:
        node = lab.state.nodes["node-1"]
        monitor = RouteMonitor(node.netns)
        network = physical.segment_network(node.segment)
        try:
            return measure_peers(mode, lambda i: fake_node(i, network, mode), lab.api(), monitor, peer_counts,
                                 samples, lambda: rss_mib(node.agent_pid))
        finally:
            monitor.stop()


def measure_peers(mode: str, make_node, api, monitor: RouteMonitor, peer_counts: list[int], samples: int,
                  rss) -> list[dict]:
    """For each peer count: the batch of Nodes created up to it, then `samples` single Nodes
    created and deleted, each timed from just before the API call to the route's notification."""
    rows, created = [], 0
    for count in peer_counts:
        batch = [make_node(i) for i in range(created, count)]
        started = time.time()
        for obj in batch:
            api.create(obj)
        monitor.wait(monitor.added, [o["spec"]["podCIDR"] for o in batch])
        batch_seconds = max([monitor.added[o["spec"]["podCIDR"]] for o in batch] or [started]) - started
        created = count
        add_ms, del_ms = [], []
        for k in range(samples):
            obj = make_node(count + 500 + k)
            cidr = obj["spec"]["podCIDR"]
            posted = time.time()
            api.create(obj)
            monitor.wait(monitor.added, [cidr])
            add_ms.append((monitor.added[cidr] - posted) * 1000)
            posted = time.time()
            api.delete("v1", "Node", obj["metadata"]["name"])
            monitor.wait(monitor.deleted, [cidr])
            del_ms.append((monitor.deleted[cidr] - posted) * 1000)
            with monitor.lock:
                monitor.added.pop(cidr, None)
                monitor.deleted.pop(cidr, None)
        rows.append({"mode": mode, "peers": count, "batch_s": batch_seconds,
                     "add_median_ms": statistics.median(add_ms), "add_p95_ms": percentile(add_ms, 0.95),
                     "del_median_ms": statistics.median(del_ms), "del_p95_ms": percentile(del_ms, 0.95),
                     "agent_rss_mib": rss()})
        print(f"  {mode:<15} {count:>5} peers: batch {batch_seconds:6.2f} s; one Node -> route "
              f"median {rows[-1]['add_median_ms']:6.1f} ms (p95 {rows[-1]['add_p95_ms']:6.1f}); "
              f"delete -> gone median {rows[-1]['del_median_ms']:6.1f} ms; RSS "
              f"{rows[-1]['agent_rss_mib']:.1f} MiB", flush=True)
    return rows


def flannel_node(index: int, backend: str) -> dict:
    """Simulated peer `index` as another flanneld would announce it (bench/flannel_peer.py's segment)."""
    cidr = f"10.244.{128 + index // 16}.{(index % 16) * 16}/28"
    address = str(flannel_peer.SEGMENT.network_address + 1000 + index)
    return flannel_peer.announced_node(f"sim-{index}", cidr, address, backend,
                                       f"0e:42:{(index >> 8) & 0xff:02x}:{index & 0xff:02x}:00:01")


def flannel_convergence(backend: str, flanneld: str, peer_counts: list[int], samples: int) -> list[dict]:
    """`convergence`'s figures for flanneld, measured in its node-1's namespace."""
    rows = []
    with flannel_peer.flannel_nodes(backend, flanneld) as lab:
        monitor = RouteMonitor(lab.node_netns)
        pid = flanneld_pid(lab.node_netns)
        try:
            rows = measure_peers(f"flannel-{backend}", lambda i: flannel_node(i, backend), lab.api, monitor,
                                 peer_counts, samples, lambda: rss_mib(pid))
        finally:
            monitor.stop()
    return rows


def flanneld_pid(netns: str) -> int:
    """The flanneld running in `netns` (for its RSS)."""
    found = subprocess.run(["ip", "netns", "pids", netns], capture_output=True, text=True, check=True).stdout.split()
    for pid in found:
        with open(f"/proc/{pid}/comm") as f:
            if f.read().strip() == "flanneld":
                return int(pid)
    raise RuntimeError(f"no flanneld in {netns}")


def iperf(lab_or_none, client_ns: str, server_ns: str, address: str, seconds: float) -> float:
    server = subprocess.Popen([*namespaces.exec_prefix(server_ns), "iperf3", "-s", "-1"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        time.sleep(0.3)
        out = subprocess.run([*namespaces.exec_prefix(client_ns), "iperf3", "-c", address, "-t", str(seconds),
                              "-J"], capture_output=True, text=True, timeout=seconds + 30)
        return json.loads(out.stdout)["end"]["sum_received"]["bits_per_second"] / 1e9
    finally:
        server.kill()
        server.wait()


def veth_baseline(seconds: float) -> float:
    """Two namespaces joined by a bare veth: the ceiling."""
    with veth_pair() as (a, b):
        return iperf(None, a, b, "10.99.0.2", seconds)


def vxlan_baseline(seconds: float) -> float:
    """The same bare veth with a plain kernel VXLAN device on each end (`ip link add ... type
    vxlan`, the kernel's defaults, no agent): what the kernel's VXLAN costs by itself."""
    with veth_pair() as (a, b):
        for ns, me, other in ((a, 1, 2), (b, 2, 1)):
            namespaces.run_in(ns, ["ip", "link", "add", "vx0", "type", "vxlan", "id", "1", "local", f"10.99.0.{me}",
                                   "remote", f"10.99.0.{other}", "dstport", "4789", "dev", "eth0"], check=True)
            namespaces.run_in(ns, ["ip", "addr", "add", f"10.98.0.{me}/24", "dev", "vx0"], check=True)
            namespaces.run_in(ns, ["ip", "link", "set", "vx0", "up"], check=True)
        return iperf(None, a, b, "10.98.0.2", seconds)


@contextlib.contextmanager
def veth_pair():
    """(a, b): two namespaces, eth0 in each joined as one veth, 10.99.0.1 and .2 /24; removed after."""
    a, b = namespaces.unique_name("na-bench-a"), namespaces.unique_name("na-bench-b")
    try:
        namespaces.create(a)
        namespaces.create(b)
        namespaces.run_in(a, ["ip", "link", "add", "eth0", "type", "veth", "peer", "name", "eth0",
                              "netns", namespaces.netns_path(b)], check=True)
        for ns, addr in ((a, "10.99.0.1/24"), (b, "10.99.0.2/24")):
            namespaces.run_in(ns, ["ip", "addr", "add", addr, "dev", "eth0"], check=True)
            namespaces.run_in(ns, ["ip", "link", "set", "eth0", "up"], check=True)
        yield a, b
    finally:
        namespaces.remove(a)
        namespaces.remove(b)


def throughput(mode: str, seconds: float) -> float:
    with LabCluster.create(nodes=2, mode=mode, pods_per_node=1, prefix="na-bench") as lab:
        pods = {p.node: p for p in lab.state.pods.values()}
        return iperf(lab, pods["node-1"].netns, pods["node-2"].netns, pods["node-2"].ip, seconds)


def pod_to_pod(modes: list[str], seconds: float, rounds: int) -> dict[str, float]:
    """Median Gbit/s of the two anchors and each mode, the rounds alternating so load hits all alike."""
    runs: dict[str, list[float]] = {"bare veth": [], "bare vxlan": [], **{mode: [] for mode in modes}}
    for _ in range(rounds):
        runs["bare veth"].append(veth_baseline(seconds))
        runs["bare vxlan"].append(vxlan_baseline(seconds))
        for mode in modes:
            runs[mode].append(throughput(mode, seconds))
    return {name: statistics.median(values) for name, values in runs.items()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--peers", default="10,100,1000")
    parser.add_argument("--samples", type=int, default=20)
    parser.add_argument("--modes", default="host-gw,vxlan")
    parser.add_argument("--iperf-seconds", type=float, default=3)
    parser.add_argument("--family", default="", help="ipv4,ipv6: also the per-family throughput table")
    parser.add_argument("--rounds", type=int, default=3, help="throughput rounds per cell (median)")
    parser.add_argument("--throughput-only", action="store_true", help="skip convergence")
    parser.add_argument("--flannel", default="vxlan,host-gw", help="flannel backends measured beside ours, or none")
    parser.add_argument("--json", metavar="FILE", help="also write the convergence rows to FILE")
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("needs root (it builds network namespaces)", file=sys.stderr)
        return 1
    counts = sorted(int(c) for c in args.peers.split(","))
    modes = args.modes.split(",")
    rows = []
    if not args.throughput_only:
        print("== convergence: Node created in the API -> route in the kernel")
        netagent = "netagent " + version("netagent")
        rows = [{**row, "version": netagent} for mode in modes for row in convergence(mode, counts, args.samples)]
        backends = [] if args.flannel == "none" else args.flannel.split(",")
        if backends:
            try:
                directory, flannel_version = go_peers.build(go_peers.FLANNEL)
            except go_peers.BuildError as error:
                print(f"flannel is left out: {error}", file=sys.stderr)
                backends = []
            for backend in backends:
                found = flannel_convergence(backend, os.path.join(directory, "flanneld"), counts, args.samples)
                rows += [{**row, "version": f"flannel {flannel_version}"} for row in found]
    print(f"\n== pod-to-pod throughput (iperf3 TCP, one stream, median of {args.rounds} alternating rounds)")
    found = pod_to_pod(modes, args.iperf_seconds, args.rounds)
    baseline, kernel_vxlan = found["bare veth"], found["bare vxlan"]
    print(f"  bare veth between two namespaces:     {baseline:6.2f} Gbit/s (the ceiling)")
    print(f"  bare kernel vxlan over that veth:     {kernel_vxlan:6.2f} Gbit/s  ({kernel_vxlan / baseline:.2f}x the "
          f"bare veth: the kernel's own VXLAN limit, no agent)")
    for mode in modes:
        gbps = found[mode]
        against = f", {gbps / kernel_vxlan:.2f}x the bare kernel vxlan" if mode == "vxlan" else ""
        print(f"  {mode:<8} pod -> pod across nodes:        {gbps:6.2f} Gbit/s  ({gbps / baseline:.2f}x the bare veth"
              f"{against})")
    if args.family:
        from bench import pod_throughput
        from netagent.noderoutes.routing.model import Mode
        families = [pod_throughput.FAMILY_NAMES[f] for f in args.family.split(",")]
        routing_modes = [Mode(m) for m in modes]
        print(f"\n== pod-to-pod throughput per family (two nodes, median of {args.rounds})")
        medians, _ = pod_throughput.measure(routing_modes, families, seconds=args.iperf_seconds, rounds=args.rounds)
        pod_throughput.print_table(medians, routing_modes, families)
    print("\n== summary (json)")
    print(json.dumps(rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

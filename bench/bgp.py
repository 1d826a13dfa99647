"""Benchmark: BGP route convergence (full mesh against route reflectors, with and without BFD),
beside the VXLAN backend's, and pod-to-pod throughput over BGP routes across segments.

    sudo .venv/bin/python bench/bgp.py [--nodes 10,50,100] [--samples 5] [--bfd-nodes 10] [--iperf-seconds 3]

1. BIRD-only fleets: N node namespaces on one L2 segment, one BIRD 2 each, every configuration
   composed and rendered by the product (`compose_node_config`, `render_bird_config`: exactly
   what the agent runs: its own CIDR announced, per-peer exact import filters, learnt routes
   into the agent's table), in two topologies: node-to-node full mesh, and two route reflectors with
   every other node their client. Figures per topology and N:
   - initial: from starting every BIRD to every node holding every other node's route;
   - join: from a new node's BIRD starting (its peers already knew it: in the cluster, from its
     Node object) to its pod CIDR in the kernel of every other node (`ip -ts monitor route` in
     each namespace): median and worst of `--samples` joins;
   - leave: from that node's BIRD stopping (SIGTERM: it says goodbye, Cease) to its route gone
     from every other node;
   - failure with BFD (fleets of `--bfd-nodes` nodes, BFD on every session): its cable cut (its
     switch port down, no goodbye), to its route gone everywhere. Without BFD that is the hold
     time (the product's default, printed), not waited for.
2. The VXLAN backend in the same run (`bench/node_routes.py`'s measurement: a real agent, a
   Node object created in the API -> its route in the agent's kernel, with N peers).
3. Throughput (iperf3, one TCP stream): pod -> pod across two segments over BGP routes (through
   both top-of-rack routers, no encapsulation) against host-gw within one segment; the ratio.
   Needs the agent's `--backend bgp` (a `lab --mode bgp` cluster); skipped with the reason when
   the checkout has none.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import shutil
import sys
import tempfile
import time
from ipaddress import IPv4Address, IPv4Network

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.node_routes import RouteMonitor, convergence, iperf  # noqa: E402
from lab import physical  # noqa: E402
from lab.processes import Processes, process_alive  # noqa: E402
from netagent.kernel import namespaces, owned  # noqa: E402
from netagent.noderoutes.bgp.bird_config import render_bird_config  # noqa: E402
from netagent.noderoutes.bgp.model import Bfd, BgpNodeConfig, Timers  # noqa: E402
from netagent.noderoutes.bgp.topology import BgpNode, TopologySettings, compose_node_config  # noqa: E402

ASN = 64512
REFLECTORS = 2
TIMEOUT = 180.0


def pod_cidr(index: int) -> IPv4Network:
    return IPv4Network(f"10.244.{index}.0/24")


class Fleet:
    """N+samples BIRD-only nodes on one segment; `members` start at once, `samples` join later."""

    def __init__(self, *, members: int, samples: int, topology: str, bfd: bool) -> None:
        self.prefix = namespaces.unique_name("na-bgpb")
        self.workdir = ""   # build() makes it
        self.switch, self.router, self.internet = (f"{self.prefix}-{x}" for x in ("sw", "rtr", "inet"))
        self.members, self.samples, self.topology, self.bfd = members, samples, topology, bfd
        self.processes = Processes(cwd="/")
        self.pids: dict[int, int] = {}
        self.monitors: dict[int, RouteMonitor] = {}
        self.indexes = list(range(1, members + samples + 1))

    def netns(self, index: int) -> str:
        return f"{self.prefix}-n{index}"

    def address(self, index: int) -> IPv4Address:
        return physical.node_address(1, index)

    def reflector(self, index: int) -> bool:
        return self.topology == "reflectors" and index <= REFLECTORS

    def config(self, index: int) -> BgpNodeConfig:
        """What the agent composes for node `index` (`topology.compose_node_config`), every node
        (samples included) admitted: its Node object exists before its BIRD starts."""
        nodes = [BgpNode(name=f"n{i}", address=self.address(i), cidrs=(pod_cidr(i),), reflector=self.reflector(i))
                 for i in self.indexes]
        topology = TopologySettings(asn=ASN, mesh=self.topology == "mesh", bfd=self.bfd)
        return compose_node_config(nodes[index - 1], nodes, topology, local_network=physical.segment_network(1))

    def render(self, index: int) -> str:
        return render_bird_config(self.config(index))

    def build(self) -> None:
        self.workdir = tempfile.mkdtemp(prefix=f"{self.prefix}-")
        self.processes = Processes(cwd=self.workdir)
        physical.build_backbone(switch=self.switch, router=self.router, internet=self.internet, segments=1)
        for index in self.indexes:
            physical.plug_node(switch=self.switch, node=self.netns(index), segment=1, index=index, port=f"n{index}")
            with open(self._path(index, "conf"), "w") as f:
                f.write(self.render(index))
            self.monitors[index] = RouteMonitor(self.netns(index))
        self._pin_neighbours()

    def _pin_neighbours(self) -> None:
        """Every node's neighbours as permanent entries. The kernel's ARP table is one for all
        namespaces, capped (gc_thresh3, 1024 by default, a root-namespace sysctl we leave alone):
        a 100-node mesh needs 10,000 entries, and resolving them dynamically overflows the table
        (sessions stuck, other users of the machine starved). Permanent entries are exempt."""
        macs = {}
        for index in self.indexes:
            link = json.loads(namespaces.run_in(self.netns(index), ["ip", "-j", "link", "show", "eth0"],
                                                check=True).stdout)[0]
            macs[index] = link["address"]
        for index in self.indexes:
            batch = "".join(f"neigh replace {self.address(other)} lladdr {macs[other]} dev eth0 nud permanent\n"
                            for other in self.indexes if other != index)
            namespaces.run_in(self.netns(index), ["ip", "-batch", "-"], input=batch, check=True)

    def _path(self, index: int, kind: str) -> str:
        return os.path.join(self.workdir, f"n{index}.{kind}")

    def start(self, index: int) -> None:
        self.pids[index] = self.processes.spawn(self.netns(index), [
            "bird", "-f", "-s", self._path(index, "ctl"), "-c", self._path(index, "conf")], self._path(index, "log"))

    def stop(self, index: int) -> None:
        self.processes.kill(self.pids.pop(index, None))

    def cut(self, index: int) -> None:
        namespaces.run_in(self.switch, ["ip", "link", "set", f"n{index}", "down"], check=True)

    def wait_routes(self, which: str, indexes, cidrs) -> float:
        """When the last of `cidrs` was added (or deleted) in every node of `indexes` (epoch s)."""
        latest = 0.0
        for index in indexes:
            monitor = self.monitors[index]
            table = monitor.added if which == "added" else monitor.deleted
            wanted = [str(c) for c in cidrs if c != pod_cidr(index)]  # a node never learns its own
            monitor.wait(table, wanted, timeout=TIMEOUT)
            with monitor.lock:
                latest = max([latest, *(table[c] for c in wanted)])
        return latest

    def down(self) -> None:
        for index in list(self.pids):
            self.stop(index)
        for monitor in self.monitors.values():
            monitor.stop()
        for index in self.indexes:
            namespaces.remove(self.netns(index))
        for ns in (self.switch, self.router, self.internet):
            namespaces.remove(ns)
        if self.workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)


def measure(topology: str, members: int, samples: int, *, bfd: bool) -> dict:
    fleet = Fleet(members=members, samples=samples, topology=topology, bfd=bfd)
    try:
        fleet.build()
        started = time.time()
        for index in range(1, members + 1):
            fleet.start(index)
        settled = fleet.wait_routes("added", range(1, members + 1), [pod_cidr(i) for i in range(1, members + 1)]
                                    ) if members > 1 else started
        row: dict = {"topology": topology, "nodes": members, "bfd": bfd, "initial_s": max(0.0, settled - started),
               "join_ms": [], "leave_ms": [], "failure_ms": []}
        for index in range(members + 1, members + samples + 1):
            others = range(1, members + 1)
            posted = time.time()
            fleet.start(index)
            row["join_ms"].append((fleet.wait_routes("added", others, [pod_cidr(index)]) - posted) * 1000)
            posted = time.time()
            if bfd:
                fleet.cut(index)
                row["failure_ms"].append((fleet.wait_routes("deleted", others, [pod_cidr(index)]) - posted) * 1000)
                fleet.stop(index)
            else:
                fleet.stop(index)
                row["leave_ms"].append((fleet.wait_routes("deleted", others, [pod_cidr(index)]) - posted) * 1000)
        row["bird_alive"] = all(process_alive(pid) for pid in fleet.pids.values())
        return row
    finally:
        fleet.down()


def spread(values: list) -> str:
    if not values:
        return "        -        "
    return f"{statistics.median(values):7.0f} / {max(values):7.0f}"


def throughput(seconds: float) -> tuple[float | None, float, str]:
    """(bgp across segments, host-gw within one, why bgp did not run) in Gbit/s."""
    from lab.cluster import MODES, LabCluster
    with LabCluster.create(nodes=2, mode="host-gw", pods_per_node=1, prefix="na-bench") as lab:
        pods = {p.node: p for p in lab.state.pods.values()}
        host_gw = iperf(lab, pods["node-1"].netns, pods["node-2"].netns, pods["node-2"].ip, seconds)
    if "bgp" not in MODES:
        return None, host_gw, "this checkout's agent has no --backend bgp"
    with LabCluster.create(nodes=2, mode="bgp", segments=2, pods_per_node=1, prefix="na-bench") as lab:
        pods = {p.node: p for p in lab.state.pods.values()}
        return iperf(lab, pods["node-1"].netns, pods["node-2"].netns, pods["node-2"].ip, seconds), host_gw, ""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", default="10,50,100", help="fleet sizes (comma-separated)")
    parser.add_argument("--samples", type=int, default=5, help="joins/leaves measured per fleet")
    parser.add_argument("--topologies", default="mesh,reflectors")
    parser.add_argument("--bfd-nodes", type=int, default=10, help="fleet size of the BFD failure figure (0: none)")
    parser.add_argument("--vxlan-samples", type=int, default=10, help="0: leave the VXLAN figures out")
    parser.add_argument("--iperf-seconds", type=float, default=3, help="0: leave throughput out")
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("needs root (it builds network namespaces)", file=sys.stderr)
        return 1
    counts = sorted(int(c) for c in args.nodes.split(","))
    rows = []
    print(f"== BIRD-only fleets (product-rendered configs; hold {Timers().hold} s, connect retry "
          f"{Timers().connect_retry} s, BFD {Bfd().min_tx_ms} ms x {Bfd().multiplier})", flush=True)
    print(f"  {'topology':<11} {'nodes':>5} {'BFD':>4} {'initial s':>9}  {'join ms med/max':>17}  "
          f"{'leave ms med/max':>17}  {'cut ms med/max':>17}", flush=True)
    plan = [(t, n, False) for n in counts for t in args.topologies.split(",")]
    plan += [(t, args.bfd_nodes, True) for t in args.topologies.split(",")] if args.bfd_nodes else []
    for topology, count, bfd in plan:
        row = measure(topology, count, args.samples, bfd=bfd)
        rows.append(row)
        print(f"  {topology:<11} {count:>5} {'on' if bfd else 'off':>4} {row['initial_s']:9.2f}  "
              f"{spread(row['join_ms'])}  {spread(row['leave_ms'])}  {spread(row['failure_ms'])}", flush=True)
    if args.vxlan_samples:
        print("\n== VXLAN backend, same run (a real agent: Node object -> route in its kernel)", flush=True)
        rows += convergence("vxlan", counts, args.vxlan_samples)
    if args.iperf_seconds:
        print("\n== pod-to-pod throughput (iperf3 TCP, one stream)", flush=True)
        bgp, host_gw, why = throughput(args.iperf_seconds)
        print(f"  host-gw within one segment:        {host_gw:6.2f} Gbit/s")
        if bgp is None:
            print(f"  bgp across two segments: not run ({why})")
        else:
            print(f"  bgp across two segments (2 ToRs): {bgp:6.2f} Gbit/s  ({bgp / host_gw:.2f}x host-gw)")
        rows.append({"throughput_gbps": {"host-gw": host_gw, "bgp": bgp}})
    print("\n== summary (json)")
    print(json.dumps(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())

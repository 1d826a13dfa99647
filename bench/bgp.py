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
2. The agent: a one-node bgp lab (the real agent, `--backend bgp`, BIRD as its child) with N
   BIRD-only simulated nodes on its segment (mesh: it peers with each; reflectors: two of them,
   labelled, reflect the rest) and their Node objects: the batch, then per sample a node whose
   BIRD is already up: from its Node object created in the API to its pod CIDR in the agent's
   main table (admitted from BIRD's table), and from its deletion to the route gone.
3. The VXLAN backend in the same run (`bench/node_routes.py`'s measurement: a real agent, a
   Node object created in the API -> its route in the agent's kernel, with N peers).
4. Throughput (iperf3, one TCP stream): pod -> pod across two segments over BGP routes (through
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
from lab import bgp_fabric, node_objects, physical  # noqa: E402
from lab.processes import Processes, process_alive  # noqa: E402
from netagent.kernel import namespaces  # noqa: E402
from netagent.kube.resources import CONFIG_MAPS  # noqa: E402
from netagent.noderoutes import node_objects as nodes_api  # noqa: E402
from netagent.noderoutes.bgp.bird_config import render_bird_config  # noqa: E402
from netagent.noderoutes.bgp.model import Bfd, BgpNodeConfig, Timers  # noqa: E402
from netagent.noderoutes.bgp.topology import (  # noqa: E402
    REFLECTOR_LABEL,
    BgpNode,
    TopologySettings,
    compose_node_config,
)

ASN = 64512
REFLECTORS = 2
TIMEOUT = 180.0


def pod_cidr(index: int) -> IPv4Network:
    return IPv4Network(f"10.244.{index}.0/24")


def pin_neighbours(netns_list: list) -> None:
    """Every namespace's neighbours on the segment (each one's eth0) as permanent entries. The
    kernel's ARP table is one for all namespaces, capped (gc_thresh3, 1024 by default, a
    root-namespace sysctl we leave alone): a 100-node mesh needs 10,000 entries, and resolving them
    dynamically overflows the table (sessions stuck in Connect, other users of the machine
    starved). Permanent entries are exempt from the cap."""
    ends = {}
    for netns in netns_list:
        found = json.loads(namespaces.run_in(netns, ["ip", "-j", "addr", "show", "eth0"], check=True).stdout)[0]
        ends[netns] = (next(a["local"] for a in found["addr_info"] if a["family"] == "inet"), found["address"])
    for netns in netns_list:
        batch = "".join(f"neigh replace {address} lladdr {mac} dev eth0 nud permanent\n"
                        for other, (address, mac) in ends.items() if other != netns)
        namespaces.run_in(netns, ["ip", "-batch", "-"], input=batch, check=True)


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
        pin_neighbours([self.netns(index) for index in self.indexes])

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


class AgentBench:
    """A one-node bgp lab (the real agent) with BIRD-only peers on its segment: N simulated nodes
    whose BIRDs run the product's composed configs and whose Node objects the agent reads."""

    def __init__(self, topology: str) -> None:
        from lab.cluster import LabCluster
        self.topology = topology
        self.lab = LabCluster.create(nodes=1, mode="bgp", segments=1, prefix="na-bench", resync_period=3600)
        self.api = self.lab.api()
        self.node = self.lab.state.nodes["node-1"]
        self.template = self.api.get("v1", "Node", "node-1")["metadata"]["annotations"]
        self.recovered()    # BIRD's graceful-restart recovery over before its ToR peer is dropped
        namespace, name = bgp_fabric.TOPOLOGY_CONFIGMAP   # mesh on, no ToR: node-to-node (or reflectors)
        self.api.request("DELETE", CONFIG_MAPS.object_path(name, namespace))
        self.api.request("POST", CONFIG_MAPS.list_path(namespace), body={
            "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"namespace": namespace, "name": name},
            "data": {"asNumber": str(ASN), "nodeToNodeMesh": "true"}})
        self.monitor = RouteMonitor(self.node.netns)
        self.pids: dict[int, int] = {}
        self.workdir = os.path.join(self.lab.workdir, "sims")
        os.makedirs(self.workdir)

    def recovered(self) -> None:
        socket = os.path.join(bgp_fabric.node_bird_dir(self.lab.node_dir("node-1")), "bird.ctl")
        deadline = time.monotonic() + TIMEOUT
        while "recovery in progress" in namespaces.run_in(self.node.netns, ["birdc", "-s", socket, "show",
                                                                            "status"]).stdout:
            if time.monotonic() > deadline:
                raise TimeoutError("the agent's BIRD did not finish its graceful-restart recovery")
            time.sleep(0.2)

    def address(self, index: int) -> IPv4Address:
        return physical.node_address(1, 100 + index)

    def cidr(self, index: int) -> IPv4Network:
        return IPv4Network(f"10.244.{100 + index // 16}.{(index % 16) * 16}/28")

    def reflector(self, index: int) -> bool:
        return self.topology == "reflectors" and index <= REFLECTORS

    def plug(self, indexes: list, every: list) -> None:
        """Namespaces, pinned neighbours and BIRDs (configs knowing `every` simulated node)."""
        nodes = [BgpNode(name="node-1", address=IPv4Address(self.node.address), cidrs=(IPv4Network(self.node.pod_cidr),))]
        nodes += [BgpNode(name=f"sim-{i}", address=self.address(i), cidrs=(self.cidr(i),), reflector=self.reflector(i))
                  for i in every]
        topology = TopologySettings(asn=ASN, mesh=True)
        for index in indexes:
            netns = f"{self.lab.state.prefix}-s{index}"
            physical.plug_node(switch=self.lab.state.switch, node=netns, segment=1, index=100 + index,
                               port=f"s{index}")
            local = next(n for n in nodes if n.name == f"sim-{index}")
            path = os.path.join(self.workdir, f"s{index}")
            with open(path + ".conf", "w") as f:
                f.write(render_bird_config(compose_node_config(local, nodes, topology,
                                                               local_network=physical.segment_network(1))))
            self.pids[index] = self.lab.processes.spawn(netns, ["bird", "-f", "-s", path + ".ctl", "-c", path + ".conf"],
                                                        path + ".log")
        pin_neighbours([self.node.netns] + [f"{self.lab.state.prefix}-s{i}" for i in every])

    def node_object(self, index: int) -> dict:
        obj = node_objects.render_node(f"sim-{index}", segment=1, pod_cidr=str(self.cidr(index)),
                                       address=str(self.address(index)))
        obj["metadata"]["annotations"] = {**self.template, nodes_api.PUBLIC_IP: str(self.address(index))}
        if self.reflector(index):
            obj["metadata"]["labels"][REFLECTOR_LABEL] = "true"  # the operator's label (NodeRestriction)
        return obj

    def close(self) -> None:
        self.monitor.stop()
        for pid in self.pids.values():
            self.lab.processes.kill(pid)
        for index in self.pids:
            namespaces.remove(f"{self.lab.state.prefix}-s{index}")
        self.lab.down()


def agent_side(topology: str, counts: list, samples: int) -> list:
    """Per N: the agent's batch time, then `samples` Nodes: Node object -> route in its main
    table (the new node's BIRD already up), Node deleted -> route gone."""
    rows = []
    bench = AgentBench(topology)
    try:
        have = 0
        for count in counts:
            batch = list(range(have + 1, count + 1))
            started = time.time()
            bench.plug(batch, list(range(1, count + 1)))
            for reflector in (i for i in range(1, REFLECTORS + 1) if bench.reflector(i) and have):
                reconfigure(bench, reflector, list(range(1, count + 1)))
            for index in batch:
                bench.api.create(bench.node_object(index))
            bench.monitor.wait(bench.monitor.added, [str(bench.cidr(i)) for i in batch], timeout=TIMEOUT)
            batch_s = max(bench.monitor.added[str(bench.cidr(i))] for i in batch) - started
            have = count
            add_ms, del_ms = [], []
            for k in range(samples):
                index = 1000 + count + k
                bench.plug([index], list(range(1, count + 1)) + [index])
                for reflector in (i for i in range(1, REFLECTORS + 1) if bench.reflector(i)):
                    reconfigure(bench, reflector, list(range(1, count + 1)) + [index])
                time.sleep(1)   # its BIRD up and (reflectors) its route at the reflectors first
                posted = time.time()
                bench.api.create(bench.node_object(index))
                bench.monitor.wait(bench.monitor.added, [str(bench.cidr(index))], timeout=TIMEOUT)
                add_ms.append((bench.monitor.added[str(bench.cidr(index))] - posted) * 1000)
                posted = time.time()
                bench.api.delete("v1", "Node", f"sim-{index}")
                bench.monitor.wait(bench.monitor.deleted, [str(bench.cidr(index))], timeout=TIMEOUT)
                del_ms.append((bench.monitor.deleted[str(bench.cidr(index))] - posted) * 1000)
            rows.append({"backend": f"bgp agent ({topology})", "peers": count, "batch_s": batch_s,
                         "add_ms": add_ms, "del_ms": del_ms})
            print(f"  {topology:<11} {count:>5} peers: batch {batch_s:6.2f} s; one Node -> route {spread(add_ms)} ms; "
                  f"delete -> gone {spread(del_ms)} ms", flush=True)
    finally:
        bench.close()
    return rows


def reconfigure(bench: AgentBench, index: int, every: list) -> None:
    """A reflector told of a new client (what its agent does when the Node appears)."""
    nodes = [BgpNode(name="node-1", address=IPv4Address(bench.node.address), cidrs=(IPv4Network(bench.node.pod_cidr),))]
    nodes += [BgpNode(name=f"sim-{i}", address=bench.address(i), cidrs=(bench.cidr(i),), reflector=bench.reflector(i))
              for i in every]
    local = next(n for n in nodes if n.name == f"sim-{index}")
    path = os.path.join(bench.workdir, f"s{index}")
    with open(path + ".conf", "w") as f:
        f.write(render_bird_config(compose_node_config(local, nodes, TopologySettings(asn=ASN, mesh=True),
                                                       local_network=physical.segment_network(1))))
    namespaces.run_in(f"{bench.lab.state.prefix}-s{index}", ["birdc", "-s", path + ".ctl", "configure"], check=True)


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
    parser.add_argument("--agent-samples", type=int, default=5, help="0: leave the real agent's figures out")
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
    if args.agent_samples:
        print("\n== the agent (--backend bgp), BIRD-only peers: Node object -> route in its main table", flush=True)
        for topology in args.topologies.split(","):
            rows += agent_side(topology, counts, args.agent_samples)
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

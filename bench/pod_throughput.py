"""Benchmark: pod-to-pod throughput per routing mode and IP family (issue 22's 0.95x goal), beside
the real flannel (its vxlan and host-gw backends, IPv4) in the same run.

    sudo .venv/bin/python bench/pod_throughput.py [--modes host-gw,vxlan,auto] [--family ipv4,ipv6]
                                                  [--iperf-seconds 5] [--rounds 3]
                                                  [--flannel vxlan,host-gw|none] [--json FILE]

For each mode and family: two node namespaces on one L2 segment (a bridge in an underlay
namespace), one pod namespace behind a veth on each, and the node routing code itself
(`RouteManager` over `NetlinkKernel`, one per node and family, as the agent builds them: the
VXLAN devices with tx checksum offload on, as the agent chooses on this kernel, pods at the MTU
the agent would report for a node of that family). Then iperf3 (TCP, one stream) from one pod
to the other. Rounds alternate the families so a noisy neighbour on the shared machine hits
both alike; the median per cell is printed with the IPv6/IPv4 ratio per mode. flanneld (built
from the module proxy, bench/go_peers.py; run by bench/flannel_peer.py against the lab's API
server) routes the same two-node shape in each round beside ours; its rows carry the ratio of
netagent's same mode to flannel's.
`bench/node_routes.py --family ipv4,ipv6` runs the same table after its own.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from contextlib import contextmanager
from importlib.metadata import version
from ipaddress import ip_network

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(1, os.path.dirname(os.path.abspath(__file__)))  # bench/'s own modules, when imported as bench.<name>

from netagent.kernel import namespaces  # noqa: E402
from netagent.kernel.families import IpFamily  # noqa: E402
from netagent.noderoutes.routing.kernel import NetlinkKernel  # noqa: E402
from netagent.noderoutes.routing.model import (  # noqa: E402
    ChecksumOffload,
    LocalNode,
    Mode,
    Peer,
    PeerBounds,
    RoutingSettings,
    pod_mtu,
)
from netagent.noderoutes.routing.routes import RouteManager  # noqa: E402
import flannel_peer  # noqa: E402  (bench/, beside this file)
import go_peers  # noqa: E402

SEGMENT = {IpFamily.V4: ip_network("192.0.2.0/24"), IpFamily.V6: ip_network("2001:db8:a::/64")}
CLUSTER = {IpFamily.V4: ip_network("10.244.0.0/16"), IpFamily.V6: ip_network("fd00:10:244::/56")}
FAMILY_NAMES = {"ipv4": IpFamily.V4, "ipv6": IpFamily.V6}


def pod_cidr(family: IpFamily, index: int):
    return ip_network(f"10.244.{index}.0/24" if family is IpFamily.V4 else f"fd00:10:244:{index}::/64")


def run(netns: str, *argv: str) -> None:
    namespaces.run_in(netns, list(argv), check=True)


@contextmanager
def two_nodes(mode: Mode, family: IpFamily):
    """(client pod netns, server pod address) with routes programmed by RouteManager."""
    made: list[str] = []
    kernels: list[NetlinkKernel] = []

    def netns(role: str) -> str:
        name = namespaces.unique_name(f"na-bt{role}")
        namespaces.create(name)
        made.append(name)
        return name

    nodad = ["nodad"] if family is IpFamily.V6 else []
    plen = SEGMENT[family].prefixlen
    mtu = pod_mtu(mode, Mode.VXLAN, 1500, underlay_families=(family,))
    settings = RoutingSettings(mode=mode, vxlan_checksum_offload=ChecksumOffload.ON)
    try:
        underlay = netns("ul")
        run(underlay, "ip", "link", "add", "br0", "type", "bridge")
        run(underlay, "ip", "link", "set", "br0", "up")
        nodes = []
        for index in (1, 2):
            node, pod = netns(f"n{index}"), netns(f"p{index}")
            for ns in (node, pod):
                run(ns, "sysctl", "-qw", "net.ipv6.conf.all.accept_dad=0")
                run(ns, "sysctl", "-qw", "net.ipv6.conf.default.accept_dad=0")
            run(node, "sysctl", "-qw", "net.ipv4.ip_forward=1")
            run(node, "sysctl", "-qw", "net.ipv6.conf.all.forwarding=1")
            run(underlay, "ip", "link", "add", f"u{index}", "type", "veth", "peer", "name", "eth0", "netns", node)
            run(underlay, "ip", "link", "set", f"u{index}", "master", "br0", "up")
            address = SEGMENT[family].network_address + index
            run(node, "ip", "addr", "add", f"{address}/{plen}", "dev", "eth0", *nodad)
            run(node, "ip", "link", "set", "eth0", "up")
            cidr = pod_cidr(family, index)
            run(node, "ip", "link", "add", "pod0", "mtu", str(mtu), "type", "veth", "peer", "name", "eth0",
                "mtu", str(mtu), "netns", pod)
            run(node, "ip", "addr", "add", f"{cidr.network_address + 1}/{cidr.prefixlen}", "dev", "pod0", *nodad)
            run(node, "ip", "link", "set", "pod0", "up")
            run(pod, "ip", "addr", "add", f"{cidr.network_address + 2}/{cidr.prefixlen}", "dev", "eth0", *nodad)
            run(pod, "ip", "link", "set", "eth0", "up")
            run(pod, "ip", "route", "add", "default", "via", str(cidr.network_address + 1))
            kernel = NetlinkKernel.in_namespace(node)
            kernels.append(kernel)
            local = LocalNode(name=f"node-{index}", public_ip=address, underlay_ifname="eth0",
                              underlay_network=SEGMENT[family], underlay_mtu=1500, pod_cidrs=(cidr,))
            manager = RouteManager(kernel=kernel, settings=settings, local=local,
                                   bounds=PeerBounds(cluster_cidrs=(CLUSTER[family],)))
            data = manager.ensure_local()
            peer = Peer(name=local.name, public_ip=address, pod_cidrs=(cidr,), vtep_mac=data.get("vtepMAC"))
            if family is IpFamily.V6:  # as read_peer reads an IPv6-only node's announcement
                peer = Peer(name=local.name, public_ip=address, public_ipv6=address, pod_cidrs=(cidr,),
                            vtep_mac6=data.get("vtepMAC6"))
            nodes.append((manager, peer, pod))
        for manager, me, _ in nodes:
            report = manager.sync_all([peer for _, peer, _ in nodes if peer is not me])
            assert report.added and not report.refused and not report.pending, report
        yield nodes[0][2], nodes[1][2], str(pod_cidr(family, 2).network_address + 2)
    finally:
        for kernel in kernels:
            kernel.close()
        for name in reversed(made):
            namespaces.remove(name)


def iperf(client_ns: str, server_ns: str, address: str, seconds: float) -> float:
    server = subprocess.Popen([*namespaces.exec_prefix(server_ns), "iperf3", "-s", "-1"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(100):  # the server listening (a refused connect is retried)
            out = subprocess.run([*namespaces.exec_prefix(client_ns), "iperf3", "-c", address, "-t", str(seconds),
                                  "-J"], capture_output=True, text=True, timeout=seconds + 60)
            report = json.loads(out.stdout or "{}")
            error = report.get("error", "" if out.returncode == 0 else out.stderr)
            if not error:
                return report["end"]["sum_received"]["bits_per_second"] / 1e9
            if "refused" not in error:
                raise RuntimeError(f"iperf3 to {address}: {error}")
            time.sleep(0.1)
        raise RuntimeError(f"iperf3 to {address} never connected: {out.stdout[-300:]}")
    finally:
        server.kill()
        server.wait()


def measure(modes: list[Mode], families: list[IpFamily], *, seconds: float, rounds: int,
            flannel: tuple[str, list[str]] | None = None) -> tuple[dict, dict]:
    """(netagent's medians by (mode, family), flannel's by backend)."""
    results: dict = {(mode, family): [] for mode in modes for family in families}
    theirs: dict[str, list[float]] = {backend: [] for backend in (flannel[1] if flannel else [])}
    for round_index in range(rounds):
        order = families if round_index % 2 == 0 else list(reversed(families))
        for mode in modes:
            for family in order:
                with two_nodes(mode, family) as (client, server, address):
                    results[(mode, family)].append(iperf(client, server, address, seconds))
        for backend in theirs:
            assert flannel is not None
            with flannel_peer.flannel_nodes(backend, flannel[0]) as nodes:
                theirs[backend].append(iperf(nodes.client_pod, nodes.server_pod, nodes.server_address, seconds))
    return ({key: statistics.median(values) for key, values in results.items()},
            {backend: statistics.median(values) for backend, values in theirs.items()})


def print_table(medians: dict, modes: list[Mode], families: list[IpFamily]) -> None:
    print("  mode      " + "".join(f"{family.label:>14}" for family in families) + "   IPv6/IPv4")
    for mode in modes:
        cells = "".join(f"{medians[(mode, family)]:>9.2f} Gb/s" for family in families)
        ratio = ""
        if IpFamily.V4 in families and IpFamily.V6 in families:
            ratio = f"   {medians[(mode, IpFamily.V6)] / medians[(mode, IpFamily.V4)]:.2f}x"
        print(f"  {mode.value:<8}{cells}{ratio}")


def print_flannel(medians: dict, theirs: dict, version: str) -> None:
    for backend, gbps in theirs.items():
        ours = medians.get((Mode(backend), IpFamily.V4))
        ratio = f"   netagent {backend} / flannel: {ours / gbps:.2f}x" if ours else ""
        print(f"  flannel {backend:<8} ({version}){gbps:>9.2f} Gb/s (IPv4){ratio}")


def records(medians: dict, theirs: dict, flannel_version: str) -> list[dict]:
    netagent = "netagent " + version("netagent")
    found = [{"mode": mode.value, "family": family.label, "gbps": round(gbps, 3), "version": netagent}
             for (mode, family), gbps in medians.items()]
    return found + [{"mode": f"flannel-{backend}", "family": IpFamily.V4.label, "gbps": round(gbps, 3),
                     "version": f"flannel {flannel_version}"} for backend, gbps in theirs.items()]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--modes", default="host-gw,vxlan,auto")
    parser.add_argument("--family", default="ipv4,ipv6", help="ipv4, ipv6 or both (comma-separated)")
    parser.add_argument("--iperf-seconds", type=float, default=5)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--flannel", default="vxlan,host-gw",
                        help="flannel backends run beside ours (IPv4), or none")
    parser.add_argument("--json", metavar="FILE", help="also write one record per mode and family to FILE")
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("needs root (it builds network namespaces)", file=sys.stderr)
        return 1
    modes = [Mode(m) for m in args.modes.split(",")]
    families = [FAMILY_NAMES[f] for f in args.family.split(",")]
    flannel, flannel_version = None, ""
    backends = [] if args.flannel == "none" else args.flannel.split(",")
    if any(backend not in flannel_peer.BACKENDS for backend in backends):
        parser.error(f"--flannel takes {', '.join(flannel_peer.BACKENDS)} or none")
    if backends:
        try:
            directory, flannel_version = go_peers.build(go_peers.FLANNEL)
            flannel = (os.path.join(directory, "flanneld"), backends)
        except go_peers.BuildError as error:
            print(f"flannel is left out: {error}", file=sys.stderr)
    print(f"== pod-to-pod throughput per family (iperf3 TCP, one stream, median of {args.rounds})")
    medians, theirs = measure(modes, families, seconds=args.iperf_seconds, rounds=args.rounds, flannel=flannel)
    print_table(medians, modes, families)
    print_flannel(medians, theirs, flannel_version)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(records(medians, theirs, flannel_version), f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

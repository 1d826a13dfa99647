"""Benchmark: what pod anti-spoofing (netagent/policy/antispoof.py) costs pod-to-pod on one node.

    sudo .venv/bin/python bench/anti_spoofing.py [--modes bridge,routed] [--flavours iptables,nftables]
                                                 [--connects 2000] [--iperf-seconds 3] [--rounds 3]
                                                 [--extra-pods 108]

For each attachment and flavour: a lab node (our CNI plugin wiring two pods, `lab.LabNode`),
then rounds alternating rules off and rules on so a noisy neighbour hits both alike: TCP
connect latency (the client pod opens and closes `--connects` connections to the server pod,
one at a time; median and 99th percentile) and iperf3 throughput (TCP, one stream, client pod
to server pod). Bridge mode's rules hold the two pods plus `--extra-pods` made-up ports (110
pods: the kubelet's default maximum), since the iptables flavour walks one rule per pod. The
median per cell is printed with on/off ratios.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import time
from functools import partial

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from cni.wiring import host_veth_name  # noqa: E402
from lab import LabNode  # noqa: E402
from netagent.kernel import namespaces  # noqa: E402
from netagent.kernel.families import IpFamily  # noqa: E402
from netagent.kernel.iptables.backend import IptablesBackend  # noqa: E402
from netagent.kernel.iptables.runner import IptablesRunner  # noqa: E402
from netagent.kernel.nftables.runner import NftRunner  # noqa: E402
from netagent.kernel.pod_attachment import PodAttachment  # noqa: E402
from netagent.policy.antispoof import AntiSpoofing, PodPort, ports_from_ipam  # noqa: E402

CONNECT = r"""
import socket, statistics, sys, time
target, count = sys.argv[1], int(sys.argv[2])
times = []
for _ in range(count):
    start = time.perf_counter()
    s = socket.create_connection((target, 6201), timeout=5)
    times.append(time.perf_counter() - start)
    s.close()
times.sort()
print(statistics.median(times) * 1e6, times[int(len(times) * 0.99)] * 1e6)
"""
SERVER = r"""
import socket
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", 6201)); s.listen(512); print("ready", flush=True)
while True:
    c, _ = s.accept(); c.close()
"""


def guard_for(node: LabNode, mode: PodAttachment, flavour: str, extra: int, nft: NftRunner | None) -> AntiSpoofing:
    network = os.listdir(node.data_dir)[0]
    real = partial(ports_from_ipam, os.path.join(node.data_dir, network), partial(host_veth_name, network))
    padding = [PodPort("na" + hashlib.sha256(str(index).encode()).hexdigest()[:12], (f"10.244.9.{index % 250 + 1}",))
               for index in range(extra)]          # names spread over the digits as the plugin's hashes are
    ports = lambda: [*padding, *real()]   # noqa: E731  (the real pods last: the worst place in a rule list)
    if flavour == "nftables":
        return AntiSpoofing(mode=mode, ports=ports, nft=nft)
    return AntiSpoofing(mode=mode, ports=ports, iptables=[IptablesRunner(
        backend=IptablesBackend.LEGACY, family=IpFamily.V4, exec_prefix=namespaces.exec_prefix(node.node),
        lock_wait_seconds=60)])


def measure(node: LabNode, client: str, server_ip: str, connects: int, seconds: int) -> tuple[float, float, float]:
    latency = namespaces.run_in(client, [sys.executable, "-c", CONNECT, server_ip, str(connects)], check=True)
    median, p99 = map(float, latency.stdout.split())
    iperf = namespaces.run_in(client, ["iperf3", "-c", server_ip, "-t", str(seconds), "-J"], check=True)
    gbits = json.loads(iperf.stdout)["end"]["sum_received"]["bits_per_second"] / 1e9
    return median, p99, gbits


def bench(mode: PodAttachment, flavour: str, args) -> dict[str, list[tuple[float, float, float]]]:
    results: dict[str, list[tuple[float, float, float]]] = {"off": [], "on": []}
    with LabNode(prefix="na-bas", mode=mode, with_agent=False) as node:
        namespaces.run_in(node.node, ["sysctl", "-qw", "net.ipv4.ip_forward=1"], check=True)
        client, server = node.add_pod("client"), node.add_pod("server")
        processes: list[subprocess.Popen] = [
            subprocess.Popen([*namespaces.exec_prefix(server.netns_name), "iperf3", "-s"], stdout=subprocess.DEVNULL),
            subprocess.Popen([*namespaces.exec_prefix(server.netns_name), sys.executable, "-c", SERVER],
                             stdout=subprocess.PIPE, text=True)]
        nft = NftRunner(netns=node.node) if flavour == "nftables" else None
        try:
            assert processes[1].stdout is not None and processes[1].stdout.readline().strip() == "ready"
            time.sleep(0.5)
            guard = guard_for(node, mode, flavour, args.extra_pods if mode is PodAttachment.BRIDGE else 0, nft)
            for _ in range(args.rounds):
                for state in ("off", "on"):
                    guard.remove()
                    if state == "on":
                        guard.sync()
                    results[state].append(measure(node, client.netns_name, server.ip, args.connects,
                                                  args.iperf_seconds))
            guard.remove()
        finally:
            for process in processes:
                process.kill()
                process.wait()
            if nft is not None:
                nft.close()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--modes", default="bridge,routed")
    parser.add_argument("--flavours", default="iptables,nftables")
    parser.add_argument("--connects", type=int, default=2000)
    parser.add_argument("--iperf-seconds", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--extra-pods", type=int, default=108)
    args = parser.parse_args()
    print(f"{'mode':8} {'flavour':9} {'rules':5} {'connect median us':>18} {'connect p99 us':>15} {'Gbit/s':>8}")
    for mode in map(PodAttachment, args.modes.split(",")):
        for flavour in args.flavours.split(","):
            results = bench(mode, flavour, args)
            cells = {}
            for state in ("off", "on"):
                cells[state] = [statistics.median(r[i] for r in results[state]) for i in range(3)]
                print(f"{mode.value:8} {flavour:9} {state:5} {cells[state][0]:18.1f} {cells[state][1]:15.1f} "
                      f"{cells[state][2]:8.2f}")
            ratio = [on / off for on, off in zip(cells["on"], cells["off"])]
            print(f"{'':8} {'':9} {'on/off':5} {ratio[0]:18.3f} {ratio[1]:15.3f} {ratio[2]:8.3f}")


if __name__ == "__main__":
    main()

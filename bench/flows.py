#!/usr/bin/env python3
"""The forwarding-path cost of flow records: policy log rules present and the nflog listener
recording, against the same policy with the log rules deleted from the kernel.

A node namespace (a `LabNode`, routed mode) holds three real pods wired by our CNI plugin:
`server` (isolated for ingress by one policy that allows `client`), `client`, and `intruder`
(denied). The policy engine runs in this process on the node's kernel through the dataplane
`--backend` names (iptables legacy + ipset, or the nft table). Each round measures both
states in an order that rotates from round to round (so an order effect shows in none):
- off: the pod chain's log rule deleted from the kernel (what a policy without flows is);
- on: the rules as rendered (a rate-limited `-j NFLOG` / `log group` before the drop) and
  `PolicyFlows` bound to the group, recording into a ring;
- on + conntrack: also `ConntrackFlows` (`--flow-conntrack on`): an event per new connection.

Figures: TCP connect latency of an allowed connection (median and p99 of `--connects`
sequential connects, client -> server), the CPU this process (the listeners' threads: the
agent's share) spent per 1000 of those connects, TCP throughput of an allowed stream (`--megabytes`
over one connection, MB/s), and the denied path: `--seconds` of UDP datagrams from the
intruder at the server as fast as one sender goes, the node's drop counter per second (what
the node dropped) and the flows recorded (the connects' flows too with conntrack). Medians of
`--rounds`, and ratios to off.

    sudo .venv/bin/python bench/flows.py [--backend {iptables,nftables}] [--connects 2000] [--rounds 3]
"""
from __future__ import annotations

import argparse
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from lab import LabNode  # noqa: E402
from netagent.infra.flows import FlowRing  # noqa: E402
from netagent.infra.sync_runner import SyncKind  # noqa: E402
from netagent.kernel import namespaces, nflog, owned  # noqa: E402
from netagent.kernel.ctevents import ConntrackEvents  # noqa: E402
from netagent.kernel.pod_attachment import PodAttachment  # noqa: E402
from netagent.policy.engine import PolicyEngine, PolicySettings  # noqa: E402
from netagent.policy.conntrack_flows import ConntrackFlows  # noqa: E402
from netagent.policy.flows import FlowNames, PolicyFlows  # noqa: E402
from network_policy import CLIENT as CONNECTS  # noqa: E402  (bench/: the same timed connects)
from netagent.policy.shared import RenderSettings, pod_chain  # noqa: E402

NODE = "node-1"
SUBNET = "10.244.0.0/24"
BACKENDS = ("iptables", "nftables")
SERVER = r"""
import socket, threading
def accept_close():
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("0.0.0.0", 80)); s.listen(1024)
    while True:
        c, _ = s.accept(); c.close()
def sink():
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("0.0.0.0", 81)); s.listen(16)
    while True:
        c, _ = s.accept()
        while c.recv(1 << 20):
            pass
        c.close()
threading.Thread(target=accept_close, daemon=True).start()
threading.Thread(target=sink, daemon=True).start()
print("ready", flush=True)
threading.Event().wait()
"""
STREAM = r"""
import socket, sys, time
address, megabytes = sys.argv[1], int(sys.argv[2])
block = b"x" * (1 << 20)
s = socket.create_connection((address, 81))
started = time.perf_counter()
for _ in range(megabytes):
    s.sendall(block)
s.shutdown(socket.SHUT_WR); s.recv(1)
print(megabytes / (time.perf_counter() - started))
"""
FLOOD = r"""
import socket, sys, time
address, seconds = sys.argv[1], float(sys.argv[2])
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
sent, end, port = 0, time.monotonic() + seconds, 0
while time.monotonic() < end:
    for _ in range(256):
        port = port % 50000 + 1
        s.sendto(b"x", (address, 1024 + port))     # a new flow each time: every datagram meets the pod chain
    sent += 256
print(sent)
"""


def pod(name: str, ip: str, labels: dict) -> dict:
    return {"metadata": {"namespace": "bench", "name": name, "labels": labels},
            "spec": {"nodeName": NODE, "containers": [{"name": "main"}]},
            "status": {"phase": "Running", "podIP": ip}}


POLICY = {"metadata": {"namespace": "bench", "name": "server-from-client"}, "spec": {
    "podSelector": {"matchLabels": {"app": "server"}}, "policyTypes": ["Ingress"],
    "ingress": [{"from": [{"podSelector": {"matchLabels": {"app": "client"}}}]}]}}


def make_programmer(backend: str, netns: str):
    from netagent.kernel.families import IpFamily
    from netagent.policy.families import FamilyDataplanes
    if backend == "nftables":
        from netagent.kernel.nftables.runner import NftRunner
        from netagent.policy.nftables.dataplane import NftablesDataplane
        return FamilyDataplanes({IpFamily.V4: NftablesDataplane(NftRunner(netns=netns))})
    from netagent.kernel.ipset.runner import IpsetRunner
    from netagent.kernel.iptables.backend import IptablesBackend
    from netagent.kernel.iptables.runner import IptablesRunner
    from netagent.policy.iptables.dataplane import IptablesDataplane
    prefix = namespaces.exec_prefix(netns)
    return FamilyDataplanes({IpFamily.V4: IptablesDataplane(
        iptables=IptablesRunner(backend=IptablesBackend.LEGACY, exec_prefix=prefix), ipset=IpsetRunner(exec_prefix=prefix))})


def delete_log_rule(backend: str, netns: str, chain: str) -> None:
    """The flows-off state: the pod chain without its log rule."""
    if backend == "nftables":
        listed = namespaces.run_in(netns, ["nft", "-a", "list", "chain", "ip", owned.NFT_POLICY_TABLE, chain],
                                   check=True).stdout
        handle = re.search(r"log prefix .* # handle (\d+)", listed)
        assert handle, listed
        namespaces.run_in(netns, ["nft", "delete", "rule", "ip", owned.NFT_POLICY_TABLE, chain, "handle",
                                  handle.group(1)], check=True)
        return
    listed = namespaces.run_in(netns, ["iptables-legacy", "-S", chain], check=True).stdout
    (rule,) = [line for line in listed.splitlines() if "NFLOG" in line]
    namespaces.run_in(netns, ["sh", "-c", "iptables-legacy " + rule.replace("-A ", "-D ", 1)], check=True)


def dropped_packets(backend: str, netns: str, chain: str) -> int:
    """The pod chain's drop counter."""
    if backend == "nftables":
        listed = namespaces.run_in(netns, ["nft", "list", "chain", "ip", owned.NFT_POLICY_TABLE, chain],
                                   check=True).stdout
        found = re.search(r"counter packets (\d+) bytes \d+ drop", listed)
    else:
        listed = namespaces.run_in(netns, ["iptables-legacy", "-L", chain, "-v", "-n", "-x"], check=True).stdout
        found = re.search(r"^\s*(\d+)\s+\d+\s+DROP", listed, re.M)
    assert found, listed
    return int(found.group(1))


def run(node: LabNode, pod_name: str, script: str, *args: str) -> str:
    done = node.exec_in(pod_name, [sys.executable, "-c", script, *args], timeout=900)
    if done.returncode != 0:
        raise RuntimeError(done.stderr)
    return done.stdout


def measure(node: LabNode, server_ip: str, args, backend: str, chain: str, ring: FlowRing | None) -> dict:
    cpu = resource.getrusage(resource.RUSAGE_SELF)
    times = sorted(json.loads(run(node, "client", CONNECTS, server_ip, str(args.connects))))
    spent = resource.getrusage(resource.RUSAGE_SELF)
    listener_ms = (spent.ru_utime + spent.ru_stime - cpu.ru_utime - cpu.ru_stime) * 1000
    throughput = float(run(node, "client", STREAM, server_ip, str(args.megabytes)))
    before, recorded = dropped_packets(backend, node.node, chain), len(ring.flows()) if ring else 0
    started = time.perf_counter()
    sent = int(run(node, "intruder", FLOOD, server_ip, str(args.seconds)))
    elapsed = time.perf_counter() - started
    dropped = dropped_packets(backend, node.node, chain) - before
    return {"connect_median_us": round(statistics.median(times) * 1e6, 1),
            "connect_p99_us": round(times[int(len(times) * 0.99) - 1] * 1e6, 1),
            "listener_cpu_ms_per_1000_connects": round(listener_ms * 1000 / args.connects, 2),
            "stream_mb_s": round(throughput, 1),
            "denied_sent_per_s": round(sent / elapsed), "denied_dropped_per_s": round(dropped / elapsed),
            "flows_recorded": (len(ring.flows()) - recorded) if ring else 0}


def median_of(rounds: list[dict]) -> dict:
    return {key: round(statistics.median(r[key] for r in rounds), 1) for key in rounds[0]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--backend", choices=BACKENDS, default="iptables")
    parser.add_argument("--connects", type=int, default=2000)
    parser.add_argument("--megabytes", type=int, default=500)
    parser.add_argument("--seconds", type=float, default=3.0, help="of denied datagrams per round")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    chain = pod_chain(owned.POLICY_INGRESS_PREFIX, "bench/server")
    off: list[dict] = []
    on: list[dict] = []
    with_conntrack: list[dict] = []
    with LabNode(prefix="na-bench-fl", mode=PodAttachment.ROUTED, subnets=(SUBNET,), with_agent=False) as node:
        server, client, intruder = node.add_pod("server"), node.add_pod("client"), node.add_pod("intruder")
        veths = {p.ip: next(i["name"] for i in p.result["interfaces"] if "sandbox" not in i)
                 for p in (server, client, intruder)}
        node.exec_in("node", ["sysctl", "-qw", "net.ipv4.ip_forward=1"], check=True)
        proc = subprocess.Popen([*namespaces.exec_prefix(server.netns_name), sys.executable, "-c", SERVER],
                                stdout=subprocess.PIPE, text=True)
        programmer = make_programmer(args.backend, node.node)
        try:
            assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
            engine = PolicyEngine(PolicySettings(NODE, RenderSettings(PodAttachment.ROUTED, local_cidrs=(SUBNET,))),
                                  dataplane=programmer, interface_of=lambda plan: veths.get(plan.ip))
            for recorder in (engine.policies, engine.pods, engine.namespaces):
                recorder.on_synced()
            engine.namespaces.on_add({"metadata": {"name": "bench", "labels": {}}})
            for name, address in (("server", server.ip), ("client", client.ip), ("intruder", intruder.ip)):
                engine.pods.on_add(pod(name, address, {"app": name}))
            engine.policies.on_add(POLICY)
            def flows_off() -> None:
                engine.sync(SyncKind.FULL)                 # the rules as rendered, then the log rule deleted
                delete_log_rule(args.backend, node.node, chain)
                off.append(measure(node, server.ip, args, args.backend, chain, None))

            def flows_on(conntrack: bool = False) -> None:
                engine.sync(SyncKind.FULL)                 # the log rule back
                ring = FlowRing(size=4096)
                names = FlowNames(lambda: engine.plan)
                listeners = [PolicyFlows(ring, names, open_socket=lambda: nflog.NflogSocket(netns=node.node))]
                if conntrack:
                    listeners.append(ConntrackFlows(ring, names, open_socket=lambda: ConntrackEvents(netns=node.node)))
                for listener in listeners:
                    listener.start()
                try:
                    (with_conntrack if conntrack else on).append(measure(node, server.ip, args, args.backend, chain,
                                                                         ring))
                finally:
                    for listener in listeners:
                        listener.stop()

            states = [flows_off, flows_on, lambda: flows_on(conntrack=True)]
            for index in range(args.rounds):               # the order rotates: what comes later pays no more
                for state in states[index % 3:] + states[:index % 3]:
                    state()
                print(f"round {index}: off {off[-1]}\n         on  {on[-1]}\n         ct  {with_conntrack[-1]}",
                      flush=True)
            programmer.cleanup()
        finally:
            proc.kill()
            proc.wait()
    quiet, flowing, tracked = median_of(off), median_of(on), median_of(with_conntrack)
    results = {"backend": args.backend, "rounds": args.rounds, "off": quiet, "on": flowing, "conntrack": tracked,
               "on_over_off": {key: round(flowing[key] / quiet[key], 3) if quiet[key] else None
                               for key in quiet if key != "flows_recorded"},
               "conntrack_over_off": {key: round(tracked[key] / quiet[key], 3) if quiet[key] else None
                                      for key in quiet if key != "flows_recorded"}}
    print(f"{'':36}{'flows off':>12}{'flows on':>12}{'on/off':>8}{'+conntrack':>12}{'ct/off':>8}")
    for key in quiet:
        ratio, ct_ratio = results["on_over_off"].get(key), results["conntrack_over_off"].get(key)
        print(f"{key:36}{quiet[key]:>12}{flowing[key]:>12}{'' if ratio is None else ratio:>8}"
              f"{tracked[key]:>12}{'' if ct_ratio is None else ct_ratio:>8}")
    for name, rounds in (("off", off), ("on", on), ("on + conntrack", with_conntrack)):
        spread = sorted(r["connect_median_us"] for r in rounds)
        print(f"connect median per round, flows {name}: {spread}")
    results["connect_median_us_rounds"] = {"off": [r["connect_median_us"] for r in off],
                                           "on": [r["connect_median_us"] for r in on],
                                           "conntrack": [r["connect_median_us"] for r in with_conntrack]}
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())

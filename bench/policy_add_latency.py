#!/usr/bin/env python3
"""What programming a pod's NetworkPolicy inside its CNI ADD costs, and what it buys.

A node namespace (a `LabNode`, routed mode, no agent) holds real pods wired by our CNI plugin
and, for scale, `--pods` synthetic local pods in `--namespaces` namespaces and `--policies`
policies (bench/network_policy.py's objects), programmed on the real iptables (legacy) and
ipset tools of the node namespace (`--dataplane nft`: the `ip netagent-policy` table through
libnftables) by a policy engine in this process, as the agent's.

Figures printed (JSON at the end):
- `add_off_ms`: a CNI ADD through the plugin with policy off (exec of the plugin, median);
- `bind_ms`: what policy on adds to that ADD: `PolicyEngine.bind_pod` for a new pod whose Pod
  is cached (what the CNI server runs before replying), median and max of `--adds`, for a pod
  no policy selects and for one a policy isolates; with the engine at `--pods`/`--policies`;
  `bind_paths`: how many took the one-pod path (`incremental`) or a full sync;
  `bind_cpu_ms`: the CPU time of each bind (this process and the tools it ran), beside its wall time;
  `bind_kernel_writes_ms`: the part of each bind spent in the kernel writes (iptables-restore
  and ipset restore execs, or the libnftables batch), the rest being Python;
- `unbind_ms`: the DEL's `unbind_pod` of the isolated pods, each alone;
- `status_report_wrote`: whether the sync that then sees the kubelet's report of the same
  address wrote anything (it must not), and its time;
- `burst`: `--burst` binds at once: total time and how many syncs they needed (coalescing);
- `first_packet`: a real pod, ADDed and bound, connects to a real server at once: whether the
  first SYN was answered (no SYN retransmitted, so the time from ADD return to the first allowed
  packet is 0) and that connect's latency.

    sudo .venv/bin/python bench/policy_add_latency.py [--pods 1000] [--policies 200] [--adds 20]
        [--dataplane nft] [--iptables-backend nft] [--direct]
"""
from __future__ import annotations

import argparse
import contextlib
import ipaddress
import json
import os
import resource
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from network_policy import NODE, SERVER, SUBNET, ms, pod, policy, synthetic_veth  # noqa: E402  (bench/)

from lab import LabNode  # noqa: E402
from netagent.infra.sync_runner import SyncKind  # noqa: E402
from netagent.kernel import namespaces  # noqa: E402
from netagent.kernel.ipset.runner import IpsetRunner  # noqa: E402
from netagent.kernel.iptables.backend import IptablesBackend  # noqa: E402
from netagent.kernel.iptables.runner import IptablesRunner  # noqa: E402
from netagent.kernel.pod_attachment import PodAttachment  # noqa: E402
from netagent.kernel.nftables.runner import NftRunner  # noqa: E402
from netagent.policy.dataplane import PolicyDataplane  # noqa: E402
from netagent.policy.engine import PolicyEngine, PolicySettings  # noqa: E402
from netagent.policy.nftables.dataplane import NftablesDataplane  # noqa: E402
from netagent.policy.iptables.dataplane import IptablesDataplane  # noqa: E402
from netagent.policy.shared import RenderSettings  # noqa: E402

FIRST_CONNECT = r"""
import json, socket, sys, time
s = socket.socket(); s.settimeout(10)
started = time.perf_counter(); s.connect((sys.argv[1], 80)); took = time.perf_counter() - started
retrans = dict(zip(*[l.split() for l in open("/proc/net/netstat") if l.startswith("TcpExt:")]))["TCPSynRetrans"]
print(json.dumps({"connect_us": round(took * 1e6, 1), "syn_retransmits": int(retrans)}))
"""


def scheduled(namespace: str, name: str, labels: dict) -> dict:
    obj = pod(namespace, name, "", labels)
    obj["status"] = {"phase": "Pending"}
    return obj


def summary(seconds: list[float]) -> dict:
    return {"median": ms(statistics.median(seconds)), "max": ms(max(seconds))}


@contextlib.contextmanager
def node_fd(name: str) -> Iterator[int]:
    fd = os.open(namespaces.netns_path(name), os.O_RDONLY | os.O_CLOEXEC)
    try:
        yield fd
    finally:
        os.close(fd)


def cpu_seconds() -> float:
    """CPU time of this process (every thread: libnftables' too) and of its waited-for children
    (the restore tools, and `ip netns exec` before them), user and system."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def timed_writes(programmer: PolicyDataplane) -> list[float]:
    """Wrap the dataplane's kernel writes (iptables-restore, ipset restore, nft batches) to add
    their wall time into the returned one-element list: where a bind's time goes."""
    spent = [0.0]
    writers = [(programmer.nft, "apply")] if isinstance(programmer, NftablesDataplane) else \
        [(programmer.iptables, "restore"), (programmer.ipset, "_apply"), (programmer.ipset, "destroy")] \
        if isinstance(programmer, IptablesDataplane) else []
    for owner, method in writers:
        original = getattr(owner, method)

        def timed(*args, _original=original, **kwargs):
            started = time.perf_counter()
            try:
                return _original(*args, **kwargs)
            finally:
                spent[0] += time.perf_counter() - started
        setattr(owner, method, timed)
    return spent


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pods", type=int, default=1000)
    parser.add_argument("--policies", type=int, default=200)
    parser.add_argument("--namespaces", type=int, default=20)
    parser.add_argument("--adds", type=int, default=20)
    parser.add_argument("--burst", type=int, default=50)
    parser.add_argument("--dataplane", choices=["iptables", "nft"], default="iptables")
    parser.add_argument("--iptables-backend", choices=["legacy", "nft"], default="legacy",
                        help="which iptables the iptables dataplane drives (legacy restores the whole table)")
    parser.add_argument("--direct", action="store_true",
                        help="run the iptables and ipset tools from this process inside the node's namespace, as "
                             "the agent runs them in its own, not each through `ip netns exec`")
    args = parser.parse_args()
    results: dict = {"pods": args.pods, "policies": args.policies, "dataplane": args.dataplane}
    with LabNode(prefix="na-bench-pa", mode=PodAttachment.ROUTED, subnets=(SUBNET,), with_agent=False) as node:
        node.exec_in("node", ["sysctl", "-qw", "net.ipv4.ip_forward=1"], check=True)
        adds = []
        for index in range(5):
            started = time.perf_counter()
            node.add_pod(f"warm-{index}")
            adds.append(time.perf_counter() - started)
        results["add_off_ms"] = summary(adds)
        server = node.add_pod("server")
        veths = {p.ip: next(i["name"] for i in p.result["interfaces"] if "sandbox" not in i)
                 for p in node.pods.values()}
        proc = subprocess.Popen([*namespaces.exec_prefix(server.netns_name), sys.executable, "-c", SERVER],
                                stdout=subprocess.PIPE, text=True)
        inside = contextlib.ExitStack()
        try:
            assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
            prefix = [] if args.direct else namespaces.exec_prefix(node.node)
            if args.direct:              # this thread (and the burst's, made by it) in the node's namespace
                inside.enter_context(namespaces.entered(inside.enter_context(node_fd(node.node))))
            results["tools"] = "direct" if args.direct else "ip netns exec"
            programmer: PolicyDataplane
            if args.dataplane == "nft":
                programmer = NftablesDataplane(NftRunner(node.node))
            else:
                backend = IptablesBackend.LEGACY if args.iptables_backend == "legacy" else IptablesBackend.NFT
                results["iptables_backend"] = args.iptables_backend
                programmer = IptablesDataplane(iptables=IptablesRunner(backend=backend, exec_prefix=prefix),
                                              ipset=IpsetRunner(exec_prefix=prefix))
            writing = timed_writes(programmer)
            spaces = [f"ns-{n}" for n in range(args.namespaces)]
            hosts = [str(address) for address in ipaddress.ip_network(SUBNET).hosts()]
            free = iter(hosts[16 + args.pods:])
            engine = PolicyEngine(PolicySettings(NODE, RenderSettings(PodAttachment.ROUTED, local_cidrs=(SUBNET,))),
                                  dataplane=programmer,
                                  interface_of=lambda plan: veths.get(plan.ip, synthetic_veth(plan.ip)))
            for recorder in (engine.policies, engine.pods, engine.namespaces):
                recorder.on_synced()
            for n, name in enumerate(spaces):
                engine.namespaces.on_add({"metadata": {"name": name, "labels": {"team": f"team-{n % 7}"}}})
            for index, address in enumerate(hosts[16:16 + args.pods]):
                engine.pods.on_add(pod(spaces[index % len(spaces)], f"pod-{index}", address,
                                       {"app": f"app-{index % 50}", "role": f"role-{index % 11}"}))
            engine.pods.on_add(pod("ns-0", "server", server.ip, {"app": "app-0"}))
            for index in range(args.policies):
                engine.policies.on_add(policy(spaces[index % len(spaces)], index))
            started = time.perf_counter()
            engine.sync(SyncKind.FULL)
            results["full_sync_ms"] = ms(time.perf_counter() - started)

            paths = {"incremental": 0, "full": 0}
            write_share: list[float] = []
            cpu: dict[str, list[float]] = {"open": [], "isolated": []}

            def bind(name: str, labels: dict, *, namespace: str = "ns-1") -> tuple[float, str]:
                engine.pods.on_add(scheduled(namespace, name, labels))
                engine.sync(SyncKind.PARTIAL)          # the Pod cached before the ADD, as scheduled
                address = next(free)
                writing[0] = 0.0
                spent = cpu_seconds()
                started = time.perf_counter()
                outcome = engine.bind_pod(namespace, name, (f"{address}/32",), synthetic_veth(address),
                                          container_id=name, deadline=time.monotonic() + 30)
                took = time.perf_counter() - started
                cpu["open" if "open" in name else "isolated"].append(cpu_seconds() - spent)
                write_share.append(writing[0])
                assert outcome.programmed, outcome
                paths["incremental" if outcome.incremental else "full"] += 1
                return took, address

            results["bind_ms"] = {
                "open": summary([bind(f"new-open-{i}", {"app": "none"})[0] for i in range(args.adds)]),
                "isolated": summary([bind(f"new-iso-{i}", {"app": "app-1", "role": "role-1"})[0]
                                     for i in range(args.adds)])}
            results["bind_cpu_ms"] = {kind: summary(seconds) for kind, seconds in cpu.items()}
            results["bind_paths"] = dict(paths)
            results["bind_kernel_writes_ms"] = summary(write_share)     # of bind_ms: the tools / libnftables
            unbinds = []
            for i in range(args.adds):
                started = time.perf_counter()
                outcome = engine.unbind_pod("ns-1", f"new-iso-{i}", container_id=f"new-iso-{i}",
                                            deadline=time.monotonic() + 30)
                unbinds.append(time.perf_counter() - started)
                assert outcome.programmed and outcome.incremental, outcome
            results["unbind_ms"] = summary(unbinds)
            _, address = bind("reported", {"app": "app-2"})
            engine.pods.on_update(scheduled("ns-1", "reported", {"app": "app-2"}),
                                  pod("ns-1", "reported", address, {"app": "app-2"}))
            started = time.perf_counter()
            engine.sync(SyncKind.PARTIAL)
            results["status_report_sync_ms"] = ms(time.perf_counter() - started)
            results["status_report_wrote"] = bool(engine.last_report and engine.last_report.wrote)

            names = [f"burst-{i}" for i in range(args.burst)]
            for name in names:
                engine.pods.on_add(scheduled("ns-2", name, {"app": "app-3"}))
            engine.sync(SyncKind.PARTIAL)
            outcomes: list = []
            addresses = [next(free) for _ in names]

            def one(name: str, address: str) -> None:
                outcomes.append(engine.bind_pod("ns-2", name, (f"{address}/32",), synthetic_veth(address),
                                                container_id=name, deadline=time.monotonic() + 60))
            threads = [threading.Thread(target=one, args=pair) for pair in zip(names, addresses)]
            started = time.perf_counter()
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            results["burst"] = {"adds": args.burst, "total_ms": ms(time.perf_counter() - started),
                                "programmed": sum(1 for o in outcomes if o.programmed),
                                "syncs": sum(o.syncs_run for o in outcomes)}

            # a real pod: Pod cached (selected by policy-7's peer in a team-0 namespace), ADD, bind, connect
            engine.pods.on_add(scheduled("ns-7", "client", {"role": "role-0"}))
            engine.sync(SyncKind.PARTIAL)
            client = node.add_pod("client")
            host = next(i["name"] for i in client.result["interfaces"] if "sandbox" not in i)
            outcome = engine.bind_pod("ns-7", "client", (f"{client.ip}/32",), host, container_id=client.container_id,
                                      deadline=time.monotonic() + 30)
            done = node.exec_in("client", [sys.executable, "-c", FIRST_CONNECT, server.ip], timeout=60)
            results["first_packet"] = {"programmed_in_add": outcome.programmed, "incremental": outcome.incremental,
                                       **json.loads(done.stdout)}
            programmer.cleanup()
        finally:
            inside.close()
            proc.kill()
            proc.wait()
    for key, value in results.items():
        print(f"{key:28} {value}")
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())

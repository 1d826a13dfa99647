#!/usr/bin/env python3
"""CNI ADD/DEL latency: netagent (the static C shim and the Python client through the agent,
and the Python client in-process) against the reference `bridge` + `host-local` plugins from
Debian's containernetworking-plugins and from the latest upstream release (built from the Go
module proxy at the version bench/peers/cni-plugins/go.mod pins: bench/go_peers.py), in one run;
and the reference `bridge` with its IPAM delegated to the `netagent-ipam` shim (served by the
agent) beside `bridge` + `host-local`. Ratios are against Debian's pair; `--json FILE` writes
one record per contender (`mode`, `version`, the figures).

Every contender gets its own node namespace and the same number of fresh pod namespaces.
The benchmark enters the node namespace itself (setns on its main thread, inherited by
its worker threads and the plugins they exec), so each figure is one plugin exec as a
runtime on that node would pay it: no `ip netns exec` in the timed path. Sequential ADDs
then DELs give median and p95; then N concurrent ADDs (and DELs) give wall time, success
count and address uniqueness.

`--family ipv6` or `dual` gives every contender an IPv6 range set instead of (beside) its
IPv4 one, so a dual-stack ADD can be set against an IPv4 one (run the script once per family).

    sudo .venv/bin/python bench/cni_latency.py [--pods 60] [--concurrent 100] [--family dual]
        [--no-upstream] [--json FILE]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from importlib.metadata import version

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from cni import invoke, netns  # noqa: E402
from lab import LabNode  # noqa: E402
from netagent.cniserver.install import PluginBinary  # noqa: E402
from netagent.kernel import namespaces  # noqa: E402
import go_peers  # noqa: E402  (bench/, beside this file)

REFERENCE_DIR = "/usr/lib/cni"
REFERENCE = "reference bridge+host-local"


class Contender:
    def __init__(self, label: str, node: LabNode, binary: str, config: bytes, *, version: str,
                 plugin_dir: str = REFERENCE_DIR) -> None:
        self.label, self.node, self.binary, self.config = label, node, binary, config
        self.version, self.plugin_dir = version, plugin_dir

    def call(self, command: str, container_id: str, netns_path: str) -> tuple[float, dict | None]:
        env = invoke.cni_environment(command=command, container_id=container_id, netns=netns_path,
                                     ifname="eth0", path=(self.node.bin_dir, self.plugin_dir))
        started = time.perf_counter()
        proc = subprocess.run([self.binary], input=self.config, env=env, capture_output=True)
        elapsed = time.perf_counter() - started
        out = json.loads(proc.stdout) if proc.stdout.strip() else None
        if proc.returncode != 0:
            raise RuntimeError(f"{self.label} {command} failed: {proc.stdout!r} {proc.stderr!r}")
        return elapsed, out


FAMILIES = ("ipv4", "ipv6", "dual")


def subnets(n: int, family: str) -> tuple:
    """Contender n's range sets: 10.6n.0.0/16 and/or fd00:6n::/64."""
    v4, v6 = f"10.6{n}.0.0/16", f"fd00:6{n}::/64"
    return {"ipv4": (v4,), "ipv6": (v6,), "dual": (v4, v6)}[family]


def bridge_config(ipam_type: str, ranges: tuple, data_dir: str, **ipam) -> bytes:
    return json.dumps({
        "cniVersion": "1.0.0", "name": "reference", "type": "bridge", "bridge": "cni0", "isGateway": True,
        "ipam": {"type": ipam_type, "ranges": [[{"subnet": s}] for s in ranges], "dataDir": data_dir,
                 **ipam}}).encode()


def debian_version() -> str:
    proc = subprocess.run(["dpkg-query", "-W", "-f=${Version}", "containernetworking-plugins"],
                          capture_output=True, text=True)
    return f"debian {proc.stdout.strip()}" if proc.returncode == 0 else "debian (version unknown)"


def contenders(stack, family: str = "ipv4", upstream: tuple[str, str] | None = None) -> list:
    shim = stack(LabNode(prefix="na-bench", subnets=subnets(3, family), plugin=PluginBinary.SHIM))
    ours = stack(LabNode(prefix="na-bench", subnets=subnets(0, family)))
    ours_config = ours.plugin_config()
    inproc = stack(LabNode(prefix="na-bench", subnets=subnets(1, family), with_agent=False))
    ref = stack(LabNode(prefix="na-bench", with_agent=False))
    ref_config = bridge_config("host-local", subnets(2, family), ref.data_dir)
    ipam_shim = stack(LabNode(prefix="na-bench", plugin=PluginBinary.SHIM))
    ipam_shim_config = bridge_config("netagent-ipam", subnets(4, family), ipam_shim.data_dir,
                                     agentSocket=ipam_shim.socket_path)
    debian, netagent = debian_version(), "netagent " + version("netagent")
    found = [Contender(REFERENCE, ref, f"{REFERENCE_DIR}/bridge", ref_config, version=debian)]
    if upstream is not None:
        directory, release = upstream
        latest = stack(LabNode(prefix="na-bench", with_agent=False))
        found.append(Contender(f"upstream bridge+host-local {release}", latest, f"{directory}/bridge",
                               bridge_config("host-local", subnets(5, family), latest.data_dir),
                               version=f"upstream {release}", plugin_dir=directory))
    return found + [
        Contender("bridge+netagent-ipam shim", ipam_shim, f"{REFERENCE_DIR}/bridge", ipam_shim_config, version=netagent),
        Contender("netagent shim (agent)", shim, os.path.join(shim.bin_dir, "netagent"), shim.plugin_config(),
                  version=netagent),
        Contender("netagent python (agent)", ours, os.path.join(ours.bin_dir, "netagent"), ours_config,
                  version=netagent),
        Contender("netagent python (in-process)", inproc, os.path.join(inproc.bin_dir, "netagent"),
                  inproc.plugin_config(), version=netagent)]


def percentile(values: list, pct: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(pct / 100 * (len(ordered) - 1))))]


def measure(contender: Contender, *, pods: int, concurrent: int) -> dict:
    node = contender.node
    names = [node.new_pod_netns(f"s{i}") for i in range(pods)]
    burst = [node.new_pod_netns(f"c{i}") for i in range(concurrent)]
    node_fd = os.open(namespaces.netns_path(node.node), os.O_RDONLY)
    try:
        with netns.entered(node_fd):
            # one warm-up pod, as a node that has served pods before
            warm = node.new_pod_netns("warm")
            contender.call("ADD", "warm", namespaces.netns_path(warm))
            add_times, del_times = [], []
            for i, name in enumerate(names):
                add_times.append(contender.call("ADD", f"s{i}", namespaces.netns_path(name))[0])
            for i, name in enumerate(names):
                del_times.append(contender.call("DEL", f"s{i}", namespaces.netns_path(name))[0])
            contender.call("DEL", "warm", namespaces.netns_path(warm))

            def add(i):
                try:
                    return contender.call("ADD", f"c{i}", namespaces.netns_path(burst[i]))[1]
                except RuntimeError as exc:
                    return {"error": str(exc)}

            started = time.perf_counter()
            with ThreadPoolExecutor(max_workers=concurrent) as pool:
                results = list(pool.map(add, range(concurrent)))
            burst_add = time.perf_counter() - started
            started = time.perf_counter()
            with ThreadPoolExecutor(max_workers=concurrent) as pool:
                list(pool.map(lambda i: contender.call("DEL", f"c{i}", namespaces.netns_path(burst[i])),
                              range(concurrent)))
            burst_del = time.perf_counter() - started
    finally:
        os.close(node_fd)
    ok = [r for r in results if r and "ips" in r]
    return {"add": add_times, "del": del_times, "burst_add": burst_add, "burst_del": burst_del,
            "burst_ok": len(ok), "burst_unique": len({r["ips"][0]["address"] for r in ok}),
            "errors": [r["error"] for r in results if r and "error" in r][:3]}


def record(label: str, row: dict, *, version: str, family: str, pods: int, reference: dict) -> dict:
    """One contender's figures as a JSON record (ms; ratios against Debian's reference pair)."""
    add, remove = statistics.median(row["add"]), statistics.median(row["del"])
    return {"mode": label, "version": version, "family": family, "pods": pods,
            "add_median_ms": round(add * 1000, 2), "add_p95_ms": round(percentile(row["add"], 95) * 1000, 2),
            "del_median_ms": round(remove * 1000, 2), "del_p95_ms": round(percentile(row["del"], 95) * 1000, 2),
            "add_ratio": round(add / statistics.median(reference["add"]), 3),
            "del_ratio": round(remove / statistics.median(reference["del"]), 3),
            "burst_add_s": round(row["burst_add"], 3), "burst_ok": row["burst_ok"],
            "burst_unique": row["burst_unique"], "burst_del_s": round(row["burst_del"], 3)}


def report(rows: dict, *, pods: int, concurrent: int, family: str = "ipv4") -> None:
    ms = lambda s: s * 1000  # noqa: E731
    ref = rows[REFERENCE]
    ref_add, ref_del = statistics.median(ref["add"]), statistics.median(ref["del"])
    print(f"\nCNI latency, {family}, {pods} sequential pods per contender (ms; ratio = median / reference median)")
    print(f"{'contender':<38}{'ADD med':>9}{'ADD p95':>9}{'ratio':>7}{'DEL med':>10}{'DEL p95':>9}{'ratio':>7}")
    for label, row in rows.items():
        add_med, del_med = statistics.median(row["add"]), statistics.median(row["del"])
        print(f"{label:<38}{ms(add_med):9.1f}{ms(percentile(row['add'], 95)):9.1f}{add_med / ref_add:7.2f}"
              f"{ms(del_med):10.1f}{ms(percentile(row['del'], 95)):9.1f}{del_med / ref_del:7.2f}")
    print(f"\n{concurrent} concurrent ADDs, then {concurrent} concurrent DELs")
    print(f"{'contender':<38}{'ADD wall s':>11}{'ok':>6}{'unique':>8}{'DEL wall s':>12}")
    for label, row in rows.items():
        print(f"{label:<38}{row['burst_add']:11.2f}{row['burst_ok']:6d}{row['burst_unique']:8d}"
              f"{row['burst_del']:12.2f}")
        for error in row["errors"]:
            print(f"    error: {error[:300]}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", type=int, default=60)
    parser.add_argument("--concurrent", type=int, default=100)
    parser.add_argument("--family", choices=FAMILIES, default="ipv4",
                        help="the pods' address families (default ipv4)")
    parser.add_argument("--no-upstream", action="store_true",
                        help="leave out the upstream plugins (built with Go from the module proxy)")
    parser.add_argument("--json", metavar="FILE", help="also write one record per contender to FILE")
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("needs root (it builds network namespaces)", file=sys.stderr)
        return 1
    if not os.access(f"{REFERENCE_DIR}/bridge", os.X_OK):
        print("the reference plugins are missing: apt-get install containernetworking-plugins",
              file=sys.stderr)
        return 1
    upstream = None
    if not args.no_upstream:
        try:
            upstream = go_peers.build(go_peers.CNI_PLUGINS)
        except go_peers.BuildError as error:
            print(f"the upstream plugins are left out: {error}", file=sys.stderr)
    nodes: list = []

    def stack(node: LabNode) -> LabNode:
        nodes.append(node.__enter__())
        return node

    try:
        rows, versions = {}, {}
        for contender in contenders(stack, args.family, upstream):
            rows[contender.label] = measure(contender, pods=args.pods, concurrent=args.concurrent)
            versions[contender.label] = contender.version
        report(rows, pods=args.pods, concurrent=args.concurrent, family=args.family)
        if args.json:
            with open(args.json, "w") as f:
                json.dump([record(label, row, version=versions[label], family=args.family, pods=args.pods,
                                  reference=rows[REFERENCE]) for label, row in rows.items()], f, indent=1)
    finally:
        for node in nodes:
            node.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Pod start and stop latency on the kubelet's path: containerd 1.6's CRI RunPodSandbox,
StopPodSandbox and RemovePodSandbox, with netagent against the reference plugins, in one run.

Each contender gets its own throwaway containerd with the CRI plugin (tests/e2e/cri_harness.py:
its own node network namespace, private mounts, the hand-built pause image) and the same
chain after the main plugin (loopback first, then portmap and bandwidth, as containerd and a
hostPort-serving cluster run them):
* "hostNetwork (no CNI)": the runtime's own share; containerd calls no plugin at all;
* "netagent shim (agent)": `netagent cni install` (the static shim) and `netagent run
  --cni-only` serving it in the node's namespace;
* "reference bridge+host-local": Debian's containernetworking-plugins.
Figures: median and p95 of sequential calls after one warm-up pod, then N pods started at
once (kubelet starts a node's pods in parallel): wall time and per-pod median.

    sudo .venv/bin/python bench/cri_latency.py [--pods 30] [--concurrent 10]

Needs root, containerd, runc, the reference plugins, a C compiler, grpcio and grpcio-tools
(the project's test extra) and the CRI definition (shared/cri/api.proto beside the checkout).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tests.e2e.containerd_harness import missing_prerequisites  # noqa: E402
from tests.e2e.cri_harness import CriNode, cri_api  # noqa: E402
from tests.e2e.netagent_support import (  # noqa: E402
    NETAGENT,
    REFERENCE_PLUGINS,
    agent_in,
    chain_reference_plugins,
    install_netagent,
    missing_reference_plugins,
    settle,
)
from tests.e2e.oci_image import build_pause_image  # noqa: E402

HOST_NETWORK = "hostNetwork (no CNI)"
NETAGENT_LABEL = "netagent shim (agent)"
REFERENCE = "reference bridge+host-local"


def netagent_dirs(base: Path) -> tuple[Path, Path, Path]:
    bin_dir, conf_dir, data_dir = base / "bin", base / "conf", base / "ipam"
    data_dir.mkdir(parents=True)
    socket = base / "run" / "cni.sock"
    conflist = install_netagent(bin_dir=bin_dir, conf_dir=conf_dir, subnet="10.64.0.0/16",
                                data_dir=data_dir, socket_path=socket)
    chain_reference_plugins(bin_dir, conflist)
    return bin_dir, conf_dir, socket


def reference_dirs(base: Path) -> tuple[Path, Path]:
    bin_dir, conf_dir = base / "bin", base / "conf"
    bin_dir.mkdir(parents=True)
    conf_dir.mkdir()
    for plugin in ("bridge", "host-local"):
        (bin_dir / plugin).write_bytes((REFERENCE_PLUGINS / plugin).read_bytes())
        (bin_dir / plugin).chmod(0o755)
    conflist = conf_dir / "10-reference.conflist"
    conflist.write_text(json.dumps({
        "cniVersion": "1.0.0", "name": "reference",
        "plugins": [{"type": "bridge", "bridge": "cni0", "isGateway": True,
                     "ipam": {"type": "host-local", "ranges": [[{"subnet": "10.65.0.0/16"}]],
                              "dataDir": str(base / "ipam")}}]}))
    chain_reference_plugins(bin_dir, conflist)
    return bin_dir, conf_dir


def measure(node: CriNode, *, pods: int, concurrent: int, host_network: bool = False) -> dict:
    def run(name: str):
        return node.run_pod(name, host_network=host_network)

    def release(sandbox) -> tuple[float, float]:
        stop = node.stop_pod(sandbox)
        t0 = time.monotonic()
        node.remove_pod(sandbox)
        return stop, time.monotonic() - t0

    release(run("warm"))  # one pod first, as on a node that has served pods before
    sandboxes = [run(f"s{i}") for i in range(pods)]
    released = [release(s) for s in sandboxes]
    started = time.monotonic()
    with ThreadPoolExecutor(concurrent) as pool:
        burst = list(pool.map(run, [f"c{i}" for i in range(concurrent)]))
    burst_wall = time.monotonic() - started
    with ThreadPoolExecutor(concurrent) as pool:
        list(pool.map(release, burst))
    return {"run": [s.run_seconds for s in sandboxes], "stop": [r[0] for r in released],
            "remove": [r[1] for r in released], "burst_wall": burst_wall,
            "burst_run": [s.run_seconds for s in burst]}


def percentile(values: list, pct: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(pct / 100 * (len(ordered) - 1))))]


def report(rows: dict, *, pods: int, concurrent: int) -> None:
    def ms(values, pct=None) -> str:
        value = statistics.median(values) if pct is None else percentile(values, pct)
        return f"{value * 1000:9.1f}"

    base = statistics.median(rows[HOST_NETWORK]["run"])
    print(f"\nCRI latency through containerd 1.6, {pods} sequential pods per contender (ms; "
          f"net = Run median minus the hostNetwork pod's: the network's share)")
    print(f"{'contender':<30}{'Run med':>9}{'Run p95':>9}{'net':>7}{'Stop med':>9}{'Stop p95':>9}"
          f"{'Rm med':>9}{'Rm p95':>9}")
    for label, row in rows.items():
        net = (statistics.median(row["run"]) - base) * 1000
        print(f"{label:<30}{ms(row['run'])}{ms(row['run'], 95)}{net:7.1f}{ms(row['stop'])}"
              f"{ms(row['stop'], 95)}{ms(row['remove'])}{ms(row['remove'], 95)}")
    print(f"\n{concurrent} RunPodSandbox at once")
    print(f"{'contender':<30}{'wall ms':>9}{'Run med':>9}{'Run max':>9}")
    for label, row in rows.items():
        print(f"{label:<30}{row['burst_wall'] * 1000:9.1f}{ms(row['burst_run'])}"
              f"{max(row['burst_run']) * 1000:9.1f}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", type=int, default=30)
    parser.add_argument("--concurrent", type=int, default=10)
    args = parser.parse_args()
    missing = missing_prerequisites() + missing_reference_plugins()
    if not NETAGENT.exists():
        missing.append(f"{NETAGENT} (pip install -e '.[lab,test]')")
    if missing:
        print("cannot run:", "; ".join(missing), file=sys.stderr)
        return 1
    with tempfile.TemporaryDirectory(prefix="na-e2e-bench-") as tmp:
        base = Path(tmp)
        api = cri_api(base / "stubs")
        (base / "image").mkdir()
        image = build_pause_image(base / "image")
        if isinstance(api, str) or isinstance(image, str):
            print("cannot run:", api if isinstance(api, str) else image, file=sys.stderr)
            return 1
        rows = {}
        bin_dir, conf_dir, socket = netagent_dirs(base / "netagent")
        with CriNode(api=api, cni_bin_dir=bin_dir, cni_conf_dir=conf_dir, image=image) as node, \
                agent_in(node, socket, base / "agent.log"):
            rows[HOST_NETWORK] = measure(node, pods=args.pods, concurrent=args.concurrent, host_network=True)
            rows[NETAGENT_LABEL] = measure(node, pods=args.pods, concurrent=args.concurrent)
            settle(socket.parent / "pending-del")
        bin_dir, conf_dir = reference_dirs(base / "reference")
        with CriNode(api=api, cni_bin_dir=bin_dir, cni_conf_dir=conf_dir, image=image) as node:
            rows[REFERENCE] = measure(node, pods=args.pods, concurrent=args.concurrent)
        report(rows, pods=args.pods, concurrent=args.concurrent)
    return 0


if __name__ == "__main__":
    sys.exit(main())

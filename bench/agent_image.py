#!/usr/bin/env python3
"""The agent image's figures: its size, how long scripts/build-image takes, and how long
the agent container takes from `podman run` to serving CNI on its node.

The start-up figure comes from a one-node lab whose agent is the image run as
deploy/netagent.yaml's DaemonSet (`netagent lab up --agent-image`): the agent container is
killed and started again the kubelet's way (`podman run` of the same spec) ROUNDS times;
each round times `podman run` returning, the CNI socket accepting a connection, and the
manifest's readiness probe passing. The restarted agent adopts what its node already has,
as after a crash or an upgrade. A first start on a clean node (the agent stopped, then
`netagent cleanup` run from the image: no VXLAN device, bridge, routes or chains left, so the
agent builds them all) is timed once too.

    sudo .venv/bin/python bench/agent_image.py [--image TAG] [--rounds 5] [--build] [--no-cache]

--build runs scripts/build-image first (--no-cache: every step again, as on a fresh machine
that has the base image) and reports its wall time.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from lab.agent_pods import run_podman  # noqa: E402
from lab.cluster import LabCluster  # noqa: E402
from lab.daemonset import ProbeKind  # noqa: E402


def accepts(path: str) -> bool:
    with contextlib.closing(socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)) as sock:
        try:
            sock.connect(path)
            return True
        except OSError:
            return False


def until(predicate, timeout: float = 180.0) -> float:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError("timed out")
        time.sleep(0.01)
    return time.monotonic()


def one_start(lab: LabCluster, node: str, start) -> dict:
    host = lab.node_host(node)
    socket_path = lab.cni_socket(node)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(socket_path)
    started = time.monotonic()
    start(host)
    returned = time.monotonic()
    serving = until(lambda: accepts(socket_path))
    ready = until(lambda: lab.agent_pods.probe(host, ProbeKind.READINESS))
    return {"podman_run": returned - started, "serving_cni": serving - started, "ready": ready - started}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--image", default="localhost/netagent:0.1.0")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--build", action="store_true")
    parser.add_argument("--no-cache", action="store_true")
    args = parser.parse_args()
    figures: dict = {}
    if args.build:
        started = time.monotonic()
        subprocess.run([os.path.join(ROOT, "scripts", "build-image"), "--tag", args.image,
                        *(["--no-cache"] if args.no_cache else [])], check=True, stdout=subprocess.DEVNULL)
        figures["build_seconds"] = round(time.monotonic() - started, 1)
    size = run_podman(["image", "inspect", "--format", "{{.Size}}", args.image]).stdout.strip()
    figures["image_megabytes"] = round(int(size) / 1e6, 1)

    lab = LabCluster.create(nodes=1, prefix="na-bench-img", agent_image=args.image)
    try:
        (node,) = lab.state.nodes
        lab.stop_agent(node)
        cleanup = lab.agent_pods.run_once(lab.node_host(node), ["cleanup"])
        if cleanup.returncode != 0:
            raise SystemExit(f"netagent cleanup failed: {cleanup.stderr}")
        first = one_start(lab, node, lambda host: lab.agent_pods.start_containers(host))
        rounds = []
        for _ in range(args.rounds):
            lab.agent_pods.kill(node, sig=signal.SIGKILL)
            rounds.append(one_start(lab, node, lab.agent_pods.restart_agent))
    finally:
        lab.down()
    figures["clean_node_start"] = {k: round(v, 3) for k, v in first.items()}
    figures["restart_median"] = {k: round(statistics.median(r[k] for r in rounds), 3) for k in rounds[0]}
    figures["restart_max"] = {k: round(max(r[k] for r in rounds), 3) for k in rounds[0]}
    print(json.dumps(figures, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

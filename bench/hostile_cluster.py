"""Benchmark: a 2-node lab under hostile and huge objects keeps its network (issue 18).

    sudo .venv/bin/python bench/hostile_cluster.py [--endpoint-ports 300000] [--timeout 900]

One 2-node vxlan lab (real agents, iptables proxy, the in-repo API server). Step by step it
writes, through the API, what a hostile kubelet or a lax API server could: a Node whose
backend-data is 20 KB of nested arrays, a Node copying node-2's VTEP MAC, Nodes claiming the
metadata address and the service range, then legal Services and EndpointSlices totalling
`--endpoint-ports` endpoint-ports (100 ports x 1,000 endpoints per Service) and a Service with
null annotations. After each step it waits until every agent has judged the object (rejected
it, or programmed it) and checks, from the real kernels:

- cross-node pings between the existing pods;
- a new pod's CNI ADD on each node (through the agent) and its ping to the other node's pod;
- a new Service (a ClusterIP over a pod on node-2) answering from a pod on node-1;
- no route to the hostile prefixes through the overlay.

It prints one line per step: how long the agents took to converge and each check's result.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from lab.cluster import SERVICE_CIDR, LabCluster  # noqa: E402
from netagent.kernel import namespaces  # noqa: E402
from netagent.noderoutes import node_objects as nodes  # noqa: E402
from netagent.noderoutes.routing.vxlan import vtep_mac  # noqa: E402
from tests.cluster.lab_tools import hairpin_entries  # noqa: E402

PORT = 8080
_SERVER = ("import socket,sys\n"
           "s=socket.create_server(('0.0.0.0',%d))\n"
           "while True:\n"
           "    c,_=s.accept();c.sendall(sys.argv[1].encode());c.close()\n") % PORT
_ASK = ("import socket,sys\n"
        "try:\n"
        "    with socket.create_connection((sys.argv[1],80),timeout=2) as c: print(c.recv(100).decode())\n"
        "except OSError as e: print('error',e)\n")
_HEALTH = ("import urllib.request;"
           "print(urllib.request.urlopen('http://127.0.0.1:10258/healthz', timeout=30).read().decode())")


def wait(predicate, *, timeout: float, interval: float = 0.5) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return bool(predicate())


def hostile_node(name: str, *, pod_cidr: str, public_ip: str, backend_data: str) -> dict:
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "annotations": {nodes.BACKEND_TYPE: "vxlan", nodes.PUBLIC_IP: public_ip,
                                                       nodes.BACKEND_DATA: backend_data}},
            "spec": {"podCIDR": pod_cidr, "podCIDRs": [pod_cidr]}}


def huge_service(index: int) -> tuple[dict, dict]:
    """A Service of 100 ports with one slice of 1,000 endpoints: legal, 100,000 endpoint-ports."""
    name = f"huge-{index}"
    ports = [{"name": f"p{p}", "port": 1000 + p, "targetPort": 20000 + p, "protocol": "TCP"} for p in range(100)]
    endpoints = [{"addresses": [f"10.{200 + index}.{e // 250}.{e % 250 + 1}"], "conditions": {"ready": True}}
                 for e in range(1000)]
    return ({"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "namespace": "default"},
             "spec": {"ports": ports}},
            {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
             "metadata": {"name": f"{name}-1", "namespace": "default", "labels": {"kubernetes.io/service-name": name}},
             "addressType": "IPv4", "endpoints": endpoints,
             "ports": [{"name": p["name"], "port": p["targetPort"], "protocol": "TCP"} for p in ports]})


class Checks:
    def __init__(self, lab: LabCluster) -> None:
        self.lab = lab
        self.new_pods = 0
        self.new_services = 0
        self.node1, self.node2 = sorted(lab.state.nodes)[:2]
        self.server = None

    def route_device(self, node: str, address: str) -> str:
        out = self.lab.exec(node, ["ip", "-j", "route", "get", address], check=True).stdout
        return json.loads(out)[0].get("dev", "")

    def rejected(self, node: str) -> list[str]:
        body = self.lab.exec(node, [sys.executable, "-c", _HEALTH], timeout=60).stdout
        return json.loads(body)["details"].get("rejected_objects", []) if body else []

    def pings(self) -> str:
        pods = list(self.lab.state.pods.values())
        pairs = [(a, b) for a in pods for b in pods if a.node != b.node]
        ok = sum(1 for a, b in pairs if self.lab.ping(a.name, b.ip))
        return f"pings {ok}/{len(pairs)}"

    def new_pod(self) -> str:
        results = []
        for node, other in ((self.node1, self.node2), (self.node2, self.node1)):
            self.new_pods += 1
            started = time.monotonic()
            pod = self.lab.add_pod(f"new-{self.new_pods}", node=node)
            added = time.monotonic() - started
            target = next(p for p in self.lab.state.pods.values() if p.node == other)
            results.append(f"{'ok' if self.lab.ping(pod.name, target.ip) else 'FAILED'} ({added * 1000:.0f} ms ADD)")
        return "new pods " + ", ".join(results)

    def new_service(self, timeout: float) -> str:
        if self.server is None:
            target = next(p for p in self.lab.state.pods.values() if p.node == self.node2)
            self.server = subprocess.Popen([*namespaces.exec_prefix(target.netns), sys.executable, "-c", _SERVER,
                                            target.name], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            self.target = target
        self.new_services += 1
        name = f"fresh-{self.new_services}"
        api = self.lab.api()
        service = api.apply({"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "namespace": "default"},
                             "spec": {"ports": [{"name": "http", "port": 80, "targetPort": PORT}]}})
        api.apply({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
                   "metadata": {"name": f"{name}-1", "namespace": "default",
                                "labels": {"kubernetes.io/service-name": name}},
                   "addressType": "IPv4", "ports": [{"name": "http", "port": PORT, "protocol": "TCP"}],
                   "endpoints": [{"addresses": [self.target.ip], "conditions": {"ready": True}}]})
        address = service["spec"]["clusterIP"]
        client = next(p for p in self.lab.state.pods.values() if p.node == self.node1)
        started = time.monotonic()
        answered = wait(lambda: self.lab.exec(client.name, [sys.executable, "-c", _ASK, address], timeout=30)
                        .stdout.strip() == self.target.name, timeout=timeout)
        return f"new Service {'answers' if answered else 'FAILED'} ({time.monotonic() - started:.1f} s)"

    def not_via_overlay(self, *addresses: str) -> str:
        hijacked = [f"{node}:{a}" for node in sorted(self.lab.state.nodes) for a in addresses
                    if self.route_device(node, a) == "na-vxlan"]
        return "overlay clean" if not hijacked else f"HIJACKED {', '.join(hijacked)}"

    def stop(self) -> None:
        if self.server is not None:
            self.server.kill()
            self.server.wait()


def judged(checks: Checks, name: str, reason: str, timeout: float) -> str:
    started = time.monotonic()
    ok = wait(lambda: all(any(f"Node {name} rejected ({reason})" in line for line in checks.rejected(node))
                          for node in sorted(checks.lab.state.nodes)), timeout=timeout)
    return f"{'rejected' if ok else 'NOT rejected'} ({reason}) in {time.monotonic() - started:.1f} s"


def run(endpoint_ports: int, timeout: float) -> int:
    lab = LabCluster.create(nodes=2, mode="vxlan", pods_per_node=1, resync_period=5.0, prefix="na-bhc")
    checks = Checks(lab)
    failures = 0
    try:
        api = lab.api()
        steps = [
            ("deep-JSON Node", lambda: api.create(hostile_node(
                "deep", pod_cidr="10.244.90.0/24", public_ip="198.18.31.90",
                backend_data="[" * 10_000 + "]" * 10_000)), ("deep", "too-large"), ["10.244.90.1"]),
            ("Node copying node-2's VTEP MAC", lambda: api.create(hostile_node(
                "a-thief", pod_cidr="10.244.66.0/24", public_ip="198.18.31.66",
                backend_data=json.dumps({"vtepMAC": vtep_mac("node-2")}))), ("a-thief", "conflict"), ["10.244.66.1"]),
            ("Node claiming 169.254.169.254/32", lambda: api.create(hostile_node(
                "metadata", pod_cidr="169.254.169.254/32", public_ip="198.18.31.8",
                backend_data=json.dumps({"vtepMAC": vtep_mac("metadata")}))),
             ("metadata", "outside-cluster-cidr"), ["169.254.169.254"]),
            (f"Node claiming the service range {SERVICE_CIDR}", lambda: api.create(hostile_node(
                "services", pod_cidr=str(SERVICE_CIDR), public_ip="198.18.31.9",
                backend_data=json.dumps({"vtepMAC": vtep_mac("services")}))),
             ("services", "outside-cluster-cidr"), ["10.96.0.10", "10.96.0.1"]),
        ]
        print(f"hostile_cluster: 2-node lab up; node-1 {lab.state.nodes[checks.node1].address}, "
              f"node-2 {lab.state.nodes[checks.node2].address}")
        for title, write, (name, reason), probes in steps:
            write()
            results = [judged(checks, name, reason, timeout), checks.pings(), checks.new_pod(),
                       checks.new_service(timeout), checks.not_via_overlay(*probes)]
            failures += sum(1 for r in results if "FAILED" in r or "NOT" in r or "HIJACKED" in r or
                            r.startswith("pings") and r.split()[1].split("/")[0] != r.split()[1].split("/")[1])
            print(f"{title}:\n    " + "; ".join(results), flush=True)

        services = max(1, endpoint_ports // 100_000)
        started = time.monotonic()
        api.create({"apiVersion": "v1", "kind": "Service",
                    "metadata": {"name": "lax", "namespace": "default",
                                 "annotations": {"service.kubernetes.io/topology-mode": None}},
                    "spec": {"ports": [{"name": "http", "port": 80, "targetPort": PORT}]}})
        for index in range(services):
            service, endpoint_slice = huge_service(index)
            api.create(service)
            api.create(endpoint_slice)
        members = services * 100_000
        programmed = all(wait(lambda: hairpin_entries(lab, node) >= members, timeout=timeout, interval=2.0)
                         for node in sorted(lab.state.nodes))
        took = time.monotonic() - started
        results = [f"{members} endpoint-ports {'programmed' if programmed else 'NOT programmed'} on both nodes "
                   f"in {took:.0f} s", checks.pings(), checks.new_pod(), checks.new_service(timeout)]
        failures += sum(1 for r in results if "FAILED" in r or "NOT" in r)
        print(f"{services} Services x 100 ports x 1,000 endpoints and a null-annotated Service:\n    "
              + "; ".join(results), flush=True)
        rejected = sorted({line.split(" rejected")[0] for node in sorted(lab.state.nodes)
                           for line in checks.rejected(node)})
        print(f"rejected objects listed in /healthz: {', '.join(rejected)}")
    finally:
        checks.stop()
        lab.down()
    print(f"hostile_cluster: {'all checks passed' if not failures else f'{failures} check(s) FAILED'}")
    return 1 if failures else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--endpoint-ports", type=int, default=300_000,
                        help="legal endpoint-ports to write (100,000 per Service)")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds to wait for each convergence")
    args = parser.parse_args()
    return run(args.endpoint_ports, args.timeout)


if __name__ == "__main__":
    sys.exit(main())

"""The real flannel (flanneld, `--kube-subnet-mgr`) as a routing peer for the benchmarks: two
node namespaces it programs, as bench/pod_throughput.py's `two_nodes` has netagent's RouteManager
program them, so the same pods and iperf3 measure both in one run.

flanneld is built from the Go module proxy at the version bench/peers/go.mod pins
(`github.com/flannel-io/flannel`, built like the upstream CNI plugins: bench/upstream_plugins.py).
It needs a Kubernetes API: the lab's own server (lab/apiserver) runs in the underlay namespace,
reachable from both nodes at SERVER on the segment, holding the two Node objects with their pod
CIDRs; flanneld reads its lease from its Node, announces its VTEP (or, host-gw, its address) in
the Node's annotations and programs the routes to the other node's pod CIDR. Pods get the MTU
flannel writes to its subnet file. IPv4 only here: flannel's IPv6 needs its own cluster config.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from ipaddress import ip_network
from typing import Iterator, NamedTuple

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from lab.apiclient import LabApiClient  # noqa: E402
from lab.kubeconfig import render_kubeconfig  # noqa: E402
from netagent.kernel import namespaces  # noqa: E402

SEGMENT = ip_network("198.18.0.0/16")     # room for simulated peers (bench/node_routes.py)
SERVER = "198.18.255.254"
CLUSTER = ip_network("10.244.0.0/16")
BACKENDS = ("vxlan", "host-gw")
START_TIMEOUT = 60.0


def pod_cidr(index: int):
    return ip_network(f"10.244.{index}.0/24")


def run(netns: str, *argv: str) -> None:
    namespaces.run_in(netns, list(argv), check=True)


def node_object(index: int) -> dict:
    cidr = str(pod_cidr(index))
    # annotations present, as a kubelet-registered Node's are (flanneld writes into the map it reads)
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": f"node-{index}", "annotations": {"node.alpha.kubernetes.io/ttl": "0"}},
            "spec": {"podCIDR": cidr, "podCIDRs": [cidr]},
            "status": {"addresses": [{"type": "InternalIP", "address": str(SEGMENT.network_address + index)},
                                     {"type": "Hostname", "address": f"node-{index}"}]}}


ANNOTATION = "flannel.alpha.coreos.com/"


def announced_node(name: str, cidr: str, address: str, backend: str, vtep_mac: str) -> dict:
    """A Node as another flanneld leaves it: its lease announced in flannel's annotations (a
    simulated peer: nothing answers at `address`, and programming a route does not need it to)."""
    data = json.dumps({"VNI": 1, "VtepMAC": vtep_mac}) if backend == "vxlan" else "null"
    notes = {ANNOTATION + "backend-type": backend, ANNOTATION + "backend-data": data,
             ANNOTATION + "kube-subnet-manager": "true", ANNOTATION + "public-ip": address}
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "annotations": notes},
            "spec": {"podCIDR": cidr, "podCIDRs": [cidr]}}


class FlannelNodes(NamedTuple):
    client_pod: str            # a pod namespace on node-1
    server_pod: str            # a pod namespace on node-2
    server_address: str
    node_netns: str            # node-1's namespace (its routes are flannel's)
    api: LabApiClient          # the API server flanneld watches


def subnet_mtu(path: str) -> int:
    """FLANNEL_MTU of a flannel subnet file."""
    with open(path) as f:
        for line in f:
            key, _, value = line.strip().partition("=")
            if key == "FLANNEL_MTU":
                return int(value)
    raise RuntimeError(f"{path} has no FLANNEL_MTU")


def _wait(what: str, done, logs: list[str]) -> None:
    deadline = time.monotonic() + START_TIMEOUT
    while not done():
        if time.monotonic() > deadline:
            tails = "\n".join(open(log).read()[-1500:] for log in logs if os.path.exists(log))
            raise RuntimeError(f"flannel: {what} not seen in {START_TIMEOUT:.0f} s\n{tails}")
        time.sleep(0.2)


def _has_route(netns: str, cidr) -> bool:
    out = subprocess.run([*namespaces.exec_prefix(netns), "ip", "-j", "route", "show", str(cidr)],
                         capture_output=True, text=True)
    return out.returncode == 0 and bool(json.loads(out.stdout or "[]"))


@contextmanager
def flannel_nodes(backend: str, flanneld: str) -> Iterator[FlannelNodes]:
    """Two nodes flannel routes, with a pod on each."""
    if backend not in BACKENDS:
        raise ValueError(f"flannel backend {backend!r} is not one of {BACKENDS}")
    made: list[str] = []
    processes: list[subprocess.Popen] = []
    work = tempfile.mkdtemp(prefix="na-bench-flannel-")

    def netns(role: str) -> str:
        name = namespaces.unique_name(f"na-bf{role}")
        namespaces.create(name)
        made.append(name)
        return name

    def spawn(netns_name: str, argv: list[str], log: str, env: dict | None = None) -> None:
        with open(log, "w") as out:
            processes.append(subprocess.Popen([*namespaces.exec_prefix(netns_name), *argv], stdout=out,
                                              stderr=subprocess.STDOUT, env={**os.environ, **(env or {})}))

    try:
        underlay = netns("ul")
        run(underlay, "ip", "link", "add", "br0", "type", "bridge")
        run(underlay, "ip", "addr", "add", f"{SERVER}/{SEGMENT.prefixlen}", "dev", "br0")
        run(underlay, "ip", "link", "set", "br0", "up")
        socket_path = os.path.join(work, "api.sock")
        api_log = os.path.join(work, "apiserver.log")
        spawn(underlay, [sys.executable, "-m", "lab.apiserver", "--listen", f"{SERVER}:6443", "--unix", socket_path],
              api_log, env={"PYTHONPATH": ROOT})
        _wait("the API server", lambda: os.path.exists(socket_path), [api_log])
        api = LabApiClient(unix_path=socket_path)
        kubeconfig = os.path.join(work, "kubeconfig")
        with open(kubeconfig, "w") as f:
            json.dump(render_kubeconfig({"bench": f"http://{SERVER}:6443"}), f)
        config = os.path.join(work, "net-conf.json")
        with open(config, "w") as f:
            json.dump({"Network": str(CLUSTER), "Backend": {"Type": backend}}, f)
        pods, logs = [], [api_log]
        for index in (1, 2):
            api.create(node_object(index))
            node, pod = netns(f"n{index}"), netns(f"p{index}")
            run(node, "sysctl", "-qw", "net.ipv4.ip_forward=1")
            run(underlay, "ip", "link", "add", f"u{index}", "type", "veth", "peer", "name", "eth0", "netns", node)
            run(underlay, "ip", "link", "set", f"u{index}", "master", "br0", "up")
            run(node, "ip", "addr", "add", f"{SEGMENT.network_address + index}/{SEGMENT.prefixlen}", "dev", "eth0")
            run(node, "ip", "link", "set", "eth0", "up")
            run(node, "ip", "link", "set", "lo", "up")
            subnet_file, log = os.path.join(work, f"subnet-{index}.env"), os.path.join(work, f"flanneld-{index}.log")
            logs.append(log)
            spawn(node, [flanneld, "--kube-subnet-mgr", f"--kubeconfig-file={kubeconfig}", "--iface=eth0",
                         f"--net-config-path={config}", f"--subnet-file={subnet_file}", "--ip-masq=false"],
                  log, env={"NODE_NAME": f"node-{index}", "POD_NAME": f"flannel-{index}", "POD_NAMESPACE": "default"})
            pods.append((node, pod, subnet_file))
        for index, (node, pod, subnet_file) in enumerate(pods, start=1):
            _wait(f"node-{index}'s subnet file", lambda: os.path.exists(subnet_file), logs)
            other = pod_cidr(3 - index)
            _wait(f"node-{index}'s route to {other}", lambda: _has_route(node, other), logs)
            mtu, cidr = str(subnet_mtu(subnet_file)), pod_cidr(index)
            run(node, "ip", "link", "add", "pod0", "mtu", mtu, "type", "veth", "peer", "name", "eth0", "mtu", mtu,
                "netns", pod)
            run(node, "ip", "addr", "add", f"{cidr.network_address + 1}/{cidr.prefixlen}", "dev", "pod0")
            run(node, "ip", "link", "set", "pod0", "up")
            run(pod, "ip", "addr", "add", f"{cidr.network_address + 2}/{cidr.prefixlen}", "dev", "eth0")
            run(pod, "ip", "link", "set", "eth0", "up")
            run(pod, "ip", "route", "add", "default", "via", str(cidr.network_address + 1))
        yield FlannelNodes(pods[0][1], pods[1][1], str(pod_cidr(2).network_address + 2), pods[0][0], api)
    finally:
        for process in processes:
            process.terminate()
        for process in processes:
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        for name in reversed(made):
            namespaces.remove(name)
        subprocess.run(["rm", "-rf", work])

"""Tools for tests on lab clusters: build one, run servers and clients in pods, capture.

Shared by the cluster tier (tests/cluster) and the VM tier's guest tests, which run the
same lab on Debian's kernel for IPIP.
"""
from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time

from netagent.kernel import namespaces
from netagent.lab.cluster import LabCluster

PREFIX = "na-tc"
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


_CREATED: set[str] = set()   # the unique prefixes of the labs this process made


def our_namespaces() -> list:
    """Namespaces of labs this process made (other processes' labs share PREFIX, not the id)."""
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return [line.split()[0] for line in out.splitlines()
            if any(line.startswith(f"{prefix}-") for prefix in _CREATED)]


@contextlib.contextmanager
def lab_cluster(*, prefix: str = PREFIX, **kwargs):
    """A lab for the test; its agents run from the image $NETAGENT_TEST_AGENT_IMAGE when that is
    set (the DaemonSet as the kubelet runs it: tests/deploy builds it), else as processes."""
    kwargs.setdefault("agent_image", os.environ.get("NETAGENT_TEST_AGENT_IMAGE") or None)
    lab = LabCluster.create(prefix=prefix, **kwargs)
    _CREATED.add(lab.state.prefix)
    try:
        yield lab
    finally:
        lab.down()


class Background:
    """A process in a namespace, stopped on exit; `ready_line` waits until it says it serves."""

    def __init__(self, netns: str, argv: list, *, ready_line: str | None = None, timeout: float = 15) -> None:
        self.proc = subprocess.Popen([*namespaces.exec_prefix(netns), *argv], stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, cwd=ROOT)
        if ready_line is not None:
            deadline = time.monotonic() + timeout
            while True:
                line = self.proc.stdout.readline() if self.proc.poll() is None else ""
                if ready_line in line:
                    break
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"{argv} did not start: {self.proc.stderr.read()}")

    def stop_when_done(self, *, timeout: float) -> tuple[str, str]:
        """Wait for the process to finish by itself (killed after `timeout`); its output."""
        try:
            return self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            return self.stop(signal.SIGKILL)

    def stop(self, sig: int = signal.SIGTERM) -> tuple[str, str]:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            out, err = self.proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            out, err = self.proc.communicate()
        return out, err

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


def traffic(lab: LabCluster, pod: str, *args: str) -> subprocess.CompletedProcess:
    return lab.exec(pod, [sys.executable, "-m", "tests.cluster.traffic", *args], timeout=60)


def serve(lab: LabCluster, pod: str, kind: str, port: int, *, lifetime: float = 120, named: bool = False) -> Background:
    """A server in `pod`; `named` answers start with the pod's name (to tell endpoints apart)."""
    return Background(lab.netns_of(pod), [sys.executable, "-m", "tests.cluster.traffic", f"serve-{kind}",
                                          str(port), "--lifetime", str(lifetime), *(["--name", pod] if named else [])],
                      ready_line="ready")


class Capture:
    """tcpdump on one interface of a namespace, written to a pcap that scapy reads back."""

    def __init__(self, netns: str, iface: str, path: str, *, bpf: str = "") -> None:
        self.path = path
        os.makedirs(os.path.dirname(path), exist_ok=True)
        argv = ["tcpdump", "-n", "-U", "--immediate-mode", "-Z", "root", "-i", iface, "-w", path, *bpf.split()]
        self.proc = subprocess.Popen([*namespaces.exec_prefix(netns), *argv], stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 10
        while "listening on" not in self.proc.stderr.readline():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("tcpdump did not start")

    def packets(self):
        from scapy.all import rdpcap
        time.sleep(0.2)
        self.proc.send_signal(signal.SIGINT)
        self.proc.wait(timeout=10)
        return list(rdpcap(self.path))


def ip_routes(lab: LabCluster, node: str) -> list:
    out = lab.exec(node, ["ip", "-j", "route", "show"], check=True).stdout
    return json.loads(out)


def wait_for(predicate, *, timeout: float = 10.0, interval: float = 0.05, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)


def pods_by_node(lab: LabCluster) -> dict:
    """The first pod of each node (tests build one per node)."""
    pods = {}
    for pod in lab.state.pods.values():
        pods.setdefault(pod.node, pod)
    return pods


def capture_ping(lab: LabCluster, source, target, pcap_path: str, *, size: int = 56, df: bool = False):
    """Ping `target` from pod `source` twice while capturing on the source node's switch port;
    return (answered, packets)."""
    node = lab.state.nodes[source.node]
    capture = Capture(lab.state.switch, node.port, pcap_path)
    argv = ["ping", "-c", "2", "-i", "0.2", "-W", "3", "-s", str(size), *(["-M", "do"] if df else []), target.ip]
    ok = lab.exec(source.name, argv, timeout=60).returncode == 0
    return ok, capture.packets()

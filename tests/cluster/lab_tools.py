"""Tools for tests on lab clusters: build one, run servers and clients in pods, capture.

Shared by the cluster tier (tests/cluster) and the VM tier's guest tests, which run the
same lab on Debian's kernel for IPIP.
"""
from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import struct
import subprocess
import sys
import time

from lab.bpf_places import in_cgroup_of
from lab.cluster import LabCluster
from netagent.kernel import namespaces

PREFIX = "na-tc"
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# how long a condition may take to hold: generous, for a loaded 2-core machine; a wait returns
# as soon as its condition holds, so only a failing test pays for it
CONVERGE_SECONDS = 60.0


_CREATED: set[str] = set()   # the unique prefixes of the labs this process made


def ours(names: list) -> list:
    """The `names` of labs this process made (other processes' labs share PREFIX, not the id)."""
    return [name for name in names if any(name.startswith(f"{prefix}-") for prefix in _CREATED)]


def our_namespaces() -> list:
    """Namespaces of labs this process made."""
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return ours([line.split()[0] for line in out.splitlines() if line.strip()])


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


def stream(lab: LabCluster, pod: str, kind: str, address: str, port: int, *extra: str,
           seconds: float = 120) -> Background:
    """A `stream-tcp`/`stream-udp` client in `pod` (in its node's cgroup in ebpf mode), returned
    once it has had its first answer: the stream is established before the test changes anything.
    It runs until `stop_stream` (at most `seconds`)."""
    argv = [sys.executable, "-m", "tests.cluster.traffic", f"stream-{kind}", address, str(port), str(seconds),
            "--ready", *extra]
    return Background(lab.netns_of(pod), in_cgroup_of(lab.state, pod, [], argv), ready_line="ready",
                      timeout=CONVERGE_SECONDS)


def stop_stream(running: Background, *, wait: float | None = None):
    """End a stream (SIGTERM; with `wait`, let it end by itself within that many seconds) and
    return its parsed result."""
    out, err = running.stop() if wait is None else running.stop_when_done(timeout=wait)
    try:
        return json.loads(out)
    except ValueError:
        raise AssertionError(f"the stream printed no result: {out!r}\n{err}") from None


def serve(lab: LabCluster, pod: str, kind: str, port: int, *, lifetime: float = 120, named: bool = False) -> Background:
    """A server in `pod`; `named` answers start with the pod's name (to tell endpoints apart)."""
    return Background(lab.netns_of(pod), [sys.executable, "-m", "tests.cluster.traffic", f"serve-{kind}",
                                          str(port), "--lifetime", str(lifetime), *(["--name", pod] if named else [])],
                      ready_line="ready")


# a TCP server on both families (one IPv6 socket, v4-mapped for IPv4): each connection's first
# line is answered "<name> <peer address>" (IPv4 peers without their ::ffff: prefix)
_DUAL_SERVER = r"""
import socket, sys, threading, time
port, name, lifetime = int(sys.argv[1]), sys.argv[2], float(sys.argv[3])
s = socket.create_server(("::", port), family=socket.AF_INET6, dualstack_ipv6=True, backlog=64)
s.settimeout(0.5)
print("ready", flush=True)
def handle(c, peer):
    with c, c.makefile("rwb") as f:
        f.readline(); f.write(f"{name} {peer[0].removeprefix('::ffff:')}\n".encode()); f.flush()
deadline = time.monotonic() + lifetime
while time.monotonic() < deadline:
    try:
        c, peer = s.accept()
    except socket.timeout:
        continue
    threading.Thread(target=handle, args=(c, peer), daemon=True).start()
"""


def serve_both_families(lab: LabCluster, pod: str, port: int, *, lifetime: float = 300) -> Background:
    """A TCP server in `pod` on IPv4 and IPv6 at once, answering with the pod's name and the peer."""
    return Background(lab.netns_of(pod), [sys.executable, "-c", _DUAL_SERVER, str(port), pod, str(lifetime)],
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

    def packets(self, until=lambda packets: True, *, timeout: float = CONVERGE_SECONDS) -> list:
        """Every packet captured, once those on disk satisfy `until` (or after `timeout`): tcpdump
        drops what it has not read yet when it is stopped, and on a loaded machine it may lag."""
        deadline = time.monotonic() + timeout
        while not until(self._written()) and time.monotonic() < deadline:
            time.sleep(0.05)
        self.proc.send_signal(signal.SIGINT)
        self.proc.wait(timeout=10)
        return self._written()

    def _written(self) -> list:
        from scapy.all import rdpcap
        from scapy.error import Scapy_Exception
        try:
            return list(rdpcap(self.path))
        except (Scapy_Exception, EOFError, struct.error):   # nothing flushed yet, or a record half-written
            return []


def syn_retransmits(prefix: list) -> int:
    """The TCP SYNs retransmitted so far in the namespace `prefix` runs commands in (TcpExt
    TCPSynRetrans): unchanged across refused connections, each refusal answered the first SYN,
    "at once" however loaded the machine (a dropped SYN is retried after 1 s)."""
    out = subprocess.run([*prefix, "cat", "/proc/net/netstat"], capture_output=True, text=True, timeout=60,
                         check=True).stdout
    names, values = [line.split() for line in out.splitlines() if line.startswith("TcpExt:")]
    return int(dict(zip(names, values))["TCPSynRetrans"])


def ip_routes(lab: LabCluster, node: str) -> list:
    out = lab.exec(node, ["ip", "-j", "route", "show"], check=True).stdout
    return json.loads(out)


def wait_for(predicate, *, timeout: float = CONVERGE_SECONDS, interval: float = 0.05, what: str = "condition"):
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
    return (answered, packets), the packets once every answered echo and its reply were captured."""
    from scapy.layers.inet import ICMP
    node = lab.state.nodes[source.node]
    capture = Capture(lab.state.switch, node.port, pcap_path)
    argv = ["ping", "-c", "2", "-i", "0.2", "-W", "3", "-s", str(size), *(["-M", "do"] if df else []), target.ip]
    done = lab.exec(source.name, argv, timeout=60)
    received = int(m.group(1)) if (m := re.search(r"(\d+) received", done.stdout)) else 0
    return done.returncode == 0, capture.packets(lambda packets: sum(ICMP in p for p in packets) >= 2 * received)


def hairpin_entries(lab, node: str) -> int:
    """Members of every hairpin set of ours on `node` (as the real ipset counts them)."""
    out = lab.exec(node, ["ipset", "list", "-t"]).stdout
    total, ours = 0, False
    for line in out.splitlines():
        if line.startswith("Name: "):
            ours = line.split()[1].startswith("NETAGENT-HAIRPIN")
        elif ours and line.startswith("Number of entries: "):
            total += int(line.split(": ")[1])
    return total

"""The scale harness's machines: two network namespaces on one wire, the real etcd and
kube-apiserver in the first, one real `netagent run` in the second, and a pooled HTTPS client.

The control plane is the lab's (`lab/kubernetes/control_plane.py`: its certificates, its etcd
and kube-apiserver argv), started without the controller manager and scheduler, which a scale
run does not need: the harness itself is node IPAM (pod CIDRs), the kubelets (pod status) and
the EndpointSlice controller. The client opens its sockets inside the API server's namespace
(`namespaces.made_in`), so nothing listens on the host and no relay process sits in the path;
it keeps one keep-alive connection per thread, so creation runs at the API server's pace.

The agent runs as the lab runs it (`python -m netagent.cli run`), from `agent_root` (a checkout:
a pinned worktree keeps a run steady while the working tree changes), with a client
certificate of its own (`AGENT_USER`, in system:masters: RBAC is not what is measured), which
the API server's audit log (Metadata level, that user only) names, so its requests are counted
apart from the harness's and the API server's own; iptables-legacy, routing `mode`, the iptables proxy and network policy. Its local
pods have no veths: their addresses are reserved in its IPAM store (host-local's layout) as a
CNI ADD leaves them, so the policy engine finds each pod's host interface name.
"""
from __future__ import annotations

import contextlib
import http.client
import ipaddress
import json
import os
import shutil
import signal
import socket
import ssl
import sys
import tempfile
import threading
import time
from collections.abc import Iterator

from lab.kubernetes import binaries, pki
from lab.kubernetes.control_plane import API_PORT, ClusterNetwork, ControlPlane, ControlPlanePids
from lab.processes import Processes, process_alive, tail
from netagent.kernel import namespaces

import scale_objects as objects

AGENT_NODE = objects.node_name(0)
AGENT_USER = "netagent-scale"   # the agent's own identity, so the audit log names its requests alone
AGENT_IDENTITY = pki.Identity(AGENT_USER, ("system:masters",))
AUDIT_POLICY = {"apiVersion": "audit.k8s.io/v1", "kind": "Policy", "omitStages": ["RequestReceived"],
                "rules": [{"level": "Metadata", "users": [AGENT_USER]}, {"level": "None"}]}


class ApiError(RuntimeError):
    def __init__(self, status: int, method: str, path: str, body: bytes) -> None:
        super().__init__(f"{method} {path}: {status} {body[:300].decode('utf-8', 'replace')}")
        self.status = status


class Client:
    """HTTPS to the API server from inside its namespace; one connection per thread."""

    def __init__(self, netns: str, context: ssl.SSLContext) -> None:
        self.netns = netns
        self.context = context
        self.local = threading.local()

    def _connection(self) -> http.client.HTTPSConnection:
        conn = getattr(self.local, "conn", None)
        if conn is None:
            raw = namespaces.made_in(self.netns, lambda: socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            raw.settimeout(120)
            raw.connect(("127.0.0.1", API_PORT))
            conn = http.client.HTTPSConnection("127.0.0.1", API_PORT, context=self.context, timeout=120)
            conn.sock = self.context.wrap_socket(raw, server_hostname="127.0.0.1")
            self.local.conn = conn
        return conn

    def request(self, method: str, path: str, body: object = None, *,
                content_type: str = "application/json") -> bytes:
        payload = None if body is None else json.dumps(body).encode()
        headers = {"Accept": "application/json", **({"Content-Type": content_type} if payload else {})}
        for attempt in range(2):
            conn = self._connection()
            try:
                conn.request(method, path, body=payload, headers=headers)
                response = conn.getresponse()
                data = response.read()
                break
            except (OSError, http.client.HTTPException):
                self.close()
                if attempt:
                    raise
        if not 200 <= response.status < 300:
            raise ApiError(response.status, method, path, data)
        return data

    def json(self, method: str, path: str, body: object = None, **kwargs) -> dict:
        return json.loads(self.request(method, path, body, **kwargs) or b"{}")

    def close(self) -> None:
        conn = getattr(self.local, "conn", None)
        if conn is not None:
            conn.close()
            self.local.conn = None


class Machines:
    """The two namespaces, the control plane and the agent of one scale run; `close` removes all."""

    def __init__(self, *, mode: str, agent_root: str, workdir: str | None = None) -> None:
        self.mode = mode
        self.agent_root = os.path.realpath(agent_root)
        self.workdir = workdir or tempfile.mkdtemp(prefix="na-scale-")
        self.api_ns = namespaces.unique_name("na-scale-api")
        self.node_ns = namespaces.unique_name("na-scale-node")
        self.processes = Processes(cwd=self.agent_root)
        network = ClusterNetwork(cluster_cidr=ipaddress.IPv4Network(objects.CLUSTER_CIDR),
                                 service_cidr=ipaddress.IPv4Network(objects.SERVICE_CIDR))
        self.control_plane = ControlPlane(directory=os.path.join(self.workdir, "control-plane"),
                                          bin_dir=binaries.bin_dir(), netns=self.api_ns,
                                          address=objects.API_ADDRESS, network=network, processes=self.processes)
        self.pids = ControlPlanePids()
        self.agent_pid: int | None = None
        self.client: Client | None = None

    # ------------------------------------------------------------ wires
    def build(self) -> None:
        namespaces.create(self.api_ns)
        namespaces.create(self.node_ns)
        prefix = f"/{objects.SEGMENT.prefixlen}"
        namespaces.run_in(self.api_ns, ["ip", "link", "add", "eth0", "type", "veth", "peer", "name", "eth0",
                                        "netns", namespaces.netns_path(self.node_ns)], check=True)
        for ns, address in ((self.api_ns, objects.API_ADDRESS), (self.node_ns, objects.node_address(0))):
            for argv in (["ip", "link", "set", "lo", "up"], ["ip", "addr", "add", address + prefix, "dev", "eth0"],
                         ["ip", "link", "set", "eth0", "up"]):
                namespaces.run_in(ns, argv, check=True)
        namespaces.run_in(self.node_ns, ["sysctl", "-qw", "net.ipv4.ip_forward=1"], check=True)

    # ------------------------------------------------------------ the control plane
    def start_control_plane(self, *, timeout: float = 180.0) -> None:
        self.control_plane.write_credentials(host_port=API_PORT)
        self.client = Client(self.api_ns, self.control_plane.ssl_context())
        self.pids.etcd = self.processes.spawn(self.api_ns, self.control_plane.etcd_argv(),
                                              self.control_plane.log("etcd"))
        self.start_apiserver(timeout=timeout)

    def audit_log(self) -> str:
        return os.path.join(self.workdir, "audit.log")

    def apiserver_argv(self) -> list[str]:
        """The lab's argv, plus an audit log of the agent's requests only (JSON is YAML)."""
        policy = os.path.join(self.workdir, "audit-policy.yaml")
        with open(policy, "w") as f:
            json.dump(AUDIT_POLICY, f)
        return [*self.control_plane.apiserver_argv(), "--audit-policy-file", policy,
                "--audit-log-path", self.audit_log(), "--audit-log-maxsize", "0", "--audit-log-format", "json"]

    def start_apiserver(self, *, timeout: float = 180.0) -> float:
        """kube-apiserver (again); seconds until /readyz answers."""
        started = time.monotonic()
        self.pids.apiserver = self.processes.spawn(self.api_ns, self.apiserver_argv(),
                                                   self.control_plane.log("kube-apiserver"))
        deadline = started + timeout
        assert self.client is not None
        while True:
            for name, pid in (("etcd", self.pids.etcd), ("kube-apiserver", self.pids.apiserver)):
                if not process_alive(pid):
                    raise RuntimeError(f"{name} exited:\n{tail(self.control_plane.log(name))}")
            try:
                if self.client.request("GET", "/readyz") == b"ok":
                    return time.monotonic() - started
            except (OSError, ApiError, http.client.HTTPException):
                self.client.close()
            if time.monotonic() > deadline:
                raise RuntimeError(f"kube-apiserver not ready in {timeout:.0f} s:\n"
                                   f"{tail(self.control_plane.log('kube-apiserver'))}")
            time.sleep(0.2)

    def stop_apiserver(self) -> None:
        self.processes.kill(self.pids.apiserver)
        self.pids.apiserver = None
        if self.client is not None:
            self.client.close()

    def version(self) -> str:
        assert self.client is not None
        return str(self.client.json("GET", "/version").get("gitVersion"))

    # ------------------------------------------------------------ the agent
    def ipam_dir(self) -> str:
        return os.path.join(self.workdir, "agent", "ipam", "netagent")

    def reserve_local_pods(self, addresses: list[str]) -> None:
        """The local pods' addresses as the agent's IPAM holds them after their CNI ADDs."""
        from cni.ipam.store import owner_text
        os.makedirs(self.ipam_dir(), exist_ok=True)
        for address in addresses:
            with open(os.path.join(self.ipam_dir(), address), "w", newline="") as f:
                f.write(owner_text(f"scale-{address}", "eth0"))

    def agent_argv(self) -> list[str]:
        directory = os.path.join(self.workdir, "agent")
        return [sys.executable, "-m", "netagent.cli", "--log-level", "INFO", "run",
                "--kubeconfig", self.agent_kubeconfig(), "--node-name", AGENT_NODE,
                "--cluster-cidr", objects.CLUSTER_CIDR, "--service-cidr", objects.SERVICE_CIDR,
                "--backend", self.mode, "--iface", "eth0", "--iptables-backend", "legacy",
                "--cni-socket", os.path.join(directory, "cni.sock"), "--cni-conf-dir", os.path.join(directory, "net.d"),
                "--cni-data-dir", os.path.dirname(self.ipam_dir()),
                "--status-bind", "127.0.0.1:10258", "--metrics-bind-address", "127.0.0.1:10249",
                "--resync-period", "3600", "--sync-period", "3600", "--policy-sync-period", "3600",
                "--proxy-mode", "iptables", "--network-policy"]

    def agent_kubeconfig(self) -> str:
        return self.control_plane.pki.kubeconfig(self.control_plane.kubeconfig(AGENT_USER),
                                                 server=self.control_plane.inside_url, name=AGENT_USER,
                                                 identity=AGENT_IDENTITY)

    def start_agent(self) -> int:
        self.agent_pid = self.processes.spawn(self.node_ns, self.agent_argv(), self.agent_log())
        return self.agent_pid

    def agent_log(self) -> str:
        return os.path.join(self.workdir, "agent", "agent.log")

    def stop_agent(self) -> None:
        self.processes.kill(self.agent_pid, sig=signal.SIGTERM, timeout=30)
        self.agent_pid = None

    # ------------------------------------------------------------ the end
    def close(self, *, keep_workdir: bool = False) -> None:
        with contextlib.suppress(Exception):
            self.stop_agent()
        for pid in (self.pids.apiserver, self.pids.etcd):
            with contextlib.suppress(Exception):
                self.processes.kill(pid)
        if self.client is not None:
            self.client.close()
        for ns in (self.node_ns, self.api_ns):
            with contextlib.suppress(Exception):
                namespaces.remove(ns)
        if not keep_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)


@contextlib.contextmanager
def machines(*, mode: str, agent_root: str, keep_workdir: bool = False) -> Iterator[Machines]:
    """Built, and removed on the way out (errors, Ctrl-C and SIGTERM too: the script turns SIGTERM
    into SystemExit)."""
    made = Machines(mode=mode, agent_root=agent_root)
    try:
        made.build()
        yield made
    finally:
        made.close(keep_workdir=keep_workdir)

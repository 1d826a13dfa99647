"""The real control plane of a Kubernetes lab: etcd, kube-apiserver, kube-controller-manager and
kube-scheduler, the binaries `scripts/build-kubernetes` made, run in a lab namespace (the first
node's, as on kubeadm's control-plane node).

Shaped as kubeadm's static pods and `hack/local-up-cluster.sh` configure them, with what
matters to a network plugin switched on: TLS with client certificates (`pki.py`), ServiceAccount
tokens, `Node,RBAC` authorization and the default admission plugins plus NodeRestriction; the
controller manager allocates each Node's podCIDR (node IPAM), runs the EndpointSlice
controller, signs kubelets' CSRs and issues ServiceAccount credentials per controller. The API
server listens on its node's address, port 6443, for the nodes and pods; the host reaches it through
`relay.py` on a loopback port, as it reaches the lab's own API server. Leader election is off
(one replica of each), etcd skips fsync (a throwaway cluster on a loaded machine).
"""
from __future__ import annotations

import dataclasses
import ipaddress
import os
import ssl
import sys
import time
import urllib.request

from lab.kubeconfig import host_listener
from lab.kubernetes import pki
from lab.processes import Processes, process_alive, tail
from lab.state import LabError

API_PORT = 6443
DNS_DOMAIN = "cluster.local"


@dataclasses.dataclass(frozen=True)
class ClusterNetwork:
    """The cluster's address plan, shared by the control plane, the kubelets and the agents."""
    cluster_cidr: ipaddress.IPv4Network
    service_cidr: ipaddress.IPv4Network
    node_cidr_mask: int = 24

    @property
    def kubernetes_service_ip(self) -> str:
        return str(self.service_cidr[1])

    @property
    def dns_service_ip(self) -> str:
        return str(self.service_cidr[10])


@dataclasses.dataclass
class ControlPlanePids:
    etcd: int | None = None
    apiserver: int | None = None
    relay: int | None = None
    controller_manager: int | None = None
    scheduler: int | None = None


class ControlPlane:
    """Start, wait for and stop the control plane of one lab (`directory`: its files)."""

    def __init__(self, *, directory: str, bin_dir: str, netns: str, address: str,
                 network: ClusterNetwork, processes: Processes) -> None:
        self.directory = directory
        self.bin_dir = bin_dir
        self.netns = netns
        self.address = address
        self.network = network
        self.processes = processes
        self.pki = pki.Pki(os.path.join(directory, "pki"))

    # ------------------------------------------------------------ files
    @property
    def inside_url(self) -> str:
        return f"https://{self.address}:{API_PORT}"

    def host_url(self, port: int) -> str:
        return f"https://127.0.0.1:{port}"

    def log(self, component: str) -> str:
        return os.path.join(self.directory, "logs", f"{component}.log")

    def kubeconfig(self, name: str) -> str:
        return os.path.join(self.directory, f"{name}.kubeconfig")

    def _binary(self, name: str) -> str:
        return os.path.join(self.bin_dir, name)

    def write_credentials(self, *, host_port: int) -> None:
        """Certificates, keys and the control plane's kubeconfigs (admin for inside and host)."""
        self.pki.ensure_ca()
        self.pki.server("apiserver", dns=["kubernetes", "kubernetes.default", "kubernetes.default.svc",
                                          f"kubernetes.default.svc.{DNS_DOMAIN}", "localhost"],
                        ips=[ipaddress.ip_address(a) for a in
                             (self.address, self.network.kubernetes_service_ip, "127.0.0.1")])
        self.pki.client("apiserver-kubelet-client", pki.APISERVER_KUBELET_CLIENT)
        self.pki.service_account_keys()
        self.pki.kubeconfig(self.kubeconfig("admin"), server=self.inside_url, name="admin", identity=pki.ADMIN)
        self.pki.kubeconfig(self.kubeconfig("admin-host"), server=self.host_url(host_port), name="admin",
                            identity=pki.ADMIN)
        self.pki.kubeconfig(self.kubeconfig("controller-manager"), server=f"https://127.0.0.1:{API_PORT}",
                            name="controller-manager", identity=pki.CONTROLLER_MANAGER)
        self.pki.kubeconfig(self.kubeconfig("scheduler"), server=f"https://127.0.0.1:{API_PORT}",
                            name="scheduler", identity=pki.SCHEDULER)

    def node_kubeconfig(self, node: str) -> str:
        """The kubelet's kubeconfig: `system:node:<node>` in `system:nodes`."""
        return self.pki.kubeconfig(self.kubeconfig(f"kubelet-{node}"), server=self.inside_url,
                                   name=f"kubelet-{node}", identity=pki.node_identity(node))

    # ------------------------------------------------------------ argv
    def etcd_argv(self) -> list[str]:
        return [self._binary("etcd"), "--name", "lab", "--data-dir", os.path.join(self.directory, "etcd"),
                "--listen-client-urls", "http://127.0.0.1:2379", "--advertise-client-urls", "http://127.0.0.1:2379",
                "--listen-peer-urls", "http://127.0.0.1:2380", "--initial-advertise-peer-urls",
                "http://127.0.0.1:2380", "--initial-cluster", "lab=http://127.0.0.1:2380",
                "--unsafe-no-fsync", "--log-level", "warn"]

    def apiserver_argv(self) -> list[str]:
        p = self.pki
        sa_key, sa_pub = p.service_account_keys()
        return [self._binary("kube-apiserver"),
                "--etcd-servers", "http://127.0.0.1:2379",
                "--bind-address", "0.0.0.0", "--secure-port", str(API_PORT), "--advertise-address", self.address,
                "--tls-cert-file", p.path("apiserver.crt"), "--tls-private-key-file", p.path("apiserver.key"),
                "--client-ca-file", p.ca_cert,
                "--kubelet-client-certificate", p.path("apiserver-kubelet-client.crt"),
                "--kubelet-client-key", p.path("apiserver-kubelet-client.key"),
                "--kubelet-preferred-address-types", "InternalIP",
                "--service-account-issuer", f"https://kubernetes.default.svc.{DNS_DOMAIN}",
                "--service-account-key-file", sa_pub, "--service-account-signing-key-file", sa_key,
                "--service-cluster-ip-range", str(self.network.service_cidr),
                "--authorization-mode", "Node,RBAC", "--enable-admission-plugins", "NodeRestriction",
                "--allow-privileged=true", "--profiling=false", "--v=1"]

    def controller_manager_argv(self) -> list[str]:
        p = self.pki
        sa_key, _ = p.service_account_keys()
        config = self.kubeconfig("controller-manager")
        return [self._binary("kube-controller-manager"), "--kubeconfig", config,
                "--authentication-kubeconfig", config, "--authorization-kubeconfig", config,
                "--bind-address", "127.0.0.1", "--leader-elect=false", "--use-service-account-credentials=true",
                "--service-account-private-key-file", sa_key, "--root-ca-file", p.ca_cert,
                "--cluster-signing-cert-file", p.ca_cert, "--cluster-signing-key-file", p.ca_key,
                "--allocate-node-cidrs=true", "--cluster-cidr", str(self.network.cluster_cidr),
                "--node-cidr-mask-size", str(self.network.node_cidr_mask),
                "--service-cluster-ip-range", str(self.network.service_cidr),
                "--configure-cloud-routes=false", "--controllers", "*,bootstrapsigner,tokencleaner", "--v=1"]

    def scheduler_argv(self) -> list[str]:
        config = self.kubeconfig("scheduler")
        return [self._binary("kube-scheduler"), "--kubeconfig", config, "--authentication-kubeconfig", config,
                "--authorization-kubeconfig", config, "--bind-address", "127.0.0.1", "--leader-elect=false",
                "--v=1"]

    # ------------------------------------------------------------ life cycle
    def start(self, pids: ControlPlanePids, *, host_port: int | None, timeout: float = 120.0) -> int:
        """Start every component (those not running), wait for the API server to be ready;
        returns the host's loopback port."""
        with host_listener(host_port) as listener:
            port = listener.getsockname()[1]
            self.write_credentials(host_port=port)
            if not process_alive(pids.etcd):
                pids.etcd = self.processes.spawn(self.netns, self.etcd_argv(), self.log("etcd"))
            if not process_alive(pids.apiserver):
                pids.apiserver = self.processes.spawn(self.netns, self.apiserver_argv(), self.log("kube-apiserver"))
            if not process_alive(pids.relay):
                pids.relay = self.processes.spawn(
                    self.netns, [sys.executable, "-m", "lab.kubernetes.relay", "--listen-fd",
                                 str(listener.fileno()), "--to", f"127.0.0.1:{API_PORT}"],
                    self.log("relay"), pass_fds=(listener.fileno(),))
        self.wait_ready(port, pids, timeout=timeout)
        if not process_alive(pids.controller_manager):
            pids.controller_manager = self.processes.spawn(self.netns, self.controller_manager_argv(),
                                                           self.log("kube-controller-manager"))
        if not process_alive(pids.scheduler):
            pids.scheduler = self.processes.spawn(self.netns, self.scheduler_argv(), self.log("kube-scheduler"))
        return port

    def ssl_context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=self.pki.ca_cert)
        cert, key = self.pki.client("admin", pki.ADMIN)
        context.load_cert_chain(cert, key)
        return context

    def wait_ready(self, port: int, pids: ControlPlanePids, *, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        context = self.ssl_context()
        last = ""
        while time.monotonic() < deadline:
            for name, pid in (("etcd", pids.etcd), ("kube-apiserver", pids.apiserver)):
                if not process_alive(pid):
                    raise LabError(f"{name} exited:\n{tail(self.log(name))}")
            try:
                with urllib.request.urlopen(f"{self.host_url(port)}/readyz", context=context, timeout=5) as r:
                    if r.status == 200:
                        return
            except Exception as e:  # not up yet: refused, reset, 500 while post-start hooks run
                last = str(e)
            time.sleep(0.5)
        raise LabError(f"kube-apiserver not ready in {timeout:.0f} s ({last}):\n{tail(self.log('kube-apiserver'))}")

    def stop(self, pids: ControlPlanePids) -> None:
        for pid in (pids.scheduler, pids.controller_manager, pids.relay, pids.apiserver, pids.etcd):
            self.processes.kill(pid)

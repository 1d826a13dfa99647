"""`netagent lab up --kubernetes`: a real Kubernetes in the lab's namespaces, with netagent
installed the way a user installs it.

The machines and wires are the lab's own (`physical.py`: switch, router, internet, a namespace
per node); what runs on them is real: the control plane on node-1's machine, as on kubeadm's
control-plane node, so the API server reaches pods through netagent's routes
(`control_plane.py`), and on each node a containerd and a kubelet (`node_host.py`) that
register the Node through the API server; the controller manager allocates its podCIDR. The
images nothing can pull are built here and imported into every node's containerd under the
names Kubernetes and the e2e suite ask for (`images.py`). Then, as the README tells a user:
the `netagent-apiserver` ConfigMap (no kube-proxy, so the agent is told where the API server
is), `kubectl apply` of deploy/netagent.yaml (with the operator's edits for the lab's routing
and proxy modes: `addons.py`), and CoreDNS behind the `kube-dns` Service. No kube-proxy runs:
netagent replaces it. Up means every Node Ready, the DaemonSet and CoreDNS available.

The state lives in the lab's state.json (`LabState.kubernetes`: the processes), so `lab
status`, `lab kubeconfig`, `lab exec` and `lab down` work on it as on the quick lab.
"""
from __future__ import annotations

import contextlib
import dataclasses
import ipaddress
import json
import os
import shutil
import subprocess
import tempfile
import time

from lab import physical
from lab.agent_pods import provision_node
from lab.daemonset import NodeHost
from lab.kubernetes import addons, binaries, images
from lab.kubernetes.control_plane import DNS_DOMAIN, ClusterNetwork, ControlPlane, ControlPlanePids
from lab.kubernetes.node_host import KubeletNode, hierarchies
from lab.processes import Processes, process_alive
from lab.state import LabError, LabState, NodeState
from netagent.cniserver import install as cni_install
from netagent.kernel import namespaces

NETWORK = ClusterNetwork(cluster_cidr=ipaddress.IPv4Network("10.244.0.0/16"),
                         service_cidr=ipaddress.IPv4Network("10.96.0.0/16"))
MODES = ("vxlan", "host-gw", "bgp")   # bgp: a full mesh of the nodes' BIRDs (no ToR)
PROXY_MODES = ("iptables", "nftables", "ebpf")
_FORBIDDEN_STATE_ROOTS = ("/etc/", "/opt/", "/var/")  # overlaid in every node's mount namespace


@dataclasses.dataclass
class NodeProcesses:
    holder: int | None = None
    containerd: int | None = None
    kubelet: int | None = None


@dataclasses.dataclass
class KubernetesState:
    """What `LabState.kubernetes` holds: the version and every process of the cluster."""
    version: str
    host_port: int | None = None
    control_plane: ControlPlanePids = dataclasses.field(default_factory=ControlPlanePids)
    nodes: dict[str, NodeProcesses] = dataclasses.field(default_factory=dict)

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> "KubernetesState":
        return cls(version=data["version"], host_port=data.get("host_port"),
                   control_plane=ControlPlanePids(**data.get("control_plane", {})),
                   nodes={k: NodeProcesses(**v) for k, v in data.get("nodes", {}).items()})


class KubernetesLab:
    """Build, drive and remove a lab running a real Kubernetes."""

    def __init__(self, state: LabState) -> None:
        self.state = state
        self.kube = KubernetesState.from_json(state.kubernetes or {"version": "unknown"})
        self.processes = Processes(cwd=cni_install.code_root())
        self.bin_dir = binaries.bin_dir()
        # the control plane runs on the first node's machine, as on kubeadm's control-plane node: its
        # API server reaches pods (the apiserver proxy, exec's streams) through netagent's routes
        self.control_plane = ControlPlane(directory=self.path("control-plane"), bin_dir=self.bin_dir,
                                          netns=self._netns(1), address=str(physical.node_address(1, 1)),
                                          network=NETWORK, processes=self.processes)

    # ------------------------------------------------------------ paths
    @property
    def workdir(self) -> str:
        return self.state.workdir

    def path(self, *parts: str) -> str:
        return os.path.join(self.workdir, "kubernetes", *parts)

    @property
    def admin_kubeconfig(self) -> str:
        """For kubectl inside the lab (the nodes and the router reach the API server on node-1)."""
        return self.control_plane.kubeconfig("admin")

    @property
    def host_kubeconfig(self) -> str:
        """For kubectl on this host (the loopback relay)."""
        return self.control_plane.kubeconfig("admin-host")

    def _netns(self, index: int) -> str:
        return f"{self.state.prefix}-n{index}"

    def node(self, name: str) -> KubeletNode:
        node = self.state.nodes[name]
        return KubeletNode(name=name, netns=node.netns, address=node.address,
                           directory=self.path("nodes", name), state_dir=self.workdir,
                           cgroup=f"/{self.state.prefix}/{name}", bin_dir=self.bin_dir, processes=self.processes)

    # ------------------------------------------------------------ life cycle
    @classmethod
    def create(cls, *, nodes: int = 3, mode: str = "vxlan", proxy_mode: str = "iptables",
               workdir: str | None = None, prefix: str = "na-k8s", timeout: float = 300.0) -> "KubernetesLab":
        if mode not in MODES:
            raise LabError(f"--kubernetes: mode {mode!r}: choose one of {', '.join(MODES)}")
        if proxy_mode not in PROXY_MODES:
            raise LabError(f"--kubernetes: proxy mode {proxy_mode!r}: choose one of {', '.join(PROXY_MODES)}")
        if not 1 <= nodes <= 10:
            raise LabError("--kubernetes: nodes must be between 1 and 10")
        if proxy_mode == "ebpf" and not any(h.endswith("/unified") for h in hierarchies()):
            raise LabError("--kubernetes --proxy-mode ebpf: needs this machine's hybrid cgroup layout (a v2 "
                           "hierarchy at /sys/fs/cgroup/unified, where each node's subtree is its own)")
        bin_dir = binaries.ensure_built()
        archives = images.build_all(bin_dir=bin_dir, ebpf=proxy_mode == "ebpf")
        prefix = namespaces.unique_name(prefix)
        workdir = os.path.realpath(workdir or tempfile.mkdtemp(prefix=f"{prefix}-"))
        if workdir.startswith(_FORBIDDEN_STATE_ROOTS):
            raise LabError(f"--kubernetes: the state directory {workdir} may not be under /etc, /opt or /var "
                           "(every node overlays those)")
        os.makedirs(workdir, exist_ok=True)
        state = LabState(prefix=prefix, workdir=workdir, mode=mode, auto_encap="vxlan", segments=1,
                         resync_period=30.0, switch=f"{prefix}-sw", router=f"{prefix}-rtr",
                         internet=f"{prefix}-inet", proxy_mode=proxy_mode, network_policy=True,
                         kubernetes=KubernetesState(version=binaries.version()).to_json())
        lab = cls(state)
        try:
            lab.save()
            physical.build_backbone(switch=state.switch, router=state.router, internet=state.internet, segments=1)
            for index in range(1, nodes + 1):
                lab.plug_node(f"node-{index}", index=index)
            lab.kube.host_port = lab.control_plane.start(lab.kube.control_plane, host_port=None)
            lab.save()
            for name in list(lab.state.nodes):
                lab.start_node(name, archives=archives)
            lab.install(timeout=timeout)
        except BaseException:
            lab.down()
            raise
        return lab

    @classmethod
    def load(cls, state: LabState) -> "KubernetesLab":
        return cls(state)

    def save(self) -> None:
        self.state.kubernetes = self.kube.to_json()
        self.state.write()

    def __enter__(self) -> "KubernetesLab":
        return self

    def __exit__(self, *exc) -> None:
        self.down()

    def plug_node(self, name: str, *, index: int) -> None:
        """The node's machine: its namespace on the switch, with kubeadm's prerequisites."""
        node_state = NodeState(name=name, index=index, segment=1, netns=self._netns(index),
                               address="", pod_cidr="", port=f"n{index}")
        self.state.nodes[name] = node_state
        self.kube.nodes[name] = NodeProcesses()
        self.save()
        node_state.address = str(physical.plug_node(switch=self.state.switch, node=node_state.netns, segment=1,
                                                    index=index, port=node_state.port))
        provision_node(NodeHost(name=name, netns=node_state.netns, address=node_state.address, root="/"))
        namespaces.run_in(node_state.netns, ["ip", "link", "set", "lo", "up"], check=True)
        self.save()

    def start_node(self, name: str, *, archives: list) -> None:
        """Its mount namespace and cgroups, containerd with the images, the kubelet."""
        node = self.node(name)
        procs = self.kube.nodes[name]
        node.make_cgroups()
        procs.holder = node.start_holder()
        self.save()
        procs.containerd = node.start_containerd(procs.holder, sandbox_image=images.PAUSE_IMAGE)
        self.save()
        images.import_all(node.ctr(procs.holder), archives)
        self.start_kubelet(name)

    def start_kubelet(self, name: str) -> None:
        node, procs = self.node(name), self.kube.nodes[name]
        assert procs.holder is not None
        procs.kubelet = node.start_kubelet(procs.holder, kubeconfig=self.control_plane.node_kubeconfig(name),
                                           ca_cert=self.control_plane.pki.ca_cert,
                                           cluster_dns=NETWORK.dns_service_ip, dns_domain=DNS_DOMAIN)
        self.save()

    def stop_kubelet(self, name: str) -> None:
        self.processes.kill(self.kube.nodes[name].kubelet)
        self.kube.nodes[name].kubelet = None
        self.save()

    def install(self, *, timeout: float) -> None:
        """netagent and CoreDNS, as a user installs them; then wait for the cluster to be up."""
        address = self.control_plane.address
        self.kubectl("-n", "kube-system", "create", "configmap", "netagent-apiserver",
                     f"--from-literal=KUBERNETES_SERVICE_HOST={address}",
                     "--from-literal=KUBERNETES_SERVICE_PORT=6443")
        overlay = addons.OVERLAYS.get(self.state.proxy_mode)
        built = self.kubectl("kustomize", overlay).stdout if overlay else None
        self.kubectl("apply", "-f", "-", input=addons.netagent_manifest(
            mode=self.state.mode, proxy_mode=self.state.proxy_mode, built=built))
        self.kubectl("apply", "-f", "-", input=addons.coredns_manifest(
            dns_ip=NETWORK.dns_service_ip, domain=DNS_DOMAIN, image=images.COREDNS_IMAGE))
        self.wait_up(timeout=timeout)

    def wait_up(self, *, timeout: float = 300.0) -> None:
        deadline = time.monotonic() + timeout
        want = sorted(self.state.nodes)
        self._wait("every Node Ready", lambda: self.ready_nodes() == want, deadline)
        for kind, name in (("daemonset", "netagent"), ("deployment", "coredns")):
            self._wait(f"{kind} {name} available", lambda: self._available(kind, name), deadline)

    def _wait(self, what: str, condition, deadline: float) -> None:
        while not condition():
            for name, procs in self.kube.nodes.items():
                if procs.kubelet and not process_alive(procs.kubelet):
                    raise LabError(f"node {name}: the kubelet exited; see {self.node(name).log('kubelet')}")
            if time.monotonic() > deadline:
                raise LabError(f"the cluster did not come up ({what}); `kubectl get pods -A -o wide`:\n"
                               + self.kubectl("get", "pods", "-A", "-o", "wide", check=False).stdout)
            time.sleep(1)

    def ready_nodes(self) -> list[str]:
        nodes = self.kubectl_json("get", "nodes")
        return sorted(n["metadata"]["name"] for n in nodes.get("items", [])
                      if any(c.get("type") == "Ready" and c.get("status") == "True"
                             for c in n.get("status", {}).get("conditions", [])))

    def _available(self, kind: str, name: str) -> bool:
        obj = self.kubectl_json("-n", "kube-system", "get", kind, name, check=False)
        status = obj.get("status", {})
        if kind == "daemonset":
            want = status.get("desiredNumberScheduled", 0)
            return want == len(self.state.nodes) and status.get("numberAvailable", 0) == want
        return status.get("availableReplicas", 0) >= 1

    def down(self) -> None:
        """Stop every process, remove every namespace, cgroup and file of the lab; safe to repeat."""
        for name in list(self.state.nodes):
            self.node(name).remove()
        self.control_plane.stop(self.kube.control_plane)
        for node in self.state.nodes.values():
            namespaces.remove(node.netns)
        for ns in (self.state.switch, self.state.router, self.state.internet):
            namespaces.remove(ns)
        for hierarchy in hierarchies():
            with contextlib.suppress(OSError):
                os.rmdir(os.path.join(hierarchy, self.state.prefix))
        shutil.rmtree(self.workdir, ignore_errors=True)

    # ------------------------------------------------------------ clients
    def kubectl(self, *args: str, input: str | None = None, check: bool = True,
                timeout: float = 120.0) -> subprocess.CompletedProcess:
        proc = subprocess.run([kubectl_binary(), "--kubeconfig", self.host_kubeconfig, *args], input=input,
                              capture_output=True, text=True, timeout=timeout)
        if check and proc.returncode != 0:
            raise LabError(f"kubectl {' '.join(args)}: {proc.stderr.strip() or proc.stdout.strip()}")
        return proc

    def kubectl_json(self, *args: str, check: bool = True) -> dict:
        proc = self.kubectl(*args, "-o", "json", check=check)
        return json.loads(proc.stdout) if proc.returncode == 0 else {}

    def exec_prefix(self, target: str) -> list[str]:
        """argv prefix for a command on a node (its network and mount namespaces) or in the router."""
        if target in self.state.nodes:
            holder = self.kube.nodes[target].holder
            if holder is None:
                raise LabError(f"node {target} is not running")
            return self.node(target).enter(holder)
        if target in ("router", "internet"):
            return namespaces.exec_prefix(getattr(self.state, target))
        raise LabError(f"{target}: not a node of this lab, nor router/internet (pods: kubectl exec)")

    def status(self) -> dict:
        nodes = {n["metadata"]["name"]: n for n in self.kubectl_json("get", "nodes", check=False).get("items", [])}
        ready = self.ready_nodes()
        return {
            "kubernetes": self.kube.version,
            "apiServer": {"url": self.control_plane.inside_url,
                          "running": process_alive(self.kube.control_plane.apiserver),
                          "hostUrl": self.control_plane.host_url(self.kube.host_port or 0),
                          "kubeconfig": self.host_kubeconfig},
            "nodes": [{
                "name": name, "address": node.address, "segment": node.segment,
                "podCIDRs": nodes.get(name, {}).get("spec", {}).get("podCIDRs", []),
                "kubelet": {"running": process_alive(self.kube.nodes[name].kubelet)},
                "containerd": {"running": process_alive(self.kube.nodes[name].containerd)},
                "ready": name in ready,
            } for name, node in self.state.nodes.items()],
            "pods": [{"namespace": p["metadata"]["namespace"], "name": p["metadata"]["name"],
                      "node": p["spec"].get("nodeName"), "ips": [i["ip"] for i in p["status"].get("podIPs", [])],
                      "phase": p["status"].get("phase")}
                     for p in self.kubectl_json("get", "pods", "-A", check=False).get("items", [])],
        }


def kubectl_binary() -> str:
    venv = os.path.join(cni_install.code_root(), ".venv", "bin", "kubectl")
    found = venv if os.path.exists(venv) else shutil.which("kubectl")
    if not found:
        raise LabError("kubectl is not installed (scripts/setup.sh installs it into .venv)")
    return found



def print_status(status: dict) -> None:
    api = status["apiServer"]
    print(f"  Kubernetes {status['kubernetes']}: API server {api['url']}, {api['hostUrl']} from this host "
          f"(`netagent lab kubeconfig`) ({'running' if api['running'] else 'STOPPED'})")
    for node in status["nodes"]:
        print(f"  node {node['name']:<10} {node['address']:<14} podCIDR {','.join(node['podCIDRs']):<15} "
              f"kubelet {'running' if node['kubelet']['running'] else 'STOPPED'}, "
              f"{'Ready' if node['ready'] else 'NOT READY'}")
    for pod in status["pods"]:
        print(f"  pod  {pod['namespace'] + '/' + pod['name']:<40} on {pod['node'] or '-':<10} "
              f"{','.join(pod['ips']):<14} {pod['phase']}")

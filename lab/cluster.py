"""A multi-node cluster in network namespaces: API server, nodes with agents, pods.

`LabCluster` plays every part a real cluster has around our agent, and nothing more:
- the control plane: the in-repo Kubernetes API test server (`apiserver/`), run in the
  router namespace, reachable from every node at 198.18.16.1:6443, with the lab's
  EndpointSlice controller inside it (slices for Services with selectors, from the pods);
- the node controller: it creates each Node with its `spec.podCIDR` (10.244.<i>.0/24; with
  `ip_family` ipv6 or dual, fd00:10:244:<i>::/64 too, `podCIDRs` one per family, the primary
  first), as kube-controller-manager's node IPAM would, Ready as its kubelet reports (`node_objects.py`);
- the kubelet and container runtime: pods are network namespaces wired by executing our
  CNI plugin from the node's namespace with the config the agent published, exactly as
  containerd does, and v1 Pod objects reporting them (labels, named container ports, IP,
  the Ready condition, termination with a grace period): `lab_pods.py` (the `LabPods` mixin)
  and `pod_objects.py`;
- the kubelet of the Pods API clients create (agnhost pods): the process `kubelet.py`;
- the machines and wires: `physical.py`; the processes (API server, agents): `processes.py`.

Every agent is the real `netagent run`, started with `ip netns exec` in its node, with the
lab's `--proxy-mode` (iptables, ipvs, ebpf, nftables or none: always said, as the agent's default
depends on the host).
`ip_family` (`lab up --ip-family`: ipv4, the default, ipv6 or dual) decides the families of
pods and Services: the agents get `--cluster-cidr`/`--service-cidr` per family, the API
server a Service range per family (`SERVICE_CIDRS`), the wires IPv6 as well (`physical.py`).
In ebpf mode each node has its own cgroup and bpffs (`bpf_places.py`) and its processes, pods'
included, run inside that cgroup (`exec_prefix`). With `agent_image`, the agents are instead
deploy/netagent.yaml's DaemonSet run by podman as the kubelet would (`agent_pods.py`).
In bgp mode each segment has a top-of-rack router running BIRD and every agent runs `--backend bgp`
peering with its segment's ToR (`bgp_fabric.py`). The state (namespaces, pids, pods: `state.py`) lives in `<workdir>/state.json`, so the CLI can build
a lab with `lab up` and drive or remove it from later commands; tests use the same class
in-process as a context manager.
"""
from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from lab import bgp_fabric, bpf_places, node_objects, physical
from lab.agent_pods import AgentPods, require_image
from lab.apiclient import LabApiClient, LabApiError
from lab.daemonset import NodeHost
from lab.endpointslices import pod_is_ready
from lab.kubeconfig import host_listener, render_kubeconfig
from lab.lab_pods import LabPods
from lab.processes import Processes, process_alive, tail
from lab.service_status import summarize_services
from lab.state import IP_FAMILIES, LabError, LabState, NodeState
from netagent.cniserver import install as cni_install
from netagent.kernel import namespaces, owned
from netagent.kernel.families import IpFamily
from netagent.kernel.pod_attachment import PodAttachment
from netagent.noderoutes.routing.model import Mode
from proxy.backend import PROXY_MODE_CHOICES

CLUSTER_CIDR = ipaddress.ip_network("10.244.0.0/16")
SERVICE_CIDR = ipaddress.ip_network("10.96.0.0/16")  # the lab API server's Service range (its default)
CLUSTER_CIDR6 = ipaddress.ip_network("fd00:10:244::/56")   # node i: fd00:10:244:i::/64
SERVICE_CIDR6 = ipaddress.ip_network("fd00:10:96::/112")
CLUSTER_CIDRS = {IpFamily.V4: CLUSTER_CIDR, IpFamily.V6: CLUSTER_CIDR6}
SERVICE_CIDRS = {IpFamily.V4: SERVICE_CIDR, IpFamily.V6: SERVICE_CIDR6}
API_PORT = 6443
MODES = tuple(mode.value for mode in Mode)  # the backends --backend accepts


def node_pod_cidrs(index: int, families: tuple[IpFamily, ...]) -> list[str]:
    """Node `index`'s podCIDRs, one per family in the cluster's order, as node IPAM allocates a
    pair: the index-th /24 of the IPv4 range and the index-th /64 of the IPv6 one."""
    cidrs = {IpFamily.V4: ipaddress.ip_network(f"10.244.{index}.0/24"),
             IpFamily.V6: list(CLUSTER_CIDR6.subnets(new_prefix=64))[index]}
    return [str(cidrs[family]) for family in families]


class LabCluster(LabPods):
    """Build, drive and remove a lab cluster. Use `create()` or `load()`, then `close()`/`down()`."""

    def __init__(self, state: LabState) -> None:
        self.state = state
        self.processes = Processes(cwd=cni_install.code_root())
        self.agent_pods = AgentPods.for_lab(state, api=self.api) if state.agent_image else None

    # ------------------------------------------------------------ paths
    @property
    def workdir(self) -> str:
        return self.state.workdir

    @property
    def bin_dir(self) -> str:
        return os.path.join(self.workdir, "bin")

    @property
    def api_socket(self) -> str:
        return os.path.join(self.workdir, "api.sock")

    @property
    def api_url(self) -> str:
        return f"http://{physical.router_address(1)}:{API_PORT}"

    def node_dir(self, name: str) -> str:
        return os.path.join(self.workdir, "nodes", name)

    def agent_log(self, name: str) -> str:
        return os.path.join(self.node_dir(name), "agent.log")

    def cni_socket(self, name: str) -> str:
        if self.agent_pods:
            return self.agent_pods.cni_socket(self.node_host(name))
        return os.path.join(self.node_dir(name), "run", "cni.sock")

    def conflist_path(self, name: str) -> str:
        if self.agent_pods:
            return os.path.join(self.agent_pods.conf_dir(self.node_host(name)), cni_install.CONFLIST_NAME)
        return os.path.join(self.node_dir(name), "net.d", cni_install.CONFLIST_NAME)

    def node_host(self, name: str) -> NodeHost:
        node = self._node(name)
        root = self.agent_pods.node_root(name) if self.agent_pods else os.path.join(self.node_dir(name), "root")
        return NodeHost(name=name, netns=node.netns, address=node.address, root=root)

    # ------------------------------------------------------------ life cycle
    @classmethod
    def create(cls, *, nodes: int = 3, mode: str = "vxlan", segments: int = 1, pods_per_node: int = 0,
               auto_encap: str = "vxlan", workdir: str | None = None, prefix: str = "na-lab",
               resync_period: float = 30.0, proxy_mode: str = "iptables",
               network_policy: bool = False, agent_image: str | None = None,
               manifest: str | None = None, pod_status_delay: float = 0.0,
               ip_family: str = "ipv4") -> "LabCluster":
        if mode not in MODES:
            raise LabError(f"mode {mode!r}: choose one of {', '.join(MODES)}")
        if proxy_mode not in PROXY_MODE_CHOICES:
            raise LabError(f"proxy mode {proxy_mode!r}: choose one of {', '.join(PROXY_MODE_CHOICES)}")
        if segments not in (1, 2):
            raise LabError("segments must be 1 or 2")
        if not 1 <= nodes <= 200:
            raise LabError("nodes must be between 1 and 200")
        if ip_family not in IP_FAMILIES:
            raise LabError(f"IP family {ip_family!r}: choose one of {', '.join(IP_FAMILIES)}")
        if ip_family != "ipv4" and (mode == bgp_fabric.MODE or agent_image):
            # the ToRs' fabric is IPv4 (tor_bird.py) and the manifest's --cluster-cidr is IPv4's
            raise LabError(f"--ip-family {ip_family}: the lab builds IPv6 with process agents outside bgp mode "
                           "only (no --agent-image, no --mode bgp)")
        if not 0 <= pod_status_delay <= 600:
            raise LabError("the pod status delay must be between 0 and 600 seconds")
        if agent_image:
            require_image(agent_image)
        prefix = namespaces.unique_name(prefix)
        if workdir is None:
            workdir = tempfile.mkdtemp(prefix=f"{prefix}-")
        os.makedirs(workdir, exist_ok=True)
        state = LabState(prefix=prefix, workdir=workdir, mode=mode, auto_encap=auto_encap, segments=segments,
                         resync_period=resync_period, switch=f"{prefix}-sw", router=f"{prefix}-rtr",
                         internet=f"{prefix}-inet", proxy_mode=proxy_mode, network_policy=network_policy,
                         agent_image=agent_image, manifest=manifest, pod_status_delay=pod_status_delay,
                         ip_family=ip_family)
        lab = cls(state)
        try:
            lab.save()
            physical.build_backbone(switch=state.switch, router=state.router, internet=state.internet,
                                    segments=segments, ipv6=lab.ipv6)
            if lab.fabric:
                lab.fabric.build(cluster_cidr=CLUSTER_CIDR)
            cni_install.install(bin_dir=lab.bin_dir, conf_dir=None, name="netagent", subnets=[],
                                mode=PodAttachment.BRIDGE, bridge=owned.DEFAULT_BRIDGE, mtu=1500, socket_path="",
                                data_dir="", plugin=cni_install.PluginBinary.PYTHON)
            lab._write_kubeconfig()
            lab.start_apiserver()
            lab.start_kubelet()
            if lab.fabric:
                lab.fabric.publish_topology(lab.api())
            for i in range(nodes):
                lab.add_node(segment=(i % segments) + 1, wait=False)
            for name in state.nodes:
                lab.wait_for_agent(name)
            lab.wait_routed()
            for name in list(state.nodes):
                for k in range(pods_per_node):
                    lab.add_pod(f"{name}-pod{k + 1}", node=name)
        except BaseException:
            lab.down()
            raise
        return lab

    @classmethod
    def load(cls, workdir: str) -> "LabCluster":
        path = os.path.join(workdir, "state.json")
        try:
            with open(path) as f:
                return cls(LabState.from_json(json.load(f)))
        except FileNotFoundError:
            raise LabError(f"no lab is up (no {path}); start one with `netagent lab up`") from None

    def save(self) -> None:
        self.state.write()

    def __enter__(self) -> "LabCluster":
        return self

    def __exit__(self, *exc) -> None:
        self.down()

    def down(self) -> None:
        """Stop every process and remove every namespace and file of the lab; safe to repeat."""
        self.stop_kubelet()   # first: it tears its pods down through the agents' CNI
        if self.agent_pods:
            self.agent_pods.remove_all()
        for node in self.state.nodes.values():
            self.processes.kill(None if self.agent_pods else node.agent_pid)
        self.processes.kill(self.state.api_pid)
        if self.fabric:
            self.fabric.down([self.node_dir(name) for name in self.state.nodes])
        if self.ebpf:
            for name in self.state.nodes:
                self._remove_bpf_places(name)
            bpf_places.remove_lab(workdir=self.workdir, prefix=self.state.prefix)
        for pod in self.state.pods.values():
            namespaces.remove(pod.netns)
        for node in self.state.nodes.values():
            namespaces.remove(node.netns)
        for ns in (self.state.switch, self.state.router, self.state.internet):
            namespaces.remove(ns)
        shutil.rmtree(self.workdir, ignore_errors=True)

    def _write_kubeconfig(self) -> None:
        config = render_kubeconfig({"lab": self.api_url})
        with open(os.path.join(self.workdir, "kubeconfig"), "w") as f:
            json.dump(config, f, indent=1)  # JSON is YAML

    def api(self) -> LabApiClient:
        return LabApiClient(unix_path=self.api_socket)

    def start_apiserver(self, *, timeout: float = 180.0) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.api_socket)
        with host_listener(self.state.host_api_port) as host_socket:  # served from the router namespace
            self.state.host_api_port = host_socket.getsockname()[1]
            pid = self.processes.spawn(self.state.router, [
                # with IPv6, one socket on both families (the IPv6-only cluster advertises that one)
                sys.executable, "-m", "lab.apiserver", "--listen",
                f"{'[::]' if self.ipv6 else '0.0.0.0'}:{API_PORT}",
                "--unix", self.api_socket, "--state", os.path.join(self.workdir, "api-state.json"),
                "--endpointslice-controller", "--endpoints-controller", "--listen-fd", str(host_socket.fileno()),
                "--service-cidr", ",".join(self.service_cidrs), "--advertise", self._advertised],
                os.path.join(self.workdir, "apiserver.log"), pass_fds=(host_socket.fileno(),))
        self.state.api_pid = pid
        self.save()
        deadline = time.monotonic() + timeout
        while True:
            if os.path.exists(self.api_socket):
                with contextlib.suppress(Exception):
                    self.api().list("v1", "Node")
                    return
            if not process_alive(pid) or time.monotonic() > deadline:
                raise LabError("the API server did not start:\n" + tail(os.path.join(self.workdir, "apiserver.log")))
            time.sleep(0.05)

    def start_kubelet(self) -> None:
        """The kubelet stand-in (`kubelet.py`): it runs the Pods clients create on the lab's nodes."""
        self.state.kubelet_pid = self.processes.spawn(None, [sys.executable, "-m", "lab.kubelet", "--workdir",
                                                             self.workdir], os.path.join(self.workdir, "kubelet.log"))
        self.save()

    def stop_kubelet(self) -> None:
        from lab.kubelet import stop
        stop(self.processes, self.state)

    @property
    def _advertised(self) -> str:
        """The `default/kubernetes` Service's endpoint: the router's address of the primary family."""
        if self.state.families[0] is IpFamily.V6:
            return f"[{physical.router_address6(1)}]:{API_PORT}"
        return f"{physical.router_address(1)}:{API_PORT}"

    @property
    def host_api_url(self) -> str | None:
        """The API server from the namespace that ran `lab up` (loopback), once started."""
        return f"http://127.0.0.1:{self.state.host_api_port}" if self.state.host_api_port else None

    def stop_apiserver(self, *, sig: int = signal.SIGTERM) -> None:
        self.processes.kill(self.state.api_pid, sig=sig)
        self.state.api_pid = None
        self.save()

    # ------------------------------------------------------------ nodes
    def add_node(self, *, name: str | None = None, segment: int = 1, wait: bool = True) -> NodeState:
        if not 1 <= segment <= self.state.segments:
            raise LabError(f"segment {segment}: this lab has {self.state.segments} segment(s)")
        used = {n.index for n in self.state.nodes.values()}
        index = next(i for i in range(1, 250) if i not in used)
        name = name or f"node-{index}"
        if name in self.state.nodes:
            raise LabError(f"node {name} already exists")
        pod_cidrs = node_pod_cidrs(index, self.state.families)
        node = NodeState(name=name, index=index, segment=segment, netns=f"{self.state.prefix}-n{index}",
                         address="", pod_cidr=pod_cidrs[0], port=f"n{index}", pod_cidrs=pod_cidrs)
        self.state.nodes[name] = node
        self.save()
        node.address = str(physical.plug_node(switch=self.state.switch, node=node.netns, segment=segment,
                                              index=index, port=node.port, ipv6=self.ipv6))
        addresses = [node.address]
        if self.ipv6:
            node.address6 = str(physical.plug_node6(node=node.netns, segment=segment, index=index))
            addresses = [node.address6] if self.state.families == (IpFamily.V6,) else [node.address, node.address6]
        self.api().create(node_objects.render_node(name, segment=segment, pod_cidr=node.pod_cidr,
                                                   address=node.address, pod_cidrs=pod_cidrs,
                                                   addresses=addresses))
        self.start_agent(name, wait=wait)
        if wait:
            self.wait_routed()
        return node

    def wait_routed(self) -> None:
        """bgp mode: until every node routes to every other's pod CIDR (other modes: at once)."""
        if self.fabric:
            bgp_fabric.wait_routed([(node.netns, node.pod_cidr) for node in self.state.nodes.values()])

    def remove_node(self, name: str) -> None:
        node = self._node(name)
        for pod in [p for p in self.state.pods.values() if p.node == name]:
            self.remove_pod(pod.name)
        if self.fabric:   # its BIRD says goodbye first: peers withdraw its routes at once
            bgp_fabric.withdraw_node(node.netns, self.node_dir(name))
        self.stop_agent(name)
        if self.fabric:
            bgp_fabric.kill_node_bird(self.node_dir(name))
        if self.ebpf:
            self._remove_bpf_places(name)
        with contextlib.suppress(Exception):
            self.api().delete("v1", "Node", name)
        namespaces.remove(node.netns)
        del self.state.nodes[name]
        self.save()

    def _node(self, name: str) -> NodeState:
        try:
            return self.state.nodes[name]
        except KeyError:
            raise LabError(f"no node {name} (have: {', '.join(self.state.nodes) or 'none'})") from None

    def agent_argv(self, name: str) -> list:
        directory = self.node_dir(name)
        argv = [sys.executable, "-m", "netagent.cli", "--log-level", "INFO", "run",
                "--kubeconfig", os.path.join(self.workdir, "kubeconfig"), "--node-name", name,
                *[arg for family in self.state.families for arg in (
                    "--cluster-cidr", str(CLUSTER_CIDRS[family]), "--service-cidr", str(SERVICE_CIDRS[family]))],
                "--backend", self.state.mode,
                "--auto-encap", self.state.auto_encap, "--iface", "eth0",
                "--cni-socket", self.cni_socket(name), "--cni-conf-dir", os.path.join(directory, "net.d"),
                "--cni-data-dir", os.path.join(directory, "ipam"),
                # as the DaemonSet: health on every address (the kubelet probes the node's), metrics
                # on loopback only
                "--status-bind", "0.0.0.0:10258", "--metrics-bind-address", "127.0.0.1:10249",
                "--resync-period", str(self.state.resync_period), "--proxy-mode", self.state.proxy_mode]
        if self.ebpf:
            argv += ["--bpf-root", self.bpf_root(name), "--bpf-nodeport-device", "eth0", "--bpf-pod-veths",
                     "--cgroup-root", bpf_places.node_cgroup(self.workdir, self.state.prefix, name)]
        if self.state.network_policy:
            argv.append("--network-policy")
        if self.fabric:
            argv += self.fabric.agent_arguments(directory)
        return argv

    @property
    def fabric(self) -> bgp_fabric.BgpFabric | None:
        """bgp mode: the ToRs (and the agents' BIRDs, which the lab reads and stops)."""
        return bgp_fabric.BgpFabric(self.state, self.processes) if self.state.mode == bgp_fabric.MODE else None

    @property
    def ipv6(self) -> bool:
        """The wires carry IPv6 (an ipv6 or dual lab)."""
        return IpFamily.V6 in self.state.families

    @property
    def service_cidrs(self) -> list[str]:
        """The Service range per family of the cluster, the primary first."""
        return [str(SERVICE_CIDRS[family]) for family in self.state.families]

    @property
    def ebpf(self) -> bool:
        return self.state.proxy_mode == "ebpf"

    def bpf_root(self, name: str) -> str:
        return os.path.join(self.node_dir(name), "bpffs")

    def _remove_bpf_places(self, name: str) -> None:
        bpf_places.remove_node(workdir=self.workdir, prefix=self.state.prefix, node=name, bpf_root=self.bpf_root(name))

    def exec_prefix(self, target: str) -> list:
        """What runs a command as a process of a pod or node (its namespace; in ebpf mode, its cgroup)."""
        return bpf_places.in_cgroup_of(self.state, target, [*namespaces.exec_prefix(self.netns_of(target))])

    def start_agent(self, name: str, *, wait: bool = True) -> None:
        node = self._node(name)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.cni_socket(name))
        if self.agent_pods:
            node.agent_pid = self.agent_pods.start(self.node_host(name))
        else:
            argv = self.agent_argv(name)
            if self.ebpf:
                _, cgroup = bpf_places.ensure_node(workdir=self.workdir, prefix=self.state.prefix, node=name,
                                                   bpf_root=self.bpf_root(name))
                argv = bpf_places.in_cgroup(cgroup, argv)
            node.agent_pid = self.processes.spawn(node.netns, argv, self.agent_log(name))
        self.save()
        if wait:
            self.wait_for_agent(name)

    def wait_for_agent(self, name: str, *, timeout: float = 360.0) -> None:
        """Until the agent serves CNI (it does so only after its first route sync)."""
        node = self._node(name)
        if self.agent_pods:  # and its probes pass
            socket = self.cni_socket(name)
            return self.agent_pods.wait_ready(self.node_host(name), serving=lambda: os.path.exists(socket),
                                              timeout=timeout)
        deadline = time.monotonic() + timeout
        while not os.path.exists(self.cni_socket(name)):
            if not process_alive(node.agent_pid) or time.monotonic() > deadline:
                raise LabError(f"the agent on {name} did not become ready:\n{tail(self.agent_log(name))}")
            time.sleep(0.05)

    def stop_agent(self, name: str, *, sig: int = signal.SIGTERM) -> None:
        node = self._node(name)
        if self.agent_pods:
            self.agent_pods.stop(name, sig=sig)
        else:
            self.processes.kill(node.agent_pid, sig=sig)
        node.agent_pid = None
        self.save()

    def netns_of(self, target: str) -> str:
        """A pod's or node's namespace by name ("internet" and "router" too)."""
        if target in self.state.pods:
            return self.state.pods[target].netns
        if target in self.state.nodes:
            return self.state.nodes[target].netns
        extra = {"internet": self.state.internet, "router": self.state.router, "switch": self.state.switch}
        if target in extra:
            return extra[target]
        raise LabError(f"no pod or node named {target}")

    def exec(self, target: str, argv: list, **kwargs) -> subprocess.CompletedProcess:
        return namespaces.run_in(self.netns_of(target), bpf_places.in_cgroup_of(self.state, target, [], argv),
                                 **kwargs)

    def ping(self, source: str, address: str, *, count: int = 1) -> bool:
        return self.exec(source, ["ping", "-c", str(count), "-W", "2", "-i", "0.2", address]).returncode == 0

    # ------------------------------------------------------------ status
    def status(self) -> dict:
        """Nodes, pods and (from the API server, when it answers) Services with their endpoints."""
        nodes = []
        for node in self.state.nodes.values():
            nodes.append({"name": node.name, "address": node.address, "podCIDR": node.pod_cidr,
                          "podCIDRs": node.pod_cidrs or [node.pod_cidr],
                          **({"address6": node.address6} if node.address6 else {}),
                          "segment": node.segment, "netns": node.netns, "mode": self.state.mode,
                          "agent": {"pid": node.agent_pid, "image": self.state.agent_image,
                                    "running": (self.agent_pods.running(node.name) if self.agent_pods
                                                else process_alive(node.agent_pid)),
                                    "log": self.agent_log(node.name)}})
            if self.fabric:
                nodes[-1]["bgp"] = bgp_fabric.node_status(node.netns, self.node_dir(node.name))
        api_running = process_alive(self.state.api_pid)
        api_error = None
        pod_objects_by_name: dict = {}
        services: list = []
        if api_running:
            try:
                client = self.api()
                for obj in client.list("v1", "Pod"):
                    pod_objects_by_name[(obj["metadata"]["namespace"], obj["metadata"]["name"])] = obj
                services = summarize_services(client.list("v1", "Service"),
                                              client.list("discovery.k8s.io/v1", "EndpointSlice"))
            except (OSError, LabApiError) as error:
                api_error = str(error)
        pods = []
        for p in self.state.pods.values():
            found = pod_objects_by_name.get((p.namespace, p.name))
            pods.append({"name": p.name, "namespace": p.namespace, "node": p.node, "ip": p.ip,
                         "ips": p.ips or [p.ip], "netns": p.netns,
                         "labels": p.labels, "ports": p.ports,
                         "ready": None if found is None else pod_is_ready(found),
                         "terminating": None if found is None else bool(found["metadata"].get("deletionTimestamp"))})
        api_server = {"url": self.api_url, "hostUrl": self.host_api_url, "unixSocket": self.api_socket,
                      "running": api_running, **({"error": api_error} if api_error else {})}
        return {"mode": self.state.mode, "proxyMode": self.state.proxy_mode, "segments": self.state.segments,
                "ipFamily": self.state.ip_family,
                "workdir": self.workdir, "apiServer": api_server,
                "internet": {"netns": self.state.internet, "address": str(physical.INTERNET_HOST),
                             **({"address6": str(physical.INTERNET6_HOST)} if self.ipv6 else {})},
                "nodes": nodes, "pods": pods, "services": services,
                **({"tors": self.fabric.sessions()} if self.fabric else {})}


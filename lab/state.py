"""What a lab is made of, as saved in `<workdir>/state.json`: nodes, pods, the shared namespaces.

Plain dataclasses that round-trip through JSON, so `netagent lab up` can build a lab and
later commands (another process) can load, drive and remove it.
"""
from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass, field

from netagent.kernel.families import IpFamily

# `lab up --ip-family`: the families of pods and Services, the primary first (dual: IPv4 first,
# as most dual-stack clusters are configured)
IP_FAMILIES = {"ipv4": (IpFamily.V4,), "ipv6": (IpFamily.V6,), "dual": (IpFamily.V4, IpFamily.V6)}


class LabError(Exception):
    """The lab could not do what was asked; the message says why."""


@dataclass
class NodeState:
    name: str
    index: int
    segment: int
    netns: str
    address: str
    pod_cidr: str
    port: str                      # its cable's end in the switch namespace
    agent_pid: int | None = None
    address6: str = ""             # its IPv6 underlay address (labs with IPv6)
    pod_cidrs: list = field(default_factory=list)  # spec.podCIDRs, one per family (pod_cidr: the first)


@dataclass
class PodState:
    name: str
    node: str
    netns: str
    container_id: str
    ip: str
    labels: dict = field(default_factory=dict)
    ifname: str = "eth0"
    namespace: str = "default"
    ports: dict = field(default_factory=dict)  # container port name -> [number, protocol]
    ips: list = field(default_factory=list)    # one address per family of the cluster (ip: the first)


@dataclass
class LabState:
    prefix: str
    workdir: str
    mode: str
    auto_encap: str
    segments: int
    resync_period: float
    switch: str
    router: str
    internet: str
    api_pid: int | None = None
    kubelet_pid: int | None = None    # the kubelet stand-in (`kubelet.py`): runs the Pods API clients create
    host_api_port: int | None = None  # the API server's loopback port in the namespace that ran `lab up`
    proxy_mode: str = "iptables"
    network_policy: bool = False   # the agents run with --network-policy
    agent_image: str | None = None  # agents run from this image as deploy/netagent.yaml says
    manifest: str | None = None     # the DaemonSet manifest they run from
    pod_status_delay: float = 0.0   # the lab's kubelet reports a pod's address this long after its ADD
    ip_family: str = "ipv4"         # ipv4, ipv6 or dual: the families of pods and Services
    nodes: dict = field(default_factory=dict)   # name -> NodeState
    pods: dict = field(default_factory=dict)    # name -> PodState
    tors: dict = field(default_factory=dict)    # bgp mode: segment -> its ToR (bgp_fabric.TorState's fields)
    kubernetes: dict | None = None  # `lab up --kubernetes`: its processes (kubernetes/cluster.py's KubernetesState)

    @property
    def families(self) -> tuple[IpFamily, ...]:
        return IP_FAMILIES[self.ip_family]

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    def write(self) -> None:
        """`<workdir>/state.json`, replaced atomically (a later command loads it)."""
        path = os.path.join(self.workdir, "state.json")
        with open(path + ".tmp", "w") as f:
            json.dump(self.to_json(), f, indent=1)
        os.replace(path + ".tmp", path)

    @classmethod
    def from_json(cls, data: dict) -> "LabState":
        data = dict(data)
        data["nodes"] = {k: NodeState(**v) for k, v in data["nodes"].items()}
        data["pods"] = {k: PodState(**v) for k, v in data["pods"].items()}
        return cls(**data)

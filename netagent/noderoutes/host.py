"""What `NodeAgent` reaches outside itself, handed to it rather than built by it.

- `HostAccess`: the node's kernel. Netlink through the `RoutingKernel` (devices, routes,
  neighbours, FDB, and the links/addresses/default routes the underlay is chosen from),
  sysctls, the iptables runners masquerade writes through (`iptables`, one per family: the
  `IpFamily.V6` one, ip6tables, with an IPv6 cluster CIDR; or, in nftables mode, the `Nft`
  it writes through instead), and the kernel release that
  `ChecksumOffloadPolicy.AUTO` decides by.
- `NodeApi`: the API server as the agent uses it: one Node watch, and annotating its own
  Node. `KubeNodeApi` is the real one (a `Reflector` and a merge patch on `nodes/status`);
  `fake_api.FakeNodeApi` keeps Nodes in memory for unit tests.
- `Lease`: what this node was given (its pod CIDRs) and what pods on it must use (the MTU),
  passed to the agent's `on_lease` once it is known. Node routing does not know what the
  lease is for; the daemon wires it to the CNI config (`cniserver/install.py`).

`Masquerade` and `ChecksumOffloadPolicy` are the two flags that decide how the host is used.

The daemon passes the real ones (`NetlinkKernel`, `ProcSysctls`, `IptablesRunner`,
`KubeNodeApi`); unit tests the fakes, so `NodeAgent.start()` runs without root or a cluster.
"""
from __future__ import annotations

import abc
import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from ipaddress import IPv4Network, IPv6Network
from typing import TYPE_CHECKING, Protocol

from netagent.kernel.families import IpFamily
from netagent.kernel.iptables.runner import Iptables
from netagent.kernel.nftables.runner import Nft
from netagent.kernel.sysctl import Sysctls
from netagent.kube.reflector import EventHandler
from netagent.noderoutes.routing.model import RoutingKernel

if TYPE_CHECKING:
    from netagent.noderoutes.bgp.speaker import BgpSpeaker


class Masquerade(enum.Enum):
    """`--masquerade`: whether pod traffic leaving the cluster CIDR is masqueraded."""
    ON = "on"
    OFF = "off"


class ChecksumOffloadPolicy(enum.Enum):
    """`--vxlan-checksum-offload`: the VXLAN device's `ChecksumOffload`, fixed or decided at
    start from the kernel release and whether the node is behind NAT (`auto_checksum_offload`)."""
    AUTO = "auto"
    ON = "on"
    OFF = "off"


@dataclass(frozen=True)
class Lease:
    node_name: str
    pod_cidrs: tuple[IPv4Network | IPv6Network, ...]
    mtu: int  # the pods' MTU: the underlay's less the worst encapsulation (`pod_mtu`)


@dataclass(frozen=True)
class HostAccess:
    kernel: RoutingKernel  # netlink: devices, routes, neighbours, FDB, and the underlay snapshot
    sysctls: Sysctls
    # masquerade's (and the tunnel filter's) runner of each routed family; empty only with
    # Masquerade.OFF or with `nft`
    iptables: Mapping[IpFamily, Iptables] = field(default_factory=dict)
    nft: Nft | None = None            # nftables mode: masquerade in our nft table (masquerade_nft.py)
    kernel_release: str = ""          # `os.uname().release`; read by ChecksumOffloadPolicy.AUTO only
    bgp: BgpSpeaker | None = None     # --backend bgp: BIRD and the routes it learnt (noderoutes/bgp/)


class NodeStore(Protocol):
    def get(self, key: str) -> dict | None: ...

    def keys(self) -> list[str]: ...


class SyncedFlag(Protocol):
    def wait(self, timeout: float | None = None) -> bool: ...


class NodeWatch(Protocol):
    """What the agent uses of a `Reflector` over Nodes (its metrics also read `resource` and `stats`)."""

    @property
    def store(self) -> NodeStore: ...

    @property
    def synced(self) -> SyncedFlag: ...

    def start(self) -> None: ...

    def stop(self) -> None: ...


class NodeApi(abc.ABC):
    @abc.abstractmethod
    def watch(self, handler: EventHandler) -> NodeWatch:
        """A Node list+watch delivering to `handler`, not yet started."""

    @abc.abstractmethod
    def annotate(self, node_name: str, annotations: Mapping[str, str]) -> None:
        """Set these annotations on the Node (raises when the API refuses or is unreachable)."""


class KubeNodeApi(NodeApi):
    def __init__(self, api_client) -> None:
        self.api_client = api_client

    def watch(self, handler: EventHandler) -> NodeWatch:
        from netagent.kube.reflector import Reflector
        from netagent.kube.resources import NODES
        return Reflector(api_client=self.api_client, resource=NODES, handler=handler)

    def annotate(self, node_name: str, annotations: Mapping[str, str]) -> None:
        from netagent.kube.nodes import patch_node_annotations
        patch_node_annotations(self.api_client, node_name, annotations)

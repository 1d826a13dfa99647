"""A NodeAgent wired to fakes for unit tests: Nodes in `FakeNodeApi`, the kernel in `FakeKernel`,
sysctls in `FakeSysctls`, masquerade in `FakeIptables`.

Everything the agent does runs for real over them: its start-up steps (lease, underlay,
forwarding, announcement, the lease report), `read_peer`, the planner, the `RouteManager` and
the rejection bookkeeping. The local node is node-1 (198.18.16.11 on 198.18.16.0/20, pod CIDR
10.244.1.0/24) in a cluster of 10.244.0.0/16 with the Service range 10.96.0.0/16, as the lab's.
"""
from __future__ import annotations

import json
from collections.abc import Iterable
from ipaddress import IPv4Address, IPv4Network

from netagent.infra.metrics import Registry
from netagent.infra.rejections import RejectionScope, Rejections
from netagent.infra.sync_runner import SyncKind
from netagent.kernel.families import IpFamily
from netagent.kernel.fake_sysctl import FakeSysctls
from netagent.kernel.iptables.fake import FakeIptables
from netagent.kernel.sysctl import IP_FORWARD
from netagent.noderoutes import node_objects as nodes
from netagent.noderoutes.agent import AgentSettings, NodeAgent
from netagent.noderoutes.fake_api import FakeNodeApi
from netagent.noderoutes.host import HostAccess, Lease, Masquerade
from netagent.noderoutes.routing.fake_kernel import FakeKernel
from netagent.noderoutes.routing.model import Mode, Route, RoutingSettings
from netagent.noderoutes.routing.vxlan import vtep_mac

CLUSTER = IPv4Network("10.244.0.0/16")
SERVICES = IPv4Network("10.96.0.0/16")
UNDERLAY = IPv4Network("198.18.16.0/20")
LOCAL_NAME = "node-1"
LOCAL_IP = IPv4Address("198.18.16.11")
LOCAL_CIDR = IPv4Network("10.244.1.0/24")


def node(name: str, index: int, *, created: str = "2026-01-01T00:00:00Z", mac: str | None = "derive",
         public_ip: str | None = None, cidr: str | None = None, uid: str | None = None) -> dict:
    """A Node as a healthy agent leaves it: lease, announcement, creation time and uid."""
    data = {"vtepMAC": vtep_mac(name) if mac == "derive" else mac} if mac is not None else {}
    notes = nodes.render_announcement(backend_type="vxlan", public_ip=public_ip or f"198.18.16.{10 + index}",
                                      backend_data=data)
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "uid": uid or f"uid-{name}", "creationTimestamp": created,
                         "annotations": notes},
            "spec": {"podCIDR": cidr or f"10.244.{index}.0/24", "podCIDRs": [cidr or f"10.244.{index}.0/24"]}}


class AgentWorld:
    """One NodeAgent over the fakes, not started. The API (`FakeNodeApi`) holds `nodes` (by default
    this node's own, leased and announced); the kernel (`FakeKernel`) has lo, eth0 (the underlay,
    with the default route) and the CNI bridge na0; ip_forward is off (`FakeSysctls`); masquerade
    writes to `FakeIptables`; every lease the agent reports is appended to `leases`."""

    def __init__(self, *, mode: Mode = Mode.VXLAN, rejections: RejectionScope | None = None,
                 masquerade: Masquerade = Masquerade.OFF, nodes: Iterable[dict] | None = None,
                 lease_timeout: float = 0.0) -> None:
        self.rejections = rejections or Rejections().scope("noderoutes")
        settings = AgentSettings(node_name=LOCAL_NAME, cluster_cidrs=(CLUSTER,), service_cidrs=(SERVICES,),
                                 routing=RoutingSettings(mode=mode), masquerade=masquerade,
                                 lease_timeout=lease_timeout, resync_interval=3600.0)
        self.kernel = FakeKernel()
        self.kernel.add_link("lo", kind="loopback", addresses=("127.0.0.1/8",), mtu=65536)
        self.kernel.add_link("eth0", addresses=(f"{LOCAL_IP}/{UNDERLAY.prefixlen}",))
        self.kernel.add_link("na0", kind="bridge", addresses=("10.244.1.1/24",))
        self.kernel.add_foreign_route(Route(dst=IPv4Network("0.0.0.0/0"), gateway=IPv4Address("198.18.16.1"),
                                            ifname="eth0", onlink=False))
        self.sysctls = FakeSysctls({IP_FORWARD.key: "0"})
        self.iptables = FakeIptables()
        self.api = FakeNodeApi()
        for obj in (node(LOCAL_NAME, 1),) if nodes is None else nodes:
            self.api.put(obj)
        self.leases: list[Lease] = []
        host = HostAccess(kernel=self.kernel, sysctls=self.sysctls, iptables={IpFamily.V4: self.iptables},
                          kernel_release="6.12.0-1-amd64")
        self.agent = NodeAgent(settings, api=self.api, host=host, registry=Registry(), rejections=self.rejections,
                               on_lease=self.leases.append)

    def put(self, obj, *, key: str | None = None) -> bool:
        """Store `obj` under `key` (its name by default); the watch tells the agent's recorder. False
        when the recorder could not key the object (no usable metadata.name: only a full sync, which
        reads every stored key, sees it)."""
        try:
            self.api.put(obj, key=key or obj["metadata"]["name"])
        except (TypeError, KeyError, AttributeError, ValueError):  # ValueError: kube.resources.object_key
            return False
        return True

    def delete(self, name: str) -> bool:
        """Remove the Node stored under `name`; False as for `put`."""
        try:
            self.api.delete(name)
        except (TypeError, KeyError, AttributeError, ValueError):  # ValueError: kube.resources.object_key
            return False
        return True

    def overlay_routes(self) -> dict[IPv4Network, object]:
        """Our routes by destination."""
        return {route.dst: route for route in self.kernel.dump_routes()}

    def rejected(self) -> dict[str, str]:
        """Rejected Node name -> reason label."""
        return {r.ref.name: r.reason for r in self.rejections.snapshot()}


class AgentHarness(AgentWorld):
    """The agent as `start()` leaves it before its runner's first sync (`prepare()` done);
    `sync` runs one sync on the caller's thread, as the runner would on its own."""

    def __init__(self, **world) -> None:
        super().__init__(**world)
        self.agent.prepare()

    def sync(self, kind: SyncKind = SyncKind.PARTIAL) -> None:
        """A route sync, then the tunnel filter's run it asks for (their runners' threads, in order)."""
        self.agent._sync(kind)
        self.agent.filter_loop.sync(kind)


def announcement_json(data: object) -> str:
    return json.dumps(data, separators=(",", ":"))

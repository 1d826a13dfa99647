"""A NodeAgent wired to fakes for unit tests: Nodes in a plain store, routes in `FakeKernel`.

`start()` needs an API server, netlink and iptables; these tests drive what it builds instead:
the agent's `_sync` over a reflector-shaped store, the real `RouteManager` over
`routing/fake_kernel.py`, and the real `read_peer`, planner and rejection bookkeeping. The
local node is node-1 (198.18.16.11 on 198.18.16.0/20, pod CIDR 10.244.1.0/24) in a cluster
of 10.244.0.0/16 with the Service range 10.96.0.0/16, as the lab's.
"""
from __future__ import annotations

import ipaddress
import json
from ipaddress import IPv4Address, IPv4Network

from netagent.infra.metrics import Registry
from netagent.infra.rejections import RejectionScope, Rejections
from netagent.infra.sync_runner import SyncKind
from netagent.noderoutes import node_objects as nodes
from netagent.noderoutes.agent import AgentSettings, NodeAgent, own_networks
from netagent.noderoutes.routing.fake_kernel import FakeKernel
from netagent.noderoutes.routing.model import Mode, RoutingSettings
from netagent.noderoutes.routing.vxlan import vtep_mac
from netagent.noderoutes.underlay import InterfaceInfo, Underlay, UnderlaySnapshot

CLUSTER = IPv4Network("10.244.0.0/16")
SERVICES = IPv4Network("10.96.0.0/16")
UNDERLAY = IPv4Network("198.18.16.0/20")
LOCAL_NAME = "node-1"
LOCAL_IP = IPv4Address("198.18.16.11")
LOCAL_CIDR = IPv4Network("10.244.1.0/24")


class FakeStore:
    """The two calls the agent makes on a reflector's store."""

    def __init__(self) -> None:
        self.objects: dict[str, object] = {}

    def get(self, key: str):
        return self.objects.get(key)

    def keys(self) -> list[str]:
        return list(self.objects)


class FakeReflector:
    def __init__(self) -> None:
        self.store = FakeStore()


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


class AgentHarness:
    """One NodeAgent as `start()` leaves it, over fakes; `put`/`delete` change Nodes and poke the
    recorder as the reflector would; `sync` runs one sync as the runner would."""

    def __init__(self, *, mode: Mode = Mode.VXLAN, rejections: RejectionScope | None = None) -> None:
        self.rejections = rejections or Rejections().scope("noderoutes")
        settings = AgentSettings(node_name=LOCAL_NAME, cluster_cidrs=(CLUSTER,), service_cidrs=(SERVICES,),
                                 routing=RoutingSettings(mode=mode), masquerade=False)
        self.kernel = FakeKernel()
        self.kernel.add_link("eth0", addresses=(f"{LOCAL_IP}/{UNDERLAY.prefixlen}",))
        self.agent = NodeAgent(settings, api_client=None, kernel=self.kernel, iptables_runner=None,
                               registry=Registry(), rejections=self.rejections)
        self.reflector = FakeReflector()
        self.agent.reflector = self.reflector  # type: ignore[assignment]
        self.agent.pod_cidrs = (LOCAL_CIDR,)
        self.agent.host_networks = own_networks(UnderlaySnapshot(
            interfaces=(InterfaceInfo(name="lo", index=1, mtu=65536,
                                      addresses=(ipaddress.IPv4Interface("127.0.0.1/8"),)),
                        InterfaceInfo(name="eth0", index=2, mtu=1500,
                                      addresses=(ipaddress.IPv4Interface(f"{LOCAL_IP}/20"),)),
                        InterfaceInfo(name="na0", index=3, mtu=1500,
                                      addresses=(ipaddress.IPv4Interface("10.244.1.1/24"),))),
            default_route_ifindexes=(2,)))
        underlay = Underlay(ifname="eth0", mtu=1500, public_ip=LOCAL_IP, network=UNDERLAY, reason="test")
        route_manager, _ = self.agent._build_managers(underlay)
        self.agent.route_manager = route_manager
        backend = route_manager.ensure_local()
        self.own = node(LOCAL_NAME, 1)
        self.agent._announcement = nodes.render_announcement(backend_type=mode.value, public_ip=LOCAL_IP,
                                                             backend_data=backend)
        self.reflector.store.objects[LOCAL_NAME] = self.own

    def put(self, obj, *, key: str | None = None) -> bool:
        """Store `obj` under `key` (its name by default) and record the change; False when the
        change recorder could not key the object (no usable metadata.name: only a full sync,
        which reads every stored key, sees it)."""
        name = key or obj["metadata"]["name"]
        old = self.reflector.store.objects.get(name)
        self.reflector.store.objects[name] = obj
        try:
            if old is None:
                self.agent.tracker.on_add(obj)
            else:
                self.agent.tracker.on_update(old, obj)
        except (TypeError, KeyError, AttributeError, ValueError):  # ValueError: kube.resources.object_key
            return False
        return True

    def delete(self, name: str) -> bool:
        """Remove the Node stored under `name`; False as for `put`."""
        try:
            self.agent.tracker.on_delete(self.reflector.store.objects.pop(name))
        except (TypeError, KeyError, AttributeError, ValueError):  # ValueError: kube.resources.object_key
            return False
        return True

    def sync(self, kind: SyncKind = SyncKind.PARTIAL) -> None:
        self.agent._sync(kind)

    def overlay_routes(self) -> dict[IPv4Network, object]:
        """Our routes by destination."""
        return {route.dst: route for route in self.kernel.dump_routes()}

    def rejected(self) -> dict[str, str]:
        """Rejected Node name -> reason label."""
        return {r.ref.name: r.reason for r in self.rejections.snapshot()}


def announcement_json(data: object) -> str:
    return json.dumps(data, separators=(",", ":"))

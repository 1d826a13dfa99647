"""The status page's values, read where the status commands read them: `/status` and `/` on the
agent's metrics address, and `netagent status html [--html FILE]`.

No reading of its own: each section is one existing reader's answer, turned into
status_html.py's rows. Routing peers are the kernel's routes of our protocol (the
`NetlinkKernel` node routing writes them with), named after the Node whose pod CIDR they
lead to when the agent's Node watch knows it; Services are `/services`' listing (in the
agent: its proxies' `programmed()`, the kernel read back with names; from the command:
status_services.py, the agent first, else the kernel); pods and their policy are
status_policy.py's read of the kernel; BGP sessions status_bgp.py's. Each section is read
alone and a reader that fails costs only its section (its error shows there), so the page
answers while the node is half-broken. The agent's page is a `Snapshot` like its other pages:
read at most once a second whatever the readers do.
"""
from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from netagent import __version__
from netagent.daemon.status_html import (CONTENT_TYPE, BgpRow, PodRow, PolicyRow, RouteRow, Section, ServiceRow,
                                         StatusPage, render_index, render_page)
from netagent.kernel.families import IpFamily
from netagent.kernel.iptables.backend import BackendChoice

if TYPE_CHECKING:
    from proxy.backend import ProxyMode


def guarded(read: Callable[[], Section]) -> Section:
    """A section's reader, its failure shown in the section instead of failing the page."""
    try:
        return read()
    except Exception as error:   # any reader's (OSError, NetagentError, a parse error): the page still answers
        return Section(error=f"{type(error).__name__}: {error}")


# ------------------------------------------------------------------ sections
def peer_routes(names: Mapping[str, str]) -> Section:
    """Our routes in the main table, both families, each named by `names` (pod CIDR -> Node)."""
    from netagent.noderoutes.routing.kernel import NetlinkKernel
    with NetlinkKernel() as kernel:
        routes = [route for family in IpFamily for route in kernel.dump_routes(family)]
    rows = [RouteRow(destination=str(r.dst), via=str(r.gateway or r.encap_dst or ""), device=r.ifname,
                     node=names.get(str(r.dst), "")) for r in routes]
    return Section(rows=tuple(sorted(rows, key=lambda r: (r.node == "", r.node, r.destination))))


def services_section(listing: Mapping) -> Section:
    """`/services`' listing (status_services.py's shape) as rows."""
    if listing.get("mode") is None:
        return Section(off="no service proxy rules on this node")
    return Section(rows=tuple(ServiceRow(name=str(s["name"]), kind=str(s["kind"]), address=str(s["address"]),
                                         backends=tuple(map(str, s["backends"])))
                              for s in sorted(listing["services"], key=lambda s: (s["name"], s["address"]))))


def pods_section(iptables_backend: BackendChoice) -> Section:
    """Every programmed pod of this node and the policies isolating it (status_policy.py's read)."""
    from netagent.daemon.status_policy import read_kernel
    local: dict[str, str] = {}
    chains: dict[str, list] = {}
    for kernel, _ in read_kernel(iptables_backend).values():
        local.update(kernel.local)
        for chain in kernel.pods:
            local.setdefault(chain.pod, chain.ip)
            chains.setdefault(chain.pod, []).append(PolicyRow(
                direction=chain.direction, policies=tuple(chain.policies), allows=tuple(chain.describe_allows()),
                denied_packets=chain.denied_packets))
    return Section(rows=tuple(PodRow(pod=pod, address=ip, isolated=tuple(chains.get(pod, ())))
                              for pod, ip in sorted(local.items())))


def bgp_section(state_dir: str) -> Section:
    from netagent.daemon.status_bgp import bgp_status
    return Section(rows=tuple(BgpRow(peer=s.neighbor or s.name, asn=str(s.neighbor_as or "?"),
                                     state=s.bgp_state or s.state, since=s.since, imported=s.imported,
                                     exported=s.exported, last_error=s.last_error)
                              for s in bgp_status(state_dir=state_dir)))


def _now() -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())


# ------------------------------------------------------------------ `netagent status html`
def kernel_page(*, node: str, iptables_backend: BackendChoice = BackendChoice.AUTO, bpf_root: str | None = None,
                bgp_state_dir: str) -> str:
    """The page from what this node's kernel holds (Services: the running agent first, as
    `netagent status services`); BGP when our BIRD's control socket is there."""
    from netagent.daemon.status_services import status_services
    from netagent.noderoutes.bgp.supervisor import SOCKET_NAME
    listing: dict = {}

    def services() -> Section:
        listing.update(json.loads(status_services(iptables_backend=iptables_backend, as_json=True,
                                                  bpf_root=bpf_root)))
        return services_section(listing)
    service_rows = guarded(services)
    bgp_on = os.path.exists(os.path.join(bgp_state_dir, SOCKET_NAME))
    page = StatusPage(
        node=node, source="the kernel (netagent status html)", generated=_now(),
        facts=(("netagent", __version__), ("proxy mode", str(listing.get("mode") or "none")),
               ("Services read by", str(listing.get("source", "-")))),
        peers=guarded(lambda: peer_routes({})), services=service_rows,
        pods=guarded(lambda: pods_section(iptables_backend)),
        bgp=guarded(lambda: bgp_section(bgp_state_dir)) if bgp_on else
        Section(off=f"BGP is not running here (no control socket in {bgp_state_dir})"))
    return render_page(page)


# ------------------------------------------------------------------ the agent's pages
@dataclass
class AgentSources:
    """What the running agent's page reads; run.py fills `agent` and `proxies` once built (the
    metrics server, which holds the page, is built before them)."""
    node_name: str
    routing_mode: str
    proxy_mode: ProxyMode | None
    policy_on: bool
    bgp_state_dir: str | None          # None: BGP off
    iptables_backend: BackendChoice
    agent: object | None = None        # the NodeAgent: its Node watch names the peers
    proxies: Sequence = ()             # the ServiceProxy of each family

    def peer_names(self) -> dict[str, str]:
        """Pod CIDR -> Node name, from the agent's Node watch (read only)."""
        from netagent.noderoutes.node_objects import pod_cidr_strings
        store = getattr(getattr(self.agent, "reflector", None), "store", None)
        names: dict[str, str] = {}
        for node in store.list() if store is not None else ():
            metadata = node.get("metadata") if isinstance(node, dict) else None   # untrusted: checked at each level
            name = metadata.get("name") if isinstance(metadata, dict) else None
            for cidr in pod_cidr_strings(node):
                if isinstance(name, str) and isinstance(cidr, str):
                    names.setdefault(cidr, name)
        return names

    def services(self) -> Section:
        from netagent.daemon.status_services import services_json
        return services_section(json.loads(services_json(
            self.proxy_mode, [s for p in self.proxies for s in p.backend.programmed()])))

    def page(self) -> str:
        pod_cidrs: Iterable = getattr(self.agent, "pod_cidrs", ())
        mode = self.proxy_mode.value if self.proxy_mode is not None else "none"
        bgp_state_dir = self.bgp_state_dir
        return render_page(StatusPage(
            node=self.node_name, source="the running agent", generated=_now(),
            facts=(("netagent", __version__), ("pod CIDRs", ", ".join(map(str, pod_cidrs)) or "not leased yet"),
                   ("routing", self.routing_mode), ("proxy mode", mode),
                   ("network policy", "on" if self.policy_on else "off"),
                   ("BGP", "on" if self.bgp_state_dir else "off")),
            peers=guarded(lambda: peer_routes(self.peer_names())),
            services=guarded(self.services) if self.proxy_mode is not None else
            Section(off="the service proxy is off (--proxy-mode none)"),
            pods=guarded(lambda: pods_section(self.iptables_backend)) if self.policy_on else
            Section(off="network policy is off on this node (--network-policy)"),
            bgp=guarded(lambda: bgp_section(bgp_state_dir)) if bgp_state_dir else
            Section(off="BGP is off on this node")))

    def pages(self) -> dict[str, tuple[str, Callable[[], str]]]:
        """The metrics server's `/status` and `/` (a StatusServer snapshots each)."""
        return {"/status": (CONTENT_TYPE, self.page), "/": (CONTENT_TYPE, render_index)}

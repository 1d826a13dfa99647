"""`netagent status services`: what the service proxy has programmed on this node.

The addresses and backends are always read back from the kernel (iptables rules, IPVS
virtual servers, the nftables proxy's `ip netagent` table, or the eBPF maps pinned under
`--bpf-root`), never taken from what the agent meant to write. The running agent is
asked first (`/services` on its metrics address, 127.0.0.1:10249), because it reads the
kernel too and also knows every service's name: IPVS keeps no names, and iptables and
nftables keep them only as comments. When no agent answers, the kernel is read here, so the command
still works while the agent is down (IPVS entries are then unnamed). `--json` prints
`{"mode", "source", "services": [{"name", "address", "kind", "backends"}]}`.

Both families are listed (an IPv6 address as `[addr]:port`): the agent lists every family's
proxy, and the kernel read takes ip6tables (or the IPv6 form of the mode's backend, where
this build has one) beside IPv4.
"""
from __future__ import annotations

import json
import urllib.error
import urllib.request
from dataclasses import asdict
from typing import TYPE_CHECKING

from netagent.kernel.iptables.backend import BackendChoice

if TYPE_CHECKING:
    from proxy.backend import ProxyMode

AGENT_URL = "http://127.0.0.1:10249/services"


def services_json(mode: ProxyMode | None, services) -> str:
    """The `/services` page: the proxy mode (None when nothing is programmed) and its services."""
    return json.dumps({"mode": mode.value if mode is not None else None, "services": [asdict(s) for s in services]})


def _from_agent(url: str) -> dict | None:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return {**json.loads(response.read()), "source": "agent"}
    except (OSError, urllib.error.URLError, ValueError):
        return None


def _from_kernel(iptables_backend: BackendChoice, bpf_root: str | None = None) -> dict:
    from netagent.kernel.families import IpFamily
    from netagent.kernel.iptables.backend import resolve_backend
    from proxy.backend import ProxyMode
    from proxy.ebpf.backend import EbpfPaths
    from proxy.factory import BackendConfigError, build_backend, build_ebpf_backend, iptables_families, programmed_mode, spec_for
    backend_choice = resolve_backend(iptables_backend, family=IpFamily.V4)
    mode = programmed_mode(iptables_backend=backend_choice, bpf_root=bpf_root)
    if mode is ProxyMode.EBPF and bpf_root:
        services = []
        for family in IpFamily:   # one map set per family, pinned side by side
            try:
                services += build_ebpf_backend(EbpfPaths(bpf_root=bpf_root, cgroup="-"), load=False,
                                               family=family).programmed()
            except LookupError:   # maps pinned by an agent from before IPv6: IPv4's only
                pass
    elif mode is ProxyMode.IPTABLES:
        services = [service for family in iptables_families(iptables_backend=backend_choice)
                    for service in build_backend(spec_for(mode, iptables_backend=backend_choice), family=family).programmed()]
    else:
        services = [] if mode is None else build_backend(spec_for(mode, iptables_backend=backend_choice)).programmed()
        if mode in (ProxyMode.NFTABLES, ProxyMode.IPVS):
            from netagent.kernel.iptables.backend import IptablesNotInstalled
            try:
                services += build_backend(spec_for(mode, iptables_backend=backend_choice), family=IpFamily.V6).programmed()
            except (BackendConfigError, IptablesNotInstalled):   # no IPv6 form of it here: nothing of it programmed
                pass
    return {**json.loads(services_json(mode, services)), "source": "kernel"}


def status_services(*, iptables_backend: BackendChoice = BackendChoice.AUTO, as_json: bool = False, agent_url: str = AGENT_URL,
                    bpf_root: str | None = None) -> str:
    listing = _from_agent(agent_url) or _from_kernel(iptables_backend, bpf_root)
    if as_json:
        return json.dumps(listing, indent=2)
    if listing["mode"] is None:
        return "no service proxy rules on this node"
    services = listing["services"]
    lines = [f"mode: {listing['mode']} (read by the {listing['source']}), {len(services)} service address(es)"]
    width = max((len(s["name"]) for s in services), default=0)
    for service in services:
        backends = ", ".join(service["backends"]) or "no endpoints (rejects)"
        lines.append(f"{service['name']:<{width}}  {service['kind']:<12} {service['address']:<24} -> {backends}")
    return "\n".join(lines)

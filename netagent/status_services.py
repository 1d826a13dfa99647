"""`netagent status services`: what the service proxy has programmed on this node, read back.

It reads the kernel (iptables rules, or IPVS virtual servers), not the agent's memory, so it
answers the question an operator has when traffic misbehaves ("what does the node really
do with this address?") even while the agent is down. The mode is whichever backend's
objects exist here; `--json` prints `{"mode", "services": [{"name", "address", "kind",
"backends"}]}`.
"""
from __future__ import annotations

import json
from dataclasses import asdict

from netagent.iptables.backend import IpFamily, resolve_backend
from proxy.factory import build_backend, programmed_mode


def status_services(*, iptables_backend: str = "auto", as_json: bool = False) -> str:
    backend_choice = resolve_backend(iptables_backend, family=IpFamily.V4)
    mode = programmed_mode(iptables_backend=backend_choice)
    services = [] if mode is None else build_backend(mode, iptables_backend=backend_choice).programmed()
    if as_json:
        return json.dumps({"mode": mode.value if mode else None, "services": [asdict(s) for s in services]},
                          indent=2)
    if mode is None:
        return "no service proxy rules on this node"
    lines = [f"mode: {mode.value}, {len(services)} service address(es)"]
    width = max((len(s.name) for s in services), default=0)
    for service in services:
        backends = ", ".join(service.backends) or "no endpoints (rejects)"
        lines.append(f"{service.name:<{width}}  {service.kind:<12} {service.address:<24} -> {backends}")
    return "\n".join(lines)

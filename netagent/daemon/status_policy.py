"""`netagent status policy [POD] [--trace FROM TO PORT[/PROTO]]`: the policy state of this
node's pods and the tracer's answer, read from the kernel (policy/readback.py says why).

One `iptables-save -c -t filter` (counters: packets each pod's DROP has denied) and one
`ipset save`, or, when the node holds the nft policy table (`--proxy-mode nftables`), one
listing of that table (policy/readback_nft.py, into the same values); works while the agent
is down. POD is `ns/name`, a bare name or an address
of a pod of this node, isolated or open (the policy engine's pod directory names them all);
the tracer's FROM and TO are the same, or any address (a pod of another node, the outside).
"""
from __future__ import annotations

import ipaddress
import json
from typing import TYPE_CHECKING

from netagent.errors import NetagentError
from netagent.policy.readback import KernelPolicy, Packet, parse_kernel_policy, trace

if TYPE_CHECKING:
    from netagent.kernel.iptables.runner import Iptables


class StatusPolicyError(NetagentError, ValueError):
    """An unknown pod, or a trace's PORT/PROTO that does not parse."""


def read_policy_rules(iptables: Iptables) -> KernelPolicy:
    """The policy chains with their counters (`iptables-save -c -t filter`, through the runner)."""
    return parse_kernel_policy(iptables.save("filter", counters=True))


def read_nft() -> tuple[KernelPolicy, dict[str, frozenset[str]]] | None:
    """The nft policy table read back, or None when this node has none (or no libnftables)."""
    from netagent.kernel.nftables.runner import NftError, NftRunner
    from netagent.policy.readback_nft import parse_nft_policy
    from netagent.policy.render_nft import IPV4, TABLE
    try:
        nft = NftRunner()
    except NftError:
        return None
    try:
        objects = nft.list_table(IPV4.name, TABLE)
    finally:
        nft.close()
    return None if objects is None else parse_nft_policy(objects)


def read_kernel(iptables_backend: str) -> tuple[KernelPolicy, dict[str, frozenset[str]]]:
    found = read_nft()
    if found is not None:
        return found
    from netagent.kernel import owned
    from netagent.kernel.ipset.runner import IpsetRunner
    from netagent.kernel.families import IpFamily
    from netagent.kernel.iptables.backend import resolve_backend
    from netagent.kernel.iptables.runner import IptablesRunner
    kernel = read_policy_rules(IptablesRunner(backend=resolve_backend(iptables_backend, family=IpFamily.V4),
                                              family=IpFamily.V4))
    sets = {name: contents.members for name, contents in IpsetRunner().snapshot().items()
            if name.startswith(owned.POLICY_PREFIX)}
    return kernel, sets


def _address(kernel: KernelPolicy, name: str) -> str:
    try:
        return str(ipaddress.IPv4Address(name))
    except ValueError:
        found = kernel.find(name)
        if found is None:
            raise StatusPolicyError(f"{name}: not an address, and no pod of this node has that name "
                             f"(a pod of another node: give its address)") from None
        return found[1]


def _parse_port(text: str) -> tuple[str, int]:
    port, _, protocol = text.partition("/")
    protocol = (protocol or "tcp").lower()
    if not port.isdigit() or not 1 <= int(port) <= 65535 or protocol not in ("tcp", "udp", "sctp"):
        raise StatusPolicyError(f"{text}: expected PORT or PORT/tcp|udp|sctp")
    return protocol, int(port)


def status_policy(*, pod: str | None, trace_args: list[str] | None, iptables_backend: str = "auto",
                  as_json: bool = False) -> str:
    kernel, sets = read_kernel(iptables_backend)
    if trace_args:
        source, destination, port_text = trace_args
        protocol, port = _parse_port(port_text)
        packet = Packet(_address(kernel, source), _address(kernel, destination), protocol, port)
        allowed, steps = trace(kernel, sets, packet)
        if as_json:
            asked = {"source": packet.source, "destination": packet.destination, "protocol": protocol, "port": port}
            return json.dumps({"allowed": allowed, "packet": asked, "steps": steps}, indent=2)
        verdict = "ALLOWED" if allowed else "DENIED"
        return "\n".join([f"{packet.source} -> {packet.destination} {protocol}/{port}: {verdict}",
                          *(f"  {step}" for step in steps)])
    chains = kernel.of(pod) if pod else kernel.pods
    if as_json:
        return json.dumps([{"pod": c.pod, "ip": c.ip, "direction": c.direction, "policies": list(c.policies),
                            "allows": c.describe_allows(), "denied_packets": c.denied_packets} for c in chains],
                          indent=2)
    if not chains:
        if not pod:
            return "no pod of this node is isolated by a network policy"
        found = kernel.find(pod)
        if found is None:
            return f"{pod}: no pod of this node has that name or address"
        return f"{found[0]} {found[1]}: not isolated by any policy on this node (open both ways)"
    lines = []
    for chain in sorted(chains, key=lambda c: (c.pod, c.direction)):
        lines.append(f"{chain.pod} {chain.ip} {chain.direction}: isolated by {', '.join(chain.policies)}; "
                     f"{chain.denied_packets} packet(s) denied")
        lines.extend(f"    allow {line}" for line in chain.describe_allows())
        if not chain.allows:
            lines.append("    allows nothing")
    return "\n".join(lines)

"""`netagent status policy [POD] [--trace FROM TO PORT[/PROTO]]`: the policy state of this
node's pods and the tracer's answer, read from the kernel (policy/readback.py says why).

One `iptables-save -c -t filter` (counters: packets each pod's DROP has denied) and one
`ipset save`, or, when the node holds the nft policy table (`--proxy-mode nftables`), one
listing of that table (policy/nftables/readback.py, into the same values); works while the agent
is down. POD is `ns/name`, a bare name or an address
of a pod of this node, isolated or open (the policy engine's pod directory names them all);
the tracer's FROM and TO are the same, or any address (a pod of another node, the outside).

Both families (issue 22): the IPv6 half is read the same way (`ip6tables-save` and the
`inet6` sets, or the `ip6 netagent-policy` table) and listed beside the IPv4 one; a trace is
judged in the family of its addresses (a pod named by name takes the family of the other
end when that is an address, else IPv4).
"""
from __future__ import annotations

import ipaddress
import json
from typing import TYPE_CHECKING

from netagent.errors import NetagentError
from netagent.kernel.families import IpFamily
from netagent.kernel.iptables.backend import BackendChoice
from netagent.policy.readback import KernelPolicy, Packet, trace
from netagent.policy.iptables.readback import parse_kernel_policy

if TYPE_CHECKING:
    from netagent.kernel.iptables.runner import Iptables


class StatusPolicyError(NetagentError, ValueError):
    """An unknown pod, or a trace's PORT/PROTO that does not parse."""


def read_policy_rules(iptables: Iptables) -> KernelPolicy:
    """The policy chains with their counters (`iptables-save -c -t filter`, through the runner)."""
    return parse_kernel_policy(iptables.save("filter", counters=True))


Read = dict[IpFamily, tuple[KernelPolicy, dict[str, frozenset[str]]]]


def read_nft() -> Read | None:
    """The nft policy tables read back, by family, or None when this node has none (or no libnftables)."""
    from netagent.kernel.nftables.runner import NftError, NftRunner
    from netagent.policy.nftables.readback import parse_nft_policy
    from netagent.policy.nftables.render import TABLE
    try:
        nft = NftRunner()
    except NftError:
        return None
    try:
        found = {family: nft.list_table(family.nft, TABLE) for family in IpFamily}
    finally:
        nft.close()
    read = {family: parse_nft_policy(objects) for family, objects in found.items() if objects is not None}
    return read or None


def read_kernel(iptables_backend: BackendChoice) -> Read:
    found = read_nft()
    if found is not None:
        return found
    from netagent.kernel import owned
    from netagent.kernel.ipset.runner import IpsetRunner
    from netagent.kernel.iptables.backend import missing_binaries, resolve_backend
    from netagent.kernel.iptables.runner import IptablesRunner
    backend = resolve_backend(iptables_backend, family=IpFamily.V4)
    held = IpsetRunner().snapshot()
    read: Read = {}
    for family in IpFamily:
        if family is IpFamily.V6 and missing_binaries(family, backend):
            continue
        kernel = read_policy_rules(IptablesRunner(backend=backend, family=family))
        sets = {name: contents.members for name, contents in held.items()
                if name.startswith(owned.POLICY_PREFIX) and contents.family == family.ipset}
        if family is IpFamily.V4 or kernel.pods or kernel.local or kernel.guard:
            read[family] = (kernel, sets)
    return read


def _merged(read: Read) -> KernelPolicy:
    merged = KernelPolicy()
    for kernel, _ in read.values():
        merged.pods.extend(kernel.pods)
        merged.guard.extend(kernel.guard)
        merged.local.update(kernel.local)
    return merged


def _literal(name: str) -> str | None:
    try:
        return str(ipaddress.ip_address(name))
    except ValueError:
        return None


def _address(read: Read, name: str, family: IpFamily) -> str:
    literal = _literal(name)
    if literal is not None:
        return literal
    found = read[family][0].find(name) if family in read else None
    if found is None:
        raise StatusPolicyError(f"{name}: not an address, and no pod of this node has that name in "
                                f"{family.label} (a pod of another node: give its address)")
    return found[1]


def _parse_port(text: str) -> tuple[str, int]:
    port, _, protocol = text.partition("/")
    protocol = (protocol or "tcp").lower()
    if not port.isdigit() or not 1 <= int(port) <= 65535 or protocol not in ("tcp", "udp", "sctp"):
        raise StatusPolicyError(f"{text}: expected PORT or PORT/tcp|udp|sctp")
    return protocol, int(port)


def status_policy(*, pod: str | None, trace_args: list[str] | None, iptables_backend: BackendChoice = BackendChoice.AUTO,
                  as_json: bool = False) -> str:
    read = read_kernel(iptables_backend)
    kernel = _merged(read)
    if trace_args:
        source, destination, port_text = trace_args
        protocol, port = _parse_port(port_text)
        given = next((IpFamily.of(text) for text in (source, destination) if _literal(text)), IpFamily.V4)
        packet = Packet(_address(read, source, given), _address(read, destination, given), protocol, port)
        if IpFamily.of(packet.source) is not IpFamily.of(packet.destination):
            raise StatusPolicyError(f"{packet.source} and {packet.destination} are not of one family")
        family_kernel, sets = read.get(given, (KernelPolicy(), {}))
        allowed, steps = trace(family_kernel, sets, packet)
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

"""What the scale harness reads back from the agent's node: the kernel, the agent's process,
and the API server's audit log and metrics. The kernel is the judge of "programmed": routes
of our protocol, DNAT rules of our chains, and the policy's ipsets, each read with the real
tool in the node's namespace.

Readers of text (`iptables-save`, `ipset save`, the audit log, /metrics) are pure functions of
that text, so the unit tests feed them samples; the ones that run a tool are thin.
"""
from __future__ import annotations

import json
import os
import re

from netagent.kernel import namespaces
from netagent.kernel.owned import POLICY_KNOWN_SET, ROUTE_PROTOCOL

AGENT_RESOURCES = ("nodes", "pods", "namespaces", "services", "endpointslices", "networkpolicies")
_SAMPLE = re.compile(r'^(?P<name>[a-z_]+)\{(?P<labels>[^}]*)\} (?P<value>\S+)$')
_LABEL = re.compile(r'(\w+)="([^"]*)"')


def route_count(netns: str) -> int:
    out = namespaces.run_in(netns, ["ip", "-4", "route", "show", "proto", str(ROUTE_PROTOCOL)], check=True).stdout
    return sum(1 for line in out.splitlines() if line.strip())


def nat_rules(netns: str) -> str:
    return namespaces.run_in(netns, ["iptables-legacy-save", "-t", "nat"], timeout=300, check=True).stdout


def dnat_count(saved: str) -> int:
    """Endpoints programmed: DNAT rules in our chains."""
    return sum(1 for line in saved.splitlines() if line.startswith("-A NETAGENT-") and " -j DNAT " in line)


def chain_of_service(saved: str, cluster_ip: str) -> str:
    """The chain NETAGENT-SERVICES sends `cluster_ip` to (without affinity, the endpoints' DNAT
    rules sit in it)."""
    for line in saved.splitlines():
        words = line.split()
        if line.startswith("-A NETAGENT-SERVICES ") and f"{cluster_ip}/32" in words and words[-2] == "-j":
            return words[-1]
    raise LookupError(f"no chain for {cluster_ip} in the nat table")


def chain_endpoints(netns: str, chain: str) -> int:
    """DNAT rules (endpoints) in `chain`, listed alone."""
    out = namespaces.run_in(netns, ["iptables-legacy", "-w", "-t", "nat", "-S", chain], check=True).stdout
    return sum(1 for line in out.splitlines() if line.startswith("-A ") and " -j DNAT " in line)


def set_members(saved: str) -> dict[str, set[str]]:
    """`ipset save` text -> {set: members} for our sets."""
    members: dict[str, set[str]] = {}
    for line in saved.splitlines():
        words = line.split()
        if len(words) >= 3 and words[0] == "add" and words[1].startswith("NETAGENT"):
            members.setdefault(words[1], set()).add(words[2])
        elif len(words) >= 2 and words[0] == "create" and words[1].startswith("NETAGENT"):
            members.setdefault(words[1], set())
    return members


def ipsets(netns: str) -> dict[str, set[str]]:
    return set_members(namespaces.run_in(netns, ["ipset", "save"], timeout=300, check=True).stdout)


def known_pods(netns: str) -> int:
    """Local pods the policy engine has programmed (members of its KNOWN set); 0 before it exists."""
    done = namespaces.run_in(netns, ["ipset", "list", "-t", POLICY_KNOWN_SET])
    found = re.search(r"^Number of entries: (\d+)$", done.stdout, re.M)
    return int(found.group(1)) if done.returncode == 0 and found else 0


def in_set(netns: str, name: str, address: str) -> bool:
    return namespaces.run_in(netns, ["ipset", "-q", "test", name, address]).returncode == 0


def process_cpu_s(pid: int) -> float:
    """User + system CPU of `pid` and its waited-for children (iptables-restore, ipset)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return sum(int(v) for v in fields[11:15]) / os.sysconf("SC_CLK_TCK")


def audit_requests(text: str, user: str) -> dict[str, int]:
    """Requests of `user` in an audit log (JSON lines), by verb: each audit ID once."""
    seen: dict[str, str] = {}
    for line in text.splitlines():
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if (event.get("user") or {}).get("username") == user and event.get("auditID"):
            seen[event["auditID"]] = event.get("verb", "?")
    verbs: dict[str, int] = {}
    for verb in seen.values():
        verbs[verb] = verbs.get(verb, 0) + 1
    return verbs


def metric_sum(text: str, name: str, *, resources: tuple[str, ...] = AGENT_RESOURCES,
               verbs: tuple[str, ...] = ("LIST",)) -> float:
    """The sum of `name`'s samples (Prometheus text) whose resource and verb are among those given."""
    total = 0.0
    for line in text.splitlines():
        match = _SAMPLE.match(line)
        if not match or match["name"] != name:
            continue
        labels = dict(_LABEL.findall(match["labels"]))
        if labels.get("resource") in resources and labels.get("verb") in verbs:
            total += float(match["value"])
    return total

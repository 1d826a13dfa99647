"""`netagent connectivity-test`'s reasons from the agents' flow records: which flows a check's
client sent to its target, read from `netagent flows --json` run in the agent pod of a node.

Pure (no API calls): the exec itself is `ClusterApi.agent_flows`, so matching and wording are
tested from text alone. The agents' output is untrusted input: each line is parsed alone with
infra/flows' `Flow.from_dict` and a line that does not parse (or names no address) is skipped,
and every text taken from a flow is cut to printable characters before it reaches a reason.

A flow belongs to a check when its source is the client pod's address and its destination the
check's target (address and port); for a Service, a translated flow names the endpoint chosen
(`translated_to`), and the flows to that endpoint belong to the check too (a drop after DNAT
names the endpoint, not the Service). Drops are named first, then translations, then forwards.
"""
from __future__ import annotations

import ipaddress
import json

from netagent.daemon.connectivity_report import printable
from netagent.infra.flows import Flow, Verdict, describe
from netagent.errors import NetagentError

# where the agents run: deploy/netagent.yaml's DaemonSet (tests/unit/daemon checks the two agree)
AGENT_NAMESPACE = "kube-system"
AGENT_SELECTOR = "app.kubernetes.io/name=netagent"
AGENT_CONTAINER = "netagent"
EXEC_TIMEOUT = 10.0             # seconds one exec may take, connect included
OUTPUT_LIMIT = 4 << 20          # bytes of an agent's output read; the rest is not
MAX_VERDICTS = 3                # verdicts named in one reason
_ORDER = {Verdict.DROPPED: 0, Verdict.TRANSLATED: 1, Verdict.FORWARDED: 2}

Address = ipaddress.IPv4Address | ipaddress.IPv6Address


class FlowsUnavailable(NetagentError):
    """A node's flow records cannot be read; the message says why (no agent pod, exec refused...)."""


def flows_command(namespace: str) -> list[str]:
    """The command run in the agent's container: the flows that name a pod of our namespace."""
    return ["netagent", "flows", "--json", "--namespace", namespace]


def _address(text: object) -> Address | None:
    try:
        return ipaddress.ip_address(str(text))
    except ValueError:
        return None


def parse_lines(text: str) -> list[Flow]:
    """The flows of `netagent flows --json` output, a line each; what does not parse is skipped."""
    flows = []
    for line in text.splitlines():
        try:
            flow = Flow.from_dict(json.loads(line))
        except (ValueError, KeyError, TypeError, AttributeError, RecursionError):
            continue
        if _address(flow.source) is not None and _address(flow.destination) is not None:
            flows.append(flow)
    return flows


def split_target(target: str) -> tuple[Address, int] | None:
    """HOST:PORT ([v6]:PORT) as an address and a port; None for a name (DNS) or anything else."""
    host, sep, port = target.rpartition(":")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    address = _address(host)
    if not sep or address is None or not port.isdigit():
        return None
    return address, int(port)


def _ends(flows: list[Flow], source: Address, wanted: tuple[Address, int]) -> set[tuple[Address | None, int | None]]:
    """The target, and the endpoints `source`'s flows to it were translated to (on any node)."""
    ends: set[tuple[Address | None, int | None]] = {wanted}
    for flow in flows:
        if flow.verdict is Verdict.TRANSLATED and _address(flow.source) == source \
                and (_address(flow.destination), flow.destination_port) == wanted:
            endpoint = _address(flow.translated_to)
            if endpoint is not None and isinstance(flow.translated_port, int):
                ends.add((endpoint, flow.translated_port))
    return ends


def verdicts(flows_by_node: dict[str, list[Flow]], client: str, target: str) -> list[str]:
    """'dropped by policy ns/x (ingress of ns/y) on node-2', ...: the distinct verdicts of the
    flows from `client` to `target` (or to an endpoint it was translated to) on each node,
    drops first, at most MAX_VERDICTS."""
    source, wanted = _address(client), split_target(target)
    if source is None or wanted is None:
        return []
    ends = _ends([f for flows in flows_by_node.values() for f in flows], source, wanted)
    found: list[tuple[int, str]] = []
    for node, flows in flows_by_node.items():
        for flow in flows:
            if _address(flow.source) != source or (_address(flow.destination), flow.destination_port) not in ends:
                continue
            entry = (_ORDER.get(flow.verdict, 3), f"{printable(describe(flow), 120)} on {printable(node, 64)}")
            if entry not in found:
                found.append(entry)
    return [text for _, text in sorted(found, key=lambda e: e[0])[:MAX_VERDICTS]]


def with_verdicts(reason: str, texts: list[str]) -> str:
    """The reason followed by what the flow records say (unchanged when they say nothing)."""
    return f"{reason}: {'; '.join(texts)}" if texts else reason

"""Policy drops as flow records: the listener of the policy chains' nflog group, and the names
it gives what it reads.

Each pod chain's drop is preceded by a log rule (both dataplanes' `render_pod_chain`) whose
prefix is the chain's name, a hash of the pod's key (shared.pod_chain). The prefix carries no
pod or policy name itself: those can be 500 bytes, the prefix 63, and text from API objects
would reach the kernel's log. `FlowNames` maps it back from the plan the engine last
rendered (`engine.plan`): chain name -> (pod, direction, policies isolating it that way), and
every local pod's addresses -> ns/name for the flow's two ends. The plan is swapped whole by
the engine's sync, so reading it from this thread needs no lock; the maps are rebuilt when it
changes. A chain the current plan no longer has (a drop logged just before a pod went) still
gives its direction, with the pod unknown.

`PolicyFlows` owns one `NflogSocket` (kernel/nflog.py) and one thread: read a datagram
(half-second timeout, so stopping takes at most that), turn each packet into a `Flow` in the
`FlowRing` (infra/flows.py), count what could not be read. The thread never stops on a bad
message: one flow is worth less than the listener. The proxy's refusals of a Service with no
endpoints reach the same group under a fixed prefix and are recorded the same way.
"""
from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, replace

from netagent.infra.flows import Flow, FlowListener, FlowRing, LostReason, Verdict
from netagent.kernel import nflog, owned
from netagent.policy.semantics import NodePlan
from netagent.policy.shared import pod_directions

log = logging.getLogger("netagent.policy.flows")



@dataclass(frozen=True)
class ChainOwner:
    pod: str
    direction: str
    policies: tuple[str, ...]


class FlowNames:
    """Names from the plan `current()` returns (None before the first sync)."""

    def __init__(self, current: Callable[[], NodePlan | None]) -> None:
        self._current = current
        self._seen: NodePlan | None = None
        self.chains: dict[str, ChainOwner] = {}
        self.pods: dict[str, str] = {}

    def _refresh(self) -> None:
        plan = self._current()
        if plan is self._seen or plan is None:
            return
        chains: dict[str, ChainOwner] = {}
        pods: dict[str, str] = {}
        for pod in plan.pods:
            for address in pod.addresses:
                pods[address] = pod.key
            for _, chain, ingress in pod_directions(pod)[0]:
                chains[chain] = ChainOwner(pod.key, "ingress" if ingress else "egress",
                                           pod.ingress_policies if ingress else pod.egress_policies)
        self.chains, self.pods, self._seen = chains, pods, plan

    def chain(self, prefix: str) -> ChainOwner | None:
        """The pod chain named `prefix`: its owner, or only its direction when not in the plan;
        None when the prefix is not one of our pod chains."""
        self._refresh()
        found = self.chains.get(prefix)
        if found is not None:
            return found
        for start, direction in ((owned.POLICY_INGRESS_PREFIX, "ingress"), (owned.POLICY_EGRESS_PREFIX, "egress")):
            if prefix.startswith(start):
                return ChainOwner("", direction, ())
        return None

    def pod(self, address: str) -> str:
        self._refresh()
        return self.pods.get(address, "")


def policy_flow(packet: nflog.LoggedPacket, names: FlowNames) -> Flow | None:
    """The flow of one logged packet; None when it is not one of ours or not an IP packet.
    Besides the pod chains, the service proxy logs to the same group what it refuses for want
    of endpoints (prefix owned.NO_ENDPOINTS_LOG_PREFIX): dropped, reason `no-endpoints`."""
    no_endpoints = packet.prefix == owned.NO_ENDPOINTS_LOG_PREFIX
    owner = None if no_endpoints else names.chain(packet.prefix)
    headers = nflog.parse_headers(packet.payload)
    if (owner is None and not no_endpoints) or headers is None:
        return None
    flow = Flow(time=packet.time, verdict=Verdict.DROPPED, protocol=headers.protocol,
                source=headers.source, destination=headers.destination,
                source_port=headers.source_port, destination_port=headers.destination_port,
                source_pod=names.pod(headers.source), destination_pod=names.pod(headers.destination),
                reason="no-endpoints")
    if owner is None:
        return flow
    return replace(flow, reason="policy", direction=owner.direction, pod=owner.pod, policies=owner.policies)


class PolicyFlows(FlowListener[nflog.ParsedBatch]):
    """The nflog listener feeding `ring`; `open_socket` makes its socket (tests: in a netns)."""

    thread_name = "policy-flows"

    def __init__(self, ring: FlowRing, names: FlowNames, *,
                 open_socket: Callable[[], nflog.NflogSocket] = nflog.NflogSocket) -> None:
        super().__init__(ring, open_socket)
        self.names = names

    def take(self, batch: nflog.ParsedBatch) -> None:
        """Record a batch's flows and count what it lost."""
        self.ring.lose(LostReason.OVERRUN, batch.overruns)
        unreadable = batch.unreadable
        for packet in batch.packets:
            try:
                flow = policy_flow(packet, self.names)
            except Exception:                     # a bug must not end the listener: counted, logged once per kind
                log.exception("flow records: a logged packet could not be read")
                flow = None
            if flow is None:
                unreadable += 1
            else:
                self.ring.add(flow)
        self.ring.lose(LostReason.UNREADABLE, unreadable)


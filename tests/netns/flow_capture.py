"""Flow records captured in a test's own namespace: the agent's nflog listener (policy/flows.py,
the group both the policy chains and the proxies' no-endpoints refusals log to) bound there,
recording into a small ring the test reads."""
from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from netagent.infra.flows import Flow, FlowFilter, FlowRing
from netagent.kernel import nflog
from netagent.policy.flows import FlowNames, PolicyFlows
from netagent.policy.semantics import NodePlan

DEADLINE = 30.0


@contextmanager
def flow_records(netns: str, plan: Callable[[], NodePlan | None] = lambda: None) -> Iterator[FlowRing]:
    ring = FlowRing(size=64)
    listener = PolicyFlows(ring, FlowNames(plan), open_socket=lambda: nflog.NflogSocket(netns=netns))
    listener.start()
    try:
        yield ring
    finally:
        listener.stop()


def wait_for(ring: FlowRing, keep: FlowFilter | None = None, *, count: int = 1) -> list[Flow]:
    """The flows `keep` lets through, once there are `count` of them (or what there is at the deadline)."""
    deadline = time.monotonic() + DEADLINE
    found = ring.flows(keep=keep)
    while len(found) < count and time.monotonic() < deadline:
        time.sleep(0.1)
        found = ring.flows(keep=keep)
    return found

"""Forwarded and translated flows from conntrack's new-connection events (`--flow-conntrack on`).

A conntrack entry is confirmed, and its event sent, once a connection's first packet has
passed every hook: so an event is a connection this node let through. Its reply tuple tells
whether DNAT chose another destination: a Service address translated to an endpoint
(`translated`, with both), else `forwarded`. Only connections with a local pod at one end
(the source, the destination or the chosen endpoint) are recorded, named from the policy
engine's plan as the drops are (policy/flows.py's `FlowNames`).

Off by default, unlike the policy drops: the kernel sends an event for every new connection of
the node's namespace once anyone listens, and this thread parses each one, so the cost grows
with the connection rate of the whole node, and falls on allowed traffic (bench/flows.py
measures it); the drops cost only what a policy drops, rate limited in the kernel.
"""
from __future__ import annotations

import time
from collections.abc import Callable

from netagent.infra.flows import Flow, FlowListener, FlowRing, LostReason, Verdict
from netagent.kernel import ctevents
from netagent.policy.flows import FlowNames



def connection_flow(event: ctevents.NewConnection, names: FlowNames, when: float) -> Flow | None:
    """The flow of a new connection with a local pod at one end; None otherwise."""
    original, reply = event.original, event.reply
    source, destination = names.pod(original.source), names.pod(original.destination)
    endpoint = names.pod(reply.source) if event.translated else destination
    if not (source or destination or endpoint):
        return None
    flow = Flow(time=when, verdict=Verdict.TRANSLATED if event.translated else Verdict.FORWARDED,
                protocol=original.protocol, source=original.source, destination=original.destination,
                source_port=original.source_port, destination_port=original.destination_port,
                source_pod=source, destination_pod=destination)
    if event.translated:
        return Flow(**{**flow.__dict__, "translated_to": reply.source, "translated_port": reply.source_port,
                       "pod": endpoint})
    return flow


class ConntrackFlows(FlowListener[ctevents.EventBatch]):
    """The conntrack event listener feeding `ring` on its own thread."""

    thread_name = "conntrack-flows"

    def __init__(self, ring: FlowRing, names: FlowNames, *,
                 open_socket: Callable[[], ctevents.ConntrackEvents] = ctevents.ConntrackEvents,
                 clock: Callable[[], float] = time.time) -> None:
        super().__init__(ring, open_socket)
        self.names = names
        self._clock = clock

    def take(self, batch: ctevents.EventBatch) -> None:
        self.ring.lose(LostReason.OVERRUN, batch.overruns)
        self.ring.lose(LostReason.UNREADABLE, batch.unreadable)
        now = self._clock()
        for event in batch.connections:
            flow = connection_flow(event, self.names, now)
            if flow is not None:
                self.ring.add(flow)

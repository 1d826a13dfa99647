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

import logging
import threading
from collections.abc import Callable

from netagent.infra.flows import Flow, FlowRing, LostReason, Verdict
from netagent.kernel import ctevents
from netagent.policy.flows import RECEIVE_TIMEOUT, FlowNames

log = logging.getLogger("netagent.policy.conntrack_flows")


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


class ConntrackFlows:
    """The conntrack event listener feeding `ring` on its own thread."""

    def __init__(self, ring: FlowRing, names: FlowNames, *,
                 open_socket: Callable[[], ctevents.ConntrackEvents] = ctevents.ConntrackEvents,
                 clock: Callable[[], float] | None = None) -> None:
        import time
        self.ring = ring
        self.names = names
        self._open_socket = open_socket
        self._clock = clock or time.time
        self._socket: ctevents.ConntrackEvents | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._socket = self._open_socket()
        self._thread = threading.Thread(target=self._run, name="conntrack-flows", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        assert self._socket is not None
        while not self._stop.is_set():
            try:
                batch = self._socket.receive(RECEIVE_TIMEOUT)
            except OSError as error:
                log.warning("flow records: reading conntrack events failed: %s", error)
                self._stop.wait(1.0)
                continue
            self.take(batch)

    def take(self, batch: ctevents.EventBatch) -> None:
        self.ring.lose(LostReason.OVERRUN, batch.overruns)
        self.ring.lose(LostReason.UNREADABLE, batch.unreadable)
        now = self._clock()
        for event in batch.connections:
            flow = connection_flow(event, self.names, now)
            if flow is not None:
                self.ring.add(flow)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5.0)
        if self._socket is not None:
            self._socket.close()
            self._socket = None

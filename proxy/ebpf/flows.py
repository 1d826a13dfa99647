"""The eBPF service proxy's flow records: the socket load balancer's events as `Flow`s.

In eBPF mode the socket LB (ebpf/sock_lb.c) rewrites a Service address at connect() and
sendmsg(), before any packet exists, so conntrack never sees the Service and the iptables
proxy's NFLOG refusal has no counterpart. Loaded with flow events on, the programs put one
record per translated or refused call into the pinned ring buffer `na_flow_events`;
`EbpfFlows` reads it (ebpf/ringbuf.py, on the listener thread of infra/flows.py) into the same
`FlowRing` as the policy's drops: TRANSLATED with the Service as destination and the backend
the socket really went to as `translated_to`, or DROPPED with the reason the call was refused
(`no-endpoints`, as the iptables proxy's; `no-local-endpoints` when endpoints exist but none
this node may use; `source-range` for loadBalancerSourceRanges). What the ring dropped while
full (the programs' counter) is counted as the kernel's overrun; a record that is not an
event, as unreadable. `name_pod` (optional) names a local pod's address, as the policy's
`FlowNames` does. `start` turns the programs' events on (`na_flow_on`) and `stop` off, so
an agent without flow records costs the socket LB one array lookup. The source is known only when the socket was bound (or IP_PKTINFO given)
before the call, else it is left empty. Once the flow ring refuses a flow (over its rate), the
rest of the batch is counted as sampled out unparsed and the reader rests `BACKOFF`: a pod
flooding a UDP Service costs the agent a bounded share of a CPU, the kernel's ring dropping
(and counting) the rest.
"""
from __future__ import annotations

import errno
import os
import time
from collections.abc import Callable

from ebpf import maps as M
from ebpf import syscall
from ebpf.ringbuf import RingBatch, RingBuffer
from netagent.infra.flows import Flow, FlowListener, FlowRing, LostReason, Verdict

BACKOFF = 0.1   # seconds the reader rests once the flow ring samples out: a flood costs the kernel a
                # failed reserve per call, not the agent a parse per event
REASONS = {errno.ECONNREFUSED: "no-endpoints", errno.EHOSTUNREACH: "no-local-endpoints",
           errno.EPERM: "source-range"}


def flow_of(event: M.FlowEvent, when: float, name_pod: Callable[[str], str] | None = None) -> Flow:
    """The flow record of one socket LB event."""
    def pod(address: str) -> str:
        return name_pod(address) if name_pod is not None and address else ""

    translated = event.error == 0
    return Flow(time=when, verdict=Verdict.TRANSLATED if translated else Verdict.DROPPED, protocol=event.protocol,
                source=event.source, destination=event.service, destination_port=event.service_port,
                source_pod=pod(event.source), destination_pod=pod(event.backend),
                reason="" if translated else REASONS.get(event.error, f"refused ({os.strerror(event.error)})"),
                translated_to=event.backend, translated_port=event.backend_port if translated else None)


def set_flow_events(pin_dir: str, *, on: bool) -> None:
    """Turn the programs' events on or off (`na_flow_on`; the code stays: nothing is re-attached)."""
    fd = syscall.obj_get(os.path.join(pin_dir, M.FLOW_ON_MAP))
    try:
        syscall.map_update(fd, b"\0\0\0\0", (1 if on else 0).to_bytes(4, "little"))
    finally:
        os.close(fd)


def open_events(pin_dir: str) -> RingBuffer:
    """The socket LB's pinned ring buffer and drop counter under `pin_dir` (ebpf/loader.pin_dir)."""
    return RingBuffer(os.path.join(pin_dir, M.FLOW_EVENTS_MAP), os.path.join(pin_dir, M.FLOW_LOST_MAP))


class EbpfFlows(FlowListener[RingBatch]):
    """The socket LB's ring buffer read into `ring`."""

    thread_name = "flows-ebpf"

    def __init__(self, ring: FlowRing, pin_dir: str, *, name_pod: Callable[[str], str] | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        super().__init__(ring, lambda: open_events(pin_dir))
        self.pin_dir = pin_dir
        self._name_pod = name_pod
        self._clock = clock

    def start(self) -> None:
        super().start()
        try:
            set_flow_events(self.pin_dir, on=True)
        except OSError:
            super().stop()
            raise

    def stop(self) -> None:
        try:
            set_flow_events(self.pin_dir, on=False)
        except OSError:
            pass   # unpinned meanwhile (cleanup): nothing writes events then
        super().stop()

    def take(self, batch: RingBatch) -> None:
        self.ring.lose(LostReason.OVERRUN, batch.lost)
        self.ring.lose(LostReason.UNREADABLE, batch.garbage)
        when = self._clock()
        for taken, record in enumerate(batch.records, 1):
            try:
                event = M.parse_flow_event(record)
            except ValueError:
                self.ring.lose(LostReason.UNREADABLE)
                continue
            if not self.ring.add(flow_of(event, when, self._name_pod)):
                self.ring.lose(LostReason.SAMPLED_OUT, len(batch.records) - taken)   # not even parsed
                self._stop.wait(BACKOFF)   # over the ring's rate: the kernel's ring drops (counted) meanwhile
                return

"""proxy/ebpf/flows.py: socket LB events (crafted as sock_lb.c lays them out) as flow records, and
what a batch lost counted in the ring."""
from __future__ import annotations

import socket

import pytest

from ebpf import maps as M
from ebpf.ringbuf import RingBatch
from netagent.infra.flows import FlowRing, LostReason, Verdict
from netagent.kernel.families import IpFamily
from proxy.ebpf.flows import EbpfFlows, flow_of


def event(*, service: str, port: int, backend: str = "", backend_port: int = 0, source: str = "",
          error: int = 0, proto: int = socket.IPPROTO_TCP) -> bytes:
    kind, family = (socket.AF_INET6, 6) if ":" in service else (socket.AF_INET, 4)

    def packed(address: str) -> bytes:
        return socket.inet_pton(kind, address).ljust(16, b"\0") if address else bytes(16)

    return M.FLOW_EVENT.pack(77, packed(service), packed(backend), packed(source), port.to_bytes(2, "big"),
                             backend_port.to_bytes(2, "big"), family, proto, error, 0)


def test_a_translated_connect_names_the_service_and_the_backend():
    parsed = M.parse_flow_event(event(service="10.96.0.10", port=80, backend="10.77.0.3", backend_port=8080,
                                      source="10.77.0.1"))
    assert parsed.family is IpFamily.V4 and parsed.netns_cookie == 77
    flow = flow_of(parsed, 1000.0, {"10.77.0.3": "default/web-1", "10.77.0.1": "default/client"}.get)
    assert flow.verdict is Verdict.TRANSLATED and flow.protocol == "TCP"
    assert (flow.destination, flow.destination_port, flow.translated_to, flow.translated_port) == \
        ("10.96.0.10", 80, "10.77.0.3", 8080)
    assert (flow.source, flow.source_pod, flow.destination_pod) == ("10.77.0.1", "default/client", "default/web-1")


@pytest.mark.parametrize("error, reason", [(111, "no-endpoints"), (113, "no-local-endpoints"), (1, "source-range")])
def test_a_refused_call_is_a_drop_with_its_reason(error, reason):
    flow = flow_of(M.parse_flow_event(event(service="fd00:10:96::99", port=53, error=error,
                                            proto=socket.IPPROTO_UDP)), 1.0)
    assert (flow.verdict, flow.reason, flow.protocol) == (Verdict.DROPPED, reason, "UDP")
    assert (flow.destination, flow.destination_port, flow.translated_to, flow.translated_port) == \
        ("fd00:10:96::99", 53, "", None)
    assert flow.source == "" and flow.source_pod == ""   # not bound: not known


@pytest.mark.parametrize("raw", [b"", bytes(63), bytes(65), bytes(64),          # short, long, family 0
                                 event(service="10.0.0.1", port=1, proto=47)])  # GRE: not ours
def test_anything_else_is_not_an_event(raw):
    with pytest.raises(ValueError):
        M.parse_flow_event(raw)


def test_a_batch_counts_what_the_kernel_dropped_and_what_could_not_be_read():
    ring = FlowRing(size=16)
    listener = EbpfFlows(ring, "/nonexistent", clock=lambda: 5.0)
    listener.take(RingBatch(records=[event(service="10.96.0.10", port=80, backend="10.77.0.2", backend_port=8080),
                                     b"junk"], lost=3, garbage=1))
    flows = ring.flows()
    assert [(f.verdict, f.translated_to, f.time) for f in flows] == [(Verdict.TRANSLATED, "10.77.0.2", 5.0)]
    assert ring.lost[LostReason.OVERRUN] == 3 and ring.lost[LostReason.UNREADABLE] == 2


def test_a_listener_without_the_pinned_maps_fails_to_start():
    with pytest.raises(OSError):
        EbpfFlows(FlowRing(size=16), "/nonexistent").start()


def test_over_the_ring_rate_the_rest_of_the_batch_is_sampled_out_unparsed():
    ring = FlowRing(size=16, max_per_second=1, clock=lambda: 0.0)
    listener = EbpfFlows(ring, "/nonexistent", clock=lambda: 5.0)
    records = [event(service="10.96.0.10", port=80, backend="10.77.0.2", backend_port=8080)] * 3 + [b"junk"]
    listener.take(RingBatch(records=records))
    assert len(ring.flows()) == 1
    assert ring.lost[LostReason.SAMPLED_OUT] == 3 and ring.lost[LostReason.UNREADABLE] == 0

"""policy/conntrack_flows.py: new connections as forwarded or translated flows, named from the
plan, only those with a local pod at one end; a batch's losses counted."""
from __future__ import annotations

from netagent.infra.flows import FlowRing, LostReason, Verdict, describe
from netagent.kernel import ctevents
from netagent.policy.conntrack_flows import ConntrackFlows, connection_flow
from netagent.policy.flows import FlowNames
from netagent.policy.semantics import NodePlan, PodPlan
from tests.unit.kernel.test_ctevents import DNAT

PLAN = NodePlan((PodPlan("x/a", "10.9.9.1", None, None), PodPlan("x/ep", "10.9.9.2", None, None)))
NAMES = FlowNames(lambda: PLAN)


def connection(source: str, destination: str, reply_source: str | None = None) -> ctevents.NewConnection:
    return ctevents.NewConnection(ctevents.Tuple(source, destination, "tcp", 40000, 80),
                                  ctevents.Tuple(reply_source or destination, source, "tcp", 80, 40000))


def test_a_translated_connection_names_the_endpoint():
    (event,) = ctevents.parse_events(DNAT).connections
    flow = connection_flow(event, NAMES, 3.0)
    assert flow is not None and flow.verdict is Verdict.TRANSLATED
    assert (flow.source_pod, flow.destination, flow.destination_port) == ("x/a", "10.96.0.10", 80)
    assert (flow.translated_to, flow.translated_port, flow.pod) == ("10.9.9.2", 8080, "x/ep")
    assert describe(flow) == "translated to 10.9.9.2:8080"


def test_forwarded_and_foreign_connections():
    flow = connection_flow(connection("192.0.2.1", "10.9.9.2"), NAMES, 1.0)
    assert flow is not None and (flow.verdict, flow.source_pod, flow.destination_pod) == (
        Verdict.FORWARDED, "", "x/ep")
    assert connection_flow(connection("192.0.2.1", "192.0.2.2"), NAMES, 1.0) is None
    # a Service of no local pod's, from outside: not ours either
    assert connection_flow(connection("192.0.2.1", "10.96.0.1", "192.0.2.9"), NAMES, 1.0) is None


def test_a_batch():
    ring = FlowRing()
    listener = ConntrackFlows(ring, NAMES, clock=lambda: 9.0)
    listener.take(ctevents.EventBatch([connection("10.9.9.1", "10.9.9.2"), connection("1.1.1.1", "2.2.2.2")],
                                      unreadable=1, overruns=2))
    (flow,) = ring.flows()
    assert flow.time == 9.0 and flow.verdict is Verdict.FORWARDED
    assert ring.lost[LostReason.UNREADABLE] == 1 and ring.lost[LostReason.OVERRUN] == 2

"""policy/flows.py: a logged packet's prefix named back to its pod, direction and policies from
the engine's plan (and the plan followed when it changes), addresses named as local pods, and
the listener's handling of a batch (unreadable and foreign packets counted, never raised).
The prefix the renderers write is the one read here (both dataplanes)."""
from __future__ import annotations

import socket

from netagent.infra.flows import FlowRing, LostReason, Verdict, describe
from netagent.kernel import nflog, owned
from netagent.policy.flows import FlowNames, PolicyFlows, policy_flow
from netagent.policy.iptables.render import render_pod_chain as iptables_chain
from netagent.policy.nftables.render import render_pod_chain as nft_chain
from netagent.policy.semantics import NodePlan, PodPlan
from netagent.policy.shared import pod_chain
from proxy.iptables.render import IptablesProxySettings, render_service_port
from proxy.model import NodeContext, Protocol, ServicePort, ServicePortName
from proxy.selection import EndpointSelection
from tests.unit.kernel.test_nflog import SYN

A = PodPlan("x/a", "10.9.9.2", ingress=(), egress=None, ingress_policies=("x/deny", "x/other"))
B = PodPlan("y/b", "10.9.9.1", ingress=None, egress=None)
INGRESS_A = pod_chain(owned.POLICY_INGRESS_PREFIX, "x/a")
NO_ENDPOINTS = ServicePort(ServicePortName("x", "web", "http"), Protocol.TCP, 80, "10.96.0.10")


def logged(prefix: str, payload: bytes | None = None) -> nflog.LoggedPacket:
    payload = nflog.parse_datagram(SYN).packets[0].payload if payload is None else payload
    return nflog.LoggedPacket(socket.AF_INET, nflog.POLICY_LOG_GROUP, prefix, payload, 7.0)


def test_a_drop_is_named_from_the_plan():
    names = FlowNames(lambda: NodePlan((A, B)))
    flow = policy_flow(logged(INGRESS_A), names)
    assert flow is not None
    assert (flow.verdict, flow.reason, flow.direction, flow.pod, flow.policies) == (
        Verdict.DROPPED, "policy", "ingress", "x/a", ("x/deny", "x/other"))
    assert (flow.source, flow.source_pod, flow.source_port) == ("10.9.9.1", "y/b", 40000)
    assert (flow.destination, flow.destination_pod, flow.destination_port, flow.time) == ("10.9.9.2", "x/a", 80, 7.0)


def test_the_names_follow_the_plan_and_a_gone_chain_keeps_its_direction():
    current = [None]
    names = FlowNames(lambda: current[0])
    assert names.chain(INGRESS_A).pod == ""                    # before the first sync
    current[0] = NodePlan((A,))
    assert names.chain(INGRESS_A).pod == "x/a"
    current[0] = NodePlan((B,))
    gone = names.chain(INGRESS_A)
    assert (gone.pod, gone.direction, gone.policies) == ("", "ingress", ())
    assert names.chain("something else") is None and names.pod("10.9.9.2") == ""


def test_the_proxys_no_endpoints_refusal_is_a_drop_of_its_own_kind():
    flow = policy_flow(logged(owned.NO_ENDPOINTS_LOG_PREFIX), FlowNames(lambda: NodePlan((A, B))))
    assert flow is not None
    assert (flow.verdict, flow.reason, flow.pod, flow.policies) == (Verdict.DROPPED, "no-endpoints", "", ())
    assert (flow.source_pod, flow.destination, flow.destination_port) == ("y/b", "10.9.9.2", 80)
    assert describe(flow) == "dropped (no-endpoints)"
    rules = render_service_port(NO_ENDPOINTS, EndpointSelection((), (), 0, False),
                                node=NodeContext(name="n"), settings=IptablesProxySettings()).filter
    assert len(rules) == 2 and rules[1].endswith("REJECT --reject-with icmp-port-unreachable")
    assert f"--nflog-prefix {owned.NO_ENDPOINTS_LOG_PREFIX} --nflog-group {nflog.POLICY_LOG_GROUP}" in rules[0]


def test_the_renderers_log_with_the_prefix_read_here():
    rules = iptables_chain((), pod=A, ingress=True)
    log_rule = rules[-2]
    assert log_rule[log_rule.index("--nflog-prefix") + 1] == INGRESS_A
    assert log_rule[log_rule.index("--nflog-group") + 1] == str(nflog.POLICY_LOG_GROUP)
    assert rules[-1][-1] == "DROP"
    statements = nft_chain((), pod=A, ingress=True)[-2].statements
    assert f'log prefix "{INGRESS_A}" group {nflog.POLICY_LOG_GROUP} snaplen {nflog.COPY_RANGE}' in statements
    assert len(INGRESS_A) <= nflog.PREFIX_MAX


def test_a_batch_counts_what_it_cannot_read():
    ring = FlowRing()
    listener = PolicyFlows(ring, FlowNames(lambda: NodePlan((A, B))))
    listener.take(nflog.ParsedBatch(packets=[logged(INGRESS_A), logged("not ours"), logged(INGRESS_A, b"junk")],
                                    unreadable=2, overruns=1))
    assert len(ring.flows()) == 1
    assert ring.lost[LostReason.UNREADABLE] == 4 and ring.lost[LostReason.OVERRUN] == 1

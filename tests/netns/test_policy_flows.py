"""Flow records of policy drops on the real kernel: a policy denies a connection between two
pods of the policy lab, real packets are dropped by the pod chain, and the nflog listener
(bound in the lab node's namespace) records the flow with the pod, the direction and the
policy's name; on both dataplanes (iptables NFLOG and nft `log group`) and both attachments.
An allowed connection records nothing. The lab is policy_lab.py's (one per module)."""
from __future__ import annotations

import pytest

from netagent.infra.flows import FlowFilter, FlowRing, Verdict
from netagent.policy.flows import FlowNames
from tests.netns.policy_cases import (  # noqa: F401 (fixtures)
    TCP80, X, _root_and_no_leaks, labs, np, pods, policy)
from tests.netns.flow_capture import flow_records, wait_for
from tests.netns.policy_lab import Expect


@pytest.fixture
def flows(np):
    with flow_records(np.netns_of["node"], lambda: np.engine.plan) as ring:
        yield np, ring


def test_a_denied_connection_is_recorded_with_its_policy(flows):
    lab, ring = flows
    lab.apply(policy("x", "deny-from-y", {"podSelector": pods(pod="a"), "policyTypes": ["Ingress"],
                                           "ingress": [{"from": [{"podSelector": pods(pod="b")}]}]}))
    # x/b is allowed (same namespace, pod=b); x/c is denied
    lab.check(Expect(True).deny(sources=["x/c"], targets=["x/a"]), [TCP80], sources=["x/b", "x/c"], targets=["x/a"])
    found = wait_for(ring, FlowFilter(pod="x/a", verdict=Verdict.DROPPED))
    assert found, f"no flow recorded; lost: {ring.lost}"
    flow = found[0]
    assert (flow.reason, flow.direction, flow.pod, flow.policies) == ("policy", "ingress", "x/a", ("x/deny-from-y",))
    assert (flow.source_pod, flow.destination_pod) == ("x/c", "x/a")
    assert (flow.source, flow.destination) == (lab.addresses["x/c"], lab.addresses["x/a"])
    assert (flow.protocol, flow.destination_port) == ("tcp", 80)
    assert flow.source_port and flow.source_port > 1023
    assert not ring.flows(keep=FlowFilter(pod="x/b")), "an allowed connection was recorded as a drop"


def test_an_egress_drop_names_the_sender_and_its_policy(flows):
    lab, ring = flows
    lab.apply(policy("x", "no-egress", {"podSelector": pods(pod="b"), "policyTypes": ["Egress"]}))
    lab.check(Expect(True).deny(sources=["x/b"]), [TCP80], sources=["x/b"], targets=X)
    found = wait_for(ring, FlowFilter(pod="x/b"))
    assert found, f"no flow recorded; lost: {ring.lost}"
    assert {(f.direction, f.pod, f.policies, f.source_pod) for f in found} == {
        ("egress", "x/b", ("x/no-egress",), "x/b")}


SERVICE = "10.96.7.7"


@pytest.fixture
def conntrack_flows(np):
    from netagent.kernel.ctevents import ConntrackEvents
    from netagent.kernel import namespaces
    from netagent.policy.conntrack_flows import ConntrackFlows
    node = np.netns_of["node"]
    rules = (f"add table ip na-flowtest\nadd chain ip na-flowtest pre {{ type nat hook prerouting priority -100; }}\n"
             f"add rule ip na-flowtest pre ip daddr {SERVICE} tcp dport 80 dnat to {np.addresses['x/a']}:80\n")
    namespaces.run_in(node, ["nft", "-f", "-"], input=rules, check=True)
    ring = FlowRing(size=256)
    listener = ConntrackFlows(ring, FlowNames(lambda: np.engine.plan), open_socket=lambda: ConntrackEvents(netns=node))
    listener.start()
    try:
        yield np, ring
    finally:
        listener.stop()
        namespaces.run_in(node, ["nft", "delete", "table", "ip", "na-flowtest"], check=True)


def test_conntrack_records_forwarded_and_translated_connections(conntrack_flows):
    lab, ring = conntrack_flows
    lab.check(Expect(True), [TCP80], sources=["x/b"], targets=["x/c"])
    forwarded = wait_for(ring, FlowFilter(pod="x/c", verdict=Verdict.FORWARDED))
    assert forwarded, f"no forwarded flow; held: {ring.flows()}"
    assert (forwarded[0].source_pod, forwarded[0].destination_pod, forwarded[0].destination_port) == ("x/b", "x/c", 80)
    lab.addresses["service"] = SERVICE              # the probe's target list: a Service address
    try:
        lab.check(Expect(True), [TCP80], sources=["x/b"], targets=["service"])
    finally:
        del lab.addresses["service"]
    translated = wait_for(ring, FlowFilter(verdict=Verdict.TRANSLATED))
    assert translated, f"no translated flow; held: {ring.flows()}"
    flow = translated[0]
    assert (flow.source_pod, flow.destination, flow.destination_port) == ("x/b", SERVICE, 80)
    assert (flow.translated_to, flow.translated_port, flow.pod) == (lab.addresses["x/a"], 80, "x/a")

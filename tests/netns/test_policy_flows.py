"""Flow records of policy drops on the real kernel: a policy denies a connection between two
pods of the policy lab, real packets are dropped by the pod chain, and the nflog listener
(bound in the lab node's namespace) records the flow with the pod, the direction and the
policy's name; on both dataplanes (iptables NFLOG and nft `log group`) and both attachments.
An allowed connection records nothing. The lab is policy_lab.py's (one per module)."""
from __future__ import annotations

import time

import pytest

from netagent.infra.flows import FlowFilter, FlowRing, Verdict
from netagent.kernel import nflog
from netagent.policy.flows import FlowNames, PolicyFlows
from tests.netns.policy_cases import (  # noqa: F401 (fixtures)
    TCP80, X, _root_and_no_leaks, labs, np, pods, policy)
from tests.netns.policy_lab import Expect

DEADLINE = 30.0


@pytest.fixture
def flows(np):
    ring = FlowRing(size=64)
    listener = PolicyFlows(ring, FlowNames(lambda: np.engine.plan),
                           open_socket=lambda: nflog.NflogSocket(netns=np.netns_of["node"]))
    listener.start()
    try:
        yield np, ring
    finally:
        listener.stop()


def _wait_for(ring: FlowRing, keep: FlowFilter) -> list:
    deadline = time.monotonic() + DEADLINE
    while time.monotonic() < deadline:
        found = ring.flows(keep=keep)
        if found:
            return found
        time.sleep(0.1)
    return []


def test_a_denied_connection_is_recorded_with_its_policy(flows):
    lab, ring = flows
    lab.apply(policy("x", "deny-from-y", {"podSelector": pods(pod="a"), "policyTypes": ["Ingress"],
                                           "ingress": [{"from": [{"podSelector": pods(pod="b")}]}]}))
    # x/b is allowed (same namespace, pod=b); x/c is denied
    lab.check(Expect(True).deny(sources=["x/c"], targets=["x/a"]), [TCP80], sources=["x/b", "x/c"], targets=["x/a"])
    found = _wait_for(ring, FlowFilter(pod="x/a", verdict=Verdict.DROPPED))
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
    found = _wait_for(ring, FlowFilter(pod="x/b"))
    assert found, f"no flow recorded; lost: {ring.lost}"
    assert {(f.direction, f.pod, f.policies, f.source_pod) for f in found} == {
        ("egress", "x/b", ("x/no-egress",), "x/b")}

"""The policy engine's reading of API objects and its semantics, pure: which pods a policy
isolates, per direction, and what it allows (peers, ports, named ports, defaults), with the
fail-closed handling of fields it cannot read."""
from __future__ import annotations

import pytest

from netagent.policy.kube_objects import ObjectError, parse_pod, parse_policy, parse_port, parse_selector
from netagent.policy.model import PolicyType, Protocol
from netagent.policy.semantics import CidrMatch, ClusterView, PortMatch, PortMember, SetKind, SetRef, plan_node
from tests.unit.policy.policy_objects import namespace, pod, policy


def view_of(*objects: dict) -> ClusterView:
    from netagent.policy.kube_objects import parse_namespace
    view = ClusterView()
    for obj in objects:
        kind = obj.get("kind") or ("Pod" if "spec" in obj and "containers" in obj["spec"] else "Namespace")
        if kind == "NetworkPolicy":
            reading = parse_policy(obj)
            view.policies[reading.value.key] = reading.value
        elif kind == "Pod":
            info = parse_pod(obj).value
            view.pods[info.key] = info
        else:
            ns = parse_namespace(obj).value
            view.namespaces[ns.name] = ns
    return view


PODS = (pod("x", "a", "10.0.0.2", {"pod": "a"}, ports=(("serve", 80, "TCP"),)),
        pod("x", "b", "10.0.0.3", {"pod": "b"}, ports=(("serve", 81, "TCP"),)),
        pod("y", "a", "10.0.1.2", {"pod": "a"}, node="node-2", ports=(("serve", 8080, "TCP"),)),
        pod("y", "b", "10.0.1.3", {"pod": "b"}, node="node-2"),
        namespace("x", team="red"), namespace("y", team="blue"))


def plan_for(*policies: dict, extra: tuple = ()):
    plan = plan_node(view_of(*PODS, *extra, *policies), node_name="node-1")
    return {p.key: p for p in plan.pods}, plan.sets


def test_unselected_pods_are_open_and_only_local_pods_are_planned():
    pods, sets = plan_for(policy("x", "p", {"podSelector": {"matchLabels": {"pod": "a"}}}))
    assert set(pods) == {"x/a", "x/b"}
    assert pods["x/b"].ingress is None and pods["x/b"].egress is None
    assert pods["x/a"].ingress == () and pods["x/a"].egress is None     # isolated, nothing allowed
    assert pods["x/a"].policies == ("x/p",)


@pytest.mark.parametrize("spec, types", [
    ({}, {PolicyType.INGRESS}),
    ({"egress": []}, {PolicyType.INGRESS}),
    ({"egress": [{}]}, {PolicyType.INGRESS, PolicyType.EGRESS}),
    ({"policyTypes": ["Egress"], "ingress": [{}]}, {PolicyType.EGRESS}),
])
def test_policy_types_default_from_the_egress_section(spec, types):
    reading = parse_policy(policy("x", "p", {"podSelector": {}, **spec}))
    parsed, problems = reading.value, reading.problems
    assert not problems and not reading.reason
    assert parsed.policy_types == types


def test_peers_and_or_and_the_own_namespace():
    pods, sets = plan_for(policy("x", "p", {"podSelector": {"matchLabels": {"pod": "a"}}, "ingress": [{"from": [
        {"podSelector": {"matchLabels": {"pod": "b"}}},
        {"namespaceSelector": {"matchLabels": {"team": "blue"}}, "podSelector": {"matchLabels": {"pod": "a"}}},
        {"namespaceSelector": {}}]}]}))
    peers = [allow.peer for allow in pods["x/a"].ingress]
    assert all(isinstance(peer, SetRef) and peer.kind is SetKind.PODS for peer in peers)
    assert [sets[peer] for peer in peers] == [frozenset({"10.0.0.3"}), frozenset({"10.0.1.2"}),
                                              frozenset({"10.0.0.2", "10.0.0.3", "10.0.1.2", "10.0.1.3"})]


def test_identical_selectors_share_one_set():
    peer = {"from": [{"podSelector": {"matchLabels": {"pod": "b"}}}]}
    pods, sets = plan_for(policy("x", "p1", {"podSelector": {}, "ingress": [peer]}),
                          policy("x", "p2", {"podSelector": {"matchLabels": {"pod": "a"}}, "ingress": [peer]}))
    assert len(sets) == 1
    assert len(pods["x/a"].ingress) == 1     # the same (peer, port) from two policies is one rule


def test_ports_numbers_ranges_named_per_destination():
    pods, sets = plan_for(policy("x", "p", {"podSelector": {}, "ingress": [{"ports": [
        {"port": "serve"}, {"port": 53, "protocol": "UDP"}, {"port": 9000, "endPort": 9010, "protocol": "SCTP"},
        {"protocol": "UDP"}]}]}))
    assert [a.port for a in pods["x/a"].ingress] == [PortMatch(Protocol.TCP, 80, 80), PortMatch(Protocol.UDP, 53, 53),
                                                     PortMatch(Protocol.SCTP, 9000, 9010), PortMatch(Protocol.UDP)]
    assert pods["x/b"].ingress[0].port == PortMatch(Protocol.TCP, 81, 81)


def test_egress_named_port_is_a_set_of_address_port_pairs():
    pods, sets = plan_for(policy("x", "p", {"podSelector": {"matchLabels": {"pod": "a"}}, "egress": [
        {"to": [{"namespaceSelector": {}}], "ports": [{"port": "serve"}]}]}))
    (allow,) = pods["x/a"].egress
    assert allow.peer is None and allow.named is not None and allow.named.kind is SetKind.NAMED
    assert sets[allow.named] == {PortMember("10.0.0.2", "tcp", 80), PortMember("10.0.0.3", "tcp", 81),
                                 PortMember("10.0.1.2", "tcp", 8080)}


def test_ip_block_except_is_its_own_set():
    pods, sets = plan_for(policy("x", "p", {"podSelector": {}, "ingress": [
        {"from": [{"ipBlock": {"cidr": "10.0.0.0/8", "except": ["10.0.1.0/24", "10.0.0.0/30"]}}]}]}))
    peer = pods["x/a"].ingress[0].peer
    assert isinstance(peer, CidrMatch) and peer.cidr == "10.0.0.0/8"
    assert peer.excepts is not None and sets[peer.excepts] == {"10.0.0.0/30", "10.0.1.0/24"}


def test_missing_and_empty_from_mean_everyone_but_no_rules_mean_nobody():
    pods, _ = plan_for(policy("x", "p", {"podSelector": {"matchLabels": {"pod": "a"}},
                                         "ingress": [{"from": []}, {}]}),
                       policy("x", "q", {"podSelector": {"matchLabels": {"pod": "b"}}, "ingress": []}))
    assert [(a.peer, a.port) for a in pods["x/a"].ingress] == [(None, None)]
    assert pods["x/b"].ingress == ()


def test_host_network_finished_and_addressless_pods_are_never_members():
    extra = (pod("x", "host", "192.168.0.1", {"pod": "b"}, host_network=True),
             pod("x", "done", "10.0.0.9", {"pod": "b"}, phase="Succeeded"),
             pod("x", "new", None, {"pod": "b"}))
    pods, sets = plan_for(policy("x", "p", {"podSelector": {}, "ingress": [
        {"from": [{"podSelector": {"matchLabels": {"pod": "b"}}}]}]}), extra=extra)
    assert set(pods) == {"x/a", "x/b"}
    assert list(sets.values()) == [frozenset({"10.0.0.3"})]


def test_unreadable_items_fail_closed_with_reasons():
    reading = parse_policy(policy("x", "p", {"podSelector": {}, "ingress": [
        {"from": [{"ipBlock": {"cidr": "not-a-cidr"}}, {"podSelector": {"matchExpressions": [
            {"key": "k", "operator": "Sometimes"}]}}]},
        {"ports": [{"port": 80, "protocol": "ICMP"}]},
        {"from": [{"ipBlock": {"cidr": "10.0.0.0/8", "except": ["192.168.0.0/16"]}}, {"podSelector": {}}]}]}))
    parsed, problems = reading.value, reading.problems
    assert reading.reason == "malformed" and not parsed.closed
    assert parsed.ingress[0].peers == ()            # matches nobody, not everybody
    assert parsed.ingress[1].ports == ()
    assert len(parsed.ingress[2].peers) == 1        # the good peer stays
    assert len(problems) == 4 and all("ignored" in p for p in problems)
    assert any("not-a-cidr" in p for p in problems) and any("Sometimes" in p for p in problems)
    assert any("ICMP" in p for p in problems) and any("192.168.0.0/16 is not inside" in p for p in problems)


def test_a_policy_whose_pod_selector_is_unreadable_isolates_its_whole_namespace():
    reading = parse_policy(policy("x", "p", {"podSelector": {"matchLabels": {"a": 1}}}))
    assert reading.reason == "malformed" and "spec.podSelector" in reading.problems[0]
    parsed = reading.value
    assert parsed.pod_selector.is_empty and parsed.ingress == () and parsed.egress == () and parsed.closed
    assert parsed.policy_types == {PolicyType.INGRESS}            # its policyTypes are still read


@pytest.mark.parametrize("raw, message", [
    ({"port": "http", "endPort": 90}, "needs a numeric port"),
    ({"port": 90, "endPort": 80}, ">= port 90"),
    ({"port": 0}, "not a port number"),
    ({"port": True}, "neither a number nor a name"),
])
def test_bad_ports_are_refused(raw, message):
    with pytest.raises(ObjectError, match=message):
        parse_port(raw, where="p")


@pytest.mark.parametrize("raw, labels, matched", [
    ({"matchExpressions": [{"key": "a", "operator": "Exists"}]}, {"a": ""}, True),
    ({"matchExpressions": [{"key": "a", "operator": "DoesNotExist"}]}, {"a": "1"}, False),
    ({"matchExpressions": [{"key": "a", "operator": "NotIn", "values": ["1"]}]}, {}, True),
    ({"matchExpressions": [{"key": "a", "operator": "In", "values": ["1", "2"]}]}, {"a": "2"}, True),
    ({"matchLabels": {"a": "1"}, "matchExpressions": [{"key": "b", "operator": "Exists"}]}, {"a": "1"}, False),
    ({}, {"anything": "x"}, True),
])
def test_selectors(raw, labels, matched):
    assert parse_selector(raw, where="s").matches(labels) is matched

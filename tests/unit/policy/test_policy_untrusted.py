"""Regression tests of issue 18 for the policy engine, through its real path (recorders, drain,
parsers, semantics, renderer, programmer) against FakeIptables and FakeIpset: one bad object
costs no other its change, a policy that cannot be read fails closed, a Pod's container port
70000 cannot fail the sync, one policy's size is bounded, and every refusal is recorded in the
engine's RejectionScope (accepted again once fixed or deleted).

The tests marked "fails on the old code" were run against the base commit's engine too."""
from __future__ import annotations

import pytest

from netagent.infra.metrics import Registry
from netagent.infra.sync_runner import SyncKind, SyncResult
from netagent.kernel import owned
from netagent.kernel.ipset import FakeIpset, iptables_references
from netagent.kernel.ipset.model import DEFAULT_MAX_ELEMENTS
from netagent.kernel.iptables.fake import FakeIptables
from netagent.kernel.pod_attachment import PodAttachment
from netagent.policy.engine import PolicyEngine, PolicySettings
from netagent.policy.iptables.dataplane import IptablesDataplane
from netagent.policy.iptables.render import render_wanted
from netagent.policy.shared import RenderSettings, pod_chain
from netagent.policy.semantics import (
    Allow,
    CidrMatch,
    NodePlan,
    PodPlan,
    SetKind,
    SetRef,
    capacity_for,
)
from tests.unit.policy.policy_objects import namespace, pod, policy

DENY_ALL_Y = policy("y", "deny-all", {"podSelector": {}, "policyTypes": ["Ingress", "Egress"]})


class Node:
    """One node's engine over the fakes: pods x/a, x/b, y/c local; y/d elsewhere."""

    def __init__(self) -> None:
        self.iptables = FakeIptables()
        self.ipset = FakeIpset(in_use=iptables_references(self.iptables))
        settings = RenderSettings(PodAttachment.ROUTED, local_cidrs=("10.0.0.0/24",))
        self.engine = PolicyEngine(PolicySettings("node-1", settings),
                                   dataplane=IptablesDataplane(iptables=self.iptables, ipset=self.ipset),
                                   interface_of=lambda plan: "na" + plan.ip.replace(".", "")[-12:].rjust(12, "0"),
                                   registry=Registry())
        for recorder in (self.engine.namespaces, self.engine.pods, self.engine.policies):
            recorder.on_synced()
        for name in ("x", "y"):
            self.engine.namespaces.on_add(namespace(name))
        self.engine.pods.on_add(pod("x", "a", "10.0.0.2", {"pod": "a"}))
        self.engine.pods.on_add(pod("x", "b", "10.0.0.3", {"pod": "b"}, ports=(("web", 8080, "TCP"),)))
        self.engine.pods.on_add(pod("y", "c", "10.0.0.4", {"pod": "c"}))
        self.engine.pods.on_add(pod("y", "d", "10.0.1.5", {"pod": "d"}, node="node-2",
                                    ports=(("web", 8081, "TCP"),)))

    def sync(self, kind: SyncKind = SyncKind.PARTIAL) -> SyncResult:
        return self.engine.sync(kind)

    def plan(self, key: str) -> PodPlan:
        assert self.engine.plan is not None
        return {p.key: p for p in self.engine.plan.pods}[key]

    def chains(self) -> set[str]:
        return set(self.iptables.list_chains("filter", prefix=owned.POLICY_PREFIX))

    def known(self) -> frozenset[str]:
        return self.ipset.members(owned.POLICY_KNOWN_SET)

    def rejected(self) -> dict[str, str]:
        return {f"{r.ref.kind} {r.ref.key}": r.reason for r in self.engine.rejections.snapshot()}


@pytest.fixture
def node() -> Node:
    return Node()


@pytest.mark.parametrize("bad_spec", [
    {"podSelector": {}, "policyTypes": 5},                                     # TypeError in the old parser
    {"podSelector": {}, "ingress": [{"from": [{"ipBlock": {"cidr": "10.0.0.0/8", "except": 7}}]}]},
    {"podSelector": {"matchExpressions": {"key": "k"}}, "ingress": [{"ports": [{"port": [80]}]}]},
])
def test_a_bad_policy_in_one_namespace_does_not_drop_a_deny_all_in_another(node, bad_spec):
    """Fails on the old code: the drain raised on the bad policy after emptying the queue, so
    the deny-all drained with it was lost and the next sync reported success without it."""
    node.engine.policies.on_add(policy("x", "bad", bad_spec))
    node.engine.policies.on_add(DENY_ALL_Y)
    assert node.sync(SyncKind.FULL) is SyncResult.SUCCEEDED
    assert node.sync(SyncKind.FULL) is SyncResult.SUCCEEDED
    isolated = node.plan("y/c")
    assert isolated.ingress == () and isolated.egress == () and isolated.policies == ("y/deny-all",)
    chains = {pod_chain(owned.POLICY_INGRESS_PREFIX, "y/c"), pod_chain(owned.POLICY_EGRESS_PREFIX, "y/c")}
    assert chains <= node.chains()
    assert node.rejected() == {"NetworkPolicy x/bad": "malformed"}
    assert node.known() == {"10.0.0.2", "10.0.0.3", "10.0.0.4"}


def test_changes_drained_before_a_failed_write_are_programmed_by_the_next_sync(node, monkeypatch):
    node.sync(SyncKind.FULL)
    node.engine.policies.on_add(DENY_ALL_Y)

    def broken(text, **kwargs):
        raise RuntimeError("injected")
    real = node.iptables.restore
    monkeypatch.setattr(node.iptables, "restore", broken)
    with pytest.raises(RuntimeError):
        node.sync()
    monkeypatch.setattr(node.iptables, "restore", real)
    assert node.engine.policies.pending() == 0                 # drained, yet not lost
    assert node.sync(SyncKind.FULL) is SyncResult.SUCCEEDED
    assert pod_chain(owned.POLICY_INGRESS_PREFIX, "y/c") in node.chains()


@pytest.mark.parametrize("spec, ingress, egress", [
    # Each of these was ignored as a whole (or opened a direction) by the old parser.
    ({"podSelector": {"matchLabels": {"pod": "a"}}, "ingress": "everyone"}, (), None),
    ({"podSelector": {"matchLabels": {"pod": "a"}}, "policyTypes": ["Ingress", "Egres"], "ingress": [{}]},
     "any", ()),
    ({"podSelector": {"matchLabels": {"pod": "a"}}, "ingress": [None]}, (), None),
    ({"podSelector": {"matchLabels": {"pod": "a"}}, "ingress": [{}], "denyAll": True}, (), None),
    ({"podSelector": {"matchLabels": {"pod": "a"}}, "ingress": [{"from": {"podSelector": {}}}]}, (), None),
])
def test_a_policy_that_cannot_be_read_isolates_the_pods_it_selects(node, spec, ingress, egress):
    """Fails on the old code: it left x/a open for ingress (the first), open for egress (the
    second), allowed it everything (the third and fourth) or its namespace's pods (the fifth)."""
    node.engine.policies.on_add(policy("x", "p", spec))
    assert node.sync(SyncKind.FULL) is SyncResult.SUCCEEDED
    plan = node.plan("x/a")
    if ingress == "any":
        assert plan.ingress is not None and len(plan.ingress) == 1 and plan.ingress[0].peer is None
    else:
        assert plan.ingress == ingress
    assert plan.egress == egress
    assert node.plan("x/b").ingress is None                           # not selected: open
    assert node.rejected() == {"NetworkPolicy x/p": "malformed"}


@pytest.mark.parametrize("spec", [
    {"podSelector": {"matchLabels": {"pod": 1}}, "ingress": [{}]},
    {"podSelector": {"matchExpressions": [{"key": "pod", "operator": "Like", "values": ["a"]}]}},
    {"podSelector": "pod=a"},
])
def test_a_policy_whose_selector_cannot_be_read_isolates_its_whole_namespace(node, spec):
    """Fails on the old code: the policy was ignored, every pod stayed open."""
    node.engine.policies.on_add(policy("x", "p", spec))
    assert node.sync(SyncKind.FULL) is SyncResult.SUCCEEDED
    assert node.plan("x/a").ingress == () and node.plan("x/b").ingress == ()
    assert node.plan("x/a").egress is None                            # policyTypes say Ingress
    assert node.plan("y/c").ingress is None                           # another namespace: untouched


def test_a_policy_that_is_fixed_or_deleted_is_accepted_again(node):
    node.engine.policies.on_add(policy("x", "p", {"podSelector": "pod=a"}))
    node.sync()
    assert node.rejected() == {"NetworkPolicy x/p": "malformed"}
    node.engine.policies.on_update(policy("x", "p", {"podSelector": "pod=a"}),
                                   policy("x", "p", {"podSelector": {"matchLabels": {"pod": "a"}}}))
    node.sync()
    assert node.rejected() == {} and node.plan("x/b").ingress is None
    node.engine.pods.on_add(pod("x", "e", "10.0.0.7", {"pod": "e"}, ports=(("web", 70000, "TCP"),)))
    node.sync()
    assert node.rejected() == {"Pod x/e": "malformed"}
    node.engine.pods.on_delete(pod("x", "e", "10.0.0.7", {"pod": "e"}))
    node.sync()
    assert node.rejected() == {}


def test_container_port_70000_cannot_fail_the_sync(node):
    """Fails on the old code: the named-port set got `10.0.0.9,tcp:70000`, which the ipset
    model (as `ipset restore`) refuses, so the whole sync failed, and with it the first sync
    the CNI server waits for."""
    node.engine.pods.on_add(pod("y", "e", "10.0.1.9", {"pod": "e"}, node="node-2", ports=(("web", 70000, "TCP"),)))
    node.engine.pods.on_add(pod("y", "f", "10.0.1.10", {"pod": "f"}, node="node-2",
                                ports=(("web", "8082", "TCP"), ("web2", 8.5, "TCP"), ("web3", True, "TCP"))))
    node.engine.policies.on_add(policy("x", "out", {"podSelector": {"matchLabels": {"pod": "a"}},
                                                    "egress": [{"ports": [{"port": "web"}]}]}))
    node.engine.policies.on_add(policy("x", "in", {"podSelector": {"matchLabels": {"pod": "b"}},
                                                   "ingress": [{"ports": [{"port": "web"}]}]}))
    assert node.sync(SyncKind.FULL) is SyncResult.SUCCEEDED
    (named,) = [spec for spec in node.engine.wanted.sets if spec.type.value == "hash:ip,port"]
    assert node.ipset.members(named.name) == {"10.0.0.3,tcp:8080", "10.0.1.5,tcp:8081"}
    assert node.rejected() == {"Pod y/e": "malformed", "Pod y/f": "malformed"}
    assert node.known() == {"10.0.0.2", "10.0.0.3", "10.0.0.4"}


def test_a_local_pod_with_port_70000_is_programmed_without_that_port(node):
    node.engine.pods.on_add(pod("x", "g", "10.0.0.8", {"pod": "b"}, ports=(("web", 70000, "TCP"),)))
    node.engine.policies.on_add(policy("x", "in", {"podSelector": {"matchLabels": {"pod": "b"}},
                                                   "ingress": [{"ports": [{"port": "web"}]}]}))
    assert node.sync(SyncKind.FULL) is SyncResult.SUCCEEDED
    assert node.plan("x/g").ingress == ()                              # its "web" resolves to nothing
    assert "10.0.0.8" in node.known()


def test_unreadable_pod_labels_isolate_it_and_make_it_a_member_of_nothing(node):
    strange = pod("x", "h", "10.0.0.9", {"pod": "a"})
    strange["metadata"]["labels"] = {"pod": ["a"]}
    node.engine.pods.on_add(strange)
    node.engine.policies.on_add(policy("x", "only-a", {"podSelector": {"matchLabels": {"pod": "a"}},
                                                       "ingress": [{"from": [{"podSelector": {}}]}]}))
    node.engine.policies.on_add(policy("y", "from-x", {"podSelector": {}, "ingress": [
        {"from": [{"namespaceSelector": {}, "podSelector": {"matchLabels": {"pod": "a"}}}]}]}))
    assert node.sync(SyncKind.FULL) is SyncResult.SUCCEEDED
    assert node.plan("x/h").ingress == () and node.plan("x/h").policies == ("x/only-a",)   # closed
    [members] = [m for ref, m in node.engine.plan.sets.items() if "pod=a" in ref.key]
    assert members == {"10.0.0.2"}                                     # x/h matched by no selector
    assert node.rejected() == {"Pod x/h": "malformed"}


def test_a_namespace_whose_labels_cannot_be_read_matches_no_namespace_selector(node):
    node.engine.namespaces.on_update(namespace("x"), {"metadata": {"name": "x", "labels": "team=red"}})
    node.engine.policies.on_add(policy("y", "from-red", {"podSelector": {}, "ingress": [
        {"from": [{"namespaceSelector": {"matchExpressions": [{"key": "team", "operator": "NotIn",
                                                                "values": ["blue"]}]}}]}]}))
    assert node.sync(SyncKind.FULL) is SyncResult.SUCCEEDED
    assert set().union(*node.engine.plan.sets.values()) == {"10.0.0.4", "10.0.1.5"}   # y's pods, not x's
    assert node.rejected() == {"Namespace x": "malformed"}


def test_watch_filters_never_raise_on_strange_updates(node):
    node.sync(SyncKind.FULL)
    node.engine.pods.on_update(pod("x", "a", "10.0.0.2", {}), {"metadata": {"namespace": "x", "name": "a"},
                                                               "spec": "garbage", "status": 5})
    node.engine.namespaces.on_update(namespace("x"), {"metadata": {"name": "x", "labels": None}, "x": 1})
    node.engine.policies.on_update(DENY_ALL_Y, {"metadata": {"namespace": "y", "name": "deny-all"}})
    assert node.engine.pods.pending() == 1 and node.sync(SyncKind.FULL) is SyncResult.SUCCEEDED
    assert "10.0.0.2" not in node.known()                              # unreadable: left closed


def huge_policy(blocks: int, *, excepts: bool = False, ports: int = 2) -> dict:
    def block(i: int) -> dict:
        cidr = f"{10 + i // 65536}.{i // 256 % 256}.{i % 256}.0/24"
        return {"cidr": cidr, "except": [cidr.replace(".0/24", ".0/25")]} if excepts else {"cidr": cidr}
    return policy("x", "huge", {"podSelector": {}, "ingress": [{"from": [
        {"ipBlock": block(i)} for i in range(blocks)], "ports": [{"port": 80 + p} for p in range(ports)]}]})


def test_a_policy_above_the_limits_is_rejected_closed_not_rendered(node):
    """Fails on the old code: 37,000 ipBlocks x 2 ports rendered 74,000 rules per selected pod."""
    node.engine.policies.on_add(huge_policy(37000))
    assert node.sync(SyncKind.FULL) is SyncResult.SUCCEEDED
    assert node.plan("x/a").ingress == () and node.plan("x/b").ingress == ()
    assert max(len(rules) for rules in node.engine.wanted.chains.values()) < 10
    [rejection] = node.engine.rejections.snapshot()
    assert rejection.reason == "too-large" and "37000 ip blocks (limit 10000)" in rejection.detail


@pytest.mark.parametrize("spec, reason", [
    (huge_policy(3000, excepts=True, ports=4), "12000 pairs (limit 10000)"),    # one rule each: too many
    (huge_policy(10, ports=1001), "1001 ports (limit 1000)"),
    (policy("x", "huge", {"podSelector": {}, "ingress": [{}] * 501}), "501 rules (limit 500)"),
])
def test_each_limit_is_enforced(node, spec, reason):
    node.engine.policies.on_add(spec)
    assert node.sync(SyncKind.FULL) is SyncResult.SUCCEEDED
    assert node.plan("x/a").ingress == ()
    [rejection] = node.engine.rejections.snapshot()
    assert rejection.reason == "too-large" and reason in rejection.detail


def test_ip_blocks_within_the_limits_are_one_set_and_one_rule_per_port(node):
    node.engine.policies.on_add(huge_policy(9000))
    assert node.sync(SyncKind.FULL) is SyncResult.SUCCEEDED
    allows = node.plan("x/a").ingress
    assert allows is not None and len(allows) == 2 and node.rejected() == {}
    [(spec, members)] = node.engine.wanted.sets.items()
    assert spec.type.value == "hash:net" and len(members) == 9000
    assert node.ipset.members(spec.name) == members


def test_an_except_set_the_kernel_cannot_hold_leaves_its_pods_closed_and_the_others_programmed():
    bad = SetRef(SetKind.EXCEPT, "bad")
    good = SetRef(SetKind.PODS, "good")
    plan = NodePlan((PodPlan("x/a", "10.0.0.2", (Allow("x/p", CidrMatch("10.0.0.0/8", bad)),), None),
                     PodPlan("x/b", "10.0.0.3", (Allow("x/p", good),), None)),
                    {bad: frozenset({"10.1.0.0/16", "0.0.0.0/0"}), good: frozenset({"10.0.0.9", "300.0.0.1"})})
    wanted = render_wanted(plan, settings=RenderSettings(PodAttachment.ROUTED), interface_of=lambda p: "na0a")
    assert wanted.known == {"10.0.0.3"}                                # x/a refused: closed
    assert [s.name for s in wanted.sets] == [good.name] and list(wanted.sets.values()) == [{"10.0.0.9"}]
    assert len(wanted.refused) == 3 and any("x/a" in line for line in wanted.refused)


def test_a_bad_host_interface_name_leaves_only_that_pod_closed():
    plan = NodePlan((PodPlan("x/a", "10.0.0.2", (), None), PodPlan("x/b", "10.0.0.3", (), None)))
    names = {"10.0.0.2": "na0a\n-A INPUT", "10.0.0.3": "na0b"}
    wanted = render_wanted(plan, settings=RenderSettings(PodAttachment.ROUTED),
                           interface_of=lambda p: names[p.ip])
    assert wanted.known == {"10.0.0.3"} and "x/a" in wanted.refused[0]


def test_set_capacity_is_sized_from_its_members_and_names_a_new_set_when_it_grows():
    assert capacity_for(0) == capacity_for(DEFAULT_MAX_ELEMENTS // 2) == DEFAULT_MAX_ELEMENTS
    assert capacity_for(DEFAULT_MAX_ELEMENTS // 2 + 1) == 2 * DEFAULT_MAX_ELEMENTS
    assert capacity_for(DEFAULT_MAX_ELEMENTS) == 2 * DEFAULT_MAX_ELEMENTS
    small, big = SetRef(SetKind.PODS, "k"), SetRef(SetKind.PODS, "k", 2 * DEFAULT_MAX_ELEMENTS)
    assert small.name != big.name and len(big.name) == len(small.name)


def test_a_namespace_cannot_claim_another_namespace_name_label(node):
    """A lax server's Namespace `z` labelled `kubernetes.io/metadata.name: x` is still `z`."""
    node.engine.namespaces.on_add(namespace("z", **{"kubernetes.io/metadata.name": "x"}))
    node.engine.pods.on_add(pod("z", "spy", "10.0.1.20", {"pod": "a"}, node="node-2"))
    node.engine.policies.on_add(policy("y", "from-x", {"podSelector": {}, "ingress": [{"from": [
        {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "x"}}}]}]}))
    assert node.sync(SyncKind.FULL) is SyncResult.SUCCEEDED
    assert list(node.engine.plan.sets.values()) == [{"10.0.0.2", "10.0.0.3"}]


def test_the_tracer_follows_an_ip_block_set(node):
    from netagent.policy.readback import Packet, trace
    from netagent.policy.iptables.readback import parse_kernel_policy
    node.engine.policies.on_add(policy("x", "blocks", {"podSelector": {"matchLabels": {"pod": "a"}}, "ingress": [
        {"from": [{"ipBlock": {"cidr": "192.0.2.0/24"}}, {"ipBlock": {"cidr": "198.51.100.7/32"}}],
         "ports": [{"port": 80}]}]}))
    assert node.sync(SyncKind.FULL) is SyncResult.SUCCEEDED
    kernel = parse_kernel_policy(node.iptables.save("filter"))
    sets = {name: contents.members for name, contents in node.ipset.snapshot().items()}
    assert trace(kernel, sets, Packet("192.0.2.77", "10.0.0.2", "tcp", 80))[0]
    assert trace(kernel, sets, Packet("198.51.100.7", "10.0.0.2", "tcp", 80))[0]
    assert not trace(kernel, sets, Packet("198.51.100.8", "10.0.0.2", "tcp", 80))[0]
    assert not trace(kernel, sets, Packet("192.0.2.77", "10.0.0.2", "tcp", 81))[0]

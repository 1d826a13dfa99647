"""The hostile-object suite of the policy engine (issue 18): Hypothesis draws wrongly typed,
oversized and adversarial NetworkPolicies, Pods and Namespaces (tests/unit/policy/hostile_policy_objects.py)
and feeds them, mixed with fixed good objects, through the engine's real path (recorders,
drain, parsers, semantics, renderer, programmer) into FakeIptables and FakeIpset, which parse
and validate what they are given as the tools do. For every draw:

- every sync succeeds (nothing raises; the first sync, which the CNI server waits for, too);
- the good pods keep exactly their programming: the same chains, the same set members, in KNOWN;
- fail closed: every local pod a policy read closed selects (every pod of its namespace when
  its podSelector is unreadable) is isolated in that policy's directions;
- what was written is what was rendered: the fakes hold every wanted chain rule for rule and
  every wanted set member for member (nothing rejected, nothing split or merged by parsing);
- every object refused is on the rejection record, and deleting the hostile objects clears it
  and gives back the good-only programming.

Budget: 150 draws in CI (a few seconds); `NETAGENT_FUZZ_EXAMPLES=N` runs N.
"""
from __future__ import annotations

import os

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from netagent.infra.sync_runner import SyncKind, SyncResult
from netagent.kernel import owned
from netagent.kernel.ipset import FakeIpset, iptables_references
from netagent.kernel.ipset.model import canonical_member
from netagent.kernel.iptables.fake import FakeIptables
from netagent.kernel.pod_attachment import PodAttachment
from netagent.policy.engine import PolicyEngine, PolicySettings
from netagent.policy.model import PolicyType
from netagent.kernel.families import IpFamily
from netagent.policy.families import DualWanted, FamilyDataplanes
from netagent.policy.iptables.dataplane import IptablesDataplane
from netagent.policy.iptables.render import WantedState
from netagent.policy.shared import RenderSettings, pod_chain
from netagent.policy.semantics import set_refs
from tests.unit.policy.hostile_policy_objects import (
    GOOD_PODS,
    LOCAL_CIDR,
    NODE,
    VICTIM,
    good_objects,
    hostile_namespace,
    hostile_pod,
    hostile_policy,
)

EXAMPLES = int(os.environ.get("NETAGENT_FUZZ_EXAMPLES") or 150)


def new_engine(mode: PodAttachment) -> tuple[PolicyEngine, FakeIptables, FakeIpset]:
    iptables = FakeIptables()
    ipset = FakeIpset(in_use=iptables_references(iptables))
    engine = PolicyEngine(PolicySettings(NODE, RenderSettings(mode, local_cidrs=(LOCAL_CIDR,))),
                          dataplane=FamilyDataplanes({IpFamily.V4: IptablesDataplane(iptables=iptables, ipset=ipset)}),
                          interface_of=lambda plan: "na" + plan.ip.replace(".", "")[-12:].rjust(12, "0"))
    for recorder in (engine.namespaces, engine.pods, engine.policies):
        recorder.on_synced()
    return engine, iptables, ipset


def feed_good(engine: PolicyEngine) -> None:
    namespaces, pods, policies = good_objects()
    for obj in namespaces:
        engine.namespaces.on_add(obj)
    for obj in pods:
        engine.pods.on_add(obj)
    for obj in policies:
        engine.policies.on_add(obj)


def rendered(engine: PolicyEngine) -> WantedState:
    """The IPv4 dataplane's rendered state (the engine's is FamilyDataplanes', as in `netagent run`)."""
    assert isinstance(engine.wanted, DualWanted) and isinstance(engine.wanted.parts[0].wanted, WantedState)
    return engine.wanted.parts[0].wanted


def good_programming(engine: PolicyEngine) -> dict:
    """The chains of the good pods and the members of the sets those chains use."""
    assert engine.plan is not None and engine.wanted is not None
    plans = {plan.key: plan for plan in engine.plan.pods if plan.key in GOOD_PODS}
    found: dict = {}
    for key, plan in plans.items():
        for allows, prefix in ((plan.ingress, owned.POLICY_INGRESS_PREFIX), (plan.egress, owned.POLICY_EGRESS_PREFIX)):
            if allows is None:
                continue
            found[pod_chain(prefix, key)] = rendered(engine).chains[pod_chain(prefix, key)]
            for allow in allows:
                for ref in set_refs(allow):
                    found[ref.name] = engine.plan.sets[ref]
    return found


def baseline(mode: PodAttachment) -> dict:
    engine, _, _ = new_engine(mode)
    feed_good(engine)
    assert engine.sync(SyncKind.FULL) is SyncResult.SUCCEEDED
    programming = good_programming(engine)
    assert len(programming) == 2          # y/c's ingress chain and its pod set: a real check
    return programming


BASELINE = {mode: baseline(mode) for mode in PodAttachment}


def check_written(engine: PolicyEngine, iptables: FakeIptables, ipset: FakeIpset) -> None:
    wanted = rendered(engine)
    table = iptables.table("filter")
    for name, rules in wanted.chains.items():
        assert tuple(table.chains[name].rules) == rules, name
        addresses = [rule[i + 1] for rule in rules for i, token in enumerate(rule[:-1]) if token in ("-s", "-d")]
        assert not [a for a in addresses if ":" in a], name     # IPv6 blocks and pods stay out of the IPv4 table
    for spec, members in wanted.sets.items():
        assert ipset.members(spec.name) == {canonical_member(spec.type, m) for m in members}
    assert ipset.members(owned.POLICY_KNOWN_SET) == wanted.known


def check_closed(engine: PolicyEngine) -> None:
    """Every local pod a closed policy selects is isolated in each of its directions."""
    assert engine.plan is not None
    plans = {plan.key: plan for plan in engine.plan.pods}
    for policy in engine.view.policies.values():
        if not policy.closed:
            continue
        for pod in engine.view.pods.values():
            plan = plans.get(pod.key)
            if plan is None or pod.namespace != policy.namespace:
                continue
            if pod.labels_known and not policy.pod_selector.matches(pod.label_map):
                continue
            for direction in policy.policy_types:
                allows = plan.ingress if direction is PolicyType.INGRESS else plan.egress
                assert allows is not None, (pod.key, policy.key, direction)


hostile_objects = st.lists(st.one_of(hostile_policy().map(lambda o: ("policy", o)),
                                     hostile_pod().map(lambda o: ("pod", o)),
                                     hostile_namespace().map(lambda o: ("namespace", o))), min_size=1, max_size=8)


@settings(max_examples=EXAMPLES, deadline=None, database=None, suppress_health_check=list(HealthCheck),
          print_blob=True)
@given(objects=hostile_objects, mode=st.sampled_from(list(PodAttachment)), hostile_first=st.booleans())
def test_hostile_objects_cost_good_objects_nothing_and_fail_closed(objects, mode, hostile_first):
    engine, iptables, ipset = new_engine(mode)
    recorders = {"policy": engine.policies, "pod": engine.pods, "namespace": engine.namespaces}
    if not hostile_first:
        feed_good(engine)
    for kind, obj in objects:
        recorders[kind].on_add(obj)
    if hostile_first:
        feed_good(engine)
    assert engine.sync(SyncKind.FULL) is SyncResult.SUCCEEDED           # the first sync: CNI waits for it
    assert good_programming(engine) == BASELINE[mode]
    assert set(GOOD_PODS.values()) <= rendered(engine).known
    check_written(engine, iptables, ipset)
    check_closed(engine)
    for rejection in engine.rejections.snapshot():
        event(f"rejected {rejection.ref.kind} ({rejection.reason})")
    event(f"closed policies: {min(3, sum(1 for p in engine.view.policies.values() if p.closed))}")
    victim = next((plan for plan in engine.plan.pods if plan.key == VICTIM), None)
    event(f"h/victim {'isolated' if victim is not None and victim.isolated else 'open or unprogrammed'}")
    rejected = {(r.ref.kind, r.ref.key) for r in engine.rejections.snapshot()}
    assert all(kind == "Namespace" or namespace in ("h", "h2") for kind, key in rejected
               for namespace in [key.rpartition("/")[0]])
    assert engine.sync(SyncKind.FULL) is SyncResult.SUCCEEDED           # adopts what it wrote
    assert not engine.last_report.wrote
    for kind, obj in objects:                                            # all gone: only the good remain
        recorders[kind].on_delete(obj)
    feed_good(engine)                                                   # a hostile namespace may have replaced h
    assert engine.sync(SyncKind.PARTIAL) is SyncResult.SUCCEEDED
    assert good_programming(engine) == BASELINE[mode]
    check_written(engine, iptables, ipset)
    assert engine.rejections.snapshot() == []

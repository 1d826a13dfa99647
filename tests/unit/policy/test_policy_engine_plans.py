"""The engine's planning (engine.py `_plan`): a change planned incrementally and written as a
whole node's plan would be; a FULL sync's check of the incremental plan against the whole
node's (the safety net); a failure falling back to the whole node; fail closed kept."""
from __future__ import annotations

import logging
from dataclasses import replace

from netagent.infra.metrics import Registry
from netagent.infra.sync_runner import SyncKind
from netagent.kernel.nftables.fake import FakeNft
from netagent.kernel.pod_attachment import PodAttachment
from netagent.policy import engine as engine_module
from netagent.policy import incremental, semantics
from netagent.policy.engine import PolicyEngine, PolicySettings
from netagent.policy.nftables.dataplane import NftablesDataplane
from netagent.policy.nftables.render import TABLE
from netagent.policy.semantics import NodePlan, plan_node
from netagent.policy.shared import RenderSettings
from tests.unit.policy.policy_objects import namespace, pod, policy

ISOLATE_A = {"podSelector": {"matchLabels": {"app": "a"}}, "policyTypes": ["Ingress"],
             "ingress": [{"from": [{"podSelector": {"matchLabels": {"role": "client"}},
                                    "namespaceSelector": {"matchLabels": {"team": "t"}}}]}]}


def node() -> tuple[PolicyEngine, FakeNft, Registry]:
    nft, registry = FakeNft(), Registry()
    engine = PolicyEngine(PolicySettings("node-1", RenderSettings(PodAttachment.BRIDGE, local_cidrs=("10.0.0.0/24",))),
                          dataplane=NftablesDataplane(nft), interface_of=lambda plan: "na0", registry=registry)
    for recorder in (engine.namespaces, engine.pods, engine.policies):
        recorder.on_synced()
    for name in ("x", "y"):
        engine.namespaces.on_add(namespace(name, team="t"))
    for index in range(6):
        engine.pods.on_add(pod("x" if index % 2 else "y", f"p{index}", f"10.0.0.{index + 2}", client(index, "server")))
    engine.policies.on_add(policy("x", "isolate", ISOLATE_A))
    engine.sync(SyncKind.FULL)
    return engine, nft, registry


def client(index: int, role: str) -> dict:
    return {"app": "a", "role": role, "n": str(index)}


def plans(kind: str) -> str:
    return f'netagent_policy_plans_total{{kind="{kind}"}}'


def metric(registry: Registry, name: str) -> float:
    for line in registry.render().splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    return 0.0


def whole(engine: PolicyEngine) -> NodePlan:
    return plan_node(engine._planned_view, node_name="node-1")


def test_a_label_change_is_planned_incrementally_and_written_as_the_whole_plan(monkeypatch):
    engine, nft, registry = node()
    monkeypatch.setattr(engine_module, "plan_node", lambda *a, **k: (_ for _ in ()).throw(AssertionError("whole")))
    engine.pods.on_update(pod("y", "p0", "10.0.0.2", client(0, "server")), pod("y", "p0", "10.0.0.2", client(0, "client")))
    engine.sync(SyncKind.PARTIAL)
    assert metric(registry, plans("incremental")) == 1
    assert "10.0.0.2" in nft.batches[-1] and "chain" not in nft.batches[-1]      # one set element, no chain
    monkeypatch.undo()
    assert engine.plan == whole(engine)
    fresh, fresh_nft, _ = node()
    fresh.pods.on_update(pod("y", "p0", "10.0.0.2", client(0, "server")), pod("y", "p0", "10.0.0.2", client(0, "client")))
    fresh.sync(SyncKind.FULL)
    assert nft.list_table("ip", TABLE) == fresh_nft.list_table("ip", TABLE)
    writes = len(nft.batches)
    engine.sync(SyncKind.FULL)                                   # the safety net agrees: nothing to write
    assert len(nft.batches) == writes and metric(registry, "netagent_policy_incremental_plan_mismatches_total") == 0


def test_a_full_sync_programs_the_whole_plan_when_the_incremental_one_differs(monkeypatch, caplog):
    engine, _, registry = node()
    right = engine.plan
    assert right is not None and right.pods[0].isolated
    wrong = NodePlan(tuple(replace(p, ingress=None, ingress_policies=()) for p in right.pods), {})
    monkeypatch.setattr(engine_module, "replan", lambda basis, view, node_name: wrong)
    engine.sync(SyncKind.PARTIAL)
    engine.pods.on_update(pod("y", "p0", "10.0.0.2", client(0, "server")), pod("y", "p0", "10.0.0.2", client(0, "x")))
    with caplog.at_level(logging.ERROR, logger="netagent.policy"):
        engine.sync(SyncKind.FULL)
    assert engine.plan == whole(engine) and engine.plan is not wrong
    assert metric(registry, "netagent_policy_incremental_plan_mismatches_total") == 1
    assert "differed" in caplog.text


def test_an_incremental_planning_failure_plans_the_whole_node(monkeypatch, caplog):
    engine, _, registry = node()
    monkeypatch.setattr(engine_module, "replan", lambda basis, view, node_name: 1 / 0)
    engine.pods.on_update(pod("y", "p0", "10.0.0.2", client(0, "server")), pod("y", "p0", "10.0.0.2", client(0, "client")))
    with caplog.at_level(logging.ERROR, logger="netagent.policy"):
        engine.sync(SyncKind.PARTIAL)
    assert engine.plan == whole(engine) and "incremental planning failed" in caplog.text
    assert metric(registry, plans("incremental")) == 0


def test_a_policy_that_cannot_be_planned_still_isolates_its_namespace(monkeypatch):
    engine, _, _ = node()
    real = semantics.policy_allows

    def failing(planner, policy, candidates):
        if policy.name == "bad":
            raise RuntimeError("cannot")
        return real(planner, policy, candidates)
    monkeypatch.setattr(semantics, "policy_allows", failing)
    monkeypatch.setattr(incremental, "policy_allows", failing)
    engine.policies.on_add(policy("y", "bad", {"podSelector": {}, "policyTypes": ["Egress"], "egress": [{}]}))
    for step in range(2):            # the policy's arrival, then a label change after it
        if step:
            engine.pods.on_update(pod("y", "p0", "10.0.0.2", client(0, "server")),
                                  pod("y", "p0", "10.0.0.2", client(0, "client")))
        engine.sync(SyncKind.PARTIAL)
        assert engine.plan is not None and engine.plan.problems
        in_y = [p for p in engine.plan.pods if p.key.startswith("y/")]
        assert in_y and all(p.ingress == () and p.egress == () for p in in_y)   # both ways, nothing allowed

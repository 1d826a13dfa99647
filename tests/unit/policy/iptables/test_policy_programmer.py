"""`IptablesDataplane` and `PolicyEngine` against FakeIptables and FakeIpset: what a sync
writes (only the difference), the order that keeps new pods closed, adoption after a restart
with no writes, drift repair, failures, and cleanup that leaves everything else alone."""
from __future__ import annotations

import copy
from dataclasses import replace

import pytest

from netagent.infra.metrics import Registry
from netagent.infra.sync_runner import SyncKind, SyncResult
from netagent.kernel import owned
from netagent.kernel.ipset import FakeIpset, iptables_references
from netagent.kernel.iptables.fake import FakeIptables
from netagent.kernel.iptables.restore_format import RestoreBuilder, jump_target
from netagent.kernel.pod_attachment import PodAttachment
from netagent.policy.engine import PolicyEngine, PolicySettings
from netagent.policy.iptables.dataplane import IptablesDataplane
from netagent.policy.iptables.render import BUCKET_PREFIX, OUTPUT_CHAIN, OUTPUT_JUMP_MATCH
from netagent.policy.shared import RenderSettings, ServicePath
from tests.unit.policy.policy_objects import namespace, pod, policy

FOREIGN = "*filter\n:OTHER - [0:0]\n-A FORWARD -j OTHER\n-A OTHER -s 192.0.2.0/24 -j ACCEPT\nCOMMIT\n"
DENY_FROM_NON_B = policy("x", "p", {"podSelector": {"matchLabels": {"pod": "a"}},
                                    "ingress": [{"from": [{"podSelector": {"matchLabels": {"pod": "b"}}}]}]})


class Node:
    def __init__(self, iptables: FakeIptables | None = None, ipset: FakeIpset | None = None) -> None:
        self.iptables = iptables or FakeIptables()
        self.ipset = ipset or FakeIpset(in_use=iptables_references(self.iptables))
        self.engine = self.new_engine()

    def new_engine(self, *, ipvs: bool = False) -> PolicyEngine:
        settings = RenderSettings(PodAttachment.ROUTED, local_cidrs=("10.0.0.0/24",),
                                  services=ServicePath.OUTPUT if ipvs else ServicePath.FORWARD)
        engine = PolicyEngine(PolicySettings("node-1", settings),
                              dataplane=IptablesDataplane(iptables=self.iptables, ipset=self.ipset),
                              interface_of=lambda plan: "na" + plan.ip.replace(".", "")[-12:].rjust(12, "0"),
                              registry=Registry())
        for recorder in (engine.namespaces, engine.pods, engine.policies):
            recorder.on_synced()
        for name in ("x", "y"):
            engine.namespaces.on_add(namespace(name))
        engine.pods.on_add(pod("x", "a", "10.0.0.2", {"pod": "a"}))
        engine.pods.on_add(pod("x", "b", "10.0.0.3", {"pod": "b"}))
        engine.pods.on_add(pod("y", "c", "10.0.1.4", {"pod": "c"}, node="node-2"))
        return engine

    def sync(self, kind=SyncKind.PARTIAL) -> SyncResult:
        return self.engine.sync(kind)

    def writes(self):
        return len(self.iptables.restores), len(self.ipset.writes)

    def chain(self, name: str):
        return self.iptables.table("filter").chains[name].rules


@pytest.fixture
def node():
    iptables = FakeIptables()
    iptables.restore(FOREIGN)
    return Node(iptables)


def test_first_sync_hooks_forward_first_and_programs_pods(node):
    node.engine.policies.on_add(DENY_FROM_NON_B)
    assert node.sync(SyncKind.FULL) is SyncResult.SUCCEEDED
    forward = node.chain("FORWARD")
    assert jump_target(forward[0]) == owned.POLICY_CHAIN and jump_target(forward[1]) == "OTHER"
    chains = node.iptables.list_chains("filter", prefix=owned.POLICY_PREFIX)
    assert len(chains) == 4                               # the hook, a bucket, x/a's ingress chain, the directory
    assert node.ipset.members(owned.POLICY_KNOWN_SET) == {"10.0.0.2", "10.0.0.3"}


def test_nothing_changed_nothing_written_and_restart_adopts_with_zero_writes(node):
    node.engine.policies.on_add(DENY_FROM_NON_B)
    node.sync(SyncKind.FULL)
    before = node.writes()
    node.sync(SyncKind.FULL)
    node.sync(SyncKind.PARTIAL)
    node.engine = node.new_engine()                       # an agent restart
    node.engine.policies.on_add(DENY_FROM_NON_B)
    assert node.sync(SyncKind.FULL) is SyncResult.SUCCEEDED
    assert node.writes() == before
    assert not node.engine.last_report.wrote


def test_label_change_is_one_set_member_not_a_rule(node):
    node.engine.policies.on_add(DENY_FROM_NON_B)
    node.sync(SyncKind.FULL)
    restores, set_writes = len(node.iptables.restores), len(node.ipset.writes)
    ready = pod("x", "b", "10.0.0.3", {"pod": "b"})
    ready["status"]["conditions"] = [{"type": "Ready", "status": "True"}]
    node.engine.pods.on_update(pod("x", "b", "10.0.0.3", {"pod": "b"}), ready)
    assert node.engine.pods.pending() == 0                # nothing a policy reads changed
    node.engine.pods.on_update(pod("x", "b", "10.0.0.3", {"pod": "b"}), pod("x", "b", "10.0.0.3", {"pod": "x"}))
    node.sync()
    assert len(node.iptables.restores) == restores
    assert node.ipset.writes[set_writes:] == [node.ipset.writes[-1]]
    assert node.ipset.writes[-1].removed == ("10.0.0.3",) and not node.ipset.writes[-1].added


def test_new_pod_joins_known_only_after_its_chain_exists(node):
    node.engine.policies.on_add(DENY_FROM_NON_B)
    node.sync(SyncKind.FULL)
    node.ipset.writes.clear()
    node.iptables.restores.clear()
    node.engine.pods.on_add(pod("x", "a2", "10.0.0.9", {"pod": "a"}))
    node.sync()
    assert len(node.iptables.restores) == 1 and "10.0.0.9" not in "".join(
        m for w in node.ipset.writes[:-1] for m in w.added)
    assert node.ipset.writes[-1].name == owned.POLICY_KNOWN_SET and node.ipset.writes[-1].added == ("10.0.0.9",)


def test_pod_without_interface_stays_closed_until_found(node):
    lookup = node.engine.interface_of
    node.engine.interface_of = lambda plan: None
    node.engine.policies.on_add(DENY_FROM_NON_B)
    assert node.sync(SyncKind.FULL) is SyncResult.SUCCEEDED     # not a failure: /healthz stays green
    assert node.ipset.members(owned.POLICY_KNOWN_SET) == {"10.0.0.3"}
    assert node.engine.wanted.pending == ("x/a",)
    assert node.engine.metrics.pods.labels(state="pending").value == 1
    node.engine.interface_of = lookup
    node.sync(SyncKind.PARTIAL)                                  # nothing changed, but it looks again
    assert node.ipset.members(owned.POLICY_KNOWN_SET) == {"10.0.0.2", "10.0.0.3"}


def test_drift_is_repaired_by_a_full_sync_only(node):
    node.engine.policies.on_add(DENY_FROM_NON_B)
    node.sync(SyncKind.FULL)
    (pod_chain,) = [c for c in node.iptables.list_chains("filter") if c.startswith(owned.POLICY_INGRESS_PREFIX)]
    wanted_rules = list(node.chain(pod_chain))
    node.iptables.restore(f"*filter\n-F {pod_chain}\n-D FORWARD -m comment --comment \"netagent: network policy\" "
                          f"-j {owned.POLICY_CHAIN}\n-A FORWARD -m comment --comment \"netagent: network policy\" "
                          f"-j {owned.POLICY_CHAIN}\nCOMMIT\n")
    set_name = next(iter(node.engine.wanted.sets)).name
    node.ipset.update(set_name, remove=["10.0.0.3"])
    node.sync(SyncKind.PARTIAL)
    assert node.chain(pod_chain) == []                    # a partial sync trusts its record
    node.sync(SyncKind.FULL)
    report = node.engine.last_report
    assert report.chains_written == 1 and report.jump_repaired
    assert node.chain(pod_chain) == wanted_rules
    assert jump_target(node.chain("FORWARD")[0]) == owned.POLICY_CHAIN
    assert node.ipset.members(set_name) == {"10.0.0.3"}


def test_deleting_the_policy_removes_chains_and_sets(node):
    node.engine.policies.on_add(DENY_FROM_NON_B)
    node.sync(SyncKind.FULL)
    node.engine.policies.on_delete(DENY_FROM_NON_B)
    node.sync()
    assert node.iptables.list_chains("filter", prefix=owned.POLICY_PREFIX) == {owned.POLICY_CHAIN,
                                                                              BUCKET_PREFIX + "N0a000000"}
    assert node.ipset.owned_names(prefix=owned.POLICY_PREFIX) == [owned.POLICY_KNOWN_SET]


def test_a_failed_write_makes_the_next_sync_read_the_kernel(node, monkeypatch):
    node.engine.policies.on_add(DENY_FROM_NON_B)
    node.sync(SyncKind.FULL)
    node.engine.pods.on_add(pod("x", "a3", "10.0.0.10", {"pod": "a"}))
    real = node.iptables.restore

    def broken(text, **kwargs):
        raise RuntimeError("injected")
    monkeypatch.setattr(node.iptables, "restore", broken)
    with pytest.raises(RuntimeError):
        node.sync()
    assert "10.0.0.10" not in node.ipset.members(owned.POLICY_KNOWN_SET)
    monkeypatch.setattr(node.iptables, "restore", real)
    node.sync(SyncKind.PARTIAL)
    assert "10.0.0.10" in node.ipset.members(owned.POLICY_KNOWN_SET)


def test_cleanup_removes_ours_only(node):
    node.engine.policies.on_add(DENY_FROM_NON_B)
    node.sync(SyncKind.FULL)
    removed = node.engine.dataplane.cleanup()
    assert removed and not node.iptables.list_chains("filter", prefix=owned.POLICY_PREFIX)
    assert node.ipset.owned_names(prefix=owned.POLICY_PREFIX) == []
    assert node.chain("FORWARD") == [("-j", "OTHER")] and "OTHER" in node.iptables.table("filter").chains
    assert node.engine.dataplane.cleanup() == []


def test_unreadable_fields_are_reported_once_and_counted(node, caplog):
    bad = policy("x", "bad", {"podSelector": {}, "ingress": [{"from": [{"ipBlock": {"cidr": "nope"}}]}]})
    node.engine.policies.on_add(bad)
    node.sync(SyncKind.FULL)
    [rejection] = node.engine.rejections.snapshot()
    assert (rejection.ref.kind, rejection.ref.key, rejection.reason) == ("NetworkPolicy", "x/bad", "malformed")
    assert rejection.detail == \
        "NetworkPolicy x/bad: ingress[0].from[0].ipBlock.cidr: 'nope' is not a CIDR; this peer is ignored"
    node.sync(SyncKind.FULL)
    assert len([r for r in caplog.records if "rejected" in r.getMessage()]) == 1      # logged once
    # fail closed: x/a and x/b are isolated with nothing allowed
    assert all(p.ingress == () for p in node.engine.plan.pods)
    node.engine.policies.on_delete(bad)                       # deleted: no longer rejected
    node.sync(SyncKind.PARTIAL)
    assert node.engine.rejections.snapshot() == []


def test_ipvs_hooks_output_first_adopts_with_zero_writes_and_unhooks_when_off(node):
    node.iptables.restore("*filter\n-A OUTPUT -d 192.0.2.9/32 -j ACCEPT\nCOMMIT\n")
    node.engine = node.new_engine(ipvs=True)
    node.engine.policies.on_add(DENY_FROM_NON_B)
    assert node.sync(SyncKind.FULL) is SyncResult.SUCCEEDED
    output = node.chain("OUTPUT")
    assert jump_target(output[0]) == OUTPUT_CHAIN and output[0][:5] == OUTPUT_JUMP_MATCH
    assert output[1:] == [("-d", "192.0.2.9/32", "-j", "ACCEPT")]
    assert jump_target(node.chain("FORWARD")[0]) == owned.POLICY_CHAIN
    before = node.writes()
    node.engine = node.new_engine(ipvs=True)                  # a restart adopts both hooks
    node.engine.policies.on_add(DENY_FROM_NON_B)
    node.sync(SyncKind.FULL)
    assert node.writes() == before and not node.engine.last_report.wrote
    node.iptables.restore(RestoreBuilder().delete("filter", "OUTPUT", output[0]).text())
    assert jump_target(node.chain("OUTPUT")[0]) != OUTPUT_CHAIN
    node.sync(SyncKind.FULL)                                  # drift: the jump is put back, first
    assert node.engine.last_report.jump_repaired and jump_target(node.chain("OUTPUT")[0]) == OUTPUT_CHAIN
    node.engine = node.new_engine()                           # restarted in another proxy mode
    node.engine.policies.on_add(DENY_FROM_NON_B)
    assert node.sync(SyncKind.FULL) is SyncResult.SUCCEEDED
    assert node.chain("OUTPUT") == [("-d", "192.0.2.9/32", "-j", "ACCEPT")]
    chains = node.iptables.list_chains("filter", prefix=owned.POLICY_PREFIX)
    assert OUTPUT_CHAIN not in chains and not any(name.startswith(BUCKET_PREFIX + "S") for name in chains)


def test_cleanup_removes_the_ipvs_output_hook_too(node):
    node.engine = node.new_engine(ipvs=True)
    node.engine.policies.on_add(DENY_FROM_NON_B)
    node.sync(SyncKind.FULL)
    assert jump_target(node.chain("OUTPUT")[0]) == OUTPUT_CHAIN
    assert node.engine.dataplane.cleanup()
    assert node.chain("OUTPUT") == [] and not node.iptables.list_chains("filter", prefix=owned.POLICY_PREFIX)


def test_partial_apply_compares_by_value_what_is_not_shared(node):
    """A PARTIAL apply finds the difference by identity first; a state equal in value but sharing
    nothing (every chain and member set rebuilt) writes nothing, and a changed member still is."""
    node.engine.policies.on_add(DENY_FROM_NON_B)
    node.sync(SyncKind.FULL)
    dataplane, wanted = node.engine.dataplane, node.engine.wanted
    before = node.writes()
    rebuilt = copy.deepcopy(wanted)
    assert rebuilt.chains is not wanted.chains and rebuilt == wanted
    assert not dataplane.apply(rebuilt, full=False).wrote and node.writes() == before
    spec = next(iter(rebuilt.sets))
    grown = replace(rebuilt, sets={**rebuilt.sets, spec: rebuilt.sets[spec] | {"10.0.0.9"}})
    report = dataplane.apply(grown, full=False)
    assert (report.sets_changed, report.chains_written, len(node.iptables.restores)) == (1, 0, before[0])
    assert "10.0.0.9" in node.ipset.members(spec.name)


def test_partial_apply_of_a_new_hook_chain_reads_the_kernel_and_hooks_it(node):
    node.engine.policies.on_add(DENY_FROM_NON_B)
    node.sync(SyncKind.FULL)
    ipvs = node.new_engine(ipvs=True)
    ipvs.policies.on_add(DENY_FROM_NON_B)
    with_output = ipvs.dataplane.render(node.engine.plan, settings=ipvs.settings.render,
                                        interface_of=node.engine.interface_of)
    assert OUTPUT_CHAIN in with_output.chains
    report = node.engine.dataplane.apply(with_output, full=False)     # the engine's dataplane: its last state has none
    assert report.jump_repaired
    assert any(jump_target(rule) == OUTPUT_CHAIN for rule in node.chain("OUTPUT"))

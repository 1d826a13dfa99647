"""edits.py and the PARTIAL apply that uses it: a one-pod ADD or DEL edits the bucket and
directory chains in place (no chain re-declared but the pod's own), lands the kernel exactly
where a FULL apply of the same state would, writes members after the chains in one ipset
exec, and falls back to the FULL apply when the kernel refuses an edit."""
from __future__ import annotations

import time

import pytest

from netagent.infra.metrics import Registry
from netagent.infra.sync_runner import SyncKind, SyncResult
from netagent.kernel import owned
from netagent.kernel.ipset import FakeIpset, iptables_references
from netagent.kernel.iptables.fake import FakeIptables
from netagent.kernel.iptables.restore_format import RestoreBuilder, parse_restore
from netagent.kernel.pod_attachment import PodAttachment
from netagent.policy.engine import PolicyEngine, PolicySettings
from netagent.policy.iptables.dataplane import IptablesDataplane
from netagent.policy.iptables.edits import chain_edits, render_edits
from netagent.policy.shared import RenderSettings
from tests.unit.policy.policy_objects import namespace, pod, policy

A, B, C, D = ("-j", "A"), ("-j", "B"), ("-j", "C"), ("-j", "D")
ISOLATE_A = policy("x", "p", {"podSelector": {"matchLabels": {"app": "a"}},
                              "ingress": [{"from": [{"podSelector": {"matchLabels": {"app": "b"}}}]}]})


@pytest.mark.parametrize("held, wanted, edits", [
    ((A, C, D), (A, B, C, D), ([], [(2, B)])),             # a hook between two
    ((A, B, C), (A, B, C, D), ([], [(4, D)])),             # at the end
    ((A, B, C, D), (A, C, D), ([B], [])),                  # one leaves
    ((A, B), (A, C), None),                            # as many edits as rules: rewritten
    ((A, B, C, D), (B, A, C, D), None),                    # kept rules reordered
    ((A, A, C), (A, A, B, C), None),                       # a rule twice
    ((A, B), (), None),                                    # emptied: rewritten (declared)
])
def test_chain_edits(held, wanted, edits):
    assert chain_edits(held, wanted) == edits


def test_inserts_land_in_order_and_past_the_end_is_an_append():
    builder, whole = render_edits("filter", {"K": (A, B, C, D), "NEW": (A,)}, {"K": (A, C)})
    lines = builder.text().splitlines()
    assert whole == 1 and lines[1] == ":NEW - [0:0]"
    assert "-I K 2 -j B" in lines and "-A K -j D" in lines and not any(line.startswith(":K") for line in lines)


class Node:
    def __init__(self) -> None:
        self.iptables = FakeIptables()
        self.ipset = FakeIpset(in_use=iptables_references(self.iptables))
        self.dataplane = IptablesDataplane(iptables=self.iptables, ipset=self.ipset)
        settings = RenderSettings(PodAttachment.ROUTED, local_cidrs=("10.0.0.0/24",))
        self.engine = PolicyEngine(PolicySettings("node-1", settings), dataplane=self.dataplane,
                                   interface_of=lambda plan: "na0" + plan.ip.replace(".", "")[-11:].rjust(11, "0"),
                                   registry=Registry())
        for recorder in (self.engine.namespaces, self.engine.pods, self.engine.policies):
            recorder.on_synced()
        self.engine.namespaces.on_add(namespace("x"))
        for index in range(2, 12):                         # ten isolated pods, every hook in bucket I0
            self.engine.pods.on_add(pod("x", f"a{index}", f"10.0.0.{index * 2}", {"app": "a"}))
        self.engine.pods.on_add(pod("x", "b", "10.0.0.3", {"app": "b"}))
        self.engine.policies.on_add(ISOLATE_A)
        assert self.engine.sync(SyncKind.FULL) is SyncResult.SUCCEEDED

    def bind(self, name: str, address: str, labels: dict) -> None:
        scheduled = pod("x", name, "", labels)
        scheduled["status"] = {"phase": "Pending"}
        self.engine.pods.on_add(scheduled)
        self.engine.sync(SyncKind.PARTIAL)
        outcome = self.engine.bind_pod("x", name, (f"{address}/32",), "na0" + address.replace(".", "")[-11:].rjust(11, "0"),
                                       container_id=name, deadline=time.monotonic() + 30)
        assert outcome.programmed and outcome.incremental, outcome

    def settled(self) -> bool:
        """A FULL apply of what the engine last applied finds nothing to write."""
        return not self.dataplane.apply(self.dataplane._last, full=True).wrote


@pytest.mark.parametrize("labels", [{"app": "a"}, {"app": "b"}, {"app": "none"}])
def test_a_bind_edits_the_shared_chains_and_lands_where_a_full_apply_would(labels):
    node = Node()
    node.iptables.restores.clear()
    node.ipset.writes.clear()
    node.bind("new", "10.0.0.5", labels)
    (record,) = node.iptables.restores
    declared = [line[1:].split()[0] for line in record.text.splitlines() if line.startswith(":")]
    assert all(name.startswith((owned.POLICY_INGRESS_PREFIX, owned.POLICY_EGRESS_PREFIX)) for name in declared)
    assert any(line.startswith(("-I ", "-A ")) for line in record.text.splitlines())
    assert {write.name for write in node.ipset.writes} <= {owned.POLICY_KNOWN_SET} | {
        name for name in node.ipset.list_names() if name.startswith(owned.POLICY_PREFIX)}
    assert node.ipset.writes[-1].name == owned.POLICY_KNOWN_SET and node.ipset.writes[-1].added == ("10.0.0.5",)
    assert node.settled()


def test_an_unbind_deletes_the_hook_and_entry_by_spec():
    node = Node()
    node.bind("new", "10.0.0.5", {"app": "a"})
    node.iptables.restores.clear()
    outcome = node.engine.unbind_pod("x", "new", container_id="new", deadline=time.monotonic() + 30)
    assert outcome.programmed and outcome.incremental
    (record,) = node.iptables.restores
    block = next(parse_restore(record.text))
    assert {entry.op.value for entry in block.entries} == {"-D", "-F", "-X"}
    assert "10.0.0.5" not in node.ipset.members(owned.POLICY_KNOWN_SET)
    assert node.settled()


def test_a_refused_edit_falls_back_to_the_full_apply(caplog):
    node = Node()
    node.bind("new", "10.0.0.5", {"app": "a"})
    bucket = next(name for name in node.iptables.table("filter").chains if name.startswith(owned.POLICY_CHAIN[:-7] + "I"))
    hooks = node.iptables.table("filter").chains[bucket].rules
    doomed = next(rule for rule in hooks if "x/new" in " ".join(rule))
    node.iptables.restore(RestoreBuilder().delete("filter", bucket, doomed).text())   # someone else removed our hook
    outcome = node.engine.unbind_pod("x", "new", container_id="new", deadline=time.monotonic() + 30)
    assert outcome.programmed
    assert any("applying from the kernel" in record.getMessage() for record in caplog.records)
    assert "10.0.0.5" not in node.ipset.members(owned.POLICY_KNOWN_SET)
    assert node.settled()

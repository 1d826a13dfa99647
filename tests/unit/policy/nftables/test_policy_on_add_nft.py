"""The same engine entry (`PolicyEngine.bind_pod`) on the nftables dataplane, against FakeNft:
the ADD's pod programmed in one transaction, the kubelet's report writing none, a burst of 50
in one transaction, DEL removing it (test_policy_on_add.py has the rest, on iptables)."""
from __future__ import annotations

import time

from netagent.infra.metrics import Registry
from netagent.infra.sync_runner import SyncKind
from netagent.kernel import owned
from netagent.kernel.nftables.fake import FakeNft
from netagent.kernel.pod_attachment import PodAttachment
from netagent.policy.engine import PolicyEngine, PolicySettings
from netagent.policy.nftables.dataplane import NftablesDataplane
from netagent.policy.shared import RenderSettings
from tests.unit.policy.policy_objects import namespace, pod, policy
from tests.unit.policy.nftables.test_policy_nft import TABLE
from tests.unit.policy.test_policy_on_add import burst_while_a_sync_runs

LONG = 30.0


def veth(ip: str) -> str:
    return "na" + ip.replace(".", "")[-12:].rjust(12, "0")


class Node:
    def __init__(self) -> None:
        self.nft = FakeNft()
        settings = RenderSettings(PodAttachment.BRIDGE, local_cidrs=("10.0.0.0/24",))
        self.engine = PolicyEngine(PolicySettings("node-1", settings), dataplane=NftablesDataplane(self.nft),
                                   interface_of=lambda plan: veth(plan.ip), registry=Registry())
        for recorder in (self.engine.namespaces, self.engine.pods, self.engine.policies):
            recorder.on_synced()
        self.engine.namespaces.on_add(namespace("x"))
        self.engine.pods.on_add(pod("x", "b", "10.0.0.3", {"app": "b"}))
        self.engine.policies.on_add(policy("x", "p", {"podSelector": {"matchLabels": {"app": "a"}},
                                                      "ingress": [{"from": [{"podSelector": {}}]}]}))
        self.engine.sync(SyncKind.FULL)

    def add(self, name: str, ip: str):
        return self.engine.bind_pod("x", name, (f"{ip}/24",), veth(ip), container_id=f"c-{name}",
                                    deadline=time.monotonic() + LONG)

    def known(self) -> str:
        found = self.nft.list_table("ip", TABLE)
        assert found is not None
        return str([obj for obj in found if (obj.get("set") or {}).get("name") == owned.POLICY_KNOWN_SET])


def scheduled(name: str, labels: dict) -> dict:
    return pod("x", name, None, labels, phase="Pending")


def test_bind_programs_in_one_transaction_and_the_report_writes_nothing():
    node = Node()
    node.engine.pods.on_add(scheduled("a", {"app": "a"}))
    node.engine.sync(SyncKind.PARTIAL)
    before = len(node.nft.batches)
    assert node.add("a", "10.0.0.2").programmed
    assert len(node.nft.batches) == before + 1 and "10.0.0.2" in node.known()
    node.engine.pods.on_update(scheduled("a", {"app": "a"}), pod("x", "a", "10.0.0.2", {"app": "a"}))
    node.engine.sync(SyncKind.PARTIAL)
    node.engine.sync(SyncKind.FULL)
    assert len(node.nft.batches) == before + 1
    assert node.engine.unbind_pod("x", "a", container_id="c-a", deadline=time.monotonic() + LONG).programmed
    assert "10.0.0.2" not in node.known()


def test_fifty_concurrent_binds_are_one_transaction():
    node = Node()
    for index in range(50):
        node.engine.pods.on_add(scheduled(f"p{index}", {"app": "a"}))
    node.engine.sync(SyncKind.PARTIAL)
    before = len(node.nft.batches)
    outcomes = burst_while_a_sync_runs(node.engine, lambda i: node.add(f"p{i}", f"10.0.0.{100 + i}"), 50)
    assert len(outcomes) == 50 and all(o.programmed for o in outcomes)
    assert len(node.nft.batches) == before + 1
    known = node.known()
    assert all(f"10.0.0.{100 + i}" in known for i in range(50))


def test_a_refused_partial_write_falls_back_to_the_full_apply(caplog):
    node = Node()
    node.engine.pods.on_add(scheduled("a", {"app": "a"}))
    node.engine.sync(SyncKind.PARTIAL)
    node.nft.apply(f"delete table ip {TABLE}\n")           # someone removed the table behind our back
    outcome = node.add("a", "10.0.0.2")
    assert outcome.programmed and outcome.incremental, outcome
    assert any("applying from the kernel" in record.getMessage() for record in caplog.records)
    assert "10.0.0.2" in node.known() and "10.0.0.3" in node.known()    # the whole table written again
    before = len(node.nft.batches)
    node.engine.sync(SyncKind.FULL)
    assert len(node.nft.batches) == before


def test_an_isolated_pods_batch_declares_its_sets_again_instead_of_adding_elements():
    node = Node()
    node.engine.pods.on_add(scheduled("a", {"app": "a"}))
    node.engine.sync(SyncKind.PARTIAL)
    before = len(node.nft.batches)
    assert node.add("a", "10.0.0.2").programmed
    (batch,) = node.nft.batches[before:]
    assert "add element" not in batch and "add chain" in batch
    assert f"add set ip {TABLE} {owned.POLICY_KNOWN_SET} {{ type ipv4_addr; elements = {{ 10.0.0.2 comment" in batch
    node.engine.sync(SyncKind.FULL)                      # the table read back is the one rendered
    assert len(node.nft.batches) == before + 1

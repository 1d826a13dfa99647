"""The incremental path of one new pod (`semantics.plan_with_pod`, `PolicyDataplane.render_with_pod` + `apply`),
against the stateful fakes of both dataplanes.

The property: for a random cluster (namespaces, local and remote pods, labels, policies) and a
new local pod bound by its ADD, the kernel after the incremental bind equals the kernel of a
node that had the pod from the start, and a full sync afterwards writes nothing; a DEL's
unbind equals the pod never there. These clusters (no named ports, no shared addresses, sets
far from their capacity) always take the one-pod path, which the tests assert;
`test_a_new_pod_takes_the_incremental_path_in_one_write` counts its writes.
"""
from __future__ import annotations

import time

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from netagent.infra.metrics import Registry
from netagent.infra.sync_runner import SyncKind
from netagent.kernel.ipset import FakeIpset, iptables_references
from netagent.kernel.iptables.fake import FakeIptables
from netagent.kernel.nftables.fake import FakeNft
from netagent.kernel.pod_attachment import PodAttachment
from netagent.policy import engine as engine_module
from netagent.policy.engine import PolicyEngine, PolicySettings
from netagent.policy.iptables.dataplane import IptablesDataplane
from netagent.kernel.nftables import tables
from netagent.policy.nftables.dataplane import NftablesDataplane
from netagent.policy.shared import RenderSettings, ServicePath
from netagent.policy.nftables.render import TABLE
from tests.unit.policy.policy_objects import namespace, pod, policy

LONG = 30.0
NAMESPACES = ("x", "y")
LABEL = st.dictionaries(st.sampled_from(("app", "tier")), st.sampled_from(("a", "b")), max_size=2)


def veth(ip: str) -> str:
    return "na" + ip.replace(".", "")[-12:].rjust(12, "0")


class Node:
    """One node's engine over a dataplane's fakes: `writes()` counts every kernel write."""

    def __init__(self, dataplane: str, mode: PodAttachment, *, ipvs: bool = False) -> None:
        self.dataplane = dataplane
        if dataplane == "nft":
            self.nft = FakeNft()
            programmer: IptablesDataplane | NftablesDataplane = NftablesDataplane(self.nft)
        else:
            self.iptables = FakeIptables()
            self.ipset = FakeIpset(in_use=iptables_references(self.iptables))
            programmer = IptablesDataplane(iptables=self.iptables, ipset=self.ipset)
        render = RenderSettings(mode, local_cidrs=("10.0.0.0/24",),
                                services=ServicePath.OUTPUT if ipvs else ServicePath.FORWARD)
        self.registry = Registry()
        self.engine = PolicyEngine(PolicySettings("node-1", render), dataplane=programmer,
                                   interface_of=lambda plan: veth(plan.ip), registry=self.registry)
        for recorder in (self.engine.namespaces, self.engine.pods, self.engine.policies):
            recorder.on_synced()

    def load(self, cluster: dict, *, new_pod_ip: str | None) -> None:
        for name, labels in cluster["namespaces"].items():
            self.engine.namespaces.on_add(namespace(name, **labels))
        for obj in cluster["pods"]:
            self.engine.pods.on_add(obj)
        ns, labels = cluster["new"]
        self.engine.pods.on_add(pod(ns, "new", new_pod_ip, labels, phase="Running" if new_pod_ip else "Pending"))
        for index, spec in enumerate(cluster["policies"]):
            self.engine.policies.on_add(policy(spec.pop("_ns"), f"p{index}", spec))
        self.engine.sync(SyncKind.FULL)

    def bind(self, ns: str, ip: str):
        return self.engine.bind_pod(ns, "new", (f"{ip}/24",), veth(ip), container_id="c-new",
                                    deadline=time.monotonic() + LONG)

    def writes(self) -> int:
        if self.dataplane == "nft":
            return len(self.nft.batches)
        return len(self.iptables.restores) + len(self.ipset.writes)

    def kernel(self) -> object:
        if self.dataplane == "nft":
            return comparable(tables.read_table("ip", TABLE, self.nft.list_table("ip", TABLE)))
        return self.iptables.save("filter"), {name: contents.members for name, contents in self.ipset.snapshot().items()}



def comparable(table: tables.Table | None) -> object:
    """A table read back, element order aside (the kernel lists in hash order)."""
    assert table is not None
    return ({chain.name: (chain.base, [rule.comment for rule in chain.rules]) for chain in table.chains},
            {entry.name: (type(entry), entry.key_type, frozenset(entry.flags),
                          frozenset((tables.canonical_part(" . ".join(e.key)), e.value, e.comment) for e in entry.elements))
             for entry in table.sets})


@st.composite
def clusters(draw) -> dict:
    namespaces = {name: draw(LABEL) for name in NAMESPACES}
    pods = []
    for index in range(draw(st.integers(0, 8))):
        ns = draw(st.sampled_from(NAMESPACES))
        local = draw(st.booleans())
        ip = f"10.0.0.{10 + index}" if local else f"10.1.0.{10 + index}"
        pods.append(pod(ns, f"pod{index}", ip, draw(LABEL), node="node-1" if local else "node-2"))
    selector = st.builds(lambda labels: {"matchLabels": labels}, LABEL)
    peer = st.one_of(
        st.builds(lambda s: {"podSelector": s}, selector),
        st.builds(lambda s, n: {"podSelector": s, "namespaceSelector": n}, selector, selector),
        st.just({"ipBlock": {"cidr": "10.2.0.0/16", "except": ["10.2.1.0/24"]}}))
    rule = st.builds(lambda peers, port: {"from": peers, "to": peers, **port},
                     st.lists(peer, min_size=1, max_size=2),
                     st.sampled_from(({}, {"ports": [{"protocol": "TCP", "port": 80}]})))
    policies = []
    for _ in range(draw(st.integers(0, 4))):
        types = draw(st.sampled_from((["Ingress"], ["Egress"], ["Ingress", "Egress"])))
        rules = draw(st.lists(rule, max_size=2))
        spec: dict = {"_ns": draw(st.sampled_from(NAMESPACES)), "podSelector": draw(selector), "policyTypes": types}
        if "Ingress" in types:
            spec["ingress"] = [{"from": r["from"], **({"ports": r["ports"]} if "ports" in r else {})} for r in rules]
        if "Egress" in types:
            spec["egress"] = [{"to": r["to"], **({"ports": r["ports"]} if "ports" in r else {})} for r in rules]
        policies.append(spec)
    return {"namespaces": namespaces, "pods": pods, "policies": policies,
            "new": (draw(st.sampled_from(NAMESPACES)), draw(LABEL))}


def _copy(cluster: dict) -> dict:
    return {**cluster, "policies": [dict(spec) for spec in cluster["policies"]]}


@pytest.mark.parametrize("dataplane", ["nft", "iptables"])
@pytest.mark.parametrize("mode", [PodAttachment.BRIDGE, PodAttachment.ROUTED])
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cluster=clusters(), ipvs=st.booleans())
def test_incremental_bind_equals_the_pod_from_the_start(dataplane, mode, cluster, ipvs):
    new_ip = "10.0.0.200"
    incremental = Node(dataplane, mode, ipvs=ipvs)
    incremental.load(_copy(cluster), new_pod_ip=None)
    outcome = incremental.bind(cluster["new"][0], new_ip)
    assert outcome.programmed and outcome.incremental     # these clusters never need the full path
    from_start = Node(dataplane, mode, ipvs=ipvs)
    from_start.load(_copy(cluster), new_pod_ip=new_ip)
    assert incremental.kernel() == from_start.kernel()
    writes = incremental.writes()
    incremental.engine.sync(SyncKind.PARTIAL)
    incremental.engine.sync(SyncKind.FULL)
    incremental.engine.pods.on_update(pod(cluster["new"][0], "new", None, cluster["new"][1], phase="Pending"),
                                      pod(cluster["new"][0], "new", new_ip, cluster["new"][1]))
    incremental.engine.sync(SyncKind.PARTIAL)       # the kubelet's report of the same address
    assert incremental.writes() == writes
    assert incremental.kernel() == from_start.kernel()


@pytest.mark.parametrize("dataplane", ["nft", "iptables"])
def test_a_new_pod_takes_the_incremental_path_in_one_write(dataplane, monkeypatch):
    node = Node(dataplane, PodAttachment.BRIDGE)
    cluster = {"namespaces": {"x": {}, "y": {}},
               "pods": [pod("x", "b", "10.0.0.3", {"app": "b"}), pod("y", "c", "10.1.0.3", {"app": "a"})],
               "policies": [{"_ns": "x", "podSelector": {"matchLabels": {"app": "a"}}, "policyTypes": ["Ingress"],
                             "ingress": [{"from": [{"podSelector": {"matchLabels": {"app": "b"}}}]}]},
                            {"_ns": "y", "podSelector": {}, "policyTypes": ["Egress"],
                             "egress": [{"to": [{"namespaceSelector": {}, "podSelector": {"matchLabels":
                                                                                          {"app": "a"}}}]}]}],
               "new": ("x", {"app": "a"})}
    node.load(cluster, new_pod_ip=None)
    plans = []
    full_plan = engine_module.plan_node
    monkeypatch.setattr(engine_module, "plan_node", lambda *a, **k: plans.append(1) or full_plan(*a, **k))
    before = node.writes()
    ipset_before = 0 if dataplane == "nft" else len(node.ipset.writes)
    assert node.bind("x", "10.0.0.200").programmed
    assert plans == []                                   # no plan of the whole node
    if dataplane == "nft":                               # one batch, naming the new pod alone
        assert node.writes() - before == 1
        text = node.nft.batches[-1]
        assert "10.0.0.200" in text and "NETAGENT-NP-KNOWN" in text
        created = [line for line in text.splitlines() if line.startswith("add set") and "elements =" not in line]
        assert "flush" not in text and "delete" not in text and len(created) == 1  # x's app=b set, new
    else:                                                # one iptables-restore; ipset: the address, KNOWN last
        assert len(node.iptables.restores) == before - ipset_before + 1
        writes = node.ipset.writes[ipset_before:]
        created = [w.name for w in writes if w.kind == "create"]
        assert len(created) == 1                         # x's app=b set, which the new pod's chain names
        updates = [w for w in writes if w.kind == "update" and w.name not in created]
        assert [(w.added, w.removed) for w in updates] == [(("10.0.0.200",), ())] * 2
        assert writes[-1].name == "NETAGENT-NP-KNOWN"    # the pod joins KNOWN last
    assert 'netagent_policy_pods{state="isolated"} 2' in node.registry.render()    # c (egress), the new pod
    report = node.engine.last_report
    assert report is not None and report.chains_written <= 5 and not report.chains_removed   # its chain, 2 buckets, directory, head
    after = node.writes()
    node.engine.sync(SyncKind.FULL)
    assert node.writes() == after


@pytest.mark.parametrize("dataplane", ["nft", "iptables"])
@pytest.mark.parametrize("mode", [PodAttachment.BRIDGE, PodAttachment.ROUTED])
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cluster=clusters(), reported=st.booleans(), ipvs=st.booleans())
def test_incremental_unbind_equals_the_pod_never_there(dataplane, mode, cluster, reported, ipvs):
    new_ip = "10.0.0.200"
    ns, labels = cluster["new"]
    node = Node(dataplane, mode, ipvs=ipvs)
    node.load(_copy(cluster), new_pod_ip=None)
    assert node.bind(ns, new_ip).incremental
    if reported:                                    # the kubelet reported the address before the DEL
        node.engine.pods.on_update(pod(ns, "new", None, labels, phase="Pending"), pod(ns, "new", new_ip, labels))
        node.engine.sync(SyncKind.PARTIAL)
    outcome = node.engine.unbind_pod(ns, "new", container_id="c-new", deadline=time.monotonic() + LONG)
    assert outcome.programmed and outcome.incremental
    never = Node(dataplane, mode, ipvs=ipvs)
    never.load(_copy(cluster), new_pod_ip=None)
    assert node.kernel() == never.kernel()
    writes = node.writes()
    node.engine.sync(SyncKind.PARTIAL)
    node.engine.sync(SyncKind.FULL)
    assert node.writes() == writes

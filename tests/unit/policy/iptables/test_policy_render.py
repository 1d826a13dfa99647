"""The policy renderer against golden files (bridge and routed mode), and its invariants.

The goldens in tests/unit/golden/policy/ are the complete restore text for one policy that
uses every kind of match (selector peer, ipBlock with except, named port on ingress and on
egress, an SCTP range, UDP to 0.0.0.0/0). After an intended change, rewrite them with
`UPDATE_GOLDEN=1 .venv/bin/python -m pytest tests/unit/policy/iptables/test_policy_render.py -q` and review
`git diff tests/unit/golden/policy/`.
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from netagent.kernel import owned
from netagent.kernel.ipset.model import IpsetType
from netagent.kernel.pod_attachment import PodAttachment
from netagent.policy.iptables.render import render_chains, render_wanted
from netagent.policy.shared import RenderSettings, ServicePath
from netagent.policy.semantics import plan_node
from tests.unit.policy.policy_objects import policy
from tests.unit.policy.test_policy_semantics import PODS, view_of

GOLDEN_DIR = Path(__file__).resolve().parents[2] / "golden" / "policy"
VETH = "na0123456789ab"
DIRECTORY = "NETAGENT-NP-N0a000000"             # the pod directory of 10.0.0.0/28
WEB = policy("x", "web", {"podSelector": {"matchLabels": {"pod": "a"}}, "ingress": [
    {"from": [{"podSelector": {"matchLabels": {"pod": "b"}}},
              {"ipBlock": {"cidr": "10.0.0.0/8", "except": ["10.0.1.0/24"]}}],
     "ports": [{"port": "serve"}, {"protocol": "SCTP", "port": 9000, "endPort": 9010}]}],
    "egress": [{"to": [{"namespaceSelector": {"matchLabels": {"team": "blue"}}}], "ports": [{"port": "serve"}]},
               {"to": [{"ipBlock": {"cidr": "0.0.0.0/0"}}], "ports": [{"protocol": "UDP", "port": 53}]}]})


def _services(ipvs: bool) -> ServicePath:
    return ServicePath.OUTPUT if ipvs else ServicePath.FORWARD


def wanted(mode: PodAttachment, *policies: dict, interface=lambda plan: VETH, ipvs: bool = False):
    plan = plan_node(view_of(*PODS, *policies), node_name="node-1")
    return render_wanted(plan, settings=RenderSettings(mode, local_cidrs=("10.0.0.0/24",), services=_services(ipvs)),
                         interface_of=interface)


@pytest.mark.parametrize("ipvs", [False, True], ids=["", "ipvs"])
@pytest.mark.parametrize("mode", list(PodAttachment), ids=lambda m: m.value)
def test_golden(mode, ipvs):
    text = render_chains(wanted(mode, WEB, ipvs=ipvs).chains).text()
    path = GOLDEN_DIR / f"{mode.value}{'-ipvs' if ipvs else ''}.rules"
    if os.environ.get("UPDATE_GOLDEN"):
        path.write_text(text)
    assert text == path.read_text()


def test_sets_members_and_types():
    state = wanted(PodAttachment.BRIDGE, WEB)
    by_type = {spec.type: members for spec, members in state.sets.items()}
    assert by_type == {IpsetType.HASH_IP: {"10.0.0.3"}, IpsetType.HASH_NET: {"10.0.1.0/24"},
                       IpsetType.HASH_IP_PORT: {"10.0.1.2,tcp:8080"}}
    assert all(spec.name.startswith(owned.POLICY_SET_PREFIX) and len(spec.name) <= 31 for spec in state.sets)
    assert state.known == {"10.0.0.2", "10.0.0.3"}


def test_open_pods_need_no_interface_and_unknown_interfaces_stay_closed():
    state = wanted(PodAttachment.ROUTED, WEB, interface=lambda plan: None)
    assert state.pending == ("x/a",)
    assert state.known == {"10.0.0.3"}          # x/b is open: known without an interface
    assert list(state.chains) == [owned.POLICY_CHAIN, DIRECTORY]
    assert [rule[-1] for rule in state.chains[DIRECTORY]] == ["netagent policy: pod x/b 10.0.0.3"]


def test_no_policy_leaves_only_the_hook_chain_and_the_pod_directory():
    state = wanted(PodAttachment.BRIDGE)
    assert list(state.chains) == [owned.POLICY_CHAIN, DIRECTORY] and not state.sets
    assert [rule[:2] for rule in state.chains[DIRECTORY]] == [("-d", "10.0.0.2/32"), ("-d", "10.0.0.3/32")]
    assert all("-j" not in rule for rule in state.chains[DIRECTORY])     # it only names pods: no target
    assert all(rule[-1] in ("RETURN", "DROP") for rule in state.chains[owned.POLICY_CHAIN])


def test_names_fit_the_kernel_limits():
    state = wanted(PodAttachment.BRIDGE, WEB)
    assert all(len(name) <= 28 for name in state.chains)


@pytest.mark.parametrize("mode", list(PodAttachment), ids=lambda m: m.value)
def test_every_pod_chain_is_reached_through_exactly_one_bucket(mode):
    import hashlib

    from netagent.kernel.iptables.restore_format import jump_target
    from tests.unit.policy.policy_objects import pod
    many = [pod("x", f"p{i}", f"10.0.0.{10 + i}", {"pod": "a"}) for i in range(60)]
    plan = plan_node(view_of(*PODS, *many, WEB), node_name="node-1")
    state = render_wanted(plan, settings=RenderSettings(mode, local_cidrs=("10.0.0.0/24",)),
                          interface_of=lambda p: "na" + hashlib.sha256(p.ip.encode()).hexdigest()[:12])
    top = [jump_target(rule) for rule in state.chains[owned.POLICY_CHAIN]]
    buckets = [name for name in state.chains if name in top and name != owned.POLICY_CHAIN]
    # egress and ingress spread over the 16 digits each (and, in bridge mode, the 5 /28s of 10.0.0.2-69)
    assert len(buckets) == (32 + 5 if mode is PodAttachment.BRIDGE else 32)
    reached: dict[str, int] = {}
    for bucket in buckets:
        for rule in state.chains[bucket]:
            reached[jump_target(rule)] = reached.get(jump_target(rule), 0) + 1
    pod_chains = [name for name in state.chains if name.startswith((owned.POLICY_INGRESS_PREFIX,
                                                                   owned.POLICY_EGRESS_PREFIX))]
    hooks_per_chain = {owned.POLICY_EGRESS_PREFIX: 1,
                       owned.POLICY_INGRESS_PREFIX: 2 if mode is PodAttachment.BRIDGE else 1}
    assert len(pod_chains) == 2 * 61 and all(reached[name] == hooks_per_chain[name[:13]] for name in pod_chains)


@pytest.mark.parametrize("mode", list(PodAttachment), ids=lambda m: m.value)
def test_ipvs_output_chain_reaches_every_pod_chain_once_by_address(mode):
    """With IPVS, NETAGENT-NP-OUTPUT lets replies and the node's own connections pass, keeps
    the KNOWN guard, and reaches each pod chain once: egress by source, ingress by destination
    and the device the packet leaves by (the veth when routed, the bridge otherwise)."""
    from netagent.kernel.iptables.restore_format import jump_target
    from netagent.policy.iptables.render import OUTPUT_CHAIN
    state = wanted(mode, WEB, ipvs=True)
    head = state.chains[OUTPUT_CHAIN]
    assert "RELATED,ESTABLISHED" in head[0] and ("--src-type", "LOCAL") == head[1][head[1].index("--src-type"):][:2]
    assert [rule[-1] for rule in head[2:4]] == ["DROP", "DROP"]
    reached = {jump_target(rule): rule for bucket in head[4:] for rule in state.chains[jump_target(bucket)]}
    pod_chains = [name for name in state.chains if name.startswith((owned.POLICY_INGRESS_PREFIX,
                                                                   owned.POLICY_EGRESS_PREFIX))]
    assert sorted(reached) == sorted(pod_chains) and len(pod_chains) == 2
    device = VETH if mode is PodAttachment.ROUTED else owned.DEFAULT_BRIDGE
    for name, rule in reached.items():
        if name.startswith(owned.POLICY_INGRESS_PREFIX):
            assert ("-d", "10.0.0.2/32", "-o", device) == rule[:4]
        else:
            assert ("-s", "10.0.0.2/32") == rule[:2]
    assert OUTPUT_CHAIN not in wanted(mode, WEB).chains           # nothing of it without IPVS

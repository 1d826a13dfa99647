"""The IPv6 policy rendering through the real tools (issue 22), in the style of
test_restore_parity.py: the ip6tables restore text and the `family inet6` sets of a dual-stack
plan's IPv6 half go to the real `ip6tables-restore` and `ipset restore` (legacy and nft
backends, in a throwaway namespace) and to FakeIptables/FakeIpset; both must take them and
hold the same rules, as ip6tables-save prints them. Then a FULL apply through the real tools
adopts what is there with no write (what ip6tables-save and `ipset save` print reads back
equal to the render), and cleanup leaves none of ours in either family.
"""
from __future__ import annotations

from netagent.kernel import namespaces, owned
from netagent.kernel.families import IpFamily
from netagent.kernel.ipset import FakeIpset, IpsetRunner, iptables_references
from netagent.kernel.iptables.fake import FakeIptables
from netagent.kernel.iptables.runner import IptablesRunner
from netagent.kernel.pod_attachment import PodAttachment
from netagent.policy.families import FamilyDataplanes
from netagent.policy.iptables.dataplane import IptablesDataplane
from netagent.policy.shared import RenderSettings
from netagent.policy.semantics import plan_node
from tests.netns.test_restore_parity import comparable
from tests.unit.policy.test_policy_families import CIDRS, PODS, WEB, view_of

SETTINGS = RenderSettings(PodAttachment.BRIDGE, local_cidrs=CIDRS)     # no IPVS match in this kernel


def _dataplanes(iptables: dict, ipset) -> FamilyDataplanes:
    return FamilyDataplanes({family: IptablesDataplane(iptables=iptables[family], ipset=ipset, family=family)
                             for family in IpFamily})


def test_ipv6_rules_and_inet6_sets_read_alike_adopt_and_clean_up(netns, backend):
    prefix = namespaces.exec_prefix(netns)
    real = {family: IptablesRunner(backend=backend, family=family, exec_prefix=prefix, timeout=120,
                                   lock_wait_seconds=60) for family in IpFamily}
    fake = {family: FakeIptables(backend=backend, family=family) for family in IpFamily}
    refs = [iptables_references(f) for f in fake.values()]
    real_ipset, fake_ipset = IpsetRunner(exec_prefix=prefix, timeout=30), FakeIpset(
        in_use=lambda name: any(ref(name) for ref in refs))
    plan = plan_node(view_of(*PODS, WEB), node_name="node-1")
    for iptables, ipset in ((real, real_ipset), (fake, fake_ipset)):
        dataplanes = _dataplanes(iptables, ipset)
        state = dataplanes.render(plan, settings=SETTINGS, interface_of=lambda p: "na0123456789ab")
        assert dataplanes.apply(state, full=True).wrote
    for family in IpFamily:
        assert comparable(real[family].save("filter")) == comparable(fake[family].save("filter")), family
    v6 = real[IpFamily.V6].save("filter")
    assert "-A NETAGENT-NP-FORWARD -s fd00:0:0:1::/64 -m set ! --match-set NETAGENT-NP-KNOWN6 src" in v6
    assert "fd00" not in real[IpFamily.V4].save("filter")
    held = real_ipset.snapshot()
    assert held == fake_ipset.snapshot()
    assert {c.family for name, c in held.items() if name.startswith(owned.POLICY_SET6_PREFIX)} == {"inet6"}
    assert held[owned.POLICY_KNOWN_SET6].members == {"fd00:0:0:1::2", "fd00:0:0:1::3", "fd00:0:0:1::5"}

    restarted = _dataplanes(real, real_ipset)     # a restarted agent reads both families back
    state = restarted.render(plan, settings=SETTINGS, interface_of=lambda p: "na0123456789ab")
    assert not restarted.apply(state, full=True).wrote

    restarted.cleanup()
    assert not [name for name in real_ipset.snapshot() if name.startswith(owned.POLICY_PREFIX)]
    assert all(owned.POLICY_PREFIX not in real[family].save("filter") for family in IpFamily)

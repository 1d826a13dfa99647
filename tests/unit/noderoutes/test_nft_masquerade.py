"""The nftables masquerade (`noderoutes/masquerade_nft.py`): the rendered batch against a
golden, and `NftMasqueradeManager` against `FakeNft` and `FakeIptables`: idempotence (a second
ensure writes nothing), drift repair in one transaction, the iptables forward accept kept only
while iptables' FORWARD policy is DROP, cleanup that leaves other tables alone."""
from __future__ import annotations

from typing import Any

import pytest

from netagent.kernel.iptables.fake import FakeIptables
from netagent.kernel.nftables.fake import FakeNft
from netagent.noderoutes.masquerade_nft import (
    FAMILY,
    TABLE,
    NftMasqueradeManager,
    masquerade_table,
    render_masquerade_nft,
)

GOLDEN = """\
add table ip netagent-masq
delete table ip netagent-masq
add table ip netagent-masq
add set ip netagent-masq CLUSTER-CIDRS { type ipv4_addr; flags interval; }
add element ip netagent-masq CLUSTER-CIDRS { 10.96.0.0/12, 10.244.0.0/16 }
add set ip netagent-masq LOCAL-POD-CIDRS { type ipv4_addr; flags interval; }
add element ip netagent-masq LOCAL-POD-CIDRS { 10.244.1.0/24 }
add chain ip netagent-masq POSTROUTING { type nat hook postrouting priority srcnat + 10; policy accept; }
add rule ip netagent-masq POSTROUTING ip saddr @CLUSTER-CIDRS ip daddr @CLUSTER-CIDRS return comment "netagent: pod to pod keeps the pod address [7410d0fb]"
add rule ip netagent-masq POSTROUTING ip saddr @CLUSTER-CIDRS ip daddr != 224.0.0.0/4 masquerade fully-random comment "netagent: pods leaving the cluster use the node address [eeabd960]"
add rule ip netagent-masq POSTROUTING ip daddr @LOCAL-POD-CIDRS return comment "netagent: outside to local pods keeps the client address [c82d9e95]"
add rule ip netagent-masq POSTROUTING ip daddr @CLUSTER-CIDRS masquerade fully-random comment "netagent: outside to remote pods is masqueraded for the return path [90c9d350]"
add chain ip netagent-masq FORWARD { type filter hook forward priority filter + 10; policy accept; }
add rule ip netagent-masq FORWARD ip saddr @CLUSTER-CIDRS accept comment "netagent: forward from pods [413809de]"
add rule ip netagent-masq FORWARD ip daddr @CLUSTER-CIDRS accept comment "netagent: forward to pods [bd25947c]"
"""
CIDRS: dict[str, Any] = {"cluster_cidrs": ["10.244.0.0/16", "10.96.0.0/12"], "pod_cidrs": ["10.244.1.0/24"]}


def test_render_matches_the_golden_and_loads():
    batch = render_masquerade_nft(masquerade_table(**CIDRS))
    assert batch == GOLDEN
    FakeNft().apply(batch)


@pytest.mark.parametrize("bad", [{"cluster_cidrs": ["fd00::/48"], "pod_cidrs": []},
                                 {"cluster_cidrs": ["10.244.0.0/16"], "pod_cidrs": ["10.1.0.0/24"]},
                                 {"cluster_cidrs": [], "pod_cidrs": []},
                                 {"cluster_cidrs": ["224.0.0.0/3"], "pod_cidrs": []}])
def test_bad_cidrs_are_refused(bad):
    with pytest.raises(ValueError):
        masquerade_table(**bad)


def manager(**extra) -> tuple[NftMasqueradeManager, FakeNft]:
    nft = FakeNft()
    return NftMasqueradeManager(nft=nft, **CIDRS, **extra), nft


def test_ensure_writes_once_then_nothing():
    masq, nft = manager()
    assert masq.check() == [f"table {FAMILY} {TABLE} missing"]
    assert masq.ensure()
    assert masq.check() == [] and masq.ensure() == []
    assert len(nft.batches) == 1


@pytest.mark.parametrize("damage, problem", [
    (f"flush chain ip {TABLE} POSTROUTING", "chain POSTROUTING: 0 rule(s) differ from the 4 wanted"),
    (f"delete element ip {TABLE} CLUSTER-CIDRS {{ 10.96.0.0/12 }}", "set CLUSTER-CIDRS holds other networks"),
    (f"add element ip {TABLE} LOCAL-POD-CIDRS {{ 10.244.2.0/24 }}", "set LOCAL-POD-CIDRS holds other networks"),
    (f"add chain ip {TABLE} FORWARD {{ type filter hook forward priority 10; policy drop; }}", "chain FORWARD is not"),
    (f"add chain ip {TABLE} EXTRA", "chains not ours to keep"),
    (f"add rule ip {TABLE} FORWARD drop", "chain FORWARD: 3 rule(s) differ"),
    (f"delete table ip {TABLE}", "table ip netagent-masq missing"),
])
def test_drift_is_seen_and_repaired_in_one_batch(damage, problem):
    masq, nft = manager()
    masq.ensure()
    nft.apply(damage)
    found = masq.check()
    assert any(line.startswith(problem) for line in found), found
    assert masq.ensure() == found
    assert masq.check() == [] and len(nft.batches) == 3


def test_other_cidrs_are_drift_for_a_restarted_agent():
    masq, nft = manager()
    masq.ensure()
    moved = NftMasqueradeManager(nft=nft, cluster_cidrs=["10.244.0.0/16"], pod_cidrs=["10.244.7.0/24"])
    assert moved.ensure() and moved.check() == [] and masq.check()


def test_iptables_forward_accept_only_while_forward_drops():
    iptables = FakeIptables()
    masq, nft = manager(forward_iptables=iptables)
    masq.ensure()
    assert not iptables.restores and "NETAGENT" not in iptables.save()
    iptables.restore("*filter\n:FORWARD DROP [0:0]\nCOMMIT\n")
    assert masq.check()
    repaired = masq.ensure()
    assert repaired and masq.check() == []
    assert "NETAGENT-FORWARD" in iptables.save("filter") and "NETAGENT-POSTRTG" not in iptables.save()
    writes = len(iptables.restores)
    assert masq.ensure() == [] and len(iptables.restores) == writes
    iptables.restore("*filter\n:FORWARD ACCEPT [0:0]\nCOMMIT\n")
    assert masq.ensure() == ["iptables forward accept removed: FORWARD accepts"]
    assert "NETAGENT" not in iptables.save() and masq.check() == []
    assert len(nft.batches) == 1


def test_cleanup_removes_our_table_only():
    iptables = FakeIptables()
    masq, nft = manager(forward_iptables=iptables)
    nft.apply("add table ip other-tool\nadd chain ip other-tool Keep\n")
    iptables.restore("*filter\n:FORWARD DROP [0:0]\nCOMMIT\n")
    masq.ensure()
    masq.cleanup()
    masq.cleanup()
    assert nft.tables() == [("ip", "other-tool")]
    assert "NETAGENT" not in iptables.save()


def test_the_iptables_masquerade_of_an_iptables_mode_run_is_removed():
    from netagent.noderoutes.masquerade import MasqueradeManager
    iptables = FakeIptables()
    MasqueradeManager(runner=iptables, **CIDRS).ensure()
    masq, _ = manager(forward_iptables=iptables)
    assert "iptables nat NETAGENT-POSTRTG of an iptables-mode run removed" in masq.ensure()
    assert "NETAGENT" not in iptables.save() and masq.check() == [] and masq.ensure() == []


def test_the_node_agent_masquerades_in_nft_when_given_an_nft():
    """`HostAccess.nft` chooses the nftables masquerade (the daemon passes it in nftables mode):
    the table is programmed at start and repaired by a full sync; no iptables rule of ours."""
    import dataclasses

    from netagent.infra.metrics import Registry
    from netagent.infra.sync_runner import SyncKind, SyncResult
    from netagent.noderoutes.agent import NodeAgent
    from netagent.noderoutes.host import Masquerade
    from tests.unit.noderoutes.node_agent_support import AgentWorld

    world = AgentWorld(masquerade=Masquerade.ON)
    nft = FakeNft()
    host = dataclasses.replace(world.agent.host, nft=nft)
    agent = NodeAgent(world.agent.settings, api=world.api, host=host, registry=Registry())
    agent.start()
    try:
        assert nft.list_table(FAMILY, TABLE) is not None and "NETAGENT" not in world.iptables.save()
        nft.apply(f"delete table {FAMILY} {TABLE}")
        assert agent.runner is not None
        assert agent.runner.run_now_and_wait(timeout=60, kind=SyncKind.FULL) is SyncResult.SUCCEEDED
        masquerade_batches = [batch for batch in nft.batches if "netagent-tunnel" not in batch]  # the filter's too
        assert nft.list_table(FAMILY, TABLE) is not None and len(masquerade_batches) == 3
    finally:
        agent.stop()

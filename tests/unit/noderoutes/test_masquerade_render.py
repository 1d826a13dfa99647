"""Masquerade rules: rendered text against goldens, and MasqueradeManager against FakeIptables
(idempotence, drift repair, cleanup that leaves other tools' rules alone)."""
import ipaddress

import pytest

from netagent.kernel.families import IpFamily
from netagent.kernel.iptables.fake import FakeIptables
from netagent.kernel.iptables.restore_format import jump_target
from netagent.kernel.iptables.runner import PortRandomization
from netagent.noderoutes.masquerade import MasqueradeManager, render_masquerade_rules

GOLDEN_ONE_CIDR = """\
*nat
:NETAGENT-POSTRTG - [0:0]
-A NETAGENT-POSTRTG -s 10.244.0.0/16 -d 10.244.0.0/16 -m comment --comment "netagent: pod to pod keeps the pod address" -j RETURN
-A NETAGENT-POSTRTG -s 10.244.0.0/16 ! -d 224.0.0.0/4 -m comment --comment "netagent: pods leaving the cluster use the node address" -j MASQUERADE --random-fully
-A NETAGENT-POSTRTG -d 10.244.1.0/24 -m comment --comment "netagent: outside to local pods keeps the client address" -j RETURN
-A NETAGENT-POSTRTG -d 10.244.0.0/16 -m comment --comment "netagent: outside to remote pods is masqueraded for the return path" -j MASQUERADE --random-fully
COMMIT
*filter
:NETAGENT-FORWARD - [0:0]
-A NETAGENT-FORWARD -s 10.244.0.0/16 -m comment --comment "netagent: forward from pods" -j ACCEPT
-A NETAGENT-FORWARD -d 10.244.0.0/16 -m comment --comment "netagent: forward to pods" -j ACCEPT
COMMIT
"""

GOLDEN_TWO_CIDRS_OLD_IPTABLES = """\
*nat
:NA2-POSTRTG - [0:0]
-A NA2-POSTRTG -s 10.96.0.0/12 -d 10.96.0.0/12 -m comment --comment "netagent: pod to pod keeps the pod address" -j RETURN
-A NA2-POSTRTG -s 10.96.0.0/12 -d 10.244.0.0/16 -m comment --comment "netagent: pod to pod keeps the pod address" -j RETURN
-A NA2-POSTRTG -s 10.244.0.0/16 -d 10.96.0.0/12 -m comment --comment "netagent: pod to pod keeps the pod address" -j RETURN
-A NA2-POSTRTG -s 10.244.0.0/16 -d 10.244.0.0/16 -m comment --comment "netagent: pod to pod keeps the pod address" -j RETURN
-A NA2-POSTRTG -s 10.96.0.0/12 ! -d 224.0.0.0/4 -m comment --comment "netagent: pods leaving the cluster use the node address" -j MASQUERADE
-A NA2-POSTRTG -s 10.244.0.0/16 ! -d 224.0.0.0/4 -m comment --comment "netagent: pods leaving the cluster use the node address" -j MASQUERADE
-A NA2-POSTRTG -d 10.244.7.0/24 -m comment --comment "netagent: outside to local pods keeps the client address" -j RETURN
-A NA2-POSTRTG -d 10.96.0.0/12 -m comment --comment "netagent: outside to remote pods is masqueraded for the return path" -j MASQUERADE
-A NA2-POSTRTG -d 10.244.0.0/16 -m comment --comment "netagent: outside to remote pods is masqueraded for the return path" -j MASQUERADE
COMMIT
*filter
:NA2-FORWARD - [0:0]
-A NA2-FORWARD -s 10.96.0.0/12 -m comment --comment "netagent: forward from pods" -j ACCEPT
-A NA2-FORWARD -d 10.96.0.0/12 -m comment --comment "netagent: forward to pods" -j ACCEPT
-A NA2-FORWARD -s 10.244.0.0/16 -m comment --comment "netagent: forward from pods" -j ACCEPT
-A NA2-FORWARD -d 10.244.0.0/16 -m comment --comment "netagent: forward to pods" -j ACCEPT
COMMIT
"""

CLUSTER = ["10.244.0.0/16"]
PODS = ["10.244.1.0/24"]


def test_render_one_cluster_cidr_golden():
    text = render_masquerade_rules(cluster_cidrs=[ipaddress.ip_network("10.244.0.0/16")],
                                   pod_cidrs=[ipaddress.ip_network("10.244.1.0/24")])
    assert text == GOLDEN_ONE_CIDR


def test_render_two_cluster_cidrs_without_random_fully_golden():
    text = render_masquerade_rules(cluster_cidrs=["10.244.0.0/16", "10.96.0.0/12"], pod_cidrs=["10.244.7.0/24"],
                                   chain_prefix="NA2-", ports=PortRandomization.KERNEL_DEFAULT)
    assert text == GOLDEN_TWO_CIDRS_OLD_IPTABLES


def test_render_ipv6_excepts_ipv6_multicast():
    text = render_masquerade_rules(cluster_cidrs=["fd00:10::/56"], pod_cidrs=["fd00:10:0:1::/64"])
    assert '-s fd00:10::/56 ! -d ff00::/8 -m comment' in text
    assert '-d fd00:10:0:1::/64 -m comment' in text


def test_render_is_the_same_for_any_order_or_duplicates_of_the_same_networks():
    one = render_masquerade_rules(cluster_cidrs=["10.244.0.0/16", "10.96.0.0/12"], pod_cidrs=["10.244.1.0/24"])
    other = render_masquerade_rules(cluster_cidrs=["10.96.0.0/12", "10.244.0.0/16", "10.244.0.0/17"],
                                    pod_cidrs=["10.244.1.0/24", "10.244.1.0/24"])
    assert one == other


@pytest.mark.parametrize("cluster, pods, complaint", [
    ([], PODS, "at least one cluster CIDR"),
    (CLUSTER, ["10.99.1.0/24"], "outside every cluster CIDR"),
    (CLUSTER, ["fd00::/64"], "is not IPv4"),
    (["224.0.0.0/3"], ["224.1.0.0/24"], "overlaps multicast"),
    (["10.244.0.1/16"], PODS, "bad cluster CIDR"),
])
def test_render_rejects_bad_networks(cluster, pods, complaint):
    with pytest.raises(ValueError, match=complaint):
        render_masquerade_rules(cluster_cidrs=cluster, pod_cidrs=pods)


def test_rendered_text_is_valid_restore_input():
    fake = FakeIptables()
    fake.restore(GOLDEN_ONE_CIDR)
    fake.restore(GOLDEN_ONE_CIDR)  # a second time: the declarations empty and refill
    assert len(fake.table("nat").chains["NETAGENT-POSTRTG"].rules) == 4


# ---- the manager against the fake ---------------------------------------------------------

DOCKER_LIKE = """\
*nat
:DOCKER - [0:0]
-A POSTROUTING -s 172.17.0.0/16 ! -o docker0 -j MASQUERADE
-A POSTROUTING -j DOCKER
COMMIT
*filter
:FORWARD DROP [0:0]
:DOCKER-USER - [0:0]
-A FORWARD -j DOCKER-USER
COMMIT
"""


@pytest.fixture
def fake():
    fake = FakeIptables()
    fake.restore(DOCKER_LIKE)
    return fake


@pytest.fixture
def manager(fake):
    return MasqueradeManager(runner=fake, cluster_cidrs=CLUSTER, pod_cidrs=PODS)


def rules(fake, table, chain):
    return fake.table(table).chains[chain].rules


def targets(fake, table, chain):
    return [jump_target(rule) for rule in rules(fake, table, chain)]


def test_ensure_installs_chains_and_jumps_on_top(fake, manager):
    repaired = manager.ensure()
    assert repaired and manager.check() == []
    assert targets(fake, "nat", "POSTROUTING") == ["NETAGENT-POSTRTG", "MASQUERADE", "DOCKER"]
    assert targets(fake, "filter", "FORWARD") == ["NETAGENT-FORWARD", "DOCKER-USER"]
    assert rules(fake, "nat", "POSTROUTING")[0] == (
        "-m", "comment", "--comment", "netagent: pod egress masquerade", "-j", "NETAGENT-POSTRTG")
    assert fake.table("filter").chains["FORWARD"].policy == "DROP"
    assert len(rules(fake, "nat", "NETAGENT-POSTRTG")) == 4


def test_a_second_ensure_writes_nothing(fake, manager):
    manager.ensure()
    writes = len(fake.restores)
    assert manager.ensure() == []
    assert len(fake.restores) == writes


def test_first_ensure_is_one_restore(fake, manager):
    writes = len(fake.restores)
    manager.ensure()
    assert len(fake.restores) == writes + 1


def test_ensure_repairs_a_flushed_chain_and_touches_only_that_table(fake, manager):
    manager.ensure()
    fake.restore("*nat\n-F NETAGENT-POSTRTG\nCOMMIT\n")
    assert manager.check() == ["nat NETAGENT-POSTRTG: 0 rule(s) differ from the 4 wanted"]
    manager.ensure()
    assert manager.check() == []
    assert "*filter" not in fake.restores[-1].text


def test_ensure_repairs_a_deleted_jump(fake, manager):
    manager.ensure()
    fake.restore('*filter\n-D FORWARD -m comment --comment "netagent: forward pod traffic" -j NETAGENT-FORWARD\nCOMMIT\n')
    assert manager.check() == ["filter FORWARD: no jump to NETAGENT-FORWARD"]
    manager.ensure()
    assert targets(fake, "filter", "FORWARD") == ["NETAGENT-FORWARD", "DOCKER-USER"]


def test_ensure_repairs_a_jump_pushed_down_and_a_foreign_rule_in_our_chain(fake, manager):
    manager.ensure()
    fake.restore("*nat\n-I POSTROUTING -j RETURN\n-A NETAGENT-POSTRTG -j RETURN\nCOMMIT\n")
    problems = manager.check()
    assert len(problems) == 2 and "comes after 1 rule(s) not ours" in problems[1]
    manager.ensure()
    assert manager.check() == []
    assert targets(fake, "nat", "POSTROUTING") == ["NETAGENT-POSTRTG", "RETURN", "MASQUERADE", "DOCKER"]


def test_cleanup_removes_ours_only_and_is_quiet_the_second_time(fake, manager):
    before = fake.save()
    manager.ensure()
    fake.restore("*nat\n:NETAGENT-SERVICES - [0:0]\n-A PREROUTING -j NETAGENT-SERVICES\nCOMMIT\n")
    manager.cleanup()
    assert "NETAGENT-POSTRTG" not in fake.save() and "NETAGENT-FORWARD" not in fake.save()
    assert fake.list_chains("nat") == {"NETAGENT-SERVICES"}  # another component's chain stays
    fake.restore("*nat\n-D PREROUTING -j NETAGENT-SERVICES\n-X NETAGENT-SERVICES\nCOMMIT\n")
    assert fake.save() == before
    writes = len(fake.restores)
    manager.cleanup()
    assert len(fake.restores) == writes


def test_manager_leaves_out_random_fully_on_old_iptables():
    old = FakeIptables(version=(1, 6, 1))
    MasqueradeManager(runner=old, cluster_cidrs=CLUSTER, pod_cidrs=PODS).ensure()
    masquerades = [rule for rule in rules(old, "nat", "NETAGENT-POSTRTG") if "MASQUERADE" in rule]
    assert masquerades and all(rule[-1] == "MASQUERADE" for rule in masquerades)


def test_manager_refuses_a_runner_of_the_other_family():
    with pytest.raises(ValueError, match="IPv6"):
        MasqueradeManager(runner=FakeIptables(), cluster_cidrs=["fd00:10::/56"], pod_cidrs=["fd00:10:0:1::/64"])
    v6 = FakeIptables(family=IpFamily.V6)
    MasqueradeManager(runner=v6, cluster_cidrs=["fd00:10::/56"], pod_cidrs=["fd00:10:0:1::/64"]).ensure()
    assert v6.list_chains("nat") == {"NETAGENT-POSTRTG"}


def test_a_changed_pod_cidr_rewrites_the_chain(fake, manager):
    manager.ensure()
    moved = MasqueradeManager(runner=fake, cluster_cidrs=CLUSTER, pod_cidrs=["10.244.9.0/24"])
    assert moved.check() == ["nat NETAGENT-POSTRTG: 4 rule(s) differ from the 4 wanted"]
    moved.ensure()
    assert ("-d", "10.244.9.0/24") == rules(fake, "nat", "NETAGENT-POSTRTG")[2][:2]
    assert manager.check() != [] and moved.check() == []

"""Which peers the planner admits: pod CIDRs inside the cluster CIDR and clear of reserved
ranges, public IPs that can carry a tunnel, and conflicts resolved by seniority (the older Node
keeps a CIDR, public IP or VTEP MAC; a newcomer never wins, whatever its name)."""
from datetime import datetime, timezone
from ipaddress import IPv4Address, IPv4Network, ip_network

import pytest

from netagent.noderoutes.routing.model import LocalNode, Mode, Peer, PeerBounds, RefusalReason, RoutingSettings
from netagent.noderoutes.routing.plan import render_plan
from netagent.noderoutes.routing.vxlan import vtep_mac

LOCAL = LocalNode(name="node-1", vtep_mac=vtep_mac("node-1"), public_ip=IPv4Address("198.18.16.11"), underlay_ifname="eth0",
                  underlay_network=IPv4Network("198.18.16.0/20"), underlay_mtu=1500,
                  pod_cidrs=(IPv4Network("10.244.1.0/24"),))
BOUNDS = PeerBounds(cluster_cidrs=(IPv4Network("10.0.0.0/8"),),
                    reserved=((IPv4Network("10.96.0.0/12"), "the service range (--service-cidr)"),
                              (IPv4Network("10.200.0.0/24"), "this node's network on eth1")))
VXLAN = RoutingSettings(mode=Mode.VXLAN)


def at(day: int) -> datetime:
    return datetime(2026, 1, day, tzinfo=timezone.utc)


def peer(name, ip, *cidrs, mac="derive", created=None, uid=""):
    return Peer(name=name, public_ip=IPv4Address(ip), pod_cidrs=tuple(ip_network(c) for c in cidrs),
                vtep_mac=vtep_mac(name) if mac == "derive" else mac, created=created, uid=uid)


def labels(plan) -> dict:
    return {name: refused.label for name, refused in plan.refused.items()}


def all_routes(plan) -> set:
    return {route.dst for peer_plan in plan.peers.values() for route in peer_plan.routes}


@pytest.mark.parametrize("cidr, label, words", [
    ("169.254.169.254/32", RefusalReason.OUTSIDE_CLUSTER_CIDR, "outside the cluster CIDR (10.0.0.0/8"),
    ("0.0.0.0/0", RefusalReason.OUTSIDE_CLUSTER_CIDR, "outside the cluster CIDR"),
    ("198.18.16.0/20", RefusalReason.OUTSIDE_CLUSTER_CIDR, "outside the cluster CIDR"),
    ("10.96.0.0/16", RefusalReason.RESERVED, "overlaps the service range (--service-cidr) 10.96.0.0/12"),
    ("10.96.0.10/32", RefusalReason.RESERVED, "overlaps the service range"),
    ("10.0.0.0/8", RefusalReason.RESERVED, "overlaps the service range"),
    ("10.200.0.128/25", RefusalReason.RESERVED, "overlaps this node's network on eth1 10.200.0.0/24"),
    ("10.244.1.128/25", RefusalReason.OVERLAP, "overlaps one held by this node (node-1)"),
])
def test_pod_cidrs_outside_the_cluster_or_over_reserved_ranges_are_refused(cidr, label, words):
    good = peer("node-2", "198.18.16.12", "10.244.2.0/24")
    hostile = peer("a-hostile", "198.18.16.99", cidr)
    plan = render_plan(LOCAL, [good, hostile], VXLAN, bounds=BOUNDS)
    assert labels(plan) == {"a-hostile": label}
    assert words in plan.refused["a-hostile"].reason
    assert all_routes(plan) == {IPv4Network("10.244.2.0/24")}


@pytest.mark.parametrize("public_ip, label", [
    ("0.0.0.0", RefusalReason.MALFORMED), ("127.0.0.1", RefusalReason.MALFORMED),
    ("224.0.0.1", RefusalReason.MALFORMED), ("255.255.255.255", RefusalReason.MALFORMED),
    ("10.244.9.1", RefusalReason.RESERVED),  # a tunnel endpoint inside the overlay would loop
    ("198.18.16.11", RefusalReason.CONFLICT),  # ours
])
def test_public_ips_that_cannot_carry_a_tunnel_are_refused(public_ip, label):
    plan = render_plan(LOCAL, [peer("node-2", public_ip, "10.244.2.0/24")], VXLAN, bounds=BOUNDS)
    assert labels(plan) == {"node-2": label} and not plan.peers


def test_a_peer_without_an_ipv4_cluster_cidr_is_never_routed():
    v6_only = PeerBounds(cluster_cidrs=(ip_network("fd00::/48"),))
    plan = render_plan(LOCAL, [peer("node-2", "198.18.16.12", "10.244.2.0/24")], VXLAN, bounds=v6_only)
    assert labels(plan) == {"node-2": RefusalReason.OUTSIDE_CLUSTER_CIDR} and not plan.peers


def test_a_peer_whose_own_cidrs_overlap_each_other_is_malformed():
    plan = render_plan(LOCAL, [peer("node-2", "198.18.16.12", "10.244.2.0/24", "10.244.2.0/25")], VXLAN,
                       bounds=BOUNDS)
    assert labels(plan) == {"node-2": RefusalReason.MALFORMED}


@pytest.mark.parametrize("copied", ["mac", "cidr", "public_ip"])
def test_a_newcomer_copying_a_claim_is_refused_whatever_its_name(copied):
    """The issue's `a-thief`: it sorts before node-2 by name, and used to win its MAC."""
    owner = peer("node-2", "198.18.16.12", "10.244.2.0/24", created=at(1), uid="b")
    thief = peer("a-thief", "198.18.16.66" if copied != "public_ip" else "198.18.16.12",
                 "10.244.2.0/24" if copied == "cidr" else "10.244.66.0/24",
                 mac=vtep_mac("node-2") if copied == "mac" else "derive", created=at(2), uid="a")
    for order in ([owner, thief], [thief, owner]):
        plan = render_plan(LOCAL, order, VXLAN, bounds=BOUNDS)
        assert sorted(plan.peers) == ["node-2"]
        assert labels(plan) == {"a-thief": RefusalReason.OVERLAP if copied == "cidr" else RefusalReason.CONFLICT}
        assert "node-2" in plan.refused["a-thief"].reason


def test_the_refused_newcomer_is_admitted_once_the_owner_is_gone():
    owner = peer("node-2", "198.18.16.12", "10.244.2.0/24", created=at(1))
    late = peer("a-late", "198.18.16.13", "10.244.2.0/24", created=at(3))
    assert sorted(render_plan(LOCAL, [owner, late], VXLAN, bounds=BOUNDS).peers) == ["node-2"]
    alone = render_plan(LOCAL, [late], VXLAN, bounds=BOUNDS)
    assert sorted(alone.peers) == ["a-late"] and not alone.refused


def test_seniority_ties_go_by_uid_then_name_and_a_missing_timestamp_is_youngest():
    same_time = [peer("node-x", "198.18.16.20", "10.244.20.0/24", created=at(1), uid="2"),
                 peer("node-y", "198.18.16.21", "10.244.20.0/24", created=at(1), uid="1")]
    assert sorted(render_plan(LOCAL, same_time, VXLAN, bounds=BOUNDS).peers) == ["node-y"]
    undated = [peer("a-undated", "198.18.16.20", "10.244.20.0/24"),
               peer("z-dated", "198.18.16.21", "10.244.20.0/24", created=at(9))]
    assert sorted(render_plan(LOCAL, undated, VXLAN, bounds=BOUNDS).peers) == ["z-dated"]


def test_a_refused_peer_holds_no_claim():
    """A newcomer refused for its MAC must not block a later, innocent Node's CIDR either."""
    owner = peer("node-2", "198.18.16.12", "10.244.2.0/24", created=at(1))
    thief = peer("node-3", "198.18.16.13", "10.244.3.0/24", mac=vtep_mac("node-2"), created=at(2))
    innocent = peer("node-4", "198.18.16.14", "10.244.3.0/25", created=at(3))
    plan = render_plan(LOCAL, [owner, thief, innocent], VXLAN, bounds=BOUNDS)
    assert sorted(plan.peers) == ["node-2", "node-4"] and labels(plan) == {"node-3": RefusalReason.CONFLICT}

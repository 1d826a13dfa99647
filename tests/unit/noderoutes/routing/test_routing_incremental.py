"""The incremental plan equals the full render after every change, conflicts included, and a
change among many peers plans only the changed ones (counted, not timed)."""
from datetime import datetime, timezone
from ipaddress import IPv4Address, IPv4Network, ip_network

from hypothesis import given, settings
from hypothesis import strategies as st

from netagent.noderoutes.routing import admission as admission_module
from netagent.noderoutes.routing.fake_kernel import FakeKernel
from netagent.noderoutes.routing.incremental import IncrementalPlanner
from netagent.noderoutes.routing.model import LocalNode, Mode, Peer, PeerBounds, RoutingSettings
from netagent.noderoutes.routing.plan import render_plan
from netagent.noderoutes.routing.routes import RouteManager
from netagent.noderoutes.routing.vxlan import vtep_mac

LOCAL = LocalNode(name="node-1", vtep_mac=vtep_mac("node-1"), public_ip=IPv4Address("198.18.16.11"),
                  underlay_ifname="eth0", underlay_network=IPv4Network("198.18.16.0/20"), underlay_mtu=1500,
                  pod_cidrs=(IPv4Network("10.244.1.0/24"),))
BOUNDS = PeerBounds(cluster_cidrs=(IPv4Network("10.0.0.0/8"),),
                    reserved=((IPv4Network("10.96.0.0/12"), "the service range (--service-cidr)"),))
# a small pool, so that random peers collide on CIDRs (nested too), public IPs and MACs
CIDRS = ["10.244.1.0/24", "10.244.2.0/24", "10.244.2.128/25", "10.244.3.0/24", "10.244.0.0/16", "10.96.0.0/24",
         "10.244.4.0/24", "fd00::/64"]
IPS = ["198.18.16.11", "198.18.16.12", "198.18.16.13", "198.18.16.14", "127.0.0.1"]
MACS = [vtep_mac("node-1"), vtep_mac("a"), vtep_mac("b"), vtep_mac("c"), None]
NAMES = ["node-1", "n-a", "n-b", "n-c", "n-d", "n-e"]

peers_st = st.builds(
    lambda name, ip, cidrs, mac, day, uid: Peer(name=name, public_ip=IPv4Address(ip),
                                                 pod_cidrs=tuple(ip_network(c) for c in cidrs), vtep_mac=mac,
                                                 created=datetime(2026, 1, day, tzinfo=timezone.utc), uid=uid),
    st.sampled_from(NAMES), st.sampled_from(IPS), st.lists(st.sampled_from(CIDRS), max_size=2, unique=True),
    st.sampled_from(MACS), st.integers(1, 4), st.sampled_from(["", "u1", "u2"]))
# a change: a peer upserted, or a name removed
changes_st = st.lists(st.one_of(peers_st, st.sampled_from(NAMES)), min_size=1, max_size=12)


@settings(max_examples=200, deadline=None)
@given(start=st.lists(peers_st, max_size=5), changes=changes_st,
       mode=st.sampled_from([Mode.VXLAN, Mode.HOST_GW]))
def test_every_change_plans_what_a_full_render_plans(start, changes, mode):
    routing = RoutingSettings(mode=mode)
    peers = {peer.name: peer for peer in start}
    planner = IncrementalPlanner()
    assert planner.full(LOCAL, peers, routing, bounds=BOUNDS) == render_plan(LOCAL, peers.values(), routing,
                                                                             bounds=BOUNDS)
    for change in changes:
        if isinstance(change, Peer):
            peers[change.name] = change
            name = change.name
        else:
            peers.pop(change, None)
            name = change
        wanted = render_plan(LOCAL, peers.values(), routing, bounds=BOUNDS)
        got = planner.change(LOCAL, peers, routing, bounds=BOUNDS, names=[name])
        if got is None:  # the planner said only a full render can tell
            got = planner.full(LOCAL, peers, routing, bounds=BOUNDS)
        assert got == wanted


def many(count: int) -> list[Peer]:
    return [Peer(name=f"n{i:04}", public_ip=IPv4Address(f"172.31.{4 + i // 250}.{i % 250 + 1}"),
                 pod_cidrs=(IPv4Network(f"10.{100 + i // 256}.{i % 256}.0/24"),), vtep_mac=vtep_mac(f"n{i:04}"))
            for i in range(count)]


def test_a_change_among_many_peers_checks_only_the_changed_one(monkeypatch):
    """A new peer, then its removal, among 300: one admission check each, no full render."""
    kernel = FakeKernel()
    kernel.add_link("eth0", addresses=("172.31.0.1/16",))
    local = LocalNode(name="big", vtep_mac=vtep_mac("big"), public_ip=IPv4Address("172.31.0.1"),
                      underlay_ifname="eth0", underlay_network=IPv4Network("172.31.0.0/16"), underlay_mtu=1500,
                      pod_cidrs=(IPv4Network("10.99.0.0/24"),))
    routes = RouteManager(kernel=kernel, settings=RoutingSettings(mode=Mode.VXLAN), local=local,
                          bounds=PeerBounds(cluster_cidrs=(IPv4Network("10.0.0.0/8"),)))
    routes.ensure_local()
    routes.sync_all(many(300))
    checks = []
    original = admission_module.Admission.check
    monkeypatch.setattr(admission_module.Admission, "check",
                        lambda self, peer, cidrs: checks.append(peer.name) or original(self, peer, cidrs))
    newcomer = Peer(name="new", public_ip=IPv4Address("172.31.200.1"), pod_cidrs=(IPv4Network("10.250.0.0/24"),),
                    vtep_mac=vtep_mac("new"))
    added = routes.apply_changes(upserts=[newcomer], removals=[])
    removed = routes.apply_changes(upserts=[], removals=["new"])
    assert checks == ["new"]
    assert (added.added, added.removed, removed.removed) == (3, 0, 3)
    assert added.peers_by_mode["vxlan"] == 301 and removed.peers_by_mode["vxlan"] == 300
    assert len(kernel.our_routes()) == 300


def test_a_copycat_older_than_the_holder_falls_back_to_the_full_render():
    """An older Node changed to claim a younger one's CIDR takes it (the holder is refused), as a
    full render decides; the planner does not guess."""
    holder = Peer(name="young", public_ip=IPv4Address("198.18.16.12"), pod_cidrs=(IPv4Network("10.244.2.0/24"),),
                  vtep_mac=vtep_mac("young"), created=datetime(2026, 1, 3, tzinfo=timezone.utc))
    old = Peer(name="old", public_ip=IPv4Address("198.18.16.13"), pod_cidrs=(IPv4Network("10.244.3.0/24"),),
               vtep_mac=vtep_mac("old"), created=datetime(2026, 1, 1, tzinfo=timezone.utc))
    routing = RoutingSettings(mode=Mode.VXLAN)
    peers = {"young": holder, "old": old}
    planner = IncrementalPlanner()
    planner.full(LOCAL, peers, routing, bounds=BOUNDS)
    peers["old"] = Peer(name="old", public_ip=old.public_ip, pod_cidrs=holder.pod_cidrs, vtep_mac=old.vtep_mac,
                        created=old.created)
    assert planner.change(LOCAL, peers, routing, bounds=BOUNDS, names=["old"]) is None
    plan = planner.full(LOCAL, peers, routing, bounds=BOUNDS)
    assert set(plan.peers) == {"old"} and set(plan.refused) == {"young"}

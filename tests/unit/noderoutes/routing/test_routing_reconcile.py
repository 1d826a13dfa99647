"""RouteManager against FakeKernel: adopt, repair, remove, switch modes, apply events, clean up.

The fake records every write in `describe` words, so "no writes" and "exactly these
writes" are asserted literally; drift is simulated by editing the fake's state directly.
"""
import dataclasses
import errno
import logging
from ipaddress import IPv4Address, IPv4Interface, IPv4Network, ip_network

import pytest

from netagent.kernel.errors import KernelError
from netagent.noderoutes.routing.fake_kernel import FakeKernel
from netagent.noderoutes.routing.model import (
    ROUTE_PROTOCOL,
    FdbEntry,
    LocalNode,
    Mode,
    Neighbour,
    Peer,
    PeerBounds,
    Route,
    RoutingApplyError,
    RoutingSettings,
    kernel_error,
)
from netagent.noderoutes.routing.routes import RouteManager
from netagent.noderoutes.routing.vxlan import vtep_mac

LOCAL = LocalNode(name="node-a", vtep_mac=vtep_mac("node-a"), public_ip=IPv4Address("192.0.2.1"), underlay_ifname="eth0",
                  underlay_network=IPv4Network("192.0.2.0/24"), underlay_mtu=1500,
                  pod_cidrs=(IPv4Network("10.244.1.0/24"),))
MAC_B, MAC_C = vtep_mac("node-b"), vtep_mac("node-c")
BOUNDS = PeerBounds(cluster_cidrs=(IPv4Network("10.0.0.0/8"),))


def peer(name, ip, *cidrs, mac="derive"):
    return Peer(name=name, public_ip=IPv4Address(ip), pod_cidrs=tuple(ip_network(c) for c in cidrs),
                vtep_mac=vtep_mac(name) if mac == "derive" else mac)


B = peer("node-b", "192.0.2.2", "10.244.2.0/24")
C = peer("node-c", "198.51.100.3", "10.244.3.0/24")


def fresh_kernel() -> FakeKernel:
    kernel = FakeKernel()
    kernel.add_link("eth0", addresses=("192.0.2.1/24",))
    kernel.add_link("na0", kind="bridge", addresses=("10.244.1.1/24",))  # the CNI bridge: not ours
    return kernel


def manager(kernel, mode=Mode.VXLAN, **settings) -> RouteManager:
    return RouteManager(kernel=kernel, settings=RoutingSettings(mode=mode, **settings), local=LOCAL, bounds=BOUNDS)


def started(kernel, peers, mode=Mode.VXLAN, **settings) -> RouteManager:
    routes = manager(kernel, mode, **settings)
    routes.ensure_local()
    routes.sync_all(peers)
    kernel.writes.clear()
    return routes


def many_peers(count):
    """`count` peers, each with its own public IP (a shared one is a conflict) and pod CIDR."""
    return [peer(f"n{i:04}", str(IPv4Address("100.64.0.1") + i), f"10.{100 + i // 256}.{i % 256}.0/24")
            for i in range(count)]


def test_fresh_vxlan_sync_programs_devices_then_each_peer_in_order():
    kernel = fresh_kernel()
    routes = manager(kernel)
    assert routes.ensure_local() == {"vtepMAC": vtep_mac("node-a")}
    report = routes.sync_all([B, C])
    assert kernel.writes[0].startswith("link add link na-vxlan type vxlan id 1")
    assert kernel.writes[2:] == [
        f"replace neigh 10.244.2.0 lladdr {MAC_B} dev na-vxlan permanent",
        f"replace fdb {MAC_B} dst 192.0.2.2 dev na-vxlan self permanent",
        "replace route 10.244.2.0/24 via 10.244.2.0 dev na-vxlan onlink",
        f"replace neigh 10.244.3.0 lladdr {MAC_C} dev na-vxlan permanent",
        f"replace fdb {MAC_C} dst 198.51.100.3 dev na-vxlan self permanent",
        "replace route 10.244.3.0/24 via 10.244.3.0 dev na-vxlan onlink",
    ]
    device = kernel.links["na-vxlan"]
    assert (device.mtu, device.up, device.mac, device.tx_checksum) == (1450, True, vtep_mac("node-a"), False)
    assert device.addresses == {IPv4Interface("10.244.1.0/32")}
    assert (report.added, report.removed, report.unchanged) == (6, 0, 0)
    assert report.peers_by_mode == {"host-gw": 0, "vxlan": 2, "ipip": 0}


def test_restart_adopts_what_is_programmed_without_a_single_write():
    kernel = fresh_kernel()
    started(kernel, [B, C], Mode.AUTO)
    restarted = manager(kernel, Mode.AUTO)
    assert restarted.ensure_local() == {"vtepMAC": vtep_mac("node-a")}
    report = restarted.sync_all([C, B])
    assert kernel.writes == []
    assert (report.added, report.removed, report.unchanged) == (0, 0, 4)
    assert report.peers_by_mode == {"host-gw": 1, "vxlan": 1, "ipip": 0}


def test_sync_all_repairs_drift_and_only_the_drift():
    kernel = fresh_kernel()
    routes = started(kernel, [B, C])
    del kernel.routes[IPv4Network("10.244.2.0/24")]
    del kernel.fdb[("na-vxlan", MAC_C)]
    kernel.neighbours[("na-vxlan", IPv4Address("10.244.3.0"))] = Neighbour(
        address=IPv4Address("10.244.3.0"), mac="02:00:00:00:00:99", ifname="na-vxlan")
    stale = Route(dst=IPv4Network("10.99.0.0/24"), gateway=IPv4Address("192.0.2.99"), ifname="eth0", onlink=False)
    kernel.routes[stale.dst] = (stale, ROUTE_PROTOCOL)  # ours, for a node that no longer exists
    report = routes.sync_all([B, C])
    assert sorted(kernel.writes) == sorted([
        "replace route 10.244.2.0/24 via 10.244.2.0 dev na-vxlan onlink",
        f"replace neigh 10.244.3.0 lladdr {MAC_C} dev na-vxlan permanent",
        f"replace fdb {MAC_C} dst 198.51.100.3 dev na-vxlan self permanent",
        "delete route 10.99.0.0/24 via 192.0.2.99 dev eth0",
    ])
    assert (report.added, report.removed, report.unchanged) == (3, 1, 3)


def test_a_deleted_or_altered_device_is_recreated_or_repaired_with_everything_on_it():
    kernel = fresh_kernel()
    routes = started(kernel, [B, C])
    kernel.delete_link("na-vxlan")
    kernel.writes.clear()
    report = routes.sync_all([B, C])
    assert kernel.writes[0].startswith("link add link na-vxlan")
    assert report.added == 6 and len(kernel.our_routes()) == 2 and len(kernel.fdb) == 2
    kernel.writes.clear()
    kernel.links["na-vxlan"] = dataclasses.replace(kernel.links["na-vxlan"], mtu=1400, up=False, tx_checksum=True)
    routes.ensure_local()
    assert len(kernel.writes) == 1 and kernel.writes[0].startswith("link set na-vxlan")
    assert (kernel.links["na-vxlan"].mtu, kernel.links["na-vxlan"].up) == (1450, True)
    assert len(kernel.our_routes()) == 2  # repaired in place: nothing on it was lost


def test_ensure_local_puts_known_peers_back_onto_a_recreated_or_readdressed_device():
    kernel = fresh_kernel()
    routes = started(kernel, [B, C])
    kernel.delete_link("na-vxlan")
    kernel.writes.clear()
    routes.ensure_local()
    assert kernel.writes[0].startswith("link add link na-vxlan") and len(kernel.writes) == 2 + 6
    assert len(kernel.our_routes()) == 2 and len(kernel.neighbours) == 2 and len(kernel.fdb) == 2

    kernel.links["na-vxlan"] = dataclasses.replace(kernel.links["na-vxlan"], mac="02:00:00:00:00:01")
    kernel.writes.clear()
    routes.ensure_local()  # the MAC is fixed in place, which flushes the neighbours: they are rewritten
    assert kernel.links["na-vxlan"].mac == vtep_mac("node-a") and len(kernel.neighbours) == 2
    assert sum(w.startswith("replace neigh") for w in kernel.writes) == 2


def test_a_removed_node_loses_its_route_fdb_and_neighbour():
    kernel = fresh_kernel()
    routes = started(kernel, [B, C])
    report = routes.sync_all([B])
    assert kernel.writes == [
        "delete route 10.244.3.0/24 via 10.244.3.0 dev na-vxlan onlink",
        f"delete fdb {MAC_C} dst 198.51.100.3 dev na-vxlan self permanent",
        f"delete neigh 10.244.3.0 lladdr {MAC_C} dev na-vxlan permanent",
    ]
    assert report.removed == 3 and report.unchanged == 3


@pytest.mark.parametrize("old, new", [(Mode.VXLAN, Mode.HOST_GW), (Mode.HOST_GW, Mode.VXLAN),
                                      (Mode.VXLAN, Mode.IPIP), (Mode.AUTO, Mode.HOST_GW)],
                         ids=lambda m: m.value)
def test_a_mode_switch_on_restart_removes_the_old_modes_objects(old, new):
    kernel = fresh_kernel()
    near = peer("node-d", "192.0.2.4", "10.244.4.0/24")
    started(kernel, [B, near], old)
    switched = manager(kernel, new)
    switched.ensure_local()
    switched.sync_all([B, near])
    wanted_device = {Mode.VXLAN: "na-vxlan", Mode.IPIP: "na-ipip"}.get(new)
    assert set(kernel.links_with_prefix("na-")) == ({wanted_device} if wanted_device else set())
    device = {Mode.HOST_GW: "eth0", Mode.VXLAN: "na-vxlan", Mode.IPIP: "na-ipip"}[new]
    assert {r.ifname for r in kernel.our_routes()} == {device}
    assert len(kernel.our_routes()) == 2
    assert bool(kernel.fdb) == (new is Mode.VXLAN) and bool(kernel.neighbours) == (new is Mode.VXLAN)


def test_apply_changes_touches_only_the_changed_peer():
    kernel = fresh_kernel()
    peers = many_peers(300)
    routes = started(kernel, peers)
    newcomer = peer("node-new", "192.0.2.250", "10.250.0.0/24")
    report = routes.apply_changes(upserts=[newcomer], removals=[])
    assert kernel.writes == [
        f"replace neigh 10.250.0.0 lladdr {vtep_mac('node-new')} dev na-vxlan permanent",
        f"replace fdb {vtep_mac('node-new')} dst 192.0.2.250 dev na-vxlan self permanent",
        "replace route 10.250.0.0/24 via 10.250.0.0 dev na-vxlan onlink",
    ]
    assert (report.added, report.removed, report.unchanged) == (3, 0, 0)
    assert report.peers_by_mode["vxlan"] == 301

    kernel.writes.clear()
    moved = peer("node-new", "192.0.2.251", "10.250.0.0/24")  # same node, new underlay address
    report = routes.apply_changes(upserts=[moved], removals=[])
    assert kernel.writes == [f"replace fdb {vtep_mac('node-new')} dst 192.0.2.251 dev na-vxlan self permanent"]
    assert (report.added, report.unchanged) == (1, 2)

    kernel.writes.clear()
    report = routes.apply_changes(upserts=[moved, peers[7]], removals=[])  # nothing new: a watch resync
    assert kernel.writes == [] and report.unchanged == 6

    report = routes.apply_changes(upserts=[], removals=["node-new"])
    assert kernel.writes == [
        "delete route 10.250.0.0/24 via 10.250.0.0 dev na-vxlan onlink",
        f"delete fdb {vtep_mac('node-new')} dst 192.0.2.251 dev na-vxlan self permanent",
        f"delete neigh 10.250.0.0 lladdr {vtep_mac('node-new')} dev na-vxlan permanent",
    ]
    assert report.removed == 3 and report.peers_by_mode["vxlan"] == 300


def test_apply_changes_reevaluates_a_conflict_the_event_resolves():
    kernel = fresh_kernel()
    holder = peer("node-m", "192.0.2.13", "10.244.9.0/24")
    claimant = peer("node-z", "192.0.2.26", "10.244.9.0/24")
    routes = started(kernel, [holder, claimant], Mode.HOST_GW)
    assert {name: r.reason for name, r in routes.apply_changes(upserts=[], removals=[]).refused.items()} == {
        "node-z": "pod CIDR 10.244.9.0/24 overlaps one held by node-m"}
    report = routes.apply_changes(upserts=[], removals=["node-m"])
    assert kernel.writes == ["replace route 10.244.9.0/24 via 192.0.2.26 dev eth0"]
    assert report.refused == {} and report.peers_by_mode["host-gw"] == 1


def test_a_pending_vxlan_peer_is_programmed_once_it_announces_its_mac():
    kernel = fresh_kernel()
    shy = peer("node-s", "192.0.2.19", "10.244.19.0/24", mac=None)
    routes = manager(kernel)
    routes.ensure_local()
    report = routes.sync_all([B, shy])
    assert report.pending == ["node-s"] and report.peers_by_mode["vxlan"] == 1
    report = routes.apply_changes(upserts=[peer("node-s", "192.0.2.19", "10.244.19.0/24")], removals=[])
    assert report.pending == [] and report.added == 3


def test_refusals_are_reported_every_sync_but_logged_once(caplog):
    kernel = fresh_kernel()
    routes = manager(kernel, Mode.HOST_GW)
    routes.ensure_local()
    dual = peer("node-e", "192.0.2.5", "10.244.5.0/24", "2001:db8:5::/64")
    with caplog.at_level(logging.INFO, logger="netagent.noderoutes.routing"):
        for _ in range(3):
            report = routes.sync_all([B, C, dual])
            assert report.refused["node-c"].reason.startswith("public IP 198.51.100.3 is not on this node's underlay")
    assert IPv4Network("10.244.3.0/24") not in kernel.routes
    refusals = [r for r in caplog.records if "node-c refused" in r.getMessage()]
    ipv6 = [r for r in caplog.records if "IPv6 pod CIDRs are not routed" in r.getMessage()]
    assert len(refusals) == 1 and refusals[0].levelno == logging.WARNING
    assert len(ipv6) == 1 and "node-e 2001:db8:5::/64" in ipv6[0].getMessage()


def test_host_gw_onto_a_down_underlay_fails_like_the_kernel():
    kernel = fresh_kernel()
    kernel.add_link("eth0", addresses=("192.0.2.1/24",), up=False)
    routes = manager(kernel, Mode.HOST_GW)
    with pytest.raises(RoutingApplyError, match="node-b: route 10.244.2.0/24 via 192.0.2.2 dev eth0"):
        routes.sync_all([B])


def test_the_fake_refuses_what_the_kernel_refuses():
    kernel = fresh_kernel()
    with pytest.raises(KernelError) as raised:
        kernel.replace_route(Route(dst=IPv4Network("10.244.2.0/24"), gateway=IPv4Address("198.51.100.2"),
                                   ifname="eth0", onlink=False))
    assert raised.value.code == errno.ENETUNREACH
    kernel.replace_route(Route(dst=IPv4Network("10.244.2.0/24"), gateway=IPv4Address("198.51.100.2"),
                               ifname="eth0", onlink=True))  # onlink: no connected prefix needed
    with pytest.raises(KernelError) as raised:
        kernel.replace_route(Route(dst=IPv4Network("10.244.3.0/24"), gateway=IPv4Address("10.244.3.0"),
                                   ifname="na-vxlan", onlink=True))
    assert raised.value.code == errno.ENODEV
    neighbour = Neighbour(address=IPv4Address("10.244.3.0"), mac=MAC_C, ifname="na-vxlan")
    with pytest.raises(KernelError) as raised:
        kernel.replace_neighbour(neighbour)
    assert raised.value.code == errno.ENODEV
    with pytest.raises(KernelError) as raised:
        kernel.replace_fdb(FdbEntry(mac=MAC_C, dst=IPv4Address("198.51.100.3"), ifname="eth0"))
    assert raised.value.code == errno.EOPNOTSUPP
    kernel.delete_neighbour(neighbour)  # deleting what is not there succeeds
    assert kernel.writes == ["replace route 10.244.2.0/24 via 198.51.100.2 dev eth0 onlink"]


class FaultyKernel(FakeKernel):
    """Fails FDB writes for one MAC, as a kernel would under some transient error."""

    def __init__(self, *, failing_mac: str) -> None:
        super().__init__()
        self.failing_mac = failing_mac

    def replace_fdb(self, entry):
        if entry.mac == self.failing_mac:
            raise kernel_error(errno.ENOBUFS, f"replace fdb {entry.mac}")
        super().replace_fdb(entry)


def test_a_failed_write_skips_the_rest_of_that_peer_applies_the_others_and_raises():
    kernel = FaultyKernel(failing_mac=MAC_B)
    kernel.add_link("eth0", addresses=("192.0.2.1/24",))
    routes = manager(kernel)
    routes.ensure_local()
    with pytest.raises(RoutingApplyError) as raised:
        routes.sync_all([B, C])
    assert list(raised.value.failures) == [f"peer node-b: fdb {MAC_B} dst 192.0.2.2 dev na-vxlan self permanent"]
    assert {r.dst for r in kernel.our_routes()} == {IPv4Network("10.244.3.0/24")}  # no route without its FDB
    assert raised.value.report.peers_by_mode["vxlan"] == 1
    kernel.failing_mac = None
    report = routes.apply_changes(upserts=[], removals=[])  # the failed peer is not believed programmed
    assert report.added == 3 and len(kernel.our_routes()) == 2  # its neighbour is rewritten too: harmless


def test_cleanup_leaves_nothing_of_ours_and_everything_not_ours():
    kernel = fresh_kernel()
    foreign = Route(dst=IPv4Network("10.200.0.0/16"), gateway=IPv4Address("192.0.2.254"), ifname="eth0",
                    onlink=False)
    kernel.add_foreign_route(foreign)
    kernel.add_link("na-ipvs0", kind="dummy")  # another component's, same prefix, not a tunnel
    kernel.add_link("tunl0", kind="ipip")
    routes = started(kernel, [B, C, peer("node-d", "192.0.2.4", "10.244.4.0/24")], Mode.AUTO)
    assert kernel.our_routes()
    routes.cleanup()
    assert kernel.our_routes() == set() and not kernel.neighbours and not kernel.fdb
    assert set(kernel.links) == {"eth0", "na0", "na-ipvs0", "tunl0"}
    assert kernel.routes == {foreign.dst: (foreign, 4)}

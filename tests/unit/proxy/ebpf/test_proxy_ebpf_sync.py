"""EbpfProxy against the fake map set: what a full sync writes, partial syncs writing O(1)
entries per endpoint change, a restart adopting with zero writes, stale entries removed,
slot layouts kept stable, traffic policies and refusal flags, a failed sync making the next
one full, and read-back for `netagent status services`."""
import errno
import random

import pytest

from ebpf import maps as M
from ebpf.fake_maps import fake_map_set, writes
from netagent.infra.sync_runner import SyncKind
from proxy.ebpf.backend import EbpfProxy
from proxy.ebpf.readback import slot_layouts
from proxy.ebpf.render import SetIds, assign_slots
from proxy.model import Endpoint, NodeContext, Protocol, ProxyState, ServicePort, ServicePortName, TrafficPolicy

NODE = NodeContext(name="node-1", cluster_cidr="10.244.0.0/16", local_addresses=("192.168.1.10",))
WEB = ServicePortName("default", "web", "http")
DNS = ServicePortName("kube-system", "dns", "dns")


def web(**changes) -> ServicePort:
    return ServicePort(**{"name": WEB, "protocol": Protocol.TCP, "port": 80, "cluster_ip": "10.96.0.10",
                          **changes})


def dns() -> ServicePort:
    return ServicePort(name=DNS, protocol=Protocol.UDP, port=53, cluster_ip="10.96.0.53")


def eps(*ips, node="node-2", port=8080, **conditions) -> tuple[Endpoint, ...]:
    return tuple(Endpoint(ip=ip, port=port, node_name=node, **conditions) for ip in ips)


def state(services, endpoints=None) -> ProxyState:
    return ProxyState(node=NODE, services={s.name: s for s in services}, endpoints=endpoints or {})


def service_entry(maps, address, port, protocol="TCP") -> M.ServiceEntry | None:
    key = M.svc_key(address, port, protocol)
    value = maps.svc.lookup(key)
    return None if value is None else M.parse_svc(key, value)


def backends(maps, set_id) -> list[str]:
    return [M.parse_backend(b) for b in slot_layouts(maps.slots.read_all()).get(set_id, ())]


@pytest.fixture
def maps():
    return fake_map_set()


def test_full_sync_writes_a_service_entry_per_address_and_a_slot_per_backend(maps):
    proxy = EbpfProxy(maps=maps)
    report = proxy.sync(state([web(node_port=30080, external_ips=("203.0.113.7",)), dns()],
                              {WEB: eps("10.244.2.5", "10.244.2.6"), DNS: eps("10.244.3.3", port=53)}), changed=None)
    assert report.scope is SyncKind.FULL and report.services_written == 2
    cluster = service_entry(maps, "10.96.0.10", 80)
    assert cluster is not None and cluster.kind is M.AddressKind.CLUSTER_IP and cluster.count == 2
    assert backends(maps, cluster.set_id) == ["10.244.2.5:8080", "10.244.2.6:8080"]
    nodeport = service_entry(maps, "192.168.1.10", 30080)
    assert nodeport is not None and nodeport.kind is M.AddressKind.NODE_PORT and nodeport.set_id == cluster.set_id
    assert service_entry(maps, "203.0.113.7", 80).kind is M.AddressKind.EXTERNAL_IP
    udp = service_entry(maps, "10.96.0.53", 53, "UDP")
    assert udp is not None and backends(maps, udp.set_id) == ["10.244.3.3:53"]
    assert maps.svc.count() == 4 and maps.slots.count() == 3 and maps.setname.count() == 2


def test_restart_over_the_same_maps_adopts_and_writes_nothing(maps):
    desired = state([web(node_port=30080), dns()], {WEB: eps("10.244.2.5", "10.244.2.6"),
                                                    DNS: eps("10.244.3.3", port=53)})
    EbpfProxy(maps=maps).sync(desired, changed=None)
    before = writes(maps)
    report = EbpfProxy(maps=maps).sync(desired, changed=None)   # a new agent, same pinned maps
    assert writes(maps) == before and "0 map entries written" in report.detail


def test_one_endpoint_change_writes_a_constant_number_of_entries_however_many_endpoints(maps):
    ips = [f"10.244.{i // 200}.{i % 200 + 1}" for i in range(400)]
    proxy = EbpfProxy(maps=maps)
    first = state([web(node_port=30080)], {WEB: eps(*ips)})
    proxy.sync(first, changed=None)
    before = writes(maps)
    replaced = state([web(node_port=30080)], {WEB: eps(*ips[:100], "10.250.0.1", *ips[101:])})
    report = proxy.sync(replaced, changed=frozenset({WEB}))
    assert report.scope is SyncKind.PARTIAL
    assert writes(maps) - before == 1   # the one slot; the counts did not change
    removed = state([web(node_port=30080)], {WEB: eps(*ips[:100], "10.250.0.1", *ips[101:-1])})
    before = writes(maps)
    proxy.sync(removed, changed=frozenset({WEB}))
    # the last slot moved into the freed one, the last slot deleted, two service entries' counts
    assert writes(maps) - before <= 4
    cluster = service_entry(maps, "10.96.0.10", 80)
    assert sorted(backends(maps, cluster.set_id)) == sorted(f"{ip}:8080" for ip in (*ips[:100], "10.250.0.1",
                                                                                      *ips[101:-1]))


def test_partial_and_full_syncs_reach_the_same_maps(maps):
    rng = random.Random(7)
    proxy = EbpfProxy(maps=maps)
    services = [web(), dns()]
    current = state(services, {WEB: eps("10.244.2.5"), DNS: eps("10.244.3.3", port=53)})
    proxy.sync(current, changed=None)
    for step in range(30):
        pool = [f"10.244.9.{n}" for n in range(1, 12)]
        endpoints = {WEB: eps(*rng.sample(pool, rng.randint(0, 6))), DNS: eps(*rng.sample(pool, 2), port=53)}
        chosen = [s for s in services if rng.random() < 0.8] or [web()]
        new = state(chosen, endpoints)
        proxy.sync(new, changed=new.changed_since(current))
        current = new
        fresh = fake_map_set()
        EbpfProxy(maps=fresh).sync(current, changed=None)
        ours = {name: [M.parse_svc(k, v) for k, v in sorted(m.svc.read_all().items())] for name, m in
                (("partial", maps), ("full", fresh))}
        assert [(e.address, e.count, e.flags) for e in ours["partial"]] == \
               [(e.address, e.count, e.flags) for e in ours["full"]], step
        for mine, theirs in zip(ours["partial"], ours["full"]):
            assert sorted(backends(maps, mine.set_id)) == sorted(backends(fresh, theirs.set_id))
        assert maps.slots.count() == fresh.slots.count() and maps.setname.count() == fresh.setname.count()


def test_full_sync_removes_stale_entries_left_by_an_earlier_agent(maps):
    EbpfProxy(maps=maps).sync(state([web(), dns()], {WEB: eps("10.244.2.5"), DNS: eps("10.244.3.3")}),
                              changed=None)
    EbpfProxy(maps=maps).sync(state([dns()], {DNS: eps("10.244.3.3")}), changed=None)
    assert service_entry(maps, "10.96.0.10", 80) is None
    assert maps.svc.count() == 1 and maps.slots.count() == 1 and maps.setname.count() == 1


def test_no_endpoints_refuses_and_local_policy_gets_its_own_external_set(maps):
    local = web(node_port=30080, external_policy=TrafficPolicy.LOCAL)
    proxy = EbpfProxy(maps=maps)
    proxy.sync(state([local, dns()], {WEB: eps("10.244.1.5", node="node-1") + eps("10.244.2.5")}), changed=None)
    entry = service_entry(maps, "192.168.1.10", 30080)
    assert entry.flags & M.F_EXTERNAL_LOCAL and entry.ext_set_id != entry.set_id
    assert backends(maps, entry.ext_set_id) == ["10.244.1.5:8080"]
    assert backends(maps, entry.set_id) == ["10.244.1.5:8080", "10.244.2.5:8080"]
    empty = service_entry(maps, "10.96.0.53", 53, "UDP")
    assert empty.count == 0 and empty.flags & M.F_NO_ENDPOINTS


def test_terminating_endpoints_serve_only_when_none_is_ready(maps):
    proxy = EbpfProxy(maps=maps)
    proxy.sync(state([web()], {WEB: eps("10.244.2.5", ready=False, terminating=True)
                               + eps("10.244.2.6")}), changed=None)
    assert backends(maps, service_entry(maps, "10.96.0.10", 80).set_id) == ["10.244.2.6:8080"]
    new = state([web()], {WEB: eps("10.244.2.5", ready=False, terminating=True)})
    proxy.sync(new, changed=frozenset({WEB}))
    assert backends(maps, service_entry(maps, "10.96.0.10", 80).set_id) == ["10.244.2.5:8080"]


def test_a_failed_write_makes_the_next_sync_full_and_it_repairs(maps):
    proxy = EbpfProxy(maps=maps)
    proxy.sync(state([web()], {WEB: eps("10.244.2.5")}), changed=None)
    maps.slots.fail_next_update = OSError(errno.E2BIG, "full")
    with pytest.raises(OSError):
        proxy.sync(state([web()], {WEB: eps("10.244.2.6")}), changed=frozenset({WEB}))
    report = proxy.sync(state([web()], {WEB: eps("10.244.2.6")}), changed=frozenset({WEB}))
    assert report.scope is SyncKind.FULL
    assert backends(maps, service_entry(maps, "10.96.0.10", 80).set_id) == ["10.244.2.6:8080"]


def test_shared_external_address_goes_to_the_first_service_port_by_name(maps):
    a = ServicePort(name=ServicePortName("a", "svc"), protocol=Protocol.TCP, port=80, cluster_ip="10.96.0.1",
                    external_ips=("203.0.113.9",))
    b = ServicePort(name=ServicePortName("b", "svc"), protocol=Protocol.TCP, port=80, cluster_ip="10.96.0.2",
                    external_ips=("203.0.113.9",))
    proxy = EbpfProxy(maps=maps)
    proxy.sync(state([a, b], {a.name: eps("10.244.2.1"), b.name: eps("10.244.2.2")}), changed=None)
    shared = service_entry(maps, "203.0.113.9", 80)
    assert backends(maps, shared.set_id) == ["10.244.2.1:8080"]
    proxy.sync(state([b], {b.name: eps("10.244.2.2")}), changed=frozenset({a.name}))
    assert backends(maps, service_entry(maps, "203.0.113.9", 80).set_id) == ["10.244.2.2:8080"]


def test_programmed_reads_names_kinds_and_backends_back(maps):
    proxy = EbpfProxy(maps=maps)
    proxy.sync(state([web(node_port=30080, affinity_timeout=60)], {WEB: eps("10.244.2.5")}), changed=None)
    shown = {(s.kind, s.address): s for s in proxy.programmed()}
    assert shown[("ClusterIP", "10.96.0.10:80/TCP")].name == "default/web:http"
    assert shown[("NodePort", "192.168.1.10:30080/TCP")].backends == ("10.244.2.5:8080 (affinity 60s)",)


def test_cleanup_of_a_fake_map_set_empties_every_map(maps):
    proxy = EbpfProxy(maps=maps)
    proxy.sync(state([web()], {WEB: eps("10.244.2.5")}), changed=None)
    proxy.cleanup()
    assert all(m.count() == 0 for m in maps.by_name().values())


@pytest.mark.parametrize("previous,wanted,moved", [
    (("a", "b", "c", "d"), ("a", "b", "c", "d"), 0),
    (("a", "b", "c", "d"), ("a", "c", "d"), 1),          # d moves into b's slot
    (("a", "b", "c", "d"), ("a", "x", "c", "d"), 1),     # x takes b's slot
    (("a", "b", "c", "d"), ("a", "b", "c", "d", "e"), 1),
    (("a", "b", "c", "d"), ("d",), 1),
    ((), ("a", "b"), 2),
])
def test_slots_move_as_little_as_possible(previous, wanted, moved):
    encoded = {c: c.encode() * 8 for c in "abcdex"}
    after = assign_slots([encoded[c] for c in previous], [encoded[c] for c in wanted])
    assert sorted(after) == sorted(encoded[c] for c in wanted)
    changed = sum(1 for i, b in enumerate(after) if i >= len(previous) or encoded[previous[i]] != b)
    assert changed == moved


def test_set_ids_are_reused_after_release_but_never_while_reserved():
    ids = SetIds(reserved={1})
    first = ids(WEB, M.SetRole.CLUSTER)
    second = ids(DNS, M.SetRole.CLUSTER)
    assert (first, second) == (2, 3)
    ids.release([WEB, DNS], lambda name, role: name == DNS)
    assert ids(ServicePortName("x", "y"), M.SetRole.CLUSTER) == 2


def test_snat_address_is_the_lowest_node_address_outside_the_pod_network():
    from proxy.ebpf.backend import snat_address
    node = NodeContext(name="n", cluster_cidr="10.244.0.0/16",
                       local_addresses=("10.244.1.1", "198.18.16.11", "10.244.1.0", "192.168.9.1"))
    assert snat_address(node) == "192.168.9.1"
    assert snat_address(NodeContext(name="n")) is None

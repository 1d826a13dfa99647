"""EbpfProxy per IP family against the fake map set: the IPv6 backend writes the IPv6 maps
(`na_svc6`, `na_slots6`, `na_setname6`) and only them, renders only IPv6 addresses, keeps set
ids of its own beside an IPv4 backend on the same maps, adopts on restart with zero writes,
changes one endpoint in O(1) writes, and writes its tc-path state (source ranges, SNAT
address) to the IPv6 tc maps."""
import pytest

from ebpf import maps as M
from ebpf.fake_maps import fake_map_set, writes
from ebpf.mapset import MapSet
from netagent.kernel.families import IpFamily
from proxy.ebpf.backend import EbpfProxy, snat_address
from proxy.model import Endpoint, NodeContext, Protocol, ProxyState, ServicePort, ServicePortName

NODE = NodeContext(name="node-1", cluster_cidr="fd00:10:244::/56", local_addresses=("fd00:10:244::1", "fd00:1::10"),
                   family=IpFamily.V6)
NODE4 = NodeContext(name="node-1", cluster_cidr="10.244.0.0/16", local_addresses=("192.168.1.10",))
WEB = ServicePortName("default", "web", "http")
WEB6 = ServicePortName("default", "web6", "http")
DNS6 = ServicePortName("kube-system", "dns6", "dns")


def eps(*ips, port=8080) -> tuple[Endpoint, ...]:
    return tuple(Endpoint(ip=ip, port=port, node_name="node-2") for ip in ips)


def state(services, endpoints) -> ProxyState:
    return ProxyState(node=NODE, services={s.name: s for s in services}, endpoints=endpoints)


def web6(**changes) -> ServicePort:
    return ServicePort(**{"name": WEB6, "protocol": Protocol.TCP, "port": 80, "cluster_ip": "fd00:10:96::10",
                          **changes})


def dns6() -> ServicePort:
    return ServicePort(name=DNS6, protocol=Protocol.UDP, port=53, cluster_ip="fd00:10:96::53")


def entry(maps: MapSet, address: str, port: int, protocol: str = "TCP") -> M.ServiceEntry | None:
    key = M.svc_key(address, port, protocol)
    value = maps.svc.lookup(key)
    return None if value is None else M.parse_svc(key, value)


@pytest.fixture
def maps():
    return fake_map_set()


def test_the_ipv6_backend_writes_the_ipv6_maps_only(maps):
    proxy = EbpfProxy(maps=maps, family=IpFamily.V6)
    proxy.sync(state([web6(node_port=30080), dns6()], {WEB6: eps("fd00:10:244::5", "fd00:10:244::6"),
                                                       DNS6: eps("fd00:10:244::7", port=53)}), changed=None)
    assert proxy.maps is maps.v6 and maps.v6 is not None
    assert [m.count() for m in maps.by_name().values()] == [0] * 8   # IPv4's untouched
    cluster = entry(maps.v6, "fd00:10:96::10", 80)
    assert cluster is not None and cluster.kind is M.AddressKind.CLUSTER_IP and cluster.count == 2
    assert entry(maps.v6, "fd00:1::10", 30080).kind is M.AddressKind.NODE_PORT
    assert maps.v6.svc.count() == 4 and maps.v6.slots.count() == 3 and maps.v6.setname.count() == 2
    shown = {(s.name, s.address): s.backends for s in proxy.programmed()}
    assert shown[("default/web6:http", "fd00:10:96::10:80/TCP")] == ("[fd00:10:244::5]:8080", "[fd00:10:244::6]:8080")
    assert set(proxy.table_fill()) == set(M.MAP_NAMES6)


def test_each_family_has_its_own_entries_and_set_ids_on_the_same_maps(maps):
    """A dual-stack Service's two ports (one per family's state, as the catalog gives them)."""
    web4 = ServicePort(name=WEB, protocol=Protocol.TCP, port=80, cluster_ip="10.96.0.10", node_port=30080)
    state4 = ProxyState(node=NODE4, services={WEB: web4}, endpoints={WEB: eps("10.244.2.5")})
    state6 = state([web6(node_port=30080)], {WEB6: eps("fd00:10:244::5")})
    v4, v6 = EbpfProxy(maps=maps), EbpfProxy(maps=maps, family=IpFamily.V6)
    v4.sync(state4, changed=None)
    v6.sync(state6, changed=None)
    assert {s.address for s in v4.programmed()} == {"10.96.0.10:80/TCP", "192.168.1.10:30080/TCP"}
    assert {s.address for s in v6.programmed()} == {"fd00:10:96::10:80/TCP", "fd00:1::10:30080/TCP",
                                                    "fd00:10:244::1:30080/TCP"}
    assert entry(maps, "10.96.0.10", 80).set_id == entry(maps.v6, "fd00:10:96::10", 80).set_id == 1
    before = writes(maps)
    EbpfProxy(maps=maps, family=IpFamily.V6).sync(state6, changed=None)   # a restarted agent adopts
    EbpfProxy(maps=maps).sync(state4, changed=None)
    assert writes(maps) == before
    with pytest.raises(ValueError):
        v6.sync(state4, changed=None)   # a wiring error, refused before anything is written
    assert writes(maps) == before


def test_one_ipv6_endpoint_change_writes_a_constant_number_of_entries(maps):
    proxy = EbpfProxy(maps=maps, family=IpFamily.V6)
    many = [f"fd00:10:244::{i:x}" for i in range(1, 201)]
    proxy.sync(state([web6()], {WEB6: eps(*many)}), changed=None)
    before = writes(maps)
    proxy.sync(state([web6()], {WEB6: eps(*many[1:], "fd00:10:244::ffff")}), changed=frozenset({WEB6}))
    assert writes(maps) - before <= 2   # one slot rewritten (and the service entry when its count moves)
    assert "[fd00:10:244::ffff]:8080" in {b for s in proxy.programmed() for b in s.backends}


def test_the_ipv6_backend_writes_its_source_ranges_and_snat_address_to_the_ipv6_tc_maps(maps):
    proxy = EbpfProxy(maps=maps, family=IpFamily.V6, tc_snat=True)
    lb = web6(load_balancer_ips=("fd00:2::1",), load_balancer_source_ranges=("fd00:3::/64", "192.0.2.0/24"))
    proxy.sync(state([lb], {WEB6: eps("fd00:10:244::5")}), changed=None)
    assert maps.lbsrc.count() == 0 and maps.config.count() == 0   # IPv4's untouched
    ext = entry(maps.v6, "fd00:2::1", 80)
    assert ext.flags & M.F_SOURCE_RANGES
    assert set(maps.v6.lbsrc.read_all()) == {M.lbsrc_key(ext.ext_set_id, "fd00:3::/64")}   # IPv6's range only
    assert maps.v6.config.lookup(M.set_id_key(0)) == M.config_value("fd00:1::10", snat=True, width=16)
    assert M.lbsrc_key(1, "fd00:3::/64")[:4] == (32 + 64).to_bytes(4, "little")


def test_an_address_of_the_other_family_is_skipped_and_the_snat_address_is_outside_the_pod_network(maps):
    slipped = state([web6()], {WEB6: eps("10.244.2.5", "fd00:10:244::5")})   # a v4 endpoint slipped in
    EbpfProxy(maps=maps, family=IpFamily.V6).sync(slipped, changed=None)
    assert [M.parse_backend(v) for v in maps.v6.slots.read_all().values()] == ["[fd00:10:244::5]:8080"]
    assert (snat_address(NODE4), snat_address(NODE, IpFamily.V6)) == ("192.168.1.10", "fd00:1::10")


def test_maps_pinned_before_ipv6_have_no_ipv6_set():
    from ebpf.fake_maps import FakeBpfMap
    old = MapSet.from_maps({name: FakeBpfMap(name) for name in M.MAP_NAMES})
    with pytest.raises(LookupError):
        old.of(IpFamily.V6)
    assert old.of(IpFamily.V4) is old


def test_ipv6_entries_round_trip():
    key = M.svc_key("fd00:10:96::a", 443, "SCTP")
    assert len(key) == M.LAYOUTS["na_svc6"].key_size == 20
    assert key[:16] == bytes.fromhex("fd00001000960000000000000000000a")   # network order
    value = M.svc_value(set_id=3, count=2, ext_set_id=3, ext_count=2, affinity_timeout=0, flags=0,
                        kind=M.AddressKind.CLUSTER_IP)
    parsed = M.parse_svc(key, value)
    assert (parsed.address, parsed.port, parsed.protocol, parsed.set_id) == ("fd00:10:96::a", 443, "SCTP", 3)
    backend = M.backend("fd00::1", 8080, local=True)
    assert len(backend) == M.LAYOUTS["na_slots6"].value_size and M.parse_backend(backend) == "[fd00::1]:8080"
    with pytest.raises(ValueError):
        M.svc_key("10.96.0.300", 80, "TCP")


def test_the_loader_instantiates_the_tc_flow_once_per_family_and_sizes_each_familys_maps():
    import re

    from ebpf.loader import FLOW_SUFFIXES, PROGRAMS, TC_FLOW, SocketLbLoader
    from ebpf.sizes import MapSizes
    source = SocketLbLoader(bpf_root="/b", cgroup="/c", sizes=MapSizes.parse(["na_svc6=1024,na_ct6=512"])).source()
    assert "__F" not in source and "__F" in TC_FLOW.read_text()
    template = set(re.findall(r"\b(\w+)__F\b", TC_FLOW.read_text()))
    for suffix in FLOW_SUFFIXES:   # every templated name defined or used once per family
        assert all(re.search(rf"\b{name}{suffix}\b", source) for name in template), suffix
    assert "static __always_inline int translate_new6(" in source and "translate_new(" in source
    assert "#define NA_MAX_SVC6 1024" in source and "#define NA_MAX_CT6 512" in source
    assert all(f"int {name}(" in source for name in PROGRAMS)


def test_second_family_backend_shares_the_first_ones_maps_without_loading_again(maps):
    """A dual-stack node loads the programs once: the IPv6 backend `build_backend` makes after
    the IPv4 one writes the maps the IPv4 one holds (no compiler, no second attacher)."""
    from proxy.factory import EbpfSpec, build_backend
    first = EbpfProxy(maps=maps)
    second = build_backend(EbpfSpec(None, first=first), family=IpFamily.V6)
    assert isinstance(second, EbpfProxy) and second.family is IpFamily.V6
    assert second.maps is maps.of(IpFamily.V6) and second.pod_veths is None
    second.sync(state([web6()], {WEB6: eps("fd00:10:244:2::5")}), changed=None)
    assert entry(maps.of(IpFamily.V6), "fd00:10:96::10", 80) is not None
    with pytest.raises(Exception, match="--bpf-root"):   # without a first backend it must load
        build_backend(EbpfSpec(None), family=IpFamily.V6)

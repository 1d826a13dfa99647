"""Room in the eBPF maps (proxy/ebpf/capacity.py, EbpfProxy) against fake maps that refuse what
a full kernel map refuses: whole service ports are written while they fit, the rest rejected as
map-full (and accepted again when room frees), programmed ports are never pushed out by new
ones, nothing half-written or leaked; map sizes from `--bpf-map-max`; the fakes' capacity."""
import errno
import logging

import pytest

from ebpf import maps as M
from ebpf.fake_maps import FakeBpfMap, fake_map_set
from ebpf.loader import SocketLbLoader
from ebpf.sizes import DEFAULT_MAX_ENTRIES, MapSizeError, MapSizes, define_name
from netagent.infra.rejections import Rejections
from netagent.infra.sync_runner import SyncKind
from proxy.ebpf.backend import EbpfProxy
from proxy.ebpf.capacity import port_keys
from proxy.ebpf.readback import slot_layouts
from proxy.model import Endpoint, NodeContext, Protocol, ProxyState, ServicePort, ServicePortName

NODE = NodeContext(name="node-1", cluster_cidr="10.244.0.0/16", local_addresses=("192.168.1.10",))


def svc(name: str, number: int, *, port: str = "") -> ServicePort:
    return ServicePort(name=ServicePortName("default", name, port), protocol=Protocol.TCP, port=80 + number % 7,
                       cluster_ip=f"10.96.{number // 250}.{number % 250 + 1}")


def eps(count: int, base: int = 0) -> tuple[Endpoint, ...]:
    return tuple(Endpoint(ip=f"10.244.{(base + i) // 250}.{(base + i) % 250 + 1}", port=8080, node_name="node-2")
                 for i in range(count))


def state(services, endpoints) -> ProxyState:
    return ProxyState(node=NODE, services={s.name: s for s in services},
                      endpoints={s.name: endpoints.get(s.name.name, ()) for s in services})


def programmed(maps) -> set[str]:
    """Service port names that have entries in any of the backend's maps (must agree across maps)."""
    names = {M.parse_set_name(v)[0] for v in maps.setname.read_all().values()}
    set_ids = {M.parse_set_id(k) for k in maps.setname.read_all()}
    svc_sets = {M.parse_svc(k, v).set_id for k, v in maps.svc.read_all().items()}
    slot_sets = set(slot_layouts(maps.slots.read_all()))
    assert svc_sets == set_ids and slot_sets <= set_ids, "a service port is half-written"
    return names


def rejected(rejections: Rejections) -> dict[str, str]:
    return {r.ref.key: r.reason for r in rejections.snapshot()}


@pytest.fixture
def rejections():
    return Rejections()


def test_a_full_svc_map_takes_the_ports_that_fit_and_rejects_the_rest_whole(rejections):
    maps = fake_map_set(sizes={M.SVC_MAP: 3})
    proxy = EbpfProxy(maps=maps, rejections=rejections.scope("proxy"))
    services = [svc(f"s{i}", i) for i in range(5)]
    report = proxy.sync(state(services, {f"s{i}": eps(2, i * 10) for i in range(5)}), changed=None)
    assert programmed(maps) == {"default/s0", "default/s1", "default/s2"}
    assert maps.svc.count() == 3 and maps.slots.count() == 6 and maps.setname.count() == 3
    assert rejected(rejections) == {"default/s3": "map-full", "default/s4": "map-full"}
    assert "na_svc is full (3 of 3 entries, 1 more needed)" in rejections.snapshot()[0].detail
    assert "2 left out for want of room" in report.detail


def test_a_full_slots_map_rejects_the_service_port_that_needs_too_many(rejections):
    maps = fake_map_set(sizes={M.SLOTS_MAP: 10})
    proxy = EbpfProxy(maps=maps, rejections=rejections.scope("proxy"))
    proxy.sync(state([svc("a", 1), svc("big", 2), svc("c", 3)], {"a": eps(3), "big": eps(8, 100), "c": eps(3, 200)}),
               changed=None)
    assert programmed(maps) == {"default/a", "default/c"} and maps.slots.count() == 6
    assert rejected(rejections) == {"default/big": "map-full"}


def test_ports_already_programmed_keep_their_place_before_new_ones(rejections):
    maps = fake_map_set(sizes={M.SVC_MAP: 2})
    scope = rejections.scope("proxy")
    EbpfProxy(maps=maps, rejections=scope).sync(state([svc("m", 1), svc("n", 2)], {}), changed=None)
    proxy = EbpfProxy(maps=maps, rejections=scope)   # a restarted agent over the same maps
    proxy.sync(state([svc("a", 3), svc("m", 1), svc("n", 2)], {}), changed=None)
    assert programmed(maps) == {"default/m", "default/n"} and rejected(rejections) == {"default/a": "map-full"}


def test_room_freed_by_a_deleted_service_is_used_at_once_and_the_rejection_cleared(rejections):
    maps = fake_map_set(sizes={M.SVC_MAP: 2})
    proxy = EbpfProxy(maps=maps, rejections=rejections.scope("proxy"))
    a, b, c = svc("a", 1), svc("b", 2), svc("c", 3)
    proxy.sync(state([a, b, c], {}), changed=None)
    assert rejected(rejections) == {"default/c": "map-full"}
    report = proxy.sync(state([a, c], {}), changed=frozenset({b.name}))   # asked partial: full while rejected
    assert report.scope is SyncKind.FULL
    assert programmed(maps) == {"default/a", "default/c"} and rejected(rejections) == {}


def test_a_service_with_one_port_left_out_is_rejected_and_its_other_port_served(rejections):
    maps = fake_map_set(sizes={M.SLOTS_MAP: 4})
    proxy = EbpfProxy(maps=maps, rejections=rejections.scope("proxy"))
    http, metrics = svc("web", 1, port="http"), svc("web", 2, port="metrics")
    proxy.sync(ProxyState(node=NODE, services={http.name: http, metrics.name: metrics},
                          endpoints={http.name: eps(3), metrics.name: eps(3, 50)}), changed=None)
    assert programmed(maps) == {"default/web:http"}
    [record] = rejections.snapshot()
    assert record.ref.key == "default/web" and "port metrics" in record.detail


def test_a_partial_sync_that_would_overflow_becomes_full_and_rejects_only_the_grown_port(rejections):
    maps = fake_map_set(sizes={M.SLOTS_MAP: 8})
    proxy = EbpfProxy(maps=maps, rejections=rejections.scope("proxy"))
    a, b = svc("a", 1), svc("b", 2)
    proxy.sync(state([a, b], {"a": eps(3), "b": eps(3, 50)}), changed=None)
    report = proxy.sync(state([a, b], {"a": eps(3), "b": eps(6, 50)}), changed=frozenset({b.name}))
    assert report.scope is SyncKind.FULL
    assert programmed(maps) == {"default/a"} and maps.slots.count() == 3
    assert rejected(rejections) == {"default/b": "map-full"}
    report = proxy.sync(state([a, b], {"a": eps(3), "b": eps(5, 50)}), changed=frozenset({b.name}))
    assert programmed(maps) == {"default/a", "default/b"} and rejected(rejections) == {}


def test_a_partial_sync_with_room_stays_partial():
    maps = fake_map_set(sizes={M.SLOTS_MAP: 8})
    proxy = EbpfProxy(maps=maps)
    a = svc("a", 1)
    proxy.sync(state([a], {"a": eps(3)}), changed=None)
    assert proxy.sync(state([a], {"a": eps(8)}), changed=frozenset({a.name})).scope is SyncKind.PARTIAL
    assert maps.slots.count() == 8


def test_stale_entries_of_an_earlier_agent_do_not_cost_a_port_its_place():
    maps = fake_map_set(sizes={M.SVC_MAP: 3})
    EbpfProxy(maps=maps).sync(state([svc("old1", 1), svc("old2", 2), svc("old3", 3)], {}), changed=None)
    rejections = Rejections()
    proxy = EbpfProxy(maps=maps, rejections=rejections.scope("proxy"))   # none of those exist any more
    proxy.sync(state([svc("new1", 4), svc("new2", 5)], {}), changed=None)
    assert programmed(maps) == {"default/new1", "default/new2"} and rejected(rejections) == {}


def test_a_refused_write_leaves_nothing_behind_once_the_next_full_sync_ran():
    maps = fake_map_set()
    proxy = EbpfProxy(maps=maps)
    services = [svc(f"s{i}", i) for i in range(4)]
    wanted = state(services, {f"s{i}": eps(2, i * 10) for i in range(4)})
    maps.svc.fail_next_update = OSError(errno.ENOMEM, "no memory")   # the kernel refusing mid-sync
    with pytest.raises(OSError):
        proxy.sync(wanted, changed=None)
    proxy.sync(state(services[:2], {f"s{i}": eps(2, i * 10) for i in range(2)}), changed=None)
    assert programmed(maps) == {"default/s0", "default/s1"} and maps.slots.count() == 4


def test_a_map_near_capacity_is_warned_about_once(caplog):
    maps = fake_map_set(sizes={M.SVC_MAP: 10})
    proxy = EbpfProxy(maps=maps)
    with caplog.at_level(logging.WARNING, logger="netagent.proxy.ebpf"):
        proxy.sync(state([svc(f"s{i}", i) for i in range(9)], {}), changed=None)
        proxy.sync(state([svc(f"s{i}", i) for i in range(9)], {}), changed=None)
    warnings = [r.getMessage() for r in caplog.records if "na_svc is 90% full" in r.getMessage()]
    assert len(warnings) == 1 and "--bpf-map-max na_svc=N" in warnings[0]


def test_port_keys_count_every_entry_a_port_writes():
    maps = fake_map_set()
    proxy = EbpfProxy(maps=maps)
    proxy.sync(state([svc("a", 1)], {"a": eps(4)}), changed=None)
    keys = port_keys(next(iter(proxy._ports.values())))   # type: ignore[union-attr]
    assert {name: len(k) for name, k in keys.items()} == {M.SVC_MAP: 1, M.SLOTS_MAP: 4, M.SETNAME_MAP: 1,
                                                           M.LBSRC_MAP: 0}


# ---- the fakes refuse what the kernel refuses -----------------------------------------------------

def test_a_full_hash_map_refuses_mid_batch_with_the_earlier_elements_written():
    slots = FakeBpfMap(M.SLOTS_MAP, max_entries=3)
    batch = {M.slot_key(1, i): M.backend(f"10.0.0.{i + 1}", 80) for i in range(5)}
    with pytest.raises(OSError) as full:
        slots.update(batch)
    assert full.value.errno == errno.E2BIG and slots.count() == 3   # as MAP_UPDATE_BATCH stops
    slots.update({M.slot_key(1, 0): M.backend("10.0.0.9", 80)})   # replacing an entry needs no room
    assert slots.lookup(M.slot_key(1, 0)) == M.backend("10.0.0.9", 80)


def test_an_lru_map_evicts_the_least_recently_used_instead_of_refusing():
    ct = FakeBpfMap(M.CT_NEW_MAP, max_entries=2)
    keys = [M.CT_KEY.pack(bytes(4), bytes(4), i.to_bytes(2, "big"), bytes(2), 6, 1, 0) for i in range(3)]
    value = M.CT_VALUE.pack(bytes(4), bytes(4), bytes(2), bytes(2), 0)
    ct.update({keys[0]: value, keys[1]: value})
    ct.lookup(keys[0])   # used: keys[1] is now the least recently used
    ct.update({keys[2]: value})
    assert set(ct.read_all()) == {keys[0], keys[2]} and ct.evicted == 1


# ---- sizes -------------------------------------------------------------------------------------------

def test_map_sizes_from_the_flag_override_the_defaults_and_reach_the_c_as_defines():
    sizes = MapSizes.parse(["na_svc=524_288,na_ct=1024", "na_ct_new=256"])
    assert (sizes[M.SVC_MAP], sizes[M.CT_MAP], sizes[M.CT_NEW_MAP]) == (524288, 1024, 256)
    assert sizes[M.SLOTS_MAP] == DEFAULT_MAX_ENTRIES[M.SLOTS_MAP]
    source = SocketLbLoader(bpf_root="/b", cgroup="/c", sizes=sizes).source()
    assert "#define NA_MAX_SVC 524288" in source and "#define NA_MAX_CT_NEW 256" in source
    for name in DEFAULT_MAX_ENTRIES:   # every sized map's macro is used by the C, with the same default
        assert f"#define {define_name(name)} {DEFAULT_MAX_ENTRIES[name]}\n" in source.split("#include", 1)[1]


@pytest.mark.parametrize("value, message", [
    ("na_svc", "expected NAME=N"), ("na_svc=lots", "not a number"), ("na_nope=5", "no sized map"),
    ("na_config=5", "no sized map"), ("na_svc=0", "an integer from 16"), (f"na_ct={1 << 30}", "an integer from 16"),
])
def test_bad_map_sizes_are_refused_with_a_clear_error(value, message):
    with pytest.raises(MapSizeError, match=message):
        MapSizes.parse([value])


def test_the_agent_flag_reaches_the_backend_paths_and_a_bad_one_is_refused():
    from netagent.cli import build_parser
    from netagent.daemon.config import ConfigError, parse_run_config
    from netagent.daemon.proxy_start import ebpf_paths

    def proxy_config(*argv: str):
        parsed = parse_run_config(build_parser().parse_args(["run", "--node-name", "n", "--cluster-cidr",
                                                             "10.244.0.0/16", "--bpf-root", "/b", "--cgroup-root",
                                                             "/c", *argv])).cluster
        assert parsed is not None
        return parsed.proxy
    paths = ebpf_paths(proxy_config("--bpf-map-max", "na_svc=1024", "--bpf-map-max", "na_ct=2048,na_ct_new=512"))
    sizes = paths.map_sizes
    assert (sizes[M.SVC_MAP], sizes[M.CT_MAP], sizes[M.CT_NEW_MAP]) == (1024, 2048, 512)
    with pytest.raises(ConfigError, match="--bpf-map-max") as refused:
        proxy_config("--bpf-map-max", "na_svc=1")
    assert "na_svc" in str(refused.value)


def test_a_hybrid_hosts_cgroup_root_stands_for_its_unified_hierarchy(tmp_path):
    import os

    from ebpf import syscall
    from ebpf.loader import cgroup2_directory
    assert cgroup2_directory(str(tmp_path)) == str(tmp_path)   # not cgroup v2: left for check_cgroup to refuse
    for root in ("/sys/fs/cgroup", "/sys/fs/cgroup/unified"):
        if not os.path.isdir(root):
            continue
        resolved = cgroup2_directory(root)
        if syscall.fs_magic(root) == syscall.CGROUP2_SUPER_MAGIC:
            assert resolved == root                               # a v2-only host, or the v2 mount itself
        else:
            assert resolved == os.path.join(root, "unified")      # this machine's hybrid layout
            assert syscall.fs_magic(resolved) == syscall.CGROUP2_SUPER_MAGIC

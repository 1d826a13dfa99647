"""BuiltinIpam over FakeStore and DiskStore: round robin, gateways, exhaustion, dual
stack with rollback, duplicates, requested addresses, release, GC, CHECK and STATUS."""
from __future__ import annotations

import json
import os

import pytest

from cni.config import parse_netconf
from cni.errors import CniError, ErrorCode
from cni.ipam import allocator
from cni.ipam.builtin import BuiltinIpam
from cni.ipam.fake_store import FakeStore
from cni.request import CniRequest

V4 = {"subnet": "10.0.0.0/24"}
DUAL = {"ranges": [[{"subnet": "10.0.0.0/24"}], [{"subnet": "fd00::/120"}]]}


def netconf(ipam: dict, *, version: str = "1.1.0", **extra):
    raw = {"cniVersion": version, "name": "podnet", "type": "netagent",
           "ipam": {"type": "netagent", **ipam}, **extra}
    return parse_netconf(json.dumps(raw).encode())


def request(container_id: str = "c1", ifname: str = "eth0", *, args: dict | None = None):
    return CniRequest(command="ADD", container_id=container_id, netns="/var/run/netns/x",
                      ifname=ifname, args=args or {})


@pytest.fixture
def store():
    return FakeStore()


@pytest.fixture
def ipam(store):
    return BuiltinIpam(store_for=lambda _conf: store)


def add(ipam, conf, container_id="c1", ifname="eth0", **kwargs):
    return ipam.add(conf, request(container_id, ifname, **kwargs))


def addresses(result: dict) -> list:
    return [entry["address"] for entry in result["ips"]]


def code_of(call) -> CniError:
    with pytest.raises(CniError) as caught:
        call()
    return caught.value


def test_first_add_skips_the_gateway_and_reports_it(ipam, store):
    conf = netconf({**V4, "routes": [{"dst": "0.0.0.0/0", "gw": "10.0.0.1"}],
                    "dns": {"nameservers": ["10.96.0.10"]}})
    result = add(ipam, conf)
    assert result == {"ips": [{"address": "10.0.0.2/24", "gateway": "10.0.0.1"}],
                      "routes": [{"dst": "0.0.0.0/0", "gw": "10.0.0.1"}],
                      "dns": {"nameservers": ["10.96.0.10"]}}
    assert store.files == {"10.0.0.2": "c1\r\neth0"}
    assert store.last == {0: "10.0.0.2"}


def test_result_has_no_interface_key_and_empty_dns(ipam):
    result = add(ipam, netconf(V4))
    assert "interface" not in result["ips"][0]
    assert result["routes"] == [] and result["dns"] == {}


def test_round_robin_does_not_hand_a_released_address_straight_back(ipam):
    conf = netconf(V4)
    assert addresses(add(ipam, conf, "c1")) == ["10.0.0.2/24"]
    assert addresses(add(ipam, conf, "c2")) == ["10.0.0.3/24"]
    ipam.delete(conf, request("c1"))
    assert addresses(add(ipam, conf, "c3")) == ["10.0.0.4/24"]


def test_round_robin_wraps_to_freed_addresses(ipam):
    conf = netconf({"subnet": "10.0.0.0/29"})  # .2 .. .6 usable, .1 gateway
    got = [addresses(add(ipam, conf, f"c{i}"))[0] for i in range(5)]
    assert got == [f"10.0.0.{i}/29" for i in range(2, 7)]
    ipam.delete(conf, request("c1"))
    assert addresses(add(ipam, conf, "c9")) == ["10.0.0.3/29"]


def test_last_reserved_outside_the_set_restarts_at_range_start(ipam, store):
    store.last[0] = "192.168.0.9"
    assert addresses(add(ipam, netconf(V4))) == ["10.0.0.2/24"]
    store.last[0] = "garbage"
    assert addresses(add(ipam, netconf(V4), "c2")) == ["10.0.0.3/24"]


def test_gateway_in_the_middle_is_never_handed_out(ipam):
    conf = netconf({"subnet": "10.0.0.0/29", "gateway": "10.0.0.4"})
    got = {addresses(add(ipam, conf, f"c{i}"))[0] for i in range(5)}
    assert "10.0.0.4/29" not in got and len(got) == 5
    assert code_of(lambda: add(ipam, conf, "c9")).code == ErrorCode.RANGE_EXHAUSTED


def test_exhaustion_has_host_locals_message_and_leaks_nothing(ipam, store):
    conf = netconf({"subnet": "10.0.0.0/30"})
    add(ipam, conf, "c1")
    before = (dict(store.files), dict(store.last))
    err = code_of(lambda: add(ipam, conf, "c2"))
    assert err.code == ErrorCode.RANGE_EXHAUSTED == 102
    assert err.msg == "no IP addresses available in range set: 10.0.0.1-10.0.0.2"
    assert (store.files, store.last) == before


def test_a_set_of_several_ranges_is_walked_in_order(ipam):
    conf = netconf({"ranges": [[{"subnet": "10.0.0.0/30"}, {"subnet": "10.0.1.0/30"}]]})
    assert addresses(add(ipam, conf, "c1")) == ["10.0.0.2/30"]
    assert addresses(add(ipam, conf, "c2")) == ["10.0.1.2/30"]
    err = code_of(lambda: add(ipam, conf, "c3"))
    assert err.msg == "no IP addresses available in range set: 10.0.0.1-10.0.0.2,10.0.1.1-10.0.1.2"


def test_dual_stack_gives_one_address_per_set(ipam, store):
    result = add(ipam, netconf(DUAL))
    assert result["ips"] == [{"address": "10.0.0.2/24", "gateway": "10.0.0.1"},
                             {"address": "fd00::2/120", "gateway": "fd00::1"}]
    assert store.files == {"10.0.0.2": "c1\r\neth0", "fd00::2": "c1\r\neth0"}
    assert store.last == {0: "10.0.0.2", 1: "fd00::2"}


def test_second_set_exhausted_rolls_back_the_first(ipam, store):
    conf = netconf({"ranges": [[{"subnet": "10.0.0.0/24"}], [{"subnet": "fd00::/126"}]]})
    add(ipam, conf, "c1")
    add(ipam, conf, "c2")
    before = (dict(store.files), dict(store.last))
    err = code_of(lambda: add(ipam, conf, "c3"))
    assert err.code == ErrorCode.RANGE_EXHAUSTED
    assert err.msg == "no IP addresses available in range set: fd00::1-fd00::3"
    assert (store.files, store.last) == before


def test_second_set_failure_on_disk_leaves_no_file(tmp_path):
    ipam = BuiltinIpam()
    conf = netconf({"dataDir": str(tmp_path),
                    "ranges": [[{"subnet": "10.0.0.0/24"}], [{"subnet": "fd00::/126"}]]})
    add(ipam, conf, "c1")
    add(ipam, conf, "c2")
    code_of(lambda: add(ipam, conf, "c3"))
    assert sorted(os.listdir(tmp_path / "podnet")) == [
        "10.0.0.2", "10.0.0.3", "fd00::2", "fd00::3", "last_reserved_ip.0",
        "last_reserved_ip.1", "lock"]


def test_duplicate_allocation_is_refused(ipam, store):
    conf = netconf(V4)
    add(ipam, conf, "c1", "eth0")
    err = code_of(lambda: add(ipam, conf, "c1", "eth0"))
    assert err.code == ErrorCode.ADDRESS_CONFLICT
    assert err.msg == "10.0.0.2 has been allocated to c1, duplicate allocation is not allowed"
    assert addresses(add(ipam, conf, "c1", "eth1")) == ["10.0.0.3/24"]
    assert len(store.files) == 2


def test_old_format_reservation_counts_as_a_duplicate(ipam, store):
    store.files["10.0.0.7"] = "c1"
    assert code_of(lambda: add(ipam, netconf(V4), "c1", "eth3")).code == \
        ErrorCode.ADDRESS_CONFLICT


def test_reservation_outside_the_ranges_is_not_a_duplicate(ipam, store):
    store.files["10.9.0.7"] = "c1\r\neth0"
    assert addresses(add(ipam, netconf(V4))) == ["10.0.0.2/24"]


def test_requested_ip_from_cni_args(ipam, store):
    result = add(ipam, netconf(V4), args={"IP": "10.0.0.50"})
    assert addresses(result) == ["10.0.0.50/24"]
    assert store.last == {0: "10.0.0.50"}


def test_requested_ip_taken_is_a_conflict(ipam, store):
    add(ipam, netconf(V4), "c1", args={"IP": "10.0.0.50"})
    err = code_of(lambda: add(ipam, netconf(V4), "c2", args={"IP": "10.0.0.50"}))
    assert err.code == ErrorCode.ADDRESS_CONFLICT
    assert "10.0.0.50 is not available in range set 10.0.0.1-10.0.0.254" in err.msg
    assert list(store.files) == ["10.0.0.50"]


@pytest.mark.parametrize("requested,code", [
    ("10.1.0.5", ErrorCode.INVALID_CONFIG),
    ("10.0.0.1", ErrorCode.INVALID_CONFIG),
    ("10.0.0.5,10.0.0.6", ErrorCode.INVALID_CONFIG),
    ("ten", ErrorCode.INVALID_ENVIRONMENT),
])
def test_requested_ip_rejections_reserve_nothing(ipam, store, requested, code):
    assert code_of(lambda: add(ipam, netconf(V4), args={"IP": requested})).code == code
    assert store.files == {}


def test_requested_ips_from_runtime_config_ipam_and_args(ipam):
    dual = netconf(DUAL, runtimeConfig={"ips": ["fd00::77/120"]})
    assert addresses(add(ipam, dual, "c1")) == ["10.0.0.2/24", "fd00::77/120"]
    ipam_ips = netconf({**V4, "ips": ["10.0.0.88"]})
    assert addresses(add(ipam, ipam_ips, "c2")) == ["10.0.0.88/24"]
    cni_args = netconf(V4, args={"cni": {"ips": ["10.0.0.99"]}})
    assert addresses(add(ipam, cni_args, "c3")) == ["10.0.0.99/24"]
    both = netconf(DUAL)
    assert addresses(add(ipam, both, "c4", args={"IP": "10.0.0.40,fd00::40"})) == \
        ["10.0.0.40/24", "fd00::40/120"]


def test_release_is_idempotent_and_succeeds_with_nothing_held(ipam, store):
    conf = netconf(V4)
    ipam.delete(conf, request("never"))  # store not even created yet
    add(ipam, conf)
    ipam.delete(conf, request())
    ipam.delete(conf, request())
    assert store.files == {}


def test_release_only_touches_the_given_ifname(ipam, store):
    conf = netconf(DUAL)
    add(ipam, conf, "c1", "eth0")
    add(ipam, conf, "c1", "net1")
    ipam.delete(conf, request("c1", "eth0"))
    assert sorted(store.files.values()) == ["c1\r\nnet1", "c1\r\nnet1"]


def test_release_falls_back_to_old_format_like_host_local(ipam, store):
    store.files.update({"10.0.0.9": "c1", "10.0.0.10": "c1\r\neth0"})
    ipam.delete(netconf(V4), request("c1", "eth0"))
    assert store.files == {"10.0.0.9": "c1"}
    ipam.delete(netconf(V4), request("c1", "eth7"))
    assert store.files == {}


def test_gc_keeps_valid_attachments_and_releases_the_rest(ipam, store):
    store.files.update({"10.0.0.2": "c1\r\neth0", "10.0.0.3": "c1\r\neth1",
                        "10.0.0.4": "c2\r\neth0", "10.0.0.5": "c1", "10.0.0.6": "c3",
                        "10.0.0.7": ""})
    store.last[0] = "10.0.0.7"
    ipam.gc(netconf(V4), request(), {("c1", "eth0")})
    assert store.files == {"10.0.0.2": "c1\r\neth0", "10.0.0.5": "c1"}
    assert store.last == {0: "10.0.0.7"}


def test_gc_continues_past_errors_and_reports_them(ipam, store):
    store.files.update({"10.0.0.2": "a\r\neth0", "10.0.0.3": "b\r\neth0",
                        "10.0.0.4": "c\r\neth0"})
    store.unreleasable.add("10.0.0.3")
    err = code_of(lambda: ipam.gc(netconf(V4), request(), set()))
    assert err.code == ErrorCode.IO_FAILURE and "10.0.0.3" in err.details
    assert store.files == {"10.0.0.3": "b\r\neth0"}


def test_gc_on_disk_never_touches_bookkeeping_or_foreign_files(tmp_path):
    ipam = BuiltinIpam()
    conf = netconf({**V4, "dataDir": str(tmp_path)})
    add(ipam, conf, "c1")
    add(ipam, conf, "c2")
    (tmp_path / "podnet" / "README").write_text("c9\r\neth0")
    ipam.gc(conf, request(), {("c2", "eth0")})
    assert sorted(os.listdir(tmp_path / "podnet")) == \
        ["10.0.0.3", "README", "last_reserved_ip.0", "lock"]


def test_check_passes_while_held_and_fails_after_release(ipam):
    conf = netconf(DUAL)
    add(ipam, conf)
    ipam.check(conf, request())
    ipam.delete(conf, request())
    err = code_of(lambda: ipam.check(conf, request()))
    assert err.code == ErrorCode.CHECK_FAILED
    assert "range set 0" in err.msg and "1 (fd00::1-fd00::ff)" in err.msg


def test_check_reports_the_set_that_is_missing(ipam, store):
    store.files["10.0.0.2"] = "c1\r\neth0"
    err = code_of(lambda: ipam.check(netconf(DUAL), request()))
    assert err.code == ErrorCode.CHECK_FAILED
    assert "range set 1 (fd00::1-fd00::ff)" in err.msg


def test_check_without_data_directory_fails(tmp_path):
    conf = netconf({**V4, "dataDir": str(tmp_path / "none")})
    assert code_of(lambda: BuiltinIpam().check(conf, request())).code == ErrorCode.CHECK_FAILED


def test_status_ok_then_not_available_when_exhausted(ipam):
    conf = netconf({"ranges": [[{"subnet": "10.0.0.0/24"}], [{"subnet": "fd00::/126"}]]})
    ipam.status(conf, request())
    add(ipam, conf, "c1")
    add(ipam, conf, "c2")
    err = code_of(lambda: ipam.status(conf, request()))
    assert err.code == ErrorCode.NOT_AVAILABLE == 50
    assert "fd00::1-fd00::3" in err.msg and err.details.endswith("1")


def test_status_not_available_when_store_is_read_only(ipam, store):
    store.writable = False
    assert code_of(lambda: ipam.status(netconf(V4), request())).code == ErrorCode.NOT_AVAILABLE


def test_status_not_available_when_data_dir_cannot_be_created(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    conf = netconf({**V4, "dataDir": str(blocker / "sub")})
    err = code_of(lambda: BuiltinIpam().status(conf, request()))
    assert err.code == ErrorCode.NOT_AVAILABLE and str(blocker) in err.msg


def test_status_creates_the_directory_and_passes(tmp_path):
    conf = netconf({**V4, "dataDir": str(tmp_path / "a" / "b")})
    BuiltinIpam().status(conf, request())
    assert (tmp_path / "a" / "b" / "podnet" / "lock").is_file()


class CountingStore(FakeStore):
    def __init__(self) -> None:
        super().__init__()
        self.reserve_calls = 0

    def reserve(self, name: str, *, owner: str) -> bool:
        self.reserve_calls += 1
        return super().reserve(name, owner=owner)


def test_nearly_full_slash_16_is_searched_in_memory():
    store = CountingStore()
    ipam = BuiltinIpam(store_for=lambda _conf: store)
    free = "10.1.250.7"
    for third in range(256):
        for fourth in range(256):
            name = f"10.1.{third}.{fourth}"
            if name not in (free, "10.1.0.0", "10.1.0.1", "10.1.255.255"):
                store.files[name] = f"pod{third}-{fourth}\r\neth0"
    store.last[0] = "10.1.250.8"
    conf = netconf({"subnet": "10.1.0.0/16"})
    ipam.status(conf, request())
    assert addresses(add(ipam, conf)) == [f"{free}/16"]
    assert store.reserve_calls == 1  # the search probed memory, not the store, address by address
    assert code_of(lambda: ipam.status(conf, request())).code == ErrorCode.NOT_AVAILABLE


def test_disk_allocation_lists_once_and_stats_nothing(tmp_path, monkeypatch):
    directory = tmp_path / "podnet"
    directory.mkdir()
    for i in range(2, 1500):
        (directory / f"10.2.{i // 256}.{i % 256}").write_text(f"pod{i}\r\neth0")
    (directory / "last_reserved_ip.0").write_text("10.2.5.219")
    stats, scans = [], []
    real_stat, real_scandir = os.stat, os.scandir
    monkeypatch.setattr(os, "stat", lambda p, *a, **k: (stats.append(p), real_stat(p, *a, **k))[1])
    monkeypatch.setattr(os, "scandir", lambda p: (scans.append(p), real_scandir(p))[1])
    result = add(BuiltinIpam(), netconf({"subnet": "10.2.0.0/16", "dataDir": str(tmp_path)}))
    assert addresses(result) == ["10.2.5.220/16"]
    assert [p for p in stats if str(p).startswith(str(directory))] == []
    assert len(scans) == 1


def test_allocator_helpers_agree_on_free_space():
    conf = netconf({"subnet": "10.0.0.0/30"})
    from cni.ipam.builtin import parse_for
    parsed = parse_for(conf)
    assert allocator.has_free_address(parsed.range_sets[0], taken=set())
    assert not allocator.has_free_address(parsed.range_sets[0], taken={(4, 0x0A000002)})
    assert allocator.address_key("fd00::1") == (6, (0xfd00 << 112) + 1)
    assert allocator.address_key("lock") is None

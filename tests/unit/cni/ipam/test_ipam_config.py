"""Parsing and validating the `ipam` section (cni.ipam.config): host-local's defaults,
every rejection with code 7, requested-address assignment and resolvConf."""
from __future__ import annotations

import ipaddress
import json

import pytest

from cni.config import parse_netconf
from cni.errors import CniError, ErrorCode
from cni.ipam.builtin import BuiltinIpam
from cni.ipam.config import DEFAULT_DATA_DIR, assign_requested, parse_ipam_config, parse_requested_ips, read_resolv_conf
from cni.request import CniRequest

ip = ipaddress.ip_address


def parse(ipam: dict, **kwargs):
    return parse_ipam_config({"type": "netagent", **ipam}, network_name="podnet", **kwargs)


def only_range(conf):
    assert len(conf.range_sets) == 1 and len(conf.range_sets[0].ranges) == 1
    return conf.range_sets[0].ranges[0]


def test_ipv4_defaults_follow_host_local():
    r = only_range(parse({"subnet": "10.244.1.0/24"}))
    assert (str(r.subnet), r.start, r.end, r.gateway) == \
        ("10.244.1.0/24", ip("10.244.1.1"), ip("10.244.1.254"), ip("10.244.1.1"))
    assert str(r) == "10.244.1.1-10.244.1.254"


def test_ipv6_defaults_end_at_the_last_address():
    r = only_range(parse({"ranges": [[{"subnet": "fd00:10::/64"}]]}))
    assert (r.start, r.end, r.gateway) == \
        (ip("fd00:10::1"), ip("fd00:10::ffff:ffff:ffff:ffff"), ip("fd00:10::1"))


def test_explicit_bounds_and_gateway_are_kept():
    r = only_range(parse({"ranges": [[{"subnet": "10.0.0.0/24", "rangeStart": "10.0.0.10",
                                       "rangeEnd": "10.0.0.20", "gateway": "10.0.0.254"}]]}))
    assert (r.start, r.end, r.gateway) == (ip("10.0.0.10"), ip("10.0.0.20"), ip("10.0.0.254"))


def test_empty_strings_mean_default_as_in_go():
    r = only_range(parse({"subnet": "10.0.0.0/24", "rangeStart": "", "gateway": ""}))
    assert (r.start, r.gateway) == (ip("10.0.0.1"), ip("10.0.0.1"))


def test_smallest_allowed_subnets():
    assert str(only_range(parse({"subnet": "10.0.0.0/30"}))) == "10.0.0.1-10.0.0.2"
    assert str(only_range(parse({"subnet": "fd00::/126"}))) == "fd00::1-fd00::3"


def test_set_order_is_runtime_ranges_then_legacy_then_ranges():
    conf = parse({"subnet": "10.1.0.0/24", "ranges": [[{"subnet": "10.2.0.0/24"}]]},
                 runtime_config={"ipRanges": [[{"subnet": "10.3.0.0/24"}]]})
    assert [str(s.ranges[0].subnet) for s in conf.range_sets] == \
        ["10.3.0.0/24", "10.1.0.0/24", "10.2.0.0/24"]


def test_dual_stack_sets_and_multi_range_set():
    conf = parse({"ranges": [[{"subnet": "10.0.0.0/24"}, {"subnet": "10.0.1.0/24"}],
                             [{"subnet": "fd00::/64"}]]})
    assert [s.version for s in conf.range_sets] == [4, 6]
    assert str(conf.range_sets[0]) == "10.0.0.1-10.0.0.254,10.0.1.1-10.0.1.254"


def test_data_dir_routes_dns_and_unknown_keys():
    conf = parse({"subnet": "10.0.0.0/24", "dataDir": "/tmp/x", "somethingElse": [1],
                  "routes": [{"dst": "0.0.0.0/0"}, {"dst": "10.9.0.0/16", "gw": "10.0.0.254"}],
                  "dns": {"nameservers": ["10.96.0.10"]}})
    assert conf.network_dir == "/tmp/x/podnet"
    assert conf.routes == ({"dst": "0.0.0.0/0"}, {"dst": "10.9.0.0/16", "gw": "10.0.0.254"})
    assert conf.dns == {"nameservers": ["10.96.0.10"]}
    assert parse({"subnet": "10.0.0.0/24"}).data_dir == DEFAULT_DATA_DIR


R = "ranges"
INVALID = [
    ({}, "no IP ranges specified"),
    ({R: []}, "no IP ranges specified"),
    ({R: "x"}, "'ranges' must be a list of range sets"),
    ({R: {"subnet": "10.0.0.0/24"}}, "'ranges' must be a list of range sets"),
    ({R: ["x"]}, "range set must be a list of ranges"),
    ({R: [[]]}, "empty range set"),
    ({R: [["x"]]}, "a range must be an object"),
    ({R: [[{}]]}, "a range needs a 'subnet'"),
    ({"subnet": "garbage"}, "invalid CIDR address: garbage"),
    ({"subnet": "10.0.0.0"}, "invalid CIDR address"),
    ({"subnet": "10.0.0.0/33"}, "invalid CIDR address"),
    ({"subnet": "10.0.0.0/255.255.255.0"}, "invalid CIDR address"),
    ({"subnet": 24}, "'subnet' must be a CIDR string"),
    ({"subnet": ["10.0.0.0/24"]}, "'subnet' must be a CIDR string"),
    ({"subnet": "10.0.0.5/24"}, "Network has host bits set"),
    ({"subnet": "10.0.0.0/31"}, "too small to allocate from"),
    ({"subnet": "10.0.0.0/32"}, "too small to allocate from"),
    ({"subnet": "fd00::/127"}, "too small to allocate from"),
    ({"subnet": "fd00::/128"}, "too small to allocate from"),
    ({"subnet": "10.0.0.0/24", "rangeStart": "10.0.1.1"}, "RangeStart 10.0.1.1 not in network"),
    ({"subnet": "10.0.0.0/24", "rangeEnd": "10.0.1.1"}, "RangeEnd 10.0.1.1 not in network"),
    ({"subnet": "10.0.0.0/24", "gateway": "10.0.1.1"}, "Gateway 10.0.1.1 not in network"),
    ({"subnet": "10.0.0.0/24", "rangeStart": "fd00::1"}, "not in network"),
    ({"subnet": "10.0.0.0/24", "rangeStart": "10.0.0.9", "rangeEnd": "10.0.0.5"},
     "RangeEnd 10.0.0.5 is before RangeStart 10.0.0.9"),
    ({"subnet": "10.0.0.0/24", "rangeStart": "ten"}, "'rangeStart' 'ten' is not an IP address"),
    ({"subnet": "10.0.0.0/24", "gateway": 1}, "'gateway' must be a string"),
    ({R: [[{"subnet": "10.0.0.0/24"}, {"subnet": "fd00::/64"}]]}, "mixed address families"),
    ({R: [[{"subnet": "10.0.0.0/24"}, {"subnet": "10.0.0.0/25"}]]}, "overlap"),
    ({R: [[{"subnet": "10.0.0.0/24", "rangeEnd": "10.0.0.100"},
           {"subnet": "10.0.0.0/24", "rangeStart": "10.0.0.100"}]]}, "overlap"),
    ({R: [[{"subnet": "10.0.0.0/24"}], [{"subnet": "10.0.0.0/25"}]]},
     "range set 0 overlaps with 1"),
    ({"subnet": "10.0.0.0/24", R: [[{"subnet": "10.0.0.128/25"}]]},
     "range set 0 overlaps with 1"),
    ({"subnet": "10.0.0.0/24", "routes": {"dst": "0.0.0.0/0"}}, "'routes' must be a list"),
    ({"subnet": "10.0.0.0/24", "routes": ["0.0.0.0/0"]}, "a route must be an object"),
    ({"subnet": "10.0.0.0/24", "routes": [{"gw": "10.0.0.1"}]}, "route 'dst' None is not a CIDR"),
    ({"subnet": "10.0.0.0/24", "routes": [{"dst": "default"}]}, "is not a CIDR"),
    ({"subnet": "10.0.0.0/24", "routes": [{"dst": "10.0.0.1"}]}, "is not a CIDR"),
    ({"subnet": "10.0.0.0/24", "routes": [{"dst": "0.0.0.0/0", "gw": "x"}]},
     "route 'gw' 'x' is not an IP address"),
    ({"subnet": "10.0.0.0/24", "dns": ["10.96.0.10"]}, "'dns' must be an object"),
    ({"subnet": "10.0.0.0/24", "dataDir": 5}, "'dataDir' must be a string"),
    ({"subnet": "10.0.0.0/24", "ips": "10.0.0.5"}, "ipam.ips must be a list"),
    ({"subnet": "10.0.0.0/24", "ips": ["10.0.0.500"]}, "is not an IP address"),
    # hostile IPv6 range sets
    ({"subnet": "fd00::5/64"}, "Network has host bits set"),
    ({"subnet": "fd00::%eth0/64"}, "invalid CIDR address"),
    ({"subnet": "fd00::/0x40"}, "invalid CIDR address"),
    ({"subnet": "fd00::/129"}, "invalid CIDR address"),
    ({"subnet": "::ffff:10.0.0.0/120"}, "IPv4-mapped IPv6 network"),
    ({"subnet": "fe80::/64"}, "link-local"),
    ({"subnet": "ff02::/64"}, "multicast"),
    ({"subnet": "fd00::/64", "gateway": "fe80::1"}, "Gateway fe80::1 not in network fd00::/64"),
    ({"subnet": "fd00::/64", "gateway": "10.0.0.1"}, "Gateway 10.0.0.1 not in network fd00::/64"),
    ({"subnet": "fd00::/64", "rangeStart": "fd00::1%eth0"}, "is not an IP address"),
    ({"subnet": "fd00::/64", "rangeStart": "::ffff:10.0.0.1"}, "RangeStart 10.0.0.1 not in network"),
    ({"subnet": "fd00::/64", "rangeStart": "fd00::ff", "rangeEnd": "fd00::1"},
     "RangeEnd fd00::1 is before RangeStart fd00::ff"),
    ({R: [[{"subnet": "fd00::/64"}], [{"subnet": "fd00::/120"}]]}, "range set 0 overlaps with 1"),
    ({R: [[{"subnet": "10.0.0.0/24"}], [{"subnet": "fd00::/64"}, {"subnet": "10.1.0.0/24"}]]},
     "mixed address families"),
    ({"subnet": "fd00::/64", "routes": [{"dst": "::/0", "gw": "fe80::1%eth0"}]}, "is not an IP address"),
    ({"subnet": "fd00::/64", "routes": [{"dst": "fd00::1"}]}, "is not a CIDR"),
]


@pytest.mark.parametrize("ipam,fragment", INVALID, ids=[f"{i}" for i in range(len(INVALID))])
def test_invalid_configs_are_code_7_with_a_clear_message(ipam, fragment):
    with pytest.raises(CniError) as caught:
        parse(ipam)
    assert caught.value.code == ErrorCode.INVALID_CONFIG
    assert fragment in caught.value.msg


def test_errors_name_the_location_in_details():
    with pytest.raises(CniError) as caught:
        parse({R: [[{"subnet": "10.0.0.0/24"}], [{"subnet": "10.1.0.0/24"}, "x"]]})
    assert caught.value.msg.startswith("invalid range set 1:")
    assert "ipam.ranges[1][1]" in caught.value.details


def test_ipam_must_be_an_object():
    with pytest.raises(CniError) as caught:
        parse_ipam_config("host-local", network_name="podnet")
    assert caught.value.code == ErrorCode.INVALID_CONFIG


def test_runtime_ip_ranges_must_be_a_list():
    with pytest.raises(CniError) as caught:
        parse({"subnet": "10.0.0.0/24"}, runtime_config={"ipRanges": "10.1.0.0/24"})
    assert caught.value.code == ErrorCode.INVALID_CONFIG


@pytest.mark.parametrize("ipam,fragment", INVALID[:12], ids=[f"{i}" for i in range(12)])
@pytest.mark.parametrize("operation", ["ADD", "DEL", "CHECK", "GC", "STATUS"])
def test_invalid_config_touches_no_directory(tmp_path, ipam, fragment, operation):
    data_dir = tmp_path / "data"
    raw = {"cniVersion": "1.1.0", "name": "podnet", "type": "netagent",
           "ipam": {"type": "netagent", "dataDir": str(data_dir), **ipam}}
    conf = parse_netconf(json.dumps(raw).encode())
    req = CniRequest(command=operation, container_id="c1", ifname="eth0", netns="/x")
    handlers = BuiltinIpam()
    call = {"ADD": lambda: handlers.add(conf, req), "DEL": lambda: handlers.delete(conf, req),
            "CHECK": lambda: handlers.check(conf, req),
            "GC": lambda: handlers.gc(conf, req, set()),
            "STATUS": lambda: handlers.status(conf, req)}[operation]
    with pytest.raises(CniError) as caught:
        call()
    assert caught.value.code == ErrorCode.INVALID_CONFIG
    assert not data_dir.exists()


def test_requested_ips_accept_plain_and_cidr_forms():
    assert parse_requested_ips(["10.0.0.5", "fd00::5/64", "::ffff:10.0.0.6"], source="t") == \
        [ip("10.0.0.5"), ip("fd00::5"), ip("10.0.0.6")]
    assert parse_requested_ips(None, source="t") == []


@pytest.mark.parametrize("values", [["nope"], [5], "10.0.0.5", ["fe80::1%eth0"]])
def test_requested_ips_garbage_uses_the_given_code(values):
    with pytest.raises(CniError) as caught:
        parse_requested_ips(values, source="CNI_ARGS IP", code=ErrorCode.INVALID_ENVIRONMENT)
    assert caught.value.code == ErrorCode.INVALID_ENVIRONMENT


def test_assign_requested_maps_each_address_to_its_set():
    conf = parse({R: [[{"subnet": "10.0.0.0/24"}], [{"subnet": "fd00::/64"}]]})
    assert assign_requested(conf, [ip("fd00::9"), ip("10.0.0.9"), ip("10.0.0.9")]) == \
        {1: ip("fd00::9"), 0: ip("10.0.0.9")}


@pytest.mark.parametrize("addresses,fragment", [
    (["10.1.0.9"], "failed to allocate all requested IPs: 10.1.0.9"),
    (["10.0.0.200"], "failed to allocate all requested IPs: 10.0.0.200"),
    (["10.0.0.1"], "requested ip 10.0.0.1 is subnet's gateway"),
    (["10.0.0.5", "10.0.0.6"], "failed to allocate all requested IPs: 10.0.0.6"),
])
def test_assign_requested_rejections(addresses, fragment):
    conf = parse({"subnet": "10.0.0.0/24", "rangeEnd": "10.0.0.100"})
    with pytest.raises(CniError) as caught:
        assign_requested(conf, [ip(a) for a in addresses])
    assert caught.value.code == ErrorCode.INVALID_CONFIG
    assert fragment in caught.value.msg


def test_resolv_conf_is_read_like_host_local(tmp_path):
    path = tmp_path / "resolv.conf"
    path.write_text("# comment\n; other comment\nnameserver 10.96.0.10\nnameserver 1.1.1.1\n"
                    "domain cluster.local\nsearch a.svc b.svc\noptions ndots:5 edns0\nbogus\n")
    assert read_resolv_conf(str(path)) == {
        "nameservers": ["10.96.0.10", "1.1.1.1"], "domain": "cluster.local",
        "search": ["a.svc", "b.svc"], "options": ["ndots:5", "edns0"]}
    with pytest.raises(CniError) as caught:
        read_resolv_conf(str(tmp_path / "missing"))
    assert caught.value.code == ErrorCode.IO_FAILURE

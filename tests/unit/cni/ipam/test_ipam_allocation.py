"""IPAM's ADD as values: the config parsed once per ADD, the builtin's leases never turned into
strings and back before the main plugin's result, a delegated result parsed once."""
from __future__ import annotations

import ipaddress
import json

from cni.config import parse_netconf
from cni.fake_kernel import FakeCniKernel
from cni.handlers import PluginHandlers
from cni.ipam import config as ipam_config
from cni.ipam.allocation import AllocatedIp, Allocation
from cni.ipam.builtin import BuiltinIpam
from cni.request import CniRequest
from netagent.kernel.families import IpFamily

NETNS = "/var/run/netns/pod-a"


def conf_in(tmp_path):
    return parse_netconf(json.dumps({
        "cniVersion": "1.1.0", "name": "podnet", "type": "netagent",
        "ipam": {"type": "netagent", "dataDir": str(tmp_path),
                 "ranges": [[{"subnet": "10.244.1.0/24"}], [{"subnet": "fd00:244:1::/64"}]]}}).encode())


def test_an_add_parses_the_ipam_config_once(tmp_path, monkeypatch):
    parsed = []
    real = ipam_config.parse_ipam_config

    def counting(*args, **kwargs):
        parsed.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(ipam_config, "parse_ipam_config", counting)
    fake = FakeCniKernel()
    fake.add_netns(NETNS)
    result = PluginHandlers(kernel=fake).add(conf_in(tmp_path), CniRequest(command="ADD", container_id="c1",
                                                                          netns=NETNS, ifname="eth0"))
    assert [ip["address"] for ip in result["ips"]] == ["10.244.1.2/24", "fd00:244:1::2/64"]
    assert len(parsed) == 1


def test_the_builtin_allocation_is_values_and_renders_the_result_it_always_did(tmp_path):
    conf = conf_in(tmp_path)
    allocation = BuiltinIpam().allocate(conf, CniRequest(command="ADD", container_id="c1", ifname="eth0"))
    assert allocation.ips[0] == AllocatedIp(address=ipaddress.ip_interface("10.244.1.2/24"),
                                            gateway=ipaddress.ip_address("10.244.1.1"))
    assert allocation.gateways() == {IpFamily.V4: ipaddress.ip_address("10.244.1.1"),
                                     IpFamily.V6: ipaddress.ip_address("fd00:244:1::1")}
    assert allocation.to_result()["ips"] == [{"address": "10.244.1.2/24", "gateway": "10.244.1.1"},
                                             {"address": "fd00:244:1::2/64", "gateway": "fd00:244:1::1"}]


def test_a_delegated_result_is_parsed_once_into_the_same_values():
    result = {"ips": [{"address": "10.1.0.5/16"}, {"address": "10.2.0.5/24", "gateway": "10.2.0.1"}],
              "routes": [{"dst": "0.0.0.0/0"}], "dns": {"nameservers": ["10.96.0.10"]}}
    allocation = Allocation.from_result(result)
    assert allocation.gateways() == {IpFamily.V4: ipaddress.ip_address("10.2.0.1")}
    assert allocation.to_result() == result

"""Pod subnets no pod can use are refused with code 7 (issue 18: `127.0.0.0/24` was accepted).

cni/ipam/config.py refuses a subnet that overlaps loopback, multicast, the unspecified
"this network" block, link-local or the reserved 240/4 (IPv6: ::, ::1, fe80::/10, ff00::/8),
wherever the subnet is written (`ranges`, the legacy top-level `subnet`, the runtime's
`ipRanges`), and keeps accepting the blocks right beside them. Through the real path too: the
shim built here relays the request to a served agent (`CniServer` over the fake kernel), which
answers 7 for the main plugin and for `netagent-ipam`, having reserved and wired nothing.
"""
from __future__ import annotations

import json
import os
import shutil

import pytest

from cni.errors import CniError
from cni.ipam.config import parse_ipam_config
from cni.ipam.plugin import LockedIpam
from tests.shim_support import build_shim_or_skip
from tests.unit.cni.test_cni_transport_hostile import Agent, via_shim

UNUSABLE = {  # subnet: the word the message names
    "127.0.0.0/24": "loopback", "127.0.0.0/8": "loopback", "96.0.0.0/3": "loopback",
    "0.0.0.0/8": "unspecified", "0.0.0.0/24": "unspecified",
    "224.0.0.0/24": "multicast", "239.255.0.0/16": "multicast",
    "240.0.0.0/24": "reserved", "255.255.255.0/24": "reserved",
    "169.254.0.0/16": "link-local", "169.254.169.0/24": "link-local",
    "::/120": "unspecified", "fe80::/64": "link-local", "ff02::/64": "multicast", "ff00::/8": "multicast",
}
USABLE = ["126.255.255.0/24", "128.0.0.0/24", "1.0.0.0/24", "223.255.255.0/24", "169.253.0.0/16",
          "169.255.0.0/16", "10.0.0.0/8", "192.168.0.0/16", "::100/120", "fd00::/64", "2001:db8::/64",
          "fe00::/64", "fec0::/64"]


def ipam(**fields) -> dict:
    return {"type": "netagent", "dataDir": "/nonexistent/netagent-test", **fields}


@pytest.mark.parametrize("subnet", sorted(UNUSABLE))
@pytest.mark.parametrize("where", ["ranges", "subnet", "ipRanges"])
def test_an_unusable_subnet_is_code_7_wherever_it_is_written(subnet, where):
    runtime = {}
    if where == "ranges":
        conf = ipam(ranges=[[{"subnet": "10.1.0.0/24"}], [{"subnet": subnet}]])
    elif where == "subnet":
        conf = ipam(subnet=subnet)
    else:
        conf, runtime = ipam(ranges=[[{"subnet": "10.1.0.0/24"}]]), {"ipRanges": [[{"subnet": subnet}]]}
    with pytest.raises(CniError) as refused:
        parse_ipam_config(conf, network_name="n", runtime_config=runtime)
    assert refused.value.code == 7
    assert f"subnet {subnet} overlaps" in refused.value.msg and UNUSABLE[subnet] in refused.value.msg
    assert "pod addresses must be unicast" in refused.value.details


@pytest.mark.parametrize("subnet", USABLE)
def test_the_blocks_beside_them_are_still_accepted(subnet):
    conf = parse_ipam_config(ipam(ranges=[[{"subnet": subnet}]]), network_name="n", runtime_config={})
    assert str(conf.range_sets[0].ranges[0].subnet) == subnet


@pytest.fixture(scope="module")
def shims(tmp_path_factory) -> dict:
    main = build_shim_or_skip(tmp_path_factory.mktemp("shim"))
    ipam_copy = os.path.join(os.path.dirname(main), "netagent-ipam")
    shutil.copy(main, ipam_copy)
    return {"netagent": main, "netagent-ipam": ipam_copy}


@pytest.fixture
def agent():
    started = Agent(ipam_handlers=LockedIpam(lock_timeout=5))
    yield started
    started.close()


@pytest.mark.parametrize("name", ["netagent", "netagent-ipam"])
@pytest.mark.parametrize("subnet", ["127.0.0.0/24", "224.0.0.0/24", "0.0.0.0/8"])
def test_through_the_shim_the_agent_refuses_it_and_touches_nothing(agent, shims, name, subnet):
    ranges = [[{"subnet": subnet}]]
    if name == "netagent":
        config = json.loads(agent.config())
        config["ipam"]["ranges"] = ranges
    else:  # what the reference bridge hands netagent-ipam
        config = {"cniVersion": "1.0.0", "name": "refnet", "type": "bridge", "bridge": "cni0",
                  "ipam": {"type": "netagent-ipam", "agentSocket": agent.socket_path, "dataDir": agent.data_dir,
                           "ranges": ranges}}
    code, out = via_shim(shims[name], agent.pod_env("c1"), json.dumps(config).encode())
    assert (code, out["code"]) == (1, 7), out
    assert f"subnet {subnet} overlaps" in out["msg"]
    assert agent.server.requests_served == 1  # the agent judged it, not the shim
    assert agent.kernel.calls == []
    assert not os.path.exists(os.path.join(agent.data_dir, config["name"]))

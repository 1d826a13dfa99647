"""Spec types: config parsing, environment validation, result conversion, versions."""
import json

import pytest

from cni import result as cni_result
from cni import version as cni_version
from cni.config import parse_netconf
from cni.errors import CniError, ErrorCode
from cni.request import parse_cni_args, request_from_environment
from netagent.kernel.pod_attachment import PodAttachment

BASE = {"cniVersion": "1.0.0", "name": "net1", "type": "netagent",
        "ipam": {"type": "netagent", "ranges": [[{"subnet": "10.244.1.0/24"}]]}}


def conf_bytes(**changes):
    conf = dict(BASE)
    for key, value in changes.items():
        if value is None:
            conf.pop(key, None)
        else:
            conf[key] = value
    return json.dumps(conf).encode()


def code_of(call, *args, **kwargs):
    with pytest.raises(CniError) as info:
        call(*args, **kwargs)
    return info.value.code


def test_defaults_and_contract_keys():
    conf = parse_netconf(conf_bytes(mode="routed", mtu=1450, hairpinMode=True,
                                    agentSocket="/run/x.sock", bridge="br9"))
    assert (conf.mode, conf.mtu, conf.hairpin_mode, conf.agent_socket, conf.bridge) == \
        (PodAttachment.ROUTED, 1450, True, "/run/x.sock", "br9")
    plain = parse_netconf(conf_bytes())
    assert (plain.mode, plain.bridge, plain.mtu, plain.hairpin_mode) == (PodAttachment.BRIDGE, "na0", 1500, False)


def test_the_mode_is_the_one_pod_attachment_enum_and_its_text():
    """`mode` parses to `PodAttachment` (the policy engine's and the daemon's too), a str enum
    whose JSON is the conflist's text; anything else is code 7, in the same words."""
    assert [a.value for a in PodAttachment] == ["bridge", "routed"]
    assert json.dumps({"mode": PodAttachment.ROUTED}) == '{"mode": "routed"}'
    with pytest.raises(CniError, match="'mode' must be 'bridge' or 'routed', not 'l3'") as refused:
        parse_netconf(conf_bytes(mode="l3"))
    assert refused.value.code == ErrorCode.INVALID_CONFIG


@pytest.mark.parametrize("data, code", [
    (b"{not json", ErrorCode.DECODE_FAILURE),
    (b"[1, 2]", ErrorCode.DECODE_FAILURE),
    (b"\xff\xfe", ErrorCode.DECODE_FAILURE),
    (conf_bytes(cniVersion="9.9.9"), ErrorCode.INCOMPATIBLE_VERSION),
    (conf_bytes(cniVersion=None), ErrorCode.INCOMPATIBLE_VERSION),
    (conf_bytes(cniVersion=1), ErrorCode.INCOMPATIBLE_VERSION),
    (conf_bytes(name=None), ErrorCode.INVALID_CONFIG),
    (conf_bytes(name="../../etc"), ErrorCode.INVALID_CONFIG),
    (conf_bytes(name="a b"), ErrorCode.INVALID_CONFIG),
    (conf_bytes(type=None), ErrorCode.INVALID_CONFIG),
    (conf_bytes(mode="vxlan"), ErrorCode.INVALID_CONFIG),
    (conf_bytes(mtu="1500"), ErrorCode.INVALID_CONFIG),
    (conf_bytes(mtu=True), ErrorCode.INVALID_CONFIG),
    (conf_bytes(mtu=20), ErrorCode.INVALID_CONFIG),
    (conf_bytes(hairpinMode="yes"), ErrorCode.INVALID_CONFIG),
    (conf_bytes(bridge="a-very-long-bridge-name"), ErrorCode.INVALID_CONFIG),
    (conf_bytes(bridge="br/0"), ErrorCode.INVALID_CONFIG),
    (conf_bytes(ipam=None), ErrorCode.INVALID_CONFIG),
    (conf_bytes(ipam={"ranges": []}), ErrorCode.INVALID_CONFIG),
    (conf_bytes(ipam="host-local"), ErrorCode.INVALID_CONFIG),
    (conf_bytes(prevResult=[]), ErrorCode.INVALID_CONFIG),
])
def test_bad_configs_get_the_right_code(data, code):
    assert code_of(parse_netconf, data) == code


ENV = {"CNI_COMMAND": "ADD", "CNI_CONTAINERID": "abc123", "CNI_NETNS": "/var/run/netns/x",
       "CNI_IFNAME": "eth0", "CNI_PATH": "/opt/cni/bin:/usr/lib/cni"}


def env_with(**changes):
    env = dict(ENV)
    for key, value in changes.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    return env


def test_environment_is_read():
    req = request_from_environment(env_with(CNI_ARGS="K8S_POD_NAME=web;K8S_POD_NAMESPACE=default"), b"{}")
    assert (req.command, req.container_id, req.ifname, req.path) == \
        ("ADD", "abc123", "eth0", ("/opt/cni/bin", "/usr/lib/cni"))
    assert (req.pod_name, req.pod_namespace) == ("web", "default")


@pytest.mark.parametrize("changes", [
    {"CNI_COMMAND": None}, {"CNI_COMMAND": "EXPLODE"}, {"CNI_CONTAINERID": None},
    {"CNI_NETNS": None}, {"CNI_IFNAME": None},
    {"CNI_CONTAINERID": "../../etc/passwd"}, {"CNI_CONTAINERID": "a;rm -rf /"},
    {"CNI_CONTAINERID": "x" * 2000}, {"CNI_CONTAINERID": "$(reboot)"},
    {"CNI_IFNAME": "eth0/../x"}, {"CNI_IFNAME": "a-very-long-ifname"}, {"CNI_IFNAME": "eth 0"},
    {"CNI_IFNAME": ".."}, {"CNI_IFNAME": "eth:0"}, {"CNI_IFNAME": "eth0;reboot"},
    {"CNI_IFNAME": "$(id)"}, {"CNI_NETNS": "relative/path"},
    {"CNI_ARGS": "novalue"},
])
def test_hostile_or_missing_environment_is_code_4(changes):
    assert code_of(request_from_environment, env_with(**changes), b"{}") == ErrorCode.INVALID_ENVIRONMENT


def test_del_needs_no_netns_and_gc_needs_path():
    assert request_from_environment(env_with(CNI_COMMAND="DEL", CNI_NETNS=None), b"").netns == ""
    gc = {"CNI_COMMAND": "GC"}
    assert code_of(request_from_environment, gc, b"") == ErrorCode.INVALID_ENVIRONMENT
    assert request_from_environment({**gc, "CNI_PATH": "/x"}, b"").path == ("/x",)


def test_cni_args_parsing():
    assert parse_cni_args("A=1;B=x=y;;") == {"A": "1", "B": "x=y"}


def test_result_versions():
    internal = {"interfaces": [{"name": "eth0", "mac": "aa:bb:cc:dd:ee:ff", "sandbox": "/x", "mtu": 1450}],
                "ips": [{"address": "10.0.0.2/24", "gateway": "10.0.0.1", "interface": 0},
                        {"address": "fd00::2/64", "interface": 0}],
                "routes": [{"dst": "0.0.0.0/0", "gw": "10.0.0.1", "priority": 5}], "dns": {}}
    old = cni_result.to_version(internal, "0.3.1")
    assert [ip["version"] for ip in old["ips"]] == ["4", "6"]
    assert "mtu" not in old["interfaces"][0] and "priority" not in old["routes"][0]
    assert "dns" not in old and old["cniVersion"] == "0.3.1"
    v10 = cni_result.to_version(internal, "1.0.0")
    assert all("version" not in ip for ip in v10["ips"]) and "mtu" not in v10["interfaces"][0]
    v11 = cni_result.to_version(internal, "1.1.0")
    assert v11["interfaces"][0]["mtu"] == 1450 and v11["routes"][0]["priority"] == 5
    assert cni_result.normalize(old)["ips"][0] == {"address": "10.0.0.2/24", "gateway": "10.0.0.1", "interface": 0}


def test_merge_shifts_interface_indices():
    prev = {"interfaces": [{"name": "a"}], "ips": [{"address": "10.0.0.2/24", "interface": 0, "version": "4"}],
            "routes": [], "dns": {"nameservers": ["1.1.1.1"]}}
    own = {"interfaces": [{"name": "b"}, {"name": "c"}], "ips": [{"address": "10.1.0.2/24", "interface": 1}],
           "routes": [{"dst": "0.0.0.0/0"}], "dns": {}}
    merged = cni_result.merge(prev, own)
    assert [i["name"] for i in merged["interfaces"]] == ["a", "b", "c"]
    assert [ip["interface"] for ip in merged["ips"]] == [0, 2]
    assert merged["dns"] == {"nameservers": ["1.1.1.1"]}


def test_versions_gate_operations():
    assert cni_version.version_answer("0.4.0")["cniVersion"] == "0.4.0"
    assert cni_version.version_answer("7.0.0")["cniVersion"] == cni_version.LATEST
    assert code_of(cni_version.require_operation, "CHECK", "0.3.1") == ErrorCode.INCOMPATIBLE_VERSION
    assert code_of(cni_version.require_operation, "GC", "1.0.0") == ErrorCode.INCOMPATIBLE_VERSION
    cni_version.require_operation("STATUS", "1.1.0")


def test_ipam_scope_ignores_the_main_plugins_own_keys():
    from cni.config import ConfigScope
    macvlan = conf_bytes(type="macvlan", mode="vepa", mtu="not ours", bridge="a/b")
    with pytest.raises(CniError):
        parse_netconf(macvlan)
    conf = parse_netconf(macvlan, scope=ConfigScope.IPAM)
    assert conf.type == "macvlan" and conf.ipam["type"] == "netagent"
    assert code_of(parse_netconf, conf_bytes(ipam=None), scope=ConfigScope.IPAM) == ErrorCode.INVALID_CONFIG

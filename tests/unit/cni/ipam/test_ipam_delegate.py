"""DelegatedIpam and ipam_for: what is forwarded to an external IPAM plugin (environment,
stdin, command), how its answer and its errors come back, and the GC/STATUS version gate."""
from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from cni.config import parse_netconf
from cni.errors import CniError, ErrorCode
from cni.ipam import ipam_for
from cni.ipam.builtin import BuiltinIpam
from cni.ipam.delegate import DelegatedIpam, cni_args_text
from cni.request import CniRequest

HOST_LOCAL_DIR = Path("/usr/lib/cni")

RESULT = {"cniVersion": "0.4.0",
          "ips": [{"version": "4", "address": "10.5.0.7/24", "gateway": "10.5.0.1",
                   "interface": 0}],
          "routes": [{"dst": "0.0.0.0/0"}], "dns": {"nameservers": ["10.96.0.10"]}}


def fake_plugin(bin_dir: Path, *, reply: dict | None = None, exit_code: int = 0,
                name: str = "fake-ipam") -> Path:
    """A plugin that records its command, environment and stdin, then prints `reply`."""
    bin_dir.mkdir(exist_ok=True)
    script = bin_dir / name
    reply_text = json.dumps(reply) if reply is not None else ""
    script.write_text(
        "#!/bin/sh\n"
        f'log="{bin_dir}/calls"\n'
        'env | grep ^CNI_ | sort > "$log.$CNI_COMMAND.env"\n'
        'cat > "$log.$CNI_COMMAND.stdin"\n'
        'echo "$CNI_COMMAND" >> "$log"\n'
        f"printf '%s' '{reply_text}'\n"
        f"exit {exit_code}\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script


def setup(tmp_path: Path, *, ipam_type: str = "fake-ipam", version: str = "1.0.0",
          command: str = "ADD", path: tuple | None = None, **ipam):
    raw = {"cniVersion": version, "name": "podnet", "type": "bridge",
           "ipam": {"type": ipam_type, **ipam}}
    data = json.dumps(raw).encode()
    req = CniRequest(command=command, container_id="c1", netns="/var/run/netns/p",
                     ifname="eth0", args={"IgnoreUnknown": "1", "K8S_POD_NAME": "web"},
                     path=path if path is not None else (str(tmp_path / "empty"),
                                                         str(tmp_path / "bin")),
                     config_bytes=data)
    return parse_netconf(data), req


def calls(tmp_path: Path) -> list:
    log = tmp_path / "bin" / "calls"
    return log.read_text().split() if log.exists() else []


def test_ipam_for_picks_builtin_or_delegated(tmp_path):
    for ipam_type in ("netagent", "netagent-ipam"):
        assert isinstance(ipam_for(setup(tmp_path, ipam_type=ipam_type)[0]), BuiltinIpam)
    assert isinstance(ipam_for(setup(tmp_path, ipam_type="host-local")[0]), DelegatedIpam)


def test_cni_args_round_trip():
    assert cni_args_text({"IgnoreUnknown": "1", "IP": "10.0.0.5"}) == "IgnoreUnknown=1;IP=10.0.0.5"
    assert cni_args_text({}) == ""


def test_add_forwards_environment_and_stdin_and_strips_interface(tmp_path):
    fake_plugin(tmp_path / "bin", reply=RESULT)
    conf, req = setup(tmp_path)
    result = DelegatedIpam().add(conf, req)
    assert result == {"ips": [{"address": "10.5.0.7/24", "gateway": "10.5.0.1"}],
                      "routes": [{"dst": "0.0.0.0/0"}],
                      "dns": {"nameservers": ["10.96.0.10"]}}
    env = (tmp_path / "bin" / "calls.ADD.env").read_text().splitlines()
    assert env == sorted([
        "CNI_COMMAND=ADD", "CNI_CONTAINERID=c1", "CNI_IFNAME=eth0",
        "CNI_NETNS=/var/run/netns/p", "CNI_ARGS=IgnoreUnknown=1;K8S_POD_NAME=web",
        f"CNI_PATH={tmp_path / 'empty'}:{tmp_path / 'bin'}"])
    assert (tmp_path / "bin" / "calls.ADD.stdin").read_bytes() == req.config_bytes


def test_add_without_output_is_a_delegate_failure(tmp_path):
    fake_plugin(tmp_path / "bin", reply=None)
    with pytest.raises(CniError) as caught:
        DelegatedIpam().add(*setup(tmp_path))
    assert caught.value.code == ErrorCode.DELEGATE_FAILED


def test_plugin_errors_propagate_with_their_code(tmp_path):
    fake_plugin(tmp_path / "bin", exit_code=1,
                reply={"cniVersion": "1.0.0", "code": 102, "msg": "range full", "details": "x"})
    with pytest.raises(CniError) as caught:
        DelegatedIpam().add(*setup(tmp_path))
    assert (caught.value.code, caught.value.msg, caught.value.details) == (102, "range full", "x")


def test_missing_plugin_is_code_7(tmp_path):
    conf, req = setup(tmp_path, ipam_type="no-such-ipam")
    for call in (lambda: DelegatedIpam().add(conf, req), lambda: DelegatedIpam().status(conf, req)):
        with pytest.raises(CniError) as caught:
            call()
        assert caught.value.code == ErrorCode.INVALID_CONFIG


def test_del_and_check_are_forwarded(tmp_path):
    fake_plugin(tmp_path / "bin")
    conf, req = setup(tmp_path)
    DelegatedIpam().delete(conf, req)
    DelegatedIpam().check(conf, req)
    assert calls(tmp_path) == ["DEL", "CHECK"]


def test_gc_and_status_are_forwarded_only_from_1_1_0(tmp_path):
    fake_plugin(tmp_path / "bin")
    old_conf, old_req = setup(tmp_path, version="1.0.0")
    DelegatedIpam().gc(old_conf, old_req, set())
    DelegatedIpam().status(old_conf, old_req)
    assert calls(tmp_path) == []
    new_conf, new_req = setup(tmp_path, version="1.1.0")
    DelegatedIpam().gc(new_conf, new_req, set())
    DelegatedIpam().status(new_conf, new_req)
    assert calls(tmp_path) == ["GC", "STATUS"]


@pytest.mark.skipif(not os.access(HOST_LOCAL_DIR / "host-local", os.X_OK),
                    reason="/usr/lib/cni/host-local is not installed")
def test_delegating_to_the_real_host_local(tmp_path):
    common = {"ipam_type": "host-local", "path": (str(HOST_LOCAL_DIR),),
              "dataDir": str(tmp_path), "subnet": "10.7.0.0/24",
              "routes": [{"dst": "0.0.0.0/0"}]}
    conf, req = setup(tmp_path, **common)
    result = DelegatedIpam().add(conf, req)
    assert result["ips"] == [{"address": "10.7.0.2/24", "gateway": "10.7.0.1"}]
    assert result["routes"] == [{"dst": "0.0.0.0/0"}]
    assert (tmp_path / "podnet" / "10.7.0.2").read_bytes() == b"c1\r\neth0"
    DelegatedIpam().check(conf, req)
    DelegatedIpam().delete(conf, req)
    assert not (tmp_path / "podnet" / "10.7.0.2").exists()
    with pytest.raises(CniError):
        DelegatedIpam().check(conf, req)
    DelegatedIpam().status(conf, req)

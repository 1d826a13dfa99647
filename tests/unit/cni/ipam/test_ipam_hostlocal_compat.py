"""Interoperability with the reference host-local plugin sharing one data directory:
same addresses for the same operations, each side reads and releases the other's files,
round robin carries across, and the flock really excludes host-local."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cni.config import parse_netconf
from cni.errors import CniError, ErrorCode
from cni.ipam.builtin import BuiltinIpam
from cni.request import CniRequest
from tests.unit.cni.ipam.ipam_worker import WORKER_SCRIPT

HOST_LOCAL = Path("/usr/lib/cni/host-local")
REPO = Path(__file__).resolve().parents[4]

pytestmark = pytest.mark.skipif(not os.access(HOST_LOCAL, os.X_OK),
                                reason=f"{HOST_LOCAL} is not installed "
                                       "(Debian package containernetworking-plugins)")

V4 = {"subnet": "10.0.0.0/24"}
DUAL = {"ranges": [[{"subnet": "10.0.0.0/24"}], [{"subnet": "2001:db8:0:0:1::/120"}]]}


def raw_config(data_dir: Path, ipam: dict, *, ipam_type: str = "host-local") -> dict:
    return {"cniVersion": "1.0.0", "name": "podnet", "type": "bridge",
            "ipam": {"type": ipam_type, "dataDir": str(data_dir), **ipam}}


def host_local(command: str, container_id: str, raw: dict, *, ifname: str = "eth0",
               args: str = "") -> tuple[int, dict | None]:
    env = {"CNI_COMMAND": command, "CNI_CONTAINERID": container_id, "CNI_IFNAME": ifname,
           "CNI_NETNS": "/var/run/netns/none", "CNI_PATH": str(HOST_LOCAL.parent),
           "CNI_ARGS": args, "PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    proc = subprocess.run([str(HOST_LOCAL)], input=json.dumps(raw).encode(), env=env,
                          capture_output=True, timeout=60)
    out = proc.stdout.strip()
    return proc.returncode, json.loads(out) if out else None


def ours(command: str, container_id: str, raw: dict, *, ifname: str = "eth0",
         args: dict | None = None):
    conf = parse_netconf(json.dumps(raw).encode())
    req = CniRequest(command=command, container_id=container_id, netns="/var/run/netns/none",
                     ifname=ifname, args=args or {})
    ipam = BuiltinIpam()
    return {"ADD": lambda: ipam.add(conf, req), "DEL": lambda: ipam.delete(conf, req),
            "CHECK": lambda: ipam.check(conf, req)}[command]()


def host_local_add(container_id: str, raw: dict, **kwargs) -> list:
    code, out = host_local("ADD", container_id, raw, **kwargs)
    assert code == 0, out
    return [ip["address"] for ip in out["ips"]]


def our_add(container_id: str, raw: dict, **kwargs) -> list:
    return [ip["address"] for ip in ours("ADD", container_id, raw, **kwargs)["ips"]]


def snapshot(directory: Path) -> dict:
    return {name: (directory / name).read_bytes() for name in sorted(os.listdir(directory))
            if name != "lock"}


SCRIPT = [("ADD", "c1", "eth0"), ("ADD", "c2", "eth0"), ("ADD", "c1", "net1"),
          ("DEL", "c1", "eth0"), ("ADD", "c3", "eth0"), ("DEL", "c2", "eth0"),
          ("DEL", "c2", "eth0"), ("ADD", "c4", "eth0")]


@pytest.mark.parametrize("ipam", [V4, DUAL, {"subnet": "10.0.0.0/29", "gateway": "10.0.0.3"}],
                         ids=["v4", "dual", "odd-gateway"])
def test_same_operations_give_the_same_directory(tmp_path, ipam):
    theirs_raw = raw_config(tmp_path / "hl", ipam)
    ours_raw = raw_config(tmp_path / "na", ipam, ipam_type="netagent")
    for command, cid, ifname in SCRIPT:
        code, out = host_local(command, cid, theirs_raw, ifname=ifname)
        assert code == 0, out
        mine = ours(command, cid, ours_raw, ifname=ifname)
        if command == "ADD":
            assert mine["ips"] == out["ips"]
    assert snapshot(tmp_path / "na" / "podnet") == snapshot(tmp_path / "hl" / "podnet")


def test_round_robin_and_reservations_carry_across_both(tmp_path):
    raw = raw_config(tmp_path, V4)
    assert host_local_add("h1", raw) == ["10.0.0.2/24"]
    assert host_local_add("h2", raw) == ["10.0.0.3/24"]
    assert our_add("n1", raw) == ["10.0.0.4/24"]
    assert our_add("n2", raw) == ["10.0.0.5/24"]
    assert host_local_add("h3", raw) == ["10.0.0.6/24"]  # read our last_reserved_ip.0
    assert our_add("n3", raw) == ["10.0.0.7/24"]
    files = [n for n in os.listdir(tmp_path / "podnet") if n.startswith("10.")]
    assert len(files) == 6


def test_host_local_releases_and_checks_what_we_wrote(tmp_path):
    raw = raw_config(tmp_path, DUAL)
    our_add("n1", raw, ifname="eth0")
    our_add("n1", raw, ifname="net1")
    assert host_local("CHECK", "n1", {**raw, "prevResult": {}}, ifname="eth0")[0] == 0
    assert host_local("DEL", "n1", raw, ifname="eth0") == (0, None)
    owners = {(tmp_path / "podnet" / n).read_bytes() for n in os.listdir(tmp_path / "podnet")
              if n[0].isdigit()}
    assert owners == {b"n1\r\nnet1"}
    assert host_local("CHECK", "n1", {**raw, "prevResult": {}}, ifname="eth0")[0] != 0


def test_we_release_and_check_what_host_local_wrote(tmp_path):
    raw = raw_config(tmp_path, DUAL)
    host_local_add("h1", raw)
    ours("CHECK", "h1", raw)
    ours("DEL", "h1", raw)
    assert sorted(os.listdir(tmp_path / "podnet")) == \
        ["last_reserved_ip.0", "last_reserved_ip.1", "lock"]
    with pytest.raises(CniError) as caught:
        ours("CHECK", "h1", raw)
    assert caught.value.code == ErrorCode.CHECK_FAILED


def test_duplicates_and_requested_addresses_see_host_local_files(tmp_path):
    raw = raw_config(tmp_path, V4)
    host_local_add("h1", raw)
    with pytest.raises(CniError) as caught:
        ours("ADD", "h1", raw)
    assert caught.value.code == ErrorCode.ADDRESS_CONFLICT
    with pytest.raises(CniError) as caught:
        ours("ADD", "n1", raw, args={"IP": "10.0.0.2"})
    assert caught.value.code == ErrorCode.ADDRESS_CONFLICT
    assert our_add("n1", raw, args={"IP": "10.0.0.9"}) == ["10.0.0.9/24"]
    code, out = host_local("ADD", "h2", raw, args="IP=10.0.0.9")
    assert code != 0 and "not available" in out["msg"]


def test_old_format_files_are_released_by_both(tmp_path):
    raw = raw_config(tmp_path, V4)
    directory = tmp_path / "podnet"
    directory.mkdir()
    (directory / "10.0.0.20").write_bytes(b"old1")
    (directory / "10.0.0.21").write_bytes(b"old2")
    ours("DEL", "old1", raw, ifname="eth9")
    assert host_local("DEL", "old2", raw, ifname="eth9")[0] == 0
    assert [n for n in os.listdir(directory) if n.startswith("10.")] == []



HOST_LOCAL_LOOP = """
set -e
for i in $(seq 1 20); do
  CNI_COMMAND=ADD CNI_CONTAINERID=h$1-$i CNI_IFNAME=eth0 CNI_NETNS=/x CNI_PATH=/usr/lib/cni \
    /usr/lib/cni/host-local < "$2" | tr -d ' \\n'
  echo
done
"""


def test_concurrent_host_local_and_ours_never_collide(tmp_path):
    raw = raw_config(tmp_path / "data", V4)
    config_file = tmp_path / "conf.json"
    config_file.write_text(json.dumps(raw))
    procs = [subprocess.Popen([sys.executable, "-c", WORKER_SCRIPT, str(REPO), json.dumps(raw), f"n{n}", "20"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for n in range(2)]
    procs += [subprocess.Popen(["sh", "-c", HOST_LOCAL_LOOP, "sh", str(n), str(config_file)],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
              for n in range(2)]
    got = []
    for proc in procs[:2]:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        got += json.loads(out)
    for proc in procs[2:]:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        got += [json.loads(line)["ips"][0]["address"] for line in out.splitlines()]
    assert len(got) == 80 and len(set(got)) == 80
    files = [n for n in os.listdir(tmp_path / "data" / "podnet") if n.startswith("10.")]
    assert len(files) == 80

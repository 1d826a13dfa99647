"""The standalone `netagent-ipam` entry point (cni.ipam.plugin.main), run the way the
installed binary runs it: `python -I -S`, CNI environment, config on stdin."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[4]
PYTHON = REPO / ".venv" / "bin" / "python"
ENTRY = (f"import sys; sys.path.insert(0, {str(REPO)!r}); "
         "from cni.ipam.plugin import main; sys.exit(main())")


def python() -> str:
    return str(PYTHON) if PYTHON.exists() else sys.executable


def config(data_dir: Path, *, version: str = "1.0.0", **extra) -> dict:
    ipam = {"type": "netagent-ipam", "dataDir": str(data_dir),
            "ranges": [[{"subnet": "10.0.0.0/30"}], [{"subnet": "fd00::/120"}]],
            "routes": [{"dst": "0.0.0.0/0"}]}
    return {"cniVersion": version, "name": "podnet", "type": "bridge", "ipam": ipam, **extra}


def run(command: str, stdin, *, container_id: str = "c1", ifname: str = "eth0",
        drop: tuple = ()) -> tuple[int, dict | None]:
    env = {"CNI_COMMAND": command, "CNI_CONTAINERID": container_id, "CNI_IFNAME": ifname,
           "CNI_NETNS": "/var/run/netns/test", "CNI_PATH": "/nonexistent"}
    for key in drop:
        env.pop(key)
    data = stdin if isinstance(stdin, bytes) else json.dumps(stdin).encode()
    proc = subprocess.run([python(), "-I", "-S", "-c", ENTRY], input=data, env=env,
                          capture_output=True, timeout=60)
    out = proc.stdout.strip()
    return proc.returncode, json.loads(out) if out else None


def test_add_0_3_1_carries_ip_versions(tmp_path):
    code, out = run("ADD", config(tmp_path, version="0.3.1"))
    assert code == 0
    assert out == {"cniVersion": "0.3.1",
                   "ips": [{"address": "10.0.0.2/30", "gateway": "10.0.0.1", "version": "4"},
                           {"address": "fd00::2/120", "gateway": "fd00::1", "version": "6"}],
                   "routes": [{"dst": "0.0.0.0/0"}]}


def test_add_1_0_0_then_del(tmp_path):
    code, out = run("ADD", config(tmp_path))
    assert code == 0
    assert out["cniVersion"] == "1.0.0"
    assert [ip["address"] for ip in out["ips"]] == ["10.0.0.2/30", "fd00::2/120"]
    assert all("version" not in ip and "interface" not in ip for ip in out["ips"])
    assert (tmp_path / "podnet" / "10.0.0.2").read_bytes() == b"c1\r\neth0"
    assert run("DEL", config(tmp_path)) == (0, None)
    assert run("DEL", config(tmp_path)) == (0, None)
    assert not (tmp_path / "podnet" / "10.0.0.2").exists()


def test_check_needs_prev_result_and_a_reservation(tmp_path):
    code, added = run("ADD", config(tmp_path))
    assert code == 0
    assert run("CHECK", config(tmp_path, prevResult=added)) == (0, None)
    code, out = run("CHECK", config(tmp_path))
    assert code != 0 and out["code"] == 7
    code, out = run("CHECK", config(tmp_path, prevResult=added), container_id="other")
    assert code != 0 and out["code"] == 101


def test_version_answers_supported_versions():
    code, out = run("VERSION", {"cniVersion": "0.4.0"})
    assert code == 0
    assert out["cniVersion"] == "0.4.0" and "1.1.0" in out["supportedVersions"]


def owners(directory: Path) -> list:
    return sorted((directory / n).read_bytes().decode() for n in os.listdir(directory)
                  if n[0] in "1f")


def test_gc_on_1_1_0_keeps_only_valid_attachments(tmp_path):
    conf = config(tmp_path, version="1.1.0")
    conf["ipam"]["ranges"] = [[{"subnet": "10.0.0.0/29"}]]
    assert run("ADD", conf, container_id="keep")[0] == 0
    assert run("ADD", conf, container_id="gone")[0] == 0
    gc = {**conf, "cni.dev/valid-attachments": [{"containerID": "keep", "ifname": "eth0"}]}
    assert run("GC", gc) == (0, None)
    assert owners(tmp_path / "podnet") == ["keep\r\neth0"]
    code, out = run("GC", {**conf, "cni.dev/valid-attachments": "x"})
    assert code != 0 and out["code"] == 7


def test_status_on_1_1_0_reports_exhaustion(tmp_path):
    conf = config(tmp_path, version="1.1.0")
    assert run("STATUS", conf) == (0, None)
    assert run("ADD", conf)[0] == 0
    code, out = run("STATUS", conf)
    assert code != 0 and out["code"] == 50
    assert run("DEL", conf) == (0, None)
    assert run("STATUS", conf) == (0, None)
    code, out = run("STATUS", config(tmp_path, version="1.0.0"))
    assert code != 0 and out["code"] == 1


@pytest.mark.parametrize("stdin,drop,code", [
    (b"{not json", (), 6),
    (b"[1, 2]", (), 6),
    (None, ("CNI_CONTAINERID",), 4),
    ("bad-version", (), 1),
], ids=["malformed", "not-an-object", "missing-containerid", "unknown-version"])
def test_errors_are_spec_json_with_nonzero_exit(tmp_path, stdin, drop, code):
    if stdin is None:
        stdin = config(tmp_path)
    elif stdin == "bad-version":
        stdin = config(tmp_path, version="9.9.9")
    exit_code, out = run("ADD", stdin, drop=drop)
    assert exit_code != 0
    assert out["code"] == code and out["msg"]
    assert not (tmp_path / "podnet").exists()


def test_exhausted_range_is_code_102(tmp_path):
    assert run("ADD", config(tmp_path), container_id="c1")[0] == 0
    exit_code, out = run("ADD", config(tmp_path), container_id="c2")
    assert exit_code != 0
    assert out == {"cniVersion": "1.0.0", "code": 102,
                   "msg": "no IP addresses available in range set: 10.0.0.1-10.0.0.2"}
    assert sorted(n for n in os.listdir(tmp_path / "podnet") if n[0] in "1f") == \
        ["10.0.0.2", "fd00::2"]


def test_builtin_path_loads_no_subprocess_and_no_logging():
    probe = (f"import sys; sys.path.insert(0, {str(REPO)!r}); "
             "import cni.ipam.builtin, cni.ipam.store, cni.ipam.allocator, cni.ipam.config; "
             "import cni.ipam; "
             "print(sorted(m for m in ('subprocess', 'logging') if m in sys.modules))")
    out = subprocess.run([python(), "-I", "-S", "-c", probe], capture_output=True, text=True,
                         check=True).stdout.strip()
    assert out == "[]"

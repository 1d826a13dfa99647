"""Regression tests for issue 10's defects that input validation fixes, through the one
dispatcher (`cni.dispatch.execute`) on the fake kernel: each hostile input gets its spec code
and a message, and leaves nothing behind (no veth, no pod interface, no reservation).

The kernel-facing halves (a FIFO as CNI_NETNS, an overlong network name's alias on the real
kernel) are in tests/netns/test_cni_hostile.py; the transport halves (client, shim, agent
socket) in tests/unit/cni/test_cni_transport_hostile.py.
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from cni import netns as cni_netns
from cni.config import MAX_NETWORK_NAME
from cni.dispatch import execute
from cni.fake_kernel import FakeCniKernel
from cni.ipam.config import IpRange
from cni.handlers import PluginHandlers
from tests.unit.cni.test_cni_handlers import NETNS, leftovers, reservations

NETWORK = "podnet"


def config(data_dir: Path, *, version: str = "1.0.0", ipam: dict | None = None, **extra) -> dict:
    conf = {"cniVersion": version, "name": NETWORK, "type": "netagent",
            "ipam": {"type": "netagent", "dataDir": str(data_dir), "ranges": [[{"subnet": "10.77.0.0/24"}]]}}
    conf["ipam"].update(ipam or {})
    conf.update(extra)
    return conf


def env(command: str = "ADD", *, container_id: str = "c1", ifname: str = "eth0", netns: str = NETNS) -> dict:
    return {"CNI_COMMAND": command, "CNI_CONTAINERID": container_id, "CNI_IFNAME": ifname,
            "CNI_NETNS": netns, "CNI_PATH": "/opt/cni/bin"}


@pytest.fixture
def fake() -> FakeCniKernel:
    kernel = FakeCniKernel()
    kernel.add_netns(NETNS)
    return kernel


def run(fake: FakeCniKernel, conf: dict | bytes, environ: dict) -> tuple[int, dict | None]:
    stdin = conf if isinstance(conf, bytes) else json.dumps(conf).encode()
    code, out = execute(environ, stdin, PluginHandlers(kernel=fake))
    parsed = json.loads(out) if out else None
    if code != 0:
        assert isinstance(parsed, dict) and isinstance(parsed.get("msg"), str) and parsed["msg"]
    return code, parsed


def assert_nothing_left(fake: FakeCniKernel, data_dir: Path) -> None:
    assert leftovers(fake) == []
    assert reservations(data_dir) == []


# ---------------------------------------------------------------- 1. malformed prevResult

BAD_PREV_RESULTS = [
    ("1.0.0", {"interfaces": 5}),
    ("1.0.0", {"ips": True}),
    ("0.4.0", {"ips": [{}]}),
    ("0.3.1", {"ips": [{"address": "bogus"}]}),
    ("1.0.0", {"ips": [{"address": "10.0.0.1/24", "interface": 3}]}),
    ("1.0.0", {"ips": [{"address": "10.0.0.1/24", "interface": True}], "interfaces": [{"name": "x"}]}),
    ("0.4.0", {"ips": [{"address": "10.0.0.1/24", "version": "6"}]}),
    ("1.0.0", {"routes": [{"dst": "nowhere"}]}),
    ("1.0.0", {"routes": [{"dst": "0.0.0.0/0", "gw": 7}]}),
    ("1.0.0", {"dns": {"nameservers": True}}),
    ("1.0.0", {"interfaces": [{"name": 1}]}),
    ("1.0.0", []),
]


@pytest.mark.parametrize("version, prev", BAD_PREV_RESULTS, ids=[json.dumps(p) for _, p in BAD_PREV_RESULTS])
def test_a_malformed_prev_result_is_code_7_before_any_work(fake, tmp_path, version, prev):
    code, out = run(fake, config(tmp_path, version=version, prevResult=prev), env())
    assert (code, out["code"]) == (1, 7), out
    assert fake.calls == []  # refused before the kernel was asked anything
    assert_nothing_left(fake, tmp_path)
    # and the retry with a good prevResult works: nothing half-made is in the way
    good = {"interfaces": [{"name": "lo0"}], "ips": [{"address": "192.0.2.5/32", "interface": 0}]}
    code, out = run(fake, config(tmp_path, version=version, prevResult=good), env())
    assert code == 0, out


@pytest.mark.parametrize("prev", [{"interfaces": 5}, {"ips": [{"address": "bogus"}]}])
def test_check_with_a_malformed_prev_result_is_code_7(fake, tmp_path, prev):
    code, out = run(fake, config(tmp_path, prevResult=prev), env("CHECK"))
    assert (code, out["code"]) == (1, 7)


# ---------------------------------------------------------------- 2. a trailing newline

def test_a_trailing_newline_never_names_another_attachment(fake, tmp_path):
    assert run(fake, config(tmp_path), env(container_id="abc"))[0] == 0
    held = reservations(tmp_path)
    for environ in (env("DEL", container_id="abc\n"), env("ADD", container_id="abc\n"),
                    env("DEL", ifname="eth0\n", container_id="abc"), env("ADD", ifname="eth0\n")):
        code, out = run(fake, config(tmp_path), environ)
        assert (code, out["code"]) == (1, 4), environ
    assert reservations(tmp_path) == held  # the running pod keeps its address
    code, out = run(fake, config(tmp_path, name="netagent\n"), env(container_id="other"))
    assert (code, out["code"]) == (1, 7)
    code, out = run(fake, config(tmp_path, bridge="na0\n"), env(container_id="other"))
    assert (code, out["code"]) == (1, 7)


# ---------------------------------------------------------------- 3. network names the kernel cannot carry

def test_network_names_are_bounded_by_the_alias_the_kernel_keeps(fake, tmp_path):
    longest = "n" * MAX_NETWORK_NAME
    assert len(("netagent:" + longest).encode()) == 254  # 255 with the NUL the attribute carries
    for length in (MAX_NETWORK_NAME + 1, 300, 1024):
        code, out = run(fake, config(tmp_path, name="n" * length), env())
        assert (code, out["code"]) == (1, 7) and "at most" in out["details"]
        assert_nothing_left(fake, tmp_path)
    code, out = run(fake, config(tmp_path, name=longest), env())
    assert code == 0, out


def test_the_fake_kernel_refuses_an_alias_the_kernel_refuses_and_leaves_nothing(fake, tmp_path):
    from cni.kernel import VethPair
    from netagent.kernel.errors import KernelError
    netns = fake.open_netns(NETNS)
    with pytest.raises(KernelError):
        fake.create_veth(VethPair(host_name="na000000000001", pod_ifname="eth0", mtu=1500, host_mac="02:00:00:00:00:01",
                                  pod_mac="02:00:00:00:00:02", alias="netagent:" + "n" * 246), netns)
    fake.close_netns(netns)
    assert leftovers(fake) == []


# ---------------------------------------------------------------- 4. non-UTF-8 CNI_* values

@pytest.mark.parametrize("key", ["CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME", "CNI_ARGS", "CNI_PATH"])
def test_non_utf8_environment_is_code_4(fake, tmp_path, key):
    environ = env()
    environ[key] = b"bad\xff\xfe".decode("utf-8", "surrogateescape")  # as the client decodes it
    code, out = run(fake, config(tmp_path), environ)
    assert (code, out["code"]) == (1, 4) and "UTF-8" in out["msg"]
    assert_nothing_left(fake, tmp_path)


# ---------------------------------------------------------------- 5. limits in-process as through the agent

def test_oversized_stdin_and_environment_are_refused_in_process_too(fake, tmp_path):
    huge = json.dumps(config(tmp_path, padding="x" * (16 * 1024 * 1024))).encode()
    code, out = run(fake, huge, env())
    assert (code, out["code"]) == (1, 7) and "16 MiB" in out["msg"]
    environ = env()
    environ["CNI_ARGS"] = "IgnoreUnknown=1;" + "K=" + "v" * (64 * 1024)
    code, out = run(fake, config(tmp_path), environ)
    assert (code, out["code"]) == (1, 4) and "64 KiB" in out["msg"]
    assert_nothing_left(fake, tmp_path)


@pytest.mark.parametrize("path", ["relative.sock", "/" + "s" * 107, "/run/a\0b.sock"])
def test_an_unusable_agent_socket_path_is_code_7(fake, tmp_path, path):
    code, out = run(fake, config(tmp_path, agentSocket=path), env())
    assert (code, out["code"]) == (1, 7) and "agentSocket" in out["msg"]


# ---------------------------------------------------------------- 6. files that never end or never open

def test_resolv_conf_must_be_a_small_regular_file(fake, tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    big = tmp_path / "big.conf"
    big.write_bytes(b"# padding\n" * 10000)
    for path in (str(fifo), "/dev/zero", str(tmp_path), str(big)):
        started = time.monotonic()
        code, out = run(fake, config(tmp_path, ipam={"resolvConf": path}), env())
        assert (code, out["code"]) == (1, 7), (path, out)
        assert time.monotonic() - started < 10, "a FIFO held the request"
        assert_nothing_left(fake, tmp_path)
    good = tmp_path / "resolv.conf"
    good.write_text("nameserver 10.96.0.10\nsearch svc.cluster.local\n")
    code, out = run(fake, config(tmp_path, ipam={"resolvConf": str(good)}), env())
    assert code == 0 and out["dns"] == {"nameservers": ["10.96.0.10"], "search": ["svc.cluster.local"]}


def test_cni_netns_that_is_no_network_namespace_is_code_4_with_the_reason(tmp_path):
    fifo, plain = tmp_path / "fifo", tmp_path / "plain"
    os.mkfifo(fifo)
    plain.write_text("")
    cases = {str(fifo): "FIFO", str(plain): "no namespace", str(tmp_path): "directory", "/dev/null": "device",
             "/proc/self/ns/mnt": "mount namespace"}
    for path, reason in cases.items():
        with pytest.raises(Exception) as failed:
            cni_netns.open_netns(path)
        assert getattr(failed.value, "code", None) == 4 and reason in failed.value.details, path
    os.close(cni_netns.open_netns("/proc/self/ns/net"))


# ---------------------------------------------------------------- 7. relative paths

@pytest.mark.parametrize("key", ["dataDir", "resolvConf"])
def test_relative_ipam_paths_are_code_7(fake, tmp_path, key):
    code, out = run(fake, config(tmp_path, ipam={key: "relative/dir"}), env())
    assert (code, out["code"]) == (1, 7) and "absolute" in out["msg"]
    assert_nothing_left(fake, tmp_path)


# ---------------------------------------------------------------- 8. deep JSON

@pytest.mark.parametrize("depth", [600, 990, 5000, 20000])
def test_deeply_nested_json_is_code_6_and_renders(fake, tmp_path, depth):
    stdin = b'{"cniVersion": "0.4.0", "deep": ' + b"[" * depth + b"]" * depth + b"}"
    code, out = run(fake, stdin, env())
    assert (code, out["code"]) == (1, 6) and "levels deep" in out["details"]


def test_moderately_nested_json_is_fine(fake, tmp_path):
    conf = config(tmp_path)
    conf["deep"] = json.loads("[" * 200 + "]" * 200)
    assert run(fake, conf, env())[0] == 0


# ---------------------------------------------------------------- 9. values the kernel or a runtime would choke on

@pytest.mark.parametrize("overrides, environ, code", [
    (dict(ipam={"ranges": [[{"subnet": "0.0.0.0/0"}]]}), {}, 7),
    (dict(ipam={"ranges": [[{"subnet": "::/0"}]]}), {}, 7),
    (dict(ipam={"ranges": [[{"subnet": "10.77.0.0/24", "gateway": "10.77.0.255"}]]}), {}, 7),
    (dict(ipam={"ranges": [[{"subnet": "10.77.0.0/24", "gateway": "10.77.0.0"}]]}), {}, 7),
    (dict(ipam={"ranges": [[{"subnet": "10.77.0.0/\u0662\u0664"}]]}), {}, 7),
    (dict(ipam={"dns": {"nameservers": True}}), {}, 7),
    (dict(ipam={"dns": {"nameservers": ["not-an-ip"]}}), {}, 7),
    (dict(dns={"search": "one-string"}), {}, 7),
    (dict(bridge="all"), {}, 7),
    (dict(bridge="default"), {}, 7),
    ({}, {"CNI_IFNAME": "all"}, 4),
    ({}, {"CNI_IFNAME": "default"}, 4),
])
def test_unvalidated_values_get_a_clear_code(fake, tmp_path, overrides, environ, code):
    got, out = run(fake, config(tmp_path, **overrides), {**env(), **environ})
    assert (got, out["code"]) == (1, code), out
    assert_nothing_left(fake, tmp_path)


def test_thousands_of_ranges_are_parsed_in_linear_time(fake, tmp_path, monkeypatch):
    """Counted, not timed: comparing every pair of 8,000 ranges would be 32 million overlap tests."""
    comparisons = []
    compare = IpRange.overlaps
    monkeypatch.setattr(IpRange, "overlaps", lambda a, b: comparisons.append(1) or compare(a, b))
    ranges = [[{"subnet": f"10.{i // 256}.{i % 256}.0/24"} for i in range(8000)]]
    code, out = run(fake, config(tmp_path, ipam={"ranges": ranges}), env())
    assert code == 0, out
    assert 0 < len(comparisons) <= 4 * 8000, f"{len(comparisons)} overlap tests for one ADD over 8,000 ranges"
    overlapping = ranges[0] + [{"subnet": "10.3.0.128/25"}]
    fake.add_netns("/var/run/netns/other")
    other = dict(container_id="c2", netns="/var/run/netns/other")
    code, out = run(fake, config(tmp_path, ipam={"ranges": [overlapping]}), env(**other))
    assert (code, out["code"]) == (1, 7) and "overlap" in out["msg"]
    sets = [[{"subnet": f"10.{i // 256}.{i % 256}.0/24"}] for i in range(3000)] + [[{"subnet": "10.5.0.0/16"}]]
    code, out = run(fake, config(tmp_path, ipam={"ranges": sets}), env(**other))
    assert (code, out["code"]) == (1, 7) and "overlaps with" in out["msg"]

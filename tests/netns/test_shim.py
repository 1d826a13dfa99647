"""The static CNI shim against the real agent in a node namespace, beside the Python client.

A lab node installs the shim as its `netagent` binary (`plugin=PluginBinary.SHIM`) and runs
`netagent run --cni-only`; the Python client is installed into a second directory of the
same node. Every operation goes through the shim; where both clients reach the agent,
their stdout and exit codes must be identical, byte for byte. With the agent stopped, the
shim answers code 11, and a DEL is journaled and carried out when the agent starts again:
the veth and the address reservation are gone afterwards.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from cni import invoke
from netagent.cniserver import install as cni_install
from netagent.kernel import namespaces, owned
from tests.netns.test_cni_plugin import assert_clean, our_veths, reservations
from tests.shim_support import installed_shim_or_skip


@pytest.fixture
def node(make_node):
    installed_shim_or_skip()

    def make(**kwargs):
        lab = make_node(plugin=cni_install.PluginBinary.SHIM, **kwargs)
        lab.python_bin_dir = os.path.join(lab.workdir, "python-bin")
        cni_install.install(bin_dir=lab.python_bin_dir, conf_dir=None, name="netagent", subnets=[],
                            mode=lab.mode, bridge=owned.DEFAULT_BRIDGE, mtu=1500, socket_path=lab.socket_path,
                            data_dir=lab.data_dir, plugin=cni_install.PluginBinary.PYTHON)
        with open(os.path.join(lab.bin_dir, "netagent"), "rb") as f:
            assert f.read(4) == b"\x7fELF"
        return lab
    return make


def call(node, bin_dir: str, command: str | None, *, config: bytes | None = None, container_id: str = "c1",
         netns: str = "", ifname: str = "eth0", args: str = "", env_overrides: dict | None = None):
    """Execute one client binary from the node's namespace; return (exit code, raw stdout)."""
    env = invoke.cni_environment(command=command or "", container_id=container_id, netns=netns, ifname=ifname,
                                 args=args, path=(bin_dir, "/usr/lib/cni"))
    if command is None:
        del env["CNI_COMMAND"]
    env.update(env_overrides or {})
    proc = subprocess.run([*namespaces.exec_prefix(node.node), os.path.join(bin_dir, "netagent")],
                          input=config if config is not None else node.plugin_config(), env=env,
                          capture_output=True, timeout=120)
    assert proc.returncode >= 0, proc
    return proc.returncode, proc.stdout


def both(node, command, **kwargs):
    """The same request through the shim and through the Python client."""
    return call(node, node.bin_dir, command, **kwargs), call(node, node.python_bin_dir, command, **kwargs)


def wait_until(predicate, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_every_operation_through_the_shim(node):
    lab = node(cni_version="1.1.0")
    a, b = lab.add_pod("a"), lab.add_pod("b")
    assert a.ip != b.ip and lab.ping("a", b.ip) and lab.ping("b", a.ip)
    assert a.result["cniVersion"] == "1.1.0" and a.result["interfaces"][-1]["sandbox"] == a.netns
    code, out = lab.cni("CHECK", container_id=a.container_id, netns=a.netns,
                        config=lab.plugin_config(prev_result=a.result))
    assert (code, out) == (0, None)
    assert lab.cni("STATUS") == (0, None)
    code, out = lab.cni("VERSION", config=b'{"cniVersion": "0.4.0"}')
    assert (code, out["cniVersion"]) == (0, "0.4.0")

    gone = lab.add_pod("gone")
    valid = [{"containerID": p.container_id, "ifname": "eth0"} for p in (a, b)]
    assert lab.cni("GC", config=lab.plugin_config(**{"cni.dev/valid-attachments": valid})) == (0, None)
    lab.pods.pop(gone.name)
    assert sorted(reservations(lab)) == sorted([a.ip, b.ip]) and len(our_veths(lab)) == 2

    lab.delete_pod("a")
    lab.delete_pod("b")
    assert_clean(lab)


def test_the_shim_and_the_python_client_answer_alike(node):
    lab = node(cni_version="1.1.0")
    netns = namespaces.netns_path(lab.new_pod_netns("x"))
    old = lab.plugin_config(cniVersion="1.0.0")
    cases = [
        dict(command="VERSION", config=b'{"cniVersion": "0.4.0"}'),
        dict(command="VERSION", config=b""),
        dict(command="STATUS"),
        dict(command="STATUS", config=old),  # STATUS needs 1.1.0: code 1
        dict(command="GC"),
        dict(command="DEL", container_id="never-added", netns=netns),
        dict(command="CHECK", netns=netns),  # no prevResult: code 7
        dict(command="ADD", netns=""),  # CNI_NETNS missing: code 4
        dict(command="ADD", netns=netns, ifname="eth0;reboot"),
        dict(command="ADD", netns=netns, container_id="../../etc"),
        dict(command="ADD", netns=netns, args="K8S_POD_NAME=a;Surprise=1"),  # code 2
        dict(command="ADD", netns=netns, config=lab.plugin_config(cniVersion="9.9.9")),
        dict(command="ADD", netns=netns, config=lab.plugin_config(mtu="big")),
        dict(command="ADD", netns="/proc/no/such/netns"),  # code 3
        dict(command="FROB", netns=netns),  # unknown command: code 4
        dict(command=None, netns=netns),  # CNI_COMMAND missing: code 4
    ]
    for case in cases:
        shim, python = both(lab, **case)
        assert shim == python, case
        if shim[0] != 0:
            assert json.loads(shim[1])["code"] > 0
    # the shim relays the environment's bytes; the agent refuses what is not UTF-8 with code 4
    code, out = call(lab, lab.bin_dir, "ADD", netns=netns, env_overrides={"CNI_ARGS": b"K8S_POD_NAME=\xff"})
    assert (code, json.loads(out)["code"]) == (1, 4)
    # a config that is not JSON never reaches the agent: both say 6 (the Python client in-process)
    shim, python = both(lab, "ADD", netns=netns, config=b"{oops")
    assert (shim[0], json.loads(shim[1])["code"]) == (python[0], json.loads(python[1])["code"]) == (1, 6)

    shim_add = call(lab, lab.bin_dir, "ADD", container_id="s", netns=netns)
    other = namespaces.netns_path(lab.new_pod_netns("y"))
    python_add = call(lab, lab.python_bin_dir, "ADD", container_id="p", netns=other)
    assert shim_add[0] == python_add[0] == 0

    def shape(raw: bytes) -> dict:
        result = json.loads(raw)
        return {"cniVersion": result["cniVersion"], "interfaces": len(result["interfaces"]),
                "gateways": [ip["gateway"] for ip in result["ips"]], "routes": result["routes"]}
    assert shape(shim_add[1]) == shape(python_add[1])
    assert both(lab, "DEL", container_id="s", netns=netns)[0] == (0, b"")
    assert call(lab, lab.bin_dir, "DEL", container_id="p", netns=other) == (0, b"")
    assert_clean(lab)


def test_no_agent_is_code_11_but_version_still_answers(node):
    lab = node(cni_version="1.1.0")
    lab.stop_agent()
    netns = namespaces.netns_path(lab.new_pod_netns("x"))
    for command in ("ADD", "CHECK", "STATUS", "GC"):
        code, out = call(lab, lab.bin_dir, command, netns=netns)
        error = json.loads(out)
        assert (code, error["code"], error["msg"]) == (1, 11, "the netagent agent is not running"), command
        assert error["details"].startswith(lab.socket_path)
    code, out = call(lab, lab.bin_dir, "VERSION")
    assert code == 0 and json.loads(out)["cniVersion"] == "1.1.0"
    assert our_veths(lab) == [] and not os.path.exists(os.path.join(lab.workdir, "ipam", "netagent"))


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["stopped", "killed"])
def test_a_del_while_the_agent_is_down_is_done_when_it_starts(node, sig):
    lab = node()
    keep, gone = lab.add_pod("keep"), lab.add_pod("gone")
    lab.settle()
    lab.stop_agent(sig=sig)  # SIGTERM removes the socket (ENOENT), SIGKILL leaves it (ECONNREFUSED)
    assert os.path.exists(lab.socket_path) == (sig == signal.SIGKILL)

    code, out = lab.cni("DEL", container_id=gone.container_id, netns=gone.netns)
    assert (code, out) == (0, None)
    lab.pods.pop(gone.name)
    records = [n for n in os.listdir(lab.journal_dir) if n.endswith(".wire")]
    assert len(records) == 1
    assert len(our_veths(lab)) == 2 and sorted(reservations(lab)) == sorted([keep.ip, gone.ip])

    lab.start_agent()
    wait_until(lambda: not [n for n in os.listdir(lab.journal_dir) if n.endswith((".wire", ".json"))])
    assert our_veths(lab) == [keep.result["interfaces"][1]["name"]]
    assert reservations(lab) == [keep.ip]
    assert "adopted 1 DEL(s)" in lab.agent_output()
    assert lab.ping("keep", "10.244.1.1")
    lab.delete_pod("keep")
    assert_clean(lab)


def test_concurrent_adds_through_the_shim_get_unique_addresses(node):
    lab = node(subnets=("10.244.16.0/22",))
    count = 40
    names = [lab.new_pod_netns(f"p{i}") for i in range(count)]

    def run(command, i):
        return lab.cni(command, container_id=f"c{i}", netns=namespaces.netns_path(names[i]))

    with ThreadPoolExecutor(max_workers=count) as pool:
        results = list(pool.map(lambda i: run("ADD", i), range(count)))
    assert all(code == 0 for code, _ in results), [out for code, out in results if code]
    assert len({out["ips"][0]["address"] for _, out in results}) == count
    with ThreadPoolExecutor(max_workers=count) as pool:
        assert all(code == 0 for code, _ in pool.map(lambda i: run("DEL", i), range(count)))
    assert_clean(lab)

"""The reference `bridge` plugin delegating its IPAM to the installed `netagent-ipam` shim.

`netagent cni install` writes the static shim as `netagent-ipam` too; executed under that
name it relays IPAM-only requests (the config's `ipam.agentSocket`) to the running agent,
which serves them from its store. Here a lab node installs the shim (`PluginBinary.SHIM`)
and runs its agent; Debian's bridge plugin, run from inside the node's namespace as a
runtime would, execs the shim copy: ADD gets an address from the agent's store (the
reservation file, the agent's log), CHECK confirms it, DEL releases it; and a DEL while no
agent listens is journaled by the shim and carried out when the agent starts again. A user's
own bridge conflist that names no `agentSocket` (as host-local is configured) reaches the agent
at the shim's default socket: there the shim is built with its default pointed at the lab
agent's socket (build.sh's NETAGENT_DEFAULT_SOCKET), as the shipped one points at `netagent
run`'s, so the host's /run/netagent is never used.
"""
from __future__ import annotations

import os

import pytest

from cni.errors import CniError
from netagent.cniserver import install as cni_install
from tests.netns.test_interop import LINE_BREAK, Chain, address_of, links, ping, require_reference, reservation_files
from tests.netns.test_shim import wait_until
from tests.shim_support import build_shim_or_skip, installed_shim_or_skip


@pytest.fixture
def node(make_node):
    require_reference("bridge")
    installed_shim_or_skip()
    lab = make_node(plugin=cni_install.PluginBinary.SHIM)
    with open(os.path.join(lab.bin_dir, "netagent-ipam"), "rb") as f:
        assert f.read(4) == b"\x7fELF"  # the shim, not a script whose interpreter the host may lack
    return lab


def bridge_conflist(lab, subnet: str, *, agent_socket: bool = True) -> dict:
    ipam = {"type": "netagent-ipam", "agentSocket": lab.socket_path,
            "ranges": [[{"subnet": subnet}]], "dataDir": os.path.join(lab.workdir, "ref-ipam")}
    if not agent_socket:
        del ipam["agentSocket"]
    return {"cniVersion": "1.0.0", "name": "refnet", "plugins": [{
        "type": "bridge", "bridge": "cni-ref0", "isGateway": True, "ipam": ipam}]}


def served_by_agent(lab, command: str) -> int:
    return lab.agent_output().count(f"CNI {command} (netagent-ipam)")


def test_bridge_with_the_shim_as_its_ipam(node):
    lab = node
    chain = Chain(lab, bridge_conflist(lab, "10.250.7.0/24"))
    network_dir = os.path.join(lab.workdir, "ref-ipam", "refnet")
    pods = {}
    for name in ("a", "b"):
        netns_name = lab.new_pod_netns(name)
        container_id = f"{lab.prefix}-{name}"
        pods[name] = (netns_name, container_id, chain.run("ADD", container_id=container_id, netns_name=netns_name))
    assert served_by_agent(lab, "ADD") == 2

    (a_ns, a_id, a_result), (b_ns, b_id, b_result) = pods["a"], pods["b"]
    a_ip, b_ip = address_of(a_result), address_of(b_result)
    assert a_result["ips"][0]["gateway"] == "10.250.7.1" and a_ip != b_ip
    assert reservation_files(network_dir) == {a_ip: f"{a_id}{LINE_BREAK}eth0", b_ip: f"{b_id}{LINE_BREAK}eth0"}
    assert ping(a_ns, b_ip) and ping(b_ns, a_ip)

    chain.run("CHECK", container_id=a_id, netns_name=a_ns, prev_result=a_result)
    assert served_by_agent(lab, "CHECK") == 1
    chain.run("DEL", container_id=a_id, netns_name=a_ns, prev_result=a_result)
    assert served_by_agent(lab, "DEL") == 1
    assert reservation_files(network_dir) == {b_ip: f"{b_id}{LINE_BREAK}eth0"}
    assert "eth0" not in links(a_ns)

    # the agent is down: bridge's DEL still succeeds, the shim journals the IPAM DEL
    lab.stop_agent()
    chain.run("DEL", container_id=b_id, netns_name=b_ns, prev_result=b_result)
    records = [n for n in os.listdir(lab.journal_dir) if n.endswith(".wire")]
    assert len(records) == 1
    with open(os.path.join(lab.journal_dir, records[0]), "rb") as f:
        assert f.readline().endswith(b" netagent-ipam\n")
    assert reservation_files(network_dir) == {b_ip: f"{b_id}{LINE_BREAK}eth0"}  # not released yet
    assert "eth0" not in links(b_ns)

    lab.start_agent()  # replays the record with the IPAM handlers: the reservation goes
    wait_until(lambda: not [n for n in os.listdir(lab.journal_dir) if n.endswith((".wire", ".json"))])
    assert "adopted 1 DEL(s)" in lab.agent_output()
    assert reservation_files(network_dir) == {}
    assert not [n for n in os.listdir(os.path.join(lab.workdir, "ref-ipam", ".netagent-attachments"))]


def test_no_agent_add_is_code_11_and_nothing_is_left(node):
    lab = node
    lab.stop_agent()
    chain = Chain(lab, bridge_conflist(lab, "10.250.8.0/24"))
    netns_name = lab.new_pod_netns("x")
    with pytest.raises(CniError) as failure:
        chain.run("ADD", container_id=f"{lab.prefix}-x", netns_name=netns_name)
    assert failure.value.code == 11, (failure.value.msg, failure.value.details)
    assert failure.value.msg == "the netagent agent is not running"
    assert reservation_files(os.path.join(lab.workdir, "ref-ipam", "refnet")) == {}
    # bridge leaves its veth to the DEL a runtime sends after a failed ADD; it succeeds, journaled
    chain.run("DEL", container_id=f"{lab.prefix}-x", netns_name=netns_name)
    assert "eth0" not in links(netns_name)
    lab.start_agent()
    wait_until(lambda: not [n for n in os.listdir(lab.journal_dir) if n.endswith((".wire", ".json"))])
    assert "adopted 1 DEL(s)" in lab.agent_output()
    assert reservation_files(os.path.join(lab.workdir, "ref-ipam", "refnet")) == {}


def test_a_conflist_without_agent_socket_uses_the_default_socket(node, tmp_path):
    """Issue 18: this was code 7 "no 'ipam.agentSocket'", so the documented IPAM-only use failed."""
    lab = node
    shim = build_shim_or_skip(tmp_path, default_socket=lab.socket_path)
    os.replace(shim, os.path.join(lab.bin_dir, "netagent-ipam"))  # what bridge executes, as installed
    chain = Chain(lab, bridge_conflist(lab, "10.250.9.0/24", agent_socket=False))
    network_dir = os.path.join(lab.workdir, "ref-ipam", "refnet")
    netns_name = lab.new_pod_netns("d")
    container_id = f"{lab.prefix}-d"
    result = chain.run("ADD", container_id=container_id, netns_name=netns_name)
    assert served_by_agent(lab, "ADD") == 1
    address = address_of(result)
    assert result["ips"][0]["gateway"] == "10.250.9.1"
    assert reservation_files(network_dir) == {address: f"{container_id}{LINE_BREAK}eth0"}
    assert ping(netns_name, "10.250.9.1")  # bridge's gateway on the node, through the pod's veth

    # the agent is down: the DEL is journaled beside the default socket, replayed at its start
    lab.stop_agent()
    chain.run("DEL", container_id=container_id, netns_name=netns_name, prev_result=result)
    assert [n for n in os.listdir(lab.journal_dir) if n.endswith(".wire")]
    assert "eth0" not in links(netns_name)
    lab.start_agent()
    wait_until(lambda: not [n for n in os.listdir(lab.journal_dir) if n.endswith((".wire", ".json"))])
    assert "adopted 1 DEL(s)" in lab.agent_output()
    assert reservation_files(network_dir) == {}

"""IPAM-only requests served by the agent: the shim executed as `netagent-ipam`.

A real `CniServer` on a unix socket (tests/unit/cni/test_cni_transport_hostile.py's `Agent`:
`PluginHandlers` over the fake kernel) and the shim built here and copied as
`netagent-ipam`, as `netagent cni install` copies it. The request names its plugin in the
wire's selector, so the agent runs the IPAM-only handlers (`cni.ipam.plugin.LockedIpam`)
with the IPAM config scope: another main plugin's keys are not judged, the kernel is not
touched, and the answers are the in-process `netagent-ipam`'s byte for byte. The
attachment's lock holds on this path too, and the socket is the `ipam` section's.
"""
from __future__ import annotations

import json
import os
import shutil

import pytest

from cni import attachment_lock
from cni.config import ConfigScope, parse_netconf
from cni.ipam.plugin import LockedIpam, run_ipam
from cni.wiring import host_veth_name
from tests.shim_support import build_shim_or_skip, run_binary
from tests.unit.cni.cni_fuzz_world import redirect_default_data_dir
from tests.unit.cni.test_cni_transport_hostile import Agent, assert_error, via_shim


@pytest.fixture(scope="module")
def shims(tmp_path_factory) -> dict:
    """{name: path}: the one built shim, installed under both plugin names."""
    main = build_shim_or_skip(tmp_path_factory.mktemp("shim"))
    ipam = os.path.join(os.path.dirname(main), "netagent-ipam")
    shutil.copy(main, ipam)
    return {"netagent": main, "netagent-ipam": ipam}


@pytest.fixture
def agent():
    started = Agent(ipam_handlers=LockedIpam(lock_timeout=0.3))
    yield started
    started.close()


def bridge_config(agent: Agent, data_dir: str | None = None, **ipam_extra) -> bytes:
    """What the reference bridge plugin hands its IPAM plugin: its own keys at the top level."""
    return json.dumps({"cniVersion": "1.0.0", "name": "refnet", "type": "bridge", "mode": "vepa",
                       "bridge": "cni0", "isGateway": True,
                       "ipam": {"type": "netagent-ipam", "agentSocket": agent.socket_path,
                                "dataDir": data_dir or agent.data_dir,
                                "ranges": [[{"subnet": "10.250.3.0/24"}]], **ipam_extra}}).encode()


def reserved(data_dir: str) -> dict:
    directory = os.path.join(data_dir, "refnet")
    if not os.path.isdir(directory):
        return {}
    return {name: open(os.path.join(directory, name), newline="").read() for name in os.listdir(directory)
            if name != "lock" and not name.startswith("last_reserved_ip")}


def test_add_check_del_are_served_from_the_agents_store(agent, shims):
    env = agent.pod_env("c1")
    code, out = via_shim(shims["netagent-ipam"], env, bridge_config(agent))
    assert code == 0, out
    assert out["ips"] == [{"address": "10.250.3.2/24", "gateway": "10.250.3.1"}]
    assert reserved(agent.data_dir) == {"10.250.3.2": "c1\r\neth0"}
    assert agent.server.requests_served == 1 and agent.kernel.calls == []  # IPAM only: no veth

    check = json.loads(bridge_config(agent))
    check["prevResult"] = {"cniVersion": "1.0.0", **out}
    assert via_shim(shims["netagent-ipam"], {**env, "CNI_COMMAND": "CHECK"}, json.dumps(check).encode()) == (0, {})
    assert via_shim(shims["netagent-ipam"], {**env, "CNI_COMMAND": "DEL"}, bridge_config(agent)) == (0, {})
    assert reserved(agent.data_dir) == {}
    lock_dir = os.path.join(agent.data_dir, attachment_lock.LOCK_DIR_NAME)
    assert os.listdir(lock_dir) == []  # DEL removes the attachment's lock file, as the main plugin's does
    assert agent.kernel.calls == []


def test_answers_are_the_in_process_plugins_byte_for_byte(agent, shims, tmp_path):
    for command in ("ADD", "CHECK", "DEL", "STATUS", "GC"):
        env = agent.pod_env("c1", command)
        served = run_binary(shims["netagent-ipam"], env, bridge_config(agent))
        local = run_ipam(env, bridge_config(agent, str(tmp_path / "local")))
        assert (served.returncode, served.stdout) == (local[0], local[1].encode()), command


def test_ipam_requests_hold_the_attachments_lock(agent, shims):
    env = agent.pod_env("c1")
    conf = parse_netconf(bridge_config(agent), scope=ConfigScope.IPAM)
    path = attachment_lock.lock_path(conf, host_veth_name("refnet", "c1", "eth0"))
    with attachment_lock.held(path):
        assert_error(via_shim(shims["netagent-ipam"], env, bridge_config(agent)), 11, "still running")
        assert reserved(agent.data_dir) == {}
    code, out = via_shim(shims["netagent-ipam"], env, bridge_config(agent))
    assert code == 0 and reserved(agent.data_dir) == {"10.250.3.2": "c1\r\neth0"}, out


def test_each_plugin_finds_the_socket_in_its_own_section(agent, shims):
    env = agent.pod_env("c1")
    # a section without its own socket goes to the default one (here the test build's, where
    # nothing listens), never to the other section's
    default = os.path.join(os.path.dirname(shims["netagent"]), "no-agent", "cni.sock")
    top_level_only = json.dumps({"cniVersion": "1.0.0", "name": "refnet", "type": "bridge",
                                 "agentSocket": agent.socket_path, "ipam": {"type": "netagent-ipam"}}).encode()
    assert_error(via_shim(shims["netagent-ipam"], env, top_level_only), 11, default + ": connect")
    assert_error(via_shim(shims["netagent"], env, bridge_config(agent)), 11, default + ": connect")
    relative = bridge_config(agent)
    relative = relative.replace(agent.socket_path.encode(), b"run/cni.sock")
    assert_error(via_shim(shims["netagent-ipam"], env, relative), 7, "'ipam.agentSocket' must be an absolute")
    twice = bridge_config(agent)[:-1] + b', "ipam": {"agentSocket": "/nowhere/cni.sock"}}'  # the last wins
    assert_error(via_shim(shims["netagent-ipam"], env, twice), 11, "/nowhere/cni.sock")
    not_an_object = bridge_config(agent)[:-1] + b', "ipam": "netagent-ipam"}'
    assert_error(via_shim(shims["netagent-ipam"], env, not_an_object), 11, default + ": connect")
    assert agent.server.requests_served == 0 and reserved(agent.data_dir) == {}


def test_the_main_plugins_requests_are_still_its_own(agent, shims):
    """The agent's main plugin keeps judging its own keys: bridge's config is refused there."""
    code, out = via_shim(shims["netagent"], agent.pod_env("c1"), agent.config())
    assert code == 0 and out["interfaces"], out
    assert_error(via_shim(shims["netagent"], agent.pod_env("c2"), agent.config(mode="vepa")), 7, "'mode'")


def test_hostile_input_gets_the_same_codes_on_the_ipam_path(agent, shims):
    host_data_dir = os.path.join(agent.dir, "host-default-data-dir")  # stands in for /var/lib/cni/networks
    undo = redirect_default_data_dir(host_data_dir)
    try:
        _hostile_input_on_the_ipam_path(agent, shims, host_data_dir)
    finally:
        undo()


def _hostile_input_on_the_ipam_path(agent: Agent, shims: dict, host_data_dir: str) -> None:
    env = agent.pod_env("c1")
    raw = {k.encode(): v.encode() for k, v in env.items()}
    assert_error(via_shim(shims["netagent-ipam"], {**raw, b"CNI_ARGS": b"K8S_POD_NAME=\xff"}, bridge_config(agent)),
                 4, "UTF-8")
    assert_error(via_shim(shims["netagent-ipam"], env, bridge_config(agent, padding="x" * (16 * 1024 * 1024))),
                 7, "16 MiB")
    assert_error(via_shim(shims["netagent-ipam"], {**env, "CNI_IFNAME": "eth0;reboot"}, bridge_config(agent)),
                 4, "CNI_IFNAME")
    assert_error(via_shim(shims["netagent-ipam"], env, bridge_config(agent, dataDir="relative")), 7, "absolute")
    assert reserved(agent.data_dir) == {} and agent.kernel.calls == []
    assert not os.path.exists(host_data_dir), "a refused request left a file in the host's own IPAM directory"

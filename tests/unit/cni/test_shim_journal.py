"""DELs the CNI shim journals while no agent listens, adopted by the agent's DeferredDeleter.

The real shim writes the record (built here with its build script); the agent's side runs
on the fake kernel with the real IPAM store: adoption goes through the dispatcher into the
DEL journal, and the veth and the address reservation are gone afterwards. Records that
are unreadable, not DELs, or refused by the dispatcher are dropped; a shim's temporary file
is removed only once it is stale.
"""
from __future__ import annotations

import json
import os
import shutil
import time

import pytest

from cni import wire
from cni.dispatch import execute
from cni.fake_kernel import FakeCniKernel
from cni.handlers import PluginHandlers
from cni.ipam.plugin import run_ipam
from netagent.cniserver.deferred_delete import STALE_SHIM_TMP, DeferredDeleter
from tests.shim_support import build_shim_or_skip, run_binary

NETNS = "/var/run/netns/pod-a"


@pytest.fixture(scope="module")
def shim(tmp_path_factory) -> str:
    return build_shim_or_skip(tmp_path_factory.mktemp("shim"))


def config(tmp_path) -> bytes:
    return json.dumps({"cniVersion": "1.0.0", "name": "podnet", "type": "netagent",
                       "agentSocket": str(tmp_path / "run" / "cni.sock"),
                       "ipam": {"type": "netagent", "dataDir": str(tmp_path / "ipam"),
                                "ranges": [[{"subnet": "10.244.1.0/24"}]]}}).encode()


def env(command: str, container_id: str = "c1") -> dict:
    return {"CNI_COMMAND": command, "CNI_CONTAINERID": container_id, "CNI_NETNS": NETNS, "CNI_IFNAME": "eth0",
            "CNI_PATH": "/opt/cni/bin"}


def reservations(tmp_path) -> list:
    directory = tmp_path / "ipam" / "podnet"
    return sorted(f for f in os.listdir(directory) if f != "lock" and not f.startswith("last_reserved_ip"))


def veths(fake: FakeCniKernel) -> list:
    return [name for name, link in fake.node.links.items() if link.kind == "veth"]


def test_a_del_journaled_by_the_shim_is_carried_out_when_the_agent_starts(shim, tmp_path):
    fake = FakeCniKernel()
    fake.add_netns(NETNS)
    handlers = PluginHandlers(kernel=fake)
    code, out = execute(env("ADD"), config(tmp_path), handlers)
    assert code == 0, out
    assert veths(fake) and reservations(tmp_path)

    proc = run_binary(shim, env("DEL"), config(tmp_path))  # no agent: journaled
    assert (proc.returncode, proc.stdout) == (0, b"")
    journal = tmp_path / "run" / "pending-del"
    assert [p.suffix for p in journal.iterdir()] == [".wire"]
    assert veths(fake) and reservations(tmp_path)  # nothing happened yet

    deferred = DeferredDeleter(str(journal), delete_now=handlers.delete_now)
    handlers.deferred = deferred
    deferred.start()
    try:
        assert deferred.adopt_shim_records(handlers) == 1
        assert deferred.wait_idle(60)
    finally:
        deferred.stop()
    assert veths(fake) == [] and reservations(tmp_path) == []
    assert os.listdir(journal) == []


def test_an_ipam_del_journaled_by_netagent_ipam_releases_the_reservation(shim, tmp_path):
    """The record keeps the plugin selector: the replay runs the IPAM handlers, never the main plugin's."""
    ipam_shim = shutil.copy(shim, tmp_path / "netagent-ipam")
    bridge = json.dumps({"cniVersion": "1.0.0", "name": "podnet", "type": "bridge", "mode": "vepa",
                         "ipam": {"type": "netagent-ipam", "agentSocket": str(tmp_path / "run" / "cni.sock"),
                                  "dataDir": str(tmp_path / "ipam"),
                                  "ranges": [[{"subnet": "10.244.1.0/24"}]]}}).encode()
    code, out = run_ipam(env("ADD"), bridge)
    assert code == 0 and reservations(tmp_path) == ["10.244.1.2"], out

    proc = run_binary(str(ipam_shim), env("DEL"), bridge)  # no agent: journaled
    assert (proc.returncode, proc.stdout) == (0, b"")
    journal = tmp_path / "run" / "pending-del"
    [record] = list(journal.iterdir())
    assert record.read_bytes() == wire.encode_request(env("DEL"), bridge, wire.PLUGIN_IPAM)

    class MainPlugin:  # the agent's PluginHandlers must not see an IPAM-only DEL
        def delete(self, conf, req):
            raise AssertionError("the main plugin ran an IPAM DEL")

    deferred = DeferredDeleter(str(journal), delete_now=lambda conf, req: None)
    assert deferred.adopt_shim_records(MainPlugin()) == 1  # type: ignore[arg-type]
    assert reservations(tmp_path) == [] and os.listdir(journal) == []


def test_records_that_cannot_be_run_are_dropped_and_stale_temporaries_removed(tmp_path):
    journal = tmp_path / "run" / "pending-del"
    journal.mkdir(parents=True)
    records = {"shim-1-1.wire": b"garbage",
               "shim-2-1.wire": wire.encode_request(env("ADD"), config(tmp_path)),  # not a DEL
               "shim-3-1.wire": wire.encode_request(env("DEL"), b'{"cniVersion": "1.0.0"}'),  # refused
               "shim-4-1.wire": wire.encode_request(env("DEL"), b"") + b"trailing",  # length mismatch
               "shim-5-1.wire": b"NACNI1 5 0\nCNI_\xff",  # not UTF-8
               "shim-6-1.wire": wire.encode_request(env("DEL"), config(tmp_path)).replace(
                   b"\n", b" host-local\n", 1)}  # an unknown plugin
    for name, data in records.items():
        (journal / name).write_bytes(data)
    fresh, stale = journal / ".shim-7-1.tmp", journal / ".shim-8-1.tmp"
    fresh.write_bytes(b"being written")
    stale.write_bytes(b"left by a killed shim")
    old = time.time() - STALE_SHIM_TMP - 5
    os.utime(stale, (old, old))
    calls = []

    class Recording:
        def delete(self, conf, req):
            calls.append(req)

    deferred = DeferredDeleter(str(journal), delete_now=lambda conf, req: None)
    assert deferred.adopt_shim_records(Recording()) == 0
    assert calls == []
    assert sorted(os.listdir(journal)) == [fresh.name]

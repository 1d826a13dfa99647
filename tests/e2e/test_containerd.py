"""End-to-end: real containers from containerd's `ctr run --cni`, networked by a CNI plugin.

This file owns the tests that drive `containerd_harness.ContainerdNode`:
* `test_reference_bridge_containers_reach_each_other` runs Debian's reference bridge +
  host-local plugins. It validates the harness itself (isolation, ADD, the DEL that ctr
  makes on a foreground `--rm` run, teardown) independently of our plugin, so a failure in
  the netagent test below can be blamed on the plugin, not the harness.
* `test_ctr_detached_run_never_calls_cni_del` pins down the containerd 1.6 behaviour the
  harness is designed around: `ctr run -d` + `ctr task kill` + `ctr container rm` never call
  CNI DEL. If a containerd upgrade changes that, this test says so.
* `test_netagent_plugin_containers_reach_each_other` is the same scenario with our plugin,
  installed by `netagent cni install` (the static C shim) and served by `netagent run
  --cni-only` in the node's namespace. It skips only when the `netagent` entry point is not
  installed in the project's virtual environment.
"""
from __future__ import annotations

import ipaddress
import json
import shutil
from pathlib import Path

import pytest

from tests.e2e.containerd_harness import ContainerdNode
from tests.e2e.netagent_support import (NETAGENT, NETAGENT_MISSING, agent_in, bridge_name, install_netagent,
                                        reservations, settle)

pytestmark = pytest.mark.e2e

REFERENCE_PLUGINS = Path("/usr/lib/cni")


def _ping(node, container, address):
    proc = node.exec(container, ["ping", "-c", "1", "-W", "10", address], timeout=30)
    assert proc.returncode == 0, f"{container.name} -> {address}:\n{proc.stdout}{proc.stderr}"


def _two_containers_reach_each_other(node, subnet: ipaddress.IPv4Network, gateway: str):
    """Start two containers, check their addresses and that they reach each other and the
    gateway; return the containers (still running) and their addresses."""
    c1 = node.run("c1", ["sleep", "300"])
    c2 = node.run("c2", ["sleep", "300"])
    ip1, ip2 = node.container_ip(c1), node.container_ip(c2)
    assert ipaddress.ip_address(ip1) in subnet and ipaddress.ip_address(ip2) in subnet, (ip1, ip2)
    assert ip1 != ip2 and gateway not in (ip1, ip2)
    _ping(node, c1, ip2)
    _ping(node, c2, ip1)
    _ping(node, c1, gateway)
    _ping(node, c2, gateway)
    return (c1, c2), (ip1, ip2)


def _assert_runtime_added_and_deleted(node, containers):
    """From the recorded calls: ctr made ADD into the task's netns, then DEL with an empty
    CNI_NETNS, for each container, through the first plugin of the list, all successful."""
    calls = node.cni_calls()
    assert all(c.exit_code == 0 for c in calls), calls
    for container in containers:
        mine = [c for c in calls if c.container_id == container.cni_container_id]
        commands = [c.command for c in mine]
        assert "ADD" in commands and "DEL" in commands, mine
        assert commands.index("ADD") < commands.index("DEL"), mine
        add = next(c for c in mine if c.command == "ADD")
        delete = next(c for c in mine if c.command == "DEL")
        assert add.netns == f"/proc/{container.pid}/ns/net" and add.ifname == "eth0", add
        assert delete.netns == "" and delete.ifname == "eth0", delete
    assert not [c for c in calls if c.plugin == "loopback"], "ctr 1.6 does not call loopback"


def _copy_reference_plugins(bin_dir: Path, names):
    # Copies, not symlinks: the harness hides /usr/lib/cni from the plugins' view.
    bin_dir.mkdir()
    for name in names:
        shutil.copy2(REFERENCE_PLUGINS / name, bin_dir / name)


def _reference_conflist(conf_dir: Path, ipam_dir: Path, subnet: str):
    conf_dir.mkdir()
    conf_dir.joinpath("10-na-ref.conflist").write_text(json.dumps({
        "cniVersion": "1.0.0", "name": "na-ref",
        "plugins": [{"type": "bridge", "bridge": "na-ref0", "isGateway": True, "ipMasq": False,
                     "ipam": {"type": "host-local", "ranges": [[{"subnet": subnet}]],
                              "dataDir": str(ipam_dir)}}],
    }))


def test_reference_bridge_containers_reach_each_other(tmp_path, busybox_image):
    subnet = ipaddress.ip_network("10.88.9.0/24")
    bin_dir, conf_dir, ipam_dir = tmp_path / "bin", tmp_path / "conf", tmp_path / "ipam"
    _copy_reference_plugins(bin_dir, ["bridge", "host-local"])  # no loopback: ctr never calls it
    _reference_conflist(conf_dir, ipam_dir, str(subnet))

    with ContainerdNode(cni_bin_dir=bin_dir, cni_conf_dir=conf_dir, image=busybox_image,
                        record_cni_calls=True, log_dir=tmp_path / "logs") as node:
        containers, _ = _two_containers_reach_each_other(node, subnet, "10.88.9.1")
        ids = [c.cni_container_id for c in containers]
        assert len(reservations(ipam_dir, ids)) == 2
        bridge = {l.name: l for l in node.links()}["na-ref0"]
        assert bridge.kind == "bridge"
        assert len([l for l in node.links() if l.kind == "veth" and l.master == "na-ref0"]) == 2

        for container in containers:
            assert node.stop(container) == 137  # ctr reports the task's SIGKILL

        _assert_runtime_added_and_deleted(node, containers)
        assert [l for l in node.links() if l.kind == "veth"] == []
        assert reservations(ipam_dir, ids) == []
        assert list((node.cni_cache_dir / "results").iterdir()) == []
        print("timings (s):", {k: round(v, 3) for k, v in node.timings.items()})


def test_ctr_detached_run_never_calls_cni_del(tmp_path, busybox_image):
    bin_dir, conf_dir, ipam_dir = tmp_path / "bin", tmp_path / "conf", tmp_path / "ipam"
    _copy_reference_plugins(bin_dir, ["bridge", "host-local"])
    _reference_conflist(conf_dir, ipam_dir, "10.88.9.0/24")

    with ContainerdNode(cni_bin_dir=bin_dir, cni_conf_dir=conf_dir, image=busybox_image,
                        record_cni_calls=True, log_dir=tmp_path / "logs") as node:
        node.ctr(["run", "-d", "--cni", "--fifo-dir", str(node.tmp_dir / "fifo"),
                  busybox_image.ref, "d1", "sleep", "300"], cni_view=True)
        node.ctr(["tasks", "kill", "--signal", "SIGKILL", "d1"], cni_view=True)
        node.ctr(["tasks", "delete", "--force", "d1"], cni_view=True)
        node.ctr(["containers", "delete", "d1"], cni_view=True)

        assert [c.command for c in node.cni_calls()] == ["ADD", "ADD"]  # bridge, then host-local
        cid = f"{node.namespace}-d1"
        assert len(reservations(ipam_dir, [cid])) == 1, "the reservation leaks"
        assert [p.name for p in (node.cni_cache_dir / "results").iterdir()] == [f"na-ref-{cid}-eth0"]
        # The kernel deleted the veth with the container's network namespace.
        assert [l for l in node.links() if l.kind == "veth"] == []


@pytest.mark.skipif(not NETAGENT.exists(), reason=NETAGENT_MISSING)
def test_netagent_plugin_containers_reach_each_other(tmp_path, busybox_image):
    subnet = ipaddress.ip_network("10.88.7.0/24")
    bin_dir, conf_dir, data_dir = tmp_path / "bin", tmp_path / "conf", tmp_path / "ipam"
    data_dir.mkdir()
    socket_path = tmp_path / "run" / "cni.sock"
    bridge = bridge_name(install_netagent(bin_dir=bin_dir, conf_dir=conf_dir, subnet=str(subnet),
                                          data_dir=data_dir, socket_path=socket_path))

    with ContainerdNode(cni_bin_dir=bin_dir, cni_conf_dir=conf_dir, image=busybox_image,
                        record_cni_calls=True, log_dir=tmp_path / "logs") as node, \
            agent_in(node, socket_path, tmp_path / "agent.log"):
        containers, _ = _two_containers_reach_each_other(node, subnet, "10.88.7.1")
        ids = [c.cni_container_id for c in containers]
        assert len(reservations(data_dir, ids)) >= 2, sorted(data_dir.rglob("*"))

        for container in containers:
            node.stop(container)

        _assert_runtime_added_and_deleted(node, containers)
        settle(socket_path.parent / "pending-del")
        leftover = [l for l in node.links()
                    if l.kind == "veth" or (l.name.startswith("na") and l.name != bridge)]
        assert leftover == [], leftover
        assert reservations(data_dir, ids) == [], sorted(data_dir.rglob("*"))
        print("timings (s):", {k: round(v, 3) for k, v in node.timings.items()})

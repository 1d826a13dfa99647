"""How `netagent run` builds the node agent: its flags become the agent's enums (the CLI's
words unchanged), and the lease the agent reports becomes the CNI network config."""
from __future__ import annotations

import json
from ipaddress import IPv4Network

import pytest

from netagent.cli import build_parser
from netagent.cniserver.install import CONFLIST_NAME
from netagent.daemon.config import parse_run_config
from netagent.daemon.run import _cni_config_writer
from netagent.noderoutes.host import ChecksumOffloadPolicy, Lease, Masquerade

CLUSTER = ["--node-name", "node-1", "--cluster-cidr", "10.244.0.0/16"]


def run_config(*argv: str):
    return parse_run_config(build_parser().parse_args(["run", *CLUSTER, *argv]))


@pytest.mark.parametrize("argv, masquerade, offload", [
    ((), Masquerade.ON, ChecksumOffloadPolicy.AUTO),
    (("--masquerade", "off", "--vxlan-checksum-offload", "on"), Masquerade.OFF, ChecksumOffloadPolicy.ON),
    (("--vxlan-checksum-offload", "off"), Masquerade.ON, ChecksumOffloadPolicy.OFF),
])
def test_the_flags_become_the_agents_modes(argv, masquerade, offload):
    cluster = run_config(*argv).cluster
    assert cluster is not None
    settings = cluster.routing
    assert (settings.masquerade, settings.checksum_offload) == (masquerade, offload)


def test_the_lease_becomes_the_network_config(tmp_path):
    cni = run_config("--cni-conf-dir", str(tmp_path), "--cni-mode", "routed", "--cni-socket", "/run/na/cni.sock",
                     "--cni-data-dir", "/var/lib/na").cni
    _cni_config_writer(cni)(Lease(node_name="node-1", pod_cidrs=(IPv4Network("10.244.1.0/24"),), mtu=1450))
    (plugin,) = json.loads((tmp_path / CONFLIST_NAME).read_text())["plugins"]
    assert (plugin["mode"], plugin["mtu"], plugin["agentSocket"]) == ("routed", 1450, "/run/na/cni.sock")
    assert plugin["ipam"]["ranges"] == [[{"subnet": "10.244.1.0/24"}]] and plugin["ipam"]["dataDir"] == "/var/lib/na"


def test_an_empty_conf_dir_publishes_nothing(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _cni_config_writer(run_config("--cni-conf-dir", "").cni)(
        Lease(node_name="node-1", pod_cidrs=(IPv4Network("10.244.1.0/24"),), mtu=1450))
    assert list(tmp_path.iterdir()) == []

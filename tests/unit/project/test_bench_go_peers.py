"""bench/go_peers.py: each Go peer's version comes from its bench/peers/<name>/go.mod alone, and
cni_latency's records carry it; building them needs Go and the module proxy, so it is left to
the benches (a first run printed `CNI bridge plugin v1.10.0` from the binary it built)."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[3] / "bench"


@pytest.fixture(scope="module")
def bench_modules():
    sys.path.insert(0, str(BENCH))
    try:
        import cni_latency
        import go_peers
        yield go_peers, cni_latency
    finally:
        sys.path.remove(str(BENCH))


def test_each_peer_is_pinned_in_its_go_mod_alone(bench_modules):
    go_peers, _ = bench_modules
    for peer in (go_peers.CNI_PLUGINS, go_peers.FLANNEL):
        text = (Path(peer.module_dir) / "go.mod").read_text()
        version = go_peers.pinned_version(peer)
        assert version.startswith("v") and f"{peer.module} {version}" in text
        assert go_peers.build_dir(peer, version).endswith(f"build/peers/{peer.name}-{version}")
        for package in peer.binaries.values():      # every binary built is a tool of its go.mod
            assert f"{package}\n" in text
    plugins = go_peers.CNI_PLUGINS
    assert go_peers.pinned_version(plugins, "require (\n\tgithub.com/containernetworking/plugins v1.9.1 // x\n)") == "v1.9.1"
    assert go_peers.pinned_version(plugins, "require github.com/containernetworking/plugins v1.2.0\n") == "v1.2.0"
    with pytest.raises(go_peers.BuildError, match="requires no"):
        go_peers.pinned_version(plugins, "require github.com/containernetworking/cni v1.3.1\n")


def test_a_record_has_the_version_and_ratios_against_debians_pair(bench_modules):
    _, cni_latency = bench_modules
    reference = {"add": [0.02, 0.02, 0.02], "del": [0.01] * 3, "burst_add": 1.0, "burst_ok": 3, "burst_unique": 3,
                 "burst_del": 0.5}
    faster = {**reference, "add": [0.01, 0.01, 0.01]}
    found = cni_latency.record("upstream bridge+host-local v1.10.0", faster, version="upstream v1.10.0",
                               family="ipv4", pods=3, reference=reference)
    assert found["mode"].startswith("upstream") and found["version"] == "upstream v1.10.0"
    assert (found["add_median_ms"], found["add_ratio"], found["del_ratio"]) == (10.0, 0.5, 1.0)


def test_flannel_reads_its_nodes_and_subnet_file(bench_modules, tmp_path):
    sys.path.insert(0, str(BENCH))
    try:
        import flannel_peer
    finally:
        sys.path.remove(str(BENCH))
    node = flannel_peer.node_object(2)
    assert node["spec"]["podCIDR"] == "10.244.2.0/24" and node["metadata"]["annotations"]   # flanneld writes into it
    assert {"type": "InternalIP", "address": "198.18.0.2"} in node["status"]["addresses"]
    subnet = tmp_path / "subnet.env"
    subnet.write_text("FLANNEL_NETWORK=10.244.0.0/16\nFLANNEL_SUBNET=10.244.2.1/24\nFLANNEL_MTU=1450\n")
    assert flannel_peer.subnet_mtu(str(subnet)) == 1450
    subnet.write_text("FLANNEL_NETWORK=10.244.0.0/16\n")
    with pytest.raises(RuntimeError, match="no FLANNEL_MTU"):
        flannel_peer.subnet_mtu(str(subnet))

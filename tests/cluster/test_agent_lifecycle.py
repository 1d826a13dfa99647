"""The agent's start-up refusals and its cleanup, run as the real `netagent` command.

An agent must not guess: an unknown node name, a Node without a pod CIDR, or a pod CIDR
outside `--cluster-cidr` stop it with a message that says what to fix. `netagent cleanup`
on a node removes our routes, devices and chains and leaves everything else.
"""
import json
import sys

import pytest

from tests.cluster.lab_tools import lab_cluster, wait_for


@pytest.fixture(scope="module")
def lab():
    with lab_cluster(nodes=2, mode="vxlan", pods_per_node=1) as lab:
        yield lab


def run_agent(lab, node_name, *extra):
    argv = lab.agent_argv("node-1")
    argv[argv.index("--node-name") + 1] = node_name
    argv[argv.index("--cni-socket") + 1] = "/nonexistent/for-this-test.sock"
    argv[argv.index("--cni-conf-dir") + 1] = ""
    argv[argv.index("--status-bind") + 1] = "127.0.0.1:0"
    return lab.exec("node-1", [*argv, "--lease-timeout", "1", *extra], timeout=60)


@pytest.mark.parametrize("node, spec, message", [
    ("ghost", None, "node ghost does not exist"),
    ("no-cidr", {}, "has no spec.podCIDR"),
    ("wrong-cidr", {"podCIDR": "10.99.0.0/24", "podCIDRs": ["10.99.0.0/24"]}, "outside the cluster CIDR"),
])
def test_agent_refuses_a_bad_lease(lab, node, spec, message):
    if spec is not None:
        lab.api().create({"apiVersion": "v1", "kind": "Node", "metadata": {"name": node}, "spec": spec})
    try:
        proc = run_agent(lab, node)
    finally:
        if spec is not None:
            lab.api().delete("v1", "Node", node)
    assert proc.returncode == 1
    assert message in proc.stderr, proc.stderr


def test_agent_needs_a_cluster_cidr_and_a_node_name(lab):
    proc = lab.exec("node-1", [sys.executable, "-m", "netagent.cli", "run", "--node-name", "node-1"])
    assert proc.returncode == 1 and "--cluster-cidr is required" in proc.stderr
    proc = lab.exec("node-1", [sys.executable, "-m", "netagent.cli", "run", "--cluster-cidr", "10.244.0.0/16"],
                    env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"})
    assert proc.returncode == 1 and "no node name" in proc.stderr


def test_metrics_and_health_are_served(lab):
    fetch = ("import urllib.request,sys;"
             "print(urllib.request.urlopen('http://127.0.0.1:' + sys.argv[1], timeout=30).read().decode())")
    health = lab.exec("node-1", [sys.executable, "-c", fetch, "10258/healthz"], check=True, timeout=60).stdout
    assert json.loads(health) == {"healthy": True, "reason": "ok", "details": {}}   # every pod reaches 10258
    health = lab.exec("node-1", [sys.executable, "-c", fetch, "10249/healthz"], check=True, timeout=60).stdout
    assert json.loads(health)["healthy"] is True   # the details: on the loopback metrics address only
    assert json.loads(health)["details"]["cni-deferred-delete"]["healthy"] is True   # the DEL journal's runner

    def peered() -> str:   # node-1's agent may have started (and synced first) before node-2 had its lease
        text = lab.exec("node-1", [sys.executable, "-c", fetch, "10249/metrics"], check=True, timeout=60).stdout
        return text if 'netagent_node_peers{mode="vxlan"} 1' in text else ""
    metrics = wait_for(peered, what="node-1's agent to count node-2 as its peer")
    assert "netagent_node_sync_duration_seconds_count" in metrics
    assert 'netagent_kube_watch_events{resource="nodes",type="ADDED"}' in metrics


def test_vxlan_checksum_offload_stays_on_with_a_fixed_kernel(lab):
    features = lab.exec("node-1", ["ethtool", "-k", "na-vxlan"], check=True).stdout
    assert "tx-checksum-ip-generic: on" in features  # this kernel (>= 5.7) has the netfilter fix


def test_cleanup_removes_routes_devices_and_chains_only(lab):
    lab.stop_agent("node-2")
    lab.exec("node-2", ["ip", "route", "add", "192.0.2.0/24", "via", "198.18.16.1"], check=True)  # not ours
    for tool in ("ip6tables-nft", "ip6tables-legacy"):    # what an IPv6 run leaves (masquerade, policy)
        lab.exec("node-2", [tool, "-t", "nat", "-N", "NETAGENT-POSTRTG-LEFT"], check=True)
        lab.exec("node-2", [tool, "-t", "nat", "-A", "POSTROUTING", "-j", "NETAGENT-POSTRTG-LEFT"], check=True)
        lab.exec("node-2", [tool, "-N", "OTHER6"], check=True)                                     # not ours
    out = lab.exec("node-2", [sys.executable, "-m", "netagent.cli", "cleanup"], check=True).stdout
    assert "removed device na-vxlan (vxlan)" in out and "NETAGENT-POSTRTG" in out, out
    routes = json.loads(lab.exec("node-2", ["ip", "-j", "route"], check=True).stdout)
    assert [r["dst"] for r in routes if r.get("protocol") == "78"] == []
    assert "192.0.2.0/24" in [r["dst"] for r in routes]
    links = json.loads(lab.exec("node-2", ["ip", "-j", "link"], check=True).stdout)
    assert not [link["ifname"] for link in links if link["ifname"].startswith("na")]
    for save in ("iptables-nft-save", "iptables-legacy-save", "ip6tables-nft-save", "ip6tables-legacy-save"):
        assert "NETAGENT" not in lab.exec("node-2", [save], check=True).stdout, save
    for save in ("ip6tables-nft-save", "ip6tables-legacy-save"):
        assert ":OTHER6" in lab.exec("node-2", [save], check=True).stdout, save
    assert "ip6tables (legacy) chain nat/NETAGENT-POSTRTG-LEFT" in out, out
    assert "service proxy state (iptables" in out, out
    sets = lab.exec("node-2", ["ipset", "list", "-n"], check=True).stdout.split()
    assert not [name for name in sets if name.startswith("NETAGENT-")], sets

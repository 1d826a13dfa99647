"""A lab in nftables mode (`--proxy-mode nftables --network-policy`): pods ping across nodes,
reach the internet masqueraded with their node's address, keep their own address towards
each other, a NetworkPolicy is enforced across nodes, and on no node does any iptables rule
or ipset of ours exist (`owned.CHAIN_PREFIX`, read with iptables-save of BOTH backends and
`ipset list -n` inside each node's namespace), while our nft tables do.

It relies on the nftables Services backend (`--proxy-mode nftables`: Services in `ip netagent`)
and on NetworkPolicy enforced in nft (`ip netagent-policy`), with the node's masquerade in
`ip netagent-masq`; the lab nodes' iptables FORWARD policy is ACCEPT, so not even the forward
accept needs an iptables rule.
"""
from __future__ import annotations

import shutil

import pytest

from netagent.kernel import owned
from tests.cluster.lab_tools import lab_cluster, serve, traffic, wait_for

POLICY = {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
          "metadata": {"name": "only-from-a", "namespace": "default"},
          "spec": {"podSelector": {"matchLabels": {"app": "b"}}, "policyTypes": ["Ingress"],
                   "ingress": [{"from": [{"podSelector": {"matchLabels": {"app": "a"}}}]}]}}


@pytest.fixture(scope="module")
def lab():
    with lab_cluster(nodes=2, mode="vxlan", proxy_mode="nftables", network_policy=True) as made:
        made.add_pod("a", node="node-1", labels={"app": "a"})
        made.add_pod("c", node="node-1", labels={"app": "c"})
        made.add_pod("b", node="node-2", labels={"app": "b"})
        yield made


def test_pods_ping_across_nodes_and_leave_masqueraded(lab):
    pods = lab.state.pods
    assert wait_for(lambda: lab.ping("a", pods["b"].ip), what="a ping from node-1's pod to node-2's")
    internet = lab.status()["internet"]["address"]
    with serve(lab, "internet", "udp", 7000), serve(lab, "internet", "tcp", 7001):
        udp = traffic(lab, "a", "ask-udp", internet, "7000")
        tcp = traffic(lab, "a", "ask-tcp", internet, "7001")
    node_address = lab.state.nodes["node-1"].address
    assert udp.stdout.split()[0] == node_address, udp.stderr
    assert tcp.stdout.split()[0] == node_address, tcp.stderr
    with serve(lab, "b", "udp", 7002):
        direct = traffic(lab, "a", "ask-udp", pods["b"].ip, "7002")
    assert direct.stdout.split()[0] == pods["a"].ip, direct.stderr


def test_network_policy_is_enforced_across_nodes(lab):
    pods = lab.state.pods
    assert wait_for(lambda: lab.ping("c", pods["b"].ip), what="c reaching b before the policy")
    lab.api().apply(POLICY)
    try:
        wait_for(lambda: not lab.ping("c", pods["b"].ip), what="the policy to isolate b from c")
        assert lab.ping("a", pods["b"].ip, count=2)
    finally:
        lab.api().delete("networking.k8s.io/v1", "NetworkPolicy", "only-from-a", namespace="default")
    assert wait_for(lambda: lab.ping("c", pods["b"].ip), what="c reaching b once the policy is gone")


def iptables_of_ours(lab, node: str) -> dict[str, list[str]]:
    """Every line naming one of ours in each iptables backend's save output and the ipsets."""
    found = {}
    for save in ("iptables-legacy-save", "iptables-nft-save"):
        if shutil.which(save) is None:
            continue
        done = lab.exec(node, [save], check=True)
        found[save] = [line for line in done.stdout.splitlines() if owned.CHAIN_PREFIX in line]
    sets = lab.exec(node, ["ipset", "list", "-n"], check=True).stdout.split()
    found["ipset"] = [name for name in sets if name.startswith(owned.CHAIN_PREFIX)]
    return found


def test_no_iptables_rule_or_ipset_of_ours_on_any_node(lab):
    lab.api().apply(POLICY)      # policy state exists while we look
    try:
        pods = lab.state.pods
        wait_for(lambda: not lab.ping("c", pods["b"].ip), what="the policy to be programmed")
        for node in lab.state.nodes:
            assert iptables_of_ours(lab, node) == {key: [] for key in iptables_of_ours(lab, node)}, node
            assert len(iptables_of_ours(lab, node)) >= 2, "no iptables backend was read"
            tables = lab.exec(node, ["nft", "list", "tables"], check=True).stdout.split("\n")
            for name in (owned.NFT_PROXY_TABLE, owned.NFT_MASQUERADE_TABLE, owned.NFT_POLICY_TABLE):
                assert f"table ip {name}" in tables, (node, tables)
    finally:
        lab.api().delete("networking.k8s.io/v1", "NetworkPolicy", "only-from-a", namespace="default")

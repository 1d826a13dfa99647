"""The other routing and proxy modes on a real cluster: host-gw routing with the nftables proxy
(the session's cluster is vxlan with iptables), two nodes, set with the operator's edits of the
manifest: pods across nodes through a ClusterIP Service and a NetworkPolicy, and no iptables
rule of netagent's on the nodes."""
from __future__ import annotations

from collections.abc import Iterator

import pytest

from lab.kubernetes.cluster import KubernetesLab
from netagent.kernel import namespaces
from tests.kubernetes.conftest import apply, leftovers, make_lab, running, wait_for
from tests.kubernetes.test_workloads import client_pod, curl, web_deployment, web_service


@pytest.fixture(scope="module")
def host_gw_nftables() -> Iterator[KubernetesLab]:
    lab = make_lab(nodes=2, mode="host-gw", proxy_mode="nftables")
    try:
        yield lab
    finally:
        lab.down()
    assert not leftovers(lab.state.prefix)


def test_host_gw_routes_and_nftables_services_and_policy(host_gw_nftables: KubernetesLab):
    lab = host_gw_nftables
    namespace = "modes"
    lab.kubectl("create", "namespace", namespace)
    apply(lab, namespace, [web_deployment(replicas=2), web_service(), client_pod("client", "node-1")])
    web = running(lab, namespace, "app=web", 2)
    running(lab, namespace, "app=client", 1)
    remote = next(p for p in web if p["spec"]["nodeName"] == "node-2")
    # host-gw: node-1 routes node-2's podCIDR via node-2's address, no tunnel device
    routes = namespaces.run_in(lab.state.nodes["node-1"].netns, ["ip", "route", "show", "proto", "78"]).stdout
    node2 = lab.kubectl_json("get", "node", "node-2")
    assert f"{node2['spec']['podCIDR']} via {lab.state.nodes['node-2'].address} dev eth0" in routes, routes
    names = {p["metadata"]["name"] for p in web}
    seen: set[str] = set()

    def both_answered() -> bool:
        answer = curl(lab, namespace, "client", "http://web/hostname")
        if answer:
            seen.add(answer)
        return seen == names
    wait_for(both_answered, what=f"the Service answered by both endpoints (so far {sorted(seen)})", interval=0.2)
    for node in lab.state.nodes.values():
        tables = namespaces.run_in(node.netns, ["nft", "list", "tables"]).stdout
        assert "ip netagent" in tables, tables
        saved = namespaces.run_in(node.netns, ["iptables-save"]).stdout
        assert "NETAGENT-" not in saved, saved
    apply(lab, namespace, [{
        "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy", "metadata": {"name": "deny-web"},
        "spec": {"podSelector": {"matchLabels": {"app": "web"}}, "policyTypes": ["Ingress"]}}])
    url = f"http://{remote['status']['podIP']}:8080/hostname"
    wait_for(lambda: curl(lab, namespace, "client", url) is None, what="the remote pod shut by the policy")

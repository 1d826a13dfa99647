"""The other routing and proxy modes on a real cluster (the session's cluster is vxlan with
iptables), two nodes each:
- host-gw routing with the nftables proxy, set with the operator's edits of the manifest: pods
  across nodes through a ClusterIP Service and a NetworkPolicy, and no iptables rule of
  netagent's on the nodes;
- bgp routing (the nodes' BIRDs in a full mesh) with the eBPF proxy installed from the overlay
  `deploy/ebpf/`: pod CIDRs routed via the peers, a ClusterIP Service balanced by the socket hook
  with no Service rule in iptables, a NodePort from outside through the tc hook, and the programs
  and pinned maps in each node's own cgroup subtree and bpffs, none on the host's."""
from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator

import pytest

from ebpf.loader import attached_programs
from lab.kubernetes.cluster import KubernetesLab
from netagent.kernel import namespaces
from netagent.kernel.owned import BPF_NAME_PREFIX, BPF_PIN_SUBDIR
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


@pytest.fixture(scope="module")
def bgp_ebpf() -> Iterator[KubernetesLab]:
    lab = make_lab(nodes=2, mode="bgp", proxy_mode="ebpf")
    try:
        yield lab
    finally:
        lab.down()
    assert not leftovers(lab.state.prefix)


def web_behind_a_service(lab: KubernetesLab, namespace: str, kind: str = "ClusterIP") -> list[dict]:
    """Two web pods behind Service `web` and a client on node-1, until the client has been
    answered through the Service by both; the web pods."""
    lab.kubectl("create", "namespace", namespace)
    apply(lab, namespace, [web_deployment(replicas=2), web_service(kind), client_pod("client", "node-1")])
    web = running(lab, namespace, "app=web", 2)
    running(lab, namespace, "app=client", 1)
    names = {p["metadata"]["name"] for p in web}
    seen: set[str] = set()

    def both_answered() -> bool:
        answer = curl(lab, namespace, "client", "http://web/hostname")
        if answer:
            seen.add(answer)
        return seen == names
    wait_for(both_answered, what=f"the Service answered by both endpoints (so far {sorted(seen)})", interval=0.2)
    return web


def test_host_gw_routes_and_nftables_services_and_policy(host_gw_nftables: KubernetesLab):
    lab = host_gw_nftables
    namespace = "modes"
    web = web_behind_a_service(lab, namespace)
    remote = next(p for p in web if p["spec"]["nodeName"] == "node-2")
    # host-gw: node-1 routes node-2's podCIDR via node-2's address, no tunnel device
    routes = namespaces.run_in(lab.state.nodes["node-1"].netns, ["ip", "route", "show", "proto", "78"]).stdout
    node2 = lab.kubectl_json("get", "node", "node-2")
    assert f"{node2['spec']['podCIDR']} via {lab.state.nodes['node-2'].address} dev eth0" in routes, routes
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


def ours(cgroup: str) -> list[str]:
    return sorted(p.name for p in attached_programs(cgroup) if p.name.startswith(BPF_NAME_PREFIX))


def test_bgp_routes_and_the_ebpf_proxy_from_the_overlay(bgp_ebpf: KubernetesLab):
    lab = bgp_ebpf
    namespace = "ebpf"
    for here, there in (("node-1", "node-2"), ("node-2", "node-1")):
        cidr = lab.kubectl_json("get", "node", there)["spec"]["podCIDR"]
        address = lab.state.nodes[there].address

        def routed(here=here, cidr=cidr, address=address) -> bool:
            route = namespaces.run_in(lab.state.nodes[here].netns, ["ip", "route", "show", cidr]).stdout
            return f"via {address} dev eth0" in route
        wait_for(routed, what=f"{here} routing {cidr} via {there} (learnt over BGP)")
    names = {p["metadata"]["name"] for p in web_behind_a_service(lab, namespace, "NodePort")}
    port = lab.kubectl_json("-n", namespace, "get", "service", "web")["spec"]["ports"][0]["nodePort"]
    for node in lab.state.nodes.values():
        def answers(node=node) -> str | None:
            proc = namespaces.run_in(lab.state.router, ["curl", "-sS", "--max-time", "5",
                                                        f"http://{node.address}:{port}/hostname"])
            return proc.stdout.strip() or None if proc.returncode == 0 else None
        assert wait_for(answers, what=f"NodePort {port} on {node.name} from the router") in names
        # no Service rule in iptables: the socket and tc hooks did it
        saved = namespaces.run_in(node.netns, ["iptables-save", "-t", "nat"]).stdout
        assert "NETAGENT-SERVICES" not in saved and "NETAGENT-NODEPORTS" not in saved, saved
    # each node's programs on its own cgroup subtree, none on the host's v2 root
    unified = lab.node("node-1").unified_cgroup
    for name in lab.state.nodes:
        attached = ours(lab.node(name).unified_cgroup)
        assert f"{BPF_NAME_PREFIX}connect4" in attached, attached
    assert ours(os.path.dirname(os.path.dirname(unified))) == []
    # the maps pinned in each node's bpffs (seen through its agent's mount namespace), not the host's
    assert not os.path.exists(os.path.join("/sys/fs/bpf", BPF_PIN_SUBDIR))
    for name in lab.state.nodes:
        pins = subprocess.run([*lab.exec_prefix(name), "ls", f"/sys/fs/bpf/{BPF_PIN_SUBDIR}"],
                              capture_output=True, text=True)
        assert pins.returncode == 0 and pins.stdout.split(), pins.stderr

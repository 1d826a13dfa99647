"""Dual-stack and IPv6-only labs (`lab up --ip-family dual|ipv6`): real agents, pods with an
address per family, Services with a cluster IP per family, an IPv6 NetworkPolicy.

The dual lab (two nodes, VXLAN, the agents enforcing NetworkPolicy) is built once per proxy
mode (iptables, nftables, ebpf: there pods' commands run in their node's cgroup, so the
socket load balancer serves them): pods a and c on node-1, b on node-2, each serving TCP 8080 on
both families. It checks pod-to-pod across nodes over IPv4 and IPv6, pods reaching the
internet namespace masqueraded with their node's address of each family, a `RequireDualStack`
Service answering on both its cluster IPs from the other node (and `lab status --json`
showing the pair), and an IPv6 `ipBlock` with `except` letting a in and keeping c out. The
IPv6-only lab (two nodes, iptables) checks pod-to-pod and one Service, whose only family is
IPv6. Every condition is waited for with a generous deadline: the agents program
asynchronously, so a change is judged by when the kernel delivers, not by one try.
"""
from __future__ import annotations

import ipaddress
import json
import subprocess
import sys

import pytest

from lab.cluster import SERVICE_CIDR, SERVICE_CIDR6, LabCluster
from netagent.kernel.families import IpFamily
from tests.cluster.lab_tools import ROOT, lab_cluster, serve_both_families, traffic, wait_for

PORT = 8080


def address_of(lab: LabCluster, pod: str, family: IpFamily) -> str:
    found = [ip for ip in lab.state.pods[pod].ips if IpFamily.of(ip) is family]
    assert found, f"pod {pod} has no {family.label} address: {lab.state.pods[pod].ips}"
    return found[0]


def ask(lab: LabCluster, source: str, address: str, port: int = PORT) -> str | None:
    """One TCP exchange from `source`: the answer ("<server pod> <peer address>") or None."""
    done = traffic(lab, source, "ask-tcp", address, str(port))
    return done.stdout.strip() if done.returncode == 0 and done.stdout.strip() else None


def service(name: str, selector: dict, **spec) -> dict:
    return {"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "namespace": "default"},
            "spec": {"selector": selector, "ports": [{"name": "http", "port": 80, "targetPort": PORT}], **spec}}


def lab_status(lab: LabCluster) -> dict:
    done = subprocess.run([sys.executable, "-m", "netagent.cli", "lab", "--state-dir", lab.workdir, "status",
                           "--json"], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(done.stdout)


@pytest.fixture(scope="module", params=["iptables", "nftables", "ebpf"])
def dual(request):
    if request.param == "ebpf":
        from tests.netns.ebpf_fixtures import require_bcc
        require_bcc()
    with lab_cluster(nodes=2, ip_family="dual", proxy_mode=request.param, network_policy=True) as made:
        made.add_pod("a", node="node-1", labels={"app": "a"})
        made.add_pod("c", node="node-1", labels={"app": "c"})
        made.add_pod("b", node="node-2", labels={"app": "b"})
        servers = [serve_both_families(made, pod, PORT) for pod in ("a", "b", "c")]
        try:
            yield made
        finally:
            for server in servers:
                server.stop()


@pytest.mark.parametrize("family", list(IpFamily), ids=lambda f: f.label)
def test_pods_reach_each_other_across_nodes(dual, family):
    target = address_of(dual, "b", family)
    assert wait_for(lambda: dual.ping("a", target), what=f"a pinging b over {family.label}")
    answer = wait_for(lambda: ask(dual, "a", target), what=f"a connecting to b over {family.label}")
    assert answer == f"b {address_of(dual, 'a', family)}"   # unmasqueraded between pods
    back = wait_for(lambda: ask(dual, "b", address_of(dual, "a", family)), what=f"b to a over {family.label}")
    assert back == f"a {address_of(dual, 'b', family)}"


@pytest.mark.parametrize("family", list(IpFamily), ids=lambda f: f.label)
def test_pods_reach_the_internet_masqueraded_per_family(dual, family):
    internet = dual.status()["internet"]
    address = internet["address"] if family is IpFamily.V4 else internet["address6"]
    node = dual.state.nodes["node-1"]
    with serve_both_families(dual, "internet", PORT + 1):
        answer = wait_for(lambda: ask(dual, "a", address, PORT + 1),
                          what=f"a reaching the internet over {family.label}")
    assert answer == f"internet {node.address if family is IpFamily.V4 else node.address6}"


def test_a_require_dual_stack_service_answers_on_both_cluster_ips(dual):
    created = dual.api().apply(service("web", {"app": "b"}, ipFamilyPolicy="RequireDualStack"))
    try:
        cluster_ips = created["spec"]["clusterIPs"]
        assert created["spec"]["ipFamilies"] == ["IPv4", "IPv6"]
        assert ipaddress.ip_address(cluster_ips[0]) in SERVICE_CIDR
        assert ipaddress.ip_address(cluster_ips[1]) in SERVICE_CIDR6
        for cluster_ip in cluster_ips:
            answer = wait_for(lambda: ask(dual, "a", cluster_ip, 80), what=f"the Service on {cluster_ip}")
            assert answer.split()[0] == "b", answer
        status = lab_status(dual)
        web = next(s for s in status["services"] if s["name"] == "web")
        assert web["clusterIPs"] == cluster_ips
        assert web["endpoints"] == [f"{address_of(dual, 'b', IpFamily.V4)}:{PORT}",
                                    f"[{address_of(dual, 'b', IpFamily.V6)}]:{PORT}"]
        assert {p["name"]: len(p["ips"]) for p in status["pods"]} == {"a": 2, "b": 2, "c": 2}
    finally:
        dual.api().delete("v1", "Service", "web", namespace="default")


def test_an_ipv6_ip_block_with_except(dual):
    c6 = address_of(dual, "c", IpFamily.V6)
    b6 = address_of(dual, "b", IpFamily.V6)
    policy = {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
              "metadata": {"name": "v6-block", "namespace": "default"},
              "spec": {"podSelector": {"matchLabels": {"app": "b"}}, "policyTypes": ["Ingress"],
                       "ingress": [{"from": [{"ipBlock": {"cidr": "fd00:10:244::/56", "except": [f"{c6}/128"]}}]}]}}
    assert wait_for(lambda: ask(dual, "c", b6), what="c reaching b before the policy")
    dual.api().apply(policy)
    try:
        wait_for(lambda: ask(dual, "c", b6) is None, what="the IPv6 ipBlock's except to keep c out")
        assert ask(dual, "a", b6) == f"b {address_of(dual, 'a', IpFamily.V6)}"   # inside the block: let in
        # the policy names no IPv4 peer: b is isolated over IPv4 for everyone
        wait_for(lambda: ask(dual, "a", address_of(dual, "b", IpFamily.V4)) is None,
                 what="b isolated over IPv4 (no IPv4 peer in the policy)")
    finally:
        dual.api().delete("networking.k8s.io/v1", "NetworkPolicy", "v6-block", namespace="default")
    assert wait_for(lambda: ask(dual, "c", b6), what="c reaching b once the policy is gone")


@pytest.fixture(scope="module")
def v6_only():
    with lab_cluster(nodes=2, ip_family="ipv6", proxy_mode="iptables") as made:
        made.add_pod("p1", node="node-1", labels={"app": "p1"})
        made.add_pod("p2", node="node-2", labels={"app": "p2"})
        servers = [serve_both_families(made, pod, PORT) for pod in ("p1", "p2")]
        try:
            yield made
        finally:
            for server in servers:
                server.stop()


def test_an_ipv6_only_lab_routes_pods_and_serves_a_service(v6_only):
    p1, p2 = v6_only.state.pods["p1"], v6_only.state.pods["p2"]
    assert [IpFamily.of(ip) for ip in p1.ips + p2.ips] == [IpFamily.V6, IpFamily.V6]
    node = v6_only.api().get("v1", "Node", "node-2")
    assert node["spec"]["podCIDRs"] == [node["spec"]["podCIDR"]] and IpFamily.of(node["spec"]["podCIDR"]) is IpFamily.V6
    assert wait_for(lambda: v6_only.ping("p1", p2.ip), what="p1 pinging p2 over IPv6")
    created = v6_only.api().apply(service("web", {"app": "p2"}))
    assert created["spec"]["ipFamilies"] == ["IPv6"] and created["spec"]["ipFamilyPolicy"] == "SingleStack"
    answer = wait_for(lambda: ask(v6_only, "p1", created["spec"]["clusterIP"], 80), what="the IPv6 Service")
    assert answer == f"p2 {p1.ip}"

"""connectivity_plan: which nodes are used (validated API input), the checks laid out over them,
and the objects the test creates."""
from __future__ import annotations

import pytest

from lab.kubernetes import images
from netagent.daemon import connectivity_plan as cp
from netagent.daemon.connectivity_plan import ConnectivityPlanError, Expect, Stage
from tests.unit.daemon.connectivity_fake import node

TWO = [node("node-2", "198.18.16.12"), node("node-1", "198.18.16.11", kubelet_port=10999)]


def test_the_default_image_is_the_agnhost_the_lab_builds():
    assert cp.DEFAULT_IMAGE == images.AGNHOST_IMAGE


def test_usable_nodes_are_ready_schedulable_and_validated_sorted_by_name():
    items = [
        *TWO,
        node("down", "198.18.16.13", ready=False),
        node("master", "198.18.16.14", taints=[{"key": "node-role.kubernetes.io/control-plane", "effect": "NoSchedule"}]),
        node("soft", "198.18.16.15", taints=[{"key": "x", "effect": "PreferNoSchedule"}]),
        node("Bad_Name;rm", "198.18.16.16"),
        node("../etc", "198.18.16.17"),
        node("noaddr"),
        node("garbage", "999.1.1.1"),
        node("loop", "127.0.0.1"),
        {"metadata": {"name": "cordoned"}, "spec": {"unschedulable": True},
         "status": node("cordoned", "198.18.16.18")["status"]},
        {**node("win", "198.18.16.19"), "metadata": {"name": "win", "labels": {"kubernetes.io/os": "windows"}}},
    ]
    nodes, ignored = cp.usable_nodes(items)
    assert [n.name for n in nodes] == ["node-1", "node-2", "soft"]
    assert nodes[0] == cp.Node("node-1", "198.18.16.11", 10999)
    assert nodes[1].kubelet_port == 10250
    assert sorted(ignored) == sorted([
        "down: not Ready", "master: tainted node-role.kubernetes.io/control-plane:NoSchedule",
        "'Bad_Name;rm': not a valid node name", "'../etc': not a valid node name",
        "noaddr: no valid InternalIP", "garbage: no valid InternalIP", "loop: no valid InternalIP",
        "cordoned: cordoned", "win: not a Linux node (windows)"])


def test_a_missing_kubelet_port_falls_back_to_10250_and_a_bad_one_too():
    assert cp.usable_nodes([node("a", "10.0.0.1", kubelet_port=None)])[0][0].kubelet_port == 10250
    bad = node("a", "10.0.0.1")
    bad["status"]["daemonEndpoints"]["kubeletEndpoint"]["Port"] = "10250; rm -rf"
    assert cp.usable_nodes([bad])[0][0].kubelet_port == 10250


def test_two_nodes_every_check_runs_but_egress_without_external():
    nodes, _ = cp.usable_nodes(TWO)
    plan = cp.plan_checks(nodes, namespace="netagent-ct-x")
    by_name = {c.name: c for c in plan.checks}
    assert [c.name for c in plan.checks if c.skip] == ["egress/external"]
    assert by_name["egress/external"].skip == "no --external HOST:PORT given"
    assert by_name["pod-to-pod/cross-node"].target == "{pod_ip[server-b]}:8080"
    assert plan.servers["server-a"].name == "node-1" and plan.servers["server-b"].name == "node-2"
    assert plan.servers["guarded"].name == "node-2"
    assert by_name["pod-to-nodeport/cross-node"].target == "198.18.16.12:{node_port}"
    assert by_name["pod-to-host"].target == "198.18.16.11:10999"      # the node's own kubelet port
    assert "kubelet" in by_name["pod-to-host"].why
    assert by_name["dns"].target == "echo.netagent-ct-x.svc:80"
    assert all(c.node == "node-1" for c in plan.checks if not c.skip)
    assert by_name["policy/deny"].expect is Expect.BLOCKED and by_name["policy/deny"].stage is Stage.BASE
    assert by_name["policy/allow"].expect is Expect.CONNECT and by_name["policy/allow"].stage is Stage.ALLOWED
    # the same client label both times: only the allow policy changes the answer
    assert by_name["policy/deny"].labels == by_name["policy/allow"].labels == ((cp.LABEL_ACCESS, "allowed"),)


def test_one_node_skips_every_cross_node_check_with_the_reason():
    plan = cp.plan_checks(cp.usable_nodes([TWO[0]])[0], namespace="ns")
    skips = {c.name: c.skip for c in plan.checks if c.skip}
    assert skips == {"pod-to-pod/cross-node": "one usable node: nothing to cross",
                     "pod-to-nodeport/cross-node": "one usable node: nothing to cross",
                     "pod-to-host/cross-node": "one usable node: nothing to cross",
                     "egress/external": "no --external HOST:PORT given"}
    assert set(n.name for n in plan.servers.values()) == {"node-2"}


def test_no_dns_skips_the_dns_check_and_external_adds_egress():
    nodes, _ = cp.usable_nodes(TWO)
    plan = cp.plan_checks(nodes, namespace="ns", dns="no kube-dns", external="[2001:db8::1]:443")
    by_name = {c.name: c for c in plan.checks}
    assert by_name["dns"].skip == "no kube-dns"
    assert by_name["egress/external"].target == "[2001:db8::1]:443" and not by_name["egress/external"].skip


def test_no_usable_node_is_an_error_naming_the_ignored_ones():
    with pytest.raises(ConnectivityPlanError, match="down: not Ready"):
        nodes, ignored = cp.usable_nodes([node("down", "10.0.0.1", ready=False)])
        cp.plan_checks(nodes, ignored=ignored, namespace="ns")


@pytest.mark.parametrize("value,parsed", [("example.com:80", ("example.com", 80)), ("1.2.3.4:443", ("1.2.3.4", 443)),
                                          ("[2001:db8::1]:53", ("2001:db8::1", 53))])
def test_external_is_parsed(value, parsed):
    assert cp.parse_external(value) == parsed


@pytest.mark.parametrize("value", ["example.com", "example.com:0", "example.com:70000", ":80", "a b:80",
                                   "x;rm -rf /:80", "{pod_ip}:80", "host:http", "-x:80"])
def test_a_bad_external_is_refused(value):
    with pytest.raises(ConnectivityPlanError):
        cp.parse_external(value)


def test_objects_are_labelled_ours_pinned_and_clients_never_restart():
    nodes, _ = cp.usable_nodes(TWO)
    plan = cp.plan_checks(nodes, namespace="ns", image="my/agnhost:1")
    check = next(c for c in plan.checks if c.name == "policy/deny").resolved({"pod_ip": {"guarded": "10.1.2.3"}})
    client = cp.client_pod(cp.client_name(check, 2), check, image=plan.image)
    assert client["metadata"]["name"] == "policy-deny-2"
    assert client["metadata"]["labels"] == {cp.LABEL_OWNER: cp.OWNER, cp.LABEL_ROLE: "client",
                                            cp.LABEL_ACCESS: "allowed"}
    assert client["spec"]["nodeName"] == "node-1" and client["spec"]["restartPolicy"] == "Never"
    # the restricted Pod Security Standard's asks, servers and clients alike
    for pod in (client, cp.server_pod("s", nodes[0], image="i", role="echo")):
        context = pod["spec"]["containers"][0]["securityContext"]
        assert context["runAsNonRoot"] and not context["allowPrivilegeEscalation"]
        assert context["capabilities"] == {"drop": ["ALL"]} and context["seccompProfile"]["type"] == "RuntimeDefault"
    assert client["spec"]["containers"][0]["args"] == ["connect", "10.1.2.3:8080", "--timeout=5s", "--protocol=tcp"]
    server = cp.server_pod("server-b", nodes[1], image=plan.image, role="echo")
    assert server["spec"]["nodeName"] == "node-2"
    assert server["spec"]["containers"][0]["args"] == ["netexec", "--http-port=8080", "--udp-port=8081"]
    assert cp.namespace_object("ns")["metadata"]["labels"] == {cp.LABEL_OWNER: cp.OWNER}
    assert cp.deny_policy()["spec"] == {"podSelector": {"matchLabels": {cp.LABEL_ROLE: "guarded"}},
                                        "policyTypes": ["Ingress"]}
    assert cp.new_namespace().startswith("netagent-ct-") and cp.new_namespace() != cp.new_namespace()

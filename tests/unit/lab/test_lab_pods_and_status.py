"""Lab pods and nodes as API objects (and as kubectl's columns show them), the services summary
of `lab status`, and the lab's proxy-mode argv."""
from __future__ import annotations

import pytest

from lab import node_objects, pod_objects
from lab.apiserver import ApiServer, Subresource
from lab.apiserver.tables import render_table
from lab.cluster import LabCluster
from lab.service_status import describe_service, summarize_services
from lab.state import LabError, LabState, NodeState
from netagent.kube.endpoint_slices import SERVICE_NAME_LABEL
from netagent.kube.resources import NODES, PODS


def test_ports_from_the_command_line():
    assert pod_objects.parse_ports("http=8080, dns=53/udp") == {"http": [8080, "TCP"], "dns": [53, "UDP"]}
    assert pod_objects.parse_ports("") == {}
    for bad, message in (("http", "expected name=port"), ("http=x", "expected name=port"),
                         ("http=70000", "not a port number"), ("http=80/ICMP", "protocol 'ICMP'"),
                         ("Http=80", "port name 'Http'"), ("80=80", "port name '80'")):
        with pytest.raises(pod_objects.PodSpecError, match=message):
            pod_objects.parse_ports(bad)
    with pytest.raises(pod_objects.PodSpecError):
        pod_objects.check_pod_name("Web_1")


def test_a_pod_object_is_running_ready_with_named_ports():
    pod = pod_objects.render_pod("web-1", namespace="shop", node="node-1", host_ip="198.18.0.11",
                                 pod_ip="10.244.1.5", labels={"app": "web"}, ports={"http": [8080, "TCP"]})
    assert pod["metadata"] == {"name": "web-1", "namespace": "shop", "labels": {"app": "web"}}
    assert pod["spec"]["nodeName"] == "node-1"
    assert pod["spec"]["containers"][0]["ports"] == [{"name": "http", "containerPort": 8080, "protocol": "TCP"}]
    assert pod["status"]["podIP"] == "10.244.1.5" and pod["status"]["podIPs"] == [{"ip": "10.244.1.5"}]
    assert pod["status"]["phase"] == "Running"
    assert {c["type"]: c["status"] for c in pod["status"]["conditions"]}["Ready"] == "True"
    assert pod_objects.with_readiness(pod, ready=True) is None
    patch = pod_objects.with_readiness(pod, ready=False)
    flipped = {c["type"]: c["status"] for c in patch["status"]["conditions"]}
    assert flipped == {"PodScheduled": "True", "Initialized": "True", "ContainersReady": "False", "Ready": "False"}
    assert [c["ready"] for c in patch["status"]["containerStatuses"]] == [False]


def test_a_pod_object_reports_its_container_running_as_a_kubelet_would():
    pod = pod_objects.render_pod("web-1", namespace="shop", node="node-1", host_ip="198.18.0.11",
                                 pod_ip="10.244.1.5", labels={}, ports={}, container_id="lab-web-1")
    [status] = pod["status"]["containerStatuses"]
    since = pod["status"]["startTime"]
    assert status == {"name": pod["spec"]["containers"][0]["name"], "image": pod["spec"]["containers"][0]["image"],
                      "imageID": "", "containerID": "containerd://lab-web-1", "ready": True, "started": True,
                      "restartCount": 0, "state": {"running": {"startedAt": since}}}
    unready = pod_objects.render_pod("web-2", namespace="shop", node="node-1", host_ip="198.18.0.11",
                                     pod_ip="10.244.1.6", labels={}, ports={}, ready=False)
    [status] = unready["status"]["containerStatuses"]
    assert (status["ready"], status["started"], status["containerID"]) == (False, True, "containerd://shop-web-2")


def table_cells(server: ApiServer, resource, name: str, **where) -> dict:
    table = render_table(server.get(resource, name, **where))
    return {c["name"]: cell for c, cell in zip(table["columnDefinitions"], table["rows"][0]["cells"])}


def test_kubectl_columns_show_lab_pods_ready_and_lab_nodes_ready():
    """What `kubectl get pods,nodes` shows, from the objects as the lab API server stores them."""
    with ApiServer() as server:
        server.create(node_objects.render_node("node-1", segment=2, pod_cidr="10.244.1.0/24", address="198.18.16.11"))
        node = server.get(NODES, "node-1")
        [ready] = node["status"]["conditions"]
        assert (ready["type"], ready["status"], ready["reason"]) == ("Ready", "True", "KubeletReady")
        assert ready["lastHeartbeatTime"] == ready["lastTransitionTime"] and ready["lastHeartbeatTime"].endswith("Z")
        assert node["metadata"]["labels"]["topology.kubernetes.io/zone"] == "segment-2"
        assert node["spec"]["podCIDRs"] == ["10.244.1.0/24"]
        assert table_cells(server, NODES, "node-1")["Status"] == "Ready"

        server.create(pod_objects.render_pod("web-1", namespace="default", node="node-1", host_ip="198.18.16.11",
                                             pod_ip="10.244.1.5", labels={}, ports={}))
        cells = table_cells(server, PODS, "web-1", namespace="default")
        assert (cells["Ready"], cells["Status"], cells["Restarts"]) == ("1/1", "Running", "0")
        patch = pod_objects.with_readiness(server.get(PODS, "web-1", namespace="default"), ready=False)
        server.patch(PODS, "web-1", patch, namespace="default", part=Subresource.STATUS)
        assert table_cells(server, PODS, "web-1", namespace="default")["Ready"] == "0/1"
        patch = pod_objects.with_readiness(server.get(PODS, "web-1", namespace="default"), ready=True)
        server.patch(PODS, "web-1", patch, namespace="default", part=Subresource.STATUS)
        assert table_cells(server, PODS, "web-1", namespace="default")["Ready"] == "1/1"


def endpoint_slice(service: str, ports: list, *endpoints: tuple) -> dict:
    return {"metadata": {"name": f"{service}-x", "namespace": "default", "labels": {SERVICE_NAME_LABEL: service}},
            "ports": [{"name": "http", "port": p, "protocol": "TCP"} for p in ports],
            "endpoints": [{"addresses": [ip], "conditions": conditions} for ip, conditions in endpoints]}


def test_the_services_summary_sorts_endpoints_by_condition():
    services = [{"metadata": {"name": "web", "namespace": "default"},
                 "spec": {"type": "NodePort", "clusterIP": "10.96.0.10", "selector": {"app": "web"},
                          "ports": [{"name": "http", "port": 80, "targetPort": "http", "protocol": "TCP",
                                     "nodePort": 30080}]},
                 "status": {"loadBalancer": {}}},
                {"metadata": {"name": "idle", "namespace": "default"},
                 "spec": {"clusterIP": "10.96.0.11", "ports": [{"port": 53, "targetPort": 53, "protocol": "UDP"}]}}]
    slices = [endpoint_slice("web", [8080], ("10.244.2.9", {"ready": True}), ("10.244.1.10", {}),
                             ("10.244.1.9", {"ready": False, "serving": True, "terminating": True}),
                             ("10.244.1.8", {"ready": False, "serving": False, "terminating": False})),
              endpoint_slice("web", [9090], ("10.244.1.2", {"ready": True}))]
    web, idle = sorted(summarize_services(services, slices), key=lambda s: s["name"], reverse=True)
    assert web["ports"] == [{"name": "http", "protocol": "TCP", "port": 80, "targetPort": "http", "nodePort": 30080}]
    assert web["endpoints"] == ["10.244.1.2:9090", "10.244.1.10:8080", "10.244.2.9:8080"]
    assert web["terminating"] == ["10.244.1.9:8080"] and web["notReady"] == ["10.244.1.8:8080"]
    assert (web["type"], web["clusterIP"], web["externalIPs"]) == ("NodePort", "10.96.0.10", [])
    assert idle["endpoints"] == [] and idle["type"] == "ClusterIP"
    assert "80>http:30080/TCP" in describe_service(web) and "(none ready)" in describe_service(idle)


def lab_with(tmp_path, **state) -> LabCluster:
    base = LabState(prefix="na-tx", workdir=str(tmp_path), mode="vxlan", auto_encap="vxlan", segments=1,
                    resync_period=30.0, switch="sw", router="rtr", internet="inet", **state)
    base.nodes["node-1"] = NodeState(name="node-1", index=1, segment=1, netns="na-tx-n1", address="198.18.0.11",
                                     pod_cidr="10.244.1.0/24", port="n1")
    return LabCluster(base)


def test_agents_get_the_labs_proxy_mode(tmp_path):
    for mode in ("iptables", "ipvs", "none"):
        argv = lab_with(tmp_path, proxy_mode=mode).agent_argv("node-1")
        assert argv[argv.index("--proxy-mode") + 1] == mode
    argv = lab_with(tmp_path).agent_argv("node-1")
    assert argv[argv.index("--proxy-mode") + 1] == "iptables"
    with pytest.raises(LabError, match="proxy mode 'nft'"):
        LabCluster.create(proxy_mode="nft", workdir=str(tmp_path))


def test_an_older_state_file_loads_with_the_defaults(tmp_path):
    old = lab_with(tmp_path).state.to_json()
    del old["proxy_mode"]
    old["pods"] = {"p": {"name": "p", "node": "node-1", "netns": "n", "container_id": "c", "ip": "10.244.1.2",
                         "labels": {}, "ifname": "eth0"}}
    state = LabState.from_json(old)
    assert state.proxy_mode == "iptables"
    assert (state.pods["p"].namespace, state.pods["p"].ports) == ("default", {})

"""Services in the lab API server: Kubernetes' defaults, validation and allocations (service_spec.py).

Through the in-process server (the same store path HTTP uses), so a refusal is the 422 a
client sees; a few go over HTTP to check the Status reaches the client whole.
"""
from __future__ import annotations

import pytest

from lab.apiclient import LabApiClient, LabApiError
from lab.apiserver import ApiError, ApiServer
from lab.service_spec import NODE_PORT_RANGE
from netagent.kube.resources import SERVICES


@pytest.fixture
def server():
    with ApiServer(service_cidr="10.96.0.0/16") as api:
        yield api


def service(name: str = "web", **spec) -> dict:
    spec.setdefault("ports", [{"port": 80}])
    return {"apiVersion": "v1", "kind": "Service", "metadata": {"name": name}, "spec": spec}


def refused(server: ApiServer, obj: dict) -> str:
    with pytest.raises(ApiError) as error:
        server.create(obj)
    assert error.value.code == 422 and error.value.reason == "Invalid"
    return error.value.message


def update(server: ApiServer, name: str, **spec) -> dict:
    current = server.get(SERVICES, name, namespace="default")
    current["spec"] = {**current["spec"], **spec}
    return server.update(current)


def test_defaults(server):
    spec = server.create(service(ports=[{"port": 80}], sessionAffinity="ClientIP"))["spec"]
    assert spec["type"] == "ClusterIP" and spec["internalTrafficPolicy"] == "Cluster"
    assert spec["ports"] == [{"port": 80, "protocol": "TCP", "targetPort": 80}]
    assert spec["sessionAffinityConfig"] == {"clientIP": {"timeoutSeconds": 10800}}
    assert "externalTrafficPolicy" not in spec
    with_external_ip = server.create(service("ext", externalIPs=["192.0.2.10"]))["spec"]
    assert with_external_ip["externalTrafficPolicy"] == "Cluster"
    balancer = server.create(service("lb", type="LoadBalancer"))["spec"]
    assert balancer["allocateLoadBalancerNodePorts"] is True and balancer["externalTrafficPolicy"] == "Cluster"
    assert "healthCheckNodePort" not in balancer


@pytest.mark.parametrize(("spec", "message"), [
    ({"ports": []}, "spec.ports: Required value"),
    ({"ports": [{"port": 0}]}, "spec.ports[0].port: Invalid value: 0"),
    ({"ports": [{"port": 70000}]}, "spec.ports[0].port: Invalid value: 70000"),
    ({"ports": [{"port": 80, "protocol": "ICMP"}]}, "spec.ports[0].protocol: Unsupported value: 'ICMP'"),
    ({"ports": [{"port": 80}, {"port": 81}]}, "spec.ports[0].name: Required value"),
    ({"ports": [{"name": "a", "port": 80}, {"name": "a", "port": 81}]}, "spec.ports[1].name: Duplicate value"),
    ({"ports": [{"name": "a", "port": 80}, {"name": "b", "port": 80}]}, "spec.ports[1]: Duplicate value: 80/TCP"),
    ({"ports": [{"port": 80, "targetPort": "8080"}]}, "spec.ports[0].targetPort: Invalid value: '8080'"),
    ({"ports": [{"port": 80, "targetPort": "Http_Port"}]}, "spec.ports[0].targetPort: Invalid value"),
    ({"type": "Cluster"}, "spec.type: Unsupported value: 'Cluster'"),
    ({"type": "NodePort", "ports": [{"port": 80, "nodePort": 80}]},
     "spec.ports[0].nodePort: Invalid value: 80: provided port is not in the valid range. The range of valid ports "
     "is 30000-32767"),
    ({"ports": [{"port": 80, "nodePort": 30080}]}, "spec.ports[0].nodePort: Forbidden"),
    ({"type": "NodePort", "clusterIP": "None"}, "may not be set to 'None' for NodePort services"),
    ({"clusterIP": "10.0.0.1"}, "spec.clusterIP: Invalid value: '10.0.0.1': provided IP is not in the valid range"),
    ({"clusterIP": "banana"}, "spec.clusterIP: Invalid value: 'banana': must be a valid IP address"),
    ({"type": "NodePort", "externalTrafficPolicy": "Nearest"}, "spec.externalTrafficPolicy: Unsupported value"),
    ({"externalTrafficPolicy": "Local"}, "spec.externalTrafficPolicy: Invalid value: may only be set for externally"),
    ({"internalTrafficPolicy": "Somewhere"}, "spec.internalTrafficPolicy: Unsupported value"),
    ({"sessionAffinity": "Cookie"}, "spec.sessionAffinity: Unsupported value"),
    ({"sessionAffinity": "ClientIP", "sessionAffinityConfig": {"clientIP": {"timeoutSeconds": 0}}},
     "spec.sessionAffinityConfig.clientIP.timeoutSeconds: Invalid value: 0"),
    ({"sessionAffinity": "ClientIP", "sessionAffinityConfig": {"clientIP": {"timeoutSeconds": 86401}}},
     "timeoutSeconds: Invalid value: 86401"),
    ({"sessionAffinityConfig": {"clientIP": {"timeoutSeconds": 60}}},
     "spec.sessionAffinityConfig: Forbidden: must not be set when sessionAffinity is None"),
    ({"type": "NodePort", "healthCheckNodePort": 30100}, "spec.healthCheckNodePort: Forbidden"),
    ({"type": "NodePort", "loadBalancerSourceRanges": ["10.0.0.0/8"]}, "spec.loadBalancerSourceRanges: Forbidden"),
    ({"type": "LoadBalancer", "loadBalancerSourceRanges": ["10.0.0.0/33"]}, "loadBalancerSourceRanges[0]: Invalid"),
    ({"externalIPs": ["127.0.0.1"]}, "spec.externalIPs[0]: Invalid value: '127.0.0.1'"),
    ({"trafficDistribution": "Anywhere"}, "spec.trafficDistribution: Unsupported value"),
    ({"type": "ExternalName"}, "spec.externalName: Invalid value: None"),
])
def test_what_kubernetes_refuses_is_refused(server, spec, message):
    assert message in refused(server, service(**spec))
    assert server.list(SERVICES) == []


def test_every_problem_is_reported_at_once_over_http(server):
    server.start()
    with pytest.raises(LabApiError) as error:
        LabApiClient(url=server.url).create(service(ports=[{"port": 80, "protocol": "ICMP", "name": "Web"}]))
    assert error.value.code == 422
    assert error.value.message == (
        'Service "web" is invalid: [spec.ports[0].protocol: Unsupported value: \'ICMP\': supported values: "TCP", '
        '"UDP", "SCTP", spec.ports[0].name: Invalid value: \'Web\': must be a lowercase DNS label]')


def test_node_ports_are_one_pool_whatever_the_protocol(server):
    dns = server.create(service("dns", type="NodePort", ports=[
        {"name": "udp", "port": 53, "protocol": "UDP"}, {"name": "tcp", "port": 53, "protocol": "TCP"}]))
    numbers = {p["nodePort"] for p in dns["spec"]["ports"]}
    assert len(numbers) == 1 and numbers <= set(NODE_PORT_RANGE)  # one number for the port over both protocols
    taken = numbers.pop()
    message = refused(server, service("other", type="NodePort", ports=[{"port": 80, "protocol": "SCTP",
                                                                       "nodePort": taken}]))
    assert f"{taken}: provided port is already allocated" in message
    chosen = server.create(service("chosen", type="NodePort", ports=[{"port": 80, "nodePort": 31000}]))
    assert chosen["spec"]["ports"][0]["nodePort"] == 31000


def test_updates_keep_allocations_and_release_what_goes(server):
    created = server.create(service(type="NodePort"))
    cluster_ip, node_port = created["spec"]["clusterIP"], created["spec"]["ports"][0]["nodePort"]
    kept = update(server, "web", ports=[{"port": 80}])  # a manifest without the allocated fields
    assert kept["spec"]["clusterIP"] == cluster_ip and kept["spec"]["ports"][0]["nodePort"] == node_port
    with pytest.raises(ApiError) as immutable:
        update(server, "web", clusterIP="10.96.99.99", clusterIPs=["10.96.99.99"])
    assert "field is immutable" in immutable.value.message
    # back to ClusterIP with the old nodePort carried over (kubectl edit): dropped and released
    back = update(server, "web", type="ClusterIP")
    assert "nodePort" not in back["spec"]["ports"][0] and "externalTrafficPolicy" not in back["spec"]
    reuse = server.create(service("reuse", type="NodePort", ports=[{"port": 80, "nodePort": node_port}]))
    assert reuse["spec"]["ports"][0]["nodePort"] == node_port
    server.delete(SERVICES, "web", namespace="default")
    again = server.create(service("again", clusterIP=cluster_ip))
    assert again["spec"]["clusterIP"] == cluster_ip


def test_health_check_node_port_for_load_balancers_with_local_policy(server):
    local = server.create(service(type="LoadBalancer", externalTrafficPolicy="Local"))["spec"]
    health = local["healthCheckNodePort"]
    assert health in NODE_PORT_RANGE and health != local["ports"][0]["nodePort"]
    assert update(server, "web", ports=[{"port": 80}])["spec"]["healthCheckNodePort"] == health
    cluster = update(server, "web", externalTrafficPolicy="Cluster")["spec"]
    assert "healthCheckNodePort" not in cluster
    claimed = server.create(service("claim", type="NodePort", ports=[{"port": 80, "nodePort": health}]))
    assert claimed["spec"]["ports"][0]["nodePort"] == health  # released, so free again
    chosen = server.create(service("chosen", type="LoadBalancer", externalTrafficPolicy="Local",
                                   healthCheckNodePort=32000))
    assert chosen["spec"]["healthCheckNodePort"] == 32000
    assert "32000: provided port is already allocated" in refused(
        server, service("dup", type="LoadBalancer", externalTrafficPolicy="Local", healthCheckNodePort=32000))


def test_headless_external_name_and_no_node_ports_for_balancers_that_opt_out(server):
    assert server.create(service("headless", clusterIP="None", ports=[]))["spec"]["clusterIP"] == "None"
    external = server.create(service("alias", type="ExternalName", externalName="db.example.com", ports=[]))["spec"]
    assert "clusterIP" not in external
    quiet = server.create(service("quiet", type="LoadBalancer", allocateLoadBalancerNodePorts=False))["spec"]
    assert "nodePort" not in quiet["ports"][0]


def test_pods_deleted_with_a_grace_period_terminate_first(server):
    from netagent.kube.resources import PODS

    server.create({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": {"nodeName": "n1"}})
    server.start()
    client = LabApiClient(url=server.url)
    marked = client.delete("v1", "Pod", "p", grace_period_seconds=30)
    assert marked["metadata"]["deletionTimestamp"] and marked["metadata"]["deletionGracePeriodSeconds"] == 30
    again = client.delete("v1", "Pod", "p", grace_period_seconds=30)
    assert again["metadata"]["resourceVersion"] == marked["metadata"]["resourceVersion"]
    cleared = server.get(PODS, "p", namespace="default")
    del cleared["metadata"]["deletionTimestamp"]
    assert server.update(cleared)["metadata"]["deletionTimestamp"] == marked["metadata"]["deletionTimestamp"]
    client.delete("v1", "Pod", "p", grace_period_seconds=0)
    assert client.list("v1", "Pod") == []
    with pytest.raises(LabApiError) as bad:
        client.request("DELETE", "/api/v1/namespaces/default/pods/p", query={"gracePeriodSeconds": "soon"})
    assert bad.value.code == 400

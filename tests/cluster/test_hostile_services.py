"""Hostile and huge Services in a lab cluster (issue 18, items 3 and 4 for Services): legal
objects at scale and a Service with a null annotation, written through the lab API, cost
no node its Service programming, its health or its pods' connectivity.

One 2-node vxlan lab (iptables mode) for the module. `SERVICES` x `PORTS` x `ENDPOINTS`
hand-written (legal: at most 100 ports and 1,000 endpoints per slice, each service port its
own target port) come to 300,000 endpoint-ports and as many hairpin members: more than the
262,144 the hairpin set held, which made every sync fail with `Hash is full` (nothing
programmed, /healthz 503 after a minute) and left a Service created afterwards unanswered.
The null annotation lost every Service at an agent's start. Afterwards, on each node: the
hairpin set holds them all, a new Service answers from a pod, pods ping across nodes, and
/healthz answers 200.
"""
from __future__ import annotations

import json
import sys
import time

import pytest

from tests.cluster.lab_tools import hairpin_entries, lab_cluster, serve, traffic, wait_for

SERVICES, PORTS, ENDPOINTS = 3, 100, 1000      # 300,000 endpoint-ports
WEB_PORT = 8080
SCALE_SECONDS = 900    # two agents rendering and restoring 300k rules on two shared, loaded cores


def huge_service(index: int) -> tuple[dict, dict]:
    name = f"huge-{index}"
    ports = [{"name": f"p{p}", "port": 1000 + p, "targetPort": 20000 + index * PORTS + p, "protocol": "TCP"}
             for p in range(PORTS)]
    service = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "namespace": "default"},
               "spec": {"ports": ports}}          # no selector: its slice is ours to write
    endpoints = [{"addresses": [f"10.25{index}.{e // 250}.{e % 250 + 1}"], "conditions": {"ready": True}}
                 for e in range(ENDPOINTS)]
    endpoint_slice = {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
                      "metadata": {"name": f"{name}-1", "namespace": "default",
                                   "labels": {"kubernetes.io/service-name": name}},
                      "addressType": "IPv4", "endpoints": endpoints,
                      "ports": [{"name": p["name"], "port": p["targetPort"], "protocol": "TCP"} for p in ports]}
    return service, endpoint_slice


def null_annotated() -> dict:
    return {"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": "lax", "namespace": "default",
                         "annotations": {"service.kubernetes.io/topology-mode": None,
                                         "service.beta.kubernetes.io/load-balancer-source-ranges": None}},
            "spec": {"selector": {"app": "web"}, "ports": [{"name": "http", "port": 80, "targetPort": "http"}]}}


def healthz(lab, node: str, port: int = 10256) -> tuple[int, dict]:
    """/healthz on `port`: the proxy's 10256 says healthy or not, the loopback metrics address's
    10249 carries the details."""
    probe = ("import json, urllib.request, urllib.error\n"
             f"try:\n    answer = urllib.request.urlopen('http://127.0.0.1:{port}/healthz', timeout=10)\n"
             "except urllib.error.HTTPError as error:\n    answer = error\n"
             "print(json.dumps([answer.status, json.loads(answer.read() or b'{}')]))")
    status, body = json.loads(lab.exec(node, [sys.executable, "-c", probe]).stdout)
    return status, body


@pytest.fixture(scope="module")
def lab():
    with lab_cluster(nodes=2, mode="vxlan", proxy_mode="iptables") as lab:
        node1, node2 = sorted(lab.state.nodes)
        lab.add_pod("web-1", node=node2, labels={"app": "web"}, ports={"http": WEB_PORT})
        lab.add_pod("client", node=node1)
        server = serve(lab, "web-1", "tcp", WEB_PORT, lifetime=SCALE_SECONDS + 600, named=True)
        try:
            yield lab
        finally:
            server.stop()


def test_legal_objects_at_scale_and_a_null_annotation_leave_every_node_serving(lab):
    api = lab.api()
    api.create(null_annotated())
    started = time.monotonic()
    for index in range(SERVICES):
        service, endpoint_slice = huge_service(index)
        api.create(service)
        api.create(endpoint_slice)
    members = SERVICES * PORTS * ENDPOINTS
    for node in sorted(lab.state.nodes):
        wait_for(lambda: hairpin_entries(lab, node) >= members, timeout=SCALE_SECONDS, interval=2.0,
                 what=f"{members} hairpin members on {node}")
    print(f"\n{members} endpoint-ports programmed on both nodes in {time.monotonic() - started:.0f} s")

    api.apply({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "fresh", "namespace": "default"},
               "spec": {"selector": {"app": "web"}, "ports": [{"name": "http", "port": 80, "targetPort": "http"}]}})
    fresh_ip = api.get("v1", "Service", "fresh", namespace="default")["spec"]["clusterIP"]
    lax_ip = api.get("v1", "Service", "lax", namespace="default")["spec"]["clusterIP"]

    def answers(address: str) -> bool:
        results = json.loads(traffic(lab, "client", "poll-tcp", address, "80", "1").stdout)
        return bool(results) and results[0][0].startswith("web-1")
    wait_for(lambda: answers(fresh_ip), timeout=SCALE_SECONDS, interval=1.0, what="the new Service to answer")
    wait_for(lambda: answers(lax_ip), timeout=120, interval=1.0, what="the null-annotated Service to answer")
    web_ip = {p["name"]: p["ip"] for p in lab.status()["pods"]}["web-1"]
    assert lab.exec("client", ["ping", "-c", "2", "-i", "0.2", "-W", "3", web_ip]).returncode == 0
    for node in sorted(lab.state.nodes):
        # /healthz is 503 while a change has waited unprogrammed over 60 s (kube-proxy's rule): on a
        # loaded machine a sync of 300,000 endpoint-ports can; healthy once it is written
        wait_for(lambda: healthz(lab, node)[0] == 200, timeout=SCALE_SECONDS, interval=2.0,
                 what=f"/healthz 200 on {node}")
        _, detailed = healthz(lab, node, 10249)
        assert not detailed["details"].get("rejected_objects"), detailed    # nothing here is refused

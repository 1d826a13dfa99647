"""The agent in IPVS mode in the lab, on a kernel that has IPVS (Debian's, inside the VM tier's guest).

Where tests/vm/guest/test_ipvs_backend.py drives the backend directly, this runs the whole
path as a cluster would: Services and pods in the API server, the lab's EndpointSlice
controller, the agents' watch, catalog and sync (`--proxy-mode ipvs`), then real
connections: from a pod to the cluster IP (every endpoint answers, the pod's address is
kept) and from outside to a NodePort; `netagent status services` reads the virtual servers
back. Pods sit on the CNI bridge, so the guest loads br_netfilter as Kubernetes nodes do.
"""
import json
import sys
import time

from tests.cluster.lab_tools import lab_cluster, serve, traffic

PORT = 8080


def poll(lab, pod, address, port, count):
    return json.loads(traffic(lab, pod, "poll-tcp", address, str(port), str(count)).stdout)


def names(results):
    return [answer.split()[0] for answer, _ in results if not answer.startswith("error")]


def test_services_through_the_agent_in_ipvs_mode():
    with lab_cluster(nodes=2, mode="host-gw", proxy_mode="ipvs") as lab:
        lab.add_pod("web-1", node="node-1", labels={"app": "web"}, ports={"http": PORT}, ready=False)
        lab.add_pod("web-2", node="node-2", labels={"app": "web"}, ports={"http": PORT}, ready=False)
        lab.add_pod("client", node="node-1")
        servers = [serve(lab, pod, "tcp", PORT, lifetime=600, named=True) for pod in ("web-1", "web-2")]
        try:
            for pod in ("web-1", "web-2"):
                lab.set_pod_ready(pod, ready=True)
            service = lab.api().apply({"apiVersion": "v1", "kind": "Service",
                                       "metadata": {"name": "web", "namespace": "default"},
                                       "spec": {"type": "NodePort", "selector": {"app": "web"},
                                                "ports": [{"name": "http", "port": 80, "targetPort": "http"}]}})
            cluster_ip, node_port = service["spec"]["clusterIP"], service["spec"]["ports"][0]["nodePort"]
            deadline = time.monotonic() + 120
            while set(names(poll(lab, "client", cluster_ip, 80, 4))) != {"web-1", "web-2"}:
                assert time.monotonic() < deadline, "the ClusterIP never reached both endpoints"
                time.sleep(1)
            results = poll(lab, "client", cluster_ip, 80, 10)
            assert sorted(set(names(results))) == ["web-1", "web-2"] and len(names(results)) == 10, results
            client_ip = next(p["ip"] for p in lab.status()["pods"] if p["name"] == "client")
            assert {answer.split()[1] for answer, _ in results} == {client_ip}
            outside = poll(lab, "internet", lab.state.nodes["node-1"].address, node_port, 6)
            assert len(names(outside)) == 6, outside
            listed = json.loads(lab.exec("node-1", [sys.executable, "-m", "netagent.cli", "status", "services",
                                                    "--json"], check=True, timeout=120).stdout)
            assert listed["mode"] == "ipvs"
            web = [s for s in listed["services"] if s["name"] == "default/web:http" and s["kind"] == "ClusterIP"]
            assert len(web) == 1 and len(web[0]["backends"]) == 2, listed
        finally:
            for server in servers:
                server.stop()

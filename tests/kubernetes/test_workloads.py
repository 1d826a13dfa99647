"""Workloads on the real cluster: Deployments created with kubectl get their addresses from
netagent and talk across nodes, through a ClusterIP and a NodePort Service (slices from the real
EndpointSlice controller), by DNS name, and under a NetworkPolicy."""
from __future__ import annotations

import ipaddress

from lab.kubernetes import images
from lab.kubernetes.cluster import NETWORK, KubernetesLab
from netagent.kernel import namespaces
from tests.kubernetes.conftest import apply, pod_exec, running, wait_for

WEB = {"app": "web"}


def web_deployment(replicas: int = 3) -> dict:
    """agnhost netexec on port 8080, one replica per node."""
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web"},
            "spec": {"replicas": replicas, "selector": {"matchLabels": WEB},
                     "template": {"metadata": {"labels": WEB}, "spec": {
                         "topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "kubernetes.io/hostname",
                                                        "whenUnsatisfiable": "DoNotSchedule",
                                                        "labelSelector": {"matchLabels": WEB}}],
                         "containers": [{"name": "web", "image": images.AGNHOST_IMAGE,
                                         "args": ["netexec", "--http-port=8080"],
                                         "ports": [{"containerPort": 8080, "name": "http"}],
                                         "readinessProbe": {"httpGet": {"path": "/healthz", "port": 8080},
                                                            "periodSeconds": 2}}]}}}}


def client_pod(name: str, node: str, labels: dict | None = None) -> dict:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": labels or {"app": name}},
            "spec": {"nodeName": node, "terminationGracePeriodSeconds": 1,
                     "containers": [{"name": "client", "image": images.AGNHOST_IMAGE, "args": ["pause"]}]}}


def web_service(kind: str = "ClusterIP") -> dict:
    return {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web"},
            "spec": {"type": kind, "selector": WEB, "ports": [{"port": 80, "targetPort": "http", "name": "http"}]}}


def curl(lab: KubernetesLab, namespace: str, pod: str, url: str) -> str | None:
    proc = pod_exec(lab, namespace, pod, "curl", "-sS", "--max-time", "5", url, check=False)
    return proc.stdout.strip() if proc.returncode == 0 else None


def deploy_web(lab: KubernetesLab, namespace: str, *, service: str = "ClusterIP") -> list[dict]:
    apply(lab, namespace, [web_deployment(), web_service(service), client_pod("client", "node-1")])
    running(lab, namespace, "app=client", 1)
    return running(lab, namespace, "app=web", 3)


def test_pods_get_addresses_from_netagent_and_talk_across_nodes(kube_lab: KubernetesLab, namespace: str):
    web = deploy_web(kube_lab, namespace)
    assert sorted(p["spec"]["nodeName"] for p in web) == ["node-1", "node-2", "node-3"]
    nodes = {n["metadata"]["name"]: n for n in kube_lab.kubectl_json("get", "nodes")["items"]}
    for pod in web:
        address = ipaddress.ip_address(pod["status"]["podIP"])
        # the address netagent's IPAM gave is inside the podCIDR the controller manager allocated
        assert address in ipaddress.ip_network(nodes[pod["spec"]["nodeName"]]["spec"]["podCIDR"])
        assert address in NETWORK.cluster_cidr
        answer = wait_for(lambda: curl(kube_lab, namespace, "client", f"http://{address}:8080/hostname"),
                          what=f"client -> {pod['metadata']['name']}")
        assert answer == pod["metadata"]["name"]


def test_cluster_ip_service_by_address_and_by_dns_name(kube_lab: KubernetesLab, namespace: str):
    web = deploy_web(kube_lab, namespace)
    names = {p["metadata"]["name"] for p in web}
    service = kube_lab.kubectl_json("-n", namespace, "get", "service", "web")
    slices = kube_lab.kubectl_json("-n", namespace, "get", "endpointslices", "-l", "kubernetes.io/service-name=web")
    assert slices["items"][0]["metadata"]["labels"]["endpointslice.kubernetes.io/managed-by"] == \
        "endpointslice-controller.k8s.io"   # the real controller's, not a lab's
    for url in (f"http://{service['spec']['clusterIP']}/hostname", f"http://web.{namespace}.svc.cluster.local/hostname",
                "http://web/hostname"):
        seen: set[str] = set()

        def every_endpoint_answered() -> bool:
            answer = curl(kube_lab, namespace, "client", url)
            if answer:
                seen.add(answer)
            return seen == names
        wait_for(every_endpoint_answered, what=f"{url} answered by every endpoint (so far {sorted(seen)})",
                 interval=0.2)


def test_node_port_from_outside_the_cluster(kube_lab: KubernetesLab, namespace: str):
    web = deploy_web(kube_lab, namespace, service="NodePort")
    port = kube_lab.kubectl_json("-n", namespace, "get", "service", "web")["spec"]["ports"][0]["nodePort"]
    names = {p["metadata"]["name"] for p in web}
    for node in kube_lab.state.nodes.values():
        def answers() -> str | None:
            proc = namespaces.run_in(kube_lab.state.router, ["curl", "-sS", "--max-time", "5",
                                                             f"http://{node.address}:{port}/hostname"])
            return proc.stdout.strip() if proc.returncode == 0 else None
        assert wait_for(answers, what=f"NodePort {port} on {node.name} from the router") in names


def test_network_policy_admits_only_the_labelled_client(kube_lab: KubernetesLab, namespace: str):
    web = deploy_web(kube_lab, namespace)
    apply(kube_lab, namespace, [client_pod("allowed", "node-2", {"access": "web"})])
    running(kube_lab, namespace, "access=web", 1)
    target = next(p for p in web if p["spec"]["nodeName"] == "node-3")["status"]["podIP"]
    url = f"http://{target}:8080/hostname"
    assert wait_for(lambda: curl(kube_lab, namespace, "client", url), what="open before the policy")
    apply(kube_lab, namespace, [{
        "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy", "metadata": {"name": "web-from-access"},
        "spec": {"podSelector": {"matchLabels": WEB}, "policyTypes": ["Ingress"],
                 "ingress": [{"from": [{"podSelector": {"matchLabels": {"access": "web"}}}]}]}}])
    wait_for(lambda: curl(kube_lab, namespace, "client", url) is None, what="the unlabelled client shut out")
    assert curl(kube_lab, namespace, "allowed", url)
    kube_lab.kubectl("-n", namespace, "delete", "networkpolicy", "web-from-access")
    assert wait_for(lambda: curl(kube_lab, namespace, "client", url), what="open again once the policy is gone")

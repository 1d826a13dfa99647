"""The real control plane judging netagent: the version it reports, the agent's ServiceAccount
under the real RBAC authorizer, the agent's announcements through the real `nodes/status`
strategy; and the node side: an agent restarted by its DaemonSet and a kubelet restarted, with
established connections kept."""
from __future__ import annotations

import json
import subprocess
import time

from lab.kubernetes import images
from lab.kubernetes.cluster import KubernetesLab, kubectl_binary
from tests.kubernetes.conftest import apply, pod_exec, running, wait_for


def as_agent(lab: KubernetesLab, *args: str) -> subprocess.CompletedProcess:
    """kubectl with the netagent ServiceAccount's token and nothing else (no client certificate)."""
    token = lab.kubectl("-n", "kube-system", "create", "token", "netagent").stdout.strip()
    return subprocess.run([kubectl_binary(), "--kubeconfig", "/dev/null",
                           "--server", lab.control_plane.host_url(lab.kube.host_port or 0),
                           "--certificate-authority", lab.control_plane.pki.ca_cert, "--token", token, *args],
                          capture_output=True, text=True, timeout=60)


def test_components_report_the_pinned_version(kube_lab: KubernetesLab):
    version = json.loads(kube_lab.kubectl("version", "-o", "json").stdout)["serverVersion"]
    assert version["gitVersion"] == kube_lab.kube.version
    for node in kube_lab.kubectl_json("get", "nodes")["items"]:
        assert node["status"]["nodeInfo"]["kubeletVersion"] == kube_lab.kube.version
        assert node["status"]["nodeInfo"]["containerRuntimeVersion"].startswith("containerd://")


def test_agents_announced_themselves_through_nodes_status(kube_lab: KubernetesLab):
    for node in kube_lab.kubectl_json("get", "nodes")["items"]:
        name = node["metadata"]["name"]
        annotations = node["metadata"].get("annotations", {})
        assert annotations.get("netagent.io/public-ip") == kube_lab.state.nodes[name].address, annotations
        assert node["spec"]["podCIDR"], "the controller manager's node IPAM allocated none"


def test_agent_role_is_refused_outside_what_it_grants(kube_lab: KubernetesLab):
    refused = as_agent(kube_lab, "patch", "node", "node-2", "--type=merge", "-p", '{"spec":{"unschedulable":true}}')
    assert refused.returncode != 0 and "forbidden" in refused.stderr.lower(), refused
    assert not kube_lab.kubectl_json("get", "node", "node-2")["spec"].get("unschedulable")
    for verb in (("get", "secrets", "-A"), ("delete", "node", "node-3", "--wait=false"),
                 ("create", "namespace", "agent-made")):
        proc = as_agent(kube_lab, *verb)
        assert proc.returncode != 0 and "forbidden" in proc.stderr.lower(), (verb, proc)
    # what the role grants works under the real authorizer
    allowed = as_agent(kube_lab, "auth", "can-i", "patch", "nodes", "--subresource=status")
    assert allowed.stdout.strip() == "yes", allowed
    assert as_agent(kube_lab, "get", "endpointslices", "-A").returncode == 0


def long_connection(lab: KubernetesLab, namespace: str) -> tuple[str, str]:
    """A server pod on node-3 and a client pod on node-1 holding one TCP connection that
    writes a line every 0.2 s; returns (server pod, client pod)."""
    def pod(name: str, node: str, script: str) -> dict:
        return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": {"app": name}},
                "spec": {"nodeName": node, "terminationGracePeriodSeconds": 1,
                         "containers": [{"name": name, "image": images.AGNHOST_IMAGE,
                                         "command": ["bash", "-c", script]}]}}
    apply(lab, namespace, [pod("server", "node-3", "nc -l -p 9000 > /tmp/got; echo closed > /tmp/state; sleep 3600")])
    server_ip = running(lab, namespace, "app=server", 1)[0]["status"]["podIP"]
    apply(lab, namespace, [pod("client", "node-1",
                               f"exec 3<>/dev/tcp/{server_ip}/9000 || exit 1; "
                               "while echo line >&3; do sleep 0.2; done; echo broken > /tmp/state; sleep 3600")])
    running(lab, namespace, "app=client", 1)
    wait_for(lambda: received(lab, namespace) > 5, what="the connection carrying lines")
    return "server", "client"


def received(lab: KubernetesLab, namespace: str) -> int:
    proc = pod_exec(lab, namespace, "server", "sh", "-c", "wc -l < /tmp/got", check=False)
    return int(proc.stdout.strip() or 0) if proc.returncode == 0 else 0


def assert_connection_alive(lab: KubernetesLab, namespace: str, *,
                            pods: tuple[str, ...] = ("server", "client")) -> None:
    """More lines arrive over the one connection, and neither end saw it close (`pods`: the ends
    whose kubelet answers `kubectl exec`)."""
    before = received(lab, namespace)
    wait_for(lambda: received(lab, namespace) > before + 10, what="new lines on the same connection")
    for pod in pods:
        state = pod_exec(lab, namespace, pod, "sh", "-c", "cat /tmp/state 2>/dev/null || true").stdout
        assert not state.strip(), f"{pod}: {state}"


def agent_pod(lab: KubernetesLab, node: str) -> dict:
    found = [p for p in lab.kubectl_json("-n", "kube-system", "get", "pods", "-l",
                                         "app.kubernetes.io/name=netagent")["items"]
             if p["spec"]["nodeName"] == node]
    assert len(found) == 1, found
    return found[0]


def test_agent_restart_keeps_established_connections(kube_lab: KubernetesLab, namespace: str):
    long_connection(kube_lab, namespace)
    for node in ("node-1", "node-3"):
        old = agent_pod(kube_lab, node)["metadata"]["name"]
        kube_lab.kubectl("-n", "kube-system", "delete", "pod", old, "--wait=true", timeout=180)

        def replaced_and_ready() -> bool:
            new = agent_pod(kube_lab, node)
            return new["metadata"]["name"] != old and any(
                c["type"] == "Ready" and c["status"] == "True" for c in new["status"].get("conditions", []))
        wait_for(replaced_and_ready, what=f"the DaemonSet's new agent on {node} Ready")
    assert_connection_alive(kube_lab, namespace)


def test_kubelet_restart_keeps_pods_and_connections(kube_lab: KubernetesLab, namespace: str):
    long_connection(kube_lab, namespace)
    started = {p["metadata"]["name"]: p["status"]["containerStatuses"][0]["containerID"]
               for p in kube_lab.kubectl_json("-n", namespace, "get", "pods")["items"]}
    kube_lab.stop_kubelet("node-1")   # the client's node; the server's kubelet answers exec
    try:
        time.sleep(2)
        assert_connection_alive(kube_lab, namespace, pods=("server",))   # pods run on without their kubelet
    finally:
        kube_lab.start_kubelet("node-1")
    wait_for(lambda: "node-1" in kube_lab.ready_nodes(), what="node-1 Ready again")
    assert_connection_alive(kube_lab, namespace)
    after = {p["metadata"]["name"]: p["status"]["containerStatuses"][0]["containerID"]
             for p in kube_lab.kubectl_json("-n", namespace, "get", "pods")["items"]}
    assert after == started   # the kubelet adopted its containers: none restarted

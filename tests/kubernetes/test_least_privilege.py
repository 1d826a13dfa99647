"""Least privilege of the agent's identity, judged by the real API server (issue 29, item 10).

Each test acts with the token an agent pod actually holds: the netagent ServiceAccount's token
bound to the netagent pod on node-1 (`kubectl create token --bound-object-kind Pod`), which the
API server gives that node's name (`authentication.kubernetes.io/node-name`). With it:
- deploy/netagent.yaml's ValidatingAdmissionPolicy `netagent-own-node` refuses any write to
  another Node (its annotations, labels, status) with the policy's message, and lets the agent
  write its own; a token bound to no pod may write no Node at all;
- the agent's only ConfigMap is kube-system/netagent-bgp, granted by a namespaced Role naming
  it: listing ConfigMaps in kube-system or in every namespace is refused, and the agent's own
  reflector on that ConfigMap (`bgp_start.config_reflector`, one name by a field selector in
  its namespace) lists and watches it.
"""
from __future__ import annotations

import json
import os
import subprocess
import tempfile
from collections.abc import Iterator

import pytest
import yaml

from lab.kubernetes.cluster import KubernetesLab, kubectl_binary
from netagent.daemon.bgp_start import DEFAULT_CONFIG, config_key, config_reflector
from netagent.kube.changes import ChangeRecorder
from netagent.kube.config import KubeApiError, PatchType, load_api_client, request_json
from netagent.kube.nodes import patch_node_annotations
from netagent.kube.resources import NODES
from tests.kubernetes.conftest import wait_for

POLICY = "netagent-own-node"
OWN, OTHER = "node-1", "node-2"
KEY = "netagent.io/least-privilege-test"
EXTENDED = "example.com/least-privilege-test"   # an extended resource in a Node's capacity
CONFIG_NAMESPACE, CONFIG_NAME = DEFAULT_CONFIG.split("/")


def agent_pod_on(lab: KubernetesLab, node: str) -> str:
    pods = lab.kubectl_json("-n", "kube-system", "get", "pods", "-l", "app.kubernetes.io/name=netagent",
                            "--field-selector", f"spec.nodeName={node}")["items"]
    assert len(pods) == 1, [p["metadata"]["name"] for p in pods]
    return pods[0]["metadata"]["name"]


@pytest.fixture(scope="module")
def bound_token(kube_lab: KubernetesLab) -> str:
    """The netagent ServiceAccount's token bound to the agent pod on node-1, as the kubelet projects it."""
    pod = agent_pod_on(kube_lab, OWN)
    return kube_lab.kubectl("-n", "kube-system", "create", "token", "netagent", "--bound-object-kind", "Pod",
                            "--bound-object-name", pod, "--duration", "1h").stdout.strip()


def with_token(lab: KubernetesLab, token: str, *args: str) -> subprocess.CompletedProcess:
    """kubectl with this token and nothing else (no client certificate, no kubeconfig)."""
    return subprocess.run([kubectl_binary(), "--kubeconfig", "/dev/null",
                           "--server", lab.control_plane.host_url(lab.kube.host_port or 0),
                           "--certificate-authority", lab.control_plane.pki.ca_cert, "--token", token, *args],
                          capture_output=True, text=True, timeout=60)


def client_with(lab: KubernetesLab, token: str):
    """The agent's API client (netagent.kube.config) with this token and nothing else."""
    with tempfile.TemporaryDirectory() as directory:
        path = os.path.join(directory, "kubeconfig")
        with open(path, "w") as f:
            yaml.safe_dump({"apiVersion": "v1", "kind": "Config", "current-context": "agent",
                            "clusters": [{"name": "lab", "cluster": {
                                "server": lab.control_plane.host_url(lab.kube.host_port or 0),
                                "certificate-authority": lab.control_plane.pki.ca_cert}}],
                            "users": [{"name": "agent", "user": {"token": token}}],
                            "contexts": [{"name": "agent", "context": {"cluster": "lab", "user": "agent"}}]}, f)
        return load_api_client(kubeconfig=path)


def patch_status(lab: KubernetesLab, token: str, node: str, patch: dict) -> KubeApiError | None:
    """A merge patch of a Node's status subresource, the agent's way of writing its announcement
    (kubectl patch would first need `get nodes/status`, which the agent is not granted); the
    API server's refusal, or None."""
    client = client_with(lab, token)
    try:
        if set(patch) == {"metadata"} and set(patch["metadata"]) == {"annotations"}:
            patch_node_annotations(client, node, patch["metadata"]["annotations"])   # the agent's own call
        else:
            request_json(client, "PATCH", NODES.object_path(node) + "/status", body=patch,
                         content_type=PatchType.MERGE.value)
    except KubeApiError as error:
        return error
    return None


def node(lab: KubernetesLab, name: str) -> dict:
    return lab.kubectl_json("get", "node", name)


def refused_by_policy(error: KubeApiError | None, message: str) -> bool:
    return (error is not None and error.status == 403 and f"ValidatingAdmissionPolicy '{POLICY}'" in error.message
            and message in error.message)


def test_the_token_carries_the_node_of_its_pod(kube_lab: KubernetesLab, bound_token: str):
    whoami = json.loads(with_token(kube_lab, bound_token, "auth", "whoami", "-o", "json").stdout)
    user = whoami["status"]["userInfo"]
    assert user["username"] == "system:serviceaccount:kube-system:netagent"
    assert user["extra"]["authentication.kubernetes.io/node-name"] == [OWN]


@pytest.mark.parametrize("what, patch", [
    ("annotations", {"metadata": {"annotations": {KEY: "taken"}}}),
    ("labels", {"metadata": {"labels": {KEY: "taken"}}}),
    ("status", {"status": {"capacity": {EXTENDED: "1"}}}),
])
def test_another_nodes_annotations_labels_and_status_are_refused(kube_lab: KubernetesLab, bound_token: str,
                                                                  what: str, patch: dict):
    capacity = node(kube_lab, OTHER)["status"]["capacity"]
    try:
        error = patch_status(kube_lab, bound_token, OTHER, patch)
        assert refused_by_policy(error, f"netagent on Node '{OWN}' may write only its own Node, not '{OTHER}'"), error
        after = node(kube_lab, OTHER)
        assert KEY not in after["metadata"].get("annotations", {}) | after["metadata"].get("labels", {})
        assert after["status"]["capacity"] == capacity
    finally:   # on a manifest without the policy the write went through: undo it
        kube_lab.kubectl("patch", "node", OTHER, "--subresource=status", "--type=merge", "-p", json.dumps(
            {"metadata": {"annotations": {KEY: None}, "labels": {KEY: None}},
             "status": {"capacity": {EXTENDED: None}}}), check=False)


def test_its_own_nodes_annotations_and_labels_are_allowed(kube_lab: KubernetesLab, bound_token: str):
    try:
        error = patch_status(kube_lab, bound_token, OWN,
                             {"metadata": {"annotations": {KEY: "mine"}, "labels": {KEY: "mine"}}})
        assert error is None, error
        metadata = node(kube_lab, OWN)["metadata"]
        assert metadata["annotations"][KEY] == metadata["labels"][KEY] == "mine"
    finally:
        cleared = patch_status(kube_lab, bound_token, OWN,
                               {"metadata": {"annotations": {KEY: None}, "labels": {KEY: None}}})
    assert cleared is None, cleared
    assert KEY not in node(kube_lab, OWN)["metadata"].get("annotations", {})


def test_a_token_bound_to_no_pod_may_write_no_node(kube_lab: KubernetesLab):
    unbound = kube_lab.kubectl("-n", "kube-system", "create", "token", "netagent").stdout.strip()
    error = patch_status(kube_lab, unbound, OWN, {"metadata": {"annotations": {KEY: "unbound"}}})
    try:
        assert refused_by_policy(error, "only with a token bound to a pod on that Node"), error
    finally:
        kube_lab.kubectl("annotate", "node", OWN, f"{KEY}-", check=False)


@pytest.mark.parametrize("args", [
    ("get", "configmaps", "-n", "kube-system"),
    ("get", "configmaps", "-A"),
    ("get", "configmap", "netagent-apiserver", "-n", "kube-system"),
    ("get", "--raw", "/api/v1/namespaces/kube-system/configmaps?fieldSelector=metadata.name%3Dnetagent-apiserver"),
    ("get", "--raw", f"/api/v1/configmaps?fieldSelector=metadata.name%3D{CONFIG_NAME}"),
    ("get", "--raw", f"/api/v1/namespaces/default/configmaps?fieldSelector=metadata.name%3D{CONFIG_NAME}"),
])
def test_configmaps_beyond_its_own_are_refused(kube_lab: KubernetesLab, bound_token: str, args: tuple[str, ...]):
    proc = with_token(kube_lab, bound_token, *args)
    assert proc.returncode != 0 and "forbidden" in proc.stderr.lower(), proc


@pytest.mark.parametrize("query", ["", "&watch=1&timeoutSeconds=1"])
def test_its_configmap_by_name_is_listed_and_watched(kube_lab: KubernetesLab, bound_token: str, query: str):
    path = f"/api/v1/namespaces/{CONFIG_NAMESPACE}/configmaps?fieldSelector=metadata.name%3D{CONFIG_NAME}{query}"
    proc = with_token(kube_lab, bound_token, "get", "--raw", path)
    assert proc.returncode == 0, proc


@pytest.fixture
def topology_config(kube_lab: KubernetesLab) -> Iterator[str]:
    """kube-system/netagent-bgp, made for the test unless the lab (bgp mode) has one."""
    exists = kube_lab.kubectl("-n", CONFIG_NAMESPACE, "get", "configmap", CONFIG_NAME, check=False).returncode == 0
    if not exists:
        kube_lab.kubectl("-n", CONFIG_NAMESPACE, "create", "configmap", CONFIG_NAME, "--from-literal=asNumber=64512")
    try:
        yield CONFIG_NAME
    finally:
        if not exists:
            kube_lab.kubectl("-n", CONFIG_NAMESPACE, "delete", "configmap", CONFIG_NAME, check=False)


def test_the_agents_own_reflector_reads_its_configmap(kube_lab: KubernetesLab, bound_token: str,
                                                       topology_config: str):
    reflector = config_reflector(api_client=client_with(kube_lab, bound_token), config=DEFAULT_CONFIG,
                                 handler=ChangeRecorder("least-privilege"))
    reflector.start()
    try:
        assert reflector.synced.wait(30), reflector.stats
        wait_for(lambda: reflector.stats.watches >= 1, what="the reflector's watch", timeout=30)
        stored = reflector.store.get(config_key(DEFAULT_CONFIG))
        assert stored is not None and stored["metadata"]["name"] == topology_config
        assert reflector.stats.failed_requests == 0, reflector.stats
    finally:
        reflector.stop()

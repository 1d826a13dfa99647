"""The lab API server, driven by the official `kubernetes` client over loopback TCP.

The client is built by `netagent.kube.config.load_api_client` from a kubeconfig that points
at the server, so these tests also cover the agent's own way of getting a client. Watches are
in `test_kube_apiserver_watch.py`; the fixtures in `kube_apiserver_support.py`.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest
from kubernetes import client, watch

from lab.apiclient import LabApiClient, LabApiError
from lab.apiserver import ApiError, ApiServer, LabelSelector, json_patch, merge_patch
from netagent.kube import config as kube_config
from netagent.kube.config import KubeConfigError, PatchType, load_api_client
from netagent.kube.resources import ENDPOINT_SLICES, NODES
from tests.unit.lab.kube_apiserver_support import api_client, core, server  # noqa: F401 (fixtures)
from tests.unit.lab.kube_apiserver_support import node, write_kubeconfig

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


# ---------------------------------------------------------------------------------------------
# objects and verbs
# ---------------------------------------------------------------------------------------------
def test_create_list_get_delete_node(core):
    created = core.create_node(node("n1", zone="a"))
    assert created.metadata.uid and created.metadata.creation_timestamp
    assert created.metadata.generation is None  # nodes have none on a real server either
    assert int(created.metadata.resource_version) > 0
    listed = core.list_node()
    assert [n.metadata.name for n in listed.items] == ["n1"]
    assert int(listed.metadata.resource_version) >= int(created.metadata.resource_version)
    assert core.read_node("n1").metadata.labels == {"zone": "a"}
    core.delete_node("n1")
    assert core.list_node().items == []


def test_missing_object_is_404_and_duplicate_create_is_409_already_exists(core):
    with pytest.raises(client.ApiException) as missing:
        core.read_node("nope")
    assert missing.value.status == 404
    assert json.loads(missing.value.body)["reason"] == "NotFound"
    core.create_node(node("n1"))
    with pytest.raises(client.ApiException) as duplicate:
        core.create_node(node("n1"))
    status = json.loads(duplicate.value.body)
    assert (duplicate.value.status, status["kind"], status["reason"]) == (409, "Status", "AlreadyExists")
    with pytest.raises(client.ApiException) as delete_missing:
        core.delete_node("nope")
    assert delete_missing.value.status == 404


def test_replace_with_a_stale_resource_version_is_409_conflict(core):
    first = core.create_node(node("n1"))
    core.patch_node("n1", {"metadata": {"labels": {"moved": "yes"}}})
    stale = {"metadata": {"name": "n1", "resourceVersion": first.metadata.resource_version, "labels": {"x": "y"}}}
    with pytest.raises(client.ApiException) as conflict:
        core.replace_node("n1", stale)
    assert conflict.value.status == 409
    assert json.loads(conflict.value.body)["reason"] == "Conflict"
    current = core.read_node("n1")
    replaced = core.replace_node(
        "n1", {"metadata": {"name": "n1", "resourceVersion": current.metadata.resource_version, "labels": {"x": "y"}}}
    )
    assert replaced.metadata.labels == {"x": "y"}
    assert replaced.metadata.uid == first.metadata.uid


def test_patch_node_strategic_merge_and_json_patch(core):
    core.create_node(node("n1", role="worker"))
    strategic = core.patch_node("n1", {"metadata": {"annotations": {"netagent.io/vtep-mac": "aa:bb"}}})
    assert strategic.metadata.annotations == {"netagent.io/vtep-mac": "aa:bb"}
    assert strategic.metadata.labels == {"role": "worker"}
    merged = core.patch_node(
        "n1",
        {"metadata": {"annotations": {"netagent.io/vtep-mac": None, "b": "2"}}},
        _content_type="application/merge-patch+json",
    )
    assert merged.metadata.annotations == {"b": "2"}
    json_patched = core.patch_node(
        "n1",
        [
            {"op": "test", "path": "/metadata/labels/role", "value": "worker"},
            {"op": "replace", "path": "/metadata/labels/role", "value": "edge"},
            {"op": "add", "path": "/spec/podCIDR", "value": "10.244.1.0/24"},
        ],
    )
    assert json_patched.metadata.labels == {"role": "edge"}
    assert json_patched.spec.pod_cidr == "10.244.1.0/24"
    with pytest.raises(client.ApiException) as failed_test:
        core.patch_node("n1", [{"op": "test", "path": "/metadata/labels/role", "value": "worker"}])
    assert failed_test.value.status == 422


def test_a_write_that_changes_nothing_keeps_the_resource_version(core):
    first = core.create_node(node("n1", a="1"))
    same = core.patch_node("n1", {"metadata": {"labels": {"a": "1"}}})
    assert same.metadata.resource_version == first.metadata.resource_version
    changed = core.patch_node("n1", {"spec": {"unschedulable": True}})
    assert int(changed.metadata.resource_version) > int(first.metadata.resource_version)
    assert changed.spec.unschedulable is True


def test_status_subresource_is_separate_from_the_main_resource(core):
    core.create_node(node("n1"))
    core.patch_node("n1", {"status": {"addresses": [{"type": "InternalIP", "address": "10.0.0.1"}]}})
    assert core.read_node("n1").status is None  # the main resource ignored it
    core.patch_node_status("n1", {"status": {"addresses": [{"type": "InternalIP", "address": "10.0.0.1"}]}})
    assert core.read_node("n1").status.addresses[0].address == "10.0.0.1"
    core.patch_node_status("n1", {"spec": {"unschedulable": True}})
    assert core.read_node("n1").spec.unschedulable is None  # /status keeps the spec


def test_a_status_write_applies_metadata_as_the_real_node_status_strategy(core, api_client):
    # nodeStatusStrategy resets only the spec: flannel and netagent (kube/nodes.py) annotate
    # their Node with a status patch, so RBAC needs no `patch` on nodes.
    from netagent.kube.nodes import patch_node_annotations
    core.create_node({**node("n1"), "spec": {"podCIDR": "10.244.1.0/24"}})
    core.patch_node_status("n1", {"metadata": {"labels": {"role": "edge"}, "annotations": {"a": "1"}},
                                  "spec": {"podCIDR": "10.99.0.0/24", "unschedulable": True}})
    stored = core.read_node("n1")
    assert (stored.metadata.labels, stored.metadata.annotations) == ({"role": "edge"}, {"a": "1"})
    assert (stored.spec.pod_cidr, stored.spec.unschedulable) == ("10.244.1.0/24", None)
    updated = patch_node_annotations(api_client, "n1", {"netagent.io/public-ip": "10.0.0.1", "a": None})
    assert updated["metadata"]["annotations"] == {"netagent.io/public-ip": "10.0.0.1"}
    assert updated["spec"]["podCIDR"] == "10.244.1.0/24"
    assert core.read_node("n1").metadata.annotations == {"netagent.io/public-ip": "10.0.0.1"}


def test_a_pod_status_write_keeps_the_owner_references(core):
    owner = {"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "ds", "uid": "u1"}
    pod = {"metadata": {"name": "p", "ownerReferences": [owner]},
           "spec": {"containers": [{"name": "c", "image": "i"}]}}
    core.create_namespaced_pod("default", pod)
    core.patch_namespaced_pod_status("p", "default", {"metadata": {"ownerReferences": None, "labels": {"x": "y"}},
                                                      "status": {"phase": "Running"}})
    stored = core.read_namespaced_pod("p", "default")
    assert stored.metadata.owner_references[0].name == "ds" and stored.metadata.labels == {"x": "y"}
    assert stored.status.phase == "Running"


def test_generate_name(core):
    created = core.create_node({"metadata": {"generateName": "node-"}})
    assert created.metadata.name.startswith("node-") and len(created.metadata.name) == 10


def test_services_get_a_cluster_ip_and_node_ports_that_updates_keep(core):
    service = core.create_namespaced_service(
        "default", {"metadata": {"name": "web"}, "spec": {"type": "NodePort", "ports": [{"port": 80}]}}
    )
    assert service.spec.cluster_ip.startswith("10.96.")
    assert service.spec.cluster_ips == [service.spec.cluster_ip]
    assert 30000 <= service.spec.ports[0].node_port <= 32767
    assert service.spec.ports[0].target_port == 80
    other = core.create_namespaced_service("default", {"metadata": {"name": "db"}, "spec": {"ports": [{"port": 5432}]}})
    assert other.spec.cluster_ip != service.spec.cluster_ip
    replaced = core.replace_namespaced_service(
        "web", "default", {"metadata": {"name": "web"}, "spec": {"type": "NodePort", "ports": [{"port": 80}]}}
    )
    assert replaced.spec.cluster_ip == service.spec.cluster_ip
    assert replaced.spec.ports[0].node_port == service.spec.ports[0].node_port
    headless = core.create_namespaced_service(
        "default", {"metadata": {"name": "headless"}, "spec": {"clusterIP": "None", "ports": [{"port": 1}]}}
    )
    assert headless.spec.cluster_ip == "None"


def test_namespaced_paths_and_missing_namespace(core, api_client):
    with pytest.raises(client.ApiException) as missing_namespace:
        core.create_namespaced_service("nowhere", {"metadata": {"name": "s"}, "spec": {"ports": [{"port": 1}]}})
    assert missing_namespace.value.status == 404
    core.create_namespace({"metadata": {"name": "team-a"}})
    core.create_namespaced_service("team-a", {"metadata": {"name": "s"}, "spec": {"ports": [{"port": 1}]}})
    core.create_namespaced_service("default", {"metadata": {"name": "s"}, "spec": {"ports": [{"port": 1}]}})
    everywhere = core.list_service_for_all_namespaces()
    assert sorted((s.metadata.namespace, s.metadata.name) for s in everywhere.items) == [("default", "s"), ("team-a", "s")]
    assert [s.metadata.namespace for s in core.list_namespaced_service("team-a").items] == ["team-a"]
    discovery = client.DiscoveryV1Api(api_client)
    discovery.create_namespaced_endpoint_slice(
        "team-a",
        {
            "metadata": {"name": "s-1", "labels": {"kubernetes.io/service-name": "s"}},
            "addressType": "IPv4",
            "endpoints": [{"addresses": ["10.244.1.5"], "conditions": {"ready": True}}],
            "ports": [{"port": 8080, "protocol": "TCP"}],
        },
    )
    slices = discovery.list_endpoint_slice_for_all_namespaces(label_selector="kubernetes.io/service-name=s")
    assert [s.endpoints[0].addresses for s in slices.items] == [["10.244.1.5"]]
    core.delete_namespace("team-a")
    assert [s.metadata.namespace for s in core.list_service_for_all_namespaces().items] == ["default"]
    assert discovery.list_endpoint_slice_for_all_namespaces().items == []


# ---------------------------------------------------------------------------------------------
# list: paging and selectors
# ---------------------------------------------------------------------------------------------
def test_paging_serves_a_consistent_snapshot(core, server):
    for index in range(25):
        server.create(node(f"n{index:02d}"))
    first = core.list_node(limit=10)
    assert len(first.items) == 10 and first.metadata.remaining_item_count == 15
    server.create(node("n99"))
    server.delete(NODES, "n20")
    second = core.list_node(limit=10, _continue=first.metadata._continue)
    third = core.list_node(limit=10, _continue=second.metadata._continue)
    assert third.metadata._continue is None
    names = [n.metadata.name for page in (first, second, third) for n in page.items]
    assert names == [f"n{index:02d}" for index in range(25)]
    assert second.metadata.resource_version == first.metadata.resource_version


def test_an_expired_continue_token_is_410(core, server):
    for index in range(5):
        server.create(node(f"n{index}"))
    first = core.list_node(limit=2)
    server.compact()
    with pytest.raises(client.ApiException) as expired:
        core.list_node(limit=2, _continue=first.metadata._continue)
    assert expired.value.status == 410
    assert json.loads(expired.value.body)["reason"] == "Expired"


@pytest.mark.parametrize(
    "selector, expected",
    [
        ("", ["a", "b", "c", "d"]),
        ("tier=web", ["a", "b"]),
        ("tier==web", ["a", "b"]),
        ("tier!=web", ["c", "d"]),
        ("tier in (web, db)", ["a", "b", "c"]),
        ("tier notin (web)", ["c", "d"]),
        ("zone", ["a", "c"]),
        ("!zone", ["b", "d"]),
        ("tier=web,zone=z1", ["a"]),
        ("tier in (web,db),!zone", ["b"]),
        ("rank>2", ["c"]),
    ],
)
def test_label_selectors(core, server, selector, expected):
    server.create(node("a", tier="web", zone="z1", rank="1"))
    server.create(node("b", tier="web"))
    server.create(node("c", tier="db", zone="z2", rank="5"))
    server.create(node("d"))
    assert [n.metadata.name for n in core.list_node(label_selector=selector).items] == expected


def test_bad_label_selector_is_400():
    with pytest.raises(ApiError) as bad:
        LabelSelector.parse("tier in web")
    assert bad.value.code == 400


def test_field_selectors_and_unknown_field_is_400(core, server):
    server.create(node("a"))
    server.create(node("b"))
    assert [n.metadata.name for n in core.list_node(field_selector="metadata.name=b").items] == ["b"]
    assert [n.metadata.name for n in core.list_node(field_selector="metadata.name!=b").items] == ["a"]
    with pytest.raises(client.ApiException) as unknown:
        core.list_node(field_selector="spec.podCIDR=10.0.0.0/24")
    assert unknown.value.status == 400


# ---------------------------------------------------------------------------------------------
# persistence and the command line
# ---------------------------------------------------------------------------------------------
def test_state_file_survives_a_restart_and_the_resource_version_continues(tmp_path):
    state = str(tmp_path / "state.json")
    with ApiServer(state_file=state) as first:
        first.start()
        first.create(node("n1", kept="yes"))
        last = first.resource_version
    second = ApiServer(state_file=state)
    second.start()
    try:
        api_client = client.ApiClient(client.Configuration(host=second.url))
        core = client.CoreV1Api(api_client)
        assert core.read_node("n1").metadata.labels == {"kept": "yes"}
        assert core.list_node().metadata.resource_version == str(last)
        created = core.create_node(node("n2"))
        assert int(created.metadata.resource_version) == last + 1
        with pytest.raises(client.ApiException) as expired:
            for _ in watch.Watch().stream(core.list_node, resource_version=str(last - 1), timeout_seconds=2):
                pass
        assert expired.value.status == 410
        api_client.close()
    finally:
        second.stop()


def run_cli(*args: str) -> tuple[subprocess.Popen, str]:
    process = subprocess.Popen(
        [sys.executable, "-m", "lab.apiserver", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
    )
    line = process.stdout.readline().strip()
    assert line.startswith("listening http://"), (line, process.stderr.read() if process.poll() is not None else "")
    return process, line.split(" ", 1)[1]


def test_cli_over_a_unix_socket_loses_no_write_when_killed_and_exits_cleanly_on_sigterm(tmp_path):
    state = str(tmp_path / "state.json")
    socket_path = str(tmp_path / "api.sock")
    process, url = run_cli("--listen", "127.0.0.1:0", "--unix", socket_path, "--state", state)
    try:
        lab = LabApiClient(unix_path=socket_path)
        lab.apply(node("n1"))
        lab.apply({**node("n1", updated="yes")})
    finally:
        process.kill()
        process.wait()
    process, url = run_cli("--listen", "127.0.0.1:0", "--unix", socket_path, "--state", state)
    try:
        lab = LabApiClient(url=url)
        assert lab.get("v1", "Node", "n1")["metadata"]["labels"] == {"updated": "yes"}
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 0  # generous: it writes its state and exits under a loaded CI
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    with open(state) as handle:
        assert [o["metadata"]["name"] for o in json.load(handle)["objects"] if o["kind"] == "Node"] == ["n1"]
    assert not os.path.exists(socket_path)


def test_lab_client_verbs_and_errors(server):
    lab = LabApiClient(url=server.url)
    service = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web"}, "spec": {"ports": [{"port": 80}]}}
    created = lab.apply(service)
    assert created["metadata"]["namespace"] == "default"
    applied = lab.apply({**service, "spec": {"ports": [{"name": "http", "port": 80}, {"name": "https", "port": 443}]}})
    assert applied["spec"]["clusterIP"] == created["spec"]["clusterIP"]
    assert len(lab.get("v1", "Service", "web")["spec"]["ports"]) == 2
    patched = lab.patch("v1", "Service", "web", {"metadata": {"labels": {"a": "b"}}}, patch_type=PatchType.STRATEGIC)
    assert patched["metadata"]["labels"] == {"a": "b"}
    lab.create(node("n1"))
    lab.patch("v1", "Node", "n1", {"status": {"conditions": [{"type": "Ready", "status": "True"}]}}, subresource="status")
    assert server.get(NODES, "n1")["status"]["conditions"][0]["type"] == "Ready"
    assert [s["metadata"]["name"] for s in lab.list("v1", "Service")] == ["web"]
    lab.delete("v1", "Service", "web")
    with pytest.raises(LabApiError) as missing:
        lab.get("v1", "Service", "web")
    assert missing.value.code == 404 and 'services "web" not found' in str(missing.value)
    assert lab.list("discovery.k8s.io/v1", "EndpointSlice") == []
    with pytest.raises(LookupError):
        lab.create({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}})
    assert ENDPOINT_SLICES.list_path("a") == "/apis/discovery.k8s.io/v1/namespaces/a/endpointslices"


# ---------------------------------------------------------------------------------------------
# patch algorithms and client configuration
# ---------------------------------------------------------------------------------------------
def test_merge_patch_rfc7386():
    target = {"a": "b", "c": {"d": "e", "f": "g"}, "list": [1, 2]}
    patch = {"a": "z", "c": {"f": None}, "list": [3], "new": {"x": 1}}
    assert merge_patch(target, patch) == {"a": "z", "c": {"d": "e"}, "list": [3], "new": {"x": 1}}
    assert target == {"a": "b", "c": {"d": "e", "f": "g"}, "list": [1, 2]}


def test_json_patch_rfc6902_operations():
    document = {"a": {"b": [1, 2, 3]}, "c": "x"}
    patched = json_patch(
        document,
        [
            {"op": "add", "path": "/a/b/1", "value": 9},
            {"op": "add", "path": "/a/b/-", "value": 4},
            {"op": "remove", "path": "/a/b/0"},
            {"op": "replace", "path": "/c", "value": "y"},
            {"op": "copy", "from": "/c", "path": "/d"},
            {"op": "move", "from": "/d", "path": "/e~1f"},
            {"op": "test", "path": "/e~1f", "value": "y"},
        ],
    )
    assert patched == {"a": {"b": [9, 2, 3, 4]}, "c": "y", "e/f": "y"}
    assert document == {"a": {"b": [1, 2, 3]}, "c": "x"}
    for bad in ([{"op": "remove", "path": "/missing"}], [{"op": "replace", "path": "/a/b/7", "value": 1}]):
        with pytest.raises(ApiError) as error:
            json_patch(document, bad)
        assert error.value.code == 422


def test_load_api_client_errors_name_what_is_missing(tmp_path, monkeypatch):
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setattr(kube_config, "SERVICE_ACCOUNT_DIR", str(tmp_path / "sa"))
    with pytest.raises(KubeConfigError, match="KUBERNETES_SERVICE_HOST"):
        load_api_client(kubeconfig=None)
    with pytest.raises(KubeConfigError, match="does not exist"):
        load_api_client(kubeconfig=str(tmp_path / "missing"))
    broken = tmp_path / "broken"
    broken.write_text(json.dumps({"apiVersion": "v1", "kind": "Config", "clusters": [], "contexts": []}))
    with pytest.raises(KubeConfigError, match="not usable"):
        load_api_client(kubeconfig=str(broken))


def test_load_api_client_in_a_pod_uses_the_service_account(tmp_path, monkeypatch):
    account = tmp_path / "sa"
    account.mkdir()
    (account / "token").write_text("pod-token")
    (account / "ca.crt").write_text("-----BEGIN CERTIFICATE-----\n")
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    monkeypatch.setattr(kube_config, "SERVICE_ACCOUNT_DIR", str(account))
    with load_api_client(kubeconfig=None) as api_client:
        configuration = api_client.configuration
        assert configuration.host == "https://10.96.0.1:443"
        assert configuration.api_key["BearerToken"] == "bearer pod-token"
        assert configuration.ssl_ca_cert == str(account / "ca.crt")


def test_load_api_client_reads_kubeconfig_from_the_environment(server, tmp_path, monkeypatch):
    monkeypatch.setenv("KUBECONFIG", write_kubeconfig(tmp_path / "env-kubeconfig", server.url))
    with load_api_client(kubeconfig=None) as api_client:
        assert api_client.configuration.host == server.url
        assert client.CoreV1Api(api_client).list_namespace().items

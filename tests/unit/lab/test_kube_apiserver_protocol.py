"""The lab API server's Kubernetes behaviours that kubectl relies on, checked over plain HTTP.

Strategic merge patch directives, dry runs, list resourceVersion semantics, Tables, OpenAPI,
protobuf bodies, discovery, the `default/kubernetes` Service: each as the real server answers.
"""
from __future__ import annotations

import json
import time
import urllib.error
import urllib.request

import pytest

from lab.apiserver import ApiError, ApiServer
from lab.apiserver.protobuf import decode_object
from lab.apiserver.strategic import strategic_merge_patch
from netagent.kube.config import PatchType
from netagent.kube.resources import ENDPOINT_SLICES, ENDPOINTS, NAMESPACES, SERVICES

# `kubectl create namespace foo` (v1.37) as it went over the wire (-v=8)
NAMESPACE_FOO_PROTOBUF = bytes.fromhex(
    "6b3873000a0f0a02763112094e616d657370616365121b0a130a03666f6f12001a0022002a00320038004200"
    "12001a020a001a002200")


@pytest.fixture
def server(lab_api_server):
    return lab_api_server


def http(server: ApiServer, method: str, path: str, body: object = None, *, content_type: str = "application/json",
         accept: str = "application/json") -> tuple[int, dict]:
    data = body if isinstance(body, bytes) else None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(server.url + path, data=data, method=method,
                                     headers={"Content-Type": content_type, "Accept": accept})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def service(name: str, *ports: int) -> dict:
    return {"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "namespace": "default"},
            "spec": {"selector": {"app": name}, "ports": [{"name": f"p{p}", "port": p} for p in ports]}}


def test_strategic_merge_patch_obeys_every_directive():
    pod = {"metadata": {"name": "p", "finalizers": ["a"]},
           "spec": {"containers": [{"name": "app", "image": "v1", "env": [{"name": "A", "value": "1"}]},
                                   {"name": "side", "image": "s"}],
                    "tolerations": [{"key": "x"}],
                    "volumes": [{"name": "data", "emptyDir": {}}]}}
    patched = strategic_merge_patch("Pod", pod, {
        "metadata": {"finalizers": ["b", "a"], "$deleteFromPrimitiveList/finalizers": ["a"]},
        "spec": {
            "$setElementOrder/containers": [{"name": "side"}, {"name": "app"}],
            "containers": [{"name": "app", "env": [{"name": "B", "value": "2"}]},
                           {"name": "gone", "$patch": "delete"}],
            "tolerations": [{"key": "y"}],  # no patch strategy: replaced
            "volumes": [{"name": "data", "hostPath": {"path": "/d"}, "$retainKeys": ["name", "hostPath"]}],
        }})
    assert patched["metadata"]["finalizers"] == ["b"]
    assert [c["name"] for c in patched["spec"]["containers"]] == ["side", "app"]
    assert patched["spec"]["containers"][1] == {
        "name": "app", "image": "v1", "env": [{"name": "A", "value": "1"}, {"name": "B", "value": "2"}]}
    assert patched["spec"]["tolerations"] == [{"key": "y"}]
    assert patched["spec"]["volumes"] == [{"name": "data", "hostPath": {"path": "/d"}}]
    replaced = strategic_merge_patch("Pod", pod, {"spec": {"containers": [{"$patch": "replace"},
                                                                          {"name": "only", "image": "o"}]}})
    assert replaced["spec"]["containers"] == [{"name": "only", "image": "o"}]
    whole = strategic_merge_patch("Pod", pod, {"spec": {"$patch": "replace", "containers": []}})
    assert whole["spec"] == {"containers": []}
    gone = strategic_merge_patch("Pod", pod, {"spec": {"volumes": [{"name": "data", "$patch": "delete"}]}})
    assert gone["spec"]["volumes"] == []
    with pytest.raises(ApiError) as bad:
        strategic_merge_patch("Pod", pod, {"spec": {"containers": [{"image": "no-name"}]}})
    assert bad.value.code == 400


def test_strategic_patch_over_http_merges_service_ports_by_port(server):
    server.create(service("web", 80, 443))
    status, patched = http(server, "PATCH", "/api/v1/namespaces/default/services/web",
                           {"spec": {"ports": [{"port": 80, "name": "http"}, {"port": 8080, "name": "alt"}]}},
                           content_type=PatchType.STRATEGIC.value)
    assert status == 200
    assert [(p["name"], p["port"]) for p in patched["spec"]["ports"]] == [("http", 80), ("p443", 443), ("alt", 8080)]


def test_dry_run_runs_every_check_and_stores_nothing(server):
    revision = server.resource_version
    status, created = http(server, "POST", "/api/v1/namespaces/default/services?dryRun=All", service("web", 80))
    assert status == 201 and created["spec"]["clusterIP"] and "resourceVersion" not in created["metadata"]
    assert server.list(SERVICES) == [] and server.resource_version == revision
    real = server.create(service("web", 80))
    assert real["spec"]["clusterIP"] == created["spec"]["clusterIP"]  # the dry run gave its address back
    status, _ = http(server, "PUT", "/api/v1/namespaces/default/services/web?dryRun=All",
                     {**real, "spec": {**real["spec"], "ports": [{"port": 0}]}})
    assert status == 422
    status, _ = http(server, "DELETE", "/api/v1/namespaces/default/services/web", {"dryRun": ["All"]})
    assert status == 200 and server.get(SERVICES, "web", namespace="default") == real
    assert http(server, "DELETE", "/api/v1/namespaces/default/services/web?dryRun=Some")[0] == 400


def test_list_resource_version_semantics(server):
    server.create(service("a", 80))
    between = server.resource_version
    server.create(service("b", 80))
    server.delete(SERVICES, "a", namespace="default")
    path = "/api/v1/namespaces/default/services"
    status, exact = http(server, "GET", f"{path}?resourceVersion={between}&resourceVersionMatch=Exact")
    assert status == 200 and exact["metadata"]["resourceVersion"] == str(between)
    assert [s["metadata"]["name"] for s in exact["items"]] == ["a"]
    _, latest = http(server, "GET", f"{path}?resourceVersion={between}&resourceVersionMatch=NotOlderThan")
    assert [s["metadata"]["name"] for s in latest["items"]] == ["b"]
    status, too_new = http(server, "GET", f"{path}?resourceVersion={server.resource_version + 10}")
    assert (status, too_new["details"]["causes"][0]["reason"]) == (504, "ResourceVersionTooLarge")
    assert http(server, "GET", f"{path}?resourceVersionMatch=Exact")[0] == 422  # ListOptions invalid, as the real one
    server.compact()
    assert http(server, "GET", f"{path}?resourceVersion={between}&resourceVersionMatch=Exact")[0] == 410


def test_tables_carry_the_real_columns_and_object_metadata(server):
    server.create({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "default"},
                   "spec": {"nodeName": "n1", "containers": [{"name": "c", "image": "i"}]},
                   "status": {"phase": "Pending", "podIP": "10.244.0.9"}})
    status, table = http(server, "GET", "/api/v1/namespaces/default/pods",
                         accept="application/json;as=Table;v=v1;g=meta.k8s.io,application/json")
    assert status == 200 and table["kind"] == "Table"
    assert [(c["name"], c["priority"]) for c in table["columnDefinitions"]] == [
        ("Name", 0), ("Ready", 0), ("Status", 0), ("Restarts", 0), ("Age", 0), ("IP", 1), ("Node", 1),
        ("Nominated Node", 1), ("Readiness Gates", 1)]
    assert table["rows"][0]["cells"][:3] + table["rows"][0]["cells"][5:7] == ["p", "0/1", "Pending", "10.244.0.9",
                                                                              "n1"]
    assert table["rows"][0]["object"]["kind"] == "PartialObjectMetadata"
    _, plain = http(server, "GET", "/api/v1/namespaces/default/pods?fieldSelector=status.podIP%3D10.244.0.9")
    assert [p["metadata"]["name"] for p in plain["items"]] == ["p"]


def test_openapi_v3_is_generated_with_kinds_patch_strategies_and_query_parameters(server):
    status, index = http(server, "GET", "/openapi/v3")
    assert status == 200 and set(index["paths"]) == {"api/v1", "apis/discovery.k8s.io/v1", "apis/networking.k8s.io/v1"}
    _, core = http(server, "GET", index["paths"]["api/v1"]["serverRelativeURL"])
    schemas = core["components"]["schemas"]
    assert schemas["io.k8s.api.core.v1.Service"]["x-kubernetes-group-version-kind"] == [
        {"group": "", "version": "v1", "kind": "Service"}]
    ports = schemas["io.k8s.api.core.v1.ServiceSpec"]["properties"]["ports"]
    assert (ports["x-kubernetes-patch-merge-key"], ports["x-kubernetes-patch-strategy"]) == ("port", "merge")
    assert "port" in schemas["io.k8s.api.core.v1.ServicePort"]["required"]
    assert "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta" in schemas
    patch = core["paths"]["/api/v1/namespaces/{namespace}/services/{name}"]["patch"]
    assert {"dryRun", "fieldValidation"} <= {p["name"] for p in patch["parameters"]}
    status, v2 = http(server, "GET", "/openapi/v2")
    assert status == 200 and "io.k8s.api.discovery.v1.EndpointSlice" in v2["definitions"]
    request = urllib.request.Request(server.url + "/openapi/v2", headers={
        "Accept": "application/com.github.proto-openapi.spec.v2@v1.0+protobuf"})
    with urllib.request.urlopen(request, timeout=10) as response:  # gnostic's Document: swagger = 1, ...
        assert response.read(5) == b"\x0a\x032.0"


def test_strict_field_validation_and_pruning(server):
    body = service("web", 80)
    body["spec"]["portz"] = 1
    status, refused = http(server, "POST", "/api/v1/namespaces/default/services?fieldValidation=Strict", body)
    assert (status, refused["message"]) == (400, 'strict decoding error: unknown field "spec.portz"')
    status, created = http(server, "POST", "/api/v1/namespaces/default/services?fieldValidation=Ignore", body)
    assert status == 201 and "portz" not in created["spec"]


def test_protobuf_bodies_of_kubectl_create_are_decoded(server):
    assert decode_object(NAMESPACE_FOO_PROTOBUF) == {"apiVersion": "v1", "kind": "Namespace",
                                                    "metadata": {"name": "foo"}}
    status, created = http(server, "POST", "/api/v1/namespaces", NAMESPACE_FOO_PROTOBUF,
                           content_type="application/vnd.kubernetes.protobuf")
    assert status == 201 and created["metadata"]["labels"] == {"kubernetes.io/metadata.name": "foo"}
    assert server.get(NAMESPACES, "foo")["spec"] == {"finalizers": ["kubernetes"]}
    status, refused = http(server, "POST", "/api/v1/namespaces", b"not protobuf",
                           content_type="application/vnd.kubernetes.protobuf")
    assert status == 400 and "magic number" in refused["message"]
    status, refused = http(server, "POST", "/api/v1/namespaces", b"x", content_type="text/plain")
    assert status == 415


def test_server_side_apply_needs_a_manager_and_keeps_other_writers_fields(server):
    applied_yaml = b"apiVersion: v1\nkind: Service\nmetadata: {name: web}\nspec: {ports: [{name: a, port: 80}]}\n"
    path = "/api/v1/namespaces/default/services/web"
    assert http(server, "PATCH", path, applied_yaml, content_type="application/apply-patch+yaml")[0] == 400
    status, created = http(server, "PATCH", path + "?fieldManager=ci", applied_yaml,
                           content_type="application/apply-patch+yaml")
    assert status == 201 and created["metadata"]["managedFields"][0]["manager"] == "ci"
    status, merged = http(server, "PATCH", path + "?fieldManager=other",
                          {"spec": {"ports": [{"port": 81, "name": "b"}]}},
                          content_type=PatchType.STRATEGIC.value)
    assert [p["port"] for p in merged["spec"]["ports"]] == [80, 81]
    owners = {e["manager"]: e["fieldsV1"] for e in merged["metadata"]["managedFields"]}
    assert set(owners) == {"ci", "other"} and 'k:{"port":81,"protocol":"TCP"}' in owners["other"]["f:spec"]["f:ports"]
    status, reapplied = http(server, "PATCH", path + "?fieldManager=ci",
                             applied_yaml.replace(b"port: 80", b"port: 82"),
                             content_type="application/apply-patch+yaml")
    assert status == 200 and [p["port"] for p in reapplied["spec"]["ports"]] == [81, 82]  # 80 was ci's alone


def test_invalid_lists_every_field_as_a_cause(server):
    status, refused = http(server, "POST", "/api/v1/namespaces/default/services",
                           {**service("web"), "spec": {"ports": [{"port": 0, "name": "a"}, {"port": 1, "name": "a"}]}})
    assert status == 422
    assert [(c["reason"], c["field"]) for c in refused["details"]["causes"]] == [
        ("FieldValueInvalid", "spec.ports[0].port"), ("FieldValueInvalid", "spec.ports[0].targetPort"),
        ("FieldValueDuplicate", "spec.ports[1].name")]


def test_discovery_advertises_the_reached_address_and_a_current_version(server):
    _, api = http(server, "GET", "/api")
    assert api["serverAddressByClientCIDRs"][0]["serverAddress"] == server.server_address
    _, version = http(server, "GET", "/version")
    assert (version["major"], version["minor"]) == ("1", "37")
    _, core = http(server, "GET", "/api/v1")
    by_name = {r["name"]: r for r in core["resources"]}
    assert (by_name["services"]["shortNames"], by_name["services"]["categories"]) == (["svc"], ["all"])
    assert by_name["events"]["shortNames"] == ["ev"] and "pods/status" in by_name


def test_the_kubernetes_service_points_at_the_advertised_address():
    with ApiServer(advertise=("198.18.16.1", 6443)) as api_server:
        kubernetes = api_server.get(SERVICES, "kubernetes", namespace="default")
        assert kubernetes["spec"]["clusterIP"] == "10.96.0.1"
        assert kubernetes["spec"]["ports"] == [{"name": "https", "port": 443, "protocol": "TCP", "targetPort": 6443}]
        endpoints = api_server.get(ENDPOINTS, "kubernetes", namespace="default")
        assert endpoints["subsets"] == [{"addresses": [{"ip": "198.18.16.1"}],
                                         "ports": [{"name": "https", "port": 6443, "protocol": "TCP"}]}]
        endpoint_slice = api_server.get(ENDPOINT_SLICES, "kubernetes", namespace="default")
        assert endpoint_slice["endpoints"][0]["addresses"] == ["198.18.16.1"]
        assert api_server.create(service("web", 80))["spec"]["clusterIP"] != "10.96.0.1"


def test_endpoints_mirror_restates_a_selector_services_slices(server):
    from lab.apiserver.endpoints_mirror import EndpointsMirror

    server.create(service("web", 80))
    server.create({"apiVersion": "v1", "kind": "Endpoints", "metadata": {"name": "manual", "namespace": "default"},
                   "subsets": [{"addresses": [{"ip": "192.0.2.1"}]}]})
    server.create({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
                   "metadata": {"name": "web-1", "namespace": "default", "labels": {
                       "kubernetes.io/service-name": "web"}},
                   "addressType": "IPv4", "ports": [{"name": "p80", "port": 8080, "protocol": "TCP"}],
                   "endpoints": [
                       {"addresses": ["10.244.0.7"], "conditions": {"ready": True}, "nodeName": "n1",
                        "targetRef": {"kind": "Pod", "name": "a", "namespace": "default"}},
                       {"addresses": ["10.244.0.5"], "conditions": {"ready": False}},
                       {"addresses": ["10.244.0.6"], "conditions": {"ready": False, "terminating": True}}]})
    mirror = EndpointsMirror(server.store)
    mirror.start()
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not server.store.find(ENDPOINTS, "web", namespace="default"):
            time.sleep(0.01)
        mirror.sync_all()
        endpoints = server.get(ENDPOINTS, "web", namespace="default")
        assert endpoints["metadata"]["labels"] == {"endpointslice.kubernetes.io/skip-mirror": "true"}
        assert endpoints["subsets"] == [{
            "addresses": [{"ip": "10.244.0.7", "nodeName": "n1",
                           "targetRef": {"kind": "Pod", "name": "a", "namespace": "default"}}],
            "notReadyAddresses": [{"ip": "10.244.0.5"}],
            "ports": [{"name": "p80", "port": 8080, "protocol": "TCP"}]}]
        server.delete(SERVICES, "web", namespace="default")
        deadline = time.monotonic() + 30  # a fresh wait, not what the first one left
        while time.monotonic() < deadline and server.store.find(ENDPOINTS, "web", namespace="default"):
            time.sleep(0.01)
        assert [e["metadata"]["name"] for e in server.list(ENDPOINTS)] == ["manual"]  # hand-written: kept
    finally:
        mirror.stop()


def test_list_option_errors_are_the_real_servers(server):
    """What tests/kubernetes/test_api_parity.py found the real kube-apiserver answers."""
    path = "/api/v1/nodes"
    for query, cause in (("resourceVersionMatch=NotOlderThan", "FieldValueForbidden"),
                         ("resourceVersion=0&resourceVersionMatch=Exact", "FieldValueForbidden"),
                         ("resourceVersion=1&resourceVersionMatch=Sometime", "FieldValueNotSupported")):
        status, refused = http(server, "GET", f"{path}?{query}")
        assert (status, refused["reason"], refused["details"]["kind"]) == (422, "Invalid", "ListOptions")
        assert [(c["field"], c["reason"]) for c in refused["details"]["causes"]] == [("resourceVersionMatch", cause)]
    for query, field in (("watch=true&resourceVersion=0&resourceVersionMatch=NotOlderThan", "resourceVersionMatch"),
                         ("watch=true&sendInitialEvents=true", "resourceVersionMatch"),
                         ("sendInitialEvents=true", "sendInitialEvents")):
        status, refused = http(server, "GET", f"{path}?{query}")
        assert (status, refused["reason"]) == (422, "Invalid")
        assert [c["field"] for c in refused["details"]["causes"]] == [field]
    status, refused = http(server, "GET", f"{path}?resourceVersion=abc")
    assert (status, refused["reason"]) == (400, "BadRequest") and 'Invalid value: "abc"' in refused["message"]
    status, refused = http(server, "GET", f"{path}?watch=true&resourceVersion=abc")
    assert status == 500 and "reason" not in refused and 'Invalid value: "abc"' in refused["message"]


def test_remaining_item_count_only_without_selectors(server):
    for name in ("a", "b", "c"):
        server.create({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": {"x": "y"}}})
    _, plain = http(server, "GET", "/api/v1/nodes?limit=1")
    assert plain["metadata"]["remainingItemCount"] == 2
    _, selected = http(server, "GET", "/api/v1/nodes?limit=1&labelSelector=x%3Dy")
    assert selected["metadata"]["continue"] and "remainingItemCount" not in selected["metadata"]
    _, whole = http(server, "GET", "/api/v1/nodes?limit=1&resourceVersion=0")  # "0": the real one's cache, unpaged
    assert len(whole["items"]) == 3 and "continue" not in whole["metadata"]


def test_a_bookmark_comes_two_seconds_before_a_watch_times_out(lab_api_servers):
    server = lab_api_servers(bookmark_interval=60.0)
    start = server.resource_version
    server.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "elsewhere"}})  # news for it
    started = time.monotonic()
    with urllib.request.urlopen(f"{server.url}/api/v1/nodes?watch=true&allowWatchBookmarks=true&timeoutSeconds=3"
                                f"&resourceVersion={start}", timeout=30) as response:
        first = response.readline()
        arrived = time.monotonic() - started
        rest = response.read()
    assert json.loads(first)["type"] == "BOOKMARK" and 0.5 < arrived < 2.9 and rest == b""


def test_no_bookmark_repeats_the_revision_a_watcher_has(lab_api_servers):
    server = lab_api_servers(bookmark_interval=0.2)
    start = server.resource_version
    server.create({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n"}})
    with urllib.request.urlopen(f"{server.url}/api/v1/nodes?watch=true&allowWatchBookmarks=true&timeoutSeconds=1"
                                f"&resourceVersion={start}", timeout=30) as response:
        assert [json.loads(line)["type"] for line in response.read().splitlines()] == ["ADDED"]

"""`lab apply -f` / `lab delete -f`: parsing and checking manifests, then applying them over HTTP."""
from __future__ import annotations

import pytest

from lab.apiclient import LabApiClient
from lab.apiserver import ApiServer
from lab.manifests import Action, ManifestError, apply_manifests, delete_manifests, load_manifests
from netagent.kube.resources import ENDPOINT_SLICES, SERVICES

WEB = """\
apiVersion: v1
kind: Namespace
metadata:
  name: shop
---
apiVersion: v1
kind: Service
metadata:
  name: web
  namespace: shop
spec:
  type: NodePort
  selector: {app: web}
  ports:
  - name: http
    port: 80
    targetPort: http
---
# a comment-only document is skipped
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: web-extra
  namespace: shop
  labels: {kubernetes.io/service-name: web}
addressType: IPv4
endpoints:
- addresses: [192.0.2.10]
ports:
- {name: http, port: 8080, protocol: TCP}
"""


@pytest.fixture
def client():
    with ApiServer() as api:
        api.start()
        yield LabApiClient(url=api.url)


def described(outcomes) -> list[str]:
    return [outcome.describe() for outcome in outcomes]


def test_documents_and_lists_are_read_in_order():
    objects = load_manifests(WEB, source="web.yaml")
    assert [(o["kind"], o["metadata"]["name"]) for o in objects] == [
        ("Namespace", "shop"), ("Service", "web"), ("EndpointSlice", "web-extra")]
    listed = load_manifests('{"apiVersion": "v1", "kind": "List", "items": [{"apiVersion": "v1", "kind": "Service",'
                            ' "metadata": {"name": "a"}, "spec": {"ports": [{"port": 1}]}}]}', source="list.json")
    assert [o["metadata"]["name"] for o in listed] == ["a"]


@pytest.mark.parametrize(("text", "message"), [
    ("kind: Service\nmetadata: {name: [unclosed\n", "bad.yaml: malformed YAML"),
    ("apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: web}\n",
     "bad.yaml: document 1: unsupported kind apps/v1 Deployment (the lab applies: v1 Namespace, "
     "networking.k8s.io/v1 NetworkPolicy, v1 Service, discovery.k8s.io/v1 EndpointSlice)"),
    ("apiVersion: v1\nkind: Pod\nmetadata: {name: web}\n", "create it with `netagent lab pod add NAME"),
    ("apiVersion: v1\nkind: Service\nmetadata: {namespace: default}\n", "document 1: Service needs metadata.name"),
    ("apiVersion: v1\nkind: Service\n", "document 1: Service needs metadata.name"),
    ("- just\n- a list\n", "document 1: expected an object (a mapping), got list"),
    ("metadata: {name: x}\n", "document 1: apiVersion and kind are required"),
    ("", "bad.yaml: no objects in the input"),
    ("apiVersion: v1\nkind: List\nitems: {}\n", "a List's items must be a list"),
    ("apiVersion: v1\nkind: Service\nmetadata: {name: a, annotations: {when: 2024-01-01}}\n", "quote dates"),
])
def test_bad_input_is_refused_with_its_place(text, message):
    with pytest.raises(ManifestError) as error:
        load_manifests(text, source="bad.yaml")
    assert message in str(error.value)


def test_a_bad_later_document_stops_everything_before_any_write(client):
    with pytest.raises(ManifestError, match="document 2"):
        load_manifests(WEB.split("---")[1] + "---\napiVersion: v1\nkind: Secret\nmetadata: {name: s}\n", source="x")
    assert client.list("v1", "Service", namespace="default") == []


def test_apply_creates_then_keeps_server_fields_and_reports_like_kubectl(client):
    objects = load_manifests(WEB, source="web.yaml")
    assert described(apply_manifests(client, objects)) == [
        "namespace/shop created", "service/web -n shop created", "endpointslice/web-extra -n shop created"]
    created = client.get("v1", "Service", "web", namespace="shop")
    assert described(apply_manifests(client, objects)) == [
        "namespace/shop unchanged", "service/web -n shop unchanged", "endpointslice/web-extra -n shop unchanged"]
    changed = load_manifests(WEB.replace("port: 80", "port: 81"), source="web.yaml")
    assert described(apply_manifests(client, changed))[1] == "service/web -n shop configured"
    now = client.get("v1", "Service", "web", namespace="shop")
    assert now["spec"]["clusterIP"] == created["spec"]["clusterIP"]
    assert now["spec"]["ports"][0]["port"] == 81 and now["spec"]["ports"][0]["nodePort"] > 0


def test_a_status_in_the_manifest_is_applied_too(client):
    balancer = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "lb"},
                "spec": {"type": "LoadBalancer", "ports": [{"port": 80}]},
                "status": {"loadBalancer": {"ingress": [{"ip": "203.0.113.50"}]}}}
    apply_manifests(client, [balancer])
    assert client.get("v1", "Service", "lb")["status"] == balancer["status"]
    balancer["status"] = {"loadBalancer": {"ingress": [{"ip": "203.0.113.51"}]}}
    assert described(apply_manifests(client, [balancer])) == ["service/lb -n default configured"]
    assert client.get("v1", "Service", "lb")["status"] == balancer["status"]


def test_a_refused_object_is_reported_and_the_others_still_apply(client):
    good = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "good"}, "spec": {"ports": [{"port": 80}]}}
    bad = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "bad"},
           "spec": {"type": "NodePort", "ports": [{"port": 80, "nodePort": 99}]}}
    elsewhere = {**good, "metadata": {"name": "lost", "namespace": "nowhere"}}
    outcomes = apply_manifests(client, [bad, good, elsewhere])
    assert [o.action for o in outcomes] == [Action.FAILED, Action.CREATED, Action.FAILED]
    assert "422 Invalid" in outcomes[0].error and "spec.ports[0].nodePort" in outcomes[0].error
    assert "404 NotFound" in outcomes[2].error
    assert [s["metadata"]["name"] for s in client.list("v1", "Service")] == ["good"]


def test_delete_removes_in_reverse_order_and_absent_is_fine(client):
    objects = load_manifests(WEB, source="web.yaml")
    apply_manifests(client, objects)
    assert described(delete_manifests(client, objects)) == [
        "endpointslice/web-extra -n shop deleted", "service/web -n shop deleted", "namespace/shop deleted"]
    assert described(delete_manifests(client, objects)) == [
        "endpointslice/web-extra -n shop not found", "service/web -n shop not found", "namespace/shop not found"]
    assert not any(o.failed for o in delete_manifests(client, objects))


def test_in_process_server_sees_the_applied_objects():
    with ApiServer() as api:
        api.start()
        apply_manifests(LabApiClient(url=api.url), load_manifests(WEB, source="web.yaml"))
        assert [s["metadata"]["name"] for s in api.list(SERVICES)] == ["web"]
        assert [s["metadata"]["name"] for s in api.list(ENDPOINT_SLICES)] == ["web-extra"]


ISOLATION = """\
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: from-blue, namespace: team-a}
spec:
  podSelector: {matchLabels: {app: web}}
  ingress:
  - from:
    - namespaceSelector: {matchLabels: {team: blue}}
---
apiVersion: v1
kind: Namespace
metadata:
  name: team-a
  labels: {team: blue}
"""


def test_network_policies_and_labelled_namespaces_apply_namespace_first(client):
    objects = load_manifests(ISOLATION, source="policy.yaml")
    assert described(apply_manifests(client, objects)) == [
        "namespace/team-a created", "networkpolicy/from-blue -n team-a created"]
    assert client.get("v1", "Namespace", "team-a")["metadata"]["labels"] == {"team": "blue", "kubernetes.io/metadata.name": "team-a"}
    stored = client.get("networking.k8s.io/v1", "NetworkPolicy", "from-blue", namespace="team-a")
    assert stored["spec"]["ingress"] == [{"from": [{"namespaceSelector": {"matchLabels": {"team": "blue"}}}]}]
    assert described(apply_manifests(client, objects)) == [
        "namespace/team-a unchanged", "networkpolicy/from-blue -n team-a unchanged"]
    assert described(delete_manifests(client, objects)) == [
        "networkpolicy/from-blue -n team-a deleted", "namespace/team-a deleted"]

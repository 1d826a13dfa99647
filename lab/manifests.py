"""`netagent lab apply -f` and `lab delete -f`: Kubernetes manifests in, API writes out, as kubectl.

Input is YAML (JSON is YAML): several documents separated by `---`, or a `v1` `List` (any
`*List` kind) whose `items` are objects. Kinds: `v1` Service, `discovery.k8s.io/v1`
EndpointSlice, `v1` Namespace (with its labels, for policies' namespaceSelectors) and
`networking.k8s.io/v1` NetworkPolicy. Pods are refused with a pointer to `lab pod add`: a lab
pod is a network namespace the lab wires, not an object one can post.

The whole input is read and checked (YAML syntax, kinds, names) before anything is written,
so a malformed file changes nothing. Each object is then one write on its own, kinds in the
order Namespaces, NetworkPolicies, Services, EndpointSlices (the reverse to delete; file order within a kind),
and reported like kubectl:
`service/web created`, `configured`, `unchanged`; `deleted` or `not found` (not an error).
An object the server refuses (422 Invalid, ...) is reported with the server's message and
the others still go ahead; the command then exits non-zero.

Apply is create-or-replace: an existing object gets the manifest's content with the fields
the server assigned kept (clusterIP, node ports, healthCheckNodePort: the server keeps them
when the manifest leaves them out), not kubectl's three-way merge; fields others added and
the manifest lacks are dropped. A `status` in the manifest is written too (the lab has no
cloud controller: that is how a LoadBalancer Service gets `status.loadBalancer.ingress`).
"""
from __future__ import annotations

import enum
import json
from dataclasses import dataclass

import yaml

from lab.apiclient import LabApiClient, LabApiError
from netagent.kube.resources import resource_for

NAMESPACE = ("v1", "Namespace")
SERVICE = ("v1", "Service")
ENDPOINT_SLICE = ("discovery.k8s.io/v1", "EndpointSlice")
NETWORK_POLICY = ("networking.k8s.io/v1", "NetworkPolicy")
APPLY_ORDER = (NAMESPACE, NETWORK_POLICY, SERVICE, ENDPOINT_SLICE)


class ManifestError(Exception):
    """The input cannot be applied at all; nothing was written."""


class Action(enum.Enum):
    CREATED = "created"
    CONFIGURED = "configured"
    UNCHANGED = "unchanged"
    DELETED = "deleted"
    NOT_FOUND = "not found"
    FAILED = "failed"


@dataclass(frozen=True)
class Outcome:
    kind: str
    namespace: str | None
    name: str
    action: Action
    error: str | None = None

    @property
    def failed(self) -> bool:
        return self.error is not None

    def describe(self) -> str:
        where = f" -n {self.namespace}" if self.namespace else ""
        text = f"{self.kind.lower()}/{self.name}{where} {self.action.value}"
        return f"{text}: {self.error}" if self.error else text


def _checked(document: object, *, where: str) -> dict:
    if not isinstance(document, dict):
        raise ManifestError(f"{where}: expected an object (a mapping), got {type(document).__name__}")
    api_version, kind = document.get("apiVersion"), document.get("kind")
    if not api_version or not kind:
        raise ManifestError(f"{where}: apiVersion and kind are required")
    if (api_version, kind) == ("v1", "Pod"):
        raise ManifestError(f"{where}: Pods are not applied from manifests in the lab: a lab pod is a network "
                            "namespace; create it with `netagent lab pod add NAME --labels k=v --ports name=port`")
    if (api_version, kind) not in APPLY_ORDER:
        known = ", ".join(f"{v} {k}" for v, k in APPLY_ORDER)
        raise ManifestError(f"{where}: unsupported kind {api_version} {kind} (the lab applies: {known})")
    metadata = document.get("metadata")
    if not isinstance(metadata, dict) or not isinstance(metadata.get("name"), str) or not metadata["name"]:
        raise ManifestError(f"{where}: {kind} needs metadata.name")
    namespace = metadata.get("namespace")
    if namespace is not None and (not isinstance(namespace, str) or not namespace):
        raise ManifestError(f"{where}: metadata.namespace must be a non-empty string")
    return json.loads(json.dumps(document))  # plain JSON data (YAML dates and the like become errors here)


def load_manifests(text: str, *, source: str) -> list[dict]:
    """Every object in `text`, checked; ManifestError names the source and document."""
    try:
        documents = list(yaml.safe_load_all(text))
    except yaml.YAMLError as error:
        raise ManifestError(f"{source}: malformed YAML: {error}") from None
    objects: list[dict] = []
    for index, document in enumerate(documents, start=1):
        if document is None:
            continue
        where = f"{source}: document {index}"
        if isinstance(document, dict) and str(document.get("kind", "")).endswith("List") and "items" in document:
            items = document.get("items")
            if not isinstance(items, list):
                raise ManifestError(f"{where}: a List's items must be a list")
            for position, item in enumerate(items):
                objects.append(_checked_json(item, where=f"{where} item {position}"))
        else:
            objects.append(_checked_json(document, where=where))
    if not objects:
        raise ManifestError(f"{source}: no objects in the input")
    return objects


def _checked_json(document: object, *, where: str) -> dict:
    try:
        return _checked(document, where=where)
    except TypeError as error:  # json.dumps refusing a YAML timestamp or set
        raise ManifestError(f"{where}: not plain JSON data ({error}); quote dates and times") from None


def _locate(obj: dict) -> tuple[str, str | None, str]:
    metadata = obj["metadata"]
    namespace = None if obj["kind"] == "Namespace" else metadata.get("namespace") or "default"
    return obj["kind"], namespace, metadata["name"]


def _ordered(objects: list[dict], *, reverse: bool) -> list[dict]:
    rank = {key: index for index, key in enumerate(APPLY_ORDER)}
    return sorted(objects, key=lambda o: rank[(o["apiVersion"], o["kind"])], reverse=reverse)


def _apply_one(client: LabApiClient, obj: dict) -> Action:
    try:
        client.create(obj)
        return Action.CREATED
    except LabApiError as error:
        if error.code != 409 or error.reason != "AlreadyExists":
            raise
    kind, namespace, name = _locate(obj)
    current = client.get(obj["apiVersion"], kind, name, namespace=namespace)
    before = current["metadata"]["resourceVersion"]
    desired = json.loads(json.dumps(obj))
    desired["metadata"]["resourceVersion"] = before
    if kind == "Namespace" and "spec" not in desired and "spec" in current:
        desired["spec"] = current["spec"]  # the server's default (finalizers), as a merge would keep it
    replaced = client.replace(desired)
    if kind == "Service" and "status" in obj and obj["status"] != replaced.get("status"):
        desired["metadata"]["resourceVersion"] = replaced["metadata"]["resourceVersion"]
        path = resource_for(obj["apiVersion"], kind).object_path(name, namespace) + "/status"
        replaced = client.request("PUT", path, body=desired)
    return Action.UNCHANGED if replaced["metadata"]["resourceVersion"] == before else Action.CONFIGURED


def _failure(kind: str, namespace: str | None, name: str, error: LabApiError) -> Outcome:
    return Outcome(kind, namespace, name, Action.FAILED, error=f"{error.code} {error.reason}: {error.message}")


def apply_manifests(client: LabApiClient, objects: list[dict]) -> list[Outcome]:
    outcomes = []
    for obj in _ordered(objects, reverse=False):
        kind, namespace, name = _locate(obj)
        try:
            outcomes.append(Outcome(kind, namespace, name, _apply_one(client, obj)))
        except LabApiError as error:
            outcomes.append(_failure(kind, namespace, name, error))
    return outcomes


def delete_manifests(client: LabApiClient, objects: list[dict]) -> list[Outcome]:
    outcomes = []
    for obj in _ordered(objects, reverse=True):
        kind, namespace, name = _locate(obj)
        try:
            client.delete(obj["apiVersion"], kind, name, namespace=namespace)
            outcomes.append(Outcome(kind, namespace, name, Action.DELETED))
        except LabApiError as error:
            if error.code == 404:
                outcomes.append(Outcome(kind, namespace, name, Action.NOT_FOUND))
            else:
                outcomes.append(_failure(kind, namespace, name, error))
    return outcomes

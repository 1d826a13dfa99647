"""What a write stores: the per-resource rules the real server's registry strategies apply.

Given a request body (and for updates the stored object), these functions decide the object
the store will write, or refuse with the real server's error: the body must be the
resource's kind and carry object metadata; the namespace comes from the path or the body and
they must agree; names are DNS subdomains (or generated from `generateName`); the server
owns uid, creationTimestamp, generation (for the kinds that have one), resourceVersion and
the deletion fields; an update keeps the half of the object its subresource does not own
(`status` for the main resource of the resources with a `/status`; the spec for `/status`,
whose writes change the status and the metadata, labels and annotations included, as the real
status strategies do: flannel and netagent annotate their Node so) and bumps `generation` when the spec changes; empty labels, annotations,
finalizers and owner references are not stored (Go's `omitempty`); namespaces carry the
`kubernetes.io/metadata.name` label and the `kubernetes` finalizer; a stale resourceVersion
precondition is 409 Conflict; Services are defaulted, validated and given their addresses
(`service_spec.py`, 422 Invalid otherwise); a pod deleted with a grace period is only
marked. They hold no state of their own: the store calls them under its lock, with its
`ServiceAddresses`, and does the writing.
"""
from __future__ import annotations

import json
import random
import re
import time
import uuid

from lab.apiserver.errors import bad_request, conflict, invalid
from lab.apiserver.kinds import kind_of
from lab.apiserver.objects import STATUS_SUBRESOURCE, Subresource, bare
from lab.service_spec import InvalidService, ServiceAddresses
from netagent.kube.resources import NAMESPACES, PODS, SERVICES, Resource
from netagent.policy.model import NAMESPACE_NAME_LABEL

_OMITTED_WHEN_EMPTY = ("labels", "annotations", "finalizers", "ownerReferences")  # Go's omitempty: never stored empty
_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")
_GENERATE_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def request_object(resource: Resource, body: object) -> dict:
    """The object a create/update/patch body proposes, without kind/apiVersion, metadata copied."""
    if not isinstance(body, dict):
        raise bad_request("the request body must be a JSON object")
    for field, expected in (("kind", resource.kind), ("apiVersion", resource.api_version)):
        if body.get(field) not in (None, "", expected):
            raise bad_request(f"{field} {body.get(field)!r} does not belong at {resource.plural} ({expected})")
    metadata = body.get("metadata") or {}
    if not isinstance(metadata, dict):
        raise bad_request("metadata must be an object")
    metadata = {k: v for k, v in metadata.items() if k not in _OMITTED_WHEN_EMPTY or v not in (None, {}, [])}
    return {**bare(body), "metadata": metadata}


def namespace_for_write(resource: Resource, metadata: dict, *, path_namespace: str | None) -> str | None:
    """The object's namespace (set in `metadata`), or None for a cluster-scoped resource."""
    if not resource.namespaced:
        metadata.pop("namespace", None)
        return None
    given = metadata.get("namespace")
    if given and path_namespace and given != path_namespace:
        raise bad_request(
            f"the namespace of the object ({given}) does not match the namespace of the request ({path_namespace})"
        )
    namespace = path_namespace or given
    if not namespace:
        raise bad_request(f"{resource.plural} are namespaced: the request needs a namespace")
    metadata["namespace"] = namespace
    return namespace


def generated_name(prefix: str) -> str:
    """A candidate name for `generateName`; the store retries until it is free."""
    return prefix + "".join(random.choices(_GENERATE_ALPHABET, k=5))


def check_name(resource: Resource, name: object) -> None:
    if not isinstance(name, str) or not _NAME.match(name):
        raise invalid(resource, str(name), f"metadata.name: Invalid value: {json.dumps(name)}: a lowercase RFC 1123 "
                      "subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start "
                      "and end with an alphanumeric character")


def _complete_service(services: ServiceAddresses, name: str, spec: dict, *, old_spec: dict | None) -> dict:
    try:
        return services.complete(spec, old_spec=old_spec)
    except InvalidService as error:
        raise invalid(SERVICES, name, error.errors) from None


def prepare_for_create(resource: Resource, obj: dict, *, services: ServiceAddresses) -> None:
    """Set the server's metadata and the resource's defaults on a new, named object (in place)."""
    metadata = obj["metadata"]
    for server_owned in ("resourceVersion", "deletionTimestamp", "deletionGracePeriodSeconds", "selfLink"):
        metadata.pop(server_owned, None)
    metadata["uid"] = str(uuid.uuid4())
    metadata["creationTimestamp"] = _now()
    if kind_of(resource).generation:
        metadata["generation"] = 1
    else:
        metadata.pop("generation", None)
    if resource is SERVICES:
        obj["spec"] = _complete_service(services, metadata["name"], obj.get("spec") or {}, old_spec=None)
        obj.setdefault("status", {"loadBalancer": {}})
    elif resource is NAMESPACES:
        spec = dict(obj.get("spec") or {})
        finalizers = list(spec.get("finalizers") or [])
        if "kubernetes" not in finalizers:
            finalizers.append("kubernetes")
        obj["spec"] = {**spec, "finalizers": finalizers}
        obj["status"] = {"phase": "Active"}
    _label_namespace(resource, metadata)


def _label_namespace(resource: Resource, metadata: dict) -> None:
    """Namespaces always carry kubernetes.io/metadata.name = their name (the real server sets it on every write)."""
    if resource is NAMESPACES:
        metadata["labels"] = {**(metadata.get("labels") or {}), NAMESPACE_NAME_LABEL: metadata["name"]}


def prepare_for_update(
    resource: Resource, old: dict, *, proposed: dict, part: Subresource, services: ServiceAddresses
) -> dict:
    """What an update of `old` to `proposed` stores: the server's fields and the other half kept."""
    name = old["metadata"]["name"]
    if part is Subresource.STATUS:
        # As the real status strategies: the spec (everything but metadata and status) is the
        # stored one, the status and the metadata (labels, annotations) are the request's; a
        # pod's ownerReferences stay. flannel and netagent write Node annotations this way.
        new = {k: v for k, v in old.items() if k not in ("metadata", "status")}
        if proposed.get("status") is not None:
            new["status"] = proposed["status"]
        proposed = {**new, "metadata": dict(proposed.get("metadata") or {})}
        if resource is PODS:
            _keep_field(proposed["metadata"], old["metadata"], "ownerReferences")
    else:
        new = {k: v for k, v in proposed.items() if k != "status"}
        if resource in STATUS_SUBRESOURCE:
            if "status" in old:
                new["status"] = old["status"]
        elif "status" in proposed:
            new["status"] = proposed["status"]
    metadata = dict(proposed.get("metadata") or {})
    if metadata.get("name", name) != name:
        given = json.dumps(metadata.get("name"))
        raise invalid(resource, name, f"metadata.name: Invalid value: {given}: field is immutable")
    for kept in ("name", "namespace", "uid", "creationTimestamp", "generation", "resourceVersion",
                 "deletionTimestamp", "deletionGracePeriodSeconds"):
        if kept in old["metadata"]:
            metadata[kept] = old["metadata"][kept]
        else:
            metadata.pop(kept, None)
    new["metadata"] = metadata
    _label_namespace(resource, metadata)
    if resource is SERVICES and part is Subresource.MAIN:
        new["spec"] = _complete_service(services, name, new.get("spec") or {}, old_spec=old.get("spec") or {})
    outside = lambda o: {k: v for k, v in o.items() if k not in ("metadata", "status")}  # noqa: E731
    if outside(new) != outside(old) and "generation" in metadata:
        metadata["generation"] = int(old["metadata"].get("generation", 1)) + 1
    return new


def _keep_field(metadata: dict, old_metadata: dict, field: str) -> None:
    if field in old_metadata:
        metadata[field] = old_metadata[field]
    else:
        metadata.pop(field, None)


def check_precondition(resource: Resource, old: dict, *, proposed: dict) -> None:
    """A resourceVersion in the proposed object must be the stored one (409 Conflict otherwise)."""
    given = (proposed.get("metadata") or {}).get("resourceVersion")
    current = old["metadata"]["resourceVersion"]
    if given not in (None, "") and str(given) != current:
        raise conflict(resource, old["metadata"]["name"], given=str(given), current=current)


def marked_for_deletion(pod: dict, grace_period_seconds: int) -> dict:
    """What the real server does for a pod deleted with a grace period: set the deadline
    (`deletionTimestamp`) and leave the removal to the kubelet."""
    deadline = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + grace_period_seconds))
    metadata = {
        **pod["metadata"],
        "deletionTimestamp": deadline,
        "deletionGracePeriodSeconds": grace_period_seconds,
        "generation": int(pod["metadata"].get("generation", 1)) + 1,
    }
    return {**pod, "metadata": metadata}

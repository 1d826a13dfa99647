"""The kinds this server serves: ONE table, read by routing, discovery, the store, OpenAPI and Tables.

Each `Kind` says what kubectl learns of a resource from a real server: its group, version,
plural and scope (the `Resource`), its short names and categories (`get svc`, `get all`),
whether it has a `/status` subresource and a `metadata.generation`, the field labels its field selectors accept beyond
metadata.name/metadata.namespace, and the `kubernetes` client model that describes it (the
OpenAPI documents are generated from those models). Adding a kind is one entry in `KINDS`
(plus, where the kind has printer columns, one entry in `tables.py`). A resource listed in
`kube.resources.ALL_RESOURCES` but missing here is still served, with no short names,
categories or extra field labels, so the agent's own list of resources and this table
cannot drift apart into a 404.
"""
from __future__ import annotations

from dataclasses import dataclass

from netagent.kube.resources import (
    ALL_RESOURCES,
    CONFIG_MAPS,
    ENDPOINT_SLICES,
    ENDPOINTS,
    NAMESPACES,
    NETWORK_POLICIES,
    NODES,
    PODS,
    SERVICES,
    Resource,
)

EVENTS = Resource("", "v1", "events", namespaced=True, kind="Event")


@dataclass(frozen=True)
class Kind:
    resource: Resource
    short_names: tuple[str, ...] = ()
    categories: tuple[str, ...] = ()
    status: bool = False  # has a /status subresource (main writes keep status, /status keeps the rest)
    field_labels: tuple[str, ...] = ()  # field selector labels beyond metadata.name/metadata.namespace
    model: str = ""  # the `kubernetes.client.models` class of its objects ("" : V1<Kind>)
    generation: bool = False  # metadata.generation kept (1, bumped when the spec changes)

    @property
    def model_name(self) -> str:
        return self.model or f"V1{self.resource.kind}"


_EVENT_FIELDS = tuple(
    f"involvedObject.{f}" for f in ("kind", "namespace", "name", "uid", "apiVersion", "resourceVersion", "fieldPath")
) + ("reason", "reportingComponent", "source", "type")

KINDS: tuple[Kind, ...] = (
    Kind(NAMESPACES, ("ns",), status=True, field_labels=("status.phase",)),
    Kind(NODES, ("no",), status=True, field_labels=("spec.unschedulable",)),
    Kind(PODS, ("po",), ("all",), status=True, generation=True,
         field_labels=("spec.nodeName", "spec.restartPolicy", "spec.schedulerName", "spec.serviceAccountName",
                       "spec.hostNetwork", "status.phase", "status.podIP", "status.nominatedNodeName")),
    Kind(SERVICES, ("svc",), ("all",), status=True, field_labels=("spec.clusterIP", "spec.type")),
    Kind(ENDPOINTS, ("ep",)),
    Kind(ENDPOINT_SLICES, generation=True),
    Kind(EVENTS, ("ev",), field_labels=_EVENT_FIELDS, model="CoreV1Event"),
    Kind(NETWORK_POLICIES, ("netpol",), generation=True),
    Kind(CONFIG_MAPS, ("cm",)),   # the BGP backend's topology (`lab --mode bgp` publishes it)
)

_LISTED = {kind.resource for kind in KINDS}
SERVED: tuple[Kind, ...] = KINDS + tuple(Kind(r) for r in ALL_RESOURCES if r not in _LISTED)
RESOURCES: tuple[Resource, ...] = tuple(kind.resource for kind in SERVED)
BY_RESOURCE: dict[Resource, Kind] = {kind.resource: kind for kind in SERVED}
_BY_TYPE = {(r.api_version, r.kind): r for r in RESOURCES}


def kind_of(resource: Resource) -> Kind:
    return BY_RESOURCE[resource]


def served_resource(api_version: str, kind: str) -> Resource:
    """The served resource of an object's apiVersion and kind (LookupError for others)."""
    try:
        return _BY_TYPE[(api_version, kind)]
    except KeyError:
        raise LookupError(f"the lab API server serves no {api_version}/{kind}") from None

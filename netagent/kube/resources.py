"""The Kubernetes API resources netagent reads, and where they live on the wire.

A `Resource` is the (group, version, plural) triple plus its scope and kind: everything a
REST path or a kubectl-style `apiVersion`/`kind` lookup needs. The reflector, the lab's API
test server and the lab's client all build paths here, so they cannot disagree. Stdlib
only: the CNI-side and lab tools import it without paying for the `kubernetes` package.
"""
from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import quote


@dataclass(frozen=True)
class Resource:
    group: str  # "" for the core API
    version: str
    plural: str
    namespaced: bool
    kind: str

    @property
    def api_version(self) -> str:
        """The `apiVersion` field of this resource's objects: "v1" or "group/version"."""
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def group_version_path(self) -> str:
        return f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"

    def list_path(self, namespace: str | None = None) -> str:
        """The collection: one namespace's, or (namespace None) the whole cluster's."""
        if namespace is None or not self.namespaced:
            return f"{self.group_version_path}/{self.plural}"
        return f"{self.group_version_path}/namespaces/{quote(namespace, safe='')}/{self.plural}"

    def object_path(self, name: str, namespace: str | None = None) -> str:
        if self.namespaced and not namespace:
            raise ValueError(f"{self.plural} are namespaced: a namespace is needed for {name!r}")
        if not name:
            raise ValueError(f"a {self.kind} needs a name")
        base = self.list_path(namespace if self.namespaced else None)
        return f"{base}/{quote(name, safe='')}"


NODES = Resource("", "v1", "nodes", namespaced=False, kind="Node")
NAMESPACES = Resource("", "v1", "namespaces", namespaced=False, kind="Namespace")
SERVICES = Resource("", "v1", "services", namespaced=True, kind="Service")
PODS = Resource("", "v1", "pods", namespaced=True, kind="Pod")
ENDPOINTS = Resource("", "v1", "endpoints", namespaced=True, kind="Endpoints")
ENDPOINT_SLICES = Resource("discovery.k8s.io", "v1", "endpointslices", namespaced=True, kind="EndpointSlice")
CONFIG_MAPS = Resource("", "v1", "configmaps", namespaced=True, kind="ConfigMap")  # --backend bgp
NETWORK_POLICIES = Resource("networking.k8s.io", "v1", "networkpolicies", namespaced=True, kind="NetworkPolicy")

ALL_RESOURCES: tuple[Resource, ...] = (NODES, NAMESPACES, SERVICES, PODS, ENDPOINTS, ENDPOINT_SLICES,
                                       NETWORK_POLICIES)

_BY_KIND = {(r.api_version, r.kind): r for r in ALL_RESOURCES}


def resource_for(api_version: str, kind: str) -> Resource:
    """The resource of an object's `apiVersion` and `kind`, like kubectl's mapping."""
    try:
        return _BY_KIND[(api_version, kind)]
    except KeyError:
        known = ", ".join(f"{v}/{k}" for v, k in sorted(_BY_KIND))
        raise LookupError(f"unknown resource {api_version}/{kind} (known: {known})") from None


def object_key(obj: dict) -> str:
    """The store key of an object: `namespace/name`, or `name` for cluster-scoped ones.
    An object with no usable name (a lax or hostile server) raises ValueError."""
    metadata = obj.get("metadata") if isinstance(obj, dict) else None
    name = metadata.get("name") if isinstance(metadata, dict) else None
    if not isinstance(name, str) or not name:
        raise ValueError("object without a usable metadata.name")
    namespace = metadata.get("namespace")  # type: ignore[union-attr]
    if namespace is not None and not isinstance(namespace, str):
        raise ValueError(f"object {name[:253]!r} with a metadata.namespace that is not a string")
    return f"{namespace}/{name}" if namespace else name

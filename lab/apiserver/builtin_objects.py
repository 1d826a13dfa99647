"""The objects a real API server keeps for itself: the `default/kubernetes` Service and its endpoints.

Every cluster has a ClusterIP Service `kubernetes` in `default` (the first address of the
service range, port 443 named https, no selector) whose endpoints are the API server's
advertised address and port, published as a v1 Endpoints and as an EndpointSlice of the
same name, as the real server's reconciler does. `ensure_kubernetes_service` creates them,
or brings them back to the advertised address after a restart (an unchanged object is not
rewritten: the store skips writes that change nothing).
"""
from __future__ import annotations

from lab.apiserver.endpoints_mirror import SKIP_MIRROR
from lab.apiserver.objects import Subresource, typed
from lab.apiserver.store import Store
from lab.service_families import parse_service_cidrs
from netagent.kernel.families import IpFamily
from netagent.kube.endpoint_slices import SERVICE_NAME_LABEL
from netagent.kube.resources import ENDPOINT_SLICES, ENDPOINTS, SERVICES, Resource

NAME, NAMESPACE = "kubernetes", "default"


def _put(store: Store, resource: Resource, obj: dict) -> None:
    existing = store.find(resource, NAME, namespace=NAMESPACE)
    if existing is None:
        store.create(resource, typed(resource, obj), namespace=NAMESPACE)
        return
    metadata = {**existing["metadata"], **obj["metadata"]}
    store.replace(resource, NAME, namespace=NAMESPACE, body=typed(resource, {**obj, "metadata": metadata}),
                  part=Subresource.MAIN)


def ensure_kubernetes_service(store: Store, *, address: str, port: int, service_cidr: str) -> None:
    """`service_cidr`: one range per family, comma-separated; the Service takes the advertised
    address's family (single stack, as the real server's own Service)."""
    family = IpFamily.of(address)
    ranges = parse_service_cidrs(service_cidr)
    cluster_ip = str(ranges.get(family, next(iter(ranges.values()))).network_address + 1)
    metadata = {"name": NAME, "namespace": NAMESPACE, "labels": {"component": "apiserver", "provider": "kubernetes"}}
    with store.lock:
        existing = store.find(SERVICES, NAME, namespace=NAMESPACE)
        spec = {"type": "ClusterIP", "ports": [{"name": "https", "port": 443, "protocol": "TCP", "targetPort": port}],
                "clusterIP": (existing or {}).get("spec", {}).get("clusterIP", cluster_ip),
                "sessionAffinity": "None", "ipFamilyPolicy": "SingleStack"}
        _put(store, SERVICES, {"metadata": metadata, "spec": spec})
        _put(store, ENDPOINTS, {
            "metadata": {**metadata, "labels": {SKIP_MIRROR: "true"}},
            "subsets": [{"addresses": [{"ip": address}],
                         "ports": [{"name": "https", "port": port, "protocol": "TCP"}]}],
        })
        _put(store, ENDPOINT_SLICES, {
            "metadata": {**metadata, "labels": {SERVICE_NAME_LABEL: NAME}},
            "addressType": family.label, "endpoints": [{"addresses": [address], "conditions": {"ready": True}}],
            "ports": [{"name": "https", "port": port, "protocol": "TCP"}],
        })

"""v1 Endpoints for every selector Service, mirrored from its EndpointSlices (what `kubectl get ep` shows).

A real cluster's endpoints controller keeps one Endpoints object per Service with a
selector; the lab's EndpointSlice controller already decides which pods back a Service, so
this one only restates its slices (those of the Service's primary family, as Kubernetes'
endpoints controller publishes one family) in the older shape: ready endpoints as `addresses`,
not-ready ones that are not terminating as `notReadyAddresses` (all of them as addresses
with `publishNotReadyAddresses`), grouped into one subset per set of ports, each address
with its node and pod reference. The objects carry the Service's labels plus
`endpointslice.kubernetes.io/skip-mirror: "true"`, as the real controller's do; that label
is also how this one knows which Endpoints are its own to delete when their Service goes.
Services without a selector (like `default/kubernetes`, whose Endpoints the server itself
writes) and hand-written Endpoints are never touched.

The shape of a controller: the store listener only records which Services an event touches
(a Service's own writes, or a slice naming it in `kubernetes.io/service-name`); a worker
thread syncs each from the current state under the store lock. `sync_all()` runs every
pending sync at once (start-up, tests).
"""
from __future__ import annotations

import logging
import threading

from lab.apiserver.errors import ApiError
from lab.apiserver.objects import Subresource, typed
from lab.apiserver.store import Store
from lab.apiserver.watch import StoreEvent
from netagent.kube.endpoint_slices import SERVICE_NAME_LABEL
from netagent.kube.resources import ENDPOINT_SLICES, ENDPOINTS, SERVICES

SKIP_MIRROR = "endpointslice.kubernetes.io/skip-mirror"
_log = logging.getLogger("lab.apiserver")


def desired_endpoints(service: dict, slices: list[dict]) -> dict:
    """The Endpoints object a selector Service's slices make (without server-owned metadata)."""
    metadata = service["metadata"]
    publish_all = bool((service.get("spec") or {}).get("publishNotReadyAddresses"))
    primary = ((service.get("spec") or {}).get("ipFamilies") or ["IPv4"])[0]
    groups: dict[tuple, tuple[list, list]] = {}
    for endpoint_slice in slices:
        if endpoint_slice.get("addressType", "IPv4") != primary:  # v1 Endpoints: the primary family only
            continue
        ports = tuple(sorted((p.get("name", ""), p["port"], p.get("protocol", "TCP"))
                             for p in endpoint_slice.get("ports") or [] if p.get("port") is not None))
        ready, not_ready = groups.setdefault(ports, ([], []))
        for endpoint in endpoint_slice.get("endpoints") or []:
            conditions = endpoint.get("conditions") or {}
            for ip in endpoint.get("addresses") or []:
                address: dict = {"ip": ip}
                for field in ("hostname", "nodeName"):
                    if endpoint.get(field):
                        address[field] = endpoint[field]
                if endpoint.get("targetRef"):
                    address["targetRef"] = endpoint["targetRef"]
                if publish_all or conditions.get("ready", True):
                    ready.append(address)
                elif not conditions.get("terminating"):
                    not_ready.append(address)
    subsets = []
    for ports, (ready, not_ready) in sorted(groups.items()):
        if not ready and not not_ready:
            continue
        subset: dict = {}
        if ready:
            subset["addresses"] = sorted(ready, key=lambda a: a["ip"])
        if not_ready:
            subset["notReadyAddresses"] = sorted(not_ready, key=lambda a: a["ip"])
        if ports:
            subset["ports"] = [{**({"name": n} if n else {}), "port": p, "protocol": proto} for n, p, proto in ports]
        subsets.append(subset)
    desired: dict = {"metadata": {"name": metadata["name"], "namespace": metadata["namespace"],
                                  "labels": {**(metadata.get("labels") or {}), SKIP_MIRROR: "true"}}}
    if subsets:
        desired["subsets"] = subsets
    return desired


class EndpointsMirror:
    def __init__(self, store: Store) -> None:
        self._store = store
        self._pending: set[tuple[str, str]] = set()
        self._changed = threading.Condition()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        with self._store.lock:
            self._store.add_listener(self._on_event)
            keys = {(s["metadata"]["namespace"], s["metadata"]["name"]) for s in self._store.items(SERVICES)}
            keys |= {(e["metadata"]["namespace"], e["metadata"]["name"]) for e in self._store.items(ENDPOINTS)}
        with self._changed:
            self._pending |= keys
        self._thread = threading.Thread(target=self._run, name="lab-endpoints-mirror", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._store.remove_listener(self._on_event)
        self._stopping.set()
        with self._changed:
            self._changed.notify()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _on_event(self, event: StoreEvent) -> None:
        metadata = event.obj["metadata"]
        if event.resource is SERVICES:
            key = (metadata["namespace"], metadata["name"])
        elif event.resource is ENDPOINT_SLICES and (metadata.get("labels") or {}).get(SERVICE_NAME_LABEL):
            key = (metadata["namespace"], metadata["labels"][SERVICE_NAME_LABEL])
        else:
            return
        with self._changed:
            self._pending.add(key)
            self._changed.notify()

    def _run(self) -> None:
        while not self._stopping.is_set():
            with self._changed:
                while not self._pending and not self._stopping.is_set():
                    self._changed.wait()
            self.sync_all()

    def sync_all(self) -> None:
        with self._changed:
            keys, self._pending = self._pending, set()
        for key in sorted(keys):
            try:
                self._sync(*key)
            except ApiError as error:  # the server is stopping, or a namespace went meanwhile
                _log.debug("endpoints of %s/%s not synced: %s", *key, error.message)

    def _sync(self, namespace: str, name: str) -> None:
        store = self._store
        with store.lock:
            service = store.find(SERVICES, name, namespace=namespace)
            existing = store.find(ENDPOINTS, name, namespace=namespace)
            ours = existing is not None and (existing["metadata"].get("labels") or {}).get(SKIP_MIRROR) == "true"
            if service is None:
                if ours:
                    store.delete(ENDPOINTS, name, namespace=namespace)
                return
            if not (service.get("spec") or {}).get("selector"):
                return  # its Endpoints are someone else's to write
            slices = [s for s in store.items(ENDPOINT_SLICES, namespace=namespace)
                      if (s["metadata"].get("labels") or {}).get(SERVICE_NAME_LABEL) == name]
            desired = typed(ENDPOINTS, desired_endpoints(service, slices))
            if existing is None:
                store.create(ENDPOINTS, desired, namespace=namespace)
            elif ours:
                desired["metadata"] = {**existing["metadata"], "labels": desired["metadata"]["labels"]}
                store.replace(ENDPOINTS, name, namespace=namespace, body=desired, part=Subresource.MAIN)

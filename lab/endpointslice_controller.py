"""The lab's EndpointSlice controller: keeps every selector Service's slices in line with its pods.

It runs inside the API server process (`python -m lab.apiserver
--endpointslice-controller`, which the lab starts), so it lives exactly as long as the API
server: it keeps running after any `netagent lab` command ends and comes back with the
server, starting with a full sync of every Service (and of managed slices whose Service is
gone).

It works directly on the server's store rather than through HTTP with the project's
Reflector, on purpose: in the same process, the store calls a listener synchronously, under
its lock, for every write, so the controller sees each change in order, exactly once, with
no list/watch/relist machinery to get wrong; it reads a consistent state under that lock
and writes through the store's own create/replace/delete, so its slices are validated,
versioned, journaled and watched like any client's. A reflector would cost the server
process the `kubernetes` client import (a second of start-up) and an HTTP round trip per
write, and buy nothing the store does not already guarantee.

The shape is a Kubernetes controller's: the listener only records (which Services an
event touches, and when), a worker thread syncs each touched Service from the current
state (`endpointslices.py` decides, this module applies). Which events touch a Service:
its own changes; a pod of its namespace whose labels match its selector before or after;
any node change (zones); a change to one of its managed slices made by someone else
(repaired back). The controller's own slice writes are not fed back to it.

`endpoints.kubernetes.io/last-change-trigger-time` on a written slice is the time of the
earliest pod or Service change not yet published for that Service (the store's write time,
taken by the listener), which is what a proxy's network-programming latency is measured
from. Repairs (a slice changed by someone else, the start-up sync) carry no trigger time.

Deletions: a deleted Service's managed slices are deleted (the garbage collector's job in
Kubernetes, through ownerReferences). Unlike Kubernetes, a Service that loses its selector
(or becomes ExternalName) also loses its managed slices, which would otherwise go stale;
slices users wrote themselves are never touched.
"""
from __future__ import annotations

import collections
import datetime
import logging
import threading
from collections.abc import Callable

from lab import endpointslices
from lab.apiserver import ApiError, StoreEvent, Subresource
from netagent.infra.clock import Clock, MonotonicClock
from netagent.kube.resources import ENDPOINT_SLICES, NODES, PODS, SERVICES

_log = logging.getLogger("lab.endpointslice_controller")

ServiceKey = tuple[str, str]  # (namespace, name)


def format_trigger_time(timestamp: float) -> str:
    """RFC 3339 in UTC with microseconds, as the annotation carries it."""
    moment = datetime.datetime.fromtimestamp(timestamp, tz=datetime.timezone.utc)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _pod_view(pod: dict | None) -> tuple:
    """What of a pod can change its endpoints."""
    if pod is None:
        return ()
    metadata, spec, status = pod["metadata"], pod.get("spec") or {}, pod.get("status") or {}
    return (metadata.get("labels"), metadata.get("deletionTimestamp"), spec.get("nodeName"),
            spec.get("containers"), spec.get("hostname"), spec.get("subdomain"),
            status.get("podIP"), status.get("podIPs"), status.get("phase"),
            endpointslices.pod_is_ready(pod), metadata.get("uid"))


class EndpointSliceController:
    """`start()`/`stop()` run it on a thread; tests may instead `attach()` and `run_pending()`."""

    def __init__(
        self,
        store,
        *,
        max_endpoints_per_slice: int = endpointslices.MAX_ENDPOINTS_PER_SLICE,
        clock: Clock | None = None,
        retry_delay: float = 0.5,
    ) -> None:
        self._store = store
        self._max_per_slice = max_endpoints_per_slice
        self._clock: Clock = clock if clock is not None else MonotonicClock()
        self._retry_delay = retry_delay
        self._changed = threading.Condition()
        self._events: collections.deque[tuple[StoreEvent, float]] = collections.deque()
        self._pending: dict[ServiceKey, float | None] = {}  # Service -> earliest unpublished change
        self._full_sync_wanted = False
        self._attached = False
        self._writing = threading.local()
        # the managed slices by Service and back; changed and read under the store lock only
        self._slices_by_service: dict[ServiceKey, set[str]] = {}
        self._service_of_slice: dict[tuple[str, str], ServiceKey] = {}
        self._busy = False
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self.syncs = 0
        self.writes = 0
        self.failures = 0

    # -- life cycle ------------------------------------------------------------------------------
    def attach(self) -> None:
        """Listen to the store and queue a full sync (the start-up one)."""
        if self._attached:
            return
        with self._store.lock:
            self._store.add_listener(self._on_event)
            for endpoint_slice in self._store.items(ENDPOINT_SLICES):
                self._index(endpoint_slice, present=True)
        self._attached = True
        with self._changed:
            self._full_sync_wanted = True
            self._changed.notify()

    def detach(self) -> None:
        if self._attached:
            self._store.remove_listener(self._on_event)
            self._attached = False

    def start(self) -> None:
        if self._thread is not None:
            raise RuntimeError("the controller runs once")
        self.attach()
        self._thread = threading.Thread(target=self._run, name="endpointslice-controller", daemon=True)
        self._thread.start()

    def stop(self, *, timeout: float = 5.0) -> None:
        self._stopping.set()
        with self._changed:
            self._changed.notify()
        if self._thread is not None:
            self._thread.join(timeout)
        self.detach()

    def idle(self) -> bool:
        """Nothing recorded and not yet synced (for tests that wait on the thread)."""
        with self._changed:
            return not (self._events or self._pending or self._full_sync_wanted or self._busy)

    # -- the listener (store lock held: record and return) ---------------------------------------
    def _on_event(self, event: StoreEvent) -> None:
        if event.resource is ENDPOINT_SLICES:
            self._index(event.obj, present=event.type != "DELETED")
            if getattr(self._writing, "active", False):
                return  # our own write
        if event.resource not in (SERVICES, PODS, NODES, ENDPOINT_SLICES):
            return
        with self._changed:
            self._events.append((event, self._clock.wall()))
            self._changed.notify()

    def _index(self, endpoint_slice: dict, *, present: bool) -> None:
        metadata = endpoint_slice["metadata"]
        slice_key = (metadata.get("namespace", ""), metadata["name"])
        previous = self._service_of_slice.pop(slice_key, None)
        if previous is not None:
            names = self._slices_by_service[previous]
            names.discard(slice_key[1])
            if not names:
                del self._slices_by_service[previous]
        service = endpointslices.service_of(endpoint_slice)
        if present and service and endpointslices.is_managed(endpoint_slice):
            key = (slice_key[0], service)
            self._slices_by_service.setdefault(key, set()).add(slice_key[1])
            self._service_of_slice[slice_key] = key

    # -- the worker ------------------------------------------------------------------------------
    def _run(self) -> None:
        while not self._stopping.is_set():
            with self._changed:
                while not (self._events or self._pending or self._full_sync_wanted or self._stopping.is_set()):
                    self._changed.wait()
            if self._stopping.is_set():
                return
            if self.run_pending():
                self._stopping.wait(self._retry_delay)

    def run_pending(self) -> int:
        """Sync every Service touched since the last call; returns how many syncs failed (they stay queued)."""
        with self._changed:
            events = list(self._events)
            self._events.clear()
            full = self._full_sync_wanted
            self._full_sync_wanted = False
            self._busy = True
        try:
            touched = self._touched(events, full=full)
            with self._changed:
                for key, at in touched.items():
                    self._merge_pending(key, at)
                pending = self._pending
                self._pending = {}
            failed = 0
            for key, at in sorted(pending.items()):
                if self._stopping.is_set():
                    break
                try:
                    self._sync(key, trigger_time=at)
                except ApiError as error:
                    if error.code == 503:  # the server is stopping
                        return 0
                    failed += self._failed(key, at, error)
                except Exception as error:  # noqa: BLE001 (a bug on one Service must not stop the others)
                    failed += self._failed(key, at, error)
            return failed
        finally:
            with self._changed:
                self._busy = False

    def _failed(self, key: ServiceKey, at: float | None, error: Exception) -> int:
        self.failures += 1
        _log.warning("syncing the EndpointSlices of %s/%s failed: %s; retrying", key[0], key[1], error,
                     exc_info=not isinstance(error, ApiError))
        with self._changed:
            self._merge_pending(key, at)
        return 1

    def _merge_pending(self, key: ServiceKey, at: float | None) -> None:
        if key not in self._pending:
            self._pending[key] = at
        elif at is not None:
            current = self._pending[key]
            self._pending[key] = at if current is None else min(current, at)

    def _touched(self, events: list[tuple[StoreEvent, float]], *, full: bool) -> dict[ServiceKey, float | None]:
        touched: dict[ServiceKey, float | None] = {}

        def touch(key: ServiceKey, at: float | None) -> None:
            earlier = touched.get(key)
            if key not in touched or earlier is None:
                touched[key] = at
            elif at is not None:
                touched[key] = min(earlier, at)

        with self._store.lock:
            if full:
                for service in self._store.items(SERVICES):
                    touch((service["metadata"].get("namespace", ""), service["metadata"]["name"]), None)
                for key in list(self._slices_by_service):
                    touch(key, None)
            for event, at in events:
                self._touched_by(event, at, touch)
        return touched

    def _touched_by(self, event: StoreEvent, at: float, touch: Callable[[ServiceKey, float | None], None]) -> None:
        obj, prev = event.obj, event.prev
        namespace = obj["metadata"].get("namespace", "")
        if event.resource is SERVICES:
            if event.type == "MODIFIED" and prev is not None and prev.get("spec") == obj.get("spec") and (
                prev["metadata"].get("labels") == obj["metadata"].get("labels")
                and prev["metadata"].get("uid") == obj["metadata"].get("uid")
            ):
                return  # status only
            touch((namespace, obj["metadata"]["name"]), at)
        elif event.resource is PODS:
            if event.type == "MODIFIED" and _pod_view(prev) == _pod_view(obj):
                return
            label_sets = [obj["metadata"].get("labels"), (prev or {}).get("metadata", {}).get("labels")]
            for service in self._store.items(SERVICES, namespace=namespace):
                if not endpointslices.selects_pods(service):
                    continue
                selector = service["spec"]["selector"]
                if any(endpointslices.selector_matches(selector, labels) for labels in label_sets):
                    touch((namespace, service["metadata"]["name"]), at)
        elif event.resource is NODES:
            if event.type == "MODIFIED" and prev is not None and (
                (prev["metadata"].get("labels") or {}).get(endpointslices.ZONE_LABEL)
                == (obj["metadata"].get("labels") or {}).get(endpointslices.ZONE_LABEL)
            ):
                return
            for service in self._store.items(SERVICES):
                if endpointslices.selects_pods(service):
                    touch((service["metadata"].get("namespace", ""), service["metadata"]["name"]), at)
        elif event.resource is ENDPOINT_SLICES:
            for version in (obj, prev):
                owner = endpointslices.service_of(version) if version is not None else None
                if version is not None and endpointslices.is_managed(version) and owner:
                    touch((namespace, owner), None)

    # -- one Service -----------------------------------------------------------------------------
    def _sync(self, key: ServiceKey, *, trigger_time: float | None) -> None:
        namespace, name = key
        store = self._store
        with store.lock:
            self.syncs += 1
            existing = [
                found
                for slice_name in sorted(self._slices_by_service.get(key, ()))
                if (found := store.find(ENDPOINT_SLICES, slice_name, namespace=namespace)) is not None
            ]
            service = store.find(SERVICES, name, namespace=namespace)
            if service is None or not endpointslices.selects_pods(service):
                plan = endpointslices.SlicePlan(delete=[s["metadata"]["name"] for s in existing])
            else:
                nodes = {node["metadata"]["name"]: node for node in store.items(NODES)}
                pods = store.items(PODS, namespace=namespace)
                families = endpointslices.service_families(service)
                plan = endpointslices.SlicePlan(delete=[s["metadata"]["name"] for s in existing if s.get(
                    "addressType") not in {family.label for family in families}])
                for family in families:   # one set of slices per family, as Kubernetes' controller
                    planned = endpointslices.plan_slices(
                        service, endpointslices.desired_endpoints(service, pods, nodes, family=family),
                        [s for s in existing if s.get("addressType") == family.label],
                        max_per_slice=self._max_per_slice, family=family,
                        trigger_time=format_trigger_time(trigger_time) if trigger_time is not None else None,
                    )
                    plan.create += planned.create
                    plan.update += planned.update
                    plan.delete += planned.delete
            self._apply(plan, namespace=namespace)

    def _apply(self, plan: endpointslices.SlicePlan, *, namespace: str) -> None:
        self._writing.active = True
        try:
            for body in plan.create:
                self._store.create(ENDPOINT_SLICES, body, namespace=namespace)
                self.writes += 1
            for body in plan.update:
                self._store.replace(ENDPOINT_SLICES, body["metadata"]["name"], namespace=namespace, body=body,
                                    part=Subresource.MAIN)
                self.writes += 1
            for name in plan.delete:
                self._store.delete(ENDPOINT_SLICES, name, namespace=namespace)
                self.writes += 1
        finally:
            self._writing.active = False

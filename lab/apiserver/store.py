"""The object store: every object, the resourceVersion counter, the event history, the watchers.

One global revision counter, like etcd's: every write takes the next revision, and a write
that changes nothing takes none and makes no event, as on the real server. All writes go
through `_write`, under one re-entrant lock, which in that order: stores the new object,
appends the event to the bounded history, queues it to the resource's watch streams, calls
the in-process listeners (the lab's EndpointSlice controller: they see every write in
order, under the lock, and must only record) and journals it (`persistence.py`). What a
write stores is decided by `strategy.py` (and `strategic.py`, `apply.py`, `validation.py`
for what a patch, an apply or unknown fields make of it); this module keeps the state
consistent. `request_options` runs one request's writes with its options: a dry run (every
check, nothing written, address allocations given back), its field validation, its manager.

Reads: `list` serves pages (`limit`/`continue`) from a consistent snapshot kept for the
continue token (an unknown or evicted token is 410 Expired), at a resourceVersion when asked
(`Exact` is rebuilt from the history; "0" ignores `limit`; `remainingItemCount` only without
selectors; misused
`resourceVersionMatch` is the real 422 on ListOptions, an unparsable resourceVersion its 400
for a list and bare 500 for a watch). A watch starts from the history (`open_watch`): a
resourceVersion older than the history is 410 Expired, one newer than the counter waits for
it (no error, as the real server); "" or "0" (or sendInitialEvents) starts with ADDED for every
current object. Deleting a namespace deletes what is in it at once (no Terminating phase).
`items`/`find` hand in-process callers the stored objects themselves (read-only).
"""
from __future__ import annotations

import base64
import builtins
import collections
import contextlib
import copy
import json
import logging
import threading
import uuid
from collections.abc import Callable, Iterator

from lab.apiserver import strategy
from lab.apiserver.apply import server_side_apply, track_update
from lab.apiserver.errors import (
    ApiError,
    already_exists,
    bad_request,
    expired,
    invalid,
    invalid_list_options,
    invalid_resource_version,
    not_found,
    too_large_resource_version,
)
from lab.apiserver.kinds import RESOURCES, served_resource
from lab.apiserver.objects import Subresource, bare, typed
from lab.apiserver.patch import json_patch, merge_patch
from lab.apiserver.persistence import StateFile
from lab.apiserver.selectors import Filter
from lab.apiserver.strategic import strategic_merge_patch
from lab.apiserver.validation import FieldValidation, checked_fields
from lab.apiserver.watch import StoreEvent, WatchStream, event_line
from lab.service_spec import ServiceAddresses
from netagent.kube.config import PatchType
from netagent.kube.resources import NAMESPACES, PODS, SERVICES, Resource

_log = logging.getLogger("lab.apiserver")

INITIAL_NAMESPACES = ("default", "kube-system", "kube-public", "kube-node-lease")
SNAPSHOTS_KEPT = 64


class Store:
    def __init__(self, *, history: int, state: StateFile | None, service_cidr: str) -> None:
        self.lock = threading.RLock()
        self.revision = 0
        self.objects: dict[Resource, dict[tuple[str, str], dict]] = {r: {} for r in RESOURCES}
        self.history: collections.deque[StoreEvent] = collections.deque()
        self.history_limit = history
        self.floor = 0  # every event newer than this revision is still in `history`
        self.watches: dict[Resource, set[WatchStream]] = {r: set() for r in RESOURCES}
        self.snapshots: collections.OrderedDict[str, tuple[int, builtins.list[dict]]] = collections.OrderedDict()
        self.service_addresses = ServiceAddresses(service_cidr)
        self.listeners: builtins.list[Callable[[StoreEvent], None]] = []
        self.state = state
        self.closed = False
        self.dry_run_depth = 0  # > 0 while a dryRun=All request runs (under the lock): nothing is written
        self.validation = FieldValidation.WARN  # what unknown fields get (the request's, under the lock)
        self.manager = ""  # the request's field manager (managedFields of server-side applied objects)
        if state is not None:
            self.revision, loaded = state.load()
            for typed_object in loaded.values():
                resource = served_resource(typed_object["apiVersion"], typed_object["kind"])
                obj = bare(typed_object)
                self.objects[resource][self._key(resource, obj)] = obj
                if resource is SERVICES:
                    self.service_addresses.observe(obj)
        self.floor = self.revision
        for namespace in INITIAL_NAMESPACES:
            if ("", namespace) not in self.objects[NAMESPACES]:
                self.create(NAMESPACES, {"metadata": {"name": namespace}}, namespace=None)

    @staticmethod
    def _key(resource: Resource, obj: dict) -> tuple[str, str]:
        metadata = obj["metadata"]
        return (metadata.get("namespace", "") if resource.namespaced else "", metadata["name"])

    # -- the single write path ---------------------------------------------------------------
    def _write(
        self, resource: Resource, obj: dict, *, key: tuple[str, str], event_type: str, prev: dict | None
    ) -> dict:
        if self.closed:
            raise ApiError(503, "ServiceUnavailable", "the API server is stopping")
        if self.dry_run_depth:  # what would be stored, with the revision it has now (none when new)
            metadata = {k: v for k, v in obj["metadata"].items() if k != "resourceVersion" or prev is not None}
            return {**obj, "metadata": metadata}
        self.revision += 1
        revision = self.revision
        obj = {**obj, "metadata": {**obj["metadata"], "resourceVersion": str(revision)}}
        table = self.objects[resource]
        if event_type == "DELETED":
            del table[key]
        else:
            table[key] = obj
        event = StoreEvent(resource, obj, revision=revision, event_type=event_type, prev=prev)
        if self.history_limit <= 0:
            self.floor = revision
        else:
            while len(self.history) >= self.history_limit:
                self.floor = self.history.popleft().revision
            self.history.append(event)
        for watch in self.watches[resource]:
            watch.queue.put(event)
        for listener in self.listeners:
            try:
                listener(event)
            except Exception:  # noqa: BLE001 (a listener's bug must not fail a write already made)
                _log.exception("a store listener failed on %s %s", event_type, resource.plural)
        if self.state is not None:
            self.state.record(revision, deleted=event_type == "DELETED", typed_object=typed(resource, obj))
            if self.state.needs_snapshot(self.object_count()):
                self.state.write_snapshot(revision, self.typed_objects())
        return obj

    # -- in-process access (controllers running inside the server) ---------------------------
    def add_listener(self, listener: Callable[[StoreEvent], None]) -> None:
        """Call `listener(event)` after every write, under the store lock: record and return."""
        with self.lock:
            self.listeners.append(listener)

    def remove_listener(self, listener: Callable[[StoreEvent], None]) -> None:
        with self.lock:
            if listener in self.listeners:
                self.listeners.remove(listener)

    def items(self, resource: Resource, *, namespace: str | None = None) -> builtins.list[dict]:
        """The stored objects (shared: read-only, without kind/apiVersion), one namespace or all."""
        with self.lock:
            table = self.objects[resource]
            if namespace is None or not resource.namespaced:
                return list(table.values())
            return [obj for key, obj in table.items() if key[0] == namespace]

    def find(self, resource: Resource, name: str, *, namespace: str | None) -> dict | None:
        """The stored object (shared, read-only) or None."""
        return self.objects[resource].get(((namespace or "") if resource.namespaced else "", name))

    def object_count(self) -> int:
        return sum(len(table) for table in self.objects.values())

    def typed_objects(self) -> builtins.list[dict]:
        return [typed(r, obj) for r, table in self.objects.items() for obj in table.values()]

    @contextlib.contextmanager
    def request_options(
        self, *, dry_run: bool = False, validation: FieldValidation = FieldValidation.WARN, manager: str = ""
    ) -> Iterator[None]:
        """Run one request's verb with its options: `validation` for the bodies it takes, and as
        `dryRun=All` does (every check and default, nothing stored, no event, no revision, the
        Service address allocations it made given back) when `dry_run`."""
        with self.lock:
            allocations = copy.deepcopy(self.service_addresses) if dry_run else None
            saved_validation, self.validation = self.validation, validation
            saved_manager, self.manager = self.manager, manager
            self.dry_run_depth += dry_run
            try:
                yield
            finally:
                self.dry_run_depth -= dry_run
                self.validation = saved_validation
                self.manager = saved_manager
                if allocations is not None:
                    self.service_addresses = allocations

    # -- verbs ---------------------------------------------------------------------------------
    def create(self, resource: Resource, body: object, *, namespace: str | None) -> dict:
        """Create from `body`; `namespace` is the request path's (None: cluster-wide or the body's)."""
        with self.lock:
            obj = checked_fields(resource, strategy.request_object(resource, body), self.validation)
            metadata = obj["metadata"]
            namespace = strategy.namespace_for_write(resource, metadata, path_namespace=namespace)
            if namespace is not None and ("", namespace) not in self.objects[NAMESPACES]:
                raise not_found(NAMESPACES, namespace)
            table = self.objects[resource]
            if not metadata.get("name"):
                prefix = metadata.get("generateName")
                if not prefix:
                    raise invalid(resource, "", "metadata.name: Required value: name or generateName is required")
                while True:
                    metadata["name"] = strategy.generated_name(prefix)
                    if (namespace or "", metadata["name"]) not in table:
                        break
            name = metadata["name"]
            strategy.check_name(resource, name)
            key = (namespace or "", name)
            if key in table:
                raise already_exists(resource, name)
            strategy.prepare_for_create(resource, obj, services=self.service_addresses)
            return self._write(resource, obj, key=key, event_type="ADDED", prev=None)

    def get(self, resource: Resource, name: str, *, namespace: str | None) -> dict:
        obj = self.objects[resource].get(((namespace or "") if resource.namespaced else "", name))
        if obj is None:
            raise not_found(resource, name)
        return obj

    def _update(self, resource: Resource, old: dict, *, proposed: dict, part: Subresource) -> dict:
        new = strategy.prepare_for_update(
            resource, old, proposed=proposed, part=part, services=self.service_addresses
        )
        if new == old:
            return old
        return self._write(resource, new, key=self._key(resource, old), event_type="MODIFIED", prev=old)

    def replace(self, resource: Resource, name: str, *, namespace: str | None, body: object, part: Subresource) -> dict:
        with self.lock:
            proposed = checked_fields(resource, strategy.request_object(resource, body), self.validation)
            if proposed["metadata"].get("name", name) != name:
                given = proposed["metadata"]["name"]
                raise bad_request(f"the name of the object ({given}) does not match the URL ({name})")
            old = self.get(resource, name, namespace=namespace)
            strategy.check_precondition(resource, old, proposed=proposed)
            return self._update(resource, old, proposed=self._tracked(resource, old, proposed), part=part)

    def _tracked(self, resource: Resource, old: dict, proposed: dict) -> dict:
        """`proposed` with the managedFields an ordinary write leaves (only applied objects have any)."""
        entries = track_update(resource.kind, resource.api_version, old, proposed, manager=self.manager or "unknown")
        metadata = {k: v for k, v in proposed["metadata"].items() if k != "managedFields"}
        if entries:
            metadata["managedFields"] = entries
        return {**proposed, "metadata": metadata}

    def apply(
        self, resource: Resource, name: str, *, namespace: str | None, config: object, manager: str, force: bool
    ) -> tuple[dict, bool]:
        """Server-side apply of `config` by `manager`; (the object, whether it was created)."""
        with self.lock:
            if not manager:
                raise bad_request("fieldManager is required for apply requests")
            body = checked_fields(resource, strategy.request_object(resource, config), self.validation)
            if body["metadata"].get("name") != name:
                raise bad_request(f"the name of the applied object ({body['metadata'].get('name')}) does not match "
                                  f"the URL ({name})")
            live = self.find(resource, name, namespace=namespace)
            result = server_side_apply(resource.kind, resource.api_version, live, body, manager=manager, force=force)
            if live is None:
                return self.create(resource, typed(resource, result), namespace=namespace), True
            strategy.check_precondition(resource, live, proposed=body)
            return self._update(resource, live, proposed=result, part=Subresource.MAIN), False

    def patch(
        self,
        resource: Resource,
        name: str,
        *,
        namespace: str | None,
        patch: object,
        patch_type: PatchType,
        part: Subresource,
    ) -> dict:
        with self.lock:
            old = self.get(resource, name, namespace=namespace)
            if patch_type is PatchType.JSON:
                patched = json_patch(typed(resource, old), patch)
            elif patch_type is PatchType.STRATEGIC:
                patched = strategic_merge_patch(resource.kind, typed(resource, old), patch)
            else:
                if not isinstance(patch, dict):
                    raise bad_request("a merge patch must be a JSON object")
                patched = merge_patch(typed(resource, old), patch)
            if not isinstance(patched, dict) or not isinstance(patched.get("metadata"), dict):
                raise invalid(resource, name, "metadata: Required value: the patched object has no metadata")
            proposed = checked_fields(resource, strategy.request_object(resource, patched), self.validation)
            strategy.check_precondition(resource, old, proposed=proposed)
            return self._update(resource, old, proposed=self._tracked(resource, old, proposed), part=part)

    def delete(
        self, resource: Resource, name: str, *, namespace: str | None, grace_period_seconds: int | None = None
    ) -> dict:
        """Remove the object; a pod given a grace period > 0 is only marked (deletionTimestamp) instead."""
        with self.lock:
            old = self.get(resource, name, namespace=namespace)
            if resource is PODS and grace_period_seconds is not None and grace_period_seconds > 0:
                if old["metadata"].get("deletionTimestamp"):
                    return old
                marked = strategy.marked_for_deletion(old, grace_period_seconds)
                return self._write(PODS, marked, key=self._key(PODS, old), event_type="MODIFIED", prev=old)
            if resource is NAMESPACES:
                for contained in RESOURCES:
                    if contained.namespaced:
                        for key in [k for k in self.objects[contained] if k[0] == name]:
                            self._delete_key(contained, key)
            return self._delete_key(resource, self._key(resource, old))

    def _delete_key(self, resource: Resource, key: tuple[str, str]) -> dict:
        old = self.objects[resource][key]
        gone = self._write(resource, old, key=key, event_type="DELETED", prev=old)
        if resource is SERVICES:
            self.service_addresses.release(old)
        return gone

    def delete_collection(self, resource: Resource, selection: Filter) -> builtins.list[dict]:
        with self.lock:
            keys = [k for k, obj in self.objects[resource].items() if selection.matches(obj)]
            return [self.delete(resource, k[1], namespace=k[0] or None) for k in sorted(keys)]

    def list(
        self, resource: Resource, selection: Filter, *, limit: int, token: str | None,
        resource_version: str | None = None, match: str | None = None,
    ) -> dict:
        """A page of the list; `resource_version`/`match` as the real server reads them (unset: the
        latest; "0" or NotOlderThan: the latest, which is never older; Exact: rebuilt from the history)."""
        if resource_version == "0" and not token:
            limit = 0  # "any version" comes whole from the real server's watch cache: no pages
        with self.lock:
            if token and resource_version not in (None, "", "0"):
                raise bad_request("specifying resource version is not allowed when using continue")
            if token:
                snapshot_id, offset = self._decode_token(token)
                snapshot = self.snapshots.get(snapshot_id)
                if snapshot is None:
                    raise expired("the continue token is no longer valid (the list snapshot is gone); list again")
                self.snapshots.move_to_end(snapshot_id)
                revision, items = snapshot
            else:
                revision, table = self._table_at(resource, resource_version, match)
                items = [table[k] for k in sorted(table) if selection.matches(table[k])]
                offset, snapshot_id = 0, None
            metadata: dict = {"resourceVersion": str(revision)}
            if limit > 0 and len(items) - offset > limit:
                if snapshot_id is None:
                    snapshot_id = uuid.uuid4().hex
                    self.snapshots[snapshot_id] = (revision, items)
                    while len(self.snapshots) > SNAPSHOTS_KEPT:
                        self.snapshots.popitem(last=False)
                metadata["continue"] = self._encode_token(snapshot_id, offset + limit)
                if not selection.labels.requirements and not selection.fields.requirements:
                    # the real server counts what is left only when no selector filters the pages
                    metadata["remainingItemCount"] = len(items) - offset - limit
                page = items[offset : offset + limit]
            else:
                page = items[offset:]
        return {"kind": f"{resource.kind}List", "apiVersion": resource.api_version, "metadata": metadata, "items": page}

    def _table_at(self, resource: Resource, resource_version: str | None, match: str | None) -> tuple[int, dict]:
        if match and not resource_version:
            raise invalid_list_options("resourceVersionMatch: Forbidden: resourceVersionMatch is forbidden unless "
                                       "resourceVersion is provided")
        if match not in (None, "", "NotOlderThan", "Exact"):
            raise invalid_list_options(f'resourceVersionMatch: Unsupported value: "{match}": supported values: '
                                       '"Exact", "NotOlderThan", ""')
        if match == "Exact" and resource_version == "0":  # (sic: the real message's lower case)
            raise invalid_list_options('resourceVersionMatch: Forbidden: resourceVersionMatch "exact" is forbidden '
                                       'for resourceVersion "0"')
        table = self.objects[resource]
        if resource_version in (None, ""):
            return self.revision, table
        wanted = self._revision_number(resource_version)
        if wanted > self.revision:
            raise too_large_resource_version(wanted, self.revision)
        if match != "Exact" or wanted == self.revision:
            return self.revision, table
        if wanted < self.floor:
            raise expired(f"too old resource version: {wanted} ({self.floor})")
        past = dict(table)
        for event in reversed(self.history):  # undo the newer writes
            if event.revision <= wanted:
                break
            if event.resource is resource:
                key = self._key(resource, event.obj)
                if event.prev is None:
                    past.pop(key, None)
                else:
                    past[key] = event.prev
        return wanted, past

    @staticmethod
    def _revision_number(text: str, *, watch: bool = False) -> int:
        if not (text.isascii() and text.isdigit()):  # what Go's ParseUint takes: no sign, no spaces
            raise invalid_resource_version(text, watch=watch)
        return int(text)

    @staticmethod
    def _encode_token(snapshot_id: str, offset: int) -> str:
        return base64.urlsafe_b64encode(json.dumps({"s": snapshot_id, "o": offset}).encode()).decode()

    @staticmethod
    def _decode_token(token: str) -> tuple[str, int]:
        try:
            decoded = json.loads(base64.urlsafe_b64decode(token.encode()))
            return str(decoded["s"]), int(decoded["o"])
        except (ValueError, KeyError, TypeError):
            raise bad_request("malformed continue token") from None

    # -- watches -----------------------------------------------------------------------------
    def open_watch(
        self, resource: Resource, selection: Filter, *, resource_version: str | None, initial_events: bool
    ) -> tuple[WatchStream, builtins.list[bytes], int]:
        """Register a watch; return it, the lines it must send first and their revision. Too old: 410."""
        watch = WatchStream(resource, selection)
        with self.lock:
            if initial_events or resource_version in (None, "", "0"):
                table = self.objects[resource]
                initial = [
                    event_line(resource, table[k], event_type="ADDED")
                    for k in sorted(table)
                    if selection.matches(table[k])
                ]
                watch.sent_revision = self.revision
            else:
                since = self._revision_number(resource_version, watch=True)
                if since < self.floor:  # the real watch cache's wording: the oldest revision it can start at
                    raise expired(f"too old resource version: {since} ({self.floor})")
                initial = []
                watch.sent_revision = since  # one not reached yet: the stream waits for it, as the real one
                for event in self.history:
                    if event.revision > since and event.resource is resource:
                        line = watch.render(event)
                        if line is not None:
                            initial.append(line)
                            watch.sent_revision = event.revision
            self.watches[resource].add(watch)
            return watch, initial, self.revision

    def close_watch(self, watch: WatchStream) -> None:
        with self.lock:
            self.watches[watch.resource].discard(watch)

    def progress(self, watch: WatchStream) -> int | None:
        """The revision a bookmark may promise this watcher, or None while it has events queued."""
        with self.lock:
            return self.revision if watch.queue.empty() else None

    def watch_counts(self) -> dict[str, int]:
        with self.lock:
            return {r.plural: len(w) for r, w in self.watches.items() if w}

    def end_watches(self) -> None:
        with self.lock:
            for watches in self.watches.values():
                for watch in watches:
                    watch.queue.put(None)

    def compact(self) -> int:
        with self.lock:
            self.history.clear()
            self.floor = self.revision
            self.snapshots.clear()
            return self.revision

    def close(self) -> None:
        with self.lock:
            if self.closed:
                return
            self.closed = True
            if self.state is not None:
                self.state.write_snapshot(self.revision, self.typed_objects())
                self.state.close()

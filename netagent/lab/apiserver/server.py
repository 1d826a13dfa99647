"""The Kubernetes API test server: the real wire protocol, in memory, stdlib only.

There is no real API server on the build machine, so the lab and the tests run this one and
the agent's unchanged client code (the official `kubernetes` client) talks to it. What it
reproduces is what a watch-based agent can observe of a real server:

- Paths, verbs and Status errors of core/v1 `nodes`, `namespaces`, `services`, `pods`,
  `endpoints` and discovery.k8s.io/v1 `endpointslices` (cluster-wide and per-namespace
  collections, objects, a `/status` subresource where the real one has it), `/version`,
  `/healthz`, `/readyz`, and enough discovery (`/api`, `/apis`, ...) for the client.
- One global resourceVersion counter, like etcd's revision. Writes that change nothing do
  not bump it and make no event, like the real server.
- list with `limit`/`continue` served from a consistent snapshot; an unknown or compacted
  continue token answers 410 Expired. Label selectors (=, ==, !=, in, notin, exists, !key,
  >, <) and field selectors (metadata.name, metadata.namespace; pods also spec.nodeName,
  status.phase; anything else is 400).
- watch (`?watch=true` or `/watch/` paths): newline-delimited JSON events over chunked
  encoding, one chunk per event. Events come from a bounded history (`history` events, all
  resources together); a watch from an older resourceVersion, or from one the server has not
  reached yet, gets HTTP 200 and an ERROR event with a 410 Expired Status. resourceVersion ""
  or "0" first sends ADDED for every current object. Selectors apply to events: an object
  that stops matching arrives as DELETED (previous content, new resourceVersion), one that
  starts matching as ADDED. BOOKMARKs every `bookmark_interval` seconds when asked for.
- PATCH: merge (RFC 7386), JSON patch (RFC 6902, all six operations) and strategic merge,
  which here is a merge patch (lists are replaced, `$patch` directives are not understood):
  good enough for annotations, labels and status, and said plainly here.
- Services are defaulted, validated and given a clusterIP, node ports and a health-check
  node port as the real registry does (`service_spec.py`; 422 Invalid otherwise), and keep
  them on updates that omit them; deleting a namespace deletes what is in it at once (no
  Terminating phase); creating in a missing namespace is 404.
- Pods: DELETE with `gracePeriodSeconds` > 0 (query or DeleteOptions body) only sets
  `metadata.deletionTimestamp` (the deadline) and `deletionGracePeriodSeconds`, as the real
  server does; the lab's kubelet part deletes the pod for good later. Without a grace
  period, or with 0, a pod goes at once (the real server would default to the pod's
  terminationGracePeriodSeconds; the lab's callers say what they want). Updates cannot
  set or clear those two fields.
- In-process listeners (`_Store.add_listener`) see every write, in order, under the store
  lock: the lab's EndpointSlice controller (`--endpointslice-controller`) runs on them.
- Persistence (optional `state_file`): a snapshot written atomically (temp + rename) plus
  an append-only journal of every write, so a server killed right after a write loses
  nothing and writes stay O(1); `stop()` folds the journal into the snapshot, after which
  the snapshot alone is the state (tests may edit it). A restarted server keeps objects and
  the counter but starts with an empty history: watches from before the restart get 410,
  exactly what an API server restart with compaction looks like.

Lab-only administration lives under `/_lab/` and is not Kubernetes API: `POST /_lab/compact`
(drop the history and continue snapshots) and `GET /_lab/watchers` (open watch streams).

Stored objects are never mutated: every write builds new dicts, so lists, snapshots and
watch events can share them without copies. In-process helpers return deep copies.
"""
from __future__ import annotations

import argparse
import base64
import collections
import enum
import http.server
import json
import logging
import os
import queue
import random
import re
import select
import signal
import socket
import socketserver
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import parse_qs, unquote, urlsplit

from netagent.kube.resources import (
    ALL_RESOURCES,
    NAMESPACES,
    NODES,
    PODS,
    SERVICES,
    Resource,
    resource_for,
)
from netagent.kube.config import PatchType
from netagent.lab.service_spec import InvalidService, ServiceAddresses

_log = logging.getLogger("netagent.lab.apiserver")

# Resources whose writes to the main resource leave `status` alone (and `/status` the rest).
_STATUS_SUBRESOURCE = frozenset({NODES, NAMESPACES, SERVICES, PODS})
_EXTRA_FIELD_LABELS = {PODS: ("spec.nodeName", "status.phase")}
_BY_GROUP_VERSION_PLURAL = {(r.group, r.version, r.plural): r for r in ALL_RESOURCES}
_INITIAL_NAMESPACES = ("default", "kube-system", "kube-public", "kube-node-lease")
_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")
_GENERATE_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"
_SNAPSHOTS_KEPT = 64
JSON = "application/json"


class Subresource(enum.Enum):
    MAIN = ""
    STATUS = "status"


# --------------------------------------------------------------------------------------------
# Errors: raised anywhere below, answered as a Kubernetes Status object
# --------------------------------------------------------------------------------------------
class ApiError(Exception):
    def __init__(self, code: int, reason: str, message: str, *, details: dict | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message
        self.details = details

    def status(self) -> dict:
        status = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        }
        if self.details:
            status["details"] = self.details
        return status


def _details(resource: Resource, name: str) -> dict:
    details = {"name": name, "kind": resource.plural}
    if resource.group:
        details["group"] = resource.group
    return details


def _not_found(resource: Resource, name: str) -> ApiError:
    return ApiError(404, "NotFound", f'{resource.plural} "{name}" not found', details=_details(resource, name))


def _already_exists(resource: Resource, name: str) -> ApiError:
    message = f'{resource.plural} "{name}" already exists'
    return ApiError(409, "AlreadyExists", message, details=_details(resource, name))


def _conflict(resource: Resource, name: str, *, given: str, current: str) -> ApiError:
    return ApiError(
        409,
        "Conflict",
        f'{resource.plural} "{name}": resourceVersion {given} is stale (now {current}); '
        "read the object again and retry",
        details=_details(resource, name),
    )


def _bad_request(message: str) -> ApiError:
    return ApiError(400, "BadRequest", message)


def _invalid(resource: Resource, name: str, message: str) -> ApiError:
    return ApiError(422, "Invalid", f'{resource.kind} "{name}" is invalid: {message}', details=_details(resource, name))


def _expired(message: str) -> ApiError:
    return ApiError(410, "Expired", message)


# --------------------------------------------------------------------------------------------
# Selectors
# --------------------------------------------------------------------------------------------
_KEY = r"[A-Za-z0-9][-A-Za-z0-9_./]*"
_VALUE = r"[-A-Za-z0-9_.]*"
_SET_REQUIREMENT = re.compile(rf"^({_KEY})\s+(in|notin)\s*\(([^()]*)\)$")
_EQUALITY_REQUIREMENT = re.compile(rf"^({_KEY})\s*(==|=|!=)\s*({_VALUE})$")
_ORDER_REQUIREMENT = re.compile(rf"^({_KEY})\s*(>|<)\s*(-?\d+)$")
_NOT_EXISTS_REQUIREMENT = re.compile(rf"^!\s*({_KEY})$")
_EXISTS_REQUIREMENT = re.compile(rf"^({_KEY})$")
_FIELD_REQUIREMENT = re.compile(r"^([A-Za-z][A-Za-z.]*)\s*(==|=|!=)\s*(.*)$")


def _split_top_level(text: str) -> list[str]:
    """Split on commas that are not inside `in (...)` value sets."""
    parts, current, depth = [], [], 0
    for char in text:
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
        if char == "," and depth == 0:
            parts.append("".join(current).strip())
            current = []
        else:
            current.append(char)
    parts.append("".join(current).strip())
    return parts


class LabelSelector:
    """A parsed `labelSelector`; requirements are (key, operator, values)."""

    def __init__(self, requirements: list[tuple[str, str, tuple[str, ...]]]) -> None:
        self.requirements = requirements

    @classmethod
    def parse(cls, text: str | None) -> "LabelSelector":
        if not text or not text.strip():
            return cls([])
        requirements = []
        for part in _split_top_level(text):
            requirements.append(cls._parse_requirement(part))
        return cls(requirements)

    @staticmethod
    def _parse_requirement(part: str) -> tuple[str, str, tuple[str, ...]]:
        if match := _SET_REQUIREMENT.match(part):
            values = tuple(v.strip() for v in match.group(3).split(",") if v.strip())
            if not values or not all(re.fullmatch(_VALUE, v) for v in values):
                raise _bad_request(f"unable to parse requirement {part!r}: bad value set")
            return match.group(1), match.group(2), values
        if match := _EQUALITY_REQUIREMENT.match(part):
            operator = "!=" if match.group(2) == "!=" else "="
            return match.group(1), operator, (match.group(3),)
        if match := _ORDER_REQUIREMENT.match(part):
            return match.group(1), match.group(2), (match.group(3),)
        if match := _NOT_EXISTS_REQUIREMENT.match(part):
            return match.group(1), "!", ()
        if match := _EXISTS_REQUIREMENT.match(part):
            return match.group(1), "exists", ()
        raise _bad_request(f"unable to parse requirement {part!r} in the label selector")

    def matches(self, labels: dict | None) -> bool:
        labels = labels or {}
        for key, operator, values in self.requirements:
            present = key in labels
            value = labels.get(key)
            if operator == "=":
                ok = present and value == values[0]
            elif operator == "!=":
                ok = not present or value != values[0]
            elif operator == "in":
                ok = present and value in values
            elif operator == "notin":
                ok = not present or value not in values
            elif operator == "exists":
                ok = present
            elif operator == "!":
                ok = not present
            else:
                ok = present and _integer(value) is not None and (
                    _integer(value) > int(values[0]) if operator == ">" else _integer(value) < int(values[0])
                )
            if not ok:
                return False
        return True


def _integer(text: str | None) -> int | None:
    try:
        return int(text)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None


class FieldSelector:
    """A parsed `fieldSelector`; requirements are (path, equal?, value)."""

    def __init__(self, requirements: list[tuple[tuple[str, ...], str, str]]) -> None:
        self.requirements = requirements

    @classmethod
    def parse(cls, text: str | None, *, resource: Resource) -> "FieldSelector":
        if not text or not text.strip():
            return cls([])
        supported = ("metadata.name", "metadata.namespace") + _EXTRA_FIELD_LABELS.get(resource, ())
        requirements = []
        for part in text.split(","):
            match = _FIELD_REQUIREMENT.match(part.strip())
            if not match:
                raise _bad_request(f"invalid field selector requirement {part!r}")
            label, operator, value = match.groups()
            if label not in supported:
                raise _bad_request(f'field label not supported for {resource.plural}: "{label}"')
            requirements.append((tuple(label.split(".")), "!=" if operator == "!=" else "=", value))
        return cls(requirements)

    def matches(self, obj: dict) -> bool:
        for path, operator, value in self.requirements:
            node: object = obj
            for step in path:
                node = node.get(step) if isinstance(node, dict) else None
            actual = "" if node is None else str(node)
            if (actual == value) != (operator == "="):
                return False
        return True


@dataclass(frozen=True)
class _Filter:
    """Which objects a list or watch sees: namespace scope plus both selectors."""

    namespace: str | None
    labels: LabelSelector
    fields: FieldSelector

    @property
    def selects_all(self) -> bool:
        return self.namespace is None and not self.labels.requirements and not self.fields.requirements

    def matches(self, obj: dict) -> bool:
        metadata = obj["metadata"]
        if self.namespace is not None and metadata.get("namespace") != self.namespace:
            return False
        return self.labels.matches(metadata.get("labels")) and self.fields.matches(obj)


_SELECT_ALL = _Filter(None, LabelSelector([]), FieldSelector([]))


# --------------------------------------------------------------------------------------------
# Patches
# --------------------------------------------------------------------------------------------
def _clone(value):
    """A deep copy of JSON data (several times faster than copy.deepcopy)."""
    return json.loads(json.dumps(value))


def merge_patch(target: object, patch: object) -> object:
    """RFC 7386: objects merge recursively, null deletes, everything else replaces."""
    if not isinstance(patch, dict):
        return _clone(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def _pointer(path: object) -> list[str]:
    if not isinstance(path, str) or (path and not path.startswith("/")):
        raise _bad_request(f"invalid JSON pointer {path!r}")
    if path == "":
        return []
    return [token.replace("~1", "/").replace("~0", "~") for token in path[1:].split("/")]


def _list_index(token: str, length: int, *, allow_end: bool) -> int:
    if token == "-" and allow_end:
        return length
    if not re.fullmatch(r"0|[1-9][0-9]*", token) or int(token) > length or (int(token) == length and not allow_end):
        raise ApiError(422, "Invalid", f"JSON patch: list index {token!r} out of range")
    return int(token)


def _resolve(document: object, tokens: list[str]) -> object:
    node = document
    for token in tokens:
        if isinstance(node, dict) and token in node:
            node = node[token]
        elif isinstance(node, list):
            node = node[_list_index(token, len(node), allow_end=False)]
        else:
            raise ApiError(422, "Invalid", f"JSON patch: path /{'/'.join(tokens)} does not exist")
    return node


def _pointer_add(document: object, tokens: list[str], value: object) -> object:
    if not tokens:
        return value
    parent = _resolve(document, tokens[:-1])
    last = tokens[-1]
    if isinstance(parent, dict):
        parent[last] = value
    elif isinstance(parent, list):
        parent.insert(_list_index(last, len(parent), allow_end=True), value)
    else:
        raise ApiError(422, "Invalid", f"JSON patch: cannot add below a scalar at /{'/'.join(tokens)}")
    return document


def _pointer_remove(document: object, tokens: list[str]) -> object:
    if not tokens:
        raise ApiError(422, "Invalid", "JSON patch: cannot remove the whole document")
    parent = _resolve(document, tokens[:-1])
    last = tokens[-1]
    if isinstance(parent, dict) and last in parent:
        del parent[last]
    elif isinstance(parent, list):
        del parent[_list_index(last, len(parent), allow_end=False)]
    else:
        raise ApiError(422, "Invalid", f"JSON patch: path /{'/'.join(tokens)} does not exist")
    return document


def json_patch(target: object, operations: object) -> object:
    """RFC 6902: add, remove, replace, move, copy and test, applied in order to a copy."""
    if not isinstance(operations, list):
        raise _bad_request("a JSON patch is a list of operations")
    document = _clone(target)
    for operation in operations:
        if not isinstance(operation, dict):
            raise _bad_request("a JSON patch operation is an object")
        kind = operation.get("op")
        tokens = _pointer(operation.get("path"))
        if kind in ("add", "replace", "test") and "value" not in operation:
            raise _bad_request(f"JSON patch {kind} needs a value")
        if kind == "add":
            document = _pointer_add(document, tokens, _clone(operation["value"]))
        elif kind == "remove":
            document = _pointer_remove(document, tokens)
        elif kind == "replace":
            if tokens:
                _resolve(document, tokens)
                document = _pointer_remove(document, tokens)
            document = _pointer_add(document, tokens, _clone(operation["value"]))
        elif kind in ("move", "copy"):
            source = _pointer(operation.get("from"))
            value = _clone(_resolve(document, source))
            if kind == "move":
                document = _pointer_remove(document, source)
            document = _pointer_add(document, tokens, value)
        elif kind == "test":
            if _resolve(document, tokens) != operation["value"]:
                raise ApiError(422, "Invalid", f"JSON patch: test failed at {operation.get('path')}")
        else:
            raise _bad_request(f"unknown JSON patch operation {kind!r}")
    return document


# --------------------------------------------------------------------------------------------
# Persistence: snapshot + journal
# --------------------------------------------------------------------------------------------
class _StateFile:
    """`path` holds {"resourceVersion", "objects"}; `path.journal` one JSON line per later write."""

    COMPACT_AFTER_MIN = 1000

    def __init__(self, path: str) -> None:
        self.path = path
        self.journal_path = path + ".journal"
        self._journal = None
        self._entries = 0

    def load(self) -> tuple[int, dict[str, dict]]:
        """The last resourceVersion and the objects by (apiVersion, kind, namespace, name) key."""
        revision = 0
        objects: dict[str, dict] = {}
        if os.path.exists(self.path):
            with open(self.path, "rb") as handle:
                snapshot = json.load(handle)
            revision = int(snapshot.get("resourceVersion") or 0)
            for obj in snapshot.get("objects") or []:
                objects[_state_key(obj)] = obj
        if os.path.exists(self.journal_path):
            with open(self.journal_path, "rb") as handle:
                for line in handle:
                    try:
                        entry = json.loads(line)
                    except ValueError:
                        continue  # a line cut short by a crash mid-write
                    if int(entry["rv"]) <= revision:
                        continue
                    revision = int(entry["rv"])
                    key = _state_key(entry["object"])
                    if entry["op"] == "delete":
                        objects.pop(key, None)
                    else:
                        objects[key] = entry["object"]
        return revision, objects

    def record(self, revision: int, *, deleted: bool, typed_object: dict) -> None:
        if self._journal is None:
            self._journal = open(self.journal_path, "ab", buffering=0)
        line = json.dumps(
            {"rv": revision, "op": "delete" if deleted else "put", "object": typed_object}, separators=(",", ":")
        )
        self._journal.write(line.encode() + b"\n")
        self._entries += 1

    def needs_snapshot(self, object_count: int) -> bool:
        return self._entries > max(self.COMPACT_AFTER_MIN, object_count)

    def write_snapshot(self, revision: int, typed_objects: list[dict]) -> None:
        """Atomically replace the snapshot, then empty the journal it now contains."""
        directory = os.path.dirname(os.path.abspath(self.path))
        os.makedirs(directory, exist_ok=True)
        temporary = f"{self.path}.tmp.{os.getpid()}"
        with open(temporary, "w") as handle:
            json.dump({"resourceVersion": str(revision), "objects": typed_objects}, handle, separators=(",", ":"))
        os.replace(temporary, self.path)
        if self._journal is not None:
            self._journal.close()
            self._journal = None
        if os.path.exists(self.journal_path):
            os.unlink(self.journal_path)
        self._entries = 0

    def close(self) -> None:
        if self._journal is not None:
            self._journal.close()
            self._journal = None


def _state_key(obj: dict) -> str:
    metadata = obj["metadata"]
    return f"{obj['apiVersion']}|{obj['kind']}|{metadata.get('namespace', '')}|{metadata['name']}"


# --------------------------------------------------------------------------------------------
# The store: objects, the revision counter, history, watches, list snapshots
# --------------------------------------------------------------------------------------------
def _typed(resource: Resource, obj: dict) -> dict:
    return {"kind": resource.kind, "apiVersion": resource.api_version, **obj}


def _bare(obj: dict) -> dict:
    return {k: v for k, v in obj.items() if k not in ("kind", "apiVersion")}


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def _event_line(resource: Resource, obj: dict, *, event_type: str) -> bytes:
    return json.dumps({"type": event_type, "object": _typed(resource, obj)}, separators=(",", ":")).encode() + b"\n"


class StoreEvent:
    """One write: `type` ADDED/MODIFIED/DELETED, `obj` as stored (a DELETED one with the deleting
    revision), `prev` the object before (None for ADDED). Shared and read-only."""

    __slots__ = ("revision", "resource", "type", "obj", "prev", "_line")

    def __init__(self, resource: Resource, obj: dict, *, revision: int, event_type: str, prev: dict | None) -> None:
        self.revision = revision
        self.resource = resource
        self.type = event_type
        self.obj = obj
        self.prev = prev
        self._line: bytes | None = None

    def line(self) -> bytes:
        """The event as sent to a watcher that sees everything (rendered once, shared)."""
        if self._line is None:
            self._line = _event_line(self.resource, self.obj, event_type=self.type)
        return self._line


class _Watch:
    """One open watch stream: its filter and the queue the store pushes its events into."""

    def __init__(self, resource: Resource, selection: _Filter) -> None:
        self.resource = resource
        self.selection = selection
        self.queue: queue.SimpleQueue[StoreEvent | None] = queue.SimpleQueue()

    def render(self, event: StoreEvent) -> bytes | None:
        """The line this watcher must see for `event`, or None; selectors turn updates into adds/deletes."""
        if self.selection.selects_all:
            return event.line()
        matches_now = self.selection.matches(event.obj)
        if event.type != "MODIFIED":
            return event.line() if matches_now else None
        matched_before = self.selection.matches(event.prev)
        if matches_now and matched_before:
            return event.line()
        if matches_now:
            return _event_line(event.resource, event.obj, event_type="ADDED")
        if matched_before:
            gone = {**event.prev, "metadata": {**event.prev["metadata"], "resourceVersion": str(event.revision)}}
            return _event_line(event.resource, gone, event_type="DELETED")
        return None


class _Store:
    def __init__(self, *, history: int, state: _StateFile | None, service_cidr: str) -> None:
        self.lock = threading.RLock()
        self.revision = 0
        self.objects: dict[Resource, dict[tuple[str, str], dict]] = {r: {} for r in ALL_RESOURCES}
        self.history: collections.deque[StoreEvent] = collections.deque()
        self.history_limit = history
        self.floor = 0  # every event newer than this revision is still in `history`
        self.watches: dict[Resource, set[_Watch]] = {r: set() for r in ALL_RESOURCES}
        self.snapshots: collections.OrderedDict[str, tuple[int, list[dict]]] = collections.OrderedDict()
        self.service_addresses = ServiceAddresses(service_cidr)
        self.listeners: list[Callable[[StoreEvent], None]] = []
        self.state = state
        self.closed = False
        if state is not None:
            self.revision, loaded = state.load()
            for typed_object in loaded.values():
                resource = resource_for(typed_object["apiVersion"], typed_object["kind"])
                obj = _bare(typed_object)
                self.objects[resource][self._key(resource, obj)] = obj
                if resource is SERVICES:
                    self.service_addresses.observe(obj)
        self.floor = self.revision
        for namespace in _INITIAL_NAMESPACES:
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
            self.state.record(revision, deleted=event_type == "DELETED", typed_object=_typed(resource, obj))
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

    def items(self, resource: Resource, *, namespace: str | None = None) -> list[dict]:
        """The stored objects (shared: read-only, without kind/apiVersion), one namespace or all."""
        with self.lock:
            table = self.objects[resource]
            if namespace is None or not resource.namespaced:
                return list(table.values())
            return [obj for key, obj in table.items() if key[0] == namespace]

    def find(self, resource: Resource, name: str, *, namespace: str | None) -> dict | None:
        """The stored object (shared, read-only) or None."""
        return self.objects[resource].get(((namespace or "") if resource.namespaced else "", name))

    def _complete_service(self, name: str, spec: dict, *, old_spec: dict | None) -> dict:
        try:
            return self.service_addresses.complete(spec, old_spec=old_spec)
        except InvalidService as invalid:
            raise _invalid(SERVICES, name, str(invalid)) from None

    def object_count(self) -> int:
        return sum(len(table) for table in self.objects.values())

    def typed_objects(self) -> list[dict]:
        return [_typed(r, obj) for r, table in self.objects.items() for obj in table.values()]

    # -- verbs ---------------------------------------------------------------------------------
    def _body(self, resource: Resource, body: object) -> dict:
        if not isinstance(body, dict):
            raise _bad_request("the request body must be a JSON object")
        for field, expected in (("kind", resource.kind), ("apiVersion", resource.api_version)):
            if body.get(field) not in (None, "", expected):
                raise _bad_request(f"{field} {body.get(field)!r} does not belong at {resource.plural} ({expected})")
        metadata = body.get("metadata") or {}
        if not isinstance(metadata, dict):
            raise _bad_request("metadata must be an object")
        return {**_bare(body), "metadata": dict(metadata)}

    def _namespace_for_write(self, resource: Resource, metadata: dict, *, path_namespace: str | None) -> str | None:
        if not resource.namespaced:
            metadata.pop("namespace", None)
            return None
        given = metadata.get("namespace")
        if given and path_namespace and given != path_namespace:
            raise _bad_request(
                f"the namespace of the object ({given}) does not match the namespace of the request ({path_namespace})"
            )
        namespace = path_namespace or given
        if not namespace:
            raise _bad_request(f"{resource.plural} are namespaced: the request needs a namespace")
        metadata["namespace"] = namespace
        return namespace

    def create(self, resource: Resource, body: object, *, namespace: str | None) -> dict:
        """Create from `body`; `namespace` is the request path's (None: cluster-wide or the body's)."""
        obj = self._body(resource, body)
        metadata = obj["metadata"]
        with self.lock:
            namespace = self._namespace_for_write(resource, metadata, path_namespace=namespace)
            if namespace is not None and ("", namespace) not in self.objects[NAMESPACES]:
                raise _not_found(NAMESPACES, namespace)
            table = self.objects[resource]
            if not metadata.get("name"):
                prefix = metadata.get("generateName")
                if not prefix:
                    raise _invalid(resource, "", "metadata.name or metadata.generateName is required")
                while True:
                    metadata["name"] = prefix + "".join(random.choices(_GENERATE_ALPHABET, k=5))
                    if (namespace or "", metadata["name"]) not in table:
                        break
            name = metadata["name"]
            if not isinstance(name, str) or not _NAME.match(name):
                raise _invalid(resource, str(name), "metadata.name must be a lowercase DNS subdomain")
            key = (namespace or "", name)
            if key in table:
                raise _already_exists(resource, name)
            for server_owned in ("resourceVersion", "deletionTimestamp", "deletionGracePeriodSeconds", "selfLink"):
                metadata.pop(server_owned, None)
            metadata["uid"] = str(uuid.uuid4())
            metadata["creationTimestamp"] = _now()
            metadata["generation"] = 1
            if resource is SERVICES:
                obj["spec"] = self._complete_service(name, obj.get("spec") or {}, old_spec=None)
                obj.setdefault("status", {"loadBalancer": {}})
            elif resource is NAMESPACES:
                obj.setdefault("spec", {"finalizers": ["kubernetes"]})
                obj.setdefault("status", {"phase": "Active"})
            return self._write(resource, obj, key=key, event_type="ADDED", prev=None)

    def get(self, resource: Resource, name: str, *, namespace: str | None) -> dict:
        obj = self.objects[resource].get(((namespace or "") if resource.namespaced else "", name))
        if obj is None:
            raise _not_found(resource, name)
        return obj

    def _proposed_update(self, resource: Resource, old: dict, *, proposed: dict, part: Subresource) -> dict:
        """What an update of `old` to `proposed` stores: the server's fields and the other half kept."""
        name = old["metadata"]["name"]
        if part is Subresource.STATUS:
            new = {k: v for k, v in old.items() if k != "status"}
            if proposed.get("status") is not None:
                new["status"] = proposed["status"]
            return new
        new = {k: v for k, v in proposed.items() if k != "status"}
        if resource in _STATUS_SUBRESOURCE:
            if "status" in old:
                new["status"] = old["status"]
        elif "status" in proposed:
            new["status"] = proposed["status"]
        metadata = dict(proposed.get("metadata") or {})
        if metadata.get("name", name) != name:
            raise _invalid(resource, name, "metadata.name: field is immutable")
        for kept in ("name", "namespace", "uid", "creationTimestamp", "generation", "resourceVersion",
                     "deletionTimestamp", "deletionGracePeriodSeconds"):
            if kept in old["metadata"]:
                metadata[kept] = old["metadata"][kept]
            else:
                metadata.pop(kept, None)
        new["metadata"] = metadata
        if resource is SERVICES:
            new["spec"] = self._complete_service(name, new.get("spec") or {}, old_spec=old.get("spec") or {})
        outside = lambda o: {k: v for k, v in o.items() if k not in ("metadata", "status")}  # noqa: E731
        if outside(new) != outside(old):
            metadata["generation"] = int(old["metadata"].get("generation", 1)) + 1
        return new

    def _update(self, resource: Resource, old: dict, *, proposed: dict, part: Subresource) -> dict:
        new = self._proposed_update(resource, old, proposed=proposed, part=part)
        if new == old:
            return old
        return self._write(resource, new, key=self._key(resource, old), event_type="MODIFIED", prev=old)

    def _check_precondition(self, resource: Resource, old: dict, *, proposed: dict) -> None:
        given = (proposed.get("metadata") or {}).get("resourceVersion")
        current = old["metadata"]["resourceVersion"]
        if given not in (None, "") and str(given) != current:
            raise _conflict(resource, old["metadata"]["name"], given=str(given), current=current)

    def replace(self, resource: Resource, name: str, *, namespace: str | None, body: object, part: Subresource) -> dict:
        proposed = self._body(resource, body)
        if proposed["metadata"].get("name", name) != name:
            given = proposed["metadata"]["name"]
            raise _bad_request(f"the name of the object ({given}) does not match the URL ({name})")
        with self.lock:
            old = self.get(resource, name, namespace=namespace)
            self._check_precondition(resource, old, proposed=proposed)
            return self._update(resource, old, proposed=proposed, part=part)

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
                patched = json_patch(_typed(resource, old), patch)
            else:
                if not isinstance(patch, dict):
                    raise _bad_request("a merge patch must be a JSON object")
                patched = merge_patch(_typed(resource, old), patch)
            if not isinstance(patched, dict) or not isinstance(patched.get("metadata"), dict):
                raise _invalid(resource, name, "the patched object has no metadata")
            proposed = self._body(resource, patched)
            self._check_precondition(resource, old, proposed=proposed)
            return self._update(resource, old, proposed=proposed, part=part)

    def delete(
        self, resource: Resource, name: str, *, namespace: str | None, grace_period_seconds: int | None = None
    ) -> dict:
        """Remove the object; a pod given a grace period > 0 is only marked (deletionTimestamp) instead."""
        with self.lock:
            old = self.get(resource, name, namespace=namespace)
            if resource is PODS and grace_period_seconds is not None and grace_period_seconds > 0:
                return self._start_graceful_deletion(old, grace_period_seconds)
            if resource is NAMESPACES:
                for contained in ALL_RESOURCES:
                    if contained.namespaced:
                        for key in [k for k in self.objects[contained] if k[0] == name]:
                            self._delete_key(contained, key)
            return self._delete_key(resource, self._key(resource, old))

    def _start_graceful_deletion(self, old: dict, grace_period_seconds: int) -> dict:
        """What the real server does for a pod: set the deadline, leave removal to the kubelet."""
        if old["metadata"].get("deletionTimestamp"):
            return old
        deadline = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + grace_period_seconds))
        metadata = {
            **old["metadata"],
            "deletionTimestamp": deadline,
            "deletionGracePeriodSeconds": grace_period_seconds,
            "generation": int(old["metadata"].get("generation", 1)) + 1,
        }
        marked = {**old, "metadata": metadata}
        return self._write(PODS, marked, key=self._key(PODS, old), event_type="MODIFIED", prev=old)

    def _delete_key(self, resource: Resource, key: tuple[str, str]) -> dict:
        old = self.objects[resource][key]
        gone = self._write(resource, old, key=key, event_type="DELETED", prev=old)
        if resource is SERVICES:
            self.service_addresses.release(old)
        return gone

    def delete_collection(self, resource: Resource, selection: _Filter) -> list[dict]:
        with self.lock:
            keys = [k for k, obj in self.objects[resource].items() if selection.matches(obj)]
            return [self.delete(resource, k[1], namespace=k[0] or None) for k in sorted(keys)]

    def list(self, resource: Resource, selection: _Filter, *, limit: int, token: str | None) -> dict:
        with self.lock:
            if token:
                snapshot_id, offset = self._decode_token(token)
                snapshot = self.snapshots.get(snapshot_id)
                if snapshot is None:
                    raise _expired("the continue token is no longer valid (the list snapshot is gone); list again")
                self.snapshots.move_to_end(snapshot_id)
                revision, items = snapshot
            else:
                table = self.objects[resource]
                items = [table[k] for k in sorted(table) if selection.matches(table[k])]
                revision, offset, snapshot_id = self.revision, 0, None
            metadata: dict = {"resourceVersion": str(revision)}
            if limit > 0 and len(items) - offset > limit:
                if snapshot_id is None:
                    snapshot_id = uuid.uuid4().hex
                    self.snapshots[snapshot_id] = (revision, items)
                    while len(self.snapshots) > _SNAPSHOTS_KEPT:
                        self.snapshots.popitem(last=False)
                metadata["continue"] = self._encode_token(snapshot_id, offset + limit)
                metadata["remainingItemCount"] = len(items) - offset - limit
                page = items[offset : offset + limit]
            else:
                page = items[offset:]
        return {"kind": f"{resource.kind}List", "apiVersion": resource.api_version, "metadata": metadata, "items": page}

    @staticmethod
    def _encode_token(snapshot_id: str, offset: int) -> str:
        return base64.urlsafe_b64encode(json.dumps({"s": snapshot_id, "o": offset}).encode()).decode()

    @staticmethod
    def _decode_token(token: str) -> tuple[str, int]:
        try:
            decoded = json.loads(base64.urlsafe_b64decode(token.encode()))
            return str(decoded["s"]), int(decoded["o"])
        except (ValueError, KeyError, TypeError):
            raise _bad_request("malformed continue token") from None

    # -- watches -----------------------------------------------------------------------------
    def open_watch(
        self, resource: Resource, selection: _Filter, *, resource_version: str | None, initial_events: bool
    ) -> tuple[_Watch, list[bytes], int]:
        """Register a watch; return it, the lines it must send first and their revision. Too old/new: 410."""
        watch = _Watch(resource, selection)
        with self.lock:
            if initial_events or resource_version in (None, "", "0"):
                table = self.objects[resource]
                initial = [
                    _event_line(resource, table[k], event_type="ADDED")
                    for k in sorted(table)
                    if selection.matches(table[k])
                ]
            else:
                try:
                    since = int(resource_version)
                except ValueError:
                    raise _bad_request(f"invalid resourceVersion {resource_version!r}") from None
                if since < self.floor:
                    raise _expired(f"too old resource version: {since} (oldest kept: {self.floor + 1})")
                if since > self.revision:
                    raise _expired(f"too large resource version: {since} (current: {self.revision})")
                initial = []
                for event in self.history:
                    if event.revision > since and event.resource is resource:
                        line = watch.render(event)
                        if line is not None:
                            initial.append(line)
            self.watches[resource].add(watch)
            return watch, initial, self.revision

    def close_watch(self, watch: _Watch) -> None:
        with self.lock:
            self.watches[watch.resource].discard(watch)

    def progress(self, watch: _Watch) -> int | None:
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


# --------------------------------------------------------------------------------------------
# HTTP
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Target:
    resource: Resource
    namespace: str | None
    name: str | None
    part: Subresource
    watch_path: bool


def _parse_target(path: str) -> _Target | None:
    segments = [unquote(s) for s in path.strip("/").split("/")]
    if len(segments) >= 2 and segments[0] == "api":
        group, version, rest = "", segments[1], segments[2:]
    elif len(segments) >= 3 and segments[0] == "apis":
        group, version, rest = segments[1], segments[2], segments[3:]
    else:
        return None
    watch_path = bool(rest) and rest[0] == "watch"
    if watch_path:
        rest = rest[1:]
    namespace = None
    if len(rest) >= 3 and rest[0] == "namespaces" and rest[2] != "status":
        namespace, rest = rest[1], rest[2:]
    if not 1 <= len(rest) <= 3:
        return None
    resource = _BY_GROUP_VERSION_PLURAL.get((group, version, rest[0]))
    if resource is None or (namespace is not None and not resource.namespaced):
        return None
    name = rest[1] if len(rest) >= 2 else None
    if name is not None and resource.namespaced and namespace is None:
        return None
    part = Subresource.MAIN
    if len(rest) == 3:
        if rest[2] != "status" or resource not in _STATUS_SUBRESOURCE:
            return None
        part = Subresource.STATUS
    return _Target(resource, namespace, name, part, watch_path)


def _grace_period(query: dict[str, str], body: object) -> int | None:
    """`gracePeriodSeconds` from the query or a DeleteOptions body; None when not given."""
    given = query.get("gracePeriodSeconds")
    if given is None and isinstance(body, dict):
        given = body.get("gracePeriodSeconds")
    if given is None or given == "":
        return None
    value = _integer(str(given))
    if value is None or value < 0:
        raise _bad_request(f"gracePeriodSeconds {given!r}: expected a whole number of seconds >= 0")
    return value


def _truthy(value: str | None) -> bool:
    return value is not None and value.lower() in ("true", "1")


def _discovery(path: str, *, server_address: str) -> dict | None:
    groups: dict[str, list[Resource]] = collections.defaultdict(list)
    for resource in ALL_RESOURCES:
        groups[resource.api_version].append(resource)
    if path == "/api":
        return {
            "kind": "APIVersions",
            "versions": ["v1"],
            "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": server_address}],
        }
    named = sorted({r.group for r in ALL_RESOURCES if r.group})

    def group_entry(group: str) -> dict:
        version = {"groupVersion": f"{group}/v1", "version": "v1"}
        return {"name": group, "versions": [version], "preferredVersion": version}

    if path == "/apis":
        return {"kind": "APIGroupList", "apiVersion": "v1", "groups": [group_entry(g) for g in named]}
    if path.startswith("/apis/") and path.count("/") == 2 and path[6:] in named:
        return {"kind": "APIGroup", "apiVersion": "v1", **group_entry(path[6:])}
    group_version = path[5:] if path.startswith("/api/") else path[6:] if path.startswith("/apis/") else None
    if group_version not in groups:
        return None
    verbs = ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"]
    entries = []
    for resource in groups[group_version]:
        entries.append(
            {"name": resource.plural, "singularName": resource.kind.lower(), "namespaced": resource.namespaced,
             "kind": resource.kind, "verbs": verbs}
        )
        if resource in _STATUS_SUBRESOURCE:
            entries.append(
                {"name": f"{resource.plural}/status", "singularName": "", "namespaced": resource.namespaced,
                 "kind": resource.kind, "verbs": ["get", "patch", "update"]}
            )
    return {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": group_version, "resources": entries}


VERSION_INFO = {
    "major": "1",
    "minor": "33",
    "gitVersion": "v1.33.0-netagent-lab",
    "gitCommit": "0000000000000000000000000000000000000000",
    "gitTreeState": "clean",
    "buildDate": "2025-01-01T00:00:00Z",
    "goVersion": "none (netagent lab API server, Python)",
    "compiler": "none",
    "platform": "linux/amd64",
}


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "netagent-lab-apiserver"
    server: "_ListeningServer"

    # -- connection bookkeeping ----------------------------------------------------------------
    def setup(self) -> None:
        super().setup()
        if self.connection.family in (socket.AF_INET, socket.AF_INET6):
            self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.server.api.connection_opened(self.connection)

    def finish(self) -> None:
        try:
            super().finish()
        except OSError:
            pass
        finally:
            self.server.api.connection_closed(self.connection)

    def address_string(self) -> str:
        return str(self.client_address[0]) if self.client_address else "unix"

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 (stdlib's name)
        _log.debug("%s %s", self.address_string(), format % args)

    # -- dispatch ------------------------------------------------------------------------------
    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_POST(self) -> None:
        self._dispatch("POST")

    def do_PUT(self) -> None:
        self._dispatch("PUT")

    def do_PATCH(self) -> None:
        self._dispatch("PATCH")

    def do_DELETE(self) -> None:
        self._dispatch("DELETE")

    def _dispatch(self, method: str) -> None:
        try:
            raw_body = self._read_body()
            self._route(method, raw_body)
        except ApiError as error:
            self._send_json(error.code, error.status())
        except OSError:
            self.close_connection = True
        except Exception:  # a bug in this server: answer like the real one does, keep serving
            _log.exception("%s %s failed", method, self.path)
            self._send_json(500, ApiError(500, "InternalError", "internal error in the lab API server").status())

    def _read_body(self) -> bytes:
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length > 0 else b""

    @staticmethod
    def _json_body(raw_body: bytes) -> object:
        try:
            return json.loads(raw_body) if raw_body else None
        except ValueError as error:
            raise _bad_request(f"the request body is not JSON: {error}") from None

    def _send_json(self, code: int, payload: object) -> None:
        body = json.dumps(payload, separators=(",", ":")).encode()
        self.send_response(code)
        self.send_header("Content-Type", JSON)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _send_text(self, code: int, text: str) -> None:
        body = text.encode()
        self.send_response(code)
        self.send_header("Content-Type", "text/plain; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _route(self, method: str, raw_body: bytes) -> None:
        url = urlsplit(self.path)
        path = url.path.rstrip("/") or "/"
        query = {k: v[0] for k, v in parse_qs(url.query, keep_blank_values=True).items()}
        api = self.server.api
        if path in ("/healthz", "/readyz", "/livez"):
            return self._send_text(200, "ok")
        if path == "/version":
            return self._send_json(200, VERSION_INFO)
        if path.startswith("/_lab/"):
            return self._lab_admin(method, path)
        target = _parse_target(path)
        if target is None:
            discovery = _discovery(path, server_address=api.server_address) if method == "GET" else None
            if discovery is None:
                raise ApiError(404, "NotFound", "the server could not find the requested resource")
            return self._send_json(200, discovery)
        store = api.store
        resource = target.resource
        if target.name is None:
            selection = _Filter(
                target.namespace,
                LabelSelector.parse(query.get("labelSelector")),
                FieldSelector.parse(query.get("fieldSelector"), resource=resource),
            )
            if method == "GET" and (target.watch_path or _truthy(query.get("watch"))):
                return self._serve_watch(resource, selection, query)
            if method == "GET":
                limit = _integer(query.get("limit")) or 0
                return self._send_json(200, store.list(resource, selection, limit=limit, token=query.get("continue")))
            if method == "POST":
                if resource.namespaced and target.namespace is None:
                    raise ApiError(405, "MethodNotAllowed", f"create {resource.plural} in a namespace's collection")
                created = store.create(resource, self._json_body(raw_body), namespace=target.namespace)
                return self._send_json(201, _typed(resource, created))
            if method == "DELETE":
                deleted = store.delete_collection(resource, selection)
                return self._send_json(
                    200,
                    {"kind": f"{resource.kind}List", "apiVersion": resource.api_version,
                     "metadata": {"resourceVersion": str(store.revision)}, "items": deleted},
                )
            raise ApiError(405, "MethodNotAllowed", f"{method} is not supported on a collection")
        if method == "GET":
            found = store.get(resource, target.name, namespace=target.namespace)
            return self._send_json(200, _typed(resource, found))
        if method == "PUT":
            updated = store.replace(
                resource, target.name, namespace=target.namespace, body=self._json_body(raw_body), part=target.part
            )
            return self._send_json(200, _typed(resource, updated))
        if method == "PATCH":
            content_type = (self.headers.get("Content-Type") or "").split(";")[0].strip()
            try:
                patch_type = PatchType(content_type)
            except ValueError:
                raise ApiError(415, "UnsupportedMediaType", f"the patch type {content_type!r} is not supported") from None
            patched = store.patch(
                resource,
                target.name,
                namespace=target.namespace,
                patch=self._json_body(raw_body),
                patch_type=patch_type,
                part=target.part,
            )
            return self._send_json(200, _typed(resource, patched))
        if method == "DELETE" and target.part is Subresource.MAIN:
            deleted = store.delete(
                resource, target.name, namespace=target.namespace,
                grace_period_seconds=_grace_period(query, self._json_body(raw_body)),
            )
            return self._send_json(200, _typed(resource, deleted))
        raise ApiError(405, "MethodNotAllowed", f"{method} is not supported here")

    def _lab_admin(self, method: str, path: str) -> None:
        api = self.server.api
        if method == "POST" and path == "/_lab/compact":
            return self._send_json(200, {"compactedTo": str(api.store.compact())})
        if method == "GET" and path == "/_lab/watchers":
            counts = api.store.watch_counts()
            return self._send_json(200, {"watchers": sum(counts.values()), "byResource": counts})
        raise ApiError(404, "NotFound", f"no lab endpoint {method} {path}")

    # -- watch ---------------------------------------------------------------------------------
    def _write_chunk(self, data: bytes) -> None:
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))

    def _start_stream(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", JSON)
        self.send_header("Transfer-Encoding", "chunked")
        self.send_header("Cache-Control", "no-cache, private")
        self.end_headers()

    def _client_gone(self) -> bool:
        try:
            readable, _, _ = select.select([self.connection], [], [], 0)
            return bool(readable) and self.connection.recv(1, socket.MSG_PEEK) == b""
        except OSError:
            return True

    def _bookmark(self, resource: Resource, revision: int, *, initial_events_end: bool) -> bytes:
        metadata: dict = {"resourceVersion": str(revision)}
        if initial_events_end:
            metadata["annotations"] = {"k8s.io/initial-events-end": "true"}
        return _event_line(resource, {"metadata": metadata}, event_type="BOOKMARK")

    def _serve_watch(self, resource: Resource, selection: _Filter, query: dict[str, str]) -> None:
        api = self.server.api
        store = api.store
        requested_timeout = _integer(query.get("timeoutSeconds"))
        if requested_timeout and requested_timeout > 0:
            timeout = float(requested_timeout)
        else:  # spread the reconnections of many clients, like the real server
            timeout = api.watch_timeout * random.uniform(1, 2)
        bookmarks = _truthy(query.get("allowWatchBookmarks"))
        initial_events = _truthy(query.get("sendInitialEvents"))
        try:
            watch, initial, initial_revision = store.open_watch(
                resource, selection, resource_version=query.get("resourceVersion"), initial_events=initial_events
            )
        except ApiError as error:
            if error.code != 410:
                raise
            self._start_stream()
            self._write_chunk(json.dumps({"type": "ERROR", "object": error.status()}).encode() + b"\n")
            self.wfile.write(b"0\r\n\r\n")
            return
        try:
            self._start_stream()
            for line in initial:
                self._write_chunk(line)
            if initial_events and bookmarks:
                self._write_chunk(self._bookmark(resource, initial_revision, initial_events_end=True))
            self._stream_events(watch, timeout=timeout, bookmarks=bookmarks)
            if api.stopping.is_set():
                self.close_connection = True
            self.wfile.write(b"0\r\n\r\n")
        except OSError:
            self.close_connection = True
        finally:
            store.close_watch(watch)

    def _stream_events(self, watch: _Watch, *, timeout: float, bookmarks: bool) -> None:
        api = self.server.api
        now = time.monotonic()
        deadline = now + timeout
        next_bookmark = now + api.bookmark_interval if bookmarks else float("inf")
        while not api.stopping.is_set():
            now = time.monotonic()
            if now >= deadline:
                return
            wait = max(0.0, min(deadline, next_bookmark, now + api.liveness_poll) - now)
            try:
                event = watch.queue.get(timeout=wait)
            except queue.Empty:
                event = False
            if event is None:
                return
            if event is not False:
                line = watch.render(event)
                if line is not None:
                    self._write_chunk(line)
                continue
            if self._client_gone():
                self.close_connection = True
                return
            if time.monotonic() >= next_bookmark:
                revision = api.store.progress(watch)
                if revision is not None:
                    self._write_chunk(self._bookmark(watch.resource, revision, initial_events_end=False))
                    next_bookmark = time.monotonic() + api.bookmark_interval


def _log_connection_error(server: socketserver.BaseServer, request: object, client_address: object) -> None:
    """socketserver prints tracebacks to stderr; a client resetting its connection is routine."""
    _log.debug("connection from %s ended with an error", client_address or "unix socket", exc_info=True)


class _ListeningServer(http.server.ThreadingHTTPServer):
    daemon_threads = True
    api: "ApiServer"
    handle_error = _log_connection_error

    def server_bind(self) -> None:
        # HTTPServer.server_bind resolves its own name (getfqdn): a DNS query that can hang
        # for seconds in a lab network namespace without a resolver. Nothing here needs it.
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = str(self.server_address[0]), self.server_address[1]


class _ListeningServer6(_ListeningServer):
    address_family = socket.AF_INET6


class _UnixListeningServer(socketserver.ThreadingUnixStreamServer):
    daemon_threads = True
    api: "ApiServer"
    handle_error = _log_connection_error


# --------------------------------------------------------------------------------------------
# The server object
# --------------------------------------------------------------------------------------------
class ApiServer:
    """The API test server: `start()` serves on background threads, `stop()` ends everything."""

    def __init__(
        self,
        *,
        state_file: str | None = None,
        history: int = 10000,
        bookmark_interval: float = 5.0,
        watch_timeout: float = 300.0,
        service_cidr: str = "10.96.0.0/16",
    ) -> None:
        self.bookmark_interval = bookmark_interval
        self.watch_timeout = watch_timeout
        self.liveness_poll = 0.25  # how often an idle watch checks that its client is still there
        self.stopping = threading.Event()
        self.store = _Store(
            history=history, state=_StateFile(state_file) if state_file else None, service_cidr=service_cidr
        )
        self._servers: list[socketserver.BaseServer] = []
        self._threads: list[threading.Thread] = []
        self._connections: set[socket.socket] = set()
        self._connections_lock = threading.Lock()
        self._host = ""
        self._port = 0
        self.unix_path: str | None = None

    # -- lifecycle -----------------------------------------------------------------------------
    def start(self, *, host: str = "127.0.0.1", port: int = 0, unix_path: str | None = None) -> None:
        if self._servers:
            raise RuntimeError("the API server is already started")
        server_class = _ListeningServer6 if ":" in host else _ListeningServer
        tcp = server_class((host, port), _Handler)
        tcp.api = self
        self._servers.append(tcp)
        self._host = host
        self._port = tcp.server_address[1]
        if unix_path is not None:
            if os.path.exists(unix_path):
                os.unlink(unix_path)
            unix = _UnixListeningServer(unix_path, _Handler)
            unix.api = self
            self._servers.append(unix)
            self.unix_path = unix_path
        for server in self._servers:
            thread = threading.Thread(
                target=server.serve_forever, kwargs={"poll_interval": 0.05}, name="lab-apiserver", daemon=True
            )
            thread.start()
            self._threads.append(thread)

    def stop(self) -> None:
        """Close the listeners, end every watch stream and connection, save the state."""
        self.stopping.set()
        self.store.end_watches()
        for server in self._servers:
            server.shutdown()
            server.server_close()
        with self._connections_lock:
            connections = list(self._connections)
        for connection in connections:
            try:
                connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        deadline = time.monotonic() + 2.0
        while self.store.watch_counts() and time.monotonic() < deadline:
            time.sleep(0.01)
        for thread in self._threads:
            thread.join(timeout=1.0)
        if self.unix_path and os.path.exists(self.unix_path):
            os.unlink(self.unix_path)
        self.store.close()

    def __enter__(self) -> "ApiServer":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def connection_opened(self, connection: socket.socket) -> None:
        with self._connections_lock:
            self._connections.add(connection)

    def connection_closed(self, connection: socket.socket) -> None:
        with self._connections_lock:
            self._connections.discard(connection)

    @property
    def port(self) -> int:
        return self._port

    @property
    def server_address(self) -> str:
        host = "127.0.0.1" if self._host in ("", "0.0.0.0") else "::1" if self._host == "::" else self._host
        return f"[{host}]:{self._port}" if ":" in host else f"{host}:{self._port}"

    @property
    def url(self) -> str:
        """http://host:port to reach the TCP listener (an unspecified address becomes loopback)."""
        return f"http://{self.server_address}"

    # -- in-process helpers (the same code paths as HTTP; results are copies) --------------------
    @property
    def resource_version(self) -> int:
        return self.store.revision

    def create(self, obj: dict) -> dict:
        resource = resource_for(obj.get("apiVersion", ""), obj.get("kind", ""))
        namespace = (obj.get("metadata") or {}).get("namespace") or ("default" if resource.namespaced else None)
        return _clone(_typed(resource, self.store.create(resource, _clone(obj), namespace=namespace)))

    def get(self, resource: Resource, name: str, *, namespace: str | None = None) -> dict:
        return _clone(_typed(resource, self.store.get(resource, name, namespace=namespace)))

    def list(
        self, resource: Resource, *, namespace: str | None = None, label_selector: str | None = None
    ) -> list[dict]:
        scope = namespace if resource.namespaced else None
        selection = _Filter(scope, LabelSelector.parse(label_selector), FieldSelector([]))
        items = self.store.list(resource, selection, limit=0, token=None)["items"]
        return [_clone(_typed(resource, obj)) for obj in items]

    def update(self, obj: dict, *, part: Subresource = Subresource.MAIN) -> dict:
        resource = resource_for(obj.get("apiVersion", ""), obj.get("kind", ""))
        metadata = obj.get("metadata") or {}
        namespace = metadata.get("namespace") or ("default" if resource.namespaced else None)
        updated = self.store.replace(
            resource, metadata.get("name", ""), namespace=namespace, body=_clone(obj), part=part
        )
        return _clone(_typed(resource, updated))

    def patch(
        self,
        resource: Resource,
        name: str,
        patch: dict | list,
        *,
        namespace: str | None = None,
        patch_type: PatchType = PatchType.MERGE,
        part: Subresource = Subresource.MAIN,
    ) -> dict:
        patched = self.store.patch(
            resource, name, namespace=namespace, patch=_clone(patch), patch_type=patch_type, part=part
        )
        return _clone(_typed(resource, patched))

    def delete(
        self, resource: Resource, name: str, *, namespace: str | None = None, grace_period_seconds: int | None = None
    ) -> dict:
        deleted = self.store.delete(resource, name, namespace=namespace, grace_period_seconds=grace_period_seconds)
        return _clone(_typed(resource, deleted))

    def compact(self) -> int:
        return self.store.compact()

    def watcher_count(self) -> int:
        return sum(self.store.watch_counts().values())


# --------------------------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------------------------
def _parse_listen(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit():
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, not {text!r}")
    return host.strip("[]"), int(port)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m netagent.lab.apiserver", description=__doc__.splitlines()[0])
    parser.add_argument("--listen", type=_parse_listen, default=("127.0.0.1", 0), metavar="HOST:PORT")
    parser.add_argument("--unix", metavar="PATH", help="also listen on this unix socket")
    parser.add_argument("--state", metavar="FILE", help="persist objects and the resourceVersion here")
    parser.add_argument("--bookmark-interval", type=float, default=5.0, metavar="SECONDS")
    parser.add_argument("--history", type=int, default=10000, metavar="EVENTS")
    parser.add_argument("--log-level", default="WARNING")
    parser.add_argument("--endpointslice-controller", action="store_true",
                        help="also run the lab's EndpointSlice controller (slices for Services with selectors)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    stop_requested = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop_requested.set())
    signal.signal(signal.SIGINT, lambda *_: stop_requested.set())
    server = ApiServer(state_file=args.state, history=args.history, bookmark_interval=args.bookmark_interval)
    host, port = args.listen
    controller = None
    if args.endpointslice_controller:
        from netagent.lab.endpointslice_controller import EndpointSliceController  # it imports this module

        controller = EndpointSliceController(server.store)
        controller.start()  # before serving: its start-up sync sees the state as loaded
    server.start(host=host, port=port, unix_path=args.unix)
    print(f"listening {server.url}", flush=True)
    while not stop_requested.wait(0.5):
        pass
    if controller is not None:
        controller.stop()
    server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())

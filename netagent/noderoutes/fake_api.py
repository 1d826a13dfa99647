"""`FakeNodeApi`: the API server as `NodeAgent` sees it (`host.NodeApi`), in memory.

It holds Nodes by key as the server would. A watch from `watch()` lists them when started
(an add for each, then `on_synced`) and from then on hears every `put` and `delete` at once,
on the caller's thread, as a reflector's handler would on its own. `annotate` merges into the
stored Node and delivers the update, as our own write comes back through the watch; every
call is recorded in `patches`, and `refuse_annotations` makes the next ones fail as an API
outage would. Objects are stored as given (a test may store what no real server would
serve): the watch's handler judges them, as it judges what a reflector delivers.
"""
from __future__ import annotations

import copy
import threading
from collections.abc import Mapping

from netagent.kube.reflector import EventHandler, ReflectorStats
from netagent.kube.resources import NODES
from netagent.noderoutes.host import NodeApi


class FakeNodeStore:
    def __init__(self) -> None:
        self.objects: dict[str, dict] = {}

    def get(self, key: str) -> dict | None:
        return self.objects.get(key)

    def keys(self) -> list[str]:
        return list(self.objects)


class FakeNodeWatch:
    def __init__(self, store: FakeNodeStore, handler: EventHandler) -> None:
        self.resource = NODES
        self.stats = ReflectorStats()
        self.store = store
        self.synced = threading.Event()
        self.handler = handler
        self.running = False

    def start(self) -> None:
        self.running = True
        for obj in list(self.store.objects.values()):
            self.handler.on_add(obj)
        self.synced.set()
        self.handler.on_synced()

    def stop(self) -> None:
        self.running = False


class FakeNodeApi(NodeApi):
    def __init__(self) -> None:
        self.store = FakeNodeStore()
        self.watches: list[FakeNodeWatch] = []
        self.patches: list[tuple[str, dict]] = []
        self.refuse_annotations = False

    def watch(self, handler: EventHandler) -> FakeNodeWatch:
        watch = FakeNodeWatch(self.store, handler)
        self.watches.append(watch)
        return watch

    def put(self, obj: dict, *, key: str | None = None) -> None:
        """Store `obj` under `key` (its metadata.name by default) and tell the running watches."""
        name = key if key is not None else obj["metadata"]["name"]
        old = self.store.objects.get(name)
        self.store.objects[name] = obj
        for watch in self._running():
            if old is None:
                watch.handler.on_add(obj)
            else:
                watch.handler.on_update(old, obj)

    def delete(self, name: str) -> None:
        obj = self.store.objects.pop(name)
        for watch in self._running():
            watch.handler.on_delete(obj)

    def annotate(self, node_name: str, annotations: Mapping[str, str]) -> None:
        self.patches.append((node_name, dict(annotations)))
        if self.refuse_annotations:
            raise ConnectionRefusedError(f"annotating node {node_name}: the API server is unreachable")
        current = self.store.get(node_name)
        if current is None:
            raise LookupError(f"nodes {node_name!r} not found")
        updated = copy.deepcopy(current)
        updated.setdefault("metadata", {}).setdefault("annotations", {}).update(annotations)
        self.put(updated, key=node_name)

    def _running(self) -> list[FakeNodeWatch]:
        return [watch for watch in self.watches if watch.running]

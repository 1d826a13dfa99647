"""Change recording: the one shape of every watch handler in netagent (ARCHITECTURE.md, seam 1).

A `ChangeRecorder` is a reflector event handler that only records `(previous, current)` per
object key under a lock and pokes its consumer (a sync runner's request); several events for
one object between two syncs collapse into one pair (the first previous, the last current),
and an add followed by a delete vanishes. Nothing is parsed on the watch thread, so no
amount of work can stall the watch. The consumer drains the recorder on its sync thread and
`requeue`s what it could not apply, so a failed sync loses no change.
The node agent (Nodes), the service proxy (Services, EndpointSlices, its own Node) and the
policy engine all record this way.

`FanOut` lets several consumers share one reflector (client-go's shared informer), so a
process watches each resource once: the node agent and the service proxy share the Nodes.
"""
from __future__ import annotations

import threading
from collections.abc import Callable

from netagent.kube.reflector import EventHandler
from netagent.kube.resources import object_key

Change = tuple[dict | None, dict | None]


class ChangeRecorder:
    """A reflector handler that records changes per key and calls `on_change` after each.

    `accept(obj)` False: the object is not this recorder's concern (another node's Node).
    `relevant(old, new)` False: the update changes nothing the consumer reads (a heartbeat).
    """

    def __init__(self, name: str, *, on_change: Callable[[], None] = lambda: None,
                 accept: Callable[[dict], bool] | None = None,
                 relevant: Callable[[dict, dict], bool] | None = None) -> None:
        self.name = name
        self.synced = threading.Event()
        self._on_change = on_change
        self._accept = accept
        self._relevant = relevant
        self._lock = threading.Lock()
        self._pending: dict[str, Change] = {}
        self.total_changes = 0

    def on_add(self, obj: dict) -> None:
        self._record(obj, None, obj)

    def on_update(self, old: dict, new: dict) -> None:
        if self._relevant is None or self._relevant(old, new):
            self._record(new, old, new)

    def on_delete(self, obj: dict) -> None:
        self._record(obj, obj, None)

    def on_synced(self) -> None:
        self.synced.set()
        self._on_change()

    def _record(self, obj: dict, previous: dict | None, current: dict | None) -> None:
        if self._accept is not None and not self._accept(obj):
            return
        key = object_key(obj)
        with self._lock:
            if key in self._pending:
                previous = self._pending[key][0]
            if previous is None and current is None:
                self._pending.pop(key, None)
            else:
                self._pending[key] = (previous, current)
            self.total_changes += 1
        self._on_change()

    def pending(self) -> int:
        with self._lock:
            return len(self._pending)

    def drain(self) -> dict[str, Change]:
        with self._lock:
            pending, self._pending = self._pending, {}
        return pending

    def requeue(self, changes: dict[str, Change]) -> None:
        """Put back drained changes a consumer could not apply (its sync failed), so none is
        lost: each is older than anything recorded since, so it keeps its previous and takes
        the newer current, as events collapse in `_record`."""
        with self._lock:
            for key, (previous, current) in changes.items():
                newer = self._pending.get(key)
                if newer is not None:
                    current = newer[1]
                if previous is None and current is None:
                    self._pending.pop(key, None)
                else:
                    self._pending[key] = (previous, current)


class FanOut:
    """One reflector's events delivered to several handlers, in the order given."""

    def __init__(self, *handlers: EventHandler) -> None:
        self.handlers = handlers

    def on_add(self, obj: dict) -> None:
        for handler in self.handlers:
            handler.on_add(obj)

    def on_update(self, old: dict, new: dict) -> None:
        for handler in self.handlers:
            handler.on_update(old, new)

    def on_delete(self, obj: dict) -> None:
        for handler in self.handlers:
            handler.on_delete(obj)

    def on_synced(self) -> None:
        for handler in self.handlers:
            handler.on_synced()

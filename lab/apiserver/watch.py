"""Watch events: what the store records for a write, and what each watcher is sent of it.

`StoreEvent` is one write as the store made it (the history keeps them; in-process
listeners get them). `WatchStream` is one open watch: the store pushes every event of its
resource into its queue, and `render` decides what that watcher's client sees. A watcher
that selects everything gets the event's line, rendered once and shared by all of them;
with selectors, an update of an object that starts matching arrives as ADDED and one that
stops matching as DELETED (previous content, new resourceVersion), as the real server
does; `sent_revision` is what its client already has, which a BOOKMARK must exceed, as on
the real server. Lines are the wire format itself (one JSON event per line, ready for a chunk), so the
HTTP side only writes bytes. No locks here: the store registers and feeds streams under its
own lock, and each stream is read by the one request thread serving it.
"""
from __future__ import annotations

import json
import queue

from lab.apiserver.objects import typed
from lab.apiserver.selectors import Filter
from netagent.kube.resources import Resource


def event_line(resource: Resource, obj: dict, *, event_type: str) -> bytes:
    return json.dumps({"type": event_type, "object": typed(resource, obj)}, separators=(",", ":")).encode() + b"\n"


def bookmark_line(resource: Resource, revision: int, *, initial_events_end: bool) -> bytes:
    metadata: dict = {"resourceVersion": str(revision)}
    if initial_events_end:
        metadata["annotations"] = {"k8s.io/initial-events-end": "true"}
    return event_line(resource, {"metadata": metadata}, event_type="BOOKMARK")


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
            self._line = event_line(self.resource, self.obj, event_type=self.type)
        return self._line


class WatchStream:
    """One open watch stream: its filter and the queue the store pushes its events into (None: the end)."""

    def __init__(self, resource: Resource, selection: Filter) -> None:
        self.resource = resource
        self.selection = selection
        self.queue: queue.SimpleQueue[StoreEvent | None] = queue.SimpleQueue()
        self.sent_revision = 0  # the newest revision its client has (an event's, or where it started)

    def render(self, event: StoreEvent) -> bytes | None:
        """The line this watcher must see for `event`, or None; selectors turn updates into adds/deletes."""
        if self.selection.selects_all:
            return event.line()
        matches_now = self.selection.matches(event.obj)
        prev = event.prev
        if event.type != "MODIFIED" or prev is None:  # (every MODIFIED event has one)
            return event.line() if matches_now else None
        matched_before = self.selection.matches(prev)
        if matches_now and matched_before:
            return event.line()
        if matches_now:
            return event_line(event.resource, event.obj, event_type="ADDED")
        if matched_before:
            gone = {**prev, "metadata": {**prev["metadata"], "resourceVersion": str(event.revision)}}
            return event_line(event.resource, gone, event_type="DELETED")
        return None

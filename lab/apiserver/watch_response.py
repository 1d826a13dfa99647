"""A watch request answered on its HTTP connection: the long-lived, chunked response.

Newline-delimited JSON events over chunked transfer encoding, one chunk per event, as the
real server streams them: first the lines `Store.open_watch` returned (ADDED for current
objects, or the history since the requested resourceVersion), then, with
`sendInitialEvents` and bookmarks, a BOOKMARK marking the end of those, then what the
store queues until the timeout (`timeoutSeconds`, else the server's watch timeout times a
random 1-2 so that many clients do not reconnect together: the chunked body's end), the
server stopping (the connection closed with no end of the body, as a real server's shutdown
does: the client sees a broken stream), or the client going away. A 410 from `open_watch`
is not an HTTP error here: it is a 200 with one ERROR event carrying the Expired Status,
which is what clients expect; a watch from a revision the
server has not reached waits for it, quiet, as the real one does. Asked for Tables
(`kubectl get --watch`), each event carries its object as a one-row Table. Idle streams wake
every `liveness_poll` seconds to notice a closed client and to send BOOKMARKs every
`bookmark_interval` seconds when asked for, and one 2 s before the timeout as the real watch
cache does (never promising a revision while events are queued, nor one its client has
already seen). Kept apart from
`handler.py` because it is the one response with its own loop and clock; it needs of the
request only its socket and `send_response`/`send_header`.
"""
from __future__ import annotations

import http.server
import json
import queue
import random
import select
import socket
import time
from typing import TYPE_CHECKING

from lab.apiserver.errors import ApiError
from lab.apiserver.routing import truthy
from lab.apiserver.selectors import Filter, integer
from lab.apiserver.tables import render_table
from lab.apiserver.watch import WatchStream, bookmark_line
from netagent.kube.config import JSON
from netagent.kube.resources import Resource

if TYPE_CHECKING:
    from lab.apiserver.server import ApiServer

BOOKMARK_BEFORE_TIMEOUT = 2.0  # seconds: the real cacher's bookmark just before a watch times out


class WatchResponse:
    """Serves one watch request; `request.close_connection` is set when the connection must end."""

    def __init__(self, request: http.server.BaseHTTPRequestHandler, api: ApiServer) -> None:
        self.request = request
        self.api = api
        self.table = False

    def serve(self, resource: Resource, selection: Filter, query: dict[str, str], *, table: bool = False) -> None:
        self.table = table
        api = self.api
        store = api.store
        requested_timeout = integer(query.get("timeoutSeconds"))
        if requested_timeout and requested_timeout > 0:
            timeout = float(requested_timeout)
        else:  # spread the reconnections of many clients, like the real server
            timeout = api.watch_timeout * random.uniform(1, 2)
        bookmarks = truthy(query.get("allowWatchBookmarks"))
        initial_events = truthy(query.get("sendInitialEvents"))
        try:
            watch, initial, initial_revision = store.open_watch(
                resource, selection, resource_version=query.get("resourceVersion"), initial_events=initial_events
            )
        except ApiError as error:
            if error.code != 410:
                raise
            self._start_stream()
            self._write_chunk(json.dumps({"type": "ERROR", "object": error.status()}).encode() + b"\n")
            self.request.wfile.write(b"0\r\n\r\n")
            return
        try:
            self._start_stream()
            for line in initial:
                self._write_chunk(line)
            if initial_events and bookmarks:
                self._write_chunk(bookmark_line(resource, initial_revision, initial_events_end=True))
            self._stream_events(watch, timeout=timeout, bookmarks=bookmarks)
            if api.stopping.is_set():  # as the real server going down: the connection closes mid-body
                self.request.close_connection = True
                return
            self.request.wfile.write(b"0\r\n\r\n")
        except OSError:
            self.request.close_connection = True
        finally:
            store.close_watch(watch)

    def _write_chunk(self, data: bytes) -> None:
        if self.table:  # kubectl get --watch: each event's object as a one-row Table
            event = json.loads(data)
            if event.get("type") in ("ADDED", "MODIFIED", "DELETED"):
                data = json.dumps({**event, "object": render_table(event["object"])}).encode() + b"\n"
        self.request.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))

    def _start_stream(self) -> None:
        self.request.send_response(200)
        self.request.send_header("Content-Type", JSON)
        self.request.send_header("Transfer-Encoding", "chunked")
        self.request.send_header("Cache-Control", "no-cache, private")
        self.request.end_headers()

    def _client_gone(self) -> bool:
        connection = self.request.connection
        try:
            readable, _, _ = select.select([connection], [], [], 0)
            return bool(readable) and connection.recv(1, socket.MSG_PEEK) == b""
        except OSError:
            return True

    def _stream_events(self, watch: WatchStream, *, timeout: float, bookmarks: bool) -> None:
        api = self.api
        now = time.monotonic()
        deadline = now + timeout
        next_bookmark = _next_bookmark(now, deadline, api.bookmark_interval) if bookmarks else float("inf")
        while not api.stopping.is_set():
            now = time.monotonic()
            if now >= deadline:
                return
            wait = max(0.0, min(deadline, next_bookmark, now + api.liveness_poll) - now)
            try:
                event = watch.queue.get(timeout=wait)
            except queue.Empty:
                pass  # idle: check the client, maybe send a bookmark
            else:
                if event is None:  # the server is stopping
                    return
                if event.revision <= watch.sent_revision:  # a watch from a revision not reached yet waits
                    continue
                line = watch.render(event)
                if line is not None:
                    self._write_chunk(line)
                    watch.sent_revision = event.revision
                continue
            if self._client_gone():
                self.request.close_connection = True
                return
            if time.monotonic() >= next_bookmark:
                revision = api.store.progress(watch)
                if revision is not None:
                    if revision > watch.sent_revision:  # the real one sends none that tells nothing new
                        self._write_chunk(bookmark_line(watch.resource, revision, initial_events_end=False))
                    next_bookmark = _next_bookmark(time.monotonic(), deadline, api.bookmark_interval)


def _next_bookmark(now: float, deadline: float, interval: float) -> float:
    """When the next BOOKMARK is due, as the real watch cache decides: every `interval`, but
    never later than `BOOKMARK_BEFORE_TIMEOUT` before the watch's deadline, so that a client
    resumes from a recent revision; once that moment has passed, no more (inf)."""
    due = now + interval
    before_timeout = deadline - BOOKMARK_BEFORE_TIMEOUT
    if before_timeout < due:
        due = before_timeout
    return due if due >= now else float("inf")

"""Warning Events on API objects, posted off the caller's thread, bounded and best effort.

The agent tells an object's owner why it refused the object (`kubectl describe` shows it)
with a core/v1 Event, as kube-proxy and the kubelet do. Posting must never slow or stall a
sync, and a hostile cluster must not turn it into a flood, so:

- `post()` only queues (a bounded queue: when full, the Event is dropped and counted);
- one thread posts them, each with a short timeout; a failure is logged at DEBUG and
  forgotten (the rejection itself stays in the log and the metrics);
- the same (object, reason, message) is posted at most once per `repeat_after` seconds.

Cluster-scoped objects (Nodes) get their Events in `default`, as the kubelet's do.
"""
from __future__ import annotations

import logging
import queue
import threading
import time
from datetime import datetime, timezone
from typing import Callable, Protocol

from netagent.kube.config import request_json

log = logging.getLogger("netagent.kube.events")

API_VERSIONS = {"Node": "v1", "Pod": "v1", "Namespace": "v1", "Service": "v1",
                "EndpointSlice": "discovery.k8s.io/v1", "NetworkPolicy": "networking.k8s.io/v1"}
MAX_MESSAGE = 1024


class EventTarget(Protocol):
    """The object an Event is about (e.g. `infra/rejections.ObjectRef`); hashable."""
    @property
    def kind(self) -> str: ...
    @property
    def namespace(self) -> str: ...
    @property
    def name(self) -> str: ...
    @property
    def uid(self) -> str: ...


def render_event(target: EventTarget, *, reason: str, message: str, component: str, host: str,
                 now: datetime) -> dict:
    """The core/v1 Event body (pure)."""
    stamp = now.strftime("%Y-%m-%dT%H:%M:%SZ")
    involved = {"kind": target.kind, "name": target.name,
                "apiVersion": API_VERSIONS.get(target.kind, "v1")}
    if target.namespace:
        involved["namespace"] = target.namespace
    if target.uid:
        involved["uid"] = target.uid
    return {
        "apiVersion": "v1", "kind": "Event",
        "metadata": {"generateName": "netagent-", "namespace": target.namespace or "default"},
        "involvedObject": involved, "type": "Warning", "reason": reason,
        "message": message[:MAX_MESSAGE], "source": {"component": component, "host": host},
        "reportingComponent": component, "reportingInstance": host,
        "firstTimestamp": stamp, "lastTimestamp": stamp, "count": 1,
    }


Send = Callable[[str, dict], None]  # (namespace, Event body)


class EventPoster:
    """Queue Warning Events and post them from one background thread (`send(namespace, body)`,
    by default a POST through `api_client`)."""

    def __init__(self, api_client, *, component: str, host: str, capacity: int = 256,
                 repeat_after: float = 600.0, timeout: float = 5.0, send: Send | None = None) -> None:
        self._api_client = api_client
        self._send = send or self._post
        self._component, self._host = component, host
        self._queue: queue.Queue[dict | None] = queue.Queue(maxsize=capacity)
        self._repeat_after, self._timeout = repeat_after, timeout
        self._last_posted: dict[tuple, float] = {}
        self.dropped = 0
        self.posted = 0
        self._thread = threading.Thread(target=self._run, name="event-poster", daemon=True)
        self._thread.start()

    def post(self, target: EventTarget, *, reason: str, message: str) -> None:
        now = time.monotonic()
        key = (target, reason, message)
        last = self._last_posted.get(key)
        if last is not None and now - last < self._repeat_after:
            return
        if len(self._last_posted) > 4096:  # bounded memory under churn
            self._last_posted.clear()
        self._last_posted[key] = now
        body = render_event(target, reason=reason, message=message, component=self._component,
                            host=self._host, now=datetime.now(timezone.utc))
        try:
            self._queue.put_nowait(body)
        except queue.Full:
            self.dropped += 1

    def stop(self, timeout: float = 5.0) -> None:
        try:
            self._queue.put(None, timeout=timeout)
        except queue.Full:
            return
        self._thread.join(timeout)

    def _run(self) -> None:
        while True:
            body = self._queue.get()
            if body is None:
                return
            namespace = body["metadata"]["namespace"]
            try:
                self._send(namespace, body)
                self.posted += 1
            except Exception as exc:  # best effort: the log line and the metric already stand
                log.debug("could not post an Event on %s: %s", body["involvedObject"].get("name"), exc)

    def _post(self, namespace: str, body: dict) -> None:
        request_json(self._api_client, "POST", f"/api/v1/namespaces/{namespace}/events", body=body,
                     timeout=self._timeout)

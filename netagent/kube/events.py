"""Warning Events on API objects, posted off the caller's thread, bounded and best effort.

The agent tells an object's owner why it refused the object (`kubectl describe` shows it)
with a core/v1 Event, as kube-proxy and the kubelet do. Posting must never slow or stall a
sync, and a hostile cluster must not turn it into a flood, so:

- `post()` only queues (a bounded queue: when full, the Event is dropped and counted);
- one thread posts them, each with a short timeout; a failure is logged at DEBUG and
  forgotten (the rejection itself stays in the log and the metrics);
- deduplicated on (object, reason), never on the message: a repeat within `repeat_after`
  (10 minutes) of the Event posted for the same object and reason is suppressed, whatever
  its detail (a malformed Service updated with a changing detail costs one Event, not one
  per update), and counted: the next Event posted for them carries the latest message and,
  as client-go's correlator does, the number of occurrences in `count` (the agent's RBAC
  grants `create` on events only, so a repeat is never a PATCH);
- rate limited by token buckets, as client-go's `EventSourceObjectSpamFilter`: per object
  (`PER_OBJECT`: 5 at once, then one per 5 minutes; client-go's refill, a smaller burst since
  every node of the cluster posts on the same object) and overall (`OVERALL`: 25 at once, then
  one per 10 seconds, whatever the number of objects a tenant makes malformed). An Event over
  either limit is dropped and counted (`rate_limited`), and not remembered as posted;
- the memory of both is bounded (least recently used keys forgotten first); forgetting a key
  can cost at most one more Event, which the overall bucket still bounds.

Cluster-scoped objects (Nodes) get their Events in `default`, as the kubelet's do.
"""
from __future__ import annotations

import logging
import queue
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Callable, Generic, Protocol, TypeVar

from netagent.kube.config import request_json

log = logging.getLogger("netagent.kube.events")

API_VERSIONS = {"Node": "v1", "Pod": "v1", "Namespace": "v1", "Service": "v1",
                "EndpointSlice": "discovery.k8s.io/v1", "NetworkPolicy": "networking.k8s.io/v1"}
MAX_MESSAGE = 1024
MAX_KEYS = 4096   # (object, reason) pairs and objects remembered


@dataclass(frozen=True)
class BucketLimit:
    """A token bucket's shape: `burst` tokens at most, one more every `refill_every` seconds."""
    burst: int
    refill_every: float


PER_OBJECT = BucketLimit(burst=5, refill_every=300.0)
OVERALL = BucketLimit(burst=25, refill_every=10.0)


class _Bucket:
    def __init__(self, limit: BucketLimit, now: float) -> None:
        self.limit, self.tokens, self.stamp = limit, float(limit.burst), now

    def has(self, now: float) -> bool:
        """Refill up to `now`; whether a token is there (not taken)."""
        elapsed = max(0.0, now - self.stamp)
        self.tokens = min(float(self.limit.burst), self.tokens + elapsed / self.limit.refill_every)
        self.stamp = now
        return self.tokens >= 1.0

    def take(self) -> None:
        self.tokens -= 1.0


_K = TypeVar("_K")
_V = TypeVar("_V")


class _Lru(Generic[_K, _V]):
    """A dict of at most `limit` keys, the least recently used forgotten first."""

    def __init__(self, limit: int) -> None:
        self._items: OrderedDict[_K, _V] = OrderedDict()
        self._limit = limit

    def get(self, key: _K) -> _V | None:
        value = self._items.get(key)
        if value is not None:
            self._items.move_to_end(key)
        return value

    def put(self, key: _K, value: _V) -> None:
        self._items[key] = value
        self._items.move_to_end(key)
        while len(self._items) > self._limit:
            self._items.popitem(last=False)

    def __len__(self) -> int:
        return len(self._items)


@dataclass
class _Seen:
    """One (object, reason): when its last Event was posted, and what happened since."""
    posted_at: float | None = None
    since: int = 0                   # occurrences since that Event (suppressed or rate limited)
    first: datetime | None = None    # the first of them


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
                 now: datetime, count: int = 1, first: datetime | None = None) -> dict:
    """The core/v1 Event body (pure): `count` occurrences, the first at `first` (default `now`)."""
    stamp = now.strftime("%Y-%m-%dT%H:%M:%SZ")
    first_stamp = (first or now).strftime("%Y-%m-%dT%H:%M:%SZ")
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
        "firstTimestamp": first_stamp, "lastTimestamp": stamp, "count": count,
    }


Send = Callable[[str, dict], None]  # (namespace, Event body)


class EventPoster:
    """Queue Warning Events and post them from one background thread (`send(namespace, body)`,
    by default a POST through `api_client`), deduplicated and rate limited (module docstring)."""

    def __init__(self, api_client, *, component: str, host: str, capacity: int = 256,
                 repeat_after: float = 600.0, timeout: float = 5.0, send: Send | None = None,
                 per_object: BucketLimit = PER_OBJECT, overall: BucketLimit = OVERALL,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._api_client = api_client
        self._send = send or self._post
        self._component, self._host = component, host
        self._queue: queue.Queue[dict | None] = queue.Queue(maxsize=capacity)
        self._repeat_after, self._timeout = repeat_after, timeout
        self._per_object_limit, self._clock = per_object, clock
        self._overall = _Bucket(overall, clock())
        self._seen: _Lru[tuple[EventTarget, str], _Seen] = _Lru(MAX_KEYS)
        self._buckets: _Lru[EventTarget, _Bucket] = _Lru(MAX_KEYS)
        self._lock = threading.Lock()   # post() may be called from several sync threads
        self.dropped = 0        # the queue was full
        self.suppressed = 0     # a repeat of (object, reason) within repeat_after
        self.rate_limited = 0   # over the object's or the overall bucket
        self.posted = 0
        self._thread = threading.Thread(target=self._run, name="event-poster", daemon=True)
        self._thread.start()

    def post(self, target: EventTarget, *, reason: str, message: str) -> None:
        """Queue a Warning Event on `target`, unless it repeats (`target`, `reason`) within
        `repeat_after` or a bucket is empty; never blocks."""
        wall = datetime.now(timezone.utc)
        with self._lock:
            now = self._clock()
            seen = self._seen.get((target, reason))
            if seen is None:
                seen = _Seen()
                self._seen.put((target, reason), seen)
            seen.since += 1
            seen.first = seen.first or wall
            if seen.posted_at is not None and now - seen.posted_at < self._repeat_after:
                self.suppressed += 1
                return
            bucket = self._buckets.get(target)
            if bucket is None:
                bucket = _Bucket(self._per_object_limit, now)
                self._buckets.put(target, bucket)
            if not (bucket.has(now) and self._overall.has(now)):
                self.rate_limited += 1
                return
            bucket.take()
            self._overall.take()
            body = render_event(target, reason=reason, message=message, component=self._component,
                                host=self._host, now=wall, count=seen.since, first=seen.first)
            seen.posted_at, seen.since, seen.first = now, 0, None
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

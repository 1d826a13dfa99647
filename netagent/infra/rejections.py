"""Objects the agent refused: one record per object, counted, logged once, told to the cluster.

Every watched object is untrusted (a lax API server, a kubelet writing its own Node's
annotations, a tenant's Service or NetworkPolicy). Each consumer parses each object on its
own, inside a guard; an object it cannot use is *rejected* here with a short `reason` (a
metric label, so from a small fixed vocabulary such as `malformed`, `too-large`,
`conflict`) and a `detail` (the sentence an operator reads). A rejection costs no other
object its change. This module is the one home of that bookkeeping:

- `Rejections` is one per process; each component takes a `scope(component)` of it, so the
  proxy accepting a Node never clears the node agent's rejection of the same Node;
- `reject()` records the object; a new or changed rejection is logged at WARNING once and
  handed to `notify` (the daemon posts a Warning Event on the object, `kube/events.py`);
- `accept()` clears the record once the object is usable again or deleted;
- the gauge `netagent_rejected_objects{kind,reason}` counts the current records, and
  `snapshot()` lists them for /healthz's details and tests.

Details are made safe to log: control characters are replaced and the text is capped.
"""
from __future__ import annotations

import logging
import re
import threading
from collections import Counter
from dataclasses import dataclass
from typing import Callable

from netagent.infra.metrics import Registry

log = logging.getLogger("netagent.infra.rejections")

MAX_DETAIL_CHARS = 512
_REASON = re.compile(r"^[a-z][a-z0-9-]{0,39}$")
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def printable(text: object, *, limit: int = MAX_DETAIL_CHARS) -> str:
    """`text` as one safe line: control characters become '?', at most `limit` characters."""
    line = _CONTROL.sub("?", str(text))
    return line if len(line) <= limit else line[:limit - 3] + "..."


def _metadata_field(obj: object, name: str) -> str:
    metadata = obj.get("metadata") if isinstance(obj, dict) else None
    value = metadata.get(name) if isinstance(metadata, dict) else None
    return value if isinstance(value, str) else ""


@dataclass(frozen=True)
class ObjectRef:
    """Which API object: enough to name it in a log line and to post an Event on it."""
    kind: str
    namespace: str
    name: str
    uid: str = ""

    @classmethod
    def of(cls, kind: str, obj: object, *, key: str = "") -> ObjectRef:
        """Read defensively: a malformed object still gets a reference (its recorder key as
        the name when `metadata.name` is unusable)."""
        namespace, name = _metadata_field(obj, "namespace"), _metadata_field(obj, "name")
        if not name and key:
            namespace, _, name = key.rpartition("/")
        return cls(kind=kind, namespace=namespace, name=name, uid=_metadata_field(obj, "uid"))

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}" if self.namespace else self.name


@dataclass(frozen=True)
class Rejection:
    component: str
    ref: ObjectRef
    reason: str
    detail: str

    def describe(self) -> str:
        return f"{self.component}: {self.ref.kind} {printable(self.ref.key, limit=300)} rejected " \
               f"({self.reason}): {self.detail}"


Notify = Callable[[Rejection], None]


class Rejections:
    """The process's record of rejected objects (see the module docstring)."""

    def __init__(self, registry: Registry | None = None, *, notify: Notify | None = None) -> None:
        self._lock = threading.Lock()
        self._records: dict[tuple[str, str, str], Rejection] = {}
        self._notify = notify
        if registry is not None:
            registry.callback_gauge(
                "netagent_rejected_objects",
                "API objects currently refused (not programmed) because they are malformed, too "
                "large or in conflict, by kind and reason.",
                self._counts, labels=("kind", "reason"))

    def scope(self, component: str) -> RejectionScope:
        return RejectionScope(self, component)

    def set_notify(self, notify: Notify | None) -> None:
        self._notify = notify

    def reject(self, component: str, ref: ObjectRef, *, reason: str, detail: str) -> None:
        if not _REASON.match(reason):
            raise ValueError(f"rejection reason must be a short lower-case label, not {reason!r}")
        rejection = Rejection(component=component, ref=ref, reason=reason, detail=printable(detail))
        with self._lock:
            key = (component, ref.kind, ref.key)
            if self._records.get(key) == rejection:
                return
            self._records[key] = rejection
        log.warning("%s", rejection.describe())
        notify = self._notify
        if notify is not None:
            try:
                notify(rejection)
            except Exception:  # telling the cluster is best effort; the record stands
                log.exception("could not report a rejection")

    def accept(self, component: str, *, kind: str, key: str) -> None:
        with self._lock:
            gone = self._records.pop((component, kind, key), None)
        if gone is not None:
            log.info("%s: %s %s accepted again", component, kind, printable(key, limit=300))

    def snapshot(self, component: str | None = None) -> list[Rejection]:
        with self._lock:
            records = list(self._records.values())
        return sorted((r for r in records if component is None or r.component == component),
                      key=lambda r: (r.component, r.ref.kind, r.ref.key))

    def _counts(self) -> dict[tuple[str, ...], float]:
        with self._lock:
            counted = Counter((r.ref.kind, r.reason) for r in self._records.values())
        return {key: float(count) for key, count in counted.items()}


class RejectionScope:
    """One component's view of the process's `Rejections`."""

    def __init__(self, rejections: Rejections, component: str) -> None:
        self.rejections = rejections
        self.component = component

    def reject(self, ref: ObjectRef, *, reason: str, detail: str) -> None:
        self.rejections.reject(self.component, ref, reason=reason, detail=detail)

    def accept(self, *, kind: str, key: str) -> None:
        self.rejections.accept(self.component, kind=kind, key=key)

    def snapshot(self) -> list[Rejection]:
        return self.rejections.snapshot(self.component)

    def health_details(self) -> list[str]:
        """What /healthz lists for this component: one line per rejected object."""
        return [r.describe() for r in self.snapshot()]


def standalone(component: str) -> RejectionScope:
    """A scope of a private `Rejections`, for a component built without the daemon's
    (unit tests, the lab's CNI-only nodes)."""
    return Rejections().scope(component)

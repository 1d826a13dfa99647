"""Metrics for /metrics: counters, gauges and histograms rendered as Prometheus text 0.0.4.

The agent needs a dozen series (sync durations, failures, programmed routes and rules), and
kube-proxy's names for the proxy half; prometheus_client would be a dependency (and a
process-global default registry) for that. This module is the small part of it we use:

- a `Registry` is passed explicitly to whoever registers metrics; there is no global one,
  so tests and two runners in one process never share series by accident;
- each metric is a family with fixed label names; with labels, `.labels(**values)` returns
  the child that holds the value (created on first use, removable with `.remove()`);
  without labels the family itself is the child;
- `CallbackGauge` reads its value(s) at scrape time (sizes of caches, table entries);
- one lock per family: updates are cheap and scrapes see each family consistently;
- `Registry.render()` is pure with respect to the metrics: HELP and TYPE lines, label values
  escaped (backslash, double quote, newline), HELP escaped (backslash, newline), histogram
  buckets cumulative with `le="+Inf"`, then `_sum` and `_count`; families in registration
  order, children sorted by label values so the output is stable.
"""
from __future__ import annotations

import abc
import logging
import math
import re
import threading
from typing import Callable, Iterable, Mapping, Sequence, TypeVar

log = logging.getLogger("netagent.infra.metrics")

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

_METRIC_NAME = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
_LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")


def exponential_buckets(start: float, factor: float, count: int) -> tuple[float, ...]:
    """`count` upper bounds: start, start*factor, start*factor**2, ..."""
    if start <= 0 or factor <= 1 or count < 1:
        raise ValueError("exponential_buckets needs start > 0, factor > 1, count >= 1")
    bounds = [start]
    for _ in range(count - 1):
        bounds.append(bounds[-1] * factor)
    return tuple(bounds)


# kube-proxy's sync-duration buckets: 1 ms doubling up to about 16 s.
SYNC_DURATION_BUCKETS = exponential_buckets(0.001, 2, 15)


# ------------------------------------------------------------------ text format
def format_value(value: float) -> str:
    """A sample value: integers without a fraction, others as Python's shortest repr."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if float(value).is_integer() and abs(value) < 2 ** 53:
        return str(int(value))
    return repr(float(value))


def format_bound(bound: float) -> str:
    """A bucket's `le` value, always in float form ("1.0", "0.25", "+Inf"), the spelling
    Prometheus normalises `le` to, so label matchers on it work either way."""
    return "+Inf" if bound == math.inf else repr(float(bound))


def escape_label_value(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def _render_labels(pairs: Sequence[tuple[str, str]]) -> str:
    if not pairs:
        return ""
    return "{" + ",".join(f'{name}="{escape_label_value(value)}"' for name, value in pairs) + "}"


# ------------------------------------------------------------------ families
class _Family(abc.ABC):
    """Shared by every metric type: name, help, label names, children keyed by label values."""
    type_name = ""
    reserved_labels: frozenset[str] = frozenset()

    def __init__(self, name: str, help: str, *, labels: Sequence[str] = ()) -> None:
        if not _METRIC_NAME.match(name):
            raise ValueError(f"invalid metric name {name!r}")
        for label in labels:
            if not _LABEL_NAME.match(label) or label.startswith("__"):
                raise ValueError(f"invalid label name {label!r} on {name}")
            if label in self.reserved_labels:
                raise ValueError(f"label name {label!r} is reserved on a {self.type_name}")
        if len(set(labels)) != len(labels):
            raise ValueError(f"duplicate label names on {name}")
        self.name = name
        self.help = help
        self.label_names = tuple(labels)
        self._lock = threading.Lock()
        self._children: dict[tuple[str, ...], object] = {}
        if not self.label_names:
            self._children[()] = self._new_child()

    @abc.abstractmethod
    def _new_child(self) -> object:
        """A fresh child (one label combination's value) of this metric type."""

    def _key(self, values: Mapping[str, object]) -> tuple[str, ...]:
        if set(values) != set(self.label_names):
            raise ValueError(f"{self.name} takes labels {list(self.label_names)}, got {sorted(values)}")
        return tuple(str(values[name]) for name in self.label_names)

    def _child(self, values: Mapping[str, object]):
        key = self._key(values)
        with self._lock:
            child = self._children.get(key)
            if child is None:
                child = self._children[key] = self._new_child()
            return child

    def _unlabelled(self):
        if self.label_names:
            raise ValueError(f"{self.name} has labels {list(self.label_names)}: use .labels(...)")
        return self._children[()]

    def remove(self, **values: object) -> None:
        """Drop one child (e.g. the series of a deleted service); absent children are fine."""
        key = self._key(values)
        with self._lock:
            self._children.pop(key, None)

    def clear(self) -> None:
        if not self.label_names:
            raise ValueError(f"{self.name} has no labels to clear")
        with self._lock:
            self._children.clear()

    def sample_names(self) -> tuple[str, ...]:
        return (self.name,)

    def render_samples(self) -> list[str]:
        with self._lock:
            snapshot = [(key, self._read_child(child)) for key, child in self._children.items()]
        lines = []
        for key, value in sorted(snapshot, key=lambda item: item[0]):
            lines.extend(self._render_child(list(zip(self.label_names, key)), value))
        return lines

    def _read_child(self, child):
        return child.value

    def _render_child(self, pairs: list[tuple[str, str]], value) -> list[str]:
        return [f"{self.name}{_render_labels(pairs)} {format_value(value)}"]


class _Value:
    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0.0


class CounterChild:
    def __init__(self, family: "Counter", cell: _Value) -> None:
        self._family = family
        self._cell = cell

    def inc(self, amount: float = 1.0) -> None:
        if amount < 0:
            raise ValueError(f"{self._family.name}: a counter only goes up")
        with self._family._lock:
            self._cell.value += amount

    @property
    def value(self) -> float:
        with self._family._lock:
            return self._cell.value


class Counter(_Family):
    type_name = "counter"

    def _new_child(self) -> _Value:
        return _Value()

    def labels(self, **values: object) -> CounterChild:
        return CounterChild(self, self._child(values))

    def inc(self, amount: float = 1.0) -> None:
        CounterChild(self, self._unlabelled()).inc(amount)

    @property
    def value(self) -> float:
        return CounterChild(self, self._unlabelled()).value


class GaugeChild:
    def __init__(self, family: "Gauge", cell: _Value) -> None:
        self._family = family
        self._cell = cell

    def set(self, value: float) -> None:
        with self._family._lock:
            self._cell.value = float(value)

    def inc(self, amount: float = 1.0) -> None:
        with self._family._lock:
            self._cell.value += amount

    def dec(self, amount: float = 1.0) -> None:
        with self._family._lock:
            self._cell.value -= amount

    @property
    def value(self) -> float:
        with self._family._lock:
            return self._cell.value


class Gauge(_Family):
    type_name = "gauge"

    def _new_child(self) -> _Value:
        return _Value()

    def labels(self, **values: object) -> GaugeChild:
        return GaugeChild(self, self._child(values))

    def _only(self) -> GaugeChild:
        return GaugeChild(self, self._unlabelled())

    def set(self, value: float) -> None:
        self._only().set(value)

    def inc(self, amount: float = 1.0) -> None:
        self._only().inc(amount)

    def dec(self, amount: float = 1.0) -> None:
        self._only().dec(amount)

    @property
    def value(self) -> float:
        return self._only().value


class CallbackGauge(_Family):
    """A gauge whose value is read at scrape time.

    Without labels `read()` returns a number; with labels it returns a mapping from label
    values (a tuple in label-name order) to numbers. A `read` that raises renders no samples
    for this family (the scrape as a whole still succeeds).
    """
    type_name = "gauge"

    def __init__(self, name: str, help: str, read: Callable[[], float | Mapping[tuple[str, ...], float]],
                 *, labels: Sequence[str] = ()) -> None:
        self._read = read
        super().__init__(name, help, labels=labels)

    def _new_child(self) -> None:
        return None

    def render_samples(self) -> list[str]:
        try:
            return self._render_reading(self._read())
        except Exception:
            log.exception("metric %s: reading the callback failed", self.name)
            return []

    def _render_reading(self, reading) -> list[str]:
        if not self.label_names:
            return self._render_child([], float(reading))
        rows = sorted((tuple(str(v) for v in key), float(value)) for key, value in reading.items())
        lines = []
        for key, value in rows:
            if len(key) != len(self.label_names):
                raise ValueError(f"{len(key)} label values for {len(self.label_names)} labels")
            lines.extend(self._render_child(list(zip(self.label_names, key)), value))
        return lines


class CallbackCounter(CallbackGauge):
    """A counter whose value is read at scrape time (a total kept elsewhere: the process's CPU
    seconds, a runner's failures); `read` as `CallbackGauge`'s."""
    type_name = "counter"


class _HistogramCell:
    __slots__ = ("counts", "sum", "count")

    def __init__(self, buckets: int) -> None:
        self.counts = [0] * buckets
        self.sum = 0.0
        self.count = 0


class HistogramChild:
    def __init__(self, family: "Histogram", cell: _HistogramCell) -> None:
        self._family = family
        self._cell = cell

    def observe(self, value: float) -> None:
        index = _bucket_index(self._family.buckets, value)
        with self._family._lock:
            self._cell.counts[index] += 1
            self._cell.sum += value
            self._cell.count += 1

    @property
    def count(self) -> int:
        with self._family._lock:
            return self._cell.count

    @property
    def sum(self) -> float:
        with self._family._lock:
            return self._cell.sum


def _bucket_index(bounds: Sequence[float], value: float) -> int:
    lo, hi = 0, len(bounds) - 1
    while lo < hi:
        mid = (lo + hi) // 2
        if value <= bounds[mid]:
            hi = mid
        else:
            lo = mid + 1
    return lo


class Histogram(_Family):
    type_name = "histogram"
    reserved_labels = frozenset({"le"})

    def __init__(self, name: str, help: str, *, labels: Sequence[str] = (),
                 buckets: Iterable[float] = SYNC_DURATION_BUCKETS) -> None:
        bounds = [float(b) for b in buckets]
        if not bounds or any(b >= c for b, c in zip(bounds, bounds[1:])):
            raise ValueError(f"{name}: buckets must be non-empty and strictly increasing")
        if bounds[-1] != math.inf:
            bounds.append(math.inf)
        self.buckets = tuple(bounds)
        super().__init__(name, help, labels=labels)

    def _new_child(self) -> _HistogramCell:
        return _HistogramCell(len(self.buckets))

    def labels(self, **values: object) -> HistogramChild:
        return HistogramChild(self, self._child(values))

    def observe(self, value: float) -> None:
        HistogramChild(self, self._unlabelled()).observe(value)

    @property
    def count(self) -> int:
        return HistogramChild(self, self._unlabelled()).count

    @property
    def sum(self) -> float:
        return HistogramChild(self, self._unlabelled()).sum

    def sample_names(self) -> tuple[str, ...]:
        return (self.name + "_bucket", self.name + "_sum", self.name + "_count")

    def _read_child(self, child: _HistogramCell):
        return list(child.counts), child.sum, child.count

    def _render_child(self, pairs: list[tuple[str, str]], value) -> list[str]:
        counts, total, count = value
        lines = []
        cumulative = 0
        for bound, n in zip(self.buckets, counts):
            cumulative += n
            lines.append(f"{self.name}_bucket{_render_labels(pairs + [('le', format_bound(bound))])} "
                         f"{cumulative}")
        lines.append(f"{self.name}_sum{_render_labels(pairs)} {format_value(total)}")
        lines.append(f"{self.name}_count{_render_labels(pairs)} {count}")
        return lines


# ------------------------------------------------------------------ the registry
FamilyT = TypeVar("FamilyT", bound=_Family)


class Registry:
    """An ordered set of metric families with unique names; `render()` is the /metrics body."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._families: list[_Family] = []
        self._sample_names: set[str] = set()

    def register(self, family: FamilyT) -> FamilyT:
        names = {family.name, *family.sample_names()}
        with self._lock:
            clash = names & self._sample_names
            if clash:
                raise ValueError(f"metric name(s) already registered: {sorted(clash)}")
            self._sample_names |= names
            self._families.append(family)
        return family

    def counter(self, name: str, help: str, *, labels: Sequence[str] = ()) -> Counter:
        return self.register(Counter(name, help, labels=labels))

    def gauge(self, name: str, help: str, *, labels: Sequence[str] = ()) -> Gauge:
        return self.register(Gauge(name, help, labels=labels))

    def callback_gauge(self, name: str, help: str,
                       read: Callable[[], float | Mapping[tuple[str, ...], float]],
                       *, labels: Sequence[str] = ()) -> CallbackGauge:
        return self.register(CallbackGauge(name, help, read, labels=labels))

    def callback_counter(self, name: str, help: str,
                         read: Callable[[], float | Mapping[tuple[str, ...], float]],
                         *, labels: Sequence[str] = ()) -> CallbackCounter:
        return self.register(CallbackCounter(name, help, read, labels=labels))

    def histogram(self, name: str, help: str, *, labels: Sequence[str] = (),
                  buckets: Iterable[float] = SYNC_DURATION_BUCKETS) -> Histogram:
        return self.register(Histogram(name, help, labels=labels, buckets=buckets))

    def render(self) -> str:
        with self._lock:
            families = list(self._families)
        lines: list[str] = []
        for family in families:
            lines.append(f"# HELP {family.name} {escape_help(family.help)}")
            lines.append(f"# TYPE {family.name} {family.type_name}")
            lines.extend(family.render_samples())
        return "\n".join(lines) + "\n" if lines else ""

"""Flow records: the bounded ring of recent flows an agent keeps, their filters, their JSON
(the `/flows` page) and table (`netagent flows`), and their metrics.

A `Flow` is one event the kernel told us about (a packet a policy dropped, ...), already named
(pods as namespace/name where the address is a local pod). The `FlowRing` holds the last
`size` of them: the oldest is forgotten first, so memory is fixed whatever the traffic; and at
most `max_per_second` are taken in (a token bucket), the rest counted as sampled out, so a
flood of drops costs the agent a bounded amount of work (the kernel's log rules are rate
limited as well). Every flow gets a sequence number: `--follow` asks for those after the last
it saw. Readers take a copy under the lock; the listener thread is the only writer.

`netagent_flows_total{verdict,policy}` counts flows taken in; `netagent_flows_lost_total{reason}`
what never became one (sampled out, the kernel's buffer overrun, unreadable messages).
"""
from __future__ import annotations

import abc
import enum
import json
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Generic, Protocol, TypeVar

from netagent.infra.metrics import Counter, Registry

log = logging.getLogger("netagent.flows")
RECEIVE_TIMEOUT = 0.5          # how long a listener waits for a batch before looking at its stop flag
B = TypeVar("B")
B_co = TypeVar("B_co", covariant=True)

DEFAULT_RING_SIZE = 4096
DEFAULT_MAX_PER_SECOND = 1000
LABEL_MAX = 200                  # a metric's policy label is cut here


class Verdict(enum.Enum):
    FORWARDED = "forwarded"
    DROPPED = "dropped"
    TRANSLATED = "translated"


class LostReason(enum.Enum):
    SAMPLED_OUT = "sampled-out"      # over max_per_second
    OVERRUN = "kernel-overrun"       # the socket's buffer was full: the kernel dropped messages
    UNREADABLE = "unreadable"        # a message that could not be parsed


@dataclass(frozen=True)
class Flow:
    time: float
    verdict: Verdict
    protocol: str
    source: str                          # an address
    destination: str
    source_port: int | None = None
    destination_port: int | None = None
    source_pod: str = ""                 # ns/name when the address is a known local pod
    destination_pod: str = ""
    reason: str = ""                     # why dropped: "policy", "no-endpoints"
    direction: str = ""                  # the policy's direction: "ingress" | "egress"
    pod: str = ""                        # the pod whose policy decided
    policies: tuple[str, ...] = ()       # ns/name of the policies isolating it in that direction
    sequence: int = 0
    translated_to: str = ""              # translated: the endpoint DNAT chose (destination: the Service)
    translated_port: int | None = None

    def to_dict(self) -> dict:
        found = asdict(self)
        found["verdict"] = self.verdict.value
        found["policies"] = list(self.policies)
        return found

    @classmethod
    def from_dict(cls, data: dict) -> Flow:
        """A flow read back from `/flows`; ValueError (or KeyError, TypeError) when malformed."""
        if not isinstance(data, dict):
            raise ValueError("a flow is not an object")
        values = {name: data[name] for name in cls.__dataclass_fields__ if name in data}
        values["verdict"] = Verdict(data["verdict"])
        values["policies"] = tuple(str(p) for p in data.get("policies") or ())
        flow = cls(**values)
        if not isinstance(flow.time, (int, float)) or not isinstance(flow.sequence, int):
            raise ValueError("a flow's time or sequence is not a number")
        return flow


@dataclass(frozen=True)
class FlowFilter:
    """What `--pod`, `--namespace` and `--verdict` keep (empty: everything)."""
    pod: str = ""                        # ns/name, or a bare name
    namespace: str = ""
    verdict: Verdict | None = None

    def keeps(self, flow: Flow) -> bool:
        if self.verdict is not None and flow.verdict is not self.verdict:
            return False
        pods = [p for p in (flow.source_pod, flow.destination_pod, flow.pod) if p]
        if self.namespace and not any(p.split("/", 1)[0] == self.namespace for p in pods):
            return False
        if self.pod:
            wanted = self.pod if "/" in self.pod else None
            return any(p == wanted if wanted else p.split("/", 1)[-1] == self.pod for p in pods)
        return True


class FlowRing:
    """The last `size` flows, at most `max_per_second` taken in."""

    def __init__(self, *, size: int = DEFAULT_RING_SIZE, max_per_second: int = DEFAULT_MAX_PER_SECOND,
                 registry: Registry | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        if size < 1 or max_per_second < 1:
            raise ValueError("a flow ring needs room for one flow and one flow a second")
        self.size = size
        self.max_per_second = max_per_second
        self._flows: deque[Flow] = deque(maxlen=size)
        self._lock = threading.Lock()
        self._sequence = 0
        self._clock = clock
        self._tokens = float(max_per_second)
        self._filled_at = clock()
        self.lost: dict[LostReason, int] = dict.fromkeys(LostReason, 0)
        self._total = self._lost = None
        if registry is not None:
            self._total = registry.register(Counter(
                "netagent_flows_total", "flows recorded in the agent's flow ring (netagent flows), by verdict "
                "and by the policies that decided a drop", labels=("verdict", "policy")))
            self._lost = registry.register(Counter(
                "netagent_flows_lost_total", "flow events not recorded: over the ring's rate (sampled-out), "
                "dropped by the kernel when the agent read too slowly (kernel-overrun), unreadable", labels=("reason",)))

    def _take_token(self) -> bool:
        now = self._clock()
        self._tokens = min(float(self.max_per_second), self._tokens + (now - self._filled_at) * self.max_per_second)
        self._filled_at = now
        if self._tokens < 1.0:
            return False
        self._tokens -= 1.0
        return True

    def add(self, flow: Flow) -> bool:
        """Record `flow` (False: sampled out, counted)."""
        with self._lock:
            if not self._take_token():
                self._count_lost(LostReason.SAMPLED_OUT, 1)
                return False
            self._sequence += 1
            self._flows.append(_with_sequence(flow, self._sequence))
        if self._total is not None:
            self._total.labels(verdict=flow.verdict.value, policy=",".join(flow.policies)[:LABEL_MAX]).inc()
        return True

    def lose(self, reason: LostReason, count: int = 1) -> None:
        if count > 0:
            with self._lock:
                self._count_lost(reason, count)

    def _count_lost(self, reason: LostReason, count: int) -> None:
        self.lost[reason] += count
        if self._lost is not None:
            self._lost.labels(reason=reason.value).inc(count)

    def flows(self, *, after: int = 0, keep: FlowFilter | None = None) -> list[Flow]:
        """The flows held with a sequence above `after`, oldest first, that `keep` keeps."""
        with self._lock:
            held = list(self._flows)
        return [f for f in held if f.sequence > after and (keep is None or keep.keeps(f))]

    def to_json(self) -> str:
        """The `/flows` page: every flow held, and what was lost."""
        with self._lock:
            held = list(self._flows)
            lost = {reason.value: count for reason, count in self.lost.items()}
        return json.dumps({"size": self.size, "lost": lost, "flows": [f.to_dict() for f in held]}, sort_keys=True)


def _with_sequence(flow: Flow, sequence: int) -> Flow:
    values = {name: getattr(flow, name) for name in Flow.__dataclass_fields__}
    values["sequence"] = sequence
    return Flow(**values)


@dataclass
class FlowPage:
    """`/flows` as read back by a client."""
    flows: list[Flow] = field(default_factory=list)
    lost: dict[str, int] = field(default_factory=dict)


def parse_page(text: str) -> FlowPage:
    """`/flows`'s JSON; ValueError naming what is wrong."""
    try:
        data = json.loads(text)
        flows = [Flow.from_dict(item) for item in data["flows"]]
        lost = {str(k): int(v) for k, v in (data.get("lost") or {}).items()}
    except (ValueError, KeyError, TypeError, AttributeError) as error:
        raise ValueError(f"the agent's /flows page is not what netagent flows reads: {error}") from None
    return FlowPage(flows, lost)


def _end(address: str, port: int | None, pod: str) -> str:
    where = pod or address
    if port is None:
        return where
    return f"{where}:{port}" if ":" not in where or pod else f"[{where}]:{port}"


def describe(flow: Flow) -> str:
    """The verdict column: `dropped (policy x/deny-all, ingress of x/a)`, `forwarded`, ..."""
    if flow.verdict is Verdict.DROPPED and flow.reason == "policy":
        policies = ",".join(flow.policies) or "no policy known"
        return f"dropped by policy {policies} ({flow.direction} of {flow.pod})"
    if flow.verdict is Verdict.TRANSLATED:
        return f"translated to {_end(flow.translated_to, flow.translated_port, '')}"
    if flow.reason:
        return f"{flow.verdict.value} ({flow.reason})"
    return flow.verdict.value


def render_table(flows: Iterable[Flow]) -> str:
    """One line per flow: time (UTC), protocol, source -> destination, verdict."""
    rows = [(time.strftime("%H:%M:%S", time.gmtime(f.time)) + f".{int(f.time * 1000) % 1000:03d}", f.protocol,
             _end(f.source, f.source_port, f.source_pod), _end(f.destination, f.destination_port, f.destination_pod),
             describe(f)) for f in flows]
    header = ("TIME", "PROTO", "SOURCE", "DESTINATION", "VERDICT")
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(4)]
    return "\n".join("  ".join([*(cell.ljust(widths[i]) for i, cell in enumerate(row[:4])), row[4]]).rstrip()
                     for row in [header, *rows])


def render_json_lines(flows: Sequence[Flow]) -> str:
    return "\n".join(json.dumps(f.to_dict(), sort_keys=True) for f in flows)


class EventSocket(Protocol[B_co]):
    """A kernel event socket: a batch of what arrived within `timeout` seconds (OSError when it
    cannot be read), and close."""
    def receive(self, timeout: float) -> B_co: ...

    def close(self) -> None: ...


class FlowListener(abc.ABC, Generic[B]):
    """One kernel event socket read on its own thread into `ring`: `take` turns each batch into
    flows. `open_socket` makes the socket when `start` is called (its error is the caller's: a
    group another listener holds, a kernel without the module); a read error is logged and
    retried a second later, never ending the thread; `stop` joins it and closes the socket."""

    thread_name = "flows"

    def __init__(self, ring: FlowRing, open_socket: Callable[[], EventSocket[B]]) -> None:
        self.ring = ring
        self._open_socket = open_socket
        self._socket: EventSocket[B] | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._socket = self._open_socket()
        self._thread = threading.Thread(target=self._run, name=self.thread_name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        assert self._socket is not None
        while not self._stop.is_set():
            try:
                batch = self._socket.receive(RECEIVE_TIMEOUT)
            except OSError as error:
                log.warning("flow records: %s could not be read: %s", self.thread_name, error)
                self._stop.wait(1.0)
                continue
            self.take(batch)

    @abc.abstractmethod
    def take(self, batch: B) -> None:
        """Record a batch's flows and count what it lost."""

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5.0)
        if self._socket is not None:
            self._socket.close()
            self._socket = None

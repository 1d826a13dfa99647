"""The bounded-frequency sync runner: when the agent reconciles, never what it reconciles.

Watch handlers only record changes (ARCHITECTURE.md, seam 1) and call `request()`; one
dedicated thread calls `sync(kind)`, which applies everything recorded so far. The runner
decides *when*:

- requests are coalesced: any number of them between two runs cause one run;
- runs are rate limited by a token bucket refilled once per `min_interval` holding at most
  `burst` tokens (burst=1, the default, means runs start at least `min_interval` apart; a
  larger burst lets a quiet runner answer a short flurry at once, as kube-proxy's runner
  does with its burst of 2 for iptables);
- a FULL run happens at least once per `max_interval` after the previous FULL run (partial
  runs do not postpone it: the periodic resync exists to repair drift partial runs miss);
- a run that raises or returns `SyncResult.FAILED` is retried `retry_interval` after it
  ended, and every run after a failure is FULL until a FULL run succeeds;
- nothing runs before the first request: the owner requests once its caches are synced
  (a sync from empty caches would delete everything). That first run is FULL.

The policy is `SyncSchedule`, a pure state machine driven by explicit timestamps so it can
be tested without threads. `SyncRunner` wraps it with a thread, a lock and a `Clock`
(infra/clock.py); `FakeClock` lets tests move time by hand and `wait_settled()` tells them when the thread
has caught up, so runner tests assert counts and ordering, never wall times.

The schedule also tracks demand that no successful run has served yet (`unserved_since`:
the oldest request not covered by a successful run that started after it, a failed run's
start, or an overdue periodic resync): the health check in status_server.py reads it.
"""
from __future__ import annotations

import enum
import logging
import threading
import time
from dataclasses import dataclass
from typing import Callable

from netagent.infra.clock import Clock, MonotonicClock

log = logging.getLogger("netagent.infra.sync_runner")


class SyncKind(enum.Enum):
    """What the sync function must do: apply recorded changes, or rebuild everything."""
    PARTIAL = "partial"
    FULL = "full"


class SyncResult(enum.Enum):
    """What a sync function may return instead of raising; None counts as SUCCEEDED."""
    SUCCEEDED = "succeeded"
    FAILED = "failed"


SyncFunction = Callable[[SyncKind], "SyncResult | None"]


# ------------------------------------------------------------------ the pure policy
class _TokenBucket:
    """`burst` tokens at most, one more every `interval` seconds; interval 0 = unlimited."""

    def __init__(self, *, interval: float, burst: int, now: float) -> None:
        self.interval = interval
        self.burst = burst
        self._tokens = float(burst)
        self._stamp = now

    def _tokens_at(self, now: float) -> float:
        if self.interval == 0:
            return float(self.burst)
        return min(float(self.burst), self._tokens + (now - self._stamp) / self.interval)

    def ready_at(self) -> float:
        """The earliest time at which a token is available."""
        if self.interval == 0 or self._tokens >= 1:
            return self._stamp
        return self._stamp + (1 - self._tokens) * self.interval

    def take(self, now: float) -> None:
        self._tokens = max(0.0, self._tokens_at(now) - 1)
        self._stamp = now


class SyncSchedule:
    """When the next run is due and what kind it is; every method takes the time explicitly."""

    def __init__(self, *, min_interval: float, max_interval: float, retry_interval: float,
                 burst: int = 1, now: float) -> None:
        if min_interval < 0:
            raise ValueError("min_interval must be >= 0")
        if max_interval <= 0 or max_interval < min_interval:
            raise ValueError("max_interval must be > 0 and >= min_interval")
        if retry_interval <= 0:
            raise ValueError("retry_interval must be > 0")
        if burst < 1:
            raise ValueError("burst must be >= 1")
        self.min_interval = min_interval
        self.max_interval = max_interval
        self.retry_interval = retry_interval
        self._bucket = _TokenBucket(interval=min_interval, burst=burst, now=now)
        self._pending: SyncKind | None = None
        self._pending_since: float | None = None
        self._urgent_since: float | None = None
        self._in_flight_since: float | None = None
        self._need_full = True
        self._retry_at: float | None = None
        self._last_full_end: float | None = None
        self._running_kind: SyncKind | None = None
        self._running_since: float | None = None

    # ---------------------------------------------------------- inputs
    def request(self, kind: SyncKind, now: float) -> None:
        """Ask for a run; FULL wins over PARTIAL when both are asked before the run starts."""
        if self._pending is not SyncKind.FULL:
            self._pending = kind
        if self._pending_since is None:
            self._pending_since = now

    def request_urgent(self, kind: SyncKind, now: float) -> None:
        """Ask for a run that ignores the rate limit (operator or test asked for it)."""
        self.request(kind, now)
        if self._urgent_since is None:
            self._urgent_since = now

    def begin(self, now: float) -> SyncKind:
        """A run starts now (the caller checked `due_at() <= now`); returns its kind."""
        if self._running_kind is not None:
            raise RuntimeError("a run is already in progress")
        kind = SyncKind.FULL if self._wants_full(now) else SyncKind.PARTIAL
        self._bucket.take(now)
        self._in_flight_since = _earliest(self._in_flight_since, self._pending_since)
        self._pending = None
        self._pending_since = None
        self._urgent_since = None
        self._retry_at = None
        self._running_kind = kind
        self._running_since = now
        return kind

    def finish(self, result: SyncResult, now: float) -> None:
        """The run begun last ended now with `result`."""
        kind = self._running_kind
        if kind is None:
            raise RuntimeError("no run in progress")
        started = self._running_since
        self._running_kind = None
        self._running_since = None
        if kind is SyncKind.FULL:
            self._last_full_end = now
        if result is SyncResult.SUCCEEDED:
            self._in_flight_since = None
            if kind is SyncKind.FULL:
                self._need_full = False
        else:
            self._need_full = True
            self._retry_at = now + self.retry_interval
            self._in_flight_since = _earliest(self._in_flight_since, started)

    # ---------------------------------------------------------- outputs
    def due_at(self) -> float | None:
        """When the next run may start; None while nothing asks for one."""
        if self._running_kind is not None:
            return None
        if self._urgent_since is not None:
            return self._urgent_since
        trigger = _earliest(self._pending_since, self._retry_at, self._periodic_due_at())
        if trigger is None:
            return None
        return max(trigger, self._bucket.ready_at())

    def unserved_since(self, now: float) -> float | None:
        """Since when some demand has waited for a successful run (None: all served).

        Demand is a request, a failed run (from its start), or a periodic resync once due.
        """
        periodic = self._periodic_due_at()
        if periodic is not None and periodic > now:
            periodic = None
        return _earliest(self._pending_since, self._in_flight_since, periodic)

    def _periodic_due_at(self) -> float | None:
        if self._last_full_end is None:
            return None
        return self._last_full_end + self.max_interval

    def _wants_full(self, now: float) -> bool:
        if self._need_full or self._pending is SyncKind.FULL:
            return True
        periodic = self._periodic_due_at()
        return periodic is not None and periodic <= now


def _earliest(*times: float | None) -> float | None:
    present = [t for t in times if t is not None]
    return min(present) if present else None


# ------------------------------------------------------------------ the thread
@dataclass(frozen=True)
class SyncRunRecord:
    """One finished run, as given to the `on_run` hook (e.g. to feed a duration histogram)."""
    kind: SyncKind
    result: SyncResult
    started_at: float
    duration: float
    error: str | None


@dataclass(frozen=True)
class SyncStatus:
    """A consistent snapshot of the runner's counters; times are the runner clock's."""
    name: str
    runs: int
    full_runs: int
    failures: int
    consecutive_failures: int
    running: bool
    last_kind: SyncKind | None
    last_result: SyncResult | None
    last_duration: float | None
    last_error: str | None
    last_success_at: float | None
    last_success_wall: float | None
    unserved_since: float | None
    next_due_at: float | None


class SyncRunner:
    """Runs `sync(kind)` on one thread, as `SyncSchedule` decides; see the module docstring."""

    def __init__(self, *, name: str, sync: SyncFunction, min_interval: float, max_interval: float,
                 retry_interval: float, burst: int = 1, clock: Clock | None = None,
                 on_run: Callable[[SyncRunRecord], None] | None = None) -> None:
        self.name = name
        self.clock: Clock = clock if clock is not None else MonotonicClock()
        self._sync = sync
        self._on_run = on_run
        self._schedule = SyncSchedule(min_interval=min_interval, max_interval=max_interval,
                                      retry_interval=retry_interval, burst=burst, now=self.clock.now())
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._version = 0                   # bumped by every input the thread must look at
        self._parked: tuple[int, float | None] | None = None   # (version seen, due) while idle
        self._started_runs = 0
        self._finished_runs = 0
        self._runs = 0
        self._full_runs = 0
        self._failures = 0
        self._consecutive_failures = 0
        self._last: SyncRunRecord | None = None
        self._last_success_at: float | None = None
        self._last_success_wall: float | None = None

    # ---------------------------------------------------------- lifecycle
    def start(self) -> None:
        with self._cond:
            if self._thread is not None:
                raise RuntimeError(f"sync runner {self.name!r} already started")
            self._thread = threading.Thread(target=self._loop, name=f"sync-{self.name}", daemon=True)
            self._thread.start()

    def stop(self, timeout: float = 5.0) -> bool:
        """Stop the thread; a run in progress finishes first. True when the thread has ended."""
        with self._cond:
            self._stopping = True
            self._version += 1
            self._cond.notify_all()
            thread = self._thread
        if thread is None:
            return True
        thread.join(timeout)
        return not thread.is_alive()

    # ---------------------------------------------------------- callers (any thread)
    def request(self, kind: SyncKind = SyncKind.PARTIAL) -> None:
        """Ask for a run; never blocks on a sync in progress."""
        with self._cond:
            self._schedule.request(kind, self.clock.now())
            self._version += 1
            self._cond.notify_all()

    def run_now_and_wait(self, timeout: float, kind: SyncKind = SyncKind.FULL) -> SyncResult:
        """Run as soon as the thread is free, ignoring min_interval; wait for the result.

        The result is that of a run that started after this call. Raises TimeoutError when
        none has finished within `timeout` (real) seconds, RuntimeError when not running.
        """
        deadline = time.monotonic() + timeout
        with self._cond:
            if self._thread is None or self._stopping:
                raise RuntimeError(f"sync runner {self.name!r} is not running")
            wanted = self._started_runs + 1
            self._schedule.request_urgent(kind, self.clock.now())
            self._version += 1
            self._cond.notify_all()
            while self._finished_runs < wanted:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError(f"sync runner {self.name!r}: no run finished within {timeout}s")
                self._cond.wait(remaining)
            assert self._last is not None
            return self._last.result

    def status(self) -> SyncStatus:
        with self._cond:
            last = self._last
            return SyncStatus(
                name=self.name, runs=self._runs, full_runs=self._full_runs, failures=self._failures,
                consecutive_failures=self._consecutive_failures,
                running=self._started_runs != self._finished_runs,
                last_kind=last.kind if last else None, last_result=last.result if last else None,
                last_duration=last.duration if last else None, last_error=last.error if last else None,
                last_success_at=self._last_success_at, last_success_wall=self._last_success_wall,
                unserved_since=self._schedule.unserved_since(self.clock.now()),
                next_due_at=self._schedule.due_at())

    def wait_settled(self, timeout: float) -> bool:
        """Wait until the thread is idle with nothing due given every input so far.

        Meant for tests driving a FakeClock: after `request()` or `advance()`, this returns
        once the thread has acted on it. False when that does not happen within `timeout`
        (real) seconds.
        """
        deadline = time.monotonic() + timeout
        with self._cond:
            while not self._is_settled():
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._cond.wait(remaining)
            return True

    def _is_settled(self) -> bool:
        if self._parked is None:
            return False
        version, due = self._parked
        return version == self._version and (due is None or self.clock.now() < due)

    # ---------------------------------------------------------- the thread
    def _loop(self) -> None:
        while True:
            with self._cond:
                due_run = self._wait_for_due_run()
                if due_run is None:
                    return
                self._started_runs += 1
            record = self._invoke(*due_run)
            if self._on_run is not None:
                try:
                    self._on_run(record)
                except Exception:
                    log.exception("sync runner %s: on_run hook failed", self.name)
            with self._cond:
                self._schedule.finish(record.result, record.started_at + record.duration)
                self._count(record)
                self._finished_runs += 1
                self._cond.notify_all()

    def _wait_for_due_run(self) -> tuple[SyncKind, float] | None:
        """With the lock held: park until a run is due (its kind and start) or stop (None)."""
        while not self._stopping:
            now = self.clock.now()
            due = self._schedule.due_at()
            if due is not None and due <= now:
                return self._schedule.begin(now), now
            self._parked = (self._version, due)
            self._cond.notify_all()
            self.clock.wait(self._cond, None if due is None else due - now)
            self._parked = None
        return None

    def _invoke(self, kind: SyncKind, started: float) -> SyncRunRecord:
        error = None
        try:
            outcome = self._sync(kind)
            result = SyncResult.FAILED if outcome is SyncResult.FAILED else SyncResult.SUCCEEDED
            if result is SyncResult.FAILED:
                error = "sync reported failure"
                log.warning("sync runner %s: %s sync reported failure; retrying", self.name, kind.value)
        except Exception as e:
            result = SyncResult.FAILED
            error = f"{type(e).__name__}: {e}"
            log.exception("sync runner %s: %s sync failed; retrying", self.name, kind.value)
        duration = max(0.0, self.clock.now() - started)
        return SyncRunRecord(kind=kind, result=result, started_at=started, duration=duration, error=error)

    def _count(self, record: SyncRunRecord) -> None:
        self._last = record
        self._runs += 1
        if record.kind is SyncKind.FULL:
            self._full_runs += 1
        if record.result is SyncResult.SUCCEEDED:
            self._consecutive_failures = 0
            self._last_success_at = record.started_at + record.duration
            self._last_success_wall = self.clock.wall()
        else:
            self._failures += 1
            self._consecutive_failures += 1

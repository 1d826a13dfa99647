"""`FakeClock`: a `Clock` (clock.py) that moves only when a test says so."""
from __future__ import annotations

import threading
import weakref


class FakeClock:
    """A clock that moves only when told to; `advance()` wakes every thread waiting on it.

    A condition that has waited on this clock once is remembered, so an `advance()` that
    lands between a waiter reading the time and starting to wait still wakes it (the
    notify needs the condition's lock, which the waiter releases only inside its wait).
    """

    def __init__(self, *, start: float = 1000.0, wall_offset: float = 1_700_000_000.0) -> None:
        self._now = start
        self._wall_offset = wall_offset
        self._lock = threading.Lock()
        self._conditions: weakref.WeakSet[threading.Condition] = weakref.WeakSet()

    def now(self) -> float:
        with self._lock:
            return self._now

    def wall(self) -> float:
        with self._lock:
            return self._now + self._wall_offset

    def wait(self, cond: threading.Condition, timeout: float | None) -> None:
        with self._lock:
            self._conditions.add(cond)
        cond.wait()

    def advance(self, seconds: float) -> float:
        """Move time on; returns the new wall time."""
        if seconds < 0:
            raise ValueError("time only moves forward")
        with self._lock:
            self._now += seconds
            conditions = list(self._conditions)
        for cond in conditions:
            with cond:
                cond.notify_all()
        return self.wall()

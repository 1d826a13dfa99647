"""The one clock type: monotonic seconds for scheduling, wall seconds for reporting.

Everything that decides *when* (the sync runner, IPVS graceful removal, the lab's
EndpointSlice trigger times) takes a `Clock` rather than calling `time` itself, so tests
drive time by hand with `FakeClock` (fake_clock.py) instead of sleeping.
"""
from __future__ import annotations

import threading
import time
from typing import Protocol


class Clock(Protocol):
    """Time as the runner sees it: monotonic seconds, wall seconds, and a wait on a condition."""

    def now(self) -> float: ...

    def wall(self) -> float: ...

    def wait(self, cond: threading.Condition, timeout: float | None) -> None:
        """Wait on `cond` (held by the caller) until notified or `timeout` seconds pass."""


class MonotonicClock:
    """The real clock: time.monotonic for scheduling, time.time for reporting."""

    def now(self) -> float:
        return time.monotonic()

    def wall(self) -> float:
        return time.time()

    def wait(self, cond: threading.Condition, timeout: float | None) -> None:
        cond.wait(timeout)

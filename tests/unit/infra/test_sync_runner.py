"""SyncSchedule's policy with explicit timestamps, then SyncRunner's thread driven by a
FakeClock (counts and ordering, no wall-time asserts), and a few real-clock lifecycle checks."""
from __future__ import annotations

import threading
import time

import pytest

from netagent.infra.fake_clock import FakeClock
from netagent.infra.sync_runner import SyncKind, SyncResult, SyncRunner, SyncRunRecord, SyncSchedule

FULL, PARTIAL = SyncKind.FULL, SyncKind.PARTIAL
OK, FAILED = SyncResult.SUCCEEDED, SyncResult.FAILED
SETTLE = 30.0  # real seconds a test waits for the runner thread to catch up (never reached when passing;
               # generous because a loaded 2-core CI machine can starve a thread for seconds)


def schedule(**overrides) -> SyncSchedule:
    settings = dict(min_interval=1.0, max_interval=30.0, retry_interval=5.0, burst=1, now=0.0)
    settings.update(overrides)
    return SyncSchedule(**settings)


def run(s: SyncSchedule, now: float, result: SyncResult = OK, *, duration: float = 0.0) -> SyncKind:
    due = s.due_at()
    assert due is not None and due <= now, f"run at {now} but due at {due}"
    kind = s.begin(now)
    s.finish(result, now + duration)
    return kind


# ------------------------------------------------------------------ the pure schedule
def test_nothing_is_due_before_the_first_request():
    s = schedule()
    assert s.due_at() is None
    assert s.unserved_since(100.0) is None


def test_first_run_is_full_even_when_a_partial_was_requested():
    s = schedule()
    s.request(PARTIAL, 3.0)
    assert s.due_at() == 3.0
    assert run(s, 3.0) is FULL


def test_requests_between_runs_coalesce_into_one_run():
    s = schedule()
    for t in (1.0, 1.1, 1.2, 1.3):
        s.request(PARTIAL, t)
    assert s.due_at() == 1.0
    run(s, 1.3)
    assert s.due_at() == 1.3 + 30.0      # only the periodic resync remains


def test_min_interval_spaces_runs_from_their_starts():
    s = schedule()
    s.request(FULL, 0.0)
    run(s, 0.0, duration=0.2)
    s.request(PARTIAL, 0.3)
    assert s.due_at() == pytest.approx(1.0)
    assert run(s, 1.0) is PARTIAL
    s.request(PARTIAL, 5.0)              # long after: the token has refilled
    assert s.due_at() == 5.0


def test_burst_allows_back_to_back_runs_then_enforces_the_rate():
    s = schedule(burst=2)
    s.request(FULL, 0.0)
    run(s, 0.0)
    s.request(PARTIAL, 0.1)
    assert s.due_at() == 0.1             # second token
    run(s, 0.1)
    s.request(PARTIAL, 0.2)
    assert s.due_at() == pytest.approx(1.0)   # one token regained 1 s after the first run


def test_zero_min_interval_means_no_rate_limit():
    s = schedule(min_interval=0.0)
    s.request(FULL, 0.0)
    run(s, 0.0)
    s.request(PARTIAL, 0.0)
    assert s.due_at() == 0.0


def test_periodic_run_is_full_and_not_postponed_by_partial_runs():
    s = schedule(min_interval=0.0)
    s.request(FULL, 0.0)
    run(s, 0.0)
    for t in (10.0, 20.0, 29.0):
        s.request(PARTIAL, t)
        assert run(s, t) is PARTIAL
    assert s.due_at() == 30.0
    assert run(s, 30.0) is FULL
    assert s.due_at() == 60.0


def test_partial_request_after_the_periodic_deadline_runs_full():
    s = schedule(min_interval=0.0)
    s.request(FULL, 0.0)
    run(s, 0.0)
    s.request(PARTIAL, 31.0)
    assert run(s, 31.0) is FULL


def test_full_request_wins_over_partial_in_either_order():
    for kinds in ((PARTIAL, FULL), (FULL, PARTIAL)):
        s = schedule()
        s.request(FULL, 0.0)
        run(s, 0.0)
        s.request(kinds[0], 2.0)
        s.request(kinds[1], 2.1)
        assert run(s, 2.1) is FULL


def test_failure_retries_after_retry_interval_with_a_full_run():
    s = schedule()
    s.request(FULL, 0.0)
    run(s, 0.0)
    s.request(PARTIAL, 2.0)
    assert run(s, 2.0, FAILED, duration=0.5) is PARTIAL
    assert s.due_at() == pytest.approx(7.5)
    assert run(s, 7.5) is FULL
    s.request(PARTIAL, 9.0)
    assert run(s, 9.0) is PARTIAL        # the full run repaired everything


def test_request_during_backoff_runs_at_the_rate_limit_and_is_full():
    s = schedule()
    s.request(FULL, 0.0)
    run(s, 0.0, FAILED)
    s.request(PARTIAL, 0.5)
    assert s.due_at() == pytest.approx(1.0)
    assert run(s, 1.0) is FULL


def test_failed_partial_keeps_needing_full_until_a_full_run_succeeds():
    s = schedule(min_interval=0.0)
    s.request(FULL, 0.0)
    run(s, 0.0)
    s.request(PARTIAL, 1.0)
    run(s, 1.0, FAILED)
    assert run(s, 6.0, FAILED) is FULL
    assert run(s, 11.0) is FULL
    s.request(PARTIAL, 12.0)
    assert run(s, 12.0) is PARTIAL


def test_urgent_request_ignores_the_rate_limit():
    s = schedule(min_interval=10.0)
    s.request(FULL, 0.0)
    run(s, 0.0)
    s.request_urgent(PARTIAL, 0.1)
    assert s.due_at() == 0.1
    assert run(s, 0.1) is PARTIAL


def test_nothing_is_due_while_a_run_is_in_progress():
    s = schedule()
    s.request(FULL, 0.0)
    s.begin(0.0)
    s.request(PARTIAL, 0.5)
    assert s.due_at() is None
    with pytest.raises(RuntimeError):
        s.begin(0.5)
    s.finish(OK, 0.6)
    assert s.due_at() == pytest.approx(1.0)


def test_unserved_demand_tracks_requests_failures_and_overdue_resyncs():
    s = schedule()
    s.request(PARTIAL, 1.0)
    assert s.unserved_since(2.0) == 1.0
    s.begin(2.0)
    s.request(PARTIAL, 2.5)                  # arrives during the run: not served by it
    assert s.unserved_since(3.0) == 1.0
    s.finish(OK, 3.0)
    assert s.unserved_since(3.0) == 2.5
    run(s, 4.0)
    assert s.unserved_since(4.0) is None
    s.request(PARTIAL, 10.0)
    run(s, 10.0, FAILED)
    assert s.unserved_since(11.0) == 10.0   # the failed run's demand waits for a success
    run(s, 15.0, FAILED)
    assert s.unserved_since(16.0) == 10.0
    run(s, 20.0)
    assert s.unserved_since(20.0) is None
    assert s.unserved_since(49.0) is None
    assert s.unserved_since(51.0) == 50.0   # periodic resync due at 20 + 30 and not done


def test_periodic_failure_counts_as_demand_from_its_start():
    s = schedule()
    s.request(FULL, 0.0)
    run(s, 0.0)
    run(s, 30.0, FAILED, duration=1.0)
    assert s.unserved_since(32.0) == 30.0


@pytest.mark.parametrize("bad", [dict(min_interval=-1), dict(max_interval=0), dict(max_interval=0.5),
                                 dict(retry_interval=0), dict(burst=0)])
def test_invalid_settings_are_refused(bad):
    with pytest.raises(ValueError):
        schedule(**bad)


# ------------------------------------------------------------------ the runner on a FakeClock
class RecordingSync:
    """A sync function that records kinds, can fail on demand and can block until released."""

    def __init__(self) -> None:
        self.kinds: list[SyncKind] = []
        self.fail_next: list[object] = []      # exceptions to raise or SyncResult.FAILED to return
        self.gate: threading.Event | None = None
        self.entered = threading.Event()

    def __call__(self, kind: SyncKind):
        self.kinds.append(kind)
        self.entered.set()
        if self.gate is not None:
            self.gate.wait(SETTLE)
        if self.fail_next:
            outcome = self.fail_next.pop(0)
            if isinstance(outcome, Exception):
                raise outcome
            return outcome
        return None


@pytest.fixture
def clock():
    return FakeClock()


@pytest.fixture
def make_runner(clock):
    runners = []

    def make(sync, **overrides):
        settings = dict(name="test", sync=sync, min_interval=1.0, max_interval=30.0,
                        retry_interval=5.0, clock=clock)
        settings.update(overrides)
        runner = SyncRunner(**settings)
        runners.append(runner)
        runner.start()
        assert runner.wait_settled(SETTLE)
        return runner

    yield make
    for runner in runners:
        assert runner.stop(SETTLE)


def test_runner_waits_for_the_first_request_then_runs_full(clock, make_runner):
    sync = RecordingSync()
    runner = make_runner(sync)
    clock.advance(100.0)
    assert runner.wait_settled(SETTLE)
    assert sync.kinds == []
    runner.request(PARTIAL)
    assert runner.wait_settled(SETTLE)
    assert sync.kinds == [FULL]
    status = runner.status()
    assert (status.runs, status.full_runs, status.failures) == (1, 1, 0)
    assert status.last_success_at == clock.now()


def test_runner_holds_a_request_until_min_interval_then_runs_partial(clock, make_runner):
    sync = RecordingSync()
    runner = make_runner(sync)
    runner.request(FULL)
    assert runner.wait_settled(SETTLE)
    runner.request(PARTIAL)
    runner.request(PARTIAL)
    assert runner.wait_settled(SETTLE)
    assert sync.kinds == [FULL]
    clock.advance(0.5)
    assert runner.wait_settled(SETTLE)
    assert sync.kinds == [FULL]
    clock.advance(0.5)
    assert runner.wait_settled(SETTLE)
    assert sync.kinds == [FULL, PARTIAL]


def test_requests_during_a_run_coalesce_into_one_following_run(clock, make_runner):
    sync = RecordingSync()
    runner = make_runner(sync, min_interval=0.0)
    sync.gate = threading.Event()
    runner.request(FULL)
    assert sync.entered.wait(SETTLE)
    threads = [threading.Thread(target=runner.request) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert runner.status().running
    sync.gate.set()
    assert runner.wait_settled(SETTLE)
    assert sync.kinds == [FULL, PARTIAL]


def test_periodic_full_resync_every_max_interval(clock, make_runner):
    sync = RecordingSync()
    runner = make_runner(sync)
    runner.request(FULL)
    assert runner.wait_settled(SETTLE)
    for expected_runs in (2, 3):
        clock.advance(29.0)
        assert runner.wait_settled(SETTLE)
        assert len(sync.kinds) == expected_runs - 1
        clock.advance(1.0)
        assert runner.wait_settled(SETTLE)
        assert sync.kinds == [FULL] * expected_runs


def test_exception_is_counted_and_retried_full_after_retry_interval(clock, make_runner):
    sync = RecordingSync()
    records: list[SyncRunRecord] = []
    runner = make_runner(sync, on_run=records.append)
    runner.request(FULL)
    assert runner.wait_settled(SETTLE)
    sync.fail_next = [OSError("iptables-restore exited 4")]
    clock.advance(1.0)
    runner.request(PARTIAL)
    assert runner.wait_settled(SETTLE)
    status = runner.status()
    assert (status.runs, status.failures, status.consecutive_failures) == (2, 1, 1)
    assert status.last_error == "OSError: iptables-restore exited 4"
    assert status.last_result is FAILED
    clock.advance(4.9)
    assert runner.wait_settled(SETTLE)
    assert len(sync.kinds) == 2
    clock.advance(0.1)
    assert runner.wait_settled(SETTLE)
    assert sync.kinds == [FULL, PARTIAL, FULL]
    assert runner.status().consecutive_failures == 0
    assert [(r.kind, r.result) for r in records] == [(FULL, OK), (PARTIAL, FAILED), (FULL, OK)]


def test_returned_failure_counts_like_an_exception(clock, make_runner):
    sync = RecordingSync()
    sync.fail_next = [FAILED]
    runner = make_runner(sync)
    runner.request(FULL)
    assert runner.wait_settled(SETTLE)
    status = runner.status()
    assert (status.failures, status.last_success_at) == (1, None)
    clock.advance(5.0)
    assert runner.wait_settled(SETTLE)
    assert runner.status().last_success_at == clock.now()


def test_on_run_reports_durations_measured_on_the_runner_clock(clock, make_runner):
    records: list[SyncRunRecord] = []

    def slow_sync(kind):
        clock.advance(0.25)

    runner = make_runner(slow_sync, on_run=records.append)
    runner.request(FULL)
    assert runner.wait_settled(SETTLE)
    assert [r.duration for r in records] == [0.25]
    assert runner.status().last_duration == 0.25


def test_a_failing_hook_does_not_stop_the_runner(clock, make_runner):
    sync = RecordingSync()

    def bad_hook(record):
        raise RuntimeError("hook broke")

    runner = make_runner(sync, min_interval=0.0, on_run=bad_hook)
    runner.request(FULL)
    assert runner.wait_settled(SETTLE)
    runner.request(PARTIAL)
    assert runner.wait_settled(SETTLE)
    assert sync.kinds == [FULL, PARTIAL]


def test_run_now_and_wait_ignores_min_interval_and_returns_the_result(clock, make_runner):
    sync = RecordingSync()
    runner = make_runner(sync, min_interval=60.0, max_interval=600.0)
    assert runner.run_now_and_wait(SETTLE) is OK
    assert runner.run_now_and_wait(SETTLE, kind=PARTIAL) is OK
    sync.fail_next = [ValueError("boom")]
    assert runner.run_now_and_wait(SETTLE) is FAILED
    assert sync.kinds == [FULL, PARTIAL, FULL]


def test_run_now_and_wait_times_out_behind_a_stuck_run(clock, make_runner):
    sync = RecordingSync()
    sync.gate = threading.Event()
    runner = make_runner(sync)
    runner.request(FULL)
    assert sync.entered.wait(SETTLE)
    with pytest.raises(TimeoutError):
        runner.run_now_and_wait(0.05)
    sync.gate.set()
    assert runner.wait_settled(SETTLE)
    assert sync.kinds == [FULL, FULL]    # the waited-for run still happens once the first ends


def test_requests_before_start_are_kept(clock):
    sync = RecordingSync()
    runner = SyncRunner(name="early", sync=sync, min_interval=1.0, max_interval=30.0,
                        retry_interval=5.0, clock=clock)
    runner.request(PARTIAL)
    runner.start()
    try:
        assert runner.wait_settled(SETTLE)
        assert sync.kinds == [FULL]
    finally:
        assert runner.stop(SETTLE)


# ------------------------------------------------------------------ the runner on the real clock
def test_stop_is_prompt_while_idle_and_start_twice_is_refused():
    runner = SyncRunner(name="real", sync=lambda kind: None, min_interval=0.0,
                        max_interval=3600.0, retry_interval=60.0)
    runner.start()
    with pytest.raises(RuntimeError):
        runner.start()
    assert runner.run_now_and_wait(SETTLE) is OK
    began = time.monotonic()
    assert runner.stop(SETTLE)
    assert time.monotonic() - began < SETTLE
    with pytest.raises(RuntimeError):
        runner.run_now_and_wait(SETTLE)


def test_real_clock_rate_limit_spaces_run_starts():
    records: list[SyncRunRecord] = []
    runner = SyncRunner(name="real", sync=lambda kind: None, on_run=records.append,
                        min_interval=0.05, max_interval=3600.0, retry_interval=60.0)
    runner.start()
    try:
        runner.request(FULL)
        deadline = time.monotonic() + SETTLE
        while len(records) < 3 and time.monotonic() < deadline:
            runner.request(PARTIAL)
            time.sleep(0.005)
        assert len(records) >= 3
        starts = [r.started_at for r in records]
        assert all(b - a >= 0.05 - 1e-9 for a, b in zip(starts, starts[1:]))
        assert [r.kind for r in records[:3]] == [FULL, PARTIAL, PARTIAL]
    finally:
        assert runner.stop(SETTLE)

"""`netagent run`'s two small pieces of composition: one shutdown (what started, stopped in
reverse, a failing stop costing the others nothing) and /healthz over the background runners."""
from __future__ import annotations

from netagent.daemon.run import _Started, _with_runner_health
from netagent.infra.fake_clock import FakeClock
from netagent.infra.status_server import HealthReport
from netagent.infra.sync_runner import SyncRunner


def test_what_started_stops_in_reverse_and_a_failing_stop_does_not_stop_the_rest():
    stopped = []
    started = _Started()
    started.add(lambda: stopped.append("status"))
    started.add(lambda: 1 / 0)
    started.add(lambda: stopped.append("cni"))
    started.stop_all()
    started.stop_all()   # nothing twice
    assert stopped == ["cni", "status"]


def test_a_background_runner_is_in_health_and_unhealthy_until_it_has_run():
    runner = SyncRunner(name="cni-deferred-delete", sync=lambda kind: None, min_interval=0.0, max_interval=60.0,
                        retry_interval=1.0, clock=FakeClock())
    runners: list = []
    health = _with_runner_health(lambda: HealthReport(True, "ok", {"node": 1}), lambda: runners, stale_after=60)
    assert health() == HealthReport(True, "ok", {"node": 1})   # not started yet: not listed
    runners.append(runner)
    report = health()
    assert not report.healthy and report.reason == "cni-deferred-delete: not synced yet"
    runner.start()
    try:
        runner.request()
        assert runner.wait_settled(30)
        report = health()
        assert report.healthy and report.details["node"] == 1
        assert report.details["cni-deferred-delete"]["healthy"] is True
    finally:
        runner.stop()

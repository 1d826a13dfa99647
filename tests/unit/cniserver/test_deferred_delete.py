"""The DEL journal's worker as a `SyncRunner`: DELs complete in order, a failed one is visible in
the runner's health and kept in the journal, `stop()` finishes what was acknowledged, `start()`
replays what a previous agent left. Time is a `FakeClock`: nothing here waits on the wall."""
from __future__ import annotations

import json
import threading

import pytest

from cni.config import parse_netconf
from cni.request import CniRequest
from netagent.cniserver import deferred_delete
from netagent.cniserver.deferred_delete import DeferredDeleter, journal_dir_for
from netagent.infra.fake_clock import FakeClock
from netagent.infra.status_server import health_from_sync_runner

CONFIG = json.dumps({"cniVersion": "1.0.0", "name": "podnet", "type": "netagent",
                     "ipam": {"type": "netagent", "ranges": [[{"subnet": "10.244.1.0/24"}]]}}).encode()


@pytest.fixture(autouse=True)
def no_retry_pauses(monkeypatch):
    monkeypatch.setattr(deferred_delete, "RETRY_DELAYS", (0.0, 0.0))


def request(container: str) -> CniRequest:
    return CniRequest(command="DEL", container_id=container, ifname="eth0", netns="/proc/1/ns/net",
                      config_bytes=CONFIG)


def submit(deferred: DeferredDeleter, *containers: str) -> None:
    for container in containers:
        deferred.submit(f"na{container}", parse_netconf(CONFIG), request(container))


def test_the_journal_lives_beside_the_socket():
    assert journal_dir_for("/run/netagent/cni.sock") == "/run/netagent/pending-del"
    assert journal_dir_for("/run/x/../netagent/cni.sock") == "/run/netagent/pending-del"


def test_dels_complete_in_order_and_the_runner_is_healthy(tmp_path):
    done: list[str] = []
    deferred = DeferredDeleter(str(tmp_path), delete_now=lambda conf, req: done.append(req.container_id),
                               clock=FakeClock())
    health = health_from_sync_runner(deferred.runner, stale_after=60)
    deferred.start()
    try:
        assert deferred.runner.wait_settled(30)
        assert health().healthy   # the first run, with nothing queued
        submit(deferred, "a", "b", "c")
        assert deferred.wait_idle(30) and deferred.runner.wait_settled(30)
    finally:
        deferred.stop()
    assert done == ["a", "b", "c"] and list(tmp_path.iterdir()) == []
    assert health().healthy and deferred.runner.status().failures == 0


def test_a_del_that_keeps_failing_fails_the_run_and_stays_in_the_journal(tmp_path):
    def delete_now(conf, req):
        if req.container_id == "bad":
            raise OSError("device busy")

    deferred = DeferredDeleter(str(tmp_path), delete_now=delete_now, clock=FakeClock())
    deferred.start()
    try:
        assert deferred.runner.wait_settled(30)
        submit(deferred, "bad")
        assert deferred.wait_for("nabad", 30) and deferred.runner.wait_settled(30)
        status = deferred.runner.status()
        assert status.consecutive_failures == 1 and "nabad" in (status.last_error or "")
        report = health_from_sync_runner(deferred.runner, stale_after=60)()
        assert report.details["consecutive_failures"] == 1 and "nabad" in report.details["last_error"]
        submit(deferred, "good")   # the next run serves it: the failure stays counted, not retried
        assert deferred.wait_idle(30) and deferred.runner.wait_settled(30)
        status = deferred.runner.status()
        assert (status.failures, status.consecutive_failures) == (1, 0)
    finally:
        deferred.stop()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["nabad.json"]


def test_stop_finishes_the_dels_already_acknowledged(tmp_path):
    release = threading.Event()
    done: list[str] = []

    def delete_now(conf, req):
        if req.container_id == "first":
            assert release.wait(30)
        done.append(req.container_id)

    deferred = DeferredDeleter(str(tmp_path), delete_now=delete_now, clock=FakeClock())
    deferred.start()
    submit(deferred, "first")
    stopper = threading.Thread(target=deferred.stop)
    submit(deferred, "second", "third")
    stopper.start()
    release.set()
    stopper.join(30)
    assert not stopper.is_alive()
    assert done == ["first", "second", "third"] and list(tmp_path.iterdir()) == []


def test_start_replays_what_a_previous_agent_left(tmp_path):
    first = DeferredDeleter(str(tmp_path), delete_now=lambda conf, req: None)
    submit(first, "left")   # journaled, never started: the agent died
    done: list[str] = []
    second = DeferredDeleter(str(tmp_path), delete_now=lambda conf, req: done.append(req.container_id),
                             clock=FakeClock())
    assert second.start() == 1
    try:
        assert second.wait_idle(30)
    finally:
        second.stop()
    assert done == ["left"] and list(tmp_path.iterdir()) == []

"""The standard `process_*` metrics (`infra/process_metrics.py`) read this test process's own
numbers, in Prometheus' exposition with the types clients export (a counter for CPU); and every
sync runner's last success and failures (`infra/runner_metrics.py`) follow real syncs of a
real `SyncRunner`, a failing one counted, a runner gone leaving no series."""
from __future__ import annotations

import os
import resource
import time

from netagent.infra.metrics import Registry
from netagent.infra.process_metrics import register_process_metrics
from netagent.infra.runner_metrics import register_runner_metrics
from netagent.infra.sync_runner import SyncKind, SyncResult, SyncRunner


def samples(text: str) -> dict[str, float]:
    return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
            for line in text.splitlines() if line and not line.startswith("#")}


def test_process_metrics_are_this_process_s_own():
    registry = Registry()
    register_process_metrics(registry)
    burn = time.process_time() + 0.05
    while time.process_time() < burn:   # some CPU, so the counter is not zero
        pass
    text = registry.render()
    found = samples(text)
    assert "# TYPE process_cpu_seconds_total counter" in text
    assert found["process_cpu_seconds_total"] >= 0.05
    assert abs(found["process_cpu_seconds_total"] - sum(os.times()[:2])) < 0.5
    rss_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss   # the peak: at least the current
    assert 1 << 20 < found["process_resident_memory_bytes"] <= rss_kib * 1024 + (1 << 20)
    assert found["process_virtual_memory_bytes"] >= found["process_resident_memory_bytes"]
    assert abs(found["process_start_time_seconds"] - (time.time() - _age())) < 5
    assert 3 <= found["process_open_fds"] <= len(os.listdir("/proc/self/fd")) + 5
    assert found["process_max_fds"] == resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def _age() -> float:
    """Seconds since this process started, from /proc (independent of the module's reading)."""
    with open("/proc/uptime") as uptime:
        up = float(uptime.read().split()[0])
    with open("/proc/self/stat") as stat:
        start_ticks = int(stat.read().rpartition(")")[2].split()[19])
    return up - start_ticks / os.sysconf("SC_CLK_TCK")


def test_runner_metrics_follow_real_syncs_and_failures():
    outcomes = [True, False, False]

    def sync(kind: SyncKind) -> SyncResult:
        if not outcomes.pop(0):
            raise RuntimeError("the kernel said no")
        return SyncResult.SUCCEEDED

    runner = SyncRunner(name="demo", sync=sync, min_interval=0.001, max_interval=3600.0, retry_interval=3600.0)
    present = [runner]
    registry = Registry()
    register_runner_metrics(registry, lambda: present)
    runner.start()
    try:
        before = time.time()
        runner.request(SyncKind.FULL)
        _wait(runner, runs=1)
        found = samples(registry.render())
        assert found['netagent_sync_failures_total{runner="demo"}'] == 0
        assert before - 1 <= found['netagent_sync_last_success_timestamp_seconds{runner="demo"}'] <= time.time()
        for runs in (2, 3):
            runner.request(SyncKind.FULL)
            _wait(runner, runs=runs)
        found = samples(registry.render())
        assert found['netagent_sync_failures_total{runner="demo"}'] == 2
        assert found['netagent_sync_consecutive_failures{runner="demo"}'] == 2
    finally:
        runner.stop()
    present.clear()
    assert "demo" not in registry.render()


def _wait(runner: SyncRunner, *, runs: int) -> None:
    deadline = time.monotonic() + 30
    while runner.status().runs < runs or runner.status().running:
        assert time.monotonic() < deadline, f"{runner.status()}"
        time.sleep(0.01)

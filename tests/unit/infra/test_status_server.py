"""StatusServer over real HTTP on 127.0.0.1 (ephemeral ports), and the kube-proxy-style
health function built from a SyncRunner driven by a FakeClock."""
from __future__ import annotations

import http.client
import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from netagent.infra.fake_clock import FakeClock
from netagent.infra.http_listener import WORKERS
from netagent.infra.metrics import Registry
from netagent.infra.status_server import (
    HealthReport,
    Snapshot,
    StatusServer,
    all_healthy,
    health_from_sync_runner,
    parse_bind,
)
from netagent.infra.sync_runner import SyncKind, SyncResult, SyncRunner
from tests.unit.infra.test_metrics import parse_exposition

SETTLE = 30.0  # real seconds to wait for a thread or an HTTP answer (never reached when passing)


def get(port: int, path: str, *, host: str = "127.0.0.1") -> tuple[int, dict[str, str], str]:
    conn = http.client.HTTPConnection(host, port, timeout=SETTLE)
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        return response.status, dict(response.getheaders()), response.read().decode()
    finally:
        conn.close()


def healthy() -> HealthReport:
    return HealthReport(healthy=True, reason="ok")


@pytest.fixture
def serve():
    servers = []

    def start(*, health=healthy, registry=None, ready=None, bind="127.0.0.1:0") -> StatusServer:
        server = StatusServer(bind=bind, registry=registry or Registry(), health=health, ready=ready)
        server.start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()


# ------------------------------------------------------------------ endpoints
def test_livez_and_unknown_paths(serve):
    server = serve()
    assert server.port > 0
    status, _, body = get(server.port, "/livez")
    assert (status, body) == (200, "ok\n")
    status, _, body = get(server.port, "/nope")
    assert status == 404 and "/nope" in body


def test_healthz_is_200_with_json_when_healthy_and_503_with_the_reason_when_not(serve):
    report = {"now": HealthReport(healthy=True, reason="ok", details={"runs": 3})}
    server = serve(health=lambda: report["now"])
    status, headers, body = get(server.port, "/healthz?verbose=1")
    assert status == 200 and headers["Content-Type"] == "application/json"
    assert json.loads(body) == {"healthy": True, "reason": "ok", "details": {"runs": 3}}
    report["now"] = HealthReport(healthy=False, reason="last sync 95s ago > 60s")
    status, _, body = get(server.port, "/healthz")
    assert status == 503 and json.loads(body)["reason"] == "last sync 95s ago > 60s"


def test_a_health_function_that_raises_reports_503(serve):
    def broken() -> HealthReport:
        raise KeyError("node")

    server = serve(health=broken)
    status, _, body = get(server.port, "/healthz")
    assert status == 503 and "KeyError" in json.loads(body)["reason"]
    assert get(server.port, "/livez")[0] == 200


def test_readyz_uses_its_own_function_or_falls_back_to_health(serve):
    not_ready = serve(ready=lambda: HealthReport(healthy=False, reason="caches not synced"))
    assert get(not_ready.port, "/readyz")[0] == 503
    assert get(not_ready.port, "/healthz")[0] == 200
    fallback = serve()
    assert get(fallback.port, "/readyz")[0] == 200


def test_metrics_endpoint_serves_the_registry_in_text_format(serve):
    registry = Registry()
    registry.counter("netagent_route_sync_failures_total", "Failed route syncs.").inc(2)
    registry.gauge("netagent_peers", "Peers.", labels=("backend",)).labels(backend="vxlan").set(4)
    server = serve(registry=registry)
    status, headers, body = get(server.port, "/metrics")
    assert status == 200
    assert headers["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
    assert int(headers["Content-Length"]) == len(body.encode())
    families = parse_exposition(body)
    assert families["netagent_route_sync_failures_total"].value() == 2
    assert families["netagent_peers"].value(backend="vxlan") == 4


def test_a_blocked_health_check_does_not_block_other_requests(serve):
    release = threading.Event()
    entered = threading.Event()

    def slow_health() -> HealthReport:
        entered.set()
        release.wait(SETTLE)
        return HealthReport(healthy=True, reason="ok")

    server = serve(health=slow_health)
    results = []
    waiter = threading.Thread(target=lambda: results.append(get(server.port, "/healthz")[0]))
    waiter.start()
    try:
        assert entered.wait(SETTLE)
        assert get(server.port, "/livez")[0] == 200
        assert get(server.port, "/metrics")[0] == 200
        assert results == []
    finally:
        release.set()
        waiter.join(SETTLE)
    assert results == [200]


def test_stop_closes_the_port_and_start_twice_is_refused(serve):
    server = serve()
    port = server.port
    with pytest.raises(RuntimeError):
        server.start()
    server.stop()
    with pytest.raises(OSError):
        get(port, "/livez")
    with pytest.raises(RuntimeError):
        server.port
    server.stop()


def test_parse_bind():
    assert parse_bind("127.0.0.1:10256") == ("127.0.0.1", 10256)
    assert parse_bind(":10249") == ("0.0.0.0", 10249)
    assert parse_bind("[::1]:0") == ("::1", 0)
    for bad in ("10256", "host:", "host:port", "h:70000"):
        with pytest.raises(ValueError):
            parse_bind(bad)


def test_ipv6_loopback_bind(serve):
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as probe:
            probe.bind(("::1", 0))
    except OSError:
        pytest.skip("no IPv6 loopback here")
    server = serve(bind="[::1]:0")
    assert get(server.port, "/livez", host="::1")[0] == 200


def test_starting_does_no_name_lookup(serve, monkeypatch):
    """HTTPServer.server_bind would call socket.getfqdn, which waits out the resolver's timeout
    where DNS is unreachable; the status server must start without any such lookup."""
    def no_lookup(*args):
        raise AssertionError(f"a name lookup happened: {args}")

    monkeypatch.setattr(socket, "getfqdn", no_lookup)
    monkeypatch.setattr(socket, "gethostbyaddr", no_lookup)
    with pytest.raises(AssertionError, match="name lookup"):  # the stdlib server does look up
        ThreadingHTTPServer(("127.0.0.1", 0), BaseHTTPRequestHandler).server_close()
    for bind in ("127.0.0.1:0", "0.0.0.0:0"):
        status, _, body = get(serve(bind=bind).port, "/livez")
        assert (status, body) == (200, "ok\n")


# ------------------------------------------------------------------ health from a SyncRunner
@pytest.fixture
def clock():
    return FakeClock()


class SwitchableSync:
    def __init__(self) -> None:
        self.fail = False

    def __call__(self, kind: SyncKind):
        return SyncResult.FAILED if self.fail else None


@pytest.fixture
def sync():
    return SwitchableSync()


@pytest.fixture
def runner(clock, sync):
    runner = SyncRunner(name="routes", sync=sync, min_interval=1.0, max_interval=30.0,
                        retry_interval=5.0, clock=clock)
    runner.start()
    yield runner
    runner.stop(SETTLE)


def test_unhealthy_until_the_first_successful_sync(runner, sync):
    health = health_from_sync_runner(runner, stale_after=60.0)
    report = health()
    assert not report.healthy and report.reason == "routes: not synced yet"
    sync.fail = True
    assert runner.run_now_and_wait(SETTLE) is SyncResult.FAILED
    report = health()
    assert not report.healthy and "sync reported failure" in report.reason
    sync.fail = False
    assert runner.run_now_and_wait(SETTLE) is SyncResult.SUCCEEDED
    report = health()
    assert report.healthy and report.details["runs"] == 2 and report.details["last_success"]


def test_unhealthy_when_demand_waits_longer_than_the_threshold(runner, sync, clock):
    health = health_from_sync_runner(runner, stale_after=60.0)
    assert runner.run_now_and_wait(SETTLE) is SyncResult.SUCCEEDED
    clock.advance(10.0)
    sync.fail = True
    runner.request(SyncKind.PARTIAL)
    assert runner.wait_settled(SETTLE)
    for _ in range(12):                      # a retry every 5 s, each failing
        clock.advance(5.0)
        assert runner.wait_settled(SETTLE)
    assert health().healthy                  # pending for exactly the threshold
    clock.advance(1.0)
    assert runner.wait_settled(SETTLE)
    report = health()
    assert not report.healthy
    assert report.reason == "routes: last sync 71s ago, a sync pending for 61s > 60s"
    assert report.details["seconds_sync_pending"] == 61.0
    assert runner.status().failures == 13
    sync.fail = False
    clock.advance(4.0)                       # the next retry succeeds
    assert runner.wait_settled(SETTLE)
    assert health().healthy


def test_no_demand_means_healthy_however_old_the_last_sync(runner, clock):
    health = health_from_sync_runner(runner, stale_after=60.0)
    assert runner.run_now_and_wait(SETTLE) is SyncResult.SUCCEEDED
    for _ in range(4):                       # periodic resyncs keep it fresh; nothing waits
        clock.advance(30.0)
        assert runner.wait_settled(SETTLE)
        assert health().healthy
    assert runner.status().full_runs == 5


def test_a_stopped_runner_turns_unhealthy_once_its_resync_is_overdue(runner, clock):
    health = health_from_sync_runner(runner, stale_after=60.0)
    assert runner.run_now_and_wait(SETTLE) is SyncResult.SUCCEEDED
    assert runner.stop(SETTLE)
    clock.advance(30.0 + 60.0)
    assert health().healthy
    clock.advance(1.0)
    report = health()
    assert not report.healthy and "pending for 61s" in report.reason


def test_all_healthy_names_every_failing_check():
    ok = lambda: HealthReport(healthy=True, reason="ok", details={"runs": 1})
    bad = lambda: HealthReport(healthy=False, reason="not synced yet")
    assert all_healthy({"routes": ok, "proxy": ok})().healthy
    report = all_healthy({"routes": ok, "proxy": bad, "cni": bad})()
    assert not report.healthy
    assert report.reason == "proxy: not synced yet; cni: not synced yet"
    assert report.details["routes"] == {"healthy": True, "reason": "ok", "runs": 1}


def test_runner_durations_reach_the_metrics_endpoint(serve):
    registry = Registry()
    durations = registry.histogram("netagent_route_sync_duration_seconds", "Route sync time.",
                                   labels=("kind",))
    runner = SyncRunner(name="routes", sync=lambda kind: None, min_interval=0.0, max_interval=3600.0,
                        retry_interval=60.0,
                        on_run=lambda r: durations.labels(kind=r.kind.value).observe(r.duration))
    runner.start()
    try:
        assert runner.run_now_and_wait(SETTLE) is SyncResult.SUCCEEDED
        assert runner.run_now_and_wait(SETTLE, kind=SyncKind.PARTIAL) is SyncResult.SUCCEEDED
        server = serve(registry=registry, health=health_from_sync_runner(runner, stale_after=60.0))
        assert get(server.port, "/healthz")[0] == 200
        family = parse_exposition(get(server.port, "/metrics")[2])["netagent_route_sync_duration_seconds"]
        assert family.value("netagent_route_sync_duration_seconds_count", kind="full") == 1
        assert family.value("netagent_route_sync_duration_seconds_count", kind="partial") == 1
    finally:
        assert runner.stop(SETTLE)


# ------------------------------------------------------------------ health only, several addresses
def test_a_server_without_a_registry_serves_health_and_no_metrics():
    server = StatusServer(bind="127.0.0.1:0", registry=None, health=healthy)
    server.start()
    try:
        assert get(server.port, "/healthz")[0] == 200 and get(server.port, "/livez")[0] == 200
        assert get(server.port, "/metrics")[0] == 404
    finally:
        server.stop()


def test_one_server_listens_on_several_addresses_with_the_same_pages():
    registry = Registry()
    registry.counter("netagent_test_total", "A test counter.").inc()
    server = StatusServer(bind=["127.0.0.1:0", "127.0.0.1:0"], registry=registry, health=healthy)
    server.start()
    try:
        first, second = server.ports
        assert first != second
        assert get(first, "/metrics")[2] == get(second, "/metrics")[2]
        assert "netagent_test_total 1" in get(second, "/metrics")[2]
    finally:
        server.stop()
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", first), timeout=SETTLE)


# ------------------------------------------------------------------ snapshots: scrapes never fork per request
def policy_save_text(denied: int) -> str:
    """What `iptables-save -c -t filter` prints for the renderer's policy chains, x/a's DROP
    having counted `denied` packets (as tests/unit/policy/iptables/test_policy_readback.py builds it)."""
    from netagent.kernel.ipset import FakeIpset, iptables_references
    from netagent.kernel.iptables.fake import FakeIptables
    from netagent.kernel.pod_attachment import PodAttachment
    from netagent.policy.iptables.dataplane import IptablesDataplane
    from tests.unit.policy.iptables.test_policy_render import WEB, wanted
    iptables = FakeIptables()
    IptablesDataplane(iptables=iptables, ipset=FakeIpset(in_use=iptables_references(iptables))).apply(
        wanted(PodAttachment.BRIDGE, WEB), full=True)
    return "\n".join((f"[{denied}:{denied * 60}] " + line) if "deny ingress to x/a" in line else line
                     for line in iptables.save("filter").splitlines())


def test_concurrent_scrapes_share_one_iptables_save_a_second_and_values_still_update(monkeypatch, tmp_path):
    """The policy engine's DROP-counter gauge (registered by the real build_policy) reads
    `iptables-save -c` at scrape time: 16 concurrent scrapes run it once, the next second's
    scrape runs it again and shows the new counter. The save is counted at the runner seam
    (`IptablesRunner.save`) and held until every other scrape waits on it; time is a FakeClock."""
    from netagent.daemon import policy_start
    from netagent.daemon.config import NO_PROXY, PolicyConfig
    from netagent.daemon.dataplane import Dataplane
    from netagent.kernel.pod_attachment import PodAttachment
    from netagent.policy.kube_objects import DEFAULT_LIMITS
    from netagent.kernel.iptables.backend import IptablesBackend
    from netagent.kernel.iptables.runner import IptablesRunner
    saves: list[tuple[str | None, bool]] = []
    denied = {"packets": 7}
    release = threading.Event()

    def save(self, table=None, *, counters=False):
        saves.append((table, counters))
        assert release.wait(SETTLE)
        return policy_save_text(denied["packets"])
    monkeypatch.setattr(IptablesRunner, "save", save)
    registry = Registry()
    config = PolicyConfig(enabled=True, node_name="node-a", attachment=PodAttachment.BRIDGE, add_wait=2.0,
                          sync_period=30.0, min_sync_period=0.0, anti_spoofing=True, limits=DEFAULT_LIMITS,
                          cni_data_dir=str(tmp_path))
    policy_start.build_policy(config, dataplane=Dataplane(proxy_mode=NO_PROXY, reason="", iptables=True),
                              api_client=None, iptables_backend=IptablesBackend.LEGACY, registry=registry,
                              pod_cidrs=["10.0.0.0/24"])
    clock = FakeClock()
    server = StatusServer(bind="127.0.0.1:0", registry=registry, health=healthy, clock=clock)
    server.start()
    try:
        bodies: list[str] = []
        scrapes = [threading.Thread(target=lambda: bodies.append(get(server.port, "/metrics")[2])) for _ in range(16)]
        for scrape in scrapes:
            scrape.start()
        snapshot = server.snapshot("/metrics")
        # every worker but the refreshing one waits on it; the other scrapes wait in the queue
        wait_until(lambda: len(saves) == 1 and snapshot.waiting == WORKERS - 1,
                   what="the other workers' scrapes waiting on the one refresh")
        release.set()
        for scrape in scrapes:
            scrape.join(SETTLE)
        assert len(bodies) == 16 and len(set(bodies)) == 1
        assert saves == [("filter", True)]
        family = parse_exposition(bodies[0])["netagent_policy_denied_packets"]
        assert family.value("netagent_policy_denied_packets", pod="x/a", direction="ingress") == 7

        denied["packets"] = 9
        assert bodies[0] == get(server.port, "/metrics")[2]   # the same second: the snapshot
        assert len(saves) == 1
        clock.advance(1.0)
        family = parse_exposition(get(server.port, "/metrics")[2])["netagent_policy_denied_packets"]
        assert family.value("netagent_policy_denied_packets", pod="x/a", direction="ingress") == 9
        assert len(saves) == 2 and snapshot.refreshes == 2
    finally:
        release.set()
        server.stop()


def wait_until(condition, *, what: str) -> None:
    done = threading.Event()
    deadline = threading.Timer(SETTLE, done.set)
    deadline.start()
    try:
        while not condition():
            assert not done.wait(0.01), f"timed out waiting for {what}"
    finally:
        deadline.cancel()


def test_a_snapshot_that_raised_is_kept_as_long_and_raised_to_each_reader():
    clock = FakeClock()
    calls: list[int] = []

    def produce() -> str:
        calls.append(1)
        if len(calls) == 1:
            raise OSError("iptables-save: locked")
        return "ok"
    snapshot = Snapshot(produce, max_age=1.0, clock=clock)
    for _ in range(3):
        with pytest.raises(OSError, match="locked"):
            snapshot.get()
    assert len(calls) == 1
    clock.advance(1.0)
    assert snapshot.get() == "ok" and len(calls) == 2


def test_a_failing_page_answers_500_and_metrics_404_without_a_registry():
    def broken() -> str:
        raise OSError("iptables-save: locked")
    server = StatusServer(bind="127.0.0.1:0", registry=None, health=healthy,
                          pages={"/services": ("application/json", broken)})
    server.start()
    try:
        status, _, body = get(server.port, "/services")
        assert status == 500 and "locked" in body
    finally:
        server.stop()

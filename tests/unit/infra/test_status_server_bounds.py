"""The status servers against hostile clients, over real sockets on loopback: slow clients hold
no thread and cannot keep a fresh /healthz waiting, a head that does not arrive in time is
dropped, and health off loopback (10258, the proxy's 10256) says healthy or not, no detail."""
from __future__ import annotations

import argparse
import json
import socket
import threading
import time

import pytest

from netagent.infra import http_listener
from netagent.infra.metrics import Registry
from netagent.infra.status_server import HealthReport, StatusServer
from tests.unit.infra.test_status_server import SETTLE, get

DETAILED = HealthReport(healthy=True, reason="ok", details={
    "runs": 3, "rejected_objects": ["proxy: Service tenant-a/secret-name rejected (malformed): spec.ports is str"]})


@pytest.fixture
def serve():
    servers = []

    def start(*, health=lambda: DETAILED, bind="127.0.0.1:0") -> StatusServer:
        server = StatusServer(bind=bind, registry=Registry(), health=health)
        server.start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()


def slow_client(port: int) -> socket.socket:
    """A client that sends half a request head and stops (slowloris)."""
    client = socket.create_connection(("127.0.0.1", port), timeout=SETTLE)
    client.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
    return client


def closed_after(client: socket.socket) -> float:
    """Seconds until the server closes `client` (EOF or reset)."""
    began = time.monotonic()
    try:
        while client.recv(1024):
            pass
    except (ConnectionResetError, socket.timeout):
        pass
    return time.monotonic() - began


def test_many_slow_clients_hold_no_thread_and_a_fresh_healthz_is_answered_at_once(serve):
    server = serve()
    threads_before = threading.active_count()
    clients = [slow_client(server.port) for _ in range(3 * http_listener.MAX_CONNECTIONS)]
    try:
        time.sleep(0.2)   # every one accepted and waiting for the rest of its head
        assert threading.active_count() == threads_before   # no thread per connection
        began = time.monotonic()
        status, _, body = get(server.port, "/healthz")
        assert status == 200 and json.loads(body)["healthy"] is True
        assert time.monotonic() - began < 1.0   # not after the slow ones' deadline
        listener = server._servers[0]
        assert listener.dropped_oldest >= 2 * http_listener.MAX_CONNECTIONS   # the bound held: oldest first out
    finally:
        for client in clients:
            client.close()


def test_a_head_that_does_not_arrive_within_the_deadline_is_dropped(serve):
    server = serve()
    silent = slow_client(server.port)
    trickle = slow_client(server.port)   # a byte every 0.3 s: each read is in time, the head never is
    stop = threading.Event()

    def drip() -> None:
        while not stop.wait(0.3):
            try:
                trickle.send(b"X")
            except OSError:
                return
    dripper = threading.Thread(target=drip, daemon=True)
    dripper.start()
    try:
        for client in (silent, trickle):
            assert closed_after(client) < http_listener.HEAD_DEADLINE_SECONDS + 1.0
        assert server._servers[0].dropped_deadline == 2
    finally:
        stop.set()
        dripper.join(SETTLE)
        silent.close()
        trickle.close()


def test_an_oversized_head_is_dropped(serve):
    server = serve()
    with socket.create_connection(("127.0.0.1", server.port), timeout=SETTLE) as client:
        client.sendall(b"GET /healthz HTTP/1.1\r\n" + b"X-A: " + b"a" * (2 * http_listener.MAX_HEAD_BYTES))
        assert closed_after(client) < 1.0


def test_health_off_loopback_says_healthy_or_not_and_nothing_else(serve):
    public = serve(bind="0.0.0.0:0")
    status, _, body = get(public.port, "/healthz")
    assert (status, json.loads(body)) == (200, {"healthy": True, "reason": "ok", "details": {}})
    assert "secret-name" not in get(public.port, "/readyz")[2]
    failing = serve(bind="0.0.0.0:0", health=lambda: HealthReport(
        healthy=False, reason="proxy: last attempt: Service tenant-a/secret-name broke iptables-restore"))
    status, _, body = get(failing.port, "/healthz")
    assert (status, json.loads(body)) == (503, {"healthy": False, "reason": "unhealthy", "details": {}})
    loopback = serve(bind="127.0.0.1:0")    # the metrics address: the details live here
    assert json.loads(get(loopback.port, "/healthz")[2]) == json.loads(DETAILED.to_json())


def test_the_proxy_healthz_server_carries_no_rejection_and_the_loopback_metrics_one_does():
    """`build_proxy`'s two servers as the daemon binds them: 10256 on every address, metrics on
    loopback; a rejected Service shows on the latter only."""
    from netagent.daemon.config import parse_run_config
    from netagent.daemon.proxy_start import build_proxy
    from netagent.daemon.run import add_run_arguments
    from netagent.infra.rejections import ObjectRef, Rejections
    from netagent.kernel.families import IpFamily
    from netagent.kernel.iptables.backend import IptablesBackend
    from proxy.backend import ProxyMode
    parser = argparse.ArgumentParser()
    parser.set_defaults(cni_only=False)
    add_run_arguments(parser)
    cluster = parse_run_config(parser.parse_args([
        "--node-name", "node-a", "--cluster-cidr", "10.244.0.0/16", "--proxy-mode", "iptables",
        "--healthz-bind-address", "0.0.0.0:0", "--metrics-bind-address", "127.0.0.1:0"])).cluster
    assert cluster is not None
    scope = Rejections().scope("proxy")
    scope.reject(ObjectRef("Service", "tenant-a", "secret-name"), reason="malformed", detail="spec.ports is str")
    parts = build_proxy(cluster.proxy, mode=ProxyMode.IPTABLES, metrics_binds=cluster.status.metrics_binds,
                        api_client=None, iptables_backend=IptablesBackend.LEGACY, registry=Registry(),
                        cluster_cidrs={IpFamily.V4: "10.244.0.0/16"}, rejections=scope)
    healthz, metrics = parts.servers
    for server in parts.servers:
        server.start()
    try:
        status, _, body = get(healthz.port, "/healthz")
        assert (status, json.loads(body)) == (503, {"healthy": False, "reason": "unhealthy", "details": {}})
        assert "secret-name" in json.dumps(json.loads(get(metrics.port, "/healthz")[2])["details"])
    finally:
        for server in parts.servers:
            server.stop()

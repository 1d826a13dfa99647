"""The agent's HTTP face: /healthz, /livez, /readyz and /metrics on a background thread.

The server only reads: each request calls a health function or `Registry.render()`, both
of which take short locks and never wait for a sync, so a slow or stuck scrape can never
hold up the agent (handlers run on their own threads, with a socket timeout). It is the
stdlib's ThreadingHTTPServer because the load is a probe every few seconds and a scrape
every 15 s or so. It binds without HTTPServer's name lookup (`getfqdn`), so starting it
never waits on DNS.

Endpoints:
- `/livez`: 200 while the process serves HTTP (the kubelet's liveness probe);
- `/healthz`: the health function's `HealthReport` as JSON, 200 when healthy, else 503;
- `/readyz`: the same from a separate readiness function (defaults to the health one);
- `/metrics`: the registry in Prometheus text format 0.0.4;
- extra read-only `pages` an owner adds (the proxy's `/proxyMode` and `/services`).

`health_from_sync_runner` gives kube-proxy's healthz meaning to a `SyncRunner`: unhealthy
until the first successful sync, then unhealthy while some demand (a request, a failed run,
an overdue periodic resync) has waited longer than `stale_after` without a successful run.
Unlike kube-proxy, which is healthy before its first sync unless an update has been queued
for too long, netagent reports unhealthy until it has synced once (a node whose routes are
not programmed should not look ready), and an overdue periodic resync counts as demand (so a
runner thread that stopped running is noticed even when no events arrive).
"""
from __future__ import annotations

import json
import logging
import socket
import socketserver
import threading
from dataclasses import dataclass, field
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Mapping

from netagent.infra.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from netagent.infra.metrics import Registry
from netagent.infra.sync_runner import SyncRunner

log = logging.getLogger("netagent.infra.status_server")

REQUEST_TIMEOUT_SECONDS = 10.0


@dataclass(frozen=True)
class HealthReport:
    healthy: bool
    reason: str
    details: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps({"healthy": self.healthy, "reason": self.reason, "details": self.details},
                          sort_keys=True, default=str)


HealthFunction = Callable[[], HealthReport]


# ------------------------------------------------------------------ health functions
def _iso(wall: float | None) -> str | None:
    if wall is None:
        return None
    return datetime.fromtimestamp(wall, tz=timezone.utc).isoformat(timespec="milliseconds")


def health_from_sync_runner(runner: SyncRunner, *, stale_after: float) -> HealthFunction:
    """kube-proxy-style health for one runner (see the module docstring)."""
    if stale_after <= 0:
        raise ValueError("stale_after must be > 0")

    def health() -> HealthReport:
        status = runner.status()
        now = runner.clock.now()
        details: dict[str, Any] = {
            "runner": status.name, "runs": status.runs, "failures": status.failures,
            "consecutive_failures": status.consecutive_failures,
            "last_error": status.last_error,
            "last_success": _iso(status.last_success_wall),
            "current_time": _iso(runner.clock.wall()),
        }
        if status.last_success_at is None:
            reason = f"{status.name}: not synced yet"
            if status.last_error:
                reason += f" (last attempt: {status.last_error})"
            return HealthReport(healthy=False, reason=reason, details=details)
        since_success = now - status.last_success_at
        details["seconds_since_success"] = round(since_success, 3)
        if status.unserved_since is not None:
            waiting = now - status.unserved_since
            details["seconds_sync_pending"] = round(waiting, 3)
            if waiting > stale_after:
                return HealthReport(
                    healthy=False, details=details,
                    reason=(f"{status.name}: last sync {since_success:.0f}s ago, a sync pending for "
                            f"{waiting:.0f}s > {stale_after:g}s"))
        return HealthReport(healthy=True, reason="ok", details=details)

    return health


def all_healthy(checks: Mapping[str, HealthFunction]) -> HealthFunction:
    """Healthy when every named check is; the reason lists the unhealthy ones."""

    def health() -> HealthReport:
        reports = {name: check() for name, check in checks.items()}
        failing = [f"{name}: {report.reason}" for name, report in reports.items() if not report.healthy]
        details = {name: {"healthy": r.healthy, "reason": r.reason, **r.details}
                   for name, r in reports.items()}
        if failing:
            return HealthReport(healthy=False, reason="; ".join(failing), details=details)
        return HealthReport(healthy=True, reason="ok", details=details)

    return health


# ------------------------------------------------------------------ the server
def parse_bind(bind: str) -> tuple[str, int]:
    """"host:port" or "[v6]:port" -> (host, port); an empty host means all IPv4 addresses."""
    host, sep, port_text = bind.rpartition(":")
    if not sep or not port_text.isdigit() or int(port_text) > 65535:
        raise ValueError(f"bind address {bind!r} is not host:port")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host or "0.0.0.0", int(port_text)


class NoLookupHTTPServer(ThreadingHTTPServer):
    """ThreadingHTTPServer without the name lookup at bind: HTTPServer.server_bind sets
    server_name from socket.getfqdn(host), a reverse DNS lookup that waits out the resolver's
    timeout (5 s per server seen) where DNS is unreachable, as in a node namespace without one.
    Nothing of ours reads server_name. Every HTTP listener of the agent derives from this."""

    def server_bind(self) -> None:
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = str(self.server_address[0]), self.server_address[1]


class _Server(NoLookupHTTPServer):
    daemon_threads = True
    block_on_close = False
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], owner: "StatusServer") -> None:
        self.address_family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        self.owner = owner
        super().__init__(address, _Handler)


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    timeout = REQUEST_TIMEOUT_SECONDS
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        owner = self.server.owner
        if path == "/livez":
            self._send(200, "text/plain; charset=utf-8", "ok\n")
        elif path == "/healthz":
            self._send_health(owner.health)
        elif path == "/readyz":
            self._send_health(owner.ready)
        elif path in owner.pages:
            content_type, produce = owner.pages[path]
            try:
                body = produce()
            except Exception as e:
                log.exception("%s failed", path)
                self._send(500, "text/plain; charset=utf-8", f"{path} failed: {e}\n")
                return
            self._send(200, content_type, body)
        elif path == "/metrics":
            try:
                body = owner.registry.render()
            except Exception as e:
                log.exception("rendering metrics failed")
                self._send(500, "text/plain; charset=utf-8", f"rendering metrics failed: {e}\n")
                return
            self._send(200, METRICS_CONTENT_TYPE, body)
        else:
            self._send(404, "text/plain; charset=utf-8", f"no such endpoint: {path}\n")

    def _send_health(self, check: HealthFunction) -> None:
        try:
            report = check()
        except Exception as e:
            log.exception("health check raised")
            report = HealthReport(healthy=False, reason=f"health check raised {type(e).__name__}: {e}")
        self._send(200 if report.healthy else 503, "application/json", report.to_json() + "\n")

    def _send(self, status: int, content_type: str, body: str) -> None:
        data = body.encode()
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.send_header("X-Content-Type-Options", "nosniff")
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s " + format, self.address_string(), *args)


class StatusServer:
    """Serves the endpoints above from `start()` until `stop()`; `.port` is the bound port."""

    def __init__(self, *, bind: str, registry: Registry, health: HealthFunction,
                 ready: HealthFunction | None = None,
                 pages: Mapping[str, tuple[str, Callable[[], str]]] | None = None) -> None:
        self.host, self._requested_port = parse_bind(bind)
        self.pages = dict(pages or {})  # path -> (content type, body producer): extra read-only pages
        self.registry = registry
        self.health = health
        self.ready = ready if ready is not None else health
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        if self._server is None:
            raise RuntimeError("status server not started")
        return self._server.server_address[1]

    def start(self) -> None:
        if self._server is not None:
            raise RuntimeError("status server already started")
        server = _Server((self.host, self._requested_port), self)
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1},
                                        name="status-server", daemon=True)
        self._thread.start()
        log.info("status server listening on %s:%d", self.host, self.port)

    def stop(self, timeout: float = 5.0) -> None:
        server, thread = self._server, self._thread
        if server is None or thread is None:
            return
        server.shutdown()
        server.server_close()
        thread.join(timeout)
        self._server = None
        self._thread = None

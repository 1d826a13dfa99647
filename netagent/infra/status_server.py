"""The agent's HTTP face: /healthz, /livez, /readyz and /metrics on a background thread.

The server only reads: each request calls a health function or reads a snapshot, and neither
waits for a sync, so a slow or stuck scrape can never hold up the agent. It listens where every
pod can reach it (0.0.0.0:10258, the proxy's 0.0.0.0:10256), so a client holds no thread:
`http_listener.py` reads request heads in one thread (a bound on connections waiting for their
head, the oldest dropped past it; a 2 s head deadline) and a few workers answer whole requests.
It binds without a name lookup, so starting it never waits on DNS.

Endpoints:
- `/livez`: 200 while the process serves HTTP (the kubelet's liveness probe);
- `/healthz`: the health function's `HealthReport` as JSON, 200 when healthy, else 503;
- `/readyz`: the same from a separate readiness function (defaults to the health one);
- details (rejected objects of every namespace, runner errors, the reasons that name them) only
  on a LOOPBACK address (the metrics one, 127.0.0.1:10249 by default): elsewhere /healthz and
  /readyz say healthy or not and nothing else (`{"healthy": ..., "reason": "ok" | "unhealthy",
  "details": {}}`, the same keys, the status code as before), as kube-proxy's 10256 does;
- `/metrics`: the registry in Prometheus text format 0.0.4, only when the server is given one
  (the agent serves metrics on a loopback address by default and health on the node's);
- extra read-only `pages` an owner adds (the proxy's `/proxyMode` and `/services`).

`/metrics` and every page are served from a `Snapshot`: produced at most once per
`snapshot_max_age` (1 s) and single-flight, so any number of concurrent scrapes cost one
render, and a metric read from the kernel at scrape time (the policy DROP counters from
`iptables-save -c`, BPF map fill, `/services`) forks at most once a second whatever the
scrapers do. Health is computed per request: it reads only the runners' state.

`health_from_sync_runner` gives kube-proxy's healthz meaning to a `SyncRunner`: unhealthy
until the first successful sync, then unhealthy while some demand (a request, a failed run,
an overdue periodic resync) has waited longer than `stale_after` without a successful run.
Unlike kube-proxy, which is healthy before its first sync unless an update has been queued
for too long, netagent reports unhealthy until it has synced once (a node whose routes are
not programmed should not look ready), and an overdue periodic resync counts as demand (so a
runner thread that stopped running is noticed even when no events arrive).
"""
from __future__ import annotations

import ipaddress
import json
import logging
import socketserver
import threading
from dataclasses import dataclass, field
from datetime import datetime, timezone
from http.server import ThreadingHTTPServer
from typing import Any, Callable, Mapping, Sequence

from netagent.infra.clock import Clock, MonotonicClock
from netagent.infra.http_listener import BoundedHttpListener, WholeRequestHandler
from netagent.infra.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from netagent.infra.metrics import Registry
from netagent.infra.sync_runner import SyncRunner

log = logging.getLogger("netagent.infra.status_server")

SNAPSHOT_MAX_AGE_SECONDS = 1.0
SNAPSHOT_WAIT_SECONDS = 30.0  # a reader waits this long for a refresh in flight, then gives up


@dataclass(frozen=True)
class HealthReport:
    healthy: bool
    reason: str
    details: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps({"healthy": self.healthy, "reason": self.reason, "details": self.details},
                          sort_keys=True, default=str)

    def public(self) -> HealthReport:
        """Healthy or not, nothing else: what a non-loopback address answers."""
        return HealthReport(self.healthy, "ok" if self.healthy else "unhealthy")


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


# ------------------------------------------------------------------ snapshots
class Snapshot:
    """A page body produced at most once per `max_age` seconds, and single-flight.

    `get()` answers the last body while it is younger than `max_age` (measured from the end of
    the refresh that made it, so refreshes are at least `max_age` apart however slow they are);
    otherwise the first reader refreshes it, outside the lock, and every reader that arrives
    meanwhile waits for that refresh and shares its body. A refresh that raised is kept just
    as long (its error is raised to each reader), so a failing producer is not retried per
    request either. `refreshes` counts the producer's calls; `waiting` the readers waiting
    for one in flight."""

    def __init__(self, produce: Callable[[], str], *, max_age: float = SNAPSHOT_MAX_AGE_SECONDS,
                 clock: Clock | None = None, wait_limit: float = SNAPSHOT_WAIT_SECONDS) -> None:
        self._produce = produce
        self._max_age = max_age
        self._clock: Clock = clock if clock is not None else MonotonicClock()
        self._wait_limit = wait_limit
        self._cond = threading.Condition()
        self._body: str | None = None
        self._error: Exception | None = None
        self._taken_at: float | None = None
        self._refreshing = False
        self.refreshes = 0
        self.waiting = 0

    def _fresh(self) -> bool:
        return self._taken_at is not None and self._clock.now() - self._taken_at < self._max_age

    def _answer(self) -> str:
        if self._error is not None:
            raise self._error
        assert self._body is not None
        return self._body

    def get(self) -> str:
        with self._cond:
            while not self._fresh():
                if not self._refreshing:
                    self._refreshing = True
                    break
                self.waiting += 1
                try:
                    if not self._cond.wait(self._wait_limit) and self._refreshing:
                        raise TimeoutError(f"a refresh has been running for over {self._wait_limit:g} s")
                finally:
                    self.waiting -= 1
            else:
                return self._answer()
        body: str | None = None
        error: Exception | None = None
        try:
            body = self._produce()
        except Exception as e:
            error = e
        finally:
            with self._cond:
                self._refreshing = False
                self.refreshes += 1
                self._body, self._error, self._taken_at = body, error, self._clock.now()
                self._cond.notify_all()
        if error is not None:
            raise error
        assert body is not None
        return body


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


def serves_details(host: str) -> bool:
    """Whether a listener bound to `host` answers health with its details: loopback only."""
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class _Handler(WholeRequestHandler):
    server: BoundedHttpListener  # type: ignore[assignment]

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        owner: StatusServer = self.server.owner  # type: ignore[assignment]
        if path == "/livez":
            self._send(200, "text/plain; charset=utf-8", "ok\n")
        elif path == "/healthz":
            self._send_health(owner.health)
        elif path == "/readyz":
            self._send_health(owner.ready)
        elif path in owner.pages:
            content_type, snapshot = owner.pages[path]
            try:
                body = snapshot.get()
            except Exception as e:
                log.exception("%s failed", path)
                self._send(500, "text/plain; charset=utf-8", f"{path} failed: {e}\n")
                return
            self._send(200, content_type, body)
        else:
            self._send(404, "text/plain; charset=utf-8", f"no such endpoint: {path}\n")

    def _send_health(self, check: HealthFunction) -> None:
        try:
            report = check()
        except Exception as e:
            log.exception("health check raised")
            report = HealthReport(healthy=False, reason=f"health check raised {type(e).__name__}: {e}")
        if not serves_details(str(self.server.server_address[0])):
            report = report.public()
        self._send(200 if report.healthy else 503, "application/json", report.to_json() + "\n")

    def _send(self, status: int, content_type: str, body: str) -> None:
        data = body.encode()
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.send_header("X-Content-Type-Options", "nosniff")
        self.send_header("Connection", "close")   # one request per connection (http_listener.py)
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s " + format, self.address_string(), *args)


class StatusServer:
    """Serves the endpoints above from `start()` until `stop()`, on one address or several (the
    same pages and snapshots on each); `.port` is the first one's bound port."""

    def __init__(self, *, bind: str | Sequence[str], registry: Registry | None, health: HealthFunction,
                 ready: HealthFunction | None = None,
                 pages: Mapping[str, tuple[str, Callable[[], str]]] | None = None,
                 snapshot_max_age: float = SNAPSHOT_MAX_AGE_SECONDS, clock: Clock | None = None) -> None:
        binds = [bind] if isinstance(bind, str) else list(bind)
        if not binds:
            raise ValueError("a status server needs an address to bind")
        self.addresses = [parse_bind(b) for b in binds]
        self.host = self.addresses[0][0]
        produced = dict(pages or {})  # path -> (content type, body producer): extra read-only pages
        if registry is not None:   # None: health only, no /metrics here
            produced["/metrics"] = (METRICS_CONTENT_TYPE, registry.render)
        self.pages = {path: (content_type, Snapshot(produce, max_age=snapshot_max_age, clock=clock))
                      for path, (content_type, produce) in produced.items()}
        self.registry = registry
        self.health = health
        self.ready = ready if ready is not None else health
        self._servers: list[BoundedHttpListener] = []

    @property
    def port(self) -> int:
        return self.ports[0]

    @property
    def ports(self) -> list[int]:
        if not self._servers:
            raise RuntimeError("status server not started")
        return [server.server_address[1] for server in self._servers]

    def snapshot(self, path: str) -> Snapshot:
        return self.pages[path][1]

    def start(self) -> None:
        if self._servers:
            raise RuntimeError("status server already started")
        try:
            for address in self.addresses:
                self._servers.append(BoundedHttpListener(address, _Handler, owner=self, name="status-server"))
        except BaseException:
            for server in self._servers:
                server.close()
            self._servers = []
            raise
        for server in self._servers:
            server.start()
            host, port = server.server_address
            log.info("status server listening on %s:%d (%s%s)", host, port, ", ".join(["/healthz", *sorted(self.pages)]),
                     "" if serves_details(host) else "; health without details")

    def serve_health(self, health: HealthFunction, ready: HealthFunction | None = None) -> None:
        """Answer /healthz (and /readyz) from `health` from now on (the daemon hands the metrics
        server the whole agent's, details included, where the proxy built it with its own)."""
        self.health = health
        self.ready = ready if ready is not None else health

    def stop(self, timeout: float = 5.0) -> None:
        servers = self._servers
        self._servers = []
        for server in servers:
            server.stop(timeout)

"""Health-check node ports: how a cloud load balancer learns which nodes hold local endpoints.

A `type: LoadBalancer` Service with `externalTrafficPolicy: Local` gets a
`healthCheckNodePort`; every node answers HTTP on it: 200 with the number of local ready
endpoints when it has some, 503 when it has none (so the balancer stops sending traffic to
a node that would drop it). The body is kube-proxy's JSON, which users and tools parse:
`{"service": {"namespace", "name"}, "localEndpoints": N, "serviceProxyHealthy": true}`.

`HealthCheckPorts.sync(wanted)` opens, keeps and closes one small HTTP listener per port,
and updates the answers in place, so a change in endpoint counts never rebinds a socket.
A port that cannot be bound (taken by another process) is logged and retried at the
next sync; it never fails the proxy's sync.
"""
from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler

from netagent.infra.status_server import NoLookupHTTPServer

log = logging.getLogger("netagent.proxy.healthcheck")


@dataclass(frozen=True)
class HealthCheckAnswer:
    namespace: str
    name: str
    local_endpoints: int


class _Listener(NoLookupHTTPServer):
    daemon_threads = True
    answer: HealthCheckAnswer
    proxy_healthy: Callable[[], bool]


class _Handler(BaseHTTPRequestHandler):
    server: _Listener

    def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
        answer = self.server.answer
        body = json.dumps({
            "service": {"namespace": answer.namespace, "name": answer.name},
            "localEndpoints": answer.local_endpoints,
            "serviceProxyHealthy": self.server.proxy_healthy(),
        }).encode()
        self.send_response(200 if answer.local_endpoints > 0 else 503)
        self.send_header("Content-Type", "application/json")
        self.send_header("X-Content-Type-Options", "nosniff")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args) -> None:  # noqa: A002
        pass


class HealthCheckPorts:
    def __init__(self, *, bind_address: str = "0.0.0.0", proxy_healthy: Callable[[], bool] = lambda: True) -> None:
        self._bind_address = bind_address
        self.proxy_healthy = proxy_healthy  # read at every request; the agent sets it once it has one
        self._listeners: dict[int, _Listener] = {}
        self._lock = threading.Lock()

    def ports(self) -> dict[int, HealthCheckAnswer]:
        with self._lock:
            return {port: listener.answer for port, listener in self._listeners.items()}

    def sync(self, wanted: Mapping[int, HealthCheckAnswer]) -> None:
        with self._lock:
            for port in set(self._listeners) - set(wanted):
                self._close(port)
            for port, answer in wanted.items():
                listener = self._listeners.get(port)
                if listener is None:
                    self._open(port, answer)
                else:
                    listener.answer = answer

    def close(self) -> None:
        with self._lock:
            for port in list(self._listeners):
                self._close(port)

    def _open(self, port: int, answer: HealthCheckAnswer) -> None:
        try:
            listener = _Listener((self._bind_address, port), _Handler)
        except OSError as error:
            log.warning("health-check node port %d: cannot listen (%s); retrying at the next sync", port, error)
            return
        listener.answer = answer
        listener.proxy_healthy = lambda: self.proxy_healthy()
        threading.Thread(target=listener.serve_forever, kwargs={"poll_interval": 0.2},
                         name=f"healthcheck-{port}", daemon=True).start()
        self._listeners[port] = listener

    def _close(self, port: int) -> None:
        listener = self._listeners.pop(port)
        listener.shutdown()
        listener.server_close()

"""Health-check node ports: how a cloud load balancer learns which nodes hold local endpoints.

A `type: LoadBalancer` Service with `externalTrafficPolicy: Local` gets a
`healthCheckNodePort`; every node answers HTTP on it: 200 with the number of local ready
endpoints when it has some, 503 when it has none (so the balancer stops sending traffic to
a node that would drop it). The body is kube-proxy's JSON, which users and tools parse:
`{"service": {"namespace", "name"}, "localEndpoints": N, "serviceProxyHealthy": true}`.

`HealthCheckPorts.sync(wanted)` opens, keeps and closes one listening socket per port and
updates the answers in place, so a change in endpoint counts never rebinds a socket. A port
that cannot be bound (taken by another process) is logged and retried at the next sync; it
never fails the proxy's sync.

Every port is reachable from every pod and from outside, and each is opened because a tenant
wrote a Service, so nothing here grows with the tenant's objects but descriptors (issue 29,
item 11: it was a listener thread per port, and a thread per connection):

- at most `max_ports` listeners (`--proxy-max-health-check-ports`, default 2,768: every
  healthCheckNodePort is allocated from the NodePort range, whose default 30000-32767 holds
  2,768 ports, so no cluster with the default range can ask for more). Past it the listeners
  open stay open and new ones are taken in port order; the rest are logged (`refused`);
- ONE selector thread serves them all: it accepts, reads each request head and answers it
  (a small JSON body, written without blocking; a client that does not take it is dropped);
- at most `max_connections` connections wait for their head at once, across all ports (past
  it the OLDEST is dropped, as `infra/http_listener.py` does), and a head must arrive whole
  within `head_deadline` seconds (2 s: a probe sends it in one segment) and `MAX_HEAD_BYTES`.
"""
from __future__ import annotations

import json
import logging
import selectors
import socket
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from netagent.infra.http_listener import head_end

log = logging.getLogger("netagent.proxy.healthcheck")

MAX_PORTS = 2768             # the default NodePort range, 30000-32767
MAX_CONNECTIONS = 256        # heads awaited at once, every port together
HEAD_DEADLINE_SECONDS = 2.0
MAX_HEAD_BYTES = 4096
_POLL = 0.2


@dataclass(frozen=True)
class HealthCheckAnswer:
    namespace: str
    name: str
    local_endpoints: int


@dataclass
class _Pending:
    port: int
    deadline: float
    head: bytearray = field(default_factory=bytearray)


def render_answer(answer: HealthCheckAnswer | None, *, method: str, proxy_healthy: bool) -> bytes:
    """The whole HTTP/1.1 response to one request (the connection closes after it)."""
    if answer is None:
        status, body = "503 Service Unavailable", b'{"error": "no such health-check port"}'
    elif method not in ("GET", "HEAD"):
        status, body = "405 Method Not Allowed", b'{"error": "GET only"}'
    else:
        status = "200 OK" if answer.local_endpoints > 0 else "503 Service Unavailable"
        body = json.dumps({
            "service": {"namespace": answer.namespace, "name": answer.name},
            "localEndpoints": answer.local_endpoints,
            "serviceProxyHealthy": proxy_healthy,
        }).encode()
    head = (f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\nX-Content-Type-Options: nosniff\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode()
    return head + (body if method != "HEAD" else b"")


class HealthCheckPorts:
    """The health-check node ports of this node: listeners opened by `sync`, served by one thread."""

    def __init__(self, *, bind_address: str = "0.0.0.0", proxy_healthy: Callable[[], bool] = lambda: True,
                 max_ports: int = MAX_PORTS, max_connections: int = MAX_CONNECTIONS,
                 head_deadline: float = HEAD_DEADLINE_SECONDS) -> None:
        if max_ports < 1 or max_connections < 1 or head_deadline <= 0:
            raise ValueError("health-check ports need a port, a connection and a deadline")
        self._bind_address = bind_address
        self.proxy_healthy = proxy_healthy  # read at every request; the agent sets it once it has one
        self.max_ports, self.max_connections, self.head_deadline = max_ports, max_connections, head_deadline
        self._lock = threading.Lock()
        self._closed = threading.Condition(self._lock)   # the serving thread has closed a batch
        self._queued = self._done = 0                    # batches of sockets handed over / closed
        self._answers: dict[int, HealthCheckAnswer] = {}
        self._sockets: dict[int, socket.socket] = {}     # port -> listening socket (owned by sync)
        self._closing: list[socket.socket] = []          # handed to the serving thread to close
        self.refused: frozenset[int] = frozenset()       # wanted ports over `max_ports`
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()
        self._wake_read, self._wake_write = socket.socketpair()
        self._wake_read.setblocking(False)
        self._wake_write.setblocking(False)
        self.served = self.dropped_deadline = self.dropped_oldest = self.dropped_slow = 0

    def ports(self) -> dict[int, HealthCheckAnswer]:
        with self._lock:
            return {port: self._answers[port] for port in self._sockets}

    def threads(self) -> int:
        """How many threads serve the ports (one, once any port was opened)."""
        return int(self._thread is not None and self._thread.is_alive())

    def sync(self, wanted: Mapping[int, HealthCheckAnswer]) -> None:
        """Serve `wanted`; a port no longer wanted is closed when this returns (the serving
        thread closes it, as its selector holds it: sync waits for that, at most 5 s)."""
        with self._lock:
            gone = set(self._sockets) - set(wanted)
            for port in gone:
                self._closing.append(self._sockets.pop(port))
                self._answers.pop(port, None)
            if gone:
                self._queued += 1
            batch = self._queued if gone else 0
            for port, answer in wanted.items():
                if port in self._sockets:
                    self._answers[port] = answer
            refused = []
            for port in sorted(set(wanted) - set(self._sockets)):
                if len(self._sockets) >= self.max_ports:
                    refused.append(port)
                elif self._open(port):
                    self._answers[port] = wanted[port]
            if frozenset(refused) != self.refused and refused:
                log.warning("health-check node ports: %d wanted beyond the limit of %d (--proxy-max-health-check-"
                            "ports) are not served: %s", len(refused), self.max_ports,
                            ", ".join(map(str, refused[:20])) + (" ..." if len(refused) > 20 else ""))
            self.refused = frozenset(refused)
            if self._thread is None and self._sockets:
                self._thread = threading.Thread(target=self._serve, name="healthcheck-ports", daemon=True)
                self._thread.start()
            thread = self._thread
        self._wake()
        if batch and thread is not None:
            with self._closed:
                self._closed.wait_for(lambda: self._done >= batch or not thread.is_alive(), timeout=5.0)

    def close(self) -> None:
        with self._lock:
            self._closing.extend(self._sockets.values())
            self._sockets.clear()
            self._answers.clear()
            thread = self._thread
        self._stopping.set()
        self._wake()
        if thread is not None:
            thread.join(5.0)
        with self._lock:
            for sock in self._closing:
                sock.close()
            self._closing.clear()
        if thread is None or not thread.is_alive():
            self._wake_read.close()
            self._wake_write.close()

    def _open(self, port: int) -> bool:
        family = socket.AF_INET6 if ":" in self._bind_address else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((self._bind_address, port))
            sock.listen(64)
            sock.setblocking(False)
        except OSError as error:
            sock.close()
            log.warning("health-check node port %d: cannot listen (%s); retrying at the next sync", port, error)
            return False
        self._sockets[port] = sock
        return True

    def _wake(self) -> None:
        try:
            self._wake_write.send(b"x")
        except OSError:   # full: a wake-up is pending anyway
            pass

    # ---- the one serving thread (the only one touching `selector` and `pending`)
    def _serve(self) -> None:
        selector = selectors.DefaultSelector()
        pending: OrderedDict[socket.socket, _Pending] = OrderedDict()   # accept order: oldest first
        listening: dict[socket.socket, int] = {}
        selector.register(self._wake_read, selectors.EVENT_READ, "wake")

        def forget(connection: socket.socket) -> None:
            pending.pop(connection, None)
            selector.unregister(connection)
            connection.close()

        try:
            while not self._stopping.is_set():
                with self._lock:
                    current = {sock: port for port, sock in self._sockets.items()}
                    closing, self._closing, handed = self._closing, [], self._queued
                for sock in closing:
                    if sock in listening:
                        selector.unregister(sock)
                        del listening[sock]
                    sock.close()
                if closing:
                    with self._closed:
                        self._done = handed
                        self._closed.notify_all()
                for sock, port in current.items():
                    if sock not in listening:
                        selector.register(sock, selectors.EVENT_READ, "listen")
                        listening[sock] = port
                first = next(iter(pending.values()), None)
                wait = _POLL if first is None else min(_POLL, max(0.0, first.deadline - time.monotonic()))
                for key, _ in selector.select(wait):
                    if key.data == "wake":
                        try:
                            self._wake_read.recv(4096)
                        except OSError:
                            pass
                    elif key.data == "listen":
                        self._accept(key.fileobj, listening[key.fileobj], selector, pending, forget)  # type: ignore[index,arg-type]
                    elif key.fileobj in pending:
                        self._read(key.fileobj, key.data, forget)  # type: ignore[arg-type]
                now = time.monotonic()
                while pending:
                    connection, waiting = next(iter(pending.items()))
                    if waiting.deadline > now:
                        break
                    self.dropped_deadline += 1
                    forget(connection)
        finally:
            for connection in list(pending):
                forget(connection)
            for sock in listening:
                selector.unregister(sock)
            selector.close()

    def _accept(self, listener: socket.socket, port: int, selector: selectors.BaseSelector,
                pending: OrderedDict[socket.socket, _Pending], forget: Callable[[socket.socket], None]) -> None:
        for _ in range(16):   # then the other ports, the reads and the deadlines have their turn
            try:
                connection, _address = listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as error:   # out of descriptors: the backlog waits
                log.warning("health-check node port %d: accept failed: %s", port, error)
                return
            connection.setblocking(False)
            if len(pending) >= self.max_connections:
                self.dropped_oldest += 1
                forget(next(iter(pending)))
            waiting = _Pending(port, time.monotonic() + self.head_deadline)
            pending[connection] = waiting
            selector.register(connection, selectors.EVENT_READ, waiting)

    def _read(self, connection: socket.socket, waiting: _Pending, forget: Callable[[socket.socket], None]) -> None:
        try:
            data = connection.recv(MAX_HEAD_BYTES)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            forget(connection)
            return
        waiting.head += data
        end = head_end(waiting.head)
        if end is None:
            if len(waiting.head) > MAX_HEAD_BYTES:
                forget(connection)
            return
        method = bytes(waiting.head[:16]).split(b" ", 1)[0].decode("ascii", "replace")
        with self._lock:
            answer = self._answers.get(waiting.port)
        try:
            healthy = bool(self.proxy_healthy())
        except Exception:   # a health function's bug is an unhealthy proxy, not a dead server
            healthy = False
        response = render_answer(answer, method=method, proxy_healthy=healthy)
        try:
            sent = connection.send(response)   # a few hundred bytes: a fresh socket's buffer takes them
        except OSError:
            sent = 0
        if sent == len(response):
            self.served += 1
            try:
                connection.shutdown(socket.SHUT_WR)
            except OSError:
                pass
        else:
            self.dropped_slow += 1
        forget(connection)

"""A bounded HTTP listener: one thread reads every connection's request head, workers answer
whole requests only. The status servers (`status_server.py`) listen on the node's addresses,
where every pod can reach them, so a client must not be able to hold the agent's threads:

- one selector thread accepts and reads request heads, without a thread per connection;
- at most `max_connections` connections wait for their head at once: past it, the OLDEST is
  dropped to make room (a slow client ages out, a probe that sends its head at once is served);
- a head must arrive whole within `head_deadline` seconds of the accept (2 s: a probe sends
  it in one segment) and in at most `MAX_HEAD_BYTES`; otherwise the connection is dropped;
- `workers` threads answer whole requests from a queue of `queue_size`; past it a request is
  refused (closed), never queued without bound. Each answer is written with a per-send
  timeout (`write_timeout`), and every connection answers one request and closes.

`handler` is a `BaseHTTPRequestHandler` subclass deriving from `WholeRequestHandler`, built
per request with `(connection, head)` as its request and this listener as its server; the
listener's `owner` is what the handler serves. Counters (`served`, `dropped_deadline`,
`dropped_oldest`, `refused_busy`) are for tests and logs.
"""
from __future__ import annotations

import io
import logging
import queue
import selectors
import socket
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler

log = logging.getLogger("netagent.infra.http_listener")

MAX_CONNECTIONS = 64
HEAD_DEADLINE_SECONDS = 2.0
MAX_HEAD_BYTES = 16384
WORKERS = 4
QUEUE_SIZE = 32
WRITE_TIMEOUT_SECONDS = 5.0
_POLL = 0.1


class WholeRequestHandler(BaseHTTPRequestHandler):
    """A handler over a request head already read: `request` is (connection, head)."""
    protocol_version = "HTTP/1.1"

    def setup(self) -> None:
        connection, head = self.request
        self.connection = connection
        self.rfile = io.BytesIO(head)   # the head only: one request per connection
        self.wfile = connection.makefile("wb")

    def finish(self) -> None:
        try:
            self.wfile.flush()
        except OSError:
            pass
        finally:
            self.wfile.close()
            self.rfile.close()


@dataclass
class _Pending:
    address: object
    deadline: float
    head: bytearray = field(default_factory=bytearray)


def head_end(data: bytes | bytearray) -> int | None:
    """Where a request head ends (after its blank line), or None while it has not."""
    ends = [i + len(sep) for sep in (b"\r\n\r\n", b"\n\n") if (i := data.find(sep)) >= 0]
    return min(ends) if ends else None


class BoundedHttpListener:
    def __init__(self, address: tuple[str, int], handler: type[WholeRequestHandler], *, owner: object,
                 max_connections: int = MAX_CONNECTIONS, head_deadline: float = HEAD_DEADLINE_SECONDS,
                 workers: int = WORKERS, queue_size: int = QUEUE_SIZE,
                 write_timeout: float = WRITE_TIMEOUT_SECONDS, name: str = "http") -> None:
        if max_connections < 1 or workers < 1 or queue_size < 1 or head_deadline <= 0:
            raise ValueError("a listener needs a connection, a worker, a queue slot and a deadline")
        self.owner, self._handler, self._name = owner, handler, name
        self.max_connections, self.head_deadline, self.write_timeout = max_connections, head_deadline, write_timeout
        self.address_family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        self.socket = socket.socket(self.address_family, socket.SOCK_STREAM)
        try:
            self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self.socket.bind(address)
            self.socket.listen(128)   # a burst of probes waits in the backlog, not in SYN retries
            self.socket.setblocking(False)
        except BaseException:
            self.socket.close()
            raise
        self.server_address: tuple[str, int] = self.socket.getsockname()[:2]
        self._work: queue.Queue[tuple[socket.socket, bytes, object] | None] = queue.Queue(maxsize=queue_size)
        self._stopping = threading.Event()
        self._threads = [threading.Thread(target=self._serve, name=f"{name}-accept", daemon=True)]
        self._threads += [threading.Thread(target=self._answer, name=f"{name}-worker", daemon=True)
                          for _ in range(workers)]
        self.served = self.dropped_deadline = self.dropped_oldest = self.refused_busy = 0

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def close(self) -> None:
        """Release the port of a listener never started."""
        self.socket.close()

    def stop(self, timeout: float = 5.0) -> None:
        self._stopping.set()
        if not self._threads[0].is_alive():
            self.socket.close()
            return
        self._threads[0].join(timeout)
        self.socket.close()
        for _ in self._threads[1:]:
            try:
                self._work.put(None, timeout=timeout)
            except queue.Full:
                break
        for thread in self._threads[1:]:
            thread.join(timeout)

    # ---- the selector thread (the only one touching `_selector` and `_pending`)
    def _serve(self) -> None:
        self._selector = selectors.DefaultSelector()
        self._pending: OrderedDict[socket.socket, _Pending] = OrderedDict()   # in accept order: oldest first
        self._selector.register(self.socket, selectors.EVENT_READ, None)
        try:
            while not self._stopping.is_set():
                first = next(iter(self._pending.values()), None)
                wait = _POLL if first is None else min(_POLL, max(0.0, first.deadline - time.monotonic()))
                for key, _ in self._selector.select(wait):
                    if key.data is None:
                        self._accept()
                    elif key.fileobj in self._pending:   # not dropped earlier in this round
                        self._read(key.fileobj, key.data)  # type: ignore[arg-type]
                now = time.monotonic()
                while self._pending:
                    connection, waiting = next(iter(self._pending.items()))
                    if waiting.deadline > now:
                        break
                    self.dropped_deadline += 1
                    self._forget(connection, close=True)
        finally:
            for connection in list(self._pending):
                self._forget(connection, close=True)
            self._selector.close()

    def _forget(self, connection: socket.socket, *, close: bool) -> None:
        self._pending.pop(connection, None)
        self._selector.unregister(connection)
        if close:
            connection.close()

    def _accept(self) -> None:
        for _ in range(self.max_connections):   # then let the reads and deadlines have their turn
            try:
                connection, address = self.socket.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as error:   # out of descriptors: the backlog waits
                log.warning("%s: accept failed: %s", self._name, error)
                return
            connection.setblocking(False)
            if len(self._pending) >= self.max_connections:
                self.dropped_oldest += 1
                self._forget(next(iter(self._pending)), close=True)
            waiting = _Pending(address, time.monotonic() + self.head_deadline)
            self._pending[connection] = waiting
            self._selector.register(connection, selectors.EVENT_READ, waiting)

    def _read(self, connection: socket.socket, waiting: _Pending) -> None:
        try:
            data = connection.recv(4096)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self._forget(connection, close=True)
            return
        waiting.head += data
        end = head_end(waiting.head)
        if end is None:
            if len(waiting.head) > MAX_HEAD_BYTES:
                self._forget(connection, close=True)
            return
        self._forget(connection, close=False)
        try:
            self._work.put_nowait((connection, bytes(waiting.head[:end]), waiting.address))
        except queue.Full:
            self.refused_busy += 1
            connection.close()

    # ---- the workers
    def _answer(self) -> None:
        while True:
            item = self._work.get()
            if item is None:
                return
            connection, head, address = item
            try:
                connection.settimeout(self.write_timeout)
                self._handler((connection, head), address, self)  # type: ignore[arg-type]
                self.served += 1
            except Exception as error:   # a client gone mid-answer, a handler's bug: this request only
                log.debug("%s: answering %s failed: %s", self._name, address, error)
            finally:
                try:
                    connection.shutdown(socket.SHUT_WR)
                except OSError:
                    pass
                connection.close()

"""The node agent's CNI endpoint: a root-only unix socket, one reader thread, a pool of warm workers.

Each worker thread keeps its own netlink socket in the node's namespace (see `cni.netns`),
so a request costs only the kernel work it needs. Workers never wait for a client: one
reader thread (`cni-io`) accepts connections and reads every request non-blockingly, and
hands a worker only a request that has arrived whole. So a local caller that connects and
sends nothing, or sends a byte a second, holds a file descriptor, never a worker, and
cannot delay another pod's ADD. Bounds, each answered or enforced without a worker:

* a whole-request deadline (`request_deadline`, from accept to the last byte), after which
  the connection is closed (what had arrived by then is read first: a starved reader thread
  must not drop a request that came in time);
* at most `max_reading` connections being read at once: past that the oldest is dropped;
* the wire's size limits (`cni.wire`): a header announcing more is answered at once with the
  shim's own error (code 7 for stdin, 4 for the environment), as the clients check too;
* a peer that is not root (nor our own uid) is answered code 4 "permission denied";
* a full backlog of work (`max_pending`) or an agent not ready yet is code 11 at once, and
  STATUS when not ready is code 50, as the spec asks.

Each request names the plugin the shim was executed as (cni/wire.py's selector): the main
plugin's `handlers`, or `netagent-ipam`'s IPAM-only handlers for a reference main plugin
delegating its IPAM to us (`plugins.py`).
A header naming anything else is refused as malformed (code 6) before any worker sees it.
"""
from __future__ import annotations

import logging
import os
import selectors
import socket
import stat
import struct
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable

from cni import wire
from cni.dispatch import Handlers, render_error
from cni.errors import CniError, ErrorCode
from cni.ipam.plugin import LockedIpam
from netagent.cniserver.metrics import CniMetrics
from netagent.cniserver.plugins import execute_for

log = logging.getLogger("netagent.cniserver.server")

REQUEST_DEADLINE = 5.0  # seconds from accept until the whole request must have arrived
MAX_READING = 64  # connections whose request is still arriving
WRITE_TIMEOUT = 5.0  # a reply is small; a client that does not read it loses it


def _peer_uid(conn: socket.socket) -> int:
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return struct.unpack("3i", creds)[1]


def _error_reply(stdin: bytes, error: CniError) -> bytes:
    return wire.encode_reply(1, render_error(stdin, error))


@dataclass
class _Arriving:
    """A connection whose request is arriving (the reader thread's), then whole (a worker's)."""
    conn: socket.socket
    uid: int
    deadline: float
    data: bytearray = field(default_factory=bytearray)
    expected: int | None = None  # total length, once the header is in
    env_at: int = 0  # where the environment part starts (after the header line)
    env_len: int = 0
    plugin: str = wire.PLUGIN_MAIN


class CniServer:
    """Serve CNI requests on `socket_path` until `stop()`."""

    def __init__(self, socket_path: str, *, handlers: Handlers, workers: int = 8, max_pending: int = 512,
                 not_ready: Callable[[], str | None] = lambda: None, request_deadline: float = REQUEST_DEADLINE,
                 max_reading: int = MAX_READING, ipam_handlers: LockedIpam | None = None,
                 metrics: CniMetrics | None = None) -> None:
        self.socket_path = socket_path
        self.handlers = handlers
        self.ipam_handlers = ipam_handlers or LockedIpam()
        self.max_pending = max_pending
        self.not_ready = not_ready
        self.request_deadline = request_deadline
        self.max_reading = max_reading
        self.metrics = metrics
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="cni")
        self._pending = 0
        self._pending_lock = threading.Lock()
        self._listener: socket.socket | None = None
        self._stopping = threading.Event()
        self._wake_r, self._wake_w = socket.socketpair()
        self._thread: threading.Thread | None = None
        self.requests_served = 0
        self.dropped = 0  # connections closed for their deadline, the reading bound or EOF

    # ------------------------------------------------------------ lifecycle
    def start(self, *, before_serving: Callable[[], object] | None = None) -> None:
        """Bind the socket, run `before_serving` (connections wait in the backlog), then serve.

        The agent adopts the shim's DEL records there: a shim that found no agent either
        journaled before the bind, or finds this socket on its second try (cni/shim/)."""
        listener = self._listener = self._bind()
        if before_serving is not None:
            try:
                before_serving()
            except BaseException:
                self._listener = None
                listener.close()
                os.unlink(self.socket_path)
                raise
        listener.setblocking(False)
        self._thread = threading.Thread(target=self._io_loop, args=(listener,), name="cni-io", daemon=True)
        self._thread.start()
        log.info("serving CNI on %s", self.socket_path)

    def stop(self) -> None:
        if self._stopping.is_set():
            return
        self._stopping.set()
        self._wake_w.send(b"x")
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self._listener is not None:
            self._listener.close()
        self._pool.shutdown(wait=True)
        self._wake_r.close()
        self._wake_w.close()
        try:
            if stat.S_ISSOCK(os.lstat(self.socket_path).st_mode):
                os.unlink(self.socket_path)
        except FileNotFoundError:
            pass

    def _bind(self) -> socket.socket:
        directory = os.path.dirname(self.socket_path) or "."
        os.makedirs(directory, mode=0o700, exist_ok=True)
        if os.path.lexists(self.socket_path):
            if not stat.S_ISSOCK(os.lstat(self.socket_path).st_mode):
                raise RuntimeError(f"{self.socket_path} exists and is not a socket")
            probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                probe.connect(self.socket_path)
                raise RuntimeError(f"another agent is already serving {self.socket_path}")
            except (ConnectionRefusedError, FileNotFoundError):
                os.unlink(self.socket_path)  # stale socket from an agent that died
            finally:
                probe.close()
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old_umask = os.umask(0o177)
        try:
            listener.bind(self.socket_path)
        finally:
            os.umask(old_umask)
        os.chmod(self.socket_path, 0o600)
        listener.listen(1024)
        return listener

    # ------------------------------------------------------------ reading (the cni-io thread)
    def _io_loop(self, listener: socket.socket) -> None:
        selector = selectors.DefaultSelector()
        selector.register(listener, selectors.EVENT_READ)
        selector.register(self._wake_r, selectors.EVENT_READ)
        arriving: dict[socket.socket, _Arriving] = {}  # in accept order
        try:
            while not self._stopping.is_set():
                now = time.monotonic()
                for conn in [c for c, a in arriving.items() if a.deadline <= now]:
                    self._read_what_arrived(selector, arriving, conn)  # this thread may have been starved
                    if conn in arriving:
                        log.warning("dropped a CNI connection: no whole request within %.1f s", self.request_deadline)
                        self._drop(selector, arriving, conn)
                timeout = min((a.deadline for a in arriving.values()), default=now + 1.0) - now
                for key, _ in selector.select(max(0.0, timeout)):
                    try:
                        if key.fileobj is listener:
                            self._accept(listener, selector, arriving)
                        elif key.fileobj is not self._wake_r:
                            self._read(selector, arriving, key.fileobj)  # type: ignore[arg-type]
                    except Exception:  # one bad connection must not stop CNI for the node
                        log.exception("error while reading a CNI connection")
                        failed = key.fileobj
                        if isinstance(failed, socket.socket) and failed in arriving:
                            self._drop(selector, arriving, failed)
        finally:
            for conn in list(arriving):
                self._drop(selector, arriving, conn)
            selector.close()

    def _accept(self, listener: socket.socket, selector: selectors.BaseSelector,
                arriving: dict[socket.socket, _Arriving]) -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                log.warning("accept failed: %s", exc)
                return
            conn.setblocking(False)
            try:
                uid = _peer_uid(conn)
            except OSError:
                conn.close()
                continue
            if len(arriving) >= self.max_reading:
                oldest = next(iter(arriving))
                log.warning("dropped the oldest of %d CNI connections still sending", len(arriving))
                self._drop(selector, arriving, oldest)
            arriving[conn] = _Arriving(conn=conn, uid=uid, deadline=time.monotonic() + self.request_deadline)
            selector.register(conn, selectors.EVENT_READ)

    def _drop(self, selector: selectors.BaseSelector, arriving: dict[socket.socket, _Arriving],
              conn: socket.socket) -> None:
        arriving.pop(conn, None)
        selector.unregister(conn)
        conn.close()
        self.dropped += 1

    def _read(self, selector: selectors.BaseSelector, arriving: dict[socket.socket, _Arriving],
              conn: socket.socket) -> None:
        state = arriving[conn]
        try:
            chunk = conn.recv(1 << 20)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            chunk = b""
        if not chunk:
            self._drop(selector, arriving, conn)
            return
        state.data += chunk
        refusal = self._check_header(state) if state.expected is None else None
        if refusal is not None:
            arriving.pop(conn)
            selector.unregister(conn)
            self._answer_now(conn, refusal)
        elif state.expected is not None and len(state.data) >= state.expected:
            arriving.pop(conn)
            selector.unregister(conn)
            self._dispatch(state)

    def _read_what_arrived(self, selector: selectors.BaseSelector, arriving: dict[socket.socket, _Arriving],
                           conn: socket.socket) -> None:
        """Read what is already queued on a connection whose deadline passed: a request that
        arrived in time while this thread could not run is served, not dropped."""
        try:
            while conn in arriving:
                before = len(arriving[conn].data)
                self._read(selector, arriving, conn)
                if conn in arriving and len(arriving[conn].data) == before:
                    return  # nothing more queued
        except Exception:
            log.exception("error while reading a CNI connection")

    @staticmethod
    def _check_header(state: _Arriving) -> bytes | None:
        """Set `expected` once the header is in; a reply refusing the request, or None."""
        newline = state.data.find(b"\n", 0, wire.MAX_HEADER + 1)
        if newline < 0:
            if len(state.data) > wire.MAX_HEADER:
                return _error_reply(b"", CniError(ErrorCode.DECODE_FAILURE, "malformed request from the CNI client",
                                                  "the request header is too long"))
            return None
        try:
            env_len, stdin_len, plugin = wire.parse_header(bytes(state.data[:newline]))
        except wire.WireError as exc:
            return _error_reply(b"", CniError(ErrorCode.DECODE_FAILURE, "malformed request from the CNI client",
                                              str(exc)))
        too_large = wire.lengths_too_large(env_len, stdin_len)
        if too_large is not None:
            return _error_reply(b"", CniError(*too_large))
        state.env_at, state.env_len, state.plugin = newline + 1, env_len, plugin
        state.expected = state.env_at + env_len + stdin_len
        return None

    @staticmethod
    def _answer_now(conn: socket.socket, reply: bytes) -> None:
        """A small refusal from the reader thread itself: best effort, never blocking."""
        try:
            conn.send(reply)
            conn.shutdown(socket.SHUT_WR)
        except OSError:
            pass
        conn.close()

    def _dispatch(self, state: _Arriving) -> None:
        with self._pending_lock:
            overloaded = self._pending >= self.max_pending
            if not overloaded:
                self._pending += 1
        if overloaded:
            self._answer_now(state.conn, _error_reply(b"", CniError(ErrorCode.TRY_AGAIN_LATER, "the agent is busy")))
            return
        self._pool.submit(self._serve, state)

    # ------------------------------------------------------------ answering (the workers)
    def _serve(self, state: _Arriving) -> None:
        """Answer a whole request; its header was parsed and checked by the reader thread."""
        try:
            with state.conn as conn:
                conn.setblocking(True)
                conn.settimeout(WRITE_TIMEOUT)
                conn.sendall(self._reply(state))
        except OSError as exc:
            log.warning("could not answer a CNI request: %s", exc)
        finally:
            with self._pending_lock:
                self._pending -= 1

    def _reply(self, state: _Arriving) -> bytes:
        uid = state.uid
        if uid not in (0, os.getuid()):
            log.warning("refused a CNI request from uid %d", uid)
            return _error_reply(b"", CniError(ErrorCode.INVALID_ENVIRONMENT, "permission denied",
                                              f"the netagent agent serves root only; the caller is uid {uid}"))
        view, stdin_at = memoryview(state.data), state.env_at + state.env_len
        try:
            env = wire.decode_env(bytes(view[state.env_at:stdin_at]))
        except UnicodeDecodeError:  # the shim relays the environment's bytes as they are
            return _error_reply(b"", CniError(ErrorCode.INVALID_ENVIRONMENT, "the CNI_* environment is not UTF-8"))
        return self._answer(env, bytes(view[stdin_at:state.expected]), state.plugin)

    def _answer(self, env: dict, stdin: bytes, plugin: str) -> bytes:
        command = env.get("CNI_COMMAND", "")
        reason = self.not_ready() if command != "VERSION" else None
        if reason:
            error = ErrorCode.NOT_AVAILABLE if command == "STATUS" else ErrorCode.TRY_AGAIN_LATER
            return _error_reply(stdin, CniError(error, "the netagent agent is not ready", reason))
        started = time.monotonic()
        code, out = execute_for(plugin, env, stdin, handlers=self.handlers, ipam_handlers=self.ipam_handlers)
        self.requests_served += 1
        elapsed = time.monotonic() - started
        if self.metrics is not None:
            self.metrics.observe(command, plugin, code=code, seconds=elapsed)
        log.info("CNI %s%s container=%s ifname=%s exit=%d %.1f ms", command,
                 "" if plugin == wire.PLUGIN_MAIN else f" ({plugin})",
                 env.get("CNI_CONTAINERID", "-")[:16], env.get("CNI_IFNAME", "-"), code,
                 elapsed * 1000)
        return wire.encode_reply(code, out)

"""The node agent's CNI endpoint: a root-only unix socket served by a pool of warm workers.

Each worker thread keeps its own netlink socket in the node's namespace (see
`cni.netns`), so a request costs only the kernel work it needs. The accept loop never
does CNI work itself: it hands connections to the pool, and answers "try again later"
(code 11) at once when the backlog is full or the agent is not ready yet, instead of
letting the runtime wait. STATUS when not ready is code 50, as the spec asks.
"""
from __future__ import annotations

import logging
import os
import socket
import stat
import struct
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

from cni import wire
from cni.dispatch import Handlers, execute, render_error
from cni.errors import CniError, ErrorCode

log = logging.getLogger("netagent.cniserver.server")

READ_TIMEOUT = 10.0


def _peer_uid(conn: socket.socket) -> int:
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return struct.unpack("3i", creds)[1]


def _error_reply(stdin: bytes, error: CniError) -> bytes:
    return wire.encode_reply(1, render_error(stdin, error))


def _read_request(conn: socket.socket) -> bytes:
    conn.settimeout(READ_TIMEOUT)
    data = b""
    expected = None
    while expected is None or len(data) < expected:
        chunk = conn.recv(65536)
        if not chunk:
            break
        data += chunk
        if expected is None and b"\n" in data:
            expected = wire.expected_request_length(data.partition(b"\n")[0])
            if expected is None:
                raise wire.WireError("malformed request header")
        elif expected is None and len(data) > wire.MAX_HEADER:
            raise wire.WireError("request header too long")
    return data


class CniServer:
    """Serve CNI requests on `socket_path` until `stop()`."""

    def __init__(self, socket_path: str, *, handlers: Handlers, workers: int = 8,
                 max_pending: int = 512, not_ready: Callable[[], str | None] = lambda: None) -> None:
        self.socket_path = socket_path
        self.handlers = handlers
        self.max_pending = max_pending
        self.not_ready = not_ready
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="cni")
        self._pending = 0
        self._pending_lock = threading.Lock()
        self._listener: socket.socket | None = None
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self.requests_served = 0

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
        self._thread = threading.Thread(target=self._accept_loop, args=(listener,), name="cni-accept",
                                        daemon=True)
        self._thread.start()
        log.info("serving CNI on %s", self.socket_path)

    def stop(self) -> None:
        self._stopping.set()
        if self._listener is not None:
            try:
                self._listener.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            self._listener.close()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._pool.shutdown(wait=True)
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

    # ------------------------------------------------------------ serving
    def _accept_loop(self, listener: socket.socket) -> None:
        while not self._stopping.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                if self._stopping.is_set():
                    return
                continue
            with self._pending_lock:
                overloaded = self._pending >= self.max_pending
                if not overloaded:
                    self._pending += 1
            if overloaded:
                self._pool.submit(self._refuse, conn)
                continue
            self._pool.submit(self._serve, conn)

    def _refuse(self, conn: socket.socket) -> None:
        with conn:
            try:
                data = _read_request(conn)
                _, stdin = wire.decode_request(data)
                conn.sendall(_error_reply(stdin, CniError(ErrorCode.TRY_AGAIN_LATER, "the agent is busy")))
            except (OSError, ValueError, wire.WireError):
                pass

    def _serve(self, conn: socket.socket) -> None:
        try:
            with conn:
                uid = _peer_uid(conn)
                if uid not in (0, os.getuid()):
                    log.warning("refused a CNI request from uid %d", uid)
                    return
                data = _read_request(conn)
                try:
                    env, stdin = wire.decode_request(data)
                except UnicodeDecodeError:  # the shim relays the environment's bytes as they are
                    conn.sendall(_error_reply(b"", CniError(ErrorCode.INVALID_ENVIRONMENT,
                                                            "the CNI_* environment is not UTF-8")))
                    return
                conn.settimeout(None)
                conn.sendall(self._answer(env, stdin))
        except (OSError, wire.WireError) as exc:
            log.warning("dropped a CNI connection: %s", exc)
        finally:
            with self._pending_lock:
                self._pending -= 1

    def _answer(self, env: dict, stdin: bytes) -> bytes:
        command = env.get("CNI_COMMAND", "")
        reason = self.not_ready() if command != "VERSION" else None
        if reason:
            error = ErrorCode.NOT_AVAILABLE if command == "STATUS" else ErrorCode.TRY_AGAIN_LATER
            return _error_reply(stdin, CniError(error, "the netagent agent is not ready", reason))
        started = time.monotonic()
        code, out = execute(env, stdin, self.handlers)
        self.requests_served += 1
        log.info("CNI %s container=%s ifname=%s exit=%d %.1f ms", command,
                 env.get("CNI_CONTAINERID", "-")[:16], env.get("CNI_IFNAME", "-"), code,
                 (time.monotonic() - started) * 1000)
        return wire.encode_reply(code, out)

"""`ApiServer`: the object tests and the lab hold: listeners, threads, lifecycle, in-process verbs.

`start()` binds a TCP listener (IPv4 or IPv6 by the host given), optionally a unix socket,
and serves any TCP sockets handed over already listening (the lab's second listener, opened
in the namespace that ran `lab up`), each on its own daemon thread by the stdlib's
threading server. `stop()`
ends everything in an order that loses nothing: it flags `stopping` and wakes every watch
stream so they end, closes the listeners, shuts down the connections still open, gives the
watch threads a moment to finish, then closes the store, which saves the state and answers
any later write 503. The listener classes skip the stdlib's name lookup at bind time and
log connection errors instead of printing tracebacks. The in-process helpers (`create`,
`get`, `list`, `update`, `patch`, `delete`) run the store's code paths as HTTP does,
addressing objects the way the lab client does, and return deep copies, so that a test can
never change a stored object.
"""
from __future__ import annotations

import builtins
import logging
import os
import socket
import socketserver
import threading
import time

from lab.apiserver.builtin_objects import ensure_kubernetes_service
from lab.apiserver.handler import Handler
from lab.apiserver.kinds import served_resource
from lab.apiserver.objects import Subresource, clone, typed
from lab.apiserver.persistence import StateFile
from lab.apiserver.selectors import FieldSelector, Filter, LabelSelector
from lab.apiserver.store import Store
from netagent.infra.status_server import NoLookupHTTPServer
from netagent.kube.config import PatchType
from netagent.kube.resources import Resource

_log = logging.getLogger("lab.apiserver")


def _log_connection_error(server: socketserver.BaseServer, request: object, client_address: object) -> None:
    """socketserver prints tracebacks to stderr; a client resetting its connection is routine."""
    _log.debug("connection from %s ended with an error", client_address or "unix socket", exc_info=True)


class ListeningServer(NoLookupHTTPServer):  # no getfqdn at bind: a lab namespace has no resolver
    daemon_threads = True
    api: ApiServer
    handle_error = _log_connection_error


class ListeningServer6(ListeningServer):
    address_family = socket.AF_INET6


class UnixListeningServer(socketserver.ThreadingUnixStreamServer):
    daemon_threads = True
    api: ApiServer
    handle_error = _log_connection_error


class ApiServer:
    """The API test server: `start()` serves on background threads, `stop()` ends everything."""

    def __init__(
        self,
        *,
        state_file: str | None = None,
        history: int = 10000,
        bookmark_interval: float = 5.0,
        watch_timeout: float = 300.0,
        service_cidr: str = "10.96.0.0/16",
        advertise: tuple[str, int] | None = None,
    ) -> None:
        """`advertise` (address, port): publish the `default/kubernetes` Service with that endpoint."""
        self.bookmark_interval = bookmark_interval
        self.watch_timeout = watch_timeout
        self.liveness_poll = 0.25  # how often an idle watch checks that its client is still there
        self.stopping = threading.Event()
        self.store = Store(
            history=history, state=StateFile(state_file) if state_file else None, service_cidr=service_cidr
        )
        self._servers: list[socketserver.BaseServer] = []
        self._threads: list[threading.Thread] = []
        self._connections: set[socket.socket] = set()
        self._connections_lock = threading.Lock()
        self._host = ""
        self._port = 0
        self.unix_path: str | None = None
        if advertise is not None:
            ensure_kubernetes_service(self.store, address=advertise[0], port=advertise[1], service_cidr=service_cidr)

    # -- lifecycle -----------------------------------------------------------------------------
    def start(
        self, *, host: str = "127.0.0.1", port: int = 0, unix_path: str | None = None,
        listening: tuple[socket.socket, ...] = (),
    ) -> None:
        """Serve on host:port, `unix_path`, and on each already listening TCP socket in `listening`
        (the lab hands one over that `lab up` opened in its own network namespace)."""
        if self._servers:
            raise RuntimeError("the API server is already started")
        for sock in listening:
            handed = (ListeningServer6 if sock.family == socket.AF_INET6 else ListeningServer)(
                sock.getsockname()[:2], Handler, bind_and_activate=False)
            handed.socket.close()
            handed.socket = sock
            handed.server_address = sock.getsockname()
            handed.api = self
            self._servers.append(handed)
        server_class = ListeningServer6 if ":" in host else ListeningServer
        tcp = server_class((host, port), Handler)
        tcp.api = self
        self._servers.append(tcp)
        self._host = host
        self._port = tcp.server_address[1]
        if unix_path is not None:
            if os.path.exists(unix_path):
                os.unlink(unix_path)
            unix = UnixListeningServer(unix_path, Handler)
            unix.api = self
            self._servers.append(unix)
            self.unix_path = unix_path
        for server in self._servers:
            thread = threading.Thread(
                target=server.serve_forever, kwargs={"poll_interval": 0.05}, name="lab-apiserver", daemon=True
            )
            thread.start()
            self._threads.append(thread)

    def stop(self) -> None:
        """Close the listeners, end every watch stream and connection, save the state."""
        self.stopping.set()
        self.store.end_watches()
        for server in self._servers:
            server.shutdown()
            server.server_close()
        with self._connections_lock:
            connections = list(self._connections)
        for connection in connections:
            try:
                connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        deadline = time.monotonic() + 2.0
        while self.store.watch_counts() and time.monotonic() < deadline:
            time.sleep(0.01)
        for thread in self._threads:
            thread.join(timeout=1.0)
        if self.unix_path and os.path.exists(self.unix_path):
            os.unlink(self.unix_path)
        self.store.close()

    def __enter__(self) -> ApiServer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def connection_opened(self, connection: socket.socket) -> None:
        with self._connections_lock:
            self._connections.add(connection)

    def connection_closed(self, connection: socket.socket) -> None:
        with self._connections_lock:
            self._connections.discard(connection)

    @property
    def port(self) -> int:
        return self._port

    @property
    def server_address(self) -> str:
        host = "127.0.0.1" if self._host in ("", "0.0.0.0") else "::1" if self._host == "::" else self._host
        return f"[{host}]:{self._port}" if ":" in host else f"{host}:{self._port}"

    @property
    def url(self) -> str:
        """http://host:port to reach the TCP listener (an unspecified address becomes loopback)."""
        return f"http://{self.server_address}"

    # -- in-process helpers (the same code paths as HTTP; results are copies) --------------------
    @property
    def resource_version(self) -> int:
        return self.store.revision

    def create(self, obj: dict) -> dict:
        resource = served_resource(obj.get("apiVersion", ""), obj.get("kind", ""))
        namespace = (obj.get("metadata") or {}).get("namespace") or ("default" if resource.namespaced else None)
        return clone(typed(resource, self.store.create(resource, clone(obj), namespace=namespace)))

    def get(self, resource: Resource, name: str, *, namespace: str | None = None) -> dict:
        return clone(typed(resource, self.store.get(resource, name, namespace=namespace)))

    def list(
        self, resource: Resource, *, namespace: str | None = None, label_selector: str | None = None
    ) -> builtins.list[dict]:
        scope = namespace if resource.namespaced else None
        selection = Filter(scope, LabelSelector.parse(label_selector), FieldSelector([]))
        items = self.store.list(resource, selection, limit=0, token=None)["items"]
        return [clone(typed(resource, obj)) for obj in items]

    def update(self, obj: dict, *, part: Subresource = Subresource.MAIN) -> dict:
        resource = served_resource(obj.get("apiVersion", ""), obj.get("kind", ""))
        metadata = obj.get("metadata") or {}
        namespace = metadata.get("namespace") or ("default" if resource.namespaced else None)
        updated = self.store.replace(
            resource, metadata.get("name", ""), namespace=namespace, body=clone(obj), part=part
        )
        return clone(typed(resource, updated))

    def patch(
        self,
        resource: Resource,
        name: str,
        patch: dict | builtins.list,
        *,
        namespace: str | None = None,
        patch_type: PatchType = PatchType.MERGE,
        part: Subresource = Subresource.MAIN,
    ) -> dict:
        patched = self.store.patch(
            resource, name, namespace=namespace, patch=clone(patch), patch_type=patch_type, part=part
        )
        return clone(typed(resource, patched))

    def delete(
        self, resource: Resource, name: str, *, namespace: str | None = None, grace_period_seconds: int | None = None
    ) -> dict:
        deleted = self.store.delete(resource, name, namespace=namespace, grace_period_seconds=grace_period_seconds)
        return clone(typed(resource, deleted))

    def compact(self) -> int:
        return self.store.compact()

    def watcher_count(self) -> int:
        return sum(self.store.watch_counts().values())

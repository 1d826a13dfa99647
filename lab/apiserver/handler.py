"""The HTTP request handler: one request in, the store called, one JSON answer (or a watch) out.

HTTP/1.1 with keep-alive on the stdlib's threading server, one thread per connection.
`_route` answers the health and version endpoints, the lab's own `/_lab/` endpoints (not
Kubernetes API: `POST /_lab/compact` drops the history and continue snapshots, `GET
/_lab/watchers` counts open watch streams), discovery, and the verbs on collections and
objects: list/watch/create/deletecollection, get/replace/patch/delete, a pod's `log` (read from its
node's kubelet: `pod_logs.py`), the PATCH type
chosen by Content-Type (`kube.config.PatchType`, server-side apply, 415 for others); writes
run under the request's options (`dryRun`, `fieldValidation`, the field manager). Every `ApiError` raised
below is answered as its Status; any other exception is a bug in this server and answered
500, like the real server does, without ending the connection's thread. Watches are handed
to `watch_response.py`. The handler reaches the `ApiServer` (its store, its settings, its
connection bookkeeping for `stop()`) as `self.server.api`.
"""
from __future__ import annotations

import http.server
import json
import logging
import socket
from typing import TYPE_CHECKING
from urllib.parse import parse_qs, urlsplit

from lab.apiserver import pod_logs
from lab.apiserver.bodies import APPLY_PATCH, decode_body, dry_run, media_type, patch_type_of, wants_table
from lab.apiserver.discovery import VERSION_INFO, discovery
from lab.apiserver.errors import ApiError
from lab.apiserver.objects import Subresource, typed
from lab.apiserver.openapi import OPENAPI_V2_PROTOBUF, openapi_document, openapi_v2_protobuf
from lab.apiserver.routing import Target, check_list_options, grace_period, parse_target, truthy
from lab.apiserver.selectors import FieldSelector, Filter, LabelSelector, integer
from lab.apiserver.tables import render_table
from lab.apiserver.validation import FieldValidation
from lab.apiserver.watch_response import WatchResponse
from netagent.kube.config import JSON

if TYPE_CHECKING:
    from lab.apiserver.server import ListeningServer

_log = logging.getLogger("lab.apiserver")


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "netagent-lab-apiserver"
    server: ListeningServer

    # -- connection bookkeeping ----------------------------------------------------------------
    def setup(self) -> None:
        super().setup()
        if self.connection.family in (socket.AF_INET, socket.AF_INET6):
            self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.server.api.connection_opened(self.connection)

    def finish(self) -> None:
        try:
            super().finish()
        except OSError:
            pass
        finally:
            self.server.api.connection_closed(self.connection)

    def address_string(self) -> str:
        return str(self.client_address[0]) if self.client_address else "unix"

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 (stdlib's name)
        _log.debug("%s %s", self.address_string(), format % args)

    # -- dispatch ------------------------------------------------------------------------------
    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_POST(self) -> None:
        self._dispatch("POST")

    def do_PUT(self) -> None:
        self._dispatch("PUT")

    def do_PATCH(self) -> None:
        self._dispatch("PATCH")

    def do_DELETE(self) -> None:
        self._dispatch("DELETE")

    def _dispatch(self, method: str) -> None:
        try:
            raw_body = self._read_body()
            self._route(method, raw_body)
        except ApiError as error:
            self._send_json(error.code, error.status())
        except OSError:
            self.close_connection = True
        except Exception:  # a bug in this server: answer like the real one does, keep serving
            _log.exception("%s %s failed", method, self.path)
            self._send_json(500, ApiError(500, "InternalError", "internal error in the lab API server").status())

    def _read_body(self) -> bytes:
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length > 0 else b""

    def _json_body(self, raw_body: bytes) -> object:
        return decode_body(self.headers.get("Content-Type"), raw_body)

    def _send_json(self, code: int, payload: object, *, table: bool = False) -> None:
        if table and isinstance(payload, dict) and payload.get("kind") != "Status":
            payload = render_table(payload)
        self._send_body(code, json.dumps(payload, separators=(",", ":")).encode(), JSON)

    def _send_body(self, code: int, body: bytes, content_type: str) -> None:
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _send_text(self, code: int, text: str) -> None:
        body = text.encode()
        self.send_response(code)
        self.send_header("Content-Type", "text/plain; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _route(self, method: str, raw_body: bytes) -> None:
        url = urlsplit(self.path)
        path = url.path.rstrip("/") or "/"
        query = {k: v[0] for k, v in parse_qs(url.query, keep_blank_values=True).items()}
        api = self.server.api
        if path in ("/healthz", "/readyz", "/livez"):
            return self._send_text(200, "ok")
        if path == "/version":
            return self._send_json(200, VERSION_INFO)
        if path.startswith("/openapi/") and method == "GET":
            accept = self.headers.get("Accept") or ""
            if path == "/openapi/v2" and "protobuf" in accept and "json" not in accept:  # what client-go asks
                return self._send_body(200, openapi_v2_protobuf(), OPENAPI_V2_PROTOBUF)
            return self._send_json(200, openapi_document(path))
        if path.startswith("/_lab/"):
            return self._lab_admin(method, path)
        log = pod_logs.log_target(path)
        if log is not None:
            if method != "GET":
                raise ApiError(405, "MethodNotAllowed", f"{method} is not supported on a pod's log")
            return self._send_body(200, pod_logs.read_log(api.store, *log, query), "text/plain")
        target = parse_target(path)
        if target is None:
            document = discovery(path, server_address=self._reached_address()) if method == "GET" else None
            if document is None:
                raise ApiError(404, "NotFound", "the server could not find the requested resource")
            return self._send_json(200, document)
        options = self._json_body(raw_body) if method == "DELETE" else None  # DeleteOptions may say dryRun too
        if method == "GET":  # reads (and hour-long watches) never hold the store's lock here
            answer = self._serve_resource(method, target, query, raw_body)
        else:
            validation = FieldValidation.parse(query.get("fieldValidation"))
            manager = query.get("fieldManager") or (self.headers.get("User-Agent") or "").split("/")[0]
            with api.store.request_options(dry_run=dry_run(query, options), validation=validation, manager=manager):
                answer = self._serve_resource(method, target, query, raw_body)
        if answer is not None:  # sent with the lock released: a slow client never holds up the store
            code, payload, table = answer
            self._send_json(code, payload, table=table)

    def _serve_resource(
        self, method: str, target: Target, query: dict[str, str], raw_body: bytes
    ) -> tuple[int, object, bool] | None:
        """(code, answer, as a Table?) for the caller to send once the store's lock is released;
        None when a watch was served here."""
        api = self.server.api
        store = api.store
        resource = target.resource
        table = wants_table(self.headers.get("Accept"))
        if target.name is None:
            selection = Filter(
                target.namespace,
                LabelSelector.parse(query.get("labelSelector")),
                FieldSelector.parse(query.get("fieldSelector"), resource=resource),
            )
            if method == "GET" and (target.watch_path or truthy(query.get("watch"))):
                check_list_options(query, watch=True)
                WatchResponse(self, api).serve(resource, selection, query, table=table)
                return None
            if method == "GET":
                check_list_options(query, watch=False)
                listed = store.list(
                    resource, selection, limit=integer(query.get("limit")) or 0, token=query.get("continue"),
                    resource_version=query.get("resourceVersion"), match=query.get("resourceVersionMatch"),
                )
                return 200, listed, table
            if method == "POST":
                if resource.namespaced and target.namespace is None:
                    raise ApiError(405, "MethodNotAllowed", f"create {resource.plural} in a namespace's collection")
                created = store.create(resource, self._json_body(raw_body), namespace=target.namespace)
                return 201, typed(resource, created), False
            if method == "DELETE":
                removed = store.delete_collection(resource, selection)
                gone = {"kind": f"{resource.kind}List", "apiVersion": resource.api_version,
                        "metadata": {"resourceVersion": str(store.revision)}, "items": removed}
                return 200, gone, False
            raise ApiError(405, "MethodNotAllowed", f"{method} is not supported on a collection")
        if method == "GET":
            found = store.get(resource, target.name, namespace=target.namespace)
            return 200, typed(resource, found), table
        if method == "PUT":
            updated = store.replace(
                resource, target.name, namespace=target.namespace, body=self._json_body(raw_body), part=target.part
            )
            return 200, typed(resource, updated), False
        if method == "PATCH" and media_type(self.headers.get("Content-Type")) == APPLY_PATCH:
            applied, is_new = store.apply(resource, target.name, namespace=target.namespace,
                                          config=self._json_body(raw_body), manager=query.get("fieldManager", ""),
                                          force=truthy(query.get("force")))
            return 201 if is_new else 200, typed(resource, applied), False
        if method == "PATCH":
            patch_type = patch_type_of(self.headers.get("Content-Type"))
            patched = store.patch(
                resource,
                target.name,
                namespace=target.namespace,
                patch=self._json_body(raw_body),
                patch_type=patch_type,
                part=target.part,
            )
            return 200, typed(resource, patched), False
        if method == "DELETE" and target.part is Subresource.MAIN:
            deleted = store.delete(
                resource, target.name, namespace=target.namespace,
                grace_period_seconds=grace_period(query, self._json_body(raw_body)),
            )
            return 200, typed(resource, deleted), False
        raise ApiError(405, "MethodNotAllowed", f"{method} is not supported here")

    def _lab_admin(self, method: str, path: str) -> None:
        api = self.server.api
        if method == "POST" and path == "/_lab/compact":
            return self._send_json(200, {"compactedTo": str(api.store.compact())})
        if method == "GET" and path == "/_lab/watchers":
            counts = api.store.watch_counts()
            return self._send_json(200, {"watchers": sum(counts.values()), "byResource": counts})
        raise ApiError(404, "NotFound", f"no lab endpoint {method} {path}")

    def _reached_address(self) -> str:
        """host:port the client connected to (what /api advertises), the server's own for a unix socket."""
        if self.connection.family in (socket.AF_INET, socket.AF_INET6):
            host, port = self.connection.getsockname()[:2]
            return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        return self.server.api.server_address

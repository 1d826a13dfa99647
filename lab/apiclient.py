"""A tiny stdlib REST client for the lab driver: kubectl-like verbs against the lab API server.

The lab's driver process lives in another network namespace than the API server and
reaches it over a unix socket, so this client speaks HTTP/1.1 over AF_UNIX as well as TCP.
It must start instantly (no `kubernetes` import). Verbs given an object address it the way
kubectl does: `apiVersion` + `kind` pick the resource, `metadata.namespace` (default
"default") and `metadata.name` the object, so `lab apply -f manifest.json` is one call per
object. Verbs given a name take the same `apiVersion` and `kind` strings: `get("v1", "Node", "n1")`.
One connection per request: the lab makes few requests and never has to recover a
half-dead keep-alive connection.
"""
from __future__ import annotations

import builtins
import http.client
import json
import socket
from urllib.parse import urlencode, urlsplit

from netagent.kube.config import PatchType
from netagent.kube.resources import Resource, resource_for


class LabApiError(Exception):
    """A non-2xx answer; `code`, `reason` and `message` come from the Status object."""

    def __init__(self, code: int, *, reason: str, message: str) -> None:
        super().__init__(f"{code} {reason}: {message}")
        self.code = code
        self.reason = reason
        self.message = message


class _UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, unix_path: str, *, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self._unix_path = unix_path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(self._unix_path)
        except OSError:
            sock.close()
            raise
        self.sock = sock


class LabApiClient:
    def __init__(self, *, unix_path: str | None = None, url: str | None = None, timeout: float = 10.0) -> None:
        if (unix_path is None) == (url is None):
            raise ValueError("give exactly one of unix_path or url")
        self._unix_path = unix_path
        self._timeout = timeout
        if url is not None:
            parts = urlsplit(url)
            if parts.scheme != "http" or not parts.hostname:
                raise ValueError(f"only http://host:port URLs are supported, not {url!r}")
            self._host = parts.hostname
            self._port = parts.port or 80

    # -- transport -------------------------------------------------------------------------
    def _connection(self) -> http.client.HTTPConnection:
        if self._unix_path is not None:
            return _UnixHTTPConnection(self._unix_path, timeout=self._timeout)
        return http.client.HTTPConnection(self._host, self._port, timeout=self._timeout)

    def request(
        self,
        method: str,
        path: str,
        *,
        body: object = None,
        content_type: str = "application/json",
        query: dict[str, object] | None = None,
    ) -> dict:
        """One HTTP request; the JSON answer, or LabApiError with the Status message."""
        if query:
            path = f"{path}?{urlencode({k: v for k, v in query.items() if v is not None})}"
        payload = None if body is None else json.dumps(body).encode()
        headers = {"Accept": "application/json"}
        if payload is not None:
            headers["Content-Type"] = content_type
        connection = self._connection()
        try:
            connection.request(method, path, body=payload, headers=headers)
            response = connection.getresponse()
            data = response.read()
        finally:
            connection.close()
        try:
            parsed = json.loads(data) if data else {}
        except ValueError:
            parsed = {"message": data[:200].decode("utf-8", "replace")}
        if not 200 <= response.status <= 299:
            raise LabApiError(
                response.status,
                reason=parsed.get("reason", response.reason),
                message=parsed.get("message", ""),
            )
        return parsed

    # -- addressing ------------------------------------------------------------------------
    @staticmethod
    def _locate(obj: dict) -> tuple[Resource, str | None, str]:
        resource = resource_for(obj.get("apiVersion", ""), obj.get("kind", ""))
        metadata = obj.get("metadata") or {}
        namespace = (metadata.get("namespace") or "default") if resource.namespaced else None
        return resource, namespace, metadata.get("name", "")

    # -- verbs -----------------------------------------------------------------------------
    def create(self, obj: dict) -> dict:
        resource, namespace, _ = self._locate(obj)
        return self.request("POST", resource.list_path(namespace), body=obj)

    def get(self, api_version: str, kind: str, name: str, *, namespace: str | None = None) -> dict:
        resource = resource_for(api_version, kind)
        return self.request("GET", resource.object_path(name, _default_namespace(resource, namespace)))

    def list(
        self,
        api_version: str,
        kind: str,
        *,
        namespace: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
    ) -> list[dict]:
        """All matching objects (following `continue` pages); namespace None = every namespace."""
        resource = resource_for(api_version, kind)
        items: list[dict] = []
        token = None
        while True:
            page = self.request(
                "GET",
                resource.list_path(namespace),
                query={
                    "labelSelector": label_selector,
                    "fieldSelector": field_selector,
                    "limit": 500,
                    "continue": token,
                },
            )
            items.extend(page.get("items") or [])
            token = (page.get("metadata") or {}).get("continue")
            if not token:
                return items

    def replace(self, obj: dict) -> dict:
        resource, namespace, name = self._locate(obj)
        return self.request("PUT", resource.object_path(name, namespace), body=obj)

    def patch(
        self,
        api_version: str,
        kind: str,
        name: str,
        patch: dict | builtins.list,
        *,
        namespace: str | None = None,
        patch_type: PatchType = PatchType.MERGE,
        subresource: str | None = None,
    ) -> dict:
        resource = resource_for(api_version, kind)
        path = resource.object_path(name, _default_namespace(resource, namespace))
        if subresource:
            path = f"{path}/{subresource}"
        return self.request("PATCH", path, body=patch, content_type=patch_type.value)

    def delete(
        self,
        api_version: str,
        kind: str,
        name: str,
        *,
        namespace: str | None = None,
        grace_period_seconds: int | None = None,
    ) -> dict:
        """Delete; a pod given a grace period > 0 is only marked terminating (deletionTimestamp)."""
        resource = resource_for(api_version, kind)
        return self.request(
            "DELETE",
            resource.object_path(name, _default_namespace(resource, namespace)),
            query={"gracePeriodSeconds": grace_period_seconds} if grace_period_seconds is not None else None,
        )

    def apply(self, obj: dict) -> dict:
        """Create the object, or replace the stored one (spec and, when given, status) like kubectl."""
        resource, namespace, name = self._locate(obj)
        try:
            return self.create(obj)
        except LabApiError as error:
            if error.code != 409:
                raise
        current = self.request("GET", resource.object_path(name, namespace))
        desired = json.loads(json.dumps(obj))
        desired.setdefault("metadata", {})["resourceVersion"] = current["metadata"]["resourceVersion"]
        replaced = self.request("PUT", resource.object_path(name, namespace), body=desired)
        if "status" in obj and obj["status"] != replaced.get("status"):
            desired["metadata"]["resourceVersion"] = replaced["metadata"]["resourceVersion"]
            replaced = self.request("PUT", resource.object_path(name, namespace) + "/status", body=desired)
        return replaced

    # -- lab extras (not Kubernetes API) -----------------------------------------------------
    def compact(self) -> int:
        """Drop the server's watch history; returns the resourceVersion it compacted to."""
        return int(self.request("POST", "/_lab/compact")["compactedTo"])

    def watcher_count(self) -> int:
        return int(self.request("GET", "/_lab/watchers")["watchers"])


def _default_namespace(resource: Resource, namespace: str | None) -> str | None:
    if not resource.namespaced:
        return None
    return namespace or "default"

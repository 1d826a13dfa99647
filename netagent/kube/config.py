"""How netagent reaches the API server: the client, and the one raw JSON request it sends.

`load_api_client` builds the official client's `ApiClient` from a kubeconfig (given, or
$KUBECONFIG) or else from the pod's service account, and fails with `KubeConfigError`
naming what is missing. It never touches the client's process-wide default configuration.
`api_server_addresses` says where the agent reaches the API server (the routing and the
service proxy both keep those addresses from Nodes and Services).

`request_json` and `open_request` send a request through that client's connection pool
(so TLS, bearer tokens and token refresh are the official client's) but return plain dicts
parsed from the JSON body: the client's model classes cost about four times the JSON
parsing (1.3 s against 0.3 s for 10,000 Services). Non-2xx answers raise `KubeApiError`
carrying the Status. `PatchType` names the PATCH bodies by their Content-Type, for the
agent's own patches and for the lab's client and API test server alike.

`kubernetes` is imported inside the functions: importing it costs about half a second
and the CNI-side commands that import this package never talk to the API server.
"""
from __future__ import annotations

import enum
import ipaddress
import json
import logging
import os
import socket
import urllib.parse
from collections.abc import Mapping
from netagent.errors import NetagentError

log = logging.getLogger("netagent.kube.config")

SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
JSON = "application/json"


class PatchType(enum.Enum):
    """The PATCH bodies Kubernetes understands, by their Content-Type."""

    MERGE = "application/merge-patch+json"
    STRATEGIC = "application/strategic-merge-patch+json"
    JSON = "application/json-patch+json"


class KubeConfigError(NetagentError):
    """No usable way to reach the API server (the message says what is missing)."""


class KubeApiError(NetagentError):
    """A non-2xx answer from the API server, with the fields of its Status object."""

    def __init__(self, status: int, *, reason: str = "", message: str = "") -> None:
        super().__init__(f"HTTP {status} {reason}: {message}" if reason else f"HTTP {status}: {message}")
        self.status = status
        self.reason = reason
        self.message = message

    @classmethod
    def from_body(cls, status: int, body: bytes) -> "KubeApiError":
        try:
            parsed = json.loads(body)
        except ValueError:
            parsed = None
        if isinstance(parsed, dict) and parsed.get("kind") == "Status":
            return cls(status, reason=parsed.get("reason", ""), message=parsed.get("message", ""))
        return cls(status, message=body[:200].decode("utf-8", "replace"))


def load_api_client(*, kubeconfig: str | None):
    """An `ApiClient` for the kubeconfig (or $KUBECONFIG), else for the in-cluster service account."""
    from kubernetes.client.api_client import ApiClient
    from kubernetes.client.configuration import Configuration

    configuration = Configuration()
    source = kubeconfig or os.environ.get("KUBECONFIG")
    if source:
        _load_kubeconfig(source, configuration)
    else:
        _load_in_cluster(configuration)
    return ApiClient(configuration=configuration)


def api_server_addresses(api_client: object = None, environ: Mapping[str, str] = os.environ) -> tuple:
    """The addresses this agent reaches the API server at: its client's host (an address, or what
    the name resolves to now; nothing, logged, when it does not resolve) and
    `$KUBERNETES_SERVICE_HOST`. Read defensively: a test's client may have no configuration.
    No Node's pod CIDR may hold them (a peer there would take the agents' own path to the API
    server) and no Service's external IP may be one of them."""
    found = []
    host = getattr(getattr(api_client, "configuration", None), "host", None)
    if isinstance(host, str) and host:
        found += _resolved(urllib.parse.urlsplit(host if "//" in host else f"//{host}").hostname or "")
    service_host = environ.get("KUBERNETES_SERVICE_HOST", "").strip().strip("[]")
    if service_host:
        found += _resolved(service_host, resolve=False)
    return tuple(dict.fromkeys(found))


def _resolved(host: str, *, resolve: bool = True) -> list:
    if not host:
        return []
    try:
        return [ipaddress.ip_address(host)]
    except ValueError:
        if not resolve:
            return []
    try:
        found = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except (OSError, UnicodeError) as error:
        log.warning("API server host %s does not resolve (%s): its address is not protected", host, error)
        return []
    return [ipaddress.ip_address(str(info[4][0]).split("%")[0]) for info in found]


def _load_kubeconfig(source: str, configuration) -> None:
    from kubernetes.config.config_exception import ConfigException
    from kubernetes.config.kube_config import load_kube_config

    paths = [p for p in source.split(os.pathsep) if p]
    if not any(os.path.exists(os.path.expanduser(p)) for p in paths):
        raise KubeConfigError(f"kubeconfig {source} does not exist")
    try:
        load_kube_config(config_file=source, client_configuration=configuration, persist_config=False)
    except (ConfigException, OSError, ValueError, TypeError, KeyError) as error:
        raise KubeConfigError(f"kubeconfig {source} is not usable: {error}") from error


def _load_in_cluster(configuration) -> None:
    from kubernetes.config.config_exception import ConfigException
    from kubernetes.config.incluster_config import InClusterConfigLoader

    token = os.path.join(SERVICE_ACCOUNT_DIR, "token")
    ca_cert = os.path.join(SERVICE_ACCOUNT_DIR, "ca.crt")
    missing = [name for name in ("KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT") if not os.environ.get(name)]
    missing += [path for path in (token, ca_cert) if not os.path.exists(path)]
    if missing:
        raise KubeConfigError(
            "no kubeconfig given (--kubeconfig or $KUBECONFIG) and not running in a pod: "
            f"missing {', '.join(missing)}"
        )
    try:
        # The loader re-reads the token file as it rotates (bound service account tokens).
        InClusterConfigLoader(token_filename=token, cert_filename=ca_cert).load_and_set(configuration)
    except (ConfigException, OSError) as error:
        raise KubeConfigError(f"in-cluster service account config is not usable: {error}") from error


def open_request(
    api_client,
    method: str,
    path: str,
    *,
    query: list[tuple[str, object]] | None = None,
    body: object = None,
    content_type: str | None = None,
    timeout: float | tuple[float, float] | None = None,
):
    """Send a request; return the unread urllib3 response (any status: the caller checks)."""
    headers = {"Accept": JSON}
    if content_type:
        headers["Content-Type"] = content_type
    method, url, headers, body, post_params = api_client.param_serialize(
        method=method,
        resource_path=path,
        query_params=list(query or []),
        header_params=headers,
        body=body,
        auth_settings=["BearerToken"],
    )
    rest_response = api_client.call_api(
        method, url, header_params=headers, body=body, post_params=post_params, _request_timeout=timeout
    )
    return rest_response.response


def request_json(
    api_client,
    method: str,
    path: str,
    *,
    query: list[tuple[str, object]] | None = None,
    body: object = None,
    content_type: str | None = None,
    timeout: float | tuple[float, float] | None = 30.0,
) -> dict:
    """Send a request and return its JSON body as a dict; a non-2xx answer raises KubeApiError."""
    if body is not None and content_type is None:
        content_type = JSON
    response = open_request(
        api_client, method, path, query=query, body=body, content_type=content_type, timeout=timeout
    )
    try:
        data = response.data
    finally:
        response.release_conn()
    if not 200 <= response.status <= 299:
        raise KubeApiError.from_body(response.status, data)
    return json.loads(data)

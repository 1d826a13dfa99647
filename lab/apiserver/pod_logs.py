"""`GET /api/v1/namespaces/NS/pods/NAME/log`: a container's log, read from its node's kubelet.

The real API server holds no logs: it finds the pod's node (`spec.nodeName`), that Node's address
(its first InternalIP) and kubelet port (`status.daemonEndpoints.kubeletEndpoint.Port`), and
proxies to the kubelet's `/containerLogs/NS/POD/CONTAINER`. This does the same over plain HTTP
to the lab's kubelet stand-in (`lab/kubelet.py`), passing `tailLines` and `limitBytes` on and
answering text/plain, with the real server's errors for what it checks itself: a pod not
scheduled, an unknown container, a container name needed (400), a kubelet that does not answer
(500) or knows no such container (404). `container`, `tailLines` and `limitBytes` are checked
before any request leaves, so nothing from the query reaches the URL unvalidated.
"""
from __future__ import annotations

import ipaddress
import re
import urllib.error
import urllib.request
from urllib.parse import quote, unquote, urlencode

from lab.apiserver.errors import ApiError, bad_request
from lab.apiserver.store import Store
from netagent.kube.resources import NODES, PODS

KUBELET_TIMEOUT = 10.0
_PATH = re.compile(r"^/api/v1/namespaces/([^/]+)/pods/([^/]+)/log$")
_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


def log_target(path: str) -> tuple[str, str] | None:
    """(namespace, pod) when `path` is a pod's log, else None."""
    found = _PATH.match(path)
    return (unquote(found.group(1)), unquote(found.group(2))) if found else None


def _whole(query: dict[str, str], key: str) -> int | None:
    value = query.get(key)
    if value is None or value == "":
        return None
    if not value.isdigit():
        raise bad_request(f"{key} {value[:32]!r}: expected a whole number")
    return int(value)


def kubelet_url(store: Store, namespace: str, name: str, query: dict[str, str]) -> str:
    """Where the pod's node's kubelet serves the asked container's log (the errors a real server gives)."""
    pod = store.get(PODS, name, namespace=namespace)
    containers = [str(c.get("name", "")) for c in (pod.get("spec") or {}).get("containers") or []]
    container = query.get("container") or ""
    if not container:
        if len(containers) != 1:
            raise bad_request(f"a container name must be specified for pod {name}, choose one of: {containers}")
        container = containers[0]
    elif container not in containers:
        raise bad_request(f"container {container[:64]} is not valid for pod {name}")
    node_name = (pod.get("spec") or {}).get("nodeName")
    if not node_name:
        raise bad_request(f"pod {name} does not have a host assigned")
    node = store.find(NODES, node_name, namespace=None)
    status = (node or {}).get("status") or {}
    address = next((a.get("address") for a in status.get("addresses") or [] if a.get("type") == "InternalIP"), None)
    port = ((status.get("daemonEndpoints") or {}).get("kubeletEndpoint") or {}).get("Port")
    try:
        host = ipaddress.ip_address(str(address))
    except ValueError:
        raise ApiError(500, "InternalError", f"node {node_name} has no InternalIP to reach its kubelet at") from None
    if not isinstance(port, int) or not 0 < port < 65536:
        raise ApiError(500, "InternalError", f"node {node_name} has no kubelet port")
    options = {k: v for k, v in (("tailLines", _whole(query, "tailLines")),
                                 ("limitBytes", _whole(query, "limitBytes"))) if v is not None}
    where = f"[{host}]" if host.version == 6 else str(host)
    path = "/".join(quote(part, safe="") for part in (namespace, name, container))
    return f"http://{where}:{port}/containerLogs/{path}" + (f"?{urlencode(options)}" if options else "")


def read_log(store: Store, namespace: str, name: str, query: dict[str, str]) -> bytes:
    url = kubelet_url(store, namespace, name, query)
    try:
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))   # never a proxy from the environment
        with opener.open(url, timeout=KUBELET_TIMEOUT) as response:
            return response.read()
    except urllib.error.HTTPError as error:
        message = error.read(512).decode("utf-8", "replace")
        raise ApiError(404 if error.code == 404 else 500, "NotFound" if error.code == 404 else "InternalError",
                       f"the kubelet of pod {name}: {message or error.reason}") from None
    except (OSError, urllib.error.URLError) as error:
        raise ApiError(500, "InternalError", f"the kubelet of pod {name} did not answer: {error}") from None

"""The v1 Pod objects the lab publishes for its pods, as a kubelet would report them.

A lab pod is a network namespace wired by our CNI plugin; the API object is what the rest
of a cluster sees of it: labels for Service selectors, `spec.nodeName`, named container
ports for named `targetPort`s, `status.podIP(s)` (one per family), phase Running, the Ready condition and
the container's status as a kubelet reports it (running, started, ready, no restarts; so
kubectl shows READY 1/1), both flipped by `lab pod ready`, and, while it terminates,
`metadata.deletionTimestamp` (set by the API server on a graceful delete). Everything here
is pure: `lab_pods.py` writes.

Container ports are given as {name: port} or {name: (port, protocol)}; on the command line
as `name=port[/protocol],...` (protocol TCP unless said).
"""
from __future__ import annotations

import re
import time

from lab.service_spec import PROTOCOLS

CONTAINER_NAME = "main"
CONTAINER_IMAGE = "netagent-lab/pod"
_IANA_SERVICE_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]{0,13}[a-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")


class PodSpecError(ValueError):
    """A pod name, label or port the API would refuse; the message says which."""


def now_rfc3339() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def check_pod_name(name: str) -> None:
    if not _DNS_SUBDOMAIN.match(name) or len(name) > 63:
        raise PodSpecError(f"pod name {name!r}: use lowercase letters, digits, '-' and '.' (at most 63)")


def normalize_ports(ports: dict | None) -> dict[str, list]:
    """{name: port | (port, protocol)} -> {name: [port, protocol]}, checked like the API would."""
    normalized: dict[str, list] = {}
    for name, value in (ports or {}).items():
        number, protocol = (value, "TCP") if isinstance(value, int) else tuple(value)
        if not _IANA_SERVICE_NAME.match(name) or "--" in name or not re.search("[a-z]", name):
            raise PodSpecError(f"port name {name!r}: at most 15 lowercase letters, digits and '-', with a letter")
        if not isinstance(number, int) or not 1 <= number <= 65535:
            raise PodSpecError(f"port {name}: {number!r} is not a port number")
        protocol = str(protocol).upper()
        if protocol not in PROTOCOLS:
            raise PodSpecError(f"port {name}: protocol {protocol!r} (use one of {', '.join(PROTOCOLS)})")
        normalized[name] = [number, protocol]
    return normalized


def parse_ports(text: str) -> dict[str, list]:
    """`http=8080,dns=53/UDP` -> {"http": [8080, "TCP"], "dns": [53, "UDP"]}."""
    ports: dict = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, sep, value = item.partition("=")
        number, _, protocol = value.partition("/")
        if not sep or not name or not number.strip().isdigit():
            raise PodSpecError(f"port {item!r}: expected name=port or name=port/protocol")
        ports[name.strip()] = (int(number), protocol.strip() or "TCP")
    return normalize_ports(ports)


def ready_conditions(*, ready: bool, since: str) -> list[dict]:
    status = "True" if ready else "False"
    return [
        {"type": "PodScheduled", "status": "True", "lastTransitionTime": since},
        {"type": "Initialized", "status": "True", "lastTransitionTime": since},
        {"type": "ContainersReady", "status": status, "lastTransitionTime": since},
        {"type": "Ready", "status": status, "lastTransitionTime": since},
    ]


def container_statuses(*, ready: bool, started_at: str, container_id: str) -> list[dict]:
    """The one container's status: running since `started_at`, started, `ready` as its probe says."""
    return [{"name": CONTAINER_NAME, "image": CONTAINER_IMAGE, "imageID": "",
             "containerID": f"containerd://{container_id}", "ready": ready, "started": True,
             "restartCount": 0, "state": {"running": {"startedAt": started_at}}}]


def render_pod(
    name: str,
    *,
    namespace: str,
    node: str,
    host_ip: str,
    pod_ip: str,
    labels: dict,
    ports: dict[str, list],
    ready: bool = True,
    container_id: str = "",
    pod_ips: list[str] | None = None,
) -> dict:
    """The Pod as the kubelet reports it once its sandbox has an address (`container_id`
    names the sandbox, as the runtime's id in `containerStatuses[].containerID`; `pod_ips` one
    per family, the primary (`pod_ip`) first, as `status.podIPs`; default [`pod_ip`])."""
    since = now_rfc3339()
    container_ports = [{"name": port_name, "containerPort": number, "protocol": protocol}
                       for port_name, (number, protocol) in ports.items()]
    container: dict = {"name": CONTAINER_NAME, "image": CONTAINER_IMAGE}
    if container_ports:
        container["ports"] = container_ports
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": dict(labels)},
        "spec": {"nodeName": node, "containers": [container], "restartPolicy": "Always",
                 "terminationGracePeriodSeconds": 30},
        "status": {
            "phase": "Running",
            "hostIP": host_ip,
            "hostIPs": [{"ip": host_ip}],
            "podIP": pod_ip,
            "podIPs": [{"ip": ip} for ip in pod_ips or [pod_ip]],
            "startTime": since,
            "conditions": ready_conditions(ready=ready, since=since),
            "containerStatuses": container_statuses(ready=ready, started_at=since,
                                                    container_id=container_id or f"{namespace}-{name}"),
        },
    }


def with_readiness(pod: dict, *, ready: bool) -> dict | None:
    """The status patch flipping Ready, ContainersReady and the containers' `ready`, or None
    when already so."""
    status = "True" if ready else "False"
    pod_status = pod.get("status") or {}
    conditions = pod_status.get("conditions") or []
    if any(c.get("type") == "Ready" and c.get("status") == status for c in conditions):
        return None
    since = now_rfc3339()
    flipped = [
        {**c, "status": status, "lastTransitionTime": since} if c.get("type") in ("Ready", "ContainersReady") else c
        for c in conditions
    ]
    if not any(c.get("type") == "Ready" for c in flipped):
        flipped.append({"type": "Ready", "status": status, "lastTransitionTime": since})
    patch: dict = {"conditions": flipped}
    if pod_status.get("containerStatuses"):
        patch["containerStatuses"] = [{**c, "ready": ready} for c in pod_status["containerStatuses"]]
    return {"status": patch}

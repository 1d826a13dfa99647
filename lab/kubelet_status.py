"""What the lab's kubelet stand-in (`kubelet.py`) runs for a Pod, and the status it reports: pure.

The quick lab has no container runtime and no images, so the stand-in runs one kind of
container only: an agnhost image (`registry.k8s.io/e2e-test-images/agnhost:<tag>`, any tag)
whose command is agnhost's own (no `command`, or `/agnhost`), run as the real agnhost binary
that `scripts/build-kubernetes` builds (`lab/kubernetes/binaries.py` says where). `container_argv`
turns the Pod's one container into that argv, with the user its securityContext asks for, or
raises `Refused` saying why not (the pod is then Failed with that message rather than left
Pending). Readiness: no probe (Ready once started) or a `tcpSocket` probe on a number.

The status patches follow a kubelet's order (Pending -> Running, Ready when the probe passes ->
Succeeded or Failed by the exit code), each a merge patch of `status` built from
`pod_objects.py`'s conditions, so a reader (kubectl, `netagent connectivity-test`'s
`parse_outcome`) sees what it sees on a real node: the phase, podIP(s), hostIP(s), the
conditions and one container status (waiting, running or terminated with its exit code).
"""
from __future__ import annotations

import dataclasses
import re

from lab.pod_objects import CONTAINER_IMAGE, now_rfc3339, ready_conditions

AGNHOST_IMAGE = re.compile(r"^([a-z0-9.-]+(:[0-9]+)?/)?([a-z0-9._-]+/)*agnhost(:[A-Za-z0-9._-]{1,128})?$")
AGNHOST_COMMANDS: tuple[list[str], ...] = ([], ["/agnhost"], ["agnhost"])
MAX_ARGS = 64
MAX_ARG_CHARS = 4096


class Refused(ValueError):
    """The stand-in cannot run this pod; the message says why (it becomes the pod's status message)."""


@dataclasses.dataclass(frozen=True)
class Container:
    """The one container the stand-in runs: agnhost's arguments, as whom, how it is probed."""

    name: str
    image: str
    args: tuple[str, ...]
    uid: int | None = None
    gid: int | None = None
    probe_port: int | None = None      # a tcpSocket readiness probe's port; None: Ready once started


def _user(security: dict, key: str) -> int | None:
    value = security.get(key)
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < 2 ** 31:
        raise Refused(f"securityContext.{key} {str(value)[:32]!r} is not a user or group id")
    return value


def ours(pod: dict) -> bool:
    """Whether the stand-in runs this Pod: not the lab's own (`pod_objects.CONTAINER_IMAGE`:
    `lab_pods.py` runs those) and not one whose containers lack an image (no kubelet could run it:
    an object standing for a pod run elsewhere, as the benches write). Any other it runs or refuses."""
    containers = (pod.get("spec") or {}).get("containers") or []
    images = [c.get("image") if isinstance(c, dict) else None for c in containers]
    return bool(images) and all(images) and not all(image == CONTAINER_IMAGE for image in images)


def container_of(pod: dict) -> Container:
    """The pod's container as the stand-in runs it, or `Refused`."""
    spec = pod.get("spec") or {}
    containers = spec.get("containers") or []
    if spec.get("initContainers") or len(containers) != 1 or not isinstance(containers[0], dict):
        raise Refused("the lab's kubelet runs pods of exactly one container and no init containers")
    container = containers[0]
    image = str(container.get("image") or "")
    if not AGNHOST_IMAGE.match(image):
        raise Refused(f"the lab's kubelet runs only agnhost images, not {image[:128]!r}")
    command = container.get("command") or []
    if command not in AGNHOST_COMMANDS:
        raise Refused(f"the lab's kubelet runs only agnhost's own command, not {str(command)[:128]}")
    args = container.get("args") or []
    if not isinstance(args, list) or len(args) > MAX_ARGS or \
            not all(isinstance(a, str) and len(a) <= MAX_ARG_CHARS and "\0" not in a for a in args):
        raise Refused("container args: at most 64 strings without NUL")
    security = {**(spec.get("securityContext") or {}), **(container.get("securityContext") or {})}
    uid, gid = _user(security, "runAsUser"), _user(security, "runAsGroup")
    if security.get("runAsNonRoot") and not uid:
        raise Refused("runAsNonRoot without a non-zero runAsUser: the agnhost binary has no user of its own")
    probe = container.get("readinessProbe")
    port = None
    if probe:
        port = (probe.get("tcpSocket") or {}).get("port") if isinstance(probe, dict) else None
        if not isinstance(port, int) or isinstance(port, bool) or not 0 < port < 65536:
            raise Refused("the lab's kubelet probes readiness with a tcpSocket probe on a port number only")
    return Container(name=str(container.get("name") or "main"), image=image, args=tuple(args),
                     uid=uid, gid=gid if gid is not None else uid, probe_port=port)


def container_argv(container: Container, agnhost: str) -> list[str]:
    """The container's process: the agnhost binary with its args."""
    return [agnhost, *container.args]


# ------------------------------------------------------------------ status patches
def _container_status(container: Container, *, container_id: str, state: dict, ready: bool = False,
                      restarts: int = 0) -> list[dict]:
    return [{"name": container.name, "image": container.image, "imageID": "",
             **({"containerID": f"containerd://{container_id}"} if container_id else {}),
             "ready": ready, "started": "running" in state, "restartCount": restarts, "state": state}]


def pending(container: Container | None, *, reason: str = "ContainerCreating", message: str = "") -> dict:
    """Seen, not yet started: scheduled, the container waiting (`message`: why, e.g. the CNI ADD's error)."""
    since = now_rfc3339()
    status: dict = {"phase": "Pending", "conditions": ready_conditions(ready=False, since=since)[:1]}
    if container is not None:
        waiting = {"reason": reason, **({"message": message[:1024]} if message else {})}
        status["containerStatuses"] = _container_status(container, container_id="", state={"waiting": waiting})
    return {"status": status}


def refused(message: str) -> dict:
    """Failed before anything ran: no container status with an exit code, the reason in the status."""
    return {"status": {"phase": "Failed", "reason": "UnsupportedByLabKubelet", "message": message[:1024]}}


def running(container: Container, *, pod_ips: list[str], host_ip: str, container_id: str, ready: bool,
            started_at: str, restarts: int = 0) -> dict:
    """Started: its addresses (one per family, the primary first), Running, Ready as its probe says."""
    return {"status": {
        "phase": "Running", "hostIP": host_ip, "hostIPs": [{"ip": host_ip}],
        "podIP": pod_ips[0] if pod_ips else "", "podIPs": [{"ip": ip} for ip in pod_ips],
        "startTime": started_at, "conditions": ready_conditions(ready=ready, since=now_rfc3339()),
        "containerStatuses": _container_status(container, container_id=container_id, ready=ready, restarts=restarts,
                                               state={"running": {"startedAt": started_at}})}}


def terminated(container: Container, *, exit_code: int, container_id: str, started_at: str,
               reason: str = "", message: str = "") -> dict:
    """Ended for good: Succeeded on exit 0, else Failed; the exit code in the container's status
    (`reason`: DeadlineExceeded when the kubelet ended it)."""
    finished = now_rfc3339()
    state = {"terminated": {"exitCode": exit_code, "reason": "Completed" if exit_code == 0 else "Error",
                            "startedAt": started_at, "finishedAt": finished, "containerID": f"containerd://{container_id}"}}
    status: dict = {"phase": "Succeeded" if exit_code == 0 and not reason else "Failed",
                    "conditions": ready_conditions(ready=False, since=finished),
                    "containerStatuses": _container_status(container, container_id=container_id, state=state)}
    if reason:
        status["reason"], status["message"] = reason, message[:1024]
    return {"status": status}

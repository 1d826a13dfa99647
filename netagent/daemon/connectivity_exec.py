"""The real `ClusterApi.agent_flows`: `netagent flows --json` run in a node's agent pod through
the official client's exec stream, bounded in time and in output.

The agent pod is found as deploy/netagent.yaml makes it (the DaemonSet's namespace and labels,
`spec.nodeName`), with the user's permissions: listing pods in kube-system and `pods/exec` there
are asked of the user's kubeconfig, never of the agent's ClusterRole. The websocket's connect has
no timeout of its own, so the exec runs on a daemon thread the caller waits for at most
EXEC_TIMEOUT (+2 s); its output is read until the command ends, the deadline passes or
OUTPUT_LIMIT bytes came (then the partial last line is dropped). Any failure becomes a
`FlowsUnavailable` saying why, for the run's log; it is never a check's failure.
"""
from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING

from netagent.daemon import connectivity_flows as flows_
from netagent.daemon.connectivity_flows import FlowsUnavailable
from netagent.daemon.connectivity_report import printable

if TYPE_CHECKING:
    from netagent.daemon.connectivity_test import KubeClusterApi


def _returncode(client) -> int:
    """The ended command's exit code from the stream's status channel (-1 when unreadable)."""
    try:
        return int(client.returncode)
    except Exception:   # a status the client cannot read (its YAML, a missing cause)
        return -1


def _exec_output(client, deadline: float) -> tuple[str, str, int | None]:
    """(stdout, stderr, exit code or None) of an exec stream, read until it ends, `deadline`
    (monotonic) passes or stdout reaches OUTPUT_LIMIT (the last, partial line is then dropped)."""
    out: list[str] = []
    err: list[str] = []
    size = 0
    try:
        while client.is_open() and size < flows_.OUTPUT_LIMIT:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            client.update(timeout=min(left, 1.0))
            chunk = client.read_stdout(timeout=0)
            out.append(chunk)
            size += len(chunk)
            if sum(len(e) for e in err) < 4096:
                err.append(client.read_stderr(timeout=0))
        ended = not client.is_open()
        text = "".join(out)
        if not ended:
            text = text[:text.rfind("\n") + 1]
        code = _returncode(client) if ended else None
    finally:
        client.close()
    return text, "".join(err), code


def _exec_flows(core, pod: str, namespace: str, result: list) -> None:
    """Run in a thread: `result` gets (stdout, stderr, code) or the error."""
    from kubernetes.stream import stream
    try:
        client = stream(core.connect_get_namespaced_pod_exec, pod, flows_.AGENT_NAMESPACE,
                        container=flows_.AGENT_CONTAINER, command=flows_.flows_command(namespace),
                        stdin=False, stdout=True, stderr=True, tty=False, _preload_content=False)
        result.append(_exec_output(client, time.monotonic() + flows_.EXEC_TIMEOUT))
    except Exception as error:   # the stream's errors: ApiException, websocket's, OSError, YAML of the status
        result.append(error)


def agent_flows(api: "KubeClusterApi", node: str, namespace: str) -> str:
    """`ClusterApi.agent_flows` for the real cluster."""
    from netagent.kube.config import KubeApiError
    where = f"{flows_.AGENT_NAMESPACE}, {flows_.AGENT_SELECTOR}"
    try:
        pods = api.list_pods(flows_.AGENT_NAMESPACE, flows_.AGENT_SELECTOR)
    except KubeApiError as error:
        raise FlowsUnavailable(f"cannot list the agent pods ({where}): {printable(error, 120)}") from None
    running = [p for p in pods if (p.get("spec") or {}).get("nodeName") == node
               and (p.get("status") or {}).get("phase") == "Running"]
    if not running:
        raise FlowsUnavailable(f"no running agent pod ({where})")
    name = str(running[0]["metadata"]["name"])
    result: list = []
    worker = threading.Thread(target=_exec_flows, args=(api.core, name, namespace, result), daemon=True,
                              name="agent-flows")
    worker.start()
    worker.join(flows_.EXEC_TIMEOUT + 2.0)
    if not result:
        raise FlowsUnavailable(f"exec in {flows_.AGENT_NAMESPACE}/{name}: no answer in {flows_.EXEC_TIMEOUT:.0f} s")
    if isinstance(result[0], BaseException):
        why = getattr(result[0], "reason", None) or result[0]
        raise FlowsUnavailable(f"exec in {flows_.AGENT_NAMESPACE}/{name} refused: {printable(why, 160)}")
    out, err, code = result[0]
    if code not in (0, None) and not out.strip():
        lines = [line for line in err.splitlines() if line.strip()]
        raise FlowsUnavailable(f"`netagent flows` in {flows_.AGENT_NAMESPACE}/{name} exited {code}: "
                               f"{printable(lines[-1] if lines else 'no message', 160)}")
    return out

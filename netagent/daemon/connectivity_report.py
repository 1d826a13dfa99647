"""`netagent connectivity-test`'s verdicts: a client pod's end read as an outcome, judged against
what the check expects, and the results as a table or JSON.

A client runs `agnhost connect`, which exits 0 on a connection and otherwise 1 with one line on
stderr starting with a fixed word (TIMEOUT, REFUSED, DNS, OTHER, UNKNOWN), so the pod's phase
and its log's last line are the whole answer. A blocked check passes only on a network refusal
(TIMEOUT, REFUSED, OTHER): a DNS error or a pod that never ran proves nothing about the policy.
Text from the cluster (logs, status messages) is cut to printable characters before it is
shown, so a hostile or garbled log cannot paint the terminal.
"""
from __future__ import annotations

import dataclasses
import enum
import json

from netagent.daemon.connectivity_plan import Check, Expect

NETWORK_REFUSALS = ("TIMEOUT", "REFUSED", "OTHER")
AGNHOST_WORDS = NETWORK_REFUSALS + ("DNS", "UNKNOWN")
_MAX_TEXT = 160


class Status(enum.Enum):
    PASS = "PASS"
    FAIL = "FAIL"
    SKIP = "SKIP"


@dataclasses.dataclass(frozen=True)
class Outcome:
    """How a client pod ended. `kind`: agnhost's word, POD (it failed before connecting), or ''
    (it connected, or has not finished)."""

    finished: bool
    connected: bool = False
    kind: str = ""
    detail: str = ""


@dataclasses.dataclass(frozen=True)
class CheckResult:
    check: Check
    status: Status
    reason: str = ""
    attempts: int = 0
    seconds: float = 0.0
    client: str = ""       # the last client pod's address (its flows explain a failure)

    def to_json(self) -> dict:
        return {"check": self.check.name, "from": self.check.source, "to": self.check.destination,
                "target": self.check.target or None, "protocol": self.check.protocol,
                "expect": self.check.expect.value, "result": self.status.value, "reason": self.reason,
                "note": self.check.why or None, "attempts": self.attempts, "seconds": round(self.seconds, 1)}


def printable(text: object, limit: int = _MAX_TEXT) -> str:
    cleaned = "".join(c if c.isprintable() else " " for c in str(text)).strip()
    return cleaned if len(cleaned) <= limit else cleaned[:limit - 3] + "..."


def last_line(log: str) -> str:
    lines = [line for line in log.splitlines() if line.strip()]
    return printable(lines[-1]) if lines else ""


def pod_state(pod: dict) -> str:
    """'Pending: ContainerCreating', 'Pending: ErrImagePull: ...', 'Running': where the pod is."""
    status = pod.get("status") or {}
    words = [str(status.get("phase") or "Unknown")]
    for container in status.get("containerStatuses") or []:
        state = container.get("state") or {}
        waiting = state.get("waiting") or {}
        if waiting:
            words.append(str(waiting.get("reason") or "waiting"))
            if waiting.get("message"):
                words.append(str(waiting["message"]))
    if len(words) == 1 and status.get("reason"):
        words += [str(status["reason"]), str(status.get("message") or "")]
    if len(words) == 1:
        unscheduled = [c for c in status.get("conditions") or [] if c.get("status") == "False" and c.get("message")]
        if unscheduled:
            words.append(str(unscheduled[0]["message"]))
    return printable(": ".join(w for w in words if w))


def parse_outcome(pod: dict, log: str) -> Outcome:
    """The outcome of a client pod from its status and log (its phase says whether it ended)."""
    status = pod.get("status") or {}
    phase = status.get("phase")
    if phase == "Succeeded":
        return Outcome(finished=True, connected=True)
    if phase != "Failed":
        return Outcome(finished=False, detail=pod_state(pod))
    code = None
    for container in status.get("containerStatuses") or []:
        terminated = (container.get("state") or {}).get("terminated") or {}
        if terminated:
            code = terminated.get("exitCode")
    line = last_line(log)
    word = line.split(":", 1)[0].strip()
    if code is None:   # never ran: evicted, deadline exceeded, a missing image...
        return Outcome(finished=True, kind="POD", detail=f"pod failed: {pod_state(pod)}")
    if word in AGNHOST_WORDS:
        return Outcome(finished=True, kind=word, detail=f"exit {code}: {line}")
    return Outcome(finished=True, kind="POD", detail=f"exit {code}: {line or 'no log'}")


def judge(check: Check, outcome: Outcome) -> tuple[Status, str]:
    """PASS or FAIL (and why) for a finished outcome."""
    if check.expect is Expect.CONNECT:
        return (Status.PASS, "") if outcome.connected else (Status.FAIL, outcome.detail)
    if outcome.connected:
        return Status.FAIL, "connected, though a policy should block it"
    if outcome.kind in NETWORK_REFUSALS:
        return Status.PASS, f"blocked ({outcome.kind})"
    return Status.FAIL, f"not a network refusal: {outcome.detail}"


def skipped(check: Check) -> CheckResult:
    return CheckResult(check=check, status=Status.SKIP, reason=check.skip)


def failed(results: list[CheckResult]) -> bool:
    return any(r.status is Status.FAIL for r in results)


def summary(results: list[CheckResult]) -> str:
    counts = {s: sum(1 for r in results if r.status is s) for s in Status}
    return f"{counts[Status.PASS]} passed, {counts[Status.FAIL]} failed, {counts[Status.SKIP]} skipped"


def render_table(results: list[CheckResult]) -> str:
    """One row a check: CHECK FROM TO RESULT REASON (for a PASS: the note, if any)."""
    header = ("CHECK", "FROM", "TO", "RESULT", "REASON")
    rows = [header] + [(r.check.name, r.check.source, printable(r.check.destination, 60), r.status.value,
                        printable(r.reason or (r.check.why if r.status is Status.PASS else ""), 400))
                       for r in results]
    widths = [max(len(row[i]) for row in rows) for i in range(len(header) - 1)]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths)) + "  " + row[-1]
             for row in rows]
    return "\n".join(line.rstrip() for line in lines) + "\n" + summary(results)


def render_json(results: list[CheckResult], *, namespace: str, nodes: list[str], ignored: list[str]) -> str:
    return json.dumps({"namespace": namespace, "nodes": nodes, "ignored_nodes": ignored,
                       "checks": [r.to_json() for r in results],
                       "passed": sum(1 for r in results if r.status is Status.PASS),
                       "failed": sum(1 for r in results if r.status is Status.FAIL),
                       "skipped": sum(1 for r in results if r.status is Status.SKIP)}, indent=2)

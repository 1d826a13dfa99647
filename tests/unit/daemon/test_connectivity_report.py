"""connectivity_report: a client pod's end read as an outcome, judged, and shown."""
from __future__ import annotations

import json

from netagent.daemon.connectivity_plan import Check, Expect
from netagent.daemon.connectivity_report import (CheckResult, Outcome, Status, judge, parse_outcome, printable,
                                                 render_json, render_table)

CONNECT = Check("pod-to-pod", "client@n1", "server-a@n1", "n1", "10.0.0.1:8080")
BLOCKED = Check("policy/deny", "client@n1", "guarded@n2", "n1", "10.0.0.2:8080", expect=Expect.BLOCKED)


def failed_pod(code: int | None = 1, **status) -> dict:
    containers = [{"state": {"terminated": {"exitCode": code}}}] if code is not None else []
    return {"status": {"phase": "Failed", "containerStatuses": containers, **status}}


def test_a_succeeded_pod_connected():
    assert parse_outcome({"status": {"phase": "Succeeded"}}, "") == Outcome(finished=True, connected=True)


def test_agnhost_words_are_read_from_the_logs_last_line():
    outcome = parse_outcome(failed_pod(), "warming up\nTIMEOUT\n\n")
    assert outcome == Outcome(finished=True, kind="TIMEOUT", detail="exit 1: TIMEOUT")
    assert parse_outcome(failed_pod(), "DNS: lookup echo.x.svc: no such host").kind == "DNS"
    assert parse_outcome(failed_pod(), "REFUSED").kind == "REFUSED"
    assert parse_outcome(failed_pod(), "OTHER: dial tcp: connect: network is unreachable").kind == "OTHER"
    assert parse_outcome(failed_pod(2), "exec format error") == \
        Outcome(finished=True, kind="POD", detail="exit 2: exec format error")
    assert parse_outcome(failed_pod(), "").detail == "exit 1: no log"


def test_a_pod_that_never_ran_and_one_still_waiting():
    outcome = parse_outcome(failed_pod(None, reason="DeadlineExceeded", message="Pod was active too long"), "")
    assert outcome == Outcome(finished=True, kind="POD",
                              detail="pod failed: Failed: DeadlineExceeded: Pod was active too long")
    waiting = {"status": {"phase": "Pending", "containerStatuses": [
        {"state": {"waiting": {"reason": "ImagePullBackOff", "message": "Back-off pulling image"}}}]}}
    assert parse_outcome(waiting, "") == Outcome(finished=False,
                                                 detail="Pending: ImagePullBackOff: Back-off pulling image")
    unscheduled = {"status": {"phase": "Pending", "conditions": [
        {"type": "PodScheduled", "status": "False", "message": "node(s) had untolerated taint"}]}}
    assert parse_outcome(unscheduled, "").detail == "Pending: node(s) had untolerated taint"
    assert parse_outcome({}, "").detail == "Unknown"


def test_judging_what_each_check_expects():
    connected = Outcome(finished=True, connected=True)
    timeout = Outcome(finished=True, kind="TIMEOUT", detail="exit 1: TIMEOUT")
    dns = Outcome(finished=True, kind="DNS", detail="exit 1: DNS: no such host")
    assert judge(CONNECT, connected) == (Status.PASS, "")
    assert judge(CONNECT, timeout) == (Status.FAIL, "exit 1: TIMEOUT")
    assert judge(BLOCKED, timeout) == (Status.PASS, "blocked (TIMEOUT)")
    assert judge(BLOCKED, connected) == (Status.FAIL, "connected, though a policy should block it")
    # a failure that is no network refusal proves nothing about the policy
    assert judge(BLOCKED, dns) == (Status.FAIL, "not a network refusal: exit 1: DNS: no such host")


def test_cluster_text_is_cut_to_printable():
    assert printable("\x1b[31mred\x1b[0m\nnext") == "[31mred [0m next"
    assert len(printable("x" * 1000)) == 160
    outcome = parse_outcome(failed_pod(), "TIMEOUT\x1b]0;pwned\x07")
    assert "\x1b" not in outcome.detail and "\x07" not in outcome.detail


RESULTS = [CheckResult(CONNECT, Status.PASS, attempts=1, seconds=3.21),
           CheckResult(BLOCKED, Status.FAIL, "connected, though a policy should block it", attempts=3, seconds=20),
           CheckResult(Check("dns", "client@n1", "echo.ns.svc", skip="no kube-dns"), Status.SKIP, "no kube-dns")]


def test_the_table_has_a_row_per_check_with_its_reason_and_a_summary():
    lines = render_table(RESULTS).splitlines()
    assert lines[0].split() == ["CHECK", "FROM", "TO", "RESULT", "REASON"]
    assert lines[1].split() == ["pod-to-pod", "client@n1", "server-a@n1", "PASS"]
    assert lines[2].split()[:4] == ["policy/deny", "client@n1", "guarded@n2", "FAIL"]
    assert lines[2].endswith("connected, though a policy should block it")
    assert lines[3].split() == ["dns", "client@n1", "echo.ns.svc", "SKIP", "no", "kube-dns"]
    assert lines[-1] == "1 passed, 1 failed, 1 skipped"
    # the columns line up
    assert len({line.index("PASS") if "PASS" in line else line.index("FAIL") if "FAIL" in line
                else line.index("SKIP") if "SKIP" in line else line.index("RESULT") for line in lines[:4]}) == 1


def test_json_holds_every_check():
    data = json.loads(render_json(RESULTS, namespace="ns", nodes=["n1", "n2"], ignored=["n3: not Ready"]))
    assert (data["passed"], data["failed"], data["skipped"]) == (1, 1, 1)
    assert data["checks"][0] == {"check": "pod-to-pod", "from": "client@n1", "to": "server-a@n1",
                                 "target": "10.0.0.1:8080", "protocol": "tcp", "expect": "connect", "result": "PASS",
                                 "reason": "", "note": None, "attempts": 1, "seconds": 3.2}
    assert data["checks"][1]["expect"] == "blocked" and data["ignored_nodes"] == ["n3: not Ready"]

"""connectivity_test against a fake cluster: the whole run, its retries, and the namespace
removed at the end whatever happened (a FAIL, an error, Ctrl-C, SIGTERM)."""
from __future__ import annotations

import io
import json
import os
import signal

import pytest

from netagent.daemon import connectivity_plan as cp
from netagent.daemon.connectivity_test import ConnectivityTestError, Options, Runner, connectivity_test
from netagent.infra.flows import Flow, Verdict, render_json_lines
from tests.unit.daemon.connectivity_fake import FakeClock, FakeClusterApi, node

NODES = [node("node-1", "198.18.16.11"), node("node-2", "198.18.16.12")]
OPTIONS = Options(timeout=60.0, external="203.0.113.2:80")


def run(api: FakeClusterApi, *, options: Options = OPTIONS, as_json: bool = False) -> tuple[int, str, str]:
    out, log = io.StringIO(), io.StringIO()
    code = connectivity_test(api, options, as_json=as_json, out=out, clock=FakeClock(), log=log)
    return code, out.getvalue(), log.getvalue()


def assert_cleaned_up(api: FakeClusterApi) -> None:
    made = [name for kind, name in api.created if kind == "Namespace"]
    assert len(made) == 1 and made[0].startswith(cp.NAMESPACE_PREFIX)
    assert api.deleted_namespaces == made and not api.namespaces and not api.objects


def healthy(answers: dict | None = None, **kwargs) -> FakeClusterApi:
    """A cluster whose policy blocks the deny check's client (the fake enforces nothing itself)."""
    return FakeClusterApi(NODES, answers={"policy-deny": [("Failed", "TIMEOUT")], **(answers or {})}, **kwargs)


def test_every_check_passes_on_a_healthy_cluster():
    api = healthy()
    code, out, log = run(api, as_json=True)
    assert code == 0
    data = json.loads(out)
    assert [(c["check"], c["result"]) for c in data["checks"]] == [
        ("pod-to-pod", "PASS"), ("pod-to-pod/cross-node", "PASS"), ("pod-to-pod/udp", "PASS"),
        ("pod-to-clusterip", "PASS"), ("pod-to-nodeport", "PASS"), ("pod-to-nodeport/cross-node", "PASS"),
        ("dns", "PASS"), ("pod-to-host", "PASS"), ("pod-to-host/cross-node", "PASS"), ("egress/external", "PASS"),
        ("policy/deny", "PASS"), ("policy/allow", "PASS")]
    assert data["nodes"] == ["node-1", "node-2"] and data["namespace"].startswith(cp.NAMESPACE_PREFIX)
    assert f"namespace {data['namespace']} removed" in log
    assert_cleaned_up(api)


def test_a_cluster_that_enforces_no_policy_fails_the_deny_check():
    api = FakeClusterApi(NODES)          # every client connects, the deny check's too
    code, out, _ = run(api, as_json=True)
    assert code == 1
    deny = next(c for c in json.loads(out)["checks"] if c["check"] == "policy/deny")
    assert (deny["result"], deny["attempts"]) == ("FAIL", 3)
    assert deny["reason"] == "connected, though a policy should block it (3 attempts)"
    assert_cleaned_up(api)


def test_targets_are_filled_from_the_running_servers_and_clients_pinned():
    api = healthy()
    code, out, _ = run(api)
    assert code == 0, out
    clients = {p["metadata"]["name"]: p for p in api.pod_specs if p["spec"].get("restartPolicy") == "Never"}
    servers = {p["metadata"]["name"]: p["spec"]["nodeName"] for p in api.pod_specs if p["metadata"]["name"] not in clients}
    assert servers == {"server-a": "node-1", "server-b": "node-2", "guarded": "node-2"}
    args = {name: p["spec"]["containers"][0]["args"][1] for name, p in clients.items()}
    assert args["pod-to-pod-1"] == "10.244.0.10:8080"          # server-a's podIP, as the fake gave it
    assert args["pod-to-clusterip-1"] == "10.96.0.10:80"
    assert args["pod-to-nodeport-cross-node-1"] == "198.18.16.12:30080"
    assert args["egress-external-1"] == "203.0.113.2:80"
    assert {p["spec"]["nodeName"] for p in clients.values()} == {"node-1"}
    # the deny policy exists before any client, the allow policy only before the allow check's client
    order = [name for _, name in api.created]
    assert order.index(cp.DENY_POLICY) < order.index("pod-to-pod-1")
    assert order.index("policy-deny-1") < order.index(cp.ALLOW_POLICY) < order.index("policy-allow-1")
    assert out.splitlines()[-1] == "12 passed, 0 failed, 0 skipped"


def test_a_failing_check_is_retried_then_fails_with_its_reason_and_exit_1():
    api = healthy(answers={"pod-to-pod-cross-node": [("Failed", "TIMEOUT"), ("Failed", "OTHER: no route to host")]})
    code, out, _ = run(api, as_json=True)
    assert code == 1
    result = next(c for c in json.loads(out)["checks"] if c["check"] == "pod-to-pod/cross-node")
    assert result["result"] == "FAIL" and result["attempts"] == 3
    assert result["reason"] == "exit 1: OTHER: no route to host (3 attempts)"
    assert api.deleted_pods == ["pod-to-pod-cross-node-1", "pod-to-pod-cross-node-2"]
    assert_cleaned_up(api)


def test_a_policy_not_yet_programmed_passes_on_a_later_attempt():
    api = FakeClusterApi(NODES, answers={"policy-deny": [("Succeeded", ""), ("Failed", "TIMEOUT")]})
    code, out, _ = run(api, as_json=True)
    assert code == 0
    deny = next(c for c in json.loads(out)["checks"] if c["check"] == "policy/deny")
    assert (deny["result"], deny["reason"], deny["attempts"]) == ("PASS", "blocked (TIMEOUT)", 2)


def test_a_client_that_never_ends_fails_with_its_state_after_the_timeout():
    api = healthy(answers={"dns": [("Pending", "")]})
    code, out, _ = run(api, options=Options(timeout=20.0))
    assert code == 1
    row = next(line for line in out.splitlines() if line.startswith("dns "))
    assert "FAIL" in row and row.endswith("no answer in 20 s: Pending")


def test_one_node_and_no_dns_skip_with_their_reasons():
    api = FakeClusterApi(NODES[:1], dns=False, answers={"policy-deny": [("Failed", "REFUSED")]})
    code, out, _ = run(api, options=Options())
    assert code == 0
    rows = {line.split()[0]: line for line in out.splitlines()[1:-1]}
    for name in ("pod-to-pod/cross-node", "pod-to-nodeport/cross-node", "pod-to-host/cross-node"):
        assert "SKIP" in rows[name] and rows[name].endswith("one usable node: nothing to cross")
    assert rows["dns"].endswith("no kube-dns Service in kube-system: the cluster has no DNS to test")
    assert rows["egress/external"].endswith("no --external HOST:PORT given")
    assert not any(c.startswith("dns-") for _, c in api.created)


def test_servers_never_ready_is_an_error_and_the_namespace_still_goes():
    api = healthy(servers_ready=False)
    with pytest.raises(ConnectivityTestError, match="server pods to be Ready: server-a: Pending: ErrImagePull"):
        run(api, options=Options(timeout=10.0))
    assert_cleaned_up(api)


def test_no_usable_node_creates_nothing():
    api = FakeClusterApi([node("node-1", "198.18.16.11", ready=False)])
    with pytest.raises(cp.ConnectivityPlanError, match="node-1: not Ready"):
        run(api)
    assert api.created == []


def interrupt_at_list(count: int, fault):
    seen = []

    def on_list(api: FakeClusterApi) -> None:
        seen.append(1)
        if len(seen) == count:
            fault()
    return on_list


def raise_keyboard_interrupt() -> None:
    raise KeyboardInterrupt


@pytest.mark.parametrize("at", [1, 3])   # while the servers start, while the clients run
def test_ctrl_c_removes_the_namespace_and_exits_130(at):
    api = healthy(on_list=interrupt_at_list(at, raise_keyboard_interrupt))
    code, out, log = run(api)
    assert code == 130 and out == ""
    assert "interrupted; cleaned up" in log
    assert_cleaned_up(api)


def test_sigterm_removes_the_namespace_and_exits_143():
    api = healthy(on_list=interrupt_at_list(3, lambda: os.kill(os.getpid(), signal.SIGTERM)))
    before = signal.getsignal(signal.SIGTERM)
    code, _, log = run(api)
    assert code == 143 and "terminated; cleaned up" in log
    assert_cleaned_up(api)
    assert signal.getsignal(signal.SIGTERM) is before


def test_a_namespace_that_will_not_go_is_reported():
    api = healthy()
    api.delete_namespace = lambda name: api.deleted_namespaces.append(name)   # the delete is accepted, never done
    runner = Runner(api, Options(timeout=5.0), clock=FakeClock(), log=io.StringIO())
    with pytest.raises(ConnectivityTestError, match="still there after its deletion; remove it with `kubectl delete"):
        runner.run(runner.prepare())


def test_hostile_pod_ips_from_the_api_are_refused():
    api = healthy()
    real_status = api._status

    def hostile(pod):
        status = real_status(pod)
        if pod["metadata"]["name"] == "server-b":
            status["podIP"] = "10.0.0.1 --protocol=udp"
        return status
    api._status = hostile
    with pytest.raises(ConnectivityTestError, match="server-b: the API gave an invalid podIP"):
        run(api)
    assert_cleaned_up(api)


def test_the_command_line_refuses_bad_arguments_before_reaching_any_cluster(capsys, tmp_path):
    from netagent.cli import main
    missing = str(tmp_path / "nothing")
    assert main(["connectivity-test", "--kubeconfig", missing, "--external", "x;y:80"]) == 1
    assert "netagent connectivity-test: --external 'x;y:80': the host is neither" in capsys.readouterr().err
    assert main(["connectivity-test", "--kubeconfig", missing]) == 1
    assert "netagent connectivity-test:" in capsys.readouterr().err
    for bad in ("0", "soon", "99999"):
        with pytest.raises(SystemExit) as exit_:
            main(["connectivity-test", "--timeout", bad])
        assert exit_.value.code == 2


# ------------------------------------------------------------------ reasons from the flow records
def policy_drop(client: str, destination: str, namespace: str) -> str:
    return render_json_lines([Flow(time=1.0, verdict=Verdict.DROPPED, protocol="tcp", source=client,
                                   destination=destination, source_port=40000, destination_port=cp.HTTP_PORT,
                                   reason="policy", direction="ingress", pod=f"{namespace}/guarded",
                                   policies=(f"{namespace}/{cp.DENY_POLICY}",))])


class FlowsAfterTheChecks(FakeClusterApi):
    """Agents whose flow records hold the drops of the client pods named by `dropped` to the
    guarded server, on node-2, among lines that do not parse."""

    def __init__(self, *args, dropped: tuple[str, ...] = ("policy-deny-1",), **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.dropped = dropped

    def agent_flows(self, node: str, namespace: str) -> str:
        guarded = next(p["status"]["podIP"] for p in self.pods(namespace) if p["metadata"]["name"] == "guarded")
        drops = [policy_drop(self.client_ip(pod), guarded, namespace) for pod in self.dropped]
        self.flows = {"node-1": "garbage\n", "node-2": "\n".join(["{bad", *drops, "[]"])}
        return super().agent_flows(node, namespace)


def test_the_expected_block_names_the_deny_policy_from_the_flows():
    api = FlowsAfterTheChecks(NODES, answers={"policy-deny": [("Failed", "TIMEOUT")]})
    code, out, log = run(api, as_json=True)
    assert code == 0
    reasons = {c["check"]: c["reason"] for c in json.loads(out)["checks"]}
    ns = json.loads(out)["namespace"]
    assert reasons["policy/deny"] == \
        f"blocked (TIMEOUT): dropped by policy {ns}/{cp.DENY_POLICY} (ingress of {ns}/guarded) on node-2"
    assert reasons["policy/allow"] == "" and "flow records not read" not in log
    assert sorted(api.flow_calls) == [("node-1", ns), ("node-2", ns)]   # once a node, after the checks
    assert_cleaned_up(api)


def test_a_failure_gets_the_drop_of_its_own_client_only():
    api = FlowsAfterTheChecks(NODES, dropped=("policy-allow-3",),
                              answers={"policy-deny": [("Failed", "TIMEOUT")], "policy-allow": [("Failed", "TIMEOUT")]})
    code, out, _ = run(api, as_json=True)
    assert code == 1
    reasons = {c["check"]: c["reason"] for c in json.loads(out)["checks"]}
    ns = json.loads(out)["namespace"]
    assert reasons["policy/allow"] == (f"exit 1: TIMEOUT (3 attempts): dropped by policy {ns}/{cp.DENY_POLICY} "
                                       f"(ingress of {ns}/guarded) on node-2")
    assert reasons["policy/deny"] == "blocked (TIMEOUT)"     # its client's flows are not there


def test_unreadable_flow_records_are_said_once_and_change_no_result():
    api = healthy(answers={"pod-to-pod": [("Failed", "REFUSED")]})     # no agent pods at all
    code, out, log = run(api, as_json=True)
    reasons = {c["check"]: (c["result"], c["reason"]) for c in json.loads(out)["checks"]}
    assert code == 1 and reasons["pod-to-pod"] == ("FAIL", "exit 1: REFUSED (3 attempts)")
    assert reasons["policy/deny"] == ("PASS", "blocked (TIMEOUT)")
    assert log.count("flow records not read") == 1 and "node-1: no running agent pod" in log


def test_the_agent_of_each_planned_node_is_asked_once_also_on_one_node():
    api = FakeClusterApi(NODES[:1], answers={"policy-deny": [("Failed", "DNS: no such host")]})   # a FAIL
    code, out, _ = run(api, as_json=True)
    assert code == 1 and api.flow_calls == [("node-1", json.loads(out)["namespace"])]

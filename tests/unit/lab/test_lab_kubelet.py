"""The lab's kubelet stand-in on fakes: what it refuses to run, the Pod status it reports at each
step (Pending -> Running -> Ready -> Succeeded/Failed, restarts, deadlines), its teardown on
deletion, and the API server's `pods/NAME/log` finding the node's kubelet."""
from __future__ import annotations

import pytest

from lab import kubelet_status, pod_objects
from lab.apiserver import ApiServer
from lab.apiserver.errors import ApiError
from lab.apiserver.pod_logs import kubelet_url, log_target
from lab.kubelet import sandbox_name, tail_lines
from lab.kubelet_pod import KILLED, Phase, PodWorker
from lab.kubelet_status import Container, Refused, container_of
from lab.node_objects import KUBELET_PORT, render_node
from netagent.daemon.connectivity_plan import DEFAULT_IMAGE, Node, plan_checks
from netagent.daemon.connectivity_report import Status, judge, parse_outcome
from netagent.kube.resources import NODES, PODS


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


class FakeProcess:
    def __init__(self, *, ignores_term: bool = False) -> None:
        self.code: int | None = None
        self.ignores_term = ignores_term
        self.signals: list[str] = []

    def poll(self) -> int | None:
        return self.code

    def terminate(self) -> None:
        self.signals.append("TERM")
        if not self.ignores_term:
            self.code = -15

    def kill(self) -> None:
        self.signals.append("KILL")
        self.code = -9


class FakeRuntime:
    def __init__(self) -> None:
        self.add_failures: list[Exception] = []
        self.networks: list[str] = []
        self.events: list[str] = []
        self.processes: list[FakeProcess] = []
        self.listening = False
        self.ignores_term = False

    def add_network(self, pod: dict) -> list[str]:
        if self.add_failures:
            raise self.add_failures.pop(0)
        self.networks.append(pod["metadata"]["name"])
        self.events.append("ADD")
        return ["10.244.1.7", "fd00:10:244:1::7"]

    def del_network(self, pod: dict) -> None:
        self.networks.remove(pod["metadata"]["name"])
        self.events.append("DEL")

    def start(self, pod: dict, container: Container, *, restarts: int) -> FakeProcess:
        self.events.append(f"start {' '.join(container.args)} as {container.uid}")
        self.processes.append(FakeProcess(ignores_term=self.ignores_term))
        return self.processes[-1]

    def probe(self, address: str, port: int) -> bool:
        return self.listening


class FakeApi:
    def __init__(self) -> None:
        self.status: dict = {}
        self.patches: list[dict] = []
        self.deleted: list[str] = []

    def patch_status(self, namespace: str, name: str, patch: dict) -> None:
        self.patches.append(patch)
        self.status = {**self.status, **patch["status"]}

    def delete_pod(self, namespace: str, name: str) -> None:
        self.deleted.append(f"{namespace}/{name}")

    def conditions(self) -> dict:
        return {c["type"]: c["status"] for c in self.status.get("conditions", [])}


def pod(name: str = "client", *, args=("connect", "10.244.2.2:8080"), image: str = DEFAULT_IMAGE,
        restart: str = "Never", probe: dict | None = None, **spec) -> dict:
    container: dict = {"name": "main", "image": image, "args": list(args),
                       "securityContext": {"runAsNonRoot": True, "runAsUser": 65534}}
    if probe:
        container["readinessProbe"] = probe
    return {"metadata": {"name": name, "namespace": "ct", "uid": "1234-abcd"},
            "spec": {"nodeName": "node-1", "restartPolicy": restart, "containers": [container], **spec}}


def worker(obj: dict) -> tuple[PodWorker, FakeRuntime, FakeApi, FakeClock]:
    runtime, api, clock = FakeRuntime(), FakeApi(), FakeClock()
    return PodWorker(obj, runtime=runtime, api=api, host_ip="198.18.0.11", clock=clock), runtime, api, clock


def test_a_client_goes_pending_running_then_succeeded_by_its_exit_code():
    w, runtime, api, clock = worker(pod())
    w.step()
    assert api.status["phase"] == "Pending" and "podIP" not in api.status
    assert api.status["containerStatuses"][0]["state"] == {"waiting": {"reason": "ContainerCreating"}}
    w.step()
    assert runtime.events == ["ADD", "start connect 10.244.2.2:8080 as 65534"]
    assert api.status["phase"] == "Running"
    assert (api.status["podIP"], api.status["podIPs"]) == ("10.244.1.7", [{"ip": "10.244.1.7"},
                                                                          {"ip": "fd00:10:244:1::7"}])
    assert api.status["hostIP"] == "198.18.0.11" and api.conditions()["Ready"] == "True"   # no probe
    w.step()
    assert len(api.patches) == 2, "nothing changed: nothing reported"
    runtime.processes[0].code = 0
    w.step()
    assert api.status["phase"] == "Succeeded" and api.conditions()["Ready"] == "False"
    assert api.status["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 0
    assert parse_outcome({"status": api.status}, "").connected
    assert w.phase is Phase.ENDED and runtime.networks == ["client"], "the sandbox stays until the Pod goes"


def test_a_failed_connect_is_failed_with_its_exit_code_and_read_as_agnhost_says():
    w, runtime, api, _ = worker(pod())
    w.step(), w.step()
    runtime.processes[0].code = 1
    w.step()
    assert api.status["phase"] == "Failed"
    assert api.status["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 1
    outcome = parse_outcome({"status": api.status}, "TIMEOUT: dial tcp 10.244.2.2:8080: i/o timeout\n")
    assert (outcome.finished, outcome.kind) == (True, "TIMEOUT")


def test_a_server_is_ready_only_once_its_probe_connects():
    w, runtime, api, _ = worker(pod("server", args=("netexec", "--http-port=8080"), restart="Always",
                                    probe={"tcpSocket": {"port": 8080}, "periodSeconds": 1}))
    w.step(), w.step()
    assert api.status["phase"] == "Running" and api.conditions()["Ready"] == "False"
    w.step()
    assert api.conditions()["Ready"] == "False"
    runtime.listening = True
    w.step()
    assert api.conditions() == {"PodScheduled": "True", "Initialized": "True", "ContainersReady": "True",
                                "Ready": "True"}
    assert api.status["containerStatuses"][0]["ready"] is True


def test_restart_always_starts_it_again_after_a_backoff_and_counts():
    w, runtime, api, clock = worker(pod("server", args=("netexec",), restart="Always"))
    w.step(), w.step()
    runtime.processes[0].code = 2
    w.step()
    assert api.status["phase"] == "Running" and api.status["containerStatuses"][0]["restartCount"] == 1
    w.step()
    assert len(runtime.processes) == 1, "started again before its backoff"
    clock.now += 1.0
    w.step()
    assert len(runtime.processes) == 2 and runtime.events.count("ADD") == 1, "the sandbox is kept"


def test_a_failing_add_is_retried_and_reported_once_per_distinct_error():
    w, runtime, api, clock = worker(pod())
    runtime.add_failures = [OSError("no network config yet"), OSError("no network config yet")]
    w.step(), w.step()
    assert api.status["phase"] == "Pending"
    assert "no network config yet" in api.status["containerStatuses"][0]["state"]["waiting"]["message"]
    patches = len(api.patches)
    clock.now += 1.0
    w.step()
    assert len(api.patches) == patches
    clock.now += 1.0
    w.step()
    assert api.status["phase"] == "Running"


def test_the_active_deadline_ends_it_as_deadline_exceeded():
    w, runtime, api, clock = worker(pod(activeDeadlineSeconds=300))
    w.step(), w.step()
    clock.now += 301
    w.step()
    assert (api.status["phase"], api.status["reason"]) == ("Failed", "DeadlineExceeded")
    assert runtime.processes[0].signals == ["KILL"]
    assert api.status["containerStatuses"][0]["state"]["terminated"]["exitCode"] == KILLED


@pytest.mark.parametrize("change, message", [
    ({"image": "docker.io/library/nginx:1.27"}, "only agnhost images"),
    ({"command": ["/bin/sh", "-c", "id"]}, "only agnhost's own command"),
    ({"readinessProbe": {"httpGet": {"port": 8080}}}, "tcpSocket probe"),
    ({"securityContext": {"runAsNonRoot": True}}, "runAsNonRoot without a non-zero runAsUser"),
    ({"args": ["x\0y"]}, "without NUL"),
])
def test_what_it_cannot_run_is_failed_with_why_and_never_started(change, message):
    obj = pod()
    obj["spec"]["containers"][0].update(change)
    w, runtime, api, _ = worker(obj)
    w.step()
    assert api.status["phase"] == "Failed" and message in api.status["message"]
    assert api.status["reason"] == "UnsupportedByLabKubelet" and runtime.events == []
    outcome = parse_outcome({"status": api.status}, "")
    assert outcome.kind == "POD" and message in outcome.detail
    plan = plan_checks([Node("node-1", "198.18.0.11", KUBELET_PORT)], namespace="ct")
    check = next(c for c in plan.checks if c.name == "policy/deny")
    assert judge(check, outcome)[0] is Status.FAIL, "a pod that never ran proves no policy"


def test_two_containers_or_init_containers_are_refused():
    obj = pod()
    obj["spec"]["containers"].append(dict(obj["spec"]["containers"][0], name="second"))
    with pytest.raises(Refused, match="exactly one container"):
        container_of(obj)
    assert container_of(pod(image="registry.k8s.io/e2e-test-images/agnhost:2.55")).args == ("connect",
                                                                                          "10.244.2.2:8080")


def test_a_deletion_kills_it_then_deletes_its_sandbox_and_a_graceful_one_the_pod():
    w, runtime, api, clock = worker(pod("server", args=("netexec",), restart="Always"))
    w.step(), w.step()
    runtime.processes[0].ignores_term = True
    w.deleted(graceful=True, grace=1.0)
    start = clock.now
    w.step()
    assert runtime.processes[0].signals == ["TERM", "KILL"] and clock.now - start >= 1.0
    assert runtime.events[-1] == "DEL" and runtime.networks == []
    assert api.deleted == ["ct/server"] and w.phase is Phase.GONE
    w2, runtime2, api2, _ = worker(pod())
    w2.step(), w2.step()
    w2.deleted(graceful=False)
    w2.step()
    assert runtime2.processes[0].signals == ["TERM"] and runtime2.networks == [] and api2.deleted == []


def test_a_pod_deleted_before_its_sandbox_is_never_wired():
    w, runtime, api, _ = worker(pod())
    w.step()
    w.deleted(graceful=False)
    w.step()
    assert runtime.events == [] and w.phase is Phase.GONE


def test_the_stand_in_names_and_the_log_tail():
    assert sandbox_name("na-tc-1a2b3c", "0F3C-ab12-Ff") == "na-tc-1a2b3c-k-0f3cab12ff"
    assert tail_lines(b"a\nb\nc\n", 2) == b"b\nc\n" and tail_lines(b"a\n", None) == b"a\n"
    assert tail_lines(b"a\n", 0) == b""


def test_the_api_server_reads_a_pods_log_from_its_nodes_kubelet():
    server = ApiServer()
    server.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "ct"}})
    assert log_target("/api/v1/namespaces/ct/pods/client-1/log") == ("ct", "client-1")
    assert log_target("/api/v1/namespaces/ct/pods/client-1/status") is None
    server.create(render_node("node-1", segment=1, pod_cidr="10.244.1.0/24", address="198.18.0.11"))
    obj = pod("client-1")
    del obj["metadata"]["uid"]
    server.create({"apiVersion": "v1", "kind": "Pod", **obj})
    url = kubelet_url(server.store, "ct", "client-1", {"tailLines": "20"})
    assert url == f"http://198.18.0.11:{KUBELET_PORT}/containerLogs/ct/client-1/main?tailLines=20"
    for query, message in (({"container": "other"}, "is not valid for pod"),
                           ({"tailLines": "-1"}, "expected a whole number")):
        with pytest.raises(ApiError, match=message):
            kubelet_url(server.store, "ct", "client-1", query)
    unscheduled = pod("pending")
    del unscheduled["metadata"]["uid"], unscheduled["spec"]["nodeName"]
    server.create({"apiVersion": "v1", "kind": "Pod", **unscheduled})
    with pytest.raises(ApiError, match="does not have a host assigned"):
        kubelet_url(server.store, "ct", "pending", {})
    with pytest.raises(ApiError) as missing:
        kubelet_url(server.store, "ct", "nobody", {})
    assert missing.value.code == 404
    assert server.store.find(NODES, "node-1", namespace=None)["status"]["daemonEndpoints"] == {
        "kubeletEndpoint": {"Port": KUBELET_PORT}}
    assert server.store.find(PODS, "client-1", namespace="ct") is not None


def test_status_patches_are_what_the_connectivity_test_reads():
    container = container_of(pod())
    running = kubelet_status.running(container, pod_ips=["10.244.1.7"], host_ip="198.18.0.11", container_id="x",
                                     ready=True, started_at="2026-01-01T00:00:00Z")
    assert parse_outcome(running, "").finished is False
    pending = kubelet_status.pending(container, message="ADD failed")
    assert "ContainerCreating: ADD failed" in parse_outcome(pending, "").detail


def test_it_leaves_the_labs_own_pods_and_imageless_objects_alone():
    assert kubelet_status.ours(pod())
    assert not kubelet_status.ours(pod(image=pod_objects.CONTAINER_IMAGE))   # lab_pods.py runs it
    imageless = pod()
    del imageless["spec"]["containers"][0]["image"]
    assert not kubelet_status.ours(imageless) and not kubelet_status.ours({"spec": {}})
    assert kubelet_status.ours(pod(image="nginx:1.27")), "not agnhost: it is ours to refuse"

"""A new pod has its network when its CNI ADD returns, with NetworkPolicy on (issue 23).

A 2-node lab (`--network-policy`) whose kubelet reports a pod's address 5 s after its ADD
(`lab up --pod-status-delay 5`): the agent must program the pod inside the ADD, from the Pod
it has cached and the address the ADD chose. "At once" is judged by counters, never by time:
the first ICMP echo answered (`ping -c 1`), no SYN retransmitted in the new pod, the agent's
`netagent_policy_pods_closed_after_add_total` unchanged and its
`netagent_policy_pod_programming_seconds_count` grown by the pods added.

Pods: `peer` (app=peer) and `other` (app=other) on node-2, serving TCP 80; the Service `web`
selects `peer`. New pods are added on node-1, so their egress is enforced by node-1's agent.
"""
from __future__ import annotations

import json
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from lab.cluster import LabCluster
from lab.node import raise_for_failure
from lab.state import PodState
from netagent.kernel import namespaces
from tests.cluster.lab_tools import PREFIX, Background, syn_retransmits, wait_for
from tests.conftest import require_root_netns
from tests.netns.policy_lab import PROBE, SERVER

STATUS_DELAY = 5.0
ANSWER_SECONDS = 10.0        # how long an answer expected at once may take on a loaded machine
REFUSED_WINDOW = 1.0         # a connection expected refused must stay unanswered this long
SETUP = """\
apiVersion: v1
kind: Namespace
metadata: {name: x, labels: {team: red}}
---
apiVersion: v1
kind: Service
metadata: {name: web, namespace: x}
spec:
  selector: {app: peer}
  ports: [{port: 80, targetPort: 80}]
"""


def egress_only_to(app: str, selected: str) -> dict:
    return {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
            "metadata": {"name": f"{selected}-to-{app}", "namespace": "x"},
            "spec": {"podSelector": {"matchLabels": {"app": selected}}, "policyTypes": ["Egress"],
                     "egress": [{"to": [{"podSelector": {"matchLabels": {"app": app}}}]}]}}


@pytest.fixture(scope="module", autouse=True)
def _no_leaks_per_module():
    require_root_netns()
    yield


@pytest.fixture(scope="module")
def lab():
    lab = LabCluster.create(prefix=PREFIX, nodes=2, network_policy=True, pod_status_delay=STATUS_DELAY)
    prefix, servers = lab.state.prefix, []
    try:
        _apply(lab, SETUP)
        for name in ("peer", "other"):
            lab.add_pod(name, node="node-2", namespace="x", labels={"app": name})
            servers.append(Background(lab.netns_of(name), [sys.executable, "-c", SERVER, "80"], ready_line="ready"))
        wait_for(lambda: lab.pod_object("peer")["status"].get("podIP"), what="peer's status")
        wait_for(lambda: probe(lab, "other", {"svc": (service_ip(lab), 80)})["svc"], what="the Service")
        yield lab
    finally:
        for server in servers:
            server.stop()
        lab.down()
    left = [n for n in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split()
            if n.startswith(prefix)]
    assert not left, f"namespaces leaked: {left}"


def _apply(lab: LabCluster, text: str) -> None:
    done = subprocess.run([sys.executable, "-m", "netagent.cli", "lab", "--state-dir", lab.workdir,
                           "apply", "-f", "-"], input=text, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr


def service_ip(lab: LabCluster) -> str:
    return lab.api().get("v1", "Service", "web", namespace="x")["spec"]["clusterIP"]


def probe(lab: LabCluster, source: str, targets: dict, *, window: float = REFUSED_WINDOW,
          patience: float = ANSWER_SECONDS, netns: str | None = None) -> dict:
    jobs = [[ident, ip, "tcp", port, True] for ident, (ip, port) in targets.items()]
    done = subprocess.run([*namespaces.exec_prefix(netns or lab.netns_of(source)), sys.executable, "-c", PROBE,
                           json.dumps(jobs), str(window), str(patience)],
                          capture_output=True, text=True, timeout=60, check=True)
    return json.loads(done.stdout)


def first_echo_answered(netns: str, address: str) -> bool:
    """One echo request, never repeated: answered means the very first packet went through."""
    return subprocess.run([*namespaces.exec_prefix(netns), "ping", "-n", "-c", "1", "-W", str(int(ANSWER_SECONDS)),
                           address], capture_output=True, timeout=60).returncode == 0


def agent_metrics(lab: LabCluster, node: str = "node-1") -> dict[str, float]:
    scrape = "import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:10249/metrics').read().decode())"
    text = lab.exec(node, [sys.executable, "-c", scrape], timeout=30).stdout
    found = {}
    for line in text.splitlines():
        if line.startswith(("netagent_policy_pod_programming_seconds_count",
                            "netagent_policy_pods_closed_after_add_total")):
            name, value = line.rsplit(" ", 1)
            found[name] = float(value)
    return found


def metrics_once(lab: LabCluster, done) -> dict[str, float]:
    """The agent's metrics once `done(metrics)` holds: /metrics is a snapshot refreshed at most
    once a second, so a scrape right after a change may predate it."""
    return wait_for(lambda: (lambda m: m if done(m) else None)(agent_metrics(lab)), what="the agent's metrics")


def closed_total(metrics: dict[str, float]) -> float:
    return sum(v for k, v in metrics.items() if k.startswith("netagent_policy_pods_closed_after_add_total"))


def programmed_total(metrics: dict[str, float]) -> float:
    return metrics.get("netagent_policy_pod_programming_seconds_count", 0.0)


def add_and_probe_at_once(lab: LabCluster, name: str, targets: dict) -> tuple[dict, bool, bool]:
    """Add `name` on node-1, then at once: (TCP answers, whether the first echo to the peer was
    answered, whether the address was still unreported when probed)."""
    lab.add_pod(name, node="node-1", namespace="x", labels={"app": name})
    unreported = not lab.pod_object(name)["status"].get("podIP")
    echo = first_echo_answered(lab.netns_of(name), lab.state.pods["peer"].ip)
    answers = probe(lab, name, targets)
    return answers, echo, unreported


def test_a_new_pod_reaches_a_peer_and_a_service_as_its_add_returns(lab):
    before = agent_metrics(lab)
    targets = {"peer": (lab.state.pods["peer"].ip, 80), "svc": (service_ip(lab), 80)}
    answers, echo, unreported = add_and_probe_at_once(lab, "fresh", targets)
    assert unreported, "the lab reported the address early: the test proves nothing"
    assert answers == {"peer": True, "svc": True} and echo
    assert syn_retransmits(namespaces.exec_prefix(lab.netns_of("fresh"))) == 0
    after = metrics_once(lab, lambda m: programmed_total(m) >= programmed_total(before) + 1)
    assert closed_total(after) == closed_total(before)


def test_a_policy_selecting_the_new_pod_is_in_force_from_its_first_packet(lab):
    _apply(lab, json.dumps(egress_only_to("peer", "allowed")))
    _apply(lab, json.dumps(egress_only_to("other", "denied")))
    before = agent_metrics(lab)
    peer, other = {"peer": (lab.state.pods["peer"].ip, 80)}, {"other": (lab.state.pods["other"].ip, 80)}
    answers, echo, _ = add_and_probe_at_once(lab, "allowed", peer)
    assert answers == {"peer": True} and echo
    assert syn_retransmits(namespaces.exec_prefix(lab.netns_of("allowed"))) == 0
    assert probe(lab, "allowed", other, patience=REFUSED_WINDOW) == {"other": False}
    # the other way round: refused by its policy (not closed: what the policy allows passes at once)
    lab.add_pod("denied", node="node-1", namespace="x", labels={"app": "denied"})
    assert probe(lab, "denied", other) == {"other": True}
    assert syn_retransmits(namespaces.exec_prefix(lab.netns_of("denied"))) == 0
    assert probe(lab, "denied", peer, patience=REFUSED_WINDOW) == {"peer": False}
    assert not first_echo_answered(lab.netns_of("denied"), lab.state.pods["peer"].ip)
    after = metrics_once(lab, lambda m: programmed_total(m) >= programmed_total(before) + 2)
    assert closed_total(after) == closed_total(before)


def test_an_add_before_its_pod_object_waits_then_returns_closed_then_opens_when_it_appears(lab):
    before = agent_metrics(lab)
    lab.add_pod("unseen", node="node-1", namespace="x", labels={"app": "unseen"}, scheduled=False)
    peer = {"peer": (lab.state.pods["peer"].ip, 80)}
    assert probe(lab, "unseen", peer, patience=REFUSED_WINDOW) == {"peer": False}   # closed, as before
    missed = 'netagent_policy_pods_closed_after_add_total{reason="pod-not-in-cache"}'
    metrics_once(lab, lambda m: m.get(missed, 0) == before.get(missed, 0) + 1)
    lab.create_pod_object("unseen")              # scheduled, no address: the binding programs it
    wait_for(lambda: probe(lab, "unseen", peer)["peer"], what="the pod programmed once its Pod appeared")
    assert not lab.pod_object("unseen")["status"].get("podIP")
    lab.remove_pod("unseen")


def test_fifty_concurrent_adds_every_pod_reachable_as_its_add_returns(lab):
    """The runtime's burst: 50 sandboxes ADDed at once on node-1, each probing the peer with
    one echo as soon as its own ADD returns."""
    before = agent_metrics(lab)
    pods = [PodState(name=f"burst-{i}", node="node-1", netns=f"{lab.state.prefix}-p-burst-{i}"[:60],
                     container_id=f"{lab.state.prefix}-burst-{i}", ip="", labels={"app": "burst"}, namespace="x")
            for i in range(50)]
    for pod in pods:          # the scheduler's part, before the kubelet starts the sandboxes
        lab.state.pods[pod.name] = pod
        lab.create_pod_object(pod.name)
        namespaces.create(pod.netns)
    peer = lab.state.pods["peer"].ip
    failures: list[str] = []
    lock = threading.Lock()

    def sandbox(pod: PodState) -> None:
        code, out = lab._exec_plugin(pod, "ADD")
        raise_for_failure(code, out, "ADD")
        with lock:
            pod.ip = out["ips"][0]["address"].split("/")[0]
        if not first_echo_answered(pod.netns, peer):
            with lock:
                failures.append(pod.name)
    try:
        with ThreadPoolExecutor(max_workers=50) as pool:
            list(pool.map(sandbox, pods))
        assert not failures, f"not reachable as their ADD returned: {sorted(failures)}"
        after = metrics_once(lab, lambda m: programmed_total(m) >= programmed_total(before) + 50)
        assert closed_total(after) == closed_total(before)
    finally:
        for pod in pods:
            lab.finish_pod_removal(pod.name)

"""NetworkPolicy across nodes: real agents (`lab up --network-policy`), the lab's API server,
pods on two nodes, policies and labelled namespaces applied with `lab apply -f`. The Service
check runs again on a second lab in eBPF proxy mode (socket load balancer and tc path).

Pods: x-a (node-1) and x-b (node-2) in namespace x (team=red); y-b (node-1) and y-c (node-2)
in namespace y (team=blue). Every pod serves TCP 80 (policy_lab's server). Each check probes
every pair at once and waits (bounded) for the whole matrix to match: the agents program
asynchronously, so a change is judged by when the kernel enforces it, not by one probe.
Cross-node traffic arrives routed through the overlay into the node's bridge, the path the
routed-ingress hook covers; same-node traffic is bridged.
"""
from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import time

import pytest

from lab.cluster import LabCluster
from lab.state import LabError
from netagent.kernel import namespaces
from tests.cluster.lab_tools import CONVERGE_SECONDS, PREFIX, ROOT, Background, serve, wait_for
from tests.conftest import require_root_netns
from tests.netns.policy_lab import PROBE, SERVER

# a probe that must be answered once (not retried until a matrix converges) gets this long: a
# connection is judged closed when unanswered, and a loaded machine can stall the prober a second
ANSWER_SECONDS = 5.0
PODS = {"x-a": ("x", "node-1", "app=a,role=web"), "x-b": ("x", "node-2", "app=b,role=web"),
        "y-b": ("y", "node-1", "app=b"), "y-c": ("y", "node-2", "app=c")}
NAMESPACES = """\
apiVersion: v1
kind: Namespace
metadata: {name: x, labels: {team: red}}
---
apiVersion: v1
kind: Namespace
metadata: {name: y, labels: {team: blue}}
---
apiVersion: v1
kind: Service
metadata: {name: web, namespace: x}
spec:
  selector: {role: web}
  ports: [{port: 80, targetPort: 8080}]
"""
FROM_BLUE_B = """\
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: from-blue-b, namespace: x}
spec:
  podSelector: {}
  ingress:
  - from:
    - namespaceSelector: {matchLabels: {team: blue}}
      podSelector: {matchLabels: {app: b}}
"""
LOCK_B = """\
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: from-blue-b, namespace: x}
spec:
  podSelector: {matchLabels: {app: a}}
  ingress:
  - {}
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: lock-b, namespace: x}
spec:
  podSelector: {matchLabels: {app: b}}
  policyTypes: [Ingress]
"""


def lab_cli(lab: LabCluster, *args: str, stdin: str | None = None) -> str:
    done = subprocess.run([sys.executable, "-m", "netagent.cli", "lab", "--state-dir", lab.workdir, *args],
                          capture_output=True, text=True, cwd=ROOT, input=stdin, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


@pytest.fixture(scope="module", autouse=True)
def _no_leaks_per_module():
    """Replaces cluster/conftest.py's check of every `na-tc` namespace on the machine (other
    suites running at the same time have theirs): the lab fixture checks its own."""
    require_root_netns()
    yield


@contextlib.contextmanager
def policy_lab(proxy_mode: str, pods: dict):
    """A 2-node lab enforcing policies with `proxy_mode`: the namespaces and the Service `web`
    applied, `pods` added through the CLI, each serving TCP 80 (x pods also 8080, named)."""
    lab = LabCluster.create(prefix=PREFIX, nodes=2, network_policy=True, proxy_mode=proxy_mode)
    prefix = lab.state.prefix
    servers: list[Background] = []
    try:
        lab_cli(lab, "apply", "-f", "-", stdin=NAMESPACES)
        for name, (namespace, node, labels) in pods.items():   # the CLI, as a user sets a scenario up
            lab_cli(lab, "pod", "add", name, "--namespace", namespace, "--node", node, "--labels", labels)
        lab = LabCluster.load(lab.workdir)
        for name in pods:
            servers.append(Background(lab.netns_of(name), [sys.executable, "-c", SERVER, "80"], ready_line="ready"))
            if name.startswith("x-"):
                servers.append(serve(lab, name, "tcp", 8080, lifetime=600, named=True))
        yield lab
    finally:
        for server in servers:
            server.stop()
        try:
            lab.state = LabCluster.load(lab.workdir).state
        except LabError:
            pass
        lab.down()
    left = [name for name in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split()
            if name.startswith(prefix)]
    assert not left, f"namespaces leaked: {left}"


@pytest.fixture(scope="module", params=["iptables", "nftables"])
def lab(request):
    """The policy dataplane follows the proxy mode: iptables chains and ipsets, or (nftables)
    the nft policy table, where no iptables rule of ours may exist on any node."""
    with policy_lab(request.param, PODS) as lab:
        yield lab


def probe(lab: LabCluster, source: str, targets: list[tuple[str, str, int]], timeout: float = 1.0, *,
          socket_lb: bool = False) -> dict:
    """Connect from `source` to each target at once. `socket_lb`: run in the node's cgroup (in
    eBPF mode the socket load balancer rewrites connect()); else outside it (the tc path)."""
    jobs = [[ident, address, "tcp", port] for ident, address, port in targets]
    prefix = lab.exec_prefix(source) if socket_lb else namespaces.exec_prefix(lab.netns_of(source))
    done = subprocess.run([*prefix, sys.executable, "-c", PROBE,
                           json.dumps(jobs), str(timeout)], capture_output=True, text=True, timeout=30, check=True)
    return json.loads(done.stdout)


def matrix(lab: LabCluster) -> dict[tuple[str, str], bool]:
    ip = {name: lab.state.pods[name].ip for name in PODS}
    cells = {}
    for source in PODS:
        answers = probe(lab, source, [(target, ip[target], 80) for target in PODS if target != source])
        cells.update({(source, target): reachable for target, reachable in answers.items()})
    return cells


def becomes(lab: LabCluster, expected: dict[tuple[str, str], bool], *, timeout: float = CONVERGE_SECONDS) -> None:
    deadline = time.monotonic() + timeout
    while True:
        seen = matrix(lab)
        if seen == expected:
            return
        if time.monotonic() > deadline:
            rows = [f"{s:>4} -> {t:<4} expected {'open' if expected[(s, t)] else 'closed'}, saw "
                    f"{'open' if seen[(s, t)] else 'closed'}" for s, t in sorted(seen) if seen[(s, t)] != expected[(s, t)]]
            raise AssertionError("matrix did not converge:\n" + "\n".join(rows))


def expect(closed_to: tuple[str, ...] = (), allowed: tuple[tuple[str, str], ...] = ()) -> dict:
    return {(s, t): t not in closed_to or (s, t) in allowed for s in PODS for t in PODS if s != t}


def relabel(lab: LabCluster, name: str, labels: dict) -> None:
    api = lab.api()
    obj = api.get("v1", "Pod", name, namespace=PODS[name][0])
    obj["metadata"]["labels"] = labels
    api.replace(obj)


def denied_to_x_b(lab: LabCluster) -> float:
    """x-b's ingress drops as node-2's agent reports them (from its kernel counters)."""
    scrape = "import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:10249/metrics').read().decode())"
    metrics = lab.exec("node-2", [sys.executable, "-c", scrape], timeout=30).stdout
    denied = [line for line in metrics.splitlines()
              if line.startswith('netagent_policy_denied_packets{pod="x/x-b",direction="ingress"}')]
    assert denied, metrics
    return float(denied[0].split()[-1])


def test_policies_across_nodes_relabelling_services_and_deletion(lab):
    becomes(lab, expect())                                     # no policy: all open
    lab_cli(lab, "apply", "-f", "-", stdin=FROM_BLUE_B)
    # x is closed except to app=b pods of blue namespaces: y-b (same node as x-a, other node than x-b)
    becomes(lab, expect(closed_to=("x-a", "x-b"), allowed=(("y-b", "x-a"), ("y-b", "x-b"))))
    # a pod added while the policy is in force, on the node where no blue b pod lives, is isolated
    lab_cli(lab, "pod", "add", "x-new", "--namespace", "x", "--node", "node-2", "--labels", "app=c")
    lab.state = LabCluster.load(lab.workdir).state
    with Background(lab.netns_of("x-new"), [sys.executable, "-c", SERVER, "80"], ready_line="ready"):
        address = lab.state.pods["x-new"].ip
        deadline = time.monotonic() + CONVERGE_SECONDS
        while not (probe(lab, "y-b", [("new", address, 80)])["new"]
                   and not probe(lab, "y-c", [("new", address, 80)])["new"]):
            assert time.monotonic() < deadline, "the new pod did not get the policy in force"
    lab.remove_pod("x-new")
    relabel(lab, "y-c", {"app": "b"})                          # on node-2: one set member on each node
    becomes(lab, expect(closed_to=("x-a", "x-b"), allowed=(("y-b", "x-a"), ("y-b", "x-b"),
                                                           ("y-c", "x-a"), ("y-c", "x-b"))))
    lab_cli(lab, "apply", "-f", "-", stdin=NAMESPACES.replace("team: blue", "team: green"))
    becomes(lab, expect(closed_to=("x-a", "x-b")))              # y is no longer blue
    relabel(lab, "y-c", {"app": "c"})

    # a Service reaches only the endpoints the policies allow: judged after translation
    lab_cli(lab, "apply", "-f", "-", stdin=LOCK_B)
    becomes(lab, expect(closed_to=("x-b",)))
    cluster_ip = lab.api().get("v1", "Service", "web", namespace="x")["spec"]["clusterIP"]
    answers = probe(lab, "y-b", [(str(n), cluster_ip, 80) for n in range(24)], timeout=ANSWER_SECONDS)
    assert any(answers.values()) and not all(answers.values()), answers   # x-a answers, x-b never does
    assert denied_to_x_b(lab) > 0   # the drops are counted: node-2's agent reports them from its kernel counters

    lab_cli(lab, "delete", "-f", "-", stdin=LOCK_B)
    becomes(lab, expect())
    answers = probe(lab, "y-b", [(str(n), cluster_ip, 80) for n in range(8)], timeout=ANSWER_SECONDS)
    assert all(answers.values()), answers
    if lab.state.proxy_mode == "nftables":      # the policy engine wrote no iptables rule or ipset on any node
        for node in ("node-1", "node-2"):
            for argv in (["iptables-legacy-save"], ["iptables-nft-save"], ["ipset", "list", "-n"]):
                listed = lab.exec(node, argv, timeout=60).stdout
                assert "NETAGENT-NP" not in listed, (node, argv, listed)
            assert "table ip netagent-policy" in lab.exec(node, ["nft", "list", "tables"], timeout=60).stdout


@pytest.fixture(scope="module")
def ebpf_lab():
    from tests.netns.ebpf_fixtures import require_bcc
    require_bcc()
    with policy_lab("ebpf", PODS) as lab:
        yield lab


def some_answer(lab: LabCluster, source: str, targets: list, *, socket_lb: bool) -> dict:
    """The probe's answers once at least one connection is answered (the agents program the
    Service asynchronously)."""
    def answered() -> dict | None:
        answers = probe(lab, source, targets, socket_lb=socket_lb)
        return answers if any(answers.values()) else None
    return wait_for(answered, what=f"the Service from {source} (socket LB: {socket_lb})")


def test_ebpf_service_reaches_only_allowed_endpoints(ebpf_lab):
    """eBPF proxy mode: the socket load balancer (in the node's cgroup) picks the endpoint in
    connect(), the tc program on the pod's veth (outside it) translates the first packet; either
    way the packet carries the endpoint's address into FORWARD, where x-b's ingress chain judges
    it. y-b is on the other node than x-b, y-c on the same one (routed and bridged ingress)."""
    lab = ebpf_lab
    lab_cli(lab, "apply", "-f", "-", stdin=LOCK_B)
    becomes(lab, expect(closed_to=("x-b",)))
    cluster_ip = lab.api().get("v1", "Service", "web", namespace="x")["spec"]["clusterIP"]
    targets = [(str(n), cluster_ip, 80) for n in range(24)]
    for source in ("y-b", "y-c"):
        for socket_lb in (True, False):
            answers = some_answer(lab, source, targets, socket_lb=socket_lb)
            assert not all(answers.values()), (source, socket_lb, answers)   # x-a answers, x-b never
    assert denied_to_x_b(lab) > 0
    lab_cli(lab, "delete", "-f", "-", stdin=LOCK_B)
    becomes(lab, expect())
    for socket_lb in (True, False):
        answers = probe(lab, "y-c", targets[:8], timeout=ANSWER_SECONDS, socket_lb=socket_lb)
        assert all(answers.values()), (socket_lb, answers)

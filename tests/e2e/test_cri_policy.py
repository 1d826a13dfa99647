"""End-to-end: with NetworkPolicy on, a pod has its network when RunPodSandbox returns (issue 23).

This file owns the CRI tier of issue 23: the kubelet's path (CRI `RunPodSandbox` on a throwaway
containerd, `cri_harness.CriNode`) through the static shim that `netagent cni install` wrote, to
a full agent, `netagent run --network-policy --proxy-mode none`, in the node's namespace. One
node per module: the lab API server (`python -m lab.apiserver`) listens on the node's loopback
for the agent and on a unix socket for the test, which plays the scheduler: each Pod object is
created bound to the node, Pending, with no address, BEFORE its RunPodSandbox, named as the
PodSandboxConfig's metadata (containerd passes K8S_POD_NAMESPACE/K8S_POD_NAME in CNI_ARGS). The
test never reports a pod's address: the agent can only have it from the ADD itself.

"At once" is judged by counters, never by time: a TCP connect from the new sandbox's namespace
right after RunPodSandbox, with no SYN retransmitted there (a dropped SYN is retried after 1 s),
the agent's `netagent_policy_pod_programming_seconds_count` grown by one per pod and its
`netagent_policy_pods_closed_after_add_total` unchanged.

Pods on the node (sandboxes): `peer` (app=peer) and `other` (app=other) serving TCP 80, and
`canary` (role=guarded), whose refusal shows when the agent has the policy in its cache.

* `test_a_new_sandbox_reaches_a_peer_as_run_pod_sandbox_returns`: no policy selects it.
* `test_a_policy_selecting_the_new_sandbox_is_in_force_from_its_first_packet`: a policy on
  role=guarded allows egress to and ingress from app=peer only; the new sandbox reaches the
  peer and is reached by it at once, and `other` is refused both ways.
* Every test ends with StopPodSandbox + RemovePodSandbox and checks that nothing of its pod is
  left (`PolicyNode.release`); the module ends with `test_cri`'s whole-node leftover checks.
"""
from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator

import pytest

from lab.apiclient import LabApiClient
from lab.kubeconfig import render_kubeconfig
from lab.pod_objects import render_pod
from tests.cluster.lab_tools import syn_retransmits, wait_for
from tests.e2e.cri_harness import CriNode, Sandbox
from tests.e2e.netagent_support import NETAGENT, NETAGENT_MISSING, REPO, reservations, running, settle
from tests.e2e.test_cri import SUBNET, Netagent, _assert_released, _node, cri, pause_image  # noqa: F401
from tests.netns.policy_lab import PROBE, SERVER

pytestmark = [pytest.mark.e2e, pytest.mark.skipif(not NETAGENT.exists(), reason=NETAGENT_MISSING)]

NODE = "cri-node"
NAMESPACE = "default"                      # CriNode.pod_config's
API_PORT, METRICS_PORT = 6443, 10249       # on the node's loopback
CLUSTER_CIDR = "10.88.0.0/16"
UPLINK, NODE_ADDRESS = "eth0", "192.168.212.1"   # the underlay: a lone bridge in the node namespace
ANSWER_SECONDS = 10.0      # how long an answer expected at once may take on a loaded machine
REFUSED_WINDOW = 1.0       # a connection expected refused must stay unanswered this long
PROGRAMMED = "netagent_policy_pod_programming_seconds_count"
CLOSED = "netagent_policy_pods_closed_after_add_total"


class PolicyNode:
    """The module's node: containerd, the API server, the agent, and the pods the tests share."""

    def __init__(self, node: CriNode, netagent: Netagent, api: LabApiClient):
        self.node, self.netagent, self.api = node, netagent, api
        self.sandboxes: dict[str, Sandbox] = {}
        self.servers: dict[str, subprocess.Popen] = {}
        self.released: list[Sandbox] = []
        self.adds = 0         # RunPodSandbox calls made: pods the agent must have programmed

    def run_pod(self, name: str, labels: dict[str, str]) -> Sandbox:
        """The scheduler's Pod (bound, Pending, no address), then the kubelet's RunPodSandbox."""
        pod = render_pod(name, namespace=NAMESPACE, node=NODE, host_ip=NODE_ADDRESS, pod_ip="", labels=labels,
                         ports={})
        pod["status"] = {"phase": "Pending", "conditions": pod["status"]["conditions"][:1]}
        self.api.create(pod)
        sandbox = self.sandboxes[name] = self.node.run_pod(name)
        self.adds += 1
        return sandbox

    def release(self, name: str) -> None:
        """StopPodSandbox + RemovePodSandbox, then nothing of the pod is left (the others stay)."""
        self.stop_server(name)
        address = self.ip(name)
        sandbox = self.sandboxes.pop(name)
        self.node.stop_pod(sandbox)
        self.node.remove_pod(sandbox)
        self.api.delete("v1", "Pod", name, namespace=NAMESPACE)
        self.released.append(sandbox)
        settle(self.netagent.socket.parent / "pending-del")
        live = len(self.sandboxes)
        assert sandbox.id not in [s.id for s in self.node.list_pods()]
        assert len([l for l in self.node.links() if l.kind == "veth"]) == live, self.node.links()
        assert len(self.node.netns_mounts()) == live, self.node.netns_mounts()
        left = [p for p in reservations(self.netagent.data_dir, [sandbox.id]) if p.name == address or
                sandbox.id in p.read_text(errors="replace")]
        assert left == [], left
        calls = [(c.command, bool(c.netns), c.exit_code) for c in self.node.cni_calls()
                 if c.container_id == sandbox.id and c.plugin == "netagent"]
        assert calls == [("ADD", True, 0), ("DEL", True, 0), ("DEL", False, 0)], calls

    def ip(self, name: str) -> str:
        return self.node.status(self.sandboxes[name])[0].network.ip

    def prefix(self, name: str) -> list[str]:
        return self.node.pod_exec_argv(self.sandboxes[name])

    def serve(self, name: str, port: int = 80) -> None:
        server = subprocess.Popen([*self.prefix(name), sys.executable, "-c", SERVER, str(port)],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.servers[name] = server
        assert server.stdout is not None and server.stderr is not None
        assert server.stdout.readline().strip() == "ready", server.stderr.read()

    def stop_server(self, name: str) -> None:
        server = self.servers.pop(name, None)
        if server is not None:
            server.kill()
            server.wait()

    def probe(self, source: str, targets: dict[str, str], *, patience: float = ANSWER_SECONDS) -> dict[str, bool]:
        """TCP connects from `source`'s sandbox to port 80 of the named pods: which were answered."""
        jobs = [[target, self.ip(target), "tcp", 80, True] for target in targets.values()]
        done = subprocess.run([*self.prefix(source), sys.executable, "-c", PROBE, json.dumps(jobs),
                               str(REFUSED_WINDOW), str(patience)],
                              capture_output=True, text=True, timeout=120, check=True)
        answers = json.loads(done.stdout)
        return {ident: answers[target] for ident, target in targets.items()}

    def syn_retransmits(self, name: str) -> int:
        return syn_retransmits(self.prefix(name))

    def metrics(self) -> dict[str, float]:
        scrape = (f"import urllib.request; print(urllib.request.urlopen("
                  f"'http://127.0.0.1:{METRICS_PORT}/metrics', timeout=10).read().decode())")
        text = self.node.netns_run([sys.executable, "-c", scrape], check=False).stdout
        found = {}
        for line in text.splitlines():
            if line.startswith((PROGRAMMED, CLOSED)):
                name, value = line.rsplit(" ", 1)
                found[name] = float(value)
        return found

    def settled_metrics(self) -> dict[str, float]:
        """The metrics once they count every pod added so far: /metrics is a snapshot refreshed
        at most once a second, so a scrape right after a change may predate it."""
        return wait_for(lambda: (lambda m: m if programmed(m) >= self.adds else None)(self.metrics()),
                        timeout=60, what=f"the agent's metrics counting {self.adds} pods programmed")


def programmed(metrics: dict[str, float]) -> float:
    return metrics.get(PROGRAMMED, 0.0)


def closed(metrics: dict[str, float]) -> float:
    return sum(v for k, v in metrics.items() if k.startswith(CLOSED))


def _answers(api: LabApiClient) -> bool:
    with contextlib.suppress(Exception):
        api.list("v1", "Node")
        return True
    return False


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, cri, pause_image) -> Iterator[PolicyNode]:  # noqa: F811 (test_cri's fixtures)
    tmp_path = tmp_path_factory.mktemp("cri-policy")
    netagent = Netagent(tmp_path)
    api_socket = tmp_path / "api.sock"
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(json.dumps(render_kubeconfig({"node": f"http://127.0.0.1:{API_PORT}"})))
    api = LabApiClient(unix_path=str(api_socket))
    node = _node(tmp_path, cri, pause_image, netagent)
    with node:
        for cmd in (["ip", "link", "add", UPLINK, "type", "bridge"],
                    ["ip", "addr", "add", f"{NODE_ADDRESS}/24", "dev", UPLINK], ["ip", "link", "set", UPLINK, "up"]):
            node.netns_run(cmd)
        in_node = ["nsenter", f"--net=/run/netns/{node.netns}"]
        in_repo = {**os.environ, "PYTHONPATH": str(REPO)}    # `python -m lab.apiserver`
        with running([*in_node, sys.executable, "-m", "lab.apiserver", "--listen", f"127.0.0.1:{API_PORT}",
                       "--unix", str(api_socket)], tmp_path / "apiserver.log",
                     ready=lambda: api_socket.exists() and _answers(api), cwd=REPO, env=in_repo):
            # The node controller's Node: its podCIDR is the conflist's subnet.
            api.create({"apiVersion": "v1", "kind": "Node",
                        "metadata": {"name": NODE, "labels": {"kubernetes.io/hostname": NODE}},
                        "spec": {"podCIDR": str(SUBNET), "podCIDRs": [str(SUBNET)]},
                        "status": {"addresses": [{"type": "InternalIP", "address": NODE_ADDRESS},
                                                 {"type": "Hostname", "address": NODE}]}})
            with contextlib.suppress(Exception):
                api.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
            argv = [*node.daemon_argv(), str(NETAGENT), "--log-level", "INFO", "run",
                    "--cni-socket", str(netagent.socket), "--kubeconfig", str(kubeconfig), "--node-name", NODE,
                    "--cluster-cidr", CLUSTER_CIDR, "--backend", "host-gw", "--iface", UPLINK,
                    "--cni-conf-dir", "", "--cni-data-dir", str(netagent.data_dir), "--masquerade", "off",
                    "--status-bind", "127.0.0.1:10258", "--metrics-bind-address", f"127.0.0.1:{METRICS_PORT}",
                    "--proxy-mode", "none", "--network-policy"]
            with running(argv, tmp_path / "agent.log", ready=netagent.socket.exists):
                shared = PolicyNode(node, netagent, api)
                try:
                    for name, labels in (("peer", {"app": "peer"}), ("other", {"app": "other"}),
                                         ("canary", {"app": "canary", "role": "guarded"})):
                        shared.run_pod(name, labels)
                    for name in ("peer", "other"):
                        shared.serve(name)
                    assert closed(shared.settled_metrics()) == 0
                    yield shared
                finally:
                    for name in list(shared.sandboxes):
                        shared.release(name)
                    _assert_released(node, netagent, shared.released, own_links=[UPLINK])


def test_a_new_sandbox_reaches_a_peer_as_run_pod_sandbox_returns(cluster):
    before = cluster.settled_metrics()
    cluster.run_pod("fresh", {"app": "fresh"})
    # at once, from the sandbox's namespace: the first SYN answered
    assert cluster.probe("fresh", {"peer": "peer", "other": "other"}) == {"peer": True, "other": True}
    assert cluster.syn_retransmits("fresh") == 0
    assert not cluster.api.get("v1", "Pod", "fresh", namespace=NAMESPACE)["status"].get("podIP")
    after = cluster.settled_metrics()
    assert closed(after) == closed(before), after
    cluster.release("fresh")


GUARD = {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
         "metadata": {"name": "guarded", "namespace": NAMESPACE},
         "spec": {"podSelector": {"matchLabels": {"role": "guarded"}}, "policyTypes": ["Ingress", "Egress"],
                  "ingress": [{"from": [{"podSelector": {"matchLabels": {"app": "peer"}}}]}],
                  "egress": [{"to": [{"podSelector": {"matchLabels": {"app": "peer"}}}]}]}}


def test_a_policy_selecting_the_new_sandbox_is_in_force_from_its_first_packet(cluster):
    assert cluster.probe("canary", {"other": "other"}) == {"other": True}   # before the policy
    cluster.api.create(GUARD)
    try:
        # the agent has the policy when the canary, which it selects, is refused
        wait_for(lambda: cluster.probe("canary", {"other": "other"}, patience=REFUSED_WINDOW) == {"other": False},
                 timeout=60, what="the policy in force on the canary")
        before = cluster.settled_metrics()
        retransmits = {name: cluster.syn_retransmits(name) for name in ("peer", "other")}
        cluster.run_pod("guarded", {"app": "guarded", "role": "guarded"})
        # egress, at once: to the peer on the first SYN; to the other pod refused
        assert cluster.probe("guarded", {"peer": "peer"}) == {"peer": True}
        assert cluster.syn_retransmits("guarded") == 0
        assert cluster.probe("guarded", {"other": "other"}, patience=REFUSED_WINDOW) == {"other": False}
        # ingress: from the peer on the first SYN; from the other pod refused
        cluster.serve("guarded")
        assert cluster.probe("peer", {"guarded": "guarded"}) == {"guarded": True}
        assert cluster.syn_retransmits("peer") == retransmits["peer"]
        assert cluster.probe("other", {"guarded": "guarded"}, patience=REFUSED_WINDOW) == {"guarded": False}
        assert not cluster.api.get("v1", "Pod", "guarded", namespace=NAMESPACE)["status"].get("podIP")
        after = cluster.settled_metrics()
        assert closed(after) == closed(before), after
        cluster.release("guarded")
    finally:
        cluster.api.delete("networking.k8s.io/v1", "NetworkPolicy", "guarded", namespace=NAMESPACE)

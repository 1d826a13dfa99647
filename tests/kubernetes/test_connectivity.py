"""`netagent connectivity-test` on the real cluster: the command as a user runs it, with the lab's
kubeconfig, passes every check (egress too: to a listener this test starts on the lab's
internet) and names the policy that blocked the deny check from the agents' flow records (read
through exec in the DaemonSet's pods), fails when a check really fails, and leaves no namespace behind, also when it is
interrupted with SIGINT mid-run."""
from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from lab.kubernetes.cluster import KubernetesLab
from lab.physical import INTERNET_HOST
from netagent.daemon import connectivity_plan as cp
from tests.kubernetes.conftest import wait_for

NETAGENT = str(Path(__file__).resolve().parents[2] / ".venv" / "bin" / "netagent")


def sigint_default() -> None:
    """SIGINT as a user's terminal leaves it (default). scripts/test runs this tier in the
    background, where the shell has SIGINT ignored, and an ignored signal stays ignored across
    exec: Python then installs no KeyboardInterrupt handler, and the command never sees Ctrl-C."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
LISTENER = """
import socket, sys
s = socket.socket(); s.bind(("0.0.0.0", 0)); s.listen(16)
print(s.getsockname()[1], flush=True)
while True:
    c, _ = s.accept(); c.close()
"""


@pytest.fixture
def internet_listener(kube_lab: KubernetesLab) -> Iterator[str]:
    """HOST:PORT of a TCP listener on the lab's internet (its own namespace), stopped after."""
    proc = subprocess.Popen(["ip", "netns", "exec", kube_lab.state.internet, sys.executable, "-c", LISTENER],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        port = int(proc.stdout.readline())
        yield f"{INTERNET_HOST}:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def ours(lab: KubernetesLab) -> list[str]:
    """The namespaces a connectivity test made that are still there."""
    found = lab.kubectl_json("get", "namespaces", "-l", f"{cp.LABEL_OWNER}={cp.OWNER}")["items"]
    return [n["metadata"]["name"] for n in found]


def connectivity_test(lab: KubernetesLab, *args: str, timeout: float = 170.0) -> subprocess.CompletedProcess:
    return subprocess.run([NETAGENT, "connectivity-test", "--kubeconfig", lab.host_kubeconfig, "--json", *args],
                          capture_output=True, text=True, timeout=timeout)


def test_every_check_passes_and_the_namespace_is_gone(kube_lab: KubernetesLab, internet_listener: str):
    before = set(ours(kube_lab))
    proc = connectivity_test(kube_lab, "--external", internet_listener)
    assert proc.stdout, proc.stderr
    report = json.loads(proc.stdout)
    results = {c["check"]: (c["result"], c["reason"]) for c in report["checks"]}
    assert proc.returncode == 0, (results, proc.stderr)
    assert set(results) == {"pod-to-pod", "pod-to-pod/cross-node", "pod-to-pod/udp", "pod-to-clusterip",
                            "pod-to-nodeport", "pod-to-nodeport/cross-node", "dns", "pod-to-host",
                            "pod-to-host/cross-node", "egress/external", "policy/deny", "policy/allow"}
    assert {result for result, _ in results.values()} == {"PASS"}, results
    ns, deny = report["namespace"], results["policy/deny"][1]
    assert deny.split(":", 1)[0] in ("blocked (TIMEOUT)", "blocked (REFUSED)", "blocked (OTHER)"), deny
    # the agent of the guarded server's node saw the drop, and named our own deny policy
    assert f"dropped by policy {ns}/{cp.DENY_POLICY} (ingress of {ns}/guarded) on " in deny, (deny, proc.stderr)
    assert "flow records not read" not in proc.stderr
    assert len(report["nodes"]) == 2
    assert report["namespace"] not in set(ours(kube_lab)) | before
    assert f"namespace {report['namespace']} removed" in proc.stderr


def test_a_real_failure_fails_with_its_reason(kube_lab: KubernetesLab, internet_listener: str):
    # a port nothing listens on, on the lab's internet: the host answers with a reset
    host, port = internet_listener.rsplit(":", 1)
    closed = f"{host}:{int(port) + 1 if int(port) < 65535 else 1}"
    proc = connectivity_test(kube_lab, "--external", closed)
    assert proc.returncode == 1 and proc.stdout, proc.stderr     # a FAIL, not an error before the report
    report = json.loads(proc.stdout)
    external = next(c for c in report["checks"] if c["check"] == "egress/external")
    assert external["result"] == "FAIL" and external["reason"].startswith("exit 1: REFUSED"), external
    assert [c["check"] for c in report["checks"] if c["result"] == "FAIL"] == ["egress/external"]
    assert report["namespace"] not in ours(kube_lab)


def test_sigint_mid_run_removes_the_namespace(kube_lab: KubernetesLab):
    before = set(ours(kube_lab))
    proc = subprocess.Popen([NETAGENT, "connectivity-test", "--kubeconfig", kube_lab.host_kubeconfig],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=sigint_default)
    try:
        made = wait_for(lambda: set(ours(kube_lab)) - before, what="the connectivity test's namespace", timeout=60)
        # its pods exist: it is mid-run, not before or after
        namespace = made.pop()
        wait_for(lambda: kube_lab.kubectl_json("-n", namespace, "get", "pods")["items"], what="its pods", timeout=60)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, err
    assert "interrupted; cleaned up" in err and out == ""
    # gone, not merely terminating: the command waited for it
    assert namespace not in ours(kube_lab)
    assert kube_lab.kubectl("get", "namespace", namespace, check=False).returncode != 0

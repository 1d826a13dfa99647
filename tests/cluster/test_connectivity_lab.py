"""`netagent connectivity-test` on the quick lab (issue 33), through the lab's kubelet stand-in
(`lab/kubelet.py`): the command as a user runs it, with a kubeconfig of the lab, from the host.
Every check passes on a 2-node lab with NetworkPolicy on (DNS skipped: the quick lab has no
kube-dns; egress to a listener this test starts on the lab's internet), exit 0, though the
agents' flow records cannot be read here (no exec); the namespace
is gone afterwards, with every pod's process, network namespace and log the stand-in made for it."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator

import pytest

from lab.kubeconfig import render_kubeconfig
from lab.physical import INTERNET_HOST
from netagent.daemon import connectivity_plan as cp
from tests.cluster.lab_tools import CONVERGE_SECONDS, ROOT, lab_cluster

LISTENER = """
import socket
s = socket.socket(); s.bind(("0.0.0.0", 0)); s.listen(16)
print(s.getsockname()[1], flush=True)
while True:
    c, _ = s.accept(); c.close()
"""


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    with lab_cluster(nodes=2, network_policy=True) as lab:
        path = tmp_path_factory.mktemp("ct") / "kubeconfig"
        path.write_text(json.dumps(render_kubeconfig({"lab": lab.host_api_url or ""})))
        lab.test_kubeconfig = str(path)     # type: ignore[attr-defined]
        yield lab


@pytest.fixture
def internet_listener(lab) -> Iterator[str]:
    proc = subprocess.Popen(["ip", "netns", "exec", lab.state.internet, sys.executable, "-c", LISTENER],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        yield f"{INTERNET_HOST}:{int(proc.stdout.readline())}"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def sandboxes(lab) -> list[str]:
    """The stand-in's pod namespaces (named `<lab prefix>-k-<uid>`) that exist now."""
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return [line.split()[0] for line in listed.splitlines() if line.startswith(f"{lab.state.prefix}-k-")]


def kubelet_children(lab) -> list[str]:
    """The processes the stand-in started that still run (its process group, but itself)."""
    group = lab.state.kubelet_pid
    found = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            if int(entry) != group and os.getpgid(int(entry)) == group:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    found.append(f.read().replace(b"\0", b" ").decode(errors="replace"))
        except OSError:
            continue
    return found


def test_every_check_passes_and_nothing_is_left(lab, internet_listener):
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "netagent.cli", "connectivity-test", "--kubeconfig",
                           lab.test_kubeconfig, "--json", "--timeout", "60", "--external", internet_listener],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.stdout, proc.stderr
    report = json.loads(proc.stdout)
    results = {c["check"]: (c["result"], c["reason"]) for c in report["checks"]}
    assert proc.returncode == 0, (results, proc.stderr)
    expected = {name: ("PASS", "") for name in ("pod-to-pod", "pod-to-pod/cross-node", "pod-to-pod/udp",
                                                "pod-to-clusterip", "pod-to-nodeport", "pod-to-nodeport/cross-node",
                                                "pod-to-host", "pod-to-host/cross-node", "egress/external",
                                                "policy/allow")}
    expected["dns"] = ("SKIP", "no kube-dns Service in kube-system: the cluster has no DNS to test")
    assert {k: v for k, v in results.items() if k != "policy/deny"} == expected
    # the quick lab's API server has no exec: the flow records are unreadable, said once, and the
    # reasons are the clients' own
    assert results["policy/deny"] in {("PASS", f"blocked ({word})") for word in ("TIMEOUT", "REFUSED", "OTHER")}, \
        results
    assert proc.stderr.count("flow records not read") == 1, proc.stderr
    assert sorted(report["nodes"]) == ["node-1", "node-2"]
    assert f"namespace {report['namespace']} removed" in proc.stderr
    print(f"connectivity-test on the lab: {time.monotonic() - started:.1f} s\n{proc.stderr}")
    namespaces = [n["metadata"]["name"] for n in lab.api().list("v1", "Namespace")]
    assert report["namespace"] not in namespaces
    # the namespace's deletion reached the stand-in: every pod's process, sandbox and log gone
    deadline = time.monotonic() + CONVERGE_SECONDS
    while sandboxes(lab) or kubelet_children(lab):
        assert time.monotonic() < deadline, (sandboxes(lab), kubelet_children(lab))
        time.sleep(0.2)
    assert not lab.api().list("v1", "Pod", label_selector=f"{cp.LABEL_OWNER}={cp.OWNER}")
    assert os.listdir(os.path.join(lab.workdir, "kubelet", "pods")) == []


def pod_log(lab, namespace: str, name: str, **query: str) -> tuple[int, str]:
    """GET pods/NAME/log from the host, as kubectl logs asks it."""
    url = f"{lab.host_api_url}/api/v1/namespaces/{namespace}/pods/{name}/log?{urllib.parse.urlencode(query)}"
    try:
        with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(url, timeout=30) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())["message"]


def wait_for(what: str, condition):
    deadline = time.monotonic() + CONVERGE_SECONDS
    while not (found := condition()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)
    return found


def test_a_pod_a_client_creates_runs_serves_logs_and_goes(lab):
    api = lab.api()
    api.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "kt"}})
    try:
        server = cp.server_pod("web", cp.Node("node-2", "", 0), image=cp.DEFAULT_IMAGE, role="echo")
        server["metadata"]["namespace"] = "kt"
        server["spec"]["terminationGracePeriodSeconds"] = 5
        api.create(server)
        other = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "nginx", "namespace": "kt"},
                 "spec": {"nodeName": "node-1", "containers": [{"name": "nginx", "image": "nginx:1.27"}]}}
        api.create(other)

        def ready():
            status = api.get("v1", "Pod", "web", namespace="kt").get("status") or {}
            conditions = {c["type"]: c["status"] for c in status.get("conditions") or []}
            return status if conditions.get("Ready") == "True" else None
        status = wait_for("the server to be Ready", ready)
        assert status["phase"] == "Running" and status["hostIP"] == lab.state.nodes["node-2"].address
        refused = wait_for("nginx to fail", lambda: (api.get("v1", "Pod", "nginx", namespace="kt").get("status") or {})
                           .get("phase") == "Failed" and api.get("v1", "Pod", "nginx", namespace="kt")["status"])
        assert "runs only agnhost images, not 'nginx:1.27'" in refused["message"]
        # a real packet from the other node to the pod's address, answered by agnhost netexec
        echo = lab.exec("node-1", ["curl", "-sS", "--max-time", "10",
                                   f"http://{status['podIP']}:{cp.HTTP_PORT}/echo?msg=across"], timeout=30)
        assert echo.stdout == "across", echo.stderr
        code, text = pod_log(lab, "kt", "web", tailLines="50")
        assert code == 200 and "Started HTTP server on port 8080" in text, text
        assert pod_log(lab, "kt", "web", container="other")[0] == 400
        assert pod_log(lab, "kt", "nginx") == (404, "the kubelet of pod nginx: container nginx of pod kt/nginx "
                                                    "has not started on this node")
        sandbox = sandboxes(lab)
        api.delete("v1", "Pod", "web", namespace="kt", grace_period_seconds=5)   # graceful: the stand-in ends it
        wait_for("the server's Pod to go", lambda: not api.list("v1", "Pod", namespace="kt",
                                                                field_selector="metadata.name=web"))
        assert len(sandboxes(lab)) == len(sandbox) - 1
    finally:
        api.delete("v1", "Namespace", "kt")
    wait_for("every sandbox to go", lambda: not sandboxes(lab) and not kubelet_children(lab))

"""`netagent connectivity-test` on the quick lab (issue 33), through the lab's kubelet stand-in
(`lab/kubelet.py`): the command as a user runs it, with a kubeconfig of the lab, from the host.
Every check passes on a 2-node lab with NetworkPolicy on (DNS skipped: the quick lab has no
kube-dns; egress to a listener this test starts on the lab's internet), exit 0; the namespace
is gone afterwards, with every pod's process, network namespace and log the stand-in made for it."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
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
    assert results["policy/deny"][0] == "PASS" and results["policy/deny"][1].startswith("blocked ("), results
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

"""The lab serves Services as a cluster would, driven through the `netagent lab` CLI.

A plain Service manifest applied with `lab apply -f`, pods added with labels and named
ports, and the lab's EndpointSlice controller (inside the API server process, outliving
every CLI call) publishing them: `lab status --json` shows the service with its ready,
not-ready and terminating endpoints as readiness flips and a pod terminates gracefully;
`lab delete -f` removes it all. The agents run without a proxy here (proxy_mode "none"):
this is about what the lab serves, not about packets.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from lab.cluster import LabCluster
from lab.state import LabError
from tests.cluster.lab_tools import PREFIX, ROOT, wait_for

MANIFEST = """\
apiVersion: v1
kind: Service
metadata:
  name: web
spec:
  type: NodePort
  selector:
    app: web
  ports:
  - name: http
    port: 80
    targetPort: http
---
apiVersion: v1
kind: Service
metadata:
  name: manual
spec:
  ports:
  - name: dns
    port: 53
    protocol: UDP
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: manual-1
  labels:
    kubernetes.io/service-name: manual
addressType: IPv4
endpoints:
- addresses: ["192.0.2.53"]
ports:
- name: dns
  port: 5353
  protocol: UDP
"""


@pytest.fixture(scope="module")
def lab():
    lab = LabCluster.create(prefix=PREFIX, nodes=2, proxy_mode="none")
    try:
        yield lab
    finally:
        try:  # the CLI changed the lab behind this object's back: take its state before removing it
            lab.state = fresh(lab).state
        except LabError:
            pass
        lab.down()


def fresh(lab) -> LabCluster:
    """The lab as the CLI left it (state.json)."""
    return LabCluster.load(lab.workdir)


def lab_cli(lab, *args: str, stdin: str | None = None, expect: int = 0) -> subprocess.CompletedProcess:
    result = subprocess.run([sys.executable, "-m", "netagent.cli", "lab", "--state-dir", lab.workdir, *args],
                            capture_output=True, text=True, cwd=ROOT, input=stdin, timeout=60)
    assert result.returncode == expect, result.stdout + result.stderr
    return result


def service_status(lab, name: str) -> dict | None:
    services = json.loads(lab_cli(lab, "status", "--json").stdout)["services"]
    return next((s for s in services if (s["namespace"], s["name"]) == ("default", name)), None)


def address_order(text: str) -> tuple:
    address, _, port = text.rpartition(":")
    return (*(int(part) for part in address.split(".")), int(port))


def endpoints_become(lab, name: str, **expected: list) -> dict:
    def matches():
        status = service_status(lab, name)
        return status if status and all(status[key] == value for key, value in expected.items()) else None
    return wait_for(matches, interval=0.2, what=f"{name} endpoints {expected}")


def test_a_service_manifest_gets_its_endpoints_from_labelled_pods(lab, tmp_path):
    path = tmp_path / "web.yaml"
    path.write_text(MANIFEST)
    applied = lab_cli(lab, "apply", "-f", str(path))
    assert applied.stdout.split("\n")[:3] == ["service/web -n default created", "service/manual -n default created",
                                               "endpointslice/manual-1 -n default created"]
    lab_cli(lab, "pod", "add", "web-1", "--node", "node-1", "--labels", "app=web,tier=front", "--ports", "http=8080")
    lab_cli(lab, "pod", "add", "web-2", "--node", "node-2", "--labels", "app=web", "--ports", "http=9090/TCP")
    lab_cli(lab, "pod", "add", "other", "--node", "node-1", "--labels", "app=other", "--ports", "http=8080")
    ip = {name: pod.ip for name, pod in fresh(lab).state.pods.items()}
    web = endpoints_become(lab, "web", endpoints=sorted([f"{ip['web-1']}:8080", f"{ip['web-2']}:9090"],
                                                        key=address_order))
    assert web["type"] == "NodePort" and web["clusterIP"].startswith("10.96.")
    assert web["ports"][0]["targetPort"] == "http" and 30000 <= web["ports"][0]["nodePort"] <= 32767
    assert service_status(lab, "manual")["endpoints"] == ["192.0.2.53:5353"]  # left as its user wrote it
    pod = lab.api().get("v1", "Pod", "web-1", namespace="default")
    assert pod["spec"]["nodeName"] == "node-1" and pod["metadata"]["labels"] == {"app": "web", "tier": "front"}
    assert "svc  default/web" in lab_cli(lab, "status").stdout

    lab_cli(lab, "pod", "ready", "web-1", "--ready", "false")
    endpoints_become(lab, "web", endpoints=[f"{ip['web-2']}:9090"], notReady=[f"{ip['web-1']}:8080"])
    lab_cli(lab, "pod", "ready", "web-1", "--ready", "true")
    endpoints_become(lab, "web", notReady=[])

    removing = subprocess.Popen([sys.executable, "-m", "netagent.cli", "lab", "--state-dir", lab.workdir,
                                 "pod", "remove", "web-2", "--grace", "10"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        announced = removing.stdout.readline()   # printed once web-2 is terminating, then it waits the grace
        assert "terminating for 10 s" in announced, announced + removing.stderr.read()
        os.kill(removing.pid, signal.SIGSTOP)    # held there: the checks below cannot outlast the grace period
        try:
            endpoints_become(lab, "web", endpoints=[f"{ip['web-1']}:8080"], terminating=[f"{ip['web-2']}:9090"])
            assert fresh(lab).exec("web-1", ["ping", "-c", "1", "-W", "2", ip["web-2"]]).returncode == 0  # still up
        finally:
            os.kill(removing.pid, signal.SIGCONT)
    finally:
        out, err = removing.communicate(timeout=60)
    assert removing.returncode == 0, out + err
    endpoints_become(lab, "web", endpoints=[f"{ip['web-1']}:8080"], terminating=[])

    changed = MANIFEST.replace("port: 80\n", "port: 81\n")
    assert "service/web -n default configured" in lab_cli(lab, "apply", "-f", "-", stdin=changed).stdout
    assert service_status(lab, "web")["ports"][0]["port"] == 81

    deleted = lab_cli(lab, "delete", "-f", str(path))
    assert deleted.stdout.split("\n")[:3] == ["endpointslice/manual-1 -n default deleted",
                                               "service/web -n default deleted", "service/manual -n default deleted"]
    wait_for(lambda: [s["metadata"]["name"] for s in lab.api().list("discovery.k8s.io/v1", "EndpointSlice")]
             == ["kubernetes"], what="the controller to delete web's slices")
    remaining = json.loads(lab_cli(lab, "status", "--json").stdout)["services"]
    assert [(s["namespace"], s["name"]) for s in remaining] == [("default", "kubernetes")]  # the API server's own
    assert "service/web -n default not found" in lab_cli(lab, "delete", "-f", str(path)).stdout


def test_bad_manifests_and_pods_are_refused_plainly(lab, tmp_path):
    broken = lab_cli(lab, "apply", "-f", "-", stdin=MANIFEST + "---\nkind: [oops\n", expect=1)
    assert "malformed YAML" in broken.stderr and "nothing applied" in broken.stderr
    pod = lab_cli(lab, "apply", "-f", "-", stdin="apiVersion: v1\nkind: Pod\nmetadata: {name: p}\n", expect=1)
    assert "lab pod add" in pod.stderr
    invalid = lab_cli(lab, "apply", "-f", "-", expect=1, stdin=(
        "apiVersion: v1\nkind: Service\nmetadata: {name: bad}\nspec:\n  type: NodePort\n"
        "  ports: [{port: 80, nodePort: 80}]\n"))
    assert "service/bad -n default failed: 422 Invalid" in invalid.stderr
    assert [s["metadata"]["name"] for s in lab.api().list("v1", "Service")] == ["kubernetes"]
    assert "namespace nowhere does not exist" in lab_cli(lab, "pod", "add", "p", "--namespace", "nowhere",
                                                          expect=1).stderr
    assert "port name" in lab_cli(lab, "pod", "add", "p", "--ports", "HTTP=80", expect=1).stderr
    assert "p" not in fresh(lab).state.pods

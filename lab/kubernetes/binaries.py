"""Where the real Kubernetes binaries are, and building them when they are missing or stale.

`scripts/build-kubernetes` owns the build (the pinned version is k8s/go.mod's); this module only
decides whether to run it: when a binary the lab needs is missing, or older than any source of
the build (k8s/, the script). The Go build cache makes a run with nothing changed take seconds,
but a lab start should not pay even that when nothing changed.
"""
from __future__ import annotations

import os
import subprocess

from lab.state import LabError
from netagent.cniserver import install as cni_install

NEEDED = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubelet", "agnhost", "coredns",
          "regression-issue-74839", "pause", "e2e-network.test", "ginkgo")


def code_root() -> str:
    return cni_install.code_root()


def bin_dir() -> str:
    return os.environ.get("NETAGENT_KUBERNETES_BIN") or os.path.join(code_root(), "build", "kubernetes", "bin")


def _newest_source() -> float:
    root = code_root()
    newest = os.path.getmtime(os.path.join(root, "scripts", "build-kubernetes"))
    for current, _dirs, files in os.walk(os.path.join(root, "k8s")):
        for name in files:
            newest = max(newest, os.path.getmtime(os.path.join(current, name)))
    return newest


def stale() -> list[str]:
    """The binaries that are missing or older than the build's sources."""
    directory, newest = bin_dir(), _newest_source()
    return [name for name in NEEDED if not os.path.exists(os.path.join(directory, name))
            or os.path.getmtime(os.path.join(directory, name)) < newest]


def ensure_built() -> str:
    """The binaries' directory, after building what is stale (the build's output goes to stderr)."""
    if stale():
        script = os.path.join(code_root(), "scripts", "build-kubernetes")
        proc = subprocess.run([script, "--out", bin_dir()], stdin=subprocess.DEVNULL)
        if proc.returncode != 0:
            raise LabError(f"scripts/build-kubernetes failed (exit {proc.returncode}); its output is above")
        still = stale()
        if still:
            raise LabError(f"scripts/build-kubernetes did not make {', '.join(still)}")
    return bin_dir()


def version() -> str:
    script = os.path.join(code_root(), "scripts", "build-kubernetes")
    return subprocess.run([script, "--version"], capture_output=True, text=True, check=True).stdout.strip()

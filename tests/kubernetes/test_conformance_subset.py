"""A focused subset of the upstream sig-network conformance suite against the tier's cluster,
through scripts/conformance as a user runs it: pod networking across nodes, Services of both
kinds the suite checks first, and cluster DNS. The whole suite is `scripts/conformance`."""
from __future__ import annotations

import os
import re
import subprocess

from lab.kubernetes.cluster import KubernetesLab
from tests.cluster.lab_tools import ROOT

FOCUS = "|".join([
    r"Networking Granular Checks: Pods should function for intra-pod communication: http",
    r"Networking Granular Checks: Pods should function for node-pod communication: udp",
    r"Services should serve a basic endpoint from pods",
    r"Services should be able to create a functioning NodePort service",
    r"DNS should provide DNS for services",
])


def test_upstream_conformance_subset_passes(kube_lab: KubernetesLab, tmp_path):
    proc = subprocess.run([os.path.join(ROOT, "scripts", "conformance"), "--state-dir", kube_lab.workdir,
                           "--suite", "conformance", "--focus", FOCUS, "--report", str(tmp_path)],
                          capture_output=True, text=True, timeout=1800)
    summary = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else ""
    counts = re.fullmatch(r"(\d+) passed, (\d+) failed, (\d+) skipped", summary)
    assert counts, proc.stdout[-3000:] + proc.stderr[-3000:]
    passed, failed, skipped = map(int, counts.groups())
    assert (passed, failed, skipped) == (5, 0, 0), proc.stdout[-6000:]
    assert proc.returncode == 0
    assert (tmp_path / "junit_01.xml").exists()

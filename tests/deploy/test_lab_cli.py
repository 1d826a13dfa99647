"""`netagent lab up --agent-image IMAGE`: the command line builds a lab whose agents are the
image's containers, later commands drive it, and `lab down` removes the containers too."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from lab.agent_pods import LAB_LABEL, run_podman
from tests.cluster.lab_tools import ROOT

pytestmark = pytest.mark.deploy


def netagent(state_dir, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "netagent.cli", "lab", "--state-dir", str(state_dir), *args],
                          capture_output=True, text=True, timeout=600, cwd=ROOT)


def test_lab_up_with_an_agent_image_then_pods_then_down(agent_image, tmp_path):
    state_dir = tmp_path / "lab"
    up = netagent(state_dir, "up", "--nodes", "1", "--agent-image", agent_image)
    try:
        assert up.returncode == 0, up.stderr
        assert "agent running" in up.stdout
        prefix = json.loads((state_dir / "state.json").read_text())["prefix"]
        containers = run_podman(["ps", "--format", "{{.Names}}", "--filter", f"label={LAB_LABEL}={prefix}"])
        assert containers.stdout.split() == [f"{prefix}-node-1-netagent"]  # the init container is gone
        added = netagent(state_dir, "pod", "add", "p1")
        assert added.returncode == 0 and "pod p1 on node-1: 10.244.1." in added.stdout, added.stderr
        status = json.loads(netagent(state_dir, "status", "--json").stdout)
        assert status["nodes"][0]["agent"]["image"] == agent_image and status["nodes"][0]["agent"]["running"]
    finally:
        down = netagent(state_dir, "down")
    assert down.returncode == 0, down.stderr
    assert run_podman(["ps", "--all", "--quiet", "--filter", f"label={LAB_LABEL}={prefix}"]).stdout.strip() == ""


def test_lab_up_refuses_an_image_that_is_not_here(tmp_path):
    up = netagent(tmp_path / "lab", "up", "--nodes", "1", "--agent-image", "localhost/netagent:no-such-tag")
    assert up.returncode == 1
    assert "is not here: build it with scripts/build-image" in up.stderr

"""What the image holds: the agent and the static shim, nothing to build or test with, not the lab.

Each check runs inside a throwaway container of the image (no network), removed on exit.
"""
from __future__ import annotations

import json

import pytest

from lab.agent_pods import run_podman
from tests.elf import has_interpreter

pytestmark = pytest.mark.deploy
SHIM = "/opt/netagent/cni/netagent"

INSPECT = f"""
import glob, importlib.util, json, os, shutil
print(json.dumps({{
    "modules": {{m: importlib.util.find_spec(m) is not None for m in (
        "netagent", "cni", "proxy", "kubernetes.client", "kubernetes.config", "pyroute2", "yaml",
        "pip", "setuptools", "scapy", "pytest", "mypy", "hypothesis", "aiohttp", "lab")}},
    "tools": {{t: shutil.which(t) is not None for t in (
        "ip", "iptables-restore", "iptables-nft-restore", "iptables-legacy-restore", "ipset", "conntrack",
        "gcc", "cc", "musl-gcc", "pip", "pip3")}},
    "apt_lists": [p for p in glob.glob("/var/lib/apt/lists/*") if not p.endswith(("/lock", "/partial"))],
    "caches": glob.glob("/root/.cache/*") + glob.glob("/var/cache/apt/*.bin"),
    "shim": open("{SHIM}", "rb").read().hex(),
}}))
"""


def run_in_image(image: str, *argv: str, check: bool = True):
    return run_podman(["run", "--rm", "--network", "none", "--pull", "never", "--ulimit", "nofile=20000:20000",
                       "--ulimit", "nproc=32768:32768", "--entrypoint", argv[0], image, *argv[1:]],
                      timeout=120, check=check)


def test_image_holds_the_agent_and_nothing_to_build_or_test_with(agent_image):
    found = json.loads(run_in_image(agent_image, "/opt/netagent/venv/bin/python3", "-c", INSPECT).stdout)
    modules, tools = found["modules"], found["tools"]
    assert all(modules[m] for m in ("netagent", "cni", "proxy", "kubernetes.client", "kubernetes.config",
                                    "pyroute2", "yaml")), modules  # yaml: kubernetes.config's
    unwanted = ("pip", "setuptools", "scapy", "pytest", "mypy", "hypothesis", "aiohttp", "lab")
    assert not any(modules[m] for m in unwanted), modules
    assert all(tools[t] for t in ("ip", "iptables-nft-restore", "iptables-legacy-restore", "ipset", "conntrack")), tools
    assert not any(tools[t] for t in ("gcc", "cc", "musl-gcc", "pip", "pip3")), tools
    assert found["apt_lists"] == [] and found["caches"] == []
    shim = bytes.fromhex(found["shim"])
    assert not has_interpreter(shim) and len(shim) < 200_000  # static: runs on any host


def test_image_is_slim_and_starts_the_cli(agent_image):
    size = int(run_podman(["image", "inspect", "--format", "{{.Size}}", agent_image]).stdout)
    assert size < 230_000_000, f"the image grew to {size / 1e6:.0f} MB"
    version = run_in_image(agent_image, "/opt/netagent/venv/bin/netagent", "--version")
    assert version.stdout.startswith("netagent ")


def test_image_has_no_lab_and_says_so(agent_image):
    lab = run_in_image(agent_image, "/opt/netagent/venv/bin/netagent", "lab", "status", check=False)
    assert lab.returncode == 1 and "the lab is not installed here" in lab.stderr, lab
